//! The model gateway on a loopback TCP port, for clients that only speak TCP (the usual SDKs with
//! `OPENAI_BASE_URL`), without giving an agent any way out:
//!
//! An agent without network grants runs in a network namespace of its own. For an agent the
//! gateway serves, the daemon makes that namespace itself before the agent exists: a short-lived
//! thread `unshare(CLONE_NEWNET)`s, brings its loopback up, listens on `127.0.0.1:`[`TCP_PORT`]
//! there and keeps a descriptor of the namespace; the agent's first process joins it with
//! `setns` (spawn.rs) instead of making a new one. The namespace has no other interface, so the
//! only peers that can reach the listener are processes in it: the agent's own (nobody else can
//! join without CAP_SYS_ADMIN). The sandbox lets the agent make inet stream sockets and connect
//! to that one port (seccomp, Landlock's TCP rules, the cgroup BPF policy), nothing else.
//!
//! After a daemon restart the namespace lives on with the agent; the new daemon listens in it
//! again by entering it through the agent's pidfd.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// The gateway's port on the loopback of an agent's own network namespace.
pub const TCP_PORT: u16 = 8080;

/// The URL an agent's SDK gets as `OPENAI_BASE_URL`.
pub fn base_url() -> String {
    format!("http://127.0.0.1:{TCP_PORT}/v1")
}

fn last(what: &'static str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// Brings `lo` up in the calling thread's network namespace.
fn loopback_up() -> io::Result<()> {
    // SAFETY: socket(2) with constant arguments; the fd is owned below.
    let s = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if s < 0 {
        return Err(last("socket for SIOCSIFFLAGS"));
    }
    // SAFETY: `s` is a new descriptor we own.
    let s = unsafe { OwnedFd::from_raw_fd(s) };
    // SAFETY: ifreq is plain data; zeroed is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, b) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *d = *b as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS/SIOCSIFFLAGS read and write `req`, a valid ifreq naming "lo".
    unsafe {
        if libc::ioctl(s.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) != 0 {
            return Err(last("SIOCGIFFLAGS lo"));
        }
        req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        if libc::ioctl(s.as_raw_fd(), libc::SIOCSIFFLAGS, &req) != 0 {
            return Err(last("SIOCSIFFLAGS lo up"));
        }
    }
    Ok(())
}

/// A TCP socket listening on 127.0.0.1:[`TCP_PORT`] in the calling thread's network namespace.
fn listen_loopback() -> io::Result<std::net::TcpListener> {
    let l = std::net::TcpListener::bind(("127.0.0.1", TCP_PORT))
        .map_err(|e| io::Error::new(e.kind(), format!("bind 127.0.0.1:{TCP_PORT}: {e}")))?;
    l.set_nonblocking(true)?;
    Ok(l)
}

/// Runs `f` on a thread of its own and returns what it returned: namespace changes stay on that
/// thread, which ends with `f`.
fn on_own_thread<T: Send + 'static>(
    f: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    std::thread::Builder::new()
        .name("agentosd-netns".into())
        .spawn(f)?
        .join()
        .map_err(|_| io::Error::other("the network namespace thread panicked"))?
}

/// A new network namespace with its loopback up and the gateway listening in it: the namespace
/// (for the agent's `setns`) and the listener.
pub fn new_namespace() -> io::Result<(OwnedFd, std::net::TcpListener)> {
    on_own_thread(|| {
        // SAFETY: unshare(2) with a constant flag; it changes only this thread's namespace.
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
            return Err(last("unshare(CLONE_NEWNET)"));
        }
        loopback_up()?;
        let l = listen_loopback()?;
        let ns = std::fs::File::open("/proc/thread-self/ns/net")
            .map_err(|e| io::Error::new(e.kind(), format!("/proc/thread-self/ns/net: {e}")))?;
        Ok((OwnedFd::from(ns), l))
    })
}

/// The gateway listening again in the network namespace of the process `pidfd` (a re-adopted
/// agent).
pub fn listen_in(pidfd: &OwnedFd) -> io::Result<std::net::TcpListener> {
    let fd = pidfd.try_clone()?;
    on_own_thread(move || {
        // SAFETY: setns(2) on a pidfd we own, joining only its network namespace; it changes
        // only this thread.
        if unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(last("setns(pidfd, CLONE_NEWNET)"));
        }
        listen_loopback()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_namespace_has_its_own_loopback_with_only_the_gateway() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("SKIPPED: needs root (unshare CLONE_NEWNET)");
            return;
        }
        let (ns, l) = new_namespace().unwrap();
        assert_eq!(l.local_addr().unwrap().port(), TCP_PORT);
        // In the namespace, the listener answers (the host's 127.0.0.1:8080 is another place).
        let ns2 = ns.try_clone().unwrap();
        let ok = on_own_thread(move || {
            // SAFETY: setns on a namespace fd we own, this thread only.
            if unsafe { libc::setns(ns2.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(last("setns"));
            }
            std::net::TcpStream::connect(("127.0.0.1", TCP_PORT)).map(|_| ())
        });
        assert!(ok.is_ok(), "{ok:?}");
        l.set_nonblocking(false).unwrap();
        assert!(l.accept().is_ok());
    }
}
