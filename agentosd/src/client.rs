//! `agentctl`: the operator's client of the D-Bus API. Each command is a function returning the
//! process exit code (see [`exit`]); the binary only parses arguments.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use zbus::Connection;
use zbus::OwnedObjectPath;

use crate::dbus::{MANAGER_IFACE, MANAGER_PATH, SERVICE};

/// agentctl exit codes (documented in docs/cli.md).
pub mod exit {
    /// Success.
    pub const OK: i32 = 0;
    /// The operation failed (the daemon refused it or it did not work).
    pub const FAILED: i32 = 1;
    /// Bad usage (clap's code for argument errors).
    pub const USAGE: i32 = 2;
    /// No such agent.
    pub const NOT_FOUND: i32 = 3;
    /// The daemon cannot be reached (no bus, or nobody owns org.agentos1).
    pub const UNREACHABLE: i32 = 4;
}

/// A failed client call: message for stderr and exit code.
#[derive(Debug)]
pub struct CliError {
    pub code: i32,
    pub message: String,
}

impl CliError {
    fn new(code: i32, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

type Result<T> = std::result::Result<T, CliError>;

fn classify(e: zbus::Error) -> CliError {
    match &e {
        zbus::Error::MethodError(name, detail, _) => {
            let name = name.as_str();
            let short = name.strip_prefix("org.agentos1.Error.").unwrap_or(name);
            let msg = detail.clone().unwrap_or_else(|| name.to_string());
            let msg = if short == "AccessDenied" {
                format!("access denied ({name}): {msg}")
            } else {
                msg
            };
            let code = match short {
                "NoSuchAgent" => exit::NOT_FOUND,
                "org.freedesktop.DBus.Error.ServiceUnknown"
                | "org.freedesktop.DBus.Error.NameHasNoOwner" => exit::UNREACHABLE,
                _ => exit::FAILED,
            };
            CliError::new(code, msg)
        }
        zbus::Error::FDO(f) => match f.as_ref() {
            zbus::fdo::Error::ServiceUnknown(_) | zbus::fdo::Error::NameHasNoOwner(_) => {
                CliError::new(
                    exit::UNREACHABLE,
                    format!("agentosd is not running on this bus (nobody owns {SERVICE})"),
                )
            }
            zbus::fdo::Error::NoReply(_) | zbus::fdo::Error::Timeout(_) => {
                CliError::new(exit::UNREACHABLE, format!("agentosd did not answer: {f}"))
            }
            zbus::fdo::Error::AccessDenied(m) => CliError::new(
                exit::FAILED,
                format!("access denied (org.freedesktop.DBus.Error.AccessDenied): {m}"),
            ),
            other => CliError::new(exit::FAILED, other.to_string()),
        },
        zbus::Error::InputOutput(io) if io.kind() == std::io::ErrorKind::TimedOut => CliError::new(
            exit::UNREACHABLE,
            "agentosd did not answer in time (--timeout, 25 s unless set; 0 waits forever): \
             it may be overloaded or stuck; see `journalctl -u agentosd`"
                .to_string(),
        ),
        zbus::Error::InputOutput(_)
        | zbus::Error::Address(_)
        | zbus::Error::Handshake(_)
        | zbus::Error::Failure(_) => CliError::new(
            exit::UNREACHABLE,
            format!("cannot reach the D-Bus: {e} (set --bus-address or AGENTOS_BUS_ADDRESS)"),
        ),
        _ => CliError::new(exit::FAILED, e.to_string()),
    }
}

/// A connection to the daemon.
pub struct Client {
    conn: Connection,
}

impl Client {
    /// Connect to `address`, else `$AGENTOS_BUS_ADDRESS`, else the system bus. Every method call
    /// fails after `timeout` without an answer (`None`: waits forever), like busctl's
    /// `--timeout`, so a stuck daemon is reported rather than waited for.
    pub async fn connect(
        address: Option<&str>,
        timeout: Option<std::time::Duration>,
    ) -> Result<Self> {
        let addr = address.map(str::to_string).or_else(|| {
            std::env::var("AGENTOS_BUS_ADDRESS")
                .ok()
                .filter(|s| !s.is_empty())
        });
        let builder = match &addr {
            Some(a) => zbus::connection::Builder::address(a.as_str()),
            None => zbus::connection::Builder::system(),
        };
        let builder = match timeout {
            Some(t) => builder.method_timeout(t),
            None => builder,
        };
        let conn = builder.build().await.map_err(|e| {
            CliError::new(
                exit::UNREACHABLE,
                format!(
                    "cannot connect to {}: {e} (is the bus running? set --bus-address or AGENTOS_BUS_ADDRESS)",
                    addr.as_deref().unwrap_or("the system bus")
                ),
            )
        })?;
        Ok(Client { conn })
    }

    async fn call<B, R>(&self, method: &str, body: &B) -> Result<R>
    where
        B: serde::Serialize + zbus::zvariant::DynamicType,
        R: for<'d> zbus::zvariant::DynamicDeserialize<'d>,
    {
        let reply = self
            .conn
            .call_method(
                Some(SERVICE),
                MANAGER_PATH,
                Some(MANAGER_IFACE),
                method,
                body,
            )
            .await
            .map_err(classify)?;
        reply
            .body()
            .deserialize::<R>()
            .map_err(|e| CliError::new(exit::FAILED, format!("bad reply to {method}: {e}")))
    }

    async fn call0<B>(&self, method: &str, body: &B) -> Result<()>
    where
        B: serde::Serialize + zbus::zvariant::DynamicType,
    {
        self.conn
            .call_method(
                Some(SERVICE),
                MANAGER_PATH,
                Some(MANAGER_IFACE),
                method,
                body,
            )
            .await
            .map_err(classify)?;
        Ok(())
    }
}

/// One row of `agentctl list --json`.
#[derive(Debug, Clone, serde::Serialize, Deserialize)]
pub struct ListRow {
    pub id: String,
    pub name: String,
    pub tenant: String,
    pub state: String,
    pub result: String,
    pub latency_class: String,
    pub main_pid: u32,
    pub object_path: String,
}

type RawRow = (
    String,
    String,
    String,
    String,
    String,
    String,
    u32,
    OwnedObjectPath,
);

/// What `DescribeAgent` returns (see `supervisor::AgentStatus`).
#[derive(Debug, Clone, serde::Serialize, Deserialize)]
pub struct Status {
    pub id: String,
    pub name: String,
    pub tenant: String,
    pub state: String,
    pub result: String,
    pub main_pid: u32,
    pub control_group: String,
    pub latency_class: String,
    pub cpu_usage_nsec: Option<u64>,
    pub memory_current: Option<u64>,
    pub tasks_current: u64,
    pub restarts: u32,
    pub restart_policy: String,
    pub started_at_us: u64,
    pub exit_status: String,
    pub unenforced_budgets: Vec<String>,
    pub notes: Vec<String>,
    /// HRT only: deadline overruns seen (absent from older daemons).
    #[serde(default)]
    pub deadline_misses: Option<u64>,
    /// Kernel denials since the daemon started (absent from older daemons).
    #[serde(default)]
    pub denials: u64,
    /// Syscalls of the current (or last) run; absent unless the daemon counts them.
    #[serde(default)]
    pub syscalls: Option<u64>,
    pub log_path: String,
    pub origin: String,
    pub enabled: bool,
    pub object_path: String,
    pub command: String,
    pub processes: Vec<(u32, u32, String)>,
}

fn fail(out: &mut dyn Write, e: CliError) -> i32 {
    let _ = out.flush();
    // Errors can carry agent-chosen strings (names, process titles, log paths).
    eprintln!("agentctl: {}", esc_lines(&e.message));
    e.code
}

use crate::authz::{escape_control as esc, escape_lines as esc_lines};

impl Status {
    /// A copy with every string an agent (or its contract) chose escaped for a terminal:
    /// process command lines and titles, exit status, notes, names.
    pub fn escaped(&self) -> Status {
        let mut s = self.clone();
        for f in [
            &mut s.id,
            &mut s.name,
            &mut s.tenant,
            &mut s.state,
            &mut s.result,
            &mut s.control_group,
            &mut s.latency_class,
            &mut s.restart_policy,
            &mut s.exit_status,
            &mut s.log_path,
            &mut s.origin,
            &mut s.command,
        ] {
            *f = esc(f);
        }
        for v in s.unenforced_budgets.iter_mut().chain(s.notes.iter_mut()) {
            *v = esc(v);
        }
        for p in &mut s.processes {
            p.2 = esc(&p.2);
        }
        s
    }
}

/// Whether the argument of `start` names a file rather than a known agent.
fn looks_like_file(arg: &str) -> bool {
    arg.contains('/') || arg.ends_with(".yaml") || arg.ends_with(".yml") || Path::new(arg).is_file()
}

pub async fn start(c: &Client, target: &str) -> i32 {
    let r: Result<OwnedObjectPath> = if looks_like_file(target) {
        let path = std::fs::canonicalize(target).unwrap_or_else(|_| PathBuf::from(target));
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                c.call("StartAgent", &(text, path.display().to_string()))
                    .await
            }
            Err(e) => Err(CliError::new(
                exit::NOT_FOUND,
                format!("cannot read contract {target}: {e}"),
            )),
        }
    } else {
        c.call("StartAgentByName", &(target,)).await
    };
    match r {
        Ok(path) => {
            let id = match c
                .call::<_, String>("DescribeAgent", &(path.as_str(),))
                .await
            {
                Ok(json) => serde_json::from_str::<Status>(&json)
                    .map(|s| format!("{} (PID {})", esc(&s.id), s.main_pid))
                    .unwrap_or_default(),
                Err(_) => String::new(),
            };
            println!("started {id} {}", path.as_str());
            exit::OK
        }
        Err(e) => fail(&mut std::io::stdout(), e),
    }
}

/// stop, freeze, thaw, restart, remove: one method taking the agent.
pub async fn simple(c: &Client, method: &str, agents: &[String]) -> i32 {
    let mut code = exit::OK;
    for a in agents {
        if let Err(e) = c.call0(method, &(a.as_str(),)).await {
            code = code.max(fail(&mut std::io::stdout(), e));
        }
    }
    code
}

pub async fn kill(c: &Client, agents: &[String], whom: &str, signal: &str) -> i32 {
    let Some(sig) = crate::sys::parse_signal(signal) else {
        eprintln!("agentctl: unknown signal {signal:?} (use a name like TERM or a number)");
        return exit::USAGE;
    };
    let mut code = exit::OK;
    for a in agents {
        if let Err(e) = c.call0("KillAgent", &(a.as_str(), whom, sig)).await {
            code = code.max(fail(&mut std::io::stdout(), e));
        }
    }
    code
}

pub async fn list_rows(c: &Client) -> Result<Vec<ListRow>> {
    let raw: Vec<RawRow> = c.call("ListAgents", &()).await?;
    Ok(raw
        .into_iter()
        .map(|r| ListRow {
            id: r.0,
            name: r.1,
            tenant: r.2,
            state: r.3,
            result: r.4,
            latency_class: r.5,
            main_pid: r.6,
            object_path: r.7.as_str().to_string(),
        })
        .collect())
}

/// `agentctl list`: a table like `systemctl list-units`, or JSON.
pub async fn list(c: &Client, json: bool, out: &mut dyn Write) -> i32 {
    let rows = match list_rows(c).await {
        Ok(r) => r,
        Err(e) => return fail(out, e),
    };
    if json {
        let _ = writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&rows).unwrap_or_default()
        );
        return exit::OK;
    }
    let _ = write!(out, "{}", render_list(&rows));
    exit::OK
}

pub fn render_list(rows: &[ListRow]) -> String {
    let rows: Vec<ListRow> = rows
        .iter()
        .map(|r| ListRow {
            id: esc(&r.id),
            name: esc(&r.name),
            tenant: esc(&r.tenant),
            state: esc(&r.state),
            result: esc(&r.result),
            latency_class: esc(&r.latency_class),
            main_pid: r.main_pid,
            object_path: r.object_path.clone(),
        })
        .collect();
    let rows = &rows;
    let w = rows.iter().map(|r| r.id.len()).max().unwrap_or(0).max(5);
    let mut s = format!(
        "{:<w$}  {:<11}  {:>8}  {:<5}  {}\n",
        "AGENT", "STATE", "PID", "CLASS", "RESULT"
    );
    for r in rows {
        let pid = if r.main_pid == 0 {
            "-".to_string()
        } else {
            r.main_pid.to_string()
        };
        let class = if r.latency_class.is_empty() {
            "-"
        } else {
            &r.latency_class
        };
        let line = format!(
            "{:<w$}  {:<11}  {:>8}  {:<5}  {}",
            r.id, r.state, pid, class, r.result
        );
        s.push_str(line.trim_end());
        s.push('\n');
    }
    s.push_str(&format!("\n{} agents listed.\n", rows.len()));
    s
}

/// `agentctl status NAME`: like `systemctl status`.
pub async fn status(c: &Client, agent: &str, json: bool, lines: u32, out: &mut dyn Write) -> i32 {
    let st: Status = match c.call::<_, String>("DescribeAgent", &(agent,)).await {
        Ok(j) => match serde_json::from_str(&j) {
            Ok(s) => s,
            Err(e) => {
                return fail(
                    out,
                    CliError::new(exit::FAILED, format!("bad status JSON: {e}")),
                );
            }
        },
        Err(e) => return fail(out, e),
    };
    if json {
        let _ = writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&st).unwrap_or_default()
        );
        return exit::OK;
    }
    let log: (String, Vec<String>, u64) = if lines > 0 {
        c.call("GetLog", &(agent, lines)).await.unwrap_or_default()
    } else {
        Default::default()
    };
    let _ = write!(out, "{}", render_status(&st, &log.1));
    let _ = out.flush();
    exit::OK
}

fn fmt_bytes(b: u64) -> String {
    const U: [&str; 5] = ["B", "K", "M", "G", "T"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i < U.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b}B")
    } else {
        format!("{v:.1}{}", U[i])
    }
}

fn fmt_cpu(ns: u64) -> String {
    let ms = ns / 1_000_000;
    if ms < 1000 {
        format!("{ms}ms")
    } else {
        format!("{:.3}s", ns as f64 / 1e9)
    }
}

/// `YYYY-MM-DD HH:MM:SS UTC` from µs since the epoch.
pub fn fmt_time_us(us: u64) -> String {
    let secs = (us / 1_000_000) as i64;
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    // civil_from_days (Howard Hinnant)
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        sod / 3600,
        (sod / 60) % 60,
        sod % 60
    )
}

fn fmt_ago(us: u64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0);
    let s = now.saturating_sub(us) / 1_000_000;
    match s {
        0..=119 => format!("{s}s ago"),
        120..=7199 => format!("{}min ago", s / 60),
        _ => format!("{}h ago", s / 3600),
    }
}

/// `agentctl status` text: agent-controlled strings and log lines are escaped
/// ([`Status::escaped`], [`crate::authz::escape_control`]).
pub fn render_status(st: &Status, log: &[String]) -> String {
    let st = &st.escaped();
    let dot = match st.state.as_str() {
        "running" => "●",
        "failed" => "×",
        _ => "○",
    };
    let mut s = format!("{dot} {} - {}\n", st.id, st.command);
    s.push_str(&format!(
        "     Loaded: {}{}\n",
        st.origin,
        if st.enabled { " (enabled)" } else { "" }
    ));
    let mut active = st.state.clone();
    if !st.result.is_empty() {
        active.push_str(&format!(" ({})", st.result));
    }
    if st.started_at_us > 0 && st.state != "inactive" {
        active.push_str(&format!(
            " since {}; {}",
            fmt_time_us(st.started_at_us),
            fmt_ago(st.started_at_us)
        ));
    }
    s.push_str(&format!("     Active: {active}\n"));
    if st.main_pid != 0 {
        let comm = st
            .processes
            .iter()
            .find(|p| p.0 == st.main_pid)
            .map(|p| p.2.split_whitespace().next().unwrap_or("").to_string())
            .unwrap_or_default();
        s.push_str(&format!("   Main PID: {} ({})\n", st.main_pid, comm));
    } else if !st.exit_status.is_empty() {
        s.push_str(&format!("   Main PID: - ({})\n", st.exit_status));
    }
    let class = if st.latency_class.is_empty() {
        "-".to_string()
    } else {
        st.latency_class.clone()
    };
    s.push_str(&format!("      Class: {class}\n"));
    for n in &st.notes {
        s.push_str(&format!("             {n}\n"));
    }
    if let Some(m) = st.deadline_misses {
        s.push_str(&format!(
            "     Misses: {m} deadline overruns seen (sampled every {} ms)\n",
            crate::sched::MONITOR_INTERVAL.as_millis()
        ));
    }
    if st.denials > 0 {
        s.push_str(&format!(
            "    Denials: {} by the kernel since agentosd started (agentctl audit show --agent {})\n",
            st.denials, st.name
        ));
    }
    if let Some(n) = st.syscalls {
        s.push_str(&format!(
            "   Syscalls: {n} entered by its processes in this run (agentosd --syscall-counts)\n"
        ));
    }
    s.push_str(&format!("      Tasks: {}\n", st.tasks_current));
    s.push_str(&format!(
        "     Memory: {}\n",
        st.memory_current
            .map(fmt_bytes)
            .unwrap_or_else(|| "n/a (no memory controller)".to_string())
    ));
    s.push_str(&format!(
        "        CPU: {}\n",
        st.cpu_usage_nsec
            .map(fmt_cpu)
            .unwrap_or_else(|| "n/a".into())
    ));
    s.push_str(&format!(
        "   Restarts: {} (policy {})\n",
        st.restarts, st.restart_policy
    ));
    if !st.unenforced_budgets.is_empty() {
        s.push_str(" Unenforced: ");
        s.push_str(&st.unenforced_budgets.join("\n             "));
        s.push('\n');
    }
    s.push_str(&format!("     CGroup: {}\n", st.control_group));
    s.push_str(&render_tree(&st.processes));
    if !log.is_empty() {
        s.push('\n');
        for l in log {
            s.push_str(&esc(l));
            s.push('\n');
        }
    }
    s
}

/// `├─PID cmdline` lines, children under their parents.
fn render_tree(procs: &[(u32, u32, String)]) -> String {
    let pids: std::collections::HashSet<u32> = procs.iter().map(|p| p.0).collect();
    let roots: Vec<&(u32, u32, String)> = procs.iter().filter(|p| !pids.contains(&p.1)).collect();
    let mut out = String::new();
    fn walk(
        p: &(u32, u32, String),
        procs: &[(u32, u32, String)],
        prefix: &str,
        last: bool,
        out: &mut String,
    ) {
        out.push_str(&format!(
            "             {prefix}{}{} {}\n",
            if last { "└─" } else { "├─" },
            p.0,
            p.2
        ));
        let kids: Vec<&(u32, u32, String)> = procs.iter().filter(|k| k.1 == p.0).collect();
        let np = format!("{prefix}{}", if last { "  " } else { "│ " });
        for (i, k) in kids.iter().enumerate() {
            walk(k, procs, &np, i + 1 == kids.len(), out);
        }
    }
    for (i, r) in roots.iter().enumerate() {
        walk(r, procs, "", i + 1 == roots.len(), &mut out);
    }
    out
}

/// `agentctl logs NAME [-n N] [-f]`.
pub async fn logs(c: &Client, agent: &str, lines: u32, follow: bool) -> i32 {
    let (_path, l, mut off): (String, Vec<String>, u64) =
        match c.call("GetLog", &(agent, lines)).await {
            Ok(r) => r,
            Err(e) => return fail(&mut std::io::stdout(), e),
        };
    let mut out = std::io::stdout();
    for line in l {
        if writeln!(out, "{}", esc(&line)).is_err() {
            return exit::OK;
        }
    }
    let _ = out.flush();
    if !follow {
        return exit::OK;
    }
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        match c.call::<_, (String, u64)>("ReadLog", &(agent, off)).await {
            Ok((text, next)) => {
                let text = escape_log_text(&text);
                if out.write_all(text.as_bytes()).is_err() || out.flush().is_err() {
                    return exit::OK;
                }
                off = next;
            }
            Err(e) => return fail(&mut out, e),
        }
    }
}

/// Log text as `ReadLog` returns it (whole lines), each line escaped.
pub fn escape_log_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let (body, nl) = match line.strip_suffix('\n') {
            Some(b) => (b, "\n"),
            None => (line, ""),
        };
        out.push_str(&esc(body));
        out.push_str(nl);
    }
    out
}

/// `agentctl is-active NAME`: 0 when running (or frozen), 1 otherwise, 3 unknown.
pub async fn is_active(c: &Client, agent: &str, quiet: bool) -> i32 {
    match c.call::<_, String>("DescribeAgent", &(agent,)).await {
        Ok(j) => {
            let st: Option<Status> = serde_json::from_str(&j).ok();
            let state = st.map(|s| s.state).unwrap_or_default();
            if !quiet {
                println!("{state}");
            }
            if matches!(state.as_str(), "running" | "frozen") {
                exit::OK
            } else {
                exit::FAILED
            }
        }
        Err(e) => fail(&mut std::io::stdout(), e),
    }
}

/// `agentctl check`: the daemon's start-up probe; without a daemon, a local probe.
pub async fn check(address: Option<&str>, timeout: Option<std::time::Duration>, json: bool) -> i32 {
    let remote = match Client::connect(address, timeout).await {
        Ok(c) => c.call::<_, String>("Check", &()).await,
        Err(e) => Err(e),
    };
    let report: crate::probe::HostReport = match remote.and_then(|j| {
        serde_json::from_str(&j)
            .map_err(|e| CliError::new(exit::FAILED, format!("bad report: {e}")))
    }) {
        Ok(r) => r,
        Err(e) => {
            eprintln!(
                "agentctl: {} — probing this host locally instead",
                e.message
            );
            crate::probe::probe(&crate::probe::ProbeOptions::default())
        }
    };
    if json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.render_table());
    }
    exit::OK
}

/// One held call, as `agentctl consent list --json` prints it.
pub use crate::mcp::consent::Request as ConsentRow;

/// `agentctl consent list`: the calls waiting for an answer.
pub async fn consent_list(c: &Client, json: bool, out: &mut dyn Write) -> i32 {
    let raw: Vec<(u64, String, String, String, String, u64, u64)> =
        match c.call("ListConsentRequests", &()).await {
            Ok(r) => r,
            Err(e) => return fail(out, e),
        };
    let rows: Vec<ConsentRow> = raw
        .into_iter()
        .map(|r| ConsentRow {
            id: r.0,
            agent: r.1,
            tool: r.2,
            capability: r.3,
            arguments: serde_json::from_str(&r.4).unwrap_or(serde_json::Value::String(r.4)),
            requested_us: r.5,
            expires_us: r.6,
        })
        .collect();
    let text = if json {
        serde_json::to_string_pretty(&rows).unwrap_or_default() + "\n"
    } else {
        render_consents(&rows)
    };
    let _ = out.write_all(text.as_bytes());
    exit::OK
}

/// The table `agentctl consent list` prints.
pub fn render_consents(rows: &[ConsentRow]) -> String {
    if rows.is_empty() {
        return "no calls are waiting for consent\n".to_string();
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0);
    let mut s = format!(
        "{:<6} {:<28} {:<24} {:>8}  {}\n",
        "ID", "AGENT", "TOOL", "EXPIRES", "ARGUMENTS"
    );
    for r in rows {
        let left = r.expires_us.saturating_sub(now) / 1_000_000;
        let mut args = esc(&r.arguments.to_string());
        if args.len() > 120 {
            let cut = (0..=117)
                .rev()
                .find(|i| args.is_char_boundary(*i))
                .unwrap_or(0);
            args.truncate(cut);
            args.push_str("...");
        }
        s.push_str(&format!(
            "{:<6} {:<28} {:<24} {:>7}s  {}\n",
            r.id,
            esc(&r.agent),
            esc(&r.tool),
            left,
            args
        ));
    }
    s.push_str(&format!(
        "\n{} call(s) waiting; answer with `agentctl consent approve ID` or `agentctl consent deny ID`\n",
        rows.len()
    ));
    s
}

/// `agentctl consent approve|deny ID...`.
pub async fn consent_answer(c: &Client, approve: bool, ids: &[u64]) -> i32 {
    let method = if approve {
        "ApproveConsent"
    } else {
        "DenyConsent"
    };
    let mut code = exit::OK;
    for id in ids {
        if let Err(e) = c.call0(method, &(*id,)).await {
            code = code.max(fail(&mut std::io::stdout(), e));
        }
    }
    code
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_formats() {
        assert_eq!(fmt_time_us(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(
            fmt_time_us(1_700_000_000_000_000),
            "2023-11-14 22:13:20 UTC"
        );
        assert_eq!(fmt_bytes(512), "512B");
        assert_eq!(fmt_bytes(1536), "1.5K");
    }

    #[test]
    fn list_table_has_header_and_count() {
        let rows = vec![ListRow {
            id: "default/ticker".into(),
            name: "ticker".into(),
            tenant: "default".into(),
            state: "running".into(),
            result: String::new(),
            latency_class: "DT".into(),
            main_pid: 42,
            object_path: "/org/agentos1/agent/default_ticker".into(),
        }];
        let t = render_list(&rows);
        assert!(t.starts_with("AGENT"));
        assert!(t.contains("default/ticker  running"));
        assert!(t.contains("1 agents listed."));
    }

    #[test]
    fn tree_nests_children() {
        let t = render_tree(&[(10, 1, "sh".into()), (11, 10, "sleep 1".into())]);
        assert!(t.contains("└─10 sh"));
        assert!(t.contains("  └─11 sleep 1"), "{t}");
    }

    #[test]
    fn status_shows_syscalls_only_when_counted() {
        // An older daemon's JSON has no `syscalls`: absent, like counting off.
        let old = serde_json::json!({
            "id": "default/a", "name": "a", "tenant": "default", "state": "running",
            "result": "", "main_pid": 0, "control_group": "", "latency_class": "DT",
            "cpu_usage_nsec": null, "memory_current": null, "tasks_current": 1, "restarts": 0,
            "restart_policy": "no", "started_at_us": 0, "exit_status": "",
            "unenforced_budgets": [], "notes": [], "log_path": "", "origin": "", "enabled": false,
            "object_path": "", "command": "sleep", "processes": []
        });
        let mut st: Status = serde_json::from_value(old).expect("status without syscalls");
        assert_eq!(st.syscalls, None);
        assert!(!render_status(&st, &[]).contains("Syscalls"));
        st.syscalls = Some(200_212);
        let t = render_status(&st, &[]);
        assert!(t.contains("\n   Syscalls: 200212 entered"), "{t}");
    }

    #[test]
    fn agent_strings_reach_the_terminal_escaped() {
        let st = serde_json::json!({
            "id": "default/a", "name": "a", "tenant": "default", "state": "running",
            "result": "", "main_pid": 7, "control_group": "", "latency_class": "DT",
            "cpu_usage_nsec": null, "memory_current": null, "tasks_current": 1, "restarts": 0,
            "restart_policy": "no", "started_at_us": 0, "exit_status": "",
            "unenforced_budgets": [], "notes": [], "log_path": "", "origin": "",
            "enabled": false, "object_path": "", "command": "sh",
            "processes": [[7, 1, "sh \u{1b}]0;title\u{7}"]]
        });
        let st: Status = serde_json::from_value(st).unwrap();
        let t = render_status(&st, &["\x1b[2Jfake\rline".to_string()]);
        assert!(
            !t.contains('\x1b') && !t.contains('\x07') && !t.contains('\r'),
            "{t:?}"
        );
        assert!(t.contains("\\x1b[2Jfake\\rline"), "{t}");
        assert!(t.contains("sh \\x1b]0;title\\x07"), "{t}");
        let rows = vec![ConsentRow {
            id: 1,
            agent: "default/a".into(),
            tool: "pay\u{9b}31m".into(),
            capability: "c".into(),
            arguments: serde_json::json!({"to": "\u{202e}evil"}),
            requested_us: 0,
            expires_us: 0,
        }];
        let t = render_consents(&rows);
        assert!(
            t.contains("pay\\u{009b}31m") && t.contains("\\u{202e}evil"),
            "{t}"
        );
        assert!(!t.contains('\u{9b}') && !t.contains('\u{202e}'), "{t}");
        assert_eq!(
            escape_log_text("a\x1b[1m\nb\n"),
            "a\\x1b[1m\nb\n".to_string()
        );
    }
}
