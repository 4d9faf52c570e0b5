//! Helpers for the end-to-end tests that run as root inside the guest VM
//! (`cargo xtask vm test`, see docs/vm-tests.md).
//!
//! Every test in `tests/` is marked `#[ignore = "needs the guest VM: run `cargo xtask vm test`"]`,
//! so `cargo test` on the host lists it as ignored with that reason instead of passing it; the
//! guest runs the binaries with `--include-ignored`. Each test starts with [`require_vm`], which
//! fails (never skips) when the test is forced to run outside the guest.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Set by the guest's test runner.
pub const VM_ENV: &str = "AGENTOS_VM_TEST";

/// Fails the test unless it runs inside the guest VM, where every mechanism is present.
pub fn require_vm() {
    if std::env::var(VM_ENV).as_deref() != Ok("1") {
        panic!(
            "this test needs the guest VM (systemd, cgroup v2 controllers, BPF LSM, sched_ext): \
             run `cargo xtask vm test`"
        );
    }
}

/// Where the harness lives in the guest (helper programs in `bin/`).
pub fn harness_dir() -> PathBuf {
    std::env::var_os("AGENTOS_VM_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/local/lib/agentos-vmtest"))
}

/// A helper program built from `vm-tests/src/bin/`.
pub fn helper(name: &str) -> String {
    harness_dir().join("bin").join(name).display().to_string()
}

/// Where `cargo xtask vm test` puts the repository's `examples/` in the guest.
pub fn examples_dir() -> PathBuf {
    PathBuf::from("/usr/local/share/agentos/examples")
}

/// The MCP handshake an agent's bridge sends before its calls.
pub const MCP_HANDSHAKE: [&str; 2] = [
    r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"sh","version":"0"}}}"#,
    r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
];

/// A `tools/call` request of tool `name` with no arguments.
pub fn tool_call(id: u64, name: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{name}","arguments":{{}}}}}}"#
    )
}

/// An agent's shell script that pipes [`MCP_HANDSHAKE`] and `requests` into the installed
/// `agentos-mcp` bridge (replies go to the agent's log), then prints `bridge-exit=STATUS`;
/// `before` and `after` are shell run around it (`after` starts with `; ` when given).
pub fn bridge_script(before: &str, requests: &[String], after: &str) -> String {
    let lines = MCP_HANDSHAKE
        .iter()
        .map(|r| r.to_string())
        .chain(requests.iter().cloned())
        .map(|r| format!("'{r}'"))
        .collect::<Vec<_>>()
        .join(" ");
    format!("{before}printf '%s\\n' {lines} | agentos-mcp; echo bridge-exit=$?{after}")
}

/// The result of a command, kept for assertions and messages.
pub struct Out {
    pub what: String,
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }

    /// Panics with the command, its status and its output unless it succeeded.
    #[track_caller]
    pub fn ok(self) -> Out {
        assert!(self.success(), "{} failed:\n{self}", self.what);
        self
    }
}

impl std::fmt::Display for Out {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "$ {}\nexit: {:?}\nstdout:\n{}\nstderr:\n{}",
            self.what, self.code, self.stdout, self.stderr
        )
    }
}

/// Runs a program with arguments and collects its output.
pub fn cmd(prog: &str, args: &[&str]) -> Out {
    let what = std::iter::once(prog)
        .chain(args.iter().copied())
        .collect::<Vec<_>>()
        .join(" ");
    match Command::new(prog).args(args).output() {
        Ok(Output {
            status,
            stdout,
            stderr,
        }) => Out {
            what,
            code: status.code(),
            stdout: String::from_utf8_lossy(&stdout).into_owned(),
            stderr: String::from_utf8_lossy(&stderr).into_owned(),
        },
        Err(e) => Out {
            what,
            code: None,
            stdout: String::new(),
            stderr: format!("cannot run {prog}: {e}"),
        },
    }
}

pub fn agentctl(args: &[&str]) -> Out {
    cmd("agentctl", args)
}

pub fn systemctl(args: &[&str]) -> Out {
    cmd("systemctl", args)
}

/// Polls `f` every 200 ms until it returns `Some`, or panics after `timeout` naming `what`.
#[track_caller]
pub fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        if start.elapsed() > timeout {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Writes a contract file for a test and returns its path.
pub fn write_contract(name: &str, yaml: &str) -> PathBuf {
    let dir = Path::new("/run/agentos-vmtest/contracts");
    std::fs::create_dir_all(dir).expect("creating the contracts directory");
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(&path, yaml).expect("writing a contract");
    path
}

/// An agent started by a test; stopped (then killed) when dropped so tests leave nothing behind.
pub struct Agent {
    pub name: String,
}

impl Agent {
    /// `agentctl start FILE`, which must succeed.
    #[track_caller]
    pub fn start(name: &str, contract: &Path) -> Agent {
        agentctl(&["start", &contract.display().to_string()]).ok();
        Agent {
            name: name.to_string(),
        }
    }

    /// `agentctl status NAME --json`, parsed.
    #[track_caller]
    pub fn status(&self) -> Value {
        status_json(&self.name)
    }

    /// The agent's state as the daemon reports it (lowercase).
    pub fn state(&self) -> String {
        state_of(&self.status())
    }

    /// Waits until the daemon reports `want` (e.g. "running", "failed").
    #[track_caller]
    pub fn wait_state(&self, want: &str, timeout: Duration) -> Value {
        self.wait_states(&[want], timeout)
    }

    /// Waits until the daemon reports one of `want`; returns the status.
    #[track_caller]
    pub fn wait_states(&self, want: &[&str], timeout: Duration) -> Value {
        let mut last = Value::Null;
        let start = Instant::now();
        loop {
            let out = agentctl(&["status", &self.name, "--json"]);
            if out.success()
                && let Ok(v) = serde_json::from_str::<Value>(&out.stdout)
            {
                if want.contains(&state_of(&v).as_str()) {
                    return v;
                }
                last = v;
            }
            if start.elapsed() > timeout {
                panic!(
                    "agent {} did not reach state {want:?} within {timeout:?}; last status: {last}",
                    self.name
                );
            }
            // Every poll is an agentctl process and a status the daemon computes: in the
            // emulated guest that is CPU the agent under test (an idle-class one above all)
            // does not get, so a long wait polls less often.
            let every = if start.elapsed() < Duration::from_secs(10) {
                300
            } else {
                1500
            };
            std::thread::sleep(Duration::from_millis(every));
        }
    }

    /// The agent's cgroup directory under /sys/fs/cgroup.
    #[track_caller]
    pub fn cgroup(&self) -> PathBuf {
        agent_cgroup(&self.name, &self.status())
    }

    /// The agent's main process id.
    #[track_caller]
    pub fn main_pid(&self) -> u32 {
        let v = self.status();
        find_key(&v, &["main_pid", "mainpid", "pid"])
            .and_then(Value::as_u64)
            .and_then(|p| u32::try_from(p).ok())
            .filter(|&p| p > 0)
            .unwrap_or_else(|| panic!("no main pid in the status of {}: {v}", self.name))
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let stop = agentctl(&["stop", &self.name]);
        if !stop.success() {
            let _ = agentctl(&["kill", &self.name]);
        }
    }
}

/// `agentctl status NAME --json`, parsed; panics with the output if that fails.
#[track_caller]
pub fn status_json(name: &str) -> Value {
    let out = agentctl(&["status", name, "--json"]).ok();
    serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("agentctl status {name} --json is not JSON ({e}):\n{out}"))
}

/// The state field of a status object, lowercased.
pub fn state_of(v: &Value) -> String {
    find_key(v, &["state", "active_state"])
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_ascii_lowercase()
}

/// The first value whose key matches one of `keys` (case-insensitive, `_` ignored), searched
/// depth-first: the status JSON is the daemon's, these tests only rely on its field names.
pub fn find_key<'a>(v: &'a Value, keys: &[&str]) -> Option<&'a Value> {
    let norm = |s: &str| s.replace('_', "").to_ascii_lowercase();
    let wanted: Vec<String> = keys.iter().map(|k| norm(k)).collect();
    match v {
        Value::Object(map) => {
            for w in &wanted {
                for (k, val) in map {
                    if &norm(k) == w {
                        return Some(val);
                    }
                }
            }
            map.values().find_map(|val| find_key(val, keys))
        }
        Value::Array(items) => items.iter().find_map(|val| find_key(val, keys)),
        _ => None,
    }
}

/// The cgroup of agent `name`: from its status (`control_group`), else found by name below the
/// daemon's delegated `agents/` subtree.
#[track_caller]
pub fn agent_cgroup(name: &str, status: &Value) -> PathBuf {
    if let Some(cg) = find_key(status, &["control_group", "cgroup"]).and_then(Value::as_str) {
        let p = if cg.starts_with("/sys/fs/cgroup") {
            PathBuf::from(cg)
        } else {
            Path::new("/sys/fs/cgroup").join(cg.trim_start_matches('/'))
        };
        if p.is_dir() {
            return p;
        }
    }
    let found = find_dir(Path::new("/sys/fs/cgroup"), name, 8);
    found.unwrap_or_else(|| panic!("no cgroup found for agent {name}; status: {status}"))
}

fn find_dir(dir: &Path, name: &str, depth: u32) -> Option<PathBuf> {
    if depth == 0 {
        return None;
    }
    let entries = std::fs::read_dir(dir).ok()?;
    let mut subdirs = Vec::new();
    for e in entries.flatten() {
        if !e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let p = e.path();
        if e.file_name() == name && p.parent().is_some_and(under_agents) {
            return Some(p);
        }
        subdirs.push(p);
    }
    subdirs
        .into_iter()
        .find_map(|p| find_dir(&p, name, depth - 1))
}

fn under_agents(p: &Path) -> bool {
    p.ancestors()
        .any(|a| a.file_name().is_some_and(|n| n == "agents"))
}

/// Reads a cgroup file, trimmed.
#[track_caller]
pub fn read_cg(cgroup: &Path, file: &str) -> String {
    let p = cgroup.join(file);
    std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
        .trim()
        .to_string()
}

/// A `key value` entry of a flat-keyed cgroup file (`memory.events`, `pids.events`, `cpu.stat`).
#[track_caller]
pub fn cg_key(cgroup: &Path, file: &str, key: &str) -> u64 {
    let text = read_cg(cgroup, file);
    text.lines()
        .filter_map(|l| l.split_once(' '))
        .find(|(k, _)| *k == key)
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {}/{file}:\n{text}", cgroup.display()))
}

/// A runnable contract in the documented format (docs/contracts.md): `compute` is the inside of
/// the `compute:` flow mapping, e.g. `cpu: "0.5", mem: "64MiB", pids: 32`.
pub fn contract_yaml(name: &str, command: &str, args: &[&str], compute: &str) -> String {
    let args = args
        .iter()
        .map(|a| serde_json::to_string(a).unwrap_or_default())
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "apiVersion: agentos/v0.2\n\
         kind: AgentContract\n\
         name: {name}\n\
         class: {{ latency: DT }}\n\
         exec: {{ command: {command}, args: [{args}] }}\n\
         restart: {{ policy: \"no\" }}\n\
         compute: {{ {compute} }}\n"
    )
}

/// The results an attempt script printed to the agent's `log`: lines `NAME ok` or
/// `NAME err …`, read once the script printed `done` (at most 60 s).
#[track_caller]
pub fn attempt_results(log: &str) -> Vec<(String, String)> {
    wait_for(
        "the agent to finish its attempts",
        Duration::from_secs(60),
        || {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            text.lines().any(|l| l == "done").then(|| {
                text.lines()
                    .filter_map(|l| {
                        let (n, r) = l.split_once(' ')?;
                        (r == "ok" || r.starts_with("err ")).then(|| (n.to_string(), r.to_string()))
                    })
                    .collect()
            })
        },
    )
}

/// The result of attempt `name` in [`attempt_results`]' list.
#[track_caller]
pub fn result_of(r: &[(String, String)], name: &str) -> String {
    r.iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.clone())
        .unwrap_or_else(|| panic!("no result for {name}: {r:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn find_key_is_case_and_underscore_insensitive() {
        let v: Value =
            serde_json::json!({"agent": {"Name": "a", "MainPID": 42, "State": "Running"}});
        assert_eq!(find_key(&v, &["main_pid"]), Some(&Value::from(42)));
        assert_eq!(state_of(&v), "running");
    }

    #[test]
    fn bridge_script_pipes_the_handshake_then_the_requests() {
        let s = bridge_script("sleep 1 & ", &[tool_call(2, "a.b")], "; exec sleep 600");
        assert!(
            s.starts_with(
                "sleep 1 & printf '%s\\n' '{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\""
            ),
            "{s}"
        );
        assert!(s.ends_with(
            r#"'{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"a.b","arguments":{}}}' | agentos-mcp; echo bridge-exit=$?; exec sleep 600"#
        ), "{s}");
        assert_eq!(
            s.matches("' '").count(),
            3,
            "the format and three requests: {s}"
        );
    }
}
