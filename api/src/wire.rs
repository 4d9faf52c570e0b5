//! What travels over `org.agentos1`: the rows of `ListAgents` and `ListConsentRequests`, the
//! JSON object of `DescribeAgent`, and the shapes of the log calls. The daemon builds them and
//! agentctl reads them; each is defined here once.

use serde::{Deserialize, Serialize};
use zbus::OwnedObjectPath;

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

/// One row of `ListAgents` with names (what `agentctl list --json` prints).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
    pub log_path: String,
    pub origin: String,
    pub enabled: bool,
    pub object_path: String,
    pub command: String,
    /// `(pid, ppid, command line)` of every process in the cgroup.
    pub processes: Vec<(u32, u32, String)>,
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
