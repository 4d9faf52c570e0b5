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
/// entry built from the tool's effective grants, attributed to its agent; with the daemon's DNS
/// its names are answered by a stub of its own (keyed like its entry), stopped when it goes.
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
        let key = tool_key(cg);
        let id = cgroup_id(cg.path());
        let mut notes = unix_fence(&sup, caller, cg, &key, id)?;
        let enforcer = match sup.net() {
            Ok(n) => n.clone(),
            Err(why) => {
                notes.push(format!(
                    "network: not enforced by cgroup BPF ({why}); Landlock TCP port rules apply"
                ));
                return Ok(notes);
            }
        };
        let policy = match sup.dns() {
            // The daemon's DNS: the tool's names are grants its own stub answers, as an
            // agent's (refreshed with their TTL, wildcards too, no DNS elsewhere).
            Some(dns) if !connect.is_empty() => {
                let hosts = |h: &str| net::hosts_file(std::path::Path::new("/etc/hosts"), h);
                let mut p = net::policy_with_dns(connect, bind, &hosts)
                    .map_err(|e| format!("network policy of the tool: {e}"))?;
                if p.dns {
                    let spec = crate::dns::StubSpec {
                        agent_id: caller.agent.clone(),
                        tenant: caller.tenant.clone(),
                        name: caller.name.clone(),
                        contract: caller.name.clone(),
                        cgroup_id: id,
                        grants: p.names.clone(),
                        static_connect: p.rules.clone(),
                    };
                    p.dns_port = dns
                        .start_as(&key, spec, None)
                        .map_err(|e| format!("the tool cgroup's DNS stub: {e}"))?;
                    p.dns6 = dns.serves_v6(&key);
                }
                p
            }
            _ => net::policy_from_grants(connect, bind, &net::system_resolve)
                .map_err(|e| format!("network policy of the tool: {e}"))?,
        };
        enforcer
            .set_policy(&key, &caller.tenant, &caller.name, id, &policy)
            .map_err(|e| {
                if let Some(dns) = sup.dns() {
                    dns.stop(&key);
                }
                format!("network policy of the tool cgroup: {e}")
            })?;
        notes.push(format!("network (cgroup BPF): {}", policy.describe()));
        Ok(notes)
    }

    fn removed(&self, cg: &Cgroup) {
        let Some(sup) = self.sup.upgrade() else {
            return;
        };
        if let Ok(f) = sup.fs() {
            f.clear(&tool_key(cg));
        }
        if let Ok(n) = sup.net() {
            n.clear(&tool_key(cg));
        }
        if let Some(dns) = sup.dns() {
            dns.stop(&tool_key(cg));
        }
    }
}

/// The BPF LSM fence of the tool cgroup's pathname Unix sockets: only sockets made in its
/// agent's subtree (the tool cgroup's grandparent, `agents/<tenant>/<name>`). Fails the call
/// when the fence is active and the entry cannot be made (a tool would reach every host socket
/// its uid may write where Landlock has no `RESOLVE_UNIX`).
fn unix_fence(
    sup: &Supervisor,
    caller: &crate::tools::Caller,
    cg: &Cgroup,
    key: &str,
    id: u64,
) -> Result<Vec<String>, String> {
    let Ok(fs) = sup.fs() else {
        return Ok(Vec::new());
    };
    let agent = cg.path().parent().and_then(|p| p.parent()).ok_or_else(|| {
        format!(
            "tool cgroup {} is not beneath an agent's cgroup",
            cg.path().display()
        )
    })?;
    let fenced = fs
        .set_tool_unix(key, &caller.tenant, &caller.name, id, cgroup_id(agent))
        .map_err(|e| format!("the tool cgroup's Unix socket fence (BPF LSM): {e}"))?;
    Ok(if fenced {
        vec!["unix sockets (BPF LSM): only sockets made by its agent or its tools".to_string()]
    } else {
        Vec::new()
    })
}
