//! The agents' tasks take turns on the agents' runtime (ipc/turns.rs, issue 15 "Isolation
//! measured"): a flooding agent with 32 tasks ready (its calls in flight) and a polite agent
//! whose one call arrives behind them. Measured in order and count, not wall time: how many
//! units of the flood's work run between the polite call's spawn and its own unit. In tokio's
//! order (first come, first served) that is every queued task's unit, 32; in turns at most a
//! slice of the flood (ipc::turns::SLICE of CPU, 4 units of 250 µs) and the parked ones' checks.
//! The same for work a polite call spawns (its tool's reader), and on the agents' runtime itself
//! for tasks woken from outside it or by its I/O driver (below). No root needed: the daemon's
//! own wrapper (`ipc::cpu::Measured`) and ledger, a tokio runtime, the agents' runtime.

#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use agentosd::agent_work;
use agentosd::ipc::cpu::{
    AgentCpu, CpuLedger, CpuRate, Measured, spawn_for_current, thread_cpu_ns,
};
use tokio::io::AsyncReadExt;

/// CPU of one unit of work.
const UNIT_NS: u64 = 250_000;
const FLOOD_TASKS: usize = 32;
const FLOOD_UNITS: usize = 40;
/// ipc::turns::SLICE (a literal, so that the test also builds against the daemon before turns).
const SLICE_NS: u64 = 1_000_000;

fn spin(ns: u64) {
    let t0 = thread_cpu_ns();
    while thread_cpu_ns().saturating_sub(t0) < ns {
        std::hint::spin_loop();
    }
}

/// Pending once, having woken itself: the task goes to the back of the run queue (tokio's
/// `yield_now` defers its wake to the scheduler's next tick instead, which batches).
struct Yield(bool);

impl std::future::Future for Yield {
    type Output = ();
    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        if self.0 {
            return std::task::Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    }
}

/// The agents in the order their units of work ran.
type Log = Arc<Mutex<Vec<&'static str>>>;

async fn work(log: Log, who: &'static str, units: usize) {
    for _ in 0..units {
        spin(UNIT_NS);
        log.lock().unwrap().push(who);
        // A flood's task has more ready at once (lines queued, a reply to send): it wakes
        // itself, back to the end of the run queue.
        Yield(false).await;
    }
}

/// How the polite call does its unit of work.
#[derive(Clone, Copy, PartialEq)]
enum Polite {
    /// In its own task.
    Itself,
    /// In a task its own task spawns and waits for, as a tool call waits for the reader of its
    /// tool's output (tools/mcp.rs, tools/exec.rs), spawned with `spawn_for_current`.
    Spawned,
}

/// A ledger without a rate with the agents `t/flood` and `t/polite` in its turns, and a
/// one-thread runtime to run their tasks on.
fn flood_and_polite() -> (
    CpuLedger,
    Arc<AgentCpu>,
    Arc<AgentCpu>,
    tokio::runtime::Runtime,
) {
    let ledger = CpuLedger::new(CpuRate {
        permille: 0,
        burst: std::time::Duration::ZERO,
        ceiling_permille: 0,
    });
    let (flood, polite) = (ledger.agent("t/flood"), ledger.agent("t/polite"));
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    (ledger, flood, polite, rt)
}

/// Flood units that ran between the polite task's spawn and its unit, over `rounds` calls.
fn flood_units_ahead_of_polite_calls(rounds: usize, how: Polite) -> Vec<usize> {
    let (ledger, flood, polite, rt) = flood_and_polite();
    let log: Log = Arc::default();
    let ahead = rt.block_on(async {
        let mut tasks = Vec::new();
        for _ in 0..FLOOD_TASKS {
            tasks.push(tokio::spawn(Measured::new(
                work(log.clone(), "flood", FLOOD_UNITS),
                flood.clone(),
            )));
        }
        let mut ahead = Vec::new();
        for _ in 0..rounds {
            // Let the flood run a while, then a polite call arrives.
            let until = log.lock().unwrap().len() + 3 * FLOOD_TASKS;
            while log.lock().unwrap().len() < until {
                Yield(false).await;
            }
            let at = log.lock().unwrap().len();
            let unit = work(log.clone(), "polite", 1);
            let call = async move {
                match how {
                    Polite::Itself => unit.await,
                    Polite::Spawned => spawn_for_current(unit).await.unwrap(),
                }
            };
            tokio::spawn(Measured::new(call, polite.clone()))
                .await
                .unwrap();
            let l = log.lock().unwrap();
            let pos = l[at..].iter().position(|w| *w == "polite").unwrap();
            ahead.push(pos);
        }
        for t in tasks {
            t.await.unwrap();
        }
        ahead
    });
    let l = log.lock().unwrap();
    assert_eq!(
        l.iter().filter(|w| **w == "flood").count(),
        FLOOD_TASKS * FLOOD_UNITS,
        "the flood was served in full (not starved)"
    );
    let used = ledger.usage("t/flood").unwrap().used_ns;
    assert!(
        used >= (FLOOD_TASKS * FLOOD_UNITS) as u64 * UNIT_NS,
        "the flood's CPU is charged to it: {used} ns"
    );
    let polite_used = ledger.usage("t/polite").unwrap().used_ns;
    assert!(
        polite_used >= rounds as u64 * UNIT_NS,
        "the polite calls' CPU, in their tasks or the ones they spawned, is charged to the \
         polite agent: {polite_used} ns for {rounds} units of {UNIT_NS}"
    );
    drop(l);
    ahead
}

#[test]
fn a_polite_call_waits_for_a_slice_of_the_flood_not_for_its_backlog() {
    let ahead = flood_units_ahead_of_polite_calls(5, Polite::Itself);
    eprintln!("flood units ahead of each polite call: {ahead:?} (tokio's order: {FLOOD_TASKS})");
    let bound = (SLICE_NS / UNIT_NS) as usize + 2;
    assert!(
        ahead.iter().all(|&n| n <= bound),
        "a polite call waited behind {ahead:?} units of the flood (bound {bound}; first come, \
         first served would be {FLOOD_TASKS})"
    );
}

/// The same when the polite call's work is in a task it spawned (the reader of its tool's
/// output): spawned with `ipc::cpu::spawn_for_current` it is the polite agent's task, polled
/// in its turn and charged to it. A plain `tokio::spawn` (what the tool readers were before,
/// measured 2026-11-27: a polite tool call's p99 4-5x its quiet figure under a flood of tool
/// calls, all of it between the tool's reply and the daemon reading it) waits for all 32 of
/// the flood's ready tasks, and its CPU is no one's.
#[test]
fn work_a_polite_call_spawns_is_in_its_turn_too() {
    let ahead = flood_units_ahead_of_polite_calls(5, Polite::Spawned);
    eprintln!("flood units ahead of each polite call's spawned work: {ahead:?}");
    let bound = (SLICE_NS / UNIT_NS) as usize + 2;
    assert!(
        ahead.iter().all(|&n| n <= bound),
        "a polite call's spawned work waited behind {ahead:?} units of the flood (bound \
         {bound}; tokio's order would be {FLOOD_TASKS})"
    );
}

/// A flood's session finds hundreds of lines queued (the ring hands them over 64 KiB at a
/// time) and would handle them all in one poll, until tokio's budget (128 receives) ends it:
/// a polite call arriving meanwhile waited for that, not for a slice (measured 2026-11-28,
/// docs/benchmarks.md "A poll ends at its turn": ≈ 1 ms of the slowest calls under the
/// `calls` flood). With `ipc::cpu::yield_past_turn` between lines, as the MCP session does, the
/// poll ends once the flood is a slice ahead of the waiting agent.
#[test]
fn a_session_with_lines_queued_ends_its_poll_when_another_agent_waits() {
    const LINES: usize = 600;
    const LINE_NS: u64 = 50_000;
    const ARRIVES_AT: usize = 10;
    let (_ledger, flood, polite, rt) = flood_and_polite();
    let log: Log = Arc::default();
    rt.block_on(async {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<()>(LINES);
        for _ in 0..LINES {
            tx.try_send(()).unwrap();
        }
        drop(tx);
        let (arrive, arrived) = tokio::sync::oneshot::channel::<()>();
        let l = log.clone();
        let call = tokio::spawn(Measured::new(
            async move {
                arrived.await.unwrap();
                l.lock().unwrap().push("polite");
            },
            polite,
        ));
        let l = log.clone();
        let session = tokio::spawn(Measured::new(
            async move {
                let mut arrive = Some(arrive);
                while rx.recv().await.is_some() {
                    spin(LINE_NS);
                    let n = {
                        let mut l = l.lock().unwrap();
                        l.push("flood");
                        l.len()
                    };
                    if n == ARRIVES_AT {
                        arrive.take().unwrap().send(()).unwrap();
                    }
                    agentosd::ipc::cpu::yield_past_turn().await;
                }
            },
            flood,
        ));
        call.await.unwrap();
        session.await.unwrap();
    });
    let l = log.lock().unwrap();
    let ahead = l.iter().position(|w| *w == "polite").unwrap() - ARRIVES_AT;
    eprintln!("flood lines handled between the polite call's arrival and its poll: {ahead}");
    let bound = (SLICE_NS / LINE_NS) as usize + 2;
    assert!(
        ahead <= bound,
        "the polite call waited behind {ahead} of the flood's queued lines (bound {bound}; \
         tokio's budget alone ends the poll after 128)"
    );
    assert_eq!(l.len(), LINES + 1, "the flood's lines were all handled");
}

// The agents' runtime (agent_work.rs `runtime`) while a flood keeps its workers busy: a task
// woken from outside the runtime (an agent's new line, handed over by the ring thread) and a
// task woken by the I/O driver (the reply of an agent's tool on its pipe) wait a few polls of
// the flood, not tokio's default intervals (31 polls before a worker looks at the tasks woken
// from outside, 61 before it polls the I/O driver). Measured 2026-11-27 with
// `cargo xtask bench isolation --attacks calls,tools` (docs/benchmarks.md): with the defaults
// a polite agent's tool call waited 7-14 ms between its tool's reply and the daemon reading it
// while another agent flooded the daemon with calls.

/// CPU of one unit of the runtime tests' flood.
const RT_UNIT_NS: u64 = 50_000;
const RT_FLOOD_TASKS: usize = 8;
const ROUNDS: usize = 8;

/// Flood units run so far.
type Units = Arc<Mutex<usize>>;

/// `RT_FLOOD_TASKS` tasks that are always ready until `stop`, on a runtime of one worker; for each
/// round, `wake(round)` is called from a thread outside the runtime and `woken` (a task on the
/// runtime) notes the flood's units when it runs, per round; the flood units between the wake
/// and that poll, per round. Counted from just after the wake, so that a waking thread
/// preempted on a loaded host does not count against the runtime.
fn units_between_wake_and_poll(
    woken: impl FnOnce(Units) -> tokio::task::JoinHandle<Vec<usize>>,
    wake: impl Fn(usize) + Send + 'static,
) -> Vec<usize> {
    let marks: Arc<Mutex<Vec<usize>>> = Arc::default();
    let rt = agent_work::runtime(
        agent_work::agents_nice(0),
        0,
        1,
        agent_work::DEFAULT_POLL_INTERVAL,
    )
    .unwrap();
    let units: Units = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    for _ in 0..RT_FLOOD_TASKS {
        let (units, stop) = (units.clone(), stop.clone());
        rt.spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                spin(RT_UNIT_NS);
                *units.lock().unwrap() += 1;
                Yield(false).await;
            }
        });
    }
    let _guard = rt.enter();
    let seen = woken(units.clone());
    let (u, m) = (units.clone(), marks.clone());
    let waker = std::thread::spawn(move || {
        for round in 0..ROUNDS {
            // Let the flood run, then wake the task from outside.
            std::thread::sleep(std::time::Duration::from_millis(20));
            wake(round);
            m.lock().unwrap().push(*u.lock().unwrap());
        }
    });
    let seen = rt.block_on(seen).unwrap();
    waker.join().unwrap();
    stop.store(true, Ordering::Relaxed);
    let marks = marks.lock().unwrap();
    seen.iter()
        .zip(marks.iter())
        .map(|(s, m)| s.saturating_sub(*m))
        .collect()
}

fn check(what: &str, ahead: &[usize], bound: usize) {
    eprintln!("flood units between the wake and the poll of {what}: {ahead:?}");
    assert_eq!(ahead.len(), ROUNDS);
    assert!(
        ahead.iter().all(|&n| n <= bound),
        "{what} waited behind {ahead:?} units of the flood (bound {bound}; tokio's defaults \
         would let 31 or 61 run)"
    );
}

#[test]
fn a_task_woken_from_outside_the_runtime_waits_a_few_polls() {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<usize>();
    let ahead = units_between_wake_and_poll(
        move |units| {
            tokio::spawn(async move {
                let mut out = Vec::new();
                while out.len() < ROUNDS {
                    let round = rx.recv().await.unwrap();
                    assert_eq!(round, out.len());
                    out.push(*units.lock().unwrap());
                }
                out
            })
        },
        move |round| tx.send(round).unwrap(),
    );
    check(
        "a task woken by a channel from another thread",
        &ahead,
        agent_work::DEFAULT_POLL_INTERVAL as usize + 2,
    );
}

#[test]
fn a_task_woken_by_the_io_driver_waits_a_few_polls() {
    let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    b.set_nonblocking(true).unwrap();
    let a = Mutex::new(a);
    let ahead = units_between_wake_and_poll(
        move |units| {
            let mut b = tokio::net::UnixStream::from_std(b).unwrap();
            tokio::spawn(async move {
                let mut out = Vec::new();
                let mut buf = [0u8; 1];
                while out.len() < ROUNDS {
                    b.read_exact(&mut buf).await.unwrap();
                    assert_eq!(usize::from(buf[0]), out.len());
                    out.push(*units.lock().unwrap());
                }
                out
            })
        },
        move |round| a.lock().unwrap().write_all(&[round as u8]).unwrap(),
    );
    check(
        "a task woken by its socket becoming readable",
        &ahead,
        agent_work::DEFAULT_POLL_INTERVAL as usize + 2,
    );
}
