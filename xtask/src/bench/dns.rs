//! `cargo xtask bench dns`: egress by name, measured. In a network namespace this bench makes
//! (198.18.0.x on its loopback, a fake upstream resolver on 198.18.0.53:53 answering
//! `*.bench.test` with a 300 s TTL, a TCP server on 198.18.0.10), a release agentosd runs two
//! agents and this process measures the same things from the host:
//!
//! - name resolution: one A query per lookup, a fresh UDP socket each (connect, send, receive:
//!   what glibc's getaddrinfo does) from inside an agent (redirected by cgroup BPF to its stub in
//!   agentosd, which forwards) vs from the host straight to the same upstream;
//! - the same for a name whose answer does not fit a datagram (`bN.bench.test`, 60 addresses:
//!   TC over UDP, then the whole answer over TCP; through the stub, which asks the upstream over
//!   UDP and TCP for each of the two queries);
//! - connect latency (TCP connect + close to 198.18.0.10) of an agent granted
//!   `*.bench.test:PORT` after it resolved 1 000 names (1 000 entries of its own in `net_names`,
//!   the server's address learnt from an answer) vs an agent granted `198.18.0.10:PORT` (one
//!   static rule) vs the host (no BPF at all);
//! - the SNI/Host check's cost per connection: connect, send a TLS ClientHello for
//!   `server.bench.test`, receive the server's first byte, close, from an agent granted
//!   `https://server.bench.test:PORT` (through the daemon's SNI/Host proxy) vs one granted
//!   `server.bench.test:PORT` (the kernel's address check only) vs the host.
//!
//! No packet leaves the namespace. Root.

use std::ffi::OsString;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use serde_json::json;

use super::harness::{
    Dist, Env, Layout, Procs, build_bins, chmod, loadavg, mono_ns, read_samples, teardown, touch,
    us, write_u32s,
};

const UPSTREAM: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 53);
const SERVER: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 10);
/// Names the 1 000-name agent resolves before it measures (each its own address).
const NAMES: usize = 1000;

#[derive(Args)]
pub struct DnsArgs {
    /// Lookups and connects measured per path.
    #[arg(long, default_value_t = 5000)]
    pub calls: usize,
    /// Unmeasured lookups and connects first, per path.
    #[arg(long, default_value_t = 200)]
    pub warmup: usize,
    /// Working directory [default: /var/tmp/agentos-bench-dns-PID].
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Directory with release agentosd and agentctl [default: build them next to this binary].
    #[arg(long)]
    pub bin_dir: Option<PathBuf>,
    /// Leave the working directory in place.
    #[arg(long)]
    pub keep: bool,
    /// Also write the results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

#[derive(Args)]
pub struct ClientArgs {
    /// `resolve`, `fill` (resolve the 1 000 names) and `connect`, comma-separated, in order.
    #[arg(long)]
    pub modes: String,
    #[arg(long)]
    pub calls: usize,
    #[arg(long)]
    pub warmup: usize,
    /// The server's TCP port.
    #[arg(long)]
    pub port: u16,
    /// The port of the server that answers a ClientHello with one byte (`hello` mode).
    #[arg(long, default_value_t = 0)]
    pub hello_port: u16,
    /// Samples go to OUT-MODE.bin, then OUT.done.
    #[arg(long)]
    pub out: PathBuf,
}

/// An A query for `name` with id `id`.
fn query(id: u16, name: &str) -> Vec<u8> {
    let mut q = id.to_be_bytes().to_vec();
    q.extend_from_slice(&[1, 0, 0, 1, 0, 0, 0, 0, 0, 0]);
    for l in name.split('.') {
        q.push(l.len() as u8);
        q.extend_from_slice(l.as_bytes());
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    q
}

/// A TLS 1.3-shaped ClientHello for `name` (one record): what the proxy parses.
fn client_hello(name: &str) -> Vec<u8> {
    let n = name.as_bytes();
    let mut ext = vec![0, 0];
    ext.extend(((n.len() + 5) as u16).to_be_bytes());
    ext.extend(((n.len() + 3) as u16).to_be_bytes());
    ext.push(0);
    ext.extend((n.len() as u16).to_be_bytes());
    ext.extend(n);
    // supported_groups (x25519), supported_versions (TLS 1.3): an ordinary hello's shape.
    ext.extend([0, 10, 0, 4, 0, 2, 0, 29, 0, 43, 0, 3, 2, 3, 4]);
    let mut body = vec![3, 3];
    body.extend([7u8; 32]);
    body.push(32);
    body.extend([1u8; 32]);
    body.extend([0, 4, 0x13, 0x01, 0x13, 0x02, 1, 0]);
    body.extend((ext.len() as u16).to_be_bytes());
    body.extend(ext);
    let mut hs = vec![1, 0];
    hs.extend((body.len() as u16).to_be_bytes());
    hs.extend(body);
    let mut rec = vec![0x16, 3, 1];
    rec.extend((hs.len() as u16).to_be_bytes());
    rec.extend(hs);
    rec
}

/// The `hello` server: reads one ClientHello, answers one byte, closes.
fn hello_server(l: TcpListener) {
    use std::io::{Read as _, Write as _};
    let len = client_hello("server.bench.test").len();
    for c in l.incoming() {
        let Ok(mut c) = c else { continue };
        let mut buf = vec![0u8; len];
        if c.read_exact(&mut buf).is_ok() {
            let _ = c.write_all(b"x");
        }
    }
}

/// One lookup as getaddrinfo makes it: a fresh socket, connect, send, receive the answer.
fn lookup(server: SocketAddr, id: u16, name: &str) -> Result<Vec<u8>> {
    let s = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
    s.set_read_timeout(Some(Duration::from_secs(3)))?;
    s.connect(server)?;
    s.send(&query(id, name))?;
    let mut buf = [0u8; 512];
    let n = s
        .recv(&mut buf)
        .with_context(|| format!("no answer for {name}"))?;
    if n < 12 || buf[..2] != id.to_be_bytes() || buf[3] & 0xf != 0 || buf[7] == 0 {
        bail!("lookup of {name}: not a NOERROR answer with a record");
    }
    Ok(buf[..n].to_vec())
}

/// Addresses of each `bN.bench.test` (198.18.2.1-60): too many for a 512-byte datagram.
const BIG: u8 = 60;

/// A lookup of a name whose UDP answer is truncated (TC), then over TCP as glibc retries it:
/// a fresh connection, the query with its two-byte length, the whole answer.
fn lookup_tc(server: SocketAddr, id: u16, name: &str) -> Result<()> {
    use std::io::{Read as _, Write as _};
    let s = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
    s.set_read_timeout(Some(Duration::from_secs(3)))?;
    s.connect(server)?;
    s.send(&query(id, name))?;
    let mut buf = [0u8; 512];
    let n = s
        .recv(&mut buf)
        .with_context(|| format!("no answer for {name}"))?;
    if n < 12 || buf[2] & 0x02 == 0 {
        bail!("lookup of {name}: the UDP answer is not truncated");
    }
    let mut c = TcpStream::connect_timeout(&server, Duration::from_secs(3))?;
    c.set_read_timeout(Some(Duration::from_secs(3)))?;
    let q = query(id, name);
    let mut out = (q.len() as u16).to_be_bytes().to_vec();
    out.extend_from_slice(&q);
    c.write_all(&out)?;
    let mut len = [0u8; 2];
    c.read_exact(&mut len)?;
    let mut a = vec![0u8; usize::from(u16::from_be_bytes(len))];
    c.read_exact(&mut a)?;
    if a.len() < 12 || a[3] & 0xf != 0 || u16::from_be_bytes([a[6], a[7]]) != u16::from(BIG) {
        bail!("lookup of {name} over TCP: not all {BIG} addresses");
    }
    Ok(())
}

/// The measured loops (in an agent, or in this process for the host's numbers).
pub fn client(a: ClientArgs) -> Result<()> {
    let upstream = SocketAddr::from((UPSTREAM, 53));
    let server = SocketAddr::from((SERVER, a.port));
    for mode in a.modes.split(',') {
        let mut v: Vec<u32> = Vec::with_capacity(a.calls);
        match mode {
            "resolve" => {
                for i in 0..a.warmup + a.calls {
                    let t0 = mono_ns();
                    lookup(upstream, i as u16, &format!("q{i}.bench.test"))?;
                    if i >= a.warmup {
                        v.push((mono_ns() - t0) as u32);
                    }
                }
            }
            "resolve-tc" => {
                for i in 0..a.warmup + a.calls {
                    let t0 = mono_ns();
                    lookup_tc(upstream, i as u16, &format!("b{i}.bench.test"))?;
                    if i >= a.warmup {
                        v.push((mono_ns() - t0) as u32);
                    }
                }
            }
            "fill" => {
                for i in 0..NAMES {
                    lookup(upstream, i as u16, &format!("n{i}.bench.test"))?;
                }
                lookup(upstream, 0, "server.bench.test")?;
            }
            "connect" => {
                for i in 0..a.warmup + a.calls {
                    let t0 = mono_ns();
                    let c =
                        TcpStream::connect(server).with_context(|| format!("connect {server}"))?;
                    let dt = mono_ns() - t0;
                    drop(c);
                    if i >= a.warmup {
                        v.push(dt as u32);
                    }
                }
            }
            "hello" => {
                // The name first (an agent's stub learns the address, marked checked or not).
                lookup(upstream, 1, "server.bench.test")?;
                let hello = client_hello("server.bench.test");
                let to = SocketAddr::from((SERVER, a.hello_port));
                for i in 0..a.warmup + a.calls {
                    let t0 = mono_ns();
                    let mut c = TcpStream::connect(to).with_context(|| format!("connect {to}"))?;
                    c.set_nodelay(true)?;
                    std::io::Write::write_all(&mut c, &hello)?;
                    let mut b = [0u8; 1];
                    std::io::Read::read_exact(&mut c, &mut b)
                        .with_context(|| format!("first byte from {to} (connection {i})"))?;
                    let dt = mono_ns() - t0;
                    drop(c);
                    if i >= a.warmup {
                        v.push(dt as u32);
                    }
                }
            }
            m => bail!("unknown mode {m}"),
        }
        if !v.is_empty() {
            write_u32s(Path::new(&format!("{}-{mode}.bin", a.out.display())), &v)?;
        }
    }
    touch(&a.out, "done", "")
}

/// The fake upstream's answer: `server.bench.test` and `qN.bench.test` → SERVER,
/// `nN.bench.test` → an address of its own (198.18.1.0 + N), `bN.bench.test` → 198.18.2.1-60
/// (over UDP: TC and no record), TTL 300; anything else NXDOMAIN.
fn fake_answer(msg: &[u8], tcp: bool) -> Option<Vec<u8>> {
    use agentosd::dns::wire;
    let q = wire::parse_query(msg).ok()?;
    let labels: Vec<&str> = q.name.split('.').collect();
    let addrs: Vec<Ipv4Addr> = match labels[..] {
        ["server", "bench", "test"] => vec![SERVER],
        [l, "bench", "test"] if l.starts_with('q') => vec![SERVER],
        [l, "bench", "test"] if l.starts_with('b') => {
            (1..=BIG).map(|i| Ipv4Addr::new(198, 18, 2, i)).collect()
        }
        [l, "bench", "test"] => l
            .strip_prefix('n')
            .and_then(|k| k.parse::<u32>().ok())
            .map(|k| Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 1, 0)) + k))
            .into_iter()
            .collect(),
        _ => Vec::new(),
    };
    let big = addrs.len() > 1 && !tcp;
    let owner = q.question[..q.question.len().saturating_sub(4)].to_vec();
    let records: Vec<wire::Record> = addrs
        .iter()
        .filter(|_| !big)
        .map(|a| wire::Record {
            name: owner.clone(),
            ttl: 300,
            data: wire::RData::A(*a),
        })
        .collect();
    let rcode = if addrs.is_empty() {
        wire::NXDOMAIN
    } else {
        wire::NOERROR
    };
    let mut r = wire::response(&q, rcode, &records, None);
    if big {
        r[2] |= 0x02;
    }
    Some(r)
}

/// The fake upstream over UDP (answers in the thread that receives).
fn fake_upstream(sock: UdpSocket) {
    let mut buf = [0u8; 1500];
    while let Ok((n, peer)) = sock.recv_from(&mut buf) {
        if let Some(r) = fake_answer(&buf[..n], false) {
            let _ = sock.send_to(&r, peer);
        }
    }
}

/// The fake upstream over TCP: one query per connection, one connection at a time.
fn fake_upstream_tcp(l: TcpListener) {
    use std::io::{Read as _, Write as _};
    for c in l.incoming() {
        let Ok(mut c) = c else { continue };
        let _ = c.set_read_timeout(Some(Duration::from_secs(3)));
        let mut len = [0u8; 2];
        if c.read_exact(&mut len).is_err() {
            continue;
        }
        let mut q = vec![0u8; usize::from(u16::from_be_bytes(len))];
        if c.read_exact(&mut q).is_err() {
            continue;
        }
        if let Some(r) = fake_answer(&q, true) {
            let mut out = (r.len() as u16).to_be_bytes().to_vec();
            out.extend_from_slice(&r);
            let _ = c.write_all(&out);
        }
    }
}

fn ip(args: &[&str]) -> Result<()> {
    let o = std::process::Command::new("ip").args(args).output()?;
    if !o.status.success() {
        bail!("ip {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    }
    Ok(())
}

pub fn run(a: DnsArgs) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("bench dns needs root (a network namespace, cgroups, agents with their own uids)");
    }
    let mount = agentosd::cgroup::cgroup2_mount().context("no cgroup2 mount")?;
    let bin_dir = match &a.bin_dir {
        Some(d) => d.clone(),
        None => build_bins()?,
    };
    let dir = a.dir.clone().unwrap_or_else(|| {
        PathBuf::from(format!("/var/tmp/agentos-bench-dns-{}", std::process::id()))
    });
    std::fs::create_dir_all(&dir)?;
    let dir = std::fs::canonicalize(&dir)?;
    chmod(&dir, 0o755)?;
    let cgroup_root = mount.join(format!("agentos-bench-dns-{}", std::process::id()));
    // Everything from here in a network namespace of this thread's own (the daemon, the
    // agents' broker sockets, the fake resolver and the server): nothing leaves the machine.
    // SAFETY: unshare(2) with a flag constant; it affects only this (single-threaded) process.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        return Err(std::io::Error::last_os_error()).context("unshare(CLONE_NEWNET)");
    }
    ip(&["link", "set", "lo", "up"])?;
    for addr in [UPSTREAM, SERVER] {
        ip(&["addr", "add", &format!("{addr}/32"), "dev", "lo"])?;
    }
    let mut procs = Procs(Vec::new());
    let result = bench(&a, &dir, &bin_dir, &cgroup_root, &mut procs);
    teardown(procs, &cgroup_root);
    if a.keep {
        eprintln!("bench dns: kept {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    result
}

fn bench(
    a: &DnsArgs,
    dir: &Path,
    bin_dir: &Path,
    cgroup_root: &Path,
    procs: &mut Procs,
) -> Result<()> {
    let load_before = loadavg();
    let up = UdpSocket::bind((UPSTREAM, 53))?;
    std::thread::spawn(move || fake_upstream(up));
    let up_tcp = TcpListener::bind((UPSTREAM, 53))?;
    std::thread::spawn(move || fake_upstream_tcp(up_tcp));
    let listener = TcpListener::bind((SERVER, 0))?;
    let port = listener.local_addr()?.port();
    std::thread::spawn(move || {
        for c in listener.incoming() {
            drop(c);
        }
    });
    let hl = TcpListener::bind((SERVER, 0))?;
    let hello_port = hl.local_addr()?.port();
    std::thread::spawn(move || hello_server(hl));
    let l = Layout::new(dir)?;
    let audit = l.state.join("audit");
    std::fs::create_dir_all(&audit)?;
    let extra: Vec<OsString> = ["--bpf-pin-dir", "none", "--dns-upstream", "198.18.0.53:53"]
        .map(OsString::from)
        .to_vec();
    let env = Env::launch(&l, bin_dir, cgroup_root, &audit, &extra, procs)?;
    let args = |modes: &str, prefix: &Path| -> Vec<String> {
        [
            "bench",
            "dns-client",
            "--modes",
            modes,
            "--calls",
            &a.calls.to_string(),
            "--warmup",
            &a.warmup.to_string(),
            "--port",
            &port.to_string(),
            "--hello-port",
            &hello_port.to_string(),
            "--out",
            &prefix.display().to_string(),
        ]
        .map(String::from)
        .to_vec()
    };
    // The host first (no agent, no BPF), then the two agents one after the other.
    let host = dir.join("host");
    client(ClientArgs {
        modes: "resolve,resolve-tc,connect,hello".into(),
        calls: a.calls,
        warmup: a.warmup,
        port,
        hello_port,
        out: host.clone(),
    })?;
    let agents = [
        (
            "names",
            "resolve,resolve-tc,fill,connect",
            format!("*.bench.test:{port}"),
        ),
        ("static", "connect", format!("{SERVER}:{port}")),
        // The SNI check side by side: the same name, checked or not.
        ("plain", "hello", format!("server.bench.test:{hello_port}")),
        (
            "checked",
            "hello",
            format!("https://server.bench.test:{hello_port}"),
        ),
    ];
    for (name, modes, grant) in &agents {
        let cap = format!("net.connect: [\"{grant}\"]");
        env.start_agent_with(name, &args(modes, &env.home(name).join("out")), &[&cap], "")?;
        env.wait_for(&[name.to_string()], "done", 600)?;
    }
    let load_after = loadavg();
    let get = |p: PathBuf| -> Result<Dist> {
        Ok(Dist::new(
            read_samples(&p)?.into_iter().map(u64::from).collect(),
        ))
    };
    let bin = |prefix: &Path, mode: &str| PathBuf::from(format!("{}-{mode}.bin", prefix.display()));
    let names_out = env.home("names").join("out");
    let rows = [
        ("resolve: host → upstream", get(bin(&host, "resolve"))?),
        (
            "resolve: agent → stub → upstream",
            get(bin(&names_out, "resolve"))?,
        ),
        (
            "resolve, truncated (UDP TC, then TCP): host → upstream",
            get(bin(&host, "resolve-tc"))?,
        ),
        (
            "resolve, truncated (UDP TC, then TCP): agent → stub → upstream",
            get(bin(&names_out, "resolve-tc"))?,
        ),
        ("connect: host (no BPF)", get(bin(&host, "connect"))?),
        (
            "connect: agent, one static rule",
            get(bin(&env.home("static").join("out"), "connect"))?,
        ),
        (
            "connect: agent, 1 000 learnt names",
            get(bin(&names_out, "connect"))?,
        ),
        (
            "connect + ClientHello + first byte: host",
            get(bin(&host, "hello"))?,
        ),
        (
            "connect + ClientHello + first byte: agent, server.bench.test:PORT (no check)",
            get(bin(&env.home("plain").join("out"), "hello"))?,
        ),
        (
            "connect + ClientHello + first byte: agent, https://server.bench.test:PORT (SNI proxy)",
            get(bin(&env.home("checked").join("out"), "hello"))?,
        ),
    ];
    println!(
        "bench dns: {} lookups / connects per path ({} warm-up), load {load_before} → {load_after}",
        a.calls, a.warmup
    );
    println!("| path | p50 µs | p99 µs | p99.9 µs | max µs |");
    println!("|---|---|---|---|---|");
    for (name, d) in &rows {
        println!(
            "| {name} | {} | {} | {} | {} |",
            us(d.p(500)),
            us(d.p(990)),
            us(d.p(999)),
            us(d.max())
        );
    }
    let (st, nm) = (&rows[5].1, &rows[6].1);
    println!(
        "1 000 names vs one static rule: p50 {:+.1} µs, p99 {:+.1} µs (goal < 50 µs)",
        (nm.p(500) as f64 - st.p(500) as f64) / 1000.0,
        (nm.p(990) as f64 - st.p(990) as f64) / 1000.0
    );
    let (pl, ck) = (&rows[6].1, &rows[7].1);
    println!(
        "SNI check vs none: p50 {:+.1} µs, p99 {:+.1} µs per connection",
        (ck.p(500) as f64 - pl.p(500) as f64) / 1000.0,
        (ck.p(990) as f64 - pl.p(990) as f64) / 1000.0
    );
    if let Some(p) = &a.json {
        let v: serde_json::Map<String, serde_json::Value> = rows
            .iter()
            .map(|(n, d)| (n.to_string(), d.json()))
            .collect();
        let out = json!({"calls": a.calls, "warmup": a.warmup, "load_before": load_before,
            "load_after": load_after, "paths": v});
        std::fs::write(p, serde_json::to_vec_pretty(&out)?)?;
    }
    Ok(())
}
