//! `seccomp(2)`: install a filter in the child, and what the probe asks the kernel (the calling
//! thread's mode, which return actions exist, the user-notify structure sizes). The filters
//! themselves are compiled in `sandbox::seccomp`.

use nix::errno::Errno;

use super::unit_result;

const SECCOMP_SET_MODE_FILTER: libc::c_uint = 1;
const SECCOMP_GET_ACTION_AVAIL: libc::c_uint = 2;
const SECCOMP_GET_NOTIF_SIZES: libc::c_uint = 3;
/// Log the filter's non-allow actions to the audit subsystem (those listed in
/// `/proc/sys/kernel/seccomp/actions_logged`); see enforce/kaudit/netlink.rs.
pub const SECCOMP_FILTER_FLAG_LOG: libc::c_uint = 1 << 1;

pub const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
pub const SECCOMP_RET_KILL_PROCESS: u32 = 0x8000_0000;
pub const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
pub const SECCOMP_RET_USER_NOTIF: u32 = 0x7fc0_0000;
pub const SECCOMP_RET_LOG: u32 = 0x7ffc_0000;

/// `seccomp(SECCOMP_SET_MODE_FILTER, flags, prog)` as a raw syscall, async-signal-safe (the
/// child between clone3 and execve). Returns the raw result (0, or -1 with `errno` set).
///
/// # Safety
/// `prog` must describe `len` valid `sock_filter` instructions that stay alive for the call.
/// The filter is irrevocable: call it only in the child about to exec the agent, after
/// `PR_SET_NO_NEW_PRIVS` (or with CAP_SYS_ADMIN).
pub unsafe fn set_mode_filter(flags: libc::c_uint, prog: &libc::sock_fprog) -> libc::c_long {
    // SAFETY: the kernel copies the program the caller guarantees is valid.
    unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            SECCOMP_SET_MODE_FILTER,
            flags,
            prog as *const libc::sock_fprog,
        )
    }
}

/// The calling thread's seccomp mode: 0 none, 1 strict, 2 filter.
pub fn mode() -> Result<i32, Errno> {
    // SAFETY: PR_GET_SECCOMP takes no pointer arguments.
    let ret = unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) };
    if ret < 0 { Err(Errno::last()) } else { Ok(ret) }
}

/// Whether the kernel knows the filter return action `action`.
pub fn action_avail(action: u32) -> Result<(), Errno> {
    // SAFETY: the kernel reads one u32 from a pointer to a live local.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            SECCOMP_GET_ACTION_AVAIL,
            0u32,
            &action as *const u32,
        )
    };
    unit_result(ret)
}

/// `struct seccomp_notif_sizes`: (notif, resp, data) sizes, proves the user-notify API exists.
pub fn notif_sizes() -> Result<(u16, u16, u16), Errno> {
    let mut sizes = [0u16; 3];
    // SAFETY: the kernel writes a `struct seccomp_notif_sizes` (three u16) into `sizes`.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            SECCOMP_GET_NOTIF_SIZES,
            0u32,
            sizes.as_mut_ptr(),
        )
    };
    unit_result(ret).map(|()| (sizes[0], sizes[1], sizes[2]))
}
