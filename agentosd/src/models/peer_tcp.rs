//! Who is on the other end of a loopback TCP connection, from the kernel: the connecting
//! socket's cgroup and owner, by `sock_diag` (`NETLINK_SOCK_DIAG`, `SOCK_DIAG_BY_FAMILY`, an
//! exact lookup by the connection's addresses and ports; the `INET_DIAG_CGROUP_ID` attribute,
//! Linux 5.7, is the cgroup of the process that made the socket). Used for the model gateway's
//! port in the host's network namespace (agents with network grants), where any local process
//! could connect: a peer whose socket was not made in the agent's cgroup is refused, as on the
//! agent's Unix socket.

use std::io;
use std::net::SocketAddrV4;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

const INET_DIAG_CGROUP_ID: u16 = 21;
const SOCK_DIAG_BY_FAMILY: u16 = 20;

#[repr(C)]
#[derive(Clone, Copy)]
struct SockId {
    sport: u16,
    dport: u16,
    src: [u32; 4],
    dst: [u32; 4],
    ifindex: u32,
    cookie: [u32; 2],
}

#[repr(C)]
#[derive(Clone, Copy)]
struct ReqV2 {
    family: u8,
    protocol: u8,
    ext: u8,
    pad: u8,
    states: u32,
    id: SockId,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct Request {
    nl: libc::nlmsghdr,
    req: ReqV2,
}

/// The connecting socket of the connection `peer` → `local`: its cgroup id and owner uid.
pub fn peer_of(peer: SocketAddrV4, local: SocketAddrV4) -> io::Result<(u64, u32)> {
    // SAFETY: socket(2) with constant arguments; the fd is owned below.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            libc::NETLINK_SOCK_DIAG,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let req = Request {
        nl: libc::nlmsghdr {
            nlmsg_len: std::mem::size_of::<Request>() as u32,
            nlmsg_type: SOCK_DIAG_BY_FAMILY,
            nlmsg_flags: libc::NLM_F_REQUEST as u16,
            nlmsg_seq: 1,
            nlmsg_pid: 0,
        },
        req: ReqV2 {
            family: libc::AF_INET as u8,
            protocol: libc::IPPROTO_TCP as u8,
            ext: 0,
            pad: 0,
            states: !0,
            // The connecting socket: its source is the peer.
            id: SockId {
                sport: peer.port().to_be(),
                dport: local.port().to_be(),
                src: [u32::from_ne_bytes(peer.ip().octets()), 0, 0, 0],
                dst: [u32::from_ne_bytes(local.ip().octets()), 0, 0, 0],
                ifindex: 0,
                cookie: [!0, !0],
            },
        },
    };
    // SAFETY: `req` is a plain repr(C) value of the length we pass; the kernel reads it.
    let n = unsafe {
        libc::send(
            fd.as_raw_fd(),
            &req as *const Request as *const libc::c_void,
            std::mem::size_of::<Request>(),
            0,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut buf = [0u8; 8192];
    // SAFETY: `buf` is ours and as long as we say.
    let n = unsafe {
        libc::recv(
            fd.as_raw_fd(),
            buf.as_mut_ptr() as *mut libc::c_void,
            buf.len(),
            0,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    parse(&buf[..n as usize])
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// The answer: one `inet_diag_msg` with its attributes, or an error message.
fn parse(b: &[u8]) -> io::Result<(u64, u32)> {
    let bad = || io::Error::other("sock_diag: a malformed answer");
    let len = u32_at(b, 0).ok_or_else(bad)? as usize;
    let kind = u16_at(b, 4).ok_or_else(bad)?;
    if kind == libc::NLMSG_ERROR as u16 {
        let errno = u32_at(b, 16).ok_or_else(bad)? as i32;
        return Err(io::Error::from_raw_os_error(-errno));
    }
    let hdr = std::mem::size_of::<libc::nlmsghdr>();
    // inet_diag_msg: 4 bytes, the 48-byte id, then expires, rqueue, wqueue, uid, inode.
    let msg = hdr;
    let uid = u32_at(b, msg + 4 + 48 + 12).ok_or_else(bad)?;
    let mut at = msg + 4 + 48 + 20;
    let end = len.min(b.len());
    while at + 4 <= end {
        let alen = u16_at(b, at).ok_or_else(bad)? as usize;
        let atype = u16_at(b, at + 2).ok_or_else(bad)?;
        if alen < 4 {
            return Err(bad());
        }
        if atype == INET_DIAG_CGROUP_ID && alen >= 12 {
            let id = u64::from_ne_bytes(
                b.get(at + 4..at + 12)
                    .ok_or_else(bad)?
                    .try_into()
                    .map_err(|_| bad())?,
            );
            return Ok((id, uid));
        }
        at += (alen + 3) & !3;
    }
    Err(io::Error::other(
        "sock_diag: no INET_DIAG_CGROUP_ID in the answer (needs Linux 5.7 with cgroup socket data)",
    ))
}

/// The cgroup ids (inode numbers) of `dir` and every cgroup below it, at most `max`.
pub fn cgroup_ids(dir: &Path, max: usize) -> Vec<u64> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        if out.len() >= max {
            break;
        }
        let Ok(md) = std::fs::symlink_metadata(&d) else {
            continue;
        };
        out.push(md.ino());
        if let Ok(rd) = std::fs::read_dir(&d) {
            for e in rd.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    todo.push(e.path());
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loopback_peer_is_found_with_its_cgroup_and_owner() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("SKIPPED: sock_diag lookups of other sockets need root here");
        }
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, peer) = l.accept().unwrap();
        let (std::net::SocketAddr::V4(peer), std::net::SocketAddr::V4(local)) =
            (peer, s.local_addr().unwrap())
        else {
            panic!("not IPv4");
        };
        let (id, uid) = peer_of(peer, local).unwrap();
        // This process's cgroup is the one the connecting socket was made in.
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        let rel = own.lines().find_map(|l| l.strip_prefix("0::")).unwrap();
        if let Some(mount) = crate::cgroup::cgroup2_mount() {
            let dir = mount.join(rel.trim_start_matches('/'));
            assert_eq!(id, std::fs::metadata(dir).unwrap().ino());
        }
        // SAFETY: geteuid has no preconditions.
        assert_eq!(uid, unsafe { libc::geteuid() });
        drop(c);
    }

    #[test]
    fn errors_and_garbage_are_errors() {
        let mut err = vec![0u8; 36];
        err[0..4].copy_from_slice(&36u32.to_ne_bytes());
        err[4..6].copy_from_slice(&(libc::NLMSG_ERROR as u16).to_ne_bytes());
        err[16..20].copy_from_slice(&(-libc::ENOENT).to_ne_bytes());
        assert_eq!(parse(&err).unwrap_err().raw_os_error(), Some(libc::ENOENT));
        assert!(parse(&[1, 2, 3]).is_err());
        let mut short = vec![0u8; 100];
        short[0..4].copy_from_slice(&100u32.to_ne_bytes());
        assert!(parse(&short).is_err());
    }
}
