//! The daemon-wide services the supervisor uses (audit trail, host offer, the BPF enforcers, the
//! syscall counter, sched_ext), built by the daemon and passed in at construction
//! ([`Supervisor::with_services`]).

use std::sync::Arc;

use super::Supervisor;
use crate::audit_trail::AuditTrail;
use crate::enforce::fs::FsEnforcer;
use crate::enforce::net::NetEnforcer;
use crate::enforce::sysc::SyscCounter;
use crate::telemetry::Telemetry;

/// What the supervisor is given to work with; the default is none of them (library tests),
/// each absent one with the reason status reports.
pub struct Services {
    /// Every lifecycle record goes here (see audit.rs).
    pub audit: Option<Arc<AuditTrail>>,
    /// What this host offers contract bindings (for the binding hash in audit records).
    pub offer: contracts::HostOffer,
    /// cgroup BPF network enforcement, or why it is unavailable.
    pub net: Result<Arc<NetEnforcer>, String>,
    /// The agents' DNS stubs (with `net`; `None` without network enforcement): see dns/.
    pub dns: Option<Arc<crate::dns::Dns>>,
    /// BPF LSM filesystem scopes, or why they are unavailable.
    pub fs: Result<Arc<FsEnforcer>, String>,
    /// Per-agent syscall counts when the operator enabled them, or why they are off.
    pub sysc: Result<Arc<SyscCounter>, String>,
    /// The sched_ext scheduler scx_agentos when the daemon loaded it (see scx.rs).
    pub scx: Option<Arc<crate::scx::Scx>>,
    /// OpenTelemetry export ([`Telemetry::off`] unless `--otlp-endpoint`); see telemetry/.
    pub telemetry: Arc<Telemetry>,
    /// The agents' journals (logs/): output taken in, the daemon's notes, journald forwarding.
    pub logs: Arc<crate::logs::Logs>,
    /// The storage reserve on the audit and state file systems (storage/).
    pub storage: Option<Arc<crate::storage::Storage>>,
}

impl Default for Services {
    fn default() -> Self {
        Services {
            audit: None,
            offer: contracts::HostOffer::default(),
            net: Err("not set up by the daemon".into()),
            dns: None,
            fs: Err("not set up by the daemon".into()),
            sysc: Err("not enabled (agentosd --syscall-counts)".into()),
            scx: None,
            telemetry: Telemetry::off(),
            logs: Arc::default(),
            storage: None,
        }
    }
}

impl std::fmt::Debug for Services {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Services")
            .field("audit", &self.audit.is_some())
            .field("net", &self.net.as_ref().err())
            .field("fs", &self.fs.as_ref().err())
            .field("sysc", &self.sysc.as_ref().err())
            .field("scx", &self.scx.is_some())
            .field("telemetry", &self.telemetry.enabled())
            .finish()
    }
}

impl Supervisor {
    /// The audit trail, when the daemon opened one.
    pub fn audit_trail(&self) -> Option<&Arc<AuditTrail>> {
        self.services.audit.as_ref()
    }

    /// The storage watcher, when the daemon keeps a reserve.
    pub fn storage(&self) -> Option<&Arc<crate::storage::Storage>> {
        self.services.storage.as_ref()
    }

    /// Refuse a new start of agent `id` while storage is low.
    pub(super) fn check_storage(&self, id: &str) -> Result<(), super::Error> {
        match self.storage() {
            Some(s) => s.refuse_start(id).map_err(super::Error::StorageLow),
            None => Ok(()),
        }
    }

    /// The network enforcer, or why there is none.
    pub fn net(&self) -> Result<&Arc<NetEnforcer>, String> {
        self.services.net.as_ref().map_err(Clone::clone)
    }

    /// The agents' DNS stubs, when the daemon runs them.
    pub fn dns(&self) -> Option<&Arc<crate::dns::Dns>> {
        self.services.dns.as_ref()
    }

    /// The BPF LSM filesystem enforcer, or why there is none.
    pub fn fs(&self) -> Result<&Arc<FsEnforcer>, String> {
        self.services.fs.as_ref().map_err(Clone::clone)
    }

    /// The syscall counter, or why there is none (off unless the operator enabled it).
    pub fn sysc(&self) -> Result<&Arc<SyscCounter>, String> {
        self.services.sysc.as_ref().map_err(Clone::clone)
    }

    /// scx_agentos, when the daemon loaded it.
    pub(super) fn scx(&self) -> Option<&Arc<crate::scx::Scx>> {
        self.services.scx.as_ref()
    }
}
