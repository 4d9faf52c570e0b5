//! `agentctl`: control agentosd over D-Bus, like systemctl. Exit codes: 0 ok, 1 failed, 2 usage,
//! 3 no such agent, 4 daemon unreachable (docs/cli.md).

use std::path::PathBuf;

use agentctl::client::{self, Client};
use agentctl::exit;
use clap::{CommandFactory, Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "agentctl",
    version,
    about = "Control agentos agents (like systemctl)"
)]
struct Cli {
    /// D-Bus address of the daemon's bus [env: AGENTOS_BUS_ADDRESS; default: the system bus]
    #[arg(long, global = true)]
    bus_address: Option<String>,
    /// Seconds to wait for the daemon's answer to each call (0: wait forever), like busctl's
    /// --timeout
    #[arg(long, global = true, default_value_t = 25.0, value_name = "SECS")]
    timeout: f64,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
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
    /// Show an agent's state, processes, cgroup, resources and last log lines
    Status {
        agent: String,
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
        #[arg(short = 'o', long, value_enum, default_value_t = client::LogOutput::Short)]
        output: client::LogOutput,
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
        #[arg(short, long, value_enum, default_value_t = agentctl::top::Sort::Cpu)]
        sort: agentctl::top::Sort,
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
    /// Print shell completions
    Completions { shell: clap_complete::Shell },
}

#[derive(Subcommand, Debug)]
enum ConsentCmd {
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
struct AuditFiles {
    /// The daemon's state directory: the log is STATE_DIR/audit/audit.log, the public key
    /// STATE_DIR/audit.key.pub
    #[arg(long, default_value = "/var/lib/agentos")]
    state_dir: PathBuf,
    /// The log file [default: STATE_DIR/audit/audit.log]
    #[arg(long)]
    log: Option<PathBuf>,
}

impl AuditFiles {
    fn log(&self) -> PathBuf {
        self.log
            .clone()
            .unwrap_or_else(|| self.state_dir.join("audit").join("audit.log"))
    }
}

#[derive(Subcommand, Debug)]
enum AuditCmd {
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

fn audit(cmd: AuditCmd) -> i32 {
    let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
    match cmd {
        AuditCmd::Verify { files, key } => {
            let key = key.unwrap_or_else(|| files.state_dir.join("audit.key.pub"));
            audit::cli::verify(&files.log(), &key, &mut out, &mut err)
        }
        AuditCmd::Show {
            files,
            agent,
            since,
            follow,
            json,
        } => {
            let opts = audit::cli::ShowOptions {
                agent,
                since,
                follow,
                json,
            };
            audit::cli::show(&files.log(), &opts, &mut out, &mut err)
        }
    }
}

fn main() {
    // Like every Unix filter: a reader that goes away (`agentctl audit show | head`) ends us
    // with SIGPIPE, quietly, instead of a panic on the failed write (Rust ignores SIGPIPE).
    // SAFETY: signal(2) with SIG_DFL, before any thread exists; no handler is installed.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() {
                exit::USAGE
            } else {
                exit::OK
            };
            let _ = e.print();
            std::process::exit(code);
        }
    };
    std::process::exit(run(cli));
}

fn run(cli: Cli) -> i32 {
    let addr = cli.bus_address.as_deref();
    // A negative, NaN or absurd value is a usage error, not a panic in Duration.
    let timeout = match cli.timeout {
        0.0 => None,
        t if t.is_finite() && t > 0.0 && t <= 86_400.0 => {
            Some(std::time::Duration::from_secs_f64(t))
        }
        t => {
            eprintln!("agentctl: --timeout {t}: give seconds between 0 (wait forever) and 86400");
            return exit::USAGE;
        }
    };
    match cli.cmd {
        Cmd::Validate { files, json } => {
            return agentctl::validate::run(
                &files,
                json,
                &mut std::io::stdout(),
                &mut std::io::stderr(),
            );
        }
        Cmd::Audit { cmd } => return audit(cmd),
        Cmd::Completions { shell } => {
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "agentctl",
                &mut std::io::stdout(),
            );
            return exit::OK;
        }
        _ => {}
    }
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("agentctl: cannot start the async runtime: {e}");
            return exit::FAILED;
        }
    };
    rt.block_on(async move {
        if let Cmd::Check { json } = cli.cmd {
            return agentctl::check::check(addr, timeout, json).await;
        }
        let c = match Client::connect(addr, timeout).await {
            Ok(c) => c,
            Err(e) => {
                eprintln!("agentctl: {}", e.message);
                return e.code;
            }
        };
        let mut out = std::io::stdout();
        match cli.cmd {
            Cmd::Start { target } => client::start(&c, &target).await,
            Cmd::Stop { agents } => client::simple(&c, "StopAgent", &agents).await,
            Cmd::Kill {
                agents,
                signal,
                kill_whom,
            } => client::kill(&c, &agents, &kill_whom, &signal).await,
            Cmd::Freeze { agents } => client::simple(&c, "FreezeAgent", &agents).await,
            Cmd::Thaw { agents } => client::simple(&c, "ThawAgent", &agents).await,
            Cmd::Restart { agents } => client::simple(&c, "RestartAgent", &agents).await,
            Cmd::Remove { agents } => client::simple(&c, "RemoveAgent", &agents).await,
            Cmd::ResetFailed { agents } => client::reset_failed(&c, &agents).await,
            Cmd::DaemonReload => agentctl::files::daemon_reload(&c, &mut out).await,
            Cmd::Reload {
                agent,
                file,
                no_restart,
            } => agentctl::files::reload(&c, &agent, file.as_deref(), no_restart, &mut out).await,
            Cmd::Enable { agents, now } => {
                agentctl::files::enable(&c, &agents, now, &mut out).await
            }
            Cmd::Disable { agents, now } => {
                agentctl::files::disable(&c, &agents, now, &mut out).await
            }
            Cmd::Cat { agent } => agentctl::files::cat(&c, &agent, &mut out).await,
            Cmd::Show {
                agent,
                property,
                value,
            } => agentctl::files::show(&c, &agent, &property, value, &mut out).await,
            Cmd::List {
                json,
                mut state,
                failed,
            } => {
                if failed {
                    state.push("failed".into());
                }
                client::list(&c, json, &state, &mut out).await
            }
            Cmd::Status { agent, json, lines } => {
                client::status(&c, &agent, json, lines, &mut out).await
            }
            Cmd::IsActive { agent, quiet } => client::is_active(&c, &agent, quiet).await,
            Cmd::Logs {
                agent,
                lines,
                follow,
                since,
                until,
                output,
            } => {
                let args = client::LogsArgs {
                    // --since/--until without -n: everything in the window.
                    lines: lines.unwrap_or(if since.is_some() || until.is_some() {
                        0
                    } else {
                        50
                    }),
                    follow,
                    since,
                    until,
                    output,
                };
                client::logs(&c, &agent, &args).await
            }
            Cmd::Consent { cmd } => match cmd {
                ConsentCmd::List { json } => client::consent_list(&c, json, &mut out).await,
                ConsentCmd::Approve { ids } => client::consent_answer(&c, true, &ids).await,
                ConsentCmd::Deny { ids } => client::consent_answer(&c, false, &ids).await,
            },
            Cmd::Top {
                batch,
                iterations,
                delay,
                sort,
            } => {
                let delay = std::time::Duration::from_secs_f64(delay.clamp(0.1, 3600.0));
                agentctl::top::top(&c, batch, iterations, delay, sort, &mut out).await
            }
            Cmd::Monitor { json } => agentctl::monitor::monitor(&c, json, &mut out).await,
            Cmd::Validate { .. }
            | Cmd::Completions { .. }
            | Cmd::Check { .. }
            | Cmd::Audit { .. } => exit::OK,
        }
    })
}
