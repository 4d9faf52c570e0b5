//! `tools/call` through the gate: the request is read, decided against the caller's contract,
//! held for operator consent when the contract says so, recorded durably before the tool can have
//! an effect (fail closed), run by the tool runners and answered; every step leaves its audit
//! record.

use std::time::{Instant, SystemTime};

use audit::{Decision, Kind, Record};
use contracts::tool::ToolDurability;
use serde_json::{Value, json};
use tokio::sync::oneshot;

use super::consent::Answer;
use super::trace::CallTrace;
use super::{AUDIT_VALUE_MAX, CallerCtx, McpService, Refused, bounded, decide, jsonrpc};
use crate::telemetry::ToolOutcome;
use crate::tools::ToolError;

impl McpService {
    /// A gate record of a call by `ctx`, when the daemon keeps an audit trail.
    fn gate_record(&self, ctx: &CallerCtx, decision: Decision, detail: Value) -> Option<Record> {
        self.audit().map(|t| {
            t.agent_record(Kind::Gate, &ctx.tenant, &ctx.name)
                .decision(decision)
                .detail(detail)
        })
    }

    /// `tools/call` through the gate: read the request, decide, hold for consent when the
    /// contract says so, record the allow durably, run the tool and answer. `None`: cancelled,
    /// no answer.
    pub(super) async fn call(
        &self,
        ctx: &CallerCtx,
        id: &Value,
        params: &Value,
        mut cancel: oneshot::Receiver<()>,
    ) -> Option<Vec<u8>> {
        let (name, args) = match call_params(params) {
            Ok(p) => p,
            Err(msg) => {
                return Some(jsonrpc::error(
                    id,
                    jsonrpc::INVALID_PARAMS,
                    msg,
                    Value::Null,
                ));
            }
        };
        let capability = self.tools().capability_of(name);
        // A name no tool has is the agent's text: bounded in the records and the error.
        let shown = match capability {
            Some(_) => std::borrow::Cow::Borrowed(name),
            None => jsonrpc::clip(name),
        };
        let name: &str = &shown;
        let redacted = bounded(self.tools().redact(name, &args), AUDIT_VALUE_MAX);
        let base = json!({"tool": name, "capability": capability, "request_id": id, "arguments": redacted});
        let call = Call {
            ctx,
            id,
            name,
            base,
            trace: self.trace_call(ctx, name, capability.as_deref()),
        };
        let needs_consent = match decide(&ctx.policy, capability.as_deref()) {
            Ok(c) => c,
            Err(why) => return Some(self.refuse(&call, capability.as_deref(), why)),
        };
        if let Some(t) = &call.trace {
            let (decision, reason) = match needs_consent {
                true => ("consent", "consent-for"),
                false => ("allow", "granted"),
            };
            t.gate(decision, reason);
        }
        let capability = capability.unwrap_or_default();
        if needs_consent
            && let Err(end) = self
                .hold_for_consent(&call, &capability, redacted, &mut cancel)
                .await
        {
            return end;
        }
        // Recorded before the tool can have an effect (durable, or for `durability: written`
        // tools written to the file): fail closed when the trail cannot write.
        let written = self.tools().durability_of(name) == Some(ToolDurability::Written);
        if let Some(rec) = self.gate_record(ctx, Decision::Allow, call.base.clone())
            && let Err(e) = self.commit(rec, written).await
        {
            call.ended(ToolOutcome::Unavailable);
            return Some(e.reply(id));
        }
        self.run_tool(&call, args, cancel).await
    }

    /// Answers a call the gate refused (unknown tool, capability not granted or denied), after
    /// recording the refusal.
    fn refuse(&self, call: &Call<'_>, capability: Option<&str>, why: Refused) -> Vec<u8> {
        let (ctx, name) = (call.ctx, call.name);
        let (reason, code, msg) = match why {
            Refused::UnknownTool => (
                "unknown-tool",
                jsonrpc::INVALID_PARAMS,
                format!(
                    "unknown tool \"{name}\" (tools/list shows the tools agent {} may call)",
                    ctx.id
                ),
            ),
            Refused::NotGranted => {
                let cap = capability.unwrap_or_default();
                (
                    "not-granted",
                    jsonrpc::FORBIDDEN,
                    format!(
                        "tool \"{name}\" needs capability \"{cap}\", which the contract of agent {} does not grant; \
                         add it to `capabilities:` in the contract",
                        ctx.id
                    ),
                )
            }
            Refused::Denied => {
                let cap = capability.unwrap_or_default();
                (
                    "denied-by-contract",
                    jsonrpc::FORBIDDEN,
                    format!(
                        "capability \"{cap}\" is in `security.deny` of agent {}",
                        ctx.id
                    ),
                )
            }
        };
        if let Some(t) = &call.trace {
            t.gate("deny", reason);
        }
        self.submit_deny(ctx, with(&call.base, "reason", reason));
        jsonrpc::error(
            call.id,
            code,
            &msg,
            json!({"tool": name, "capability": capability, "reason": reason}),
        )
    }

    /// Records a refused call without waiting for the trail: a refused call has no effect to
    /// protect, so do not make the agent wait, and never let a flood of refusals block the
    /// daemon.
    fn submit_deny(&self, ctx: &CallerCtx, detail: Value) {
        if let Some(t) = self.audit() {
            t.submit_or_count(
                t.agent_record(Kind::Gate, &ctx.tenant, &ctx.name)
                    .decision(Decision::Deny)
                    .detail(detail),
            );
        }
    }

    /// Holds a call whose capability needs operator consent until the operator answers, the
    /// request expires or the call is cancelled; the hold and the answer are recorded durably.
    /// `Err` ends the call with that answer (`None`: cancelled, no answer).
    async fn hold_for_consent(
        &self,
        call: &Call<'_>,
        capability: &str,
        redacted: Value,
        cancel: &mut oneshot::Receiver<()>,
    ) -> Result<(), Option<Vec<u8>>> {
        let (ctx, id) = (call.ctx, call.id);
        let (req, rx) = match self.consents.ask(&ctx.id, call.name, capability, redacted) {
            Ok(x) => x,
            Err(e) => {
                if let Some(t) = &call.trace {
                    t.consent(SystemTime::now(), None, None);
                }
                self.submit_deny(ctx, with(&call.base, "reason", "too-many-pending-consents"));
                return Err(Some(jsonrpc::error(
                    id,
                    jsonrpc::CONSENT_REFUSED,
                    &e.to_string(),
                    json!({"decision": "deny"}),
                )));
            }
        };
        if let Some(rec) =
            self.gate_record(ctx, Decision::Held, with(&call.base, "consent_id", req.id))
            && let Err(e) = self.commit(rec, false).await
        {
            call.ended(ToolOutcome::Unavailable);
            return Err(Some(e.reply(id)));
        }
        let since = SystemTime::now();
        let answer = tokio::select! {
            a = self.consents.wait(req.id, rx) => a,
            _ = &mut *cancel => Answer::Withdrawn,
        };
        if let Some(t) = &call.trace {
            t.consent(since, Some(req.id), Some(&answer));
        }
        let decision = match self.record_consent(call, req.id, &answer).await {
            Ok(d) => d,
            Err(e) => return Err(Some(e.reply(id))),
        };
        match answer {
            Answer::Approved { .. } => Ok(()),
            Answer::Withdrawn if cancel.try_recv().is_ok() => Err(None),
            other => Err(Some(
                self.consent_refused(call, capability, req.id, decision, other),
            )),
        }
    }

    /// Records durably how consent request `consent_id` ended; returns the decision recorded.
    async fn record_consent(
        &self,
        call: &Call<'_>,
        consent_id: u64,
        answer: &Answer,
    ) -> Result<Decision, Unavailable> {
        let (decision, by) = match answer {
            Answer::Approved { by_uid } => (Decision::Approved, Some(*by_uid)),
            Answer::Denied { by_uid } => (Decision::Rejected, Some(*by_uid)),
            Answer::Expired => (Decision::Expired, None),
            Answer::Withdrawn => (Decision::Rejected, None),
        };
        let mut detail = with(&call.base, "consent_id", consent_id);
        detail["operator_uid"] = json!(by);
        if *answer == Answer::Withdrawn {
            detail["reason"] = json!("withdrawn (call cancelled, agent gone or daemon stopping)");
        }
        if let Some(t) = self.audit() {
            let rec = t
                .agent_record(Kind::Consent, &call.ctx.tenant, &call.ctx.name)
                .decision(decision)
                .detail(detail);
            self.commit(rec, false).await?;
        }
        Ok(decision)
    }

    /// The answer to a call whose consent request was refused, expired or withdrawn.
    fn consent_refused(
        &self,
        call: &Call<'_>,
        capability: &str,
        consent_id: u64,
        decision: Decision,
        answer: Answer,
    ) -> Vec<u8> {
        let why = match answer {
            Answer::Denied { by_uid } => {
                format!("refused by the operator (uid {by_uid})")
            }
            Answer::Expired => format!(
                "not answered within {} s (agentctl consent approve {})",
                self.consents.timeout().as_secs(),
                consent_id
            ),
            _ => "withdrawn".to_string(),
        };
        jsonrpc::error(
            call.id,
            jsonrpc::CONSENT_REFUSED,
            &format!(
                "tool \"{}\" needs operator consent for \"{capability}\": {why}",
                call.name
            ),
            json!({"consent_id": consent_id, "decision": decision.as_str()}),
        )
    }

    /// Runs an allowed call, then records its outcome (without waiting for the trail).
    /// `None`: cancelled, no answer.
    async fn run_tool(
        &self,
        call: &Call<'_>,
        args: Value,
        cancel: oneshot::Receiver<()>,
    ) -> Option<Vec<u8>> {
        let (started, wall) = (Instant::now(), SystemTime::now());
        let outcome = self
            .tools()
            .call(&call.ctx.caller, call.name, args, cancel)
            .await;
        let elapsed = started.elapsed();
        let (reply, summary) = self.outcome_reply(call, outcome);
        if let Some(t) = &call.trace {
            t.tool(wall, elapsed, &summary);
        }
        if let Some(t) = self.audit() {
            let mut detail = with(&call.base, "event", "tool-result");
            if let (Value::Object(d), Value::Object(s)) = (&mut detail, summary) {
                d.extend(s);
            }
            detail["duration_us"] = json!(elapsed.as_micros() as u64);
            t.submit_or_count(
                t.agent_record(Kind::Gate, &call.ctx.tenant, &call.ctx.name)
                    .detail(detail),
            );
        }
        reply
    }

    /// The answer to a call that ran (`None`: cancelled), and the summary of its outcome for
    /// the audit record (results redacted and bounded).
    fn outcome_reply(
        &self,
        call: &Call<'_>,
        outcome: Result<Value, ToolError>,
    ) -> (Option<Vec<u8>>, Value) {
        let id = call.id;
        match outcome {
            Ok(v) => {
                let is_error = v.get("isError").and_then(Value::as_bool).unwrap_or(false);
                let digest = bounded(self.tools().redact(call.name, &v), AUDIT_VALUE_MAX);
                (
                    Some(jsonrpc::result(id, v)),
                    json!({"ok": !is_error, "result": digest}),
                )
            }
            Err(ToolError::Cancelled(_)) => (None, json!({"ok": false, "error": "cancelled"})),
            Err(e @ ToolError::UnknownTool(_)) => (
                Some(jsonrpc::error(
                    id,
                    jsonrpc::INVALID_PARAMS,
                    &e.to_string(),
                    Value::Null,
                )),
                json!({"ok": false, "error": e.to_string()}),
            ),
            Err(e) => (
                // Execution errors (bad arguments, timeout, tool failure) go back as a tool
                // result with isError, so the model can read them and correct itself.
                Some(jsonrpc::result(
                    id,
                    json!({"content": [{"type": "text", "text": e.to_string()}], "isError": true}),
                )),
                json!({"ok": false, "error": e.to_string()}),
            ),
        }
    }

    /// Writes `rec` durably (or, `written`, to the file without waiting for its sync) and
    /// waits for it; [`Unavailable`] when the trail cannot.
    async fn commit(&self, rec: Record, written: bool) -> Result<(), Unavailable> {
        let Some(t) = self.audit() else {
            return Ok(());
        };
        let res = match written {
            true => t.commit_written(rec).await,
            false => t.commit(rec).await,
        };
        res.map(|_| ()).map_err(|e| Unavailable(e.to_string()))
    }
}

/// One `tools/call` on its way through the gate.
struct Call<'a> {
    ctx: &'a CallerCtx,
    id: &'a Value,
    name: &'a str,
    /// What every audit record of the call starts from: tool, capability, request id and the
    /// arguments (redacted and bounded).
    base: Value,
    /// Its spans, when telemetry is on.
    trace: Option<CallTrace<'a>>,
}

impl Call<'_> {
    /// The call ended without running (for the metrics, when telemetry is on).
    fn ended(&self, outcome: ToolOutcome) {
        if let Some(t) = &self.trace {
            t.ended(outcome);
        }
    }
}

/// The tool name and the arguments (`{}` when absent) of a `tools/call`, or what is wrong with
/// them. Public for the fuzz target `jsonrpc` only.
#[doc(hidden)]
pub fn call_params(params: &Value) -> Result<(&str, Value), &'static str> {
    let Some(name) = params.get("name").and_then(Value::as_str) else {
        return Err("tools/call needs params.name (a string)");
    };
    let args = match params.get("arguments") {
        None | Some(Value::Null) => json!({}),
        Some(a @ Value::Object(_)) => a.clone(),
        Some(_) => return Err("params.arguments must be an object"),
    };
    Ok((name, args))
}

/// The audit trail could not record a decision: the call is refused (fail closed).
struct Unavailable(String);

impl Unavailable {
    fn reply(&self, id: &Value) -> Vec<u8> {
        jsonrpc::error(
            id,
            jsonrpc::UNAVAILABLE,
            &format!(
                "the audit trail cannot record this call, so it is refused: {} (see `agentosd check` and the daemon's journal)",
                self.0
            ),
            Value::Null,
        )
    }
}

fn with(base: &Value, key: &str, v: impl Into<Value>) -> Value {
    let mut b = base.clone();
    b[key] = v.into();
    b
}
