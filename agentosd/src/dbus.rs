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

use crate::authz::{Action, Caller, Policy, Scope};
use crate::supervisor::{self, Agent, Event, Supervisor};
use zbus::message::Header;

pub use agentos_api::{AGENT_IFACE, ApiError, MANAGER_IFACE, MANAGER_PATH, SERVICE};

/// The one place a supervisor error becomes text: its kind names the D-Bus error.
impl From<supervisor::Error> for ApiError {
    fn from(e: supervisor::Error) -> Self {
        use supervisor::ErrorKind as K;
        let m = e.to_string();
        match e.kind() {
            K::NoSuchAgent => ApiError::NoSuchAgent(m),
            K::InvalidContract => ApiError::InvalidContract(m),
            K::AlreadyExists => ApiError::AlreadyExists(m),
            K::InvalidState => ApiError::InvalidState(m),
            K::Kernel => ApiError::Kernel(m),
            K::Unenforceable => ApiError::Unenforceable(m),
            K::ExecFailed => ApiError::ExecFailed(m),
            K::Unschedulable => ApiError::Unschedulable(m),
        }
    }
}

type Result<T> = std::result::Result<T, ApiError>;

fn opath(p: &str) -> Result<OwnedObjectPath> {
    OwnedObjectPath::try_from(p.to_string()).map_err(|e| ApiError::InvalidArgs(e.to_string()))
}

/// Who is calling, as the bus tells it (`GetConnectionCredentials`: uid, gids, pid), with the
/// command line and unit of that pid. Nothing the caller sends is believed.
pub async fn caller_of(hdr: &Header<'_>, conn: &Connection) -> Result<Caller> {
    let denied = |why: String| ApiError::AccessDenied(format!("{why}; the call is refused"));
    let sender = hdr
        .sender()
        .ok_or_else(|| denied("the call has no sender on the bus".into()))?;
    let creds = zbus::fdo::DBusProxy::new(conn)
        .await?
        .get_connection_credentials(zbus::names::BusName::Unique(sender.to_owned()))
        .await
        .map_err(|e| denied(format!("the bus does not say who {sender} is ({e})")))?;
    let uid = creds
        .unix_user_id()
        .ok_or_else(|| denied(format!("the bus gives no UnixUserID for {sender}")))?;
    // A bus that does not report UnixGroupIDs leaves the list empty: group rules then match
    // nobody (fail closed).
    let gids = creds.unix_group_ids().cloned().unwrap_or_default();
    Ok(Caller {
        uid,
        gids,
        bus_name: Some(sender.to_string()),
        ..Caller::default()
    }
    .with_process(creds.process_id()))
}

/// Run `fut` with `caller` as the audit trail's [`crate::audit_trail::CALLER`]: every
/// lifecycle record it makes names who asked.
async fn as_caller<T, F>(caller: &Caller, fut: F) -> Result<T>
where
    F: std::future::Future<Output = std::result::Result<T, supervisor::Error>>,
{
    Ok(crate::audit_trail::CALLER
        .scope(caller.to_json(), fut)
        .await?)
}

/// The authorization gate shared by the manager and the agent objects.
#[derive(Clone)]
pub struct Gate {
    pub policy: Arc<Policy>,
    /// polkit, where the daemon asks it (`--polkit`); then it decides instead of `policy`.
    pub polkit: Option<Arc<crate::polkit::Polkit>>,
    pub sup: Arc<Supervisor>,
}

impl Gate {
    /// Record a refused call on the audit trail (event `refused-call`). Allowed calls are on
    /// the record through the lifecycle records they cause, which name the caller
    /// ([`crate::audit_trail::CALLER`]).
    fn record(&self, caller: &Caller, method: &str, action: Action, target: Option<(&str, &str)>) {
        let Some(t) = self.sup.audit_trail() else {
            return;
        };
        let (tenant, name) = target.unwrap_or(("", ""));
        t.submit(t.lifecycle(
            tenant,
            name,
            "refused-call",
            Some(audit::Decision::Deny),
            serde_json::json!({"method": method, "action": action.id(), "caller": caller.to_json()}),
        ));
    }

    /// Refuse: recorded, and `org.agentos1.Error.AccessDenied` naming the action.
    pub fn refuse(
        &self,
        caller: &Caller,
        method: &str,
        action: Action,
        target: Option<(&str, &str)>,
    ) -> ApiError {
        self.record(caller, method, action, target);
        let what = match target {
            Some((t, n)) if !t.is_empty() => format!(" on agent {t}/{n}"),
            _ => String::new(),
        };
        ApiError::AccessDenied(format!(
            "{method}{what}: uid {} does not hold {action} (docs/dbus.md, \"Authorization\"; agentosd --authz)",
            caller.uid
        ))
    }

    /// The caller, if it holds `action` for `scope`; refused (and recorded) otherwise.
    pub async fn check(
        &self,
        hdr: &Header<'_>,
        conn: &Connection,
        method: &str,
        action: Action,
        scope: Scope<'_>,
    ) -> Result<Caller> {
        let caller = caller_of(hdr, conn).await?;
        if self.allows(&caller, action, scope).await {
            Ok(caller)
        } else {
            Err(self.refuse(&caller, method, action, None))
        }
    }

    /// Authorize `action` on agent `key`: a caller holding the action for no tenant learns
    /// nothing about the agent (not even whether it exists). Management calls are recorded.
    pub async fn agent(
        &self,
        hdr: &Header<'_>,
        conn: &Connection,
        method: &str,
        action: Action,
        key: &str,
    ) -> Result<(Caller, Arc<Agent>)> {
        let caller = self
            .check(hdr, conn, method, action, Scope::AnyTenant)
            .await?;
        let a = self.sup.find(key)?;
        self.on_agent(caller, method, action, a).await
    }

    /// Whether `caller` holds `action` for `scope`: root always; otherwise polkit where the
    /// daemon asks it (a polkit that does not answer refuses, logged), else the `--authz` rules.
    pub async fn allows(&self, caller: &Caller, action: Action, scope: Scope<'_>) -> bool {
        if caller.uid == 0 {
            return true;
        }
        let Some(polkit) = &self.polkit else {
            return self.policy.allows(caller, action, scope);
        };
        let Some(name) = &caller.bus_name else {
            return false;
        };
        match polkit
            .check(name, action, &crate::polkit::Details::of(scope))
            .await
        {
            Ok(yes) => yes,
            Err(e) => {
                warn!("{e}; {action} refused to uid {}", caller.uid);
                false
            }
        }
    }

    async fn on_agent(
        &self,
        caller: Caller,
        method: &str,
        action: Action,
        a: Arc<Agent>,
    ) -> Result<(Caller, Arc<Agent>)> {
        if !self.allows(&caller, action, Scope::Tenant(&a.tenant)).await {
            return Err(self.refuse(&caller, method, action, Some((&a.tenant, &a.name))));
        }
        Ok((caller, a))
    }

    async fn may_read(&self, caller: &Caller, tenant: &str) -> bool {
        self.allows(caller, Action::Read, Scope::Tenant(tenant))
            .await
    }
}

/// The gate of the manager object registered on `server`.
async fn gate_of(server: &ObjectServer) -> Result<Gate> {
    let m = server.interface::<_, Manager>(MANAGER_PATH).await?;
    Ok(m.get().await.gate())
}

/// What the manager object serves.
pub struct Manager {
    /// Who may do what (`agentosd --authz`).
    pub authz: Arc<Policy>,
    /// polkit, when the daemon asks it (`agentosd --polkit`).
    pub polkit: Option<Arc<crate::polkit::Polkit>>,
    pub sup: Arc<Supervisor>,
    /// `agentosd check` result taken at start-up, as JSON.
    pub host_report_json: String,
    pub missing_budgets: Vec<String>,
    pub version: String,
}

pub use agentos_api::AgentRow;

impl Manager {
    fn gate(&self) -> Gate {
        Gate {
            policy: self.authz.clone(),
            polkit: self.polkit.clone(),
            sup: self.sup.clone(),
        }
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
        hdr: &Header<'_>,
        conn: &Connection,
    ) -> Result<()> {
        let method = if approve {
            "ApproveConsent"
        } else {
            "DenyConsent"
        };
        let gate = self.gate();
        let caller = gate
            .check(hdr, conn, method, Action::AnswerConsent, Scope::AnyTenant)
            .await?;
        let consents = self.consents()?;
        let req = consents.list().into_iter().find(|r| r.id == id);
        // The request's agent decides the tenant; an unknown id needs an unscoped grant so
        // that a scoped operator cannot probe other tenants' request ids.
        let (tenant, name) = match &req {
            Some(r) => r.agent.split_once('/').unwrap_or(("", &r.agent)),
            None => ("", ""),
        };
        let scope = if req.is_some() {
            Scope::Tenant(tenant)
        } else {
            Scope::Global
        };
        if !gate.allows(&caller, Action::AnswerConsent, scope).await {
            let target = req.as_ref().map(|_| (tenant, name));
            return Err(gate.refuse(&caller, method, Action::AnswerConsent, target));
        }
        let r = consents
            .answer(id, approve, caller.uid)
            .map_err(|e| ApiError::NoSuchConsent(e.to_string()))?;
        if let Some(t) = self.sup.audit_trail() {
            let (tenant, name) = r.agent.split_once('/').unwrap_or(("", &r.agent));
            t.submit(t.lifecycle(
                tenant,
                name,
                if approve {
                    "consent-approved"
                } else {
                    "consent-denied"
                },
                Some(if approve {
                    audit::Decision::Approved
                } else {
                    audit::Decision::Rejected
                }),
                serde_json::json!({"consent_id": id, "tool": r.tool, "caller": caller.to_json()}),
            ));
        }
        Ok(())
    }

    /// Pre-parse contract text to learn its tenant for the authorization check. `echo`: the
    /// caller may see the parse error (it sent the text); otherwise the error says only that
    /// the file does not parse (its content is not the caller's to read).
    fn tenant_of(text: &str, origin: &str, echo: bool) -> Result<(String, String)> {
        match contracts::parse_contract(text, origin) {
            Ok(c) => {
                let spec = crate::spec::AgentSpec::from_contract(&c);
                Ok((spec.tenant, spec.name))
            }
            Err(e) if echo => Err(ApiError::InvalidContract(e.to_string())),
            Err(_) => Err(ApiError::InvalidContract(format!(
                "contract {origin} does not parse (run `agentctl validate` on it as a user who may read it)"
            ))),
        }
    }

    /// Start from contract `text` once the caller holds manage-agents for its tenant.
    async fn start_text(
        &self,
        caller: &Caller,
        method: &str,
        text: &str,
        origin: &str,
        server: &ObjectServer,
    ) -> Result<OwnedObjectPath> {
        // A contract from the agents directory is enabled; the daemon read it, so only root
        // sees why it does not parse or validate. Other texts are the caller's own (sent, or
        // a file root named).
        let enabled = method == "StartAgentByName";
        let echo = !enabled || caller.uid == 0;
        let gate = self.gate();
        let (tenant, name) = match Self::tenant_of(text, origin, echo) {
            Ok(x) => x,
            Err(e) => {
                // On the record like the supervisor's own refusals, with the caller; the
                // reason quotes the text only when the caller sent it.
                if let Some(t) = self.sup.audit_trail() {
                    // Diagnostics quote the text: only text the caller sent goes on the
                    // record (the trail is readable by operators); never a file's.
                    let reason = match &e {
                        ApiError::InvalidContract(m) if method == "StartAgent" => m.clone(),
                        _ => format!(
                            "the contract does not parse (diagnostic withheld: {origin} was read by agentosd)"
                        ),
                    };
                    t.submit(t.lifecycle(
                        "",
                        "",
                        "refused",
                        Some(audit::Decision::Deny),
                        serde_json::json!({
                            "reason": reason,
                            "error": "InvalidContract",
                            "origin": origin,
                            "method": method,
                            "caller": caller.to_json(),
                        }),
                    ));
                }
                return Err(e);
            }
        };
        if !gate
            .allows(caller, Action::ManageAgents, Scope::Tenant(&tenant))
            .await
        {
            return Err(gate.refuse(caller, method, Action::ManageAgents, Some((&tenant, &name))));
        }
        let r = as_caller(caller, self.sup.start_contract(text, origin, enabled)).await;
        let agent = match r {
            Ok(a) => a,
            Err(ApiError::InvalidContract(_)) if !echo => {
                return Err(ApiError::InvalidContract(format!(
                    "contract {origin} is not valid (run `agentctl validate` on it as a user who may read it)"
                )));
            }
            Err(e) => return Err(e),
        };
        register_agent(server, &self.sup, &agent).await;
        opath(&agent.object_path)
    }
}

pub use agentos_api::ConsentRow;

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
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<OwnedObjectPath> {
        const M: &str = "StartAgent";
        let caller = self
            .gate()
            .check(&hdr, conn, M, Action::ManageAgents, Scope::AnyTenant)
            .await?;
        let origin = if origin.is_empty() {
            "<dbus>".to_string()
        } else {
            crate::authz::escape_control(&origin)
        };
        self.start_text(&caller, M, &contract, &origin, server)
            .await
    }

    /// Start an agent from a contract file the daemon reads: root callers only, since the
    /// daemon would open the path with its own rights (a confused deputy for anyone else).
    /// Others send the text with `StartAgent` (what `agentctl start FILE` does).
    async fn start_agent_from_file(
        &self,
        path: String,
        #[zbus(object_server)] server: &ObjectServer,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<OwnedObjectPath> {
        const M: &str = "StartAgentFromFile";
        let gate = self.gate();
        let caller = gate
            .check(&hdr, conn, M, Action::ManageAgents, Scope::AnyTenant)
            .await?;
        if caller.uid != 0 {
            gate.record(&caller, M, Action::ManageAgents, None);
            return Err(ApiError::AccessDenied(format!(
                "StartAgentFromFile: uid {}: only root may have agentosd open a contract file with its own rights; send the contract text with StartAgent (agentctl start FILE does)",
                caller.uid
            )));
        }
        let text = std::fs::read_to_string(&path).map_err(|e| {
            ApiError::Io(format!(
                "cannot read contract {}: {e}",
                crate::authz::escape_control(&path)
            ))
        })?;
        let origin = crate::authz::escape_control(&path);
        self.start_text(&caller, M, &text, &origin, server).await
    }

    /// Start a known agent again, or one whose contract is in the agents directory.
    async fn start_agent_by_name(
        &self,
        agent: String,
        #[zbus(object_server)] server: &ObjectServer,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<OwnedObjectPath> {
        const M: &str = "StartAgentByName";
        let gate = self.gate();
        let caller = gate
            .check(&hdr, conn, M, Action::ManageAgents, Scope::AnyTenant)
            .await?;
        match self.sup.find(&agent) {
            Ok(a) => {
                let (caller, a) = gate.on_agent(caller, M, Action::ManageAgents, a).await?;
                as_caller(&caller, self.sup.start_existing(&a)).await?;
                opath(&a.object_path)
            }
            Err(supervisor::Error::NoSuchAgent(_)) => {
                let Some(path) = self.sup.find_in_agents_dir(&agent) else {
                    return Err(ApiError::NoSuchAgent(format!(
                        "no such agent: {} (not loaded, and no contract for it in {})",
                        crate::authz::escape_control(&agent),
                        self.sup.config().agents_dir.display()
                    )));
                };
                let text = std::fs::read_to_string(&path).map_err(|e| {
                    ApiError::Io(format!("cannot read contract {}: {e}", path.display()))
                })?;
                self.start_text(&caller, M, &text, &path.display().to_string(), server)
                    .await
            }
            Err(e) => Err(e.into()),
        }
    }

    async fn stop_agent(
        &self,
        agent: String,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<()> {
        let (c, a) = self
            .gate()
            .agent(&hdr, conn, "StopAgent", Action::ManageAgents, &agent)
            .await?;
        as_caller(&c, self.sup.stop(&a)).await
    }

    /// Signal the agent's processes; `whom` is `all` (default when empty) or `main`.
    async fn kill_agent(
        &self,
        agent: String,
        whom: String,
        signal: i32,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<()> {
        let (c, a) = self
            .gate()
            .agent(&hdr, conn, "KillAgent", Action::ManageAgents, &agent)
            .await?;
        as_caller(&c, self.sup.kill(&a, &whom, signal)).await
    }

    async fn freeze_agent(
        &self,
        agent: String,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<()> {
        let (c, a) = self
            .gate()
            .agent(&hdr, conn, "FreezeAgent", Action::ManageAgents, &agent)
            .await?;
        as_caller(&c, self.sup.freeze(&a)).await
    }

    async fn thaw_agent(
        &self,
        agent: String,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<()> {
        let (c, a) = self
            .gate()
            .agent(&hdr, conn, "ThawAgent", Action::ManageAgents, &agent)
            .await?;
        as_caller(&c, self.sup.thaw(&a)).await
    }

    async fn restart_agent(
        &self,
        agent: String,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<()> {
        let (c, a) = self
            .gate()
            .agent(&hdr, conn, "RestartAgent", Action::ManageAgents, &agent)
            .await?;
        as_caller(&c, self.sup.restart(&a)).await
    }

    /// Stop the agent and forget it (object and state record; its log file stays).
    async fn remove_agent(
        &self,
        agent: String,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<()> {
        let (c, a) = self
            .gate()
            .agent(&hdr, conn, "RemoveAgent", Action::ManageAgents, &agent)
            .await?;
        as_caller(&c, self.sup.remove(&a)).await
    }

    /// All agents the caller may read: (id, name, tenant, state, result, latency class, main
    /// PID, object path).
    async fn list_agents(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<Vec<AgentRow>> {
        let gate = self.gate();
        let caller = gate
            .check(&hdr, conn, "ListAgents", Action::Read, Scope::AnyTenant)
            .await?;
        // From memory only: with 100 agents, reading each one's cgroup and /proc files here
        // made a listing take 18 ms (docs/benchmarks.md, "Tool calls").
        let mut rows = Vec::new();
        for a in self.sup.agents() {
            if !gate.may_read(&caller, &a.tenant).await {
                continue;
            }
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
    async fn get_agent(
        &self,
        agent: String,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<OwnedObjectPath> {
        let (_, a) = self
            .gate()
            .agent(&hdr, conn, "GetAgent", Action::Read, &agent)
            .await?;
        opath(&a.object_path)
    }

    /// Everything about one agent as a JSON object (what `agentctl status --json` prints).
    async fn describe_agent(
        &self,
        agent: String,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<String> {
        let (_, a) = self
            .gate()
            .agent(&hdr, conn, "DescribeAgent", Action::Read, &agent)
            .await?;
        serde_json::to_string(&self.sup.status_of(&a)).map_err(|e| ApiError::Io(e.to_string()))
    }

    /// Every agent the caller may read as a JSON array of the same objects.
    async fn describe_agents(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<String> {
        let gate = self.gate();
        let caller = gate
            .check(&hdr, conn, "DescribeAgents", Action::Read, Scope::AnyTenant)
            .await?;
        let mut all = Vec::new();
        for a in self.sup.agents() {
            if gate.may_read(&caller, &a.tenant).await {
                all.push(self.sup.status_of(&a));
            }
        }
        serde_json::to_string(&all).map_err(|e| ApiError::Io(e.to_string()))
    }

    /// The last `lines` lines of the agent's log, the log's path and the offset to follow from.
    #[zbus(out_args("path", "lines", "offset"))]
    async fn get_log(
        &self,
        agent: String,
        lines: u32,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<(String, Vec<String>, u64)> {
        let (_, a) = self
            .gate()
            .agent(&hdr, conn, "GetLog", Action::Read, &agent)
            .await?;
        let (l, off) = crate::logs::tail(&a.log_path, lines as usize)
            .map_err(|e| ApiError::Io(format!("{}: {e}", a.log_path.display())))?;
        Ok((a.log_path.display().to_string(), l, off))
    }

    /// Log text from `offset` (at most 64 KiB, whole lines) and the next offset (`-f`).
    #[zbus(out_args("text", "next_offset"))]
    async fn read_log(
        &self,
        agent: String,
        offset: u64,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<(String, u64)> {
        let (_, a) = self
            .gate()
            .agent(&hdr, conn, "ReadLog", Action::Read, &agent)
            .await?;
        crate::logs::read_from(&a.log_path, offset, 64 * 1024)
            .map_err(|e| ApiError::Io(format!("{}: {e}", a.log_path.display())))
    }

    /// The host probe taken at start-up, as JSON (same as `agentosd check --json`).
    async fn check(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<String> {
        self.gate()
            .check(&hdr, conn, "Check", Action::Read, Scope::AnyTenant)
            .await?;
        Ok(self.host_report_json.clone())
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
    /// Only requests of agents whose tenant the caller may answer consent for.
    async fn list_consent_requests(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<Vec<ConsentRow>> {
        let gate = self.gate();
        let caller = gate
            .check(
                &hdr,
                conn,
                "ListConsentRequests",
                Action::AnswerConsent,
                Scope::AnyTenant,
            )
            .await?;
        let mut rows = Vec::new();
        for r in self.consents()?.list() {
            let tenant = r.agent.split_once('/').map_or("", |(t, _)| t);
            if gate
                .allows(&caller, Action::AnswerConsent, Scope::Tenant(tenant))
                .await
            {
                rows.push(r.to_row());
            }
        }
        Ok(rows)
    }

    /// Let held call `id` proceed. The answer is audited with the caller's uid.
    async fn approve_consent(
        &self,
        id: u64,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<()> {
        self.answer_consent(id, true, &hdr, conn).await
    }

    /// Refuse held call `id`; the agent gets an MCP error. Audited with the caller's uid.
    async fn deny_consent(
        &self,
        id: u64,
        #[zbus(header)] hdr: Header<'_>,
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
    async fn authorize(
        &self,
        server: &ObjectServer,
        hdr: &Header<'_>,
        conn: &Connection,
        method: &str,
    ) -> Result<(Caller, Arc<Agent>)> {
        let gate = gate_of(server).await?;
        let caller = gate
            .check(hdr, conn, method, Action::ManageAgents, Scope::AnyTenant)
            .await?;
        gate.on_agent(caller, method, Action::ManageAgents, self.agent.clone())
            .await
    }

    fn status(&self) -> supervisor::AgentStatus {
        self.sup.status_of(&self.agent)
    }
}

#[interface(name = "org.agentos1.Agent")]
impl AgentObject {
    async fn stop(
        &self,
        #[zbus(object_server)] server: &ObjectServer,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<()> {
        let (c, a) = self.authorize(server, &hdr, conn, "Stop").await?;
        as_caller(&c, self.sup.stop(&a)).await
    }

    async fn kill(
        &self,
        whom: String,
        signal: i32,
        #[zbus(object_server)] server: &ObjectServer,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<()> {
        let (c, a) = self.authorize(server, &hdr, conn, "Kill").await?;
        as_caller(&c, self.sup.kill(&a, &whom, signal)).await
    }

    async fn freeze(
        &self,
        #[zbus(object_server)] server: &ObjectServer,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<()> {
        let (c, a) = self.authorize(server, &hdr, conn, "Freeze").await?;
        as_caller(&c, self.sup.freeze(&a)).await
    }

    async fn thaw(
        &self,
        #[zbus(object_server)] server: &ObjectServer,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<()> {
        let (c, a) = self.authorize(server, &hdr, conn, "Thaw").await?;
        as_caller(&c, self.sup.thaw(&a)).await
    }

    async fn restart(
        &self,
        #[zbus(object_server)] server: &ObjectServer,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<()> {
        let (c, a) = self.authorize(server, &hdr, conn, "Restart").await?;
        as_caller(&c, self.sup.restart(&a)).await
    }

    async fn remove(
        &self,
        #[zbus(object_server)] server: &ObjectServer,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<()> {
        let (c, a) = self.authorize(server, &hdr, conn, "Remove").await?;
        as_caller(&c, self.sup.remove(&a)).await
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
