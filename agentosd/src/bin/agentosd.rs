//! `agentosd`: the agentos daemon. Thin: flags here, everything else in the library.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "agentosd",
    version,
    about = "The agentos daemon: runs agents under their contracts"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(clap::Args, Debug, Clone)]
struct RunArgs {
    /// State directory (agent records, logs)
    #[arg(long, global = true, default_value = "/var/lib/agentos")]
    state_dir: PathBuf,
    /// Contracts started at daemon start, like enabled units
    #[arg(long, global = true, default_value = "/etc/agentos/agents.d")]
    agents_dir: PathBuf,
    /// cgroup2 directory the daemon owns [default: its delegated cgroup under systemd, else
    /// CGROUP2_MOUNT/agentos]
    #[arg(long, global = true)]
    cgroup_root: Option<PathBuf>,
    /// Where agent logs go [default: STATE_DIR/logs]
    #[arg(long, global = true)]
    log_dir: Option<PathBuf>,
    /// D-Bus address to serve on [default: the system bus]
    #[arg(long, global = true)]
    bus_address: Option<String>,
    /// Seconds between SIGTERM and cgroup.kill when stopping an agent
    #[arg(long, global = true, default_value_t = 10.0)]
    stop_timeout: f64,
    /// Stop all agents when the daemon exits (default: leave them running)
    #[arg(long, global = true)]
    stop_agents_on_exit: bool,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run the daemon (the default)
    Run,
    /// Probe what this host can enforce and print it
    Check {
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Some(Cmd::Check { json }) => {
            std::process::exit(agentosd::daemon::check(cli.run.cgroup_root, json))
        }
        Some(Cmd::Run) | None => {
            tracing_subscriber::fmt()
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_env("AGENTOSD_LOG")
                        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
                )
                .with_writer(std::io::stderr)
                // No colour codes in the journal or a log file.
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                .init();
            let r = cli.run;
            let opts = agentosd::daemon::Options {
                state_dir: r.state_dir,
                agents_dir: r.agents_dir,
                cgroup_root: r.cgroup_root,
                log_dir: r.log_dir,
                bus_address: r.bus_address,
                stop_timeout: Duration::from_secs_f64(r.stop_timeout.max(0.0)),
                stop_agents_on_exit: r.stop_agents_on_exit,
            };
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(4)
                .enable_all()
                .build()?;
            rt.block_on(agentosd::daemon::run(opts))
        }
    }
}
