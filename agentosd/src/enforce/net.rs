//! Network destinations per agent, enforced by cgroup BPF (`ebpf/net.bpf.c`).
//!
//! The programs are attached to `ROOT/agents` only, so they see nothing but agents. Each agent's
//! cgroup id maps to its granted destinations and local addresses (from the contract's
//! `net.connect` and `net.bind` scopes, host names resolved when the agent starts). A destination
//! or bind address not granted, an IPv4/IPv6 socket of an agent without a network grant or of
//! another kind than TCP/UDP, or a process under `agents/` without a policy entry, is refused
//! with EPERM and reported through the ring buffer. Dropped reports are counted in the `stats`
//! map and surfaced, never silent.
//!
//! Enforcement outlives the daemon ([`Pins`]): the links and maps are pinned in a bpffs
//! directory, so a daemon killed with SIGKILL leaves the programs attached with their policies.
//! The next daemon loads its programs onto the same pinned maps, attaches and pins them under a
//! new generation, and only then removes the old generation's pins: at every moment at least one
//! complete set is attached.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::AsFd as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use aya::maps::{Array, HashMap, MapData, RingBuf};
use aya::programs::{CgroupAttachMode, CgroupSkb, CgroupSkbAttachType, CgroupSock, CgroupSockAddr};
use serde::Serialize;

/// The embedded object (empty when clang was missing at build time).
static NET_OBJ: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/net.bpf.o"));

/// The cgroup sock_addr program names in `ebpf/net.bpf.c`.
pub const PROGRAMS: [&str; 6] = [
    "agentos_connect4",
    "agentos_connect6",
    "agentos_sendmsg4",
    "agentos_sendmsg6",
    "agentos_bind4",
    "agentos_bind6",
];

/// The `cgroup/sock_create` program (family, type and protocol of every inet socket).
pub const SOCK_PROGRAM: &str = "agentos_sock_create";

/// The `cgroup_skb/ingress` program (datagrams to agents' UDP sockets from ungranted senders).
pub const SKB_PROGRAM: &str = "agentos_ingress";

/// Hooks for logs and `agentosd check`.
pub const HOOKS: &str =
    "cgroup/connect4, connect6, sendmsg4, sendmsg6, bind4, bind6, sock_create, cgroup_skb/ingress";

/// The BPF LSM program (defence in depth; loads only where the kernel allows BPF LSM).
pub const LSM_PROGRAM: &str = "agentos_lsm_connect";

/// `AGENTOS_MAX_RULES` in `ebpf/intf.h`.
pub const MAX_RULES: usize = 32;
const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;
const ALLOW_ALL: u32 = 1;
const ALLOW_ALL_BIND: u32 = 2;
const INET: u32 = 4;
const RULE_CONNECT: u32 = 0;
const RULE_BIND: u32 = 1;
const STAT_ALLOWED: u32 = 0;
const STAT_DENIED: u32 = 1;
const STAT_DROPPED: u32 = 2;

/// `struct agentos_net_rule`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RawRule {
    pub addr: [u32; 4],
    pub mask: [u32; 4],
    pub family: u16,
    pub port: u16,
    /// `AGENTOS_NET_RULE_*`.
    pub kind: u32,
}

/// `struct agentos_net_policy`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawPolicy {
    pub n_rules: u32,
    pub flags: u32,
    pub rules: [RawRule; MAX_RULES],
}

/// `struct agentos_net_event`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct RawEvent {
    pub cgroup_id: u64,
    pub time_ns: u64,
    pub pid: u32,
    pub tid: u32,
    pub addr: [u32; 4],
    pub family: u16,
    pub port: u16,
    pub protocol: u32,
    pub hook: u8,
    pub reason: u8,
    pub _pad: [u8; 6],
    pub comm: [u8; 16],
}

// SAFETY: plain `#[repr(C)]` integers and arrays of them with explicit padding fields, no
// pointers: any bit pattern is valid and the layout matches `ebpf/intf.h` (sizes tested below).
unsafe impl aya::Pod for RawPolicy {}

/// What a rule grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RuleKind {
    /// `net.connect`: connect(), sendto()/sendmsg() to the address.
    #[default]
    Connect,
    /// `net.bind`: bind() to the local address.
    Bind,
}

/// One granted destination (or local address): an address prefix (or any address) and a port
/// (or any).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    /// `None`: any address of `family`.
    pub net: Option<(IpAddr, u8)>,
    pub family: u16,
    /// 0 = any port.
    pub port: u16,
    pub kind: RuleKind,
}

impl Rule {
    fn raw(&self) -> RawRule {
        let mut r = RawRule {
            family: self.family,
            port: self.port,
            kind: match self.kind {
                RuleKind::Connect => RULE_CONNECT,
                RuleKind::Bind => RULE_BIND,
            },
            ..RawRule::default()
        };
        let (bytes, prefix): (Vec<u8>, u8) = match self.net {
            None => (Vec::new(), 0),
            Some((IpAddr::V4(a), p)) => (a.octets().to_vec(), p.min(32)),
            Some((IpAddr::V6(a), p)) => (a.octets().to_vec(), p.min(128)),
        };
        let mut addr = [0u8; 16];
        let mut mask = [0u8; 16];
        for (i, b) in bytes.iter().enumerate() {
            let bits = (prefix as usize).saturating_sub(i * 8).min(8) as u32;
            let m = if bits == 0 { 0 } else { 0xffu8 << (8 - bits) };
            mask[i] = m;
            addr[i] = b & m;
        }
        for w in 0..4 {
            let chunk = |a: &[u8; 16]| {
                u32::from_ne_bytes([a[w * 4], a[w * 4 + 1], a[w * 4 + 2], a[w * 4 + 3]])
            };
            r.addr[w] = chunk(&addr);
            r.mask[w] = chunk(&mask);
        }
        r
    }
}

/// An agent's network policy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    /// Every destination (`net.connect: ["*:*"]`).
    pub allow_all: bool,
    /// Every local address (`net.bind: ["*:*"]`).
    pub allow_all_bind: bool,
    /// IPv4/IPv6 (TCP and UDP) sockets at all: the contract has a network grant.
    pub inet: bool,
    pub rules: Vec<Rule>,
    /// What the operator should know (names that did not resolve…).
    pub notes: Vec<String>,
}

impl Policy {
    pub fn raw(&self) -> RawPolicy {
        let mut p = RawPolicy {
            n_rules: self.rules.len().min(MAX_RULES) as u32,
            flags: if self.allow_all { ALLOW_ALL } else { 0 }
                | if self.allow_all_bind {
                    ALLOW_ALL_BIND
                } else {
                    0
                }
                | if self.inet { INET } else { 0 },
            rules: [RawRule::default(); MAX_RULES],
        };
        for (slot, r) in p.rules.iter_mut().zip(&self.rules) {
            *slot = r.raw();
        }
        p
    }

    /// One line for `agentctl status`.
    pub fn describe(&self) -> String {
        let bind = self.describe_kind(RuleKind::Bind);
        let connect = self.describe_kind(RuleKind::Connect);
        if !self.inet {
            return "no network grant: no IPv4/IPv6 socket, every connect/sendto/bind is refused"
                .into();
        }
        match bind {
            Some(b) => format!(
                "{}; bind {b}",
                connect.unwrap_or_else(|| "no destination".into())
            ),
            None => connect.unwrap_or_else(|| {
                "no destination granted: every connect/sendto to IPv4/IPv6 is refused".into()
            }),
        }
    }

    fn describe_kind(&self, kind: RuleKind) -> Option<String> {
        if kind == RuleKind::Connect && self.allow_all {
            return Some("any destination (net.connect *:*)".into());
        }
        if kind == RuleKind::Bind && self.allow_all_bind {
            return Some("any address (net.bind *:*)".into());
        }
        let mut v: Vec<String> = self
            .rules
            .iter()
            .filter(|r| r.kind == kind)
            .map(|r| {
                let host = match r.net {
                    None if r.family == AF_INET => "0.0.0.0/0".to_string(),
                    None => "::/0".to_string(),
                    Some((IpAddr::V4(a), 32)) => a.to_string(),
                    Some((IpAddr::V6(a), 128)) => format!("[{a}]"),
                    Some((a, p)) => format!("{a}/{p}"),
                };
                let port = if r.port == 0 {
                    "*".to_string()
                } else {
                    r.port.to_string()
                };
                format!("{host}:{port}")
            })
            .collect();
        v.dedup();
        (!v.is_empty()).then(|| v.join(", "))
    }
}

/// Why a scope cannot be turned into rules.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error(
        "net.connect scope {0:?}: expected HOST:PORT (HOST a name, an address, ADDR/PREFIX, [IPv6] or *; PORT a number or *)"
    )]
    Scope(String),
    #[error(
        "net.connect grants {0} destinations after name resolution; at most {MAX_RULES} are supported"
    )]
    TooMany(usize),
}

/// Parse one `HOST:PORT` scope into (host, port); port 0 = any.
fn split_scope(scope: &str) -> Result<(&str, u16), PolicyError> {
    let bad = || PolicyError::Scope(scope.to_string());
    let (host, port) = scope.rsplit_once(':').ok_or_else(bad)?;
    let port = match port {
        "*" => 0,
        p => p.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(bad)?,
    };
    let host = host
        .strip_prefix('[')
        .map(|h| h.strip_suffix(']').unwrap_or(h))
        .unwrap_or(host);
    if host.is_empty() {
        return Err(bad());
    }
    Ok((host, port))
}

/// The policy of `net.connect` scopes alone. `resolve` turns a host name into addresses (DNS
/// in the daemon; a fake in tests). A name that does not resolve grants nothing and is noted.
pub fn policy_from_scopes(
    scopes: &[String],
    resolve: &dyn Fn(&str) -> Result<Vec<IpAddr>, String>,
) -> Result<Policy, PolicyError> {
    policy_from_grants(scopes, &[], resolve)
}

/// The policy of a contract's `net.connect` and `net.bind` scopes (see [`policy_from_scopes`]).
/// Any grant at all lets the agent create TCP and UDP sockets.
pub fn policy_from_grants(
    connect: &[String],
    bind: &[String],
    resolve: &dyn Fn(&str) -> Result<Vec<IpAddr>, String>,
) -> Result<Policy, PolicyError> {
    let mut p = Policy {
        inet: !connect.is_empty() || !bind.is_empty(),
        ..Policy::default()
    };
    add_rules(&mut p, connect, RuleKind::Connect, resolve)?;
    add_rules(&mut p, bind, RuleKind::Bind, resolve)?;
    p.rules.dedup();
    if p.rules.len() > MAX_RULES && !(p.allow_all && p.allow_all_bind) {
        return Err(PolicyError::TooMany(p.rules.len()));
    }
    p.rules.truncate(MAX_RULES);
    Ok(p)
}

fn add_rules(
    p: &mut Policy,
    scopes: &[String],
    kind: RuleKind,
    resolve: &dyn Fn(&str) -> Result<Vec<IpAddr>, String>,
) -> Result<(), PolicyError> {
    let cap = match kind {
        RuleKind::Connect => "net.connect",
        RuleKind::Bind => "net.bind",
    };
    for s in scopes {
        let (host, port) = split_scope(s)?;
        if host == "*" {
            if port == 0 {
                match kind {
                    RuleKind::Connect => p.allow_all = true,
                    RuleKind::Bind => p.allow_all_bind = true,
                }
            }
            for family in [AF_INET, AF_INET6] {
                p.rules.push(Rule {
                    net: None,
                    family,
                    port,
                    kind,
                });
            }
            continue;
        }
        if let Some((a, len)) = host.split_once('/') {
            let addr: IpAddr = a.parse().map_err(|_| PolicyError::Scope(s.clone()))?;
            let max = if addr.is_ipv4() { 32 } else { 128 };
            let len: u8 = len
                .parse()
                .ok()
                .filter(|l| *l <= max)
                .ok_or_else(|| PolicyError::Scope(s.clone()))?;
            p.rules.push(rule_for(addr, len, port, kind));
            continue;
        }
        let addrs = match host.parse::<IpAddr>() {
            Ok(a) => vec![a],
            Err(_) => match resolve(host) {
                Ok(v) if !v.is_empty() => v,
                Ok(_) => {
                    p.notes
                        .push(format!("{cap} {s}: {host} has no address; nothing granted"));
                    continue;
                }
                Err(e) => {
                    p.notes.push(format!(
                        "{cap} {s}: cannot resolve {host} ({e}); nothing granted"
                    ));
                    continue;
                }
            },
        };
        for a in addrs {
            let len = if a.is_ipv4() { 32 } else { 128 };
            p.rules.push(rule_for(a, len, port, kind));
        }
    }
    Ok(())
}

fn rule_for(addr: IpAddr, len: u8, port: u16, kind: RuleKind) -> Rule {
    // The programs check an IPv4-mapped IPv6 destination (`::ffff:a.b.c.d`) as the IPv4 address
    // it reaches, so a grant written that way is an IPv4 grant.
    let (addr, len) = match addr {
        IpAddr::V6(a) if len >= 96 => match a.to_ipv4_mapped() {
            Some(v4) => (IpAddr::V4(v4), len - 96),
            None => (addr, len),
        },
        _ => (addr, len),
    };
    Rule {
        family: if addr.is_ipv4() { AF_INET } else { AF_INET6 },
        net: Some((addr, len)),
        port,
        kind,
    }
}

/// Resolve a host name with the system resolver (blocking: call off the runtime).
pub fn system_resolve(host: &str) -> Result<Vec<IpAddr>, String> {
    use std::net::ToSocketAddrs as _;
    (host, 0u16)
        .to_socket_addrs()
        .map(|it| {
            let mut v: Vec<IpAddr> = it.map(|a| a.ip()).collect();
            v.sort();
            v.dedup();
            v
        })
        .map_err(|e| e.to_string())
}

/// `AGENTOS_HOOK_INGRESS`.
const INGRESS: u8 = 12;

/// One denial, decoded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Denial {
    pub cgroup_id: u64,
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    /// `connect`, `sendmsg`, `bind` or `socket`; for a packet dropped on its way in
    /// (`cgroup_skb/ingress`: `addr` and `port` are its sender, and no call failed) `recvmsg`
    /// (a datagram) or `accept` (a SYN to a listener on a port nobody granted).
    pub syscall: &'static str,
    /// `cgroup/connect4`, …
    pub hook: &'static str,
    pub family: &'static str,
    pub protocol: String,
    pub addr: IpAddr,
    pub port: u16,
    /// `not-granted`, `no-policy` or `socket-type`.
    pub reason: &'static str,
}

impl Denial {
    /// The errno the agent's call got (`EPERM`), or `None` for a dropped datagram (no call
    /// failed: the agent never sees it).
    pub fn errno(&self) -> Option<i32> {
        (self.hook != "cgroup_skb/ingress").then_some(libc::EPERM)
    }
}

impl Denial {
    pub fn decode(bytes: &[u8]) -> Option<Denial> {
        if bytes.len() < std::mem::size_of::<RawEvent>() {
            return None;
        }
        // SAFETY: the buffer holds at least size_of::<RawEvent>() bytes and RawEvent is a
        // plain-old-data #[repr(C)] struct valid for any bit pattern; read_unaligned copes with
        // the ring buffer's 8-byte alignment not being guaranteed to the slice.
        let e: RawEvent = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
        let v6 = e.family == AF_INET6;
        let mut b = [0u8; 16];
        for w in 0..4 {
            b[w * 4..w * 4 + 4].copy_from_slice(&e.addr[w].to_ne_bytes());
        }
        let addr = if v6 {
            IpAddr::V6(Ipv6Addr::from(b))
        } else {
            IpAddr::V4(Ipv4Addr::new(b[0], b[1], b[2], b[3]))
        };
        let (syscall, hook) = match e.hook {
            0 => ("connect", "cgroup/connect4"),
            1 => ("connect", "cgroup/connect6"),
            2 => ("sendmsg", "cgroup/sendmsg4"),
            3 => ("sendmsg", "cgroup/sendmsg6"),
            7 => ("bind", "cgroup/bind4"),
            8 => ("bind", "cgroup/bind6"),
            9 => ("socket", "cgroup/sock_create"),
            // What the agent would have done with it: a datagram read, a connection accepted.
            INGRESS if e.protocol == 6 => ("accept", "cgroup_skb/ingress"),
            INGRESS => ("recvmsg", "cgroup_skb/ingress"),
            _ => ("connect", "lsm/socket_connect"),
        };
        let protocol = if e.hook == 9 {
            // (type << 16) | protocol
            let ty = match e.protocol >> 16 {
                1 => "stream".to_string(),
                2 => "dgram".to_string(),
                3 => "raw".to_string(),
                5 => "seqpacket".to_string(),
                t => format!("type {t}"),
            };
            format!("{ty}/{}", e.protocol & 0xffff)
        } else {
            match e.protocol {
                6 => "tcp".into(),
                17 => "udp".into(),
                0 => "".into(),
                n => n.to_string(),
            }
        };
        let end = e.comm.iter().position(|c| *c == 0).unwrap_or(e.comm.len());
        Some(Denial {
            cgroup_id: e.cgroup_id,
            pid: e.pid,
            tid: e.tid,
            comm: String::from_utf8_lossy(&e.comm[..end]).into_owned(),
            syscall,
            hook,
            family: if v6 { "inet6" } else { "inet" },
            protocol,
            addr,
            port: e.port,
            reason: match e.reason {
                1 => "no-policy",
                2 => "socket-type",
                _ => "not-granted",
            },
        })
    }
}

/// Program `name` of `bpf` as its type `P` (`missing`: what to say when it is not there).
fn program<'a, P>(bpf: &'a mut aya::Ebpf, name: &str, missing: &str) -> Result<&'a mut P, NetError>
where
    &'a mut P: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    let err = |error: String| NetError::Program {
        program: name.into(),
        error,
    };
    bpf.program_mut(name)
        .ok_or_else(|| err(missing.into()))?
        .try_into()
        .map_err(|e: aya::programs::ProgramError| err(e.to_string()))
}

/// The error of loading program `name` into the kernel (the verifier's words included).
fn load_err(name: &str) -> impl FnOnce(aya::programs::ProgramError) -> NetError + '_ {
    move |e| NetError::Program {
        program: name.into(),
        error: format!("{e}{}", super::source_chain(&e)),
    }
}

/// A cgroup program's link as a bpf_link fd, which can be pinned.
fn fd_link<L>(name: &str, link: L) -> Result<aya::programs::links::FdLink, NetError>
where
    aya::programs::links::FdLink: TryFrom<L>,
    <aya::programs::links::FdLink as TryFrom<L>>::Error: std::error::Error,
{
    aya::programs::links::FdLink::try_from(link).map_err(|e| NetError::Program {
        program: name.into(),
        error: format!("link (kernel without bpf_link?): {e}"),
    })
}

/// Errors of loading and using the programs.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error(
        "the BPF programs were not built (clang or libbpf-dev missing when agentosd was compiled)"
    )]
    NotBuilt,
    #[error("loading ebpf/net.bpf.o: {0}")]
    Load(String),
    #[error("BPF program {program}: {error}")]
    Program { program: String, error: String },
    #[error("BPF map {map}: {error}")]
    Map { map: &'static str, error: String },
    #[error("opening cgroup {path}: {error}")]
    Cgroup { path: String, error: std::io::Error },
    #[error("bpffs pin directory {path}: {error} (pass --bpf-pin-dir DIR on a bpffs, or \"none\")")]
    Pin { path: String, error: String },
}

/// Counters from the `stats` map.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Stats {
    pub allowed: u64,
    pub denied: u64,
    /// Denials not reported as events because the ring buffer was full.
    pub events_dropped: u64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

struct Maps {
    policy: HashMap<MapData, u64, RawPolicy>,
    stats: Array<MapData, u64>,
}

/// The default root of the bpffs pins (`agentosd --bpf-pin-dir`).
pub const DEFAULT_PIN_ROOT: &str = "/sys/fs/bpf/agentos";
/// Version of the pinned maps' layout (`ebpf/intf.h`): a daemon with another layout uses its
/// own maps and removes the old ones once its links are pinned.
const MAPS_LAYOUT: &str = "maps-v2";
/// Maps kept across daemons (the ring buffer too: denials while the daemon was down are read by
/// the next one).
const PINNED_MAPS: [&str; 3] = ["net_policy", "stats", "events"];

/// The bpffs directory that holds one daemon's pins: `ROOT/net-CGID` where CGID is the id of the
/// `agents` cgroup the programs are attached to (so daemons on other cgroup roots never share
/// pins), with `maps-v2/` (the maps) and `links/PROGRAM-GENERATION` (the links).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pins {
    pub dir: PathBuf,
}

impl Pins {
    /// The pins of programs attached to `agents_cgroup` under bpffs `root`; mounts a bpffs
    /// instance at `root` when `root` is not on one (a new, empty instance: harmless), creating
    /// the directory when it is missing. Fails when `root` cannot be made a bpffs.
    pub fn prepare(root: &Path, agents_cgroup: &Path) -> Result<Pins, NetError> {
        let err = |error: String| NetError::Pin {
            path: root.display().to_string(),
            error,
        };
        if !root.exists() {
            std::fs::create_dir_all(root).map_err(|e| err(format!("create: {e}")))?;
        }
        if !is_bpffs(root) {
            nix::mount::mount(
                Some("bpf"),
                root,
                Some("bpf"),
                nix::mount::MsFlags::MS_NOSUID
                    | nix::mount::MsFlags::MS_NODEV
                    | nix::mount::MsFlags::MS_NOEXEC,
                Some("mode=0700"),
            )
            .map_err(|e| err(format!("not a bpffs, and mounting one there failed: {e}")))?;
            tracing::info!(
                "mounted a bpffs instance at {} for the BPF pins",
                root.display()
            );
        }
        let cgid = std::fs::metadata(agents_cgroup)
            .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
            .map_err(|e| err(format!("cgroup {}: {e}", agents_cgroup.display())))?;
        sweep_stale(root);
        let dir = root.join(format!("net-{cgid}"));
        let mut dirs = vec![dir.join(MAPS_LAYOUT), dir.join("links")];
        // Which cgroup these pins guard, for the sweep of a later daemon (bpffs holds no
        // regular files: the path is the name of an empty directory).
        if let Some(name) = escape_path(agents_cgroup) {
            dirs.push(dir.join("cgroup").join(name));
        }
        for d in dirs {
            std::fs::create_dir_all(&d).map_err(|e| err(format!("create {}: {e}", d.display())))?;
        }
        Ok(Pins { dir })
    }

    /// Remove these pins (their links detach): after programs of another layout were attached
    /// unpinned, so that the old programs, whose maps this daemon does not fill, stop refusing
    /// new agents for want of a policy entry.
    pub fn remove(&self) -> std::io::Result<()> {
        std::fs::remove_dir_all(&self.dir)
    }

    fn map(&self, name: &str) -> PathBuf {
        self.dir.join(MAPS_LAYOUT).join(name)
    }

    /// Pinned links now: (file name, program, generation).
    fn links(&self) -> Vec<(String, String, u64)> {
        let mut v: Vec<(String, String, u64)> = std::fs::read_dir(self.dir.join("links"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let n = e.file_name().to_string_lossy().into_owned();
                let (prog, generation) = parse_link_name(&n)?;
                Some((n.clone(), prog.to_string(), generation))
            })
            .collect();
        v.sort_by_key(|l| l.2);
        v
    }
}

/// A cgroup path as one bpffs name: `%`, `/` and `.` (bpffs refuses dots) escaped; `None` when
/// too long for a name.
fn escape_path(p: &Path) -> Option<String> {
    let s = p.to_string_lossy();
    let e = s
        .replace('%', "%25")
        .replace('/', "%2F")
        .replace('.', "%2E");
    (e.len() <= 255).then_some(e)
}

fn unescape_path(name: &str) -> PathBuf {
    PathBuf::from(
        name.replace("%2F", "/")
            .replace("%2E", ".")
            .replace("%25", "%"),
    )
}

/// Remove the pins of `agents` cgroups that are gone (a test's or an old cgroup root's): their
/// links would keep the dead cgroups' memory. A directory whose cgroup still exists with the
/// same id is left alone, whoever owns it.
fn sweep_stale(root: &Path) {
    let Ok(rd) = std::fs::read_dir(root) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(cgid) = name
            .strip_prefix("net-")
            .and_then(|c| c.parse::<u64>().ok())
        else {
            continue;
        };
        let Some(cg) = std::fs::read_dir(e.path().join("cgroup"))
            .ok()
            .and_then(|mut r| r.next())
            .and_then(|x| x.ok())
            .map(|x| unescape_path(&x.file_name().to_string_lossy()))
        else {
            continue;
        };
        let alive =
            std::fs::metadata(&cg).is_ok_and(|m| std::os::unix::fs::MetadataExt::ino(&m) == cgid);
        if !alive {
            match std::fs::remove_dir_all(e.path()) {
                Ok(()) => tracing::info!(
                    "removed the BPF pins {} of cgroup {} (gone)",
                    e.path().display(),
                    cg.display()
                ),
                Err(err) => tracing::warn!("removing stale BPF pins {}: {err}", e.path().display()),
            }
        }
    }
}

/// `PROGRAM-GENERATION` → (program, generation). (bpffs refuses names with a dot: EPERM.)
fn parse_link_name(name: &str) -> Option<(&str, u64)> {
    let (prog, g) = name.rsplit_once('-')?;
    Some((prog, g.parse().ok()?))
}

/// The generation the next daemon pins its links under: one past every pinned one.
fn next_generation(pinned: &[(String, String, u64)]) -> u64 {
    pinned.iter().map(|l| l.2 + 1).max().unwrap_or(1)
}

/// Whether `path` is on a bpffs (statfs magic).
pub fn is_bpffs(path: &Path) -> bool {
    nix::sys::statfs::statfs(path)
        .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::BPF_FS_MAGIC)
}

/// For `agentosd check`: whether the pins can outlive the daemon at `root`.
pub fn pin_check_line(root: &Path) -> String {
    if is_bpffs(root) {
        return format!(
            "bpffs pins: {} is a bpffs: the network programs and their maps outlive the daemon (kill -9 opens no window)",
            root.display()
        );
    }
    let parent = root.ancestors().skip(1).find(|p| p.exists());
    match parent {
        Some(p)
            if std::fs::metadata(p).is_ok_and(|m| !m.permissions().readonly()) && !is_sysfs(p) =>
        {
            format!(
                "bpffs pins: {} is not a bpffs; agentosd mounts a bpffs instance there at start",
                root.display()
            )
        }
        _ => format!(
            "bpffs pins: NOT available at {} (no bpffs mounted, and the directory cannot be made there); while agentosd restarts the network programs are detached (pass --bpf-pin-dir DIR)",
            root.display()
        ),
    }
}

fn is_sysfs(p: &Path) -> bool {
    nix::sys::statfs::statfs(p).is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::SYSFS_MAGIC)
}

/// The loaded programs, their maps and the agents they know.
pub struct NetEnforcer {
    bpf: Mutex<aya::Ebpf>,
    maps: Mutex<Maps>,
    events: Mutex<Option<RingBuf<MapData>>>,
    /// The agents with an entry in the policy map (and those cleared recently).
    agents: super::AgentCgroups,
    attached: Mutex<Option<String>>,
    /// The BPF LSM program: `Ok(true)` attached, `Ok(false)` loaded, `Err` why not.
    lsm: Mutex<Result<bool, String>>,
    /// Where the links and maps are pinned (`None`: they live as long as this value).
    pins: Option<Pins>,
    /// The links this daemon pinned (the pins keep them attached; the fds are only kept).
    pinned: Mutex<Vec<aya::programs::links::PinnedLink>>,
}

impl std::fmt::Debug for NetEnforcer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetEnforcer")
            .field("attached", &*lock(&self.attached))
            .field("pins", &self.pins)
            .finish()
    }
}

impl NetEnforcer {
    /// Load the programs into the kernel (not attached yet), with maps of their own.
    pub fn load() -> Result<Arc<NetEnforcer>, NetError> {
        Self::load_pinned(None)
    }

    /// Load the programs; with `pins`, onto the maps pinned there (those a previous daemon
    /// left, with its agents' policies), pinning new ones where there are none.
    pub fn load_pinned(pins: Option<Pins>) -> Result<Arc<NetEnforcer>, NetError> {
        if NET_OBJ.is_empty() {
            return Err(NetError::NotBuilt);
        }
        let mut loader = aya::EbpfLoader::new();
        let paths: Vec<(&str, PathBuf)> = pins
            .iter()
            .flat_map(|p| PINNED_MAPS.map(|m| (m, p.map(m))))
            .collect();
        for (name, path) in &paths {
            loader.map_pin_path(name, path.as_path());
        }
        let mut bpf = loader
            .load(NET_OBJ)
            .map_err(|e| NetError::Load(format!("{e}{}", super::source_chain(&e))))?;
        for name in PROGRAMS {
            program::<CgroupSockAddr>(&mut bpf, name, "not in the object")?
                .load()
                .map_err(load_err(name))?;
        }
        program::<CgroupSock>(&mut bpf, SOCK_PROGRAM, "not in the object")?
            .load()
            .map_err(load_err(SOCK_PROGRAM))?;
        program::<CgroupSkb>(&mut bpf, SKB_PROGRAM, "not in the object")?
            .load()
            .map_err(load_err(SKB_PROGRAM))?;
        let lsm = load_lsm(&mut bpf);
        let map_err = |map: &'static str| {
            move |e: aya::maps::MapError| NetError::Map {
                map,
                error: e.to_string(),
            }
        };
        let take = |bpf: &mut aya::Ebpf, map: &'static str| {
            bpf.take_map(map).ok_or(NetError::Map {
                map,
                error: "not in the object".into(),
            })
        };
        let policy =
            HashMap::try_from(take(&mut bpf, "net_policy")?).map_err(map_err("net_policy"))?;
        let stats = Array::try_from(take(&mut bpf, "stats")?).map_err(map_err("stats"))?;
        let events = RingBuf::try_from(take(&mut bpf, "events")?).map_err(map_err("events"))?;
        Ok(Arc::new(NetEnforcer {
            bpf: Mutex::new(bpf),
            maps: Mutex::new(Maps { policy, stats }),
            events: Mutex::new(Some(events)),
            agents: super::AgentCgroups::default(),
            attached: Mutex::new(None),
            lsm: Mutex::new(lsm),
            pins,
            pinned: Mutex::new(Vec::new()),
        }))
    }

    /// Where the links and maps are pinned, if they are.
    pub fn pins(&self) -> Option<&Pins> {
        self.pins.as_ref()
    }

    /// Attach the programs to `agents_cgroup` (the daemon's `ROOT/agents`; never a cgroup that
    /// holds anything but agents). Unpinned, they stay attached while this value lives. Pinned,
    /// the links are pinned under a new generation and only then are the previous daemons' pins
    /// removed (which detaches their links): the agents are never without a complete set.
    pub fn attach(&self, agents_cgroup: &Path) -> Result<(), NetError> {
        let dir = std::fs::File::open(agents_cgroup).map_err(|error| NetError::Cgroup {
            path: agents_cgroup.display().to_string(),
            error,
        })?;
        let old = self.pins.as_ref().map(Pins::links).unwrap_or_default();
        let generation = next_generation(&old);
        let mut bpf = lock(&self.bpf);
        let prog_err = |name: &str, what: &str, e: &dyn std::error::Error| NetError::Program {
            program: name.into(),
            error: format!("{what}: {e}{}", super::source_chain(e)),
        };
        let mut links: Vec<(String, aya::programs::links::FdLink)> = Vec::new();
        let pinned = self.pins.is_some();
        // A bpf_link (kernel >= 5.7) always attaches in multi mode and must be created with no
        // flags: `Single` is aya's "no flags" (AllowMultiple gives EINVAL here).
        let (cgroup, mode) = (dir.as_fd(), CgroupAttachMode::Single);
        let attach_err = |name: &str, e: &dyn std::error::Error| {
            prog_err(name, &format!("attach to {}", agents_cgroup.display()), e)
        };
        let mut keep = |name: &str, link: Result<aya::programs::links::FdLink, NetError>| {
            link.map(|fd| links.push((name.to_string(), fd)))
        };
        for name in PROGRAMS {
            let prog = program::<CgroupSockAddr>(&mut bpf, name, "not loaded")?;
            let id = prog
                .attach(cgroup, mode)
                .map_err(|e| attach_err(name, &e))?;
            if pinned {
                let link = prog
                    .take_link(id)
                    .map_err(|e| prog_err(name, "take link", &e))?;
                keep(name, fd_link(name, link))?;
            }
        }
        let sock = program::<CgroupSock>(&mut bpf, SOCK_PROGRAM, "not loaded")?;
        let id = sock
            .attach(cgroup, mode)
            .map_err(|e| attach_err(SOCK_PROGRAM, &e))?;
        if pinned {
            let link = sock
                .take_link(id)
                .map_err(|e| prog_err(SOCK_PROGRAM, "take link", &e))?;
            keep(SOCK_PROGRAM, fd_link(SOCK_PROGRAM, link))?;
        }
        let skb = program::<CgroupSkb>(&mut bpf, SKB_PROGRAM, "not loaded")?;
        let id = skb
            .attach(cgroup, CgroupSkbAttachType::Ingress, mode)
            .map_err(|e| attach_err(SKB_PROGRAM, &e))?;
        if pinned {
            let link = skb
                .take_link(id)
                .map_err(|e| prog_err(SKB_PROGRAM, "take link", &e))?;
            keep(SKB_PROGRAM, fd_link(SKB_PROGRAM, link))?;
        }
        *lock(&self.attached) = Some(agents_cgroup.display().to_string());
        let mut lsm = lock(&self.lsm);
        if matches!(*lsm, Ok(false)) {
            let r = bpf
                .program_mut(LSM_PROGRAM)
                .and_then(|p| <&mut aya::programs::Lsm>::try_from(p).ok())
                .ok_or_else(|| "not loaded".to_string())
                .and_then(|p| {
                    let id = p
                        .attach()
                        .map_err(|e| format!("attach: {e}{}", super::source_chain(&e)))?;
                    if self.pins.is_some() {
                        let link = p.take_link(id).map_err(|e| format!("take link: {e}"))?;
                        links.push((LSM_PROGRAM.to_string(), link.into()));
                    }
                    Ok(())
                });
            *lsm = r.map(|_| true);
        }
        drop(lsm);
        drop(bpf);
        if let Some(pins) = &self.pins {
            // New links first (all attached now), then the old pins go.
            let mut pinned = lock(&self.pinned);
            for (name, link) in links {
                let path = pins.dir.join("links").join(format!("{name}-{generation}"));
                let p = link.pin(&path).map_err(|e| NetError::Pin {
                    path: path.display().to_string(),
                    error: format!("{e}{}", super::source_chain(&e)),
                })?;
                pinned.push(p);
            }
            for (file, _, _) in &old {
                let path = pins.dir.join("links").join(file);
                if let Err(e) = std::fs::remove_file(&path) {
                    tracing::warn!(
                        "removing the previous daemon's link {}: {e}",
                        path.display()
                    );
                }
            }
            // Maps of another layout (an older agentosd): no link uses them any more.
            if let Ok(rd) = std::fs::read_dir(&pins.dir) {
                for e in rd.flatten() {
                    let n = e.file_name().to_string_lossy().into_owned();
                    if n.starts_with("maps-") && n != MAPS_LAYOUT {
                        let _ = std::fs::remove_dir_all(e.path());
                    }
                }
            }
            if !old.is_empty() {
                tracing::info!(
                    "took over the network programs pinned in {}: generation {generation} attached and pinned before {} pinned link(s) of the previous daemon were removed",
                    pins.dir.display(),
                    old.len()
                );
            }
        }
        Ok(())
    }

    /// Remove every pin (the links detach, the maps go with the last program): for a daemon
    /// that stops its agents on exit. Agents still running would be refused nothing by BPF.
    pub fn unpin(&self) {
        let Some(pins) = &self.pins else { return };
        lock(&self.pinned).clear();
        if let Err(e) = std::fs::remove_dir_all(&pins.dir) {
            tracing::warn!("removing the BPF pins {}: {e}", pins.dir.display());
        }
    }

    /// Forget the entries of cgroups that belong to no known agent (agents that ended while
    /// the daemon was down left them in the pinned map). Call after re-adoption.
    pub fn forget_unknown(&self) -> usize {
        let mut maps = lock(&self.maps);
        let keys: Vec<u64> = maps.policy.keys().flatten().collect();
        let mut n = 0;
        for k in keys {
            if self.agents.agent_of(k).is_none() && maps.policy.remove(&k).is_ok() {
                n += 1;
            }
        }
        n
    }

    /// The BPF LSM program's state: `Ok(())` attached, or why it is not.
    pub fn lsm_status(&self) -> Result<(), String> {
        match &*lock(&self.lsm) {
            Ok(true) => Ok(()),
            Ok(false) => Err("loaded, not attached".into()),
            Err(e) => Err(e.clone()),
        }
    }

    /// Where the programs are attached, if they are.
    pub fn attached_to(&self) -> Option<String> {
        lock(&self.attached).clone()
    }

    /// Install (or replace) agent `id`'s policy under its cgroup id.
    pub fn set_policy(
        &self,
        id: &str,
        tenant: &str,
        name: &str,
        cgroup_id: u64,
        policy: &Policy,
    ) -> Result<(), NetError> {
        let raw = policy.raw();
        let old = self.agents.cgroup_of(id);
        let mut maps = lock(&self.maps);
        if let Some(old) = old.filter(|o| *o != cgroup_id) {
            let _ = maps.policy.remove(&old);
        }
        maps.policy
            .insert(cgroup_id, raw, 0)
            .map_err(|e| NetError::Map {
                map: "net_policy",
                error: e.to_string(),
            })?;
        self.agents.insert(id, cgroup_id, tenant, name);
        Ok(())
    }

    /// Remove agent `id`'s entry (its cgroup is gone or going).
    pub fn clear(&self, id: &str) {
        if let Some(cg) = self.agents.remove(id) {
            let _ = lock(&self.maps).policy.remove(&cg);
        }
    }

    /// The agent (tenant, name) whose cgroup has this id.
    pub fn agent_of(&self, cgroup_id: u64) -> Option<(String, String)> {
        self.agents.agent_of(cgroup_id)
    }

    /// Entries in the policy map now.
    pub fn entries(&self) -> usize {
        lock(&self.maps).policy.keys().count()
    }

    pub fn stats(&self) -> Stats {
        let maps = lock(&self.maps);
        let get = |i: u32| maps.stats.get(&i, 0).unwrap_or(0);
        Stats {
            allowed: get(STAT_ALLOWED),
            denied: get(STAT_DENIED),
            events_dropped: get(STAT_DROPPED),
        }
    }

    /// The ring buffer of denials (once).
    pub fn take_events(&self) -> Option<RingBuf<MapData>> {
        lock(&self.events).take()
    }
}

/// Load `lsm/socket_connect`; on kernels that refuse BPF LSM (lockdown, `lsm=` without bpf)
/// this fails with the kernel's reason, which the daemon reports.
fn load_lsm(bpf: &mut aya::Ebpf) -> Result<bool, String> {
    let btf = aya::Btf::from_sys_fs().map_err(|e| format!("no kernel BTF: {e}"))?;
    let prog: &mut aya::programs::Lsm = bpf
        .program_mut(LSM_PROGRAM)
        .ok_or_else(|| "not in the object".to_string())?
        .try_into()
        .map_err(|e: aya::programs::ProgramError| e.to_string())?;
    prog.load("socket_connect", &btf).map_err(|e| {
        let chain = super::source_chain(&e);
        if chain.contains("Operation not permitted") || chain.contains("os error 1)") {
            "refused (EPERM): this kernel does not allow BPF LSM programs (lockdown, or lsm= lacks bpf)".to_string()
        } else {
            format!("{e}{chain}")
        }
    })?;
    Ok(false)
}

/// Read denials from `ring` as they come and hand each to `on_denial`, within the daemon's
/// budget for a ring ([`super::read_ring`]). Returns only when the fd cannot be polled.
pub async fn read_events(ring: RingBuf<MapData>, on_denial: impl FnMut(Denial)) {
    super::read_ring(ring, "network BPF", Denial::decode, on_denial).await
}

/// Try to load (not attach) the programs: for `agentosd check`.
pub fn probe_load() -> Result<(), NetError> {
    NetEnforcer::load().map(|_| ())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn layouts_match_intf_h() {
        assert_eq!(std::mem::size_of::<RawRule>(), 40);
        assert_eq!(std::mem::size_of::<RawPolicy>(), 8 + 40 * MAX_RULES);
        assert_eq!(std::mem::size_of::<RawEvent>(), 72);
    }

    fn no_dns(h: &str) -> Result<Vec<IpAddr>, String> {
        match h {
            "api.example.com" => Ok(vec![
                "192.0.2.7".parse().unwrap(),
                "2001:db8::7".parse().unwrap(),
            ]),
            _ => Err("no such host".into()),
        }
    }

    #[test]
    fn scopes_become_rules() {
        let p = policy_from_scopes(
            &[
                "127.0.0.1:8080".into(),
                "api.example.com:443".into(),
                "10.0.0.0/8:*".into(),
                "[::1]:53".into(),
                "nowhere.invalid:80".into(),
            ],
            &no_dns,
        )
        .unwrap();
        assert!(!p.allow_all);
        assert_eq!(p.rules.len(), 5);
        assert_eq!(p.notes.len(), 1, "{:?}", p.notes);
        assert!(p.notes[0].contains("nowhere.invalid"));
        assert_eq!(
            p.describe(),
            "127.0.0.1:8080, 192.0.2.7:443, [2001:db8::7]:443, 10.0.0.0/8:*, [::1]:53"
        );
        let raw = p.raw();
        assert_eq!(raw.n_rules, 5);
        // 127.0.0.1 in network byte order as the kernel's user_ip4 holds it.
        assert_eq!(raw.rules[0].addr[0], u32::from_ne_bytes([127, 0, 0, 1]));
        assert_eq!(raw.rules[0].mask, [u32::MAX, 0, 0, 0]);
        assert_eq!(raw.rules[0].port, 8080);
        assert_eq!(raw.rules[3].mask[0], u32::from_ne_bytes([255, 0, 0, 0]));
        assert_eq!(raw.rules[3].port, 0);
        assert_eq!(raw.rules[4].family, AF_INET6);
        assert_eq!(raw.rules[4].mask, [u32::MAX; 4]);
    }

    #[test]
    fn wildcards_and_errors() {
        let p = policy_from_scopes(&["*:*".into()], &no_dns).unwrap();
        assert!(p.allow_all);
        let p = policy_from_scopes(&["*:443".into()], &no_dns).unwrap();
        assert!(!p.allow_all);
        assert_eq!(p.rules.len(), 2);
        assert_eq!(p.raw().rules[0].mask, [0; 4]);
        assert!(policy_from_scopes(&["nohost".into()], &no_dns).is_err());
        assert!(policy_from_scopes(&["1.2.3.4/40:1".into()], &no_dns).is_err());
        assert!(policy_from_scopes(&["h:0".into()], &no_dns).is_err());
        let p = policy_from_scopes(&[], &no_dns).unwrap();
        assert!(p.rules.is_empty() && !p.allow_all);
        let many: Vec<String> = (1..=40).map(|i| format!("10.0.0.{i}:1")).collect();
        assert_eq!(
            policy_from_scopes(&many, &no_dns),
            Err(PolicyError::TooMany(40))
        );
    }

    #[test]
    fn cgroup_paths_as_bpffs_names() {
        let p = Path::new("/sys/fs/cgroup/system.slice/agentosd.service/agents%x");
        let e = escape_path(p).unwrap();
        assert!(!e.contains('/') && !e.contains('.'), "{e}");
        assert_eq!(unescape_path(&e), p);
        assert!(escape_path(Path::new(&"/a".repeat(200))).is_none());
    }

    #[test]
    fn link_generations() {
        assert_eq!(
            parse_link_name("agentos_connect4-7"),
            Some(("agentos_connect4", 7))
        );
        assert_eq!(parse_link_name("agentos_connect4.7"), None);
        assert_eq!(parse_link_name("stray"), None);
        let pinned = |v: &[u64]| -> Vec<(String, String, u64)> {
            v.iter()
                .map(|g| (format!("p-{g}"), "p".into(), *g))
                .collect()
        };
        assert_eq!(next_generation(&pinned(&[])), 1);
        assert_eq!(next_generation(&pinned(&[3, 1, 2])), 4);
    }

    #[test]
    fn bind_grants_and_v4_mapped_scopes() {
        let p = policy_from_grants(
            &[
                "[::ffff:10.0.0.1]:80".into(),
                "::ffff:10.0.0.0/104:443".into(),
            ],
            &["127.0.0.1:8080".into(), "*:*".into()],
            &no_dns,
        )
        .unwrap();
        assert!(p.inet && p.allow_all_bind && !p.allow_all);
        // A v4-mapped grant is an IPv4 grant (the programs check mapped destinations as IPv4).
        assert_eq!(p.rules[0].family, AF_INET);
        assert_eq!(p.rules[0].net, Some(("10.0.0.1".parse().unwrap(), 32)));
        assert_eq!(p.rules[1].net, Some(("10.0.0.0".parse().unwrap(), 8)));
        assert_eq!(p.rules[2].kind, RuleKind::Bind);
        let raw = p.raw();
        assert_eq!(raw.flags, ALLOW_ALL_BIND | INET);
        assert_eq!(raw.rules[2].kind, RULE_BIND);
        assert_eq!(raw.rules[0].kind, RULE_CONNECT);
        assert_eq!(
            p.describe(),
            "10.0.0.1:80, 10.0.0.0/8:443; bind any address (net.bind *:*)"
        );
        let none = policy_from_grants(&[], &[], &no_dns).unwrap();
        assert_eq!(none.raw().flags, 0);
        assert!(none.describe().starts_with("no network grant"));
    }

    #[test]
    fn events_decode() {
        let mut e = RawEvent {
            cgroup_id: 42,
            pid: 7,
            tid: 8,
            family: AF_INET,
            port: 9,
            protocol: 17,
            hook: 2,
            ..RawEvent::default()
        };
        e.addr[0] = u32::from_ne_bytes([127, 0, 0, 2]);
        e.comm[..2].copy_from_slice(b"nc");
        // SAFETY: RawEvent is plain old data; viewing it as bytes is sound.
        let bytes = unsafe {
            std::slice::from_raw_parts(
                (&e as *const RawEvent).cast::<u8>(),
                std::mem::size_of::<RawEvent>(),
            )
        };
        let d = Denial::decode(bytes).unwrap();
        assert_eq!(d.syscall, "sendmsg");
        assert_eq!(d.hook, "cgroup/sendmsg4");
        assert_eq!(d.addr, "127.0.0.2".parse::<IpAddr>().unwrap());
        assert_eq!(
            (d.port, d.pid, d.comm.as_str(), d.protocol.as_str()),
            (9, 7, "nc", "udp")
        );
        assert!(Denial::decode(&bytes[..10]).is_none());
    }
}
