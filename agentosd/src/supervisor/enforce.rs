//! The kernel enforcement of a run keyed by its cgroup: BPF LSM filesystem scopes, cgroup BPF
//! network destinations, syscall counts.

use super::{Agent, Error, Supervisor};
use crate::cgroup::Cgroup;
use crate::enforce::fs;
use crate::enforce::net;

impl Supervisor {
    /// Fill the agent's kernel policies keyed by the id of `cg` (which must exist) before its
    /// first process: the BPF LSM filesystem scopes ([`Self::fs_prepare`]) and the network
    /// destinations. Returns notes for `agentctl status`.
    pub(super) async fn net_prepare(
        &self,
        agent: &Agent,
        cg: &Cgroup,
    ) -> Result<Vec<String>, Error> {
        let mut notes = self.fs_prepare(agent, cg)?;
        match self.net_policy_prepare(agent, cg).await {
            Ok(n) => notes.extend(n),
            Err(e) => {
                if let Ok(f) = self.fs() {
                    f.clear(&agent.id);
                }
                return Err(e);
            }
        }
        if let Ok(c) = self.sysc()
            && let Err(e) = c.add(&agent.id, cgroup_id(cg.path()))
        {
            notes.push(format!("syscall counts: {e}"));
        }
        Ok(notes)
    }

    /// Fill the agent's prefixes for `lsm/file_open` and `lsm/bprm_check_security` from the
    /// same plan its Landlock ruleset is built from (`sandbox::Grants::plan`). Without BPF LSM,
    /// refuses an agent whose contract requires `bpf_lsm`; otherwise notes that Landlock alone
    /// enforces the scopes.
    pub(super) fn fs_prepare(&self, agent: &Agent, cg: &Cgroup) -> Result<Vec<String>, Error> {
        let contract = super::start::agent_contract(agent)?;
        let enforcer = match self.fs() {
            Ok(f) => f.clone(),
            Err(why) => {
                if contract
                    .as_ref()
                    .is_some_and(|c| c.must().mechanisms.contains(&contracts::Mechanism::BpfLsm))
                {
                    return Err(Error::Unenforceable(format!(
                        "agent {} requires bpf_lsm (must.mechanisms) but the BPF LSM programs are not active: {why}",
                        agent.id
                    )));
                }
                return Ok(vec![format!(
                    "filesystem: BPF LSM not active ({why}); Landlock enforces the scopes"
                )]);
            }
        };
        let home =
            crate::sandbox::identity::home_dir(&self.cfg.state_dir, &agent.tenant, &agent.name);
        let grants = contract
            .as_ref()
            .map(|c| crate::sandbox::Grants::from_contract(c, &home))
            .unwrap_or_default();
        let plan = grants
            .plan(&home)
            .map_err(|e| Error::InvalidContract(format!("agent {}: {e}", agent.id)))?;
        // The same resolution as the Landlock rules (sandbox::landlock::Opener): no link the
        // agent planted in its home or a scope is followed; a path that does not resolve
        // safely stays literal, which `d_path` of a link's target never matches.
        let home_fd = crate::safe_fs::Dir::open_root(&self.cfg.state_dir)
            .and_then(|r| {
                r.open_dir(
                    &std::path::Path::new("home")
                        .join(&agent.tenant)
                        .join(&agent.name),
                )
            })
            .ok();
        let opener = crate::sandbox::landlock::Opener::new(home_fd.iter().collect());
        let policy = fs::Policy::from_plan(&plan, &|p| opener.resolve(p));
        enforcer
            .set_policy(
                &agent.id,
                &agent.tenant,
                &agent.name,
                cgroup_id(cg.path()),
                &policy,
            )
            .map_err(|e| {
                Error::Kernel(format!("agent {}: filesystem LSM policy: {e}", agent.id))
            })?;
        let mut notes = vec![format!("filesystem (BPF LSM): {}", policy.describe())];
        notes.extend(policy.notes.iter().cloned());
        Ok(notes)
    }

    /// Fill agent's entry in the BPF policy map from its contract's `net.connect` and `net.bind`
    /// grants (host names resolved now), keyed by the id of `cg`, which must exist. Returns notes for
    /// `agentctl status`. Without BPF, refuses an agent whose contract requires `cgroup_bpf`.
    pub(super) async fn net_policy_prepare(
        &self,
        agent: &Agent,
        cg: &Cgroup,
    ) -> Result<Vec<String>, Error> {
        let contract = super::start::agent_contract(agent)?;
        let required = contract.as_ref().is_some_and(|c| {
            c.must()
                .mechanisms
                .contains(&contracts::Mechanism::CgroupBpf)
        });
        let enforcer = match self.net() {
            Ok(n) => n.clone(),
            Err(why) if required => {
                return Err(Error::Unenforceable(format!(
                    "agent {} requires cgroup_bpf (must.mechanisms) but network enforcement is unavailable: {why}",
                    agent.id
                )));
            }
            Err(why) => {
                return Ok(vec![format!(
                    "network: destinations NOT enforced by cgroup BPF ({why}); Landlock TCP port rules still apply"
                )]);
            }
        };
        // The same home the sandbox expands `{state}` to.
        let home =
            crate::sandbox::identity::home_dir(&self.cfg.state_dir, &agent.tenant, &agent.name);
        let scopes = |name: &str| -> Vec<String> {
            contract
                .iter()
                .flat_map(|c| c.capabilities())
                .filter(|cap| cap.name == name)
                .flat_map(|cap| cap.expand_scope(&home))
                .collect()
        };
        let (connect, bind) = (scopes("net.connect"), scopes("net.bind"));
        // Name resolution is bounded: a start never hangs on DNS (and fails closed).
        let resolve = tokio::task::spawn_blocking(move || {
            net::policy_from_grants(&connect, &bind, &net::system_resolve)
        });
        let policy = tokio::time::timeout(std::time::Duration::from_secs(15), resolve)
            .await
            .map_err(|_| {
                Error::Kernel(format!(
                    "agent {}: resolving its net.connect hosts took over 15 s; not started",
                    agent.id
                ))
            })?
            .map_err(|e| Error::Kernel(format!("resolving net.connect hosts: {e}")))?
            .map_err(|e| Error::InvalidContract(format!("agent {}: {e}", agent.id)))?;
        let id = cgroup_id(cg.path());
        enforcer
            .set_policy(&agent.id, &agent.tenant, &agent.name, id, &policy)
            .map_err(|e| Error::Kernel(format!("agent {}: network policy: {e}", agent.id)))?;
        let mut notes = vec![format!("network (cgroup BPF): {}", policy.describe())];
        notes.extend(policy.notes.iter().map(|n| format!("network: {n}")));
        Ok(notes)
    }

    /// Forget the agent's entries in the BPF policy maps (its cgroup is gone).
    pub(super) fn net_clear(&self, agent: &Agent) {
        if let Ok(n) = self.net() {
            n.clear(&agent.id);
        }
        if let Ok(f) = self.fs() {
            f.clear(&agent.id);
        }
        if let Ok(c) = self.sysc() {
            c.remove(&agent.id);
        }
    }
}

/// The cgroup id of a cgroup2 directory: its inode number (what `bpf_get_current_cgroup_id()`
/// returns for tasks in it); 0 when it cannot be read.
pub(super) fn cgroup_id(path: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata(path).map(|m| m.ino()).unwrap_or(0)
}
