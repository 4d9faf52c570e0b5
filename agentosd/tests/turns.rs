//! The agents' tasks take turns on the agents' runtime (ipc/turns.rs, issue 15 "Isolation
//! measured"): a flooding agent with 32 tasks ready (its calls in flight) and a polite agent
//! whose one call arrives behind them. Measured in order and count, not wall time: how many
//! units of the flood's work run between the polite call's spawn and its own unit. In tokio's
//! order (first come, first served) that is every queued task's unit, 32; in turns at most a
//! slice of the flood (ipc::turns::SLICE of CPU, 4 units of 250 µs) and the parked ones' checks.
//! No root needed: the daemon's own wrapper (`ipc::cpu::Measured`) and ledger, a tokio runtime.

#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};

use agentosd::ipc::cpu::{CpuLedger, CpuRate, Measured, thread_cpu_ns};

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

/// Flood units that ran between the polite task's spawn and its unit, over `rounds` calls.
fn flood_units_ahead_of_polite_calls(rounds: usize) -> Vec<usize> {
    let ledger = CpuLedger::new(CpuRate {
        permille: 0,
        burst: std::time::Duration::ZERO,
        ceiling_permille: 0,
    });
    let (flood, polite) = (ledger.agent("t/flood"), ledger.agent("t/polite"));
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
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
            tokio::spawn(Measured::new(
                work(log.clone(), "polite", 1),
                polite.clone(),
            ))
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
    drop(l);
    ahead
}

#[test]
fn a_polite_call_waits_for_a_slice_of_the_flood_not_for_its_backlog() {
    let ahead = flood_units_ahead_of_polite_calls(5);
    eprintln!("flood units ahead of each polite call: {ahead:?} (tokio's order: {FLOOD_TASKS})");
    let bound = (SLICE_NS / UNIT_NS) as usize + 2;
    assert!(
        ahead.iter().all(|&n| n <= bound),
        "a polite call waited behind {ahead:?} units of the flood (bound {bound}; first come, \
         first served would be {FLOOD_TASKS})"
    );
}
