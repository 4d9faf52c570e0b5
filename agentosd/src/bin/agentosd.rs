//! `agentosd`: the agentos daemon. Thin: flags here, everything else in the library.

use std::path::PathBuf;
use std::time::Duration;

use clap::{CommandFactory, Parser, Subcommand};
use std::ffi::OsString;

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
    /// Read options from this TOML file: each key is a long flag's name (`stop-timeout = 5`,
    /// `authz = ["group:ops=read@acme"]`, `sched-ext = true`), flags given here win; "none":
    /// read no file [default: /etc/agentos/agentosd.toml when it exists]
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
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
    /// Audit log directory [default: STATE_DIR/audit]
    #[arg(long, global = true)]
    audit_dir: Option<PathBuf>,
    /// Audit signing key, created 0600 when missing [default: STATE_DIR/audit.key]
    #[arg(long, global = true)]
    audit_key: Option<PathBuf>,
    /// Do not forward audit records to the journal
    #[arg(long, global = true)]
    no_audit_journal: bool,
    /// Load the sched_ext scheduler scx_agentos (SRT agents first, DT on idle time) when the
    /// kernel has sched_ext; without it, say so and keep the cpu.weight fallback. Also enabled
    /// by AGENTOSD_SCHED_EXT=1 in the environment (a systemd drop-in)
    #[arg(long, global = true)]
    sched_ext: bool,
    /// Count each agent's syscalls (`agentctl status`: Syscalls) with a BPF program on the
    /// global syscall-entry hook. Every process on the host pays for it on every syscall (see
    /// docs/benchmarks.md), so it is off by default. Also enabled by AGENTOSD_SYSCALL_COUNTS=1
    #[arg(long, global = true)]
    syscall_counts: bool,
    /// Tool manifests (`*.yaml`) agents may call through their MCP socket
    #[arg(long, global = true, default_value = "/etc/agentos/tools.d")]
    tools_dir: PathBuf,
    /// Runtime directory for the agents' sockets (RUN_DIR/agents/TENANT/NAME.sock)
    /// [default: /run/agentos with the default state directory, else STATE_DIR/run]
    #[arg(long, global = true)]
    run_dir: Option<PathBuf>,
    /// Seconds a call held for consent waits for `agentctl consent approve` before it is denied
    #[arg(long, global = true, default_value_t = 120.0)]
    consent_timeout: f64,
    /// Tool calls one agent may have in flight at once over all its MCP connections (each may
    /// run a process in the agent's cgroup); more are refused with error -32003
    #[arg(long, global = true, default_value_t = agentosd::mcp::DEFAULT_MAX_CALLS_PER_AGENT)]
    max_tool_calls_per_agent: usize,
    /// bpffs directory where the network BPF programs' links and maps are pinned, so that they
    /// stay attached while agentosd is down or restarting (the next daemon takes them over);
    /// mounted as a bpffs instance when it is not one. "none": do not pin. Also
    /// AGENTOSD_BPF_PIN_DIR [default: /sys/fs/bpf/agentos]
    #[arg(long, global = true)]
    bpf_pin_dir: Option<PathBuf>,
    /// Who may do what over D-Bus, one rule per flag: PRINCIPAL=ACTIONS[@TENANTS] with PRINCIPAL
    /// uid:N, gid:N, user:NAME or group:NAME, ACTIONS from manage-agents, answer-consent,
    /// read-audit, read, all, and TENANTS limiting the rule to those tenants' agents. Root may
    /// always do everything. Given rules replace the default (docs/dbus.md, "Authorization")
    /// [default: group:agentos=read,read-audit]
    #[arg(long = "authz", global = true, value_name = "RULE")]
    authz: Vec<String>,
    /// Ask polkit (org.freedesktop.PolicyKit1.CheckAuthorization) whether a caller other than
    /// root holds an action: auto = when polkitd is on the daemon's bus (then the --authz rules
    /// are not used), yes = always (refused when polkitd does not answer), no = never
    #[arg(long, global = true, value_enum, default_value_t = agentosd::polkit::Mode::Auto)]
    polkit: agentosd::polkit::Mode,
    /// Kernel denial records per agent and second once the burst is spent; the rest are
    /// counted per agent and hook in a "denials-suppressed" record every 2 s
    #[arg(long, global = true, default_value_t = 20)]
    denial_records_per_sec: u32,
    /// Kernel denial records an agent may produce at once before the rate applies
    #[arg(long, global = true, default_value_t = 100)]
    denial_records_burst: u32,
    /// An agent's journal (its output and the daemon's notes about it) is rotated past this
    /// many bytes; one rotated file is kept, so at most twice this per agent
    #[arg(long, global = true, default_value_t = 8 << 20, value_name = "BYTES")]
    log_journal_max: u64,
    /// Bytes per second of each agent stream (stdout, stderr) the daemon takes into the journal;
    /// an agent more than 8 s of this behind has the excess skipped, with a note in its journal
    #[arg(long, global = true, default_value_t = 2 << 20, value_name = "BYTES")]
    log_rate: u64,
    /// The model gateway's backends, models and tenant token budgets (YAML; see
    /// docs/models.md) [default: /etc/agentos/models.yaml when it exists]
    #[arg(long, global = true)]
    models: Option<PathBuf>,
    /// Export OpenTelemetry traces (a span per agent turn, tool call, gate decision and consent
    /// wait) and per-agent metrics over OTLP/HTTP protobuf to this collector, e.g.
    /// http://127.0.0.1:4318 (off when absent; docs/telemetry.md)
    #[arg(long, global = true, value_name = "URL")]
    otlp_endpoint: Option<String>,
    /// Spans waiting for export at most; when the collector is slow or down more are dropped
    /// and counted, calls never wait
    #[arg(long, global = true, default_value_t = agentosd::telemetry::DEFAULT_QUEUE)]
    otlp_queue_size: usize,
    /// Seconds between two exports of the per-agent metrics
    #[arg(long, global = true, default_value_t = 10.0)]
    otlp_metrics_interval: f64,
    /// Seconds without activity after which an agent's turn (its trace) ends
    #[arg(long, global = true, default_value_t = 30.0)]
    otlp_turn_idle: f64,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run the daemon (the default)
    Run,
    /// Create the audit signing key if it is missing (0600, public key KEY.pub); print the public key
    Keygen,
    /// Print every option with the value in effect (built-in default, configuration file or
    /// flag) in the configuration file's form
    Config,
    /// Probe what this host can enforce and print it
    Check {
        /// Print JSON
        #[arg(long)]
        json: bool,
        /// Print this report (the JSON of `agentosd check --json` or of the D-Bus `Check`
        /// call; `-`: stdin) instead of probing; `agentctl check` draws the daemon's with it
        #[arg(long, value_name = "FILE")]
        report: Option<PathBuf>,
    },
}

/// The flags a configuration file may set: every long option but `--config`, help and version.
fn known_flags() -> Vec<agentosd::conf::Known> {
    Cli::command()
        .get_arguments()
        .filter_map(|a| {
            let long = a.get_long()?;
            (!matches!(long, "config" | "help" | "version")).then(|| agentosd::conf::Known {
                long: long.to_string(),
                takes_value: a.get_action().takes_values(),
                repeats: matches!(a.get_action(), clap::ArgAction::Append),
            })
        })
        .collect()
}

/// The command line with the configuration file's settings in front of it (flags given on the
/// command line replace the file's), parsed. A bad file ends the process with its path and line.
fn parse_args() -> (Cli, Vec<OsString>) {
    let raw: Vec<OsString> = std::env::args_os().collect();
    let Some((path, _explicit)) = agentosd::conf::chosen(&raw) else {
        return (Cli::parse_from(&raw), raw);
    };
    let given: Vec<String> = raw
        .iter()
        .skip(1)
        .filter_map(|a| {
            let a = a.to_str()?.strip_prefix("--")?;
            Some(a.split('=').next().unwrap_or(a).to_string())
        })
        .collect();
    let bin = raw.first().cloned().unwrap_or_else(|| "agentosd".into());
    let file = match agentosd::conf::load(&path, &known_flags(), &given) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("agentosd: {e}");
            std::process::exit(2);
        }
    };
    // The file's values on their own first, so that a bad one is reported as the file's.
    if let Err(e) = Cli::try_parse_from(std::iter::once(bin.clone()).chain(file.iter().cloned())) {
        let msg = e.to_string();
        let first = msg.lines().next().unwrap_or_default();
        eprintln!(
            "agentosd: {}: {}",
            path.display(),
            first.trim_start_matches("error: ")
        );
        std::process::exit(2);
    }
    let mut all = vec![bin];
    all.extend(file);
    all.extend(raw.into_iter().skip(1));
    (Cli::parse_from(&all), all)
}

/// `agentosd config`: every option with the value in effect (default, file or flag), as a
/// configuration file would set it.
fn print_config(argv: &[OsString]) {
    let m = Cli::command().get_matches_from(argv);
    let quote = |v: &str| {
        if v.parse::<f64>().is_ok() {
            v.to_string()
        } else {
            format!("{v:?}")
        }
    };
    for k in known_flags() {
        let id = k.long.replace('-', "_");
        let vals: Vec<String> = m
            .get_raw(&id)
            .map(|v| v.map(|s| s.to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        let src = match m.value_source(&id) {
            Some(clap::parser::ValueSource::DefaultValue) | None => "default",
            _ => "configured",
        };
        let line = if !k.takes_value {
            format!("{} = {}", k.long, m.get_flag(&id))
        } else if k.repeats {
            let items: Vec<String> = vals.iter().map(|v| quote(v)).collect();
            format!("{} = [{}]", k.long, items.join(", "))
        } else if let Some(v) = vals.first() {
            format!("{} = {}", k.long, quote(v))
        } else {
            format!("# {} =", k.long)
        };
        println!("{line:<60} # {src}");
    }
}

fn main() -> anyhow::Result<()> {
    let (cli, argv) = parse_args();
    match cli.cmd {
        Some(Cmd::Config) => {
            print_config(&argv);
            Ok(())
        }
        Some(Cmd::Keygen) => {
            let key = cli
                .run
                .audit_key
                .unwrap_or_else(|| cli.run.state_dir.join("audit.key"));
            let (created, public) = agentosd::audit_trail::ensure_key(&key)?;
            let hex = std::fs::read_to_string(&public)?;
            println!(
                "{} {} (public key {}: {})",
                if created { "created" } else { "kept existing" },
                key.display(),
                public.display(),
                hex.trim()
            );
            Ok(())
        }
        Some(Cmd::Check {
            json,
            report: Some(file),
        }) => print_report(&file, json),
        Some(Cmd::Check { json, report: None }) => {
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
                audit_dir: r.audit_dir,
                audit_key: r.audit_key,
                audit_journal: !r.no_audit_journal,
                sched_ext: r.sched_ext
                    || std::env::var("AGENTOSD_SCHED_EXT").is_ok_and(|v| v == "1" || v == "yes"),
                syscall_counts: r.syscall_counts
                    || agentosd::enforce::sysc::env_enables(
                        std::env::var(agentosd::enforce::sysc::ENV).ok().as_deref(),
                    ),
                tools_dir: r.tools_dir,
                run_dir: r.run_dir,
                consent_timeout: Duration::from_secs_f64(r.consent_timeout.max(0.0)),
                max_tool_calls_per_agent: r.max_tool_calls_per_agent,
                bpf_pin_dir: Some(
                    r.bpf_pin_dir
                        .or_else(|| std::env::var_os("AGENTOSD_BPF_PIN_DIR").map(PathBuf::from))
                        .unwrap_or_else(|| PathBuf::from(agentosd::enforce::net::DEFAULT_PIN_ROOT)),
                )
                .filter(|p| p.as_os_str() != "none"),
                authz: r.authz,
                polkit: r.polkit,
                denial_records: agentosd::enforce::limit::Limits {
                    per_sec: r.denial_records_per_sec,
                    burst: r.denial_records_burst,
                },
                logs: agentosd::logs::Limits {
                    journal_max: r.log_journal_max.max(4096),
                    per_round: (r.log_rate / 2).max(4096),
                    backlog_max: (r.log_rate * 8).max(4096 * 16),
                },
                models: r.models,
                otlp: r.otlp_endpoint.map(|e| agentosd::telemetry::OtlpConfig {
                    queue_size: r.otlp_queue_size.max(1),
                    metrics_interval: Duration::from_secs_f64(r.otlp_metrics_interval.max(0.1)),
                    turn_idle: Duration::from_secs_f64(r.otlp_turn_idle.max(0.1)),
                    ..agentosd::telemetry::OtlpConfig::new(e)
                }),
            };
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(4)
                .enable_all()
                .build()?;
            rt.block_on(agentosd::daemon::run(opts))
        }
    }
}

/// `agentosd check --report FILE`: a report taken elsewhere, printed like `agentosd check`.
fn print_report(file: &std::path::Path, json: bool) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let text = if file.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin()).context("reading the report from stdin")?
    } else {
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?
    };
    let report: agentosd::probe::HostReport = serde_json::from_str(&text).with_context(|| {
        format!(
            "{} is not a host report (agentosd check --json)",
            file.display()
        )
    })?;
    if json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.render_table());
    }
    Ok(())
}
