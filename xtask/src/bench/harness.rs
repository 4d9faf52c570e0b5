//! What the black-box benchmarks of the daemon share (bench mcp, bench models): a private
//! dbus-daemon and a release agentosd with its own cgroup root and state directory, agents that
//! run this binary, their samples, percentiles, and the machine's state.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

/// The tenant of every benchmark agent.
pub(super) const TENANT: &str = "bench";

/// CLOCK_MONOTONIC in ns.
pub(super) fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Writes PREFIX.EXT (a marker the bench waits for).
pub(super) fn touch(prefix: &Path, ext: &str, text: &str) -> Result<()> {
    let p = PathBuf::from(format!("{}.{ext}", prefix.display()));
    std::fs::write(&p, text).with_context(|| format!("{}", p.display()))
}

/// Processes this bench started, killed by PID when dropped (unless already waited for).
pub(super) struct Procs(pub(super) Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub(super) struct Env {
    pub(super) dir: PathBuf,
    pub(super) exe: PathBuf,
    pub(super) state: PathBuf,
    pub(super) ctl_dir: PathBuf,
    pub(super) contracts: PathBuf,
    pub(super) bin_dir: PathBuf,
    pub(super) bus: String,
    pub(super) cgroup_root: PathBuf,
    pub(super) daemon_pid: u32,
    pub(super) rt: tokio::runtime::Runtime,
    pub(super) client: agentctl::client::Client,
}

impl Env {
    pub(super) fn home(&self, name: &str) -> PathBuf {
        self.state.join("home").join(TENANT).join(name)
    }

    pub(super) fn agent_log(&self, name: &str) -> String {
        std::fs::read_to_string(
            self.state
                .join("logs")
                .join(TENANT)
                .join(format!("{name}.log")),
        )
        .unwrap_or_default()
    }

    pub(super) fn daemon_log(&self) -> String {
        let t = std::fs::read_to_string(self.dir.join("agentosd.log")).unwrap_or_default();
        let n = t.len().saturating_sub(4000);
        t[t.floor_char_boundary(n)..].to_string()
    }

    pub(super) fn agentctl(&self, args: &[&str]) -> Result<std::process::Output> {
        Command::new(self.bin_dir.join("agentctl"))
            .arg("--bus-address")
            .arg(&self.bus)
            .args(args)
            .output()
            .context("run agentctl")
    }

    /// The daemon's CPU account of an agent (`agentctl status --json`'s `daemon_cpu`: what its
    /// `--ipc-agent-cpu` share counted, and how often and long it held the agent); `Null` when
    /// the status cannot be read.
    pub(super) fn daemon_cpu_account(&self, agent: &str) -> serde_json::Value {
        self.agentctl(&["status", agent, "--json"])
            .ok()
            .and_then(|o| serde_json::from_slice::<serde_json::Value>(&o.stdout).ok())
            .map(|v| v["daemon_cpu"].clone())
            .unwrap_or(serde_json::Value::Null)
    }

    pub(super) fn list_states(&self) -> Result<Vec<(String, String)>> {
        let rows = self
            .rt
            .block_on(agentctl::client::list_rows(&self.client))
            .map_err(|e| anyhow::anyhow!("ListAgents: {}", e.message))?;
        Ok(rows.into_iter().map(|r| (r.name, r.state)).collect())
    }

    pub(super) fn list_timed(&self) -> Result<u64> {
        let t0 = mono_ns();
        self.rt
            .block_on(agentctl::client::list_rows(&self.client))
            .map_err(|e| anyhow::anyhow!("ListAgents: {}", e.message))?;
        Ok(mono_ns() - t0)
    }

    pub(super) fn agentctl_list_timed(&self) -> Result<u64> {
        let t0 = mono_ns();
        let out = self.agentctl(&["list"])?;
        let dt = mono_ns() - t0;
        if !out.status.success() {
            bail!(
                "agentctl list failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(dt)
    }

    /// Write the contract of agent `name` running this binary with `args` and start it; its
    /// capabilities are the tool `bench` (bench mcp's echo server) and reading bin/ and ctl/.
    pub(super) fn start_agent(&self, name: &str, args: &[String]) -> Result<()> {
        self.start_agent_with(name, args, &["bench"], "")
    }

    /// Same with the capabilities `caps` (besides reading bin/ and ctl/) and `extra` YAML at the
    /// end of the contract (e.g. `modelPolicy: …`).
    pub(super) fn start_agent_with(
        &self,
        name: &str,
        args: &[String],
        caps: &[&str],
        extra: &str,
    ) -> Result<()> {
        self.start_agent_in_class(name, args, caps, extra, "SRT")
    }

    /// [`Env::start_agent_with`] in latency class `class` (`SRT`, `DT`; `class.latency`).
    pub(super) fn start_agent_in_class(
        &self,
        name: &str,
        args: &[String],
        caps: &[&str],
        extra: &str,
        class: &str,
    ) -> Result<()> {
        let bin = self.exe.parent().context("bin dir")?.display().to_string();
        let caps: String = caps.iter().map(|c| format!("  - {c}\n")).collect();
        let text = format!(
            "apiVersion: agentos/v0.2\nkind: AgentContract\nname: {name}\ntenant: {TENANT}\n\
             class: {{ latency: {class} }}\n\
             exec:\n  command: {exe}\n  args: {args}\n\
             capabilities:\n{caps}  - fs.read: [{bin}, {ctl}]\n  - fs.exec: [{bin}]\n{extra}",
            exe = self.exe.display(),
            args = serde_json::to_string(args)?,
            ctl = self.ctl_dir.display(),
        );
        contracts::parse_contract(&text, &format!("{name}.yaml"))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let f = self.contracts.join(format!("{name}.yaml"));
        std::fs::write(&f, text)?;
        let out = self.agentctl(&["start", &f.display().to_string()])?;
        if !out.status.success() {
            bail!(
                "agentctl start {name}: {}{}\ndaemon log:\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
                self.daemon_log()
            );
        }
        Ok(())
    }

    /// Wait until every agent in `names` wrote HOME/out.<ext>; fail when one stopped without.
    pub(super) fn wait_for(&self, names: &[String], ext: &str, secs: u64) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        let mut left: Vec<&String> = names.iter().collect();
        let mut last_check = Instant::now();
        while !left.is_empty() {
            left.retain(|n| !self.home(n).join(format!("out.{ext}")).exists());
            if left.is_empty() {
                break;
            }
            if last_check.elapsed() > Duration::from_millis(500) {
                last_check = Instant::now();
                let states = self.list_states()?;
                for n in &left {
                    let st = states
                        .iter()
                        .find(|(name, _)| name == *n)
                        .map(|s| s.1.as_str())
                        .unwrap_or("missing");
                    if !matches!(st, "running" | "activating" | "starting")
                        && !self.home(n).join(format!("out.{ext}")).exists()
                    {
                        bail!(
                            "agent {n} is {st} without {ext}; its log:\n{}\ndaemon log:\n{}",
                            self.agent_log(n),
                            self.daemon_log()
                        );
                    }
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "{} agents did not write {ext} within {secs} s (first: {}); its log:\n{}",
                    left.len(),
                    left[0],
                    self.agent_log(left[0])
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// CPU ticks per thread name of the daemon.
    pub(super) fn daemon_threads(&self) -> Vec<(String, u64)> {
        let mut out: Vec<(String, u64)> = Vec::new();
        let Ok(rd) = std::fs::read_dir(format!("/proc/{}/task", self.daemon_pid)) else {
            return out;
        };
        for e in rd.flatten() {
            let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
                continue;
            };
            let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
                continue;
            };
            let comm = stat[open + 1..close].to_string();
            let f: Vec<&str> = stat[close + 2..].split_whitespace().collect();
            let ticks = f.get(11).and_then(|u| u.parse::<u64>().ok()).unwrap_or(0)
                + f.get(12).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0);
            match out.iter_mut().find(|(c, _)| *c == comm) {
                Some(x) => x.1 += ticks,
                None => out.push((comm, ticks)),
            }
        }
        out
    }
}

pub(super) fn read_samples(p: &Path) -> Result<Vec<u32>> {
    let b = std::fs::read(p).with_context(|| format!("{}", p.display()))?;
    Ok(b.chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// Sorted samples with percentiles.
pub(super) struct Dist(pub(super) Vec<u64>);

impl Dist {
    pub(super) fn new(mut v: Vec<u64>) -> Dist {
        v.sort_unstable();
        Dist(v)
    }
    /// Permille.
    pub(super) fn p(&self, pm: usize) -> u64 {
        if self.0.is_empty() {
            return 0;
        }
        self.0[((self.0.len() - 1) * pm / 1000).min(self.0.len() - 1)]
    }
    pub(super) fn max(&self) -> u64 {
        self.0.last().copied().unwrap_or(0)
    }
    pub(super) fn mean(&self) -> u64 {
        self.0.iter().sum::<u64>() / self.0.len().max(1) as u64
    }
    pub(super) fn json(&self) -> Value {
        json!({"n": self.0.len(), "p50_ns": self.p(500), "p99_ns": self.p(990),
            "p999_ns": self.p(999), "max_ns": self.max(), "mean_ns": self.mean()})
    }
}

pub(super) fn us(ns: u64) -> String {
    let u = ns as f64 / 1000.0;
    if u < 100.0 {
        format!("{u:.1}")
    } else {
        format!("{u:.0}")
    }
}

pub(super) fn ms(ns: u64) -> String {
    format!("{:.1}", ns as f64 / 1e6)
}

pub(super) fn sdiff(a: u64, b: u64) -> String {
    let d = a as f64 - b as f64;
    format!("{:+.1}", d / 1000.0)
}

pub(super) fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// File system type and source of the mount holding `p` (from /proc/self/mountinfo).
pub(super) fn filesystem_of(p: &Path) -> String {
    let p = std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut best: Option<(usize, String)> = None;
    for l in text.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        let Some(dash) = f.iter().position(|x| *x == "-") else {
            continue;
        };
        let (Some(mp), Some(fstype), Some(src)) = (f.get(4), f.get(dash + 1), f.get(dash + 2))
        else {
            continue;
        };
        if p.starts_with(mp) && best.as_ref().is_none_or(|b| mp.len() >= b.0) {
            best = Some((mp.len(), format!("{fstype} on {src} (mounted at {mp})")));
        }
    }
    best.map(|b| b.1).unwrap_or_else(|| "unknown".into())
}

/// `syncs` appends of a 338-byte line, each followed by fdatasync, in `dir`.
pub(super) fn fdatasync_floor(dir: &Path, syncs: usize) -> Result<Vec<u64>> {
    let mut probe = SyncProbe::open(dir)?;
    (0..syncs).map(|_| probe.sample()).collect()
}

/// A file of its own in a directory, appended an audit record's size (338 bytes) and
/// `fdatasync`ed at each sample: the disk's own time for what a durable record costs. Removed
/// on drop.
pub(super) struct SyncProbe {
    file: std::fs::File,
    path: PathBuf,
}

impl SyncProbe {
    pub(super) fn open(dir: &Path) -> Result<SyncProbe> {
        let path = dir.join(format!("fdatasync-probe-{}", std::process::id()));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("open {}", path.display()))?;
        Ok(SyncProbe { file, path })
    }

    /// One append and `fdatasync`: nanoseconds.
    pub(super) fn sample(&mut self) -> Result<u64> {
        use std::os::fd::AsRawFd;
        let mut line = [b'x'; 338];
        line[337] = b'\n';
        let t0 = mono_ns();
        self.file.write_all(&line)?;
        // SAFETY: fdatasync on an fd this probe owns.
        if unsafe { libc::fdatasync(self.file.as_raw_fd()) } != 0 {
            return Err(std::io::Error::last_os_error()).context("fdatasync");
        }
        Ok(mono_ns() - t0)
    }
}

impl Drop for SyncProbe {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The floor: a line echo server on a Unix socket, one thread per connection.
pub(super) fn chmod(p: &Path, mode: u32) -> Result<()> {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {}", p.display()))
}

pub(super) fn start_bus(dir: &Path) -> Result<(Child, String)> {
    let conf = dir.join("bus.conf");
    std::fs::write(
        &conf,
        format!(
            r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>session</type>
  <listen>unix:path={}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow send_destination="*" eavesdrop="true"/>
    <allow eavesdrop="true"/>
    <allow own="*"/>
  </policy>
  <limit name="max_replies_per_connection">50000</limit>
  <limit name="max_connections_per_user">100000</limit>
</busconfig>
"#,
            dir.join("bus.sock").display()
        ),
    )?;
    let mut child = Command::new("dbus-daemon")
        .arg(format!("--config-file={}", conf.display()))
        .args(["--print-address=1", "--nofork"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("start dbus-daemon (apt-get install dbus)")?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().context("bus stdout")?).read_line(&mut line)?;
    Ok((child, line.trim().to_string()))
}

/// Kill everything in `path` and below (cgroup.kill), then remove the tree bottom-up.
pub(super) fn destroy_cgroup_tree(path: &Path) {
    if !path.exists() {
        return;
    }
    let _ = std::fs::write(path.join("cgroup.kill"), "1");
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        let ev = std::fs::read_to_string(path.join("cgroup.events")).unwrap_or_default();
        if !ev.contains("populated 1") {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    fn rm(p: &Path) {
        if let Ok(rd) = std::fs::read_dir(p) {
            for e in rd.flatten() {
                if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    rm(&e.path());
                }
            }
        }
        let _ = std::fs::remove_dir(p);
    }
    rm(path);
}

/// The environment variable naming a directory with prebuilt release agentosd and agentctl
/// (`cargo xtask vm bench` sets it to /usr/local/bin in the guest, which has no compiler): the
/// benchmarks' default for `--bin-dir`, and nothing is built.
pub const BIN_DIR_ENV: &str = "AGENTOS_BENCH_BIN_DIR";

/// The prebuilt binaries' directory from [`BIN_DIR_ENV`], if set.
pub fn prebuilt_bin_dir() -> Option<PathBuf> {
    std::env::var_os(BIN_DIR_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

pub(super) fn build_bins() -> Result<PathBuf> {
    if let Some(d) = prebuilt_bin_dir() {
        return Ok(d);
    }
    let here = std::env::current_exe()?
        .parent()
        .context("exe dir")?
        .to_path_buf();
    eprintln!("bench: building release agentosd and agentctl…");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let st = Command::new(&cargo)
        .current_dir(&root)
        .args(crate::install::build_args(&[
            "build",
            "--quiet",
            "--release",
        ]))
        .status()
        .context("cargo build")?;
    if !st.success() {
        bail!(
            "cargo build --release of {:?} failed",
            crate::install::BIN_PACKAGES
        );
    }
    Ok(here)
}

pub(super) fn clk_tck() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

/// Per-thread-name CPU ticks used between two snapshots, largest first.
pub(super) fn thread_delta(
    before: &[(String, u64)],
    after: &[(String, u64)],
) -> Vec<(String, u64)> {
    let mut v: Vec<(String, u64)> = after
        .iter()
        .map(|(n, t)| {
            let b = before
                .iter()
                .find(|(m, _)| m == n)
                .map(|x| x.1)
                .unwrap_or(0);
            (n.clone(), t.saturating_sub(b))
        })
        .filter(|x| x.1 > 0)
        .collect();
    v.sort_by_key(|b| std::cmp::Reverse(b.1));
    v
}

pub(super) fn fmt_threads(v: &[(String, u64)]) -> String {
    v.iter()
        .take(6)
        .map(|(n, t)| format!("{n} {:.2}", *t as f64 / clk_tck()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The working directory's layout: bin/ (a copy of this binary, which agents run), ctl/ (files
/// the bench and its agents meet at), contracts/, out/, state/ and agents.d/.
pub(super) struct Layout {
    pub(super) dir: PathBuf,
    pub(super) bin: PathBuf,
    pub(super) exe: PathBuf,
    pub(super) ctl_dir: PathBuf,
    pub(super) contracts: PathBuf,
    pub(super) out: PathBuf,
    pub(super) state: PathBuf,
    pub(super) agents_d: PathBuf,
}

impl Layout {
    /// Makes the directories under `dir` (readable by the agents' uids) and copies this binary.
    pub(super) fn new(dir: &Path) -> Result<Layout> {
        let l = Layout {
            dir: dir.to_path_buf(),
            bin: dir.join("bin"),
            exe: dir.join("bin/xtask"),
            ctl_dir: dir.join("ctl"),
            contracts: dir.join("contracts"),
            out: dir.join("out"),
            state: dir.join("state"),
            agents_d: dir.join("agents.d"),
        };
        for d in [
            &l.bin,
            &l.ctl_dir,
            &l.contracts,
            &l.out,
            &l.state,
            &l.agents_d,
        ] {
            std::fs::create_dir_all(d)?;
            chmod(d, 0o755)?;
        }
        std::fs::copy(std::env::current_exe()?, &l.exe)?;
        chmod(&l.exe, 0o755)?;
        Ok(l)
    }
}

impl Env {
    /// Starts a private dbus-daemon and agentosd (`bin_dir`/agentosd, audit log in `audit_dir`,
    /// `extra` arguments) in `cgroup_root`; returns once it answers `ListAgents`. Both are pushed
    /// to `procs`, the daemon first (teardown sends it SIGTERM before the rest is killed).
    pub(super) fn launch(
        l: &Layout,
        bin_dir: &Path,
        cgroup_root: &Path,
        audit_dir: &Path,
        extra: &[OsString],
        procs: &mut Procs,
    ) -> Result<Env> {
        let (bus_child, bus) = start_bus(&l.dir)?;
        procs.0.push(bus_child);
        std::fs::create_dir_all(cgroup_root)?;
        let log = std::fs::File::create(l.dir.join("agentosd.log"))?;
        let daemon = Command::new(bin_dir.join("agentosd"))
            .arg("--state-dir")
            .arg(&l.state)
            .arg("--agents-dir")
            .arg(&l.agents_d)
            .arg("--cgroup-root")
            .arg(cgroup_root)
            .arg("--bus-address")
            .arg(&bus)
            .arg("--audit-dir")
            .arg(audit_dir)
            .args(extra)
            .args(["--stop-timeout", "2", "--stop-agents-on-exit"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("start agentosd")?;
        let daemon_pid = daemon.id();
        procs.0.insert(0, daemon);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let deadline = Instant::now() + Duration::from_secs(30);
        let target = agentctl::client::BusTarget::Address(bus.clone());
        let client = loop {
            let c = rt.block_on(agentctl::client::Client::connect(
                Some(&target),
                Some(Duration::from_secs(25)),
            ));
            if let Ok(c) = c
                && rt.block_on(agentctl::client::list_rows(&c)).is_ok()
            {
                break c;
            }
            if Instant::now() > deadline {
                bail!(
                    "agentosd did not come up in 30 s; its log:\n{}",
                    std::fs::read_to_string(l.dir.join("agentosd.log")).unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        Ok(Env {
            dir: l.dir.clone(),
            exe: l.exe.clone(),
            state: l.state.clone(),
            ctl_dir: l.ctl_dir.clone(),
            contracts: l.contracts.clone(),
            bin_dir: bin_dir.to_path_buf(),
            bus,
            cgroup_root: cgroup_root.to_path_buf(),
            daemon_pid,
            rt,
            client,
        })
    }
}

/// Teardown: the daemon (SIGTERM: it stops its agents), the rest of `procs`, then whatever is
/// left in `cgroup_root`.
pub(super) fn teardown(mut procs: Procs, cgroup_root: &Path) {
    if let Some(d) = procs.0.first_mut() {
        // SAFETY: kill(2) on the PID of a child we spawned and have not reaped.
        unsafe { libc::kill(d.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = d.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    drop(procs);
    destroy_cgroup_tree(cgroup_root);
}

/// Writes `samples` (u32 ns, little endian) to `path` atomically.
pub(super) fn write_u32s(path: &Path, samples: &[u32]) -> Result<()> {
    let mut bytes = Vec::with_capacity(samples.len() * 4);
    for s in samples {
        bytes.extend_from_slice(&s.to_le_bytes());
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).with_context(|| format!("{}", tmp.display()))?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}
