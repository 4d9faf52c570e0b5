#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use audit::key::SigningKey;
use audit::{Decision, Kind, Log, LogOptions, Record};

pub fn key() -> SigningKey {
    SigningKey::from_bytes(&[42; 32])
}

pub fn opts() -> LogOptions {
    let mut o = LogOptions::new(key());
    o.checkpoint_records = 10;
    o.checkpoint_interval = Duration::from_secs(3600);
    o
}

pub fn gate(agent: &str, i: u64) -> Record {
    Record::new(Kind::Gate, agent, "acme")
        .binding("b1nd")
        .decision(if i.is_multiple_of(2) {
            Decision::Allow
        } else {
            Decision::Deny
        })
        .detail(serde_json::json!({"tool": "web.fetch", "i": i}))
}

/// A closed log of `n` gate records (plus the genesis record and checkpoints) in `dir`.
pub fn honest_log(dir: &Path, n: u64) -> PathBuf {
    let log = Log::open(dir, opts()).unwrap();
    for i in 0..n {
        log.append(gate(if i % 3 == 0 { "a" } else { "b" }, i))
            .unwrap()
            .wait()
            .unwrap();
    }
    log.close().unwrap();
    dir.join(audit::LOG_FILE)
}

pub fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

pub fn write_lines(path: &Path, lines: &[String]) {
    let mut s = lines.join("\n");
    s.push('\n');
    std::fs::write(path, s).unwrap();
}

/// Byte offset of line `i` (0-based).
pub fn offset_of(lines: &[String], i: usize) -> u64 {
    lines[..i].iter().map(|l| l.len() as u64 + 1).sum()
}

/// Runs the ignored test `child` of this test binary (exactly) with `env` = `dir`, its file size
/// limited to `limit` bytes (`prlimit --fsize`) and SIGXFSZ ignored (inherited through exec), so
/// a write past it returns EFBIG instead of killing; asserts it exited 0 and returns its stdout
/// with the sequence numbers and hashes of its `ACK SEQ HASH` lines.
pub fn run_with_fsize_limit(
    child: &str,
    env: &str,
    dir: &Path,
    limit: u64,
) -> (String, std::collections::HashMap<u64, String>) {
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "trap '' XFSZ; exec prlimit --fsize={limit} -- \"$0\" --ignored --exact {child} --nocapture --test-threads=1"
        ))
        .arg(std::env::current_exe().unwrap())
        .env(env, dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let acks = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("ACK "))
        .map(|l| {
            let (s, h) = l.split_once(' ').unwrap();
            (s.parse().unwrap(), h.to_string())
        })
        .collect();
    (stdout, acks)
}
