//! Tool manifests (`/etc/agentos/tools.d/*.yaml`): parsing and validation, the sandbox
//! intersection rule, argument templates and secret redaction. No syscalls: everything here is
//! pure; the daemon's runners live in `agentosd::tools`. See `docs/tools.md`.
//!
//! A manifest names one capability (`name`) and says how to run it: `exec` (one sandboxed
//! process per call, JSON on stdin and stdout) or `mcp` (a long-running MCP stdio server whose
//! tools are proxied as `<name>.<server tool>`).

use std::collections::BTreeSet;
use std::io::Read;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use serde::Serialize;
use serde_json::{Map, Number, Value};

use crate::capability::{self, CapabilityKind};
use crate::decode::{Dec, Fields, net_scope_error, normalize_path};
use crate::diag::{ContractError, Diagnostic, Severity, suggest};
use crate::node::{self, N, Pos, V};
use crate::units;

/// The only accepted `kind` of a tool manifest.
pub const TOOL_KIND: &str = "Tool";
/// Timeout of one call when the manifest names none (30 s).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest output (exec: stdout; mcp: one message) when the manifest names none (1 MiB).
pub const DEFAULT_OUTPUT_BYTES: u64 = 1 << 20;
/// Startup (initialize + tools/list) budget of an MCP server when the manifest names none.
pub const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(20);

/// Object keys redacted in every tool's arguments and results (compared case-insensitively,
/// with `-` read as `_`), besides the manifest's `secrets`.
pub const DEFAULT_SECRET_KEYS: &[&str] = &[
    "password",
    "passwd",
    "passphrase",
    "secret",
    "client_secret",
    "token",
    "access_token",
    "refresh_token",
    "id_token",
    "api_key",
    "apikey",
    "x_api_key",
    "authorization",
    "proxy_authorization",
    "cookie",
    "set_cookie",
    "private_key",
    "credentials",
    "session_key",
];

/// Key suffixes that are secrets too (`github_token`, `db_password`, `aws_secret`).
pub const DEFAULT_SECRET_SUFFIXES: &[&str] =
    &["_token", "_password", "_secret", "_api_key", "_apikey"];

/// How dangerous a tool is; the gate and `security.consent_for` use it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Risk {
    Low,
    #[default]
    Medium,
    High,
}

impl Risk {
    pub fn as_str(self) -> &'static str {
        match self {
            Risk::Low => "low",
            Risk::Medium => "medium",
            Risk::High => "high",
        }
    }
}

/// When a call's allow record must be on disk before the tool runs (`durability:` in the
/// manifest).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ToolDurability {
    /// Written and `fdatasync`ed before the tool runs: survives a power cut (the default).
    #[default]
    Sync,
    /// Written (`write(2)` done, in the kernel's page cache) before the tool runs, made durable
    /// by the next group commit without the call waiting: survives a crash of the daemon, not a
    /// power cut or a kernel crash.
    Written,
}

impl ToolDurability {
    pub fn as_str(self) -> &'static str {
        match self {
            ToolDurability::Sync => "sync",
            ToolDurability::Written => "written",
        }
    }
}

/// A program and how to start it. `args` may hold placeholders, expanded per caller by
/// [`expand_args`]: `{state}`, `{agent}`, `{scratch}` anywhere in an argument; `{fs.read}`,
/// `{fs.write}`, `{fs.exec}`, `{scope}` as a whole argument (one argument per entry).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
pub struct Program {
    /// Absolute path; the daemon never searches PATH.
    pub command: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
}

/// How the tool runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ToolKind {
    /// One process per call: the arguments object on stdin, the result on stdout.
    Exec(Program),
    /// A long-running MCP stdio server, one instance per calling agent.
    Mcp {
        program: Program,
        /// Server tools exposed (`None`: all of them).
        tools: Option<Vec<String>>,
        /// Budget for start, `initialize` and `tools/list`.
        startup_timeout: Duration,
    },
}

/// What the tool may touch at most. The kernel-enforced capabilities are upper bounds,
/// intersected per call with the caller's own grants ([`intersect_paths`],
/// [`intersect_net`]); `runtime` is the tool's own code (read + execute, not intersected).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
pub struct Needs {
    pub runtime: Vec<PathBuf>,
    /// Paths, possibly starting with `{state}` (the caller's state directory).
    pub fs_read: Vec<String>,
    pub fs_write: Vec<String>,
    pub fs_exec: Vec<String>,
    /// `HOST:PORT` scopes.
    pub net_connect: Vec<String>,
    pub net_bind: Vec<String>,
}

/// Resource limits of one tool process tree (its own cgroup).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Limits {
    /// Largest output in bytes (exec: stdout; mcp: one JSON-RPC line).
    pub output_bytes: u64,
    /// `memory.max` of the tool's cgroup.
    pub mem_bytes: Option<u64>,
    /// `pids.max` of the tool's cgroup.
    pub pids: Option<u64>,
    /// `mem`/`pids` are hard requirements: a call is refused where the host cannot enforce them
    /// (as an agent's `budgets.must`); false (the default): the call runs without them, with a
    /// note in its record.
    pub must: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            output_bytes: DEFAULT_OUTPUT_BYTES,
            mem_bytes: None,
            pids: None,
            must: false,
        }
    }
}

/// Where a field's value starts in the manifest file (1-based line and column).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
pub struct Location {
    pub line: usize,
    pub column: usize,
}

/// One validated tool manifest.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolManifest {
    /// The capability a contract grants to use this tool (`text.wordcount`, `files`). Exec
    /// tools are called by this name; an mcp tool's tools are `<name>.<server tool>`.
    pub name: String,
    pub description: String,
    pub risk: Risk,
    /// How durable the allow record is before the tool runs (default `sync`, whatever the risk).
    pub durability: ToolDurability,
    /// Limit of one call.
    pub timeout: Duration,
    pub kind: ToolKind,
    /// JSON Schema of the arguments (exec tools; mcp servers describe their own tools).
    pub input_schema: Option<Value>,
    /// JSON Schema of the structured result (exec tools), checked after each call.
    pub output_schema: Option<Value>,
    /// Extra secrets to redact: JSON pointers (`/auth/token`) or property names (`pin`).
    pub secrets: Vec<String>,
    pub needs: Needs,
    pub limits: Limits,
    /// The file it came from, for error messages.
    pub origin: String,
    pub input_schema_at: Location,
    pub output_schema_at: Location,
}

impl ToolManifest {
    pub fn program(&self) -> &Program {
        match &self.kind {
            ToolKind::Exec(p) => p,
            ToolKind::Mcp { program, .. } => program,
        }
    }
    pub fn is_mcp(&self) -> bool {
        matches!(self.kind, ToolKind::Mcp { .. })
    }
    /// `origin:LINE:COL` of a schema, for errors found when the daemon compiles it.
    pub fn schema_position(&self, output: bool) -> String {
        let l = if output {
            self.output_schema_at
        } else {
            self.input_schema_at
        };
        format!("{}:{}:{}", self.origin, l.line, l.column)
    }
}

const TOP: &[&str] = &[
    "apiVersion",
    "kind",
    "name",
    "description",
    "risk",
    "durability",
    "timeout_ms",
    "exec",
    "mcp",
    "input_schema",
    "output_schema",
    "secrets",
    "sandbox",
    "limits",
];
const PROGRAM: &[&str] = &["command", "args", "env"];
const MCP: &[&str] = &["command", "args", "env", "tools", "startup_timeout_ms"];
const SANDBOX: &[&str] = &[
    "runtime",
    "fs.read",
    "fs.write",
    "fs.exec",
    "net.connect",
    "net.bind",
];
const LIMITS: &[&str] = &["output", "mem", "pids", "must"];
/// Placeholders allowed anywhere in an argument.
pub const INLINE_PLACEHOLDERS: &[&str] = &["{state}", "{agent}", "{scratch}"];
/// Placeholders that stand for a whole argument and expand to one argument per entry.
pub const LIST_PLACEHOLDERS: &[&str] = &["{fs.read}", "{fs.write}", "{fs.exec}", "{scope}"];

fn mismatch(dec: &mut Dec, n: &N, field: &str, expected: &str) {
    dec.err(
        n.pos,
        field,
        format!("{field}: expected {expected}, found {}", n.v.kind()),
    );
}

/// Parse and validate tool manifest text; `origin` names the file in error positions.
pub fn parse_tool(text: &str, origin: &str) -> Result<ToolManifest, ContractError> {
    if let Some((kind, line)) = crate::document_kind(text)
        && kind == "AgentContract"
    {
        return Err(ContractError::single(Diagnostic::error(
            origin,
            line,
            1,
            "kind: AgentContract: this is an agent contract, not a tool manifest; start it with \
             `agentctl start FILE` or put it in the agents directory (/etc/agentos/agents.d)",
        )));
    }
    let files = [origin.to_string()];
    let mut dec = Dec::new(&files);
    let root = match node::read_tree(text, origin, 0) {
        Ok(n) => n,
        Err(d) => return Err(ContractError { diagnostics: d }),
    };
    if matches!(root.v, V::Null) {
        return Err(ContractError::single(Diagnostic::error(
            origin,
            1,
            1,
            "the tool manifest is empty; it needs at least \"name\", \"description\" and \"exec\" or \"mcp\"",
        )));
    }
    let m = decode(&root, &mut dec, origin);
    let mut diags = std::mem::take(&mut dec.diags);
    // The shared decoder speaks of contracts; this file is a tool manifest.
    for d in &mut diags {
        d.message = d
            .message
            .replace("in the contract", "in the tool manifest")
            .replace("the contract: expected", "the tool manifest: expected");
    }
    diags.sort_by_key(|a| (a.line, a.column, a.severity));
    diags.dedup();
    match m {
        Some(m) if !diags.iter().any(Diagnostic::is_error) => Ok(m),
        _ => {
            if diags.is_empty() {
                diags.push(Diagnostic::error(
                    origin,
                    1,
                    1,
                    "the tool manifest could not be read",
                ));
            }
            Err(ContractError { diagnostics: diags })
        }
    }
}

/// Read and parse a manifest file (at most 1 MiB, UTF-8).
pub fn load_tool(path: &Path) -> Result<ToolManifest, ContractError> {
    let origin = path.display().to_string();
    let fail = |msg: String| ContractError::single(Diagnostic::error(&origin, 0, 0, msg));
    let file = std::fs::File::open(path).map_err(|e| fail(format!("cannot read: {e}")))?;
    let mut bytes = Vec::new();
    file.take(node::MAX_CONTRACT_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| fail(format!("cannot read: {e}")))?;
    if bytes.len() > node::MAX_CONTRACT_BYTES {
        return Err(fail(format!(
            "tool manifest is larger than the limit of {} bytes",
            node::MAX_CONTRACT_BYTES
        )));
    }
    let text =
        String::from_utf8(bytes).map_err(|_| fail("tool manifest is not valid UTF-8".into()))?;
    parse_tool(&text, &origin)
}

fn decode(root: &N, dec: &mut Dec, origin: &str) -> Option<ToolManifest> {
    let f = dec.fields(root, "", TOP)?;
    if let Some(n) = f.get("apiVersion")
        && let Some(v) = dec.string(n, "apiVersion")
        && v != crate::API_VERSION
    {
        dec.err(
            n.pos,
            "apiVersion",
            format!(
                "apiVersion: unsupported version \"{v}\"; supported: \"{}\"",
                crate::API_VERSION
            ),
        );
    }
    if let Some(n) = f.get("kind") {
        dec.choice(n, "kind", &[TOOL_KIND]);
    }
    let name = match f.get("name") {
        Some(n) => dec
            .string(n, "name")
            .and_then(|s| check_tool_name(dec, n.pos, s)),
        None => {
            dec.err(
                root.pos,
                "name",
                "missing field \"name\": the capability name that grants this tool (e.g. \"text.wordcount\")",
            );
            None
        }
    };
    let description = match f.get("description") {
        Some(n) => dec.string(n, "description").and_then(|s| {
            if s.trim().is_empty() {
                dec.err(
                    n.pos,
                    "description",
                    "description: must not be empty: agents choose tools by it",
                );
                None
            } else {
                Some(s)
            }
        }),
        None => {
            dec.err(
                root.pos,
                "description",
                "missing field \"description\": agents choose tools by it",
            );
            None
        }
    };
    let risk = match f.get("risk") {
        Some(n) => match dec.choice(n, "risk", &["low", "medium", "high"]).as_deref() {
            Some("low") => Risk::Low,
            Some("high") => Risk::High,
            _ => Risk::Medium,
        },
        None => Risk::Medium,
    };
    let durability = match f.get("durability") {
        Some(n) => match dec.choice(n, "durability", &["sync", "written"]).as_deref() {
            Some("written") => ToolDurability::Written,
            _ => ToolDurability::Sync,
        },
        None => ToolDurability::Sync,
    };
    let timeout = f
        .get("timeout_ms")
        .and_then(|n| dec.millis(n, "timeout_ms"))
        .map_or(DEFAULT_TIMEOUT, Duration::from_nanos);

    let kind = match (f.get("exec"), f.get("mcp")) {
        (Some(_), Some(m)) => {
            let p = f.key("mcp").map_or(m.pos, |k| k.pos);
            dec.err(
                p,
                "mcp",
                "a tool is either \"exec\" (a process per call) or \"mcp\" (an MCP server), not both",
            );
            None
        }
        (Some(e), None) => decode_program(e, dec, "exec", PROGRAM).map(|(p, _)| ToolKind::Exec(p)),
        (None, Some(m)) => decode_program(m, dec, "mcp", MCP).map(|(program, f)| {
            let tools = f.get("tools").and_then(|t| {
                dec.strings(t, "mcp.tools", false)
                    .map(|v| v.into_iter().map(|(s, _)| s).collect::<Vec<_>>())
            });
            let startup_timeout = f
                .get("startup_timeout_ms")
                .and_then(|n| dec.millis(n, "mcp.startup_timeout_ms"))
                .map_or(DEFAULT_STARTUP_TIMEOUT, Duration::from_nanos);
            ToolKind::Mcp {
                program,
                tools,
                startup_timeout,
            }
        }),
        (None, None) => {
            dec.err(
                root.pos,
                "exec",
                "missing \"exec\" or \"mcp\": say how the tool runs (exec: {command, args} for a process per call; mcp: {command, args} for an MCP stdio server)",
            );
            None
        }
    };
    let is_mcp = matches!(kind, Some(ToolKind::Mcp { .. }));

    let mut input_schema_at = Location::default();
    let mut output_schema_at = Location::default();
    let schema = |dec: &mut Dec, key: &str, at: &mut Location| -> Option<Value> {
        let n = f.get(key)?;
        *at = Location {
            line: n.pos.line,
            column: n.pos.col,
        };
        if is_mcp {
            dec.err(
                f.key(key).map_or(n.pos, |k| k.pos),
                key,
                format!("{key}: not allowed for an mcp tool: the server describes its own tools in tools/list"),
            );
            return None;
        }
        let v = to_json(dec, n, key)?;
        check_schema_shape(dec, n, key, &v);
        Some(v)
    };
    let input_schema = schema(dec, "input_schema", &mut input_schema_at);
    let output_schema = schema(dec, "output_schema", &mut output_schema_at);
    if matches!(kind, Some(ToolKind::Exec(_))) && f.get("input_schema").is_none() {
        dec.err(
            root.pos,
            "input_schema",
            "missing field \"input_schema\": an exec tool declares the JSON Schema of its arguments (an object schema; {type: object} accepts any object)",
        );
    }
    let secrets = f
        .get("secrets")
        .map(|n| decode_secrets(n, dec))
        .unwrap_or_default();
    let needs = f
        .get("sandbox")
        .map(|n| decode_needs(n, dec))
        .unwrap_or_default();
    let limits = f
        .get("limits")
        .map(|n| decode_limits(n, dec))
        .unwrap_or_default();

    Some(ToolManifest {
        name: name?,
        description: description?,
        risk,
        durability,
        timeout,
        kind: kind?,
        input_schema,
        output_schema,
        secrets,
        needs,
        limits,
        origin: origin.to_string(),
        input_schema_at,
        output_schema_at,
    })
}

fn check_tool_name(dec: &mut Dec, pos: Pos, s: String) -> Option<String> {
    if let Err(p) = capability::check_name(&s) {
        dec.push(
            Severity::Error,
            pos,
            "name",
            format!("name: {}", p.message),
            p.suggestion,
        );
        return None;
    }
    if capability::kind_of(&s) != CapabilityKind::Tool {
        dec.err(
            pos,
            "name",
            format!("name: \"{s}\" is a kernel-enforced capability, not a tool; choose a tool name such as \"files\" or \"text.wordcount\""),
        );
        return None;
    }
    Some(s)
}

/// Decode `exec:` or `mcp:`: a mapping with command, args, env (and mcp's own fields).
fn decode_program<'n>(
    n: &'n N,
    dec: &mut Dec,
    path: &str,
    allowed: &[&str],
) -> Option<(Program, Fields<'n>)> {
    let f = dec.fields(n, path, allowed)?;
    let mut p = Program::default();
    let cfield = format!("{path}.command");
    match f.get("command") {
        None => {
            dec.err(
                n.pos,
                &cfield,
                format!("{path}: missing field \"command\" (the absolute path of the program)"),
            );
            return None;
        }
        Some(c) => {
            let cmd = dec.string(c, &cfield)?;
            if !cmd.starts_with('/') || cmd.split('/').any(|c| c == "..") {
                dec.err(
                    c.pos,
                    &cfield,
                    format!("{cfield}: \"{cmd}\" is not an absolute path without \"..\" (write e.g. \"/usr/bin/python3\"; the daemon does not search PATH)"),
                );
                return None;
            }
            p.command = PathBuf::from(cmd);
        }
    }
    if let Some(a) = f.get("args") {
        let afield = format!("{path}.args");
        match &a.v {
            V::Seq(items) => {
                for (i, it) in items.iter().enumerate() {
                    let field = format!("{afield}[{i}]");
                    let s = match &it.v {
                        V::Str(s) => s.clone(),
                        V::Int(i) => i.to_string(),
                        V::Bool(b) => b.to_string(),
                        _ => {
                            mismatch(dec, it, &field, "a string");
                            continue;
                        }
                    };
                    check_placeholders(dec, it.pos, &field, &s);
                    p.args.push(s);
                }
            }
            _ => mismatch(dec, a, &afield, "a list of strings"),
        }
    }
    if let Some(env) = f.get("env") {
        let efield = format!("{path}.env");
        match &env.v {
            V::Map(m) => {
                for (k, v) in m {
                    let field = format!("{efield}.{}", k.name);
                    if !env_name_ok(&k.name) {
                        dec.err(k.pos, &field, format!("{efield}: \"{}\" is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)", k.name));
                        continue;
                    }
                    let s = match &v.v {
                        V::Str(s) => s.clone(),
                        V::Int(i) => i.to_string(),
                        V::Bool(b) => b.to_string(),
                        _ => {
                            mismatch(dec, v, &field, "a string");
                            continue;
                        }
                    };
                    p.env.push((k.name.clone(), s));
                }
            }
            _ => mismatch(dec, env, &efield, "a mapping NAME: value"),
        }
    }
    Some((p, f))
}

fn env_name_ok(s: &str) -> bool {
    let mut cs = s.chars();
    cs.next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && cs.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Every `{...}` in an argument must be a known placeholder; list placeholders stand alone.
fn check_placeholders(dec: &mut Dec, pos: Pos, field: &str, arg: &str) {
    if LIST_PLACEHOLDERS.contains(&arg) {
        return;
    }
    // A placeholder is `{` lower-case letters, digits, '.', '_' `}`; other braces (JSON in a
    // shell one-liner) are text.
    let mut rest = arg;
    while let Some(start) = rest.find('{') {
        let Some(len) = rest[start..].find('}') else {
            break;
        };
        let ph = &rest[start..start + len + 1];
        let inner = &ph[1..ph.len() - 1];
        let looks_like = inner.starts_with(|c: char| c.is_ascii_lowercase())
            && inner
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '_');
        if !looks_like {
            rest = &rest[start + 1..];
            continue;
        }
        if LIST_PLACEHOLDERS.contains(&ph) {
            dec.err(pos, field, format!("{field}: {ph} expands to one argument per entry and must be the whole argument, not part of \"{arg}\""));
        } else if !INLINE_PLACEHOLDERS.contains(&ph) {
            let all = INLINE_PLACEHOLDERS.iter().chain(LIST_PLACEHOLDERS).copied();
            match suggest(ph, all) {
                Some(s) => dec.push(
                    Severity::Error,
                    pos,
                    field,
                    format!("{field}: unknown placeholder {ph} (did you mean {s}?)"),
                    Some(s.to_string()),
                ),
                None => dec.err(
                    pos,
                    field,
                    format!(
                        "{field}: unknown placeholder {ph}; known: {}, {}",
                        INLINE_PLACEHOLDERS.join(", "),
                        LIST_PLACEHOLDERS.join(", ")
                    ),
                ),
            }
        }
        rest = &rest[start + len + 1..];
    }
}

/// The positioned YAML value as JSON (for schemas).
fn to_json(dec: &mut Dec, n: &N, field: &str) -> Option<Value> {
    Some(match &n.v {
        V::Null => Value::Null,
        V::Bool(b) => Value::Bool(*b),
        V::Int(i) => {
            if let Ok(v) = i64::try_from(*i) {
                Value::Number(v.into())
            } else if let Ok(v) = u64::try_from(*i) {
                Value::Number(v.into())
            } else {
                dec.err(
                    n.pos,
                    field,
                    format!("{field}: integer {i} is out of range"),
                );
                return None;
            }
        }
        V::Float(f) => match Number::from_f64(*f) {
            Some(x) => Value::Number(x),
            None => {
                dec.err(n.pos, field, format!("{field}: {f} is not a JSON number"));
                return None;
            }
        },
        V::Str(s) => Value::String(s.clone()),
        V::Seq(items) => {
            let mut out = Vec::with_capacity(items.len());
            for (i, it) in items.iter().enumerate() {
                out.push(to_json(dec, it, &format!("{field}[{i}]"))?);
            }
            Value::Array(out)
        }
        V::Map(m) => {
            let mut out = Map::new();
            for (k, v) in m {
                out.insert(
                    k.name.clone(),
                    to_json(dec, v, &format!("{field}.{}", k.name))?,
                );
            }
            Value::Object(out)
        }
    })
}

/// MCP requires object schemas for tool inputs (and structured outputs).
fn check_schema_shape(dec: &mut Dec, n: &N, field: &str, v: &Value) {
    match v {
        Value::Object(m) => match m.get("type") {
            Some(Value::String(t)) if t == "object" => {}
            Some(t) => dec.err(
                n.pos,
                field,
                format!("{field}: the top-level \"type\" must be \"object\" (MCP tools take and return JSON objects), found {t}"),
            ),
            None => dec.err(
                n.pos,
                field,
                format!("{field}: missing \"type: object\" at the top (MCP tools take and return JSON objects)"),
            ),
        },
        _ => mismatch(dec, n, field, "a JSON Schema mapping with type: object"),
    }
}

fn decode_secrets(n: &N, dec: &mut Dec) -> Vec<String> {
    let mut out = Vec::new();
    for (i, (s, pos)) in dec
        .strings(n, "secrets", true)
        .unwrap_or_default()
        .into_iter()
        .enumerate()
    {
        let field = format!("secrets[{i}]");
        let ok = if let Some(ptr) = s.strip_prefix('/') {
            // RFC 6901: '~' only as ~0 or ~1.
            let b = ptr.as_bytes();
            b.iter()
                .enumerate()
                .all(|(j, c)| *c != b'~' || matches!(b.get(j + 1), Some(b'0' | b'1')))
        } else {
            !s.is_empty() && !s.chars().any(char::is_control)
        };
        if ok {
            out.push(s);
        } else {
            dec.err(pos, &field, format!("{field}: \"{s}\" is neither a JSON pointer (\"/auth/token\", '~' written ~0 or ~1) nor a property name"));
        }
    }
    out
}

fn decode_needs(n: &N, dec: &mut Dec) -> Needs {
    let mut needs = Needs::default();
    let Some(f) = dec.fields(n, "sandbox", SANDBOX) else {
        return needs;
    };
    for key in SANDBOX {
        let Some(x) = f.get(key) else { continue };
        let field = f.path(key);
        let items = match &x.v {
            V::Null => Vec::new(),
            _ => dec.strings(x, &field, true).unwrap_or_default(),
        };
        for (s, pos) in items {
            match *key {
                "runtime" => match normalize_path(&s) {
                    Some(p) if !p.starts_with('{') => needs.runtime.push(PathBuf::from(p)),
                    _ => dec.err(pos, &field, format!("{field}: \"{s}\" is not an absolute path without \".\" or \"..\" components (the tool's own code, e.g. /usr/lib/agentos/tools)")),
                },
                "net.connect" | "net.bind" => match net_scope_error(key, &field, &s).or_else(|| {
                    crate::netscope::checked_scope(&s).map(|_| format!("{field}: \"{s}\": https:// and http:// checks are for agents' contracts (a tool's names are resolved once, when it is placed): write NAME:PORT"))
                }) {
                    None if *key == "net.connect" => needs.net_connect.push(s),
                    None => needs.net_bind.push(s),
                    Some(e) => dec.err(pos, &field, e),
                },
                _ => match normalize_path(&s) {
                    Some(p) => match *key {
                        "fs.read" => needs.fs_read.push(p),
                        "fs.write" => needs.fs_write.push(p),
                        _ => needs.fs_exec.push(p),
                    },
                    None => dec.err(pos, &field, format!("{field}: \"{s}\" is not an absolute path without \".\" or \"..\" components (or one under \"{{state}}/\")")),
                },
            }
        }
    }
    needs
}

fn decode_limits(n: &N, dec: &mut Dec) -> Limits {
    let mut l = Limits::default();
    let Some(f) = dec.fields(n, "limits", LIMITS) else {
        return l;
    };
    for key in ["output", "mem"] {
        let Some(x) = f.get(key) else { continue };
        let field = f.path(key);
        let text = match &x.v {
            V::Str(s) => s.clone(),
            V::Int(i) if *i > 0 => i.to_string(),
            _ => {
                mismatch(
                    dec,
                    x,
                    &field,
                    "a size such as \"1MiB\" or a number of bytes",
                );
                continue;
            }
        };
        match units::parse_memory(&text) {
            Ok(0) => dec.err(x.pos, &field, format!("{field}: must be positive")),
            Ok(v) if key == "output" => l.output_bytes = v,
            Ok(v) => l.mem_bytes = Some(v),
            Err(e) => dec.err(x.pos, &field, format!("{field}: {e}")),
        }
    }
    if let Some(x) = f.get("pids") {
        l.pids = dec.uint(x, "limits.pids", 1, 4_194_304);
    }
    if let Some(x) = f.get("must") {
        match &x.v {
            V::Bool(b) => l.must = *b,
            _ => mismatch(dec, x, "limits.must", "true or false"),
        }
    }
    l
}

// ---- the intersection rule ----

/// Component-wise containment: `/srv/docs` contains `/srv/docs/a`, not `/srv/docsx`.
pub fn path_contains(outer: &Path, inner: &Path) -> bool {
    inner.starts_with(outer)
}

fn lexical(p: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in p.components() {
        if let Component::Normal(s) = c {
            out.push(s);
        }
    }
    out
}

/// What a tool may touch on one call: every pair `a ∩ b` of a tool path `a` and a caller path
/// `b`, where `a ∩ b` is the deeper of the two when one contains the other, and nothing
/// otherwise. The result is minimal (no entry contains another) and sorted.
pub fn intersect_paths(tool: &[PathBuf], caller: &[PathBuf]) -> Vec<PathBuf> {
    let mut out: BTreeSet<PathBuf> = BTreeSet::new();
    for a in tool.iter().map(|p| lexical(p)) {
        for b in caller.iter().map(|p| lexical(p)) {
            if path_contains(&a, &b) {
                out.insert(b);
            } else if path_contains(&b, &a) {
                out.insert(a.clone());
            }
        }
    }
    minimal(out.into_iter().collect())
}

/// Drop entries contained in another entry.
pub fn minimal(mut v: Vec<PathBuf>) -> Vec<PathBuf> {
    v.sort();
    v.dedup();
    let mut out: Vec<PathBuf> = Vec::new();
    for p in v {
        if !out.iter().any(|o| path_contains(o, &p)) {
            out.push(p);
        }
    }
    out
}

fn glob_part_meet<'a>(a: &'a str, b: &'a str) -> Option<&'a str> {
    if a == "*" {
        Some(b)
    } else if b == "*" || a.eq_ignore_ascii_case(b) {
        Some(a)
    } else {
        None
    }
}

/// Two HOSTs met: `*` meets anything (a `udp://` HOST stays UDP only); otherwise both are
/// `udp://` or neither (a name grant is TCP only, `udp://` UDP only: they share nothing), and
/// the hosts are equal or one is a `*.SUFFIX` wildcard covering the other (the narrower one).
fn host_meet<'a>(a: &'a str, b: &'a str) -> Option<&'a str> {
    if a == "*" {
        return Some(b);
    }
    if b == "*" {
        return Some(a);
    }
    let split = |h: &'a str| match h.strip_prefix(crate::decode::UDP_SCHEME) {
        Some(rest) => (true, rest),
        None => (false, h),
    };
    let ((ua, ha), (ub, hb)) = (split(a), split(b));
    if ua != ub {
        return None;
    }
    let covers = |w: &str, n: &str| {
        w.strip_prefix("*.").is_some_and(|suffix| {
            let n = n.to_ascii_lowercase();
            n.len() > suffix.len() + 1
                && n.ends_with(&suffix.to_ascii_lowercase())
                && n.as_bytes()[n.len() - suffix.len() - 1] == b'.'
        })
    };
    if ha.eq_ignore_ascii_case(hb) || covers(hb, ha) {
        Some(a)
    } else if covers(ha, hb) {
        Some(b)
    } else {
        None
    }
}

/// `HOST:PORT` scopes met pairwise: `*` meets anything; a `*.SUFFIX` wildcard meets the names
/// under it; otherwise host and port must be equal, and `udp://` on both or neither.
/// (`api.example.com:443` ∩ `*:443` = `api.example.com:443`; `*:*` ∩ `h:80` = `h:80`;
/// `a.example.com:443` ∩ `*.example.com:443` = `a.example.com:443`.)
pub fn intersect_net(tool: &[String], caller: &[String]) -> Vec<String> {
    let mut out = BTreeSet::new();
    for a in tool {
        for b in caller {
            let (Some((ah, ap)), Some((bh, bp))) = (a.rsplit_once(':'), b.rsplit_once(':')) else {
                continue;
            };
            if let (Some(h), Some(p)) = (host_meet(ah, bh), glob_part_meet(ap, bp)) {
                out.insert(format!("{h}:{p}"));
            }
        }
    }
    out.into_iter().collect()
}

/// Replace a leading `{state}` by the caller's state directory.
pub fn expand_state(s: &str, state: &Path) -> PathBuf {
    match s.strip_prefix("{state}") {
        Some(rest) => PathBuf::from(format!("{}{rest}", state.display())),
        None => PathBuf::from(s),
    }
}

/// The values placeholders stand for, for one caller and one call.
#[derive(Debug, Clone, Default)]
pub struct ArgContext {
    pub state: PathBuf,
    pub agent: String,
    pub scratch: PathBuf,
    pub fs_read: Vec<PathBuf>,
    pub fs_write: Vec<PathBuf>,
    pub fs_exec: Vec<PathBuf>,
    pub scope: Vec<String>,
}

/// Expand placeholders in `args` (see [`Program`]).
pub fn expand_args(args: &[String], cx: &ArgContext) -> Vec<String> {
    let mut out = Vec::new();
    let paths = |v: &[PathBuf]| {
        v.iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
    };
    for a in args {
        match a.as_str() {
            "{fs.read}" => out.extend(paths(&cx.fs_read)),
            "{fs.write}" => out.extend(paths(&cx.fs_write)),
            "{fs.exec}" => out.extend(paths(&cx.fs_exec)),
            "{scope}" => out.extend(cx.scope.iter().cloned()),
            _ => out.push(
                a.replace("{state}", &cx.state.display().to_string())
                    .replace("{agent}", &cx.agent)
                    .replace("{scratch}", &cx.scratch.display().to_string()),
            ),
        }
    }
    out
}

// ---- redaction ----

/// Whether an object key names a secret by default.
pub fn is_default_secret_key(key: &str) -> bool {
    let k = key.to_ascii_lowercase().replace('-', "_");
    DEFAULT_SECRET_KEYS.contains(&k.as_str())
        || DEFAULT_SECRET_SUFFIXES.iter().any(|s| k.ends_with(s))
}

/// `{"redacted": "sha256:<hex>"}` of the canonical JSON of `v`: equal secrets keep equal hashes
/// so an auditor can correlate them without reading them.
pub fn redacted(v: &Value) -> Value {
    let h = crate::canonical::sha256_hex(crate::canonical::to_canonical_json(v).as_bytes());
    serde_json::json!({ "redacted": format!("sha256:{h}") })
}

/// Unescape one JSON pointer token (`~1` → `/`, `~0` → `~`).
fn pointer_token(t: &str) -> String {
    t.replace("~1", "/").replace("~0", "~")
}

fn redact_pointer(v: &mut Value, pointer: &str) {
    let mut cur = v;
    let tokens: Vec<String> = pointer.split('/').skip(1).map(pointer_token).collect();
    for (i, t) in tokens.iter().enumerate() {
        let next = match cur {
            Value::Object(m) => m.get_mut(t),
            Value::Array(a) => t.parse::<usize>().ok().and_then(|i| a.get_mut(i)),
            _ => None,
        };
        let Some(n) = next else { return };
        if i + 1 == tokens.len() {
            *n = redacted(n);
            return;
        }
        cur = n;
    }
}

fn redact_walk(v: &mut Value, names: &[String], pointers: &[&String]) {
    match v {
        Value::Object(m) => {
            for (k, x) in m.iter_mut() {
                if is_default_secret_key(k) || names.iter().any(|n| n.eq_ignore_ascii_case(k)) {
                    *x = redacted(x);
                } else {
                    redact_walk(x, names, pointers);
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|x| redact_walk(x, names, pointers)),
        Value::String(s) => {
            // Text that is itself JSON (an MCP text content item echoing the structured
            // result) is redacted inside and written back compactly.
            let t = s.trim_start();
            if (t.starts_with('{') || t.starts_with('['))
                && let Ok(mut inner) = serde_json::from_str::<Value>(s)
            {
                let before = inner.clone();
                for p in pointers {
                    redact_pointer(&mut inner, p);
                }
                redact_walk(&mut inner, names, pointers);
                if inner != before {
                    *s = inner.to_string();
                }
            }
        }
        _ => {}
    }
}

/// Redact secrets in tool arguments or results for the audit record: values under default
/// secret keys and under the manifest's `secrets` (property names anywhere; JSON pointers from
/// the root, and for results also from `structuredContent` and from text that is itself JSON)
/// become [`redacted`] hashes.
pub fn redact(v: &Value, secrets: &[String]) -> Value {
    let mut out = v.clone();
    let pointers: Vec<&String> = secrets.iter().filter(|s| s.starts_with('/')).collect();
    for p in &pointers {
        redact_pointer(&mut out, p);
        if let Some(sc) = out.get_mut("structuredContent") {
            redact_pointer(sc, p);
        }
    }
    let names: Vec<String> = secrets
        .iter()
        .filter(|s| !s.starts_with('/'))
        .cloned()
        .collect();
    redact_walk(&mut out, &names, &pointers);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(v: &[&str]) -> Vec<PathBuf> {
        v.iter().map(PathBuf::from).collect()
    }

    #[test]
    fn paths_meet_at_the_deeper_one() {
        assert_eq!(
            intersect_paths(&p(&["/srv"]), &p(&["/srv/docs"])),
            p(&["/srv/docs"])
        );
        assert_eq!(
            intersect_paths(&p(&["/srv/docs/a"]), &p(&["/srv"])),
            p(&["/srv/docs/a"])
        );
        assert!(intersect_paths(&p(&["/srv/docs"]), &p(&["/srv/docsx"])).is_empty());
        assert_eq!(
            intersect_paths(&p(&["/"]), &p(&["/a", "/a/b", "/c"])),
            p(&["/a", "/c"])
        );
        assert!(intersect_paths(&p(&[]), &p(&["/a"])).is_empty());
        // `..` and `.` never widen: they are dropped lexically before comparing.
        assert_eq!(
            intersect_paths(&p(&["/srv/./x/"]), &p(&["/srv"])),
            p(&["/srv/x"])
        );
    }

    #[test]
    fn net_meets() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(
            intersect_net(&s(&["api.example.com:443"]), &s(&["*:443"])),
            s(&["api.example.com:443"])
        );
        assert_eq!(intersect_net(&s(&["*:*"]), &s(&["h:80"])), s(&["h:80"]));
        assert!(intersect_net(&s(&["a:80"]), &s(&["b:80"])).is_empty());
        assert!(intersect_net(&s(&["a:80"]), &s(&["a:443"])).is_empty());
        // Wildcards meet the names under them (the narrower), never the suffix itself.
        let w = s(&["*.example.com:443"]);
        assert_eq!(
            intersect_net(&s(&["API.example.com:443"]), &w),
            s(&["API.example.com:443"])
        );
        assert_eq!(
            intersect_net(&w, &s(&["a.b.example.com:443"])),
            s(&["a.b.example.com:443"])
        );
        assert_eq!(
            intersect_net(&w, &s(&["*.b.example.com:443"])),
            s(&["*.b.example.com:443"])
        );
        assert!(intersect_net(&w, &s(&["example.com:443"])).is_empty());
        assert!(intersect_net(&w, &s(&["xexample.com:443"])).is_empty());
        // udp:// (UDP only) meets udp:// or an address-side "*", never a name grant (TCP only).
        let u = s(&["udp://q.example.com:443"]);
        assert!(intersect_net(&u, &w).is_empty());
        assert!(intersect_net(&w, &u).is_empty());
        assert_eq!(intersect_net(&u, &s(&["udp://*.example.com:443"])), u);
        assert_eq!(intersect_net(&s(&["*:443"]), &u), u);
        assert_eq!(intersect_net(&u, &s(&["*:*"])), u);
    }

    #[test]
    fn a_contract_is_not_a_tool_and_a_tool_not_a_contract() {
        let tool = "apiVersion: agentos/v0.2\nkind: Tool\nname: t.x\ndescription: d\nexec: { command: /bin/cat }\ninput_schema: {type: object}\n";
        let e = crate::parse_contract(tool, "agents.d/t.yaml").unwrap_err();
        assert_eq!(e.diagnostics.len(), 1, "one diagnostic, not a cascade: {e}");
        assert!(
            e.to_string()
                .contains("agents.d/t.yaml:2:1: kind: Tool: this is a tool manifest"),
            "{e}"
        );
        let contract = "apiVersion: agentos/v0.2\nkind: AgentContract # an agent\nname: a\nclass: { latency: DT }\n";
        let e = parse_tool(contract, "tools.d/a.yaml").unwrap_err();
        assert_eq!(e.diagnostics.len(), 1, "{e}");
        assert!(
            e.to_string()
                .contains("tools.d/a.yaml:2:1: kind: AgentContract: this is an agent contract"),
            "{e}"
        );
        assert_eq!(
            crate::document_kind("a: 1\nkind: 'Tool'\n"),
            Some(("Tool".into(), 2))
        );
        assert_eq!(
            crate::document_kind("  kind: Tool\n"),
            None,
            "top level only"
        );
    }

    #[test]
    fn durability_defaults_to_sync_whatever_the_risk() {
        let base = "apiVersion: agentos/v0.2\nkind: Tool\nname: t.x\ndescription: d\nexec: { command: /bin/cat }\ninput_schema: {type: object}\n";
        let m = parse_tool(&format!("{base}risk: low\n"), "t.yaml").unwrap();
        assert_eq!(m.durability, ToolDurability::Sync);
        let m = parse_tool(&format!("{base}durability: written\n"), "t.yaml").unwrap();
        assert_eq!(m.durability, ToolDurability::Written);
        let m = parse_tool(&format!("{base}durability: sync\n"), "t.yaml").unwrap();
        assert_eq!(m.durability, ToolDurability::Sync);
        let e = parse_tool(&format!("{base}durability: lazy\n"), "t.yaml").unwrap_err();
        assert!(
            e.to_string().contains("durability: unknown value \"lazy\""),
            "{e}"
        );
    }

    #[test]
    fn limits_say_whether_they_are_required() {
        let base = "apiVersion: agentos/v0.2\nkind: Tool\nname: t.x\ndescription: d\nexec: { command: /bin/cat }\ninput_schema: {type: object}\n";
        let m = parse_tool(&format!("{base}limits: {{ pids: 8 }}\n"), "t.yaml").unwrap();
        assert!(!m.limits.must, "should by default, as an agent's budgets");
        let m = parse_tool(
            &format!("{base}limits: {{ pids: 8, must: true }}\n"),
            "t.yaml",
        )
        .unwrap();
        assert!(m.limits.must);
        let e = parse_tool(&format!("{base}limits: {{ must: \"yes\" }}\n"), "t.yaml").unwrap_err();
        assert!(e.to_string().contains("limits.must"), "{e}");
    }

    #[test]
    fn secrets_are_hashed() {
        let v = serde_json::json!({"user": "x", "Password": "hunter2", "nested": {"GitHub-Token": "t"}, "pin": 1234, "auth": {"k": "v"}});
        let r = redact(&v, &["pin".into(), "/auth/k".into()]);
        assert_eq!(r["user"], "x");
        assert_eq!(r["Password"], redacted(&serde_json::json!("hunter2")));
        assert!(
            r["nested"]["GitHub-Token"]["redacted"]
                .as_str()
                .unwrap()
                .starts_with("sha256:")
        );
        assert_eq!(r["pin"], redacted(&serde_json::json!(1234)));
        assert_eq!(r["auth"]["k"], redacted(&serde_json::json!("v")));
        assert!(!r.to_string().contains("hunter2"));
    }

    #[test]
    fn args_expand() {
        let cx = ArgContext {
            state: "/var/lib/agentos/home/t/a".into(),
            agent: "t/a".into(),
            fs_read: p(&["/srv/a", "/srv/b"]),
            ..Default::default()
        };
        assert_eq!(
            expand_args(
                &[
                    "--x={state}/f".into(),
                    "{fs.read}".into(),
                    "{fs.write}".into()
                ],
                &cx
            ),
            vec!["--x=/var/lib/agentos/home/t/a/f", "/srv/a", "/srv/b"]
        );
    }
}
