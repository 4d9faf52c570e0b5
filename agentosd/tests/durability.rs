//! The per-tool durability level (`durability: sync | written` in a tool manifest): the allow
//! record of a call is in the audit file before the tool runs at both levels, and a call is
//! refused (-32005) without running when the trail cannot write it, at both levels. Root only.

#![allow(clippy::unwrap_used)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

use common::{Bus, Daemon, TestCgroup};

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn write(p: &Path, text: &str, mode: u32) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
    chmod(p, mode);
}

/// A tool `probe.<level>` that leaves `<marker>/ran-<level>` (appending a line per run), then
/// waits for `<marker>/release` (at most 20 s) before it answers.
fn probe_manifest(level: &str, durability: &str, marker: &Path) -> String {
    format!(
        r#"apiVersion: agentos/v0.2
kind: Tool
name: probe.{level}
description: Leaves a file behind when it runs, then waits to be released.
risk: low
{durability}timeout_ms: 30000
exec:
  command: /bin/sh
  args: ["-c", "echo ran >> {m}/ran-{level}; i=0; while [ ! -e {m}/release ] && [ $i -lt 1000 ]; do sleep 0.02; i=$((i+1)); done; echo '{{}}'"]
input_schema: {{type: object}}
sandbox:
  fs.write: ["{m}"]
"#,
        m = marker.display()
    )
}

/// An agent running the bridge on `files/requests.jsonl` once `files/go` exists: `initialize`,
/// then `calls` (tool name, request id), all sent at once.
struct Setup {
    dir: tempfile::TempDir,
    files: PathBuf,
    marker: PathBuf,
    tools: PathBuf,
}

impl Setup {
    fn new() -> Setup {
        let dir = tempfile::tempdir().unwrap();
        chmod(dir.path(), 0o711);
        let files = dir.path().join("t");
        let marker = dir.path().join("marker");
        for d in [&files, &marker] {
            std::fs::create_dir_all(d).unwrap();
        }
        chmod(&files, 0o755);
        chmod(&marker, 0o777);
        let tools = dir.path().join("tools.d");
        write(
            &tools.join("probe-sync.yaml"),
            &probe_manifest("sync", "", &marker),
            0o644,
        );
        write(
            &tools.join("probe-written.yaml"),
            &probe_manifest("written", "durability: written\n", &marker),
            0o644,
        );
        Setup {
            dir,
            files,
            marker,
            tools,
        }
    }

    fn daemon(&self, bus: &Bus, cg: &TestCgroup) -> Daemon {
        Daemon::start_with(
            bus,
            &cg.path,
            self.dir.path(),
            &["--tools-dir", self.tools.to_str().unwrap()],
        )
    }

    fn start_agent(&self, d: &Daemon, name: &str, calls: &[(&str, u64)]) {
        let mut reqs = vec![
            r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"sh","version":"0"}}}"#.to_string(),
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#.to_string(),
        ];
        for (tool, id) in calls {
            reqs.push(format!(
                r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{tool}","arguments":{{}}}}}}"#
            ));
        }
        write(
            &self.files.join("requests.jsonl"),
            &(reqs.join("\n") + "\n"),
            0o644,
        );
        let bridge = Path::new(common::bridge_bin());
        let bin_dir = bridge.parent().unwrap().display().to_string();
        let contract = format!(
            r#"apiVersion: agentos/v0.2
kind: AgentContract
name: {name}
class: {{ latency: DT }}
exec:
  command: /bin/sh
  args: ["-c", "while [ ! -e {t}/go ]; do sleep 0.05; done; {b} < {t}/requests.jsonl; echo bridge-done"]
capabilities:
  - probe.sync
  - probe.written
  - fs.read: ["{t}", "{bin_dir}"]
  - fs.write: ["{m}"]
  - fs.exec: [/usr, /bin, /lib, "{bin_dir}"]
"#,
            t = self.files.display(),
            b = bridge.display(),
            m = self.marker.display(),
        );
        let cf = self.dir.path().join(format!("{name}.yaml"));
        std::fs::write(&cf, contract).unwrap();
        d.ctl_ok(&["start", cf.to_str().unwrap()]);
        d.wait_state(name, "running", 10);
    }

    fn go(&self) {
        std::fs::write(self.files.join("go"), "").unwrap();
    }

    /// The replies with id ≥ 2 once there are `n` of them (or the bridge ended).
    fn replies(&self, d: &Daemon, agent: &str, n: usize) -> Vec<Value> {
        let log = PathBuf::from(d.status_json(agent)["log_path"].as_str().unwrap());
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let replies: Vec<Value> = text
                .lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .filter(|v| v["id"].as_u64().is_some_and(|i| i >= 2))
                .collect();
            if replies.len() >= n || text.contains("bridge-done") {
                return replies;
            }
            assert!(
                Instant::now() < deadline,
                "the agent did not finish its calls; agent log:\n{text}\ndaemon log:\n{}",
                d.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn runs(&self, level: &str) -> usize {
        std::fs::read_to_string(self.marker.join(format!("ran-{level}")))
            .unwrap_or_default()
            .lines()
            .count()
    }
}

/// The gate's allow record of the call with request id `id` to `tool`, read from the audit
/// file as it is now (the page cache: what a crash of the daemon leaves).
fn allow_record_in_file(state: &Path, tool: &str, id: u64) -> bool {
    let text = std::fs::read_to_string(state.join("audit/audit.log")).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .any(|r| {
            let s = r.to_string();
            s.contains("\"allow\"")
                && s.contains(&format!("\"tool\":\"{tool}\""))
                && s.contains(&format!("\"request_id\":{id}"))
        })
}

/// While each tool runs (it has left its marker and waits), its allow record is already in the
/// audit file: the `written` tool's as much as the `sync` tool's. Both calls then succeed.
#[test]
fn the_allow_record_is_in_the_file_before_the_tool_runs_at_both_levels() {
    skip_unless_capable!();
    let bus = Bus::start();
    let cg = TestCgroup::new("durability-order");
    let s = Setup::new();
    let d = s.daemon(&bus, &cg);
    s.start_agent(&d, "dur-order", &[("probe.written", 2), ("probe.sync", 3)]);
    s.go();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut seen = [false, false];
    while !(seen[0] && seen[1]) {
        for (i, (level, id)) in [("written", 2), ("sync", 3)].into_iter().enumerate() {
            if !seen[i] && s.runs(level) > 0 {
                // The tool has run (its effect is visible) and is still waiting for release.
                assert!(
                    allow_record_in_file(&d.state_dir, &format!("probe.{level}"), id),
                    "probe.{level} ran before its allow record was in the audit file"
                );
                seen[i] = true;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the tools did not run; daemon log:\n{}",
            d.log_text()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    std::fs::write(s.marker.join("release"), "").unwrap();
    let replies = s.replies(&d, "dur-order", 2);
    assert_eq!(replies.len(), 2, "{replies:#?}");
    assert!(
        replies.iter().all(|r| r["result"].is_object()),
        "{replies:#?}"
    );
    let _ = d.ctl(&["stop", "dur-order"]);
    // Still one chain, signed: `agentctl audit verify` accepts it.
    let o = common::audit(&d.state_dir, &["verify"]);
    assert_eq!(o.status.code(), Some(0), "{}", common::output_text(&o));
}

/// Fail closed at both levels: with the audit file system full, calls to the `written` tool are
/// refused with -32005 like calls to the `sync` tool, and no tool runs without its record.
#[test]
fn a_written_tool_is_refused_when_the_audit_trail_cannot_write() {
    skip_unless_capable!();
    let bus = Bus::start();
    let cg = TestCgroup::new("durability-full");
    let s = Setup::new();
    let audit = s.dir.path().join("audit");
    let _mounted = common::Tmpfs::mount(&audit, "agentos-test-audit", "1m", "0700").unwrap();
    std::fs::write(s.marker.join("release"), "").unwrap();
    let d = s.daemon(&bus, &cg);
    // Fewer than the per-agent limit of calls in flight.
    let calls: Vec<(&str, u64)> = (2..14)
        .map(|id| match id % 2 {
            0 => ("probe.written", id),
            _ => ("probe.sync", id),
        })
        .collect();
    s.start_agent(&d, "dur-full", &calls);
    {
        use std::io::Write as _;
        let mut f = std::fs::File::create(audit.join("filler")).unwrap();
        let block = vec![0u8; 64 * 1024];
        while f.write_all(&block).is_ok() {}
        let _ = f.sync_all();
    }
    s.go();
    let replies = s.replies(&d, "dur-full", calls.len());
    assert_eq!(replies.len(), calls.len(), "every call is answered");
    let level = |r: &Value| match r["id"].as_u64().unwrap() % 2 {
        0 => "written",
        _ => "sync",
    };
    for want in ["written", "sync"] {
        let mine: Vec<&Value> = replies.iter().filter(|r| level(r) == want).collect();
        let ok = mine.iter().filter(|r| r["result"].is_object()).count();
        let refused = mine
            .iter()
            .filter(|r| {
                r["error"]["code"] == -32005
                    && r["error"]["message"]
                        .as_str()
                        .is_some_and(|m| m.contains("audit trail"))
            })
            .count();
        assert_eq!(ok + refused, mine.len(), "{mine:#?}");
        assert!(refused > 0, "no {want} call was refused: {mine:#?}");
        assert_eq!(
            s.runs(want),
            ok,
            "probe.{want} ran {} times for {ok} recorded calls: a call ran without its record",
            s.runs(want)
        );
    }
    let _ = d.ctl(&["stop", "dur-full"]);
}
