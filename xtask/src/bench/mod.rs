//! `cargo xtask bench …`: benchmarks whose numbers go to docs/benchmarks.md.

use anyhow::Result;
use clap::Subcommand;

pub mod dns;
mod harness;
pub mod hrt;
pub mod isolation;
pub mod mcp;
pub mod models;
mod models_http;
mod models_report;
pub mod sandbox;
mod sandbox_parts;
mod sandbox_peers;
pub mod scale;
mod scale_systemd;

#[derive(Subcommand)]
pub enum BenchCmd {
    /// HRT agent (SCHED_DEADLINE) vs a nice-0 process vs the kernel's floor (cyclicdeadline,
    /// cyclictest), while DT burners (SCHED_IDLE) load every CPU. Root; host timing only.
    Hrt(hrt::HrtArgs),
    /// Start latency into a complete agent sandbox vs clone3 into a cgroup, fork+exec and
    /// bwrap (start request → first instruction; p50/p99). Root.
    Sandbox(sandbox::SandboxArgs),
    /// Many small agents under one daemon: start rate, the daemon's memory per agent,
    /// `ListAgents` and `agentctl list` at 100, 1 000, 10 000 agents, stop-all time; where
    /// systemd is PID 1 (the VM) side by side with the same number of `systemd-run --scope` and
    /// transient service units (`--peer`). Root.
    Scale(scale::ScaleArgs),
    /// MCP tool calls over the agent socket: ping and tools/call (gate + durable audit) round
    /// trips vs a Unix-socket echo floor, the tool over a pipe and a D-Bus call; then calls/s
    /// with 100 flooding agents while `agentctl list` is timed. Root.
    Mcp(mcp::McpArgs),
    /// Model calls through the gateway vs direct to the backend (an instant in-process
    /// backend and llama.cpp's server): added time to first token and per token (p50/p99),
    /// then throughput with many agents streaming at once. Root.
    Models(models::ModelsArgs),
    /// Egress by name: lookups through an agent's DNS stub vs straight to the same upstream, and
    /// connect latency with 1 000 learnt names vs one static rule vs no BPF (p50/p99), in a
    /// network namespace of its own. Root.
    Dns(dns::DnsArgs),
    /// What one hostile agent costs another agent's tool calls and `agentctl list`: p50/p99
    /// in a quiet window and under each attack (large requests, pipelined pings, a connect
    /// loop, a denial flood), the daemon's CPU and memory. Root.
    Isolation(isolation::IsolationArgs),
    /// (internal) the hostile agent of `bench isolation`.
    #[command(hide = true)]
    Attack(isolation::AttackArgs),
    /// (internal) the measured lookups and connects of `bench dns`.
    #[command(hide = true)]
    DnsClient(dns::ClientArgs),
    /// (internal) the periodic loop the HRT benchmark measures.
    #[command(hide = true)]
    RtLoop(hrt::LoopArgs),
    /// (internal) the measured MCP client of `bench mcp`.
    #[command(hide = true)]
    McpClient(mcp::ClientArgs),
    /// (internal) the instant MCP stdio tool server of `bench mcp`.
    #[command(hide = true)]
    McpEchoServer,
    /// (internal) a line relay between one socket client and the echo tool server (`bench mcp`'s
    /// proxy floor).
    #[command(hide = true)]
    McpRelay(mcp::RelayArgs),
    /// (internal) the measured HTTP client of `bench models`.
    #[command(hide = true)]
    ModelClient(models::ClientArgs),
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

impl BenchCmd {
    /// The hidden helpers a benchmark runs (often as an agent, under its own uid and sandbox),
    /// and any benchmark given prebuilt binaries (`AGENTOS_BENCH_BIN_DIR`: `cargo xtask vm
    /// bench` in the guest, which has no compiler): they build nothing and must not look for
    /// build packages.
    pub fn is_internal(&self) -> bool {
        harness::prebuilt_bin_dir().is_some()
            || matches!(
                self,
                BenchCmd::DnsClient(_)
                    | BenchCmd::RtLoop(_)
                    | BenchCmd::McpClient(_)
                    | BenchCmd::McpEchoServer
                    | BenchCmd::McpRelay(_)
                    | BenchCmd::ModelClient(_)
                    | BenchCmd::Burn { .. }
                    | BenchCmd::Attack(_)
            )
    }
}

pub fn run(cmd: BenchCmd) -> Result<()> {
    match cmd {
        BenchCmd::Hrt(a) => hrt::run(a),
        BenchCmd::Sandbox(a) => sandbox::run(a),
        BenchCmd::Scale(a) => scale::run(a),
        BenchCmd::Mcp(a) => mcp::run(a),
        BenchCmd::McpClient(a) => mcp::client(a),
        BenchCmd::McpEchoServer => mcp::echo_server(),
        BenchCmd::McpRelay(a) => mcp::relay(a),
        BenchCmd::Models(a) => models::run(a),
        BenchCmd::Dns(a) => dns::run(a),
        BenchCmd::Isolation(a) => isolation::run(a),
        BenchCmd::Attack(a) => isolation::attack(a),
        BenchCmd::DnsClient(a) => dns::client(a),
        BenchCmd::ModelClient(a) => models::client(a),
        BenchCmd::RtLoop(a) => hrt::rtloop(a),
        BenchCmd::Burn { secs, normal } => hrt::burn(secs, normal),
    }
}
