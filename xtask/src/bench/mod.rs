//! `cargo xtask bench …`: benchmarks whose numbers go to docs/benchmarks.md.

use anyhow::Result;
use clap::Subcommand;

pub mod hrt;

#[derive(Subcommand)]
pub enum BenchCmd {
    /// HRT agent (SCHED_DEADLINE) vs a nice-0 process vs the kernel's floor (cyclicdeadline,
    /// cyclictest), while DT burners (SCHED_IDLE) load every CPU. Root; host timing only.
    Hrt(hrt::HrtArgs),
    /// (internal) the periodic loop the HRT benchmark measures.
    #[command(hide = true)]
    RtLoop(hrt::LoopArgs),
    /// (internal) a SCHED_IDLE busy loop.
    #[command(hide = true)]
    Burn {
        #[arg(long)]
        secs: u64,
    },
}

pub fn run(cmd: BenchCmd) -> Result<()> {
    match cmd {
        BenchCmd::Hrt(a) => hrt::run(a),
        BenchCmd::RtLoop(a) => hrt::rtloop(a),
        BenchCmd::Burn { secs } => hrt::burn(secs),
    }
}
