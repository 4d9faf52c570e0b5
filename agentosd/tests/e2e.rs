//! End to end through D-Bus: a private dbus-daemon, agentosd with its own cgroup root under the
//! cgroup2 mount and its own state directory, driven by agentctl (and busctl). Root only.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Bus, Daemon, TestCgroup, contract};

/// The contracts parser must accept our contract YAML (it is developed in parallel).
fn parser_ready() -> bool {
    let text = "apiVersion: agentos/v0.2\nkind: AgentContract\nname: probe\ntenant: default\nclass: { latency: DT }\nexec: { command: /bin/true }\n";
    match contracts::parse_contract(text, "probe.yaml") {
        Ok(_) => true,
        Err(e) => {
            panic!("the contracts parser rejects a minimal contract: {e}");
        }
    }
}

macro_rules! setup {
    ($tag:expr) => {{
        skip_unless_capable!();
        if !parser_ready() {
            return;
        }
        let bus = Bus::start();
        let cg = TestCgroup::new($tag);
        let dir = tempfile::tempdir().unwrap();
        let d = Daemon::start(&bus, &cg.path, dir.path());
        (bus, cg, dir, d)
    }};
}

const TICKER: &str =
    r#"{ command: /bin/sh, args: ["-c", "while true; do echo tick; sleep 0.2; done"] }"#;

fn pid_of(st: &serde_json::Value) -> u32 {
    st["main_pid"].as_u64().unwrap() as u32
}

#[test]
fn start_freeze_thaw_stop_via_agentctl() {
    let (bus, cg, dir, d) = setup!("life");
    let f = contract(
        dir.path(),
        "ticker",
        TICKER,
        "restart: { policy: on-failure, limit: 3, backoff_ms: 100 }\ncompute: { cpu: \"0.5\", mem: \"256MiB\", pids: 64 }\n",
    );
    let out = d.ctl_ok(&["start", f.to_str().unwrap()]);
    assert!(out.contains("default/ticker"), "{out}");
    let st = d.wait_state("ticker", "running", 5);
    let pid = pid_of(&st);
    assert!(pid > 0);
    // right PID in the right cgroup
    let cgpath = cg.path.join("agents/default/ticker");
    let procs = std::fs::read_to_string(cgpath.join("main/cgroup.procs")).unwrap();
    assert!(
        procs.lines().any(|l| l == pid.to_string()),
        "{pid} not in {procs}"
    );
    assert!(common::proc_cgroup(pid).ends_with("/agents/default/ticker/main"));
    // ControlGroup is the agent's cgroup (budgets, freeze, kill: like a unit's), whose `main`
    // leaf holds the agent's own processes.
    assert_eq!(
        format!("{}/main", st["control_group"].as_str().unwrap()),
        common::proc_cgroup(pid),
        "ControlGroup/main matches /proc/PID/cgroup"
    );

    // busctl alone: introspection and live properties
    let path = st["object_path"].as_str().unwrap().to_string();
    let intro = Command::new("busctl")
        .args([
            "--address",
            &bus.address,
            "introspect",
            "org.agentos1",
            "/org/agentos1",
        ])
        .output()
        .unwrap();
    let intro = String::from_utf8_lossy(&intro.stdout);
    for m in [
        "org.agentos1.Manager",
        ".StartAgent",
        ".ListAgents",
        ".FreezeAgent",
        ".AgentStateChanged",
    ] {
        assert!(
            intro.contains(m),
            "{m} missing from introspection:\n{intro}"
        );
    }
    let prop = Command::new("busctl")
        .args([
            "--address",
            &bus.address,
            "get-property",
            "org.agentos1",
            &path,
            "org.agentos1.Agent",
            "MainPID",
        ])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&prop.stdout).trim(),
        format!("u {pid}")
    );

    // budgets the host cannot enforce are reported, not silently dropped
    let has_mem = std::fs::read_to_string(cg.path.join("agents/cgroup.subtree_control"))
        .unwrap()
        .contains("memory");
    let unenforced = st["unenforced_budgets"].as_array().unwrap();
    assert_eq!(unenforced.is_empty(), has_mem, "{unenforced:?}");

    // freeze → frozen, confirmed by cgroup.events
    d.ctl_ok(&["freeze", "ticker"]);
    let st = d.status_json("ticker");
    assert_eq!(st["state"], "frozen");
    let ev = std::fs::read_to_string(cgpath.join("cgroup.events")).unwrap();
    assert!(ev.contains("frozen 1"), "{ev}");
    eprintln!(
        "frozen main process state in /proc: {:?} (cgroup v2 freezer shows S/D, not T)",
        agentosd::sys::process_state(pid)
    );
    // a frozen agent does not run: its log does not grow
    let len1 = std::fs::metadata(st["log_path"].as_str().unwrap())
        .unwrap()
        .len();
    std::thread::sleep(Duration::from_millis(600));
    let len2 = std::fs::metadata(st["log_path"].as_str().unwrap())
        .unwrap()
        .len();
    assert_eq!(len1, len2, "log grew while frozen");
    d.ctl_ok(&["thaw", "ticker"]);
    assert_eq!(d.status_json("ticker")["state"], "running");
    // The 600 ms above proves something only because the same log grows once thawed (the
    // ticker writes every 200 ms).
    let deadline = Instant::now() + Duration::from_secs(5);
    while std::fs::metadata(st["log_path"].as_str().unwrap())
        .unwrap()
        .len()
        == len2
    {
        assert!(
            Instant::now() < deadline,
            "the thawed ticker never wrote again"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let ev = std::fs::read_to_string(cgpath.join("cgroup.events")).unwrap();
    assert!(ev.contains("frozen 0"), "{ev}");

    // status and logs
    let status = d.ctl_ok(&["status", "ticker"]);
    for want in [
        "default/ticker",
        "Active: running",
        &format!("Main PID: {pid}"),
        "CGroup:",
        "Class: DT",
        "tick",
    ] {
        assert!(status.contains(want), "status lacks {want:?}:\n{status}");
    }
    let logs = d.ctl_ok(&["logs", "ticker", "-n", "3"]);
    assert!(logs.contains("tick"), "{logs}");
    // Its output files are its uid's (its disk quota counts them), still 0640 in the daemon's
    // directory.
    let proc_status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uid: u32 = proc_status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|u| u.parse().ok())
        .unwrap();
    assert_ne!(uid, 0);
    let out = Path::new(st["log_path"].as_str().unwrap()).to_path_buf();
    let err = out.with_file_name("ticker.stderr.log");
    for f in [&out, &err] {
        use std::os::unix::fs::MetadataExt as _;
        let m = std::fs::metadata(f).unwrap();
        assert_eq!(
            (m.uid(), m.mode() & 0o7777),
            (uid, 0o640),
            "{}",
            f.display()
        );
    }

    // freeze of a frozen-able state only; thaw of a running one is a no-op
    d.ctl_ok(&["thaw", "ticker"]);

    // stop → gone, no stray process, cgroup removed
    let procs: Vec<u32> = std::fs::read_to_string(cgpath.join("main/cgroup.procs"))
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    d.ctl_ok(&["stop", "ticker"]);
    let st = d.status_json("ticker");
    assert_eq!(st["state"], "inactive");
    assert_eq!(pid_of(&st), 0);
    for p in procs {
        assert!(!common::alive(p), "process {p} survived stop");
    }
    assert!(!cgpath.exists(), "agent cgroup left behind");

    // start by name again, then remove
    d.ctl_ok(&["start", "ticker"]);
    d.wait_state("ticker", "running", 5);
    d.ctl_ok(&["remove", "ticker"]);
    assert_eq!(d.ctl(&["status", "ticker"]).status.code(), Some(3));
    assert!(!cgpath.exists());
}

#[test]
fn crashing_agent_restarted_then_given_up() {
    let (_bus, _cg, dir, d) = setup!("crash");
    let f = contract(
        dir.path(),
        "crasher",
        r#"{ command: /bin/sh, args: ["-c", "echo up; sleep 0.2; exit 7"] }"#,
        "restart: { policy: on-failure, limit: 2, backoff_ms: 100 }\n",
    );
    d.ctl_ok(&["start", f.to_str().unwrap()]);
    let st = d.wait_state("crasher", "failed", 15);
    assert_eq!(st["restarts"], 2, "{st}");
    assert!(
        st["result"].as_str().unwrap().contains("start-limit-hit"),
        "{st}"
    );
    assert_eq!(st["exit_status"], "code=exited, status=7");
    let logs = d.ctl_ok(&["logs", "crasher", "-n", "100", "-o", "cat"]);
    assert_eq!(
        logs.matches("\nup\n").count() + usize::from(logs.starts_with("up\n")),
        3,
        "{logs}"
    );
    // policy no: no restart
    let f = contract(
        dir.path(),
        "once",
        r#"{ command: /bin/sh, args: ["-c", "exit 1"] }"#,
        "restart: { policy: \"no\" }\n",
    );
    d.ctl_ok(&["start", f.to_str().unwrap()]);
    let st = d.wait_state("once", "failed", 5);
    assert_eq!(st["restarts"], 0);
    assert_eq!(st["result"], "exit-code");
    // systemctl's filters: --failed lists both, --state=running neither.
    let failed = d.ctl_ok(&["list", "--failed"]);
    assert!(
        failed.contains("crasher") && failed.contains("once"),
        "{failed}"
    );
    let running = d.ctl_ok(&["list", "--state", "running,starting"]);
    assert!(
        !running.contains("crasher") && !running.contains("once"),
        "{running}"
    );
    // reset-failed, as systemctl's: named, then every failed agent; inactive, no result, the
    // restart count from zero, on the record.
    d.ctl_ok(&["reset-failed", "once"]);
    let st = d.status_json("once");
    assert_eq!(
        (st["state"].as_str(), st["result"].as_str()),
        (Some("inactive"), Some("")),
        "{st}"
    );
    assert_eq!(d.status_json("crasher")["state"], "failed");
    d.ctl_ok(&["reset-failed"]);
    let st = d.status_json("crasher");
    assert_eq!(
        (st["state"].as_str(), st["restarts"].as_u64()),
        (Some("inactive"), Some(0)),
        "{st}"
    );
    let failed = d.ctl_ok(&["list", "--failed"]);
    assert!(
        !failed.contains("crasher") && !failed.contains("once"),
        "{failed}"
    );
    // Lifecycle records are written in the background: wait for them.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let audit = std::fs::read_to_string(dir.path().join("audit/audit.log")).unwrap_or_default();
        let n = audit.matches("\"reset-failed\"").count();
        if n == 2 {
            break;
        }
        assert!(
            n < 2 && Instant::now() < deadline,
            "{n} reset-failed records:\n{audit}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // And it starts again with its full restart budget.
    d.ctl_ok(&["start", "crasher"]);
    let st = d.wait_state("crasher", "failed", 15);
    assert_eq!(st["restarts"], 2, "{st}");
}

#[test]
fn bad_contract_is_refused_and_nothing_starts() {
    let (_bus, cg, dir, d) = setup!("bad");
    let f = dir.path().join("bad.yaml");
    std::fs::write(
        &f,
        "apiVersion: agentos/v0.2\nkind: AgentContract\nname: bad\nclass: { latency: XX }\nexec: { command: /bin/true }\n",
    )
    .unwrap();
    let out = d.ctl(&["start", f.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    eprintln!("contract error as agentctl prints it:\n{err}");
    assert!(
        err.contains("bad.yaml:4:"),
        "error names the file and line: {err}"
    );
    assert!(d.list_json().is_empty(), "nothing listed");
    let agents = cg.path.join("agents");
    let children: Vec<_> = std::fs::read_dir(&agents)
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_dir())
        .collect();
    assert!(children.is_empty(), "no cgroup created: {children:?}");

    // a command that does not exist: ExecFailed, reported to the caller
    let f = contract(dir.path(), "ghost", "{ command: /nonexistent/agent }", "");
    let out = d.ctl(&["start", f.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("No such file or directory"), "{err}");

    // budgets marked must on a host without the controllers: refused, nothing registered
    let missing = !std::fs::read_to_string(cg.path.join("agents/cgroup.subtree_control"))
        .unwrap()
        .contains("memory");
    if missing {
        let f = contract(
            dir.path(),
            "strict",
            "{ command: /bin/sleep, args: [\"100\"] }",
            "compute: { cpu: \"0.5\", mem: \"256MiB\", pids: 64, must: true }\n",
        );
        let out = d.ctl(&["start", f.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(1));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("memory controller not available"), "{err}");
        assert_eq!(
            d.ctl(&["status", "strict"]).status.code(),
            Some(3),
            "not registered"
        );
    } else {
        eprintln!("NOTE: this host has the memory controller; must-budget refusal not exercised");
    }

    // unknown agent: exit 3; unreachable daemon: exit 4; usage: exit 2
    assert_eq!(d.ctl(&["stop", "nope"]).status.code(), Some(3));
    let out = Command::new(common::agentctl_bin())
        .args(["--bus-address", "unix:path=/nonexistent/bus", "list"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(4));
    let out = Command::new(common::agentctl_bin())
        .args(["frobnicate"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn kill9_of_daemon_then_readopt_same_pids() {
    let (_bus, _cg, dir, mut d) = setup!("readopt");
    let mut pids = Vec::new();
    for n in ["a1", "a2", "a3"] {
        let f = contract(
            dir.path(),
            n,
            TICKER,
            "restart: { policy: on-failure, limit: 3, backoff_ms: 100 }\ncompute: { mem: \"64MiB\" }\n",
        );
        d.ctl_ok(&["start", f.to_str().unwrap()]);
        pids.push(pid_of(&d.wait_state(n, "running", 5)));
    }
    d.ctl_ok(&["freeze", "a3"]);
    let before = d.list_json();
    let a1_before = d.status_json("a1");
    d.kill9();
    std::thread::sleep(Duration::from_millis(300));
    for p in &pids {
        assert!(common::alive(*p), "agent {p} died with the daemon");
    }
    // one agent dies while the daemon is away
    // SAFETY: kill(2) on the PID of an agent this test started.
    unsafe { libc::kill(pids[1] as i32, libc::SIGKILL) };
    let deadline = Instant::now() + Duration::from_secs(5);
    while common::alive(pids[1]) {
        assert!(
            Instant::now() < deadline,
            "agent {} survived SIGKILL",
            pids[1]
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    d.spawn();
    let after = d.list_json();
    assert_eq!(after.len(), before.len());
    let a1 = d.status_json("a1");
    assert_eq!(a1["state"], "running");
    assert_eq!(pid_of(&a1), pids[0], "same PID after re-adoption");
    assert_eq!(
        a1["unenforced_budgets"].as_array().unwrap().len(),
        a1_before["unenforced_budgets"].as_array().unwrap().len(),
        "unenforced budgets still reported after re-adoption: {a1}"
    );
    let a3 = d.status_json("a3");
    assert_eq!(a3["state"], "frozen", "frozen agent re-adopted frozen");
    assert_eq!(pid_of(&a3), pids[2]);
    // a2 died while we were away: noticed, and restarted per its policy with a new PID
    let a2 = d.wait_state("a2", "running", 5);
    assert_ne!(pid_of(&a2), pids[1]);
    assert_eq!(a2["restarts"], 1);

    // the re-adopted process is watched: kill it, the daemon notices (status unknown) and
    // restarts it per policy
    // SAFETY: kill(2) on the PID of an agent this test started.
    unsafe { libc::kill(pids[0] as i32, libc::SIGKILL) };
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let st = d.status_json("a1");
        if st["state"] == "running" && pid_of(&st) != pids[0] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "re-adopted agent's death not noticed: {st}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // stop a re-adopted frozen agent: thawed, terminated, gone
    d.ctl_ok(&["stop", "a3"]);
    assert!(!common::alive(pids[2]));

    // SIGTERM of the daemon leaves agents running
    let a1pid = pid_of(&d.status_json("a1"));
    let st = d.terminate().unwrap();
    assert!(st.success(), "agentosd exit on SIGTERM: {st}");
    assert!(common::alive(a1pid), "SIGTERM of agentosd stopped an agent");
    d.spawn();
    assert_eq!(pid_of(&d.status_json("a1")), a1pid);
}

#[test]
fn agents_dir_is_loaded_at_start() {
    skip_unless_capable!();
    if !parser_ready() {
        return;
    }
    let bus = Bus::start();
    let cg = TestCgroup::new("agentsd");
    let dir = tempfile::tempdir().unwrap();
    let agents_dir = dir.path().join("agents.d");
    std::fs::create_dir_all(&agents_dir).unwrap();
    contract(&agents_dir, "boot-agent", TICKER, "");
    std::fs::write(agents_dir.join("broken.yaml"), "name: [\n").unwrap();
    let d = Daemon::start(&bus, &cg.path, dir.path());
    let st = d.wait_state("boot-agent", "running", 5);
    assert_eq!(st["enabled"], true);
    assert_eq!(
        st["object_path"], "/org/agentos1/agent/default_boot_2dagent",
        "'-' escaped like systemd"
    );
    assert_eq!(d.list_json().len(), 1, "broken contract not started");
}

#[test]
fn two_hundred_agents() {
    let (_bus, cg, dir, mut d) = setup!("many");
    const N: usize = 200;
    let t = Instant::now();
    for i in 0..N {
        let f = contract(
            dir.path(),
            &format!("m{i:03}"),
            r#"{ command: /bin/sleep, args: ["10000"] }"#,
            "",
        );
        d.ctl_ok(&["start", f.to_str().unwrap()]);
    }
    let started = t.elapsed();
    let t = Instant::now();
    let list = d.list_json();
    let listed = t.elapsed();
    assert_eq!(list.len(), N);
    let mut pids = Vec::new();
    for row in &list {
        assert_eq!(row["state"], "running", "{row}");
        let pid = row["main_pid"].as_u64().unwrap() as u32;
        assert!(common::alive(pid));
        pids.push(pid);
    }
    // kill -9 of the daemon with 200 agents: all re-adopted with the same PIDs
    d.kill9();
    let t = Instant::now();
    d.spawn();
    let readopted = t.elapsed();
    let again = d.list_json();
    assert_eq!(again.len(), N);
    for (row, pid) in again.iter().zip(&pids) {
        assert_eq!(row["state"], "running", "{row}");
        assert_eq!(row["main_pid"].as_u64().unwrap() as u32, *pid, "{row}");
    }
    let table = d.ctl_ok(&["list"]);
    assert!(table.contains(&format!("{N} agents listed.")));
    // the daemon stays small: count its fds and threads
    let fds = std::fs::read_dir(format!("/proc/{}/fd", d.pid()))
        .unwrap()
        .count();
    let threads = std::fs::read_dir(format!("/proc/{}/task", d.pid()))
        .unwrap()
        .count();
    let t = Instant::now();
    let names: Vec<String> = (0..N).map(|i| format!("m{i:03}")).collect();
    let mut args = vec!["stop"];
    args.extend(names.iter().map(String::as_str));
    d.ctl_ok(&args);
    let stopped = t.elapsed();
    for p in pids {
        assert!(!common::alive(p), "stray process {p}");
    }
    let left = std::fs::read_dir(cg.path.join("agents/default"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_dir())
        .count();
    assert_eq!(left, 0, "agent cgroups left");
    eprintln!(
        "MEASURED {N} agents: start {:?} ({:?}/agent incl. agentctl), list {:?}, kill -9 + restart until answering with all re-adopted {:?}, stop all {:?}; daemon had {fds} fds, {threads} threads",
        started,
        started / N as u32,
        listed,
        readopted,
        stopped
    );
    assert!(fds < N * 2 + 64, "{fds} fds for {N} agents");
    assert!(threads < 32, "{threads} threads");
}

/// A daemon that owns its bus name but does not answer (here: stopped with SIGSTOP) is reported
/// by agentctl after `--timeout` with exit 4, not waited for; `--timeout 0` is accepted, and a
/// nonsensical value is a usage error. After SIGCONT the same command works.
#[test]
fn a_daemon_that_does_not_answer_is_reported_after_the_timeout() {
    let (_bus, _cg, _dir, d) = setup!("ctltimeout");
    // SAFETY: kill(2) on the PID of the daemon this test spawned and has not reaped.
    unsafe { libc::kill(d.pid() as i32, libc::SIGSTOP) };
    let t0 = Instant::now();
    let out = d.ctl(&["--timeout", "1", "list"]);
    let took = t0.elapsed();
    // SAFETY: as above.
    unsafe { libc::kill(d.pid() as i32, libc::SIGCONT) };
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(err.contains("did not answer in time"), "{err}");
    assert!(took < Duration::from_secs(20), "took {took:?}");
    let bad = d.ctl(&["--timeout=-1", "list"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--timeout"));
    d.ctl_ok(&["--timeout", "0", "list"]);
    d.ctl_ok(&["list"]);
}

/// `agentctl check` prints the daemon's start-up probe (drawn by `agentosd check --report`),
/// and without a daemon a local probe by `agentosd check`, with a note.
#[test]
fn check_prints_the_daemons_probe_or_a_local_one() {
    skip_unless_capable!();
    let bus = Bus::start();
    let cg = TestCgroup::new("check");
    let dir = tempfile::tempdir().unwrap();
    let mut d = Daemon::start(&bus, &cg.path, dir.path());
    let out = d.ctl(&["check", "--json"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "agentctl check --json: {stderr}");
    assert!(!stderr.contains("locally"), "the daemon answered: {stderr}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("report JSON");
    // The daemon's root, which a local probe would not know.
    assert_eq!(
        report["cgroup"]["root"].as_str(),
        Some(cg.path.to_str().unwrap()),
        "{report}"
    );
    assert!(report["checks"].as_array().is_some_and(|c| !c.is_empty()));
    let table = d.ctl_ok(&["check"]);
    assert!(table.contains("MECHANISM"), "{table}");
    assert!(
        table.contains(&format!("agents under {}", cg.path.display())),
        "the daemon's report, not a local one: {table}"
    );
    d.terminate();
    let out = d.ctl(&["check"]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "local check: {stderr}");
    assert!(
        stderr.contains("probing this host locally instead"),
        "{stderr}"
    );
    assert!(stdout.contains("MECHANISM"), "{stdout}");
}

/// `agentctl monitor --json` on `bus`, given the time to subscribe.
fn subscribed_monitor(bus: &Bus) -> std::process::Child {
    let m = Command::new(common::agentctl_bin())
        .args(["--bus-address", &bus.address, "monitor", "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    m
}

/// D-Bus as systemd serves it: `busctl tree` reads the tree without a warning, introspecting an
/// object lists its children by name only, and each state change is signalled once (a
/// subscriber never hears the same state twice in a row).
#[test]
fn dbus_tree_introspection_and_one_signal_per_change() {
    let (bus, _cg, dir, d) = setup!("tree");
    let mut monitor = subscribed_monitor(&bus);
    let f = contract(dir.path(), "ticker", TICKER, "");
    d.ctl_ok(&["start", f.to_str().unwrap()]);
    d.wait_state("ticker", "running", 10);
    let busctl = |args: &[&str]| {
        let o = Command::new("busctl")
            .arg("--address")
            .arg(&bus.address)
            .args(args)
            .output()
            .unwrap();
        (
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (tree, warnings) = busctl(&["tree", "org.agentos1"]);
    assert!(warnings.is_empty(), "busctl tree warns:\n{warnings}");
    assert!(
        tree.contains("/org/agentos1/agent/default_ticker"),
        "{tree}"
    );
    let (root, _) = busctl(&["--xml-interface", "introspect", "org.agentos1", "/"]);
    assert!(root.contains("<node name=\"org\"/>"), "{root}");
    assert!(
        !root.contains("org.agentos1.Manager"),
        "the whole tree under /:\n{root}"
    );
    let (mgr, _) = busctl(&[
        "--xml-interface",
        "introspect",
        "org.agentos1",
        "/org/agentos1",
    ]);
    assert!(
        mgr.contains("<interface name=\"org.agentos1.Manager\">")
            && mgr.contains("<node name=\"agent\"/>"),
        "{mgr}"
    );
    assert!(!mgr.contains("org.agentos1.Agent\""), "{mgr}");
    for verb in ["freeze", "thaw", "stop"] {
        d.ctl_ok(&[verb, "ticker"]);
    }
    d.ctl_ok(&["start", "ticker"]);
    d.wait_state("ticker", "running", 10);
    std::thread::sleep(Duration::from_millis(500));
    let _ = monitor.kill();
    let out = monitor.wait_with_output().unwrap();
    let states: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["event"] == "state" && e["agent"] == "default/ticker")
        .map(|e| format!("{} {}", e["state"], e["result"]))
        .collect();
    assert!(
        states.windows(2).all(|w| w[0] != w[1]),
        "a state signalled twice: {states:?}"
    );
    for want in ["running", "frozen", "inactive"] {
        assert!(
            states.iter().any(|s| s.starts_with(&format!("\"{want}\""))),
            "{want} not signalled: {states:?}"
        );
    }
}

/// `--no-block`: a stop that takes the agent's whole stop timeout is queued as a job and the
/// call returns at once; `list-jobs` shows it, a second job for the agent is refused, and
/// `JobRemoved` (seen by `agentctl monitor`) says how it ended.
#[test]
fn no_block_queues_a_job_and_returns_at_once() {
    let (bus, _cg, dir, d) = setup!("jobs");
    let f = contract(
        dir.path(),
        "stubborn",
        r#"{ command: /bin/sh, args: ["-c", "trap '' TERM; while true; do sleep 0.2; done"] }"#,
        "",
    );
    d.ctl_ok(&["start", f.to_str().unwrap()]);
    d.wait_state("stubborn", "running", 10);
    let mut monitor = subscribed_monitor(&bus);
    let t = Instant::now();
    let out = d.ctl_ok(&["--no-block", "stop", "stubborn"]);
    // The daemon's stop timeout is 2 s here (tests/common): the call did not wait for it.
    assert!(
        t.elapsed() < Duration::from_millis(1500),
        "{:?}",
        t.elapsed()
    );
    assert!(
        out.starts_with("Queued job ") && out.contains("stop stubborn (/org/agentos1/job/"),
        "{out}"
    );
    let jobs = d.ctl_ok(&["list-jobs"]);
    assert!(
        jobs.contains("default/stubborn") && jobs.contains(" stop"),
        "{jobs}"
    );
    let again = d.ctl(&["--no-block", "restart", "stubborn"]);
    assert_eq!(again.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("has job"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    d.wait_state("stubborn", "inactive", 15);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !d.ctl_ok(&["list-jobs"]).contains("No jobs running.") {
        assert!(Instant::now() < deadline, "the job never ended");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(300));
    let _ = monitor.kill();
    let heard = String::from_utf8_lossy(&monitor.wait_with_output().unwrap().stdout).into_owned();
    let events: Vec<serde_json::Value> = heard
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert!(events.iter().any(|e| e["event"] == "job"), "{heard}");
    assert!(
        events.iter().any(|e| e["event"] == "job-done"
            && e["result"] == "done"
            && e["agent"] == "default/stubborn"),
        "{heard}"
    );
    // A file cannot be queued; an unknown verb is refused by the daemon.
    let o = d.ctl(&["--no-block", "start", f.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let o = Command::new("busctl")
        .args([
            "--address",
            &bus.address,
            "call",
            "org.agentos1",
            "/org/agentos1",
        ])
        .args([
            "org.agentos1.Manager",
            "QueueJob",
            "ss",
            "explode",
            "stubborn",
        ])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("no verb"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// `agentctl -H [USER@]HOST` reaches another machine's daemon the way systemctl -H does: over
/// `ssh -xT -- HOST systemd-stdio-bridge`. Here `ssh` is a stand-in on PATH that records its
/// arguments and runs the bridge to the test's bus.
#[test]
fn dash_h_reaches_a_daemon_through_ssh_and_the_stdio_bridge() {
    let (bus, _cg, dir, d) = setup!("ssh");
    if Command::new("systemd-stdio-bridge")
        .arg("--version")
        .output()
        .is_err()
    {
        common::skip(
            module_path!(),
            "systemd-stdio-bridge is not installed (package systemd)",
        );
        return;
    }
    let fake = dir.path().join("fakebin");
    std::fs::create_dir_all(&fake).unwrap();
    let ssh = fake.join("ssh");
    std::fs::write(
        &ssh,
        "#!/bin/sh\nprintf '%s\\n' \"$@\" > \"$FAKE_SSH_ARGS\"\nexec systemd-stdio-bridge --bus-path=\"$FAKE_SSH_BUS\"\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&ssh, std::fs::Permissions::from_mode(0o755)).unwrap();
    let f = contract(dir.path(), "ticker", TICKER, "");
    d.ctl_ok(&["start", f.to_str().unwrap()]);
    let args_file = dir.path().join("ssh-args");
    let path = format!(
        "{}:{}",
        fake.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let run = |host: &str| {
        Command::new(common::agentctl_bin())
            .args(["-H", host, "list"])
            .env("PATH", &path)
            .env("FAKE_SSH_ARGS", &args_file)
            .env("FAKE_SSH_BUS", &bus.address)
            .env_remove("AGENTOS_BUS_ADDRESS")
            .output()
            .unwrap()
    };
    let o = run("ops@db1.example");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("default/ticker"));
    assert_eq!(
        std::fs::read_to_string(&args_file).unwrap(),
        "-xT\n--\nops@db1.example\nsystemd-stdio-bridge\n"
    );
    // A host that ssh would read as an option is refused before anything runs.
    std::fs::remove_file(&args_file).unwrap();
    let o = run("-oProxyCommand=touch /tmp/x");
    assert_eq!(o.status.code(), Some(2));
    assert!(!args_file.exists());
}

/// Bash completion completes agent names (asked of the daemon) and signal names.
#[test]
fn bash_completes_agent_and_signal_names() {
    let (bus, _cg, dir, d) = setup!("complete");
    let f = contract(dir.path(), "ticker", TICKER, "");
    d.ctl_ok(&["start", f.to_str().unwrap()]);
    let bin_dir = Path::new(common::agentctl_bin())
        .parent()
        .unwrap()
        .to_path_buf();
    let complete = |words: &[&str]| -> Vec<String> {
        let script = format!(
            "source <(agentctl completions bash)\nCOMP_WORDS=({})\nCOMP_CWORD={}\nCOMP_LINE=\"${{COMP_WORDS[*]}}\"\nCOMP_POINT=${{#COMP_LINE}}\n_agentctl_more agentctl \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"\nprintf '%s\\n' \"${{COMPREPLY[@]}}\"\n",
            words
                .iter()
                .map(|w| format!("'{w}'"))
                .collect::<Vec<_>>()
                .join(" "),
            words.len() - 1
        );
        let o = Command::new("bash")
            .arg("-c")
            .arg(script)
            .env(
                "PATH",
                format!(
                    "{}:{}",
                    bin_dir.display(),
                    std::env::var("PATH").unwrap_or_default()
                ),
            )
            .env("AGENTOS_BUS_ADDRESS", &bus.address)
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(str::to_string)
            .collect()
    };
    let got = complete(&["agentctl", "stop", "ti"]);
    assert!(got.contains(&"ticker".to_string()), "{got:?}");
    let got = complete(&["agentctl", "logs", "default/"]);
    assert!(got.contains(&"default/ticker".to_string()), "{got:?}");
    let got = complete(&["agentctl", "kill", "ticker", "-s", "TE"]);
    assert_eq!(got, ["TERM"], "{got:?}");
}
