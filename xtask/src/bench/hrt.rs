//! `cargo xtask bench hrt`: a periodic loop (10 ms period, ~2 ms of CPU work per period) run
//! as an HRT agent — started the way agentosd starts one: admission, a fresh cgroup,
//! `clone3(CLONE_INTO_CGROUP)`, `SCHED_DEADLINE` set in the child before execve, then the
//! agent's complete sandbox (own uid, no capabilities, Landlock, seccomp) — and side by side as
//! a plain nice-0 process, while DT
//! burners (SCHED_IDLE busy loops, one per CPU) load every CPU; then the kernel's floor in the
//! same run and under the same load: `cyclicdeadline` and `cyclictest` (Debian's rt-tests).
//!
//! A miss is a period whose work finished after its deadline (activation + deadline).
//! Lateness is wake-up time minus activation time (activation jitter).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use agentosd::cgroup::Cgroup;
use anyhow::{Context, Result, bail};
use clap::Args;
use serde_json::{Value, json};

#[derive(Args)]
pub struct HrtArgs {
    /// Seconds per phase (loops side by side, cyclicdeadline, cyclictest): three phases.
    #[arg(long, default_value_t = 60)]
    pub secs: u64,
    /// Period of the loop (µs).
    #[arg(long, default_value_t = 10_000)]
    pub period_us: u64,
    /// CPU work per period (µs of thread CPU time).
    #[arg(long, default_value_t = 2_000)]
    pub work_us: u64,
    /// SCHED_DEADLINE runtime reserved per period (µs).
    #[arg(long, default_value_t = 3_000)]
    pub runtime_us: u64,
    /// Leave out the DT burners (idle machine).
    #[arg(long)]
    pub no_load: bool,
    /// Burners as nice-0 processes instead of SCHED_IDLE (DT agents): ordinary contention, where
    /// the nice-0 loop has to share the CPUs.
    #[arg(long)]
    pub normal_load: bool,
    /// Also write the results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// One phase instead of three: the HRT agent, the nice-0 loop, cyclicdeadline and
    /// cyclictest all at the same time under the same load, so a stall of the machine hits
    /// them alike (like for like; they share the CPUs, which a deadline admission of 0.3 + the
    /// floors' near-zero work leaves room for).
    #[arg(long)]
    pub together: bool,
}

#[derive(Args)]
pub struct LoopArgs {
    /// `agent` (started by `bench hrt` as an HRT agent: SCHED_DEADLINE already set) or
    /// `normal`.
    #[arg(long)]
    pub mode: String,
    #[arg(long)]
    pub secs: u64,
    #[arg(long)]
    pub period_us: u64,
    #[arg(long)]
    pub work_us: u64,
    #[arg(long)]
    pub runtime_us: u64,
    /// Where to write the JSON result.
    #[arg(long)]
    pub out: PathBuf,
}

fn now(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn sleep_until(t: u64) {
    let ts = libc::timespec {
        tv_sec: (t / 1_000_000_000) as libc::time_t,
        tv_nsec: (t % 1_000_000_000) as libc::c_long,
    };
    loop {
        // SAFETY: `ts` is a valid timespec; the remaining-time pointer may be null with
        // TIMER_ABSTIME.
        let r = unsafe {
            libc::clock_nanosleep(
                libc::CLOCK_MONOTONIC,
                libc::TIMER_ABSTIME,
                &ts,
                std::ptr::null_mut(),
            )
        };
        if r != libc::EINTR {
            return;
        }
    }
}

fn percentile(sorted: &[u64], pct: usize) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) * pct / 100).min(sorted.len() - 1)]
}

/// The measured loop (runs in its own process).
pub fn rtloop(a: LoopArgs) -> Result<()> {
    // SAFETY: mlockall has no memory-safety preconditions.
    unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE) };
    let period = a.period_us * 1000;
    let work = a.work_us * 1000;
    if a.mode == "agent" {
        // The spawn path set the class before execve: check it is really there.
        let attr = agentosd::sched::get_attr(0).context("sched_getattr")?;
        if attr.sched_policy != agentosd::sched::SCHED_DEADLINE
            || attr.sched_runtime != a.runtime_us * 1000
        {
            bail!("the agent does not run SCHED_DEADLINE: {attr:?}");
        }
    }
    let n = a.secs * 1_000_000_000 / period;
    let mut lateness = Vec::with_capacity(n as usize);
    let mut misses = 0u64;
    let mut skipped = 0u64;
    let mut next = now(libc::CLOCK_MONOTONIC) + period;
    let mut k = 0;
    while k < n {
        sleep_until(next);
        let woke = now(libc::CLOCK_MONOTONIC);
        lateness.push(woke.saturating_sub(next));
        let cpu0 = now(libc::CLOCK_THREAD_CPUTIME_ID);
        while now(libc::CLOCK_THREAD_CPUTIME_ID) - cpu0 < work {}
        let done = now(libc::CLOCK_MONOTONIC);
        if done > next + period {
            misses += 1;
        }
        next += period;
        k += 1;
        // Activations that passed while we were still working are missed too.
        while done > next + period && k < n {
            misses += 1;
            skipped += 1;
            next += period;
            k += 1;
        }
    }
    lateness.sort_unstable();
    let r = json!({
        "mode": a.mode,
        "periods": n,
        "misses": misses,
        "skipped": skipped,
        "lateness_p50_us": percentile(&lateness, 50) as f64 / 1000.0,
        "lateness_p99_us": percentile(&lateness, 99) as f64 / 1000.0,
        "lateness_max_us": lateness.last().copied().unwrap_or(0) as f64 / 1000.0,
    });
    std::fs::write(&a.out, serde_json::to_vec(&r)?)?;
    Ok(())
}

/// A busy loop for `secs`: SCHED_IDLE (a DT agent's worst case) unless `normal`.
pub fn burn(secs: u64, normal: bool) -> Result<()> {
    let p = libc::sched_param { sched_priority: 0 };
    // SAFETY: `p` is a valid sched_param; this changes only the calling thread.
    if !normal && unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &p) } != 0 {
        bail!(
            "sched_setscheduler(SCHED_IDLE): {}",
            std::io::Error::last_os_error()
        );
    }
    let end = Instant::now() + Duration::from_secs(secs);
    let mut x = 0u64;
    while Instant::now() < end {
        for i in 0..100_000u64 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
    }
    Ok(())
}

/// Children of this benchmark, killed by PID when dropped.
struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn burners(n: usize, secs: u64, normal: bool) -> Result<Procs> {
    let exe = std::env::current_exe()?;
    let mut v = Vec::new();
    for _ in 0..n {
        v.push(
            Command::new(&exe)
                .args(["bench", "burn", "--secs", &secs.to_string()])
                .args(normal.then_some("--normal"))
                .spawn()
                .context("start a DT burner")?,
        );
    }
    // Let them reach the CPUs.
    std::thread::sleep(Duration::from_millis(300));
    Ok(Procs(v))
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn need(tool: &str) -> Result<()> {
    let ok = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok {
        bail!("{tool} not found: apt-get install -y rt-tests");
    }
    Ok(())
}

fn loop_args(a: &HrtArgs, mode: &str, out: &Path) -> Vec<String> {
    [
        "bench",
        "rt-loop",
        "--mode",
        mode,
        "--secs",
        &a.secs.to_string(),
        "--period-us",
        &a.period_us.to_string(),
        "--work-us",
        &a.work_us.to_string(),
        "--runtime-us",
        &a.runtime_us.to_string(),
        "--out",
        &out.display().to_string(),
    ]
    .map(String::from)
    .to_vec()
}

/// Start the loop as an HRT agent: what agentosd's supervisor does for a start, with its own
/// code (admission, fresh cgroup, sandbox from a contract, spawn with SCHED_DEADLINE).
/// Starts the loop as an HRT agent: its log and state in `dir` (root's, as the daemon's are),
/// its program and result in `work` (granted to it).
fn start_agent(a: &HrtArgs, dir: &Path, work: &Path, exe: &Path) -> Result<(Cgroup, u32)> {
    let d = agentosd::sched::Deadline {
        runtime_ns: a.runtime_us * 1000,
        deadline_ns: a.period_us * 1000,
        period_ns: a.period_us * 1000,
    };
    let cpu = agentosd::sched::Admission::default()
        .admit("bench/hrt-loop", &d, &[])
        .map_err(|e| anyhow::anyhow!(e))?;
    let text = format!(
        "apiVersion: agentos/v0.2\nkind: AgentContract\nname: hrt-loop\ntenant: bench\n\
         class: {{ latency: HRT, slo: {{ runtime_ms: {r}, deadline_ms: {p}, period_ms: {p} }} }}\n\
         exec: {{ command: {exe:?} }}\ncapabilities:\n  - fs.exec: [{dir}]\n  - fs.write: [{dir}]\n",
        r = a.runtime_us as f64 / 1000.0,
        p = a.period_us as f64 / 1000.0,
        exe = exe.display().to_string(),
        dir = work.display()
    );
    let contract =
        contracts::parse_contract(&text, "hrt-loop.yaml").map_err(|e| anyhow::anyhow!("{e}"))?;
    let mount = agentosd::cgroup::cgroup2_mount().context("no cgroup2 mount")?;
    let cg = Cgroup::new(mount.join(format!("agentos-bench-hrt-{}", std::process::id())));
    cg.create()?;
    let sandbox =
        agentosd::sandbox::prepare(&dir.join("state"), "bench", "hrt-loop", Some(&contract))?;
    let cmd = agentosd::spawn::Command {
        program: exe.to_path_buf(),
        args: loop_args(a, "agent", &work.join("agent.json")),
        env: sandbox.env(),
        cwd: PathBuf::from("/"),
        log_file: dir.join("agent.log"),
        err_file: None,
        sandbox: Some(sandbox),
        sched: agentosd::sched::ChildSched::Deadline(agentosd::sched::SchedAttr::deadline(&d)),
        inherit_fd: None,
    };
    let child = agentosd::spawn::spawn(&cmd, &cg.open_dir()?)?;
    eprintln!(
        "bench hrt: HRT agent pid {} in {} (admitted on CPU {cpu}, sandboxed)",
        child.pid,
        cg.path().display()
    );
    Ok((cg, child.pid))
}

fn run_loops(a: &HrtArgs, dir: &Path) -> Result<(Value, Value)> {
    // The agent runs as its own uid: it needs to execute a copy of this binary and write its
    // result into `work` (granted in its contract); its log stays in root's `dir` (the daemon
    // opens no log in a directory others may write).
    let work = dir.join("work");
    std::fs::create_dir_all(&work)?;
    let exe = work.join("xtask");
    std::fs::copy(std::env::current_exe()?, &exe)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    std::fs::set_permissions(&work, std::fs::Permissions::from_mode(0o777))?;
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755))?;
    let (cg, pid) = start_agent(a, dir, &work, &exe)?;
    let mut normal = Command::new(&exe)
        .args(loop_args(a, "normal", &work.join("normal.json")))
        .spawn()?;
    let mut status = 0;
    // SAFETY: waiting for the agent we started; `status` is writable.
    unsafe { libc::waitpid(pid as libc::pid_t, &mut status, 0) };
    let st = normal.wait()?;
    let _ = cg.remove();
    if status != 0 {
        bail!(
            "HRT agent failed (wait status {status:#x}); its log:\n{}",
            std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default()
        );
    }
    if !st.success() {
        bail!("nice-0 loop failed ({st})");
    }
    let read = |m: &str| -> Result<Value> {
        Ok(serde_json::from_slice(&std::fs::read(
            work.join(format!("{m}.json")),
        )?)?)
    };
    Ok((read("agent")?, read("normal")?))
}

fn cyclicdeadline(a: &HrtArgs, dir: &Path) -> Result<Value> {
    let out = dir.join("cyclicdeadline.json");
    let st = Command::new("cyclicdeadline")
        .args(["-q", "-t", "1", "-i", &a.period_us.to_string()])
        .args(["-D", &a.secs.to_string()])
        .arg(format!("--json={}", out.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()?;
    if !st.status.success() {
        // cyclicdeadline aborts when one of its own periods overruns its runtime ("Failed to
        // perform task within runtime: Missed by N us"): the kernel's floor itself missed, a
        // measurement of the machine, reported as such instead of failing the whole bench.
        let why = String::from_utf8_lossy(&st.stderr).trim().to_string();
        eprintln!("bench hrt: cyclicdeadline aborted ({}): {why}", st.status);
        return Ok(json!({
            "cycles": "aborted", "min_us": "-", "avg_us": "-", "max_us": "-",
            "aborted": if why.is_empty() { st.status.to_string() } else { why },
        }));
    }
    let v: Value = serde_json::from_slice(&std::fs::read(&out)?)?;
    let t = &v["thread"]["0"];
    Ok(json!({
        "cycles": t["cycles"], "min_us": t["min"], "avg_us": t["avg"], "max_us": t["max"],
    }))
}

/// cyclictest at the loop's period (SCHED_FIFO 80, one thread), with a 1 µs histogram: a
/// wake-up later than period - work would have missed the loop's deadline.
fn cyclictest(a: &HrtArgs) -> Result<Value> {
    let out = Command::new("cyclictest")
        .args(["-q", "-m", "-p", "80", "-t", "1", "-h", "20000"])
        .args(["-i", &a.period_us.to_string()])
        .args(["-D", &a.secs.to_string()])
        .output()?;
    if !out.status.success() {
        bail!("cyclictest failed ({})", out.status);
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut hist = Vec::new();
    let mut overflows = 0u64;
    let mut max = 0u64;
    for l in text.lines() {
        if let Some(v) = l.strip_prefix("# Histogram Overflows:") {
            overflows = v.trim().parse().unwrap_or(0);
        } else if let Some(v) = l.strip_prefix("# Max Latencies:") {
            max = v.trim().parse().unwrap_or(0);
        } else if !l.starts_with('#') {
            let mut it = l.split_whitespace();
            if let (Some(b), Some(c)) = (it.next(), it.next())
                && let (Ok(b), Ok(c)) = (b.parse::<u64>(), c.parse::<u64>())
            {
                hist.push((b, c));
            }
        }
    }
    let total: u64 = hist.iter().map(|h| h.1).sum::<u64>() + overflows;
    let pct = |p: u64| {
        let want = (total * p).div_ceil(100);
        let mut acc = 0;
        for (b, c) in &hist {
            acc += c;
            if acc >= want {
                return *b;
            }
        }
        max
    };
    let slack = a.period_us - a.work_us;
    let late: u64 = hist
        .iter()
        .filter(|h| h.0 > slack)
        .map(|h| h.1)
        .sum::<u64>()
        + overflows;
    Ok(json!({
        "cycles": total, "p50_us": pct(50), "p99_us": pct(99), "max_us": max,
        "would_miss": late,
    }))
}

pub fn run(a: HrtArgs) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("bench hrt needs root (SCHED_DEADLINE, SCHED_FIFO, mlockall)");
    }
    need("cyclicdeadline")?;
    need("cyclictest")?;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let dir = tempfile_dir()?;
    let load_before = loadavg();
    let phase = |name: &str| eprintln!("bench hrt: {name} ({} s)…", a.secs);
    let load = || -> Result<Procs> {
        if a.no_load {
            Ok(Procs(Vec::new()))
        } else {
            burners(cpus, a.secs + 10, a.normal_load)
        }
    };

    let (dl, normal, cd, ct) = if a.together {
        phase("HRT loop, nice-0 loop, cyclicdeadline and cyclictest at the same time");
        let b = load()?;
        let (loops, cd, ct) = std::thread::scope(|s| {
            let cd = s.spawn(|| cyclicdeadline(&a, &dir));
            let ct = s.spawn(|| cyclictest(&a));
            let loops = run_loops(&a, &dir);
            let join = |h: std::thread::ScopedJoinHandle<'_, Result<Value>>| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a floor's thread panicked")))
            };
            (loops, join(cd), join(ct))
        });
        drop(b);
        let (dl, normal) = loops?;
        (dl, normal, cd?, ct?)
    } else {
        phase("HRT loop (SCHED_DEADLINE) and nice-0 loop side by side");
        let b = load()?;
        let (dl, normal) = run_loops(&a, &dir)?;
        drop(b);
        phase("cyclicdeadline");
        let b = load()?;
        let cd = cyclicdeadline(&a, &dir)?;
        drop(b);
        phase("cyclictest");
        let b = load()?;
        let ct = cyclictest(&a)?;
        drop(b);
        (dl, normal, cd, ct)
    };
    let load_after = loadavg();
    let _ = std::fs::remove_dir_all(&dir);

    let load_text = if a.no_load {
        "none".to_string()
    } else if a.normal_load {
        format!("{cpus} nice-0 burners (busy loops)")
    } else {
        format!("{cpus} DT burners (SCHED_IDLE busy loops)")
    };
    println!(
        "HRT benchmark: period {} µs, work {} µs, SCHED_DEADLINE runtime {} µs, {} s per phase{}, load: {load_text}",
        a.period_us,
        a.work_us,
        a.runtime_us,
        a.secs,
        if a.together {
            " (one phase: all four at the same time)"
        } else {
            ""
        }
    );
    println!("loadavg before: {load_before}; after: {load_after}\n");
    println!("| run | periods | deadline misses | lateness p50 µs | p99 µs | max µs |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (name, v) in [
        ("HRT agent (SCHED_DEADLINE)", &dl),
        ("same loop, nice 0", &normal),
    ] {
        println!(
            "| {name} | {} | {} | {:.0} | {:.0} | {:.0} |",
            v["periods"],
            v["misses"],
            v["lateness_p50_us"].as_f64().unwrap_or(0.0),
            v["lateness_p99_us"].as_f64().unwrap_or(0.0),
            v["lateness_max_us"].as_f64().unwrap_or(0.0)
        );
    }
    println!(
        "| floor: cyclictest (SCHED_FIFO 80) | {} | {} (wake-ups > {} µs late) | {} | {} | {} |",
        ct["cycles"],
        ct["would_miss"],
        a.period_us - a.work_us,
        ct["p50_us"],
        ct["p99_us"],
        ct["max_us"]
    );
    println!(
        "| floor: cyclicdeadline (its latency: min / avg / max) | {} | n/a | avg {} | — | {} |",
        cd["cycles"], cd["avg_us"], cd["max_us"]
    );
    if let Some(why) = cd.get("aborted") {
        println!("(cyclicdeadline aborted: {why}: the kernel's own floor missed on this machine)");
    }
    if let Some(p) = &a.json {
        std::fs::write(
            p,
            serde_json::to_vec_pretty(&json!({
                "hrt": dl, "nice0": normal, "cyclictest": ct, "cyclicdeadline": cd,
                "loadavg_before": load_before, "loadavg_after": load_after,
                "secs": a.secs, "period_us": a.period_us, "work_us": a.work_us,
                "runtime_us": a.runtime_us, "load": load_text, "together": a.together,
            }))?,
        )?;
    }
    Ok(())
}

fn tempfile_dir() -> Result<PathBuf> {
    let d = std::env::temp_dir().join(format!("agentos-bench-hrt-{}", std::process::id()));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}
