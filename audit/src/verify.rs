//! `audit verify`: check a whole log against its chain, its checkpoints and its head file.

use std::fs::File;
use std::io::{BufReader, Seek as _, SeekFrom};
use std::path::{Path, PathBuf};

use ed25519_dalek::VerifyingKey;

use crate::checkpoint::{Head, HeadError};
use crate::scan::{self, Chain, Problem};

/// What a successful verification found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyReport {
    /// Records in the log.
    pub records: u64,
    /// Seq of the last record (0 for an empty log).
    pub last_seq: u64,
    /// Hash of the last record (hex; 64 zeros for an empty log).
    pub last_hash: String,
    /// Checkpoints in the log, all with valid signatures.
    pub checkpoints: u64,
    /// Seq of the last checkpoint.
    pub last_checkpoint_seq: Option<u64>,
    /// Records after the last checkpoint. Cutting these from the end is not detectable from the
    /// host alone (see docs/audit.md).
    pub unsigned_tail: u64,
    /// Seq of the checkpoint named by the head file, when there is one.
    pub head_seq: Option<u64>,
    /// A partial last line (offset, length): a write in progress or a crash the log has not
    /// recovered from yet (the next `Log::open` cuts it). Not counted as tampering.
    pub incomplete_tail: Option<(u64, u64)>,
}

/// Why a log does not verify.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// The log could not be read.
    #[error("audit log {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The head file could not be read.
    #[error(transparent)]
    Head(#[from] HeadError),
    /// The first bad record.
    #[error("audit log {path}: record seq {seq} at byte {offset}: {problem}")]
    BadRecord {
        /// The file.
        path: PathBuf,
        /// The seq expected at this position.
        seq: u64,
        /// Byte offset of the line.
        offset: u64,
        /// What is wrong.
        problem: Problem,
    },
    /// The log ends before the checkpoint recorded in the head file.
    #[error(
        "audit log {path}: truncated: it ends at seq {last_seq} (byte {len}) but the head file records checkpoint seq {head_seq} at byte {head_offset}; record seq {first_missing} onwards was cut"
    )]
    Truncated {
        /// The file.
        path: PathBuf,
        /// Last seq in the log.
        last_seq: u64,
        /// Size of the log.
        len: u64,
        /// Seq of the checkpoint the head file records.
        head_seq: u64,
        /// Where it was.
        head_offset: u64,
        /// First record missing.
        first_missing: u64,
    },
    /// The log holds a different record where the head file's checkpoint was.
    #[error(
        "audit log {path}: record seq {seq} at byte {offset} is not the checkpoint the head file records (hash {found}, head file says {expected}): the log was rewritten"
    )]
    Rewritten {
        /// The file.
        path: PathBuf,
        /// The seq.
        seq: u64,
        /// Its offset.
        offset: u64,
        /// Hash in the log.
        found: String,
        /// Hash in the head file.
        expected: String,
    },
    /// The head file's own checkpoint signature is bad.
    #[error("audit head file {path}: {why}")]
    BadHead {
        /// The head file.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
}

impl VerifyError {
    /// The seq of the first bad or missing record, when the error names one.
    pub fn seq(&self) -> Option<u64> {
        match self {
            VerifyError::BadRecord { seq, .. } | VerifyError::Rewritten { seq, .. } => Some(*seq),
            VerifyError::Truncated { first_missing, .. } => Some(*first_missing),
            _ => None,
        }
    }
}

/// The head file that belongs to a log: `audit.head` beside it.
pub fn head_path(log: &Path) -> PathBuf {
    log.with_file_name(crate::HEAD_FILE)
}

/// Verifies the log at `path` with the host's public key, using the head file beside it when it
/// exists. Returns the first bad record.
pub fn verify(path: &Path, key: &VerifyingKey) -> Result<VerifyReport, VerifyError> {
    let head = Head::read(&head_path(path))?;
    verify_with_head(path, key, head.as_ref())
}

/// Like [`verify`] with an explicit head (for example a copy kept off the host), or none.
pub fn verify_with_head(
    path: &Path,
    key: &VerifyingKey,
    head: Option<&Head>,
) -> Result<VerifyReport, VerifyError> {
    let io = |source| VerifyError::Io {
        path: path.to_path_buf(),
        source,
    };
    if let Some(h) = head {
        h.checkpoint
            .check_signature(key)
            .map_err(|why| VerifyError::BadHead {
                path: head_path(path),
                why,
            })?;
    }
    let file = File::open(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    let mut chain = Chain::genesis();
    let mut head_found: Option<(u64, String)> = None;
    let head_seq = head.map(|h| h.seq);
    let fault = scan::scan(
        BufReader::with_capacity(1 << 20, &file),
        &mut chain,
        Some(key),
        |rec, offset| {
            if Some(rec.seq) == head_seq {
                head_found = Some((offset, rec.hash.clone()));
            }
        },
    )
    .map_err(io)?;
    // A record edited at or before the head checkpoint is reported as that record, first.
    let mut incomplete_tail = None;
    if let Some(f) = fault {
        if let Problem::Incomplete { len } = f.problem {
            incomplete_tail = Some((f.offset, len));
        } else {
            let problem = match f.problem {
                p @ Problem::Missing { .. } => {
                    let mut rest = File::open(path).map_err(io)?;
                    rest.seek(SeekFrom::Start(f.offset)).map_err(io)?;
                    let mut rest = BufReader::new(rest);
                    let mut skip = Vec::new();
                    std::io::BufRead::read_until(&mut rest, b'\n', &mut skip).map_err(io)?;
                    scan::classify_seq(p, rest)
                }
                p => p,
            };
            return Err(VerifyError::BadRecord {
                path: path.to_path_buf(),
                seq: f.seq,
                offset: f.offset,
                problem,
            });
        }
    }
    if let Some(h) = head {
        match head_found {
            None => {
                return Err(VerifyError::Truncated {
                    path: path.to_path_buf(),
                    last_seq: chain.next_seq - 1,
                    len,
                    head_seq: h.seq,
                    head_offset: h.offset,
                    first_missing: chain.next_seq,
                });
            }
            Some((offset, hash)) if hash != h.hash || offset != h.offset => {
                return Err(VerifyError::Rewritten {
                    path: path.to_path_buf(),
                    seq: h.seq,
                    offset,
                    found: hash,
                    expected: h.hash.clone(),
                });
            }
            Some(_) => {}
        }
    }
    Ok(VerifyReport {
        records: chain.records,
        last_seq: chain.next_seq - 1,
        last_hash: hex::encode(chain.prev),
        checkpoints: chain.checkpoints,
        last_checkpoint_seq: chain.last_checkpoint_seq,
        unsigned_tail: chain.since_checkpoint,
        head_seq,
        incomplete_tail,
    })
}
