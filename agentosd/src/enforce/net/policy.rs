//! An agent's network policy: the contract's `net.connect` and `net.bind` scopes parsed into
//! rules and name grants, and their layout in the `net_policy` map. A host name is either
//! resolved now by a resolver passed in ([`policy_from_grants`], tool cgroups) or, for an agent
//! whose DNS is the daemon's ([`policy_with_dns`]), kept as a name grant that its DNS stub
//! answers (only names in /etc/hosts stay static rules).

use std::net::IpAddr;

pub use contracts::netscope::Check;
use contracts::netscope::checked_scope;

use super::{
    AF_INET, AF_INET6, ALLOW_ALL, ALLOW_ALL_BIND, DNS, INET, MAX_RULES, RULE_BIND, RULE_CONNECT,
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
    /// DNS belongs to the daemon (`AGENTOS_NET_DNS`): port 53 goes to the stub at
    /// 127.0.0.1:`dns_port`, and addresses it answers for `names` are allowed while valid.
    pub dns: bool,
    pub dns_port: u16,
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
                | if self.dns { DNS } else { 0 },
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
                names.push(format!(
                    "DNS through the daemon's stub (127.0.0.1:{})",
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
                format!("{host}:{port}")
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
        "net.connect scope {0:?}: expected HOST:PORT (HOST a name, an address, ADDR/PREFIX, [IPv6] or *; PORT a number or *), or udp://NAME:PORT (UDP to a name's addresses: names and *.SUFFIX only, net.connect only)"
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
        // udp:// declares UDP to a name's addresses: names only, net.connect only (contracts
        // validates the same).
        if udp
            && (kind == RuleKind::Bind
                || host == "*"
                || host.contains('/')
                || host.parse::<IpAddr>().is_ok())
        {
            return Err(PolicyError::Scope(s.clone()));
        }
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
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::enforce::net::RawEvent;

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
    fn layouts_match_intf_h() {
        assert_eq!(std::mem::size_of::<RawRule>(), 40);
        assert_eq!(std::mem::size_of::<RawPolicy>(), 8 + 40 * MAX_RULES + 8);
        assert_eq!(std::mem::size_of::<RawEvent>(), 72);
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
    fn wildcards_match_labels_under_the_suffix_at_any_depth() {
        let g = NameGrant::new("*.Example.TEST", 443);
        assert!(g.wildcard && g.name == "example.test");
        for yes in ["a.example.test", "A.B.example.test.", "x-1.EXAMPLE.test"] {
            assert!(g.matches(yes), "{yes}");
        }
        for no in [
            "example.test",
            ".example.test",
            "aexample.test",
            "a.example.test.evil",
            "example.test.",
            "test",
        ] {
            assert!(!g.matches(no), "{no}");
        }
        let n = NameGrant::new("named.example.test.", 80);
        assert!(n.matches("NAMED.example.test") && n.matches("named.example.test."));
        assert!(!n.matches("a.named.example.test"));
    }

    #[test]
    fn names_are_grants_unless_in_hosts_and_set_the_dns_flag() {
        let hosts =
            |h: &str| hosts_lookup("127.0.0.1 localhost # me\n::1 localhost ip6-localhost\n", h);
        let p = policy_with_dns(
            &[
                "*.example.test:443".into(),
                "named.example.test:8080".into(),
                "localhost:9000".into(),
                "198.18.0.9:*".into(),
            ],
            &["localhost:7000".into()],
            &hosts,
        )
        .unwrap();
        assert!(p.dns && p.inet && !p.allow_all);
        assert_eq!(
            p.names,
            vec![
                NameGrant::new("*.example.test", 443),
                NameGrant::new("named.example.test", 8080)
            ]
        );
        // localhost is static (both addresses), the address a rule, the bind name local.
        assert_eq!(p.rules.len(), 5, "{:?}", p.rules);
        let mut pp = p.clone();
        pp.dns_port = 5353;
        let raw = pp.raw();
        assert_eq!(raw.flags, INET | DNS);
        assert_eq!(raw.dns_port, 5353);
        assert!(
            pp.describe().contains("*.example.test:443, named.example.test:8080, DNS through the daemon's stub (127.0.0.1:5353)"),
            "{}",
            pp.describe()
        );
        // *:* needs no stub; no net.connect, no stub.
        let all = policy_with_dns(&["*:*".into(), "a.test:1".into()], &[], &hosts).unwrap();
        assert!(!all.dns);
        let bind_only = policy_with_dns(&[], &["127.0.0.1:1".into()], &hosts).unwrap();
        assert!(!bind_only.dns && bind_only.raw().flags == INET);
        // The resolve-now builder (tool cgroups) grants nothing for a wildcard, and says so.
        let t = policy_from_scopes(&["*.example.test:443".into()], &no_dns).unwrap();
        assert!(t.rules.is_empty() && t.names.is_empty() && !t.dns);
        assert!(t.notes[0].contains("wildcard"), "{:?}", t.notes);
    }

    #[test]
    fn checked_grants_are_name_grants_with_their_check() {
        let hosts = |h: &str| {
            if h == "localhost" {
                vec!["127.0.0.1".parse().unwrap()]
            } else {
                Vec::new()
            }
        };
        let p = policy_with_dns(
            &[
                "https://API.example.test".into(),
                "https://*.example.test:8443".into(),
                "http://plain.example.test".into(),
                "https://localhost".into(),
            ],
            &[],
            &hosts,
        )
        .unwrap();
        assert!(p.dns && p.rules.is_empty(), "{:?}", p.rules);
        assert_eq!(
            p.names,
            vec![
                NameGrant::new("api.example.test", 443).checked(Check::Tls),
                NameGrant::new("*.example.test", 8443).checked(Check::Tls),
                NameGrant::new("plain.example.test", 80).checked(Check::Http),
                // /etc/hosts names no name to check: still a name grant (its loopback answer is
                // stripped like any).
                NameGrant::new("localhost", 443).checked(Check::Tls),
            ]
        );
        assert_eq!(
            p.names[0].port_grant(),
            crate::enforce::net::PortGrant::checked(443)
        );
        assert!(
            p.describe()
                .contains("https://api.example.test:443, https://*.example.test:8443, http://plain.example.test:80"),
            "{}",
            p.describe()
        );
        // Tools (names resolved once) and net.bind cannot have them.
        let no_dns = |_: &str| -> Result<Vec<IpAddr>, String> { Ok(Vec::new()) };
        assert!(matches!(
            policy_from_scopes(&["https://api.example.test".into()], &no_dns),
            Err(PolicyError::Checked(_))
        ));
        assert!(matches!(
            policy_with_dns(&[], &["http://localhost".into()], &hosts),
            Err(PolicyError::Checked(_))
        ));
        assert!(matches!(
            policy_with_dns(&["https://10.0.0.1".into()], &[], &hosts),
            Err(PolicyError::Checked(_))
        ));
    }

    #[test]
    fn udp_is_declared_per_name_grant() {
        let none = |_: &str| Vec::new();
        let p = policy_with_dns(
            &[
                "udp://*.example.test:443".into(),
                "*.example.test:443".into(),
            ],
            &[],
            &none,
        )
        .unwrap();
        assert_eq!(
            p.names,
            vec![
                NameGrant::new("*.example.test", 443).over_udp(),
                NameGrant::new("*.example.test", 443),
            ]
        );
        assert!(
            p.describe()
                .contains("udp://*.example.test:443, *.example.test:443")
        );
        // Names only, net.connect only.
        for (c, b) in [
            (vec!["udp://198.18.0.1:443".to_string()], vec![]),
            (vec!["udp://*:443".into()], vec![]),
            (vec!["udp://10.0.0.0/8:443".into()], vec![]),
            (vec![], vec!["udp://localhost:53".to_string()]),
        ] {
            assert!(
                matches!(policy_with_dns(&c, &b, &none), Err(PolicyError::Scope(_))),
                "{c:?} {b:?}"
            );
        }
    }

    #[test]
    fn hosts_file_lines() {
        let text =
            "# c\n10.0.0.1  db.internal db\n10.0.0.2 other\nbad line\n10.0.0.3 DB.internal\n";
        let v = hosts_lookup(text, "db.internal.");
        assert_eq!(
            v,
            vec![
                "10.0.0.1".parse::<IpAddr>().unwrap(),
                "10.0.0.3".parse().unwrap()
            ]
        );
        assert!(hosts_lookup(text, "nowhere").is_empty());
    }
}
