//! The authorization gate: who may call what, decided by the `--authz` policy or by polkit
//! (`--polkit`), and the record of refused calls.

use std::sync::Arc;

use tracing::warn;
use zbus::Connection;
use zbus::message::Header;
use zbus::object_server::ObjectServer;

use super::manager::Manager;
use super::{Result, caller_of};
use crate::authz::{Action, Caller, Policy, Scope};
use crate::supervisor::{Agent, Supervisor};
use agentos_api::{ApiError, MANAGER_PATH};

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
    pub(super) fn record(
        &self,
        caller: &Caller,
        method: &str,
        action: Action,
        target: Option<(&str, &str)>,
    ) {
        let Some(t) = self.sup.audit_trail() else {
            return;
        };
        if !self.sup.admit_refused_call(caller.uid, method) {
            return;
        }
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
        // An agent holds no action, whatever a rule or polkit would say of its uid: refused
        // without asking polkit (an agent looping over calls costs no polkit round trip).
        if crate::authz::is_agent(caller.uid) {
            return false;
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

    pub(super) async fn on_agent(
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

    pub(super) async fn may_read(&self, caller: &Caller, tenant: &str) -> bool {
        self.allows(caller, Action::Read, Scope::Tenant(tenant))
            .await
    }
}

/// The gate of the manager object registered on `server`.
impl Gate {
    /// A property read (`Get`, `GetAll`): the caller must hold `read` for `scope`. `hdr` is
    /// `None` when zbus reads the property itself for a `PropertiesChanged` signal (allowed:
    /// signals are the bus policy's business). Refusals are not recorded one by one (a `GetAll`
    /// reads every property) but logged.
    pub(super) async fn may_read_property(
        &self,
        hdr: Option<&Header<'_>>,
        conn: &Connection,
        scope: Scope<'_>,
    ) -> zbus::fdo::Result<()> {
        let Some(hdr) = hdr else {
            return Ok(());
        };
        let caller = caller_of(hdr, conn)
            .await
            .map_err(|e| zbus::fdo::Error::AccessDenied(e.to_string()))?;
        if self.allows(&caller, Action::Read, scope).await {
            return Ok(());
        }
        tracing::debug!("property read refused to uid {} ({scope:?})", caller.uid);
        Err(zbus::fdo::Error::AccessDenied(format!(
            "{}: uid {} may not read this property",
            Action::Read,
            caller.uid
        )))
    }
}

pub(super) async fn gate_of(server: &ObjectServer) -> Result<Gate> {
    let m = server.interface::<_, Manager>(MANAGER_PATH).await?;
    Ok(m.get().await.gate())
}
