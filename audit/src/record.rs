//! The record schema and its on-disk form: one JSON object per line.
//!
//! A stored line is
//!
//! ```text
//! {"seq":7,"time_us":1795000000000000,"prev":"<64 hex>","kind":"gate","agent":"doc-rag","tenant":"acme",
//!  "binding":"<hex>","decision":"allow","detail":{...},"hash":"<64 hex>"}\n
//! ```
//!
//! with the fields always in this order. The record's **canonical bytes** are the line without
//! its trailing `,"hash":"<64 hex>"}` and newline, closed by `}` again, i.e. exactly the JSON of
//! the record without its `hash` field. `hash` is the lowercase hex SHA-256 of those bytes, and
//! `prev` is the `hash` of the record before it (64 zeros for the first record). Hashing the
//! stored bytes, not a re-serialisation, makes the check independent of any JSON library.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// `prev` of the first record of a log.
pub const GENESIS_PREV: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// Largest accepted record line, hash included.
pub const MAX_RECORD_BYTES: usize = 64 * 1024;

/// Suffix every stored line ends with: `,"hash":"` + 64 hex + `"}`.
const HASH_PREFIX: &[u8] = b",\"hash\":\"";
const HASH_SUFFIX_LEN: usize = HASH_PREFIX.len() + 64 + 2;

/// What a record is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// An agent (or the daemon, or the log itself) changed state: started, exited, restarted…
    Lifecycle,
    /// The gate decided about a tool call, model call or message.
    Gate,
    /// The kernel refused something (seccomp, Landlock, BPF, cgroup).
    Denial,
    /// An operator answered (or did not answer in time) a consent request.
    Consent,
    /// A model call through the gateway ended: model, backend, placement, tokens, timing.
    Model,
    /// A signed checkpoint over the chain so far (written by the log itself).
    Checkpoint,
    /// A torn tail was cut after a crash (written by the log itself).
    Recovery,
}

impl Kind {
    /// The name used in the file.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Lifecycle => "lifecycle",
            Kind::Gate => "gate",
            Kind::Denial => "denial",
            Kind::Consent => "consent",
            Kind::Model => "model",
            Kind::Checkpoint => "checkpoint",
            Kind::Recovery => "recovery",
        }
    }
}

/// The outcome a record states, when it states one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Decision {
    /// Allowed.
    Allow,
    /// Denied (by the gate or the kernel).
    Deny,
    /// Held for operator consent.
    Held,
    /// Consent given.
    Approved,
    /// Consent refused.
    Rejected,
    /// Consent not answered in time.
    Expired,
}

impl Decision {
    /// The name used in the file.
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Allow => "allow",
            Decision::Deny => "deny",
            Decision::Held => "held",
            Decision::Approved => "approved",
            Decision::Rejected => "rejected",
            Decision::Expired => "expired",
        }
    }
}

/// A record as a caller submits it. The log adds `seq`, `time_us`, `prev` and `hash`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Record {
    /// What the record is about.
    pub kind: Kind,
    /// Agent name (empty for records about the daemon or the log).
    pub agent: String,
    /// Tenant name (empty when none).
    pub tenant: String,
    /// Hex hash of the agent's sealed contract binding, when the record concerns a bound agent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub binding: Option<String>,
    /// Outcome, when the record states one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decision: Option<Decision>,
    /// Free-form details: a JSON object (syscall, errno, path, tool, args hash, exit status…).
    pub detail: serde_json::Value,
    /// Who the log's CPU for this record is charged to (not stored; see [`crate::Cost`]).
    #[serde(skip)]
    pub cost: Option<crate::CostTag>,
}

impl Record {
    /// A record with an empty `detail` object and no binding or decision.
    pub fn new(kind: Kind, agent: impl Into<String>, tenant: impl Into<String>) -> Self {
        Record {
            kind,
            agent: agent.into(),
            tenant: tenant.into(),
            binding: None,
            decision: None,
            detail: serde_json::Value::Object(serde_json::Map::new()),
            cost: None,
        }
    }

    /// Sets the contract binding hash.
    pub fn binding(mut self, binding: impl Into<String>) -> Self {
        self.binding = Some(binding.into());
        self
    }

    /// Sets the decision.
    pub fn decision(mut self, decision: Decision) -> Self {
        self.decision = Some(decision);
        self
    }

    /// Charges the log's CPU for this record to `tag` ([`crate::Cost`]).
    pub fn cost(mut self, tag: crate::CostTag) -> Self {
        self.cost = Some(tag);
        self
    }

    /// Sets the detail object.
    pub fn detail(mut self, detail: serde_json::Value) -> Self {
        self.detail = detail;
        self
    }

    /// The record's body as JSON (`{"kind":…,"detail":{…}}`), as the writer splices it into a line.
    pub(crate) fn encode_body(&self) -> Result<Vec<u8>, serde_json::Error> {
        serde_json::to_vec(self)
    }
}

/// A record as stored: what [`crate::Reader`] and [`crate::verify()`] return.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoredRecord {
    /// Position in the log, from 1, contiguous.
    pub seq: u64,
    /// Wall-clock time the writer took the record, µs since the Unix epoch (never decreasing
    /// within a log).
    pub time_us: u64,
    /// Hash of the previous record.
    pub prev: String,
    /// What the record is about.
    pub kind: Kind,
    /// Agent name.
    pub agent: String,
    /// Tenant name.
    pub tenant: String,
    /// Contract binding hash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binding: Option<String>,
    /// Outcome.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<Decision>,
    /// Details.
    pub detail: serde_json::Value,
    /// Hash of this record's canonical bytes.
    pub hash: String,
}

/// Builds the stored line for a body produced by [`Record::encode_body`]. Returns the line
/// (ending in `\n`) and the record's hash.
pub(crate) fn build_line(
    out: &mut Vec<u8>,
    seq: u64,
    time_us: u64,
    prev: &[u8; 32],
    body: &[u8],
) -> [u8; 32] {
    use std::io::Write as _;
    let start = out.len();
    // Writing into a Vec cannot fail.
    let _ = write!(out, "{{\"seq\":{seq},\"time_us\":{time_us},\"prev\":\"");
    push_hex(out, prev);
    out.extend_from_slice(b"\",");
    // body is `{...}`: splice its inside.
    out.extend_from_slice(&body[1..]);
    let hash: [u8; 32] = Sha256::digest(&out[start..]).into();
    out.pop(); // the closing '}'
    out.extend_from_slice(HASH_PREFIX);
    push_hex(out, &hash);
    out.extend_from_slice(b"\"}\n");
    hash
}

/// Appends the lowercase hex of `bytes`.
pub(crate) fn push_hex(out: &mut Vec<u8>, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for b in bytes {
        out.push(HEX[usize::from(b >> 4)]);
        out.push(HEX[usize::from(b & 15)]);
    }
}

/// Why one stored line is not a valid record on its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LineFault {
    /// The line does not end in `,"hash":"<64 hex>"}`.
    NoHash,
    /// The stored hash is not the hash of the canonical bytes.
    HashMismatch { stored: String, computed: String },
    /// The hash matches but the JSON is not a record.
    Malformed(String),
}

impl std::fmt::Display for LineFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LineFault::NoHash => write!(f, "line does not end in a \"hash\" field"),
            LineFault::HashMismatch { stored, computed } => write!(
                f,
                "content does not match its hash (stored {stored}, computed {computed}): the record was edited"
            ),
            LineFault::Malformed(e) => write!(f, "not a valid record: {e}"),
        }
    }
}

/// Checks one line (without its `\n`) and parses it.
pub(crate) fn parse_line(line: &[u8]) -> Result<(StoredRecord, [u8; 32]), LineFault> {
    if line.len() < HASH_SUFFIX_LEN + 2 || !line.ends_with(b"\"}") {
        return Err(LineFault::NoHash);
    }
    let cut = line.len() - HASH_SUFFIX_LEN;
    if &line[cut..cut + HASH_PREFIX.len()] != HASH_PREFIX {
        return Err(LineFault::NoHash);
    }
    let stored_hex = &line[cut + HASH_PREFIX.len()..line.len() - 2];
    let mut stored = [0u8; 32];
    if hex::decode_to_slice(stored_hex, &mut stored).is_err()
        || stored_hex.iter().any(u8::is_ascii_uppercase)
    {
        return Err(LineFault::NoHash);
    }
    let mut hasher = Sha256::new();
    hasher.update(&line[..cut]);
    hasher.update(b"}");
    let computed: [u8; 32] = hasher.finalize().into();
    if computed != stored {
        return Err(LineFault::HashMismatch {
            stored: hex::encode(stored),
            computed: hex::encode(computed),
        });
    }
    let rec: StoredRecord =
        serde_json::from_slice(line).map_err(|e| LineFault::Malformed(e.to_string()))?;
    if !rec.detail.is_object() {
        return Err(LineFault::Malformed("\"detail\" is not an object".into()));
    }
    Ok((rec, stored))
}

/// Parses only the `seq` of a line, without checking anything (used to classify faults).
pub(crate) fn peek_seq(line: &[u8]) -> Option<u64> {
    let rest = line.strip_prefix(b"{\"seq\":")?;
    let end = rest.iter().position(|b| !b.is_ascii_digit())?;
    std::str::from_utf8(&rest[..end]).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_round_trip() {
        let rec = Record::new(Kind::Gate, "a", "t")
            .decision(Decision::Allow)
            .detail(serde_json::json!({"tool": "fetch", "n": 1}));
        let body = rec.encode_body().unwrap();
        let mut out = Vec::new();
        let hash = build_line(&mut out, 1, 42, &[0; 32], &body);
        assert_eq!(out.last(), Some(&b'\n'));
        let line = &out[..out.len() - 1];
        let (stored, h) = parse_line(line).unwrap();
        assert_eq!(h, hash);
        assert_eq!(stored.seq, 1);
        assert_eq!(stored.prev, GENESIS_PREV);
        assert_eq!(stored.decision, Some(Decision::Allow));
        assert_eq!(stored.hash, hex::encode(hash));
        assert_eq!(peek_seq(line), Some(1));
        // canonical bytes: the line without its hash field
        let text = std::str::from_utf8(line).unwrap();
        let canon = format!("{}}}", &text[..text.rfind(",\"hash\"").unwrap()]);
        assert!(!canon.contains("hash"));
        assert_eq!(hex::encode(Sha256::digest(canon.as_bytes())), stored.hash);
    }

    #[test]
    fn edit_is_detected() {
        let body = Record::new(Kind::Gate, "a", "t").encode_body().unwrap();
        let mut out = Vec::new();
        build_line(&mut out, 1, 42, &[0; 32], &body);
        let s = String::from_utf8(out).unwrap().replace("\"a\"", "\"b\"");
        let err = parse_line(s.trim_end().as_bytes()).unwrap_err();
        assert!(matches!(err, LineFault::HashMismatch { .. }), "{err:?}");
    }
}
