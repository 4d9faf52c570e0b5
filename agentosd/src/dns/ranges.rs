//! Which addresses an answer may carry to an agent (DNS rebinding). Never: loopback, link-local
//! (the cloud metadata address among them), unspecified, multicast, broadcast, `0.0.0.0/8`.
//! Not unless the operator allows the prefix (`agentosd --dns-allow-private PREFIX`): the
//! private and internal ranges ([`PRIVATE`]). Both also when written as an IPv6 address that
//! carries the IPv4 one: v4-mapped `::ffff:0:0/96`, v4-compatible `::/96`, NAT64
//! `64:ff9b::/96`, 6to4 `2002::/16` and Teredo `2001::/32` (its server and its client).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The private and internal prefixes an answer loses unless allowed (see docs/security.md).
/// `198.18.0.0/15` (benchmarking, RFC 2544) is not among them: fake-IP DNS proxies answer
/// every name from it, and the test suite's servers use it.
pub const PRIVATE: &[&str] = &[
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "100.64.0.0/10",
    "192.0.0.0/24",
    "fc00::/7",
    "fec0::/10",
    "64:ff9b:1::/48",
];

/// An address prefix (`ADDR/LEN`, or an address alone: all its bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prefix {
    pub addr: IpAddr,
    pub len: u8,
}

impl std::str::FromStr for Prefix {
    type Err = String;

    fn from_str(s: &str) -> Result<Prefix, String> {
        let bad = || format!("{s:?} is not an address prefix (ADDR/LEN: 10.0.0.0/8, fd00::/8)");
        let (a, len) = match s.split_once('/') {
            Some((_, "")) => return Err(bad()),
            Some(x) => x,
            None => (s, ""),
        };
        let addr: IpAddr = a
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse()
            .map_err(|_| bad())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let len = if len.is_empty() {
            max
        } else {
            len.parse().ok().filter(|l| *l <= max).ok_or_else(bad)?
        };
        Ok(Prefix { addr, len })
    }
}

impl std::fmt::Display for Prefix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

impl Prefix {
    pub fn contains(&self, a: IpAddr) -> bool {
        let (p, x, bits) = match (self.addr, a) {
            (IpAddr::V4(p), IpAddr::V4(x)) => (u32::from(p).into(), u32::from(x).into(), 32),
            (IpAddr::V6(p), IpAddr::V6(x)) => (u128::from(p), u128::from(x), 128),
            _ => return false,
        };
        let len = u32::from(self.len).min(bits);
        if len == 0 {
            return true;
        }
        let shift = bits - len;
        (p >> shift) == (x >> shift)
    }
}

/// The IPv4 addresses an IPv6 address carries and reaches (see the module's doc).
pub fn embedded_v4(a: Ipv6Addr) -> Vec<Ipv4Addr> {
    let s = a.segments();
    let low = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    let v4_at = |hi: u16, lo: u16| Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo));
    match s {
        [0, 0, 0, 0, 0, 0xffff, _, _] | [0, 0, 0, 0, 0, 0, _, _] => vec![low],
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => vec![low],
        [0x2002, hi, lo, ..] => vec![v4_at(hi, lo)],
        [0x2001, 0, hi, lo, ..] => vec![v4_at(hi, lo), v4_at(!s[6], !s[7])],
        _ => Vec::new(),
    }
}

/// Never in an answer: loopback, link-local, unspecified, multicast, broadcast, `0/8`.
fn forbidden(a: IpAddr) -> bool {
    match a {
        IpAddr::V4(v4) => {
            v4.is_loopback()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_multicast()
                || v4.is_broadcast()
                || v4.octets()[0] == 0
        }
        IpAddr::V6(v6) => {
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || v6.is_unicast_link_local()
        }
    }
}

fn private(a: IpAddr) -> bool {
    PRIVATE
        .iter()
        .filter_map(|p| p.parse::<Prefix>().ok())
        .any(|p| p.contains(a))
}

/// Why an address is stripped from an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strip {
    /// Loopback, link-local, unspecified, multicast, broadcast: never.
    Forbidden,
    /// A private or internal range the operator did not allow.
    Private,
}

impl Strip {
    /// The `reason` of its audit record.
    pub fn reason(self) -> &'static str {
        match self {
            Strip::Forbidden => "forbidden-address",
            Strip::Private => "private-address",
        }
    }

    /// What it means, for the daemon's log.
    pub fn why(self) -> &'static str {
        match self {
            Strip::Forbidden => "loopback, link-local, unspecified, multicast or broadcast",
            Strip::Private => "a private or internal range (agentosd --dns-allow-private)",
        }
    }
}

/// Why an address may not be in an answer to an agent (`None`: it may). `allowed`: the
/// operator's private prefixes (they lift the private rule, never the forbidden one).
pub fn refusal(a: IpAddr, allowed: &[Prefix]) -> Option<Strip> {
    let mut all = vec![a];
    if let IpAddr::V6(v6) = a {
        all.extend(embedded_v4(v6).into_iter().map(IpAddr::V4));
    }
    if all.iter().any(|x| forbidden(*x)) {
        return Some(Strip::Forbidden);
    }
    let lifted = |x: &IpAddr| allowed.iter().any(|p| p.contains(*x));
    if all.iter().any(|x| private(*x) && !lifted(x)) {
        return Some(Strip::Private);
    }
    None
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn forbidden_and_private_in_every_form() {
        for bad in [
            "127.0.0.1",
            "169.254.169.254",
            "0.1.2.3",
            "255.255.255.255",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "2002:7f00:1::1",
            "2001:0:a9fe:a9fe::1",
            // Teredo client 127.0.0.1: the last 32 bits inverted.
            "2001:0:c000:201::80ff:fffe",
        ] {
            assert_eq!(
                refusal(ip(bad), &["0.0.0.0/0".parse().unwrap()]),
                Some(Strip::Forbidden),
                "{bad}: never, whatever is allowed"
            );
        }
        for private in [
            "10.0.0.1",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "100.64.0.1",
            "100.127.255.255",
            "fd00::1",
            "fc00::1",
            "fec0::1",
            "::ffff:10.1.2.3",
            "::10.1.2.3",
            "64:ff9b::c0a8:101",
            "64:ff9b:1::1",
            "2002:c0a8:101::1",
            "2001:0:a01:203::1",
            "2001:0:c000:201::f5fe:fdfc",
        ] {
            assert_eq!(refusal(ip(private), &[]), Some(Strip::Private), "{private}");
        }
        for public in [
            "198.18.0.10",
            "172.32.0.1",
            "100.128.0.1",
            "93.184.216.34",
            "2001:db8::1",
            "2606:4700::1111",
            "64:ff9b::5db8:d822",
            "2002:5db8:d822::1",
        ] {
            assert_eq!(refusal(ip(public), &[]), None, "{public}");
        }
    }

    #[test]
    fn the_operator_lifts_private_prefixes_only() {
        let allow: Vec<Prefix> = vec!["10.99.0.0/16".parse().unwrap(), "fd00::/8".parse().unwrap()];
        assert_eq!(refusal(ip("10.99.1.2"), &allow), None);
        assert_eq!(refusal(ip("::ffff:10.99.1.2"), &allow), None);
        assert_eq!(refusal(ip("64:ff9b::a63:102"), &allow), None);
        assert_eq!(refusal(ip("fd12::1"), &allow), None);
        assert!(refusal(ip("10.98.1.2"), &allow).is_some());
        assert!(refusal(ip("fc00::1"), &allow).is_some());
        assert!(refusal(ip("127.0.0.1"), &["127.0.0.0/8".parse().unwrap()]).is_some());
        assert_eq!(
            "10.0.0.0/8".parse::<Prefix>().unwrap().to_string(),
            "10.0.0.0/8"
        );
        assert_eq!("10.1.2.3".parse::<Prefix>().unwrap().len, 32);
        assert_eq!("[fd00::]/8".parse::<Prefix>().unwrap().len, 8);
        for bad in ["10.0.0.0/33", "fd00::/129", "x/8", "10.0.0.0/"] {
            assert!(bad.parse::<Prefix>().is_err(), "{bad}");
        }
        for p in PRIVATE {
            assert!(p.parse::<Prefix>().is_ok(), "{p}");
        }
    }
}
