//! The ingest thread's rounds: which agents' files to look at every half second.
//!
//! Looking at every agent's two streams each round cost one `lstat` per stream per half second:
//! at 10 000 idle agents 40 000 a second, 14% of a CPU (docs/benchmarks.md). An idle agent
//! should cost nothing, so a round looks only at agents whose files the kernel says changed:
//!
//! - **Watched.** One inotify instance watches each tenant's log directory (the parent of its
//!   agents' [`Who::log_path`]) for a file modified (a write, a truncation, `fallocate`),
//!   created, deleted or moved in or out. An event's name maps back to the agent it belongs to
//!   (`<name>.log` and `<name>.stderr.log` in the tenant's directory): that agent is looked at.
//!   The name is only a key; the files looked at are the agents' own, from their `Who`. The
//!   daemon's own files there are read past, but fill the queue too: a look that took
//!   something in appends to the journal and writes the offsets (a new file renamed over the
//!   old one): about five events.
//!   So with thousands of agents writing every half second the queue overflows and the rounds
//!   are full, as before the watch; idle agents make no event at all.
//! - **Fail safe: a full round.** The first round, a queue overflow, more events than a round
//!   reads ([`MAX_EVENTS`]), a watch removed (`IN_IGNORED`: its directory deleted or its file
//!   system gone), an event on a watch this round does not know, a tenant directory deleted or
//!   moved, a failed read, no inotify instance (`inotify_init1` failed; tried again every
//!   [`SWEEP_ROUNDS`] rounds), or the last round's byte cap reached: every agent is looked at,
//!   as without the watch, and after a lost event every watch is added again (an `IN_IGNORED`
//!   may have been lost; the same directory gives the same watch back). A tenant directory
//!   whose watch cannot be added (not made yet, or `fs.inotify.max_user_watches` reached) has
//!   its agents looked at every round until it is (tried again each round, or every
//!   [`SWEEP_ROUNDS`] rounds after another error than `ENOENT`); the round a watch is added,
//!   its agents are looked at (what they wrote before).
//! - **New agents** are looked at in the first round that lists them, after their tenant's
//!   directory is watched: their files may hold output from a previous run.
//! - **A slow sweep**: each round also looks at the next `ceil(agents / SWEEP_ROUNDS)` agents in
//!   turn, so each is looked at at least every [`SWEEP_ROUNDS`] rounds (10 s) even if an event
//!   were lost (a write through a hard link made elsewhere reports to that link's directory).
//!   At 10 000 idle agents: 1 000 `lstat`s a second instead of 40 000; ten seconds because a
//!   lost event is an exception (the watch sees every write through the file the agent
//!   inherits), and the cost falls with it.
//! - **Bounded.** Events are read through a fixed buffer, at most [`MAX_EVENTS`] a round (more:
//!   a full round; the rest of the queue, bounded by the kernel's `max_queued_events`, is read
//!   by the next rounds); at most [`MAX_WATCHES`] watches; the agents to look at are a set no
//!   larger than the agents listed (more: a full round), each looked at once a round however
//!   much it writes. A look takes at most `per_round` bytes of a stream, a round at most
//!   [`Logs::round_max`]: the next round starts with the agents this one did not reach (a full
//!   round). An agent with more than a look took (its backlog) is looked at again next round
//!   without an event.

use std::collections::{HashMap, HashSet};
use std::ffi::CStr;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;

use rustix::fs::inotify::{self, ReadFlags, WatchFlags};
use tracing::{debug, warn};

use super::{Logs, Who};

/// Events read in one round at most: more make it a full round.
pub const MAX_EVENTS: usize = 8192;

/// Tenant directories watched at most (each watch is kernel memory charged to root's
/// `fs.inotify.max_user_watches`); the agents of one more are looked at every round.
pub const MAX_WATCHES: usize = 65_536;

/// Every agent is looked at at least every this many rounds (10 s at two rounds a second),
/// events or not; a failed `inotify_init1` or `inotify_add_watch` is tried again this often.
pub const SWEEP_ROUNDS: usize = 20;

/// What the watch reports on a tenant's log directory: an entry's size may have changed
/// (modified, created, deleted, moved in or out), or the directory itself went away.
fn mask() -> WatchFlags {
    WatchFlags::MODIFY
        | WatchFlags::CREATE
        | WatchFlags::DELETE
        | WatchFlags::MOVED_FROM
        | WatchFlags::MOVED_TO
        | WatchFlags::DELETE_SELF
        | WatchFlags::MOVE_SELF
        | WatchFlags::DONT_FOLLOW
        | WatchFlags::ONLYDIR
}

/// One tenant's log directory.
#[derive(Debug)]
struct TenantDir {
    /// `LOG_DIR/<tenant>`: the parent of its agents' `log_path`.
    dir: PathBuf,
    /// Its watch, once added.
    wd: Option<i32>,
    /// The round from which adding it is tried again.
    retry: u64,
    /// The last round its agents were all to be looked at (its watch added or missing).
    look: u64,
}

/// What one round did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Round {
    /// Every agent was to be looked at, and why.
    pub full: Option<&'static str>,
    /// Agents looked at.
    pub looked: usize,
    /// Bytes taken in.
    pub taken: u64,
    /// Events read.
    pub events: usize,
}

/// The ingest thread's state across rounds (not shared: the thread owns it).
pub struct Rounds {
    inotify: Option<OwnedFd>,
    /// The round from which `inotify_init1` is tried again after it failed.
    init_retry: u64,
    /// Tenant → its log directory and watch.
    tenants: HashMap<String, TenantDir>,
    /// Watch → tenant.
    wds: HashMap<i32, String>,
    /// Agents listed before (`tenant/name` → the last round that listed them).
    known: HashMap<String, u64>,
    /// Agents to look at this round (events, a backlog left by the last look).
    dirty: HashSet<String>,
    /// Agents with a backlog, to look at next round.
    again: HashSet<String>,
    round: u64,
    /// Where a round's pass over the agents starts (moved on when the byte cap stops one).
    next: usize,
    /// Where the sweep's next slice starts.
    sweep: usize,
    /// The next round looks at every agent, and why.
    full_next: Option<&'static str>,
    max_events: usize,
    max_watches: usize,
    /// Each agent looked at at least every this many rounds (0: no sweep, tests).
    sweep_rounds: usize,
    buf: Vec<MaybeUninit<u8>>,
    /// A failure to watch was said (once per instance).
    warned: bool,
}

impl Default for Rounds {
    fn default() -> Self {
        Rounds::new()
    }
}

impl Rounds {
    /// The inotify instance is made in the first round.
    pub fn new() -> Rounds {
        Rounds {
            inotify: None,
            init_retry: 0,
            tenants: HashMap::new(),
            wds: HashMap::new(),
            known: HashMap::new(),
            dirty: HashSet::new(),
            again: HashSet::new(),
            round: 0,
            next: 0,
            sweep: 0,
            full_next: Some("first round"),
            max_events: MAX_EVENTS,
            max_watches: MAX_WATCHES,
            sweep_rounds: SWEEP_ROUNDS,
            // Room for at least 15 events of the longest name (16 + 256 bytes each).
            buf: vec![MaybeUninit::uninit(); 4096],
            warned: false,
        }
    }

    /// Read at most `n` events a round (tests).
    #[cfg(test)]
    pub(super) fn with_max_events(mut self, n: usize) -> Rounds {
        self.max_events = n;
        self
    }

    /// Watch at most `n` directories (tests: as if `max_user_watches` were reached).
    #[cfg(test)]
    pub(super) fn with_max_watches(mut self, n: usize) -> Rounds {
        self.max_watches = n;
        self
    }

    /// Sweep every `n` rounds (0: not at all; tests).
    #[cfg(test)]
    pub(super) fn with_sweep(mut self, n: usize) -> Rounds {
        self.sweep_rounds = n;
        self
    }

    /// Whether the inotify instance is up.
    pub fn watching(&self) -> bool {
        self.inotify.is_some()
    }

    /// One round: take in what changed among `agents` (`who` gives each one's names and
    /// files).
    pub fn round<A>(&mut self, logs: &Logs, agents: &[A], who: impl Fn(&A) -> Who<'_>) -> Round {
        self.round += 1;
        let n = agents.len();
        let mut full = self.full_next.take();
        if self.inotify.is_none() && self.round >= self.init_retry {
            self.start();
        }
        if self.inotify.is_none() {
            full = full.or(Some("no inotify instance"));
        }
        let (events, lost) = self.read_events(n);
        if lost.is_some() {
            // What was lost may have been a watch's end (IN_IGNORED): every watch is added
            // again below (the same inode gives the same watch back).
            self.forget_watches();
        }
        full = full.or(lost);
        let tenant_looks = self.rewatch();

        let slice = if self.sweep_rounds == 0 {
            0
        } else {
            n.div_ceil(self.sweep_rounds)
        };
        let sweep = self.sweep % n.max(1);
        let max = logs.round_max();
        let mut r = Round {
            full,
            events,
            ..Round::default()
        };
        let mut capped = false;
        for k in 0..n {
            let i = (self.next + k) % n;
            let w = who(&agents[i]);
            let new = match self.known.get_mut(w.id) {
                Some(seen) => {
                    *seen = self.round;
                    false
                }
                None => {
                    self.known.insert(w.id.to_string(), self.round);
                    // Watched before it is looked at: what it writes after the look is an event.
                    self.watch_tenant(&w);
                    true
                }
            };
            if capped {
                continue;
            }
            let look = full.is_some()
                || new
                || (i + n - sweep) % n < slice
                || self.dirty.contains(w.id)
                || (tenant_looks
                    && self
                        .tenants
                        .get(w.tenant)
                        .is_none_or(|t| t.wd.is_none() || t.look == self.round));
            if !look {
                continue;
            }
            r.looked += 1;
            let took = logs.look(&w, false);
            r.taken += took.bytes;
            if took.more {
                self.again.insert(w.id.to_string());
            }
            if r.taken >= max {
                // The agents after it start the next round, which looks at all of them (those
                // this one did not reach may have had events).
                capped = true;
                self.next = (i + 1) % n;
                self.full_next = Some("the last round reached its byte cap");
            }
        }
        if n > 0 {
            self.sweep = (sweep + slice) % n;
        }
        if self.known.len() > n {
            let round = self.round;
            self.known.retain(|_, seen| *seen == round);
        }
        self.dirty.clear();
        std::mem::swap(&mut self.dirty, &mut self.again);
        if let Some(why) = r.full {
            debug!(
                why,
                agents = n,
                looked = r.looked,
                "log ingest: a full round"
            );
        }
        r
    }

    /// Every tenant's directory to be watched again (by [`Rounds::rewatch`]).
    fn forget_watches(&mut self) {
        self.wds.clear();
        for t in self.tenants.values_mut() {
            t.wd = None;
            t.retry = 0;
        }
    }

    /// A fresh inotify instance; every tenant's directory to be watched again.
    fn start(&mut self) {
        match inotify::init(inotify::CreateFlags::NONBLOCK | inotify::CreateFlags::CLOEXEC) {
            Ok(fd) => {
                self.inotify = Some(fd);
                self.forget_watches();
                self.warned = false;
            }
            Err(e) => {
                warn!(
                    "log ingest: inotify_init1: {e} (fs.inotify.max_user_instances?); every agent's files are looked at every round"
                );
                self.init_retry = self.round + SWEEP_ROUNDS as u64;
            }
        }
    }

    /// Read this round's events into `dirty` (at most `max_events`). Returns how many, and why
    /// the round must be full if it must.
    fn read_events(&mut self, agents: usize) -> (usize, Option<&'static str>) {
        let Rounds {
            inotify,
            wds,
            tenants,
            dirty,
            buf,
            max_events,
            ..
        } = self;
        let Some(fd) = inotify.as_ref() else {
            return (0, None);
        };
        let mut reader = inotify::Reader::new(fd.as_fd(), buf);
        let (mut n, mut lost) = (0usize, None);
        loop {
            let ev = match reader.next() {
                Ok(ev) => ev,
                Err(rustix::io::Errno::AGAIN) => break,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => {
                    debug!("log ingest: reading the inotify instance: {e}");
                    lost = lost.or(Some("reading the watch failed"));
                    break;
                }
            };
            n += 1;
            if n > *max_events {
                // The rest of the buffer is dropped, the rest of the queue (bounded by the
                // kernel) read by the next rounds.
                lost = lost.or(Some("more events than a round reads"));
                break;
            }
            let flags = ev.events();
            if flags.contains(ReadFlags::QUEUE_OVERFLOW) {
                lost = lost.or(Some("the watch's queue overflowed"));
                continue;
            }
            let wd = ev.wd();
            let Some(tenant) = wds.get(&wd) else {
                // A watch this round does not know (one whose directory moved while an
                // overflow lost its IN_MOVE_SELF): removed, so it reports no more.
                if !flags.contains(ReadFlags::IGNORED) {
                    let _ = inotify::remove_watch(fd, wd);
                }
                lost = lost.or(Some("an event on an unknown watch"));
                continue;
            };
            if flags.contains(ReadFlags::IGNORED) {
                // Its directory was deleted or its file system unmounted: watched again when
                // it is back (the next round tries).
                if let Some(t) = tenants.get_mut(tenant) {
                    t.wd = None;
                    t.retry = 0;
                }
                wds.remove(&wd);
                lost = lost.or(Some("a watch was removed"));
                continue;
            }
            match ev.file_name() {
                Some(name) if lost.is_none() && !mark(dirty, tenant, name, agents) => {
                    lost = Some("more agents with events than listed");
                }
                // Marked, or a full round already.
                Some(_) => {}
                None if flags.intersects(ReadFlags::DELETE_SELF | ReadFlags::MOVE_SELF) => {
                    // The directory went away or elsewhere: its watch follows it, not its
                    // path. Dropped (its IN_IGNORED comes as an unknown watch) and added again
                    // at the path.
                    let _ = inotify::remove_watch(fd, wd);
                    if let Some(t) = tenants.get_mut(tenant) {
                        t.wd = None;
                        t.retry = 0;
                    }
                    wds.remove(&wd);
                    lost = lost.or(Some("a tenant's log directory was moved or deleted"));
                }
                None => {}
            }
        }
        (n, lost)
    }

    /// Add the watches that are missing (due to be tried). Returns whether any tenant's agents
    /// are all to be looked at this round (a watch missing, or added just now).
    fn rewatch(&mut self) -> bool {
        let mut any = false;
        let round = self.round;
        for (tenant, t) in self.tenants.iter_mut() {
            if t.wd.is_some() {
                continue;
            }
            any = true;
            if round >= t.retry {
                add_watch(
                    self.inotify.as_ref(),
                    tenant,
                    t,
                    &mut self.wds,
                    (round, self.max_watches),
                    &mut self.warned,
                );
            }
        }
        any
    }

    /// Watch the log directory of `w`'s tenant if it is not yet known.
    fn watch_tenant(&mut self, w: &Who<'_>) {
        if self.tenants.contains_key(w.tenant) {
            return;
        }
        let Some(dir) = w.log_path.parent() else {
            return;
        };
        let mut t = TenantDir {
            dir: dir.to_path_buf(),
            wd: None,
            retry: 0,
            look: self.round,
        };
        add_watch(
            self.inotify.as_ref(),
            w.tenant,
            &mut t,
            &mut self.wds,
            (self.round, self.max_watches),
            &mut self.warned,
        );
        self.tenants.insert(w.tenant.to_string(), t);
    }
}

/// Try to watch `t`'s directory (at most `max` watches); its agents are looked at this round
/// either way.
fn add_watch(
    fd: Option<&OwnedFd>,
    tenant: &str,
    t: &mut TenantDir,
    wds: &mut HashMap<i32, String>,
    (round, max): (u64, usize),
    warned: &mut bool,
) {
    t.look = round;
    let Some(fd) = fd else {
        return;
    };
    let added = if wds.len() >= max {
        Err(rustix::io::Errno::NOSPC)
    } else {
        inotify::add_watch(fd, &t.dir, mask())
    };
    match added {
        Ok(wd) => {
            t.wd = Some(wd);
            wds.insert(wd, tenant.to_string());
        }
        // Not made yet (the first agent of the tenant has not started): tried next round.
        Err(rustix::io::Errno::NOENT) => t.retry = round + 1,
        Err(e) => {
            if !*warned {
                *warned = true;
                warn!(
                    "log ingest: inotify_add_watch({}): {e} (fs.inotify.max_user_watches?); its agents' files are looked at every round",
                    t.dir.display()
                );
            }
            t.retry = round + SWEEP_ROUNDS as u64;
        }
    }
}

/// The agent whose stream `name` in `tenant`'s directory is, marked to be looked at: `N.log`
/// is `N`'s stdout, `N.stderr.log` `N`'s stderr (and `N.stderr`'s stdout: both are marked).
/// Other names (journals, offsets) are not an agent's stream. Returns false when the set
/// would hold more agents than `agents` (a full round instead).
fn mark(dirty: &mut HashSet<String>, tenant: &str, name: &CStr, agents: usize) -> bool {
    let Ok(name) = name.to_str() else {
        return true;
    };
    for stem in [name.strip_suffix(".stderr.log"), name.strip_suffix(".log")]
        .into_iter()
        .flatten()
    {
        let id = format!("{tenant}/{stem}");
        if !dirty.contains(&id) {
            if dirty.len() >= agents {
                return false;
            }
            dirty.insert(id);
        }
    }
    true
}

#[cfg(test)]
#[path = "rounds_tests.rs"]
mod tests;
