//! SNI/Host checks against domain fronting (issue 20): an agent granted `https://NAME`,
//! `https://*.cdn.test` and `http://plain.example.test` (default ports 443 and 80) reaches those names' addresses
//! only through the daemon's SNI/Host proxy, which lets a connection on when its TLS SNI (or
//! HTTP Host) is a name the grant matches and the address was answered for that name:
//! a matching SNI connects and the TLS exchange completes (also with the ClientHello written
//! in 7-byte segments, and from an IPv6 socket to the v4-mapped address), `getpeername` shows
//! the real destination; a fronted SNI (an ungranted name on a granted name's address), a
//! granted SNI on an address answered for another name, no SNI, non-TLS bytes, a connection
//! that never writes, a Host mismatch, HTTP/2 prior knowledge are reset and recorded
//! (`mechanism: sni-proxy`, the name seen, the grants, the contract); a keep-alive connection's
//! second request (another Host) never reaches the server; a plain `NAME:PORT` grant is
//! unchanged (no check: any SNI passes); past 256 connections of the agent at once the proxy
//! resets the rest (`too-many`).
//!
//! Everything runs in a network namespace this test makes (198.18.0.x on its loopback), with a
//! fake upstream resolver and Python TLS/HTTP servers in it. Root only; skips when the BPF
//! programs cannot load or python3/openssl are missing.

#![allow(clippy::unwrap_used)]

mod common;

use std::io::{BufRead as _, BufReader};
use std::net::{SocketAddr, UdpSocket};
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::netns::{self, results};
use common::{Bus, Daemon, TestCgroup};

/// api.example.test and www.cdn.test (one CDN address, two names).
const CDN: &str = "198.18.0.10";
/// other.example.test.
const OTHER: &str = "198.18.0.11";
/// plain.example.test (HTTP).
const PLAIN: &str = "198.18.0.12";
/// open.other.test (a plain NAME:PORT grant).
const OPEN: &str = "198.18.0.13";
const UPSTREAM: &str = "198.18.0.53";

const AGENT: &str = r#"
import socket, ssl, sys, time
pt, ph = int(sys.argv[1]), int(sys.argv[2])
def out(*a):
    print(*a, flush=True)
def attempt(name, f):
    try:
        r = f()
        out(name, "ok", r if r is not None else "")
    except (ConnectionResetError, ssl.SSLEOFError, ssl.SSLZeroReturnError, BrokenPipeError):
        out(name, "reset")
    except ssl.SSLError as e:
        out(name, "sslerror", e.reason)
    except OSError as e:
        out(name, "err", e.errno)
def resolve(host):
    return socket.getaddrinfo(host, 80, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
def tls(addr, port, sni, split=False, family=socket.AF_INET, peer=False):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(10)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.connect((addr, port))
    inc, outb = ssl.MemoryBIO(), ssl.MemoryBIO()
    o = ctx.wrap_bio(inc, outb, server_hostname=sni)
    first = True
    def flush():
        nonlocal first
        data = outb.read()
        if first and split:
            # 7-byte pieces, each its own segment: the SNI name (16 bytes) always spans two or
            # more. (One byte at a time took over the proxy's 5 s for a ClientHello in an
            # emulated guest sharing the host with another.)
            for i in range(0, len(data), 7):
                s.sendall(data[i:i+7])
                time.sleep(0.002)
        else:
            s.sendall(data)
        if data:
            first = False
    while True:
        try:
            o.do_handshake()
            flush()
            break
        except ssl.SSLWantReadError:
            flush()
            d = s.recv(65536)
            if not d:
                raise ConnectionResetError()
            inc.write(d)
    o.write(b"hi\n")
    flush()
    got = b""
    while not got.endswith(b"\n"):
        try:
            got += o.read(1024)
        except ssl.SSLWantReadError:
            d = s.recv(65536)
            if not d:
                break
            inc.write(d)
    p = s.getpeername()
    s.close()
    r = got.decode().strip()
    return r + (" peer=%s:%d" % (p[0], p[1]) if peer else "")
def raw(addr, port, data, wait=10):
    s = socket.create_connection((addr, port), timeout=wait)
    try:
        if data:
            s.sendall(data)
        got = b""
        while True:
            d = s.recv(65536)
            if not d:
                return got.decode(errors="replace").replace("\r\n", "|")
            got += d
    finally:
        s.close()
api = resolve("api.example.test")
cdn = resolve("www.cdn.test")
other = resolve("other.example.test")
plain = resolve("plain.example.test")
opn = resolve("open.other.test")
out("addrs", api, cdn, other, plain, opn)
attempt("tls-ok", lambda: tls(api, pt, "api.example.test", peer=True))
attempt("tls-split", lambda: tls(api, pt, "api.example.test", split=True))
attempt("tls-cdn", lambda: tls(cdn, pt, "www.cdn.test"))
attempt("tls-mapped", lambda: tls("::ffff:" + api, pt, "api.example.test", family=socket.AF_INET6))
attempt("tls-fronted", lambda: tls(api, pt, "evil.attacker.test"))
attempt("tls-other-address", lambda: tls(other, pt, "api.example.test"))
attempt("tls-other-ok", lambda: tls(other, pt, "other.example.test"))
attempt("tls-no-sni", lambda: tls(api, pt, None))
attempt("not-tls", lambda: raw(api, pt, b"GET / HTTP/1.1\r\nHost: api.example.test\r\n\r\n"))
attempt("silent", lambda: raw(api, pt, b""))
attempt("wrong-port", lambda: raw(api, ph, b"x"))
attempt("http-ok", lambda: raw(plain, ph, b"GET /a HTTP/1.1\r\nHost: plain.example.test\r\n\r\n"))
attempt("http-keepalive", lambda: raw(plain, ph, b"GET /b HTTP/1.1\r\nHost: plain.example.test\r\nConnection: keep-alive\r\n\r\nGET /c HTTP/1.1\r\nHost: evil.attacker.test\r\n\r\n"))
attempt("http-bad-host", lambda: raw(plain, ph, b"GET /d HTTP/1.1\r\nHost: evil.attacker.test\r\n\r\n"))
attempt("http2-prior", lambda: raw(plain, ph, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"))
attempt("plain-grant", lambda: tls(opn, pt, "anything.attacker.test"))
def cap():
    # The proxy may reset a connection over the cap before connect() has read its result
    # (loopback finishes the handshake and the reset in one go): that is a reset too.
    socks = []
    reset = held = 0
    t0 = time.monotonic()
    for _ in range(260):
        try:
            socks.append(socket.create_connection((api, pt), timeout=5))
        except ConnectionResetError:
            reset += 1
    time.sleep(1)
    took = time.monotonic() - t0
    for s in socks:
        s.setblocking(False)
        try:
            s.recv(1)
            reset += 1
        except BlockingIOError:
            held += 1
        except ConnectionResetError:
            reset += 1
    for s in socks:
        s.close()
    return "%d %d %.1f" % (reset, held, took)
attempt("cap", cap)
out("done")
"#;

const SERVERS: &str = r#"
import socket, ssl, sys, threading
cert, key, log = sys.argv[1], sys.argv[2], sys.argv[3]
pt, ph = int(sys.argv[4]), int(sys.argv[5])
tls_addrs = sys.argv[6].split(","); http_addr = sys.argv[7]
lock = threading.Lock()
def note(*a):
    with lock:
        with open(log, "a") as f:
            f.write(" ".join(str(x) for x in a) + "\n")
def tls_serve(addr):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    seen = {}
    def cb(sock, name, c):
        seen[id(sock)] = name
    ctx.sni_callback = cb
    l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind((addr, pt)); l.listen(64)
    def one(c):
        try:
            t = ctx.wrap_socket(c, server_side=True)
            line = t.recv(100).decode().strip()
            sni = seen.get(id(t.sslobj if hasattr(t, "sslobj") else t), None)
            sni = t.server_hostname if hasattr(t, "server_hostname") and t.server_hostname else sni
            note("tls", addr, line)
            t.sendall(("echo:%s:%s\n" % (addr, line)).encode())
            t.close()
        except Exception as e:
            note("tls-error", addr, type(e).__name__)
    while True:
        c, _ = l.accept()
        threading.Thread(target=one, args=(c,), daemon=True).start()
def http_serve(addr):
    l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind((addr, ph)); l.listen(64)
    def one(c):
        buf = b""
        while True:
            while b"\r\n\r\n" not in buf:
                d = c.recv(4096)
                if not d:
                    c.close(); return
                buf += d
            head, buf = buf.split(b"\r\n\r\n", 1)
            lines = head.decode().split("\r\n")
            hdrs = [l.split(":", 1) for l in lines[1:]]
            host = [v.strip() for k, v in hdrs if k.lower() == "host"]
            conn = ",".join(v.strip().lower() for k, v in hdrs if k.lower() == "connection")
            note("http", lines[0].split()[1], host[0] if host else "-")
            body = ("host=%s" % (host[0] if host else "-")).encode()
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            if "close" in conn.split(","):
                c.close(); return
    while True:
        c, _ = l.accept()
        threading.Thread(target=one, args=(c,), daemon=True).start()
for a in tls_addrs:
    threading.Thread(target=tls_serve, args=(a,), daemon=True).start()
threading.Thread(target=http_serve, args=(http_addr,), daemon=True).start()
import time
time.sleep(0.3)
print("ready", flush=True)
time.sleep(3600)
"#;

/// A fake recursive resolver on UPSTREAM:53 (A records, TTL 60 s; NXDOMAIN for the rest).
fn fake_upstream(sock: UdpSocket) {
    let table: &[(&str, [u8; 4])] = &[
        ("api.example.test", [198, 18, 0, 10]),
        ("www.cdn.test", [198, 18, 0, 10]),
        ("other.example.test", [198, 18, 0, 11]),
        ("plain.example.test", [198, 18, 0, 12]),
        ("open.other.test", [198, 18, 0, 13]),
    ];
    let mut buf = [0u8; 1500];
    while let Ok((n, peer)) = sock.recv_from(&mut buf) {
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
        let addr = table.iter().find(|(t, _)| *t == name).map(|(_, a)| *a);
        let mut r = q[..2].to_vec();
        let rcode = if addr.is_some() { 0 } else { 3 };
        let an = u16::from(addr.is_some() && qtype == 1);
        r.extend_from_slice(&[0x81, 0x80 | rcode, 0, 1]);
        r.extend_from_slice(&an.to_be_bytes());
        r.extend_from_slice(&[0, 0, 0, 0]);
        r.extend_from_slice(&q[12..i + 5]);
        if an == 1 {
            r.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4]);
            r.extend_from_slice(&addr.unwrap());
        }
        let _ = sock.send_to(&r, peer);
    }
}

#[test]
fn checked_grants_let_only_the_granted_names_through_the_proxy() {
    skip_unless_capable!();
    if let Err(e) = agentosd::enforce::net::probe_load() {
        common::skip(
            "sni",
            &format!("the cgroup BPF programs cannot load here: {e}"),
        );
        return;
    }
    for bin in ["/usr/bin/python3", "/usr/bin/openssl"] {
        if !Path::new(bin).exists() {
            common::skip(
                "sni",
                &format!("{bin} is needed (agent, servers, test certificate)"),
            );
            return;
        }
    }
    std::thread::spawn(in_netns).join().unwrap();
}

fn in_netns() {
    netns::enter(&[CDN, OTHER, PLAIN, OPEN, UPSTREAM]);
    let up = UdpSocket::bind((UPSTREAM, 53)).unwrap();
    std::thread::spawn(move || fake_upstream(up));

    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    let o = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
        ])
        .args([
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=api.example.test",
            "-keyout",
        ])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .unwrap();
    assert!(o.status.success(), "openssl req: {o:?}");
    // The checked grants' default ports (the namespace is the test's own).
    let (pt, ph) = (443u16, 80u16);
    let server_log = dir.path().join("servers.log");
    let servers = dir.path().join("servers.py");
    std::fs::write(&servers, SERVERS).unwrap();
    let mut srv = Kill(
        Command::new("/usr/bin/python3")
            .arg(&servers)
            .args([&cert, &key, &server_log])
            .args([
                pt.to_string(),
                ph.to_string(),
                format!("{CDN},{OTHER},{OPEN}"),
                PLAIN.to_string(),
            ])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut line = String::new();
    BufReader::new(srv.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");

    let bus = Bus::start();
    let cg = TestCgroup::new("sni");
    let state = dir.path().join("state");
    let upstream: SocketAddr = format!("{UPSTREAM}:53").parse().unwrap();
    let up_arg = upstream.to_string();
    let d = Daemon::start_with(
        &bus,
        &cg.path,
        &state,
        &["--bpf-pin-dir", "none", "--dns-upstream", &up_arg],
    );
    let scripts = dir.path().join("scripts");
    std::fs::create_dir(&scripts).unwrap();
    std::fs::set_permissions(&scripts, std::fs::Permissions::from_mode(0o755)).unwrap();
    let script = scripts.join("agent.py");
    std::fs::write(&script, AGENT).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
    let text = format!(
        "apiVersion: agentos/v0.2\nkind: AgentContract\nname: fronting\ntenant: sni\nexec: {{ command: /usr/bin/python3, args: [{:?}, \"{pt}\", \"{ph}\"] }}\ncapabilities:\n  - fs.read: [{:?}]\n  - net.connect: [\"https://api.example.test\", \"https://*.cdn.test\", \"https://other.example.test:{pt}\", \"http://plain.example.test\", \"open.other.test:{pt}\"]\nrestart: \"no\"\n",
        script.display().to_string(),
        scripts.display().to_string(),
    );
    let contract = dir.path().join("fronting.yaml");
    std::fs::write(&contract, text).unwrap();
    d.ctl_ok(&["start", contract.to_str().unwrap()]);
    let st = d.wait_state("sni/fronting", "running", 20);
    let notes = st["notes"].to_string();
    assert!(
        notes.contains(&format!(
            "https://api.example.test:{pt}, https://*.cdn.test:{pt}"
        )),
        "{notes}"
    );
    let r = results(Path::new(st["log_path"].as_str().unwrap()));
    let got = |n: &str| {
        r.iter()
            .find(|(k, _)| k == n)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("no result for {n}: {r:?}\ndaemon:\n{}", d.log_text()))
    };
    let ctx = || format!("{r:#?}\ndaemon:\n{}", d.log_text());

    // Matching SNI: the exchange completes through the proxy, byte for byte; getpeername shows
    // the address the agent connected to, not the proxy.
    assert_eq!(
        got("tls-ok"),
        format!("ok echo:{CDN}:hi peer={CDN}:{pt}"),
        "{}",
        ctx()
    );
    assert_eq!(got("tls-split"), format!("ok echo:{CDN}:hi"), "{}", ctx());
    assert_eq!(got("tls-cdn"), format!("ok echo:{CDN}:hi"), "{}", ctx());
    assert_eq!(got("tls-mapped"), format!("ok echo:{CDN}:hi"), "{}", ctx());
    assert_eq!(
        got("tls-other-ok"),
        format!("ok echo:{OTHER}:hi"),
        "{}",
        ctx()
    );
    // Refused: reset by the proxy.
    for n in [
        "tls-fronted",
        "tls-other-address",
        "tls-no-sni",
        "not-tls",
        "silent",
        "http-bad-host",
        "http2-prior",
    ] {
        let v = got(n);
        assert!(v == "reset" || v == "ok ", "{n}: {v}\n{}", ctx());
    }
    // A port no grant names: still the kernel's EPERM (1).
    assert_eq!(got("wrong-port"), "err 1", "{}", ctx());
    // HTTP: the Host checked, one request per connection (the second, another Host, is never
    // read by the server: the proxy added Connection: close).
    assert_eq!(
        got("http-ok"),
        "ok HTTP/1.1 200 OK|Content-Length: 23||host=plain.example.test",
        "{}",
        ctx()
    );
    let ka = got("http-keepalive");
    assert!(
        ka.starts_with("ok HTTP/1.1 200 OK") && !ka.contains("evil"),
        "{ka}\n{}",
        ctx()
    );
    // A plain NAME:PORT grant: no check, any SNI.
    assert_eq!(
        got("plain-grant"),
        format!("ok echo:{OPEN}:hi"),
        "{}",
        ctx()
    );
    // 260 silent connections at once: 256 held (waiting for a hello), the rest reset. Exactly
    // so when opening them took less than the proxy's handshake timeout (5 s); a guest so slow
    // that it took longer (TCG on a loaded host) sees the first ones time out and reset too:
    // then no more than 256 held and at least the 4 over the cap reset.
    let cap = got("cap");
    let f: Vec<&str> = cap.split_whitespace().collect();
    assert_eq!((f.len(), f[0]), (4, "ok"), "{cap}: {}", ctx());
    let (reset, held, took): (u32, u32, f64) = (
        f[1].parse().unwrap(),
        f[2].parse().unwrap(),
        f[3].parse().unwrap(),
    );
    if took < 4.5 {
        assert_eq!((reset, held), (4, 256), "{cap}: {}", ctx());
    } else {
        eprintln!(
            "cap: opening took {took} s, near the handshake timeout: {reset} reset, {held} held"
        );
        assert!(
            reset + held == 260 && held <= 256 && reset >= 4,
            "{cap}: {}",
            ctx()
        );
    }
    let slog = std::fs::read_to_string(&server_log).unwrap_or_default();
    assert!(
        !slog.contains("evil"),
        "a refused name reached a server:\n{slog}"
    );
    assert!(
        slog.contains("http /b plain.example.test") && !slog.contains("http /c"),
        "{slog}"
    );
    assert!(!slog.contains("http /d"), "{slog}");

    // Each refusal is a record naming the name seen, the grants and the contract.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let o = Command::new(common::agentctl_bin())
            .args([
                "audit",
                "show",
                "--json",
                "--agent",
                "fronting",
                "--state-dir",
            ])
            .arg(&state)
            .output()
            .unwrap();
        let recs: Vec<serde_json::Value> = String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .filter(|r: &serde_json::Value| r["detail"]["mechanism"] == "sni-proxy")
            .collect();
        let find = |reason: &str, seen: serde_json::Value| {
            recs.iter()
                .find(|r| r["detail"]["reason"] == reason && r["detail"]["seen"] == seen)
        };
        let want = [
            ("not-granted", serde_json::json!("evil.attacker.test")),
            ("other-address", serde_json::json!("api.example.test")),
            ("no-sni", serde_json::Value::Null),
            ("not-tls", serde_json::Value::Null),
            ("timeout", serde_json::Value::Null),
            ("http2", serde_json::Value::Null),
            ("too-many", serde_json::Value::Null),
        ];
        if want.iter().all(|(r, s)| find(r, s.clone()).is_some()) {
            let f = find("not-granted", serde_json::json!("evil.attacker.test")).unwrap();
            assert_eq!(f["decision"], "deny", "{f}");
            assert_eq!(f["detail"]["contract"], "fronting", "{f}");
            assert_eq!(f["detail"]["addr"], CDN, "{f}");
            assert_eq!(f["detail"]["port"], pt, "{f}");
            assert_eq!(f["detail"]["check"], "tls", "{f}");
            let grants = f["detail"]["grant"].to_string();
            assert!(
                grants.contains(&format!("https://api.example.test:{pt}")),
                "{f}"
            );
            assert!(grants.contains(&format!("https://*.cdn.test:{pt}")), "{f}");
            let answered = f["detail"]["answered_for"].to_string();
            assert!(
                answered.contains("api.example.test") && answered.contains("www.cdn.test"),
                "{f}"
            );
            let o = find("other-address", serde_json::json!("api.example.test")).unwrap();
            assert_eq!(
                o["detail"]["answered_for"],
                serde_json::json!(["other.example.test"]),
                "{o}"
            );
            let h = recs.iter().find(|r| {
                r["detail"]["check"] == "http" && r["detail"]["seen"] == "evil.attacker.test"
            });
            assert!(h.is_some(), "no record of the Host mismatch: {recs:#?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "refusals not in the audit trail: {recs:#?}\n{}",
            ctx()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(d);
    drop(srv);
}

/// A child killed when the test ends, passing or not (the servers sleep for an hour).
struct Kill(std::process::Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
