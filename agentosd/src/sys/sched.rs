//! `sched_setattr(2)` / `sched_getattr(2)` and `struct sched_attr`. What policy an agent gets is
//! decided in `crate::sched` (pure); this is only the kernel interface.

use nix::errno::Errno;

/// `SCHED_OTHER` (CFS/EEVDF, the default).
pub const SCHED_OTHER: u32 = 0;
/// `SCHED_IDLE`.
pub const SCHED_IDLE: u32 = 5;
/// `SCHED_DEADLINE`.
pub const SCHED_DEADLINE: u32 = 6;
/// `SCHED_FLAG_RESET_ON_FORK`: children of a deadline task start as `SCHED_OTHER`.
pub const SCHED_FLAG_RESET_ON_FORK: u64 = 0x01;
/// `SCHED_ATTR_SIZE_VER0`.
pub const SCHED_ATTR_SIZE: u32 = 48;

/// `struct sched_attr` (SCHED_ATTR_SIZE_VER0) as passed to `sched_setattr(2)`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SchedAttr {
    pub size: u32,
    pub sched_policy: u32,
    pub sched_flags: u64,
    pub sched_nice: i32,
    pub sched_priority: u32,
    pub sched_runtime: u64,
    pub sched_deadline: u64,
    pub sched_period: u64,
}
const _: () = assert!(std::mem::size_of::<SchedAttr>() == SCHED_ATTR_SIZE as usize);

/// `sched_setattr(pid, attr, 0)` as a raw syscall, async-signal-safe (used in the child between
/// clone3 and execve). Returns the raw result (0 or -1 with errno set).
///
/// # Safety
/// `attr` must point to a valid `SchedAttr` for the duration of the call.
pub unsafe fn raw_sched_setattr(pid: libc::pid_t, attr: *const SchedAttr) -> libc::c_long {
    // SAFETY: the caller guarantees `attr` is valid; the kernel reads `attr.size` bytes.
    unsafe { libc::syscall(libc::SYS_sched_setattr, pid, attr, 0u32) }
}

/// Apply `attr` to thread `tid` (0 = the caller).
pub fn set_attr(tid: u32, attr: &SchedAttr) -> std::io::Result<()> {
    // SAFETY: `attr` is a valid reference for the call.
    let r = unsafe { raw_sched_setattr(tid as libc::pid_t, attr) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// `sched_getattr(tid)`.
pub fn get_attr(tid: u32) -> std::io::Result<SchedAttr> {
    let mut attr = SchedAttr::default();
    // SAFETY: `attr` is writable and `size` says how many bytes the kernel may write.
    let r = unsafe {
        libc::syscall(
            libc::SYS_sched_getattr,
            tid as libc::pid_t,
            &mut attr as *mut SchedAttr,
            SCHED_ATTR_SIZE,
            0u32,
        )
    };
    if r == 0 {
        Ok(attr)
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// An integer scheduler sysctl, `/proc/sys/kernel/<name>` (`sched_rt_runtime_us`, ...).
pub fn sysctl(name: &str) -> Option<i64> {
    std::fs::read_to_string(format!("/proc/sys/kernel/{name}"))
        .ok()
        .and_then(|s| s.trim().parse::<i64>().ok())
}

/// Sets the calling thread's policy (the probe). Deadline parameters are in nanoseconds.
pub fn set_self(policy: u32, runtime: u64, deadline: u64, period: u64) -> Result<(), Errno> {
    let attr = SchedAttr {
        size: SCHED_ATTR_SIZE,
        sched_policy: policy,
        sched_runtime: runtime,
        sched_deadline: deadline,
        sched_period: period,
        ..Default::default()
    };
    set_attr(0, &attr).map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(0)))
}
