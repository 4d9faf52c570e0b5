//! `exec` tools: one sandboxed process per call. The arguments object goes to stdin as one
//! JSON line (then EOF); exit 0 with a JSON object on stdout is the structured result; any
//! other exit is a tool error (`isError: true`) carrying the tail of stderr.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use super::proc::{self, Place};
use super::{Caller, Loaded, RunnerConfig, ToolError};
use crate::sys::ExitStatus;

/// How much of stderr is kept for the error message.
pub const STDERR_TAIL: usize = 4096;

/// Read at most `limit` bytes; `true` when there was more.
async fn read_capped<R: AsyncRead + Unpin>(mut r: R, limit: u64) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    let mut buf = [0u8; 16384];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => return (out, false),
            Ok(n) => {
                if out.len() as u64 + n as u64 > limit {
                    let keep = (limit as usize).saturating_sub(out.len());
                    out.extend_from_slice(&buf[..keep]);
                    return (out, true);
                }
                out.extend_from_slice(&buf[..n]);
            }
        }
    }
}

/// Read everything, keeping the last `keep` bytes.
async fn read_tail<R: AsyncRead + Unpin>(mut r: R, keep: usize) -> Vec<u8> {
    let mut out: Vec<u8> = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => return out,
            Ok(n) => {
                out.extend_from_slice(&buf[..n]);
                if out.len() > 2 * keep {
                    out.drain(..out.len() - keep);
                }
            }
        }
    }
}

fn tail_text(b: &[u8]) -> String {
    let start = b.len().saturating_sub(STDERR_TAIL);
    String::from_utf8_lossy(&b[start..]).trim().to_string()
}

enum Outcome {
    Exited(ExitStatus),
    Timeout,
    Cancelled,
    Overflow,
}

/// Run one call of the exec tool `t` (arguments already validated).
pub async fn run(
    t: &Loaded,
    caller: &Caller,
    cfg: &RunnerConfig,
    place: Place,
    args: &Value,
    scope: &[String],
    mut cancel: impl std::future::Future<Output = ()> + Unpin,
) -> Result<Value, ToolError> {
    let m = &t.manifest;
    let failed = |e: String| ToolError::Failed(format!("tool {} ({}): {e}", m.name, m.origin));
    let p = proc::launch(m, caller, cfg, &place, scope)
        .await
        .map_err(failed)?;
    let proc::Proc {
        pidfd,
        mut stdin,
        stdout,
        stderr,
        cgroup,
        scratch,
        // Dropped at the end of the call, after the cgroup is gone.
        policy: _policy,
        ..
    } = p;
    let mut line = args.to_string();
    line.push('\n');
    let writer = crate::ipc::cpu::spawn_for_current(async move {
        // A tool that does not read its input gets EPIPE here: that is fine.
        let _ = stdin.write_all(line.as_bytes()).await;
        let _ = stdin.shutdown().await;
    });
    let limit = m.limits.output_bytes;
    let mut out_task = crate::ipc::cpu::spawn_for_current(read_capped(stdout, limit));
    let err_task = crate::ipc::cpu::spawn_for_current(read_tail(stderr, STDERR_TAIL));
    let exit = proc::wait_exit(&pidfd);
    tokio::pin!(exit);
    let deadline = tokio::time::sleep(m.timeout);
    tokio::pin!(deadline);
    let mut out: Option<(Vec<u8>, bool)> = None;
    let outcome = loop {
        tokio::select! {
            st = &mut exit => break Outcome::Exited(st),
            _ = &mut deadline => break Outcome::Timeout,
            _ = &mut cancel => break Outcome::Cancelled,
            r = &mut out_task, if out.is_none() => {
                let r = r.unwrap_or_default();
                let over = r.1;
                out = Some(r);
                if over {
                    break Outcome::Overflow;
                }
            }
        }
    };
    // Whatever happened, nothing of the call outlives it: children left behind by a tool
    // that exited are killed too.
    proc::kill(&cgroup);
    if !matches!(outcome, Outcome::Exited(_)) {
        let _ = tokio::time::timeout(Duration::from_secs(5), &mut exit).await;
    }
    writer.abort();
    let out = match out {
        Some(o) => o,
        None => tokio::time::timeout(Duration::from_secs(5), out_task)
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_default(),
    };
    let err = tokio::time::timeout(Duration::from_secs(5), err_task)
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default();
    proc::cleanup(&cgroup, &scratch).await;
    match outcome {
        Outcome::Timeout => Err(ToolError::Timeout {
            tool: m.name.clone(),
            after: m.timeout,
        }),
        Outcome::Cancelled => Err(ToolError::Cancelled(m.name.clone())),
        Outcome::Overflow => Err(failed(format!(
            "output is larger than limits.output ({limit} bytes); the tool was killed"
        ))),
        Outcome::Exited(st) if st.success() => result(t, &out.0),
        Outcome::Exited(st) => {
            let mut text = format!("tool {} failed ({})", m.name, st.describe());
            let tail = tail_text(&err);
            if !tail.is_empty() {
                text.push_str(": ");
                text.push_str(&tail);
            }
            Ok(json!({"content": [{"type": "text", "text": text}], "isError": true}))
        }
    }
}

/// The CallToolResult of a successful exit: stdout is the structured result (a JSON object,
/// checked against `output_schema`); without an output schema, other stdout is plain text.
fn result(t: &Loaded, stdout: &[u8]) -> Result<Value, ToolError> {
    let m = &t.manifest;
    let invalid = |errors: Vec<String>| ToolError::InvalidOutput {
        tool: m.name.clone(),
        errors,
    };
    let text = std::str::from_utf8(stdout)
        .map_err(|_| invalid(vec!["stdout is not UTF-8".into()]))?
        .trim();
    let parsed = serde_json::from_str::<Value>(text).ok();
    if let Some(schema) = &t.output {
        let Some(v) = &parsed else {
            return Err(invalid(vec![
                "stdout is not JSON (an exec tool with an output_schema prints one JSON object)"
                    .into(),
            ]));
        };
        let errors = schema.errors(v);
        if !errors.is_empty() {
            return Err(invalid(errors));
        }
    }
    Ok(match parsed {
        Some(Value::Object(o)) => {
            json!({"content": [{"type": "text", "text": Value::Object(o.clone()).to_string()}], "structuredContent": o})
        }
        Some(Value::String(s)) => json!({"content": [{"type": "text", "text": s}]}),
        Some(other) => json!({"content": [{"type": "text", "text": other.to_string()}]}),
        None => json!({"content": [{"type": "text", "text": text}]}),
    })
}
