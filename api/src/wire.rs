//! What travels over `org.agentos1`: the rows of `ListAgents` and `ListConsentRequests`, the
//! JSON object of `DescribeAgent`, and the shapes of the log calls. The daemon builds them and
//! agentctl reads them; each is defined here once.

use serde::{Deserialize, Serialize};
use zbus::{ObjectPath, OwnedObjectPath};

/// One row of `ListAgents`: id, name, tenant, state, result, latency class, main PID, object.
pub type AgentRow = (
    String,
    String,
    String,
    String,
    String,
    String,
    u32,
    OwnedObjectPath,
);

/// One row of `ListConsentRequests`: id, agent, tool, capability, arguments (JSON, secrets
/// redacted), requested µs, expires µs.
pub type ConsentRow = (u64, String, String, String, String, u64, u64);

/// `GetLog`'s answer: the log's path, the last lines, the offset to follow from.
pub type LogTail = (String, Vec<String>, u64);

/// `ReadLog`'s answer: text (whole lines) and the next offset.
pub type LogChunk = (String, u64);

/// [`AgentRow`] borrowed from the reply it was read from (no string copied: `agentctl list` at
/// 10 000 agents).
pub type AgentRowRef<'a> = (
    &'a str,
    &'a str,
    &'a str,
    &'a str,
    &'a str,
    &'a str,
    u32,
    ObjectPath<'a>,
);

/// One row of `ListAgents` with names (what `agentctl list --json` prints): owned
/// ([`ListRow`]) or borrowed from the reply ([`ListRowRef`]), the same fields either way.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListRowOf<S> {
    pub id: S,
    pub name: S,
    pub tenant: S,
    pub state: S,
    pub result: S,
    pub latency_class: S,
    pub main_pid: u32,
    pub object_path: S,
}

/// A row of `ListAgents`, owned.
pub type ListRow = ListRowOf<String>;

/// A row of `ListAgents` borrowed from the reply.
pub type ListRowRef<'a> = ListRowOf<&'a str>;

impl From<AgentRow> for ListRow {
    fn from(r: AgentRow) -> Self {
        ListRow {
            id: r.0,
            name: r.1,
            tenant: r.2,
            state: r.3,
            result: r.4,
            latency_class: r.5,
            main_pid: r.6,
            object_path: r.7.as_str().to_string(),
        }
    }
}

impl<'a> ListRowRef<'a> {
    /// The row of a reply's [`AgentRowRef`], borrowing its strings.
    pub fn of(r: &'a AgentRowRef<'_>) -> Self {
        ListRowOf {
            id: r.0,
            name: r.1,
            tenant: r.2,
            state: r.3,
            result: r.4,
            latency_class: r.5,
            main_pid: r.6,
            object_path: r.7.as_str(),
        }
    }
}

/// A snapshot of one agent: the JSON object of `DescribeAgent` (and `agentctl status --json`);
/// the daemon's listings and properties read the same values.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentStatus {
    pub id: String,
    pub name: String,
    pub tenant: String,
    pub state: String,
    /// Why it is in this state (`exit-code`, `start-limit-hit`, an error text…); empty if none.
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
    /// HRT: deadline overruns seen in the current run (a lower bound sampled every
    /// [`crate::DEADLINE_SAMPLE_INTERVAL`]); absent from older daemons.
    #[serde(default)]
    pub deadline_misses: Option<u64>,
    /// Kernel denials (cgroup BPF, BPF LSM, Landlock, seccomp) reported since the daemon
    /// started; absent from older daemons.
    #[serde(default)]
    pub denials: u64,
    /// Syscalls entered by the agent's processes in its current (or last) run; `None` unless
    /// the daemon counts them (`agentosd --syscall-counts`); absent from older daemons.
    #[serde(default)]
    pub syscalls: Option<u64>,
    /// Model calls through the gateway; absent when the agent has no model socket or the
    /// daemon is older.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub models: Option<ModelUsage>,
    /// MCP `tools/call` requests since the daemon started; absent from older daemons.
    #[serde(default)]
    pub tool_calls: u64,
    /// The daemon's own CPU spent for the agent (its sockets, sessions, tool calls, model
    /// gateway) and how often it was held to its share (`--ipc-agent-cpu`); absent when the
    /// daemon never served it or is older.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub daemon_cpu: Option<DaemonCpu>,
    /// The agent's disk quota and usage on the state file system (its uid's files, read with
    /// `Q_GETQUOTA`); absent where that file system has no user quotas, or from older daemons.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<DiskUsage>,
    pub log_path: String,
    pub origin: String,
    /// A file of the agents directory holds its contract (started at boot).
    pub enabled: bool,
    /// A newer contract is loaded (`daemon-reload`, `reload`) and applies when the agent next
    /// starts; absent from older daemons.
    #[serde(default)]
    pub pending_contract: bool,
    /// When the agent's newest contract was loaded, µs since the epoch (0: unknown): a contract
    /// file modified after it changed on disk (`status` says so, as systemd does by mtime).
    #[serde(default)]
    pub contract_loaded_us: u64,
    pub object_path: String,
    pub command: String,
    /// `(pid, ppid, command line)` of every process in the cgroup.
    pub processes: Vec<(u32, u32, String)>,
}

/// An agent's disk quota on the daemon's state file system and what its uid owns there.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct DiskUsage {
    /// Bytes and inodes its uid owns (its home, its tools' scratch, files an earlier run left).
    pub bytes: u64,
    pub inodes: u64,
    /// The quota's hard limits (0: none).
    pub bytes_max: u64,
    pub inodes_max: u64,
    /// Whether the file system enforces them (false: counted only).
    pub enforced: bool,
}

/// The daemon's CPU spent for one agent since the daemon started.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct DaemonCpu {
    /// CPU time, ns.
    pub used_nsec: u64,
    /// Times one of its sockets waited for its share, and the waits summed (ms).
    pub throttles: u64,
    pub throttled_ms: u64,
    /// Its share, per mille of one CPU (0: none).
    pub permille: u64,
    /// The ceiling over all agents under which the share is not held to
    /// (`--ipc-agent-cpu-ceiling`, per mille of one CPU; 0: the share is a hard cap, or an
    /// older daemon).
    #[serde(default)]
    pub ceiling_permille: u64,
    /// Of `used_nsec`, the audit trail's writer and syncer threads' CPU for its records (their
    /// CPU per batch split over the batch's records by bytes; 0 from an older daemon).
    #[serde(default)]
    pub audit_nsec: u64,
}

/// An agent's use of the model gateway since the daemon started.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ModelUsage {
    /// Calls forwarded to a backend, and those among them that failed or were cut.
    pub calls: u64,
    pub errors: u64,
    /// Calls refused by the contract, a budget or an operator.
    pub refused: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// What the total budget (`budgets.tokens`) leaves; `None`: no total budget.
    pub tokens_left: Option<u64>,
    /// `budgets.tokens_per_minute`, if any.
    pub tokens_per_minute: Option<u64>,
    /// Of the last answer: time to the first token (µs) and tokens per second after it, in
    /// thousandths.
    pub last_first_token_us: u64,
    pub last_tokens_per_sec_milli: u64,
}

/// One call held for operator consent, as `agentctl consent list` shows it (and `--json`
/// prints it).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ConsentRequest {
    pub id: u64,
    /// `tenant/name` of the calling agent.
    pub agent: String,
    pub tool: String,
    pub capability: String,
    /// The arguments with secrets redacted (what the operator decides on).
    pub arguments: serde_json::Value,
    /// When it was asked and when it expires, µs since the epoch.
    pub requested_us: u64,
    pub expires_us: u64,
}

impl ConsentRequest {
    /// The `ListConsentRequests` row: the arguments as JSON text.
    pub fn to_row(&self) -> ConsentRow {
        (
            self.id,
            self.agent.clone(),
            self.tool.clone(),
            self.capability.clone(),
            self.arguments.to_string(),
            self.requested_us,
            self.expires_us,
        )
    }

    /// Back from a row; arguments that are not JSON are kept as one string.
    pub fn from_row(r: ConsentRow) -> Self {
        ConsentRequest {
            id: r.0,
            agent: r.1,
            tool: r.2,
            capability: r.3,
            arguments: serde_json::from_str(&r.4).unwrap_or(serde_json::Value::String(r.4)),
            requested_us: r.5,
            expires_us: r.6,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consent_rows_round_trip() {
        let r = ConsentRequest {
            id: 7,
            agent: "default/a".into(),
            tool: "pay".into(),
            capability: "tool.pay".into(),
            arguments: serde_json::json!({"to": "x", "n": 1}),
            requested_us: 1,
            expires_us: 2,
        };
        assert_eq!(ConsentRequest::from_row(r.to_row()), r);
        let mut row = r.to_row();
        row.4 = "not json".into();
        assert_eq!(
            ConsentRequest::from_row(row).arguments,
            serde_json::Value::String("not json".into())
        );
    }
}

/// One entry of an agent's journal (`LOG_DIR/<tenant>/<name>.journal`, one JSON object per
/// line), as `GetJournal` and `ReadJournal` return them. Only the daemon writes the journal: the
/// agent's output reaches it through files the daemon reads, so `stream` says who spoke and an
/// agent cannot write a line that reads as the daemon's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogEntry {
    /// Wall-clock time the daemon took the line in, µs since the Unix epoch.
    #[serde(rename = "t")]
    pub time_us: u64,
    /// Who wrote it: `stdout`, `stderr` (the agent) or `agentosd` (the daemon's note).
    #[serde(rename = "s")]
    pub stream: String,
    /// The line, without its newline (invalid UTF-8 replaced; control characters kept: escape
    /// them before printing).
    #[serde(rename = "m")]
    pub message: String,
}

impl LogEntry {
    /// Whether the agent wrote it (rather than the daemon).
    pub fn from_agent(&self) -> bool {
        self.stream != "agentosd"
    }

    /// `2026-11-25T22:40:01.123Z NAME: …` for stdout, `NAME[stderr]: …` for stderr and
    /// `agentosd: …` for the daemon's notes (journalctl's short format, in UTC). The message is
    /// escaped for a terminal: what an agent wrote cannot move the cursor or pose as the daemon.
    pub fn short(&self, name: &str) -> String {
        let who = match self.stream.as_str() {
            "stdout" => crate::text::escape_control(name),
            "agentosd" => "agentosd".to_string(),
            s => format!(
                "{}[{}]",
                crate::text::escape_control(name),
                crate::text::escape_control(s)
            ),
        };
        format!(
            "{} {who}: {}",
            utc_timestamp(self.time_us),
            crate::text::escape_control(&self.message)
        )
    }
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ` for µs since the epoch (UTC, proleptic Gregorian).
pub fn utc_timestamp(us: u64) -> String {
    let secs = us / 1_000_000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        us % 1_000_000 / 1000
    )
}

/// Days since 1970-01-01 → (year, month, day); Howard Hinnant's `civil_from_days`.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// Days since 1970-01-01 of a date (the inverse of `civil_from_days`).
pub fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (i64::from(m) + 9) % 12;
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod log_entry_tests {
    use super::*;

    #[test]
    fn timestamps_are_utc_calendar_dates() {
        assert_eq!(utc_timestamp(0), "1970-01-01T00:00:00.000Z");
        // 2026-11-25T22:40:01.123Z
        let us = (days_from_civil(2026, 11, 25) as u64 * 86_400 + 22 * 3600 + 40 * 60 + 1)
            * 1_000_000
            + 123_456;
        assert_eq!(utc_timestamp(us), "2026-11-25T22:40:01.123Z");
        assert_eq!(
            utc_timestamp(951_782_400_000_000),
            "2000-02-29T00:00:00.000Z"
        );
        for d in [-1000i64, 0, 59, 60, 10_000, 20_000] {
            let (y, m, dd) = civil_from_days(d);
            assert_eq!(days_from_civil(y, m, dd), d);
        }
    }

    #[test]
    fn an_agent_line_cannot_read_as_the_daemons() {
        let e = LogEntry {
            time_us: 0,
            stream: "stdout".into(),
            message: "agentosd: stopped\x1b[2J".into(),
        };
        assert_eq!(
            e.short("ticker"),
            "1970-01-01T00:00:00.000Z ticker: agentosd: stopped\\x1b[2J"
        );
        let n = LogEntry {
            stream: "agentosd".into(),
            message: "started".into(),
            ..e.clone()
        };
        assert!(n.short("ticker").ends_with(" agentosd: started"));
        assert!(!n.from_agent() && e.from_agent());
        let err = LogEntry {
            stream: "stderr".into(),
            ..e
        };
        assert!(err.short("t\x1b").contains(" t\\x1b[stderr]: "));
    }
}
