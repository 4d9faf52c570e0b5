//! The work one agent may make the daemon do on its sockets (issue 15, "Isolation"): a token
//! bucket per agent, over all its connections, charged for every receive with the bytes read
//! plus [`LINE_COST`] per line they complete. While the bucket is empty the ring does not read
//! that agent's connections; what the agent writes meanwhile waits in the kernel's socket buffer
//! (bounded, and free for the daemon), so an agent flooding requests gets `rate` worth of the
//! daemon's parsing and answering a second, and the others and the control plane the rest.
//! Pure: the clock is passed in, unit-tested.

use std::time::{Duration, Instant};

/// What one line costs on top of its bytes: a small request (`ping`) makes the session parse,
/// dispatch and answer it, about as much work as parsing a kilobyte of a large one.
pub const LINE_COST: u64 = 1024;

/// What accepting a connection on an agent's socket costs: the accept, the peer's identity
/// (`SO_PEERCRED`, a pidfd, `/proc/PID/cgroup`) and its queues, whether it is admitted or
/// refused. An agent connecting and closing in a loop is held to its rate like one sending.
/// Measured with `cargo xtask bench isolation` (release build, 2026-11-26): a connect loop at
/// 4 KiB a connection made the daemon spend 27-34% of a CPU (≈ 75 µs per connection, ≈ 4 000
/// a second), a 1 MiB-request flood at the same rate 6% (≈ 4 ns a byte): a connection costs
/// about as much as 20 KiB of requests. 64 KiB leaves a margin (a client connects once).
pub const ACCEPT_COST: u64 = 64 << 10;

/// The default `--ipc-agent-rate`, bytes a second per agent.
pub const DEFAULT_AGENT_RATE: u64 = 16 << 20;

/// A token bucket in bytes. Reading may go into debt by one receive (the ring does not know a
/// receive's size before it completes); the next read waits until the debt is paid back.
#[derive(Debug, Clone)]
pub struct Bucket {
    /// Bytes a second.
    rate: u64,
    /// Most tokens kept while idle.
    burst: u64,
    /// Can be negative: the debt of the last receive.
    tokens: f64,
    last: Instant,
}

impl Bucket {
    /// A full bucket. `burst` is raised to `min_burst` (one whole line must fit, so that a
    /// message of `max_line` bytes is never delayed by more than its own size at `rate`).
    pub fn new(rate: u64, min_burst: u64, now: Instant) -> Bucket {
        let burst = (rate / 2).max(min_burst).max(1);
        Bucket {
            rate: rate.max(1),
            burst,
            tokens: burst as f64,
            last: now,
        }
    }

    pub fn rate(&self) -> u64 {
        self.rate
    }

    pub fn burst(&self) -> u64 {
        self.burst
    }

    fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + dt * self.rate as f64).min(self.burst as f64);
        self.last = self.last.max(now);
    }

    /// A receive of `bytes` completing `lines` lines was done.
    pub fn charge(&mut self, bytes: u64, lines: u64, now: Instant) {
        self.refill(now);
        self.tokens -= (bytes + lines.saturating_mul(LINE_COST)) as f64;
    }

    /// Whether the agent's connections may be read now (no debt).
    pub fn ready(&mut self, now: Instant) -> bool {
        self.refill(now);
        self.tokens >= 0.0
    }

    /// Forgive any debt beyond `max_debt`: what was used while nobody else wanted it is not
    /// owed later (the work-conserving CPU share, ipc/cpu.rs).
    pub fn forgive(&mut self, max_debt: u64) {
        self.tokens = self.tokens.max(-(max_debt as f64));
    }

    /// How long until [`Bucket::ready`] (zero when it is).
    pub fn wait(&mut self, now: Instant) -> Duration {
        self.refill(now);
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.rate as f64)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_the_rate() {
        let t0 = Instant::now();
        let mut b = Bucket::new(1000, 10, t0);
        assert_eq!(b.burst(), 500);
        assert!(b.ready(t0));
        // One receive may overdraw: the bucket does not know its size beforehand.
        b.charge(800, 0, t0);
        assert!(!b.ready(t0));
        assert_eq!(b.wait(t0), Duration::from_millis(300));
        assert!(!b.ready(t0 + Duration::from_millis(299)));
        assert!(b.ready(t0 + Duration::from_millis(300)));
        // Idle time refills to the burst and no further.
        assert!(b.ready(t0 + Duration::from_secs(100)));
        b.charge(500, 0, t0 + Duration::from_secs(100));
        assert!(b.ready(t0 + Duration::from_secs(100)));
        b.charge(1, 0, t0 + Duration::from_secs(100));
        assert!(!b.ready(t0 + Duration::from_secs(100)));
    }

    #[test]
    fn lines_cost_on_top_of_their_bytes() {
        let t0 = Instant::now();
        let mut b = Bucket::new(1 << 20, 0, t0);
        // 64 KiB of small requests cost as much as 1000 lines of LINE_COST more.
        b.charge(64 << 10, 1000, t0);
        let debt = (64 << 10) + 1000 * LINE_COST - (1 << 19);
        let want = Duration::from_secs_f64(debt as f64 / (1 << 20) as f64);
        let got = b.wait(t0);
        assert!(
            got.abs_diff(want) < Duration::from_micros(10),
            "{got:?} {want:?}"
        );
    }

    #[test]
    fn one_whole_line_always_fits_the_burst() {
        let b = Bucket::new(1000, 1 << 20, Instant::now());
        assert_eq!(b.burst(), 1 << 20);
    }

    #[test]
    fn over_a_long_run_what_is_read_is_the_rate() {
        // A flood of 64 KiB receives, read whenever the bucket allows: about rate × time.
        let t0 = Instant::now();
        let rate = 4 << 20;
        let mut b = Bucket::new(rate, 1 << 20, t0);
        let mut now = t0;
        let mut read = 0u64;
        let end = t0 + Duration::from_secs(10);
        while now < end {
            if b.ready(now) {
                b.charge(64 << 10, 0, now);
                read += 64 << 10;
            } else {
                now += b.wait(now).max(Duration::from_millis(1));
            }
        }
        let want = rate * 10 + b.burst();
        assert!(read <= want + (64 << 10), "{read} > {want}");
        assert!(read >= rate * 10, "{read}");
    }
}
