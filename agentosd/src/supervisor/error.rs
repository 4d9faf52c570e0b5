//! The supervisor's errors; each maps to an `org.agentos1.Error.*` name (dbus.rs).

use crate::cgroup;

/// Errors of supervisor operations; each maps to an `org.agentos1.Error.*` name.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no such agent: {0}")]
    NoSuchAgent(String),
    #[error("{0}")]
    InvalidContract(String),
    #[error("{0}")]
    AlreadyExists(String),
    #[error("{0}")]
    InvalidState(String),
    #[error("{0}")]
    Kernel(String),
    #[error("{0}")]
    Unenforceable(String),
    #[error("{0}")]
    ExecFailed(String),
    /// HRT admission refused the reservation (the message has the numbers).
    #[error("{0}")]
    Unschedulable(String),
}

impl Error {
    /// The last component of the D-Bus error name.
    pub fn dbus_name(&self) -> &'static str {
        match self {
            Error::NoSuchAgent(_) => "NoSuchAgent",
            Error::InvalidContract(_) => "InvalidContract",
            Error::AlreadyExists(_) => "AlreadyExists",
            Error::InvalidState(_) => "InvalidState",
            Error::Kernel(_) => "Kernel",
            Error::Unenforceable(_) => "Unenforceable",
            Error::ExecFailed(_) => "ExecFailed",
            Error::Unschedulable(_) => "Unschedulable",
        }
    }
}

impl From<cgroup::CgroupError> for Error {
    fn from(e: cgroup::CgroupError) -> Self {
        Error::Kernel(e.to_string())
    }
}
