//! A hostile agent against the daemon (issue 15, "Bounded in bytes, per agent" and "Isolation
//! measured"). On all 16 connections it may open it first floods requests of nearly 1 MiB (an
//! unknown method of that size, whose error reply once echoed it) for `FLOOD_SECS`, then switches
//! to pipelined pings with the longest id accepted, reading nothing. The daemon must read it at
//! its rate (`--ipc-agent-rate`) and say so (a `socket-throttled` record), answer it with bounded
//! errors, hold a bounded number of bytes for it (its RSS stays under what the limits allow),
//! close its connections after the stall timeout with a journal line and a `socket-stalled`
//! audit record, give the memory back, and keep serving a well-behaved agent and `agentctl
//! list` throughout. Root only (real agents under the daemon); prints the numbers
//! docs/benchmarks.md quotes.

#![allow(clippy::unwrap_used)]

#[macro_use]
mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::Daemon;
use common::flood::{Bed, now_secs, steps};
use serde_json::Value;

/// Connections the hostile agent opens: `max_conns_per_agent`, the inherited one included.
const CONNS: usize = 16;
/// Bytes of each hostile request: just under the 1 MiB line limit.
const REQUEST: usize = (1 << 20) - 256;
/// `--ipc-stall-timeout` for the test (seconds).
const STALL_SECS: u64 = 2;
/// Seconds of the first phase (large requests, whose error replies are small now).
const FLOOD_SECS: u64 = 8;

/// Floods every connection it may open with large requests for a while, then with pipelined
/// pings whose replies echo a 247-byte id, reading nothing; prints its phases and what it sent.
const HOSTILE: &str = r#"
import json, os, socket, sys, threading, time
def step(**kw):
    c = os.times()
    kw["cpu"] = c.user + c.system
    print(json.dumps(kw), flush=True)
n, size, flood_secs = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
socks = [socket.socket(fileno=int(os.environ["AGENTOS_SOCKET_FD"]))]
for _ in range(n - 1):
    s = socket.socket(socket.AF_UNIX)
    s.connect(os.environ["AGENTOS_SOCKET"])
    socks.append(s)
for i, s in enumerate(socks):
    s.sendall(b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"hostile","version":"0"}}}\n')
    reply = b""
    while not reply.endswith(b"\n"):
        reply += s.recv(65536)
    step(step="initialized", conn=i)
big = (json.dumps({"jsonrpc": "2.0", "id": 1, "method": "x" * size}) + "\n").encode()
pings = b"".join((json.dumps({"jsonrpc": "2.0", "id": "%s-%06d" % ("i" * 240, k), "method": "ping"}) + "\n").encode() for k in range(200))
t0 = time.time()
step(step="connected", n=len(socks), t=t0)
def flood(i, s):
    sent = 0
    try:
        while time.time() < t0 + flood_secs:
            s.sendall(big)
            sent += len(big)
        step(step="no-read", conn=i, sent=sent, t=time.time())
        while True:
            s.sendall(pings)
    except OSError as e:
        step(step="closed", conn=i, sent=sent, errno=e.errno)
ts = [threading.Thread(target=flood, args=(i, s)) for i, s in enumerate(socks)]
for t in ts:
    t.start()
for t in ts:
    t.join()
step(step="done")
time.sleep(3600)
"#;

/// Calls a quick tool in a loop on its inherited connection, reading every reply; prints each
/// call's start time and latency.
const POLITE: &str = r#"
import json, os, socket, time
s = socket.socket(fileno=int(os.environ["AGENTOS_SOCKET_FD"]))
f = s.makefile("rwb", buffering=0)
def send(**kw):
    kw["jsonrpc"] = "2.0"
    f.write((json.dumps(kw) + "\n").encode())
def recv():
    return f.readline()
send(id=0, method="initialize", params={"protocolVersion": "2025-06-18", "capabilities": {},
     "clientInfo": {"name": "polite", "version": "0"}})
recv()
send(method="notifications/initialized")
# An unknown method of 100 000 bytes: the error names it, bounded.
send(id="big", method="m" * 100000)
r = recv()
print(json.dumps({"bounded": len(r), "message": json.loads(r)["error"]["message"]}), flush=True)
i = 0
while True:
    i += 1
    t0 = time.time()
    send(id=i, method="tools/call", params={"name": "echo.fast", "arguments": {}})
    r = json.loads(recv())
    ok = "result" in r and not r["result"].get("isError", False)
    print(json.dumps({"step": "call", "t": t0, "ms": (time.time() - t0) * 1000, "ok": ok}), flush=True)
    time.sleep(0.05)
"#;

/// The daemon's resident memory in bytes (`VmRSS` of /proc/PID/status).
fn rss(pid: u32) -> u64 {
    common::mem::hwm_rss_kib(pid).1 * 1024
}

/// The daemon's CPU time so far, all threads, user and system (seconds).
fn cpu_secs(pid: u32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // After the command name in parentheses: fields 3.. ; utime and stime are fields 14 and 15.
    let rest = &s[s.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    // SAFETY: sysconf reads a constant of the system; no pointers.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// The `q` quantile (0..=1) of `v`, nearest rank.
fn quantile(v: &[f64], q: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    if s.is_empty() {
        return f64::NAN;
    }
    let i = ((q * s.len() as f64).ceil() as usize).clamp(1, s.len()) - 1;
    s[i]
}

/// `agentctl list`'s latency, answered or not.
fn timed_list(d: &Daemon) -> Duration {
    let t = Instant::now();
    let out = d.ctl(&["list"]);
    assert!(
        out.status.success(),
        "agentctl list failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    t.elapsed()
}

fn audit_records(state: &Path) -> Vec<Value> {
    let o = std::process::Command::new(common::agentctl_bin())
        .args(["audit", "show", "--json", "--state-dir"])
        .arg(state)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn wait_for<T>(what: &str, secs: u64, d: &Daemon, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {secs} s waiting for {what}\ndaemon log:\n{}",
            d.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// What the daemon may hold for one agent at most with the default limits (docs/ipc.md,
/// "Bounded in bytes"): the agent bound, plus per connection what a pause can let through (one
/// receive of 64 KiB completing a line of `max_line`), the line being assembled, and the line
/// the session has in hand with its parsed form and its reply (each about one line); plus 32 MiB
/// for the allocator (freed chunks of 1 MiB lines not reused at once, per-thread arenas).
fn bound_for_one_agent() -> u64 {
    let l = agentosd::ipc::Limits::default();
    let per_conn = (l.max_line + 64 * 1024) + l.max_line + 3 * l.max_line;
    (l.agent_bytes + CONNS * per_conn + (32 << 20)) as u64
}

/// The daemon, its bus and cgroup, and the two agents' contracts.
struct Fixture {
    // The daemon goes before its bus and cgroup.
    d: Daemon,
    bed: Bed,
    polite: std::path::PathBuf,
    hostile: std::path::PathBuf,
}

impl Fixture {
    fn new() -> Fixture {
        let bed = Bed::new("ipc-bytes", HOSTILE, POLITE);
        let tools = bed.tools.clone();
        let stall = STALL_SECS.to_string();
        let mut flags = vec![
            "--tools-dir".to_string(),
            tools.to_str().unwrap().to_string(),
            "--ipc-stall-timeout".into(),
            stall,
            // The byte rate alone holds the flood here (the CPU share has tests/ipc_cpu.rs).
            "--ipc-agent-cpu".into(),
            "0".into(),
        ];
        // For measuring without the rate (docs/benchmarks.md): AGENTOS_TEST_IPC_RATE=0.
        if let Ok(r) = std::env::var("AGENTOS_TEST_IPC_RATE") {
            flags.extend(["--ipc-agent-rate".to_string(), r]);
        }
        // And without the lower priority of the agents' work: AGENTOS_TEST_AGENT_NICE=0.
        if let Ok(n) = std::env::var("AGENTOS_TEST_AGENT_NICE") {
            flags.extend(["--agent-work-nice".to_string(), n]);
        }
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let d = Daemon::start_with(&bed.bus, &bed.cg.path, bed.dir.path(), &flags);
        let (conns, request, secs) = (
            CONNS.to_string(),
            REQUEST.to_string(),
            FLOOD_SECS.to_string(),
        );
        // Zero tool capabilities for the hostile agent: what any agent can do.
        let (polite, hostile) = bed.contracts(&[&conns, &request, &secs]);
        Fixture {
            d,
            bed,
            polite,
            hostile,
        }
    }

    fn log(&self, agent: &str) -> std::path::PathBuf {
        self.bed.log(agent)
    }
}

/// What [`sample`] saw: `agentctl list` latencies and the daemon's CPU time, each with the time
/// it was taken, and the daemon's peak RSS.
struct Samples {
    list: Vec<(f64, f64)>,
    cpu: Vec<(f64, f64)>,
    peak: u64,
}

impl Samples {
    /// The daemon's CPU use over `[from, to)`, in percent of one CPU.
    fn cpu_percent(&self, from: f64, to: f64) -> f64 {
        let w: Vec<&(f64, f64)> = self
            .cpu
            .iter()
            .filter(|(t, _)| *t >= from && *t < to)
            .collect();
        match (w.first(), w.last()) {
            (Some(a), Some(b)) if b.0 > a.0 => (b.1 - a.1) / (b.0 - a.0) * 100.0,
            _ => f64::NAN,
        }
    }
}

/// `agentctl list` timed every 100 ms (with the time it started), the daemon's CPU time and its
/// peak RSS, until `done` or `secs`; `must` says the end must come from `done`.
fn sample(f: &Fixture, secs: u64, must: bool, mut done: impl FnMut() -> bool) -> Samples {
    let pid = f.d.pid();
    let mut s = Samples {
        list: Vec::new(),
        cpu: Vec::new(),
        peak: rss(pid),
    };
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let t = now_secs();
        s.cpu.push((t, cpu_secs(pid)));
        s.list.push((t, timed_list(&f.d).as_secs_f64() * 1000.0));
        s.peak = s.peak.max(rss(pid));
        if done() {
            return s;
        }
        if Instant::now() >= deadline {
            assert!(
                !must,
                "not done in {secs} s; the hostile agent's log: {}\ndaemon log:\n{}",
                std::fs::read_to_string(f.log("hostile")).unwrap_or_default(),
                f.d.log_text()
            );
            return s;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The values of `v` whose time is in `[from, to)`.
fn window(v: &[(f64, f64)], from: f64, to: f64) -> Vec<f64> {
    v.iter()
        .filter(|(t, _)| *t >= from && *t < to)
        .map(|(_, x)| *x)
        .collect()
}

fn p50_p99(v: &[f64]) -> String {
    format!(
        "p50 {:.1} p99 {:.1} max {:.1} (n={})",
        quantile(v, 0.5),
        quantile(v, 0.99),
        quantile(v, 1.0),
        v.len()
    )
}

#[test]
fn an_agent_flooding_the_daemon_is_throttled_bounded_then_disconnected() {
    skip_unless_capable!();
    if !Path::new("/usr/bin/python3").exists() {
        common::skip(module_path!(), "no /usr/bin/python3 for the agents");
        return;
    }
    let f = Fixture::new();
    let d = &f.d;
    let pid = d.pid();
    let (polite_log, hostile_log) = (f.log("polite"), f.log("hostile"));

    // Quiet: the polite agent's calls and `agentctl list` without the attack.
    d.ctl_ok(&["start", f.polite.to_str().unwrap()]);
    wait_for("5 calls of the polite agent", 60, d, || {
        (steps(&polite_log).len() >= 5).then_some(())
    });
    let quiet_from = now_secs();
    let quiet = sample(&f, 6, false, || false);
    let before = rss(pid);
    let attack_start = now_secs();

    // The attack, while sampling the daemon's RSS and `agentctl list`.
    d.ctl_ok(&["start", f.hostile.to_str().unwrap()]);
    let closed_n = || {
        steps(&hostile_log)
            .iter()
            .filter(|v| v["step"] == "closed")
            .count()
    };
    let attacked = sample(&f, 90, true, || closed_n() == CONNS);
    let peak = attacked.peak;
    let attack_end = now_secs();
    // Memory returns: a few seconds for the sessions to end and the allocator to give back.
    std::thread::sleep(Duration::from_secs(3));
    let after = rss(pid);

    let hs = steps(&hostile_log);
    let at = |v: &Value| v["t"].as_f64().unwrap();
    let connected = at(hs.iter().find(|v| v["step"] == "connected").unwrap());
    let no_read: Vec<&Value> = hs.iter().filter(|v| v["step"] == "no-read").collect();
    assert_eq!(
        no_read.len(),
        CONNS,
        "every connection went through the flood phase without being closed: {hs:?}"
    );
    let flood_end = no_read.iter().map(|v| at(v)).fold(f64::MAX, f64::min);
    let stall_from = no_read.iter().map(|v| at(v)).fold(0.0, f64::max);
    // The hostile agent's own CPU (its process, all threads) in each phase: with no cgroup
    // `cpu` controller it competes with the polite agent for the same CPUs.
    let cpu_at = |v: &Value| v["cpu"].as_f64().unwrap_or(f64::NAN);
    let first_no_read = no_read
        .iter()
        .min_by(|a, b| at(a).total_cmp(&at(b)))
        .unwrap();
    let last_closed = hs
        .iter()
        .filter(|v| v["step"] == "closed")
        .max_by(|a, b| cpu_at(a).total_cmp(&cpu_at(b)));
    let connected_v = hs.iter().find(|v| v["step"] == "connected").unwrap();
    eprintln!(
        "ipc_bytes: the hostile agent's own CPU: {:.0}% of one CPU flooding large requests, {:.0}% sending pings it does not read",
        (cpu_at(first_no_read) - cpu_at(connected_v)) / (flood_end - connected) * 100.0,
        last_closed.map_or(f64::NAN, |c| (cpu_at(c) - cpu_at(first_no_read))
            / (attack_end - flood_end).max(0.1)
            * 100.0),
    );

    // The polite agent's calls went on during the attack, every one answered.
    let calls: Vec<(f64, f64)> = steps(&polite_log)
        .iter()
        .map(|c| {
            assert_eq!(c["ok"], true, "{c}");
            (c["t"].as_f64().unwrap(), c["ms"].as_f64().unwrap())
        })
        .collect();
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let bound = bound_for_one_agent();
    eprintln!(
        "ipc_bytes: daemon VmRSS before {:.1} MiB, peak during {:.1} MiB, after {:.1} MiB \
         (bound {:.1} MiB over before); attack {:.1} s (flood of large requests {:.1} s, \
         no-read {:.1} s)",
        mib(before),
        mib(peak),
        mib(after),
        mib(bound),
        attack_end - attack_start,
        flood_end - connected,
        attack_end - stall_from,
    );
    for (name, from, to) in [
        ("quiet", quiet_from, attack_start),
        ("large-request flood", connected, flood_end),
        ("no-read", stall_from, attack_end),
        ("whole attack", attack_start, attack_end),
    ] {
        let s = if name == "quiet" { &quiet } else { &attacked };
        eprintln!(
            "ipc_bytes: {name}: polite tools/call ms {}; agentctl list ms {}; daemon CPU {:.0}%",
            p50_p99(&window(&calls, from, to)),
            p50_p99(&window(&s.list, from, to)),
            s.cpu_percent(from, to)
        );
    }
    check_bounded_errors(&polite_log);
    check_rate(&f, &no_read, connected);
    check_memory(before, peak, after, bound);
    check_stalls(&f, &hs);

    let attack = window(&calls, attack_start, attack_end);
    assert!(
        !attack.is_empty(),
        "no call of the polite agent completed during the attack"
    );
    let attack_list: Vec<f64> = attacked.list.iter().map(|(_, ms)| *ms).collect();
    for (what, v) in [("a polite call", &attack), ("agentctl list", &attack_list)] {
        assert!(
            quantile(v, 1.0) < 5000.0,
            "{what} took {:.0} ms during the attack",
            quantile(v, 1.0)
        );
    }
}

/// The error answering an unknown method of 100 000 bytes quotes a bounded piece of it.
fn check_bounded_errors(polite_log: &Path) {
    let text = std::fs::read_to_string(polite_log).unwrap();
    let b: Value = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v.get("bounded").is_some())
        .unwrap_or_else(|| panic!("no bounded-error line in the polite agent's log:\n{text}"));
    assert!(b["bounded"].as_u64().unwrap() < 1024, "{b}");
    let msg = b["message"].as_str().unwrap();
    assert!(msg.contains("…(100000 bytes)"), "{msg}");
}

/// The flood phase was read at the agent's rate, and the daemon said it throttled the agent.
fn check_rate(f: &Fixture, no_read: &[&Value], connected: f64) {
    let l = agentosd::ipc::Limits::default();
    let rate = match std::env::var("AGENTOS_TEST_IPC_RATE") {
        Ok(r) => r.parse::<u64>().unwrap(),
        Err(_) => l.agent_rate,
    };
    let sent: u64 = no_read.iter().map(|v| v["sent"].as_u64().unwrap()).sum();
    let secs = no_read
        .iter()
        .map(|v| v["t"].as_f64().unwrap() - connected)
        .fold(0.0, f64::max);
    eprintln!(
        "ipc_bytes: the hostile agent sent {:.1} MiB of large requests in {secs:.1} s ({:.1} MiB/s; rate {:.1} MiB/s)",
        sent as f64 / (1 << 20) as f64,
        sent as f64 / secs / (1 << 20) as f64,
        rate as f64 / (1 << 20) as f64
    );
    if rate == 0 {
        return;
    }
    // What the daemon read (the rate over the phase, the burst, one receive per connection
    // into debt) plus what waits in the kernel per connection (a socket buffer each way) and
    // the request being written.
    let wmem: u64 = std::fs::read_to_string("/proc/sys/net/core/wmem_default")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(212_992);
    let burst = (rate / 2).max((l.max_line + (64 << 10)) as u64);
    let slack = CONNS as u64 * (REQUEST as u64 + (64 << 10) + 2 * wmem);
    let allowed = (rate as f64 * secs) as u64 + burst + slack;
    assert!(
        sent <= allowed,
        "the hostile agent got {sent} bytes read in {secs:.1} s; its rate allows {allowed}"
    );
    let journal = f.d.ctl_ok(&["logs", "hostile"]);
    assert!(
        journal.contains("more than its rate") && journal.contains("--ipc-agent-rate"),
        "journal:\n{journal}"
    );
    let recs: Vec<Value> = audit_records(&f.d.state_dir)
        .into_iter()
        .filter(|r| r["detail"]["event"] == "socket-throttled")
        .collect();
    assert!(!recs.is_empty(), "no socket-throttled record");
    // At most one report per agent every 10 s.
    assert!(recs.len() <= 2 + (secs / 10.0) as usize * 2, "{recs:#?}");
    for r in &recs {
        assert_eq!(r["agent"], "hostile", "{r}");
        assert_eq!(r["detail"]["rate"].as_u64(), Some(rate), "{r}");
        assert!(r["detail"]["pauses"].as_u64().unwrap() >= 1, "{r}");
    }
}

fn check_memory(before: u64, peak: u64, after: u64, bound: u64) {
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    assert!(
        peak.saturating_sub(before) <= bound,
        "the daemon's RSS grew by {:.1} MiB during the attack (before {:.1} MiB, peak {:.1} \
         MiB); the limits allow {:.1} MiB",
        mib(peak.saturating_sub(before)),
        mib(before),
        mib(peak),
        mib(bound)
    );
    let margin = 32 << 20;
    assert!(
        after <= before + margin,
        "the daemon's RSS did not come back: before {:.1} MiB, after {:.1} MiB",
        mib(before),
        mib(after)
    );
}

/// Every connection was closed by the daemon once the agent stopped reading, with the record:
/// in the agent's journal and the audit trail, one per connection (under the rate limit's
/// burst), with the bound.
fn check_stalls(f: &Fixture, hs: &[Value]) {
    let closed: Vec<&Value> = hs.iter().filter(|v| v["step"] == "closed").collect();
    assert_eq!(closed.len(), CONNS);
    for c in &closed {
        let errno = c["errno"].as_i64().unwrap();
        assert!(
            errno == libc::EPIPE as i64 || errno == libc::ECONNRESET as i64,
            "{c}"
        );
    }
    let journal = f.d.ctl_ok(&["logs", "hostile"]);
    let notes = journal
        .lines()
        .filter(|l| l.contains("did not read its replies"))
        .count();
    assert_eq!(notes, CONNS, "journal:\n{journal}");
    let recs: Vec<Value> = audit_records(&f.d.state_dir)
        .into_iter()
        .filter(|r| r["detail"]["event"] == "socket-stalled")
        .collect();
    assert_eq!(recs.len(), CONNS, "{recs:#?}");
    for r in &recs {
        assert_eq!(
            (&r["tenant"], &r["agent"]),
            (&"default".into(), &"hostile".into()),
            "{r}"
        );
        assert_eq!(r["decision"], "deny", "{r}");
        assert!(
            r["detail"]["stalled_ms"].as_u64().unwrap() >= STALL_SECS * 1000,
            "{r}"
        );
        assert_eq!(
            r["detail"]["limit"].as_u64().unwrap(),
            agentosd::ipc::Limits::default().outbound_bytes as u64,
            "{r}"
        );
    }
}

/// The ipc layer alone (io_uring, no root): a peer that writes requests whose replies are as
/// large and reads none. The daemon side answers every line; the ring must stop reading once the
/// replies queued reach the outbound bound, hold no more than the bounds say, and close the
/// connection after the stall timeout with a [`Disconnect`] report; a second connection of the
/// same agent that reads its replies is served throughout.
#[test]
fn the_ring_stops_reading_a_peer_that_does_not_read_and_disconnects_it() {
    use agentosd::ipc::{AgentRef, Connection, Inbound, Limits};
    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::net::UnixStream;

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let limits = Limits {
        inbound_bytes: 256 << 10,
        outbound_bytes: 256 << 10,
        agent_bytes: 1 << 20,
        stall_timeout: Duration::from_millis(800),
        max_line: 64 << 10,
        ..Limits::default()
    };
    let Some((ipc, incoming)) = common::start_ipc(&rt, limits.clone(), module_path!()) else {
        return;
    };
    let agent = AgentRef {
        id: "t/flood".into(),
        cgroup: "/nowhere/agents/t/flood".into(),
        cgroup_dir: "/nonexistent/agents/t/flood".into(),
        uid: 65534,
        gid: 65534,
    };
    // The daemon side: every line answered with itself (as large as the request).
    let taken = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut conns = incoming.conns;
    let t2 = taken.clone();
    rt.spawn(async move {
        while let Some(c) = conns.recv().await {
            let t = t2.clone();
            tokio::spawn(async move {
                let Connection { mut rx, tx, .. } = c;
                while let Some(m) = rx.recv().await {
                    if let Inbound::Line(l) = m {
                        if l.len() > 1024 {
                            t.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        if tx.send(l).await.is_err() {
                            break;
                        }
                    }
                }
            });
        }
    });
    let flood: UnixStream = ipc.pair(&agent).unwrap().into();
    let polite: UnixStream = ipc.pair(&agent).unwrap().into();
    let line = format!("{}\n", "y".repeat(60 << 10));
    let writer = {
        let mut f = flood.try_clone().unwrap();
        let line = line.clone();
        std::thread::spawn(move || {
            let mut sent = 0u64;
            while f.write_all(line.as_bytes()).is_ok() {
                sent += 1;
            }
            sent
        })
    };
    // The polite connection is answered while the other one floods.
    let mut reader = BufReader::new(polite.try_clone().unwrap());
    let mut w = polite;
    for i in 0..20 {
        writeln!(w, "{{\"n\":{i}}}").unwrap();
        let mut l = String::new();
        reader.read_line(&mut l).unwrap();
        assert_eq!(l.trim(), format!("{{\"n\":{i}}}"));
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut disconnects = incoming.disconnects;
    let d = rt
        .block_on(async { tokio::time::timeout(Duration::from_secs(20), disconnects.recv()).await })
        .unwrap_or_else(|_| {
            panic!(
                "no disconnect report within 20 s; ipc stats {:?}; lines the daemon took {}",
                ipc.stats(),
                taken.load(std::sync::atomic::Ordering::Relaxed)
            )
        })
        .expect("report channel open");
    let sent = writer.join().unwrap();
    assert_eq!(d.agent, "t/flood");
    assert!(d.stalled >= limits.stall_timeout, "{d:?}");
    assert_eq!(d.limit, limits.outbound_bytes);
    // The daemon held at most its bounds (plus one line each side) when it closed it.
    assert!(d.outbound <= limits.outbound_bytes + line.len(), "{d:?}");
    assert!(
        d.inbound <= limits.inbound_bytes + 64 * 1024 + line.len(),
        "{d:?}"
    );
    // It stopped reading: the peer wrote far less than it would have if the daemon read on
    // (the kernel's socket buffers and the bounds), and the daemon took fewer lines still.
    let took = taken.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        took < sent,
        "took {took} of {sent}: {d:?} {:?}",
        ipc.stats()
    );
    assert!(
        sent < 200,
        "the peer wrote {sent} lines of 60 KiB before the daemon closed it"
    );
    assert_eq!(ipc.stats().stalled, 1);
    assert!(ipc.stats().outbound_pauses >= 1);
    // The polite connection still works.
    writeln!(w, "{{\"after\":1}}").unwrap();
    let mut l = String::new();
    reader.read_line(&mut l).unwrap();
    assert_eq!(l.trim(), "{\"after\":1}");
}
