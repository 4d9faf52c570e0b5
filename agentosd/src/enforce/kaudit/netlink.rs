//! The kernel side: the audit netlink socket (read-only multicast group), the audit status, the
//! host's logging gaps, and the reader loop.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use super::correlate::{Attribute, Correlator, Output};
use super::record::parse;
use super::{AUDIT_GET, AUDIT_NLGRP_READLOG, KauditError, NLMSG_DONE, NLMSG_ERROR, NLMSG_HDRLEN};

fn last_os_error(call: &'static str) -> KauditError {
    KauditError::Sys {
        call,
        source: std::io::Error::last_os_error(),
    }
}

/// Open a netlink audit socket subscribed to the read-only multicast group: every audit record
/// the kernel emits arrives here (beside auditd, if one runs). Needs `CAP_AUDIT_READ`.
pub fn open_readlog() -> Result<OwnedFd, KauditError> {
    // SAFETY: socket(2) with constant arguments; the result is checked before use.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_AUDIT,
        )
    };
    if fd < 0 {
        return Err(last_os_error("socket(AF_NETLINK, NETLINK_AUDIT)"));
    }
    // SAFETY: fd is a descriptor we just created and own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // A large receive buffer absorbs bursts; overruns are counted (ENOBUFS), never silent.
    let size: libc::c_int = 8 << 20;
    for opt in [libc::SO_RCVBUFFORCE, libc::SO_RCVBUF] {
        // SAFETY: setsockopt on our socket with a pointer to a live c_int and its size.
        let r = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                (&size as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r == 0 {
            break;
        }
    }
    let tv = libc::timeval {
        tv_sec: 0,
        tv_usec: 250_000,
    };
    // SAFETY: setsockopt with a pointer to a live timeval and its size.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(last_os_error("setsockopt(SO_RCVTIMEO)"));
    }
    // SAFETY: an all-zero sockaddr_nl is valid; the fields are set below.
    let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    addr.nl_groups = 1 << (AUDIT_NLGRP_READLOG - 1);
    // SAFETY: bind with a pointer to a live sockaddr_nl and its size.
    let r = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(last_os_error(
            "bind(AUDIT_NLGRP_READLOG) (needs CAP_AUDIT_READ)",
        ));
    }
    Ok(fd)
}

/// Split a datagram into `(type, payload)` netlink messages.
pub fn messages(buf: &[u8]) -> Vec<(u16, &[u8])> {
    let mut out = Vec::new();
    let mut off = 0;
    while off + NLMSG_HDRLEN <= buf.len() {
        let len = u32::from_ne_bytes([buf[off], buf[off + 1], buf[off + 2], buf[off + 3]]) as usize;
        let ty = u16::from_ne_bytes([buf[off + 4], buf[off + 5]]);
        if len < NLMSG_HDRLEN || off + len > buf.len() {
            // The audit subsystem sets nlmsg_len to the payload length in some kernels; take
            // the rest of the datagram then.
            out.push((ty, &buf[off + NLMSG_HDRLEN..]));
            break;
        }
        out.push((ty, &buf[off + NLMSG_HDRLEN..off + len]));
        off += (len + 3) & !3;
    }
    out
}

/// The kernel's audit status (`AUDIT_GET`): needs `CAP_AUDIT_CONTROL`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AuditStatus {
    pub enabled: u32,
    /// The pid of the registered audit daemon (0: none).
    pub pid: u32,
    /// Records the kernel lost (backlog full, allocation failure, rate limit), host-wide.
    pub lost: u32,
    pub backlog_limit: u32,
}

/// Ask the kernel for its audit status.
pub fn status() -> Result<AuditStatus, KauditError> {
    // SAFETY: socket(2) with constant arguments; checked before use.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_AUDIT,
        )
    };
    if fd < 0 {
        return Err(last_os_error("socket(AF_NETLINK, NETLINK_AUDIT)"));
    }
    // SAFETY: fd is a descriptor we just created and own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let tv = libc::timeval {
        tv_sec: 1,
        tv_usec: 0,
    };
    // SAFETY: setsockopt with a pointer to a live timeval and its size.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        );
    }
    let mut req = [0u8; NLMSG_HDRLEN];
    req[0..4].copy_from_slice(&(NLMSG_HDRLEN as u32).to_ne_bytes());
    req[4..6].copy_from_slice(&AUDIT_GET.to_ne_bytes());
    req[6..8].copy_from_slice(&(libc::NLM_F_REQUEST as u16).to_ne_bytes());
    req[8..12].copy_from_slice(&1u32.to_ne_bytes());
    // SAFETY: send(2) from a live buffer of the given length.
    let n = unsafe { libc::send(fd.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) };
    if n < 0 {
        return Err(last_os_error("send(AUDIT_GET)"));
    }
    let mut buf = vec![0u8; 8192];
    for _ in 0..4 {
        // SAFETY: recv(2) into a live buffer of the given length.
        let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(last_os_error("recv(AUDIT_GET)"));
        }
        for (ty, p) in messages(&buf[..n as usize]) {
            match ty {
                AUDIT_GET if p.len() >= 32 => {
                    let w = |i: usize| u32::from_ne_bytes([p[i], p[i + 1], p[i + 2], p[i + 3]]);
                    return Ok(AuditStatus {
                        enabled: w(4),
                        pid: w(12),
                        lost: w(24),
                        backlog_limit: w(20),
                    });
                }
                NLMSG_ERROR if p.len() >= 4 => {
                    let e = i32::from_ne_bytes([p[0], p[1], p[2], p[3]]);
                    if e != 0 {
                        return Err(KauditError::Sys {
                            call: "AUDIT_GET (needs CAP_AUDIT_CONTROL)",
                            source: std::io::Error::from_raw_os_error(-e),
                        });
                    }
                }
                NLMSG_DONE => break,
                _ => {}
            }
        }
    }
    Err(KauditError::Protocol("no reply to AUDIT_GET".into()))
}

/// `/proc/sys/kernel/seccomp/actions_logged` lists `errno`: without it the kernel logs no
/// `SECCOMP_RET_ERRNO` even for filters installed with `SECCOMP_FILTER_FLAG_LOG`.
pub fn seccomp_errno_logged() -> Result<bool, std::io::Error> {
    let s = std::fs::read_to_string("/proc/sys/kernel/seccomp/actions_logged")?;
    Ok(s.split_whitespace().any(|a| a == "errno"))
}

/// What keeps Landlock or seccomp denials of agents out of the kernel's audit log on this host
/// (empty when both are logged). Also shown by `agentosd check`.
pub fn gaps() -> Vec<String> {
    let mut gaps = Vec::new();
    match crate::sandbox::landlock::kernel_abi() {
        Some(v) if v >= 7 => match status() {
            Ok(s) if s.enabled == 0 => gaps.push(
                "kernel audit is disabled (audit_enabled=0): Landlock does not log denials; enable it with `auditctl -e 1` (add `-a task,never` so that no process pays for syscall auditing)".into(),
            ),
            Ok(_) => {}
            Err(e) => gaps.push(format!("cannot read the kernel audit status: {e}")),
        },
        Some(v) => gaps.push(format!(
            "Landlock ABI {v} has no audit logging (needs 7, Linux 6.15): Landlock denials are not recorded"
        )),
        None => {}
    }
    match seccomp_errno_logged() {
        Ok(true) => {}
        Ok(false) => gaps.push(
            "/proc/sys/kernel/seccomp/actions_logged lacks `errno`: seccomp denials are not logged (add it: the default list has it)".into(),
        ),
        Err(e) => gaps.push(format!(
            "cannot read /proc/sys/kernel/seccomp/actions_logged: {e}"
        )),
    }
    gaps
}

/// What [`run`] reports besides denials (at most every 2 s).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Loss {
    /// The socket's receive buffer overflowed (`ENOBUFS`) `times` times since the last report:
    /// records were never read, and the kernel does not say how many.
    SocketOverrun { times: u64, total: u64 },
    /// The kernel's own count of lost audit records grew (host-wide: backlog full, rate limit).
    KernelLost { count: u64, total: u64 },
}

/// Read records from `fd` (from [`open_readlog`]) until `stop` returns true, handing every
/// denial and loss to `sink`. Blocking: run it on its own thread.
pub fn run(
    fd: OwnedFd,
    who: &dyn Attribute,
    mut sink: impl FnMut(Result<Output, Loss>),
    stop: impl Fn() -> bool,
) {
    let mut corr = Correlator::default();
    let mut buf = vec![0u8; 64 * 1024];
    let (mut overruns, mut overruns_total) = (0u64, 0u64);
    let mut last_lost = status().ok().map(|s| s.lost);
    let mut last_check = Instant::now();
    let mut budget = crate::enforce::RateBudget::new(last_check);
    while !stop() {
        // SAFETY: recv(2) into a live buffer of the given length.
        let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        let now = Instant::now();
        if n < 0 {
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::ENOBUFS) => {
                    overruns += 1;
                    overruns_total += 1;
                }
                Some(libc::EAGAIN | libc::EINTR) => {}
                _ => {
                    tracing::warn!("kernel audit reader: recv: {e}; stopping");
                    return;
                }
            }
        } else {
            let mut pause = None;
            for (ty, payload) in messages(&buf[..n as usize]) {
                // The daemon's budget for kernel denials (an agent looping over refused
                // syscalls): over it, the reader sleeps after this buffer and the socket
                // overruns, counted as `SocketOverrun` below.
                if let Err(p) = budget.spend(now) {
                    pause = Some(p);
                }
                let Ok(text) = std::str::from_utf8(payload) else {
                    continue;
                };
                if let Some(ev) = parse(ty, text) {
                    for o in corr.feed(ev, now, who) {
                        sink(Ok(o));
                    }
                }
            }
            if let Some(p) = pause {
                std::thread::sleep(p);
            }
        }
        for o in corr.expire(now) {
            sink(Ok(o));
        }
        if now.duration_since(last_check) >= Duration::from_secs(2) {
            last_check = now;
            if overruns > 0 {
                sink(Err(Loss::SocketOverrun {
                    times: overruns,
                    total: overruns_total,
                }));
                overruns = 0;
            }
            if let (Some(prev), Ok(s)) = (last_lost, status()) {
                if s.lost > prev {
                    sink(Err(Loss::KernelLost {
                        count: u64::from(s.lost - prev),
                        total: u64::from(s.lost),
                    }));
                }
                last_lost = Some(s.lost);
            }
        }
    }
}
