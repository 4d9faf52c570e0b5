//! Egress by name, the rest of the corpus (tests/dns.rs has the first slices):
//!
//! - **TCP fallback**: a name whose answer does not fit one datagram (the fake upstream sets TC
//!   over UDP and gives all 60 addresses over TCP) resolves whole: the stub asks the upstream
//!   again over TCP, answers the agent's UDP query with TC (the answer is over 512 bytes, or
//!   over the size the query advertised), and the agent's resolver asks the stub again over
//!   TCP. An address of a TC answer is not reachable until an answer carrying it was given.
//! - **Rebinding to private ranges**: answers lose 10/8, 172.16/12, 192.168/16, 100.64/10 and
//!   fc00::/7, also in their v4-mapped, NAT64 and 6to4 forms, at once or later (a name
//!   answering a public address first and a private one next time); a prefix the operator
//!   allows (`--dns-allow-private 10.99.0.0/16`) passes, and so does one the contract reaches
//!   already by a static grant on the name's ports (`10.50.0.0/16:P`). Each stripped address
//!   is a `denial` record (`effect: STRIPPED`, `reason: private-address`, the name, the
//!   address).
//! - **`udp://ADDR:PORT`**: UDP only to that address (TCP `EPERM`); a plain `ADDR:PORT` grant
//!   keeps both.
//! - **Tool cgroups**: a tool granted `*.example.test:P` and `udp://quic.other.test:P` (met
//!   with its caller's grants) resolves through a stub of its own: the name's address over TCP,
//!   not UDP; the udp:// name over UDP; an ungranted name NXDOMAIN.
//! - **IPv6-only sockets**: a query sent from an `IPV6_V6ONLY` socket to an IPv6 resolver is
//!   answered by the stub on `::1` (where the host has it).
//!
//! Everything runs in a network namespace this test makes (198.18.0.x and 10.x addresses on its
//! loopback), as tests/dns.rs. Root only; skips when the BPF programs cannot load.

#![allow(clippy::unwrap_used)]

mod common;

use std::io::{Read as _, Write as _};
use std::net::{Ipv4Addr, TcpListener, UdpSocket};
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::netns::{self, accept_all, results, udp_echo};
use common::{Bus, Daemon, TestCgroup};

const UPSTREAM: &str = "198.18.0.53";
/// The last of big.example.test's 60 addresses (198.18.1.1-60), given only over TCP.
const BIG_LAST: &str = "198.18.1.60";
const INTERNAL: &str = "10.99.0.5";
/// lan.example.test's address, inside the contract's static grant `10.50.0.0/16:P`.
const LAN: &str = "10.50.0.7";
const PRIVATE: &str = "10.1.2.3";
const PUBLIC: &str = "198.18.0.31";
const FLIP: &str = "198.18.0.30";
const UDP_ONLY: &str = "198.18.0.40";
const BOTH: &str = "198.18.0.41";
/// www.example.test's address (the tool test's TCP server).
const WWW: &str = "198.18.0.10";

/// The agent, after [`netns::PY_ATTEMPTS`].
const SCRIPT: &str = r#"
p1 = int(sys.argv[1])
def resolve_all(host):
    return sorted({a[4][0] for a in socket.getaddrinfo(host, 80, socket.AF_INET, socket.SOCK_STREAM)})
def query(name, qtype, edns):
    q = struct.pack(">HHHHHH", 0x4242, 0x0100, 1, 0, 0, 1 if edns else 0)
    for l in name.split("."):
        q += bytes([len(l)]) + l.encode()
    q += b"\0" + struct.pack(">HH", qtype, 1)
    if edns:
        q += b"\0" + struct.pack(">HHIH", 41, edns, 0, 0)
    return q
def summary(data):
    return "rcode=%d tc=%d an=%d" % (data[3] & 0xf, (data[2] >> 1) & 1, struct.unpack(">H", data[6:8])[0])
def raw(server, name, qtype, edns=0):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(5)
    s.sendto(query(name, qtype, edns), (server, 53))
    data = s.recvfrom(65535)[0]
    s.close()
    return summary(data)
def raw_tcp(server, name, qtype):
    s = socket.create_connection((server, 53), timeout=5)
    q = query(name, qtype, 0)
    s.sendall(struct.pack(">H", len(q)) + q)
    n = b""
    while len(n) < 2:
        n += s.recv(2 - len(n))
    n = struct.unpack(">H", n)[0]
    data = b""
    while len(data) < n:
        data += s.recv(n - len(data))
    s.close()
    return summary(data)
def raw6only(server, name):
    s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    s.settimeout(5)
    s.sendto(query(name, 1, 1232), (server, 53))
    data, src = s.recvfrom(4096)
    s.close()
    return "src=%s %s" % (src[0], summary(data))
attempt("raw-big-udp", lambda: raw("8.8.8.8", "big.example.test", 1))
attempt("raw-big-edns", lambda: raw("8.8.8.8", "big.example.test", 1, 4096))
attempt("connect-big-before", lambda: tcp("198.18.1.60", p1))
attempt("resolve-big", lambda: len(resolve_all("big.example.test")))
attempt("connect-big", lambda: tcp("198.18.1.60", p1))
attempt("raw-big-tcp", lambda: raw_tcp("8.8.8.8", "big.example.test", 1))
attempt("resolve-internal", lambda: " ".join(resolve_all("internal.example.test")))
attempt("connect-internal", lambda: tcp("10.99.0.5", p1))
attempt("resolve-lan", lambda: " ".join(resolve_all("lan.example.test")))
attempt("resolve-private", lambda: " ".join(resolve_all("private.example.test")))
attempt("connect-private", lambda: tcp("10.1.2.3", p1))
attempt("raw-private-aaaa", lambda: raw("8.8.8.8", "private.example.test", 28, 1232))
attempt("resolve-flip", lambda: " ".join(resolve_all("flip.example.test")))
attempt("connect-flip", lambda: tcp("198.18.0.30", p1))
attempt("raw-flip-again", lambda: raw("8.8.8.8", "flip.example.test", 1, 1232))
attempt("connect-flip-private", lambda: tcp("10.1.2.3", p1))
attempt("udp-udp-only", lambda: udp("198.18.0.40", p1))
attempt("tcp-udp-only", lambda: tcp("198.18.0.40", p1))
attempt("udp-both", lambda: udp("198.18.0.41", p1))
attempt("tcp-both", lambda: tcp("198.18.0.41", p1))
attempt("v6only-dns", lambda: raw6only("2001:db8::53", "www.example.test"))
out("done")
"#;

/// A question of a query: (name in lower case, type, end of the question).
fn question(q: &[u8]) -> Option<(String, u16, usize)> {
    let mut i = 12;
    let mut labels = Vec::new();
    while *q.get(i)? != 0 {
        let l = q[i] as usize;
        labels.push(String::from_utf8_lossy(q.get(i + 1..i + 1 + l)?).to_lowercase());
        i += 1 + l;
    }
    let qtype = u16::from_be_bytes([*q.get(i + 1)?, *q.get(i + 2)?]);
    Some((labels.join("."), qtype, i + 5))
}

/// The fake upstream's answer to `q` (`tcp`: asked over TCP). big.example.test has 60
/// addresses: over UDP only the first, with TC set. flip.example.test is public the first
/// time, private after.
fn answer(q: &[u8], tcp: bool, flips: &AtomicU32) -> Option<Vec<u8>> {
    let (name, qtype, qend) = question(q)?;
    let a = |s: &str| -> Vec<u8> { s.parse::<Ipv4Addr>().unwrap().octets().to_vec() };
    let aaaa = |s: &str| -> Vec<u8> { s.parse::<std::net::Ipv6Addr>().unwrap().octets().to_vec() };
    let mut tc = false;
    let records: Vec<Vec<u8>> = match (name.as_str(), qtype) {
        ("big.example.test", 1) => {
            let all: Vec<Vec<u8>> = (1..=60).map(|i| vec![198, 18, 1, i]).collect();
            if tcp {
                all
            } else {
                tc = true;
                all[..1].to_vec()
            }
        }
        ("internal.example.test", 1) => vec![a(INTERNAL)],
        ("lan.example.test", 1) => vec![a(LAN)],
        ("private.example.test", 1) => ["10.1.2.3", "192.168.7.7", "172.16.0.1", "100.64.0.1"]
            .iter()
            .map(|s| a(s))
            .chain([a(PUBLIC)])
            .collect(),
        ("private.example.test", 28) => [
            "fd00::1",
            "::ffff:10.1.2.3",
            "64:ff9b::a01:203",
            "2002:a01:203::1",
            "2001:db8::5",
        ]
        .iter()
        .map(|s| aaaa(s))
        .collect(),
        ("flip.example.test", 1) => {
            if flips.fetch_add(1, Ordering::SeqCst) == 0 {
                vec![a(FLIP)]
            } else {
                vec![a(PRIVATE)]
            }
        }
        ("www.example.test", 1) => vec![a(WWW)],
        ("quic.other.test", 1) => vec![a(UDP_ONLY)],
        _ => Vec::new(),
    };
    let mut r = q[..2].to_vec();
    r.extend_from_slice(&[0x81 | if tc { 0x02 } else { 0 }, 0x80, 0, 1]);
    r.extend_from_slice(&(records.len() as u16).to_be_bytes());
    r.extend_from_slice(&[0, 0, 0, 0]);
    r.extend_from_slice(&q[12..qend]);
    for d in records {
        let t: u16 = if d.len() == 4 { 1 } else { 28 };
        r.extend_from_slice(&[0xc0, 12]);
        r.extend_from_slice(&t.to_be_bytes());
        r.extend_from_slice(&[0, 1, 0, 0, 0, 30]);
        r.extend_from_slice(&(d.len() as u16).to_be_bytes());
        r.extend_from_slice(&d);
    }
    Some(r)
}

fn fake_upstream_udp(sock: UdpSocket, log: Arc<Mutex<Vec<String>>>, flips: Arc<AtomicU32>) {
    let mut buf = [0u8; 1500];
    while let Ok((n, peer)) = sock.recv_from(&mut buf) {
        if let Some((name, t, _)) = question(&buf[..n]) {
            log.lock().unwrap().push(format!("udp {name} {t}"));
        }
        if let Some(r) = answer(&buf[..n], false, &flips) {
            let _ = sock.send_to(&r, peer);
        }
    }
}

fn fake_upstream_tcp(l: TcpListener, log: Arc<Mutex<Vec<String>>>, flips: Arc<AtomicU32>) {
    for c in l.incoming() {
        let Ok(mut c) = c else { continue };
        let mut len = [0u8; 2];
        if c.read_exact(&mut len).is_err() {
            continue;
        }
        let mut q = vec![0u8; u16::from_be_bytes(len) as usize];
        if c.read_exact(&mut q).is_err() {
            continue;
        }
        if let Some((name, t, _)) = question(&q) {
            log.lock().unwrap().push(format!("tcp {name} {t}"));
        }
        if let Some(r) = answer(&q, true, &flips) {
            let mut out = (r.len() as u16).to_be_bytes().to_vec();
            out.extend_from_slice(&r);
            let _ = c.write_all(&out);
        }
    }
}

#[test]
fn truncation_private_ranges_udp_addresses_and_v6_only_sockets() {
    skip_unless_capable!();
    if !netns::net_bpf_and_python("dns_rest") {
        return;
    }
    std::thread::spawn(in_netns).join().unwrap();
}

fn in_netns() {
    netns::enter(&[
        UPSTREAM, BIG_LAST, INTERNAL, PRIVATE, PUBLIC, FLIP, UDP_ONLY, BOTH,
    ]);
    let log = Arc::new(Mutex::new(Vec::new()));
    let flips = Arc::new(AtomicU32::new(0));
    let (l, f) = (log.clone(), flips.clone());
    let up = UdpSocket::bind((UPSTREAM, 53)).unwrap();
    std::thread::spawn(move || fake_upstream_udp(up, l, f));
    let (l, f) = (log.clone(), flips.clone());
    let up = TcpListener::bind((UPSTREAM, 53)).unwrap();
    std::thread::spawn(move || fake_upstream_tcp(up, l, f));
    let s = TcpListener::bind((BIG_LAST, 0)).unwrap();
    let p1 = s.local_addr().unwrap().port();
    accept_all(s);
    for a in [INTERNAL, PRIVATE, FLIP, UDP_ONLY, BOTH] {
        let l = TcpListener::bind((a, p1)).unwrap();
        accept_all(l);
    }
    for a in [UDP_ONLY, BOTH] {
        let u = UdpSocket::bind((a, p1)).unwrap();
        udp_echo(u);
    }

    let bus = Bus::start();
    let cg = TestCgroup::new("dnsrest");
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let state = dir.path().join("state");
    let up_arg = format!("{UPSTREAM}:53");
    let d = Daemon::start_with(
        &bus,
        &cg.path,
        &state,
        &[
            "--bpf-pin-dir",
            "none",
            "--dns-upstream",
            &up_arg,
            "--dns-allow-private",
            "10.99.0.0/16",
        ],
    );
    let scripts = dir.path().join("scripts");
    std::fs::create_dir(&scripts).unwrap();
    std::fs::set_permissions(&scripts, std::fs::Permissions::from_mode(0o755)).unwrap();
    let script = scripts.join("dns_rest.py");
    std::fs::write(&script, format!("{}{SCRIPT}", netns::PY_ATTEMPTS)).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
    let text = format!(
        "apiVersion: agentos/v0.2\nkind: AgentContract\nname: rest\ntenant: dns\nexec: {{ command: /usr/bin/python3, args: [{:?}, \"{p1}\"] }}\ncapabilities:\n  - fs.read: [{:?}]\n  - net.connect: [\"*.example.test:{p1}\", \"udp://{UDP_ONLY}:{p1}\", \"{BOTH}:{p1}\", \"10.50.0.0/16:{p1}\"]\nrestart: \"no\"\n",
        script.display().to_string(),
        scripts.display().to_string(),
    );
    let contract = dir.path().join("rest.yaml");
    std::fs::write(&contract, text).unwrap();
    d.ctl_ok(&["start", contract.to_str().unwrap()]);
    let st = d.wait_state("dns/rest", "running", 20);
    let notes = st["notes"].to_string();
    assert!(
        notes.contains(&format!("udp://{UDP_ONLY}:{p1}, {BOTH}:{p1}")),
        "{notes}"
    );
    let r = results(Path::new(st["log_path"].as_str().unwrap()));
    let got = |n: &str| {
        r.iter()
            .find(|(k, _)| k == n)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("no result for {n}: {r:?}"))
    };

    // TCP fallback: the stub's UDP answer is TC (no EDNS: over 512; EDNS 4096: over the
    // stub's 1232), and nothing of it is learnt; the resolver's TCP retry gets all 60.
    assert_eq!(got("raw-big-udp"), "ok rcode=0 tc=1 an=0", "{r:?}");
    assert_eq!(got("raw-big-edns"), "ok rcode=0 tc=1 an=0", "{r:?}");
    assert_eq!(got("connect-big-before"), "err EPERM", "{r:?}");
    assert_eq!(got("resolve-big"), "ok 60", "{r:?}");
    assert_eq!(got("connect-big"), "ok", "{r:?}");
    assert_eq!(got("raw-big-tcp"), "ok rcode=0 tc=0 an=60", "{r:?}");
    let seen = log.lock().unwrap().clone();
    assert!(
        seen.iter().any(|q| q == "tcp big.example.test 1"),
        "the stub never asked the upstream over TCP: {seen:?}"
    );

    // Private ranges: stripped unless the operator allowed them, in every form, and later.
    assert_eq!(got("resolve-internal"), format!("ok {INTERNAL}"), "{r:?}");
    assert_eq!(got("connect-internal"), "ok", "{r:?}");
    // The contract's own static grant of 10.50.0.0/16 on the name's port lets 10.50.0.7 through.
    assert_eq!(got("resolve-lan"), format!("ok {LAN}"), "{r:?}");
    assert_eq!(got("resolve-private"), format!("ok {PUBLIC}"), "{r:?}");
    assert_eq!(got("connect-private"), "err EPERM", "{r:?}");
    assert_eq!(got("raw-private-aaaa"), "ok rcode=0 tc=0 an=1", "{r:?}");
    assert_eq!(got("resolve-flip"), format!("ok {FLIP}"), "{r:?}");
    assert_eq!(got("connect-flip"), "ok", "{r:?}");
    assert_eq!(got("raw-flip-again"), "ok rcode=0 tc=0 an=0", "{r:?}");
    assert_eq!(got("connect-flip-private"), "err EPERM", "{r:?}");

    // udp://ADDR:PORT is UDP only; ADDR:PORT stays TCP and UDP.
    assert_eq!(got("udp-udp-only"), "ok pong", "{r:?}");
    assert_eq!(got("tcp-udp-only"), "err EPERM", "{r:?}");
    assert_eq!(got("udp-both"), "ok pong", "{r:?}");
    assert_eq!(got("tcp-both"), "ok", "{r:?}");

    // Each stripped address is an audit record naming the name, the address and the contract.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let o = Command::new(common::agentctl_bin())
            .args(["audit", "show", "--json", "--agent", "rest", "--state-dir"])
            .arg(&state)
            .output()
            .unwrap();
        let stripped: Vec<(String, String, String)> = String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|r| r["detail"]["effect"] == "STRIPPED" && r["detail"]["contract"] == "rest")
            .map(|r| {
                let d = &r["detail"];
                let s = |k: &str| d[k].as_str().unwrap_or_default().to_string();
                (s("name"), s("addr"), s("reason"))
            })
            .collect();
        let has = |n: &str, a: &str| {
            stripped
                .iter()
                .any(|(nn, aa, why)| nn == n && aa == a && why == "private-address")
        };
        if has("private.example.test", PRIVATE)
            && has("private.example.test", "192.168.7.7")
            && has("private.example.test", "64:ff9b::a01:203")
            && has("flip.example.test", PRIVATE)
        {
            assert!(
                !stripped
                    .iter()
                    .any(|(_, a, _)| a == INTERNAL || a == PUBLIC),
                "{stripped:?}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "stripped addresses not in the audit trail: {stripped:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // An IPV6_V6ONLY socket's query to an IPv6 resolver: answered by the stub on [::1], as
    // from the address asked (where the namespace has ::1: this kernel may have no IPv6).
    if UdpSocket::bind("[::1]:0").is_ok() {
        assert!(notes.contains(", [::1]:"), "{notes}");
        assert_eq!(
            got("v6only-dns"),
            "ok src=2001:db8::53 rcode=0 tc=0 an=1",
            "{r:?}"
        );
    } else {
        common::skip(
            "dns_rest v6only",
            &format!("the stub has no [::1]: {notes}"),
        );
    }
    drop(d);
}

const TOOL_PROBE: &str = r#"import json, socket, sys
p = int(sys.argv[1])
out = {}
def attempt(name, f):
    try:
        r = f()
        out[name] = "ok" + ("" if r is None else " " + str(r))
    except socket.gaierror as e:
        out[name] = "gaierror %d" % e.args[0]
    except OSError as e:
        out[name] = "err %d" % e.errno
def resolve(h):
    return socket.getaddrinfo(h, 80, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
def udp(a):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(3)
    try:
        s.sendto(b"ping", (a, p))
        return s.recvfrom(100)[0].decode()
    finally:
        s.close()
attempt("resolve-www", lambda: resolve("www.example.test"))
attempt("tcp-www", lambda: socket.create_connection((resolve("www.example.test"), p), timeout=3).close())
attempt("udp-www", lambda: udp(resolve("www.example.test")))
attempt("udp-quic", lambda: udp(resolve("quic.other.test")))
attempt("tcp-quic", lambda: socket.create_connection((resolve("quic.other.test"), p), timeout=3).close())
attempt("resolve-evil", lambda: resolve("secret.attacker.test"))
print(json.dumps(out))
"#;

#[test]
fn a_tools_names_go_through_a_stub_of_its_own() {
    skip_unless_capable!();
    if !netns::net_bpf_and_python("dns_rest") {
        return;
    }
    std::thread::spawn(tool_in_netns).join().unwrap();
}

fn tool_in_netns() {
    netns::enter(&[UPSTREAM, WWW, UDP_ONLY]);
    let log = Arc::new(Mutex::new(Vec::new()));
    let flips = Arc::new(AtomicU32::new(0));
    let (l, f) = (log.clone(), flips.clone());
    let up = UdpSocket::bind((UPSTREAM, 53)).unwrap();
    std::thread::spawn(move || fake_upstream_udp(up, l, f));
    let s = TcpListener::bind((WWW, 0)).unwrap();
    let p = s.local_addr().unwrap().port();
    accept_all(s);
    let q = TcpListener::bind((UDP_ONLY, p)).unwrap();
    accept_all(q);
    for a in [WWW, UDP_ONLY] {
        let u = UdpSocket::bind((a, p)).unwrap();
        udp_echo(u);
    }

    let bus = Bus::start();
    let cg = TestCgroup::new("dnstool");
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let tools = dir.path().join("tools.d");
    std::fs::create_dir(&tools).unwrap();
    let grants = format!("[\"*.example.test:{p}\", \"udp://quic.other.test:{p}\"]");
    std::fs::write(
        tools.join("dns-probe.yaml"),
        format!(
            "apiVersion: agentos/v0.2\nkind: Tool\nname: dns.probe\n\
             description: names through the stub (dns_rest test).\nrisk: low\ntimeout_ms: 30000\n\
             exec:\n  command: /usr/bin/python3\n  args: [\"-c\", {}, \"{p}\"]\n\
             input_schema: {{type: object}}\nsandbox:\n  net.connect: {grants}\n",
            serde_json::to_string(TOOL_PROBE).unwrap()
        ),
    )
    .unwrap();
    let up_arg = format!("{UPSTREAM}:53");
    let d = Daemon::start_with(
        &bus,
        &cg.path,
        dir.path(),
        &[
            "--bpf-pin-dir",
            "none",
            "--dns-upstream",
            &up_arg,
            "--tools-dir",
            tools.to_str().unwrap(),
        ],
    );
    let (exec, bin_dir) = common::bridge_call_exec("dns.probe");
    let c = common::contract(
        dir.path(),
        "tooluser",
        &exec,
        &format!(
            "restart: {{ policy: \"no\" }}\ncapabilities:\n  - dns.probe\n  - net.connect: {grants}\n\
             \x20 - fs.read: [\"{bin_dir}\"]\n  - fs.exec: [/usr, /bin, /lib, \"{bin_dir}\"]\n"
        ),
    );
    d.ctl_ok(&["start", c.to_str().unwrap()]);
    let log_path = dir.path().join("logs/default/tooluser.log");
    let deadline = Instant::now() + Duration::from_secs(60);
    let text = loop {
        let t = std::fs::read_to_string(&log_path).unwrap_or_default();
        if t.contains("bridge-exit=") {
            break t;
        }
        assert!(
            Instant::now() < deadline,
            "the tool call did not finish: {t}\ndaemon log:\n{}",
            d.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let reply: serde_json::Value = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["id"] == 2)
        .unwrap_or_else(|| panic!("no reply in {text}"));
    let out = &reply["result"]["structuredContent"];
    let eperm = format!("err {}", libc::EPERM);
    assert_eq!(out["resolve-www"], format!("ok {WWW}"), "{reply}");
    assert_eq!(out["tcp-www"], "ok", "{reply}");
    assert_eq!(out["udp-www"], eperm.as_str(), "{reply}");
    assert_eq!(out["udp-quic"], "ok pong", "{reply}");
    assert_eq!(out["tcp-quic"], eperm.as_str(), "{reply}");
    assert_eq!(out["resolve-evil"], "gaierror -2", "{reply}");
    let seen = log.lock().unwrap().clone();
    assert!(
        !seen.iter().any(|q| q.contains("attacker")),
        "the upstream was asked {seen:?}"
    );
    drop(d);
}
