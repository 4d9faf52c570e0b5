//! The daemon serves agents below its own CPU priority (issue 15, "Isolation measured";
//! docs/ipc.md, "Priority: the control plane first"): its `agentos-agents` and `agentos-ipc`
//! threads run at nice +10 while its other threads stay at the daemon's, and a tool an agent
//! calls still runs at the daemon's priority. Root only (a real agent and tool).

#![allow(clippy::unwrap_used)]

#[macro_use]
mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{Bus, Daemon, TestCgroup};
use serde_json::Value;

/// Calls the tool once on its inherited connection and prints the reply.
const AGENT: &str = r#"
import json, os, socket, time
s = socket.socket(fileno=int(os.environ["AGENTOS_SOCKET_FD"]))
f = s.makefile("rwb", buffering=0)
def send(**kw):
    kw["jsonrpc"] = "2.0"
    f.write((json.dumps(kw) + "\n").encode())
send(id=0, method="initialize", params={"protocolVersion": "2025-06-18", "capabilities": {},
     "clientInfo": {"name": "nice", "version": "0"}})
f.readline()
send(method="notifications/initialized")
send(id=1, method="tools/call", params={"name": "nice.show", "arguments": {}})
print(json.dumps({"reply": json.loads(f.readline())}), flush=True)
time.sleep(3600)
"#;

/// Field 19 of /proc/PID/task/TID/stat: the thread's nice value.
fn nice_of(stat: &str) -> i32 {
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    rest.split_whitespace().nth(16).unwrap().parse().unwrap()
}

/// (thread name, nice) of every thread of `pid`.
fn threads(pid: u32) -> Vec<(String, i32)> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .filter_map(|t| {
            let comm = std::fs::read_to_string(t.path().join("comm")).ok()?;
            let stat = std::fs::read_to_string(t.path().join("stat")).ok()?;
            Some((comm.trim().to_string(), nice_of(&stat)))
        })
        .collect()
}

#[test]
fn agents_are_served_below_the_control_plane_and_tools_run_at_the_daemons_priority() {
    skip_unless_capable!();
    if !Path::new("/usr/bin/python3").exists() {
        common::skip(module_path!(), "no /usr/bin/python3 for the agent");
        return;
    }
    let bus = Bus::start();
    let cg = TestCgroup::new("agent-work");
    let dir = tempfile::tempdir().unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    }
    let files = dir.path().join("t");
    std::fs::create_dir_all(&files).unwrap();
    std::fs::write(files.join("agent.py"), AGENT).unwrap();
    let tools = dir.path().join("tools.d");
    std::fs::create_dir_all(&tools).unwrap();
    std::fs::write(
        tools.join("nice.yaml"),
        r#"apiVersion: agentos/v0.2
kind: Tool
name: nice.show
description: The tool process's own nice value.
risk: low
timeout_ms: 20000
exec:
  command: /bin/sh
  args: ["-c", "cat >/dev/null; echo \"{\\\"nice\\\": $(cut -d' ' -f19 /proc/self/stat)}\""]
input_schema: {type: object}
"#,
    )
    .unwrap();
    let d = Daemon::start_with(
        &bus,
        &cg.path,
        dir.path(),
        &["--tools-dir", tools.to_str().unwrap()],
    );
    let t = files.display();
    let contract = common::contract(
        dir.path(),
        "nice",
        &format!("{{ command: /usr/bin/python3, args: [\"{t}/agent.py\"] }}"),
        &format!(
            "capabilities:\n  - nice.show\n  - fs.read: [\"{t}\"]\n  - fs.exec: [/usr, /bin, /lib]\ncompute: {{ pids: 64 }}\n"
        ),
    );
    d.ctl_ok(&["start", contract.to_str().unwrap()]);
    let log = dir.path().join("logs/default/nice.log");
    let deadline = Instant::now() + Duration::from_secs(60);
    let reply = loop {
        let found = std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find_map(|v| v.get("reply").cloned());
        if let Some(r) = found {
            break r;
        }
        assert!(
            Instant::now() < deadline,
            "no reply from the tool in 60 s; agent log: {}\ndaemon log:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default(),
            d.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    };

    let ts = threads(d.pid());
    let base = ts
        .iter()
        .find(|(n, _)| n == "agentosd")
        .map(|(_, n)| *n)
        .unwrap_or_else(|| panic!("no main thread named agentosd: {ts:?}"));
    let of = |name: &str| -> Vec<i32> {
        ts.iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| *v)
            .collect()
    };
    let agents = of("agentos-agents");
    assert!(!agents.is_empty(), "no agentos-agents thread: {ts:?}");
    assert!(agents.iter().all(|n| *n == (base + 10).min(19)), "{ts:?}");
    assert_eq!(of("agentos-ipc"), vec![(base + 10).min(19)], "{ts:?}");
    // Everything else (the control plane's runtime, the audit writer, …) at the daemon's, but
    // the network namespace pool's refill thread (`agentos-nspool`, short-lived), which
    // runs at nice 19 so as not to compete with starts (sandbox/netns_pool.rs).
    let others: Vec<&(String, i32)> = ts
        .iter()
        .filter(|(n, _)| n != "agentos-agents" && n != "agentos-ipc" && n != "agentos-nspool")
        .collect();
    assert!(others.iter().all(|(_, n)| *n == base), "{ts:?}");

    // The tool ran at the daemon's priority, not at its agents' work's.
    assert_eq!(
        reply["result"]["structuredContent"]["nice"].as_i64(),
        Some(i64::from(base)),
        "{reply}"
    );
}
