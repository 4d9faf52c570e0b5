//! `cargo xtask bench scale`: many small agents under one daemon. Starts N agents (`/bin/sleep`,
//! no grants: each in its own cgroup, uid, IPC and network namespace, Landlock and seccomp) over
//! D-Bus with a bounded number of starts in flight, and at each checkpoint (100, 1 000, N…)
//! reports the daemon's resident memory (total and per agent), threads and open files, the
//! kernel's memory (MemAvailable), `ListAgents` over D-Bus and `agentctl list` as a process
//! (p50/p99); then stops them all and reports how long that took.
//!
//! The peer (scale_systemd.rs: the same number of processes as transient systemd units,
//! `systemd-run --scope` and a transient service) needs systemd as PID 1: where it is (the VM)
//! it runs by default (`--peer`), the scopes interleaved with the agents checkpoint by
//! checkpoint (both populations alive at once, list calls alternating), the services after both
//! are stopped (so each `list-units` sees N of ours); elsewhere the report says why not.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use serde_json::json;

use super::harness::{Dist, Env, Layout, Procs, build_bins, chmod, mono_ns, teardown};
use super::scale_systemd::{
    Peer, PeerMode, Side, SidePoint, UnitKind, memory_current_kb, status_kb,
};

#[derive(Args)]
pub struct ScaleArgs {
    /// Agents to start.
    #[arg(long, default_value_t = 1000)]
    pub agents: usize,
    /// Agent counts at which to measure (those not above --agents), comma-separated.
    #[arg(long, default_value = "100,1000,10000", value_delimiter = ',')]
    pub at: Vec<usize>,
    /// Starts (and stops) in flight at once.
    #[arg(long, default_value_t = 16)]
    pub parallel: usize,
    /// `ListAgents` samples per checkpoint (`agentctl list` gets a third as many).
    #[arg(long, default_value_t = 30)]
    pub samples: usize,
    /// The systemd peer: the same number of processes as transient units (systemd as PID 1:
    /// the VM). `auto` runs it where systemd is PID 1 and says why not elsewhere.
    #[arg(long, value_enum, default_value_t = PeerMode::Auto)]
    pub peer: PeerMode,
    /// The peer's unit kinds, comma-separated: `scope` (`systemd-run --scope`, interleaved with
    /// the agents), `service` (`systemd-run -p Type=exec`, after the agents and scopes).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "scope,service"
    )]
    pub peer_units: Vec<UnitKind>,
    /// Use agentosd and agentctl from this directory instead of building release binaries.
    #[arg(long)]
    pub bin_dir: Option<PathBuf>,
    /// Also write the results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Uids for the agents (agentosd's `--agent-uids`); needed above 4 336 agents, the size of
    /// its default range, e.g. 131072-196607.
    #[arg(long, value_name = "FIRST-LAST")]
    pub agent_uids: Option<String>,
    /// Keep the agents running this many seconds after the last checkpoint, before stopping
    /// them (to look at the daemon: /proc/PID/smaps, a heap profiler).
    #[arg(long, default_value_t = 0)]
    pub hold: u64,
}

/// Agents agentosd's default uid range (61184-65519) holds.
const DEFAULT_AGENT_UIDS: usize = 4336;

/// One row of the report.
struct Point {
    agents: usize,
    rss_kb: u64,
    threads: u64,
    fds: usize,
    mem_available_kb: u64,
    /// memory.current of the daemon's cgroup root (its agents' cgroups).
    cg_kb: Option<u64>,
    list: Dist,
    ctl_list: Dist,
}

fn mem_available_kb() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// The peer's `ListUnits` and `systemctl list-units`, each checked to show every unit started.
fn sample_peer(
    p: &Peer,
    rt: &tokio::runtime::Runtime,
    list: Option<&mut Vec<u64>>,
    ctl: Option<&mut Vec<u64>>,
) -> Result<()> {
    if let Some(list) = list {
        let (t, n) = p.list_units_timed(rt)?;
        p.check_count("ListUnits", n)?;
        list.push(t);
    }
    if let Some(ctl) = ctl {
        let (t, n) = p.systemctl_list_timed()?;
        p.check_count("systemctl list-units", n)?;
        ctl.push(t);
    }
    Ok(())
}

/// A checkpoint: the daemon's figures, and the peer's (when one runs alongside) with their
/// list calls alternating with the daemon's, sample by sample.
fn measure(
    env: &Env,
    agents: usize,
    samples: usize,
    mut peer: Option<&mut Peer>,
    mount: &Path,
) -> Result<Point> {
    let pid = env.daemon_pid;
    let (mut list, mut ulist) = (Vec::with_capacity(samples), Vec::new());
    for _ in 0..samples {
        list.push(env.list_timed()?);
        if let Some(p) = &peer {
            sample_peer(p, &env.rt, Some(&mut ulist), None)?;
        }
    }
    let (mut ctl, mut uctl) = (Vec::new(), Vec::new());
    for _ in 0..samples.div_ceil(3) {
        ctl.push(env.agentctl_list_timed()?);
        if let Some(p) = &peer {
            sample_peer(p, &env.rt, None, Some(&mut uctl))?;
        }
    }
    if let Some(p) = peer.as_mut() {
        let point = SidePoint {
            n: agents,
            rss_kb: status_kb(1, "VmRSS:"),
            cg_kb: p.slice_memory_kb(mount),
            list: Dist::new(ulist),
            ctl: Dist::new(uctl),
        };
        p.points.push(point);
    }
    Ok(Point {
        agents,
        rss_kb: status_kb(pid, "VmRSS:"),
        threads: status_kb(pid, "Threads:"),
        fds: std::fs::read_dir(format!("/proc/{pid}/fd"))
            .map(|d| d.count())
            .unwrap_or(0),
        mem_available_kb: mem_available_kb(),
        cg_kb: memory_current_kb(&env.cgroup_root),
        list: Dist::new(list),
        ctl_list: Dist::new(ctl),
    })
}

/// The peer alone (the transient services, after the agents are gone): the same checkpoints.
fn peer_alone(
    a: &ScaleArgs,
    kind: UnitKind,
    at: &[usize],
    env: &Env,
    dir: &Path,
    mount: &Path,
) -> Result<Side> {
    let mut p = Peer::new(kind, &env.rt, dir)?;
    let t0 = Instant::now();
    for &k in std::iter::once(&0).chain(at) {
        p.start_to(k, a.parallel)?;
        if k > 0 {
            eprintln!(
                "bench scale: {k} {} units started ({:.1} s)",
                kind.label(),
                t0.elapsed().as_secs_f64()
            );
        }
        let (mut list, mut ctl) = (Vec::new(), Vec::new());
        for i in 0..a.samples {
            sample_peer(
                &p,
                &env.rt,
                Some(&mut list),
                (i % 3 == 0).then_some(&mut ctl),
            )?;
        }
        let point = SidePoint {
            n: k,
            rss_kb: status_kb(1, "VmRSS:"),
            cg_kb: p.slice_memory_kb(mount),
            list: Dist::new(list),
            ctl: Dist::new(ctl),
        };
        p.points.push(point);
    }
    let stop = p.stop_all()?;
    Ok(p.into_side(stop))
}

/// Start (or stop) `names` over D-Bus, `parallel` calls in flight; the per-call latencies.
fn in_flight(
    env: &Env,
    method: &str,
    calls: Vec<(String, String)>,
    parallel: usize,
) -> Result<Vec<u64>> {
    use futures_util::StreamExt as _;
    let conn = env.client.connection().clone();
    let method = method.to_string();
    env.rt.block_on(async move {
        let results: Vec<Result<u64>> = futures_util::stream::iter(calls)
            .map(|(a, b)| {
                let conn = conn.clone();
                let method = method.clone();
                async move {
                    let t0 = mono_ns();
                    let r = if method == "StartAgent" {
                        conn.call_method(
                            Some("org.agentos1"),
                            "/org/agentos1",
                            Some("org.agentos1.Manager"),
                            method.as_str(),
                            &(a.as_str(), b.as_str()),
                        )
                        .await
                    } else {
                        conn.call_method(
                            Some("org.agentos1"),
                            "/org/agentos1",
                            Some("org.agentos1.Manager"),
                            method.as_str(),
                            &(a.as_str(),),
                        )
                        .await
                    };
                    r.map(|_| mono_ns() - t0)
                        .with_context(|| format!("{method} {a}"))
                }
            })
            .buffer_unordered(parallel.max(1))
            .collect()
            .await;
        results.into_iter().collect()
    })
}

fn contract(name: &str) -> String {
    format!(
        "apiVersion: agentos/v0.2\nkind: AgentContract\nname: {name}\ntenant: {}\n\
         class: {{ latency: DT }}\nexec: {{ command: /bin/sleep, args: [infinity] }}\n",
        super::harness::TENANT
    )
}

pub fn run(a: ScaleArgs) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("bench scale needs root (cgroups, agents with their own uids)");
    }
    // The daemon's unit file allows 1 048 576 open files; raise this run's soft limit as far
    // as the hard limit goes (inherited by the daemon), and say what it is.
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write a live struct.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        lim.rlim_cur = lim.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
    }
    eprintln!("bench scale: open files limit {}", lim.rlim_cur);
    let mount = agentosd::cgroup::cgroup2_mount().context("no cgroup2 mount")?;
    let bin_dir = match &a.bin_dir {
        Some(d) => d.clone(),
        None => build_bins()?,
    };
    let dir = PathBuf::from(format!(
        "/var/tmp/agentos-bench-scale-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir)?;
    chmod(&dir, 0o755)?;
    let cgroup_root = mount.join(format!("agentos-bench-scale-{}", std::process::id()));
    let mut procs = Procs(Vec::new());
    let result = bench(&a, &dir, &bin_dir, &mount, &cgroup_root, &mut procs);
    teardown(procs, &cgroup_root);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// Which peers run, or why none does.
fn peer_kinds(a: &ScaleArgs) -> Result<(Vec<UnitKind>, Option<String>)> {
    let why = match a.peer {
        PeerMode::None => return Ok((Vec::new(), Some("not asked for (--peer none)".into()))),
        _ => super::scale_systemd::unavailable(),
    };
    match (a.peer, why) {
        (PeerMode::Systemd, Some(why)) => bail!("--peer systemd: {why}"),
        (_, Some(why)) => Ok((Vec::new(), Some(why))),
        _ => {
            let mut kinds = a.peer_units.clone();
            kinds.dedup();
            Ok((kinds, None))
        }
    }
}

/// The checkpoints: those of --at not above --agents, and --agents.
fn checkpoints(a: &ScaleArgs) -> Vec<usize> {
    let mut at: Vec<usize> =
        a.at.iter()
            .copied()
            .filter(|n| *n > 0 && *n <= a.agents)
            .collect();
    at.push(a.agents);
    at.sort_unstable();
    at.dedup();
    at
}

fn bench(
    a: &ScaleArgs,
    dir: &Path,
    bin_dir: &Path,
    mount: &Path,
    cgroup_root: &Path,
    procs: &mut Procs,
) -> Result<()> {
    let l = Layout::new(dir)?;
    let audit = l.state.join("audit");
    let mut extra: Vec<OsString> = vec!["--bpf-pin-dir".into(), "none".into()];
    match &a.agent_uids {
        Some(r) => extra.extend(["--agent-uids".into(), r.into()]),
        None if a.agents > DEFAULT_AGENT_UIDS => bail!(
            "{} agents need more uids than agentosd's default range holds ({DEFAULT_AGENT_UIDS}): \
             pass --agent-uids, e.g. 131072-196607",
            a.agents
        ),
        None => {}
    }
    let (kinds, no_peer) = peer_kinds(a)?;
    let env = Env::launch(&l, bin_dir, cgroup_root, &audit, &extra, procs)?;
    let mut scope = match kinds.contains(&UnitKind::Scope) {
        true => Some(Peer::new(UnitKind::Scope, &env.rt, dir)?),
        false => None,
    };
    let mut points = vec![measure(&env, 0, a.samples, scope.as_mut(), mount)?];
    let at = checkpoints(a);
    let mut start_lat = Vec::new();
    let mut started = 0;
    let t0 = Instant::now();
    let mut agents_wall = Duration::ZERO;
    for &k in &at {
        let calls: Vec<(String, String)> = (started..k)
            .map(|i| {
                let name = format!("s{i}");
                (
                    contract(&name),
                    format!("{}/{name}.yaml", l.contracts.display()),
                )
            })
            .collect();
        let t = Instant::now();
        start_lat.extend(in_flight(&env, "StartAgent", calls, a.parallel)?);
        agents_wall += t.elapsed();
        started = k;
        eprintln!(
            "bench scale: {k} agents started ({:.1} s)",
            t0.elapsed().as_secs_f64()
        );
        if let Some(p) = scope.as_mut() {
            p.start_to(k, a.parallel)?;
            eprintln!(
                "bench scale: {k} {} units started ({:.1} s)",
                p.kind.label(),
                t0.elapsed().as_secs_f64()
            );
        }
        points.push(measure(&env, k, a.samples, scope.as_mut(), mount)?);
    }
    let running = env
        .list_states()?
        .iter()
        .filter(|(_, s)| s == "running")
        .count();
    if running != a.agents {
        bail!("{running} of {} agents running after the starts", a.agents);
    }
    if a.hold > 0 {
        eprintln!(
            "bench scale: holding {} agents for {} s (agentosd PID {})",
            a.agents, a.hold, env.daemon_pid
        );
        std::thread::sleep(Duration::from_secs(a.hold));
    }
    let t1 = Instant::now();
    let stops: Vec<(String, String)> = (0..a.agents)
        .map(|i| (format!("{}/s{i}", super::harness::TENANT), String::new()))
        .collect();
    let stop_lat = in_flight(&env, "StopAgent", stops, a.parallel)?;
    let stop_wall = t1.elapsed();
    let agentos = Side {
        label: "agentosd".into(),
        points: points
            .iter()
            .map(|p| SidePoint {
                n: p.agents,
                rss_kb: p.rss_kb,
                cg_kb: p.cg_kb,
                list: Dist::new(p.list.0.clone()),
                ctl: Dist::new(p.ctl_list.0.clone()),
            })
            .collect(),
        start: Dist::new(start_lat.clone()),
        start_wall: agents_wall,
        stop_wall,
        rss_after_kb: status_kb(env.daemon_pid, "VmRSS:"),
    };
    let mut sides = vec![agentos];
    if let Some(mut p) = scope.take() {
        let stop = p.stop_all()?;
        sides.push(p.into_side(stop));
    }
    if kinds.contains(&UnitKind::Service) {
        sides.push(peer_alone(a, UnitKind::Service, &at, &env, dir, mount)?);
    }
    report(
        a,
        &points,
        Dist::new(start_lat),
        agents_wall,
        Dist::new(stop_lat),
        stop_wall,
        &sides,
        no_peer.as_deref(),
    )
}

#[allow(clippy::too_many_arguments)]
fn report(
    a: &ScaleArgs,
    points: &[Point],
    start: Dist,
    start_wall: Duration,
    stop: Dist,
    stop_wall: Duration,
    sides: &[Side],
    no_peer: Option<&str>,
) -> Result<()> {
    use super::harness::ms;
    let base = &points[0];
    println!(
        "\n{} agents (`/bin/sleep`, no grants), {} starts in flight, {}\n",
        a.agents,
        a.parallel,
        super::harness::loadavg()
    );
    println!(
        "| agents | agentosd RSS | per agent | threads | fds | MemAvailable drop | `ListAgents` p50 / p99 ms | `agentctl list` p50 / p99 ms |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    for p in points {
        let per = if p.agents > 0 {
            format!(
                "{:.1} KB",
                (p.rss_kb.saturating_sub(base.rss_kb)) as f64 / p.agents as f64
            )
        } else {
            "—".into()
        };
        println!(
            "| {} | {:.1} MB | {per} | {} | {} | {:.0} MB | {} / {} | {} / {} |",
            p.agents,
            p.rss_kb as f64 / 1024.0,
            p.threads,
            p.fds,
            base.mem_available_kb.saturating_sub(p.mem_available_kb) as f64 / 1024.0,
            ms(p.list.p(500)),
            ms(p.list.p(990)),
            ms(p.ctl_list.p(500)),
            ms(p.ctl_list.p(990)),
        );
    }
    let rate = a.agents as f64 / start_wall.as_secs_f64();
    println!(
        "\nstarts: {} in {:.2} s = {rate:.0}/s; one StartAgent p50 {} ms, p99 {} ms",
        a.agents,
        start_wall.as_secs_f64(),
        ms(start.p(500)),
        ms(start.p(990))
    );
    println!(
        "stop all: {:.2} s; one StopAgent p50 {} ms, p99 {} ms",
        stop_wall.as_secs_f64(),
        ms(stop.p(500)),
        ms(stop.p(990))
    );
    match no_peer {
        Some(why) => println!("systemd peer: unavailable: {why}"),
        None => {
            println!(
                "\nSide by side (manager: agentosd or PID 1; D-Bus list: `ListAgents` or \
                 `ListUnits`; list command: `agentctl list` or `systemctl list-units`; the \
                 MemAvailable drop above counts every population alive at once):"
            );
            print!("{}", super::scale_systemd::render(sides));
        }
    }
    if let Some(path) = &a.json {
        let rows: Vec<_> = points
            .iter()
            .map(|p| json!({"agents": p.agents, "rss_kb": p.rss_kb, "threads": p.threads, "fds": p.fds,
                "mem_available_kb": p.mem_available_kb, "list_agents": p.list.json(), "agentctl_list": p.ctl_list.json()}))
            .collect();
        let peers: Vec<_> = sides
            .iter()
            .skip(1)
            .map(super::scale_systemd::side_json)
            .collect();
        let v = json!({"agents": a.agents, "parallel": a.parallel, "points": rows,
            "start_wall_s": start_wall.as_secs_f64(), "start": start.json(),
            "stop_wall_s": stop_wall.as_secs_f64(), "stop": stop.json(),
            "peers": peers, "peer_unavailable": no_peer});
        std::fs::write(path, serde_json::to_string_pretty(&v)?)?;
    }
    Ok(())
}
