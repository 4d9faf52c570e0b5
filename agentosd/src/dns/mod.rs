//! DNS belongs to the daemon: one stub per agent with `net.connect` grants (UDP and TCP on
//! 127.0.0.1, the same port), to which cgroup BPF redirects the agent's every query to port 53.
//! A name outside the agent's name grants gets NXDOMAIN (with an Extended DNS Error naming the
//! contract when the query had EDNS) and never reaches an upstream; a granted name's A/AAAA query
//! is forwarded (over UDP, again over TCP when truncated), the answer's addresses (minus
//! loopback, link-local, unspecified, multicast, and private ranges unless allowed: rebinding)
//! enter the `net_names` map with the record's TTL plus a grace period, and the
//! answer goes back; other types for a granted name get an empty answer (no TXT tunnelling).
//! See docs/security.md, "Egress by name".

mod answered;
mod ranges;
pub mod sni;
pub mod sniff;
mod stub;
pub mod wire;

pub use answered::{Answered, REMEMBER_FOR};
pub use ranges::{PRIVATE, Prefix, Strip};

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::enforce::net::{NameGrant, NetEnforcer, PortGrant, Rule};

/// The port DNS queries go to (redirected to the stub by cgroup BPF).
pub const PORT: u16 = 53;
/// The grace added to an answer's TTL before its addresses are refused again
/// (`agentosd --dns-grace`): a connection begun just before the TTL ran out still gets through.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(30);
/// TTLs above this are cut to it (an upstream cannot grant an address for days).
pub const MAX_TTL: u32 = 24 * 3600;
/// How often expired entries are removed from `net_names` (the programs ignore them already).
pub const SWEEP_EVERY: Duration = Duration::from_secs(5);
/// Refusal reports waiting for the audit trail; more are counted and dropped.
const REFUSALS_QUEUED: usize = 1024;

/// The daemon's DNS settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Where granted queries go: `--dns-upstream`, or the nameservers of /etc/resolv.conf.
    pub upstreams: Vec<SocketAddr>,
    pub grace: Duration,
    /// How long one upstream has to answer (over UDP, and again over TCP when truncated).
    pub timeout: Duration,
    /// Private prefixes answers may carry (`--dns-allow-private`); the rest of [`PRIVATE`] is
    /// stripped.
    pub allow_private: Vec<Prefix>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            upstreams: Vec::new(),
            grace: DEFAULT_GRACE,
            timeout: Duration::from_secs(3),
            allow_private: Vec::new(),
        }
    }
}

/// The nameservers of a resolv.conf text, port 53 (IPv6 zone suffixes are dropped).
pub fn resolv_conf_upstreams(text: &str) -> Vec<SocketAddr> {
    text.lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            (it.next()? == "nameserver").then_some(())?;
            let a = it.next()?;
            let a: IpAddr = a.split('%').next()?.parse().ok()?;
            Some(SocketAddr::new(a, 53))
        })
        .collect()
}

/// Why an address from an answer may not be learnt or returned (`None`: it may): loopback,
/// link-local (169.254.0.0/16 and fe80::/10: the cloud metadata address among them),
/// unspecified, multicast or broadcast, never; a private or internal range ([`PRIVATE`]) unless
/// `allow_private` has it; also when written as an IPv6 address that carries the IPv4 one
/// (v4-mapped, v4-compatible, NAT64, 6to4, Teredo). A name that resolves to these (DNS
/// rebinding, at once or later) gets them stripped from its answer.
pub fn addr_refusal(a: IpAddr, allow_private: &[Prefix]) -> Option<Strip> {
    ranges::refusal(a, allow_private)
}

/// Whether `rules` reach `addr` on every port (and protocol) of `ports` already.
pub fn covered(rules: &[Rule], addr: IpAddr, ports: &[PortGrant]) -> bool {
    !ports.is_empty()
        && ports
            .iter()
            .all(|g| rules.iter().any(|r| r.covers(addr, *g)))
}

/// The ports (and protocols) of the grants that match `name`: `None` when none matches (not
/// granted).
pub fn ports_for(grants: &[NameGrant], name: &str) -> Option<Vec<PortGrant>> {
    let mut ports: Vec<PortGrant> = grants
        .iter()
        .filter(|g| g.matches(name))
        .map(NameGrant::port_grant)
        .collect();
    ports.sort_unstable();
    ports.dedup();
    (!ports.is_empty()).then_some(ports)
}

/// One agent's stub: what it answers and for whom.
#[derive(Debug, Clone)]
pub struct StubSpec {
    pub agent_id: String,
    pub tenant: String,
    pub name: String,
    /// The contract's name, for the Extended DNS Error text.
    pub contract: String,
    /// The cgroup whose `net_names` entries its answers fill (the agent's `main`).
    pub cgroup_id: u64,
    pub grants: Vec<NameGrant>,
    /// The contract's static `net.connect` rules: a private address in an answer passes when
    /// they reach it already on every port (and protocol) the name is granted (the contract's
    /// own opt-in: learning it grants nothing new).
    pub static_connect: Vec<crate::enforce::net::Rule>,
}

/// A name the stub refused, for the audit trail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub agent_id: String,
    pub tenant: String,
    pub name: String,
    pub contract: String,
    /// The name asked (empty when it could not be read).
    pub qname: String,
    pub qtype: u16,
    /// `not-granted` (NXDOMAIN), `too-long` or `bad-label` (REFUSED), `private-address` or
    /// `forbidden-address` (`addr` stripped from a granted name's answer).
    pub reason: &'static str,
    /// The address stripped from the answer (rebinding), for the `*-address` reasons.
    pub addr: Option<IpAddr>,
}

/// Errors of starting a stub.
#[derive(Debug, thiserror::Error)]
pub enum DnsError {
    #[error("binding the DNS stub on 127.0.0.1:{port}: {error}")]
    Bind { port: u16, error: std::io::Error },
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The stubs of all agents, their upstreams and the refusal reports.
pub struct Dns {
    cfg: Config,
    net: Arc<NetEnforcer>,
    stubs: Mutex<HashMap<String, stub::Stub>>,
    refusals: tokio::sync::mpsc::Sender<Refusal>,
    refusals_rx: Mutex<Option<tokio::sync::mpsc::Receiver<Refusal>>>,
    refusals_dropped: std::sync::atomic::AtomicU64,
    /// Which name each address was answered for, to name it in refusals.
    answered: Mutex<Answered>,
    /// The SNI/Host proxy's agents (those with checked grants) and refusals.
    sni: sni::Registry,
}

impl std::fmt::Debug for Dns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dns").field("cfg", &self.cfg).finish()
    }
}

impl Dns {
    /// The service over `net` (whose `net_names` map the stubs fill). Call
    /// [`Dns::spawn_sweeper`] on the runtime.
    pub fn new(cfg: Config, net: Arc<NetEnforcer>) -> Arc<Dns> {
        let (tx, rx) = tokio::sync::mpsc::channel(REFUSALS_QUEUED);
        Arc::new(Dns {
            cfg,
            net,
            stubs: Mutex::default(),
            refusals: tx,
            refusals_rx: Mutex::new(Some(rx)),
            refusals_dropped: Default::default(),
            answered: Mutex::default(),
            sni: sni::Registry::default(),
        })
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Start (or restart) agent `spec.agent_id`'s stub, on `port` when given and free (a
    /// re-adopted agent's pinned policy names it), else on a new one; returns the port.
    pub fn start(self: &Arc<Self>, spec: StubSpec, port: Option<u16>) -> Result<u16, DnsError> {
        let id = spec.agent_id.clone();
        self.start_as(&id, spec, port)
    }

    /// [`Dns::start`] under another key than the agent's id (a tool cgroup's stub, which
    /// answers for its caller's agent).
    pub fn start_as(
        self: &Arc<Self>,
        id: &str,
        spec: StubSpec,
        port: Option<u16>,
    ) -> Result<u16, DnsError> {
        let id = id.to_string();
        // The old stub (a restart of the same agent) goes first: its port is free again.
        let old = lock(&self.stubs).remove(&id);
        if let Some(o) = old.as_ref().filter(|o| o.cgroup_id() != spec.cgroup_id) {
            lock(&self.answered).forget(o.cgroup_id());
        }
        let port = port.or(old.as_ref().map(stub::Stub::port));
        if let Some(o) = &old {
            self.sni.forget(o.cgroup_id());
        }
        drop(old);
        self.sni.register(&spec);
        let s = match port.filter(|p| *p != 0) {
            Some(p) => stub::Stub::start(self.clone(), spec.clone(), p)
                .or_else(|_| stub::Stub::start(self.clone(), spec, 0))?,
            None => stub::Stub::start(self.clone(), spec, 0)?,
        };
        let port = s.port();
        lock(&self.stubs).insert(id, s);
        Ok(port)
    }

    /// Stop agent (or key) `id`'s stub (its sockets close) and forget what it answered.
    pub fn stop(&self, id: &str) {
        if let Some(s) = lock(&self.stubs).remove(id) {
            lock(&self.answered).forget(s.cgroup_id());
            self.sni.forget(s.cgroup_id());
        }
    }

    /// The name agent cgroup `cgroup_id` last asked for and got `addr` in the answer, within
    /// [`REMEMBER_FOR`] (expired or not): what a refused connect to `addr` was most likely for.
    pub fn name_of(&self, cgroup_id: u64, addr: IpAddr) -> Option<String> {
        lock(&self.answered).name_of(cgroup_id, addr, std::time::Instant::now())
    }

    fn remember(&self, cgroup_id: u64, addr: IpAddr, name: &str) {
        lock(&self.answered).remember(cgroup_id, addr, name, std::time::Instant::now());
        self.sni.remember(cgroup_id, addr, name);
    }

    /// Start the SNI/Host proxy (checked grants: `https://NAME`, `http://NAME`) on the current
    /// runtime and point the programs at it; returns its port on 127.0.0.1. Until it runs,
    /// connects that only a checked grant allows are refused (`sni-proxy-down`).
    pub fn spawn_sni_proxy(self: &Arc<Self>) -> std::io::Result<u16> {
        sni::start(self)
    }

    /// The SNI/Host proxy's refusal reports (once), for the audit trail.
    pub fn take_sni_refusals(&self) -> Option<tokio::sync::mpsc::Receiver<sni::Refusal>> {
        self.sni.take_refusals()
    }

    /// SNI/Host refusal reports dropped because the queue was full.
    pub fn sni_refusals_dropped(&self) -> u64 {
        self.sni.dropped.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether agent `id`'s stub serves [::1] too (the policy's `AGENTOS_NET_DNS6`).
    pub fn serves_v6(&self, id: &str) -> bool {
        lock(&self.stubs).get(id).is_some_and(stub::Stub::v6)
    }

    /// The port of agent `id`'s stub, if it has one.
    pub fn port_of(&self, id: &str) -> Option<u16> {
        lock(&self.stubs).get(id).map(stub::Stub::port)
    }

    /// The refusal reports (once), for the audit trail.
    pub fn take_refusals(&self) -> Option<tokio::sync::mpsc::Receiver<Refusal>> {
        lock(&self.refusals_rx).take()
    }

    /// Refusal reports dropped because the queue was full (counted, never silent).
    pub fn refusals_dropped(&self) -> u64 {
        self.refusals_dropped
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    fn refused(&self, r: Refusal) {
        if self.refusals.try_send(r).is_err() {
            self.refusals_dropped
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Remove expired `net_names` entries every [`SWEEP_EVERY`] (on the current runtime).
    pub fn spawn_sweeper(self: &Arc<Self>) {
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(SWEEP_EVERY).await;
                let Some(dns) = me.upgrade() else { return };
                let net = dns.net.clone();
                let _ = tokio::task::spawn_blocking(move || net.expire_names(boottime_ns())).await;
            }
        });
    }
}

/// CLOCK_BOOTTIME in ns: the clock of `bpf_ktime_get_boot_ns`.
pub fn boottime_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call; CLOCK_BOOTTIME
    // exists on every kernel this daemon supports, and on failure `ts` stays zero.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    (ts.tv_sec as u64).saturating_mul(1_000_000_000) + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn rebinding_filter() {
        let addr_allowed = |a: IpAddr| addr_refusal(a, &[]).is_none();
        for bad in [
            "127.0.0.1",
            "127.9.9.9",
            "169.254.169.254",
            "0.0.0.0",
            "0.1.2.3",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "fe80::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
        ] {
            assert!(!addr_allowed(bad.parse().unwrap()), "{bad}");
        }
        for good in ["198.18.0.7", "93.184.216.34", "2001:db8::1"] {
            assert!(addr_allowed(good.parse().unwrap()), "{good}");
        }
        assert!(!addr_allowed("10.0.0.1".parse().unwrap()));
        let lan: Prefix = "10.0.0.0/8".parse().unwrap();
        assert_eq!(addr_refusal("10.0.0.1".parse().unwrap(), &[lan]), None);
    }

    #[test]
    fn ports_of_matching_grants() {
        let g = vec![
            NameGrant::new("*.example.test", 443),
            NameGrant::new("named.example.test", 80),
            NameGrant::new("named.example.test", 443),
            NameGrant::new("*.example.test", 443).over_udp(),
            NameGrant::new("any.test", 0),
        ];
        let (t, u) = (PortGrant::tcp, PortGrant::udp);
        assert_eq!(
            ports_for(&g, "named.example.test"),
            Some(vec![t(80), t(443), u(443)])
        );
        assert_eq!(ports_for(&g, "x.example.test"), Some(vec![t(443), u(443)]));
        assert_eq!(ports_for(&g, "ANY.test."), Some(vec![t(0)]));
        assert_eq!(ports_for(&g, "example.test"), None);
        assert_eq!(ports_for(&g, "evil.test"), None);
    }

    #[test]
    fn resolv_conf() {
        let t = "# x\nnameserver 10.255.255.53\nsearch a\nnameserver fe80::1%eth0\nnameserver ::1\noptions x\n";
        assert_eq!(
            resolv_conf_upstreams(t),
            vec![
                "10.255.255.53:53".parse().unwrap(),
                "[fe80::1]:53".parse().unwrap(),
                "[::1]:53".parse().unwrap()
            ]
        );
    }
}
