//! What the opt-in syscall counter (`agentosd --syscall-counts`, `ebpf/sysc.bpf.c`) costs:
//! `cargo run --release -p agentosd --example sysc_overhead [ITERATIONS]` (root; makes its own
//! cgroup under the cgroup2 mount and removes it; mounts tracefs at /sys/kernel/tracing for the
//! classic tracepoint if no tracefs is mounted, and unmounts it at the end).
//!
//! Measures ns per `getppid` (the cheapest syscall: the difference is the hook's cost) in this
//! process, 7 interleaved rounds, medians:
//! 1. no program attached (baseline);
//! 2. `tp_btf/sys_enter` attached, this process outside every agent (what every host process
//!    pays: the lookup misses);
//! 3. the same, this process in a counted agent cgroup (the lookup hits, the counter is bumped);
//! 4. and 5. the same two with `tracepoint/raw_syscalls/sys_enter` instead.
//!
//! Checks that the counted cgroup's count is at least the number of calls made in it. The
//! program is attached globally only while a round measures and detached (dropped) after.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::time::Instant;

use agentosd::enforce::sysc::{Hook, SyscCounter};

fn getppid_loop(n: u32) -> f64 {
    let t = Instant::now();
    for _ in 0..n {
        // SAFETY: getppid has no preconditions.
        std::hint::black_box(unsafe { libc::getppid() });
    }
    t.elapsed().as_nanos() as f64 / f64::from(n)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn move_self(cg: &Path) {
    std::fs::write(cg.join("cgroup.procs"), std::process::id().to_string()).unwrap();
}

/// Mount tracefs when none is mounted; true when this process mounted it.
fn ensure_tracefs() -> bool {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    if mounts
        .lines()
        .any(|l| l.split_whitespace().nth(2) == Some("tracefs"))
    {
        return false;
    }
    let st = std::process::Command::new("mount")
        .args(["-t", "tracefs", "tracefs", "/sys/kernel/tracing"])
        .status();
    eprintln!("mounted tracefs at /sys/kernel/tracing for this run: {st:?}");
    st.is_ok_and(|s| s.success())
}

const ROUNDS: usize = 7;

/// (outside, inside) ns per getppid with `hook` attached; asserts the agent's count.
fn with_hook(hook: Hook, n: u32, own: &Path, agent: &Path, id: u64) -> (f64, f64) {
    let c = SyscCounter::load(hook).expect("loading the counter");
    c.add("bench/bench", id).unwrap();
    c.attach().unwrap();
    getppid_loop(n / 10);
    let outside = getppid_loop(n);
    move_self(agent);
    let inside = getppid_loop(n);
    move_self(own);
    let counted = c.count("bench/bench");
    assert!(
        counted >= u64::from(n),
        "{}: counted {counted} < {n} calls",
        hook.describe()
    );
    drop(c);
    (outside, inside)
}

fn main() {
    let n: u32 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2_000_000);
    let mounted = ensure_tracefs();
    let mount = agentosd::cgroup::cgroup2_mount().expect("a cgroup2 mount");
    let own = mount.join(
        agentosd::cgroup::proc_cgroup("self")
            .unwrap()
            .trim_start_matches('/'),
    );
    let agent: PathBuf = mount.join(format!("agentos-bench-sysc-{}", std::process::id()));
    std::fs::create_dir_all(&agent).unwrap();
    let id = std::fs::metadata(&agent)
        .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
        .unwrap();
    let (mut base, mut btf_out, mut btf_in, mut tp_out, mut tp_in) =
        (vec![], vec![], vec![], vec![], vec![]);
    for _ in 0..ROUNDS {
        getppid_loop(n / 10);
        base.push(getppid_loop(n));
        let (o, i) = with_hook(Hook::TpBtf, n, &own, &agent, id);
        btf_out.push(o);
        btf_in.push(i);
        let (o, i) = with_hook(Hook::Tracepoint, n, &own, &agent, id);
        tp_out.push(o);
        tp_in.push(i);
    }
    let _ = std::fs::remove_dir(&agent);
    if mounted {
        let _ = std::process::Command::new("umount")
            .arg("/sys/kernel/tracing")
            .status();
    }
    let base = median(base);
    println!(
        "getppid iterations per round: {n}, {ROUNDS} interleaved rounds, medians (ns per call)"
    );
    println!("{:<58} {:>8} {:>8}", "", "ns", "cost");
    println!("{:<58} {base:>8.1} {:>8}", "no program attached", "-");
    for (what, v) in [
        ("tp_btf/sys_enter, process outside agents", btf_out),
        ("tp_btf/sys_enter, process inside a counted agent", btf_in),
        ("tracepoint/raw_syscalls/sys_enter, outside agents", tp_out),
        ("tracepoint/raw_syscalls/sys_enter, inside an agent", tp_in),
    ] {
        let m = median(v);
        println!("{what:<58} {m:>8.1} {:>+8.1}", m - base);
    }
}
