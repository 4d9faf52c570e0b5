//! Byte accounting of the agents' connections (issue 15): what the daemon holds for a
//! connection is counted in bytes, and the ring reads from it only while the counts allow.
//!
//! Per connection: `inbound`, complete lines received and not yet taken by the daemon (the line
//! being assembled is bounded on its own by `max_line`, lines.rs); `outbound`, replies queued and
//! not yet sent (in the outbox and in the ring's send buffer). Per agent: the sum of both over
//! its connections. The decision to read is [`pause`], a pure function; [`ConnBytes`] holds the
//! counters the tokio side and the ring thread share. No syscalls here.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

/// The byte bounds (from [`super::Limits`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteLimits {
    /// Complete lines held per connection before the ring stops reading it.
    pub inbound: usize,
    /// Reply bytes queued per connection before senders wait and the ring stops reading it.
    pub outbound: usize,
    /// Inbound plus outbound bytes over all of one agent's connections before the ring stops
    /// reading those of its connections that hold anything.
    pub agent: usize,
    /// How long a connection may stay over its outbound bound before it is disconnected.
    pub stall: Duration,
}

/// Why the ring does not read from a connection now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pause {
    /// The agent does not read its replies: `outbound` is at its bound or a reply waits for
    /// room. Staying so for [`ByteLimits::stall`] disconnects it.
    Outbound,
    /// The daemon has not yet taken the lines received (`inbound` at its bound).
    Inbound,
    /// The agent's connections together hold `agent` bytes; this one holds some of them.
    Agent,
}

/// One connection's counts at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Held {
    pub inbound: usize,
    pub outbound: usize,
    /// Senders waiting for room in the outbound queue.
    pub waiting: usize,
}

impl Held {
    pub fn total(&self) -> usize {
        self.inbound.saturating_add(self.outbound)
    }

    /// The agent does not keep up with its replies.
    pub fn out_over(&self, l: &ByteLimits) -> bool {
        self.outbound >= l.outbound || self.waiting > 0
    }
}

/// Whether the ring may read from a connection holding `conn`, when the agent's connections
/// hold `agent_held` bytes in all (`conn` included). A connection that holds nothing is always
/// read, whatever the agent's total, so no connection waits on another one to drain: each pause
/// ends by an event of its own connection (its lines taken, its replies sent, or its stall
/// timeout).
pub fn pause(conn: Held, agent_held: usize, l: &ByteLimits) -> Option<Pause> {
    if conn.out_over(l) {
        Some(Pause::Outbound)
    } else if conn.inbound >= l.inbound {
        Some(Pause::Inbound)
    } else if agent_held >= l.agent && conn.total() > 0 {
        Some(Pause::Agent)
    } else {
        None
    }
}

/// Whether a connection holding `conn` counts as not reading its replies (its stall clock runs):
/// paused on its own outbound bound, or paused on the agent's bound while replies of its own are
/// unsent (the agent reads none of them, so no event of this connection would end the pause).
pub fn stalled(conn: Held, agent_held: usize, l: &ByteLimits) -> bool {
    match pause(conn, agent_held, l) {
        Some(Pause::Outbound) => true,
        Some(Pause::Agent) => conn.outbound > 0,
        Some(Pause::Inbound) | None => false,
    }
}

/// The counters of one connection, shared by its [`super::Inbox`], its [`super::Outbox`]
/// clones and the ring thread.
#[derive(Debug)]
pub struct ConnBytes {
    out_limit: usize,
    inbound: AtomicUsize,
    outbound: AtomicUsize,
    waiting: AtomicUsize,
    /// The ring stopped reading and waits for the daemon to take lines ([`ConnBytes::taken`]).
    paused: AtomicBool,
    /// Torn down: senders get `Closed`, the inbox ends.
    closed: AtomicBool,
    /// Woken when outbound bytes are sent or the connection closes.
    pub(super) room: tokio::sync::Notify,
}

impl ConnBytes {
    pub fn new(out_limit: usize) -> Self {
        ConnBytes {
            out_limit: out_limit.max(1),
            inbound: AtomicUsize::new(0),
            outbound: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            paused: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            room: tokio::sync::Notify::new(),
        }
    }

    pub fn held(&self) -> Held {
        Held {
            inbound: self.inbound.load(Ordering::SeqCst),
            outbound: self.outbound.load(Ordering::SeqCst),
            waiting: self.waiting.load(Ordering::SeqCst),
        }
    }

    /// `n` bytes of complete lines were received (ring).
    pub fn received(&self, n: usize) {
        self.inbound.fetch_add(n, Ordering::SeqCst);
    }

    /// The daemon took a line of `n` bytes. True when the ring had paused reading and must be
    /// told to look again (exactly one taker sees it per pause).
    pub fn taken(&self, n: usize) -> bool {
        sub(&self.inbound, n);
        self.paused.swap(false, Ordering::SeqCst)
    }

    /// The ring pauses (`true`) or resumes reading. After pausing it must check [`pause`] once
    /// more: a line taken in between saw no pause to report.
    pub fn set_paused(&self, p: bool) {
        self.paused.store(p, Ordering::SeqCst);
    }

    pub fn is_paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    /// Room for a reply of `n` bytes: granted when the queue is empty (a reply larger than the
    /// bound still goes, alone) or when it fits under the bound.
    pub fn try_reserve_out(&self, n: usize) -> bool {
        let mut cur = self.outbound.load(Ordering::SeqCst);
        loop {
            if cur != 0 && cur.saturating_add(n) > self.out_limit {
                return false;
            }
            match self.outbound.compare_exchange_weak(
                cur,
                cur + n,
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => return true,
                Err(now) => cur = now,
            }
        }
    }

    /// `n` reserved bytes left the daemon (sent, or given back unsent).
    pub fn sent(&self, n: usize) {
        sub(&self.outbound, n);
        self.room.notify_waiters();
    }

    /// A sender starts (`true`) or stops waiting for room.
    pub fn set_waiting(&self, w: bool) {
        if w {
            self.waiting.fetch_add(1, Ordering::SeqCst);
        } else {
            sub(&self.waiting, 1);
        }
    }

    /// The connection is gone: wake every waiting sender (they get `Closed`).
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.room.notify_waiters();
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }
}

fn sub(a: &AtomicUsize, n: usize) {
    // Never below zero, whatever order the updates come in.
    let _ = a.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| {
        Some(v.saturating_sub(n))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: ByteLimits = ByteLimits {
        inbound: 100,
        outbound: 50,
        agent: 300,
        stall: Duration::from_secs(5),
    };

    fn held(inbound: usize, outbound: usize, waiting: usize) -> Held {
        Held {
            inbound,
            outbound,
            waiting,
        }
    }

    #[test]
    fn pause_table() {
        let cases = [
            // (conn, agent total, expected)
            (held(0, 0, 0), 0, None),
            (held(99, 49, 0), 148, None),
            (held(100, 0, 0), 100, Some(Pause::Inbound)),
            (held(0, 50, 0), 50, Some(Pause::Outbound)),
            // a reply waiting for room is "not reading" even under the byte bound
            (held(0, 10, 1), 10, Some(Pause::Outbound)),
            // outbound is reported first: it is the one that leads to a disconnect
            (held(100, 50, 0), 150, Some(Pause::Outbound)),
            // the agent is over: connections holding something wait, empty ones go on
            (held(1, 0, 0), 300, Some(Pause::Agent)),
            (held(0, 1, 0), 300, Some(Pause::Agent)),
            (held(0, 0, 0), 10_000, None),
        ];
        for (conn, agent, want) in cases {
            assert_eq!(pause(conn, agent, &L), want, "{conn:?} agent {agent}");
        }
    }

    #[test]
    fn stalled_table() {
        let cases = [
            (held(0, 50, 0), 50, true),
            (held(0, 10, 1), 10, true),
            // Over the agent's bound with replies unsent: nothing of its own would resume it.
            (held(0, 10, 0), 300, true),
            // Over the agent's bound with only lines to take: the daemon takes them.
            (held(10, 0, 0), 300, false),
            // The daemon is behind, not the agent.
            (held(100, 10, 0), 110, false),
            (held(0, 0, 0), 300, false),
        ];
        for (conn, agent, want) in cases {
            assert_eq!(stalled(conn, agent, &L), want, "{conn:?} agent {agent}");
        }
    }

    #[test]
    fn outbound_reservations_respect_the_bound_but_let_one_large_reply_through() {
        let c = ConnBytes::new(50);
        assert!(
            c.try_reserve_out(80),
            "an empty queue takes a reply of any size"
        );
        assert!(!c.try_reserve_out(1), "nothing more while over the bound");
        assert!(c.held().out_over(&L));
        c.sent(30);
        assert_eq!(c.held().outbound, 50);
        assert!(!c.try_reserve_out(1));
        c.sent(50);
        assert_eq!(c.held().outbound, 0);
        assert!(c.try_reserve_out(20));
        assert!(c.try_reserve_out(30), "exactly at the bound fits");
        assert!(!c.try_reserve_out(1));
        assert!(pause(c.held(), 50, &L) == Some(Pause::Outbound));
        c.sent(50);
        assert_eq!(pause(c.held(), 0, &L), None);
    }

    #[test]
    fn inbound_counts_and_the_pause_handshake() {
        let c = ConnBytes::new(50);
        c.received(60);
        c.received(40);
        assert_eq!(pause(c.held(), 100, &L), Some(Pause::Inbound));
        // Not paused yet: taking a line reports nothing to resume.
        assert!(!c.taken(10));
        assert_eq!(c.held().inbound, 90);
        c.set_paused(true);
        // The first taker after a pause reports it, once.
        assert!(c.taken(60));
        assert!(!c.taken(30));
        assert_eq!(c.held().inbound, 0);
        assert!(!c.is_paused());
        // Never below zero.
        assert!(!c.taken(5));
        assert_eq!(c.held().inbound, 0);
    }

    #[test]
    fn waiting_senders_count_as_over_and_close_wakes_them() {
        let c = ConnBytes::new(50);
        c.set_waiting(true);
        assert!(c.held().out_over(&L));
        c.set_waiting(false);
        assert!(!c.held().out_over(&L));
        assert!(!c.is_closed());
        c.close();
        assert!(c.is_closed());
    }
}
