//! Charging the log's own CPU to whoever its records are for. A record may carry a
//! [`CostTag`] ([`crate::Record::cost`]); the writer thread reads its own CPU clock
//! (`CLOCK_THREAD_CPUTIME_ID`) once per batch, and the group-commit syncer once per round of
//! syncs, and splits that CPU over the batch's records in proportion to their bytes: each tag
//! gets the share of its records, records without a tag (and the log's own checkpoints, whose
//! signing is overhead of the records they cover) are charged to nobody. Only CPU time is
//! counted: a thread blocked in `fdatasync` or waiting for records uses none.
//!
//! The crate knows nothing of who a tag stands for: the caller implements [`Cost`].

use std::fmt;
use std::sync::Arc;

/// Receives the CPU the log spent on records tagged with it.
pub trait Cost: Send + Sync {
    /// `cpu_ns` nanoseconds of a log thread's CPU were spent on this tag's records. Called on
    /// the writer or syncer thread: it must be quick and must not append to the log.
    fn charge(&self, cpu_ns: u64);
}

/// Who a record's share of the log's CPU is charged to (cloning it is one reference count).
#[derive(Clone)]
pub struct CostTag(Arc<dyn Cost>);

impl CostTag {
    /// A tag charging `cost`.
    pub fn new(cost: Arc<dyn Cost>) -> CostTag {
        CostTag(cost)
    }

    /// The same receiver (not merely an equal one).
    pub fn same(&self, other: &CostTag) -> bool {
        std::ptr::addr_eq(Arc::as_ptr(&self.0), Arc::as_ptr(&other.0))
    }
}

impl fmt::Debug for CostTag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CostTag({:p})", Arc::as_ptr(&self.0))
    }
}

impl PartialEq for CostTag {
    fn eq(&self, other: &CostTag) -> bool {
        self.same(other)
    }
}

/// The tags of one batch and the bytes of its records: consecutive records of one tag are one
/// entry (a flooding agent's records come in runs), so a batch costs one entry per run, and the
/// vector is reused from batch to batch.
#[derive(Debug, Default)]
pub(crate) struct Costs {
    tags: Vec<(CostTag, u64)>,
    /// Bytes of all the batch's records, tagged or not (checkpoints excluded).
    bytes: u64,
}

impl Costs {
    /// A record of `bytes` bytes, charged to `tag` (none: to nobody).
    pub(crate) fn add(&mut self, tag: Option<&CostTag>, bytes: u64) {
        self.bytes += bytes;
        let Some(tag) = tag else { return };
        match self.tags.last_mut() {
            Some((t, b)) if t.same(tag) => *b += bytes,
            _ => self.tags.push((tag.clone(), bytes)),
        }
    }

    /// Bytes of the batch's records.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Charges this batch's part of `ns`: the batch is `self.bytes` of `total` bytes that cost
    /// `ns` together, and each tag gets the share of its records' bytes.
    pub(crate) fn charge(&self, ns: u64, total: u64) {
        if ns == 0 || total == 0 {
            return;
        }
        for (tag, bytes) in &self.tags {
            let share = u128::from(ns) * u128::from(*bytes) / u128::from(total);
            tag.0.charge(u64::try_from(share).unwrap_or(u64::MAX));
        }
    }

    /// Charges this thread's CPU since `mark` (its clock after the last batch) to this batch
    /// alone, and moves `mark` to now: one clock read.
    pub(crate) fn charge_since(&self, mark: &mut u64) {
        let cpu = thread_cpu_ns();
        self.charge(cpu.saturating_sub(*mark), self.bytes);
        *mark = cpu;
    }

    pub(crate) fn clear(&mut self) {
        self.tags.clear();
        self.bytes = 0;
    }
}

/// The calling thread's CPU time, ns (`clock_gettime(CLOCK_THREAD_CPUTIME_ID)`: a system call,
/// the vDSO serves no CPU-time clock).
pub(crate) fn thread_cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    (t.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(t.tv_nsec as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[derive(Default)]
    struct Sum(AtomicU64, AtomicU64);

    impl Cost for Sum {
        fn charge(&self, ns: u64) {
            self.0.fetch_add(ns, Ordering::Relaxed);
            self.1.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn a_batch_is_split_over_its_tags_by_bytes_and_untagged_records_cost_nobody() {
        let (a, b) = (Arc::new(Sum::default()), Arc::new(Sum::default()));
        let (ta, tb) = (CostTag::new(a.clone()), CostTag::new(b.clone()));
        let mut c = Costs::default();
        c.add(Some(&ta), 200);
        c.add(Some(&ta), 100);
        c.add(None, 100);
        c.add(Some(&tb), 100);
        assert_eq!(c.bytes(), 500);
        assert_eq!(c.tags.len(), 2, "a run of one tag is one entry");
        c.charge(1000, c.bytes());
        assert_eq!(a.0.load(Ordering::Relaxed), 600);
        assert_eq!(b.0.load(Ordering::Relaxed), 200);
        assert_eq!(
            a.1.load(Ordering::Relaxed),
            1,
            "one charge per run, not per record"
        );
        // Half of a round of two equal batches.
        c.charge(1000, 1000);
        assert_eq!(a.0.load(Ordering::Relaxed), 900);
        c.clear();
        c.charge(1000, 1000);
        assert_eq!(b.0.load(Ordering::Relaxed), 300, "nothing after clear");
    }
}
