//! Filesystem scopes per agent, enforced by BPF LSM programs (`ebpf/fs.bpf.c`): defence in depth
//! behind Landlock, on kernels that allow BPF LSM (not on hosts with lockdown: the daemon says so
//! and relies on Landlock).
//!
//! One source: the agent's Landlock [`Plan`] (the contract's `fs.read`/`fs.write`/`fs.exec`
//! scopes, the sandbox's baseline system paths, the agent's home) becomes a set of path prefixes
//! with the rights Landlock gives them. `lsm/file_open` checks reads and writes,
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

use std::collections::{BTreeMap, HashMap as StdHashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use aya::maps::lpm_trie::{Key, LpmTrie};
use aya::maps::{Array, HashMap, MapData, RingBuf};
use serde::Serialize;

use crate::sandbox::landlock::Plan;

/// The embedded object (empty when clang was missing at build time).
static FS_OBJ: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/fs.bpf.o"));

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

pub const OPTIONAL: [Optional; 4] = [
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
];

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
const EV_PATH_CUT: u8 = 1;
const EV_NO_PREFIX: u8 = 2;
const STAT_ALLOWED: u32 = 0;
const STAT_DENIED: u32 = 1;
const STAT_DROPPED: u32 = 2;
const STAT_UNCHECKED: u32 = 3;

/// The data of `struct agentos_fs_key` after `prefixlen` (aya's [`Key`] adds the length).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawKeyData {
    pub cgroup_id: u64,
    pub path: [u8; PATH_KEY],
}

// SAFETY: a `#[repr(C)]` u64 followed by a byte array whose length keeps the size a multiple of
// 8 (256): no padding, no pointers, any bit pattern is valid.
unsafe impl aya::Pod for RawKeyData {}

/// `struct agentos_fs_event`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RawEvent {
    pub cgroup_id: u64,
    pub time_ns: u64,
    pub pid: u32,
    pub tid: u32,
    pub f_flags: u32,
    pub hook: u8,
    pub want: u8,
    pub granted: u8,
    pub flags: u8,
    pub comm: [u8; 16],
    pub path: [u8; EVENT_PATH],
}

/// An agent's filesystem policy: path prefixes (no trailing `/`, `/` itself for the root) and
/// the rights each grants, already including what every shorter prefix grants.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    pub prefixes: BTreeMap<String, u8>,
    /// What the operator should know (cut prefixes, …).
    pub notes: Vec<String>,
}

/// Does `prefix` (normalised) contain `path` (normalised) on a component boundary?
fn under(path: &str, prefix: &str) -> bool {
    prefix == "/"
        || path == prefix
        || (path.starts_with(prefix) && path.as_bytes().get(prefix.len()) == Some(&b'/'))
}

/// `/a/b/` → `/a/b`; `//` → `/`; relative paths are not scopes (`None`).
fn normalise(p: &Path) -> Option<String> {
    let s = p.to_str()?;
    if !s.starts_with('/') {
        return None;
    }
    let t = s.trim_end_matches('/');
    Some(if t.is_empty() { "/".into() } else { t.into() })
}

/// The rights of one access-bit set, for messages and records.
pub fn access_name(bits: u8) -> String {
    let mut v = Vec::new();
    if bits & READ != 0 {
        v.push("read");
    }
    if bits & WRITE != 0 {
        v.push("write");
    }
    if bits & EXEC != 0 {
        v.push("exec");
    }
    if v.is_empty() {
        "none".into()
    } else {
        v.join("+")
    }
}

impl Policy {
    /// The policy of a Landlock plan: `read` paths grant read, `read_exec` read+exec,
    /// `read_write` read+write, exactly the rights `sandbox::landlock::build` gives them. Each
    /// path is resolved with `canon` (symlinks: `/bin` → `/usr/bin`, as Landlock resolves the
    /// path when it adds the rule); one that does not resolve is kept as written.
    pub fn from_plan(plan: &Plan, canon: &dyn Fn(&Path) -> Option<PathBuf>) -> Policy {
        let mut p = Policy::default();
        let sets: [(&[PathBuf], u8); 3] = [
            (&plan.read, READ),
            (&plan.read_exec, READ | EXEC),
            (&plan.read_write, READ | WRITE),
        ];
        let mut own: BTreeMap<String, u8> = BTreeMap::new();
        for (paths, bits) in sets {
            for path in paths {
                let resolved = canon(path).unwrap_or_else(|| path.clone());
                let Some(mut s) = normalise(&resolved) else {
                    p.notes.push(format!(
                        "filesystem (BPF LSM): {} is not an absolute path; ignored",
                        path.display()
                    ));
                    continue;
                };
                if s.len() >= PATH_KEY {
                    // Widen to the longest directory that fits (Landlock keeps the exact scope).
                    let mut cut = s[..PATH_KEY - 1].to_string();
                    match cut.rfind('/') {
                        Some(0) | None => cut = "/".into(),
                        Some(i) => cut.truncate(i),
                    }
                    p.notes.push(format!(
                        "filesystem (BPF LSM): {} is longer than {} bytes; checked as {cut} (Landlock enforces the exact path)",
                        path.display(),
                        PATH_KEY - 1
                    ));
                    s = cut;
                }
                *own.entry(s).or_default() |= bits;
            }
        }
        // Each entry also carries what its granted ancestors grant: the longest match decides.
        for (path, bits) in &own {
            let all = own
                .iter()
                .filter(|(q, _)| under(path, q))
                .fold(*bits, |acc, (_, b)| acc | b);
            p.prefixes.insert(path.clone(), all);
        }
        p
    }

    /// What a path is granted (the program's lookup, mirrored): the rights of the longest
    /// prefix containing it, 0 when none does. `path` is absolute and resolved, as `d_path`
    /// gives it.
    pub fn granted(&self, path: &str) -> u8 {
        let path = if path.len() > PATH_KEY {
            // The program looks up the first PATH_KEY bytes (without a trailing '/').
            &path[..PATH_KEY]
        } else {
            path
        };
        self.prefixes
            .iter()
            .filter(|(p, _)| under(path, p))
            .max_by_key(|(p, _)| p.len())
            .map_or(0, |(_, b)| *b)
    }

    /// The trie keys of this policy for cgroup `cgroup_id`.
    pub fn keys(&self, cgroup_id: u64) -> Vec<(Key<RawKeyData>, u32)> {
        self.prefixes
            .iter()
            .map(|(p, bits)| (key_for(cgroup_id, p), u32::from(*bits)))
            .collect()
    }

    /// One line for `agentctl status`.
    pub fn describe(&self) -> String {
        let mut by: BTreeMap<u8, Vec<&str>> = BTreeMap::new();
        for (p, b) in &self.prefixes {
            by.entry(*b).or_default().push(p);
        }
        by.iter()
            .map(|(b, ps)| format!("{} {}", access_name(*b), ps.join(" ")))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// The trie key of one normalised prefix: the path with a trailing `/` (`/` for the root).
pub fn key_for(cgroup_id: u64, prefix: &str) -> Key<RawKeyData> {
    let mut path = [0u8; PATH_KEY];
    let with_slash = if prefix == "/" {
        "/".to_string()
    } else {
        format!("{prefix}/")
    };
    let n = with_slash.len().min(PATH_KEY);
    path[..n].copy_from_slice(&with_slash.as_bytes()[..n]);
    Key::new((64 + 8 * n) as u32, RawKeyData { cgroup_id, path })
}

/// One denial, decoded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Denial {
    pub cgroup_id: u64,
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    /// `open`, `execve`, `mmap`, `mprotect`, `bind` or `listen`.
    pub syscall: &'static str,
    /// `lsm/file_open`, `lsm/bprm_check_security`, `lsm/mmap_file`, `lsm/file_mprotect`,
    /// `lsm/socket_bind` or `lsm/socket_listen`.
    pub hook: &'static str,
    /// What the call returned: `EACCES` for files, `EPERM` for sockets.
    pub errno: i32,
    /// The file; for `bind`, `@` and the abstract socket name (bytes outside printable ASCII
    /// as `\xNN`); for `listen`, the socket's family (`inet`, `inet6`).
    pub path: String,
    /// The path was longer than the event holds (`path` is its start).
    pub path_cut: bool,
    /// What was asked (`read`, `write`, `read+write`, `exec`).
    pub access: String,
    /// What the longest matching granted prefix grants (`none` when no prefix matched).
    pub granted: String,
    /// The open flags (`O_*`).
    pub flags: u32,
}

impl Denial {
    pub fn decode(bytes: &[u8]) -> Option<Denial> {
        if bytes.len() < std::mem::size_of::<RawEvent>() {
            return None;
        }
        // SAFETY: the buffer holds at least size_of::<RawEvent>() bytes and RawEvent is a
        // plain-old-data #[repr(C)] struct valid for any bit pattern; read_unaligned copes with
        // the ring buffer's alignment not being guaranteed to the slice.
        let e: RawEvent = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
        let text = |b: &[u8]| {
            let end = b.iter().position(|c| *c == 0).unwrap_or(b.len());
            String::from_utf8_lossy(&b[..end]).into_owned()
        };
        let (syscall, hook) = match e.hook {
            HOOK_FILE_OPEN => ("open", "lsm/file_open"),
            HOOK_BPRM_CHECK => ("execve", "lsm/bprm_check_security"),
            HOOK_MMAP_FILE => ("mmap", "lsm/mmap_file"),
            HOOK_FILE_MPROTECT => ("mprotect", "lsm/file_mprotect"),
            HOOK_SOCKET_BIND => ("bind", "lsm/socket_bind"),
            HOOK_SOCKET_LISTEN => ("listen", "lsm/socket_listen"),
            _ => return None,
        };
        let socket = matches!(e.hook, HOOK_SOCKET_BIND | HOOK_SOCKET_LISTEN);
        let path = match e.hook {
            HOOK_SOCKET_BIND => {
                let n = (e.f_flags as usize).min(EVENT_PATH - 1);
                format!("@{}", escape_name(&e.path[1..=n]))
            }
            HOOK_SOCKET_LISTEN => match e.f_flags {
                2 => "inet".into(),
                10 => "inet6".into(),
                f => format!("family {f}"),
            },
            // The hook has no path (bpf_d_path is not allowed there): every file mapping
            // made executable by mprotect is refused.
            HOOK_FILE_MPROTECT => "(a file mapping; mprotect has no path)".into(),
            _ => text(&e.path),
        };
        Some(Denial {
            cgroup_id: e.cgroup_id,
            pid: e.pid,
            tid: e.tid,
            comm: text(&e.comm),
            syscall,
            hook,
            errno: if socket { libc::EPERM } else { libc::EACCES },
            path,
            path_cut: e.flags & EV_PATH_CUT != 0,
            access: match e.hook {
                HOOK_SOCKET_BIND | HOOK_SOCKET_LISTEN => syscall.into(),
                HOOK_FILE_MPROTECT => "exec".into(),
                _ => access_name(e.want),
            },
            granted: if e.hook == HOOK_FILE_MPROTECT {
                "unchecked".into()
            } else if e.flags & EV_NO_PREFIX != 0 {
                "none".into()
            } else {
                access_name(e.granted)
            },
            flags: e.f_flags,
        })
    }
}

/// An abstract socket name as text: printable ASCII as is (but `\\`), every other byte (NULs
/// included: they are part of the name) as `\xNN`.
fn escape_name(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for &b in bytes {
        if (b.is_ascii_graphic() && b != b'\\') || b == b' ' {
            out.push(b as char);
        } else {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

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
    attached: Mutex<bool>,
    /// For each of [`OPTIONAL`], why it did not load (`None`: loaded).
    optional_errors: [Option<String>; OPTIONAL.len()],
}

impl std::fmt::Debug for FsEnforcer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FsEnforcer")
            .field("attached", &*lock(&self.attached))
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
        if FS_OBJ.is_empty() {
            return Err(FsError::NotBuilt);
        }
        let mut bpf = aya::Ebpf::load(FS_OBJ).map_err(|e| FsError::Load(e.to_string()))?;
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
        let prefixes =
            LpmTrie::try_from(take(&mut bpf, "fs_prefixes")?).map_err(map_err("fs_prefixes"))?;
        let stats = Array::try_from(take(&mut bpf, "fs_stats")?).map_err(map_err("fs_stats"))?;
        let events =
            RingBuf::try_from(take(&mut bpf, "fs_events")?).map_err(map_err("fs_events"))?;
        Ok(Arc::new(FsEnforcer {
            bpf: Mutex::new(bpf),
            maps: Mutex::new(Maps {
                agents,
                prefixes,
                stats,
            }),
            events: Mutex::new(Some(events)),
            agents: super::AgentCgroups::default(),
            keys: Mutex::default(),
            attached: Mutex::new(false),
            optional_errors,
        }))
    }

    /// Attach both programs (global LSM hooks; they act only on cgroups with an entry). They
    /// stay attached while this value lives.
    pub fn attach(&self) -> Result<(), FsError> {
        let mut bpf = lock(&self.bpf);
        for (name, hook) in PROGRAMS {
            let prog = bpf
                .program_mut(name)
                .and_then(|p| <&mut aya::programs::Lsm>::try_from(p).ok())
                .ok_or_else(|| FsError::Program {
                    program: name.into(),
                    error: "not loaded".into(),
                })?;
            prog.attach().map_err(|e| FsError::Program {
                program: format!("{name} (lsm/{hook})"),
                error: format!("attach: {e}{}", super::source_chain(&e)),
            })?;
        }
        *lock(&self.attached) = true;
        for (o, err) in OPTIONAL.iter().zip(&self.optional_errors) {
            if err.is_some() {
                continue;
            }
            if let Some(prog) = bpf
                .program_mut(o.name)
                .and_then(|p| <&mut aya::programs::Lsm>::try_from(p).ok())
                && let Err(e) = prog.attach()
            {
                tracing::warn!(
                    "BPF LSM: {} (lsm/{}) did not attach: {e}; {}",
                    o.name,
                    o.hook,
                    o.without
                );
            }
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
        let old_cg = self.agents.cgroup_of(id);
        let old_keys = lock(&self.keys).remove(id).unwrap_or_default();
        let mut maps = lock(&self.maps);
        if let Some(old_cg) = old_cg.filter(|c| *c != cgroup_id) {
            let _ = maps.agents.remove(&old_cg);
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
        maps.agents
            .insert(cgroup_id, 1u32, 0)
            .map_err(map_err("fs_agents"))?;
        drop(maps);
        self.agents.insert(id, cgroup_id, tenant, name);
        lock(&self.keys).insert(id.to_string(), keys.into_iter().map(|(k, _)| k).collect());
        Ok(())
    }

    /// Remove agent `id`'s entries (its cgroup is gone or going).
    pub fn clear(&self, id: &str) {
        let keys = lock(&self.keys).remove(id).unwrap_or_default();
        let mut maps = lock(&self.maps);
        if let Some(cg) = self.agents.remove(id) {
            let _ = maps.agents.remove(&cg);
        }
        for k in &keys {
            let _ = maps.prefixes.remove(k);
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

/// Load and attach the programs for the daemon, saying what is active: `Ok` with the enforcer,
/// or `Err` with why not (the daemon then relies on Landlock for filesystem scopes).
pub fn setup() -> Result<Arc<FsEnforcer>, String> {
    let hooks = PROGRAMS
        .iter()
        .map(|(_, h)| format!("lsm/{h}"))
        .collect::<Vec<_>>()
        .join(", ");
    match FsEnforcer::load().and_then(|f| f.attach().map(|()| f)) {
        Ok(f) => {
            tracing::info!(
                "BPF LSM: {hooks} attached (agents' filesystem scopes, defence in depth behind Landlock)"
            );
            for o in OPTIONAL {
                match f.optional_status(o.hook) {
                    Ok(()) => tracing::info!("BPF LSM: lsm/{} attached ({})", o.hook, o.does),
                    Err(e) => {
                        tracing::warn!("BPF LSM: lsm/{} not active: {e}; {}", o.hook, o.without)
                    }
                }
            }
            Ok(f)
        }
        Err(e) => {
            tracing::warn!(
                "BPF LSM: {hooks} not active: {e}; filesystem scopes are enforced by Landlock alone"
            );
            Err(e.to_string())
        }
    }
}

/// `agentosd check`: whether the programs load on this kernel (loaded, not attached).
pub fn check_line() -> String {
    let hooks = PROGRAMS
        .iter()
        .map(|(_, h)| format!("lsm/{h}"))
        .collect::<Vec<_>>()
        .join(", ");
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

    fn plan(read: &[&str], exec: &[&str], write: &[&str]) -> Plan {
        let v = |s: &[&str]| s.iter().map(PathBuf::from).collect();
        Plan {
            read: v(read),
            read_exec: v(exec),
            read_write: v(write),
            ..Plan::default()
        }
    }

    fn no_links(p: &Path) -> Option<PathBuf> {
        match p.to_str() {
            Some("/bin") => Some("/usr/bin".into()),
            Some("/lib64") => Some("/usr/lib64".into()),
            _ => None,
        }
    }

    #[test]
    fn prefixes_match_on_component_boundaries() {
        let p = Policy::from_plan(&plan(&["/srv/docs/", "/etc/passwd"], &[], &[]), &no_links);
        assert_eq!(p.granted("/srv/docs"), READ);
        assert_eq!(p.granted("/srv/docs/a/b.txt"), READ);
        assert_eq!(p.granted("/srv/docs2"), 0);
        assert_eq!(p.granted("/srv/docs2/x"), 0);
        assert_eq!(p.granted("/srv"), 0);
        assert_eq!(p.granted("/etc/passwd"), READ);
        assert_eq!(p.granted("/etc/passwd-"), 0);
        assert_eq!(p.granted("/etc/shadow"), 0);
        let root = Policy::from_plan(&plan(&["/"], &[], &[]), &no_links);
        assert_eq!(root.granted("/anything/at/all"), READ);
        assert_eq!(root.granted("/"), READ);
    }

    #[test]
    fn longest_match_carries_the_ancestors_rights() {
        // /usr read+exec, /usr/share/doc read-only by the contract, home read+write.
        let p = Policy::from_plan(
            &plan(
                &["/usr/share/doc"],
                &["/usr", "/bin"],
                &["/var/lib/agentos/h"],
            ),
            &no_links,
        );
        assert_eq!(p.granted("/usr/share/doc/x"), READ | EXEC);
        // /bin resolves to /usr/bin, which is under /usr.
        assert!(!p.prefixes.contains_key("/bin"));
        assert_eq!(p.granted("/usr/bin/true"), READ | EXEC);
        assert_eq!(p.granted("/var/lib/agentos/h/tmp/f"), READ | WRITE);
        assert_eq!(p.granted("/var/lib/agentos"), 0);
        let d = p.describe();
        assert!(d.contains("read+exec /usr /usr/bin /usr/share/doc"), "{d}");
    }

    #[test]
    fn the_baseline_plan_becomes_prefixes() {
        let g = crate::sandbox::Grants {
            fs_read: vec!["/srv/vmt".into()],
            fs_exec: vec!["/opt/tools".into()],
            ..Default::default()
        };
        let home = Path::new("/var/lib/agentos/agents/t/a");
        let p = Policy::from_plan(&g.plan(home).unwrap(), &no_links);
        assert_eq!(p.granted("/srv/vmt/f"), READ);
        assert_eq!(p.granted("/opt/tools/run"), READ | EXEC);
        assert_eq!(p.granted("/var/lib/agentos/agents/t/a/out"), READ | WRITE);
        assert_eq!(p.granted("/dev/null"), READ | WRITE);
        assert_eq!(p.granted("/proc/self/status"), READ);
        assert_eq!(p.granted("/etc/shadow"), 0);
        assert_eq!(
            p.granted("/usr/lib/x86_64-linux-gnu/libc.so.6"),
            READ | EXEC
        );
    }

    #[test]
    fn long_prefixes_are_widened_with_a_note() {
        let long = format!("/data/{}/leaf", "x".repeat(300));
        let p = Policy::from_plan(&plan(&[&long], &[], &[]), &no_links);
        assert_eq!(p.notes.len(), 1, "{:?}", p.notes);
        assert_eq!(p.granted(&format!("{long}/f")), READ);
        assert_eq!(p.granted("/data/y"), READ);
        assert_eq!(p.granted("/other"), 0);
    }

    #[test]
    fn keys_end_in_a_slash() {
        let p = Policy::from_plan(&plan(&["/srv/docs", "/"], &[], &[]), &no_links);
        let keys = p.keys(7);
        assert_eq!(keys.len(), 2);
        let (root, _) = keys.iter().find(|(k, _)| k.data().path[1] == 0).unwrap();
        assert_eq!(root.prefix_len(), 64 + 8);
        let (docs, v) = keys.iter().find(|(k, _)| k.data().path[1] == b's').unwrap();
        assert_eq!(&docs.data().path[..10], b"/srv/docs/");
        assert_eq!(docs.prefix_len(), 64 + 8 * 10);
        assert_eq!(docs.data().cgroup_id, 7);
        assert_eq!(*v, u32::from(READ));
    }

    #[test]
    fn events_decode() {
        let mut e = RawEvent {
            cgroup_id: 42,
            time_ns: 1,
            pid: 7,
            tid: 8,
            f_flags: 0o1,
            hook: HOOK_FILE_OPEN,
            want: WRITE,
            granted: READ,
            flags: 0,
            comm: [0; 16],
            path: [0; EVENT_PATH],
        };
        e.comm[..3].copy_from_slice(b"cat");
        e.path[..11].copy_from_slice(b"/srv/x/file");
        // SAFETY: RawEvent is plain old data; viewing it as bytes is sound.
        let bytes = unsafe {
            std::slice::from_raw_parts(
                (&e as *const RawEvent).cast::<u8>(),
                std::mem::size_of::<RawEvent>(),
            )
        };
        let d = Denial::decode(bytes).unwrap();
        assert_eq!(
            (d.hook, d.syscall, d.path.as_str(), d.comm.as_str()),
            ("lsm/file_open", "open", "/srv/x/file", "cat")
        );
        assert_eq!((d.access.as_str(), d.granted.as_str()), ("write", "read"));
        assert_eq!((d.pid, d.tid, d.flags, d.path_cut), (7, 8, 1, false));
        e.hook = 6;
        e.want = EXEC;
        e.flags = EV_NO_PREFIX | EV_PATH_CUT;
        // SAFETY: as above.
        let bytes = unsafe {
            std::slice::from_raw_parts(
                (&e as *const RawEvent).cast::<u8>(),
                std::mem::size_of::<RawEvent>(),
            )
        };
        let d = Denial::decode(bytes).unwrap();
        assert_eq!((d.hook, d.syscall), ("lsm/bprm_check_security", "execve"));
        assert_eq!((d.access.as_str(), d.granted.as_str()), ("exec", "none"));
        assert!(d.path_cut);
        assert_eq!(d.errno, libc::EACCES);
        assert!(Denial::decode(&bytes[..10]).is_none());
    }

    fn as_bytes(e: &RawEvent) -> Vec<u8> {
        // SAFETY: RawEvent is plain old data; viewing it as bytes is sound.
        unsafe {
            std::slice::from_raw_parts(
                (e as *const RawEvent).cast::<u8>(),
                std::mem::size_of::<RawEvent>(),
            )
        }
        .to_vec()
    }

    #[test]
    fn socket_refusals_decode_with_eperm_and_an_escaped_name() {
        let mut e = RawEvent {
            cgroup_id: 42,
            time_ns: 1,
            pid: 7,
            tid: 8,
            f_flags: 6, // bytes of the abstract name
            hook: HOOK_SOCKET_BIND,
            want: 0,
            granted: 0,
            flags: EV_NO_PREFIX,
            comm: [0; 16],
            path: [0; EVENT_PATH],
        };
        e.path[..7].copy_from_slice(b"@db\0\n\\s");
        let d = Denial::decode(&as_bytes(&e)).unwrap();
        assert_eq!(
            (d.syscall, d.hook, d.errno, d.access.as_str()),
            ("bind", "lsm/socket_bind", libc::EPERM, "bind")
        );
        // A NUL inside the name is part of it, and an agent's control bytes stay escaped.
        assert_eq!(d.path, "@db\\x00\\x0a\\x5cs");
        e.hook = HOOK_SOCKET_LISTEN;
        e.f_flags = 10;
        let d = Denial::decode(&as_bytes(&e)).unwrap();
        assert_eq!(
            (d.syscall, d.hook, d.errno, d.path.as_str()),
            ("listen", "lsm/socket_listen", libc::EPERM, "inet6")
        );
        e.hook = 12; // a network hook's number never decodes as a filesystem denial
        assert!(Denial::decode(&as_bytes(&e)).is_none());
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
