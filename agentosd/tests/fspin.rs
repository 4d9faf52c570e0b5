//! The BPF LSM filesystem programs (`ebpf/fs.bpf.c`) pinned in bpffs (`ROOT/fs-CGID`) outlive
//! the daemon: an agent under a daemon started with `--no-landlock-unix` (the BPF fence alone
//! for pathname Unix sockets) loops over what only those programs refuse — a connect to a host
//! pathname socket (`lsm/unix_stream_connect`), an abstract bind (`lsm/socket_bind`), an
//! executable mapping of a file in its home (`lsm/mmap_file`) — while the daemon is killed with
//! SIGKILL and started again: nothing gets through, the controls (its own socket, a granted
//! read) keep working, and a refusal made while the daemon was down is in the audit trail after
//! the restart (the pinned ring buffer). The same loop with `--bpf-pin-dir none` gets through
//! (the test is load-bearing).
//!
//! BPF LSM is refused on the development host: there the test is skipped with a message; the VM
//! suite runs it (`cargo xtask vm test fspin`).
#![allow(clippy::unwrap_used)]

mod common;

use std::io::Write as _;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{Bus, Daemon, TestCgroup};

const PROBER: &str = r#"
import mmap, os, signal, socket, sys
target, marker, me = sys.argv[1], sys.argv[2], sys.argv[3]
home = os.environ["HOME"]
own = os.path.join(home, "own.sock")
blob = os.path.join(home, "blob")
with open(blob, "wb") as f:
    f.write(b"\xc3" * 4096)
try:
    os.unlink(own)
except OSError:
    pass
# Its own socket (a datagram one: seccomp refuses an agent without network grants listen()).
ls = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
ls.bind(own)
ls.setblocking(False)
# SIGUSR2: pause the loop; again: one marked attempt; again: resume.
flags = {"stop": 0, "usr2": 0}
def usr2(*_):
    flags["usr2"] += 1
signal.signal(signal.SIGUSR1, lambda *_: flags.update(stop=1))
signal.signal(signal.SIGUSR2, usr2)
n = {"attempts": 0, "unix": 0, "abstract": 0, "mmap": 0, "control_fail": 0, "read_fail": 0}
def attempt(key, f):
    try:
        f()
        n[key] += 1
    except OSError:
        pass
def connect(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(1)
    try:
        s.connect(path)
    finally:
        s.close()
def bind_abstract():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        s.bind("\0agentos-fspin")
    finally:
        s.close()
def map_exec():
    fd = os.open(blob, os.O_RDONLY)
    try:
        mmap.mmap(fd, 4096, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_EXEC).close()
    finally:
        os.close(fd)
def control():
    c = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        c.sendto(b"x", own)
        ls.recv(16)
    except OSError:
        n["control_fail"] += 1
    finally:
        c.close()
    try:
        with open(me) as f:
            f.read(1)
    except OSError:
        n["read_fail"] += 1
print("probing", flush=True)
while not flags["stop"]:
    if flags["usr2"]:
        print("paused", flush=True)
        while flags["usr2"] < 2:
            signal.pause()
        # One refusal while the daemon is down (the test killed it): its record must come from
        # the pinned ring buffer, read by the next daemon.
        try:
            connect(marker)
            print("marked through", flush=True)
        except OSError as e:
            print("marked", e.errno, flush=True)
        while flags["usr2"] < 3:
            signal.pause()
        print("resumed", flush=True)
        flags["usr2"] = 0
    n["attempts"] += 1
    attempt("unix", lambda: connect(target))
    attempt("abstract", bind_abstract)
    attempt("mmap", map_exec)
    control()
print("result", " ".join(f"{k} {v}" for k, v in n.items()), flush=True)
signal.pause()
"#;

/// The agent's counters (`result attempts N unix N …`).
#[derive(Debug)]
struct Counts {
    line: String,
    attempts: u64,
    /// Connects, abstract binds and executable mappings that were allowed.
    through: u64,
    control_fail: u64,
    /// Connections the host listener accepted.
    arrived: u64,
    /// The agent's connect while the daemon was down: `marked ERRNO` or `marked through`.
    marked: String,
    /// Whether its refusal is in the audit trail (pinned runs only).
    record: Result<(), String>,
}

fn count(line: &str, key: &str) -> u64 {
    let w: Vec<&str> = line.split_whitespace().collect();
    w.iter()
        .position(|x| *x == key)
        .and_then(|i| w.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(u64::MAX)
}

fn wait_log(d: &Daemon, log: &Path, what: &str, secs: u64) -> String {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let t = std::fs::read_to_string(log).unwrap_or_default();
        if let Some(l) = t.lines().rev().find(|l| l.starts_with(what)) {
            return l.to_string();
        }
        assert!(
            Instant::now() < deadline,
            "no {what:?} in the agent's output:\n{}\nstatus: {}\ndaemon log:\n{}",
            common::agent_output(log),
            common::output_text(&d.ctl(&["status", "default/fsprober"])),
            d.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn signal(pid: i64, sig: i32) {
    // SAFETY: kill(2) on the agent's main pid, read from the daemon's status of the agent the
    // test started (alive: the loop runs until SIGUSR1).
    let r = unsafe { libc::kill(pid as i32, sig) };
    assert_eq!(r, 0, "signal {sig} to {pid}");
}

/// A listening socket at `path` that every uid may connect to, accepting (and counting) on a
/// thread of its own until the value is dropped (a full backlog would hold the agent's loop).
struct HostSocket {
    arrived: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl HostSocket {
    fn new(path: &Path) -> HostSocket {
        let l = UnixListener::bind(path).unwrap();
        l.set_nonblocking(true).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o777)).unwrap();
        let (arrived, stop) = (
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let (a, s) = (arrived.clone(), stop.clone());
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                match l.accept() {
                    Ok(_) => {
                        a.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        HostSocket { arrived, stop }
    }

    fn arrived(&self) -> u64 {
        self.arrived.load(Ordering::Relaxed)
    }
}

impl Drop for HostSocket {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The agent loops while the daemon is killed with SIGKILL and started again `rounds` times;
/// with pins, one refusal made while the daemon is down must reach the audit trail.
fn restart_loop(pin: &str, tag: &str, rounds: u32) -> Counts {
    let bus = Bus::start();
    let cg = TestCgroup::new(tag);
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let state = dir.path().join("state");
    let (pin, _unmount) = common::pin_dir(dir.path(), pin);
    let args = ["--bpf-pin-dir", &pin, "--no-landlock-unix"];
    let mut d = Daemon::start_with(&bus, &cg.path, &state, &args);
    let host = dir.path().join("host");
    std::fs::create_dir(&host).unwrap();
    std::fs::set_permissions(&host, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (target, marker) = (host.join("target.sock"), host.join("marker.sock"));
    let (listener, _marker) = (HostSocket::new(&target), HostSocket::new(&marker));
    let script = host.join("prober.py");
    std::fs::write(&script, PROBER).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
    let f = common::contract(
        dir.path(),
        "fsprober",
        &format!(
            "{{ command: /usr/bin/python3, args: [{:?}, {:?}, {:?}, {:?}] }}",
            script.display().to_string(),
            target.display().to_string(),
            marker.display().to_string(),
            script.display().to_string(),
        ),
        &format!(
            "capabilities:\n  - fs.read: [{:?}]\nrestart: \"no\"\n",
            host.display().to_string()
        ),
    );
    d.ctl_ok(&["start", f.to_str().unwrap()]);
    let st = d.wait_state("default/fsprober", "running", 30);
    let log = std::path::PathBuf::from(st["log_path"].as_str().unwrap());
    let pid = st["main_pid"].as_i64().unwrap_or(0);
    assert!(pid > 0, "{st}");
    // The agent's status says when its filesystem programs do not outlive the daemon.
    let status = d.ctl_ok(&["status", "default/fsprober"]);
    assert_eq!(
        status.contains("programs NOT pinned"),
        pin == "none",
        "{status}"
    );
    wait_log(&d, &log, "probing", 120);
    let t0 = Instant::now();
    for _ in 0..rounds {
        std::thread::sleep(Duration::from_millis(300));
        d.kill9();
        std::thread::sleep(Duration::from_millis(200));
        d.spawn();
    }
    // Pause the loop (the daemon drains the ring), kill the daemon, make one refused connect
    // while it is down, start it again.
    signal(pid, libc::SIGUSR2);
    wait_log(&d, &log, "paused", 20);
    std::thread::sleep(Duration::from_secs(1));
    d.kill9();
    signal(pid, libc::SIGUSR2);
    let marked = wait_log(&d, &log, "marked", 20);
    d.spawn();
    // Its record, from the pinned ring buffer (the loop waits: no flood ahead of it).
    let record = if pin == "none" {
        Ok(())
    } else {
        records(&state, &marker)
    };
    signal(pid, libc::SIGUSR2);
    wait_log(&d, &log, "resumed", 20);
    std::thread::sleep(Duration::from_secs(2));
    let st = d.status_json("default/fsprober");
    assert_eq!(
        st["state"],
        "running",
        "{st}\n{}",
        common::agent_output(&log)
    );
    signal(pid, libc::SIGUSR1);
    let line = wait_log(&d, &log, "result ", 20);
    let arrived = listener.arrived();
    let c = Counts {
        attempts: count(&line, "attempts"),
        through: ["unix", "abstract", "mmap"]
            .iter()
            .fold(0u64, |a, k| a.saturating_add(count(&line, k))),
        control_fail: count(&line, "control_fail").saturating_add(count(&line, "read_fail")),
        arrived,
        line: format!("{line}; {marked}"),
        marked,
        record,
    };
    // Past the test harness's capture (a direct write to stdout): the numbers for the docs.
    let _ = writeln!(
        std::io::stdout(),
        "{tag}: {rounds} kill -9/restart rounds in {:?}: {}; {} connections arrived",
        t0.elapsed(),
        c.line,
        c.arrived
    );
    if pin != "none" {
        assert!(
            d.log_text()
                .contains("took over the filesystem programs pinned in"),
            "{}",
            d.log_text()
        );
    }
    d.ctl_ok(&["stop", "default/fsprober"]);
    c
}

/// The audit trail has the loop's refusals by each program, and the one made while the daemon
/// was down (the connect to `marker`), each attributed to the agent.
fn records(state: &Path, marker: &Path) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let want = [
        ("lsm/unix_stream_connect", None),
        ("lsm/socket_bind", None),
        ("lsm/mmap_file", None),
        (
            "lsm/unix_stream_connect",
            Some(marker.display().to_string()),
        ),
    ];
    loop {
        let recs: Vec<serde_json::Value> = common::audit_records(state)
            .into_iter()
            .filter(|r| r["kind"] == "denial" && r["detail"]["mechanism"] == "bpf-lsm")
            .collect();
        let missing: Vec<_> = want
            .iter()
            .filter(|(hook, path)| {
                !recs.iter().any(|r| {
                    r["agent"] == "fsprober"
                        && r["detail"]["hook"] == *hook
                        && path.as_ref().is_none_or(|p| r["detail"]["path"] == *p)
                })
            })
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            let other: Vec<_> = common::audit_records(state)
                .into_iter()
                .filter(|r| r["kind"] != "denial")
                .map(|r| format!("{} {} {}", r["kind"], r["agent"], r["detail"]))
                .collect();
            return Err(format!(
                "no bpf-lsm denial records for {missing:?} among {} records; other records: {other:?}",
                recs.len()
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Class 4 for the filesystem programs: pinned, kill -9 and restarts leave no window for the
/// pathname Unix socket fence, abstract binds or executable mappings; unpinned they do.
#[test]
fn pinned_fs_programs_leave_no_window_across_kill9_restarts() {
    skip_unless_capable!();
    let fence = match agentosd::enforce::fs::FsEnforcer::load() {
        Ok(f) => f.unix_status(),
        Err(e) => Err(e.to_string()),
    };
    if let Err(why) = fence {
        assert!(
            std::env::var("AGENTOS_VM_TEST").as_deref() != Ok("1"),
            "the VM has BPF LSM: {why}"
        );
        common::skip_by_design(
            module_path!(),
            &format!(
                "the BPF LSM Unix socket programs do not load here ({why}); `cargo xtask vm test fspin` runs this"
            ),
        );
        return;
    }
    let c = restart_loop("bpffs", "fspin", 3);
    let u = restart_loop("none", "fsnopin", 2);
    assert_eq!(c.through, 0, "{c:?}");
    assert_eq!(c.arrived, 0, "{c:?}");
    assert_eq!(c.control_fail, 0, "the controls must keep working: {c:?}");
    assert!(c.attempts > 50, "the agent kept trying: {c:?}");
    assert_eq!(
        c.marked, "marked 13",
        "the connect while the daemon was down: {c:?}"
    );
    assert_eq!(c.record, Ok(()), "{c:?}");
    assert!(
        u.through > 0 && u.arrived > 0 && u.marked == "marked through",
        "without pinning the restart window must show (else this test proves nothing): {u:?}"
    );
}
