//! The agent's disk budget as a run mechanism: at every start, restart and re-adoption the
//! user quota of its uid is set (`compute.disk`, `compute.disk_inodes`, else the daemon's
//! `--agent-disk-default` / `--agent-disk-inodes-default`) on the file systems it writes as
//! itself: the state directory's (its home, its tools' scratch) and the audit directory's when
//! that is another file system one of its `fs.write` scopes lies on (storage/quota.rs). Its
//! tools run as the same uid (tools/proc.rs), so they count against the same quota.
//!
//! Nothing is released at the end of a run: the limit stays with the uid, as do its files (a
//! uid stays with its agent), and the next run sets it again.

use std::path::PathBuf;

use super::mechanism::{Mechanism, Prepared, RunCtx};
use super::{Error, Supervisor};
use crate::sandbox::identity;
use crate::storage::quota::{self, Support};

pub(super) struct DiskQuota<'s>(pub &'s Supervisor);

/// What setting the quota came to.
#[derive(Debug, Default, PartialEq, Eq)]
struct Outcome {
    /// Budgets the contract declared that are not enforced here (for `unenforced_budgets`).
    unenforced: Vec<String>,
    /// Notes for status (the default quota not enforced, what was set).
    notes: Vec<String>,
}

impl DiskQuota<'_> {
    fn set(&self, run: &RunCtx<'_>) -> Result<Outcome, Error> {
        let sup = self.0;
        let b = &run.spec.budgets;
        let declared = b.disk_bytes.is_some() || b.disk_inodes.is_some();
        let state_dir = &sup.cfg.state_dir;
        let uid = identity::uid_for(state_dir, &run.agent.id)
            .map_err(|e| Error::Kernel(format!("agent {}: disk quota: {e}", run.agent.id)))?;
        if let Some(s) = sup.storage() {
            s.register_uid(&run.agent.id, uid);
        }
        let home = identity::home_dir(state_dir, &run.agent.tenant, &run.agent.name);
        let writes: Vec<PathBuf> = run
            .contract
            .map(|c| {
                c.capabilities()
                    .iter()
                    .filter(|cap| cap.name == "fs.write")
                    .flat_map(|cap| cap.expand_scope(&home))
                    .map(PathBuf::from)
                    .collect()
            })
            .unwrap_or_default();
        let audit_dir = sup.storage().and_then(|s| s.audit_dir().map(PathBuf::from));
        let dev = |p: &std::path::Path| rustix::fs::stat(p).ok().map(|s| s.st_dev);
        let mut out = Outcome::default();
        for dir in quota::quota_dirs(state_dir, audit_dir.as_deref(), &writes, &dev) {
            let fs = quota::probe(&dir).map_err(Error::Kernel)?;
            let Some(limits) = quota::limits(b.disk_bytes, b.disk_inodes, &sup.cfg.disk, fs.size)
            else {
                continue;
            };
            let what = format!(
                "disk {} / {} inodes on {}",
                if limits.bytes > 0 {
                    crate::storage::human(limits.bytes)
                } else {
                    "unlimited".into()
                },
                if limits.inodes > 0 {
                    limits.inodes.to_string()
                } else {
                    "unlimited".into()
                },
                fs.dir.display()
            );
            let failed = match &fs.support {
                Support::Enforced => fs.apply(uid, limits).err(),
                other => Some(other.describe()),
            };
            let Some(why) = failed else {
                continue;
            };
            if declared && b.must {
                return Err(Error::Unenforceable(format!(
                    "agent {} requires its disk budget (compute.must) but the user quota of its uid {uid} cannot be set: {what}: {why}",
                    run.agent.id
                )));
            }
            if declared {
                out.unenforced.push(format!("{what}: not enforced: {why}"));
            } else {
                out.notes
                    .push(format!("default disk quota ({what}): not enforced: {why}"));
            }
        }
        Ok(out)
    }
}

impl Mechanism for DiskQuota<'_> {
    fn name(&self) -> &'static str {
        "disk"
    }

    fn prepare(&self, run: &RunCtx<'_>, out: &mut Prepared) -> Result<(), Error> {
        let o = self.set(run)?;
        out.unenforced.extend(o.unenforced);
        out.notes.extend(o.notes);
        Ok(())
    }

    fn adopt(&self, run: &RunCtx<'_>) -> Vec<String> {
        // Set again: the limits may have been changed (or a newer daemon computes them
        // differently); a failure is reported, the running agent is kept. The default quota's
        // note was made at its start already.
        match self.set(run) {
            Ok(o) => o.unenforced,
            Err(e) => vec![format!("disk quota: {e}")],
        }
    }

    fn release(&self, _agent_id: &str) {}
}

impl Supervisor {
    /// Agent `id`'s quota and usage on the state file system (`Q_GETQUOTA` of its uid), when
    /// its uid is known (it started under this daemon) and the file system counts user quotas.
    pub(super) fn disk_usage(&self, id: &str) -> Option<agentos_api::DiskUsage> {
        let uid = self.storage()?.uid_of(id)?;
        let fs = quota::probe(&self.cfg.state_dir).ok()?;
        if matches!(fs.support, Support::Unavailable(_)) {
            return None;
        }
        let u = fs.usage(uid).ok()?;
        Some(agentos_api::DiskUsage {
            bytes: u.bytes,
            inodes: u.inodes,
            bytes_max: u.bytes_limit,
            inodes_max: u.inodes_limit,
            enforced: fs.support.enforced(),
        })
    }
}
