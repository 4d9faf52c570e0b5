//! Per-agent syscall counts (`ebpf/sysc.bpf.c`), an operator opt-in: `agentosd --syscall-counts`
//! or `AGENTOSD_SYSCALL_COUNTS=1`.
//!
//! The program sits on the global syscall-entry hook, so **every process on the host** runs it
//! on every syscall (a cgroup id, one per-CPU hash lookup that misses for non-agents): see
//! docs/benchmarks.md for what that costs and docs/audit.md for why it is off by default. Each
//! agent's cgroup id gets an entry when it starts ([`SyscCounter::add`]); its processes' syscalls
//! are counted per CPU and summed here. The entry goes when the agent's cgroup does; the last
//! count is kept for `agentctl status` until the agent starts again.

use std::collections::HashMap as StdHashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use aya::maps::{MapData, PerCpuHashMap, PerCpuValues};
use aya::programs::{BtfTracePoint, TracePoint};

/// The embedded object (empty when clang was missing at build time).
static SYSC_OBJ: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/sysc.bpf.o"));

/// The environment variable that enables counting like the flag does.
pub const ENV: &str = "AGENTOSD_SYSCALL_COUNTS";

/// Whether a value of [`ENV`] enables counting (`1`, `yes`, `true`).
pub fn env_enables(value: Option<&str>) -> bool {
    matches!(
        value.map(str::trim).map(str::to_ascii_lowercase).as_deref(),
        Some("1" | "yes" | "true")
    )
}

/// Which syscall-entry hook runs the counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    /// `tp_btf/sys_enter`: a BTF-typed raw tracepoint (needs kernel BTF, no tracefs).
    TpBtf,
    /// `tracepoint/raw_syscalls/sys_enter` (needs tracefs; slower: see docs/benchmarks.md).
    Tracepoint,
}

impl Hook {
    /// The program's name in `ebpf/sysc.bpf.c` (also its name in the kernel, ≤ 15 bytes).
    pub fn program(self) -> &'static str {
        match self {
            Hook::TpBtf => "agentos_sysc",
            Hook::Tracepoint => "agentos_sysc_tp",
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Hook::TpBtf => "tp_btf/sys_enter",
            Hook::Tracepoint => "tracepoint/raw_syscalls/sys_enter",
        }
    }
}

/// Errors of loading and using the counter.
#[derive(Debug, thiserror::Error)]
pub enum SyscError {
    #[error(
        "the BPF programs were not built (clang or libbpf-dev missing when agentosd was compiled)"
    )]
    NotBuilt,
    #[error("loading ebpf/sysc.bpf.o: {0}")]
    Load(String),
    #[error("BPF program {program}: {error}")]
    Program {
        program: &'static str,
        error: String,
    },
    #[error("BPF map sysc_counts: {0}")]
    Map(String),
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The sum of one agent's per-CPU counters (wrapping, like the kernel's u64 counters).
pub fn sum(per_cpu: &[u64]) -> u64 {
    per_cpu.iter().fold(0u64, |a, v| a.wrapping_add(*v))
}

/// The loaded program, its map and the agents it counts. Detached when dropped.
pub struct SyscCounter {
    hook: Hook,
    bpf: Mutex<aya::Ebpf>,
    counts: Mutex<PerCpuHashMap<MapData, u64, u64>>,
    ncpus: usize,
    /// Agent id → cgroup id of its entry in `sysc_counts`.
    agents: Mutex<StdHashMap<String, u64>>,
    /// Agent id → count of its last run, kept when its entry was removed.
    last: Mutex<StdHashMap<String, u64>>,
    attached: Mutex<bool>,
}

impl std::fmt::Debug for SyscCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SyscCounter")
            .field("hook", &self.hook)
            .field("attached", &*lock(&self.attached))
            .finish()
    }
}

impl SyscCounter {
    /// Load the program for `hook` (not attached yet: costs nothing until [`Self::attach`]).
    pub fn load(hook: Hook) -> Result<Arc<SyscCounter>, SyscError> {
        if SYSC_OBJ.is_empty() {
            return Err(SyscError::NotBuilt);
        }
        let mut bpf = aya::Ebpf::load(SYSC_OBJ).map_err(|e| SyscError::Load(e.to_string()))?;
        let program = hook.program();
        let perr = |e: aya::programs::ProgramError| SyscError::Program {
            program,
            error: format!("{e}{}", super::source_chain(&e)),
        };
        let prog = bpf.program_mut(program).ok_or(SyscError::Program {
            program,
            error: "not in the object".into(),
        })?;
        match hook {
            Hook::TpBtf => {
                let btf = aya::Btf::from_sys_fs().map_err(|e| SyscError::Program {
                    program,
                    error: format!("no kernel BTF (/sys/kernel/btf/vmlinux): {e}"),
                })?;
                let p: &mut BtfTracePoint = prog.try_into().map_err(perr)?;
                p.load("sys_enter", &btf).map_err(perr)?;
            }
            Hook::Tracepoint => {
                let p: &mut TracePoint = prog.try_into().map_err(perr)?;
                p.load().map_err(perr)?;
            }
        }
        let map = bpf
            .take_map("sysc_counts")
            .ok_or_else(|| SyscError::Map("not in the object".into()))?;
        let counts = PerCpuHashMap::try_from(map).map_err(|e| SyscError::Map(e.to_string()))?;
        let ncpus = aya::util::nr_cpus()
            .map_err(|(what, e)| SyscError::Map(format!("possible CPUs ({what}): {e}")))?;
        Ok(Arc::new(SyscCounter {
            hook,
            bpf: Mutex::new(bpf),
            counts: Mutex::new(counts),
            ncpus,
            agents: Mutex::default(),
            last: Mutex::default(),
            attached: Mutex::new(false),
        }))
    }

    pub fn hook(&self) -> Hook {
        self.hook
    }

    /// Attach to the syscall-entry hook: from now on every syscall on the host runs the
    /// program, until this value is dropped.
    pub fn attach(&self) -> Result<(), SyscError> {
        let program = self.hook.program();
        let perr = |e: aya::programs::ProgramError| SyscError::Program {
            program,
            error: format!("attach: {e}{}", super::source_chain(&e)),
        };
        let mut bpf = lock(&self.bpf);
        let prog = bpf.program_mut(program).ok_or(SyscError::Program {
            program,
            error: "not loaded".into(),
        })?;
        match self.hook {
            Hook::TpBtf => {
                let p: &mut BtfTracePoint = prog.try_into().map_err(perr)?;
                p.attach().map_err(perr)?;
            }
            Hook::Tracepoint => {
                let p: &mut TracePoint = prog.try_into().map_err(perr)?;
                p.attach("raw_syscalls", "sys_enter").map_err(|e| {
                    let mut s = perr(e).to_string();
                    if s.contains("tracefs") {
                        s.push_str(" (mount it: mount -t tracefs tracefs /sys/kernel/tracing)");
                    }
                    SyscError::Program { program, error: s }
                })?;
            }
        }
        *lock(&self.attached) = true;
        Ok(())
    }

    /// Start counting the processes of cgroup `cgroup_id` as agent `id` (from zero when the
    /// cgroup is new to it; an entry for the same cgroup is kept, e.g. when re-adopted).
    pub fn add(&self, id: &str, cgroup_id: u64) -> Result<(), SyscError> {
        let old = lock(&self.agents).get(id).copied();
        if old == Some(cgroup_id) {
            return Ok(());
        }
        let mut counts = lock(&self.counts);
        if let Some(old) = old {
            let _ = counts.remove(&old);
        }
        let zeros = PerCpuValues::try_from(vec![0u64; self.ncpus])
            .map_err(|e| SyscError::Map(e.to_string()))?;
        counts
            .insert(cgroup_id, zeros, 0)
            .map_err(|e| SyscError::Map(e.to_string()))?;
        lock(&self.agents).insert(id.to_string(), cgroup_id);
        lock(&self.last).remove(id);
        Ok(())
    }

    /// Stop counting agent `id` (its cgroup is gone or going); its count is kept.
    pub fn remove(&self, id: &str) {
        let Some(cg) = lock(&self.agents).remove(id) else {
            return;
        };
        let mut counts = lock(&self.counts);
        let n = counts.get(&cg, 0).map(|v| sum(&v)).unwrap_or(0);
        let _ = counts.remove(&cg);
        lock(&self.last).insert(id.to_string(), n);
    }

    /// Syscalls entered by agent `id`'s processes in its current (or last) run; 0 for an agent
    /// that has not run since the daemon started.
    pub fn count(&self, id: &str) -> u64 {
        let cg = lock(&self.agents).get(id).copied();
        match cg {
            Some(cg) => lock(&self.counts).get(&cg, 0).map(|v| sum(&v)).unwrap_or(0),
            None => lock(&self.last).get(id).copied().unwrap_or(0),
        }
    }

    /// Entries in the map now.
    pub fn entries(&self) -> usize {
        lock(&self.counts).keys().count()
    }
}

/// Load and attach the counter for `agentosd --syscall-counts`: the BTF-typed hook first, the
/// classic tracepoint when that cannot load. Logs what it did, or why counting is off.
pub fn setup() -> Result<Arc<SyscCounter>, String> {
    let mut why = Vec::new();
    for hook in [Hook::TpBtf, Hook::Tracepoint] {
        match SyscCounter::load(hook).and_then(|c| c.attach().map(|()| c)) {
            Ok(c) => {
                tracing::warn!(
                    "syscall counts ON (--syscall-counts): {} attached; every syscall of every process on this host now runs it (see docs/benchmarks.md for the cost)",
                    hook.describe()
                );
                return Ok(c);
            }
            Err(e) => why.push(format!("{}: {e}", hook.describe())),
        }
    }
    let why = why.join("; ");
    tracing::warn!("syscall counts requested but unavailable: {why}; agents show no count");
    Err(why)
}

/// `agentosd check`: whether the counter loads here (loaded, not attached) and whether a
/// program of that name is in the kernel now (some agentosd counts).
pub fn check_line() -> String {
    let loads = [Hook::TpBtf, Hook::Tracepoint]
        .iter()
        .map(|h| match SyscCounter::load(*h) {
            Ok(_) => format!("{} load OK", h.describe()),
            Err(e) => format!("{}: {e}", h.describe()),
        })
        .collect::<Vec<_>>()
        .join("; ");
    let on = aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .any(|p| {
            p.name_as_str()
                .is_some_and(|n| n == Hook::TpBtf.program() || n == Hook::Tracepoint.program())
        });
    let state = if on {
        "ON now (a program of agentosd --syscall-counts is loaded: every process pays for it)"
    } else {
        "off (opt-in: agentosd --syscall-counts or AGENTOSD_SYSCALL_COUNTS=1; it costs every process on the host)"
    };
    format!("agentos syscall counts (ebpf/sysc.bpf.c): {loads}; {state}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_values() {
        assert!(env_enables(Some("1")));
        assert!(env_enables(Some("yes")));
        assert!(env_enables(Some("TRUE ")));
        assert!(!env_enables(Some("0")));
        assert!(!env_enables(Some("")));
        assert!(!env_enables(None));
    }

    #[test]
    fn per_cpu_sum() {
        assert_eq!(sum(&[]), 0);
        assert_eq!(sum(&[1, 2, 3]), 6);
        assert_eq!(sum(&[u64::MAX, 2]), 1);
    }

    #[test]
    fn program_names_fit_the_kernel() {
        // BPF_OBJ_NAME_LEN is 16 with the NUL: longer names are cut, and check_line looks
        // for the name as the kernel keeps it.
        for h in [Hook::TpBtf, Hook::Tracepoint] {
            assert!(h.program().len() <= 15, "{}", h.program());
        }
    }
}
