//! `cargo xtask bench mcp`: tool calls over the agents' MCP sockets, black box. A private
//! dbus-daemon and a release agentosd (own cgroup root, own state directory on the real disk, a
//! tools directory with one `mcp` tool) are started; the measured clients are this binary
//! re-executed (`bench mcp-client`), and the tool server is this binary too
//! (`bench mcp-echo-server`, answers at once), so no interpreter start-up or tool work is in the
//! loop. Nothing in the daemon is instrumented.
//!
//! Sequential round trips (one request in flight, `--calls` per path, in `--rounds` interleaved
//! rounds so drifting load hits every path alike):
//!
//! | path | what one round trip is |
//! |---|---|
//! | floor | the same client, a plain Unix-socket echo server in the bench process (same line framing, no daemon) |
//! | tool server over a pipe | the same client starts the echo tool server itself and calls it over its stdin/stdout (no daemon) |
//! | line relay (proxy floor) | the same client calls the echo tool server through a relay process (`bench mcp-relay`): socket → relay → pipe → tool → pipe → relay → socket, one thread per direction, no parsing: the hand-offs any out-of-process proxy adds, and nothing else |
//! | ping via agentosd | the client runs as an agent (own cgroup, uid, Landlock, seccomp); MCP `ping` is answered in the daemon's session |
//! | tools/call via agentosd | the same agent calls the tool: ipc → gate → audit record committed (fdatasync) → proxied to the agent's echo server → result record queued → reply |
//! | tools/call, `durability: written` | the same through a second manifest (`benchw`, `durability: written`): the allow record is written (not synced) before the tool runs; the group commit syncs it without the call waiting |
//! | tools/call refused | a tool the contract does not grant: gate → deny record queued (not awaited) → error reply |
//! | D-Bus | `ListAgents` on the daemon through the same private dbus-daemon (zbus, from the bench) |
//! | fdatasync | one append of a 338-byte line + `fdatasync` on the state directory's file system (the disk's floor) |
//!
//! Then `--agents` agents (default 100) flood the daemon for `--flood-secs` with `ping`, then
//! with `tools/call`, one request in flight each, while the bench times `ListAgents` (in
//! process) and `agentctl list` (a process) every 100 ms.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use serde_json::{Value, json};

use super::harness::*;

#[derive(Args)]
pub struct McpArgs {
    /// Round trips per sequential path (split over the rounds).
    #[arg(long, default_value_t = 100_000)]
    pub calls: usize,
    /// Interleaved rounds of the sequential paths.
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// Unmeasured round trips per path and client process first.
    #[arg(long, default_value_t = 1000)]
    pub warmup: usize,
    /// fdatasync samples (the disk's floor).
    #[arg(long, default_value_t = 2000)]
    pub syncs: usize,
    /// Concurrent agents in the flood (0: no flood).
    #[arg(long, default_value_t = 100)]
    pub agents: usize,
    /// Seconds per flood phase (ping, then tools/call).
    #[arg(long, default_value_t = 10)]
    pub flood_secs: u64,
    /// A CPU budget for each flooding agent (`compute: { cpu: CPU }` in its contract, e.g.
    /// `0.01`: `cpu.max` where the cpu controller exists, as in the VM) [default: none].
    #[arg(long, value_name = "CPU")]
    pub agent_cpu: Option<String>,
    /// Working directory (state directory, audit log, copies of the binary) [default:
    /// /var/tmp/agentos-bench-mcp-PID]: put it on the file system you want the audit log on.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// The audit log's directory [default: STATE_DIR/audit, in --dir]. E.g. a directory on
    /// /dev/shm (tmpfs, where fdatasync costs nothing) takes the disk out of the measurement.
    #[arg(long)]
    pub audit_dir: Option<PathBuf>,
    /// Directory with release agentosd and agentctl [default: build them next to this binary].
    #[arg(long)]
    pub bin_dir: Option<PathBuf>,
    /// Leave the working directory (daemon log, audit log, samples) in place.
    #[arg(long)]
    pub keep: bool,
    /// Also write the results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// One more agentosd argument (repeatable), e.g. `--daemon-arg=--agent-poll-interval=16`
    /// to compare a daemon setting in one command.
    #[arg(long = "daemon-arg", allow_hyphen_values = true)]
    pub daemon_args: Vec<String>,
}

#[derive(Args)]
pub struct ClientArgs {
    /// Socket to connect to [default: $AGENTOS_SOCKET, else the fd in $AGENTOS_SOCKET_FD].
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Start `bench mcp-echo-server` as a child and talk to it over its stdin/stdout.
    #[arg(long)]
    pub spawn_server: bool,
    /// Start `bench mcp-relay` as a child (it starts the echo server) and talk to it over a
    /// Unix socket at PATH.
    #[arg(long, value_name = "PATH", conflicts_with = "spawn_server")]
    pub relay: Option<PathBuf>,
    /// Comma-separated request kinds: ping, call, denied, echo (a ping line, echoed back).
    #[arg(long, default_value = "ping")]
    pub modes: String,
    /// The tool `call` calls.
    #[arg(long, default_value = TOOL)]
    pub tool: String,
    #[arg(long, default_value_t = 1000)]
    pub calls: usize,
    #[arg(long, default_value_t = 100)]
    pub warmup: usize,
    /// Output prefix: samples go to PREFIX-MODE.bin (u32 ns, little endian), then PREFIX.done.
    #[arg(long)]
    pub out: PathBuf,
    /// Flood: after the warm-up write PREFIX.ready, wait for DIR/go ("start_ns phase_ns gap_ns",
    /// CLOCK_MONOTONIC), then run each mode for one phase.
    #[arg(long)]
    pub flood: Option<PathBuf>,
    /// With `--flood`: run the modes this many times, one phase each (files PREFIX-MODE-N.bin
    /// when more than one).
    #[arg(long, default_value_t = 1)]
    pub phases: u64,
    /// With `--flood`: one request every this many µs (0: back to back).
    #[arg(long, default_value_t = 0)]
    pub interval_us: u64,
}

/// The tool the agents call: the echo server's `echo`, behind the `bench` manifest.
const TOOL: &str = "bench.echo";
/// The same server behind a manifest with `durability: written`.
const WRITTEN_TOOL: &str = "benchw.echo";
/// An installed tool the contracts do not grant.
const DENIED_TOOL: &str = "denied.noop";

// ---------------------------------------------------------------------------------------------
// The tool server: answers at once.

/// `bench mcp-echo-server`: an MCP stdio server with one tool, `echo`, that answers "ok".
pub fn echo_server() -> Result<()> {
    let stdin = std::io::stdin();
    let mut r = stdin.lock();
    let stdout = std::io::stdout();
    let mut w = stdout.lock();
    let mut line = Vec::new();
    loop {
        line.clear();
        if r.read_until(b'\n', &mut line)? == 0 {
            return Ok(());
        }
        let Ok(msg) = serde_json::from_slice::<Value>(&line) else {
            continue;
        };
        let (Some(id), Some(method)) = (msg.get("id"), msg.get("method").and_then(Value::as_str))
        else {
            continue; // notifications, responses
        };
        let id = id.to_string();
        let reply = match method {
            "tools/call" => format!(
                r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[{{"type":"text","text":"ok"}}]}}}}"#
            ),
            "ping" => format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{}}}}"#),
            "initialize" => {
                let v = msg
                    .pointer("/params/protocolVersion")
                    .cloned()
                    .unwrap_or(json!("2025-06-18"));
                json!({"jsonrpc": "2.0", "id": msg["id"], "result": {
                    "protocolVersion": v, "capabilities": {"tools": {}},
                    "serverInfo": {"name": "xtask-bench-echo", "version": "0"}}})
                .to_string()
            }
            "tools/list" => json!({"jsonrpc": "2.0", "id": msg["id"], "result": {"tools": [{
                "name": "echo", "description": "Answers ok at once (benchmark).",
                "inputSchema": {"type": "object"}}]}})
            .to_string(),
            m => json!({"jsonrpc": "2.0", "id": msg["id"],
                "error": {"code": -32601, "message": format!("no method {m}")}})
            .to_string(),
        };
        w.write_all(reply.as_bytes())?;
        w.write_all(b"\n")?;
        w.flush()?;
    }
}

/// `bench mcp-relay`.
#[derive(Args)]
pub struct RelayArgs {
    /// Listen here, serve the first connection, exit when it closes.
    #[arg(long)]
    pub socket: PathBuf,
}

/// `bench mcp-relay`: the floor of any out-of-process proxy. Accepts one connection on a Unix
/// socket, starts the echo tool server with pipes, and copies bytes socket → server's stdin on
/// one thread and server's stdout → socket on another (blocking I/O, no parsing): the same
/// process hand-offs as the daemon's path to a tool server (agent → daemon → tool → daemon →
/// agent) with none of its work.
pub fn relay(a: RelayArgs) -> Result<()> {
    let _ = std::fs::remove_file(&a.socket);
    let l =
        UnixListener::bind(&a.socket).with_context(|| format!("bind {}", a.socket.display()))?;
    let (s, _) = l.accept()?;
    drop(l);
    let _ = std::fs::remove_file(&a.socket);
    let mut child = spawn_echo_server()?;
    let mut to_server = child.stdin.take().context("stdin")?;
    let mut from_server = child.stdout.take().context("stdout")?;
    let mut from_client = s.try_clone()?;
    let mut to_client = s;
    let up = std::thread::spawn(move || pass(&mut from_client, &mut to_server));
    pass(&mut from_server, &mut to_client)?;
    let _ = up.join();
    let _ = child.wait();
    Ok(())
}

/// `bench mcp-echo-server` as a child of this process, on pipes.
fn spawn_echo_server() -> Result<Child> {
    Command::new(std::env::current_exe()?)
        .args(["bench", "mcp-echo-server"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("start the echo server")
}

/// Copies what `r` gives to `w` as it comes, until EOF: one `read` and one `write` per chunk
/// (`std::io::copy` would use `splice`, which here waits for more than one line).
fn pass(r: &mut impl Read, w: &mut impl Write) -> std::io::Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match r.read(&mut buf)? {
            0 => return Ok(()),
            n => w.write_all(&buf[..n])?,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The measured client.

struct Conn {
    r: BufReader<Box<dyn Read>>,
    w: Box<dyn Write>,
    child: Option<Child>,
    line: Vec<u8>,
    next_id: u64,
}

impl Conn {
    fn socket(path: Option<&Path>) -> Result<Conn> {
        let path = path
            .map(Path::to_path_buf)
            .or_else(|| std::env::var_os("AGENTOS_SOCKET").map(PathBuf::from));
        let s = match path {
            Some(p) => {
                UnixStream::connect(&p).with_context(|| format!("connect {}", p.display()))?
            }
            None => {
                let fd: i32 = std::env::var("AGENTOS_SOCKET_FD")
                    .context("no --socket, AGENTOS_SOCKET or AGENTOS_SOCKET_FD")?
                    .parse()
                    .context("AGENTOS_SOCKET_FD")?;
                // SAFETY: the daemon hands this fd to the agent's process as a connected socket
                // it owns; nothing else in this process uses it.
                unsafe { <UnixStream as std::os::fd::FromRawFd>::from_raw_fd(fd) }
            }
        };
        Conn::stream(s, None)
    }

    /// A connection over Unix stream `s`, with the child behind it (if this process started it).
    fn stream(s: UnixStream, child: Option<Child>) -> Result<Conn> {
        let r = s.try_clone()?;
        Ok(Conn {
            r: BufReader::with_capacity(64 * 1024, Box::new(r)),
            w: Box::new(s),
            child,
            line: Vec::with_capacity(4096),
            next_id: 1,
        })
    }

    fn server() -> Result<Conn> {
        let mut child = spawn_echo_server()?;
        let w = child.stdin.take().context("stdin")?;
        let r = child.stdout.take().context("stdout")?;
        Ok(Conn {
            r: BufReader::with_capacity(64 * 1024, Box::new(r)),
            w: Box::new(w),
            child: Some(child),
            line: Vec::with_capacity(4096),
            next_id: 1,
        })
    }

    /// Through `bench mcp-relay` listening at `path` (its own child).
    fn relay(path: &Path) -> Result<Conn> {
        let mut child = Command::new(std::env::current_exe()?)
            .args(["bench", "mcp-relay", "--socket"])
            .arg(path)
            .spawn()
            .context("start the relay")?;
        let t0 = Instant::now();
        let s = loop {
            match UnixStream::connect(path) {
                Ok(s) => break s,
                Err(e) if t0.elapsed() > Duration::from_secs(10) => {
                    // Not left waiting for a connection that will not come.
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(e).with_context(|| format!("connect {}", path.display()));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        };
        Conn::stream(s, Some(child))
    }

    fn send(&mut self, req: &[u8]) -> Result<()> {
        self.w.write_all(req)?;
        Ok(())
    }

    fn recv(&mut self) -> Result<&[u8]> {
        self.line.clear();
        if self.r.read_until(b'\n', &mut self.line)? == 0 {
            bail!("the peer closed the connection");
        }
        Ok(&self.line)
    }

    /// One request → its response (as JSON).
    fn rpc(&mut self, method: &str, params: Value) -> Result<Value> {
        let id = self.next_id;
        self.next_id += 1;
        let mut req =
            json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string();
        req.push('\n');
        self.send(req.as_bytes())?;
        let v: Value = serde_json::from_slice(self.recv()?)?;
        if v.get("error").is_some() {
            bail!("{method}: {v}");
        }
        Ok(v["result"].clone())
    }

    fn handshake(&mut self, tool: Option<&str>) -> Result<()> {
        self.rpc(
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "xtask-bench", "version": "0"}}),
        )?;
        self.send(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n")?;
        if let Some(tool) = tool {
            // Also starts the agent's tool server in the daemon.
            let list = self.rpc("tools/list", json!({}))?;
            let names: Vec<&str> = list["tools"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|t| t["name"].as_str())
                .collect();
            if !names.contains(&tool) {
                bail!("tool {tool} is not listed: {names:?}");
            }
        }
        Ok(())
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Ping,
    Call,
    Written,
    Denied,
    Echo,
}

fn parse_modes(s: &str) -> Result<Vec<Mode>> {
    s.split(',')
        .map(|m| match m.trim() {
            "ping" => Ok(Mode::Ping),
            "call" => Ok(Mode::Call),
            "written" => Ok(Mode::Written),
            "denied" => Ok(Mode::Denied),
            "echo" => Ok(Mode::Echo),
            other => bail!("unknown mode {other:?} (ping, call, written, denied, echo)"),
        })
        .collect()
}

fn mode_name(m: Mode) -> &'static str {
    match m {
        Mode::Ping => "ping",
        Mode::Call => "call",
        Mode::Written => "written",
        Mode::Denied => "denied",
        Mode::Echo => "echo",
    }
}

/// One timed round trip of `mode`; returns the nanoseconds.
fn round_trip(c: &mut Conn, mode: Mode, tool: &str, buf: &mut String) -> Result<u32> {
    use std::fmt::Write as _;
    let id = c.next_id;
    c.next_id += 1;
    buf.clear();
    match mode {
        Mode::Ping | Mode::Echo => {
            let _ = write!(buf, r#"{{"jsonrpc":"2.0","id":{id},"method":"ping"}}"#);
        }
        Mode::Call | Mode::Written => {
            let tool = if mode == Mode::Written {
                WRITTEN_TOOL
            } else {
                tool
            };
            let _ = write!(
                buf,
                r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{tool}","arguments":{{"text":"hello"}}}}}}"#
            );
        }
        Mode::Denied => {
            let _ = write!(
                buf,
                r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{DENIED_TOOL}","arguments":{{}}}}}}"#
            );
        }
    }
    buf.push('\n');
    let t0 = mono_ns();
    c.send(buf.as_bytes())?;
    let reply = c.recv()?;
    let dt = mono_ns() - t0;
    // Check every answer (outside the timed part).
    if mode == Mode::Echo {
        if reply != buf.as_bytes() {
            bail!("the echo differs: {}", String::from_utf8_lossy(reply));
        }
    } else {
        let v: Value = serde_json::from_slice(reply)
            .with_context(|| format!("reply {}", String::from_utf8_lossy(reply)))?;
        let ok = v["id"] == json!(id)
            && match mode {
                Mode::Denied => v["error"]["code"] == json!(-32001),
                _ => v.get("result").is_some() && v["result"]["isError"] != json!(true),
            };
        if !ok {
            bail!("unexpected reply to {}: {v}", mode_name(mode));
        }
    }
    Ok(dt.min(u32::MAX as u64) as u32)
}

/// Sleep until `CLOCK_MONOTONIC` reaches `at_ns`.
fn sleep_until(at_ns: u64) {
    while mono_ns() < at_ns {
        std::thread::sleep(Duration::from_micros(
            (at_ns.saturating_sub(mono_ns()) / 1000).clamp(1, 10_000),
        ));
    }
}

fn write_samples(prefix: &Path, name: &str, samples: &[u32]) -> Result<()> {
    let mut bytes = Vec::with_capacity(samples.len() * 4);
    for s in samples {
        bytes.extend_from_slice(&s.to_le_bytes());
    }
    let p = PathBuf::from(format!("{}-{name}.bin", prefix.display()));
    let tmp = p.with_extension("tmp");
    std::fs::write(&tmp, bytes).with_context(|| format!("{}", tmp.display()))?;
    std::fs::rename(&tmp, &p)?;
    Ok(())
}

/// `bench mcp-client`.
pub fn client(a: ClientArgs) -> Result<()> {
    let modes = parse_modes(&a.modes)?;
    let mut c = if a.spawn_server {
        Conn::server()?
    } else if let Some(p) = &a.relay {
        Conn::relay(p)?
    } else {
        Conn::socket(a.socket.as_deref())?
    };
    let needs_tool = modes.contains(&Mode::Call);
    if !modes.contains(&Mode::Echo) {
        c.handshake(needs_tool.then_some(a.tool.as_str()))?;
    }
    let mut buf = String::with_capacity(256);
    for &m in &modes {
        for _ in 0..a.warmup {
            round_trip(&mut c, m, &a.tool, &mut buf)?;
        }
    }
    match &a.flood {
        None => {
            for &m in &modes {
                let mut samples = Vec::with_capacity(a.calls);
                for _ in 0..a.calls {
                    samples.push(round_trip(&mut c, m, &a.tool, &mut buf)?);
                }
                write_samples(&a.out, mode_name(m), &samples)?;
            }
        }
        Some(dir) => {
            touch(&a.out, "ready", "")?;
            let go = dir.join("go");
            let text = loop {
                if let Ok(t) = std::fs::read_to_string(&go)
                    && t.ends_with('\n')
                {
                    break t;
                }
                std::thread::sleep(Duration::from_millis(10));
            };
            let v: Vec<u64> = text
                .split_whitespace()
                .map(str::parse)
                .collect::<Result<_, _>>()
                .context("go file")?;
            let [start, phase, gap] = v[..] else {
                bail!("go file: {text:?}");
            };
            let runs = (0..a.phases).flat_map(|p| modes.iter().map(move |m| (p, *m)));
            for (i, (p, m)) in runs.enumerate() {
                let begin = start + i as u64 * (phase + gap);
                let end = begin + phase;
                sleep_until(begin);
                let mut samples = Vec::with_capacity(1 << 16);
                let mut next = begin;
                while mono_ns() < end {
                    samples.push(round_trip(&mut c, m, &a.tool, &mut buf)?);
                    if a.interval_us > 0 {
                        next += a.interval_us * 1000;
                        sleep_until(next);
                    }
                }
                let name = if a.phases > 1 {
                    format!("{}-{p}", mode_name(m))
                } else {
                    mode_name(m).to_string()
                };
                write_samples(&a.out, &name, &samples)?;
            }
        }
    }
    touch(&a.out, "done", "")?;
    if let Some(mut child) = c.child.take() {
        drop(c);
        let _ = child.wait();
    }
    Ok(())
}

fn floor_server(path: &Path) -> Result<()> {
    let l = UnixListener::bind(path).with_context(|| format!("bind {}", path.display()))?;
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { continue };
            std::thread::spawn(move || {
                let Ok(mut w) = s.try_clone() else { return };
                let mut r = BufReader::with_capacity(64 * 1024, s);
                let mut line = Vec::with_capacity(4096);
                loop {
                    line.clear();
                    match r.read_until(b'\n', &mut line) {
                        Ok(0) | Err(_) => return,
                        Ok(_) => {
                            if w.write_all(&line).is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    Ok(())
}

/// The `bench` tool's manifest: this binary's echo server, from the layout's bin/.
pub(super) fn echo_manifest(l: &Layout) -> String {
    ECHO_MANIFEST
        .replace("EXE", &l.exe.display().to_string())
        .replace("BIN", &l.bin.display().to_string())
}

const ECHO_MANIFEST: &str = r#"apiVersion: agentos/v0.2
kind: Tool
name: bench
description: The benchmark's echo server (xtask bench mcp-echo-server); answers at once.
risk: low
timeout_ms: 10000
mcp:
  command: EXE
  args: [bench, mcp-echo-server]
  startup_timeout_ms: 20000
sandbox:
  runtime: [BIN]
"#;

const DENIED_MANIFEST: &str = r#"apiVersion: agentos/v0.2
kind: Tool
name: denied.noop
description: Installed, granted to nobody (the benchmark's refused call).
risk: low
exec:
  command: /bin/true
input_schema: {type: object}
"#;

pub fn run(a: McpArgs) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("bench mcp needs root (cgroups, agents with their own uids)");
    }
    if a.rounds == 0 || a.calls < a.rounds {
        bail!("--calls must be at least --rounds");
    }
    let mount = agentosd::cgroup::cgroup2_mount().context("no cgroup2 mount")?;
    let bin_dir = match &a.bin_dir {
        Some(d) => d.clone(),
        None => build_bins()?,
    };
    for b in ["agentosd", "agentctl"] {
        if !bin_dir.join(b).exists() {
            bail!("{} is missing", bin_dir.join(b).display());
        }
    }
    let dir = a.dir.clone().unwrap_or_else(|| {
        PathBuf::from(format!("/var/tmp/agentos-bench-mcp-{}", std::process::id()))
    });
    std::fs::create_dir_all(&dir)?;
    let dir = std::fs::canonicalize(&dir)?;
    chmod(&dir, 0o755)?;
    let cgroup_root = mount.join(format!("agentos-bench-mcp-{}", std::process::id()));
    let audit_created = a.audit_dir.as_ref().is_some_and(|d| !d.exists());
    let mut procs = Procs(Vec::new());
    let result = bench(&a, &dir, &bin_dir, &cgroup_root, &mut procs);
    // The daemon (SIGTERM: it stops its agents and tool servers), the bus, our cgroup tree.
    teardown(procs, &cgroup_root);
    if a.keep {
        eprintln!("bench mcp: kept {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&dir);
        if let (true, Some(d)) = (audit_created, &a.audit_dir) {
            let _ = std::fs::remove_dir_all(d);
        }
    }
    result
}

fn bench(
    a: &McpArgs,
    dir: &Path,
    bin_dir: &Path,
    cgroup_root: &Path,
    procs: &mut Procs,
) -> Result<()> {
    let state = dir.join("state");
    let audit_dir = a.audit_dir.clone().unwrap_or_else(|| state.join("audit"));
    std::fs::create_dir_all(&audit_dir)?;
    let fs = filesystem_of(&audit_dir);
    let load_before = loadavg();
    // Layout. Agents (their own uids) must reach bin/ and ctl/.
    let l = Layout::new(dir)?;
    let tools = dir.join("tools.d");
    std::fs::create_dir_all(&tools)?;
    chmod(&tools, 0o755)?;
    let (exe, out, state) = (l.exe.clone(), l.out.clone(), l.state.clone());
    std::fs::write(tools.join("bench.yaml"), echo_manifest(&l))?;
    std::fs::write(
        tools.join("benchw.yaml"),
        ECHO_MANIFEST
            .replace("name: bench\n", "name: benchw\ndurability: written\n")
            .replace("EXE", &exe.display().to_string())
            .replace("BIN", &l.bin.display().to_string()),
    )?;
    std::fs::write(tools.join("denied.yaml"), DENIED_MANIFEST)?;
    let env = Env::launch(
        &l,
        bin_dir,
        cgroup_root,
        &audit_dir,
        // The sequential part sends one agent's requests back to back (about 27 000 pings a
        // second), over the daemon's default rate per agent (16 MiB/s with 1 KiB a line, about
        // 15 000 small requests a second, docs/ipc.md "The rate"): the bench measures the
        // path, not the rate, so it runs without one.
        &[
            "--tools-dir".into(),
            tools.into_os_string(),
            "--ipc-agent-rate".into(),
            "0".into(),
        ]
        .into_iter()
        .chain(a.daemon_args.iter().map(Into::into))
        .collect::<Vec<std::ffi::OsString>>(),
        procs,
    )?;
    let daemon_pid = env.daemon_pid;
    eprintln!(
        "bench mcp: agentosd pid {daemon_pid}, state {} ({fs}), cgroup {}, daemon args {:?}",
        state.display(),
        env.cgroup_root.display(),
        a.daemon_args
    );

    // ---- Sequential paths, interleaved by rounds.
    let per = a.calls / a.rounds;
    let names = [
        "floor",
        "pipe",
        "ping",
        "call",
        "denied",
        "dbus",
        "fdatasync",
        "written",
        "relay",
    ];
    let mut samples: Vec<Vec<u64>> = vec![Vec::new(); names.len()];
    let floor_sock = dir.join("floor.sock");
    floor_server(&floor_sock)?;
    let threads_before = env.daemon_threads();
    let seq_t0 = Instant::now();
    // Times the sequential agents were held by their CPU share, and for how long (ms).
    let mut seq_held = (0u64, 0u64);
    let client_args = |modes: &str, prefix: &Path| -> Vec<String> {
        [
            "bench",
            "mcp-client",
            "--modes",
            modes,
            "--calls",
            &per.to_string(),
            "--warmup",
            &a.warmup.to_string(),
            "--out",
            &prefix.display().to_string(),
        ]
        .map(String::from)
        .to_vec()
    };
    for r in 0..a.rounds {
        eprintln!(
            "bench mcp: round {}/{} ({per} round trips per path)…",
            r + 1,
            a.rounds
        );
        // One client run outside the daemon: `path` names its files, `mode` is its one mode.
        let outside = |path: &str, mode: &str, extra: &[String]| -> Result<Vec<u64>> {
            let p = out.join(format!("{path}-{r}"));
            let mut args = client_args(mode, &p);
            args.extend(extra.iter().cloned());
            let st = Command::new(&exe).args(&args).status()?;
            if !st.success() {
                bail!("{path} client failed ({st})");
            }
            Ok(read_samples(&out.join(format!("{path}-{r}-{mode}.bin")))?
                .iter()
                .map(|&x| x as u64)
                .collect())
        };
        let tool = ["--tool".to_string(), "echo".into()];
        // Floor.
        samples[0].extend(outside(
            "floor",
            "echo",
            &["--socket".into(), floor_sock.display().to_string()],
        )?);
        // The tool server over a pipe.
        samples[1].extend(outside(
            "pipe",
            "call",
            &[["--spawn-server".to_string()].as_slice(), &tool].concat(),
        )?);
        // The same tool server through a line relay: a proxy's hand-offs, none of its work.
        let relay = [
            "--relay".to_string(),
            out.join("relay.sock").display().to_string(),
        ];
        samples[8].extend(outside(
            "relay",
            "call",
            &[relay.as_slice(), &tool].concat(),
        )?);
        // The agent: ping, tools/call, refused tools/call.
        let name = format!("seq-{r}");
        let home_out = env.home(&name).join("out");
        // $HOME is only known inside the agent; the path is the same.
        let args = client_args("ping,call,denied,written", &home_out);
        env.start_agent_with(&name, &args, &["bench", "benchw"], "")?;
        env.wait_for(std::slice::from_ref(&name), "done", 3600)?;
        // Its calls come as fast as the daemon answers: by the daemon's account a flood, which
        // its CPU share (`--ipc-agent-cpu`, over the ceiling) may hold; those waits are in its
        // tail, so they are counted and said.
        let c = env.daemon_cpu_account(&name);
        seq_held.0 += c["throttles"].as_u64().unwrap_or(0);
        seq_held.1 += c["throttled_ms"].as_u64().unwrap_or(0);
        for (i, m) in [(2, "ping"), (3, "call"), (4, "denied"), (7, "written")] {
            samples[i].extend(
                read_samples(&env.home(&name).join(format!("out-{m}.bin")))?
                    .iter()
                    .map(|&x| x as u64),
            );
        }
        // D-Bus.
        for _ in 0..a.warmup.min(per) {
            env.list_timed()?;
        }
        for _ in 0..per {
            samples[5].push(env.list_timed()?);
        }
        // The disk.
        samples[6].extend(fdatasync_floor(&audit_dir, a.syncs / a.rounds)?);
    }
    let seq_secs = seq_t0.elapsed().as_secs_f64();
    let threads_after = env.daemon_threads();
    let dists: Vec<Dist> = samples.into_iter().map(Dist::new).collect();

    // ---- The flood.
    let mut flood_json = Value::Null;
    let mut flood_rows = Vec::new();
    let mut resp_rows = Vec::new();
    let mut flood_threads = Vec::new();
    if a.agents > 0 {
        eprintln!("bench mcp: starting {} flooding agents…", a.agents);
        let names: Vec<String> = (0..a.agents).map(|i| format!("flood-{i:03}")).collect();
        for n in &names {
            let home_out = env.home(n).join("out");
            let args: Vec<String> = [
                "bench",
                "mcp-client",
                "--modes",
                "ping,call",
                "--warmup",
                "20",
                "--out",
                &home_out.display().to_string(),
                "--flood",
                &env.ctl_dir.display().to_string(),
            ]
            .map(String::from)
            .to_vec();
            match &a.agent_cpu {
                Some(cpu) => env.start_agent_with(
                    n,
                    &args,
                    &["bench"],
                    &format!("compute: {{ cpu: {cpu:?} }}\n"),
                )?,
                None => env.start_agent(n, &args)?,
            }
        }
        env.wait_for(&names, "ready", 300)?;
        let agent_cpu = agent_cgroup_cpu(&env.cgroup_root, &names[0]);
        eprintln!("bench mcp: {agent_cpu}");
        // Idle baseline: every agent started, connected, its tool server up, waiting.
        let mut idle = (Vec::new(), Vec::new());
        for _ in 0..20 {
            idle.0.push(env.list_timed()?);
            idle.1.push(env.agentctl_list_timed()?);
            std::thread::sleep(Duration::from_millis(100));
        }
        let phase = a.flood_secs * 1_000_000_000;
        let gap = 1_000_000_000;
        let start = mono_ns() + 500_000_000;
        let go = env.ctl_dir.join("go");
        std::fs::write(go.with_extension("tmp"), format!("{start} {phase} {gap}\n"))?;
        std::fs::rename(go.with_extension("tmp"), &go)?;
        eprintln!(
            "bench mcp: flood: {} s of ping, then {} s of tools/call…",
            a.flood_secs, a.flood_secs
        );
        let mut during = [(Vec::new(), Vec::new()), (Vec::new(), Vec::new())];
        let mut load = [String::new(), String::new()];
        for (i, d) in during.iter_mut().enumerate() {
            let begin = start + i as u64 * (phase + gap);
            let end = begin + phase;
            while mono_ns() < begin {
                std::thread::sleep(Duration::from_millis(1));
            }
            let before = env.daemon_threads();
            let mut tick = begin + 50_000_000;
            while tick < end {
                while mono_ns() < tick {
                    std::thread::sleep(Duration::from_millis(1));
                }
                d.0.push(env.list_timed()?);
                d.1.push(env.agentctl_list_timed()?);
                tick += 100_000_000;
                while tick < mono_ns() {
                    tick += 100_000_000;
                }
            }
            while mono_ns() < end {
                std::thread::sleep(Duration::from_millis(1));
            }
            flood_threads.push(thread_delta(&before, &env.daemon_threads()));
            load[i] = loadavg();
        }
        env.wait_for(&names, "done", 120)?;
        let mut pj = Vec::new();
        for (i, m) in ["ping", "call"].iter().enumerate() {
            let mut all = Vec::new();
            let mut per_agent = Vec::new();
            for n in &names {
                let s = read_samples(&env.home(n).join(format!("out-{m}.bin")))?;
                per_agent.push(s.len() as u64);
                all.extend(s.iter().map(|&x| x as u64));
            }
            let total = all.len() as u64;
            let d = Dist::new(all);
            let pa = Dist::new(per_agent);
            let rate = total as f64 / a.flood_secs as f64;
            let cpu: u64 = flood_threads[i].iter().map(|t| t.1).sum();
            flood_rows.push(format!(
                "| {} | {} | {total} | **{rate:.0}** | {} | {} | {} | {} | {} / {} / {} | {:.0}% |",
                if i == 0 {
                    "ping"
                } else {
                    "tools/call (gate + durable audit + tool)"
                },
                a.agents,
                us(d.p(500)),
                us(d.p(990)),
                us(d.p(999)),
                us(d.max()),
                pa.0.first().copied().unwrap_or(0),
                pa.p(500),
                pa.max(),
                cpu as f64 / clk_tck() / a.flood_secs as f64 * 100.0,
            ));
            pj.push(json!({"phase": m, "calls": total, "calls_per_s": rate, "latency": d.json(),
                "per_agent_min": pa.0.first(), "per_agent_median": pa.p(500), "per_agent_max": pa.max(),
                "loadavg_after": load[i], "daemon_threads_ticks": flood_threads[i]}));
        }
        let mut rj = Vec::new();
        for (label, (l, c)) in [
            (format!("{} agents started, idle", a.agents), idle),
            (
                format!("{} agents flooding ping", a.agents),
                during[0].clone(),
            ),
            (
                format!("{} agents flooding tools/call", a.agents),
                during[1].clone(),
            ),
        ] {
            let (l, c) = (Dist::new(l), Dist::new(c));
            resp_rows.push(format!(
                "| {label} | {} | {} / {} / {} | {} / {} / {} |",
                c.0.len(),
                ms(l.p(500)),
                ms(l.p(990)),
                ms(l.max()),
                ms(c.p(500)),
                ms(c.p(990)),
                ms(c.max())
            ));
            rj.push(json!({"while": label, "list_agents": l.json(), "agentctl_list": c.json()}));
        }
        flood_json = json!({"agents": a.agents, "secs": a.flood_secs, "phases": pj, "responsiveness": rj,
                "agent_cpu": a.agent_cpu, "agent_cgroup_cpu": agent_cpu});
    }
    let load_after = loadavg();

    // ---- Report.
    let labels = [
        "floor: Unix-socket line echo, no daemon",
        "tool server over a pipe, no daemon (tools/call)",
        "`ping` via agentosd (agent → socket → session → reply)",
        "**`tools/call` via agentosd** (gate + durable audit + proxied tool)",
        "`tools/call` refused by the gate (not granted; record queued, not awaited)",
        "D-Bus: `ListAgents` via dbus-daemon (zbus)",
        "disk: append 338 B + `fdatasync`",
        "**`tools/call` via agentosd, `durability: written`** (allow record written, synced by the group commit without waiting)",
        "tool server through a line relay, no daemon (tools/call; the floor of any proxy)",
    ];
    let floor = &dists[0];
    println!(
        "\nMCP round trips, one request in flight: {per} per path and round × {} rounds (interleaved), {} warm-up per client\n\
         audit log: {} ({fs}); loadavg before {load_before}, after {load_after}; sequential part {seq_secs:.0} s\n",
        a.rounds,
        a.warmup,
        audit_dir.display()
    );
    println!(
        "| path | n | p50 µs | p99 µs | p99.9 µs | max µs | mean µs | p50 ÷ floor | p99 ÷ floor |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (i, d) in dists.iter().enumerate() {
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {:.1}× | {:.1}× |",
            labels[i],
            d.0.len(),
            us(d.p(500)),
            us(d.p(990)),
            us(d.p(999)),
            us(d.max()),
            us(d.mean()),
            d.p(500) as f64 / floor.p(500).max(1) as f64,
            d.p(990) as f64 / floor.p(990).max(1) as f64,
        );
    }
    let (pipe, ping, call, denied) = (&dists[1], &dists[2], &dists[3], &dists[4]);
    let (written, relay) = (&dists[7], &dists[8]);
    // (`call` − ping) − (`outside` − floor) at per mille `pm`: what a tool call adds over a ping,
    // less what the same tool costs outside the daemon over the floor.
    let added = |call: &Dist, outside: &Dist, pm: usize| {
        call.p(pm) as i64 - ping.p(pm) as i64 - outside.p(pm) as i64 + floor.p(pm) as i64
    };
    let gate = |pm: usize| added(call, pipe, pm);
    // What the daemon adds beyond any proxy's own hand-offs to the tool server and back.
    let beyond_relay = |pm: usize| added(call, relay, pm);
    let gate_w = |pm: usize| added(written, pipe, pm);
    println!("\nDifferences of the distributions above (percentile minus percentile):\n");
    println!("| difference | p50 µs | p99 µs |");
    println!("|---|---:|---:|");
    // A row of the differences: two distributions' percentiles, or a computed difference (ns).
    let diff = |label: &str, a: &Dist, b: &Dist| {
        println!(
            "| {label} | {} | {} |",
            sdiff(a.p(500), b.p(500)),
            sdiff(a.p(990), b.p(990))
        )
    };
    let bold = |label: &str, f: &dyn Fn(usize) -> i64| {
        println!(
            "| {label} | **{:+.1}** | **{:+.1}** |",
            f(500) as f64 / 1000.0,
            f(990) as f64 / 1000.0
        )
    };
    diff(
        "ping via agentosd − floor (the daemon's socket + session, no gate)",
        ping,
        floor,
    );
    diff(
        "tools/call via agentosd − tool server over a pipe (all the daemon adds)",
        call,
        pipe,
    );
    bold(
        "**gate + audit + proxy** = (tools/call − ping via agentosd) − (pipe − floor)",
        &gate,
    );
    bold(
        "**gate + audit + proxy, `durability: written`** = (written tools/call − ping) − (pipe − floor)",
        &gate_w,
    );
    let sync = &dists[6];
    println!(
        "| gate + audit + proxy − one fdatasync (sync level; the goal: ≤ 30 / ≤ 50) | {:+.1} | {:+.1} |",
        (gate(500) - sync.p(500) as i64) as f64 / 1000.0,
        (gate(990) - sync.p(990) as i64) as f64 / 1000.0
    );
    diff(
        "relay − floor (a proxy's own hand-offs: to the tool server and back, no work)",
        relay,
        floor,
    );
    bold(
        "**gate + audit beyond a proxy's hand-offs** = (tools/call − ping via agentosd) − (relay − floor)",
        &beyond_relay,
    );
    diff(
        "refused − ping via agentosd (gate decision + queued record, no sync)",
        denied,
        ping,
    );
    let met = gate(990) < 50_000;
    println!(
        "\nGoal gate + audit overhead p99 < 50 µs: {} ({:.1} µs)",
        if met { "met" } else { "NOT met" },
        gate(990) as f64 / 1000.0
    );
    println!(
        "Gate + audit beyond a proxy's own hand-offs (the relay's), the goal's ≤ 30 µs p50 / ≤ 50 µs p99: {} ({:+.1} / {:+.1} µs)",
        if beyond_relay(500) <= 30_000 && beyond_relay(990) <= 50_000 {
            "met"
        } else {
            "NOT met"
        },
        beyond_relay(500) as f64 / 1000.0,
        beyond_relay(990) as f64 / 1000.0
    );
    println!(
        "the sequential agent held by its CPU share (--ipc-agent-cpu; alone, its calls back to back are over the ceiling): {} times, {} ms in all{}",
        seq_held.0,
        seq_held.1,
        if seq_held.0 > 0 {
            " — those waits (10 ms ticks) are in the agent's tails above; `--daemon-arg=--ipc-agent-cpu=0` measures without them"
        } else {
            ""
        }
    );
    let seq_threads = thread_delta(&threads_before, &threads_after);
    println!(
        "daemon CPU during the sequential part, by thread (s): {}",
        fmt_threads(&seq_threads)
    );
    if !flood_rows.is_empty() {
        println!(
            "\n{} agents, each one request in flight, {} s per phase:\n",
            a.agents, a.flood_secs
        );
        println!(
            "| phase | agents | calls | calls/s | p50 µs | p99 µs | p99.9 µs | max µs | calls per agent min / median / max | daemon CPU (of one core) |"
        );
        println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        for r in &flood_rows {
            println!("{r}");
        }
        for (i, t) in flood_threads.iter().enumerate() {
            println!(
                "daemon CPU in the {} phase, by thread (s): {}",
                ["ping", "tools/call"][i],
                fmt_threads(t)
            );
        }
        println!("\nThe daemon answering operators meanwhile (every 100 ms):\n");
        println!(
            "| while | samples | `ListAgents` p50 / p99 / max ms | `agentctl list` (process) p50 / p99 / max ms |"
        );
        println!("|---|---:|---:|---:|");
        for r in &resp_rows {
            println!("{r}");
        }
        let worst = flood_json["responsiveness"]
            .as_array()
            .into_iter()
            .flatten()
            .skip(1)
            .map(|r| r["agentctl_list"]["max_ns"].as_u64().unwrap_or(0))
            .max()
            .unwrap_or(0);
        println!(
            "\nGoal `agentctl list` within 50 ms while {} agents flood: {} (worst {} ms)",
            a.agents,
            if worst < 50_000_000 { "met" } else { "NOT met" },
            ms(worst)
        );
    }
    if let Some(p) = &a.json {
        let seq: Vec<Value> = names
            .iter()
            .zip(&dists)
            .map(|(n, d)| json!({"path": n, "latency": d.json()}))
            .collect();
        std::fs::write(
            p,
            serde_json::to_vec_pretty(&json!({
                "calls": a.calls, "rounds": a.rounds, "warmup": a.warmup,
                "filesystem": fs, "loadavg_before": load_before, "loadavg_after": load_after,
                "sequential": seq, "gate_audit_p50_ns": gate(500), "gate_audit_p99_ns": gate(990),
                "gate_audit_beyond_relay_p50_ns": beyond_relay(500), "gate_audit_beyond_relay_p99_ns": beyond_relay(990),
                "daemon_threads_sequential_ticks": seq_threads, "flood": flood_json,
                "sequential_cpu_holds": seq_held.0, "sequential_cpu_held_ms": seq_held.1,
            }))?,
        )?;
    }
    Ok(())
}

/// What the cpu controller does for agent `name`: its cgroup (found below `root`), its
/// `cpu.max` and `cpu.weight`, and the controllers its parent enables (none of these files exist
/// without the cpu controller, as on a host without it).
fn agent_cgroup_cpu(root: &Path, name: &str) -> String {
    fn find(dir: &Path, name: &str, depth: usize) -> Option<PathBuf> {
        let rd = std::fs::read_dir(dir).ok()?;
        let subdirs: Vec<PathBuf> = rd
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.path())
            .collect();
        if let Some(p) = subdirs
            .iter()
            .find(|p| p.file_name().is_some_and(|f| f == name))
        {
            return Some(p.clone());
        }
        if depth == 0 {
            return None;
        }
        subdirs.iter().find_map(|p| find(p, name, depth - 1))
    }
    let Some(cg) = find(root, name, 4) else {
        return format!("agent {name}: no cgroup named so below {}", root.display());
    };
    let read = |p: &Path, f: &str| {
        std::fs::read_to_string(p.join(f))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "(absent)".into())
    };
    format!(
        "agent {name}: cgroup {}: cpu.max={}, cpu.weight={}; parent's subtree_control: {}",
        cg.display(),
        read(&cg, "cpu.max"),
        read(&cg, "cpu.weight"),
        cg.parent()
            .map_or("?".into(), |p| read(p, "cgroup.subtree_control"))
    )
}
