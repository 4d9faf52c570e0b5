//! The seccomp deny-list, kept as reviewable data in `seccomp-policy.json` (seccompiler's JSON
//! format) and compiled in the daemon to classic BPF before the agent is cloned. The child only
//! installs the prepared programs.
//!
//! Two programs are installed: `agent` (listed syscalls fail with EPERM) and `agent_enosys`
//! (`clone3` fails with ENOSYS so that libc falls back to `clone`, whose flags a filter can
//! read). In front of both the daemon puts a check that refuses the x32 ABI (syscall numbers
//! with bit 30 set), which would otherwise name the same syscalls under other numbers;
//! seccompiler's own architecture check kills a process that makes i386 (`int 0x80`) calls.
//!
//! seccompiler emits one linear chain (≈ 290 instructions for this policy), and the kernel runs
//! the filter for every syscall number when it is installed to build its per-filter action cache,
//! which made the install cost ≈ 0.2 ms of each agent start. So the first program starts with a
//! prefilter: after the architecture and x32 checks, a binary search over the denied syscall
//! numbers (a run of consecutive ones checked as one) returns ALLOW for every other number in
//! about eight instructions, and the errno for a syscall denied whatever its arguments; only a
//! syscall whose rules check arguments (`clone`, `unshare`, `memfd_create`) falls through to
//! seccompiler's program, compiled from those rules alone.
//! A unit test runs both programs for every syscall number and argument case and requires the
//! same action.
//!
//! Why two programs and not one: the second program's rules could be folded into the first
//! one's prefilter (the search returns per-number errnos: `compile_single`, tests only), and
//! the unit tests show that one program decides every syscall number, architecture and argument
//! case exactly as the two do combined by the kernel's precedence. But the kernel's
//! `SECCOMP_FILTER_FLAG_LOG` is per filter (`seccomp_log` logs an `ERRNO` when the filter that
//! produced it asked for logging), so in one program the `ENOSYS` of `clone3`, which every
//! thread and `posix_spawn` of an agent meets before libc falls back to `clone`, would be an
//! audit record and a denial event each time. Measured (`install_cost` in tests.rs), the second
//! program costs ≈ 13-15 µs of the start (docs/benchmarks.md, 2026-11-26, fifth session).
//!
//! The socket rules depend on the contract, so the first program is per contract: its shape
//! ([`NetShape`]: whether the contract grants `net.connect`/`net.bind`) picks one of four
//! programs, compiled once per shape and cached. `socket()`/`socketpair()` and `listen()` go
//! from the prefilter's search to a short section generated here (not seccompiler: it needs
//! several errnos and 32-bit argument compares), which decides like [`socket_verdict`]:
//!
//! - `AF_UNIX`: always (the agent's MCP socket, pipes between its own processes).
//! - `AF_INET`/`AF_INET6`: only with a network grant, and then only `SOCK_STREAM` with
//!   protocol 0 or `IPPROTO_TCP` and `SOCK_DGRAM` with 0 or `IPPROTO_UDP` (the type compared
//!   without `SOCK_CLOEXEC`/`SOCK_NONBLOCK`). Raw sockets, MPTCP (262), SCTP (132), ICMP and
//!   ICMPv6 echo sockets, UDP-Lite, DCCP, `SOCK_SEQPACKET`… fail with `EPROTONOSUPPORT`.
//! - `AF_NETLINK`: only with a network grant and only `NETLINK_ROUTE` (glibc's
//!   `getaddrinfo(AI_ADDRCONFIG)` reads the interface addresses; unprivileged processes cannot
//!   change routes); other netlink protocols `EPROTONOSUPPORT`. Without a grant,
//!   `getaddrinfo` works without it (glibc falls back).
//! - every other family (`AF_PACKET`, `AF_VSOCK`, `AF_BLUETOOTH`, `AF_XDP`, `AF_ALG`, `AF_KEY`,
//!   `AF_TIPC`, `AF_RDS`, …): `EAFNOSUPPORT`.
//! - `listen()`: `EPERM` unless the contract grants `net.bind`, for every family, `AF_UNIX`
//!   included (an agent serves nobody; its MCP socket is a client connection).
//!
//! The kernel reads these arguments as `int`, so only their low 32 bits are compared.

mod names;
mod prefilter;

use seccompiler::TargetArch;

use crate::sys::seccomp::{SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO};

pub use names::syscall_name;
use names::syscall_nr;
use prefilter::{prefilter, split_rules};

/// The policy text, as reviewed.
pub const POLICY_JSON: &str = include_str!("../seccomp-policy.json");

/// The filters installed, in order.
pub const FILTERS: [&str; 2] = ["agent", "agent_enosys"];

#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("compile seccomp policy: {0}")]
    Compile(String),
    #[error("seccomp policy has no filter {0:?}")]
    Missing(&'static str),
}

const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// What the socket rules of an agent's filter depend on (see the module docs). Compiled
/// programs are cached per shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct NetShape {
    /// `AF_INET`/`AF_INET6` (TCP and UDP only) and `AF_NETLINK` (`NETLINK_ROUTE` only): the
    /// contract grants `net.connect` or `net.bind`.
    pub inet: bool,
    /// `listen()`: the contract grants `net.bind`.
    pub listen: bool,
    /// Leave out the family check (only the escape suite's mutation check sets this).
    pub any_family: bool,
    /// Leave out the inet type/protocol check (mutation check only).
    pub any_inet_protocol: bool,
}

impl NetShape {
    /// The shape for a contract's network grants.
    pub fn for_grants(connect: bool, bind: bool) -> NetShape {
        NetShape {
            inet: connect || bind,
            listen: bind,
            ..NetShape::default()
        }
    }
}

/// Errno of a socket family the shape does not allow.
pub const ERRNO_FAMILY: u32 = libc::EAFNOSUPPORT as u32;
/// Errno of a socket type or protocol the shape does not allow.
pub const ERRNO_PROTOCOL: u32 = libc::EPROTONOSUPPORT as u32;
/// Errno of `listen()` without `net.bind`.
pub const ERRNO_LISTEN: u32 = libc::EPERM as u32;

const AF_NETLINK: u32 = 16;
const NETLINK_ROUTE: u32 = 0;
const SOCK_TYPE_MASK: u32 = 0xf;

/// The socket rules as a pure function of the syscall and its (low 32-bit) arguments: the
/// seccomp action (`SECCOMP_RET_ALLOW` or `SECCOMP_RET_ERRNO | errno`). `None` for a syscall
/// the socket rules do not decide. The generated BPF is tested against this.
pub fn socket_verdict(shape: NetShape, nr: u32, args: [u32; 3]) -> Option<u32> {
    let deny = |e: u32| Some(SECCOMP_RET_ERRNO | e);
    let allow = Some(SECCOMP_RET_ALLOW);
    let (family, ty, proto) = (args[0], args[1] & SOCK_TYPE_MASK, args[2]);
    if nr == libc::SYS_listen as u32 {
        return if shape.listen {
            allow
        } else {
            deny(ERRNO_LISTEN)
        };
    }
    if nr != libc::SYS_socket as u32 && nr != libc::SYS_socketpair as u32 {
        return None;
    }
    let inet = family == libc::AF_INET as u32 || family == libc::AF_INET6 as u32;
    if family == libc::AF_UNIX as u32 {
        return allow;
    }
    if !shape.any_family {
        if !shape.inet {
            return deny(ERRNO_FAMILY);
        }
        if family == AF_NETLINK {
            return if proto == NETLINK_ROUTE {
                allow
            } else {
                deny(ERRNO_PROTOCOL)
            };
        }
        if !inet {
            return deny(ERRNO_FAMILY);
        }
    }
    if !inet || shape.any_inet_protocol {
        return allow;
    }
    let ok = match ty {
        t if t == libc::SOCK_STREAM as u32 => proto == 0 || proto == libc::IPPROTO_TCP as u32,
        t if t == libc::SOCK_DGRAM as u32 => proto == 0 || proto == libc::IPPROTO_UDP as u32,
        _ => false,
    };
    if ok { allow } else { deny(ERRNO_PROTOCOL) }
}

/// Compile the policy for x86-64 into BPF programs ready for `seccomp(SECCOMP_SET_MODE_FILTER)`,
/// with the socket rules of `shape`.
pub fn compile(shape: NetShape) -> Result<Vec<Vec<libc::sock_filter>>, SeccompError> {
    compile_policy(POLICY_JSON, shape)
}

/// [`compile`] for a tool process or anything not tied to one contract: inet sockets (TCP and
/// UDP) and `listen()` allowed, the rest of the socket rules kept. Tools' network reach is the
/// tool runner's business (their manifests); agents get [`compiled_for`] their contract.
pub fn compiled() -> Result<Vec<Vec<libc::sock_filter>>, SeccompError> {
    compiled_for(NetShape::for_grants(true, true))
}

/// [`compile`], done once per shape and process: the policy is a constant, so every agent gets
/// a copy of the programs of its contract's shape instead of parsing and compiling the JSON on
/// each start.
pub fn compiled_for(shape: NetShape) -> Result<Vec<Vec<libc::sock_filter>>, SeccompError> {
    type Cache = std::collections::HashMap<NetShape, Result<Vec<Vec<Filter>>, String>>;
    static PROGS: std::sync::Mutex<Option<Cache>> = std::sync::Mutex::new(None);
    let mut cache = PROGS.lock().unwrap_or_else(|p| p.into_inner());
    let progs = cache
        .get_or_insert_with(Default::default)
        .entry(shape)
        .or_insert_with(|| {
            compile(shape)
                .map(|v| {
                    v.into_iter()
                        .map(|p| p.into_iter().map(Filter::from).collect())
                        .collect()
                })
                .map_err(|e| e.to_string())
        });
    match progs {
        Ok(v) => Ok(v
            .iter()
            .map(|p| p.iter().map(|f| f.to_sock_filter()).collect())
            .collect()),
        Err(e) => Err(SeccompError::Compile(e.clone())),
    }
}

/// seccompiler's instruction as the kernel takes it.
fn to_libc(f: seccompiler::sock_filter) -> libc::sock_filter {
    libc::sock_filter {
        code: f.code,
        jt: f.jt,
        jf: f.jf,
        k: f.k,
    }
}

/// `sock_filter` is not `Sync` in libc's eyes (it is plain data); this copy is.
#[derive(Clone, Copy)]
struct Filter {
    code: u16,
    jt: u8,
    jf: u8,
    k: u32,
}

impl From<libc::sock_filter> for Filter {
    fn from(f: libc::sock_filter) -> Self {
        Filter {
            code: f.code,
            jt: f.jt,
            jf: f.jf,
            k: f.k,
        }
    }
}

impl Filter {
    fn to_sock_filter(self) -> libc::sock_filter {
        libc::sock_filter {
            code: self.code,
            jt: self.jt,
            jf: self.jf,
            k: self.k,
        }
    }
}

/// The policy with every rule for the syscalls in `remove` taken out: what the escape suite's
/// mutation check installs to show that the matching attempt then succeeds. The socket rules
/// are those of [`compiled`] (the least strict a contract gets). The daemon never calls this.
pub fn compile_without(remove: &[&str]) -> Result<Vec<Vec<libc::sock_filter>>, SeccompError> {
    let mut v: serde_json::Value =
        serde_json::from_str(POLICY_JSON).map_err(|e| SeccompError::Compile(e.to_string()))?;
    for f in FILTERS {
        if let Some(rules) = v[f]["filter"].as_array_mut() {
            rules.retain(|r| !remove.iter().any(|s| r["syscall"] == *s));
        }
    }
    compile_policy(&v.to_string(), NetShape::for_grants(true, true))
}

fn compile_policy(
    json: &str,
    shape: NetShape,
) -> Result<Vec<Vec<libc::sock_filter>>, SeccompError> {
    let split = split_rules(json, FILTERS[0])?;
    let arch = TargetArch::x86_64;
    let mut map = seccompiler::compile_from_json(split.rest.as_bytes(), arch)
        .map_err(|e| SeccompError::Compile(e.to_string()))?;
    let mut out = Vec::new();
    for (i, name) in FILTERS.iter().enumerate() {
        let prog = map.remove(*name).ok_or(SeccompError::Missing(name))?;
        let mut v: Vec<libc::sock_filter> = Vec::with_capacity(prog.len() + 160);
        if i == 0 {
            v.extend(prefilter(
                &split.always,
                &split.conditional,
                split.errno,
                &[],
                shape,
            )?);
        }
        v.extend(prog.into_iter().map(to_libc));
        out.push(v);
    }
    Ok(out)
}

/// The whole policy as one program: the rules of the filters after the first folded into the
/// first one's prefilter (per-number errnos). Action for action the same as the programs of
/// [`compile`] installed in order (tests.rs checks it for every number and argument case), but
/// not what the daemon installs: the first program is installed with `SECCOMP_FILTER_FLAG_LOG`
/// and the kernel's log flag is per filter, so in one program the `ENOSYS` of `clone3` (every
/// thread an agent starts) would be logged as a denial too. Kept to measure what a second
/// program costs (`install_cost`, tests.rs).
#[cfg(test)]
pub(crate) fn compile_single(shape: NetShape) -> Result<Vec<libc::sock_filter>, SeccompError> {
    let split = split_rules(POLICY_JSON, FILTERS[0])?;
    let quiet = prefilter::quiet_rules(POLICY_JSON, &FILTERS[1..])?;
    let mut map = seccompiler::compile_from_json(split.rest.as_bytes(), TargetArch::x86_64)
        .map_err(|e| SeccompError::Compile(e.to_string()))?;
    let prog = map
        .remove(FILTERS[0])
        .ok_or(SeccompError::Missing(FILTERS[0]))?;
    let mut v = prefilter(
        &split.always,
        &split.conditional,
        split.errno,
        &quiet,
        shape,
    )?;
    v.extend(prog.into_iter().map(to_libc));
    Ok(v)
}

/// The syscall names the policy has rules for (the policy test checks the dangerous ones are
/// all there).
pub fn denied_syscalls() -> Vec<String> {
    let v: serde_json::Value = serde_json::from_str(POLICY_JSON).unwrap_or_default();
    let mut out = Vec::new();
    for f in FILTERS {
        if let Some(rules) = v[f]["filter"].as_array() {
            for r in rules {
                if let Some(s) = r["syscall"].as_str() {
                    out.push(s.to_string());
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
