//! Denials reported by the programs through the `events` ring buffer, decoded.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::Serialize;

use super::AF_INET6;

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
                3 => "sni-proxy-down",
                _ => "not-granted",
            },
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::enforce::net::AF_INET;

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
