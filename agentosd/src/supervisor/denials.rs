//! Kernel denials: the BPF ring buffer readers and the kernel audit reader, each denial counted
//! per agent and appended to the audit trail; lost records reported, never silently.

use std::sync::{Arc, Mutex};

use audit::Decision;
use serde_json::json;

use super::{Supervisor, lock};
use crate::audit_trail::AuditTrail;
use crate::enforce::fs;
use crate::enforce::net;
use crate::enforce::{errno_name, kaudit};

impl Supervisor {
    pub(super) fn audit_fs_denial(&self, d: &fs::Denial) {
        let (tenant, name) = self
            .fs()
            .ok()
            .and_then(|f| f.agent_of(d.cgroup_id))
            .unwrap_or_default();
        if !self.count_denial(&tenant, &name, d.hook) {
            return;
        }
        tracing::info!(
            agent = %format!("{tenant}/{name}"),
            "kernel denied {} {} of {} ({}, {})", d.syscall, d.access, d.path, d.hook,
            errno_name(d.errno)
        );
        let Some(t) = self.audit_trail() else {
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
        if let Some(d) = self.dns()
            && let Some(mut rx) = d.take_refusals()
        {
            let sup = self.clone();
            tokio::spawn(async move {
                while let Some(r) = rx.recv().await {
                    sup.audit_dns_refusal(&r);
                }
            });
        }
        if let Some(d) = self.dns()
            && let Some(mut rx) = d.take_sni_refusals()
        {
            let sup = self.clone();
            tokio::spawn(async move {
                while let Some(r) = rx.recv().await {
                    sup.audit_sni_refusal(&r);
                }
            });
        }
        let sup = self.clone();
        tokio::spawn(async move {
            let (mut seen_net, mut seen_fs, mut seen_queue) = (0u64, 0u64, 0u64);
            loop {
                tokio::time::sleep(std::time::Duration::from_secs(2)).await;
                let trail = sup.audit_trail();
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
                sup.report_suppressed();
            }
        });
    }

    /// Count one denial of agent `tenant/name` (its `Denials`), and say whether it gets a record
    /// (and a log line) of its own, or is counted for the agent's next "denials-suppressed"
    /// summary (rate limit per agent).
    fn count_denial(&self, tenant: &str, name: &str, hook: &str) -> bool {
        self.note_denial(tenant, name);
        let agent = if name.is_empty() {
            String::new()
        } else {
            format!("{tenant}/{name}")
        };
        lock(&self.record_limit).admit(&agent, hook, std::time::Instant::now())
    }

    /// Whether a D-Bus call refused to `uid` gets a `refused-call` record of its own, or is
    /// counted for that uid's next "refused-calls-suppressed" summary. A local user or an agent
    /// looping over calls it may not make (every agent can reach the system bus below Landlock
    /// ABI 9) writes a bounded number of records a second, like an agent's kernel denials.
    pub fn admit_refused_call(&self, uid: u32, method: &str) -> bool {
        lock(&self.call_limit).admit(&format!("uid {uid}"), method, std::time::Instant::now())
    }

    /// One record per caller whose refused D-Bus calls were over the record rate since the
    /// last report: how many, by method, over how long.
    fn report_suppressed_calls(&self) {
        let summaries = lock(&self.call_limit).summaries(std::time::Instant::now());
        let limits = self.config().denial_records;
        for s in summaries {
            tracing::warn!(
                caller = %s.agent,
                "{} refused D-Bus call(s) over the record rate ({}/s, burst {}) in {} ms: counted, not recorded one by one",
                s.suppressed, limits.per_sec, limits.burst, s.window.as_millis()
            );
            let Some(t) = self.audit_trail() else {
                continue;
            };
            let uid = s
                .agent
                .strip_prefix("uid ")
                .and_then(|u| u.parse::<u32>().ok());
            t.submit_or_count(t.lifecycle(
                "",
                "",
                "refused-calls-suppressed",
                Some(Decision::Deny),
                json!({
                    "count": s.suppressed,
                    "by": s.by,
                    "window_ms": s.window.as_millis() as u64,
                    "caller": {"uid": uid},
                    "limit": {"per_sec": limits.per_sec, "burst": limits.burst},
                }),
            ));
        }
    }

    /// One record per agent whose denials were over its rate since the last report: how many,
    /// by hook, over how long. The suppressed denials are counted, never silently lost.
    pub(super) fn report_suppressed(&self) {
        self.report_suppressed_calls();
        let summaries = lock(&self.record_limit).summaries(std::time::Instant::now());
        let limits = self.config().denial_records;
        for s in summaries {
            let (tenant, name) = s.agent.split_once('/').unwrap_or(("", ""));
            tracing::warn!(
                agent = %s.agent,
                "{} kernel denial(s) over the record rate ({}/s, burst {}) in {} ms: counted, not recorded one by one",
                s.suppressed, limits.per_sec, limits.burst, s.window.as_millis()
            );
            let Some(t) = self.audit_trail() else {
                continue;
            };
            let rec = if name.is_empty() {
                audit::Record::new(audit::Kind::Denial, "", "")
            } else {
                t.agent_record(audit::Kind::Denial, tenant, name)
            };
            t.submit_or_count(rec.decision(Decision::Deny).detail(json!({
                "event": "denials-suppressed",
                "count": s.suppressed,
                "by": s.by,
                "window_ms": s.window.as_millis() as u64,
                "agent": s.agent,
                "limit": {"per_sec": limits.per_sec, "burst": limits.burst},
            })));
        }
    }

    /// A name the agent's DNS stub refused (NXDOMAIN: not granted; REFUSED: too long, odd
    /// bytes) or an address it stripped from an answer (STRIPPED: rebinding), rate-limited like
    /// the kernel's denials.
    pub(super) fn audit_dns_refusal(&self, r: &crate::dns::Refusal) {
        if !self.count_denial(&r.tenant, &r.name, "dns-stub") {
            return;
        }
        tracing::info!(
            agent = %r.agent_id,
            "DNS stub refused {:?} (type {}, {}{}; contract {})",
            r.qname,
            r.qtype,
            r.reason,
            r.addr.map(|a| format!(" {a}")).unwrap_or_default(),
            r.contract
        );
        let Some(t) = self.audit_trail() else {
            return;
        };
        let rcode = match r.reason {
            "not-granted" => "NXDOMAIN",
            // An address stripped from a granted name's answer (rebinding): the rest goes.
            _ if r.addr.is_some() => "STRIPPED",
            _ => "REFUSED",
        };
        let rec = t
            .agent_record(audit::Kind::Denial, &r.tenant, &r.name)
            .decision(Decision::Deny)
            .detail(json!({
                "syscall": "dns-query",
                "effect": rcode,
                "mechanism": "dns-stub",
                "hook": "dns-stub",
                "name": r.qname,
                "qtype": r.qtype,
                "reason": r.reason,
                "addr": r.addr.map(|a| a.to_string()),
                "contract": r.contract,
            }));
        t.submit_or_count(rec);
    }

    /// A connection the SNI/Host proxy reset (a checked grant's name not carried, or not
    /// readable), rate-limited like the kernel's denials.
    pub(super) fn audit_sni_refusal(&self, r: &crate::dns::sni::Refusal) {
        if !self.count_denial(&r.tenant, &r.name, "sni-proxy") {
            return;
        }
        let Some(t) = self.audit_trail() else {
            return;
        };
        let rec = t
            .agent_record(audit::Kind::Denial, &r.tenant, &r.name)
            .decision(Decision::Deny)
            .detail(json!({
                "syscall": "connect",
                "effect": "reset",
                "mechanism": "sni-proxy",
                "hook": "sni-proxy",
                "check": r.check,
                "seen": r.seen,
                "grant": r.grants,
                "addr": r.dst.ip().to_string(),
                "port": r.dst.port(),
                "answered_for": r.answered_for,
                "reason": r.reason,
                "detail": r.detail,
                "contract": r.contract,
            }));
        t.submit_or_count(rec);
    }

    pub(super) fn audit_denial(&self, d: &net::Denial) {
        let (tenant, name) = self
            .net()
            .ok()
            .and_then(|n| n.agent_of(d.cgroup_id))
            .unwrap_or_default();
        if !self.count_denial(&tenant, &name, d.hook) {
            return;
        }
        // The name the agent's stub answered this address for, if it did (expired or not).
        let asked = self.dns().and_then(|dns| dns.name_of(d.cgroup_id, d.addr));
        let for_name = asked
            .as_ref()
            .map(|n| format!(" (answered for {n})"))
            .unwrap_or_default();
        match d.errno() {
            Some(errno) => tracing::info!(
                agent = %format!("{tenant}/{name}"),
                "kernel denied {} to {}:{}{for_name} ({}, {})", d.syscall, d.addr, d.port, d.hook,
                errno_name(errno)
            ),
            None => tracing::info!(
                agent = %format!("{tenant}/{name}"),
                "kernel dropped a packet from {}:{} ({})", d.addr, d.port, d.hook
            ),
        }
        let Some(t) = self.audit_trail() else {
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
                "name": asked,
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

    /// Read Landlock and seccomp denials from the kernel's audit log (enforce/kaudit/) on a
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

    pub(super) fn audit_kernel_output(&self, o: Result<kaudit::Output, kaudit::Loss>) {
        let Some(t) = self.audit_trail() else {
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
        if !self.count_denial(&tenant, &name, d.mechanism) {
            return;
        }
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
}

/// A record for kernel denials the audit queue had no room for since the last call.
/// A BPF ring buffer was full: say how many denial events were lost (counted by the program),
/// in the log and as a record of its own, never silently.
pub(super) fn report_ring_drops(
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

pub(super) fn report_queue_drops(t: &AuditTrail, seen: &mut u64) {
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
    pub(super) fn by_uid(&self, uid: u32) -> Option<String> {
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
