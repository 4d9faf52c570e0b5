//! Turns on the agents' runtime (issue 15, "Isolation measured"): the order in which the tokio
//! workers poll the agents' tasks (MCP sessions, tool calls, model-gateway connections), fair
//! between agents instead of first come, first served.
//!
//! tokio runs woken tasks in the order they were woken. A flooding agent keeps dozens of them
//! ready (its sessions with lines to parse, up to 32 tool calls in flight), so another agent's
//! single call waits behind all of them: the rationing of ipc/cpu.rs bounds how much the flood
//! gets over a second, not how long one call waits behind it. So every agent task is wrapped
//! ([`super::cpu::Measured`]) and polled only in its agent's turn, like a CPU scheduler's
//! virtual runtime (CFS, start-time fair queueing):
//!
//! - each agent has a **virtual time**, the CPU its tasks' polls used (measured per poll, the
//!   same nanoseconds its account is charged); an agent that becomes runnable again starts no
//!   lower than one [`SLICE`] below the lowest virtual time of the runnable agents (it cannot
//!   bank more than that of what it did not use; like CFS's sleeper credit);
//! - a task is **runnable** from its wake to its next poll (its waker is wrapped to see this);
//! - a task may be polled when its agent's virtual time is at most [`SLICE`] ahead of every
//!   other runnable agent's; otherwise it is **parked** in its agent's queue (returns
//!   `Pending`, keeps its place as runnable) and woken as soon as the agents behind it have
//!   caught up (checked at the end of every poll, and whenever a task ends).
//!
//! So a call of an agent that has used less waits at most one poll of each agent ahead of it
//! plus the cost of parking their ready tasks (a lock and a check each), not for their backlog.
//! Without the credit it waited for up to a slice of each flood's CPU at every wake-up, and a
//! tool call wakes its task three or four times (the line, the durable record, the tool's
//! reply): measured on the two-CPU host under the `calls` flood, where the worker shares its
//! CPU with the flood's own threads, that was 1-2 ms of a slow call's 3-5 (docs/benchmarks.md,
//! "The returning agent's credit");
//! an agent alone is never parked (work-conserving: no rate, no timer). The agent with the
//! lowest virtual time is never parked, so something always runs. Memory: a parked entry per
//! parked task, at most one per task (its tasks are bounded by its connections and calls in
//! flight), and never more than [`MAX_PARKED`] per agent (past that a task runs in tokio's
//! order rather than being queued). Cost: two short locks per poll and a scan of the runnable
//! agents (not of all agents).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Wake, Waker};

/// How far (ns of CPU on the agents' runtime) an agent may run ahead of the others that have
/// work ready: the longest one agent's backlog delays another's poll, per agent ahead of it.
pub const SLICE: u64 = 1_000_000;

/// Parked tasks one agent may have at most (its tasks are bounded well below this by its
/// connections and calls in flight; the bound makes the queue's memory independent of that).
pub const MAX_PARKED: usize = 1024;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One agent's place in the turns.
#[derive(Debug, Default)]
struct Flow {
    vtime: u64,
    /// Its tasks woken and not yet polled (parked ones included).
    runnable: u32,
    parked: VecDeque<Arc<TaskWake>>,
    /// Its index in `State::ready` while `runnable > 0`.
    slot: Option<usize>,
}

#[derive(Debug, Default)]
struct State {
    flows: Vec<Flow>,
    /// Agents with runnable tasks.
    ready: Vec<usize>,
    /// The lowest virtual time of the runnable agents when last looked at (it only moves up);
    /// a returning agent starts no lower than one slice below it.
    floor: u64,
}

/// Counters for tests and the status: polls let through, parks, wakes of parked tasks.
#[derive(Debug, Default)]
pub struct TurnStats {
    pub polls: AtomicU64,
    pub parks: AtomicU64,
    pub unparks: AtomicU64,
}

/// The turns of one ledger's agents ([`super::cpu::CpuLedger`]).
#[derive(Debug)]
pub struct Turns {
    state: Mutex<State>,
    slice: u64,
    pub stats: TurnStats,
}

impl Default for Turns {
    fn default() -> Self {
        Turns::new(SLICE)
    }
}

/// The two lowest virtual times of the runnable agents, with the lowest's index.
fn lowest_two(s: &State) -> (Option<(usize, u64)>, Option<u64>) {
    let mut first: Option<(usize, u64)> = None;
    let mut second: Option<u64> = None;
    for &i in &s.ready {
        let v = s.flows[i].vtime;
        match first {
            Some((_, f)) if v >= f => second = Some(second.map_or(v, |x| x.min(v))),
            _ => {
                second = first.map(|(_, f)| second.map_or(f, |x| x.min(f)));
                first = Some((i, v));
            }
        }
    }
    (first, second)
}

impl State {
    /// The lowest virtual time of the runnable agents other than `i`.
    fn others_lowest(&self, i: usize) -> Option<u64> {
        match lowest_two(self) {
            (Some((j, _)), second) if j == i => second,
            (first, _) => first.map(|(_, v)| v),
        }
    }

    fn eligible(&self, i: usize, slice: u64) -> bool {
        self.others_lowest(i)
            .is_none_or(|o| self.flows[i].vtime <= o.saturating_add(slice))
    }

    /// One more runnable task of agent `i`. An agent that was not runnable comes back at its
    /// own virtual time, but no lower than `credit` below the floor: an agent that used less
    /// than the others goes first (the agents at the floor are eligible for at most one more
    /// poll), and no agent banks more than `credit` of what it did not use.
    fn add_runnable(&mut self, i: usize, credit: u64) {
        let f = &mut self.flows[i];
        f.runnable += 1;
        if f.runnable == 1 {
            f.vtime = f.vtime.max(self.floor.saturating_sub(credit));
            f.slot = Some(self.ready.len());
            self.ready.push(i);
        }
    }

    fn sub_runnable(&mut self, i: usize) {
        let f = &mut self.flows[i];
        f.runnable = f.runnable.saturating_sub(1);
        if f.runnable == 0
            && let Some(pos) = f.slot.take()
        {
            self.ready.swap_remove(pos);
            if let Some(&moved) = self.ready.get(pos) {
                self.flows[moved].slot = Some(pos);
            }
        }
    }

    /// Parked tasks whose agents may run now (the floor moved up first).
    fn unpark(&mut self, slice: u64, out: &mut Vec<Arc<TaskWake>>) {
        let (first, second) = lowest_two(self);
        if let Some((_, v)) = first {
            self.floor = self.floor.max(v);
        }
        for k in 0..self.ready.len() {
            let i = self.ready[k];
            if self.flows[i].parked.is_empty() {
                continue;
            }
            let others = match first {
                Some((j, _)) if j == i => second,
                f => f.map(|(_, v)| v),
            };
            if others.is_none_or(|o| self.flows[i].vtime <= o.saturating_add(slice)) {
                out.extend(self.flows[i].parked.drain(..));
            }
        }
    }
}

/// What a task's wrapper does before a poll.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub enum Admit {
    Run,
    /// Parked in its agent's queue; woken in its turn.
    Park,
}

/// A task's waker, wrapped: it marks the task runnable for its agent before waking it.
#[derive(Debug)]
pub struct TaskWake {
    turns: Arc<Turns>,
    agent: usize,
    /// Guarded by the turns' lock: (woken and not polled since, parked, ended).
    flags: Mutex<(bool, bool, bool)>,
    inner: Mutex<Option<Waker>>,
}

impl Wake for TaskWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref()
    }

    fn wake_by_ref(self: &Arc<Self>) {
        {
            let mut s = lock(&self.turns.state);
            let mut f = lock(&self.flags);
            if f.2 {
                return;
            }
            if !f.0 {
                f.0 = true;
                s.add_runnable(self.agent, self.turns.slice);
            }
        }
        if let Some(w) = lock(&self.inner).as_ref() {
            w.wake_by_ref();
        }
    }
}

impl Turns {
    pub fn new(slice: u64) -> Turns {
        Turns {
            state: Mutex::new(State::default()),
            slice,
            stats: TurnStats::default(),
        }
    }

    /// A new agent's place.
    pub fn join(&self) -> usize {
        let mut s = lock(&self.state);
        s.flows.push(Flow::default());
        s.flows.len() - 1
    }

    /// A new task of `agent`, runnable (it is about to be spawned).
    pub fn task(self: &Arc<Self>, agent: usize) -> Arc<TaskWake> {
        let t = Arc::new(TaskWake {
            turns: self.clone(),
            agent,
            flags: Mutex::new((true, false, false)),
            inner: Mutex::new(None),
        });
        lock(&self.state).add_runnable(agent, self.slice);
        t
    }

    /// Before a poll of `task` (whose real waker is `waker`): run now, or park in its agent's
    /// queue until its turn.
    pub fn admit(&self, task: &Arc<TaskWake>, waker: &Waker) -> Admit {
        {
            let mut w = lock(&task.inner);
            if !w.as_ref().is_some_and(|o| o.will_wake(waker)) {
                *w = Some(waker.clone());
            }
        }
        let mut s = lock(&self.state);
        let mut f = lock(&task.flags);
        if f.1 {
            // Polled while parked (woken by its own event meanwhile): it stays queued.
            if !s.eligible(task.agent, self.slice) {
                return Admit::Park;
            }
            f.1 = false;
            let q = &mut s.flows[task.agent].parked;
            if let Some(p) = q.iter().position(|t| Arc::ptr_eq(t, task)) {
                q.remove(p);
            }
        }
        if f.0
            && !s.eligible(task.agent, self.slice)
            && s.flows[task.agent].parked.len() < MAX_PARKED
        {
            f.1 = true;
            s.flows[task.agent].parked.push_back(task.clone());
            self.stats.parks.fetch_add(1, Ordering::Relaxed);
            return Admit::Park;
        }
        if f.0 {
            f.0 = false;
            s.sub_runnable(task.agent);
        }
        self.stats.polls.fetch_add(1, Ordering::Relaxed);
        Admit::Run
    }

    /// After a poll of `task` that used `ns`: its agent's virtual time moves on and the parked
    /// tasks now in their turn are woken. `done`: the task ended (it is not counted again).
    pub fn polled(&self, task: &Arc<TaskWake>, ns: u64, done: bool) {
        let mut wake = Vec::new();
        {
            let mut s = lock(&self.state);
            let v = &mut s.flows[task.agent].vtime;
            *v = v.saturating_add(ns);
            if done {
                self.end_locked(&mut s, task);
            }
            s.unpark(self.slice, &mut wake);
            for t in &wake {
                lock(&t.flags).1 = false;
            }
        }
        self.wake_parked(wake);
    }

    /// `task` will not be polled again (it ended, or was dropped unfinished).
    pub fn end(&self, task: &Arc<TaskWake>) {
        let mut wake = Vec::new();
        {
            let mut s = lock(&self.state);
            if lock(&task.flags).2 {
                return;
            }
            self.end_locked(&mut s, task);
            s.unpark(self.slice, &mut wake);
            for t in &wake {
                lock(&t.flags).1 = false;
            }
        }
        self.wake_parked(wake);
    }

    fn end_locked(&self, s: &mut State, task: &Arc<TaskWake>) {
        let mut f = lock(&task.flags);
        if f.2 {
            return;
        }
        f.2 = true;
        if f.1 {
            f.1 = false;
            let q = &mut s.flows[task.agent].parked;
            if let Some(p) = q.iter().position(|t| Arc::ptr_eq(t, task)) {
                q.remove(p);
            }
        }
        if f.0 {
            f.0 = false;
            s.sub_runnable(task.agent);
        }
        *lock(&task.inner) = None;
    }

    fn wake_parked(&self, wake: Vec<Arc<TaskWake>>) {
        self.stats
            .unparks
            .fetch_add(wake.len() as u64, Ordering::Relaxed);
        for t in wake {
            if let Some(w) = lock(&t.inner).as_ref() {
                w.wake_by_ref();
            }
        }
    }

    /// Whether a task of agent `i` being polled, which has used `used()` ns of CPU in this poll
    /// so far, is past its turn: another agent with work ready is more than a slice behind it
    /// (the test that would park it at its next poll). A task that loops over queued work in
    /// one poll (a session with lines waiting) asks between items and ends its poll when it is
    /// (ipc/cpu.rs `yield_past_turn`): otherwise the other agent's call waits until tokio's
    /// budget ends the poll, a millisecond of a flood's lines (docs/benchmarks.md, "A poll ends
    /// at its turn"). `used` is read only when another agent has work ready.
    pub fn past_turn(&self, i: usize, used: impl FnOnce() -> u64) -> bool {
        let (mine, others) = {
            let s = lock(&self.state);
            match s.others_lowest(i) {
                Some(o) => (s.flows[i].vtime, o),
                None => return false,
            }
        };
        mine.saturating_add(used()) > others.saturating_add(self.slice)
    }

    /// Agent `agent`'s virtual time, its runnable and parked tasks (tests, the status).
    pub fn flow(&self, agent: usize) -> (u64, u32, usize) {
        let s = lock(&self.state);
        let f = &s.flows[agent];
        (f.vtime, f.runnable, f.parked.len())
    }
}

#[cfg(test)]
#[path = "turns_tests.rs"]
mod tests;
