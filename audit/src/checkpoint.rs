//! Signed checkpoints and the head file.
//!
//! A checkpoint is a record of kind `checkpoint` at seq `n` whose `detail` is
//! `{"covers_seq": n-1, "head": <hash of record n-1>, "time_us": <the record's time_us>,
//! "key": <public key hex>, "sig": <ed25519 signature hex>}`. The signature covers
//! `"agentos-audit-checkpoint-v1\0" ‖ covers_seq (u64 BE) ‖ head (32 bytes) ‖ time_us (u64 BE)`.
//!
//! After the batch holding a checkpoint is durable, the writer replaces `audit.head` (atomically:
//! temporary file, fsync, rename, fsync of the directory) with the checkpoint's fields plus the
//! checkpoint record's own seq, hash and byte offset. `verify` and `Log::open` compare the log
//! with it: a log that ends before that checkpoint, or holds a different record there, was
//! truncated or rewritten.

use std::fs::{self, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};

use ed25519_dalek::{Signature, Signer as _, SigningKey, Verifier as _, VerifyingKey};
use serde::{Deserialize, Serialize};

const DOMAIN: &[u8] = b"agentos-audit-checkpoint-v1\0";

/// The `detail` of a checkpoint record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointDetail {
    /// Last record covered (the one before the checkpoint).
    pub covers_seq: u64,
    /// Its hash (hex): the chain head at the checkpoint.
    pub head: String,
    /// Time of the checkpoint, µs since the epoch (equal to the record's `time_us`).
    pub time_us: u64,
    /// Public key that signed it (hex).
    pub key: String,
    /// ed25519 signature (hex) over the domain string, `covers_seq`, `head` and `time_us`.
    pub sig: String,
}

fn message(covers_seq: u64, head: &[u8; 32], time_us: u64) -> Vec<u8> {
    let mut m = Vec::with_capacity(DOMAIN.len() + 48);
    m.extend_from_slice(DOMAIN);
    m.extend_from_slice(&covers_seq.to_be_bytes());
    m.extend_from_slice(head);
    m.extend_from_slice(&time_us.to_be_bytes());
    m
}

impl CheckpointDetail {
    /// Signs a checkpoint over `head` (the hash of record `covers_seq`).
    pub fn sign(key: &SigningKey, covers_seq: u64, head: &[u8; 32], time_us: u64) -> Self {
        let sig = key.sign(&message(covers_seq, head, time_us));
        CheckpointDetail {
            covers_seq,
            head: hex::encode(head),
            time_us,
            key: hex::encode(key.verifying_key().as_bytes()),
            sig: hex::encode(sig.to_bytes()),
        }
    }

    /// Checks the signature with `key`. The error says what is wrong.
    pub fn check_signature(&self, key: &VerifyingKey) -> Result<(), String> {
        if self.key != hex::encode(key.as_bytes()) {
            return Err(format!(
                "signed by key {}, not by the host key {}",
                self.key,
                hex::encode(key.as_bytes())
            ));
        }
        let mut head = [0u8; 32];
        hex::decode_to_slice(&self.head, &mut head)
            .map_err(|e| format!("\"head\" is not 64 hex characters: {e}"))?;
        let mut sig = [0u8; 64];
        hex::decode_to_slice(&self.sig, &mut sig)
            .map_err(|e| format!("\"sig\" is not 128 hex characters: {e}"))?;
        key.verify(
            &message(self.covers_seq, &head, self.time_us),
            &Signature::from_bytes(&sig),
        )
        .map_err(|_| "bad signature: the checkpoint was forged or altered".to_string())
    }
}

/// The content of `audit.head`: the last durable checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Head {
    /// Seq of the checkpoint record.
    pub seq: u64,
    /// Hash of the checkpoint record (hex).
    pub hash: String,
    /// Byte offset of the checkpoint record's line in the log.
    pub offset: u64,
    /// Byte offset just after it.
    pub end: u64,
    /// The signed checkpoint.
    pub checkpoint: CheckpointDetail,
}

/// Errors about the head file.
#[derive(Debug, thiserror::Error)]
pub enum HeadError {
    /// It could not be read or written.
    #[error("audit head file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// It is not a head file.
    #[error("audit head file {path}: {reason}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

impl Head {
    /// Reads the head file; `Ok(None)` when it does not exist.
    pub fn read(path: &Path) -> Result<Option<Head>, HeadError> {
        match fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| HeadError::Invalid {
                    path: path.to_path_buf(),
                    reason: e.to_string(),
                }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(HeadError::Io {
                path: path.to_path_buf(),
                source,
            }),
        }
    }

    /// Replaces the head file atomically and durably.
    pub fn write(&self, path: &Path) -> Result<(), HeadError> {
        let io = |p: &Path| {
            let p = p.to_path_buf();
            move |source| HeadError::Io { path: p, source }
        };
        let mut tmp = path.as_os_str().to_os_string();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .map_err(io(&tmp))?;
        let mut bytes = serde_json::to_vec(self).map_err(|e| HeadError::Invalid {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        bytes.push(b'\n');
        f.write_all(&bytes).map_err(io(&tmp))?;
        f.sync_data().map_err(io(&tmp))?;
        fs::rename(&tmp, path).map_err(io(path))?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(io(dir))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sign_and_check() {
        let key = SigningKey::from_bytes(&[7; 32]);
        let c = CheckpointDetail::sign(&key, 9, &[1; 32], 1234);
        c.check_signature(&key.verifying_key()).unwrap();
        let mut bad = c.clone();
        bad.covers_seq = 8;
        assert!(bad.check_signature(&key.verifying_key()).is_err());
        let other = SigningKey::from_bytes(&[8; 32]);
        assert!(c.check_signature(&other.verifying_key()).is_err());
    }
}
