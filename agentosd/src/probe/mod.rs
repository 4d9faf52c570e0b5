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

mod bpf;
mod btf;
mod cgroup;
mod report;
mod sandbox;
mod sched;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use nix::errno::Errno;

pub use crate::cgroup::BUDGET_CONTROLLERS;
pub use crate::sys::mountinfo::CgroupLayout;
pub use report::{CgroupInfo, Check, Feature, HostReport, Status, SystemdInfo};

/// Where to probe.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProbeOptions {
    /// The cgroup under which agents will live (the daemon's delegated cgroup). When `None`, the
    /// cgroup2 mount found in `/proc/self/mountinfo` (`/sys/fs/cgroup` on a pure v2 host,
    /// `/sys/fs/cgroup/unified` on a hybrid one).
    pub cgroup_root: Option<PathBuf>,
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
    let cgroup = guarded(&mut checks, |rows| cgroup::probe_cgroups(opts, rows));
    let landlock_abi = guarded(&mut checks, |rows| {
        let (row, abi) = sandbox::probe_landlock();
        rows.push(row);
        abi
    })
    .flatten();
    guarded(&mut checks, sandbox::probe_seccomp);
    guarded(&mut checks, |rows| {
        rows.push(sched::probe_sched_deadline(&ctx))
    });
    guarded(&mut checks, |rows| rows.push(sched::probe_sched_slice()));
    guarded(&mut checks, |rows| rows.push(probe_pidfd()));
    guarded(&mut checks, |rows| rows.push(probe_io_uring()));
    guarded(&mut checks, |rows| rows.push(sandbox::probe_path_watch()));
    guarded(&mut checks, |rows| rows.push(sandbox::probe_kernel_audit()));
    let btf = guarded(&mut checks, |rows| bpf::probe_bpf(&ctx, rows)).unwrap_or(false);
    // After the BPF rows: the Unix socket fence is Landlock's or BPF LSM's.
    let bpf_lsm = checks
        .iter()
        .find(|c| c.mechanism == Feature::BpfLsm)
        .map_or(Err("not probed".to_string()), |c| {
            if c.status != Status::Available {
                Err(c.detail.clone())
            } else if !crate::enforce::fs::built() {
                Err("agentosd was built without the BPF programs".to_string())
            } else {
                Ok(())
            }
        });
    guarded(&mut checks, |rows| {
        rows.push(sandbox::landlock_unix_row(landlock_abi, bpf_lsm))
    });

    // Any row a panicking group did not produce is reported as an error rather than left out.
    for m in Feature::ALL {
        if !checks.iter().any(|c| c.mechanism == m) {
            checks.push(Check::new(
                m,
                Status::Error,
                "probe did not finish (internal error, see the daemon log)",
            ));
        }
    }
    checks.sort_by_key(|c| Feature::ALL.iter().position(|m| *m == c.mechanism));

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
// process handles, io_uring

fn probe_pidfd() -> Check {
    match crate::sys::pidfd_open(std::process::id())
        .map_err(|e| Errno::from_raw(e.errno().unwrap_or(0)))
    {
        Ok(_) => Check::new(Feature::Pidfd, Status::Available, "pidfd_open(2) on self"),
        Err(e @ Errno::ENOSYS) => Check::new(
            Feature::Pidfd,
            Status::Unavailable,
            format!("pidfd_open: {e:?} (kernel older than 5.3)"),
        ),
        Err(e) => Check::new(Feature::Pidfd, Status::Error, format!("pidfd_open: {e:?}")),
    }
}

fn probe_io_uring() -> Check {
    let m = Feature::IoUring;
    let disabled = read_trimmed("/proc/sys/kernel/io_uring_disabled")
        .ok()
        .and_then(|s| s.parse::<u32>().ok());
    match crate::sys::io_uring::io_uring_probe(4) {
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

#[cfg(test)]
mod tests;
