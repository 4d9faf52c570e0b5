//! `cargo xtask`: everything that is not `cargo test`.

use std::process::Command;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

mod bench;
mod demo;
mod install;
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
    },
    /// The guest VM test bed: build the image, run the vm-tests suite, open a shell.
    Vm {
        #[command(subcommand)]
        cmd: vm::VmCmd,
    },
    /// Build and install agentosd, agentctl, the systemd unit and the D-Bus policy.
    Install(install::InstallArgs),
    /// Build, start agentosd (private bus if needed) and the example agents, show list/status.
    Demo(demo::DemoArgs),
    /// Benchmarks (results in docs/benchmarks.md).
    Bench {
        #[command(subcommand)]
        cmd: bench::BenchCmd,
    },
}

fn main() -> Result<()> {
    match Cli::parse().cmd {
        Cmd::Test { host_only } => test(host_only),
        Cmd::Vm { cmd } => vm::run(cmd),
        Cmd::Install(args) => install::run(args),
        Cmd::Demo(args) => demo::run(args),
        Cmd::Bench { cmd } => bench::run(cmd),
    }
}

fn cargo(args: &[&str]) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(&cargo)
        .args(args)
        .status()
        .with_context(|| format!("running {cargo} {}", args.join(" ")))?;
    if !status.success() {
        bail!("cargo {} failed ({status})", args.join(" "));
    }
    Ok(())
}

fn test(host_only: bool) -> Result<()> {
    cargo(&["fmt", "--all", "--", "--check"])?;
    cargo(&[
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ])?;
    cargo(&["test", "--workspace"])?;
    if host_only {
        eprintln!("xtask test: the VM suite was left out (--host-only); run `cargo xtask vm test`");
        return Ok(());
    }
    vm::test_default()
}
