//! `cargo xtask bench scale`: many small agents under one daemon. Starts N agents (`/bin/sleep`,
//! no grants: each in its own cgroup, uid, IPC and network namespace, Landlock and seccomp) over
//! D-Bus with a bounded number of starts in flight, and at each checkpoint (100, 1 000, N…)
//! reports the daemon's resident memory (total and per agent), threads and open files, the
//! kernel's memory (MemAvailable), `ListAgents` over D-Bus and `agentctl list` as a process
//! (p50/p99); then stops them all and reports how long that took.
//!
//! The peer (the same number of processes as transient systemd scopes, `systemd-run --scope`)
//! needs systemd as PID 1: where it is (the VM), `--systemd` runs it side by side; elsewhere the
//! table says it was not run.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use serde_json::json;

use super::harness::{Dist, Env, Layout, Procs, build_bins, chmod, mono_ns, teardown};

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
    /// Also start the same number of processes as `systemd-run --scope` units (systemd as
    /// PID 1 only).
    #[arg(long)]
    pub systemd: bool,
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
    list: Dist,
    ctl_list: Dist,
}

fn status_field(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn mem_available_kb() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn measure(env: &Env, agents: usize, samples: usize) -> Result<Point> {
    let pid = env.daemon_pid;
    let mut list = Vec::with_capacity(samples);
    for _ in 0..samples {
        list.push(env.list_timed()?);
    }
    let mut ctl = Vec::new();
    for _ in 0..samples.div_ceil(3) {
        ctl.push(env.agentctl_list_timed()?);
    }
    Ok(Point {
        agents,
        rss_kb: status_field(pid, "VmRSS:"),
        threads: status_field(pid, "Threads:"),
        fds: std::fs::read_dir(format!("/proc/{pid}/fd"))
            .map(|d| d.count())
            .unwrap_or(0),
        mem_available_kb: mem_available_kb(),
        list: Dist::new(list),
        ctl_list: Dist::new(ctl),
    })
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

/// The same number of `sleep` processes as transient scopes (`systemd-run --scope`), started
/// with the same parallelism; (start wall time, `systemctl list-units` p50/p99, stop time).
fn systemd_peer(n: usize, parallel: usize, samples: usize) -> Result<(Duration, Dist, Duration)> {
    if std::fs::read_to_string("/proc/1/comm")
        .unwrap_or_default()
        .trim()
        != "systemd"
    {
        bail!("--systemd needs systemd as PID 1 (run it in the VM)");
    }
    let t0 = Instant::now();
    let mut children = Vec::new();
    for i in 0..n {
        children.push(
            Command::new("systemd-run")
                .args([
                    "--scope",
                    "--quiet",
                    "--collect",
                    "--slice",
                    "agentos-bench-scale.slice",
                ])
                .arg(format!("--unit=agentos-bench-scale-{i}"))
                .args(["/bin/sleep", "infinity"])
                .stdin(std::process::Stdio::null())
                .spawn()?,
        );
        while children.len() >= parallel.max(1) {
            // A scope's systemd-run stays as the process; wait until the unit exists instead.
            let i = children.len() - parallel.max(1);
            let unit = format!("agentos-bench-scale-{i}.scope");
            let ok = Command::new("systemctl")
                .args(["is-active", "--quiet", &unit])
                .status()?
                .success();
            if ok {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let started = t0.elapsed();
    let mut list = Vec::new();
    for _ in 0..samples.div_ceil(3) {
        let t = mono_ns();
        Command::new("systemctl")
            .args([
                "list-units",
                "--no-pager",
                "--no-legend",
                "agentos-bench-scale-*",
            ])
            .output()?;
        list.push(mono_ns() - t);
    }
    let t1 = Instant::now();
    Command::new("systemctl")
        .args(["stop", "agentos-bench-scale.slice"])
        .status()?;
    let stopped = t1.elapsed();
    for mut c in children {
        let _ = c.wait();
    }
    Ok((started, Dist::new(list), stopped))
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
    let result = bench(&a, &dir, &bin_dir, &cgroup_root, &mut procs);
    teardown(procs, &cgroup_root);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn bench(
    a: &ScaleArgs,
    dir: &Path,
    bin_dir: &Path,
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
    let env = Env::launch(&l, bin_dir, cgroup_root, &audit, &extra, procs)?;
    let mut points = vec![measure(&env, 0, a.samples)?];
    let mut at: Vec<usize> =
        a.at.iter()
            .copied()
            .filter(|n| *n > 0 && *n <= a.agents)
            .collect();
    if !at.contains(&a.agents) {
        at.push(a.agents);
    }
    at.sort_unstable();
    at.dedup();
    let mut start_lat = Vec::new();
    let mut started = 0;
    let t0 = Instant::now();
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
        start_lat.extend(in_flight(&env, "StartAgent", calls, a.parallel)?);
        started = k;
        eprintln!(
            "bench scale: {k} agents started ({:.1} s)",
            t0.elapsed().as_secs_f64()
        );
        points.push(measure(&env, k, a.samples)?);
    }
    let start_wall = t0.elapsed();
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
    let peer = if a.systemd {
        Some(systemd_peer(a.agents, a.parallel, a.samples)?)
    } else {
        None
    };
    report(
        a,
        &points,
        Dist::new(start_lat),
        start_wall,
        Dist::new(stop_lat),
        stop_wall,
        peer.as_ref(),
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
    peer: Option<&(Duration, Dist, Duration)>,
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
    match peer {
        Some((st, list, sp)) => println!(
            "systemd-run --scope, same count and parallelism: started in {:.2} s ({:.0}/s), `systemctl list-units` p50 {} / p99 {} ms, stop {:.2} s",
            st.as_secs_f64(),
            a.agents as f64 / st.as_secs_f64(),
            ms(list.p(500)),
            ms(list.p(990)),
            sp.as_secs_f64()
        ),
        None => {
            println!("systemd-run --scope peer: not run (--systemd, with systemd as PID 1: the VM)")
        }
    }
    if let Some(path) = &a.json {
        let rows: Vec<_> = points
            .iter()
            .map(|p| json!({"agents": p.agents, "rss_kb": p.rss_kb, "threads": p.threads, "fds": p.fds,
                "mem_available_kb": p.mem_available_kb, "list_agents": p.list.json(), "agentctl_list": p.ctl_list.json()}))
            .collect();
        let v = json!({"agents": a.agents, "parallel": a.parallel, "points": rows,
            "start_wall_s": start_wall.as_secs_f64(), "start": start.json(),
            "stop_wall_s": stop_wall.as_secs_f64(), "stop": stop.json()});
        std::fs::write(path, serde_json::to_string_pretty(&v)?)?;
    }
    Ok(())
}
