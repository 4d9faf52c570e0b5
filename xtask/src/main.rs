//! `cargo xtask`: everything that is not `cargo test`.

use std::process::Command;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

#[cfg(feature = "bench")]
mod bench;
mod demo;
mod install;
mod mutants;
mod peers;
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
    /// Mutation testing (cargo-mutants) of the code that decides access, time-boxed, with a
    /// caught/missed table per file; fails on a missed mutant (docs/testing.md).
    Mutants(mutants::MutantsArgs),
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
    // itself builds without them, so a fresh machine gets them here.
    vm::host::ensure_build_packages()?;
    match cmd {
        Cmd::Test {
            host_only,
            allow_skips,
        } => test(host_only, allow_skips),
        Cmd::Vm { cmd } => vm::run(cmd),
        Cmd::McpPeers => peers::ensure().map(|d| println!("{}", d.display())),
        Cmd::Install(args) => install::run(args),
        Cmd::Mutants(args) => mutants::run(args),
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

fn cargo_with(args: &[&str], env: &[(&str, &std::ffi::OsStr)]) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(&cargo)
        .args(args)
        .envs(env.iter().copied())
        .status()
        .with_context(|| format!("running {cargo} {}", args.join(" ")))?;
    if !status.success() {
        bail!("cargo {} failed ({status})", args.join(" "));
    }
    Ok(())
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
    let no_skip = if allow_skips { "0" } else { "1" };
    cargo_with(
        &["test", "--workspace"],
        &[
            ("AGENTOS_MCP_PEERS", peers.as_os_str()),
            ("AGENTOS_TEST_NO_SKIP", no_skip.as_ref()),
        ],
    )?;
    if host_only {
        eprintln!("xtask test: the VM suite was left out (--host-only); run `cargo xtask vm test`");
        return Ok(());
    }
    vm::test_default()
}
