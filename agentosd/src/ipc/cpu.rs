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
//! - the model gateway, around every poll of its connections' tasks and of its accept loop.
//!
//! Time is read with `clock_gettime(CLOCK_THREAD_CPUTIME_ID)` (the thread's own CPU time; the
//! vDSO does not serve CPU-time clocks, so each read is a system call: [`clock_cost`] measures
//! it, about 0.1-0.3 µs natively). While an agent's bucket is in debt the ring reads none of its
//! connections and accepts none, and the gateway neither reads nor accepts: the same
//! back-pressure as the byte rate, nothing is dropped. Both rates apply.
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

/// The default `--ipc-agent-cpu`: per mille of one CPU per agent (5%).
pub const DEFAULT_AGENT_CPU_PERMILLE: u64 = 50;

/// The default `--ipc-agent-cpu-burst`: CPU time an idle agent may use at once.
pub const DEFAULT_AGENT_CPU_BURST: Duration = Duration::from_millis(250);

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

/// An agent's CPU rate: per mille of one CPU and the burst.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuRate {
    /// 0: no CPU rate.
    pub permille: u64,
    pub burst: Duration,
}

impl Default for CpuRate {
    fn default() -> Self {
        CpuRate {
            permille: DEFAULT_AGENT_CPU_PERMILLE,
            burst: DEFAULT_AGENT_CPU_BURST,
        }
    }
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
}

/// One agent's CPU account, shared by the ring thread, its sessions and the gateway.
#[derive(Debug)]
pub struct AgentCpu {
    /// None: no rate (`--ipc-agent-cpu 0`); the CPU is still counted.
    bucket: Option<Mutex<Bucket>>,
    permille: u64,
    used_ns: AtomicU64,
    pauses: AtomicU64,
    throttled_ns: AtomicU64,
}

impl Default for AgentCpu {
    /// An account without a rate (counted only).
    fn default() -> Self {
        AgentCpu::new(
            CpuRate {
                permille: 0,
                burst: Duration::ZERO,
            },
            Instant::now(),
        )
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl AgentCpu {
    pub fn new(rate: CpuRate, now: Instant) -> AgentCpu {
        let ns = rate.ns_per_sec();
        AgentCpu {
            bucket: (ns > 0).then(|| {
                Mutex::new(Bucket::new(
                    ns,
                    u64::try_from(rate.burst.as_nanos()).unwrap_or(u64::MAX),
                    now,
                ))
            }),
            permille: rate.permille,
            used_ns: AtomicU64::new(0),
            pauses: AtomicU64::new(0),
            throttled_ns: AtomicU64::new(0),
        }
    }

    /// `ns` of the daemon's CPU were spent for the agent.
    pub fn charge(&self, ns: u64) {
        if ns == 0 {
            return;
        }
        self.used_ns.fetch_add(ns, Ordering::Relaxed);
        if let Some(b) = &self.bucket {
            lock(b).charge(ns, 0, Instant::now());
        }
    }

    /// How long until the agent may be served again (zero: now, or no rate).
    pub fn wait(&self, now: Instant) -> Duration {
        self.bucket
            .as_ref()
            .map_or(Duration::ZERO, |b| lock(b).wait(now))
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
            .map(|b| (self.permille, lock(b).burst()))
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

/// Every agent's account.
#[derive(Debug, Default)]
pub struct CpuLedger {
    rate: CpuRate,
    agents: Mutex<HashMap<String, Arc<AgentCpu>>>,
}

impl CpuLedger {
    /// Accounts held to `rate` (`--ipc-agent-cpu`).
    pub fn new(rate: CpuRate) -> CpuLedger {
        CpuLedger {
            rate,
            agents: Mutex::new(HashMap::new()),
        }
    }

    pub fn rate(&self) -> CpuRate {
        self.rate
    }

    /// The account of agent `id`, opened on first use.
    pub fn agent(&self, id: &str) -> Arc<AgentCpu> {
        lock(&self.agents)
            .entry(id.to_string())
            .or_insert_with(|| Arc::new(AgentCpu::new(self.rate, Instant::now())))
            .clone()
    }

    /// What agent `id` used (None: the daemon never served it).
    pub fn usage(&self, id: &str) -> Option<CpuUse> {
        lock(&self.agents).get(id).map(|a| a.usage())
    }
}

/// A future whose every poll is measured in thread CPU time and charged to an agent: the
/// synchronous work of one poll runs on one thread, so its CPU time is exactly that work's.
pub struct Measured<F> {
    fut: Pin<Box<F>>,
    cpu: Arc<AgentCpu>,
}

impl<F: Future> Measured<F> {
    pub fn new(fut: F, cpu: Arc<AgentCpu>) -> Measured<F> {
        Measured {
            fut: Box::pin(fut),
            cpu,
        }
    }
}

impl<F: Future> Future for Measured<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        let t0 = thread_cpu_ns();
        let r = this.fut.as_mut().poll(cx);
        this.cpu.charge(thread_cpu_ns().saturating_sub(t0));
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_is_the_threads_and_cheap() {
        // Spinning advances it (the loop ends), at most as fast as the wall clock.
        let (t0, w0) = (thread_cpu_ns(), Instant::now());
        let mut x = 0u64;
        while thread_cpu_ns() - t0 < 10_000_000 {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        assert!(
            w0.elapsed() >= Duration::from_millis(9),
            "{:?}",
            w0.elapsed()
        );
        // Sleeping costs no CPU.
        let t1 = thread_cpu_ns();
        std::thread::sleep(Duration::from_millis(30));
        assert!(thread_cpu_ns() - t1 < 5_000_000);
        let c = clock_cost(10_000);
        eprintln!("clock_gettime(CLOCK_THREAD_CPUTIME_ID): {c:.0} ns a read");
        assert!(c < 20_000.0, "{c} ns a read");
    }

    #[test]
    fn an_account_in_debt_waits_for_its_rate() {
        let t0 = Instant::now();
        let rate = CpuRate {
            permille: 100,
            burst: Duration::from_millis(10),
        };
        let a = AgentCpu::new(rate, t0);
        // 100‰: 100 ms a second, the burst at least half a second's worth (50 ms).
        assert_eq!(a.limit(), Some((100, 50_000_000)));
        assert_eq!(a.wait(t0), Duration::ZERO);
        a.charge(80_000_000);
        // 30 ms of debt at 100 ms/s: 300 ms.
        let w = a.wait(Instant::now());
        assert!(
            w > Duration::from_millis(250) && w <= Duration::from_millis(300),
            "{w:?}"
        );
        assert_eq!(a.usage().used_ns, 80_000_000);
        a.note_pause(w);
        assert_eq!(a.usage().pauses, 1);
        // No rate: counted, never waits.
        let free = AgentCpu::new(
            CpuRate {
                permille: 0,
                burst: Duration::ZERO,
            },
            t0,
        );
        free.charge(10_000_000_000);
        assert_eq!(free.wait(Instant::now()), Duration::ZERO);
        assert_eq!(free.usage().used_ns, 10_000_000_000);
        assert_eq!(free.usage().permille, 0);
    }

    #[tokio::test]
    async fn a_measured_future_is_charged_its_polls_not_its_waits() {
        let a = Arc::new(AgentCpu::new(CpuRate::default(), Instant::now()));
        Measured::new(
            async {
                tokio::time::sleep(Duration::from_millis(50)).await;
                let t0 = thread_cpu_ns();
                let mut x = 0u64;
                while thread_cpu_ns() - t0 < 20_000_000 {
                    x = std::hint::black_box(x.wrapping_add(1));
                }
            },
            a.clone(),
        )
        .await;
        let used = a.usage().used_ns;
        assert!(
            (20_000_000..40_000_000).contains(&used),
            "20 ms of CPU after a 50 ms sleep charged {used} ns"
        );
    }
}
