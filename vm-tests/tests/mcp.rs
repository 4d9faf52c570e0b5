//! Tool calls under systemd in the guest: agentosd as installed (its unit's UMask, /run/agentos
//! from RuntimeDirectory=), an example tool manifest as shipped (with its cgroup limits, which
//! the guest's controllers enforce), and an agent whose shell pipes MCP requests into the
//! installed `agentos-mcp` bridge. The granted tool answers; an ungranted one is refused; both
//! decisions are in the audit trail.

use std::time::Duration;

use serde_json::Value;
use vm_tests::{Agent, agentctl, require_vm, systemctl, wait_for, write_contract};

const EXAMPLES: &str = "/usr/local/share/agentos/examples/tools";

#[test]
#[ignore = "needs the guest VM: run `cargo xtask vm test`"]
fn an_agent_calls_a_shipped_tool_through_the_bridge() {
    require_vm();
    std::fs::create_dir_all("/etc/agentos/tools.d").unwrap();
    std::fs::copy(
        format!("{EXAMPLES}/clock-now.yaml"),
        "/etc/agentos/tools.d/clock-now.yaml",
    )
    .expect("the example tools are installed with the examples");
    // Tools are loaded when the daemon starts.
    systemctl(&["restart", "agentosd"]).ok();
    wait_for("agentosd back", Duration::from_secs(60), || {
        agentctl(&["list"]).success().then_some(())
    });
    let requests = [
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"sh","version":"0"}}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"clock.now","arguments":{}}}"#,
        r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"text.wordcount","arguments":{"text":"x"}}}"#,
    ];
    let script = format!(
        "printf '%s\\n' {} | agentos-mcp; echo bridge-exit=$?",
        requests
            .iter()
            .map(|r| format!("'{r}'"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    let yaml = format!(
        "apiVersion: agentos/v0.2\nkind: AgentContract\nname: vmt-mcp\nclass: {{ latency: DT }}\n\
         exec: {{ command: /bin/sh, args: [\"-c\", {}] }}\nrestart: {{ policy: \"no\" }}\n\
         capabilities: [clock.now]\n",
        serde_json::to_string(&script).unwrap()
    );
    let a = Agent::start("vmt-mcp", &write_contract("vmt-mcp", &yaml));
    let log = "/var/lib/agentos/logs/default/vmt-mcp.log";
    let replies: Vec<Value> = wait_for("the bridge to finish", Duration::from_secs(60), || {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        text.contains("bridge-exit=").then(|| {
            text.lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .collect()
        })
    });
    let text = std::fs::read_to_string(log).unwrap_or_default();
    assert!(text.contains("bridge-exit=0"), "{text}");
    let by_id = |id: u64| {
        replies
            .iter()
            .find(|r| r["id"] == id)
            .unwrap_or_else(|| panic!("no reply {id} in {text}"))
    };
    assert_eq!(by_id(1)["result"]["serverInfo"]["name"], "agentosd");
    let clock = &by_id(2)["result"];
    assert_ne!(clock["isError"], true, "{clock}");
    assert!(
        clock["structuredContent"]["unix"].as_u64().unwrap_or(0) > 1_700_000_000,
        "{clock}"
    );
    // text.wordcount is not installed here: unknown tool.
    assert_eq!(by_id(3)["error"]["code"], -32602, "{text}");
    a.wait_states(&["inactive", "dead", "exited"], Duration::from_secs(20));
    // The socket went with the agent; the runtime directory stays as systemd made it.
    assert!(!std::path::Path::new("/run/agentos/agents/default/vmt-mcp.sock").exists());

    let out = agentctl(&["audit", "show", "--json", "--agent", "vmt-mcp"]).ok();
    let recs: Vec<Value> = out
        .stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let gate = |decision: &str, tool: &str| {
        recs.iter().any(|r| {
            r["kind"] == "gate" && r["decision"] == decision && r["detail"]["tool"] == tool
        })
    };
    assert!(gate("allow", "clock.now"), "{recs:#?}");
    assert!(gate("deny", "text.wordcount"), "{recs:#?}");
    agentctl(&["audit", "verify"]).ok();
    let _ = std::fs::remove_file("/etc/agentos/tools.d/clock-now.yaml");
}
