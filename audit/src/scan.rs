//! Walking a log and checking its chain: shared by `verify`, `Log::open` and the reader.

use std::io::{self, BufRead};

use ed25519_dalek::VerifyingKey;

use crate::checkpoint::CheckpointDetail;
use crate::record::{self, Kind, LineFault, StoredRecord};

/// What is wrong with the first bad record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// The content does not match the record's hash: the record was edited.
    Edited {
        /// Hash stored in the record.
        stored: String,
        /// Hash of its content.
        computed: String,
    },
    /// The line is not a record (no hash field, invalid JSON, wrong fields).
    Unparseable(String),
    /// The last line has no newline: a write was cut short (crash) or the file was cut mid-line.
    Incomplete {
        /// Bytes in the partial line.
        len: u64,
    },
    /// Seqs jump forward and the expected seq appears nowhere later: records were deleted.
    Missing {
        /// The seq that should be here.
        expected: u64,
        /// The seq found instead.
        found: u64,
    },
    /// A record is out of place: the expected seq appears later in the file, or a seq repeats.
    Reordered {
        /// The seq that should be here.
        expected: u64,
        /// The seq found instead.
        found: u64,
    },
    /// The seq is right but `prev` is not the previous record's hash: the chain was rewritten.
    BrokenLink {
        /// Hash of the previous record.
        expected: String,
        /// `prev` found in the record.
        found: String,
    },
    /// A checkpoint does not hold (bad signature, wrong key, does not match the chain).
    BadCheckpoint(String),
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Problem::Edited { stored, computed } => write!(
                f,
                "content does not match its hash (stored {stored}, computed {computed}): the record was edited"
            ),
            Problem::Unparseable(why) => write!(f, "not a record: {why}"),
            Problem::Incomplete { len } => {
                write!(f, "partial last line of {len} bytes without a newline")
            }
            Problem::Missing { expected, found } => write!(
                f,
                "expected seq {expected}, found seq {found}: {} record(s) missing (deleted)",
                found - expected
            ),
            Problem::Reordered { expected, found } => write!(
                f,
                "expected seq {expected}, found seq {found}: records were reordered or duplicated"
            ),
            Problem::BrokenLink { expected, found } => write!(
                f,
                "prev is {found} but the previous record's hash is {expected}: the chain was rewritten"
            ),
            Problem::BadCheckpoint(why) => write!(f, "bad checkpoint: {why}"),
        }
    }
}

/// The state of the chain after the records scanned so far.
#[derive(Debug, Clone)]
pub(crate) struct Chain {
    /// Seq the next record must have.
    pub next_seq: u64,
    /// Hash the next record's `prev` must be.
    pub prev: [u8; 32],
    /// `time_us` of the last record.
    pub last_time_us: u64,
    /// Byte offset after the last good record.
    pub end: u64,
    /// Good records scanned.
    pub records: u64,
    /// Checkpoints among them.
    pub checkpoints: u64,
    /// Records since the last checkpoint.
    pub since_checkpoint: u64,
    /// Seq of the last (signature-checked) checkpoint.
    pub last_checkpoint_seq: Option<u64>,
}

impl Chain {
    /// The state before the first record of a log.
    pub fn genesis() -> Self {
        Chain {
            next_seq: 1,
            prev: [0; 32],
            last_time_us: 0,
            end: 0,
            records: 0,
            checkpoints: 0,
            since_checkpoint: 0,
            last_checkpoint_seq: None,
        }
    }
}

/// The first bad record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fault {
    pub offset: u64,
    /// The seq expected at this position.
    pub seq: u64,
    pub problem: Problem,
}

/// Scans records from `r` (positioned at `chain.end`) until the end or the first bad record,
/// calling `each` for every good one.
pub(crate) fn scan<R: BufRead>(
    mut r: R,
    chain: &mut Chain,
    key: Option<&VerifyingKey>,
    mut each: impl FnMut(&StoredRecord, u64),
) -> io::Result<Option<Fault>> {
    let mut line = Vec::with_capacity(1024);
    loop {
        line.clear();
        let n = r.read_until(b'\n', &mut line)?;
        if n == 0 {
            return Ok(None);
        }
        let offset = chain.end;
        let fault = |problem| {
            Ok(Some(Fault {
                offset,
                seq: chain.next_seq,
                problem,
            }))
        };
        if line.last() != Some(&b'\n') {
            return fault(Problem::Incomplete { len: n as u64 });
        }
        line.pop();
        let (rec, hash) = match record::parse_line(&line) {
            Ok(x) => x,
            Err(LineFault::HashMismatch { stored, computed }) => {
                return fault(Problem::Edited { stored, computed });
            }
            Err(e) => return fault(Problem::Unparseable(e.to_string())),
        };
        if rec.seq != chain.next_seq {
            // Classified by the caller, which can look ahead (see `classify_seq`).
            return fault(Problem::Missing {
                expected: chain.next_seq,
                found: rec.seq,
            });
        }
        let mut prev = [0u8; 32];
        if hex::decode_to_slice(&rec.prev, &mut prev).is_err()
            || prev != chain.prev
            || rec.prev.bytes().any(|b| b.is_ascii_uppercase())
        {
            return fault(Problem::BrokenLink {
                expected: hex::encode(chain.prev),
                found: rec.prev,
            });
        }
        if rec.kind == Kind::Checkpoint {
            if let Err(why) = check_checkpoint(&rec, key) {
                return fault(Problem::BadCheckpoint(why));
            }
            chain.last_checkpoint_seq = Some(rec.seq);
            chain.checkpoints += 1;
            chain.since_checkpoint = 0;
        } else {
            chain.since_checkpoint += 1;
        }
        each(&rec, offset);
        chain.next_seq += 1;
        chain.prev = hash;
        chain.last_time_us = rec.time_us;
        chain.end += n as u64;
        chain.records += 1;
    }
}

fn check_checkpoint(
    rec: &StoredRecord,
    key: Option<&VerifyingKey>,
) -> Result<CheckpointDetail, String> {
    let d: CheckpointDetail = serde_json::from_value(rec.detail.clone())
        .map_err(|e| format!("detail is not a checkpoint: {e}"))?;
    // `covers_seq` comes from the file: u64::MAX must be a mismatch, not an overflow.
    if d.covers_seq.checked_add(1) != Some(rec.seq) {
        return Err(format!(
            "covers seq {} but sits at seq {}",
            d.covers_seq, rec.seq
        ));
    }
    if d.head != rec.prev {
        return Err(format!(
            "signs head {} but the chain head is {}",
            d.head, rec.prev
        ));
    }
    if d.time_us != rec.time_us {
        return Err(format!(
            "signs time {} but the record's time is {}",
            d.time_us, rec.time_us
        ));
    }
    if let Some(key) = key {
        d.check_signature(key)?;
    }
    Ok(d)
}

/// Turns a provisional `Missing` into `Reordered` when the expected seq appears later in `rest`
/// (the file from just after the bad line), or when the found seq went backwards.
pub(crate) fn classify_seq<R: BufRead>(problem: Problem, mut rest: R) -> Problem {
    let Problem::Missing { expected, found } = problem else {
        return problem;
    };
    if found < expected {
        return Problem::Reordered { expected, found };
    }
    let mut line = Vec::new();
    loop {
        line.clear();
        match rest.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return Problem::Missing { expected, found },
            Ok(_) => {
                if record::peek_seq(&line) == Some(expected) {
                    return Problem::Reordered { expected, found };
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A checkpoint claiming to cover seq u64::MAX is refused as a mismatch (it once computed
    /// `covers_seq + 1`: a panic in debug builds, a wrap to 0 in release).
    #[test]
    fn a_checkpoint_covering_u64_max_is_a_mismatch_not_an_overflow() {
        let rec: StoredRecord = serde_json::from_value(serde_json::json!({
            "seq": 0u64,
            "time_us": 1u64,
            "prev": "00",
            "kind": "checkpoint",
            "agent": "",
            "tenant": "",
            "detail": {"covers_seq": u64::MAX, "head": "00", "time_us": 1u64, "key": "", "sig": ""},
            "hash": "00",
        }))
        .expect("a record");
        let e = check_checkpoint(&rec, None).expect_err("refused");
        assert!(e.contains("covers seq 18446744073709551615"), "{e}");
    }
}
