//! `clone3(2)` and the fd hygiene around it: `struct clone_args`, the flags agentos uses,
//! `close_range(2)`, and the probe's `clone3(CLONE_INTO_CGROUP)` attempt.

use std::os::fd::RawFd;

use nix::errno::Errno;

/// `CLONE_PIDFD`: the kernel stores a pidfd for the child in `clone_args.pidfd`.
pub const CLONE_PIDFD: u64 = 0x1000;
/// `CLONE_INTO_CGROUP` (Linux 5.7): the child starts in the cgroup behind `clone_args.cgroup`.
pub const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// `struct clone_args` of linux/sched.h (CLONE_ARGS_SIZE_VER2, 88 bytes).
#[repr(C)]
#[derive(Debug, Default)]
pub struct CloneArgs {
    pub flags: u64,
    pub pidfd: u64,
    pub child_tid: u64,
    pub parent_tid: u64,
    pub exit_signal: u64,
    pub stack: u64,
    pub stack_size: u64,
    pub tls: u64,
    pub set_tid: u64,
    pub set_tid_size: u64,
    pub cgroup: u64,
}
const _: () = assert!(std::mem::size_of::<CloneArgs>() == 88);

/// `clone3(args)`: returns twice like `fork()`, 0 in the child and the child's PID in the
/// parent (-1 with `errno` set on failure).
///
/// # Safety
/// `args` must not ask for `CLONE_VM` or a custom stack: the child continues on a copy of the
/// caller's stack. Every pointer in `args` (`pidfd`, `child_tid`, ...) must be valid for the
/// kernel to write. In a multi-threaded process the child may only make async-signal-safe
/// calls on memory prepared before the call (no allocation, no lock) and must end in `execve`
/// or `_exit`.
pub unsafe fn clone3(args: &mut CloneArgs) -> libc::c_long {
    // SAFETY: `args` is a valid clone_args of the size passed; the caller upholds the fork-like
    // contract above.
    unsafe {
        libc::syscall(
            libc::SYS_clone3,
            args as *mut CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    }
}

/// `close_range(first, ~0, CLOSE_RANGE_CLOEXEC)`: every fd from `first` up is closed by the next
/// `execve`. Async-signal-safe; returns the raw result (0, or -1 with `errno` set).
pub fn close_range_cloexec(first: u32) -> libc::c_long {
    // SAFETY: close_range takes integers only and touches no memory of ours; marking fds
    // close-on-exec cannot invalidate an fd Rust code still uses.
    unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    }
}

/// `clone3(CLONE_INTO_CGROUP)` with `cgroup_fd`: the child `_exit`s at once and is reaped.
/// With an fd that is not open no child can be created: a kernel that knows the flag answers
/// `EBADF`, one that does not answers `EINVAL` (or `ENOSYS` without clone3).
pub fn clone3_into_cgroup(cgroup_fd: RawFd) -> Result<(), Errno> {
    let mut args = CloneArgs {
        flags: CLONE_INTO_CGROUP,
        // No exit signal: the child is a "clone" child that only `__WALL` waits see, so a
        // daemon-wide `waitpid(-1)` reaper cannot steal it and no SIGCHLD is raised.
        exit_signal: 0,
        cgroup: cgroup_fd as u64,
        ..Default::default()
    };
    // SAFETY: no CLONE_VM, no stack, no pointers in `args`: fork semantics. The child runs only
    // `_exit`, which is async-signal-safe, so no lock or allocator state inherited from other
    // threads is touched. The parent reaps the child below.
    let ret = unsafe { clone3(&mut args) };
    if ret == 0 {
        // SAFETY: we are the child; `_exit` never returns and runs no atexit handlers.
        unsafe { libc::_exit(0) };
    }
    if ret < 0 {
        return Err(Errno::last());
    }
    let pid = libc::pid_t::try_from(ret).map_err(|_| Errno::EOVERFLOW)?;
    match nix::sys::wait::waitpid(
        nix::unistd::Pid::from_raw(pid),
        Some(nix::sys::wait::WaitPidFlag::__WALL),
    ) {
        Ok(_) | Err(Errno::ECHILD) => Ok(()),
        Err(e) => Err(e),
    }
}
