//! Writing a record on the caller's own thread while the writer is idle: one sequential caller
//! (an agent's tool call waiting for its `allow` record) then pays for its `write(2)` and
//! `fdatasync(2)` and nothing else, not two thread hand-offs (to the writer and back), which on
//! a small or virtual machine cost more than a sync on tmpfs or a fast disk.
//!
//! It is taken only when it cannot reorder or delay anyone: nothing is queued for the writer
//! (everything sent before is in the file or in the batch being built, which goes first), no
//! batch is waiting for the syncer (acknowledgements stay in order), and the writer's state is
//! free at once (`try_lock`: a caller never waits for the writer here). Otherwise the caller
//! queues its record as before.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use std::sync::mpsc::SyncSender;

use super::{AppendError, Done, Log, Msg, Slot};
use crate::record::{Kind, Record};

/// A caller syncs on its own thread only while the last `fdatasync` took less than this: on a
/// disk that has become slow, the record goes to the writer thread so that the caller's thread
/// (an async runtime's worker) is not held for long.
pub const QUICK_SYNC: Duration = Duration::from_micros(500);

impl Log {
    /// Writes `rec` on this thread and, unless `written`, makes it durable, when the writer is
    /// idle and nothing is queued before it; `None` when it cannot now (queue it as usual:
    /// [`Log::try_append_then`], [`Log::try_append_written`]). `written`: the record is in the
    /// file (`write(2)` returned) and the group commit that follows syncs it, as for
    /// `try_append_written`. Holds this thread for one `write` and, unless `written`, one
    /// `fdatasync`, and only while the last `fdatasync` took less than [`QUICK_SYNC`]; never for
    /// a record that would need a checkpoint or whose acknowledgement would rewrite the head
    /// file (the writer's threads do those).
    pub fn try_commit_here(
        &self,
        rec: &Record,
        written: bool,
    ) -> Option<Result<super::Ack, AppendError>> {
        if self.shared.queued.load(Ordering::Acquire) != 0
            || self.shared.last_sync_ns.load(Ordering::Relaxed) >= QUICK_SYNC.as_nanos() as u64
        {
            return None;
        }
        let (tx, body) = match self.prepare(rec) {
            Ok(x) => x,
            Err(e) => return Some(Err(e)),
        };
        let mut w = self.core.try_lock().ok()?;
        // Checked again under the lock: the writer decrements `queued` only once it holds the
        // lock with the record, so zero here means nothing sent before is still on its way.
        if self.shared.queued.load(Ordering::Acquire) != 0
            || w.in_flight.load(Ordering::Acquire) != 0
        {
            return None;
        }
        // Checkpoints (a signature) and the head file (two more syncs) are the writer's: when
        // this record would need one, or its acknowledgement would write the head file, queue.
        if w.checkpoint_due() || w.since_checkpoint + 1 >= w.opts.checkpoint_records {
            return None;
        }
        match w.committer.try_lock() {
            Ok(c) if !c.head_due() => {}
            _ => return None,
        }
        if self.shared.failed().is_some() {
            drop(w);
            return Some(Err(self.send_err()));
        }
        let slot = Slot::new();
        let done = match written {
            true => {
                let s = Arc::clone(&slot);
                Done::Written(Box::new(move |r| s.complete(r)))
            }
            false => Done::Slot(Arc::clone(&slot)),
        };
        // The caller's own CPU for it is its caller's to account; the syncer's share, if the
        // batch goes there, is charged to the record's tag.
        w.push(rec.kind, &body, done, rec.cost.as_ref());
        w.urgent = false;
        w.lazy_since = None;
        // `written`: the batch goes to the syncer even when it carries lazy records (whose
        // callbacks nobody waits on), so this thread does not wait for that sync.
        w.alone = !written;
        if let Err(reason) = w.flush(&self.shared, None) {
            self.shared.fail(&reason);
        }
        self.wake_writer_if_late(&w, tx, rec.kind);
        drop(w);
        // Complete by now: the batch was synced here (it was alone and the syncer idle), or
        // holds only this `written` record (acknowledged once written), or failed.
        Some(slot.get().unwrap_or(Err(AppendError::Abandoned)))
    }

    /// Puts `rec`, which nobody waits for, in the batch being built on this thread when the
    /// writer is idle and nothing is queued before it (no thread wake-up: it is written with
    /// the next record someone waits for, or by the writer within the lazy delay, as
    /// [`Log::try_append_lazy`]); `Some(Ok)` then. `None`: queue it as usual (`done` was dropped
    /// uncalled). Never writes or syncs here, and never past the batch's size limit.
    pub fn try_append_lazy_here(
        &self,
        rec: &Record,
        done: impl FnOnce(Result<super::Ack, AppendError>) + Send + 'static,
    ) -> Option<Result<(), AppendError>> {
        if self.shared.queued.load(Ordering::Acquire) != 0 {
            return None;
        }
        let (tx, body) = match self.prepare(rec) {
            Ok(x) => x,
            Err(e) => return Some(Err(e)),
        };
        let mut w = self.core.try_lock().ok()?;
        if self.shared.queued.load(Ordering::Acquire) != 0
            || self.shared.failed().is_some()
            || w.checkpoint_due()
            || w.buf.len() + body.len() + 200 > w.opts.max_batch_bytes
            || w.opts.durability == super::Durability::PerRecord
        {
            return None;
        }
        w.lazy_since.get_or_insert_with(std::time::Instant::now);
        w.push(
            rec.kind,
            &body,
            Done::Callback(Box::new(done)),
            rec.cost.as_ref(),
        );
        self.wake_writer_if_late(&w, tx, rec.kind);
        Some(Ok(()))
    }

    /// Called holding the writer's state after a record was added on a caller's thread: when
    /// the batch must be written (lazy records) or checkpointed before the writer thread wakes
    /// up by itself, wake it (a message that is not a record; if the queue is full it is awake
    /// anyway).
    fn wake_writer_if_late(&self, w: &super::Writer, tx: &SyncSender<Msg>, kind: Kind) {
        let Some(due) = w.wake_in() else { return };
        let due = self.shared.ns_at(due);
        if due >= self.shared.writer_wakes_at.load(Ordering::Acquire) {
            return;
        }
        self.shared.writer_wakes_at.store(due, Ordering::Release);
        self.shared.queued.fetch_add(1, Ordering::AcqRel);
        let tick = Msg {
            kind,
            body: Vec::new(),
            urgent: false,
            done: None,
            cost: None,
        };
        if tx.try_send(tick).is_err() {
            self.shared.queued.fetch_sub(1, Ordering::AcqRel);
        }
    }
}
