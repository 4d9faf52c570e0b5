//! Taking in what agents write: the daemon reads the new bytes of an agent's stdout and stderr
//! files (in the ingest thread's rounds every half second, for the agents whose files changed:
//! rounds.rs; and before it answers a log query or writes a note of its own), cuts them into
//! lines, stamps them, and appends them to the agent's journal. Bounded per agent: at most
//! [`Limits::per_round`] bytes a round, a line is cut at [`LINE_MAX`], and an agent more
//! than [`Limits::backlog_max`] behind has the excess skipped with a note saying how much. The
//! consumed part of each file is given back to the file system (a hole is punched), so an agent's
//! output costs the disk its journal plus what is still unread. While storage is low
//! (storage/), nothing is taken in: new output is skipped (and its space given back), with one
//! note when the skipping starts and one with the total when it ends; the bytes taken in are
//! charged to the agent, so a flooding agent is found as the offender.

use super::{AgentFiles, JournalForwarder, journal};
use agentos_api::LogEntry;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::io::{self, Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use tracing::warn;

/// A line longer than this becomes several entries (journald's `LineMax` does the same).
pub const LINE_MAX: usize = 16 * 1024;

/// How much of an agent's output the daemon keeps and takes in (`--log-*` options).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The journal is rotated past this size (one old file is kept).
    pub journal_max: u64,
    /// At most this much is taken in from one stream in one round (half a second).
    pub per_round: u64,
    /// Unread output beyond this is skipped, with a note.
    pub backlog_max: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            journal_max: 8 << 20,
            per_round: 1 << 20,
            backlog_max: 16 << 20,
        }
    }
}

/// Whose log: the names journald gets and where the files are.
#[derive(Debug, Clone, Copy)]
pub struct Who<'a> {
    /// `tenant/name`.
    pub id: &'a str,
    pub tenant: &'a str,
    pub name: &'a str,
    /// The agent's stdout file; the others are derived from it ([`AgentFiles`]).
    pub log_path: &'a Path,
}

/// How far each stream has been read (persisted next to the journal).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Offsets {
    stdout: u64,
    stderr: u64,
}

/// An agent's stdout path ([`Who::log_path`]) → how far its streams were read.
type Seen = HashMap<OsString, Offsets>;

/// What one look at an agent took in.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Took {
    /// Bytes read.
    pub bytes: u64,
    /// A stream has more to take in than this look took (the per-round cap, a journal that
    /// could not be written, a file that could not be opened this time): look again next round,
    /// whether or not the agent writes again.
    pub more: bool,
}

/// The daemon's log keeper (one per daemon).
pub struct Logs {
    limits: Limits,
    journald: Option<JournalForwarder>,
    /// Agents' offsets by stdout path; the lock also orders every append to any journal.
    seen: Mutex<Seen>,
    /// The storage reserve: below it, output is skipped rather than taken in.
    storage: Option<std::sync::Arc<crate::storage::Storage>>,
    /// Stdout path → bytes skipped since storage went low (noted once at the start, and the
    /// total once it is back). Bounded by the agents whose journals are known.
    skipped: Mutex<HashMap<OsString, u64>>,
    /// Streams looked at (an `lstat`, and an open when it moved), for tests and benchmarks.
    looks: AtomicU64,
}

impl std::fmt::Debug for Logs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Logs")
            .field("limits", &self.limits)
            .field("journald", &self.journald.is_some())
            .finish()
    }
}

impl Default for Logs {
    fn default() -> Self {
        Logs::new(Limits::default(), None)
    }
}

fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

impl Logs {
    /// `journald`: where to send every entry too (None: nowhere).
    pub fn new(limits: Limits, journald: Option<JournalForwarder>) -> Self {
        Logs {
            limits,
            journald,
            seen: Mutex::default(),
            storage: None,
            skipped: Mutex::default(),
            looks: AtomicU64::new(0),
        }
    }

    /// Skip agents' output instead of taking it in while `storage` is low, and charge the
    /// bytes taken in to their agents.
    pub fn with_storage(mut self, storage: std::sync::Arc<crate::storage::Storage>) -> Self {
        self.storage = Some(storage);
        self
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Whether entries also go to journald.
    pub fn forwards_to_journald(&self) -> bool {
        self.journald.is_some()
    }

    /// How many times an agent's stdout or stderr file was looked at (each an `lstat`, and an
    /// open when its size moved), since the keeper was made: what idle agents cost.
    pub fn stream_looks(&self) -> u64 {
        self.looks.load(Ordering::Relaxed)
    }

    fn lock(&self) -> MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Take in what `who` wrote since the last call; returns how many bytes. `all`: also a last
    /// line without its newline (the agent has exited).
    pub fn ingest(&self, who: &Who<'_>, all: bool) -> u64 {
        self.look(who, all).bytes
    }

    /// [`Logs::ingest`], saying also whether there is more to take in (rounds.rs).
    pub(super) fn look(&self, who: &Who<'_>, all: bool) -> Took {
        let mut seen = self.lock();
        self.ingest_locked(&mut seen, who, all)
    }

    /// What one round of the daemon's ingest thread takes in at most, over all agents (the
    /// next round starts with the agents this one did not reach).
    pub fn round_max(&self) -> u64 {
        self.limits.per_round.saturating_mul(32)
    }

    fn ingest_locked(&self, seen: &mut Seen, who: &Who<'_>, all: bool) -> Took {
        let key = who.log_path.as_os_str();
        if !seen.contains_key(key) {
            let off = load_offsets(&AgentFiles::of(who.log_path).offsets);
            seen.insert(key.to_os_string(), off);
        }
        let Some(off) = seen.get_mut(key) else {
            return Took::default();
        };
        self.take_in(off, key, who, all)
    }

    fn take_in(&self, off: &mut Offsets, key: &OsStr, who: &Who<'_>, all: bool) -> Took {
        self.looks.fetch_add(2, Ordering::Relaxed);
        let low = self.storage.as_ref().filter(|s| s.is_low());
        // The usual case, an agent idle since its last look: each stream's `lstat` finds it
        // where it was read to and no note is due. Nothing else is built or opened.
        if low.is_none()
            && unchanged(who.log_path, off.stdout)
            && unchanged(&AgentFiles::stderr_of(who.log_path), off.stderr)
            && !self
                .skipped
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains_key(key)
        {
            return Took::default();
        }
        let files = AgentFiles::of(who.log_path);
        let before = *off;
        let now = now_us();
        let mut entries = Vec::new();
        let l = &self.limits;
        if let Some(s) = low {
            let after = Offsets {
                stdout: skip_all(&files.stdout, before.stdout),
                stderr: skip_all(&files.stderr, before.stderr),
            };
            let moved = after.stdout.saturating_sub(before.stdout)
                + after.stderr.saturating_sub(before.stderr);
            if moved > 0 {
                *off = after;
                store_offsets(&files.offsets, after);
                let mut sk = self.skipped.lock().unwrap_or_else(|p| p.into_inner());
                let first = !sk.contains_key(key);
                *sk.entry(key.to_os_string()).or_insert(0) += moved;
                drop(sk);
                if first {
                    let text = format!(
                        "output not taken in while storage is low ({}); skipping it until space returns",
                        s.status().describe()
                    );
                    self.note_locked(who, &text);
                }
            }
            return Took::default();
        }
        let skipped = self
            .skipped
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
        if let Some(n) = skipped {
            entries.push(LogEntry {
                time_us: now,
                stream: "agentosd".into(),
                message: format!(
                    "storage back to normal: {n} bytes of output were skipped while it was low"
                ),
            });
        }
        let (out, more_out) = take(
            &files.stdout,
            before.stdout,
            "stdout",
            all,
            l,
            now,
            &mut entries,
        );
        let (err, more_err) = take(
            &files.stderr,
            before.stderr,
            "stderr",
            all,
            l,
            now,
            &mut entries,
        );
        let after = Offsets {
            stdout: out,
            stderr: err,
        };
        let more = more_out || more_err;
        if after == before && entries.is_empty() {
            return Took { bytes: 0, more };
        }
        if let Err(e) = journal::append(&files, &entries, l.journal_max) {
            // Kept unread: taken in again when the journal can be written.
            warn!("journal {}: {e}", files.journal.display());
            return Took {
                bytes: 0,
                more: true,
            };
        }
        *off = after;
        store_offsets(&files.offsets, after);
        self.forward(who, &entries);
        // Bytes read (a skip moves the offset further without reading).
        let moved = |a: u64, b: u64| (if b >= a { b - a } else { b }).min(l.per_round);
        let taken = moved(before.stdout, after.stdout) + moved(before.stderr, after.stderr);
        if let Some(s) = &self.storage {
            s.charge(who.id, taken);
        }
        Took { bytes: taken, more }
    }

    /// A note of the daemon's in `who`'s journal (the caller holds the offsets lock).
    fn note_locked(&self, who: &Who<'_>, text: &str) {
        let e = LogEntry {
            time_us: now_us(),
            stream: "agentosd".into(),
            message: text.to_string(),
        };
        let files = AgentFiles::of(who.log_path);
        match journal::append(&files, std::slice::from_ref(&e), self.limits.journal_max) {
            Ok(()) => self.forward(who, std::slice::from_ref(&e)),
            Err(err) => warn!("journal {}: {err}", files.journal.display()),
        }
    }

    /// A line from the daemon about `who` (`started main process …`), after what the agent wrote
    /// before it. `exited`: the agent has ended, so its last partial line is taken in first.
    pub fn note(&self, who: &Who<'_>, text: &str, exited: bool) {
        let mut seen = self.lock();
        let _ = self.ingest_locked(&mut seen, who, exited);
        self.note_locked(who, text);
    }

    /// The entries `q` asks for (after taking in what is new) and the offset to follow from.
    pub fn query(&self, who: &Who<'_>, q: journal::Query) -> io::Result<(Vec<LogEntry>, u64)> {
        let _ = self.ingest(who, false);
        journal::query(&AgentFiles::of(who.log_path), q)
    }

    /// New entries from `offset` (`-f`).
    pub fn read_from(&self, who: &Who<'_>, offset: u64) -> io::Result<(Vec<LogEntry>, u64)> {
        let _ = self.ingest(who, false);
        journal::read_from(&AgentFiles::of(who.log_path), offset, 64 * 1024)
    }

    fn forward(&self, who: &Who<'_>, entries: &[LogEntry]) {
        if let Some(j) = &self.journald {
            for e in entries {
                j.send(who, e);
            }
        }
    }
}

fn load_offsets(path: &Path) -> Offsets {
    std::fs::read(path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

fn store_offsets(path: &Path, o: Offsets) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("offsets.tmp");
    let body = serde_json::to_vec(&o).unwrap_or_default();
    let done = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o640)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)
        .and_then(|mut f| f.write_all(&body))
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = done {
        warn!("{}: {e}", path.display());
    }
}

/// Read the new part of one stream's file from `off`, push its lines to `out`, and return the
/// offset consumed to, and whether more is there than was read (the per-round cap) or the file
/// could not be read this time. A file shorter than `off` (the agent truncated it) is read from 0.
fn take(
    path: &Path,
    off: u64,
    stream: &str,
    all: bool,
    limits: &Limits,
    now: u64,
    out: &mut Vec<LogEntry>,
) -> (u64, bool) {
    // Unchanged since the last look (the other stream moved): no open. Anything else, a link
    // included, goes the way below.
    if unchanged(path, off) {
        return (off, false);
    }
    let mut f = match open_nofollow(path, false) {
        Ok(f) => f,
        // Not there, or a link (refused): nothing to take in until the agent's next start.
        Err(e) if e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ELOOP) => {
            return (off, false);
        }
        // A lease (EWOULDBLOCK), out of fds: tried again next round.
        Err(_) => return (off, true),
    };
    let Ok(len) = f.metadata().map(|m| m.len()) else {
        return (off, true);
    };
    let mut off = if len < off { 0 } else { off };
    if len == off {
        return (off, false);
    }
    let mut resync = false;
    if len - off > limits.backlog_max {
        let to = len - limits.per_round;
        out.push(LogEntry {
            time_us: now,
            stream: "agentosd".into(),
            message: format!(
                "{} bytes of {stream} skipped: the agent wrote more than its journal takes \
                 ({} per half second, --log-rate)",
                to - off,
                limits.per_round
            ),
        });
        off = to;
        resync = true;
    }
    let want = (len - off).min(limits.per_round) as usize;
    let mut buf = vec![0u8; want];
    let got = f
        .seek(SeekFrom::Start(off))
        .and_then(|_| f.read(&mut buf))
        .unwrap_or(0);
    buf.truncate(got);
    let more = (got as u64) < len - off;
    let mut used = 0usize;
    if resync {
        // Skipped into the middle of a line: start at the next one.
        match buf.iter().position(|b| *b == b'\n') {
            Some(nl) => used = nl + 1,
            None => return (off, more),
        }
    }
    while used < buf.len() {
        let rest = &buf[used..];
        let (line, step) = match rest.iter().position(|b| *b == b'\n') {
            Some(nl) if nl <= LINE_MAX => (&rest[..nl], nl + 1),
            _ if rest.len() >= LINE_MAX => (&rest[..LINE_MAX], LINE_MAX),
            _ if all => (rest, rest.len()),
            _ => break, // wait for the rest of the line
        };
        out.push(LogEntry {
            time_us: now,
            stream: stream.to_string(),
            message: String::from_utf8_lossy(line).into_owned(),
        });
        used += step;
    }
    let new = off + used as u64;
    give_back(path, off, new);
    (new, more)
}

/// Whether a stream's file is a plain file of `off` bytes, read to its end: one `lstat` (at
/// 10 000 agents looked at every half second, opening each file instead took a third of a CPU).
fn unchanged(path: &Path, off: u64) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_file() && m.len() == off)
}

/// Skip everything in a stream's file from `off` to its end, giving the space back; returns the
/// new offset (a file shorter than `off` was truncated by the agent: from 0).
fn skip_all(path: &Path, off: u64) -> u64 {
    let Ok(len) = open_nofollow(path, false).and_then(|f| f.metadata().map(|m| m.len())) else {
        return off;
    };
    let off = if len < off { 0 } else { off };
    give_back(path, off, len);
    len
}

/// Punch out the whole MiBs before `new` once reading crosses a MiB boundary: the agent keeps
/// appending at the (sparse) end, the disk keeps only what is unread.
fn give_back(path: &Path, old: u64, new: u64) {
    const MIB: u64 = 1 << 20;
    if new / MIB == old / MIB {
        return;
    }
    if let Ok(f) = open_nofollow(path, true) {
        let _ = rustix::fs::fallocate(
            &f,
            rustix::fs::FallocateFlags::PUNCH_HOLE | rustix::fs::FallocateFlags::KEEP_SIZE,
            0,
            new / MIB * MIB,
        );
    }
}

/// The agent's output files are its uid's: never wait on them. `O_NONBLOCK` makes an open that
/// would wait for a lease break (a lease the agent took, were its seccomp filter off) fail with
/// `EWOULDBLOCK` instead, and this round of intake skips the file.
fn open_nofollow(path: &Path, write: bool) -> io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(!write)
        .write(write)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::io::Write;

    fn who(p: &Path) -> Who<'_> {
        Who {
            id: "t/a",
            tenant: "t",
            name: "a",
            log_path: p,
        }
    }

    /// Append `b` to `p`, as an agent writes its output (rounds_tests.rs too).
    pub(in crate::logs) fn append(p: &Path, b: &[u8]) {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
            .unwrap()
            .write_all(b)
            .unwrap();
    }

    fn all(logs: &Logs, w: &Who<'_>) -> Vec<LogEntry> {
        logs.query(w, journal::Query::default()).unwrap().0
    }

    #[test]
    fn streams_notes_and_partial_lines() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.log");
        let files = AgentFiles::of(&p);
        let logs = Logs::default();
        let w = who(&p);
        append(&p, b"out 1\nagentosd: forged\nhalf");
        append(&files.stderr, b"err 1\n");
        logs.note(&w, "started", false);
        let got = all(&logs, &w);
        let view: Vec<(&str, &str)> = got
            .iter()
            .map(|e| (e.stream.as_str(), e.message.as_str()))
            .collect();
        assert_eq!(
            view,
            [
                ("stdout", "out 1"),
                ("stdout", "agentosd: forged"),
                ("stderr", "err 1"),
                ("agentosd", "started"),
            ]
        );
        // The partial line waits for its end, or for the agent's exit.
        append(&p, b" done\ntail");
        logs.note(&w, "exited", true);
        let got = all(&logs, &w);
        let msgs: Vec<&str> = got.iter().map(|e| e.message.as_str()).collect();
        assert_eq!(&msgs[4..], ["half done", "tail", "exited"]);
        assert!(got.windows(2).all(|p| p[0].time_us <= p[1].time_us));
        // A new keeper (daemon restart) goes on from the persisted offsets.
        append(&p, b"after restart\n");
        let again = Logs::default();
        let got = all(&again, &w);
        assert_eq!(got.len(), 8);
        assert_eq!(got[7].message, "after restart");
    }

    #[test]
    fn long_lines_backlog_and_rotation_are_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.log");
        let files = AgentFiles::of(&p);
        let limits = Limits {
            journal_max: 64 << 10,
            per_round: 32 << 10,
            backlog_max: 40 << 10,
        };
        let logs = Logs::new(limits, None);
        let w = who(&p);
        // One line of 20 KiB: cut at LINE_MAX.
        append(&p, &[b'x'; 20 << 10]);
        append(&p, b"\n");
        logs.ingest(&w, false);
        let got = all(&logs, &w);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].message.len(), LINE_MAX);
        assert_eq!(got[1].message.len(), (20 << 10) - LINE_MAX);
        // 100 KiB at once: more than the backlog allows, so the excess is skipped and said.
        let line = format!("{}\n", "y".repeat(99));
        append(&p, line.repeat(1024).as_bytes());
        // What one call takes in is bounded (the daemon's rounds add these up to round_max).
        let took = logs.ingest(&w, false);
        assert!(took > 0 && took <= limits.per_round, "{took}");
        let got = all(&logs, &w);
        let skipped = got
            .iter()
            .find(|e| e.stream == "agentosd" && e.message.contains("bytes of stdout skipped"))
            .expect("a note about the skipped output");
        assert!(!skipped.from_agent());
        // Rotation: the journal and its predecessor stay under twice the cap.
        for _ in 0..8 {
            append(&p, line.repeat(200).as_bytes());
            logs.ingest(&w, false);
        }
        let cur = std::fs::metadata(&files.journal).unwrap().len();
        let old = std::fs::metadata(files.journal_old()).unwrap().len();
        assert!(cur <= limits.journal_max && old <= limits.journal_max + (64 << 10));
        // The query still ends with the newest line.
        let (tail, _) = logs
            .query(
                &w,
                journal::Query {
                    lines: 3,
                    ..Default::default()
                },
            )
            .unwrap();
        assert_eq!(tail.len(), 3);
        assert_eq!(tail[2].message, "y".repeat(99));
    }

    #[test]
    fn truncated_by_the_agent_starts_over_and_time_filters() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.log");
        let logs = Logs::default();
        let w = who(&p);
        append(&p, b"one\ntwo\n");
        logs.ingest(&w, false);
        std::fs::write(&p, b"three\n").unwrap();
        logs.ingest(&w, false);
        let got = all(&logs, &w);
        let msgs: Vec<&str> = got.iter().map(|e| e.message.as_str()).collect();
        assert_eq!(msgs, ["one", "two", "three"]);
        let t = got[0].time_us;
        let q = |since_us, until_us| {
            logs.query(
                &w,
                journal::Query {
                    lines: 0,
                    since_us,
                    until_us,
                },
            )
            .unwrap()
            .0
            .len()
        };
        assert_eq!(q(t, 0), 3);
        assert_eq!(q(t + 3_600_000_000, 0), 0);
        assert_eq!(q(0, t - 1), 0);
    }
}
