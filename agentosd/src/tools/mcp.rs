//! `mcp` tools: a long-running MCP stdio server per (manifest, calling agent), started lazily
//! in the caller's intersected sandbox, spoken to over its stdin/stdout (newline-delimited
//! JSON-RPC 2.0): `initialize` → `notifications/initialized` → `tools/list` → `tools/call`.
//! A server that dies is started again on the next use; `forget`/`shutdown` stop it.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use contracts::tool::{ToolKind, ToolManifest};
use serde_json::{Value, json};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::pipe;
use tokio::sync::oneshot;

use super::proc::{self, Place};
use super::schema::Schema;
use super::{Caller, RunnerConfig};
use crate::cgroup::Cgroup;

/// The protocol version the daemon asks for.
pub const PROTOCOL_VERSION: &str = "2025-06-18";
/// Most pages of `tools/list` read from one server.
const MAX_PAGES: usize = 64;
/// How long a stopping server gets after its stdin closes before `cgroup.kill`.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// One tool of a server, as listed, with its compiled schemas.
#[derive(Debug)]
pub struct ServerTool {
    pub name: String,
    pub title: Option<String>,
    pub description: String,
    pub input_schema: Value,
    pub output_schema: Option<Value>,
    pub annotations: Option<Value>,
    pub input: Schema,
    pub output: Option<Schema>,
}

type Reply = Result<Value, (i64, String)>;

/// Internal error code of a request that ended because the server went away.
const GONE: i64 = i64::MIN;

/// A running server instance.
pub struct Server {
    pub tool: String,
    pub agent: String,
    pub pid: u32,
    tools: std::sync::OnceLock<Vec<ServerTool>>,
    writer: tokio::sync::Mutex<Option<pipe::Sender>>,
    pending: Mutex<HashMap<u64, oneshot::Sender<Reply>>>,
    next_id: AtomicU64,
    alive: AtomicBool,
    exited: tokio::sync::Notify,
    stderr_tail: Arc<Mutex<Vec<u8>>>,
    cgroup: Cgroup,
    scratch: PathBuf,
    pidfd: Arc<OwnedFd>,
    pub started: Instant,
    /// The tool cgroup's kernel policy, forgotten when the server is dropped.
    _policy: proc::PolicyGuard,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("tool", &self.tool)
            .field("agent", &self.agent)
            .field("pid", &self.pid)
            .finish()
    }
}

/// Why a request got no result.
pub enum RequestError {
    Timeout(u64),
    Cancelled(u64),
    Rpc(i64, String),
    Gone(String),
}

async fn read_line_capped<R: AsyncBufRead + Unpin>(
    r: &mut R,
    buf: &mut Vec<u8>,
    max: usize,
) -> Result<bool, String> {
    buf.clear();
    loop {
        let avail = r.fill_buf().await.map_err(|e| format!("read: {e}"))?;
        if avail.is_empty() {
            return Ok(!buf.is_empty());
        }
        if let Some(i) = avail.iter().position(|b| *b == b'\n') {
            buf.extend_from_slice(&avail[..i]);
            r.consume(i + 1);
            return Ok(true);
        }
        let n = avail.len();
        buf.extend_from_slice(avail);
        r.consume(n);
        if buf.len() > max {
            return Err(format!(
                "a message is longer than limits.output ({max} bytes)"
            ));
        }
    }
}

impl Server {
    /// The server's tools (after the allow-list), as listed at start.
    pub fn tools(&self) -> &[ServerTool] {
        self.tools.get().map_or(&[], Vec::as_slice)
    }

    pub fn alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    fn stderr(&self) -> String {
        let t = self
            .stderr_tail
            .lock()
            .map(|b| b.clone())
            .unwrap_or_default();
        String::from_utf8_lossy(&t).trim().to_string()
    }

    fn fail_pending(&self, why: &str) {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        for (_, tx) in p.drain() {
            let _ = tx.send(Err((GONE, why.to_string())));
        }
    }

    async fn send(&self, msg: &Value) -> Result<(), String> {
        let mut line = msg.to_string();
        line.push('\n');
        let mut w = self.writer.lock().await;
        let Some(pipe) = w.as_mut() else {
            return Err("the server is stopping".into());
        };
        pipe.write_all(line.as_bytes())
            .await
            .map_err(|e| format!("write to the server: {e}"))
    }

    /// Send a request and wait for its response, a timeout or a cancel; on timeout and cancel
    /// the server gets `notifications/cancelled`.
    pub async fn request(
        &self,
        method: &str,
        params: Value,
        timeout: Duration,
        cancel: &mut (impl std::future::Future<Output = ()> + Unpin),
    ) -> Result<Value, RequestError> {
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let (tx, rx) = oneshot::channel();
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, tx);
        if !self.alive() {
            self.fail_pending("the server has exited");
        }
        let msg = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        if let Err(e) = self.send(&msg).await {
            self.pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&id);
            return Err(RequestError::Gone(e));
        }
        let outcome = tokio::select! {
            r = rx => match r {
                Ok(Ok(v)) => return Ok(v),
                Ok(Err((GONE, m))) => return Err(RequestError::Gone(m)),
                Ok(Err((code, m))) => return Err(RequestError::Rpc(code, m)),
                Err(_) => return Err(RequestError::Gone("the server has exited".into())),
            },
            _ = tokio::time::sleep(timeout) => RequestError::Timeout(id),
            _ = cancel => RequestError::Cancelled(id),
        };
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
        let reason = match outcome {
            RequestError::Timeout(_) => format!("timed out after {timeout:?}"),
            _ => "cancelled by the caller".to_string(),
        };
        let _ = self
            .send(
                &json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                "params": {"requestId": id, "reason": reason}}),
            )
            .await;
        Err(outcome)
    }

    /// Close stdin, give the server a moment, then kill its cgroup and remove it.
    pub async fn stop(&self) {
        self.alive.store(false, Ordering::SeqCst);
        self.writer.lock().await.take();
        let _ = tokio::time::timeout(STOP_GRACE, self.exited.notified()).await;
        proc::cleanup(&self.cgroup, &self.scratch).await;
        // Reap if it is still our child (cleanup killed it).
        let _ = tokio::time::timeout(Duration::from_secs(2), proc::wait_exit(&self.pidfd)).await;
        self.fail_pending("the server was stopped");
    }
}

fn handle_line(srv: &Server, line: &[u8], w: &tokio::sync::mpsc::UnboundedSender<Value>) {
    let Ok(msg) = serde_json::from_slice::<Value>(line) else {
        tracing::debug!(tool = %srv.tool, "ignoring a non-JSON line from the server");
        return;
    };
    let method = msg.get("method").and_then(Value::as_str);
    let id = msg.get("id").cloned();
    match (method, id) {
        (None, Some(id)) => {
            let Some(n) = id.as_u64() else { return };
            let tx = srv
                .pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&n);
            let Some(tx) = tx else { return };
            let reply = match (msg.get("result"), msg.get("error")) {
                (Some(r), _) => Ok(r.clone()),
                (None, Some(e)) => Err((
                    e.get("code").and_then(Value::as_i64).unwrap_or(-32603),
                    e.get("message")
                        .and_then(Value::as_str)
                        .unwrap_or("error without a message")
                        .to_string(),
                )),
                (None, None) => Err((-32603, "response without result or error".into())),
            };
            let _ = tx.send(reply);
        }
        (Some("ping"), Some(id)) => {
            let _ = w.send(json!({"jsonrpc": "2.0", "id": id, "result": {}}));
        }
        (Some(m), Some(id)) => {
            // Sampling, elicitation, roots: the daemon offers none of them to servers.
            let _ = w.send(json!({"jsonrpc": "2.0", "id": id,
                "error": {"code": -32601, "message": format!("agentosd does not offer {m} to tool servers")}}));
        }
        (Some(m), None) => tracing::debug!(tool = %srv.tool, "server notification {m}"),
        (None, None) => {}
    }
}

/// Start the server of `m` for `caller` and list its tools.
pub async fn start(
    m: &ToolManifest,
    caller: &Caller,
    cfg: &RunnerConfig,
    place: Place,
    scope: &[String],
) -> Result<Arc<Server>, String> {
    let ToolKind::Mcp {
        tools: allow,
        startup_timeout,
        ..
    } = &m.kind
    else {
        return Err("not an mcp tool".into());
    };
    let p = proc::launch(m, caller, cfg, &place, scope).await?;
    let stderr_tail = Arc::new(Mutex::new(Vec::new()));
    let srv = Arc::new(Server {
        tool: m.name.clone(),
        agent: caller.agent.clone(),
        pid: p.pid,
        tools: std::sync::OnceLock::new(),
        writer: tokio::sync::Mutex::new(Some(p.stdin)),
        pending: Mutex::new(HashMap::new()),
        next_id: AtomicU64::new(1),
        alive: AtomicBool::new(true),
        exited: tokio::sync::Notify::new(),
        stderr_tail: stderr_tail.clone(),
        cgroup: p.cgroup.clone(),
        scratch: p.scratch.clone(),
        pidfd: p.pidfd.clone(),
        started: Instant::now(),
        _policy: p.policy,
    });
    spawn_io(&srv, p.stdout, p.stderr, m.limits.output_bytes as usize);
    match handshake(&srv, allow.as_deref(), *startup_timeout).await {
        Ok(tools) => {
            let _ = srv.tools.set(tools);
            Ok(srv)
        }
        Err(e) => {
            let tail = srv.stderr();
            srv.stop().await;
            if tail.is_empty() {
                Err(e)
            } else {
                Err(format!("{e}; its stderr: {tail}"))
            }
        }
    }
}

/// The server's readers and writer are tasks of the agent it runs for (started from that agent's
/// call: ipc/cpu.rs `spawn_for_current`): their CPU is its, and they are polled in its turn.
fn spawn_io(srv: &Arc<Server>, stdout: pipe::Receiver, stderr: pipe::Receiver, max: usize) {
    // Replies to server requests go through a queue so the reader never waits on the writer.
    let (wtx, mut wrx) = tokio::sync::mpsc::unbounded_channel::<Value>();
    let weak = Arc::downgrade(srv);
    crate::ipc::cpu::spawn_for_current(async move {
        while let Some(v) = wrx.recv().await {
            let Some(s) = weak.upgrade() else { break };
            let _ = s.send(&v).await;
        }
    });
    let weak = Arc::downgrade(srv);
    crate::ipc::cpu::spawn_for_current(async move {
        let mut r = BufReader::new(stdout);
        let mut buf = Vec::new();
        loop {
            let res = read_line_capped(&mut r, &mut buf, max).await;
            let Some(s) = weak.upgrade() else { break };
            match res {
                Ok(true) => {
                    handle_line(&s, &buf, &wtx);
                    drop(s);
                    // A server flooding its output: the rest of its lines wait for its
                    // agent's turn, as an agent's own lines do (ipc/turns.rs).
                    crate::ipc::cpu::yield_past_turn().await;
                }
                Ok(false) => {
                    if s.alive.swap(false, Ordering::SeqCst) {
                        tracing::warn!(tool = %s.tool, agent = %s.agent, "mcp server closed its output; it is started again on next use");
                    }
                    s.fail_pending("the server closed its output (it exited or crashed)");
                    break;
                }
                Err(e) => {
                    tracing::warn!(tool = %s.tool, agent = %s.agent, "{e}; stopping the server");
                    s.alive.store(false, Ordering::SeqCst);
                    s.fail_pending(&e);
                    proc::kill(&s.cgroup);
                    break;
                }
            }
        }
    });
    let tail = srv.stderr_tail.clone();
    crate::ipc::cpu::spawn_for_current(async move {
        let mut r = stderr;
        let mut buf = [0u8; 4096];
        while let Ok(n) = r.read(&mut buf).await {
            if n == 0 {
                break;
            }
            let mut t = tail.lock().unwrap_or_else(|e| e.into_inner());
            t.extend_from_slice(&buf[..n]);
            let len = t.len();
            if len > super::exec::STDERR_TAIL {
                t.drain(..len - super::exec::STDERR_TAIL);
            }
        }
    });
    let weak = Arc::downgrade(srv);
    let pidfd = srv.pidfd.clone();
    let cg = srv.cgroup.clone();
    crate::ipc::cpu::spawn_for_current(async move {
        let st = proc::wait_exit(&pidfd).await;
        // Whatever it left behind goes with it.
        proc::kill(&cg);
        if let Some(s) = weak.upgrade() {
            if s.alive.swap(false, Ordering::SeqCst) {
                tracing::warn!(tool = %s.tool, agent = %s.agent, "mcp server exited ({}); it is started again on next use", st.describe());
            }
            s.fail_pending(&format!("the server exited ({})", st.describe()));
            s.exited.notify_waiters();
            s.exited.notify_one();
        }
    });
}

async fn handshake(
    srv: &Server,
    allow: Option<&[String]>,
    budget: Duration,
) -> Result<Vec<ServerTool>, String> {
    let deadline = Instant::now() + budget;
    let left = || deadline.saturating_duration_since(Instant::now());
    let never = std::future::pending::<()>();
    let mut never = std::pin::pin!(never);
    let why = |what: &str, e: RequestError| match e {
        RequestError::Timeout(_) => {
            format!("{what}: no answer within {budget:?} (mcp.startup_timeout_ms)")
        }
        RequestError::Cancelled(_) => format!("{what}: cancelled"),
        RequestError::Rpc(c, m) => format!("{what}: error {c}: {m}"),
        RequestError::Gone(m) => format!("{what}: {m}"),
    };
    let init = srv
        .request(
            "initialize",
            json!({
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "agentosd", "version": env!("CARGO_PKG_VERSION")}
            }),
            left(),
            &mut never,
        )
        .await
        .map_err(|e| why("initialize", e))?;
    if init
        .get("capabilities")
        .and_then(|c| c.get("tools"))
        .is_none()
    {
        return Err("initialize: the server offers no tools (capabilities.tools missing)".into());
    }
    srv.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .await?;
    let mut tools = Vec::new();
    let mut cursor: Option<Value> = None;
    for _ in 0..MAX_PAGES {
        let params = match &cursor {
            Some(c) => json!({"cursor": c}),
            None => json!({}),
        };
        let page = srv
            .request("tools/list", params, left(), &mut never)
            .await
            .map_err(|e| why("tools/list", e))?;
        for t in page
            .get("tools")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            match server_tool(t) {
                Ok(st) => {
                    if allow.is_none_or(|a| a.contains(&st.name)) {
                        tools.push(st);
                    }
                }
                Err(e) => tracing::warn!(tool = %srv.tool, "tools/list: {e}; tool left out"),
            }
        }
        cursor = page.get("nextCursor").filter(|c| !c.is_null()).cloned();
        if cursor.is_none() {
            break;
        }
    }
    Ok(tools)
}

/// Check one entry of `tools/list`; a tool whose schema does not compile is left out (its
/// arguments could not be checked).
fn server_tool(t: &Value) -> Result<ServerTool, String> {
    let name = t
        .get("name")
        .and_then(Value::as_str)
        .filter(|n| {
            !n.is_empty()
                && n.len() <= 128
                && n.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
        })
        .ok_or_else(|| {
            format!(
                "tool name {} is not usable",
                t.get("name").unwrap_or(&Value::Null)
            )
        })?
        .to_string();
    let input_schema = t
        .get("inputSchema")
        .cloned()
        .ok_or_else(|| format!("tool {name}: no inputSchema"))?;
    let input =
        Schema::compile(&input_schema).map_err(|e| format!("tool {name}: inputSchema: {e}"))?;
    let output_schema = t.get("outputSchema").cloned();
    let output = match &output_schema {
        Some(s) => Some(Schema::compile(s).map_err(|e| format!("tool {name}: outputSchema: {e}"))?),
        None => None,
    };
    Ok(ServerTool {
        title: t.get("title").and_then(Value::as_str).map(str::to_string),
        description: t
            .get("description")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        annotations: t.get("annotations").cloned(),
        name,
        input_schema,
        output_schema,
        input,
        output,
    })
}
