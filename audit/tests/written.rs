//! `Log::try_append_written`: acknowledged once the record's batch is in the file, before (and
//! without waiting for) its `fdatasync`; failures fail closed.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashMap;
use std::io::Write as _;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use audit::{Durability, Log, Reader, verify};
use common::*;

/// The callback runs after the bytes are in the file and before the batch is synced: while it
/// blocks, the file holds the record and the log has counted no sync of its batch.
#[test]
fn written_is_acknowledged_after_the_write_before_the_sync() {
    for durability in [Durability::GroupCommit, Durability::PerRecord] {
        let dir = tempfile::tempdir().unwrap();
        let mut o = opts();
        o.durability = durability;
        // A lazy record waiting in front must not hold the written one back either.
        o.lazy_delay = Duration::from_secs(3600);
        let log = Log::open(dir.path(), o).unwrap();
        let path = dir.path().join(audit::LOG_FILE);
        log.append_wait(gate("a", 0)).unwrap();
        let synced = || log.stats().records.load(Ordering::SeqCst);
        let before = synced();
        // (Per record, a lazy record is synced on its own: no lazy one there.)
        let lazy = durability == Durability::GroupCommit;
        let (lazy_tx, lazy_rx) = mpsc::channel();
        if lazy {
            log.try_append_lazy(gate("a", 1), move |r| lazy_tx.send(r).unwrap())
                .unwrap();
        }
        let (seen_tx, seen_rx) = mpsc::channel();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let file = path.clone();
        let t0 = Instant::now();
        log.try_append_written(gate("a", 2), move |r| {
            // In the callback: the record is already in the file.
            let text = std::fs::read_to_string(&file).unwrap();
            seen_tx.send((r, text)).unwrap();
            let _ = go_rx.recv_timeout(Duration::from_secs(10));
        })
        .unwrap();
        let (r, text) = seen_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        let ack = r.unwrap();
        assert!(t0.elapsed() < Duration::from_secs(5), "not left lazy");
        assert!(
            text.lines().any(|l| l.contains(&hex::encode(ack.hash))),
            "seq {} is not in the file when acknowledged",
            ack.seq
        );
        // The batch is not synced (acknowledged as durable) while the callback runs.
        assert_eq!(synced(), before, "{durability:?}");
        assert!(
            lazy_rx.try_recv().is_err(),
            "the lazy record's sync came first"
        );
        go_tx.send(()).unwrap();
        // Then the group commit syncs it at once, without anyone waiting: the lazy record that
        // rode along is acknowledged (durable) well within its hour-long delay.
        let n = if lazy {
            let l = lazy_rx
                .recv_timeout(Duration::from_secs(10))
                .unwrap()
                .unwrap();
            assert_eq!(l.seq + 1, ack.seq);
            2
        } else {
            1
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while synced() < before + n && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(synced() >= before + n, "the written batch was never synced");
        log.close().unwrap();
        verify(&path, &key().verifying_key()).unwrap();
    }
}

/// Sync and written records share batches and keep one chain.
#[test]
fn written_and_durable_records_interleave_in_one_chain() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), opts()).unwrap();
    let (tx, rx) = mpsc::channel();
    let mut seqs = Vec::new();
    for i in 0..200 {
        let tx = tx.clone();
        if i % 2 == 0 {
            log.try_append_written(gate("w", i), move |r| tx.send(r).unwrap())
                .unwrap();
        } else {
            log.append_then(gate("s", i), move |r| tx.send(r).unwrap())
                .unwrap();
        }
    }
    for _ in 0..200 {
        seqs.push(
            rx.recv_timeout(Duration::from_secs(10))
                .unwrap()
                .unwrap()
                .seq,
        );
    }
    seqs.sort();
    seqs.dedup();
    assert_eq!(seqs.len(), 200);
    log.close().unwrap();
    verify(&dir.path().join(audit::LOG_FILE), &key().verifying_key()).unwrap();
}

/// An invalid record is refused at once, its callback never called.
#[test]
fn an_invalid_written_record_is_refused_without_its_callback() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), opts()).unwrap();
    let invalid = audit::Record::new(audit::Kind::Gate, "a", "t").detail(serde_json::json!(1));
    assert!(matches!(
        log.try_append_written(invalid, |_| panic!("called for a refused record")),
        Err(audit::AppendError::Invalid(_))
    ));
    log.close().unwrap();
}

const ENV: &str = "AUDIT_WRITTEN_FULL_DIR";

/// The child of `a_failed_write_fails_written_records_closed`: appends written records with a
/// file-size limit until the log refuses.
#[test]
#[ignore = "child process of a_failed_write_fails_written_records_closed"]
fn written_full_child() {
    let Ok(dir) = std::env::var(ENV) else {
        return;
    };
    let log = Log::open(dir.as_ref(), opts()).unwrap();
    let mut out = std::io::stdout();
    for i in 0..100_000 {
        let (tx, rx) = mpsc::channel();
        let queued = log.append_written_then(gate("full", i), move |r| tx.send(r).unwrap());
        let res = queued.and_then(|()| rx.recv().unwrap());
        match res {
            Ok(ack) => writeln!(out, "ACK {} {}", ack.seq, hex::encode(ack.hash)).unwrap(),
            Err(e) => {
                writeln!(out, "ERR {e}").unwrap();
                break;
            }
        }
    }
    let (tx, rx) = mpsc::channel();
    match log
        .try_append_written(gate("full", 0), move |r| tx.send(r).unwrap())
        .and_then(|()| rx.recv().unwrap())
    {
        Ok(ack) => writeln!(out, "AFTER acknowledged {ack:?}").unwrap(),
        Err(e) => writeln!(out, "AFTER {e}").unwrap(),
    }
    writeln!(out, "CLOSE {:?}", log.close()).unwrap();
}

/// A write that fails (EFBIG past RLIMIT_FSIZE) answers the written record with the error, and
/// every later one; each record acknowledged as written is in the log after reopening.
#[test]
fn a_failed_write_fails_written_records_closed() {
    let dir = tempfile::tempdir().unwrap();
    let path = honest_log(dir.path(), 3);
    let limit = std::fs::metadata(&path).unwrap().len() + 20_000;
    let (stdout, acks) = run_with_fsize_limit("written_full_child", ENV, dir.path(), limit);
    assert!(acks.len() > 10, "{stdout}");
    let err = stdout.lines().find(|l| l.starts_with("ERR ")).unwrap();
    assert!(
        err.contains("File too large") && err.contains("no further records"),
        "{err}"
    );
    let after = stdout.lines().find(|l| l.starts_with("AFTER ")).unwrap();
    assert!(after.contains("no further records"), "{after}");
    let log = Log::open(dir.path(), opts()).unwrap();
    log.close().unwrap();
    verify(&path, &key().verifying_key()).unwrap();
    let stored: HashMap<u64, String> = Reader::open(&path, Default::default())
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (e.record.seq, e.record.hash)
        })
        .collect();
    for (seq, hash) in &acks {
        assert_eq!(stored.get(seq), Some(hash), "acknowledged seq {seq}");
    }
}
