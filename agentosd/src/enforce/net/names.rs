//! The `net_names` map: addresses an agent's DNS stub answered for its name grants, each with
//! the ports those grants name and an expiry (the record's TTL plus a grace period), which the
//! programs compare with `bpf_ktime_get_boot_ns`.

use std::collections::HashMap as StdHashMap;
use std::net::IpAddr;

use aya::maps::{HashMap, MapData};

use super::{AF_INET, AF_INET6, NetError};

/// `AGENTOS_NAME_PORTS` in `ebpf/intf.h`.
pub const NAME_PORTS: usize = 8;
/// `AGENTOS_NAME_ANY_TCP`: any port over TCP (a grant `NAME:*`).
const ANY_TCP: u32 = 1;
/// `AGENTOS_NAME_ANY_UDP`: any port over UDP (a grant `udp://NAME:*`).
const ANY_UDP: u32 = 2;
/// `AGENTOS_NAME_CHECKED_SHIFT`: bit `CHECKED_SHIFT + i` of the flags = `ports[i]` over TCP is
/// granted only by a checked grant (`https://`, `http://`): connects go to the SNI/Host proxy.
const CHECKED_SHIFT: u32 = 8;
/// Addresses one agent may have in `net_names` at once (the map holds 65 536 for all agents): a
/// stub past it answers without learning more, so an agent that floods lookups of a wildcard
/// grant only loses its own new addresses.
pub const MAX_PER_AGENT: usize = 4096;

/// `struct agentos_name_key`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RawNameKey {
    pub cgroup_id: u64,
    pub addr: [u32; 4],
    pub family: u32,
    pub _pad: u32,
}

/// `struct agentos_name_value`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RawNameValue {
    pub expires_ns: u64,
    pub flags: u32,
    pub n_ports: u16,
    pub ports: [u16; NAME_PORTS],
    /// Bit i: `ports[i]` may be reached over TCP.
    pub tcp: u8,
    /// Bit i: `ports[i]` may be reached over UDP (declared: `udp://NAME:PORT`).
    pub udp: u8,
}

// SAFETY: plain `#[repr(C)]` integers and arrays of them with explicit padding fields, no
// pointers: any bit pattern is valid and the layouts match `ebpf/intf.h` (sizes tested below).
unsafe impl aya::Pod for RawNameKey {}
// SAFETY: as above.
unsafe impl aya::Pod for RawNameValue {}

impl RawNameKey {
    /// The key of `addr` for cgroup `cgroup_id`; a v4-mapped IPv6 address is its IPv4 address
    /// (the programs check mapped destinations as IPv4).
    pub fn new(cgroup_id: u64, addr: IpAddr) -> RawNameKey {
        let addr = match addr {
            IpAddr::V6(a) => a.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(addr),
            a => a,
        };
        let mut k = RawNameKey {
            cgroup_id,
            ..Default::default()
        };
        match addr {
            IpAddr::V4(a) => {
                k.family = AF_INET.into();
                k.addr[0] = u32::from_ne_bytes(a.octets());
            }
            IpAddr::V6(a) => {
                k.family = AF_INET6.into();
                let o = a.octets();
                for (w, c) in k.addr.iter_mut().zip(o.chunks_exact(4)) {
                    *w = u32::from_ne_bytes([c[0], c[1], c[2], c[3]]);
                }
            }
        }
        k
    }
}

/// A port a learnt address may be reached on, and over which protocol: TCP unless the grant
/// declared UDP (`udp://NAME:PORT`: QUIC/HTTP3 and other datagrams).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PortGrant {
    /// 0 = any port.
    pub port: u16,
    pub udp: bool,
    /// A checked grant's (`https://NAME`, `http://NAME`; TCP, one port): connects go through
    /// the SNI/Host proxy unless a plain grant opens the same address and port.
    pub checked: bool,
}

impl PortGrant {
    pub fn tcp(port: u16) -> PortGrant {
        PortGrant {
            port,
            udp: false,
            checked: false,
        }
    }

    pub fn udp(port: u16) -> PortGrant {
        PortGrant {
            port,
            udp: true,
            checked: false,
        }
    }

    /// TCP to `port` through the SNI/Host check.
    pub fn checked(port: u16) -> PortGrant {
        PortGrant {
            port,
            udp: false,
            checked: true,
        }
    }
}

/// What the programs compare a socket's protocol with.
pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;

impl RawNameValue {
    /// Join `ports` and `expires` into this entry (the union of ports and protocols, the later
    /// expiry).
    pub fn merge(&mut self, ports: &[PortGrant], expires: u64) {
        self.expires_ns = self.expires_ns.max(expires);
        for g in ports {
            if g.port == 0 {
                self.flags |= if g.udp { ANY_UDP } else { ANY_TCP };
                continue;
            }
            let n = usize::from(self.n_ports).min(NAME_PORTS);
            let slot = match self.ports[..n].iter().position(|p| *p == g.port) {
                Some(i) => i,
                None if n == NAME_PORTS => {
                    tracing::warn!(
                        "a learnt address is granted more than {NAME_PORTS} ports; port {} not added",
                        g.port
                    );
                    continue;
                }
                None => {
                    self.ports[n] = g.port;
                    self.n_ports += 1;
                    n
                }
            };
            let checked = 1u32 << (CHECKED_SHIFT + slot as u32);
            if g.udp {
                self.udp |= 1 << slot;
            } else if g.checked {
                // Checked only while no plain grant opens this port (a plain grant is the
                // contract's choice to allow any content there).
                if self.tcp & (1 << slot) == 0 {
                    self.flags |= checked;
                }
                self.tcp |= 1 << slot;
            } else {
                self.flags &= !checked;
                self.tcp |= 1 << slot;
            }
        }
    }

    /// Whether TCP to `port` goes through the SNI/Host check (allowed only by a checked grant).
    pub fn checked(&self, port: u16) -> bool {
        self.flags & ANY_TCP == 0
            && self.ports[..usize::from(self.n_ports).min(NAME_PORTS)]
                .iter()
                .enumerate()
                .any(|(i, p)| {
                    *p == port
                        && self.tcp & (1 << i) != 0
                        && self.flags & (1 << (CHECKED_SHIFT + i as u32)) != 0
                })
    }

    /// Whether port `port` is allowed over `proto` (`IPPROTO_TCP`/`IPPROTO_UDP`; ignoring
    /// expiry).
    pub fn allows(&self, port: u16, proto: u8) -> bool {
        let (any, mask) = match proto {
            IPPROTO_TCP => (ANY_TCP, self.tcp),
            IPPROTO_UDP => (ANY_UDP, self.udp),
            _ => return false,
        };
        self.flags & any != 0
            || self.ports[..usize::from(self.n_ports).min(NAME_PORTS)]
                .iter()
                .enumerate()
                .any(|(i, p)| *p == port && mask & (1 << i) != 0)
    }
}

/// Insert or merge an entry (see [`super::NetEnforcer::learn_name`]).
pub(super) fn learn(
    map: &mut HashMap<MapData, RawNameKey, RawNameValue>,
    counts: &mut StdHashMap<u64, usize>,
    cgroup_id: u64,
    addr: IpAddr,
    ports: &[PortGrant],
    expires: u64,
) -> Result<(), NetError> {
    let key = RawNameKey::new(cgroup_id, addr);
    let old = map.get(&key, 0).ok();
    let count = counts.entry(cgroup_id).or_insert(0);
    if old.is_none() && *count >= MAX_PER_AGENT {
        return Err(NetError::Map {
            map: "net_names",
            error: format!(
                "the agent has {MAX_PER_AGENT} learnt addresses already (the per-agent cap); {addr} not added until some expire"
            ),
        });
    }
    let mut value = old.unwrap_or_default();
    value.merge(ports, expires);
    map.insert(key, value, 0).map_err(|e| NetError::Map {
        map: "net_names",
        error: e.to_string(),
    })?;
    if old.is_none() {
        *count += 1;
    }
    Ok(())
}

/// Remove the entries for which `pred` holds; returns how many went.
pub(super) fn remove_where(
    map: &mut HashMap<MapData, RawNameKey, RawNameValue>,
    pred: impl Fn(&RawNameKey, &RawNameValue) -> bool,
) -> usize {
    let doomed: Vec<RawNameKey> = map
        .iter()
        .flatten()
        .filter(|(k, v)| pred(k, v))
        .map(|(k, _)| k)
        .collect();
    doomed.iter().filter(|k| map.remove(k).is_ok()).count()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn layouts_match_intf_h() {
        assert_eq!(std::mem::size_of::<RawNameKey>(), 32);
        assert_eq!(std::mem::size_of::<RawNameValue>(), 32);
    }

    #[test]
    fn keys_are_network_order_and_mapped_is_v4() {
        let k = RawNameKey::new(7, "198.18.0.1".parse().unwrap());
        assert_eq!(k.family, u32::from(AF_INET));
        assert_eq!(k.addr, [u32::from_ne_bytes([198, 18, 0, 1]), 0, 0, 0]);
        assert_eq!(k, RawNameKey::new(7, "::ffff:198.18.0.1".parse().unwrap()));
        let k6 = RawNameKey::new(7, "2001:db8::1".parse().unwrap());
        assert_eq!(k6.family, u32::from(AF_INET6));
        assert_eq!(k6.addr[0], u32::from_ne_bytes([0x20, 0x01, 0x0d, 0xb8]));
        assert_eq!(k6.addr[3], u32::from_ne_bytes([0, 0, 0, 1]));
    }

    #[test]
    fn checked_ports_stay_checked_until_a_plain_grant_opens_them() {
        let t = IPPROTO_TCP;
        let mut v = RawNameValue::default();
        v.merge(&[PortGrant::checked(443), PortGrant::tcp(22)], 10);
        assert!(v.allows(443, t) && v.checked(443) && !v.checked(22));
        assert!(!v.allows(443, IPPROTO_UDP));
        // The same name answered again: still checked.
        v.merge(&[PortGrant::checked(443)], 20);
        assert!(v.checked(443));
        // A plain grant of the same address and port: any content, whatever the order.
        v.merge(&[PortGrant::tcp(443)], 20);
        assert!(v.allows(443, t) && !v.checked(443));
        v.merge(&[PortGrant::checked(443)], 30);
        assert!(!v.checked(443));
        let mut w = RawNameValue::default();
        w.merge(&[PortGrant::tcp(443), PortGrant::checked(443)], 1);
        assert!(!w.checked(443));
        let mut x = RawNameValue::default();
        x.merge(&[PortGrant::checked(80), PortGrant::tcp(0)], 1);
        assert!(!x.checked(80), "NAME:* opens every port without a check");
    }

    #[test]
    fn merge_joins_ports_and_protocols_and_keeps_the_later_expiry() {
        let (t, u) = (IPPROTO_TCP, IPPROTO_UDP);
        let mut v = RawNameValue::default();
        v.merge(&[PortGrant::tcp(443), PortGrant::tcp(80)], 100);
        v.merge(&[PortGrant::tcp(443), PortGrant::tcp(8443)], 50);
        assert_eq!(v.expires_ns, 100);
        assert_eq!(&v.ports[..v.n_ports as usize], &[443, 80, 8443]);
        assert!(v.allows(8443, t) && !v.allows(22, t));
        // TCP only unless declared: QUIC to 443 is refused until a udp:// grant adds it.
        assert!(!v.allows(443, u));
        v.merge(&[PortGrant::udp(443), PortGrant::udp(3478)], 0);
        assert!(v.allows(443, u) && v.allows(443, t) && v.allows(3478, u));
        assert!(!v.allows(3478, t), "a udp:// grant gives no TCP");
        assert!(!v.allows(443, 0), "another protocol: never");
        let many: Vec<PortGrant> = (1..=20).map(PortGrant::tcp).collect();
        v.merge(&many, 200);
        assert_eq!(v.n_ports as usize, NAME_PORTS);
        assert_eq!(v.expires_ns, 200);
        assert!(!v.allows(20, t), "past the cap nothing more is allowed");
        v.merge(&[PortGrant::tcp(0)], 0);
        assert!(v.allows(22, t) && !v.allows(22, u));
        v.merge(&[PortGrant::udp(0)], 0);
        assert!(v.allows(22, u));
    }
}
