//! `scx_agentos`: load the agentos sched_ext scheduler by hand, put cgroups into classes, keep it
//! running until SIGINT/SIGTERM, and say why the kernel stopped it if it did. agentosd loads
//! the same scheduler itself with `--sched-ext`; run this only when agentosd does not.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use nix::sys::signal::{SigSet, Signal};
use scx_agentos::{Class, KernelState, Scheduler};

#[derive(Parser, Debug)]
#[command(
    name = "scx_agentos",
    version,
    about = "sched_ext scheduler for agentos latency classes (SRT ahead, DT on idle time)"
)]
struct Cli {
    /// cgroup2 directory whose tasks (and those of its descendants) are SRT
    #[arg(long, value_name = "CGROUP")]
    srt: Vec<PathBuf>,
    /// cgroup2 directory whose tasks (and those of its descendants) are DT
    #[arg(long, value_name = "CGROUP")]
    dt: Vec<PathBuf>,
    /// Print the scheduler's counters every SECS seconds
    #[arg(long, value_name = "SECS")]
    stats: Option<f64>,
    /// Only report whether sched_ext is there and which scheduler runs, then exit
    #[arg(long)]
    check: bool,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    if cli.check {
        let st = KernelState::read()?;
        println!(
            "sched_ext: {}{}",
            st.state,
            if st.ops.is_empty() {
                String::new()
            } else {
                format!(", scheduler {}", st.ops)
            }
        );
        return Ok(());
    }
    // Block the signals before any thread exists, then wait for them on a thread of our own.
    let mut signals = SigSet::empty();
    signals.add(Signal::SIGINT);
    signals.add(Signal::SIGTERM);
    signals.thread_block().context("blocking SIGINT/SIGTERM")?;
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        std::thread::spawn(move || {
            if let Ok(sig) = signals.wait() {
                eprintln!("scx_agentos: {sig}, unloading");
            }
            stop.store(true, Ordering::SeqCst);
        });
    }

    let sched = Scheduler::load().context("loading scx_agentos")?;
    let st = KernelState::read()?;
    println!(
        "scx_agentos: attached ({}: {}, ops {})",
        scx_agentos::STATE_PATH,
        st.state,
        st.ops
    );
    for (paths, class) in [(&cli.srt, Class::Srt), (&cli.dt, Class::Dt)] {
        for p in paths {
            let id = scx_agentos::cgroup_id(p)?;
            sched.set_class(id, class)?;
            println!("scx_agentos: {} (cgroup id {id}) is {class}", p.display());
        }
    }
    let every = cli.stats.map(|s| Duration::from_secs_f64(s.max(0.1)));
    let mut last = Instant::now();
    while !stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(100));
        if let Some(e) = sched.exit_info() {
            bail!("the kernel stopped scx_agentos: {e}; tasks are back in the fair class");
        }
        if every.is_some_and(|d| last.elapsed() >= d) {
            last = Instant::now();
            println!("scx_agentos: {}", sched.stats());
        }
    }
    println!("scx_agentos: {}", sched.stats());
    match sched.unload() {
        Some(e) if e.is_error() => bail!("scx_agentos stopped with an error: {e}"),
        Some(e) => println!("scx_agentos: unloaded: {e}"),
        None => println!("scx_agentos: unloaded"),
    }
    Ok(())
}
