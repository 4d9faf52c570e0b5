//! Landlock and seccomp denials of agents, read from the kernel's audit subsystem.
//!
//! Agents are sandboxed so that the kernel itself reports what it refuses them, with mechanisms
//! scoped to the agents (no global syscall tracepoint: see docs/audit.md):
//!
//! - seccomp: the agent's deny-list filter is installed with `SECCOMP_FILTER_FLAG_LOG`, so each
//!   `SECCOMP_RET_ERRNO` it returns produces an `AUDIT_SECCOMP` record when `errno` is in
//!   `/proc/sys/kernel/seccomp/actions_logged` (the kernel's default). This works with audit
//!   disabled.
//! - Landlock (ABI ≥ 7): the agent's domain is created with
//!   `LANDLOCK_RESTRICT_SELF_LOG_NEW_EXEC_ON` (the kernel logs only denials before `execve` by
//!   default), so each denial produces `AUDIT_LANDLOCK_ACCESS` (domain id, blockers, path or
//!   address) and, at a domain's first denial, `AUDIT_LANDLOCK_DOMAIN` (the pid and uid that
//!   created the domain). Landlock logs only while audit is enabled (`audit_enabled=1`).
//!
//! The daemon reads both from the audit netlink socket's read-only multicast group
//! (`AUDIT_NLGRP_READLOG`, needs `CAP_AUDIT_READ`), beside auditd or without it; it never
//! registers itself as the audit daemon and never changes audit settings.
//!
//! Parsing ([`parse`]) and the Landlock domain bookkeeping ([`Correlator`]) are pure and unit
//! tested with records captured on the development host; [`open_readlog`] and [`run`] are the
//! kernel side.

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// `AUDIT_GET`: the audit status (enabled, lost, backlog…).
pub const AUDIT_GET: u16 = 1000;
/// A seccomp action that the kernel was asked to log.
pub const AUDIT_SECCOMP: u16 = 1326;
/// One Landlock denial.
pub const AUDIT_LANDLOCK_ACCESS: u16 = 1423;
/// A Landlock domain's creator (logged at its first denial) or its end.
pub const AUDIT_LANDLOCK_DOMAIN: u16 = 1424;
/// The read-only multicast group of audit records.
pub const AUDIT_NLGRP_READLOG: u32 = 1;

const NLMSG_HDRLEN: usize = 16;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;

/// The x86-64 audit architecture (`AUDIT_ARCH_X86_64`).
const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
const X32_SYSCALL_BIT: i64 = 0x4000_0000;

#[derive(Debug, thiserror::Error)]
pub enum KauditError {
    #[error("audit netlink: {call}: {source}")]
    Sys {
        call: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("audit netlink: {0}")]
    Protocol(String),
}

fn last_os_error(call: &'static str) -> KauditError {
    KauditError::Sys {
        call,
        source: std::io::Error::last_os_error(),
    }
}

// ---------------------------------------------------------------------------------------------
// parsing (pure)

/// `audit(SECONDS.MILLIS:SERIAL)`: when the kernel made the record, and its serial number.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stamp {
    pub time_ms: u64,
    pub serial: u64,
}

/// `AUDIT_SECCOMP`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SeccompRecord {
    pub stamp: Stamp,
    pub pid: u32,
    pub uid: Option<u32>,
    pub comm: String,
    pub exe: String,
    pub arch: u32,
    pub syscall: i64,
    pub sig: i64,
    /// The filter's action (`SECCOMP_RET_*` without its data: the errno is not logged).
    pub code: u32,
}

/// `AUDIT_LANDLOCK_ACCESS`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LandlockAccess {
    pub stamp: Stamp,
    pub domain: u64,
    /// `fs.read_file`, `net.connect_tcp`, `scope.signal`, …
    pub blockers: Vec<String>,
    /// What the kernel said about the object (`path`, `dev`, `ino`, `daddr`, `dest`, `opid`…).
    pub object: Vec<(String, String)>,
}

/// `AUDIT_LANDLOCK_DOMAIN`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LandlockDomain {
    pub stamp: Stamp,
    pub domain: u64,
    /// `allocated` (with the creator) or `deallocated` (with the denial count).
    pub status: String,
    pub pid: Option<u32>,
    pub uid: Option<u32>,
    pub exe: Option<String>,
    pub comm: Option<String>,
    pub denials: Option<u64>,
}

/// An audit record this module understands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Seccomp(SeccompRecord),
    LandlockAccess(LandlockAccess),
    LandlockDomain(LandlockDomain),
}

/// Parse the text of one audit record of netlink message type `msg_type`; `None` for the types
/// this module does not use and for records it cannot read.
pub fn parse(msg_type: u16, text: &str) -> Option<Event> {
    let text = text.trim_end_matches(['\0', '\n']);
    let (stamp, rest) = parse_stamp(text)?;
    let f = fields(rest);
    let get = |k: &str| f.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    let num = |k: &str| get(k).and_then(|v| v.parse::<i64>().ok());
    let unum = |k: &str| get(k).and_then(|v| v.parse::<u32>().ok());
    let hex =
        |k: &str| get(k).and_then(|v| u64::from_str_radix(v.trim_start_matches("0x"), 16).ok());
    match msg_type {
        AUDIT_SECCOMP => Some(Event::Seccomp(SeccompRecord {
            stamp,
            pid: unum("pid")?,
            uid: unum("uid"),
            comm: get("comm").unwrap_or("").to_string(),
            exe: get("exe").unwrap_or("").to_string(),
            arch: get("arch")
                .and_then(|v| u32::from_str_radix(v, 16).ok())
                .unwrap_or(0),
            syscall: num("syscall")?,
            sig: num("sig").unwrap_or(0),
            code: hex("code")? as u32,
        })),
        AUDIT_LANDLOCK_ACCESS => {
            let domain = hex("domain")?;
            let blockers = get("blockers")
                .unwrap_or("")
                .split(',')
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect();
            let object = f
                .iter()
                .filter(|(k, _)| k != "domain" && k != "blockers")
                .cloned()
                .collect();
            Some(Event::LandlockAccess(LandlockAccess {
                stamp,
                domain,
                blockers,
                object,
            }))
        }
        AUDIT_LANDLOCK_DOMAIN => Some(Event::LandlockDomain(LandlockDomain {
            stamp,
            domain: hex("domain")?,
            status: get("status").unwrap_or("").to_string(),
            pid: unum("pid"),
            uid: unum("uid"),
            exe: get("exe").map(str::to_string),
            comm: get("comm").map(str::to_string),
            denials: get("denials").and_then(|v| v.parse().ok()),
        })),
        _ => None,
    }
}

fn parse_stamp(text: &str) -> Option<(Stamp, &str)> {
    let rest = text.strip_prefix("audit(")?;
    let (inner, rest) = rest.split_once("):")?;
    let (time, serial) = inner.split_once(':')?;
    let (sec, ms) = time.split_once('.').unwrap_or((time, "0"));
    let time_ms = sec.parse::<u64>().ok()? * 1000 + ms.parse::<u64>().ok()?;
    Some((
        Stamp {
            time_ms,
            serial: serial.parse().ok()?,
        },
        rest,
    ))
}

/// `key=value` pairs. A value is either `"quoted"` (no escapes: the kernel quotes only strings
/// without special characters) or a bare token; the kernel writes untrusted strings that need
/// escaping (a path with a space, a comm with a quote) as bare hex, which is decoded for the
/// keys that hold such strings.
fn fields(text: &str) -> Vec<(String, String)> {
    const UNTRUSTED: &[&str] = &["comm", "exe", "path", "ocomm", "name", "cwd"];
    let mut out = Vec::new();
    let mut s = text.trim_start();
    while !s.is_empty() {
        let Some(eq) = s.find('=') else { break };
        let key = s[..eq].trim();
        let after = &s[eq + 1..];
        let (value, rest) = if let Some(q) = after.strip_prefix('"') {
            match q.find('"') {
                Some(end) => (q[..end].to_string(), &q[end + 1..]),
                None => (q.to_string(), ""),
            }
        } else {
            let end = after.find(char::is_whitespace).unwrap_or(after.len());
            let raw = &after[..end];
            let v = if UNTRUSTED.contains(&key) {
                decode_hex(raw).unwrap_or_else(|| raw.to_string())
            } else {
                raw.to_string()
            };
            (v, &after[end..])
        };
        if !key.is_empty() {
            out.push((key.to_string(), value));
        }
        s = rest.trim_start();
    }
    out
}

fn decode_hex(s: &str) -> Option<String> {
    if s.is_empty() || !s.len().is_multiple_of(2) || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect();
    Some(String::from_utf8_lossy(&bytes?).into_owned())
}

// ---------------------------------------------------------------------------------------------
// denials (pure)

/// One kernel denial as it goes into the audit trail (the agent is found by the caller).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denial {
    /// `landlock` or `seccomp`.
    pub mechanism: &'static str,
    /// The system call, by name (for Landlock: the operation its blocker stands for).
    pub syscall: String,
    pub syscall_nr: Option<i64>,
    /// `EACCES`, `EPERM`, … (`None` for a kill).
    pub errno: Option<&'static str>,
    pub errno_num: Option<i32>,
    /// `errno`, `kill-process`, `kill-thread`, `trap`…
    pub action: &'static str,
    /// The process that was refused (seccomp); Landlock's record does not name it (only the
    /// domain, whose creator is in `domain_pid`).
    pub pid: Option<u32>,
    pub uid: Option<u32>,
    pub comm: Option<String>,
    pub exe: Option<String>,
    pub path: Option<String>,
    pub addr: Option<String>,
    pub port: Option<u16>,
    pub blockers: Vec<String>,
    pub domain: Option<u64>,
    /// Landlock: the process that created the domain (the agent's main process of that run).
    pub domain_pid: Option<u32>,
    pub stamp: Stamp,
}

impl Denial {
    /// The record's `detail` (the supervisor adds the attribution).
    pub fn detail(&self) -> Value {
        let mut d = json!({
            "mechanism": self.mechanism,
            "syscall": self.syscall,
            "action": self.action,
            "audit_serial": self.stamp.serial,
            "audit_time_ms": self.stamp.time_ms,
        });
        let mut put = |k: &str, v: Value| {
            if !v.is_null() {
                d[k] = v;
            }
        };
        put("syscall_nr", json!(self.syscall_nr));
        put("errno", json!(self.errno));
        put("errno_num", json!(self.errno_num));
        put("pid", json!(self.pid));
        put("uid", json!(self.uid));
        put("comm", json!(self.comm));
        put("exe", json!(self.exe));
        put("path", json!(self.path));
        put("addr", json!(self.addr));
        put("port", json!(self.port));
        if !self.blockers.is_empty() {
            put("blockers", json!(self.blockers));
        }
        put("domain", json!(self.domain.map(|d| format!("{d:x}"))));
        put("domain_pid", json!(self.domain_pid));
        d
    }
}

/// `SECCOMP_RET_*` action names, as in `actions_logged`.
fn seccomp_action(code: u32) -> &'static str {
    match code & 0xffff_0000 {
        0x8000_0000 => "kill-process",
        0x0000_0000 => "kill-thread",
        0x0003_0000 => "trap",
        0x0005_0000 => "errno",
        0x7fc0_0000 => "user-notif",
        0x7ff0_0000 => "trace",
        0x7ffc_0000 => "log",
        _ => "other",
    }
}

/// The name of an x86-64 system call number: those of the agents' deny-list (the only ones
/// their filter logs) and `#NR` otherwise; x32 numbers (bit 30) as `x32:#NR`.
pub fn syscall_name(arch: u32, nr: i64) -> String {
    if arch != 0 && arch != AUDIT_ARCH_X86_64 {
        return format!("arch {arch:x}:#{nr}");
    }
    if nr & X32_SYSCALL_BIT != 0 {
        return format!("x32:#{}", nr & !X32_SYSCALL_BIT);
    }
    crate::sandbox::seccomp::syscall_name(nr).map_or_else(|| format!("#{nr}"), str::to_string)
}

/// The denial an `AUDIT_SECCOMP` record stands for. The agents' deny-list filter (the only one
/// installed with `SECCOMP_FILTER_FLAG_LOG`) returns EPERM, ENOSYS for x32 numbers, and
/// EAFNOSUPPORT/EPROTONOSUPPORT for socket().
pub fn seccomp_denial(r: &SeccompRecord) -> Denial {
    let action = seccomp_action(r.code);
    let x32 = r.syscall & X32_SYSCALL_BIT != 0;
    // The record has the action, not the errno: the socket rules (sandbox/seccomp.rs) answer
    // socket()/socketpair() with EAFNOSUPPORT (family) or EPROTONOSUPPORT (type, protocol).
    let socket = r.syscall == libc::SYS_socket || r.syscall == libc::SYS_socketpair;
    let (errno, errno_num) = match action {
        "errno" if x32 => (Some("ENOSYS"), Some(libc::ENOSYS)),
        "errno" if socket => (Some("EAFNOSUPPORT or EPROTONOSUPPORT"), None),
        "errno" => (Some("EPERM"), Some(libc::EPERM)),
        _ => (None, None),
    };
    Denial {
        mechanism: "seccomp",
        syscall: syscall_name(r.arch, r.syscall),
        syscall_nr: Some(r.syscall),
        errno,
        errno_num,
        action,
        pid: Some(r.pid),
        uid: r.uid,
        comm: Some(r.comm.clone()).filter(|c| !c.is_empty()),
        exe: Some(r.exe.clone()).filter(|c| !c.is_empty()),
        path: None,
        addr: None,
        port: None,
        blockers: Vec::new(),
        domain: None,
        domain_pid: None,
        stamp: r.stamp,
    }
}

/// The system call behind a Landlock blocker and the error it got. Landlock's record names the
/// access right, not the call: `open` stands for open/openat/openat2/creat.
fn landlock_op(blocker: &str) -> (&'static str, &'static str, i32) {
    let (call, errno) = match blocker {
        "fs.execute" => ("execve", "EACCES"),
        "fs.write_file" | "fs.read_file" | "fs.read_dir" | "fs.make_reg" => ("open", "EACCES"),
        "fs.truncate" => ("truncate", "EACCES"),
        "fs.remove_dir" => ("rmdir", "EACCES"),
        "fs.remove_file" => ("unlink", "EACCES"),
        "fs.make_char" | "fs.make_block" | "fs.make_fifo" | "fs.make_sock" => ("mknod", "EACCES"),
        "fs.make_dir" => ("mkdir", "EACCES"),
        "fs.make_sym" => ("symlink", "EACCES"),
        "fs.refer" => ("rename", "EXDEV"),
        "fs.ioctl_dev" => ("ioctl", "EACCES"),
        "net.bind_tcp" => ("bind", "EACCES"),
        "net.connect_tcp" => ("connect", "EACCES"),
        "scope.signal" => ("kill", "EPERM"),
        "scope.abstract_unix_socket" => ("connect", "EPERM"),
        _ => ("unknown", "EACCES"),
    };
    let num = match errno {
        "EPERM" => libc::EPERM,
        "EXDEV" => libc::EXDEV,
        _ => libc::EACCES,
    };
    (call, errno, num)
}

/// The denial an `AUDIT_LANDLOCK_ACCESS` record stands for; `creator` is the domain's
/// `allocated` record when it was seen.
pub fn landlock_denial(a: &LandlockAccess, creator: Option<&LandlockDomain>) -> Denial {
    let first = a.blockers.first().map(String::as_str).unwrap_or("");
    let (call, errno, num) = landlock_op(first);
    let get = |k: &str| {
        a.object
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
    };
    let addr = get("daddr")
        .or_else(|| get("saddr"))
        .or_else(|| get("laddr"));
    let port = get("dest")
        .or_else(|| get("src"))
        .or_else(|| get("lport"))
        .and_then(|p| p.parse().ok());
    Denial {
        mechanism: "landlock",
        syscall: call.to_string(),
        syscall_nr: None,
        errno: Some(errno),
        errno_num: Some(num),
        action: "deny",
        pid: None,
        uid: creator.and_then(|c| c.uid),
        // The creator's comm and exe are the daemon's (the domain is made before execve):
        // left out rather than misleading.
        comm: None,
        exe: None,
        path: get("path"),
        addr,
        port,
        blockers: a.blockers.clone(),
        domain: Some(a.domain),
        domain_pid: creator.and_then(|c| c.pid),
        stamp: a.stamp,
    }
}

// ---------------------------------------------------------------------------------------------
// attribution (pure bookkeeping)

/// Who a denial belongs to, as the supervisor found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attribution {
    pub tenant: String,
    pub name: String,
    /// How it was found: `cgroup` (the process's cgroup, read when the record arrived), `uid`
    /// (the agent's own uid, when the process was already gone).
    pub by: &'static str,
}

/// Finds the agent of a process; implemented by the supervisor (and by fakes in tests).
pub trait Attribute {
    fn attribute(&self, pid: Option<u32>, uid: Option<u32>) -> Option<Attribution>;
}

/// What the correlator hands on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// A denial of an agent (`Some`), or one no agent could be found for (`None`: a Landlock
    /// domain whose creator was never seen, e.g. logged before the daemon started).
    Denial(Denial, Option<Attribution>),
}

enum DomainOwner {
    Agent(Attribution, LandlockDomain),
    /// Created by a process that is not an agent: its denials are not ours.
    Foreign,
}

/// Turns records into denials: seccomp records are attributed at once; a Landlock access
/// record is attributed through its domain, whose `allocated` record (with the creator's pid
/// and uid) the kernel sends right after the domain's first access record, so an access record
/// of an unknown domain waits for it (at most [`Correlator::WAIT`]).
#[derive(Default)]
pub struct Correlator {
    domains: HashMap<u64, DomainOwner>,
    pending: VecDeque<(Instant, LandlockAccess)>,
    /// Records of processes that are not agents (not written).
    pub foreign: u64,
}

impl Correlator {
    pub const WAIT: Duration = Duration::from_secs(1);
    const MAX_PENDING: usize = 4096;
    const MAX_DOMAINS: usize = 65_536;

    pub fn feed(&mut self, ev: Event, now: Instant, who: &dyn Attribute) -> Vec<Output> {
        let mut out = Vec::new();
        match ev {
            Event::Seccomp(r) => match who.attribute(Some(r.pid), r.uid) {
                Some(a) => out.push(Output::Denial(seccomp_denial(&r), Some(a))),
                None => self.foreign += 1,
            },
            Event::LandlockAccess(a) => match self.domains.get(&a.domain) {
                Some(DomainOwner::Agent(who, creator)) => {
                    out.push(Output::Denial(
                        landlock_denial(&a, Some(creator)),
                        Some(who.clone()),
                    ));
                }
                Some(DomainOwner::Foreign) => self.foreign += 1,
                None => {
                    self.pending.push_back((now, a));
                    if self.pending.len() > Self::MAX_PENDING
                        && let Some((_, a)) = self.pending.pop_front()
                    {
                        out.push(Output::Denial(landlock_denial(&a, None), None));
                    }
                }
            },
            Event::LandlockDomain(d) if d.status == "deallocated" => {
                self.domains.remove(&d.domain);
            }
            Event::LandlockDomain(d) => {
                if self.domains.len() >= Self::MAX_DOMAINS {
                    self.domains.clear();
                }
                let owner = match who.attribute(d.pid, d.uid) {
                    Some(a) => DomainOwner::Agent(a, d.clone()),
                    None => DomainOwner::Foreign,
                };
                self.domains.insert(d.domain, owner);
                let waiting: Vec<_> = self
                    .pending
                    .iter()
                    .filter(|(_, a)| a.domain == d.domain)
                    .map(|(_, a)| a.clone())
                    .collect();
                self.pending.retain(|(_, a)| a.domain != d.domain);
                for a in waiting {
                    match self.domains.get(&a.domain) {
                        Some(DomainOwner::Agent(who, creator)) => out.push(Output::Denial(
                            landlock_denial(&a, Some(creator)),
                            Some(who.clone()),
                        )),
                        _ => self.foreign += 1,
                    }
                }
            }
        }
        out
    }

    /// Access records that waited too long for their domain: handed on unattributed.
    pub fn expire(&mut self, now: Instant) -> Vec<Output> {
        let mut out = Vec::new();
        while let Some((t, _)) = self.pending.front() {
            if now.duration_since(*t) < Self::WAIT {
                break;
            }
            if let Some((_, a)) = self.pending.pop_front() {
                out.push(Output::Denial(landlock_denial(&a, None), None));
            }
        }
        out
    }
}

// ---------------------------------------------------------------------------------------------
// the kernel side

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
    let mut budget = super::RateBudget::new(last_check);
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

#[cfg(test)]
mod tests {
    use super::*;

    // Captured on the development host (kernel 6.18, audit enabled, no auditd): a process that
    // restricted itself with a ruleset handling fs.read_file read /etc/hostname, and called
    // keyctl under a filter returning SECCOMP_RET_ERRNO with SECCOMP_FILTER_FLAG_LOG.
    const LL_ACCESS: &str = r#"audit(1795408806.474:4): domain=16e40fc10 blockers=fs.read_file path="/etc/hostname" dev="vda" ino=611"#;
    const LL_DOMAIN: &str = r#"audit(1795408806.474:5): domain=16e40fc10 status=allocated mode=enforcing pid=16763 uid=0 exe="/root/.pyenv/versions/3.11.7/bin/python3.11" comm="python3""#;
    const SECCOMP: &str = r#"audit(1795408806.474:6): auid=4294967295 uid=0 gid=0 ses=4294967295 pid=16763 comm="python3" exe="/root/.pyenv/versions/3.11.7/bin/python3.11" sig=0 arch=c000003e syscall=250 compat=0 ip=0x7f86e32c2829 code=0x50000"#;
    const BPF: &str = "audit(1795408807.438:7): prog-id=5200 op=UNLOAD";

    struct Fake;
    impl Attribute for Fake {
        fn attribute(&self, pid: Option<u32>, uid: Option<u32>) -> Option<Attribution> {
            (pid == Some(16763) || uid == Some(62000)).then(|| Attribution {
                tenant: "t".into(),
                name: "a".into(),
                by: if pid == Some(16763) { "cgroup" } else { "uid" },
            })
        }
    }

    #[test]
    fn parses_captured_records() {
        let Some(Event::Seccomp(s)) = parse(AUDIT_SECCOMP, SECCOMP) else {
            panic!("seccomp record not parsed");
        };
        assert_eq!(s.stamp.serial, 6);
        assert_eq!(s.stamp.time_ms, 1_795_408_806_474);
        assert_eq!(
            (s.pid, s.uid, s.syscall, s.code),
            (16763, Some(0), 250, 0x50000)
        );
        assert_eq!(s.comm, "python3");
        assert_eq!(s.arch, AUDIT_ARCH_X86_64);
        let d = seccomp_denial(&s);
        assert_eq!(d.syscall, "keyctl");
        assert_eq!(
            (d.errno, d.errno_num, d.action),
            (Some("EPERM"), Some(1), "errno")
        );

        let Some(Event::LandlockAccess(a)) = parse(AUDIT_LANDLOCK_ACCESS, LL_ACCESS) else {
            panic!("landlock access not parsed");
        };
        assert_eq!(a.domain, 0x16e40fc10);
        assert_eq!(a.blockers, vec!["fs.read_file"]);
        let d = landlock_denial(&a, None);
        assert_eq!(d.path.as_deref(), Some("/etc/hostname"));
        assert_eq!((d.syscall.as_str(), d.errno), ("open", Some("EACCES")));

        let Some(Event::LandlockDomain(dm)) = parse(AUDIT_LANDLOCK_DOMAIN, LL_DOMAIN) else {
            panic!("landlock domain not parsed");
        };
        assert_eq!(
            (dm.domain, dm.pid, dm.uid),
            (0x16e40fc10, Some(16763), Some(0))
        );
        assert_eq!(dm.status, "allocated");
        assert_eq!(dm.comm.as_deref(), Some("python3"));

        assert_eq!(parse(1334, BPF), None);
        assert_eq!(parse(AUDIT_SECCOMP, "garbage"), None);
    }

    #[test]
    fn hex_encoded_and_network_fields() {
        // A comm with a space is logged as hex; a TCP connect denial names the destination.
        let rec = "audit(1.5:9): auid=1 uid=62000 gid=62000 ses=1 pid=7 comm=6D7920616770 exe=\"/usr/bin/x\" sig=0 arch=c000003e syscall=1073741825 compat=0 ip=0x1 code=0x50000";
        let Some(Event::Seccomp(s)) = parse(AUDIT_SECCOMP, rec) else {
            panic!()
        };
        assert_eq!(s.comm, "my agp");
        assert_eq!(s.stamp.time_ms, 1005);
        let d = seccomp_denial(&s);
        assert_eq!((d.syscall.as_str(), d.errno), ("x32:#1", Some("ENOSYS")));

        let net = "audit(1.0:10): domain=1a blockers=net.connect_tcp daddr=127.0.0.1 dest=9";
        let Some(Event::LandlockAccess(a)) = parse(AUDIT_LANDLOCK_ACCESS, net) else {
            panic!()
        };
        let d = landlock_denial(&a, None);
        assert_eq!(d.syscall, "connect");
        assert_eq!((d.addr.as_deref(), d.port), (Some("127.0.0.1"), Some(9)));
        let kill = "audit(1.0:11): domain=1a blockers=scope.signal opid=1 ocomm=\"init\"";
        let Some(Event::LandlockAccess(a)) = parse(AUDIT_LANDLOCK_ACCESS, kill) else {
            panic!()
        };
        assert_eq!(landlock_denial(&a, None).errno, Some("EPERM"));
    }

    #[test]
    fn landlock_access_waits_for_its_domain_then_is_attributed() {
        let mut c = Correlator::default();
        let t0 = Instant::now();
        let ev = |ty, s| parse(ty, s).unwrap();
        // The access record comes first, the domain record right after it.
        assert!(
            c.feed(ev(AUDIT_LANDLOCK_ACCESS, LL_ACCESS), t0, &Fake)
                .is_empty()
        );
        let out = c.feed(ev(AUDIT_LANDLOCK_DOMAIN, LL_DOMAIN), t0, &Fake);
        let [Output::Denial(d, Some(who))] = out.as_slice() else {
            panic!("{out:?}")
        };
        assert_eq!((who.name.as_str(), who.by), ("a", "cgroup"));
        assert_eq!(d.domain_pid, Some(16763));
        assert_eq!(d.path.as_deref(), Some("/etc/hostname"));
        // Later denials of the domain need no wait.
        let out = c.feed(ev(AUDIT_LANDLOCK_ACCESS, LL_ACCESS), t0, &Fake);
        assert_eq!(out.len(), 1);
        // Seccomp: attributed at once; a process that is no agent is counted, not written.
        assert_eq!(c.feed(ev(AUDIT_SECCOMP, SECCOMP), t0, &Fake).len(), 1);
        let other = SECCOMP.replace("pid=16763", "pid=1");
        assert!(c.feed(ev(AUDIT_SECCOMP, &other), t0, &Fake).is_empty());
        assert_eq!(c.foreign, 1);
        // A deallocated domain is forgotten; its next access waits, then goes out unattributed.
        let gone = "audit(2.0:12): domain=16e40fc10 status=deallocated denials=2";
        assert!(
            c.feed(ev(AUDIT_LANDLOCK_DOMAIN, gone), t0, &Fake)
                .is_empty()
        );
        assert!(
            c.feed(ev(AUDIT_LANDLOCK_ACCESS, LL_ACCESS), t0, &Fake)
                .is_empty()
        );
        assert!(c.expire(t0).is_empty());
        let out = c.expire(t0 + Correlator::WAIT);
        assert!(
            matches!(out.as_slice(), [Output::Denial(_, None)]),
            "{out:?}"
        );
        // A domain created by a process that is no agent: its denials are not ours.
        let foreign = LL_DOMAIN.replace("pid=16763", "pid=2");
        c.feed(ev(AUDIT_LANDLOCK_DOMAIN, &foreign), t0, &Fake);
        assert!(
            c.feed(ev(AUDIT_LANDLOCK_ACCESS, LL_ACCESS), t0, &Fake)
                .is_empty()
        );
    }

    #[test]
    fn netlink_messages_split() {
        let mut buf = Vec::new();
        for (ty, text) in [(AUDIT_SECCOMP, "abc"), (AUDIT_LANDLOCK_ACCESS, "defgh")] {
            let len = (NLMSG_HDRLEN + text.len()) as u32;
            buf.extend(len.to_ne_bytes());
            buf.extend(ty.to_ne_bytes());
            buf.extend([0u8; 10]);
            buf.extend(text.as_bytes());
            while buf.len() % 4 != 0 {
                buf.push(0);
            }
        }
        let m = messages(&buf);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0], (AUDIT_SECCOMP, &b"abc"[..]));
        assert_eq!(m[1], (AUDIT_LANDLOCK_ACCESS, &b"defgh"[..]));
    }

    #[test]
    fn detail_has_the_fields_the_trail_needs() {
        let Some(Event::Seccomp(s)) = parse(AUDIT_SECCOMP, SECCOMP) else {
            panic!()
        };
        let d = seccomp_denial(&s).detail();
        assert_eq!(d["mechanism"], "seccomp");
        assert_eq!(d["syscall"], "keyctl");
        assert_eq!(d["errno"], "EPERM");
        assert_eq!(d["pid"], 16763);
        assert_eq!(d["comm"], "python3");
        assert!(d.get("path").is_none());
    }
}
