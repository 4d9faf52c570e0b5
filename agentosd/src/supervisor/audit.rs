//! The supervisor's lifecycle records in the audit trail (start, refused, exit, re-adopted…).

use audit::Decision;
use serde_json::{Value, json};

use super::enforce::cgroup_id;
use super::{Agent, Error, State, Supervisor, lock};
use crate::audit_trail::AuditTrail;
use crate::sys::ExitStatus;

impl Supervisor {
    /// Queue a lifecycle record about `agent` (not waited for).
    pub(super) fn audit_event(
        &self,
        agent: &Agent,
        event: &str,
        decision: Option<Decision>,
        detail: Value,
    ) {
        if let Some(t) = self.audit_trail() {
            t.submit(t.lifecycle(&agent.tenant, &agent.name, event, decision, detail));
        }
    }

    /// A start refused before anything ran (bad contract, unenforceable, unschedulable, already
    /// running…).
    pub(super) fn audit_refused(&self, tenant: &str, name: &str, origin: &str, e: &Error) {
        if let Some(t) = self.audit_trail() {
            t.submit(t.lifecycle(
                tenant,
                name,
                "refused",
                Some(Decision::Deny),
                json!({"reason": e.to_string(), "error": e.dbus_name(), "origin": origin}),
            ));
        }
    }

    /// Bind the agent's contract against the host offer, remember the binding hash for its
    /// records, and return the detail fields that describe it.
    pub(super) fn bind_for_audit(&self, t: &AuditTrail, agent: &Agent) -> Value {
        let origin = lock(&agent.inner).origin.clone();
        let mut detail = json!({"origin": origin});
        let parsed = super::start::agent_contract(agent).ok().flatten();
        let mut hash = None;
        if let Some(c) = &parsed {
            detail["contract_sha256"] = json!(c.sha256());
            let offer = self.services.offer.clone();
            match crate::audit_trail::binding_hash(c, &offer) {
                Ok(h) => hash = Some(h),
                Err(why) => detail["binding"] = json!(format!("not bound: {why}")),
            }
        }
        t.set_binding(&agent.id, hash);
        detail
    }

    /// The main process of a run ended (the restart decision is in `state`/`result`).
    pub(super) fn audit_exit(&self, agent: &Agent, pid: Option<u32>, status: &ExitStatus) {
        let (state, result) = {
            let i = lock(&agent.inner);
            (i.state, i.result.clone())
        };
        let event = match state {
            State::Failed => "failed",
            State::Restarting => "exited-restarting",
            _ => "exited",
        };
        let code = match status {
            ExitStatus::Exited(c) => json!({"exit_code": c}),
            ExitStatus::Signaled(s) => json!({"signal": s}),
            ExitStatus::Unknown => json!({"status": "unknown"}),
        };
        let mut detail = json!({
            "pid": pid.unwrap_or(0),
            "status": status.describe(),
            "state": state.as_str(),
            "result": result,
        });
        if let (Value::Object(d), Value::Object(c)) = (&mut detail, code) {
            d.extend(c);
        }
        self.audit_event(agent, event, None, detail);
    }

    /// A running agent found again after a daemon restart.
    pub(super) async fn audit_readopted(&self, agent: &Agent, pid: u32) {
        let Some(t) = self.audit_trail() else {
            return;
        };
        let mut detail = self.bind_for_audit(t, agent);
        detail["pid"] = json!(pid);
        detail["cgroup"] = json!(agent.cgroup.path().display().to_string());
        detail["cgroup_id"] = json!(cgroup_id(agent.cgroup.path()));
        t.submit(t.lifecycle(&agent.tenant, &agent.name, "re-adopted", None, detail));
    }

    /// Before a run starts: bind the contract (its binding hash goes into this agent's records)
    /// and write the `start` decision to the log. When the trail cannot be written the start
    /// is refused: nothing runs that the audit trail does not know about (fail closed).
    pub(super) async fn audit_start(&self, agent: &Agent) -> Result<(), Error> {
        let Some(t) = self.audit_trail() else {
            return Ok(());
        };
        let restarts = lock(&agent.inner).restarts;
        let mut detail = self.bind_for_audit(t, agent);
        detail["restarts"] = json!(restarts);
        if let Err(why) = t.health() {
            return Err(not_started(agent, &why));
        }
        let rec = t.lifecycle(
            &agent.tenant,
            &agent.name,
            "start",
            Some(Decision::Allow),
            detail,
        );
        // Written before the first process exists (a crash of the daemon finds it in the log
        // file), synced with the `started` record before the start is acknowledged
        // ([`Self::audit_commit`]): the disk's sync is not on the way to the agent's first
        // instruction.
        t.commit_written(rec)
            .await
            .map(|_| ())
            .map_err(|e| not_started(agent, &e.to_string()))
    }

    /// Commits `event` (an `allow`) for `agent` and waits until it, and every record before
    /// it, is durable.
    pub(super) async fn audit_commit(
        &self,
        agent: &Agent,
        event: &str,
        detail: Value,
    ) -> Result<(), Error> {
        let Some(t) = self.audit_trail() else {
            return Ok(());
        };
        let rec = t.lifecycle(
            &agent.tenant,
            &agent.name,
            event,
            Some(Decision::Allow),
            detail,
        );
        t.commit(rec)
            .await
            .map(|_| ())
            .map_err(|e| not_started(agent, &e.to_string()))
    }
}

fn not_started(agent: &Agent, why: &str) -> Error {
    Error::Unenforceable(format!(
        "agent {}: not started: the audit trail cannot be written ({why}); agentosd refuses new starts until the log is writable again (fail closed)",
        agent.id
    ))
}
