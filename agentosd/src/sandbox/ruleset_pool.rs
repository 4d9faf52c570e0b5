//! One Landlock ruleset per agent, built ahead of its next start.
//!
//! With the path cache ([`super::path_cache`]) a start still built its ruleset: ≈ 40 `lstat`
//! checks of kept walks, one `landlock_add_rule` per rule (~30) and a
//! `landlock_create_ruleset`, ≈ 100 µs of the start's ≈ 170 µs `prepare` on a quiet host
//! (docs/benchmarks.md). Nothing in it depends on the start itself, so after a start the daemon
//! builds the next one for the same agent off the start path (on the pool's own thread, nice
//! 19, woken by [`after_start`] once the child has exec'd), and the next start takes it
//! instead of building one, after checking that it still holds.
//!
//! **Key.** A ruleset is taken only by a start whose [`Key`] equals the one it was built for:
//! the agent, its uid, the Landlock plan (the contract's filesystem and TCP grants expanded,
//! its home, the daemon's socket directories for it), whether the contract requires Landlock,
//! the kernel's ABI and `--no-landlock-unix`. A different key drops it (the contract changed);
//! the supervisor also [`forget`]s an agent when its contract is reloaded and when it is
//! removed.
//!
//! **What may be built ahead** (the confused-deputy rules of docs/security.md): a ruleset whose
//! every path is either kept by the path cache (a walk only root could make resolve elsewhere),
//! opened beneath the daemon's own directory fd for the agent (its home, exactly as a fresh
//! build opens it), or did not exist. A plan with a path resolved afresh on every start (a walk
//! through a directory an agent, a group or everyone can write; the path cache full or off) is
//! never built ahead: the debug log names the path.
//!
//! **Checked on take**, so that a start gets what a fresh build would give it now:
//! - each kept path's walk is `lstat`ed again, as the path cache does on every use (same device,
//!   inode and type; a directory still root's alone), objects shared by several paths once,
//!   unless the path watch has seen nothing change on the walk since it was last checked
//!   ([`super::path_watch`]);
//! - each path beneath the home is opened again beneath the home's fd just opened for this
//!   start (no link, no `..`) and must be the same object (device and inode);
//! - each path that did not exist is resolved again as a fresh build would and must still not
//!   exist.
//!
//! Any difference drops the ruleset and the start builds its own, as without the pool.
//!
//! **Bounded, never shared.** At most one ruleset per agent and [`MAX_READY`] in all (one fd
//! each, plus the kept paths' fds, which the path cache holds anyway); a start takes the fd out
//! of the pool, so each ruleset serves exactly one start. [`ENV_SWITCH`]`=off` switches the pool
//! off (docs/daemon.md).

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};

use super::landlock::{self, Bound, Opener, Plan};
use super::path_cache::{Checked, PathCache, Switch};
use crate::safe_fs;

/// Rulesets kept ready at most (one per agent).
pub const MAX_READY: usize = 256;

/// Set to `off` (or `0`) to build every agent's ruleset at its start (docs/daemon.md).
pub const ENV_SWITCH: &str = "AGENTOSD_RULESET_POOL";

/// Everything a ruleset depends on: a start takes one built for an equal key only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Key {
    pub agent: String,
    pub uid: u32,
    pub plan: Plan,
    pub required: bool,
    /// The kernel's Landlock ABI ([`landlock::kernel_abi`]).
    pub abi: Option<u32>,
    /// Whether the ruleset handles pathname Unix sockets ([`landlock::landlock_handles_unix`]).
    pub unix: bool,
}

impl Key {
    /// The key of `plan` for `agent` on this kernel, with the daemon's options now.
    pub fn new(agent: &str, uid: u32, plan: &Plan, required: bool) -> Key {
        let abi = landlock::kernel_abi();
        Key {
            agent: agent.to_string(),
            uid,
            plan: plan.clone(),
            required,
            abi,
            unix: landlock::landlock_handles_unix(abi),
        }
    }
}

/// What happened to the rulesets (for tests and the benchmark).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    /// Taken by a start after their checks held.
    pub taken: u64,
    /// Built ahead and kept.
    pub built: u64,
    /// Dropped at take because a path changed since the build.
    pub refused: u64,
    /// Dropped at take because the start's key differed (the contract changed).
    pub stale: u64,
    /// Not built ahead: a path of the plan is resolved afresh on every start.
    pub unpoolable: u64,
}

#[derive(Default)]
struct Counters {
    taken: AtomicU64,
    built: AtomicU64,
    refused: AtomicU64,
    stale: AtomicU64,
    unpoolable: AtomicU64,
}

impl Counters {
    fn now(&self) -> Stats {
        let [taken, built, refused, stale, unpoolable] = [
            &self.taken,
            &self.built,
            &self.refused,
            &self.stale,
            &self.unpoolable,
        ]
        .map(|c| c.load(Ordering::Relaxed));
        Stats {
            taken,
            built,
            refused,
            stale,
            unpoolable,
        }
    }
}

/// A ruleset built ahead, and what its paths were bound to.
struct Ready {
    key: Key,
    fd: OwnedFd,
    bound: Vec<Bound>,
}

/// A ruleset to build after the start that asked for it.
struct Pending {
    generation: u64,
    key: Key,
    /// The agent's home as the daemon opened it for that start.
    home: Option<safe_fs::Dir>,
    /// The opener's host paths that may follow root's links ([`Opener::system`]).
    system: Vec<PathBuf>,
}

#[derive(Default)]
struct State {
    ready: HashMap<String, Ready>,
    pending: HashMap<String, Pending>,
    /// The generation of each agent's latest request: a build finished for an older one (the
    /// agent started again meanwhile, or was forgotten) is dropped.
    current: HashMap<String, u64>,
    generation: u64,
    /// Woken by [`after_start`]: the pending ones may be built now.
    wake: bool,
    thread: bool,
}

pub struct RulesetPool {
    state: Mutex<State>,
    wake: Condvar,
    on: Switch,
    cap: usize,
    cache: &'static PathCache,
    n: Counters,
}

/// Why a ruleset built ahead no longer holds (debug log).
#[derive(Debug, thiserror::Error)]
enum Changed {
    #[error("{0}: its walk changed (path cache check)")]
    Walk(PathBuf),
    #[error("{0}: beneath the home, now another object or gone")]
    Beneath(PathBuf),
    #[error("{0}: did not exist, now resolves (or fails to)")]
    Appeared(PathBuf),
    #[error("{0}: resolved afresh on every start")]
    Fresh(PathBuf),
}

impl RulesetPool {
    /// A pool of at most `cap` rulesets built through `cache`.
    pub fn new(enabled: bool, cap: usize, cache: &'static PathCache) -> RulesetPool {
        RulesetPool {
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
            on: Switch::new(enabled),
            cap,
            cache,
            n: Counters::default(),
        }
    }

    /// The daemon's pool: on unless [`ENV_SWITCH`] is `off` (or `0`) at its first use; built
    /// through the daemon's path cache.
    pub fn global() -> &'static RulesetPool {
        static G: std::sync::OnceLock<RulesetPool> = std::sync::OnceLock::new();
        G.get_or_init(|| {
            let on = Switch::from_env(ENV_SWITCH).on();
            RulesetPool::new(on, MAX_READY, PathCache::global())
        })
    }

    /// On, or off: nothing taken or built ahead (what is ready stays).
    pub fn enabled(&self) -> bool {
        self.on.on()
    }

    /// Switch the pool on or off (the benchmark's `agentos -pool`).
    pub fn set_enabled(&self, on: bool) {
        self.on.set(on);
    }

    pub fn stats(&self) -> Stats {
        self.n.now()
    }

    /// How many rulesets are ready.
    pub fn ready(&self) -> usize {
        self.lock().ready.len()
    }

    /// Whether a ruleset is ready for `agent`.
    pub fn is_ready(&self, agent: &str) -> bool {
        self.lock().ready.contains_key(agent)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The Landlock ruleset of a start of `agent` (uid `uid`) with `plan`, and whether it was
    /// built ahead: the one built ahead when it was built for the same [`Key`] and still holds,
    /// else built now with the agent's `home` (as the daemon opened it for this start) beneath
    /// and `system` as the host paths that may follow root's links ([`Opener`]). Then, when the
    /// plan may be built ahead, the next one is asked for ([`after_start`] builds it). Errors
    /// are those of [`landlock::build_with`].
    pub fn ruleset(
        &self,
        agent: &str,
        uid: u32,
        plan: &Plan,
        required: bool,
        home: safe_fs::Dir,
        system: Vec<PathBuf>,
    ) -> Result<(Option<OwnedFd>, bool), landlock::LandlockError> {
        let opener = Opener {
            beneath: vec![&home],
            system,
            cache: Some(self.cache),
        };
        if !self.enabled() {
            return landlock::build_with(plan, required, &opener).map(|fd| (fd, false));
        }
        let key = Key::new(agent, uid, plan, required);
        let (fd, pooled, again) = match self.take(&key, &opener) {
            Some(fd) => (Some(fd), true, true),
            None => {
                let (fd, bound) = landlock::build_bound(plan, required, &opener)?;
                let again = fd.is_some() && self.poolable(agent, &bound);
                (fd, false, again)
            }
        };
        let Opener { system, .. } = opener;
        if again {
            self.want(key, Some(home), system);
        }
        Ok((fd, pooled))
    }

    /// The ruleset built ahead for `key.agent`, taken out of the pool, when it was built for
    /// `key` and its paths still hold (the module's doc), checked with `opener` (the start's:
    /// its home opened for this start). `None`: the start builds its own.
    fn take(&self, key: &Key, opener: &Opener<'_>) -> Option<OwnedFd> {
        if !self.enabled() {
            return None;
        }
        let r = self.lock().ready.remove(&key.agent)?;
        if r.key != *key {
            self.n.stale.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(agent = %key.agent, "ruleset pool: built for another contract or setting, dropped");
            return None;
        }
        if let Err(e) = holds(&r.bound, opener) {
            self.n.refused.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(agent = %key.agent, "ruleset pool: {e}: dropped, built afresh");
            return None;
        }
        self.n.taken.fetch_add(1, Ordering::Relaxed);
        Some(r.fd)
    }

    /// Whether a ruleset bound as `bound` may be built ahead: no path resolved afresh. Says
    /// which path in the debug log when not.
    fn poolable(&self, agent: &str, bound: &[Bound]) -> bool {
        match bound.iter().find_map(|b| match b {
            Bound::Fresh(p) => Some(p),
            _ => None,
        }) {
            None => true,
            Some(p) => {
                self.n.unpoolable.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(
                    agent,
                    "ruleset pool: not built ahead: {}",
                    Changed::Fresh(p.clone())
                );
                false
            }
        }
    }

    /// Build a ruleset for `key` after the current start ([`after_start`]), with `home` (the
    /// agent's home as the daemon opened it) and `system` as the opener's. Replaces an earlier
    /// request for the agent; nothing when the pool is off or full.
    fn want(&self, key: Key, home: Option<safe_fs::Dir>, system: Vec<PathBuf>) {
        if !self.enabled() {
            return;
        }
        let mut s = self.lock();
        if s.ready.get(&key.agent).is_some_and(|r| r.key == key) {
            return;
        }
        let others = s.ready.len() + s.pending.len()
            - usize::from(s.ready.contains_key(&key.agent))
            - usize::from(s.pending.contains_key(&key.agent));
        if others >= self.cap {
            tracing::debug!(agent = %key.agent, "ruleset pool: full ({} rulesets), not built ahead", self.cap);
            return;
        }
        s.generation += 1;
        let generation = s.generation;
        s.current.insert(key.agent.clone(), generation);
        s.ready.remove(&key.agent);
        s.pending.insert(
            key.agent.clone(),
            Pending {
                generation,
                key,
                home,
                system,
            },
        );
    }

    /// Drop what is ready or asked for `agent` (removed, or its contract reloaded).
    pub fn forget(&self, agent: &str) {
        let mut s = self.lock();
        s.ready.remove(agent);
        s.pending.remove(agent);
        s.current.remove(agent);
    }

    /// Build every ruleset asked for, now, on the calling thread (the pool's thread; tests).
    pub fn build_pending(&self) {
        loop {
            let p = {
                let mut s = self.lock();
                let Some(agent) = s.pending.keys().next().cloned() else {
                    return;
                };
                s.pending.remove(&agent)
            };
            let Some(p) = p else { return };
            let opener = Opener {
                beneath: p.home.iter().collect(),
                system: p.system.clone(),
                cache: Some(self.cache),
            };
            let built = landlock::build_bound(&p.key.plan, p.key.required, &opener);
            let (fd, bound) = match built {
                Ok((Some(fd), bound)) => (fd, bound),
                Ok((None, _)) => continue,
                Err(e) => {
                    tracing::debug!(agent = %p.key.agent, "ruleset pool: building ahead failed: {e}");
                    continue;
                }
            };
            if !self.poolable(&p.key.agent, &bound) {
                continue;
            }
            let mut s = self.lock();
            if s.current.get(&p.key.agent) != Some(&p.generation) || s.ready.len() >= self.cap {
                continue;
            }
            self.n.built.fetch_add(1, Ordering::Relaxed);
            let agent = p.key.agent.clone();
            s.ready.insert(
                agent,
                Ready {
                    key: p.key,
                    fd,
                    bound,
                },
            );
        }
    }

    /// Build what was asked for on the pool's thread (made at the first call; nice 19).
    fn wake(&'static self) {
        let mut s = self.lock();
        if s.pending.is_empty() {
            return;
        }
        s.wake = true;
        if s.thread {
            drop(s);
            self.wake.notify_one();
            return;
        }
        s.thread = true;
        drop(s);
        let spawned = std::thread::Builder::new()
            .name("agentos-rspool".into())
            .spawn(move || {
                // Behind the agents' and the daemon's work: a build is ~70 short system calls,
                // each a point where a waiting task takes the CPU.
                // SAFETY: setpriority(2) on this thread (tid 0 = the caller) with a constant.
                unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 19) };
                loop {
                    {
                        let mut s = self.lock();
                        while !s.wake {
                            s = self.wake.wait(s).unwrap_or_else(|e| e.into_inner());
                        }
                        s.wake = false;
                    }
                    self.build_pending();
                }
            });
        if spawned.is_err() {
            self.lock().thread = false;
        }
    }
}

/// Whether every path of a ruleset built ahead is still what a fresh build would bind now.
fn holds(bound: &[Bound], opener: &Opener<'_>) -> Result<(), Changed> {
    let mut checked = Checked::default();
    for b in bound {
        match b {
            Bound::Kept { path, entry } => {
                if !checked.holds_entry(entry) {
                    return Err(Changed::Walk(path.clone()));
                }
            }
            Bound::Beneath { path, dev, ino } => {
                let same = opener
                    .beneath_of(path)
                    .and_then(|(dir, rel)| dir.open_path(rel).ok())
                    .and_then(|fd| rustix::fs::fstat(&fd).ok())
                    .is_some_and(|st| st.st_dev == *dev && st.st_ino == *ino);
                if !same {
                    return Err(Changed::Beneath(path.clone()));
                }
            }
            Bound::Missing(path) => {
                if !matches!(opener.open_rule(path, &mut checked), Ok(None)) {
                    return Err(Changed::Appeared(path.clone()));
                }
            }
            Bound::Fresh(path) => return Err(Changed::Fresh(path.clone())),
        }
    }
    Ok(())
}

/// A start is past its child's `execve` (or failed): build the rulesets asked for, off the
/// start's path. `spawn` calls it, as [`super::netns_pool::after_start`].
pub fn after_start() {
    RulesetPool::global().wake();
}

/// Drop `agent`'s ruleset built ahead (the supervisor: agent removed, contract reloaded).
pub fn forget(agent: &str) {
    RulesetPool::global().forget(agent);
}

#[cfg(test)]
#[path = "ruleset_pool_tests.rs"]
mod tests;
