//! `cargo xtask bench sandbox`: time from a start request to the agent's first instruction
//! inside its complete sandbox, side by side in one run with the floor (`clone3` into a fresh
//! cgroup, no sandbox), plain fork+exec and `bwrap`.
//!
//! The started program is the same tiny static binary in every mode (`stamp`, compiled here with
//! `cc -static`, or prebuilt: `AGENTOS_BENCH_STAMP`, xtask/src/stamp.rs): its `main` reads
//! `CLOCK_MONOTONIC` and prints it. The latency of one start is that stamp minus the clock read
//! just before the start request; every mode waits for its process to exit before the next start.
//! Modes are interleaved run by run, so drifting load on
//! the machine hits them alike.
//!
//! | mode | what one start does |
//! |---|---|
//! | `fork+exec` | `std::process::Command::spawn` (posix_spawn/fork + exec), no cgroup, no sandbox |
//! | `clone3+cgroup` | mkdir a fresh cgroup, `clone3(CLONE_INTO_CGROUP)` + exec via agentosd's `spawn` |
//! | `agentos` | what agentosd does for a start: mkdir a fresh cgroup, `sandbox::prepare` (uid from the table, state directory, the Landlock ruleset built ahead after the agent's previous start and checked, or built from the contract when none holds, seccomp compiled), `clone3` + setgroups/setresgid/capability drop/setresuid/no_new_privs/Landlock/seccomp in the child, exec; from a thread whose capability bounding set is empty, as the daemon's are (the clone3 modes each run a start on a thread of their own) |
//! | `agentos -pool` | `agentos` with the ruleset pool off (sandbox/ruleset_pool.rs): the ruleset built at every start |
//! | `agentos+net` | `agentos` with a `net.connect` grant: its own network namespace plus its socket broker (a second clone3 of the daemon into the agent's cgroup, sandbox/sockets.rs), timed to the agent's first instruction (the broker starts after the agent's exec) |
//! | `bwrap` | `bwrap --unshare-all --ro-bind / / --dev /dev --proc /proc --tmpfs /tmp --cap-drop ALL --new-session --die-with-parent` |
//! | `systemd-run (service)`, `systemd-run (bare service)`, `systemd-run --scope`, `agentosd (D-Bus)` | where systemd is PID 1 (the VM): see sandbox_peers.rs; elsewhere reported as unavailable, with the reason |
//!
//! The working directory (stamp, logs) is in /run, not /tmp: a transient service with
//! `PrivateTmp=` would not see /tmp's, and the contract's `fs.exec` grant of it is then a path
//! only root could make resolve elsewhere, as a program root installed (under /tmp, writable by
//! everyone, it is resolved afresh at every start and its ruleset never built ahead).
//! Every mode starts an agent of its own name (`agent`, `agent-net`, `agent-PART`), so that
//! each has its own ruleset built ahead, as the daemon keeps one per agent.

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use agentosd::cgroup::Cgroup;

use super::sandbox_peers::{self, DbusAgents};
use anyhow::{Context, Result, bail};
use clap::Args;
use serde_json::json;

#[derive(Args)]
pub struct SandboxArgs {
    /// Starts per mode.
    #[arg(long, default_value_t = 200)]
    pub runs: usize,
    /// Unmeasured starts per mode first.
    #[arg(long, default_value_t = 10)]
    pub warmup: usize,
    /// Leave out bwrap.
    #[arg(long)]
    pub no_bwrap: bool,
    /// Pause after each start (µs), so that what a start leaves to the kernel's workers (a
    /// namespace's teardown, the pool's refill, the cgroup's removal) is done before the next
    /// mode's start is timed instead of landing on it.
    #[arg(long, default_value_t = 200)]
    pub settle_us: u64,
    /// Leave out the systemd peers and agentosd over D-Bus (they run only where systemd is PID
    /// 1 and agentosd is installed: the VM; elsewhere they are reported as unavailable).
    #[arg(long)]
    pub no_systemd: bool,
    /// Where the agentosd answering on the bus (the system bus, or `$AGENTOS_BUS_ADDRESS`)
    /// keeps its agents' logs: `STATE_DIR/logs` (docs/daemon.md). With a private daemon on a
    /// private bus the `agentosd (D-Bus)` mode runs on a host without systemd too.
    #[arg(long, default_value = sandbox_peers::SYSTEM_LOG_DIR)]
    pub agentosd_log_dir: PathBuf,
    /// Also write the results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Also time where `agentos` spends its time over the floor: the parts of
    /// `sandbox::prepare` one by one, and starts with one part of the child's sandbox left out
    /// (sandbox_parts.rs).
    #[arg(long)]
    pub breakdown: bool,
}

pub(super) fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

pub(super) fn parse_stamp(text: &str) -> Result<u64> {
    text.lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .with_context(|| format!("no timestamp in {text:?}"))
}

fn wait_pid(pid: u32) -> Result<i32> {
    let mut status = 0;
    // SAFETY: waiting for our own child; `status` is writable.
    let r = unsafe { libc::waitpid(pid as libc::pid_t, &mut status, 0) };
    if r < 0 {
        return Err(std::io::Error::last_os_error()).context("waitpid");
    }
    Ok(status)
}

pub(super) struct Bench {
    dir: PathBuf,
    stamp: PathBuf,
    parent: Cgroup,
    pub(super) state: PathBuf,
    pub(super) contract: contracts::Contract,
    /// The same contract with a `net.connect` grant (the socket broker).
    net_contract: contracts::Contract,
    n: usize,
    /// Sandboxed starts, and those that found no network namespace made ahead (the pool
    /// empty: the namespace was made in `clone3`, ≈ 0.45 ms more).
    pub(super) sandboxed: usize,
    pub(super) pool_empty: usize,
    /// Start request → just before `clone3` (cgroup made, sandbox prepared), for
    /// `clone3+cgroup`, `agentos`, `agentos -all4`, `agentos -prepare` and `agentos -pool`: the
    /// rest of a start is the clone, the child's setup and the exec.
    pub(super) before_clone: [Vec<u64>; 5],
    /// `agentos -prepare`: the sandbox its first start prepared, used by every later one.
    prepared_once: Option<agentosd::sandbox::PreparedSandbox>,
    /// Per agent name: sandboxed starts, and those that took a ruleset built ahead.
    pub(super) pooled: std::collections::BTreeMap<String, (usize, usize)>,
}

impl Bench {
    fn log(&mut self) -> PathBuf {
        self.n += 1;
        self.dir.join(format!("log-{}", self.n))
    }

    fn read_log(&self, log: &Path) -> Result<u64> {
        let text = std::fs::read_to_string(log).with_context(|| format!("{}", log.display()))?;
        let _ = std::fs::remove_file(log);
        parse_stamp(&text)
    }

    fn fork_exec(&mut self) -> Result<u64> {
        let t0 = mono_ns();
        let mut child = Command::new(&self.stamp)
            .stdout(Stdio::piped())
            .spawn()
            .context("spawn stamp")?;
        let mut out = String::new();
        child
            .stdout
            .take()
            .context("stdout")?
            .read_to_string(&mut out)?;
        child.wait()?;
        Ok(parse_stamp(&out)?.saturating_sub(t0))
    }

    /// One start on a thread of its own, as the daemon starts agents from its blocking
    /// threads; with `empty_bset` that thread's capability bounding set is emptied first, as
    /// the daemon empties its own at start-up (agentosd/src/sandbox/bounding.rs), so the child
    /// inherits it empty and skips its drop loop. Outside the time measured.
    fn on_thread(
        &mut self,
        empty_bset: bool,
        f: impl FnOnce(&mut Self) -> Result<u64> + Send,
    ) -> Result<u64> {
        std::thread::scope(|s| {
            s.spawn(|| {
                if empty_bset {
                    agentosd::sandbox::bounding::empty_this_thread()
                        .context("emptying the start thread's bounding set")?;
                }
                f(self)
            })
            .join()
            .map_err(|_| anyhow::anyhow!("the start thread panicked"))?
        })
    }

    fn clone3(&mut self, sandboxed: bool) -> Result<u64> {
        self.clone3_with(sandboxed, false)
    }

    fn clone3_with(&mut self, sandboxed: bool, net: bool) -> Result<u64> {
        self.clone3_without(sandboxed, net, None)
    }

    /// A start with `without` (a part of the child's sandbox, [`super::sandbox_parts::strip`])
    /// left out after `prepare`.
    pub(super) fn clone3_without(
        &mut self,
        sandboxed: bool,
        net: bool,
        without: Option<&str>,
    ) -> Result<u64> {
        let log = self.log();
        let cg = self.parent.child(&format!("run-{}", self.n));
        let t0 = mono_ns();
        cg.create()?;
        let mut kept = Vec::new();
        // `agentos -prepare`: the sandbox prepared once (at the first start) and reused.
        let once = without == Some("prepare");
        let sandbox = if sandboxed && once && self.prepared_once.is_some() {
            self.prepared_once.take()
        } else if sandboxed {
            // `agentos -pathcache`: every host path resolved afresh, as before the cache.
            let cache = agentosd::sandbox::path_cache::PathCache::global();
            let off = |part: &str| without.is_some_and(|w| w.split('+').any(|p| p == part));
            cache.set_enabled(!off("pathcache"));
            // `agentos -pathwatch`: every kept path's walk checked by `lstat`.
            agentosd::sandbox::path_watch::PathWatch::global().set_enabled(!off("pathwatch"));
            // `agentos -pool`: the ruleset built at every start, as before the pool.
            agentosd::sandbox::ruleset_pool::RulesetPool::global()
                .set_enabled(!off("pool") && !off("pathcache"));
            let name = match (net, without) {
                (true, _) => "agent-net".to_string(),
                (false, None) => "agent".to_string(),
                (false, Some(w)) => format!("agent-{}", w.replace('+', "-")),
            };
            let mut sb = agentosd::sandbox::prepare(
                &self.state,
                "bench",
                &name,
                Some(if net {
                    &self.net_contract
                } else {
                    &self.contract
                }),
            )?;
            self.sandboxed += 1;
            let n = self.pooled.entry(name).or_default();
            n.0 += 1;
            n.1 += usize::from(sb.landlock_pooled);
            if sb.namespaces.net && sb.netns.is_none() {
                self.pool_empty += 1;
            }
            if let Some(part) = without.filter(|_| !once) {
                kept = super::sandbox_parts::strip(&mut sb, part);
            }
            Some(sb)
        } else {
            None
        };
        let fd = cg.open_dir()?;
        // Up to the clone: the cgroup (and the sandbox's preparation), by mode.
        let before_clone = mono_ns().saturating_sub(t0);
        let mut cmd = agentosd::spawn::Command {
            program: self.stamp.clone(),
            args: vec![],
            env: vec![],
            cwd: PathBuf::from("/"),
            log_file: log.clone(),
            err_file: None,
            sandbox,
            sched: Default::default(),
            inherit_fd: None,
        };
        let child = agentosd::spawn::spawn(&cmd, &fd)?;
        if once {
            self.prepared_once = cmd.sandbox.take();
        }
        let status = wait_pid(child.pid)?;
        if let Some(b) = &child.broker {
            // It ends once the agent is reaped.
            wait_pid(b.pid)?;
        }
        let t = self.read_log(&log);
        cg.remove()?;
        if status != 0 {
            bail!("stamp exited with status {status:#x}");
        }
        let key = match (sandboxed, net, without) {
            (false, _, _) => Some(0),
            (true, false, None) => Some(1),
            (true, false, Some("all4")) => Some(2),
            (true, false, Some("prepare")) => Some(3),
            (true, false, Some("pool")) => Some(4),
            _ => None,
        };
        if let Some(k) = key {
            self.before_clone[k].push(before_clone);
        }
        drop(kept);
        Ok(t?.saturating_sub(t0))
    }

    fn bwrap(&mut self) -> Result<u64> {
        let dir = self.dir.display().to_string();
        let t0 = mono_ns();
        let out = Command::new("bwrap")
            .args([
                "--unshare-all",
                "--die-with-parent",
                "--new-session",
                "--cap-drop",
                "ALL",
                "--ro-bind",
                "/",
                "/",
                "--dev",
                "/dev",
                "--proc",
                "/proc",
                "--tmpfs",
                "/tmp",
                "--ro-bind",
                &dir,
                &dir,
            ])
            .arg(&self.stamp)
            .stderr(Stdio::inherit())
            .output()
            .context("running bwrap")?;
        if !out.status.success() {
            bail!("bwrap failed: {}", out.status);
        }
        Ok(parse_stamp(&String::from_utf8_lossy(&out.stdout))?.saturating_sub(t0))
    }
}

fn ensure_bwrap() -> Result<()> {
    if Command::new("bwrap").arg("--version").output().is_ok() {
        return Ok(());
    }
    eprintln!("bench: installing bubblewrap (apt-get)");
    let ok = Command::new("apt-get")
        .args(["install", "-y", "-qq", "bubblewrap"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        bail!("bwrap is missing and `apt-get install bubblewrap` failed; use --no-bwrap");
    }
    Ok(())
}

pub(super) fn pct(sorted: &[u64], p: usize) -> u64 {
    sorted[((sorted.len() - 1) * p / 100).min(sorted.len() - 1)]
}

fn ms(ns: u64) -> String {
    format!("{:.3}", ns as f64 / 1e6)
}

/// A mode of one run: its name, and why it cannot run here (then it is reported, not timed).
struct Mode {
    name: &'static str,
    unavailable: Option<String>,
}

fn modes(a: &SandboxArgs, dbus: &Result<DbusAgents>) -> Vec<Mode> {
    let on = |name| Mode {
        name,
        unavailable: None,
    };
    let mut v = vec![
        on("fork+exec"),
        on("clone3+cgroup"),
        on("agentos"),
        on("agentos -pool"),
        on("agentos+net"),
    ];
    if a.breakdown {
        v.extend(super::sandbox_parts::MODES.into_iter().map(on));
    }
    v.push(Mode {
        name: "bwrap",
        unavailable: a.no_bwrap.then(|| "left out (--no-bwrap)".to_string()),
    });
    let systemd = if a.no_systemd {
        Some("left out (--no-systemd)".to_string())
    } else {
        sandbox_peers::systemd_unavailable()
    };
    for name in [
        "systemd-run (service)",
        "systemd-run (bare service)",
        "systemd-run --scope",
    ] {
        v.push(Mode {
            name,
            unavailable: systemd.clone(),
        });
    }
    v.push(Mode {
        name: "agentosd (D-Bus)",
        unavailable: if a.no_systemd {
            Some("left out (--no-systemd)".to_string())
        } else {
            dbus.as_ref().err().map(|e| format!("{e:#}"))
        },
    });
    v
}

/// The contract of the `agentos` modes (and of `agentosd (D-Bus)`, under `name`).
fn contract_yaml(name: &str, dir: &Path, stamp: &Path) -> String {
    format!(
        "apiVersion: agentos/v0.2\nkind: AgentContract\nname: {name}\ntenant: bench\n\
         exec: {{ command: {stamp:?} }}\ncapabilities:\n  - fs.exec: [{}]\n  - fs.read: [/srv]\n",
        dir.display(),
        stamp = stamp.display().to_string()
    )
}

pub fn run(a: SandboxArgs) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("bench sandbox needs root (cgroups, uid switch)");
    }
    if !a.no_bwrap {
        ensure_bwrap()?;
    }
    let mount = agentosd::cgroup::cgroup2_mount().context("no cgroup2 mount")?;
    // A transient service gets a private /tmp (PrivateTmp=, implied by DynamicUser=): with
    // systemd the stamp lives in /run, which it sees read-only.
    let base = if Path::new("/run").is_dir() {
        PathBuf::from("/run")
    } else {
        std::env::temp_dir()
    };
    let dir = base.join(format!("agentos-bench-sandbox-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
    let result = run_in(&a, &mount, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn run_in(a: &SandboxArgs, mount: &Path, dir: &Path) -> Result<()> {
    // A prebuilt stamp (`cargo xtask vm bench`: the guest has no compiler) is copied in, so
    // every mode runs it from the same directory the contract grants.
    let stamp = match std::env::var_os(crate::stamp::STAMP_ENV).filter(|v| !v.is_empty()) {
        Some(pre) => {
            let stamp = dir.join("stamp");
            std::fs::copy(&pre, &stamp).with_context(|| {
                format!(
                    "copying the prebuilt stamp {} (${})",
                    Path::new(&pre).display(),
                    crate::stamp::STAMP_ENV
                )
            })?;
            std::fs::set_permissions(&stamp, std::fs::Permissions::from_mode(0o755))?;
            stamp
        }
        None => crate::stamp::compile(dir)?,
    };
    let contract_text = contract_yaml("agent", dir, &stamp);
    let contract = contracts::parse_contract(&contract_text, "bench.yaml")
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let net_contract = contracts::parse_contract(
        &format!("{contract_text}  - net.connect: [\"127.0.0.1:9\"]\n"),
        "bench-net.yaml",
    )
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut dbus = if a.no_systemd {
        Err(anyhow::anyhow!("left out"))
    } else {
        let (d, s) = (dir.to_path_buf(), stamp.clone());
        DbusAgents::connect(
            &a.agentosd_log_dir,
            Box::new(move |name| contract_yaml(name, &d, &s)),
        )
    };
    let modes = modes(a, &dbus);
    let parent = Cgroup::new(mount.join(format!("agentos-bench-{}", std::process::id())));
    parent.create()?;
    let mut b = Bench {
        dir: dir.to_path_buf(),
        stamp,
        parent,
        state: dir.join("state"),
        contract,
        net_contract,
        n: 0,
        sandboxed: 0,
        pool_empty: 0,
        before_clone: Default::default(),
        prepared_once: None,
        pooled: Default::default(),
    };
    let load_before = loadavg();
    let mut samples: Vec<Vec<u64>> = vec![Vec::with_capacity(a.runs); modes.len()];
    let result = (|| -> Result<()> {
        for i in 0..a.warmup + a.runs {
            for (m, mode) in modes.iter().enumerate() {
                if mode.unavailable.is_some() {
                    continue;
                }
                let t = match mode.name {
                    "fork+exec" => b.fork_exec(),
                    "clone3+cgroup" => b.on_thread(false, |b| b.clone3(false)),
                    "agentos" => b.on_thread(true, |b| b.clone3(true)),
                    "agentos+net" => b.on_thread(true, |b| b.clone3_with(true, true)),
                    "bwrap" => b.bwrap(),
                    "systemd-run (service)" => sandbox_peers::systemd_service(&b.stamp, true),
                    "systemd-run (bare service)" => sandbox_peers::systemd_service(&b.stamp, false),
                    "systemd-run --scope" => sandbox_peers::systemd_scope(&b.stamp),
                    "agentosd (D-Bus)" => match &mut dbus {
                        Ok(d) => d.start(),
                        Err(_) => unreachable!("an unavailable mode is not run"),
                    },
                    m => {
                        let part = super::sandbox_parts::part_of(m);
                        b.on_thread(part != Some("emptybset"), |b| {
                            b.clone3_without(true, false, part)
                        })
                    }
                }
                .with_context(|| format!("mode {}, run {i}", mode.name))?;
                if i >= a.warmup {
                    samples[m].push(t);
                }
                if a.settle_us > 200 {
                    std::thread::sleep(Duration::from_micros(a.settle_us));
                }
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        Ok(())
    })();
    let parts = if a.breakdown && result.is_ok() {
        Some(super::sandbox_parts::time_prepare(&b, a.runs))
    } else {
        None
    };
    let _ = b.parent.remove();
    result?;
    report(a, &modes, &samples, &load_before)?;
    println!(
        "\nsandboxed starts that found no network namespace made ahead (made in clone3): {} of {}",
        b.pool_empty, b.sandboxed
    );
    println!("starts that took a Landlock ruleset built ahead, per agent (mode):");
    for (name, (n, pooled)) in &b.pooled {
        println!("  {name}: {pooled} of {n}");
    }
    println!(
        "ruleset pool: {:?}",
        agentosd::sandbox::ruleset_pool::RulesetPool::global().stats()
    );
    println!(
        "path watch: {:?}",
        agentosd::sandbox::path_watch::PathWatch::global().stats()
    );
    if a.breakdown {
        let names: Vec<&str> = modes.iter().map(|m| m.name).collect();
        super::sandbox_parts::print_split(&b.before_clone, &samples, &names);
    }
    if let Some(parts) = parts {
        super::sandbox_parts::print(&parts?);
    }
    Ok(())
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn p50(samples: &[u64]) -> u64 {
    let mut v = samples.to_vec();
    v.sort_unstable();
    if v.is_empty() { 0 } else { pct(&v, 50) }
}

fn report(a: &SandboxArgs, modes: &[Mode], samples: &[Vec<u64>], load_before: &str) -> Result<()> {
    let floor = p50(&samples[1]);
    println!(
        "\nstart request → first instruction of a static binary, {} starts per mode (interleaved), \
         after {} warm-up starts; load average before {load_before}, after {}\n",
        a.runs,
        a.warmup,
        loadavg()
    );
    println!("| mode | p50 ms | p90 ms | p99 ms | max ms | mean ms | p50 ÷ clone3+cgroup p50 |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let mut rows = Vec::new();
    for (m, mode) in modes.iter().enumerate() {
        if let Some(why) = &mode.unavailable {
            println!("| {} | unavailable: {why} | | | | | |", mode.name);
            rows.push(json!({"mode": mode.name, "unavailable": why}));
            continue;
        }
        let mut v = samples[m].clone();
        v.sort_unstable();
        let mean = v.iter().sum::<u64>() / v.len().max(1) as u64;
        let (p50, p90, p99, max) = (
            pct(&v, 50),
            pct(&v, 90),
            pct(&v, 99),
            *v.last().unwrap_or(&0),
        );
        println!(
            "| {} | {} | {} | {} | {} | {} | {:.2}× |",
            mode.name,
            ms(p50),
            ms(p90),
            ms(p99),
            ms(max),
            ms(mean),
            p50 as f64 / floor.max(1) as f64
        );
        rows.push(json!({"mode": mode.name, "p50_ns": p50, "p90_ns": p90, "p99_ns": p99, "max_ns": max, "mean_ns": mean}));
    }
    let p50_of = |name: &str| {
        modes
            .iter()
            .position(|m| m.name == name && m.unavailable.is_none())
            .map(|i| p50(&samples[i]))
    };
    let mut ratios = Vec::new();
    println!();
    for (peer, base) in [
        ("bwrap", "agentos"),
        ("systemd-run (service)", "agentos"),
        ("systemd-run (bare service)", "agentos"),
        ("systemd-run --scope", "agentos"),
        ("agentosd (D-Bus)", "agentos"),
        ("systemd-run (service)", "agentosd (D-Bus)"),
        ("systemd-run (bare service)", "agentosd (D-Bus)"),
        ("systemd-run --scope", "agentosd (D-Bus)"),
    ] {
        match (p50_of(peer), p50_of(base)) {
            (Some(p), Some(q)) => {
                let r = p as f64 / q.max(1) as f64;
                println!("{peer} p50 ÷ {base} p50 = {r:.2}×");
                ratios.push(json!({"peer": peer, "base": base, "p50_ratio": r}));
            }
            _ => println!("{peer} p50 ÷ {base} p50: unavailable (a mode did not run)"),
        }
    }
    if let Some(p) = &a.json {
        std::fs::write(
            p,
            serde_json::to_vec_pretty(&json!({
                "runs": a.runs, "warmup": a.warmup, "modes": rows, "ratios": ratios,
                "load_before": load_before, "load_after": loadavg(),
                "systemd_service_properties": sandbox_peers::SERVICE_PROPS,
                "systemd_scope_properties": sandbox_peers::SCOPE_PROPS,
            }))?,
        )?;
    }
    Ok(())
}
