//! Unit tests of turns.rs on a simulated executor: tasks run in the order they are woken (as
//! tokio's run queue does), each poll costs what the test says.

use std::sync::Arc;
use std::task::{Wake, Waker};

use super::*;

/// The run queue of the simulated executor: task ids in wake order.
#[derive(Default)]
struct Queue(Mutex<VecDeque<usize>>);

struct Id(usize, Arc<Queue>);

impl Wake for Id {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref()
    }
    fn wake_by_ref(self: &Arc<Self>) {
        let mut q = lock(&self.1.0);
        if !q.contains(&self.0) {
            q.push_back(self.0);
        }
    }
}

struct Sim {
    turns: Arc<Turns>,
    queue: Arc<Queue>,
    /// Per task: its wrapper, its real waker, its agent, polls left, cost of a poll.
    tasks: Vec<(Arc<TaskWake>, Waker, &'static str, u32, u64)>,
    /// Agent name → its place.
    agents: Vec<(&'static str, usize)>,
    /// Agents in the order their polls ran.
    ran: Vec<&'static str>,
}

impl Sim {
    fn new(slice: u64) -> Sim {
        Sim {
            turns: Arc::new(Turns::new(slice)),
            queue: Arc::new(Queue::default()),
            tasks: Vec::new(),
            agents: Vec::new(),
            ran: Vec::new(),
        }
    }

    fn agent(&mut self, name: &'static str) -> usize {
        if let Some(&(_, i)) = self.agents.iter().find(|(n, _)| *n == name) {
            return i;
        }
        let i = self.turns.join();
        self.agents.push((name, i));
        i
    }

    /// A task of `agent` needing `polls` polls of `cost` ns each, runnable (spawned).
    fn spawn(&mut self, agent: &'static str, polls: u32, cost: u64) -> usize {
        let a = self.agent(agent);
        let id = self.tasks.len();
        let w = Waker::from(Arc::new(Id(id, self.queue.clone())));
        self.tasks.push((self.turns.task(a), w, agent, polls, cost));
        lock(&self.queue.0).push_back(id);
        id
    }

    /// Run one task from the queue; false when it is empty.
    fn step(&mut self) -> bool {
        let Some(id) = lock(&self.queue.0).pop_front() else {
            return false;
        };
        let (t, w, agent, left, cost) = self.tasks[id].clone();
        if left == 0 {
            return true;
        }
        if self.turns.admit(&t, &w) == Admit::Park {
            return true;
        }
        self.ran.push(agent);
        self.tasks[id].3 -= 1;
        let done = left == 1;
        self.turns.polled(&t, cost, done);
        if !done {
            // It has more to do at once (a flood's session with lines queued): it wakes itself.
            Waker::from(t).wake_by_ref();
        }
        true
    }

    fn run(&mut self, max: usize) {
        for _ in 0..max {
            if !self.step() {
                return;
            }
        }
    }
}

#[test]
fn a_polite_task_runs_after_one_more_flood_poll_not_after_its_backlog() {
    let mut s = Sim::new(1_000);
    // The flood: 32 tasks ready, 100 polls of 100 ns each; they run a while first.
    for _ in 0..32 {
        s.spawn("flood", 100, 100);
    }
    s.run(50);
    // The polite agent's call arrives behind the 32 queued flood tasks.
    let before = s.ran.len();
    s.spawn("polite", 1, 100);
    s.run(10_000);
    let after: Vec<_> = s.ran[before..].to_vec();
    let at = after.iter().position(|a| *a == "polite").unwrap();
    // Its agent is far behind in virtual time and comes back a slice below the flood: the
    // flood's tasks ahead of it are parked after at most one more poll (without the credit, a
    // slice of the flood, 10 polls of 100 ns, ran first).
    assert!(at <= 1, "the polite task ran after {at} flood polls");
    // The flood was not starved: everything ran.
    assert_eq!(s.ran.iter().filter(|a| **a == "flood").count(), 32 * 100);
    assert!(s.turns.stats.parks.load(Ordering::Relaxed) > 0);
}

#[test]
fn two_floods_share_the_polls_by_cost() {
    let mut s = Sim::new(1_000);
    for _ in 0..8 {
        s.spawn("dear", 1_000, 500);
        s.spawn("cheap", 1_000, 50);
    }
    s.run(5_000);
    let dear = s.ran.iter().filter(|a| **a == "dear").count() as f64 * 500.0;
    let cheap = s.ran.iter().filter(|a| **a == "cheap").count() as f64 * 50.0;
    assert!(
        (dear / cheap - 1.0).abs() < 0.15,
        "CPU: dear {dear} ns, cheap {cheap} ns"
    );
}

#[test]
fn an_agent_alone_is_never_parked_and_a_returning_one_cannot_bank_time() {
    let mut s = Sim::new(1_000);
    for _ in 0..4 {
        s.spawn("alone", 100, 1_000);
    }
    s.run(10_000);
    assert_eq!(s.turns.stats.parks.load(Ordering::Relaxed), 0);
    assert_eq!(s.ran.len(), 400);
    // An agent idle all along comes back at the others' virtual time, not at zero: it does
    // not get 400 µs of polls in a row ahead of a flood that starts with it.
    for _ in 0..4 {
        s.spawn("alone", 100, 1_000);
    }
    s.spawn("late", 100, 1_000);
    let before = s.ran.len();
    s.run(60);
    let late = s.ran[before..].iter().filter(|a| **a == "late").count();
    assert!(late < 40, "the late agent took {late} of 60 polls");
    let i = s.agent("late");
    let (v, _, _) = s.turns.flow(i);
    // At most the credit (one slice) below the floor, which trails "alone" by its last poll.
    assert!(v >= 400_000 - 2 * 1_000, "the late agent started at {v} ns");
}

#[test]
fn a_light_agent_goes_first_at_every_wake_and_a_heavy_one_gets_no_credit() {
    let mut s = Sim::new(1_000);
    for _ in 0..32 {
        s.spawn("flood", 1_000, 100);
    }
    s.run(200);
    // A call wakes its agent's task several times (the line, the record, the tool's reply):
    // each time it runs after at most one more poll of the flood, however long the flood ran
    // between them.
    for gap in [10, 300, 3_000] {
        let before = s.ran.len();
        s.spawn("polite", 1, 100);
        s.run(100);
        let at = s.ran[before..].iter().position(|a| *a == "polite").unwrap();
        assert!(
            at <= 1,
            "after {gap} flood polls the polite task waited {at}"
        );
        s.run(gap);
    }
    // The flood is runnable throughout: it is never placed below its own virtual time.
    let flood = s.agent("flood");
    let (v, _, _) = s.turns.flow(flood);
    let polls = s.ran.iter().filter(|a| **a == "flood").count() as u64;
    assert_eq!(v, polls * 100);
}

#[test]
fn nobody_starves_and_nothing_stays_counted() {
    let mut s = Sim::new(100);
    for k in 0..50 {
        s.spawn("a", 20, 10_000);
        s.spawn("b", 20, 10);
        if k % 10 == 0 {
            s.spawn("c", 1, 1);
        }
    }
    s.run(1_000_000);
    for name in ["a", "b", "c"] {
        let i = s.agent(name);
        let (_, runnable, parked) = s.turns.flow(i);
        assert_eq!((runnable, parked), (0, 0), "{name}");
    }
    assert_eq!(s.ran.iter().filter(|a| **a == "a").count(), 1_000);
    assert_eq!(s.ran.iter().filter(|a| **a == "b").count(), 1_000);
    assert_eq!(s.ran.iter().filter(|a| **a == "c").count(), 5);
}

#[test]
fn a_dropped_task_leaves_no_count_behind() {
    let mut s = Sim::new(100);
    let a = s.agent("a");
    let b = s.agent("b");
    let ta = s.turns.task(a);
    let tb = s.turns.task(b);
    // b is far ahead and parks; a is dropped unpolled (an aborted call): b must be woken.
    s.turns.polled(&tb, 0, false);
    {
        let mut st = lock(&s.turns.state);
        st.flows[b].vtime = 1_000_000;
    }
    let w = Waker::from(Arc::new(Id(99, s.queue.clone())));
    Waker::from(tb.clone()).wake_by_ref();
    assert_eq!(s.turns.admit(&tb, &w), Admit::Park);
    s.turns.end(&ta);
    assert_eq!(lock(&s.queue.0).back(), Some(&99), "b was woken");
    assert_eq!(s.turns.admit(&tb, &w), Admit::Run);
    assert_eq!(s.turns.flow(a), (0, 0, 0));
}

#[test]
fn an_agents_queue_is_bounded() {
    let turns = Arc::new(Turns::new(0));
    let (a, b) = (turns.join(), turns.join());
    let _hold = turns.task(a); // a runnable at virtual time 0
    let tb0 = turns.task(b);
    turns.polled(&tb0, 10, true);
    let q = Arc::new(Queue::default());
    let w = Waker::from(Arc::new(Id(0, q)));
    let mut parked = 0;
    let mut ran = 0;
    for _ in 0..MAX_PARKED + 10 {
        let t = turns.task(b);
        match turns.admit(&t, &w) {
            Admit::Park => parked += 1,
            Admit::Run => ran += 1,
        }
        std::mem::forget(t);
    }
    assert_eq!(parked, MAX_PARKED);
    assert_eq!(
        ran, 10,
        "past the bound a task runs in the executor's order"
    );
    assert_eq!(turns.flow(b).2, MAX_PARKED);
}
