//! Faults (issue 15): the daemon killed with SIGKILL at random moments of a start/stop/tool-call
//! storm and started again; a D-Bus client that disconnects in the middle of a slow call; exec
//! tools that hang, crash in the middle of their answer or flood their output, called by a real
//! agent through the daemon. Root only (cgroups, bpffs); each test prints SKIPPED otherwise.
//!
//! What the storm checks, after `AGENTOS_FAULTS_ROUNDS` (default 50) kill/restart rounds:
//! - every agent is in the state the driver last asked for and was answered (`start` → running,
//!   `stop` → not running); where the daemon died before answering, either state is allowed,
//!   but it must be true (running: its recorded main process lives in its `main` cgroup;
//!   otherwise: nothing of it runs);
//! - never two runs of one agent: one process of its program per agent, and no populated
//!   cgroup under the test's root that is not a running agent's;
//! - `agentctl audit verify` passes, and every tool call an agent saw answered has its durable
//!   `gate`/`allow` record (matched by the JSON-RPC id the agent chose, which the record keeps
//!   as `request_id`); every acknowledged start has its `start` record;
//! - every running agent (most of them re-adopted, several times) is still enforced: a write
//!   outside its scopes fails with EACCES, a connect to an ungranted port with EACCES or EPERM,
//!   a connect to its granted port works (its socket broker), and its tool calls work again.

#![allow(clippy::unwrap_used)]

#[path = "../common/mod.rs"]
mod common;
mod storm;
mod tools;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// A small deterministic RNG (splitmix64): the seed is printed, `AGENTOS_FAULTS_SEED` replays.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn env_u64(var: &str) -> Option<u64> {
    std::env::var(var).ok().and_then(|v| v.parse().ok())
}

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn now_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// `base/tools.d` with the shipped `clock.now` manifest in it.
fn tools_dir(base: &Path) -> PathBuf {
    let tools = base.join("tools.d");
    std::fs::create_dir_all(&tools).unwrap();
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/tools/clock-now.yaml"),
        tools.join("clock-now.yaml"),
    )
    .unwrap();
    tools
}

/// Every PID in /proc now.
fn all_pids() -> impl Iterator<Item = u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()))
}

/// The processes whose command line runs our agent script for `name`.
fn agent_processes(script: &Path, name: &str) -> Vec<u32> {
    all_pids()
        .filter(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let args: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
            args.len() > 2
                && args[1] == script.as_os_str().as_encoded_bytes()
                && args[2] == name.as_bytes()
                && common::alive(*pid)
        })
        .collect()
}

/// The processes with `path` open: PID, name, cgroup.
fn holders(path: &Path) -> Vec<(u32, String, String)> {
    let mut found = Vec::new();
    for pid in all_pids() {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        if fds
            .flatten()
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l == path))
        {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            let ppid = status
                .lines()
                .find(|l| l.starts_with("PPid"))
                .unwrap_or("")
                .to_string();
            found.push((
                pid,
                format!("{} {:?} {ppid}", comm.trim(), String::from_utf8_lossy(&cmd)),
                common::proc_cgroup(pid),
            ));
        }
    }
    found
}

/// Every cgroup under `root` (itself included) with processes in it, and their PIDs.
fn populated(root: &Path) -> Vec<(PathBuf, Vec<u32>)> {
    let mut found = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(p) = todo.pop() {
        let procs: Vec<u32> = std::fs::read_to_string(p.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.parse().ok())
            .collect();
        if !procs.is_empty() {
            found.push((p.clone(), procs));
        }
        if let Ok(rd) = std::fs::read_dir(&p) {
            todo.extend(
                rd.flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
    }
    found
}
