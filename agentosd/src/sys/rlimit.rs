//! The daemon's open-file limit (`RLIMIT_NOFILE`): raised to the hard limit at start, because
//! the daemon holds open files for each agent, and given back as it was to every process the
//! daemon starts (like systemd, which keeps a high limit for itself and hands services the
//! conventional soft one, so `select(2)` users are not surprised).
//!
//! What one agent costs in the daemon's fd table: its main process's pidfd. Its socket
//! listener and the daemon's end of its inherited connection live in the ipc ring's table of
//! registered files (ipc/ring/mod.rs), which holds up to RLIMIT_NOFILE sockets (at most
//! [`crate::ipc::MAX_FIXED_FILES`]); sockets beyond that take ordinary fds.

use std::sync::atomic::{AtomicU64, Ordering};

use super::SyscallError;

/// The soft limit before [`raise_nofile`] raised it; 0 when it did not.
static INHERITED_SOFT: AtomicU64 = AtomicU64::new(0);

/// Open files the daemon keeps for its own work beside the agents' (D-Bus, audit, journal,
/// network namespaces made ahead, a start or tool call in flight…), at most a quarter of the
/// limit.
pub const RESERVE: u64 = 1000;

/// The open-file limit, and what it was before the daemon raised it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoFile {
    pub soft: u64,
    pub hard: u64,
    /// The soft limit the daemon was started with, when it raised it.
    pub raised_from: Option<u64>,
}

impl NoFile {
    /// About how many agents fit in this limit (see [`agents_within`]).
    pub fn agents(&self) -> u64 {
        agents_within(self.soft)
    }
}

fn nr_open() -> u64 {
    std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1 << 20)
}

/// The current limit.
pub fn nofile() -> NoFile {
    let l = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    let soft = l.current.unwrap_or(u64::MAX);
    let hard = l.maximum.unwrap_or(u64::MAX);
    let from = INHERITED_SOFT.load(Ordering::Relaxed);
    NoFile {
        soft,
        hard,
        raised_from: (from != 0).then_some(from),
    }
}

/// Raise the soft limit to the hard one (capped at `fs.nr_open`, as the kernel requires);
/// processes started later get the old soft limit back ([`restore_nofile_in_child`]).
pub fn raise_nofile() -> Result<NoFile, SyscallError> {
    let l = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    let soft = l.current.unwrap_or(u64::MAX);
    let hard = l.maximum.unwrap_or(u64::MAX);
    let target = hard.min(nr_open());
    if soft < target {
        rustix::process::setrlimit(
            rustix::process::Resource::Nofile,
            rustix::process::Rlimit {
                current: Some(target),
                maximum: l.maximum,
            },
        )
        .map_err(|e| SyscallError::new("setrlimit", "RLIMIT_NOFILE", e.into()))?;
        INHERITED_SOFT.store(soft, Ordering::Relaxed);
    }
    Ok(nofile())
}

/// Give a freshly cloned child the soft limit the daemon was started with.
///
/// # Safety
/// For a child between `clone3` and `execve`: one system call, no allocation.
pub unsafe fn restore_nofile_in_child() -> i32 {
    let soft = INHERITED_SOFT.load(Ordering::Relaxed);
    if soft == 0 {
        return 0;
    }
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write a live struct on the stack.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) != 0 {
            return -1;
        }
        l.rlim_cur = soft.min(l.rlim_max);
        libc::setrlimit(libc::RLIMIT_NOFILE, &l)
    }
}

/// About how many agents fit in an open-file limit of `soft`: each takes one fd (its pidfd)
/// and two sockets, which go to the ipc ring's table of registered files while it has room
/// (RLIMIT_NOFILE slots, at most [`crate::ipc::MAX_FIXED_FILES`]) and to the fd table after
/// that; [`RESERVE`] stays for the daemon's own work. Agents with more connections open, or
/// with a socket broker, cost more.
pub fn agents_within(soft: u64) -> u64 {
    let table = soft.min(crate::ipc::MAX_FIXED_FILES as u64);
    let free = soft.saturating_sub(RESERVE.min(soft / 4));
    if free <= table / 2 {
        free
    } else {
        // Past table/2 agents, each new one needs three fds.
        (free + table) / 3
    }
}

/// What `agentosd check` and the daemon's start say about the limit.
pub fn describe(n: &NoFile) -> String {
    let from = n
        .raised_from
        .map_or(String::new(), |f| format!(", raised from {f}"));
    let hard = if n.hard == u64::MAX {
        "unlimited".to_string()
    } else {
        n.hard.to_string()
    };
    let mut s = format!(
        "open-file limit {}{from} (hard {hard}): about {} agents",
        n.soft,
        n.agents()
    );
    if n.soft < n.hard.min(nr_open()) {
        s.push_str("; the soft limit could not be raised to the hard one");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agents_within_a_limit() {
        // The container this was measured in: hard limit 20 000.
        assert_eq!(agents_within(20_000), 13_000);
        // The unit file's LimitNOFILE=1048576: the table is full at 32 768 agents.
        assert_eq!(agents_within(1 << 20), (1_047_576 + 65_536) / 3);
        // A shell's default soft limit.
        assert_eq!(agents_within(1024), (768 + 1024) / 3);
        assert_eq!(agents_within(100), (75 + 100) / 3);
        assert_eq!(agents_within(0), 0);
    }
}
