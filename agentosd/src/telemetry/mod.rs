//! OpenTelemetry export (docs/telemetry.md): one trace per agent turn (lineage.rs), with the
//! tool calls, gate decisions, consent waits and model calls as children of the turn span, and
//! per-agent metrics, sent over OTLP/HTTP (protobuf) to a collector (export.rs, otlp.rs).
//!
//! Off by default ([`Telemetry::off`]: every method returns at once). When on, nothing here
//! blocks a call: spans go into a bounded queue ([`Telemetry::record`] never waits; a full
//! queue drops the span and counts it), one task batches and posts them with a timeout per
//! export, and what a failed export carried is counted as dropped too ([`Telemetry::dropped`],
//! a log line, and the `agentos.telemetry.spans.dropped` metric).

mod export;
mod lineage;
mod metrics;
mod otlp;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::sync::mpsc;

pub use lineage::{ClosedTurn, TurnEnd, Turns};
pub use metrics::{AgentSample, ToolOutcome};
pub use otlp::{MAX_STR, cut};

/// Spans waiting for export at most, by default (`--otlp-queue-size`).
pub const DEFAULT_QUEUE: usize = 2048;

/// Where and how to export (`agentosd --otlp-endpoint` and its companions).
#[derive(Debug, Clone, PartialEq)]
pub struct OtlpConfig {
    /// The collector's OTLP/HTTP base URL, `http://HOST:PORT[/PATH]`; spans go to
    /// `PATH/v1/traces`, metrics to `PATH/v1/metrics`.
    pub endpoint: String,
    /// Spans waiting for export at most; more are dropped and counted.
    pub queue_size: usize,
    /// Spans per export request at most.
    pub max_batch: usize,
    /// A partial batch is sent after this long.
    pub flush_interval: Duration,
    /// One export (connect, send, answer) may take this long; then it is abandoned and what it
    /// carried is counted as dropped.
    pub export_timeout: Duration,
    /// Per-agent metrics are exported this often.
    pub metrics_interval: Duration,
    /// A turn with nothing in flight ends after this long without activity.
    pub turn_idle: Duration,
    /// Open turns at most (one per agent); agents with metrics series at most.
    pub max_agents: usize,
}

impl OtlpConfig {
    /// Export to `endpoint` with the default bounds and intervals.
    pub fn new(endpoint: impl Into<String>) -> OtlpConfig {
        OtlpConfig {
            endpoint: endpoint.into(),
            queue_size: DEFAULT_QUEUE,
            max_batch: 512,
            flush_interval: Duration::from_secs(1),
            export_timeout: Duration::from_secs(5),
            metrics_interval: Duration::from_secs(10),
            turn_idle: Duration::from_secs(30),
            max_agents: 4096,
        }
    }
}

/// Why telemetry could not start.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error(
        "OTLP endpoint {endpoint:?}: {why} (give the collector's OTLP/HTTP address, e.g. http://127.0.0.1:4318)"
    )]
    Endpoint { endpoint: String, why: String },
    #[error("the OTLP exporter needs a tokio runtime (Telemetry::start was called outside one)")]
    NoRuntime,
}

/// Who a span or a metric is about: the agent, its tenant and the contract's binding hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentLabels {
    /// `tenant/name`.
    pub id: String,
    pub tenant: String,
    pub name: String,
    /// The sealed binding manifest hash of the agent's contract, when it bound.
    pub binding: Option<String>,
}

impl AgentLabels {
    pub fn new(
        id: impl Into<String>,
        tenant: impl Into<String>,
        name: impl Into<String>,
        binding: Option<String>,
    ) -> AgentLabels {
        AgentLabels {
            id: id.into(),
            tenant: tenant.into(),
            name: name.into(),
            binding,
        }
    }

    /// The attributes every span and metric of this agent carries: `agentos.agent`,
    /// `agentos.tenant`, `agentos.agent.name` and `agentos.binding` (when bound).
    pub fn attrs(&self) -> Vec<(String, AttrValue)> {
        let mut v = vec![
            (ATTR_AGENT.into(), AttrValue::Str(self.id.clone())),
            (ATTR_TENANT.into(), AttrValue::Str(self.tenant.clone())),
            (ATTR_AGENT_NAME.into(), AttrValue::Str(self.name.clone())),
        ];
        if let Some(b) = &self.binding {
            v.push((ATTR_BINDING.into(), AttrValue::Str(b.clone())));
        }
        v
    }
}

/// Attribute names shared by spans and metrics.
pub const ATTR_AGENT: &str = "agentos.agent";
pub const ATTR_TENANT: &str = "agentos.tenant";
pub const ATTR_AGENT_NAME: &str = "agentos.agent.name";
pub const ATTR_BINDING: &str = "agentos.binding";

/// The agent's current turn: its trace and the turn span, parent of the turn's children.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TurnCtx {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
}

/// OTLP's span kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanKind {
    Internal,
    Server,
    Client,
    Producer,
    Consumer,
}

/// An attribute value.
#[derive(Debug, Clone, PartialEq)]
pub enum AttrValue {
    Str(String),
    Int(i64),
    F64(f64),
    Bool(bool),
}

impl From<&str> for AttrValue {
    fn from(s: &str) -> Self {
        AttrValue::Str(s.to_string())
    }
}
impl From<String> for AttrValue {
    fn from(s: String) -> Self {
        AttrValue::Str(s)
    }
}
impl From<i64> for AttrValue {
    fn from(v: i64) -> Self {
        AttrValue::Int(v)
    }
}
impl From<u64> for AttrValue {
    fn from(v: u64) -> Self {
        AttrValue::Int(i64::try_from(v).unwrap_or(i64::MAX))
    }
}
impl From<f64> for AttrValue {
    fn from(v: f64) -> Self {
        AttrValue::F64(v)
    }
}
impl From<bool> for AttrValue {
    fn from(v: bool) -> Self {
        AttrValue::Bool(v)
    }
}

/// One finished span. Strings are cut to [`otlp::MAX_STR`] bytes when encoded (names and
/// attributes may carry what an agent sent).
#[derive(Debug, Clone, PartialEq)]
pub struct SpanData {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub parent: Option<[u8; 8]>,
    pub name: String,
    pub kind: SpanKind,
    pub start: SystemTime,
    pub end: SystemTime,
    pub attrs: Vec<(String, AttrValue)>,
    /// `Some(message)`: the span's status is ERROR with that message.
    pub error: Option<String>,
}

impl SpanData {
    /// A span of the agent `agent` under its turn `turn` (a new span id, the agent's
    /// attributes), from `start` to now; add attributes with [`SpanData::attr`].
    pub fn child(
        turn: &TurnCtx,
        agent: &AgentLabels,
        name: impl Into<String>,
        start: SystemTime,
    ) -> SpanData {
        SpanData {
            trace_id: turn.trace_id,
            span_id: new_span_id(),
            parent: Some(turn.span_id),
            name: name.into(),
            kind: SpanKind::Internal,
            start,
            end: SystemTime::now().max(start),
            attrs: agent.attrs(),
            error: None,
        }
    }

    /// A model call's span under `turn`, named as the GenAI semantic conventions name it
    /// (`{operation} {model}`, kind client, `gen_ai.operation.name`, `gen_ai.request.model`):
    /// the model gateway adds `gen_ai.provider.name`, `gen_ai.response.model`,
    /// `gen_ai.usage.input_tokens`, `gen_ai.usage.output_tokens` and, on failure, `error` and
    /// `error.type`; then [`Telemetry::record`] it and count the tokens with
    /// [`Telemetry::tokens`].
    pub fn model_call(
        turn: &TurnCtx,
        agent: &AgentLabels,
        operation: &str,
        model: &str,
        start: SystemTime,
    ) -> SpanData {
        let mut s = SpanData::child(turn, agent, format!("{operation} {model}"), start)
            .attr("gen_ai.operation.name", operation)
            .attr("gen_ai.request.model", model);
        s.kind = SpanKind::Client;
        s
    }

    pub fn attr(mut self, key: &str, v: impl Into<AttrValue>) -> SpanData {
        self.attrs.push((key.to_string(), v.into()));
        self
    }

    /// The value of attribute `key`, if set.
    pub fn get(&self, key: &str) -> Option<&AttrValue> {
        self.attrs.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }
}

/// A random span id (never all zeros, which OTLP reads as "none").
pub fn new_span_id() -> [u8; 8] {
    loop {
        let id: [u8; 8] = rand::random();
        if id != [0; 8] {
            return id;
        }
    }
}

/// A random trace id (never all zeros).
pub fn new_trace_id() -> [u8; 16] {
    loop {
        let id: [u8; 16] = rand::random();
        if id != [0; 16] {
            return id;
        }
    }
}

/// Counts of what telemetry lost and sent, since the daemon started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TelemetryStats {
    /// Spans refused because the export queue was full.
    pub queue_full: u64,
    /// Spans in exports that failed (collector down, slow, or refusing).
    pub export_failed: u64,
    /// Spans the collector accepted.
    pub exported: u64,
    /// Metric exports that failed or were skipped because the previous one was still going.
    pub metrics_failed: u64,
}

/// The daemon's telemetry, shared as `Arc<Telemetry>`; [`Telemetry::off`] records nothing.
pub struct Telemetry {
    on: Option<On>,
}

struct On {
    cfg: OtlpConfig,
    spans: mpsc::Sender<export::Msg>,
    metrics: mpsc::Sender<Vec<u8>>,
    queue_full: AtomicU64,
    metrics_skipped: AtomicU64,
    counters: Arc<export::Counters>,
    turns: Mutex<Turns>,
    series: Mutex<metrics::Series>,
    resource: otlp::Resource,
    /// Queue-full drops last logged, and when.
    said: Mutex<(u64, Option<std::time::Instant>)>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Telemetry {
    /// Telemetry that records nothing and costs a branch per call.
    pub fn off() -> Arc<Telemetry> {
        Arc::new(Telemetry { on: None })
    }

    /// Export to `cfg.endpoint`: spawns the exporter and the turn sweeper on the current tokio
    /// runtime. Metrics are exported when [`Telemetry::export_metrics`] is called with the
    /// agents' samples (the supervisor's sampler does, every `metrics_interval`).
    pub fn start(cfg: OtlpConfig) -> Result<Arc<Telemetry>, TelemetryError> {
        let rt = tokio::runtime::Handle::try_current().map_err(|_| TelemetryError::NoRuntime)?;
        let target = export::Target::parse(&cfg.endpoint)?;
        let (spans, spans_rx) = mpsc::channel(cfg.queue_size.max(1));
        // One metrics export waiting while one is sent: a slow collector skips samples.
        let (metrics, metrics_rx) = mpsc::channel(1);
        let counters = Arc::new(export::Counters::default());
        let tel = Arc::new(Telemetry {
            on: Some(On {
                turns: Mutex::new(Turns::new(cfg.max_agents, cfg.turn_idle)),
                series: Mutex::new(metrics::Series::new(cfg.max_agents)),
                spans,
                metrics,
                queue_full: AtomicU64::new(0),
                metrics_skipped: AtomicU64::new(0),
                counters: counters.clone(),
                resource: otlp::Resource::daemon(),
                said: Mutex::new((0, None)),
                cfg: cfg.clone(),
            }),
        });
        let exporter = export::Exporter::new(target, &cfg, counters, otlp::Resource::daemon());
        rt.spawn(exporter.run(spans_rx, metrics_rx));
        rt.spawn(sweep_turns(Arc::downgrade(&tel)));
        tracing::info!(
            "OpenTelemetry: exporting traces and metrics to {} (OTLP/HTTP protobuf; queue {} spans, metrics every {} s, turns end after {} s idle)",
            cfg.endpoint,
            cfg.queue_size,
            cfg.metrics_interval.as_secs_f64(),
            cfg.turn_idle.as_secs_f64()
        );
        Ok(tel)
    }

    /// [`Telemetry::start`] with `cfg`, or [`Telemetry::off`] without.
    pub fn from_config(cfg: Option<OtlpConfig>) -> Result<Arc<Telemetry>, TelemetryError> {
        match cfg {
            Some(c) => Self::start(c),
            None => Ok(Self::off()),
        }
    }

    pub fn enabled(&self) -> bool {
        self.on.is_some()
    }

    /// The configuration, when on.
    pub fn config(&self) -> Option<&OtlpConfig> {
        self.on.as_ref().map(|o| &o.cfg)
    }

    /// Queue `span` for export; never waits. A full queue drops it (counted).
    pub fn record(&self, span: SpanData) {
        let Some(on) = &self.on else {
            return;
        };
        if span.parent.is_some()
            && let Some(AttrValue::Str(agent)) = span.get(ATTR_AGENT)
        {
            lock(&on.turns).child(agent, &span.trace_id, span.end);
        }
        if on.spans.try_send(export::Msg::Span(span)).is_err() {
            on.queue_full.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Spans lost so far: refused by the full queue, or in exports that failed.
    pub fn dropped(&self) -> u64 {
        let s = self.stats();
        s.queue_full + s.export_failed
    }

    /// What telemetry lost and sent so far.
    pub fn stats(&self) -> TelemetryStats {
        let Some(on) = &self.on else {
            return TelemetryStats::default();
        };
        TelemetryStats {
            queue_full: on.queue_full.load(Ordering::Relaxed),
            export_failed: on.counters.failed_spans.load(Ordering::Relaxed),
            exported: on.counters.exported_spans.load(Ordering::Relaxed),
            metrics_failed: on.counters.failed_metrics.load(Ordering::Relaxed)
                + on.metrics_skipped.load(Ordering::Relaxed),
        }
    }

    /// The agent's current turn (opens one when `new_turn` or none is open): trace id + the
    /// turn span's id. An all-zero context when off (test [`Telemetry::enabled`] first to
    /// skip building spans). A call that takes a while should use [`Telemetry::enter`], so
    /// that its turn does not end idle under it.
    pub fn turn(&self, agent: &AgentLabels, new_turn: bool) -> TurnCtx {
        self.open_turn(agent, new_turn, false)
    }

    /// [`Telemetry::turn`] for a call that takes a while (a tool call, a consent wait, a
    /// model call): the turn does not end idle while the guard lives. `None` when off.
    pub fn enter(&self, agent: &AgentLabels, new_turn: bool) -> Option<TurnGuard<'_>> {
        self.on.as_ref()?;
        let ctx = self.open_turn(agent, new_turn, true);
        Some(TurnGuard {
            tel: self,
            agent: agent.id.clone(),
            ctx,
        })
    }

    fn open_turn(&self, agent: &AgentLabels, new_turn: bool, hold: bool) -> TurnCtx {
        let Some(on) = &self.on else {
            return TurnCtx {
                trace_id: [0; 16],
                span_id: [0; 8],
            };
        };
        let (ctx, closed) = lock(&on.turns).turn(agent, new_turn, hold, SystemTime::now());
        for c in closed {
            self.record(turn_span(c));
        }
        ctx
    }

    /// The agent stopped: close its open turn span and forget its metric series.
    pub fn end_agent(&self, agent_id: &str) {
        let Some(on) = &self.on else {
            return;
        };
        let closed = lock(&on.turns).end(agent_id, SystemTime::now());
        lock(&on.series).forget(agent_id);
        if let Some(c) = closed {
            self.record(turn_span(c));
        }
    }

    /// Count a tool call of `agent` for the metrics (`agentos.agent.tool.calls` by outcome;
    /// `agentos.agent.tool.duration` by tool for calls that ran).
    pub fn tool_call(
        &self,
        agent: &AgentLabels,
        tool: &str,
        outcome: ToolOutcome,
        took: Option<Duration>,
    ) {
        if let Some(on) = &self.on {
            lock(&on.series).tool_call(agent, tool, outcome, took, SystemTime::now());
        }
    }

    /// Count the tokens of one model call of `agent` (`gen_ai.client.token.usage`, by model
    /// and token type): the model gateway calls this with the backend's usage (or its own
    /// count), once per call.
    pub fn tokens(&self, agent: &AgentLabels, model: &str, prompt: u64, completion: u64) {
        if let Some(on) = &self.on {
            lock(&on.series).tokens(agent, model, prompt, completion, SystemTime::now());
        }
    }

    /// Export the metrics now, with `samples` of the agents: never waits (when the previous
    /// export is still going, this one is skipped and counted).
    pub fn export_metrics(&self, samples: &[AgentSample]) {
        let Some(on) = &self.on else {
            return;
        };
        let now = SystemTime::now();
        let stats = self.stats();
        let ms = {
            let mut series = lock(&on.series);
            let ms = series.metrics(samples, &stats, now);
            series.sweep();
            ms
        };
        let body = otlp::metrics_request(&on.resource, ms);
        if on.metrics.try_send(body).is_err() {
            on.metrics_skipped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Close every open turn and wait (at most `within`) until what is queued was sent.
    pub async fn shutdown(&self, within: Duration) {
        let Some(on) = &self.on else {
            return;
        };
        let closed = lock(&on.turns).drain(SystemTime::now());
        for c in closed {
            self.record(turn_span(c));
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        let _ = tokio::time::timeout(within, async {
            if on.spans.send(export::Msg::Flush(tx)).await.is_ok() {
                let _ = rx.await;
            }
        })
        .await;
    }

    /// End the idle turns; say (at most every 30 s) how many spans the full queue dropped.
    fn sweep(&self) {
        let Some(on) = &self.on else {
            return;
        };
        let closed = lock(&on.turns).sweep(SystemTime::now());
        for c in closed {
            self.record(turn_span(c));
        }
        let full = on.queue_full.load(Ordering::Relaxed);
        let mut said = lock(&on.said);
        let due = said
            .1
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(30));
        if full > said.0 && due {
            tracing::warn!(
                "OpenTelemetry: {} spans dropped because the export queue ({} spans) was full: the collector at {} is slow or down; calls are not delayed (dropped in all: {})",
                full - said.0,
                on.cfg.queue_size,
                on.cfg.endpoint,
                self.dropped()
            );
            *said = (full, Some(std::time::Instant::now()));
        }
    }
}

/// A call in flight in its agent's turn (see [`Telemetry::enter`]).
pub struct TurnGuard<'a> {
    tel: &'a Telemetry,
    agent: String,
    ctx: TurnCtx,
}

impl TurnGuard<'_> {
    pub fn ctx(&self) -> &TurnCtx {
        &self.ctx
    }

    pub fn telemetry(&self) -> &Telemetry {
        self.tel
    }
}

impl Drop for TurnGuard<'_> {
    fn drop(&mut self) {
        if let Some(on) = &self.tel.on {
            lock(&on.turns).leave(&self.agent, &self.ctx, SystemTime::now());
        }
    }
}

/// The span of a turn that ended: `agent.turn`, a root span of its trace.
pub fn turn_span(c: ClosedTurn) -> SpanData {
    let mut attrs = c.labels.attrs();
    attrs.push(("agentos.turn.end".into(), c.reason.as_str().into()));
    attrs.push(("agentos.turn.children".into(), c.children.into()));
    SpanData {
        trace_id: c.ctx.trace_id,
        span_id: c.ctx.span_id,
        parent: None,
        name: "agent.turn".into(),
        kind: SpanKind::Server,
        start: c.start,
        end: c.end,
        attrs,
        error: None,
    }
}

/// Every second: end the idle turns. Ends with the telemetry.
async fn sweep_turns(tel: std::sync::Weak<Telemetry>) {
    let mut sweep = tokio::time::interval(Duration::from_secs(1));
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        sweep.tick().await;
        match tel.upgrade() {
            Some(t) => t.sweep(),
            None => return,
        }
    }
}

#[cfg(test)]
mod tests;
