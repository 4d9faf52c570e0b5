//! Tool calls under systemd in the guest: agentosd as installed (its unit's UMask, /run/agentos
//! from RuntimeDirectory=), the example exec tools as installed by `cargo xtask install` (the
//! manifests from PREFIX/share/agentos/examples, their scripts in /usr/lib/agentos/tools, their
//! cgroup limits enforced by the guest's controllers) loaded with `agentctl daemon-reload`, and
//! an agent whose shell pipes MCP requests into the installed `agentos-mcp` bridge. The granted
//! tools answer; an ungranted one is refused; the decisions are in the audit trail.

use std::time::Duration;

use serde_json::Value;
use vm_tests::{Agent, agentctl, require_vm, wait_for, write_contract};

const EXAMPLES: &str = "/usr/local/share/agentos/examples/tools";

#[test]
#[ignore = "needs the guest VM: run `cargo xtask vm test`"]
fn an_agent_calls_a_shipped_tool_through_the_bridge() {
    require_vm();
    std::fs::create_dir_all("/etc/agentos/tools.d").unwrap();
    for m in ["clock-now.yaml", "text-wordcount.yaml", "crypto-hmac.yaml"] {
        std::fs::copy(
            format!("{EXAMPLES}/{m}"),
            format!("/etc/agentos/tools.d/{m}"),
        )
        .expect("the example tools are installed with the examples");
    }
    // daemon-reload reads the tools directory again (no restart).
    let reload = agentctl(&["daemon-reload"]).ok();
    assert!(reload.stdout.contains("3 tool(s) loaded"), "{reload}");
    let tools = agentctl(&["tools"]).ok().stdout;
    assert!(!tools.contains("not loaded"), "{tools}");
    let script = vm_tests::bridge_script(
        "",
        &[
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"clock.now","arguments":{}}}"#.to_string(),
            r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"text.wordcount","arguments":{"text":"one two two"}}}"#.to_string(),
            r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"crypto.hmac","arguments":{"message":"m","key":"k"}}}"#.to_string(),
        ],
        "",
    );
    let yaml = format!(
        "apiVersion: agentos/v0.2\nkind: AgentContract\nname: vmt-mcp\nclass: {{ latency: DT }}\n\
         exec: {{ command: /bin/sh, args: [\"-c\", {}] }}\nrestart: {{ policy: \"no\" }}\n\
         capabilities: [clock.now, text.wordcount]\n",
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
    // The Python example tool, as installed, answers.
    let wc = &by_id(3)["result"];
    assert_ne!(wc["isError"], true, "{wc}");
    assert_eq!(wc["structuredContent"]["words"], 3, "{wc}");
    // crypto.hmac is installed but not granted: refused by the gate.
    assert_eq!(by_id(4)["error"]["code"], -32001, "{text}");
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
    assert!(gate("allow", "text.wordcount"), "{recs:#?}");
    assert!(gate("deny", "crypto.hmac"), "{recs:#?}");
    agentctl(&["audit", "verify"]).ok();
    for m in ["clock-now.yaml", "text-wordcount.yaml", "crypto-hmac.yaml"] {
        let _ = std::fs::remove_file(format!("/etc/agentos/tools.d/{m}"));
    }
    agentctl(&["daemon-reload"]).ok();
}
