//! Per-agent rate limit of denial records: an agent that loops over refused calls gets its first
//! refusals recorded one by one, then at most [`Limits::per_sec`] a second; the rest are counted
//! per agent and per hook and written as one summary record ("N similar events suppressed in T")
//! when the daemon's 2 s report runs, like the kernel audit's rate limit but never silent. The
//! trail thus grows by a bounded number of records per agent and second whatever the agent does,
//! and `suppressed` plus the records it wrote account for every refusal the daemon read.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

/// The limiter's settings (`agentosd --denial-records-per-sec`, `--denial-records-burst`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// Records a second, per agent, once the burst is spent (0: every refusal is a summary count).
    pub per_sec: u32,
    /// Records an agent may produce at once before the rate applies.
    pub burst: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            per_sec: 20,
            burst: 100,
        }
    }
}

/// Agents with a bucket at most (the oldest idle ones are forgotten first; the map never grows
/// past this whatever ids the daemon is handed).
const MAX_AGENTS: usize = 16_384;

/// The bucket agents share when [`MAX_AGENTS`] buckets all have refusals to report.
pub const OVERFLOW: &str = "(other agents)";

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    last: Instant,
    /// Refusals not recorded since the last summary, by hook (or syscall, or event kind).
    suppressed: BTreeMap<String, u64>,
    /// When the first of them came.
    since: Option<Instant>,
}

/// What one agent's summary record says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// The agent (`tenant/name`; empty for refusals of no known agent).
    pub agent: String,
    /// Refusals not written as records of their own.
    pub suppressed: u64,
    /// Per hook.
    pub by: BTreeMap<String, u64>,
    /// From the first suppressed refusal to the summary.
    pub window: Duration,
}

/// The per-agent token buckets.
#[derive(Debug)]
pub struct RecordLimiter {
    limits: Limits,
    agents: HashMap<String, Bucket>,
}

impl RecordLimiter {
    pub fn new(limits: Limits) -> Self {
        RecordLimiter {
            limits,
            agents: HashMap::new(),
        }
    }

    /// Whether agent `agent`'s refusal at `hook` gets a record of its own now; if not it is
    /// counted for the next summary.
    pub fn admit(&mut self, agent: &str, hook: &str, now: Instant) -> bool {
        let mut agent = agent;
        if !self.agents.contains_key(agent) && self.agents.len() >= MAX_AGENTS {
            self.forget_idle(now);
            if self.agents.len() >= MAX_AGENTS {
                // Every bucket has refusals to report: this one shares a bucket of its own.
                agent = OVERFLOW;
            }
        }
        let limits = self.limits;
        let b = self.agents.entry(agent.to_string()).or_insert(Bucket {
            tokens: f64::from(limits.burst),
            last: now,
            suppressed: BTreeMap::new(),
            since: None,
        });
        let elapsed = now.saturating_duration_since(b.last).as_secs_f64();
        b.tokens = (b.tokens + elapsed * f64::from(limits.per_sec)).min(f64::from(limits.burst));
        b.last = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            return true;
        }
        *b.suppressed.entry(hook.to_string()).or_insert(0) += 1;
        b.since.get_or_insert(now);
        false
    }

    /// The summaries of every agent with suppressed refusals, which are then reset.
    pub fn summaries(&mut self, now: Instant) -> Vec<Summary> {
        let mut out: Vec<Summary> = self
            .agents
            .iter_mut()
            .filter(|(_, b)| !b.suppressed.is_empty())
            .map(|(agent, b)| {
                let by = std::mem::take(&mut b.suppressed);
                Summary {
                    agent: agent.clone(),
                    suppressed: by.values().sum(),
                    by,
                    window: now.saturating_duration_since(b.since.take().unwrap_or(now)),
                }
            })
            .collect();
        out.sort_by(|a, b| a.agent.cmp(&b.agent));
        out
    }

    /// Drop the buckets that are full again and have nothing to report (their agents have been
    /// quiet for a burst's worth of time): they would admit the next refusal anyway.
    fn forget_idle(&mut self, now: Instant) {
        let limits = self.limits;
        self.agents.retain(|_, b| {
            let refill =
                now.saturating_duration_since(b.last).as_secs_f64() * f64::from(limits.per_sec);
            !b.suppressed.is_empty() || b.tokens + refill < f64::from(limits.burst)
        });
        if self.agents.len() >= MAX_AGENTS {
            // Every bucket is busy: forget those without anything to report, oldest first.
            let mut quiet: Vec<(Instant, String)> = self
                .agents
                .iter()
                .filter(|(_, b)| b.suppressed.is_empty())
                .map(|(a, b)| (b.last, a.clone()))
                .collect();
            quiet.sort();
            for (_, a) in quiet.iter().take(self.agents.len() + 1 - MAX_AGENTS) {
                self.agents.remove(a);
            }
        }
    }

    /// Agents with a bucket (for tests and the daemon's own accounting).
    pub fn len(&self) -> usize {
        self.agents.len()
    }

    pub fn is_empty(&self) -> bool {
        self.agents.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    #[test]
    fn a_burst_then_the_rate_and_every_refusal_accounted_for() {
        let t0 = Instant::now();
        let mut l = RecordLimiter::new(Limits {
            per_sec: 10,
            burst: 5,
        });
        // 100 refusals within 1 s: 5 (burst) + about 10 (refill) recorded, the rest counted.
        let recorded = (0..100)
            .filter(|i| l.admit("t/a", "cgroup/connect4", at(t0, i * 10)))
            .count() as u64;
        assert!((14..=15).contains(&recorded), "{recorded}");
        let s = l.summaries(at(t0, 1000));
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].agent, "t/a");
        assert_eq!(
            s[0].suppressed + recorded,
            100,
            "nothing lost, nothing twice"
        );
        assert_eq!(s[0].by["cgroup/connect4"], s[0].suppressed);
        assert!(s[0].window > Duration::ZERO && s[0].window <= Duration::from_secs(1));
        // Reported once: the next summary is empty until more are suppressed.
        assert!(l.summaries(at(t0, 1001)).is_empty());
    }

    #[test]
    fn agents_do_not_spend_each_others_records() {
        let t0 = Instant::now();
        let mut l = RecordLimiter::new(Limits {
            per_sec: 1,
            burst: 3,
        });
        for i in 0..50 {
            l.admit("t/flood", "lsm/file_open", at(t0, i));
        }
        // The quiet agent still gets its whole burst.
        assert!((0..3).all(|i| l.admit("t/quiet", "cgroup/bind4", at(t0, 60 + i))));
        assert!(!l.admit("t/quiet", "cgroup/bind4", at(t0, 70)));
        let s = l.summaries(at(t0, 100));
        let by: Vec<(&str, u64)> = s.iter().map(|s| (s.agent.as_str(), s.suppressed)).collect();
        assert_eq!(by, [("t/flood", 47), ("t/quiet", 1)]);
        assert_eq!(s[0].by.len(), 1);
    }

    #[test]
    fn the_bucket_refills_to_the_burst_and_no_further() {
        let t0 = Instant::now();
        let mut l = RecordLimiter::new(Limits {
            per_sec: 100,
            burst: 2,
        });
        assert!(l.admit("a", "h", t0));
        assert!(l.admit("a", "h", t0));
        assert!(!l.admit("a", "h", t0));
        // An hour later: two again, not 360 000.
        let later = t0 + Duration::from_secs(3600);
        assert!(l.admit("a", "h", later));
        assert!(l.admit("a", "h", later));
        assert!(!l.admit("a", "h", later));
    }

    #[test]
    fn a_rate_of_zero_records_the_burst_then_only_counts() {
        let t0 = Instant::now();
        let mut l = RecordLimiter::new(Limits {
            per_sec: 0,
            burst: 1,
        });
        assert!(l.admit("a", "h", t0));
        assert!(!l.admit("a", "h", t0 + Duration::from_secs(10)));
        assert_eq!(l.summaries(t0 + Duration::from_secs(11))[0].suppressed, 1);
    }

    #[test]
    fn the_map_stays_bounded_whatever_the_ids() {
        let t0 = Instant::now();
        let mut l = RecordLimiter::new(Limits {
            per_sec: 1,
            burst: 1,
        });
        for i in 0..(MAX_AGENTS + 500) {
            // Each id spends its burst, so none is idle: the oldest quiet ones go first.
            l.admit(&format!("t/{i}"), "h", at(t0, i as u64));
            assert!(l.len() <= MAX_AGENTS, "{} buckets at {i}", l.len());
        }
        // An agent with suppressed refusals is never forgotten before its summary.
        let mut l = RecordLimiter::new(Limits {
            per_sec: 0,
            burst: 0,
        });
        assert!(!l.admit("t/kept", "h", t0));
        for i in 0..(MAX_AGENTS + 10) {
            l.admit(&format!("t/{i}"), "h", t0);
        }
        assert!(l.len() <= MAX_AGENTS + 1, "{}", l.len());
        let s = l.summaries(t0);
        assert!(s.iter().any(|s| s.agent == "t/kept"));
        // The agents past the bound are counted together, not lost.
        let total: u64 = s.iter().map(|s| s.suppressed).sum();
        assert_eq!(total, 1 + MAX_AGENTS as u64 + 10);
        assert!(s.iter().any(|s| s.agent == OVERFLOW && s.suppressed == 11));
    }
}
