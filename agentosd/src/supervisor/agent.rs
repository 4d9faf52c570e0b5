//! One managed agent: its identity, cgroup, the data its lifecycle changes (behind a short
//! mutex) and the snapshots `status` and listings show.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::{State, lock};
use crate::cgroup::{self, Cgroup};
use crate::spec::AgentSpec;
use crate::state::AgentRecord;
use crate::sys::{self, ExitStatus};

/// A snapshot of one agent for listings, `status` and D-Bus properties (a wire type).
pub use agentos_api::AgentStatus;

pub(super) struct Inner {
    pub(super) spec: AgentSpec,
    pub(super) contract: String,
    /// `contract` parsed, once, when it was set; `None` for an agent started from a bare spec
    /// or a text that does not parse (see [`super::start::agent_contract`]).
    pub(super) parsed: Option<Arc<contracts::Contract>>,
    pub(super) origin: String,
    /// When the newest contract (`pending`, else `contract`) was loaded, µs since the epoch.
    pub(super) contract_loaded_us: u64,
    pub(super) enabled: bool,
    /// A contract loaded while the agent ran (`daemon-reload`, `reload`): it becomes the
    /// agent's at its next start (supervisor/reload.rs).
    pub(super) pending: Option<(AgentSpec, super::ContractText)>,
    pub(super) state: State,
    pub(super) result: String,
    pub(super) main_pid: Option<u32>,
    pub(super) main_start_time: Option<u64>,
    pub(super) pidfd: Option<Arc<OwnedFd>>,
    pub(super) restarts: u32,
    pub(super) exit_status: Option<ExitStatus>,
    pub(super) started_at_us: u64,
    pub(super) boot_id: String,
    /// Bumped by every operator action and every spawn; a watcher whose generation is stale
    /// only records the exit status and leaves everything else to the newer owner.
    pub(super) generation: u64,
    pub(super) unenforced: Vec<String>,
    pub(super) notes: Vec<String>,
    /// Forgotten by `remove`: never persisted again.
    pub(super) removed: bool,
}

/// One managed agent.
pub struct Agent {
    pub id: String,
    pub tenant: String,
    pub name: String,
    pub object_path: String,
    pub cgroup: Cgroup,
    pub log_path: PathBuf,
    /// Deadline overruns of the current run (HRT).
    pub(super) overruns: Arc<crate::sched::OverrunMonitor>,
    pub(super) inner: Mutex<Inner>,
    pub(super) op: tokio::sync::Mutex<()>,
    pub(super) persist_lock: Mutex<()>,
    pub(super) wake: tokio::sync::Notify,
}

impl Agent {
    /// Whose journal, for the log keeper (logs/).
    pub fn log_who(&self) -> crate::logs::Who<'_> {
        crate::logs::Who {
            id: &self.id,
            tenant: &self.tenant,
            name: &self.name,
            log_path: &self.log_path,
        }
    }

    /// The leaf the agent's own processes live in (`<cgroup>/main`); its tools live in
    /// `<cgroup>/tools/<id>`, the budgets are set on [`Agent::cgroup`] above both.
    pub fn main_cgroup(&self) -> Cgroup {
        self.cgroup.child(cgroup::AGENT_MAIN)
    }

    pub fn state(&self) -> State {
        lock(&self.inner).state
    }

    pub fn main_pid(&self) -> Option<u32> {
        lock(&self.inner).main_pid
    }

    pub fn spec(&self) -> AgentSpec {
        lock(&self.inner).spec.clone()
    }

    pub fn restarts(&self) -> u32 {
        lock(&self.inner).restarts
    }

    /// What a listing shows, from memory only and without copies: `f` sees the state, result,
    /// latency class and main PID under the agent's lock (keep it short: `ListAgents` writes its
    /// row there). `status` reads cgroup and /proc files besides; a listing of many agents
    /// must not.
    pub fn with_summary<R>(&self, f: impl FnOnce(&str, &str, &str, u32) -> R) -> R {
        let i = lock(&self.inner);
        f(
            i.state.as_str(),
            &i.result,
            &i.spec.latency_class,
            i.main_pid.unwrap_or(0),
        )
    }

    pub fn status(&self, cgroup_mount: &Path) -> AgentStatus {
        let (st, pidfd_alive) = {
            let i = lock(&self.inner);
            let cmd = i
                .spec
                .exec
                .as_ref()
                .map(|e| {
                    std::iter::once(e.command.clone())
                        .chain(e.args.iter().cloned())
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .unwrap_or_default();
            (
                AgentStatus {
                    id: self.id.clone(),
                    name: self.name.clone(),
                    tenant: self.tenant.clone(),
                    state: i.state.as_str().to_string(),
                    result: i.result.clone(),
                    main_pid: i.main_pid.unwrap_or(0),
                    control_group: self
                        .cgroup
                        .path()
                        .strip_prefix(cgroup_mount)
                        .map(|p| format!("/{}", p.display()))
                        .unwrap_or_else(|_| self.cgroup.path().display().to_string()),
                    latency_class: i.spec.latency_class.clone(),
                    cpu_usage_nsec: None,
                    memory_current: None,
                    tasks_current: 0,
                    restarts: i.restarts,
                    restart_policy: i.spec.restart.policy.as_str().to_string(),
                    started_at_us: i.started_at_us,
                    exit_status: i.exit_status.map(|s| s.describe()).unwrap_or_default(),
                    unenforced_budgets: i.unenforced.clone(),
                    notes: i.notes.clone(),
                    deadline_misses: (i.spec.latency() == Some(contracts::LatencyClass::Hrt))
                        .then(|| self.overruns.misses()),
                    denials: 0,
                    syscalls: None,
                    models: None,
                    tool_calls: 0,
                    daemon_cpu: None,
                    disk: None,
                    log_path: self.log_path.display().to_string(),
                    origin: i.origin.clone(),
                    enabled: i.enabled,
                    pending_contract: i.pending.is_some(),
                    contract_loaded_us: i.contract_loaded_us,
                    object_path: self.object_path.clone(),
                    command: cmd,
                    processes: Vec::new(),
                },
                i.state.is_active(),
            )
        };
        let mut st = st;
        if pidfd_alive && self.cgroup.exists() {
            let s = self.cgroup.stats();
            st.cpu_usage_nsec = s.cpu_usage_usec.map(|u| u * 1000);
            st.memory_current = s.memory_current;
            st.tasks_current = s.tasks_current;
            // The agent and its tools (`main` and `tools/*`): all count against its budgets.
            st.processes = self
                .cgroup
                .subtree_procs()
                .into_iter()
                .map(|p| {
                    (
                        p,
                        sys::process_ppid(p).unwrap_or(0),
                        sys::process_cmdline(p).unwrap_or_default(),
                    )
                })
                .collect();
        }
        st
    }

    pub(super) fn record(&self) -> AgentRecord {
        let i = lock(&self.inner);
        AgentRecord {
            spec: i.spec.clone(),
            contract: i.contract.clone(),
            origin: i.origin.clone(),
            enabled: i.enabled,
            state: i.state.as_str().to_string(),
            result: i.result.clone(),
            main_pid: i.main_pid,
            main_start_time: i.main_start_time,
            cgroup: self.cgroup.path().to_path_buf(),
            restarts: i.restarts,
            exit_status: i.exit_status,
            started_at_us: i.started_at_us,
            boot_id: i.boot_id.clone(),
            contract_loaded_us: i.contract_loaded_us,
        }
    }
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent").field("id", &self.id).finish()
    }
}
