//! Latency classes through the daemon, against the real kernel: an HRT agent runs under
//! SCHED_DEADLINE with the contract's parameters, admission refuses the agent that would
//! overload a CPU (with the numbers), a DT agent runs SCHED_IDLE. Root only; skips otherwise.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;

use agentosd::sched;
use common::{Bus, Daemon, TestCgroup};

/// A contract of class `class` with `slo` and `compute` inline maps (may be empty).
fn contract(dir: &Path, name: &str, class: &str, slo: &str, compute: &str, script: &str) -> String {
    let p = dir.join(format!("{name}.yaml"));
    let mut text = format!(
        "apiVersion: agentos/v0.2\nkind: AgentContract\nname: {name}\ntenant: default\n\
         class: {{ latency: {class}{slo} }}\nexec: {{ command: /bin/sh, args: [\"-c\", \"{script}\"] }}\n"
    );
    if !compute.is_empty() {
        text.push_str(&format!("compute: {{ {compute} }}\n"));
    }
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

fn deadline_supported() -> bool {
    // A throwaway thread tries SCHED_DEADLINE on itself.
    std::thread::spawn(|| {
        let attr = sched::SchedAttr::deadline(&sched::Deadline {
            runtime_ns: 1_000_000,
            deadline_ns: 10_000_000,
            period_ns: 10_000_000,
        });
        sched::set_attr(0, &attr).is_ok()
    })
    .join()
    .unwrap_or(false)
}

macro_rules! setup {
    ($tag:expr) => {{
        skip_unless_capable!();
        if !deadline_supported() {
            common::skip(
                module_path!(),
                "sched_setattr(SCHED_DEADLINE) is refused on this host",
            );
            return;
        }
        let bus = Bus::start();
        let cg = TestCgroup::new($tag);
        let dir = tempfile::tempdir().unwrap();
        let d = Daemon::start(&bus, &cg.path, dir.path());
        (bus, cg, dir, d)
    }};
}

fn policy(pid: u32) -> sched::DlState {
    sched::parse_proc_sched(&std::fs::read_to_string(format!("/proc/{pid}/sched")).unwrap())
}

#[test]
fn hrt_agent_runs_sched_deadline_and_admission_refuses_overload() {
    let (_bus, _cg, dir, d) = setup!("hrt");
    // 6 ms every 10 ms on CPU 0: 0.6 of the CPU. The loop sleeps so the test host stays calm.
    let slo = ", slo: { runtime_ms: 6, deadline_ms: 10, period_ms: 10 }";
    let a = contract(
        dir.path(),
        "loop-a",
        "HRT",
        slo,
        "cpuset: [0], mem: \"32MiB\"",
        "while :; do sleep 0.05; done",
    );
    d.ctl_ok(&["start", &a]);
    let st = d.wait_state("loop-a", "running", 5);
    let pid = st["main_pid"].as_u64().unwrap() as u32;
    assert_eq!(
        policy(pid).policy,
        sched::SCHED_DEADLINE,
        "policy 6 in /proc/{pid}/sched"
    );
    let attr = sched::get_attr(pid).unwrap();
    assert_eq!(
        (attr.sched_runtime, attr.sched_deadline, attr.sched_period),
        (6_000_000, 10_000_000, 10_000_000)
    );
    assert_eq!(attr.sched_flags & sched::SCHED_FLAG_RESET_ON_FORK, 1);
    assert_eq!(st["latency_class"], "HRT");
    assert_eq!(st["deadline_misses"], 0, "{st}");
    let text = d.ctl_ok(&["status", "loop-a"]);
    assert!(
        text.contains("SCHED_DEADLINE runtime 6 ms / deadline 10 ms / period 10 ms"),
        "{text}"
    );
    assert!(text.contains("Misses: 0"), "{text}");

    // A second 0.6 reservation on CPU 0 is refused before it starts, with the numbers.
    let b = contract(
        dir.path(),
        "loop-b",
        "HRT",
        slo,
        "cpuset: [0]",
        "while :; do sleep 0.05; done",
    );
    let out = d.ctl(&["start", &b]);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "second agent admitted: {err}");
    assert!(
        err.contains("admission: agent default/loop-b (runtime 6 ms / deadline 10 ms / period 10 ms) refused: does not fit on CPU 0: utilisation 0.600 + 0.600 = 1.200 exceeds the bound 0.950"),
        "{err}"
    );
    let list = d.ctl_ok(&["list"]);
    assert!(!list.contains("loop-b"), "refused agent registered: {list}");

    // Stopping the first releases its reservation: now the second fits.
    d.ctl_ok(&["stop", "loop-a"]);
    d.wait_state("loop-a", "inactive", 10);
    d.ctl_ok(&["start", &b]);
    let st = d.wait_state("loop-b", "running", 5);
    assert_eq!(
        policy(st["main_pid"].as_u64().unwrap() as u32).policy,
        sched::SCHED_DEADLINE
    );
    d.ctl_ok(&["stop", "loop-b"]);
}

#[test]
fn hrt_agent_may_fork_and_children_are_normal() {
    let (_bus, _cg, dir, d) = setup!("hrtfork");
    let a = contract(
        dir.path(),
        "forker",
        "HRT",
        ", slo: { runtime_ms: 1, deadline_ms: 10, period_ms: 10 }",
        "",
        "sleep 30",
    );
    d.ctl_ok(&["start", &a]);
    let st = d.wait_state("forker", "running", 5);
    let pid = st["main_pid"].as_u64().unwrap() as u32;
    // `sh -c "sleep 30"` execs sleep directly or forks it; either way the process that the
    // daemon started exists and kept or passed on its class without EAGAIN.
    let procs = st["processes"].as_array().unwrap().clone();
    assert!(!procs.is_empty());
    for p in procs {
        let p = p[0].as_u64().unwrap() as u32;
        let want = if p == pid { sched::SCHED_DEADLINE } else { 0 };
        assert_eq!(policy(p).policy, want, "process {p}");
    }
    d.ctl_ok(&["stop", "forker"]);
}

#[test]
fn dt_agent_runs_sched_idle() {
    let (_bus, _cg, dir, d) = setup!("dt");
    let a = contract(dir.path(), "batch", "DT", "", "", "sleep 30");
    d.ctl_ok(&["start", &a]);
    let st = d.wait_state("batch", "running", 5);
    let pid = st["main_pid"].as_u64().unwrap() as u32;
    assert_eq!(policy(pid).policy, sched::SCHED_IDLE);
    assert!(st["deadline_misses"].is_null(), "{st}");
    d.ctl_ok(&["stop", "batch"]);
}

/// An SRT agent where neither the `cpu` controller nor sched_ext can hold it (this host) runs at
/// nice 10, below the operator and level with the daemon's work for agents, and its status says
/// so; where the controller is (the VM), cpu.weight does that and it stays at nice 0.
#[test]
fn srt_agent_is_niced_where_nothing_else_holds_it() {
    let (_bus, cg, dir, d) = setup!("srt");
    let a = contract(dir.path(), "chat", "SRT", "", "", "sleep 30");
    d.ctl_ok(&["start", &a]);
    let st = d.wait_state("chat", "running", 5);
    let pid = st["main_pid"].as_u64().unwrap() as u32;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    // Field 19 (nice) is the 17th after the command.
    let nice: i32 = after.split_whitespace().nth(16).unwrap().parse().unwrap();
    let notes = st["notes"].to_string();
    let controllers =
        std::fs::read_to_string(cg.path.join("cgroup.subtree_control")).unwrap_or_default();
    if controllers.split_whitespace().any(|c| c == "cpu") || notes.contains("scx_agentos") {
        assert_eq!(nice, 0, "{notes}");
    } else {
        assert_eq!(nice, sched::SRT_FALLBACK_NICE, "{notes}");
        assert!(notes.contains("class SRT: nice 10"), "{notes}");
    }
    d.ctl_ok(&["stop", "chat"]);
}
