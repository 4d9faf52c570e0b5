//! The spans of one `tools/call` (telemetry/, docs/telemetry.md): the gate's decision
//! (`agentos.gate`), the consent wait (`agentos.consent`) and the tool's run
//! (`execute_tool NAME`), all children of the agent's current turn, and the call counted for
//! the per-agent metrics. Nothing is built when telemetry is off: the call path only tests an
//! `Option`.

use std::time::{Duration, SystemTime};

use serde_json::Value;

use super::consent::Answer;
use super::{CallerCtx, McpService};
use crate::telemetry::{AgentLabels, SpanData, ToolOutcome, TurnGuard};

/// One traced call: its turn (held open while the call runs) and what every span names.
pub(super) struct CallTrace<'a> {
    turn: TurnGuard<'a>,
    labels: AgentLabels,
    tool: String,
    capability: String,
    started: SystemTime,
}

impl McpService {
    /// The trace of a call of `tool` by `ctx`; `None` when telemetry is off.
    pub(super) fn trace_call(
        &self,
        ctx: &CallerCtx,
        tool: &str,
        capability: Option<&str>,
    ) -> Option<CallTrace<'_>> {
        if !self.telemetry.enabled() {
            return None;
        }
        let binding = self.audit().and_then(|t| t.binding(&ctx.id));
        let labels = AgentLabels::new(&ctx.id, &ctx.tenant, &ctx.name, binding);
        let turn = self.telemetry.enter(&labels, false)?;
        Some(CallTrace {
            turn,
            labels,
            tool: crate::telemetry::cut(tool),
            capability: capability.unwrap_or_default().to_string(),
            started: SystemTime::now(),
        })
    }
}

impl CallTrace<'_> {
    fn span(&self, name: impl Into<String>, start: SystemTime) -> SpanData {
        SpanData::child(self.turn.ctx(), &self.labels, name, start)
            .attr("gen_ai.tool.name", self.tool.as_str())
            .attr("agentos.tool.capability", self.capability.as_str())
    }

    /// The gate decided `decision` (allow, deny, consent) for `reason`.
    pub(super) fn gate(&self, decision: &str, reason: &str) {
        let tel = self.turn.telemetry();
        tel.record(
            self.span("agentos.gate", self.started)
                .attr("agentos.gate.decision", decision)
                .attr("agentos.gate.reason", reason),
        );
        if decision == "deny" {
            self.ended(ToolOutcome::Refused);
        }
    }

    /// The call ended without running the tool (refused, consent refused, audit unavailable).
    pub(super) fn ended(&self, outcome: ToolOutcome) {
        let tel = self.turn.telemetry();
        tel.tool_call(&self.labels, &self.tool, outcome, None);
    }

    /// A consent wait that began at `since` ended with `answer` (`None`: not even asked, too
    /// many requests pending).
    pub(super) fn consent(
        &self,
        since: SystemTime,
        consent_id: Option<u64>,
        answer: Option<&Answer>,
    ) {
        let (text, uid) = match answer {
            Some(Answer::Approved { by_uid }) => ("approved", Some(*by_uid)),
            Some(Answer::Denied { by_uid }) => ("denied", Some(*by_uid)),
            Some(Answer::Expired) => ("expired", None),
            Some(Answer::Withdrawn) => ("withdrawn", None),
            None => ("too-many-pending", None),
        };
        let waited = SystemTime::now().duration_since(since).unwrap_or_default();
        let mut s = self
            .span("agentos.consent", since)
            .attr("agentos.consent.answer", text)
            .attr("agentos.consent.wait_ms", waited.as_millis() as u64);
        if let Some(id) = consent_id {
            s = s.attr("agentos.consent.id", id);
        }
        if let Some(u) = uid {
            s = s.attr("agentos.consent.operator_uid", u64::from(u));
        }
        self.turn.telemetry().record(s);
        if !matches!(answer, Some(Answer::Approved { .. })) {
            self.ended(ToolOutcome::ConsentRefused);
        }
    }

    /// The tool ran from `start` for `took`; `summary` is the audit record's outcome
    /// (`ok`, `error`).
    pub(super) fn tool(&self, start: SystemTime, took: Duration, summary: &Value) {
        let ok = summary.get("ok").and_then(Value::as_bool).unwrap_or(false);
        let error = summary.get("error").and_then(Value::as_str);
        let outcome = match (ok, error) {
            (true, _) => ToolOutcome::Ok,
            (false, Some("cancelled")) => ToolOutcome::Cancelled,
            _ => ToolOutcome::Error,
        };
        let mut s = self
            .span(format!("execute_tool {}", self.tool), start)
            .attr("gen_ai.operation.name", "execute_tool")
            .attr("agentos.tool.outcome", outcome.as_str());
        s.end = (start + took).max(start);
        if outcome != ToolOutcome::Ok {
            s.error = Some(
                error
                    .unwrap_or("the tool answered with isError")
                    .to_string(),
            );
        }
        let tel = self.turn.telemetry();
        tel.record(s);
        tel.tool_call(&self.labels, &self.tool, outcome, Some(took));
    }
}
