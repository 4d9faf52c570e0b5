//! The Landlock system calls agentos makes itself. Rulesets are created with the `landlock`
//! crate in `sandbox::landlock` (its compatibility handling of the handled rights); here are the
//! ABI version query, the path rules (added directly: the daemon knows each fd's type, the
//! crate would `fstat` every one) and the child's `landlock_restrict_self`.

use std::os::fd::{AsRawFd, BorrowedFd, RawFd};

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

/// `LANDLOCK_RULE_PATH_BENEATH`.
const LANDLOCK_RULE_PATH_BENEATH: libc::c_uint = 1;

/// `struct landlock_path_beneath_attr` (packed in the uapi header: 12 bytes).
#[repr(C, packed)]
struct PathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}

/// `landlock_add_rule(ruleset, LANDLOCK_RULE_PATH_BENEATH, {allowed_access, parent}, 0)`.
/// `allowed_access` must be a non-empty subset of the rights the ruleset handles, and hold only
/// file rights when `parent` is not a directory: the kernel refuses anything else (`EINVAL`,
/// `ENOMSG` for an empty set), so a wrong file type fails the start instead of granting more.
pub fn add_path_beneath(
    ruleset: BorrowedFd<'_>,
    parent: BorrowedFd<'_>,
    allowed_access: u64,
) -> Result<(), Errno> {
    let attr = PathBeneathAttr {
        allowed_access,
        parent_fd: parent.as_raw_fd(),
    };
    // SAFETY: `attr` is a live, correctly laid out `landlock_path_beneath_attr` for the whole
    // call (the kernel copies it in); both fds are borrowed, hence open.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_landlock_add_rule,
            ruleset.as_raw_fd(),
            LANDLOCK_RULE_PATH_BENEATH,
            std::ptr::addr_of!(attr),
            0u32,
        )
    };
    if ret < 0 { Err(Errno::last()) } else { Ok(()) }
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
