//! Opening a log after a crash: torn tails are cut and recorded, tampering is refused.

#![allow(clippy::unwrap_used)] // helpers outside #[test] fns panic on purpose

mod common;

use std::io::Write as _;

use audit::{Kind, Log, OpenError, Problem, Reader, verify};
use common::*;

fn append_raw(path: &std::path::Path, bytes: &[u8]) -> u64 {
    let len = std::fs::metadata(path).unwrap().len();
    let mut f = std::fs::OpenOptions::new().append(true).open(path).unwrap();
    f.write_all(bytes).unwrap();
    len
}

fn reopen_and_check_recovery(dir: &std::path::Path, cut_at: u64, cut: &[u8]) {
    let path = dir.join(audit::LOG_FILE);
    let before = verify(&path, &key().verifying_key());
    let log = Log::open(dir, opts()).unwrap();
    let rec = log.recovery().expect("a recovery").clone();
    assert_eq!(rec.offset, cut_at, "{rec:?} (verify before: {before:?})");
    assert_eq!(rec.bytes, cut.len() as u64);
    assert_eq!(std::fs::read(&rec.saved_as).unwrap(), cut);
    // the next record continues the chain after the recovery record
    let ack = log.append(gate("a", 1)).unwrap().wait().unwrap();
    assert_eq!(ack.seq, rec.record_seq + 1);
    log.close().unwrap();
    let report = verify(&path, &key().verifying_key()).unwrap();
    assert_eq!(report.incomplete_tail, None);
    let recs: Vec<_> = Reader::open(&path, Default::default())
        .unwrap()
        .map(Result::unwrap)
        .filter(|e| e.record.kind == Kind::Recovery)
        .collect();
    assert_eq!(recs.len(), 1);
    let d = &recs[0].record.detail;
    assert_eq!(d["offset"], cut_at);
    assert_eq!(d["bytes"], cut.len() as u64);
    assert_eq!(recs[0].record.seq, rec.record_seq);
}

#[test]
fn partial_last_line_is_cut_and_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let path = honest_log(dir.path(), 5);
    let garbage = b"{\"seq\":9,\"time_us\":17";
    let at = append_raw(&path, garbage);
    reopen_and_check_recovery(dir.path(), at, garbage);
}

#[test]
fn garbage_line_at_the_end_is_cut() {
    let dir = tempfile::tempdir().unwrap();
    let path = honest_log(dir.path(), 5);
    let garbage = b"not json at all\n{\"seq\":";
    let at = append_raw(&path, garbage);
    reopen_and_check_recovery(dir.path(), at, garbage);
}

#[test]
fn unwritten_blocks_after_power_loss_are_cut() {
    // A file system may extend the file with blocks that were never written: NULs, possibly
    // followed by whole lines of the same batch.
    let dir = tempfile::tempdir().unwrap();
    let path = honest_log(dir.path(), 5);
    let l = lines(&path);
    let mut tail = vec![0u8; 4096];
    tail.extend_from_slice(l[2].as_bytes());
    tail.push(b'\n');
    let at = append_raw(&path, &tail);
    reopen_and_check_recovery(dir.path(), at, &tail);
}

#[test]
fn records_after_the_last_checkpoint_without_head_file() {
    // No head file: the whole log is scanned; a torn tail is still cut.
    let dir = tempfile::tempdir().unwrap();
    let path = honest_log(dir.path(), 5);
    std::fs::remove_file(audit::head_path(&path)).unwrap();
    let at = append_raw(&path, b"{\"se");
    reopen_and_check_recovery(dir.path(), at, b"{\"se");
}

#[test]
fn edited_record_after_the_last_checkpoint_refuses_to_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = honest_log(dir.path(), 5);
    // Remove the final checkpoint and the head file, so the edit is in the unchecked tail.
    let mut l = lines(&path);
    l.pop();
    l[3] = l[3].replace("web.fetch", "web.fetcH");
    write_lines(&path, &l);
    std::fs::remove_file(audit::head_path(&path)).unwrap();
    let e = Log::open(dir.path(), opts()).unwrap_err();
    let msg = e.to_string();
    match e {
        OpenError::Tampered {
            seq,
            offset,
            problem,
            ..
        } => {
            assert_eq!((seq, offset), (4, offset_of(&l, 3)), "{msg}");
            assert!(matches!(problem, Problem::Edited { .. }), "{msg}");
        }
        other => panic!("expected Tampered, got {other}"),
    }
    assert!(msg.contains("move it aside"), "{msg}");
    // nothing was cut
    assert_eq!(lines(&path), l);
}

#[test]
fn deleted_record_refuses_to_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = honest_log(dir.path(), 5);
    let mut l = lines(&path);
    l.remove(2);
    write_lines(&path, &l);
    std::fs::remove_file(audit::head_path(&path)).unwrap();
    let e = Log::open(dir.path(), opts()).unwrap_err();
    assert!(
        matches!(
            e,
            OpenError::Tampered {
                seq: 3,
                problem: Problem::Missing { .. },
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn truncated_log_refuses_to_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = honest_log(dir.path(), 25);
    let mut l = lines(&path);
    l.truncate(20);
    write_lines(&path, &l);
    let e = Log::open(dir.path(), opts()).unwrap_err();
    assert!(
        matches!(e, OpenError::HeadMismatch { head_seq: 29, .. }),
        "{e}"
    );
}

#[test]
fn a_second_writer_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), opts()).unwrap();
    let e = Log::open(dir.path(), opts()).unwrap_err();
    assert!(matches!(e, OpenError::Locked(_)), "{e}");
    drop(log);
    Log::open(dir.path(), opts()).unwrap();
}

#[test]
fn reopen_continues_the_chain() {
    let dir = tempfile::tempdir().unwrap();
    let path = honest_log(dir.path(), 7);
    let log = Log::open(dir.path(), opts()).unwrap();
    assert!(log.recovery().is_none());
    let first = log.first_seq();
    let ack = log.append(gate("z", 0)).unwrap().wait().unwrap();
    assert_eq!(ack.seq, first);
    log.close().unwrap();
    verify(&path, &key().verifying_key()).unwrap();
}
