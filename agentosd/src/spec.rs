//! What the supervisor needs from a contract, as plain serialisable data. It is taken from a
//! parsed `contracts::Contract` once and persisted with the agent, so re-adoption never depends
//! on re-parsing old contract text.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum RestartPolicy {
    #[default]
    No,
    OnFailure,
    Always,
}

impl RestartPolicy {
    pub fn as_str(&self) -> &'static str {
        match self {
            RestartPolicy::No => "no",
            RestartPolicy::OnFailure => "on-failure",
            RestartPolicy::Always => "always",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Restart {
    pub policy: RestartPolicy,
    pub limit: u32,
    pub backoff_ms: u64,
    pub max_backoff_ms: u64,
}

impl Default for Restart {
    fn default() -> Self {
        Self {
            policy: RestartPolicy::No,
            limit: 5,
            backoff_ms: 100,
            max_backoff_ms: 30_000,
        }
    }
}

impl Restart {
    /// Delay before restart number `n` (0-based): backoff doubling up to the maximum.
    pub fn delay_ms(&self, n: u32) -> u64 {
        let factor = 1u64.checked_shl(n.min(32)).unwrap_or(u64::MAX);
        self.backoff_ms
            .saturating_mul(factor)
            .min(self.max_backoff_ms.max(self.backoff_ms))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Budgets {
    pub cpu_millis: Option<u64>,
    pub memory_bytes: Option<u64>,
    pub memory_high_bytes: Option<u64>,
    pub pids: Option<u64>,
    /// Per-device `io.max` limits (absent in records of older daemons).
    #[serde(default)]
    pub io: Vec<IoBudget>,
    /// `compute.disk`: bytes the agent's uid may own on the state file system (a user quota;
    /// storage/quota.rs); absent in records of older daemons.
    #[serde(default)]
    pub disk_bytes: Option<u64>,
    /// `compute.disk_inodes`: files it may own there.
    #[serde(default)]
    pub disk_inodes: Option<u64>,
    pub must: bool,
}

/// One `compute.io` entry as the supervisor keeps it (see `contracts::IoLimit`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct IoBudget {
    /// `/dev/...` path or `MAJOR:MINOR`; resolved when the agent starts.
    pub device: String,
    pub rbps: Option<u64>,
    pub wbps: Option<u64>,
    pub riops: Option<u64>,
    pub wiops: Option<u64>,
}

impl From<&contracts::IoLimit> for IoBudget {
    fn from(l: &contracts::IoLimit) -> Self {
        IoBudget {
            device: l.device.clone(),
            rbps: l.rbps,
            wbps: l.wbps,
            riops: l.riops,
            wiops: l.wiops,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ExecSpec {
    pub command: String,
    pub args: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub working_directory: Option<PathBuf>,
}

/// Every latency class, and its name in records, `status` and sched.rs.
const CLASSES: [contracts::LatencyClass; 3] = [
    contracts::LatencyClass::Hrt,
    contracts::LatencyClass::Srt,
    contracts::LatencyClass::Dt,
];

/// `HRT`, `SRT`, `DT`.
pub fn class_name(c: contracts::LatencyClass) -> &'static str {
    match c {
        contracts::LatencyClass::Hrt => "HRT",
        contracts::LatencyClass::Srt => "SRT",
        contracts::LatencyClass::Dt => "DT",
    }
}

/// The supervisor's view of one agent's contract.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentSpec {
    pub name: String,
    pub tenant: String,
    /// `HRT`, `SRT`, `DT` or empty.
    pub latency_class: String,
    pub exec: Option<ExecSpec>,
    pub restart: Restart,
    pub budgets: Budgets,
    /// HRT reservation and cpuset (see `sched.rs`); absent in records of older daemons.
    #[serde(default)]
    pub sched: crate::sched::SchedSpec,
}

impl AgentSpec {
    pub fn from_contract(c: &contracts::Contract) -> Self {
        let r = c.restart();
        let b = c.budgets();
        AgentSpec {
            name: c.name().to_string(),
            tenant: c.tenant().to_string(),
            latency_class: c.latency_class().map_or("", class_name).to_string(),
            exec: c.exec().map(|e| ExecSpec {
                command: e.command.clone(),
                args: e.args.clone(),
                env: e.env.clone(),
                working_directory: e.working_directory.clone(),
            }),
            restart: Restart {
                policy: match r.policy {
                    contracts::RestartPolicy::No => RestartPolicy::No,
                    contracts::RestartPolicy::OnFailure => RestartPolicy::OnFailure,
                    contracts::RestartPolicy::Always => RestartPolicy::Always,
                },
                limit: r.limit,
                backoff_ms: r.backoff_ms,
                max_backoff_ms: r.max_backoff_ms,
            },
            budgets: Budgets {
                cpu_millis: b.cpu_millis,
                memory_bytes: b.memory_bytes,
                memory_high_bytes: b.memory_high_bytes,
                pids: b.pids,
                io: b.io.iter().map(IoBudget::from).collect(),
                disk_bytes: b.disk_bytes,
                disk_inodes: b.disk_inodes,
                must: b.must,
            },
            sched: crate::sched::SchedSpec::from_contract(c),
        }
    }

    /// `tenant/name`, the agent's id in the CLI and the API.
    pub fn id(&self) -> String {
        format!("{}/{}", self.tenant, self.name)
    }

    /// The latency class, typed (`None` when the contract names none, or for a record whose
    /// text is not one of `HRT`, `SRT`, `DT`).
    pub fn latency(&self) -> Option<contracts::LatencyClass> {
        CLASSES
            .into_iter()
            .find(|c| class_name(*c) == self.latency_class)
    }

    /// The HRT reservation this agent is admitted with: its deadline, when it is HRT and has one.
    pub fn deadline(&self) -> Option<&crate::sched::Deadline> {
        match self.latency() {
            Some(contracts::LatencyClass::Hrt) => self.sched.deadline.as_ref(),
            _ => None,
        }
    }
}

/// Escape one label for a D-Bus object path like systemd's `bus_label_escape`: every byte
/// outside `[A-Za-z0-9]` (and a leading digit) becomes `_xx` (lower-case hex).
pub fn bus_label_escape(s: &str) -> String {
    if s.is_empty() {
        return "_".to_string();
    }
    let mut out = String::with_capacity(s.len());
    for (i, b) in s.bytes().enumerate() {
        if b.is_ascii_alphabetic() || (b.is_ascii_digit() && i > 0) {
            out.push(b as char);
        } else {
            out.push_str(&format!("_{b:02x}"));
        }
    }
    out
}

/// `/org/agentos1/agent/<tenant>_<name>`, each part escaped.
pub fn agent_object_path(tenant: &str, name: &str) -> String {
    format!(
        "/org/agentos1/agent/{}_{}",
        bus_label_escape(tenant),
        bus_label_escape(name)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_class_names_round_trip() {
        let mut spec = AgentSpec {
            name: "a".into(),
            tenant: "t".into(),
            latency_class: String::new(),
            exec: None,
            restart: Restart::default(),
            budgets: Budgets::default(),
            sched: Default::default(),
        };
        assert_eq!(spec.latency(), None);
        for c in CLASSES {
            spec.latency_class = class_name(c).to_string();
            assert_eq!(spec.latency(), Some(c));
        }
        spec.latency_class = "hrt".into();
        assert_eq!(
            spec.latency(),
            None,
            "names are exact, as sched.rs compares them"
        );
        spec.latency_class = "HRT".into();
        assert!(spec.deadline().is_none(), "HRT without a reservation");
    }

    #[test]
    fn escaping_like_systemd() {
        assert_eq!(bus_label_escape("ticker"), "ticker");
        assert_eq!(bus_label_escape("doc-rag"), "doc_2drag");
        assert_eq!(bus_label_escape("1a"), "_31a");
        assert_eq!(
            agent_object_path("default", "doc-rag"),
            "/org/agentos1/agent/default_doc_2drag"
        );
    }

    #[test]
    fn backoff_doubles_to_max() {
        let r = Restart {
            policy: RestartPolicy::OnFailure,
            limit: 3,
            backoff_ms: 100,
            max_backoff_ms: 350,
        };
        assert_eq!(r.delay_ms(0), 100);
        assert_eq!(r.delay_ms(1), 200);
        assert_eq!(r.delay_ms(2), 350);
        assert_eq!(r.delay_ms(60), 350);
    }
}
