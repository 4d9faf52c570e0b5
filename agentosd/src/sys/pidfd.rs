//! Process handles: `pidfd_open(2)`, `pidfd_send_signal(2)`, `waitid(P_PIDFD)` and the
//! `PIDFD_GET_INFO` ioctl. A pidfd names one process for its whole life, so a signal or a wait
//! can never hit a recycled PID.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use super::SyscallError;
use super::process::signal_name;

/// `idtype_t` value for waitid() on a pidfd (Linux 5.4).
const P_PIDFD: libc::idtype_t = 3;

/// Open a pidfd for `pid` (pidfd_open, Linux 5.3).
pub fn pidfd_open(pid: u32) -> Result<OwnedFd, SyscallError> {
    // SAFETY: pidfd_open takes a pid and flags by value and returns a new fd or -1; no memory is
    // shared with the kernel.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0u32) };
    if fd < 0 {
        return Err(SyscallError::new(
            "pidfd_open",
            format!("pid {pid}"),
            io::Error::last_os_error(),
        ));
    }
    // SAFETY: the kernel just returned this fd to us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Send `signal` to the process behind `pidfd` (pidfd_send_signal, Linux 5.1). Unlike kill(2)
/// this can never hit a recycled PID.
pub fn pidfd_send_signal(pidfd: BorrowedFd<'_>, signal: i32) -> Result<(), SyscallError> {
    // SAFETY: the fd is a valid pidfd borrowed for the call; info is NULL (kernel fills it in);
    // flags 0.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0u32,
        )
    };
    if rc < 0 {
        return Err(SyscallError::new(
            "pidfd_send_signal",
            format!("signal {signal}"),
            io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ExitStatus {
    /// exit(code)
    Exited(i32),
    /// killed by this signal
    Signaled(i32),
    /// not our child (re-adopted after a daemon restart): the kernel does not tell us
    Unknown,
}

impl ExitStatus {
    pub fn success(&self) -> bool {
        matches!(self, ExitStatus::Exited(0))
    }
    /// systemd-style text: `code=exited, status=1` / `code=killed, signal=TERM`.
    pub fn describe(&self) -> String {
        match self {
            ExitStatus::Exited(c) => format!("code=exited, status={c}"),
            ExitStatus::Signaled(s) => format!("code=killed, signal={}", signal_name(*s)),
            ExitStatus::Unknown => "status unknown (re-adopted)".to_string(),
        }
    }
}

/// `waitid(P_PIDFD, pidfd, flags)`: the filled `siginfo_t` (zeroed when WNOHANG found nothing).
fn waitid_pidfd(pidfd: BorrowedFd<'_>, flags: libc::c_int) -> io::Result<libc::siginfo_t> {
    // SAFETY: siginfo_t is plain old data; all-zero is a valid value.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is a valid, writable siginfo_t for the duration of the call; the fd is a
    // valid pidfd borrowed for the call.
    let rc = unsafe { libc::waitid(P_PIDFD, pidfd.as_raw_fd() as libc::id_t, &mut info, flags) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(info)
}

/// Reap the process behind `pidfd` if it is our child and has exited (waitid(P_PIDFD, WEXITED |
/// WNOHANG)). `Ok(None)`: still running. `ECHILD` (not our child) gives `ExitStatus::Unknown`.
pub fn pidfd_try_wait(pidfd: BorrowedFd<'_>) -> Result<Option<ExitStatus>, SyscallError> {
    let info = match waitid_pidfd(pidfd, libc::WEXITED | libc::WNOHANG) {
        Ok(info) => info,
        Err(e) if e.raw_os_error() == Some(libc::ECHILD) => return Ok(Some(ExitStatus::Unknown)),
        Err(e) => return Err(SyscallError::new("waitid", "P_PIDFD", e)),
    };
    // SAFETY: waitid filled `info` (or left it zeroed with WNOHANG); si_pid/si_status are valid to
    // read for SIGCHLD-type info.
    let (pid, status) = unsafe { (info.si_pid(), info.si_status()) };
    if pid == 0 {
        return Ok(None);
    }
    Ok(Some(match info.si_code {
        libc::CLD_EXITED => ExitStatus::Exited(status),
        _ => ExitStatus::Signaled(status),
    }))
}

/// Wait for the child behind `pidfd` to exit and reap it (waitid(P_PIDFD, WEXITED), blocking).
/// For a child known to be exiting (spawn's failed exec); the status is not needed.
pub fn pidfd_reap(pidfd: BorrowedFd<'_>) -> Result<(), SyscallError> {
    waitid_pidfd(pidfd, libc::WEXITED)
        .map(drop)
        .map_err(|e| SyscallError::new("waitid", "P_PIDFD", e))
}

/// `struct pidfd_info` of `<linux/pidfd.h>`, first version (64 bytes, Linux 6.13).
#[repr(C)]
#[derive(Default)]
struct PidfdInfo {
    mask: u64,
    cgroupid: u64,
    pid: u32,
    tgid: u32,
    ppid: u32,
    ruid: u32,
    rgid: u32,
    euid: u32,
    egid: u32,
    suid: u32,
    sgid: u32,
    fsuid: u32,
    fsgid: u32,
    exit_code: i32,
}

const PIDFD_INFO_CGROUPID: u64 = 1 << 2;
/// `_IOWR(PIDFS_IOCTL_MAGIC=0xFF, 11, struct pidfd_info)` with the 64-byte struct.
const PIDFD_GET_INFO: libc::c_ulong =
    (3 << 30) | ((std::mem::size_of::<PidfdInfo>() as libc::c_ulong) << 16) | (0xFF << 8) | 11;

/// The cgroup v2 id (the inode of its directory) of the live process behind `pidfd`
/// (`PIDFD_GET_INFO`, Linux 6.13). ESRCH: the process is gone. Other errors: not supported.
pub fn pidfd_cgroup_id(pidfd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut info = PidfdInfo {
        mask: PIDFD_INFO_CGROUPID,
        ..Default::default()
    };
    // SAFETY: PIDFD_GET_INFO writes at most _IOC_SIZE(cmd) = size_of::<PidfdInfo>() bytes into
    // `info`, a live, exclusively borrowed #[repr(C)] struct of that size; the fd is a valid
    // borrowed pidfd for the duration of the call.
    let rc = unsafe {
        libc::ioctl(
            pidfd.as_raw_fd(),
            PIDFD_GET_INFO as _,
            &mut info as *mut PidfdInfo,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    if info.mask & PIDFD_INFO_CGROUPID == 0 {
        return Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP));
    }
    Ok(info.cgroupid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pidfd_info_layout_matches_the_kernel() {
        assert_eq!(std::mem::size_of::<PidfdInfo>(), 64);
        assert_eq!(PIDFD_GET_INFO, 0xC040_FF0B);
    }

    #[test]
    fn own_pidfd_takes_signal_zero() {
        let fd = pidfd_open(std::process::id()).unwrap();
        use std::os::fd::AsFd;
        pidfd_send_signal(fd.as_fd(), 0).unwrap();
    }
}
