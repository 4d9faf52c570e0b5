//! The spans of one model call (telemetry/, docs/telemetry.md): the gate's decision
//! (`agentos.gate`), the consent wait (`agentos.consent`) and the call itself
//! (`chat MODEL` / `embeddings MODEL`, GenAI semantic conventions: `gen_ai.request.model`,
//! `gen_ai.response.model`, `gen_ai.usage.input_tokens`, `gen_ai.usage.output_tokens`), all
//! children of the agent's turn. A chat call whose last message is the user's begins a new turn;
//! one that answers a tool result continues it. Nothing is built when telemetry is off.

use std::time::SystemTime;

use serde_json::Value;

use super::config::ModelKind;
use super::http::Call;
use super::upstream::Outcome;
use super::{AgentModels, Gateway};
use crate::telemetry::{AgentLabels, SpanData, TurnCtx};

/// One traced model call.
pub(super) struct CallTrace {
    turn: TurnCtx,
    labels: AgentLabels,
}

/// Whether `body` (a chat request) begins a turn: its last message is the user's.
fn begins_turn(body: &Value) -> bool {
    body.get("messages")
        .and_then(Value::as_array)
        .and_then(|m| m.last())
        .and_then(|m| m.get("role"))
        .and_then(Value::as_str)
        == Some("user")
}

impl Gateway {
    /// The trace of `call` by `agent`; `None` when telemetry is off.
    pub(super) fn trace(&self, agent: &AgentModels, call: &Call) -> Option<CallTrace> {
        if !self.telemetry.enabled() {
            return None;
        }
        let labels = AgentLabels::new(&agent.id, &agent.tenant, &agent.name, agent.binding.clone());
        let new_turn = call.kind == ModelKind::Chat && begins_turn(&call.body);
        let turn = self.telemetry.turn(&labels, new_turn);
        Some(CallTrace { turn, labels })
    }

    /// The gate decided `decision` for `reason` (`model` as decided).
    pub(super) fn trace_gate(&self, call: &Call, model: &str, decision: &str, reason: &str) {
        if let Some(t) = &call.trace {
            self.telemetry.record(
                SpanData::child(&t.turn, &t.labels, "agentos.gate", call.onset)
                    .attr("gen_ai.request.model", model)
                    .attr("agentos.gate.decision", decision)
                    .attr("agentos.gate.reason", reason),
            );
        }
    }

    /// A consent wait that began at `since` ended with `answer`.
    pub(super) fn trace_consent(&self, call: &Call, model: &str, since: SystemTime, answer: &str) {
        if let Some(t) = &call.trace {
            let waited = SystemTime::now().duration_since(since).unwrap_or_default();
            self.telemetry.record(
                SpanData::child(&t.turn, &t.labels, "agentos.consent", since)
                    .attr("gen_ai.request.model", model)
                    .attr("agentos.consent.answer", answer)
                    .attr("agentos.consent.wait_ms", waited.as_millis() as u64),
            );
        }
    }

    /// The call to `backend` for `model` ended with `out`; `(prompt, completion)` tokens used.
    pub(super) fn trace_call(
        &self,
        call: &Call,
        model: &str,
        backend: &str,
        out: &Outcome,
        tokens: (u64, u64),
    ) {
        let Some(t) = &call.trace else { return };
        let op = match call.kind {
            ModelKind::Chat => "chat",
            ModelKind::Embeddings => "embeddings",
        };
        let mut s = SpanData::model_call(&t.turn, &t.labels, op, &call.requested, call.onset)
            .attr("gen_ai.provider.name", backend)
            .attr("gen_ai.response.model", model)
            .attr("gen_ai.usage.input_tokens", tokens.0)
            .attr("gen_ai.usage.output_tokens", tokens.1)
            .attr("agentos.model.stream", call.stream);
        if let Some(ft) = out.first_token {
            s = s.attr("agentos.model.first_token_ms", ft.as_secs_f64() * 1000.0);
        }
        if out.status >= 400 || out.cut.is_some() {
            s.error = Some(
                out.cut
                    .clone()
                    .unwrap_or_else(|| format!("the backend answered {}", out.status)),
            );
            s = s.attr(
                "error.type",
                if out.status >= 400 {
                    out.status.to_string()
                } else {
                    "cut".into()
                },
            );
        }
        self.telemetry.record(s);
        self.telemetry.tokens(&t.labels, model, tokens.0, tokens.1);
    }
}
