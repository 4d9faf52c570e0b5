//! Network destinations per agent, enforced by cgroup BPF (`ebpf/net.bpf.c`).
//!
//! The programs are attached to `ROOT/agents` only, so they see nothing but agents. Each agent's
//! cgroup id maps to its granted destinations and local addresses (from the contract's
//! `net.connect` and `net.bind` scopes, host names resolved when the agent starts). A destination
//! or bind address not granted, an IPv4/IPv6 socket of an agent without a network grant or of
//! another kind than TCP/UDP, or a process under `agents/` without a policy entry, is refused
//! with EPERM and reported through the ring buffer. Dropped reports are counted in the `stats`
//! map and surfaced, never silent.
//!
//! Enforcement outlives the daemon ([`Pins`]): the links and maps are pinned in a bpffs
//! directory, so a daemon killed with SIGKILL leaves the programs attached with their policies.
//! The next daemon loads its programs onto the same pinned maps, attaches and pins them under a
//! new generation, and only then removes the old generation's pins: at every moment at least one
//! complete set is attached.

mod event;
mod names;
mod policy;
mod sni;

use std::os::fd::AsFd as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use aya::maps::{Array, HashMap, MapData, RingBuf};
use aya::programs::links::FdLink;
use aya::programs::{
    CgroupAttachMode, CgroupSkb, CgroupSkbAttachType, CgroupSock, CgroupSockAddr, SockOps,
};
use serde::Serialize;

pub use super::pins::{DEFAULT_PIN_ROOT, PinError, Pins, is_bpffs, pin_check_line};
pub use event::{Denial, RawEvent};
pub use names::{IPPROTO_TCP, IPPROTO_UDP, PortGrant, RawNameKey, RawNameValue};
pub use policy::{
    Check, NameGrant, Policy, PolicyError, Proto, RawPolicy, RawRule, Rule, RuleKind, hosts_file,
    policy_from_grants, policy_from_scopes, policy_with_dns, system_resolve,
};
pub use sni::SniOrig;

/// The network programs' pins: `ROOT/net-CGID`. Layout v5: the maps hold 16 384 agents (4 096
/// before; a daemon taking over the smaller maps would stop there). Bump it when a pinned map's
/// key, value or size changes in `ebpf/intf.h`.
pub const PIN_KIND: super::pins::PinKind = super::pins::PinKind {
    prefix: "net",
    layout: "maps-v5",
    what: "network",
};

/// Maps kept across daemons (the ring buffer too: denials while the daemon was down are read by
/// the next one). `net_names` and `dns_orig` too: addresses learnt from DNS stay allowed, and
/// replies to queries redirected to a stub keep their source rewritten, across a restart.
const PINNED_MAPS: [&str; 5] = ["net_policy", "stats", "events", "net_names", "dns_orig"];

/// The embedded object (empty when clang was missing at build time).
static NET_OBJ: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/net.bpf.o"));

/// The cgroup sock_addr program names in `ebpf/net.bpf.c`.
pub const PROGRAMS: [&str; 10] = [
    "agentos_connect4",
    "agentos_connect6",
    "agentos_sendmsg4",
    "agentos_sendmsg6",
    "agentos_bind4",
    "agentos_bind6",
    "agentos_recvmsg4",
    "agentos_recvmsg6",
    "agentos_getpeername4",
    "agentos_getpeername6",
];

/// The `sockops` program (publishes a connect redirected to the SNI/Host proxy once its local
/// port is known).
pub const SOCKOPS_PROGRAM: &str = "agentos_sockops";

/// The `cgroup/sock_create` program (family, type and protocol of every inet socket).
pub const SOCK_PROGRAM: &str = "agentos_sock_create";

/// The `cgroup_skb/ingress` program (datagrams to agents' UDP sockets from ungranted senders).
pub const SKB_PROGRAM: &str = "agentos_ingress";

/// Hooks for logs and `agentosd check`.
pub const HOOKS: &str = "cgroup/connect4, connect6, sendmsg4, sendmsg6, bind4, bind6, recvmsg4, recvmsg6, getpeername4, getpeername6, sock_create, cgroup_skb/ingress, sockops";

/// The BPF LSM program (defence in depth; loads only where the kernel allows BPF LSM).
pub const LSM_PROGRAM: &str = "agentos_lsm_connect";

/// `AGENTOS_MAX_RULES` in `ebpf/intf.h`.
pub const MAX_RULES: usize = 32;
const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;
const ALLOW_ALL: u32 = 1;
const ALLOW_ALL_BIND: u32 = 2;
const INET: u32 = 4;
const DNS: u32 = 8;
/// `AGENTOS_NET_DNS6`: the stub serves [::1]:dns_port too.
const DNS6: u32 = 16;
const RULE_CONNECT: u32 = 0;
const RULE_BIND: u32 = 1;
/// `AGENTOS_NET_RULE_UDP`, `AGENTOS_NET_RULE_TCP`: or'ed into a rule's kind, one protocol only.
const RULE_UDP: u32 = 0x100;
const RULE_TCP: u32 = 0x200;
const STAT_ALLOWED: u32 = 0;
const STAT_DENIED: u32 = 1;
const STAT_DROPPED: u32 = 2;

/// Program `name` of `bpf` as its type `P` (`missing`: what to say when it is not there).
fn program<'a, P>(bpf: &'a mut aya::Ebpf, name: &str, missing: &str) -> Result<&'a mut P, NetError>
where
    &'a mut P: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    let err = |error: String| NetError::Program {
        program: name.into(),
        error,
    };
    bpf.program_mut(name)
        .ok_or_else(|| err(missing.into()))?
        .try_into()
        .map_err(|e: aya::programs::ProgramError| err(e.to_string()))
}

/// The error of loading program `name` into the kernel (the verifier's words included).
fn load_err(name: &str) -> impl FnOnce(aya::programs::ProgramError) -> NetError + '_ {
    move |e| NetError::Program {
        program: name.into(),
        error: format!("{e}{}", super::source_chain(&e)),
    }
}

/// A cgroup program's link as a bpf_link fd, which can be pinned.
fn fd_link<L>(name: &str, link: L) -> Result<aya::programs::links::FdLink, NetError>
where
    aya::programs::links::FdLink: TryFrom<L>,
    <aya::programs::links::FdLink as TryFrom<L>>::Error: std::error::Error,
{
    aya::programs::links::FdLink::try_from(link).map_err(|e| NetError::Program {
        program: name.into(),
        error: format!("link (kernel without bpf_link?): {e}"),
    })
}

/// Attach the cgroup programs of `bpf` to `cgroup` (the directory `agents_cgroup`); with
/// `pinned`, their links are taken (to be pinned) and returned.
fn attach_cgroup_programs(
    bpf: &mut aya::Ebpf,
    agents_cgroup: &Path,
    cgroup: std::os::fd::BorrowedFd<'_>,
    pinned: bool,
) -> Result<Vec<(String, FdLink)>, NetError> {
    let prog_err = |name: &str, what: &str, e: &dyn std::error::Error| NetError::Program {
        program: name.into(),
        error: format!("{what}: {e}{}", super::source_chain(e)),
    };
    let mut links: Vec<(String, FdLink)> = Vec::new();
    // A bpf_link (kernel >= 5.7) always attaches in multi mode and must be created with no
    // flags: `Single` is aya's "no flags" (AllowMultiple gives EINVAL here).
    let mode = CgroupAttachMode::Single;
    let attach_err = |name: &str, e: &dyn std::error::Error| {
        prog_err(name, &format!("attach to {}", agents_cgroup.display()), e)
    };
    let mut keep = |name: &str, link: Result<FdLink, NetError>| {
        link.map(|fd| links.push((name.to_string(), fd)))
    };
    for name in PROGRAMS {
        let prog = program::<CgroupSockAddr>(bpf, name, "not loaded")?;
        let id = prog
            .attach(cgroup, mode)
            .map_err(|e| attach_err(name, &e))?;
        if pinned {
            let link = prog
                .take_link(id)
                .map_err(|e| prog_err(name, "take link", &e))?;
            keep(name, fd_link(name, link))?;
        }
    }
    let sock = program::<CgroupSock>(bpf, SOCK_PROGRAM, "not loaded")?;
    let id = sock
        .attach(cgroup, mode)
        .map_err(|e| attach_err(SOCK_PROGRAM, &e))?;
    if pinned {
        let link = sock
            .take_link(id)
            .map_err(|e| prog_err(SOCK_PROGRAM, "take link", &e))?;
        keep(SOCK_PROGRAM, fd_link(SOCK_PROGRAM, link))?;
    }
    let skb = program::<CgroupSkb>(bpf, SKB_PROGRAM, "not loaded")?;
    let id = skb
        .attach(cgroup, CgroupSkbAttachType::Ingress, mode)
        .map_err(|e| attach_err(SKB_PROGRAM, &e))?;
    if pinned {
        let link = skb
            .take_link(id)
            .map_err(|e| prog_err(SKB_PROGRAM, "take link", &e))?;
        keep(SKB_PROGRAM, fd_link(SKB_PROGRAM, link))?;
    }
    let ops = program::<SockOps>(bpf, SOCKOPS_PROGRAM, "not loaded")?;
    let id = ops
        .attach(cgroup, mode)
        .map_err(|e| attach_err(SOCKOPS_PROGRAM, &e))?;
    if pinned {
        let link = ops
            .take_link(id)
            .map_err(|e| prog_err(SOCKOPS_PROGRAM, "take link", &e))?;
        keep(SOCKOPS_PROGRAM, fd_link(SOCKOPS_PROGRAM, link))?;
    }
    Ok(links)
}

/// Errors of loading and using the programs.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error(
        "the BPF programs were not built (clang or libbpf-dev missing when agentosd was compiled)"
    )]
    NotBuilt,
    #[error("loading ebpf/net.bpf.o: {0}")]
    Load(String),
    #[error("BPF program {program}: {error}")]
    Program { program: String, error: String },
    #[error("BPF map {map}: {error}")]
    Map { map: &'static str, error: String },
    #[error("opening cgroup {path}: {error}")]
    Cgroup { path: String, error: std::io::Error },
    #[error(transparent)]
    Pin(#[from] PinError),
}

/// Counters from the `stats` map.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Stats {
    pub allowed: u64,
    pub denied: u64,
    /// Denials not reported as events because the ring buffer was full.
    pub events_dropped: u64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

struct Maps {
    policy: HashMap<MapData, u64, RawPolicy>,
    stats: Array<MapData, u64>,
    /// Addresses the agents' DNS stubs answered (`net_names`).
    names: HashMap<MapData, RawNameKey, RawNameValue>,
    /// Entries per agent cgroup in `names` (refreshed by [`NetEnforcer::expire_names`]).
    names_per_agent: std::collections::HashMap<u64, usize>,
}

/// The loaded programs, their maps and the agents they know.
pub struct NetEnforcer {
    bpf: Mutex<aya::Ebpf>,
    maps: Mutex<Maps>,
    /// The SNI/Host proxy's maps (`sni_conns`, `sni_cfg`).
    sni: Mutex<sni::SniMaps>,
    events: Mutex<Option<RingBuf<MapData>>>,
    /// The agents with an entry in the policy map (and those cleared recently).
    agents: super::AgentCgroups,
    attached: Mutex<Option<String>>,
    /// The BPF LSM program: `Ok(true)` attached, `Ok(false)` loaded, `Err` why not.
    lsm: Mutex<Result<bool, String>>,
    /// Where the links and maps are pinned (`None`: they live as long as this value).
    pins: Option<Pins>,
    /// The links this daemon pinned (the pins keep them attached; the fds are only kept).
    pinned: Mutex<Vec<aya::programs::links::PinnedLink>>,
}

impl std::fmt::Debug for NetEnforcer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetEnforcer")
            .field("attached", &*lock(&self.attached))
            .field("pins", &self.pins)
            .finish()
    }
}

impl NetEnforcer {
    /// Load the programs into the kernel (not attached yet), with maps of their own.
    pub fn load() -> Result<Arc<NetEnforcer>, NetError> {
        Self::load_pinned(None)
    }

    /// Load the programs; with `pins`, onto the maps pinned there (those a previous daemon
    /// left, with its agents' policies), pinning new ones where there are none.
    pub fn load_pinned(pins: Option<Pins>) -> Result<Arc<NetEnforcer>, NetError> {
        if NET_OBJ.is_empty() {
            return Err(NetError::NotBuilt);
        }
        let mut loader = aya::EbpfLoader::new();
        let paths: Vec<(&str, PathBuf)> = pins
            .iter()
            .flat_map(|p| PINNED_MAPS.map(|m| (m, p.map(m))))
            .collect();
        for (name, path) in &paths {
            loader.map_pin_path(name, path.as_path());
        }
        let mut bpf = loader
            .load(NET_OBJ)
            .map_err(|e| NetError::Load(format!("{e}{}", super::source_chain(&e))))?;
        for name in PROGRAMS {
            program::<CgroupSockAddr>(&mut bpf, name, "not in the object")?
                .load()
                .map_err(load_err(name))?;
        }
        program::<CgroupSock>(&mut bpf, SOCK_PROGRAM, "not in the object")?
            .load()
            .map_err(load_err(SOCK_PROGRAM))?;
        program::<CgroupSkb>(&mut bpf, SKB_PROGRAM, "not in the object")?
            .load()
            .map_err(load_err(SKB_PROGRAM))?;
        program::<SockOps>(&mut bpf, SOCKOPS_PROGRAM, "not in the object")?
            .load()
            .map_err(load_err(SOCKOPS_PROGRAM))?;
        let lsm = load_lsm(&mut bpf);
        let map_err = |map: &'static str| {
            move |e: aya::maps::MapError| NetError::Map {
                map,
                error: e.to_string(),
            }
        };
        let take = |bpf: &mut aya::Ebpf, map: &'static str| {
            bpf.take_map(map).ok_or(NetError::Map {
                map,
                error: "not in the object".into(),
            })
        };
        let policy =
            HashMap::try_from(take(&mut bpf, "net_policy")?).map_err(map_err("net_policy"))?;
        let stats = Array::try_from(take(&mut bpf, "stats")?).map_err(map_err("stats"))?;
        let names =
            HashMap::try_from(take(&mut bpf, "net_names")?).map_err(map_err("net_names"))?;
        let events = RingBuf::try_from(take(&mut bpf, "events")?).map_err(map_err("events"))?;
        let sni_conns =
            HashMap::try_from(take(&mut bpf, "sni_conns")?).map_err(map_err("sni_conns"))?;
        let sni_cfg = Array::try_from(take(&mut bpf, "sni_cfg")?).map_err(map_err("sni_cfg"))?;
        Ok(Arc::new(NetEnforcer {
            bpf: Mutex::new(bpf),
            maps: Mutex::new(Maps {
                policy,
                stats,
                names,
                names_per_agent: Default::default(),
            }),
            sni: Mutex::new(sni::SniMaps {
                conns: sni_conns,
                cfg: sni_cfg,
            }),
            events: Mutex::new(Some(events)),
            agents: super::AgentCgroups::default(),
            attached: Mutex::new(None),
            lsm: Mutex::new(lsm),
            pins,
            pinned: Mutex::new(Vec::new()),
        }))
    }

    /// Where the links and maps are pinned, if they are.
    pub fn pins(&self) -> Option<&Pins> {
        self.pins.as_ref()
    }

    /// Attach the programs to `agents_cgroup` (the daemon's `ROOT/agents`; never a cgroup that
    /// holds anything but agents). Unpinned, they stay attached while this value lives. Pinned,
    /// the links are pinned under a new generation and only then are the previous daemons' pins
    /// removed (which detaches their links): the agents are never without a complete set.
    pub fn attach(&self, agents_cgroup: &Path) -> Result<(), NetError> {
        let dir = std::fs::File::open(agents_cgroup).map_err(|error| NetError::Cgroup {
            path: agents_cgroup.display().to_string(),
            error,
        })?;
        let old = self.pins.as_ref().map(Pins::links).unwrap_or_default();
        let generation = super::pins::next_generation(&old);
        let mut bpf = lock(&self.bpf);
        let pinned = self.pins.is_some();
        let mut links = attach_cgroup_programs(&mut bpf, agents_cgroup, dir.as_fd(), pinned)?;
        *lock(&self.attached) = Some(agents_cgroup.display().to_string());
        self.attach_lsm(&mut bpf, &mut links);
        drop(bpf);
        if let Some(pins) = &self.pins {
            pins.take_over(links, generation, &old, &mut lock(&self.pinned))?;
        }
        Ok(())
    }

    /// Attach the BPF LSM program if it loaded and is not attached yet; its link joins `links`
    /// when the links are pinned. Failure is kept as the LSM status, never an error.
    fn attach_lsm(&self, bpf: &mut aya::Ebpf, links: &mut Vec<(String, FdLink)>) {
        let mut lsm = lock(&self.lsm);
        if matches!(*lsm, Ok(false)) {
            let r = bpf
                .program_mut(LSM_PROGRAM)
                .and_then(|p| <&mut aya::programs::Lsm>::try_from(p).ok())
                .ok_or_else(|| "not loaded".to_string())
                .and_then(|p| {
                    let id = p
                        .attach()
                        .map_err(|e| format!("attach: {e}{}", super::source_chain(&e)))?;
                    if self.pins.is_some() {
                        let link = p.take_link(id).map_err(|e| format!("take link: {e}"))?;
                        links.push((LSM_PROGRAM.to_string(), link.into()));
                    }
                    Ok(())
                });
            *lsm = r.map(|_| true);
        }
    }

    /// Remove every pin (the links detach, the maps go with the last program): for a daemon
    /// that stops its agents on exit. Agents still running would be refused nothing by BPF.
    pub fn unpin(&self) {
        let Some(pins) = &self.pins else { return };
        lock(&self.pinned).clear();
        if let Err(e) = std::fs::remove_dir_all(&pins.dir) {
            tracing::warn!("removing the BPF pins {}: {e}", pins.dir.display());
        }
    }

    /// Forget the entries of cgroups that belong to no known agent (agents that ended while
    /// the daemon was down left them in the pinned map). Call after re-adoption.
    pub fn forget_unknown(&self) -> usize {
        let mut maps = lock(&self.maps);
        let keys: Vec<u64> = maps.policy.keys().flatten().collect();
        let mut n = 0;
        for k in keys {
            if self.agents.agent_of(k).is_none() && maps.policy.remove(&k).is_ok() {
                n += 1;
            }
        }
        n
    }

    /// The BPF LSM program's state: `Ok(())` attached, or why it is not.
    pub fn lsm_status(&self) -> Result<(), String> {
        match &*lock(&self.lsm) {
            Ok(true) => Ok(()),
            Ok(false) => Err("loaded, not attached".into()),
            Err(e) => Err(e.clone()),
        }
    }

    /// Where the programs are attached, if they are.
    pub fn attached_to(&self) -> Option<String> {
        lock(&self.attached).clone()
    }

    /// Install (or replace) agent `id`'s policy under its cgroup id.
    pub fn set_policy(
        &self,
        id: &str,
        tenant: &str,
        name: &str,
        cgroup_id: u64,
        policy: &Policy,
    ) -> Result<(), NetError> {
        let raw = policy.raw();
        let old = self.agents.cgroup_of(id);
        let mut maps = lock(&self.maps);
        if let Some(old) = old.filter(|o| *o != cgroup_id) {
            let _ = maps.policy.remove(&old);
        }
        maps.policy
            .insert(cgroup_id, raw, 0)
            .map_err(|e| NetError::Map {
                map: "net_policy",
                error: e.to_string(),
            })?;
        self.agents.insert(id, cgroup_id, tenant, name);
        Ok(())
    }

    /// Remove agent `id`'s entry and the addresses its DNS stub answered (its cgroup is gone
    /// or going).
    pub fn clear(&self, id: &str) {
        if let Some(cg) = self.agents.remove(id) {
            let mut maps = lock(&self.maps);
            let _ = maps.policy.remove(&cg);
            names::remove_where(&mut maps.names, |k, _| k.cgroup_id == cg);
            maps.names_per_agent.remove(&cg);
        }
    }

    /// The policy entry of cgroup `cgroup_id` now (a pinned one a previous daemon left, too).
    pub fn policy_of(&self, cgroup_id: u64) -> Option<RawPolicy> {
        lock(&self.maps).policy.get(&cgroup_id, 0).ok()
    }

    /// Allow cgroup `cgroup_id` to reach `addr` on `ports` until `expires` (CLOCK_BOOTTIME, ns):
    /// merged with what is there (ports joined, the later expiry). Refused past
    /// [`names::MAX_PER_AGENT`] addresses for one agent (the map is shared).
    pub fn learn_name(
        &self,
        cgroup_id: u64,
        addr: std::net::IpAddr,
        ports: &[PortGrant],
        expires: u64,
    ) -> Result<(), NetError> {
        let mut maps = lock(&self.maps);
        let maps = &mut *maps;
        names::learn(
            &mut maps.names,
            &mut maps.names_per_agent,
            cgroup_id,
            addr,
            ports,
            expires,
        )
    }

    /// Remove the entries of `net_names` that expired before `now` (CLOCK_BOOTTIME, ns) and
    /// recount each agent's; returns how many went.
    pub fn expire_names(&self, now: u64) -> usize {
        let mut maps = lock(&self.maps);
        let n = names::remove_where(&mut maps.names, |_, v| v.expires_ns <= now);
        let mut counts = std::collections::HashMap::new();
        for k in maps.names.keys().flatten() {
            *counts.entry(k.cgroup_id).or_insert(0usize) += 1;
        }
        maps.names_per_agent = counts;
        n
    }

    /// The entry of `net_names` for (`cgroup_id`, `addr`), if any.
    pub fn name_entry(&self, cgroup_id: u64, addr: std::net::IpAddr) -> Option<RawNameValue> {
        lock(&self.maps)
            .names
            .get(&RawNameKey::new(cgroup_id, addr), 0)
            .ok()
    }

    /// The agent (tenant, name) whose cgroup has this id.
    pub fn agent_of(&self, cgroup_id: u64) -> Option<(String, String)> {
        self.agents.agent_of(cgroup_id)
    }

    /// Entries in the policy map now.
    pub fn entries(&self) -> usize {
        lock(&self.maps).policy.keys().count()
    }

    pub fn stats(&self) -> Stats {
        let maps = lock(&self.maps);
        let get = |i: u32| maps.stats.get(&i, 0).unwrap_or(0);
        Stats {
            allowed: get(STAT_ALLOWED),
            denied: get(STAT_DENIED),
            events_dropped: get(STAT_DROPPED),
        }
    }

    /// Send connects that only a checked grant allows to the SNI/Host proxy on 127.0.0.1:`port`
    /// (0: refuse them, `sni-proxy-down`).
    pub fn set_sni_proxy_port(&self, port: u16) -> Result<(), NetError> {
        sni::set_port(&mut lock(&self.sni), port)
    }

    /// Where the connect the proxy accepted from local port `sport` on its port `proxy_port`
    /// was going, and whose it is; removed from the map (each is read once).
    pub fn take_sni_conn(&self, sport: u16, proxy_port: u16) -> Option<SniOrig> {
        sni::take(&mut lock(&self.sni), sport, proxy_port)
    }

    /// The ring buffer of denials (once).
    pub fn take_events(&self) -> Option<RingBuf<MapData>> {
        lock(&self.events).take()
    }
}

/// Load `lsm/socket_connect`; on kernels that refuse BPF LSM (lockdown, `lsm=` without bpf)
/// this fails with the kernel's reason, which the daemon reports.
fn load_lsm(bpf: &mut aya::Ebpf) -> Result<bool, String> {
    let btf = aya::Btf::from_sys_fs().map_err(|e| format!("no kernel BTF: {e}"))?;
    let prog: &mut aya::programs::Lsm = bpf
        .program_mut(LSM_PROGRAM)
        .ok_or_else(|| "not in the object".to_string())?
        .try_into()
        .map_err(|e: aya::programs::ProgramError| e.to_string())?;
    prog.load("socket_connect", &btf).map_err(|e| {
        let chain = super::source_chain(&e);
        if chain.contains("Operation not permitted") || chain.contains("os error 1)") {
            "refused (EPERM): this kernel does not allow BPF LSM programs (lockdown, or lsm= lacks bpf)".to_string()
        } else {
            format!("{e}{chain}")
        }
    })?;
    Ok(false)
}

/// Read denials from `ring` as they come and hand each to `on_denial`, within the daemon's
/// budget for a ring ([`super::read_ring`]). Returns only when the fd cannot be polled.
pub async fn read_events(ring: RingBuf<MapData>, on_denial: impl FnMut(Denial)) {
    super::read_ring(ring, "network BPF", Denial::decode, on_denial).await
}

/// Try to load (not attach) the programs: for `agentosd check`.
pub fn probe_load() -> Result<(), NetError> {
    NetEnforcer::load().map(|_| ())
}
