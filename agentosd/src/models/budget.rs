//! Token budgets: a total and a per-minute rate, per agent and per tenant, enforced by
//! reservation. A call reserves what it may use at most (its prompt estimate plus the output
//! tokens it is allowed) on every meter that applies before it is forwarded, and settles with
//! what the backend says it used when it ends: concurrent calls cannot overshoot a budget.

use std::sync::Mutex;
use std::time::Instant;

/// Why a reservation was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exceeded {
    /// The total budget is spent (or would be by this call).
    Total { limit: u64, used: u64 },
    /// The per-minute rate is spent; retry after `retry_after_s`.
    Rate { per_minute: u64, retry_after_s: u64 },
}

#[derive(Debug)]
struct State {
    used: u64,
    reserved: u64,
    /// Tokens available in the per-minute bucket (capacity `per_minute`).
    bucket: f64,
    refilled: Instant,
}

/// One budget: `total` tokens over its life and `per_minute` tokens per minute (a token bucket
/// refilled continuously, holding at most one minute's worth).
#[derive(Debug)]
pub struct Meter {
    total: Option<u64>,
    per_minute: Option<u64>,
    state: Mutex<State>,
}

/// What a reservation took, to be settled with [`Meter::settle`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reservation(pub u64);

impl Meter {
    pub fn new(total: Option<u64>, per_minute: Option<u64>) -> Meter {
        Self::with_used(total, per_minute, 0)
    }

    /// A meter that starts with `used` tokens already spent (read back after a daemon restart).
    pub fn with_used(total: Option<u64>, per_minute: Option<u64>, used: u64) -> Meter {
        Meter {
            total,
            per_minute,
            state: Mutex::new(State {
                used,
                reserved: 0,
                bucket: per_minute.unwrap_or(0) as f64,
                refilled: Instant::now(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn refill(&self, s: &mut State) {
        if let Some(pm) = self.per_minute {
            let now = Instant::now();
            let dt = now.duration_since(s.refilled).as_secs_f64();
            s.bucket = (s.bucket + dt * pm as f64 / 60.0).min(pm as f64);
            s.refilled = now;
        }
    }

    /// How many tokens a call may still use now (the smaller of what the total and the minute
    /// leave); `None`: unlimited.
    pub fn headroom(&self) -> Option<u64> {
        let mut s = self.lock();
        self.refill(&mut s);
        let total = self
            .total
            .map(|t| t.saturating_sub(s.used.saturating_add(s.reserved)));
        let rate = self.per_minute.map(|_| s.bucket.max(0.0) as u64);
        match (total, rate) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Why `n` tokens would be refused now, if they would (nothing is reserved).
    pub fn check(&self, n: u64) -> Result<(), Exceeded> {
        let mut s = self.lock();
        self.refill(&mut s);
        self.refusal(&s, n).map_or(Ok(()), Err)
    }

    fn refusal(&self, s: &State, n: u64) -> Option<Exceeded> {
        if let Some(limit) = self.total {
            let committed = s.used.saturating_add(s.reserved);
            if committed.saturating_add(n) > limit || committed >= limit {
                return Some(Exceeded::Total {
                    limit,
                    used: s.used,
                });
            }
        }
        if let Some(pm) = self.per_minute
            && ((n as f64) > s.bucket || s.bucket < 1.0)
        {
            let missing = (n as f64 - s.bucket).max(1.0);
            let retry = (missing * 60.0 / pm.max(1) as f64).ceil() as u64;
            return Some(Exceeded::Rate {
                per_minute: pm,
                retry_after_s: retry.clamp(1, 60),
            });
        }
        None
    }

    /// Reserve `n` tokens, or say which budget refuses them.
    pub fn reserve(&self, n: u64) -> Result<Reservation, Exceeded> {
        let mut s = self.lock();
        self.refill(&mut s);
        if let Some(e) = self.refusal(&s, n) {
            return Err(e);
        }
        if self.per_minute.is_some() {
            s.bucket -= n as f64;
        }
        s.reserved = s.reserved.saturating_add(n);
        Ok(Reservation(n))
    }

    /// The call that reserved `r` used `used` tokens: the rest returns to the budget (a backend
    /// that reports more than was reserved is charged in full).
    pub fn settle(&self, r: Reservation, used: u64) {
        let mut s = self.lock();
        s.reserved = s.reserved.saturating_sub(r.0);
        s.used = s.used.saturating_add(used);
        if self.per_minute.is_some() {
            // Unused tokens go back to the minute's bucket, overuse is taken from it.
            s.bucket += r.0 as f64 - used as f64;
        }
    }

    /// Tokens used so far.
    pub fn used(&self) -> u64 {
        self.lock().used
    }

    /// The total budget, if any.
    pub fn total(&self) -> Option<u64> {
        self.total
    }

    pub fn per_minute(&self) -> Option<u64> {
        self.per_minute
    }
}

/// Tokens used per agent and per tenant, kept in `STATE_DIR/models/usage.json` so that a
/// daemon restart does not refill a total budget. Written at most every [`Ledger::EVERY`] and
/// when the daemon stops; a `kill -9` forgets at most that much.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Ledger {
    #[serde(default)]
    pub agents: std::collections::BTreeMap<String, u64>,
    #[serde(default)]
    pub tenants: std::collections::BTreeMap<String, u64>,
}

impl Ledger {
    pub const EVERY: std::time::Duration = std::time::Duration::from_secs(2);

    /// Reads the ledger at `path`; a missing file is an empty ledger, an unreadable one is
    /// reported and starts empty (the budgets then count from zero, which the log says).
    pub fn load(path: &std::path::Path) -> Ledger {
        match std::fs::read(path) {
            Ok(b) => serde_json::from_slice(&b).unwrap_or_else(|e| {
                tracing::warn!(
                    "model budgets: {} is not a usage ledger ({e}); token budgets count from zero",
                    path.display()
                );
                Ledger::default()
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ledger::default(),
            Err(e) => {
                tracing::warn!(
                    "model budgets: {}: {e}; token budgets count from zero",
                    path.display()
                );
                Ledger::default()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_total_is_never_overshot_by_concurrent_reservations() {
        let m = Meter::new(Some(100), None);
        let a = m.reserve(60).unwrap();
        assert!(matches!(
            m.reserve(50),
            Err(Exceeded::Total { limit: 100, .. })
        ));
        let b = m.reserve(40).unwrap();
        assert_eq!(m.headroom(), Some(0));
        m.settle(a, 10);
        m.settle(b, 20);
        assert_eq!((m.used(), m.headroom()), (30, Some(70)));
        m.settle(m.reserve(70).unwrap(), 70);
        assert!(m.reserve(1).is_err());
    }

    #[test]
    fn the_rate_refuses_with_a_retry_time_and_refunds_unused_tokens() {
        let m = Meter::new(None, Some(600));
        let r = m.reserve(600).unwrap();
        match m.reserve(100) {
            Err(Exceeded::Rate {
                per_minute: 600,
                retry_after_s,
            }) => assert!((9..=11).contains(&retry_after_s), "{retry_after_s}"),
            other => panic!("{other:?}"),
        }
        m.settle(r, 100);
        assert!(m.reserve(400).is_ok());
    }

    #[test]
    fn a_check_reserves_nothing() {
        let m = Meter::new(Some(100), Some(600));
        assert!(m.check(100).is_ok());
        assert!(matches!(m.check(101), Err(Exceeded::Total { .. })));
        assert_eq!(m.headroom(), Some(100));
        assert!(m.reserve(100).is_ok());
    }

    #[test]
    fn without_limits_everything_passes() {
        let m = Meter::new(None, None);
        assert_eq!(m.headroom(), None);
        m.settle(m.reserve(u64::MAX / 2).unwrap(), 5);
        assert_eq!(m.used(), 5);
    }
}
