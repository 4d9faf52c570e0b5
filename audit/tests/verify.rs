//! `audit::verify` on an honest log and on each kind of tampering.

#![allow(clippy::unwrap_used)] // helpers outside #[test] fns panic on purpose

mod common;

use audit::checkpoint::Head;
use audit::{Problem, VerifyError, verify, verify_with_head};
use common::*;
use sha2::{Digest, Sha256};

/// Rewrites `line` with a new `prev` and a recomputed hash (what a forger with the file but
/// without the key can do).
fn rehash(line: &str, prev: Option<&str>) -> (String, String) {
    let cut = line.rfind(",\"hash\":\"").unwrap();
    let mut canon = format!("{}}}", &line[..cut]);
    if let Some(p) = prev {
        let at = canon.find("\"prev\":\"").unwrap() + 8;
        canon.replace_range(at..at + 64, p);
    }
    let h = hex::encode(Sha256::digest(canon.as_bytes()));
    let out = format!("{},\"hash\":\"{h}\"}}", &canon[..canon.len() - 1]);
    (out, h)
}

/// Recomputes the chain from line `from` on, after an edit there.
fn rechain(lines: &mut [String], from: usize) {
    let mut prev: Option<String> = if from == 0 {
        Some(audit::GENESIS_PREV.to_string())
    } else {
        let l = &lines[from - 1];
        Some(l[l.len() - 66..l.len() - 2].to_string())
    };
    for l in lines.iter_mut().skip(from) {
        let (nl, h) = rehash(l, prev.as_deref());
        *l = nl;
        prev = Some(h);
    }
}

fn bad_record(e: VerifyError) -> (u64, u64, Problem) {
    match e {
        VerifyError::BadRecord {
            seq,
            offset,
            problem,
            ..
        } => (seq, offset, problem),
        other => panic!("expected a bad record, got: {other}"),
    }
}

#[test]
fn honest_log_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let path = honest_log(dir.path(), 25);
    let r = verify(&path, &key().verifying_key()).unwrap();
    // genesis + 25 records + checkpoints after 10, 20 and at close
    assert_eq!(r.records, 29, "{r:?}");
    assert_eq!(r.last_seq, 29);
    assert_eq!(r.checkpoints, 3);
    assert_eq!(r.last_checkpoint_seq, Some(29));
    assert_eq!(r.head_seq, Some(29));
    assert_eq!(r.unsigned_tail, 0);
    assert_eq!(r.incomplete_tail, None);
}

#[test]
fn edited_record_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let path = honest_log(dir.path(), 25);
    let mut l = lines(&path);
    l[4] = l[4].replace("\"deny\"", "\"allow\"");
    assert!(l[4].contains("\"allow\""));
    write_lines(&path, &l);
    let e = verify(&path, &key().verifying_key()).unwrap_err();
    let msg = e.to_string();
    let (seq, offset, problem) = bad_record(e);
    assert_eq!((seq, offset), (5, offset_of(&l, 4)), "{msg}");
    assert!(matches!(problem, Problem::Edited { .. }), "{msg}");
    assert!(msg.contains("seq 5") && msg.contains("edited"), "{msg}");
}

#[test]
fn deleted_record_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let path = honest_log(dir.path(), 25);
    let mut l = lines(&path);
    l.remove(6);
    write_lines(&path, &l);
    let e = verify(&path, &key().verifying_key()).unwrap_err();
    let msg = e.to_string();
    let (seq, offset, problem) = bad_record(e);
    assert_eq!(seq, 7, "{msg}");
    assert_eq!(offset, offset_of(&l, 6));
    assert_eq!(
        problem,
        Problem::Missing {
            expected: 7,
            found: 8
        },
        "{msg}"
    );
}

#[test]
fn reordered_records_are_found() {
    let dir = tempfile::tempdir().unwrap();
    let path = honest_log(dir.path(), 25);
    let mut l = lines(&path);
    l.swap(13, 14);
    write_lines(&path, &l);
    let e = verify(&path, &key().verifying_key()).unwrap_err();
    let msg = e.to_string();
    let (seq, _, problem) = bad_record(e);
    assert_eq!(seq, 14, "{msg}");
    assert_eq!(
        problem,
        Problem::Reordered {
            expected: 14,
            found: 15
        },
        "{msg}"
    );
}

#[test]
fn truncation_past_a_checkpoint_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let path = honest_log(dir.path(), 25);
    let mut l = lines(&path);
    l.truncate(15); // seq 1..=15: checkpoints 22 and 29 are gone
    write_lines(&path, &l);
    let e = verify(&path, &key().verifying_key()).unwrap_err();
    let msg = e.to_string();
    match e {
        VerifyError::Truncated {
            last_seq,
            head_seq,
            first_missing,
            ..
        } => assert_eq!((last_seq, head_seq, first_missing), (15, 29, 16), "{msg}"),
        other => panic!("expected truncation, got: {other}"),
    }
    assert!(msg.contains("truncated"), "{msg}");
}

#[test]
fn truncation_mid_line_past_a_checkpoint_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let path = honest_log(dir.path(), 25);
    let len = std::fs::metadata(&path).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(len - 10).unwrap();
    let e = verify(&path, &key().verifying_key()).unwrap_err();
    assert!(
        matches!(
            e,
            VerifyError::Truncated {
                first_missing: 29,
                ..
            }
        ),
        "{e}"
    );
}

/// What truncation detection relies on: without the head file (or another copy of the last
/// checkpoint), a log cut right after one of its checkpoints looks complete.
#[test]
fn truncation_without_an_anchor_is_not_detectable() {
    let dir = tempfile::tempdir().unwrap();
    let path = honest_log(dir.path(), 25);
    let mut l = lines(&path);
    l.truncate(22); // ends with checkpoint 22
    write_lines(&path, &l);
    let r = verify_with_head(&path, &key().verifying_key(), None).unwrap();
    assert_eq!(r.last_checkpoint_seq, Some(22));
    assert!(verify(&path, &key().verifying_key()).is_err());
}

#[test]
fn forged_checkpoint_signature_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let path = honest_log(dir.path(), 25);
    let mut l = lines(&path);
    assert!(l[10].contains("\"kind\":\"checkpoint\""), "{}", l[10]);
    // Flip one hex digit of the signature and fix up the hashes so only the signature is wrong.
    let at = l[10].find("\"sig\":\"").unwrap() + 7;
    let c = if &l[10][at..at + 1] == "0" { "1" } else { "0" };
    l[10].replace_range(at..at + 1, c);
    rechain(&mut l, 10);
    write_lines(&path, &l);
    let e = verify(&path, &key().verifying_key()).unwrap_err();
    let msg = e.to_string();
    let (seq, _, problem) = bad_record(e);
    assert_eq!(seq, 11, "{msg}");
    assert!(
        matches!(&problem, Problem::BadCheckpoint(w) if w.contains("bad signature")),
        "{msg}"
    );
}

#[test]
fn checkpoint_signed_by_another_key_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let path = honest_log(dir.path(), 25);
    let other = audit::key::SigningKey::from_bytes(&[9; 32]);
    let e = verify(&path, &other.verifying_key()).unwrap_err();
    // The head file is checked first: it is signed by the host key too.
    assert!(matches!(e, VerifyError::BadHead { .. }), "{e}");
    let e = verify_with_head(&path, &other.verifying_key(), None).unwrap_err();
    let (seq, _, problem) = bad_record(e);
    assert_eq!(seq, 11);
    assert!(matches!(&problem, Problem::BadCheckpoint(w) if w.contains("not by the host key")));
}

/// A forger who deletes a record and recomputes every hash and seq after it still cannot
/// produce the checkpoint signatures.
#[test]
fn rewritten_chain_is_caught_by_the_next_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let path = honest_log(dir.path(), 25);
    let mut l = lines(&path);
    l.remove(4);
    for (i, line) in l.iter_mut().enumerate().skip(4) {
        let old = format!("{{\"seq\":{},", i + 2);
        let new = format!("{{\"seq\":{},", i + 1);
        *line = line.replacen(&old, &new, 1);
    }
    rechain(&mut l, 4);
    write_lines(&path, &l);
    let e = verify(&path, &key().verifying_key()).unwrap_err();
    let msg = e.to_string();
    let (seq, _, problem) = bad_record(e);
    assert_eq!(seq, 10, "{msg}"); // the checkpoint, now at seq 10
    assert!(matches!(problem, Problem::BadCheckpoint(_)), "{msg}");
}

#[test]
fn rewritten_head_checkpoint_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let path = honest_log(dir.path(), 25);
    // Replace the head file by a forged one naming a later checkpoint.
    let hp = audit::head_path(&path);
    let mut h = Head::read(&hp).unwrap().unwrap();
    h.checkpoint.covers_seq += 5;
    h.write(&hp).unwrap();
    let e = verify(&path, &key().verifying_key()).unwrap_err();
    assert!(matches!(e, VerifyError::BadHead { .. }), "{e}");
}

#[test]
fn partial_last_line_is_reported_not_failed() {
    let dir = tempfile::tempdir().unwrap();
    let path = honest_log(dir.path(), 5);
    let len = std::fs::metadata(&path).unwrap().len();
    use std::io::Write as _;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    f.write_all(b"{\"seq\":9,\"time").unwrap();
    let r = verify(&path, &key().verifying_key()).unwrap();
    assert_eq!(r.incomplete_tail, Some((len, 14)));
}

/// A record edited and re-hashed on its own (its hash is valid again) breaks the link of the
/// record after it: the next record's `prev` no longer names it.
#[test]
fn record_rehashed_alone_breaks_the_next_link() {
    let dir = tempfile::tempdir().unwrap();
    let path = honest_log(dir.path(), 25);
    let mut l = lines(&path);
    let edited = l[4].replace("\"deny\"", "\"allow\"");
    assert_ne!(edited, l[4]);
    l[4] = rehash(&edited, None).0;
    write_lines(&path, &l);
    let e = verify(&path, &key().verifying_key()).unwrap_err();
    let msg = e.to_string();
    let (seq, offset, problem) = bad_record(e);
    assert_eq!((seq, offset), (6, offset_of(&l, 5)), "{msg}");
    assert!(matches!(problem, Problem::BrokenLink { .. }), "{msg}");
}

/// `prev` is compared in its canonical form: the same value in upper-case hex, or a value that
/// is not hex at all, is a broken link even when the record's own hash is recomputed.
#[test]
fn non_canonical_or_garbled_prev_is_a_broken_link() {
    for garble in [
        (|p: &str| p.to_ascii_uppercase()) as fn(&str) -> String,
        |p: &str| format!("zz{}", &p[2..]),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = honest_log(dir.path(), 25);
        let mut l = lines(&path);
        let at = l[6].find("\"prev\":\"").unwrap() + 8;
        let prev = l[6][at..at + 64].to_string();
        let new_prev = garble(&prev);
        assert_ne!(new_prev, prev);
        l[6] = rehash(&l[6], Some(&new_prev)).0;
        // Keep the rest of the chain consistent with the new hash of line 6.
        rechain(&mut l, 7);
        write_lines(&path, &l);
        let e = verify_with_head(&path, &key().verifying_key(), None).unwrap_err();
        let msg = e.to_string();
        let (seq, _, problem) = bad_record(e);
        assert_eq!(seq, 7, "{msg}");
        assert!(matches!(problem, Problem::BrokenLink { .. }), "{msg}");
    }
}

/// Truncation after a checkpoint, then forged (unsigned) records appended with a valid chain up
/// to and past the head's sequence number: the record at the head's seq is not the one the
/// signed head names, so the log is reported rewritten.
#[test]
fn truncation_plus_forged_tail_is_caught_by_the_head() {
    let dir = tempfile::tempdir().unwrap();
    let path = honest_log(dir.path(), 25);
    let head = Head::read(&audit::head_path(&path)).unwrap().unwrap();
    let mut l = lines(&path);
    l.truncate(22); // ends with checkpoint 22; the head names checkpoint 29
    let template = l[20].clone(); // a gate record (seq 21)
    for seq in 23..=31 {
        let forged = template.replacen("{\"seq\":21,", &format!("{{\"seq\":{seq},"), 1);
        assert_ne!(forged, template);
        l.push(forged);
    }
    rechain(&mut l, 22);
    write_lines(&path, &l);
    // Without the head the forgery looks like an honest unsigned tail...
    let r = verify_with_head(&path, &key().verifying_key(), None).unwrap();
    assert_eq!(r.last_seq, 31);
    assert_eq!(r.unsigned_tail, 9);
    // ...with it, the record at the head's seq is not the signed one.
    let e = verify(&path, &key().verifying_key()).unwrap_err();
    match e {
        VerifyError::Rewritten { seq, .. } => assert_eq!(seq, head.seq),
        other => panic!("expected a rewritten log, got: {other}"),
    }
}

/// The same forgery as above, but with the forged record at the head's seq padded to the very
/// byte length of the signed checkpoint it replaces, so it starts at the head's offset: the
/// hash alone must give it away.
#[test]
fn forged_record_at_the_heads_offset_is_caught_by_its_hash() {
    let dir = tempfile::tempdir().unwrap();
    let path = honest_log(dir.path(), 25);
    let head = Head::read(&audit::head_path(&path)).unwrap().unwrap();
    let mut l = lines(&path);
    let at = l.len() - 1;
    assert!(l[at].contains("\"kind\":\"checkpoint\""), "{}", l[at]);
    assert_eq!(offset_of(&l, at), head.offset);
    let template = l[20].replacen("{\"seq\":21,", &format!("{{\"seq\":{},", head.seq), 1);
    let pad = l[at].len() - template.len();
    l[at] = template.replacen("web.fetch", &format!("web.fetch{}", "x".repeat(pad)), 1);
    rechain(&mut l, at);
    assert_eq!(offset_of(&l, at), head.offset);
    write_lines(&path, &l);
    match verify(&path, &key().verifying_key()).unwrap_err() {
        VerifyError::Rewritten { seq, offset, .. } => {
            assert_eq!((seq, offset), (head.seq, head.offset))
        }
        other => panic!("expected a rewritten log, got: {other}"),
    }
}

/// A record replayed at the end (its seq went backwards) is reported as reordered, not as
/// records missing.
#[test]
fn replayed_record_is_reordered() {
    let dir = tempfile::tempdir().unwrap();
    let path = honest_log(dir.path(), 25);
    let mut l = lines(&path);
    let replay = l[4].clone();
    l.push(replay);
    write_lines(&path, &l);
    let e = verify(&path, &key().verifying_key()).unwrap_err();
    let msg = e.to_string();
    let (seq, _, problem) = bad_record(e);
    assert_eq!(seq, 30, "{msg}");
    assert_eq!(
        problem,
        Problem::Reordered {
            expected: 30,
            found: 5
        },
        "{msg}"
    );
}
