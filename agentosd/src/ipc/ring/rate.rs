//! The per-agent rate in the ring (ipc/rate.rs decides): every receive is charged to its
//! agent's bucket; while the bucket is in debt none of the agent's connections is read, and a
//! tick (armed only while some connection waits) reads them again once it is paid back. The
//! daemon is told when an agent is throttled, at most once per [`REPORT_EVERY`] per agent.
//! The agent's CPU account (ipc/cpu.rs) holds its sockets the same way: charged by the ring
//! around each completion and by the tokio side around each poll of its sessions, it is in
//! debt when the agent took more than its share of the daemon's CPU.

use super::*;
use crate::ipc::ThrottleLimit;
use crate::ipc::rate::Bucket;

/// How often connections waiting on their agent's rate are looked at again.
static RATE_TICK: types::Timespec = types::Timespec::new().nsec(10_000_000);

/// At most one [`Throttle`] report per agent this often.
pub(super) const REPORT_EVERY: Duration = Duration::from_secs(10);

/// An agent's rate state in the ring.
#[derive(Debug, Default)]
pub(super) struct AgentRate {
    /// None: no rate (`--ipc-agent-rate 0`).
    bucket: Option<Bucket>,
    /// Since when the agent is being throttled (None: not now).
    since: Option<Instant>,
    /// Pauses since the last report.
    pauses: u64,
    last_report: Option<Instant>,
}

impl AgentRate {
    pub(super) fn new(rate: u64, min_burst: u64, now: Instant) -> AgentRate {
        AgentRate {
            bucket: (rate > 0).then(|| Bucket::new(rate, min_burst, now)),
            ..AgentRate::default()
        }
    }
}

impl Ring {
    /// A receive of `bytes` completing `lines` lines on a connection of `agent` was done.
    pub(super) fn charge(&mut self, agent: &str, bytes: usize, lines: usize) {
        if let Some(b) = self
            .agents
            .get_mut(agent)
            .and_then(|e| e.rate.bucket.as_mut())
        {
            b.charge(bytes as u64, lines as u64, Instant::now());
        }
    }

    /// Whether reading `id` must wait for its agent's bucket; it is then read again from the
    /// rate tick.
    pub(super) fn paused_on_rate(&mut self, id: u64) -> bool {
        let Some(agent) = self.conns.get(&id).map(|c| c.agent.clone()) else {
            return false;
        };
        if !self.over_rate(&agent, !self.rate_waiting.contains(&id)) {
            return false;
        }
        self.rate_waiting.insert(id);
        self.arm_rate_tick();
        true
    }

    /// Whether accepting on listener `id` must wait for its agent's bucket (connections cost
    /// [`crate::ipc::rate::ACCEPT_COST`] each); it accepts again from the rate tick.
    pub(super) fn accept_paused_on_rate(&mut self, id: u64) -> bool {
        let Some(agent) = self.listeners.get(&id).map(|l| l.agent.clone()) else {
            return false;
        };
        if !self.over_rate(&agent, !self.accept_waiting.contains(&id)) {
            return false;
        }
        self.accept_waiting.insert(id);
        self.arm_rate_tick();
        true
    }

    /// Whether `agent`'s byte bucket or CPU account is in debt; `newly`: a socket of it starts
    /// waiting now (counted, and reported at most once per [`REPORT_EVERY`]).
    fn over_rate(&mut self, agent: &str, newly: bool) -> bool {
        let now = Instant::now();
        let Some(e) = self.agents.get_mut(agent) else {
            return false;
        };
        let bytes_over = e
            .rate
            .bucket
            .as_mut()
            .map(|b| (b.ready(now), b.rate(), b.burst()));
        let (limit, rate, burst, contended) = match bytes_over {
            Some((false, rate, burst)) => (ThrottleLimit::Bytes, rate, burst, None),
            _ => {
                let Some(hold) = e.cpu.hold(now) else {
                    return false;
                };
                if newly {
                    e.cpu.note_pause(hold.wait);
                    bump(&self.shared.stats.cpu_pauses, 1);
                }
                let (permille, burst) = e.cpu.limit().unwrap_or_default();
                (ThrottleLimit::Cpu, permille, burst, hold.contended)
            }
        };
        if newly {
            bump(&self.shared.stats.rate_pauses, 1);
            let r = &mut e.rate;
            r.pauses += 1;
            let since = *r.since.get_or_insert(now);
            let due = r
                .last_report
                .is_none_or(|t| now.saturating_duration_since(t) >= REPORT_EVERY);
            if due {
                r.last_report = Some(now);
                let report = Throttle {
                    agent: agent.to_string(),
                    limit,
                    rate,
                    burst,
                    pauses: std::mem::take(&mut r.pauses),
                    throttled: now.saturating_duration_since(since),
                    contended,
                };
                debug!(agent, "ipc: reading paused on the agent's rate ({limit:?})");
                if self.reports.throttles.try_send(report).is_err() {
                    bump(&self.shared.stats.refusals_dropped, 1);
                }
            }
        }
        true
    }

    fn arm_rate_tick(&mut self) {
        if self.rate_armed || self.shutdown_deadline.is_some() {
            return;
        }
        self.rate_armed = true;
        let e = opcode::Timeout::new(&RATE_TICK)
            .build()
            .user_data(ud(K_RATE, 0));
        // SAFETY: the timespec is a static; a timeout references nothing else.
        unsafe { self.push(e) };
    }

    /// Whether `agent`'s byte bucket and CPU account allow reading now (no rate: always).
    fn rate_ready(&mut self, agent: &str) -> bool {
        let now = Instant::now();
        self.agents.get_mut(agent).is_none_or(|e| {
            e.rate.bucket.as_mut().is_none_or(|b| b.ready(now)) && e.cpu.wait(now).is_zero()
        })
    }

    /// Read (and accept) again on the sockets whose agent's bucket allows it; the others stay
    /// waiting, not counted again as new pauses.
    pub(super) fn on_rate_tick(&mut self) {
        self.rate_armed = false;
        let mut agents: HashSet<String> = HashSet::new();
        let accepts: Vec<(u64, Option<String>)> = self
            .accept_waiting
            .iter()
            .map(|id| (*id, self.listeners.get(id).map(|l| l.agent.clone())))
            .collect();
        for (id, agent) in accepts {
            if let Some(a) = agent.as_deref()
                && !self.rate_ready(a)
            {
                continue;
            }
            self.accept_waiting.remove(&id);
            agents.extend(agent);
            self.submit_accept(id);
        }
        let waiting: Vec<(u64, Option<String>)> = self
            .rate_waiting
            .iter()
            .map(|id| (*id, self.conns.get(id).map(|c| c.agent.clone())))
            .collect();
        for (id, agent) in waiting {
            if let Some(a) = agent.as_deref()
                && !self.rate_ready(a)
            {
                continue;
            }
            self.rate_waiting.remove(&id);
            agents.extend(agent);
            // Back into `rate_waiting` when another connection of the agent took the tokens.
            self.submit_recv(id);
        }
        if !self.rate_waiting.is_empty() || !self.accept_waiting.is_empty() {
            self.arm_rate_tick();
        }
        // An agent none of whose sockets waits any more is no longer throttled.
        let still: HashSet<String> = self
            .rate_waiting
            .iter()
            .filter_map(|id| self.conns.get(id).map(|c| c.agent.clone()))
            .chain(
                self.accept_waiting
                    .iter()
                    .filter_map(|id| self.listeners.get(id).map(|l| l.agent.clone())),
            )
            .collect();
        for a in agents.difference(&still) {
            if let Some(e) = self.agents.get_mut(a) {
                e.rate.since = None;
            }
        }
    }
}
