//! The model gateway end to end: a real llama.cpp server (PyPI `xllamacpp`, SmolLM2-135M) behind
//! agentosd, agents that use the official OpenAI Python SDK on their model socket, and the
//! outcome checked from the outside (the agent's own report in its log, `agentctl status`, the
//! audit trail). Root only; skipped with a message when the model peers are not installed
//! (`cargo xtask model-peers`).

#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::models::ModelServer;
use common::{Bus, Daemon, TestCgroup};
use serde_json::Value;

struct Setup {
    bus: Bus,
    _cg: TestCgroup,
    dir: tempfile::TempDir,
    d: Daemon,
    python: PathBuf,
    venv: PathBuf,
}

fn chmod(p: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A daemon whose gateway serves `models_yaml` (`{chat}` is replaced by the chat server's URL).
fn setup(tag: &str, server: &ModelServer, models_yaml: &str) -> Setup {
    setup_with(tag, server, None, models_yaml, &[])
}

/// [`setup`] with an embeddings server too (`{embed}` in `models_yaml`).
fn setup_with(
    tag: &str,
    server: &ModelServer,
    embed: Option<&ModelServer>,
    models_yaml: &str,
    daemon_args: &[&str],
) -> Setup {
    let python = common::models::python().expect("model peers are installed");
    let venv = python.parent().unwrap().parent().unwrap().to_path_buf();
    let bus = Bus::start();
    let cg = TestCgroup::new(tag);
    let dir = tempfile::tempdir().unwrap();
    chmod(dir.path(), 0o711);
    std::fs::write(dir.path().join("agent.py"), include_str!("models/agent.py")).unwrap();
    chmod(&dir.path().join("agent.py"), 0o644);
    let cfg = dir.path().join("models.yaml");
    let mut yaml = models_yaml.replace("{chat}", &server.url);
    if let Some(e) = embed {
        yaml = yaml.replace("{embed}", &e.url);
    }
    std::fs::write(&cfg, yaml).unwrap();
    let mut args = vec!["--models", cfg.to_str().unwrap()];
    args.extend_from_slice(daemon_args);
    let d = Daemon::start_with(&bus, &cg.path, dir.path(), &args);
    Setup {
        bus,
        _cg: cg,
        dir,
        d,
        python,
        venv,
    }
}

/// Start agent `name` running agent.py in `mode` with `extra` contract lines.
fn run_agent(s: &Setup, name: &str, args: &str, extra: &str) {
    run_agent_with(s, name, args, "", extra)
}

/// [`run_agent`] with more capabilities (`caps`: list items, each `  - …\n`).
fn run_agent_with(s: &Setup, name: &str, args: &str, caps: &str, extra: &str) {
    let text = format!(
        r#"apiVersion: agentos/v0.2
kind: AgentContract
name: {name}
class: {{ latency: DT }}
exec:
  command: {py}
  args: ["{dir}/agent.py", {args}]
  env: {{ PYTHONDONTWRITEBYTECODE: "1" }}
capabilities:
  - fs.read: ["{dir}/agent.py", "{venv}"]
  - fs.exec: [/usr, /bin, /lib, "{venv}"]
{caps}compute: {{ pids: 64 }}
{extra}"#,
        py = s.python.display(),
        dir = s.dir.path().display(),
        venv = s.venv.display(),
    );
    let f = s.dir.path().join(format!("{name}.yaml"));
    std::fs::write(&f, text).unwrap();
    s.d.ctl_ok(&["start", f.to_str().unwrap()]);
}

/// The agent's report lines, once it printed `done` (or exited).
fn steps(s: &Setup, name: &str, secs: u64) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let st = s.d.status_json(name);
        let log = st["log_path"].as_str().unwrap_or_default().to_string();
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<Value> = text
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        let state = st["state"].as_str().unwrap_or_default();
        if lines.iter().any(|l| l["step"] == "done") || !matches!(state, "running" | "starting") {
            assert!(
                lines.iter().any(|l| l["step"] == "done"),
                "agent {name} ended ({state}) before it was done; its log:\n{text}\ndaemon log:\n{}",
                s.d.log_text()
            );
            return lines;
        }
        assert!(
            Instant::now() < deadline,
            "agent {name} not done in {secs} s; its log:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn step<'a>(all: &'a [Value], name: &str) -> &'a Value {
    all.iter()
        .find(|l| l["step"] == name)
        .unwrap_or_else(|| panic!("no step {name} in {all:#?}"))
}

fn audit(s: &Setup) -> Vec<Value> {
    std::fs::read_to_string(s.dir.path().join("audit/audit.log"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Waits until the audit trail has a record matching `f` (records are written in the
/// background once an answer ends).
fn audit_until(s: &Setup, what: &str, f: impl Fn(&Value) -> bool) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let all = audit(s);
        if all.iter().any(&f) {
            return all;
        }
        assert!(
            Instant::now() < deadline,
            "no audit record {what} in {all:#?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A Python helper of these tests (tests/models/NAME with `args`, the model peers' venv), which
/// prints one line when ready (its port); killed by its PID when dropped.
struct Helper(std::process::Child);

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn helper(name: &str, args: &[&std::ffi::OsStr]) -> (Helper, String) {
    let py = common::models::python().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/models")
        .join(name);
    let mut child = std::process::Command::new(&py)
        .arg(&script)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    use std::io::BufRead;
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    (Helper(child), line.trim().to_string())
}

/// Waits until agent `name` printed its `first` step (sdk-restart mode).
fn wait_first_call(s: &Setup, name: &str) {
    let log = || {
        std::fs::read_to_string(s.dir.path().join(format!("logs/default/{name}.log")))
            .unwrap_or_default()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !log().contains("\"first\"") {
        assert!(Instant::now() < deadline, "no first call:\n{}", log());
        std::thread::sleep(Duration::from_millis(100));
    }
}

const ONE_BACKEND: &str = "backends:\n  - name: llama\n    url: {chat}\n    placement: local\n    models: [{name: chat}, {name: forbidden}]\n";

#[test]
fn an_agent_calls_a_model_only_through_the_gateway_with_the_openai_sdk() {
    skip_unless_capable!();
    let Some(server) = ModelServer::chat() else {
        return;
    };
    let Some(embed) = ModelServer::embeddings() else {
        return;
    };
    let yaml = format!(
        "{ONE_BACKEND}  - name: e5\n    url: {{embed}}\n    placement: local\n    models: [{{name: embed, kind: embeddings}}]\n"
    );
    let s = setup_with("models-tour", &server, Some(&embed), &yaml, &[]);
    let backend = server.url.trim_start_matches("http://").to_string();
    run_agent(
        &s,
        "tourist",
        &format!("\"tour\", \"{backend}\""),
        "modelPolicy: { allow: [chat, nowhere, embed], max_output_tokens: 64 }\n",
    );
    let all = steps(&s, "tourist", 120);

    // Only what the contract allows and the host serves is listed.
    assert_eq!(
        step(&all, "models")["ids"],
        serde_json::json!(["chat", "embed"])
    );
    // Embeddings through the gateway; an embeddings model is not a chat model.
    let e = step(&all, "embeddings");
    assert_eq!(
        (e["n"].as_u64(), e["dims"].as_u64()),
        (Some(2), Some(common::models::EMBED_DIMS as u64)),
        "{e}"
    );
    assert_eq!(e["model"], "embed", "{e}");
    assert!(e["usage"]["prompt_tokens"].as_u64().unwrap() > 0, "{e}");
    assert_eq!(step(&all, "embed-as-chat")["code"], "model_not_allowed");
    // A whole answer: the agent-facing model name, the backend's usage.
    let chat = step(&all, "chat");
    assert_eq!(chat["model"], "chat", "{chat}");
    let usage = &chat["usage"];
    assert!(usage["prompt_tokens"].as_u64().unwrap() > 0, "{chat}");
    let completion = usage["completion_tokens"].as_u64().unwrap();
    assert!((1..=8).contains(&completion), "{chat}");
    // A stream: content chunks, and the usage chunk exactly when asked for.
    let stream = step(&all, "stream");
    assert_eq!(stream["model"], "chat", "{stream}");
    assert!(stream["chunks"].as_u64().unwrap() >= 1, "{stream}");
    assert_eq!(stream["usage_chunks"], 1, "{stream}");
    assert!(stream["usage"]["completion_tokens"].as_u64().unwrap() >= 1);
    assert_eq!(step(&all, "stream-no-usage")["usage_chunks"], 0);
    // 99 choices at once would multiply the output past any cap.
    let n = step(&all, "n-99");
    assert_eq!(
        (n["status"].as_u64(), n["code"].as_str()),
        (Some(400), Some("invalid_n")),
        "{n}"
    );
    // Off-policy and unknown models: OpenAI-style errors that say why.
    let forbidden = step(&all, "refused-forbidden");
    assert_eq!(forbidden["status"], 403, "{forbidden}");
    assert_eq!(forbidden["code"], "model_not_allowed");
    assert!(
        forbidden["message"]
            .as_str()
            .unwrap()
            .contains("modelPolicy")
    );
    let nowhere = step(&all, "refused-nowhere");
    assert_eq!(
        (nowhere["status"].as_u64(), nowhere["code"].as_str()),
        (Some(404), Some("model_not_found"))
    );
    // The backend is out of reach without the gateway. Without a network grant the agent's
    // network namespace is its own (127.0.0.1 there is not the host's), and only the gateway's
    // port on it may be connected to: Landlock refuses the backend's port (EACCES), the cgroup
    // BPF policy too where Landlock has no TCP rules (EPERM).
    let direct = step(&all, "direct");
    assert_eq!(direct["connected"], false, "{direct}");
    assert!(
        matches!(direct["errno"].as_str(), Some("EACCES" | "EPERM")),
        "{direct}"
    );
    // With a grant to somewhere else, the backend's address is refused: by Landlock's TCP rules
    // (EACCES) where the kernel has them, else by the cgroup BPF policy (EPERM).
    run_agent_with(
        &s,
        "netted",
        &format!("\"direct\", \"{backend}\""),
        "  - net.connect: [\"127.0.0.1:9\"]\n",
        "modelPolicy: { allow: [chat] }\n",
    );
    let netted = steps(&s, "netted", 60);
    let direct = step(&netted, "direct");
    assert_eq!(direct["connected"], false, "{direct}");
    assert!(
        matches!(direct["errno"].as_str(), Some("EACCES" | "EPERM")),
        "{direct}"
    );
    assert_eq!(step(&all, "not-json")["status"], 400);
    assert_eq!(step(&all, "too-large")["status"], 413);

    // Every call is on the record: the allow before it was sent, the outcome with usage after;
    // the prompt only as a hash.
    let recs = audit_until(&s, "model outcome x4", |_| {
        audit(&s).iter().filter(|r| r["kind"] == "model").count() >= 4
    });
    let models: Vec<&Value> = recs
        .iter()
        .filter(|r| r["kind"] == "model" && r["detail"]["endpoint"] == "/chat/completions")
        .collect();
    assert_eq!(models.len(), 3, "{models:#?}");
    assert!(recs.iter().any(|r| r["kind"] == "model"
        && r["detail"]["endpoint"] == "/embeddings"
        && r["detail"]["backend"] == "e5"
        && r["detail"]["prompt_tokens"].as_u64().is_some_and(|n| n > 0)));
    for r in &models {
        let d = &r["detail"];
        assert_eq!(
            (d["backend"].as_str(), d["placement"].as_str()),
            (Some("llama"), Some("local")),
            "{r}"
        );
        assert_eq!(d["usage_from"], "backend", "{r}");
        assert!(
            d["prompt_tokens"].as_u64().unwrap() > 0 && d["completion_tokens"].as_u64().is_some()
        );
        assert_eq!(d["prompt_sha256"].as_str().unwrap().len(), 64);
        assert!(
            d["first_token_ms"].as_f64().is_some() && d.get("prompt").is_none(),
            "{r}"
        );
        assert_eq!(d["outcome"], "ok", "{r}");
    }
    let allows = recs
        .iter()
        .filter(|r| {
            r["kind"] == "gate"
                && r["decision"] == "allow"
                && r["detail"]["endpoint"] == "/chat/completions"
        })
        .count();
    assert!(allows >= 3, "{recs:#?}");
    for (model, reason) in [
        ("forbidden", "model-not-allowed"),
        ("nowhere", "model-not-allowed"),
    ] {
        assert!(
            recs.iter().any(|r| r["kind"] == "gate"
                && r["decision"] == "deny"
                && r["detail"]["requested_model"] == model
                && r["detail"]["reason"] == reason),
            "no deny record for {model}: {recs:#?}"
        );
    }
    assert!(
        !std::fs::read_to_string(s.dir.path().join("audit/audit.log"))
            .unwrap()
            .contains("Say hello"),
        "a prompt reached the audit trail without record_content"
    );
    // And in status: tokens used and the last answer's speed.
    let m = &s.d.status_json("tourist")["models"];
    assert_eq!(m["calls"], 4, "{m}");
    assert_eq!(m["refused"], 3, "{m}");
    assert!(
        m["completion_tokens"].as_u64().unwrap() >= 2
            && m["last_first_token_us"].as_u64().unwrap() > 0,
        "{m}"
    );
    // The same figures as D-Bus properties (busctl, as an operator would read them).
    let path = s.d.status_json("tourist")["object_path"]
        .as_str()
        .unwrap()
        .to_string();
    let prop = |name: &str| {
        let out = std::process::Command::new("busctl")
            .args([
                "--address",
                &s.bus.address,
                "get-property",
                "org.agentos1",
                &path,
            ])
            .args(["org.agentos1.Agent", name])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let used = m["prompt_tokens"].as_u64().unwrap() + m["completion_tokens"].as_u64().unwrap();
    assert_eq!(prop("ModelTokens"), format!("t {used}"));
    assert_eq!(prop("ModelTokensLeft"), format!("t {}", u64::MAX));
    assert_eq!(
        prop("ModelFirstTokenUSec"),
        format!("t {}", m["last_first_token_us"])
    );
    assert!(prop("ModelTokensPerSec").starts_with("d "));
    // And in the live view, batch mode for scripts: the agent's tokens and first-token time.
    let top =
        s.d.ctl_ok(&["top", "--batch", "-n", "1", "-d", "0.2", "--sort", "tokens"]);
    let row = top
        .lines()
        .find(|l| l.starts_with("default/tourist "))
        .unwrap_or_else(|| panic!("{top}"));
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cols[7], used.to_string(), "{top}");
    assert!(top.lines().nth(1).unwrap().contains("TOKENS"), "{top}");
    let text = s.d.ctl_ok(&["status", "tourist"]);
    assert!(
        text.contains("Models: ") && text.contains("4 calls"),
        "{text}"
    );
}

#[test]
fn budgets_cut_off_an_agent_that_exceeds_them_and_never_overshoot() {
    skip_unless_capable!();
    let Some(server) = ModelServer::chat() else {
        return;
    };
    let mut s = setup("models-budget", &server, ONE_BACKEND);
    run_agent(
        &s,
        "spender",
        "\"budget\"",
        "modelPolicy: { allow: [chat] }\nbudgets: { tokens: 400 }\n",
    );
    let all = steps(&s, "spender", 120);
    let b = step(&all, "budget");
    assert!(b["ok"].as_u64().unwrap() >= 1, "no call got through: {b}");
    assert_eq!(
        (b["status"].as_u64(), b["code"].as_str()),
        (Some(429), Some("insufficient_quota")),
        "{b}"
    );
    assert!(
        b["message"].as_str().unwrap().contains("budgets.tokens"),
        "{b}"
    );
    let m = &s.d.status_json("spender")["models"];
    let used = m["prompt_tokens"].as_u64().unwrap() + m["completion_tokens"].as_u64().unwrap();
    assert!(used <= 400, "the budget was overshot: {m}");
    assert_eq!(m["tokens_left"].as_u64(), Some(400 - used), "{m}");
    let recs = audit_until(&s, "over-budget deny", |r| {
        r["kind"] == "gate" && r["detail"]["reason"] == "over-budget"
    });
    // Neither a restart of the agent nor one of the daemon refills the total.
    let log = s.d.status_json("spender")["log_path"]
        .as_str()
        .unwrap()
        .to_string();
    s.d.terminate();
    s.d.spawn();
    std::fs::write(&log, "").unwrap();
    run_agent(
        &s,
        "spender",
        "\"budget\"",
        "modelPolicy: { allow: [chat] }\nbudgets: { tokens: 400 }\n",
    );
    let again = steps(&s, "spender", 120);
    let b = step(&again, "budget");
    assert_eq!(
        (b["ok"].as_u64(), b["code"].as_str()),
        (Some(0), Some("insufficient_quota")),
        "{b}"
    );
    assert!(
        recs.iter().any(|r| r["detail"]["reason"] == "over-budget"
            && r["agent"].as_str().is_some_and(|a| a.contains("spender"))),
        "{recs:#?}"
    );
}

#[test]
fn a_model_whose_backend_is_down_falls_back_to_the_declared_alternative() {
    skip_unless_capable!();
    let Some(server) = ModelServer::chat() else {
        return;
    };
    // Port 9 (discard) on loopback: nothing listens there in the test bed.
    let yaml = format!(
        "{ONE_BACKEND}  - name: down\n    url: http://127.0.0.1:9\n    placement: on-prem\n    models: [{{name: primary}}]\n"
    );
    let s = setup("models-fallback", &server, &yaml);
    run_agent(
        &s,
        "faller",
        "\"fallback\"",
        "modelPolicy: { allow: [primary, chat], record_content: true }\nallow_fallbacks:\n  - { when: model_unavailable, substitute: { model: chat } }\n",
    );
    let all = steps(&s, "faller", 120);
    assert_eq!(step(&all, "fallback")["model"], "chat");
    let recs = audit_until(&s, "model record with fallback", |r| {
        r["kind"] == "model" && r["detail"]["fallback"].is_object()
    });
    let r = recs.iter().find(|r| r["kind"] == "model").unwrap();
    assert_eq!(
        r["detail"]["fallback"],
        serde_json::json!({"from": "primary", "to": "chat", "when": "model_unavailable"}),
        "{r}"
    );
    assert_eq!(r["detail"]["backend"], "llama");
    // record_content: the prompt and the completion are kept, next to their hashes.
    assert!(
        r["detail"]["prompt"]
            .as_str()
            .is_some_and(|p| p.contains("Say hello.")),
        "{r}"
    );
    assert!(
        r["detail"]["completion"]
            .as_str()
            .is_some_and(|c| !c.is_empty()),
        "{r}"
    );
    assert_eq!(
        r["detail"]["completion_sha256"].as_str().map(str::len),
        Some(64),
        "{r}"
    );
}

#[test]
fn a_model_named_in_consent_for_waits_for_the_operator() {
    skip_unless_capable!();
    let Some(server) = ModelServer::chat() else {
        return;
    };
    let s = setup("models-consent", &server, ONE_BACKEND);
    run_agent(
        &s,
        "asker",
        "\"consent\"",
        "modelPolicy: { allow: [chat] }\nsecurity: { consent_for: [\"model:chat\"] }\n",
    );
    for approve in [true, false] {
        let deadline = Instant::now() + Duration::from_secs(60);
        let id = loop {
            let list: Vec<Value> =
                serde_json::from_str(&s.d.ctl_ok(&["consent", "list", "--json"])).unwrap();
            if let Some(r) = list.first() {
                assert_eq!(r["capability"], "model:chat", "{r}");
                break r["id"].as_u64().unwrap().to_string();
            }
            assert!(Instant::now() < deadline, "no consent request");
            std::thread::sleep(Duration::from_millis(100));
        };
        s.d.ctl_ok(&["consent", if approve { "approve" } else { "deny" }, &id]);
    }
    let all = steps(&s, "asker", 120);
    let answers: Vec<&Value> = all.iter().filter(|l| l["step"] == "consent").collect();
    assert_eq!(answers[0]["status"], 200, "{answers:?}");
    assert_eq!(
        (answers[1]["status"].as_u64(), answers[1]["code"].as_str()),
        (Some(403), Some("consent_refused")),
        "{answers:?}"
    );
    let recs = audit(&s);
    assert!(
        recs.iter()
            .any(|r| r["kind"] == "consent" && r["detail"]["answer"] == "approved")
    );
    assert!(
        recs.iter()
            .any(|r| r["kind"] == "consent" && r["detail"]["answer"] == "denied")
    );
}

/// The example agent examples/agents/ask-and-count, as shipped but for its paths: one turn with a
/// model (the OpenAI SDK on its model socket) and a tool (the MCP SDK through the bridge).
#[test]
fn the_example_agent_calls_a_model_and_a_tool_in_one_turn() {
    skip_unless_capable!();
    let Some(server) = ModelServer::chat() else {
        return;
    };
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let tmp = tempfile::tempdir().unwrap();
    chmod(tmp.path(), 0o755);
    let wc = tmp.path().join("wordcount.py");
    std::fs::copy(repo.join("examples/tools/wordcount.py"), &wc).unwrap();
    chmod(&wc, 0o755);
    let tools = tmp.path().join("tools.d");
    std::fs::create_dir(&tools).unwrap();
    chmod(&tools, 0o755);
    let manifest = std::fs::read_to_string(repo.join("examples/tools/text-wordcount.yaml"))
        .unwrap()
        .replace("/usr/lib/agentos/tools/wordcount.py", wc.to_str().unwrap());
    // As shipped: its limits say `must: false` (run without them where the host cannot
    // enforce them), as in tests/mcp.rs.
    std::fs::write(tools.join("text-wordcount.yaml"), manifest).unwrap();
    // A real OTLP receiver sees the turn's lineage.
    let receiver = match common::otlp::receiver_python() {
        Ok(py) => common::otlp::Receiver::start(&py, tmp.path(), false),
        Err(why) => {
            common::skip(module_path!(), &why);
            return;
        }
    };
    let endpoint = receiver.endpoint();
    let s = setup_with(
        "models-example",
        &server,
        None,
        ONE_BACKEND,
        &[
            "--tools-dir",
            tools.to_str().unwrap(),
            "--otlp-endpoint",
            &endpoint,
            "--otlp-turn-idle",
            "3",
        ],
    );
    let example = repo.join("examples/agents/ask-and-count");
    let script = tmp.path().join("ask_and_count.py");
    std::fs::copy(example.join("ask_and_count.py"), &script).unwrap();
    chmod(&script, 0o644);
    let bridge = Path::new(common::bridge_bin());
    let bin_dir = bridge.parent().unwrap().display().to_string();
    let venv = s.venv.display().to_string();
    let text = std::fs::read_to_string(example.join("contract.yaml"))
        .unwrap()
        .replace(
            "command: /usr/bin/python3",
            &format!("command: {venv}/bin/python3"),
        )
        .replace(
            "/usr/local/share/agentos/examples/agents/ask-and-count/ask_and_count.py",
            script.to_str().unwrap(),
        )
        .replace(
            "/usr/local/share/agentos/examples/agents/ask-and-count]",
            &format!("{}, {venv}, {bin_dir}]", tmp.path().display()),
        )
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
    let f = s.dir.path().join("ask-and-count.yaml");
    std::fs::write(&f, text).unwrap();
    s.d.ctl_ok(&["start", f.to_str().unwrap()]);
    let all = steps(&s, "ask-and-count", 120);
    let model = step(&all, "model");
    assert_eq!(model["model"], "chat", "{model}");
    let tool = step(&all, "tool");
    assert_eq!(tool["ok"], true, "{tool}");
    assert!(tool["words"].as_u64().is_some(), "{tool}");
    let answer = step(&all, "answer");
    assert!(
        answer["chunks"].as_u64().unwrap() >= 1 && answer["tokens"].as_u64().unwrap() > 0,
        "{answer}"
    );
    // The record has the whole turn: model call, tool call, model call, in that order.
    let recs = audit_until(&s, "second model outcome", |_| {
        audit(&s).iter().filter(|r| r["kind"] == "model").count() >= 2
    });
    let order: Vec<&str> = recs
        .iter()
        .filter(|r| r["agent"] == "ask-and-count" && r["decision"] == "allow")
        .filter_map(|r| match r["kind"].as_str() {
            Some("model") => Some("model"),
            Some("gate") if r["detail"]["tool"] == "text.wordcount" => Some("tool"),
            _ => None,
        })
        .collect();
    assert_eq!(order, ["model", "tool", "model"], "{recs:#?}");
    assert_eq!(s.d.status_json("ask-and-count")["tool_calls"], 1);

    // The collector has the whole turn: one trace, the turn span and under it the gate
    // decisions, the two model calls (GenAI conventions) and the tool call.
    let span = |rows: &[Value], name: &str| -> Vec<Value> {
        rows.iter()
            .filter(|r| {
                r["signal"] == "span"
                    && r["name"] == name
                    && r["attributes"]["agentos.agent"] == "default/ask-and-count"
            })
            .cloned()
            .collect()
    };
    let rows = receiver.wait("the turn and its calls", 30, &s.d, |rows| {
        span(rows, "agent.turn").len() == 1
            && span(rows, "chat chat").len() == 2
            && span(rows, "execute_tool text.wordcount").len() == 1
    });
    let turn = &span(&rows, "agent.turn")[0];
    let models = span(&rows, "chat chat");
    let tool = &span(&rows, "execute_tool text.wordcount")[0];
    let gates = span(&rows, "agentos.gate");
    assert!(gates.len() >= 3, "{gates:#?}");
    for s in models.iter().chain([tool]).chain(gates.iter()) {
        assert_eq!(s["trace_id"], turn["trace_id"], "{s}");
        assert_eq!(s["parent_span_id"], turn["span_id"], "{s}");
        assert!(
            s["attributes"]["agentos.binding"]
                .as_str()
                .is_some_and(|b| b.len() == 64),
            "{s}"
        );
    }
    for m in &models {
        let a = &m["attributes"];
        assert_eq!(
            (
                a["gen_ai.operation.name"].as_str(),
                a["gen_ai.request.model"].as_str()
            ),
            (Some("chat"), Some("chat")),
            "{m}"
        );
        assert_eq!(a["gen_ai.provider.name"], "llama", "{m}");
        assert!(
            a["gen_ai.usage.input_tokens"]
                .as_i64()
                .is_some_and(|n| n > 0),
            "{m}"
        );
        assert!(
            a["gen_ai.usage.output_tokens"]
                .as_i64()
                .is_some_and(|n| n > 0),
            "{m}"
        );
    }
    // And the tokens as a metric of the agent.
    receiver.wait("token usage", 30, &s.d, |rows| {
        rows.iter().any(|r| {
            r["signal"] == "metric"
                && r["name"] == "gen_ai.client.token.usage"
                && r["attributes"]["agentos.agent"] == "default/ask-and-count"
        })
    });
}

/// The socket is the agent's alone: owned by its uid, mode 0600, and a process outside the
/// agent's cgroup (here root itself) is refused by the kernel's word on who connected.
#[test]
fn only_the_agent_may_use_its_model_socket() {
    skip_unless_capable!();
    let Some(server) = ModelServer::chat() else {
        return;
    };
    let s = setup("models-peer", &server, ONE_BACKEND);
    run_agent(&s, "waiter", "\"wait\"", "modelPolicy: { allow: [chat] }\n");
    let deadline = Instant::now() + Duration::from_secs(30);
    let sock = s.dir.path().join("run/agents/default/waiter.models.sock");
    while !sock.exists() {
        assert!(
            Instant::now() < deadline,
            "no model socket at {}",
            sock.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    use std::os::unix::fs::MetadataExt;
    let md = std::fs::metadata(&sock).unwrap();
    let pid = s.d.status_json("waiter")["main_pid"].as_u64().unwrap();
    let agent_uid = std::fs::metadata(format!("/proc/{pid}")).unwrap().uid();
    assert_eq!((md.mode() & 0o777, md.uid()), (0o600, agent_uid));
    assert_ne!(agent_uid, 0);
    // Root outside the agent: the connection is accepted by the kernel, then closed unanswered.
    let mut c = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    use std::io::{Read, Write};
    let _ = c.write_all(b"GET /v1/models HTTP/1.1\r\nHost: agentos\r\n\r\n");
    let mut buf = Vec::new();
    let _ = c.read_to_end(&mut buf);
    assert!(
        buf.is_empty(),
        "answered a process outside the agent: {}",
        String::from_utf8_lossy(&buf)
    );
    assert!(
        s.d.log_text()
            .contains("model socket: refused a connection"),
        "{}",
        s.d.log_text()
    );
    let recs = audit_until(&s, "socket-refused", |r| {
        r["detail"]["event"] == "socket-refused" && r["detail"]["socket"] == "models"
    });
    let r = recs
        .iter()
        .find(|r| r["detail"]["event"] == "socket-refused")
        .unwrap();
    assert_eq!(r["detail"]["peer_pid"], std::process::id(), "{r}");
    // A flood of refused connections: a record each only within the denial records' rate
    // (burst 100, 20/s), the rest counted in a summary record, never silently.
    let flood = 400u64;
    let t0 = Instant::now();
    for _ in 0..flood {
        drop(std::os::unix::net::UnixStream::connect(&sock).unwrap());
    }
    common::assert_refusals_rate_limited(flood + 1, t0, || audit(&s));
    // Stopping the agent removes its socket.
    s.d.ctl_ok(&["stop", "waiter"]);
    let deadline = Instant::now() + Duration::from_secs(15);
    while sock.exists() {
        assert!(Instant::now() < deadline, "{} left behind", sock.display());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// An unchanged program with the usual SDK: `OPENAI_BASE_URL` points at the gateway's port on the
/// loopback of the agent's own network namespace; every other port, UDP and binding stay refused.
#[test]
fn an_unchanged_sdk_reaches_the_gateway_on_its_loopback_port_and_nothing_else() {
    skip_unless_capable!();
    let Some(server) = ModelServer::chat() else {
        return;
    };
    let s = setup("models-port", &server, ONE_BACKEND);
    run_agent(
        &s,
        "plain",
        "\"sdk-env\"",
        "modelPolicy: { allow: [chat] }\n",
    );
    let all = steps(&s, "plain", 120);
    let env = step(&all, "env");
    assert_eq!(env["base_url"], "http://127.0.0.1:8080/v1", "{env}");
    assert_eq!(env["key"], "agentos", "{env}");
    let r = step(&all, "sdk-env");
    assert_eq!(r["model"], "chat", "{r}");
    assert!(
        r["usage"]["completion_tokens"].as_u64().unwrap() >= 1,
        "{r}"
    );
    for p in all.iter().filter(|l| l["step"] == "other-port") {
        assert_eq!(p["connected"], false, "{p}");
        assert!(
            matches!(p["errno"].as_str(), Some("EACCES" | "EPERM")),
            "{p}"
        );
    }
    let udp = step(&all, "udp");
    assert_eq!(
        (udp["sent"].as_bool(), udp["errno"].as_str()),
        (Some(false), Some("EPERM")),
        "{udp}"
    );
    let bind = step(&all, "bind");
    assert_eq!(bind["bound"], false, "{bind}");
    // The call is the agent's like any other.
    let recs = audit_until(&s, "the port's call", |r| {
        r["kind"] == "model" && r["agent"] == "plain"
    });
    assert!(
        recs.iter().any(|r| r["kind"] == "model"
            && r["agent"] == "plain"
            && r["detail"]["outcome"] == "ok")
    );
}

/// After a daemon restart the port is back in the re-adopted agent's namespace.
#[test]
fn the_loopback_port_comes_back_after_a_daemon_restart() {
    skip_unless_capable!();
    let Some(server) = ModelServer::chat() else {
        return;
    };
    let mut s = setup("models-port-restart", &server, ONE_BACKEND);
    run_agent(
        &s,
        "survivor",
        "\"sdk-restart\"",
        "modelPolicy: { allow: [chat] }\n",
    );
    wait_first_call(&s, "survivor");
    s.d.terminate();
    std::thread::sleep(Duration::from_millis(1500));
    s.d.spawn();
    let all = steps(&s, "survivor", 120);
    let r = step(&all, "restored");
    assert!(
        r.get("timeout").is_none(),
        "the port did not come back: {all:?}\n{}",
        s.d.log_text()
    );
}

/// A hosted API as the gateway sees one: https (a TLS proxy with a certificate from a private CA
/// in front of the llama.cpp server), a key from a root-only file. The key reaches the backend
/// over TLS; a backend whose certificate nobody vouches for is not spoken to.
#[test]
fn an_https_backend_gets_the_key_over_verified_tls() {
    skip_unless_capable!();
    let Some(server) = ModelServer::chat() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    // A private CA and a server certificate for localhost signed by it.
    let p = |n: &str| tmp.path().join(n);
    let (ca, cert, key) = (p("ca.pem"), p("cert.pem"), p("key.pem"));
    std::fs::write(
        p("ext"),
        "subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\n",
    )
    .unwrap();
    let openssl = |args: &[&str]| {
        let st = std::process::Command::new("openssl")
            .current_dir(tmp.path())
            .args(args)
            .stderr(std::process::Stdio::null())
            .status()
            .expect("openssl (apt-get install openssl)");
        assert!(st.success(), "openssl {args:?}");
    };
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=agentos-test-ca",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
    ]);
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=localhost",
        "-keyout",
        "key.pem",
        "-out",
        "leaf.csr",
    ]);
    openssl(&[
        "x509",
        "-req",
        "-in",
        "leaf.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        "ext",
        "-out",
        "cert.pem",
    ]);
    let auth_log = tmp.path().join("auth.log");
    let (_proxy, line) = helper(
        "tls_proxy.py",
        &[
            cert.as_os_str(),
            key.as_os_str(),
            server.url.as_ref(),
            auth_log.as_os_str(),
        ],
    );
    let port: u16 = line.parse().unwrap();
    let keyfile = tmp.path().join("api.key");
    std::fs::write(&keyfile, "sk-test-hosted-123\n").unwrap();
    chmod(&keyfile, 0o600);
    let yaml = format!(
        "backends:\n  - name: hosted\n    url: https://localhost:{port}/v1\n    placement: cloud\n    ca_file: {ca}\n    api_key_file: {keyfile}\n    models: [{{name: chat}}]\n  - name: untrusted\n    url: https://localhost:{port}/v1\n    placement: cloud\n    models: [{{name: forbidden}}]\n",
        ca = ca.display(),
        keyfile = keyfile.display()
    );
    let s = setup("models-https", &server, &yaml);
    run_agent(
        &s,
        "cloudy",
        "\"tls\"",
        "modelPolicy: { allow: [chat, forbidden] }\n",
    );
    let all = steps(&s, "cloudy", 120);
    let ok = step(&all, "tls-trusted");
    assert_eq!(ok["model"], "chat", "{ok}");
    let bad = step(&all, "tls-untrusted");
    assert_eq!(
        (bad["status"].as_u64(), bad["code"].as_str()),
        (Some(502), Some("backend_unavailable")),
        "{bad}"
    );
    assert!(bad["message"].as_str().unwrap().contains("TLS"), "{bad}");
    // The key went to the backend (once: the untrusted one never got a request), never to the
    // agent.
    let auth = std::fs::read_to_string(&auth_log).unwrap();
    assert_eq!(
        auth.lines().collect::<Vec<_>>(),
        ["Bearer sk-test-hosted-123"],
        "{auth}"
    );
    let agent_log = std::fs::read_to_string(s.dir.path().join("logs/default/cloudy.log")).unwrap();
    assert!(!agent_log.contains("sk-test"), "{agent_log}");
}

/// A tenant's budget (models.yaml `tenants:`) is shared by its agents: once one spent it, the
/// next is refused at once, and the message names the tenant.
#[test]
fn a_tenant_budget_is_shared_by_its_agents() {
    skip_unless_capable!();
    let Some(server) = ModelServer::chat() else {
        return;
    };
    let yaml = format!("{ONE_BACKEND}tenants:\n  default: {{ tokens: 400 }}\n");
    let s = setup("models-tenant", &server, &yaml);
    run_agent(
        &s,
        "first",
        "\"budget\"",
        "modelPolicy: { allow: [chat] }\n",
    );
    let b = step(&steps(&s, "first", 120), "budget").clone();
    assert!(b["ok"].as_u64().unwrap() >= 1, "{b}");
    assert_eq!(b["code"], "insufficient_quota", "{b}");
    assert!(
        b["message"].as_str().unwrap().contains("tenant default"),
        "{b}"
    );
    run_agent(
        &s,
        "second",
        "\"budget\"",
        "modelPolicy: { allow: [chat] }\n",
    );
    let b = step(&steps(&s, "second", 120), "budget").clone();
    assert_eq!(
        (b["ok"].as_u64(), b["code"].as_str()),
        (Some(0), Some("insufficient_quota")),
        "{b}"
    );
    let used: u64 = ["first", "second"]
        .iter()
        .map(|a| {
            let m = &s.d.status_json(a)["models"];
            m["prompt_tokens"].as_u64().unwrap() + m["completion_tokens"].as_u64().unwrap()
        })
        .sum();
    assert!(used <= 400, "the tenant's budget was overshot: {used}");
}

/// Streams count as in flight until they end, not until their head was sent: four unread
/// streams hold an agent's four calls, a fifth is refused, and a call goes through again once
/// they are closed.
#[test]
fn unread_streams_hold_the_agents_in_flight_calls() {
    skip_unless_capable!();
    let Some(server) = ModelServer::chat() else {
        return;
    };
    // A backend whose streams last a minute, so that they are surely in flight.
    let (_slow, line) = helper("slow_backend.py", &[]);
    let yaml = format!(
        "backends:\n  - name: slow\n    url: http://127.0.0.1:{}\n    placement: local\n    models: [{{name: chat}}]\n",
        line
    );
    let s = setup("models-inflight", &server, &yaml);
    run_agent(
        &s,
        "greedy",
        "\"inflight\"",
        "modelPolicy: { allow: [chat] }\n",
    );
    let all = steps(&s, "greedy", 180);
    let fifth = step(&all, "fifth");
    assert_eq!(
        (fifth["status"].as_u64(), fifth["code"].as_str()),
        (Some(429), Some("too_many_concurrent_calls")),
        "{fifth}"
    );
    let after = step(&all, "after");
    assert_eq!(after["status"], 200, "{after}");
}

/// An agent with network grants runs in the host's network namespace: its port is on the
/// host's loopback, where anyone could connect, so each peer is identified by the kernel
/// (sock_diag: the socket's cgroup). The agent's SDK works unchanged; root outside the agent gets
/// no answer and is on the record; after a daemon restart the same port serves again.
#[test]
fn an_agent_with_network_grants_gets_a_host_port_only_it_may_use() {
    skip_unless_capable!();
    let Some(server) = ModelServer::chat() else {
        return;
    };
    let mut s = setup("models-host-port", &server, ONE_BACKEND);
    run_agent_with(
        &s,
        "granted",
        "\"sdk-restart\"",
        "  - net.connect: [\"127.0.0.1:9\"]\n",
        "modelPolicy: { allow: [chat] }\n",
    );
    wait_first_call(&s, "granted");
    let pid = s.d.status_json("granted")["main_pid"].as_u64().unwrap();
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let url = environ
        .split(|b| *b == 0)
        .filter_map(|v| std::str::from_utf8(v).ok())
        .find_map(|v| v.strip_prefix("OPENAI_BASE_URL="))
        .unwrap()
        .to_string();
    let port: u16 = url
        .trim_start_matches("http://127.0.0.1:")
        .trim_end_matches("/v1")
        .parse()
        .unwrap();
    assert_ne!(port, 8080, "{url}");
    // Root, not the agent: closed unanswered, and recorded.
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = c.write_all(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n");
    let mut buf = Vec::new();
    let _ = c.read_to_end(&mut buf);
    assert!(
        buf.is_empty(),
        "answered root: {}",
        String::from_utf8_lossy(&buf)
    );
    audit_until(&s, "models-port refusal", |r| {
        r["detail"]["socket"] == "models-port" && r["agent"] == "granted"
    });
    // The daemon restarts; the agent's calls through the same URL work again.
    s.d.terminate();
    std::thread::sleep(Duration::from_millis(1500));
    s.d.spawn();
    let all = steps(&s, "granted", 120);
    let r = step(&all, "restored");
    assert!(
        r.get("timeout").is_none(),
        "the port did not come back: {all:?}\n{}",
        s.d.log_text()
    );
}

/// A flood of half-open requests on an agent's own socket costs the daemon a bounded number of
/// connections (16 served per agent, the rest wait in the kernel's backlog, not in the daemon),
/// and another agent's call and the operator's commands go through meanwhile.
#[test]
fn a_slowloris_agent_costs_the_daemon_a_bounded_number_of_connections() {
    skip_unless_capable!();
    let Some(server) = ModelServer::chat() else {
        return;
    };
    let s = setup("models-flood", &server, ONE_BACKEND);
    let daemon_fds = || {
        std::fs::read_dir(format!("/proc/{}/fd", s.d.pid()))
            .map(|d| d.count())
            .unwrap_or(0)
    };
    // An agent with the same paths first: the daemon keeps the root-only host paths of a
    // Landlock ruleset open between starts (sandbox/path_cache.rs), files that are its own and
    // not the flood's.
    run_agent(
        &s,
        "warmup",
        "\"fallback\"",
        "modelPolicy: { allow: [primary, chat] }\nallow_fallbacks:\n  - { when: model_unavailable, substitute: { model: chat } }\n",
    );
    steps(&s, "warmup", 60);
    let before = daemon_fds();
    let mem =
        common::mem::MemWatch::start(s.d.pid(), "slowloris on the model gateway (64 connections)");
    run_agent(
        &s,
        "flooder",
        "\"flood\"",
        "modelPolicy: { allow: [chat] }\n",
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let log = || {
        std::fs::read_to_string(s.dir.path().join("logs/default/flooder.log")).unwrap_or_default()
    };
    while !log().contains("\"holding\"") {
        assert!(
            Instant::now() < deadline,
            "the flood did not start:\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(500));
    let during = daemon_fds();
    // 16 accepted connections and the agent's own socket, log and pidfd, with room to spare;
    // not the 64 the agent opened.
    assert!(
        during < before + 40,
        "the daemon holds {during} fds during the flood, {before} before"
    );
    // Another agent is served at once; the operator too.
    run_agent(
        &s,
        "bystander",
        "\"fallback\"",
        "modelPolicy: { allow: [primary, chat] }\nallow_fallbacks:\n  - { when: model_unavailable, substitute: { model: chat } }\n",
    );
    let all = steps(&s, "bystander", 60);
    assert_eq!(step(&all, "fallback")["model"], "chat");
    let t0 = Instant::now();
    s.d.ctl_ok(&["list"]);
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "agentctl list took {:?}",
        t0.elapsed()
    );
    mem.finish(Duration::from_secs(1), 64);
}

/// The per-agent rate holds on the model gateway as on the MCP socket: an agent sending large
/// requests on 4 connections as fast as it can is read at its rate (`--ipc-agent-rate`, 2 MiB/s
/// here), not at whatever the daemon could parse; without a rate the same agent is read many
/// times faster (the figure the rate takes away). And its CPU share (`--ipc-agent-cpu`, 1% of
/// one CPU here as a hard cap, `--ipc-agent-cpu-ceiling 0`, no byte rate) holds it too: the
/// gateway's work for it is charged to the same account as its MCP sockets.
#[test]
fn the_gateway_reads_an_agent_at_its_rate() {
    skip_unless_capable!();
    let Some(server) = ModelServer::chat() else {
        return;
    };
    let rate = 2u64 << 20;
    let rate_arg = rate.to_string();
    let mut got = Vec::new();
    for (i, args) in [
        vec![
            "--ipc-agent-rate",
            rate_arg.as_str(),
            "--ipc-agent-cpu",
            "0",
        ],
        vec!["--ipc-agent-rate", "0", "--ipc-agent-cpu", "0"],
        // The share as a hard cap: alone, under the ceiling, it would not be held.
        vec![
            "--ipc-agent-rate",
            "0",
            "--ipc-agent-cpu",
            "1",
            "--ipc-agent-cpu-ceiling",
            "0",
        ],
    ]
    .into_iter()
    .enumerate()
    {
        let s = setup_with(
            &format!("models-rate-{i}"),
            &server,
            None,
            ONE_BACKEND,
            &args,
        );
        run_agent(
            &s,
            "bigflood",
            "\"bigflood\"",
            "modelPolicy: { allow: [chat] }\n",
        );
        // Under the 1% cap (i == 2) the daemon spends ≈ 0.55 s of its CPU on what the agent
        // sent in its 6 s (measured alone, 2026-11-27): ≈ 55 s of budget at 10 ms/s, more when
        // the suite's other tests load the host (a run took over 90 s).
        let all = steps(&s, "bigflood", if i == 2 { 240 } else { 90 });
        let r = step(&all, "bigflood");
        let mib = r["mib_per_s"].as_f64().unwrap();
        // Every request was answered (refused: the model is not granted), none dropped. Under
        // the hard cap of 1% (i == 2) the daemon reads so slowly that a keep-alive connection's
        // next request can wait longer than the gateway's header read timeout (30 s,
        // models/serve.rs) once the agent's 6 s are over: hyper then closes it with the request
        // unread (a reset at ≈ 30 s, measured on this host 2026-11-26). On a slower machine
        // (CI, 2026-11-27) a 1 MiB request could also wait longer than the client's own 60 s
        // timeout to be written or answered (`WriteTimeout`, `ReadTimeout`). That is the budget
        // working, so there the client's transport errors are allowed (never a 5xx, never a
        // 200), but answers must still have come.
        const HELD: [&str; 5] = [
            "ReadError",
            "ReadTimeout",
            "WriteError",
            "WriteTimeout",
            "RemoteProtocolError",
        ];
        let statuses = r["statuses"].as_object().unwrap();
        assert!(
            statuses.keys().any(|k| k.starts_with('4'))
                && statuses
                    .keys()
                    .all(|k| k.starts_with('4') || (i == 2 && HELD.contains(&k.as_str()))),
            "statuses {statuses:?}"
        );
        let cpu = s.d.status_json("bigflood")["daemon_cpu"].clone();
        println!("gateway read the agent at {mib:.1} MiB/s with {args:?}; daemon CPU for it {cpu}");
        got.push((mib, cpu));
    }
    let (limited, free, cpu_held) = (got[0].0, got[1].0, got[2].0);
    let want = rate as f64 / f64::from(1 << 20);
    assert!(
        limited <= want * 1.5 && limited >= want * 0.4,
        "read at {limited:.1} MiB/s with a rate of {want} MiB/s"
    );
    assert!(
        free > limited * 3.0,
        "without the rate {free:.1} MiB/s, with it {limited:.1} MiB/s"
    );
    assert!(
        free > cpu_held * 2.0,
        "without a CPU share {free:.1} MiB/s, with 1% of a CPU {cpu_held:.1} MiB/s"
    );
    assert!(
        got[2].1["throttles"].as_u64().unwrap_or(0) > 0,
        "the CPU share never held the agent: {:?}",
        got[2].1
    );
}

/// The open files all agents' connections may hold together (`--agent-conn-files`, ipc/files.rs):
/// with a bound of 2, an agent holding four model-gateway connections at once is served on two;
/// the others are closed at once and recorded; the budget comes back when they close.
#[test]
fn agents_connections_share_a_bounded_number_of_open_files() {
    skip_unless_capable!();
    let Some(server) = ModelServer::chat() else {
        return;
    };
    let s = setup_with(
        "models-conn-files",
        &server,
        None,
        ONE_BACKEND,
        &["--agent-conn-files", "2"],
    );
    for name in ["holder", "again"] {
        run_agent(&s, name, "\"conns\"", "modelPolicy: { allow: [chat] }\n");
        let all = steps(&s, name, 60);
        let r = step(&all, "conns");
        assert_eq!(
            (r["served"].as_u64(), r["refused"].as_u64()),
            (Some(2), Some(2)),
            "{name}: {r}"
        );
    }
    let recs = audit_until(
        &s,
        "a socket-refused record naming --agent-conn-files",
        |r| {
            r["detail"]["event"] == "socket-refused"
                && r["detail"]["reason"]
                    .as_str()
                    .is_some_and(|w| w.contains("--agent-conn-files"))
        },
    );
    assert!(!recs.is_empty());
}
