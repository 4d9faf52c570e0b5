//! `cargo xtask bench models`: model calls through the gateway (agentosd's models/) side by side
//! with the same calls made direct, black box. A private dbus-daemon and a release agentosd (own
//! cgroup root, own state directory with the audit log on the real disk unless `--audit-dir`,
//! `--models` naming the two backends below) are started; the measured clients are this binary
//! re-executed (`bench model-client`): as a plain process over TCP to the backend (direct), and
//! as an agent over HTTP/1.1 on its `$AGENTOS_MODELS_SOCKET` (through the gateway). Same client
//! code on both paths: raw HTTP/1.1 with keep-alive, one request in flight, a streaming parse of
//! the server-sent events, each event time-stamped when the read that completed it returned.
//!
//! Backends: "instant" (models_http.rs, in the bench process: a canned stream of `--chunks`
//! content chunks written back to back, or a whole JSON answer; what is left is the gateway's
//! own cost) and llama.cpp's server with SmolLM2-135M (`cargo xtask model-peers`; 1 thread, the
//! same prompt every time so its cache answers the prompt; the gateway's cost next to a real
//! model's latency).
//!
//! Sequential part: `--rounds` rounds, each runs the direct client process and the agent (in
//! alternating order, so drift hits both alike), each doing instant streams, instant whole
//! answers and llama streams. Then a bounds probe (an agent starts more streams at once than
//! the gateway's in-flight limits allow and does not read them: are the extra ones refused or
//! held?). Then the flood: `--agents` direct clients, then as many agents, each streaming from
//! the instant backend in a loop for `--flood-secs`.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use serde_json::{Value, json};

use super::harness::*;
use super::models_http::{self, chat_body};

#[derive(Args)]
pub struct ModelsArgs {
    /// Streamed requests to the instant backend per path (split over the rounds).
    #[arg(long, default_value_t = 5000)]
    pub requests: usize,
    /// Whole (not streamed) requests to the instant backend per path.
    #[arg(long, default_value_t = 2000)]
    pub whole: usize,
    /// Content chunks per instant answer (its `max_tokens`).
    #[arg(long, default_value_t = 64)]
    pub chunks: u64,
    /// Streamed requests to llama.cpp per path (0: leave the real model out).
    #[arg(long, default_value_t = 60)]
    pub llama_requests: usize,
    /// Tokens per llama.cpp answer (`max_tokens`, `ignore_eos`).
    #[arg(long, default_value_t = 16)]
    pub llama_tokens: u64,
    /// Interleaved rounds of the sequential part.
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// Unmeasured instant requests per client process and kind first (llama: 2).
    #[arg(long, default_value_t = 200)]
    pub warmup: usize,
    /// fdatasync samples on the audit log's file system.
    #[arg(long, default_value_t = 1000)]
    pub syncs: usize,
    /// Concurrent clients in the flood, on each path (0: no flood).
    #[arg(long, default_value_t = 20)]
    pub agents: usize,
    /// Seconds of the flood, per path.
    #[arg(long, default_value_t = 10)]
    pub flood_secs: u64,
    /// Working directory [default: /var/tmp/agentos-bench-models-PID].
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// The audit log's directory [default: STATE_DIR/audit]; on /dev/shm (tmpfs) it takes the
    /// disk out of the measurement.
    #[arg(long)]
    pub audit_dir: Option<PathBuf>,
    /// Directory with release agentosd and agentctl [default: build them].
    #[arg(long)]
    pub bin_dir: Option<PathBuf>,
    /// Leave the working directory in place.
    #[arg(long)]
    pub keep: bool,
    /// Also write the results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

#[derive(Args)]
pub struct ClientArgs {
    /// JSON list of jobs: {name, target (tcp:HOST:PORT | unix:PATH | agent), model, stream,
    /// max_tokens, calls, warmup}.
    #[arg(long)]
    pub jobs: String,
    /// Samples go to PREFIX-JOB-{ttft,gap,total}.bin (u32 ns), then PREFIX.done.
    #[arg(long)]
    pub out: PathBuf,
    /// Flood: after the warm-up write PREFIX.ready, wait for DIR/go ("start_ns phase_ns gap_ns"),
    /// run the first job for the whole of phase `--phase`; PREFIX-JOB.count: "requests chunks".
    #[arg(long)]
    pub flood: Option<PathBuf>,
    #[arg(long, default_value_t = 0)]
    pub phase: u64,
    /// Instead of jobs: probe the gateway's bounds on streams in flight (as an agent); the
    /// statuses go to PREFIX-probe.txt.
    #[arg(long)]
    pub probe: bool,
}

struct Job {
    name: String,
    target: String,
    model: String,
    stream: bool,
    max_tokens: u64,
    calls: usize,
    warmup: usize,
}

impl Job {
    fn json(&self) -> Value {
        json!({"name": self.name, "target": self.target, "model": self.model,
               "stream": self.stream, "max_tokens": self.max_tokens, "calls": self.calls,
               "warmup": self.warmup})
    }
    fn parse(v: &Value) -> Result<Job> {
        let s = |k: &str| {
            v[k].as_str()
                .map(String::from)
                .with_context(|| format!("job {v}: {k}"))
        };
        let n = |k: &str| v[k].as_u64().with_context(|| format!("job {v}: {k}"));
        Ok(Job {
            name: s("name")?,
            target: s("target")?,
            model: s("model")?,
            stream: v["stream"].as_bool().context("stream")?,
            max_tokens: n("max_tokens")?,
            calls: n("calls")? as usize,
            warmup: n("warmup")? as usize,
        })
    }
}

fn u32s(v: impl IntoIterator<Item = u64>) -> Vec<u32> {
    v.into_iter()
        .map(|x| x.min(u32::MAX as u64) as u32)
        .collect()
}

fn out_path(prefix: &Path, job: &str, what: &str) -> PathBuf {
    PathBuf::from(format!("{}-{job}-{what}", prefix.display()))
}

/// Streams one agent starts and does not read: more than the gateway's in-flight limit
/// per agent on a backend with room, and more than `max_concurrent` on the capped backend.
pub(super) const PROBE_UNCAPPED: usize = agentosd::models::MAX_INFLIGHT_PER_AGENT + 2;
pub(super) const PROBE_CAPPED: usize = CAPPED_MAX_CONCURRENT + 1;
/// `max_concurrent` of the bench's "instant-capped" backend (the instant server again).
pub(super) const CAPPED_MAX_CONCURRENT: usize = 2;

fn probe(a: &ClientArgs) -> Result<()> {
    let wait = Duration::from_secs(3);
    let mut text = String::new();
    for (model, n) in [
        ("instant", PROBE_UNCAPPED),
        ("instant-capped", PROBE_CAPPED),
    ] {
        let (statuses, conns) = models_http::probe_concurrent("agent", model, n, 10_000_000, wait)?;
        text.push_str(&format!("{model} {n}: {}\n", statuses.join(", ")));
        drop(conns);
        // Let the daemon see the connections close and end those streams.
        std::thread::sleep(Duration::from_millis(300));
    }
    std::fs::write(format!("{}-probe.txt", a.out.display()), text)?;
    touch(&a.out, "done", "")
}

/// `bench model-client`.
pub fn client(a: ClientArgs) -> Result<()> {
    if a.probe {
        return probe(&a);
    }
    let jobs: Vec<Job> = serde_json::from_str::<Vec<Value>>(&a.jobs)
        .context("--jobs")?
        .iter()
        .map(Job::parse)
        .collect::<Result<_>>()?;
    let mut conns: HashMap<String, models_http::Client> = HashMap::new();
    for j in &jobs {
        if !conns.contains_key(&j.target) {
            conns.insert(j.target.clone(), models_http::connect(&j.target)?);
        }
        let c = conns.get_mut(&j.target).context("connection")?;
        let body = chat_body(&j.model, j.stream, j.max_tokens);
        let expect = if j.stream { j.max_tokens } else { 0 };
        for _ in 0..j.warmup {
            c.chat(&body, j.stream, expect)
                .with_context(|| format!("{} (warm-up)", j.name))?;
        }
    }
    match &a.flood {
        None => {
            for j in &jobs {
                let c = conns.get_mut(&j.target).context("connection")?;
                let body = chat_body(&j.model, j.stream, j.max_tokens);
                let expect = if j.stream { j.max_tokens } else { 0 };
                let (mut ttft, mut gaps, mut total) = (Vec::new(), Vec::new(), Vec::new());
                let reconnects = c.reconnects;
                for _ in 0..j.calls {
                    let t = c.chat(&body, j.stream, expect).context(j.name.clone())?;
                    ttft.push(t.ttft);
                    total.push(t.total);
                    gaps.extend(t.gaps);
                }
                write_u32s(&out_path(&a.out, &j.name, "ttft.bin"), &u32s(ttft))?;
                write_u32s(&out_path(&a.out, &j.name, "gap.bin"), &u32s(gaps))?;
                write_u32s(&out_path(&a.out, &j.name, "total.bin"), &u32s(total))?;
                std::fs::write(
                    out_path(&a.out, &j.name, "reconnects"),
                    format!("{}\n", c.reconnects - reconnects),
                )?;
            }
        }
        Some(dir) => {
            let j = jobs.first().context("no job")?;
            touch(&a.out, "ready", "")?;
            let [start, phase, gap] = wait_go(dir)?;
            let begin = start + a.phase * (phase + gap);
            let end = begin + phase;
            while mono_ns() < begin {
                std::thread::sleep(Duration::from_micros(
                    ((begin - mono_ns()) / 1000).clamp(1, 10_000),
                ));
            }
            let c = conns.get_mut(&j.target).context("connection")?;
            let body = chat_body(&j.model, j.stream, j.max_tokens);
            let (mut ttft, mut total, mut chunks) = (Vec::new(), Vec::new(), 0u64);
            while mono_ns() < end {
                let t = c.chat(&body, j.stream, j.max_tokens)?;
                if mono_ns() <= end {
                    ttft.push(t.ttft);
                    total.push(t.total);
                    chunks += t.chunks;
                }
            }
            write_u32s(&out_path(&a.out, &j.name, "ttft.bin"), &u32s(ttft.clone()))?;
            write_u32s(&out_path(&a.out, &j.name, "total.bin"), &u32s(total))?;
            std::fs::write(
                out_path(&a.out, &j.name, "count"),
                format!("{} {chunks}\n", ttft.len()),
            )?;
        }
    }
    touch(&a.out, "done", "")?;
    Ok(())
}

fn wait_go(dir: &Path) -> Result<[u64; 3]> {
    let go = dir.join("go");
    let text = loop {
        if let Ok(t) = std::fs::read_to_string(&go)
            && t.ends_with('\n')
        {
            break t;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let v: Vec<u64> = text
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .context("go file")?;
    v.try_into()
        .map_err(|_| anyhow::anyhow!("go file: {text:?}"))
}

// ---------------------------------------------------------------------------------------------
// The bench.

/// llama.cpp's server from the model peers (1 thread, 1 slot); its address.
pub(super) fn start_llama(procs: &mut Procs) -> Result<String> {
    let peers = crate::model_peers::ensure()?;
    let mut child = Command::new(peers.join("venv/bin/python3"))
        .arg(peers.join("llama_server.py"))
        .args(["--exit-with-stdin", "--threads", "1", "--parallel", "1"])
        .args(["--ctx", "2048"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("start llama_server.py of the model peers")?;
    let stdout = child.stdout.take().context("stdout")?;
    // Its stdin stays open in `child` (the launcher exits when it closes).
    procs.0.push(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx.recv_timeout(Duration::from_secs(60)).unwrap_or_default();
    match line.trim().strip_prefix("listening http://") {
        Some(a) if a.starts_with("127.0.0.1:") => Ok(a.to_string()),
        _ => bail!("llama_server.py was not ready in 60 s (said {line:?})"),
    }
}

pub fn run(a: ModelsArgs) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("bench models needs root (cgroups, agents with their own uids)");
    }
    if a.rounds == 0 || a.requests < a.rounds || a.whole < a.rounds {
        bail!("--requests and --whole must be at least --rounds");
    }
    let mount = agentosd::cgroup::cgroup2_mount().context("no cgroup2 mount")?;
    let bin_dir = match &a.bin_dir {
        Some(d) => d.clone(),
        None => build_bins()?,
    };
    for b in ["agentosd", "agentctl"] {
        if !bin_dir.join(b).exists() {
            bail!("{} is missing", bin_dir.join(b).display());
        }
    }
    let dir = a.dir.clone().unwrap_or_else(|| {
        PathBuf::from(format!(
            "/var/tmp/agentos-bench-models-{}",
            std::process::id()
        ))
    });
    std::fs::create_dir_all(&dir)?;
    let dir = std::fs::canonicalize(&dir)?;
    chmod(&dir, 0o755)?;
    let cgroup_root = mount.join(format!("agentos-bench-models-{}", std::process::id()));
    let audit_created = a.audit_dir.as_ref().is_some_and(|d| !d.exists());
    let mut procs = Procs(Vec::new());
    let result = super::models_report::bench(&a, &dir, &bin_dir, &cgroup_root, &mut procs);
    teardown(procs, &cgroup_root);
    if a.keep {
        eprintln!("bench models: kept {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&dir);
        if let (true, Some(d)) = (audit_created, &a.audit_dir) {
            let _ = std::fs::remove_dir_all(d);
        }
    }
    result
}

/// The paths of the sequential part.
pub(super) const PATHS: [(&str, &str); 6] = [
    ("instant-stream", "direct"),
    ("instant-stream", "gateway"),
    ("instant-whole", "direct"),
    ("instant-whole", "gateway"),
    ("llama-stream", "direct"),
    ("llama-stream", "gateway"),
];

/// Samples of one path: TTFT, inter-chunk gaps, totals.
#[derive(Default)]
pub(super) struct PathSamples {
    pub ttft: Vec<u64>,
    pub gap: Vec<u64>,
    pub total: Vec<u64>,
    /// Requests that began with a new connection (the server had closed the last one).
    pub reconnects: u64,
}

impl PathSamples {
    fn add(&mut self, prefix: &Path, job: &str) -> Result<()> {
        let r = |w: &str| -> Result<Vec<u64>> {
            Ok(read_samples(&out_path(prefix, job, w))?
                .into_iter()
                .map(u64::from)
                .collect())
        };
        self.ttft.extend(r("ttft.bin")?);
        self.gap.extend(r("gap.bin")?);
        self.total.extend(r("total.bin")?);
        self.reconnects += std::fs::read_to_string(out_path(prefix, job, "reconnects"))?
            .trim()
            .parse::<u64>()
            .context("reconnects file")?;
        Ok(())
    }
}

/// Where the clients of the sequential part connect.
pub(super) struct Targets {
    pub instant: String,
    pub llama: Option<String>,
}

/// The jobs of one client process of round `round` (`gateway`: as an agent).
fn round_jobs(a: &ModelsArgs, t: &Targets, gateway: bool, round: usize) -> Vec<Job> {
    let share = |n: usize| n / a.rounds + usize::from(round < n % a.rounds);
    let (target, llama_target) = if gateway {
        ("agent".to_string(), Some("agent".to_string()))
    } else {
        (
            format!("tcp:{}", t.instant),
            t.llama.as_ref().map(|l| format!("tcp:{l}")),
        )
    };
    let (instant_model, llama_model) = if gateway {
        ("instant", "chat")
    } else {
        ("instant-upstream", "SmolLM2-135M-Instruct")
    };
    let mut v = vec![
        Job {
            name: "instant-stream".into(),
            target: target.clone(),
            model: instant_model.into(),
            stream: true,
            max_tokens: a.chunks,
            calls: share(a.requests),
            warmup: a.warmup,
        },
        Job {
            name: "instant-whole".into(),
            target,
            model: instant_model.into(),
            stream: false,
            max_tokens: a.chunks,
            calls: share(a.whole),
            warmup: a.warmup / 2,
        },
    ];
    if let Some(lt) = llama_target
        && t.llama.is_some()
        && a.llama_requests > 0
    {
        v.push(Job {
            name: "llama-stream".into(),
            target: lt,
            model: llama_model.into(),
            stream: true,
            max_tokens: a.llama_tokens,
            calls: share(a.llama_requests),
            warmup: 2,
        });
    }
    v
}

fn jobs_arg(jobs: &[Job]) -> String {
    Value::Array(jobs.iter().map(Job::json).collect()).to_string()
}

/// The sequential part: per round the direct process and the agent, in alternating order.
pub(super) fn sequential(
    a: &ModelsArgs,
    env: &Env,
    out: &Path,
    t: &Targets,
    audit_dir: &Path,
) -> Result<(Vec<PathSamples>, Vec<u64>)> {
    let mut samples: Vec<PathSamples> = (0..PATHS.len()).map(|_| PathSamples::default()).collect();
    let mut syncs = Vec::new();
    for r in 0..a.rounds {
        eprintln!("bench models: round {}/{}…", r + 1, a.rounds);
        let order = if r % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for gateway in order {
            let jobs = round_jobs(a, t, gateway, r);
            let prefix = if gateway {
                let name = format!("seq-{r}");
                let prefix = env.home(&name).join("out");
                let args = client_args(&jobs, &prefix, None);
                env.start_agent_with(&name, &args, &[], CONTRACT_EXTRA)?;
                env.wait_for(std::slice::from_ref(&name), "done", 1800)?;
                prefix
            } else {
                let prefix = out.join(format!("direct-{r}"));
                let st = Command::new(&env.exe)
                    .args(client_args(&jobs, &prefix, None))
                    .status()?;
                if !st.success() {
                    bail!("the direct client failed ({st})");
                }
                prefix
            };
            for j in &jobs {
                let i = PATHS
                    .iter()
                    .position(|p| p.0 == j.name && (p.1 == "gateway") == gateway)
                    .context("path")?;
                samples[i].add(&prefix, &j.name)?;
            }
        }
        syncs.extend(fdatasync_floor(audit_dir, a.syncs / a.rounds)?);
    }
    Ok((samples, syncs))
}

/// Runs the bounds probe as an agent; its report lines.
pub(super) fn run_probe(env: &Env) -> Result<String> {
    let name = "probe".to_string();
    let prefix = env.home(&name).join("out");
    let args: Vec<String> = [
        "bench",
        "model-client",
        "--probe",
        "--jobs",
        "[]",
        "--out",
        &prefix.display().to_string(),
    ]
    .map(String::from)
    .to_vec();
    env.start_agent_with(&name, &args, &[], CONTRACT_EXTRA)?;
    env.wait_for(std::slice::from_ref(&name), "done", 120)?;
    Ok(std::fs::read_to_string(format!(
        "{}-probe.txt",
        prefix.display()
    ))?)
}

/// What every benchmark agent's contract adds: any model the host serves, no budgets.
pub(super) const CONTRACT_EXTRA: &str = "modelPolicy: { allow: ['*'] }\n";

fn client_args(jobs: &[Job], prefix: &Path, flood: Option<(&Path, u64)>) -> Vec<String> {
    let mut v: Vec<String> = [
        "bench",
        "model-client",
        "--jobs",
        &jobs_arg(jobs),
        "--out",
        &prefix.display().to_string(),
    ]
    .map(String::from)
    .to_vec();
    if let Some((d, phase)) = flood {
        v.extend([
            "--flood".into(),
            d.display().to_string(),
            "--phase".into(),
            phase.to_string(),
        ]);
    }
    v
}

/// One flood phase's figures.
pub(super) struct FloodPhase {
    pub ttft: Vec<u64>,
    pub total: Vec<u64>,
    pub per_client: Vec<u64>,
    pub chunks: u64,
    /// CPU ticks used in the phase: the daemon's threads, the bench process (the instant
    /// backend), the whole machine (busy, all CPUs).
    pub daemon: Vec<(String, u64)>,
    pub backend_ticks: u64,
    pub machine_busy: f64,
    pub load_after: String,
}

/// utime + stime of this process (all threads), in ticks.
fn self_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let Some(close) = stat.rfind(')') else {
        return 0;
    };
    let f: Vec<&str> = stat[close + 2..].split_whitespace().collect();
    f.get(11).and_then(|u| u.parse::<u64>().ok()).unwrap_or(0)
        + f.get(12).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0)
}

/// (busy, total) jiffies of all CPUs from /proc/stat.
fn machine_ticks() -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let v: Vec<u64> = s
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    (total - idle, total)
}

/// The flood: `--agents` direct clients (phase 0), then as many agents (phase 1), each streaming
/// from the instant backend in a loop.
pub(super) fn flood(a: &ModelsArgs, env: &Env, out: &Path, t: &Targets) -> Result<[FloodPhase; 2]> {
    let job = |gateway: bool| -> Job {
        Job {
            name: "flood".into(),
            target: if gateway {
                "agent".into()
            } else {
                format!("tcp:{}", t.instant)
            },
            model: if gateway {
                "instant"
            } else {
                "instant-upstream"
            }
            .into(),
            stream: true,
            max_tokens: a.chunks,
            calls: 0,
            warmup: 20,
        }
    };
    eprintln!(
        "bench models: flood: starting {} direct clients and {} agents…",
        a.agents, a.agents
    );
    // Killed (by PID) when dropped, should the bench fail before they finish.
    let mut direct = Procs(Vec::new());
    let mut direct_prefixes = Vec::new();
    for i in 0..a.agents {
        let prefix = out.join(format!("flood-direct-{i:03}"));
        direct.0.push(
            Command::new(&env.exe)
                .args(client_args(&[job(false)], &prefix, Some((&env.ctl_dir, 0))))
                .spawn()?,
        );
        direct_prefixes.push(prefix);
    }
    let names: Vec<String> = (0..a.agents).map(|i| format!("flood-{i:03}")).collect();
    for n in &names {
        let prefix = env.home(n).join("out");
        env.start_agent_with(
            n,
            &client_args(&[job(true)], &prefix, Some((&env.ctl_dir, 1))),
            &[],
            CONTRACT_EXTRA,
        )?;
    }
    env.wait_for(&names, "ready", 300)?;
    let deadline = Instant::now() + Duration::from_secs(120);
    for (p, c) in direct_prefixes.iter().zip(direct.0.iter_mut()) {
        while !PathBuf::from(format!("{}.ready", p.display())).exists() {
            if let Ok(Some(st)) = c.try_wait() {
                bail!("a direct flood client exited ({st}) before it was ready");
            }
            if Instant::now() > deadline {
                bail!("a direct flood client was not ready in 120 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let phase = a.flood_secs * 1_000_000_000;
    let gap = 1_000_000_000;
    let start = mono_ns() + 500_000_000;
    let go = env.ctl_dir.join("go");
    std::fs::write(go.with_extension("tmp"), format!("{start} {phase} {gap}\n"))?;
    std::fs::rename(go.with_extension("tmp"), &go)?;
    eprintln!(
        "bench models: flood: {} s direct, then {} s through the gateway…",
        a.flood_secs, a.flood_secs
    );
    let mut cpu = Vec::new();
    for i in 0..2u64 {
        let begin = start + i * (phase + gap);
        while mono_ns() < begin {
            std::thread::sleep(Duration::from_millis(1));
        }
        let (d0, b0, m0) = (env.daemon_threads(), self_ticks(), machine_ticks());
        while mono_ns() < begin + phase {
            std::thread::sleep(Duration::from_millis(5));
        }
        let (d1, b1, m1) = (env.daemon_threads(), self_ticks(), machine_ticks());
        let busy = (m1.0 - m0.0) as f64 / (m1.1 - m0.1).max(1) as f64;
        cpu.push((thread_delta(&d0, &d1), b1 - b0, busy, loadavg()));
    }
    for c in &mut direct.0 {
        let st = c.wait()?;
        if !st.success() {
            bail!("a direct flood client failed ({st})");
        }
    }
    env.wait_for(&names, "done", 120)?;
    let agent_prefixes: Vec<PathBuf> = names.iter().map(|n| env.home(n).join("out")).collect();
    let mut phases = Vec::new();
    for (prefixes, (daemon, backend_ticks, machine_busy, load_after)) in
        [direct_prefixes, agent_prefixes].iter().zip(cpu)
    {
        let mut p = FloodPhase {
            ttft: Vec::new(),
            total: Vec::new(),
            per_client: Vec::new(),
            chunks: 0,
            daemon,
            backend_ticks,
            machine_busy,
            load_after,
        };
        for pre in prefixes {
            let r = |w: &str| -> Result<Vec<u64>> {
                Ok(read_samples(&out_path(pre, "flood", w))?
                    .into_iter()
                    .map(u64::from)
                    .collect())
            };
            let ttft = r("ttft.bin")?;
            p.per_client.push(ttft.len() as u64);
            p.ttft.extend(ttft);
            p.total.extend(r("total.bin")?);
            let count = std::fs::read_to_string(out_path(pre, "flood", "count"))?;
            p.chunks += count
                .split_whitespace()
                .nth(1)
                .and_then(|c| c.parse::<u64>().ok())
                .context("count file")?;
        }
        phases.push(p);
    }
    let [d, g]: [FloodPhase; 2] = phases
        .try_into()
        .map_err(|_| anyhow::anyhow!("two phases"))?;
    Ok([d, g])
}
