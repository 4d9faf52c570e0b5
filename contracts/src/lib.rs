//! Agent Contracts — the ABI between an agent and agentos.
//!
//! SKELETON: the public API below is the one the daemon codes against; the implementation is
//! being written (issue 2). Keep these names and signatures.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The latency class of an agent (paper 3.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LatencyClass {
    /// Hard real-time: SCHED_DEADLINE.
    Hrt,
    /// Soft real-time: sched_ext / high weight.
    Srt,
    /// Delay tolerant: idle class.
    Dt,
}

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Exec {
    pub command: String,
    pub args: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub working_directory: Option<PathBuf>,
}

/// Restart policy, like systemd's `Restart=`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RestartPolicy {
    #[default]
    No,
    OnFailure,
    Always,
}

/// Restart settings resolved with defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestartSpec {
    pub policy: RestartPolicy,
    /// Restarts allowed before giving up (state failed).
    pub limit: u32,
    /// First backoff delay; doubles each restart up to `max_backoff_ms`.
    pub backoff_ms: u64,
    pub max_backoff_ms: u64,
}

/// Resource budgets resolved to kernel units.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Budgets {
    /// CPU in millicores ("1" = 1000, "500m" = 500).
    pub cpu_millis: Option<u64>,
    pub memory_bytes: Option<u64>,
    pub memory_high_bytes: Option<u64>,
    pub pids: Option<u64>,
    /// True when the contract marks budgets as hard requirements (`must`).
    pub must: bool,
}

/// SCHED_DEADLINE parameters in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeadlineParams {
    pub runtime_ns: u64,
    pub deadline_ns: u64,
    pub period_ns: u64,
}

/// A parsed and validated Agent Contract.
#[derive(Debug, Clone)]
pub struct Contract {
    name: String,
}

impl Contract {
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Tenant, `"default"` when the contract names none.
    pub fn tenant(&self) -> &str {
        "default"
    }
    pub fn latency_class(&self) -> Option<LatencyClass> {
        None
    }
    pub fn exec(&self) -> Option<&Exec> {
        None
    }
    pub fn restart(&self) -> RestartSpec {
        RestartSpec {
            policy: RestartPolicy::No,
            limit: 5,
            backoff_ms: 100,
            max_backoff_ms: 30_000,
        }
    }
    pub fn budgets(&self) -> Budgets {
        Budgets::default()
    }
    pub fn deadline(&self) -> Option<DeadlineParams> {
        None
    }
}

/// One problem found in a contract, with its position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    pub file: String,
    pub line: usize,
    pub column: usize,
    /// Dotted field path, e.g. `class.slo.deadline_ms`.
    pub field: Option<String>,
    pub message: String,
}

/// All problems found in one contract; `Display` prints one `FILE:LINE:COL: message` per line.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}", .diagnostics.iter().map(|d| format!("{}:{}:{}: {}", d.file, d.line, d.column, d.message)).collect::<Vec<_>>().join("\n"))]
pub struct ContractError {
    pub diagnostics: Vec<Diagnostic>,
}

/// Parse and validate contract text; `origin` names the file in error positions.
pub fn parse_contract(text: &str, origin: &str) -> Result<Contract, ContractError> {
    let _ = text;
    Err(ContractError {
        diagnostics: vec![Diagnostic {
            file: origin.to_string(),
            line: 1,
            column: 1,
            field: None,
            message: "contract parsing is not implemented yet".into(),
        }],
    })
}

/// Read and parse a contract file.
pub fn load_contract(path: &Path) -> Result<Contract, ContractError> {
    let origin = path.display().to_string();
    match std::fs::read_to_string(path) {
        Ok(text) => parse_contract(&text, &origin),
        Err(e) => Err(ContractError {
            diagnostics: vec![Diagnostic {
                file: origin,
                line: 0,
                column: 0,
                field: None,
                message: format!("cannot read: {e}"),
            }],
        }),
    }
}
