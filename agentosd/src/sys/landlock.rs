//! The Landlock system calls agentos makes itself. Rulesets are built with the `landlock` crate
//! in `sandbox::landlock`; here are only the ABI version query and the child's
//! `landlock_restrict_self`.

use std::os::fd::RawFd;

use nix::errno::Errno;

/// `LANDLOCK_CREATE_RULESET_VERSION`: ask for the ABI version instead of making a ruleset.
const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;

/// The kernel's Landlock ABI version (`landlock_create_ruleset(NULL, 0, VERSION)`): `ENOSYS`
/// without Landlock, `EOPNOTSUPP` when built in but not enabled (`lsm=`).
pub fn abi_version() -> Result<u32, Errno> {
    // SAFETY: with a NULL attr, size 0 and the VERSION flag the kernel reads no memory and
    // returns the ABI version (no file descriptor is created).
    let ret = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if ret < 0 {
        Err(Errno::last())
    } else {
        u32::try_from(ret).map_err(|_| Errno::EOVERFLOW)
    }
}

/// `landlock_restrict_self(ruleset_fd, flags)` as a raw syscall, async-signal-safe (the child
/// between clone3 and execve). Returns the raw result (0, or -1 with `errno` set).
///
/// # Safety
/// `ruleset_fd` must be an open Landlock ruleset fd. The restriction is irrevocable for the
/// calling thread: call it only in the child that is about to exec the agent.
pub unsafe fn restrict_self(ruleset_fd: RawFd, flags: u32) -> libc::c_long {
    // SAFETY: integers only; the caller guarantees the fd and that restricting this thread is
    // what it wants.
    unsafe { libc::syscall(libc::SYS_landlock_restrict_self, ruleset_fd, flags) }
}
