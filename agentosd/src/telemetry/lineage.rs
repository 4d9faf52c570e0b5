//! Turns as far as the daemon can see them: one trace per agent turn, one open turn per agent.
//! A turn opens at the first call of an agent that has none open (or when a caller says a new
//! turn begins), and ends when the next one begins, after an idle time with nothing in flight,
//! when the agent stops, when the daemon stops, or when the table is full and the least
//! recently active turn makes room. Pure: the caller passes the time, so the rules are tested
//! without clocks.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use super::{AgentLabels, TurnCtx, new_span_id, new_trace_id};

/// Why a turn span ended (its `agentos.turn.end` attribute).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TurnEnd {
    /// The agent began its next turn.
    NextTurn,
    /// Nothing happened in it for the idle time and nothing was in flight.
    Idle,
    /// The agent stopped.
    Stopped,
    /// The table of open turns was full and this one was the least recently active.
    Evicted,
    /// The daemon stopped.
    Shutdown,
}

impl TurnEnd {
    pub fn as_str(self) -> &'static str {
        match self {
            TurnEnd::NextTurn => "next-turn",
            TurnEnd::Idle => "idle",
            TurnEnd::Stopped => "agent-stopped",
            TurnEnd::Evicted => "evicted",
            TurnEnd::Shutdown => "daemon-stopping",
        }
    }
}

/// A turn that ended: what its span needs.
#[derive(Debug, Clone, PartialEq)]
pub struct ClosedTurn {
    pub labels: AgentLabels,
    pub ctx: TurnCtx,
    pub start: SystemTime,
    pub end: SystemTime,
    pub reason: TurnEnd,
    /// Children (tool calls, gate decisions, consent waits, model calls) seen in it.
    pub children: u64,
}

#[derive(Debug)]
struct Turn {
    labels: AgentLabels,
    ctx: TurnCtx,
    start: SystemTime,
    /// The last activity: a call entering or leaving, a child span ending.
    last: SystemTime,
    /// Calls of the turn still running (they keep it from ending idle).
    in_flight: u32,
    children: u64,
}

impl Turn {
    fn close(self, end: SystemTime, reason: TurnEnd) -> ClosedTurn {
        ClosedTurn {
            labels: self.labels,
            ctx: self.ctx,
            start: self.start,
            end: end.max(self.start),
            reason,
            children: self.children,
        }
    }
}

/// The open turns, at most one per agent and at most `max` in all.
#[derive(Debug)]
pub struct Turns {
    open: HashMap<String, Turn>,
    max: usize,
    idle: Duration,
}

fn since(later: SystemTime, earlier: SystemTime) -> Duration {
    later.duration_since(earlier).unwrap_or(Duration::ZERO)
}

impl Turns {
    pub fn new(max: usize, idle: Duration) -> Turns {
        Turns {
            open: HashMap::new(),
            max: max.max(1),
            idle,
        }
    }

    pub fn len(&self) -> usize {
        self.open.len()
    }

    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    /// The agent's current turn (opening one when `new_turn`, when it has none, or when its
    /// open one went idle); `hold` counts a call in flight until [`Turns::leave`]. Returns the
    /// turns this closed (the agent's previous one, or the least recently active one of
    /// another agent when the table was full).
    pub fn turn(
        &mut self,
        agent: &AgentLabels,
        new_turn: bool,
        hold: bool,
        now: SystemTime,
    ) -> (TurnCtx, Vec<ClosedTurn>) {
        let mut closed = Vec::new();
        if let Some(t) = self.open.get_mut(&agent.id) {
            let idle = t.in_flight == 0 && since(now, t.last) >= self.idle;
            // A binding that changed (the agent restarted under another contract) starts anew.
            if !new_turn && !idle && t.labels == *agent {
                t.last = t.last.max(now);
                t.in_flight += u32::from(hold);
                return (t.ctx, closed);
            }
            if let Some(t) = self.open.remove(&agent.id) {
                let (end, why) = if idle && !new_turn {
                    (t.last, TurnEnd::Idle)
                } else {
                    (now, TurnEnd::NextTurn)
                };
                closed.push(t.close(end, why));
            }
        }
        if self.open.len() >= self.max
            && let Some(oldest) = self
                .open
                .iter()
                .min_by_key(|(_, t)| t.last)
                .map(|(k, _)| k.clone())
            && let Some(t) = self.open.remove(&oldest)
        {
            closed.push(t.close(now, TurnEnd::Evicted));
        }
        let ctx = TurnCtx {
            trace_id: new_trace_id(),
            span_id: new_span_id(),
        };
        self.open.insert(
            agent.id.clone(),
            Turn {
                labels: agent.clone(),
                ctx,
                start: now,
                last: now,
                in_flight: u32::from(hold),
                children: 0,
            },
        );
        (ctx, closed)
    }

    /// A call held with `hold` ended (no effect when its turn has ended meanwhile).
    pub fn leave(&mut self, agent_id: &str, ctx: &TurnCtx, now: SystemTime) {
        if let Some(t) = self.open.get_mut(agent_id)
            && t.ctx == *ctx
        {
            t.in_flight = t.in_flight.saturating_sub(1);
            t.last = t.last.max(now);
        }
    }

    /// A child span of the agent's turn `trace_id` ended at `end`: it counts as activity.
    pub fn child(&mut self, agent_id: &str, trace_id: &[u8; 16], end: SystemTime) {
        if let Some(t) = self.open.get_mut(agent_id)
            && t.ctx.trace_id == *trace_id
        {
            t.children += 1;
            t.last = t.last.max(end);
        }
    }

    /// Close the turns idle for the idle time with nothing in flight; each ends at its last
    /// activity (the idle tail is not part of the turn).
    pub fn sweep(&mut self, now: SystemTime) -> Vec<ClosedTurn> {
        let idle: Vec<String> = self
            .open
            .iter()
            .filter(|(_, t)| t.in_flight == 0 && since(now, t.last) >= self.idle)
            .map(|(k, _)| k.clone())
            .collect();
        idle.into_iter()
            .filter_map(|k| self.open.remove(&k))
            .map(|t| {
                let end = t.last;
                t.close(end, TurnEnd::Idle)
            })
            .collect()
    }

    /// The agent stopped: its open turn ends now.
    pub fn end(&mut self, agent_id: &str, now: SystemTime) -> Option<ClosedTurn> {
        self.open
            .remove(agent_id)
            .map(|t| t.close(now, TurnEnd::Stopped))
    }

    /// The daemon stops: every open turn ends now.
    pub fn drain(&mut self, now: SystemTime) -> Vec<ClosedTurn> {
        self.open
            .drain()
            .map(|(_, t)| t.close(now, TurnEnd::Shutdown))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(id: &str) -> AgentLabels {
        let (tenant, name) = id.split_once('/').unwrap_or(("default", id));
        AgentLabels::new(id, tenant, name, Some("ab".repeat(32)))
    }

    fn at(s: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 + s)
    }

    #[test]
    fn calls_of_one_turn_share_it_until_the_next_turn_begins() {
        let mut t = Turns::new(8, Duration::from_secs(30));
        let a = agent("t/a");
        let (first, closed) = t.turn(&a, false, false, at(0));
        assert!(closed.is_empty());
        let (again, closed) = t.turn(&a, false, false, at(10));
        assert_eq!(
            first, again,
            "a call within the idle time joins the open turn"
        );
        assert!(closed.is_empty());
        let (next, closed) = t.turn(&a, true, false, at(12));
        assert_ne!(next.trace_id, first.trace_id, "a new turn is a new trace");
        assert_eq!(closed.len(), 1);
        assert_eq!(closed[0].ctx, first);
        assert_eq!(closed[0].reason, TurnEnd::NextTurn);
        assert_eq!((closed[0].start, closed[0].end), (at(0), at(12)));
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn an_idle_turn_ends_at_its_last_activity_unless_a_call_is_in_flight() {
        let mut t = Turns::new(8, Duration::from_secs(30));
        let (a, b) = (agent("t/a"), agent("t/b"));
        let (ta, _) = t.turn(&a, false, false, at(0));
        t.child("t/a", &ta.trace_id, at(5));
        let (tb, _) = t.turn(&b, false, true, at(0));
        // b holds a call (a consent wait) past the idle time: its turn stays open.
        let closed = t.sweep(at(40));
        assert_eq!(closed.len(), 1, "{closed:?}");
        assert_eq!(closed[0].ctx, ta);
        assert_eq!(closed[0].reason, TurnEnd::Idle);
        assert_eq!(
            closed[0].end,
            at(5),
            "the idle tail is not part of the turn"
        );
        assert_eq!(closed[0].children, 1);
        assert!(t.sweep(at(60)).is_empty(), "b's call is still in flight");
        t.leave("t/b", &tb, at(70));
        assert!(t.sweep(at(80)).is_empty(), "b was active 10 s ago");
        let closed = t.sweep(at(100));
        assert_eq!(closed.len(), 1);
        assert_eq!((closed[0].ctx, closed[0].end), (tb, at(70)));
    }

    #[test]
    fn a_call_after_the_idle_time_begins_a_new_turn() {
        let mut t = Turns::new(8, Duration::from_secs(30));
        let a = agent("t/a");
        let (first, _) = t.turn(&a, false, false, at(0));
        let (second, closed) = t.turn(&a, false, false, at(31));
        assert_ne!(first.trace_id, second.trace_id);
        assert_eq!(closed.len(), 1);
        assert_eq!(
            (closed[0].reason, closed[0].end),
            (TurnEnd::Idle, at(0)),
            "{closed:?}"
        );
    }

    #[test]
    fn the_table_is_bounded_and_evicts_the_least_recently_active_turn() {
        let mut t = Turns::new(2, Duration::from_secs(30));
        let (a, b, c) = (agent("t/a"), agent("t/b"), agent("t/c"));
        let (ta, _) = t.turn(&a, false, false, at(0));
        t.turn(&b, false, false, at(1));
        t.turn(&a, false, false, at(2));
        let (_, closed) = t.turn(&c, false, false, at(3));
        assert_eq!(t.len(), 2);
        assert_eq!(closed.len(), 1);
        assert_eq!(
            closed[0].labels.id, "t/b",
            "b was the least recently active"
        );
        assert_eq!(closed[0].reason, TurnEnd::Evicted);
        let (ta2, closed) = t.turn(&a, false, false, at(4));
        assert_eq!(ta, ta2, "a kept its turn");
        assert!(closed.is_empty());
    }

    #[test]
    fn stop_and_shutdown_end_turns_and_stale_leaves_are_ignored() {
        let mut t = Turns::new(8, Duration::from_secs(30));
        let (a, b) = (agent("t/a"), agent("t/b"));
        let (ta, _) = t.turn(&a, false, true, at(0));
        t.turn(&b, false, false, at(0));
        let closed = t.end("t/a", at(3)).expect("a had a turn");
        assert_eq!((closed.reason, closed.end), (TurnEnd::Stopped, at(3)));
        assert!(t.end("t/a", at(4)).is_none());
        // The call of the ended turn finishes after a new turn began: no effect on the new one.
        let (ta2, _) = t.turn(&a, false, false, at(5));
        t.leave("t/a", &ta, at(6));
        assert_ne!(ta, ta2);
        let all = t.drain(at(9));
        assert_eq!(all.len(), 2);
        assert!(all.iter().all(|c| c.reason == TurnEnd::Shutdown));
        assert!(t.is_empty());
    }

    #[test]
    fn a_changed_binding_begins_a_new_turn() {
        let mut t = Turns::new(8, Duration::from_secs(30));
        let a = agent("t/a");
        let (first, _) = t.turn(&a, false, false, at(0));
        let mut rebound = a.clone();
        rebound.binding = Some("cd".repeat(32));
        let (second, closed) = t.turn(&rebound, false, false, at(1));
        assert_ne!(first, second);
        assert_eq!(closed[0].labels.binding, a.binding);
    }
}
