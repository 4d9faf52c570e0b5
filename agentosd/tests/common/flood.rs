//! The bed of the flood tests (`ipc_bytes.rs`, `ipc_cpu.rs`): a private bus and cgroup, a
//! directory (mode 0711) holding the agents' Python programs and a tools directory with the
//! quick tool `echo.fast` the polite agent calls; the two contracts (the polite agent granted
//! `echo.fast`, the hostile one no tool: what any agent can do); the JSON `step` lines the
//! programs print.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::{Bus, TestCgroup};

/// A tool that answers at once.
pub const ECHO_FAST: &str = r#"apiVersion: agentos/v0.2
kind: Tool
name: echo.fast
description: Answer at once (the well-behaved agent's call).
risk: low
timeout_ms: 20000
exec:
  command: /bin/sh
  args: ["-c", "cat >/dev/null; echo '{}'"]
input_schema: {type: object}
"#;

pub struct Bed {
    pub bus: Bus,
    pub cg: TestCgroup,
    pub dir: tempfile::TempDir,
    /// `DIR/t`: `hostile.py`, `polite.py`.
    pub files: PathBuf,
    /// `DIR/tools.d`: `echo-fast.yaml`.
    pub tools: PathBuf,
}

impl Bed {
    pub fn new(tag: &str, hostile: &str, polite: &str) -> Bed {
        let bus = Bus::start();
        let cg = TestCgroup::new(tag);
        let dir = tempfile::tempdir().unwrap();
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
        }
        let files = dir.path().join("t");
        write(&files.join("hostile.py"), hostile, 0o644);
        write(&files.join("polite.py"), polite, 0o644);
        let tools = dir.path().join("tools.d");
        write(&tools.join("echo-fast.yaml"), ECHO_FAST, 0o644);
        Bed {
            bus,
            cg,
            dir,
            files,
            tools,
        }
    }

    /// The polite agent's contract and the hostile one's, `hostile_args` after its script.
    pub fn contracts(&self, hostile_args: &[&str]) -> (PathBuf, PathBuf) {
        let t = self.files.display();
        let sandbox = format!("  - fs.read: [\"{t}\"]\n  - fs.exec: [/usr, /bin, /lib]\n");
        let polite = super::contract(
            self.dir.path(),
            "polite",
            &format!("{{ command: /usr/bin/python3, args: [\"{t}/polite.py\"] }}"),
            &format!("capabilities:\n  - echo.fast\n{sandbox}compute: {{ pids: 64 }}\n"),
        );
        let args: String = hostile_args.iter().map(|a| format!(", \"{a}\"")).collect();
        let hostile = super::contract(
            self.dir.path(),
            "hostile",
            &format!("{{ command: /usr/bin/python3, args: [\"{t}/hostile.py\"{args}] }}"),
            &format!("capabilities:\n{sandbox}compute: {{ pids: 64 }}\n"),
        );
        (polite, hostile)
    }

    /// An agent's log.
    pub fn log(&self, agent: &str) -> PathBuf {
        self.dir.path().join(format!("logs/default/{agent}.log"))
    }
}

/// Write `text` to `p` (parents made) with `mode`.
pub fn write(p: &Path, text: &str, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    if let Some(d) = p.parent() {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::write(p, text).unwrap();
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// The lines of `log` that are JSON objects with a `step`.
pub fn steps(log: &Path) -> Vec<Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v.get("step").is_some())
        .collect()
}

/// Wall-clock seconds since the epoch (the programs' `t`).
pub fn now_secs() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}
