//! `cargo xtask bench sandbox`: time from a start request to the agent's first instruction
//! inside its complete sandbox, side by side in one run with the floor (`clone3` into a fresh
//! cgroup, no sandbox), plain fork+exec and `bwrap`.
//!
//! The started program is the same tiny static binary in every mode (`stamp`, compiled here with
//! `cc -static`, or prebuilt: `AGENTOS_BENCH_STAMP`, xtask/src/stamp.rs): its `main` reads
//! `CLOCK_MONOTONIC` and prints it. The latency of one start is that stamp minus the clock read
//! just before the start request; every mode waits for its process to exit before the next start. Modes are interleaved run by run, so drifting load on
//! the machine hits them alike.
//!
//! | mode | what one start does |
//! |---|---|
//! | `fork+exec` | `std::process::Command::spawn` (posix_spawn/fork + exec), no cgroup, no sandbox |
//! | `clone3+cgroup` | mkdir a fresh cgroup, `clone3(CLONE_INTO_CGROUP)` + exec via agentosd's `spawn` |
//! | `agentos` | what agentosd does for a start: mkdir a fresh cgroup, `sandbox::prepare` (uid from the table, state directory, Landlock ruleset built from the contract, seccomp compiled), `clone3` + setgroups/setresgid/capability drop/setresuid/no_new_privs/Landlock/seccomp in the child, exec |
//! | `agentos+net` | `agentos` with a `net.connect` grant: its own network namespace plus its socket broker (a second clone3 of the daemon into the agent's cgroup, sandbox/sockets.rs), timed to the agent's first instruction (the broker starts after the agent's exec) |
//! | `bwrap` | `bwrap --unshare-all --ro-bind / / --dev /dev --proc /proc --tmpfs /tmp --cap-drop ALL --new-session --die-with-parent` |

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use agentosd::cgroup::Cgroup;
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
    /// Also write the results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn parse_stamp(text: &str) -> Result<u64> {
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

struct Bench {
    dir: PathBuf,
    stamp: PathBuf,
    parent: Cgroup,
    state: PathBuf,
    contract: contracts::Contract,
    /// The same contract with a `net.connect` grant (the socket broker).
    net_contract: contracts::Contract,
    n: usize,
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

    fn clone3(&mut self, sandboxed: bool) -> Result<u64> {
        self.clone3_with(sandboxed, false)
    }

    fn clone3_with(&mut self, sandboxed: bool, net: bool) -> Result<u64> {
        let log = self.log();
        let cg = self.parent.child(&format!("run-{}", self.n));
        let t0 = mono_ns();
        cg.create()?;
        let sandbox = if sandboxed {
            Some(agentosd::sandbox::prepare(
                &self.state,
                "bench",
                "agent",
                Some(if net {
                    &self.net_contract
                } else {
                    &self.contract
                }),
            )?)
        } else {
            None
        };
        let fd = cg.open_dir()?;
        let cmd = agentosd::spawn::Command {
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

fn pct(sorted: &[u64], p: usize) -> u64 {
    sorted[((sorted.len() - 1) * p / 100).min(sorted.len() - 1)]
}

fn ms(ns: u64) -> String {
    format!("{:.3}", ns as f64 / 1e6)
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
    let dir = std::env::temp_dir().join(format!("agentos-bench-sandbox-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
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
        None => crate::stamp::compile(&dir)?,
    };
    let contract_text = format!(
        "apiVersion: agentos/v0.2\nkind: AgentContract\nname: agent\ntenant: bench\n\
         exec: {{ command: {stamp:?} }}\ncapabilities:\n  - fs.exec: [{}]\n  - fs.read: [/srv]\n",
        dir.display(),
        stamp = stamp.display().to_string()
    );
    let contract = contracts::parse_contract(&contract_text, "bench.yaml")
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let net_contract = contracts::parse_contract(
        &format!("{contract_text}  - net.connect: [\"127.0.0.1:9\"]\n"),
        "bench-net.yaml",
    )
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    let parent = Cgroup::new(mount.join(format!("agentos-bench-{}", std::process::id())));
    parent.create()?;
    let state = dir.join("state");
    let mut b = Bench {
        dir: dir.clone(),
        stamp,
        parent,
        state,
        contract,
        net_contract,
        n: 0,
    };
    let modes: Vec<&str> = if a.no_bwrap {
        vec!["fork+exec", "clone3+cgroup", "agentos", "agentos+net"]
    } else {
        vec![
            "fork+exec",
            "clone3+cgroup",
            "agentos",
            "agentos+net",
            "bwrap",
        ]
    };
    let mut samples: Vec<Vec<u64>> = vec![Vec::with_capacity(a.runs); modes.len()];
    let result = (|| -> Result<()> {
        for i in 0..a.warmup + a.runs {
            for (m, mode) in modes.iter().enumerate() {
                let t = match *mode {
                    "fork+exec" => b.fork_exec(),
                    "clone3+cgroup" => b.clone3(false),
                    "agentos" => b.clone3(true),
                    "agentos+net" => b.clone3_with(true, true),
                    _ => b.bwrap(),
                }
                .with_context(|| format!("mode {mode}, run {i}"))?;
                if i >= a.warmup {
                    samples[m].push(t);
                }
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        Ok(())
    })();
    let _ = b.parent.remove();
    let _ = std::fs::remove_dir_all(&dir);
    result?;

    let floor = {
        let mut v = samples[1].clone();
        v.sort_unstable();
        pct(&v, 50)
    };
    println!(
        "\nstart request → first instruction of a static binary, {} starts per mode (interleaved), after {} warm-up starts\n",
        a.runs, a.warmup
    );
    println!("| mode | p50 ms | p90 ms | p99 ms | max ms | mean ms | p50 ÷ clone3+cgroup p50 |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let mut rows = Vec::new();
    for (m, mode) in modes.iter().enumerate() {
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
            "| {mode} | {} | {} | {} | {} | {} | {:.2}× |",
            ms(p50),
            ms(p90),
            ms(p99),
            ms(max),
            ms(mean),
            p50 as f64 / floor.max(1) as f64
        );
        rows.push(json!({"mode": mode, "p50_ns": p50, "p90_ns": p90, "p99_ns": p99, "max_ns": max, "mean_ns": mean}));
    }
    if let (Some(bw), Some(ag)) = (
        rows.iter().find(|r| r["mode"] == "bwrap"),
        rows.iter().find(|r| r["mode"] == "agentos"),
    ) {
        let (bw, ag) = (
            bw["p50_ns"].as_u64().unwrap_or(0),
            ag["p50_ns"].as_u64().unwrap_or(1),
        );
        println!(
            "\nbwrap p50 ÷ agentos p50 = {:.1}×",
            bw as f64 / ag.max(1) as f64
        );
    }
    if let Some(p) = a.json {
        std::fs::write(
            &p,
            serde_json::to_vec_pretty(&json!({"runs": a.runs, "modes": rows}))?,
        )?;
    }
    Ok(())
}
