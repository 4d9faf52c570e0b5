//! agentctl, the operator's client of agentosd's D-Bus API (`org.agentos1`, see
//! agentos-api). Each command is a function returning the process exit code ([`exit`]); the
//! binary only parses arguments. No kernel code: what needs the kernel (the host probe) is
//! asked of the daemon, or of `agentosd check` ([`check`]).

pub mod check;
pub mod cli;
pub mod client;
pub mod complete;
pub mod daemon;
pub mod files;
pub mod jobs;
pub mod monitor;
pub mod render;
pub mod tools;
pub mod top;
pub mod validate;
pub mod when;

/// agentctl exit codes (documented in docs/cli.md).
pub mod exit {
    /// Success.
    pub const OK: i32 = 0;
    /// The operation failed (the daemon refused it or it did not work).
    pub const FAILED: i32 = 1;
    /// Bad usage (clap's code for argument errors).
    pub const USAGE: i32 = 2;
    /// No such agent.
    pub const NOT_FOUND: i32 = 3;
    /// The daemon cannot be reached (no bus, or nobody owns org.agentos1).
    pub const UNREACHABLE: i32 = 4;
}
