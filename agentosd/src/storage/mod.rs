//! Disk full is a state, not an outage. The daemon keeps a reserve of free space on the file
//! systems of its audit log and its state directory ([`Reserve`]); a thread of its own checks
//! them with `statvfs(3)` every `--storage-check-interval` and at once after a write failed —
//! never per record. Below the reserve the daemon is in the **storage low** state: it refuses
//! first what costs disk and is not essential — new agent starts, and the tool calls of the
//! agents that made it write the most recently (the offenders, [`usage`]) — counts refusals in
//! one summary record per agent instead of one record each, and stops taking agents' output into
//! their journals. Tool calls of the other agents keep working while their audit records can be
//! written: the reserve is theirs. When a write fails for want of space the audit log stops
//! (fail closed: a call whose record is not durable does not run), and this thread opens it again
//! once space returns; everything recovers without a restart. The state is the Manager's
//! `StorageState` on D-Bus (signalled once per change), `agentctl status` and `agentosd check`,
//! and one line in the daemon's log per transition. See docs/daemon.md, "Storage reserve".
//!
//! What an agent writes itself (its home, its tools' scratch, as its own uid) the daemon does not
//! see being written: it is bounded by the agent's disk quota ([`quota`]), and while storage is
//! low the uids' quota usage (`Q_GETQUOTA`) makes the agents owning the most of the state file
//! system offenders too ([`usage::owners`]).

pub mod quota;
pub mod reserve;
pub mod usage;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::Serialize;
use tracing::{info, warn};

pub use reserve::{Reserve, Space, human};
pub use usage::Summary;

use crate::sys::SyscallError;

/// Default of `--storage-check-interval`: one `statvfs` per watched file system a second
/// (about 1 µs each here, docs/benchmarks.md), so a flood at 4 MiB/s eats at most 4 MiB of the
/// reserve before the daemon sees it.
pub const DEFAULT_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// A log that stopped for want of space is reopened once its file system has this much free
/// again (below it, the reopened log would fail at its first batch).
pub const RECOVER_FLOOR: u64 = 1 << 20;

/// While low, the refusals counted are written as summary records this often.
const SUMMARY_EVERY: Duration = Duration::from_secs(10);

/// `statvfs(2)` of `path`: its file system's size and the space unprivileged writers may use.
pub fn space(path: &Path) -> Result<Space, SyscallError> {
    let s = rustix::fs::statvfs(path)
        .map_err(|e| SyscallError::new("statvfs", path.display().to_string(), e.into()))?;
    let frsize = if s.f_frsize > 0 {
        s.f_frsize
    } else {
        s.f_bsize
    };
    Ok(Space {
        total: s.f_blocks.saturating_mul(frsize),
        avail: s.f_bavail.saturating_mul(frsize),
    })
}

/// The device of `path` (two watched directories on one file system are checked once).
fn device(path: &Path) -> Option<u64> {
    rustix::fs::stat(path).ok().map(|s| s.st_dev)
}

/// `dir`, or its nearest ancestor that exists (a directory not made yet will be made on the
/// file system of its parent).
fn existing(dir: &Path) -> PathBuf {
    dir.ancestors()
        .find(|a| a.exists())
        .unwrap_or(dir)
        .to_path_buf()
}

/// One watched file system at the last check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Reading {
    /// What the daemon keeps there: `audit`, `state` (both when they share it).
    pub roles: Vec<String>,
    /// The first watched directory on it.
    pub path: PathBuf,
    pub total: u64,
    pub free: u64,
    /// Its reserve in bytes.
    pub reserve: u64,
    pub low: bool,
    /// Why it could not be read (then it is not counted as low: the writes will tell).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Reading {
    /// `/var/lib/agentos (audit, state): 12.0 MiB free of 24.0 MiB, reserve 16.0 MiB`.
    pub fn describe(&self) -> String {
        match &self.error {
            Some(e) => format!("{} ({}): {e}", self.path.display(), self.roles.join(", ")),
            None => format!(
                "{} ({}): {} free of {}, reserve {}",
                self.path.display(),
                self.roles.join(", "),
                human(self.free),
                human(self.total),
                human(self.reserve)
            ),
        }
    }
}

/// The state as the D-Bus properties, `agentctl status` and `agentosd check` show it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Status {
    pub low: bool,
    pub file_systems: Vec<Reading>,
}

impl Status {
    /// `normal` or `low` (the `StorageState` property).
    pub fn state(&self) -> &'static str {
        if self.low { "low" } else { "normal" }
    }

    /// The reading that matters most: the first low one, else the one with the least room
    /// above its reserve.
    pub fn worst(&self) -> Option<&Reading> {
        self.file_systems
            .iter()
            .filter(|r| r.error.is_none())
            .min_by_key(|r| (!r.low, r.free.saturating_sub(r.reserve)))
    }

    /// Free bytes on the file system holding `role` (`audit`, `state`), if it was read.
    pub fn free_of(&self, role: &str) -> Option<u64> {
        self.file_systems
            .iter()
            .find(|r| r.error.is_none() && r.roles.iter().any(|x| x == role))
            .map(|r| r.free)
    }

    /// Free bytes on the worst file system (`StorageFree`).
    pub fn free(&self) -> u64 {
        self.worst().map_or(0, |r| r.free)
    }

    /// Its reserve (`StorageReserve`).
    pub fn reserve(&self) -> u64 {
        self.worst().map_or(0, |r| r.reserve)
    }

    /// One line: `low: /var/lib/agentos (audit, state): 12.0 MiB free of 24.0 MiB, reserve 16.0 MiB`.
    pub fn describe(&self) -> String {
        match self.worst() {
            Some(r) => format!("{}: {}", self.state(), r.describe()),
            None => match self.file_systems.first() {
                Some(r) => format!("{}: {}", self.state(), r.describe()),
                None => format!("{}: not checked yet", self.state()),
            },
        }
    }
}

/// The watcher (one per daemon).
pub struct Storage {
    reserve: Reserve,
    interval: Duration,
    /// (role, directory).
    watched: Vec<(&'static str, PathBuf)>,
    low: AtomicBool,
    status: Mutex<Status>,
    usage: Mutex<usage::Usage>,
    /// Agents' uids (registered at each start and re-adoption), for their quota usage.
    uids: Mutex<std::collections::HashMap<String, u32>>,
    /// While low: the agents owning the most of the state file system (their uids' files).
    owners: Mutex<Vec<(String, u64)>>,
    refusals: Mutex<(usage::Refusals, Instant)>,
    /// A write failed: check now.
    kicked: AtomicBool,
    thread: Mutex<Option<std::thread::Thread>>,
    changes: tokio::sync::watch::Sender<Status>,
}

impl std::fmt::Debug for Storage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Storage")
            .field("reserve", &self.reserve)
            .field("watched", &self.watched)
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Storage {
    /// Watch `audit_dir` and `state_dir` (created by the caller) with `reserve`, checking every
    /// `interval`. Checks once at once.
    pub fn new(
        reserve: Reserve,
        interval: Duration,
        audit_dir: &Path,
        state_dir: &Path,
    ) -> Arc<Self> {
        let now = Instant::now();
        let s = Arc::new(Storage {
            reserve,
            interval: interval.max(Duration::from_millis(10)),
            watched: vec![
                ("audit", audit_dir.to_path_buf()),
                ("state", state_dir.to_path_buf()),
            ],
            low: AtomicBool::new(false),
            status: Mutex::default(),
            usage: Mutex::new(usage::Usage::new(now)),
            uids: Mutex::default(),
            owners: Mutex::default(),
            refusals: Mutex::new((usage::Refusals::default(), now)),
            kicked: AtomicBool::new(false),
            thread: Mutex::new(None),
            changes: tokio::sync::watch::Sender::new(Status::default()),
        });
        s.check();
        s
    }

    pub fn reserve(&self) -> Reserve {
        self.reserve
    }

    /// Whether the daemon is in the storage low state (an atomic load: cheap on every path).
    pub fn is_low(&self) -> bool {
        self.low.load(Ordering::Relaxed)
    }

    /// The state at the last check.
    pub fn status(&self) -> Status {
        lock(&self.status).clone()
    }

    /// Changes of the state (low ↔ normal), for the D-Bus signal.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<Status> {
        self.changes.subscribe()
    }

    /// `statvfs` every watched file system now; on a change of state, say so once in the log
    /// and to [`Storage::subscribe`]rs. Returns the new status.
    pub fn check(&self) -> Status {
        let was = self.is_low();
        let mut seen: Vec<(Option<u64>, Reading)> = Vec::new();
        let previous = self.status();
        for (role, dir) in &self.watched {
            let dir = &existing(dir);
            let dev = device(dir);
            if let Some((_, r)) = seen.iter_mut().find(|(d, _)| d.is_some() && *d == dev) {
                r.roles.push((*role).to_string());
                continue;
            }
            let was_low = previous
                .file_systems
                .iter()
                .any(|r| r.low && r.path == *dir);
            let reading = match space(dir) {
                Ok(sp) => Reading {
                    roles: vec![(*role).to_string()],
                    path: dir.clone(),
                    total: sp.total,
                    free: sp.avail,
                    reserve: self.reserve.bytes_for(sp.total),
                    low: self.reserve.is_low(sp, was_low),
                    error: None,
                },
                Err(e) => Reading {
                    roles: vec![(*role).to_string()],
                    path: dir.clone(),
                    total: 0,
                    free: 0,
                    reserve: 0,
                    low: false,
                    error: Some(e.to_string()),
                },
            };
            seen.push((dev, reading));
        }
        let status = Status {
            low: seen.iter().any(|(_, r)| r.low),
            file_systems: seen.into_iter().map(|(_, r)| r).collect(),
        };
        *lock(&self.status) = status.clone();
        *lock(&self.owners) = if status.low {
            self.read_owners(&status)
        } else {
            Vec::new()
        };
        self.low.store(status.low, Ordering::Relaxed);
        if status.low != was {
            let fs = status
                .worst()
                .map_or_else(|| "no reading".into(), Reading::describe);
            if status.low {
                warn!(
                    "storage low: {fs}; refusing new agent starts and the tool calls of the agents writing the most, summarising refusals, not taking agents' output into their journals until space returns (--storage-reserve)"
                );
            } else {
                info!("storage back to normal: {fs}; agent starts, tool calls and journals resume");
            }
            self.changes.send_replace(status.clone());
        }
        status
    }

    /// Remember that agent `id` runs as `uid` (its files on the state file system are its own).
    pub fn register_uid(&self, id: &str, uid: u32) {
        let mut g = lock(&self.uids);
        if g.contains_key(id) || g.len() < usage::MAX_AGENTS {
            g.insert(id.to_string(), uid);
        }
    }

    /// The audit directory watched.
    pub fn audit_dir(&self) -> Option<&Path> {
        self.watched
            .iter()
            .find(|(r, _)| *r == "audit")
            .map(|(_, d)| d.as_path())
    }

    /// The uid registered for agent `id`.
    pub fn uid_of(&self, id: &str) -> Option<u32> {
        lock(&self.uids).get(id).copied()
    }

    /// The state directory watched.
    fn state_dir(&self) -> Option<&Path> {
        self.watched
            .iter()
            .find(|(r, _)| *r == "state")
            .map(|(_, d)| d.as_path())
    }

    /// Every registered agent's bytes on the state file system (`Q_GETQUOTA` of its uid: one
    /// system call each, only while low), ranked by [`usage::owners`]. Empty where the file
    /// system has no quotas.
    fn read_owners(&self, status: &Status) -> Vec<(String, u64)> {
        let Some(dir) = self.state_dir() else {
            return Vec::new();
        };
        let Ok(q) = quota::probe(dir) else {
            return Vec::new();
        };
        if matches!(q.support, quota::Support::Unavailable(_)) {
            return Vec::new();
        }
        let owned: Vec<(String, u64)> = lock(&self.uids)
            .iter()
            .filter_map(|(id, uid)| q.usage(*uid).ok().map(|u| (id.clone(), u.bytes)))
            .collect();
        let total = status
            .file_systems
            .iter()
            .find(|r| r.roles.iter().any(|x| x == "state"))
            .map_or(q.size.bytes, |r| r.total);
        usage::owners(&owned, total)
    }

    /// A write failed (perhaps for want of space): check at once rather than at the next tick.
    pub fn kick(&self) {
        self.kicked.store(true, Ordering::Relaxed);
        if let Some(t) = lock(&self.thread).as_ref() {
            t.unpark();
        }
    }

    /// Why a new start of agent `id` is refused, if it is: storage is low. (Its `refused`
    /// record is then counted for the agent's summary by the audit trail.)
    pub fn refuse_start(&self, id: &str) -> Result<(), String> {
        if !self.is_low() {
            return Ok(());
        }
        Err(format!(
            "agent {id}: not started: storage low: {}; agentosd refuses new agent starts until free space is back above the reserve (free space there, or lower --storage-reserve / --storage-reserve-percent)",
            self.status()
                .worst()
                .map_or_else(|| "no reading".into(), Reading::describe)
        ))
    }

    /// Why a request of agent `id` is refused, if it is: storage is low and the agent is one of
    /// those that made the daemon write the most recently. Counted for its summary.
    pub fn refuse_request(&self, id: &str) -> Option<String> {
        if !self.is_low() {
            return None;
        }
        let now = Instant::now();
        let offenders = lock(&self.usage).offenders(now);
        let fs = self
            .status()
            .worst()
            .map_or_else(|| "no reading".into(), Reading::describe);
        if let Some((_, bytes)) = offenders.iter().find(|(o, _)| o == id) {
            self.count_refusal(id, "storage-low");
            return Some(format!(
                "refused: storage low: {fs}; agent {id} made agentosd write {} in the last {} s, the most of any agent, so its requests are refused first until space returns",
                human(*bytes),
                2 * usage::WINDOW.as_secs()
            ));
        }
        let bytes = lock(&self.owners).iter().find(|(o, _)| o == id)?.1;
        self.count_refusal(id, "storage-low");
        Some(format!(
            "refused: storage low: {fs}; agent {id} owns {} there (its uid's files: its home, its tools' scratch; user quota usage), the most of any agent, so its requests are refused first until space returns",
            human(bytes)
        ))
    }

    /// Charge `bytes` the daemon wrote for agent `id` (audit records, journal).
    pub fn charge(&self, id: &str, bytes: u64) {
        lock(&self.usage).charge(id, bytes, Instant::now());
    }

    /// The agents writing the most, then those owning the most of the state file system not
    /// already named, while low (empty otherwise).
    pub fn offenders(&self) -> Vec<(String, u64)> {
        if !self.is_low() {
            return Vec::new();
        }
        let mut all = lock(&self.usage).offenders(Instant::now());
        for (id, b) in lock(&self.owners).iter() {
            if !all.iter().any(|(o, _)| o == id) {
                all.push((id.clone(), *b));
            }
        }
        all
    }

    /// While low: count a refusal of `agent` (`what` it was) for its summary record instead of
    /// writing a record of its own; returns whether it was counted.
    pub fn summarise(&self, agent: &str, what: &str) -> bool {
        if !self.is_low() {
            return false;
        }
        self.count_refusal(agent, what);
        true
    }

    /// Put a summary that could not be written back into the counts (its window starts
    /// again): it goes out with the next summaries.
    pub fn restore_summary(&self, s: &Summary) {
        let now = Instant::now();
        let mut g = lock(&self.refusals);
        for (what, n) in &s.by {
            g.0.count_n(&s.agent, what, *n, now);
        }
    }

    fn count_refusal(&self, agent: &str, what: &str) {
        lock(&self.refusals).0.count(agent, what, Instant::now());
    }

    /// The summaries due: every [`SUMMARY_EVERY`] while low, and all at once when `now_normal`.
    pub fn due_summaries(&self, now_normal: bool) -> Vec<Summary> {
        let mut g = lock(&self.refusals);
        let now = Instant::now();
        if g.0.is_empty() || (!now_normal && now.saturating_duration_since(g.1) < SUMMARY_EVERY) {
            return Vec::new();
        }
        g.1 = now;
        g.0.take(now)
    }

    /// Check on a thread of its own every interval (and when kicked); after each check, `tick`
    /// runs with the status (the daemon recovers the audit log and writes the summaries there).
    pub fn spawn(self: &Arc<Self>, tick: impl Fn(&Storage, &Status) + Send + 'static) {
        let me = Arc::downgrade(self);
        let interval = self.interval;
        let spawned = std::thread::Builder::new()
            .name("storage".into())
            .spawn(move || {
                if let Some(s) = me.upgrade() {
                    *lock(&s.thread) = Some(std::thread::current());
                }
                loop {
                    std::thread::park_timeout(interval);
                    let Some(s) = me.upgrade() else { return };
                    s.kicked.store(false, Ordering::Relaxed);
                    let st = s.check();
                    tick(&s, &st);
                }
            });
        if let Err(e) = spawned {
            warn!(
                "storage watcher thread: {e}; the storage reserve is checked only at start (the audit log does not reopen by itself after a full disk)"
            );
        }
    }
}

/// The line `agentosd check` prints: each watched file system with its free space and reserve,
/// and whether the daemon would be in the storage low state.
pub fn check_line(reserve: Reserve, audit_dir: &Path, state_dir: &Path) -> String {
    let s = Storage::new(reserve, DEFAULT_CHECK_INTERVAL, audit_dir, state_dir);
    let st = s.status();
    let fs: Vec<String> = st
        .file_systems
        .iter()
        .map(|r| {
            let mark = match (&r.error, r.low) {
                (Some(_), _) => "not readable",
                (None, true) => "LOW",
                (None, false) => "ok",
            };
            format!("{} [{mark}]", r.describe())
        })
        .collect();
    let what = if st.low {
        "LOW: new agent starts would be refused, and the tool calls of the agents writing the most"
    } else {
        "ok"
    };
    format!("storage reserve: {what}; {}", fs.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_reading_per_file_system_and_a_reserve_never_met_is_low() {
        let dir = tempfile::tempdir().unwrap();
        let audit = dir.path().join("audit");
        std::fs::create_dir_all(&audit).unwrap();
        let huge = Reserve {
            min_bytes: u64::MAX,
            min_percent: 0.0,
        };
        let s = Storage::new(huge, DEFAULT_CHECK_INTERVAL, &audit, dir.path());
        let st = s.status();
        assert_eq!(st.file_systems.len(), 1, "{st:?}");
        assert_eq!(st.file_systems[0].roles, vec!["audit", "state"]);
        assert!(
            s.is_low(),
            "a reserve as large as the file system is never met"
        );
        assert_eq!(st.state(), "low");
        let why = s.refuse_start("acme/a").unwrap_err();
        assert!(why.contains("storage low"), "{why}");
        assert!(why.contains(&audit.display().to_string()), "{why}");
        assert!(why.contains("reserve"), "{why}");
        // Nobody wrote anything: nobody is an offender.
        assert_eq!(s.refuse_request("acme/a"), None);
        s.charge("acme/flood", 1 << 20);
        let msg = s.refuse_request("acme/flood").unwrap();
        assert!(
            msg.contains("acme/flood") && msg.contains("1.0 MiB"),
            "{msg}"
        );
        assert!(s.summarise("acme/flood", "gate"));
        let sums = s.due_summaries(true);
        let f = sums.iter().find(|x| x.agent == "acme/flood").unwrap();
        assert_eq!(f.by["storage-low"], 1);
        assert_eq!(f.by["gate"], 1);
    }

    #[test]
    fn a_zero_reserve_is_normal_and_refuses_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let none = Reserve {
            min_bytes: 0,
            min_percent: 0.0,
        };
        let s = Storage::new(none, DEFAULT_CHECK_INTERVAL, dir.path(), dir.path());
        assert!(!s.is_low());
        assert!(s.refuse_start("acme/a").is_ok());
        s.charge("acme/flood", 1 << 30);
        assert_eq!(s.refuse_request("acme/flood"), None);
        assert!(!s.summarise("acme/flood", "gate"));
        assert!(s.status().describe().starts_with("normal: "));
    }

    #[test]
    fn missing_and_unreadable_directories() {
        // A directory not made yet is read on the file system it will be made on.
        let s = Storage::new(
            Reserve::default(),
            DEFAULT_CHECK_INTERVAL,
            Path::new("/nonexistent/agentos-audit"),
            Path::new("/nonexistent/agentos-state"),
        );
        let st = s.status();
        assert_eq!(st.file_systems[0].path, Path::new("/"));
        assert!(st.file_systems[0].error.is_none(), "{st:?}");
        // One that cannot be read at all is reported, not low (the writes will tell).
        let s = Storage::new(
            Reserve::default(),
            DEFAULT_CHECK_INTERVAL,
            Path::new(""),
            Path::new(""),
        );
        let st = s.status();
        assert!(!st.low);
        assert!(
            st.file_systems[0]
                .error
                .as_deref()
                .unwrap()
                .contains("statvfs"),
            "{st:?}"
        );
    }

    /// The cost of one check, printed for docs/benchmarks.md (`cargo test -p agentosd --lib
    /// storage::tests::statvfs_cost -- --nocapture`).
    #[test]
    fn statvfs_cost() {
        let dir = tempfile::tempdir().unwrap();
        let n = 20_000u32;
        let t = Instant::now();
        for _ in 0..n {
            space(dir.path()).unwrap();
        }
        let per = t.elapsed() / n;
        println!("statvfs: {per:?} per call ({n} calls)");
        assert!(per < Duration::from_millis(1), "{per:?}");
    }
}
