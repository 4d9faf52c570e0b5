//! The model gateway: agents reach models only through the daemon. Each agent gets an
//! OpenAI-compatible HTTP endpoint on its own Unix socket (`RUN_DIR/agents/<tenant>/<name>.models.sock`,
//! owned by the agent's uid, mode 0600; every connection identified by the kernel as the MCP
//! socket's are, see `ipc::peer`), named in its environment as `AGENTOS_MODELS_SOCKET`. The
//! daemon decides each call against the agent's contract (access.rs), its token budgets and its
//! tenant's (budget.rs), forwards it to the backend that serves the model with a key only the
//! daemon holds (config.rs, upstream.rs), and records it (http.rs). Without a network grant the
//! agent has no other way to a model server: its network namespace has no route out, and the
//! cgroup BPF policy refuses every address it was not granted.

// The `Err` of the call steps is the answer to send (a `Response`, ~150 bytes), made at most once
// per request: boxing it would only add an allocation.
#![allow(clippy::result_large_err)]

pub mod access;
pub mod budget;
pub mod config;
pub mod http;
mod peer_tcp;
pub mod rate;
mod serve;
pub mod tcp;
pub mod tls;
mod trace;
pub mod upstream;

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use audit::{Decision, Kind};
use hyper::{Response, StatusCode};
use serde_json::{Value, json};

use crate::audit_trail::AuditTrail;
use crate::ipc::AgentRef;
use crate::mcp::consent::{Answer, Consents};
pub use access::Access;
use budget::{Meter, Reservation};
use config::ModelEntry;
pub use config::ModelsConfig;
use http::{Call, error};
use upstream::{AnswerBody, Outcome};

/// Model calls of one agent in flight at once.
pub const MAX_INFLIGHT_PER_AGENT: usize = 4;
/// Connections one agent may hold open on its model socket.
pub const MAX_CONNS_PER_AGENT: usize = 16;
/// The environment variable naming the agent's model socket.
pub const SOCKET_ENV: &str = "AGENTOS_MODELS_SOCKET";

/// Figures of one agent's model use (for `agentctl status`, D-Bus and metrics).
#[derive(Debug, Default)]
pub struct Stats {
    calls: AtomicU64,
    refused: AtomicU64,
    errors: AtomicU64,
    prompt_tokens: AtomicU64,
    completion_tokens: AtomicU64,
    /// Of the last answer: ms to the first token, and tokens per second after it (×1000).
    last_ttft_us: AtomicU64,
    last_tps_milli: AtomicU64,
}

impl Stats {
    fn refused(&self) {
        self.refused.fetch_add(1, Ordering::Relaxed);
    }
}

/// One agent as the gateway serves it.
pub struct AgentModels {
    pub id: String,
    pub tenant: String,
    pub name: String,
    pub access: Access,
    pub binding: Option<String>,
    /// The agent's budgets, kept across its runs (and re-adoptions) under this daemon.
    meter: Arc<Meter>,
    tenant_meter: Arc<Meter>,
    inflight: Arc<tokio::sync::Semaphore>,
    stats: Arc<Stats>,
    /// What the daemon reads from it a second over all its gateway connections (rate.rs).
    rate: rate::AgentRate,
}

/// An agent's budget and figures.
type Usage = (Arc<Meter>, Arc<Stats>);

/// What `agentctl status` shows of an agent's model use.
pub use agentos_api::ModelUsage;

/// The gateway: its configuration, the agents it serves, and their budgets.
pub struct Gateway {
    cfg: ModelsConfig,
    audit: Option<Arc<AuditTrail>>,
    consents: Mutex<Option<Arc<Consents>>>,
    /// By agent id: budgets and figures outlive a run, so a restart does not refill a budget.
    meters: Mutex<HashMap<String, Usage>>,
    tenants: Mutex<HashMap<String, Arc<Meter>>>,
    /// The agents served, by id: their state and the tasks accepting their connections.
    serving: Mutex<HashMap<String, serve::Serving>>,
    backend_slots: Vec<Arc<tokio::sync::Semaphore>>,
    /// Where the tokens used are kept across daemon restarts, and what it held at start.
    ledger_path: Option<PathBuf>,
    ledger: budget::Ledger,
    dirty: std::sync::atomic::AtomicBool,
    telemetry: Arc<crate::telemetry::Telemetry>,
    /// Agents in the host's network namespace: their port on the host's loopback (kept in
    /// `STATE_DIR/models/ports.json`, so a re-adopted agent's `OPENAI_BASE_URL` still holds),
    /// and the listener made for a run that has not started serving yet.
    host_ports: Mutex<HostPorts>,
    /// Connections refused at the agents' model sockets and ports: a record each within the
    /// denial records' default rate per agent, the rest counted ([`Gateway::report_refusals`]).
    refusals: Mutex<crate::enforce::limit::RecordLimiter>,
    /// Bytes a second per agent over its gateway connections (`--ipc-agent-rate`; 0: none).
    agent_rate: std::sync::atomic::AtomicU64,
    /// The agents' CPU accounts ([`Gateway::set_cpu_ledger`]).
    cpu: Mutex<Arc<crate::ipc::cpu::CpuLedger>>,
}

/// See [`Gateway::host_port`].
#[derive(Default)]
struct HostPorts {
    path: Option<PathBuf>,
    ports: std::collections::BTreeMap<String, u16>,
    pending: HashMap<String, std::net::TcpListener>,
}

impl Gateway {
    /// The gateway; `state_dir`: keep the tokens used in `STATE_DIR/models/usage.json` (read
    /// back here) so budgets hold across daemon restarts.
    pub fn new(
        cfg: ModelsConfig,
        audit: Option<Arc<AuditTrail>>,
        state_dir: Option<&std::path::Path>,
        telemetry: Arc<crate::telemetry::Telemetry>,
    ) -> Arc<Gateway> {
        let backend_slots = cfg
            .backends
            .iter()
            .map(|b| Arc::new(tokio::sync::Semaphore::new(b.max_concurrent)))
            .collect();
        let ledger_path = state_dir.map(|d| d.join("models/usage.json"));
        let ledger = ledger_path
            .as_deref()
            .map(budget::Ledger::load)
            .unwrap_or_default();
        let ports_path = state_dir.map(|d| d.join("models/ports.json"));
        let ports = ports_path
            .as_deref()
            .and_then(|p| std::fs::read(p).ok())
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        Arc::new(Gateway {
            cfg,
            audit,
            consents: Mutex::new(None),
            meters: Mutex::default(),
            tenants: Mutex::default(),
            serving: Mutex::default(),
            backend_slots,
            ledger_path,
            ledger,
            dirty: Default::default(),
            telemetry,
            host_ports: Mutex::new(HostPorts {
                path: ports_path,
                ports,
                pending: HashMap::new(),
            }),
            refusals: Mutex::new(crate::enforce::limit::RecordLimiter::new(Default::default())),
            agent_rate: crate::ipc::rate::DEFAULT_AGENT_RATE.into(),
            cpu: Mutex::default(),
        })
    }

    /// The agents' CPU accounts for agents served from now on: the MCP sockets' (one share per
    /// agent over both routes, ipc/cpu.rs).
    pub fn set_cpu_ledger(&self, ledger: Arc<crate::ipc::cpu::CpuLedger>) {
        *lock(&self.cpu) = ledger;
    }

    fn cpu_ledger(&self) -> Arc<crate::ipc::cpu::CpuLedger> {
        lock(&self.cpu).clone()
    }

    /// The per-agent rate for agents served from now on (`--ipc-agent-rate`: the same figure
    /// as on the MCP socket, a bucket of its own; 0: none).
    pub fn set_agent_rate(&self, rate: u64) {
        self.agent_rate
            .store(rate, std::sync::atomic::Ordering::Relaxed);
    }

    /// A connection refused at `agent`'s model socket or port: the log line and a
    /// `socket-refused` record with `detail`, if the rate allows; else counted for the next
    /// summary (a local process hammering the port must not fill the audit file system).
    pub(crate) fn refused_conn(&self, agent: &AgentModels, log: &str, detail: serde_json::Value) {
        let now = std::time::Instant::now();
        if !lock(&self.refusals).admit(&agent.id, "socket-refused", now) {
            return;
        }
        tracing::warn!("{}: {log}", agent.id);
        if let Some(t) = &self.audit {
            t.submit_or_count(
                t.agent_record(audit::Kind::Gate, &agent.tenant, &agent.name)
                    .decision(audit::Decision::Deny)
                    .detail(detail),
            );
        }
    }

    /// Every 2 s, one `socket-events-suppressed` record per agent whose refused connections
    /// were over the rate (spawned by the daemon).
    pub async fn report_refusals(self: Arc<Self>) {
        loop {
            tokio::time::sleep(std::time::Duration::from_secs(2)).await;
            let summaries = lock(&self.refusals).summaries(std::time::Instant::now());
            for s in summaries {
                tracing::warn!(
                    "{}: {} more connection(s) refused at its model socket or port in {} ms: counted, not recorded one by one",
                    s.agent,
                    s.suppressed,
                    s.window.as_millis()
                );
                let Some(t) = &self.audit else { continue };
                let (tenant, name) = s.agent.split_once('/').unwrap_or(("", &s.agent));
                t.submit_or_count(
                    t.agent_record(audit::Kind::Gate, tenant, name)
                        .decision(audit::Decision::Deny)
                        .detail(serde_json::json!({
                            "event": "socket-events-suppressed",
                            "socket": "models",
                            "count": s.suppressed,
                            "by": s.by,
                            "window_ms": s.window.as_millis() as u64,
                            "agent": s.agent,
                        })),
                );
            }
        }
    }

    /// Writes the tokens used when they changed, every [`budget::Ledger::EVERY`] (spawned by
    /// the daemon; [`Gateway::save`] again at shutdown).
    pub async fn keep_ledger(self: Arc<Self>) {
        loop {
            tokio::time::sleep(budget::Ledger::EVERY).await;
            self.save();
        }
    }

    /// Writes the ledger now if anything changed since the last write.
    pub fn save(&self) {
        let Some(path) = &self.ledger_path else {
            return;
        };
        if !self.dirty.swap(false, Ordering::AcqRel) {
            return;
        }
        let mut l = budget::Ledger {
            agents: self.ledger.agents.clone(),
            tenants: self.ledger.tenants.clone(),
        };
        for (id, (m, _)) in lock(&self.meters).iter() {
            l.agents.insert(id.clone(), m.used());
        }
        for (t, m) in lock(&self.tenants).iter() {
            l.tenants.insert(t.clone(), m.used());
        }
        let text = serde_json::to_vec_pretty(&l).unwrap_or_default();
        if let Err(e) = crate::state::write_atomic(path, &text) {
            tracing::warn!("model budgets: {e}");
            self.dirty.store(true, Ordering::Release);
        }
    }

    /// Consent requests for models go where the tools' go (`agentctl consent`).
    pub fn set_consents(&self, c: Arc<Consents>) {
        *lock(&self.consents) = Some(c);
    }

    /// Serve `agent` (already identified by `who`) on the listening socket `fd`.
    pub fn serve(
        self: &Arc<Self>,
        who: AgentRef,
        tenant: &str,
        name: &str,
        access: Access,
        binding: Option<String>,
        fd: OwnedFd,
    ) -> std::io::Result<()> {
        let std_listener = std::os::unix::net::UnixListener::from(fd);
        std_listener.set_nonblocking(true)?;
        let listener = tokio::net::UnixListener::from_std(std_listener)?;
        // The budget follows the contract of this run; what was used stays used (across the
        // agent's runs, and across daemon restarts through the ledger).
        let (meter, stats) = {
            let mut meters = lock(&self.meters);
            let (used, stats) = match meters.get(&who.id) {
                Some((m, s)) => (m.used(), s.clone()),
                None => (
                    self.ledger.agents.get(&who.id).copied().unwrap_or(0),
                    Arc::default(),
                ),
            };
            let meter = Arc::new(Meter::with_used(
                access.tokens,
                access.tokens_per_minute,
                used,
            ));
            meters.insert(who.id.clone(), (meter.clone(), stats.clone()));
            (meter, stats)
        };
        let tenant_meter = lock(&self.tenants)
            .entry(tenant.to_string())
            .or_insert_with(|| {
                let b = self.cfg.tenants.get(tenant).copied().unwrap_or_default();
                let used = self.ledger.tenants.get(tenant).copied().unwrap_or(0);
                Arc::new(Meter::with_used(b.tokens, b.tokens_per_minute, used))
            })
            .clone();
        let agent = Arc::new(AgentModels {
            id: who.id.clone(),
            tenant: tenant.into(),
            name: name.into(),
            access,
            binding,
            meter,
            tenant_meter,
            inflight: Arc::new(tokio::sync::Semaphore::new(MAX_INFLIGHT_PER_AGENT)),
            stats,
            rate: rate::AgentRate::new(self.agent_rate.load(std::sync::atomic::Ordering::Relaxed))
                .with_cpu(self.cpu_ledger().agent(&who.id)),
        });
        let conns = Arc::new(tokio::sync::Semaphore::new(MAX_CONNS_PER_AGENT));
        // Accepting and identifying the agent's peers is its CPU (ipc/cpu.rs).
        let task = tokio::spawn(crate::ipc::cpu::Measured::new(
            serve::accept_unix(
                self.clone(),
                agent.clone(),
                conns.clone(),
                who.clone(),
                listener,
            ),
            self.cpu_ledger().agent(&who.id),
        ));
        let old = lock(&self.serving).insert(
            who.id,
            serve::Serving {
                agent,
                conns,
                tasks: vec![task.abort_handle()],
            },
        );
        if let Some(old) = old {
            old.abort();
        }
        Ok(())
    }

    /// Also serve `agent_id` (served already, see [`Gateway::serve`]) on `listener`, the
    /// loopback port in its own network namespace (tcp.rs): every peer there is the agent.
    pub fn serve_tcp(
        self: &Arc<Self>,
        agent_id: &str,
        listener: std::net::TcpListener,
    ) -> std::io::Result<()> {
        self.add_port(agent_id, listener, None)
    }

    /// Serves `agent_id` (on its socket already) on `listener` too (serve.rs `accept_tcp`).
    fn add_port(
        self: &Arc<Self>,
        agent_id: &str,
        listener: std::net::TcpListener,
        peers_from: Option<PathBuf>,
    ) -> std::io::Result<()> {
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let mut serving = lock(&self.serving);
        let s = serving.get_mut(agent_id).ok_or_else(|| {
            std::io::Error::other(format!("{agent_id} has no model socket to add a port to"))
        })?;
        let task = tokio::spawn(crate::ipc::cpu::Measured::new(
            serve::accept_tcp(
                self.clone(),
                s.agent.clone(),
                s.conns.clone(),
                listener,
                peers_from,
            ),
            self.cpu_ledger().agent(agent_id),
        ));
        s.tasks.push(task.abort_handle());
        Ok(())
    }

    /// Stop serving `agent_id` (its socket and port close; calls in flight end with their
    /// connections).
    pub fn forget(&self, agent_id: &str) {
        if let Some(s) = lock(&self.serving).remove(agent_id) {
            s.abort();
        }
        lock(&self.host_ports).pending.remove(agent_id);
    }

    /// The port of `agent_id` on the host's loopback (an agent with network grants, in the
    /// host's network namespace): bound now if it is not, the same port as before when it is
    /// free (a re-adopted agent's `OPENAI_BASE_URL` names it), else a new one. The listener
    /// waits for [`Gateway::serve_host_port`].
    pub fn host_port(&self, agent_id: &str) -> std::io::Result<u16> {
        let mut hp = lock(&self.host_ports);
        if let Some(l) = hp.pending.get(agent_id) {
            return Ok(l.local_addr()?.port());
        }
        let before = hp.ports.get(agent_id).copied();
        let l = before
            .and_then(|p| std::net::TcpListener::bind(("127.0.0.1", p)).ok())
            .map_or_else(|| std::net::TcpListener::bind(("127.0.0.1", 0)), Ok)?;
        l.set_nonblocking(true)?;
        let port = l.local_addr()?.port();
        hp.pending.insert(agent_id.to_string(), l);
        if before != Some(port) {
            hp.ports.insert(agent_id.to_string(), port);
            if let Some(p) = &hp.path
                && let Err(e) = crate::state::write_atomic(
                    p,
                    &serde_json::to_vec_pretty(&hp.ports).unwrap_or_default(),
                )
            {
                tracing::warn!("model ports: {e}");
            }
        }
        Ok(port)
    }

    /// Serve `agent_id` (served already on its socket) on its host loopback port
    /// ([`Gateway::host_port`]); each peer must be a socket made in `cgroup_dir` or below.
    pub fn serve_host_port(
        self: &Arc<Self>,
        agent_id: &str,
        cgroup_dir: PathBuf,
    ) -> std::io::Result<u16> {
        let l = lock(&self.host_ports)
            .pending
            .remove(agent_id)
            .ok_or_else(|| std::io::Error::other("no port was bound for it"))?;
        let port = l.local_addr()?.port();
        self.add_port(agent_id, l, Some(cgroup_dir))?;
        Ok(port)
    }

    /// The agent's model use so far, `None` when it never had a model socket.
    pub fn usage(&self, agent_id: &str) -> Option<ModelUsage> {
        let (m, s) = lock(&self.meters).get(agent_id).cloned()?;
        let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Some(ModelUsage {
            calls: ld(&s.calls),
            refused: ld(&s.refused),
            errors: ld(&s.errors),
            prompt_tokens: ld(&s.prompt_tokens),
            completion_tokens: ld(&s.completion_tokens),
            tokens_left: m.total().map(|t| t.saturating_sub(m.used())),
            tokens_per_minute: m.per_minute(),
            last_first_token_us: ld(&s.last_ttft_us),
            last_tokens_per_sec_milli: ld(&s.last_tps_milli),
        })
    }

    async fn backend_slot(&self, backend: usize) -> Option<tokio::sync::OwnedSemaphorePermit> {
        self.backend_slots
            .get(backend)?
            .clone()
            .acquire_owned()
            .await
            .ok()
    }

    /// Holds the call for an operator's answer when the contract names the model in
    /// `security.consent_for`.
    async fn consent(
        &self,
        agent: &AgentModels,
        call: &Call,
        model: &str,
    ) -> Result<(), Response<AnswerBody>> {
        if !agent.access.needs_consent(model) {
            return Ok(());
        }
        let what = format!("model:{model}");
        let consents = lock(&self.consents).clone();
        let refuse = |msg: String| {
            error(
                StatusCode::FORBIDDEN,
                "permission_error",
                "consent_refused",
                &msg,
            )
        };
        let Some(consents) = consents else {
            self.refused(agent, call, "no consent service", "consent-unavailable");
            return Err(refuse(format!(
                "calls of {model} need an operator's consent, and this daemon has no consent \
                 service (it serves no tools)"
            )));
        };
        let summary = call.base(model);
        let (req, rx) = match consents.ask(&agent.id, &what, &what, summary.clone()) {
            Ok(x) => x,
            Err(e) => {
                self.refused(agent, call, &e.to_string(), "too-many-pending-consents");
                return Err(refuse(e.to_string()));
            }
        };
        if let Some(t) = &self.audit {
            let mut d = summary.clone();
            d["consent_id"] = json!(req.id);
            let rec = t
                .agent_record(Kind::Gate, &agent.tenant, &agent.name)
                .decision(Decision::Held)
                .detail(d);
            if t.commit(rec).await.is_err() {
                return Err(unavailable());
            }
        }
        let since = std::time::SystemTime::now();
        let answer = consents.wait(req.id, rx).await;
        let (decision, word) = match &answer {
            Answer::Approved { .. } => (Decision::Allow, "approved"),
            Answer::Denied { .. } => (Decision::Deny, "denied"),
            Answer::Expired => (Decision::Deny, "expired"),
            Answer::Withdrawn => (Decision::Deny, "withdrawn"),
        };
        self.trace_consent(call, model, since, word);
        if let Some(t) = &self.audit {
            let mut d = summary;
            d["consent_id"] = json!(req.id);
            d["answer"] = json!(word);
            if let Answer::Approved { by_uid } | Answer::Denied { by_uid } = answer {
                d["by_uid"] = json!(by_uid);
            }
            let rec = t
                .agent_record(Kind::Consent, &agent.tenant, &agent.name)
                .decision(decision)
                .detail(d);
            if t.commit(rec).await.is_err() {
                return Err(unavailable());
            }
        }
        if decision == Decision::Allow {
            Ok(())
        } else {
            agent.stats.refused();
            Err(refuse(format!(
                "the operator's consent for {model} was not given ({word})"
            )))
        }
    }

    /// The durable allow record before anything is sent (fail closed when it cannot be written).
    async fn commit_allow(
        &self,
        agent: &AgentModels,
        call: &Call,
        entry: &ModelEntry,
        fallback: Option<&(String, &'static str)>,
    ) -> Result<(), Response<AnswerBody>> {
        let reason = match fallback {
            Some((_, when)) => format!("fallback-{when}"),
            None => "granted".to_string(),
        };
        self.trace_gate(call, &entry.name, "allow", &reason);
        let Some(t) = &self.audit else { return Ok(()) };
        let mut d = self.detail(call, entry, fallback);
        d["max_tokens"] = call
            .body
            .get("max_tokens")
            .or_else(|| call.body.get("max_completion_tokens"))
            .cloned()
            .unwrap_or(Value::Null);
        let rec = t
            .agent_record(Kind::Gate, &agent.tenant, &agent.name)
            .decision(Decision::Allow)
            .detail(d);
        t.commit(rec).await.map(|_| ()).map_err(|_| unavailable())
    }

    fn detail(
        &self,
        call: &Call,
        entry: &ModelEntry,
        fallback: Option<&(String, &'static str)>,
    ) -> Value {
        let b = &self.cfg.backends[entry.backend];
        let mut d = call.base(&entry.name);
        d["backend"] = json!(b.name);
        d["placement"] = json!(b.placement.as_str());
        if let Some((from, when)) = fallback {
            d["fallback"] = json!({"from": from, "to": entry.name, "when": when});
        }
        d
    }

    /// Settles the budgets with what the call used.
    fn account(&self, agent: &AgentModels, call: &Call, out: &Outcome, r: [Reservation; 2]) {
        let (p, c) = used(call, out);
        agent.meter.settle(r[0], p + c);
        agent.tenant_meter.settle(r[1], p + c);
        if p + c > 0 {
            self.dirty.store(true, Ordering::Release);
        }
        let s = &agent.stats;
        s.calls.fetch_add(1, Ordering::Relaxed);
        if out.status >= 400 || out.cut.is_some() {
            s.errors.fetch_add(1, Ordering::Relaxed);
        }
        s.prompt_tokens.fetch_add(p, Ordering::Relaxed);
        s.completion_tokens.fetch_add(c, Ordering::Relaxed);
        if let Some(ft) = out.first_token {
            s.last_ttft_us
                .store(ft.as_micros() as u64, Ordering::Relaxed);
            let generating = out.duration.saturating_sub(ft);
            if c > 1 && generating > Duration::from_millis(1) {
                let tps = (c - 1) as f64 / generating.as_secs_f64();
                s.last_tps_milli
                    .store((tps * 1000.0) as u64, Ordering::Relaxed);
            }
        }
    }

    /// The record of how the call ended.
    fn finish(
        &self,
        agent: &AgentModels,
        call: &Call,
        entry: &ModelEntry,
        fallback: Option<&(String, &'static str)>,
        out: &Outcome,
    ) {
        let (p, c) = used(call, out);
        self.trace_call(
            call,
            &entry.name,
            &self.cfg.backends[entry.backend].name,
            out,
            (p, c),
        );
        let Some(t) = &self.audit else { return };
        let mut d = self.detail(call, entry, fallback);
        d["status"] = json!(out.status);
        d["outcome"] = json!(match (&out.cut, out.status) {
            (None, s) if s < 400 => "ok",
            (Some(_), s) if s < 400 => "cut",
            _ => "error",
        });
        if let Some(why) = &out.cut {
            d["error"] = json!(why);
        }
        d["prompt_tokens"] = json!(p);
        d["completion_tokens"] = json!(c);
        d["usage_from"] = json!(if out.prompt_tokens.is_some() {
            "backend"
        } else {
            "gateway estimate"
        });
        d["onset_unix_ms"] = json!(
            call.onset
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0)
        );
        d["first_token_ms"] = json!(out.first_token.map(|f| f.as_secs_f64() * 1000.0));
        d["duration_ms"] = json!(out.duration.as_secs_f64() * 1000.0);
        d["completion_sha256"] = json!(out.completion_sha256);
        if let Some(p) = &call.prompt {
            d["prompt"] = json!(p);
        }
        if let Some(c) = &out.completion {
            d["completion"] = json!(c);
        }
        if let Some(b) = &agent.binding {
            d["binding"] = json!(b);
        }
        let decision = if out.status < 400 && out.cut.is_none() {
            Decision::Allow
        } else {
            Decision::Deny
        };
        t.submit(
            t.agent_record(Kind::Model, &agent.tenant, &agent.name)
                .decision(decision)
                .detail(d),
        );
    }
}

/// `(prompt, completion)` tokens: the backend's usage, else the gateway's count.
fn used(call: &Call, out: &Outcome) -> (u64, u64) {
    let p = out.prompt_tokens.unwrap_or(if out.status < 400 {
        call.prompt_estimate
    } else {
        0
    });
    let c = out.completion_tokens.unwrap_or(out.chunks);
    (p, c)
}

fn unavailable() -> Response<AnswerBody> {
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        "api_error",
        "audit_unavailable",
        "the audit trail cannot record this call, so it is refused (agentosd check)",
    )
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Where an agent's model socket lives.
pub fn socket_path(run_dir: &std::path::Path, tenant: &str, name: &str) -> PathBuf {
    run_dir
        .join("agents")
        .join(tenant)
        .join(format!("{name}.models.sock"))
}
