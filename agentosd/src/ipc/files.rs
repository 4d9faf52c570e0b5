//! The open files the agents' connections may hold, over all agents (issue 15: nothing agents
//! do may cost the daemon without a bound). An MCP connection that found no slot in the ring's
//! table of registered files, and every connection to the model gateway, is an ordinary fd of
//! the daemon, from the same open-file limit the daemon needs for its own work (the audit log,
//! a start's cgroup directory and pidfd, a tool's pipes). Per agent they are bounded (16 each);
//! over all agents they share this budget, by default a quarter of the daemon's open-file limit
//! (`--agent-conn-files`), so that many agents together never take the fds the daemon needs.
//! Past it a new connection is closed at once and recorded (`socket-refused`, at the denial
//! rate), like one over the agent's own limit.

use std::sync::atomic::{AtomicUsize, Ordering};

/// A budget of open files.
#[derive(Debug, Default)]
pub struct Budget {
    used: AtomicUsize,
    /// 0: not set yet (the default is taken on first use).
    max: AtomicUsize,
}

/// One open file of the budget, given back when dropped.
#[derive(Debug)]
pub struct Permit<'b>(&'b Budget);

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        self.0.used.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Budget {
    pub const fn new() -> Budget {
        Budget {
            used: AtomicUsize::new(0),
            max: AtomicUsize::new(0),
        }
    }

    /// Set the bound (`--agent-conn-files`); 0 keeps the default.
    pub fn set_max(&self, n: usize) {
        self.max.store(n, Ordering::Release);
    }

    /// The bound: as set, else a quarter of the soft open-file limit at first use (the daemon
    /// has raised it to the hard one by then), at least 64.
    pub fn max(&self) -> usize {
        match self.max.load(Ordering::Acquire) {
            0 => {
                let n = (crate::sys::rlimit::nofile().soft / 4).max(64) as usize;
                let _ = self
                    .max
                    .compare_exchange(0, n, Ordering::AcqRel, Ordering::Acquire);
                self.max.load(Ordering::Acquire)
            }
            n => n,
        }
    }

    pub fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }

    /// One more open file for an agent's connection, if the budget has room.
    pub fn take(&self) -> Option<Permit<'_>> {
        let max = self.max();
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                (u < max).then_some(u + 1)
            })
            .ok()
            .map(|_| Permit(self))
    }

    /// Why a connection was refused for want of room.
    pub fn refusal(&self) -> String {
        format!(
            "agentosd holds {} agents' connections as open files, its bound over all agents (--agent-conn-files); refused to keep files for its own work",
            self.max()
        )
    }
}

/// The daemon's budget, shared by the ipc ring and the model gateway.
pub static AGENT_CONN_FILES: Budget = Budget::new();

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permits_up_to_the_bound_and_back_when_dropped() {
        let b = Budget::new();
        b.set_max(2);
        let p1 = b.take().expect("first");
        let p2 = b.take().expect("second");
        assert!(b.take().is_none(), "a third past a bound of 2");
        assert_eq!(b.used(), 2);
        drop(p1);
        let p3 = b.take().expect("room again");
        assert_eq!(b.used(), 2);
        drop((p2, p3));
        assert_eq!(b.used(), 0);
        assert!(b.refusal().contains("2 agents' connections"));
    }

    #[test]
    fn the_default_is_a_quarter_of_the_open_file_limit() {
        let b = Budget::new();
        let soft = crate::sys::rlimit::nofile().soft;
        assert_eq!(b.max() as u64, (soft / 4).max(64));
    }
}
