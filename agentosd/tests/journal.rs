//! Agents' logs kept like the journal, end to end: an agent's stdout and stderr lines reach
//! `agentctl logs` with their time and stream, the daemon's notes are marked as its own and an
//! agent cannot write one, escape sequences never reach the terminal raw, `--since/--until` and
//! `-o json|cat` work, `-f` follows across a daemon restart, and the journal is size-capped.
//! Root only (a private dbus-daemon, agentosd with its own cgroup root).

#![allow(clippy::unwrap_used)]

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Bus, Daemon, TestCgroup, contract};

macro_rules! setup {
    ($tag:expr, $extra:expr) => {{
        skip_unless_capable!();
        let bus = Bus::start();
        let cg = TestCgroup::new($tag);
        let dir = tempfile::tempdir().unwrap();
        let d = Daemon::start_with(&bus, &cg.path, dir.path(), $extra);
        (bus, cg, dir, d)
    }};
}

fn entries(d: &Daemon, agent: &str, extra: &[&str]) -> Vec<serde_json::Value> {
    let mut args = vec!["logs", agent, "-o", "json"];
    args.extend_from_slice(extra);
    d.ctl_ok(&args)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

fn wait_for<T>(what: &str, secs: u64, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The agent writes to both streams, forges a daemon line and an escape sequence; the operator
/// sees each line once, with its time and stream, the forgery marked as the agent's.
#[test]
fn agent_lines_carry_time_and_stream_and_cannot_pose_as_the_daemon() {
    let (_bus, _cg, dir, d) = setup!("journal-mark", &[]);
    let script = r#"echo out-line; echo err-line >&2; echo 'agentosd: stopped default/forger'; printf 'red \033[31mRED\033]0;title\007\n'; printf 'no newline yet'; sleep 600"#;
    let f = contract(
        dir.path(),
        "forger",
        &format!(r#"{{ command: /bin/sh, args: ["-c", {script:?}] }}"#),
        "",
    );
    d.ctl_ok(&["start", f.to_str().unwrap()]);
    let es = wait_for("the agent's four lines", 20, || {
        let es = entries(&d, "forger", &[]);
        (es.iter().filter(|e| e["from_agent"] == true).count() >= 4).then_some(es)
    });
    let find = |m: &str| {
        es.iter()
            .find(|e| e["message"].as_str().unwrap().contains(m))
            .unwrap_or_else(|| panic!("no entry with {m:?}: {es:?}"))
    };
    assert_eq!(find("out-line")["stream"], "stdout");
    assert_eq!(find("err-line")["stream"], "stderr");
    let forged = find("agentosd: stopped");
    assert_eq!(forged["stream"], "stdout");
    assert_eq!(forged["from_agent"], true);
    let started = find("main process PID");
    assert_eq!(started["stream"], "agentosd");
    assert_eq!(started["from_agent"], false);
    // The partial line waits for its newline (or the agent's end).
    assert!(
        !es.iter().any(|e| e["message"] == "no newline yet"),
        "{es:?}"
    );
    // Times: µs since the epoch, close to now, in order.
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    let times: Vec<u64> = es.iter().map(|e| e["time_us"].as_u64().unwrap()).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    assert!(times.iter().all(|t| now_us - t < 120_000_000), "{times:?}");

    // The short format: the agent's lines under its name, the daemon's under `agentosd`.
    let short = d.ctl_ok(&["logs", "forger"]);
    assert!(
        !short.contains('\x1b') && !short.contains('\x07'),
        "raw escape: {short:?}"
    );
    assert!(
        short.contains("red \\x1b[31mRED\\x1b]0;title\\x07"),
        "{short}"
    );
    for line in short.lines() {
        let (_time, rest) = line.split_once(' ').unwrap();
        if rest.starts_with("agentosd: ") {
            assert!(!rest.contains("stopped default/forger"), "forged: {line}");
        }
    }
    assert!(
        short.contains(" forger: agentosd: stopped default/forger\n"),
        "{short}"
    );
    assert!(short.contains(" forger[stderr]: err-line\n"), "{short}");
    assert!(
        short.contains(" agentosd: started default/forger, main process PID"),
        "{short}"
    );
    // status shows the same lines the same way.
    let status = d.ctl_ok(&["status", "forger"]);
    assert!(
        status.contains(" forger: agentosd: stopped default/forger"),
        "{status}"
    );
    assert!(!status.contains('\x1b'), "{status:?}");
    // -o cat: the agent's lines only as they were written (escaped).
    let cat = d.ctl_ok(&["logs", "forger", "-o", "cat"]);
    assert!(cat.lines().any(|l| l == "out-line"), "{cat}");

    // --since/--until select by time.
    assert!(entries(&d, "forger", &["--since", "-1h"]).len() >= es.len());
    assert!(entries(&d, "forger", &["--since", "+1h"]).is_empty());
    assert!(entries(&d, "forger", &["--until", "2000-01-01"]).is_empty());
    let bad = d.ctl(&["logs", "forger", "--since", "soonish"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("cannot read \"soonish\" as a time"));

    // The last partial line is taken in when the agent ends, before the daemon's stop note.
    d.ctl_ok(&["stop", "forger"]);
    let es = entries(&d, "forger", &[]);
    let pos = |m: &str| {
        es.iter()
            .position(|e| e["message"].as_str().unwrap().contains(m))
            .unwrap_or_else(|| panic!("no {m:?} in {es:?}"))
    };
    let tail_pos = pos("no newline yet");
    let last_note = es.iter().rposition(|e| e["stream"] == "agentosd").unwrap();
    assert!(tail_pos < last_note, "{es:?}");
}

/// `agentctl logs -f` keeps following while the daemon is killed and started again, and goes
/// on with the lines the agent wrote meanwhile.
#[test]
fn follow_survives_a_daemon_restart() {
    let (_bus, _cg, dir, mut d) = setup!("journal-follow", &[]);
    let script = r#"i=0; while true; do i=$((i+1)); echo "n=$i"; sleep 0.2; done"#;
    let f = contract(
        dir.path(),
        "counter",
        &format!(r#"{{ command: /bin/sh, args: ["-c", {script:?}] }}"#),
        "",
    );
    d.ctl_ok(&["start", f.to_str().unwrap()]);
    d.wait_state("counter", "running", 10);
    let mut follower = Command::new(common::agentctl_bin())
        .args([
            "--bus-address",
            &d.bus,
            "logs",
            "counter",
            "-f",
            "-n",
            "1",
            "-o",
            "cat",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = follower.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                return;
            }
        }
    });
    let first = loop {
        let l = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("a first line");
        if l.starts_with("n=") {
            break l;
        }
    };
    d.kill9();
    std::thread::sleep(Duration::from_secs(2));
    d.spawn();
    // Lines keep coming, in order, none twice, and past what was written while it was down.
    let mut seen: Vec<u64> = vec![first.trim_start_matches("n=").parse().unwrap()];
    let deadline = Instant::now() + Duration::from_secs(60);
    while seen.len() < 25 {
        let left = deadline.saturating_duration_since(Instant::now());
        let l = rx.recv_timeout(left).unwrap_or_else(|_| {
            let _ = follower.kill();
            let err = follower.stderr.take().map(|mut e| {
                let mut s = String::new();
                let _ = std::io::Read::read_to_string(&mut e, &mut s);
                s
            });
            panic!("follow stopped after {seen:?}; stderr: {err:?}")
        });
        if let Some(n) = l.strip_prefix("n=") {
            seen.push(n.parse().unwrap());
        }
    }
    let _ = follower.kill();
    let _ = follower.wait();
    assert!(
        seen.windows(2).all(|w| w[1] == w[0] + 1),
        "lines lost or repeated across the restart: {seen:?}"
    );
}

/// An agent that floods its stdout costs the disk its capped journal, not its output: the
/// journal is rotated at --log-journal-max, the excess beyond the rate is skipped with a note.
/// (The cap is 1 MiB, twice the backlog the rate allows, so the note is not rotated away by
/// what is taken in after it.)
#[test]
fn a_flooding_agent_gets_a_capped_journal() {
    let (_bus, _cg, dir, d) = setup!(
        "journal-cap",
        &["--log-journal-max", "1048576", "--log-rate", "65536"]
    );
    // About 8 MiB in a burst, then quiet.
    let mem = common::mem::MemWatch::start(d.pid(), "8 MiB burst on stdout (journal)");
    let script = r#"yes 'flood flood flood flood flood flood flood flood flood flood' | head -c 8388608; echo done-flooding; sleep 600"#;
    let f = contract(
        dir.path(),
        "flooder",
        &format!(r#"{{ command: /bin/sh, args: ["-c", {script:?}] }}"#),
        "",
    );
    d.ctl_ok(&["start", f.to_str().unwrap()]);
    wait_for("the last line", 60, || {
        let es = entries(&d, "flooder", &["-n", "20"]);
        // `head -c` cuts a line: the last one ends with the marker.
        es.iter()
            .any(|e| e["message"].as_str().unwrap().ends_with("done-flooding"))
            .then_some(())
    });
    let all = entries(&d, "flooder", &["-n", "0"]);
    assert!(
        all.iter().any(|e| e["stream"] == "agentosd"
            && e["message"]
                .as_str()
                .unwrap()
                .contains("bytes of stdout skipped")),
        "no note about skipped output"
    );
    let logs = dir.path().join("logs/default");
    let journal = std::fs::metadata(logs.join("flooder.journal"))
        .unwrap()
        .len();
    let old = std::fs::metadata(logs.join("flooder.journal.1")).map_or(0, |m| m.len());
    assert!(
        journal <= 1 << 20 && old <= (1 << 20) + 64 * 1024,
        "{journal} {old}"
    );
    // The raw file's read part is given back to the file system.
    let raw = std::fs::metadata(logs.join("flooder.log")).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert!(
        raw.blocks() * 512 < 2 << 20,
        "{} bytes still allocated for {} written",
        raw.blocks() * 512,
        raw.len()
    );
    mem.finish(Duration::from_secs(1), 32);
}
