//! Connections the ipc layer closed because their agent did not read its replies (ipc/budget.rs):
//! a line in the agent's journal and a Gate record, rate-limited per agent like the kernel
//! denial records (enforce/limit.rs), as are the records of connections refused at an agent's
//! socket (`socket-refused`, mod.rs); what the rate leaves out is counted in one
//! "socket-events-suppressed" record per agent every [`SUMMARY_EVERY`], never silently.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use audit::{Decision, Kind};
use serde_json::json;
use tracing::warn;

use super::{McpService, lock, split_id};
use crate::ipc::{Disconnect, Throttle, ThrottleLimit};

/// How often the suppressed counts are written (as the denials' report does).
pub const SUMMARY_EVERY: Duration = Duration::from_secs(2);

/// The event name of a disconnect record (and its key in a summary's `by`).
pub const EVENT: &str = "socket-stalled";

/// The event name of a throttle record (and its key in a summary's `by`).
pub const THROTTLED: &str = "socket-throttled";

/// Reports after a disconnect at which freed memory is given back: the connection's session
/// ends and drops its lines a moment after the ring closed it.
pub const TRIM_TICKS: u32 = 2;

/// Give the allocator's free memory back to the system (glibc keeps what the connections of a
/// flooding agent held in its arenas otherwise, and the daemon's RSS would stay at its peak).
fn give_back_memory() {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: malloc_trim only walks the allocator's own free lists under its locks; it
        // takes no pointer and is safe to call from any thread at any time.
        unsafe { libc::malloc_trim(0) };
    }
}

/// What the agent's journal says (also the log line).
pub fn note_text(d: &Disconnect) -> String {
    format!(
        "agentosd closed MCP connection {} (pid {}): the agent did not read its replies for {} ms \
         ({} bytes of replies queued, the bound is {} per connection, --ipc-outbound-bytes); \
         {} bytes of its requests were dropped with it",
        d.conn,
        d.pid.map_or("-".to_string(), |p| p.to_string()),
        d.stalled.as_millis(),
        d.outbound,
        d.limit,
        d.inbound
    )
}

/// Per mille as a percentage: `52` is `5.2%`.
fn pct(permille: u64) -> String {
    format!("{}.{}%", permille / 10, permille % 10)
}

/// What the agent's journal says when the daemon throttles it (also the log line).
pub fn throttle_text(t: &Throttle) -> String {
    if let (ThrottleLimit::Cpu, Some(c)) = (t.limit, t.contended)
        && c.stall_threshold_permille > 0
    {
        return format!(
            "agentosd paused reading this agent's MCP connections {} time(s): another agent \
             waited for a CPU {} of the time, over {} (--ipc-agent-cpu-stall), so the daemon \
             lent no CPU beyond the agents' shares, and this agent took {} of one CPU, more than \
             its guaranteed share of {} (--ipc-agent-cpu), throttled for {} ms so far",
            t.pauses,
            pct(c.stall_permille),
            pct(c.stall_threshold_permille),
            pct(c.agent_permille),
            pct(t.rate),
            t.throttled.as_millis()
        );
    }
    if let (ThrottleLimit::Cpu, Some(c)) = (t.limit, t.contended) {
        return format!(
            "agentosd paused reading this agent's MCP connections {} time(s): the daemon was \
             spending {} of one CPU for all agents, over its ceiling of {} \
             (--ipc-agent-cpu-ceiling), and this agent took {} of it, more than its fair share \
             of {} (its guaranteed share is {}; --ipc-agent-cpu), throttled for {} ms so far",
            t.pauses,
            pct(c.total_permille),
            pct(c.ceiling_permille),
            pct(c.agent_permille),
            pct(c.fair_permille),
            pct(t.rate),
            t.throttled.as_millis()
        );
    }
    if t.limit == ThrottleLimit::Cpu {
        return format!(
            "agentosd paused reading this agent's MCP connections {} time(s): it made the daemon \
             spend more than its share of {}.{}% of one CPU (burst {} ms of CPU; --ipc-agent-cpu), \
             throttled for {} ms so far",
            t.pauses,
            t.rate / 10,
            t.rate % 10,
            t.burst / 1_000_000,
            t.throttled.as_millis()
        );
    }
    format!(
        "agentosd paused reading this agent's MCP connections {} time(s): it sent more than its \
         rate of {} bytes a second (burst {}; each message counts {} bytes more; \
         --ipc-agent-rate), throttled for {} ms so far",
        t.pauses,
        t.rate,
        t.burst,
        crate::ipc::rate::LINE_COST,
        t.throttled.as_millis()
    )
}

impl McpService {
    /// An agent over its rate: its requests wait (nothing is refused), and the record says so,
    /// within the same per-agent record rate as the other socket events.
    pub(super) fn throttled(&self, t: Throttle) {
        if !lock(&self.record_limit).admit(&t.agent, THROTTLED, Instant::now()) {
            return;
        }
        let text = throttle_text(&t);
        warn!(agent = %t.agent, "{text}");
        self.callers.note(&t.agent, &text);
        if let Some(trail) = self.audit() {
            let (tenant, name) = split_id(&t.agent);
            let detail = match t.limit {
                ThrottleLimit::Bytes => json!({
                    "event": THROTTLED,
                    "limit": "bytes",
                    "reason": "the agent sent more than its rate; its requests wait",
                    "rate": t.rate,
                    "burst": t.burst,
                    "line_cost": crate::ipc::rate::LINE_COST,
                    "pauses": t.pauses,
                    "throttled_ms": t.throttled.as_millis() as u64,
                }),
                ThrottleLimit::Cpu => match t.contended {
                    None => json!({
                        "event": THROTTLED,
                        "limit": "cpu",
                        "contended": false,
                        "reason": "the agent took more than its share of the daemon's CPU; its requests wait",
                        "cpu_permille": t.rate,
                        "burst_cpu_us": t.burst / 1000,
                        "pauses": t.pauses,
                        "throttled_ms": t.throttled.as_millis() as u64,
                    }),
                    Some(c) if c.stall_threshold_permille > 0 => json!({
                        "event": THROTTLED,
                        "limit": "cpu",
                        "contended": true,
                        "reason": "another agent within its share waited for a CPU over the threshold, so the daemon lent no CPU beyond the shares and the agent was over its own; its requests wait",
                        "cpu_permille": t.rate,
                        "burst_cpu_us": t.burst / 1000,
                        "stall_permille": c.stall_permille,
                        "stall_threshold_permille": c.stall_threshold_permille,
                        "agent_permille": c.agent_permille,
                        "agents_permille": c.total_permille,
                        "pauses": t.pauses,
                        "throttled_ms": t.throttled.as_millis() as u64,
                    }),
                    Some(c) => json!({
                        "event": THROTTLED,
                        "limit": "cpu",
                        "contended": true,
                        "reason": "the daemon's CPU for all agents was over its ceiling and the agent took more than its fair share of it; its requests wait",
                        "cpu_permille": t.rate,
                        "burst_cpu_us": t.burst / 1000,
                        "ceiling_permille": c.ceiling_permille,
                        "agents_permille": c.total_permille,
                        "fair_permille": c.fair_permille,
                        "agent_permille": c.agent_permille,
                        "pauses": t.pauses,
                        "throttled_ms": t.throttled.as_millis() as u64,
                    }),
                },
            };
            trail.submit_or_count(
                trail
                    .agent_record(Kind::Gate, tenant, name)
                    .decision(Decision::Deny)
                    .detail(detail),
            );
        }
    }

    pub(super) fn disconnected(&self, d: Disconnect) {
        if !lock(&self.record_limit).admit(&d.agent, EVENT, Instant::now()) {
            return;
        }
        self.trim_after.store(TRIM_TICKS, Ordering::Relaxed);
        let text = note_text(&d);
        warn!(agent = %d.agent, "{text}");
        self.callers.note(&d.agent, &text);
        if let Some(t) = self.audit() {
            let (tenant, name) = split_id(&d.agent);
            t.submit_or_count(
                t.agent_record(Kind::Gate, tenant, name)
                    .decision(Decision::Deny)
                    .detail(json!({
                        "event": EVENT,
                        "reason": "the agent did not read its replies",
                        "conn": d.conn,
                        "peer_pid": d.pid,
                        "peer_uid": d.uid,
                        "stalled_ms": d.stalled.as_millis() as u64,
                        "outbound_bytes": d.outbound,
                        "inbound_bytes": d.inbound,
                        "limit": d.limit,
                    })),
            );
        }
    }

    /// One record per agent whose disconnects were over the rate since the last report; and
    /// after a disconnect, the memory its connection held is given back to the system.
    pub(super) fn report_suppressed(&self) {
        if self
            .trim_after
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok()
        {
            give_back_memory();
        }
        let summaries = lock(&self.record_limit).summaries(Instant::now());
        let limits = self.limits.records;
        for s in summaries {
            let what: Vec<String> = s.by.iter().map(|(e, n)| format!("{n} {e}")).collect();
            let text = format!(
                "{} more MCP socket event(s) in {} ms ({}; over the record rate {}/s, burst {}): counted, not recorded one by one",
                s.suppressed,
                s.window.as_millis(),
                what.join(", "),
                limits.per_sec,
                limits.burst
            );
            warn!(agent = %s.agent, "{text}");
            self.callers.note(&s.agent, &text);
            let Some(t) = self.audit() else {
                continue;
            };
            let (tenant, name) = split_id(&s.agent);
            t.submit_or_count(
                t.agent_record(Kind::Gate, tenant, name)
                    .decision(Decision::Deny)
                    .detail(json!({
                        "event": "socket-events-suppressed",
                        "count": s.suppressed,
                        "by": s.by,
                        "window_ms": s.window.as_millis() as u64,
                        "agent": s.agent,
                        "limit": {"per_sec": limits.per_sec, "burst": limits.burst},
                    })),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_note_names_the_bound_and_what_was_dropped() {
        let d = Disconnect {
            agent: "t/a".into(),
            conn: 7,
            pid: Some(42),
            uid: 1000,
            inbound: 4096,
            outbound: 5000,
            stalled: Duration::from_millis(5250),
            limit: 4096,
        };
        let t = note_text(&d);
        assert!(t.contains("connection 7 (pid 42)"), "{t}");
        assert!(t.contains("for 5250 ms"), "{t}");
        assert!(t.contains("--ipc-outbound-bytes"), "{t}");
        assert!(t.contains("4096 bytes of its requests"), "{t}");
    }

    #[test]
    fn the_throttle_note_names_the_rate_and_the_flag() {
        let t = throttle_text(&Throttle {
            agent: "t/a".into(),
            limit: ThrottleLimit::Bytes,
            rate: 1000,
            burst: 500,
            pauses: 3,
            throttled: Duration::from_millis(1500),
            contended: None,
        });
        assert!(t.contains("3 time(s)"), "{t}");
        assert!(t.contains("rate of 1000 bytes a second (burst 500"), "{t}");
        assert!(t.contains("--ipc-agent-rate"), "{t}");
        assert!(t.contains("for 1500 ms"), "{t}");
        let t = throttle_text(&Throttle {
            agent: "t/a".into(),
            limit: ThrottleLimit::Cpu,
            rate: 50,
            burst: 250_000_000,
            pauses: 2,
            throttled: Duration::from_millis(900),
            contended: None,
        });
        assert!(t.contains("share of 5.0% of one CPU"), "{t}");
        assert!(t.contains("burst 250 ms of CPU; --ipc-agent-cpu"), "{t}");
        assert!(t.contains("for 900 ms"), "{t}");
        let t = throttle_text(&Throttle {
            agent: "t/a".into(),
            limit: ThrottleLimit::Cpu,
            rate: 50,
            burst: 250_000_000,
            pauses: 2,
            throttled: Duration::from_millis(900),
            contended: Some(crate::ipc::cpu::Contention {
                ceiling_permille: 500,
                total_permille: 612,
                fair_permille: 250,
                agent_permille: 301,
                stall_permille: 0,
                stall_threshold_permille: 0,
            }),
        });
        assert!(
            t.contains("spending 61.2% of one CPU for all agents"),
            "{t}"
        );
        assert!(
            t.contains("ceiling of 50.0% (--ipc-agent-cpu-ceiling)"),
            "{t}"
        );
        assert!(
            t.contains("took 30.1% of it, more than its fair share of 25.0%"),
            "{t}"
        );
        assert!(t.contains("guaranteed share is 5.0%"), "{t}");
        let t = throttle_text(&Throttle {
            agent: "t/a".into(),
            limit: ThrottleLimit::Cpu,
            rate: 50,
            burst: 250_000_000,
            pauses: 4,
            throttled: Duration::from_millis(300),
            contended: Some(crate::ipc::cpu::Contention {
                ceiling_permille: 500,
                total_permille: 120,
                fair_permille: 50,
                agent_permille: 110,
                stall_permille: 263,
                stall_threshold_permille: 100,
            }),
        });
        assert!(
            t.contains("another agent waited for a CPU 26.3% of the time, over 10.0% (--ipc-agent-cpu-stall)"),
            "{t}"
        );
        assert!(
            t.contains("took 11.0% of one CPU, more than its guaranteed share of 5.0%"),
            "{t}"
        );
    }
}
