//! The registry of agents and their lifecycle: start into a cgroup, watch the main process
//! through its pidfd, restart per policy with backoff, freeze/thaw through `cgroup.freeze`, stop
//! with SIGTERM then `cgroup.kill`, persist every change, and re-adopt running agents after a
//! daemon restart.
//!
//! Concurrency: one short `std::sync::Mutex` per agent for its data, one `tokio::sync::Mutex`
//! per agent that serialises operations (start, stop, freeze, the restart logic), and one tokio
//! task per running main process that waits on its pidfd (no thread per agent).

use std::collections::BTreeMap;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc::UnboundedSender;
use tracing::{info, warn};

use crate::cgroup::{self, Cgroup};
use crate::logs;
use crate::spawn::{self, SpawnError};
use crate::spec::{AgentSpec, RestartPolicy};
use crate::state::{AgentRecord, Store};
use crate::sys::{self, ExitStatus};

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

/// Errors of supervisor operations; each maps to an `org.agentos1.Error.*` name.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no such agent: {0}")]
    NoSuchAgent(String),
    #[error("{0}")]
    InvalidContract(String),
    #[error("{0}")]
    AlreadyExists(String),
    #[error("{0}")]
    InvalidState(String),
    #[error("{0}")]
    Kernel(String),
    #[error("{0}")]
    Unenforceable(String),
    #[error("{0}")]
    ExecFailed(String),
    /// HRT admission refused the reservation (the message has the numbers).
    #[error("{0}")]
    Unschedulable(String),
}

impl Error {
    /// The last component of the D-Bus error name.
    pub fn dbus_name(&self) -> &'static str {
        match self {
            Error::NoSuchAgent(_) => "NoSuchAgent",
            Error::InvalidContract(_) => "InvalidContract",
            Error::AlreadyExists(_) => "AlreadyExists",
            Error::InvalidState(_) => "InvalidState",
            Error::Kernel(_) => "Kernel",
            Error::Unenforceable(_) => "Unenforceable",
            Error::ExecFailed(_) => "ExecFailed",
            Error::Unschedulable(_) => "Unschedulable",
        }
    }
}

impl From<cgroup::CgroupError> for Error {
    fn from(e: cgroup::CgroupError) -> Self {
        Error::Kernel(e.to_string())
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
}

/// A snapshot of one agent for listings, `status` and D-Bus properties (a wire type).
pub use agentos_api::AgentStatus;

struct Inner {
    spec: AgentSpec,
    contract: String,
    origin: String,
    enabled: bool,
    state: State,
    result: String,
    main_pid: Option<u32>,
    main_start_time: Option<u64>,
    pidfd: Option<Arc<OwnedFd>>,
    restarts: u32,
    exit_status: Option<ExitStatus>,
    started_at_us: u64,
    boot_id: String,
    /// Bumped by every operator action and every spawn; a watcher whose generation is stale
    /// only records the exit status and leaves everything else to the newer owner.
    generation: u64,
    unenforced: Vec<String>,
    notes: Vec<String>,
    /// Forgotten by `remove`: never persisted again.
    removed: bool,
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
    overruns: Arc<crate::sched::OverrunMonitor>,
    inner: Mutex<Inner>,
    op: tokio::sync::Mutex<()>,
    persist_lock: Mutex<()>,
    wake: tokio::sync::Notify,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent").field("id", &self.id).finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

impl Agent {
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

    /// What a listing shows, from memory only: (state, result, latency class, main PID).
    /// `status` reads cgroup and /proc files besides; a listing of many agents must not.
    pub fn summary(&self) -> (String, String, String, u32) {
        let i = lock(&self.inner);
        (
            i.state.as_str().to_string(),
            i.result.clone(),
            i.spec.latency_class.clone(),
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
                    deadline_misses: (i.spec.latency_class == "HRT")
                        .then(|| self.overruns.misses()),
                    denials: 0,
                    syscalls: None,
                    log_path: self.log_path.display().to_string(),
                    origin: i.origin.clone(),
                    enabled: i.enabled,
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

    fn record(&self) -> AgentRecord {
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
        }
    }
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
    /// The audit trail (set by the daemon; absent in library tests). See supervisor_hooks.rs.
    audit: std::sync::OnceLock<Arc<crate::audit_trail::AuditTrail>>,
    /// What this host offers contract bindings (for the binding hash in audit records).
    offer: std::sync::OnceLock<contracts::HostOffer>,
    /// cgroup BPF network enforcement, or why it is unavailable (set by the daemon).
    net: std::sync::OnceLock<Result<Arc<crate::enforce::net::NetEnforcer>, String>>,
    /// BPF LSM filesystem scopes, or why they are unavailable (set by the daemon).
    fs: std::sync::OnceLock<Result<Arc<crate::enforce::fs::FsEnforcer>, String>>,
    /// Per-agent syscall counts when the operator enabled them, or why they are off.
    sysc: std::sync::OnceLock<Result<Arc<crate::enforce::sysc::SyscCounter>, String>>,
    /// The sched_ext scheduler scx_agentos when the daemon loaded it (see scx.rs).
    scx: std::sync::OnceLock<Arc<crate::scx::Scx>>,
    /// The agents' MCP sockets and the gate (set by the daemon). See supervisor_mcp.rs.
    mcp: std::sync::OnceLock<mcp_hooks::McpHooks>,
    /// Agent id → kernel denials reported since the daemon started, whatever refused them
    /// (cgroup BPF, BPF LSM, Landlock, seccomp). See supervisor_hooks.rs.
    denials: Mutex<BTreeMap<String, u64>>,
}

#[path = "supervisor_hooks.rs"]
mod hooks;
#[path = "supervisor_mcp.rs"]
mod mcp_hooks;
pub use mcp_hooks::{AgentSocket, McpHooks};

impl std::fmt::Debug for Supervisor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Supervisor")
            .field("root", &self.root)
            .finish()
    }
}

const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

impl Supervisor {
    /// Set up the cgroup layout under the configured root (which must exist and be cgroup2).
    pub fn new(cfg: Config, events: UnboundedSender<Event>) -> Result<Arc<Self>, Error> {
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
        let cgroup_mount =
            cgroup::cgroup2_mount().unwrap_or_else(|| PathBuf::from("/sys/fs/cgroup"));
        Ok(Arc::new(Supervisor {
            store: Store::new(&cfg.state_dir),
            cfg,
            root,
            agents_cg,
            cgroup_mount,
            agents: Mutex::new(BTreeMap::new()),
            events,
            boot_id: sys::boot_id(),
            admission: crate::sched::Admission::default(),
            audit: std::sync::OnceLock::new(),
            offer: std::sync::OnceLock::new(),
            net: std::sync::OnceLock::new(),
            fs: std::sync::OnceLock::new(),
            sysc: std::sync::OnceLock::new(),
            scx: std::sync::OnceLock::new(),
            mcp: std::sync::OnceLock::new(),
            denials: Mutex::default(),
        }))
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
        let have = self.agents_cg.subtree_control().unwrap_or_default();
        cgroup::BUDGET_CONTROLLERS
            .iter()
            .filter(|c| !have.iter().any(|h| h == *c))
            .map(|c| c.to_string())
            .collect()
    }

    fn emit(&self, ev: Event) {
        let _ = self.events.send(ev);
    }

    fn changed(&self, agent: &Arc<Agent>) {
        self.persist(agent);
        self.emit(Event::Changed(agent.clone()));
    }

    fn persist(&self, agent: &Agent) {
        let _g = lock(&agent.persist_lock);
        if lock(&agent.inner).removed {
            return;
        }
        let rec = agent.record();
        if let Err(e) = self.store.save(&rec) {
            warn!(agent = %agent.id, "cannot persist state: {e}");
        }
    }

    pub fn agents(&self) -> Vec<Arc<Agent>> {
        lock(&self.agents).values().cloned().collect()
    }

    /// Classify SRT/DT agents with `scx` from now on (the daemon sets it once, before readopt).
    pub fn set_scx(&self, scx: Arc<crate::scx::Scx>) {
        let _ = self.scx.set(scx);
    }

    /// Put the agent's cgroup `cg` into scx_agentos's class map (a note for status), if loaded.
    fn scx_register(&self, agent: &Agent, cg: &Cgroup, latency: &str) -> Option<String> {
        self.scx
            .get()
            .and_then(|s| s.register(&agent.id, cg.path(), latency))
    }

    /// Take the agent's cgroup out of scx_agentos's class map.
    fn scx_forget(&self, agent: &Agent) {
        if let Some(s) = self.scx.get() {
            s.forget(&agent.id);
        }
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
        st
    }

    fn new_agent(&self, spec: AgentSpec, contract: String, origin: String, enabled: bool) -> Agent {
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
                contract,
                origin,
                enabled,
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

    /// Parse a contract and start the agent it describes.
    pub async fn start_contract(
        self: &Arc<Self>,
        text: &str,
        origin: &str,
        enabled: bool,
    ) -> Result<Arc<Agent>, Error> {
        let contract = contracts::parse_contract(text, origin)
            .map_err(|e| Error::InvalidContract(e.to_string()))
            .inspect_err(|e| self.audit_refused("", "", origin, e))?;
        let spec = AgentSpec::from_contract(&contract);
        self.start_spec(spec, text.to_string(), origin.to_string(), enabled)
            .await
    }

    /// Start an agent from its spec. An agent with the same id that is still active is an
    /// `AlreadyExists` error; an inactive one is replaced by the new contract and started.
    pub async fn start_spec(
        self: &Arc<Self>,
        spec: AgentSpec,
        contract: String,
        origin: String,
        enabled: bool,
    ) -> Result<Arc<Agent>, Error> {
        let (tenant, name, from) = (spec.tenant.clone(), spec.name.clone(), origin.clone());
        let mut launched = false;
        let r = self
            .start_spec_inner(spec, contract, origin, enabled, &mut launched)
            .await;
        if let (Err(e), false) = (&r, launched) {
            // launch() records its own outcome; this is a refusal before anything ran.
            self.audit_refused(&tenant, &name, &from, e);
        }
        r
    }

    async fn start_spec_inner(
        self: &Arc<Self>,
        spec: AgentSpec,
        contract: String,
        origin: String,
        enabled: bool,
        launched: &mut bool,
    ) -> Result<Arc<Agent>, Error> {
        check_name(&spec.tenant, "tenant")?;
        check_name(&spec.name, "name")?;
        if spec.exec.is_none() {
            return Err(Error::InvalidContract(format!(
                "{origin}: contract {} has no exec: nothing to run",
                spec.id()
            )));
        }
        let id = spec.id();
        if spec.budgets.must {
            // Refuse before anything exists (no object, no cgroup) when a required budget
            // cannot be enforced under this root; launch() checks again per agent cgroup.
            let missing = self.missing_controllers();
            let unenforceable: Vec<String> = cgroup::budget_files(&spec.budgets)
                .into_iter()
                .filter(|(ctl, _, _)| missing.iter().any(|m| m == ctl))
                .map(|(ctl, file, value)| {
                    format!("{file}={value} ({ctl} controller not available)")
                })
                .collect();
            if !unenforceable.is_empty() {
                return Err(Error::Unenforceable(format!(
                    "{origin}: agent {id} requires its budgets (must) but this host cannot enforce: {}; \
                     the cgroup2 controllers are missing under {} (run `agentosd check`)",
                    unenforceable.join(", "),
                    self.root.path().display()
                )));
            }
        }
        if let (Some(d), "HRT") = (&spec.sched.deadline, spec.latency_class.as_str()) {
            // Refuse an unschedulable agent before anything exists; launch() admits it.
            self.admission
                .check(&id, d, &spec.sched.cpuset)
                .map_err(Error::Unschedulable)?;
        }
        let (agent, is_new) = {
            let mut agents = lock(&self.agents);
            match agents.get(&id) {
                Some(a) => (a.clone(), false),
                None => {
                    let path = crate::spec::agent_object_path(&spec.tenant, &spec.name);
                    if agents.values().any(|a| a.object_path == path) {
                        return Err(Error::AlreadyExists(format!(
                            "object path {path} of {id} is taken by another agent"
                        )));
                    }
                    let a = Arc::new(self.new_agent(
                        spec.clone(),
                        contract.clone(),
                        origin.clone(),
                        enabled,
                    ));
                    agents.insert(id.clone(), a.clone());
                    (a, true)
                }
            }
        };
        let op = agent.op.lock().await;
        if !is_new {
            let mut i = lock(&agent.inner);
            if i.state.is_active() {
                return Err(Error::AlreadyExists(format!(
                    "agent {id} is already {} (PID {}); stop it first or use restart",
                    i.state.as_str(),
                    i.main_pid.unwrap_or(0)
                )));
            }
            i.spec = spec;
            i.contract = contract;
            i.origin = origin;
            i.enabled |= enabled;
            i.restarts = 0;
        } else {
            self.emit(Event::New(agent.clone()));
        }
        *launched = true;
        let r = self.launch(&agent).await;
        drop(op);
        r.map(|()| agent)
    }

    /// Start a known agent again by name (after stop, exit or failure).
    pub async fn start_existing(self: &Arc<Self>, agent: &Arc<Agent>) -> Result<(), Error> {
        let _op = agent.op.lock().await;
        {
            let mut i = lock(&agent.inner);
            if i.state.is_active() {
                return Err(Error::AlreadyExists(format!(
                    "agent {} is already {}",
                    agent.id,
                    i.state.as_str()
                )));
            }
            i.restarts = 0;
        }
        self.launch(agent).await
    }

    /// Create the cgroup, apply budgets, spawn the main process, start watching it. Caller holds
    /// the op lock.
    async fn launch(self: &Arc<Self>, agent: &Arc<Agent>) -> Result<(), Error> {
        let (spec, generation) = {
            let mut i = lock(&agent.inner);
            i.generation += 1;
            i.state = State::Starting;
            i.result.clear();
            i.exit_status = None;
            (i.spec.clone(), i.generation)
        };
        self.emit(Event::Changed(agent.clone()));
        let spawned = match self.audit_start(agent).await {
            Ok(()) => self.prepare_and_spawn(agent, &spec).await,
            Err(e) => Err(e),
        };
        match spawned {
            Ok((child, unenforced, notes)) => {
                let pidfd = Arc::new(child.pidfd);
                {
                    let mut i = lock(&agent.inner);
                    i.state = State::Running;
                    i.main_pid = Some(child.pid);
                    i.main_start_time = sys::process_start_time(child.pid);
                    i.pidfd = Some(pidfd.clone());
                    i.started_at_us = now_us();
                    i.boot_id = self.boot_id.clone();
                    i.unenforced = unenforced;
                    i.notes = notes;
                }
                logs::append_note(
                    &agent.log_path,
                    &format!("started {}, main process PID {}", agent.id, child.pid),
                );
                info!(agent = %agent.id, pid = child.pid, "started");
                self.audit_event(
                    agent,
                    "started",
                    Some(audit::Decision::Allow),
                    serde_json::json!({
                        "pid": child.pid,
                        "cgroup": agent.cgroup.path().display().to_string(),
                        "cgroup_id": hooks::cgroup_id(agent.cgroup.path()),
                        "main_cgroup_id": hooks::cgroup_id(agent.main_cgroup().path()),
                    }),
                );
                self.changed(agent);
                if spec.sched.deadline.is_some() && spec.latency_class == "HRT" {
                    self.monitor_overruns(agent.clone(), generation, child.pid);
                }
                self.watch(agent.clone(), generation, pidfd);
                Ok(())
            }
            Err(e) => {
                self.admission.release(&agent.id);
                // A failed start leaves nothing: whatever the agent or a tool started is
                // killed with the whole subtree, then the cgroup tree goes.
                self.kill_and_wait(agent).await;
                let _ = self.remove_cgroup(agent).await;
                self.net_clear(agent);
                self.scx_forget(agent);
                self.mcp_forget(agent);
                {
                    let mut i = lock(&agent.inner);
                    i.state = State::Failed;
                    i.result = e.to_string();
                    i.main_pid = None;
                    i.pidfd = None;
                }
                logs::append_note(&agent.log_path, &format!("failed to start: {e}"));
                warn!(agent = %agent.id, "start failed: {e}");
                self.audit_event(
                    agent,
                    "start-failed",
                    Some(audit::Decision::Deny),
                    serde_json::json!({"reason": e.to_string(), "error": e.dbus_name()}),
                );
                self.changed(agent);
                Err(e)
            }
        }
    }

    async fn prepare_and_spawn(
        &self,
        agent: &Agent,
        spec: &AgentSpec,
    ) -> Result<(spawn::Child, Vec<String>, Vec<String>), Error> {
        let Some(exec) = spec.exec.clone() else {
            return Err(Error::InvalidContract(format!("{} has no exec", agent.id)));
        };
        let tenant_cg = self.agents_cg.child(&spec.tenant);
        if !tenant_cg.exists() {
            tenant_cg.create()?;
        }
        // Every time, not only on creation: a tenant cgroup made by an older daemon gets the
        // controllers this one uses (a no-op when they are on or not available).
        tenant_cg.enable_subtree(cgroup::BUDGET_CONTROLLERS);
        tenant_cg.enable_subtree(&["cpuset"]);
        let cg = &agent.cgroup;
        if cg.exists() {
            if cg.populated() {
                // Leftovers of an earlier run: never put two generations in one cgroup.
                cg.kill()?;
                cg.wait_events("leftover processes to die", Duration::from_secs(5), |e| {
                    !e.populated
                })
                .await?;
            }
            // Always start in a fresh cgroup. Besides clearing a stale freeze, this works around
            // a kernel bug seen on 6.18: after `cgroup.kill` was written to a cgroup, every
            // process later born into it with clone3(CLONE_INTO_CGROUP) gets SIGKILL at once
            // (the fork compares the target cgroup's kill_seq with the parent's).
            cg.remove()?;
        }
        cg.create()?;
        // The agent's own processes in a leaf of their own, its tools beside it in `tools/`:
        // the budgets below are set on `cg` and cover both (no-internal-process rule).
        let main = agent.main_cgroup();
        main.create_in_existing()?;
        cg.enable_subtree(cgroup::AGENT_CHILD_CONTROLLERS);
        // Network policy in the BPF map before the first process exists, keyed by the leaf the
        // agent's processes run in (bpf_get_current_cgroup_id()).
        let net_notes = self.net_prepare(agent, &main).await?;
        // The class in scx_agentos's map before the first process exists too.
        let scx_note = self.scx_register(agent, cg, &spec.latency_class);
        // Budgets.
        let available = cg.controllers().unwrap_or_default();
        let (to_write, unenforced) = plan_budgets(&available, &spec.budgets);
        if spec.budgets.must && !unenforced.is_empty() {
            let _ = cg.remove();
            return Err(Error::Unenforceable(format!(
                "agent {} requires its budgets (must) but this cgroup cannot enforce: {}; \
                 the cgroup2 controllers are missing under {} (run `agentosd check`)",
                agent.id,
                unenforced.join(", "),
                self.root.path().display()
            )));
        }
        for (file, value) in to_write {
            cg.set(file, &value)?;
        }
        let (child_sched, notes, unenforced) =
            self.apply_class(agent, spec, cg, &available, unenforced)?;
        let sandbox = sandbox_for(&self.cfg.state_dir, agent)?;
        let mut notes = notes;
        notes.extend(sandbox.notes.iter().map(|n| format!("sandbox: {n}")));
        notes.extend(net_notes);
        notes.extend(scx_note);
        // Command.
        let mut env: BTreeMap<String, String> = BTreeMap::new();
        env.insert("PATH".into(), DEFAULT_PATH.into());
        env.insert("AGENTOS_AGENT".into(), agent.id.clone());
        env.insert("AGENTOS_AGENT_NAME".into(), agent.name.clone());
        env.insert("AGENTOS_TENANT".into(), agent.tenant.clone());
        env.extend(sandbox.env());
        for (k, v) in &exec.env {
            env.insert(k.clone(), v.clone());
        }
        // After the contract's env: an agent cannot be pointed at another socket.
        let socket = self.mcp_open(agent)?;
        if let Some(s) = &socket {
            env.insert(agentos_api::SOCKET_ENV.into(), s.path.display().to_string());
            env.insert(
                agentos_api::SOCKET_FD_ENV.into(),
                std::os::fd::AsRawFd::as_raw_fd(&s.inherited).to_string(),
            );
        }
        let path = env.get("PATH").cloned().unwrap_or_default();
        let program = spawn::resolve_command(&exec.command, &path)
            .map_err(|e| Error::ExecFailed(format!("agent {}: {e}", agent.id)))?;
        let cmd = spawn::Command {
            program,
            args: exec.args.clone(),
            env: env.into_iter().collect(),
            cwd: exec
                .working_directory
                .clone()
                .unwrap_or_else(|| PathBuf::from("/")),
            log_file: agent.log_path.clone(),
            sched: child_sched,
            sandbox: Some(sandbox),
            inherit_fd: socket.map(|s| s.inherited),
        };
        logs::append_note(
            &agent.log_path,
            &format!("starting {}: {}", agent.id, cmd.program.display()),
        );
        let dirfd = main.open_dir()?;
        let id = agent.id.clone();
        let child = tokio::task::spawn_blocking(move || spawn::spawn(&cmd, &dirfd))
            .await
            .map_err(|e| Error::Kernel(format!("spawn task: {e}")))?
            .map_err(|e| match e {
                SpawnError::Child { .. } | SpawnError::NotFound { .. } => {
                    Error::ExecFailed(format!("agent {id}: {e}"))
                }
                other => Error::Kernel(format!("agent {id}: {other}")),
            })?;
        Ok((child, unenforced, notes))
    }

    /// Admit (HRT) and apply the latency class to the fresh cgroup `cg`; returns what the child
    /// does before execve, the notes and the unenforced list extended by the class's.
    fn apply_class(
        &self,
        agent: &Agent,
        spec: &AgentSpec,
        cg: &Cgroup,
        available: &[String],
        mut unenforced: Vec<String>,
    ) -> Result<(crate::sched::ChildSched, Vec<String>, Vec<String>), Error> {
        let hrt = spec.latency_class == "HRT";
        let cpu = match (&spec.sched.deadline, hrt) {
            (Some(d), true) => Some(
                self.admission
                    .admit(&agent.id, d, &spec.sched.cpuset)
                    .inspect_err(|_| {
                        let _ = cg.remove();
                    })
                    .map_err(Error::Unschedulable)?,
            ),
            _ => None,
        };
        agent.overruns.reset();
        let plan = crate::sched::plan(
            &spec.latency_class,
            &spec.sched,
            available,
            cpu,
            spec.budgets.memory_bytes,
            crate::sched::scx_agentos_loaded(),
        );
        let mut notes = plan.notes;
        unenforced.extend(plan.unenforced);
        let mut plan_files = plan.cgroup_files;
        // A deadline task may be pinned only inside a valid partition root of its own, and a
        // partition root needs a partition-root parent: without one, do not pin at all.
        let parent_partition = cg
            .path()
            .parent()
            .map(|p| p.join("cpuset.cpus.partition"))
            .filter(|p| p.exists())
            .map(|p| std::fs::read_to_string(p).unwrap_or_default());
        if plan_files
            .iter()
            .any(|(f, _)| *f == "cpuset.cpus.partition")
            && let Some(state) = parent_partition
            && !crate::sched::partition_is_valid_root(&state)
        {
            plan_files.retain(|(f, _)| !f.starts_with("cpuset."));
            notes.retain(|n| !n.starts_with("pinned:"));
            unenforced.push(format!(
                "cpuset pinning: the parent cgroup's cpuset.cpus.partition is {:?}, so this \
                 cgroup cannot be an exclusive partition (needed to pin a deadline task); \
                 running unpinned",
                state.trim()
            ));
        }
        let mut partition_failed = false;
        for (file, value) in &plan_files {
            if partition_failed && file.starts_with("cpuset") {
                continue;
            }
            if let Err(e) = cg.set(file, value) {
                if *file == "cpuset.cpus.partition" || *file == "cpuset.cpus" {
                    // Without an exclusive partition a pinned deadline task is refused
                    // (its affinity must span the root domain): run unpinned instead.
                    unpin(cg);
                    partition_failed = true;
                    notes.retain(|n| !n.starts_with("pinned:"));
                    unenforced.push(format!("cpuset pinning {file}={value} ({e})"));
                } else {
                    unenforced.push(format!("{file}={value} ({e})"));
                }
            }
        }
        if !partition_failed
            && plan_files
                .iter()
                .any(|(f, _)| *f == "cpuset.cpus.partition")
        {
            // The kernel takes the write even when the partition cannot be valid (its parent is
            // no partition root) and then reads back "root invalid (…)": the task would be
            // pinned outside any root domain of its own and sched_setattr(SCHED_DEADLINE) fails
            // with EPERM. Only a valid partition keeps the pin.
            let state = std::fs::read_to_string(cg.path().join("cpuset.cpus.partition"))
                .unwrap_or_default();
            if !crate::sched::partition_is_valid_root(&state) {
                unpin(cg);
                notes.retain(|n| !n.starts_with("pinned:"));
                unenforced.push(format!(
                    "cpuset pinning: cpuset.cpus.partition is {:?}: an exclusive CPU for a \
                     deadline task needs every ancestor cgroup to be a partition root; running \
                     unpinned",
                    state.trim()
                ));
            }
        }
        Ok((plan.child, notes, unenforced))
    }

    /// Sample the HRT agent's threads for deadline overruns while this run lasts.
    fn monitor_overruns(&self, agent: Arc<Agent>, generation: u64, pid: u32) {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(crate::sched::MONITOR_INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                tick.tick().await;
                if lock(&agent.inner).generation != generation || !agent.overruns.sample(pid) {
                    return;
                }
            }
        });
    }

    /// Wait for the main process (`pidfd`) to exit, then apply the restart policy.
    fn watch(self: &Arc<Self>, agent: Arc<Agent>, generation: u64, pidfd: Arc<OwnedFd>) {
        let sup = self.clone();
        tokio::spawn(async move {
            sup.watch_loop(agent, generation, pidfd).await;
        });
    }

    async fn watch_loop(self: Arc<Self>, agent: Arc<Agent>, generation: u64, pidfd: Arc<OwnedFd>) {
        {
            let status = wait_exit(&pidfd).await;
            let pid = {
                let mut i = lock(&agent.inner);
                let pid = i.main_pid;
                if i.pidfd.as_ref().is_some_and(|p| Arc::ptr_eq(p, &pidfd)) {
                    i.exit_status = Some(status);
                    i.main_pid = None;
                    i.main_start_time = None;
                    i.pidfd = None;
                }
                pid
            };
            drop(pidfd);
            logs::append_note(
                &agent.log_path,
                &format!(
                    "main process PID {} exited, {}",
                    pid.unwrap_or(0),
                    status.describe()
                ),
            );
            let op = agent.op.lock().await;
            let (delay, restart_no) = {
                let mut i = lock(&agent.inner);
                if i.generation != generation {
                    // An operator action (stop, restart, kill…) owns what happens next.
                    drop(i);
                    self.persist(&agent);
                    return;
                }
                let failed = !status.success();
                // Each run has a fresh cgroup, so any OOM kill counted there is this run's.
                let oom = agent.cgroup.oom_kills() > 0;
                let what = if oom {
                    format!("oom-kill, {}", status.describe())
                } else {
                    status.describe()
                };
                let restart = match i.spec.restart.policy {
                    RestartPolicy::No => false,
                    RestartPolicy::OnFailure => failed,
                    RestartPolicy::Always => true,
                };
                if restart && i.restarts >= i.spec.restart.limit {
                    i.state = State::Failed;
                    i.result = format!(
                        "start-limit-hit: gave up after {} restarts ({what})",
                        i.restarts
                    );
                    (None, 0)
                } else if restart {
                    let n = i.restarts;
                    i.state = State::Restarting;
                    i.result = format!("auto-restart after {what}");
                    (
                        Some(Duration::from_millis(i.spec.restart.delay_ms(n))),
                        n + 1,
                    )
                } else {
                    i.state = if failed { State::Failed } else { State::Exited };
                    i.result = if failed && oom {
                        "oom-kill".to_string()
                    } else if failed {
                        match status {
                            ExitStatus::Exited(_) => "exit-code".to_string(),
                            ExitStatus::Signaled(_) => "signal".to_string(),
                            ExitStatus::Unknown => {
                                "exited while re-adopted, status unknown".to_string()
                            }
                        }
                    } else {
                        "success".to_string()
                    };
                    (None, 0)
                }
            };
            // The main process is gone: nothing else of this run may stay (like systemd's
            // KillMode=control-group). The cgroup goes too; a restart makes a fresh one.
            self.kill_and_wait(&agent).await;
            self.admission.release(&agent.id);
            let _ = self.remove_cgroup(&agent).await;
            self.net_clear(&agent);
            self.scx_forget(&agent);
            self.mcp_forget(&agent);
            self.audit_exit(&agent, pid, &status);
            let Some(delay) = delay else {
                info!(agent = %agent.id, state = agent.state().as_str(), "main process exited");
                self.changed(&agent);
                return;
            };
            self.changed(&agent);
            drop(op);
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = agent.wake.notified() => {}
            }
            let _op = agent.op.lock().await;
            {
                let mut i = lock(&agent.inner);
                if i.generation != generation || i.state != State::Restarting {
                    return;
                }
                i.restarts = restart_no;
            }
            logs::append_note(
                &agent.log_path,
                &format!("restart {restart_no} of {}", agent.id),
            );
            self.audit_event(
                &agent,
                "restarted",
                None,
                serde_json::json!({"restart": restart_no, "by": "restart policy"}),
            );
            // launch() starts a new watcher; this one ends.
            let _ = self.launch(&agent).await;
        }
    }

    /// Bring a re-adopted agent's cgroup into this layout, after its policies are keyed by
    /// `main`: processes of the old layout (directly in `agents/<tenant>/<name>`) move into
    /// `main`; tool processes the previous daemon left in `tools/` are killed (their calls died
    /// with it); the agent's cgroup then hands its children the tool controllers. Returns notes
    /// for the re-adoption report; an agent that cannot be moved is refused: it is killed.
    async fn adopt_layout(&self, agent: &Agent, main: &Cgroup) -> Vec<String> {
        let mut notes = Vec::new();
        match agent.cgroup.move_procs_into(main) {
            Ok(0) => {}
            Ok(n) => notes.push(format!(
                "moved {n} process(es) of the old cgroup layout into {}",
                main.path().display()
            )),
            Err(e) => {
                notes.push(format!(
                    "cannot move its processes into {} ({e}); refused: killing it",
                    main.path().display()
                ));
                let _ = agent.cgroup.kill();
                return notes;
            }
        }
        let tools = agent.cgroup.child(cgroup::AGENT_TOOLS);
        if tools.exists() {
            if tools.populated() {
                notes.push(
                    "killed the tool processes the previous daemon left in its tools/ cgroup"
                        .into(),
                );
            }
            let _ = tools.kill();
            let _ = tools
                .wait_events("left tool processes to die", Duration::from_secs(5), |e| {
                    !e.populated
                })
                .await;
            if let Err(e) = tools.remove() {
                notes.push(e.to_string());
            }
        }
        agent.cgroup.enable_subtree(cgroup::AGENT_CHILD_CONTROLLERS);
        notes
    }

    /// `cgroup.kill` and wait until the cgroup is empty (bounded).
    async fn kill_and_wait(&self, agent: &Agent) {
        if agent.cgroup.populated() {
            if let Err(e) = agent.cgroup.kill() {
                warn!(agent = %agent.id, "{e}");
            }
            if let Err(e) = agent
                .cgroup
                .wait_events(
                    "processes to die after cgroup.kill",
                    Duration::from_secs(10),
                    |e| !e.populated,
                )
                .await
            {
                warn!(agent = %agent.id, "{e}");
            }
        }
    }

    /// Remove the agent's cgroup tree (`main`, `tools/*`, then the agent's), bottom-up. A tool
    /// call that raced with the stop may have made a tool cgroup and a process in it after
    /// `cgroup.kill`: kill the subtree again and retry, a few times.
    async fn remove_cgroup(&self, agent: &Agent) -> Result<(), cgroup::CgroupError> {
        let mut last = Ok(());
        for _ in 0..3 {
            last = agent.cgroup.remove();
            if last.is_ok() {
                return Ok(());
            }
            self.kill_and_wait(agent).await;
        }
        last
    }

    /// Stop: thaw if frozen, SIGTERM the main process, wait for the agent's own processes up to
    /// the stop timeout, then `cgroup.kill` on the agent's whole subtree (its tools and MCP
    /// servers too), remove the cgroup tree. Idempotent.
    pub async fn stop(self: &Arc<Self>, agent: &Arc<Agent>) -> Result<(), Error> {
        let _op = agent.op.lock().await;
        self.stop_locked(agent, State::Inactive, "stopped").await
    }

    async fn stop_locked(
        &self,
        agent: &Arc<Agent>,
        final_state: State,
        result: &str,
    ) -> Result<(), Error> {
        let (was_frozen, pidfd) = {
            let mut i = lock(&agent.inner);
            i.generation += 1;
            let was = i.state;
            if !was.is_active() && !agent.cgroup.populated() {
                // Nothing runs; still clear a stale cgroup.
                drop(i);
                let _ = agent.cgroup.remove();
                return Ok(());
            }
            i.state = State::Stopping;
            (
                matches!(was, State::Frozen | State::Freezing),
                i.pidfd.clone(),
            )
        };
        agent.wake.notify_waiters();
        self.emit(Event::Changed(agent.clone()));
        if was_frozen || agent.cgroup.events().map(|e| e.frozen).unwrap_or(false) {
            let _ = agent.cgroup.set_freeze(false);
        }
        if let Some(fd) = &pidfd {
            let _ = sys::pidfd_send_signal(fd.as_fd(), libc::SIGTERM);
        }
        // The agent's own processes (its `main` leaf; the whole cgroup for an agent that is
        // not in the leaf layout) get the stop timeout; its tools and MCP servers, which got no
        // SIGTERM, go with `cgroup.kill` on the whole subtree right after.
        let own = if agent.main_cgroup().exists() {
            agent.main_cgroup()
        } else {
            agent.cgroup.clone()
        };
        let graceful = own
            .wait_events(
                "processes to exit after SIGTERM",
                self.cfg.stop_timeout,
                |e| !e.populated,
            )
            .await;
        if graceful.is_ok() {
            self.kill_and_wait(agent).await;
        } else {
            logs::append_note(
                &agent.log_path,
                &format!(
                    "stop timeout ({:?}) reached, killing the cgroup",
                    self.cfg.stop_timeout
                ),
            );
            self.kill_and_wait(agent).await;
        }
        if agent.cgroup.populated() {
            let msg = format!(
                "agent {}: processes remain in {} after cgroup.kill",
                agent.id,
                agent.cgroup.path().display()
            );
            lock(&agent.inner).result = msg.clone();
            self.changed(agent);
            return Err(Error::Kernel(msg));
        }
        // Give the watcher a moment to reap and record the exit status.
        for _ in 0..50 {
            if lock(&agent.inner).pidfd.is_none() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let rm = self.remove_cgroup(agent).await;
        self.net_clear(agent);
        self.scx_forget(agent);
        self.mcp_forget(agent);
        self.admission.release(&agent.id);
        {
            let mut i = lock(&agent.inner);
            i.state = final_state;
            i.result = result.to_string();
            i.main_pid = None;
            i.main_start_time = None;
            i.pidfd = None;
        }
        logs::append_note(&agent.log_path, &format!("{} {}", result, agent.id));
        self.audit_event(
            agent,
            "stopped",
            None,
            serde_json::json!({"result": result, "graceful": graceful.is_ok()}),
        );
        self.changed(agent);
        rm.map_err(Error::from)
    }

    /// Stop, then start with the current contract; resets the restart counter.
    pub async fn restart(self: &Arc<Self>, agent: &Arc<Agent>) -> Result<(), Error> {
        let _op = agent.op.lock().await;
        self.stop_locked(agent, State::Inactive, "stopped for restart")
            .await?;
        lock(&agent.inner).restarts = 0;
        self.launch(agent).await
    }

    /// Stop and forget an agent: its object, state record (the log file stays).
    pub async fn remove(self: &Arc<Self>, agent: &Arc<Agent>) -> Result<(), Error> {
        let _op = agent.op.lock().await;
        self.stop_locked(agent, State::Inactive, "removed").await?;
        lock(&self.agents).remove(&agent.id);
        let _g = lock(&agent.persist_lock);
        lock(&agent.inner).removed = true;
        if let Err(e) = self.store.delete(&agent.tenant, &agent.name) {
            warn!(agent = %agent.id, "{e}");
        }
        self.audit_event(agent, "removed", None, serde_json::json!({}));
        self.emit(Event::Removed {
            id: agent.id.clone(),
            object_path: agent.object_path.clone(),
        });
        Ok(())
    }

    /// Send `signal` to the main process (`whom` = "main") or every process ("all", default).
    /// The exit that may follow is handled by the restart policy.
    pub async fn kill(&self, agent: &Arc<Agent>, whom: &str, signal: i32) -> Result<(), Error> {
        let (state, pidfd) = {
            let i = lock(&agent.inner);
            (i.state, i.pidfd.clone())
        };
        if !state.is_active() {
            return Err(Error::InvalidState(format!(
                "agent {} is {}: no processes to signal",
                agent.id,
                state.as_str()
            )));
        }
        match whom {
            "main" => {
                let fd = pidfd.ok_or_else(|| {
                    Error::InvalidState(format!("agent {} has no main process", agent.id))
                })?;
                sys::pidfd_send_signal(fd.as_fd(), signal)
                    .map_err(|e| Error::Kernel(e.to_string()))?;
            }
            "all" | "" => {
                if signal == libc::SIGKILL {
                    agent.cgroup.kill()?;
                } else {
                    // The agent's processes and its tools' (its whole subtree).
                    for pid in agent.cgroup.subtree_procs() {
                        // Processes come from our own cgroup; a PID that exited since the read
                        // is skipped (ESRCH).
                        if let Ok(fd) = sys::pidfd_open(pid) {
                            let _ = sys::pidfd_send_signal(fd.as_fd(), signal);
                        }
                    }
                }
            }
            other => {
                return Err(Error::InvalidState(format!(
                    "whom must be \"main\" or \"all\", not {other:?}"
                )));
            }
        }
        self.audit_event(
            agent,
            "signal",
            None,
            serde_json::json!({"signal": signal, "whom": if whom.is_empty() { "all" } else { whom }}),
        );
        Ok(())
    }

    /// Freeze the agent's cgroup and wait for `cgroup.events` to say `frozen 1`.
    pub async fn freeze(self: &Arc<Self>, agent: &Arc<Agent>) -> Result<(), Error> {
        self.set_frozen(agent, true).await
    }

    pub async fn thaw(self: &Arc<Self>, agent: &Arc<Agent>) -> Result<(), Error> {
        self.set_frozen(agent, false).await
    }

    async fn set_frozen(self: &Arc<Self>, agent: &Arc<Agent>, frozen: bool) -> Result<(), Error> {
        let _op = agent.op.lock().await;
        {
            let mut i = lock(&agent.inner);
            let ok_from = if frozen {
                State::Running
            } else {
                State::Frozen
            };
            if i.state
                == if frozen {
                    State::Frozen
                } else {
                    State::Running
                }
            {
                return Ok(());
            }
            if i.state != ok_from {
                return Err(Error::InvalidState(format!(
                    "agent {} is {}; only a {} agent can be {}",
                    agent.id,
                    i.state.as_str(),
                    ok_from.as_str(),
                    if frozen { "frozen" } else { "thawed" }
                )));
            }
            i.state = if frozen {
                State::Freezing
            } else {
                State::Thawing
            };
        }
        self.emit(Event::Changed(agent.clone()));
        let res = async {
            agent.cgroup.set_freeze(frozen)?;
            agent
                .cgroup
                .wait_events(
                    if frozen {
                        "cgroup.events frozen 1"
                    } else {
                        "cgroup.events frozen 0"
                    },
                    self.cfg.freeze_timeout,
                    |e| e.frozen == frozen,
                )
                .await
        }
        .await;
        {
            let mut i = lock(&agent.inner);
            if i.state == State::Freezing || i.state == State::Thawing {
                i.state = match (&res, frozen) {
                    (Ok(()), true) | (Err(_), false) => State::Frozen,
                    (Ok(()), false) | (Err(_), true) => State::Running,
                };
            }
        }
        if res.is_err() && frozen {
            let _ = agent.cgroup.set_freeze(false);
        }
        self.audit_event(
            agent,
            if frozen { "freeze" } else { "thaw" },
            None,
            serde_json::json!({
                "state": agent.state().as_str(),
                "ok": res.is_ok(),
                "error": res.as_ref().err().map(|e| e.to_string()),
            }),
        );
        self.changed(agent);
        res.map_err(Error::from)
    }

    /// Load persisted agents: re-adopt those still running (PID alive, same start time, in its
    /// cgroup), mark the dead ones and apply their restart policy.
    pub async fn readopt(self: &Arc<Self>) -> Vec<String> {
        let (records, errors) = self.store.load_all();
        let mut report: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
        for rec in records {
            let agent = Arc::new(self.new_agent(
                rec.spec.clone(),
                rec.contract.clone(),
                rec.origin.clone(),
                rec.enabled,
            ));
            if agent.cgroup.path() != rec.cgroup {
                report.push(format!(
                    "{}: recorded cgroup {} is not under this daemon's root {}; adopting in the new place",
                    agent.id,
                    rec.cgroup.display(),
                    self.root.path().display()
                ));
            }
            let prev = State::parse(&rec.state).unwrap_or(State::Failed);
            {
                let mut i = lock(&agent.inner);
                i.state = prev;
                i.result = rec.result.clone();
                i.restarts = rec.restarts;
                i.exit_status = rec.exit_status;
                i.started_at_us = rec.started_at_us;
                i.boot_id = rec.boot_id.clone();
            }
            lock(&self.agents).insert(agent.id.clone(), agent.clone());
            self.emit(Event::New(agent.clone()));
            if !prev.is_active() {
                continue;
            }
            let alive = rec.main_pid.and_then(|pid| {
                let same = rec.boot_id == self.boot_id
                    && sys::process_start_time(pid) == rec.main_start_time
                    && rec.main_start_time.is_some()
                    // `main` (this layout) or the agent's cgroup itself (the layout before
                    // tools moved under their agent).
                    && agent.cgroup.subtree_procs().contains(&pid);
                if !same {
                    return None;
                }
                sys::pidfd_open(pid).ok().map(|fd| (pid, fd))
            });
            match alive {
                Some((pid, fd)) if prev != State::Restarting => {
                    let pidfd = Arc::new(fd);
                    let frozen = agent.cgroup.events().map(|e| e.frozen).unwrap_or(false);
                    let generation = {
                        let mut i = lock(&agent.inner);
                        i.generation += 1;
                        i.state = if frozen {
                            State::Frozen
                        } else {
                            State::Running
                        };
                        i.main_pid = Some(pid);
                        i.main_start_time = rec.main_start_time;
                        i.pidfd = Some(pidfd.clone());
                        // Not persisted: recompute what this cgroup cannot enforce.
                        i.unenforced = plan_budgets(
                            &agent.cgroup.controllers().unwrap_or_default(),
                            &rec.spec.budgets,
                        )
                        .1;
                        i.notes = vec!["re-adopted after a daemon restart".to_string()];
                        i.generation
                    };
                    report.push(format!("{}: re-adopted main process PID {pid}", agent.id));
                    self.audit_readopted(&agent, pid).await;
                    let main = agent.main_cgroup();
                    if let Err(e) = main.create_in_existing() {
                        report.push(format!("{}: {e}", agent.id));
                    }
                    if let Err(e) = self.net_prepare(&agent, &main).await {
                        report.push(format!("{}: network policy: {e}", agent.id));
                    }
                    let layout = self.adopt_layout(&agent, &main).await;
                    report.extend(layout.iter().map(|n| format!("{}: {n}", agent.id)));
                    if let Some(note) =
                        self.scx_register(&agent, &agent.cgroup, &rec.spec.latency_class)
                    {
                        report.push(format!("{}: {note}", agent.id));
                    }
                    if let Some(note) = self.mcp_relisten(&agent) {
                        report.push(format!("{}: {note}", agent.id));
                    }
                    if let (Some(d), "HRT") =
                        (&rec.spec.sched.deadline, rec.spec.latency_class.as_str())
                    {
                        // It runs already: count its reservation, and say when it overloads.
                        if let Err(e) = self.admission.admit(&agent.id, d, &rec.spec.sched.cpuset) {
                            report.push(format!("{}: re-adopted over the bound: {e}", agent.id));
                        }
                        self.monitor_overruns(agent.clone(), generation, pid);
                    }
                    logs::append_note(
                        &agent.log_path,
                        &format!("re-adopted main process PID {pid}"),
                    );
                    self.changed(&agent);
                    self.watch(agent.clone(), generation, pidfd);
                    if prev == State::Stopping {
                        let _ = self.stop(&agent).await;
                    }
                }
                _ => {
                    // Dead (or never got past its backoff) while the daemon was away.
                    self.kill_and_wait(&agent).await;
                    let _ = self.remove_cgroup(&agent).await;
                    self.net_clear(&agent);
                    self.scx_forget(&agent);
                    self.mcp_forget(&agent);
                    let (restart, state_msg) = {
                        let mut i = lock(&agent.inner);
                        i.main_pid = None;
                        i.exit_status = Some(ExitStatus::Unknown);
                        let rebooted = rec.boot_id != self.boot_id;
                        let restart = match i.spec.restart.policy {
                            RestartPolicy::No => false,
                            _ => {
                                i.restarts < i.spec.restart.limit
                                    && prev != State::Stopping
                                    && !rebooted
                            }
                        };
                        i.state = if prev == State::Stopping || rebooted {
                            State::Inactive
                        } else {
                            State::Failed
                        };
                        // After a reboot only agents from the agents directory come back (they
                        // are started by load_agents_dir), like enabled vs. transient units.
                        i.result = if rebooted {
                            "not running after a reboot".into()
                        } else {
                            "main process exited while agentosd was not running (status unknown)"
                                .into()
                        };
                        if restart {
                            i.restarts += 1;
                        }
                        (restart, i.result.clone())
                    };
                    report.push(format!("{}: {state_msg}", agent.id));
                    self.audit_event(
                        &agent,
                        "lost",
                        None,
                        serde_json::json!({
                            "result": state_msg,
                            "state": agent.state().as_str(),
                            "will_restart": restart,
                        }),
                    );
                    self.changed(&agent);
                    if restart {
                        let _op = agent.op.lock().await;
                        if let Err(e) = self.launch(&agent).await {
                            report.push(format!("{}: restart failed: {e}", agent.id));
                        }
                    }
                }
            }
        }
        report
    }

    /// Start the contracts in the agents directory (like enabled units). Agents already known
    /// from this boot are left as they are (running, or stopped by an operator).
    pub async fn load_agents_dir(self: &Arc<Self>) -> Vec<String> {
        let mut report = Vec::new();
        let dir = &self.cfg.agents_dir;
        let Ok(entries) = std::fs::read_dir(dir) else {
            return report;
        };
        let mut files: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                matches!(
                    p.extension().and_then(|e| e.to_str()),
                    Some("yaml") | Some("yml")
                )
            })
            .collect();
        files.sort();
        for f in files {
            let contract = match contracts::load_contract(&f) {
                Ok(c) => c,
                Err(e) => {
                    report.push(format!("{}: not loaded: {e}", f.display()));
                    continue;
                }
            };
            let spec = AgentSpec::from_contract(&contract);
            if spec.exec.is_none() {
                report.push(format!("{}: no exec, nothing to start", f.display()));
                continue;
            }
            if let Ok(existing) = self.find(&spec.id()) {
                let same_boot = lock(&existing.inner).boot_id == self.boot_id;
                if same_boot || existing.state().is_active() {
                    lock(&existing.inner).enabled = true;
                    continue;
                }
            }
            let text = std::fs::read_to_string(&f).unwrap_or_default();
            match self
                .start_spec(spec, text, f.display().to_string(), true)
                .await
            {
                Ok(a) => report.push(format!("{}: started {}", f.display(), a.id)),
                Err(e) => report.push(format!("{}: start failed: {e}", f.display())),
            }
        }
        report
    }

    /// Find a contract named `name` (file stem or agent name) in the agents directory.
    pub fn find_in_agents_dir(&self, name: &str) -> Option<PathBuf> {
        let dir = &self.cfg.agents_dir;
        for ext in ["yaml", "yml"] {
            let p = dir.join(format!("{name}.{ext}"));
            if p.exists() {
                return Some(p);
            }
        }
        let entries = std::fs::read_dir(dir).ok()?;
        for e in entries.flatten() {
            let p = e.path();
            if let Ok(c) = contracts::load_contract(&p)
                && (c.name() == name || format!("{}/{}", c.tenant(), c.name()) == name)
            {
                return Some(p);
            }
        }
        None
    }

    /// Stop every agent (daemon shutdown with --stop-agents-on-exit).
    pub async fn stop_all(self: &Arc<Self>) {
        for a in self.agents() {
            if a.state().is_active() {
                let _ = self.stop(&a).await;
            }
        }
    }
}

/// Undo a cpuset pin: back to a plain member with every CPU of the parent (written out: an
/// empty write may not reach the kernel).
fn unpin(cg: &Cgroup) {
    let _ = cg.set("cpuset.cpus.partition", "member");
    let parent_cpus = cg
        .path()
        .parent()
        .and_then(|p| std::fs::read_to_string(p.join("cpuset.cpus.effective")).ok())
        .unwrap_or_default();
    let _ = cg.set("cpuset.cpus", parent_cpus.trim());
}

/// The agent's contract, parsed again from the text it was started with; `None` for an agent
/// started from a bare spec. A text that no longer parses is an error (never less enforcement).
pub(super) fn agent_contract(agent: &Agent) -> Result<Option<contracts::Contract>, Error> {
    let (text, origin) = {
        let i = lock(&agent.inner);
        (i.contract.clone(), i.origin.clone())
    };
    if text.trim().is_empty() {
        return Ok(None);
    }
    contracts::parse_contract(&text, &origin)
        .map(Some)
        .map_err(|e| Error::InvalidContract(e.to_string()))
}

/// The agent's sandbox from its contract's capabilities (sandbox.rs). An agent started from a
/// bare spec (no contract text) gets the baseline with no grants; a contract that no longer
/// parses is refused rather than run with less than it declared.
fn sandbox_for(state_dir: &Path, agent: &Agent) -> Result<crate::sandbox::PreparedSandbox, Error> {
    let contract = agent_contract(agent)?;
    crate::sandbox::prepare(state_dir, &agent.tenant, &agent.name, contract.as_ref()).map_err(|e| {
        match e {
            crate::sandbox::SandboxError::Unenforceable(m) => Error::Unenforceable(m),
            other => Error::Kernel(format!("agent {}: sandbox: {other}", agent.id)),
        }
    })
}

/// Split the contract's budgets into cgroup files to write (their controller is `available` in
/// the agent's cgroup) and descriptions of those that cannot be enforced here.
pub fn plan_budgets(
    available: &[String],
    budgets: &crate::spec::Budgets,
) -> (Vec<(&'static str, String)>, Vec<String>) {
    let mut unenforced = Vec::new();
    let mut to_write = Vec::new();
    for (ctl, file, value) in cgroup::budget_files(budgets) {
        if available.iter().any(|a| a == ctl) {
            to_write.push((file, value));
        } else {
            unenforced.push(format!("{file}={value} ({ctl} controller not available)"));
        }
    }
    unenforced.extend(
        cgroup::io_max_lines(budgets)
            .into_iter()
            .filter_map(Result::err),
    );
    (to_write, unenforced)
}

/// Names become cgroup directories and file names: allow only `[a-z0-9-]`, not starting with
/// `-`, at most 63 bytes (the contracts crate enforces the same).
fn check_name(s: &str, what: &str) -> Result<(), Error> {
    let ok = !s.is_empty()
        && s.len() <= 63
        && !s.starts_with('-')
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidContract(format!(
            "{what} {s:?} must be 1-63 characters of [a-z0-9-], not starting with '-'"
        )))
    }
}

/// Wait until the pidfd is readable (the process exited), then reap it when it is our child.
async fn wait_exit(pidfd: &Arc<OwnedFd>) -> ExitStatus {
    // SAFETY: the fd is owned by the Arc<OwnedFd> moved into the AsyncFd, so it stays open and
    // refers to the same pidfd for the AsyncFd's whole lifetime.
    let registered =
        unsafe { AsyncFd::register_with_interest(pidfd.clone(), tokio::io::Interest::READABLE) };
    match registered {
        Ok(afd) => loop {
            match afd.readable().await {
                Ok(mut guard) => match sys::pidfd_try_wait(pidfd.as_fd()) {
                    Ok(Some(s)) => return s,
                    Ok(None) => {
                        // Readable but not yet reapable: poll again shortly.
                        guard.clear_ready();
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    Err(e) => {
                        warn!("{e}");
                        return ExitStatus::Unknown;
                    }
                },
                Err(e) => {
                    warn!("pidfd poll: {e}");
                    return ExitStatus::Unknown;
                }
            }
        },
        Err(e) => {
            warn!("pidfd registration failed ({e}); polling");
            loop {
                // Not our child: waitid says ECHILD at once; probe liveness with signal 0.
                if sys::pidfd_send_signal(pidfd.as_fd(), 0).is_err() {
                    return sys::pidfd_try_wait(pidfd.as_fd())
                        .ok()
                        .flatten()
                        .unwrap_or(ExitStatus::Unknown);
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
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

    #[test]
    fn budgets_split_by_available_controllers() {
        let b = crate::spec::Budgets {
            cpu_millis: Some(250),
            memory_bytes: Some(64 << 20),
            memory_high_bytes: Some(48 << 20),
            pids: Some(16),
            io: vec![crate::spec::IoBudget {
                device: "8:16".into(),
                wbps: Some(4096),
                ..Default::default()
            }],
            must: false,
        };
        let all: Vec<String> = ["cpu", "memory", "pids", "io"].map(String::from).to_vec();
        let (w, u) = plan_budgets(&all, &b);
        assert!(u.is_empty());
        assert_eq!(
            w,
            vec![
                ("cpu.max", "25000 100000".to_string()),
                ("memory.high", (48u64 << 20).to_string()),
                ("memory.max", (64u64 << 20).to_string()),
                ("pids.max", "16".to_string()),
                ("io.max", "8:16 wbps=4096".to_string()),
            ]
        );
        let (w, u) = plan_budgets(&["pids".to_string()], &b);
        assert_eq!(w, vec![("pids.max", "16".to_string())]);
        assert_eq!(u.len(), 4);
        assert!(u[0].starts_with("cpu.max=25000 100000 (cpu controller"));
        let (w, u) = plan_budgets(&[], &crate::spec::Budgets::default());
        assert!(w.is_empty() && u.is_empty());
    }

    #[test]
    fn names_are_checked() {
        assert!(check_name("ticker-1", "name").is_ok());
        assert!(check_name("-x", "name").is_err());
        assert!(check_name("A", "name").is_err());
        assert!(check_name("../x", "name").is_err());
        assert!(check_name("", "name").is_err());
    }
}
