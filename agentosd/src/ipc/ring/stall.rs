//! The byte bounds in the ring (budget.rs decides): whether to read from a connection now, the
//! clock of a connection whose agent does not read its replies, and its disconnect.

use super::*;

impl Ring {
    /// Bytes held over all of `agent`'s live connections.
    fn agent_held(&self, agent: &str) -> usize {
        self.agents.get(agent).map_or(0, |e| {
            e.conns
                .iter()
                .filter_map(|i| self.conns.get(i))
                .map(|c| c.bytes.held().total())
                .sum()
        })
    }

    fn read_pause(&self, id: u64) -> Option<budget::Pause> {
        let c = self.conns.get(&id)?;
        budget::pause(
            c.bytes.held(),
            self.agent_held(&c.agent),
            &self.limits.bytes(),
        )
    }

    /// Whether reading `id` must wait for its byte counts to come down; marks it paused then.
    /// Each pause ends with an event of the connection itself: its lines taken
    /// ([`Cmd::Read`]), its replies sent (`on_send`), or its stall clock (its tick looks again).
    pub(super) fn paused_on_bytes(&mut self, id: u64) -> bool {
        let Some(p) = self.read_pause(id) else {
            return false;
        };
        if let Some(c) = self.conns.get(&id) {
            c.bytes.set_paused(true);
        }
        // A line taken between the check and the flag saw no pause to report: look again.
        if self.read_pause(id).is_none() {
            if let Some(c) = self.conns.get(&id) {
                c.bytes.set_paused(false);
            }
            return false;
        }
        if p == budget::Pause::Outbound {
            bump(&self.shared.stats.outbound_pauses, 1);
            debug!(
                conn = id,
                "ipc: the agent does not read its replies; reading paused"
            );
        }
        self.track(id);
        true
    }

    /// Start or stop the stall clock of `id` from its counts now ([`budget::stalled`]).
    pub(super) fn track(&mut self, id: u64) {
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        if c.dead {
            return;
        }
        let stalled = budget::stalled(
            c.bytes.held(),
            self.agent_held(&c.agent),
            &self.limits.bytes(),
        );
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if stalled {
            c.over_since.get_or_insert_with(Instant::now);
            self.arm_stall_tick();
        } else {
            c.over_since = None;
        }
    }

    fn arm_stall_tick(&mut self) {
        if self.stall_armed || self.shutdown_deadline.is_some() {
            return;
        }
        self.stall_armed = true;
        let e = opcode::Timeout::new(&STALL_TICK)
            .build()
            .user_data(ud(K_STALL, 0));
        // SAFETY: the timespec is a static; a timeout references nothing else.
        unsafe { self.push(e) };
    }

    /// Every connection over its outbound bound: disconnected once over for the stall timeout.
    pub(super) fn on_stall_tick(&mut self) {
        self.stall_armed = false;
        let now = Instant::now();
        let over: Vec<u64> = self
            .conns
            .iter()
            .filter(|(_, c)| c.over_since.is_some() && !c.dead)
            .map(|(id, _)| *id)
            .collect();
        for id in over {
            self.track(id);
            let Some(since) = self.conns.get(&id).and_then(|c| c.over_since) else {
                // It caught up (or the agent's other connections let go): read it again.
                self.submit_recv(id);
                continue;
            };
            if now.saturating_duration_since(since) >= self.limits.stall_timeout {
                self.disconnect_stalled(id, now.saturating_duration_since(since));
            }
        }
    }

    /// Close a connection whose agent has not read its replies for the stall timeout; what it
    /// held goes with it, and the daemon is told (journal, audit).
    fn disconnect_stalled(&mut self, id: u64, stalled: Duration) {
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        let held = c.bytes.held();
        let report = Disconnect {
            agent: c.agent.clone(),
            conn: id,
            pid: c.pid,
            uid: c.uid,
            inbound: held.inbound,
            outbound: held.outbound,
            stalled,
            limit: self.limits.outbound_bytes,
        };
        warn!(
            agent = report.agent,
            conn = id,
            "ipc: closing a connection whose agent has not read its replies for {} ms ({} bytes queued, bound {})",
            stalled.as_millis(),
            held.outbound,
            self.limits.outbound_bytes
        );
        bump(&self.shared.stats.stalled, 1);
        self.teardown(id);
        if self.reports.disconnects.try_send(report).is_err() {
            bump(&self.shared.stats.refusals_dropped, 1);
        }
    }
}
