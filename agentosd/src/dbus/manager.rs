//! The manager object `/org/agentos1`, interface `org.agentos1.Manager`.

use std::sync::Arc;

use zbus::message::Header;
use zbus::object_server::{ObjectServer, SignalEmitter};
use zbus::{Connection, interface};
use zbus::{ObjectPath, OwnedObjectPath};

use super::gate::Gate;
use super::{Result, as_caller, opath, register_agent};
use crate::authz::{Action, Caller, Policy, Scope};
use crate::supervisor::{self, Supervisor};
use agentos_api::{AgentRow, ApiError, ConsentRow};

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
}

impl Manager {
    pub(super) fn gate(&self) -> Gate {
        Gate {
            policy: self.authz.clone(),
            polkit: self.polkit.clone(),
            sup: self.sup.clone(),
        }
    }

    /// A journal query, on a blocking thread (it reads files and takes in new output).
    async fn journal_query(
        &self,
        a: &Arc<crate::supervisor::Agent>,
        q: crate::logs::journal::Query,
    ) -> Result<(Vec<agentos_api::LogEntry>, u64)> {
        let (sup, agent) = (self.sup.clone(), a.clone());
        tokio::task::spawn_blocking(move || sup.logs().query(&agent.log_who(), q))
            .await
            .map_err(|e| ApiError::Io(format!("journal query: {e}")))?
            .map_err(|e| ApiError::Io(format!("journal of {}: {e}", a.id)))
    }

    /// The journal entries of `a` from `offset`, on a blocking thread.
    async fn journal_read(
        &self,
        a: &Arc<crate::supervisor::Agent>,
        offset: u64,
    ) -> Result<(Vec<agentos_api::LogEntry>, u64)> {
        let (sup, agent) = (self.sup.clone(), a.clone());
        tokio::task::spawn_blocking(move || sup.logs().read_from(&agent.log_who(), offset))
            .await
            .map_err(|e| ApiError::Io(format!("journal read: {e}")))?
            .map_err(|e| ApiError::Io(format!("journal of {}: {e}", a.id)))
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
        Ok(self.sup.agents().len() as u32)
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
