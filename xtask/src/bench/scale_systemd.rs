//! The systemd peer of `bench scale`: the same number of `/bin/sleep infinity` processes as
//! transient systemd units, started with `systemd-run` as an operator would, with the same number
//! in flight as the agents' starts:
//!
//! - `scope`: `systemd-run --scope` asks PID 1 for a scope holding its own PID, waits for the
//!   job, then execs the program; a start is done when the process is `sleep` (its comm).
//! - `service`: `systemd-run -p Type=exec`: PID 1 forks the program; systemd-run returns once
//!   the start job (the exec) completed.
//!
//! At each checkpoint: PID 1's RSS (total, and per unit over the idle figure), the memory charged
//! to the units' slice, D-Bus `ListUnits` on the system bus and `systemctl list-units` as a
//! process; then `systemctl stop` of the slice (every unit in it) and how long that took.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::harness::{Dist, mono_ns};

/// Whether `bench scale` runs the systemd peer.
#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum PeerMode {
    /// Where systemd is PID 1 (the VM); elsewhere the report says why not.
    Auto,
    /// Always; fail where systemd is not PID 1.
    Systemd,
    /// Never.
    None,
}

/// The kind of transient unit the peer starts.
#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum UnitKind {
    /// `systemd-run --scope` (interleaved with the agents, checkpoint by checkpoint).
    Scope,
    /// `systemd-run -p Type=exec`, a transient service (after agents and scopes are stopped).
    Service,
}

impl UnitKind {
    fn suffix(self) -> &'static str {
        match self {
            UnitKind::Scope => "scope",
            UnitKind::Service => "service",
        }
    }

    pub(super) fn label(self) -> &'static str {
        match self {
            UnitKind::Scope => "systemd-run --scope",
            UnitKind::Service => "systemd-run service",
        }
    }

    /// No `-` in the name: a dash would nest it under `agentos.slice`, the daemon's.
    fn slice(self) -> String {
        format!("agentosbench{}.slice", self.suffix())
    }

    fn prefix(self) -> String {
        format!("agentosbench-{}-", self.suffix())
    }

    fn unit(self, i: usize) -> String {
        format!("{}{i}.{}", self.prefix(), self.suffix())
    }
}

/// Why the peer cannot run on this machine, or None.
pub(super) fn unavailable() -> Option<String> {
    let comm = std::fs::read_to_string("/proc/1/comm").unwrap_or_default();
    why_unavailable(
        Path::new("/run/systemd/system").is_dir(),
        comm.trim(),
        on_path("systemd-run"),
        on_path("systemctl"),
    )
}

fn why_unavailable(booted: bool, pid1: &str, run: bool, ctl: bool) -> Option<String> {
    if !booted || pid1 != "systemd" {
        return Some(format!(
            "systemd is not PID 1 here (PID 1 is `{pid1}`, /run/systemd/system {}): run it in \
             the VM, `cargo xtask vm bench -- scale …`",
            if booted { "exists" } else { "missing" }
        ));
    }
    for (ok, prog) in [(run, "systemd-run"), (ctl, "systemctl")] {
        if !ok {
            return Some(format!("{prog} is not on PATH (install systemd)"));
        }
    }
    None
}

fn on_path(prog: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(prog).is_file()))
}

/// `(name, active state)` of the rows of a `ListUnits` reply: how many of them are ours
/// (`prefix`) and active.
pub(super) fn count_active<'a>(
    rows: impl Iterator<Item = (&'a str, &'a str)>,
    prefix: &str,
) -> usize {
    rows.filter(|(name, active)| name.starts_with(prefix) && *active == "active")
        .count()
}

/// Our active units in the output of `systemctl list-units --no-legend --plain` (UNIT LOAD
/// ACTIVE SUB DESCRIPTION; a failed unit may start with a bullet).
pub(super) fn count_listed(out: &str, prefix: &str) -> usize {
    out.lines()
        .filter_map(|l| {
            let mut f = l
                .split_whitespace()
                .skip_while(|w| matches!(*w, "●" | "*" | "×"));
            let unit = f.next()?;
            let _load = f.next()?;
            Some((unit, f.next()?))
        })
        .filter(|(u, active)| u.starts_with(prefix) && *active == "active")
        .count()
}

/// One checkpoint of a side (agentosd or a kind of unit).
pub(super) struct SidePoint {
    pub(super) n: usize,
    /// The manager's RSS: agentosd's or PID 1's.
    pub(super) rss_kb: u64,
    /// memory.current of the cgroup holding them all (None: no memory controller there).
    pub(super) cg_kb: Option<u64>,
    /// `ListAgents` / `ListUnits` over D-Bus.
    pub(super) list: Dist,
    /// `agentctl list` / `systemctl list-units` as a process.
    pub(super) ctl: Dist,
}

/// What one side measured, for the side-by-side report.
pub(super) struct Side {
    pub(super) label: String,
    pub(super) points: Vec<SidePoint>,
    pub(super) start: Dist,
    pub(super) start_wall: Duration,
    pub(super) stop_wall: Duration,
    /// The manager's RSS after the stop.
    pub(super) rss_after_kb: u64,
}

pub(super) fn status_kb(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// memory.current of `cg` in KiB, if the memory controller is on there.
pub(super) fn memory_current_kb(cg: &Path) -> Option<u64> {
    let s = std::fs::read_to_string(cg.join("memory.current")).ok()?;
    Some(s.trim().parse::<u64>().ok()? / 1024)
}

type UnitRow = (
    String,
    String,
    String,
    String,
    String,
    String,
    zbus::OwnedObjectPath,
    u32,
    String,
    zbus::OwnedObjectPath,
);

/// The units of one kind this run started; stopped (the slice) when dropped.
pub(super) struct Peer {
    pub(super) kind: UnitKind,
    bus: agentctl::client::Client,
    log: std::path::PathBuf,
    /// Scopes: the processes (systemd-run became `sleep`), ours to reap.
    children: Vec<Child>,
    started: usize,
    start_lat: Vec<u64>,
    start_wall: Duration,
    pub(super) points: Vec<SidePoint>,
    stopped: bool,
}

impl Peer {
    /// Connects to the system bus and clears what a previous run may have left in the slice.
    pub(super) fn new(kind: UnitKind, rt: &tokio::runtime::Runtime, dir: &Path) -> Result<Peer> {
        let addr = std::env::var("DBUS_SYSTEM_BUS_ADDRESS")
            .unwrap_or_else(|_| "unix:path=/run/dbus/system_bus_socket".into());
        let bus = rt
            .block_on(agentctl::client::Client::connect(
                Some(&agentctl::client::BusTarget::Address(addr.clone())),
                Some(Duration::from_secs(300)),
            ))
            .map_err(|e| anyhow::anyhow!("system bus {addr}: {}", e.message))?;
        let slice = kind.slice();
        let _ = Command::new("systemctl")
            .args(["stop", "--quiet", &slice])
            .status();
        // A slice may get DefaultTasksMax (15 % of pid_max): more than that many units would
        // fail for a limit that is not the manager's.
        let st = Command::new("systemctl")
            .args(["set-property", "--runtime", &slice, "TasksMax=infinity"])
            .stderr(Stdio::null())
            .status();
        if !st.is_ok_and(|s| s.success()) {
            eprintln!("bench scale: could not set TasksMax=infinity on {slice} (continuing)");
        }
        Ok(Peer {
            kind,
            bus,
            log: dir.join(format!("systemd-run-{}.log", kind.suffix())),
            children: Vec::new(),
            started: 0,
            start_lat: Vec::new(),
            start_wall: Duration::ZERO,
            points: Vec::new(),
            stopped: false,
        })
    }

    fn spawn(&self, i: usize) -> Result<Child> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("{}", self.log.display()))?;
        let mut c = Command::new("systemd-run");
        c.args(["--quiet", "--collect"])
            .arg(format!("--slice={}", self.kind.slice()))
            .arg(format!("--unit={}", self.kind.unit(i)));
        match self.kind {
            UnitKind::Scope => c.arg("--scope"),
            UnitKind::Service => c.arg("--property=Type=exec"),
        };
        c.args(["/bin/sleep", "infinity"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("run systemd-run")
    }

    fn log_tail(&self) -> String {
        let t = std::fs::read_to_string(&self.log).unwrap_or_default();
        let n = t.len().saturating_sub(2000);
        t[t.floor_char_boundary(n)..].to_string()
    }

    /// Whether the start of `c` is complete (an error when systemd-run failed).
    fn done(&self, c: &mut Child) -> Result<bool> {
        let exited = c.try_wait()?;
        match (self.kind, exited) {
            (UnitKind::Scope, None) => {
                Ok(std::fs::read_to_string(format!("/proc/{}/comm", c.id()))
                    .is_ok_and(|s| s.trim() == "sleep"))
            }
            (UnitKind::Service, None) => Ok(false),
            (UnitKind::Service, Some(st)) if st.success() => Ok(true),
            (_, Some(st)) => bail!(
                "systemd-run ({}) exited with {st}; its stderr:\n{}",
                self.kind.label(),
                self.log_tail()
            ),
        }
    }

    /// Start units until `k` are running, `parallel` starts in flight.
    pub(super) fn start_to(&mut self, k: usize, parallel: usize) -> Result<()> {
        let t0 = Instant::now();
        let mut inflight: Vec<(Child, u64)> = Vec::new();
        let r = self.start_loop(k, parallel.max(1), &mut inflight);
        for (mut c, _) in inflight {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.start_wall += t0.elapsed();
        r
    }

    fn start_loop(
        &mut self,
        k: usize,
        parallel: usize,
        inflight: &mut Vec<(Child, u64)>,
    ) -> Result<()> {
        let mut next = self.started;
        while self.started < k {
            while inflight.len() < parallel && next < k {
                inflight.push((self.spawn(next)?, mono_ns()));
                next += 1;
            }
            let mut progressed = false;
            let mut j = 0;
            while j < inflight.len() {
                if self.done(&mut inflight[j].0)? {
                    let (c, t) = inflight.swap_remove(j);
                    self.start_lat.push(mono_ns() - t);
                    if self.kind == UnitKind::Scope {
                        self.children.push(c);
                    }
                    self.started += 1;
                    progressed = true;
                } else {
                    j += 1;
                }
            }
            if !progressed {
                std::thread::sleep(Duration::from_micros(500));
            }
        }
        Ok(())
    }

    /// `ListUnits` on the system bus, the reply parsed: (ns, our active units).
    pub(super) fn list_units_timed(&self, rt: &tokio::runtime::Runtime) -> Result<(u64, usize)> {
        let t0 = mono_ns();
        let msg = rt
            .block_on(self.bus.connection().call_method(
                Some("org.freedesktop.systemd1"),
                "/org/freedesktop/systemd1",
                Some("org.freedesktop.systemd1.Manager"),
                "ListUnits",
                &(),
            ))
            .context("ListUnits on the system bus")?;
        let rows: Vec<UnitRow> = msg.body().deserialize().context("ListUnits reply")?;
        let dt = mono_ns() - t0;
        let prefix = self.kind.prefix();
        Ok((
            dt,
            count_active(rows.iter().map(|r| (r.0.as_str(), r.3.as_str())), &prefix),
        ))
    }

    /// `systemctl list-units` as a process (every loaded active unit, as an operator lists
    /// them): (ns, our active units in its output).
    pub(super) fn systemctl_list_timed(&self) -> Result<(u64, usize)> {
        let t0 = mono_ns();
        let out = Command::new("systemctl")
            .args(["list-units", "--no-pager", "--no-legend", "--plain"])
            .output()
            .context("run systemctl list-units")?;
        let dt = mono_ns() - t0;
        if !out.status.success() {
            bail!(
                "systemctl list-units: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let n = count_listed(&String::from_utf8_lossy(&out.stdout), &self.kind.prefix());
        Ok((dt, n))
    }

    pub(super) fn check_count(&self, what: &str, seen: usize) -> Result<()> {
        if seen != self.started {
            bail!(
                "{what} shows {seen} active {} units of the {} started",
                self.kind.label(),
                self.started
            );
        }
        Ok(())
    }

    pub(super) fn slice_memory_kb(&self, mount: &Path) -> Option<u64> {
        memory_current_kb(&mount.join(self.kind.slice()))
    }

    /// `systemctl stop` of the slice: every unit in it; waits until the scopes' processes are
    /// gone. The time it took.
    pub(super) fn stop_all(&mut self) -> Result<Duration> {
        let children = std::mem::take(&mut self.children);
        let pids: Vec<u32> = children.iter().map(Child::id).collect();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for mut c in children {
                let _ = c.wait();
            }
            let _ = tx.send(());
        });
        let t0 = Instant::now();
        let out = Command::new("systemctl")
            .args(["stop", &self.kind.slice()])
            .output()
            .context("run systemctl stop")?;
        let reaped = rx.recv_timeout(Duration::from_secs(300));
        let dt = t0.elapsed();
        self.stopped = true;
        if reaped.is_err() {
            for p in pids {
                // SAFETY: kill(2) on the PID of our own child the reaper thread still waits for
                // (not reaped, so the PID is not reused).
                unsafe { libc::kill(p as i32, libc::SIGKILL) };
            }
            bail!(
                "systemctl stop {} left processes running after 300 s",
                self.kind.slice()
            );
        }
        if !out.status.success() {
            bail!(
                "systemctl stop {}: {}",
                self.kind.slice(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(dt)
    }

    pub(super) fn into_side(mut self, stop_wall: Duration) -> Side {
        Side {
            label: self.kind.label().into(),
            points: std::mem::take(&mut self.points),
            start: Dist::new(std::mem::take(&mut self.start_lat)),
            start_wall: self.start_wall,
            stop_wall,
            rss_after_kb: status_kb(1, "VmRSS:"),
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if !self.stopped {
            let _ = Command::new("systemctl")
                .args(["stop", &self.kind.slice()])
                .status();
        }
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn p50_p99(d: &Dist) -> String {
    use super::harness::ms;
    format!("{} / {}", ms(d.p(500)), ms(d.p(990)))
}

/// The manager's RSS growth per unit from `from` to `p` (signed: a daemon may return start-up
/// memory after its first starts), in KB.
fn growth_kb(p: &SidePoint, from: &SidePoint) -> Option<f64> {
    (p.n > from.n).then(|| (p.rss_kb as f64 - from.rss_kb as f64) / (p.n - from.n) as f64)
}

/// Growth per unit over the idle manager, and since the previous checkpoint.
fn per_unit(p: &SidePoint, base: &SidePoint, prev: &SidePoint) -> String {
    match (growth_kb(p, base), growth_kb(p, prev)) {
        (Some(a), Some(b)) => format!("{a:+.1} / {b:+.1} KB"),
        _ => "—".into(),
    }
}

fn cg_per_unit(p: &SidePoint, base: &SidePoint) -> String {
    match (p.cg_kb, base.cg_kb) {
        (Some(c), b) if p.n > 0 => format!(
            "{:.0} KB",
            c.saturating_sub(b.unwrap_or(0)) as f64 / p.n as f64
        ),
        _ => "—".into(),
    }
}

fn ratio(a: f64, b: f64) -> String {
    if a > 0.0 && b > 0.0 {
        format!("{:.2}×", a / b)
    } else {
        "—".into()
    }
}

/// The side-by-side tables: per checkpoint, each side's manager memory, its cgroups' memory,
/// the D-Bus list call and the list command; then starts and stops; then the ratios of each
/// peer to the first side (agentosd).
pub(super) fn render(sides: &[Side]) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let Some(first) = sides.first() else {
        return s;
    };
    let ns: Vec<usize> = first
        .points
        .iter()
        .map(|p| p.n)
        .filter(|n| *n > 0)
        .collect();
    let _ = writeln!(
        s,
        "\n| N | side | manager RSS | its growth per unit: over idle / since the previous N | cgroup memory per unit | D-Bus list p50 / p99 ms | list command p50 / p99 ms |"
    );
    let _ = writeln!(s, "|---:|---|---:|---:|---:|---:|---:|");
    for side in sides {
        let Some(base) = side.points.first() else {
            continue;
        };
        for (i, p) in side.points.iter().enumerate() {
            let prev = &side.points[i.saturating_sub(1)];
            let _ = writeln!(
                s,
                "| {} | {} | {:.1} MB | {} | {} | {} | {} |",
                p.n,
                side.label,
                p.rss_kb as f64 / 1024.0,
                per_unit(p, base, prev),
                cg_per_unit(p, base),
                p50_p99(&p.list),
                p50_p99(&p.ctl),
            );
        }
    }
    let _ = writeln!(
        s,
        "\n| side | starts/s | one start p50 / p99 ms | stop all | manager RSS after stop |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|");
    let rate = |x: &Side| x.start.0.len() as f64 / x.start_wall.as_secs_f64().max(1e-9);
    for x in sides {
        let _ = writeln!(
            s,
            "| {} | {:.0} | {} | {:.2} s | {:.1} MB |",
            x.label,
            rate(x),
            p50_p99(&x.start),
            x.stop_wall.as_secs_f64(),
            x.rss_after_kb as f64 / 1024.0
        );
    }
    if sides.len() < 2 {
        return s;
    }
    let _ = writeln!(
        s,
        "\nRatios, peer / {} (above 1: the peer is slower or larger):\n",
        first.label
    );
    let _ = writeln!(
        s,
        "| peer | N | manager memory per unit (since the previous N) | D-Bus list p50 | list command p50 | start rate (agentosd / peer) | stop all |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|");
    let f_rate = rate(first);
    // Memory: the growth per unit since the previous checkpoint (the idle figures are not
    // comparable: agentosd frees start-up memory after its first starts).
    let marginal = |x: &Side, n: usize| {
        let i = x.points.iter().position(|p| p.n == n)?;
        let g = growth_kb(&x.points[i], &x.points[i.checked_sub(1)?])?;
        (g > 0.0).then_some(g)
    };
    for peer in &sides[1..] {
        for n in &ns {
            let (Some(a), Some(b)) = (
                first.points.iter().find(|p| p.n == *n),
                peer.points.iter().find(|p| p.n == *n),
            ) else {
                continue;
            };
            let _ = writeln!(
                s,
                "| {} | {n} | {} | {} | {} | {} | {} |",
                peer.label,
                match (marginal(peer, *n), marginal(first, *n)) {
                    (Some(x), Some(y)) => ratio(x, y),
                    _ => "—".into(),
                },
                ratio(b.list.p(500) as f64, a.list.p(500) as f64),
                ratio(b.ctl.p(500) as f64, a.ctl.p(500) as f64),
                ratio(f_rate, rate(peer)),
                ratio(peer.stop_wall.as_secs_f64(), first.stop_wall.as_secs_f64()),
            );
        }
    }
    s
}

pub(super) fn side_json(x: &Side) -> serde_json::Value {
    let pts: Vec<_> = x
        .points
        .iter()
        .map(|p| {
            serde_json::json!({"n": p.n, "rss_kb": p.rss_kb, "cgroup_kb": p.cg_kb,
                "list": p.list.json(), "list_command": p.ctl.json()})
        })
        .collect();
    serde_json::json!({"label": x.label, "points": pts, "start": x.start.json(),
        "start_wall_s": x.start_wall.as_secs_f64(), "stop_wall_s": x.stop_wall.as_secs_f64(),
        "rss_after_kb": x.rss_after_kb})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unavailable_says_why() {
        let r = why_unavailable(false, "bash", true, true).unwrap();
        assert!(
            r.contains("PID 1 is `bash`") && r.contains("missing"),
            "{r}"
        );
        let r = why_unavailable(true, "init", true, true).unwrap();
        assert!(r.contains("`init`") && r.contains("exists"), "{r}");
        let r = why_unavailable(true, "systemd", false, true).unwrap();
        assert!(r.contains("systemd-run is not on PATH"), "{r}");
        let r = why_unavailable(true, "systemd", true, false).unwrap();
        assert!(r.contains("systemctl is not on PATH"), "{r}");
        assert_eq!(why_unavailable(true, "systemd", true, true), None);
    }

    #[test]
    fn names_stay_out_of_the_daemons_slice() {
        assert_eq!(UnitKind::Scope.slice(), "agentosbenchscope.slice");
        assert!(!UnitKind::Service.slice().contains('-'));
        assert_eq!(UnitKind::Scope.unit(7), "agentosbench-scope-7.scope");
        assert_eq!(UnitKind::Service.unit(0), "agentosbench-service-0.service");
        assert!(
            UnitKind::Scope
                .unit(7)
                .starts_with(&UnitKind::Scope.prefix())
        );
        assert!(
            !UnitKind::Service
                .unit(7)
                .starts_with(&UnitKind::Scope.prefix())
        );
    }

    #[test]
    fn counts_our_active_units_in_systemctl_output() {
        // `systemctl list-units --no-legend --plain` as systemd 257 prints it, with a failed
        // unit (bullet), someone else's unit and one of ours stopping.
        let out = "\
agentosbench-scope-0.scope   loaded active running /bin/sleep infinity
agentosbench-scope-1.scope   loaded active running /bin/sleep infinity
● agentosbench-scope-2.scope loaded failed failed  /bin/sleep infinity
agentosbench-scope-3.scope   loaded deactivating stop-sigterm /bin/sleep infinity
agentosbench-service-0.service loaded active running /bin/sleep infinity
dbus.service                 loaded active running D-Bus System Message Bus
init.scope                   loaded active running System and Service Manager
-.mount                      loaded active mounted Root Mount
";
        assert_eq!(count_listed(out, &UnitKind::Scope.prefix()), 2);
        assert_eq!(count_listed(out, &UnitKind::Service.prefix()), 1);
        assert_eq!(count_listed("", &UnitKind::Scope.prefix()), 0);
        assert_eq!(count_listed("garbage\n\n  \n", "g"), 0);
    }

    #[test]
    fn counts_our_active_units_in_list_units_rows() {
        let rows = [
            ("agentosbench-scope-0.scope", "active"),
            ("agentosbench-scope-1.scope", "inactive"),
            ("agentosbench-scope-2.scope", "active"),
            ("systemd-journald.service", "active"),
        ];
        assert_eq!(
            count_active(rows.iter().copied(), &UnitKind::Scope.prefix()),
            2
        );
        assert_eq!(
            count_active(rows.iter().copied(), &UnitKind::Service.prefix()),
            0
        );
    }

    fn point(n: usize, rss_kb: u64, cg: Option<u64>, list_ms: u64, ctl_ms: u64) -> SidePoint {
        SidePoint {
            n,
            rss_kb,
            cg_kb: cg,
            list: Dist::new(vec![list_ms * 1_000_000]),
            ctl: Dist::new(vec![ctl_ms * 1_000_000]),
        }
    }

    #[test]
    fn report_puts_sides_next_to_each_other_with_ratios() {
        let agentos = Side {
            label: "agentosd".into(),
            points: vec![
                point(0, 40_000, Some(0), 1, 4),
                point(100, 39_000, Some(51_200), 1, 5),
                point(1000, 42_048, Some(512_000), 2, 10),
            ],
            start: Dist::new(vec![1; 1000]),
            start_wall: Duration::from_secs(10),
            stop_wall: Duration::from_secs(5),
            rss_after_kb: 41_000,
        };
        let scope = Side {
            label: UnitKind::Scope.label().into(),
            points: vec![
                point(0, 10_000, None, 1, 20),
                point(100, 12_000, None, 2, 30),
                point(1000, 18_192, None, 8, 50),
            ],
            start: Dist::new(vec![1; 1000]),
            start_wall: Duration::from_secs(20),
            stop_wall: Duration::from_secs(15),
            rss_after_kb: 11_000,
        };
        let t = render(&[agentos, scope]);
        assert!(
            t.contains(
                "| 1000 | agentosd | 41.1 MB | +2.0 / +3.4 KB | 512 KB | 2.0 / 2.0 | 10.0 / 10.0 |"
            ),
            "{t}"
        );
        assert!(
            t.contains(
                "| 1000 | systemd-run --scope | 17.8 MB | +8.2 / +6.9 KB | — | 8.0 / 8.0 | 50.0 / 50.0 |"
            ),
            "{t}"
        );
        assert!(
            t.contains("| agentosd | 100 | 0.0 / 0.0 | 5.00 s | 40.0 MB |"),
            "{t}"
        );
        assert!(t.contains("| systemd-run --scope | 50 |"), "{t}");
        // An agentosd that shrank after its first starts: signed growth, no memory ratio.
        assert!(
            t.contains("| 100 | agentosd | 38.1 MB | -10.0 / -10.0 KB |"),
            "{t}"
        );
        assert!(
            t.contains("| systemd-run --scope | 100 | — | 2.00× |"),
            "{t}"
        );
        // Memory since the previous N 6 192 / 3 048 KB per 900 units, ListUnits 8 / 2 ms,
        // systemctl 50 / 10 ms, rate 100 / 50, stop 15 / 5 s.
        assert!(
            t.contains("| systemd-run --scope | 1000 | 2.03× | 4.00× | 5.00× | 2.00× | 3.00× |"),
            "{t}"
        );
        // The empty daemon has no per-unit figures and no ratio row.
        assert!(!t.contains("| systemd-run --scope | 0 |"), "{t}");
        assert!(render(&[]).is_empty());
    }
}
