//! The writer: one thread owns the file, batches whatever is queued into one `write(2)`, makes it
//! durable with one `fdatasync(2)`, and only then acknowledges every record of the batch (except
//! records appended with [`Log::try_append_written`], acknowledged once written).

use std::fs::{self, File, OpenOptions};
use std::io::{BufReader, Read as _, Seek as _, SeekFrom, Write as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ed25519_dalek::SigningKey;

use crate::checkpoint::{CheckpointDetail, Head, HeadError};
use crate::cost::{CostTag, Costs, thread_cpu_ns};
use crate::journal::{JOURNAL_SOCKET, Journal};
use crate::record::{self, Kind, MAX_RECORD_BYTES, Record};
use crate::scan::{self, Chain, Problem};

mod here;

/// How hard the writer works to make records durable before acknowledging them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// One `fdatasync` per batch of queued records (the default).
    GroupCommit,
    /// One `write` + `fdatasync` per record (for comparison; ~5k records/s here).
    PerRecord,
    /// Batched writes, no `fdatasync`: acknowledged records survive a crash of the daemon but
    /// not of the machine. For benchmarks and tests only.
    NoSync,
}

/// Options for [`Log::open`].
#[derive(Debug, Clone)]
pub struct LogOptions {
    /// The host key that signs checkpoints (see [`crate::key::load_or_create`]).
    pub key: SigningKey,
    /// Durability of acknowledged records.
    pub durability: Durability,
    /// A checkpoint after this many records…
    pub checkpoint_records: u64,
    /// …or this long after the first record not covered by one, whichever comes first.
    pub checkpoint_interval: Duration,
    /// Records that may wait in the queue; `append` blocks when it is full (back-pressure).
    pub queue_capacity: usize,
    /// A batch stops taking records once it holds this many bytes. Also bounds how much a crash
    /// can leave torn at the end, which is what `open` may cut.
    pub max_batch_bytes: usize,
    /// Forward committed records to the journal at this socket (best effort, when it exists).
    pub journal: Option<PathBuf>,
    /// How long records nobody waits for ([`Log::try_append_lazy`]) may sit in the writer
    /// before they are written and synced: they ride along with the next record someone waits
    /// for, so they do not cost a `fdatasync` of their own in front of it.
    pub lazy_delay: Duration,
}

impl LogOptions {
    /// Defaults: group commit, a checkpoint every 4096 records or 5 s, a queue of 65 536
    /// records, batches up to 4 MiB, no journal forwarding, lazy records within 10 ms.
    pub fn new(key: SigningKey) -> Self {
        LogOptions {
            key,
            durability: Durability::GroupCommit,
            checkpoint_records: 4096,
            checkpoint_interval: Duration::from_secs(5),
            queue_capacity: 65_536,
            max_batch_bytes: 4 << 20,
            journal: None,
            lazy_delay: Duration::from_millis(10),
        }
    }

    /// Forward to the system journal when its socket exists.
    pub fn with_system_journal(mut self) -> Self {
        self.journal = Some(PathBuf::from(JOURNAL_SOCKET));
        self
    }

    /// Bytes at the end of a log that a crash can leave torn.
    fn tail_window(&self) -> u64 {
        (self.max_batch_bytes + 2 * MAX_RECORD_BYTES + 4096) as u64
    }
}

/// An acknowledged record: durable per the log's [`Durability`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ack {
    /// Its seq.
    pub seq: u64,
    /// Its hash.
    pub hash: [u8; 32],
    /// Its time.
    pub time_us: u64,
}

/// Why a record was not acknowledged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AppendError {
    /// The record is larger than [`MAX_RECORD_BYTES`] or its detail is not an object.
    #[error("audit record rejected: {0}")]
    Invalid(String),
    /// Writing or syncing the log failed; the log accepts nothing more (fail closed). The
    /// daemon must treat gated actions as denied until an operator intervenes.
    #[error("audit log {path} failed: {reason}; no further records are accepted")]
    Failed {
        /// The log.
        path: PathBuf,
        /// The first error.
        reason: String,
    },
    /// The log was closed.
    #[error("audit log {0} is closed")]
    Closed(PathBuf),
    /// The writer stopped before taking the record (after a failure or a panic).
    #[error("audit record abandoned: the writer stopped before committing it")]
    Abandoned,
    /// `append_nowait` found the queue full.
    #[error("audit log {0}: queue full")]
    Full(PathBuf),
}

/// Errors from [`Log::open`].
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// A file operation failed.
    #[error("audit log {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// Another process holds the log.
    #[error("audit log {0} is locked by another process (is another agentosd running?)")]
    Locked(PathBuf),
    /// The head file is unreadable or names a checkpoint the log does not hold.
    #[error(transparent)]
    Head(#[from] HeadError),
    /// A bad record that is not a torn tail: refuse to append to it.
    #[error(
        "audit log {path}: record seq {seq} at byte {offset}: {problem}; this is not a torn write from a crash, so the log will not be appended to. Keep it as evidence: move it aside (mv {path} {path}.bad), run `agentctl audit verify` on the moved file, and restart; a new log starts"
    )]
    Tampered {
        /// The log.
        path: PathBuf,
        /// The seq expected at the bad record.
        seq: u64,
        /// Its offset.
        offset: u64,
        /// What is wrong.
        problem: Problem,
    },
    /// The log is shorter than, or differs from, the checkpoint the head file records.
    #[error(
        "audit log {path}: does not hold checkpoint seq {head_seq} at byte {head_offset} recorded in {head}: {why}; the log was truncated or rewritten. Move it and the head file aside as evidence and restart"
    )]
    HeadMismatch {
        /// The log.
        path: PathBuf,
        /// The head file.
        head: PathBuf,
        /// The checkpoint's seq.
        head_seq: u64,
        /// Its offset.
        head_offset: u64,
        /// What is wrong.
        why: String,
    },
}

/// What `open` cut from the end of the log after a crash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recovery {
    /// Offset the log was cut at.
    pub offset: u64,
    /// Bytes cut.
    pub bytes: u64,
    /// Last good seq kept.
    pub last_good_seq: u64,
    /// Why the tail was bad.
    pub problem: Problem,
    /// Where the cut bytes were saved.
    pub saved_as: PathBuf,
    /// Seq of the `recovery` record.
    pub record_seq: u64,
}

/// Name of the log file in its directory.
pub const LOG_FILE: &str = "audit.log";
/// Name of the head file in its directory.
pub const HEAD_FILE: &str = "audit.head";

/// One record's acknowledgement. The writer publishes the result and wakes the waiter only if
/// one is parked, so a record nobody is waiting on yet costs no system call.
struct Slot {
    result: OnceLock<Result<Ack, AppendError>>,
    state: AtomicU8,
    waiter: OnceLock<Thread>,
}

const PENDING: u8 = 0;
const WAITING: u8 = 1;
const DONE: u8 = 2;

impl Slot {
    fn new() -> Arc<Slot> {
        Arc::new(Slot {
            result: OnceLock::new(),
            state: AtomicU8::new(PENDING),
            waiter: OnceLock::new(),
        })
    }

    fn complete(&self, r: Result<Ack, AppendError>) {
        let _ = self.result.set(r);
        if self.state.swap(DONE, Ordering::AcqRel) == WAITING
            && let Some(t) = self.waiter.get()
        {
            t.unpark();
        }
    }

    fn get(&self) -> Option<Result<Ack, AppendError>> {
        if self.state.load(Ordering::Acquire) == DONE {
            self.result.get().cloned()
        } else {
            None
        }
    }

    fn wait(&self) -> Result<Ack, AppendError> {
        if let Some(r) = self.get() {
            return r;
        }
        let _ = self.waiter.set(std::thread::current());
        if self
            .state
            .compare_exchange(PENDING, WAITING, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            while self.state.load(Ordering::Acquire) != DONE {
                std::thread::park();
            }
        }
        self.result
            .get()
            .cloned()
            .unwrap_or(Err(AppendError::Abandoned))
    }
}

type Callback = Box<dyn FnOnce(Result<Ack, AppendError>) + Send>;

enum Done {
    Slot(Arc<Slot>),
    Callback(Callback),
    /// Called once the record's batch is written (before its `fdatasync`); see
    /// [`Log::try_append_written`].
    Written(Callback),
    Nothing,
}

impl Done {
    fn complete(self, r: Result<Ack, AppendError>) {
        match self {
            Done::Slot(slot) => slot.complete(r),
            Done::Callback(f) | Done::Written(f) => f(r),
            Done::Nothing => {}
        }
    }
}

struct Msg {
    kind: Kind,
    body: Vec<u8>,
    /// Someone waits for this record: write and sync it now (with whatever is queued).
    urgent: bool,
    /// Taken by the writer; a message dropped unprocessed (writer stopped) completes with
    /// [`AppendError::Abandoned`], so no `wait` hangs.
    done: Option<Done>,
    /// Who the writer's CPU for it is charged to (cost.rs).
    cost: Option<CostTag>,
}

impl Drop for Msg {
    fn drop(&mut self) {
        if let Some(d) = self.done.take() {
            d.complete(Err(AppendError::Abandoned));
        }
    }
}

/// A pending acknowledgement from [`Log::append`].
#[must_use = "a record is durable only once `wait` returns Ok"]
pub struct Receipt {
    slot: Arc<Slot>,
}

impl Receipt {
    /// Blocks until the record is durable (or the log failed).
    pub fn wait(self) -> Result<Ack, AppendError> {
        self.slot.wait()
    }

    /// The result if it is already known.
    pub fn try_get(&self) -> Option<Result<Ack, AppendError>> {
        self.slot.get()
    }
}

/// Counters of the writer thread.
#[derive(Debug, Default)]
pub struct Stats {
    /// Batches committed.
    pub batches: AtomicU64,
    /// Records committed (checkpoints included).
    pub records: AtomicU64,
    /// Journal entries dropped.
    pub journal_dropped: AtomicU64,
    /// Batches by size: bucket `i` counts batches of `2^i ..= 2^(i+1)-1` records.
    pub batch_sizes: [AtomicU64; 24],
}

impl Stats {
    /// The batch-size bucket `(from, to)` that holds the median record's batch: half the
    /// records were committed in batches at most this large.
    pub fn median_batch(&self) -> Option<(u64, u64)> {
        let counts: Vec<u64> = self
            .batch_sizes
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        // weight each bucket by an estimate of the records in it
        let weights: Vec<u64> = counts
            .iter()
            .enumerate()
            .map(|(i, c)| c * (3u64 << i) / 2)
            .collect();
        let total: u64 = weights.iter().sum();
        let mut acc = 0;
        for (i, w) in weights.iter().enumerate() {
            acc += w;
            if total > 0 && acc * 2 >= total {
                return Some((1 << i, (2 << i) - 1));
            }
        }
        None
    }
}

struct Shared {
    failed: Mutex<Option<String>>,
    /// The failure was the file system running out of space (ENOSPC, EDQUOT): the log on disk
    /// ends with whole records and can be opened again once space returns.
    no_space: std::sync::atomic::AtomicBool,
    stats: Stats,
    /// Messages sent to the writer and not yet taken by it (here.rs: a record may be written on
    /// the caller's thread only when nothing queued before it is still on its way).
    queued: AtomicUsize,
    /// How long the last `fdatasync` took, ns (here.rs: a caller syncs on its own thread only
    /// while syncs are quick).
    last_sync_ns: AtomicU64,
    /// When the writer thread wakes up by itself next, ns after `epoch` (`u64::MAX`: not
    /// before a record comes): a record put in the batch on a caller's thread (here.rs) that
    /// must be written sooner wakes it.
    writer_wakes_at: AtomicU64,
    epoch: Instant,
}

impl Shared {
    fn new() -> Shared {
        Shared {
            failed: Mutex::new(None),
            no_space: std::sync::atomic::AtomicBool::new(false),
            stats: Stats::default(),
            queued: AtomicUsize::new(0),
            last_sync_ns: AtomicU64::new(0),
            writer_wakes_at: AtomicU64::new(u64::MAX),
            epoch: Instant::now(),
        }
    }

    /// Notes that `e` failed a write or sync, if it is the file system being full.
    fn note_io(&self, e: &std::io::Error) {
        if is_no_space(e) {
            self.no_space.store(true, Ordering::Relaxed);
        }
    }
}

/// Whether `e` says the file system (or the writer's quota) is full.
pub fn is_no_space(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc_errno::ENOSPC | libc_errno::EDQUOT)
    )
}

/// The two errnos of a full file system (Linux values; the crate does not link libc).
mod libc_errno {
    pub const ENOSPC: i32 = 28;
    pub const EDQUOT: i32 = 122;
}

/// An open audit log with its writer thread.
pub struct Log {
    path: PathBuf,
    tx: Option<SyncSender<Msg>>,
    thread: Option<JoinHandle<()>>,
    /// The writer's state: taken by the writer thread, or by a caller writing its record on its
    /// own thread while the writer is idle (here.rs).
    core: Arc<Mutex<Writer>>,
    shared: Arc<Shared>,
    recovery: Option<Recovery>,
    next_seq_at_open: u64,
}

impl std::fmt::Debug for Log {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Log").field("path", &self.path).finish()
    }
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

impl Log {
    /// Opens (or creates) `dir/audit.log`, checks the chain since the last checkpoint in
    /// `dir/audit.head` (the whole log when there is none), cuts a torn tail left by a crash and
    /// records that, and starts the writer thread.
    pub fn open(dir: &Path, opts: LogOptions) -> Result<Log, OpenError> {
        let io = |p: &Path| {
            let p = p.to_path_buf();
            move |source| OpenError::Io { path: p, source }
        };
        fs::create_dir_all(dir).map_err(io(dir))?;
        let path = dir.join(LOG_FILE);
        let head_path = dir.join(HEAD_FILE);
        let existed = path.exists();
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .mode(0o640)
            .open(&path)
            .map_err(io(&path))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => return Err(OpenError::Locked(path)),
            Err(fs::TryLockError::Error(e)) => return Err(io(&path)(e)),
        }
        if !existed {
            File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(io(dir))?;
        }
        let len = file.metadata().map_err(io(&path))?.len();
        let vk = opts.key.verifying_key();
        let head = Head::read(&head_path)?;
        let mismatch = |h: &Head, why: String| OpenError::HeadMismatch {
            path: path.clone(),
            head: head_path.clone(),
            head_seq: h.seq,
            head_offset: h.offset,
            why,
        };
        let mut chain = Chain::genesis();
        if let Some(h) = &head {
            h.checkpoint
                .check_signature(&vk)
                .map_err(|why| mismatch(h, format!("head file: {why}")))?;
            if len < h.end {
                return Err(mismatch(
                    h,
                    format!(
                        "the log is {len} bytes, the checkpoint ends at byte {}",
                        h.end
                    ),
                ));
            }
            let mut prev = [0u8; 32];
            hex::decode_to_slice(&h.checkpoint.head, &mut prev)
                .map_err(|e| mismatch(h, format!("head file: {e}")))?;
            chain.next_seq = h.seq;
            chain.prev = prev;
            chain.end = h.offset;
            chain.last_time_us = h.checkpoint.time_us;
        }
        file.seek(SeekFrom::Start(chain.end)).map_err(io(&path))?;
        let mut head_hash = None;
        let fault = scan::scan(
            BufReader::with_capacity(1 << 20, &file),
            &mut chain,
            Some(&vk),
            |rec, offset| {
                if head.as_ref().is_some_and(|h| h.offset == offset) {
                    head_hash = Some(rec.hash.clone());
                }
            },
        )
        .map_err(io(&path))?;
        if let Some(h) = &head {
            match &head_hash {
                Some(found) if *found == h.hash => {}
                Some(found) => {
                    return Err(mismatch(
                        h,
                        format!("the record there has hash {found}, not {}", h.hash),
                    ));
                }
                None => {
                    let why = fault
                        .as_ref()
                        .map(|f| f.problem.to_string())
                        .unwrap_or_else(|| "no record there".into());
                    return Err(mismatch(h, why));
                }
            }
        }
        let mut writer = Writer {
            path: path.clone(),
            file,
            key: opts.key.clone(),
            committer: Arc::new(Mutex::new(Committer {
                path: path.clone(),
                head_path,
                journal: opts.journal.as_deref().and_then(Journal::connect),
                head: None,
                head_written: None,
            })),
            syncer: None,
            in_flight: Arc::new(AtomicUsize::new(0)),
            alone: false,
            spare: None,
            costs: Costs::default(),
            urgent: false,
            lazy_since: None,
            next_seq: chain.next_seq,
            prev: chain.prev,
            last_time_us: chain.last_time_us,
            end: chain.end,
            since_checkpoint: chain.since_checkpoint,
            first_uncovered: (chain.since_checkpoint > 0).then(Instant::now),
            opts: opts.clone(),
            buf: Vec::with_capacity(opts.max_batch_bytes + MAX_RECORD_BYTES),
            pending: Vec::new(),
            checkpoint: None,
        };
        let mut recovery = None;
        if let Some(f) = fault {
            let torn = len - f.offset <= opts.tail_window()
                && looks_torn(&mut writer.file, f.offset, len, &f.problem).map_err(io(&path))?;
            if !torn {
                let problem = classify(&path, f.offset, f.problem);
                return Err(OpenError::Tampered {
                    path,
                    seq: f.seq,
                    offset: f.offset,
                    problem,
                });
            }
            let saved_as = save_tail(dir, &mut writer.file, f.offset, len).map_err(io(dir))?;
            writer.file.set_len(f.offset).map_err(io(&path))?;
            writer.file.sync_all().map_err(io(&path))?;
            let detail = serde_json::json!({
                "event": "torn-tail-cut",
                "offset": f.offset,
                "bytes": len - f.offset,
                "last_good_seq": chain.next_seq - 1,
                "problem": f.problem.to_string(),
                "saved_as": saved_as.display().to_string(),
            });
            let ack = writer
                .commit_now(Record::new(Kind::Recovery, "", "").detail(detail))
                .map_err(|e| io(&path)(std::io::Error::other(e.to_string())))?;
            recovery = Some(Recovery {
                offset: f.offset,
                bytes: len - f.offset,
                last_good_seq: chain.next_seq - 1,
                problem: f.problem,
                saved_as,
                record_seq: ack.seq,
            });
        } else if writer.next_seq == 1 {
            let detail = serde_json::json!({
                "event": "log-created",
                "format": "agentos-audit/1",
                "key": hex::encode(vk.as_bytes()),
            });
            writer
                .commit_now(Record::new(Kind::Lifecycle, "", "").detail(detail))
                .map_err(|e| io(&path)(std::io::Error::other(e.to_string())))?;
        }
        let next_seq_at_open = writer.next_seq;
        let shared = Arc::new(Shared::new());
        let (tx, rx) = mpsc::sync_channel(opts.queue_capacity.max(1));
        let sh = Arc::clone(&shared);
        let core = Arc::new(Mutex::new(writer));
        let c2 = Arc::clone(&core);
        let thread = std::thread::Builder::new()
            .name("audit-writer".into())
            .spawn(move || run(c2, rx, sh))
            .map_err(io(&path))?;
        Ok(Log {
            path,
            tx: Some(tx),
            thread: Some(thread),
            core,
            shared,
            recovery,
            next_seq_at_open,
        })
    }

    /// The log file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What `open` cut after a crash, if anything.
    pub fn recovery(&self) -> Option<&Recovery> {
        self.recovery.as_ref()
    }

    /// Seq the first record appended through this `Log` gets.
    pub fn first_seq(&self) -> u64 {
        self.next_seq_at_open
    }

    /// Whether the log failed because its file system was full (ENOSPC or EDQUOT on a write
    /// or sync). The file then ends with whole records (a batch cut short is truncated away, or
    /// cut as a torn tail by the next [`Log::open`]), so the log can be opened again, and the
    /// chain continued, once there is space: nothing acknowledged is lost.
    pub fn out_of_space(&self) -> bool {
        self.shared.no_space.load(Ordering::Relaxed)
    }

    /// Writer counters.
    pub fn stats(&self) -> &Stats {
        &self.shared.stats
    }

    fn prepare(&self, rec: &Record) -> Result<(&SyncSender<Msg>, Vec<u8>), AppendError> {
        if let Some(reason) = self
            .shared
            .failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        {
            return Err(AppendError::Failed {
                path: self.path.clone(),
                reason,
            });
        }
        let tx = self
            .tx
            .as_ref()
            .ok_or_else(|| AppendError::Closed(self.path.clone()))?;
        if !rec.detail.is_object() {
            return Err(AppendError::Invalid("detail must be a JSON object".into()));
        }
        let body = rec
            .encode_body()
            .map_err(|e| AppendError::Invalid(e.to_string()))?;
        if body.len() + 200 > MAX_RECORD_BYTES {
            return Err(AppendError::Invalid(format!(
                "{} bytes, the limit is {MAX_RECORD_BYTES}",
                body.len() + 200
            )));
        }
        Ok((tx, body))
    }

    fn send_err(&self) -> AppendError {
        match self
            .shared
            .failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        {
            Some(reason) => AppendError::Failed {
                path: self.path.clone(),
                reason,
            },
            None => AppendError::Closed(self.path.clone()),
        }
    }

    /// Queues a record; blocks while the queue is full. The returned receipt's `wait` returns
    /// once the record is durable.
    pub fn append(&self, rec: Record) -> Result<Receipt, AppendError> {
        let (tx, body) = self.prepare(&rec)?;
        let slot = Slot::new();
        self.shared.queued.fetch_add(1, Ordering::AcqRel);
        tx.send(Msg {
            kind: rec.kind,
            body,
            urgent: true,
            done: Some(Done::Slot(Arc::clone(&slot))),
            cost: rec.cost,
        })
        .map_err(|mpsc::SendError(mut m)| {
            // Report once, through the return value, not also through the completion.
            m.done = None;
            self.shared.queued.fetch_sub(1, Ordering::AcqRel);
            self.send_err()
        })?;
        Ok(Receipt { slot })
    }

    /// Appends and waits: returns once the record is durable.
    pub fn append_wait(&self, rec: Record) -> Result<Ack, AppendError> {
        self.append(rec)?.wait()
    }

    /// Queues a record and calls `done` once it is durable (or failed). `done` runs on the
    /// log's syncer or writer thread: it must be quick (e.g. send on a `tokio::sync::oneshot`) and must not
    /// append to the log (that can deadlock against a full queue). Blocks while the queue is full.
    pub fn append_then(
        &self,
        rec: Record,
        done: impl FnOnce(Result<Ack, AppendError>) + Send + 'static,
    ) -> Result<(), AppendError> {
        self.send_blocking(rec, Done::Callback(Box::new(done)))
    }

    /// Like [`Log::try_append_written`] but blocks while the queue is full.
    pub fn append_written_then(
        &self,
        rec: Record,
        done: impl FnOnce(Result<Ack, AppendError>) + Send + 'static,
    ) -> Result<(), AppendError> {
        self.send_blocking(rec, Done::Written(Box::new(done)))
    }

    fn send_blocking(&self, rec: Record, done: Done) -> Result<(), AppendError> {
        let (tx, body) = self.prepare(&rec)?;
        self.shared.queued.fetch_add(1, Ordering::AcqRel);
        tx.send(Msg {
            kind: rec.kind,
            body,
            urgent: true,
            done: Some(done),
            cost: rec.cost,
        })
        .map_err(|mpsc::SendError(mut m)| {
            // Report once, through the return value, not also through the completion.
            m.done = None;
            self.shared.queued.fetch_sub(1, Ordering::AcqRel);
            self.send_err()
        })
    }

    /// Like [`Log::append_then`] but never blocks: fails with [`AppendError::Full`] when the
    /// queue is full (then `done` is dropped uncalled). For async callers: on `Full`, retry from
    /// `spawn_blocking` with `append_then`, or fail closed.
    pub fn try_append_then(
        &self,
        rec: Record,
        done: impl FnOnce(Result<Ack, AppendError>) + Send + 'static,
    ) -> Result<(), AppendError> {
        self.try_append(rec, true, Done::Callback(Box::new(done)))
    }

    /// Like [`Log::try_append_then`], but `done` runs once the record's batch has been
    /// written to the file (`write(2)` returned: the bytes are in the kernel's page cache, so
    /// the record survives a crash of this process), before it is durable. The batch is written
    /// at once (the record is urgent, never left lazy) and made durable by the group commit
    /// that follows without delay; nobody waits for that `fdatasync`, and a power cut or kernel
    /// crash before it may lose the record. If the write fails, `done` gets the error; if the
    /// later sync fails, the log fails (nothing more is accepted) but `done` has already run.
    /// `done` runs on the writer thread: the same rules as for `try_append_then`.
    pub fn try_append_written(
        &self,
        rec: Record,
        done: impl FnOnce(Result<Ack, AppendError>) + Send + 'static,
    ) -> Result<(), AppendError> {
        self.try_append(rec, true, Done::Written(Box::new(done)))
    }

    /// Like [`Log::try_append_then`] for a record nobody waits for: it is written and synced
    /// with the next record someone does wait for, or after [`LogOptions::lazy_delay`],
    /// whichever comes first (`done` runs then). It never adds a `fdatasync` of its own in
    /// front of an urgent record.
    pub fn try_append_lazy(
        &self,
        rec: Record,
        done: impl FnOnce(Result<Ack, AppendError>) + Send + 'static,
    ) -> Result<(), AppendError> {
        self.try_append(rec, false, Done::Callback(Box::new(done)))
    }

    fn try_append(&self, rec: Record, urgent: bool, done: Done) -> Result<(), AppendError> {
        let (tx, body) = self.prepare(&rec)?;
        self.shared.queued.fetch_add(1, Ordering::AcqRel);
        let res = tx.try_send(Msg {
            kind: rec.kind,
            body,
            urgent,
            done: Some(done),
            cost: rec.cost,
        });
        if res.is_err() {
            self.shared.queued.fetch_sub(1, Ordering::AcqRel);
        }
        match res {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(mut m)) => {
                m.done = None;
                Err(AppendError::Full(self.path.clone()))
            }
            Err(TrySendError::Disconnected(mut m)) => {
                m.done = None;
                Err(self.send_err())
            }
        }
    }

    /// Queues a record without waiting for the queue or the disk; fails with
    /// [`AppendError::Full`] when the queue is full. For best-effort records only.
    pub fn append_nowait(&self, rec: Record) -> Result<(), AppendError> {
        let (tx, body) = self.prepare(&rec)?;
        self.shared.queued.fetch_add(1, Ordering::AcqRel);
        let res = tx.try_send(Msg {
            kind: rec.kind,
            body,
            urgent: true,
            done: Some(Done::Nothing),
            cost: rec.cost,
        });
        if res.is_err() {
            self.shared.queued.fetch_sub(1, Ordering::AcqRel);
        }
        match res {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => Err(AppendError::Full(self.path.clone())),
            Err(TrySendError::Disconnected(_)) => Err(self.send_err()),
        }
    }

    /// Commits everything queued, writes a final checkpoint and stops the writer.
    pub fn close(mut self) -> Result<(), AppendError> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<(), AppendError> {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        match self
            .shared
            .failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        {
            Some(reason) => Err(AppendError::Failed {
                path: self.path.clone(),
                reason,
            }),
            None => Ok(()),
        }
    }
}

impl Drop for Log {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

/// Reclassifies a seq fault by looking further into the file.
fn classify(path: &Path, offset: u64, problem: Problem) -> Problem {
    if !matches!(problem, Problem::Missing { .. }) {
        return problem;
    }
    let Ok(mut f) = File::open(path) else {
        return problem;
    };
    if f.seek(SeekFrom::Start(offset)).is_err() {
        return problem;
    }
    let mut r = BufReader::new(f);
    let mut skip = Vec::new();
    if std::io::BufRead::read_until(&mut r, b'\n', &mut skip).is_err() {
        return problem;
    }
    scan::classify_seq(problem, r)
}

/// Whether the bad region `[offset, len)` at the end of the log looks like a write cut short by
/// a crash rather than an edit: it holds NUL bytes (blocks the file system allocated but never
/// wrote, as after a power cut), or it starts with an unfinished or unparseable line and no
/// genuine record (one matching its own hash) follows. Edited, deleted or reordered records
/// are genuine lines in the wrong place, so they are refused instead.
fn looks_torn(file: &mut File, offset: u64, len: u64, problem: &Problem) -> std::io::Result<bool> {
    let mut region = Vec::with_capacity((len - offset) as usize);
    file.seek(SeekFrom::Start(offset))?;
    std::io::Read::take(&mut *file, len - offset).read_to_end(&mut region)?;
    if region.contains(&0) {
        return Ok(true);
    }
    if !matches!(
        problem,
        Problem::Incomplete { .. } | Problem::Unparseable(_)
    ) {
        return Ok(false);
    }
    let genuine_follows = region
        .split_inclusive(|b| *b == b'\n')
        .skip(1)
        .filter_map(|l| l.strip_suffix(b"\n"))
        .any(|l| record::parse_line(l).is_ok());
    Ok(!genuine_follows)
}

/// Copies the bytes cut from the end into `audit.torn.<offset>` (evidence), durably.
fn save_tail(dir: &Path, file: &mut File, offset: u64, len: u64) -> std::io::Result<PathBuf> {
    let mut bytes = Vec::with_capacity((len - offset) as usize);
    file.seek(SeekFrom::Start(offset))?;
    std::io::Read::take(&mut *file, len - offset).read_to_end(&mut bytes)?;
    let mut n = 0;
    let (mut out, p) = loop {
        let p = dir.join(if n == 0 {
            format!("audit.torn.{offset}")
        } else {
            format!("audit.torn.{offset}.{n}")
        });
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o640)
            .open(&p)
        {
            Ok(f) => break (f, p),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => n += 1,
            Err(e) => return Err(e),
        }
    };
    out.write_all(&bytes)?;
    out.sync_all()?;
    File::open(dir)?.sync_all()?;
    Ok(p)
}

/// A batch written to the file, waiting to be made durable and acknowledged.
struct Batch {
    buf: Vec<u8>,
    /// (done, ack, kind, line start, line end)
    pending: Vec<(Done, Ack, Kind, usize, usize)>,
    head: Option<Head>,
    /// Who its records' CPU is charged to.
    costs: Costs,
}

impl Batch {
    fn fail(&mut self, path: &Path, reason: &str) {
        for (done, ..) in self.pending.drain(..) {
            done.complete(Err(AppendError::Failed {
                path: path.to_path_buf(),
                reason: reason.to_string(),
            }));
        }
    }
}

/// Acknowledges durable batches, forwards them to the journal and keeps the head file.
struct Committer {
    path: PathBuf,
    head_path: PathBuf,
    journal: Option<Journal>,
    /// Newest durable checkpoint not yet in the head file, and when the head file was written.
    head: Option<Head>,
    head_written: Option<Instant>,
}

/// The head file is replaced at most this often (and always when the log closes); it always
/// names a durable checkpoint, at worst not the newest.
const HEAD_INTERVAL: Duration = Duration::from_millis(500);

impl Committer {
    /// Called once the batches are durable.
    fn ack(&mut self, batches: &mut [Batch], shared: &Shared) -> Result<(), String> {
        let stats = &shared.stats;
        let n: u64 = batches.iter().map(|b| b.pending.len() as u64).sum();
        stats.batches.fetch_add(1, Ordering::Relaxed);
        stats.records.fetch_add(n, Ordering::Relaxed);
        let bucket = (63 - n.max(1).leading_zeros() as usize).min(23);
        stats.batch_sizes[bucket].fetch_add(1, Ordering::Relaxed);
        for b in batches.iter_mut() {
            for (done, ack, kind, start, end) in b.pending.drain(..) {
                if let Some(j) = self.journal.as_mut() {
                    j.send(ack.seq, kind, &b.buf[start..end - 1]);
                }
                done.complete(Ok(ack));
            }
            if let Some(h) = b.head.take() {
                self.head = Some(h);
            }
        }
        if let Some(j) = &self.journal {
            stats.journal_dropped.store(j.dropped, Ordering::Relaxed);
        }
        if self
            .head_written
            .is_none_or(|t| t.elapsed() >= HEAD_INTERVAL)
        {
            self.write_head(shared)?;
        }
        Ok(())
    }

    /// Whether the next acknowledgement writes the head file (a new checkpoint is durable and
    /// the last head file is older than [`HEAD_INTERVAL`]): a temporary file, two syncs and a
    /// rename, which here.rs leaves to the writer's threads.
    fn head_due(&self) -> bool {
        self.head.is_some()
            && self
                .head_written
                .is_none_or(|t| t.elapsed() >= HEAD_INTERVAL)
    }

    fn write_head(&mut self, shared: &Shared) -> Result<(), String> {
        if let Some(h) = self.head.take() {
            h.write(&self.head_path).map_err(|e| {
                if let HeadError::Io { source, .. } = &e {
                    shared.note_io(source);
                }
                e.to_string()
            })?;
            self.head_written = Some(Instant::now());
        }
        Ok(())
    }
}

/// The group-commit syncer: takes written batches, makes all that are waiting durable with one
/// `fdatasync`, acknowledges them. It runs beside the writer so that formatting and writing the
/// next batch overlaps the sync of the previous ones. Its CPU for a round of batches (the
/// system call's own CPU, not the wait for the disk, and the acknowledgements) is charged to
/// their records' tags (cost.rs): one clock read per round.
fn sync_loop(
    file: File,
    rx: Receiver<Batch>,
    spare: SyncSender<(Vec<u8>, Costs)>,
    committer: Arc<Mutex<Committer>>,
    in_flight: Arc<AtomicUsize>,
    shared: Arc<Shared>,
) {
    let mut batches: Vec<Batch> = Vec::new();
    let mut cpu_mark = thread_cpu_ns();
    while let Ok(b) = rx.recv() {
        batches.push(b);
        while let Ok(b) = rx.try_recv() {
            batches.push(b);
        }
        let t0 = Instant::now();
        let synced = file.sync_data().map_err(|e| {
            shared.note_io(&e);
            format!("fdatasync: {e}")
        });
        shared.note_sync(t0);
        let mut c = committer.lock().unwrap_or_else(|p| p.into_inner());
        let res = synced.and_then(|()| c.ack(&mut batches, &shared));
        if let Err(reason) = res {
            shared.fail(&reason);
            for b in batches.iter_mut() {
                b.fail(&c.path, &reason);
            }
            for mut b in rx.iter() {
                b.fail(&c.path, &reason);
            }
            return;
        }
        drop(c);
        in_flight.fetch_sub(batches.len(), Ordering::AcqRel);
        let cpu = thread_cpu_ns();
        let total: u64 = batches.iter().map(|b| b.costs.bytes()).sum();
        for b in &batches {
            b.costs.charge(cpu.saturating_sub(cpu_mark), total);
        }
        cpu_mark = cpu;
        for mut b in batches.drain(..) {
            b.buf.clear();
            b.costs.clear();
            let _ = spare.try_send((b.buf, b.costs));
        }
    }
}

impl Shared {
    fn fail(&self, reason: &str) {
        let mut g = self.failed.lock().unwrap_or_else(|p| p.into_inner());
        if g.is_none() {
            *g = Some(reason.to_string());
        }
    }

    /// `after` from now, in ns after `epoch`.
    fn ns_at(&self, after: Duration) -> u64 {
        (self.epoch.elapsed() + after)
            .as_nanos()
            .min(u64::MAX as u128 - 1) as u64
    }

    fn note_sync(&self, since: Instant) {
        let ns = since.elapsed().as_nanos().min(u64::MAX as u128) as u64;
        self.last_sync_ns.store(ns, Ordering::Relaxed);
    }

    fn failed(&self) -> Option<String> {
        self.failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// The next record from the queue, waiting at most `wake` (forever when `None`); `open` turns
/// false when every sender is gone.
fn next_msg(rx: &Receiver<Msg>, wake: Option<Duration>, open: &mut bool) -> Option<Msg> {
    let r = match wake {
        Some(wait) => rx.recv_timeout(wait),
        None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
    };
    match r {
        Ok(m) => Some(m),
        Err(RecvTimeoutError::Timeout) => None,
        Err(RecvTimeoutError::Disconnected) => {
            *open = false;
            None
        }
    }
}

struct Writer {
    path: PathBuf,
    file: File,
    key: SigningKey,
    opts: LogOptions,
    next_seq: u64,
    prev: [u8; 32],
    last_time_us: u64,
    /// Offset after the last byte written.
    end: u64,
    since_checkpoint: u64,
    first_uncovered: Option<Instant>,
    buf: Vec<u8>,
    pending: Vec<(Done, Ack, Kind, usize, usize)>,
    /// A checkpoint in the batch being built.
    checkpoint: Option<Head>,
    /// Acknowledges durable batches: here when the writer syncs itself, else on the syncer.
    committer: Arc<Mutex<Committer>>,
    /// To the syncer thread (group commit).
    syncer: Option<SyncSender<Batch>>,
    /// Batches sent to the syncer and not yet acknowledged.
    in_flight: Arc<AtomicUsize>,
    /// Nothing else waits in the queue: the batch may be synced on this thread.
    alone: bool,
    spare: Option<Receiver<(Vec<u8>, Costs)>>,
    /// Who the CPU for the records in the buffer is charged to (cost.rs).
    costs: Costs,
    /// The buffer holds a record someone waits for.
    urgent: bool,
    /// When the oldest lazy record in the buffer came (none while the buffer has none).
    lazy_since: Option<Instant>,
}

impl Writer {
    fn take(&mut self, mut m: Msg, shared: &Shared) {
        shared.queued.fetch_sub(1, Ordering::AcqRel);
        let done = m.done.take().unwrap_or(Done::Nothing);
        if m.body.is_empty() {
            // A wake-up from here.rs (a timer to set), not a record.
            return;
        }
        if m.urgent {
            self.urgent = true;
        } else {
            self.lazy_since.get_or_insert_with(Instant::now);
        }
        self.push(m.kind, &m.body, done, m.cost.as_ref());
    }

    /// Whether the buffer must go to disk now rather than wait for more.
    fn flush_due(&self, closing: bool) -> bool {
        closing
            || self.urgent
            || self.checkpoint.is_some()
            || self.opts.durability == Durability::PerRecord
            || self.buf.len() >= self.opts.max_batch_bytes
            || self
                .lazy_since
                .is_some_and(|t| t.elapsed() >= self.opts.lazy_delay)
    }

    fn push(&mut self, kind: Kind, body: &[u8], done: Done, cost: Option<&CostTag>) {
        let time_us = now_us().max(self.last_time_us);
        let start = self.buf.len();
        let seq = self.next_seq;
        let hash = record::build_line(&mut self.buf, seq, time_us, &self.prev, body);
        self.prev = hash;
        self.next_seq += 1;
        self.last_time_us = time_us;
        self.pending.push((
            done,
            Ack { seq, hash, time_us },
            kind,
            start,
            self.buf.len(),
        ));
        self.costs.add(cost, (self.buf.len() - start) as u64);
        if kind != Kind::Checkpoint {
            self.since_checkpoint += 1;
            self.first_uncovered.get_or_insert_with(Instant::now);
        }
    }

    fn push_checkpoint(&mut self) {
        let time_us = now_us().max(self.last_time_us);
        let detail = CheckpointDetail::sign(&self.key, self.next_seq - 1, &self.prev, time_us);
        let Ok(value) = serde_json::to_value(&detail) else {
            return;
        };
        let Ok(body) = Record::new(Kind::Checkpoint, "", "")
            .detail(value)
            .encode_body()
        else {
            return;
        };
        let offset = self.end + self.buf.len() as u64;
        let start = self.buf.len();
        let seq = self.next_seq;
        // Not `push`: the record's time must be the signed time.
        let hash = record::build_line(&mut self.buf, seq, time_us, &self.prev, &body);
        self.prev = hash;
        self.next_seq += 1;
        self.last_time_us = time_us;
        self.pending.push((
            Done::Nothing,
            Ack { seq, hash, time_us },
            Kind::Checkpoint,
            start,
            self.buf.len(),
        ));
        self.checkpoint = Some(Head {
            seq,
            hash: hex::encode(hash),
            offset,
            end: self.end + self.buf.len() as u64,
            checkpoint: detail,
        });
        self.since_checkpoint = 0;
        self.first_uncovered = None;
    }

    fn checkpoint_due(&self) -> bool {
        self.since_checkpoint > 0
            && (self.since_checkpoint >= self.opts.checkpoint_records
                || self
                    .first_uncovered
                    .is_some_and(|t| t.elapsed() >= self.opts.checkpoint_interval))
    }

    /// Writes the batch being built; hands it to the syncer, or syncs and acknowledges it here.
    /// `cpu_mark`: on the writer thread, its CPU clock after the last batch; the CPU since is
    /// charged to this batch's records (cost.rs: one clock read per batch). `None` on a
    /// caller's thread (here.rs), whose CPU its caller accounts for.
    fn flush(&mut self, shared: &Shared, cpu_mark: Option<&mut u64>) -> Result<(), String> {
        if self.buf.is_empty() {
            return Ok(());
        }
        // The buffer goes with the batch; a new one is found only if the batch goes to the
        // syncer (a batch synced here gives its buffer back).
        let mut batch = Batch {
            buf: std::mem::take(&mut self.buf),
            pending: std::mem::take(&mut self.pending),
            head: self.checkpoint.take(),
            costs: std::mem::take(&mut self.costs),
        };
        if let Err(e) = self.file.write_all(&batch.buf) {
            shared.note_io(&e);
            // Cut what part of the batch reached the file: the log keeps ending with whole
            // records, so the chain verifies and a later `open` continues it. (If even this
            // fails, `open` cuts the torn tail.)
            let cut = match self.file.set_len(self.end) {
                Ok(()) => "cut back",
                Err(_) => "not cut back",
            };
            let reason = format!("write at byte {}: {e} (partial batch {cut})", self.end);
            batch.fail(&self.path, &reason);
            return Err(reason);
        }
        self.end += batch.buf.len() as u64;
        // Written, not yet durable: acknowledge the records that asked for no more.
        for (done, ack, ..) in batch.pending.iter_mut() {
            if matches!(done, Done::Written(_)) {
                std::mem::replace(done, Done::Nothing).complete(Ok(*ack));
            }
        }
        // When someone waits for this batch's sync, nothing else is queued and the syncer is
        // idle, sync here: one thread wake-up less, and nothing to overlap the sync with anyway.
        // Otherwise hand the batch to the syncer and go on writing the next one while this one
        // syncs (acknowledgements stay in order: the syncer takes batches in order, and this
        // thread syncs only when it holds none). A batch nobody waits on the sync of (only
        // `written` records) always goes to the syncer: this thread stays free to write.
        let waited = batch
            .pending
            .iter()
            .any(|(d, ..)| matches!(d, Done::Slot(_) | Done::Callback(_)));
        if let Some(tx) = &self.syncer
            && !(waited && self.alone && self.in_flight.load(Ordering::Acquire) == 0)
        {
            if let Some(mark) = cpu_mark {
                batch.costs.charge_since(mark);
            }
            self.in_flight.fetch_add(1, Ordering::AcqRel);
            (self.buf, self.costs) = self
                .spare
                .as_ref()
                .and_then(|r| r.try_recv().ok())
                .unwrap_or_else(|| {
                    (
                        Vec::with_capacity(self.opts.max_batch_bytes + MAX_RECORD_BYTES),
                        Costs::default(),
                    )
                });
            return tx.send(batch).map_err(|mut e| {
                let reason = shared
                    .failed()
                    .unwrap_or_else(|| "the syncer thread stopped".into());
                e.0.fail(&self.path, &reason);
                reason
            });
        }
        let mut res = Ok(());
        if self.opts.durability != Durability::NoSync {
            let t0 = Instant::now();
            res = self.file.sync_data().map_err(|e| {
                shared.note_io(&e);
                format!("fdatasync at byte {}: {e}", self.end)
            });
            shared.note_sync(t0);
        }
        let batches = std::slice::from_mut(&mut batch);
        res = res.and_then(|()| {
            self.committer
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .ack(batches, shared)
        });
        if let Err(reason) = res {
            batch.fail(&self.path, &reason);
            return Err(reason);
        }
        if let Some(mark) = cpu_mark {
            batch.costs.charge_since(mark);
        }
        batch.buf.clear();
        self.buf = batch.buf;
        batch.costs.clear();
        self.costs = batch.costs;
        Ok(())
    }

    /// Appends one record and makes it durable, on the calling thread (used by `open`).
    fn commit_now(&mut self, rec: Record) -> Result<Ack, String> {
        let body = rec.encode_body().map_err(|e| e.to_string())?;
        let slot = Slot::new();
        self.push(rec.kind, &body, Done::Slot(Arc::clone(&slot)), None);
        let durability = self.opts.durability;
        self.opts.durability = Durability::PerRecord;
        let res = self.flush(&Shared::new(), None);
        self.opts.durability = durability;
        res?;
        slot.wait().map_err(|e| e.to_string())
    }

    /// Starts the group-commit syncer thread (when the log syncs by group commit); its handle.
    fn start_syncer(&mut self, shared: &Arc<Shared>) -> Option<JoinHandle<()>> {
        if self.opts.durability != Durability::GroupCommit {
            return None;
        }
        let file = match self.file.try_clone() {
            Ok(f) => f,
            Err(e) => {
                shared.fail(&format!("cannot clone the log's descriptor: {e}"));
                return None;
            }
        };
        let (tx, brx) = mpsc::sync_channel(8);
        let (spare_tx, spare_rx) = mpsc::sync_channel(8);
        let sh = Arc::clone(shared);
        let (committer, in_flight) = (Arc::clone(&self.committer), Arc::clone(&self.in_flight));
        match std::thread::Builder::new()
            .name("audit-sync".into())
            .spawn(move || sync_loop(file, brx, spare_tx, committer, in_flight, sh))
        {
            Ok(h) => {
                self.syncer = Some(tx);
                self.spare = Some(spare_rx);
                Some(h)
            }
            Err(e) => {
                shared.fail(&format!("cannot start the syncer thread: {e}"));
                None
            }
        }
    }

    /// When the writer thread must wake up by itself (a checkpoint or lazy records due).
    fn wake_in(&self) -> Option<Duration> {
        let checkpoint_at = self
            .first_uncovered
            .map(|t| self.opts.checkpoint_interval.saturating_sub(t.elapsed()));
        let lazy_at = self
            .lazy_since
            .map(|t| self.opts.lazy_delay.saturating_sub(t.elapsed()));
        match (checkpoint_at, lazy_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

fn lock_core(core: &Mutex<Writer>) -> std::sync::MutexGuard<'_, Writer> {
    core.lock().unwrap_or_else(|p| p.into_inner())
}

/// The writer thread: takes queued records, batches them, writes, and syncs or hands the batch
/// to the syncer. It holds the writer's state (`core`) while it works on a batch and lets go of
/// it while it waits for the queue, so that a caller may write a record on its own thread
/// meanwhile (here.rs).
fn run(core: Arc<Mutex<Writer>>, rx: Receiver<Msg>, shared: Arc<Shared>) {
    let (per_record, syncer) = {
        let mut w = lock_core(&core);
        let h = w.start_syncer(&shared);
        (w.opts.durability == Durability::PerRecord, h)
    };
    let mut open = shared.failed().is_none();
    // This thread's CPU clock after its last batch: all it spends until the next batch is
    // written (taking, formatting, hashing, checkpoints, the write) is charged to that batch.
    let mut cpu_mark = thread_cpu_ns();
    // A record taken while deciding whether the last batch was alone in the queue.
    let mut carry: Option<Msg> = None;
    while open {
        let wake = {
            let w = lock_core(&core);
            let wake = w.wake_in();
            shared.writer_wakes_at.store(
                wake.map_or(u64::MAX, |d| shared.ns_at(d)),
                Ordering::Release,
            );
            wake
        };
        let first = match carry.take() {
            Some(m) => Some(m),
            None => next_msg(&rx, wake, &mut open),
        };
        let mut w = lock_core(&core);
        if shared.failed().is_some() {
            // A caller's write on its own thread failed the log.
            carry = first;
            break;
        }
        if let Some(m) = first {
            w.take(m, &shared);
            // A checkpoint after every `checkpoint_records` records exactly, the batch's first
            // record included (checked before taking more, not only after each further one).
            loop {
                if w.since_checkpoint >= w.opts.checkpoint_records {
                    w.push_checkpoint();
                }
                if per_record || w.buf.len() >= w.opts.max_batch_bytes {
                    break;
                }
                let Ok(m) = rx.try_recv() else { break };
                w.take(m, &shared);
            }
        }
        if w.checkpoint_due() || (!open && w.since_checkpoint > 0) {
            w.push_checkpoint();
        }
        if !w.flush_due(!open) {
            // Only lazy records so far: wait for an urgent one to carry them, or the delay.
            continue;
        }
        w.urgent = false;
        w.lazy_since = None;
        if open {
            carry = rx.try_recv().ok();
        }
        w.alone = carry.is_none();
        if let Err(reason) = w.flush(&shared, Some(&mut cpu_mark)) {
            shared.fail(&reason);
        }
        if shared.failed().is_some() {
            break;
        }
    }
    // Stop the syncer after it has acknowledged everything, then write the final head.
    let mut w = lock_core(&core);
    w.syncer = None;
    if let Some(h) = syncer
        && h.join().is_err()
    {
        shared.fail("the syncer thread panicked");
    }
    let head = w
        .committer
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .write_head(&shared);
    if let Err(reason) = head {
        shared.fail(&reason);
    }
    // Fail everything still queued; later senders get `Failed` from `append`.
    drop(carry);
    if let Some(reason) = shared.failed() {
        while let Ok(mut m) = rx.try_recv() {
            if let Some(d) = m.done.take() {
                d.complete(Err(AppendError::Failed {
                    path: w.path.clone(),
                    reason: reason.clone(),
                }));
            }
        }
    }
}
