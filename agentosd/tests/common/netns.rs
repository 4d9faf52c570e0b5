//! What the egress-by-name tests (dns.rs, dns_rest.rs, sni.rs) share: each runs on a thread of
//! its own in a network namespace it makes, with its test addresses (198.18.0.x, RFC 2544
//! benchmarking space: local, and not 127/8, so the stub's filters let them through) on that
//! namespace's loopback (this kernel has no dummy links), so no packet leaves the machine; an
//! agent prints one `NAME RESULT` line per attempt and `done`.

use std::net::{TcpListener, UdpSocket};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// The start of an agent's Python script: `attempt(NAME, f)` prints `NAME ok RESULT`, `NAME
/// gaierror CODE` or `NAME err ERRNO`; `tcp(addr, port)` connects and closes; `udp(addr, port)`
/// sends `ping` and returns the answer.
pub const PY_ATTEMPTS: &str = r#"
import errno, socket, struct, sys, time
def out(*a):
    print(*a, flush=True)
def attempt(name, f):
    try:
        r = f()
        out(name, "ok", r if r is not None else "")
    except socket.gaierror as e:
        out(name, "gaierror", e.args[0])
    except OSError as e:
        out(name, "err", errno.errorcode.get(e.errno, e.errno))
def tcp(addr, port):
    socket.create_connection((addr, port), timeout=3).close()
def udp(addr, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(3)
    try:
        s.sendto(b"ping", (addr, port))
        return s.recvfrom(100)[0].decode()
    finally:
        s.close()
"#;

/// Whether the cgroup BPF programs load here and /usr/bin/python3 (the agents' language) is
/// there; otherwise skips `test`, saying why.
pub fn net_bpf_and_python(test: &str) -> bool {
    if let Err(e) = agentosd::enforce::net::probe_load() {
        super::skip(
            test,
            &format!("the cgroup BPF programs cannot load here: {e}"),
        );
        return false;
    }
    if !Path::new("/usr/bin/python3").exists() {
        super::skip(test, "/usr/bin/python3 is needed for the agent");
        return false;
    }
    true
}

/// Moves this thread into a new network namespace, its loopback up with `addrs` (/32) on it.
/// The sockets the thread makes and the processes it spawns (the bus, the daemon, agentctl) are
/// in it; it goes with the thread.
pub fn enter(addrs: &[&str]) {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare(CLONE_NEWNET)");
    ip(&["link", "set", "lo", "up"]);
    for a in addrs {
        ip(&["addr", "add", &format!("{a}/32"), "dev", "lo"]);
    }
}

pub fn ip(args: &[&str]) {
    let o = Command::new("ip").args(args).output().expect("running ip");
    assert!(o.status.success(), "ip {args:?}: {o:?}");
}

/// Accepts and drops every connection, on a thread of its own.
pub fn accept_all(l: TcpListener) {
    std::thread::spawn(move || {
        for c in l.incoming() {
            drop(c);
        }
    });
}

/// Answers every datagram with `pong`, on a thread of its own.
pub fn udp_echo(sock: UdpSocket) {
    std::thread::spawn(move || {
        let mut buf = [0u8; 1500];
        while let Ok((_, peer)) = sock.recv_from(&mut buf) {
            let _ = sock.send_to(b"pong", peer);
        }
    });
}

/// The agent's result lines, once it printed `done`.
pub fn results(log: &Path) -> Vec<(String, String)> {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let text = super::agent_output(log);
        if text.lines().any(|l| l == "done") {
            return text
                .lines()
                .filter_map(|l| {
                    let (name, rest) = l.split_once(' ')?;
                    Some((name.to_string(), rest.trim_end().to_string()))
                })
                .collect();
        }
        assert!(Instant::now() < deadline, "agent did not finish:\n{text}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub fn result_of(r: &[(String, String)], name: &str) -> String {
    r.iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.clone())
        .unwrap_or_else(|| panic!("no result for {name}: {r:?}"))
}
