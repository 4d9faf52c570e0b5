//! `cargo xtask demo [--keep]`: build agentosd and agentctl, start the daemon (with a private
//! D-Bus when no system bus runs, and a cgroup root under the cgroup2 mount), start the runnable
//! example agents, show `agentctl list` and `agentctl status`, then stop everything it started.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

#[derive(clap::Args)]
pub struct DemoArgs {
    /// Leave the daemon, the bus and the agents running and print how to reach them.
    #[arg(long)]
    keep: bool,
}

/// A built-in agent for when no example contract has an `exec`.
const FALLBACK_CONTRACT: &str = r#"apiVersion: agentos/v0.2
kind: AgentContract
name: demo-ticker
tenant: default
class: { latency: DT }
exec: { command: /bin/sh, args: ["-c", "while true; do echo tick $(date +%T); sleep 1; done"] }
restart: { policy: on-failure, limit: 3, backoff_ms: 100 }
compute: { cpu: "0.5", mem: "256MiB", pids: 64 }
"#;

fn root_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

fn is_cgroup2(p: &Path) -> bool {
    // cgroup2 directories have cgroup.controllers; v1 hierarchies do not.
    p.join("cgroup.controllers").exists()
}

fn system_bus_up() -> bool {
    let sock = std::env::var("DBUS_SYSTEM_BUS_ADDRESS")
        .ok()
        .and_then(|a| {
            a.strip_prefix("unix:path=")
                .map(|s| s.split(',').next().unwrap_or(s).to_string())
        })
        .unwrap_or_else(|| "/run/dbus/system_bus_socket".to_string());
    std::os::unix::net::UnixStream::connect(sock).is_ok()
}

struct Started {
    bus: Option<Child>,
    daemon: Option<Child>,
    cgroup_root: PathBuf,
}

impl Started {
    fn teardown(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            // SIGTERM: the daemon was started with --stop-agents-on-exit, so it stops them.
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(d.id().to_string())
                .status();
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = d.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = d.kill();
            let _ = d.wait();
        }
        if let Some(mut b) = self.bus.take() {
            let _ = b.kill();
            let _ = b.wait();
        }
        remove_tree(&self.cgroup_root);
    }
}

/// Remove the demo's own cgroup tree (after its agents were stopped), bottom-up.
fn remove_tree(p: &Path) {
    if let Ok(rd) = std::fs::read_dir(p) {
        for e in rd.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                remove_tree(&e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(p);
}

fn agentctl(bin: &Path, addr: Option<&str>, args: &[&str]) -> Result<std::process::Output> {
    let mut c = Command::new(bin.join("agentctl"));
    if let Some(a) = addr {
        c.arg("--bus-address").arg(a);
    }
    c.args(args).output().context("running agentctl")
}

fn show(bin: &Path, addr: Option<&str>, args: &[&str]) -> Result<()> {
    println!("\n$ agentctl {}", args.join(" "));
    let out = agentctl(bin, addr, args)?;
    print!("{}", String::from_utf8_lossy(&out.stdout));
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    Ok(())
}

pub fn run(args: DemoArgs) -> Result<()> {
    let root = root_dir();
    // The effective uid from /proc (xtask has no libc dependency).
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let euid_root = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(2))
        == Some("0");
    if !euid_root {
        bail!("the demo creates cgroups and starts agents: run it as root");
    }

    println!("==> building agentosd and agentctl");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let st = Command::new(&cargo)
        .current_dir(&root)
        .args(crate::install::build_args(&["build"]))
        .status()
        .context("cargo build")?;
    if !st.success() {
        bail!("cargo build of {:?} failed", crate::install::BIN_PACKAGES);
    }
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root.join("target"));
    let bin = target.join("debug");
    let work = target.join("demo");
    let _ = std::fs::remove_dir_all(work.join("state"));
    std::fs::create_dir_all(work.join("agents.d"))?;

    let cgroup_root = if is_cgroup2(Path::new("/sys/fs/cgroup/unified")) {
        PathBuf::from("/sys/fs/cgroup/unified/agentos-demo")
    } else if is_cgroup2(Path::new("/sys/fs/cgroup")) {
        PathBuf::from("/sys/fs/cgroup/agentos-demo")
    } else {
        bail!("no cgroup2 mount at /sys/fs/cgroup or /sys/fs/cgroup/unified");
    };
    let mut started = Started {
        bus: None,
        daemon: None,
        cgroup_root: cgroup_root.clone(),
    };

    let result = (|| -> Result<()> {
        let addr: Option<String> = if system_bus_up() {
            println!("==> using the system bus");
            None
        } else {
            let conf = work.join("bus.conf");
            let sock = work.join("bus.sock");
            let _ = std::fs::remove_file(&sock);
            std::fs::write(
                &conf,
                format!(
                    r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>session</type>
  <listen>unix:path={}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default"><allow send_destination="*" eavesdrop="true"/><allow eavesdrop="true"/><allow own="*"/></policy>
</busconfig>
"#,
                    sock.display()
                ),
            )?;
            let mut bus = Command::new("dbus-daemon")
                .arg(format!("--config-file={}", conf.display()))
                .args(["--print-address=1", "--nofork"])
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .context("starting dbus-daemon (install the dbus package)")?;
            let mut line = String::new();
            if let Some(out) = bus.stdout.take() {
                BufReader::new(out).read_line(&mut line)?;
            }
            started.bus = Some(bus);
            let a = line.trim().to_string();
            println!("==> no system bus: started a private dbus-daemon at {a}");
            Some(a)
        };
        let a = addr.as_deref();

        println!(
            "==> starting agentosd (cgroup root {}, state {})",
            cgroup_root.display(),
            work.join("state").display()
        );
        let log = std::fs::File::create(work.join("agentosd.log"))?;
        let mut d = Command::new(bin.join("agentosd"));
        d.arg("--state-dir")
            .arg(work.join("state"))
            .arg("--agents-dir")
            .arg(work.join("agents.d"))
            .arg("--cgroup-root")
            .arg(&cgroup_root)
            .arg("--stop-timeout")
            .arg("3")
            .arg("--stop-agents-on-exit");
        if let Some(a) = a {
            d.arg("--bus-address").arg(a);
        }
        started.daemon = Some(
            d.stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .context("starting agentosd")?,
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if agentctl(&bin, a, &["list"])?.status.success() {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "agentosd did not come up; see {}",
                    work.join("agentosd.log").display()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }

        let mut files: Vec<PathBuf> = std::fs::read_dir(root.join("examples/contracts"))
            .map(|rd| rd.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        files.retain(|p| {
            matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml"))
                && std::fs::read_to_string(p)
                    .map(|t| t.lines().any(|l| l.starts_with("exec:")))
                    .unwrap_or(false)
        });
        files.sort();
        if files.is_empty() {
            let f = work.join("demo-ticker.yaml");
            std::fs::write(&f, FALLBACK_CONTRACT)?;
            println!(
                "==> no runnable example in examples/contracts; using {}",
                f.display()
            );
            files.push(f);
        }
        let mut first = None;
        for f in &files {
            let fs = f.display().to_string();
            println!("\n$ agentctl start {fs}");
            let out = agentctl(&bin, a, &["start", &fs])?;
            print!("{}", String::from_utf8_lossy(&out.stdout));
            eprint!("{}", String::from_utf8_lossy(&out.stderr));
            if out.status.success() && first.is_none() {
                first = String::from_utf8_lossy(&out.stdout)
                    .split_whitespace()
                    .nth(1)
                    .map(str::to_string);
            }
        }
        std::thread::sleep(Duration::from_millis(1500));
        show(&bin, a, &["list"])?;
        if let Some(name) = &first {
            show(&bin, a, &["status", name])?;
        }
        if args.keep {
            println!("\n==> left running (--keep). Reach it with:");
            match a {
                Some(a) => println!("    export AGENTOS_BUS_ADDRESS='{a}'"),
                None => println!("    (system bus)"),
            }
            println!("    {}/agentctl list", bin.display());
            if let Some(d) = &started.daemon {
                println!(
                    "    stop it: kill {}   (stops its agents: --stop-agents-on-exit){}",
                    d.id(),
                    started
                        .bus
                        .as_ref()
                        .map(|b| format!("; then kill {} (the private bus)", b.id()))
                        .unwrap_or_default()
                );
            }
            println!("    daemon log: {}", work.join("agentosd.log").display());
            println!(
                "    afterwards remove the empty cgroup tree {} (rmdir, deepest first)",
                cgroup_root.display()
            );
        }
        Ok(())
    })();
    if args.keep && result.is_ok() {
        // Detach: the children keep running after xtask exits.
        std::mem::forget(started);
        return Ok(());
    }
    println!("\n==> stopping everything the demo started");
    started.teardown();
    result
}
