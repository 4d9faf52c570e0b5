//! The daemon-wide services the supervisor uses (audit trail, host offer, the BPF enforcers,
//! the syscall counter, sched_ext), set once by the daemon at start.

use std::sync::Arc;

use super::Supervisor;
use crate::audit_trail::AuditTrail;
use crate::enforce::fs::FsEnforcer;
use crate::enforce::net::NetEnforcer;
use crate::enforce::sysc::SyscCounter;

impl Supervisor {
    /// Classify SRT/DT agents with `scx` from now on (the daemon sets it once, before readopt).
    pub fn set_scx(&self, scx: Arc<crate::scx::Scx>) {
        let _ = self.scx.set(scx);
    }
}

impl Supervisor {
    /// Use `trail` for every lifecycle record from now on (the daemon sets it once at start).
    pub fn set_audit(&self, trail: Arc<AuditTrail>) {
        let _ = self.audit.set(trail);
    }

    /// What the host offers contract bindings (from the start-up probe).
    pub fn set_host_offer(&self, offer: contracts::HostOffer) {
        let _ = self.offer.set(offer);
    }

    /// The audit trail, when the daemon opened one.
    pub fn audit_trail(&self) -> Option<&Arc<AuditTrail>> {
        self.audit.get()
    }

    /// Use `net` for the agents' network policies (or record why there is none).
    pub fn set_net(&self, net: Result<Arc<NetEnforcer>, String>) {
        let _ = self.net.set(net);
    }

    /// The network enforcer, or why there is none.
    pub fn net(&self) -> Result<&Arc<NetEnforcer>, String> {
        match self.net.get() {
            Some(Ok(n)) => Ok(n),
            Some(Err(why)) => Err(why.clone()),
            None => Err("not set up by the daemon".into()),
        }
    }

    /// Use `fs` for the agents' BPF LSM filesystem scopes (or record why there is none).
    pub fn set_fs(&self, fs: Result<Arc<FsEnforcer>, String>) {
        let _ = self.fs.set(fs);
    }

    /// The BPF LSM filesystem enforcer, or why there is none.
    pub fn fs(&self) -> Result<&Arc<FsEnforcer>, String> {
        match self.fs.get() {
            Some(Ok(f)) => Ok(f),
            Some(Err(why)) => Err(why.clone()),
            None => Err("not set up by the daemon".into()),
        }
    }

    /// Count the agents' syscalls with `sysc` (`--syscall-counts`), or record why not.
    pub fn set_sysc(&self, sysc: Result<Arc<SyscCounter>, String>) {
        let _ = self.sysc.set(sysc);
    }

    /// The syscall counter, or why there is none (off unless the operator enabled it).
    pub fn sysc(&self) -> Result<&Arc<SyscCounter>, String> {
        match self.sysc.get() {
            Some(Ok(c)) => Ok(c),
            Some(Err(why)) => Err(why.clone()),
            None => Err("not enabled (agentosd --syscall-counts)".into()),
        }
    }
}
