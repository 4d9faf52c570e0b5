//! The one chokepoint for raw syscalls the daemon makes itself (pidfds, clone3 lives in
//! `spawn`). Every failure names the call and the object it was made on.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

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

/// Reap the process behind `pidfd` if it is our child and has exited (waitid(P_PIDFD, WEXITED |
/// WNOHANG)). `Ok(None)`: still running. `ECHILD` (not our child) gives `ExitStatus::Unknown`.
pub fn pidfd_try_wait(pidfd: BorrowedFd<'_>) -> Result<Option<ExitStatus>, SyscallError> {
    // SAFETY: siginfo_t is plain old data; all-zero is a valid value.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is a valid, writable siginfo_t for the duration of the call; the fd is a
    // valid pidfd borrowed for the call.
    let rc = unsafe {
        libc::waitid(
            P_PIDFD,
            pidfd.as_raw_fd() as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG,
        )
    };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ECHILD) {
            return Ok(Some(ExitStatus::Unknown));
        }
        return Err(SyscallError::new("waitid", "P_PIDFD", e));
    }
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

/// Whether a process with this PID exists (kill(pid, 0)).
pub fn pid_alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// The process start time in clock ticks since boot (field 22 of /proc/PID/stat); together with
/// the PID it identifies a process across PID reuse.
pub fn process_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // comm may contain spaces and parentheses: fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    // rest starts at field 3 (state); starttime is field 22.
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// The one-letter scheduler state of a process (field 3 of /proc/PID/stat).
pub fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 2..].chars().next()
}

/// The command line of a process, arguments joined by spaces.
pub fn process_cmdline(pid: u32) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let s: Vec<String> = raw
        .split(|b| *b == 0)
        .filter(|p| !p.is_empty())
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect();
    Some(s.join(" "))
}

/// The parent PID of a process (field 4 of /proc/PID/stat).
pub fn process_ppid(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 2..]
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The kernel's boot id, to tell a daemon restart from a reboot.
pub fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

pub use agentos_api::signal::{parse_signal, signal_name};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_identity() {
        let me = std::process::id();
        assert!(process_start_time(me).is_some());
        assert!(pid_alive(me));
        assert!(process_state(me).is_some());
        let fd = pidfd_open(me).unwrap();
        use std::os::fd::AsFd;
        pidfd_send_signal(fd.as_fd(), 0).unwrap();
    }
}
