//! The kernel enforcement of a run keyed by its cgroup: BPF LSM filesystem scopes, cgroup BPF
//! network destinations, syscall counts.

use super::mechanism::{Boxed, Mechanism, Prepared, RunCtx, RunMechanism};
use super::{Agent, Error, Supervisor};
use crate::cgroup::Cgroup;
use crate::enforce::fs;
use crate::enforce::net;

impl Supervisor {
    /// Fill the agent's prefixes for `lsm/file_open` and `lsm/bprm_check_security` from the
    /// same plan its Landlock ruleset is built from (`sandbox::Grants::plan`). Without BPF LSM,
    /// refuses an agent whose contract requires `bpf_lsm`; otherwise notes that Landlock alone
    /// enforces the scopes.
    fn fs_prepare(
        &self,
        agent: &Agent,
        cg: &Cgroup,
        contract: Option<&contracts::Contract>,
    ) -> Result<Vec<String>, Error> {
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
        let mut policy = fs::Policy::from_plan(&plan, &|p| opener.resolve(p));
        let unix_note = match enforcer.unix_status() {
            Ok(()) => {
                let scope = self.unix_scope(agent, &plan.read_write, home_fd.as_ref())?;
                let line = scope.describe();
                policy.notes.extend(scope.notes.iter().cloned());
                policy.unix = Some(scope);
                line
            }
            Err(why) => format!("unix sockets (BPF LSM): not fenced by BPF LSM ({why})"),
        };
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
        notes.push(unix_note);
        if enforcer.pins().is_none() {
            notes.push(
                "filesystem (BPF LSM): programs NOT pinned (--bpf-pin-dir none, or no bpffs): detached while agentosd is down or restarting".into(),
            );
        }
        notes.extend(policy.notes.iter().cloned());
        Ok(notes)
    }

    /// The agent's scope for the pathname Unix socket fence: sockets made in its cgroup
    /// subtree, and beneath the daemon's socket directory for its tenant (made here when
    /// missing, as the socket mechanisms make it) and its write grants, opened as its Landlock
    /// rules are (no link followed).
    fn unix_scope(
        &self,
        agent: &Agent,
        write: &[std::path::PathBuf],
        home_fd: Option<&crate::safe_fs::Dir>,
    ) -> Result<fs::UnixScope, Error> {
        let mut socket_dirs: Vec<std::path::PathBuf> = Vec::new();
        let run_dirs = [
            self.mcp().map(|m| m.run_dir.clone()),
            self.models.get().map(|m| m.run_dir.clone()),
        ];
        for run_dir in run_dirs.into_iter().flatten() {
            super::mcp_socket::socket_dirs(&run_dir, &agent.tenant).map_err(|source| {
                Error::McpSocket {
                    agent: agent.id.clone(),
                    source,
                }
            })?;
            let dir = run_dir.join("agents").join(&agent.tenant);
            if !socket_dirs.contains(&dir) {
                socket_dirs.push(dir);
            }
        }
        let mut opener = crate::sandbox::landlock::Opener::new(home_fd.into_iter().collect());
        opener.system.extend(socket_dirs.iter().cloned());
        let dirs: Vec<std::path::PathBuf> = socket_dirs.iter().chain(write).cloned().collect();
        let open = |p: &std::path::Path| opener.open(p).ok().flatten().map(|(fd, _)| fd);
        Ok(fs::UnixScope::new(
            cgroup_id(agent.cgroup.path()),
            &dirs,
            &open,
        ))
    }

    /// Fill agent's entry in the BPF policy map from its contract's `net.connect` and `net.bind`
    /// grants (host names become name grants its DNS stub answers, started here, unless the
    /// daemon runs no stubs: then they are resolved now), keyed by the id of `cg`, which must exist. Returns notes for
    /// `agentctl status`. Without BPF, refuses an agent whose contract requires `cgroup_bpf`.
    async fn net_policy_prepare(
        &self,
        agent: &Agent,
        cg: &Cgroup,
        contract: Option<&contracts::Contract>,
    ) -> Result<Vec<String>, Error> {
        let required = contract.is_some_and(|c| {
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
        let (mut connect, bind) = (scopes("net.connect"), scopes("net.bind"));
        // The stub answers the contract's names; the gateway's loopback ports below are no reason
        // for one.
        let contract_connect = !connect.is_empty();
        // The model gateway's port on the loopback of its own network namespace.
        if self.gateway_port(contract) {
            connect.push(format!("127.0.0.1:{}", crate::models::tcp::TCP_PORT));
        }
        if let Some(port) = self
            .model_host_port(&agent.id, contract)
            .map_err(|e| Error::Unenforceable(format!("{}: the model gateway: {e}", agent.id)))?
        {
            connect.push(format!("127.0.0.1:{port}"));
        }
        let dns = self.dns().cloned();
        // With the daemon's DNS, names are grants (only /etc/hosts is read now); without it
        // they are resolved now, bounded: a start never hangs on DNS (and fails closed).
        let by_name = dns.is_some();
        let resolve = tokio::task::spawn_blocking(move || {
            if by_name {
                let hosts = |h: &str| net::hosts_file(std::path::Path::new("/etc/hosts"), h);
                net::policy_with_dns(&connect, &bind, &hosts)
            } else {
                net::policy_from_grants(&connect, &bind, &net::system_resolve)
            }
        });
        let mut policy = tokio::time::timeout(std::time::Duration::from_secs(15), resolve)
            .await
            .map_err(|_| {
                Error::Kernel(format!(
                    "agent {}: resolving its net.connect hosts took over 15 s; not started",
                    agent.id
                ))
            })?
            .map_err(|e| Error::Kernel(format!("resolving net.connect hosts: {e}")))?
            .map_err(|e| Error::InvalidContract(format!("agent {}: {e}", agent.id)))?;
        policy.dns &= contract_connect;
        let id = cgroup_id(cg.path());
        if let Some(dns) = dns.filter(|_| policy.dns) {
            // A re-adopted agent's pinned policy names its stub's port: the same one again.
            let pinned = enforcer
                .policy_of(id)
                .map(|p| p.dns_port)
                .filter(|p| *p != 0);
            let spec = crate::dns::StubSpec {
                agent_id: agent.id.clone(),
                tenant: agent.tenant.clone(),
                name: agent.name.clone(),
                contract: contract.map(|c| c.name().to_string()).unwrap_or_default(),
                cgroup_id: id,
                grants: policy.names.clone(),
                static_connect: policy.rules.clone(),
            };
            policy.dns_port = dns
                .start(spec, pinned)
                .map_err(|e| Error::Kernel(format!("agent {}: DNS stub: {e}", agent.id)))?;
            policy.dns6 = dns.serves_v6(&agent.id);
        }
        enforcer
            .set_policy(&agent.id, &agent.tenant, &agent.name, id, &policy)
            .map_err(|e| Error::Kernel(format!("agent {}: network policy: {e}", agent.id)))?;
        let mut notes = vec![format!("network (cgroup BPF): {}", policy.describe())];
        notes.extend(policy.notes.iter().map(|n| format!("network: {n}")));
        Ok(notes)
    }
}

/// The cgroup id of a cgroup2 directory: its inode number (what `bpf_get_current_cgroup_id()`
/// returns for tasks in it); 0 when it cannot be read.
pub(super) fn cgroup_id(path: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata(path).map(|m| m.ino()).unwrap_or(0)
}

/// BPF LSM filesystem scopes (`lsm/file_open`, `lsm/bprm_check_security`) keyed by `main`.
pub(super) struct FsScopes<'s>(pub &'s Supervisor);

impl Mechanism for FsScopes<'_> {
    fn name(&self) -> &'static str {
        "fs"
    }

    fn prepare(&self, run: &RunCtx<'_>, out: &mut Prepared) -> Result<(), Error> {
        let notes = self.0.fs_prepare(run.agent, run.main, run.contract)?;
        out.notes.extend(notes);
        Ok(())
    }

    fn adopt(&self, run: &RunCtx<'_>) -> Vec<String> {
        let r = self.0.fs_prepare(run.agent, run.main, run.contract);
        r.err()
            .map(|e| format!("filesystem policy: {e}"))
            .into_iter()
            .collect()
    }

    fn release(&self, agent_id: &str) {
        if let Ok(f) = self.0.fs() {
            f.clear(agent_id);
        }
    }
}

/// The cgroup BPF network policy (`net.connect`, `net.bind`) keyed by `main`.
pub(super) struct NetPolicy<'s>(pub &'s Supervisor);

impl RunMechanism for NetPolicy<'_> {
    fn name(&self) -> &'static str {
        "net"
    }

    fn prepare<'a>(
        &'a self,
        run: &'a RunCtx<'a>,
        out: &'a mut Prepared,
    ) -> Boxed<'a, Result<(), Error>> {
        Box::pin(async move {
            let notes = self
                .0
                .net_policy_prepare(run.agent, run.main, run.contract)
                .await?;
            out.notes.extend(notes);
            Ok(())
        })
    }

    fn adopt<'a>(&'a self, run: &'a RunCtx<'a>) -> Boxed<'a, Vec<String>> {
        Box::pin(async move {
            let r = self
                .0
                .net_policy_prepare(run.agent, run.main, run.contract)
                .await;
            r.err()
                .map(|e| format!("network policy: {e}"))
                .into_iter()
                .collect()
        })
    }

    fn release(&self, agent_id: &str) {
        if let Some(d) = self.0.dns() {
            d.stop(agent_id);
        }
        if let Ok(n) = self.0.net() {
            n.clear(agent_id);
        }
    }
}

/// Per-agent syscall counts (`agentosd --syscall-counts`) keyed by `main`.
pub(super) struct SyscCounts<'s>(pub &'s Supervisor);

impl SyscCounts<'_> {
    /// A note when counting cannot start (never a refusal: counts are for the operator).
    fn add(&self, run: &RunCtx<'_>) -> Option<String> {
        let c = self.0.sysc().ok()?;
        let e = c.add(&run.agent.id, cgroup_id(run.main.path())).err()?;
        Some(format!("syscall counts: {e}"))
    }
}

impl Mechanism for SyscCounts<'_> {
    fn name(&self) -> &'static str {
        "sysc"
    }

    fn prepare(&self, run: &RunCtx<'_>, out: &mut Prepared) -> Result<(), Error> {
        out.notes.extend(self.add(run));
        Ok(())
    }

    fn adopt(&self, run: &RunCtx<'_>) -> Vec<String> {
        self.add(run).into_iter().collect()
    }

    fn release(&self, agent_id: &str) {
        if let Ok(c) = self.0.sysc() {
            c.remove(agent_id);
        }
    }
}
