//! Kernel enforcement with BPF: programs in C under `ebpf/`, compiled by `build.rs` and embedded,
//! loaded with aya. `net`: cgroup sock_addr programs (`connect4/6`, `sendmsg4/6`) on the daemon's
//! `agents/` cgroup with a policy map keyed by cgroup id and denials to a ring buffer that the
//! daemon appends to the audit trail. `fs`: BPF LSM `file_open` and `bprm_check_security`
//! enforcing the agents' filesystem scopes (the Landlock plan) where the kernel allows BPF LSM.
//! `sysc`: opt-in per-agent syscall counts on the global syscall-entry hook (`--syscall-counts`).
//! `kaudit`: Landlock and seccomp denials of agents, read
//! from the kernel's audit log. See docs/audit.md ("Kernel denials").

pub mod fs;
pub mod kaudit;
pub mod limit;
pub mod net;
pub mod pins;
pub mod sysc;

/// How fast the daemon takes in kernel denials (BPF ring buffers, the audit netlink socket): at
/// most [`RateBudget::PER_WINDOW`] events per [`RateBudget::WINDOW`], about 2 500 a second per
/// source. An agent that loops over refused syscalls thus costs the daemon a bounded share of a
/// CPU and never holds a tokio worker; what it produces beyond the budget waits in the ring or
/// socket until the kernel drops it, counted (ring loss counter, socket overrun), and the daemon
/// reports the count as an audit record every 2 s (never silently lost).
#[derive(Debug)]
pub struct RateBudget {
    start: std::time::Instant,
    spent: usize,
}

impl RateBudget {
    pub const WINDOW: std::time::Duration = std::time::Duration::from_millis(100);
    pub const PER_WINDOW: usize = 256;

    pub fn new(now: std::time::Instant) -> Self {
        RateBudget {
            start: now,
            spent: 0,
        }
    }

    /// Whether one more event fits the current window; if not, how long to pause (the rest of
    /// the window), after which the next window starts.
    pub fn spend(&mut self, now: std::time::Instant) -> Result<(), std::time::Duration> {
        let elapsed = now.saturating_duration_since(self.start);
        if elapsed >= Self::WINDOW {
            self.start = now;
            self.spent = 0;
        }
        if self.spent < Self::PER_WINDOW {
            self.spent += 1;
            return Ok(());
        }
        let pause = Self::WINDOW.saturating_sub(elapsed);
        self.start = now + pause;
        self.spent = 0;
        Err(pause)
    }
}

/// Read events from a BPF ring buffer as they come (tokio `AsyncFd` on its fd), decode each with
/// `decode` and hand it to `on_event`, within a [`RateBudget`] (the task sleeps when it is
/// spent). `what` names the ring in errors. Returns only when the fd cannot be polled.
pub async fn read_ring<T>(
    ring: aya::maps::RingBuf<aya::maps::MapData>,
    what: &str,
    decode: impl Fn(&[u8]) -> Option<T>,
    mut on_event: impl FnMut(T),
) {
    // SAFETY: the RingBuf owns its map fd and is moved into the AsyncFd, so the fd stays open
    // and refers to the same ring buffer for the AsyncFd's whole lifetime.
    let registered = unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE)
    };
    let mut afd = match registered {
        Ok(a) => a,
        Err(e) => {
            tracing::error!(
                "cannot poll the {what} ring buffer: {e}; its denials are NOT reported"
            );
            return;
        }
    };
    let mut budget = RateBudget::new(std::time::Instant::now());
    loop {
        let mut guard = match afd.readable_mut().await {
            Ok(g) => g,
            Err(e) => {
                tracing::error!("{what} ring buffer poll: {e}; its denials are NOT reported");
                return;
            }
        };
        let mut pause = None;
        let ring = guard.get_inner_mut();
        loop {
            if let Err(p) = budget.spend(std::time::Instant::now()) {
                pause = Some(p);
                break;
            }
            let Some(item) = ring.next() else { break };
            match decode(&item) {
                Some(ev) => on_event(ev),
                None => tracing::warn!("short {what} event of {} bytes ignored", item.len()),
            }
        }
        match pause {
            // Drained: wait for the next wakeup.
            None => guard.clear_ready(),
            // The budget is spent and more may be waiting: keep the readiness and sleep (the
            // task sleeps; no worker thread is held).
            Some(p) => {
                drop(guard);
                tokio::time::sleep(p).await;
            }
        }
    }
}

/// The causes of an error (aya's load errors keep the kernel's verifier text there), each after
/// ": ".
fn source_chain(e: &dyn std::error::Error) -> String {
    let mut s = String::new();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// Which agent a cgroup id belongs to, for the BPF enforcers' events: the agents with an entry
/// in a policy map, and the last 1024 whose entry was cleared (their last denials may still be
/// in a ring buffer).
#[derive(Debug, Default)]
pub struct AgentCgroups {
    /// Agent id (`tenant/name`) → (cgroup id, tenant, name).
    live: std::sync::Mutex<std::collections::HashMap<String, (u64, String, String)>>,
    gone: std::sync::Mutex<std::collections::VecDeque<(u64, String, String)>>,
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl AgentCgroups {
    /// The cgroup id agent `id` has an entry for.
    pub fn cgroup_of(&self, id: &str) -> Option<u64> {
        lock(&self.live).get(id).map(|(c, _, _)| *c)
    }

    pub fn insert(&self, id: &str, cgroup_id: u64, tenant: &str, name: &str) {
        lock(&self.live).insert(id.to_string(), (cgroup_id, tenant.into(), name.into()));
    }

    /// Forget agent `id` (keeping it for late events); returns its cgroup id.
    pub fn remove(&self, id: &str) -> Option<u64> {
        let (cg, t, n) = lock(&self.live).remove(id)?;
        let mut gone = lock(&self.gone);
        if gone.len() >= 1024 {
            gone.pop_front();
        }
        gone.push_back((cg, t, n));
        Some(cg)
    }

    /// The cgroup ids of the agents with entries now (not those cleared).
    pub fn live_cgroups(&self) -> std::collections::HashSet<u64> {
        lock(&self.live).values().map(|(c, _, _)| *c).collect()
    }

    /// The agent (tenant, name) whose cgroup has this id.
    pub fn agent_of(&self, cgroup_id: u64) -> Option<(String, String)> {
        let found = lock(&self.live)
            .values()
            .find(|(c, _, _)| *c == cgroup_id)
            .map(|(_, t, n)| (t.clone(), n.clone()));
        found.or_else(|| {
            lock(&self.gone)
                .iter()
                .rev()
                .find(|(c, _, _)| *c == cgroup_id)
                .map(|(_, t, n)| (t.clone(), n.clone()))
        })
    }
}

/// The symbolic name of an errno the enforcers return, for audit records (`EACCES`, `EPERM`;
/// another number as `errno N`).
pub fn errno_name(errno: i32) -> String {
    match errno {
        libc::EACCES => "EACCES".into(),
        libc::EPERM => "EPERM".into(),
        n => format!("errno {n}"),
    }
}

#[cfg(test)]
mod budget_tests {
    use super::RateBudget;
    use std::time::{Duration, Instant};

    #[test]
    fn a_window_admits_its_budget_then_asks_for_the_rest_of_the_window() {
        let t0 = Instant::now();
        let mut b = RateBudget::new(t0);
        for _ in 0..RateBudget::PER_WINDOW {
            assert_eq!(b.spend(t0 + Duration::from_millis(30)), Ok(()));
        }
        assert_eq!(
            b.spend(t0 + Duration::from_millis(30)),
            Err(Duration::from_millis(70)),
            "the 257th event in a window waits for the window's end"
        );
        // After the pause a new window starts with a full budget.
        assert_eq!(b.spend(t0 + Duration::from_millis(100)), Ok(()));
    }

    #[test]
    fn a_slow_source_is_never_paused() {
        let t0 = Instant::now();
        let mut b = RateBudget::new(t0);
        for i in 0..10_000u64 {
            // 2 000 a second: under 256 per 100 ms.
            assert_eq!(
                b.spend(t0 + Duration::from_micros(500 * i)),
                Ok(()),
                "event {i}"
            );
        }
    }
}
