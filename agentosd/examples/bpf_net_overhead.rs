//! What the cgroup BPF network programs cost: `cargo run --release -p agentosd --example
//! bpf_net_overhead [ITERATIONS]` (root; makes its own cgroup tree under the cgroup2 mount and
//! removes it; attaches only to that tree's `agents/`).
//!
//! Measures ns per UDP `connect()` (runs `cgroup/connect4` once per call) and per UDP `sendto()`
//! (runs `cgroup/sendmsg4`) to a granted loopback destination, in this process:
//! 1. outside agents/, programs not loaded (baseline);
//! 2. outside agents/, programs attached to agents/ (must equal the baseline: the programs are
//!    not in this cgroup's effective program array, so they cost nothing here);
//! 3. inside an agent's cgroup under agents/, with a policy of 32 rules whose last one grants
//!    the destination (the worst case of the rule walk).
//!
//! Also ns per UDP datagram received (sent by a socket made outside agents/ from a granted
//! address to one made where the row measures: inside an agent the delivery runs
//! `cgroup_skb/ingress`, which walks the rules for the sender; one thread, no wakeups), per
//! `openat`+`close` of `/etc/passwd` and per `getppid` (which no program of ours hooks) in the
//! same three places, and a fourth: a child process inside the agent's cgroup with
//! the agent's seccomp filter and Landlock domain applied (what every real agent pays).
//!
//! Prints the median of 7 interleaved rounds for each.

#![allow(clippy::unwrap_used)]

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use agentosd::enforce::net::{NetEnforcer, Policy, Rule};

fn connect_loop(s: &UdpSocket, to: SocketAddrV4, n: u32) -> f64 {
    let sa = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: to.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(to.ip().octets()),
        },
        sin_zero: [0; 8],
    };
    let t = Instant::now();
    for _ in 0..n {
        // SAFETY: connect(2) on a socket we own with a valid sockaddr_in of the right length.
        let r = unsafe {
            libc::connect(
                s.as_raw_fd(),
                (&sa as *const libc::sockaddr_in).cast(),
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        };
        assert_eq!(r, 0, "connect: {}", std::io::Error::last_os_error());
    }
    t.elapsed().as_nanos() as f64 / f64::from(n)
}

fn sendto_loop(s: &UdpSocket, to: SocketAddrV4, n: u32) -> f64 {
    let t = Instant::now();
    for _ in 0..n {
        s.send_to(b"x", to).unwrap();
    }
    t.elapsed().as_nanos() as f64 / f64::from(n)
}

/// Datagrams sent by `from` (outside agents/) to a socket made here and received by it, ns
/// each: the receive path, with `cgroup_skb/ingress` when this runs inside an agent.
fn recv_loop(from: &UdpSocket, n: u32) -> f64 {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    let at = s.local_addr().unwrap();
    let mut buf = [0u8; 8];
    let t = Instant::now();
    for _ in 0..n {
        from.send_to(b"x", at).unwrap();
        s.recv(&mut buf)
            .expect("the datagram (dropped on its way in?)");
    }
    t.elapsed().as_nanos() as f64 / f64::from(n)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn open_close_loop(n: u32) -> f64 {
    let path = c"/etc/passwd";
    let t = Instant::now();
    for _ in 0..n {
        // SAFETY: open(2) with a valid NUL-terminated path, then close of the fd it returned.
        unsafe {
            let fd = libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
            assert!(fd >= 0, "open: {}", std::io::Error::last_os_error());
            libc::close(fd);
        }
    }
    t.elapsed().as_nanos() as f64 / f64::from(n)
}

fn getppid_loop(n: u32) -> f64 {
    let t = Instant::now();
    for _ in 0..n {
        // SAFETY: getppid has no preconditions.
        std::hint::black_box(unsafe { libc::getppid() });
    }
    t.elapsed().as_nanos() as f64 / f64::from(n)
}

/// (connect, sendto, UDP send+receive, openat+close, getppid) ns of one round.
type Round = (f64, f64, f64, f64, f64);

/// One round in this process; `from`: the sender of the receive loop (none in the sandboxed
/// child, which cannot hold a socket made outside the agent: NaN there).
fn measure(to: SocketAddrV4, from: Option<&UdpSocket>, n: u32) -> Round {
    let c = UdpSocket::bind("127.0.0.1:0").unwrap();
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    connect_loop(&c, to, n / 10);
    sendto_loop(&s, to, n / 10);
    let recv = |n| from.map_or(f64::NAN, |f| recv_loop(f, n));
    recv(n / 100);
    (
        connect_loop(&c, to, n),
        sendto_loop(&s, to, n),
        recv(n / 10),
        open_close_loop(n),
        getppid_loop(n),
    )
}

/// The child of the fourth row: into the agent's cgroup (argument 2), then the agent sandbox's
/// Landlock domain (base rules: /etc/passwd is readable) and seccomp filter, then one round.
fn sandboxed_child(to: SocketAddrV4, n: u32, agent_cg: &Path) {
    move_self(agent_cg);
    let home = std::env::temp_dir();
    let plan = agentosd::sandbox::Grants {
        net_connect: vec![format!("127.0.0.1:{}", to.port())],
        ..Default::default()
    }
    .plan(&home)
    .unwrap();
    let ruleset = agentosd::sandbox::landlock::build(&plan, false)
        .unwrap()
        .expect("Landlock");
    let progs = agentosd::sandbox::seccomp::compiled().unwrap();
    // SAFETY: plain system calls on a ruleset fd we own and on filter programs that outlive
    // the calls; this process only measures afterwards.
    unsafe {
        assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
        assert_eq!(
            libc::syscall(libc::SYS_landlock_restrict_self, ruleset.as_raw_fd(), 0u32),
            0
        );
        for p in &progs {
            let f = libc::sock_fprog {
                len: p.len() as u16,
                filter: p.as_ptr() as *mut libc::sock_filter,
            };
            assert_eq!(
                libc::syscall(libc::SYS_seccomp, 1u32, 0u32, &f as *const libc::sock_fprog),
                0
            );
        }
    }
    let r = measure(to, None, n);
    println!("{} {} {} {} {}", r.0, r.1, r.2, r.3, r.4);
}

fn move_self(cg: &Path) {
    std::fs::write(cg.join("cgroup.procs"), std::process::id().to_string()).unwrap();
}

const ROUNDS: usize = 7;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("sandboxed-child") {
        let to: SocketAddrV4 = args[2].parse().unwrap();
        sandboxed_child(to, args[3].parse().unwrap(), Path::new(&args[4]));
        return;
    }
    let n: u32 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(200_000);
    let mount = agentosd::cgroup::cgroup2_mount().expect("a cgroup2 mount");
    let own = mount.join(
        agentosd::cgroup::proc_cgroup("self")
            .unwrap()
            .trim_start_matches('/'),
    );
    let root: PathBuf = mount.join(format!("agentos-bench-net-{}", std::process::id()));
    let agents = root.join("agents");
    let agent = agents.join("bench");
    std::fs::create_dir_all(&agent).unwrap();
    // The sendto destination: a socket made here, outside agents/, for the whole run (one made
    // inside an agent would need a bind grant, and datagrams to a closed port cost an ICMP
    // error each). Nobody reads it: datagrams past its buffer are dropped.
    let sink = UdpSocket::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)).unwrap();
    let std::net::SocketAddr::V4(to) = sink.local_addr().unwrap() else {
        unreachable!("an IPv4 socket")
    };

    // The receive loop's sender, made here (outside agents/), granted by the 31st rule.
    let sender = UdpSocket::bind("127.0.0.1:0").unwrap();
    let std::net::SocketAddr::V4(sender_at) = sender.local_addr().unwrap() else {
        unreachable!("an IPv4 socket")
    };
    // 32 rules: 30 that never match, the sender's, then the destination's (the longest walk).
    let mut rules: Vec<Rule> = (1..31u8)
        .map(|i| Rule {
            net: Some((Ipv4Addr::new(10, 0, 0, i).into(), 32)),
            family: 2,
            port: to.port(),
            kind: Default::default(),
            proto: Default::default(),
        })
        .collect();
    rules.push(Rule {
        net: Some(((*sender_at.ip()).into(), 32)),
        family: 2,
        port: sender_at.port(),
        kind: Default::default(),
        proto: Default::default(),
    });
    rules.push(Rule {
        net: Some(((*to.ip()).into(), 32)),
        family: 2,
        port: to.port(),
        kind: Default::default(),
        proto: Default::default(),
    });
    let policy = Policy {
        allow_all: false,
        allow_all_bind: false,
        inet: true,
        rules,
        ..Policy::default()
    };
    let id = std::fs::metadata(&agent)
        .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
        .unwrap();
    // Interleaved rounds, so drift in the machine's load hits every variant alike.
    let (mut base, mut outside, mut inside, mut boxed) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut last_stats = Default::default();
    for _ in 0..ROUNDS {
        base.push(measure(to, Some(&sender), n));
        let net = NetEnforcer::load().expect("loading the programs");
        net.attach(&agents).unwrap();
        outside.push(measure(to, Some(&sender), n));
        net.set_policy("bench/bench", "bench", "bench", id, &policy)
            .unwrap();
        move_self(&agent);
        inside.push(measure(to, Some(&sender), n));
        move_self(&own);
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .arg("sandboxed-child")
            .arg(to.to_string())
            .arg(n.to_string())
            .arg(&agent)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let v: Vec<f64> = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(|x| x.parse().unwrap())
            .collect();
        boxed.push((v[0], v[1], v[2], v[3], v[4]));
        last_stats = net.stats();
        drop(net);
    }
    let med = |v: &[Round]| {
        (
            median(v.iter().map(|x| x.0).collect()),
            median(v.iter().map(|x| x.1).collect()),
            median(v.iter().map(|x| x.2).collect()),
            median(v.iter().map(|x| x.3).collect()),
            median(v.iter().map(|x| x.4).collect()),
        )
    };
    let (base, outside, inside, boxed) = (med(&base), med(&outside), med(&inside), med(&boxed));
    let stats: agentosd::enforce::net::Stats = last_stats;
    drop(sink);
    let _ = std::fs::remove_dir(&agent);
    let _ = std::fs::remove_dir(&agents);
    let _ = std::fs::remove_dir(&root);

    println!("iterations per round: {n}, {ROUNDS} interleaved rounds, medians (ns per call)");
    println!(
        "{:<60} {:>10} {:>10} {:>10} {:>12} {:>10}",
        "", "connect", "sendto", "udp recv", "open+close", "getppid"
    );
    for (what, (c, s, e, o, g)) in [
        ("outside agents/, no programs", base),
        ("outside agents/, programs attached to agents/", outside),
        ("inside an agent, 32 rules, granted by the last", inside),
        (
            "inside an agent + its seccomp filter and Landlock domain",
            boxed,
        ),
    ] {
        println!("{what:<60} {c:>10.0} {s:>10.0} {e:>10.0} {o:>12.0} {g:>10.0}");
    }
    println!(
        "program cost inside an agent: connect {:+.0} ns, sendto {:+.0} ns, udp send+recv {:+.0} ns (ingress); outside: connect {:+.0} ns, sendto {:+.0} ns",
        inside.0 - base.0,
        inside.1 - base.1,
        inside.2 - base.2,
        outside.0 - base.0,
        outside.1 - base.1
    );
    println!(
        "stats map (last round): allowed {}, denied {}, events dropped {}",
        stats.allowed, stats.denied, stats.events_dropped
    );
}
