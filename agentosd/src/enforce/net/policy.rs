//! An agent's network policy: the contract's `net.connect` and `net.bind` scopes parsed into
//! rules (host names resolved by a resolver passed in), and their layout in the `net_policy` map.

use std::net::IpAddr;

use super::{
    AF_INET, AF_INET6, ALLOW_ALL, ALLOW_ALL_BIND, INET, MAX_RULES, RULE_BIND, RULE_CONNECT,
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
        assert_eq!(std::mem::size_of::<RawPolicy>(), 8 + 40 * MAX_RULES);
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
}
