//! The `org.agentos1` D-Bus API as both sides see it: the bus, object and interface names,
//! the wire types, the error names and the constants the daemon and its clients (agentctl,
//! agentos-mcp) share. No kernel code: this crate builds without clang or libbpf.
//!
//! docs/dbus.md is the reference; a change here is a change of the API.

pub mod error;
pub mod signal;
pub mod text;
pub mod wire;

use std::time::Duration;

pub use error::ApiError;
pub use wire::{
    AgentRow, AgentRowRef, AgentStatus, ConsentRequest, ConsentRow, DaemonCpu, DiskUsage, ListRow,
    ListRowOf, ListRowRef, LogEntry, ModelUsage,
};

/// The daemon's well-known bus name.
pub const SERVICE: &str = "org.agentos1";
/// The manager object.
pub const MANAGER_PATH: &str = "/org/agentos1";
/// The manager object's interface.
pub const MANAGER_IFACE: &str = "org.agentos1.Manager";
/// The interface of each agent's object (`/org/agentos1/agent/<tenant>_<name>`).
pub const AGENT_IFACE: &str = "org.agentos1.Agent";
/// The prefix of every error the daemon returns (`org.agentos1.Error.NoSuchAgent`…).
pub const ERROR_PREFIX: &str = "org.agentos1.Error";

/// The D-Bus address clients use instead of the system bus.
pub const BUS_ADDRESS_ENV: &str = "AGENTOS_BUS_ADDRESS";
/// In an agent's environment: the path of its MCP socket.
pub const SOCKET_ENV: &str = "AGENTOS_SOCKET";
/// In an agent's environment: the inherited, connected fd of its MCP socket.
pub const SOCKET_FD_ENV: &str = "AGENTOS_SOCKET_FD";

/// How often the daemon samples HRT agents for deadline overruns (`DeadlineMisses` is a lower
/// bound sampled at this interval).
pub const DEADLINE_SAMPLE_INTERVAL: Duration = Duration::from_millis(20);
