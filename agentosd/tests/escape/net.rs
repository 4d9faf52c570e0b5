//! Network attempts (issue 12, class 3): every family and direction without a grant, and the
//! routes around a grant (another host on a granted port, UDP, bind, v4-mapped IPv6, TCP fast
//! open, protocols other than TCP/UDP).
//!
//! Who refuses what (docs/security.md, "Network"):
//! - seccomp's socket rules (sandbox/seccomp.rs): without any `net.*` grant no IPv4/IPv6/netlink
//!   socket at all (`EAFNOSUPPORT`); with one, only TCP and UDP (`EPROTONOSUPPORT` for raw,
//!   MPTCP, SCTP, ICMP echo, UDP-Lite, netlink other than `NETLINK_ROUTE`); other families
//!   `EAFNOSUPPORT`; `listen()` without `net.bind` `EPERM`.
//! - cgroup BPF (ebpf/net.bpf.c): destinations and bind addresses not granted, TCP and UDP,
//!   IPv4-mapped IPv6 checked as IPv4, TCP fast open through the connect hook: `EPERM`.
//! - Landlock: TCP ports not granted (`EACCES`; it runs before the BPF connect hook).

use std::net::{
    Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, TcpListener, UdpSocket,
};

use crate::probe::{check, errno, errno_name};
use crate::{Attempt, Caps, Ctx};

/// The ports in the standard grants (`Ctx::net_caps`): connect, then bind.
fn standard_ports(ctx: &Ctx) -> (u16, u16) {
    let ports: Vec<u16> = ctx
        .net_caps
        .split("127.0.0.1:")
        .skip(1)
        .filter_map(|s| {
            s.split(|c: char| !c.is_ascii_digit())
                .next()
                .and_then(|p| p.parse().ok())
        })
        .collect();
    (ports[0], ports[1])
}

/// The attempts of this class and a fixture (listeners, files) kept alive while they run.
pub fn attempts(ctx: &Ctx) -> (Vec<Attempt>, Box<dyn std::any::Any>) {
    let (gport, bind_ok) = standard_ports(ctx);
    // An ungranted TCP port with a listener (so a connect that got through would succeed) and a
    // free one for binds; UDP needs no listener (a sendto that gets through just succeeds).
    let ungranted = TcpListener::bind("127.0.0.1:0").unwrap();
    let uport = ungranted.local_addr().unwrap().port();
    let bind_no = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let p = |v: u16| vec![v.to_string()];
    let (denied, allowed) = (Attempt::denied, Attempt::allowed);
    use Caps::{NoNet, Standard};
    let connect_only = Caps::Custom(format!(
        "{}  - net.connect: [\"127.0.0.1:{gport}\"]\n",
        ctx.fs_caps
    ));
    // Whether BPF LSM's lsm/socket_listen can be in force here (the VM): then listen() on an
    // unbound socket is refused; elsewhere that is the documented gap.
    let listen_lsm = agentosd::enforce::fs::FsEnforcer::load()
        .map(|f| f.optional_status("socket_listen").is_ok())
        .unwrap_or(false);
    if !listen_lsm {
        println!(
            "note: BPF LSM lsm/socket_listen does not load here: listen-autobind-with-bind-grant is expected to get through"
        );
    }
    let listen_autobind = if listen_lsm {
        denied("listen-autobind-with-bind-grant", vec![], "EPERM", Standard)
    } else {
        allowed("listen-autobind-with-bind-grant", vec![], Standard)
    };
    // Whatever listen() says, nobody reaches that port: cgroup_skb/ingress drops SYNs to a
    // listener on a port no net.bind grants (every host), after lsm/socket_listen (the VM).
    let autobind_reachable = denied(
        "listen-autobind-reachable",
        p(gport),
        if listen_lsm { "EPERM" } else { "ETIMEDOUT" },
        Standard,
    );
    let v = vec![
        // No network capability: seccomp refuses the socket itself.
        denied("nonet-tcp4-connect", p(uport), "EAFNOSUPPORT", NoNet),
        denied("nonet-tcp6-connect", p(uport), "EAFNOSUPPORT", NoNet),
        denied("nonet-v4mapped-connect", p(uport), "EAFNOSUPPORT", NoNet),
        denied("nonet-udp4-sendto", p(uport), "EAFNOSUPPORT", NoNet),
        denied("nonet-udp6-sendto", p(uport), "EAFNOSUPPORT", NoNet),
        denied("nonet-tcp4-bind", p(bind_no), "EAFNOSUPPORT", NoNet),
        denied("nonet-tcp6-bind", p(bind_no), "EAFNOSUPPORT", NoNet),
        denied("nonet-udp4-bind", p(bind_no), "EAFNOSUPPORT", NoNet),
        denied("nonet-udp6-bind", p(bind_no), "EAFNOSUPPORT", NoNet),
        denied("nonet-tfo-sendto", p(uport), "EAFNOSUPPORT", NoNet),
        denied("nonet-mptcp-socket", vec![], "EAFNOSUPPORT", NoNet),
        denied("nonet-sctp-socket", vec![], "EAFNOSUPPORT", NoNet),
        denied("nonet-icmp-echo-socket", vec![], "EAFNOSUPPORT", NoNet),
        denied("nonet-raw-socket", vec![], "EAFNOSUPPORT", NoNet),
        denied("nonet-packet-socket", vec![], "EAFNOSUPPORT", NoNet),
        denied("nonet-netlink-route", vec![], "EAFNOSUPPORT", NoNet),
        // listen() on a bound Unix socket (and on an unbound one, which would autobind an inet
        // socket): EPERM without net.bind; then nothing can be accepted.
        denied("nonet-listen-unix", vec![], "EPERM", NoNet),
        denied("nonet-accept-unix", vec![], "EINVAL", NoNet),
        denied("listen-without-bind-grant", vec![], "EPERM", connect_only),
        // With the standard grants (connect 127.0.0.1:gport, bind 127.0.0.1:bind_ok): the
        // routes around them. Landlock allows TCP to gport on any host: cgroup BPF refuses.
        denied("tcp4-connect-other-host", p(gport), "EPERM", Standard),
        denied("tcp6-connect-ungranted", p(gport), "EPERM", Standard),
        denied("v4mapped-connect-other-host", p(gport), "EPERM", Standard),
        denied("udp4-sendto-ungranted", p(uport), "EPERM", Standard),
        denied("udp4-sendto-other-host", p(gport), "EPERM", Standard),
        denied("udp6-sendto-ungranted", p(gport), "EPERM", Standard),
        denied("v4mapped-sendto-ungranted", p(uport), "EPERM", Standard),
        denied("udp4-bind-ungranted", p(bind_no), "EPERM", Standard),
        // An ephemeral bind is the kernel's autobind made explicit (UDP clients do it).
        allowed("udp4-bind-port0", vec![], Standard),
        // A TCP one is the first half of listening on a port nobody granted: Landlock refuses
        // it first (its bind rules treat port 0 as a port: EACCES), and the cgroup bind hook
        // would with EPERM without Landlock (it needs a grant of any port for TCP); listen()
        // on an unbound socket (the kernel picks the port) is refused by BPF LSM where it
        // loads.
        denied("tcp4-bind-port0-then-listen", vec![], "EACCES", Standard),
        listen_autobind,
        autobind_reachable,
        denied("udp6-bind-ungranted", p(bind_ok), "EPERM", Standard),
        denied("v4mapped-bind-ungranted", p(bind_no), "EPERM", Standard),
        denied("tfo-sendto-other-host", p(gport), "EPERM", Standard),
        denied("tfo-connect-other-host", p(gport), "EPERM", Standard),
        denied("mptcp-socket", vec![], "EPROTONOSUPPORT", Standard),
        denied("sctp-socket", vec![], "EPROTONOSUPPORT", Standard),
        denied("icmp-echo-socket", vec![], "EPROTONOSUPPORT", Standard),
        denied("icmp6-echo-socket", vec![], "EPROTONOSUPPORT", Standard),
        denied("udplite-socket", vec![], "EPROTONOSUPPORT", Standard),
        denied("netlink-sock-diag", vec![], "EPROTONOSUPPORT", Standard),
        denied("other-families", vec![], "EAFNOSUPPORT", Standard),
        // Datagrams in (cgroup_skb/ingress): the fixture's responder on the granted UDP port
        // answers with "other" from an ungranted port first, then "granted". The first never
        // arrives, on an ephemeral or a v4-mapped IPv6 socket; EAGAIN is the drained queue.
        denied("udp4-recv-ungranted-sender", p(gport), "EAGAIN", Standard),
        denied(
            "v4mapped-recv-ungranted-sender",
            p(gport),
            "EAGAIN",
            Standard,
        ),
        denied(
            "udp4-bound0-recv-ungranted-sender",
            p(gport),
            "EAGAIN",
            Standard,
        ),
        // Controls: what the grants allow still works.
        allowed("udp4-recv-granted-sender", p(gport), Standard),
        // A server on its granted net.bind port hears from anyone.
        allowed(
            "udp4-server-recv-any-sender",
            vec![gport.to_string(), bind_ok.to_string()],
            Standard,
        ),
        allowed("v4mapped-connect-granted", p(gport), Standard),
        allowed("udp4-sendto-granted", p(gport), Standard),
        allowed("udp4-bind-granted", p(bind_ok), Standard),
        allowed("listen-granted", p(bind_ok), Standard),
        allowed(
            "listen-granted-reachable",
            vec![gport.to_string(), bind_ok.to_string()],
            Standard,
        ),
        allowed("getaddrinfo-localhost", vec![], Standard),
        allowed("getaddrinfo-localhost-nonet", vec![], NoNet),
        allowed("socketpair-unix-nonet", vec![], NoNet),
    ];
    (
        v,
        Box::new((ungranted, crate::common::UdpResponder::start(gport))),
    )
}

/// Ping the fixture's responder at `dst` from a socket bound to `bind` (`None`: not bound, the
/// kernel's autobind on sendto picks the port), wait for its "granted" reply, then drain the
/// queue: what arrived, or the errno of a failed call.
fn udp_replies(bind: Option<SocketAddr>, dst: SocketAddr) -> Result<Vec<String>, i32> {
    use std::os::fd::FromRawFd as _;
    let os = |e: std::io::Error| e.raw_os_error().unwrap_or(libc::EIO);
    let s = match bind {
        Some(b) => UdpSocket::bind(b).map_err(os)?,
        None => {
            let family = if dst.is_ipv6() {
                libc::AF_INET6
            } else {
                libc::AF_INET
            };
            let fd = socket(family, libc::SOCK_DGRAM, 0)?;
            // SAFETY: `fd` is a UDP socket just created and owned by nothing else.
            unsafe { UdpSocket::from_raw_fd(fd) }
        }
    };
    s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .map_err(os)?;
    s.send_to(b"ping", dst).map_err(os)?;
    let mut got = Vec::new();
    let mut buf = [0u8; 64];
    while !got.iter().any(|g| g == "granted") {
        let n = s.recv(&mut buf).map_err(os)?;
        got.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    s.set_nonblocking(true).map_err(os)?;
    while let Ok(n) = s.recv(&mut buf) {
        got.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    Ok(got)
}

/// A TCP listener (bound to 127.0.0.1:`bind`, or not bound: the kernel picks the port), and
/// the fixture's responder at `responder` asked to connect to it: got through when it
/// connected, ETIMEDOUT when its SYN went unanswered, the errno of a failed call.
fn tcp_reachable(bind: Option<u16>, responder: u16) -> Result<String, i32> {
    use std::os::fd::FromRawFd as _;
    let fd = socket(libc::AF_INET, libc::SOCK_STREAM, 0)?;
    // SAFETY: `fd` is a TCP socket just created and owned by nothing else.
    let l = unsafe { TcpListener::from_raw_fd(fd) };
    if let Some(port) = bind {
        let (ss, len) = raw_addr(&v4(Ipv4Addr::LOCALHOST, port));
        let sa = (&ss as *const libc::sockaddr_storage).cast();
        // SAFETY: bind on our socket with a valid sockaddr of `len` bytes.
        let r = unsafe { libc::bind(fd, sa, len) };
        check(r as i64)?;
    }
    // SAFETY: listen(2) on our socket.
    check(unsafe { libc::listen(fd, 8) } as i64)?;
    let port = l.local_addr().map_err(|_| libc::EIO)?.port();
    let os = |e: std::io::Error| e.raw_os_error().unwrap_or(libc::EIO);
    let s = UdpSocket::bind("127.0.0.1:0").map_err(os)?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .map_err(os)?;
    s.send_to(
        format!("connect {port}").as_bytes(),
        v4(Ipv4Addr::LOCALHOST, responder),
    )
    .map_err(os)?;
    let mut buf = [0u8; 128];
    let n = s.recv(&mut buf).map_err(os)?;
    match &buf[..n] {
        b"connected" => Ok(format!("port {port} reached")),
        b"timeout" => Err(libc::ETIMEDOUT),
        _ => Err(libc::ECONNREFUSED),
    }
}

/// Got through when the ungranted sender's "other" arrived; EAGAIN when it did not.
fn udp_recv_other(bind: Option<SocketAddr>, dst: SocketAddr) -> Result<String, i32> {
    let got = udp_replies(bind, dst)?;
    if got.iter().any(|g| g == "other") {
        Ok(format!("received {got:?}"))
    } else {
        Err(libc::EAGAIN)
    }
}

const LOOPBACK2: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);

/// A socket of `family`/`ty`/`proto`, or the errno.
fn socket(family: i32, ty: i32, proto: i32) -> Result<i32, i32> {
    // SAFETY: socket(2) with integer arguments.
    let s = unsafe { libc::socket(family, ty | libc::SOCK_CLOEXEC, proto) };
    if s < 0 { Err(errno()) } else { Ok(s) }
}

/// `addr` as a sockaddr buffer and its length.
fn raw_addr(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: an all-zero sockaddr_storage is valid.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than sockaddr_in and suitably aligned.
            unsafe { std::ptr::write(&mut ss as *mut _ as *mut libc::sockaddr_in, sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: 0,
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: 0,
            };
            // SAFETY: sockaddr_storage is larger than sockaddr_in6 and suitably aligned.
            unsafe { std::ptr::write(&mut ss as *mut _ as *mut libc::sockaddr_in6, sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

#[derive(Clone, Copy)]
enum Op {
    Connect,
    SendTo,
    Bind,
    /// sendto(MSG_FASTOPEN) on a TCP socket: connect and send in one call.
    FastOpen,
    /// setsockopt(TCP_FASTOPEN_CONNECT), then connect.
    FastOpenConnect,
}

/// Open a socket of `ty` for `addr`'s family (IPv6 for a v4-mapped address) and do `op`.
fn net_op(op: Op, ty: i32, addr: SocketAddr) -> Result<String, i32> {
    let family = match addr {
        SocketAddr::V4(_) => libc::AF_INET,
        SocketAddr::V6(_) => libc::AF_INET6,
    };
    let s = socket(family, ty, 0)?;
    let (ss, len) = raw_addr(&addr);
    let sa = &ss as *const libc::sockaddr_storage as *const libc::sockaddr;
    let msg = b"agent";
    // SAFETY: system calls on the socket we own with a valid sockaddr of `len` bytes and a
    // buffer of ours.
    let r = unsafe {
        match op {
            Op::Connect => libc::connect(s, sa, len) as i64,
            Op::Bind => libc::bind(s, sa, len) as i64,
            Op::SendTo => libc::sendto(s, msg.as_ptr().cast(), msg.len(), 0, sa, len) as i64,
            Op::FastOpen => libc::sendto(
                s,
                msg.as_ptr().cast(),
                msg.len(),
                libc::MSG_FASTOPEN,
                sa,
                len,
            ) as i64,
            Op::FastOpenConnect => {
                let one: libc::c_int = 1;
                libc::setsockopt(
                    s,
                    libc::IPPROTO_TCP,
                    libc::TCP_FASTOPEN_CONNECT,
                    (&one as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                );
                libc::connect(s, sa, len) as i64
            }
        }
    };
    let e = errno();
    // SAFETY: closing the socket we opened.
    unsafe { libc::close(s) };
    if r < 0 { Err(e) } else { Ok(format!("{addr}")) }
}

fn v4(ip: Ipv4Addr, port: u16) -> SocketAddr {
    SocketAddr::V4(SocketAddrV4::new(ip, port))
}

fn v6(ip: Ipv6Addr, port: u16) -> SocketAddr {
    SocketAddr::V6(SocketAddrV6::new(ip, port, 0, 0))
}

fn mapped(ip: Ipv4Addr, port: u16) -> SocketAddr {
    v6(ip.to_ipv6_mapped(), port)
}

fn bare_socket(family: i32, ty: i32, proto: i32) -> Result<String, i32> {
    let s = socket(family, ty, proto)?;
    // SAFETY: closing the socket we opened.
    unsafe { libc::close(s) };
    Ok(format!("socket({family}, {ty}, {proto})"))
}

/// A Unix stream socket bound in $HOME, then listen(): the listen result; `accept` then tries
/// accept4 on it and returns that instead.
fn unix_listen(accept: bool) -> Result<String, i32> {
    let home = std::env::var("HOME").unwrap_or_default();
    let path = format!("{home}/listen.sock");
    let _ = std::fs::remove_file(&path);
    let s = socket(libc::AF_UNIX, libc::SOCK_STREAM, 0)?;
    // SAFETY: an all-zero sockaddr_un is valid; the path fits (checked) and is copied in.
    let mut sun: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    sun.sun_family = libc::AF_UNIX as libc::sa_family_t;
    if path.len() >= sun.sun_path.len() {
        return Err(libc::ENAMETOOLONG);
    }
    for (d, b) in sun.sun_path.iter_mut().zip(path.bytes()) {
        *d = b as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
    // SAFETY: bind/listen/accept4 on our socket with a valid sockaddr_un.
    let r = unsafe {
        if libc::bind(s, (&sun as *const libc::sockaddr_un).cast(), len) != 0 {
            Err(errno())
        } else {
            let l = check(libc::listen(s, 8) as i64);
            if accept {
                libc::fcntl(s, libc::F_SETFL, libc::O_NONBLOCK);
                check(libc::accept4(s, std::ptr::null_mut(), std::ptr::null_mut(), 0) as i64)
            } else {
                l
            }
        }
    };
    // SAFETY: closing the socket we opened.
    unsafe { libc::close(s) };
    let _ = std::fs::remove_file(&path);
    r
}

/// A TCP socket listening on 127.0.0.1:port (listen needs net.bind).
fn tcp_listen(port: u16) -> Result<String, i32> {
    let s = socket(libc::AF_INET, libc::SOCK_STREAM, 0)?;
    let (ss, len) = raw_addr(&v4(Ipv4Addr::LOCALHOST, port));
    // SAFETY: bind/listen on our socket with a valid sockaddr.
    let r = unsafe {
        if port != 0 && libc::bind(s, (&ss as *const libc::sockaddr_storage).cast(), len) != 0 {
            Err(errno())
        } else {
            check(libc::listen(s, 8) as i64)
        }
    };
    // SAFETY: closing the socket we opened.
    unsafe { libc::close(s) };
    r
}

/// A TCP socket bound to 127.0.0.1 port 0 (an ephemeral port), then listen().
fn tcp_bind0_listen() -> Result<String, i32> {
    let s = socket(libc::AF_INET, libc::SOCK_STREAM, 0)?;
    let (ss, len) = raw_addr(&v4(Ipv4Addr::LOCALHOST, 0));
    // SAFETY: bind/listen on our socket with a valid sockaddr.
    let r = unsafe {
        if libc::bind(s, (&ss as *const libc::sockaddr_storage).cast(), len) != 0 {
            Err(errno())
        } else {
            check(libc::listen(s, 8) as i64)
        }
    };
    // SAFETY: closing the socket we opened.
    unsafe { libc::close(s) };
    r
}

fn getaddrinfo_localhost() -> Result<String, i32> {
    let host = crate::probe::c("localhost");
    // SAFETY: getaddrinfo with a NUL-terminated name, zeroed hints and an out pointer we free.
    unsafe {
        let mut hints: libc::addrinfo = std::mem::zeroed();
        hints.ai_family = libc::AF_UNSPEC;
        hints.ai_socktype = libc::SOCK_STREAM;
        hints.ai_flags = libc::AI_ADDRCONFIG;
        let mut res: *mut libc::addrinfo = std::ptr::null_mut();
        let r = libc::getaddrinfo(host.as_ptr(), std::ptr::null(), &hints, &mut res);
        if r != 0 {
            // An EAI_* code, reported as a negative "errno" the suite prints.
            return Err(if r == libc::EAI_SYSTEM {
                errno()
            } else {
                1000 - r
            });
        }
        let mut n = 0;
        let mut p = res;
        while !p.is_null() {
            n += 1;
            p = (*p).ai_next;
        }
        libc::freeaddrinfo(res);
        Ok(format!("{n} addresses"))
    }
}

/// Every family but Unix, IPv4/6 and netlink: all must fail with EAFNOSUPPORT.
fn other_families() -> Result<String, i32> {
    let families = [
        (libc::AF_PACKET, libc::SOCK_DGRAM, "AF_PACKET"),
        (libc::AF_VSOCK, libc::SOCK_STREAM, "AF_VSOCK"),
        (libc::AF_BLUETOOTH, libc::SOCK_RAW, "AF_BLUETOOTH"),
        (libc::AF_XDP, libc::SOCK_RAW, "AF_XDP"),
        (libc::AF_ALG, libc::SOCK_SEQPACKET, "AF_ALG"),
        (libc::AF_KEY, libc::SOCK_RAW, "AF_KEY"),
        (libc::AF_TIPC, libc::SOCK_RDM, "AF_TIPC"),
        (libc::AF_RDS, libc::SOCK_SEQPACKET, "AF_RDS"),
        (libc::AF_CAN, libc::SOCK_RAW, "AF_CAN"),
        (libc::AF_PPPOX, libc::SOCK_STREAM, "AF_PPPOX"),
        (libc::AF_LLC, libc::SOCK_DGRAM, "AF_LLC"),
        (42, libc::SOCK_DGRAM, "AF_QIPCRTR"),
        (43, libc::SOCK_STREAM, "AF_SMC"),
        (libc::AF_ATMPVC, libc::SOCK_DGRAM, "AF_ATMPVC"),
        (libc::AF_AX25, libc::SOCK_SEQPACKET, "AF_AX25"),
        (libc::AF_IPX, libc::SOCK_DGRAM, "AF_IPX"),
        (libc::AF_APPLETALK, libc::SOCK_DGRAM, "AF_APPLETALK"),
        (libc::AF_NETROM, libc::SOCK_SEQPACKET, "AF_NETROM"),
        (45, libc::SOCK_DGRAM, "AF_MCTP"),
    ];
    let other: Vec<String> = families
        .iter()
        .filter_map(|&(f, t, name)| match bare_socket(f, t, 0) {
            Err(e) if e == libc::EAFNOSUPPORT => None,
            Err(e) => Some(format!("{name}: {}", errno_name(e))),
            Ok(_) => Some(format!("{name}: created")),
        })
        .collect();
    if other.is_empty() {
        Err(libc::EAFNOSUPPORT)
    } else {
        Ok(other.join(", "))
    }
}

/// Run attempt `name` inside the agent; `None` when this module does not know it.
pub fn probe(name: &str, args: &[String]) -> Option<Result<String, i32>> {
    let port: u16 = args.get(1).and_then(|p| p.parse().ok()).unwrap_or(0);
    let lo = Ipv4Addr::LOCALHOST;
    let lo6 = Ipv6Addr::LOCALHOST;
    let (stream, dgram) = (libc::SOCK_STREAM, libc::SOCK_DGRAM);
    let (inet, inet6) = (libc::AF_INET, libc::AF_INET6);
    Some(match name {
        "nonet-tcp4-connect" => net_op(Op::Connect, stream, v4(lo, port)),
        "nonet-tcp6-connect" | "tcp6-connect-ungranted" => {
            net_op(Op::Connect, stream, v6(lo6, port))
        }
        "nonet-v4mapped-connect" | "v4mapped-connect-granted" => {
            net_op(Op::Connect, stream, mapped(lo, port))
        }
        "nonet-udp4-sendto" | "udp4-sendto-ungranted" | "udp4-sendto-granted" => {
            net_op(Op::SendTo, dgram, v4(lo, port))
        }
        "nonet-udp6-sendto" | "udp6-sendto-ungranted" => net_op(Op::SendTo, dgram, v6(lo6, port)),
        "nonet-tcp4-bind" => net_op(Op::Bind, stream, v4(lo, port)),
        "nonet-tcp6-bind" => net_op(Op::Bind, stream, v6(lo6, port)),
        "nonet-udp4-bind" | "udp4-bind-ungranted" | "udp4-bind-granted" => {
            net_op(Op::Bind, dgram, v4(lo, port))
        }
        "udp4-bind-port0" => net_op(Op::Bind, dgram, v4(lo, 0)),
        "nonet-udp6-bind" | "udp6-bind-ungranted" => net_op(Op::Bind, dgram, v6(lo6, port)),
        "v4mapped-bind-ungranted" => net_op(Op::Bind, dgram, mapped(lo, port)),
        "nonet-tfo-sendto" => net_op(Op::FastOpen, stream, v4(lo, port)),
        "tcp4-connect-other-host" => net_op(Op::Connect, stream, v4(LOOPBACK2, port)),
        "v4mapped-connect-other-host" => net_op(Op::Connect, stream, mapped(LOOPBACK2, port)),
        "udp4-sendto-other-host" => net_op(Op::SendTo, dgram, v4(LOOPBACK2, port)),
        "v4mapped-sendto-ungranted" => net_op(Op::SendTo, dgram, mapped(lo, port)),
        "tfo-sendto-other-host" => net_op(Op::FastOpen, stream, v4(LOOPBACK2, port)),
        "tfo-connect-other-host" => net_op(Op::FastOpenConnect, stream, v4(LOOPBACK2, port)),
        "nonet-mptcp-socket" | "mptcp-socket" => bare_socket(inet, stream, 262),
        "nonet-sctp-socket" | "sctp-socket" => bare_socket(inet, stream, libc::IPPROTO_SCTP),
        "nonet-icmp-echo-socket" | "icmp-echo-socket" => {
            bare_socket(inet, dgram, libc::IPPROTO_ICMP)
        }
        "icmp6-echo-socket" => bare_socket(inet6, dgram, libc::IPPROTO_ICMPV6),
        "udplite-socket" => bare_socket(inet, dgram, libc::IPPROTO_UDPLITE),
        "nonet-raw-socket" => bare_socket(inet, libc::SOCK_RAW, libc::IPPROTO_ICMP),
        "nonet-packet-socket" => bare_socket(
            libc::AF_PACKET,
            libc::SOCK_RAW,
            (libc::ETH_P_ALL as u16).to_be() as i32,
        ),
        "nonet-netlink-route" => bare_socket(libc::AF_NETLINK, libc::SOCK_RAW, 0),
        "netlink-sock-diag" => {
            bare_socket(libc::AF_NETLINK, libc::SOCK_RAW, libc::NETLINK_SOCK_DIAG)
        }
        "other-families" => other_families(),
        "nonet-listen-unix" => unix_listen(false),
        "nonet-accept-unix" => unix_listen(true),
        "listen-without-bind-grant" | "listen-autobind-with-bind-grant" => tcp_listen(0),
        "tcp4-bind-port0-then-listen" => tcp_bind0_listen(),
        "listen-granted" => tcp_listen(port),
        "listen-autobind-reachable" => tcp_reachable(None, port),
        "listen-granted-reachable" => {
            let bind: u16 = args.get(2).and_then(|p| p.parse().ok()).unwrap_or(0);
            tcp_reachable(Some(bind), port)
        }
        "udp4-recv-ungranted-sender" => udp_recv_other(None, v4(lo, port)),
        "v4mapped-recv-ungranted-sender" => udp_recv_other(None, mapped(lo, port)),
        "udp4-bound0-recv-ungranted-sender" => udp_recv_other(Some(v4(lo, 0)), v4(lo, port)),
        "udp4-recv-granted-sender" => {
            udp_replies(None, v4(lo, port)).map(|got| format!("received {got:?}"))
        }
        "udp4-server-recv-any-sender" => {
            let bind: u16 = args.get(2).and_then(|p| p.parse().ok()).unwrap_or(0);
            udp_recv_other(Some(v4(lo, bind)), v4(lo, port))
        }
        "getaddrinfo-localhost" | "getaddrinfo-localhost-nonet" => getaddrinfo_localhost(),
        "socketpair-unix-nonet" => {
            let mut fds = [0; 2];
            // SAFETY: socketpair(2) writes two fds into our array; we close them.
            let r =
                unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, fds.as_mut_ptr()) };
            if r != 0 {
                Err(errno())
            } else {
                // SAFETY: closing the fds socketpair gave us.
                unsafe {
                    libc::close(fds[0]);
                    libc::close(fds[1]);
                }
                Ok("socketpair".into())
            }
        }
        _ => return None,
    })
}

/// What a record's `detail` must show.
type RecordCheck = fn(&serde_json::Value) -> bool;

/// The records of refusals that no errno of the agent's shows: the datagrams
/// `cgroup_skb/ingress` dropped (on every host), and where BPF LSM's socket programs load (the
/// VM) the `lsm/socket_bind` and `lsm/socket_listen` refusals. Failures, one line each.
pub fn records_check(ctx: &Ctx) -> Vec<String> {
    let fs = agentosd::enforce::fs::FsEnforcer::load().ok();
    let loads = |hook: &str| fs.as_ref().is_some_and(|f| f.optional_status(hook).is_ok());
    let mut want: Vec<(&str, &str, RecordCheck)> =
        vec![("cgroup_skb/ingress", "a datagram dropped", |d| {
            d["syscall"] == "recvmsg" && d["effect"] == "dropped" && d["errno"].is_null()
        })];
    if !loads("socket_listen") {
        // The SYN to the listener on a port nobody granted (listen-autobind-reachable); where
        // lsm/socket_listen loads, that listen() is refused and no SYN ever comes.
        want.push(("cgroup_skb/ingress", "a SYN dropped", |d| {
            d["syscall"] == "accept" && d["protocol"] == "tcp" && d["effect"] == "dropped"
        }));
    }
    if loads("socket_bind") {
        want.push(("lsm/socket_bind", "an abstract bind refused", |d| {
            d["errno"] == "EPERM" && d["path"].as_str().is_some_and(|p| p.starts_with('@'))
        }));
    }
    if loads("socket_listen") {
        want.push(("lsm/socket_listen", "a listen refused", |d| {
            d["errno"] == "EPERM" && d["syscall"] == "listen" && d["path"] == "inet"
        }));
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let o = std::process::Command::new(crate::common::agentctl_bin())
            .args(["audit", "show", "--json", "--state-dir"])
            .arg(&ctx.state)
            .output()
            .expect("agentctl audit show");
        let recs: Vec<serde_json::Value> = String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .filter(|r: &serde_json::Value| r["kind"] == "denial")
            .collect();
        let missing: Vec<String> = want
            .iter()
            .filter(|(hook, _, ok)| {
                !recs
                    .iter()
                    .any(|r| r["detail"]["hook"] == *hook && ok(&r["detail"]))
            })
            .map(|(hook, what, _)| {
                format!("records: no {hook} record of {what} in the audit trail")
            })
            .collect();
        if missing.is_empty() {
            for (hook, what, _) in &want {
                println!("ok   records: {hook}: {what}, in the audit trail");
            }
            return missing;
        }
        if std::time::Instant::now() > deadline {
            for m in &missing {
                println!("FAIL {m}");
            }
            return missing;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}
