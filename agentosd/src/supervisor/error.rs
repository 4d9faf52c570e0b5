//! The supervisor's errors. Each has a kind ([`ErrorKind`]), which names its
//! `org.agentos1.Error.*` on the bus; the text is made once, where dbus/mod.rs maps it.

use super::mcp_socket::SocketError;
use crate::cgroup::CgroupError;
use crate::sandbox::SandboxError;
use crate::spawn::SpawnError;

/// Errors of supervisor operations.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no such agent: {0}")]
    NoSuchAgent(String),
    #[error("{0}")]
    InvalidContract(String),
    /// The contract text does not parse (at start, or again for a run).
    #[error(transparent)]
    Contract(#[from] contracts::ContractError),
    #[error("{0}")]
    AlreadyExists(String),
    #[error("{0}")]
    InvalidState(String),
    #[error("{0}")]
    Kernel(String),
    /// A system call failed (signalling a pidfd…).
    #[error(transparent)]
    Syscall(#[from] crate::sys::SyscallError),
    /// A cgroup file or directory operation failed.
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    /// Spawning the main process failed in the daemon (not in the child: that is `ExecFailed`).
    #[error("agent {agent}: {source}")]
    Spawn {
        agent: String,
        #[source]
        source: SpawnError,
    },
    /// The agent's sandbox could not be prepared; a `must` the kernel cannot meet is
    /// unenforceable, anything else a kernel error.
    #[error("{}", sandbox_text(agent, source))]
    Sandbox {
        agent: String,
        #[source]
        source: SandboxError,
    },
    /// The agent's MCP socket could not be made.
    #[error("{}", socket_text(agent, source))]
    McpSocket {
        agent: String,
        #[source]
        source: SocketError,
    },
    #[error("{0}")]
    Unenforceable(String),
    #[error("{0}")]
    ExecFailed(String),
    /// HRT admission refused the reservation (the message has the numbers).
    #[error("{0}")]
    Unschedulable(String),
    /// A file of the daemon's configuration could not be read or written (`enable`).
    #[error("{0}")]
    Io(String),
    /// Storage is below its reserve: new starts are refused (the message names the file system,
    /// its free space and the reserve).
    #[error("{0}")]
    StorageLow(String),
}

fn socket_text(agent: &str, e: &SocketError) -> String {
    match e {
        SocketError::Listen { .. } | SocketError::Pair(_) => {
            format!("agent {agent}: MCP socket {e}")
        }
        other => format!("agent {agent}: MCP socket: {other}"),
    }
}

fn sandbox_text(agent: &str, e: &SandboxError) -> String {
    match e {
        SandboxError::Unenforceable(m) => m.clone(),
        other => format!("agent {agent}: sandbox: {other}"),
    }
}

/// What kind of failure an [`Error`] is: one `org.agentos1.Error.*` name each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    NoSuchAgent,
    InvalidContract,
    AlreadyExists,
    InvalidState,
    Kernel,
    Unenforceable,
    ExecFailed,
    Unschedulable,
    Io,
    StorageLow,
}

impl Error {
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::NoSuchAgent(_) => ErrorKind::NoSuchAgent,
            Error::InvalidContract(_) | Error::Contract(_) => ErrorKind::InvalidContract,
            Error::AlreadyExists(_) => ErrorKind::AlreadyExists,
            Error::InvalidState(_) => ErrorKind::InvalidState,
            Error::Kernel(_)
            | Error::Syscall(_)
            | Error::Cgroup(_)
            | Error::Spawn { .. }
            | Error::McpSocket { .. } => ErrorKind::Kernel,
            Error::Sandbox {
                source: SandboxError::Unenforceable(_),
                ..
            } => ErrorKind::Unenforceable,
            Error::Sandbox { .. } => ErrorKind::Kernel,
            Error::Unenforceable(_) => ErrorKind::Unenforceable,
            Error::ExecFailed(_) => ErrorKind::ExecFailed,
            Error::Unschedulable(_) => ErrorKind::Unschedulable,
            Error::Io(_) => ErrorKind::Io,
            Error::StorageLow(_) => ErrorKind::StorageLow,
        }
    }

    /// The last component of the D-Bus error name.
    pub fn dbus_name(&self) -> &'static str {
        match self.kind() {
            ErrorKind::NoSuchAgent => "NoSuchAgent",
            ErrorKind::InvalidContract => "InvalidContract",
            ErrorKind::AlreadyExists => "AlreadyExists",
            ErrorKind::InvalidState => "InvalidState",
            ErrorKind::Kernel => "Kernel",
            ErrorKind::Unenforceable => "Unenforceable",
            ErrorKind::ExecFailed => "ExecFailed",
            ErrorKind::Unschedulable => "Unschedulable",
            ErrorKind::Io => "Io",
            ErrorKind::StorageLow => "StorageLow",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_sources_keep_their_bus_names_and_texts() {
        let e = Error::Sandbox {
            agent: "t/a".into(),
            source: SandboxError::Unenforceable("agent t/a requires landlock (must)".into()),
        };
        assert_eq!(e.dbus_name(), "Unenforceable");
        assert_eq!(e.to_string(), "agent t/a requires landlock (must)");
        let e = Error::Spawn {
            agent: "t/a".into(),
            source: SpawnError::Nul { what: "argument" },
        };
        assert_eq!(e.dbus_name(), "Kernel");
        assert_eq!(
            e.to_string(),
            "agent t/a: invalid argument: contains a NUL byte"
        );
        let e = Error::from(contracts::parse_contract("name: [", "x.yaml").unwrap_err());
        assert_eq!(e.dbus_name(), "InvalidContract");
        assert!(e.to_string().starts_with("x.yaml"), "{e}");
        assert_eq!(
            Error::NoSuchAgent("x".into()).to_string(),
            "no such agent: x"
        );
    }
}
