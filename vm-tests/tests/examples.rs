//! The shipped example agents and tools, **as installed**: their contracts and manifests exactly
//! as `cargo xtask install` put them in /usr/local/share/agentos/examples (nothing rewritten),
//! their dependencies where the files say an operator installs them (the MCP and OpenAI SDKs
//! for the guest's /usr/bin/python3, the npm filesystem server in /opt/agentos/tools, node from
//! Debian), and agentosd as systemd runs it. The model ask-and-count talks to is a fixture:
//! llama.cpp's server with SmolLM2-135M on the host ([`MODEL_URL`]), named `chat` in
//! /etc/agentos/models.yaml (xtask/src/vm/examples.rs, model.rs).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use vm_tests::{Agent, agentctl, require_vm, systemctl, wait_for};

const EXAMPLES: &str = "/usr/local/share/agentos/examples";
const TOOLS_D: &str = "/etc/agentos/tools.d";
const MODELS: &str = "/etc/agentos/models.yaml";
/// The model: llama.cpp's server with SmolLM2-135M on the host, forwarded by QEMU to this
/// address (xtask/src/vm/model.rs; under emulation the same server would take minutes).
const MODEL_URL: &str = "http://10.0.2.100:8080";

/// Installs example tool manifests into tools.d as an operator would (a copy of the shipped
/// file); removes them and reloads when dropped.
struct Manifests(Vec<String>);

impl Manifests {
    fn install(names: &[&str]) -> Manifests {
        std::fs::create_dir_all(TOOLS_D).expect("creating /etc/agentos/tools.d");
        let mut placed = Vec::new();
        for m in names {
            let to = format!("{TOOLS_D}/{m}");
            std::fs::copy(format!("{EXAMPLES}/tools/{m}"), &to)
                .unwrap_or_else(|e| panic!("{m} is not installed with the examples: {e}"));
            placed.push(to);
        }
        Manifests(placed)
    }
}

impl Drop for Manifests {
    fn drop(&mut self) {
        for m in &self.0 {
            let _ = std::fs::remove_file(m);
        }
        let _ = agentctl(&["daemon-reload"]);
    }
}

/// The JSON lines an agent printed (its stdout log), once it has ended.
fn output_when_ended(agent: &Agent, name: &str, secs: u64) -> (Value, Vec<Value>, String) {
    let st = agent.wait_states(
        &["inactive", "dead", "exited", "failed"],
        Duration::from_secs(secs),
    );
    let log = format!("/var/lib/agentos/logs/default/{name}.log");
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let err = std::fs::read_to_string(format!("/var/lib/agentos/logs/default/{name}.stderr.log"))
        .unwrap_or_default();
    let lines = text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    (st, lines, format!("stdout:\n{text}\nstderr:\n{err}"))
}

fn audit_of(agent: &str) -> Vec<Value> {
    agentctl(&["audit", "show", "--json", "--agent", agent])
        .ok()
        .stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

#[test]
#[ignore = "needs the guest VM: run `cargo xtask vm test`"]
fn notes_stats_counts_words_through_the_installed_tools() {
    require_vm();
    let notes = Path::new("/srv/notes");
    std::fs::create_dir_all(notes).unwrap();
    std::fs::write(notes.join("a.md"), "alpha beta beta gamma\n").unwrap();
    std::fs::write(notes.join("b.md"), "one two\nthree\n").unwrap();
    // How long the npm server takes to answer `initialize` here, started directly (as root, no
    // sandbox): the guest is emulated (TCG), far slower than any host it is made for.
    let direct = files_server_startup(notes);
    let _tools = Manifests::install(&["text-wordcount.yaml", "files.yaml"]);
    let reload = agentctl(&["daemon-reload"]).ok();
    assert!(reload.stdout.contains("2 tool(s) loaded"), "{reload}");
    let tools = agentctl(&["tools"]).ok().stdout;
    assert!(
        tools.contains("files") && !tools.contains("not loaded"),
        "{tools}"
    );

    let contract = format!("{EXAMPLES}/agents/notes-stats/contract.yaml");
    let started = std::time::Instant::now();
    let a = Agent::start("notes-stats", Path::new(&contract));
    // The DT agent's tools run in the idle class: the npm server's start (longer in the
    // sandbox than directly, every open checked) gets only the guest's idle CPU.
    let (st, lines, text) = output_when_ended(&a, "notes-stats", 300);
    println!(
        "notes-stats ran {:?} (the npm server alone answered initialize in {direct:?})",
        started.elapsed()
    );
    let note = |n: &str| {
        lines
            .iter()
            .find(|v| v["note"] == n)
            .unwrap_or_else(|| {
                panic!("no line for {n} ({st}; the server alone answered in {direct:?}):\n{text}")
            })
            .clone()
    };
    // The npm server listed the notes (files.list_directory / read_text_file), the Python tool
    // counted them.
    assert_eq!(note("a.md")["words"], 4, "{text}");
    assert_eq!(note("a.md")["top"][0]["word"], "beta", "{text}");
    assert_eq!(note("b.md")["words"], 3, "{text}");
    let total = lines
        .iter()
        .find(|v| v.get("total_words").is_some())
        .unwrap_or_else(|| panic!("no total:\n{text}"));
    assert_eq!(total["total_words"], 7, "{text}");
    assert_eq!(total["notes"], 2, "{text}");
    assert_eq!(st["result"], "success", "{st}\n{text}");

    let recs = audit_of("notes-stats");
    let allowed = |tool: &str| {
        recs.iter()
            .any(|r| r["kind"] == "gate" && r["decision"] == "allow" && r["detail"]["tool"] == tool)
    };
    assert!(allowed("text.wordcount"), "{recs:#?}");
    assert!(
        recs.iter().any(|r| r["kind"] == "gate"
            && r["decision"] == "allow"
            && r["detail"]["tool"]
                .as_str()
                .is_some_and(|t| t.starts_with("files."))),
        "{recs:#?}"
    );
    let _ = std::fs::remove_dir_all(notes);
}

/// The time the installed filesystem server takes from exec to its `initialize` answer.
fn files_server_startup(dir: &Path) -> Duration {
    use std::io::Write;
    let started = std::time::Instant::now();
    let mut child = Command::new("/usr/bin/node")
        .arg(
            "/opt/agentos/tools/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js",
        )
        .arg(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("node and the npm filesystem server are installed in the guest");
    writeln!(
        child.stdin.as_mut().expect("piped stdin"),
        r#"{{"jsonrpc":"2.0","id":1,"method":"initialize","params":{{"protocolVersion":"2025-06-18","capabilities":{{}},"clientInfo":{{"name":"t","version":"0"}}}}}}"#
    )
    .expect("writing initialize to the filesystem server");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("piped stdout"))
        .read_line(&mut line)
        .expect("reading the filesystem server's answer");
    let took = started.elapsed();
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        line.contains("\"result\""),
        "the filesystem server answered {line:?}"
    );
    took
}

fn restart_agentosd() {
    systemctl(&["restart", "agentosd.service"]).ok();
    wait_for("agentosd to be active", Duration::from_secs(60), || {
        (systemctl(&["is-active", "agentosd.service"]).stdout.trim() == "active").then_some(())
    });
}

/// Removes models.yaml and restarts agentosd without its gateway when dropped.
struct ModelsConfig;

impl Drop for ModelsConfig {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(MODELS);
        restart_agentosd();
    }
}

#[test]
#[ignore = "needs the guest VM: run `cargo xtask vm test`"]
fn ask_and_count_calls_the_model_and_the_tool_in_one_turn() {
    require_vm();
    std::fs::write(
        MODELS,
        format!(
            "backends:\n  - name: llama\n    url: {MODEL_URL}\n    placement: local\n    models: [{{name: chat}}]\n"
        ),
    )
    .unwrap();
    let _models = ModelsConfig;
    let _tools = Manifests::install(&["text-wordcount.yaml"]);
    // models.yaml is read when agentosd starts.
    restart_agentosd();

    let contract = format!("{EXAMPLES}/agents/ask-and-count/contract.yaml");
    let a = Agent::start("ask-and-count", Path::new(&contract));
    let (st, lines, text) = output_when_ended(&a, "ask-and-count", 240);
    let step = |name: &str| {
        lines
            .iter()
            .find(|l| l["step"] == name)
            .unwrap_or_else(|| panic!("no step {name} ({st}):\n{text}"))
            .clone()
    };
    assert_eq!(step("model")["model"], "chat", "{text}");
    let tool = step("tool");
    assert_eq!(tool["ok"], true, "{text}");
    assert!(tool["words"].as_u64().is_some(), "{text}");
    let answer = step("answer");
    assert!(
        answer["tokens"].as_u64().unwrap_or(0) > 0,
        "{answer}\n{text}"
    );
    step("done");
    assert_eq!(st["result"], "success", "{st}\n{text}");

    // The trail has the whole turn in order: model, tool, model.
    let recs = wait_for("the second model record", Duration::from_secs(30), || {
        let r = audit_of("ask-and-count");
        (r.iter().filter(|r| r["kind"] == "model").count() >= 2).then_some(r)
    });
    let order: Vec<&str> = recs
        .iter()
        .filter(|r| r["decision"] == "allow")
        .filter_map(|r| match r["kind"].as_str() {
            Some("model") => Some("model"),
            Some("gate") if r["detail"]["tool"] == "text.wordcount" => Some("tool"),
            _ => None,
        })
        .collect();
    assert_eq!(order, ["model", "tool", "model"], "{recs:#?}");
    agentctl(&["audit", "verify"]).ok();
}
