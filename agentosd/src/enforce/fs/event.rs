//! Refusals reported by the programs through the `fs_events` ring buffer, decoded.

use serde::Serialize;

use super::policy::access_name;
use super::{
    EV_NO_PREFIX, EV_PATH_CUT, EVENT_PATH, HOOK_BPRM_CHECK, HOOK_FILE_MPROTECT, HOOK_FILE_OPEN,
    HOOK_MMAP_FILE, HOOK_SOCKET_BIND, HOOK_SOCKET_LISTEN, HOOK_UNIX_CONNECT, HOOK_UNIX_SEND,
};

/// `struct agentos_fs_event`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RawEvent {
    pub cgroup_id: u64,
    pub time_ns: u64,
    pub pid: u32,
    pub tid: u32,
    pub f_flags: u32,
    pub hook: u8,
    pub want: u8,
    pub granted: u8,
    pub flags: u8,
    pub comm: [u8; 16],
    pub path: [u8; EVENT_PATH],
}

/// One denial, decoded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Denial {
    pub cgroup_id: u64,
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    /// `open`, `execve`, `mmap`, `mprotect`, `bind`, `listen`, `connect` (a pathname Unix
    /// socket, stream or seqpacket) or `send` (a datagram, or connect() on a datagram socket).
    pub syscall: &'static str,
    /// `lsm/file_open`, `lsm/bprm_check_security`, `lsm/mmap_file`, `lsm/file_mprotect`,
    /// `lsm/socket_bind`, `lsm/socket_listen`, `lsm/unix_stream_connect` or
    /// `lsm/unix_may_send`.
    pub hook: &'static str,
    /// What the call returned: `EACCES` for files and pathname Unix sockets, `EPERM` for
    /// bind and listen.
    pub errno: i32,
    /// The file; for `bind`, `@` and the abstract socket name (bytes outside printable ASCII
    /// as `\xNN`); for `listen`, the socket's family (`inet`, `inet6`); for `connect` and
    /// `send`, the name the peer socket was bound with (as its maker gave it to bind()).
    pub path: String,
    /// The path was longer than the event holds (`path` is its start).
    pub path_cut: bool,
    /// What was asked (`read`, `write`, `read+write`, `exec`).
    pub access: String,
    /// What the longest matching granted prefix grants (`none` when no prefix matched).
    pub granted: String,
    /// The open flags (`O_*`).
    pub flags: u32,
}

impl Denial {
    pub fn decode(bytes: &[u8]) -> Option<Denial> {
        if bytes.len() < std::mem::size_of::<RawEvent>() {
            return None;
        }
        // SAFETY: the buffer holds at least size_of::<RawEvent>() bytes and RawEvent is a
        // plain-old-data #[repr(C)] struct valid for any bit pattern; read_unaligned copes with
        // the ring buffer's alignment not being guaranteed to the slice.
        let e: RawEvent = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
        let text = |b: &[u8]| {
            let end = b.iter().position(|c| *c == 0).unwrap_or(b.len());
            String::from_utf8_lossy(&b[..end]).into_owned()
        };
        let (syscall, hook) = match e.hook {
            HOOK_FILE_OPEN => ("open", "lsm/file_open"),
            HOOK_BPRM_CHECK => ("execve", "lsm/bprm_check_security"),
            HOOK_MMAP_FILE => ("mmap", "lsm/mmap_file"),
            HOOK_FILE_MPROTECT => ("mprotect", "lsm/file_mprotect"),
            HOOK_SOCKET_BIND => ("bind", "lsm/socket_bind"),
            HOOK_SOCKET_LISTEN => ("listen", "lsm/socket_listen"),
            HOOK_UNIX_CONNECT => ("connect", "lsm/unix_stream_connect"),
            HOOK_UNIX_SEND => ("send", "lsm/unix_may_send"),
            _ => return None,
        };
        let unix = matches!(e.hook, HOOK_UNIX_CONNECT | HOOK_UNIX_SEND);
        let socket = matches!(e.hook, HOOK_SOCKET_BIND | HOOK_SOCKET_LISTEN);
        let path = match e.hook {
            HOOK_SOCKET_BIND => {
                let n = (e.f_flags as usize).min(EVENT_PATH - 1);
                format!("@{}", escape_name(&e.path[1..=n]))
            }
            HOOK_SOCKET_LISTEN => match e.f_flags {
                2 => "inet".into(),
                10 => "inet6".into(),
                f => format!("family {f}"),
            },
            // The hook has no path (bpf_d_path is not allowed there): every file mapping
            // made executable by mprotect is refused.
            HOOK_FILE_MPROTECT => "(a file mapping; mprotect has no path)".into(),
            _ if unix => escape_name(text(&e.path).as_bytes()),
            _ => text(&e.path),
        };
        Some(Denial {
            cgroup_id: e.cgroup_id,
            pid: e.pid,
            tid: e.tid,
            comm: text(&e.comm),
            syscall,
            hook,
            errno: if socket { libc::EPERM } else { libc::EACCES },
            path,
            path_cut: e.flags & EV_PATH_CUT != 0,
            access: match e.hook {
                HOOK_SOCKET_BIND | HOOK_SOCKET_LISTEN | HOOK_UNIX_CONNECT | HOOK_UNIX_SEND => {
                    syscall.into()
                }
                HOOK_FILE_MPROTECT => "exec".into(),
                _ => access_name(e.want),
            },
            granted: if e.hook == HOOK_FILE_MPROTECT {
                "unchecked".into()
            } else if unix {
                "none (not its own, not beneath its grants)".into()
            } else if e.flags & EV_NO_PREFIX != 0 {
                "none".into()
            } else {
                access_name(e.granted)
            },
            flags: e.f_flags,
        })
    }
}

/// An abstract socket name as text: printable ASCII as is (but `\\`), every other byte (NULs
/// included: they are part of the name) as `\xNN`.
fn escape_name(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for &b in bytes {
        if (b.is_ascii_graphic() && b != b'\\') || b == b' ' {
            out.push(b as char);
        } else {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::enforce::fs::{EXEC, READ, WRITE};

    fn as_bytes(e: &RawEvent) -> Vec<u8> {
        // SAFETY: RawEvent is plain old data; viewing it as bytes is sound.
        unsafe {
            std::slice::from_raw_parts(
                (e as *const RawEvent).cast::<u8>(),
                std::mem::size_of::<RawEvent>(),
            )
        }
        .to_vec()
    }

    #[test]
    fn events_decode() {
        let mut e = RawEvent {
            cgroup_id: 42,
            time_ns: 1,
            pid: 7,
            tid: 8,
            f_flags: 0o1,
            hook: HOOK_FILE_OPEN,
            want: WRITE,
            granted: READ,
            flags: 0,
            comm: [0; 16],
            path: [0; EVENT_PATH],
        };
        e.comm[..3].copy_from_slice(b"cat");
        e.path[..11].copy_from_slice(b"/srv/x/file");
        // SAFETY: RawEvent is plain old data; viewing it as bytes is sound.
        let bytes = unsafe {
            std::slice::from_raw_parts(
                (&e as *const RawEvent).cast::<u8>(),
                std::mem::size_of::<RawEvent>(),
            )
        };
        let d = Denial::decode(bytes).unwrap();
        assert_eq!(
            (d.hook, d.syscall, d.path.as_str(), d.comm.as_str()),
            ("lsm/file_open", "open", "/srv/x/file", "cat")
        );
        assert_eq!((d.access.as_str(), d.granted.as_str()), ("write", "read"));
        assert_eq!((d.pid, d.tid, d.flags, d.path_cut), (7, 8, 1, false));
        e.hook = 6;
        e.want = EXEC;
        e.flags = EV_NO_PREFIX | EV_PATH_CUT;
        // SAFETY: as above.
        let bytes = unsafe {
            std::slice::from_raw_parts(
                (&e as *const RawEvent).cast::<u8>(),
                std::mem::size_of::<RawEvent>(),
            )
        };
        let d = Denial::decode(bytes).unwrap();
        assert_eq!((d.hook, d.syscall), ("lsm/bprm_check_security", "execve"));
        assert_eq!((d.access.as_str(), d.granted.as_str()), ("exec", "none"));
        assert!(d.path_cut);
        assert_eq!(d.errno, libc::EACCES);
        assert!(Denial::decode(&bytes[..10]).is_none());
    }

    #[test]
    fn socket_refusals_decode_with_eperm_and_an_escaped_name() {
        let mut e = RawEvent {
            cgroup_id: 42,
            time_ns: 1,
            pid: 7,
            tid: 8,
            f_flags: 6, // bytes of the abstract name
            hook: HOOK_SOCKET_BIND,
            want: 0,
            granted: 0,
            flags: EV_NO_PREFIX,
            comm: [0; 16],
            path: [0; EVENT_PATH],
        };
        e.path[..7].copy_from_slice(b"@db\0\n\\s");
        let d = Denial::decode(&as_bytes(&e)).unwrap();
        assert_eq!(
            (d.syscall, d.hook, d.errno, d.access.as_str()),
            ("bind", "lsm/socket_bind", libc::EPERM, "bind")
        );
        // A NUL inside the name is part of it, and an agent's control bytes stay escaped.
        assert_eq!(d.path, "@db\\x00\\x0a\\x5cs");
        e.hook = HOOK_SOCKET_LISTEN;
        e.f_flags = 10;
        let d = Denial::decode(&as_bytes(&e)).unwrap();
        assert_eq!(
            (d.syscall, d.hook, d.errno, d.path.as_str()),
            ("listen", "lsm/socket_listen", libc::EPERM, "inet6")
        );
        e.hook = 12; // a network hook's number never decodes as a filesystem denial
        assert!(Denial::decode(&as_bytes(&e)).is_none());
    }

    #[test]
    fn unix_socket_refusals_decode_with_eacces_and_the_peer_name() {
        let mut e = RawEvent {
            cgroup_id: 42,
            time_ns: 1,
            pid: 7,
            tid: 8,
            f_flags: 1, // SOCK_STREAM
            hook: HOOK_UNIX_CONNECT,
            want: 0,
            granted: 0,
            flags: EV_NO_PREFIX,
            comm: [0; 16],
            path: [0; EVENT_PATH],
        };
        e.path[..27].copy_from_slice(b"/run/dbus/system_bus_socket");
        let d = Denial::decode(&as_bytes(&e)).unwrap();
        assert_eq!(
            (d.syscall, d.hook, d.errno, d.access.as_str()),
            (
                "connect",
                "lsm/unix_stream_connect",
                libc::EACCES,
                "connect"
            )
        );
        assert_eq!(d.path, "/run/dbus/system_bus_socket");
        assert!(d.granted.starts_with("none"), "{}", d.granted);
        e.hook = HOOK_UNIX_SEND;
        e.f_flags = 2;
        // A name is what another process chose: control bytes stay escaped.
        e.path[..27].fill(0);
        e.path[..8].copy_from_slice(b"/dev/l\nx");
        let d = Denial::decode(&as_bytes(&e)).unwrap();
        assert_eq!(
            (d.syscall, d.hook, d.errno, d.access.as_str()),
            ("send", "lsm/unix_may_send", libc::EACCES, "send")
        );
        assert_eq!(d.path, "/dev/l\\x0ax");
        e.hook = 17;
        assert!(Denial::decode(&as_bytes(&e)).is_none());
    }
}
