//! The supervisor's hooks into the audit trail (and the kernel enforcement added at start): kept
//! out of supervisor.rs so the lifecycle code reads as before. A child module of `supervisor`, so
//! it sees the agents' private state.

use std::sync::{Arc, Mutex};

use audit::Decision;
use serde_json::{Value, json};

use super::{Agent, Error, State, Supervisor, lock};
use crate::audit_trail::AuditTrail;
use crate::cgroup::Cgroup;
use crate::enforce::fs::{self, FsEnforcer};
use crate::enforce::net::{self, NetEnforcer};
use crate::enforce::sysc::SyscCounter;
use crate::enforce::{errno_name, kaudit};
use crate::sys::ExitStatus;

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
    fn fs_prepare(&self, agent: &Agent, cg: &Cgroup) -> Result<Vec<String>, Error> {
        let contract = super::agent_contract(agent)?;
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
    async fn net_policy_prepare(&self, agent: &Agent, cg: &Cgroup) -> Result<Vec<String>, Error> {
        let contract = super::agent_contract(agent)?;
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

    fn audit_fs_denial(&self, d: &fs::Denial) {
        let (tenant, name) = self
            .fs()
            .ok()
            .and_then(|f| f.agent_of(d.cgroup_id))
            .unwrap_or_default();
        self.note_denial(&tenant, &name);
        tracing::info!(
            agent = %format!("{tenant}/{name}"),
            "kernel denied {} {} of {} ({}, {})", d.syscall, d.access, d.path, d.hook,
            errno_name(d.errno)
        );
        let Some(t) = self.audit.get() else {
            return;
        };
        let rec = t
            .agent_record(audit::Kind::Denial, &tenant, &name)
            .decision(Decision::Deny)
            .detail(json!({
                "syscall": d.syscall,
                "errno": errno_name(d.errno),
                "errno_num": d.errno,
                "mechanism": "bpf-lsm",
                "hook": d.hook,
                "path": d.path,
                "path_cut": d.path_cut,
                "access": d.access,
                "granted": d.granted,
                "open_flags": d.flags,
                "pid": d.pid,
                "tid": d.tid,
                "comm": d.comm,
                "reason": "not-granted",
                "cgroup_id": d.cgroup_id,
            }));
        t.submit_or_count(rec);
    }

    /// Read the BPF ring buffers (network, filesystem) and append every denial to the audit
    /// trail as a kernel denial; every 2 s, report what was lost (ring buffer full, audit queue
    /// full: counted) as records too, never silently.
    pub fn spawn_denial_reader(self: &Arc<Self>) {
        if let Ok(n) = self.net()
            && let Some(ring) = n.take_events()
        {
            let sup = self.clone();
            tokio::spawn(async move {
                net::read_events(ring, |d| sup.audit_denial(&d)).await;
            });
        }
        if let Ok(f) = self.fs()
            && let Some(ring) = f.take_events()
        {
            let sup = self.clone();
            tokio::spawn(async move {
                fs::read_events(ring, |d| sup.audit_fs_denial(&d)).await;
            });
        }
        let sup = self.clone();
        tokio::spawn(async move {
            let (mut seen_net, mut seen_fs, mut seen_queue) = (0u64, 0u64, 0u64);
            loop {
                tokio::time::sleep(std::time::Duration::from_secs(2)).await;
                let trail = sup.audit.get();
                if let Some(t) = trail {
                    report_queue_drops(t, &mut seen_queue);
                }
                if let Ok(n) = sup.net() {
                    let dropped = n.stats().events_dropped;
                    let (w, m) = ("bpf ring buffer full", "cgroup-bpf");
                    report_ring_drops(trail, dropped, &mut seen_net, w, m);
                }
                if let Ok(f) = sup.fs() {
                    let dropped = f.stats().events_dropped;
                    let (w, m) = ("bpf lsm ring buffer full", "bpf-lsm");
                    report_ring_drops(trail, dropped, &mut seen_fs, w, m);
                }
            }
        });
    }

    fn audit_denial(&self, d: &net::Denial) {
        let (tenant, name) = self
            .net()
            .ok()
            .and_then(|n| n.agent_of(d.cgroup_id))
            .unwrap_or_default();
        self.note_denial(&tenant, &name);
        match d.errno() {
            Some(errno) => tracing::info!(
                agent = %format!("{tenant}/{name}"),
                "kernel denied {} to {}:{} ({}, {})", d.syscall, d.addr, d.port, d.hook,
                errno_name(errno)
            ),
            None => tracing::info!(
                agent = %format!("{tenant}/{name}"),
                "kernel dropped a datagram from {}:{} ({})", d.addr, d.port, d.hook
            ),
        }
        let Some(t) = self.audit.get() else {
            return;
        };
        let rec = t
            .agent_record(audit::Kind::Denial, &tenant, &name)
            .decision(Decision::Deny)
            .detail(json!({
                "syscall": d.syscall,
                "errno": d.errno().map(errno_name),
                "errno_num": d.errno(),
                "effect": if d.errno().is_some() { "refused" } else { "dropped" },
                "mechanism": if d.hook.starts_with("lsm/") { "bpf-lsm" } else { "cgroup-bpf" },
                "hook": d.hook,
                "family": d.family,
                "protocol": d.protocol,
                "addr": d.addr.to_string(),
                "port": d.port,
                "pid": d.pid,
                "tid": d.tid,
                "comm": d.comm,
                "reason": d.reason,
                "cgroup_id": d.cgroup_id,
            }));
        t.submit_or_count(rec);
    }

    /// Kernel denials reported for agent `id` since the daemon started: cgroup BPF and BPF LSM
    /// (the network and filesystem enforcers' counts) plus Landlock and seccomp (from the kernel audit log).
    pub(super) fn kernel_denials(&self, id: &str) -> u64 {
        lock(&self.denials).get(id).copied().unwrap_or(0)
    }

    /// Count one kernel denial of agent `tenant/name` (an empty name: not an agent's).
    fn note_denial(&self, tenant: &str, name: &str) {
        if !name.is_empty() {
            *lock(&self.denials)
                .entry(format!("{tenant}/{name}"))
                .or_default() += 1;
        }
    }

    /// Read Landlock and seccomp denials from the kernel's audit log (enforce/kaudit.rs) on a
    /// thread of its own and append those of agents to the audit trail; say loudly at start
    /// what the kernel will not report, and report lost records, never silently.
    pub fn spawn_kernel_audit_reader(self: &Arc<Self>) {
        for gap in kaudit::gaps() {
            tracing::warn!("kernel denials: {gap}");
        }
        let fd = match kaudit::open_readlog() {
            Ok(fd) => fd,
            Err(e) => {
                tracing::warn!(
                    "kernel denials: {e}: Landlock and seccomp denials of agents are not recorded"
                );
                return;
            }
        };
        let sup = self.clone();
        let who = AgentsOfProcesses {
            sup: self.clone(),
            uids: Mutex::new((None, Default::default())),
        };
        let spawned = std::thread::Builder::new()
            .name("kaudit".into())
            .spawn(move || {
                kaudit::run(fd, &who, |o| sup.audit_kernel_output(o), || false);
            });
        if let Err(e) = spawned {
            tracing::warn!("kernel denials: cannot start the reader thread: {e}");
            return;
        }
        tracing::info!("kernel denials: reading Landlock and seccomp audit records");
    }

    fn audit_kernel_output(&self, o: Result<kaudit::Output, kaudit::Loss>) {
        let Some(t) = self.audit.get() else {
            return;
        };
        let (d, who) = match o {
            Ok(kaudit::Output::Denial(d, who)) => (d, who),
            Err(loss) => {
                let detail = match loss {
                    kaudit::Loss::SocketOverrun { times, total } => {
                        tracing::warn!(
                            "kernel audit socket overrun {times} time(s): Landlock/seccomp denial records were lost (how many, the kernel does not say)"
                        );
                        json!({"event": "denials-dropped", "where": "audit netlink socket overrun",
                               "mechanism": "landlock/seccomp", "count": null,
                               "overruns": times, "total_overruns": total})
                    }
                    kaudit::Loss::KernelLost { count, total } => {
                        tracing::warn!(
                            "the kernel lost {count} audit record(s) (host-wide, backlog or rate limit)"
                        );
                        json!({"event": "denials-dropped", "where": "kernel audit backlog (host-wide)",
                               "mechanism": "landlock/seccomp", "count": count, "total": total})
                    }
                };
                t.submit(
                    audit::Record::new(audit::Kind::Denial, "", "")
                        .decision(Decision::Deny)
                        .detail(detail),
                );
                return;
            }
        };
        let (tenant, name) = who
            .as_ref()
            .map(|w| (w.tenant.clone(), w.name.clone()))
            .unwrap_or_default();
        self.note_denial(&tenant, &name);
        tracing::info!(
            agent = %format!("{tenant}/{name}"),
            "kernel denied {} ({}, {})",
            d.syscall,
            d.mechanism,
            d.errno.unwrap_or(d.action)
        );
        let mut detail = d.detail();
        detail["attribution"] = json!(who.as_ref().map_or("none", |w| w.by));
        t.submit_or_count(
            t.agent_record(audit::Kind::Denial, &tenant, &name)
                .decision(Decision::Deny)
                .detail(detail),
        );
    }

    /// Queue a lifecycle record about `agent` (not waited for).
    pub(super) fn audit_event(
        &self,
        agent: &Agent,
        event: &str,
        decision: Option<Decision>,
        detail: Value,
    ) {
        if let Some(t) = self.audit.get() {
            t.submit(t.lifecycle(&agent.tenant, &agent.name, event, decision, detail));
        }
    }

    /// A start refused before anything ran (bad contract, unenforceable, unschedulable, already
    /// running…).
    pub(super) fn audit_refused(&self, tenant: &str, name: &str, origin: &str, e: &Error) {
        if let Some(t) = self.audit.get() {
            t.submit(t.lifecycle(
                tenant,
                name,
                "refused",
                Some(Decision::Deny),
                json!({"reason": e.to_string(), "error": e.dbus_name(), "origin": origin}),
            ));
        }
    }

    /// Bind the agent's contract against the host offer, remember the binding hash for its
    /// records, and return the detail fields that describe it.
    fn bind_for_audit(&self, t: &AuditTrail, agent: &Agent) -> Value {
        let (text, origin) = {
            let i = lock(&agent.inner);
            (i.contract.clone(), i.origin.clone())
        };
        let mut detail = json!({"origin": origin});
        let parsed = if text.trim().is_empty() {
            None
        } else {
            contracts::parse_contract(&text, &origin).ok()
        };
        let mut hash = None;
        if let Some(c) = &parsed {
            detail["contract_sha256"] = json!(c.sha256());
            let offer = self.offer.get().cloned().unwrap_or_default();
            match crate::audit_trail::binding_hash(c, &offer) {
                Ok(h) => hash = Some(h),
                Err(why) => detail["binding"] = json!(format!("not bound: {why}")),
            }
        }
        t.set_binding(&agent.id, hash);
        detail
    }

    /// The main process of a run ended (the restart decision is in `state`/`result`).
    pub(super) fn audit_exit(&self, agent: &Agent, pid: Option<u32>, status: &ExitStatus) {
        let (state, result) = {
            let i = lock(&agent.inner);
            (i.state, i.result.clone())
        };
        let event = match state {
            State::Failed => "failed",
            State::Restarting => "exited-restarting",
            _ => "exited",
        };
        let code = match status {
            ExitStatus::Exited(c) => json!({"exit_code": c}),
            ExitStatus::Signaled(s) => json!({"signal": s}),
            ExitStatus::Unknown => json!({"status": "unknown"}),
        };
        let mut detail = json!({
            "pid": pid.unwrap_or(0),
            "status": status.describe(),
            "state": state.as_str(),
            "result": result,
        });
        if let (Value::Object(d), Value::Object(c)) = (&mut detail, code) {
            d.extend(c);
        }
        self.audit_event(agent, event, None, detail);
    }

    /// A running agent found again after a daemon restart.
    pub(super) async fn audit_readopted(&self, agent: &Agent, pid: u32) {
        let Some(t) = self.audit.get() else {
            return;
        };
        let mut detail = self.bind_for_audit(t, agent);
        detail["pid"] = json!(pid);
        detail["cgroup"] = json!(agent.cgroup.path().display().to_string());
        detail["cgroup_id"] = json!(cgroup_id(agent.cgroup.path()));
        t.submit(t.lifecycle(&agent.tenant, &agent.name, "re-adopted", None, detail));
    }

    /// Before a run starts: bind the contract (its binding hash goes into this agent's records)
    /// and make the `start` decision durable. When the trail cannot be written the start is
    /// refused: nothing runs that the audit trail does not know about (fail closed).
    pub(super) async fn audit_start(&self, agent: &Agent) -> Result<(), Error> {
        let Some(t) = self.audit.get() else {
            return Ok(());
        };
        let restarts = lock(&agent.inner).restarts;
        let mut detail = self.bind_for_audit(t, agent);
        detail["restarts"] = json!(restarts);
        if let Err(why) = t.health() {
            return Err(Error::Unenforceable(format!(
                "agent {}: not started: the audit trail cannot be written ({why}); agentosd refuses new starts until the log is writable again (fail closed)",
                agent.id
            )));
        }
        let rec = t.lifecycle(
            &agent.tenant,
            &agent.name,
            "start",
            Some(Decision::Allow),
            detail,
        );
        t.commit(rec).await.map(|_| ()).map_err(|e| {
            Error::Unenforceable(format!(
                "agent {}: not started: the audit trail cannot be written ({e}); agentosd refuses new starts until the log is writable again (fail closed)",
                agent.id
            ))
        })
    }
}

/// A record for kernel denials the audit queue had no room for since the last call.
/// A BPF ring buffer was full: say how many denial events were lost (counted by the program),
/// in the log and as a record of its own, never silently.
fn report_ring_drops(
    trail: Option<&Arc<AuditTrail>>,
    dropped: u64,
    seen: &mut u64,
    where_: &str,
    mechanism: &str,
) {
    if dropped <= *seen {
        return;
    }
    tracing::warn!(
        "{where_}: {} denial event(s) were not reported individually (counted)",
        dropped - *seen
    );
    if let Some(t) = trail {
        t.submit(
            audit::Record::new(audit::Kind::Denial, "", "")
                .decision(Decision::Deny)
                .detail(json!({
                    "event": "denials-dropped",
                    "where": where_,
                    "mechanism": mechanism,
                    "count": dropped - *seen,
                    "total": dropped,
                })),
        );
    }
    *seen = dropped;
}

fn report_queue_drops(t: &AuditTrail, seen: &mut u64) {
    let q = t.dropped();
    if q > *seen {
        tracing::warn!(
            "audit queue full: {} kernel denial record(s) not written (counted)",
            q - *seen
        );
        t.submit(
            audit::Record::new(audit::Kind::Denial, "", "")
                .decision(Decision::Deny)
                .detail(json!({
                    "event": "denials-dropped",
                    "where": "audit queue full",
                    "count": q - *seen,
                    "total": q,
                })),
        );
        *seen = q;
    }
}

/// Finds the agent of a process for the kernel audit reader: by its cgroup, read at once
/// (identity from the kernel), else — the process is gone — by its uid, which is the agent's
/// own (sandbox/identity.rs; never reused for another agent).
struct AgentsOfProcesses {
    sup: Arc<Supervisor>,
    /// uid → `tenant/name` from `uids.json`, and when it was last read.
    uids: Mutex<(
        Option<std::time::Instant>,
        std::collections::HashMap<u32, String>,
    )>,
}

impl AgentsOfProcesses {
    fn by_uid(&self, uid: u32) -> Option<String> {
        let mut g = lock(&self.uids);
        if let Some(id) = g.1.get(&uid) {
            return Some(id.clone());
        }
        // Re-read on a miss, at most once a second (records of processes that are not agents
        // miss every time).
        if g.0
            .is_some_and(|t| t.elapsed() < std::time::Duration::from_secs(1))
        {
            return None;
        }
        let path = crate::sandbox::identity::table_path(&self.sup.cfg.state_dir);
        let table: std::collections::BTreeMap<String, u32> = std::fs::read(&path)
            .ok()
            .and_then(|d| serde_json::from_slice(&d).ok())
            .unwrap_or_default();
        g.1 = table.into_iter().map(|(id, u)| (u, id)).collect();
        g.0 = Some(std::time::Instant::now());
        g.1.get(&uid).cloned()
    }
}

impl kaudit::Attribute for AgentsOfProcesses {
    fn attribute(&self, pid: Option<u32>, uid: Option<u32>) -> Option<kaudit::Attribution> {
        if let Some(cg) = pid.and_then(|p| crate::cgroup::proc_cgroup(&p.to_string())) {
            let mount = self.sup.cgroup_mount();
            for a in self.sup.agents() {
                let Ok(rel) = a.cgroup.path().strip_prefix(mount) else {
                    continue;
                };
                let rel = format!("/{}", rel.display());
                if cg == rel || cg.starts_with(&format!("{rel}/")) {
                    return Some(kaudit::Attribution {
                        tenant: a.tenant.clone(),
                        name: a.name.clone(),
                        by: "cgroup",
                    });
                }
            }
        }
        let id = self.by_uid(uid?)?;
        let (tenant, name) = id.split_once('/')?;
        Some(kaudit::Attribution {
            tenant: tenant.to_string(),
            name: name.to_string(),
            by: "uid",
        })
    }
}

/// The cgroup id of a cgroup2 directory: its inode number (what `bpf_get_current_cgroup_id()`
/// returns for tasks in it); 0 when it cannot be read.
pub(super) fn cgroup_id(path: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata(path).map(|m| m.ino()).unwrap_or(0)
}

/// The tool runners' hook into the cgroup BPF network policy (see [`crate::tools::CgroupHooks`]):
/// a tool cgroup (under its agent, so under `agents/` where the programs are attached) gets an
/// entry built from the tool's effective grants, attributed to its agent.
#[derive(Debug)]
struct ToolCgroupHooks {
    sup: std::sync::Weak<Supervisor>,
}

/// The key of a tool cgroup's entry in the enforcers' agent table.
fn tool_key(cg: &Cgroup) -> String {
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

impl Supervisor {
    /// What the tool runners call for each tool cgroup (`RunnerConfig::hooks`).
    pub fn tool_cgroup_hooks(self: &Arc<Self>) -> Arc<dyn crate::tools::CgroupHooks> {
        Arc::new(ToolCgroupHooks {
            sup: Arc::downgrade(self),
        })
    }
}
