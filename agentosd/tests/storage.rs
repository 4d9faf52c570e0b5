//! Disk full is a state, not an outage: the daemon's state and audit directory on a 24 MiB tmpfs
//! of the test's own, filled with a file of the test's. Below the reserve the daemon says so (the
//! Manager's StorageState over D-Bus, read by busctl and by `agentctl status`, and signalled once
//! per change), refuses a new start naming the file system, the free space and the reserve,
//! refuses the flooding agent's tool calls while another agent's keep running, and summarises
//! refusals instead of recording them; filled to the last byte, an audit write fails (ENOSPC) and
//! the chain still verifies; freed, the daemon recovers by itself — state back to normal, the log
//! reopened and written again, a start works — without a restart. Root only (mount).

#![allow(clippy::unwrap_used)]

mod common;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::caller::{answers, caller_contract, wait_answer};
use common::{
    Bus, Daemon, TestCgroup, Tmpfs, audit, audit_records as records, contract, output_text as text,
};

const TICKER: &str =
    r#"{ command: /bin/sh, args: ["-c", "while true; do echo tick; sleep 0.2; done"] }"#;

const MIB: u64 = 1 << 20;

/// p50, max and count of the round trips of answers `from..=to`.
fn latencies(all: &[serde_json::Value], from: u64, to: u64) -> (u64, u64, usize) {
    let mut v: Vec<u64> = all
        .iter()
        .filter(|a| a["i"].as_u64().is_some_and(|i| (from..=to).contains(&i)))
        .filter_map(|a| a["us"].as_u64())
        .collect();
    v.sort_unstable();
    (v[v.len() / 2], *v.last().unwrap(), v.len())
}

/// Write `bytes` of zeros (really allocated: tmpfs has no holes for written data) to `path`,
/// or until the file system is full; returns what was written.
fn fill(path: &Path, bytes: u64) -> u64 {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    let chunk = vec![0u8; 64 << 10];
    let mut done = 0;
    while done < bytes {
        let n = chunk.len().min((bytes - done) as usize);
        match f.write(&chunk[..n]) {
            Ok(0) | Err(_) => break,
            Ok(w) => done += w as u64,
        }
    }
    done
}

/// `agentctl status --json` without an agent: the daemon's line.
fn daemon_status(d: &Daemon) -> serde_json::Value {
    serde_json::from_str(&d.ctl_ok(&["status", "--json"])).unwrap()
}

/// The Manager's StorageState as busctl reads it (the raw D-Bus property).
fn busctl_state(d: &Daemon) -> Option<String> {
    let o = Command::new("busctl")
        .arg(format!("--address={}", d.bus))
        .args([
            "get-property",
            "org.agentos1",
            "/org/agentos1",
            "org.agentos1.Manager",
            "StorageState",
        ])
        .output()
        .ok()?;
    o.status
        .success()
        .then(|| String::from_utf8_lossy(&o.stdout).trim().to_string())
}

/// Subscribe to the daemon's signals on a connection of our own and forward every
/// `StorageState` that a `PropertiesChanged` of the manager carries.
fn storage_signals(bus: &str) -> std::sync::mpsc::Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let addr = bus.to_string();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            use futures_util::StreamExt as _;
            let conn = zbus::connection::Builder::address(addr.as_str())
                .build()
                .await
                .unwrap();
            let props = zbus::fdo::PropertiesProxy::new(&conn, "org.agentos1", "/org/agentos1")
                .await
                .unwrap();
            let mut changes = props.receive_properties_changed().await.unwrap();
            conn.call_method(
                Some("org.agentos1"),
                "/org/agentos1",
                Some("org.agentos1.Manager"),
                "Subscribe",
                &(),
            )
            .await
            .unwrap();
            let _ = ready_tx.send(());
            while let Some(sig) = changes.next().await {
                let Ok(args) = sig.args() else { continue };
                if let Some(v) = args.changed_properties().get("StorageState")
                    && let Ok(state) = String::try_from(v.try_clone().unwrap())
                    && tx.send(state).is_err()
                {
                    return;
                }
            }
        });
    });
    ready_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("subscribed to the daemon's signals");
    rx
}

fn wait_storage(d: &Daemon, want: &str, secs: u64) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let st = daemon_status(d);
        if st["storage_state"] == want {
            return st;
        }
        assert!(
            Instant::now() < deadline,
            "storage did not become {want} in {secs} s: {st}\ndaemon log:\n{}",
            d.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn wait_log(d: &Daemon, needle: &str, secs: u64) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !d.log_text().contains(needle) {
        assert!(
            Instant::now() < deadline,
            "the daemon did not log {needle:?} in {secs} s; log:\n{}",
            d.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The test's world: a tmpfs as the daemon's state and audit directory, tools and contracts
/// beside it, the daemon with an 8 MiB reserve checked every 0.2 s. Dropped in this order: the
/// daemon, the mount, the agents' cgroups, the bus, the directory.
struct Bed {
    d: Daemon,
    fs: Tmpfs,
    _cg: TestCgroup,
    _bus: Bus,
    state: PathBuf,
    base: tempfile::TempDir,
}

impl Bed {
    fn new() -> Option<Bed> {
        let base = tempfile::tempdir().unwrap();
        let fs = match Tmpfs::mount(&base.path().join("state"), "tmpfs", "24m", "0755") {
            Ok(m) => m,
            Err(why) => {
                common::skip(module_path!(), &format!("cannot mount a tmpfs: {why}"));
                return None;
            }
        };
        let state = fs.0.clone();
        // Agents (their own uids) read their script here.
        std::fs::set_permissions(
            base.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o711),
        )
        .unwrap();
        let tools = base.path().join("tools.d");
        std::fs::create_dir_all(&tools).unwrap();
        std::fs::copy(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/tools/clock-now.yaml"),
            tools.join("clock-now.yaml"),
        )
        .unwrap();
        let bus = Bus::start();
        let cg = TestCgroup::new("storage");
        let agents_dir = state.join("agents.d");
        std::fs::create_dir_all(&agents_dir).unwrap();
        // The daemon's own log and the contracts live off the tmpfs.
        let mut d = Daemon {
            child: None,
            state_dir: state.clone(),
            agents_dir,
            cgroup_root: cg.path.clone(),
            bus: bus.address.clone(),
            log: base.path().join("agentosd.log"),
            extra: [
                "--storage-reserve",
                "8388608",
                "--storage-reserve-percent",
                "0",
                "--storage-check-interval",
                "0.2",
                "--no-audit-journal",
                "--tools-dir",
                tools.to_str().unwrap(),
            ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        };
        d.spawn();
        Some(Bed {
            d,
            fs,
            _cg: cg,
            _bus: bus,
            state,
            base,
        })
    }
}

/// Where the working agent's answers of each phase start (their `i`).
struct Marks {
    quiet: (u64, u64),
    flood: u64,
}

/// A working agent (clock.now every 0.1 s), then a flooding one (refused calls as fast as it
/// can: a record each) until it has cost the daemon more than the offender minimum.
fn start_work_and_flood(d: &Daemon, dir: &Path) -> Marks {
    let flood = caller_contract(dir, "flood", "no.such.tool", "0.001", "clock.now");
    let work = caller_contract(dir, "work", "clock.now", "0.1", "clock.now");
    d.ctl_ok(&["start", work.to_str().unwrap()]);
    let from = wait_answer(d, "work", 20, "with a result", |a| a["ok"] == true)["i"]
        .as_u64()
        .unwrap();
    wait_answer(d, "work", 20, "20 more", |a| {
        a["i"].as_u64() >= Some(from + 20)
    });
    d.ctl_ok(&["start", flood.to_str().unwrap()]);
    // 256 KiB, the offender minimum, is 512 records.
    wait_answer(d, "flood", 20, "number 1000", |a| {
        a["i"].as_u64() >= Some(1000)
    });
    let flood_from = answers(d, "work").last().unwrap()["i"].as_u64().unwrap() + 1;
    wait_answer(d, "work", 20, "20 under the flood", |a| {
        a["i"].as_u64() >= Some(flood_from + 20)
    });
    Marks {
        quiet: (from, from + 20),
        flood: flood_from,
    }
}

/// While low, the offender is refused first, with the reason; the other agent's tool calls
/// still run (their records are written within the reserve). Prints the round trips.
fn offender_refused_first(d: &Daemon, marks: &Marks) {
    let refused = wait_answer(d, "flood", 10, "refused for storage", |a| {
        a["reason"] == "storage-low"
    });
    assert_eq!(refused["code"], -32005, "{refused}");
    let msg = refused["msg"].as_str().unwrap();
    assert!(
        msg.contains("storage low") && msg.contains("default/flood"),
        "{msg}"
    );
    let low_from = answers(d, "work").last().unwrap()["i"].as_u64().unwrap();
    wait_answer(d, "work", 10, "20 after the refusals", |a| {
        a["i"].as_u64() > Some(low_from + 20)
    });
    let work = answers(d, "work");
    assert!(
        work.iter()
            .filter(|a| a["i"].as_u64() > Some(low_from))
            .all(|a| a["ok"] == true),
        "the other agent's calls run while storage is low"
    );
    assert!(
        work.iter().all(|a| a["reason"] != "storage-low"),
        "the working agent is not an offender"
    );
    let q = latencies(&work, marks.quiet.0, marks.quiet.1);
    let f = latencies(&work, marks.flood, marks.flood + 20);
    let l = latencies(&work, low_from + 1, low_from + 20);
    eprintln!(
        "clock.now round trip of another agent, µs: quiet p50 {} max {} (n {}); under the flood p50 {} max {} (n {}); storage low, the flood refused p50 {} max {} (n {})",
        q.0, q.1, q.2, f.0, f.1, f.2, l.0, l.1, l.2
    );
    d.ctl_ok(&["stop", "flood"]);
    d.ctl_ok(&["stop", "work"]);
}

/// A new start is refused with the file system, its free space and the reserve; returns the
/// message.
fn start_refused(d: &Daemon, contract: &Path, state: &Path) -> String {
    let o = d.ctl(&["start", contract.to_str().unwrap()]);
    assert_ne!(o.status.code(), Some(0), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(err.contains("storage low"), "{err}");
    assert!(err.contains(&state.display().to_string()), "{err}");
    assert!(
        err.contains("free of") && err.contains("reserve 8.0 MiB"),
        "{err}"
    );
    err
}

/// Filled to the last byte: the daemon's next records fail with ENOSPC (fail closed), the
/// daemon stays up and answers, and the chain verifies with the disk still full.
fn audit_write_fails(d: &Daemon, state: &Path) {
    fill(&state.join("filler2"), u64::MAX);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !d.log_text().contains("audit trail failed") {
        // Lifecycle records that are not refusals: written, so they hit the full disk.
        let _ = d.ctl(&["freeze", "a"]);
        let _ = d.ctl(&["thaw", "a"]);
        assert!(
            Instant::now() < deadline,
            "no audit write failed on a full disk; log:\n{}",
            d.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        d.log_text().contains("No space left on device"),
        "{}",
        d.log_text()
    );
    let v = audit(state, &["verify"]);
    assert_eq!(v.status.code(), Some(0), "{}", text(&v));
}

/// After the recovery: records written again (`audit-recovered`, b's `start`), b's refusals
/// summarised rather than recorded, and the chain verifies.
fn records_after_recovery(state: &Path) {
    let recs = records(state);
    let event = |r: &serde_json::Value| r["detail"]["event"].as_str().unwrap_or("").to_string();
    assert!(
        recs.iter().any(|r| event(r) == "audit-recovered"),
        "no audit-recovered record"
    );
    let b_events: Vec<String> = recs
        .iter()
        .filter(|r| r["agent"] == "b" && r["kind"] == "lifecycle")
        .map(event)
        .collect();
    assert!(b_events.contains(&"start".to_string()), "{b_events:?}");
    assert!(
        !b_events.contains(&"refused".to_string()),
        "refusals while low are summarised, not recorded one by one: {b_events:?}"
    );
    // The refusals may fall into one summary window or several (each flushed when it ends).
    let summaries: Vec<&serde_json::Value> = recs
        .iter()
        .filter(|r| event(r) == "refusals-summarised" && r["agent"] == "b")
        .collect();
    assert!(!summaries.is_empty(), "no summary of b's refusals");
    let counted: u64 = summaries
        .iter()
        .map(|r| r["detail"]["count"].as_u64().unwrap())
        .sum();
    assert!(counted >= 2, "{summaries:?}");
    for s in &summaries {
        assert_eq!(s["detail"]["reason"], "storage-low", "{s}");
    }
    let v = audit(state, &["verify"]);
    assert_eq!(v.status.code(), Some(0), "{}", text(&v));
}

#[test]
fn a_full_disk_is_a_state_and_the_daemon_recovers_by_itself() {
    skip_unless_capable!();
    let Some(mut bed) = Bed::new() else { return };
    let (d, state) = (&bed.d, bed.state.clone());
    let signals = storage_signals(&d.bus);
    let st = daemon_status(d);
    assert_eq!(st["storage_state"], "normal", "{st}");
    assert_eq!(st["storage_reserve"], 8 * MIB, "{st}");
    assert_eq!(busctl_state(d).as_deref(), Some("s \"normal\""));
    let a = contract(bed.base.path(), "a", TICKER, "");
    let b = contract(bed.base.path(), "b", TICKER, "");
    d.ctl_ok(&["start", a.to_str().unwrap()]);
    d.wait_state("a", "running", 10);
    let mem = common::mem::MemWatch::start(d.pid(), "storage filled under a refusal flood");
    let marks = start_work_and_flood(d, bed.base.path());

    // Below the reserve (8 MiB): 4 MiB left. Said over D-Bus and by agentctl status.
    let filler = state.join("filler");
    fill(&filler, bed.fs.avail() - 4 * MIB);
    let st = wait_storage(d, "low", 5);
    assert!(st["storage_free"].as_u64().unwrap() < 8 * MIB, "{st}");
    let detail = st["storage_detail"].as_str().unwrap();
    assert!(detail.contains(&state.display().to_string()), "{detail}");
    assert!(detail.contains("reserve 8.0 MiB"), "{detail}");
    assert_eq!(busctl_state(d).as_deref(), Some("s \"low\""));
    let shown = d.ctl_ok(&["status"]);
    assert!(shown.contains("Warning: agentosd storage low"), "{shown}");
    let of_a = d.ctl_ok(&["status", "a"]);
    assert!(of_a.contains("Warning: agentosd storage low"), "{of_a}");
    offender_refused_first(d, &marks);
    let err = start_refused(d, &b, &state);
    d.wait_state("a", "running", 1);
    audit_write_fails(d, &state);
    start_refused(d, &b, &state);

    // Space returns: everything recovers by itself, no restart.
    let pid = d.pid();
    std::fs::remove_file(&filler).unwrap();
    std::fs::remove_file(state.join("filler2")).unwrap();
    let st = wait_storage(d, "normal", 10);
    assert!(st["storage_free"].as_u64().unwrap() > 8 * MIB, "{st}");
    assert_eq!(busctl_state(d).as_deref(), Some("s \"normal\""));
    wait_log(d, "writable again", 10);
    d.ctl_ok(&["start", b.to_str().unwrap()]);
    d.wait_state("b", "running", 10);
    assert_eq!(d.pid(), pid, "the same daemon");
    assert!(!d.ctl_ok(&["status"]).contains("Warning"));

    // Once per transition on D-Bus (PropertiesChanged) and in the daemon's log.
    std::thread::sleep(Duration::from_millis(500));
    let seen: Vec<String> = signals.try_iter().collect();
    assert_eq!(seen, vec!["low", "normal"], "StorageState signals");
    let log = d.log_text();
    assert_eq!(log.matches("storage low: ").count(), 1, "{log}");
    assert_eq!(log.matches("storage back to normal: ").count(), 1, "{log}");

    d.ctl_ok(&["stop", "b"]);
    d.wait_state("b", "inactive", 10);
    mem.finish(Duration::from_secs(1), 64);
    records_after_recovery(&state);
    d.ctl_ok(&["stop", "a"]);
    d.wait_state("a", "inactive", 10);
    bed.d.terminate();
    // What the operator saw, for the record (--nocapture).
    for l in bed.d.log_text().lines().filter(|l| {
        l.contains("storage") || l.contains("audit trail") || l.contains("start failed")
    }) {
        eprintln!("daemon: {l}");
    }
    eprintln!("refused start: {err}");
}
