//! `agentctl validate FILE... [--json]`: checks contract files (and tool manifests, the files
//! whose `kind:` is `Tool`) without a daemon.
//!
//! Text output: one line per valid file on `out` (`FILE: ok NAME (tenant T, CLASS, ...)`),
//! and every diagnostic on `err` as `FILE:LINE:COL: message` (warnings as
//! `FILE:LINE:COL: warning: message`). JSON output: one array on `out`, one object per file.
//! Exit code: 0 when every file is valid, 1 when any is not, 2 for usage errors (no files).

use std::io::Write;
use std::path::PathBuf;

use serde::Serialize;

/// Every file valid.
pub const EXIT_OK: i32 = 0;
/// At least one file is invalid or unreadable.
pub const EXIT_INVALID: i32 = 1;
/// Bad usage.
pub const EXIT_USAGE: i32 = 2;

/// The result for one file, as printed by `--json`.
#[derive(Debug, Serialize)]
pub struct FileResult {
    pub file: String,
    pub valid: bool,
    /// `tenant/name` when valid.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// Whether the contract has `exec` (a contract without it validates but cannot be started).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runnable: Option<bool>,
    /// SHA-256 of the contract's canonical JSON.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// The normalized contract.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub contract: Option<serde_json::Value>,
    /// Errors and warnings, in file order.
    pub diagnostics: Vec<contracts::Diagnostic>,
}

/// Whether the file says `kind: Tool` at its top level (a tool manifest, not a contract): the
/// daemon's rule (`contracts::document_kind`).
fn is_tool_manifest(path: &std::path::Path) -> bool {
    std::fs::read_to_string(path).is_ok_and(|t| {
        contracts::document_kind(&t).is_some_and(|(k, _)| k == contracts::tool::TOOL_KIND)
    })
}

fn check_tool(path: &std::path::Path) -> FileResult {
    let file = path.display().to_string();
    let (valid, summary, diagnostics) = match contracts::tool::load_tool(path) {
        Ok(t) => (
            true,
            Some(format!(
                "tool {} ({}, risk {:?}{}, timeout {} ms, {})",
                t.name,
                if t.is_mcp() { "mcp server" } else { "exec" },
                t.risk,
                match t.durability {
                    contracts::tool::ToolDurability::Written => ", durability written",
                    contracts::tool::ToolDurability::Sync => "",
                },
                t.timeout.as_millis(),
                t.program().command.display()
            )),
            Vec::new(),
        ),
        Err(e) => (false, None, e.diagnostics),
    };
    FileResult {
        file,
        valid,
        agent: None,
        summary,
        runnable: None,
        sha256: None,
        contract: None,
        diagnostics,
    }
}

/// Validate one file.
pub fn check_file(path: &std::path::Path) -> FileResult {
    if is_tool_manifest(path) {
        return check_tool(path);
    }
    let file = path.display().to_string();
    match contracts::load_contract(path) {
        Ok(c) => FileResult {
            file,
            valid: true,
            agent: Some(c.id()),
            summary: Some(c.summary()),
            runnable: Some(c.exec().is_some()),
            sha256: Some(c.sha256()),
            contract: serde_json::from_str(&c.to_canonical_json()).ok(),
            diagnostics: c.warnings().to_vec(),
        },
        Err(e) => FileResult {
            file,
            valid: false,
            agent: None,
            summary: None,
            runnable: None,
            sha256: None,
            contract: None,
            diagnostics: e.diagnostics,
        },
    }
}

/// Run `agentctl validate`; returns the process exit code.
pub fn run(files: &[PathBuf], json: bool, out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    if files.is_empty() {
        let _ = writeln!(
            err,
            "agentctl validate: no files given\nusage: agentctl validate [--json] FILE..."
        );
        return EXIT_USAGE;
    }
    let results: Vec<FileResult> = files.iter().map(|f| check_file(f)).collect();
    let code = if results.iter().all(|r| r.valid) {
        EXIT_OK
    } else {
        EXIT_INVALID
    };
    if json {
        match serde_json::to_string_pretty(&results) {
            Ok(s) => {
                let _ = writeln!(out, "{s}");
            }
            Err(e) => {
                let _ = writeln!(err, "agentctl validate: cannot encode JSON: {e}");
                return EXIT_INVALID;
            }
        }
        return code;
    }
    for r in &results {
        if let Some(s) = &r.summary {
            let _ = writeln!(out, "{}: ok {s}", r.file);
        }
        for d in &r.diagnostics {
            let _ = writeln!(err, "{d}");
        }
    }
    code
}

#[cfg(test)]
mod tests {
    use super::*;

    fn examples() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/contracts")
    }

    fn invalid() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../contracts/tests/invalid")
    }

    fn run_capture(files: &[PathBuf], json: bool) -> (i32, String, String) {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = run(files, json, &mut out, &mut err);
        (
            code,
            String::from_utf8(out).unwrap(),
            String::from_utf8(err).unwrap(),
        )
    }

    #[test]
    fn tool_manifests_are_validated_as_tools() {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/tools");
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
            .collect();
        files.sort();
        assert!(files.len() >= 4);
        let (code, out, err) = run_capture(&files, false);
        assert_eq!(code, 0, "{err}");
        assert!(out.contains("ok tool text.wordcount (exec"), "{out}");
        assert!(out.contains("ok tool files (mcp server"), "{out}");
        let bad =
            std::env::temp_dir().join(format!("agentos-bad-tool-{}.yaml", std::process::id()));
        std::fs::write(
            &bad,
            "apiVersion: agentos/v0.2\nkind: Tool\nname: x.y\ndescription: d\ntimeuot_ms: 5\nexec: { command: /bin/true }\n",
        )
        .unwrap();
        let (code, _, err) = run_capture(std::slice::from_ref(&bad), false);
        let _ = std::fs::remove_file(&bad);
        assert_eq!(code, 1);
        assert!(err.contains(":5:1:") && err.contains("timeout_ms"), "{err}");
    }

    #[test]
    fn every_example_is_valid() {
        let mut files: Vec<PathBuf> = std::fs::read_dir(examples())
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
            .collect();
        files.sort();
        let (code, out, err) = run_capture(&files, false);
        assert_eq!(code, 0, "{err}");
        assert_eq!(out.lines().count(), files.len());
        let doc = examples().join("doc-rag-planner.yaml");
        assert!(
            out.contains(&format!(
                "{}: ok doc-rag-planner (tenant default, SRT, 3 capabilities, cpu 1, mem 2GiB, no exec)\n",
                doc.display()
            )),
            "{out}"
        );
        // warnings go to err and do not fail validation
        assert!(
            err.contains(&format!(
                "{}:10:27: warning: \"fs.write\" is in security.consent_for",
                doc.display()
            )),
            "{err}"
        );
    }

    #[test]
    fn invalid_file_exits_1_with_positions() {
        let good = examples().join("hello-agent.yaml");
        let bad = invalid().join("unknown-capability.yaml");
        let (code, out, err) = run_capture(&[good.clone(), bad.clone()], false);
        assert_eq!(code, 1);
        assert_eq!(
            out,
            format!(
                "{}: ok hello-agent (tenant demo, SRT, 2 capabilities, cpu 250m, mem 64MiB)\n",
                good.display()
            )
        );
        assert_eq!(
            err,
            format!(
                "{}:3:29: capabilities[1]: unknown capability \"fs.reed\" (did you mean \"fs.read\"?)\n",
                bad.display()
            )
        );
    }

    #[test]
    fn missing_file_and_no_files() {
        let (code, _, err) = run_capture(&[PathBuf::from("/nonexistent/x.yaml")], false);
        assert_eq!(code, 1);
        assert!(
            err.starts_with("/nonexistent/x.yaml:0:0: cannot read: "),
            "{err}"
        );
        let (code, out, err) = run_capture(&[], false);
        assert_eq!(code, 2);
        assert!(out.is_empty());
        assert!(err.contains("no files given"));
    }

    #[test]
    fn json_output() {
        let good = examples().join("safety-kill-switch.yaml");
        let bad = invalid().join("runtime-over-deadline.yaml");
        let (code, out, err) = run_capture(&[good, bad.clone()], true);
        assert_eq!(code, 1);
        assert!(err.is_empty());
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let arr = v.as_array().unwrap();
        assert_eq!(arr.len(), 2);
        assert_eq!(arr[0]["valid"], true);
        assert_eq!(arr[0]["agent"], "default/safety-kill-switch");
        assert_eq!(arr[0]["runnable"], false);
        assert_eq!(arr[0]["contract"]["class"]["latency"], "HRT");
        assert_eq!(arr[0]["sha256"].as_str().map(str::len), Some(64));
        assert_eq!(arr[1]["valid"], false);
        assert_eq!(arr[1]["file"], bad.display().to_string());
        let d = &arr[1]["diagnostics"][0];
        assert_eq!(
            (d["line"].as_u64(), d["column"].as_u64()),
            (Some(4), Some(22))
        );
        assert_eq!(d["field"], "class.slo.runtime_ms");
        assert_eq!(d["severity"], "error");
    }
}
