//! cgroup BPF network enforcement on the host: an agent's ungranted destinations are refused
//! with EPERM by `ebpf/net.bpf.c` (UDP sendto to another host or port, and a TCP connect to an
//! ungranted host on a port Landlock allows), its granted destinations work, an agent with no
//! `net.connect` grant reaches nothing, and every refusal is in the audit trail as a kernel
//! denial with the syscall, errno and address. Root only; skips when the programs cannot load.

#![allow(clippy::unwrap_used)]

mod common;

use std::net::{TcpListener, UdpSocket};
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Bus, Daemon, TestCgroup};

const SCRIPT: &str = r#"
import errno, signal, socket, sys
up, up2, tp = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
def attempt(name, f):
    try:
        f()
        print(name, "ok", flush=True)
    except OSError as e:
        print(name, "err", errno.errorcode.get(e.errno, e.errno), flush=True)
def udp(addr, port, fam=socket.AF_INET):
    s = socket.socket(fam, socket.SOCK_DGRAM)
    try:
        s.sendto(b"agent datagram", (addr, port))
    finally:
        s.close()
def tcp(addr, port):
    socket.create_connection((addr, port), timeout=3).close()
signal.signal(signal.SIGUSR1, lambda *_: None)
for round in range(1, 100):
    attempt("udp-granted", lambda: udp("127.0.0.1", up))
    attempt("udp-other-host", lambda: udp("127.0.0.2", up))
    attempt("udp-other-port", lambda: udp("127.0.0.1", up2))
    attempt("udp6-loopback", lambda: udp("::1", up, socket.AF_INET6))
    attempt("tcp-granted", lambda: tcp("127.0.0.1", tp))
    attempt("tcp-other-host", lambda: tcp("127.0.0.2", tp))
    print("done", round, flush=True)
    signal.pause()  # SIGUSR1: another round
"#;

fn skip_without_bpf() -> bool {
    if let Err(e) = agentosd::enforce::net::probe_load() {
        common::skip(
            "netbpf",
            &format!("the cgroup BPF programs cannot load here: {e}"),
        );
        return true;
    }
    if !Path::new("/usr/bin/python3").exists() {
        common::skip("netbpf", "/usr/bin/python3 is needed for the agent");
        return true;
    }
    false
}

/// The agent's result lines (`NAME ok` / `NAME err ERRNO`) of round `round`, once it printed
/// `done ROUND`.
fn results(log: &Path, round: u32) -> Vec<(String, String)> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.lines().any(|l| l == format!("done {round}")) {
            let start = if round == 1 {
                0
            } else {
                let prev = format!("done {}\n", round - 1);
                text.find(&prev).map(|i| i + prev.len()).unwrap_or(0)
            };
            return text[start..]
                .lines()
                .take_while(|l| !l.starts_with("done "))
                .filter_map(|l| {
                    let (name, rest) = l.split_once(' ')?;
                    (rest == "ok" || rest.starts_with("err "))
                        .then(|| (name.to_string(), rest.to_string()))
                })
                .collect();
        }
        assert!(
            Instant::now() < deadline,
            "agent did not finish; log {}:\n{text}",
            log.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn result_of(r: &[(String, String)], name: &str) -> String {
    r.iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.clone())
        .unwrap_or_else(|| panic!("no result for {name}: {r:?}"))
}

fn denials(state: &Path, agent: &str, want: usize) -> Vec<serde_json::Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let o = Command::new(common::agentctl_bin())
            .args(["audit", "show", "--json", "--agent", agent, "--state-dir"])
            .arg(state)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(0), "{o:?}");
        let recs: Vec<serde_json::Value> = String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .filter(|r: &serde_json::Value| r["kind"] == "denial")
            .collect();
        if recs.len() >= want || Instant::now() > deadline {
            return recs;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn find<'a>(
    recs: &'a [serde_json::Value],
    syscall: &str,
    addr: &str,
    port: u16,
) -> &'a serde_json::Value {
    recs.iter()
        .find(|r| {
            r["detail"]["syscall"] == syscall
                && r["detail"]["addr"] == addr
                && r["detail"]["port"] == port
        })
        .unwrap_or_else(|| panic!("no {syscall} denial to {addr}:{port} in {recs:#?}"))
}

#[test]
fn ungranted_destinations_get_eperm_and_are_audited() {
    skip_unless_capable!();
    if skip_without_bpf() {
        return;
    }
    let bus = Bus::start();
    let cg = TestCgroup::new("netbpf");
    let dir = tempfile::tempdir().unwrap();
    // The agents' uids must be able to walk to their state directories and read the script.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let state = dir.path().join("state");
    let mut d = Daemon::start(&bus, &cg.path, &state);
    let log = d.log_text();
    assert!(log.contains("network enforcement: cgroup BPF"), "{log}");
    // BPF LSM: attached where the kernel allows it, otherwise reported (this host: EPERM).
    assert!(
        log.contains("BPF LSM: lsm/socket_connect attached")
            || log.contains("BPF LSM: lsm/socket_connect refused (EPERM)"),
        "{log}"
    );

    let scripts = dir.path().join("scripts");
    std::fs::create_dir(&scripts).unwrap();
    std::fs::set_permissions(&scripts, std::fs::Permissions::from_mode(0o755)).unwrap();
    let script = scripts.join("net.py");
    std::fs::write(&script, SCRIPT).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();

    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let up = udp.local_addr().unwrap().port();
    let up2 = UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let tp = tcp.local_addr().unwrap().port();

    let contract = |name: &str, grants: &str| {
        let text = format!(
            "apiVersion: agentos/v0.2\nkind: AgentContract\nname: {name}\ntenant: net\nexec: {{ command: /usr/bin/python3, args: [{:?}, \"{up}\", \"{up2}\", \"{tp}\"] }}\ncapabilities:\n  - fs.read: [{:?}]\n{grants}restart: \"no\"\n",
            script.display().to_string(),
            scripts.display().to_string(),
        );
        let p = dir.path().join(format!("{name}.yaml"));
        std::fs::write(&p, text).unwrap();
        p
    };
    let granted = contract(
        "granted",
        &format!("  - net.connect: [\"127.0.0.1:{up}\", \"127.0.0.1:{tp}\"]\n"),
    );
    let none = contract("nogrant", "");

    d.ctl_ok(&["start", granted.to_str().unwrap()]);
    let st = d.wait_state("net/granted", "running", 10);
    let pid = st["main_pid"].as_u64().unwrap();
    let notes = st["notes"].to_string();
    assert!(
        notes.contains(&format!(
            "network (cgroup BPF): 127.0.0.1:{up}, 127.0.0.1:{tp}"
        )),
        "{notes}"
    );
    let log_path = st["log_path"].as_str().unwrap().to_string();
    let r = results(Path::new(&log_path), 1);
    let granted_results = r.clone();
    eprintln!("granted agent: {r:?}");
    // Granted destinations work; the datagram arrives.
    assert_eq!(result_of(&r, "udp-granted"), "ok");
    let mut buf = [0u8; 64];
    let (n, _) = udp.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"agent datagram");
    assert_eq!(result_of(&r, "tcp-granted"), "ok");
    // Everything else: EPERM from the cgroup program (Landlock would say EACCES, and it allows
    // TCP to the granted port on any host).
    assert_eq!(result_of(&r, "udp-other-host"), "err EPERM");
    assert_eq!(result_of(&r, "udp-other-port"), "err EPERM");
    assert_eq!(result_of(&r, "udp6-loopback"), "err EPERM");
    assert_eq!(result_of(&r, "tcp-other-host"), "err EPERM");

    let recs = denials(&state, "granted", 4);
    let rec = find(&recs, "sendmsg", "127.0.0.2", up);
    assert_eq!(rec["decision"], "deny");
    assert_eq!(rec["tenant"], "net");
    assert_eq!(rec["binding"].as_str().map(str::len), Some(64), "{rec}");
    let det = &rec["detail"];
    assert_eq!(det["errno"], "EPERM");
    assert_eq!(det["errno_num"], 1);
    assert_eq!(det["hook"], "cgroup/sendmsg4");
    assert_eq!(det["protocol"], "udp");
    assert_eq!(det["mechanism"], "cgroup-bpf");
    assert_eq!(det["reason"], "not-granted");
    assert_eq!(det["pid"].as_u64(), Some(pid), "{rec}");
    assert_eq!(
        find(&recs, "sendmsg", "127.0.0.1", up2)["detail"]["errno"],
        "EPERM"
    );
    assert_eq!(
        find(&recs, "sendmsg", "::1", up)["detail"]["hook"],
        "cgroup/sendmsg6"
    );
    let c = find(&recs, "connect", "127.0.0.2", tp);
    assert_eq!(c["detail"]["hook"], "cgroup/connect4");
    assert_eq!(c["detail"]["protocol"], "tcp");
    assert_eq!(c["detail"]["errno"], "EPERM");
    assert_eq!(
        recs.len(),
        4,
        "granted destinations leave no denial: {recs:#?}"
    );
    // Counted per agent: `agentctl status` and the D-Bus property Denials.
    assert_eq!(d.status_json("net/granted")["denials"], 4);
    let text = d.ctl_ok(&["status", "net/granted"]);
    assert!(text.contains("Denials: 4 by the kernel"), "{text}");

    // No net.connect grant at all: nothing is reachable (fail closed).
    d.ctl_ok(&["start", none.to_str().unwrap()]);
    let st = d.wait_state("net/nogrant", "running", 10);
    assert!(
        st["notes"].to_string().contains("no destination granted"),
        "{st}"
    );
    let r = results(Path::new(st["log_path"].as_str().unwrap()), 1);
    eprintln!("agent without grants: {r:?}");
    assert_eq!(result_of(&r, "udp-granted"), "err EPERM");
    let recs = denials(&state, "nogrant", 1);
    assert_eq!(
        find(&recs, "sendmsg", "127.0.0.1", up)["detail"]["errno"],
        "EPERM"
    );

    // A daemon killed and started again loads the programs anew and refills the re-adopted
    // agent's entry: the same destinations work and the same ones are refused.
    d.kill9();
    d.spawn();
    d.wait_state("net/granted", "running", 10);
    d.ctl_ok(&["kill", "-s", "USR1", "--kill-whom", "main", "net/granted"]);
    let r2 = results(Path::new(&log_path), 2);
    eprintln!("granted agent after the daemon's restart: {r2:?}");
    assert_eq!(r2, granted_results, "the same outcome after re-adoption");
    let (n, _) = udp.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"agent datagram");
    assert!(
        denials(&state, "granted", 8).len() >= 8,
        "the re-adopted agent's denials are recorded"
    );

    // Entries go with the agents; the host (this test process, outside agents/) is untouched.
    d.ctl_ok(&["stop", "net/granted", "net/nogrant"]);
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .send_to(b"host", ("127.0.0.2", up))
        .expect("the host outside agents/ is not filtered");
    let o = Command::new(common::agentctl_bin())
        .args(["audit", "verify", "--state-dir"])
        .arg(&state)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{o:?}");
}

const FLOOD: &str = r#"
import errno, socket, sys, time
n, port = int(sys.argv[1]), int(sys.argv[2])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
denied = 0
t = time.time()
for i in range(n):
    try:
        s.sendto(b"x", ("127.0.0.2", port))
    except PermissionError:
        denied += 1
print("denied", denied, "in", round(time.time() - t, 3), "s", flush=True)
time.sleep(600)
"#;

/// A flood of denied sendto: every denial is either an audit record or counted in a
/// `denials-dropped` record (ring buffer or audit queue full), and the daemon stays responsive.
#[test]
fn a_denial_flood_is_recorded_or_counted_never_silently_lost() {
    skip_unless_capable!();
    if skip_without_bpf() {
        return;
    }
    let bus = Bus::start();
    let cg = TestCgroup::new("netflood");
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let state = dir.path().join("state");
    let d = Daemon::start(&bus, &cg.path, &state);
    let scripts = dir.path().join("scripts");
    std::fs::create_dir(&scripts).unwrap();
    std::fs::set_permissions(&scripts, std::fs::Permissions::from_mode(0o755)).unwrap();
    let script = scripts.join("flood.py");
    std::fs::write(&script, FLOOD).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
    let n = 50_000;
    let text = format!(
        "apiVersion: agentos/v0.2\nkind: AgentContract\nname: flood\ntenant: net\nexec: {{ command: /usr/bin/python3, args: [{:?}, \"{n}\", \"9\"] }}\ncapabilities:\n  - fs.read: [{:?}]\nrestart: \"no\"\n",
        script.display().to_string(),
        scripts.display().to_string(),
    );
    let f = dir.path().join("flood.yaml");
    std::fs::write(&f, text).unwrap();
    d.ctl_ok(&["start", f.to_str().unwrap()]);
    let st = d.wait_state("net/flood", "running", 10);
    let log = std::path::PathBuf::from(st["log_path"].as_str().unwrap());
    let deadline = Instant::now() + Duration::from_secs(60);
    let line = loop {
        let t = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(l) = t.lines().find(|l| l.starts_with("denied ")) {
            break l.to_string();
        }
        // Responsive while it floods.
        let t0 = Instant::now();
        d.ctl_ok(&["list"]);
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "agentctl list took {:?}",
            t0.elapsed()
        );
        assert!(Instant::now() < deadline, "flood did not finish");
        std::thread::sleep(Duration::from_millis(100));
    };
    eprintln!("flood agent: {line}");
    assert!(line.starts_with(&format!("denied {n} ")), "{line}");
    // Records + counted drops account for every denial (the drop counters are checked every 2 s).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let o = Command::new(common::agentctl_bin())
            .args(["audit", "show", "--json", "--state-dir"])
            .arg(&state)
            .output()
            .unwrap();
        let recs: Vec<serde_json::Value> = String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .filter(|r: &serde_json::Value| r["kind"] == "denial")
            .collect();
        let recorded = recs.iter().filter(|r| r["agent"] == "flood").count() as u64;
        let dropped: u64 = recs
            .iter()
            .filter(|r| r["detail"]["event"] == "denials-dropped")
            .map(|r| r["detail"]["count"].as_u64().unwrap())
            .sum();
        if recorded + dropped >= n {
            eprintln!("flood: {recorded} denial records, {dropped} counted as dropped");
            assert_eq!(recorded + dropped, n, "nothing counted twice");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "only {recorded} records + {dropped} dropped of {n} denials"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    d.ctl_ok(&["stop", "net/flood"]);
    let o = Command::new(common::agentctl_bin())
        .args(["audit", "verify", "--state-dir"])
        .arg(&state)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{o:?}");
}
