//! The per-agent rate of the agents' sockets (issue 15, "Isolation measured"; docs/ipc.md,
//! "The rate"): the ipc layer alone (io_uring, no root). An agent flooding requests is read at
//! its rate (bytes plus a cost per line) over all its connections, the daemon is told once that
//! it was throttled, and another agent is served all along and not throttled.

#![allow(clippy::unwrap_used)]

#[macro_use]
mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use agentosd::ipc::rate::LINE_COST;
use agentosd::ipc::{AgentRef, Connection, Inbound, Incoming, IpcServer, Limits};

fn agent(id: &str) -> AgentRef {
    AgentRef {
        id: id.into(),
        cgroup: format!("/nowhere/agents/{id}").into(),
        cgroup_dir: format!("/nonexistent/agents/{id}").into(),
        uid: 65534,
        gid: 65534,
    }
}

/// Bytes and lines the daemon side took, per agent.
#[derive(Default)]
struct Taken {
    bytes: AtomicU64,
    lines: AtomicU64,
}

/// An ipc server whose daemon side answers every line with `ok`, counting what it takes per
/// agent; None when io_uring is not usable here.
fn serve(
    rt: &tokio::runtime::Runtime,
    limits: Limits,
) -> Option<(Arc<IpcServer>, Incoming, Arc<[Taken; 2]>)> {
    let (ipc, mut incoming) = common::start_ipc(rt, limits, module_path!())?;
    let taken: Arc<[Taken; 2]> = Arc::new(Default::default());
    let mut conns = std::mem::replace(&mut incoming.conns, tokio::sync::mpsc::channel(1).1);
    let t = taken.clone();
    rt.spawn(async move {
        while let Some(c) = conns.recv().await {
            let t = t.clone();
            tokio::spawn(async move {
                let Connection { peer, mut rx, tx } = c;
                let i = usize::from(peer.agent != "t/flood");
                while let Some(m) = rx.recv().await {
                    if let Inbound::Line(l) = m {
                        t[i].bytes.fetch_add(l.len() as u64 + 1, Ordering::Relaxed);
                        t[i].lines.fetch_add(1, Ordering::Relaxed);
                        if tx.send(b"ok".to_vec()).await.is_err() {
                            break;
                        }
                    }
                }
            });
        }
    });
    Some((ipc, incoming, taken))
}

/// Writes `line` in a loop on `n` connections of `flood`, draining the replies; returns the
/// stop switch.
fn flood(ipc: &IpcServer, n: usize, line: &'static [u8]) -> Arc<AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    for _ in 0..n {
        let s: UnixStream = ipc.pair(&agent("t/flood")).unwrap().into();
        let mut r = s.try_clone().unwrap();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 1 << 16];
            while std::io::Read::read(&mut r, &mut buf).is_ok_and(|n| n > 0) {}
        });
        let mut w = s;
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) && w.write_all(line).is_ok() {}
            let _ = w.shutdown(std::net::Shutdown::Both);
        });
    }
    stop
}

/// 100 round trips of another agent while the flood runs: every one answered.
fn polite_round_trips(ipc: &IpcServer) -> Duration {
    let s: UnixStream = ipc.pair(&agent("t/polite")).unwrap().into();
    let mut reader = BufReader::new(s.try_clone().unwrap());
    let mut w = s;
    let mut worst = Duration::ZERO;
    for i in 0..100 {
        let t = Instant::now();
        writeln!(w, "{{\"n\":{i}}}").unwrap();
        let mut l = String::new();
        reader.read_line(&mut l).unwrap();
        assert_eq!(l.trim(), "ok", "round trip {i}");
        worst = worst.max(t.elapsed());
        std::thread::sleep(Duration::from_millis(10));
    }
    worst
}

const NO_CPU_SHARE: agentosd::ipc::cpu::CpuRate = agentosd::ipc::cpu::CpuRate {
    permille: 0,
    burst: Duration::ZERO,
    ceiling_permille: 0,
};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn a_flooding_agent_is_read_at_its_rate_and_another_is_served() {
    let rt = runtime();
    let rate: u64 = 2 << 20;
    let limits = Limits {
        max_line: 64 << 10,
        agent_rate: rate,
        // The byte rate alone (the CPU share has tests/ipc_cpu.rs).
        agent_cpu: NO_CPU_SHARE,
        ..Limits::default()
    };
    let Some((ipc, mut incoming, taken)) = serve(&rt, limits) else {
        return;
    };
    static LINE: std::sync::LazyLock<Vec<u8>> = std::sync::LazyLock::new(|| {
        let mut l = vec![b'y'; 60 << 10];
        l.push(b'\n');
        l
    });
    let t0 = Instant::now();
    let stop = flood(&ipc, 4, &LINE);
    let worst = polite_round_trips(&ipc);
    std::thread::sleep(Duration::from_millis(500));
    let elapsed = t0.elapsed().as_secs_f64();
    let bytes = taken[0].bytes.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    // The burst is half a second's worth; each of the 4 connections may overdraw by a receive.
    let allowed = rate as f64 * elapsed + (rate / 2) as f64 + 4.0 * 65536.0 + 4.0 * 61441.0;
    eprintln!(
        "ipc_rate: flood taken {bytes} B in {elapsed:.2} s ({:.2} MiB/s, rate {:.2} MiB/s); \
         other agent's worst round trip {worst:?}; {:?}",
        bytes as f64 / elapsed / (1 << 20) as f64,
        rate as f64 / (1 << 20) as f64,
        ipc.stats()
    );
    assert!(
        (bytes as f64) <= allowed,
        "the flooding agent was read at {bytes} B in {elapsed:.2} s, over its rate ({allowed:.0} allowed)"
    );
    // Not starved either (a quarter: the host's CPUs may be busy with other work).
    assert!(
        bytes as f64 >= rate as f64 * elapsed * 0.25,
        "the flooding agent was read far below its rate: {bytes} B in {elapsed:.2} s"
    );
    assert!(ipc.stats().rate_pauses >= 1, "{:?}", ipc.stats());
    // The daemon is told, once for the episode (one report per agent per 10 s at most).
    let r = rt
        .block_on(async {
            tokio::time::timeout(Duration::from_secs(5), incoming.throttles.recv()).await
        })
        .expect("a throttle report")
        .unwrap();
    assert_eq!(r.agent, "t/flood");
    assert_eq!(r.rate, rate);
    assert!(r.pauses >= 1, "{r:?}");
    assert!(
        incoming.throttles.try_recv().is_err(),
        "one report per 10 s, and none for the polite agent"
    );
}

#[test]
fn small_requests_cost_a_line_each() {
    let rt = runtime();
    let rate: u64 = 1 << 20;
    let limits = Limits {
        max_line: 64 << 10,
        agent_rate: rate,
        // The byte rate alone (the CPU share has tests/ipc_cpu.rs).
        agent_cpu: NO_CPU_SHARE,
        ..Limits::default()
    };
    let Some((ipc, _incoming, taken)) = serve(&rt, limits) else {
        return;
    };
    static LINE: &[u8] = b"{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n";
    let t0 = Instant::now();
    let stop = flood(&ipc, 1, LINE);
    std::thread::sleep(Duration::from_secs(2));
    let elapsed = t0.elapsed().as_secs_f64();
    let lines = taken[0].lines.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    // Each line costs 3 bytes plus LINE_COST, after a burst of half a second's worth; one
    // receive (64 KiB of 3-byte lines) may overdraw.
    let allowed =
        (rate as f64 * elapsed + (rate / 2) as f64) / (3 + LINE_COST) as f64 + 65536.0 / 3.0;
    eprintln!("ipc_rate: {lines} small lines taken in {elapsed:.2} s (allowed {allowed:.0})");
    assert!(
        lines as f64 <= allowed,
        "{lines} lines of 3 bytes in {elapsed:.2} s: lines are not charged their cost"
    );
    assert!(lines > 0);
}

#[test]
fn rate_zero_means_no_rate() {
    let rt = runtime();
    let limits = Limits {
        max_line: 64 << 10,
        agent_rate: 0,
        agent_cpu: NO_CPU_SHARE,
        ..Limits::default()
    };
    let Some((ipc, mut incoming, _taken)) = serve(&rt, limits) else {
        return;
    };
    static LINE: &[u8] = b"{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n";
    let stop = flood(&ipc, 2, LINE);
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    assert_eq!(ipc.stats().rate_pauses, 0);
    assert!(incoming.throttles.try_recv().is_err());
}

#[test]
fn connecting_in_a_loop_is_held_to_the_rate_too() {
    use agentosd::ipc::rate::ACCEPT_COST;
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, UnixAddr, connect, socket};
    use std::os::fd::AsRawFd;

    let rt = runtime();
    let rate: u64 = 64 << 10;
    let max_line = 4096;
    let limits = Limits {
        max_line,
        agent_rate: rate,
        // The byte rate alone (the CPU share has tests/ipc_cpu.rs).
        agent_cpu: NO_CPU_SHARE,
        ..Limits::default()
    };
    let Some((ipc, mut incoming, _taken)) = serve(&rt, limits) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("churn.sock");
    // The socket is the agent's: our own uid, so that no privilege is needed to give it away.
    let me = AgentRef {
        uid: rustix::process::geteuid().as_raw(),
        gid: rustix::process::getegid().as_raw(),
        ..agent("t/churn")
    };
    ipc.listen(&me, &path).unwrap();
    let addr = UnixAddr::new(&path).unwrap();
    let t0 = Instant::now();
    let mut tried = 0u64;
    // Connections from outside the agent's cgroup: each is accepted, identified and refused.
    while t0.elapsed() < Duration::from_millis(1500) {
        let s = socket(
            AddressFamily::Unix,
            SockType::Stream,
            SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
            None,
        )
        .unwrap();
        // EAGAIN once the backlog is full: the daemon is not accepting.
        if connect(s.as_raw_fd(), &addr).is_err() {
            std::thread::sleep(Duration::from_millis(1));
        }
        tried += 1;
    }
    std::thread::sleep(Duration::from_millis(100));
    let elapsed = t0.elapsed().as_secs_f64();
    let st = ipc.stats();
    let served = st.accepted + st.refused;
    let burst = (rate / 2).max(max_line as u64 + (64 << 10));
    // One accept may overdraw the bucket (it is charged once done).
    let allowed = ((rate as f64 * elapsed + burst as f64) / ACCEPT_COST as f64) as u64 + 4;
    eprintln!(
        "ipc_rate: {served} connections accepted of {tried} tried in {elapsed:.2} s (allowed {allowed}); {st:?}"
    );
    assert!(served > 0);
    assert!(
        served <= allowed,
        "{served} connections accepted in {elapsed:.2} s: accepting is not charged to the agent"
    );
    let r = rt
        .block_on(async {
            tokio::time::timeout(Duration::from_secs(5), incoming.throttles.recv()).await
        })
        .expect("a throttle report")
        .unwrap();
    assert_eq!(r.agent, "t/churn");
}
