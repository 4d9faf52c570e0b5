//! Host paths kept open between agent starts, for their Landlock rules.
//!
//! Opening the paths of a Landlock plan was the largest part of a start's preparation
//! (docs/benchmarks.md, "Agent sandbox start"): the baseline alone is ~30 paths, each resolved
//! component by component ([`safe_fs::resolve_trusted`]) on every start. What most of them
//! resolve to cannot change unless root changes it, so the daemon keeps their `O_PATH` fds.
//!
//! **What is cached.** Only a path *only root could make resolve elsewhere*: every directory
//! its resolution walked, from `/`, through any link it followed (the baseline's `/bin` →
//! `usr/bin`), to the last component when that is a directory, is owned by root and writable
//! by root alone, and no `..` was walked ([`safe_fs::Walk::root_only`]). Renaming, replacing,
//! linking or mounting anything along such a path needs root. Never cached: anything beneath
//! an agent's home or a tool's scratch directory (those are opened beneath the daemon's own
//! fd on every start and never reach this cache), and any path through a directory an agent
//! uid, a group or everyone could write (`/tmp/x`, a 0777 or a user's directory): those are
//! resolved on every start as before.
//!
//! **Checked on every use.** Before a cached fd goes into a ruleset, each object of its walk is
//! `lstat`ed again (no link followed at the end; each prefix is itself in the walk) and must
//! be the same inode on the same device, of the same type, a directory still root's alone. Any
//! difference (root renamed another tree into place, changed a link, mounted over it, made a
//! directory writable by others) drops the entry and the path is resolved afresh the safe way,
//! as without a cache: an operator's change is picked up by the next start without a restart.
//! Objects shared by several paths (`/`, `/usr`) are checked once per ruleset.
//! Walks that the path watch ([`super::path_watch`]) has seen nothing change since their last
//! check are served without the `lstat`s.
//!
//! **Bounded.** At most [`MAX_ENTRIES`] paths (one fd each); beyond that paths are resolved
//! every time. Paths found not cacheable are remembered as such (up to the same bound) so their
//! walk is not repeated; they are still resolved on every use.

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::path_watch::PathWatch;
use crate::safe_fs::{self, SafeFsError, Seen, Walk};

/// Paths kept at most (each holds one `O_PATH` fd).
pub const MAX_ENTRIES: usize = 256;

/// Set to `off` to resolve every path on every start (for measurements; docs/daemon.md).
pub const ENV_SWITCH: &str = "AGENTOSD_PATH_CACHE";

/// A path resolved and opened: its fd, whether it is a directory, and its walk.
#[derive(Debug)]
pub struct Entry {
    pub fd: OwnedFd,
    pub is_dir: bool,
    walk: Walk,
    /// The path watch's generation in which every object of the walk was checked and watched
    /// (0: never): while it is the watch's current one, the walk holds without an `lstat`.
    certified: AtomicU64,
}

#[derive(Debug, Clone)]
enum Slot {
    Cached(Arc<Entry>),
    /// Resolved through something not root's alone: resolved on every use.
    Uncacheable,
}

/// How a path is resolved: following root's links ([`safe_fs::resolve_trusted`], the baseline
/// and a tool's runtime) or no link at all ([`safe_fs::open_no_links`], a contract's scope).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Resolve {
    RootLinks,
    NoLinks,
}

/// What happened to the paths asked for (for tests and `agentosd check`-style reporting).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    /// Served from the cache after its walk checked out.
    pub hits: u64,
    /// Resolved and kept.
    pub stored: u64,
    /// Found changed on use, dropped and resolved again.
    pub dropped: u64,
    /// Resolved without keeping them (not root's alone, or the cache full).
    pub resolved: u64,
}

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    stored: AtomicU64,
    dropped: AtomicU64,
    resolved: AtomicU64,
}

pub struct PathCache {
    slots: Mutex<HashMap<(PathBuf, Resolve), Slot>>,
    enabled: Switch,
    n: Counters,
}

/// The on/off switch of something that only saves a start time (this cache, the ruleset pool).
#[derive(Debug)]
pub struct Switch(AtomicBool);

impl Switch {
    pub fn new(on: bool) -> Switch {
        Switch(AtomicBool::new(on))
    }

    /// On unless the environment variable `var` is `off` or `0`.
    pub fn from_env(var: &str) -> Switch {
        Switch::new(!std::env::var(var).is_ok_and(|v| v == "off" || v == "0"))
    }

    pub fn on(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    pub fn set(&self, on: bool) {
        self.0.store(on, Ordering::Relaxed);
    }
}

/// An fd for a Landlock rule: the cache's (shared) or opened for this start.
#[derive(Debug)]
pub enum RuleFd {
    Shared(Arc<Entry>),
    Own(OwnedFd),
}

impl AsFd for RuleFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            RuleFd::Shared(e) => e.fd.as_fd(),
            RuleFd::Own(f) => f.as_fd(),
        }
    }
}

/// `lstat` results of one ruleset's checks: objects shared by several paths are checked once,
/// and objects the path watch has certified unchanged are not checked at all ([`super::path_watch`]).
pub struct Checked<'w> {
    stats: HashMap<PathBuf, Option<rustix::fs::Stat>>,
    watch: Option<&'w PathWatch>,
    /// The watch's generation after its sync for this ruleset (`None`: not synced yet, or the
    /// watch off).
    synced: Option<Option<u64>>,
}

impl Default for Checked<'static> {
    /// Checks with the daemon's watch ([`PathWatch::global`]).
    fn default() -> Self {
        Checked::with_watch(Some(PathWatch::global()))
    }
}

impl<'w> Checked<'w> {
    /// Checks with `watch` (`None`: every object by `lstat`).
    pub fn with_watch(watch: Option<&'w PathWatch>) -> Checked<'w> {
        Checked {
            stats: HashMap::new(),
            watch,
            synced: None,
        }
    }

    /// Whether `entry`'s walk still holds: the check [`PathCache::open`] makes before serving it
    /// (the ruleset pool makes it again before a start takes a ruleset built ahead).
    pub fn holds_entry(&mut self, entry: &Entry) -> bool {
        let watch = self.watch;
        // One sync per ruleset: what changed since the last one uncertifies what it touched.
        let generation = match (watch, self.synced) {
            (Some(w), None) => {
                let g = w.sync();
                self.synced = Some(g);
                g
            }
            (_, Some(g)) => g,
            (None, None) => None,
        };
        let (Some(w), Some(g)) = (watch, generation) else {
            return self.lstat_all(&entry.walk);
        };
        if entry.certified.load(Ordering::Acquire) == g {
            w.served(entry.walk.seen.len());
            return true;
        }
        // Watches go on before the `lstat`s they are to vouch for (path_watch.rs, "Order").
        let seen: Vec<&Seen> = entry.walk.seen.iter().collect();
        let armed = w.arm(g, &seen);
        let ok = self.lstat_all(&entry.walk);
        if ok && armed == seen.len() {
            w.certify(g, seen.len(), || {
                entry.certified.store(g, Ordering::Release)
            });
        }
        ok
    }

    /// Each object of `walk` checked by `lstat` (once per ruleset).
    fn lstat_all(&mut self, walk: &Walk) -> bool {
        walk.seen.iter().all(|s| {
            self.stats
                .entry(s.path.clone())
                .or_insert_with(|| safe_fs::lstat(&s.path).ok())
                .as_ref()
                .is_some_and(|st| s.still(st))
        })
    }
}

impl Default for PathCache {
    fn default() -> Self {
        PathCache::new(true)
    }
}

impl PathCache {
    pub fn new(enabled: bool) -> PathCache {
        PathCache {
            slots: Mutex::new(HashMap::new()),
            enabled: Switch::new(enabled),
            n: Counters::default(),
        }
    }

    /// The daemon's cache: on unless [`ENV_SWITCH`] is `off` (or `0`) at its first use.
    pub fn global() -> &'static PathCache {
        static G: std::sync::OnceLock<PathCache> = std::sync::OnceLock::new();
        G.get_or_init(|| PathCache::new(Switch::from_env(ENV_SWITCH).on()))
    }

    pub fn enabled(&self) -> bool {
        self.enabled.on()
    }

    /// Switch the cache on or off (off: every path is resolved on every use; entries are kept).
    pub fn set_enabled(&self, on: bool) {
        self.enabled.set(on);
    }

    pub fn stats(&self) -> Stats {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Stats {
            hits: g(&self.n.hits),
            stored: g(&self.n.stored),
            dropped: g(&self.n.dropped),
            resolved: g(&self.n.resolved),
        }
    }

    /// How many paths hold an fd.
    pub fn len(&self) -> usize {
        self.lock()
            .values()
            .filter(|s| matches!(s, Slot::Cached(_)))
            .count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(PathBuf, Resolve), Slot>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An fd of `path` for a rule and whether it is a directory: the cached one when its walk
    /// still holds, else resolved afresh with `how` (and kept when only root could change it).
    /// Errors and a missing path are exactly those of the resolution without a cache.
    pub fn open(
        &self,
        path: &Path,
        how: Resolve,
        checked: &mut Checked<'_>,
    ) -> Result<(RuleFd, bool), SafeFsError> {
        let key = (path.to_path_buf(), how);
        let slot = self.lock().get(&key).cloned();
        match slot {
            Some(Slot::Cached(e)) => {
                if checked.holds_entry(&e) {
                    self.n.hits.fetch_add(1, Ordering::Relaxed);
                    let dir = e.is_dir;
                    return Ok((RuleFd::Shared(e), dir));
                }
                self.n.dropped.fetch_add(1, Ordering::Relaxed);
                let mut slots = self.lock();
                if matches!(slots.get(&key), Some(Slot::Cached(cur)) if Arc::ptr_eq(cur, &e)) {
                    slots.remove(&key);
                }
            }
            Some(Slot::Uncacheable) => {
                self.n.resolved.fetch_add(1, Ordering::Relaxed);
                let fd = resolve_plain(path, how)?;
                let dir = is_dir(&fd);
                return Ok((RuleFd::Own(fd), dir));
            }
            None => {}
        }
        let (fd, walk) = resolve_walk(path, how)?;
        let is_dir = is_dir(&fd);
        let keep = walk.as_ref().is_some_and(Walk::root_only);
        let mut slots = self.lock();
        if slots.len() >= MAX_ENTRIES {
            drop(slots);
            self.n.resolved.fetch_add(1, Ordering::Relaxed);
            return Ok((RuleFd::Own(fd), is_dir));
        }
        if !keep {
            slots.insert(key, Slot::Uncacheable);
            drop(slots);
            self.n.resolved.fetch_add(1, Ordering::Relaxed);
            return Ok((RuleFd::Own(fd), is_dir));
        }
        let e = Arc::new(Entry {
            fd,
            is_dir,
            walk: walk.unwrap_or_default(),
            certified: AtomicU64::new(0),
        });
        slots.insert(key, Slot::Cached(e.clone()));
        drop(slots);
        self.n.stored.fetch_add(1, Ordering::Relaxed);
        Ok((RuleFd::Shared(e), is_dir))
    }
}

fn is_dir(fd: &OwnedFd) -> bool {
    rustix::fs::fstat(fd).is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR)
}

fn resolve_plain(path: &Path, how: Resolve) -> Result<OwnedFd, SafeFsError> {
    match how {
        Resolve::RootLinks => safe_fs::resolve_trusted(path).map(|(fd, _)| fd),
        Resolve::NoLinks => safe_fs::open_no_links(path),
    }
}

/// The fd, and the walk when it could be taken (`None`: not cacheable).
fn resolve_walk(path: &Path, how: Resolve) -> Result<(OwnedFd, Option<Walk>), SafeFsError> {
    match how {
        Resolve::RootLinks => safe_fs::resolve_trusted_walk(path).map(|(fd, _, w)| (fd, Some(w))),
        Resolve::NoLinks => {
            let fd = safe_fs::open_no_links(path)?;
            let w = safe_fs::walk_of(path, &fd);
            Ok((fd, w))
        }
    }
}

#[cfg(test)]
#[path = "path_cache_tests.rs"]
pub(super) mod tests;
