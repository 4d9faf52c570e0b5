//! agentctl's command line: every command, flag and default (main.rs runs them). In the
//! library so that tests can parse the command lines the docs show (agentosd/tests/docs.rs).

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "agentctl",
    version,
    about = "Control agentos agents (like systemctl)"
)]
pub struct Cli {
    /// D-Bus address of the daemon's bus [env: AGENTOS_BUS_ADDRESS; default: the system bus]
    #[arg(long, global = true, conflicts_with = "host")]
    pub bus_address: Option<String>,
    /// Talk to the agentosd of another machine over ssh, like systemctl -H: its system bus
    /// through `ssh -xT [USER@]HOST systemd-stdio-bridge`
    #[arg(short = 'H', long, global = true, value_name = "[USER@]HOST")]
    pub host: Option<String>,
    /// Accepted for systemctl's habit; agentctl never pages
    #[arg(long, global = true)]
    pub no_pager: bool,
    /// start, stop, restart, freeze, thaw: queue the job and return at once (`agentctl
    /// list-jobs` shows it, `agentctl monitor` its end), like systemctl --no-block
    #[arg(long, global = true)]
    pub no_block: bool,
    /// Seconds to wait for the daemon's answer to each call (0: wait forever), like busctl's
    /// --timeout
    #[arg(long, global = true, default_value_t = 25.0, value_name = "SECS")]
    pub timeout: f64,
    #[command(subcommand)]
    pub cmd: Cmd,
}

impl Cli {
    /// Where the daemon is: `--bus-address`, or `-H HOST`'s system bus over ssh (as systemd's
    /// `-H` does), or `None` (the environment, then the system bus).
    pub fn target(&self) -> Result<Option<crate::client::BusTarget>, String> {
        use crate::client::BusTarget;
        match (&self.bus_address, &self.host) {
            (Some(a), _) => Ok(Some(BusTarget::Address(a.clone()))),
            (None, Some(h)) => ssh_target(h).map(Some),
            (None, None) => Ok(None),
        }
    }
}

/// `ssh -xT -- HOST systemd-stdio-bridge` as the bus transport (given as argv, not an address
/// string: nothing in HOST can change the command); a host ssh would read as an option is
/// refused.
pub fn ssh_target(host: &str) -> Result<crate::client::BusTarget, String> {
    if host.is_empty() || host.starts_with('-') || host.chars().any(|c| c.is_control() || c == ' ')
    {
        return Err(format!("-H {host:?}: give [USER@]HOST"));
    }
    Ok(crate::client::BusTarget::Exec {
        program: "ssh".into(),
        args: vec![
            "-xT".into(),
            "--".into(),
            host.into(),
            "systemd-stdio-bridge".into(),
        ],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dash_h_reaches_the_hosts_bus_over_ssh() {
        match ssh_target("ops@db1.example,a=b").unwrap() {
            crate::client::BusTarget::Exec { program, args } => {
                assert_eq!(program, "ssh");
                assert_eq!(
                    args,
                    ["-xT", "--", "ops@db1.example,a=b", "systemd-stdio-bridge"]
                );
            }
            other => panic!("{other:?}"),
        }
        for bad in ["", "-oProxyCommand=x", "a b", "a\nb"] {
            assert!(ssh_target(bad).is_err(), "{bad:?}");
        }
    }
}

#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Start an agent from a contract FILE, or a known agent / agents.d contract by NAME
    Start { target: String },
    /// Stop agents (SIGTERM, then cgroup.kill after the stop timeout)
    Stop {
        #[arg(required = true)]
        agents: Vec<String>,
    },
    /// Send a signal to an agent's processes
    Kill {
        #[arg(required = true)]
        agents: Vec<String>,
        /// Signal name or number
        #[arg(short, long, default_value = "TERM")]
        signal: String,
        /// Which processes: all (every process of the agent) or main
        #[arg(long, default_value = "all", value_parser = ["all", "main"])]
        kill_whom: String,
    },
    /// Freeze agents (cgroup.freeze)
    Freeze {
        #[arg(required = true)]
        agents: Vec<String>,
    },
    /// Thaw frozen agents
    Thaw {
        #[arg(required = true)]
        agents: Vec<String>,
    },
    /// Stop and start agents again
    Restart {
        #[arg(required = true)]
        agents: Vec<String>,
    },
    /// Stop agents and forget them
    Remove {
        #[arg(required = true)]
        agents: Vec<String>,
    },
    /// The jobs queued with --no-block that are still running
    ListJobs,
    /// Read the agents directory again: changed contracts of known agents are loaded (a running
    /// agent gets its new contract when it next starts), new ones are loaded but not started
    DaemonReload,
    /// Take an agent's contract again from the file it was started from (or --file) and
    /// restart it with it if it runs (--no-restart: at its next start)
    Reload {
        agent: String,
        /// Read the contract from this file instead
        #[arg(long)]
        file: Option<String>,
        /// Leave a running agent alone: the contract applies when it next starts
        #[arg(long)]
        no_restart: bool,
    },
    /// Put agents' contracts in the agents directory so that they start at boot
    Enable {
        #[arg(required = true)]
        agents: Vec<String>,
        /// Also start them
        #[arg(long)]
        now: bool,
    },
    /// Take agents' contracts out of the agents directory (they keep running)
    Disable {
        #[arg(required = true)]
        agents: Vec<String>,
        /// Also stop them
        #[arg(long)]
        now: bool,
    },
    /// Print the contract an agent runs with (and one loaded for its next start)
    Cat { agent: String },
    /// Edit an agent's contract in $EDITOR, like systemctl edit --full: checked, then applied
    /// (a running agent restarts with it unless --no-restart)
    Edit {
        agent: String,
        /// Leave a running agent alone: the edited contract applies when it next starts
        #[arg(long)]
        no_restart: bool,
    },
    /// The tool manifests the daemon loaded, which agents may call each, and those that did not
    /// load (`daemon-reload` reads the tools directory again)
    Tools {
        /// One JSON object per tool
        #[arg(long)]
        json: bool,
    },
    /// Print an agent's D-Bus properties as Name=value, like systemctl show
    Show {
        agent: String,
        /// Only these properties (comma-separated or repeated)
        #[arg(short = 'p', long = "property")]
        property: Vec<String>,
        /// Print the values only
        #[arg(long)]
        value: bool,
    },
    /// Like systemctl reset-failed: failed agents become inactive and their restart counts
    /// start again (no names: every failed agent)
    ResetFailed { agents: Vec<String> },
    /// List agents
    List {
        #[arg(long)]
        json: bool,
        /// Only agents in these states (comma-separated or repeated: running,failed,…), like
        /// systemctl's --state
        #[arg(long, value_delimiter = ',')]
        state: Vec<String>,
        /// Only failed agents (--state=failed)
        #[arg(long)]
        failed: bool,
    },
    /// Show an agent's state, processes, cgroup, resources and last log lines; without an
    /// agent, the daemon's: version, agents, storage (with a warning while it is low)
    Status {
        agent: Option<String>,
        #[arg(long)]
        json: bool,
        /// Log lines to show
        #[arg(short = 'n', long, default_value_t = 10)]
        lines: u32,
    },
    /// Exit 0 if the agent is running (or frozen), 1 if not, 3 if unknown
    IsActive {
        agent: String,
        #[arg(short, long)]
        quiet: bool,
    },
    /// Show an agent's journal: what it wrote to stdout and stderr, each line with its time
    /// and stream, and the daemon's notes about it (marked `agentosd:`), like journalctl -u
    Logs {
        agent: String,
        /// The newest N entries (0: all that match) [default: 50, or all with --since/--until]
        #[arg(short = 'n', long)]
        lines: Option<u32>,
        /// Keep printing new entries (also across a restart of agentosd)
        #[arg(short, long)]
        follow: bool,
        /// Entries at or after this time: "2026-11-25 22:40:00" (UTC), "-5m", "1 h ago",
        /// today, yesterday, @UNIX_SECONDS
        #[arg(short = 'S', long, allow_hyphen_values = true)]
        since: Option<String>,
        /// Entries at or before this time (same forms as --since)
        #[arg(short = 'U', long, allow_hyphen_values = true)]
        until: Option<String>,
        /// short (TIME NAME: line), json (one object per entry) or cat (the lines only)
        #[arg(short = 'o', long, value_enum, default_value_t = crate::client::LogOutput::Short)]
        output: crate::client::LogOutput,
    },
    /// A live view of the agents like top(1): CPU, memory, tasks, denials, model tokens and
    /// first-token time, refreshed every --delay; --batch prints plain frames for scripts
    Top {
        /// Plain frames one after the other (for scripts and pipes)
        #[arg(short, long)]
        batch: bool,
        /// Frames to show, then exit (0: until interrupted)
        #[arg(short = 'n', long, default_value_t = 0)]
        iterations: u32,
        /// Seconds between frames (the interval the CPU share is over)
        #[arg(short, long, default_value_t = 2.0)]
        delay: f64,
        /// The column to sort by, highest first
        #[arg(short, long, value_enum, default_value_t = crate::top::Sort::Cpu)]
        sort: crate::top::Sort,
    },
    /// Print what happens to the agents you may read as it happens (state changes, new and
    /// removed agents, calls waiting for consent), one line each; resubscribes when agentosd
    /// restarts
    Monitor {
        /// One JSON object per event
        #[arg(long)]
        json: bool,
    },
    /// Check contract files without a daemon
    Validate {
        #[arg(required = true)]
        files: Vec<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// What this host can enforce (the daemon's start-up probe)
    Check {
        #[arg(long)]
        json: bool,
    },
    /// Read and verify the audit trail (reads the files directly; root or group agentos)
    Audit {
        #[command(subcommand)]
        cmd: AuditCmd,
    },
    /// Answer tool calls held for operator consent (`security.consent_for`)
    Consent {
        #[command(subcommand)]
        cmd: ConsentCmd,
    },
    /// Print shell completions (bash also completes agent names, asked of the daemon, and
    /// signal names)
    Completions { shell: clap_complete::Shell },
    /// For the bash completion: the agents' names, one per line (nothing when the daemon cannot
    /// be reached)
    #[command(name = "__complete-agents", hide = true)]
    CompleteAgents,
}

#[derive(Subcommand, Debug)]
pub enum ConsentCmd {
    /// The calls waiting for an answer
    List {
        #[arg(long)]
        json: bool,
    },
    /// Let held calls proceed
    Approve {
        #[arg(required = true)]
        ids: Vec<u64>,
    },
    /// Refuse held calls (the agent gets an MCP error)
    Deny {
        #[arg(required = true)]
        ids: Vec<u64>,
    },
}

#[derive(clap::Args, Debug, Clone)]
pub struct AuditFiles {
    /// The daemon's state directory: the log is STATE_DIR/audit/audit.log, the public key
    /// STATE_DIR/audit.key.pub
    #[arg(long, default_value = "/var/lib/agentos")]
    pub state_dir: PathBuf,
    /// The log file [default: STATE_DIR/audit/audit.log]
    #[arg(long)]
    pub log: Option<PathBuf>,
}

impl AuditFiles {
    pub fn log(&self) -> PathBuf {
        self.log
            .clone()
            .unwrap_or_else(|| self.state_dir.join("audit").join("audit.log"))
    }
}

#[derive(Subcommand, Debug)]
pub enum AuditCmd {
    /// Check the whole chain, the checkpoints' signatures and the head file; exit 1 and name
    /// the first bad record when anything was edited, removed, reordered or truncated
    Verify {
        #[command(flatten)]
        files: AuditFiles,
        /// The host's public key [default: STATE_DIR/audit.key.pub]
        #[arg(long)]
        key: Option<PathBuf>,
    },
    /// Print records: TIME SEQ KIND TENANT/AGENT DECISION DETAIL
    Show {
        #[command(flatten)]
        files: AuditFiles,
        /// Only this agent's records (its name)
        #[arg(long)]
        agent: Option<String>,
        /// Only records since: YYYY-MM-DD[ HH:MM[:SS]] (UTC), @UNIX_SECONDS, or 15m, 2h, 7d
        #[arg(long)]
        since: Option<String>,
        /// Keep printing new records
        #[arg(short, long)]
        follow: bool,
        /// The stored JSON lines, unchanged
        #[arg(long)]
        json: bool,
    },
}
