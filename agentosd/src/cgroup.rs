//! A small cgroup v2 layer over cgroupfs files: create, remove, procs, freeze (confirmed by
//! `cgroup.events`), kill, statistics and controller availability. Nothing here walks outside the
//! directory it is given.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A cgroup-file operation that failed, naming the file.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("cgroup {op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cgroup {path}: timed out after {waited:?} waiting for {what}")]
    Timeout {
        path: PathBuf,
        what: &'static str,
        waited: Duration,
    },
    #[error("{path} is not on a cgroup2 file system (statfs magic {magic:#x}); pass --cgroup-root")]
    NotCgroup2 { path: PathBuf, magic: i64 },
}

fn io_err(op: &'static str, path: &Path, source: io::Error) -> CgroupError {
    CgroupError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// The budget controllers an agent contract can ask for, in the order they are enabled and
/// reported: the one list both `agentosd check` ("budgets agents cannot have here") and the
/// supervisor (what it enables under its root, `MissingBudgets`) use.
pub const BUDGET_CONTROLLERS: &[&str] = &["cpu", "memory", "pids", "io", "cpuset"];

/// The budget controllers of [`BUDGET_CONTROLLERS`] not in `have`, in that order: what agents
/// cannot get. The supervisor applies it to its agents cgroup's `cgroup.subtree_control`, the
/// probe to the controllers it found available.
pub fn missing_budgets<S: AsRef<str>>(have: &[S]) -> Vec<String> {
    BUDGET_CONTROLLERS
        .iter()
        .filter(|c| !have.iter().any(|h| h.as_ref() == **c))
        .map(|c| c.to_string())
        .collect()
}

/// What a contract loses without budget controller `controller`: `compute.cpu (cpu.max)`.
pub fn budget_description(controller: &str) -> &'static str {
    match controller {
        "cpu" => "compute.cpu (cpu.max)",
        "memory" => "compute.mem (memory.max/memory.high)",
        "pids" => "compute.pids (pids.max)",
        "io" => "compute.io (io.max)",
        "cpuset" => "compute.cpuset (cpuset.cpus)",
        _ => "?",
    }
}

/// The leaf of an agent's own processes: `agents/<tenant>/<name>/main`. The contract's budgets
/// are set one level up, on `agents/<tenant>/<name>`, so they cover this leaf and the agent's
/// tools (cgroup v2's no-internal-process rule: with controllers enabled for its children, the
/// agent's cgroup itself holds no process).
pub const AGENT_MAIN: &str = "main";
/// The parent of an agent's tool cgroups: `agents/<tenant>/<name>/tools/<call-or-server>`.
pub const AGENT_TOOLS: &str = "tools";
/// The controllers an agent's cgroup hands to its children (`main`, `tools`): what tool cgroups
/// use for their own limits (`pids.max`, `memory.max` of a tool manifest).
pub const AGENT_CHILD_CONTROLLERS: &[&str] = &["memory", "pids"];

/// The cgroup of agent `tenant/name` under the daemon's root: `ROOT/agents/<tenant>/<name>`.
pub fn agent_cgroup(root: &Cgroup, tenant: &str, name: &str) -> Cgroup {
    root.child("agents").child(tenant).child(name)
}

/// The contents of `cgroup.events`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Events {
    pub populated: bool,
    pub frozen: bool,
}

/// Live statistics of one cgroup; `None` when the file is absent (controller not enabled).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    pub cpu_usage_usec: Option<u64>,
    pub memory_current: Option<u64>,
    pub tasks_current: u64,
}

/// One cgroup v2 directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cgroup {
    path: PathBuf,
}

const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;

/// Whether `path` lies on a cgroup2 file system.
pub fn is_cgroup2(path: &Path) -> Result<bool, CgroupError> {
    match rustix::fs::statfs(path) {
        // f_type is i64 on x86-64 but not on every target.
        #[allow(clippy::unnecessary_cast)]
        Ok(st) => Ok(st.f_type as i64 == CGROUP2_SUPER_MAGIC),
        Err(e) => Err(io_err("statfs", path, e.into())),
    }
}

impl Cgroup {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn child(&self, name: &str) -> Cgroup {
        Cgroup::new(self.path.join(name))
    }

    pub fn exists(&self) -> bool {
        self.path.join("cgroup.procs").exists()
    }

    fn file(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    fn read(&self, name: &str) -> Result<String, CgroupError> {
        let p = self.file(name);
        fs::read_to_string(&p).map_err(|e| io_err("read", &p, e))
    }

    fn write(&self, name: &str, value: &str) -> Result<(), CgroupError> {
        let p = self.file(name);
        fs::write(&p, value).map_err(|e| io_err("write", &p, e))
    }

    /// Create this cgroup (and missing parents); fine if it exists.
    pub fn create(&self) -> Result<(), CgroupError> {
        match fs::create_dir(&self.path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if let Some(parent) = self.path.parent() {
                    Cgroup::new(parent).create()?;
                }
                match fs::create_dir(&self.path) {
                    Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
                        Err(io_err("mkdir", &self.path, e))
                    }
                    _ => Ok(()),
                }
            }
            Err(e) => Err(io_err("mkdir", &self.path, e)),
        }
    }

    /// Create this one cgroup, whose parent must exist (no missing parent is made): `Ok(true)`
    /// when it was made, `Ok(false)` when it existed. Tool cgroups use this, so a call racing
    /// with the stop of its agent never brings the agent's removed cgroup back.
    pub fn create_in_existing(&self) -> Result<bool, CgroupError> {
        match fs::create_dir(&self.path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(io_err("mkdir", &self.path, e)),
        }
    }

    /// The child cgroups (directories) of this one; none when it is gone.
    pub fn children(&self) -> Vec<Cgroup> {
        let Ok(rd) = fs::read_dir(&self.path) else {
            return Vec::new();
        };
        let mut v: Vec<Cgroup> = rd
            .flatten()
            // cgroupfs holds directories and files only; file_type does not follow anything.
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| Cgroup::new(e.path()))
            .collect();
        v.sort_by(|a, b| a.path.cmp(&b.path));
        v
    }

    /// PIDs of the processes in this cgroup and every cgroup below it.
    pub fn subtree_procs(&self) -> Vec<u32> {
        let mut out = self.procs().unwrap_or_default();
        for c in self.children() {
            out.extend(c.subtree_procs());
        }
        out
    }

    /// Move every process of this cgroup itself (not of its children) into `leaf`, until none
    /// is left (a process forking meanwhile is moved by the next round). Returns how many were
    /// moved. Used to re-adopt an agent of the old layout (its processes directly in
    /// `agents/<tenant>/<name>`) into its `main` leaf.
    pub fn move_procs_into(&self, leaf: &Cgroup) -> Result<usize, CgroupError> {
        let mut moved = 0;
        for _ in 0..100 {
            let procs = self.procs()?;
            if procs.is_empty() {
                return Ok(moved);
            }
            for pid in procs {
                match leaf.add_proc(pid) {
                    Ok(()) => moved += 1,
                    // Exited since the read.
                    Err(CgroupError::Io { source, .. })
                        if source.raw_os_error() == Some(libc::ESRCH) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Err(CgroupError::Timeout {
            path: self.path.clone(),
            what: "its processes to move into the leaf (they keep forking)",
            waited: Duration::ZERO,
        })
    }

    /// Remove this cgroup and every (empty) cgroup below it, children first; fine if it is
    /// gone. Retries briefly on EBUSY, which the kernel returns while exiting tasks are still
    /// being released. Kills nothing: a populated cgroup fails with EBUSY.
    pub fn remove(&self) -> Result<(), CgroupError> {
        for c in self.children() {
            c.remove()?;
        }
        self.remove_one()
    }

    fn remove_one(&self) -> Result<(), CgroupError> {
        let start = Instant::now();
        loop {
            match fs::remove_dir(&self.path) {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
                Err(e)
                    if e.raw_os_error() == Some(libc::EBUSY)
                        && start.elapsed() < Duration::from_secs(2) =>
                {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => return Err(io_err("rmdir", &self.path, e)),
            }
        }
    }

    /// An O_DIRECTORY fd of this cgroup, for clone3(CLONE_INTO_CGROUP).
    pub fn open_dir(&self) -> Result<std::os::fd::OwnedFd, CgroupError> {
        rustix::fs::open(
            &self.path,
            rustix::fs::OFlags::DIRECTORY
                | rustix::fs::OFlags::RDONLY
                | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| io_err("open", &self.path, e.into()))
    }

    /// PIDs of the processes in this cgroup (`cgroup.procs`).
    pub fn procs(&self) -> Result<Vec<u32>, CgroupError> {
        Ok(self
            .read("cgroup.procs")?
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect())
    }

    /// Move a process into this cgroup.
    pub fn add_proc(&self, pid: u32) -> Result<(), CgroupError> {
        self.write("cgroup.procs", &pid.to_string())
    }

    pub fn events(&self) -> Result<Events, CgroupError> {
        let text = self.read("cgroup.events")?;
        Ok(parse_events(&text))
    }

    /// Whether any process lives in this cgroup or below. A missing cgroup is empty.
    pub fn populated(&self) -> bool {
        if !self.exists() {
            return false;
        }
        self.events().map(|e| e.populated).unwrap_or(false)
    }

    /// Write `cgroup.freeze` (1 or 0) without waiting.
    pub fn set_freeze(&self, frozen: bool) -> Result<(), CgroupError> {
        self.write("cgroup.freeze", if frozen { "1" } else { "0" })
    }

    /// Poll `cgroup.events` until `pred` holds or `timeout` passes.
    pub async fn wait_events(
        &self,
        what: &'static str,
        timeout: Duration,
        pred: impl Fn(Events) -> bool,
    ) -> Result<(), CgroupError> {
        let start = Instant::now();
        let mut delay = Duration::from_millis(2);
        loop {
            let ev = if self.exists() {
                self.events()?
            } else {
                Events::default()
            };
            if pred(ev) {
                return Ok(());
            }
            if start.elapsed() >= timeout {
                return Err(CgroupError::Timeout {
                    path: self.path.clone(),
                    what,
                    waited: timeout,
                });
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_millis(50));
        }
    }

    /// Kill every process in this cgroup and below (`cgroup.kill`, Linux 5.14).
    pub fn kill(&self) -> Result<(), CgroupError> {
        if !self.exists() {
            return Ok(());
        }
        self.write("cgroup.kill", "1")
    }

    /// Controllers available in this cgroup (`cgroup.controllers`).
    pub fn controllers(&self) -> Result<Vec<String>, CgroupError> {
        Ok(self
            .read("cgroup.controllers")?
            .split_whitespace()
            .map(str::to_string)
            .collect())
    }

    /// Controllers enabled for the children (`cgroup.subtree_control`).
    pub fn subtree_control(&self) -> Result<Vec<String>, CgroupError> {
        Ok(self
            .read("cgroup.subtree_control")?
            .split_whitespace()
            .map(str::to_string)
            .collect())
    }

    /// Enable those of `wanted` that this cgroup has for its children; returns the enabled set.
    /// Controllers that cannot be enabled are left out (the caller reports them).
    pub fn enable_subtree(&self, wanted: &[&str]) -> Vec<String> {
        let available = self.controllers().unwrap_or_default();
        for c in wanted {
            if available.iter().any(|a| a == c) {
                // Failure (e.g. processes in this cgroup: the no-internal-process rule) just
                // leaves the controller disabled; subtree_control below tells the truth.
                let _ = self.write("cgroup.subtree_control", &format!("+{c}"));
            }
        }
        self.subtree_control().unwrap_or_default()
    }

    /// Write a budget file (cpu.max, memory.max, …).
    pub fn set(&self, file: &str, value: &str) -> Result<(), CgroupError> {
        self.write(file, value)
    }

    /// OOM kills in this cgroup and below (`oom_kill` of `memory.events`); 0 without the
    /// memory controller.
    pub fn oom_kills(&self) -> u64 {
        self.read("memory.events")
            .ok()
            .and_then(|t| parse_oom_kills(&t))
            .unwrap_or(0)
    }

    pub fn stats(&self) -> Stats {
        let cpu_usage_usec = self.read("cpu.stat").ok().and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("usage_usec "))
                .and_then(|v| v.trim().parse().ok())
        });
        let memory_current = self
            .read("memory.current")
            .ok()
            .and_then(|v| v.trim().parse().ok());
        let tasks_current = self
            .read("pids.current")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| self.subtree_threads());
        Stats {
            cpu_usage_usec,
            memory_current,
            tasks_current,
        }
    }
}

impl Cgroup {
    /// Threads in this cgroup and below (what `pids.current` counts, without the controller).
    fn subtree_threads(&self) -> u64 {
        let own = self
            .read("cgroup.threads")
            .map(|t| t.lines().count() as u64)
            .unwrap_or(0);
        own + self
            .children()
            .iter()
            .map(Cgroup::subtree_threads)
            .sum::<u64>()
    }
}

pub fn parse_events(text: &str) -> Events {
    let mut ev = Events::default();
    for line in text.lines() {
        let mut it = line.split_whitespace();
        match (it.next(), it.next()) {
            (Some("populated"), Some(v)) => ev.populated = v == "1",
            (Some("frozen"), Some(v)) => ev.frozen = v == "1",
            _ => {}
        }
    }
    ev
}

fn parse_oom_kills(memory_events: &str) -> Option<u64> {
    memory_events
        .lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|v| v.trim().parse().ok())
}

/// The cgroup v2 path of process `pid` relative to the cgroup2 mount (`0::/…` in
/// /proc/PID/cgroup).
pub fn proc_cgroup(pid: &str) -> Option<String> {
    let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(str::to_string)
}

/// Where cgroup2 is mounted: `/sys/fs/cgroup` (unified) or `/sys/fs/cgroup/unified` (hybrid).
pub fn cgroup2_mount() -> Option<PathBuf> {
    crate::sys::mountinfo::read().ok()?.cgroup2
}

/// This process's own cgroup2 directory (the mount joined with its `0::` line), opened: what
/// `clone3(CLONE_INTO_CGROUP)` needs to start a child where the caller is. `None` without a
/// cgroup2 mount or membership, or when it cannot be opened.
pub fn open_own_cgroup2() -> Option<fs::File> {
    let rel = proc_cgroup("self")?;
    fs::File::open(cgroup2_mount()?.join(rel.trim_start_matches('/'))).ok()
}

/// Budget files for the given budgets: (controller, file, value).
pub fn budget_files(b: &crate::spec::Budgets) -> Vec<(&'static str, &'static str, String)> {
    let mut out = Vec::new();
    if let Some(m) = b.cpu_millis {
        let period = 100_000u64;
        let quota = (m * period / 1000).max(1000);
        out.push(("cpu", "cpu.max", format!("{quota} {period}")));
    }
    if let Some(v) = b.memory_high_bytes {
        out.push(("memory", "memory.high", v.to_string()));
    }
    if let Some(v) = b.memory_bytes {
        out.push(("memory", "memory.max", v.to_string()));
    }
    if let Some(v) = b.pids {
        out.push(("pids", "pids.max", v.to_string()));
    }
    for line in io_max_lines(b).into_iter().flatten() {
        out.push(("io", "io.max", line));
    }
    out
}

/// The `io.max` line for each `compute.io` entry (`MAJ:MIN rbps=… wbps=… riops=… wiops=…`, unset
/// keys left out so they stay `max`), or why its device cannot be used here.
pub fn io_max_lines(b: &crate::spec::Budgets) -> Vec<Result<String, String>> {
    b.io.iter()
        .map(|l| {
            let dev = device_number(&l.device)?;
            let mut line = dev;
            for (k, v) in [
                ("rbps", l.rbps),
                ("wbps", l.wbps),
                ("riops", l.riops),
                ("wiops", l.wiops),
            ] {
                if let Some(v) = v {
                    line.push_str(&format!(" {k}={v}"));
                }
            }
            Ok(line)
        })
        .collect()
}

/// `MAJOR:MINOR` of a block device given as a path or already as a number.
pub fn device_number(device: &str) -> Result<String, String> {
    use std::os::unix::fs::FileTypeExt;
    use std::os::unix::fs::MetadataExt;
    if !device.starts_with('/') {
        return Ok(device.to_string());
    }
    let md = std::fs::metadata(device)
        .map_err(|e| format!("io.max for {device}: {e} (compute.io device)"))?;
    if !md.file_type().is_block_device() {
        return Err(format!(
            "io.max for {device}: not a block device (compute.io device)"
        ));
    }
    let rdev = md.rdev();
    Ok(format!("{}:{}", libc::major(rdev), libc::minor(rdev)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_parse() {
        let ev = parse_events("populated 1\nfrozen 0\n");
        assert!(ev.populated && !ev.frozen);
        let ev = parse_events("populated 0\nfrozen 1\n");
        assert!(!ev.populated && ev.frozen);
    }

    #[test]
    fn agent_layout() {
        let root = Cgroup::new("/sys/fs/cgroup/agentos");
        let a = agent_cgroup(&root, "t", "n");
        assert_eq!(a.path(), Path::new("/sys/fs/cgroup/agentos/agents/t/n"));
        assert_eq!(
            a.child(AGENT_MAIN).path(),
            Path::new("/sys/fs/cgroup/agentos/agents/t/n/main")
        );
        assert_eq!(
            a.child(AGENT_TOOLS).child("call-1-x").path(),
            Path::new("/sys/fs/cgroup/agentos/agents/t/n/tools/call-1-x")
        );
    }

    /// `remove` takes the tree bottom-up (directories only: a plain directory tree stands in for
    /// cgroupfs, whose directories rmdir even with their interface files in them).
    #[test]
    fn remove_is_bottom_up_and_create_in_existing_makes_no_parents() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = Cgroup::new(dir.path().join("agents/t/n"));
        assert!(
            a.child(AGENT_TOOLS).create_in_existing().is_err(),
            "no parent is made"
        );
        a.create().expect("create");
        assert!(a.child(AGENT_MAIN).create_in_existing().expect("main"));
        assert!(!a.child(AGENT_MAIN).create_in_existing().expect("again"));
        a.child(AGENT_TOOLS).child("call-1").create().expect("tool");
        assert_eq!(a.children().len(), 2);
        a.remove().expect("remove the tree");
        assert!(!a.path().exists());
        a.remove().expect("gone is fine");
    }

    #[test]
    fn oom_kills_parse() {
        let t = "low 0\nhigh 3\nmax 9\noom 2\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(parse_oom_kills(t), Some(1));
        assert_eq!(parse_oom_kills(""), None);
    }

    #[test]
    fn budgets_map_to_files() {
        let b = crate::spec::Budgets {
            cpu_millis: Some(500),
            memory_bytes: Some(256 << 20),
            memory_high_bytes: None,
            pids: Some(64),
            io: vec![
                crate::spec::IoBudget {
                    device: "7:0".into(),
                    wbps: Some(1 << 20),
                    riops: Some(100),
                    ..Default::default()
                },
                crate::spec::IoBudget {
                    device: "/dev/null".into(),
                    rbps: Some(1),
                    ..Default::default()
                },
                crate::spec::IoBudget {
                    device: "/dev/no-such-disk".into(),
                    rbps: Some(1),
                    ..Default::default()
                },
            ],
            disk_bytes: None,
            disk_inodes: None,
            must: false,
        };
        let f = budget_files(&b);
        assert_eq!(
            f[3],
            ("io", "io.max", "7:0 wbps=1048576 riops=100".to_string())
        );
        assert_eq!(f.len(), 4, "unusable devices are not written");
        let lines = io_max_lines(&b);
        assert_eq!(
            lines[1],
            Err("io.max for /dev/null: not a block device (compute.io device)".to_string())
        );
        assert!(
            lines[2]
                .as_ref()
                .is_err_and(|e| e.contains("/dev/no-such-disk") && e.contains("No such file")),
            "{lines:?}"
        );
        assert_eq!(f[0], ("cpu", "cpu.max", "50000 100000".to_string()));
        assert_eq!(f[1], ("memory", "memory.max", (256u64 << 20).to_string()));
        assert_eq!(f[2], ("pids", "pids.max", "64".to_string()));
    }
}
