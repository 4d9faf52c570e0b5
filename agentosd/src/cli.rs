//! agentosd's command line: every flag and default (the configuration file's keys are the same
//! names, conf.rs). In the library so that tests can parse the command lines the docs show.

use std::path::PathBuf;

use clap::{CommandFactory, Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "agentosd",
    version,
    about = "The agentos daemon: runs agents under their contracts"
)]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Option<Cmd>,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// Read options from this TOML file: each key is a long flag's name (`stop-timeout = 5`,
    /// `authz = ["group:ops=read@acme"]`, `sched-ext = true`), flags given here win; "none":
    /// read no file [default: /etc/agentos/agentosd.toml when it exists]
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// State directory (agent records, logs)
    #[arg(long, global = true, default_value = "/var/lib/agentos")]
    pub state_dir: PathBuf,
    /// Contracts started at daemon start, like enabled units
    #[arg(long, global = true, default_value = "/etc/agentos/agents.d")]
    pub agents_dir: PathBuf,
    /// cgroup2 directory the daemon owns [default: its delegated cgroup under systemd, else
    /// CGROUP2_MOUNT/agentos]
    #[arg(long, global = true)]
    pub cgroup_root: Option<PathBuf>,
    /// Where agent logs go [default: STATE_DIR/logs]
    #[arg(long, global = true)]
    pub log_dir: Option<PathBuf>,
    /// D-Bus address to serve on [default: the system bus]
    #[arg(long, global = true)]
    pub bus_address: Option<String>,
    /// Seconds between SIGTERM and cgroup.kill when stopping an agent
    #[arg(long, global = true, default_value_t = 10.0)]
    pub stop_timeout: f64,
    /// Stop all agents when the daemon exits (default: leave them running)
    #[arg(long, global = true)]
    pub stop_agents_on_exit: bool,
    /// Audit log directory [default: STATE_DIR/audit]
    #[arg(long, global = true)]
    pub audit_dir: Option<PathBuf>,
    /// Audit signing key, created 0600 when missing [default: STATE_DIR/audit.key]
    #[arg(long, global = true)]
    pub audit_key: Option<PathBuf>,
    /// Do not forward audit records to the journal
    #[arg(long, global = true)]
    pub no_audit_journal: bool,
    /// Load the sched_ext scheduler scx_agentos (SRT agents first, DT on idle time) when the
    /// kernel has sched_ext; without it, say so and keep the cpu.weight fallback. Also enabled
    /// by AGENTOSD_SCHED_EXT=1 in the environment (a systemd drop-in)
    #[arg(long, global = true)]
    pub sched_ext: bool,
    /// Count each agent's syscalls (`agentctl status`: Syscalls) with a BPF program on the
    /// global syscall-entry hook. Every process on the host pays for it on every syscall (see
    /// docs/benchmarks.md), so it is off by default. Also enabled by AGENTOSD_SYSCALL_COUNTS=1
    #[arg(long, global = true)]
    pub syscall_counts: bool,
    /// Do not have Landlock handle pathname Unix sockets (`RESOLVE_UNIX`, ABI 9) even where the
    /// kernel has it: the BPF LSM fence (lsm/unix_stream_connect, lsm/unix_may_send) alone keeps
    /// agents from the host's sockets. For a Landlock regression, and to test that fence on a
    /// new kernel. The daemon does not start with it when that fence is not active
    #[arg(long, global = true)]
    pub no_landlock_unix: bool,
    /// Tool manifests (`*.yaml`) agents may call through their MCP socket
    #[arg(long, global = true, default_value = "/etc/agentos/tools.d")]
    pub tools_dir: PathBuf,
    /// Runtime directory for the agents' sockets (RUN_DIR/agents/TENANT/NAME.sock)
    /// [default: /run/agentos with the default state directory, else STATE_DIR/run]
    #[arg(long, global = true)]
    pub run_dir: Option<PathBuf>,
    /// Seconds a call held for consent waits for `agentctl consent approve` before it is denied
    #[arg(long, global = true, default_value_t = 120.0)]
    pub consent_timeout: f64,
    /// Tool calls one agent may have in flight at once over all its MCP connections (each may
    /// run a process in the agent's cgroup); more are refused with error -32003
    #[arg(long, global = true, default_value_t = crate::mcp::DEFAULT_MAX_CALLS_PER_AGENT)]
    pub max_tool_calls_per_agent: usize,
    /// Bytes of an agent connection's requests the daemon holds before it stops reading that
    /// socket (complete lines not yet taken; at least the 1 MiB longest line)
    #[arg(long, global = true, default_value_t = crate::ipc::DEFAULT_INBOUND_BYTES, value_name = "BYTES")]
    pub ipc_inbound_bytes: usize,
    /// Bytes of replies queued for an agent connection (not yet read by the agent) before the
    /// daemon stops reading its requests (back-pressure)
    #[arg(long, global = true, default_value_t = crate::ipc::DEFAULT_OUTBOUND_BYTES, value_name = "BYTES")]
    pub ipc_outbound_bytes: usize,
    /// Bytes held for one agent over all its MCP connections (requests and replies) before the
    /// daemon stops reading those of them that hold any
    #[arg(long, global = true, default_value_t = crate::ipc::DEFAULT_AGENT_BYTES, value_name = "BYTES")]
    pub ipc_agent_bytes: usize,
    /// Seconds an agent connection may stay over its outbound bound (the agent does not read
    /// its replies) before the daemon closes it and frees what it held
    #[arg(long, global = true, default_value_t = crate::ipc::DEFAULT_STALL_TIMEOUT.as_secs_f64(), value_name = "SECONDS")]
    pub ipc_stall_timeout: f64,
    /// Bytes a second the daemon reads from one agent's MCP connections, over all of them (each
    /// line counts 1 KiB more): past it the daemon stops reading that agent for a while, so one
    /// agent cannot take the daemon's CPU from the others and the operator. 0: no rate
    #[arg(long, global = true, default_value_t = crate::ipc::rate::DEFAULT_AGENT_RATE, value_name = "BYTES_PER_SEC")]
    pub ipc_agent_rate: u64,
    /// Percent of one CPU the daemon guarantees one agent (parsing its requests, accepting its
    /// connections, its sessions' gate, schema checks and audit records, the model gateway's
    /// work for it), measured in thread CPU time: past it, while the daemon is contended
    /// (--ipc-agent-cpu-ceiling), the daemon stops reading that agent's sockets until it is back
    /// under its fair share. Applies with --ipc-agent-rate. 0: no CPU rate
    #[arg(long, global = true, default_value_t = agentosd_cpu_default(), value_name = "PERCENT")]
    pub ipc_agent_cpu: f64,
    /// Percent of one CPU the daemon may spend for all agents together (over the last second)
    /// before --ipc-agent-cpu holds anyone; then the agents over their share that take the most
    /// are held back to an equal part of it (never below their share). 0: the share is a hard
    /// cap, held to whether the daemon is busy or not
    #[arg(long, global = true, default_value_t = agentosd_cpu_ceiling_default(), value_name = "PERCENT")]
    pub ipc_agent_cpu_ceiling: f64,
    /// Percent of the time an agent within its share may wait for a CPU (its cgroup's
    /// cpu.pressure, PSI, less its own cpu.max throttling) before the agents over their share
    /// are held to it, under --ipc-agent-cpu-ceiling or not: the daemon lends CPU beyond the
    /// shares only while the CPU has room. 0: the ceiling alone decides
    #[arg(long, global = true, default_value_t = agentosd_cpu_stall_default(), value_name = "PERCENT")]
    pub ipc_agent_cpu_stall: f64,
    /// Milliseconds of the daemon's CPU an agent that was idle may use at once before
    /// --ipc-agent-cpu holds it (at least half a second's worth of its share)
    #[arg(long, global = true, default_value_t = crate::ipc::cpu::DEFAULT_AGENT_CPU_BURST.as_millis() as u64, value_name = "MS")]
    pub ipc_agent_cpu_burst: u64,
    /// Open files all agents' connections may hold together (MCP connections beyond the ring's
    /// registered table, model gateway connections); past it new ones are refused, so agents
    /// never take the files the daemon needs. 0: a quarter of the open-file limit
    #[arg(long, global = true, default_value_t = 0, value_name = "N")]
    pub agent_conn_files: usize,
    /// Nice steps below the daemon's own priority at which it serves agents (their sockets and
    /// MCP sessions, on threads of their own), so that D-Bus and the operator's commands come
    /// first when the CPU is short. 0: same priority, one runtime
    #[arg(long, global = true, default_value_t = crate::agent_work::DEFAULT_NICE, value_name = "STEPS")]
    pub agent_work_nice: i32,
    /// The scheduling slice, µs, that the threads of that work (the agents' socket ring and
    /// their sessions' runtime) ask the kernel for, so that one of them woken while another
    /// runs a long turn gets the CPU at once (EEVDF, Linux 6.12; the kernel keeps it within
    /// 100-100 000). 0: the kernel's default slice
    #[arg(long, global = true, default_value_t = crate::agent_work::DEFAULT_SLICE_US, value_name = "US", value_parser = clap::value_parser!(u64).range(0..=100_000))]
    pub agent_work_slice_us: u64,
    /// Worker threads of the runtime that serves the agents' MCP sessions (with
    /// `--agent-work-nice` above 0). 0: one per two CPUs the daemon may use, at least 1, at most
    /// 4 (the ring thread and the audit writer have the others; a second worker costs a
    /// spurious wake-up on every request: docs/benchmarks.md, "Tool calls", fourteenth session)
    #[arg(long, global = true, default_value_t = 0, value_name = "N")]
    pub agent_workers: usize,
    /// Task polls between the looks of a worker of the agents' runtime at its I/O driver (a
    /// tool's reply on its pipe) and at sessions woken by the ring thread (an agent's new
    /// line); tokio's defaults are 61 and 31. Lower: another agent's call waits less behind a
    /// flooding agent; higher: more calls a second when many agents flood at once
    /// (docs/benchmarks.md)
    #[arg(long, global = true, default_value_t = crate::agent_work::DEFAULT_POLL_INTERVAL, value_name = "POLLS", value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub agent_poll_interval: u32,
    /// bpffs directory where the network and BPF LSM filesystem programs' links and maps are
    /// pinned (net-CGID/, fs-CGID/), so that they stay attached while agentosd is down or
    /// restarting (the next daemon takes them over);
    /// mounted as a bpffs instance when it is not one. "none": do not pin. Also
    /// AGENTOSD_BPF_PIN_DIR [default: /sys/fs/bpf/agentos]
    #[arg(long, global = true)]
    pub bpf_pin_dir: Option<PathBuf>,
    /// Who may do what over D-Bus, one rule per flag: PRINCIPAL=ACTIONS[@TENANTS] with PRINCIPAL
    /// uid:N, gid:N, user:NAME or group:NAME, ACTIONS from manage-agents, answer-consent,
    /// read-audit, read, all, and TENANTS limiting the rule to those tenants' agents. Root may
    /// always do everything. Given rules replace the default (docs/dbus.md, "Authorization")
    /// [default: group:agentos=read,read-audit]
    #[arg(long = "authz", global = true, value_name = "RULE")]
    pub authz: Vec<String>,
    /// Ask polkit (org.freedesktop.PolicyKit1.CheckAuthorization) whether a caller other than
    /// root holds an action: auto = when polkitd is on the daemon's bus (then the --authz rules
    /// are not used), yes = always (refused when polkitd does not answer), no = never
    #[arg(long, global = true, value_enum, default_value_t = crate::polkit::Mode::Auto)]
    pub polkit: crate::polkit::Mode,
    /// Where the agents' DNS stubs send the queries for granted names, ADDR:PORT (repeat for
    /// more, tried in order) [default: the nameservers of /etc/resolv.conf at daemon start]
    #[arg(long = "dns-upstream", global = true, value_name = "ADDR:PORT")]
    pub dns_upstream: Vec<std::net::SocketAddr>,
    /// Seconds an address from a DNS answer stays reachable after the record's TTL ran out
    #[arg(long, global = true, default_value_t = 30.0, value_name = "SECONDS")]
    pub dns_grace: f64,
    /// An address prefix (10.0.0.0/8, fd00::/8) whose addresses the agents' DNS stubs may give
    /// and learn for granted names (repeat for more); by default answers lose private and
    /// internal addresses (10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7, …: rebinding).
    /// Loopback and link-local addresses are never given
    #[arg(long = "dns-allow-private", global = true, value_name = "PREFIX")]
    pub dns_allow_private: Vec<crate::dns::Prefix>,
    /// Kernel denial records per agent and second once the burst is spent; the rest are
    /// counted per agent and hook in a "denials-suppressed" record every 2 s
    #[arg(long, global = true, default_value_t = 20)]
    pub denial_records_per_sec: u32,
    /// Kernel denial records an agent may produce at once before the rate applies
    #[arg(long, global = true, default_value_t = 100)]
    pub denial_records_burst: u32,
    /// An agent's journal (its output and the daemon's notes about it) is rotated past this
    /// many bytes; one rotated file is kept, so at most twice this per agent
    #[arg(long, global = true, default_value_t = 8 << 20, value_name = "BYTES")]
    pub log_journal_max: u64,
    /// Bytes per second of each agent stream (stdout, stderr) the daemon takes into the journal;
    /// an agent more than 8 s of this behind has the excess skipped, with a note in its journal
    #[arg(long, global = true, default_value_t = 2 << 20, value_name = "BYTES")]
    pub log_rate: u64,
    /// The daemon's own memory.max (bytes, or "max"), written to its leaf ROOT/supervisor when
    /// it runs in one (under systemd): what the daemon may take whatever its agents do
    #[arg(long, global = true, default_value = crate::daemon::SELF_MEMORY_MAX, value_name = "BYTES")]
    pub self_memory_max: String,
    /// The daemon's own pids.max (or "max"), likewise
    #[arg(long, global = true, default_value = crate::daemon::SELF_TASKS_MAX, value_name = "N")]
    pub self_tasks_max: String,
    /// The model gateway's backends, models and tenant token budgets (YAML; see
    /// docs/models.md) [default: /etc/agentos/models.yaml when it exists]
    #[arg(long, global = true)]
    pub models: Option<PathBuf>,
    /// Export OpenTelemetry traces (a span per agent turn, tool call, gate decision and consent
    /// wait) and per-agent metrics over OTLP/HTTP protobuf to this collector, e.g.
    /// http://127.0.0.1:4318 (off when absent; docs/telemetry.md)
    #[arg(long, global = true, value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// Spans waiting for export at most; when the collector is slow or down more are dropped
    /// and counted, calls never wait
    #[arg(long, global = true, default_value_t = crate::telemetry::DEFAULT_QUEUE)]
    pub otlp_queue_size: usize,
    /// Seconds between two exports of the per-agent metrics
    #[arg(long, global = true, default_value_t = 10.0)]
    pub otlp_metrics_interval: f64,
    /// Seconds without activity after which an agent's turn (its trace) ends
    #[arg(long, global = true, default_value_t = 30.0)]
    pub otlp_turn_idle: f64,
    /// Free space (bytes) the daemon keeps on the file systems of its audit log and state
    /// directory; below it (or below --storage-reserve-percent, whichever is larger) the daemon
    /// is "storage low": new agent starts and the tool calls of the agents writing the most are
    /// refused, refusals are summarised, agents' output is not taken in (docs/daemon.md)
    #[arg(long, global = true, default_value_t = crate::storage::reserve::DEFAULT_RESERVE_BYTES, value_name = "BYTES")]
    pub storage_reserve: u64,
    /// The reserve as a percentage of each file system's size (the larger of the two applies)
    #[arg(long, global = true, default_value_t = crate::storage::reserve::DEFAULT_RESERVE_PERCENT, value_name = "PERCENT")]
    pub storage_reserve_percent: f64,
    /// Seconds between two checks of the reserve (statvfs; also checked at once after a write
    /// fails)
    #[arg(long, global = true, default_value_t = 1.0, value_name = "SECONDS")]
    pub storage_check_interval: f64,
    /// Uids (= gids) handed to agents, one per agent ever started here (kept across restarts).
    /// The default, systemd's DynamicUser range, holds 4 336 agents; for more give a range above
    /// 65535, e.g. 131072-196607 (docs/daemon.md, "Limits")
    #[arg(
        long,
        global = true,
        default_value = "61184-65519",
        value_name = "FIRST-LAST"
    )]
    pub agent_uids: crate::sandbox::identity::UidRange,
    /// Disk quota of an agent whose contract sets no compute.disk: a size (2GiB), a share of
    /// the state file system (10%) or off. A user quota on the agent's uid, set at each start;
    /// needs a state file system with user quotas (`agentosd check`; docs/install.md)
    #[arg(long, global = true, default_value = "10%", value_name = "SIZE|PERCENT|off", value_parser = crate::storage::quota::Share::parse_size)]
    pub agent_disk_default: crate::storage::quota::Share,
    /// Inode limit of the same quota where the contract sets no compute.disk_inodes: a count,
    /// a share of the file system's inodes (10%) or off
    #[arg(long, global = true, default_value = "10%", value_name = "COUNT|PERCENT|off", value_parser = crate::storage::quota::Share::parse_count)]
    pub agent_disk_inodes_default: crate::storage::quota::Share,
}

#[derive(Subcommand, Debug)]
pub enum Cmd {
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
pub fn known_flags() -> Vec<crate::conf::Known> {
    Cli::command()
        .get_arguments()
        .filter_map(|a| {
            let long = a.get_long()?;
            (!matches!(long, "config" | "help" | "version")).then(|| crate::conf::Known {
                long: long.to_string(),
                takes_value: a.get_action().takes_values(),
                repeats: matches!(a.get_action(), clap::ArgAction::Append),
            })
        })
        .collect()
}

/// `--ipc-agent-cpu-stall`'s default, in percent.
fn agentosd_cpu_stall_default() -> f64 {
    crate::ipc::stalls::DEFAULT_STALL_PERMILLE as f64 / 10.0
}

/// `--ipc-agent-cpu-ceiling`'s default, in percent.
fn agentosd_cpu_ceiling_default() -> f64 {
    crate::ipc::cpu::DEFAULT_AGENT_CPU_CEILING_PERMILLE as f64 / 10.0
}

/// `--ipc-agent-cpu`'s default, in percent.
fn agentosd_cpu_default() -> f64 {
    crate::ipc::cpu::DEFAULT_AGENT_CPU_PERMILLE as f64 / 10.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_poll_interval_is_a_flag_with_a_floor() {
        let parse = |v: &str| {
            Cli::try_parse_from(["agentosd".to_string(), format!("--agent-poll-interval={v}")])
        };
        assert_eq!(
            Cli::try_parse_from(["agentosd"])
                .unwrap()
                .run
                .agent_poll_interval,
            crate::agent_work::DEFAULT_POLL_INTERVAL
        );
        assert_eq!(parse("16").unwrap().run.agent_poll_interval, 16);
        // 0 would make tokio panic (global_queue_interval must be > 0): refused by name.
        for bad in ["0", "1025", "-1", "x"] {
            let e = parse(bad).unwrap_err().to_string();
            assert!(e.contains("--agent-poll-interval"), "{bad}: {e}");
        }
        // The configuration file may set it like any flag.
        assert!(
            known_flags()
                .iter()
                .any(|k| k.long == "agent-poll-interval" && k.takes_value)
        );
    }
}
