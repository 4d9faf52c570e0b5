//! The cgroup rows: the cgroup2 mount and layout (from `sys::mountinfo`), the agents' root and
//! whether children can be made in it, which budget controllers reach it and why not, freeze,
//! kill, pressure and `clone3(CLONE_INTO_CGROUP)` tried in a scratch child cgroup. The file
//! parsing is pure (tested on strings and temp dirs).

use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;

use super::report::{CgroupInfo, Check, Feature, Status};
use super::{ProbeOptions, io_errno};
use crate::cgroup::BUDGET_CONTROLLERS;
use crate::sys::clone::clone3_into_cgroup;
use crate::sys::mountinfo::{self, CgroupLayout};

/// The v1 name of a v2 controller (`io` was `blkio`).
pub fn v1_name(controller: &str) -> &str {
    match controller {
        "io" => "blkio",
        other => other,
    }
}

/// Splits a `cgroup.controllers` / `cgroup.subtree_control` line into names.
pub fn parse_controller_list(text: &str) -> Vec<String> {
    text.split_whitespace().map(str::to_string).collect()
}

/// Reads `<dir>/cgroup.controllers` and `<dir>/cgroup.subtree_control`.
pub fn read_controllers(dir: &Path) -> std::io::Result<(Vec<String>, Vec<String>)> {
    let controllers =
        parse_controller_list(&std::fs::read_to_string(dir.join("cgroup.controllers"))?);
    let subtree = parse_controller_list(&std::fs::read_to_string(
        dir.join("cgroup.subtree_control"),
    )?);
    Ok((controllers, subtree))
}

/// A short-lived child cgroup made to see what the kernel gives a non-root cgroup
/// (`cgroup.freeze` and `cgroup.kill` exist only below the hierarchy root) and to try
/// `clone3(CLONE_INTO_CGROUP)` for real. Removed on drop.
pub struct Scratch {
    path: PathBuf,
}

impl Scratch {
    pub const PREFIX: &'static str = "agentos-probe.";

    /// Makes `<root>/agentos-probe.<pid>.<n>`, first removing empty ones left by probes of
    /// processes that no longer exist (a daemon killed mid-probe).
    pub fn create(root: &Path) -> std::io::Result<Scratch> {
        static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        remove_stale(root);
        let mut last = None;
        for _ in 0..8 {
            let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let path = root.join(format!("{}{}.{seq}", Self::PREFIX, std::process::id()));
            match std::fs::create_dir(&path) {
                Ok(()) => return Ok(Scratch { path }),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| std::io::Error::from_raw_os_error(libc::EEXIST)))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Removes `agentos-probe.<pid>.<n>` children of `root` whose pid is gone. Best effort: a
/// populated cgroup cannot be removed and is left alone.
fn remove_stale(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(Scratch::PREFIX)) else {
            continue;
        };
        let Some(pid) = rest.split('.').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir(e.path());
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // A cgroup directory is removed with rmdir even though it "contains" interface files.
        // The probe's child has exited and been reaped, so the cgroup is empty; if a zombie is
        // still being torn down, retry briefly.
        for _ in 0..50 {
            match std::fs::remove_dir(&self.path) {
                Ok(()) => return,
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
                Err(_) => return,
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The cgroup rows

pub(super) fn probe_cgroups(opts: &ProbeOptions, rows: &mut Vec<Check>) -> CgroupInfo {
    let read = mountinfo::read();
    let mounts = read.as_ref().cloned().unwrap_or_default();
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

    rows.push(cgroup2_row(&read, &mounts));

    let Some(root) = root else {
        for m in [
            Feature::CgroupRoot,
            Feature::CpuController,
            Feature::MemoryController,
            Feature::PidsController,
            Feature::IoController,
            Feature::CpusetController,
            Feature::CgroupFreeze,
            Feature::CgroupKill,
            Feature::Clone3IntoCgroup,
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

    let (root_row, on_cgroup2, scratch) = root_row(&root);
    rows.push(root_row);

    controller_rows(
        &root,
        on_cgroup2.as_ref().is_ok_and(|b| *b),
        &mounts,
        &mut info,
        rows,
    );

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
        (Feature::CgroupFreeze, "cgroup.freeze", "5.2"),
        (Feature::CgroupKill, "cgroup.kill", "5.14"),
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

/// The cgroup v2 row: is a cgroup2 hierarchy mounted, and beside which v1 hierarchies.
fn cgroup2_row(read: &std::io::Result<mountinfo::Mounts>, mounts: &mountinfo::Mounts) -> Check {
    match (read, &mounts.cgroup2) {
        (Err(e), _) => Check::new(
            Feature::CgroupV2,
            Status::Error,
            format!("cannot read /proc/self/mountinfo: {}", io_errno(e)),
        ),
        (Ok(_), Some(m)) if mounts.layout() == CgroupLayout::Unified => Check::new(
            Feature::CgroupV2,
            Status::Available,
            format!("cgroup2 at {} (unified hierarchy)", m.display()),
        ),
        (Ok(_), Some(m)) => {
            let v1: Vec<&str> = mounts.v1_controllers.keys().map(String::as_str).collect();
            Check::new(
                Feature::CgroupV2,
                Status::Available,
                format!(
                    "cgroup2 at {} (hybrid: cgroup v1 holds {}; boot with systemd.unified_cgroup_hierarchy=1)",
                    m.display(),
                    if v1.is_empty() {
                        "named hierarchies".to_string()
                    } else {
                        v1.join(" ")
                    }
                ),
            )
        }
        (Ok(_), None) => Check::new(
            Feature::CgroupV2,
            Status::Unavailable,
            "no cgroup2 mount in /proc/self/mountinfo (mount -t cgroup2 none /sys/fs/cgroup, or boot with systemd.unified_cgroup_hierarchy=1)",
        ),
    }
}

/// The agents' root: on cgroup2, and can we make children? Returns the row, the statfs answer,
/// and the scratch child made to find out (kept for the freeze/kill/clone3 rows).
fn root_row(root: &Path) -> (Check, nix::Result<bool>, Option<Scratch>) {
    let on_cgroup2 = nix::sys::statfs::statfs(root)
        .map(|s| s.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC);
    let mut scratch = None;
    let row = match on_cgroup2 {
        Err(e) => Check::new(
            Feature::CgroupRoot,
            Status::Unavailable,
            format!("{}: {e:?} (statfs)", root.display()),
        ),
        Ok(false) => Check::new(
            Feature::CgroupRoot,
            Status::Unavailable,
            format!("{} is not on a cgroup2 filesystem", root.display()),
        ),
        Ok(true) => match Scratch::create(root) {
            Ok(s) => {
                scratch = Some(s);
                Check::new(
                    Feature::CgroupRoot,
                    Status::Available,
                    format!(
                        "{}: cgroup2, child cgroups can be created (made and removed one)",
                        root.display()
                    ),
                )
            }
            Err(e) => Check::new(
                Feature::CgroupRoot,
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
    (row, on_cgroup2, scratch)
}

/// One row per budget controller: in the root's `cgroup.controllers`, or why not.
fn controller_rows(
    root: &Path,
    on_cgroup2: bool,
    mounts: &mountinfo::Mounts,
    info: &mut CgroupInfo,
    rows: &mut Vec<Check>,
) {
    match read_controllers(root) {
        Ok((controllers, subtree)) => {
            info.controllers = controllers;
            info.subtree_control = subtree;
        }
        Err(e) => {
            for c in BUDGET_CONTROLLERS {
                if let Some(m) = Feature::for_controller(c) {
                    rows.push(Check::new(
                        m,
                        if on_cgroup2 {
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
            .and_then(|m| read_controllers(m).ok())
            .map(|(c, _)| c)
            .unwrap_or_default();
        for c in BUDGET_CONTROLLERS {
            let Some(m) = Feature::for_controller(c) else {
                continue;
            };
            rows.push(controller_row(m, c, root, info, mounts, &mount_controllers));
        }
    }
}

fn controller_row(
    m: Feature,
    c: &str,
    root: &Path,
    info: &CgroupInfo,
    mounts: &mountinfo::Mounts,
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
    let why = if let Some(v1) = mounts.v1_controllers.get(v1_name(c)) {
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
            f.first() == Some(&v1_name(c)) && f.get(3) == Some(&"1")
        })
    })
}

fn probe_pressure(dir: Option<(&Path, &str)>) -> Check {
    if let Some((d, where_)) = dir
        && d.join("cpu.pressure").exists()
    {
        return Check::new(
            Feature::Pressure,
            Status::Available,
            format!(
                "cpu/memory/io.pressure per cgroup (checked in {where_}); agents over their CPU share are held while another waits for a CPU (--ipc-agent-cpu-stall)"
            ),
        );
    }
    if Path::new("/proc/pressure/cpu").exists() {
        Check::new(
            Feature::Pressure,
            Status::Available,
            "/proc/pressure (system-wide only): agents over their CPU share are held only over --ipc-agent-cpu-ceiling, not while another waits for a CPU (--ipc-agent-cpu-stall)",
        )
    } else {
        Check::new(
            Feature::Pressure,
            Status::Unavailable,
            "no /proc/pressure (kernel without CONFIG_PSI, or booted with psi=0): agents over their CPU share are held only over --ipc-agent-cpu-ceiling, not while another waits for a CPU (--ipc-agent-cpu-stall)",
        )
    }
}

fn probe_clone3(scratch: Option<&Path>) -> Check {
    let m = Feature::Clone3IntoCgroup;
    if let Some(dir) = scratch {
        match std::fs::File::open(dir) {
            Ok(f) => {
                return match clone3_into_cgroup(f.as_raw_fd()) {
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
    match clone3_into_cgroup(RawFd::MAX) {
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
    let m = Feature::Clone3IntoCgroup;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_scratch_dirs_of_dead_processes_are_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        // pid_max is at most 2^22, so this pid never exists.
        let stale = dir.path().join("agentos-probe.99999999.0");
        let mine = dir
            .path()
            .join(format!("agentos-probe.{}.999", std::process::id()));
        let other = dir.path().join("unrelated");
        for d in [&stale, &mine, &other] {
            std::fs::create_dir(d).expect("mkdir");
        }
        let s = Scratch::create(dir.path()).expect("scratch");
        assert!(!stale.exists());
        assert!(mine.exists() && other.exists());
        let p = s.path().to_path_buf();
        assert!(p.is_dir());
        drop(s);
        assert!(!p.exists());
    }

    #[test]
    fn controller_files_are_parsed_from_a_fake_cgroup_dir() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            dir.path().join("cgroup.controllers"),
            "cpuset cpu io memory pids\n",
        )
        .expect("write");
        std::fs::write(dir.path().join("cgroup.subtree_control"), "cpu memory\n").expect("write");
        let (c, s) = read_controllers(dir.path()).expect("read");
        assert_eq!(c, ["cpuset", "cpu", "io", "memory", "pids"]);
        assert_eq!(s, ["cpu", "memory"]);
        assert!(parse_controller_list("\n").is_empty());
    }
}
