//! The connection to agentosd and one function per command that talks to it. Each returns the
//! process exit code ([`crate::exit`]); what it prints is drawn by [`crate::render`].

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agentos_api::text::{escape_control as esc, escape_lines as esc_lines};
use agentos_api::{
    AgentRow, AgentRowRef, AgentStatus, ApiError, BUS_ADDRESS_ENV, ConsentRequest, ConsentRow,
    ListRow, ListRowRef, MANAGER_IFACE, MANAGER_PATH, SERVICE, error,
};
use zbus::Connection;
use zbus::OwnedObjectPath;

use crate::exit;
use crate::render::{render_consents, render_list, render_status};

/// A failed client call: message for stderr and exit code.
#[derive(Debug)]
pub struct CliError {
    pub code: i32,
    pub message: String,
}

impl CliError {
    pub fn new(code: i32, message: impl Into<String>) -> Self {
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
            let short = ApiError::name_of(name);
            let msg = detail.clone().unwrap_or_else(|| name.to_string());
            let msg = if short == error::name::ACCESS_DENIED {
                format!("access denied ({name}): {msg}")
            } else {
                msg
            };
            let code = match short {
                error::name::NO_SUCH_AGENT => exit::NOT_FOUND,
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
            format!("cannot reach the D-Bus: {e} (set --bus-address or {BUS_ADDRESS_ENV})"),
        ),
        _ => CliError::new(exit::FAILED, e.to_string()),
    }
}

/// Where the daemon's bus is, when not the default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BusTarget {
    /// A D-Bus address (`--bus-address`, `$AGENTOS_BUS_ADDRESS`).
    Address(String),
    /// A program whose stdin/stdout is the bus (`-H`: ssh to systemd-stdio-bridge).
    Exec { program: String, args: Vec<String> },
}

impl BusTarget {
    fn describe(&self) -> String {
        match self {
            BusTarget::Address(a) => a.clone(),
            BusTarget::Exec { program, args } => format!("{program} {}", args.join(" ")),
        }
    }

    /// Whether the bus is another machine's (then nothing local stands in for it).
    pub fn is_remote(&self) -> bool {
        matches!(self, BusTarget::Exec { .. })
    }
}

/// A connection to the daemon.
pub struct Client {
    conn: Connection,
}

impl Client {
    /// The bus connection (for signal streams).
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// Connect to `target`, else `$AGENTOS_BUS_ADDRESS`, else the system bus. Every method call
    /// fails after `timeout` without an answer (`None`: waits forever), like busctl's
    /// `--timeout`, so a stuck daemon is reported rather than waited for.
    pub async fn connect(
        target: Option<&BusTarget>,
        timeout: Option<std::time::Duration>,
    ) -> Result<Self> {
        let target = target.cloned().or_else(|| {
            std::env::var(BUS_ADDRESS_ENV)
                .ok()
                .filter(|s| !s.is_empty())
                .map(BusTarget::Address)
        });
        let builder = match &target {
            Some(BusTarget::Address(a)) => zbus::connection::Builder::address(a.as_str()),
            Some(BusTarget::Exec { program, args }) => {
                let t = zbus::address::transport::Unixexec::new(
                    program.into(),
                    None,
                    args.iter().map(Into::into).collect(),
                );
                zbus::connection::Builder::address(zbus::Address::from(
                    zbus::address::transport::Transport::Unixexec(t),
                ))
            }
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
                    "cannot connect to {}: {e} (is the bus running? set --bus-address or {BUS_ADDRESS_ENV})",
                    target.as_ref().map_or("the system bus".to_string(), BusTarget::describe)
                ),
            )
        })?;
        Ok(Client { conn })
    }

    /// Call `method` on the manager object.
    async fn reply<B>(&self, method: &str, body: &B) -> Result<zbus::Message>
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
            .map_err(classify)
    }

    /// Call `method` and read its answer as `R`.
    pub(crate) async fn call<B, R>(&self, method: &str, body: &B) -> Result<R>
    where
        B: serde::Serialize + zbus::zvariant::DynamicType,
        R: for<'d> zbus::zvariant::DynamicDeserialize<'d>,
    {
        self.reply(method, body)
            .await?
            .body()
            .deserialize::<R>()
            .map_err(|e| CliError::new(exit::FAILED, format!("bad reply to {method}: {e}")))
    }

    /// Call `method`, which answers nothing.
    pub(crate) async fn call0<B>(&self, method: &str, body: &B) -> Result<()>
    where
        B: serde::Serialize + zbus::zvariant::DynamicType,
    {
        self.reply(method, body).await.map(drop)
    }
}

pub(crate) fn fail(out: &mut dyn Write, e: CliError) -> i32 {
    let _ = out.flush();
    // Errors can carry agent-chosen strings (names, process titles, log paths).
    eprintln!("agentctl: {}", esc_lines(&e.message));
    e.code
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
            let status = match c
                .call::<_, String>("DescribeAgent", &(path.as_str(),))
                .await
            {
                Ok(json) => serde_json::from_str::<AgentStatus>(&json).ok(),
                Err(_) => None,
            };
            let (line, code) = started_line(status.as_ref(), path.as_str());
            println!("{line}");
            code
        }
        Err(e) => fail(&mut std::io::stdout(), e),
    }
}

/// What `start` says once the daemon took the agent: its PID while it runs, else the state it
/// is already in (a run that ended at once) and why. The start itself succeeded either way (as
/// `systemctl start` of a simple service whose process exits at once): exit 0.
fn started_line(status: Option<&AgentStatus>, path: &str) -> (String, i32) {
    let Some(s) = status else {
        return (format!("started {path}"), exit::OK);
    };
    let id = esc(&s.id);
    if s.main_pid > 0 {
        return (
            format!("started {id} (PID {}) {path}", s.main_pid),
            exit::OK,
        );
    }
    let why = if s.result.is_empty() {
        String::new()
    } else {
        format!(": {}", esc(&s.result))
    };
    (
        format!("started {id} {path}, now {}{why}", esc(&s.state)),
        exit::OK,
    )
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

/// `reset-failed`: the named agents, or (none named) every failed agent the caller may see.
pub async fn reset_failed(c: &Client, agents: &[String]) -> i32 {
    if !agents.is_empty() {
        return simple(c, "ResetFailedAgent", agents).await;
    }
    let rows = match list_rows(c).await {
        Ok(r) => r,
        Err(e) => return fail(&mut std::io::stdout(), e),
    };
    let failed: Vec<String> = rows
        .into_iter()
        .filter(|r| r.state == "failed")
        .map(|r| r.id)
        .collect();
    simple(c, "ResetFailedAgent", &failed).await
}

pub async fn kill(c: &Client, agents: &[String], whom: &str, signal: &str) -> i32 {
    let Some(sig) = agentos_api::signal::parse_signal(signal) else {
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
    let raw: Vec<AgentRow> = c.call("ListAgents", &()).await?;
    Ok(raw.into_iter().map(ListRow::from).collect())
}

/// `agentctl list`: a table like `systemctl list-units`, or JSON; `states` (none: all) keeps the
/// agents in those states (case-insensitive). The rows borrow their strings from the reply (at
/// 10 000 agents, copying them into owned rows was a large part of the command's time).
pub async fn list(c: &Client, json: bool, states: &[String], out: &mut dyn Write) -> i32 {
    let msg = match c.reply("ListAgents", &()).await {
        Ok(m) => m,
        Err(e) => return fail(out, e),
    };
    let body = msg.body();
    let raw: Vec<AgentRowRef<'_>> = match body.deserialize() {
        Ok(r) => r,
        Err(e) => {
            return fail(
                out,
                CliError::new(exit::FAILED, format!("bad reply to ListAgents: {e}")),
            );
        }
    };
    let rows: Vec<ListRowRef<'_>> = raw
        .iter()
        .map(ListRowRef::of)
        .filter(|r| in_states(r.state, states))
        .collect();
    if json {
        let _ = writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&rows).unwrap_or_default()
        );
        return exit::OK;
    }
    let _ = out.write_all(render_list(&rows).as_bytes());
    exit::OK
}

/// Whether `state` is one of `states` (any, when it is empty; case-insensitive).
fn in_states(state: &str, states: &[String]) -> bool {
    states.is_empty() || states.iter().any(|s| s.eq_ignore_ascii_case(state))
}

/// `agentctl status NAME`: like `systemctl status`.
pub async fn status(c: &Client, agent: &str, json: bool, lines: u32, out: &mut dyn Write) -> i32 {
    let st: AgentStatus = match c.call::<_, String>("DescribeAgent", &(agent,)).await {
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
    let log = if lines > 0 {
        let zero = 0u64;
        let (text, _): (String, u64) = c
            .call("GetJournal", &(agent, lines, zero, zero))
            .await
            .unwrap_or_default();
        parse_entries(&text)
    } else {
        Vec::new()
    };
    let mut text = render_status(&st, &log);
    let mut warnings = crate::files::change_warnings(&st);
    // The daemon's storage state concerns every agent: said under each one while it is low.
    if let Ok(d) = crate::daemon::DaemonStatus::read(c).await
        && let Some(w) = d.warning()
    {
        warnings.push(w);
    }
    if !warnings.is_empty() {
        // After the header block, before the log lines (systemctl prints its warning last).
        for w in warnings {
            text.push_str(&w);
            text.push('\n');
        }
    }
    let _ = write!(out, "{text}");
    let _ = out.flush();
    exit::OK
}

/// What `agentctl logs` prints, like journalctl's `-o`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogOutput {
    /// `TIME NAME: line`, `TIME NAME[stderr]: line`, `TIME agentosd: note`
    Short,
    /// One JSON object per entry: time (µs and text), agent, stream, message
    Json,
    /// The message only
    Cat,
}

/// `agentctl logs` options.
#[derive(Debug, Clone)]
pub struct LogsArgs {
    /// The newest this many (0: all that match).
    pub lines: u32,
    pub follow: bool,
    pub since: Option<String>,
    pub until: Option<String>,
    pub output: LogOutput,
}

fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

fn render_entry(e: &agentos_api::LogEntry, agent: &str, output: LogOutput) -> String {
    let name = agent.rsplit('/').next().unwrap_or(agent);
    match output {
        LogOutput::Short => e.short(name),
        LogOutput::Cat => esc(&e.message),
        // serde_json escapes every control character: safe for a terminal as it is.
        LogOutput::Json => serde_json::json!({
            "time_us": e.time_us,
            "time": agentos_api::wire::utc_timestamp(e.time_us),
            "agent": agent,
            "stream": e.stream,
            "from_agent": e.from_agent(),
            "message": e.message,
        })
        .to_string(),
    }
}

fn parse_entries(text: &str) -> Vec<agentos_api::LogEntry> {
    text.lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// `agentctl logs NAME [-n N] [-f] [--since T] [--until T] [-o short|json|cat]`. With `-f`
/// it follows across a restart of the daemon: calls that fail are retried from the same offset.
pub async fn logs(c: &Client, agent: &str, a: &LogsArgs) -> i32 {
    let mut out = std::io::stdout();
    let now = now_us();
    let when = |s: &Option<String>| -> std::result::Result<u64, CliError> {
        match s {
            None => Ok(0),
            Some(t) => crate::when::parse(t, now).map_err(|e| CliError::new(exit::USAGE, e)),
        }
    };
    let (since, until) = match (when(&a.since), when(&a.until)) {
        (Ok(s), Ok(u)) => (s, u),
        (Err(e), _) | (_, Err(e)) => return fail(&mut out, e),
    };
    let (text, mut off): (String, u64) =
        match c.call("GetJournal", &(agent, a.lines, since, until)).await {
            Ok(r) => r,
            Err(e) => return fail(&mut out, e),
        };
    for e in parse_entries(&text) {
        if writeln!(out, "{}", render_entry(&e, agent, a.output)).is_err() {
            return exit::OK;
        }
    }
    let _ = out.flush();
    if !a.follow {
        return exit::OK;
    }
    let mut waiting = false;
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        match c
            .call::<_, (String, u64)>("ReadJournal", &(agent, off))
            .await
        {
            Ok((text, next)) => {
                if waiting {
                    eprintln!("agentctl: agentosd is back, following {agent} again");
                    waiting = false;
                }
                for e in parse_entries(&text) {
                    if until != 0 && e.time_us > until {
                        return exit::OK;
                    }
                    if writeln!(out, "{}", render_entry(&e, agent, a.output)).is_err() {
                        return exit::OK;
                    }
                }
                if out.flush().is_err() {
                    return exit::OK;
                }
                off = next;
            }
            // The daemon restarting (or not answering): keep the offset and wait, as
            // `journalctl -f` does across a journald restart.
            Err(e) if e.code == exit::UNREACHABLE => {
                if !waiting {
                    eprintln!("agentctl: {}; waiting for it to come back", e.message);
                    waiting = true;
                }
            }
            Err(e) => return fail(&mut out, e),
        }
    }
}

/// `agentctl is-active NAME`: 0 when running (or frozen), 1 otherwise, 3 unknown.
pub async fn is_active(c: &Client, agent: &str, quiet: bool) -> i32 {
    match c.call::<_, String>("DescribeAgent", &(agent,)).await {
        Ok(j) => {
            let st: Option<AgentStatus> = serde_json::from_str(&j).ok();
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

/// `agentctl consent list`: the calls waiting for an answer.
pub async fn consent_list(c: &Client, json: bool, out: &mut dyn Write) -> i32 {
    let raw: Vec<ConsentRow> = match c.call("ListConsentRequests", &()).await {
        Ok(r) => r,
        Err(e) => return fail(out, e),
    };
    let rows: Vec<ConsentRequest> = raw.into_iter().map(ConsentRequest::from_row).collect();
    let text = if json {
        serde_json::to_string_pretty(&rows).unwrap_or_default() + "\n"
    } else {
        render_consents(&rows)
    };
    let _ = out.write_all(text.as_bytes());
    exit::OK
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
mod start_tests {
    use super::*;

    fn status(state: &str, pid: u32, result: &str) -> AgentStatus {
        AgentStatus {
            id: "t/a".into(),
            state: state.into(),
            result: result.into(),
            main_pid: pid,
            ..Default::default()
        }
    }

    #[test]
    fn list_keeps_the_states_asked_for() {
        let row = |id: &str, state: &str| ListRow {
            id: id.into(),
            name: id.into(),
            tenant: "t".into(),
            state: state.into(),
            result: String::new(),
            latency_class: "DT".into(),
            main_pid: 0,
            object_path: String::new(),
        };
        let rows = [row("a", "running"), row("b", "failed"), row("c", "exited")];
        let ids = |states: &[String]| {
            rows.iter()
                .filter(|r| in_states(&r.state, states))
                .map(|r| r.id.as_str())
                .collect::<Vec<_>>()
        };
        assert_eq!(ids(&[]), ["a", "b", "c"]);
        assert_eq!(ids(&["failed".into()]), ["b"]);
        assert_eq!(
            ids(&["RUNNING".to_string(), "exited".to_string()]),
            ["a", "c"]
        );
    }

    #[test]
    fn start_names_the_pid_or_the_state_never_pid_0() {
        let p = "/org/agentos1/agent/t_a";
        let (l, c) = started_line(Some(&status("running", 42, "")), p);
        assert_eq!(
            (l.as_str(), c),
            ("started t/a (PID 42) /org/agentos1/agent/t_a", 0)
        );
        let (l, c) = started_line(Some(&status("failed", 0, "exit-code")), p);
        assert_eq!(
            (l.as_str(), c),
            (
                "started t/a /org/agentos1/agent/t_a, now failed: exit-code",
                0
            )
        );
        let (l, c) = started_line(Some(&status("exited", 0, "success")), p);
        assert!(l.ends_with("now exited: success") && c == 0, "{l}");
        assert!(
            !started_line(Some(&status("restarting", 0, "")), p)
                .0
                .contains("PID 0")
        );
    }
}
