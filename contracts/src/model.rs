//! The typed Agent Contract.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Serialize;

use crate::capability::CapabilityKind;
use crate::diag::Diagnostic;

/// The API version written when a contract names none, and the only one accepted.
pub const API_VERSION: &str = "agentos/v0.2";
/// The only accepted `kind`.
pub const KIND: &str = "AgentContract";
/// Tenant used when a contract names none.
pub const DEFAULT_TENANT: &str = "default";

/// The latency class of an agent (paper 3.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum LatencyClass {
    /// Hard real-time: SCHED_DEADLINE.
    #[serde(rename = "HRT")]
    Hrt,
    /// Soft real-time: sched_ext / high weight.
    #[serde(rename = "SRT")]
    Srt,
    /// Delay tolerant: idle class.
    #[serde(rename = "DT")]
    Dt,
}

impl LatencyClass {
    pub fn as_str(self) -> &'static str {
        match self {
            LatencyClass::Hrt => "HRT",
            LatencyClass::Srt => "SRT",
            LatencyClass::Dt => "DT",
        }
    }
}

impl std::fmt::Display for LatencyClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct Exec {
    pub command: String,
    pub args: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub working_directory: Option<PathBuf>,
}

/// Restart policy, like systemd's `Restart=`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RestartPolicy {
    #[default]
    No,
    OnFailure,
    Always,
}

/// Restart settings resolved with defaults.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RestartSpec {
    pub policy: RestartPolicy,
    /// Restarts allowed before giving up (state failed).
    pub limit: u32,
    /// First backoff delay; doubles each restart up to `max_backoff_ms`.
    pub backoff_ms: u64,
    pub max_backoff_ms: u64,
}

impl Default for RestartSpec {
    fn default() -> Self {
        RestartSpec {
            policy: RestartPolicy::No,
            limit: 5,
            backoff_ms: 100,
            max_backoff_ms: 30_000,
        }
    }
}

/// Resource budgets resolved to kernel units.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct Budgets {
    /// CPU in millicores ("1" = 1000, "500m" = 500).
    pub cpu_millis: Option<u64>,
    pub memory_bytes: Option<u64>,
    pub memory_high_bytes: Option<u64>,
    pub pids: Option<u64>,
    /// Per-device I/O limits (`compute.io`).
    pub io: Vec<IoLimit>,
    /// Bytes the agent's uid may own on the daemon's state file system (`compute.disk`): a
    /// user quota's block limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_bytes: Option<u64>,
    /// Files and directories it may own there (`compute.disk_inodes`): the quota's inode limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_inodes: Option<u64>,
    /// True when the contract marks budgets as hard requirements (`compute.must: true`).
    pub must: bool,
}

/// SCHED_DEADLINE parameters in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DeadlineParams {
    pub runtime_ns: u64,
    pub deadline_ns: u64,
    pub period_ns: u64,
}

/// Service-level objectives (`class.slo`). Times are nanoseconds (written as `*_ms` in YAML).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct Slo {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub onset_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub turn_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jitter_p95_pct: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deadline_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub period_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jitter_ns: Option<u64>,
}

/// `class`: latency class and SLOs.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct Class {
    pub latency: Option<LatencyClass>,
    pub slo: Slo,
}

/// One granted capability with its scope.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Capability {
    pub name: String,
    pub kind: CapabilityKind,
    /// The scope: paths for filesystem capabilities, `host:port` for network ones, patterns
    /// for tools. For a bare name this is the registry's default scope (`{state}` stands for
    /// the agent's state directory; see [`Capability::expand_scope`]).
    pub scope: Vec<String>,
    /// True when the contract wrote the bare name (the scope is the default one).
    pub default_scope: bool,
}

impl Capability {
    /// The scope with `{state}` replaced by the agent's state directory.
    pub fn expand_scope(&self, state_dir: &std::path::Path) -> Vec<String> {
        let st = state_dir.display().to_string();
        self.scope
            .iter()
            .map(|s| s.replace("{state}", &st))
            .collect()
    }
}

/// `compute`: resource budgets.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct Compute {
    pub cpu_millis: Option<u64>,
    pub mem_bytes: Option<u64>,
    pub mem_high_bytes: Option<u64>,
    pub pids: Option<u64>,
    /// CPUs to pin to (cpuset); empty = any.
    pub cpuset: Vec<u32>,
    /// Per-device I/O limits (`io.max`).
    pub io: Vec<IoLimit>,
    /// `compute.disk`: bytes on the state file system (a user quota on the agent's uid).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_bytes: Option<u64>,
    /// `compute.disk_inodes`: files on the state file system (the same quota's inode limit).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_inodes: Option<u64>,
    pub must: bool,
}

/// One `compute.io` entry: limits for one block device, written to `io.max`. Unset limits
/// stay `max`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct IoLimit {
    /// A block device path (`/dev/vda`) or its `MAJOR:MINOR`.
    pub device: String,
    /// Bytes read per second.
    pub rbps: Option<u64>,
    /// Bytes written per second.
    pub wbps: Option<u64>,
    /// Read operations per second.
    pub riops: Option<u64>,
    /// Write operations per second.
    pub wiops: Option<u64>,
}

/// `modelPolicy`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct ModelPolicy {
    /// Models the agent may call through the gateway (names or `base_vA..vB` ranges; `*`: any
    /// model the host serves). Empty: the models of `must.model` and `prefer.model`, else none.
    pub allow: Vec<String>,
    pub deny: Vec<String>,
    /// Where a model may run (`local`, `on-prem`, `cloud`); empty: anywhere.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub placement: Vec<String>,
    pub max_context_tokens: Option<u64>,
    pub max_output_tokens: Option<u64>,
    /// Keep prompts and completions in the audit trail (default: only their SHA-256).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub record_content: bool,
}

/// `memory.rag`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct Rag {
    pub top_k: Option<u64>,
    pub require_grounding: bool,
}

/// `memory`: namespace, retention, RAG rules.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct MemoryPolicy {
    pub namespace: Option<String>,
    pub retention_days: Option<u64>,
    pub rag: Option<Rag>,
}

/// `security`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct Security {
    /// Capabilities whose every use is held for operator consent.
    pub consent_for: Vec<String>,
    /// Capabilities that are never granted (policy deny list).
    pub deny: Vec<String>,
}

/// `observability`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct Observability {
    pub tracing: Option<String>,
    pub log_fields: Vec<String>,
}

/// `budgets`: usage budgets enforced by the daemon's gateways.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct UsageBudgets {
    /// Model tokens (prompt + completion) in total, over the agent's runs under one daemon.
    pub tokens: Option<u64>,
    /// Model tokens (prompt + completion) per minute.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens_per_minute: Option<u64>,
    pub tool_calls: Option<u64>,
}

/// Binding mode (paper 4.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BindingMode {
    /// Every requirement, preferences included, must be met exactly; otherwise reject.
    Strict,
    /// Compatible upgrades: version ranges resolve to the highest available version.
    Smooth,
    /// Smooth plus the contract's `allow_fallbacks` substitutions.
    Flexible,
}

impl BindingMode {
    pub fn as_str(self) -> &'static str {
        match self {
            BindingMode::Strict => "strict",
            BindingMode::Smooth => "smooth",
            BindingMode::Flexible => "flexible",
        }
    }
}

/// A host enforcement mechanism, as probed by `agentosd check` and named in `must.mechanisms`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, serde::Deserialize,
)]
pub enum Mechanism {
    /// cgroup v2 `cpu` controller (`cpu.max`, `cpu.weight`, `cpu.idle`).
    #[serde(rename = "cgroup.cpu")]
    CgroupCpu,
    /// cgroup v2 `memory` controller (`memory.max`, `memory.high`).
    #[serde(rename = "cgroup.memory")]
    CgroupMemory,
    /// cgroup v2 `pids` controller.
    #[serde(rename = "cgroup.pids")]
    CgroupPids,
    /// cgroup v2 `cpuset` controller.
    #[serde(rename = "cgroup.cpuset")]
    CgroupCpuset,
    /// `SCHED_DEADLINE` via `sched_setattr`.
    #[serde(rename = "sched_deadline")]
    SchedDeadline,
    /// A sched_ext scheduler (`scx_agentos`).
    #[serde(rename = "sched_ext")]
    SchedExt,
    /// Landlock filesystem and TCP rules.
    #[serde(rename = "landlock")]
    Landlock,
    /// seccomp filters.
    #[serde(rename = "seccomp")]
    Seccomp,
    /// BPF LSM programs.
    #[serde(rename = "bpf_lsm")]
    BpfLsm,
    /// cgroup BPF programs (`connect4/6`, `sendmsg4/6`).
    #[serde(rename = "cgroup_bpf")]
    CgroupBpf,
}

impl Mechanism {
    /// Every mechanism, in declaration order.
    pub const ALL: [Mechanism; 10] = [
        Mechanism::CgroupCpu,
        Mechanism::CgroupMemory,
        Mechanism::CgroupPids,
        Mechanism::CgroupCpuset,
        Mechanism::SchedDeadline,
        Mechanism::SchedExt,
        Mechanism::Landlock,
        Mechanism::Seccomp,
        Mechanism::BpfLsm,
        Mechanism::CgroupBpf,
    ];

    /// The name used in contracts and host offers (`cgroup.cpu`, `sched_deadline`, ...).
    pub const fn as_str(self) -> &'static str {
        match self {
            Mechanism::CgroupCpu => "cgroup.cpu",
            Mechanism::CgroupMemory => "cgroup.memory",
            Mechanism::CgroupPids => "cgroup.pids",
            Mechanism::CgroupCpuset => "cgroup.cpuset",
            Mechanism::SchedDeadline => "sched_deadline",
            Mechanism::SchedExt => "sched_ext",
            Mechanism::Landlock => "landlock",
            Mechanism::Seccomp => "seccomp",
            Mechanism::BpfLsm => "bpf_lsm",
            Mechanism::CgroupBpf => "cgroup_bpf",
        }
    }

    /// The mechanism called `name`.
    pub fn from_name(name: &str) -> Option<Mechanism> {
        Mechanism::ALL.into_iter().find(|m| m.as_str() == name)
    }
}

impl std::fmt::Display for Mechanism {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `must`: hard requirements.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct Must {
    /// Acceptable models (any one; version ranges allowed).
    pub model: Vec<String>,
    /// Acceptable placements (any one); `X-only` means the host's only placement is X.
    pub placement: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deadline_ns: Option<u64>,
    /// Host mechanisms that must be present (`sched_deadline`, `landlock`, ...).
    pub mechanisms: Vec<Mechanism>,
}

/// `prefer`: soft requirements, each an ordered list of choices.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct Prefer {
    pub model: Vec<String>,
    pub embed_store: Vec<String>,
    pub placement: Vec<String>,
    pub provider: Vec<String>,
}

/// `substitute` of a fallback.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct Substitute {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub embed_store: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub placement: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    pub redact: bool,
}

/// One `allow_fallbacks` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Fallback {
    pub when: String,
    pub substitute: Substitute,
}

/// A parsed and validated Agent Contract.
///
/// Both paper styles decode into this one type: `agent:` is `name:`, `latency_class:` is
/// `class.latency:`. `Serialize` writes the normalized form (see [`Contract::to_canonical_json`]).
/// Two contracts are equal when their normalized forms are (warnings, which name files, are not
/// compared).
#[derive(Debug, Clone, Serialize)]
pub struct Contract {
    #[serde(rename = "apiVersion")]
    pub(crate) api_version: String,
    pub(crate) kind: String,
    pub(crate) name: String,
    pub(crate) tenant: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) description: Option<String>,
    pub(crate) class: Class,
    pub(crate) capabilities: Vec<Capability>,
    pub(crate) compute: Compute,
    #[serde(rename = "modelPolicy")]
    pub(crate) model_policy: ModelPolicy,
    pub(crate) memory: MemoryPolicy,
    pub(crate) security: Security,
    pub(crate) observability: Observability,
    pub(crate) budgets: UsageBudgets,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) exec: Option<Exec>,
    pub(crate) restart: RestartSpec,
    pub(crate) binding: BindingMode,
    pub(crate) must: Must,
    pub(crate) prefer: Prefer,
    pub(crate) allow_fallbacks: Vec<Fallback>,
    /// Warnings found while validating (e.g. a capability only in `consent_for`).
    #[serde(skip)]
    pub(crate) warnings: Vec<Diagnostic>,
}

impl PartialEq for Contract {
    fn eq(&self, other: &Self) -> bool {
        self.to_canonical_json() == other.to_canonical_json()
    }
}

impl Eq for Contract {}

impl Contract {
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Tenant, `"default"` when the contract names none.
    pub fn tenant(&self) -> &str {
        &self.tenant
    }
    /// `tenant/name`.
    pub fn id(&self) -> String {
        format!("{}/{}", self.tenant, self.name)
    }
    pub fn api_version(&self) -> &str {
        &self.api_version
    }
    pub fn description(&self) -> Option<&str> {
        self.description.as_deref()
    }
    pub fn latency_class(&self) -> Option<LatencyClass> {
        self.class.latency
    }
    /// SLOs as written (times in ns).
    pub fn slo(&self) -> &Slo {
        &self.class.slo
    }
    /// What to run; `None` for a contract that validates but cannot be started.
    pub fn exec(&self) -> Option<&Exec> {
        self.exec.as_ref()
    }
    pub fn restart(&self) -> RestartSpec {
        self.restart.clone()
    }
    pub fn budgets(&self) -> Budgets {
        Budgets {
            cpu_millis: self.compute.cpu_millis,
            memory_bytes: self.compute.mem_bytes,
            memory_high_bytes: self.compute.mem_high_bytes,
            pids: self.compute.pids,
            io: self.compute.io.clone(),
            disk_bytes: self.compute.disk_bytes,
            disk_inodes: self.compute.disk_inodes,
            must: self.compute.must,
        }
    }
    /// CPUs the agent is pinned to (empty: any).
    pub fn cpuset(&self) -> &[u32] {
        &self.compute.cpuset
    }
    /// SCHED_DEADLINE parameters for HRT contracts: the deadline from `class.slo.deadline_ms`
    /// or `must.deadline_ms`; `period_ms` defaults to the deadline and `runtime_ms` to half of it.
    pub fn deadline(&self) -> Option<DeadlineParams> {
        if self.class.latency != Some(LatencyClass::Hrt) {
            return None;
        }
        let deadline_ns = self.class.slo.deadline_ns.or(self.must.deadline_ns)?;
        Some(DeadlineParams {
            runtime_ns: self.class.slo.runtime_ns.unwrap_or(deadline_ns / 2),
            deadline_ns,
            period_ns: self.class.slo.period_ns.unwrap_or(deadline_ns),
        })
    }
    /// Granted capabilities with their scopes, in contract order.
    pub fn capabilities(&self) -> &[Capability] {
        &self.capabilities
    }
    /// The granted capability called `name`.
    pub fn capability(&self, name: &str) -> Option<&Capability> {
        self.capabilities.iter().find(|c| c.name == name)
    }
    /// Whether a use of `name` must be held for operator consent.
    pub fn consent_required(&self, name: &str) -> bool {
        self.security.consent_for.iter().any(|c| c == name)
    }
    pub fn security(&self) -> &Security {
        &self.security
    }
    pub fn model_policy(&self) -> &ModelPolicy {
        &self.model_policy
    }
    pub fn memory(&self) -> &MemoryPolicy {
        &self.memory
    }
    pub fn observability(&self) -> &Observability {
        &self.observability
    }
    pub fn usage_budgets(&self) -> &UsageBudgets {
        &self.budgets
    }
    pub fn binding_mode(&self) -> BindingMode {
        self.binding
    }
    pub fn must(&self) -> &Must {
        &self.must
    }
    pub fn prefer(&self) -> &Prefer {
        &self.prefer
    }
    pub fn allow_fallbacks(&self) -> &[Fallback] {
        &self.allow_fallbacks
    }
    /// Non-fatal findings (each prints as `FILE:LINE:COL: warning: message`).
    pub fn warnings(&self) -> &[Diagnostic] {
        &self.warnings
    }
    /// The contract as canonical JSON: normalized fields, keys sorted, no whitespace.
    pub fn to_canonical_json(&self) -> String {
        crate::canonical::to_canonical_json(self)
    }
    /// SHA-256 of [`Contract::to_canonical_json`], lower-case hex.
    pub fn sha256(&self) -> String {
        crate::canonical::sha256_hex(self.to_canonical_json().as_bytes())
    }
    /// One-line summary: `doc-rag-planner (tenant default, SRT, 3 capabilities, cpu 1, mem 2GiB)`.
    pub fn summary(&self) -> String {
        let mut parts = vec![format!("tenant {}", self.tenant)];
        parts.push(
            self.class
                .latency
                .map_or("no latency class".to_string(), |l| l.to_string()),
        );
        let n = self.capabilities.len();
        parts.push(format!("{n} capabilit{}", if n == 1 { "y" } else { "ies" }));
        if let Some(c) = self.compute.cpu_millis {
            parts.push(format!("cpu {}", crate::units::format_cpu(c)));
        }
        if let Some(m) = self.compute.mem_bytes {
            parts.push(format!("mem {}", crate::units::format_memory(m)));
        }
        if let Some(d) = self.compute.disk_bytes {
            parts.push(format!("disk {}", crate::units::format_memory(d)));
        }
        if let Some(d) = self.deadline() {
            parts.push(format!(
                "deadline {}/{}/{} ms",
                crate::units::format_ms(d.runtime_ns),
                crate::units::format_ms(d.deadline_ns),
                crate::units::format_ms(d.period_ns)
            ));
        }
        if self.exec.is_none() {
            parts.push("no exec".to_string());
        }
        format!("{} ({})", self.name, parts.join(", "))
    }
}
