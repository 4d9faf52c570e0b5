//! The manager's helpers that are not D-Bus methods: the gate, journal reads on a blocking
//! thread, consent answers, starting from a contract text (manager.rs holds the interface).

use std::sync::Arc;

use zbus::Connection;
use zbus::OwnedObjectPath;
use zbus::message::Header;
use zbus::object_server::ObjectServer;

use super::gate::Gate;
use super::manager::Manager;
use super::{Result, as_caller, opath, register_agent};
use crate::authz::{Action, Caller, Scope};
use agentos_api::ApiError;

impl Manager {
    pub(super) fn gate(&self) -> Gate {
        Gate {
            policy: self.authz.clone(),
            polkit: self.polkit.clone(),
            sup: self.sup.clone(),
        }
    }

    /// The storage state at the watcher's last check (normal, with no readings, when the daemon
    /// keeps no reserve).
    pub(super) fn storage_status(&self) -> crate::storage::Status {
        self.sup.storage().map(|s| s.status()).unwrap_or_default()
    }

    /// A journal query, on a blocking thread (it reads files and takes in new output).
    pub(super) async fn journal_query(
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
    pub(super) async fn journal_read(
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

    pub(super) fn consents(&self) -> Result<&Arc<crate::mcp::consent::Consents>> {
        self.sup
            .mcp()
            .map(|m| m.service.consents())
            .ok_or_else(|| ApiError::Unavailable("this agentosd serves no tools".into()))
    }

    pub(super) async fn answer_consent(
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
    pub(super) fn tenant_of(text: &str, origin: &str, echo: bool) -> Result<(String, String)> {
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
    pub(super) async fn start_text(
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
