//! Where cgroup2 is mounted, which layout the host uses, and which controllers reach the agents'
//! root cgroup. Parsing is pure (tested on strings and temp dirs); the probe feeds it the files.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The budget controllers an agent contract can ask for, in the order we report them.
pub const BUDGET_CONTROLLERS: [&str; 5] = ["cpu", "memory", "pids", "io", "cpuset"];

/// How cgroups are mounted on this host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CgroupLayout {
    /// Pure cgroup v2 (`/sys/fs/cgroup` is cgroup2): what agentos is built for.
    Unified,
    /// cgroup v1 hierarchies hold (some) controllers; cgroup2 is mounted beside them
    /// (systemd's `/sys/fs/cgroup/unified`).
    Hybrid,
    /// cgroup v1 only: no cgroup2 mount at all.
    Legacy,
    /// No cgroup filesystem is mounted.
    None,
}

impl CgroupLayout {
    pub fn as_str(self) -> &'static str {
        match self {
            CgroupLayout::Unified => "unified (pure v2)",
            CgroupLayout::Hybrid => "hybrid (v1 + v2)",
            CgroupLayout::Legacy => "legacy (v1 only)",
            CgroupLayout::None => "none",
        }
    }
}

/// The cgroup mounts found in `/proc/self/mountinfo`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Mounts {
    /// The cgroup2 mount to use (preferring `/sys/fs/cgroup`, then `/sys/fs/cgroup/unified`).
    pub cgroup2: Option<PathBuf>,
    /// cgroup v1 controller name → its mount point (`cpu` → `/sys/fs/cgroup/cpu`).
    pub v1_controllers: BTreeMap<String, PathBuf>,
    /// Whether any cgroup v1 hierarchy is mounted (named ones such as `name=systemd` included).
    pub any_v1: bool,
}

impl Mounts {
    pub fn layout(&self) -> CgroupLayout {
        match (&self.cgroup2, self.any_v1) {
            (Some(_), false) => CgroupLayout::Unified,
            (Some(_), true) => CgroupLayout::Hybrid,
            (None, true) => CgroupLayout::Legacy,
            (None, false) => CgroupLayout::None,
        }
    }
}

/// Undoes mountinfo's octal escapes (`\040` for a space, `\011`, `\012`, `\134`).
fn unescape(field: &str) -> String {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses `/proc/self/mountinfo` text.
pub fn parse_mountinfo(text: &str) -> Mounts {
    let mut mounts = Mounts::default();
    let mut v2: Vec<PathBuf> = Vec::new();
    for line in text.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let Some(mount_point) = left.split(' ').nth(4) else {
            continue;
        };
        let mut r = right.split(' ');
        let fstype = r.next().unwrap_or_default();
        let _source = r.next();
        let superopts = r.next().unwrap_or_default();
        let mount_point = PathBuf::from(unescape(mount_point));
        match fstype {
            "cgroup2" => v2.push(mount_point),
            "cgroup" => {
                mounts.any_v1 = true;
                for opt in superopts.split(',') {
                    if KNOWN_V1_CONTROLLERS.contains(&opt) {
                        mounts
                            .v1_controllers
                            .entry(opt.to_string())
                            .or_insert_with(|| mount_point.clone());
                    }
                }
            }
            _ => {}
        }
    }
    mounts.cgroup2 = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
        .iter()
        .map(PathBuf::from)
        .find(|p| v2.contains(p))
        .or_else(|| v2.into_iter().next());
    mounts
}

const KNOWN_V1_CONTROLLERS: [&str; 14] = [
    "cpu",
    "cpuacct",
    "cpuset",
    "memory",
    "devices",
    "freezer",
    "net_cls",
    "blkio",
    "perf_event",
    "net_prio",
    "hugetlb",
    "pids",
    "rdma",
    "misc",
];

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

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
38 31 0:35 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    const UNIFIED: &str = "\
25 30 0:23 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
99 25 0:23 / /tmp/with\\040space rw shared:4 - cgroup2 cgroup2 rw
";

    #[test]
    fn hybrid_layout_finds_unified_and_v1_controllers() {
        let m = parse_mountinfo(HYBRID);
        assert_eq!(
            m.cgroup2.as_deref(),
            Some(Path::new("/sys/fs/cgroup/unified"))
        );
        assert_eq!(m.layout(), CgroupLayout::Hybrid);
        assert_eq!(m.v1_controllers["cpu"], Path::new("/sys/fs/cgroup/cpu"));
        assert_eq!(
            m.v1_controllers[v1_name("io")],
            Path::new("/sys/fs/cgroup/blkio")
        );
        assert!(!m.v1_controllers.contains_key("name=systemd"));
    }

    #[test]
    fn unified_layout_prefers_sys_fs_cgroup_and_unescapes() {
        let m = parse_mountinfo(UNIFIED);
        assert_eq!(m.cgroup2.as_deref(), Some(Path::new("/sys/fs/cgroup")));
        assert_eq!(m.layout(), CgroupLayout::Unified);
        assert!(m.v1_controllers.is_empty());
        assert_eq!(unescape("/tmp/with\\040space"), "/tmp/with space");
        assert_eq!(parse_mountinfo("").layout(), CgroupLayout::None);
    }

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
