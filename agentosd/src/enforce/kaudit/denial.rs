//! The denial each record stands for, as it goes into the audit trail (pure).

use serde_json::{Value, json};

use super::record::{LandlockAccess, LandlockDomain, SeccompRecord, Stamp};
use super::{AUDIT_ARCH_X86_64, X32_SYSCALL_BIT};

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
        // ABI 9: connect (stream) or sendto (datagram) to a host's pathname Unix socket.
        "fs.resolve_unix" => ("connect", "EACCES"),
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
