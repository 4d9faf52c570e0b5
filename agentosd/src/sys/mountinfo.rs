//! `/proc/self/mountinfo`: where cgroup2 is mounted, which cgroup v1 hierarchies hold which
//! controllers, and so which layout the host uses. Parsing is pure (tested on strings); the one
//! reader is [`read`].

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Reads and parses `/proc/self/mountinfo`.
pub fn read() -> std::io::Result<Mounts> {
    std::fs::read_to_string("/proc/self/mountinfo").map(|t| parse_mountinfo(&t))
}

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

#[cfg(test)]
mod tests {
    use std::path::Path;

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
        assert_eq!(m.v1_controllers["blkio"], Path::new("/sys/fs/cgroup/blkio"));
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
}
