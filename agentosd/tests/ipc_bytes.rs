//! A hostile agent against the daemon's memory (issue 15, "Bounded in bytes, per agent"): on all
//! 16 connections it may open it sends requests of nearly 1 MiB whose error replies echo them
//! (the method name), and never reads a reply. The daemon must hold a bounded number of bytes for
//! it (its RSS stays under what the limits allow), stop reading it, close its connections after
//! the stall timeout with a journal line and a `socket-stalled` audit record, give the memory
//! back, and keep serving a well-behaved agent and `agentctl list` throughout. Root only (real
//! agents under the daemon); prints the numbers docs/benchmarks.md quotes.

#![allow(clippy::unwrap_used)]

#[macro_use]
mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use common::{Bus, Daemon, TestCgroup};
use serde_json::Value;

/// Connections the hostile agent opens: `max_conns_per_agent`, the inherited one included.
const CONNS: usize = 16;
/// Bytes of each hostile request: just under the 1 MiB line limit.
const REQUEST: usize = (1 << 20) - 256;
/// `--ipc-stall-timeout` for the test (seconds).
const STALL_SECS: u64 = 2;

/// Floods every connection it may open with requests whose error replies are as large, reading
/// nothing; prints a step per connection the daemon closes.
const HOSTILE: &str = r#"
import json, os, socket, sys, threading, time
def step(**kw):
    print(json.dumps(kw), flush=True)
n, size = int(sys.argv[1]), int(sys.argv[2])
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
# The daemon answers 'method "<method>" is not served: ...': as large as the request.
line = (json.dumps({"jsonrpc": "2.0", "id": 1, "method": "x" * size}) + "\n").encode()
step(step="connected", n=len(socks))
def flood(i, s):
    sent = 0
    try:
        while True:
            s.sendall(line)
            sent += 1
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
    return json.loads(f.readline())
send(id=0, method="initialize", params={"protocolVersion": "2025-06-18", "capabilities": {},
     "clientInfo": {"name": "polite", "version": "0"}})
recv()
send(method="notifications/initialized")
i = 0
while True:
    i += 1
    t0 = time.time()
    send(id=i, method="tools/call", params={"name": "echo.fast", "arguments": {}})
    r = recv()
    ok = "result" in r and not r["result"].get("isError", False)
    print(json.dumps({"step": "call", "t": t0, "ms": (time.time() - t0) * 1000, "ok": ok}), flush=True)
    time.sleep(0.05)
"#;

fn write(p: &Path, text: &str, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    if let Some(d) = p.parent() {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::write(p, text).unwrap();
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn steps(log: &Path) -> Vec<Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v.get("step").is_some())
        .collect()
}

/// The daemon's resident memory in bytes (`VmRSS` of /proc/PID/status).
fn rss(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = s
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS in /proc/{pid}/status"));
    kb * 1024
}

fn now_secs() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
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

#[test]
fn an_agent_that_does_not_read_its_replies_is_bounded_then_disconnected() {
    skip_unless_capable!();
    let python = Path::new("/usr/bin/python3");
    if !python.exists() {
        common::skip(module_path!(), "no /usr/bin/python3 for the agents");
        return;
    }
    let bus = Bus::start();
    let cg = TestCgroup::new("ipc-bytes");
    let dir = tempfile::tempdir().unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    }
    let files = dir.path().join("t");
    write(&files.join("hostile.py"), HOSTILE, 0o644);
    write(&files.join("polite.py"), POLITE, 0o644);
    let tools = dir.path().join("tools.d");
    write(
        &tools.join("echo-fast.yaml"),
        r#"apiVersion: agentos/v0.2
kind: Tool
name: echo.fast
description: Answer at once (the well-behaved agent's call).
risk: low
timeout_ms: 20000
exec:
  command: /bin/sh
  args: ["-c", "cat >/dev/null; echo '{}'"]
input_schema: {type: object}
"#,
        0o644,
    );
    let stall = STALL_SECS.to_string();
    let d = Daemon::start_with(
        &bus,
        &cg.path,
        dir.path(),
        &[
            "--tools-dir",
            tools.to_str().unwrap(),
            "--ipc-stall-timeout",
            &stall,
        ],
    );
    let t = files.display();
    let sandbox = format!("  - fs.read: [\"{t}\"]\n  - fs.exec: [/usr, /bin, /lib]\n");
    let polite = common::contract(
        dir.path(),
        "polite",
        &format!("{{ command: /usr/bin/python3, args: [\"{t}/polite.py\"] }}"),
        &format!("capabilities:\n  - echo.fast\n{sandbox}compute: {{ pids: 64 }}\n"),
    );
    // Zero tool capabilities: what any agent can do.
    let hostile = common::contract(
        dir.path(),
        "hostile",
        &format!(
            "{{ command: /usr/bin/python3, args: [\"{t}/hostile.py\", \"{CONNS}\", \"{REQUEST}\"] }}"
        ),
        &format!("capabilities:\n{sandbox}compute: {{ pids: 64 }}\n"),
    );
    let polite_log = dir.path().join("logs/default/polite.log");
    let hostile_log = dir.path().join("logs/default/hostile.log");
    let pid = d.pid();

    // Quiet: the polite agent's calls and `agentctl list` without the attack.
    d.ctl_ok(&["start", polite.to_str().unwrap()]);
    wait_for("20 calls of the polite agent", 60, &d, || {
        let n = steps(&polite_log).len();
        (n >= 20).then_some(())
    });
    let quiet_list: Vec<f64> = (0..20)
        .map(|_| timed_list(&d).as_secs_f64() * 1000.0)
        .collect();
    let before = rss(pid);
    let attack_start = now_secs();

    // The attack, while sampling the daemon's RSS and `agentctl list`.
    d.ctl_ok(&["start", hostile.to_str().unwrap()]);
    let mut peak = before;
    let mut attack_list = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let closed = loop {
        peak = peak.max(rss(pid));
        attack_list.push(timed_list(&d).as_secs_f64() * 1000.0);
        peak = peak.max(rss(pid));
        let s = steps(&hostile_log);
        let closed: Vec<Value> = s.into_iter().filter(|v| v["step"] == "closed").collect();
        if closed.len() == CONNS {
            break closed;
        }
        assert!(
            Instant::now() < deadline,
            "the hostile agent's connections were not all closed in 60 s ({} of {CONNS}); \
             its log: {}\ndaemon log:\n{}",
            closed.len(),
            std::fs::read_to_string(&hostile_log).unwrap_or_default(),
            d.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let attack_end = now_secs();
    // Memory returns: a few seconds for the sessions to end and the allocator to give back.
    std::thread::sleep(Duration::from_secs(3));
    let after = rss(pid);

    // Every connection was closed by the daemon (the agent saw EPIPE or ECONNRESET), each
    // after the agent had written more than the daemon holds for it.
    for c in &closed {
        let errno = c["errno"].as_i64().unwrap();
        assert!(
            errno == libc::EPIPE as i64 || errno == libc::ECONNRESET as i64,
            "{c}"
        );
    }
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let bound = bound_for_one_agent();
    // The polite agent's calls went on during the attack, every one answered.
    let calls = steps(&polite_log);
    let window = |from: f64, to: f64| -> Vec<f64> {
        calls
            .iter()
            .filter(|c| {
                let t = c["t"].as_f64().unwrap();
                t >= from && t < to
            })
            .map(|c| {
                assert_eq!(c["ok"], true, "{c}");
                c["ms"].as_f64().unwrap()
            })
            .collect()
    };
    let quiet = window(0.0, attack_start);
    let attack = window(attack_start, attack_end);
    eprintln!(
        "ipc_bytes: daemon VmRSS before {:.1} MiB, peak during {:.1} MiB, after {:.1} MiB \
         (bound {:.1} MiB over before); attack {:.1} s\n\
         ipc_bytes: polite tools/call ms quiet p50 {:.1} p99 {:.1} (n={}), under attack p50 {:.1} \
         p99 {:.1} (n={})\n\
         ipc_bytes: agentctl list ms quiet p50 {:.1} p99 {:.1} (n={}), under attack p50 {:.1} \
         p99 {:.1} (n={})",
        mib(before),
        mib(peak),
        mib(after),
        mib(bound),
        attack_end - attack_start,
        quantile(&quiet, 0.5),
        quantile(&quiet, 0.99),
        quiet.len(),
        quantile(&attack, 0.5),
        quantile(&attack, 0.99),
        attack.len(),
        quantile(&quiet_list, 0.5),
        quantile(&quiet_list, 0.99),
        quiet_list.len(),
        quantile(&attack_list, 0.5),
        quantile(&attack_list, 0.99),
        attack_list.len(),
    );
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

    // The record: in the agent's journal and the audit trail, one per connection (under the
    // rate limit's burst), with the bound and the bytes dropped.
    let journal = d.ctl_ok(&["logs", "hostile"]);
    let notes = journal
        .lines()
        .filter(|l| l.contains("did not read its replies"))
        .count();
    assert_eq!(notes, CONNS, "journal:\n{journal}");
    let recs: Vec<Value> = audit_records(&d.state_dir)
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

    assert!(
        !attack.is_empty(),
        "no call of the polite agent completed during the attack"
    );
    assert!(
        quantile(&attack, 1.0) < 5000.0,
        "a polite call took {:.0} ms during the attack",
        quantile(&attack, 1.0)
    );
    assert!(
        quantile(&attack_list, 1.0) < 5000.0,
        "agentctl list took {:.0} ms during the attack",
        quantile(&attack_list, 1.0)
    );
}

/// The ipc layer alone (io_uring, no root): a peer that writes requests whose replies are as
/// large and reads none. The daemon side answers every line; the ring must stop reading once the
/// replies queued reach the outbound bound, hold no more than the bounds say, and close the
/// connection after the stall timeout with a [`Disconnect`] report; a second connection of the
/// same agent that reads its replies is served throughout.
#[test]
fn the_ring_stops_reading_a_peer_that_does_not_read_and_disconnects_it() {
    use agentosd::ipc::{AgentRef, Connection, Inbound, IpcError, IpcServer, Limits};
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
    let started = {
        let _g = rt.enter();
        IpcServer::start(limits.clone())
    };
    let (ipc, incoming) = match started {
        Ok(x) => x,
        Err(e @ (IpcError::Ring { .. } | IpcError::Unsupported { .. })) => {
            common::skip(module_path!(), &format!("no usable io_uring here: {e}"));
            return;
        }
        Err(e) => panic!("IpcServer::start: {e}"),
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
        .expect("a disconnect report within 20 s")
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
