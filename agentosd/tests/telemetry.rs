//! OpenTelemetry export end to end (issue 16): agentosd with `--otlp-endpoint` at a real OTLP
//! receiver (tests/otlp_receiver.py, PyPI `opentelemetry-proto` + `protobuf`); an agent makes a
//! granted and a refused tool call over its MCP socket, and the receiver must see the turn, the
//! gate decisions and the tool span linked by parent and carrying agent, tenant and binding
//! hash, and the agent's metrics. Against a collector that stalls, calls still answer at once
//! and the daemon says what it dropped. Root only; the receiver's Python comes from
//! `$AGENTOS_MODEL_PEERS/venv` or `target/model-peers/venv` (`cargo xtask model-peers`).

#![allow(clippy::unwrap_used)]

#[macro_use]
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::otlp::{Receiver, receiver_python};
use common::{Bus, Daemon, TestCgroup};
use serde_json::Value;

/// The agent: on its inherited MCP connection, initialize, then one `tools/call` per argument
/// (the tool's name; `sleep`: wait 2 s instead), each printed as a JSON step with its answer and
/// how long it took.
const AGENT: &str = r#"
import json, os, socket, sys, time
s = socket.socket(fileno=int(os.environ["AGENTOS_SOCKET_FD"]))
f = s.makefile("rwb", buffering=0)
def send(**kw):
    kw["jsonrpc"] = "2.0"
    f.write((json.dumps(kw) + "\n").encode())
def recv():
    return json.loads(f.readline())
send(id=0, method="initialize", params={"protocolVersion": "2025-06-18",
     "capabilities": {}, "clientInfo": {"name": "telemetry", "version": "0"}})
recv()
send(method="notifications/initialized")
for i, name in enumerate(sys.argv[1:]):
    if name == "sleep":
        time.sleep(2)
        continue
    t0 = time.monotonic()
    send(id=i + 1, method="tools/call", params={"name": name, "arguments": {}})
    r = recv()
    print(json.dumps({"step": "call", "tool": name, "reply": r,
                      "ms": (time.monotonic() - t0) * 1000}), flush=True)
print(json.dumps({"step": "done"}), flush=True)
time.sleep(3600)
"#;

fn write(p: &Path, text: &str, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

struct Bed {
    _bus: Bus,
    _cg: TestCgroup,
    dir: tempfile::TempDir,
    d: Daemon,
}

/// A daemon with `extra` flags and tools `t.ok`, `t.held` and `t.refused` (the same program;
/// the agents' contract grants the first, the second with operator consent, not the third).
fn bed(tag: &str, extra: &[&str]) -> Bed {
    let bus = Bus::start();
    let cg = TestCgroup::new(tag);
    let dir = tempfile::tempdir().unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    }
    write(&dir.path().join("t/agent.py"), AGENT, 0o644);
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path().join("t"), std::fs::Permissions::from_mode(0o755))
            .unwrap();
    }
    let tools = dir.path().join("tools.d");
    for name in ["t.ok", "t.held", "t.refused"] {
        write(
            &tools.join(format!("{name}.yaml")),
            &format!(
                "apiVersion: agentos/v0.2\nkind: Tool\nname: {name}\ndescription: Answer at once \
                 (telemetry test).\nrisk: low\ntimeout_ms: 10000\nexec:\n  command: /bin/sh\n  \
                 args: [\"-c\", \"cat >/dev/null; echo '{{}}'\"]\ninput_schema: {{type: object}}\n"
            ),
            0o644,
        );
    }
    let mut args = vec!["--tools-dir", tools.to_str().unwrap()];
    args.extend_from_slice(extra);
    let d = Daemon::start_with(&bus, &cg.path, dir.path(), &args);
    Bed {
        _bus: bus,
        _cg: cg,
        dir,
        d,
    }
}

impl Bed {
    /// Start agent `name` calling `calls` in order, approving every consent request; returns
    /// its steps once it printed "done".
    fn run_agent(&self, name: &str, calls: &[&str]) -> Vec<Value> {
        let t = self.dir.path().join("t").display().to_string();
        let args: Vec<String> = std::iter::once(format!("{t}/agent.py"))
            .chain(calls.iter().map(|c| c.to_string()))
            .collect();
        let c = common::contract(
            self.dir.path(),
            name,
            &format!(
                "{{ command: /usr/bin/python3, args: {} }}",
                serde_json::to_string(&args).unwrap()
            ),
            &format!(
                "capabilities:\n  - t.ok\n  - t.held\n  - fs.read: [\"{t}\"]\n  - fs.exec: [/usr, /bin, /lib]\n\
                 security: {{ consent_for: [t.held] }}\ncompute: {{ pids: 64 }}\n"
            ),
        );
        self.d.ctl_ok(&["start", c.to_str().unwrap()]);
        let log = self.dir.path().join(format!("logs/default/{name}.log"));
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let steps: Vec<Value> = std::fs::read_to_string(&log)
                .unwrap_or_default()
                .lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .filter(|v| v.get("step").is_some())
                .collect();
            if steps.iter().any(|s| s["step"] == "done") {
                return steps;
            }
            let held: Vec<Value> =
                serde_json::from_str(&self.d.ctl_ok(&["consent", "list", "--json"])).unwrap();
            for r in held {
                let id = r["id"].as_u64().unwrap().to_string();
                self.d.ctl_ok(&["consent", "approve", &id]);
            }
            assert!(
                Instant::now() < deadline,
                "agent {name} did not finish its calls in 90 s: {steps:#?}\nagent log:\n{}\ndaemon log:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default(),
                self.d.log_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The binding hash of agent `name`'s start record in the audit trail.
    fn binding(&self, name: &str) -> String {
        let o = Command::new(common::agentctl_bin())
            .args(["audit", "show", "--json", "--state-dir"])
            .arg(self.dir.path())
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|r| r["agent"] == name && r["detail"]["event"] == "start")
            .and_then(|r| r["binding"].as_str().map(String::from))
            .unwrap_or_else(|| panic!("no start record with a binding for {name}"))
    }
}

fn python_or_skip() -> Option<PathBuf> {
    match receiver_python() {
        Ok(p) => Some(p),
        Err(why) => {
            common::skip(module_path!(), &why);
            None
        }
    }
}

fn spans<'a>(rows: &'a [Value], name: &str) -> Vec<&'a Value> {
    rows.iter()
        .filter(|r| r["signal"] == "span" && r["name"] == name)
        .collect()
}

/// The data points of metric `name` for agent `agent`.
fn points<'a>(rows: &'a [Value], name: &str, agent: &str) -> Vec<&'a Value> {
    rows.iter()
        .filter(|r| {
            r["signal"] == "metric"
                && r["name"] == name
                && r["attributes"]["agentos.agent"] == agent
        })
        .collect()
}

/// The latest value of `name` for `agent` whose attribute `key` is `value`.
fn latest(rows: &[Value], name: &str, agent: &str, key: &str, value: &str) -> Option<Value> {
    points(rows, name, agent)
        .into_iter()
        .rev()
        .find(|p| p["attributes"][key] == value)
        .cloned()
}

#[test]
fn the_receiver_sees_the_turn_its_gate_decisions_consent_wait_tool_calls_and_agent_metrics() {
    skip_unless_capable!();
    let Some(python) = python_or_skip() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let rx = Receiver::start(&python, dir.path(), false);
    let endpoint = rx.endpoint();
    let b = bed(
        "otel",
        &[
            "--otlp-endpoint",
            &endpoint,
            "--otlp-metrics-interval",
            "0.5",
        ],
    );
    let steps = b.run_agent("traced", &["t.ok", "t.refused", "t.held"]);
    let ok = &steps[0]["reply"];
    assert!(ok.get("result").is_some(), "t.ok was not answered: {ok}");
    let refused = &steps[1]["reply"];
    assert_eq!(
        refused["error"]["data"]["reason"], "not-granted",
        "{refused}"
    );
    let held = &steps[2]["reply"];
    assert!(
        held.get("result").is_some(),
        "t.held was not answered: {held}"
    );
    let agent = "default/traced";

    // Metrics (every 0.5 s): the calls by outcome, the latency of the one that ran, the cgroup.
    let rows = rx.wait(
        "the agent's tool-call metrics (2 ok, 1 refused)",
        30,
        &b.d,
        |rows| {
            let calls = |o| {
                latest(
                    rows,
                    "agentos.agent.tool.calls",
                    agent,
                    "agentos.tool.outcome",
                    o,
                )
            };
            calls("ok").is_some_and(|p| p["value"] == 2) && calls("refused").is_some()
        },
    );
    let calls = |o| {
        latest(
            &rows,
            "agentos.agent.tool.calls",
            agent,
            "agentos.tool.outcome",
            o,
        )
        .unwrap()
    };
    assert_eq!(calls("ok")["value"], 2, "t.ok and t.held ran");
    assert_eq!(calls("refused")["value"], 1);
    assert_eq!(calls("ok")["monotonic"], true);
    let dur = latest(
        &rows,
        "agentos.agent.tool.duration",
        agent,
        "gen_ai.tool.name",
        "t.ok",
    )
    .expect("a latency histogram for t.ok");
    assert_eq!(
        (dur["type"].as_str(), dur["count"].as_u64()),
        (Some("histogram"), Some(1))
    );
    assert!(dur["sum"].as_f64().unwrap() > 0.0, "{dur}");
    assert!(
        points(&rows, "agentos.agent.tool.duration", agent)
            .iter()
            .all(|p| p["attributes"]["gen_ai.tool.name"] != "t.refused"),
        "a refused call has no duration"
    );
    let cpu = points(&rows, "agentos.agent.cpu.time", agent);
    assert!(
        cpu.last()
            .is_some_and(|p| p["value"].as_f64().unwrap() > 0.0 && p["unit"] == "s"),
        "CPU time of the agent's cgroup: {cpu:?}"
    );
    let tasks = points(&rows, "agentos.agent.tasks", agent);
    assert!(
        tasks
            .last()
            .is_some_and(|p| p["value"].as_u64().unwrap() >= 1),
        "the agent's tasks: {tasks:?}"
    );
    assert!(
        !points(&rows, "agentos.agent.denials", agent).is_empty(),
        "the agent's denial count is exported"
    );

    // The agent stops: its turn ends and its span is exported.
    b.d.ctl_ok(&["stop", "traced"]);
    let rows = rx.wait("the agent's turn span", 30, &b.d, |rows| {
        !spans(rows, "agent.turn").is_empty()
    });
    let binding = b.binding("traced");
    assert_eq!(binding.len(), 64);
    let turns = spans(&rows, "agent.turn");
    assert_eq!(turns.len(), 1, "one turn: {turns:#?}");
    let turn = turns[0];
    assert_eq!(
        turn["parent_span_id"], "",
        "the turn is the root of its trace"
    );
    assert_eq!(turn["attributes"]["agentos.turn.end"], "agent-stopped");
    assert_eq!(turn["resource"]["service.name"], "agentosd");
    assert_eq!(
        turn["resource"]["service.version"],
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(turn["content_type"], "application/x-protobuf");
    let gates = spans(&rows, "agentos.gate");
    let tools = spans(&rows, "execute_tool t.ok");
    assert_eq!(gates.len(), 3, "{gates:#?}");
    assert_eq!(tools.len(), 1, "{rows:#?}");
    assert!(
        spans(&rows, "execute_tool t.refused").is_empty(),
        "a refused call runs nothing"
    );
    let gate_of = |tool: &str| {
        *gates
            .iter()
            .find(|g| g["attributes"]["gen_ai.tool.name"] == tool)
            .unwrap_or_else(|| panic!("no gate span for {tool}: {gates:#?}"))
    };
    let (allow, deny) = (gate_of("t.ok"), gate_of("t.refused"));
    assert_eq!(allow["attributes"]["agentos.gate.decision"], "allow");
    assert_eq!(deny["attributes"]["agentos.gate.decision"], "deny");
    assert_eq!(deny["attributes"]["agentos.gate.reason"], "not-granted");
    let consent_gate = gate_of("t.held");
    assert_eq!(
        consent_gate["attributes"]["agentos.gate.decision"],
        "consent"
    );
    let waits = spans(&rows, "agentos.consent");
    assert_eq!(waits.len(), 1, "{rows:#?}");
    let wait = waits[0];
    assert_eq!(wait["attributes"]["agentos.consent.answer"], "approved");
    assert_eq!(wait["attributes"]["gen_ai.tool.name"], "t.held");
    assert_eq!(
        wait["attributes"]["agentos.consent.operator_uid"], 0,
        "root answered"
    );
    assert!(
        wait["attributes"]["agentos.consent.wait_ms"].is_u64(),
        "{wait}"
    );
    let held_runs = spans(&rows, "execute_tool t.held");
    assert_eq!(held_runs.len(), 1, "the approved call ran: {rows:#?}");
    assert!(
        held_runs[0]["start"].as_u64() >= wait["end"].as_u64(),
        "it ran after the consent wait"
    );
    assert_eq!(turn["attributes"]["agentos.turn.children"], 6, "{turn}");
    let tool = tools[0];
    assert_eq!(tool["attributes"]["agentos.tool.outcome"], "ok");
    assert_eq!(tool["attributes"]["gen_ai.operation.name"], "execute_tool");
    assert_eq!(tool["attributes"]["agentos.tool.capability"], "t.ok");
    assert_eq!(tool["status"]["code"], 0, "{tool}");
    let all = [turn, allow, deny, tool, consent_gate, wait, held_runs[0]];
    for s in all {
        assert_eq!(
            s["trace_id"], turn["trace_id"],
            "one trace for the turn: {s}"
        );
        assert_eq!(s["attributes"]["agentos.agent"], agent, "{s}");
        assert_eq!(s["attributes"]["agentos.tenant"], "default", "{s}");
        assert_eq!(s["attributes"]["agentos.binding"], binding.as_str(), "{s}");
        assert!(s["end"].as_u64() >= s["start"].as_u64(), "{s}");
    }
    for s in &all[1..] {
        assert_eq!(
            s["parent_span_id"], turn["span_id"],
            "a child of the turn: {s}"
        );
        assert!(
            s["start"].as_u64() >= turn["start"].as_u64()
                && s["end"].as_u64() <= turn["end"].as_u64(),
            "within the turn: {s}\n{turn}"
        );
    }
}

#[test]
fn a_stalled_collector_delays_no_call_and_the_daemon_says_what_it_dropped() {
    skip_unless_capable!();
    let Some(python) = python_or_skip() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // Reads every request and never answers.
    let rx = Receiver::start(&python, dir.path(), true);
    let endpoint = rx.endpoint();
    let b = bed(
        "otel-stall",
        &["--otlp-endpoint", &endpoint, "--otlp-queue-size", "4"],
    );
    // The first calls' spans go out in one export, which hangs; the calls after the pause
    // find the exporter waiting on it and its queue full.
    let mut calls = vec!["t.ok"; 15];
    calls.push("sleep");
    calls.extend(vec!["t.ok"; 15]);
    let started = Instant::now();
    let steps = b.run_agent("patient", &calls);
    let calls: Vec<&Value> = steps.iter().filter(|s| s["step"] == "call").collect();
    assert_eq!(calls.len(), 30);
    for c in &calls {
        assert!(c["reply"].get("result").is_some(), "{c}");
        // An export waits up to 5 s for the stalled collector: a call that waited for one
        // would take that long.
        let ms = c["ms"].as_f64().unwrap();
        assert!(
            ms < 3000.0,
            "a tool call took {ms} ms while the collector stalled: {c}"
        );
    }
    // 15 calls, two spans each, into a queue of 4 behind an export that hangs: the daemon
    // says how many it dropped, and that the export was abandoned.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let log = b.d.log_text();
        let dropped = log
            .lines()
            .find(|l| l.contains("spans dropped because the export queue"));
        let failed = log
            .lines()
            .find(|l| l.contains("OpenTelemetry: export to") && l.contains("no answer within"));
        if let (Some(d), Some(f)) = (dropped, failed) {
            let n: u64 = d
                .split("OpenTelemetry: ")
                .nth(1)
                .and_then(|t| t.split(' ').next())
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("no count in {d}"));
            assert!(n > 0, "{d}");
            assert!(f.contains(&endpoint), "{f}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the daemon did not report dropped spans and the stalled export within 30 s (calls took {:?}); log:\n{log}",
            started.elapsed()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // The daemon still answers operators at once.
    let t = Instant::now();
    b.d.ctl_ok(&["status", "patient"]);
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "status took {:?}",
        t.elapsed()
    );
    assert!(
        rx.rows().is_empty(),
        "the stalled receiver accepted nothing"
    );
}
