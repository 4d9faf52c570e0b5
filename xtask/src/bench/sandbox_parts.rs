//! `cargo xtask bench sandbox --breakdown`: where an `agentos` start spends its time over the
//! floor.
//!
//! - The child's side: extra modes, interleaved with the others, that start the same contract
//!   with one part of the prepared sandbox left out after `sandbox::prepare` ([`strip`]); a
//!   part's cost in the child is `agentos` p50 minus that mode's p50. `-pathcache` switches the
//!   daemon's path cache off for `prepare`; `-pathwatch` its path watch (every kept path's
//!   walk checked by `lstat`); `-nspool` makes both namespaces in `clone3` instead
//!   of joining ones made ahead.
//! - `agentos -emptybset`: started from a thread whose capability bounding set is full (the
//!   daemon's are empty, sandbox/bounding.rs), so the child drops it one capability at a time.
//! - `agentos -prepare`: the sandbox prepared once, at its first start, and used again by every
//!   later one (the same ruleset, seccomp programs and namespaces: what no daemon may do, as
//!   nothing is checked again): the child's side alone over the floor, what a start would cost if
//!   `prepare` were free.
//! - The daemon's side: after the interleaved runs, the parts of `sandbox::prepare` called one
//!   by one, each timed on its own (the same library calls `prepare_with` makes, in its order),
//!   and `prepare` whole with a ruleset built ahead (the pool's thread builds it in the 2 ms
//!   after each round) and with the ruleset pool off.

use std::time::Instant;

use agentosd::sandbox::{self, PreparedSandbox, identity, landlock, seccomp};
use anyhow::Result;

use super::sandbox::{Bench, pct};

/// The extra modes: `agentos` without one part.
pub const MODES: [&str; 13] = [
    "agentos -prepare",
    "agentos -pathcache+nspool",
    "agentos -pathcache",
    "agentos -pathwatch",
    "agentos -nspool",
    "agentos -landlock",
    "agentos -seccomp",
    "agentos -netns",
    "agentos -ipcns",
    "agentos -emptybset",
    "agentos -all4",
    "agentos -ids",
    "agentos -all",
];

/// The part a mode leaves out (`agentos -PART`).
pub fn part_of(mode: &str) -> Option<&str> {
    mode.strip_prefix("agentos -")
}

/// Leave `parts` (`a+b`) out of a prepared sandbox. The namespaces taken out are returned, to
/// be dropped after the start: dropped before it, their teardown by the kernel's workers would
/// run during the start timed.
pub fn strip(sb: &mut PreparedSandbox, parts: &str) -> Vec<std::os::fd::OwnedFd> {
    let mut out = Vec::new();
    for p in parts.split('+') {
        strip_one(sb, p, &mut out);
    }
    out
}

/// Leave `part` out of a prepared sandbox (`pathcache` is left out of `prepare` itself:
/// sandbox.rs switches the daemon's path cache off for that start).
fn strip_one(sb: &mut PreparedSandbox, part: &str, out: &mut Vec<std::os::fd::OwnedFd>) {
    let all = part == "all4" || part == "all";
    if all || part == "landlock" {
        sb.landlock = None;
    }
    if all || part == "seccomp" {
        sb.seccomp.clear();
    }
    if all || part == "netns" || part == "nspool" {
        out.extend(sb.netns.take());
        // `nspool`: made by clone3, as when the pool is empty.
        sb.namespaces.net = part == "nspool";
    }
    if all || part == "ipcns" || part == "nspool" {
        out.extend(sb.ipcns.take());
        sb.namespaces.ipc = part == "nspool";
    }
    if part == "all" {
        // The loop drops capability 0 only (one prctl instead of cap_last_cap + 1), where it
        // runs at all (`agentos -emptybset`).
        sb.last_cap = 0;
    }
    if part == "all" || part == "ids" {
        // No uid/gid switch: the child stays root (capabilities still cleared by capset).
        sb.uid = 0;
        sb.gid = 0;
    }
}

/// The daemon-side parts, each a list of samples (ns).
pub struct Parts(Vec<(&'static str, Vec<u64>)>);

fn time<T>(v: &mut Vec<u64>, f: impl FnOnce() -> T) -> T {
    let t = Instant::now();
    let r = f();
    v.push(t.elapsed().as_nanos() as u64);
    r
}

/// Time the parts of `sandbox::prepare` for the bench contract, `runs` times each.
pub fn time_prepare(b: &Bench, runs: usize) -> Result<Parts> {
    let names = [
        "prepare (whole, a ruleset built ahead)",
        "uid table (uid_for)",
        "state directory (make_home)",
        "grants + plan",
        "landlock: open every path (uncached)",
        "landlock: build_with, path cache off",
        "landlock: build_with, path cache on",
        "seccomp (compiled_for, cached)",
        "netns_pool::take",
        "prepare (whole, ruleset pool off)",
        "prepare (whole, a ruleset built ahead, path watch off)",
    ];
    let mut s: Vec<Vec<u64>> = vec![Vec::with_capacity(runs); names.len()];
    let id = "bench/agent";
    let cache = agentosd::sandbox::path_cache::PathCache::global();
    let pool = sandbox::ruleset_pool::RulesetPool::global();
    let mut pooled = 0;
    let mut pooled_nowatch = 0;
    for _ in 0..runs {
        cache.set_enabled(true);
        pool.set_enabled(true);
        let sb = time(&mut s[0], || {
            sandbox::prepare(&b.state, "bench", "agent", Some(&b.contract))
        })?;
        pooled += usize::from(sb.landlock_pooled);
        drop(sb);
        // Another agent's ruleset built ahead (one per agent), its walks checked by lstat.
        let watch = agentosd::sandbox::path_watch::PathWatch::global();
        watch.set_enabled(false);
        let sb = time(&mut s[10], || {
            sandbox::prepare(&b.state, "bench", "agent-nowatch", Some(&b.contract))
        });
        watch.set_enabled(true);
        pooled_nowatch += usize::from(sb?.landlock_pooled);
        pool.set_enabled(false);
        time(&mut s[9], || {
            sandbox::prepare(&b.state, "bench", "agent", Some(&b.contract))
        })?;
        pool.set_enabled(true);
        let uid = time(&mut s[1], || identity::uid_for(&b.state, id))?;
        let home = time(&mut s[2], || {
            identity::make_home(&b.state, "bench", "agent", uid)
        })?;
        let plan = time(&mut s[3], || {
            sandbox::Grants::from_contract(&b.contract, home.path()).plan(home.path())
        })?;
        let opener = landlock::Opener::new(vec![&home]);
        time(&mut s[4], || -> Result<()> {
            for p in plan
                .read
                .iter()
                .chain(&plan.read_exec)
                .chain(&plan.read_write)
            {
                opener.open(p)?;
            }
            Ok(())
        })?;
        cache.set_enabled(false);
        time(&mut s[5], || landlock::build_with(&plan, false, &opener))?;
        cache.set_enabled(true);
        time(&mut s[6], || landlock::build_with(&plan, false, &opener))?;
        time(&mut s[7], || {
            seccomp::compiled_for(seccomp::NetShape::for_grants(false, false))
        })?;
        time(&mut s[8], sandbox::netns_pool::take);
        // What spawn does once the child has exec'd; let the pool refill (its thread is
        // nice 19) before the next take.
        sandbox::netns_pool::after_start();
        sandbox::ruleset_pool::after_start();
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    println!(
        "\nprepare timed alone: {pooled} of {runs} took a ruleset built ahead ({pooled_nowatch} with the path watch off)"
    );
    Ok(Parts(names.into_iter().zip(s).collect()))
}

pub fn print(p: &Parts) {
    println!(
        "\nthe parts of sandbox::prepare, each timed on its own (same process, after the starts)\n"
    );
    let us = |ns: u64| format!("{:.1}", ns as f64 / 1e3);
    println!("| part | p50 µs | p90 µs | p99 µs |");
    println!("|---|---:|---:|---:|");
    for (name, v) in &p.0 {
        let mut v = v.clone();
        v.sort_unstable();
        println!(
            "| {name} | {} | {} | {} |",
            us(pct(&v, 50)),
            us(pct(&v, 90)),
            us(pct(&v, 99))
        );
    }
}

/// Each start split at the clone: request → just before `clone3` (cgroup, `prepare`) and
/// the rest (clone, the child's setup, exec, the first instruction), p50 of each.
pub fn print_split(before: &[Vec<u64>; 5], samples: &[Vec<u64>], modes: &[&str]) {
    println!("\nstarts split at the clone (p50 of each half; the halves' p50s need not add up)\n");
    println!("| mode | request → clone3 µs | whole start p50 µs |");
    println!("|---|---:|---:|");
    for (k, mode) in [
        "clone3+cgroup",
        "agentos",
        "agentos -all4",
        "agentos -prepare",
        "agentos -pool",
    ]
    .iter()
    .enumerate()
    {
        let Some(m) = modes.iter().position(|x| x == mode) else {
            continue;
        };
        let p50 = |v: &[u64]| {
            let mut v = v.to_vec();
            v.sort_unstable();
            if v.is_empty() { 0 } else { pct(&v, 50) }
        };
        println!(
            "| {mode} | {:.1} | {:.1} |",
            p50(&before[k]) as f64 / 1e3,
            p50(&samples[m]) as f64 / 1e3
        );
    }
}
