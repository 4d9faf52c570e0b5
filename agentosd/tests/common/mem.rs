//! The daemon's memory around an attack (issue 15: "report the daemon's RSS under each attack
//! and after it"): `VmRSS` before, the peak during it (`VmHWM`, exact, reset at the start by
//! writing 5 to /proc/PID/clear_refs) and `VmRSS` after, printed as one `daemon-memory:` line
//! and held to a bound on the growth.

use std::time::Duration;

/// `VmHWM` and `VmRSS` of `pid`, in KiB.
pub fn hwm_rss_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/status: {e}"));
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
    };
    (field("VmHWM:"), field("VmRSS:"))
}

/// One attack's watch on the daemon's memory.
pub struct MemWatch {
    pid: u32,
    attack: String,
    before_kib: u64,
}

/// What [`MemWatch::finish`] measured, in KiB.
#[derive(Debug, Clone, Copy)]
pub struct MemReport {
    pub before_kib: u64,
    pub peak_kib: u64,
    pub after_kib: u64,
}

impl MemWatch {
    /// Before the attack: reset the daemon's peak to its current size and note it.
    pub fn start(pid: u32, attack: &str) -> MemWatch {
        std::fs::write(format!("/proc/{pid}/clear_refs"), "5")
            .unwrap_or_else(|e| panic!("reset the peak RSS of {pid} (clear_refs): {e}"));
        MemWatch {
            pid,
            attack: attack.to_string(),
            before_kib: hwm_rss_kib(pid).1,
        }
    }

    /// After the attack (and `settle` for the daemon to return what it freed): print the
    /// figures and fail when the peak grew more than `max_growth_mib` over the start.
    pub fn finish(self, settle: Duration, max_growth_mib: u64) -> MemReport {
        let (peak_during, _) = hwm_rss_kib(self.pid);
        std::thread::sleep(settle);
        let (_, after) = hwm_rss_kib(self.pid);
        let r = MemReport {
            before_kib: self.before_kib,
            peak_kib: peak_during,
            after_kib: after,
        };
        let mib = |k: u64| k as f64 / 1024.0;
        println!(
            "daemon-memory: {}: VmRSS before {:.1} MiB, peak during (VmHWM) {:.1} MiB (+{:.1}), \
             after {:.1} MiB ({} s later)",
            self.attack,
            mib(r.before_kib),
            mib(r.peak_kib),
            mib(r.peak_kib.saturating_sub(r.before_kib)),
            mib(r.after_kib),
            settle.as_secs()
        );
        assert!(
            r.peak_kib.saturating_sub(r.before_kib) <= max_growth_mib * 1024,
            "{}: the daemon grew by {:.1} MiB at its peak (bound {max_growth_mib} MiB)",
            self.attack,
            mib(r.peak_kib - r.before_kib)
        );
        r
    }
}
