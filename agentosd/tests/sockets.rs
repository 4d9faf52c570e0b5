//! The socket broker (sandbox/sockets.rs) through the daemon: an agent with network grants has
//! its own network namespace (its abstract Unix names are not the host's), its inet and
//! route-netlink sockets are made in the host's by a broker in its cgroup with its uid and no
//! privilege, the broker keeps serving while agentosd is killed and restarted, and it ends
//! with the agent.

mod common;

use std::io::Read;
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{Bus, Daemon, TestCgroup};

/// Connects to the host's port every 50 ms, each time with a new socket, after binding an
/// abstract datagram name, printing the interfaces route netlink shows it, and making sockets
/// until its fd table is full (the broker must answer EMFILE, not leave the call waiting).
const AGENT: &str = r#"
import resource, socket, sys, time
port, name = int(sys.argv[1]), sys.argv[2]
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (32, hard))
socks = []
try:
    while len(socks) < 100:
        socks.append(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
    print("fdlimit none", flush=True)
except OSError as e:
    print("fdlimit errno %d after %d" % (e.errno, len(socks)), flush=True)
for s in socks:
    s.close()
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
u = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
u.bind("\0" + name)
print("ifaces " + ",".join(sorted(n for _, n in socket.if_nameindex())), flush=True)
n = 0
while True:
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=2)
        s.sendall(b"hello %d\n" % n)
        s.close()
        n += 1
    except OSError as e:
        print("error %s" % e, flush=True)
    time.sleep(0.05)
"#;

fn field(pid: u32, key: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .map(|v| v.trim().to_string())
        .unwrap_or_default()
}

fn netns(pid: &str) -> String {
    std::fs::read_link(format!("/proc/{pid}/ns/net"))
        .map(|p| p.display().to_string())
        .unwrap_or_default()
}

fn wait_for(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn an_agent_with_net_grants_has_its_own_namespace_and_a_broker_that_outlives_the_daemon() {
    skip_unless_capable!();
    let bus = Bus::start();
    let cg = TestCgroup::new("sockets");
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let state = dir.path().join("state");
    // The network programs pinned (as in production): the restart below leaves no window in
    // which the agent's sockets are refused while the new daemon takes over.
    let pin = dir.path().join("bpffs");
    let _unmount = common::Unmount(pin.clone());
    let mut d = Daemon::start_with(
        &bus,
        &cg.path,
        &state,
        &["--bpf-pin-dir", pin.to_str().unwrap()],
    );
    let scripts = dir.path().join("scripts");
    std::fs::create_dir(&scripts).unwrap();
    std::fs::set_permissions(&scripts, std::fs::Permissions::from_mode(0o755)).unwrap();
    let script = scripts.join("agent.py");
    std::fs::write(&script, AGENT).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();

    // The host side: count the connections that arrive.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let arrived = Arc::new(AtomicU64::new(0));
    {
        let arrived = arrived.clone();
        std::thread::spawn(move || {
            for mut s in listener.incoming().flatten() {
                let mut buf = [0u8; 32];
                if s.read(&mut buf).is_ok_and(|n| n > 0) {
                    arrived.fetch_add(1, Ordering::SeqCst);
                }
            }
        });
    }
    let name = format!("agentos-sockets-test-{}", std::process::id());
    let text = format!(
        "apiVersion: agentos/v0.2\nkind: AgentContract\nname: netter\ntenant: net\nexec: {{ command: /usr/bin/python3, args: [{:?}, \"{port}\", {name:?}] }}\ncapabilities:\n  - fs.read: [{:?}]\n  - net.connect: [\"127.0.0.1:{port}\"]\nrestart: \"no\"\n",
        script.display().to_string(),
        scripts.display().to_string(),
    );
    let f = dir.path().join("netter.yaml");
    std::fs::write(&f, text).unwrap();
    d.ctl_ok(&["start", f.to_str().unwrap()]);
    let st = d.wait_state("net/netter", "running", 10);
    let log = std::path::PathBuf::from(st["log_path"].as_str().unwrap());
    let main_pid = st["main_pid"].as_u64().unwrap() as u32;
    wait_for("the agent's interface line", 10, || {
        common::agent_output(&log).contains("ifaces ")
    });
    let out = common::agent_output(&log);
    assert!(
        out.contains(&format!("fdlimit errno {} after", libc::EMFILE)),
        "{out}"
    );

    // Route netlink is the host's: the agent sees the host's interfaces, not only a loopback.
    let mut host: Vec<String> = std::fs::read_dir("/sys/class/net")
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    host.sort();
    let seen = out
        .lines()
        .find_map(|l| l.strip_prefix("ifaces "))
        .unwrap_or_default();
    assert_eq!(seen, host.join(","), "agent output:\n{out}");

    // Its abstract name is its own: the host can bind the same name.
    {
        use std::os::linux::net::SocketAddrExt;
        let a = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        std::os::unix::net::UnixDatagram::bind_addr(&a)
            .expect("the host binds the name the agent bound: the agent's is in its own namespace");
    }

    // The broker: in the agent's cgroup, the agent's uid, nothing privileged, the host's
    // network namespace; the agent in a namespace of its own.
    let main_cg = cg.path.join("agents/net/netter/main/cgroup.procs");
    let procs: Vec<u32> = std::fs::read_to_string(&main_cg)
        .unwrap()
        .lines()
        .filter_map(|l| l.parse().ok())
        .collect();
    let broker = *procs
        .iter()
        .find(|p| field(**p, "Name:") == "agentos-sockets")
        .unwrap_or_else(|| panic!("no broker among {procs:?} in {}", main_cg.display()));
    assert_eq!(field(broker, "Uid:"), field(main_pid, "Uid:"));
    assert_eq!(field(broker, "Gid:"), field(main_pid, "Gid:"));
    assert_eq!(field(broker, "CapEff:"), "0000000000000000");
    assert_eq!(field(broker, "CapPrm:"), "0000000000000000");
    assert_eq!(field(broker, "CapBnd:"), "0000000000000000");
    assert_eq!(field(broker, "NoNewPrivs:"), "1");
    // No handler of the daemon's left: signals act on it as on any process (but glibc's own
    // signals 32 and 33, whose handlers glibc does not let anyone change).
    let caught = u64::from_str_radix(&field(broker, "SigCgt:"), 16).unwrap();
    assert_eq!(caught & !(0b11 << 31), 0, "SigCgt {caught:#x}");
    assert_eq!(netns(&broker.to_string()), netns("self"));
    assert_ne!(netns(&main_pid.to_string()), netns("self"));

    // agentosd killed: new sockets keep coming (each connection is a new socket).
    wait_for("connections", 10, || arrived.load(Ordering::SeqCst) >= 3);
    d.kill9();
    let before = arrived.load(Ordering::SeqCst);
    wait_for("connections while agentosd is down", 10, || {
        arrived.load(Ordering::SeqCst) >= before + 5
    });
    d.spawn();
    d.wait_state("net/netter", "running", 10);
    let before = arrived.load(Ordering::SeqCst);
    wait_for("connections after the restart", 10, || {
        arrived.load(Ordering::SeqCst) >= before + 3
    });
    let journal = d.ctl_ok(&["logs", "net/netter", "-n", "200"]);
    assert!(
        !journal.contains("error"),
        "{journal}\ndaemon log:\n{}",
        d.log_text()
    );

    // The broker ends with the agent; the stop needs no timeout.
    d.ctl_ok(&["stop", "net/netter"]);
    wait_for("the broker to end", 10, || !common::alive(broker));
    let journal = d.ctl_ok(&["logs", "net/netter", "-n", "50"]);
    assert!(!journal.contains("stop timeout"), "{journal}");
    assert!(
        journal.contains(&format!("socket broker PID {broker}")),
        "{journal}"
    );
    assert!(
        !Path::new(&main_cg).exists(),
        "the agent's cgroup was removed"
    );
}
