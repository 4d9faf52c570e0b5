//! MCP over the agents' sockets (paper 5.1, "MCP as the system call interface"): each connection
//! the ipc layer accepts is a session here. Requests are decoded (jsonrpc.rs), checked by the
//! gate against the caller's contract (who the caller is came from the kernel, see ipc/), held
//! for consent when the contract says so (consent.rs), audited, and run by the tool runners
//! (tools/); call.rs takes a `tools/call` through these steps. See docs/tools.md.

mod call;
pub mod consent;
pub mod jsonrpc;
mod stall;
mod trace;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use audit::{Decision, Kind};
use serde_json::{Value, json};
use tokio::sync::{Semaphore, oneshot};
use tracing::{debug, warn};

use crate::audit_trail::AuditTrail;
use crate::enforce::limit::RecordLimiter;
use crate::ipc::{Connection, Inbound, Outbox, Peer, Refusal};
use crate::telemetry::Telemetry;
use crate::tools::{Caller, Tools};
#[doc(hidden)]
pub use call::call_params;
use consent::Consents;
use jsonrpc::Incoming;

/// MCP protocol revisions this server speaks, newest first.
pub const PROTOCOL_VERSIONS: &[&str] = &["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];

/// Per-connection limits the session enforces (the ipc layer enforces line size and queues).
#[derive(Debug, Clone)]
pub struct SessionLimits {
    /// Requests answered concurrently on one connection; more get [`jsonrpc::TOO_MANY_CALLS`].
    pub max_in_flight: usize,
    /// The line-size limit, quoted in the error for an over-long line.
    pub max_line: usize,
    /// `tools/call` requests of one agent answered concurrently, across all its connections
    /// (each may start a tool process in the agent's cgroup); more get
    /// [`jsonrpc::TOO_MANY_CALLS`] with `error.data.scope = "agent"`.
    pub max_calls_per_agent: usize,
    /// Per-agent rate of the records about connections the ipc layer closed (the denial
    /// records' limits, `--denial-records-per-sec`, `--denial-records-burst`).
    pub records: crate::enforce::limit::Limits,
    /// The agents' CPU accounts (ipc/cpu.rs: the ipc server's, [`crate::ipc::IpcServer::cpu_ledger`]):
    /// every poll of a session and of a tool call is charged to its agent.
    pub cpu: Arc<crate::ipc::cpu::CpuLedger>,
}

/// The default of [`SessionLimits::max_calls_per_agent`].
pub const DEFAULT_MAX_CALLS_PER_AGENT: usize = 32;

impl Default for SessionLimits {
    fn default() -> Self {
        SessionLimits {
            max_in_flight: 32,
            max_line: crate::ipc::Limits::default().max_line,
            max_calls_per_agent: DEFAULT_MAX_CALLS_PER_AGENT,
            records: Default::default(),
            cpu: Default::default(),
        }
    }
}

/// What the gate knows about the agent on the other end, taken once per connection from its
/// contract (a running agent's contract does not change).
#[derive(Debug, Clone)]
pub struct CallerCtx {
    /// `tenant/name`.
    pub id: String,
    pub tenant: String,
    pub name: String,
    pub policy: Policy,
    /// What the tool runners need (uid, home, scopes).
    pub caller: Caller,
}

/// The contract's word on tool capabilities.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    /// Capabilities the contract grants.
    pub granted: BTreeSet<String>,
    /// `security.consent_for`.
    pub consent_for: BTreeSet<String>,
    /// `security.deny`.
    pub denied: BTreeSet<String>,
}

impl Policy {
    pub fn from_contract(c: &contracts::Contract) -> Policy {
        Policy {
            granted: c.capabilities().iter().map(|k| k.name.clone()).collect(),
            consent_for: c.security().consent_for.iter().cloned().collect(),
            denied: c.security().deny.iter().cloned().collect(),
        }
    }
}

/// Why the gate refused a call, before anything ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// No tool by that name is installed.
    UnknownTool,
    /// The contract does not grant the capability.
    NotGranted,
    /// The contract's `security.deny` lists it.
    Denied,
}

/// The gate's decision for a tool whose capability is `capability` (None: no such tool):
/// `Ok(true)` when the call must wait for consent.
pub fn decide(policy: &Policy, capability: Option<&str>) -> Result<bool, Refused> {
    let cap = capability.ok_or(Refused::UnknownTool)?;
    if policy.denied.contains(cap) {
        return Err(Refused::Denied);
    }
    if !policy.granted.contains(cap) {
        return Err(Refused::NotGranted);
    }
    Ok(policy.consent_for.contains(cap))
}

/// Who is calling on an agent's socket, for the gate: the agents' registry answers (the
/// supervisor, through a weak handle, so the service does not keep it alive).
pub trait Callers: Send + Sync {
    /// The caller's context, taken from the contract of the running agent `agent_id`; why not
    /// when the agent is unknown, not running, or has no contract.
    fn caller(&self, agent_id: &str) -> Result<CallerCtx, String>;

    /// A line from the daemon in agent `agent_id`'s journal (about its connections).
    fn note(&self, _agent_id: &str, _text: &str) {}
}

/// The MCP service: one per daemon.
pub struct McpService {
    callers: Arc<dyn Callers>,
    audit: Option<Arc<AuditTrail>>,
    /// Replaced as a whole by `daemon-reload` ([`McpService::reload_tools`]); a call in flight
    /// keeps the set it started with.
    tools: std::sync::RwLock<Arc<Tools>>,
    consents: Arc<Consents>,
    /// Spans of calls and tool-call metrics (telemetry/; off unless `--otlp-endpoint`).
    telemetry: Arc<Telemetry>,
    limits: SessionLimits,
    version: String,
    /// Agent id → its `tools/call` permits ([`SessionLimits::max_calls_per_agent`]), shared
    /// by all its connections.
    agent_calls: Mutex<HashMap<String, Arc<Semaphore>>>,
    /// Agent id → `tools/call` requests since the daemon started (`agentctl top`, D-Bus
    /// `ToolCalls`), whatever became of them.
    call_counts: Mutex<HashMap<String, u64>>,
    /// Rate limit of the records about closed connections (stall.rs).
    record_limit: Mutex<RecordLimiter>,
    /// Reports left at which to give freed memory back after a disconnect (stall.rs).
    trim_after: std::sync::atomic::AtomicU32,
}

impl McpService {
    pub fn new(
        callers: Arc<dyn Callers>,
        audit: Option<Arc<AuditTrail>>,
        tools: Arc<Tools>,
        consents: Arc<Consents>,
        telemetry: Arc<Telemetry>,
        limits: SessionLimits,
    ) -> Arc<Self> {
        Arc::new(McpService {
            callers,
            audit,
            tools: std::sync::RwLock::new(tools),
            consents,
            telemetry,
            limits: limits.clone(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            agent_calls: Mutex::new(HashMap::new()),
            call_counts: Mutex::new(HashMap::new()),
            record_limit: Mutex::new(RecordLimiter::new(limits.records)),
            trim_after: std::sync::atomic::AtomicU32::new(0),
        })
    }

    /// `tools/call` requests of agent `id` since the daemon started.
    pub fn calls_of(&self, id: &str) -> u64 {
        lock(&self.call_counts).get(id).copied().unwrap_or(0)
    }

    /// A permit for one more `tools/call` of agent `id`, or `None` when it has
    /// `max_calls_per_agent` in flight already (over all its connections).
    fn agent_call_permit(&self, id: &str) -> Option<tokio::sync::OwnedSemaphorePermit> {
        *lock(&self.call_counts).entry(id.to_string()).or_insert(0) += 1;
        let sem = lock(&self.agent_calls)
            .entry(id.to_string())
            .or_insert_with(|| Arc::new(Semaphore::new(self.limits.max_calls_per_agent)))
            .clone();
        sem.try_acquire_owned().ok()
    }

    pub fn consents(&self) -> &Arc<Consents> {
        &self.consents
    }

    /// The tools in use now.
    pub fn tools(&self) -> Arc<Tools> {
        self.tools.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// `daemon-reload`: read the tools directory again and use the new set from the next call
    /// on; the old set's MCP servers are stopped (they start again on demand). Returns how many
    /// tools loaded and what did not.
    pub async fn reload_tools(&self) -> (usize, Vec<String>) {
        let (new, errors) = self.tools().reload();
        let n = new.manifests().count();
        let old = std::mem::replace(
            &mut *self.tools.write().unwrap_or_else(|p| p.into_inner()),
            new,
        );
        old.shutdown().await;
        (n, errors)
    }

    fn audit(&self) -> Option<&Arc<AuditTrail>> {
        self.audit.as_ref()
    }

    /// Serves every connection the ipc layer hands over, and audits refused peers and the
    /// connections it closed.
    pub async fn run(self: Arc<Self>, incoming: crate::ipc::Incoming) {
        let crate::ipc::Incoming {
            mut conns,
            mut refusals,
            mut disconnects,
            mut throttles,
        } = incoming;
        let mut report = tokio::time::interval(stall::SUMMARY_EVERY);
        report.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                c = conns.recv() => match c {
                    Some(c) => {
                        let me = self.clone();
                        // Every poll of the session is the agent's CPU (ipc/cpu.rs).
                        let cpu = self.limits.cpu.agent(&c.peer.agent);
                        tokio::spawn(crate::ipc::cpu::Measured::new(me.session(c), cpu));
                    }
                    None => break,
                },
                r = refusals.recv() => if let Some(r) = r { self.refused_peer(r) },
                d = disconnects.recv() => if let Some(d) = d { self.disconnected(d) },
                t = throttles.recv() => if let Some(t) = t { self.throttled(t) },
                _ = report.tick() => self.report_suppressed(),
            }
        }
    }

    fn refused_peer(&self, r: Refusal) {
        // A process hammering an agent's socket costs a record each only within the denial
        // records' rate; the rest are counted in the next summary (stall.rs).
        if !lock(&self.record_limit).admit(&r.agent, "socket-refused", Instant::now()) {
            return;
        }
        warn!(
            agent = %r.agent,
            "refused a connection to the agent's MCP socket: {} (pid {:?}, uid {}, cgroup {:?})",
            r.reason, r.pid, r.uid, r.cgroup
        );
        if let Some(t) = self.audit() {
            let (tenant, name) = split_id(&r.agent);
            t.submit_or_count(
                t.agent_record(Kind::Gate, tenant, name)
                    .decision(Decision::Deny)
                    .detail(json!({
                        "event": "socket-refused",
                        "reason": r.reason,
                        "peer_pid": r.pid,
                        "peer_uid": r.uid,
                        "peer_cgroup": r.cgroup,
                    })),
            );
        }
    }

    /// One connection, until the peer closes it.
    pub async fn session(self: Arc<Self>, conn: Connection) {
        let Connection { peer, mut rx, tx } = conn;
        let ctx = match self.callers.caller(&peer.agent) {
            Ok(c) => Arc::new(c),
            Err(why) => {
                warn!(agent = %peer.agent, "closing an MCP connection: {why}");
                let _ = tx
                    .send(jsonrpc::error(
                        &Value::Null,
                        jsonrpc::UNAVAILABLE,
                        &format!("agentosd cannot serve agent {}: {why}", peer.agent),
                        Value::Null,
                    ))
                    .await;
                tx.close();
                return;
            }
        };
        let s = Session {
            svc: self.clone(),
            ctx,
            peer,
            tx,
            permits: Arc::new(Semaphore::new(self.limits.max_in_flight)),
            in_flight: Arc::new(Mutex::new(HashMap::new())),
        };
        let mut initialized = false;
        while let Some(msg) = rx.recv().await {
            // Boxed: a session waits for its next line most of its life (every running agent
            // keeps one on its inherited connection), and the handling of a line (a whole tool
            // call) need not be part of what it keeps while it waits.
            Box::pin(async {
                match msg {
                    Inbound::TooLong { len } => {
                        s.reply(jsonrpc::error(
                        &Value::Null,
                        jsonrpc::INVALID_REQUEST,
                        &format!(
                            "message of {len} bytes exceeds the limit of {} bytes; it was dropped",
                            self.limits.max_line
                        ),
                        Value::Null,
                    ))
                    .await;
                    }
                    Inbound::Line(line) => {
                        match parse_off_worker(line, || self.limits.cpu.agent(&s.peer.agent)).await
                        {
                            Incoming::Invalid { id, code, message } => {
                                s.reply(jsonrpc::error(&id, code, &message, Value::Null))
                                    .await;
                            }
                            Incoming::Response => {}
                            Incoming::Notification { method, params } => {
                                s.notification(&method, &params)
                            }
                            Incoming::Request { id, method, params } => {
                                if method == "initialize" {
                                    initialized = true;
                                    let r = self.initialize(&s.ctx, &params);
                                    s.reply(jsonrpc::result(&id, r)).await;
                                } else if method == "ping" {
                                    s.reply(jsonrpc::result(&id, json!({}))).await;
                                } else if !initialized {
                                    s.reply(jsonrpc::error(
                                        &id,
                                        jsonrpc::NOT_INITIALIZED,
                                        &format!(
                                            "send \"initialize\" before \"{}\"",
                                            jsonrpc::quote(&method)
                                        ),
                                        Value::Null,
                                    ))
                                    .await;
                                } else {
                                    s.request(id, method, params).await;
                                }
                            }
                        }
                    }
                }
            })
            .await;
            // A flood's session finds its next lines already queued and would handle them all
            // in this poll: it ends the poll here when another agent waits (ipc/turns.rs).
            crate::ipc::cpu::yield_past_turn().await;
        }
        // The peer stopped sending. Calls in flight still finish and are answered (a client
        // may half-close after its last request, as a shell pipeline into agentos-mcp does);
        // their tasks hold the outbox, so the connection closes after the last answer. To
        // stop a call, a client sends notifications/cancelled.
        debug!(agent = %s.peer.agent, conn = s.peer.conn, "MCP connection: end of input");
    }

    fn initialize(&self, ctx: &CallerCtx, params: &Value) -> Value {
        let asked = params
            .get("protocolVersion")
            .and_then(Value::as_str)
            .unwrap_or("");
        let version = PROTOCOL_VERSIONS
            .iter()
            .find(|v| **v == asked)
            .unwrap_or(&PROTOCOL_VERSIONS[0]);
        json!({
            "protocolVersion": version,
            "capabilities": {"tools": {"listChanged": false}},
            "serverInfo": {"name": "agentosd", "title": "agentos", "version": self.version},
            "instructions": format!(
                "Tools of agent {} through agentosd: only the tools its contract grants are listed; \
                 calls are checked, audited and may wait for operator consent.",
                ctx.id
            ),
        })
    }
}

/// Lines from this size on are parsed on the blocking pool, not on a runtime worker.
pub const PARSE_OFF_WORKER: usize = 64 * 1024;

/// Decode `line`; a large one (a tool's argument carrying a file, or a flood of them) on the
/// blocking pool, so that parsing it (milliseconds for a megabyte) does not hold one of the few
/// runtime workers that every other agent's session is waiting for: the kernel then shares the
/// CPU between the parse and the other sessions instead of queueing them behind it.
/// Its CPU is the agent's (ipc/cpu.rs), like the session's own polls.
async fn parse_off_worker(
    line: Vec<u8>,
    cpu: impl FnOnce() -> Arc<crate::ipc::cpu::AgentCpu>,
) -> Incoming {
    if line.len() < PARSE_OFF_WORKER {
        return jsonrpc::parse(&line);
    }
    let cpu = cpu();
    match tokio::task::spawn_blocking(move || {
        let _charge = cpu.measure();
        jsonrpc::parse(&line)
    })
    .await
    {
        Ok(m) => m,
        Err(e) => Incoming::Invalid {
            id: Value::Null,
            code: jsonrpc::INTERNAL_ERROR,
            message: format!("the message could not be parsed: {e}"),
        },
    }
}

pub(crate) fn split_id(id: &str) -> (&str, &str) {
    id.split_once('/').unwrap_or(("", id))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One connection's state.
struct Session {
    svc: Arc<McpService>,
    ctx: Arc<CallerCtx>,
    peer: Peer,
    tx: Outbox,
    permits: Arc<Semaphore>,
    /// Request id (as text) → its cancel switch.
    in_flight: Arc<Mutex<HashMap<String, oneshot::Sender<()>>>>,
}

impl Session {
    async fn reply(&self, line: Vec<u8>) {
        // A closed connection ends the read loop too; nothing to do here.
        let _ = self.tx.send(line).await;
    }

    fn notification(&self, method: &str, params: &Value) {
        if method == "notifications/cancelled" {
            let key = params.get("requestId").map(jsonrpc::id_key);
            if let Some(cancel) = key.and_then(|k| lock(&self.in_flight).remove(&k)) {
                let _ = cancel.send(());
            }
        }
        // notifications/initialized and anything else: nothing to answer.
    }

    async fn request(&self, id: Value, method: String, params: Value) {
        if !matches!(method.as_str(), "tools/list" | "tools/call") {
            let msg = format!(
                "method \"{}\" is not served: agentosd offers tools (tools/list, tools/call) and ping",
                jsonrpc::quote(&method)
            );
            self.reply(jsonrpc::error(
                &id,
                jsonrpc::METHOD_NOT_FOUND,
                &msg,
                Value::Null,
            ))
            .await;
            return;
        }
        // While storage is low, the agents that made the daemon write the most are refused
        // first (their refusals are counted in a summary record, not recorded one by one).
        if method == "tools/call"
            && let Some(why) = self
                .svc
                .audit()
                .and_then(|t| t.storage())
                .and_then(|s| s.refuse_request(&self.ctx.id))
        {
            self.reply(jsonrpc::error(
                &id,
                jsonrpc::UNAVAILABLE,
                &why,
                json!({"reason": "storage-low"}),
            ))
            .await;
            return;
        }
        let Ok(permit) = self.permits.clone().try_acquire_owned() else {
            let msg = format!(
                "too many calls in flight on this connection (limit {}); wait for answers",
                self.svc.limits.max_in_flight
            );
            self.reply(jsonrpc::error(
                &id,
                jsonrpc::TOO_MANY_CALLS,
                &msg,
                Value::Null,
            ))
            .await;
            return;
        };
        // The bound per agent, over all its connections: each call may run a process in the
        // agent's cgroup, and a second connection must not double what one may have.
        let agent_permit = if method == "tools/call" {
            let Some(p) = self.svc.agent_call_permit(&self.ctx.id) else {
                let limit = self.svc.limits.max_calls_per_agent;
                let msg = format!(
                    "agent {} has {limit} tool calls in flight across its connections (the limit \
                     per agent); wait for answers",
                    self.ctx.id
                );
                self.reply(jsonrpc::error(
                    &id,
                    jsonrpc::TOO_MANY_CALLS,
                    &msg,
                    json!({"scope": "agent", "limit": limit}),
                ))
                .await;
                return;
            };
            Some(p)
        } else {
            None
        };
        let key = jsonrpc::id_key(&id);
        let (cancel_tx, cancel_rx) = oneshot::channel();
        let duplicate = {
            let mut f = lock(&self.in_flight);
            let dup = f.contains_key(&key);
            if !dup {
                f.insert(key.clone(), cancel_tx);
            }
            dup
        };
        if duplicate {
            self.reply(jsonrpc::error(
                &id,
                jsonrpc::INVALID_REQUEST,
                &format!(
                    "request id {} is already in flight on this connection",
                    jsonrpc::id_text(&id)
                ),
                Value::Null,
            ))
            .await;
            return;
        }
        let svc = self.svc.clone();
        let ctx = self.ctx.clone();
        let tx = self.tx.clone();
        let in_flight = self.in_flight.clone();
        let cpu = self.svc.limits.cpu.agent(&self.peer.agent);
        tokio::spawn(crate::ipc::cpu::Measured::new(
            async move {
                let reply = match method.as_str() {
                    "tools/list" => Some(svc.list(&ctx, &id).await),
                    _ => svc.call(&ctx, &id, &params, cancel_rx).await,
                };
                // A cancelled request is not answered (MCP: the receiver should not respond).
                let still = lock(&in_flight).remove(&key).is_some();
                if let Some(r) = reply
                    && still
                {
                    let _ = tx.send(r).await;
                }
                drop(agent_permit);
                drop(permit);
            },
            cpu,
        ));
    }
}

impl McpService {
    async fn list(&self, ctx: &CallerCtx, id: &Value) -> Vec<u8> {
        let tools = self.tools();
        // Each server's start is bounded by its own startup timeout; the listing by the longest
        // of them plus LIST_TIMEOUT for the answers.
        let budget = LIST_TIMEOUT + tools.longest_startup(&ctx.caller);
        let Ok(listed) = tokio::time::timeout(budget, tools.list(&ctx.caller)).await else {
            return jsonrpc::error(
                id,
                jsonrpc::INTERNAL_ERROR,
                &format!(
                    "listing the tools took longer than {} s (a tool server did not answer; see the daemon's journal)",
                    budget.as_secs()
                ),
                Value::Null,
            );
        };
        let tools: Vec<Value> = listed
            .into_iter()
            .filter(|t| decide(&ctx.policy, Some(&t.capability)).is_ok())
            .map(|t| {
                let mut v = json!({
                    "name": t.name,
                    "description": t.description,
                    "inputSchema": t.input_schema,
                });
                if let Some(o) = t.output_schema {
                    v["outputSchema"] = o;
                }
                v
            })
            .collect();
        jsonrpc::result(id, json!({"tools": tools}))
    }
}

/// Arguments and results kept in an audit record at most this large (serialised); larger ones
/// are replaced by their size and SHA-256 (a record is at most 64 KiB, and a tool's input may
/// be megabytes).
pub const AUDIT_VALUE_MAX: usize = 8 * 1024;

/// `v` itself when small, else `{"omitted": …, "bytes": N, "sha256": HEX}`.
pub fn bounded(v: Value, max: usize) -> Value {
    let text = v.to_string();
    if text.len() <= max {
        return v;
    }
    use sha2::Digest;
    json!({
        "omitted": format!("{} bytes, over the {} byte limit for audit records", text.len(), max),
        "bytes": text.len(),
        "sha256": hex::encode(sha2::Sha256::digest(text.as_bytes())),
    })
}

/// How long a tools/list may take, beyond the longest startup timeout of the caller's MCP
/// servers, before the session gives up on a slow tool server.
pub const LIST_TIMEOUT: Duration = Duration::from_secs(30);

#[cfg(test)]
mod tests;
