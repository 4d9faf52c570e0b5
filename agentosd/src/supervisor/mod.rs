//! The registry of agents and their lifecycle: start into a cgroup, watch the main process
//! through its pidfd, restart per policy with backoff, freeze/thaw through `cgroup.freeze`, stop
//! with SIGTERM then `cgroup.kill`, persist every change, and re-adopt running agents after a
//! daemon restart.
//!
//! Concurrency: one short `std::sync::Mutex` per agent for its data, one `tokio::sync::Mutex`
//! per agent that serialises operations (start, stop, freeze, the restart logic), and one tokio
//! task per running main process that waits on its pidfd (no thread per agent).

mod adopt;
mod agent;
mod agents_dir;
mod audit;
mod class;
mod denials;
mod disk;
mod enforce;
mod error;
mod exit;
mod freeze;
mod kill;
mod lifecycle;
mod mcp_socket;
mod mechanism;
mod models_socket;
mod reload;
mod services;
mod start;
mod stop;
mod telemetry;
mod tool_hooks;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use tokio::sync::mpsc::UnboundedSender;
use tracing::warn;

use crate::cgroup::{self, Cgroup};
use crate::logs;
use crate::spec::AgentSpec;
use crate::state::Store;
use crate::sys;
use agent::Inner;
pub use agent::{Agent, AgentStatus};
pub use class::plan_budgets;
pub use error::{Error, ErrorKind};
pub use mcp_socket::{AgentSocket, McpHooks};
pub use models_socket::ModelHooks;
pub use services::Services;

/// The lifecycle states, named like systemd's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum State {
    Starting,
    Running,
    Freezing,
    Frozen,
    Thawing,
    Stopping,
    /// Waiting out the backoff before a restart (systemd's `activating (auto-restart)`).
    Restarting,
    /// Stopped by the operator (or never started).
    Inactive,
    /// The main process exited with status 0 and no restart is due.
    Exited,
    /// Exited unsuccessfully, gave up restarting, or could not be started.
    Failed,
}

impl State {
    pub fn as_str(&self) -> &'static str {
        match self {
            State::Starting => "starting",
            State::Running => "running",
            State::Freezing => "freezing",
            State::Frozen => "frozen",
            State::Thawing => "thawing",
            State::Stopping => "stopping",
            State::Restarting => "restarting",
            State::Inactive => "inactive",
            State::Exited => "exited",
            State::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Option<State> {
        Some(match s {
            "starting" => State::Starting,
            "running" => State::Running,
            "freezing" => State::Freezing,
            "frozen" => State::Frozen,
            "thawing" => State::Thawing,
            "stopping" => State::Stopping,
            "restarting" => State::Restarting,
            "inactive" => State::Inactive,
            "exited" => State::Exited,
            "failed" => State::Failed,
            _ => return None,
        })
    }

    /// Whether processes may exist (or are about to).
    pub fn is_active(&self) -> bool {
        !matches!(self, State::Inactive | State::Exited | State::Failed)
    }
}

/// Changes the D-Bus layer turns into objects and signals.
#[derive(Debug, Clone)]
pub enum Event {
    New(Arc<Agent>),
    Changed(Arc<Agent>),
    Removed { id: String, object_path: String },
}

/// Daemon-wide settings the supervisor needs.
#[derive(Debug, Clone)]
pub struct Config {
    /// The cgroup the daemon owns; agents live under `ROOT/agents/<tenant>/<name>`.
    pub cgroup_root: PathBuf,
    pub state_dir: PathBuf,
    pub log_dir: PathBuf,
    pub agents_dir: PathBuf,
    /// How long after SIGTERM before `cgroup.kill`.
    pub stop_timeout: Duration,
    /// How long to wait for `cgroup.events` to confirm a freeze or thaw.
    pub freeze_timeout: Duration,
    /// Denial records per agent (`--denial-records-per-sec`, `--denial-records-burst`); the
    /// rest are counted in a summary record every 2 s (enforce/limit.rs).
    pub denial_records: crate::enforce::limit::Limits,
    /// Agents' disk quotas where the contract sets none (`--agent-disk-default`,
    /// `--agent-disk-inodes-default`); see storage/quota.rs.
    pub disk: crate::storage::quota::DiskDefaults,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// An agent's contract as it carries it: the text it was started from (persisted), where the
/// text came from (a file path or `dbus`), and the text parsed once.
#[derive(Debug, Clone)]
pub(crate) struct ContractText {
    pub text: String,
    pub origin: String,
    pub parsed: Option<Arc<contracts::Contract>>,
}

impl ContractText {
    /// Parse `text` once (see [`parse_once`]).
    fn new(text: String, origin: String) -> Self {
        let parsed = parse_once(&text, &origin);
        ContractText {
            text,
            origin,
            parsed,
        }
    }
}

/// A contract text parsed for the agent to carry; `None` when empty or when it does not parse
/// (whoever needs it then gets the parse error, see [`start::agent_contract`]).
fn parse_once(text: &str, origin: &str) -> Option<Arc<contracts::Contract>> {
    if text.trim().is_empty() {
        return None;
    }
    contracts::parse_contract(text, origin).ok().map(Arc::new)
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// The registry of agents.
pub struct Supervisor {
    cfg: Config,
    store: Store,
    root: Cgroup,
    agents_cg: Cgroup,
    cgroup_mount: PathBuf,
    agents: Mutex<BTreeMap<String, Arc<Agent>>>,
    events: UnboundedSender<Event>,
    boot_id: String,
    /// Admitted HRT reservations (see sched.rs).
    admission: crate::sched::Admission,
    /// The daemon-wide services (services.rs).
    services: Services,
    /// The agents' MCP sockets and the gate (set by the daemon). See supervisor_mcp.rs.
    mcp: std::sync::OnceLock<McpHooks>,
    /// The model gateway (set by the daemon when it has backends). See models_socket.rs.
    models: std::sync::OnceLock<ModelHooks>,
    /// Agent id → kernel denials reported since the daemon started, whatever refused them
    /// (cgroup BPF, BPF LSM, Landlock, seccomp). See supervisor_hooks.rs.
    denials: Mutex<BTreeMap<String, u64>>,
    /// Which denials get a record of their own (per-agent rate limit); see denials.rs.
    record_limit: Mutex<crate::enforce::limit::RecordLimiter>,
    /// Which refused D-Bus calls get a record of their own (per caller uid, the same rate);
    /// see denials.rs.
    call_limit: Mutex<crate::enforce::limit::RecordLimiter>,
}

impl std::fmt::Debug for Supervisor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Supervisor")
            .field("root", &self.root)
            .finish()
    }
}

impl Supervisor {
    /// Set up the cgroup layout under the configured root (which must exist and be cgroup2),
    /// with no services (library tests; the daemon uses [`Supervisor::with_services`]).
    pub fn new(cfg: Config, events: UnboundedSender<Event>) -> Result<Arc<Self>, Error> {
        Self::with_services(cfg, Services::default(), events)
    }

    /// Set up the cgroup layout (see [`Supervisor::prepare_root`]) and the registry over it,
    /// using `services`.
    pub fn with_services(
        cfg: Config,
        services: Services,
        events: UnboundedSender<Event>,
    ) -> Result<Arc<Self>, Error> {
        let cgroup_mount = Self::prepare_root(&cfg)?;
        Ok(Self::assemble(
            cfg,
            services,
            events,
            cgroup_mount,
            sys::boot_id(),
        ))
    }

    /// Make the daemon's cgroup root and `agents/` under it with the budget controllers, before
    /// anything attaches there (the daemon's network enforcer does); returns the cgroup2 mount.
    pub fn prepare_root(cfg: &Config) -> Result<PathBuf, Error> {
        let root = Cgroup::new(&cfg.cgroup_root);
        root.create()?;
        if !cgroup::is_cgroup2(root.path())? {
            return Err(Error::Kernel(format!(
                "{} is not on a cgroup2 file system; pass --cgroup-root under the cgroup2 mount",
                root.path().display()
            )));
        }
        let agents_cg = root.child("agents");
        agents_cg.create()?;
        // Best effort: controllers that can be enabled are; the rest is reported per agent.
        root.enable_subtree(cgroup::BUDGET_CONTROLLERS);
        agents_cg.enable_subtree(cgroup::BUDGET_CONTROLLERS);
        root.enable_subtree(&["cpuset"]);
        agents_cg.enable_subtree(&["cpuset"]);
        Ok(cgroup::cgroup2_mount().unwrap_or_else(|| PathBuf::from("/sys/fs/cgroup")))
    }

    /// The registry over `cfg.cgroup_root` (made and checked by the caller), with no agents.
    fn assemble(
        cfg: Config,
        services: Services,
        events: UnboundedSender<Event>,
        cgroup_mount: PathBuf,
        boot_id: String,
    ) -> Arc<Self> {
        let root = Cgroup::new(&cfg.cgroup_root);
        let limits = cfg.denial_records;
        Arc::new(Supervisor {
            store: Store::new(&cfg.state_dir),
            cfg,
            agents_cg: root.child("agents"),
            root,
            cgroup_mount,
            agents: Mutex::new(BTreeMap::new()),
            events,
            boot_id,
            admission: crate::sched::Admission::default(),
            services,
            mcp: std::sync::OnceLock::new(),
            models: std::sync::OnceLock::new(),
            denials: Mutex::default(),
            record_limit: Mutex::new(crate::enforce::limit::RecordLimiter::new(limits)),
            call_limit: Mutex::new(crate::enforce::limit::RecordLimiter::new(limits)),
        })
    }

    /// A supervisor over a root that is never created (no cgroup is touched): for unit tests of
    /// what does not reach the kernel.
    #[cfg(test)]
    pub(crate) fn for_test(events: UnboundedSender<Event>) -> Arc<Self> {
        let base = std::env::temp_dir().join("agentosd-unit-no-such-cgroup");
        let cfg = Config {
            cgroup_root: base.join("root"),
            state_dir: base.join("state"),
            log_dir: base.join("logs"),
            agents_dir: base.join("agents"),
            stop_timeout: Duration::from_secs(1),
            freeze_timeout: Duration::from_secs(1),
            denial_records: Default::default(),
            disk: Default::default(),
        };
        Self::assemble(cfg, Services::default(), events, base, String::new())
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    pub fn root(&self) -> &Cgroup {
        &self.root
    }

    pub fn cgroup_mount(&self) -> &Path {
        &self.cgroup_mount
    }

    /// Budget controllers that agents cannot get under this root.
    pub fn missing_controllers(&self) -> Vec<String> {
        cgroup::missing_budgets(&self.agents_cg.subtree_control().unwrap_or_default())
    }

    fn emit(&self, ev: Event) {
        let _ = self.events.send(ev);
    }

    fn changed(&self, agent: &Arc<Agent>) {
        self.persist(agent);
        self.emit(Event::Changed(agent.clone()));
    }

    fn persist(&self, agent: &Agent) {
        self.persist_as(agent, true);
    }

    /// `durable` false: written for a crash of the daemon only ([`crate::state::Store::save_unsynced`]).
    fn persist_as(&self, agent: &Agent, durable: bool) {
        let _g = lock(&agent.persist_lock);
        if lock(&agent.inner).removed {
            return;
        }
        let rec = agent.record();
        let saved = match durable {
            true => self.store.save(&rec),
            false => self.store.save_unsynced(&rec),
        };
        if let Err(e) = saved {
            warn!(agent = %agent.id, "cannot persist state: {e}");
        }
    }

    pub fn agents(&self) -> Vec<Arc<Agent>> {
        lock(&self.agents).values().cloned().collect()
    }

    /// How many agents the registry holds (without copying it, unlike `agents().len()`: this
    /// is asked at every start and removal).
    pub fn count(&self) -> usize {
        lock(&self.agents).len()
    }

    /// Find an agent by `tenant/name`, or by `name` when only one tenant has it.
    pub fn find(&self, key: &str) -> Result<Arc<Agent>, Error> {
        let agents = lock(&self.agents);
        if let Some(a) = agents.get(key) {
            return Ok(a.clone());
        }
        if let Some(a) = agents.values().find(|a| a.object_path == key) {
            return Ok(a.clone());
        }
        let matches: Vec<_> = agents.values().filter(|a| a.name == key).collect();
        match matches.len() {
            1 => Ok(matches[0].clone()),
            0 => Err(Error::NoSuchAgent(key.to_string())),
            _ => Err(Error::NoSuchAgent(format!(
                "{key} is ambiguous: {}; use TENANT/NAME",
                matches
                    .iter()
                    .map(|a| a.id.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        }
    }

    pub fn status_of(&self, agent: &Agent) -> AgentStatus {
        let mut st = agent.status(&self.cgroup_mount);
        st.denials = self.kernel_denials(&agent.id);
        st.syscalls = self.sysc().ok().map(|c| c.count(&agent.id));
        st.models = self.models.get().and_then(|m| m.gateway.usage(&agent.id));
        st.tool_calls = self.mcp.get().map_or(0, |m| m.service.calls_of(&agent.id));
        st.disk = self.disk_usage(&agent.id);
        st.daemon_cpu = self
            .mcp
            .get()
            .and_then(|m| m.ipc.cpu_ledger().usage(&agent.id))
            .map(|u| agentos_api::DaemonCpu {
                used_nsec: u.used_ns,
                throttles: u.pauses,
                throttled_ms: u.throttled_ns / 1_000_000,
                permille: u.permille,
                ceiling_permille: u.ceiling_permille,
                audit_nsec: u.audit_ns,
            });
        // Whether the file is there now, not when it was loaded (a deleted file is not enabled).
        st.enabled = self.enabled_now(agent);
        st
    }

    fn new_agent(&self, spec: AgentSpec, contract: ContractText, enabled: bool) -> Agent {
        let cg = cgroup::agent_cgroup(&self.root, &spec.tenant, &spec.name);
        Agent {
            id: spec.id(),
            tenant: spec.tenant.clone(),
            name: spec.name.clone(),
            object_path: crate::spec::agent_object_path(&spec.tenant, &spec.name),
            log_path: logs::log_path(&self.cfg.log_dir, &spec.tenant, &spec.name),
            overruns: Arc::default(),
            cgroup: cg,
            inner: Mutex::new(Inner {
                spec,
                parsed: contract.parsed,
                contract: contract.text,
                origin: contract.origin,
                enabled,
                pending: None,
                contract_loaded_us: now_us(),
                state: State::Inactive,
                result: String::new(),
                main_pid: None,
                main_start_time: None,
                pidfd: None,
                restarts: 0,
                exit_status: None,
                started_at_us: 0,
                boot_id: self.boot_id.clone(),
                generation: 0,
                unenforced: Vec::new(),
                notes: Vec::new(),
                removed: false,
            }),
            op: tokio::sync::Mutex::new(()),
            persist_lock: Mutex::new(()),
            wake: tokio::sync::Notify::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_roundtrip() {
        for s in [
            State::Starting,
            State::Running,
            State::Freezing,
            State::Frozen,
            State::Thawing,
            State::Stopping,
            State::Restarting,
            State::Inactive,
            State::Exited,
            State::Failed,
        ] {
            assert_eq!(State::parse(s.as_str()), Some(s));
        }
        assert!(State::Frozen.is_active());
        assert!(!State::Failed.is_active());
    }
}
