//! Egress by name on the host: an agent granted `*.example.test:P1` and `named.other.test:P2`
//! resolves those names through its DNS stub in agentosd and reaches the addresses they resolve
//! to, while the TTL (plus the grace) runs and not after; an ungranted name gets NXDOMAIN with an
//! Extended DNS Error and never reaches the upstream; a neighbouring address of the same server
//! is refused (EPERM); a TXT query for a granted name is answered empty and not forwarded; a
//! query sent straight to another resolver is redirected to the stub (that resolver sees
//! nothing, and the reply shows the address the agent asked); a name that resolves to loopback
//! or the metadata address gets those stripped; each refused name is an audit record.
//!
//! Slice 2, the bypass corpus: a refused connect to an address the stub answered earlier names
//! the name in its audit record (after the TTL ran out too); a name grant is TCP only, UDP
//! (QUIC) to its addresses refused unless the contract declares `udp://NAME:PORT`, and such a
//! declaration gives UDP, not TCP; the v4-mapped IPv6 form of an answered address reaches it on
//! the granted port only, an IPv6 destination never answered is refused; an HTTP CONNECT relay
//! on the host is refused until the contract grants the relay's name (then the relay is the
//! contract's choice); a name over 253 bytes is REFUSED with a record; DoT (853) and DoH (443)
//! to an address no granted name resolved to are refused.
//!
//! Everything runs in a network namespace this test makes (198.18.0.x addresses on its
//! loopback): the daemon, the fake upstream resolver and the servers are in it, so
//! no packet leaves the machine and the host's resolver is never asked. Root only; skips when
//! the BPF programs cannot load.

#![allow(clippy::unwrap_used)]

mod common;

use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::netns::{self, accept_all, result_of, results, udp_echo};
use common::{Bus, Daemon, TestCgroup};

const SERVER: &str = "198.18.0.10";
const NEIGHBOUR: &str = "198.18.0.11";
/// named.other.test's address (listening on both ports, granted only one).
const NAMED: &str = "198.18.0.12";
const UPSTREAM: &str = "198.18.0.53";
const OTHER_RESOLVER: &str = "198.18.0.54";
/// quic.other.test's address: granted over UDP only (`udp://quic.other.test:P1`).
const QUIC: &str = "198.18.0.13";
/// relay.example.test's address: an HTTP CONNECT proxy run by the test (a host process).
const RELAY: &str = "198.18.0.20";

/// The agent, after [`netns::PY_ATTEMPTS`].
const SCRIPT: &str = r#"
p1, p2 = int(sys.argv[1]), int(sys.argv[2])
def resolve(host):
    return socket.getaddrinfo(host, 80, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
def tcp6(addr, port):
    s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    s.settimeout(3)
    try:
        s.connect((addr, port))
    finally:
        s.close()
def relay(addr, port, target):
    s = socket.create_connection((addr, port), timeout=3)
    try:
        s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (target, target)).encode())
        return s.recv(100).decode().split("\r\n")[0]
    finally:
        s.close()
def query(name, qtype, edns):
    q = struct.pack(">HHHHHH", 0x4242, 0x0100, 1, 0, 0, 1 if edns else 0)
    for l in name.split("."):
        q += bytes([len(l)]) + l.encode()
    q += b"\0" + struct.pack(">HH", qtype, 1)
    if edns:
        q += b"\0" + struct.pack(">HHIH", 41, 1232, 0, 0)
    return q
def raw(server, name, qtype, edns=True):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(5)
    s.sendto(query(name, qtype, edns), (server, 53))
    data, src = s.recvfrom(4096)
    s.close()
    rcode = data[3] & 0xf
    an = struct.unpack(">H", data[6:8])[0]
    ede = b""
    for i in range(12, len(data) - 5):
        n = struct.unpack(">H", data[i+2:i+4])[0]
        if data[i:i+2] == b"\0\x0f" and i + 4 + n == len(data):
            code = struct.unpack(">H", data[i+4:i+6])[0]
            ede = b"%d:" % code + data[i+6:i+4+n]
    return "src=%s:%d rcode=%d an=%d ede=%s" % (src[0], src[1], rcode, an, ede.decode(errors="replace"))
a = None
attempt("relay-direct", lambda: relay("198.18.0.20", p1, "198.18.0.11:%d" % p1))
attempt("resolve-www", lambda: resolve("www.example.test"))
attempt("udp-www", lambda: udp(resolve("www.example.test"), p1))
attempt("mapped-www", lambda: tcp6("::ffff:" + resolve("www.example.test"), p1))
attempt("mapped-wrong-port", lambda: tcp6("::ffff:" + resolve("www.example.test"), p2))
attempt("mapped-neighbour", lambda: tcp6("::ffff:198.18.0.11", p1))
attempt("v6-unanswered", lambda: tcp6("2001:db8::10", p1))
attempt("udp-quic", lambda: udp(resolve("quic.other.test"), p1))
attempt("tcp-quic", lambda: tcp(resolve("quic.other.test"), p1))
attempt("relay-named", lambda: relay(resolve("relay.example.test"), p1, "198.18.0.11:%d" % p1))
attempt("dot", lambda: tcp("198.18.0.54", 853))
attempt("doh", lambda: tcp("198.18.0.54", 443))
attempt("doh-granted-port", lambda: tcp("198.18.0.54", p1))
attempt("raw-long-name", lambda: raw("8.8.8.8", ".".join(["a" * 60] * 4) + ".example.test", 1))
attempt("connect-www", lambda: tcp(resolve("www.example.test"), p1))
attempt("connect-named", lambda: tcp(resolve("named.other.test"), p2))
attempt("named-wrong-port", lambda: tcp(resolve("named.other.test"), p1))
attempt("resolve-evil", lambda: resolve("secret.attacker.test"))
attempt("resolve-suffix", lambda: resolve("example.test"))
attempt("resolve-rebind", lambda: resolve("rebind.example.test"))
attempt("neighbour", lambda: tcp("198.18.0.11", p1))
attempt("raw-evil", lambda: raw("198.18.0.54", "leak.attacker.test", 1))
attempt("raw-txt", lambda: raw("198.18.0.54", "www.example.test", 16))
attempt("raw-long", lambda: raw("8.8.8.8", "a" * 64 + ".example.test", 1))
attempt("raw-www", lambda: raw("8.8.8.8", "www.example.test", 1, False))
time.sleep(4)
attempt("connect-expired", lambda: tcp("198.18.0.10", p1))
attempt("connect-again", lambda: tcp(resolve("www.example.test"), p1))
out("done")
"#;

/// A fake recursive resolver on UPSTREAM:53 answering A records from a table (TTL 1 s),
/// NXDOMAIN for the rest, logging every question it gets as `NAME TYPE`.
fn fake_upstream(sock: UdpSocket, log: Arc<Mutex<Vec<String>>>) {
    let table: &[(&str, &[[u8; 4]])] = &[
        ("www.example.test", &[[198, 18, 0, 10]]),
        ("named.other.test", &[[198, 18, 0, 12]]),
        ("quic.other.test", &[[198, 18, 0, 13]]),
        ("relay.example.test", &[[198, 18, 0, 20]]),
        (
            "rebind.example.test",
            &[[127, 0, 0, 1], [169, 254, 169, 254]],
        ),
    ];
    let mut buf = [0u8; 1500];
    loop {
        let Ok((n, peer)) = sock.recv_from(&mut buf) else {
            return;
        };
        let q = &buf[..n];
        let mut i = 12;
        let mut labels = Vec::new();
        while i < n && q[i] != 0 {
            let l = q[i] as usize;
            labels.push(String::from_utf8_lossy(&q[i + 1..(i + 1 + l).min(n)]).to_lowercase());
            i += 1 + l;
        }
        let name = labels.join(".");
        let qtype = u16::from_be_bytes([q[i + 1], q[i + 2]]);
        log.lock().unwrap().push(format!("{name} {qtype}"));
        let qend = i + 5;
        let addrs = table
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, a)| *a)
            .filter(|_| qtype == 1);
        let mut r = q[..2].to_vec();
        let rcode = if table.iter().any(|(n, _)| *n == name) {
            0
        } else {
            3
        };
        let an = addrs.map(|a| a.len()).unwrap_or(0) as u16;
        r.extend_from_slice(&[0x81, 0x80 | rcode, 0, 1]);
        r.extend_from_slice(&an.to_be_bytes());
        r.extend_from_slice(&[0, 0, 0, 0]);
        r.extend_from_slice(&q[12..qend]);
        for a in addrs.unwrap_or_default() {
            r.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 1, 0, 4]);
            r.extend_from_slice(a);
        }
        let _ = sock.send_to(&r, peer);
    }
}

/// Logs every datagram it gets (it must get none: the agent's queries go to the stub).
fn silent_resolver(sock: UdpSocket, log: Arc<Mutex<Vec<String>>>) {
    let mut buf = [0u8; 1500];
    while let Ok((n, peer)) = sock.recv_from(&mut buf) {
        log.lock().unwrap().push(format!("{n} bytes from {peer}"));
    }
}

/// A tiny HTTP CONNECT proxy (a host process the agent's contract does not name): `CONNECT
/// HOST:PORT` → `200` when it reaches HOST:PORT, `502` when not; then it closes.
fn connect_proxy(l: TcpListener) {
    use std::io::{Read as _, Write as _};
    for c in l.incoming() {
        let Ok(mut c) = c else { continue };
        let mut buf = [0u8; 512];
        let n = c.read(&mut buf).unwrap_or(0);
        let req = String::from_utf8_lossy(&buf[..n]).to_string();
        let target = req.split_whitespace().nth(1).unwrap_or("").to_string();
        let reached = target
            .parse::<SocketAddr>()
            .ok()
            .and_then(|a| std::net::TcpStream::connect_timeout(&a, Duration::from_secs(2)).ok());
        let status = if reached.is_some() {
            "HTTP/1.1 200 Connection established\r\n\r\n"
        } else {
            "HTTP/1.1 502 Bad Gateway\r\n\r\n"
        };
        let _ = c.write_all(status.as_bytes());
    }
}

#[test]
fn names_are_granted_by_the_stub_and_nothing_else_resolves_or_connects() {
    skip_unless_capable!();
    if !netns::net_bpf_and_python("dns") {
        return;
    }
    // The whole test on one thread in a network namespace of its own: the sockets it makes and
    // the processes it spawns (the bus, the daemon, agentctl) are in it; it goes with the thread.
    std::thread::spawn(in_netns).join().unwrap();
}

fn in_netns() {
    netns::enter(&[
        SERVER,
        NEIGHBOUR,
        NAMED,
        UPSTREAM,
        OTHER_RESOLVER,
        QUIC,
        RELAY,
    ]);

    let upstream_log = Arc::new(Mutex::new(Vec::new()));
    let other_log = Arc::new(Mutex::new(Vec::new()));
    let up = UdpSocket::bind((UPSTREAM, 53)).unwrap();
    let l = upstream_log.clone();
    std::thread::spawn(move || fake_upstream(up, l));
    let other = UdpSocket::bind((OTHER_RESOLVER, 53)).unwrap();
    let l = other_log.clone();
    std::thread::spawn(move || silent_resolver(other, l));
    let s1 = TcpListener::bind((SERVER, 0)).unwrap();
    let p1 = s1.local_addr().unwrap().port();
    let s2 = TcpListener::bind((SERVER, 0)).unwrap();
    let p2 = s2.local_addr().unwrap().port();
    let n1 = TcpListener::bind((NEIGHBOUR, p1)).unwrap();
    let m1 = TcpListener::bind((NAMED, p1)).unwrap();
    let m2 = TcpListener::bind((NAMED, p2)).unwrap();
    let q1 = TcpListener::bind((QUIC, p1)).unwrap();
    let dot = TcpListener::bind((OTHER_RESOLVER, 853)).unwrap();
    let doh = TcpListener::bind((OTHER_RESOLVER, 443)).unwrap();
    let doh_p1 = TcpListener::bind((OTHER_RESOLVER, p1)).unwrap();
    for l in [s1, s2, n1, m1, m2, q1, dot, doh, doh_p1] {
        accept_all(l);
    }
    for a in [SERVER, QUIC] {
        let u = UdpSocket::bind((a, p1)).unwrap();
        udp_echo(u);
    }
    let proxy = TcpListener::bind((RELAY, p1)).unwrap();
    std::thread::spawn(move || connect_proxy(proxy));

    let bus = Bus::start();
    let cg = TestCgroup::new("dns");
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let state = dir.path().join("state");
    let upstream: SocketAddr = format!("{UPSTREAM}:53").parse().unwrap();
    let up_arg = upstream.to_string();
    let d = Daemon::start_with(
        &bus,
        &cg.path,
        &state,
        &[
            "--bpf-pin-dir",
            "none",
            "--dns-upstream",
            &up_arg,
            "--dns-grace",
            "1",
        ],
    );
    let scripts = dir.path().join("scripts");
    std::fs::create_dir(&scripts).unwrap();
    std::fs::set_permissions(&scripts, std::fs::Permissions::from_mode(0o755)).unwrap();
    let script = scripts.join("dns.py");
    std::fs::write(&script, format!("{}{SCRIPT}", netns::PY_ATTEMPTS)).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
    let text = format!(
        "apiVersion: agentos/v0.2\nkind: AgentContract\nname: names\ntenant: dns\nexec: {{ command: /usr/bin/python3, args: [{:?}, \"{p1}\", \"{p2}\"] }}\ncapabilities:\n  - fs.read: [{:?}]\n  - net.connect: [\"*.example.test:{p1}\", \"named.other.test:{p2}\", \"udp://quic.other.test:{p1}\"]\nrestart: \"no\"\n",
        script.display().to_string(),
        scripts.display().to_string(),
    );
    let contract = dir.path().join("names.yaml");
    std::fs::write(&contract, text).unwrap();
    d.ctl_ok(&["start", contract.to_str().unwrap()]);
    let st = d.wait_state("dns/names", "running", 20);
    let notes = st["notes"].to_string();
    assert!(
        notes.contains(&format!(
            "*.example.test:{p1}, named.other.test:{p2}, udp://quic.other.test:{p1}, DNS through the daemon's stub (127.0.0.1:"
        )),
        "{notes}"
    );
    let r = results(Path::new(st["log_path"].as_str().unwrap()));
    let got = |n: &str| result_of(&r, n);

    assert_eq!(got("resolve-www"), format!("ok {SERVER}"), "{r:?}");
    assert_eq!(got("connect-www"), "ok", "{r:?}");
    assert_eq!(got("connect-named"), "ok", "{r:?}");
    // named.other.test is granted on p2 only.
    assert_eq!(got("named-wrong-port"), "err EPERM", "{r:?}");
    // NXDOMAIN: getaddrinfo's EAI_NONAME (-2).
    assert_eq!(got("resolve-evil"), "gaierror -2", "{r:?}");
    assert_eq!(got("resolve-suffix"), "gaierror -2", "{r:?}");
    // Every address stripped: an empty answer (EAI_NODATA -5 or EAI_NONAME).
    assert!(got("resolve-rebind").starts_with("gaierror"), "{r:?}");
    assert_eq!(got("neighbour"), "err EPERM", "{r:?}");
    // Sent to another resolver: answered by the stub, shown as that resolver's reply, with the
    // Extended DNS Error "Prohibited" naming the contract.
    let evil = got("raw-evil");
    assert!(
        evil.starts_with(&format!("ok src={OTHER_RESOLVER}:53 rcode=3 an=0 ede=18:")),
        "{evil}"
    );
    assert!(evil.contains("contract names"), "{evil}");
    assert_eq!(
        got("raw-txt"),
        format!("ok src={OTHER_RESOLVER}:53 rcode=0 an=0 ede="),
        "{r:?}"
    );
    assert_eq!(
        got("raw-long"),
        "ok src=8.8.8.8:53 rcode=5 an=0 ede=",
        "{r:?}"
    );
    assert_eq!(
        got("raw-www"),
        "ok src=8.8.8.8:53 rcode=0 an=1 ede=",
        "{r:?}"
    );
    // TTL 1 s + grace 1 s later the address is refused again, until the name is asked again.
    assert_eq!(got("connect-expired"), "err EPERM", "{r:?}");
    assert_eq!(got("connect-again"), "ok", "{r:?}");

    // QUIC/HTTP3 refused unless declared: a name grant is TCP only; udp:// is UDP only.
    assert_eq!(got("udp-www"), "err EPERM", "{r:?}");
    assert_eq!(got("udp-quic"), "ok pong", "{r:?}");
    assert_eq!(got("tcp-quic"), "err EPERM", "{r:?}");
    // v4-mapped IPv6: the answered address on its granted port only; IPv6 never answered: no.
    assert_eq!(got("mapped-www"), "ok", "{r:?}");
    assert_eq!(got("mapped-wrong-port"), "err EPERM", "{r:?}");
    assert_eq!(got("mapped-neighbour"), "err EPERM", "{r:?}");
    assert_eq!(got("v6-unanswered"), "err EPERM", "{r:?}");
    // A relay the contract does not name is unreachable; named, it is the contract's choice.
    assert_eq!(got("relay-direct"), "err EPERM", "{r:?}");
    assert_eq!(
        got("relay-named"),
        "ok HTTP/1.1 200 Connection established",
        "{r:?}"
    );
    // DoT and DoH to a resolver no granted name resolved to (listening there). On ports no
    // grant names, Landlock's TCP rules refuse first (EACCES) where the kernel has them, else
    // cgroup BPF (EPERM); on the port the names are granted, cgroup BPF refuses.
    for port in ["dot", "doh"] {
        let v = got(port);
        assert!(v == "err EACCES" || v == "err EPERM", "{port}: {r:?}");
    }
    assert_eq!(got("doh-granted-port"), "err EPERM", "{r:?}");
    // Tunnelling by long names: over 253 bytes (labels of 60) is REFUSED, nothing forwarded.
    assert_eq!(
        got("raw-long-name"),
        "ok src=8.8.8.8:53 rcode=5 an=0 ede=",
        "{r:?}"
    );

    // The upstream saw only A questions for granted names; the other resolver saw nothing.
    let seen = upstream_log.lock().unwrap().clone();
    assert!(!seen.is_empty());
    for q in &seen {
        assert!(
            [
                "www.example.test 1",
                "named.other.test 1",
                "rebind.example.test 1",
                "quic.other.test 1",
                "relay.example.test 1"
            ]
            .contains(&q.as_str()),
            "the upstream was asked {q:?}: {seen:?}"
        );
    }
    assert!(
        other_log.lock().unwrap().is_empty(),
        "{:?}",
        other_log.lock().unwrap()
    );

    // Each refused name is an audit record.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let o = Command::new(common::agentctl_bin())
            .args(["audit", "show", "--json", "--agent", "names", "--state-dir"])
            .arg(&state)
            .output()
            .unwrap();
        let all: Vec<serde_json::Value> = String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        let recs: Vec<&serde_json::Value> = all
            .iter()
            .filter(|r| r["detail"]["mechanism"] == "dns-stub")
            .collect();
        // Kernel refusals name the name the stub answered the address for, expired or not.
        let kernel = |syscall: &str, addr: &str, port: u16| {
            all.iter()
                .find(|r| {
                    r["detail"]["syscall"] == syscall
                        && r["detail"]["addr"] == addr
                        && r["detail"]["port"] == port
                        && r["detail"]["errno"] == "EPERM"
                })
                .map(|r| r["detail"]["name"].clone())
        };
        let named = [
            kernel("connect", SERVER, p1),
            kernel("sendmsg", SERVER, p1),
            kernel("connect", SERVER, p2),
            kernel("connect", NEIGHBOUR, p1),
            kernel("connect", RELAY, p1),
        ];
        let has = |name: &str, reason: &str| {
            recs.iter()
                .any(|r| r["detail"]["name"] == name && r["detail"]["reason"] == reason)
        };
        if has("secret.attacker.test", "not-granted")
            && has("leak.attacker.test", "not-granted")
            && has("", "too-long")
            && named.iter().all(Option::is_some)
        {
            let www = serde_json::json!("www.example.test");
            // The expired answer's connect, the UDP send (TCP-only grant), the wrong port.
            assert_eq!(named[0].as_ref(), Some(&www), "{named:?}");
            assert_eq!(named[1].as_ref(), Some(&www), "{named:?}");
            assert_eq!(named[2].as_ref(), Some(&www), "{named:?}");
            // Never answered (the relay was refused before its name was asked): no name.
            assert_eq!(named[3], Some(serde_json::Value::Null), "{named:?}");
            assert_eq!(named[4], Some(serde_json::Value::Null), "{named:?}");
            let r = recs
                .iter()
                .find(|r| r["detail"]["name"] == "leak.attacker.test")
                .unwrap();
            assert_eq!(r["decision"], "deny", "{r}");
            assert_eq!(r["detail"]["contract"], "names", "{r}");
            assert_eq!(r["detail"]["qtype"], 1, "{r}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "refusals not in the audit trail: {recs:#?}\n{named:?}\n{o:?}\ndaemon log:\n{}",
            d.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(d);
}
