//! The maps of the SNI/Host check: `sni_cfg` (the proxy's port, which the connect hooks send
//! a checked grant's connects to) and `sni_conns` (LRU: the sockops program's record of each
//! redirected connect, keyed by its local port and the proxy's port, read once by the proxy).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use aya::maps::{Array, HashMap, MapData};

use super::{AF_INET, AF_INET6, NetError};

/// `struct agentos_sni_key`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RawSniKey {
    pub sport: u16,
    pub dport: u16,
}

/// `struct agentos_sni_orig`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RawSniOrig {
    pub cgroup_id: u64,
    pub addr: [u32; 4],
    pub family: u16,
    pub port: u16,
    pub proxy_port: u16,
    pub _pad: u16,
}

// SAFETY: plain `#[repr(C)]` integers and arrays of them with explicit padding fields, no
// pointers: any bit pattern is valid and the layouts match `ebpf/intf.h` (sizes tested below).
unsafe impl aya::Pod for RawSniKey {}
// SAFETY: as above.
unsafe impl aya::Pod for RawSniOrig {}

pub(super) struct SniMaps {
    pub(super) conns: HashMap<MapData, RawSniKey, RawSniOrig>,
    pub(super) cfg: Array<MapData, u32>,
}

/// A redirected connect: the agent cgroup that made it and where it was going (a v4-mapped
/// destination as IPv4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SniOrig {
    pub cgroup_id: u64,
    pub dst: SocketAddr,
}

impl RawSniOrig {
    fn decode(&self) -> Option<SniOrig> {
        let ip = match self.family {
            AF_INET => IpAddr::V4(Ipv4Addr::from(self.addr[0].to_ne_bytes())),
            AF_INET6 => {
                let mut o = [0u8; 16];
                for (c, w) in o.chunks_exact_mut(4).zip(self.addr) {
                    c.copy_from_slice(&w.to_ne_bytes());
                }
                IpAddr::V6(Ipv6Addr::from(o))
            }
            _ => return None,
        };
        Some(SniOrig {
            cgroup_id: self.cgroup_id,
            dst: SocketAddr::new(ip, self.port),
        })
    }
}

pub(super) fn set_port(maps: &mut SniMaps, port: u16) -> Result<(), NetError> {
    maps.cfg
        .set(0, u32::from(port), 0)
        .map_err(|e| NetError::Map {
            map: "sni_cfg",
            error: e.to_string(),
        })
}

pub(super) fn take(maps: &mut SniMaps, sport: u16, dport: u16) -> Option<SniOrig> {
    let key = RawSniKey { sport, dport };
    let v = maps.conns.get(&key, 0).ok()?;
    let _ = maps.conns.remove(&key);
    v.decode()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn layouts_match_intf_h_and_decode() {
        assert_eq!(std::mem::size_of::<RawSniKey>(), 4);
        assert_eq!(std::mem::size_of::<RawSniOrig>(), 32);
        let v4 = RawSniOrig {
            cgroup_id: 9,
            addr: [u32::from_ne_bytes([198, 18, 0, 10]), 0, 0, 0],
            family: AF_INET,
            port: 443,
            proxy_port: 4000,
            _pad: 0,
        };
        assert_eq!(
            v4.decode(),
            Some(SniOrig {
                cgroup_id: 9,
                dst: "198.18.0.10:443".parse().unwrap()
            })
        );
        let mut v6 = v4;
        v6.family = AF_INET6;
        v6.addr = [
            u32::from_ne_bytes([0x20, 0x01, 0x0d, 0xb8]),
            0,
            0,
            u32::from_ne_bytes([0, 0, 0, 1]),
        ];
        assert_eq!(
            v6.decode().unwrap().dst,
            "[2001:db8::1]:443".parse().unwrap()
        );
        v6.family = 99;
        assert_eq!(v6.decode(), None);
    }
}
