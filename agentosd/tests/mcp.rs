//! Tool calls end to end with real peers: an agent under agentosd uses its tools through the
//! official MCP Python SDK (PyPI `mcp`) and the `agentos-mcp` bridge; one tool is the published
//! MCP filesystem server from npm, run sandboxed behind the daemon. The gate, consent (answered
//! with agentctl), malformed input and the audit trail are checked from the outside. Root only;
//! the peers come from `cargo xtask mcp-peers` (`cargo xtask test` installs them).

#![allow(clippy::unwrap_used)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

use common::flood::steps;
use common::{Bus, Daemon, TestCgroup};

/// The installed peers: `$AGENTOS_MCP_PEERS`, else `target/mcp-peers`.
fn peers() -> Result<PathBuf, String> {
    let dir = std::env::var_os("AGENTOS_MCP_PEERS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("..")
                .join("target")
                .join("mcp-peers")
        });
    for need in [
        "venv/bin/python3",
        "node/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js",
    ] {
        if !dir.join(need).exists() {
            return Err(format!(
                "{} is missing: run `cargo xtask mcp-peers` (installs the MCP Python SDK and MCP servers from npm)",
                dir.join(need).display()
            ));
        }
    }
    Ok(std::fs::canonicalize(&dir).unwrap_or(dir))
}

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn write(p: &Path, text: &str, mode: u32) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
    chmod(p, mode);
}

/// An example from examples/tools, as shipped: its limits say `must: false`, so where cgroup2
/// lacks the pids and memory controllers (this host's hybrid hierarchy) it runs without them.
fn example(name: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/tools")
        .join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn step<'a>(all: &'a [Value], name: &str) -> &'a Value {
    all.iter()
        .find(|v| v["step"] == name)
        .unwrap_or_else(|| panic!("no step {name} in {all:#?}"))
}

struct Setup {
    _bus: Bus,
    _cg: TestCgroup,
    dir: tempfile::TempDir,
    d: Daemon,
    files: PathBuf,
}

fn setup(tag: &str, peers: &Path) -> Setup {
    let bus = Bus::start();
    let cg = TestCgroup::new(tag);
    let dir = tempfile::tempdir().unwrap();
    // Agents (their own uids) must be able to walk to their home and the test files.
    chmod(dir.path(), 0o711);
    let files = dir.path().join("t");
    std::fs::create_dir_all(&files).unwrap();
    chmod(&files, 0o755);
    write(&files.join("wordcount.py"), &example("wordcount.py"), 0o755);
    write(&files.join("agent.py"), include_str!("mcp/agent.py"), 0o644);
    write(
        &files.join("data/allowed/note.txt"),
        "hello from the allowed directory\n",
        0o644,
    );
    write(
        &files.join("data/secret/key.txt"),
        "the agent must never read this\n",
        0o644,
    );
    chmod(&files.join("data"), 0o755);
    chmod(&files.join("data/allowed"), 0o755);
    chmod(&files.join("data/secret"), 0o755);

    let tools = dir.path().join("tools.d");
    let wc = files.join("wordcount.py").display().to_string();
    write(
        &tools.join("text-wordcount.yaml"),
        &example("text-wordcount.yaml").replace("/usr/lib/agentos/tools/wordcount.py", &wc),
        0o644,
    );
    write(
        &tools.join("clock-now.yaml"),
        &example("clock-now.yaml"),
        0o644,
    );
    let node_modules = peers.join("node/node_modules").display().to_string();
    write(
        &tools.join("files.yaml"),
        &example("files.yaml").replace("/opt/agentos/tools/node_modules", &node_modules),
        0o644,
    );
    write(
        &tools.join("payment-charge.yaml"),
        r#"apiVersion: agentos/v0.2
kind: Tool
name: payment.charge
description: Pretend to charge an amount (for the consent test).
risk: high
timeout_ms: 5000
exec:
  command: /bin/sh
  args: ["-c", "cat >/dev/null; echo '{\"charged\": true}'"]
input_schema:
  type: object
  properties:
    amount: {type: integer, minimum: 1}
    api_key: {type: string}
  required: [amount]
  additionalProperties: false
"#,
        0o644,
    );
    write(
        &tools.join("slow-sleep.yaml"),
        r#"apiVersion: agentos/v0.2
kind: Tool
name: slow.sleep
description: Sleep two seconds (for the in-flight limit test).
risk: low
timeout_ms: 20000
exec:
  command: /bin/sh
  args: ["-c", "sleep 2; echo '{}'"]
input_schema: {type: object}
"#,
        0o644,
    );
    let d = Daemon::start_with(
        &bus,
        &cg.path,
        dir.path(),
        &[
            "--tools-dir",
            tools.to_str().unwrap(),
            "--consent-timeout",
            "3",
        ],
    );
    Setup {
        _bus: bus,
        _cg: cg,
        dir,
        d,
        files,
    }
}

/// The agent's contract: granted text.wordcount, files, payment.charge (with consent) and
/// slow.sleep; not clock.now. It reads its own files, the peers and the bridge, and
/// data/allowed (which the filesystem server then gets); not data/secret.
fn agent_contract(s: &Setup, peers: &Path, name: &str) -> PathBuf {
    let bridge = Path::new(common::bridge_bin());
    let bin_dir = bridge.parent().unwrap().display().to_string();
    let t = s.files.display();
    let p = peers.display();
    let text = format!(
        r#"apiVersion: agentos/v0.2
kind: AgentContract
name: {name}
class: {{ latency: DT }}
exec:
  command: {p}/venv/bin/python3
  args: ["{t}/agent.py", "{bridge}", "{t}/data/allowed/note.txt", "{t}/data/secret/key.txt"]
  env: {{ PYTHONDONTWRITEBYTECODE: "1" }}
capabilities:
  - text.wordcount
  - files
  - payment.charge
  - slow.sleep
  - fs.read: ["{t}/agent.py", "{t}/data/allowed", "{p}/venv", "{bin_dir}"]
  - fs.exec: [/usr, /bin, /lib, "{p}/venv", "{bin_dir}"]
security: {{ consent_for: [payment.charge] }}
compute: {{ pids: 256 }}
"#,
        bridge = bridge.display()
    );
    let f = s.dir.path().join(format!("{name}.yaml"));
    std::fs::write(&f, text).unwrap();
    f
}

fn consent_list(d: &Daemon) -> Vec<Value> {
    serde_json::from_str(&d.ctl_ok(&["consent", "list", "--json"])).unwrap()
}

#[test]
fn an_agent_uses_its_tools_through_the_python_mcp_sdk() {
    skip_unless_capable!();
    let peers = match peers() {
        Ok(p) => p,
        Err(why) => {
            common::skip(module_path!(), &why);
            return;
        }
    };
    let s = setup("mcp", &peers);
    // Operators hear about held calls: the ConsentRequested signal, addressed to a subscriber
    // (`agentctl monitor`).
    let signals = s.dir.path().join("signals.txt");
    let mut monitor = std::process::Command::new(common::agentctl_bin())
        .args(["--bus-address", &s.d.bus, "monitor", "--json"])
        .stdout(std::fs::File::create(&signals).unwrap())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("agentctl monitor");
    std::thread::sleep(Duration::from_millis(500)); // it has subscribed
    let f = agent_contract(&s, &peers, "buyer");
    s.d.ctl_ok(&["start", f.to_str().unwrap()]);
    let log = s.dir.path().join("logs/default/buyer.log");
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut answered = Vec::new();
    loop {
        let all = steps(&log);
        if all.iter().any(|v| v["step"] == "done") {
            break;
        }
        for (asking, approve) in [
            ("consent-approve-asking", true),
            ("consent-deny-asking", false),
        ] {
            if all.iter().any(|v| v["step"] == asking) && !answered.contains(&asking) {
                // The held call is listed, with its secret redacted.
                let listed = consent_list(&s.d);
                if listed.len() == 1 {
                    let req = &listed[0];
                    assert_eq!(req["agent"], "default/buyer", "{req}");
                    assert_eq!(req["tool"], "payment.charge", "{req}");
                    assert_eq!(req["arguments"]["amount"], 12, "{req}");
                    let key = req["arguments"]["api_key"].to_string();
                    assert!(
                        !key.contains("sk-live-123") && key.contains("sha256:"),
                        "the secret is shown to the operator: {req}"
                    );
                    let id = req["id"].as_u64().unwrap().to_string();
                    s.d.ctl_ok(&["consent", if approve { "approve" } else { "deny" }, &id]);
                    // Answered twice: the second finds nothing.
                    let again = s.d.ctl(&["consent", "approve", &id]);
                    assert!(!again.status.success(), "a second answer was taken");
                    answered.push(asking);
                }
            }
        }
        let state = s.d.status_json("buyer")["state"].clone();
        if Instant::now() > deadline || (state != "running" && !all.is_empty()) {
            panic!(
                "the agent did not finish (state {state}, at most 180 s); its log:\n{}\ndaemon log:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default(),
                s.d.log_text()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = monitor.kill();
    let _ = monitor.wait();
    let heard = std::fs::read_to_string(&signals).unwrap_or_default();
    assert_eq!(
        heard.matches("\"event\":\"consent\"").count(),
        4,
        "one ConsentRequested per held call:\n{heard}"
    );
    assert!(
        heard.contains("\"payment.charge\"") && heard.contains("\"default/buyer\""),
        "{heard}"
    );
    assert!(
        !heard.contains("sk-live-123"),
        "the signal carries the secret: {heard}"
    );
    let all = steps(&log);
    let dump = format!(
        "agent log:\n{}\ndaemon log:\n{}",
        std::fs::read_to_string(&log).unwrap_or_default(),
        s.d.log_text()
    );

    // The SDK's handshake and the list: only granted tools (clock.now is installed, not granted).
    let init = step(&all, "initialize");
    assert_eq!(init["server"], "agentosd", "{dump}");
    let tools: Vec<String> = serde_json::from_value(step(&all, "list")["tools"].clone()).unwrap();
    assert!(tools.contains(&"text.wordcount".to_string()), "{tools:?}");
    assert!(tools.contains(&"payment.charge".to_string()), "{tools:?}");
    assert!(
        tools.iter().any(|t| t == "files.read_text_file"),
        "the filesystem server's tools are proxied: {tools:?}\n{dump}"
    );
    assert!(!tools.iter().any(|t| t.starts_with("clock.")), "{tools:?}");

    // An exec tool, sandboxed, end to end.
    let wc = step(&all, "wordcount");
    assert_eq!(wc["ok"], true, "{wc}\n{dump}");
    assert_eq!(wc["structured"]["words"], 4, "{wc}");
    assert_eq!(wc["structured"]["top"][0]["word"], "two", "{wc}");
    // Wrong arguments: refused by the schema before anything ran, as a tool error.
    let bad = step(&all, "wordcount-bad-args");
    assert_eq!(bad["is_error"], true, "{bad}");
    assert!(bad["text"].as_str().unwrap().contains("text"), "{bad}");
    // Arguments too large for an audit record: the call runs, the record keeps a hash.
    let large = step(&all, "wordcount-large");
    assert_eq!(large["ok"], true, "{large}\n{dump}");
    assert_eq!(large["structured"]["words"], 40000, "{large}");
    // Not granted: a clear MCP error.
    let ungranted = step(&all, "ungranted");
    assert_eq!(ungranted["code"], -32001, "{ungranted}");
    assert!(
        ungranted["message"]
            .as_str()
            .unwrap()
            .contains("does not grant"),
        "{ungranted}"
    );
    assert_eq!(step(&all, "unknown")["code"], -32602);

    // The npm filesystem server, behind the daemon: the granted directory, and nothing else.
    let allowed = step(&all, "read-allowed");
    assert_eq!(allowed["ok"], true, "{allowed}\n{dump}");
    assert!(
        allowed["text"]
            .as_str()
            .unwrap()
            .contains("hello from the allowed directory"),
        "{allowed}"
    );
    let forbidden = step(&all, "read-forbidden");
    assert_ne!(forbidden["ok"], true, "{forbidden}");
    assert!(
        !forbidden.to_string().contains("must never read"),
        "the secret file leaked: {forbidden}"
    );

    // Consent: approved → runs; denied → MCP error; unanswered → expires.
    let approved = step(&all, "consent-approve");
    assert_eq!(approved["ok"], true, "{approved}\n{dump}");
    assert_eq!(approved["structured"]["charged"], true, "{approved}");
    let denied = step(&all, "consent-deny");
    assert_eq!(denied["code"], -32002, "{denied}");
    assert!(
        denied["message"]
            .as_str()
            .unwrap()
            .contains("refused by the operator")
    );
    let expired = step(&all, "consent-expire");
    assert_eq!(expired["code"], -32002, "{expired}");
    assert!(
        expired["message"]
            .as_str()
            .unwrap()
            .contains("not answered")
    );
    assert!(consent_list(&s.d).is_empty());

    // Malformed input on a raw connection.
    let code = |name: &str| step(&all, name)["reply"]["error"]["code"].clone();
    assert_eq!(code("raw-before-initialize"), -32006);
    assert_eq!(code("raw-not-json"), -32700);
    assert_eq!(code("raw-batch"), -32600);
    assert_eq!(code("raw-huge"), -32600);
    assert!(
        step(&all, "raw-huge")["reply"]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("exceeds the limit")
    );
    assert_eq!(
        step(&all, "raw-after-huge")["reply"]["result"],
        serde_json::json!({})
    );
    assert_eq!(code("raw-unknown-method"), -32601);
    let flood = step(&all, "raw-flood");
    assert_eq!(flood["answered"], 20000, "{flood}");
    assert_eq!(flood["in_order"], true, "{flood}");
    let cancel = step(&all, "raw-cancel");
    assert_eq!(
        cancel["next_reply"]["id"], "after",
        "a cancelled call was answered: {cancel}"
    );
    let held = step(&all, "raw-cancel-held");
    assert_eq!(
        held["next_reply"]["id"], "after-held",
        "a call cancelled while it waited for consent was answered: {held}"
    );
    let inflight = step(&all, "raw-in-flight");
    assert_eq!(inflight["too_many"], 8, "{inflight}");
    assert_eq!(inflight["ok"], 32, "{inflight}");

    // The audit trail has every decision, and never the secret.
    let audit_log = s.dir.path().join("audit/audit.log");
    let text = std::fs::read_to_string(&audit_log).unwrap();
    assert!(
        !text.contains("sk-live-123"),
        "a secret reached the audit log"
    );
    let recs: Vec<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .filter(|r: &Value| r["agent"] == "buyer")
        .collect();
    let has = |kind: &str, decision: &str, tool: &str| {
        recs.iter()
            .any(|r| r["kind"] == kind && r["decision"] == decision && r["detail"]["tool"] == tool)
    };
    assert!(has("gate", "allow", "text.wordcount"), "{recs:#?}");
    assert!(
        recs.iter().any(|r| r["decision"] == "allow"
            && r["detail"]["arguments"]["bytes"].as_u64() > Some(200_000)
            && r["detail"]["arguments"]["sha256"].is_string()),
        "the large call's record keeps the size and hash of its arguments"
    );
    assert!(has("gate", "deny", "clock.now"), "{recs:#?}");
    assert!(has("gate", "deny", "no.such.tool"));
    assert!(has("gate", "held", "payment.charge"));
    assert!(has("consent", "approved", "payment.charge"));
    assert!(has("consent", "rejected", "payment.charge"));
    assert!(has("consent", "expired", "payment.charge"));
    // The call cancelled while it waited: its request withdrawn, on the record.
    assert!(
        recs.iter().any(|r| r["kind"] == "consent"
            && r["decision"] == "rejected"
            && r["detail"]["tool"] == "payment.charge"
            && r["detail"]["reason"]
                .as_str()
                .is_some_and(|a| a.starts_with("withdrawn"))),
        "no withdrawn consent record: {recs:#?}"
    );
    assert!(
        consent_list(&s.d).is_empty(),
        "a cancelled call's consent request is still pending"
    );
    let approved_rec = recs
        .iter()
        .find(|r| r["kind"] == "consent" && r["decision"] == "approved")
        .unwrap();
    assert_eq!(approved_rec["detail"]["operator_uid"], 0, "{approved_rec}");
    assert!(
        recs.iter()
            .filter(|r| r["kind"] == "gate")
            .all(|r| r["binding"].is_string()),
        "gate records carry the binding hash"
    );
    let verify = std::process::Command::new(common::agentctl_bin())
        .args(["audit", "verify", "--state-dir"])
        .arg(s.dir.path())
        .output()
        .unwrap();
    assert!(
        verify.status.success(),
        "{}",
        String::from_utf8_lossy(&verify.stderr)
    );
}

#[test]
fn a_process_outside_the_agent_is_refused_at_the_socket() {
    skip_unless_capable!();
    let peers = match peers() {
        Ok(p) => p,
        Err(why) => {
            common::skip(module_path!(), &why);
            return;
        }
    };
    let s = setup("mcpref", &peers);
    let f = common::contract(
        s.dir.path(),
        "idle",
        r#"{ command: /bin/sh, args: ["-c", "sleep 600"] }"#,
        "capabilities: [text.wordcount]\n",
    );
    s.d.ctl_ok(&["start", f.to_str().unwrap()]);
    s.d.wait_state("idle", "running", 10);
    let sock = s.dir.path().join("run/agents/default/idle.sock");
    let meta = std::fs::metadata(&sock).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    // This test process is root but not in the agent's cgroup: no byte comes back.
    let mut c = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    use std::io::{Read, Write};
    let _ = c.write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n");
    let mut buf = Vec::new();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = c.read_to_end(&mut buf);
    assert!(
        buf.is_empty(),
        "an outsider got an answer: {:?}",
        String::from_utf8_lossy(&buf)
    );
    // The refusal is audited with the peer's pid.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text =
            std::fs::read_to_string(s.dir.path().join("audit/audit.log")).unwrap_or_default();
        if let Some(r) = text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|r| r["detail"]["event"] == "socket-refused")
        {
            assert_eq!(r["agent"], "idle");
            assert_eq!(r["decision"], "deny");
            assert_eq!(r["detail"]["peer_pid"], std::process::id());
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no socket-refused record:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // A flood of refused connections costs a record each only within the denial records'
    // rate (burst 100, 20/s); the rest are counted in a summary record, never silently.
    let flood = 600;
    let t0 = Instant::now();
    for _ in 0..flood {
        drop(std::os::unix::net::UnixStream::connect(&sock).unwrap());
    }
    // The first connection above plus the flood.
    common::assert_refusals_rate_limited(flood + 1, t0, || {
        std::fs::read_to_string(s.dir.path().join("audit/audit.log"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .collect()
    });
    // Stopping the agent removes its socket.
    s.d.ctl_ok(&["stop", "idle"]);
    s.d.wait_state("idle", "inactive", 10);
    assert!(!sock.exists(), "the socket outlived the agent");
}

/// The example agent examples/agents/notes-stats, as shipped but for its paths: it counts the
/// words of its notes with the npm filesystem server and text.wordcount, through the Python SDK.
#[test]
fn the_example_notes_agent_counts_words_through_tools() {
    skip_unless_capable!();
    let peers = match peers() {
        Ok(p) => p,
        Err(why) => {
            common::skip(module_path!(), &why);
            return;
        }
    };
    let s = setup("mcpnotes", &peers);
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/agents/notes-stats");
    let script = s.files.join("notes_stats.py");
    write(
        &script,
        &std::fs::read_to_string(example.join("notes_stats.py")).unwrap(),
        0o644,
    );
    let notes = s.files.join("notes");
    write(&notes.join("a.md"), "alpha beta beta gamma\n", 0o644);
    write(&notes.join("b.md"), "one two\nthree\n", 0o644);
    chmod(&notes, 0o755);
    let bridge = Path::new(common::bridge_bin());
    let bin_dir = bridge.parent().unwrap().display().to_string();
    let venv = peers.join("venv").display().to_string();
    let text = std::fs::read_to_string(example.join("contract.yaml"))
        .unwrap()
        .replace(
            "command: /usr/bin/python3",
            &format!("command: {venv}/bin/python3"),
        )
        .replace(
            "/usr/local/share/agentos/examples/agents/notes-stats/notes_stats.py",
            &script.display().to_string(),
        )
        .replace(
            "/usr/local/share/agentos/examples/agents/notes-stats]",
            &format!("{}, {venv}, {bin_dir}]", s.files.display()),
        )
        .replace("/srv/notes", &notes.display().to_string())
        .replace(
            "env: { PYTHONDONTWRITEBYTECODE: \"1\" }",
            &format!(
                "env: {{ PYTHONDONTWRITEBYTECODE: \"1\", AGENTOS_MCP: \"{}\" }}",
                bridge.display()
            ),
        )
        .replace(
            "  - fs.read:",
            &format!("  - fs.exec: [/usr, /bin, /lib, \"{venv}\", \"{bin_dir}\"]\n  - fs.read:"),
        );
    let f = s.dir.path().join("notes-stats.yaml");
    std::fs::write(&f, text).unwrap();
    s.d.ctl_ok(&["start", f.to_str().unwrap()]);
    let st = s.d.wait_state("notes-stats", "exited", 90);
    let log = std::fs::read_to_string(s.dir.path().join("logs/default/notes-stats.log"))
        .unwrap_or_default();
    assert_eq!(st["result"], "success", "{st}\n{log}\n{}", s.d.log_text());
    let lines: Vec<Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let note = |n: &str| {
        lines
            .iter()
            .find(|v| v["note"] == n)
            .unwrap_or_else(|| panic!("no line for {n}:\n{log}"))
    };
    assert_eq!(note("a.md")["words"], 4, "{log}");
    assert_eq!(note("a.md")["top"][0]["word"], "beta", "{log}");
    assert_eq!(note("b.md")["words"], 3, "{log}");
    let total = lines
        .iter()
        .find(|v| v.get("total_words").is_some())
        .unwrap();
    assert_eq!(total["total_words"], 7);
    assert_eq!(total["notes"], 2);
}

/// Fail closed: when the audit trail cannot record the decision (its file system is full), a
/// tool call is refused with -32005 and the tool does not run. The file system is filled while
/// the agent waits; records still fit in the log's last partly written page, so the agent makes
/// many calls: the first ones may be recorded and run, and from the first refusal on, every
/// call that ran is one that was answered with a result. (Recovery when space returns is the
/// daemon-holds issue's.)
#[test]
fn a_tool_call_is_refused_when_the_audit_trail_cannot_write() {
    skip_unless_capable!();
    let bus = Bus::start();
    let cg = TestCgroup::new("mcp-audit-full");
    let dir = tempfile::tempdir().unwrap();
    chmod(dir.path(), 0o711);
    // The daemon's audit directory on a small tmpfs of our own.
    let audit = dir.path().join("audit");
    let _mounted = common::Tmpfs::mount(&audit, "agentos-test-audit", "1m", "0700").unwrap();
    let files = dir.path().join("t");
    let marker = dir.path().join("marker");
    for d in [&files, &marker] {
        std::fs::create_dir_all(d).unwrap();
    }
    chmod(&files, 0o755);
    chmod(&marker, 0o777);
    let tools = dir.path().join("tools.d");
    write(
        &tools.join("marker-touch.yaml"),
        &format!(
            r#"apiVersion: agentos/v0.2
kind: Tool
name: marker.touch
description: Leaves a file behind when it runs.
risk: low
timeout_ms: 5000
exec:
  command: /bin/sh
  args: ["-c", "echo ran >> {m}/ran; echo '{{}}'"]
input_schema: {{type: object}}
sandbox:
  fs.write: ["{m}"]
"#,
            m = marker.display()
        ),
        0o644,
    );
    // Fewer than the per-agent limit of calls in flight (the bridge sends them all at once).
    const CALLS: u64 = 12;
    let mut reqs = vec![
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"sh","version":"0"}}}"#.to_string(),
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#.to_string(),
    ];
    for id in 2..2 + CALLS {
        reqs.push(format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"marker.touch","arguments":{{}}}}}}"#
        ));
    }
    write(
        &files.join("requests.jsonl"),
        &(reqs.join("\n") + "\n"),
        0o644,
    );
    let d = Daemon::start_with(
        &bus,
        &cg.path,
        dir.path(),
        &["--tools-dir", tools.to_str().unwrap()],
    );
    let bridge = Path::new(common::bridge_bin());
    let bin_dir = bridge.parent().unwrap().display().to_string();
    let t = files.display();
    let contract = format!(
        r#"apiVersion: agentos/v0.2
kind: AgentContract
name: auditless
class: {{ latency: DT }}
exec:
  command: /bin/sh
  args: ["-c", "while [ ! -e {t}/go ]; do sleep 0.05; done; {b} < {t}/requests.jsonl; echo bridge-done"]
capabilities:
  - marker.touch
  - fs.read: ["{t}", "{bin_dir}"]
  - fs.write: ["{m}"]
  - fs.exec: [/usr, /bin, /lib, "{bin_dir}"]
"#,
        b = bridge.display(),
        m = marker.display(),
    );
    let cf = dir.path().join("auditless.yaml");
    std::fs::write(&cf, contract).unwrap();
    d.ctl_ok(&["start", cf.to_str().unwrap()]);
    d.wait_state("auditless", "running", 10);
    // Fill the audit file system, then let the agent call.
    {
        use std::io::Write as _;
        let mut f = std::fs::File::create(audit.join("filler")).unwrap();
        let block = vec![0u8; 64 * 1024];
        while f.write_all(&block).is_ok() {}
        let _ = f.sync_all();
    }
    std::fs::write(files.join("go"), "").unwrap();
    let log = PathBuf::from(d.status_json("auditless")["log_path"].as_str().unwrap());
    let deadline = Instant::now() + Duration::from_secs(60);
    let replies = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let replies: Vec<Value> = text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["id"].as_u64().is_some_and(|i| i >= 2))
            .collect();
        if replies.len() as u64 >= CALLS || text.contains("bridge-done") {
            break replies;
        }
        assert!(
            Instant::now() < deadline,
            "the agent did not finish its calls; agent log:\n{text}\ndaemon log:\n{}",
            d.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(replies.len() as u64, CALLS, "every call is answered");
    let ok = replies.iter().filter(|r| r["result"].is_object()).count();
    let refused: Vec<&Value> = replies
        .iter()
        .filter(|r| r["error"]["code"] == -32005)
        .collect();
    assert_eq!(ok + refused.len(), replies.len(), "{replies:#?}");
    assert!(
        !refused.is_empty(),
        "no call was refused with the audit file system full: {replies:#?}"
    );
    assert!(
        refused[0]["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("audit trail")),
        "{}",
        refused[0]
    );
    let ran = std::fs::read_to_string(marker.join("ran"))
        .unwrap_or_default()
        .lines()
        .count();
    assert_eq!(
        ran, ok,
        "tools ran {ran} times for {ok} recorded calls: a call ran without its record"
    );
    let _ = d.ctl(&["stop", "auditless"]);
}
