//! `scx_agentos`: the sched_ext scheduler of agentos and its loader.
//!
//! The BPF side (`src/bpf/main.bpf.c`) keeps three dispatch queues: SRT agents first with 2 ms
//! slices, other tasks fairly by virtual time, DT agents only on otherwise idle time (with a
//! starvation bound that keeps them inside the kernel's watchdog). It finds a task's class by
//! looking up its cgroup and that cgroup's ancestors in a map keyed by cgroup id, which the
//! loader fills: see [`Scheduler::set_class`]. See docs/scheduling.md.
//!
//! Whoever holds a [`Scheduler`] holds the struct_ops link: dropping it (or the process exiting,
//! or the kernel's watchdog kicking the scheduler out) returns every task to the fair class.
//! agentosd holds it when started with `--sched-ext`; the `scx_agentos` binary holds it when run
//! by hand.

use std::mem::MaybeUninit;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use libbpf_rs::skel::{OpenSkel, Skel, SkelBuilder};
use libbpf_rs::{MapCore, MapFlags};

#[allow(
    clippy::all,
    clippy::undocumented_unsafe_blocks,
    clippy::unwrap_used,
    unsafe_op_in_unsafe_fn,
    non_camel_case_types,
    non_snake_case,
    dead_code,
    missing_docs
)]
mod bpf_skel {
    include!(concat!(env!("OUT_DIR"), "/main.skel.rs"));
}

use bpf_skel::{MainSkel, MainSkelBuilder};

/// sched_ext's state file (`enabled`, `disabled`, `enabling`, `disabling`).
pub const STATE_PATH: &str = "/sys/kernel/sched_ext/state";
/// The name of the running BPF scheduler.
pub const OPS_PATH: &str = "/sys/kernel/sched_ext/root/ops";
/// `sched_ext_ops.name` of this scheduler (what [`OPS_PATH`] shows while it runs).
pub const OPS_NAME: &str = "agentos";
/// Entries of the class map (`AGENTOS_MAX_CGROUPS` in intf.h).
pub const MAX_CGROUPS: usize = 16384;
/// SRT slice (`AGENTOS_SRT_SLICE_NS`).
pub const SRT_SLICE_NS: u64 = 2_000_000;
/// DT slice (`AGENTOS_DT_SLICE_NS`).
pub const DT_SLICE_NS: u64 = 5_000_000;
/// A DT task goes first after DT waited this long (`AGENTOS_DT_MAX_WAIT_NS`).
pub const DT_MAX_WAIT_NS: u64 = 50_000_000;
/// SRT slices in a row on one CPU before a waiting normal task goes first.
pub const SRT_MAX_STREAK: u32 = 16;

/// A latency class the scheduler treats specially (map value; `enum agentos_class`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Class {
    /// Soft real-time: dispatched ahead of everything else with short slices.
    Srt = 1,
    /// Delay-tolerant: runs on otherwise idle time.
    Dt = 2,
}

impl Class {
    /// The scheduler class of a contract's `class.latency` (HRT runs as SCHED_DEADLINE, which
    /// sched_ext does not touch; anything else is normal).
    pub fn from_latency(latency: &str) -> Option<Class> {
        match latency {
            "SRT" => Some(Class::Srt),
            "DT" => Some(Class::Dt),
            _ => None,
        }
    }

    /// The map value.
    pub fn value(self) -> u32 {
        self as u32
    }

    pub fn from_value(v: u32) -> Option<Class> {
        match v {
            1 => Some(Class::Srt),
            2 => Some(Class::Dt),
            _ => None,
        }
    }
}

impl std::fmt::Display for Class {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Class::Srt => "SRT",
            Class::Dt => "DT",
        })
    }
}

impl std::str::FromStr for Class {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Class::from_latency(&s.to_ascii_uppercase())
            .ok_or_else(|| format!("unknown class {s:?} (expected SRT or DT)"))
    }
}

/// Errors of the loader.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "no {STATE_PATH}: this kernel has no sched_ext (CONFIG_SCHED_CLASS_EXT); scx_agentos \
         needs Linux >= 6.12 built with it"
    )]
    Unsupported,
    #[error("another sched_ext scheduler runs ({STATE_PATH}: {state}, ops {ops:?}); stop it first")]
    Busy { state: String, ops: String },
    #[error("cannot read {path}: {source}")]
    Sysfs {
        path: &'static str,
        source: std::io::Error,
    },
    #[error("{what}: {source}")]
    Bpf {
        what: &'static str,
        source: libbpf_rs::Error,
    },
    #[error("cgroup {path}: {source}")]
    Cgroup {
        path: String,
        source: std::io::Error,
    },
    #[error("scx_agentos has exited: {0}")]
    Exited(ExitInfo),
}

/// Why the scheduler stopped (the kernel's `scx_exit_info`, copied by `ops.exit`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExitInfo {
    pub kind: i32,
    pub code: i64,
    pub reason: String,
    pub msg: String,
}

impl ExitInfo {
    /// The name of `enum scx_exit_kind`.
    pub fn kind_name(&self) -> &'static str {
        match self.kind {
            0 => "none",
            1 => "done",
            64 => "unregistered",
            65 => "unregistered from BPF",
            66 => "unregistered by the kernel",
            67 => "sysrq-S",
            68 | 69 => "parent exited",
            1024 => "runtime error",
            1025 => "BPF error",
            1026 => "watchdog stall",
            _ => "error",
        }
    }

    /// Whether the kernel kicked the scheduler out (an error, not an orderly unload).
    pub fn is_error(&self) -> bool {
        self.kind >= 1024
    }
}

impl std::fmt::Display for ExitInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (kind {})", self.kind_name(), self.kind)?;
        if !self.reason.is_empty() {
            write!(f, ": {}", self.reason)?;
        }
        if !self.msg.is_empty() {
            write!(f, " ({})", self.msg)?;
        }
        Ok(())
    }
}

/// Counters of the BPF side.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Tasks queued per class: normal, SRT, DT.
    pub enqueued: [u64; 3],
    /// Tasks moved to a CPU from the class's queue: normal, SRT, DT.
    pub dispatched: [u64; 3],
    /// Wake-ups placed straight on an idle CPU.
    pub direct: u64,
    /// CPUs preempted for a higher class.
    pub preempted: u64,
    /// DT tasks dispatched ahead because DT had waited too long.
    pub dt_rescued: u64,
    /// Normal tasks dispatched ahead of SRT after a long SRT streak.
    pub srt_yields: u64,
    /// Enqueues held back because the task's cgroup had used its cpu.max quota.
    pub throttled: u64,
}

impl std::fmt::Display for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "enqueued srt={} normal={} dt={}; dispatched srt={} normal={} dt={}; direct={} \
             preempted={} dt_rescued={} srt_yields={} throttled={}",
            self.enqueued[1],
            self.enqueued[0],
            self.enqueued[2],
            self.dispatched[1],
            self.dispatched[0],
            self.dispatched[2],
            self.direct,
            self.preempted,
            self.dt_rescued,
            self.srt_yields,
            self.throttled
        )
    }
}

/// What sched_ext says now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelState {
    /// `enabled`, `disabled`, ….
    pub state: String,
    /// The running scheduler's name (empty when none).
    pub ops: String,
}

impl KernelState {
    /// Read [`STATE_PATH`] and [`OPS_PATH`]; [`Error::Unsupported`] without sched_ext.
    pub fn read() -> Result<KernelState, Error> {
        let state = match std::fs::read_to_string(STATE_PATH) {
            Ok(s) => s.trim().to_string(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(Error::Unsupported),
            Err(source) => {
                return Err(Error::Sysfs {
                    path: STATE_PATH,
                    source,
                });
            }
        };
        let ops = std::fs::read_to_string(OPS_PATH)
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        Ok(KernelState { state, ops })
    }

    /// Whether scx_agentos is the running scheduler.
    pub fn is_agentos(&self) -> bool {
        self.state == "enabled" && is_agentos_ops(&self.ops)
    }
}

/// Whether an `ops` name is this scheduler's (the kernel may append `_<suffix>`).
pub fn is_agentos_ops(ops: &str) -> bool {
    ops == OPS_NAME || ops.starts_with("agentos_")
}

/// The cgroup id the BPF side sees (`cgrp->kn->id`): the inode number of the cgroup2 directory.
pub fn cgroup_id(path: &Path) -> Result<u64, Error> {
    std::fs::metadata(path)
        .map(|m| m.ino())
        .map_err(|source| Error::Cgroup {
            path: path.display().to_string(),
            source,
        })
}

/// Map key bytes of a cgroup id (native endian u64, as the BPF map stores it).
pub fn key_bytes(cgroup_id: u64) -> [u8; 8] {
    cgroup_id.to_ne_bytes()
}

/// Map value bytes of a class.
pub fn value_bytes(class: Class) -> [u8; 4] {
    class.value().to_ne_bytes()
}

/// A NUL-terminated C string in a fixed array.
fn c_string(raw: &[i8]) -> String {
    let bytes: Vec<u8> = raw
        .iter()
        .map(|&c| c as u8)
        .take_while(|&c| c != 0)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The loaded and attached scheduler. Dropping it detaches it (the kernel reverts to the fair
/// class).
pub struct Scheduler {
    // Field order: the link goes before the skeleton that owns the programs.
    link: Option<libbpf_rs::Link>,
    skel: MainSkel<'static>,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("attached", &self.link.is_some())
            .finish()
    }
}

impl Scheduler {
    /// Open, load and attach scx_agentos. Fails with [`Error::Unsupported`] when the kernel has
    /// no sched_ext and [`Error::Busy`] when another BPF scheduler runs.
    pub fn load() -> Result<Scheduler, Error> {
        let st = KernelState::read()?;
        if st.state != "disabled" {
            return Err(Error::Busy {
                state: st.state,
                ops: st.ops,
            });
        }
        // The skeleton borrows its object storage for its whole life; a scheduler is loaded
        // once per process (or after the kernel kicked it out), so the few bytes are leaked.
        let storage: &'static mut MaybeUninit<libbpf_rs::OpenObject> =
            Box::leak(Box::new(MaybeUninit::uninit()));
        let mut open = MainSkelBuilder::default()
            .open(storage)
            .map_err(|source| Error::Bpf {
                what: "opening the BPF object",
                source,
            })?;
        // scx's headers carry an fentry probe for helpers this scheduler does not use.
        open.progs.scx_lib_init_probe.set_autoload(false);
        let mut skel = open.load().map_err(|source| Error::Bpf {
            what: "loading the BPF programs (see the verifier log above)",
            source,
        })?;
        let link = skel
            .maps
            .agentos_ops
            .attach_struct_ops()
            .map_err(|source| Error::Bpf {
                what: "attaching the struct_ops (sched_ext refused the scheduler)",
                source,
            })?;
        let _ = skel.attach();
        Ok(Scheduler {
            link: Some(link),
            skel,
        })
    }

    /// Put the cgroup `cgroup_id` (and everything below it) into `class`.
    pub fn set_class(&self, cgroup_id: u64, class: Class) -> Result<(), Error> {
        self.skel
            .maps
            .agentos_classes
            .update(&key_bytes(cgroup_id), &value_bytes(class), MapFlags::ANY)
            .map_err(|source| Error::Bpf {
                what: "updating the class map",
                source,
            })
    }

    /// Forget `cgroup_id`; true when it was there.
    pub fn remove(&self, cgroup_id: u64) -> Result<bool, Error> {
        match self.skel.maps.agentos_classes.delete(&key_bytes(cgroup_id)) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == libbpf_rs::ErrorKind::NotFound => Ok(false),
            Err(source) => Err(Error::Bpf {
                what: "deleting from the class map",
                source,
            }),
        }
    }

    /// The class map's entries.
    pub fn classes(&self) -> Vec<(u64, Class)> {
        let map = &self.skel.maps.agentos_classes;
        map.keys()
            .filter_map(|k| {
                let id = u64::from_ne_bytes(k.as_slice().try_into().ok()?);
                let v = map.lookup(&k, MapFlags::ANY).ok()??;
                let class = Class::from_value(u32::from_ne_bytes(v.as_slice().try_into().ok()?))?;
                Some((id, class))
            })
            .collect()
    }

    /// Why the kernel stopped the scheduler, once it has (`None` while it runs).
    pub fn exit_info(&self) -> Option<ExitInfo> {
        let data = self.skel.maps.data_data.as_deref()?;
        // SAFETY: `data` is the mmap of the BPF program's .data section, valid while the
        // skeleton lives; the BPF side writes `kind` last with a full barrier.
        let kind = unsafe { std::ptr::read_volatile(&data.uei.kind) };
        if kind == 0 {
            return None;
        }
        Some(ExitInfo {
            kind,
            code: data.uei.exit_code,
            reason: c_string(&data.uei.reason),
            msg: c_string(&data.uei.msg),
        })
    }

    /// The BPF side's counters.
    pub fn stats(&self) -> Stats {
        let Some(bss) = self.skel.maps.bss_data.as_deref() else {
            return Stats::default();
        };
        // SAFETY: `bss` is the mmap of the program's .bss, valid while the skeleton lives; the
        // counters are u64 words updated atomically by BPF, read here one by one.
        let rd = |v: &u64| unsafe { std::ptr::read_volatile(v) };
        Stats {
            enqueued: [
                rd(&bss.nr_enqueued[0]),
                rd(&bss.nr_enqueued[1]),
                rd(&bss.nr_enqueued[2]),
            ],
            dispatched: [
                rd(&bss.nr_dispatched[0]),
                rd(&bss.nr_dispatched[1]),
                rd(&bss.nr_dispatched[2]),
            ],
            direct: rd(&bss.nr_direct),
            preempted: rd(&bss.nr_preempt),
            dt_rescued: rd(&bss.nr_dt_rescued),
            srt_yields: rd(&bss.nr_srt_yield),
            throttled: rd(&bss.nr_throttled),
        }
    }

    /// Detach now (the same as dropping it) and return the exit information, if any.
    pub fn unload(mut self) -> Option<ExitInfo> {
        self.link.take();
        self.exit_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_map_to_intf_values() {
        assert_eq!(Class::from_latency("SRT"), Some(Class::Srt));
        assert_eq!(Class::from_latency("DT"), Some(Class::Dt));
        assert_eq!(Class::from_latency("HRT"), None);
        assert_eq!(Class::from_latency(""), None);
        assert_eq!(Class::Srt.value(), 1);
        assert_eq!(Class::Dt.value(), 2);
        assert_eq!(Class::from_value(1), Some(Class::Srt));
        assert_eq!(Class::from_value(0), None);
        assert_eq!("srt".parse::<Class>(), Ok(Class::Srt));
        assert!("hrt".parse::<Class>().is_err());
        assert_eq!(value_bytes(Class::Dt), 2u32.to_ne_bytes());
        assert_eq!(key_bytes(0x1234), 0x1234u64.to_ne_bytes());
    }

    #[test]
    fn intf_constants_match_the_header() {
        let h = include_str!("bpf/intf.h");
        let has = |needle: &str| {
            assert!(
                h.split_whitespace()
                    .collect::<Vec<_>>()
                    .join(" ")
                    .contains(needle),
                "intf.h lacks {needle:?}"
            )
        };
        has("AGENTOS_CLASS_SRT = 1,");
        has("AGENTOS_CLASS_DT = 2,");
        has(&format!("AGENTOS_MAX_CGROUPS = {MAX_CGROUPS},"));
        has(&format!("AGENTOS_SRT_MAX_STREAK = {SRT_MAX_STREAK},"));
        has(&format!(
            "AGENTOS_SRT_SLICE_NS ({}ULL * 1000 * 1000)",
            SRT_SLICE_NS / 1_000_000
        ));
        has(&format!(
            "AGENTOS_DT_SLICE_NS ({}ULL * 1000 * 1000)",
            DT_SLICE_NS / 1_000_000
        ));
        has(&format!(
            "AGENTOS_DT_MAX_WAIT_NS ({}ULL * 1000 * 1000)",
            DT_MAX_WAIT_NS / 1_000_000
        ));
    }

    #[test]
    fn ops_names() {
        assert!(is_agentos_ops("agentos"));
        assert!(is_agentos_ops("agentos_1"));
        assert!(!is_agentos_ops("simple"));
        assert!(!is_agentos_ops("agentosx"));
        let st = KernelState {
            state: "enabled".into(),
            ops: "agentos".into(),
        };
        assert!(st.is_agentos());
        let st = KernelState {
            state: "disabled".into(),
            ops: String::new(),
        };
        assert!(!st.is_agentos());
    }

    #[test]
    fn exit_info_text() {
        let e = ExitInfo {
            kind: 1026,
            code: 0,
            reason: "runnable task stall".into(),
            msg: "kworker/0:1[12] failed to run for 30.2s".into(),
        };
        assert!(e.is_error());
        assert_eq!(
            e.to_string(),
            "watchdog stall (kind 1026): runnable task stall (kworker/0:1[12] failed to run for 30.2s)"
        );
        let raw: Vec<i8> = b"abc\0def".iter().map(|&b| b as i8).collect();
        assert_eq!(c_string(&raw), "abc");
    }

    #[test]
    fn cgroup_id_is_the_inode() {
        let dir = std::env::temp_dir();
        let id = cgroup_id(&dir).expect("stat");
        assert_eq!(id, std::fs::metadata(&dir).expect("stat").ino());
        assert!(matches!(
            cgroup_id(Path::new("/nonexistent/cgroup")),
            Err(Error::Cgroup { .. })
        ));
    }

    /// On a kernel without sched_ext the loader fails with an error naming the missing file.
    #[test]
    fn load_without_sched_ext_fails_cleanly() {
        if Path::new(STATE_PATH).exists() {
            eprintln!("skipped: this kernel has sched_ext (the VM suite loads it)");
            return;
        }
        let e = Scheduler::load().expect_err("no sched_ext here");
        assert!(matches!(e, Error::Unsupported));
        assert!(e.to_string().contains("/sys/kernel/sched_ext"), "{e}");
    }
}
