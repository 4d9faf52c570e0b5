//! `--no-block` and `agentctl list-jobs`: verbs queued as jobs (`QueueJob`), answered at once.

use std::io::Write;

use agentos_api::text::escape_control as esc;
use zbus::OwnedObjectPath;

use crate::client::{CliError, Client, fail};
use crate::exit;

/// Queue `verb` for each agent; prints `Queued job N: VERB AGENT (PATH)`. A contract file
/// cannot be queued (it is sent and started at once: use `start FILE` without --no-block).
pub async fn queue(c: &Client, verb: &str, agents: &[String], out: &mut dyn Write) -> i32 {
    let mut code = exit::OK;
    for a in agents {
        if verb == "start" && (a.contains('/') && std::path::Path::new(a).is_file()) {
            code = fail(
                out,
                CliError::new(
                    exit::USAGE,
                    format!(
                        "--no-block starts known agents by name; start the file {} without it",
                        esc(a)
                    ),
                ),
            );
            continue;
        }
        match c
            .call::<_, OwnedObjectPath>("QueueJob", &(verb, a.as_str()))
            .await
        {
            Ok(path) => {
                let id = path
                    .as_str()
                    .rsplit('/')
                    .next()
                    .unwrap_or_default()
                    .to_string();
                let _ = writeln!(
                    out,
                    "Queued job {id}: {verb} {} ({})",
                    esc(a),
                    path.as_str()
                );
            }
            Err(e) => code = fail(out, e),
        }
    }
    code
}

/// `agentctl list-jobs`: `JOB AGENT TYPE`, like `systemctl list-jobs`.
pub async fn list(c: &Client, out: &mut dyn Write) -> i32 {
    let rows: Vec<(u32, String, String, OwnedObjectPath)> = match c.call("ListJobs", &()).await {
        Ok(r) => r,
        Err(e) => return fail(out, e),
    };
    if rows.is_empty() {
        let _ = writeln!(out, "No jobs running.");
        return exit::OK;
    }
    let _ = writeln!(out, "{:<6} {:<32} TYPE", "JOB", "AGENT");
    for (id, agent, verb, _) in &rows {
        let _ = writeln!(out, "{id:<6} {:<32} {}", esc(agent), esc(verb));
    }
    let _ = writeln!(out, "\n{} jobs listed.", rows.len());
    exit::OK
}
