//! Filesystem scopes per agent, enforced by BPF LSM programs (`ebpf/fs.bpf.c`): defence in depth
//! behind Landlock, on kernels that allow BPF LSM (not on hosts with lockdown: the daemon says so
//! and relies on Landlock).
//!
//! One source: the agent's Landlock [`Plan`](crate::sandbox::landlock::Plan) (the contract's
//! `fs.read`/`fs.write`/`fs.exec` scopes, the sandbox's baseline system paths, the agent's home)
//! becomes a set of path prefixes with the rights Landlock gives them. `lsm/file_open` checks
//! reads and writes,
//! `lsm/bprm_check_security` execs, both by the longest granted prefix of the file's path in an
//! LPM trie keyed by (cgroup id, path). Refusals are EACCES and go to the ring buffer `fs_events`,
//! which the daemon appends to the audit trail as kernel denials (`mechanism: bpf-lsm`).
//! Optional programs ([`OPTIONAL`]; the daemon runs without each, saying what is then open):
//! `lsm/socket_bind` refuses agents' binds of abstract Unix socket names and `lsm/socket_listen`
//! listen() on an unbound inet socket (EPERM, with events in the same ring buffer);
//! `lsm/mmap_file` refuses executable mappings of files outside the exec grants and
//! `lsm/file_mprotect` making any file mapping executable (the hook gives no path to check)
//! (EACCES, with events), which closes the dynamic loader run by hand and dlopen() of an
//! agent's own files.
//!
//! Differences from Landlock, all in the direction of allowing more (never refusing what
//! Landlock allows): prefixes are paths resolved when the agent starts (Landlock rules hold
//! inodes, so a bind mount of a granted tree elsewhere is allowed by Landlock and refused here;
//! agents have no mount namespace of their own, so this does not arise for the baseline);
//! prefixes longer than [`PATH_KEY`] bytes are cut back to a directory (widened, with a note);
//! exec opens of ELF interpreters (`PT_INTERP`) are checked for read here and for execute by
//! Landlock only. See docs/security.md.
//!
//! Enforcement outlives the daemon ([`pins`]): like the network programs' (`net`), the links and
//! the policy maps are pinned in bpffs (`ROOT/fs-CGID`), so a daemon killed with SIGKILL leaves
//! the programs attached with the agents' scopes, and the next one takes them over.

mod event;
mod pins;
mod policy;
pub mod unix;

use std::collections::HashMap as StdHashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use aya::maps::lpm_trie::{Key, LpmTrie};
use aya::maps::{Array, HashMap, MapData, RingBuf};
use serde::Serialize;

pub use event::{Denial, RawEvent};
pub use pins::{PIN_KIND, setup};
pub use policy::{Policy, RawKeyData, access_name, key_for};
pub use unix::{UnixDirKey, UnixScope};

/// The embedded object (empty when clang was missing at build time).
static FS_OBJ: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/fs.bpf.o"));

/// Whether agentosd was built with the programs (clang and libbpf-dev were there).
pub fn built() -> bool {
    !FS_OBJ.is_empty()
}

/// Program name in `ebpf/fs.bpf.c` and the LSM hook it attaches to.
pub const PROGRAMS: [(&str, &str); 2] = [
    ("agentos_lsm_file_open", "file_open"),
    ("agentos_lsm_bprm_check", "bprm_check_security"),
];

/// A program the daemon runs without, saying so, when it does not load or attach.
#[derive(Debug, Clone, Copy)]
pub struct Optional {
    pub name: &'static str,
    pub hook: &'static str,
    /// What it closes, for the log when it is active.
    pub does: &'static str,
    /// What stays open without it.
    pub without: &'static str,
}

pub const OPTIONAL: [Optional; 6] = [
    Optional {
        name: "agentos_lsm_socket_bind",
        hook: "socket_bind",
        does: "agents bind no abstract Unix socket names",
        without: "agents with network grants can bind abstract Unix socket names",
    },
    Optional {
        name: "agentos_lsm_mmap_file",
        hook: "mmap_file",
        does: "agents map files executable only under their exec grants",
        without: "an agent can map a file outside its exec grants executable (the dynamic loader run by hand, dlopen)",
    },
    Optional {
        name: "agentos_lsm_file_mprotect",
        hook: "file_mprotect",
        does: "agents make no file mapping executable with mprotect (mmap checks the path)",
        without: "an agent can make a mapping of a file outside its exec grants executable (mprotect)",
    },
    Optional {
        name: "agentos_lsm_socket_listen",
        hook: "socket_listen",
        does: "agents listen only on sockets bound to a granted port",
        without: "an agent with a net.bind grant can listen() on an unbound socket, on a port the kernel picks",
    },
    Optional {
        name: "agentos_lsm_unix_stream_connect",
        hook: "unix_stream_connect",
        does: "agents connect (stream, seqpacket) only to pathname Unix sockets of their own or beneath their grants",
        without: UNIX_WITHOUT,
    },
    Optional {
        name: "agentos_lsm_unix_may_send",
        hook: "unix_may_send",
        does: "agents send datagrams only to pathname Unix sockets of their own or beneath their grants",
        without: UNIX_WITHOUT,
    },
];

/// What stays open without the two Unix socket programs (and Landlock ABI 9).
const UNIX_WITHOUT: &str = "without Landlock ABI 9 an agent can connect and send to every pathname Unix socket its uid may write (the D-Bus system bus, journald)";

/// The LSM hooks of the pathname Unix socket fence (both needed).
pub const UNIX_HOOKS: [&str; 2] = ["unix_stream_connect", "unix_may_send"];

/// `AGENTOS_FS_PATH_KEY`: bytes of path a prefix key holds.
pub const PATH_KEY: usize = 248;
/// `AGENTOS_FS_EVENT_PATH`.
pub const EVENT_PATH: usize = 256;
pub const READ: u8 = 1;
pub const WRITE: u8 = 2;
pub const EXEC: u8 = 4;
const HOOK_FILE_OPEN: u8 = 5;
const HOOK_BPRM_CHECK: u8 = 6;
const HOOK_MMAP_FILE: u8 = 10;
const HOOK_FILE_MPROTECT: u8 = 11;
const HOOK_SOCKET_BIND: u8 = 13;
const HOOK_SOCKET_LISTEN: u8 = 14;
const HOOK_UNIX_CONNECT: u8 = 15;
const HOOK_UNIX_SEND: u8 = 16;
const EV_PATH_CUT: u8 = 1;
const EV_NO_PREFIX: u8 = 2;
const STAT_ALLOWED: u32 = 0;
const STAT_DENIED: u32 = 1;
const STAT_DROPPED: u32 = 2;
const STAT_UNCHECKED: u32 = 3;

/// Errors of loading and using the programs.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    #[error(
        "the BPF programs were not built (clang or libbpf-dev missing when agentosd was compiled)"
    )]
    NotBuilt,
    #[error("loading ebpf/fs.bpf.o: {0}")]
    Load(String),
    #[error("BPF LSM program {program}: {error}")]
    Program { program: String, error: String },
    #[error("BPF map {map}: {error}")]
    Map { map: &'static str, error: String },
    #[error(transparent)]
    Pin(#[from] super::pins::PinError),
}

/// Counters of the `fs_stats` map.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Stats {
    pub allowed: u64,
    pub denied: u64,
    pub events_dropped: u64,
    /// Agent opens not checked (internal mounts, pseudo filesystems, no path).
    pub unchecked: u64,
}

struct Maps {
    agents: HashMap<MapData, u64, u32>,
    unix_agents: HashMap<MapData, u64, u64>,
    unix_dirs: HashMap<MapData, UnixDirKey, u32>,
    prefixes: LpmTrie<MapData, RawKeyData, u32>,
    stats: Array<MapData, u64>,
}

/// The loaded (and, after [`FsEnforcer::attach`], attached) programs and their maps.
pub struct FsEnforcer {
    bpf: Mutex<aya::Ebpf>,
    maps: Mutex<Maps>,
    events: Mutex<Option<RingBuf<MapData>>>,
    /// The agents with entries in the maps (and those cleared recently).
    agents: super::AgentCgroups,
    /// Agent id → the prefix keys installed for it.
    keys: Mutex<StdHashMap<String, Vec<Key<RawKeyData>>>>,
    /// Agent id → the `fs_unix_dirs` keys installed for it.
    unix_keys: Mutex<StdHashMap<String, Vec<UnixDirKey>>>,
    attached: Mutex<bool>,
    /// For each of [`OPTIONAL`], why it did not load (`None`: loaded).
    optional_errors: [Option<String>; OPTIONAL.len()],
    /// Where the links and maps are pinned (`None`: they live as long as this value).
    pins: Option<super::pins::Pins>,
    /// The links this daemon pinned (the pins keep them attached; the fds are only kept).
    pinned: Mutex<Vec<aya::programs::links::PinnedLink>>,
    /// What of the previous daemon's pins goes once the agents are re-adopted.
    retire: Mutex<pins::Retire>,
}

impl std::fmt::Debug for FsEnforcer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FsEnforcer")
            .field("attached", &*lock(&self.attached))
            .field("pins", &self.pins)
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl FsEnforcer {
    /// Load both LSM programs (not attached yet). Fails with the kernel's reason where BPF LSM
    /// is refused (lockdown, `lsm=` without bpf).
    pub fn load() -> Result<Arc<FsEnforcer>, FsError> {
        Self::load_pinned(None)
    }

    /// Load the programs; with `pins`, onto the maps pinned there (those a previous daemon
    /// left, with its agents' scopes), pinning new ones where there are none.
    pub fn load_pinned(pins: Option<super::pins::Pins>) -> Result<Arc<FsEnforcer>, FsError> {
        if FS_OBJ.is_empty() {
            return Err(FsError::NotBuilt);
        }
        let mut loader = aya::EbpfLoader::new();
        let paths: Vec<(&str, PathBuf)> = pins
            .iter()
            .flat_map(|p| pins::PINNED_MAPS.map(|m| (m, p.map(m))))
            .collect();
        for (name, path) in &paths {
            loader.map_pin_path(name, path.as_path());
        }
        let mut bpf = loader
            .load(FS_OBJ)
            .map_err(|e| FsError::Load(format!("{e}{}", super::source_chain(&e))))?;
        let btf = aya::Btf::from_sys_fs().map_err(|e| FsError::Program {
            program: PROGRAMS[0].0.into(),
            error: format!("no kernel BTF: {e}"),
        })?;
        for (name, hook) in PROGRAMS {
            let err = |error: String| FsError::Program {
                program: format!("{name} (lsm/{hook})"),
                error,
            };
            let prog: &mut aya::programs::Lsm = bpf
                .program_mut(name)
                .ok_or_else(|| err("not in the object".into()))?
                .try_into()
                .map_err(|e: aya::programs::ProgramError| err(e.to_string()))?;
            prog.load(hook, &btf).map_err(|e| {
                let chain = super::source_chain(&e);
                if chain.contains("Operation not permitted") || chain.contains("os error 1)") {
                    err("refused (EPERM): this kernel does not allow BPF LSM programs (lockdown, or lsm= lacks bpf)".into())
                } else {
                    err(format!("{e}{chain}"))
                }
            })?;
        }
        let optional_errors = OPTIONAL.map(|o| {
            match bpf
                .program_mut(o.name)
                .and_then(|p| <&mut aya::programs::Lsm>::try_from(p).ok())
            {
                None => Some("not in the object".to_string()),
                Some(prog) => prog
                    .load(o.hook, &btf)
                    .err()
                    .map(|e| format!("{e}{}", super::source_chain(&e))),
            }
        });
        let map_err = |map: &'static str| {
            move |e: aya::maps::MapError| FsError::Map {
                map,
                error: e.to_string(),
            }
        };
        let take = |bpf: &mut aya::Ebpf, map: &'static str| {
            bpf.take_map(map).ok_or(FsError::Map {
                map,
                error: "not in the object".into(),
            })
        };
        let agents =
            HashMap::try_from(take(&mut bpf, "fs_agents")?).map_err(map_err("fs_agents"))?;
        let unix_agents = HashMap::try_from(take(&mut bpf, "fs_unix_agents")?)
            .map_err(map_err("fs_unix_agents"))?;
        let unix_dirs =
            HashMap::try_from(take(&mut bpf, "fs_unix_dirs")?).map_err(map_err("fs_unix_dirs"))?;
        let prefixes =
            LpmTrie::try_from(take(&mut bpf, "fs_prefixes")?).map_err(map_err("fs_prefixes"))?;
        let stats = Array::try_from(take(&mut bpf, "fs_stats")?).map_err(map_err("fs_stats"))?;
        let events =
            RingBuf::try_from(take(&mut bpf, "fs_events")?).map_err(map_err("fs_events"))?;
        Ok(Arc::new(FsEnforcer {
            bpf: Mutex::new(bpf),
            maps: Mutex::new(Maps {
                agents,
                unix_agents,
                unix_dirs,
                prefixes,
                stats,
            }),
            events: Mutex::new(Some(events)),
            agents: super::AgentCgroups::default(),
            keys: Mutex::default(),
            unix_keys: Mutex::default(),
            attached: Mutex::new(false),
            optional_errors,
            pins,
            pinned: Mutex::default(),
            retire: Mutex::default(),
        }))
    }

    /// Attach the programs (global LSM hooks; they act only on cgroups with an entry).
    /// Unpinned, they stay attached while this value lives. Pinned, their links are pinned under
    /// a new generation; the previous daemon's stay until [`FsEnforcer::adopted`], so the agents
    /// are never without a complete set.
    pub fn attach(&self) -> Result<(), FsError> {
        let old = self.pins.as_ref().map(|p| p.links()).unwrap_or_default();
        let generation = super::pins::next_generation(&old);
        let keep = self.pins.is_some();
        let mut links = Vec::new();
        let mut bpf = lock(&self.bpf);
        for (name, hook) in PROGRAMS {
            let err = |error: String| FsError::Program {
                program: format!("{name} (lsm/{hook})"),
                error,
            };
            let prog = bpf
                .program_mut(name)
                .and_then(|p| <&mut aya::programs::Lsm>::try_from(p).ok())
                .ok_or_else(|| err("not loaded".into()))?;
            let id = prog
                .attach()
                .map_err(|e| err(format!("attach: {e}{}", super::source_chain(&e))))?;
            if keep {
                let link = prog
                    .take_link(id)
                    .map_err(|e| err(format!("take link: {e}")))?;
                links.push((name.to_string(), link.into()));
            }
        }
        *lock(&self.attached) = true;
        for (o, err) in OPTIONAL.iter().zip(&self.optional_errors) {
            if err.is_some() {
                continue;
            }
            let Some(prog) = bpf
                .program_mut(o.name)
                .and_then(|p| <&mut aya::programs::Lsm>::try_from(p).ok())
            else {
                continue;
            };
            let r = prog.attach().and_then(|id| match keep {
                true => prog.take_link(id).map(|l| Some(l.into())),
                false => Ok(None),
            });
            match r {
                Ok(Some(link)) => links.push((o.name.to_string(), link)),
                Ok(None) => {}
                Err(e) => tracing::warn!(
                    "BPF LSM: {} (lsm/{}) did not attach: {e}; {}",
                    o.name,
                    o.hook,
                    o.without
                ),
            }
        }
        drop(bpf);
        if let Some(p) = &self.pins {
            p.pin_links(links, generation, &mut lock(&self.pinned))?;
            *lock(&self.retire) = pins::Retire::Links { generation, old };
        }
        Ok(())
    }

    /// Whether the optional program for LSM hook `hook` (`socket_bind`, `mmap_file`,
    /// `file_mprotect`) loaded, or why not.
    pub fn optional_status(&self, hook: &str) -> Result<(), String> {
        match OPTIONAL.iter().position(|o| o.hook == hook) {
            None => Err(format!("no optional program for lsm/{hook}")),
            Some(i) => match &self.optional_errors[i] {
                None => Ok(()),
                Some(e) => Err(e.clone()),
            },
        }
    }

    /// Whether the abstract-bind program loaded, or why not.
    pub fn bind_status(&self) -> Result<(), String> {
        self.optional_status("socket_bind")
    }

    /// Whether both programs of the pathname Unix socket fence loaded, or why not.
    pub fn unix_status(&self) -> Result<(), String> {
        UNIX_HOOKS
            .iter()
            .try_for_each(|h| self.optional_status(h).map_err(|e| format!("lsm/{h}: {e}")))
    }

    /// Whether both programs checking executable file mappings loaded, or why not.
    pub fn exec_map_status(&self) -> Result<(), String> {
        self.optional_status("mmap_file")
            .and_then(|()| self.optional_status("file_mprotect"))
    }

    /// Install (or replace) agent `id`'s policy under its cgroup id: the prefixes first, the
    /// cgroup's entry in `fs_agents` last, so the check starts with the whole policy in place.
    pub fn set_policy(
        &self,
        id: &str,
        tenant: &str,
        name: &str,
        cgroup_id: u64,
        policy: &Policy,
    ) -> Result<(), FsError> {
        let keys = policy.keys(cgroup_id);
        let unix_keys = policy
            .unix
            .as_ref()
            .map(|u| u.keys(cgroup_id))
            .unwrap_or_default();
        let old_unix = lock(&self.unix_keys).remove(id).unwrap_or_default();
        let old_cg = self.agents.cgroup_of(id);
        let old_keys = lock(&self.keys).remove(id).unwrap_or_default();
        let mut maps = lock(&self.maps);
        if let Some(old_cg) = old_cg.filter(|c| *c != cgroup_id) {
            let _ = maps.agents.remove(&old_cg);
            let _ = maps.unix_agents.remove(&old_cg);
        }
        // The Unix socket fence: its directories first, the agent's entry last (removed first
        // when the new policy has none, so the check never runs on half a policy).
        if policy.unix.is_none() {
            let _ = maps.unix_agents.remove(&cgroup_id);
        }
        for k in old_unix.iter().filter(|k| !unix_keys.contains(k)) {
            let _ = maps.unix_dirs.remove(k);
        }
        for k in &old_keys {
            if !keys.iter().any(|(n, _)| key_eq(n, k)) {
                let _ = maps.prefixes.remove(k);
            }
        }
        let map_err = |map: &'static str| {
            move |e: aya::maps::MapError| FsError::Map {
                map,
                error: e.to_string(),
            }
        };
        for (k, v) in &keys {
            maps.prefixes
                .insert(k, v, 0)
                .map_err(map_err("fs_prefixes"))?;
        }
        for k in &unix_keys {
            maps.unix_dirs
                .insert(k, 1u32, 0)
                .map_err(map_err("fs_unix_dirs"))?;
        }
        if let Some(u) = &policy.unix {
            maps.unix_agents
                .insert(cgroup_id, u.subtree, 0)
                .map_err(map_err("fs_unix_agents"))?;
        }
        maps.agents
            .insert(cgroup_id, 1u32, 0)
            .map_err(map_err("fs_agents"))?;
        // Recorded before the maps are let go: the sweep of stale entries
        // ([`FsEnforcer::adopted`]) sees either none of this policy or all of it.
        self.agents.insert(id, cgroup_id, tenant, name);
        lock(&self.keys).insert(id.to_string(), keys.into_iter().map(|(k, _)| k).collect());
        lock(&self.unix_keys).insert(id.to_string(), unix_keys);
        drop(maps);
        Ok(())
    }

    /// Remove agent `id`'s entries (its cgroup is gone or going).
    pub fn clear(&self, id: &str) {
        let keys = lock(&self.keys).remove(id).unwrap_or_default();
        let unix_keys = lock(&self.unix_keys).remove(id).unwrap_or_default();
        let mut maps = lock(&self.maps);
        if let Some(cg) = self.agents.remove(id) {
            let _ = maps.agents.remove(&cg);
            let _ = maps.unix_agents.remove(&cg);
        }
        for k in &keys {
            let _ = maps.prefixes.remove(k);
        }
        for k in &unix_keys {
            let _ = maps.unix_dirs.remove(k);
        }
    }

    /// The agent (tenant, name) whose cgroup has this id.
    pub fn agent_of(&self, cgroup_id: u64) -> Option<(String, String)> {
        self.agents.agent_of(cgroup_id)
    }

    pub fn stats(&self) -> Stats {
        let maps = lock(&self.maps);
        let get = |i: u32| maps.stats.get(&i, 0).unwrap_or(0);
        Stats {
            allowed: get(STAT_ALLOWED),
            denied: get(STAT_DENIED),
            events_dropped: get(STAT_DROPPED),
            unchecked: get(STAT_UNCHECKED),
        }
    }

    /// The ring buffer of denials (once).
    pub fn take_events(&self) -> Option<RingBuf<MapData>> {
        lock(&self.events).take()
    }
}

fn key_eq(a: &Key<RawKeyData>, b: &Key<RawKeyData>) -> bool {
    a.prefix_len() == b.prefix_len() && a.data() == b.data()
}

/// `agentosd check`: whether the programs load on this kernel (loaded, not attached).
pub fn check_line() -> String {
    let hooks = pins::hooks();
    match FsEnforcer::load() {
        Ok(f) => {
            let optional = OPTIONAL
                .iter()
                .map(|o| match f.optional_status(o.hook) {
                    Ok(()) => format!("lsm/{} load OK", o.hook),
                    Err(e) => format!("lsm/{} does not load ({e}): {}", o.hook, o.without),
                })
                .collect::<Vec<_>>()
                .join("; ");
            format!(
                "agentos BPF LSM filesystem programs (ebpf/fs.bpf.c: {hooks}): load OK; {optional}"
            )
        }
        Err(e) => format!(
            "agentos BPF LSM filesystem programs (ebpf/fs.bpf.c: {hooks}): {e}; filesystem scopes rely on Landlock"
        ),
    }
}

/// Read denials from `ring` as they come and hand each to `on_denial`, within the daemon's
/// budget for a ring ([`super::read_ring`]). Returns only when the fd cannot be polled.
pub async fn read_events(ring: RingBuf<MapData>, on_denial: impl FnMut(Denial)) {
    super::read_ring(ring, "BPF LSM", Denial::decode, on_denial).await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn layouts_match_intf_h() {
        assert_eq!(std::mem::size_of::<RawKeyData>(), 256);
        assert_eq!(std::mem::size_of::<Key<RawKeyData>>(), 260);
        assert_eq!(std::mem::size_of::<RawEvent>(), 32 + 16 + EVENT_PATH);
    }

    #[test]
    fn loads_where_bpf_lsm_is_allowed_and_says_why_not_elsewhere() {
        // On the development host BPF LSM is refused (lockdown): the error names it. In the VM
        // suite it loads (vm-tests/tests/fslsm.rs).
        match FsEnforcer::load() {
            Ok(_) => {}
            Err(FsError::NotBuilt) => eprintln!("skipped: BPF programs not built"),
            Err(e) => {
                let s = e.to_string();
                assert!(
                    s.contains("refused (EPERM)")
                        || s.contains("Operation not permitted")
                        || s.contains("BTF"),
                    "{s}"
                );
            }
        }
    }
}
