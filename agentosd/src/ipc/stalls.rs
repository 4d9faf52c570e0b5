//! Whether the CPU has room to lend (issue 15, "Isolation measured"; `--ipc-agent-cpu-stall`).
//!
//! The CPU share ([`super::cpu`]) is work-conserving: the daemon serves an agent beyond its share
//! while it is not contended. Its ceiling (`--ipc-agent-cpu-ceiling`) measures the daemon's own
//! CPU for all agents, a fixed figure blind to the machine: on a small or slow machine the
//! daemon's work for a flooding agent under the ceiling may still take the CPU another agent is
//! waiting for (measured in the VM, two emulated vCPUs: a polite agent's threads waited 50 ms a
//! call for a CPU behind the daemon serving a flood at 57% of one CPU, under its 50% ceiling;
//! docs/benchmarks.md). So the daemon also asks the kernel: every [`PERIOD`], while an agent is
//! over its share (its bucket in debt, or its recent rate over the share), it reads the CPU
//! pressure (PSI, `cpu.pressure`'s `some total`) of the agents that used the daemon lately and
//! are within their share (their bucket), less the time each spent throttled by its own
//! `cpu.max` (`cpu.stat`'s `throttled_usec`: waiting for its own budget, not for a CPU). When one
//! of them waited for a CPU more than the threshold's share of the period, the CPU has no room to
//! lend: for the next [`HOLD`] the agents over their share (their bucket in debt) are held to
//! it, as with a hard cap.
//!
//! Nothing is read while no agent is over its share, at most [`MAX_SAMPLED`] agents a period,
//! and only files of cgroups the daemon made (`ROOT/agents/<tenant>/<name>`; agent ids are the
//! daemon's own, checked again here). Without PSI (a kernel without `CONFIG_PSI`, or booted with
//! `psi=0`) the files are missing or refuse reads: the daemon says so at start and in
//! `agentosd check`, and the ceiling alone decides.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The default `--ipc-agent-cpu-stall`: per mille of the time another agent may wait for a CPU
/// before the agents over their share are held to it (10%). A polite agent on an idle host waits
/// well under 1% (docs/benchmarks.md: 60-110 µs a call at 50 calls a second).
pub const DEFAULT_STALL_PERMILLE: u64 = 100;

/// How often the pressure is read while an agent is over its share.
pub const PERIOD: Duration = Duration::from_millis(100);

/// How long the agents over their share are held to it after a wait over the threshold was
/// seen. Released sooner, a flooding agent's released work makes the others wait again before
/// the next period sees it: in the VM with 1 s, a flood held 76 times in 30 s still took 24% of
/// a CPU against its 5% share (docs/benchmarks.md). PSI's own shortest average is over 10 s.
pub const HOLD: Duration = Duration::from_secs(5);

/// Agents read per period at most (the first ones of the ledger's map that qualify).
pub const MAX_SAMPLED: usize = 256;

/// `some total=` of a `cpu.pressure` file: microseconds during which at least one task of the
/// cgroup was runnable and not running.
pub fn some_total_us(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("some "))?;
    line.split_whitespace()
        .find_map(|f| f.strip_prefix("total="))
        .and_then(|v| v.parse().ok())
}

/// `throttled_usec` of a `cpu.stat` file (0 without the `cpu` controller, which is when the
/// line is absent).
pub fn throttled_us(text: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix("throttled_usec "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// The cgroup directory of agent `id` (`tenant/name`) under `agents_dir`; None for an id that
/// is not two plain names.
fn agent_dir(agents_dir: &Path, id: &str) -> Option<PathBuf> {
    let (tenant, name) = id.split_once('/')?;
    let plain = |s: &str| !s.is_empty() && s != "." && s != ".." && !s.contains('/');
    (plain(tenant) && plain(name)).then(|| agents_dir.join(tenant).join(name))
}

/// Whether the kernel reports CPU pressure for the cgroups under `agents_dir` (its own
/// `cpu.pressure` reads and parses); the reason it does not.
pub fn available(agents_dir: &Path) -> Result<(), String> {
    let p = agents_dir.join("cpu.pressure");
    match std::fs::read_to_string(&p) {
        Ok(t) if some_total_us(&t).is_some() => Ok(()),
        Ok(_) => Err(format!("{}: no \"some total=\" line", p.display())),
        Err(e) => Err(format!(
            "{}: {e} (PSI needs a kernel with CONFIG_PSI, not booted with psi=0)",
            p.display()
        )),
    }
}

/// The wait over the threshold seen last, shared by a ledger's accounts and read without a lock
/// on every look at an agent's hold: how much and the threshold, per mille, and until when the
/// agents over their share are held ([`HOLD`] after it was seen).
#[derive(Debug)]
pub struct StallMark {
    base: Instant,
    /// Nanoseconds after `base` (0: never seen).
    until_ns: AtomicU64,
    permille: AtomicU64,
    threshold: AtomicU64,
}

impl StallMark {
    pub fn new(base: Instant) -> StallMark {
        StallMark {
            base,
            until_ns: AtomicU64::new(0),
            permille: AtomicU64::new(0),
            threshold: AtomicU64::new(0),
        }
    }

    fn ns(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }

    /// An agent within its share waited `permille` of a period, over `threshold`, at `now`.
    pub fn note(&self, permille: u64, threshold: u64, now: Instant) {
        self.permille.store(permille, Ordering::Relaxed);
        self.threshold.store(threshold, Ordering::Relaxed);
        self.until_ns
            .store(self.ns(now + HOLD).max(1), Ordering::Release);
    }

    /// The wait seen last and its threshold, while the agents over their share are held.
    pub fn active(&self, now: Instant) -> Option<(u64, u64)> {
        let until = self.until_ns.load(Ordering::Acquire);
        (until != 0 && self.ns(now) < until).then(|| {
            (
                self.permille.load(Ordering::Relaxed),
                self.threshold.load(Ordering::Relaxed),
            )
        })
    }
}

/// The stall of the agents read last period: each agent's cumulative wait for a CPU (µs) when
/// it was last read.
#[derive(Debug)]
pub struct StallProbe {
    agents_dir: PathBuf,
    last: HashMap<String, (u64, Instant)>,
}

/// The agent that waited most for a CPU over the last period, and how much, per mille of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stalled {
    pub agent: String,
    pub permille: u64,
}

impl StallProbe {
    pub fn new(agents_dir: PathBuf) -> StallProbe {
        StallProbe {
            agents_dir,
            last: HashMap::new(),
        }
    }

    /// Agent `id`'s cumulative wait for a CPU beyond its own `cpu.max`, µs (None: unreadable,
    /// the agent gone).
    fn read(&self, id: &str) -> Option<u64> {
        let dir = agent_dir(&self.agents_dir, id)?;
        let some = some_total_us(&std::fs::read_to_string(dir.join("cpu.pressure")).ok()?)?;
        let throttled = std::fs::read_to_string(dir.join("cpu.stat"))
            .map(|t| throttled_us(&t))
            .unwrap_or(0);
        Some(some.saturating_sub(throttled))
    }

    /// Reads agents `ids` (at most [`MAX_SAMPLED`]) and returns the one that waited most for a
    /// CPU since its previous read, if any was read twice. Agents not in `ids` are forgotten.
    pub fn sample<'a>(
        &mut self,
        ids: impl IntoIterator<Item = &'a str>,
        now: Instant,
    ) -> Option<Stalled> {
        let mut seen = HashMap::new();
        let mut worst: Option<Stalled> = None;
        for id in ids.into_iter().take(MAX_SAMPLED) {
            let Some(us) = self.read(id) else {
                continue;
            };
            if let Some(&(before, at)) = self.last.get(id) {
                let wall = now.saturating_duration_since(at).as_micros() as u64;
                let waited = us.saturating_sub(before).saturating_mul(1000);
                if let Some(permille) = waited.checked_div(wall)
                    && worst.as_ref().is_none_or(|w| permille > w.permille)
                {
                    worst = Some(Stalled {
                        agent: id.to_string(),
                        permille: permille.min(1000),
                    });
                }
            }
            seen.insert(id.to_string(), (us, now));
        }
        self.last = seen;
        worst
    }

    /// Forget every agent's last read (nothing is over its share: the next period starts anew).
    pub fn forget(&mut self) {
        self.last.clear();
    }
}

/// Writes agent `id`'s `cpu.pressure` (`some total=some_us`) and `cpu.stat`
/// (`throttled_usec`) under `agents_dir`, as the kernel shows them: for the tests of the rule.
#[cfg(test)]
pub(crate) fn write_agent_files(agents_dir: &Path, id: &str, some_us: u64, throttled_us: u64) {
    let d = agents_dir.join(id);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(
        d.join("cpu.pressure"),
        format!(
            "some avg10=0.00 avg60=0.00 avg300=0.00 total={some_us}\n\
             full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
        ),
    )
    .unwrap();
    std::fs::write(
        d.join("cpu.stat"),
        format!("usage_usec 1\nthrottled_usec {throttled_us}\n"),
    )
    .unwrap();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pressure_and_throttling_lines_parse() {
        let t = "some avg10=1.85 avg60=1.70 avg300=5.88 total=21494024876\n\
                 full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n";
        assert_eq!(some_total_us(t), Some(21_494_024_876));
        assert_eq!(some_total_us("full avg10=0.00 total=5\n"), None);
        assert_eq!(some_total_us(""), None);
        let stat = "usage_usec 100\nuser_usec 60\nsystem_usec 40\nnr_periods 3\n\
                    nr_throttled 1\nthrottled_usec 2500\nnr_bursts 0\n";
        assert_eq!(throttled_us(stat), 2500);
        assert_eq!(throttled_us("usage_usec 100\n"), 0);
    }

    #[test]
    fn only_two_plain_names_make_an_agents_directory() {
        let d = Path::new("/r/agents");
        assert_eq!(agent_dir(d, "t/a"), Some(PathBuf::from("/r/agents/t/a")));
        for bad in ["a", "/a", "t/", "../a", "t/..", "t/a/b", "./a", ""] {
            assert_eq!(agent_dir(d, bad), None, "{bad}");
        }
    }

    /// The wait is read from the agents' own files, less their throttling, as a share of the
    /// wall time between two reads; the worst agent is named.
    #[test]
    fn the_agent_that_waited_most_is_named_with_its_share_of_the_time() {
        let dir = tempfile::tempdir().unwrap();
        let write = |agent: &str, some: u64, throttled: u64| {
            write_agent_files(dir.path(), &format!("t/{agent}"), some, throttled)
        };
        write("a", 1_000, 0);
        write("b", 5_000, 0);
        let mut p = StallProbe::new(dir.path().to_path_buf());
        let t0 = Instant::now();
        assert_eq!(
            p.sample(["t/a", "t/b", "t/gone"], t0),
            None,
            "first read: no baseline"
        );
        // Over 100 ms: a waited 30 ms (30%), b 50 ms but 45 of them throttled by its cpu.max (5%).
        write("a", 31_000, 0);
        write("b", 55_000, 45_000);
        let t1 = t0 + Duration::from_millis(100);
        assert_eq!(
            p.sample(["t/a", "t/b"], t1),
            Some(Stalled {
                agent: "t/a".into(),
                permille: 300
            })
        );
        // An agent left out is forgotten: read again, it is a baseline.
        let t2 = t1 + Duration::from_millis(100);
        write("a", 31_000, 0);
        assert_eq!(
            p.sample(["t/a"], t2),
            Some(Stalled {
                agent: "t/a".into(),
                permille: 0
            })
        );
        write("b", 90_000, 45_000);
        assert_eq!(
            p.sample(["t/b"], t2 + Duration::from_millis(100)),
            None,
            "b was forgotten"
        );
        p.forget();
        assert_eq!(p.sample(["t/a"], t2 + Duration::from_millis(200)), None);
        assert!(available(dir.path()).is_err());
    }
}
