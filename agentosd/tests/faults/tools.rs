//! Faults around calls: a D-Bus client gone in the middle of one, and exec tools that hang,
//! crash mid-answer or flood their output.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::{self, Bus, Daemon, TestCgroup};
use crate::skip_unless_capable;
use crate::{chmod, populated, tools_dir};

/// A D-Bus client that disconnects in the middle of a slow `StopAgent` (an agent that ignores
/// SIGTERM, so the stop waits out the stop timeout): the daemon finishes the stop, answers
/// others meanwhile, and neither panics nor loses the agent.
#[test]
fn a_client_gone_mid_call_leaves_the_daemon_whole() {
    skip_unless_capable!();
    let bus = Bus::start();
    let cg = TestCgroup::new("faults-dbus");
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&bus, &cg.path, &dir.path().join("state"));
    let f = common::contract(
        dir.path(),
        "stubborn",
        r#"{ command: /bin/sh, args: ["-c", "trap '' TERM; while :; do sleep 0.1; done"] }"#,
        "restart: \"no\"\n",
    );
    for round in 0..2 {
        d.ctl_ok(&["start", f.to_str().unwrap()]);
        let pid = d.wait_state("stubborn", "running", 10)["main_pid"]
            .as_u64()
            .unwrap() as u32;
        let mut client = Command::new("busctl")
            .arg(format!("--address={}", bus.address))
            .args([
                "--timeout=30",
                "call",
                "org.agentos1",
                "/org/agentos1",
                "org.agentos1.Manager",
                "StopAgent",
                "s",
                "default/stubborn",
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("busctl");
        d.wait_state("stubborn", "stopping", 5);
        client.kill().unwrap();
        client.wait().unwrap();
        // The daemon answers others while it waits out the stop timeout (2 s) for nobody.
        let t = Instant::now();
        let st = d.status_json("stubborn");
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "status took {:?} during the orphaned stop",
            t.elapsed()
        );
        assert_eq!(st["state"], "stopping", "round {round}: {st}");
        let st = d.wait_state("stubborn", "inactive", 15);
        assert!(
            !common::alive(pid),
            "round {round}: {pid} outlived the stop: {st}"
        );
        let agent_cg = cg.path.join("agents/default/stubborn");
        assert!(
            populated(&agent_cg).is_empty(),
            "round {round}: {:?}",
            populated(&agent_cg)
        );
    }
    assert!(
        d.child.as_ref().is_some_and(|c| common::alive(c.id())),
        "the daemon died"
    );
    let log = d.log_text();
    assert!(!log.contains("panicked"), "{log}");
}
/// The tool-fault agent: calls the tools named on its command line in order and appends one
/// line per answer to the file named first (`tool`, `ms`, `reply`), then `done`.
const SEQ_PY: &str = include_str!("tool_caller.py");

const FAULT_TOOLS: &[(&str, &str)] = &[
    (
        "hang.yaml",
        r#"name: fault.hang
description: Never answers.
timeout_ms: 1000
exec:
  command: /bin/sh
  args: [-c, "sleep 3600 & exec sleep 3600"]
input_schema: {type: object}
"#,
    ),
    (
        "crash.yaml",
        r#"name: fault.crash
description: Dies in the middle of its answer.
exec:
  command: /bin/sh
  args: [-c, "printf '{\"partial\": [1, 2'; exit 3"]
input_schema: {type: object}
"#,
    ),
    (
        "flood.yaml",
        r#"name: fault.flood
description: Writes 100 MiB to stdout.
exec:
  command: /bin/sh
  args: [-c, "head -c 104857600 /dev/zero | tr '\\0' a"]
input_schema: {type: object}
limits: {output: 1MiB}
"#,
    ),
];

/// Exec tools that hang, die mid-answer and flood their output, called by an agent through the
/// daemon: each call fails with the documented tool error (a result with `isError`), the
/// tool's processes are gone, the agent's next call works, and the 100 MiB flood costs the
/// daemon its 1 MiB output limit, not 100 MiB of memory.
#[test]
fn hanging_crashing_and_flooding_tools_fail_the_call_only() {
    skip_unless_capable!();
    if !Path::new("/usr/bin/python3").exists() {
        common::skip("faults", "/usr/bin/python3 is needed for the agent");
        return;
    }
    let bus = Bus::start();
    let cg = TestCgroup::new("faults-tools");
    let dir = tempfile::tempdir().unwrap();
    chmod(dir.path(), 0o711);
    let base = dir.path();
    let tools = tools_dir(base);
    for (file, text) in FAULT_TOOLS {
        std::fs::write(tools.join(file), text).unwrap();
    }
    let d = Daemon::start_with(
        &bus,
        &cg.path,
        &base.join("state"),
        &["--tools-dir", tools.to_str().unwrap(), "--no-audit-journal"],
    );
    let script = base.join("seq.py");
    std::fs::write(&script, SEQ_PY).unwrap();
    chmod(&script, 0o644);
    let out = base.join("out");
    std::fs::create_dir(&out).unwrap();
    chmod(&out, 0o777);
    let calls = [
        "clock.now",
        "fault.hang",
        "clock.now",
        "fault.crash",
        "clock.now",
        "fault.flood",
        "clock.now",
    ];
    let args: Vec<String> = std::iter::once(out.join("answers").display().to_string())
        .chain(calls.iter().map(|c| c.to_string()))
        .map(|a| format!("{a:?}"))
        .collect();
    let f = common::contract(
        base,
        "toolfaults",
        &format!(
            "{{ command: /usr/bin/python3, args: [{:?}, {}], env: {{ PYTHONDONTWRITEBYTECODE: \"1\" }} }}",
            script.display().to_string(),
            args.join(", ")
        ),
        &format!(
            "restart: \"no\"\ncapabilities:\n  - clock.now\n  - fault.hang\n  - fault.crash\n  - fault.flood\n  - fs.read: [{:?}]\n  - fs.exec: [/usr, /bin, /lib]\n  - fs.write: [{:?}]\n",
            script.display().to_string(),
            out.display().to_string()
        ),
    );
    let mem = common::mem::MemWatch::start(d.pid(), "hanging, crashing and flooding tools");
    d.ctl_ok(&["start", f.to_str().unwrap()]);
    let deadline = Instant::now() + Duration::from_secs(60);
    let answers: Vec<serde_json::Value> = loop {
        let lines: Vec<serde_json::Value> = std::fs::read_to_string(out.join("answers"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        if lines.last().is_some_and(|l| l["done"] == true) {
            break lines;
        }
        assert!(
            Instant::now() < deadline,
            "the agent did not finish its calls: {lines:?}\n{}",
            d.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    eprintln!(
        "answers: {}",
        answers
            .iter()
            .map(|a| format!("{} {} ms", a["tool"], a["ms"]))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let text = |a: &serde_json::Value| {
        assert_eq!(a["reply"]["result"]["isError"], true, "{a}");
        a["reply"]["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .to_string()
    };
    for (i, a) in answers[..calls.len()].iter().enumerate() {
        assert_eq!(a["tool"], calls[i], "{answers:?}");
        match calls[i] {
            "clock.now" => assert!(
                a["reply"]["result"]["structuredContent"]["unix"].is_u64(),
                "the call after a faulty one: {a}"
            ),
            "fault.hang" => {
                let t = text(a);
                assert!(t.contains("timed out after 1s"), "{t}");
                assert!(a["ms"].as_u64().unwrap() < 5000, "{a}");
            }
            "fault.crash" => {
                let t = text(a);
                assert!(t.contains("status=3"), "{t}");
            }
            "fault.flood" => {
                let t = text(a);
                assert!(t.contains("limits.output (1048576 bytes)"), "{t}");
            }
            other => unreachable!("{other}"),
        }
    }
    // Every tool process is gone: only the agent itself is left in its cgroup.
    let agent_cg = cg.path.join("agents/default/toolfaults");
    let left: Vec<_> = populated(&agent_cg)
        .into_iter()
        .filter(|(p, _)| !p.ends_with("main"))
        .collect();
    assert!(left.is_empty(), "tool processes left: {left:?}");
    // A 100 MiB flood costs the daemon its 1 MiB output limit, not 100 MiB.
    mem.finish(Duration::from_secs(1), 32);
    d.ctl_ok(&["stop", "toolfaults"]);
    let log = d.log_text();
    assert!(!log.contains("panicked"), "{log}");
}
