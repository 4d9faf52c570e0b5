//! Audit throughput, side by side in one run:
//!
//! ```text
//! cargo run --release -p audit --example bench -- --records 1000000 --writers 8 --record-bytes 256
//! ```
//!
//! Modes (each on a fresh log in a temporary directory on the same file system):
//! - `group commit, pipelined`: `writers` threads submit records and a waiter thread per writer
//!   waits for each receipt, so up to `window` records per writer are in flight.
//! - `group commit, blocking`: `blocking-writers` threads each `append(..).wait()` one record at a
//!   time, as a gate decision does.
//! - `fdatasync per record`: like pipelined, but the writer syncs after every record.
//! - `no sync`: like pipelined, batched writes without fdatasync (not crash-safe for the machine).
//!
//! Ack latency is measured from just before `append` to the return of `wait`.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::Instant;

use audit::key::SigningKey;
use audit::{Decision, Durability, Kind, Log, LogOptions, Record};

struct Args {
    records: u64,
    writers: usize,
    blocking_writers: usize,
    blocking_records: u64,
    sync_records: u64,
    record_bytes: usize,
    window: usize,
    dir: Option<PathBuf>,
}

fn parse_args() -> Args {
    let mut a = Args {
        records: 1_000_000,
        writers: 8,
        blocking_writers: 64,
        blocking_records: 100_000,
        sync_records: 10_000,
        record_bytes: 256,
        window: 1024,
        dir: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--records" => a.records = val().parse().unwrap(),
            "--writers" => a.writers = val().parse().unwrap(),
            "--blocking-writers" => a.blocking_writers = val().parse().unwrap(),
            "--blocking-records" => a.blocking_records = val().parse().unwrap(),
            "--sync-records" => a.sync_records = val().parse().unwrap(),
            "--record-bytes" => a.record_bytes = val().parse().unwrap(),
            "--window" => a.window = val().parse().unwrap(),
            "--dir" => a.dir = Some(PathBuf::from(val())),
            "-h" | "--help" => {
                println!(
                    "bench [--records N] [--writers W] [--blocking-writers W] [--blocking-records N] [--sync-records N] [--record-bytes B] [--window N] [--dir DIR]"
                );
                std::process::exit(0);
            }
            other => panic!("unknown argument {other}"),
        }
    }
    a
}

fn record(pad: &str, t: usize, i: u64) -> Record {
    Record::new(Kind::Gate, format!("agent-{t}"), "acme")
        .binding("9f2c1e7a4b3d5f60")
        .decision(if i.is_multiple_of(7) {
            Decision::Deny
        } else {
            Decision::Allow
        })
        .detail(serde_json::json!({"tool": "web.fetch", "call": i, "pad": pad}))
}

struct Outcome {
    records: u64,
    secs: f64,
    mean_batch: f64,
    median_batch: Option<(u64, u64)>,
    lat_us: Vec<u32>,
    line_bytes: f64,
}

fn pct(sorted: &[u32], p: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn open(dir: &Path, durability: Durability) -> Log {
    let mut o = LogOptions::new(SigningKey::from_bytes(&[1; 32]));
    o.durability = durability;
    Log::open(dir, o).unwrap()
}

fn finish(log: Log, dir: &Path, t0: Instant, mut lat: Vec<u32>, records: u64) -> Outcome {
    let secs = t0.elapsed().as_secs_f64();
    let st = log.stats();
    let batches = st.batches.load(Ordering::Relaxed);
    let committed = st.records.load(Ordering::Relaxed);
    let median_batch = st.median_batch();
    log.close().unwrap();
    let size = std::fs::metadata(dir.join(audit::LOG_FILE)).unwrap().len();
    lat.sort_unstable();
    Outcome {
        records,
        secs,
        mean_batch: committed as f64 / batches.max(1) as f64,
        median_batch,
        lat_us: lat,
        line_bytes: size as f64 / committed.max(1) as f64,
    }
}

fn pipelined(
    dir: &Path,
    d: Durability,
    records: u64,
    writers: usize,
    window: usize,
    pad: &str,
) -> Outcome {
    let log = open(dir, d);
    let per = records / writers as u64;
    let t0 = Instant::now();
    let lat: Vec<u32> = std::thread::scope(|s| {
        let mut waiters = Vec::new();
        for t in 0..writers {
            let (tx, rx) = mpsc::sync_channel::<(audit::Receipt, Instant)>(window);
            let log = &log;
            s.spawn(move || {
                for i in 0..per {
                    let rec = record(pad, t, i);
                    let at = Instant::now();
                    tx.send((log.append(rec).unwrap(), at)).unwrap();
                }
            });
            waiters.push(s.spawn(move || {
                let mut lat = Vec::with_capacity(per as usize);
                for (r, at) in rx {
                    r.wait().unwrap();
                    lat.push(at.elapsed().as_micros() as u32);
                }
                lat
            }));
        }
        waiters
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    finish(log, dir, t0, lat, per * writers as u64)
}

fn blocking(dir: &Path, records: u64, writers: usize, pad: &str) -> Outcome {
    let log = open(dir, Durability::GroupCommit);
    let per = records / writers as u64;
    let t0 = Instant::now();
    let lat: Vec<u32> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..writers)
            .map(|t| {
                let log = &log;
                s.spawn(move || {
                    let mut lat = Vec::with_capacity(per as usize);
                    for i in 0..per {
                        let rec = record(pad, t, i);
                        let at = Instant::now();
                        log.append(rec).unwrap().wait().unwrap();
                        lat.push(at.elapsed().as_micros() as u32);
                    }
                    lat
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    finish(log, dir, t0, lat, per * writers as u64)
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn main() {
    let a = parse_args();
    // Stored line ≈ body + 190 bytes (seq, time, prev, hash); pad the body to the asked size.
    let base = serde_json::to_vec(&record("", 0, 0)).unwrap().len() + 190;
    let pad = "x".repeat(a.record_bytes.saturating_sub(base));
    let root = match &a.dir {
        Some(d) => {
            std::fs::create_dir_all(d).unwrap();
            tempfile::tempdir_in(d).unwrap()
        }
        None => tempfile::tempdir().unwrap(),
    };
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "audit bench: {} CPUs, load average {} at start, logs under {}",
        cpus,
        loadavg(),
        root.path().display()
    );
    let mut rows = Vec::new();
    let mut run = |name: String, f: &dyn Fn(&Path) -> Outcome| {
        let dir = root.path().join(rows.len().to_string());
        let o = f(&dir);
        rows.push((name, o));
    };
    run(
        format!("group commit, pipelined, {} writers", a.writers),
        &|d| {
            pipelined(
                d,
                Durability::GroupCommit,
                a.records,
                a.writers,
                a.window,
                &pad,
            )
        },
    );
    run(
        format!("group commit, blocking, {} writers", a.blocking_writers),
        &|d| blocking(d, a.blocking_records, a.blocking_writers, &pad),
    );
    run(
        format!("fdatasync per record, {} writers", a.writers),
        &|d| {
            pipelined(
                d,
                Durability::PerRecord,
                a.sync_records,
                a.writers,
                a.window,
                &pad,
            )
        },
    );
    run(format!("no sync, pipelined, {} writers", a.writers), &|d| {
        pipelined(d, Durability::NoSync, a.records, a.writers, a.window, &pad)
    });
    println!(
        "{:<40} {:>9} {:>12} {:>10} {:>13} {:>8} {:>8} {:>8} {:>6}",
        "mode",
        "records",
        "records/s",
        "mean batch",
        "median batch",
        "p50 µs",
        "p99 µs",
        "max µs",
        "B/rec"
    );
    for (name, o) in &rows {
        let med = o
            .median_batch
            .map_or("-".into(), |(l, h)| format!("{l}-{h}"));
        println!(
            "{:<40} {:>9} {:>12.0} {:>10.1} {:>13} {:>8} {:>8} {:>8} {:>6.0}",
            name,
            o.records,
            o.records as f64 / o.secs,
            o.mean_batch,
            med,
            pct(&o.lat_us, 0.5),
            pct(&o.lat_us, 0.99),
            o.lat_us.last().copied().unwrap_or(0),
            o.line_bytes
        );
    }
    // Verification speed on the first (group commit) log.
    let log0 = root.path().join("0").join(audit::LOG_FILE);
    let t0 = Instant::now();
    let r = audit::verify(&log0, &SigningKey::from_bytes(&[1; 32]).verifying_key()).unwrap();
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "verify: {} records in {:.2} s = {:.0} records/s (chain, hashes, {} signatures)",
        r.records,
        secs,
        r.records as f64 / secs,
        r.checkpoints
    );
    println!("load average {} at end", loadavg());
}
