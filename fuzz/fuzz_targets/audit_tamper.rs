//! `cargo xtask fuzz --target audit_tamper`: a valid log written by the audit crate's own writer
//! (`audit::Log`, checkpoints every 4 records, a head file), changed by arbitrary edits (bytes
//! flipped, set, inserted, deleted; lines swapped, duplicated, dropped; the file cut), then
//! verified with and without its head file and read back.
//!
//! The property, cheap because each record's hash covers its exact bytes and the next record's
//! `prev` covers that hash: whatever the verifier accepts is a prefix of the original records,
//! byte for byte, followed at most by a partial line it reports as an incomplete tail; with the
//! head file, that prefix reaches at least the head's checkpoint (only the unsigned tail after
//! the last checkpoint may go unnoticed, as docs/audit.md says). The reader never returns a
//! record whose line is not one of the original lines (an edited record is never shown as
//! genuine). With `forge`, the edited log is re-chained (hashes and links recomputed); then
//! only the records up to the head file's checkpoint are protected, and must be unchanged when
//! the verifier accepts.
#![no_main]

mod common;

use std::collections::HashSet;
use std::sync::OnceLock;

use audit::checkpoint::Head;
use audit::{Decision, Filter, Kind, Log, LogOptions, Reader, Record};
use libfuzzer_sys::{arbitrary, fuzz_target};
use serde_json::json;
use sha2::{Digest as _, Sha256};

struct Original {
    bytes: Vec<u8>,
    /// Byte offset after each line: `ends[n]` is the length of the first `n` records.
    ends: Vec<usize>,
    lines: HashSet<Vec<u8>>,
    head: Head,
}

fn original() -> &'static Original {
    static O: OnceLock<Original> = OnceLock::new();
    O.get_or_init(|| {
        let dir = common::scratch().join("original");
        let _ = std::fs::remove_dir_all(&dir);
        let mut opts = LogOptions::new(common::key().clone());
        opts.checkpoint_records = 4;
        opts.durability = audit::Durability::NoSync;
        let log = Log::open(&dir, opts).expect("open a new log");
        for i in 0..10u32 {
            let d = if i % 3 == 0 {
                Decision::Allow
            } else {
                Decision::Deny
            };
            let rec = Record::new(Kind::Gate, format!("agent-{i}"), "acme")
                .decision(d)
                .detail(json!({"tool": "fs.read", "n": i, "text": "é\u{1f600}\"\\\n"}));
            log.append_wait(rec).expect("append");
        }
        log.close().expect("close");
        let bytes = std::fs::read(dir.join(audit::LOG_FILE)).expect("read the log");
        let head = Head::read(&dir.join(audit::HEAD_FILE))
            .expect("read the head")
            .expect("the writer left a head file");
        let mut ends = vec![0];
        let mut lines = HashSet::new();
        let mut start = 0;
        for (i, &b) in bytes.iter().enumerate() {
            if b == b'\n' {
                ends.push(i + 1);
                lines.insert(bytes[start..i].to_vec());
                start = i + 1;
            }
        }
        assert_eq!(start, bytes.len(), "the writer's log ends with a newline");
        Original {
            bytes,
            ends,
            lines,
            head,
        }
    })
}

#[derive(Debug, arbitrary::Arbitrary)]
enum Edit {
    Flip { at: u16, xor: u8 },
    Set { at: u16, byte: u8 },
    Insert { at: u16, bytes: Vec<u8> },
    Delete { at: u16, len: u8 },
    SwapLines { a: u8, b: u8 },
    DupLine { a: u8 },
    DropLine { a: u8 },
    Cut { at: u16 },
}

#[derive(Debug, arbitrary::Arbitrary)]
struct Input {
    edits: Vec<Edit>,
    with_head: bool,
    /// After the edits, recompute every line's hash and `prev` link as a forger with write
    /// access to the log would (SHA-256 has no key): only the signed checkpoints and the head
    /// file stand in the way, and the verifier's deeper checks (record fields, checkpoint
    /// details) are reached.
    forge: bool,
}

const HASH_PREFIX: &[u8] = b",\"hash\":\"";
const PREV_PREFIX: &[u8] = b",\"prev\":\"";

/// Re-chain the log: each line that ends like a record gets `prev` = the previous such line's
/// hash and its own hash recomputed, the way `audit/src/record.rs` builds lines.
fn forge(b: &mut [u8]) {
    let mut prev = [0u8; 32];
    let mut start = 0;
    while let Some(len) = b[start..].iter().position(|&c| c == b'\n') {
        let line = &mut b[start..start + len];
        start += len + 1;
        let suffix = HASH_PREFIX.len() + 64 + 2;
        if line.len() < suffix + 2 || !line.ends_with(b"\"}") {
            continue;
        }
        let cut = line.len() - suffix;
        if &line[cut..cut + HASH_PREFIX.len()] != HASH_PREFIX {
            continue;
        }
        if let Some(p) = line[..cut]
            .windows(PREV_PREFIX.len())
            .position(|w| w == PREV_PREFIX)
            .map(|p| p + PREV_PREFIX.len())
            .filter(|p| p + 64 <= cut)
        {
            line[p..p + 64].copy_from_slice(hex::encode(prev).as_bytes());
        }
        let mut h = Sha256::new();
        h.update(&line[..cut]);
        h.update(b"}");
        let hash: [u8; 32] = h.finalize().into();
        let at = cut + HASH_PREFIX.len();
        line[at..at + 64].copy_from_slice(hex::encode(hash).as_bytes());
        prev = hash;
    }
}

fn line_span(b: &[u8], n: u8) -> Option<(usize, usize)> {
    let mut start = 0;
    let mut idx = 0;
    for (i, &c) in b.iter().enumerate() {
        if c == b'\n' {
            if idx == usize::from(n) % 10 {
                return Some((start, i + 1));
            }
            idx += 1;
            start = i + 1;
        }
    }
    None
}

fn apply(b: &mut Vec<u8>, e: &Edit) {
    let at = |p: u16, len: usize| usize::from(p) % (len + 1);
    match *e {
        Edit::Flip { at: p, xor } if !b.is_empty() => {
            let i = usize::from(p) % b.len();
            b[i] ^= xor.max(1);
        }
        Edit::Set { at: p, byte } if !b.is_empty() => {
            let i = usize::from(p) % b.len();
            b[i] = byte;
        }
        Edit::Insert { at: p, ref bytes } => {
            let i = at(p, b.len());
            b.splice(i..i, bytes.iter().copied());
        }
        Edit::Delete { at: p, len } => {
            let i = at(p, b.len());
            let j = (i + usize::from(len).max(1)).min(b.len());
            b.drain(i..j);
        }
        Edit::SwapLines { a, b: c } => {
            if let (Some(x), Some(y)) = (line_span(b, a), line_span(b, c))
                && x.1 <= y.0
            {
                let (lx, ly) = (b[x.0..x.1].to_vec(), b[y.0..y.1].to_vec());
                b.splice(y.0..y.1, lx);
                b.splice(x.0..x.1, ly);
            }
        }
        Edit::DupLine { a } => {
            if let Some((s, e)) = line_span(b, a) {
                let l = b[s..e].to_vec();
                b.splice(e..e, l);
            }
        }
        Edit::DropLine { a } => {
            if let Some((s, e)) = line_span(b, a) {
                b.drain(s..e);
            }
        }
        Edit::Cut { at: p } => {
            let i = at(p, b.len());
            b.truncate(i);
        }
        _ => {}
    }
}

fuzz_target!(|inp: Input| {
    let o = original();
    let mut b = o.bytes.clone();
    for e in inp.edits.iter().take(16) {
        apply(&mut b, e);
    }
    if inp.forge {
        forge(&mut b);
    }
    let path = common::scratch().join("tampered.log");
    std::fs::write(&path, &b).expect("write the log");
    let head = inp.with_head.then_some(&o.head);
    let vk = common::key().verifying_key();
    match audit::verify_with_head(&path, &vk, head) {
        Ok(report) if inp.forge => {
            // Only what the head's signed checkpoint covers is protected from a forger.
            if let Some(h) = head {
                let end = h.end as usize;
                assert!(
                    b.len() >= end && b[..end] == o.bytes[..end],
                    "accepted a forged log whose records up to the head checkpoint changed"
                );
            }
            let _ = report;
        }
        Ok(report) => {
            let n = report.records as usize;
            assert!(
                n < o.ends.len(),
                "verified {n} records of {}",
                o.ends.len() - 1
            );
            let prefix = o.ends[n];
            assert!(
                b.len() >= prefix && b[..prefix] == o.bytes[..prefix],
                "accepted {n} records that are not the original's first {n}"
            );
            let rest = &b[prefix..];
            assert!(
                !rest.contains(&b'\n'),
                "accepted {n} records and ignored whole lines after them"
            );
            assert_eq!(
                report.incomplete_tail.is_some(),
                !rest.is_empty(),
                "a partial last line not reported"
            );
            if let Some(h) = head {
                assert!(
                    report.records >= h.seq,
                    "accepted a log cut before its head"
                );
            }
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
    if inp.forge {
        // A forged line carries a valid hash: the reader checks no more than that.
        return;
    }
    for entry in Reader::open(&path, Filter::default())
        .expect("open")
        .flatten()
    {
        assert!(
            o.lines.contains(entry.line.as_bytes()),
            "the reader returned an edited line as a record: {}",
            entry.line
        );
    }
});
