//! The D-Bus API: service `org.agentos1`, manager object `/org/agentos1` (interface
//! `org.agentos1.Manager`) and one object per agent at `/org/agentos1/agent/<tenant>_<name>`
//! (interface `org.agentos1.Agent`). Errors are `org.agentos1.Error.*`. See docs/dbus.md.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::mpsc::UnboundedReceiver;
use tracing::warn;
use zbus::object_server::{ObjectServer, SignalEmitter};
use zbus::{Connection, interface};
use zbus::{ObjectPath, OwnedObjectPath, Variant as Value};

use crate::supervisor::{self, Agent, Event, Supervisor};

pub const SERVICE: &str = "org.agentos1";
pub const MANAGER_PATH: &str = "/org/agentos1";
pub const MANAGER_IFACE: &str = "org.agentos1.Manager";
pub const AGENT_IFACE: &str = "org.agentos1.Agent";

/// `org.agentos1.Error.*`
#[derive(Debug, zbus::DBusError)]
#[zbus(prefix = "org.agentos1.Error")]
pub enum ApiError {
    #[zbus(error)]
    ZBus(zbus::Error),
    NoSuchAgent(String),
    InvalidContract(String),
    AlreadyExists(String),
    InvalidState(String),
    Kernel(String),
    Unenforceable(String),
    ExecFailed(String),
    /// HRT admission refused the agent; the message has the numbers.
    Unschedulable(String),
    InvalidArgs(String),
    Io(String),
    /// No pending consent request with that id.
    NoSuchConsent(String),
    /// The daemon does not offer this (e.g. no tool service).
    Unavailable(String),
}

impl From<supervisor::Error> for ApiError {
    fn from(e: supervisor::Error) -> Self {
        use supervisor::Error as E;
        match e {
            E::NoSuchAgent(m) => ApiError::NoSuchAgent(format!("no such agent: {m}")),
            E::InvalidContract(m) => ApiError::InvalidContract(m),
            E::AlreadyExists(m) => ApiError::AlreadyExists(m),
            E::InvalidState(m) => ApiError::InvalidState(m),
            E::Kernel(m) => ApiError::Kernel(m),
            E::Unenforceable(m) => ApiError::Unenforceable(m),
            E::ExecFailed(m) => ApiError::ExecFailed(m),
            E::Unschedulable(m) => ApiError::Unschedulable(m),
        }
    }
}

type Result<T> = std::result::Result<T, ApiError>;

fn opath(p: &str) -> Result<OwnedObjectPath> {
    OwnedObjectPath::try_from(p.to_string()).map_err(|e| ApiError::InvalidArgs(e.to_string()))
}

/// What the manager object serves.
pub struct Manager {
    pub sup: Arc<Supervisor>,
    /// `agentosd check` result taken at start-up, as JSON.
    pub host_report_json: String,
    pub missing_budgets: Vec<String>,
    pub version: String,
}

/// One row of `ListAgents`: id, name, tenant, state, result, latency class, main PID, object.
pub type AgentRow = (
    String,
    String,
    String,
    String,
    String,
    String,
    u32,
    OwnedObjectPath,
);

impl Manager {
    fn find(&self, agent: &str) -> Result<Arc<Agent>> {
        Ok(self.sup.find(agent)?)
    }

    fn consents(&self) -> Result<&Arc<crate::mcp::consent::Consents>> {
        self.sup
            .mcp()
            .map(|m| m.service.consents())
            .ok_or_else(|| ApiError::Unavailable("this agentosd serves no tools".into()))
    }

    async fn answer_consent(
        &self,
        id: u64,
        approve: bool,
        hdr: &zbus::message::Header<'_>,
        conn: &Connection,
    ) -> Result<()> {
        let sender = hdr
            .sender()
            .ok_or_else(|| ApiError::InvalidArgs("a consent answer needs a sender".into()))?;
        let uid = zbus::fdo::DBusProxy::new(conn)
            .await?
            .get_connection_unix_user(zbus::names::BusName::Unique(sender.to_owned()))
            .await
            .map_err(|e| ApiError::InvalidArgs(format!("cannot tell who answered: {e}")))?;
        self.consents()?
            .answer(id, approve, uid)
            .map(|_| ())
            .map_err(|e| ApiError::NoSuchConsent(e.to_string()))
    }
}

/// One row of `ListConsentRequests`.
pub type ConsentRow = (u64, String, String, String, String, u64, u64);

fn consent_row(r: crate::mcp::consent::Request) -> ConsentRow {
    (
        r.id,
        r.agent,
        r.tool,
        r.capability,
        r.arguments.to_string(),
        r.requested_us,
        r.expires_us,
    )
}

/// Emit `ConsentRequested` for every new held call.
pub async fn pump_consents(conn: Connection, sup: Arc<Supervisor>) {
    let Some(m) = sup.mcp() else {
        return;
    };
    let mut rx = m.service.consents().subscribe();
    let Ok(manager) = SignalEmitter::new(&conn, MANAGER_PATH) else {
        return;
    };
    loop {
        match rx.recv().await {
            Ok(r) => {
                let _ = Manager::consent_requested(
                    &manager,
                    r.id,
                    &r.agent,
                    &r.tool,
                    &r.capability,
                    &r.arguments.to_string(),
                    r.expires_us,
                )
                .await;
            }
            Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                warn!("{n} ConsentRequested signal(s) not sent (ListConsentRequests has them)");
            }
            Err(_) => break,
        }
    }
}

/// Register the object of `agent` (no-op if it is there already).
pub async fn register_agent(server: &ObjectServer, sup: &Arc<Supervisor>, agent: &Arc<Agent>) {
    let obj = AgentObject {
        sup: sup.clone(),
        agent: agent.clone(),
    };
    if let Err(e) = server.at(agent.object_path.as_str(), obj).await {
        warn!(agent = %agent.id, "cannot register D-Bus object: {e}");
    }
}

#[interface(name = "org.agentos1.Manager")]
impl Manager {
    /// Start an agent from contract text; `origin` names it in error positions.
    async fn start_agent(
        &self,
        contract: String,
        origin: String,
        #[zbus(object_server)] server: &ObjectServer,
    ) -> Result<OwnedObjectPath> {
        let origin = if origin.is_empty() {
            "<dbus>".to_string()
        } else {
            origin
        };
        let agent = self.sup.start_contract(&contract, &origin, false).await?;
        register_agent(server, &self.sup, &agent).await;
        opath(&agent.object_path)
    }

    /// Start an agent from a contract file the daemon reads.
    async fn start_agent_from_file(
        &self,
        path: String,
        #[zbus(object_server)] server: &ObjectServer,
    ) -> Result<OwnedObjectPath> {
        let text = std::fs::read_to_string(&path)
            .map_err(|e| ApiError::Io(format!("cannot read contract {path}: {e}")))?;
        let agent = self.sup.start_contract(&text, &path, false).await?;
        register_agent(server, &self.sup, &agent).await;
        opath(&agent.object_path)
    }

    /// Start a known agent again, or one whose contract is in the agents directory.
    async fn start_agent_by_name(
        &self,
        agent: String,
        #[zbus(object_server)] server: &ObjectServer,
    ) -> Result<OwnedObjectPath> {
        match self.sup.find(&agent) {
            Ok(a) => {
                self.sup.start_existing(&a).await?;
                opath(&a.object_path)
            }
            Err(supervisor::Error::NoSuchAgent(_)) => {
                let Some(path) = self.sup.find_in_agents_dir(&agent) else {
                    return Err(ApiError::NoSuchAgent(format!(
                        "no such agent: {agent} (not loaded, and no contract for it in {})",
                        self.sup.config().agents_dir.display()
                    )));
                };
                let text = std::fs::read_to_string(&path).map_err(|e| {
                    ApiError::Io(format!("cannot read contract {}: {e}", path.display()))
                })?;
                let a = self
                    .sup
                    .start_contract(&text, &path.display().to_string(), true)
                    .await?;
                register_agent(server, &self.sup, &a).await;
                opath(&a.object_path)
            }
            Err(e) => Err(e.into()),
        }
    }

    async fn stop_agent(&self, agent: String) -> Result<()> {
        let a = self.find(&agent)?;
        Ok(self.sup.stop(&a).await?)
    }

    /// Signal the agent's processes; `whom` is `all` (default when empty) or `main`.
    async fn kill_agent(&self, agent: String, whom: String, signal: i32) -> Result<()> {
        let a = self.find(&agent)?;
        Ok(self.sup.kill(&a, &whom, signal).await?)
    }

    async fn freeze_agent(&self, agent: String) -> Result<()> {
        let a = self.find(&agent)?;
        Ok(self.sup.freeze(&a).await?)
    }

    async fn thaw_agent(&self, agent: String) -> Result<()> {
        let a = self.find(&agent)?;
        Ok(self.sup.thaw(&a).await?)
    }

    async fn restart_agent(&self, agent: String) -> Result<()> {
        let a = self.find(&agent)?;
        Ok(self.sup.restart(&a).await?)
    }

    /// Stop the agent and forget it (object and state record; its log file stays).
    async fn remove_agent(&self, agent: String) -> Result<()> {
        let a = self.find(&agent)?;
        Ok(self.sup.remove(&a).await?)
    }

    /// All agents: (id, name, tenant, state, result, latency class, main PID, object path).
    async fn list_agents(&self) -> Result<Vec<AgentRow>> {
        // From memory only: with 100 agents, reading each one's cgroup and /proc files here
        // made a listing take 18 ms (docs/benchmarks.md, "Tool calls").
        let mut rows = Vec::new();
        for a in self.sup.agents() {
            let (state, result, class, pid) = a.summary();
            rows.push((
                a.id.clone(),
                a.name.clone(),
                a.tenant.clone(),
                state,
                result,
                class,
                pid,
                opath(&a.object_path)?,
            ));
        }
        Ok(rows)
    }

    /// The object path of an agent, by `tenant/name` or `name`.
    async fn get_agent(&self, agent: String) -> Result<OwnedObjectPath> {
        let a = self.find(&agent)?;
        opath(&a.object_path)
    }

    /// Everything about one agent as a JSON object (what `agentctl status --json` prints).
    async fn describe_agent(&self, agent: String) -> Result<String> {
        let a = self.find(&agent)?;
        serde_json::to_string(&self.sup.status_of(&a)).map_err(|e| ApiError::Io(e.to_string()))
    }

    /// Every agent as a JSON array of the same objects.
    async fn describe_agents(&self) -> Result<String> {
        let all: Vec<_> = self
            .sup
            .agents()
            .iter()
            .map(|a| self.sup.status_of(a))
            .collect();
        serde_json::to_string(&all).map_err(|e| ApiError::Io(e.to_string()))
    }

    /// The last `lines` lines of the agent's log, the log's path and the offset to follow from.
    #[zbus(out_args("path", "lines", "offset"))]
    async fn get_log(&self, agent: String, lines: u32) -> Result<(String, Vec<String>, u64)> {
        let a = self.find(&agent)?;
        let (l, off) = crate::logs::tail(&a.log_path, lines as usize)
            .map_err(|e| ApiError::Io(format!("{}: {e}", a.log_path.display())))?;
        Ok((a.log_path.display().to_string(), l, off))
    }

    /// Log text from `offset` (at most 64 KiB, whole lines) and the next offset (`-f`).
    #[zbus(out_args("text", "next_offset"))]
    async fn read_log(&self, agent: String, offset: u64) -> Result<(String, u64)> {
        let a = self.find(&agent)?;
        crate::logs::read_from(&a.log_path, offset, 64 * 1024)
            .map_err(|e| ApiError::Io(format!("{}: {e}", a.log_path.display())))
    }

    /// The host probe taken at start-up, as JSON (same as `agentosd check --json`).
    async fn check(&self) -> String {
        self.host_report_json.clone()
    }

    /// Budget controllers agents cannot get under this daemon's cgroup root.
    #[zbus(property, name = "UnenforcedBudgets")]
    async fn unenforced_budgets(&self) -> Vec<String> {
        self.missing_budgets.clone()
    }

    #[zbus(property, name = "Version")]
    async fn version(&self) -> String {
        self.version.clone()
    }

    #[zbus(property, name = "ControlGroup")]
    async fn control_group(&self) -> String {
        self.sup.root().path().display().to_string()
    }

    #[zbus(property, name = "StateDirectory")]
    async fn state_directory(&self) -> String {
        self.sup.config().state_dir.display().to_string()
    }

    #[zbus(property, name = "AgentsDirectory")]
    async fn agents_directory(&self) -> String {
        self.sup.config().agents_dir.display().to_string()
    }

    #[zbus(property, name = "LogDirectory")]
    async fn log_directory(&self) -> String {
        self.sup.config().log_dir.display().to_string()
    }

    #[zbus(property, name = "NAgents")]
    async fn n_agents(&self) -> u32 {
        self.sup.agents().len() as u32
    }

    /// Calls held for consent: (id, agent, tool, capability, arguments as JSON with secrets
    /// redacted, requested µs, expires µs), oldest first.
    async fn list_consent_requests(&self) -> Result<Vec<ConsentRow>> {
        Ok(self
            .consents()?
            .list()
            .into_iter()
            .map(consent_row)
            .collect())
    }

    /// Let held call `id` proceed. The answer is audited with the caller's uid.
    async fn approve_consent(
        &self,
        id: u64,
        #[zbus(header)] hdr: zbus::message::Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<()> {
        self.answer_consent(id, true, &hdr, conn).await
    }

    /// Refuse held call `id`; the agent gets an MCP error. Audited with the caller's uid.
    async fn deny_consent(
        &self,
        id: u64,
        #[zbus(header)] hdr: zbus::message::Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<()> {
        self.answer_consent(id, false, &hdr, conn).await
    }

    /// A call is held until an operator answers (ApproveConsent/DenyConsent) or it expires.
    #[zbus(signal, name = "ConsentRequested")]
    pub async fn consent_requested(
        emitter: &SignalEmitter<'_>,
        id: u64,
        agent: &str,
        tool: &str,
        capability: &str,
        arguments: &str,
        expires_us: u64,
    ) -> zbus::Result<()>;

    #[zbus(signal, name = "AgentNew")]
    async fn agent_new(
        emitter: &SignalEmitter<'_>,
        id: &str,
        agent: ObjectPath<'_>,
    ) -> zbus::Result<()>;

    #[zbus(signal, name = "AgentRemoved")]
    async fn agent_removed(
        emitter: &SignalEmitter<'_>,
        id: &str,
        agent: ObjectPath<'_>,
    ) -> zbus::Result<()>;

    #[zbus(signal, name = "AgentStateChanged")]
    async fn agent_state_changed(
        emitter: &SignalEmitter<'_>,
        id: &str,
        agent: ObjectPath<'_>,
        state: &str,
        result: &str,
    ) -> zbus::Result<()>;
}

/// One agent's object. Properties read live values (cgroup files) on every Get.
pub struct AgentObject {
    sup: Arc<Supervisor>,
    agent: Arc<Agent>,
}

impl AgentObject {
    fn status(&self) -> supervisor::AgentStatus {
        self.sup.status_of(&self.agent)
    }
}

#[interface(name = "org.agentos1.Agent")]
impl AgentObject {
    async fn stop(&self) -> Result<()> {
        Ok(self.sup.stop(&self.agent).await?)
    }

    async fn kill(&self, whom: String, signal: i32) -> Result<()> {
        Ok(self.sup.kill(&self.agent, &whom, signal).await?)
    }

    async fn freeze(&self) -> Result<()> {
        Ok(self.sup.freeze(&self.agent).await?)
    }

    async fn thaw(&self) -> Result<()> {
        Ok(self.sup.thaw(&self.agent).await?)
    }

    async fn restart(&self) -> Result<()> {
        Ok(self.sup.restart(&self.agent).await?)
    }

    async fn remove(&self) -> Result<()> {
        Ok(self.sup.remove(&self.agent).await?)
    }

    #[zbus(property, name = "Id")]
    async fn id(&self) -> String {
        self.agent.id.clone()
    }

    #[zbus(property, name = "Name")]
    async fn name(&self) -> String {
        self.agent.name.clone()
    }

    #[zbus(property, name = "Tenant")]
    async fn tenant(&self) -> String {
        self.agent.tenant.clone()
    }

    #[zbus(property, name = "State")]
    async fn state(&self) -> String {
        self.agent.state().as_str().to_string()
    }

    #[zbus(property, name = "Result")]
    async fn result(&self) -> String {
        self.status().result
    }

    #[zbus(property, name = "MainPID")]
    async fn main_pid(&self) -> u32 {
        self.agent.main_pid().unwrap_or(0)
    }

    #[zbus(property, name = "ControlGroup")]
    async fn control_group(&self) -> String {
        self.status().control_group
    }

    #[zbus(property, name = "ControlGroupPath")]
    async fn control_group_path(&self) -> String {
        self.agent.cgroup.path().display().to_string()
    }

    #[zbus(property, name = "LatencyClass")]
    async fn latency_class(&self) -> String {
        self.agent.spec().latency_class
    }

    /// HRT: deadline overruns seen in the current run (a sampled lower bound); 0 otherwise.
    #[zbus(property(emits_changed_signal = "false"), name = "DeadlineMisses")]
    async fn deadline_misses(&self) -> u64 {
        self.status().deadline_misses.unwrap_or(0)
    }

    /// Kernel denials (cgroup BPF, BPF LSM) reported since the daemon started.
    #[zbus(property(emits_changed_signal = "false"), name = "Denials")]
    async fn denials(&self) -> u64 {
        self.status().denials
    }

    /// Syscalls entered by the agent's processes in its current (or last) run; u64::MAX when
    /// the daemon does not count them (`agentosd --syscall-counts` is off).
    #[zbus(property(emits_changed_signal = "false"), name = "Syscalls")]
    async fn syscalls(&self) -> u64 {
        self.status().syscalls.unwrap_or(u64::MAX)
    }

    /// CPU time in ns (`cpu.stat usage_usec`); u64::MAX when unknown, like systemd.
    #[zbus(property(emits_changed_signal = "false"), name = "CPUUsageNSec")]
    async fn cpu_usage_nsec(&self) -> u64 {
        self.status().cpu_usage_nsec.unwrap_or(u64::MAX)
    }

    /// `memory.current`; u64::MAX when the memory controller is not available.
    #[zbus(property(emits_changed_signal = "false"), name = "MemoryCurrent")]
    async fn memory_current(&self) -> u64 {
        self.status().memory_current.unwrap_or(u64::MAX)
    }

    /// `pids.current`, or the number of threads in `cgroup.threads` without the pids controller.
    #[zbus(property(emits_changed_signal = "false"), name = "TasksCurrent")]
    async fn tasks_current(&self) -> u64 {
        self.status().tasks_current
    }

    #[zbus(property, name = "NRestarts")]
    async fn n_restarts(&self) -> u32 {
        self.agent.restarts()
    }

    #[zbus(property, name = "RestartPolicy")]
    async fn restart_policy(&self) -> String {
        self.agent.spec().restart.policy.as_str().to_string()
    }

    /// When the current run started, µs since the epoch (0 if never).
    #[zbus(property, name = "ActiveEnterTimestamp")]
    async fn active_enter_timestamp(&self) -> u64 {
        self.status().started_at_us
    }

    /// `code=exited, status=N`, `code=killed, signal=NAME`, or empty.
    #[zbus(property, name = "ExecMainStatus")]
    async fn exec_main_status(&self) -> String {
        self.status().exit_status
    }

    /// Budget files of the contract this host could not apply, with the reason.
    #[zbus(property, name = "UnenforcedBudgets")]
    async fn unenforced_budgets(&self) -> Vec<String> {
        self.status().unenforced_budgets
    }

    #[zbus(property, name = "LogPath")]
    async fn log_path(&self) -> String {
        self.agent.log_path.display().to_string()
    }

    #[zbus(property, name = "Origin")]
    async fn origin(&self) -> String {
        self.status().origin
    }

    #[zbus(property, name = "Enabled")]
    async fn enabled(&self) -> bool {
        self.status().enabled
    }
}

/// Turn supervisor events into objects and signals. Runs until the supervisor goes away.
pub async fn pump_events(conn: Connection, sup: Arc<Supervisor>, mut rx: UnboundedReceiver<Event>) {
    let server = conn.object_server();
    let Ok(manager) = SignalEmitter::new(&conn, MANAGER_PATH) else {
        return;
    };
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::New(agent) => {
                register_agent(server, &sup, &agent).await;
                if let Ok(p) = ObjectPath::try_from(agent.object_path.as_str()) {
                    let _ = Manager::agent_new(&manager, &agent.id, p).await;
                }
            }
            Event::Changed(agent) => {
                let current = sup.find(&agent.id).is_ok_and(|a| Arc::ptr_eq(&a, &agent));
                if !current {
                    continue;
                }
                register_agent(server, &sup, &agent).await;
                let st = sup.status_of(&agent);
                if let Ok(p) = ObjectPath::try_from(agent.object_path.as_str()) {
                    let _ = Manager::agent_state_changed(
                        &manager,
                        &agent.id,
                        p.clone(),
                        &st.state,
                        &st.result,
                    )
                    .await;
                    if let Ok(em) = SignalEmitter::new(&conn, p) {
                        let mut changed: HashMap<&str, Value<'_>> = HashMap::new();
                        changed.insert("State", Value::from(st.state.clone()));
                        changed.insert("Result", Value::from(st.result.clone()));
                        changed.insert("MainPID", Value::from(st.main_pid));
                        changed.insert("NRestarts", Value::from(st.restarts));
                        changed.insert("ExecMainStatus", Value::from(st.exit_status.clone()));
                        changed.insert("ActiveEnterTimestamp", Value::from(st.started_at_us));
                        if let Ok(iface) = zbus::names::InterfaceName::try_from(AGENT_IFACE) {
                            let _ = zbus::fdo::Properties::properties_changed(
                                &em,
                                iface,
                                changed,
                                Cow::Borrowed(&[]),
                            )
                            .await;
                        }
                    }
                }
            }
            Event::Removed { id, object_path } => {
                let _ = server.remove::<AgentObject, _>(object_path.as_str()).await;
                if let Ok(p) = ObjectPath::try_from(object_path.as_str()) {
                    let _ = Manager::agent_removed(&manager, &id, p).await;
                }
            }
        }
    }
}
