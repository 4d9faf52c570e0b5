//! Who costs the disk, pure: bytes each agent made the daemon write recently (its audit records
//! and its journal), over two windows of [`WINDOW`], and the refusals counted instead of
//! recorded while storage is low. Both maps are bounded whatever ids the daemon is handed.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

/// "Recently": the current window and the one before it.
pub const WINDOW: Duration = Duration::from_secs(10);

/// Agents tracked at most; past that, the rest share [`OVERFLOW`].
pub const MAX_AGENTS: usize = 16_384;

/// The bucket agents share once [`MAX_AGENTS`] are tracked.
pub const OVERFLOW: &str = "(other agents)";

/// An agent is an offender only above this many bytes over the last two windows (about 13 KiB a
/// second): an agent that merely works is never one.
pub const OFFENDER_MIN: u64 = 256 << 10;

/// What one audit record costs, as charged to its agent (records are ~300-900 bytes; the exact
/// size is known only to the writer thread, and the estimate is enough to rank agents).
pub const RECORD_BYTES: u64 = 512;

#[derive(Debug, Default, Clone, Copy)]
struct Two {
    current: u64,
    previous: u64,
}

/// Bytes per agent over the last two windows.
#[derive(Debug)]
pub struct Usage {
    agents: HashMap<String, Two>,
    window_start: Instant,
}

impl Usage {
    pub fn new(now: Instant) -> Self {
        Usage {
            agents: HashMap::new(),
            window_start: now,
        }
    }

    fn roll(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.window_start);
        if elapsed < WINDOW {
            return;
        }
        let skipped_one = elapsed >= 2 * WINDOW;
        self.agents.retain(|_, t| {
            t.previous = if skipped_one { 0 } else { t.current };
            t.current = 0;
            t.previous > 0
        });
        self.window_start = now;
    }

    /// Charge `bytes` to agent `id` (`tenant/name`; empty: the daemon's own, not charged).
    pub fn charge(&mut self, id: &str, bytes: u64, now: Instant) {
        if id.is_empty() || bytes == 0 {
            return;
        }
        self.roll(now);
        let key = if self.agents.contains_key(id) || self.agents.len() < MAX_AGENTS {
            id
        } else {
            OVERFLOW
        };
        let t = self.agents.entry(key.to_string()).or_default();
        t.current = t.current.saturating_add(bytes);
    }

    /// An agent's bytes over the last two windows.
    pub fn recent(&mut self, id: &str, now: Instant) -> u64 {
        self.roll(now);
        self.agents
            .get(id)
            .map_or(0, |t| t.current.saturating_add(t.previous))
    }

    /// The offenders, most bytes first: every agent over [`OFFENDER_MIN`] with at least half the
    /// bytes of the agent with the most.
    pub fn offenders(&mut self, now: Instant) -> Vec<(String, u64)> {
        self.roll(now);
        let mut all: Vec<(String, u64)> = self
            .agents
            .iter()
            .map(|(id, t)| (id.clone(), t.current.saturating_add(t.previous)))
            .filter(|(_, b)| *b >= OFFENDER_MIN)
            .collect();
        let top = all.iter().map(|(_, b)| *b).max().unwrap_or(0);
        all.retain(|(_, b)| b.saturating_mul(2) >= top);
        all.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        all
    }
}

/// The agents that own the most of a file system of `total` bytes by their uids' files (their
/// quota usage), most first: those with at least [`OFFENDER_MIN`] and 1/32 of the file system
/// (an agent keeping its working files is not one), and at least half the bytes of the agent
/// owning the most — the same shape as [`Usage::offenders`].
pub fn owners(owned: &[(String, u64)], total: u64) -> Vec<(String, u64)> {
    let floor = OFFENDER_MIN.max(total / 32);
    let mut all: Vec<(String, u64)> = owned
        .iter()
        .filter(|(id, b)| !id.is_empty() && *b >= floor)
        .cloned()
        .collect();
    let top = all.iter().map(|(_, b)| *b).max().unwrap_or(0);
    all.retain(|(_, b)| b.saturating_mul(2) >= top);
    all.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    all
}

/// One agent's refusals counted instead of recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// `tenant/name` (empty: no known agent).
    pub agent: String,
    /// How many.
    pub count: u64,
    /// By what was refused (`gate`, `denial`, `start`, `storage-low`…).
    pub by: BTreeMap<String, u64>,
    /// From the first to the summary.
    pub window: Duration,
}

/// Refusals counted per agent while storage is low.
#[derive(Debug, Default)]
pub struct Refusals {
    agents: HashMap<String, (BTreeMap<String, u64>, Instant)>,
}

impl Refusals {
    /// Count one refusal of `agent` of kind `what`.
    pub fn count(&mut self, agent: &str, what: &str, now: Instant) {
        self.count_n(agent, what, 1, now);
    }

    /// Count `n` refusals of `agent` of kind `what`.
    pub fn count_n(&mut self, agent: &str, what: &str, n: u64, now: Instant) {
        let key = if self.agents.contains_key(agent) || self.agents.len() < MAX_AGENTS {
            agent
        } else {
            OVERFLOW
        };
        let e = self
            .agents
            .entry(key.to_string())
            .or_insert_with(|| (BTreeMap::new(), now));
        *e.0.entry(what.to_string()).or_insert(0) += n;
    }

    /// Whether anything is counted.
    pub fn is_empty(&self) -> bool {
        self.agents.is_empty()
    }

    /// Every agent's summary (by agent), then forgotten.
    pub fn take(&mut self, now: Instant) -> Vec<Summary> {
        let mut out: Vec<Summary> = self
            .agents
            .drain()
            .map(|(agent, (by, since))| Summary {
                agent,
                count: by.values().sum(),
                by,
                window: now.saturating_duration_since(since),
            })
            .collect();
        out.sort_by(|a, b| a.agent.cmp(&b.agent));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offenders_are_the_heavy_writers_of_the_last_two_windows() {
        let t0 = Instant::now();
        let mut u = Usage::new(t0);
        u.charge("acme/flood", 4 << 20, t0);
        u.charge("acme/busy", 3 << 20, t0);
        u.charge("acme/quiet", 10 << 10, t0);
        u.charge("", 100 << 20, t0); // the daemon's own records are nobody's
        let o = u.offenders(t0);
        let ids: Vec<&str> = o.iter().map(|(i, _)| i.as_str()).collect();
        assert_eq!(
            ids,
            vec!["acme/flood", "acme/busy"],
            "half of the top or more"
        );
        // One window later the bytes still count…
        let t1 = t0 + WINDOW;
        assert_eq!(u.recent("acme/flood", t1), 4 << 20);
        u.charge("acme/quiet", 9 << 20, t1);
        assert_eq!(u.offenders(t1)[0].0, "acme/quiet");
        assert_eq!(u.offenders(t1).len(), 1, "4 MiB is less than half of 9 MiB");
        // …two windows later they are gone.
        let t2 = t1 + WINDOW;
        assert_eq!(u.recent("acme/flood", t2), 0);
        assert_eq!(u.recent("acme/quiet", t2), 9 << 20);
        // A long silence forgets everything.
        assert!(u.offenders(t2 + 3 * WINDOW).is_empty());
    }

    #[test]
    fn an_agent_under_the_minimum_is_never_an_offender() {
        let t0 = Instant::now();
        let mut u = Usage::new(t0);
        u.charge("acme/a", OFFENDER_MIN - 1, t0);
        assert!(u.offenders(t0).is_empty());
        u.charge("acme/a", 1, t0);
        assert_eq!(u.offenders(t0), vec![("acme/a".to_string(), OFFENDER_MIN)]);
    }

    #[test]
    fn owners_are_the_agents_whose_files_fill_the_file_system() {
        let total = 64 << 20;
        let owned = vec![
            ("acme/hog".to_string(), 40 << 20),
            ("acme/data".to_string(), 21 << 20),
            ("acme/small".to_string(), 1 << 20),
            ("acme/tiny".to_string(), 4 << 10),
        ];
        let o = owners(&owned, total);
        let ids: Vec<&str> = o.iter().map(|(i, _)| i.as_str()).collect();
        assert_eq!(ids, ["acme/hog", "acme/data"], "half of the top or more");
        // 1 MiB of 64 MiB is below 1/32 of the file system: a working agent, not an offender.
        assert!(owners(&owned[2..], total).is_empty());
        // On a large file system the floor scales.
        assert!(owners(&owned[..1], 100 << 30).is_empty());
    }

    #[test]
    fn refusals_are_summarised_per_agent_and_kind() {
        let t0 = Instant::now();
        let mut r = Refusals::default();
        for _ in 0..5 {
            r.count("acme/flood", "gate", t0);
        }
        r.count("acme/flood", "socket", t0);
        r.count("", "denial", t0);
        let s = r.take(t0 + Duration::from_secs(3));
        assert_eq!(s.len(), 2);
        assert_eq!(s[1].agent, "acme/flood");
        assert_eq!(s[1].count, 6);
        assert_eq!(s[1].by["gate"], 5);
        assert_eq!(s[1].window, Duration::from_secs(3));
        assert!(r.is_empty());
        // A summary whose record could not be written goes back whole (Storage::restore_summary).
        for (what, n) in &s[1].by {
            r.count_n(&s[1].agent, what, *n, t0);
        }
        let again = r.take(t0);
        assert_eq!(again.len(), 1);
        assert_eq!((again[0].count, again[0].by["gate"]), (6, 5));
    }

    #[test]
    fn maps_are_bounded() {
        let t0 = Instant::now();
        let mut u = Usage::new(t0);
        let mut r = Refusals::default();
        for i in 0..(MAX_AGENTS + 10) {
            u.charge(&format!("t/a{i}"), 1, t0);
            r.count(&format!("t/a{i}"), "gate", t0);
        }
        assert_eq!(u.agents.len(), MAX_AGENTS + 1);
        assert_eq!(u.recent(OVERFLOW, t0), 10);
        assert_eq!(r.agents.len(), MAX_AGENTS + 1);
    }
}
