//! `cargo xtask bench isolation`: what one hostile agent costs the others and the operator
//! (issue 15, "Isolation measured"). For each attack, one run: a polite agent calls a tool
//! (`bench.echo`, the gate and a durable audit record) every `--interval-ms` through a quiet
//! window and then a window under attack, while the bench times `agentctl list` (a process, as
//! an operator types it) and `ListAgents` (in process) every `--list-every-ms` (100) and reads
//! the daemon's CPU time and memory. The attacker is an agent with no more rights than the
//! polite one, running this binary (`bench attack --kind K`):
//!
//! | attack | what it does |
//! |---|---|
//! | `large` | 16 connections (all it may have) sending 1 MiB requests, reading nothing |
//! | `pipeline` | 16 connections pipelining pings with long ids, reading nothing |
//! | `connect` | connect and close on its socket in a loop, 4 threads |
//! | `denials` | UDP datagrams to a port it is not granted, in a loop (cgroup BPF refusals, each an event the daemon reads and records at the denial rate) |
//! | `calls` | 4 connections pipelining `tools/call`s of a tool it does not hold, reading the error replies (cheap in bytes, dear in the daemon's CPU: a gate decision, a denial, a reply each) |
//! | `tools` | the same with the tool granted (`bench.echo`): each call gated, recorded, sent to the tool server and answered, up to the agent's 32 calls in flight |
//!
//! Both agents have the same budgets (half a CPU, 256 MiB, 64 tasks), enforced where the cgroup
//! controllers are. Goal: the polite agent's and `agentctl list`'s p99 under attack within 2× of
//! the quiet window's. The windows are back to back in one run, so the host's load falls on both alike.
//! Through both windows the bench also appends a record's size to a file of its own next to the
//! audit log and `fdatasync`s it every `--interval-ms`: the disk's own time for a durable record,
//! quiet and under attack, the floor of the polite agent's call (which waits for one); and it
//! reads how long the polite agent's own threads waited for a CPU (run-queue time, per call).

use std::ffi::OsString;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use serde_json::{Value, json};

use super::harness::{
    Dist, Env, Layout, Procs, TENANT, build_bins, chmod, loadavg, mono_ns, read_samples, teardown,
};

#[derive(Args)]
pub struct IsolationArgs {
    /// Seconds of each window (quiet, then under attack).
    #[arg(long, default_value_t = 8)]
    pub secs: u64,
    /// Comma-separated attacks: large, pipeline, connect, denials, calls, tools.
    #[arg(long, default_value = "large,pipeline,connect,denials,calls,tools")]
    pub attacks: String,
    /// The polite agent's interval between tool calls, ms.
    #[arg(long, default_value_t = 20)]
    pub interval_ms: u64,
    /// How often the bench times `agentctl list` and `ListAgents`, ms (the pause after each).
    /// In a TCG guest one `agentctl list` takes 120-250 ms, so at 100 a list process runs most
    /// of the time in both windows, load on the guest's two CPUs (docs/benchmarks.md).
    #[arg(long, default_value_t = 100)]
    pub list_every_ms: u64,
    /// Directory with release agentosd and agentctl [default: build them].
    #[arg(long)]
    pub bin_dir: Option<PathBuf>,
    /// Working directory [default: /var/tmp/agentos-bench-iso-PID].
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Keep the working directory.
    #[arg(long)]
    pub keep: bool,
    /// The attacker's latency class (`class.latency` in its contract; the polite agent's is
    /// SRT). `DT` puts the attacker's own process in the idle scheduling class, so that what
    /// is left of an attack is what it costs through the daemon, not its process's CPU (on a
    /// host without the cgroup `cpu` controller, where nothing else holds it).
    #[arg(long, default_value = "SRT", value_parser = ["SRT", "DT"])]
    pub attacker_class: String,
    /// One more agentosd argument (repeatable), e.g. `--daemon-arg=--ipc-agent-rate=0` to see
    /// an attack without the rate.
    #[arg(long = "daemon-arg", allow_hyphen_values = true)]
    pub daemon_args: Vec<String>,
    /// Write the results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

#[derive(Args)]
pub struct AttackArgs {
    /// large, pipeline, connect or denials.
    #[arg(long)]
    pub kind: String,
    /// denials: the ungranted UDP port.
    #[arg(long, default_value_t = 0)]
    pub port: u16,
}

const ATTACKS: &[&str] = &["large", "pipeline", "connect", "denials", "calls", "tools"];

/// Both agents' budgets: enforced where the cgroup controllers are (the VM, hosts under
/// systemd), reported as not enforced elsewhere.
const BUDGET: &str = "compute: { cpu: \"0.5\", mem: \"256MiB\", pids: 64 }\n";

pub fn run(a: IsolationArgs) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("bench isolation needs root (cgroups, agents with their own uids)");
    }
    let attacks: Vec<String> = a.attacks.split(',').map(str::to_string).collect();
    if let Some(bad) = attacks.iter().find(|k| !ATTACKS.contains(&k.as_str())) {
        bail!("unknown attack {bad:?}: one of {ATTACKS:?}");
    }
    let mount = agentosd::cgroup::cgroup2_mount().context("no cgroup2 mount")?;
    let bin_dir = match &a.bin_dir {
        Some(d) => d.clone(),
        None => build_bins()?,
    };
    let dir = a.dir.clone().unwrap_or_else(|| {
        PathBuf::from(format!("/var/tmp/agentos-bench-iso-{}", std::process::id()))
    });
    std::fs::create_dir_all(&dir)?;
    let dir = std::fs::canonicalize(&dir)?;
    chmod(&dir, 0o755)?;
    let cgroup_root = mount.join(format!("agentos-bench-iso-{}", std::process::id()));
    let mut procs = Procs(Vec::new());
    let result = bench(&a, &attacks, &dir, &bin_dir, &cgroup_root, &mut procs);
    teardown(procs, &cgroup_root);
    if a.keep {
        eprintln!("bench isolation: kept {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    result
}

fn bench(
    a: &IsolationArgs,
    attacks: &[String],
    dir: &Path,
    bin_dir: &Path,
    cgroup_root: &Path,
    procs: &mut Procs,
) -> Result<()> {
    let l = Layout::new(dir)?;
    let tools = dir.join("tools.d");
    std::fs::create_dir_all(&tools)?;
    chmod(&tools, 0o755)?;
    std::fs::write(tools.join("bench.yaml"), super::mcp::echo_manifest(&l))?;
    let mut extra: Vec<OsString> = vec!["--tools-dir".into(), tools.into_os_string()];
    extra.extend(a.daemon_args.iter().map(OsString::from));
    let audit_dir = l.state.join("audit");
    std::fs::create_dir_all(&audit_dir)?;
    let env = Env::launch(&l, bin_dir, cgroup_root, &audit_dir, &extra, procs)?;
    let controllers = std::fs::read_to_string(cgroup_root.join("cgroup.subtree_control"))
        .unwrap_or_default()
        .trim()
        .to_string();
    eprintln!(
        "bench isolation: agentosd pid {}, load {}, agents' controllers [{controllers}], daemon args {:?}, attacker's class {}",
        env.daemon_pid,
        loadavg(),
        a.daemon_args,
        a.attacker_class
    );
    let mut rows = Vec::new();
    for (i, kind) in attacks.iter().enumerate() {
        let row = one_attack(a, &env, kind, i)?;
        print_row(&row);
        rows.push(row);
    }
    let doc = json!({
        "date": chrono_now(),
        "load_after": loadavg(),
        "controllers": controllers,
        "daemon_args": a.daemon_args,
        "attacker_class": a.attacker_class,
        "secs": a.secs,
        "interval_ms": a.interval_ms,
        "list_every_ms": a.list_every_ms,
        "attacks": rows,
    });
    println!("\n{}", table(&rows));
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_string_pretty(&doc)?)?;
    }
    Ok(())
}

fn chrono_now() -> String {
    std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// How long each thread in cgroup `dir` and below (an agent's process and its tool servers) has
/// waited on a run queue (`/proc/TID/schedstat`, second field), nanoseconds by thread id.
fn run_delays(dir: &Path, out: &mut std::collections::HashMap<u32, u64>) {
    let tids = std::fs::read_to_string(dir.join("cgroup.threads")).unwrap_or_default();
    for tid in tids.lines().filter_map(|t| t.trim().parse::<u32>().ok()) {
        if let Some(ns) = std::fs::read_to_string(format!("/proc/{tid}/schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        {
            out.insert(tid, ns);
        }
    }
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            run_delays(&e.path(), out);
        }
    }
}

/// The run queue time the threads of cgroup `dir` added since `last` (updated): threads that
/// appeared count from 0, threads gone since lose what they added after `last`.
fn run_delay_since(dir: &Path, last: &mut std::collections::HashMap<u32, u64>) -> u64 {
    let mut now = std::collections::HashMap::new();
    run_delays(dir, &mut now);
    let added = now
        .iter()
        .map(|(tid, ns)| ns.saturating_sub(last.get(tid).copied().unwrap_or(0)))
        .sum();
    *last = now;
    added
}

/// The daemon's CPU time in clock ticks.
fn daemon_cpu(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rfind(')').map_or("", |i| &stat[i + 2..]);
    let f: Vec<&str> = after.split_whitespace().collect();
    let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    num(11) + num(12)
}

fn one_attack(a: &IsolationArgs, env: &Env, kind: &str, i: usize) -> Result<Value> {
    let polite = format!("polite{i}");
    let attacker = format!("attack-{kind}");
    // Readable by the agent: ctl/ is in its contract.
    let go_dir = env.ctl_dir.join(format!("go{i}"));
    std::fs::create_dir_all(&go_dir)?;
    chmod(&go_dir, 0o755)?;
    // The agent writes its samples into its own home (the only place it may write).
    let prefix = env.home(&polite).join("out");
    let args: Vec<String> = [
        "bench",
        "mcp-client",
        "--modes",
        "call",
        "--warmup",
        "50",
        "--phases",
        "2",
        "--interval-us",
        &(a.interval_ms * 1000).to_string(),
        "--flood",
        &go_dir.display().to_string(),
        "--out",
        &prefix.display().to_string(),
    ]
    .map(String::from)
    .to_vec();
    env.start_agent_with(&polite, &args, &["bench"], BUDGET)?;
    let ready = PathBuf::from(format!("{}.ready", prefix.display()));
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ready.exists() {
        if Instant::now() > deadline {
            bail!(
                "the polite agent is not ready; its log:\n{}\ndaemon log:\n{}",
                env.agent_log(&polite),
                env.daemon_log()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let polite_cg = env.cgroup_root.join("agents").join(TENANT).join(&polite);
    let phase = a.secs * 1_000_000_000;
    let gap = 1_000_000_000;
    let start = mono_ns() + 500_000_000;
    std::fs::write(go_dir.join("go"), format!("{start} {phase} {gap}\n"))?;
    let pid = env.daemon_pid;
    let tck = super::harness::clk_tck();
    let mut list = [Vec::new(), Vec::new()];
    let mut dbus = [Vec::new(), Vec::new()];
    let mut cpu = [0u64; 2];
    let mut attack_started = false;
    let rss_before = super::scale_systemd::status_kb(pid, "VmRSS:");
    let windows = [
        (start, start + phase),
        (start + phase + gap, start + 2 * phase + gap),
    ];
    let end = windows[1].1;
    // The disk's own time for a durable record, sampled through both windows next to the audit
    // log: what the attack costs the file system every agent's records share (the `tools`
    // attacker's durable records keep it syncing), against what it costs the polite agent.
    let probe_dir = env.state.join("audit");
    let every = Duration::from_millis(a.interval_ms.max(10));
    let disk = std::thread::spawn(move || -> Result<[Vec<u64>; 2]> {
        let mut probe = super::harness::SyncProbe::open(&probe_dir)?;
        let mut out = [Vec::new(), Vec::new()];
        while mono_ns() < end {
            let now = mono_ns();
            if let Some(w) = windows.iter().position(|(b, e)| now >= *b && now < *e) {
                out[w].push(probe.sample()?);
            }
            std::thread::sleep(every);
        }
        Ok(out)
    });
    let mut cpu_at_begin = [None, None];
    // The polite agent's own wait for a CPU (its threads' and its tool server's run queue time),
    // per window, sampled every round of the loop below.
    let mut run_delay = [0u64; 2];
    let mut delays = std::collections::HashMap::new();
    run_delays(&polite_cg, &mut delays);
    while mono_ns() < end {
        let now = mono_ns();
        if !attack_started && now >= start + phase {
            attack_started = true;
            // The peak of the attack window from here (clear_refs 5 resets VmHWM).
            let _ = std::fs::write(format!("/proc/{pid}/clear_refs"), "5");
            start_attacker(env, &attacker, kind, &a.attacker_class)?;
        }
        for (w, (b, e)) in windows.iter().enumerate() {
            if now >= *b && now < *e {
                if cpu_at_begin[w].is_none() {
                    cpu_at_begin[w] = Some(daemon_cpu(pid));
                    // What came before the window is not counted.
                    run_delay_since(&polite_cg, &mut delays);
                } else {
                    run_delay[w] += run_delay_since(&polite_cg, &mut delays);
                }
                list[w].push(env.agentctl_list_timed()?);
                dbus[w].push(env.list_timed()?);
            } else if now >= *e
                && let Some(c0) = cpu_at_begin[w]
                && cpu[w] == 0
            {
                cpu[w] = daemon_cpu(pid).saturating_sub(c0).max(1);
            }
        }
        std::thread::sleep(Duration::from_millis(a.list_every_ms.max(10)));
    }
    if let Some(c0) = cpu_at_begin[1] {
        cpu[1] = daemon_cpu(pid).saturating_sub(c0).max(1);
        run_delay[1] += run_delay_since(&polite_cg, &mut delays);
    }
    let rss_peak = super::scale_systemd::status_kb(pid, "VmHWM:");
    let disk = disk
        .join()
        .map_err(|_| anyhow::anyhow!("the disk probe panicked"))??
        .map(Dist::new);
    let attacker_log = env.agent_log(&attacker);
    // The daemon's CPU for the attacker by its own account (`--ipc-agent-cpu`), over its life
    // (about the attack window).
    let account = env.daemon_cpu_account(&attacker);
    // The attacker's own processes (its client, its tool servers), by its cgroup, over its life
    // (the gap before the window and the window): what the kernel gave them, beside what the
    // daemon spent for it.
    let attacker_usage_us = std::fs::read_to_string(
        env.cgroup_root
            .join("agents")
            .join(TENANT)
            .join(&attacker)
            .join("cpu.stat"),
    )
    .ok()
    .and_then(|t| {
        t.lines()
            .find_map(|l| l.strip_prefix("usage_usec "))
            .and_then(|v| v.trim().parse::<u64>().ok())
    });
    let _ = env.agentctl(&["stop", &attacker]);
    let done = PathBuf::from(format!("{}.done", prefix.display()));
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done.exists() {
        if Instant::now() > deadline {
            bail!(
                "the polite agent did not finish; its log:\n{}{}\ndaemon log:\n{}",
                env.agent_log(&polite),
                std::fs::read_to_string(env.state.join(format!("logs/{TENANT}/{polite}.err")))
                    .unwrap_or_default(),
                env.daemon_log()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // The polite agent's own account, over both windows: is it held by its own share (a
    // machine where its calls are dear)?
    let polite_account = env.daemon_cpu_account(&polite);
    let _ = env.agentctl(&["stop", &polite]);
    std::thread::sleep(Duration::from_secs(2));
    let rss_after = super::scale_systemd::status_kb(pid, "VmRSS:");
    let raw: Vec<Vec<u64>> = (0..2)
        .map(|w| {
            let p = PathBuf::from(format!("{}-call-{w}.bin", prefix.display()));
            read_samples(&p).map(|v| v.into_iter().map(u64::from).collect())
        })
        .collect::<Result<_>>()?;
    let calls: Vec<Dist> = raw.iter().map(|v| Dist::new(v.clone())).collect();
    let secs = a.secs as f64;
    let window = |w: usize| {
        let l = Dist::new(list[w].clone());
        let d = Dist::new(dbus[w].clone());
        json!({
            "call": calls[w].json(),
            "agentctl_list": l.json(),
            "list_agents": d.json(),
            "daemon_cpu_pct": cpu[w] as f64 / tck / secs * 100.0,
            "disk_sync": disk[w].json(),
            "polite_run_delay_us_per_call": run_delay[w] as f64
                / 1e3 / calls[w].0.len().max(1) as f64,
            "slowest_calls": slowest(&raw[w], a.interval_ms),
        })
    };
    let ratio = |w0: &Dist, w1: &Dist, p: usize| w1.p(p) as f64 / w0.p(p).max(1) as f64;
    let (l0, l1) = (Dist::new(list[0].clone()), Dist::new(list[1].clone()));
    Ok(json!({
        "attack": kind,
        "quiet": window(0),
        "attack_window": window(1),
        "ratio": {
            "call_p50": ratio(&calls[0], &calls[1], 500),
            "call_p99": ratio(&calls[0], &calls[1], 990),
            "agentctl_list_p50": ratio(&l0, &l1, 500),
            "agentctl_list_p99": ratio(&l0, &l1, 990),
            "disk_sync_p99": ratio(&disk[0], &disk[1], 990),
        },
        "rss_kib": {"before": rss_before, "peak": rss_peak, "after": rss_after},
        "attacker_daemon_cpu": account,
        "attacker_daemon_cpu_pct": account["used_nsec"].as_u64().unwrap_or(0) as f64 / 1e7 / secs,
        "attacker_cgroup_cpu_pct": attacker_usage_us.map(|u| u as f64 / 1e4 / (secs + 1.0)),
        "polite_daemon_cpu_pct": polite_account["used_nsec"].as_u64().unwrap_or(0) as f64 / 1e7 / (2.0 * secs),
        "polite_daemon_cpu": polite_account,
        "attacker_log_tail": attacker_log.lines().rev().take(3).collect::<Vec<_>>(),
    }))
}

/// The five slowest calls of a window, slowest first, each with when it was due (ms after the
/// window began: the client calls every `interval_ms`, in order): whether a tail is the attack's
/// first second, a moment of it, or spread over it.
fn slowest(samples: &[u64], interval_ms: u64) -> Vec<Value> {
    let mut idx: Vec<usize> = (0..samples.len()).collect();
    idx.sort_by_key(|&i| std::cmp::Reverse(samples[i]));
    idx.into_iter()
        .take(5)
        .map(|i| json!({"at_ms": i as u64 * interval_ms, "ms": samples[i] as f64 / 1e6}))
        .collect()
}

fn start_attacker(env: &Env, name: &str, kind: &str, class: &str) -> Result<()> {
    let mut args = vec![
        "bench".into(),
        "attack".into(),
        "--kind".into(),
        kind.into(),
    ];
    let mut caps: Vec<String> = Vec::new();
    if kind == "tools" {
        caps.push("bench".into());
    }
    if kind == "denials" {
        // Granted one port (nothing listens there); its datagrams go to the next one.
        let l = std::net::UdpSocket::bind("127.0.0.1:0")?;
        let port = l.local_addr()?.port();
        drop(l);
        caps.push(format!("net.connect: [\"127.0.0.1:{port}\"]"));
        args.extend(["--port".into(), (port.wrapping_add(1)).to_string()]);
    }
    let caps: Vec<&str> = caps.iter().map(String::as_str).collect();
    env.start_agent_in_class(name, &args, &caps, BUDGET, class)
}

fn print_row(r: &Value) {
    let ms = |v: &Value| v.as_u64().unwrap_or(0) as f64 / 1e6;
    let (q, t, x) = (&r["quiet"], &r["attack_window"], &r["ratio"]);
    eprintln!(
        "bench isolation: {}: call p99 {:.1} → {:.1} ms ({:.2}×), agentctl list p99 {:.1} → {:.1} ms ({:.2}×), the disk's append + fdatasync p99 {:.1} → {:.1} ms, the polite agent's wait for a CPU {:.0} → {:.0} µs a call, daemon CPU {:.0}% → {:.0}% (the attacker's account {:.1}%, held {} times; the polite agent's {:.1}%, held {} times)",
        r["attack"].as_str().unwrap_or(""),
        ms(&q["call"]["p99_ns"]),
        ms(&t["call"]["p99_ns"]),
        x["call_p99"].as_f64().unwrap_or(0.0),
        ms(&q["agentctl_list"]["p99_ns"]),
        ms(&t["agentctl_list"]["p99_ns"]),
        x["agentctl_list_p99"].as_f64().unwrap_or(0.0),
        ms(&q["disk_sync"]["p99_ns"]),
        ms(&t["disk_sync"]["p99_ns"]),
        q["polite_run_delay_us_per_call"].as_f64().unwrap_or(0.0),
        t["polite_run_delay_us_per_call"].as_f64().unwrap_or(0.0),
        q["daemon_cpu_pct"].as_f64().unwrap_or(0.0),
        t["daemon_cpu_pct"].as_f64().unwrap_or(0.0),
        r["attacker_daemon_cpu_pct"].as_f64().unwrap_or(0.0),
        r["attacker_daemon_cpu"]["throttles"].as_u64().unwrap_or(0),
        r["polite_daemon_cpu_pct"].as_f64().unwrap_or(0.0),
        r["polite_daemon_cpu"]["throttles"].as_u64().unwrap_or(0),
    );
    let slow = |w: &Value| {
        w["slowest_calls"]
            .as_array()
            .map(|v| {
                v.iter()
                    .map(|c| {
                        format!(
                            "{:.1} ms at {:.1} s",
                            c["ms"].as_f64().unwrap_or(0.0),
                            c["at_ms"].as_u64().unwrap_or(0) as f64 / 1e3
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default()
    };
    eprintln!(
        "bench isolation: {}: the attacker's own processes (its cgroup) {:.1}% of a CPU; the slowest calls, quiet: {}; under attack: {}",
        r["attack"].as_str().unwrap_or(""),
        r["attacker_cgroup_cpu_pct"].as_f64().unwrap_or(f64::NAN),
        slow(q),
        slow(t)
    );
}

/// The Markdown table of docs/benchmarks.md.
fn table(rows: &[Value]) -> String {
    let ms = |v: &Value| format!("{:.1}", v.as_u64().unwrap_or(0) as f64 / 1e6);
    let mut s = String::from(
        "| attack | polite call ms quiet p50 / p99 | under attack p50 / p99 | ratio p50 / p99 | `agentctl list` ms quiet p50 / p99 | under attack p50 / p99 | ratio p50 / p99 | disk append + `fdatasync` ms p99 quiet → attack | the polite agent's wait for a CPU, µs a call, quiet → attack | daemon CPU quiet → attack | attacker's account | RSS MiB before / peak / after |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let (q, t, x) = (&r["quiet"], &r["attack_window"], &r["ratio"]);
        let mib = |k: &str| r["rss_kib"][k].as_u64().unwrap_or(0) as f64 / 1024.0;
        s.push_str(&format!(
            "| {} | {} / {} | {} / {} | {:.2} / {:.2}× | {} / {} | {} / {} | {:.2} / {:.2}× | {} → {} | {:.0} → {:.0} | {:.0} → {:.0}% | {:.1}% | {:.1} / {:.1} / {:.1} |\n",
            r["attack"].as_str().unwrap_or(""),
            ms(&q["call"]["p50_ns"]),
            ms(&q["call"]["p99_ns"]),
            ms(&t["call"]["p50_ns"]),
            ms(&t["call"]["p99_ns"]),
            x["call_p50"].as_f64().unwrap_or(0.0),
            x["call_p99"].as_f64().unwrap_or(0.0),
            ms(&q["agentctl_list"]["p50_ns"]),
            ms(&q["agentctl_list"]["p99_ns"]),
            ms(&t["agentctl_list"]["p50_ns"]),
            ms(&t["agentctl_list"]["p99_ns"]),
            x["agentctl_list_p50"].as_f64().unwrap_or(0.0),
            x["agentctl_list_p99"].as_f64().unwrap_or(0.0),
            ms(&q["disk_sync"]["p99_ns"]),
            ms(&t["disk_sync"]["p99_ns"]),
            q["polite_run_delay_us_per_call"].as_f64().unwrap_or(0.0),
            t["polite_run_delay_us_per_call"].as_f64().unwrap_or(0.0),
            q["daemon_cpu_pct"].as_f64().unwrap_or(0.0),
            t["daemon_cpu_pct"].as_f64().unwrap_or(0.0),
            r["attacker_daemon_cpu_pct"].as_f64().unwrap_or(0.0),
            mib("before"),
            mib("peak"),
            mib("after"),
        ));
    }
    s
}

// ---------------------------------------------------------------------------------------------
// The attacker (runs as an agent).

/// `bench attack`: runs until the agent is stopped.
pub fn attack(a: AttackArgs) -> Result<()> {
    let sock = std::env::var_os("AGENTOS_SOCKET")
        .map(PathBuf::from)
        .context("no AGENTOS_SOCKET")?;
    match a.kind.as_str() {
        "large" => flood(&sock, 16, |id| {
            let mut l = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":""#).into_bytes();
            l.resize(l.len() + (1 << 20), b'x');
            l.extend_from_slice(b"\"}\n");
            l
        }),
        "pipeline" => flood(&sock, 16, |id| {
            format!("{{\"jsonrpc\":\"2.0\",\"id\":\"{id:0>247}\",\"method\":\"ping\"}}\n")
                .into_bytes()
        }),
        "connect" => {
            let threads: Vec<_> = (0..4)
                .map(|_| {
                    let sock = sock.clone();
                    std::thread::spawn(move || {
                        loop {
                            let _ = UnixStream::connect(&sock);
                        }
                    })
                })
                .collect();
            for t in threads {
                let _ = t.join();
            }
            Ok(())
        }
        "calls" | "tools" => calls(&sock, 4),
        "denials" => {
            let s = std::net::UdpSocket::bind("127.0.0.1:0").context("udp socket")?;
            loop {
                let _ = s.send_to(b"x", ("127.0.0.1", a.port));
            }
        }
        other => bail!("unknown attack {other:?}"),
    }
}

/// `conns` connections, each initialized, then sending `line(id)` without reading; a connection
/// the daemon closed (stalled) is made again.
fn flood(sock: &Path, conns: usize, line: fn(u64) -> Vec<u8>) -> Result<()> {
    let threads: Vec<_> = (0..conns)
        .map(|t| {
            let sock = sock.to_path_buf();
            std::thread::spawn(move || {
                let mut id = (t as u64) << 40;
                loop {
                    let Ok(mut s) = UnixStream::connect(&sock) else {
                        std::thread::sleep(Duration::from_millis(100));
                        continue;
                    };
                    let init = b"{\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"initialize\",\"params\":{\"protocolVersion\":\"2025-06-18\",\"capabilities\":{},\"clientInfo\":{\"name\":\"attack\",\"version\":\"0\"}}}\n{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n";
                    if s.write_all(init).is_err() {
                        continue;
                    }
                    loop {
                        id += 1;
                        if s.write_all(&line(id)).is_err() {
                            break;
                        }
                    }
                }
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
    Ok(())
}

/// `conns` connections, each initialized, pipelining `tools/call`s of `bench.echo` (which the
/// attacker does not hold: each is denied) and reading the replies on a thread of its own.
fn calls(sock: &Path, conns: usize) -> Result<()> {
    let threads: Vec<_> = (0..conns)
        .map(|_| {
            let sock = sock.to_path_buf();
            std::thread::spawn(move || {
                let Ok(mut s) = UnixStream::connect(&sock) else {
                    return;
                };
                let Ok(mut r) = s.try_clone() else {
                    return;
                };
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; 1 << 16];
                    while matches!(std::io::Read::read(&mut r, &mut buf), Ok(n) if n > 0) {}
                });
                let init = b"{\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"initialize\",\"params\":{\"protocolVersion\":\"2025-06-18\",\"capabilities\":{},\"clientInfo\":{\"name\":\"attack\",\"version\":\"0\"}}}\n";
                let batch: Vec<u8> = (1..=64)
                    .flat_map(|id| {
                        format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"tools/call\",\"params\":{{\"name\":\"bench.echo\",\"arguments\":{{}}}}}}\n")
                            .into_bytes()
                    })
                    .collect();
                if s.write_all(init).is_err() {
                    return;
                }
                while s.write_all(&batch).is_ok() {}
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
    Ok(())
}
