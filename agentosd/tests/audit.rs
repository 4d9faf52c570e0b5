//! The audit trail in the daemon: lifecycle records in order with the binding hash, `agentctl
//! audit show/verify` on an honest log, verify failing on an edited byte and naming the record,
//! and the daemon refusing new starts (fail closed) while its log cannot be written. Root only.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;

use common::{
    Bus, Daemon, TestCgroup, audit, audit_records as records, contract, output_text as text,
};

const TICKER: &str =
    r#"{ command: /bin/sh, args: ["-c", "while true; do echo tick; sleep 0.2; done"] }"#;

fn events_of(recs: &[serde_json::Value], agent: &str) -> Vec<String> {
    recs.iter()
        .filter(|r| r["agent"] == agent && r["kind"] == "lifecycle")
        .map(|r| r["detail"]["event"].as_str().unwrap_or("").to_string())
        .collect()
}

#[test]
fn lifecycle_records_verify_and_tampering_is_caught() {
    skip_unless_capable!();
    let bus = Bus::start();
    let cg = TestCgroup::new("audit");
    let dir = tempfile::tempdir().unwrap();
    let mut d = Daemon::start(&bus, &cg.path, dir.path());
    let state = dir.path();

    // The key was created at first start: 0600 private, 0644 public.
    use std::os::unix::fs::PermissionsExt as _;
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&state.join("audit.key")), 0o600);
    assert_eq!(mode(&state.join("audit.key.pub")), 0o644);

    let f = contract(state, "ticker", TICKER, "");
    d.ctl_ok(&["start", f.to_str().unwrap()]);
    let st = d.wait_state("ticker", "running", 5);
    let pid = st["main_pid"].as_u64().unwrap();
    // A second start while it runs is refused, and the refusal is recorded.
    let again = d.ctl(&["start", f.to_str().unwrap()]);
    assert_ne!(again.status.code(), Some(0));
    d.ctl_ok(&["freeze", "ticker"]);
    d.ctl_ok(&["thaw", "ticker"]);
    d.ctl_ok(&["stop", "ticker"]);
    d.wait_state("ticker", "inactive", 10);
    // A run that exits by itself with a failure.
    let g = contract(
        state,
        "crasher",
        r#"{ command: /bin/sh, args: ["-c", "exit 3"] }"#,
        "",
    );
    d.ctl_ok(&["start", g.to_str().unwrap()]);
    d.wait_state("crasher", "failed", 5);
    // A contract that does not parse is refused and recorded (no agent name to give).
    let bad = state.join("broken.yaml");
    std::fs::write(
        &bad,
        "apiVersion: agentos/v0.2\nkind: AgentContract\nname: [\n",
    )
    .unwrap();
    assert_ne!(
        d.ctl(&["start", bad.to_str().unwrap()]).status.code(),
        Some(0)
    );
    // SIGTERM: the daemon closes the log with a final signed checkpoint.
    d.terminate();

    let recs = records(state);
    assert_eq!(recs[0]["detail"]["event"], "log-created", "{recs:#?}");
    assert!(
        recs.iter()
            .any(|r| r["detail"]["event"] == "daemon-started"),
        "{recs:#?}"
    );
    assert_eq!(
        events_of(&recs, "ticker"),
        ["start", "started", "refused", "freeze", "thaw", "stopped"],
        "{recs:#?}"
    );
    let by = |agent: &str, ev: &str| {
        recs.iter()
            .find(|r| r["agent"] == agent && r["detail"]["event"] == ev)
            .unwrap()
            .clone()
    };
    let start = by("ticker", "start");
    assert_eq!(start["tenant"], "default");
    assert_eq!(start["decision"], "allow");
    let binding = start["binding"].as_str().unwrap();
    assert_eq!(
        binding.len(),
        64,
        "the sealed binding manifest hash: {start}"
    );
    assert_eq!(
        start["detail"]["contract_sha256"].as_str().unwrap().len(),
        64
    );
    let started = by("ticker", "started");
    assert_eq!(started["detail"]["pid"].as_u64(), Some(pid));
    assert!(
        started["detail"]["cgroup"]
            .as_str()
            .unwrap()
            .ends_with("/agents/default/ticker")
    );
    assert_eq!(started["binding"].as_str(), Some(binding));
    let refused = by("ticker", "refused");
    assert_eq!(refused["decision"], "deny");
    assert!(
        refused["detail"]["reason"]
            .as_str()
            .unwrap()
            .contains("already running"),
        "{refused}"
    );
    assert_eq!(by("ticker", "stopped")["detail"]["result"], "stopped");
    assert_eq!(
        events_of(&recs, "crasher"),
        ["start", "started", "failed"],
        "{recs:#?}"
    );
    let broken = recs
        .iter()
        .find(|r| r["detail"]["event"] == "refused" && r["agent"] == "")
        .unwrap_or_else(|| panic!("no refusal of broken.yaml: {recs:#?}"));
    assert_eq!(broken["decision"], "deny");
    assert_eq!(broken["detail"]["error"], "InvalidContract");
    assert!(
        broken["detail"]["origin"]
            .as_str()
            .unwrap()
            .ends_with("broken.yaml")
    );
    let failed = by("crasher", "failed");
    assert_eq!(failed["detail"]["exit_code"], 3);
    assert_eq!(failed["detail"]["result"], "exit-code");
    assert_eq!(
        recs.last().unwrap()["kind"],
        "checkpoint",
        "closed with a checkpoint"
    );
    // seqs are contiguous and time never goes back
    for w in recs.windows(2) {
        assert_eq!(
            w[1]["seq"].as_u64(),
            Some(w[0]["seq"].as_u64().unwrap() + 1)
        );
        assert!(w[1]["time_us"].as_u64() >= w[0]["time_us"].as_u64());
    }

    // The human view, filtered by agent.
    let o = audit(state, &["show", "--agent", "crasher"]);
    let shown = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    eprintln!("agentctl audit show --agent crasher:\n{shown}");
    assert_eq!(shown.lines().count(), 3, "{shown}");
    assert!(shown.contains("default/crasher"), "{shown}");

    // An honest log verifies.
    let o = audit(state, &["verify"]);
    eprintln!("honest log: {}", text(&o));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains(": OK: "),
        "{}",
        text(&o)
    );

    // Edit one byte of the "started" record: verify fails and names it.
    let log = state.join("audit/audit.log");
    let bytes = std::fs::read(&log).unwrap();
    let seq = started["seq"].as_u64().unwrap();
    let needle = format!("\"pid\":{pid}");
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle.as_bytes())
        .unwrap();
    let mut edited = bytes.clone();
    let digit = at + needle.len() - 1;
    edited[digit] = if edited[digit] == b'1' { b'2' } else { b'1' };
    std::fs::write(&log, &edited).unwrap();
    let o = audit(state, &["verify"]);
    eprintln!("one byte edited: {}", text(&o));
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&format!("first bad record: seq {seq}")),
        "{}",
        text(&o)
    );

    std::fs::write(&log, &bytes).unwrap();
    let o = audit(state, &["verify"]);
    assert_eq!(o.status.code(), Some(0), "restored: {}", text(&o));

    // A log the daemon cannot open for writing (here: another writer holds its lock): the
    // daemon runs, but refuses new starts and says why (fail closed).
    let holder = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
    use std::os::fd::AsRawFd as _;
    // SAFETY: flock on an fd we own; released when `holder` is dropped.
    let rc = unsafe { libc::flock(holder.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    assert_eq!(rc, 0, "lock the log");
    d.spawn();
    let o = d.ctl(&["start", f.to_str().unwrap()]);
    eprintln!("start while the log is locked: {}", text(&o));
    assert_ne!(o.status.code(), Some(0), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("audit trail") && err.contains("fail closed") && err.contains("locked"),
        "{}",
        text(&o)
    );
    assert!(d.log_text().contains("cannot open the audit trail"));
    assert_eq!(
        std::fs::read_to_string(cg.path.join("agents/default/ticker/main/cgroup.procs"))
            .unwrap_or_default(),
        "",
        "nothing runs"
    );
    d.terminate();
    drop(holder);
    assert_eq!(std::fs::read(&log).unwrap(), bytes, "the log is untouched");
}

#[test]
fn kill9_mid_storm_leaves_a_log_that_reopens_and_verifies() {
    skip_unless_capable!();
    let bus = Bus::start();
    let cg = TestCgroup::new("auditkill");
    let dir = tempfile::tempdir().unwrap();
    let mut d = Daemon::start(&bus, &cg.path, dir.path());
    let state = dir.path();
    // A flapping agent: every run writes start, started, exited-restarting, restarted records.
    let f = contract(
        state,
        "flapper",
        r#"{ command: /bin/true }"#,
        "restart: { policy: always, limit: 100000, backoff_ms: 1, max_backoff_ms: 1 }\n",
    );
    d.ctl_ok(&["start", f.to_str().unwrap()]);
    let t = contract(state, "ticker", TICKER, "");
    d.ctl_ok(&["start", t.to_str().unwrap()]);
    std::thread::sleep(std::time::Duration::from_millis(1500));
    d.kill9();
    let before = std::fs::metadata(state.join("audit/audit.log"))
        .unwrap()
        .len();
    assert!(before > 0);
    // The next daemon reopens the log (cutting a torn tail if the kill left one), re-adopts,
    // and the whole chain verifies.
    d.spawn();
    d.wait_state("ticker", "running", 10);
    let recs = records(state);
    let flaps = events_of(&recs, "flapper")
        .iter()
        .filter(|e| *e == "start")
        .count();
    assert!(flaps >= 3, "the storm ran: {flaps} starts");
    assert!(
        events_of(&recs, "ticker").contains(&"re-adopted".to_string()),
        "{recs:#?}"
    );
    // Every run that got a pid had its start decision durable first.
    let started: Vec<_> = recs
        .iter()
        .filter(|r| r["agent"] == "flapper" && r["detail"]["event"] == "started")
        .collect();
    for s in &started {
        let seq = s["seq"].as_u64().unwrap();
        assert!(
            recs.iter().any(|r| r["agent"] == "flapper"
                && r["detail"]["event"] == "start"
                && r["seq"].as_u64().unwrap() < seq),
            "started at seq {seq} without a start before it"
        );
    }
    d.ctl_ok(&["stop", "flapper", "ticker"]);
    d.terminate();
    let o = audit(state, &["verify"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}
