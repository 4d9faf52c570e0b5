//! The daemon's audit trail: the `audit` crate's hash-chained log, opened at start under the
//! state directory with the host signing key, plus what the daemon adds: one record builder for
//! agent lifecycle events and kernel denials, the agents' binding hashes, and fail-closed health.
//!
//! Async callers never wait for `fdatasync` on a runtime thread: [`AuditTrail::commit`] queues
//! with `try_append_then` and awaits a oneshot; [`AuditTrail::submit`] queues and returns. When a
//! write or sync fails, the log accepts nothing more and [`AuditTrail::health`] says why: the
//! supervisor then refuses new starts and the gate refuses tool calls (invariant 1). When the
//! failure was a full file system, [`AuditTrail::recover`] (called by the storage watcher,
//! storage/) opens the log again once there is room: the chain continues, no restart needed.
//! While storage is low, refusals are counted in summary records rather than written one by one,
//! and every record is charged to its agent (the offenders are refused first). See
//! docs/audit.md, "In the daemon", and docs/daemon.md, "Storage reserve".
//!
//! Every record about an agent also carries the agent's CPU account ([`AuditTrail::costed`]):
//! the log's writer and syncer threads charge it their CPU for the record's share of each batch
//! (issue 15, "Isolation measured"; `audit::Cost`), so an agent's flood of allowed tool calls
//! costs its own CPU share the audit trail's work too.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use audit::{Ack, AppendError, Decision, Kind, Log, LogOptions, Record};
use serde_json::{Value, json};
use tracing::{error, info, warn};

use crate::ipc::cpu::CpuLedger;
use crate::storage::Storage;

tokio::task_local! {
    /// The D-Bus caller on whose behalf the current task acts (the `caller` object of
    /// [`crate::authz::Caller::to_json`]); set by dbus/ around every method call, so that
    /// every lifecycle record made while serving the call names who asked.
    pub static CALLER: Value;
}

/// Why the trail could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum TrailError {
    #[error(transparent)]
    Key(#[from] audit::key::KeyError),
    #[error(transparent)]
    Open(#[from] audit::OpenError),
    #[error("audit directory {path}: {source}")]
    Dir {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Where the trail lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrailPaths {
    /// Directory of `audit.log` and `audit.head` (default `STATE_DIR/audit`).
    pub dir: PathBuf,
    /// The private signing key (default `STATE_DIR/audit.key`); its public key is `KEY.pub`.
    pub key: PathBuf,
}

impl TrailPaths {
    /// The defaults under a state directory.
    pub fn under(state_dir: &Path) -> Self {
        TrailPaths {
            dir: state_dir.join("audit"),
            key: state_dir.join("audit.key"),
        }
    }
}

/// The failure state of one opened log (a new one after [`AuditTrail::recover`], so that late
/// completions of the old log cannot fail the new one).
#[derive(Default)]
struct Shared {
    /// The first failure; once set, nothing more is accepted.
    failed: Mutex<Option<String>>,
    /// Told of a failure at once (it may be the disk filling).
    storage: Option<Arc<Storage>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    fn fail(&self, why: &str) {
        let mut f = lock(&self.failed);
        if f.is_none() {
            error!(
                "audit trail failed: {why}; new agent starts and tool calls are refused until the log is writable again (after a full file system it is reopened by itself once space returns; otherwise restart agentosd)"
            );
            *f = Some(why.to_string());
        }
        drop(f);
        if let Some(s) = &self.storage {
            s.kick();
        }
    }
}

/// The log in use and its failure state.
struct Generation {
    log: Option<Arc<Log>>,
    shared: Arc<Shared>,
    /// The log failed for want of space: [`AuditTrail::recover`] opens it again.
    reopen: bool,
}

/// The open audit trail.
pub struct AuditTrail {
    current: Mutex<Generation>,
    path: PathBuf,
    /// Where the log is and how it is opened (for [`AuditTrail::recover`]).
    dir: PathBuf,
    opts: Option<LogOptions>,
    storage: Option<Arc<Storage>>,
    /// Agent id (`tenant/name`) → its sealed binding manifest hash.
    bindings: Mutex<HashMap<String, String>>,
    /// Best-effort records (kernel denials) not queued because the queue was full.
    dropped: std::sync::atomic::AtomicU64,
    /// The agents' CPU accounts the log's CPU for their records is charged to (none yet: to
    /// nobody).
    cpu: OnceLock<Arc<CpuLedger>>,
}

impl std::fmt::Debug for AuditTrail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditTrail")
            .field("path", &self.path)
            .finish()
    }
}

/// Creates the signing key if it is missing (0600, and `KEY.pub` 0644); returns whether it was
/// created and the public key path.
pub fn ensure_key(key: &Path) -> Result<(bool, PathBuf), TrailError> {
    let existed = key.exists();
    if let Some(parent) = key.parent() {
        std::fs::create_dir_all(parent).map_err(|source| TrailError::Dir {
            path: parent.to_path_buf(),
            source,
        })?;
    }
    audit::key::load_or_create(key)?;
    Ok((!existed, audit::key::public_path(key)))
}

impl AuditTrail {
    /// Opens (or creates) the log in `paths.dir` with the key at `paths.key` (created 0600 when
    /// missing). Forwards records to the journal when `journal` and its socket exists. With
    /// `storage`, records are charged to their agents and refusals summarised while it is low.
    pub fn open(
        paths: &TrailPaths,
        journal: bool,
        storage: Option<Arc<Storage>>,
    ) -> Result<Arc<AuditTrail>, TrailError> {
        std::fs::create_dir_all(&paths.dir).map_err(|source| TrailError::Dir {
            path: paths.dir.clone(),
            source,
        })?;
        set_mode(&paths.dir, 0o750);
        let (created, _) = ensure_key(&paths.key)?;
        if created {
            info!(
                "created the audit signing key {} (public key {})",
                paths.key.display(),
                audit::key::public_path(&paths.key).display()
            );
        }
        let key = audit::key::load(&paths.key)?;
        let mut opts = LogOptions::new(key);
        if journal && Path::new(audit::JOURNAL_SOCKET).exists() {
            opts = opts.with_system_journal();
        }
        let log = Log::open(&paths.dir, opts.clone())?;
        if let Some(r) = log.recovery() {
            info!(
                "audit log {}: cut a torn tail of {} bytes at byte {} after a crash (saved as {}); recorded at seq {}",
                log.path().display(),
                r.bytes,
                r.offset,
                r.saved_as.display(),
                r.record_seq
            );
        }
        give_group_read(&paths.dir);
        Ok(Arc::new(AuditTrail {
            path: log.path().to_path_buf(),
            current: Mutex::new(Generation {
                log: Some(Arc::new(log)),
                shared: Arc::new(Shared {
                    failed: Mutex::default(),
                    storage: storage.clone(),
                }),
                reopen: false,
            }),
            dir: paths.dir.clone(),
            opts: Some(opts),
            storage,
            bindings: Mutex::default(),
            dropped: Default::default(),
            cpu: OnceLock::new(),
        }))
    }

    /// A trail whose log could not be opened: it accepts nothing and [`AuditTrail::health`]
    /// gives `why`, so the daemon runs (and re-adopts its agents) but refuses new starts.
    pub fn unavailable(paths: &TrailPaths, why: String) -> Arc<AuditTrail> {
        let shared = Arc::new(Shared::default());
        *lock(&shared.failed) = Some(why);
        Arc::new(AuditTrail {
            current: Mutex::new(Generation {
                log: None,
                shared,
                reopen: false,
            }),
            path: paths.dir.join(audit::LOG_FILE),
            dir: paths.dir.clone(),
            opts: None,
            storage: None,
            bindings: Mutex::default(),
            dropped: Default::default(),
            cpu: OnceLock::new(),
        })
    }

    /// Charge the log's CPU for each agent's records to its account in `ledger` from now on
    /// (the first ledger set stays).
    pub fn set_cpu_ledger(&self, ledger: Arc<CpuLedger>) {
        let _ = self.cpu.set(ledger);
    }

    /// `rec` charged to its agent's CPU account, when it is about an agent and a ledger is set:
    /// the log's threads charge the account their CPU for the record's share of its batch.
    /// The daemon's own records (no agent) are charged to nobody. Every record goes through
    /// here before it is queued.
    fn costed(&self, rec: Record) -> Record {
        match self.cpu.get() {
            Some(ledger) if !rec.agent.is_empty() && rec.cost.is_none() => {
                let account = ledger.agent(&format!("{}/{}", rec.tenant, rec.agent));
                rec.cost(audit::CostTag::new(account))
            }
            _ => rec,
        }
    }

    /// The log file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The storage watcher the trail reports to, if any.
    pub fn storage(&self) -> Option<&Arc<Storage>> {
        self.storage.as_ref()
    }

    /// `Ok` while the log accepts records; otherwise why it does not.
    pub fn health(&self) -> Result<(), String> {
        let g = lock(&self.current);
        match lock(&g.shared.failed).clone() {
            Some(why) => Err(why),
            None if g.log.is_none() => Err(format!("audit log {} is closed", self.path.display())),
            None => Ok(()),
        }
    }

    /// The log in use and the failure state its completions report to.
    fn log(&self) -> Result<(Arc<Log>, Arc<Shared>), AppendError> {
        let g = lock(&self.current);
        if let Some(why) = lock(&g.shared.failed).clone() {
            return Err(AppendError::Failed {
                path: self.path.clone(),
                reason: why,
            });
        }
        match &g.log {
            Some(l) => Ok((l.clone(), g.shared.clone())),
            None => Err(AppendError::Closed(self.path.clone())),
        }
    }

    /// Charge the record to its agent; while storage is low, count a refusal (a `deny` record
    /// of an agent or of the kernel) for the agent's summary instead of writing it: returns
    /// whether it was counted.
    fn summarised(&self, rec: &Record) -> bool {
        let Some(s) = &self.storage else {
            return false;
        };
        let id = if rec.agent.is_empty() {
            String::new()
        } else {
            format!("{}/{}", rec.tenant, rec.agent)
        };
        if rec.decision == Some(Decision::Deny) && s.summarise(&id, rec.kind.as_str()) {
            return true;
        }
        s.charge(&id, crate::storage::usage::RECORD_BYTES);
        false
    }

    /// If the log stopped because its file system was full, open it again (the chain continues
    /// from its last whole record; a batch cut short was truncated, or is cut now as a torn
    /// tail). Called by the storage watcher after each check. Returns whether it reopened.
    pub fn recover(&self) -> bool {
        let Some(opts) = &self.opts else {
            return false;
        };
        let mut g = lock(&self.current);
        let failed = lock(&g.shared.failed).clone();
        let Some(why) = failed else {
            return false;
        };
        if !g.reopen {
            if !g.log.as_ref().is_some_and(|l| l.out_of_space()) {
                return false;
            }
            g.reopen = true;
        }
        // The old writer has stopped (it does after a failure); closing joins it, releasing
        // the log's lock for the new one. The trail's lock is held across the open (a scan
        // from the last checkpoint: milliseconds), so no record goes to the old log meanwhile.
        if let Some(old) = g.log.take()
            && let Ok(l) = Arc::try_unwrap(old)
        {
            let _ = l.close();
        }
        match Log::open(&self.dir, opts.clone()) {
            Ok(log) => {
                let first = log.first_seq();
                g.log = Some(Arc::new(log));
                g.shared = Arc::new(Shared {
                    failed: Mutex::default(),
                    storage: self.storage.clone(),
                });
                g.reopen = false;
                drop(g);
                info!(
                    "audit trail {} writable again (it had failed: {why}); the chain continues at seq {first}",
                    self.path.display()
                );
                self.submit(self.lifecycle(
                    "",
                    "",
                    "audit-recovered",
                    None,
                    json!({"failure": why, "first_seq": first}),
                ));
                true
            }
            Err(e) => {
                warn!(
                    "audit trail {}: cannot open it again yet: {e}; retrying at the next storage check",
                    self.path.display()
                );
                *lock(&g.shared.failed) = Some(format!("{why}; reopening failed: {e}"));
                false
            }
        }
    }

    /// Write the summaries of refusals counted while storage was low, one record per agent;
    /// `storage` is the state's one-line description (`Status::describe`).
    pub fn write_summaries(&self, summaries: Vec<crate::storage::Summary>, storage: &str) {
        for s in summaries {
            let (tenant, name) = s.agent.split_once('/').unwrap_or(("", ""));
            let rec = Record::new(Kind::Denial, name, tenant)
                .decision(Decision::Deny)
                .detail(json!({
                    "event": "refusals-summarised",
                    "reason": "storage-low",
                    "agent": s.agent,
                    "count": s.count,
                    "by": s.by,
                    "window_ms": s.window.as_millis() as u64,
                    "storage": storage,
                }));
            let rec = self.costed(rec);
            // A summary that cannot be written (the disk filled up under it) goes back to the
            // counts, to be written once the trail recovers: never lost with the failed write.
            let back = self.storage.clone().map(|st| (st, s.clone()));
            let restore = move |back: Option<(Arc<Storage>, crate::storage::Summary)>| {
                if let Some((st, s)) = back {
                    st.restore_summary(&s);
                }
            };
            let (log, shared) = match self.log() {
                Ok(l) => l,
                Err(_) => {
                    restore(back);
                    continue;
                }
            };
            let again = back.clone();
            let s2 = shared.clone();
            let queued = log.try_append_then(rec, move |r| {
                if let Err(e) = r {
                    s2.fail(&e.to_string());
                    restore(back);
                }
            });
            if let Err(e) = queued {
                note_err(&shared, &e);
                restore(again);
            }
        }
    }

    /// Remembers (or forgets, with `None`) an agent's binding hash for its later records.
    pub fn set_binding(&self, agent_id: &str, hash: Option<String>) {
        let mut b = lock(&self.bindings);
        match hash {
            Some(h) => b.insert(agent_id.to_string(), h),
            None => b.remove(agent_id),
        };
    }

    /// The binding hash recorded for an agent.
    pub fn binding(&self, agent_id: &str) -> Option<String> {
        lock(&self.bindings).get(agent_id).cloned()
    }

    /// A record about agent `tenant/name` with its binding hash, if known.
    pub fn agent_record(&self, kind: Kind, tenant: &str, name: &str) -> Record {
        let r = Record::new(kind, name, tenant);
        match self.binding(&format!("{tenant}/{name}")) {
            Some(h) => r.binding(h),
            None => r,
        }
    }

    /// A lifecycle record: `detail` is an object; `event` is put first.
    pub fn lifecycle(
        &self,
        tenant: &str,
        name: &str,
        event: &str,
        decision: Option<Decision>,
        detail: Value,
    ) -> Record {
        let mut d = serde_json::Map::new();
        d.insert("event".into(), json!(event));
        if let Value::Object(m) = detail {
            d.extend(m);
        }
        if !d.contains_key("caller")
            && let Ok(c) = CALLER.try_with(Value::clone)
        {
            d.insert("caller".into(), c);
        }
        let r = self
            .agent_record(Kind::Lifecycle, tenant, name)
            .detail(Value::Object(d));
        match decision {
            Some(x) => r.decision(x),
            None => r,
        }
    }

    /// Appends and waits until the record is durable, without blocking a runtime thread. A
    /// failure marks the trail failed.
    pub async fn commit(&self, rec: Record) -> Result<Ack, AppendError> {
        self.commit_as(rec, false).await
    }

    /// Appends and waits until the record is written to the log file (`write(2)` done: it
    /// survives a crash of the daemon), not until it is durable: the group commit that follows
    /// at once syncs it without anyone waiting; a power cut may lose it. For tools whose
    /// manifest says `durability: written`. A failure marks the trail failed, as `commit`.
    pub async fn commit_written(&self, rec: Record) -> Result<Ack, AppendError> {
        self.commit_as(rec, true).await
    }

    async fn commit_as(&self, rec: Record, written: bool) -> Result<Ack, AppendError> {
        let (log, shared) = self.log()?;
        let rec = self.costed(rec);
        self.summarised_charge(&rec);
        // The writer idle and nothing queued: write (and sync) on this worker, without the two
        // thread hand-offs to the writer and back. Bounded: one record, only while the log's
        // syncs are quick (`audit` crate, log/here.rs), and one worker at a time (the writer's state is
        // only tried, never waited for); otherwise the record is queued below.
        if let Some(res) = log.try_commit_here(&rec, written) {
            return res.inspect_err(|e| note_err(&shared, e));
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        let s1 = shared.clone();
        let done = move |r: Result<Ack, AppendError>| {
            if let Err(e) = &r {
                s1.fail(&e.to_string());
            }
            let _ = tx.send(r);
        };
        let queued = match written {
            true => log.try_append_written(rec.clone(), done),
            false => log.try_append_then(rec.clone(), done),
        };
        match queued {
            Ok(()) => {}
            Err(AppendError::Full(_)) => {
                // Back-pressure: wait for room off the runtime.
                let (tx, rx2) = tokio::sync::oneshot::channel();
                let s2 = shared.clone();
                let res = tokio::task::spawn_blocking(move || {
                    let done = move |r: Result<Ack, AppendError>| {
                        if let Err(e) = &r {
                            s2.fail(&e.to_string());
                        }
                        let _ = tx.send(r);
                    };
                    match written {
                        true => log.append_written_then(rec, done),
                        false => log.append_then(rec, done),
                    }
                })
                .await
                .map_err(|_| AppendError::Abandoned)?;
                res.inspect_err(|e| note_err(&shared, e))?;
                return rx2.await.map_err(|_| AppendError::Abandoned)?;
            }
            Err(e) => {
                note_err(&shared, &e);
                return Err(e);
            }
        }
        rx.await.map_err(|_| AppendError::Abandoned)?
    }

    /// Charges a record that must be written (never summarised: commits are decisions that
    /// take effect) to its agent.
    fn summarised_charge(&self, rec: &Record) {
        if let Some(s) = &self.storage
            && !rec.agent.is_empty()
        {
            s.charge(
                &format!("{}/{}", rec.tenant, rec.agent),
                crate::storage::usage::RECORD_BYTES,
            );
        }
    }

    /// Queues a record without waiting for it: it is durable with the next record someone waits
    /// for, or within the log's lazy delay (10 ms), in order with the other records queued from
    /// this task, and never costs a `fdatasync` of its own in front of a committed record. A
    /// failure marks the trail failed and is logged.
    pub fn submit(&self, rec: Record) {
        if self.summarised(&rec) {
            return;
        }
        self.queue(rec);
    }

    /// Queue without summarising or charging (summaries are the daemon's own bookkeeping).
    fn queue(&self, rec: Record) {
        let rec = self.costed(rec);
        let (log, shared) = match self.log() {
            Ok(l) => l,
            Err(e) => {
                error!("audit record lost: {e}: {}", record_text(&rec));
                return;
            }
        };
        match lazy(&log, &shared, &rec) {
            Ok(()) => {}
            Err(AppendError::Full(_)) => {
                // The queue is full: wait for room on a blocking thread, never on the runtime.
                let run = move || {
                    let s2 = shared.clone();
                    if let Err(e) = log.append_then(rec, move |r| {
                        if let Err(e) = r {
                            s2.fail(&e.to_string());
                        }
                    }) {
                        shared.fail(&e.to_string());
                    }
                };
                match tokio::runtime::Handle::try_current() {
                    Ok(h) => {
                        h.spawn_blocking(run);
                    }
                    Err(_) => run(),
                }
            }
            Err(e) => {
                note_err(&shared, &e);
                error!("audit record lost: {e}: {}", record_text(&rec));
            }
        }
    }

    /// Queues a record if the queue has room; otherwise counts it in [`AuditTrail::dropped`]
    /// and returns false. For floods an agent can cause (kernel denials): the daemon stays
    /// responsive and reports the count as a record of its own instead.
    pub fn submit_or_count(&self, rec: Record) -> bool {
        if self.summarised(&rec) {
            return true;
        }
        let rec = self.costed(rec);
        let Ok((log, shared)) = self.log() else {
            self.dropped
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return false;
        };
        match lazy(&log, &shared, &rec) {
            Ok(()) => true,
            Err(AppendError::Full(_)) => {
                self.dropped
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                false
            }
            Err(e) => {
                note_err(&shared, &e);
                self.dropped
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                false
            }
        }
    }

    /// Best-effort records not written since the daemon started (see `submit_or_count`).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Commits everything queued, writes the final checkpoint and closes the log.
    pub fn close(&self) -> Result<(), AppendError> {
        let Some(log) = lock(&self.current).log.take() else {
            return Ok(());
        };
        match Arc::try_unwrap(log) {
            Ok(l) => l.close(),
            // A record in flight still holds it: dropping the last reference closes it.
            Err(_) => Ok(()),
        }
    }
}

/// What this host offers a contract's binding, from the start-up probe
/// ([`crate::probe::HostReport::offer`]).
pub fn host_offer(report: &crate::probe::HostReport) -> contracts::HostOffer {
    report.offer()
}

/// The sealed binding manifest hash of `contract` against `offer`, or why it does not bind.
pub fn binding_hash(
    contract: &contracts::Contract,
    offer: &contracts::HostOffer,
) -> Result<String, String> {
    contracts::bind(contract, offer)
        .map(|m| m.sha256)
        .map_err(|e| e.to_string())
}

/// Queues `rec` for the log without waiting for it; put straight into the batch being built,
/// without waking the writer, when the writer is idle (`Log::try_append_lazy_here`). A failure
/// to write it later marks the trail failed.
fn lazy(log: &Log, shared: &Arc<Shared>, rec: &Record) -> Result<(), AppendError> {
    let done = |s: Arc<Shared>| {
        move |r: Result<Ack, AppendError>| {
            if let Err(e) = r {
                s.fail(&e.to_string());
            }
        }
    };
    match log.try_append_lazy_here(rec, done(shared.clone())) {
        Some(r) => r,
        None => log.try_append_lazy(rec.clone(), done(shared.clone())),
    }
}

fn note_err(shared: &Shared, e: &AppendError) {
    if !matches!(e, AppendError::Invalid(_)) {
        shared.fail(&e.to_string());
    }
}

fn record_text(r: &Record) -> String {
    serde_json::to_string(r).unwrap_or_default()
}

fn set_mode(p: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt as _;
    let _ = std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode));
}

/// The `agentos` group (operators) may read the log (`agentctl audit show/verify`): give the
/// directory and its files to that group when it exists.
fn give_group_read(dir: &Path) {
    let Ok(Some(g)) = nix::unistd::Group::from_name("agentos") else {
        return;
    };
    let chgrp = |p: &Path| {
        let _ = nix::unistd::chown(p, None, Some(g.gid));
    };
    chgrp(dir);
    for f in [audit::LOG_FILE, audit::HEAD_FILE] {
        chgrp(&dir.join(f));
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[tokio::test]
    async fn commit_and_submit_keep_order_and_carry_the_binding() {
        let dir = tempfile::tempdir().unwrap();
        let paths = TrailPaths::under(dir.path());
        let t = AuditTrail::open(&paths, false, None).unwrap();
        assert!(paths.key.exists());
        t.set_binding("acme/a", Some("ab".repeat(32)));
        t.submit(t.lifecycle(
            "acme",
            "a",
            "refused",
            Some(Decision::Deny),
            json!({"reason": "x"}),
        ));
        let ack = t
            .commit(t.lifecycle("acme", "a", "start", Some(Decision::Allow), json!({})))
            .await
            .unwrap();
        t.close().unwrap();
        assert!(t.health().is_err(), "a closed trail refuses");
        let recs: Vec<_> = audit::Reader::open(
            &dir.path().join("audit/audit.log"),
            audit::Filter::default(),
        )
        .unwrap()
        .map(|e| e.unwrap().record)
        .collect();
        let ours: Vec<_> = recs.iter().filter(|r| r.agent == "a").collect();
        assert_eq!(ours.len(), 2);
        assert_eq!(ours[0].detail["event"], "refused");
        assert_eq!(ours[1].detail["event"], "start");
        assert_eq!(ours[1].seq, ack.seq);
        assert_eq!(ours[1].binding.as_deref(), Some("ab".repeat(32).as_str()));
        assert_eq!(ours[1].tenant, "acme");
        let key = audit::key::load_public(&audit::key::public_path(&paths.key)).unwrap();
        audit::verify(&dir.path().join("audit/audit.log"), &key).unwrap();
    }

    /// The log's writer charges its CPU for an agent's records to the agent's account (its
    /// `audit_ns`, part of `used_ns`); the daemon's own records cost no agent, and an agent
    /// without records none.
    #[tokio::test]
    async fn the_writers_cpu_is_charged_to_the_agents_whose_records_it_writes() {
        let dir = tempfile::tempdir().unwrap();
        let t = AuditTrail::open(&TrailPaths::under(dir.path()), false, None).unwrap();
        let ledger = Arc::new(CpuLedger::default());
        t.set_cpu_ledger(ledger.clone());
        let quiet = ledger.agent("acme/quiet");
        for i in 0..300 {
            t.submit(t.lifecycle("acme", "a", "tool-call", None, json!({"i": i})));
            t.submit(t.lifecycle("", "", "daemon-tick", None, json!({"i": i})));
            if i % 50 == 0 {
                // Lazy records are written by the writer thread within 10 ms.
                tokio::time::sleep(std::time::Duration::from_millis(15)).await;
            }
        }
        t.commit(t.lifecycle("acme", "a", "last", None, json!({})))
            .await
            .unwrap();
        t.close().unwrap();
        let a = ledger.usage("acme/a").expect("acme/a has an account");
        assert!(a.audit_ns > 0, "the audit writer charged acme/a nothing");
        assert!(a.used_ns >= a.audit_ns);
        assert_eq!(quiet.usage().audit_ns, 0);
        assert_eq!(quiet.usage().used_ns, 0);
        assert!(
            ledger.usage("/").is_none(),
            "a daemon record opened an account"
        );
    }
}
