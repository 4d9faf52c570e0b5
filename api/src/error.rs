//! `org.agentos1.Error.*`: the errors the daemon returns, by name.

/// `org.agentos1.Error.*`. The daemon maps its own errors to these in one place (agentosd's
/// dbus/mod.rs); clients tell them apart by [`ApiError::name_of`] / the names below.
#[derive(Debug, zbus::DBusError)]
#[zbus(prefix = "org.agentos1.Error")]
pub enum ApiError {
    #[zbus(error)]
    ZBus(zbus::Error),
    NoSuchAgent(String),
    InvalidContract(String),
    AlreadyExists(String),
    InvalidState(String),
    Kernel(String),
    Unenforceable(String),
    ExecFailed(String),
    /// HRT admission refused the agent; the message has the numbers.
    Unschedulable(String),
    InvalidArgs(String),
    Io(String),
    /// No pending consent request with that id.
    NoSuchConsent(String),
    /// The daemon does not offer this (e.g. no tool service).
    Unavailable(String),
    /// The caller does not hold the action (named in the message) for this agent or tenant.
    AccessDenied(String),
    /// The daemon's audit or state file system is below its free-space reserve: new agent
    /// starts are refused until space returns (the message names the file system).
    StorageLow(String),
}

/// Short names (after [`crate::ERROR_PREFIX`]) clients act on.
pub mod name {
    /// `org.agentos1.Error.NoSuchAgent`.
    pub const NO_SUCH_AGENT: &str = "NoSuchAgent";
    /// `org.agentos1.Error.AccessDenied`.
    pub const ACCESS_DENIED: &str = "AccessDenied";
    /// `org.agentos1.Error.StorageLow`.
    pub const STORAGE_LOW: &str = "StorageLow";
}

impl ApiError {
    /// The part of a full error name after `org.agentos1.Error.`, or the whole name when it
    /// is not one of ours (`org.freedesktop.DBus.Error.ServiceUnknown`).
    pub fn name_of(full: &str) -> &str {
        full.strip_prefix(crate::ERROR_PREFIX)
            .and_then(|s| s.strip_prefix('.'))
            .unwrap_or(full)
    }
}

#[cfg(test)]
mod tests {
    use zbus::DBusError as _;

    use super::*;

    #[test]
    fn names_are_under_the_prefix() {
        let e = ApiError::NoSuchAgent("x".into());
        assert_eq!(e.name().as_str(), "org.agentos1.Error.NoSuchAgent");
        assert_eq!(ApiError::name_of(e.name().as_str()), name::NO_SUCH_AGENT);
        assert_eq!(
            ApiError::AccessDenied(String::new()).name().as_str(),
            format!("{}.{}", crate::ERROR_PREFIX, name::ACCESS_DENIED)
        );
        assert_eq!(
            ApiError::name_of("org.freedesktop.DBus.Error.ServiceUnknown"),
            "org.freedesktop.DBus.Error.ServiceUnknown"
        );
    }
}
