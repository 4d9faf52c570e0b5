//! Latency classes in the kernel: the contract's class becomes a scheduling policy for the main
//! process and a few cgroup files for its group. See docs/scheduling.md.
//!
//! | class | main process (set in the child before execve) | cgroup |
//! |---|---|---|
//! | HRT | `SCHED_DEADLINE` runtime/deadline/period, `SCHED_FLAG_RESET_ON_FORK` | `cpuset.cpus` (+ partition) when pinned, `memory.min` = memory budget, `memory.swap.max=0` |
//! | SRT | default (sched_ext's `scx_agentos` classifies it by cgroup when loaded) | `cpu.weight=1000` fallback |
//! | DT | `SCHED_IDLE` | `cpu.weight=1`, `cpu.idle=1` |
//!
//! Deadline tasks may not fork (`fork`/`clone` fail with EAGAIN). The main thread gets
//! `SCHED_DEADLINE` in the child right before `execve` (exec is allowed and keeps the policy);
//! with `SCHED_FLAG_RESET_ON_FORK` the agent may still start threads and processes, which begin
//! as `SCHED_OTHER`. The control loop belongs in the main thread.
//!
//! Admission: [`Admission`] wraps the contracts crate's [`AdmissionSet`] over the online CPUs
//! and the kernel's `sched_rt_runtime_us/sched_rt_period_us` share; every HRT agent is admitted
//! before its process exists and released when it stops or exits.
//!
//! Deadline misses: the kernel does not count them per task (`/proc/PID/sched` shows only the
//! remaining `dl.runtime` and the absolute `dl.deadline`; `SCHED_FLAG_DL_OVERRUN` sends SIGXCPU,
//! whose default action kills an agent that does not handle it). [`OverrunMonitor`] samples
//! every thread's `dl.runtime`: a negative value means the task used up its runtime in that
//! period and is throttled until the next one. Each (thread, deadline) seen so counts once; the
//! count is a lower bound (sampling every [`MONITOR_INTERVAL`]).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use contracts::{AdmissionConfig, AdmissionSet, DeadlineParams};
use serde::{Deserialize, Serialize};

// The kernel interface (`struct sched_attr`, `sched_setattr`, `sched_getattr`) lives in the
// kernel layer; re-exported here so `sched::set_attr` and friends keep their paths.
pub use crate::sys::sched::{
    SCHED_ATTR_SIZE, SCHED_DEADLINE, SCHED_FLAG_RESET_ON_FORK, SCHED_IDLE, SchedAttr, get_attr,
    raw_sched_setattr, set_attr,
};

/// `cpu.weight` of SRT agents without sched_ext (default 100, range 1..=10000).
pub const SRT_WEIGHT: u32 = 1000;
/// `cpu.weight` of DT agents.
pub const DT_WEIGHT: u32 = 1;
/// The nice value of SRT agents where neither the `cpu` controller nor sched_ext can hold them
/// to anything: the default `--agent-work-nice`, so an agent that burns CPU sits below the
/// operator and the daemon's control plane and level with the daemon's work for the other
/// agents (without it, a nice-0 agent outranks that work 9 to 1; docs/benchmarks.md, "bench
/// isolation").
pub const SRT_FALLBACK_NICE: i32 = 10;
/// How often [`OverrunMonitor`] samples.
pub const MONITOR_INTERVAL: Duration = agentos_api::DEADLINE_SAMPLE_INTERVAL;

/// SCHED_DEADLINE parameters as persisted with the agent (ns).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deadline {
    pub runtime_ns: u64,
    pub deadline_ns: u64,
    pub period_ns: u64,
}

impl From<DeadlineParams> for Deadline {
    fn from(p: DeadlineParams) -> Self {
        Deadline {
            runtime_ns: p.runtime_ns,
            deadline_ns: p.deadline_ns,
            period_ns: p.period_ns,
        }
    }
}

impl From<Deadline> for DeadlineParams {
    fn from(d: Deadline) -> Self {
        DeadlineParams {
            runtime_ns: d.runtime_ns,
            deadline_ns: d.deadline_ns,
            period_ns: d.period_ns,
        }
    }
}

impl std::fmt::Display for Deadline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "runtime {} / deadline {} / period {}",
            fmt_ns(self.runtime_ns),
            fmt_ns(self.deadline_ns),
            fmt_ns(self.period_ns)
        )
    }
}

fn fmt_ns(ns: u64) -> String {
    if ns.is_multiple_of(1_000_000) {
        format!("{} ms", ns / 1_000_000)
    } else if ns.is_multiple_of(1_000) {
        format!("{} us", ns / 1_000)
    } else {
        format!("{ns} ns")
    }
}

/// The scheduling part of an agent's spec.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SchedSpec {
    /// HRT reservation; `None` for other classes.
    #[serde(default)]
    pub deadline: Option<Deadline>,
    /// CPUs the contract asks for (`compute.cpuset`); empty = any.
    #[serde(default)]
    pub cpuset: Vec<u32>,
}

impl SchedSpec {
    pub fn from_contract(c: &contracts::Contract) -> Self {
        SchedSpec {
            deadline: c.deadline().map(Deadline::from),
            cpuset: c.cpuset().to_vec(),
        }
    }
}

impl SchedAttr {
    /// SCHED_DEADLINE with `SCHED_FLAG_RESET_ON_FORK`.
    pub fn deadline(d: &Deadline) -> Self {
        SchedAttr {
            size: SCHED_ATTR_SIZE,
            sched_policy: SCHED_DEADLINE,
            sched_flags: SCHED_FLAG_RESET_ON_FORK,
            sched_runtime: d.runtime_ns,
            sched_deadline: d.deadline_ns,
            sched_period: d.period_ns,
            ..Default::default()
        }
    }
}

/// What the child does to its own scheduling before execve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ChildSched {
    #[default]
    None,
    /// `sched_setscheduler(SCHED_IDLE)`.
    Idle,
    /// `sched_setattr(SCHED_DEADLINE)`.
    Deadline(SchedAttr),
    /// `setpriority(PRIO_PROCESS, 0, nice)`.
    Nice(i32),
}

/// What launching an agent of some class means on this host.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub child: ChildSched,
    /// cgroup files to write, in order: (file, value, what failure means).
    pub cgroup_files: Vec<(&'static str, String)>,
    /// Said in `status` (what is applied).
    pub notes: Vec<String>,
    /// What the contract asks for that this host cannot do.
    pub unenforced: Vec<String>,
}

/// Map a class to a plan. `available` are the controllers of the agent's cgroup, `cpu` the CPU
/// admission chose (HRT), `memory_bytes` the memory budget, `scx_loaded` whether `scx_agentos`
/// runs (then SRT needs no weight boost).
pub fn plan(
    class: &str,
    spec: &SchedSpec,
    available: &[String],
    cpu: Option<u32>,
    memory_bytes: Option<u64>,
    scx_loaded: bool,
) -> Plan {
    let has = |c: &str| available.iter().any(|a| a == c);
    let mut p = Plan::default();
    match class {
        "HRT" => {
            let Some(d) = spec.deadline else {
                p.unenforced.push(
                    "class HRT without slo.deadline_ms: SCHED_DEADLINE not applied".to_string(),
                );
                return p;
            };
            p.child = ChildSched::Deadline(SchedAttr::deadline(&d));
            p.notes.push(format!(
                "class HRT: SCHED_DEADLINE {d}{}",
                cpu.map(|c| format!(", admitted on CPU {c}"))
                    .unwrap_or_default()
            ));
            if !spec.cpuset.is_empty() {
                match (has("cpuset"), cpu) {
                    (true, Some(c)) => {
                        // A deadline task's affinity must span its root domain: pinning needs
                        // an exclusive partition (the supervisor undoes the pin if refused).
                        p.cgroup_files.push(("cpuset.cpus", c.to_string()));
                        p.cgroup_files
                            .push(("cpuset.cpus.partition", "root".into()));
                        p.notes
                            .push(format!("pinned: cpuset.cpus={c} (partition root)"));
                    }
                    _ => p.unenforced.push(format!(
                        "cpuset {:?} (cpuset controller not available)",
                        spec.cpuset
                    )),
                }
            }
            if let Some(m) = memory_bytes {
                if has("memory") {
                    p.cgroup_files.push(("memory.min", m.to_string()));
                    p.cgroup_files.push(("memory.swap.max", "0".into()));
                    p.notes.push(format!("memory.min={m}, memory.swap.max=0"));
                } else {
                    p.unenforced.push(format!(
                        "memory.min={m}, memory.swap.max=0 (memory controller not available)"
                    ));
                }
            }
        }
        "SRT" => {
            if scx_loaded {
                p.notes
                    .push("class SRT: scx_agentos dispatches it ahead of DT".to_string());
            } else if has("cpu") {
                p.cgroup_files.push(("cpu.weight", SRT_WEIGHT.to_string()));
                p.notes.push(format!(
                    "class SRT: cpu.weight={SRT_WEIGHT} (no sched_ext scheduler loaded)"
                ));
            } else {
                p.child = ChildSched::Nice(SRT_FALLBACK_NICE);
                p.notes.push(format!(
                    "class SRT: nice {SRT_FALLBACK_NICE} (no cpu controller, no sched_ext)"
                ));
                p.unenforced.push(format!(
                    "class SRT: cpu.weight={SRT_WEIGHT} (cpu controller not available, no sched_ext; nice {SRT_FALLBACK_NICE} instead)"
                ));
            }
        }
        "DT" => {
            p.child = ChildSched::Idle;
            if has("cpu") {
                // cpu.weight cannot be written once cpu.idle=1.
                p.cgroup_files.push(("cpu.weight", DT_WEIGHT.to_string()));
                p.cgroup_files.push(("cpu.idle", "1".into()));
                p.notes.push(format!(
                    "class DT: SCHED_IDLE, cpu.weight={DT_WEIGHT}, cpu.idle=1"
                ));
            } else {
                p.notes.push("class DT: SCHED_IDLE".to_string());
            }
        }
        _ => {}
    }
    p
}

/// Whether a `cpuset.cpus.partition` reading is a working partition root (not `member`, not
/// `root invalid (…)`, which the kernel accepts as a write but does not apply).
pub fn partition_is_valid_root(state: &str) -> bool {
    state.trim() == "root"
}

/// The CPUs SCHED_DEADLINE tasks may use: the online CPUs.
pub fn online_cpus() -> Vec<u32> {
    std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|s| parse_cpu_list(s.trim()))
        .unwrap_or_else(|| {
            let n = std::thread::available_parallelism().map_or(1, |n| n.get());
            (0..n as u32).collect()
        })
}

/// Parse a cpulist such as `0-3,6`.
pub fn parse_cpu_list(s: &str) -> Option<Vec<u32>> {
    let mut out = Vec::new();
    for part in s.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.parse().ok()?, b.parse().ok()?);
                out.extend(a..=b);
            }
            None => out.push(part.parse().ok()?),
        }
    }
    Some(out)
}

/// The kernel's deadline bandwidth share from the sysctls.
pub fn admission_config() -> AdmissionConfig {
    let read = crate::sys::sched::sysctl;
    let mut cfg = AdmissionConfig::from_sysctl(
        read("sched_rt_runtime_us").unwrap_or(950_000),
        read("sched_rt_period_us").unwrap_or(1_000_000).max(1) as u64,
    );
    if let Some(v) = read("sched_deadline_period_min_us") {
        cfg.period_min_us = v.max(0) as u64;
    }
    if let Some(v) = read("sched_deadline_period_max_us") {
        cfg.period_max_us = v.max(0) as u64;
    }
    cfg
}

/// The daemon's admitted HRT reservations.
#[derive(Debug)]
pub struct Admission {
    set: Mutex<AdmissionSet>,
}

impl Default for Admission {
    fn default() -> Self {
        Self::new(online_cpus(), admission_config())
    }
}

impl Admission {
    pub fn new(cpus: Vec<u32>, cfg: AdmissionConfig) -> Self {
        Admission {
            set: Mutex::new(AdmissionSet::new(cpus, cfg)),
        }
    }

    fn set(&self) -> std::sync::MutexGuard<'_, AdmissionSet> {
        self.set.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `d` would be admitted now (nothing is reserved).
    pub fn check(&self, id: &str, d: &Deadline, cpuset: &[u32]) -> Result<u32, String> {
        let mut s = self.set().clone();
        s.release(id);
        s.find_cpu(&(*d).into(), cpuset)
            .map_err(|e| refusal(id, d, &e.reason))
    }

    /// Reserve `d` for `id` (replacing an earlier reservation of `id`); returns the CPU.
    pub fn admit(&self, id: &str, d: &Deadline, cpuset: &[u32]) -> Result<u32, String> {
        let mut s = self.set();
        s.release(id);
        s.admit(id, (*d).into(), cpuset)
            .map_err(|e| refusal(id, d, &e.reason))
    }

    pub fn release(&self, id: &str) -> bool {
        self.set().release(id)
    }
}

fn refusal(id: &str, d: &Deadline, reason: &str) -> String {
    format!("admission: agent {id} ({d}) refused: {reason}")
}

/// Per-thread deadline state from `/proc/PID/task/TID/sched`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DlState {
    pub policy: u32,
    /// Remaining runtime in this period (ns); negative after an overrun.
    pub runtime: i64,
    /// Absolute deadline (ns, rq clock).
    pub deadline: u64,
}

/// Parse the `policy`, `dl.runtime` and `dl.deadline` lines of a `sched` file.
pub fn parse_proc_sched(text: &str) -> DlState {
    let mut st = DlState::default();
    for line in text.lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let v = v.trim();
        match k.trim() {
            "policy" => st.policy = v.parse().unwrap_or(0),
            "dl.runtime" => st.runtime = v.parse().unwrap_or(0),
            "dl.deadline" => st.deadline = v.parse().unwrap_or(0),
            _ => {}
        }
    }
    st
}

/// Counts overruns seen in the deadline threads of one process.
#[derive(Debug, Default)]
pub struct OverrunMonitor {
    seen: Mutex<(u64, HashMap<u32, u64>)>,
}

impl OverrunMonitor {
    pub fn misses(&self) -> u64 {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).0
    }

    pub fn reset(&self) {
        *self.seen.lock().unwrap_or_else(|p| p.into_inner()) = (0, HashMap::new());
    }

    /// Record one observation of thread `tid`; true when it is a new overrun.
    pub fn observe(&self, tid: u32, st: DlState) -> bool {
        if st.policy != SCHED_DEADLINE || st.runtime >= 0 {
            return false;
        }
        let mut g = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if g.1.get(&tid) == Some(&st.deadline) {
            return false;
        }
        g.1.insert(tid, st.deadline);
        g.0 += 1;
        true
    }

    /// Sample every thread of `pid`; false when the process is gone.
    pub fn sample(&self, pid: u32) -> bool {
        let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return false;
        };
        for e in rd.flatten() {
            let Some(tid) = e.file_name().to_str().and_then(|s| s.parse().ok()) else {
                continue;
            };
            if let Ok(text) = std::fs::read_to_string(e.path().join("sched")) {
                self.observe(tid, parse_proc_sched(&text));
            }
        }
        true
    }
}

/// Whether the sched_ext scheduler `scx_agentos` is the one running.
pub fn scx_agentos_loaded() -> bool {
    let state = std::fs::read_to_string("/sys/kernel/sched_ext/state").unwrap_or_default();
    let ops = std::fs::read_to_string("/sys/kernel/sched_ext/root/ops").unwrap_or_default();
    state.trim() == "enabled" && ops.trim().starts_with("agentos")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(r: u64, d: u64, p: u64) -> Deadline {
        Deadline {
            runtime_ns: r * 1_000_000,
            deadline_ns: d * 1_000_000,
            period_ns: p * 1_000_000,
        }
    }

    fn ctl(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn sched_attr_layout() {
        assert_eq!(std::mem::size_of::<SchedAttr>(), 48);
        assert_eq!(
            std::mem::size_of::<SchedAttr>(),
            std::mem::size_of::<libc::sched_attr>()
        );
        let a = SchedAttr::deadline(&ms(2, 5, 10));
        assert_eq!(a.size, 48);
        assert_eq!(a.sched_policy, 6);
        assert_eq!(a.sched_flags, SCHED_FLAG_RESET_ON_FORK);
        assert_eq!(
            (a.sched_runtime, a.sched_deadline, a.sched_period),
            (2_000_000, 5_000_000, 10_000_000)
        );
    }

    #[test]
    fn hrt_plan() {
        let spec = SchedSpec {
            deadline: Some(ms(2, 5, 10)),
            cpuset: vec![1],
        };
        let all = ctl(&["cpuset", "cpu", "memory", "pids"]);
        let p = plan("HRT", &spec, &all, Some(1), Some(32 << 20), false);
        assert_eq!(
            p.child,
            ChildSched::Deadline(SchedAttr::deadline(&ms(2, 5, 10)))
        );
        assert_eq!(
            p.cgroup_files,
            vec![
                ("cpuset.cpus", "1".to_string()),
                ("cpuset.cpus.partition", "root".to_string()),
                ("memory.min", (32u64 << 20).to_string()),
                ("memory.swap.max", "0".to_string()),
            ]
        );
        assert!(p.unenforced.is_empty());
        assert!(p.notes[0].contains("runtime 2 ms / deadline 5 ms / period 10 ms"));
        // The host here: no controllers.
        let p = plan("HRT", &spec, &[], Some(1), Some(32 << 20), false);
        assert!(matches!(p.child, ChildSched::Deadline(_)));
        assert!(p.cgroup_files.is_empty());
        assert_eq!(p.unenforced.len(), 2, "{:?}", p.unenforced);
        // HRT without parameters.
        let p = plan("HRT", &SchedSpec::default(), &all, None, None, false);
        assert_eq!(p.child, ChildSched::None);
        assert_eq!(p.unenforced.len(), 1);
    }

    #[test]
    fn srt_and_dt_plans() {
        let cpu = ctl(&["cpu"]);
        let s = SchedSpec::default();
        let p = plan("SRT", &s, &cpu, None, None, false);
        assert_eq!(p.child, ChildSched::None);
        assert_eq!(p.cgroup_files, vec![("cpu.weight", "1000".to_string())]);
        let p = plan("SRT", &s, &cpu, None, None, true);
        assert!(p.cgroup_files.is_empty());
        let p = plan("SRT", &s, &[], None, None, false);
        assert_eq!(p.unenforced.len(), 1);
        // Nothing to hold it: below the operator, level with the daemon's work for agents.
        assert_eq!(p.child, ChildSched::Nice(SRT_FALLBACK_NICE));
        let p = plan("DT", &s, &cpu, None, None, false);
        assert_eq!(p.child, ChildSched::Idle);
        assert_eq!(
            p.cgroup_files,
            vec![
                ("cpu.weight", "1".to_string()),
                ("cpu.idle", "1".to_string())
            ]
        );
        let p = plan("DT", &s, &[], None, None, false);
        assert_eq!(p.child, ChildSched::Idle);
        assert!(p.cgroup_files.is_empty() && p.unenforced.is_empty());
        assert_eq!(plan("", &s, &cpu, None, None, false), Plan::default());
    }

    #[test]
    fn admission_refuses_with_numbers() {
        let a = Admission::new(vec![0, 1], AdmissionConfig::default());
        assert_eq!(a.admit("t/a", &ms(6, 10, 10), &[0]), Ok(0));
        // Re-admitting the same agent replaces its reservation.
        assert_eq!(a.admit("t/a", &ms(6, 10, 10), &[0]), Ok(0));
        let e = a.admit("t/b", &ms(6, 10, 10), &[0]).unwrap_err();
        assert_eq!(
            e,
            "admission: agent t/b (runtime 6 ms / deadline 10 ms / period 10 ms) refused: \
             does not fit on CPU 0: utilisation 0.600 + 0.600 = 1.200 exceeds the bound 0.950 \
             (sched_rt_runtime_us/sched_rt_period_us = 950000/1000000)"
        );
        assert_eq!(a.check("t/b", &ms(6, 10, 10), &[]), Ok(1));
        assert_eq!(a.admit("t/b", &ms(6, 10, 10), &[]), Ok(1));
        assert!(a.release("t/a"));
        assert_eq!(a.admit("t/c", &ms(6, 10, 10), &[0]), Ok(0));
    }

    #[test]
    fn partition_states() {
        assert!(partition_is_valid_root("root\n"));
        assert!(!partition_is_valid_root(
            "root invalid (Parent is not a partition root)\n"
        ));
        assert!(!partition_is_valid_root("member\n"));
        assert!(!partition_is_valid_root(""));
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0-3,6"), Some(vec![0, 1, 2, 3, 6]));
        assert_eq!(parse_cpu_list("0"), Some(vec![0]));
        assert_eq!(parse_cpu_list("x"), None);
    }

    #[test]
    fn proc_sched_and_overruns() {
        let text = "sh (25264, #threads: 1)\n---\npolicy                                       :                    6\n\
                    prio                                         :                   -1\n\
                    dl.runtime                                   :             -1568706\n\
                    dl.deadline                                  :       10253499768911\n";
        let st = parse_proc_sched(text);
        assert_eq!(
            st,
            DlState {
                policy: 6,
                runtime: -1_568_706,
                deadline: 10_253_499_768_911
            }
        );
        let m = OverrunMonitor::default();
        assert!(m.observe(7, st));
        assert!(!m.observe(7, st), "same period counts once");
        assert!(!m.observe(7, DlState { runtime: 5, ..st }));
        assert!(m.observe(
            7,
            DlState {
                deadline: st.deadline + 10_000_000,
                ..st
            }
        ));
        assert!(!m.observe(8, DlState { policy: 0, ..st }));
        assert_eq!(m.misses(), 2);
    }
}
