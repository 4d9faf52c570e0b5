//! The tool runners' hook into the cgroup BPF network policy (see `crate::tools::CgroupHooks`).

use std::sync::Arc;

use super::Supervisor;
use super::enforce::cgroup_id;
use crate::cgroup::Cgroup;
use crate::enforce::net;

impl Supervisor {
    /// What the tool runners call for each tool cgroup (`RunnerConfig::hooks`).
    pub fn tool_cgroup_hooks(self: &Arc<Self>) -> Arc<dyn crate::tools::CgroupHooks> {
        Arc::new(ToolCgroupHooks {
            sup: Arc::downgrade(self),
        })
    }
}

/// The tool runners' hook into the cgroup BPF network policy (see [`crate::tools::CgroupHooks`]):
/// a tool cgroup (under its agent, so under `agents/` where the programs are attached) gets an
/// entry built from the tool's effective grants, attributed to its agent.
#[derive(Debug)]
struct ToolCgroupHooks {
    sup: std::sync::Weak<Supervisor>,
}

/// The key of a tool cgroup's entry in the enforcers' agent table.
pub(super) fn tool_key(cg: &Cgroup) -> String {
    format!("tool:{}", cg.path().display())
}
impl crate::tools::CgroupHooks for ToolCgroupHooks {
    fn placed(
        &self,
        caller: &crate::tools::Caller,
        cg: &Cgroup,
        connect: &[String],
        bind: &[String],
    ) -> Result<Vec<String>, String> {
        let sup = self
            .sup
            .upgrade()
            .ok_or_else(|| "agentosd is shutting down".to_string())?;
        let enforcer = match sup.net() {
            Ok(n) => n.clone(),
            Err(why) => {
                return Ok(vec![format!(
                    "network: not enforced by cgroup BPF ({why}); Landlock TCP port rules apply"
                )]);
            }
        };
        let policy = net::policy_from_grants(connect, bind, &net::system_resolve)
            .map_err(|e| format!("network policy of the tool: {e}"))?;
        enforcer
            .set_policy(
                &tool_key(cg),
                &caller.tenant,
                &caller.name,
                cgroup_id(cg.path()),
                &policy,
            )
            .map_err(|e| format!("network policy of the tool cgroup: {e}"))?;
        Ok(vec![format!("network (cgroup BPF): {}", policy.describe())])
    }

    fn removed(&self, cg: &Cgroup) {
        if let Some(sup) = self.sup.upgrade()
            && let Ok(n) = sup.net()
        {
            n.clear(&tool_key(cg));
        }
    }
}
