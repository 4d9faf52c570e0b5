//! The daemon's CPU time per agent (issue 15, "Isolation"): a rate in CPU, not in bytes. The
//! byte rate ([`super::rate`]) is machine-relative (16 MiB/s is a few % of a CPU natively and
//! more than a slow emulated guest can parse at all) and blind to what a request costs (a denial,
//! a connect, a schema check cost far more CPU per byte than a large argument). So the daemon
//! also measures the CPU it spends for each agent where it spends it and charges a token bucket
//! in nanoseconds of CPU per agent:
//!
//! - the ring thread, around each completion of the agent's connections and listener (parsing
//!   its input, accepting and identifying its peers, assembling its replies: ring/mod.rs);
//! - the tokio workers, around every poll of the agent's MCP sessions and of its tool calls
//!   (gate, schema check, audit record building, the fork of a tool: [`Measured`]), and the
//!   blocking-pool parse of its large messages;
//! - the model gateway, around every poll of its connections' tasks and of its accept loop;
//! - the audit log's writer and syncer threads, once per batch, split over the batch's records
//!   by bytes (the `audit::Cost` impl below; records tagged in audit_trail.rs).
//!
//! Time is read with `clock_gettime(CLOCK_THREAD_CPUTIME_ID)` (the thread's own CPU time; the
//! vDSO does not serve CPU-time clocks, so each read is a system call: [`clock_cost`] measures
//! it, about 0.1-0.3 µs natively). While an agent's bucket is in debt the ring reads none of its
//! connections and accepts none, and the gateway neither reads nor accepts: the same
//! back-pressure as the byte rate, nothing is dropped. Both rates apply.
//!
//! **Work-conserving** (`--ipc-agent-cpu-ceiling`, default 50% of one CPU): the share is what an
//! agent is guaranteed, not a cap. An agent over its share is held only while the daemon is
//! contended, that is while the CPU it spent for all agents together over the recent
//! [`WINDOW`] (a decaying average, kept as a running total: [`Pool`]) is over the ceiling, and
//! then only while its own recent rate is over its fair share of the ceiling: the ceiling
//! divided among the agents that were over their share in the last one or two windows, never
//! less than the share ([`fair_permille`]). So an agent alone may take up to the ceiling, two
//! flooding agents half of it each, and an agent under its share (or under its fair share) is
//! never held. What an agent used while the daemon was not contended is not owed later: its
//! bucket's debt is forgiven beyond one burst. `--ipc-agent-cpu-ceiling 0` makes the share a
//! hard cap (held whenever the bucket is in debt, contended or not: the rule before).
//!
//! One ledger per [`super::IpcServer`] ([`super::IpcServer::cpu_ledger`], handed to the MCP
//! service and the model gateway), with the rate of `--ipc-agent-cpu` and
//! `--ipc-agent-cpu-burst`; an agent's account lives as long as the daemon (its CPU used is
//! shown in its status), a few hundred bytes each.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use super::rate::Bucket;
use super::turns::{Admit, TaskWake, Turns};

/// The default `--ipc-agent-cpu`: per mille of one CPU per agent (5%).
pub const DEFAULT_AGENT_CPU_PERMILLE: u64 = 50;

/// The default `--ipc-agent-cpu-burst`: CPU time an idle agent may use at once.
pub const DEFAULT_AGENT_CPU_BURST: Duration = Duration::from_millis(250);

/// The default `--ipc-agent-cpu-ceiling`: per mille of one CPU the daemon may spend for all
/// agents together before the shares hold anyone (50%). The agents' work is queued mostly on one
/// thread, the ring: at a utilisation of ½ a request waits on average as long as its own service
/// (M/M/1: ρ/(1−ρ)), so past half a CPU the other agents' and the control plane's latencies are
/// more than twice the quiet ones (issue 15's goal: p99 within 2×).
pub const DEFAULT_AGENT_CPU_CEILING_PERMILLE: u64 = 500;

/// The recent window: the time constant of the decaying averages the ceiling and the fair share
/// are measured with, and the period over which agents over their share are counted.
pub const WINDOW: Duration = Duration::from_secs(1);

/// The calling thread's CPU time, in nanoseconds.
pub fn thread_cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    (t.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(t.tv_nsec as u64)
}

/// What one [`thread_cpu_ns`] costs on this machine, in nanoseconds (mean over `n` reads).
pub fn clock_cost(n: u32) -> f64 {
    let t0 = Instant::now();
    let mut sink = 0u64;
    for _ in 0..n.max(1) {
        sink = sink.wrapping_add(thread_cpu_ns());
    }
    std::hint::black_box(sink);
    t0.elapsed().as_nanos() as f64 / f64::from(n.max(1))
}

/// An agent's CPU rate: per mille of one CPU and the burst, and the ceiling over all agents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuRate {
    /// 0: no CPU rate.
    pub permille: u64,
    pub burst: Duration,
    /// Per mille of one CPU all agents together may take before a share holds (0: the share is
    /// a hard cap).
    pub ceiling_permille: u64,
}

impl Default for CpuRate {
    fn default() -> Self {
        CpuRate {
            permille: DEFAULT_AGENT_CPU_PERMILLE,
            burst: DEFAULT_AGENT_CPU_BURST,
            ceiling_permille: DEFAULT_AGENT_CPU_CEILING_PERMILLE,
        }
    }
}

/// A decaying sum of CPU time: each nanosecond counts `exp(-age / WINDOW)`; divided by the
/// window it is the recent rate (a steady `r` ns a second converges to `r × WINDOW`).
#[derive(Debug, Clone, Copy)]
struct Recent {
    ns: f64,
    at: Instant,
}

impl Recent {
    fn new(now: Instant) -> Recent {
        Recent { ns: 0.0, at: now }
    }

    fn decayed(&self, now: Instant) -> f64 {
        let dt = now.saturating_duration_since(self.at).as_secs_f64();
        self.ns * (-dt / WINDOW.as_secs_f64()).exp()
    }

    fn add(&mut self, ns: u64, now: Instant) {
        self.ns = self.decayed(now) + ns as f64;
        self.at = self.at.max(now);
    }

    /// The recent rate, per mille of one CPU.
    fn permille(&self, now: Instant) -> f64 {
        self.decayed(now) / WINDOW.as_secs_f64() / 1e6
    }
}

/// The daemon's CPU for all agents of a ledger, as a running total (no scan of the agents):
/// its recent rate against the ceiling, and how many agents were over their share in this
/// window and the one before.
#[derive(Debug)]
pub struct Pool {
    ceiling_permille: u64,
    recent: Recent,
    origin: Instant,
    epoch: u64,
    heavy_now: u64,
    heavy_before: u64,
    /// Until when an agent was lately over its share by its recent rate (its burst perhaps
    /// not spent yet): the stall watcher reads the others' waits until then.
    warm_until: Option<Instant>,
}

impl Pool {
    pub fn new(ceiling_permille: u64, now: Instant) -> Pool {
        Pool {
            ceiling_permille,
            recent: Recent::new(now),
            origin: now,
            epoch: 0,
            heavy_now: 0,
            heavy_before: 0,
            warm_until: None,
        }
    }

    /// Whether an agent was over its share in this window or the one before, by its bucket or
    /// by its recent rate.
    pub fn anyone_over(&mut self, now: Instant) -> bool {
        self.roll(now);
        self.heavy_now > 0 || self.heavy_before > 0 || self.warm_until.is_some_and(|t| now < t)
    }

    /// An agent's recent rate is over its share at `now`.
    fn mark_warm(&mut self, now: Instant) {
        self.warm_until = Some(now + WINDOW * 2);
    }

    /// The window `now` falls in; a new one starts its count of agents over their share afresh.
    fn roll(&mut self, now: Instant) -> u64 {
        let e = (now.saturating_duration_since(self.origin).as_nanos() / WINDOW.as_nanos()) as u64;
        if e > self.epoch {
            self.heavy_before = if e == self.epoch + 1 {
                self.heavy_now
            } else {
                0
            };
            self.heavy_now = 0;
            self.epoch = e;
        }
        self.epoch
    }

    /// `ns` were spent for some agent; the window it is in.
    pub fn charge(&mut self, ns: u64, now: Instant) -> u64 {
        self.recent.add(ns, now);
        self.roll(now)
    }

    /// An agent was over its share in window `epoch` (once per agent and window).
    pub fn mark_heavy(&mut self, epoch: u64, now: Instant) {
        if self.roll(now) == epoch {
            self.heavy_now += 1;
        }
    }

    /// Agents over their share lately (at least 1).
    pub fn heavy(&mut self, now: Instant) -> u64 {
        self.roll(now);
        self.heavy_now.max(self.heavy_before).max(1)
    }

    /// The daemon's recent CPU for all agents, per mille of one CPU.
    pub fn permille(&self, now: Instant) -> f64 {
        self.recent.permille(now)
    }
}

/// An agent's fair share of the ceiling when `heavy` agents want more than their share: an
/// equal part, never less than the share itself (which is guaranteed).
pub fn fair_permille(ceiling: u64, heavy: u64, share: u64) -> u64 {
    (ceiling / heavy.max(1)).max(share)
}

/// Whether an agent over its share is held under the ceiling, and for how long: only while all
/// agents together are over the `ceiling` and it is over its `fair` share; until its recent
/// rate decays to the fair share if it stops (the ring looks again every 10 ms).
pub fn contended_wait(agent: f64, total: f64, ceiling: u64, fair: u64) -> Option<Duration> {
    if total <= ceiling as f64 || agent <= fair as f64 {
        return None;
    }
    let t = WINDOW.as_secs_f64() * (agent / (fair.max(1) as f64)).ln();
    Some(Duration::from_secs_f64(
        t.clamp(0.001, WINDOW.as_secs_f64()),
    ))
}

/// Why an agent is held by the ceiling rule (its record says so).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Contention {
    /// `--ipc-agent-cpu-ceiling`, and the daemon's recent CPU for all agents, per mille.
    pub ceiling_permille: u64,
    pub total_permille: u64,
    /// The agent's fair share and its recent rate, per mille.
    pub fair_permille: u64,
    pub agent_permille: u64,
    /// Held because another agent waited for a CPU (`--ipc-agent-cpu-stall`): that share of the
    /// time and the threshold, per mille; 0 and 0 when held by the ceiling.
    pub stall_permille: u64,
    pub stall_threshold_permille: u64,
}

/// An agent held by its CPU account: for how long (an estimate; looked at again), and by
/// which rule (None: the share as a hard cap, `--ipc-agent-cpu-ceiling 0`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuHold {
    pub wait: Duration,
    pub contended: Option<Contention>,
}

impl CpuRate {
    /// Nanoseconds of CPU a second.
    pub fn ns_per_sec(&self) -> u64 {
        self.permille.saturating_mul(1_000_000)
    }
}

/// What an agent's account shows (its status).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuUse {
    /// CPU the daemon spent for the agent since it started, ns.
    pub used_ns: u64,
    /// Times one of its sockets waited for its CPU bucket.
    pub pauses: u64,
    /// The waits those pauses were for, summed, ns.
    pub throttled_ns: u64,
    /// The rate it is held to (0: none).
    pub permille: u64,
    /// The ceiling under which it is not held to it (0: a hard cap, or no rate).
    pub ceiling_permille: u64,
    /// Of `used_ns`, the audit trail's writer threads' CPU for its records ([`audit::Cost`]).
    pub audit_ns: u64,
}

/// An agent's bucket at its share, its recent rate, and the last window it was counted over
/// its share in.
#[derive(Debug)]
struct Account {
    bucket: Bucket,
    recent: Recent,
    heavy_epoch: Option<u64>,
    /// The last window its recent rate was seen over its share in.
    warm_epoch: Option<u64>,
}

/// One agent's CPU account, shared by the ring thread, its sessions and the gateway.
#[derive(Debug)]
pub struct AgentCpu {
    /// None: no rate (`--ipc-agent-cpu 0`); the CPU is still counted.
    bucket: Option<Mutex<Account>>,
    /// The ledger's pool (None: the share is a hard cap, or no rate).
    pool: Option<Arc<Mutex<Pool>>>,
    permille: u64,
    used_ns: AtomicU64,
    /// Of `used_ns`, charged by the audit log's threads.
    audit_ns: AtomicU64,
    pauses: AtomicU64,
    throttled_ns: AtomicU64,
    /// The ledger's mark of another agent's wait for a CPU (ipc/stalls.rs; None: not watched).
    stall: Option<Arc<crate::ipc::stalls::StallMark>>,
    /// Its place in the turns on the agents' runtime (ipc/turns.rs; None: polled in tokio's
    /// order, an account outside a ledger).
    turn: Option<(Arc<Turns>, usize)>,
}

impl Default for AgentCpu {
    /// An account without a rate (counted only).
    fn default() -> Self {
        AgentCpu::new(
            CpuRate {
                permille: 0,
                burst: Duration::ZERO,
                ceiling_permille: 0,
            },
            Instant::now(),
        )
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl AgentCpu {
    /// An account alone: its share is a hard cap whatever `rate.ceiling_permille` says (the
    /// ceiling is over a ledger's agents: [`CpuLedger::agent`]).
    pub fn new(rate: CpuRate, now: Instant) -> AgentCpu {
        AgentCpu::in_pool(rate, None, now)
    }

    /// An account under `pool`'s ceiling (None: a hard cap).
    pub fn in_pool(rate: CpuRate, pool: Option<Arc<Mutex<Pool>>>, now: Instant) -> AgentCpu {
        let ns = rate.ns_per_sec();
        AgentCpu {
            bucket: (ns > 0).then(|| {
                Mutex::new(Account {
                    bucket: Bucket::new(
                        ns,
                        u64::try_from(rate.burst.as_nanos()).unwrap_or(u64::MAX),
                        now,
                    ),
                    recent: Recent::new(now),
                    heavy_epoch: None,
                    warm_epoch: None,
                })
            }),
            pool: pool.filter(|_| ns > 0),
            permille: rate.permille,
            used_ns: AtomicU64::new(0),
            audit_ns: AtomicU64::new(0),
            pauses: AtomicU64::new(0),
            throttled_ns: AtomicU64::new(0),
            stall: None,
            turn: None,
        }
    }

    /// The same account, held to its share while `mark` says another agent waits for a CPU.
    pub fn with_stall_mark(mut self, mark: &Arc<crate::ipc::stalls::StallMark>) -> AgentCpu {
        self.stall = self.pool.as_ref().map(|_| mark.clone());
        self
    }

    /// The same account, its tasks polled in turns with the other agents of `turns`.
    pub fn in_turns(mut self, turns: &Arc<Turns>) -> AgentCpu {
        self.turn = Some((turns.clone(), turns.join()));
        self
    }

    /// `ns` of the daemon's CPU were spent for the agent.
    pub fn charge(&self, ns: u64) {
        self.charge_at(ns, Instant::now());
    }

    /// `ns` were spent for the agent at `now`: its bucket, its recent rate, the pool's total and,
    /// the first time in a window that it is over its share, the pool's count of such agents.
    /// Two short locks, no scan.
    pub fn charge_at(&self, ns: u64, now: Instant) {
        if ns == 0 {
            return;
        }
        self.used_ns.fetch_add(ns, Ordering::Relaxed);
        let Some(b) = &self.bucket else {
            return;
        };
        let epoch = self.pool.as_ref().map(|p| lock(p).charge(ns, now));
        let (newly_heavy, newly_warm) = {
            let mut a = lock(b);
            a.bucket.charge(ns, 0, now);
            a.recent.add(ns, now);
            match epoch {
                Some(e) => {
                    // Work-conserving: what it used while nobody else wanted it is not owed.
                    let burst = a.bucket.burst();
                    a.bucket.forgive(burst);
                    let over = !a.bucket.ready(now) && a.heavy_epoch != Some(e);
                    if over {
                        a.heavy_epoch = Some(e);
                    }
                    // Over its share by its rate, its burst perhaps not spent: the stall
                    // watcher is to look (once a window).
                    let warm = self.stall.is_some()
                        && a.warm_epoch != Some(e)
                        && a.recent.permille(now) > self.permille as f64;
                    if warm {
                        a.warm_epoch = Some(e);
                    }
                    (over.then_some(e), warm)
                }
                None => (None, false),
            }
        };
        if let (Some(e), Some(p)) = (newly_heavy, &self.pool) {
            lock(p).mark_heavy(e, now);
        }
        if let (true, Some(p)) = (newly_warm, &self.pool) {
            lock(p).mark_warm(now);
        }
    }

    /// Whether the agent is held now, for how long and by which rule (None: it may be served).
    /// Within its share (and burst) never; over it, always with a hard cap, and under a ceiling
    /// only while the daemon is contended and the agent is over its fair share.
    pub fn hold(&self, now: Instant) -> Option<CpuHold> {
        let b = self.bucket.as_ref()?;
        let (debt, agent) = {
            let mut a = lock(b);
            let debt = a.bucket.wait(now);
            if debt.is_zero() {
                return None;
            }
            (debt, a.recent.permille(now))
        };
        let Some(pool) = &self.pool else {
            return Some(CpuHold {
                wait: debt,
                contended: None,
            });
        };
        let (ceiling, total, heavy) = {
            let mut p = lock(pool);
            (p.ceiling_permille, p.permille(now), p.heavy(now))
        };
        let fair = fair_permille(ceiling, heavy, self.permille);
        // The ceiling's rule first; else, while another agent waits for a CPU, the share as a
        // hard cap (looked at again every stall period). Not by the recent rate as well: tried
        // in the VM, it held the polite agent in the middle of a burst its share allows.
        let (wait, fair, (stall_permille, stall_threshold_permille)) =
            match contended_wait(agent, total, ceiling, fair) {
                Some(w) => (w.min(debt), fair, (0, 0)),
                None => {
                    let stall = self.stall.as_ref().and_then(|m| m.active(now))?;
                    (debt.min(crate::ipc::stalls::PERIOD), self.permille, stall)
                }
            };
        Some(CpuHold {
            wait,
            contended: Some(Contention {
                ceiling_permille: ceiling,
                total_permille: total.round() as u64,
                fair_permille: fair,
                agent_permille: agent.round() as u64,
                stall_permille,
                stall_threshold_permille,
            }),
        })
    }

    /// Whether the agent's wait for a CPU tells whether the CPU has room to lend: it has a
    /// share and is within it (its bucket: share and burst), and the daemon served it in the
    /// last three windows.
    fn stall_witness(&self, now: Instant) -> bool {
        let Some(b) = &self.bucket else {
            return false;
        };
        if self.used_ns.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let mut a = lock(b);
        now.saturating_duration_since(a.recent.at) < WINDOW * 3 && a.bucket.ready(now)
    }

    /// How long until the agent may be served again (zero: now, or no rate).
    pub fn wait(&self, now: Instant) -> Duration {
        self.hold(now).map_or(Duration::ZERO, |h| h.wait)
    }

    /// A socket of the agent starts waiting for `wait` (counted in its status).
    pub fn note_pause(&self, wait: Duration) {
        self.pauses.fetch_add(1, Ordering::Relaxed);
        self.throttled_ns.fetch_add(
            u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// Per mille of one CPU, and the burst in ns (None: no rate).
    pub fn limit(&self) -> Option<(u64, u64)> {
        self.bucket
            .as_ref()
            .map(|b| (self.permille, lock(b).bucket.burst()))
    }

    pub fn usage(&self) -> CpuUse {
        CpuUse {
            used_ns: self.used_ns.load(Ordering::Relaxed),
            pauses: self.pauses.load(Ordering::Relaxed),
            throttled_ns: self.throttled_ns.load(Ordering::Relaxed),
            permille: if self.bucket.is_some() {
                self.permille
            } else {
                0
            },
            ceiling_permille: self.pool.as_ref().map_or(0, |p| lock(p).ceiling_permille),
            audit_ns: self.audit_ns.load(Ordering::Relaxed),
        }
    }

    /// Measures the calling thread's CPU from now until the guard is dropped, charged to `self`.
    pub fn measure(self: &Arc<Self>) -> Charge<'_> {
        Charge {
            cpu: self,
            t0: thread_cpu_ns(),
        }
    }
}

/// The audit log's writer and syncer threads charge an agent's account for its records: their
/// CPU per batch, split over the batch's records by bytes (audit crate, cost.rs; tagged in
/// audit_trail.rs). Counted like the agent's own polls: its bucket, its recent rate, the pool.
impl audit::Cost for AgentCpu {
    fn charge(&self, cpu_ns: u64) {
        self.audit_ns.fetch_add(cpu_ns, Ordering::Relaxed);
        AgentCpu::charge(self, cpu_ns);
    }
}

/// See [`AgentCpu::measure`].
pub struct Charge<'a> {
    cpu: &'a AgentCpu,
    t0: u64,
}

impl Drop for Charge<'_> {
    fn drop(&mut self) {
        self.cpu.charge(thread_cpu_ns().saturating_sub(self.t0));
    }
}

/// Every agent's account, and their pool under the ceiling.
#[derive(Debug)]
pub struct CpuLedger {
    rate: CpuRate,
    /// None: `--ipc-agent-cpu-ceiling 0` (hard caps) or no rate.
    pool: Option<Arc<Mutex<Pool>>>,
    agents: Mutex<HashMap<String, Arc<AgentCpu>>>,
    /// The order the agents' tasks are polled in (ipc/turns.rs).
    turns: Arc<Turns>,
    /// Another agent's wait for a CPU, seen by [`CpuLedger::watch_stalls`].
    stall: Arc<crate::ipc::stalls::StallMark>,
}

impl Default for CpuLedger {
    fn default() -> Self {
        CpuLedger::new(CpuRate::default())
    }
}

impl CpuLedger {
    /// Accounts held to `rate` (`--ipc-agent-cpu`, `--ipc-agent-cpu-ceiling`).
    pub fn new(rate: CpuRate) -> CpuLedger {
        CpuLedger {
            rate,
            pool: (rate.ceiling_permille > 0 && rate.permille > 0)
                .then(|| Arc::new(Mutex::new(Pool::new(rate.ceiling_permille, Instant::now())))),
            agents: Mutex::new(HashMap::new()),
            turns: Arc::new(Turns::default()),
            stall: Arc::new(crate::ipc::stalls::StallMark::new(Instant::now())),
        }
    }

    pub fn rate(&self) -> CpuRate {
        self.rate
    }

    /// The turns of this ledger's agents on the agents' runtime.
    pub fn turns(&self) -> &Arc<Turns> {
        &self.turns
    }

    /// The account of agent `id`, opened on first use.
    pub fn agent(&self, id: &str) -> Arc<AgentCpu> {
        lock(&self.agents)
            .entry(id.to_string())
            .or_insert_with(|| {
                Arc::new(
                    AgentCpu::in_pool(self.rate, self.pool.clone(), Instant::now())
                        .in_turns(&self.turns)
                        .with_stall_mark(&self.stall),
                )
            })
            .clone()
    }

    /// What agent `id` used (None: the daemon never served it).
    pub fn usage(&self, id: &str) -> Option<CpuUse> {
        lock(&self.agents).get(id).map(|a| a.usage())
    }

    /// Watch the CPU pressure of the agents under `agents_dir` (`ROOT/agents`) on a thread of
    /// its own (`agentos-stalls`) while an agent is over its share, and hold the agents over
    /// their share while one within it waits for a CPU more than `threshold_permille` of the
    /// time (ipc/stalls.rs). Nothing to watch without a pool (a hard cap, or no rate) or with a
    /// threshold of 0. The thread ends with the ledger.
    pub fn watch_stalls(
        self: &Arc<Self>,
        agents_dir: std::path::PathBuf,
        threshold_permille: u64,
    ) -> std::io::Result<bool> {
        if threshold_permille == 0 || self.pool.is_none() {
            return Ok(false);
        }
        let ledger = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("agentos-stalls".into())
            .spawn(move || {
                let mut probe = crate::ipc::stalls::StallProbe::new(agents_dir);
                loop {
                    std::thread::sleep(crate::ipc::stalls::PERIOD);
                    let Some(l) = ledger.upgrade() else {
                        return;
                    };
                    l.look_for_stalls(&mut probe, threshold_permille, Instant::now());
                }
            })?;
        Ok(true)
    }

    /// One period of [`CpuLedger::watch_stalls`].
    pub fn look_for_stalls(
        &self,
        probe: &mut crate::ipc::stalls::StallProbe,
        threshold_permille: u64,
        now: Instant,
    ) -> Option<crate::ipc::stalls::Stalled> {
        let pool = self.pool.as_ref()?;
        if !lock(pool).anyone_over(now) {
            probe.forget();
            return None;
        }
        let ids: Vec<String> = lock(&self.agents)
            .iter()
            .filter(|(_, a)| a.stall_witness(now))
            .map(|(id, _)| id.clone())
            .take(crate::ipc::stalls::MAX_SAMPLED)
            .collect();
        let s = probe.sample(ids.iter().map(String::as_str), now)?;
        if s.permille > threshold_permille {
            self.stall.note(s.permille, threshold_permille, now);
            tracing::debug!(
                agent = %s.agent,
                "ipc: an agent within its share waited for a CPU {}‰ of the last period: the agents over their share are held to it",
                s.permille
            );
        }
        Some(s)
    }
}

/// A future whose every poll is measured in thread CPU time and charged to an agent: the
/// synchronous work of one poll runs on one thread, so its CPU time is exactly that work's.
/// When the account is in a ledger's turns, the future is polled only in its agent's turn
/// (ipc/turns.rs): it waits in its agent's queue while that agent is ahead of another with
/// work ready.
pub struct Measured<F> {
    fut: Pin<Box<F>>,
    cpu: Arc<AgentCpu>,
    task: Option<Arc<TaskWake>>,
}

impl<F: Future> Measured<F> {
    pub fn new(fut: F, cpu: Arc<AgentCpu>) -> Measured<F> {
        let task = cpu.turn.as_ref().map(|(t, i)| t.task(*i));
        Measured {
            fut: Box::pin(fut),
            cpu,
            task,
        }
    }
}

thread_local! {
    /// The account of the agent task this thread is polling ([`Measured`]) and the thread's
    /// CPU clock when the poll began: for the tasks it spawns on that agent's behalf
    /// ([`spawn_for_current`]) and for its turn ([`yield_past_turn`]).
    static CURRENT: std::cell::RefCell<Option<(Arc<AgentCpu>, u64)>> =
        const { std::cell::RefCell::new(None) };
}

/// While alive, `CURRENT` is `cpu` (its poll began at `t0`); the previous value comes back on
/// drop (also on a panic in the poll).
struct Current(Option<(Arc<AgentCpu>, u64)>);

impl Current {
    fn enter(cpu: &Arc<AgentCpu>, t0: u64) -> Current {
        Current(CURRENT.with(|c| c.borrow_mut().replace((cpu.clone(), t0))))
    }
}

/// Whether the agent task being polled on this thread is past its turn (ipc/turns.rs
/// `Turns::past_turn`): another agent with work ready is more than a slice of CPU behind it,
/// counting this poll so far. False outside an agent's task or its turns.
pub fn past_turn() -> bool {
    CURRENT.with(|c| {
        let c = c.borrow();
        let Some((cpu, t0)) = c.as_ref() else {
            return false;
        };
        let Some((turns, i)) = &cpu.turn else {
            return false;
        };
        turns.past_turn(*i, || thread_cpu_ns().saturating_sub(*t0))
    })
}

/// Ends the current poll if the agent task is past its turn ([`past_turn`]); its task is woken
/// again at once and polled when the agents behind it have caught up. For a task that handles
/// queued items one after another in one poll (an MCP session's lines): between items, so
/// that another agent's call waits for one item, not for the rest of the backlog.
pub async fn yield_past_turn() {
    if past_turn() {
        tokio::task::yield_now().await;
    }
}

impl Drop for Current {
    fn drop(&mut self) {
        let prev = self.0.take();
        CURRENT.with(|c| *c.borrow_mut() = prev);
    }
}

/// Spawns `fut` on the current runtime as a task of the agent whose task is being polled on
/// this thread: its CPU is charged to that agent and it is polled in that agent's turn
/// (ipc/turns.rs), like the task that spawned it. The work an agent's call starts (the
/// readers and writers of the tool it runs) is that agent's: spawned plainly, it would wait in
/// tokio's order behind a flooding agent's ready tasks, and its CPU would be no one's. Outside
/// an agent's task (the daemon's own work), a plain task.
pub fn spawn_for_current<F>(fut: F) -> tokio::task::JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    match CURRENT.with(|c| c.borrow().as_ref().map(|(cpu, _)| cpu.clone())) {
        Some(cpu) => tokio::spawn(Measured::new(fut, cpu)),
        None => tokio::spawn(fut),
    }
}

impl<F: Future> Future for Measured<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        let (Some(task), Some((turns, _))) = (&this.task, &this.cpu.turn) else {
            return poll_charged(&mut this.fut, &this.cpu, cx).0;
        };
        if turns.admit(task, cx.waker()) == Admit::Park {
            return Poll::Pending;
        }
        // The future sees the wrapped waker, so that its wakes mark it runnable in the turns.
        let waker = std::task::Waker::from(task.clone());
        let (r, ns) = poll_charged(&mut this.fut, &this.cpu, &mut Context::from_waker(&waker));
        turns.polled(task, ns, r.is_ready());
        r
    }
}

/// One poll of an agent's future: its CPU time charged to the agent `cpu` (and returned), the
/// agent current on this thread, and the ring woken once when it ends, for every reply it
/// queued (ipc/wake.rs; that write is the agent's CPU too).
fn poll_charged<F: Future>(
    fut: &mut Pin<Box<F>>,
    cpu: &Arc<AgentCpu>,
    cx: &mut Context<'_>,
) -> (Poll<F::Output>, u64) {
    let t0 = thread_cpu_ns();
    let _current = Current::enter(cpu, t0);
    let hold = super::wake::Hold::enter();
    let r = fut.as_mut().poll(cx);
    drop(hold);
    let ns = thread_cpu_ns().saturating_sub(t0);
    cpu.charge(ns);
    (r, ns)
}

impl<F> Drop for Measured<F> {
    fn drop(&mut self) {
        if let (Some(task), Some((turns, _))) = (&self.task, &self.cpu.turn) {
            turns.end(task);
        }
    }
}

#[cfg(test)]
#[path = "cpu_tests.rs"]
mod tests;
