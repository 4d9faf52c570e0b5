//! The SNI/Host proxy: the checked grants' defence against domain fronting (`https://NAME`,
//! `http://NAME` in `net.connect`). cgroup BPF sends an agent's TCP connect to an address only
//! such a grant allows to this listener on 127.0.0.1 (`ebpf/net.bpf.c`, `to_proxy`), and the
//! sockops program publishes where it was going (`sni_conns`, read once at accept). The proxy
//! reads the first bytes ([`sniff`](super::sniff): the ClientHello's SNI, or the request head's
//! Host, within 5 s and 16 KiB / 8 KiB), lets the connection on only when that name is one a
//! checked grant of the port matches AND the address was answered to this agent for that very
//! name, then connects to the original destination and relays both ways (16 KiB per direction,
//! 5 min idle). Everything else is reset and recorded. Plain HTTP connections carry one request:
//! the proxy adds `Connection: close` to the head it checked. See docs/security.md.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use super::sniff::{self, SniffError};
use super::{Dns, StubSpec, lock};
use crate::enforce::net::{Check, NameGrant};

/// Time for the first bytes (ClientHello or request head) to arrive.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// A relayed connection with no byte either way for this long is closed.
pub const IDLE: Duration = Duration::from_secs(300);
/// Connections through the proxy per agent at once (more are reset and recorded).
pub const PER_AGENT: usize = 256;
/// Connections through the proxy for all agents at once.
pub const TOTAL: usize = 4096;
/// Time to reach the original destination.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Relay buffer per direction.
const BUF: usize = 16 * 1024;
/// Addresses remembered per agent, and names per address, for the address check.
const SEEN_ADDRS: usize = 1024;
const SEEN_NAMES: usize = 8;
/// Refusal reports waiting for the audit trail.
const REFUSALS_QUEUED: usize = 1024;

/// A connection the proxy refused, for the audit trail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub agent_id: String,
    pub tenant: String,
    pub name: String,
    pub contract: String,
    /// `tls` or `http`: what the proxy read.
    pub check: &'static str,
    /// The SNI or Host the connection carried, if one could be read.
    pub seen: Option<String>,
    /// The checked grants of the port (as the contract writes them).
    pub grants: Vec<String>,
    /// The original destination.
    pub dst: SocketAddr,
    /// The names the agent's stub answered this address for (recently).
    pub answered_for: Vec<String>,
    /// `not-granted`, `other-address`, `host-port`, `no-sni`, `ech`, `not-tls`, `not-http`,
    /// `http2`, `connect-method`, `no-host`, `malformed`, `too-large`, `timeout`, `too-many`.
    pub reason: &'static str,
    pub detail: String,
}

/// An agent with checked grants.
struct Agent {
    spec: Arc<StubSpec>,
    open: AtomicUsize,
    /// Address → the names (lower case) its answers were for, most recent first.
    seen: Mutex<HashMap<IpAddr, Vec<String>>>,
}

/// The agents the proxy serves and its refusal reports.
pub(super) struct Registry {
    agents: Mutex<HashMap<u64, Arc<Agent>>>,
    refusals: tokio::sync::mpsc::Sender<Refusal>,
    refusals_rx: Mutex<Option<tokio::sync::mpsc::Receiver<Refusal>>>,
    pub(super) dropped: AtomicU64,
}

impl Default for Registry {
    fn default() -> Self {
        let (tx, rx) = tokio::sync::mpsc::channel(REFUSALS_QUEUED);
        Registry {
            agents: Mutex::default(),
            refusals: tx,
            refusals_rx: Mutex::new(Some(rx)),
            dropped: AtomicU64::new(0),
        }
    }
}

fn canonical(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V6(a) => a.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(addr),
        a => a,
    }
}

impl Registry {
    /// Serve `spec`'s agent if it has checked grants (forget its cgroup otherwise).
    pub(super) fn register(&self, spec: &StubSpec) {
        let mut agents = lock(&self.agents);
        if spec.grants.iter().any(|g| g.check.is_some()) {
            agents.insert(
                spec.cgroup_id,
                Arc::new(Agent {
                    spec: Arc::new(spec.clone()),
                    open: AtomicUsize::new(0),
                    seen: Mutex::default(),
                }),
            );
        } else {
            agents.remove(&spec.cgroup_id);
        }
    }

    pub(super) fn forget(&self, cgroup_id: u64) {
        lock(&self.agents).remove(&cgroup_id);
    }

    /// The stub answered `name` with `addr` for cgroup `cgroup_id`.
    pub(super) fn remember(&self, cgroup_id: u64, addr: IpAddr, name: &str) {
        let Some(a) = lock(&self.agents).get(&cgroup_id).cloned() else {
            return;
        };
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        let mut seen = lock(&a.seen);
        let addr = canonical(addr);
        if !seen.contains_key(&addr) && seen.len() >= SEEN_ADDRS {
            // Bounded: one address's memory is lost (its connects are refused until the name
            // is asked again).
            if let Some(k) = seen.keys().next().copied() {
                seen.remove(&k);
            }
        }
        let names = seen.entry(addr).or_default();
        names.retain(|n| *n != name);
        names.insert(0, name);
        names.truncate(SEEN_NAMES);
    }

    fn agent(&self, cgroup_id: u64) -> Option<Arc<Agent>> {
        lock(&self.agents).get(&cgroup_id).cloned()
    }

    pub(super) fn take_refusals(&self) -> Option<tokio::sync::mpsc::Receiver<Refusal>> {
        lock(&self.refusals_rx).take()
    }

    fn refused(&self, r: Refusal) {
        tracing::info!(
            agent = %r.agent_id,
            "SNI/Host proxy refused a connection to {} ({}: {:?}, {}; grants {})",
            r.dst, r.check, r.seen, r.reason, r.grants.join(", ")
        );
        if self.refusals.try_send(r).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Bind the proxy on 127.0.0.1 (a free port), tell the programs, and serve on the current
/// runtime. Returns the port.
pub(super) fn start(dns: &Arc<Dns>) -> std::io::Result<u16> {
    let l = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    l.set_nonblocking(true)?;
    let port = l.local_addr()?.port();
    let l = TcpListener::from_std(l)?;
    dns.net
        .set_sni_proxy_port(port)
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    tokio::spawn(serve(Arc::downgrade(dns), l, port));
    Ok(port)
}

async fn serve(dns: std::sync::Weak<Dns>, listener: TcpListener, port: u16) {
    let total = Arc::new(Semaphore::new(TOTAL));
    loop {
        let (conn, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("SNI/Host proxy: accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(dns) = dns.upgrade() else { return };
        // Whose connect this is and where it was going: only the sockops program says so, for
        // a socket the connect hook redirected (another local process finds nothing: reset).
        let net = dns.net.clone();
        let orig = net.take_sni_conn(peer.port(), port);
        let Some((orig, agent)) = orig.and_then(|o| Some((o, dns.sni.agent(o.cgroup_id)?))) else {
            tracing::debug!(
                "SNI/Host proxy: a connection from {peer} no redirect is known for: reset"
            );
            reset(conn);
            continue;
        };
        let permit = total.clone().try_acquire_owned().ok();
        if permit.is_none() || agent.open.fetch_add(1, Ordering::AcqRel) >= PER_AGENT {
            if permit.is_some() {
                agent.open.fetch_sub(1, Ordering::AcqRel);
            }
            let r = refusal(&agent, orig.dst, "tls", None, "too-many");
            let detail = format!(
                "over {PER_AGENT} connections through the proxy for this agent (or {TOTAL} for all)"
            );
            dns.sni.refused(Refusal { detail, ..r });
            reset(conn);
            continue;
        }
        tokio::spawn(async move {
            handle(&dns, &agent, conn, orig.dst).await;
            agent.open.fetch_sub(1, Ordering::AcqRel);
            drop(permit);
        });
    }
}

/// Close with a reset (the agent sees ECONNRESET, not a clean end of a checked stream).
fn reset(conn: TcpStream) {
    let _ = conn.set_zero_linger();
    drop(conn);
}

fn refusal(
    agent: &Agent,
    dst: SocketAddr,
    check: &'static str,
    seen: Option<String>,
    reason: &'static str,
) -> Refusal {
    let s = &agent.spec;
    Refusal {
        agent_id: s.agent_id.clone(),
        tenant: s.tenant.clone(),
        name: s.name.clone(),
        contract: s.contract.clone(),
        check,
        seen,
        grants: checked_grants(&s.grants, dst.port())
            .map(NameGrant::describe)
            .collect(),
        dst,
        answered_for: lock(&agent.seen)
            .get(&canonical(dst.ip()))
            .cloned()
            .unwrap_or_default(),
        reason,
        detail: String::new(),
    }
}

fn checked_grants(grants: &[NameGrant], port: u16) -> impl Iterator<Item = &NameGrant> {
    grants
        .iter()
        .filter(move |g| g.check.is_some() && g.port == port)
}

/// What the first bytes must be: TLS when the port has a `https://` grant and the first byte
/// starts a TLS record (or there is no `http://` grant), else HTTP.
fn which(grants: &[NameGrant], port: u16, first: u8) -> Check {
    let has = |c| checked_grants(grants, port).any(|g| g.check == Some(c));
    let (tls, http) = (has(Check::Tls), has(Check::Http));
    if (tls && (first == 0x16 || !http)) || (!http && first == 0x16) {
        Check::Tls
    } else {
        Check::Http
    }
}

/// A connection let on: what was checked, the name it carried, the bytes to send upstream.
type Pass = (Check, String, Vec<u8>);
/// A connection refused: what was checked, the reason, the detail, the name seen (if any).
type Refuse = (Check, &'static str, String, Option<String>);

/// The verdict on a connection's first bytes (`Ok(None)`: more bytes needed).
pub(crate) fn verdict(
    grants: &[NameGrant],
    answered_for: &[String],
    dst: SocketAddr,
    buf: &[u8],
) -> Result<Option<Pass>, Refuse> {
    let Some(first) = buf.first() else {
        return Ok(None);
    };
    let check = which(grants, dst.port(), *first);
    let fail = |e: SniffError| (check, sniff_reason(e), e.detail().to_string(), None);
    let (name, head) = match check {
        Check::Tls => match sniff::client_hello_sni(buf).map_err(fail)? {
            None => return Ok(None),
            Some(n) => (n, None),
        },
        Check::Http => match sniff::request_head(buf).map_err(fail)? {
            None => return Ok(None),
            Some(h) => (h.host.clone(), Some(h)),
        },
    };
    let refuse = |reason, detail: String| Err((check, reason, detail, Some(name.clone())));
    if !checked_grants(grants, dst.port()).any(|g| g.check == Some(check) && g.matches(&name)) {
        return refuse(
            "not-granted",
            format!("{name} is not a name the port's checked grants match"),
        );
    }
    if let Some(p) = head
        .as_ref()
        .and_then(|h| h.port)
        .filter(|p| *p != dst.port())
    {
        return refuse(
            "host-port",
            format!("Host names port {p}, the connection is to {}", dst.port()),
        );
    }
    if !answered_for.contains(&name) {
        return refuse(
            "other-address",
            format!(
                "{} was not answered for {name} (fronting on another name's address)",
                dst.ip()
            ),
        );
    }
    let out = match head {
        None => buf.to_vec(),
        // One request per connection: a second one (another Host) would not be read here.
        Some(h) => {
            let mut out = Vec::with_capacity(buf.len() + 19);
            out.extend_from_slice(&buf[..h.line_len + 2]);
            out.extend_from_slice(b"Connection: close\r\n");
            out.extend_from_slice(&buf[h.line_len + 2..]);
            out
        }
    };
    Ok(Some((check, name, out)))
}

fn sniff_reason(e: SniffError) -> &'static str {
    match e {
        SniffError::NotTls => "not-tls",
        SniffError::Malformed(_) => "malformed",
        SniffError::NoSni => "no-sni",
        SniffError::Ech => "ech",
        SniffError::TooLarge => "too-large",
        SniffError::NotHttp => "not-http",
        SniffError::Http2 => "http2",
        SniffError::Connect => "connect-method",
        SniffError::NoHost => "no-host",
    }
}

fn check_name(c: Check) -> &'static str {
    match c {
        Check::Tls => "tls",
        Check::Http => "http",
    }
}

async fn handle(dns: &Dns, agent: &Agent, mut conn: TcpStream, dst: SocketAddr) {
    let deadline = tokio::time::Instant::now() + HANDSHAKE_TIMEOUT;
    let grants = &agent.spec.grants;
    let mut buf = Vec::with_capacity(2048);
    let mut tmp = vec![0u8; 4096];
    let out = loop {
        let n = match tokio::time::timeout_at(deadline, conn.read(&mut tmp)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return, // the agent gave up: nothing went anywhere
            Ok(Ok(n)) => n,
            Err(_) => {
                let c = buf
                    .first()
                    .map_or("tls", |b| check_name(which(grants, dst.port(), *b)));
                let mut r = refusal(agent, dst, c, None, "timeout");
                r.detail = format!(
                    "no complete ClientHello or request head in {HANDSHAKE_TIMEOUT:?} ({} bytes)",
                    buf.len()
                );
                dns.sni.refused(r);
                return reset(conn);
            }
        };
        buf.extend_from_slice(&tmp[..n]);
        let answered = lock(&agent.seen)
            .get(&canonical(dst.ip()))
            .cloned()
            .unwrap_or_default();
        match verdict(grants, &answered, dst, &buf) {
            Ok(None) if buf.len() <= sniff::HELLO_MAX + 64 * 5 => continue,
            Ok(None) => {
                let mut r = refusal(agent, dst, "tls", None, "too-large");
                r.detail = SniffError::TooLarge.detail().into();
                dns.sni.refused(r);
                return reset(conn);
            }
            Ok(Some((_, _, out))) => break out,
            Err((c, reason, detail, seen)) => {
                let mut r = refusal(agent, dst, check_name(c), seen, reason);
                r.detail = detail;
                dns.sni.refused(r);
                return reset(conn);
            }
        }
    };
    let up = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(dst)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::info!(agent = %agent.spec.agent_id, "SNI/Host proxy: {dst}: {e}");
            return reset(conn);
        }
        Err(_) => {
            tracing::info!(agent = %agent.spec.agent_id, "SNI/Host proxy: {dst}: no answer in {CONNECT_TIMEOUT:?}");
            return reset(conn);
        }
    };
    let _ = up.set_nodelay(true);
    let _ = conn.set_nodelay(true);
    let _ = relay(conn, up, &out).await;
}

/// Send `first` upstream, then copy both ways, each direction on its own (a side that does not
/// read never stalls the other direction), until both ends are done or [`IDLE`] passes with no
/// byte either way; an end of one side is passed on as a shutdown of the other's write half.
async fn relay(mut a: TcpStream, mut u: TcpStream, first: &[u8]) -> std::io::Result<()> {
    u.write_all(first).await?;
    let (ar, aw) = a.split();
    let (ur, uw) = u.split();
    let t0 = tokio::time::Instant::now();
    let last = AtomicU64::new(0);
    let idle = async {
        loop {
            let since = Duration::from_millis(last.load(Ordering::Relaxed));
            let due = t0 + since + IDLE;
            if tokio::time::Instant::now() >= due {
                return;
            }
            tokio::time::sleep_until(due).await;
        }
    };
    let both = async {
        let _ = tokio::try_join!(pipe(ar, uw, &last, t0), pipe(ur, aw, &last, t0));
    };
    tokio::select! {
        _ = both => {}
        _ = idle => {}
    }
    Ok(())
}

/// Copy `r` to `w` in [`BUF`] chunks, noting the time of each (ms since `t0`) in `last`; at the
/// end of `r`, shut `w` down.
async fn pipe<R, W>(
    mut r: R,
    mut w: W,
    last: &AtomicU64,
    t0: tokio::time::Instant,
) -> std::io::Result<()>
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; BUF];
    loop {
        let n = r.read(&mut buf).await?;
        last.store(t0.elapsed().as_millis() as u64, Ordering::Relaxed);
        if n == 0 {
            return w.shutdown().await;
        }
        w.write_all(&buf[..n]).await?;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::dns::sniff::tests::{hello, sni};

    fn grants() -> Vec<NameGrant> {
        vec![
            NameGrant::new("api.example.test", 443).checked(Check::Tls),
            NameGrant::new("*.cdn.test", 443).checked(Check::Tls),
            NameGrant::new("plain.example.test", 80).checked(Check::Http),
            NameGrant::new("open.example.test", 443),
        ]
    }

    fn v(answered: &[&str], dst: &str, buf: &[u8]) -> Result<String, &'static str> {
        let a: Vec<String> = answered.iter().map(|s| s.to_string()).collect();
        match verdict(&grants(), &a, dst.parse().unwrap(), buf) {
            Ok(Some((_, n, _))) => Ok(n),
            Ok(None) => Err("more"),
            Err((_, r, _, _)) => Err(r),
        }
    }

    #[test]
    fn tls_names_must_be_granted_and_answered_for_the_address() {
        let d = "198.18.0.10:443";
        assert_eq!(
            v(&["api.example.test"], d, &hello(&[sni("api.example.test")])),
            Ok("api.example.test".into())
        );
        assert_eq!(
            v(&["x.cdn.test"], d, &hello(&[sni("X.cdn.test")])),
            Ok("x.cdn.test".into())
        );
        // Fronting: a name no checked grant matches (open.example.test is a plain grant).
        assert_eq!(
            v(&["api.example.test"], d, &hello(&[sni("evil.test")])),
            Err("not-granted")
        );
        assert_eq!(
            v(
                &["open.example.test"],
                d,
                &hello(&[sni("open.example.test")])
            ),
            Err("not-granted")
        );
        // A granted name on an address answered for another granted name.
        assert_eq!(
            v(&["x.cdn.test"], d, &hello(&[sni("api.example.test")])),
            Err("other-address")
        );
        assert_eq!(
            v(&[], d, &hello(&[sni("api.example.test")])),
            Err("other-address")
        );
        assert_eq!(v(&["api.example.test"], d, &hello(&[])), Err("no-sni"));
        assert_eq!(
            v(
                &["api.example.test"],
                d,
                &hello(&[sni("api.example.test"), (0xfe0d, vec![1])])
            ),
            Err("ech")
        );
        assert_eq!(
            v(&["api.example.test"], d, b"GET / HTTP/1.1\r\n"),
            Err("not-tls")
        );
        assert_eq!(
            v(
                &["api.example.test"],
                d,
                &hello(&[sni("api.example.test")])[..30]
            ),
            Err("more")
        );
        // The grant is for 443: on 8443 nothing matches.
        assert_eq!(
            v(
                &["api.example.test"],
                "198.18.0.10:8443",
                &hello(&[sni("api.example.test")])
            ),
            Err("not-granted")
        );
    }

    #[test]
    fn http_hosts_and_one_request_per_connection() {
        let d = "198.18.0.11:80";
        let req = b"GET / HTTP/1.1\r\nHost: plain.example.test\r\nConnection: keep-alive\r\n\r\nGET / HTTP/1.1\r\nHost: evil.test\r\n\r\n";
        let a = vec!["plain.example.test".to_string()];
        let Ok(Some((Check::Http, n, out))) = verdict(&grants(), &a, d.parse().unwrap(), req)
        else {
            panic!("refused")
        };
        assert_eq!(n, "plain.example.test");
        assert!(
            out.starts_with(b"GET / HTTP/1.1\r\nConnection: close\r\nHost: plain.example.test\r\n")
        );
        assert_eq!(out.len(), req.len() + 19);
        assert_eq!(
            v(
                &["plain.example.test"],
                d,
                b"GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n"
            ),
            Err("not-granted")
        );
        assert_eq!(
            v(
                &["plain.example.test"],
                d,
                b"GET / HTTP/1.1\r\nHost: plain.example.test:81\r\n\r\n"
            ),
            Err("host-port")
        );
        assert_eq!(
            v(
                &["plain.example.test"],
                d,
                b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
            ),
            Err("http2")
        );
        assert_eq!(
            v(&["plain.example.test"], d, b"\x16\x03\x01\x00\x05hello"),
            Err("not-http")
        );
        assert_eq!(
            v(&["plain.example.test"], d, b"SSH-2.0-OpenSSH\r\n"),
            Err("not-http")
        );
    }
}
