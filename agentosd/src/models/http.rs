//! The OpenAI-compatible API an agent sees on its model socket: `GET /v1/models`,
//! `POST /v1/chat/completions` (whole or streamed), `POST /v1/embeddings`. Each call is decided
//! against the agent's contract, held for consent where the contract says so, reserved against
//! its token budgets, recorded durably before it is forwarded, and recorded with what it used
//! when it ends. Refusals are OpenAI-style errors with a message that says what to change.

// The `Err` of the steps below is the answer to send (a `Response`, ~150 bytes), made at most
// once per request: boxing it would only add an allocation.
#![allow(clippy::result_large_err)]

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use audit::{Decision, Kind};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode, header};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::access::{Refusal, WHEN_UNAVAILABLE};
use super::budget::{Exceeded, Meter, Reservation};
use super::config::{ModelEntry, ModelKind};
use super::upstream::{self, AnswerBody, Outcome, StreamCtx};
use super::{AgentModels, Gateway};

/// The largest request an agent may send.
pub const MAX_REQUEST_BYTES: usize = 4 << 20;
/// The most choices one chat call may ask for (`n`).
pub const MAX_CHOICES: u64 = 8;
/// The most prompt or completion text kept in a record when the contract asks to keep it.
pub const MAX_KEPT_TEXT: usize = 64 << 10;

/// An OpenAI-style error answer.
pub fn error(status: StatusCode, kind: &str, code: &str, message: &str) -> Response<AnswerBody> {
    let body = json!({"error": {"message": message, "type": kind, "code": code, "param": null}});
    let mut r = Response::new(http_body_util::Either::Left(Full::new(Bytes::from(
        body.to_string(),
    ))));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    r
}

/// One request of an agent.
pub(super) async fn handle(
    gw: Arc<Gateway>,
    agent: Arc<AgentModels>,
    req: Request<Incoming>,
) -> Result<Response<AnswerBody>, Infallible> {
    let path = req.uri().path().trim_end_matches('/').to_string();
    let r = match (req.method(), path.as_str()) {
        (&Method::GET, "/v1/models") => list(&gw, &agent),
        (&Method::POST, "/v1/chat/completions") => {
            call(&gw, &agent, req, ModelKind::Chat, "/chat/completions").await
        }
        (&Method::POST, "/v1/embeddings") => {
            call(&gw, &agent, req, ModelKind::Embeddings, "/embeddings").await
        }
        (_, "/v1/models" | "/v1/chat/completions" | "/v1/embeddings") => error(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            "method_not_allowed",
            "method not allowed on this path",
        ),
        _ => error(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "unknown_url",
            &format!(
                "{path} is not served by the agentos model gateway (it serves /v1/models, \
                 /v1/chat/completions and /v1/embeddings)"
            ),
        ),
    };
    Ok(r)
}

fn list(gw: &Gateway, agent: &AgentModels) -> Response<AnswerBody> {
    let data: Vec<Value> = agent
        .access
        .visible(&gw.cfg)
        .into_iter()
        .map(|m| {
            let b = &gw.cfg.backends[m.backend];
            json!({"id": m.name, "object": "model", "created": 0,
                   "owned_by": format!("agentos:{}", b.placement.as_str()),
                   "agentos": {"kind": match m.kind { ModelKind::Chat => "chat", ModelKind::Embeddings => "embeddings" },
                               "placement": b.placement.as_str()}})
        })
        .collect();
    let mut r = Response::new(http_body_util::Either::Left(Full::new(Bytes::from(
        json!({"object": "list", "data": data}).to_string(),
    ))));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    r
}

/// A call as it goes through the gateway.
pub(super) struct Call {
    pub kind: ModelKind,
    pub endpoint: &'static str,
    pub requested: String,
    pub body: Value,
    pub stream: bool,
    pub prompt_estimate: u64,
    /// What the prompt can cost at most, for the budgets: one token per byte (byte-level
    /// tokenizers) plus what chat templates add per message and per request.
    pub prompt_bound: u64,
    pub prompt_sha256: String,
    pub prompt: Option<String>,
    pub t0: Instant,
    pub onset: std::time::SystemTime,
    /// Its spans, when telemetry is on.
    pub trace: Option<super::trace::CallTrace>,
}

impl Call {
    /// The record detail every record of this call starts from.
    pub fn base(&self, model: &str) -> Value {
        json!({"model": model, "requested_model": self.requested, "endpoint": self.endpoint,
               "stream": self.stream, "prompt_tokens_estimate": self.prompt_estimate,
               "prompt_sha256": self.prompt_sha256})
    }
}

/// Reads the request body, bounded, as a JSON object with a `model`.
async fn read_request(
    req: Request<Incoming>,
    kind: ModelKind,
    endpoint: &'static str,
    keep: bool,
) -> Result<Call, Response<AnswerBody>> {
    let bad =
        |code: &str, msg: &str| error(StatusCode::BAD_REQUEST, "invalid_request_error", code, msg);
    let bytes = match Limited::new(req.into_body(), MAX_REQUEST_BYTES)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return Err(error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                "request_too_large",
                &format!("the request could not be read or exceeds {MAX_REQUEST_BYTES} bytes: {e}"),
            ));
        }
    };
    let body: Value = serde_json::from_slice(&bytes).map_err(|e| {
        bad(
            "invalid_json",
            &format!("the request body is not JSON: {e}"),
        )
    })?;
    if !body.is_object() {
        return Err(bad(
            "invalid_json",
            "the request body must be a JSON object",
        ));
    }
    let requested = body
        .get("model")
        .and_then(Value::as_str)
        .filter(|m| !m.is_empty() && m.len() <= 256)
        .ok_or_else(|| {
            bad(
                "missing_model",
                "the request names no model (\"model\": \"…\")",
            )
        })?
        .to_string();
    let prompt_text = match kind {
        ModelKind::Chat => body.get("messages").map(Value::to_string),
        ModelKind::Embeddings => body.get("input").map(Value::to_string),
    }
    .ok_or_else(|| match kind {
        ModelKind::Chat => bad("missing_messages", "the request has no \"messages\""),
        ModelKind::Embeddings => bad("missing_input", "the request has no \"input\""),
    })?;
    let stream = kind == ModelKind::Chat && body.get("stream") == Some(&Value::Bool(true));
    Ok(Call {
        kind,
        endpoint,
        requested,
        stream,
        // About four bytes per token, the usual rule; the backend's usage settles the account.
        prompt_estimate: (prompt_text.len() as u64).div_ceil(4),
        // The whole request, not only the messages: tool definitions, a response format and
        // the like are prompt too.
        prompt_bound: prompt_bound(&body, kind, bytes.len()),
        prompt_sha256: hex::encode(Sha256::digest(prompt_text.as_bytes())),
        prompt: keep.then(|| prompt_text.chars().take(MAX_KEPT_TEXT).collect()),
        body,
        t0: Instant::now(),
        onset: std::time::SystemTime::now(),
        trace: None,
    })
}

/// Chat templates add a few tokens per message (role markers) and per request (a default
/// system prompt): SmolLM2's adds 22 to a one-message chat.
const TEMPLATE_PER_MESSAGE: u64 = 16;
const TEMPLATE_PER_REQUEST: u64 = 64;

/// The most tokens a prompt of `bytes` bytes can cost (see [`Call::prompt_bound`]).
fn prompt_bound(body: &Value, kind: ModelKind, bytes: usize) -> u64 {
    let items = match kind {
        ModelKind::Chat => body.get("messages"),
        ModelKind::Embeddings => body.get("input"),
    }
    .and_then(Value::as_array)
    .map_or(1, Vec::len) as u64;
    bytes as u64 + items * TEMPLATE_PER_MESSAGE + TEMPLATE_PER_REQUEST
}

async fn call(
    gw: &Arc<Gateway>,
    agent: &Arc<AgentModels>,
    req: Request<Incoming>,
    kind: ModelKind,
    endpoint: &'static str,
) -> Response<AnswerBody> {
    // Held until the answer ends (for a stream, until its last event), not just its head.
    let Ok(inflight) = agent.inflight.clone().try_acquire_owned() else {
        return error(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_exceeded",
            "too_many_concurrent_calls",
            &format!(
                "this agent has {} model calls in flight, the most it may",
                super::MAX_INFLIGHT_PER_AGENT
            ),
        );
    };
    let mut call = match read_request(req, kind, endpoint, agent.access.record_content).await {
        Ok(c) => c,
        Err(r) => return r,
    };
    call.trace = gw.trace(agent, &call);
    let (entry, fallback) = match choose(gw, agent, &call.requested, kind) {
        Ok(x) => x,
        Err((refusal, status)) => {
            let msg = refusal.message(&call.requested);
            gw.refused(agent, &call, &msg, "model-not-allowed");
            let code = if refusal == Refusal::Unknown {
                "model_not_found"
            } else {
                "model_not_allowed"
            };
            return error(status, "invalid_request_error", code, &msg);
        }
    };
    if let Some(max) = agent.access.max_context_tokens
        && call.prompt_estimate > max
    {
        let msg = format!(
            "the prompt is about {} tokens; this agent's contract allows {max} \
             (modelPolicy.max_context_tokens)",
            call.prompt_estimate
        );
        gw.refused(agent, &call, &msg, "context-too-long");
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "context_length_exceeded",
            &msg,
        );
    }
    let reservation = match reserve(gw, agent, &mut call) {
        Ok(r) => r,
        Err(r) => return r,
    };
    gw.forward(agent, call, entry, fallback, reservation, inflight)
        .await
}

/// The model to call: the requested one, or the contract's fallback for why it is refused.
#[allow(clippy::type_complexity)]
fn choose<'g>(
    gw: &'g Gateway,
    agent: &AgentModels,
    model: &str,
    kind: ModelKind,
) -> Result<(&'g ModelEntry, Option<(String, &'static str)>), (Refusal, StatusCode)> {
    match agent.access.check(&gw.cfg, model, kind) {
        Ok(e) => Ok((e, None)),
        Err(refusal) => {
            let when = refusal.condition();
            if let Some(sub) = agent.access.fallback(when)
                && let Ok(e) = agent.access.check(&gw.cfg, sub, kind)
            {
                return Ok((e, Some((model.to_string(), when))));
            }
            let status = match refusal {
                Refusal::Unknown => StatusCode::NOT_FOUND,
                _ => StatusCode::FORBIDDEN,
            };
            Err((refusal, status))
        }
    }
}

/// The output tokens per choice that `meters` leave a call whose prompt costs at most
/// `prompt_bound` (`None`: no budget limits it), or the first budget (its index) that leaves
/// not even one token per choice, and why (nothing is reserved). A budget's headroom that is
/// at least the prompt but short of one token per choice refuses the call by that budget's
/// name: it is spent, even though the prompt alone would fit.
fn output_cap(
    meters: &[&Meter],
    prompt_bound: u64,
    choices: u64,
) -> Result<Option<u64>, (usize, Exceeded)> {
    let mut cap: Option<u64> = None;
    for (i, m) in meters.iter().enumerate() {
        if let Some(h) = m.headroom() {
            let mut left = h.saturating_sub(prompt_bound) / choices;
            if left == 0 {
                // A minute's bucket may have refilled since the headroom was read: then the
                // call gets its one token.
                m.check(prompt_bound + choices).map_err(|e| (i, e))?;
                left = 1;
            }
            cap = Some(cap.map_or(left, |c| c.min(left)));
        }
    }
    Ok(cap)
}

/// Reserve the call's tokens on the agent's and the tenant's budgets, capping its output to
/// what they leave (and to `max_output_tokens`); the answer to send when they leave nothing.
fn reserve(
    gw: &Gateway,
    agent: &AgentModels,
    call: &mut Call,
) -> Result<[Reservation; 2], Response<AnswerBody>> {
    let meters = [&agent.meter, &*agent.tenant_meter];
    let mut cap: Option<u64> = agent.access.max_output_tokens;
    // Choices generated at once (`n`): each may use the whole output cap.
    let mut choices = 1;
    // The budget (its meter's index) that leaves no output token, and why.
    let mut spent = None;
    if call.kind == ModelKind::Chat {
        choices = match call.body.get("n") {
            None | Some(Value::Null) => 1,
            Some(v) => match v.as_u64() {
                Some(n) if (1..=MAX_CHOICES).contains(&n) => n,
                _ => {
                    return Err(error(
                        StatusCode::BAD_REQUEST,
                        "invalid_request_error",
                        "invalid_n",
                        &format!("n must be a whole number from 1 to {MAX_CHOICES}"),
                    ));
                }
            },
        };
        // The client's own name for the output cap is kept (reasoning models refuse the other).
        let key = if call.body.get("max_completion_tokens").is_some() {
            "max_completion_tokens"
        } else {
            "max_tokens"
        };
        // An asked cap of 0 is sent as 1 (below), so it is counted as 1.
        let asked = call.body.get(key).and_then(Value::as_u64).map(|a| a.max(1));
        match output_cap(&meters, call.prompt_bound, choices) {
            Ok(Some(left)) => cap = Some(cap.map_or(left, |c| c.min(left))),
            Ok(None) => {}
            Err(e) => spent = Some(e),
        }
        let out = match (asked, cap) {
            (Some(a), Some(c)) => Some(a.min(c)),
            (a, c) => a.or(c),
        };
        if let Some(n) = out
            && let Some(o) = call.body.as_object_mut()
        {
            o.remove("max_completion_tokens");
            o.remove("max_tokens");
            o.insert(key.into(), json!(n.max(1)));
        }
        cap = out;
    }
    // Who refuses: the agent's budget (its contract) or its tenant's (models.yaml).
    let whose = |i: usize| match i {
        0 => (
            "this agent's".to_string(),
            "budgets.tokens",
            "budgets.tokens_per_minute",
        ),
        _ => (
            format!("tenant {}'s", agent.tenant),
            "tenants.tokens in the daemon's models.yaml",
            "tenants.tokens_per_minute in the daemon's models.yaml",
        ),
    };
    let over = |e: Exceeded, i: usize| -> Response<AnswerBody> {
        let (who, total_field, rate_field) = whose(i);
        let (msg, kind, code, retry) = match e {
            Exceeded::Total { limit, used } => (
                format!(
                    "{who} token budget is spent: {used} of {limit} tokens used ({total_field})"
                ),
                "insufficient_quota",
                "insufficient_quota",
                None,
            ),
            Exceeded::Rate {
                per_minute,
                retry_after_s,
            } => (
                format!(
                    "{who} rate of {per_minute} tokens per minute is spent; retry in {retry_after_s} s ({rate_field})"
                ),
                "rate_limit_exceeded",
                "rate_limit_exceeded",
                Some(retry_after_s),
            ),
        };
        gw.refused(agent, call, &msg, "over-budget");
        let mut r = error(StatusCode::TOO_MANY_REQUESTS, kind, code, &msg);
        if let Some(s) = retry
            && let Ok(v) = header::HeaderValue::from_str(&s.to_string())
        {
            r.headers_mut().insert(header::RETRY_AFTER, v);
        }
        r
    };
    if let Some((i, e)) = spent {
        return Err(over(e, i));
    }
    let need = call.prompt_bound + cap.unwrap_or(0) * choices;
    let a = agent.meter.reserve(need).map_err(|e| over(e, 0))?;
    match agent.tenant_meter.reserve(need) {
        Ok(t) => Ok([a, t]),
        Err(e) => {
            agent.meter.settle(a, 0);
            Err(over(e, 1))
        }
    }
}

impl Gateway {
    /// Records a refused call (rate-limited like denials are not: refusals are the agent's own
    /// requests, bounded by its in-flight limit).
    pub(super) fn refused(&self, agent: &AgentModels, call: &Call, why: &str, reason: &str) {
        agent.stats.refused();
        self.trace_gate(call, &call.requested, "deny", reason);
        if let Some(t) = &self.audit {
            let mut d = call.base(&call.requested);
            d["reason"] = json!(reason);
            d["message"] = json!(why);
            t.submit(
                t.agent_record(Kind::Gate, &agent.tenant, &agent.name)
                    .decision(Decision::Deny)
                    .detail(d),
            );
        }
    }

    /// Consent, the durable allow record, the backend call (with the contract's fallback when
    /// the backend is unavailable), and the account when the answer ends.
    async fn forward(
        self: &Arc<Self>,
        agent: &Arc<AgentModels>,
        owned: Call,
        mut entry: &ModelEntry,
        mut fallback: Option<(String, &'static str)>,
        reservation: [Reservation; 2],
        inflight: tokio::sync::OwnedSemaphorePermit,
    ) -> Response<AnswerBody> {
        let call = &owned;
        let settle_nothing = |agent: &AgentModels| {
            agent.meter.settle(reservation[0], 0);
            agent.tenant_meter.settle(reservation[1], 0);
        };
        if let Err(r) = self.consent(agent, call, &entry.name).await {
            settle_nothing(agent);
            return r;
        }
        if let Err(r) = self
            .commit_allow(agent, call, entry, fallback.as_ref())
            .await
        {
            settle_nothing(agent);
            return r;
        }
        let resp = loop {
            let backend = &self.cfg.backends[entry.backend];
            let mut body = call.body.clone();
            body["model"] = json!(entry.upstream);
            let client_wants_usage = call.stream
                && body
                    .pointer("/stream_options/include_usage")
                    .and_then(Value::as_bool)
                    == Some(true);
            if call.stream {
                body["stream_options"] = json!({"include_usage": true});
            }
            // The backend's slot is held until the answer ends, like the agent's.
            let slot = self.backend_slot(entry.backend).await;
            let sent = upstream::send(
                backend,
                call.endpoint,
                serde_json::to_vec(&body).unwrap_or_default(),
            )
            .await;
            match sent {
                Ok(r) => break Ok((r, client_wants_usage, slot)),
                Err(e) => {
                    drop(slot);
                    if fallback.is_none()
                        && let Some(sub) = agent.access.fallback(WHEN_UNAVAILABLE)
                        && let Ok(alt) = agent.access.check(&self.cfg, sub, call.kind)
                        && alt.name != entry.name
                        && !agent.access.needs_consent(&alt.name)
                    {
                        tracing::info!("{}: {e}; falling back to {}", agent.id, alt.name);
                        fallback = Some((entry.name.clone(), WHEN_UNAVAILABLE));
                        entry = alt;
                        if let Err(r) = self
                            .commit_allow(agent, call, entry, fallback.as_ref())
                            .await
                        {
                            settle_nothing(agent);
                            return r;
                        }
                        continue;
                    }
                    break Err(e);
                }
            }
        };
        let (resp, client_wants_usage, slot) = match resp {
            Ok(x) => x,
            Err(e) => {
                settle_nothing(agent);
                let msg = format!("the model backend is unavailable: {e}");
                self.finish(
                    agent,
                    call,
                    entry,
                    fallback.as_ref(),
                    &Outcome {
                        status: 502,
                        cut: Some(msg.clone()),
                        duration: call.t0.elapsed(),
                        ..Default::default()
                    },
                );
                return error(
                    StatusCode::BAD_GATEWAY,
                    "api_error",
                    "backend_unavailable",
                    &msg,
                );
            }
        };
        let streamed = call.stream
            && resp
                .headers()
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("text/event-stream"));
        let keep = agent.access.record_content;
        if streamed {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let r = upstream::stream(
                resp,
                StreamCtx {
                    model: entry.name.clone(),
                    client_wants_usage,
                    keep,
                    t0: call.t0,
                },
                tx,
            );
            let (gw, agent) = (self.clone(), agent.clone());
            // The call moves into the task that accounts for it when the stream ends.
            let call = owned;
            let (entry, fallback) = (entry.clone(), fallback.clone());
            let held = (inflight, slot);
            tokio::spawn(async move {
                let out = rx.await.unwrap_or_default();
                drop(held);
                gw.account(&agent, &call, &out, reservation);
                gw.finish(&agent, &call, &entry, fallback.as_ref(), &out);
            });
            return r;
        }
        let (r, out) = upstream::whole(resp, &entry.name, call.t0, keep).await;
        drop((inflight, slot));
        self.account(agent, call, &out, reservation);
        self.finish(agent, call, entry, fallback.as_ref(), &out);
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A budget whose headroom covers the prompt but not one output token per choice refuses
    /// the call by its own name and figures (a CI run once answered "this agent's token budget
    /// is spent: 0 of 0" for the tenant's budget left with exactly the prompt's bound).
    #[test]
    fn a_budget_left_with_only_the_prompt_refuses_by_its_name() {
        let agent = Meter::new(None, None);
        for left in [40, 41, 43] {
            let tenant = Meter::with_used(Some(400), None, 400 - left);
            // n = 4 choices: 40..43 tokens leave the prompt of 40 and less than 1 token each.
            assert_eq!(
                output_cap(&[&agent, &tenant], 40, 4),
                Err((
                    1,
                    Exceeded::Total {
                        limit: 400,
                        used: 400 - left
                    }
                )),
                "{left} tokens left"
            );
        }
        // One token per choice fits: the call is capped, not refused.
        let tenant = Meter::with_used(Some(400), None, 356);
        assert_eq!(output_cap(&[&agent, &tenant], 40, 4), Ok(Some(1)));
        // The agent's own budget is named first when both are spent.
        let spent = Meter::with_used(Some(100), None, 100);
        assert_eq!(
            output_cap(&[&spent, &tenant], 40, 1),
            Err((
                0,
                Exceeded::Total {
                    limit: 100,
                    used: 100
                }
            ))
        );
        // Without budgets nothing caps the output.
        assert_eq!(output_cap(&[&agent, &agent], 40, 1), Ok(None));
        // A minute's bucket with the prompt and a little over: capped by what it leaves.
        let minute = Meter::new(None, Some(100));
        assert_eq!(output_cap(&[&agent, &minute], 40, 2), Ok(Some(30)));
    }
}
