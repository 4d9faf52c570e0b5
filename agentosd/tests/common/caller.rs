//! An agent calling one tool in a loop on its MCP socket, and its answers as the tests read
//! them from its journal (`storage.rs`, `quota.rs`).
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::Daemon;

/// An agent on its MCP socket: `initialize`, then `tools/call` of TOOL every SLEEP seconds,
/// one JSON line per answer on stdout (`code` and `reason` of an error, `ok` of a result, `sc`
/// its structured content, `us` the call's round trip).
pub const CALLER_PY: &str = r#"
import json, os, socket, sys, time
tool, pause = sys.argv[1], float(sys.argv[2])
s = socket.socket(socket.AF_UNIX)
s.connect(os.environ["AGENTOS_SOCKET"])
f = s.makefile("rwb")
def call(i, method, params):
    f.write((json.dumps({"jsonrpc": "2.0", "id": i, "method": method, "params": params}) + "\n").encode())
    f.flush()
    return json.loads(f.readline())
call(0, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}})
f.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
f.flush()
i = 1
while True:
    t = time.monotonic()
    r = call(i, "tools/call", {"name": tool, "arguments": {}})
    us = int((time.monotonic() - t) * 1e6)
    e = r.get("error") or {}
    print(json.dumps({"i": i, "code": e.get("code"), "reason": (e.get("data") or {}).get("reason"),
                      "ok": "result" in r, "us": us, "msg": e.get("message", "")[:300],
                      "sc": (r.get("result") or {}).get("structuredContent")}), flush=True)
    i += 1
    time.sleep(pause)
"#;

/// A contract running CALLER_PY with `tool` every `pause` seconds, granted `grant`.
pub fn caller_contract(dir: &Path, name: &str, tool: &str, pause: &str, grant: &str) -> PathBuf {
    let script = dir.join("caller.py");
    std::fs::write(&script, CALLER_PY).unwrap();
    let p = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &p,
        format!(
            r#"apiVersion: agentos/v0.2
kind: AgentContract
name: {name}
class: {{ latency: DT }}
exec: {{ command: /usr/bin/python3, args: ["{script}", "{tool}", "{pause}"], env: {{ PYTHONDONTWRITEBYTECODE: "1" }} }}
capabilities:
  - {grant}
  - fs.read: ["{script}"]
  - fs.exec: [/usr, /bin, /lib]
"#,
            script = script.display()
        ),
    )
    .unwrap();
    p
}

/// The answers CALLER_PY printed so far.
pub fn answers(d: &Daemon, agent: &str) -> Vec<serde_json::Value> {
    let log = d.status_json(agent)["log_path"]
        .as_str()
        .unwrap()
        .to_string();
    super::agent_output(Path::new(&log))
        .lines()
        .filter_map(|l| serde_json::from_str(l.trim_matches('\0')).ok())
        .collect()
}

pub fn wait_answer(
    d: &Daemon,
    agent: &str,
    secs: u64,
    what: &str,
    ok: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(a) = answers(d, agent).into_iter().rev().find(|a| ok(a)) {
            return a;
        }
        assert!(
            Instant::now() < deadline,
            "agent {agent}: no answer {what} in {secs} s; its answers: {:?}\ndaemon log:\n{}",
            answers(d, agent).last(),
            d.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
