//! The daemon's CPU per agent (issue 15, "Isolation"; `--ipc-agent-cpu`, ipc/cpu.rs). A hostile
//! agent with no tool capability sends requests that are cheap in bytes and dear in the daemon's
//! CPU (pipelined `tools/call`s of a tool it does not hold: each a gate decision, a denial record
//! and an error reply), on 4 connections, reading its replies. With a CPU share the daemon holds
//! it near that share (its own account, and the threads that serve agents in
//! /proc/PID/task/*/stat), says so (a `socket-throttled` record with `limit: cpu`, its status);
//! without one it takes more; a polite agent's tool calls are answered throughout. The share is
//! work-conserving (`--ipc-agent-cpu-ceiling`): alone under the ceiling the same agent is not
//! held at all; with a second one flooding past the ceiling both are held to about half of it
//! and the polite agent never; with the ceiling at 0 the share is the hard cap it was. Root only
//! (real agents under the daemon); prints the numbers docs/benchmarks.md quotes.

#![allow(clippy::unwrap_used)]

#[macro_use]
mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::Daemon;
use common::flood::{Bed, now_secs, steps};
use serde_json::Value;

/// Seconds the attack is measured for.
const ATTACK_SECS: u64 = 8;
/// The share the test sets, percent of one CPU.
const SHARE_PERCENT: f64 = 5.0;
/// The burst it sets, ms of CPU.
const BURST_MS: u64 = 100;
/// The share as a hard cap (`--ipc-agent-cpu-ceiling 0`).
const HARD_CAP: [&str; 2] = ["--ipc-agent-cpu-ceiling", "0"];
/// The ceiling of the contended test, percent of one CPU: both hostile agents flooding take
/// more (each 30-38% alone in a debug build), their fair share is half of it.
const CEILING_PERCENT: f64 = 20.0;

/// Pipelines denied tool calls on 4 connections, reading (and counting) the replies.
const HOSTILE: &str = r#"
import json, os, socket, threading, time
socks = [socket.socket(fileno=int(os.environ["AGENTOS_SOCKET_FD"]))]
for _ in range(3):
    s = socket.socket(socket.AF_UNIX)
    s.connect(os.environ["AGENTOS_SOCKET"])
    socks.append(s)
for s in socks:
    s.sendall(b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"hostile","version":"0"}}}\n')
    r = b""
    while not r.endswith(b"\n"):
        r += s.recv(65536)
batch = b"".join((json.dumps({"jsonrpc": "2.0", "id": k, "method": "tools/call",
    "params": {"name": "echo.fast", "arguments": {"k": k}}}) + "\n").encode() for k in range(64))
replies = [0] * len(socks)
def read(i, s):
    while True:
        d = s.recv(1 << 20)
        if not d:
            return
        replies[i] += d.count(b"\n")
def send(s):
    while True:
        s.sendall(batch)
for i, s in enumerate(socks):
    threading.Thread(target=read, args=(i, s), daemon=True).start()
    threading.Thread(target=send, args=(s,), daemon=True).start()
print(json.dumps({"step": "flooding", "t": time.time()}), flush=True)
while True:
    time.sleep(1)
    print(json.dumps({"step": "replies", "t": time.time(), "n": sum(replies)}), flush=True)
"#;

/// Connects to its socket and closes, in a loop on 4 threads: each accept costs the daemon the
/// peer's identity from the kernel and /proc.
const CONNECTOR: &str = r#"
import json, os, socket, threading, time
n = [0]
def loop():
    while True:
        try:
            s = socket.socket(socket.AF_UNIX)
            s.connect(os.environ["AGENTOS_SOCKET"])
            s.close()
            n[0] += 1
        except OSError:
            time.sleep(0.001)
for _ in range(4):
    threading.Thread(target=loop, daemon=True).start()
print(json.dumps({"step": "flooding", "t": time.time()}), flush=True)
while True:
    time.sleep(1)
    print(json.dumps({"step": "replies", "t": time.time(), "n": n[0]}), flush=True)
"#;

/// Calls a quick tool every 100 ms, reading every reply; prints each call's outcome.
const POLITE: &str = r#"
import json, os, socket, time
s = socket.socket(fileno=int(os.environ["AGENTOS_SOCKET_FD"]))
f = s.makefile("rwb", buffering=0)
def send(**kw):
    kw["jsonrpc"] = "2.0"
    f.write((json.dumps(kw) + "\n").encode())
send(id=0, method="initialize", params={"protocolVersion": "2025-06-18", "capabilities": {},
     "clientInfo": {"name": "polite", "version": "0"}})
f.readline()
send(method="notifications/initialized")
i = 0
while True:
    i += 1
    t0 = time.time()
    send(id=i, method="tools/call", params={"name": "echo.fast", "arguments": {}})
    r = json.loads(f.readline())
    ok = "result" in r and not r["result"].get("isError", False)
    print(json.dumps({"step": "call", "t": t0, "ms": (time.time() - t0) * 1000, "ok": ok}), flush=True)
    time.sleep(0.1)
"#;

/// [`POLITE`] beside three processes of its own that spin: its cgroup always has a task waiting
/// for a CPU on this 2-CPU machine (its `cpu.pressure`), though it is far within its share of
/// the daemon's CPU.
fn polite_waiting_for_a_cpu() -> String {
    format!(
        "import os\nfor _ in range(3):\n    if os.fork() == 0:\n        while True:\n            pass\n{POLITE}"
    )
}

/// CPU seconds (user + system) of the daemon's threads: all of them, and those that serve
/// agents (`agentos-ipc`, the ring; `agentos-agents…`, the sessions' runtime).
fn daemon_cpu(pid: u32) -> (f64, f64) {
    // SAFETY: sysconf reads a constant of the system; no pointers.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let (mut all, mut agents) = (0.0, 0.0);
    for e in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let Ok(s) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (s.find('('), s.rfind(')')) else {
            continue;
        };
        let comm = &s[open + 1..close];
        let f: Vec<&str> = s[close + 2..].split_whitespace().collect();
        let t = (f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap()) / hz;
        all += t;
        if comm.starts_with("agentos-ipc") || comm.starts_with("agentos-agents") {
            agents += t;
        }
    }
    (all, agents)
}

/// The daemon CPU spent for `agent` by its own account (status `daemon_cpu`), seconds.
fn account(d: &Daemon, agent: &str) -> (f64, u64) {
    let st = d.status_json(agent);
    let c = &st["daemon_cpu"];
    (
        c["used_nsec"].as_u64().unwrap_or(0) as f64 / 1e9,
        c["throttles"].as_u64().unwrap_or(0),
    )
}

/// What one run measured over the attack window.
#[derive(Debug)]
struct Run {
    secs: f64,
    /// Percent of one CPU: the whole daemon, its agent-serving threads, the hostile agent's
    /// account, the polite agent's account.
    daemon: f64,
    agent_threads: f64,
    hostile: f64,
    polite: f64,
    hostile_throttles: u64,
    /// The other hostile agents' accounts (percent of one CPU) and holds.
    others: Vec<(f64, u64)>,
    polite_throttles: u64,
    replies_per_sec: f64,
    polite_calls: usize,
    polite_p50_ms: f64,
    polite_max_ms: f64,
    records: Vec<Value>,
}

/// One daemon with `--ipc-agent-cpu share` (percent) and `extra` flags, the polite agent, then
/// the hostile one running `script`.
fn run(share: f64, script: &str, extra: &[&str]) -> Run {
    run_many(share, script, POLITE, extra, &[])
}

/// [`run`] with the polite agent running `polite` and more hostile agents running `script`
/// beside the first (`others`: their names).
fn run_many(share: f64, script: &str, polite: &str, extra: &[&str], others: &[&str]) -> Run {
    let _one_at_a_time = serial();
    let bed = Bed::new("ipc-cpu", script, polite);
    let (share_s, burst_s) = (share.to_string(), BURST_MS.to_string());
    let mut flags = vec![
        "--tools-dir",
        bed.tools.to_str().unwrap(),
        "--ipc-agent-cpu",
        &share_s,
        "--ipc-agent-cpu-burst",
        &burst_s,
    ];
    flags.extend_from_slice(extra);
    let d = Daemon::start_with(&bed.bus, &bed.cg.path, bed.dir.path(), &flags);
    let (polite, hostile) = bed.contracts(&[]);
    let log = |a: &str| bed.log(a);
    d.ctl_ok(&["start", polite.to_str().unwrap()]);
    wait_for(&d, "3 calls of the polite agent", || {
        steps(&log("polite")).len() >= 3
    });
    let t = bed.files.display();
    let mut hostiles = vec![hostile];
    hostiles.extend(others.iter().map(|name| {
        common::contract(
            bed.dir.path(),
            name,
            &format!("{{ command: /usr/bin/python3, args: [\"{t}/hostile.py\"] }}"),
            &format!(
                "capabilities:\n  - fs.read: [\"{t}\"]\n  - fs.exec: [/usr, /bin, /lib]\n\
                 compute: {{ pids: 64 }}\n"
            ),
        )
    }));
    for h in &hostiles {
        d.ctl_ok(&["start", h.to_str().unwrap()]);
    }
    for name in std::iter::once(&"hostile").chain(others) {
        wait_for(&d, &format!("{name} flooding"), || {
            steps(&log(name)).iter().any(|v| v["step"] == "flooding")
        });
    }
    // Past the burst and the first second, then the window.
    std::thread::sleep(Duration::from_secs(1));
    let pid = d.pid();
    let (from, c0, h0, p0) = (
        now_secs(),
        daemon_cpu(pid),
        account(&d, "hostile"),
        account(&d, "polite"),
    );
    let o0: Vec<(f64, u64)> = others.iter().map(|n| account(&d, n)).collect();
    std::thread::sleep(Duration::from_secs(ATTACK_SECS));
    let (to, c1, h1, p1) = (
        now_secs(),
        daemon_cpu(pid),
        account(&d, "hostile"),
        account(&d, "polite"),
    );
    let o1: Vec<(f64, u64)> = others.iter().map(|n| account(&d, n)).collect();
    let secs = to - from;
    let pct = |a: f64, b: f64| (b - a) / secs * 100.0;
    let replies: Vec<(f64, f64)> = steps(&log("hostile"))
        .iter()
        .filter(|v| v["step"] == "replies")
        .map(|v| (v["t"].as_f64().unwrap(), v["n"].as_f64().unwrap()))
        .filter(|(t, _)| *t >= from && *t <= to)
        .collect();
    let replies_per_sec = match (replies.first(), replies.last()) {
        (Some(a), Some(b)) if b.0 > a.0 => (b.1 - a.1) / (b.0 - a.0),
        _ => 0.0,
    };
    let calls: Vec<Value> = steps(&log("polite"))
        .into_iter()
        .filter(|v| v["t"].as_f64().is_some_and(|t| t >= from && t < to))
        .collect();
    for c in &calls {
        assert_eq!(c["ok"], true, "a polite call failed during the attack: {c}");
    }
    let mut ms: Vec<f64> = calls.iter().map(|c| c["ms"].as_f64().unwrap()).collect();
    ms.sort_by(f64::total_cmp);
    let records: Vec<Value> = common::audit_records(bed.dir.path())
        .into_iter()
        .filter(|r| r.to_string().contains("socket-throttled"))
        .collect();
    let r = Run {
        secs,
        daemon: pct(c0.0, c1.0),
        agent_threads: pct(c0.1, c1.1),
        hostile: pct(h0.0, h1.0),
        polite: pct(p0.0, p1.0),
        hostile_throttles: h1.1,
        others: o0
            .iter()
            .zip(&o1)
            .map(|(a, b)| (pct(a.0, b.0), b.1))
            .collect(),
        polite_throttles: p1.1,
        replies_per_sec,
        polite_calls: ms.len(),
        polite_p50_ms: ms.get(ms.len() / 2).copied().unwrap_or(f64::NAN),
        polite_max_ms: ms.last().copied().unwrap_or(f64::NAN),
        records,
    };
    eprintln!(
        "ipc_cpu: --ipc-agent-cpu {share}: over {:.1} s the daemon used {:.1}% of one CPU \
         (agent threads {:.1}%); the hostile agent's account {:.1}%, {:.0} requests/s, \
         held {} time(s); others {:?}; the polite agent's account {:.2}%, held {} time(s), \
         {} calls, p50 {:.1} ms max {:.1} ms; extra flags {extra:?}",
        r.secs,
        r.daemon,
        r.agent_threads,
        r.hostile,
        r.replies_per_sec,
        r.hostile_throttles,
        r.others,
        r.polite,
        r.polite_throttles,
        r.polite_calls,
        r.polite_p50_ms,
        r.polite_max_ms
    );
    r
}

/// The tests of this file one at a time: each measures the daemon's CPU and the agents' waits
/// for a CPU on a 2-CPU machine, which another test's flood beside it would change (and a wait
/// for a CPU now holds agents over their share: `--ipc-agent-cpu-stall`).
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn wait_for(d: &Daemon, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !f() {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}\ndaemon log:\n{}",
            d.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn python() -> Option<PathBuf> {
    Some(PathBuf::from("/usr/bin/python3")).filter(|p| p.exists())
}

#[test]
fn an_agent_dear_in_cpu_is_held_to_its_share_of_the_daemon() {
    skip_unless_capable!();
    if python().is_none() {
        common::skip(module_path!(), "no /usr/bin/python3 for the agents");
        return;
    }
    let held = run(SHARE_PERCENT, HOSTILE, &HARD_CAP);
    let free = run(0.0, HOSTILE, &[]);
    check(&held, &free, false);
}

/// Work-conserving: the same agent alone, the daemon otherwise idle and under a ceiling it
/// cannot reach, is not held although it takes several times its share (by the ceiling's rule:
/// `--ipc-agent-cpu-stall 0`).
#[test]
fn an_agent_alone_under_the_ceiling_is_not_held_to_its_share() {
    skip_unless_capable!();
    if python().is_none() {
        common::skip(module_path!(), "no /usr/bin/python3 for the agents");
        return;
    }
    // The byte rate off: alone on the machine (the tests run one at a time) the daemon may read
    // this flood at the byte rate's ceiling (14 700 calls a second), whose holds are not what
    // this test is about. The stall rule off: the flood and the daemon fill both CPUs of this
    // machine, and the polite agent then waits for one 10-15% of some periods, which holds the
    // flood by that rule (the test below); this one is about the ceiling.
    let alone = run(
        SHARE_PERCENT,
        HOSTILE,
        &[
            "--ipc-agent-cpu-ceiling",
            "400",
            "--ipc-agent-rate",
            "0",
            "--ipc-agent-cpu-stall",
            "0",
        ],
    );
    assert!(
        alone.hostile > SHARE_PERCENT * 1.5,
        "alone under the ceiling the hostile agent took only {:.1}% (share {SHARE_PERCENT}%): {alone:?}",
        alone.hostile
    );
    assert_eq!(alone.hostile_throttles, 0, "held alone: {alone:?}");
    assert!(
        alone
            .records
            .iter()
            .all(|r| !r.to_string().contains("\"limit\":\"cpu\"")),
        "a CPU throttle record under the ceiling: {:?}",
        alone.records
    );
    assert_eq!(alone.polite_throttles, 0, "{alone:?}");
    assert!(alone.polite_calls >= 10, "polite calls: {alone:?}");
}

/// Two agents flooding past the ceiling: both are held, together back to about the ceiling,
/// each to about its fair share (half of it), with records that say the daemon was contended;
/// the polite agent is never held and its calls are answered.
#[test]
fn over_the_ceiling_the_heavy_agents_are_held_and_the_polite_one_never() {
    skip_unless_capable!();
    if python().is_none() {
        common::skip(module_path!(), "no /usr/bin/python3 for the agents");
        return;
    }
    let ceiling = CEILING_PERCENT.to_string();
    let r = run_many(
        SHARE_PERCENT,
        HOSTILE,
        POLITE,
        &["--ipc-agent-cpu-ceiling", &ceiling],
        &["hostile2"],
    );
    let (h2, h2_throttles) = r.others[0];
    assert!(
        r.hostile_throttles > 0 && h2_throttles > 0,
        "both flooding agents should be held over the ceiling: {r:?}"
    );
    // Generous bounds: the accounts are charged after the fact (the requests already read, up
    // to 4 × 64 denied calls per hold: 21.5-26.2% measured for the 20% ceiling) and the host is
    // shared. Each alone takes 28-39% of a CPU in a debug build, so both unheld 55-80%.
    let both = r.hostile + h2;
    assert!(
        both <= CEILING_PERCENT * 1.75 + 2.0,
        "the flooding agents took {:.1}% + {h2:.1}% with a ceiling of {CEILING_PERCENT}%: {r:?}",
        r.hostile
    );
    for (name, got) in [("hostile", r.hostile), ("hostile2", h2)] {
        assert!(
            got >= SHARE_PERCENT * 0.5,
            "{name} got {got:.1}%, starved below half its share: {r:?}"
        );
    }
    let contended = r.records.iter().any(|x| {
        let d = &x["detail"];
        d["event"] == "socket-throttled"
            && d["limit"] == "cpu"
            && d["contended"] == true
            && d["ceiling_permille"].as_u64() == Some((CEILING_PERCENT * 10.0) as u64)
            && d["fair_permille"].as_u64().is_some_and(|f| f >= 50)
    });
    assert!(
        contended,
        "no socket-throttled record saying the daemon was contended: {:?}",
        r.records
    );
    assert!(
        r.records
            .iter()
            .all(|x| x["agent"] != "polite" || x["detail"]["event"] != "socket-throttled"),
        "the polite agent was throttled: {:?}",
        r.records
    );
    assert_eq!(r.polite_throttles, 0, "the polite agent was held: {r:?}");
    assert!(r.polite_calls >= 10, "polite calls: {r:?}");
}

/// Work-conserving only while the CPU has room (`--ipc-agent-cpu-stall`, ipc/stalls.rs): the
/// same agent under a ceiling it cannot reach is held to its share while the polite agent, within
/// its own, waits for a CPU (three spinning processes of its own on this 2-CPU machine); the
/// record says so and names the threshold; the polite agent is never held and its calls are
/// answered. (Without the wait, the test above: not held.)
#[test]
fn under_the_ceiling_an_agent_is_held_while_another_waits_for_a_cpu() {
    skip_unless_capable!();
    if python().is_none() {
        common::skip(module_path!(), "no /usr/bin/python3 for the agents");
        return;
    }
    if agentosd::cgroup::cgroup2_mount()
        .is_none_or(|m| agentosd::ipc::stalls::available(&m).is_err())
    {
        common::skip(
            module_path!(),
            "this kernel reports no cpu.pressure (PSI) for cgroups",
        );
        return;
    }
    let r = run_many(
        SHARE_PERCENT,
        HOSTILE,
        &polite_waiting_for_a_cpu(),
        &["--ipc-agent-cpu-ceiling", "400"],
        &[],
    );
    assert!(
        r.hostile_throttles > 0,
        "not held while the polite agent waited: {r:?}"
    );
    let stalled = r.records.iter().find(|x| {
        let d = &x["detail"];
        x["agent"] == "hostile"
            && d["event"] == "socket-throttled"
            && d["limit"] == "cpu"
            && d["contended"] == true
            && d["stall_threshold_permille"].as_u64() == Some(100)
            && d["stall_permille"].as_u64().is_some_and(|p| p > 100)
    });
    assert!(
        stalled.is_some(),
        "no socket-throttled record naming another agent's wait for a CPU: {:?}",
        r.records
    );
    // Held to its share, not to a fair share of the ceiling (400%): generous for a debug build
    // whose requests already read are charged after the hold (alone, unheld: 28-39%).
    assert!(
        r.hostile <= SHARE_PERCENT * 3.0 + 2.0,
        "the hostile agent took {:.1}% while held to {SHARE_PERCENT}%: {r:?}",
        r.hostile
    );
    assert_eq!(r.polite_throttles, 0, "the polite agent was held: {r:?}");
    assert!(r.polite_calls >= 10, "polite calls: {r:?}");
}

/// The same for the other route into the daemon an agent has on its socket: connecting and
/// closing in a loop. The byte rate is off, so that the CPU share alone holds the accepts.
#[test]
fn an_agent_connecting_in_a_loop_is_held_to_its_share_of_the_daemon() {
    skip_unless_capable!();
    if python().is_none() {
        common::skip(module_path!(), "no /usr/bin/python3 for the agents");
        return;
    }
    let no_rate = ["--ipc-agent-rate", "0"];
    let hard: Vec<&str> = no_rate.iter().chain(&HARD_CAP).copied().collect();
    let held = run(SHARE_PERCENT, CONNECTOR, &hard);
    let free = run(0.0, CONNECTOR, &no_rate);
    check(&held, &free, true);
}

/// Prints one step and sleeps: an agent that asks the daemon for nothing.
const IDLE: &str = r#"
import json, time
print(json.dumps({"step": "idle", "t": time.time()}), flush=True)
while True:
    time.sleep(60)
"#;

/// The audit trail's writer and syncer threads charge their CPU for an agent's records to the
/// agent's account (issue 15, "Isolation measured"; audit crate, cost.rs): while the hostile
/// agent floods, its account's audit part (`daemon_cpu.audit_nsec`, within `used_nsec`) grows,
/// an idle agent's does not.
#[test]
fn the_audit_writers_cpu_for_an_agents_records_is_charged_to_it() {
    skip_unless_capable!();
    if python().is_none() {
        common::skip(module_path!(), "no /usr/bin/python3 for the agents");
        return;
    }
    let _one_at_a_time = serial();
    let bed = Bed::new("ipc-cpu-audit", HOSTILE, IDLE);
    // No rate: counted only, so the flood is never held and the test measures the accounting.
    let flags = [
        "--tools-dir",
        bed.tools.to_str().unwrap(),
        "--ipc-agent-cpu",
        "0",
    ];
    let d = Daemon::start_with(&bed.bus, &bed.cg.path, bed.dir.path(), &flags);
    let (idle, hostile) = bed.contracts(&[]);
    d.ctl_ok(&["start", idle.to_str().unwrap()]);
    d.ctl_ok(&["start", hostile.to_str().unwrap()]);
    let log = |a: &str| bed.log(a);
    wait_for(&d, "the idle agent", || !steps(&log("polite")).is_empty());
    wait_for(&d, "hostile flooding", || {
        steps(&log("hostile"))
            .iter()
            .any(|v| v["step"] == "flooding")
    });
    std::thread::sleep(Duration::from_secs(1));
    let cpu = |a: &str| {
        let c = d.status_json(a)["daemon_cpu"].clone();
        (
            c["used_nsec"].as_u64().unwrap_or(0),
            c["audit_nsec"].as_u64().unwrap_or(0),
        )
    };
    let (h0, i0) = (cpu("hostile"), cpu("polite"));
    std::thread::sleep(Duration::from_secs(3));
    let (h1, i1) = (cpu("hostile"), cpu("polite"));
    let (used, audit) = (h1.0 - h0.0, h1.1 - h0.1);
    eprintln!(
        "ipc_cpu audit: over 3 s the hostile agent's account grew {:.1} ms, of which the audit \
         trail's threads {:.2} ms ({:.1}%); the idle agent's audit part {} ns",
        used as f64 / 1e6,
        audit as f64 / 1e6,
        audit as f64 * 100.0 / used.max(1) as f64,
        i1.1 - i0.1
    );
    assert!(
        audit > 0,
        "the audit writer charged the flooding agent nothing: {h0:?} → {h1:?}"
    );
    assert!(h1.1 <= h1.0, "the audit part exceeds the whole: {h1:?}");
    assert_eq!(i1.1, i0.1, "the idle agent was charged audit work");
}

fn check(held: &Run, free: &Run, summary_ok: bool) {
    // Held: its account at about the share (the burst is spent before the window).
    assert!(
        held.hostile <= SHARE_PERCENT * 1.5 + 1.0,
        "the hostile agent took {:.1}% of a CPU of the daemon with a share of {SHARE_PERCENT}%: {held:?}",
        held.hostile
    );
    assert!(
        held.hostile_throttles > 0,
        "the hostile agent was never held: {held:?}"
    );
    // The record says which rate held it; when the agent's refused connections used up the
    // denial records' rate first, it is counted in their summary (the byte rate is off there,
    // so only the CPU share can have throttled it).
    let cpu_record = held.records.iter().any(|r| {
        r["detail"]["event"] == "socket-throttled"
            && r["detail"]["limit"] == "cpu"
            && r["detail"]["cpu_permille"].as_u64() == Some((SHARE_PERCENT * 10.0) as u64)
    });
    let summarised = summary_ok
        && held.records.iter().any(|r| {
            r["detail"]["event"] == "socket-events-suppressed"
                && r["detail"]["by"]["socket-throttled"].as_u64() >= Some(1)
        });
    assert!(
        cpu_record || summarised,
        "no socket-throttled record with limit cpu: {:?}",
        held.records
    );
    // Without the share it takes more, by its own account and by the threads serving agents.
    assert!(
        free.hostile > held.hostile * 2.0 && free.hostile > SHARE_PERCENT * 2.0,
        "without a CPU share the hostile agent took {:.1}% (with: {:.1}%)",
        free.hostile,
        held.hostile
    );
    assert!(
        free.agent_threads > held.agent_threads,
        "agent threads {:.1}% without the share, {:.1}% with",
        free.agent_threads,
        held.agent_threads
    );
    assert!(
        free.records
            .iter()
            .all(|r| !r.to_string().contains("\"limit\":\"cpu\"")),
        "a CPU throttle without a CPU share: {:?}",
        free.records
    );
    // The polite agent was served in both (every call in the window answered, checked in run).
    for r in [held, free] {
        assert!(r.polite_calls >= 10, "polite calls: {r:?}");
    }
}
