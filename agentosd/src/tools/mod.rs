//! Tools: manifests in `/etc/agentos/tools.d`, schema checks, sandboxed runners (issue 8).
//!
//! - [`Tools::load`] reads every `*.yaml` manifest (contracts::tool), compiles its schemas and
//!   reports each broken file as `FILE:LINE:COL: message` without refusing the others.
//! - [`Tools::list`] / [`Tools::call`] serve one calling agent ([`Caller`]): only tools whose
//!   capability its contract grants; arguments are checked against the schema before anything
//!   runs; every tool process runs as the caller's uid, in its own cgroup in the caller's
//!   subtree (`<root>/agents/<tenant>/<name>/tools/<id>`, so it counts against the agent's
//!   budgets), with the manifest's needs intersected with the caller's grants.
//! - [`Tools::redact`] hides secrets in arguments and results for the audit record.
//!
//! See docs/tools.md.

pub mod exec;
pub mod mcp;
pub mod proc;
pub mod schema;
pub mod scope;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use contracts::tool::{Risk, ToolDurability, ToolKind, ToolManifest};
use serde_json::Value;

use crate::cgroup::Cgroup;
use crate::sandbox::Grants;
use schema::Schema;

/// The agent on whose behalf a tool runs, and what its contract grants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// `tenant/name`.
    pub agent: String,
    pub tenant: String,
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    /// The agent's state directory (`{state}`).
    pub home: PathBuf,
    /// Its filesystem and network grants (`{state}` expanded).
    pub grants: Grants,
    /// Every capability it is granted → its scope (`{state}` expanded); `security.deny`
    /// removed.
    pub tool_scopes: BTreeMap<String, Vec<String>>,
}

impl Caller {
    pub fn from_contract(c: &contracts::Contract, home: &Path, uid: u32, gid: u32) -> Caller {
        let denied = &c.security().deny;
        let tool_scopes = c
            .capabilities()
            .iter()
            .filter(|cap| !denied.contains(&cap.name))
            .map(|cap| (cap.name.clone(), cap.expand_scope(home)))
            .collect();
        Caller {
            agent: c.id(),
            tenant: c.tenant().to_string(),
            name: c.name().to_string(),
            uid,
            gid,
            home: home.to_path_buf(),
            grants: Grants::from_contract(c, home),
            tool_scopes,
        }
    }

    pub fn granted(&self, capability: &str) -> bool {
        self.tool_scopes.contains_key(capability)
    }
}

/// One tool as an agent sees it in `tools/list`.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolDesc {
    /// The MCP tool name: the manifest name for exec tools, `<manifest>.<server tool>` for
    /// proxied ones.
    pub name: String,
    /// The capability that grants it (the manifest name).
    pub capability: String,
    pub title: Option<String>,
    pub description: String,
    pub input_schema: Value,
    pub output_schema: Option<Value>,
    /// A proxied server's annotations (`readOnlyHint`, …), passed through; untrusted hints.
    pub annotations: Option<Value>,
    pub risk: Risk,
}

impl ToolDesc {
    /// The MCP `Tool` object of `tools/list`.
    pub fn to_mcp(&self) -> Value {
        let mut v = serde_json::json!({
            "name": self.name,
            "description": self.description,
            "inputSchema": self.input_schema,
        });
        if let Some(t) = &self.title {
            v["title"] = Value::String(t.clone());
        }
        if let Some(o) = &self.output_schema {
            v["outputSchema"] = o.clone();
        }
        if let Some(a) = &self.annotations {
            v["annotations"] = a.clone();
        }
        v
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolError {
    #[error("unknown tool \"{0}\"")]
    UnknownTool(String),
    #[error("tool {tool}: capability \"{capability}\" is not granted to agent {agent}")]
    NotGranted {
        tool: String,
        capability: String,
        agent: String,
    },
    #[error("tool {tool}: invalid arguments: {}", errors.join("; "))]
    InvalidArguments { tool: String, errors: Vec<String> },
    #[error("tool {tool}: timed out after {after:?} (timeout_ms in its manifest); it was killed")]
    Timeout { tool: String, after: Duration },
    #[error("tool {0}: cancelled")]
    Cancelled(String),
    #[error("tool {tool}: its result does not match its output schema: {}", errors.join("; "))]
    InvalidOutput { tool: String, errors: Vec<String> },
    /// A proxied server answered `tools/call` with a JSON-RPC error.
    #[error("tool {tool}: the server refused the call: error {code}: {message}")]
    Server {
        tool: String,
        code: i64,
        message: String,
    },
    /// Spawn or protocol failure; the message names the tool, its manifest and the cause.
    #[error("{0}")]
    Failed(String),
}

/// Where tools run.
#[derive(Debug, Clone)]
pub struct RunnerConfig {
    /// The daemon's cgroup root; a tool process of agent `t/n` goes in
    /// `<root>/agents/t/n/tools/<id>` (see [`crate::cgroup::agent_cgroup`]), which must exist:
    /// a tool runs only while its agent does.
    pub cgroup_root: Cgroup,
    /// The daemon's state directory; scratch directories go in `<state>/tools/scratch/<id>`.
    pub state_dir: PathBuf,
    /// Kernel policies keyed by cgroup id that a tool cgroup needs (the daemon's cgroup BPF
    /// network policy); `None` in library tests without BPF.
    pub hooks: Option<Arc<dyn CgroupHooks>>,
}

/// What the daemon does for a tool cgroup: the cgroup BPF programs attached to `agents/` see
/// tool processes too (they live under their agent) and refuse sockets to a cgroup id without
/// a policy; a tool gets the network its effective grants name, like the agent would.
pub trait CgroupHooks: Send + Sync + std::fmt::Debug {
    /// `cg` (empty, made for a tool of `caller`) gets its kernel policy from the tool's
    /// effective `net.connect` / `net.bind` scopes, before anything runs in it. Blocking (may
    /// resolve host names). `Err`: the tool must not run.
    fn placed(
        &self,
        caller: &Caller,
        cg: &Cgroup,
        connect: &[String],
        bind: &[String],
    ) -> Result<Vec<String>, String>;
    /// `cg` is gone or going: forget its policy.
    fn removed(&self, cg: &Cgroup);
}

/// A manifest with its compiled schemas.
#[derive(Debug)]
pub struct Loaded {
    pub manifest: ToolManifest,
    pub input: Option<Schema>,
    pub output: Option<Schema>,
}

type Slot = Arc<tokio::sync::Mutex<Option<Arc<mcp::Server>>>>;

/// The loaded tools and the running MCP servers.
pub struct Tools {
    cfg: RunnerConfig,
    /// Where the manifests were read from (empty: built from manifests in memory), and what
    /// could not be loaded from there (`agentctl tools`).
    dir: PathBuf,
    load_errors: Vec<String>,
    tools: BTreeMap<String, Loaded>,
    servers: tokio::sync::Mutex<HashMap<(String, String), Slot>>,
    seq: AtomicU64,
}

impl std::fmt::Debug for Tools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tools")
            .field("tools", &self.tools.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// A cancel signal: `Ok(())` from the sender cancels; a dropped sender never does.
fn cancel_future(
    rx: tokio::sync::oneshot::Receiver<()>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
    Box::pin(async move {
        if rx.await.is_err() {
            std::future::pending::<()>().await;
        }
    })
}

/// A cgroup/scratch-safe rendering of a name (`text.wordcount` → `text.wordcount`,
/// `t/a` → `t.a`).
fn ident(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

impl Tools {
    /// Load every `*.yaml` / `*.yml` in `dir` (sorted). Broken files are reported as
    /// `FILE:LINE:COL: message` and left out; the others load. A missing directory is no tools.
    pub fn load(dir: &Path, cfg: RunnerConfig) -> (Arc<Tools>, Vec<String>) {
        let mut errors = Vec::new();
        let mut files: Vec<PathBuf> = match std::fs::read_dir(dir) {
            Ok(rd) => rd
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
                .collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => {
                errors.push(format!(
                    "{}:0:0: cannot read the tools directory: {e}",
                    dir.display()
                ));
                Vec::new()
            }
        };
        files.sort();
        let mut manifests = Vec::new();
        for f in files {
            match contracts::tool::load_tool(&f) {
                Ok(m) => manifests.push(m),
                Err(e) => errors.extend(e.diagnostics.iter().map(ToString::to_string)),
            }
        }
        let (mut tools, more) = Tools::build(manifests, cfg);
        errors.extend(more);
        tools.dir = dir.to_path_buf();
        tools.load_errors = errors.clone();
        (Arc::new(tools), errors)
    }

    /// The same directory read again (`daemon-reload`): a new set of tools, and what could not
    /// be loaded. The running MCP servers are this set's; stop them with [`Tools::shutdown`]
    /// once the new set is in use.
    pub fn reload(&self) -> (Arc<Tools>, Vec<String>) {
        Tools::load(&self.dir, self.cfg.clone())
    }

    /// Where the manifests come from, and the files (or manifests) that did not load.
    pub fn source(&self) -> (&Path, &[String]) {
        (&self.dir, &self.load_errors)
    }

    /// Build from parsed manifests (tests, and `load`): compiles schemas and refuses duplicate
    /// or ambiguous names, reporting each refused manifest.
    pub fn from_manifests(
        manifests: Vec<ToolManifest>,
        cfg: RunnerConfig,
    ) -> (Arc<Tools>, Vec<String>) {
        let (tools, errors) = Tools::build(manifests, cfg);
        (Arc::new(tools), errors)
    }

    fn build(manifests: Vec<ToolManifest>, cfg: RunnerConfig) -> (Tools, Vec<String>) {
        let mut errors = Vec::new();
        let mut tools: BTreeMap<String, Loaded> = BTreeMap::new();
        for m in manifests {
            if let Some(prev) = tools.get(&m.name) {
                errors.push(format!(
                    "{}:1:1: tool \"{}\" is already defined in {}; rename one of them",
                    m.origin, m.name, prev.manifest.origin
                ));
                continue;
            }
            // `files` (mcp) proxies `files.*`: no other tool may be named inside that space.
            let clash = tools.values().find(|o| {
                (o.manifest.is_mcp() && m.name.starts_with(&format!("{}.", o.manifest.name)))
                    || (m.is_mcp() && o.manifest.name.starts_with(&format!("{}.", m.name)))
            });
            if let Some(o) = clash {
                errors.push(format!(
                    "{}:1:1: tool \"{}\" clashes with \"{}\" ({}): an mcp tool's tools are named <name>.<server tool>; rename one of them",
                    m.origin, m.name, o.manifest.name, o.manifest.origin
                ));
                continue;
            }
            let compile = |s: &Option<Value>, output: bool| -> Result<Option<Schema>, String> {
                match s {
                    None => Ok(None),
                    Some(v) => Schema::compile(v).map(Some).map_err(|e| {
                        let field = if output {
                            "output_schema"
                        } else {
                            "input_schema"
                        };
                        format!("{}: {field}: {e}", m.schema_position(output))
                    }),
                }
            };
            match (
                compile(&m.input_schema, false),
                compile(&m.output_schema, true),
            ) {
                (Ok(input), Ok(output)) => {
                    tools.insert(
                        m.name.clone(),
                        Loaded {
                            manifest: m,
                            input,
                            output,
                        },
                    );
                }
                (Err(e), _) | (_, Err(e)) => errors.push(e),
            }
        }
        (
            Tools {
                cfg,
                dir: PathBuf::new(),
                load_errors: Vec::new(),
                tools,
                servers: tokio::sync::Mutex::new(HashMap::new()),
                seq: AtomicU64::new(0),
            },
            errors,
        )
    }

    /// The loaded manifests, by name.
    pub fn manifests(&self) -> impl Iterator<Item = &ToolManifest> {
        self.tools.values().map(|l| &l.manifest)
    }

    /// The manifest behind an MCP tool name (exec: the name; proxied: `<manifest>.<tool>`).
    pub fn manifest_of(&self, tool_name: &str) -> Option<&ToolManifest> {
        self.resolve(tool_name).map(|(l, _)| &l.manifest)
    }

    /// The capability that grants `tool_name`, without running anything (for the gate).
    pub fn capability_of(&self, tool_name: &str) -> Option<String> {
        self.manifest_of(tool_name).map(|m| m.name.clone())
    }

    /// How durable the allow record of a call to `tool_name` must be before the tool runs.
    pub fn durability_of(&self, tool_name: &str) -> Option<ToolDurability> {
        self.manifest_of(tool_name).map(|m| m.durability)
    }

    /// The manifest and, for a proxied tool, the server's tool name.
    fn resolve(&self, tool_name: &str) -> Option<(&Loaded, Option<String>)> {
        if let Some(l) = self.tools.get(tool_name)
            && !l.manifest.is_mcp()
        {
            return Some((l, None));
        }
        // Longest manifest name that is a dotted prefix (`files.read_file` → `files`).
        let mut cut = tool_name.len();
        while let Some(i) = tool_name[..cut].rfind('.') {
            if let Some(l) = self.tools.get(&tool_name[..i])
                && l.manifest.is_mcp()
            {
                return Some((l, Some(tool_name[i + 1..].to_string())));
            }
            cut = i;
        }
        None
    }

    /// Secrets in `v` (arguments or a result of `tool_name`) replaced by
    /// `{"redacted": "sha256:<hex>"}`: the default secret keys plus the manifest's `secrets`.
    pub fn redact(&self, tool_name: &str, v: &Value) -> Value {
        let extra = self
            .manifest_of(tool_name)
            .map(|m| m.secrets.as_slice())
            .unwrap_or_default();
        contracts::tool::redact(v, extra)
    }

    /// The tools `caller` may use. MCP servers are started (in the caller's sandbox) to learn
    /// their tools; one that fails to start is left out with a warning.
    pub async fn list(&self, caller: &Caller) -> Vec<ToolDesc> {
        let granted: Vec<&Loaded> = self
            .tools
            .values()
            .filter(|l| caller.granted(&l.manifest.name))
            .collect();
        // The caller's MCP servers start together: a listing waits for the slowest server's
        // start, not for the sum of them (each is bounded by its own startup timeout).
        let started = futures_util::future::join_all(
            granted
                .iter()
                .filter(|l| l.manifest.is_mcp())
                .map(|l| self.server(l, caller)),
        )
        .await;
        let mut started = started.into_iter();
        let mut out = Vec::new();
        for l in granted {
            let m = &l.manifest;
            if !m.is_mcp() {
                out.push(ToolDesc {
                    name: m.name.clone(),
                    capability: m.name.clone(),
                    title: None,
                    description: m.description.clone(),
                    input_schema: m
                        .input_schema
                        .clone()
                        .unwrap_or_else(|| serde_json::json!({"type": "object"})),
                    output_schema: m.output_schema.clone(),
                    annotations: None,
                    risk: m.risk,
                });
                continue;
            }
            match started.next() {
                Some(Ok(s)) => out.extend(s.tools().iter().map(|t| ToolDesc {
                    name: format!("{}.{}", m.name, t.name),
                    capability: m.name.clone(),
                    title: t.title.clone(),
                    description: t.description.clone(),
                    input_schema: t.input_schema.clone(),
                    output_schema: t.output_schema.clone(),
                    annotations: t.annotations.clone(),
                    risk: m.risk,
                })),
                Some(Err(e)) => tracing::warn!("{e}"),
                None => {}
            }
        }
        out
    }

    /// The longest startup timeout (`mcp.startup_timeout_ms`) of the MCP tools granted to
    /// `caller`: what a listing may have to wait for before the servers answer.
    pub fn longest_startup(&self, caller: &Caller) -> Duration {
        self.tools
            .values()
            .filter(|l| caller.granted(&l.manifest.name))
            .filter_map(|l| match &l.manifest.kind {
                ToolKind::Mcp {
                    startup_timeout, ..
                } => Some(*startup_timeout),
                ToolKind::Exec(_) => None,
            })
            .max()
            .unwrap_or_default()
    }

    /// Call `tool_name` for `caller`. Checks, in order: the tool exists, the caller's contract
    /// grants its capability, the arguments match the schema (before anything of the call
    /// runs). Then runs it with the manifest's timeout; `cancel` (a sent `()`) stops it.
    /// Returns an MCP CallToolResult (`content`, `structuredContent`, `isError`).
    pub async fn call(
        &self,
        caller: &Caller,
        tool_name: &str,
        args: Value,
        cancel: tokio::sync::oneshot::Receiver<()>,
    ) -> Result<Value, ToolError> {
        let (l, server_tool) = self
            .resolve(tool_name)
            .ok_or_else(|| ToolError::UnknownTool(tool_name.to_string()))?;
        let m = &l.manifest;
        if !caller.granted(&m.name) {
            return Err(ToolError::NotGranted {
                tool: tool_name.to_string(),
                capability: m.name.clone(),
                agent: caller.agent.clone(),
            });
        }
        let mut cancel = cancel_future(cancel);
        let scope = caller.tool_scopes.get(&m.name).cloned().unwrap_or_default();
        match server_tool {
            None => {
                if let Some(s) = &l.input {
                    let errors = s.errors(&args);
                    if !errors.is_empty() {
                        return Err(ToolError::InvalidArguments {
                            tool: tool_name.to_string(),
                            errors,
                        });
                    }
                }
                let id = format!(
                    "call-{}-{}",
                    self.seq.fetch_add(1, Ordering::SeqCst),
                    ident(&m.name)
                );
                let place = proc::Place::new(&self.cfg, caller, id);
                exec::run(l, caller, &self.cfg, place, &args, &scope, &mut cancel).await
            }
            Some(st) => {
                self.call_mcp(l, caller, tool_name, &st, args, &mut cancel)
                    .await
            }
        }
    }

    async fn call_mcp(
        &self,
        l: &Loaded,
        caller: &Caller,
        tool_name: &str,
        st: &str,
        args: Value,
        cancel: &mut (impl std::future::Future<Output = ()> + Unpin),
    ) -> Result<Value, ToolError> {
        let m = &l.manifest;
        let srv = self.server(l, caller).await.map_err(ToolError::Failed)?;
        let t = srv
            .tools()
            .iter()
            .find(|t| t.name == st)
            .ok_or_else(|| ToolError::UnknownTool(tool_name.to_string()))?;
        let errors = t.input.errors(&args);
        if !errors.is_empty() {
            return Err(ToolError::InvalidArguments {
                tool: tool_name.to_string(),
                errors,
            });
        }
        let params = serde_json::json!({"name": st, "arguments": args});
        let res = srv.request("tools/call", params, m.timeout, cancel).await;
        let v = match res {
            Ok(v) => v,
            Err(mcp::RequestError::Timeout(_)) => {
                return Err(ToolError::Timeout {
                    tool: tool_name.to_string(),
                    after: m.timeout,
                });
            }
            Err(mcp::RequestError::Cancelled(_)) => {
                return Err(ToolError::Cancelled(tool_name.to_string()));
            }
            Err(mcp::RequestError::Rpc(code, message)) => {
                return Err(ToolError::Server {
                    tool: tool_name.to_string(),
                    code,
                    message,
                });
            }
            Err(mcp::RequestError::Gone(e)) => {
                return Err(ToolError::Failed(format!(
                    "tool {tool_name} ({}): {e}",
                    m.origin
                )));
            }
        };
        if !v.get("content").is_some_and(Value::is_array) {
            return Err(ToolError::Failed(format!(
                "tool {tool_name} ({}): the server's result has no content list",
                m.origin
            )));
        }
        let is_error = v.get("isError").and_then(Value::as_bool).unwrap_or(false);
        if let (Some(out), false) = (&t.output, is_error) {
            let errors = match v.get("structuredContent") {
                Some(sc) => out.errors(sc),
                None => vec![
                    "the tool declares an outputSchema but returned no structuredContent".into(),
                ],
            };
            if !errors.is_empty() {
                return Err(ToolError::InvalidOutput {
                    tool: tool_name.to_string(),
                    errors,
                });
            }
        }
        Ok(v)
    }

    /// The running server of `l` for `caller`, started if there is none or it died.
    async fn server(&self, l: &Loaded, caller: &Caller) -> Result<Arc<mcp::Server>, String> {
        let m = &l.manifest;
        let key = (m.name.clone(), caller.agent.clone());
        let slot = self.servers.lock().await.entry(key).or_default().clone();
        let mut g = slot.lock().await;
        if let Some(s) = g.as_ref() {
            if s.alive() {
                return Ok(s.clone());
            }
            s.stop().await;
        }
        *g = None;
        let id = format!(
            "mcp-{}-{}-{}",
            ident(&m.name),
            ident(&caller.agent),
            self.seq.fetch_add(1, Ordering::SeqCst)
        );
        let scope = caller.tool_scopes.get(&m.name).cloned().unwrap_or_default();
        let place = proc::Place::new(&self.cfg, caller, id);
        let s = mcp::start(m, caller, &self.cfg, place, &scope)
            .await
            .map_err(|e| {
                format!(
                    "tool {} ({}): mcp server for {}: {e}",
                    m.name, m.origin, caller.agent
                )
            })?;
        *g = Some(s.clone());
        Ok(s)
    }

    /// The pids of the running MCP servers of `agent` (for status and tests).
    pub async fn servers_of(&self, agent: &str) -> Vec<(String, u32)> {
        let slots: Vec<(String, Slot)> = self
            .servers
            .lock()
            .await
            .iter()
            .filter(|((_, a), _)| a == agent)
            .map(|((t, _), s)| (t.clone(), s.clone()))
            .collect();
        let mut out = Vec::new();
        for (t, s) in slots {
            if let Some(srv) = s.lock().await.as_ref()
                && srv.alive()
            {
                out.push((t, srv.pid));
            }
        }
        out
    }

    /// Stop the MCP servers started for `agent_id` (`tenant/name`).
    pub async fn forget(&self, agent_id: &str) {
        let slots: Vec<Slot> = {
            let mut map = self.servers.lock().await;
            let keys: Vec<_> = map.keys().filter(|(_, a)| a == agent_id).cloned().collect();
            keys.iter().filter_map(|k| map.remove(k)).collect()
        };
        for s in slots {
            if let Some(srv) = s.lock().await.take() {
                srv.stop().await;
            }
        }
    }

    /// Stop every MCP server.
    pub async fn shutdown(&self) {
        let slots: Vec<Slot> = self.servers.lock().await.drain().map(|(_, s)| s).collect();
        for s in slots {
            if let Some(srv) = s.lock().await.take() {
                srv.stop().await;
            }
        }
    }
}
