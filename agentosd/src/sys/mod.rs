//! The daemon's one kernel layer: every raw system call it makes itself, in small safe wrappers
//! per kernel area (aya's `aya/src/sys/` is the model). Policy modules (`spawn`, `sched`,
//! `sandbox`, `probe`, the supervisor) call these; `libc::syscall` appears nowhere else.
//!
//! - [`pidfd`]: `pidfd_open`, `pidfd_send_signal`, `waitid(P_PIDFD)` and [`ExitStatus`].
//! - [`process`]: `/proc/PID` facts, the boot id, signal names.
//! - [`clone`]: `struct clone_args`, `clone3(2)`, `close_range(2)`, the CLONE_INTO_CGROUP probe.
//! - [`vfork`]: `clone3(CLONE_VM | CLONE_VFORK)` on a stack of the child's own (spawn without
//!   copying the daemon's address space).
//! - [`sched`]: `struct sched_attr`, `sched_setattr(2)`, `sched_getattr(2)`.
//! - [`landlock`]: the Landlock ABI version and `landlock_restrict_self(2)`.
//! - [`seccomp`]: `seccomp(2)` (install a filter, ask for actions and notify sizes).
//! - [`creds`]: the raw per-thread credential calls of a freshly cloned child.
//! - [`bpf`]: `bpf(2)` for the probe (load a trivial program, create a ring buffer).
//! - [`io_uring`]: `io_uring_setup(2)` for the probe.
//! - [`mountinfo`]: `/proc/self/mountinfo` parsed (where cgroup2 and cgroup v1 live).
//! - [`rlimit`]: the daemon's open-file limit, raised at start and given back to its children.
//! - [`malloc`]: glibc's malloc arenas, limited at start (memory per agent).
//! - [`quota`]: `quotactl_fd(2)`: user quotas (the agents' disk budgets, storage/quota.rs).
//!
//! Wrappers used by the daemon proper return [`SyscallError`] (naming the call and its object);
//! those used only by the probe return the bare [`nix::errno::Errno`] the probe classifies.
//! Functions meant for a child between `clone3` and `execve` are `unsafe fn`s that only make the
//! system call and return its raw result: no allocation, async-signal-safe.

pub mod bpf;
pub mod clone;
pub mod creds;
pub mod io_uring;
pub mod landlock;
pub mod malloc;
pub mod mountinfo;
pub mod pidfd;
pub mod process;
pub mod quota;
pub mod rlimit;
pub mod sched;
pub mod seccomp;
pub mod vfork;

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

use nix::errno::Errno;

pub use pidfd::{ExitStatus, pidfd_open, pidfd_send_signal, pidfd_try_wait};
pub use process::{
    boot_id, parse_signal, pid_alive, process_cmdline, process_ppid, process_start_time,
    process_state, signal_name,
};

/// A failed system call, naming the call and what it was applied to.
#[derive(Debug, thiserror::Error)]
#[error("{call}({target}) failed: {source}")]
pub struct SyscallError {
    pub call: &'static str,
    pub target: String,
    #[source]
    pub source: io::Error,
}

impl SyscallError {
    pub fn new(call: &'static str, target: impl Into<String>, source: io::Error) -> Self {
        Self {
            call,
            target: target.into(),
            source,
        }
    }

    /// The errno of the failure, when it came from the kernel.
    pub fn errno(&self) -> Option<i32> {
        self.source.raw_os_error()
    }
}

/// A raw syscall result that is a new file descriptor, as an [`OwnedFd`] (closed on drop).
fn fd_result(ret: libc::c_long) -> Result<OwnedFd, Errno> {
    if ret < 0 {
        return Err(Errno::last());
    }
    let fd = RawFd::try_from(ret).map_err(|_| Errno::EOVERFLOW)?;
    // SAFETY: the syscall returned a new file descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A raw syscall result that is 0 or -1 with `errno` set.
fn unit_result(ret: libc::c_long) -> Result<(), Errno> {
    if ret < 0 { Err(Errno::last()) } else { Ok(()) }
}
