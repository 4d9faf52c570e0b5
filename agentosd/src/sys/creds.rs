//! The credential system calls of a freshly cloned child, raw and per thread.
//!
//! Not glibc's `setgroups`/`setres[ug]id`: those apply POSIX process-wide semantics by
//! signalling every thread glibc believes exists (`__nptl_setxid`), and after a raw `clone3`
//! from the multi-threaded daemon that list still names the parent's threads, so the child could
//! wait forever for them. The child has exactly one thread, so the per-thread kernel call is the
//! whole effect. Each returns the raw result (0, or -1 with `errno` set) and is
//! async-signal-safe.

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// `setgroups(0, NULL)`: no supplementary groups.
///
/// # Safety
/// Call only in a single-threaded child between clone and execve (see the module comment).
pub unsafe fn drop_groups() -> libc::c_long {
    // SAFETY: size 0 and a NULL list: the kernel reads no memory.
    unsafe { libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) }
}

/// `setresgid(gid, gid, gid)` for the calling thread.
///
/// # Safety
/// Call only in a single-threaded child between clone and execve (see the module comment).
pub unsafe fn set_gid(gid: libc::gid_t) -> libc::c_long {
    // SAFETY: integers only.
    unsafe { libc::syscall(libc::SYS_setresgid, gid, gid, gid) }
}

/// `setresuid(uid, uid, uid)` for the calling thread.
///
/// # Safety
/// Call only in a single-threaded child between clone and execve (see the module comment).
pub unsafe fn set_uid(uid: libc::uid_t) -> libc::c_long {
    // SAFETY: integers only.
    unsafe { libc::syscall(libc::SYS_setresuid, uid, uid, uid) }
}

/// `capset` of the calling thread to nothing: no effective, permitted or inheritable capability.
///
/// # Safety
/// Call only in a single-threaded child between clone and execve (see the module comment).
pub unsafe fn clear_caps() -> libc::c_long {
    let mut hdr = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [CapData {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: a version-3 header and the two data structs it requires, both live locals.
    unsafe { libc::syscall(libc::SYS_capset, &mut hdr as *mut CapHeader, data.as_ptr()) }
}
