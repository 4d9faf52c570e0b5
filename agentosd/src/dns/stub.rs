//! One agent's stub: a UDP socket and a TCP listener on 127.0.0.1:PORT (and on [::1]:PORT
//! where it can bind there), the queries they take
//! answered by [`answer`]. Bounded: at most [`MAX_INFLIGHT`] UDP queries and [`MAX_TCP`]
//! connections per agent at once (more UDP queries are dropped, the resolver retries; more
//! connections wait in the backlog), each TCP connection idle at most [`TCP_IDLE`].

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use super::wire::{self, QueryError};
use super::{
    Config, Dns, DnsError, Refusal, StubSpec, addr_refusal, boottime_ns, covered, ports_for,
};

const MAX_INFLIGHT: usize = 32;
const MAX_TCP: usize = 8;
const TCP_IDLE: Duration = Duration::from_secs(10);
/// A query from the agent, or an upstream's answer over UDP, bytes.
const MAX_MSG: usize = 4096;
/// An answer over TCP (its length is two bytes).
const MAX_TCP_MSG: usize = 65_535;

pub(super) struct Stub {
    port: u16,
    cgroup_id: u64,
    v6: bool,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Stub {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Stub {
    pub(super) fn port(&self) -> u16 {
        self.port
    }

    pub(super) fn cgroup_id(&self) -> u64 {
        self.cgroup_id
    }

    /// Whether it serves [::1]:port too.
    pub(super) fn v6(&self) -> bool {
        self.v6
    }

    /// Bind UDP and TCP on 127.0.0.1:`port` (0: a free port both are free on), and on
    /// [::1] at the same port when it can (IPv6 sockets' queries go there), and serve; the
    /// bounds hold for both addresses together.
    pub(super) fn start(dns: Arc<Dns>, spec: StubSpec, port: u16) -> Result<Stub, DnsError> {
        let (udp, tcp) = bind_pair(port)?;
        let port = udp.local_addr().map(|a| a.port()).unwrap_or(port);
        let mut socks = vec![(udp, tcp)];
        match bind_v6(port) {
            Ok(pair) => socks.push(pair),
            Err(e) => tracing::info!(
                agent = %spec.agent_id,
                "DNS stub: not on [::1]:{port} ({e}); IPv6 sockets' queries go to ::ffff:127.0.0.1 (an IPV6_V6ONLY socket's fail)"
            ),
        }
        let v6 = socks.len() == 2;
        let cgroup_id = spec.cgroup_id;
        let spec = Arc::new(spec);
        let (udp_sem, tcp_sem) = (
            Arc::new(Semaphore::new(MAX_INFLIGHT)),
            Arc::new(Semaphore::new(MAX_TCP)),
        );
        let mut tasks = Vec::new();
        for (udp, tcp) in socks {
            let udp = UdpSocket::from_std(udp).map_err(|error| DnsError::Bind { port, error })?;
            let tcp = TcpListener::from_std(tcp).map_err(|error| DnsError::Bind { port, error })?;
            let (d, sp) = (dns.clone(), spec.clone());
            tasks.push(tokio::spawn(serve_udp(
                d,
                sp,
                Arc::new(udp),
                udp_sem.clone(),
            )));
            let (d, sp) = (dns.clone(), spec.clone());
            tasks.push(tokio::spawn(serve_tcp(d, sp, tcp, tcp_sem.clone())));
        }
        Ok(Stub {
            port,
            cgroup_id,
            v6,
            tasks,
        })
    }
}

/// UDP and TCP on [::1]:`port` (non-blocking), or why not (no IPv6 loopback, port taken).
fn bind_v6(port: u16) -> std::io::Result<(std::net::UdpSocket, std::net::TcpListener)> {
    let at = SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port));
    let udp = std::net::UdpSocket::bind(at)?;
    let tcp = std::net::TcpListener::bind(at)?;
    udp.set_nonblocking(true)?;
    tcp.set_nonblocking(true)?;
    Ok((udp, tcp))
}

fn bind_pair(port: u16) -> Result<(std::net::UdpSocket, std::net::TcpListener), DnsError> {
    let mut last = None;
    for _ in 0..8 {
        let at = |p: u16| SocketAddr::from((Ipv4Addr::LOCALHOST, p));
        let udp =
            std::net::UdpSocket::bind(at(port)).map_err(|error| DnsError::Bind { port, error })?;
        let p = udp.local_addr().map(|a| a.port()).unwrap_or(port);
        match std::net::TcpListener::bind(at(p)) {
            Ok(tcp) => {
                for (r, what) in [
                    (udp.set_nonblocking(true), "udp"),
                    (tcp.set_nonblocking(true), "tcp"),
                ] {
                    r.map_err(|error| DnsError::Bind {
                        port: p,
                        error: std::io::Error::new(error.kind(), format!("{what}: {error}")),
                    })?;
                }
                return Ok((udp, tcp));
            }
            // Another socket holds the TCP port of this UDP one: try another pair.
            Err(error) if port == 0 => last = Some(DnsError::Bind { port: p, error }),
            Err(error) => return Err(DnsError::Bind { port: p, error }),
        }
    }
    Err(last.unwrap_or(DnsError::Bind {
        port,
        error: std::io::Error::other("no free port pair"),
    }))
}

async fn serve_udp(dns: Arc<Dns>, spec: Arc<StubSpec>, sock: Arc<UdpSocket>, sem: Arc<Semaphore>) {
    let mut buf = vec![0u8; MAX_MSG];
    loop {
        let Ok((n, peer)) = sock.recv_from(&mut buf).await else {
            continue;
        };
        let Ok(permit) = sem.clone().try_acquire_owned() else {
            continue; // over the bound: dropped, the resolver retries
        };
        let msg = buf[..n].to_vec();
        let (dns, spec, sock) = (dns.clone(), spec.clone(), sock.clone());
        tokio::spawn(async move {
            if let Some(r) = answer(&dns, &spec, &msg, Transport::Udp).await {
                let _ = sock.send_to(&r, peer).await;
            }
            drop(permit);
        });
    }
}

async fn serve_tcp(dns: Arc<Dns>, spec: Arc<StubSpec>, listener: TcpListener, sem: Arc<Semaphore>) {
    loop {
        let Ok(permit) = sem.clone().acquire_owned().await else {
            return;
        };
        let Ok((conn, _)) = listener.accept().await else {
            continue;
        };
        let (dns, spec) = (dns.clone(), spec.clone());
        tokio::spawn(async move {
            let _ = serve_conn(&dns, &spec, conn).await;
            drop(permit);
        });
    }
}

async fn serve_conn(dns: &Dns, spec: &StubSpec, mut conn: TcpStream) -> std::io::Result<()> {
    let idle = |e| std::io::Error::new(std::io::ErrorKind::TimedOut, e);
    loop {
        let mut len = [0u8; 2];
        tokio::time::timeout(TCP_IDLE, conn.read_exact(&mut len))
            .await
            .map_err(idle)??;
        let len = u16::from_be_bytes(len) as usize;
        if len > MAX_MSG {
            return Ok(());
        }
        let mut msg = vec![0u8; len];
        tokio::time::timeout(TCP_IDLE, conn.read_exact(&mut msg))
            .await
            .map_err(idle)??;
        let Some(r) = answer(dns, spec, &msg, Transport::Tcp).await else {
            return Ok(());
        };
        let mut out = (r.len() as u16).to_be_bytes().to_vec();
        out.extend_from_slice(&r);
        conn.write_all(&out).await?;
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Transport {
    Udp,
    Tcp,
}

fn refusal(spec: &StubSpec, qname: &str, qtype: u16, reason: &'static str) -> Refusal {
    Refusal {
        agent_id: spec.agent_id.clone(),
        tenant: spec.tenant.clone(),
        name: spec.name.clone(),
        contract: spec.contract.clone(),
        qname: qname.to_string(),
        qtype,
        reason,
        addr: None,
    }
}

/// The stub's answer to one message of the agent's (`None`: not answered at all).
async fn answer(dns: &Dns, spec: &StubSpec, msg: &[u8], via: Transport) -> Option<Vec<u8>> {
    let q = match wire::parse_query(msg) {
        Ok(q) => q,
        Err(QueryError::Short) => return None,
        Err(e @ (QueryError::TooLong | QueryError::BadLabel)) => {
            let reason = if e == QueryError::TooLong {
                "too-long"
            } else {
                "bad-label"
            };
            dns.refused(refusal(spec, "", 0, reason));
            return Some(wire::bare_response(wire::id_of(msg)?, wire::REFUSED));
        }
        Err(QueryError::Malformed(_)) => {
            return Some(wire::bare_response(wire::id_of(msg)?, wire::FORMERR));
        }
    };
    let Some(ports) = ports_for(&spec.grants, &q.name) else {
        dns.refused(refusal(spec, &q.name, q.qtype, "not-granted"));
        let text = format!(
            "agentos: {} is not granted to agent {} by contract {}",
            q.name, spec.agent_id, spec.contract
        );
        let r = wire::response(&q, wire::NXDOMAIN, &[], Some((wire::EDE_PROHIBITED, &text)));
        return Some(r);
    };
    if q.qclass != wire::CLASS_IN || !(q.qtype == wire::TYPE_A || q.qtype == wire::TYPE_AAAA) {
        // Granted name, another type (TXT, MX, HTTPS…): nothing forwarded, nothing answered.
        return Some(wire::response(&q, wire::NOERROR, &[], None));
    }
    let Some(ans) = forward(&dns.cfg, &q).await else {
        return Some(wire::response(&q, wire::SERVFAIL, &[], None));
    };
    // The records the agent may get: CNAMEs, and addresses outside the stripped ranges.
    let mut kept: Vec<wire::Record> = Vec::new();
    for r in ans.records {
        if let Some(addr) = record_addr(&r)
            && let Some(strip) = addr_refusal(addr, &dns.cfg.allow_private)
            && !(strip == super::Strip::Private && covered(&spec.static_connect, addr, &ports))
        {
            // Rebinding: an audit record (rate-limited with the other refusals).
            dns.refused(Refusal {
                addr: Some(addr),
                ..refusal(spec, &q.name, q.qtype, strip.reason())
            });
            continue;
        }
        kept.push(r);
    }
    // What fits: over UDP the agent's size (else TC, and nothing learnt: the resolver asks
    // again over TCP and learns from that answer), over TCP a 64 KiB message.
    let out = wire::response(&q, ans.rcode, &kept, None);
    if via == Transport::Udp && out.len() > wire::udp_limit(&q) {
        return Some(wire::truncated_response(&q, ans.rcode));
    }
    kept.truncate(wire::records_within(&q, &kept, MAX_TCP_MSG));
    // Only the addresses of the answer given are learnt.
    let now = boottime_ns();
    kept.retain(|r| {
        let Some(addr) = record_addr(r) else {
            return true;
        };
        dns.remember(spec.cgroup_id, addr, &q.name);
        let ttl = u64::from(r.ttl.min(super::MAX_TTL));
        let expires = now + ttl * 1_000_000_000 + dns.cfg.grace.as_nanos() as u64;
        match dns.net.learn_name(spec.cgroup_id, addr, &ports, expires) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(agent = %spec.agent_id, "DNS answer for {}: {e}", q.name);
                false
            }
        }
    });
    Some(wire::response(&q, ans.rcode, &kept, None))
}

fn record_addr(r: &wire::Record) -> Option<IpAddr> {
    match r.data {
        wire::RData::A(a) => Some(a.into()),
        wire::RData::Aaaa(a) => Some(a.into()),
        wire::RData::Cname(_) => None,
    }
}

/// Ask the upstreams in turn (a fresh socket and a random id each), over UDP, and again over
/// TCP when the UDP answer is truncated (TC); `None` when none answered in time.
async fn forward(cfg: &Config, q: &wire::Query) -> Option<wire::Answer> {
    for up in &cfg.upstreams {
        let Some(a) = forward_udp(cfg, *up, q).await else {
            tracing::warn!(
                "DNS upstream {up}: no answer for {} in {:?}",
                q.name,
                cfg.timeout
            );
            continue;
        };
        if !a.truncated {
            return Some(a);
        }
        match tokio::time::timeout(cfg.timeout, forward_tcp(*up, q)).await {
            Ok(Ok(a)) => return Some(a),
            Ok(Err(e)) => tracing::warn!(
                "DNS upstream {up}: the answer for {} was truncated and TCP failed: {e}",
                q.name
            ),
            Err(_) => tracing::warn!(
                "DNS upstream {up}: the answer for {} was truncated and TCP took over {:?}",
                q.name,
                cfg.timeout
            ),
        }
    }
    None
}

async fn forward_udp(cfg: &Config, up: SocketAddr, q: &wire::Query) -> Option<wire::Answer> {
    let local: SocketAddr = if up.is_ipv4() {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let sock = UdpSocket::bind(local).await.ok()?;
    let id: u16 = rand::random();
    sock.connect(up).await.ok()?;
    sock.send(&wire::upstream_query(id, q)).await.ok()?;
    let deadline = tokio::time::Instant::now() + cfg.timeout;
    let mut buf = vec![0u8; MAX_MSG];
    while let Ok(Ok(n)) = tokio::time::timeout_at(deadline, sock.recv(&mut buf)).await {
        if let Some(a) = wire::parse_answer(&buf[..n], id, q) {
            return Some(a);
        }
    }
    None
}

/// The same question over TCP (RFC 7766: a two-byte length, then the message; at most 64 KiB).
async fn forward_tcp(up: SocketAddr, q: &wire::Query) -> std::io::Result<wire::Answer> {
    let mut conn = TcpStream::connect(up).await?;
    let id: u16 = rand::random();
    let msg = wire::upstream_query(id, q);
    let mut out = (msg.len() as u16).to_be_bytes().to_vec();
    out.extend_from_slice(&msg);
    conn.write_all(&out).await?;
    let mut len = [0u8; 2];
    conn.read_exact(&mut len).await?;
    let mut buf = vec![0u8; usize::from(u16::from_be_bytes(len))];
    conn.read_exact(&mut buf).await?;
    wire::parse_answer(&buf, id, q)
        .ok_or_else(|| std::io::Error::other("not an answer to the question asked"))
}
