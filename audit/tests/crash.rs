//! `kill -9` in the middle of a write storm loses no acknowledged record.
//!
//! The test re-executes its own binary as the child (`AUDIT_STORM_DIR` set): several threads
//! append as fast as they can and print `ACK <seq> <hash>` after each `wait()`. The parent reads
//! the acknowledgements, kills the child with SIGKILL mid-storm, reopens the log and checks that
//! every acknowledged record is there with its hash and the chain verifies.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{HashMap, VecDeque};
use std::io::{BufRead as _, BufReader, Write as _};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use audit::{Log, Reader, verify};
use common::*;

const ENV: &str = "AUDIT_STORM_DIR";

/// The child: never returns when `AUDIT_STORM_DIR` is set.
#[test]
fn storm_child() {
    let Ok(dir) = std::env::var(ENV) else { return };
    let mut o = opts();
    o.checkpoint_records = 1000;
    let log = Log::open(dir.as_ref(), o).unwrap();
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let log = &log;
            s.spawn(move || {
                let mut out = std::io::BufWriter::new(std::io::stdout());
                let mut window = VecDeque::new();
                for i in 0.. {
                    window.push_back(log.append(gate("storm", t << 32 | i)).unwrap());
                    if window.len() >= 64 {
                        let ack = window.pop_front().unwrap().wait().unwrap();
                        writeln!(out, "ACK {} {}", ack.seq, hex::encode(ack.hash)).unwrap();
                        if i % 64 == 0 {
                            out.flush().unwrap();
                        }
                    }
                }
            });
        }
    });
    unreachable!();
}

fn storm_once(dir: &std::path::Path, kill_after_acks: usize) -> HashMap<u64, String> {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "storm_child", "--nocapture", "--test-threads=1"])
        .env(ENV, dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let mut acks = HashMap::new();
    let start = Instant::now();
    let mut killed = false;
    for line in stdout.lines() {
        let line = line.unwrap();
        let Some(rest) = line.strip_prefix("ACK ") else {
            continue;
        };
        let (seq, hash) = rest.split_once(' ').unwrap();
        acks.insert(seq.parse::<u64>().unwrap(), hash.to_string());
        if !killed && (acks.len() >= kill_after_acks || start.elapsed() > Duration::from_secs(20)) {
            child.kill().unwrap(); // SIGKILL
            killed = true;
        }
    }
    // EOF: the child is dead; every ACK it printed has been read.
    let status = child.wait().unwrap();
    assert!(killed, "the child ended by itself: {status}");
    acks
}

#[test]
fn kill_9_mid_storm_loses_no_acknowledged_record() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(audit::LOG_FILE);
    let mut all = HashMap::new();
    for round in 0..3 {
        let acks = storm_once(dir.path(), 5_000 + round * 7_919);
        assert!(!acks.is_empty());
        // Reopen as the restarted daemon would: cuts a torn tail if there is one.
        let log = Log::open(dir.path(), opts()).unwrap();
        if let Some(r) = log.recovery() {
            eprintln!(
                "round {round}: recovery cut {} bytes at {}",
                r.bytes, r.offset
            );
        }
        log.close().unwrap();
        let report = verify(&path, &key().verifying_key()).unwrap();
        let stored: HashMap<u64, String> = Reader::open(&path, Default::default())
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (e.record.seq, e.record.hash)
            })
            .collect();
        all.extend(acks);
        let mut lost = 0;
        for (seq, hash) in &all {
            match stored.get(seq) {
                Some(h) if h == hash => {}
                other => {
                    lost += 1;
                    eprintln!("acknowledged seq {seq} ({hash}) missing or different: {other:?}");
                }
            }
        }
        assert_eq!(lost, 0, "round {round}: {lost} acknowledged records lost");
        eprintln!(
            "round {round}: {} acknowledged so far, {} records in the log, all present",
            all.len(),
            report.records
        );
    }
}
