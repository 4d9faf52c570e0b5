//! The report of the host probe: one [`Check`] row per kernel [`Feature`], the host facts around
//! them, the table `agentosd check` prints, and the [`contracts::HostOffer`] binding uses.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::cgroup::BUDGET_CONTROLLERS;
use crate::sys::mountinfo::CgroupLayout;

/// A kernel mechanism agentos uses; one row of the report each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Feature {
    /// A cgroup2 hierarchy is mounted.
    CgroupV2,
    /// The agents' root cgroup exists on cgroup2 and child cgroups can be made in it.
    CgroupRoot,
    CpuController,
    MemoryController,
    PidsController,
    IoController,
    CpusetController,
    /// `cgroup.freeze` (FreezeAgent/ThawAgent).
    CgroupFreeze,
    /// `cgroup.kill` (KillAgent kills a whole tree at once).
    CgroupKill,
    /// Pressure stall information (`cpu.pressure`, `memory.pressure`, `io.pressure`).
    Pressure,
    /// `clone3(CLONE_INTO_CGROUP)`: spawn straight into the agent's cgroup.
    Clone3IntoCgroup,
    /// `pidfd_open(2)`: race-free process handles.
    Pidfd,
    /// `SCHED_DEADLINE` for the HRT latency class.
    SchedDeadline,
    /// sched_ext, for the SRT class scheduler `scx_agentos`.
    SchedExt,
    /// A scheduling slice request for `SCHED_OTHER` threads (`sched_setattr` `sched_runtime`,
    /// Linux 6.12): the daemon's threads that serve agents ask for a short one.
    SchedSlice,
    Landlock,
    /// Landlock's `RESOLVE_UNIX` (ABI 9): agents kept from the host's pathname Unix sockets.
    LandlockUnix,
    Seccomp,
    /// `SECCOMP_RET_USER_NOTIF`: a syscall held for the daemon to decide.
    SeccompUserNotif,
    /// Kernel BTF at `/sys/kernel/btf/vmlinux` (CO-RE, LSM/fentry/tp_btf hooks).
    Btf,
    /// tracefs mounted (tracepoint ids for attaching tracepoint programs).
    Tracefs,
    BpfTracepoint,
    BpfRawTracepoint,
    /// BTF-typed raw tracepoints (`tp_btf/`).
    BpfTpBtf,
    /// `cgroup/connect4` and friends (`BPF_PROG_TYPE_CGROUP_SOCK_ADDR`).
    BpfCgroupSockAddr,
    /// `cgroup_skb/egress` (`BPF_PROG_TYPE_CGROUP_SKB`).
    BpfCgroupSkb,
    /// BPF LSM (`lsm/file_open`, `lsm/bprm_check_security`).
    BpfLsm,
    /// `fentry/` tracing programs.
    BpfFentry,
    /// `BPF_MAP_TYPE_RINGBUF`: kernel events to the audit chain.
    BpfRingbuf,
    IoUring,
    /// inotify and a pollable `/proc/self/mountinfo`: the kept host paths of the agents'
    /// Landlock rulesets watched between starts (sandbox/path_watch.rs).
    PathWatch,
    /// Landlock and seccomp denials of agents logged by the kernel's audit subsystem and
    /// readable by the daemon (`AUDIT_NLGRP_READLOG`); see enforce/kaudit/netlink.rs.
    KernelAudit,
}

impl Feature {
    /// Every mechanism, in report order.
    pub const ALL: [Feature; 32] = [
        Feature::CgroupV2,
        Feature::CgroupRoot,
        Feature::CpuController,
        Feature::MemoryController,
        Feature::PidsController,
        Feature::IoController,
        Feature::CpusetController,
        Feature::CgroupFreeze,
        Feature::CgroupKill,
        Feature::Pressure,
        Feature::Clone3IntoCgroup,
        Feature::Pidfd,
        Feature::SchedDeadline,
        Feature::SchedExt,
        Feature::SchedSlice,
        Feature::Landlock,
        Feature::LandlockUnix,
        Feature::Seccomp,
        Feature::SeccompUserNotif,
        Feature::Btf,
        Feature::Tracefs,
        Feature::BpfTracepoint,
        Feature::BpfRawTracepoint,
        Feature::BpfTpBtf,
        Feature::BpfCgroupSockAddr,
        Feature::BpfCgroupSkb,
        Feature::BpfLsm,
        Feature::BpfFentry,
        Feature::BpfRingbuf,
        Feature::IoUring,
        Feature::PathWatch,
        Feature::KernelAudit,
    ];

    /// The name shown in the table and in refusal reasons.
    pub fn name(self) -> &'static str {
        match self {
            Feature::CgroupV2 => "cgroup v2",
            Feature::CgroupRoot => "agents cgroup",
            Feature::CpuController => "cpu controller",
            Feature::MemoryController => "memory controller",
            Feature::PidsController => "pids controller",
            Feature::IoController => "io controller",
            Feature::CpusetController => "cpuset controller",
            Feature::CgroupFreeze => "cgroup freeze",
            Feature::CgroupKill => "cgroup kill",
            Feature::Pressure => "pressure (psi)",
            Feature::Clone3IntoCgroup => "clone3 into cgroup",
            Feature::Pidfd => "pidfd",
            Feature::SchedDeadline => "sched_deadline",
            Feature::SchedExt => "sched_ext",
            Feature::SchedSlice => "sched slice request",
            Feature::Landlock => "landlock",
            Feature::LandlockUnix => "landlock unix sockets",
            Feature::Seccomp => "seccomp",
            Feature::SeccompUserNotif => "seccomp user notify",
            Feature::Btf => "btf",
            Feature::Tracefs => "tracefs",
            Feature::BpfTracepoint => "bpf tracepoint",
            Feature::BpfRawTracepoint => "bpf raw tracepoint",
            Feature::BpfTpBtf => "bpf tp_btf",
            Feature::BpfCgroupSockAddr => "bpf cgroup sock_addr",
            Feature::BpfCgroupSkb => "bpf cgroup skb",
            Feature::BpfLsm => "bpf lsm",
            Feature::BpfFentry => "bpf fentry",
            Feature::BpfRingbuf => "bpf ringbuf",
            Feature::IoUring => "io_uring",
            Feature::PathWatch => "path watch (inotify)",
            Feature::KernelAudit => "kernel audit (denials)",
        }
    }

    /// The cgroup v2 controller this row is about, if it is a controller row.
    pub fn controller(self) -> Option<&'static str> {
        match self {
            Feature::CpuController => Some("cpu"),
            Feature::MemoryController => Some("memory"),
            Feature::PidsController => Some("pids"),
            Feature::IoController => Some("io"),
            Feature::CpusetController => Some("cpuset"),
            _ => None,
        }
    }

    /// The controller row for a cgroup v2 controller name (`"cpu"` → [`Feature::CpuController`]).
    pub fn for_controller(name: &str) -> Option<Feature> {
        Feature::ALL
            .into_iter()
            .find(|m| m.controller() == Some(name))
    }

    /// The row that proves the contract mechanism `m` (`must.mechanisms: [landlock]`): the one
    /// table between the contract's vocabulary and the probe's rows. Exhaustive, so a new
    /// contract mechanism does not build until it names the row that offers it.
    pub fn for_mechanism(m: contracts::Mechanism) -> Feature {
        use contracts::Mechanism as M;
        match m {
            M::CgroupCpu => Feature::CpuController,
            M::CgroupMemory => Feature::MemoryController,
            M::CgroupPids => Feature::PidsController,
            M::CgroupCpuset => Feature::CpusetController,
            M::SchedDeadline => Feature::SchedDeadline,
            M::SchedExt => Feature::SchedExt,
            M::Landlock => Feature::Landlock,
            M::Seccomp => Feature::Seccomp,
            M::BpfLsm => Feature::BpfLsm,
            M::CgroupBpf => Feature::BpfCgroupSockAddr,
        }
    }

    /// The contract mechanism this row offers, if any (the inverse of [`Feature::for_mechanism`]).
    pub fn mechanism(self) -> Option<contracts::Mechanism> {
        contracts::Mechanism::ALL
            .into_iter()
            .find(|m| Feature::for_mechanism(*m) == self)
    }
}

impl std::fmt::Display for Feature {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The outcome of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// The kernel did it.
    Available,
    /// The kernel refused or lacks it; the detail says why and how to enable it.
    Unavailable,
    /// The probe itself could not find out (for example: not privileged enough to try).
    Error,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Available => "available",
            Status::Unavailable => "unavailable",
            Status::Error => "error",
        }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One row of the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Check {
    pub mechanism: Feature,
    pub status: Status,
    /// The kernel interface tried and the result, e.g.
    /// `BPF_PROG_LOAD BPF_PROG_TYPE_LSM: EPERM — kernel lockdown or lsm= lacks bpf`.
    pub detail: String,
}

impl Check {
    pub(super) fn new(mechanism: Feature, status: Status, detail: impl Into<String>) -> Check {
        Check {
            mechanism,
            status,
            detail: detail.into(),
        }
    }

    /// `bpf lsm: unavailable (BPF_PROG_LOAD BPF_PROG_TYPE_LSM: EPERM — …)`: the line used as
    /// the reason when a contract is refused.
    pub fn summary(&self) -> String {
        format!(
            "{}: {} ({})",
            self.mechanism.name(),
            self.status,
            self.detail
        )
    }
}

/// Is the daemon running under systemd?
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SystemdInfo {
    /// `/run/systemd/system` exists: the host was booted with systemd.
    pub booted: bool,
    /// `/proc/1/comm`.
    pub pid1_comm: Option<String>,
    /// `$NOTIFY_SOCKET` is set: started by systemd as a `Type=notify` service.
    pub notify_socket: bool,
}

/// The cgroup side of the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupInfo {
    /// The cgroup2 mount point, if any.
    pub mount: Option<PathBuf>,
    pub layout: CgroupLayout,
    /// The agents' root cgroup that was probed.
    pub root: Option<PathBuf>,
    /// `cgroup.controllers` of the root: controllers agent cgroups below it can use.
    pub controllers: Vec<String>,
    /// `cgroup.subtree_control` of the root: controllers already enabled for its children.
    pub subtree_control: Vec<String>,
    /// Controllers bound to cgroup v1 hierarchies, and where (hybrid and legacy layouts).
    pub v1_controllers: BTreeMap<String, PathBuf>,
}

/// What this host can enforce. Produced by [`probe`]; kept by the daemon for the D-Bus API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostReport {
    /// `/proc/sys/kernel/osrelease`.
    pub kernel_release: String,
    /// Effective uid of the probing process.
    pub euid: u32,
    /// The probing process holds CAP_SYS_ADMIN or CAP_BPF (BPF results mean something).
    pub privileged: bool,
    pub systemd: SystemdInfo,
    pub cgroup: CgroupInfo,
    /// Landlock ABI version, when Landlock is enabled.
    pub landlock_abi: Option<u32>,
    /// `/sys/kernel/btf/vmlinux` exists.
    pub btf: bool,
    /// Active LSMs from `/sys/kernel/security/lsm`, when securityfs is mounted and readable.
    pub lsm: Option<Vec<String>>,
    /// `/sys/kernel/security/lockdown` (`none [integrity] confidentiality`), when readable.
    pub lockdown: Option<String>,
    /// One row per [`Feature`], in [`Feature::ALL`] order.
    pub checks: Vec<Check>,
}

impl HostReport {
    /// The row for `m`.
    pub fn check(&self, m: Feature) -> Option<&Check> {
        self.checks.iter().find(|c| c.mechanism == m)
    }

    /// The status of `m` (`Error` if the row is missing, which [`probe`] never does).
    pub fn status(&self, m: Feature) -> Status {
        self.check(m).map_or(Status::Error, |c| c.status)
    }

    /// `m` is available.
    pub fn has(&self, m: Feature) -> bool {
        self.status(m) == Status::Available
    }

    /// Why `m` cannot be used (its [`Check::summary`]), or `None` when it is available.
    pub fn why_missing(&self, m: Feature) -> Option<String> {
        match self.check(m) {
            Some(c) if c.status == Status::Available => None,
            Some(c) => Some(c.summary()),
            None => Some(format!("{}: error (not probed)", m.name())),
        }
    }

    /// Rows that are not available.
    pub fn missing(&self) -> impl Iterator<Item = &Check> {
        self.checks.iter().filter(|c| c.status != Status::Available)
    }

    /// Budget controllers (of [`crate::cgroup::BUDGET_CONTROLLERS`]) that agent cgroups under
    /// the root cannot use. On a hybrid host whose controllers are bound to cgroup v1: all of
    /// them. The same rule as the supervisor's, applied to the controllers the probe found.
    pub fn missing_budgets(&self) -> Vec<String> {
        let have: Vec<&str> = BUDGET_CONTROLLERS
            .iter()
            .copied()
            .filter(|c| Feature::for_controller(c).is_some_and(|m| self.has(m)))
            .collect();
        crate::cgroup::missing_budgets(&have)
    }

    /// What this host offers a contract's binding: every contract mechanism whose row
    /// ([`Feature::for_mechanism`]) is available.
    pub fn offer(&self) -> contracts::HostOffer {
        contracts::HostOffer {
            mechanisms: contracts::Mechanism::ALL
                .into_iter()
                .filter(|m| self.has(Feature::for_mechanism(*m)))
                .collect(),
            ..Default::default()
        }
    }

    /// `(mechanism name, status, detail)` per row, for a D-Bus `a(sss)` property.
    pub fn rows(&self) -> Vec<(String, String, String)> {
        self.checks
            .iter()
            .map(|c| {
                (
                    c.mechanism.name().to_string(),
                    c.status.as_str().to_string(),
                    c.detail.clone(),
                )
            })
            .collect()
    }

    /// The report as pretty JSON (`agentosd check --json`).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }

    /// A `systemctl`-style table: a few host facts, then MECHANISM, STATUS, DETAIL columns.
    pub fn render_table(&self) -> String {
        let mut out = String::new();
        let systemd = if self.systemd.booted {
            "booted with systemd".to_string()
        } else {
            format!(
                "not running (PID 1 is {})",
                self.systemd.pid1_comm.as_deref().unwrap_or("unknown")
            )
        };
        let cgroup = match &self.cgroup.mount {
            Some(m) => format!(
                "cgroup2 at {}, {}; agents under {}",
                m.display(),
                self.cgroup.layout.as_str(),
                self.cgroup
                    .root
                    .as_deref()
                    .map_or_else(|| "-".to_string(), |r| r.display().to_string())
            ),
            None => format!("no cgroup2 mount, {}", self.cgroup.layout.as_str()),
        };
        let facts = [
            ("Kernel:", self.kernel_release.clone()),
            ("Cgroups:", cgroup),
            ("Systemd:", systemd),
            (
                "Identity:",
                format!(
                    "euid {}, {}",
                    self.euid,
                    if self.privileged {
                        "privileged (CAP_SYS_ADMIN or CAP_BPF)"
                    } else {
                        "unprivileged: kernel checks that need privileges report error"
                    }
                ),
            ),
            (
                "LSMs:",
                match (&self.lsm, &self.lockdown) {
                    (Some(l), Some(d)) => format!("{}; lockdown {d}", l.join(",")),
                    (Some(l), None) => l.join(","),
                    (None, _) => "unknown (securityfs not mounted or not readable)".to_string(),
                },
            ),
        ];
        for (k, v) in facts {
            let _ = writeln!(out, "{k:<10} {v}");
        }
        out.push('\n');

        let w_name = self
            .checks
            .iter()
            .map(|c| c.mechanism.name().len())
            .chain(["MECHANISM".len()])
            .max()
            .unwrap_or(9);
        let w_status = "unavailable".len();
        let _ = writeln!(
            out,
            "{:<w_name$}  {:<w_status$}  DETAIL",
            "MECHANISM", "STATUS"
        );
        for c in &self.checks {
            let _ = writeln!(
                out,
                "{:<w_name$}  {:<w_status$}  {}",
                c.mechanism.name(),
                c.status.as_str(),
                c.detail
            );
        }
        let count = |s| self.checks.iter().filter(|c| c.status == s).count();
        let _ = writeln!(
            out,
            "\n{} available, {} unavailable, {} error.",
            count(Status::Available),
            count(Status::Unavailable),
            count(Status::Error)
        );
        let missing = self.missing_budgets();
        if !missing.is_empty() {
            let _ = writeln!(
                out,
                "Budgets agents cannot have here: {} (contracts that must have them are refused).",
                missing.join(", ")
            );
        }
        out
    }
}
