//! The manager object `/org/agentos1`, interface `org.agentos1.Manager`.

use std::collections::HashMap;
use std::sync::Arc;

use zbus::message::Header;
use zbus::object_server::{ObjectServer, SignalEmitter};
use zbus::{Connection, interface};
use zbus::{ObjectPath, OwnedObjectPath};

use super::{Result, as_caller, opath};
use crate::authz::{Action, Policy, Scope};
use crate::supervisor::{self, Supervisor};
use agentos_api::{AgentRow, ApiError, ConsentRow};

/// `ListAgents`' reply, written from the registry as it is serialized: no row is built and no
/// string copied (10 000 agents: building and freeing 80 000 strings per call was most of the
/// daemon's part of a listing). Each agent's state is read under its lock, one at a time.
pub struct AgentRows(Vec<Arc<supervisor::Agent>>);

impl zbus::zvariant::Type for AgentRows {
    const SIGNATURE: &'static zbus::Signature = <Vec<AgentRow>>::SIGNATURE;
}

impl serde::Serialize for AgentRows {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::{Error, SerializeSeq};
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        for a in &self.0 {
            let path = ObjectPath::try_from(a.object_path.as_str()).map_err(S::Error::custom)?;
            a.with_summary(|state, result, class, pid| {
                seq.serialize_element(&(
                    a.id.as_str(),
                    a.name.as_str(),
                    a.tenant.as_str(),
                    state,
                    result,
                    class,
                    pid,
                    &path,
                ))
            })?;
        }
        seq.end()
    }
}

/// `ListTools`' rows: name, kind, risk, file, description, agents that may call it.
type ToolRows = Vec<(String, String, String, String, String, Vec<String>)>;

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
    /// Who gets the signals (`Subscribe`); see signals.rs.
    pub subscribers: Arc<super::signals::Subscribers>,
    /// Jobs queued with `QueueJob` and still running; see jobs.rs.
    pub jobs: Arc<super::jobs::Jobs>,
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

    /// Like `systemctl reset-failed UNIT`: a failed agent becomes inactive, its restart count
    /// starts again (a running agent is left alone).
    async fn reset_failed_agent(
        &self,
        agent: String,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<()> {
        let (c, a) = self
            .gate()
            .agent(&hdr, conn, "ResetFailedAgent", Action::ManageAgents, &agent)
            .await?;
        as_caller(&c, self.sup.reset_failed(&a)).await.map(drop)
    }

    /// All agents the caller may read: (id, name, tenant, state, result, latency class, main
    /// PID, object path).
    async fn list_agents(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<AgentRows> {
        let gate = self.gate();
        let caller = gate
            .check(&hdr, conn, "ListAgents", Action::Read, Scope::AnyTenant)
            .await?;
        // From memory only: with 100 agents, reading each one's cgroup and /proc files here
        // made a listing take 18 ms (docs/benchmarks.md, "Tool calls"). The caller's right to
        // read is asked once per tenant, not once per agent (10 000 agents, a few tenants); the
        // registry is ordered by `tenant/name`, so a tenant's agents come together.
        let agents = self.sup.agents();
        let mut rows = Vec::with_capacity(agents.len());
        let mut readable: HashMap<String, bool> = HashMap::new();
        let mut prev: Option<(Arc<supervisor::Agent>, bool)> = None;
        for a in agents {
            let may = match &prev {
                Some((p, m)) if p.tenant == a.tenant => *m,
                _ => match readable.get(&a.tenant) {
                    Some(m) => *m,
                    None => {
                        let m = gate.may_read(&caller, &a.tenant).await;
                        readable.insert(a.tenant.clone(), m);
                        m
                    }
                },
            };
            prev = Some((a.clone(), may));
            if may {
                rows.push(a);
            }
        }
        Ok(AgentRows(rows))
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

    /// The last `lines` entries of the agent's journal as text (`TIME NAME: line`, the daemon's
    /// notes as `TIME agentosd: …`, control characters escaped), the journal's path and the
    /// offset to follow from with `ReadLog`.
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
        let q = crate::logs::journal::Query {
            lines: lines as usize,
            ..Default::default()
        };
        let (entries, off) = self.journal_query(&a, q).await?;
        let text = entries.iter().map(|e| e.short(&a.name)).collect();
        let path = crate::logs::AgentFiles::of(&a.log_path).journal;
        Ok((path.display().to_string(), text, off))
    }

    /// Journal text from `offset` (at most 64 KiB, whole entries, as `GetLog` writes them) and
    /// the next offset (`-f`).
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
        let (entries, next) = self.journal_read(&a, offset).await?;
        let mut text = String::new();
        for e in entries {
            text.push_str(&e.short(&a.name));
            text.push('\n');
        }
        Ok((text, next))
    }

    /// The agent's journal entries as JSON lines (`{"t":µs,"s":"stdout|stderr|agentosd","m":…}`):
    /// the newest `lines` (0: all) between `since_us` and `until_us` (µs since the epoch, 0: no
    /// bound), and the offset to follow from with `ReadJournal`.
    #[zbus(out_args("entries", "offset"))]
    async fn get_journal(
        &self,
        agent: String,
        lines: u32,
        since_us: u64,
        until_us: u64,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<(String, u64)> {
        let (_, a) = self
            .gate()
            .agent(&hdr, conn, "GetJournal", Action::Read, &agent)
            .await?;
        let q = crate::logs::journal::Query {
            lines: lines as usize,
            since_us,
            until_us,
        };
        let (entries, off) = self.journal_query(&a, q).await?;
        Ok((crate::logs::journal::to_json_lines(&entries), off))
    }

    /// Journal entries (JSON lines) appended from `offset`, at most 64 KiB, and the next offset.
    #[zbus(out_args("entries", "next_offset"))]
    async fn read_journal(
        &self,
        agent: String,
        offset: u64,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<(String, u64)> {
        let (_, a) = self
            .gate()
            .agent(&hdr, conn, "ReadJournal", Action::Read, &agent)
            .await?;
        let (entries, next) = self.journal_read(&a, offset).await?;
        Ok((crate::logs::journal::to_json_lines(&entries), next))
    }

    /// `daemon-reload`: read the agents directory again. A known agent whose file changed gets
    /// it as its contract (applied at its next start if it runs); new files are loaded but not
    /// started; nothing is stopped or restarted. Returns one line per change. Needs
    /// manage-agents for the whole daemon.
    async fn reload(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<Vec<String>> {
        let caller = self
            .gate()
            .check(&hdr, conn, "Reload", Action::ManageAgents, Scope::Global)
            .await?;
        let done = as_caller(&caller, async {
            Ok::<_, supervisor::Error>(self.sup.reload_agents_dir().await)
        })
        .await?;
        let mut lines: Vec<String> = done
            .into_iter()
            .map(|r| format!("{}: {}", r.file.display(), r.what))
            .collect();
        // The tools directory too: a new set from the next call on.
        if let Some(m) = self.sup.mcp() {
            let (n, errors) = m.service.reload_tools().await;
            let tools = m.service.tools();
            lines.push(format!(
                "{}: {n} tool(s) loaded",
                tools.source().0.display()
            ));
            lines.extend(errors.into_iter().map(|e| format!("tool not loaded: {e}")));
        }
        Ok(lines)
    }

    /// The tools agents may call through their MCP socket: (name, kind `exec`/`mcp`, risk, the
    /// manifest's file, description, the agents whose contract grants it, of those the caller
    /// may read), and the manifests that did not load (their diagnostics to root only).
    async fn list_tools(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<(ToolRows, Vec<String>)> {
        let gate = self.gate();
        let caller = gate
            .check(&hdr, conn, "ListTools", Action::Read, Scope::AnyTenant)
            .await?;
        let Some(m) = self.sup.mcp() else {
            return Err(ApiError::Unavailable(
                "this agentosd serves no tools".into(),
            ));
        };
        let tools = m.service.tools();
        let mut policies = Vec::new();
        for a in self.sup.agents() {
            if gate.may_read(&caller, &a.tenant).await
                && let Some(p) = self.sup.tool_policy(&a)
            {
                policies.push((a.id.clone(), p));
            }
        }
        let rows = tools
            .manifests()
            .map(|t| {
                let agents = policies
                    .iter()
                    .filter(|(_, p)| p.granted.contains(&t.name) && !p.denied.contains(&t.name))
                    .map(|(id, _)| id.clone())
                    .collect();
                let kind = if t.is_mcp() { "mcp" } else { "exec" };
                (
                    t.name.clone(),
                    kind.to_string(),
                    t.risk.as_str().to_string(),
                    t.origin.clone(),
                    t.description.clone(),
                    agents,
                )
            })
            .collect();
        let errors = tools.source().1;
        let errors = if caller.uid == 0 || errors.is_empty() {
            errors.to_vec()
        } else {
            vec![format!(
                "{} manifest(s) of {} did not load (root sees why: agentctl tools as root, or the daemon's log)",
                errors.len(),
                tools.source().0.display()
            )]
        };
        Ok((rows, errors))
    }

    /// A new contract for a known agent (the same tenant and name), sent as text like
    /// `StartAgent`: applied now if the agent is not running; if it runs, at its next start, or
    /// at once when `restart` is true (the agent is restarted). Returns whether it restarted.
    async fn reload_agent(
        &self,
        agent: String,
        contract: String,
        origin: String,
        restart: bool,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<bool> {
        let (c, a) = self
            .gate()
            .agent(&hdr, conn, "ReloadAgent", Action::ManageAgents, &agent)
            .await?;
        let origin = if origin.is_empty() {
            "<dbus>".to_string()
        } else {
            crate::authz::escape_control(&origin)
        };
        as_caller(
            &c,
            self.sup.reload_contract(&a, &contract, &origin, restart),
        )
        .await
    }

    /// `enable`: put the agent's contract in the agents directory (started at boot). Returns
    /// the file and whether it was written now (false: it was there already).
    #[zbus(out_args("file", "created"))]
    async fn enable_agent(
        &self,
        agent: String,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<(String, bool)> {
        let (c, a) = self
            .gate()
            .agent(&hdr, conn, "EnableAgent", Action::ManageAgents, &agent)
            .await?;
        let (p, created) = as_caller(&c, async { self.sup.enable(&a) }).await?;
        Ok((p.display().to_string(), created))
    }

    /// `disable`: remove the agents directory's files holding the agent's contract; returns
    /// them. The agent keeps running.
    async fn disable_agent(
        &self,
        agent: String,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<Vec<String>> {
        let (c, a) = self
            .gate()
            .agent(&hdr, conn, "DisableAgent", Action::ManageAgents, &agent)
            .await?;
        let removed = as_caller(&c, async { self.sup.disable(&a) }).await?;
        Ok(removed.iter().map(|p| p.display().to_string()).collect())
    }

    /// The contract text the agent runs with (or last ran with) and its origin, and the one
    /// waiting for its next start (empty strings when none): `agentctl cat`. Needs
    /// manage-agents for its tenant, not read: a contract can carry what its author's file
    /// kept from others (an API key in `exec.env`), and those who may start the agent could
    /// send that text anyway.
    #[zbus(out_args("contract", "origin", "pending_contract", "pending_origin"))]
    async fn get_contract(
        &self,
        agent: String,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<(String, String, String, String)> {
        let (_, a) = self
            .gate()
            .agent(&hdr, conn, "GetContract", Action::ManageAgents, &agent)
            .await?;
        let (text, origin, pending) = self.sup.contract_of(&a);
        let (pt, po) = pending.unwrap_or_default();
        Ok((text, origin, pt, po))
    }

    /// Queue `verb` (`start`, `stop`, `restart`, `freeze`, `thaw`) for `agent` and answer at once
    /// with the job's object; `JobRemoved` says how it ended (`agentctl … --no-block`). Needs
    /// what the verb needs; one job per agent at a time.
    async fn queue_job(
        &self,
        verb: String,
        agent: String,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<OwnedObjectPath> {
        let Some(v) = super::jobs::Verb::parse(&verb) else {
            return Err(ApiError::InvalidArgs(format!(
                "QueueJob: no verb {:?} (start, stop, restart, freeze, thaw)",
                crate::authz::escape_control(&verb)
            )));
        };
        let (c, a) = self
            .gate()
            .agent(&hdr, conn, "QueueJob", Action::ManageAgents, &agent)
            .await?;
        let q = super::jobs::Queue {
            conn: conn.clone(),
            sup: self.sup.clone(),
            gate: self.gate(),
            subs: self.subscribers.clone(),
            jobs: self.jobs.clone(),
        };
        q.queue(c, a, v).await
    }

    /// The jobs running now, of the agents the caller may read: (id, agent, verb, job).
    async fn list_jobs(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<Vec<(u32, String, String, OwnedObjectPath)>> {
        let gate = self.gate();
        let caller = gate
            .check(&hdr, conn, "ListJobs", Action::Read, Scope::AnyTenant)
            .await?;
        let mut out = Vec::new();
        for j in self.jobs.list() {
            if gate.may_read(&caller, &j.tenant).await {
                out.push((
                    j.id,
                    j.agent.clone(),
                    j.verb.as_str().to_string(),
                    opath(&j.path)?,
                ));
            }
        }
        Ok(out)
    }

    /// Receive the signals (`AgentNew`, `AgentRemoved`, `AgentStateChanged`, `ConsentRequested`,
    /// agents' `PropertiesChanged`) about the agents the caller may read, addressed to this
    /// connection, until it calls `Unsubscribe` or leaves the bus. Needs `read` for some tenant.
    async fn subscribe(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<()> {
        let caller = self
            .gate()
            .check(&hdr, conn, "Subscribe", Action::Read, Scope::AnyTenant)
            .await?;
        self.subscribers.add(caller)
    }

    /// End this connection's subscription (no error when there is none).
    async fn unsubscribe(&self, #[zbus(header)] hdr: Header<'_>) -> Result<()> {
        if let Some(s) = hdr.sender() {
            self.subscribers.remove(s.as_str());
        }
        Ok(())
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
    async fn unenforced_budgets(
        &self,
        #[zbus(header)] hdr: Option<Header<'_>>,
        #[zbus(connection)] conn: &Connection,
    ) -> zbus::fdo::Result<Vec<String>> {
        self.gate()
            .may_read_property(hdr.as_ref(), conn, Scope::AnyTenant)
            .await?;
        Ok(self.missing_budgets.clone())
    }

    #[zbus(property, name = "Version")]
    async fn version(
        &self,
        #[zbus(header)] hdr: Option<Header<'_>>,
        #[zbus(connection)] conn: &Connection,
    ) -> zbus::fdo::Result<String> {
        self.gate()
            .may_read_property(hdr.as_ref(), conn, Scope::AnyTenant)
            .await?;
        Ok(self.version.clone())
    }

    #[zbus(property, name = "ControlGroup")]
    async fn control_group(
        &self,
        #[zbus(header)] hdr: Option<Header<'_>>,
        #[zbus(connection)] conn: &Connection,
    ) -> zbus::fdo::Result<String> {
        self.gate()
            .may_read_property(hdr.as_ref(), conn, Scope::AnyTenant)
            .await?;
        Ok(self.sup.root().path().display().to_string())
    }

    #[zbus(property, name = "StateDirectory")]
    async fn state_directory(
        &self,
        #[zbus(header)] hdr: Option<Header<'_>>,
        #[zbus(connection)] conn: &Connection,
    ) -> zbus::fdo::Result<String> {
        self.gate()
            .may_read_property(hdr.as_ref(), conn, Scope::AnyTenant)
            .await?;
        Ok(self.sup.config().state_dir.display().to_string())
    }

    #[zbus(property, name = "AgentsDirectory")]
    async fn agents_directory(
        &self,
        #[zbus(header)] hdr: Option<Header<'_>>,
        #[zbus(connection)] conn: &Connection,
    ) -> zbus::fdo::Result<String> {
        self.gate()
            .may_read_property(hdr.as_ref(), conn, Scope::AnyTenant)
            .await?;
        Ok(self.sup.config().agents_dir.display().to_string())
    }

    #[zbus(property, name = "LogDirectory")]
    async fn log_directory(
        &self,
        #[zbus(header)] hdr: Option<Header<'_>>,
        #[zbus(connection)] conn: &Connection,
    ) -> zbus::fdo::Result<String> {
        self.gate()
            .may_read_property(hdr.as_ref(), conn, Scope::AnyTenant)
            .await?;
        Ok(self.sup.config().log_dir.display().to_string())
    }

    #[zbus(property, name = "NAgents")]
    async fn n_agents(
        &self,
        #[zbus(header)] hdr: Option<Header<'_>>,
        #[zbus(connection)] conn: &Connection,
    ) -> zbus::fdo::Result<u32> {
        self.gate()
            .may_read_property(hdr.as_ref(), conn, Scope::AnyTenant)
            .await?;
        Ok(self.sup.count() as u32)
    }

    /// `normal`, or `low` while the audit or state file system is below its free-space reserve
    /// (new starts refused, the agents writing the most refused first). Signalled on change.
    #[zbus(property, name = "StorageState")]
    async fn storage_state(
        &self,
        #[zbus(header)] hdr: Option<Header<'_>>,
        #[zbus(connection)] conn: &Connection,
    ) -> zbus::fdo::Result<String> {
        self.gate()
            .may_read_property(hdr.as_ref(), conn, Scope::AnyTenant)
            .await?;
        Ok(self.storage_status().state().to_string())
    }

    /// Free bytes (df's Avail) on the watched file system nearest its reserve, at the last check.
    #[zbus(property, name = "StorageFree")]
    async fn storage_free(
        &self,
        #[zbus(header)] hdr: Option<Header<'_>>,
        #[zbus(connection)] conn: &Connection,
    ) -> zbus::fdo::Result<u64> {
        self.gate()
            .may_read_property(hdr.as_ref(), conn, Scope::AnyTenant)
            .await?;
        Ok(self.storage_status().free())
    }

    /// That file system's reserve in bytes.
    #[zbus(property, name = "StorageReserve")]
    async fn storage_reserve(
        &self,
        #[zbus(header)] hdr: Option<Header<'_>>,
        #[zbus(connection)] conn: &Connection,
    ) -> zbus::fdo::Result<u64> {
        self.gate()
            .may_read_property(hdr.as_ref(), conn, Scope::AnyTenant)
            .await?;
        Ok(self.storage_status().reserve())
    }

    /// One line: the state, the file system, its free space, size and reserve.
    #[zbus(property, name = "StorageDetail")]
    async fn storage_detail(
        &self,
        #[zbus(header)] hdr: Option<Header<'_>>,
        #[zbus(connection)] conn: &Connection,
    ) -> zbus::fdo::Result<String> {
        self.gate()
            .may_read_property(hdr.as_ref(), conn, Scope::AnyTenant)
            .await?;
        Ok(self.storage_status().describe())
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

    #[zbus(signal, name = "JobNew")]
    pub(super) async fn job_new(
        emitter: &SignalEmitter<'_>,
        id: u32,
        job: ObjectPath<'_>,
        agent: &str,
    ) -> zbus::Result<()>;

    #[zbus(signal, name = "JobRemoved")]
    pub(super) async fn job_removed(
        emitter: &SignalEmitter<'_>,
        id: u32,
        job: ObjectPath<'_>,
        agent: &str,
        result: &str,
    ) -> zbus::Result<()>;

    #[zbus(signal, name = "AgentNew")]
    pub(super) async fn agent_new(
        emitter: &SignalEmitter<'_>,
        id: &str,
        agent: ObjectPath<'_>,
    ) -> zbus::Result<()>;

    #[zbus(signal, name = "AgentRemoved")]
    pub(super) async fn agent_removed(
        emitter: &SignalEmitter<'_>,
        id: &str,
        agent: ObjectPath<'_>,
    ) -> zbus::Result<()>;

    #[zbus(signal, name = "AgentStateChanged")]
    pub(super) async fn agent_state_changed(
        emitter: &SignalEmitter<'_>,
        id: &str,
        agent: ObjectPath<'_>,
        state: &str,
        result: &str,
    ) -> zbus::Result<()>;
}
