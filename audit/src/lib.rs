//! The agentos audit trail: append-only, hash-chained, group-committed records with signed
//! checkpoints. See `docs/audit.md` for the format and the guarantees.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use audit::{Decision, Kind, Log, LogOptions, Record};
//! let key = audit::key::load_or_create("/var/lib/agentos/audit.key".as_ref())?;
//! let log = Log::open("/var/lib/agentos/audit".as_ref(), LogOptions::new(key))?;
//! let ack = log
//!     .append(Record::new(Kind::Gate, "doc-rag", "acme").decision(Decision::Allow))?
//!     .wait()?; // durable now
//! println!("seq {}", ack.seq);
//! # Ok(()) }
//! ```

pub mod checkpoint;
pub mod cli;
mod cost;
mod journal;
pub mod key;
mod log;
mod reader;
mod record;
mod scan;
mod verify;

pub use cost::{Cost, CostTag};
pub use journal::JOURNAL_SOCKET;
pub use log::{
    Ack, AppendError, Durability, HEAD_FILE, LOG_FILE, Log, LogOptions, OpenError, Receipt,
    Recovery, Stats,
};
pub use reader::{Entry, Filter, ReadError, Reader};
pub use record::{Decision, GENESIS_PREV, Kind, MAX_RECORD_BYTES, Record, StoredRecord};
pub use scan::Problem;
pub use verify::{VerifyError, VerifyReport, head_path, verify, verify_with_head};
