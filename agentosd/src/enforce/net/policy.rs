//! An agent's network policy: the contract's `net.connect` and `net.bind` scopes parsed into
//! rules and name grants, and their layout in the `net_policy` map. A host name is either
//! resolved now by a resolver passed in ([`policy_from_grants`], tool cgroups) or, for an agent
//! whose DNS is the daemon's ([`policy_with_dns`]), kept as a name grant that its DNS stub
//! answers (only names in /etc/hosts stay static rules).

use std::net::IpAddr;

pub use contracts::netscope::Check;
use contracts::netscope::checked_scope;

use super::{
    AF_INET, AF_INET6, ALLOW_ALL, ALLOW_ALL_BIND, DNS, DNS6, INET, MAX_RULES, RULE_BIND,
    RULE_CONNECT, RULE_TCP, RULE_UDP,
};

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
    /// The agent's DNS stub port on 127.0.0.1 (`AGENTOS_NET_DNS`).
    pub dns_port: u16,
    pub _pad: [u16; 3],
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
    /// Which protocols: an address grant both, `udp://ADDR:PORT` UDP only
    /// (`AGENTOS_NET_RULE_UDP`), a name resolved now (a tool's) TCP only unless `udp://`
    /// (`AGENTOS_NET_RULE_TCP`), as the DNS stub's name grants.
    pub proto: Proto,
}

/// The protocols a [`Rule`] allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Proto {
    #[default]
    Any,
    Tcp,
    Udp,
}

impl Rule {
    /// Whether this rule (a `net.connect` one) lets the agent reach `addr` on port `g.port` over
    /// `g`'s protocol (`g.port` 0, any port: only a rule for any port does).
    pub fn covers(&self, addr: IpAddr, g: super::PortGrant) -> bool {
        let addr = match addr {
            IpAddr::V6(a) => a.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(addr),
            a => a,
        };
        let family = if addr.is_ipv4() { AF_INET } else { AF_INET6 };
        let proto = match self.proto {
            Proto::Any => true,
            Proto::Udp => g.udp,
            Proto::Tcp => !g.udp,
        };
        let net = match self.net {
            None => true,
            Some((n, len)) => {
                let (n, x, bits) = match (n, addr) {
                    (IpAddr::V4(n), IpAddr::V4(x)) => {
                        (u32::from(n).into(), u32::from(x).into(), 32)
                    }
                    (IpAddr::V6(n), IpAddr::V6(x)) => (u128::from(n), u128::from(x), 128),
                    _ => return false,
                };
                let shift = bits - u32::from(len).min(bits);
                shift == bits || (n >> shift) == (x >> shift)
            }
        };
        self.kind == RuleKind::Connect
            && self.family == family
            && (self.port == 0 || (g.port != 0 && self.port == g.port))
            && proto
            && net
    }

    fn raw(&self) -> RawRule {
        let mut r = RawRule {
            family: self.family,
            port: self.port,
            kind: match self.kind {
                RuleKind::Connect => RULE_CONNECT,
                RuleKind::Bind => RULE_BIND,
            } | match self.proto {
                Proto::Any => 0,
                Proto::Tcp => RULE_TCP,
                Proto::Udp => RULE_UDP,
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
    /// DNS belongs to the daemon (`AGENTOS_NET_DNS`): port 53 goes to the stub at
    /// 127.0.0.1:`dns_port`, and addresses it answers for `names` are allowed while valid.
    pub dns: bool,
    pub dns_port: u16,
    /// The stub serves [::1]:`dns_port` too (`AGENTOS_NET_DNS6`): IPv6 sockets' queries go
    /// there.
    pub dns6: bool,
    /// `net.connect` scopes by name (`api.example.com:443`, `*.example.test:443`).
    pub names: Vec<NameGrant>,
    /// What the operator should know (names that did not resolve…).
    pub notes: Vec<String>,
}

/// A `net.connect` scope whose host is a name or a wildcard, answered by the agent's DNS stub.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameGrant {
    /// Lower case, without a trailing dot; for a wildcard the suffix after `*.`.
    pub name: String,
    /// `*.SUFFIX`: one or more labels under SUFFIX (any depth), never SUFFIX itself.
    pub wildcard: bool,
    /// 0 = any port.
    pub port: u16,
    /// `udp://NAME:PORT`: UDP (QUIC/HTTP3, other datagrams) to the name's addresses, and not
    /// TCP; a grant without it is TCP only.
    pub udp: bool,
    /// `https://NAME[:PORT]` / `http://NAME[:PORT]`: TCP connections to the name's addresses
    /// go through the daemon's SNI/Host proxy, which lets them on only when the TLS SNI or the
    /// HTTP Host is a name this grant matches (`dns::sni`).
    pub check: Option<Check>,
}

impl NameGrant {
    /// The TCP grant of host `host` (a name or `*.SUFFIX`) on `port`.
    pub fn new(host: &str, port: u16) -> NameGrant {
        let h = host.trim_end_matches('.').to_ascii_lowercase();
        match h.strip_prefix("*.") {
            Some(suffix) => NameGrant {
                name: suffix.to_string(),
                wildcard: true,
                port,
                udp: false,
                check: None,
            },
            None => NameGrant {
                name: h,
                wildcard: false,
                port,
                udp: false,
                check: None,
            },
        }
    }

    /// The same grant over UDP instead (`udp://HOST:PORT`).
    pub fn over_udp(self) -> NameGrant {
        NameGrant { udp: true, ..self }
    }

    /// The same grant with a content check (`https://HOST:PORT`, `http://HOST:PORT`).
    pub fn checked(self, check: Check) -> NameGrant {
        NameGrant {
            check: Some(check),
            ..self
        }
    }

    /// What a matching name's addresses may be reached on.
    pub fn port_grant(&self) -> super::PortGrant {
        super::PortGrant {
            port: self.port,
            udp: self.udp,
            checked: self.check.is_some(),
        }
    }

    /// Whether `qname` (as asked: any case, a trailing dot or not) is granted by this.
    pub fn matches(&self, qname: &str) -> bool {
        let q = qname.trim_end_matches('.');
        if !self.wildcard {
            return q.eq_ignore_ascii_case(&self.name);
        }
        let n = self.name.len();
        q.len() > n + 1
            && q.as_bytes()[q.len() - n - 1] == b'.'
            && q[q.len() - n..].eq_ignore_ascii_case(&self.name)
            && !q[..q.len() - n - 1].is_empty()
    }

    /// The scope as a contract writes it (`https://*.example.test:443`, `udp://a.test:443`).
    pub fn describe(&self) -> String {
        let port = if self.port == 0 {
            "*".to_string()
        } else {
            self.port.to_string()
        };
        let star = if self.wildcard { "*." } else { "" };
        let scheme = match (self.check, self.udp) {
            (Some(c), _) => c.scheme(),
            (None, true) => UDP_SCHEME,
            (None, false) => "",
        };
        format!("{scheme}{star}{}:{port}", self.name)
    }
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
                | if self.inet { INET } else { 0 }
                | if self.dns { DNS } else { 0 }
                | if self.dns && self.dns6 { DNS6 } else { 0 },
            rules: [RawRule::default(); MAX_RULES],
            dns_port: self.dns_port,
            _pad: [0; 3],
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
        let mut names: Vec<String> = Vec::new();
        if kind == RuleKind::Connect {
            names = self.names.iter().map(NameGrant::describe).collect();
            if self.dns {
                let v6 = if self.dns6 {
                    format!(", [::1]:{}", self.dns_port)
                } else {
                    String::new()
                };
                names.push(format!(
                    "DNS through the daemon's stub (127.0.0.1:{}{v6})",
                    self.dns_port
                ));
            }
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
                let (pre, post) = match r.proto {
                    Proto::Any => ("", ""),
                    Proto::Udp => (UDP_SCHEME, ""),
                    Proto::Tcp => ("", " (TCP)"),
                };
                format!("{pre}{host}:{port}{post}")
            })
            .collect();
        v.dedup();
        v.extend(names);
        (!v.is_empty()).then(|| v.join(", "))
    }
}

/// Why a scope cannot be turned into rules.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error(
        "net.connect scope {0:?}: expected HOST:PORT (HOST a name, an address, ADDR/PREFIX, [IPv6] or *; PORT a number or *), or udp://HOST:PORT (UDP only: a name, *.SUFFIX, address or prefix, not *; net.connect only)"
    )]
    Scope(String),
    #[error(
        "net.connect scope {0:?}: https:// and http:// (the SNI/Host check) need the agent's DNS stub: names only, for agents (a tool's names are resolved once)"
    )]
    Checked(String),
    #[error(
        "net.connect grants {0} destinations after name resolution; at most {MAX_RULES} are supported"
    )]
    TooMany(usize),
}

/// Parse one `HOST:PORT` scope into (host, port); port 0 = any.
/// The prefix of a `net.connect` name grant over UDP (`udp://api.example.com:443`).
pub const UDP_SCHEME: &str = "udp://";

/// `HOST:PORT` (or `[V6]:PORT`) without `udp://` (see [`UDP_SCHEME`]).
fn split_scope(scope: &str) -> Result<(&str, u16), PolicyError> {
    let bad = || PolicyError::Scope(scope.to_string());
    let scope = scope.strip_prefix(UDP_SCHEME).unwrap_or(scope);
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
    build(connect, bind, &Names::Resolve(resolve))
}

/// The policy of an agent whose DNS is the daemon's: like [`policy_from_grants`], but a
/// `net.connect` host name or `*.SUFFIX` wildcard is a name grant (the stub answers it and the
/// kernel allows the addresses it returned while their TTL runs) unless `hosts` (the daemon's
/// /etc/hosts) knows it, which makes it static rules as before. With any `net.connect` grant but
/// `*:*`, the policy has the DNS flag; its port is set by the caller once the stub is bound.
pub fn policy_with_dns(
    connect: &[String],
    bind: &[String],
    hosts: &dyn Fn(&str) -> Vec<IpAddr>,
) -> Result<Policy, PolicyError> {
    let mut p = build(connect, bind, &Names::Grant(hosts))?;
    p.dns = !connect.is_empty() && !p.allow_all;
    Ok(p)
}

/// What a `net.connect` host name becomes.
enum Names<'a> {
    /// Addresses now, from this resolver.
    Resolve(&'a dyn Fn(&str) -> Result<Vec<IpAddr>, String>),
    /// A name grant, unless this (/etc/hosts) has addresses for it.
    Grant(&'a dyn Fn(&str) -> Vec<IpAddr>),
}

fn build(connect: &[String], bind: &[String], names: &Names<'_>) -> Result<Policy, PolicyError> {
    let mut p = Policy {
        inet: !connect.is_empty() || !bind.is_empty(),
        ..Policy::default()
    };
    add_rules(&mut p, connect, RuleKind::Connect, names)?;
    match names {
        Names::Resolve(_) => add_rules(&mut p, bind, RuleKind::Bind, names)?,
        // net.bind names are local addresses: /etc/hosts only, never a name grant.
        Names::Grant(hosts) => {
            let local = |h: &str| Ok(hosts(h));
            add_rules(&mut p, bind, RuleKind::Bind, &Names::Resolve(&local))?;
        }
    }
    finish(p)
}

fn finish(mut p: Policy) -> Result<Policy, PolicyError> {
    p.names.dedup();
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
    names: &Names<'_>,
) -> Result<(), PolicyError> {
    let cap = match kind {
        RuleKind::Connect => "net.connect",
        RuleKind::Bind => "net.bind",
    };
    for s in scopes {
        // https:// and http:// (contracts::netscope, as `agentctl validate` reads them): a name
        // grant whose connections the SNI/Host proxy checks. Only with the daemon's DNS.
        if let Some(c) = checked_scope(s) {
            match (c, kind, names) {
                (Ok(c), RuleKind::Connect, Names::Grant(_)) => {
                    p.names
                        .push(NameGrant::new(c.host, c.port).checked(c.check));
                    continue;
                }
                _ => return Err(PolicyError::Checked(s.clone())),
            }
        }
        let (host, port) = split_scope(s)?;
        let udp = s.starts_with(UDP_SCHEME);
        // udp:// declares UDP only: to a name's addresses, an address or a prefix, in
        // net.connect only; not with "*" (contracts validates the same).
        if udp && (kind == RuleKind::Bind || host == "*") {
            return Err(PolicyError::Scope(s.clone()));
        }
        let at = p.rules.len();
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
                    proto: Proto::Any,
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
            set_proto(p, at, if udp { Proto::Udp } else { Proto::Any });
            continue;
        }
        let resolved = match (host.parse::<IpAddr>(), names) {
            (Ok(a), _) => Ok(vec![a]),
            (Err(_), Names::Resolve(_)) if host.starts_with("*.") => Err(format!(
                "{host} is a wildcard: only an agent's DNS stub answers wildcards"
            )),
            (Err(_), Names::Resolve(resolve)) => resolve(host),
            (Err(_), Names::Grant(hosts)) => {
                let fixed = if host.starts_with("*.") {
                    Vec::new()
                } else {
                    hosts(host)
                };
                if fixed.is_empty() {
                    let g = NameGrant::new(host, port);
                    p.names.push(if udp { g.over_udp() } else { g });
                    continue;
                }
                Ok(fixed)
            }
        };
        let addrs = match resolved {
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
        };
        for a in addrs {
            let len = if a.is_ipv4() { 32 } else { 128 };
            p.rules.push(rule_for(a, len, port, kind));
        }
        // A name resolved now is a name grant too: TCP unless udp:// (not a name in
        // /etc/hosts, a fixed address of the operator's).
        let resolved_name = host.parse::<IpAddr>().is_err() && matches!(names, Names::Resolve(_));
        let proto = match (udp, resolved_name && kind == RuleKind::Connect) {
            (true, _) => Proto::Udp,
            (false, true) => Proto::Tcp,
            (false, false) => Proto::Any,
        };
        set_proto(p, at, proto);
    }
    Ok(())
}

/// The rules from `at` on allow `proto`.
fn set_proto(p: &mut Policy, at: usize, proto: Proto) {
    for r in &mut p.rules[at..] {
        r.proto = proto;
    }
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
        proto: Proto::Any,
    }
}

/// The addresses /etc/hosts (`path`) gives `host` (case-insensitive; empty when none or
/// unreadable): the static names that stay rules for an agent whose DNS is the daemon's.
pub fn hosts_file(path: &std::path::Path, host: &str) -> Vec<IpAddr> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    hosts_lookup(&text, host)
}

fn hosts_lookup(text: &str, host: &str) -> Vec<IpAddr> {
    let host = host.trim_end_matches('.');
    let mut v: Vec<IpAddr> = text
        .lines()
        .map(|l| l.split('#').next().unwrap_or(""))
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let addr: IpAddr = it.next()?.parse().ok()?;
            it.any(|n| n.eq_ignore_ascii_case(host)).then_some(addr)
        })
        .collect();
    v.sort();
    v.dedup();
    v
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

#[cfg(test)]
mod tests;
