//! Latency classes in the guest, where the kernel has sched_ext: the sched_ext scheduler
//! scx_agentos is loaded by agentosd (`AGENTOSD_SCHED_EXT=1`, set by the VM install), an SRT
//! agent wakes up sooner than a DT agent while DT agents burn every vCPU, HRT admission refuses
//! the agent that would overload a CPU, and stopping agentosd returns the kernel to the fair
//! class with the agents still running. Timing under emulation is coarse: only the ordering of
//! medians is asserted. See docs/scheduling.md.

use std::path::Path;
use std::time::{Duration, Instant};

use vm_tests::{Agent, agentctl, cmd, helper, require_vm, systemctl, wait_for, write_contract};

const STATE: &str = "/sys/kernel/sched_ext/state";
const OPS: &str = "/sys/kernel/sched_ext/root/ops";

fn read(path: &str) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("reading {path}: {e}"))
        .trim()
        .to_string()
}

/// Waits until sched_ext reports `state` (and, when enabled, the agentos scheduler).
#[track_caller]
fn wait_sched_ext(want: &str) {
    wait_for(
        &format!("{STATE} = {want}"),
        Duration::from_secs(30),
        || {
            let st = read(STATE);
            let ops = std::fs::read_to_string(OPS).unwrap_or_default();
            (st == want && (want != "enabled" || ops.trim().starts_with("agentos"))).then_some(())
        },
    );
}

/// A contract with `class` (the inside of `class: { … }`) and an optional `compute` map.
fn contract(name: &str, class: &str, command: &str, args: &[&str], compute: &str) -> String {
    let args = args
        .iter()
        .map(|a| serde_json::to_string(a).unwrap_or_default())
        .collect::<Vec<_>>()
        .join(", ");
    let mut text = format!(
        "apiVersion: agentos/v0.2\nkind: AgentContract\nname: {name}\ntenant: default\n\
         class: {{ {class} }}\nexec: {{ command: {command}, args: [{args}] }}\n\
         restart: {{ policy: \"no\" }}\n"
    );
    if !compute.is_empty() {
        text.push_str(&format!("compute: {{ {compute} }}\n"));
    }
    text
}

fn start(name: &str, class: &str, command: &str, args: &[&str], compute: &str) -> Agent {
    let c = write_contract(name, &contract(name, class, command, args, compute));
    let a = Agent::start(name, &c);
    a.wait_state("running", Duration::from_secs(30));
    a
}

/// Print a measurement to the serial log even when the test passes (`print!` is captured by
/// the test harness; a direct write to stdout is not).
fn report(line: &str) {
    use std::io::Write;
    let mut out = std::io::stdout();
    let _ = writeln!(out, "MEASURED {line}");
    let _ = out.flush();
}

/// Wake-up lateness of one window, from a `vmt-lat:` line.
#[derive(Debug, Clone, Copy)]
#[allow(dead_code)] // p99 is printed with the windows (Debug)
struct Lat {
    n: u64,
    p50: u64,
    p99: u64,
}

fn parse_lat(line: &str) -> Option<Lat> {
    let rest = line.split("vmt-lat: ").nth(1)?;
    let get = |k: &str| {
        rest.split_whitespace()
            .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('=')?.parse::<u64>().ok())
    };
    Some(Lat {
        n: get("n")?,
        p50: get("p50_us")?,
        p99: get("p99_us")?,
    })
}

/// The windows an agent running `vmt-lat` has reported so far.
fn lat_windows(name: &str) -> Vec<Lat> {
    let out = agentctl(&["logs", name, "-n", "200"]);
    out.stdout.lines().filter_map(parse_lat).collect()
}

#[test]
#[ignore = "needs the guest VM: run `cargo xtask vm test`"]
fn scx_agentos_is_loaded_by_agentosd() {
    require_vm();
    wait_sched_ext("enabled");
    assert_eq!(read(STATE), "enabled");
    let ops = read(OPS);
    assert!(ops.starts_with("agentos"), "{OPS} names {ops:?}");
    let check = cmd("agentosd", &["check"]).ok();
    assert!(
        check.stdout.contains("scx_agentos loaded"),
        "agentosd check does not report scx_agentos:\n{check}"
    );
    for line in check.stdout.lines().filter(|l| l.contains("sched_ext")) {
        report(line);
    }
    // An SRT agent is classified by the scheduler, not given a weight.
    let a = start(
        "vmt-scx-srt",
        "latency: SRT",
        "/bin/sh",
        &["-c", "while :; do sleep 1; done"],
        "",
    );
    let status = agentctl(&["status", "vmt-scx-srt"]).ok();
    assert!(
        status.stdout.contains("scx_agentos"),
        "status does not mention scx_agentos:\n{status}"
    );
    let weight = std::fs::read_to_string(a.cgroup().join("cpu.weight")).unwrap_or_default();
    assert_eq!(
        weight.trim(),
        "100",
        "SRT under scx_agentos keeps the default cpu.weight"
    );
}

#[test]
#[ignore = "needs the guest VM: run `cargo xtask vm test`"]
fn srt_wakes_sooner_than_dt_under_dt_load() {
    require_vm();
    wait_sched_ext("enabled");
    let lat = helper("vmt-lat");
    // Two DT burners, one per vCPU.
    let burn = ["-c", "while :; do :; done & while :; do :; done"];
    let _burn = start("vmt-scx-burn", "latency: DT", "/bin/sh", &burn, "pids: 16");
    let _srt = start("vmt-scx-lat-srt", "latency: SRT", &lat, &["4"], "");
    let _dt = start("vmt-scx-lat-dt", "latency: DT", &lat, &["4"], "");
    // Two windows each after the first (which includes start-up).
    let t0 = Instant::now();
    let (srt, dt) = wait_for(
        "three latency windows from each agent",
        Duration::from_secs(90),
        || {
            let s = lat_windows("vmt-scx-lat-srt");
            let d = lat_windows("vmt-scx-lat-dt");
            (s.len() >= 3 && d.len() >= 3).then(|| (s[1..].to_vec(), d[1..].to_vec()))
        },
    );
    let median = |w: &[Lat]| {
        let mut v: Vec<u64> = w.iter().map(|l| l.p50).collect();
        v.sort_unstable();
        v[v.len() / 2]
    };
    let (s50, d50) = (median(&srt), median(&dt));
    report(&format!(
        "wake-up lateness under DT load (scx_agentos, TCG) after {:?}: SRT p50 {s50} us \
         (windows {srt:?}), DT p50 {d50} us (windows {dt:?})",
        t0.elapsed()
    ));
    assert!(
        srt.iter().all(|l| l.n > 0) && dt.iter().all(|l| l.n > 0),
        "empty windows: SRT {srt:?}, DT {dt:?}"
    );
    assert!(
        s50 < d50,
        "SRT wake-up median {s50} us is not below DT's {d50} us (SRT {srt:?}, DT {dt:?})"
    );
    // The kernel did not kick the scheduler out meanwhile.
    assert_eq!(read(STATE), "enabled");
}

/// sched_ext tasks escape the kernel's CFS bandwidth control: scx_agentos enforces cpu.max
/// itself, so a busy SRT agent (dispatched first) still gets no more than its budget.
#[test]
#[ignore = "needs the guest VM: run `cargo xtask vm test`"]
fn srt_busy_loop_stays_within_its_cpu_budget() {
    require_vm();
    wait_sched_ext("enabled");
    let a = start(
        "vmt-scx-srt-busy",
        "latency: SRT",
        "/bin/sh",
        &["-c", "while :; do :; done"],
        "cpu: \"0.2\", pids: 8",
    );
    let cg = a.cgroup();
    let usage = || {
        let text = std::fs::read_to_string(cg.join("cpu.stat")).unwrap_or_default();
        text.lines()
            .find_map(|l| l.strip_prefix("usage_usec ")?.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    std::thread::sleep(Duration::from_secs(1));
    let (u0, t0) = (usage(), Instant::now());
    std::thread::sleep(Duration::from_secs(6));
    let used = (usage() - u0) as f64 / 1e6;
    let wall = t0.elapsed().as_secs_f64();
    report(&format!(
        "SRT busy loop under cpu.max 0.2 CPU (scx_agentos): {used:.2} s CPU in {wall:.2} s = {:.3} CPU",
        used / wall
    ));
    assert!(used > 0.0, "the SRT agent did not run at all");
    assert!(
        used <= 0.3 * wall,
        "the SRT busy loop used {used:.2} s of CPU in {wall:.2} s under cpu.max 0.2"
    );
    assert_eq!(read(STATE), "enabled");
}

/// The starvation bounds: with two SRT busy loops (no budget) on both vCPUs, a DT busy loop
/// still runs (DT goes first after 50 ms without DT) and so do normal tasks (one NORMAL slice
/// after 16 SRT slices), so the kernel's watchdog has nothing to complain about.
#[test]
#[ignore = "needs the guest VM: run `cargo xtask vm test`"]
fn dt_and_normal_tasks_still_run_under_srt_saturation() {
    require_vm();
    wait_sched_ext("enabled");
    let busy = ["-c", "while :; do :; done & while :; do :; done"];
    let _srt = start(
        "vmt-scx-srt-hog",
        "latency: SRT",
        "/bin/sh",
        &busy,
        "pids: 8",
    );
    let dt = start(
        "vmt-scx-dt-starve",
        "latency: DT",
        "/bin/sh",
        &["-c", "while :; do :; done"],
        "pids: 8",
    );
    let cg = dt.cgroup();
    let usage = || {
        let text = std::fs::read_to_string(cg.join("cpu.stat")).unwrap_or_default();
        text.lines()
            .find_map(|l| l.strip_prefix("usage_usec ")?.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    let (u0, t0) = (usage(), Instant::now());
    // This test process is a normal task: it must get the CPU to spin here.
    let mut spins = 0u64;
    while t0.elapsed() < Duration::from_secs(8) {
        spins += 1;
        std::hint::black_box(spins);
        if spins.is_multiple_of(1 << 16) {
            std::thread::yield_now();
        }
    }
    let dt_used = (usage() - u0) as f64 / 1e6;
    let wall = t0.elapsed().as_secs_f64();
    report(&format!(
        "under 2 SRT busy loops (scx_agentos): DT busy loop got {dt_used:.2} s CPU in {wall:.2} s, \
         a normal task spun {spins} times"
    ));
    assert!(dt_used > 0.0, "the DT agent never ran under SRT load");
    assert!(spins > 0);
    assert_eq!(read(STATE), "enabled", "the kernel stopped scx_agentos");
}

#[test]
#[ignore = "needs the guest VM: run `cargo xtask vm test`"]
fn hrt_admission_refuses_overloading_a_cpu() {
    require_vm();
    let class = "latency: HRT, slo: { runtime_ms: 6, deadline_ms: 10, period_ms: 10 }";
    let script = ["-c", "while :; do sleep 0.05; done"];
    let a = start("vmt-hrt-a", class, "/bin/sh", &script, "cpuset: [0]");
    let pid = a.main_pid();
    let sched = std::fs::read_to_string(format!("/proc/{pid}/sched")).unwrap_or_default();
    let policy = sched.lines().find_map(|l| {
        l.strip_prefix("policy")?
            .split(':')
            .nth(1)?
            .trim()
            .parse::<u32>()
            .ok()
    });
    assert_eq!(
        policy,
        Some(6),
        "SCHED_DEADLINE in /proc/{pid}/sched:\n{sched}"
    );
    let c = write_contract(
        "vmt-hrt-b",
        &contract("vmt-hrt-b", class, "/bin/sh", &script, "cpuset: [0]"),
    );
    let out = agentctl(&["start", &c.display().to_string()]);
    assert!(!out.success(), "the second HRT agent was admitted:\n{out}");
    assert!(
        out.stderr.contains("admission: agent default/vmt-hrt-b")
            && out.stderr.contains("refused: does not fit on CPU 0"),
        "{out}"
    );
    let list = agentctl(&["list"]).ok();
    assert!(!list.stdout.contains("vmt-hrt-b"), "{list}");
}

#[test]
#[ignore = "needs the guest VM: run `cargo xtask vm test`"]
fn stopping_agentosd_unloads_scx_and_agents_keep_running() {
    require_vm();
    wait_sched_ext("enabled");
    let a = start(
        "vmt-scx-survivor",
        "latency: SRT",
        "/bin/sh",
        &["-c", "while :; do sleep 0.2; done"],
        "",
    );
    let pid = a.main_pid();
    systemctl(&["stop", "agentosd"]).ok();
    wait_sched_ext("disabled");
    // The daemon logs the scheduler's counters when it unloads it.
    let journal = cmd(
        "journalctl",
        &["-u", "agentosd", "-n", "40", "--no-pager", "-o", "cat"],
    );
    for line in journal.stdout.lines().filter(|l| l.contains("scx_agentos")) {
        report(line);
    }
    assert!(
        Path::new(&format!("/proc/{pid}")).exists(),
        "agent {pid} died with the scheduler"
    );
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat
        .rsplit(')')
        .next()
        .and_then(|r| r.split_whitespace().next());
    assert!(
        matches!(state, Some("S" | "R")),
        "agent {pid} is not running in the fair class: {stat}"
    );
    // The next daemon loads the scheduler again and re-adopts the agent.
    systemctl(&["start", "agentosd"]).ok();
    wait_sched_ext("enabled");
    assert!(Path::new(&format!("/proc/{pid}")).exists());
    wait_for("the agent re-adopted", Duration::from_secs(30), || {
        (a.state() == "running").then_some(())
    });
    assert_eq!(a.main_pid(), pid);
}
