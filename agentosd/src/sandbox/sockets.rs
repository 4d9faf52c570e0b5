//! The socket broker: an agent with network grants lives in a network namespace of its own, and
//! gets its inet and route-netlink sockets made in the host's.
//!
//! Abstract Unix socket names belong to the network namespace of the socket. An agent in the
//! host's namespace can bind a name a host service uses before that service does (its clients'
//! datagrams and connections then reach the agent), and only BPF LSM (`lsm/socket_bind`) could
//! refuse that bind; kernels with lockdown refuse BPF LSM. So every agent gets its own network
//! namespace (`CLONE_NEWNET`), where its abstract names are its own; an agent with `net.connect`
//! or `net.bind` additionally gets a **broker**:
//!
//! - its last seccomp filter returns `SECCOMP_RET_USER_NOTIF` for `socket()` of `AF_INET`,
//!   `AF_INET6` and `AF_NETLINK` (the deny-list decides first: a family, type or protocol the
//!   contract does not allow still fails with its errno, `ERRNO` outranks `USER_NOTIF`);
//! - the child hands the filter's listener to the daemon over a socket pair (`SCM_RIGHTS`)
//!   before it execs, and the daemon starts the broker: a process cloned from the daemon into
//!   the agent's own cgroup, in the host's network namespace, with the agent's uid and gid, no
//!   capabilities, `no_new_privs`, not dumpable; it never execs, allocates nothing and makes only
//!   the system calls of [`broker_loop`];
//! - for each notification the broker makes the same `socket(family, type, protocol)` itself and
//!   puts it into the agent's fd table as the call's result (`SECCOMP_IOCTL_NOTIF_ADDFD` with
//!   `SECCOMP_ADDFD_FLAG_SEND`). The arguments are registers, not memory, so there is nothing
//!   the agent can change between the check and the use.
//!
//! A socket belongs to the cgroup and network namespace of the task that created it: the
//! broker's sockets are in the host's namespace and in the agent's cgroup, so the cgroup BPF
//! network policy (keyed by that cgroup) and Landlock's TCP rules (checked against the task that
//! calls `connect`/`bind`: the agent) hold on them exactly as on sockets the agent made itself.
//! The broker does not depend on the daemon: it keeps serving while agentosd restarts, and ends
//! when the last process under the filter is gone (the listener reports `POLLHUP`), or with the
//! agent's cgroup. The agent cannot signal or trace it (Landlock's scoping and ptrace rules:
//! the broker is outside its domain; seccomp refuses `ptrace` and `process_vm_*`).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use crate::sys::SyscallError;
use crate::sys::clone::{CLONE_INTO_CGROUP, CLONE_PIDFD, CloneArgs, clone3};
use crate::sys::seccomp::{SECCOMP_RET_ALLOW, SECCOMP_RET_USER_NOTIF};

/// Child stage: installing the notifying filter or handing its listener to the daemon.
pub const STAGE_BROKER: i32 = 19;

const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
const AF_NETLINK: u32 = libc::AF_NETLINK as u32;
const NETLINK_ROUTE: u32 = libc::NETLINK_ROUTE as u32;
const SOCK_TYPE_MASK: u32 = 0xf;

/// What the broker makes: the families the notifying filter sends it, with the types and
/// protocols the deny-list lets through for a contract with network grants (TCP and UDP over
/// IPv4 and IPv6, route netlink). Anything else is answered `EAFNOSUPPORT` (the deny-list
/// refused it already; this is the broker's own check of what reaches it).
pub fn brokered(family: u32, ty: u32, proto: u32) -> bool {
    let base = ty & SOCK_TYPE_MASK;
    let flags = ty & !SOCK_TYPE_MASK;
    if flags & !((libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK) as u32) != 0 {
        return false;
    }
    match family as i32 {
        libc::AF_INET | libc::AF_INET6 => match base as i32 {
            libc::SOCK_STREAM => proto == 0 || proto == libc::IPPROTO_TCP as u32,
            libc::SOCK_DGRAM => proto == 0 || proto == libc::IPPROTO_UDP as u32,
            _ => false,
        },
        libc::AF_NETLINK => {
            proto == NETLINK_ROUTE
                && (base == libc::SOCK_RAW as u32 || base == libc::SOCK_DGRAM as u32)
        }
        _ => false,
    }
}

fn stmt(code: u32, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jeq(k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter {
        code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
        jt,
        jf,
        k,
    }
}

/// The notifying filter: `socket()` of `AF_INET`, `AF_INET6` or `AF_NETLINK` on x86-64 →
/// `SECCOMP_RET_USER_NOTIF`; everything else `ALLOW` (the other filters decide it).
pub fn notify_filter() -> Vec<libc::sock_filter> {
    let ld = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
    let ret = libc::BPF_RET | libc::BPF_K;
    vec![
        stmt(ld, 4), // arch
        jeq(AUDIT_ARCH_X86_64, 0, 6),
        stmt(ld, 0), // nr
        jeq(libc::SYS_socket as u32, 0, 4),
        stmt(ld, 16), // args[0], low 32 bits
        jeq(libc::AF_INET as u32, 3, 0),
        jeq(libc::AF_INET6 as u32, 2, 0),
        jeq(AF_NETLINK, 1, 0),
        stmt(ret, SECCOMP_RET_ALLOW),
        stmt(ret, SECCOMP_RET_USER_NOTIF),
    ]
}

/// A connected pair: the child's end (it sends the listener) and the daemon's (it receives).
pub fn handover_pair() -> Result<(OwnedFd, OwnedFd), SyscallError> {
    let mut fds = [-1; 2];
    // SAFETY: socketpair writes two fds into the live array.
    let rc = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(SyscallError::new(
            "socketpair",
            "AF_UNIX SOCK_SEQPACKET (socket broker hand-over)",
            io::Error::last_os_error(),
        ));
    }
    // SAFETY: socketpair succeeded: both fds are new and ours.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Space for one `SCM_RIGHTS` message of one fd (`CMSG_SPACE(sizeof(int))` = 24 on 64-bit),
/// aligned for `cmsghdr`.
#[repr(C, align(8))]
struct CmsgBuf([u8; 32]);

/// An iovec over `byte`.
fn one_byte(byte: &mut [u8; 1]) -> libc::iovec {
    libc::iovec {
        iov_base: byte.as_mut_ptr() as *mut libc::c_void,
        iov_len: 1,
    }
}

/// A msghdr carrying `iov` and the first `controllen` bytes of `cbuf` (no allocation: the
/// child between clone3 and execve uses it too). The caller keeps both alive while it is used.
fn one_byte_msg(iov: &mut libc::iovec, cbuf: &mut CmsgBuf, controllen: usize) -> libc::msghdr {
    // SAFETY: msghdr is plain data; zero is a valid value of every field.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.0.as_mut_ptr() as *mut libc::c_void;
    msg.msg_controllen = controllen.min(cbuf.0.len());
    msg
}

/// In the child, after its other filters: install the notifying filter with a new listener,
/// send the listener over `sock`, close it. Returns 0 or -1 with `errno` set.
///
/// # Safety
/// Call only in a child between clone3 and execve, after `PR_SET_NO_NEW_PRIVS`; `prog` must be
/// the [`notify_filter`] built before the clone. Async-signal-safe: no allocation.
pub unsafe fn hand_over_listener(sock: RawFd, prog: &[libc::sock_filter]) -> libc::c_int {
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: `fprog` describes `prog`, alive for the call; see the function's contract.
    let listener = unsafe {
        crate::sys::seccomp::set_mode_filter(
            libc::SECCOMP_FILTER_FLAG_NEW_LISTENER as libc::c_uint,
            &fprog,
        )
    };
    if listener < 0 {
        return -1;
    }
    let listener = listener as RawFd;
    let mut byte = [0u8; 1];
    let mut iov = one_byte(&mut byte);
    let mut cbuf = CmsgBuf([0; 32]);
    // SAFETY: CMSG_SPACE is arithmetic.
    let msg = one_byte_msg(&mut iov, &mut cbuf, unsafe { libc::CMSG_SPACE(4) } as usize);
    // SAFETY: the control buffer is at least CMSG_SPACE(4) bytes and aligned for cmsghdr, so
    // the first header and its 4 data bytes lie inside it.
    let rc = unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(4) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut RawFd, listener);
        libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL)
    };
    // SAFETY: the listener is ours; once sent, the daemon's copy keeps it alive.
    unsafe { libc::close(listener) };
    if rc == 1 { 0 } else { -1 }
}

/// In the daemon, after the child exec'd: the listener it sent on `sock`.
pub fn receive_listener(sock: BorrowedFd<'_>) -> Result<OwnedFd, SyscallError> {
    let mut byte = [0u8; 1];
    let mut iov = one_byte(&mut byte);
    let mut cbuf = CmsgBuf([0; 32]);
    let mut msg = one_byte_msg(&mut iov, &mut cbuf, 32);
    let err = |e: io::Error| SyscallError::new("recvmsg", "the socket broker's listener", e);
    // SAFETY: recvmsg fills the buffers `msg` points at, all live locals.
    let n = unsafe {
        libc::recvmsg(
            sock.as_raw_fd(),
            &mut msg,
            libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC,
        )
    };
    if n < 0 {
        return Err(err(io::Error::last_os_error()));
    }
    // SAFETY: recvmsg set msg_controllen; CMSG_FIRSTHDR checks it before returning a header.
    let c = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    let rights = !c.is_null()
        // SAFETY: a non-null header lies inside the control buffer.
        && unsafe { (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS };
    if !rights {
        return Err(err(io::Error::other("no descriptor received")));
    }
    // SAFETY: an SCM_RIGHTS header of ours carries one fd, now installed in this process.
    let fd = unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const RawFd) };
    // SAFETY: the kernel installed `fd` for us (MSG_CMSG_CLOEXEC); we own it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Start the broker for `listener` in the cgroup `cgroup_dir`, as `uid`/`gid`. Returns its
/// pidfd and PID; the caller reaps it.
pub fn spawn_broker(
    listener: &OwnedFd,
    uid: u32,
    gid: u32,
    cgroup_dir: BorrowedFd<'_>,
) -> Result<crate::spawn::Child, SyscallError> {
    let devnull = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map_err(|e| SyscallError::new("open", "/dev/null", e))?;
    let setup = BrokerSetup {
        listener: listener.as_raw_fd(),
        devnull: devnull.as_raw_fd(),
        uid,
        gid,
        last_cap: super::cap_last_cap(),
    };
    let mut pidfd: libc::c_int = -1;
    let mut args = CloneArgs {
        flags: CLONE_PIDFD | CLONE_INTO_CGROUP,
        pidfd: &mut pidfd as *mut libc::c_int as u64,
        exit_signal: libc::SIGCHLD as u64,
        cgroup: cgroup_dir.as_raw_fd() as u64,
        ..Default::default()
    };
    // SAFETY: as in spawn.rs: clone3 without CLONE_VM is a fork; the child runs only
    // `broker_main`, which makes async-signal-safe system calls on `setup` (plain integers
    // copied before the clone) and on its own stack, and never returns.
    let ret = unsafe { clone3(&mut args) };
    if ret == 0 {
        // SAFETY: we are the freshly cloned child; see above.
        unsafe { broker_main(&setup) }
    }
    if ret < 0 {
        return Err(SyscallError::new(
            "clone3",
            "CLONE_INTO_CGROUP for the socket broker",
            io::Error::last_os_error(),
        ));
    }
    // SAFETY: with CLONE_PIDFD the kernel stored a new pidfd in `pidfd`; we own it now.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    Ok(crate::spawn::Child {
        pid: ret as u32,
        pidfd,
        broker: None,
    })
}

#[derive(Clone, Copy)]
struct BrokerSetup {
    listener: RawFd,
    devnull: RawFd,
    uid: u32,
    gid: u32,
    last_cap: u32,
}

/// The broker's fd for the listener.
const LISTENER_FD: RawFd = 3;

/// Become the broker: stdio on /dev/null, the listener on fd 3 and nothing else, the agent's
/// credentials without capabilities, then [`broker_loop`]. Exits 126 if a step fails.
///
/// # Safety
/// Only in the child of clone3 (fork semantics), with `s` copied before the clone.
unsafe fn broker_main(s: &BrokerSetup) -> ! {
    // SAFETY: plain system calls on integers and on this stack; see the function's contract.
    unsafe {
        // The daemon's signal handlers (tokio's) came with the clone: back to the defaults,
        // as an exec would leave them, so a signal to the agent's cgroup ends the broker too.
        for sig in 1..libc::SIGRTMAX() {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                libc::signal(sig, libc::SIG_DFL);
            }
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        libc::setsid();
        let name = b"agentos-sockets\0";
        libc::prctl(libc::PR_SET_NAME, name.as_ptr(), 0, 0, 0);
        let ok = libc::dup2(s.listener, LISTENER_FD) == LISTENER_FD
            && libc::dup2(s.devnull, 0) == 0
            && libc::dup2(s.devnull, 1) == 1
            && libc::dup2(s.devnull, 2) == 2
            && libc::syscall(libc::SYS_close_range, LISTENER_FD + 1, u32::MAX, 0) == 0
            && crate::sys::creds::drop_groups() == 0
            && crate::sys::creds::set_gid(s.gid) == 0
            && drop_bounding_set(s.last_cap)
            && crate::sys::creds::set_uid(s.uid) == 0
            && crate::sys::creds::clear_caps() == 0
            && libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
            && libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) == 0;
        if !ok {
            libc::_exit(126);
        }
        broker_loop(LISTENER_FD)
    }
}

/// # Safety
/// Only in a single-threaded child (see `broker_main`).
unsafe fn drop_bounding_set(last_cap: u32) -> bool {
    // SAFETY: prctl on integers.
    unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        );
        for cap in 0..=last_cap {
            if libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) != 0
                && *libc::__errno_location() != libc::EINVAL
            {
                return false;
            }
        }
    }
    true
}

/// Serve `listener` until no process is left under its filter (`POLLHUP`), then exit 0.
///
/// # Safety
/// Only in the broker child: raw system calls on its own stack, no allocation.
unsafe fn broker_loop(listener: RawFd) -> ! {
    loop {
        let mut pfd = libc::pollfd {
            fd: listener,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one live pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, -1) };
        if n < 0 {
            // SAFETY: reading errno of this thread.
            if unsafe { *libc::__errno_location() } == libc::EINTR {
                continue;
            }
            // SAFETY: exiting the child.
            unsafe { libc::_exit(1) };
        }
        if pfd.revents & libc::POLLIN == 0 && pfd.revents & (libc::POLLHUP | libc::POLLERR) != 0 {
            // SAFETY: exiting the child: every process under the filter is gone.
            unsafe { libc::_exit(0) };
        }
        // SAFETY: only in the broker (this function's contract).
        unsafe { serve_one(listener) };
    }
}

/// Receive one notification and answer it: the socket made here and sent as the call's
/// result, or the error.
///
/// # Safety
/// Only in the broker child.
unsafe fn serve_one(listener: RawFd) {
    // SAFETY: seccomp_notif is plain data; the kernel requires it zeroed before RECV.
    let mut notif: libc::seccomp_notif = unsafe { std::mem::zeroed() };
    // SAFETY: RECV fills the live struct of the size the ioctl number encodes.
    if unsafe { libc::ioctl(listener, libc::SECCOMP_IOCTL_NOTIF_RECV, &mut notif) } != 0 {
        // ENOENT: the caller died or the call was interrupted; EINTR: retry from poll.
        return;
    }
    let a = notif.data.args;
    let (family, ty, proto) = (a[0] as u32, a[1] as u32, a[2] as u32);
    let errno = if notif.data.nr != libc::SYS_socket as i32 || !brokered(family, ty, proto) {
        libc::EAFNOSUPPORT
    } else {
        // SAFETY: socket() on integers; the result is ours to close.
        let s = unsafe { libc::socket(family as i32, ty as i32, proto as i32) };
        if s >= 0 {
            let cloexec = ty & libc::SOCK_CLOEXEC as u32 != 0;
            let add = libc::seccomp_notif_addfd {
                id: notif.id,
                flags: libc::SECCOMP_ADDFD_FLAG_SEND as u32,
                srcfd: s as u32,
                newfd: 0,
                newfd_flags: if cloexec { libc::O_CLOEXEC as u32 } else { 0 },
            };
            // SAFETY: ADDFD reads the live struct; on success the kernel installed a copy
            // of `s` in the caller and completed its socket() with that fd's number.
            let (rc, e) = unsafe {
                let rc = libc::ioctl(listener, libc::SECCOMP_IOCTL_NOTIF_ADDFD, &add);
                let e = *libc::__errno_location();
                libc::close(s);
                (rc, e)
            };
            // ENOENT: the caller is gone, nobody to answer. Anything else (EMFILE: the
            // caller's fd table is full) is the call's error: unanswered, it would wait forever.
            if rc >= 0 || e == libc::ENOENT {
                return;
            }
            e
        } else {
            // SAFETY: reading errno of this thread.
            unsafe { *libc::__errno_location() }
        }
    };
    let resp = libc::seccomp_notif_resp {
        id: notif.id,
        val: 0,
        error: -errno,
        flags: 0,
    };
    // SAFETY: SEND reads the live struct; failure means the caller is gone.
    unsafe { libc::ioctl(listener, libc::SECCOMP_IOCTL_NOTIF_SEND, &resp) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_broker_makes_only_tcp_udp_and_route_netlink() {
        let (inet, inet6) = (libc::AF_INET as u32, libc::AF_INET6 as u32);
        let (stream, dgram, raw) = (
            libc::SOCK_STREAM as u32,
            libc::SOCK_DGRAM as u32,
            libc::SOCK_RAW as u32,
        );
        let cloexec = libc::SOCK_CLOEXEC as u32 | libc::SOCK_NONBLOCK as u32;
        assert!(brokered(inet, stream, 0));
        assert!(brokered(inet6, stream | cloexec, libc::IPPROTO_TCP as u32));
        assert!(brokered(inet, dgram, libc::IPPROTO_UDP as u32));
        assert!(brokered(AF_NETLINK, raw | cloexec, 0));
        // MPTCP, SCTP, ICMP echo, raw, seqpacket, other netlink protocols, other families,
        // unknown type flags.
        assert!(!brokered(inet, stream, 262));
        assert!(!brokered(inet6, stream, 132));
        assert!(!brokered(inet, dgram, libc::IPPROTO_ICMP as u32));
        assert!(!brokered(inet, raw, 0));
        assert!(!brokered(inet, libc::SOCK_SEQPACKET as u32, 0));
        assert!(!brokered(AF_NETLINK, raw, libc::NETLINK_AUDIT as u32));
        assert!(!brokered(libc::AF_PACKET as u32, raw, 0));
        assert!(!brokered(libc::AF_UNIX as u32, stream, 0));
        assert!(!brokered(inet, stream | 0x100, 0));
    }

    #[test]
    fn route_netlink_only_as_raw_or_datagram() {
        let nl = AF_NETLINK;
        assert!(brokered(nl, libc::SOCK_DGRAM as u32, 0));
        assert!(brokered(nl, libc::SOCK_RAW as u32, 0));
        assert!(!brokered(nl, libc::SOCK_STREAM as u32, 0));
        assert!(!brokered(nl, libc::SOCK_SEQPACKET as u32, 0));
    }

    /// Send one byte on `sock`, with `fd` as SCM_RIGHTS when given (as the child does).
    fn send(sock: RawFd, fd: Option<RawFd>) {
        let mut byte = [7u8; 1];
        let mut iov = one_byte(&mut byte);
        let mut cbuf = CmsgBuf([0; 32]);
        // SAFETY: CMSG_SPACE is arithmetic.
        let space = fd.map_or(0, |_| unsafe { libc::CMSG_SPACE(4) } as usize);
        let mut msg = one_byte_msg(&mut iov, &mut cbuf, space);
        if space == 0 {
            msg.msg_control = std::ptr::null_mut();
        }
        // SAFETY: with a descriptor, the control buffer holds one header and its 4 data bytes
        // (as in hand_over_listener); `msg` points at live locals.
        let rc = unsafe {
            if let Some(fd) = fd {
                let c = libc::CMSG_FIRSTHDR(&msg);
                (*c).cmsg_level = libc::SOL_SOCKET;
                (*c).cmsg_type = libc::SCM_RIGHTS;
                (*c).cmsg_len = libc::CMSG_LEN(4) as usize;
                std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut RawFd, fd);
            }
            libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL)
        };
        assert_eq!(rc, 1, "sendmsg: {}", io::Error::last_os_error());
    }

    /// What the daemon takes from the hand-over socket: exactly a descriptor, installed
    /// close-on-exec; nothing there yet is EAGAIN at once (never a wait); a message without a
    /// descriptor, one with another control message, or the child gone is an error.
    #[test]
    fn the_hand_over_takes_a_descriptor_and_nothing_else() {
        use std::os::fd::AsFd;
        let fstat = |fd: RawFd| {
            // SAFETY: fstat fills the zeroed stat of a live local.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: see above.
            assert_eq!(unsafe { libc::fstat(fd, &mut st) }, 0);
            (st.st_dev, st.st_ino)
        };
        let (child, daemon) = handover_pair().unwrap();
        let file = std::fs::File::open("/proc/self/exe").unwrap();
        send(child.as_raw_fd(), Some(file.as_raw_fd()));
        let got = receive_listener(daemon.as_fd()).unwrap();
        assert_eq!(fstat(got.as_raw_fd()), fstat(file.as_raw_fd()));
        // SAFETY: F_GETFD on a descriptor we own.
        let fdflags = unsafe { libc::fcntl(got.as_raw_fd(), libc::F_GETFD) };
        assert_eq!(
            fdflags & libc::FD_CLOEXEC,
            libc::FD_CLOEXEC,
            "close-on-exec"
        );
        // Nothing sent yet: EAGAIN, not a wait.
        let e = receive_listener(daemon.as_fd()).unwrap_err();
        assert_eq!(e.errno(), Some(libc::EAGAIN), "{e}");
        // A byte without a descriptor.
        send(child.as_raw_fd(), None);
        let e = receive_listener(daemon.as_fd()).unwrap_err();
        assert!(e.to_string().contains("no descriptor received"), "{e}");
        // Another control message of SOL_SOCKET (the credentials SO_PASSCRED adds).
        let on: libc::c_int = 1;
        // SAFETY: setsockopt reads the live int.
        let rc = unsafe {
            libc::setsockopt(
                daemon.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PASSCRED,
                (&on as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(rc, 0);
        send(child.as_raw_fd(), None);
        let e = receive_listener(daemon.as_fd()).unwrap_err();
        assert!(e.to_string().contains("no descriptor received"), "{e}");
        // The child gone without sending. (Shut down rather than closed: a test forking beside
        // this one may hold a copy of the descriptor for a moment.)
        // SAFETY: shutdown on a socket we own.
        let rc = unsafe { libc::shutdown(child.as_raw_fd(), libc::SHUT_WR) };
        assert_eq!(rc, 0);
        let e = receive_listener(daemon.as_fd()).unwrap_err();
        assert!(e.to_string().contains("no descriptor received"), "{e}");
        assert_eq!(e.errno(), None, "{e}");
    }

    /// The broker is a child the daemon reaps through its pidfd like any other (SIGCHLD its
    /// exit signal: without one, waitid would not see it and it would stay a zombie), and a
    /// clone3 that fails is an error, not a child. The broker here gets a pipe whose writer is
    /// gone as its listener (what it sees when the agent's last process is gone) and exits.
    #[test]
    fn a_broker_is_reaped_through_its_pidfd_and_a_failed_clone_is_an_error() {
        use std::os::fd::AsFd;
        let mut p = [-1; 2];
        // SAFETY: pipe2 writes two fds into the live array.
        assert_eq!(unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: both are new fds of ours.
        let (listener, writer) =
            unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) };
        drop(writer);
        // Not a cgroup directory: clone3 fails.
        let not_cgroup = std::fs::File::open("/dev/null").unwrap();
        match spawn_broker(&listener, 65534, 65534, not_cgroup.as_fd()) {
            Err(e) => assert_eq!(e.call, "clone3", "{e}"),
            Ok(c) => panic!("clone3 into /dev/null made child {}", c.pid),
        }
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("SKIPPED the broker's reaping: needs root (the broker takes uid 65534)");
            return;
        }
        let Some(dir) = crate::cgroup::open_own_cgroup2() else {
            eprintln!("SKIPPED the broker's reaping: no cgroup2 cgroup of its own to clone into");
            return;
        };
        let child = spawn_broker(&listener, 65534, 65534, dir.as_fd()).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let status = loop {
            match crate::sys::pidfd_try_wait(child.pidfd.as_fd()).unwrap() {
                Some(s) => break s,
                None => {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "the broker did not end"
                    );
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
            }
        };
        assert_eq!(status, crate::sys::ExitStatus::Exited(0));
        assert!(
            !std::path::Path::new(&format!("/proc/{}", child.pid)).exists(),
            "the broker {} was not reaped",
            child.pid
        );
    }

    /// The notifying filter's decisions, by interpreting the small subset of classic BPF it
    /// uses (the kernel runs it in tests/sockets.rs and the escape suite).
    #[test]
    fn the_filter_notifies_exactly_socket_of_inet_inet6_and_netlink() {
        let prog = notify_filter();
        let run = |arch: u32, nr: u32, a0: u32| -> u32 {
            let mut acc = 0u32;
            let mut pc = 0usize;
            loop {
                let i = prog[pc];
                let code = i.code as u32;
                if code == libc::BPF_LD | libc::BPF_W | libc::BPF_ABS {
                    acc = match i.k {
                        0 => nr,
                        4 => arch,
                        16 => a0,
                        k => panic!("unexpected offset {k}"),
                    };
                    pc += 1;
                } else if code == libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K {
                    pc += 1 + if acc == i.k { i.jt } else { i.jf } as usize;
                } else if code == libc::BPF_RET | libc::BPF_K {
                    return i.k;
                } else {
                    panic!("unexpected instruction {code:#x}");
                }
            }
        };
        let sock = libc::SYS_socket as u32;
        for fam in [libc::AF_INET, libc::AF_INET6, libc::AF_NETLINK] {
            assert_eq!(
                run(AUDIT_ARCH_X86_64, sock, fam as u32),
                SECCOMP_RET_USER_NOTIF
            );
        }
        for fam in [libc::AF_UNIX, libc::AF_PACKET, libc::AF_VSOCK] {
            assert_eq!(run(AUDIT_ARCH_X86_64, sock, fam as u32), SECCOMP_RET_ALLOW);
        }
        // socketpair, connect, other architectures, x32 numbers: not the broker's.
        let pair = libc::SYS_socketpair as u32;
        assert_eq!(
            run(AUDIT_ARCH_X86_64, pair, libc::AF_INET as u32),
            SECCOMP_RET_ALLOW
        );
        assert_eq!(run(0x4000_0003, sock, 2), SECCOMP_RET_ALLOW);
        assert_eq!(
            run(AUDIT_ARCH_X86_64, sock | 0x4000_0000, 2),
            SECCOMP_RET_ALLOW
        );
    }
}
