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
pub mod net;
pub mod sysc;

/// The causes of an error (aya's load errors keep the kernel's verifier text there), each after
/// ": ".
/// How fast the daemon drains a BPF ring buffer of denials: at most `RING_BATCH` events per
/// wakeup, and after a full batch a pause of `RING_PAUSE` before the next, so an agent that
/// loops over refused syscalls costs the daemon at most about 2 500 records per second per
/// ring (one tokio task, never a worker held). What the agent produces beyond that stays in the
/// ring until the kernel drops it, counted in the ring's loss counter, which the daemon reports
/// as an audit record every 2 s (never silently lost).
pub const RING_BATCH: usize = 256;
pub const RING_PAUSE: std::time::Duration = std::time::Duration::from_millis(100);

/// Read events from a BPF ring buffer as they come (tokio `AsyncFd` on its fd), decode each with
/// `decode` and hand it to `on_event`, within the budget above. `what` names the ring in
/// errors. Returns only when the fd cannot be polled.
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
    loop {
        let mut guard = match afd.readable_mut().await {
            Ok(g) => g,
            Err(e) => {
                tracing::error!("{what} ring buffer poll: {e}; its denials are NOT reported");
                return;
            }
        };
        let ring = guard.get_inner_mut();
        let mut n = 0;
        while n < RING_BATCH {
            let Some(item) = ring.next() else { break };
            n += 1;
            match decode(&item) {
                Some(ev) => on_event(ev),
                None => tracing::warn!("short {what} event of {} bytes ignored", item.len()),
            }
        }
        if n < RING_BATCH {
            guard.clear_ready();
        } else {
            // A full batch: more may be waiting. Keep the readiness and pause (the task
            // sleeps; no worker thread is held), which bounds the rate.
            drop(guard);
            tokio::time::sleep(RING_PAUSE).await;
        }
    }
}

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
