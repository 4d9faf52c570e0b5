//! Running the VM suite in several guests at once. Each guest is QEMU's single-threaded TCG
//! (qemu.rs: one host thread for all its vCPUs), so on a host with two CPUs one guest leaves
//! one idle: two guests, each with its share of the test binaries, take about half the time.
//! A share is planned from how long each binary took (measured, [`SECS`]): the longest first,
//! each to the guest with the least work so far.

/// Seconds each test binary took in its guest on the development machine (single-threaded
/// TCG, two guests at once on the quiet 2-CPU host, 2026-11-27 `cargo xtask vm test`; the
/// escape suite's from the guest's total less the others); a binary not listed counts as
/// [`UNKNOWN_SECS`]. Only the balance of the shares depends on these.
const SECS: &[(&str, u32)] = &[
    ("escape", 680),
    ("fspin", 555),
    ("quota", 500),
    ("examples", 250),
    ("sched", 160),
    ("dns_rest", 140),
    ("fslsm", 135),
    ("daemon", 115),
    ("budgets", 110),
    ("sysc", 80),
    ("toolunix", 75),
    ("sni", 72),
    ("dns", 68),
    ("netbpf", 45),
    ("mcp", 16),
    ("abstractbind", 10),
    ("guest", 1),
    ("polkit", 1),
];

/// What an unlisted binary is assumed to take.
const UNKNOWN_SECS: u32 = 100;

/// Splits `names` over `n` guests (n ≥ 1): each share in the order of `names` (the guest runs
/// them alphabetically, as one guest does). Empty shares are dropped.
pub fn plan(names: &[String], n: usize) -> Vec<Vec<String>> {
    let n = n.max(1);
    let secs = |name: &str| {
        SECS.iter()
            .find(|(k, _)| *k == name)
            .map_or(UNKNOWN_SECS, |(_, s)| *s)
    };
    let mut order: Vec<&String> = names.iter().collect();
    // Longest first; ties by name, so that a plan is the same on every run.
    order.sort_by(|a, b| secs(b).cmp(&secs(a)).then(a.cmp(b)));
    let mut load = vec![0u32; n];
    let mut shares: Vec<Vec<String>> = vec![Vec::new(); n];
    for name in order {
        let least = (0..n).min_by_key(|&i| (load[i], i)).unwrap_or(0);
        load[least] += secs(name);
        shares[least].push(name.clone());
    }
    for share in &mut shares {
        share.sort_by_key(|name| names.iter().position(|n| n == name));
    }
    shares.retain(|s| !s.is_empty());
    shares
}

/// How many guests to run: `asked` (`--shards`, `AGENTOS_VM_SHARDS`) or, with no filter, one
/// per host CPU up to two; never more than the host's available memory holds (`mem_mib` each
/// and 1 GiB for the host), and one when a filter is given without `asked` (a filtered run is
/// usually one binary). Says why when it runs fewer than asked.
pub fn count(asked: Option<usize>, filtered: bool, mem_mib: u32) -> usize {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let want = match asked {
        Some(n) => n.max(1),
        None if filtered => 1,
        None => cpus.clamp(1, 2),
    };
    let fits = match mem_available_mib() {
        Some(avail) => ((avail.saturating_sub(1024)) / u64::from(mem_mib.max(1))).max(1) as usize,
        None => want,
    };
    if fits < want {
        eprintln!(
            "vm test: {want} guests asked, but /proc/meminfo's MemAvailable holds {fits} of \
             {mem_mib} MiB each; running {fits}"
        );
    }
    want.min(fits)
}

fn mem_available_mib() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024)
}

#[cfg(test)]
mod tests {
    use super::plan;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn every_binary_runs_once_and_the_longest_are_spread() {
        let all = names(&[
            "abstractbind",
            "budgets",
            "daemon",
            "examples",
            "fslsm",
            "mcp",
            "quota",
            "sched",
        ]);
        let shares = plan(&all, 2);
        assert_eq!(shares.len(), 2);
        let mut seen: Vec<String> = shares.concat();
        seen.sort();
        assert_eq!(seen, all, "each binary exactly once");
        // The two longest never share a guest.
        let with = |n: &str| shares.iter().position(|s| s.iter().any(|x| x == n));
        assert_ne!(with("quota"), with("examples"));
        // Each share keeps the suite's (alphabetical) order.
        for s in &shares {
            let mut sorted = s.clone();
            sorted.sort();
            assert_eq!(*s, sorted);
        }
    }

    #[test]
    fn one_guest_runs_everything_and_more_guests_than_binaries_leave_none_empty() {
        let all = names(&["b", "a"]);
        assert_eq!(plan(&all, 1), vec![all.clone()]);
        let shares = plan(&all, 4);
        assert_eq!(shares.len(), 2);
        assert!(shares.iter().all(|s| s.len() == 1));
    }
}
