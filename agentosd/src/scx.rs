//! The sched_ext scheduler `scx_agentos` held by the daemon (`agentosd --sched-ext`).
//!
//! agentosd links the loader library and owns the struct_ops link: while the daemon runs, SRT
//! agents are dispatched ahead of everything and DT agents run on idle time; when the daemon
//! exits the link goes with it and the kernel returns every task to the fair class (EEVDF).
//! The next daemon loads the scheduler again and refills its class map from the re-adopted
//! agents. See docs/scheduling.md.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use scx_agentos::{Class, Scheduler};
use tracing::{info, warn};

/// The loaded scheduler and which cgroup id each agent put in its class map.
#[derive(Debug)]
pub struct Scx {
    sched: Mutex<Option<Scheduler>>,
    by_agent: Mutex<HashMap<String, u64>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Scx {
    /// Load and attach scx_agentos; the error says why not (no sched_ext, another scheduler).
    pub fn load() -> Result<Arc<Scx>, scx_agentos::Error> {
        let sched = Scheduler::load()?;
        Ok(Arc::new(Scx {
            sched: Mutex::new(Some(sched)),
            by_agent: Mutex::new(HashMap::new()),
        }))
    }

    /// Put `agent`'s cgroup into its class (SRT/DT); other classes are only forgotten. Returns a
    /// note for `agentctl status`, or `None` when the class is not the scheduler's concern.
    pub fn register(&self, agent: &str, cgroup: &Path, latency: &str) -> Option<String> {
        self.forget(agent);
        let class = Class::from_latency(latency)?;
        let guard = lock(&self.sched);
        let sched = guard.as_ref()?;
        let r = scx_agentos::cgroup_id(cgroup).and_then(|id| {
            sched.set_class(id, class)?;
            Ok(id)
        });
        match r {
            Ok(id) => {
                lock(&self.by_agent).insert(agent.to_string(), id);
                Some(format!(
                    "class {class}: scx_agentos dispatches cgroup id {id} as {class}"
                ))
            }
            Err(e) => {
                warn!(
                    agent,
                    "scx_agentos: cannot classify the agent's cgroup: {e}"
                );
                Some(format!("class {class}: scx_agentos map update failed: {e}"))
            }
        }
    }

    /// Remove `agent`'s cgroup from the class map.
    pub fn forget(&self, agent: &str) {
        let Some(id) = lock(&self.by_agent).remove(agent) else {
            return;
        };
        if let Some(s) = lock(&self.sched).as_ref()
            && let Err(e) = s.remove(id)
        {
            warn!(agent, "scx_agentos: {e}");
        }
    }

    /// The number of cgroups in the class map.
    pub fn registered(&self) -> usize {
        lock(&self.by_agent).len()
    }

    /// Whether the scheduler is still attached (the kernel has not stopped it).
    pub fn running(&self) -> bool {
        lock(&self.sched)
            .as_ref()
            .is_some_and(|s| s.exit_info().is_none())
    }

    /// Watch for the kernel stopping the scheduler (watchdog, error, sysrq-S) and say so loudly.
    pub fn watch(self: &Arc<Self>) {
        let me = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let exit = {
                    let g = lock(&me.sched);
                    match g.as_ref() {
                        None => return,
                        Some(s) => s.exit_info(),
                    }
                };
                if let Some(e) = exit {
                    warn!(
                        "scx_agentos was stopped by the kernel: {e}; every task is back in the \
                         fair class (SRT agents started from now on get cpu.weight instead)"
                    );
                    // Detach what is left so a later `agentosd check` shows sched_ext disabled.
                    if let Some(s) = lock(&me.sched).take() {
                        s.unload();
                    }
                    return;
                }
            }
        });
    }

    /// Detach the scheduler (the daemon is exiting).
    pub fn unload(&self) {
        if let Some(s) = lock(&self.sched).take() {
            info!("scx_agentos: {}", s.stats());
            match s.unload() {
                Some(e) if e.is_error() => warn!("scx_agentos had stopped: {e}"),
                _ => info!("scx_agentos unloaded; the kernel runs every task in the fair class"),
            }
        }
    }
}

/// Start-up: load the scheduler when the operator asked for it. Never fails the daemon: without
/// sched_ext (or with another scheduler loaded) it warns and SRT falls back to cpu.weight.
pub fn start(enabled: bool) -> Option<Arc<Scx>> {
    if !enabled {
        return None;
    }
    match Scx::load() {
        Ok(s) => {
            info!(
                "scx_agentos loaded (sched_ext): SRT agents first with 2 ms slices, DT agents on \
                 idle time"
            );
            s.watch();
            Some(s)
        }
        Err(e) => {
            warn!(
                "--sched-ext: scx_agentos NOT loaded: {e}. SRT agents fall back to \
                 cpu.weight={} (run `agentosd check`)",
                crate::sched::SRT_WEIGHT
            );
            None
        }
    }
}
