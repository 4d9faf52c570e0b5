//! Changed contracts, as systemctl has them for unit files: an edited contract does not apply
//! by itself (status warns), `daemon-reload` loads the agents directory again and the new
//! contract applies at the next start, a daemon restart loads it too, `reload` takes a file again
//! and restarts, `enable`/`disable` write and remove the agents directory's file, `cat` and
//! `show` print the contract and the properties. Root only.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::{Bus, Daemon, TestCgroup};

fn contract(name: &str, word: &str) -> String {
    format!(
        "apiVersion: agentos/v0.2\nkind: AgentContract\nname: {name}\ntenant: default\nclass: {{ latency: DT }}\nexec: {{ command: /bin/sh, args: [\"-c\", \"echo says-{word}; exec sleep 600\"] }}\n"
    )
}

/// Waits until the agent's newest `says-…` line is `says-{word}`.
fn wait_says(d: &Daemon, agent: &str, word: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let cat = d.ctl_ok(&["logs", agent, "-o", "cat", "-n", "200"]);
        let last = cat.lines().rfind(|l| l.starts_with("says-"));
        if last == Some(&format!("says-{word}")) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{agent} does not say {word} (last: {last:?})\n{cat}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn edited_contracts_apply_after_daemon_reload_and_restart() {
    skip_unless_capable!();
    let bus = Bus::start();
    let cg = TestCgroup::new("reload");
    let dir = tempfile::tempdir().unwrap();
    let agents_d = dir.path().join("agents.d");
    std::fs::create_dir_all(&agents_d).unwrap();
    let file = agents_d.join("ticker.yaml");
    std::fs::write(&file, contract("ticker", "v1")).unwrap();
    let mut d = Daemon::start(&bus, &cg.path, dir.path());
    d.wait_state("ticker", "running", 20);
    wait_says(&d, "ticker", "v1");
    let status = d.ctl_ok(&["status", "ticker"]);
    assert!(status.contains("(enabled)"), "{status}");
    assert!(!status.contains("Warning"), "{status}");

    // Edited: nothing changes by itself, status says so, a restart keeps the old contract.
    std::fs::write(&file, contract("ticker", "v2")).unwrap();
    let status = d.ctl_ok(&["status", "ticker"]);
    assert!(
        status.contains(&format!("Warning: {} changed on disk", file.display())),
        "{status}"
    );
    d.ctl_ok(&["restart", "ticker"]);
    wait_says(&d, "ticker", "v1");

    // daemon-reload: loaded, pending while it runs, applied by the next restart.
    let out = d.ctl_ok(&["daemon-reload"]);
    assert!(
        out.contains("default/ticker: changed; applies when it next starts"),
        "{out}"
    );
    let status = d.ctl_ok(&["status", "ticker"]);
    assert!(
        status.contains("Note: a newer contract is loaded"),
        "{status}"
    );
    assert!(!status.contains("changed on disk"), "{status}");
    let cat = d.ctl_ok(&["cat", "ticker"]);
    assert!(
        cat.contains("says-v1")
            && cat.contains("says-v2")
            && cat.contains("applies when the agent next starts"),
        "{cat}"
    );
    d.ctl_ok(&["restart", "ticker"]);
    wait_says(&d, "ticker", "v2");
    let status = d.ctl_ok(&["status", "ticker"]);
    assert!(
        !status.contains("Note:") && !status.contains("Warning"),
        "{status}"
    );

    // Edited while the daemon is down: the restarted daemon loads it for the next start.
    std::fs::write(&file, contract("ticker", "v3")).unwrap();
    d.kill9();
    d.spawn();
    let status = d.ctl_ok(&["status", "ticker"]);
    assert!(
        status.contains("Note: a newer contract is loaded"),
        "{status}"
    );
    wait_says(&d, "ticker", "v2");
    d.ctl_ok(&["restart", "ticker"]);
    wait_says(&d, "ticker", "v3");

    // show: properties as Name=value.
    let st = d.status_json("ticker");
    let show = d.ctl_ok(&["show", "ticker", "-p", "State,MainPID"]);
    assert_eq!(show, format!("MainPID={}\nState=running\n", st["main_pid"]));
    let v = d.ctl_ok(&["show", "ticker", "-p", "Enabled", "--value"]);
    assert_eq!(v, "yes\n");
    let bad = d.ctl(&["show", "ticker", "-p", "NoSuchThing"]);
    assert_eq!(bad.status.code(), Some(2));

    // The file gone: no longer enabled, and status says it is gone.
    std::fs::remove_file(&file).unwrap();
    let status = d.ctl_ok(&["status", "ticker"]);
    assert!(!status.contains("(enabled)"), "{status}");
    assert!(status.contains("is gone from disk"), "{status}");
}

#[test]
fn reload_enable_and_disable_an_agent_started_from_a_file() {
    skip_unless_capable!();
    let bus = Bus::start();
    let cg = TestCgroup::new("reload-file");
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&bus, &cg.path, dir.path());
    let elsewhere = tempfile::tempdir().unwrap();
    let file = elsewhere.path().join("worker.yaml");
    std::fs::write(&file, contract("worker", "a1")).unwrap();
    d.ctl_ok(&["start", file.to_str().unwrap()]);
    wait_says(&d, "worker", "a1");

    // reload: read again by agentctl, the running agent restarted with it.
    std::fs::write(&file, contract("worker", "a2")).unwrap();
    let out = d.ctl_ok(&["reload", "worker"]);
    assert!(out.contains("restarted"), "{out}");
    wait_says(&d, "worker", "a2");
    // --no-restart: pending until the next start.
    std::fs::write(&file, contract("worker", "a3")).unwrap();
    let out = d.ctl_ok(&["reload", "worker", "--no-restart"]);
    assert!(out.contains("applies when the agent next starts"), "{out}");
    assert_eq!(d.status_json("worker")["pending_contract"], true);
    d.ctl_ok(&["stop", "worker"]);
    d.ctl_ok(&["start", "worker"]);
    wait_says(&d, "worker", "a3");
    // A contract for another agent is refused.
    let other = elsewhere.path().join("other.yaml");
    std::fs::write(&other, contract("other", "x")).unwrap();
    let o = d.ctl(&["reload", "worker", "--file", other.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("is for default/other, not default/worker"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );

    // enable: the contract goes into the agents directory; disable takes it out.
    assert_eq!(d.status_json("worker")["enabled"], false);
    let out = d.ctl_ok(&["enable", "worker"]);
    let enabled_file = dir.path().join("agents.d/worker.yaml");
    assert!(
        out.contains(&format!("Created {}", enabled_file.display())),
        "{out}"
    );
    assert_eq!(
        std::fs::read_to_string(&enabled_file).unwrap(),
        contract("worker", "a3")
    );
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(
        std::fs::metadata(&enabled_file)
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o600,
        "a contract may hold secrets: root's only"
    );
    // Written from the agent's contract: not "changed on disk".
    let status = d.ctl_ok(&["status", "worker"]);
    assert!(!status.contains("changed on disk"), "{status}");
    assert_eq!(d.status_json("worker")["enabled"], true);
    let again = d.ctl_ok(&["enable", "worker"]);
    assert!(again.contains("enabled already"), "{again}");
    let out = d.ctl_ok(&["disable", "worker"]);
    assert!(
        out.contains(&format!("Removed {}", enabled_file.display())),
        "{out}"
    );
    assert!(!enabled_file.exists());
    assert_eq!(d.status_json("worker")["enabled"], false);
    assert_eq!(d.status_json("worker")["state"], "running");
    // disable --now stops it; enable --now starts it again.
    d.ctl_ok(&["enable", "worker"]);
    d.ctl_ok(&["disable", "--now", "worker"]);
    assert_eq!(d.status_json("worker")["state"], "inactive");
    d.ctl_ok(&["enable", "--now", "worker"]);
    d.wait_state("worker", "running", 10);
    // enable never writes through a link planted in the agents directory.
    d.ctl_ok(&["disable", "worker"]);
    let target = elsewhere.path().join("target");
    std::os::unix::fs::symlink(&target, &enabled_file).unwrap();
    let o = d.ctl(&["enable", "worker"]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    assert!(!target.exists(), "enable wrote through a link");
}

const TOOL: &str = "apiVersion: agentos/v0.2\nkind: Tool\nname: NAME\ndescription: A test tool.\nrisk: low\ntimeout_ms: 5000\nexec:\n  command: /bin/cat\ninput_schema: {type: object}\n";

/// `agentctl tools` lists the loaded manifests with the agents whose contract grants each and
/// the manifests that did not load; `daemon-reload` reads the tools directory again.
#[test]
fn tools_are_listed_and_reloaded() {
    skip_unless_capable!();
    let bus = Bus::start();
    let cg = TestCgroup::new("reload-tools");
    let dir = tempfile::tempdir().unwrap();
    let tools_d = dir.path().join("tools.d");
    std::fs::create_dir_all(&tools_d).unwrap();
    std::fs::write(tools_d.join("echo.yaml"), TOOL.replace("NAME", "t.echo")).unwrap();
    std::fs::write(
        tools_d.join("broken.yaml"),
        TOOL.replace("NAME", "t.broken") + "timout: 1\n",
    )
    .unwrap();
    let d = Daemon::start_with(
        &bus,
        &cg.path,
        dir.path(),
        &["--tools-dir", tools_d.to_str().unwrap()],
    );
    let granted = dir.path().join("granted.yaml");
    std::fs::write(
        &granted,
        contract("granted", "g") + "capabilities:\n  - t.echo\n  - t.later\n",
    )
    .unwrap();
    let other = dir.path().join("other.yaml");
    std::fs::write(&other, contract("other", "o")).unwrap();
    d.ctl_ok(&["start", granted.to_str().unwrap()]);
    d.ctl_ok(&["start", other.to_str().unwrap()]);

    let out = d.ctl_ok(&["tools"]);
    let row = out
        .lines()
        .find(|l| l.starts_with("t.echo"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(row.contains(" exec ") && row.contains(" low "), "{row}");
    assert!(
        row.contains("default/granted") && !row.contains("default/other"),
        "{row}"
    );
    assert!(
        out.contains(&format!(
            "not loaded: {}",
            tools_d.join("broken.yaml").display()
        )),
        "{out}"
    );
    assert!(out.contains("timout"), "{out}");

    // A new manifest and the broken one fixed: loaded by daemon-reload.
    std::fs::write(tools_d.join("later.yaml"), TOOL.replace("NAME", "t.later")).unwrap();
    std::fs::write(
        tools_d.join("broken.yaml"),
        TOOL.replace("NAME", "t.broken"),
    )
    .unwrap();
    let reload = d.ctl_ok(&["daemon-reload"]);
    assert!(reload.contains("3 tool(s) loaded"), "{reload}");
    let rows: Vec<serde_json::Value> = d
        .ctl_ok(&["tools", "--json"])
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let names: Vec<&str> = rows.iter().filter_map(|r| r["tool"].as_str()).collect();
    assert_eq!(names, ["t.broken", "t.echo", "t.later"], "{rows:?}");
    assert!(rows.iter().all(|r| r.get("error").is_none()), "{rows:?}");
    let later = rows.iter().find(|r| r["tool"] == "t.later").unwrap();
    assert_eq!(later["agents"], serde_json::json!(["default/granted"]));
}

/// `agentctl edit` (systemctl edit --full): the contract in $EDITOR, checked, applied with a
/// restart; an unchanged file changes nothing, one that does not parse is not sent.
#[test]
fn edit_applies_a_checked_contract() {
    skip_unless_capable!();
    let bus = Bus::start();
    let cg = TestCgroup::new("reload-edit");
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&bus, &cg.path, dir.path());
    let file = dir.path().join("editee.yaml");
    std::fs::write(&file, contract("editee", "e1")).unwrap();
    d.ctl_ok(&["start", file.to_str().unwrap()]);
    wait_says(&d, "editee", "e1");
    let editor = |script: &str| {
        let p = dir.path().join(format!("editor-{}", script.len()));
        std::fs::write(&p, format!("#!/bin/sh\n{script}\n")).unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    };
    let edit = |ed: &std::path::Path| {
        std::process::Command::new(common::agentctl_bin())
            .args(["--bus-address", &d.bus, "edit", "editee"])
            .env("EDITOR", ed)
            .env_remove("VISUAL")
            .output()
            .unwrap()
    };
    let o = edit(&editor("true"));
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).contains("unchanged"));
    let o = edit(&editor("echo 'exec: [' >> \"$1\""));
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("does not parse; nothing changed"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    wait_says(&d, "editee", "e1");
    let o = edit(&editor("sed -i s/says-e1/says-e2/ \"$1\""));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("restarted"));
    wait_says(&d, "editee", "e2");
    let cat = d.ctl_ok(&["cat", "editee"]);
    assert!(cat.contains("says-e2"), "{cat}");
    // The file it came from is not touched, and it did not change after the edit.
    assert!(std::fs::read_to_string(&file).unwrap().contains("says-e1"));
    let status = d.ctl_ok(&["status", "editee"]);
    assert!(!status.contains("Warning"), "{status}");
}
