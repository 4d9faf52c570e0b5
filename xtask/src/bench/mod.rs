//! `cargo xtask bench …`: benchmarks whose numbers go to docs/benchmarks.md.

use anyhow::Result;
use clap::Subcommand;

pub mod hrt;
pub mod sandbox;

#[derive(Subcommand)]
pub enum BenchCmd {
    /// HRT agent (SCHED_DEADLINE) vs a nice-0 process vs the kernel's floor (cyclicdeadline,
    /// cyclictest), while DT burners (SCHED_IDLE) load every CPU. Root; host timing only.
    Hrt(hrt::HrtArgs),
    /// Start latency into a complete agent sandbox vs clone3 into a cgroup, fork+exec and
    /// bwrap (start request → first instruction; p50/p99). Root.
    Sandbox(sandbox::SandboxArgs),
    /// (internal) the periodic loop the HRT benchmark measures.
    #[command(hide = true)]
    RtLoop(hrt::LoopArgs),
    /// (internal) a SCHED_IDLE busy loop.
    #[command(hide = true)]
    Burn {
        #[arg(long)]
        secs: u64,
        /// nice 0 instead of SCHED_IDLE.
        #[arg(long)]
        normal: bool,
    },
}

pub fn run(cmd: BenchCmd) -> Result<()> {
    match cmd {
        BenchCmd::Hrt(a) => hrt::run(a),
        BenchCmd::Sandbox(a) => sandbox::run(a),
        BenchCmd::RtLoop(a) => hrt::rtloop(a),
        BenchCmd::Burn { secs, normal } => hrt::burn(secs, normal),
    }
}
