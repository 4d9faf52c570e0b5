//! Host capability probe: what this kernel can enforce (`agentosd check`).
//!
//! The daemon never pretends. At start-up it runs [`probe`] once and keeps the [`HostReport`]:
//! every kernel mechanism agentos uses is one row ([`Check`]) with a [`Status`] and a detail that
//! names the kernel interface that was tried and why it failed (errno, missing file, kernel
//! configuration). A contract whose `must` needs a mechanism that is not [`Status::Available`]
//! is refused with that row's [`Check::summary`] as the reason.
//!
//! Every row is a real attempt, not a guess from the kernel version: BPF program types are
//! loaded as a two-instruction program (`mov r0, N; exit`) and closed again, the ring buffer map
//! is created and closed, `SCHED_DEADLINE` is set on a throw-away thread, a scratch child
//! cgroup is made and removed under the agents' root. Nothing is attached and nothing outside
//! the scratch cgroup and the probe's own threads is touched.

mod btf;
mod cgroup;
mod sys;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use serde::{Deserialize, Serialize};

pub use cgroup::{BUDGET_CONTROLLERS, CgroupLayout};

/// Where to probe.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProbeOptions {
    /// The cgroup under which agents will live (the daemon's delegated cgroup). When `None`, the
    /// cgroup2 mount found in `/proc/self/mountinfo` (`/sys/fs/cgroup` on a pure v2 host,
    /// `/sys/fs/cgroup/unified` on a hybrid one).
    pub cgroup_root: Option<PathBuf>,
}

/// A kernel mechanism agentos uses; one row of the report each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mechanism {
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
    Landlock,
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
    /// Landlock and seccomp denials of agents logged by the kernel's audit subsystem and
    /// readable by the daemon (`AUDIT_NLGRP_READLOG`); see enforce/kaudit.rs.
    KernelAudit,
}

impl Mechanism {
    /// Every mechanism, in report order.
    pub const ALL: [Mechanism; 29] = [
        Mechanism::CgroupV2,
        Mechanism::CgroupRoot,
        Mechanism::CpuController,
        Mechanism::MemoryController,
        Mechanism::PidsController,
        Mechanism::IoController,
        Mechanism::CpusetController,
        Mechanism::CgroupFreeze,
        Mechanism::CgroupKill,
        Mechanism::Pressure,
        Mechanism::Clone3IntoCgroup,
        Mechanism::Pidfd,
        Mechanism::SchedDeadline,
        Mechanism::SchedExt,
        Mechanism::Landlock,
        Mechanism::Seccomp,
        Mechanism::SeccompUserNotif,
        Mechanism::Btf,
        Mechanism::Tracefs,
        Mechanism::BpfTracepoint,
        Mechanism::BpfRawTracepoint,
        Mechanism::BpfTpBtf,
        Mechanism::BpfCgroupSockAddr,
        Mechanism::BpfCgroupSkb,
        Mechanism::BpfLsm,
        Mechanism::BpfFentry,
        Mechanism::BpfRingbuf,
        Mechanism::IoUring,
        Mechanism::KernelAudit,
    ];

    /// The name shown in the table and in refusal reasons.
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::CgroupV2 => "cgroup v2",
            Mechanism::CgroupRoot => "agents cgroup",
            Mechanism::CpuController => "cpu controller",
            Mechanism::MemoryController => "memory controller",
            Mechanism::PidsController => "pids controller",
            Mechanism::IoController => "io controller",
            Mechanism::CpusetController => "cpuset controller",
            Mechanism::CgroupFreeze => "cgroup freeze",
            Mechanism::CgroupKill => "cgroup kill",
            Mechanism::Pressure => "pressure (psi)",
            Mechanism::Clone3IntoCgroup => "clone3 into cgroup",
            Mechanism::Pidfd => "pidfd",
            Mechanism::SchedDeadline => "sched_deadline",
            Mechanism::SchedExt => "sched_ext",
            Mechanism::Landlock => "landlock",
            Mechanism::Seccomp => "seccomp",
            Mechanism::SeccompUserNotif => "seccomp user notify",
            Mechanism::Btf => "btf",
            Mechanism::Tracefs => "tracefs",
            Mechanism::BpfTracepoint => "bpf tracepoint",
            Mechanism::BpfRawTracepoint => "bpf raw tracepoint",
            Mechanism::BpfTpBtf => "bpf tp_btf",
            Mechanism::BpfCgroupSockAddr => "bpf cgroup sock_addr",
            Mechanism::BpfCgroupSkb => "bpf cgroup skb",
            Mechanism::BpfLsm => "bpf lsm",
            Mechanism::BpfFentry => "bpf fentry",
            Mechanism::BpfRingbuf => "bpf ringbuf",
            Mechanism::IoUring => "io_uring",
            Mechanism::KernelAudit => "kernel audit (denials)",
        }
    }

    /// The cgroup v2 controller this row is about, if it is a controller row.
    pub fn controller(self) -> Option<&'static str> {
        match self {
            Mechanism::CpuController => Some("cpu"),
            Mechanism::MemoryController => Some("memory"),
            Mechanism::PidsController => Some("pids"),
            Mechanism::IoController => Some("io"),
            Mechanism::CpusetController => Some("cpuset"),
            _ => None,
        }
    }

    /// The controller row for a cgroup v2 controller name (`"cpu"` → [`Mechanism::CpuController`]).
    pub fn for_controller(name: &str) -> Option<Mechanism> {
        Mechanism::ALL
            .into_iter()
            .find(|m| m.controller() == Some(name))
    }
}

impl std::fmt::Display for Mechanism {
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
    pub mechanism: Mechanism,
    pub status: Status,
    /// The kernel interface tried and the result, e.g.
    /// `BPF_PROG_LOAD BPF_PROG_TYPE_LSM: EPERM — kernel lockdown or lsm= lacks bpf`.
    pub detail: String,
}

impl Check {
    fn new(mechanism: Mechanism, status: Status, detail: impl Into<String>) -> Check {
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
    /// One row per [`Mechanism`], in [`Mechanism::ALL`] order.
    pub checks: Vec<Check>,
}

impl HostReport {
    /// The row for `m`.
    pub fn check(&self, m: Mechanism) -> Option<&Check> {
        self.checks.iter().find(|c| c.mechanism == m)
    }

    /// The status of `m` (`Error` if the row is missing, which [`probe`] never does).
    pub fn status(&self, m: Mechanism) -> Status {
        self.check(m).map_or(Status::Error, |c| c.status)
    }

    /// `m` is available.
    pub fn has(&self, m: Mechanism) -> bool {
        self.status(m) == Status::Available
    }

    /// Why `m` cannot be used (its [`Check::summary`]), or `None` when it is available.
    pub fn why_missing(&self, m: Mechanism) -> Option<String> {
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

    /// Budget controllers (of cpu, memory, pids, io, cpuset) that agent cgroups under the root
    /// cannot use. On a hybrid host whose controllers are bound to cgroup v1: all of them.
    pub fn missing_budgets(&self) -> Vec<String> {
        BUDGET_CONTROLLERS
            .iter()
            .filter(|c| Mechanism::for_controller(c).is_some_and(|m| !self.has(m)))
            .map(|c| c.to_string())
            .collect()
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

/// Probes the host. Never fails as a whole and never panics: each mechanism becomes a row.
pub fn probe(opts: &ProbeOptions) -> HostReport {
    let euid = rustix::process::geteuid().as_raw();
    let cap_eff = read_trimmed("/proc/self/status").ok().and_then(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
    });
    const CAP_SYS_NICE: u64 = 1 << 23;
    const CAP_SYS_ADMIN: u64 = 1 << 21;
    const CAP_BPF: u64 = 1 << 39;
    let privileged = cap_eff.is_some_and(|c| c & (CAP_SYS_ADMIN | CAP_BPF) != 0);

    let lsm = read_trimmed("/sys/kernel/security/lsm")
        .ok()
        .map(|s| s.split(',').map(str::to_string).collect::<Vec<_>>());
    let lockdown = read_trimmed("/sys/kernel/security/lockdown").ok();
    let ctx = Ctx {
        privileged,
        sys_nice: cap_eff.is_some_and(|c| c & CAP_SYS_NICE != 0),
        lsm: lsm.clone(),
        lockdown: lockdown.clone(),
    };

    let mut checks = Vec::new();
    let cgroup = guarded(&mut checks, |rows| probe_cgroups(opts, rows));
    let landlock_abi = guarded(&mut checks, |rows| {
        let (row, abi) = probe_landlock();
        rows.push(row);
        abi
    })
    .flatten();
    guarded(&mut checks, probe_seccomp);
    guarded(&mut checks, |rows| rows.push(probe_sched_deadline(&ctx)));
    guarded(&mut checks, |rows| rows.push(probe_pidfd()));
    guarded(&mut checks, |rows| rows.push(probe_io_uring()));
    guarded(&mut checks, |rows| rows.push(probe_kernel_audit()));
    let btf = guarded(&mut checks, |rows| probe_bpf(&ctx, rows)).unwrap_or(false);

    // Any row a panicking group did not produce is reported as an error rather than left out.
    for m in Mechanism::ALL {
        if !checks.iter().any(|c| c.mechanism == m) {
            checks.push(Check::new(
                m,
                Status::Error,
                "probe did not finish (internal error, see the daemon log)",
            ));
        }
    }
    checks.sort_by_key(|c| Mechanism::ALL.iter().position(|m| *m == c.mechanism));

    HostReport {
        kernel_release: read_trimmed("/proc/sys/kernel/osrelease")
            .unwrap_or_else(|_| "unknown".into()),
        euid,
        privileged,
        systemd: SystemdInfo {
            booted: Path::new("/run/systemd/system").is_dir(),
            pid1_comm: read_trimmed("/proc/1/comm").ok(),
            notify_socket: std::env::var_os("NOTIFY_SOCKET").is_some(),
        },
        cgroup: cgroup.unwrap_or(CgroupInfo {
            mount: None,
            layout: CgroupLayout::None,
            root: None,
            controllers: Vec::new(),
            subtree_control: Vec::new(),
            v1_controllers: BTreeMap::new(),
        }),
        landlock_abi,
        btf,
        lsm,
        lockdown,
        checks,
    }
}

/// Runs one group of checks; a panic inside becomes an `error` row instead of a crash.
/// The rows of a group that panicked halfway are kept; [`probe`] fills in the missing ones.
fn guarded<T>(checks: &mut Vec<Check>, f: impl FnOnce(&mut Vec<Check>) -> T) -> Option<T> {
    let mut rows = Vec::new();
    let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&mut rows)));
    checks.append(&mut rows);
    res.ok()
}

struct Ctx {
    privileged: bool,
    sys_nice: bool,
    lsm: Option<Vec<String>>,
    lockdown: Option<String>,
}

fn read_trimmed(path: impl AsRef<Path>) -> std::io::Result<String> {
    std::fs::read_to_string(path).map(|s| s.trim().to_string())
}

fn io_errno(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(n) => format!("{:?}", Errno::from_raw(n)),
        None => e.to_string(),
    }
}

// ---------------------------------------------------------------------------------------------
// cgroups

fn probe_cgroups(opts: &ProbeOptions, rows: &mut Vec<Check>) -> CgroupInfo {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo");
    let mounts = match &mountinfo {
        Ok(text) => cgroup::parse_mountinfo(text),
        Err(_) => cgroup::Mounts::default(),
    };
    let layout = mounts.layout();
    let root = opts.cgroup_root.clone().or_else(|| mounts.cgroup2.clone());
    let mut info = CgroupInfo {
        mount: mounts.cgroup2.clone(),
        layout,
        root: root.clone(),
        controllers: Vec::new(),
        subtree_control: Vec::new(),
        v1_controllers: mounts.v1_controllers.clone(),
    };

    // cgroup v2 mount
    rows.push(match (&mountinfo, &mounts.cgroup2) {
        (Err(e), _) => Check::new(
            Mechanism::CgroupV2,
            Status::Error,
            format!("cannot read /proc/self/mountinfo: {}", io_errno(e)),
        ),
        (Ok(_), Some(m)) if layout == CgroupLayout::Unified => Check::new(
            Mechanism::CgroupV2,
            Status::Available,
            format!("cgroup2 at {} (unified hierarchy)", m.display()),
        ),
        (Ok(_), Some(m)) => {
            let v1: Vec<&str> = mounts.v1_controllers.keys().map(String::as_str).collect();
            Check::new(
                Mechanism::CgroupV2,
                Status::Available,
                format!(
                    "cgroup2 at {} (hybrid: cgroup v1 holds {}; boot with systemd.unified_cgroup_hierarchy=1)",
                    m.display(),
                    if v1.is_empty() { "named hierarchies".to_string() } else { v1.join(" ") }
                ),
            )
        }
        (Ok(_), None) => Check::new(
            Mechanism::CgroupV2,
            Status::Unavailable,
            "no cgroup2 mount in /proc/self/mountinfo (mount -t cgroup2 none /sys/fs/cgroup, or boot with systemd.unified_cgroup_hierarchy=1)",
        ),
    });

    let Some(root) = root else {
        for m in [
            Mechanism::CgroupRoot,
            Mechanism::CpuController,
            Mechanism::MemoryController,
            Mechanism::PidsController,
            Mechanism::IoController,
            Mechanism::CpusetController,
            Mechanism::CgroupFreeze,
            Mechanism::CgroupKill,
            Mechanism::Clone3IntoCgroup,
        ] {
            rows.push(Check::new(
                m,
                Status::Unavailable,
                "no cgroup2 hierarchy to put agents in",
            ));
        }
        rows.push(probe_pressure(None));
        return info;
    };

    // The agents' root: on cgroup2, and can we make children?
    let on_cgroup2 = nix::sys::statfs::statfs(&root)
        .map(|s| s.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC);
    let mut scratch = None;
    let root_row = match on_cgroup2 {
        Err(e) => Check::new(
            Mechanism::CgroupRoot,
            Status::Unavailable,
            format!("{}: {e:?} (statfs)", root.display()),
        ),
        Ok(false) => Check::new(
            Mechanism::CgroupRoot,
            Status::Unavailable,
            format!("{} is not on a cgroup2 filesystem", root.display()),
        ),
        Ok(true) => match cgroup::Scratch::create(&root) {
            Ok(s) => {
                scratch = Some(s);
                Check::new(
                    Mechanism::CgroupRoot,
                    Status::Available,
                    format!(
                        "{}: cgroup2, child cgroups can be created (made and removed one)",
                        root.display()
                    ),
                )
            }
            Err(e) => Check::new(
                Mechanism::CgroupRoot,
                match e.raw_os_error() {
                    Some(libc::EACCES | libc::EPERM | libc::EROFS) => Status::Unavailable,
                    _ => Status::Error,
                },
                format!(
                    "{}: mkdir of a child cgroup failed: {} (needs root, or a delegated cgroup: Delegate=yes)",
                    root.display(),
                    io_errno(&e)
                ),
            ),
        },
    };
    rows.push(root_row);

    // Controllers.
    match cgroup::read_controllers(&root) {
        Ok((controllers, subtree)) => {
            info.controllers = controllers;
            info.subtree_control = subtree;
        }
        Err(e) => {
            for c in BUDGET_CONTROLLERS {
                if let Some(m) = Mechanism::for_controller(c) {
                    rows.push(Check::new(
                        m,
                        if on_cgroup2.as_ref().is_ok_and(|b| *b) {
                            Status::Error
                        } else {
                            Status::Unavailable
                        },
                        format!(
                            "cannot read {}/cgroup.controllers: {}",
                            root.display(),
                            io_errno(&e)
                        ),
                    ));
                }
            }
        }
    }
    if !rows.iter().any(|r| r.mechanism.controller().is_some()) {
        let mount_controllers = mounts
            .cgroup2
            .as_deref()
            .and_then(|m| cgroup::read_controllers(m).ok())
            .map(|(c, _)| c)
            .unwrap_or_default();
        for c in BUDGET_CONTROLLERS {
            let Some(m) = Mechanism::for_controller(c) else {
                continue;
            };
            rows.push(controller_row(
                m,
                c,
                &root,
                &info,
                &mounts,
                &mount_controllers,
            ));
        }
    }

    // freeze / kill: these files exist in every non-root cgroup of a kernel that has them.
    // Only non-root cgroups have cgroup.type; below a hierarchy root, look in the scratch child.
    let (probe_dir, where_) = if root.join("cgroup.type").exists() {
        (Some(root.clone()), root.display().to_string())
    } else {
        (
            scratch.as_ref().map(|s| s.path().to_path_buf()),
            format!("a child of {}", root.display()),
        )
    };
    for (m, file, since) in [
        (Mechanism::CgroupFreeze, "cgroup.freeze", "5.2"),
        (Mechanism::CgroupKill, "cgroup.kill", "5.14"),
    ] {
        rows.push(match &probe_dir {
            Some(dir) if dir.join(file).exists() => Check::new(
                m,
                Status::Available,
                format!("{file} present (checked in {where_})"),
            ),
            Some(_) => Check::new(
                m,
                Status::Unavailable,
                format!("no {file} in {where_} (kernel older than {since})"),
            ),
            None => Check::new(
                m,
                Status::Error,
                format!(
                    "cannot tell: {} is a hierarchy root and no child cgroup could be made",
                    root.display()
                ),
            ),
        });
    }

    rows.push(probe_pressure(
        probe_dir.as_deref().map(|d| (d, where_.as_str())),
    ));
    rows.push(probe_clone3(scratch.as_ref().map(|s| s.path())));
    drop(scratch);
    info
}

fn controller_row(
    m: Mechanism,
    c: &str,
    root: &Path,
    info: &CgroupInfo,
    mounts: &cgroup::Mounts,
    mount_controllers: &[String],
) -> Check {
    if info.controllers.iter().any(|x| x == c) {
        let enabled = info.subtree_control.iter().any(|x| x == c);
        return Check::new(
            m,
            Status::Available,
            format!(
                "in {}/cgroup.controllers{}",
                root.display(),
                if enabled {
                    ", enabled in cgroup.subtree_control"
                } else {
                    "; not yet in cgroup.subtree_control (agentosd enables it)"
                }
            ),
        );
    }
    let why = if let Some(v1) = mounts.v1_controllers.get(cgroup::v1_name(c)) {
        format!(
            "bound to cgroup v1 at {} (boot with systemd.unified_cgroup_hierarchy=1 / cgroup_no_v1=all)",
            v1.display()
        )
    } else if mount_controllers.iter().any(|x| x == c) {
        "not delegated: enable it in the parent's cgroup.subtree_control (systemd: Delegate=yes)"
            .to_string()
    } else if kernel_has_controller(c) {
        "enabled in the kernel but not attached to the cgroup2 hierarchy".to_string()
    } else {
        "not in /proc/cgroups (kernel built without it, or disabled with cgroup_disable=)"
            .to_string()
    };
    Check::new(
        m,
        Status::Unavailable,
        format!("not in {}/cgroup.controllers: {why}", root.display()),
    )
}

/// `/proc/cgroups` lists the controller as enabled.
fn kernel_has_controller(c: &str) -> bool {
    std::fs::read_to_string("/proc/cgroups").is_ok_and(|t| {
        t.lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.first() == Some(&cgroup::v1_name(c)) && f.get(3) == Some(&"1")
        })
    })
}

fn probe_pressure(dir: Option<(&Path, &str)>) -> Check {
    if let Some((d, where_)) = dir
        && d.join("cpu.pressure").exists()
    {
        return Check::new(
            Mechanism::Pressure,
            Status::Available,
            format!("cpu/memory/io.pressure per cgroup (checked in {where_})"),
        );
    }
    if Path::new("/proc/pressure/cpu").exists() {
        Check::new(
            Mechanism::Pressure,
            Status::Available,
            "/proc/pressure (system-wide only)",
        )
    } else {
        Check::new(
            Mechanism::Pressure,
            Status::Unavailable,
            "no /proc/pressure (kernel without CONFIG_PSI, or booted with psi=0)",
        )
    }
}

fn probe_clone3(scratch: Option<&Path>) -> Check {
    let m = Mechanism::Clone3IntoCgroup;
    if let Some(dir) = scratch {
        match std::fs::File::open(dir) {
            Ok(f) => {
                return match sys::clone3_into_cgroup(f.as_raw_fd()) {
                    Ok(()) => Check::new(
                        m,
                        Status::Available,
                        format!(
                            "clone3(CLONE_INTO_CGROUP) started a child in a scratch child of {}",
                            dir.parent().unwrap_or(dir).display()
                        ),
                    ),
                    Err(e) => clone3_err(e),
                };
            }
            Err(e) => {
                return Check::new(
                    m,
                    Status::Error,
                    format!("cannot open {}: {}", dir.display(), io_errno(&e)),
                );
            }
        }
    }
    // No cgroup to try: a kernel that knows the flag rejects a closed fd with EBADF (a negative
    // one would be EINVAL for everyone: the field must be <= INT_MAX).
    match sys::clone3_into_cgroup(RawFd::MAX) {
        Err(Errno::EBADF) => Check::new(
            m,
            Status::Available,
            "kernel accepts CLONE_INTO_CGROUP (EBADF for a bad fd; not tried for real: no scratch cgroup)",
        ),
        Ok(()) => Check::new(
            m,
            Status::Error,
            "clone3 with cgroup fd -1 unexpectedly succeeded",
        ),
        Err(e) => clone3_err(e),
    }
}

fn clone3_err(e: Errno) -> Check {
    let m = Mechanism::Clone3IntoCgroup;
    match e {
        Errno::ENOSYS => Check::new(
            m,
            Status::Unavailable,
            "clone3: ENOSYS (kernel older than 5.3)",
        ),
        Errno::EINVAL | Errno::E2BIG => Check::new(
            m,
            Status::Unavailable,
            format!("clone3(CLONE_INTO_CGROUP): {e:?} (kernel older than 5.7)"),
        ),
        _ => Check::new(
            m,
            Status::Error,
            format!("clone3(CLONE_INTO_CGROUP): {e:?}"),
        ),
    }
}

// ---------------------------------------------------------------------------------------------
// sandboxing

fn probe_landlock() -> (Check, Option<u32>) {
    let m = Mechanism::Landlock;
    match sys::landlock_abi_version() {
        Ok(abi) => {
            let features = match abi {
                0 => "",
                1..=3 => "filesystem rules",
                4..=5 => "filesystem and TCP bind/connect rules",
                _ => "filesystem, TCP bind/connect rules, signal and abstract-socket scoping",
            };
            (
                Check::new(
                    m,
                    Status::Available,
                    format!(
                        "landlock_create_ruleset(LANDLOCK_CREATE_RULESET_VERSION): ABI {abi} ({features})"
                    ),
                ),
                Some(abi),
            )
        }
        Err(Errno::ENOSYS) => (
            Check::new(
                m,
                Status::Unavailable,
                "landlock_create_ruleset: ENOSYS — kernel built without CONFIG_SECURITY_LANDLOCK",
            ),
            None,
        ),
        Err(Errno::EOPNOTSUPP) => (
            Check::new(
                m,
                Status::Unavailable,
                "landlock_create_ruleset: EOPNOTSUPP — built in but not enabled: add landlock to lsm= on the kernel command line",
            ),
            None,
        ),
        Err(e) => (
            Check::new(m, Status::Error, format!("landlock_create_ruleset: {e:?}")),
            None,
        ),
    }
}

/// Whether Landlock and seccomp denials of agents reach the audit trail: the audit netlink
/// multicast group is readable, the kernel logs Landlock denials (ABI 7, audit enabled) and
/// seccomp errno actions (`actions_logged`).
fn probe_kernel_audit() -> Check {
    use crate::enforce::kaudit;
    let m = Mechanism::KernelAudit;
    if let Err(e) = kaudit::open_readlog() {
        return Check::new(
            m,
            Status::Unavailable,
            format!("{e}: Landlock and seccomp denials of agents are not recorded"),
        );
    }
    let gaps = kaudit::gaps();
    if gaps.is_empty() {
        Check::new(
            m,
            Status::Available,
            "audit netlink readable (AUDIT_NLGRP_READLOG); Landlock (ABI 7, audit enabled) and seccomp (errno in actions_logged) denials are logged",
        )
    } else {
        Check::new(
            m,
            Status::Unavailable,
            format!("audit netlink readable, but {}", gaps.join("; ")),
        )
    }
}

fn probe_seccomp(rows: &mut Vec<Check>) {
    let mode = match sys::seccomp_mode() {
        Ok(0) => "this process is not filtered".to_string(),
        Ok(2) => "this process already runs under a seccomp filter".to_string(),
        Ok(n) => format!("PR_GET_SECCOMP = {n}"),
        Err(e) => format!("PR_GET_SECCOMP: {e:?}"),
    };
    let actions = [
        ("errno", sys::SECCOMP_RET_ERRNO),
        ("kill_process", sys::SECCOMP_RET_KILL_PROCESS),
        ("log", sys::SECCOMP_RET_LOG),
    ];
    let mut ok = Vec::new();
    let mut missing = Vec::new();
    let mut fatal = None;
    for (name, action) in actions {
        match sys::seccomp_action_avail(action) {
            Ok(()) => ok.push(name),
            Err(Errno::EOPNOTSUPP) => missing.push(name),
            Err(e) => {
                fatal = Some(e);
                break;
            }
        }
    }
    rows.push(match fatal {
        Some(Errno::ENOSYS | Errno::EINVAL) => Check::new(
            Mechanism::Seccomp,
            Status::Unavailable,
            format!(
                "seccomp(SECCOMP_GET_ACTION_AVAIL): {:?} — kernel without CONFIG_SECCOMP_FILTER (or older than 4.14)",
                fatal.unwrap_or(Errno::ENOSYS)
            ),
        ),
        Some(e) => Check::new(
            Mechanism::Seccomp,
            Status::Error,
            format!("seccomp(SECCOMP_GET_ACTION_AVAIL): {e:?}"),
        ),
        None if missing.contains(&"errno") || missing.contains(&"kill_process") => Check::new(
            Mechanism::Seccomp,
            Status::Unavailable,
            format!("filter actions missing: {}; {mode}", missing.join(", ")),
        ),
        None => Check::new(
            Mechanism::Seccomp,
            Status::Available,
            format!(
                "filter mode, actions {} available{}; {mode}",
                ok.join(", "),
                if missing.is_empty() { String::new() } else { format!(" ({} missing)", missing.join(", ")) }
            ),
        ),
    });

    rows.push(
        match (
            sys::seccomp_action_avail(sys::SECCOMP_RET_USER_NOTIF),
            sys::seccomp_notif_sizes(),
        ) {
            (Ok(()), Ok((n, r, d))) => Check::new(
                Mechanism::SeccompUserNotif,
                Status::Available,
                format!("SECCOMP_RET_USER_NOTIF available (notif {n} / resp {r} / data {d} bytes)"),
            ),
            (Err(e), _) | (_, Err(e)) => Check::new(
                Mechanism::SeccompUserNotif,
                if matches!(e, Errno::EOPNOTSUPP | Errno::EINVAL | Errno::ENOSYS) {
                    Status::Unavailable
                } else {
                    Status::Error
                },
                format!("SECCOMP_RET_USER_NOTIF: {e:?} (kernel older than 5.0)"),
            ),
        },
    );
}

// ---------------------------------------------------------------------------------------------
// scheduling

fn probe_sched_deadline(ctx: &Ctx) -> Check {
    let m = Mechanism::SchedDeadline;
    let runtime = read_trimmed("/proc/sys/kernel/sched_rt_runtime_us").ok();
    let period = read_trimmed("/proc/sys/kernel/sched_rt_period_us").ok();
    let bandwidth = match (
        runtime.as_deref().and_then(|r| r.parse::<i64>().ok()),
        period.as_deref().and_then(|p| p.parse::<i64>().ok()),
    ) {
        (Some(-1), _) => "admission limit: none (sched_rt_runtime_us = -1)".to_string(),
        (Some(r), Some(p)) if p > 0 => format!(
            "admission limit {}% of each CPU (sched_rt_runtime_us {r} / sched_rt_period_us {p})",
            r * 100 / p
        ),
        _ => "admission limit unknown (cannot read sched_rt_runtime_us)".to_string(),
    };
    // 1 ms every 100 ms: 1% of a CPU, for the microseconds the probe thread lives.
    let attempt = std::thread::Builder::new()
        .name("probe-deadline".into())
        .spawn(|| {
            let res =
                sys::sched_setattr_self(sys::SCHED_DEADLINE, 1_000_000, 100_000_000, 100_000_000);
            if res.is_ok() {
                // Give the bandwidth back before exiting.
                let _ = sys::sched_setattr_self(sys::SCHED_OTHER, 0, 0, 0);
            }
            res
        });
    let res = match attempt {
        Ok(h) => match h.join() {
            Ok(r) => r,
            Err(_) => return Check::new(m, Status::Error, "probe thread panicked"),
        },
        Err(e) => {
            return Check::new(
                m,
                Status::Error,
                format!("cannot start probe thread: {}", io_errno(&e)),
            );
        }
    };
    match res {
        Ok(()) => Check::new(
            m,
            Status::Available,
            format!("sched_setattr(SCHED_DEADLINE 1ms/100ms) on a probe thread; {bandwidth}"),
        ),
        Err(Errno::EPERM) if !ctx.sys_nice => Check::new(
            m,
            Status::Error,
            "sched_setattr(SCHED_DEADLINE): EPERM — this process lacks CAP_SYS_NICE; run the check as root",
        ),
        Err(Errno::EPERM) => Check::new(
            m,
            Status::Unavailable,
            format!(
                "sched_setattr(SCHED_DEADLINE): EPERM — needs CAP_SYS_NICE, and the thread's CPU affinity must span its root domain (a restricted cpuset refuses it); {bandwidth}"
            ),
        ),
        Err(Errno::EBUSY) => Check::new(
            m,
            Status::Unavailable,
            format!(
                "sched_setattr(SCHED_DEADLINE): EBUSY — admission control refused even 1%; {bandwidth}"
            ),
        ),
        Err(e @ (Errno::EINVAL | Errno::ENOSYS)) => Check::new(
            m,
            Status::Unavailable,
            format!("sched_setattr(SCHED_DEADLINE): {e:?} — kernel without SCHED_DEADLINE"),
        ),
        Err(e) => Check::new(
            m,
            Status::Error,
            format!("sched_setattr(SCHED_DEADLINE): {e:?}; {bandwidth}"),
        ),
    }
}

fn probe_sched_ext(has_ops_btf: Option<bool>) -> Check {
    let m = Mechanism::SchedExt;
    match read_trimmed("/sys/kernel/sched_ext/state") {
        Ok(state) => {
            let ops = read_trimmed("/sys/kernel/sched_ext/root/ops")
                .ok()
                .filter(|s| !s.is_empty());
            let detail = match (state.as_str(), ops) {
                ("disabled", _) => "/sys/kernel/sched_ext/state: disabled (no BPF scheduler loaded; scx_agentos can load: agentosd --sched-ext)".to_string(),
                ("enabled", Some(ops)) if scx_agentos::is_agentos_ops(&ops) => format!("/sys/kernel/sched_ext/state: enabled, scx_agentos loaded (root/ops {ops}): SRT first, DT on idle time"),
                (s, Some(ops)) => format!("/sys/kernel/sched_ext/state: {s}, scheduler {ops} loaded (another scheduler blocks scx_agentos until it exits)"),
                (s, None) => format!("/sys/kernel/sched_ext/state: {s}"),
            };
            Check::new(m, Status::Available, detail)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Check::new(
            m,
            Status::Unavailable,
            format!(
                "no /sys/kernel/sched_ext — kernel built without CONFIG_SCHED_CLASS_EXT{} (SRT falls back to cpu.weight)",
                match has_ops_btf {
                    Some(false) => "; vmlinux BTF has no sched_ext_ops",
                    _ => "",
                }
            ),
        ),
        Err(e) => Check::new(
            m,
            Status::Error,
            format!("cannot read /sys/kernel/sched_ext/state: {}", io_errno(&e)),
        ),
    }
}

// ---------------------------------------------------------------------------------------------
// misc

fn probe_pidfd() -> Check {
    match sys::pidfd_open_self() {
        Ok(()) => Check::new(Mechanism::Pidfd, Status::Available, "pidfd_open(2) on self"),
        Err(e @ Errno::ENOSYS) => Check::new(
            Mechanism::Pidfd,
            Status::Unavailable,
            format!("pidfd_open: {e:?} (kernel older than 5.3)"),
        ),
        Err(e) => Check::new(
            Mechanism::Pidfd,
            Status::Error,
            format!("pidfd_open: {e:?}"),
        ),
    }
}

fn probe_io_uring() -> Check {
    let m = Mechanism::IoUring;
    let disabled = read_trimmed("/proc/sys/kernel/io_uring_disabled")
        .ok()
        .and_then(|s| s.parse::<u32>().ok());
    match sys::io_uring_probe(4) {
        Ok(features) => Check::new(
            m,
            Status::Available,
            format!(
                "io_uring_setup(4 entries), features {features:#x}{}",
                match disabled {
                    Some(1) => "; kernel.io_uring_disabled=1 (only root and kernel.io_uring_group)",
                    _ => "",
                }
            ),
        ),
        Err(Errno::ENOSYS) => Check::new(
            m,
            Status::Unavailable,
            "io_uring_setup: ENOSYS — kernel built without CONFIG_IO_URING",
        ),
        Err(Errno::EPERM) => Check::new(
            m,
            Status::Unavailable,
            format!(
                "io_uring_setup: EPERM — kernel.io_uring_disabled={} (set it to 0)",
                disabled.map_or_else(|| "?".to_string(), |d| d.to_string())
            ),
        ),
        Err(e) => Check::new(m, Status::Error, format!("io_uring_setup: {e:?}")),
    }
}

// ---------------------------------------------------------------------------------------------
// BTF, tracefs, BPF

/// Produces the Btf, Tracefs, Bpf*, and SchedExt rows; returns whether vmlinux BTF exists.
fn probe_bpf(ctx: &Ctx, rows: &mut Vec<Check>) -> bool {
    const VMLINUX: &str = "/sys/kernel/btf/vmlinux";
    let wanted = [
        (btf::Kind::Func, "bpf_lsm_file_open"),
        (btf::Kind::Func, "vfs_read"),
        (btf::Kind::Typedef, "btf_trace_sys_enter"),
        (btf::Kind::Struct, "sched_ext_ops"),
    ];
    let (btf_present, ids) = match std::fs::read(VMLINUX) {
        Ok(data) => match btf::find_type_ids(&data, &wanted) {
            Ok(ids) => {
                rows.push(Check::new(
                    Mechanism::Btf,
                    Status::Available,
                    format!("{VMLINUX} ({} KiB)", data.len() / 1024),
                ));
                (true, Ok(ids))
            }
            Err(e) => {
                rows.push(Check::new(
                    Mechanism::Btf,
                    Status::Error,
                    format!("{VMLINUX}: {e}"),
                ));
                (true, Err(format!("{VMLINUX} unreadable: {e}")))
            }
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            rows.push(Check::new(
                Mechanism::Btf,
                Status::Unavailable,
                format!("no {VMLINUX} — kernel built without CONFIG_DEBUG_INFO_BTF (CO-RE and LSM/fentry hooks need it)"),
            ));
            (false, Err(format!("no {VMLINUX}")))
        }
        Err(e) => {
            let msg = format!("cannot read {VMLINUX}: {}", io_errno(&e));
            rows.push(Check::new(Mechanism::Btf, Status::Error, msg.clone()));
            (true, Err(msg))
        }
    };
    let id =
        |i: usize| -> Result<u32, String> {
            match &ids {
                Ok(v) => v.get(i).copied().flatten().ok_or_else(|| {
                    format!("no {} in {VMLINUX}", wanted.get(i).map_or("?", |w| w.1))
                }),
                Err(e) => Err(e.clone()),
            }
        };
    rows.push(probe_sched_ext(
        ids.as_ref()
            .ok()
            .map(|v| v.get(3).copied().flatten().is_some()),
    ));

    rows.push(if Path::new("/sys/kernel/tracing/events").is_dir() {
        Check::new(Mechanism::Tracefs, Status::Available, "/sys/kernel/tracing")
    } else if Path::new("/sys/kernel/debug/tracing/events").is_dir() {
        Check::new(Mechanism::Tracefs, Status::Available, "/sys/kernel/debug/tracing")
    } else if Path::new("/sys/kernel/tracing").is_dir() {
        Check::new(
            Mechanism::Tracefs,
            Status::Unavailable,
            "not mounted (mount -t tracefs tracefs /sys/kernel/tracing); tracepoint programs load but cannot be attached by name",
        )
    } else {
        Check::new(
            Mechanism::Tracefs,
            Status::Unavailable,
            "no /sys/kernel/tracing — kernel built without CONFIG_TRACING",
        )
    });

    use sys::ProgSpec;
    let plain = |prog_type, expected_attach_type, ret| {
        Ok(ProgSpec {
            prog_type,
            expected_attach_type,
            attach_btf_id: 0,
            ret,
        })
    };
    let with_btf = |prog_type, expected_attach_type, idx: usize| {
        id(idx).map(|attach_btf_id| ProgSpec {
            prog_type,
            expected_attach_type,
            attach_btf_id,
            ret: 0,
        })
    };
    let progs: [(Mechanism, &str, Result<ProgSpec, String>); 7] = [
        (
            Mechanism::BpfTracepoint,
            "BPF_PROG_TYPE_TRACEPOINT",
            plain(sys::BPF_PROG_TYPE_TRACEPOINT, 0, 0),
        ),
        (
            Mechanism::BpfRawTracepoint,
            "BPF_PROG_TYPE_RAW_TRACEPOINT",
            plain(sys::BPF_PROG_TYPE_RAW_TRACEPOINT, 0, 0),
        ),
        (
            Mechanism::BpfTpBtf,
            "BPF_PROG_TYPE_TRACING/BPF_TRACE_RAW_TP (btf_trace_sys_enter)",
            with_btf(sys::BPF_PROG_TYPE_TRACING, sys::BPF_TRACE_RAW_TP, 2),
        ),
        (
            Mechanism::BpfCgroupSockAddr,
            "BPF_PROG_TYPE_CGROUP_SOCK_ADDR/BPF_CGROUP_INET4_CONNECT",
            plain(
                sys::BPF_PROG_TYPE_CGROUP_SOCK_ADDR,
                sys::BPF_CGROUP_INET4_CONNECT,
                1,
            ),
        ),
        (
            Mechanism::BpfCgroupSkb,
            "BPF_PROG_TYPE_CGROUP_SKB/BPF_CGROUP_INET_EGRESS",
            plain(
                sys::BPF_PROG_TYPE_CGROUP_SKB,
                sys::BPF_CGROUP_INET_EGRESS,
                1,
            ),
        ),
        (
            Mechanism::BpfLsm,
            "BPF_PROG_TYPE_LSM (bpf_lsm_file_open)",
            with_btf(sys::BPF_PROG_TYPE_LSM, sys::BPF_LSM_MAC, 0),
        ),
        (
            Mechanism::BpfFentry,
            "BPF_PROG_TYPE_TRACING/BPF_TRACE_FENTRY (vfs_read)",
            with_btf(sys::BPF_PROG_TYPE_TRACING, sys::BPF_TRACE_FENTRY, 1),
        ),
    ];
    for (m, what, spec) in progs {
        rows.push(match spec {
            Err(why) => Check::new(
                m,
                Status::Unavailable,
                format!("BPF_PROG_LOAD {what}: not tried: {why}"),
            ),
            Ok(spec) => match sys::bpf_prog_load_trivial(spec) {
                Ok(()) => Check::new(
                    m,
                    Status::Available,
                    format!("BPF_PROG_LOAD {what}: loaded a 2-instruction program"),
                ),
                Err(e) => bpf_error(
                    ctx,
                    m,
                    &format!("BPF_PROG_LOAD {what}"),
                    e.errno,
                    e.log.as_deref(),
                ),
            },
        });
    }
    rows.push(match sys::bpf_ringbuf_create() {
        Ok(()) => Check::new(
            Mechanism::BpfRingbuf,
            Status::Available,
            "BPF_MAP_CREATE BPF_MAP_TYPE_RINGBUF: created a one-page ring buffer",
        ),
        Err(e) => bpf_error(
            ctx,
            Mechanism::BpfRingbuf,
            "BPF_MAP_CREATE BPF_MAP_TYPE_RINGBUF",
            e,
            None,
        ),
    });
    btf_present
}

fn bpf_error(ctx: &Ctx, m: Mechanism, what: &str, errno: Errno, log: Option<&str>) -> Check {
    let log = log.map(|l| format!("; verifier: {l}")).unwrap_or_default();
    let (status, why) = match errno {
        Errno::EPERM | Errno::EACCES if !ctx.privileged => (
            Status::Error,
            "this process lacks CAP_BPF/CAP_SYS_ADMIN; run the check as root".to_string(),
        ),
        Errno::EPERM if m == Mechanism::BpfLsm => (
            Status::Unavailable,
            match &ctx.lsm {
                Some(l) if !l.iter().any(|x| x == "bpf") => {
                    format!(
                        "lsm= lacks bpf (active: {}); add bpf to lsm= on the kernel command line",
                        l.join(",")
                    )
                }
                _ => "kernel lockdown or lsm= lacks bpf".to_string(),
            },
        ),
        Errno::EPERM => (
            Status::Unavailable,
            match &ctx.lockdown {
                Some(l) => format!("refused by the kernel (lockdown: {l})"),
                None => "refused by the kernel (lockdown or a security policy)".to_string(),
            },
        ),
        Errno::ENOSYS => (
            Status::Unavailable,
            "kernel built without CONFIG_BPF_SYSCALL".to_string(),
        ),
        // 524 is the kernel-internal ENOTSUPP, which BPF lets escape to user space.
        e if matches!(e, Errno::EINVAL | Errno::E2BIG | Errno::EOPNOTSUPP) || e as i32 == 524 => (
            Status::Unavailable,
            "the kernel does not support this program or map type".to_string(),
        ),
        _ => (Status::Error, "unexpected error".to_string()),
    };
    Check::new(m, status, format!("{what}: {errno:?} — {why}{log}"))
}

#[cfg(test)]
mod tests;
