//! agentosd installed as a systemd service: started by systemd, on the system bus, driven by
//! agentctl, surviving its own restart.

use std::time::Duration;

use serde_json::Value;
use vm_tests::{
    Agent, agentctl, cmd, contract_yaml, examples_dir, require_vm, state_of, systemctl,
    write_contract,
};

fn show(prop: &str) -> String {
    systemctl(&["show", "agentosd.service", "-p", prop, "--value"])
        .ok()
        .stdout
        .trim()
        .to_string()
}

fn wait_active() {
    vm_tests::wait_for("agentosd to be active", Duration::from_secs(60), || {
        (systemctl(&["is-active", "agentosd.service"]).stdout.trim() == "active").then_some(())
    });
}

#[test]
#[ignore = "needs the guest VM: run `cargo xtask vm test`"]
fn systemd_runs_agentosd_as_notify_service() {
    require_vm();
    let active = systemctl(&["is-active", "agentosd.service"]);
    assert_eq!(
        active.stdout.trim(),
        "active",
        "{active}\n{}",
        systemctl(&["status", "--no-pager", "agentosd.service"])
    );
    assert_eq!(show("Type"), "notify");
    assert_eq!(show("Delegate"), "yes");
    let pid: u32 = show("MainPID").parse().expect("MainPID is a number");
    assert!(pid > 0, "agentosd has no main pid");
    // Under systemd the daemon moves itself into supervisor/ of its delegated cgroup.
    let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("reading its cgroup");
    assert!(
        cg.trim().ends_with("/agentosd.service/supervisor"),
        "agentosd runs in {cg}"
    );
    // Its own leaf is bounded (--self-memory-max, --self-tasks-max), the agents' cgroups beside
    // it are not touched by that bound.
    let leaf = format!("/sys/fs/cgroup{}", cg.trim().trim_start_matches("0::"));
    let read = |f: &str| {
        std::fs::read_to_string(format!("{leaf}/{f}"))
            .unwrap_or_else(|e| panic!("{leaf}/{f}: {e}"))
            .trim()
            .to_string()
    };
    assert_eq!(read("memory.max"), "536870912");
    assert_eq!(read("pids.max"), "4096");
    // It stays up: its bus-connection check (every 5 s, exits after two failures) must work
    // under the system bus's policy, so the same process is there 12 s later and systemd
    // never had to restart it.
    std::thread::sleep(Duration::from_secs(12));
    assert_eq!(
        show("MainPID"),
        pid.to_string(),
        "agentosd was restarted:\n{}",
        cmd("journalctl", &["-u", "agentosd", "--no-pager", "-n", "30"])
    );
    assert_eq!(show("NRestarts"), "0", "systemd restarted agentosd");
}

#[test]
#[ignore = "needs the guest VM: run `cargo xtask vm test`"]
fn manager_is_on_the_system_bus() {
    require_vm();
    let out = cmd(
        "busctl",
        &["--system", "introspect", "org.agentos1", "/org/agentos1"],
    )
    .ok();
    assert!(out.stdout.contains("org.agentos1.Manager"), "{out}");
    for method in ["StartAgent", "StopAgent", "ListAgents", "GetAgent"] {
        assert!(out.stdout.contains(method), "{method} missing:\n{out}");
    }
    // agentctl talks to the same bus: `list` works and exits 0.
    agentctl(&["list"]).ok();
}

#[test]
#[ignore = "needs the guest VM: run `cargo xtask vm test`"]
fn check_reports_the_vm_mechanisms_available() {
    require_vm();
    let out = cmd("agentosd", &["check", "--json"]);
    let report: Value = serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("agentosd check --json is not JSON ({e}):\n{out}"));
    let checks = report["checks"].as_array().expect("checks array");
    let status = |m: &str| {
        checks
            .iter()
            .find(|c| c["mechanism"] == m)
            .map(|c| format!("{} ({})", c["status"].as_str().unwrap_or("?"), c["detail"]))
            .unwrap_or_else(|| "missing".into())
    };
    let mut missing = Vec::new();
    for m in [
        "cgroup_v2",
        "cpu_controller",
        "memory_controller",
        "pids_controller",
        "io_controller",
        "cgroup_freeze",
        "cgroup_kill",
        "sched_deadline",
        "sched_ext",
        "landlock",
        "landlock_unix",
        "seccomp",
        "btf",
        "bpf_lsm",
        "bpf_cgroup_sock_addr",
        "bpf_ringbuf",
        "io_uring",
        "path_watch",
    ] {
        let s = status(m);
        if !s.starts_with("available") {
            missing.push(format!("{m}: {s}"));
        }
    }
    assert!(
        missing.is_empty(),
        "not available in the VM:\n{}\n\nagentosd check:\n{}",
        missing.join("\n"),
        cmd("agentosd", &["check"]).stdout
    );
    // Both fences keep agents from the host's pathname Unix sockets here, and the text output
    // shows the BPF programs pass this kernel's verifier.
    let unix = status("landlock_unix");
    assert!(
        unix.contains("(LANDLOCK_ACCESS_FS_RESOLVE_UNIX) and BPF LSM lsm/unix_stream_connect"),
        "landlock_unix: {unix}"
    );
    let text = cmd("agentosd", &["check"]).stdout;
    for hook in ["unix_stream_connect", "unix_may_send"] {
        assert!(
            text.contains(&format!("lsm/{hook} load OK")),
            "lsm/{hook} does not load in the VM:\n{text}"
        );
    }
}

#[test]
#[ignore = "needs the guest VM: run `cargo xtask vm test`"]
fn example_contracts_validate_and_runnable_ones_run() {
    require_vm();
    let dir = examples_dir().join("contracts");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    files.sort();
    assert!(
        !files.is_empty(),
        "no example contracts in {}",
        dir.display()
    );
    let mut ran = 0;
    for f in &files {
        let path = f.display().to_string();
        agentctl(&["validate", &path]).ok();
        let text = std::fs::read_to_string(f).expect("reading a contract");
        if !text.lines().any(|l| l.trim_start().starts_with("exec:")) {
            continue;
        }
        let name = text
            .lines()
            .find_map(|l| l.strip_prefix("name:"))
            .map(|n| n.trim().trim_matches('"').to_string())
            .unwrap_or_else(|| panic!("no top-level name in {path}"));
        let agent = Agent::start(&name, f);
        // A service reaches `running`; a batch job may already have `exited`, successfully.
        let v = agent.wait_states(&["running", "exited"], Duration::from_secs(30));
        if state_of(&v) == "exited" {
            assert_eq!(v["result"], "success", "{name} exited unsuccessfully: {v}");
        } else {
            agentctl(&["stop", &name]).ok();
        }
        let listed = agentctl(&["list"]).ok();
        assert!(
            listed.stdout.contains(&name),
            "{name} not listed:\n{listed}"
        );
        ran += 1;
    }
    assert!(
        ran > 0,
        "no runnable example contract (with exec:) in {}",
        dir.display()
    );
}

#[test]
#[ignore = "needs the guest VM: run `cargo xtask vm test`"]
fn freeze_and_thaw_use_the_cgroup_freezer() {
    require_vm();
    let c = write_contract(
        "vmt-freeze",
        &contract_yaml(
            "vmt-freeze",
            "/bin/sleep",
            &["3600"],
            "cpu: \"0.5\", mem: \"32MiB\", pids: 8",
        ),
    );
    let agent = Agent::start("vmt-freeze", &c);
    agent.wait_state("running", Duration::from_secs(30));
    let cg = agent.cgroup();
    agentctl(&["freeze", "vmt-freeze"]).ok();
    vm_tests::wait_for("cgroup.events frozen 1", Duration::from_secs(10), || {
        (vm_tests::cg_key(&cg, "cgroup.events", "frozen") == 1).then_some(())
    });
    agentctl(&["thaw", "vmt-freeze"]).ok();
    vm_tests::wait_for("cgroup.events frozen 0", Duration::from_secs(10), || {
        (vm_tests::cg_key(&cg, "cgroup.events", "frozen") == 0).then_some(())
    });
    agent.wait_state("running", Duration::from_secs(10));
}

#[test]
#[ignore = "needs the guest VM: run `cargo xtask vm test`"]
fn restarting_agentosd_keeps_agents_running_and_readopts_them() {
    require_vm();
    let c = write_contract(
        "vmt-ticker",
        &contract_yaml(
            "vmt-ticker",
            "/bin/sh",
            // Also by path into its state directory, each tick: a re-adopted agent must still
            // reach it (systemd re-applies StateDirectoryMode= when it restarts the service).
            &[
                "-c",
                "while true; do echo tick >> \"$STATE_DIRECTORY/ticks\" || echo TICK-FAILED; echo tick; sleep 1; done",
            ],
            "cpu: \"0.5\", mem: \"64MiB\", pids: 32",
        ),
    );
    let agent = Agent::start("vmt-ticker", &c);
    agent.wait_state("running", Duration::from_secs(30));
    let pid = agent.main_pid();
    let cg = agent.cgroup();
    let daemon_before = show("MainPID");

    systemctl(&["restart", "agentosd.service"]).ok();
    wait_active();
    let daemon_after = show("MainPID");
    assert_ne!(daemon_before, daemon_after, "agentosd was not restarted");

    assert!(
        std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "agent process {pid} died with the daemon"
    );
    // The agent's processes live in its `main` leaf (budgets on the agent's cgroup above).
    let procs = vm_tests::read_cg(&cg, "main/cgroup.procs");
    assert!(
        procs.lines().any(|l| l.trim() == pid.to_string()),
        "pid {pid} is no longer in {}: {procs}",
        cg.display()
    );
    let v = agent.wait_state("running", Duration::from_secs(30));
    assert_eq!(agent.main_pid(), pid, "re-adopted with another pid: {v}");
    let listed = agentctl(&["list"]).ok();
    assert!(listed.stdout.contains("vmt-ticker"), "{listed}");
    let ticks = || {
        std::fs::read_to_string("/var/lib/agentos/home/default/vmt-ticker/ticks")
            .map(|t| t.lines().count())
            .unwrap_or(0)
    };
    let before = ticks();
    std::thread::sleep(Duration::from_secs(3));
    let mode = cmd("stat", &["-c", "%a", "/var/lib/agentos"]).ok().stdout;
    assert!(
        ticks() > before,
        "the re-adopted agent can no longer write its state directory (/var/lib/agentos mode {}):\n{}",
        mode.trim(),
        agentctl(&["logs", "vmt-ticker"]).stdout
    );
    assert_eq!(mode.trim(), "711", "/var/lib/agentos mode");
}

/// An agent's output reaches journald with its fields (`AGENTOS_AGENT=`, `AGENTOS_TENANT=`,
/// `AGENTOS_STREAM=`), so `journalctl AGENTOS_TENANT=… AGENTOS_STREAM=stderr` picks exactly its
/// error lines; a line the agent forged as the daemon's is still marked stdout there, and
/// `agentctl logs` shows the same lines with their stream.
#[test]
#[ignore = "needs the guest VM: run `cargo xtask vm test`"]
fn agent_output_reaches_journald_with_agentos_fields() {
    require_vm();
    let name = "vmt-journal";
    let c = write_contract(
        name,
        &contract_yaml(
            name,
            "/bin/sh",
            &[
                "-c",
                "echo vmt-out-line; echo vmt-err-line >&2; echo 'agentosd: stopped vmt'; exec sleep 600",
            ],
            "",
        ),
    );
    let agent = Agent::start(name, &c);
    agent.wait_state("running", Duration::from_secs(30));
    let field = |filter: &[&str]| -> Vec<Value> {
        let mut args = vec!["--no-pager", "-o", "json"];
        args.extend_from_slice(filter);
        cmd("journalctl", &args)
            .stdout
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    };
    let id = format!("default/{name}");
    let agent_filter = format!("AGENTOS_AGENT={id}");
    let errs = vm_tests::wait_for(
        "the stderr line in journald",
        Duration::from_secs(30),
        || {
            let e = field(&[&agent_filter, "AGENTOS_STREAM=stderr"]);
            (!e.is_empty()).then_some(e)
        },
    );
    assert!(
        errs.iter().all(|e| e["MESSAGE"] == "vmt-err-line"),
        "{errs:#?}"
    );
    assert_eq!(errs[0]["AGENTOS_TENANT"], "default");
    assert_eq!(errs[0]["SYSLOG_IDENTIFIER"], name);
    let outs = field(&[&agent_filter, "AGENTOS_STREAM=stdout"]);
    let msgs: Vec<&str> = outs.iter().filter_map(|e| e["MESSAGE"].as_str()).collect();
    assert!(
        msgs.contains(&"vmt-out-line") && msgs.contains(&"agentosd: stopped vmt"),
        "{msgs:?}"
    );
    let notes = field(&[&agent_filter, "AGENTOS_STREAM=agentosd"]);
    assert!(
        notes.iter().any(|e| e["MESSAGE"]
            .as_str()
            .is_some_and(|m| m.starts_with(&format!("started {id}, main process PID")))),
        "{notes:#?}"
    );
    let logs = agentctl(&["logs", name]).ok().stdout;
    assert!(
        logs.contains(&format!(" {name}[stderr]: vmt-err-line")),
        "{logs}"
    );
    assert!(
        logs.contains(&format!(" {name}: agentosd: stopped vmt")),
        "{logs}"
    );
    agentctl(&["remove", name]).ok();
}
