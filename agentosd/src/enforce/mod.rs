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
