//! `agentctl tools`: the tool manifests the daemon loaded, which agents may call each, and the
//! manifests that did not load.

use std::io::Write;

use agentos_api::text::escape_control as esc;

use crate::client::{Client, fail};
use crate::exit;

type Row = (String, String, String, String, String, Vec<String>);

/// The table (or `--json` lines) of `ListTools`.
pub async fn tools(c: &Client, json: bool, out: &mut dyn Write) -> i32 {
    let (rows, errors): (Vec<Row>, Vec<String>) = match c.call("ListTools", &()).await {
        Ok(r) => r,
        Err(e) => return fail(out, e),
    };
    if json {
        for (name, kind, risk, file, description, agents) in &rows {
            let v = serde_json::json!({"tool": name, "kind": kind, "risk": risk, "file": file,
                                       "description": description, "agents": agents});
            let _ = writeln!(out, "{v}");
        }
        for e in &errors {
            let _ = writeln!(out, "{}", serde_json::json!({"error": e}));
        }
        return exit::OK;
    }
    let _ = writeln!(
        out,
        "{:<24} {:<5} {:<7} {:<32} FILE",
        "TOOL", "KIND", "RISK", "AGENTS"
    );
    for (name, kind, risk, file, _, agents) in &rows {
        let who = if agents.is_empty() {
            "-".to_string()
        } else {
            agents.iter().map(|a| esc(a)).collect::<Vec<_>>().join(",")
        };
        let _ = writeln!(
            out,
            "{:<24} {:<5} {:<7} {:<32} {}",
            esc(name),
            esc(kind),
            esc(risk),
            who,
            esc(file)
        );
    }
    let _ = writeln!(out, "\n{} tool(s) loaded.", rows.len());
    for e in &errors {
        let _ = writeln!(out, "not loaded: {}", esc(e));
    }
    exit::OK
}
