//! Test bed for the integration tests: a private cgroup under the cgroup2 mount, a private
//! dbus-daemon, the daemon itself. Everything is torn down on drop; only processes started
//! here are killed (by PID), only cgroups made here are killed (cgroup.kill) and removed.
#![allow(dead_code)]

pub mod caller;
pub mod flood;
pub mod mem;
pub mod models;
pub mod netns;
pub mod otlp;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

static SEQ: AtomicU32 = AtomicU32::new(0);

/// Why these tests cannot run here, if they cannot. Probed once per test binary (tests of one
/// binary run in parallel threads: a probe cgroup named only by the process id made a second
/// concurrent probe fail with EEXIST and skip a test that could run).
pub fn skip_reason() -> Option<String> {
    static REASON: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    REASON.get_or_init(probe_capable).clone()
}

fn probe_capable() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root (cgroup2 writes, clone3 into a cgroup)".into());
    }
    let Some(mount) = agentosd::cgroup::cgroup2_mount() else {
        return Some("no cgroup2 file system mounted".into());
    };
    let probe = mount.join(format!(
        "agentos-probe-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::SeqCst)
    ));
    if let Err(e) = std::fs::create_dir(&probe) {
        return Some(format!(
            "cannot create a cgroup under {}: {e}",
            mount.display()
        ));
    }
    let ok = probe.join("cgroup.kill").exists() && probe.join("cgroup.freeze").exists();
    let _ = std::fs::remove_dir(&probe);
    if !ok {
        return Some("kernel lacks cgroup.kill/cgroup.freeze (needs Linux 5.14)".into());
    }
    None
}

/// True when skipping is a failure: `cargo xtask test` sets `AGENTOS_TEST_NO_SKIP=1` (CI runs
/// it as root on a host that can run every host test), so a test that would skip for a reason
/// this host should not have fails instead of passing silently.
pub fn skips_forbidden() -> bool {
    std::env::var_os("AGENTOS_TEST_NO_SKIP").is_some_and(|v| v == "1")
}

/// Skip `test` because `why`: print it, or fail when skips are forbidden ([`skips_forbidden`]).
/// For a skip that is right even on the CI host (an opt-in that would touch every process of
/// the host), use [`skip_by_design`].
pub fn skip(test: &str, why: &str) {
    assert!(
        !skips_forbidden(),
        "{test} would skip ({why}), but AGENTOS_TEST_NO_SKIP=1 says this host must run it"
    );
    eprintln!("SKIPPED {test}: {why}");
}

/// Skip `test` for a reason that holds on every host of this kind by design (printed, never a
/// failure): the test runs elsewhere (the VM suite) or on request.
pub fn skip_by_design(test: &str, why: &str) {
    eprintln!("SKIPPED {test}: {why}");
}

#[macro_export]
macro_rules! skip_unless_capable {
    () => {
        if let Some(why) = common::skip_reason() {
            common::skip(module_path!(), &why);
            return;
        }
    };
}

/// Unmounts a test's private bpffs (the daemon mounted it at the pin directory) when dropped.
pub struct Unmount(pub PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// `--bpf-pin-dir` for a test daemon: "none", or `dir/pin` (a private bpffs the daemon mounts
/// there, unmounted when the guard drops).
pub fn pin_dir(dir: &Path, pin: &str) -> (String, Unmount) {
    let pin = if pin == "none" {
        "none".to_string()
    } else {
        dir.join(pin).display().to_string()
    };
    let guard = Unmount(PathBuf::from(&pin));
    (pin, guard)
}

/// A cgroup root of our own under the cgroup2 mount.
pub struct TestCgroup {
    pub path: PathBuf,
}

impl TestCgroup {
    pub fn new(tag: &str) -> Self {
        let mount = agentosd::cgroup::cgroup2_mount().expect("cgroup2 mount");
        let path = mount.join(format!(
            "agentos-test-{}-{}-{}",
            std::process::id(),
            tag,
            SEQ.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&path).expect("create test cgroup");
        TestCgroup { path }
    }
}

/// Kill everything in `path` and below (cgroup.kill), then remove the tree bottom-up.
pub fn destroy_cgroup_tree(path: &Path) {
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
    // A cgroup whose last task is still exiting refuses rmdir (EBUSY) for a moment after
    // `populated 0`: retry the tree until it is gone or the deadline passes, then say so.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        rm(path);
        if !path.exists() {
            return;
        }
        if Instant::now() >= deadline {
            eprintln!("test cgroup {} could not be removed", path.display());
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        destroy_cgroup_tree(&self.path);
    }
}

/// A private dbus-daemon.
pub struct Bus {
    pub address: String,
    child: Child,
    _dir: tempfile::TempDir,
}

impl Bus {
    pub fn start() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let sock = dir.path().join("bus");
        let conf = dir.path().join("bus.conf");
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
                sock.display()
            ),
        )
        .expect("write bus config");
        let mut child = Command::new("dbus-daemon")
            .arg(format!("--config-file={}", conf.display()))
            .arg("--print-address=1")
            .arg("--nofork")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start dbus-daemon");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("read bus address");
        Bus {
            address: line.trim().to_string(),
            child,
            _dir: dir,
        }
    }
}

impl Bus {
    /// A private bus enforcing the SHIPPED `units/org.agentos1.conf` policy on top of the
    /// system bus's default policy (deny method calls and ownership unless allowed), with
    /// `group="agentos"` replaced by `operator_group` (an existing group name: dbus-daemon
    /// ignores rules naming groups it cannot resolve). The socket is reachable by every uid.
    pub fn start_with_policy(operator_group: &str) -> Self {
        Self::start_for_all_uids(Some(operator_group))
    }

    /// A private bus that lets every uid connect and send anything (no policy at all), to
    /// show what the daemon decides on its own.
    pub fn start_open() -> Self {
        Self::start_for_all_uids(None)
    }

    fn start_for_all_uids(operator_group: Option<&str>) -> Self {
        let Some(operator_group) = operator_group else {
            return Self::start_with_policies(
                r#"  <policy context="default">
    <allow send_destination="*"/>
    <allow receive_sender="*"/>
    <allow own="*"/>
  </policy>"#,
            );
        };
        let shipped = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../units/org.agentos1.conf"),
        )
        .expect("read units/org.agentos1.conf");
        let start = shipped.find("<busconfig>").expect("<busconfig>") + "<busconfig>".len();
        let end = shipped.rfind("</busconfig>").expect("</busconfig>");
        let policies = shipped[start..end]
            .replace("group=\"agentos\"", &format!("group=\"{operator_group}\""));
        Self::start_with_policies(&policies)
    }

    fn start_with_policies(policies: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod bus dir");
        let sock = dir.path().join("bus");
        let conf = dir.path().join("bus.conf");
        std::fs::write(
            &conf,
            format!(
                r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path={}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <deny own="*"/>
    <deny send_type="method_call"/>
    <allow send_type="signal"/>
    <allow send_requested_reply="true" send_type="method_return"/>
    <allow send_requested_reply="true" send_type="error"/>
    <allow receive_type="method_call"/>
    <allow receive_type="method_return"/>
    <allow receive_type="error"/>
    <allow receive_type="signal"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus.Introspectable"/>
  </policy>
{policies}
  <limit name="max_replies_per_connection">50000</limit>
  <limit name="max_connections_per_user">100000</limit>
</busconfig>
"#,
                sock.display()
            ),
        )
        .expect("write bus config");
        let mut child = Command::new("dbus-daemon")
            .arg(format!("--config-file={}", conf.display()))
            .arg("--print-address=1")
            .arg("--nofork")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start dbus-daemon");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("read bus address");
        Bus {
            address: line.trim().to_string(),
            child,
            _dir: dir,
        }
    }
}

impl Drop for Bus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The daemon under test with its own state directory and cgroup root.
pub struct Daemon {
    pub child: Option<Child>,
    pub state_dir: PathBuf,
    pub agents_dir: PathBuf,
    pub cgroup_root: PathBuf,
    pub bus: String,
    pub log: PathBuf,
    /// More flags for agentosd (`--tools-dir`, `--consent-timeout`…).
    pub extra: Vec<String>,
}

/// The agentosd binary: the one cargo built, or `AGENTOS_TEST_AGENTOSD` (the VM suite runs this
/// crate's escape suite in the guest, where the build's paths do not exist).
pub fn agentosd_bin() -> &'static str {
    bin_from_env("AGENTOS_TEST_AGENTOSD", env!("CARGO_BIN_EXE_agentosd"))
}

/// The agentctl binary: the one cargo built for the agentctl package, or
/// `AGENTOS_TEST_AGENTCTL`.
pub fn agentctl_bin() -> &'static str {
    static BIN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    // The variable first: where it is set (the VM) there is no target directory to look in.
    BIN.get_or_init(|| match std::env::var("AGENTOS_TEST_AGENTCTL") {
        Ok(p) if !p.is_empty() => p,
        _ => workspace_bin("agentctl", "agentctl"),
    })
}

/// The agentos-mcp bridge: the one cargo built for the agentos-mcp package, or
/// `AGENTOS_TEST_MCP` (the installed one, in the VM).
pub fn bridge_bin() -> &'static str {
    static BUILT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BUILT.get_or_init(|| match std::env::var("AGENTOS_TEST_MCP") {
        Ok(p) if !p.is_empty() => p,
        _ => workspace_bin("agentos-mcp", "agentos-mcp"),
    })
}

/// An agent `t/NAME` for the ipc server's `pair()` (no cgroup needed: the connection is
/// inherited, not accepted).
pub fn paired_agent(name: &str) -> agentosd::ipc::AgentRef {
    agentosd::ipc::AgentRef {
        id: format!("t/{name}"),
        cgroup: PathBuf::from(format!("/nowhere/agents/t/{name}")),
        cgroup_dir: PathBuf::from(format!("/nonexistent/agents/t/{name}")),
        uid: 65534,
        gid: 65534,
    }
}

/// Echo every line of every connection the ipc server hands over, on `rt`.
pub fn echo_lines(rt: &tokio::runtime::Runtime, incoming: agentosd::ipc::Incoming) {
    use agentosd::ipc::{Connection, Inbound};
    let mut conns = incoming.conns;
    rt.spawn(async move {
        while let Some(c) = conns.recv().await {
            tokio::spawn(async move {
                let Connection { mut rx, tx, .. } = c;
                while let Some(Inbound::Line(l)) = rx.recv().await {
                    if tx.send(l).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
}

/// `IpcServer::start` inside `rt` (the ring waits on the runtime); `None`, reported as a skip of
/// `test`, when this kernel gives no usable io_uring.
pub fn start_ipc(
    rt: &tokio::runtime::Runtime,
    limits: agentosd::ipc::Limits,
    test: &str,
) -> Option<(
    std::sync::Arc<agentosd::ipc::IpcServer>,
    agentosd::ipc::Incoming,
)> {
    use agentosd::ipc::{IpcError, IpcServer};
    let started = {
        let _g = rt.enter();
        IpcServer::start(limits)
    };
    match started {
        Ok(x) => Some(x),
        Err(e @ (IpcError::Ring { .. } | IpcError::Unsupported { .. })) => {
            skip(test, &format!("no usable io_uring here: {e}"));
            None
        }
        Err(e) => panic!("IpcServer::start: {e}"),
    }
}

/// Binary `name` of another workspace package (`package`), from the target directory this test
/// runs from (`target/<profile>/deps/TEST` → `target/<profile>/NAME`). Cargo's
/// `CARGO_BIN_EXE_*` only names binaries of the test's own package, and `cargo test -p agentosd`
/// does not build the others: `cargo test --workspace` does, or `cargo build -p PACKAGE`. A
/// missing binary, or one older than its package's sources, fails the test with that fix
/// rather than testing a stale build.
pub fn workspace_bin(package: &str, name: &str) -> String {
    let exe = std::env::current_exe().expect("the test's own path");
    let dir = exe
        .parent()
        .filter(|d| d.ends_with("deps"))
        .and_then(Path::parent)
        .unwrap_or_else(|| panic!("{}: not under target/<profile>/deps", exe.display()));
    let bin = dir.join(name);
    let built = std::fs::metadata(&bin).and_then(|m| m.modified());
    let Ok(built) = built else {
        panic!(
            "{} is missing: run `cargo build -p {package}` (or `cargo test --workspace`, which \
             builds it) with the same profile and target directory",
            bin.display()
        );
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for src in [package, "api"] {
        if let Some((newest, path)) = newest_file(&root.join(src)) {
            assert!(
                newest <= built,
                "{} is older than {}: run `cargo build -p {package}` (or `cargo test \
                 --workspace`) so that the tests do not run a stale build",
                bin.display(),
                path.display()
            );
        }
    }
    bin.display().to_string()
}

/// The newest modification time of the sources under `dir` (`src/`, `Cargo.toml`).
fn newest_file(dir: &Path) -> Option<(std::time::SystemTime, PathBuf)> {
    let mut todo = vec![dir.join("src"), dir.join("Cargo.toml")];
    let mut newest: Option<(std::time::SystemTime, PathBuf)> = None;
    while let Some(p) = todo.pop() {
        let Ok(m) = std::fs::metadata(&p) else {
            continue;
        };
        if m.is_dir() {
            if let Ok(rd) = std::fs::read_dir(&p) {
                todo.extend(rd.flatten().map(|e| e.path()));
            }
        } else if let Ok(t) = m.modified()
            && newest.as_ref().is_none_or(|(n, _)| t > *n)
        {
            newest = Some((t, p));
        }
    }
    newest
}

fn bin_from_env(var: &str, built: &'static str) -> &'static str {
    match std::env::var(var) {
        Ok(p) if !p.is_empty() => Box::leak(p.into_boxed_str()),
        _ => built,
    }
}

impl Daemon {
    pub fn start(bus: &Bus, cgroup_root: &Path, state_dir: &Path) -> Self {
        Self::start_with(bus, cgroup_root, state_dir, &[])
    }

    pub fn start_with(bus: &Bus, cgroup_root: &Path, state_dir: &Path, extra: &[&str]) -> Self {
        let agents_dir = state_dir.join("agents.d");
        std::fs::create_dir_all(&agents_dir).expect("agents dir");
        let mut d = Daemon {
            child: None,
            state_dir: state_dir.to_path_buf(),
            agents_dir,
            cgroup_root: cgroup_root.to_path_buf(),
            bus: bus.address.clone(),
            log: state_dir.join("agentosd.log"),
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        d.spawn();
        d
    }

    pub fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("daemon log");
        let child = Command::new(agentosd_bin())
            .arg("--state-dir")
            .arg(&self.state_dir)
            .arg("--agents-dir")
            .arg(&self.agents_dir)
            .arg("--cgroup-root")
            .arg(&self.cgroup_root)
            .arg("--bus-address")
            .arg(&self.bus)
            .arg("--stop-timeout")
            .arg("2")
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start agentosd");
        self.child = Some(child);
        // Loading and verifying the BPF programs takes a few seconds here and half a minute to
        // well over a minute in the VM suite's emulated guest (100 s seen on a busy host).
        let up_secs = 300;
        let deadline = Instant::now() + Duration::from_secs(up_secs);
        loop {
            let out = self.ctl(&["list"]);
            if out.status.code() == Some(0) {
                return;
            }
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(st)) = c.try_wait()
            {
                panic!("agentosd exited early ({st}); log:\n{}", self.log_text());
            }
            assert!(
                Instant::now() < deadline,
                "agentosd did not come up in {up_secs} s; log:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// SIGKILL the daemon (agents must survive).
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM the daemon and wait for it.
    pub fn terminate(&mut self) -> Option<std::process::ExitStatus> {
        let mut c = self.child.take()?;
        // SAFETY: kill(2) on the PID of a child we spawned and have not reaped.
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(st)) = c.try_wait() {
                return Some(st);
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                return c.wait().ok();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn ctl(&self, args: &[&str]) -> Output {
        Command::new(agentctl_bin())
            .arg("--bus-address")
            .arg(&self.bus)
            .args(args)
            .output()
            .expect("run agentctl")
    }

    /// agentctl expecting success; returns stdout.
    pub fn ctl_ok(&self, args: &[&str]) -> String {
        let out = self.ctl(args);
        assert!(
            out.status.success(),
            "agentctl {args:?} failed ({}):\nstdout: {}\nstderr: {}\ndaemon log:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.log_text()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn status_json(&self, agent: &str) -> serde_json::Value {
        let s = self.ctl_ok(&["status", agent, "--json"]);
        serde_json::from_str(&s).expect("status json")
    }

    pub fn list_json(&self) -> Vec<serde_json::Value> {
        let s = self.ctl_ok(&["list", "--json"]);
        serde_json::from_str(&s).expect("list json")
    }

    /// Poll until the agent's state is `want` (or panic after `secs`).
    pub fn wait_state(&self, agent: &str, want: &str, secs: u64) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let st = self.status_json(agent);
            if st["state"] == want {
                return st;
            }
            assert!(
                Instant::now() < deadline,
                "agent {agent} did not reach {want} in {secs}s: {st}\ndaemon log:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Everything an agent wrote: its stdout file (`log_path`) then its stderr file next to it.
pub fn agent_output(log_path: &Path) -> String {
    let err = log_path.with_file_name(format!(
        "{}.stderr.log",
        log_path
            .file_name()
            .expect("a log file name")
            .to_string_lossy()
            .trim_end_matches(".log")
    ));
    std::fs::read_to_string(log_path).unwrap_or_default()
        + &std::fs::read_to_string(err).unwrap_or_default()
}

/// Write a contract file and return its path.
pub fn contract(dir: &Path, name: &str, exec: &str, extra: &str) -> PathBuf {
    let p = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &p,
        format!(
            "apiVersion: agentos/v0.2\nkind: AgentContract\nname: {name}\ntenant: default\nclass: {{ latency: DT }}\nexec: {exec}\n{extra}"
        ),
    )
    .expect("write contract");
    p
}

/// The cgroup2 path of a process relative to the mount (`0::` line).
pub fn proc_cgroup(pid: u32) -> String {
    agentosd::cgroup::proc_cgroup(&pid.to_string()).unwrap_or_default()
}

pub fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && agentosd::sys::process_state(pid).is_some_and(|s| s != 'Z')
}

/// A UDP responder at 127.0.0.1:`port` for the network tests (stops when dropped):
/// - "connect N": is answered, from `port`, with whether a TCP connect to 127.0.0.1:N completed
///   within 1 s ("connected", "timeout", or the error) — the SYN reaching a listener is enough,
///   no accept() is needed;
/// - anything else: "other" from an ungranted port first, then "granted" from `port` (on
///   loopback the first is queued or dropped before the second arrives, so once "granted" is in,
///   the receiver's queue shows whether "other" got through).
pub struct UdpResponder(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl UdpResponder {
    pub fn start(port: u16) -> UdpResponder {
        use std::net::{SocketAddr, TcpStream, UdpSocket};
        let granted = UdpSocket::bind(("127.0.0.1", port))
            .unwrap_or_else(|e| panic!("UDP responder at 127.0.0.1:{port}: {e}"));
        granted
            .set_read_timeout(Some(Duration::from_millis(100)))
            .expect("read timeout");
        let other = UdpSocket::bind("127.0.0.1:0").expect("UDP responder's other socket");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 64];
            while !flag.load(Ordering::Relaxed) {
                let Ok((n, from)) = granted.recv_from(&mut buf) else {
                    continue;
                };
                let connect = std::str::from_utf8(&buf[..n])
                    .ok()
                    .and_then(|m| m.strip_prefix("connect "))
                    .and_then(|p| p.parse::<u16>().ok());
                if let Some(port) = connect {
                    let to = SocketAddr::from(([127, 0, 0, 1], port));
                    let r = match TcpStream::connect_timeout(&to, Duration::from_secs(1)) {
                        Ok(_) => "connected".to_string(),
                        Err(e) if e.kind() == std::io::ErrorKind::TimedOut => "timeout".into(),
                        Err(e) => e.to_string(),
                    };
                    let _ = granted.send_to(r.as_bytes(), from);
                } else {
                    let _ = other.send_to(b"other", from);
                    let _ = granted.send_to(b"granted", from);
                }
            }
        });
        UdpResponder(stop)
    }
}

impl Drop for UdpResponder {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// `agentctl audit ARGS --state-dir STATE` (it reads the files directly: no daemon needed).
pub fn audit(state_dir: &Path, args: &[&str]) -> Output {
    Command::new(agentctl_bin())
        .arg("audit")
        .args(args)
        .arg("--state-dir")
        .arg(state_dir)
        .output()
        .expect("run agentctl audit")
}

/// A finished command's status and output, for an assertion's message.
pub fn output_text(o: &Output) -> String {
    format!(
        "status {}\nstdout: {}\nstderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The audit records as JSON values (`agentctl audit show --json`).
pub fn audit_records(state_dir: &Path) -> Vec<serde_json::Value> {
    let o = audit(state_dir, &["show", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", output_text(&o));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a record as JSON"))
        .collect()
}

/// After `refusals` connections refused at an agent's socket (the flood started at `t0`), wait
/// until each is either a `socket-refused` record or counted in a `socket-events-suppressed`
/// summary among the records `audit` reads, and check that the records stay within the denial
/// records' default rate (burst 100, then 20/s) with the rest counted.
pub fn assert_refusals_rate_limited(
    refusals: u64,
    t0: Instant,
    audit: impl Fn() -> Vec<serde_json::Value>,
) {
    // Generous: the daemon accepts on its ipc thread at nice +10 (docs/ipc.md, "Priority"), which
    // the rest of a parallel test suite can hold back for seconds; the wait ends as soon as every
    // refusal is accounted for.
    let deadline = Instant::now() + Duration::from_secs(60);
    let (refused, counted) = loop {
        let all = audit();
        let refused = all
            .iter()
            .filter(|r| r["detail"]["event"] == "socket-refused")
            .count() as u64;
        let counted: u64 = all
            .iter()
            .filter(|r| r["detail"]["event"] == "socket-events-suppressed")
            .filter_map(|r| r["detail"]["by"]["socket-refused"].as_u64())
            .sum();
        if refused + counted >= refusals {
            break (refused, counted);
        }
        assert!(
            Instant::now() < deadline,
            "{refused} records + {counted} counted of {refusals} refusals"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let allowed = 100 + 20 * (t0.elapsed().as_secs() + 1) + 1;
    assert!(
        refused <= allowed,
        "{refused} socket-refused records for {refusals} refusals (rate allows {allowed})"
    );
    assert!(counted > 0, "nothing counted: {refused} records");
}

/// A tmpfs of a test's own on `dir` (made if missing), unmounted (lazily if busy) on drop.
pub struct Tmpfs(pub PathBuf);

impl Tmpfs {
    /// `mount -t tmpfs -o size=SIZE,mode=MODE NAME DIR`.
    pub fn mount(dir: &Path, name: &str, size: &str, mode: &str) -> Result<Tmpfs, String> {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        let o = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode={mode}")])
            .arg(name)
            .arg(dir)
            .output()
            .map_err(|e| format!("mount: {e}"))?;
        if !o.status.success() {
            return Err(format!(
                "mount -t tmpfs on {}: {}",
                dir.display(),
                String::from_utf8_lossy(&o.stderr).trim()
            ));
        }
        Ok(Tmpfs(dir.to_path_buf()))
    }

    /// Bytes an unprivileged writer may still use.
    pub fn avail(&self) -> u64 {
        let s = rustix::fs::statvfs(&self.0).expect("statvfs of the tmpfs");
        s.f_bavail * s.f_frsize
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let ok = Command::new("umount")
            .arg(&self.0)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
}

/// An agent's `exec:` (YAML flow form) that pipes `initialize` and one `tools/call` of `tool` (no
/// arguments) into the agentos-mcp bridge and prints `bridge-exit=N`; and the bridge's
/// directory, which the agent's contract must let it read and execute.
pub fn bridge_call_exec(tool: &str) -> (String, String) {
    let requests = [
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"sh","version":"0"}}}"#.to_string(),
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#.to_string(),
        format!(
            r#"{{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{{"name":"{tool}","arguments":{{}}}}}}"#
        ),
    ];
    let bridge = Path::new(bridge_bin());
    let bin_dir = bridge
        .parent()
        .expect("the bridge's directory")
        .display()
        .to_string();
    let script = format!(
        "printf '%s\\n' {} | {}; echo bridge-exit=$?",
        requests
            .iter()
            .map(|r| format!("'{r}'"))
            .collect::<Vec<_>>()
            .join(" "),
        bridge.display()
    );
    let exec = format!(
        "{{ command: /bin/sh, args: [\"-c\", {}] }}",
        serde_json::to_string(&script).expect("a string")
    );
    (exec, bin_dir)
}
