//! Unit tests of cpu.rs: the clock, the bucket, the ceiling's fairness arithmetic.

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
        ceiling_permille: 0,
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
            ceiling_permille: 0,
        },
        t0,
    );
    free.charge(10_000_000_000);
    assert_eq!(free.wait(Instant::now()), Duration::ZERO);
    assert_eq!(free.usage().used_ns, 10_000_000_000);
    assert_eq!(free.usage().permille, 0);
}

#[test]
fn the_fair_share_is_an_equal_part_of_the_ceiling_never_below_the_share() {
    // (ceiling, agents over their share, share) -> fair share, per mille.
    for (ceiling, heavy, share, fair) in [
        (500, 1, 50, 500),
        (500, 2, 50, 250),
        (500, 0, 50, 500),
        (500, 20, 50, 50),
        (500, 1000, 50, 50),
        (200, 3, 50, 66),
        (20, 1, 50, 50),
    ] {
        assert_eq!(
            fair_permille(ceiling, heavy, share),
            fair,
            "{ceiling} {heavy} {share}"
        );
    }
}

#[test]
fn held_only_over_the_ceiling_and_over_the_fair_share() {
    // (agent, total, ceiling, fair) -> held?
    assert_eq!(contended_wait(300.0, 400.0, 500, 250), None);
    assert_eq!(contended_wait(200.0, 600.0, 500, 250), None);
    assert_eq!(contended_wait(250.0, 600.0, 500, 250), None);
    let w = contended_wait(500.0, 600.0, 500, 250).unwrap();
    // Its recent rate halves in WINDOW × ln 2 if it stops.
    assert!(
        w.abs_diff(Duration::from_millis(693)) < Duration::from_millis(2),
        "{w:?}"
    );
    // Bounded both ways: the ring looks again anyway.
    assert_eq!(
        contended_wait(250.1, 600.0, 500, 250),
        Some(Duration::from_millis(1))
    );
    assert_eq!(contended_wait(1e9, 2e9, 500, 1), Some(WINDOW));
}

#[test]
fn the_pool_keeps_a_running_total_and_counts_heavy_agents_per_window() {
    let t0 = Instant::now();
    let mut p = Pool::new(500, t0);
    // 300 ms of CPU in the first 10 ms: about 300‰ over a 1 s window, decaying.
    for k in 0..10 {
        p.charge(30_000_000, t0 + Duration::from_millis(k));
    }
    let r = p.permille(t0 + Duration::from_millis(10));
    assert!((290.0..=300.0).contains(&r), "{r}");
    let later = p.permille(t0 + Duration::from_millis(1010));
    assert!((r / 3.0..r / 2.5).contains(&later), "{later} {r}");
    // Agents over their share: this window's count, or the last one's if larger.
    assert_eq!(p.heavy(t0), 1);
    let e = p.charge(1, t0 + Duration::from_millis(20));
    p.mark_heavy(e, t0 + Duration::from_millis(20));
    p.mark_heavy(e, t0 + Duration::from_millis(30));
    assert_eq!(p.heavy(t0 + Duration::from_millis(40)), 2);
    assert_eq!(p.heavy(t0 + Duration::from_millis(1500)), 2);
    // A mark for a window that is over does not count in the next.
    p.mark_heavy(e, t0 + Duration::from_millis(1600));
    assert_eq!(p.heavy(t0 + Duration::from_millis(1700)), 2);
    // Two windows later nobody is counted (at least 1 for the division).
    assert_eq!(p.heavy(t0 + Duration::from_millis(2100)), 1);
    assert_eq!(p.heavy(t0 + Duration::from_secs(60)), 1);
}

/// Agents wanting `demand` per mille of one CPU each, served in 1 ms steps for `secs`
/// whenever they are not held; per mille of one CPU each got, and the steps each was held.
fn simulate(agents: &[(&AgentCpu, u64)], t0: Instant, secs: u64) -> Vec<(f64, u64)> {
    let mut out = vec![(0.0, 0u64); agents.len()];
    for step in 0..secs * 1000 {
        let now = t0 + Duration::from_millis(step);
        for (i, (a, demand)) in agents.iter().enumerate() {
            if a.hold(now).is_some() {
                out[i].1 += 1;
                continue;
            }
            a.charge_at(demand * 1000, now);
            out[i].0 += (demand * 1000) as f64;
        }
    }
    for o in &mut out {
        o.0 = o.0 / secs as f64 / 1e6;
    }
    out
}

fn rate(share: u64, ceiling: u64) -> CpuRate {
    CpuRate {
        permille: share,
        burst: Duration::from_millis(100),
        ceiling_permille: ceiling,
    }
}

#[test]
fn alone_under_the_ceiling_an_agent_may_exceed_its_share() {
    let t0 = Instant::now();
    let pool = Some(Arc::new(Mutex::new(Pool::new(200, t0))));
    let a = AgentCpu::in_pool(rate(50, 200), pool, t0);
    let got = simulate(&[(&a, 150)], t0, 10);
    assert_eq!(got[0], (150.0, 0), "{got:?}");
}

#[test]
fn alone_over_the_ceiling_an_agent_is_held_to_it() {
    let t0 = Instant::now();
    let pool = Some(Arc::new(Mutex::new(Pool::new(200, t0))));
    let a = AgentCpu::in_pool(rate(50, 200), pool, t0);
    let got = simulate(&[(&a, 1000)], t0, 10);
    assert!((180.0..=240.0).contains(&got[0].0), "{got:?}");
    assert!(got[0].1 > 0, "{got:?}");
}

#[test]
fn over_the_ceiling_the_heavy_share_it_and_the_light_are_never_held() {
    let t0 = Instant::now();
    let pool = Some(Arc::new(Mutex::new(Pool::new(200, t0))));
    let (a, b, c, d) = (
        AgentCpu::in_pool(rate(50, 200), pool.clone(), t0),
        AgentCpu::in_pool(rate(50, 200), pool.clone(), t0),
        AgentCpu::in_pool(rate(50, 200), pool.clone(), t0),
        AgentCpu::in_pool(rate(50, 200), pool, t0),
    );
    // Two flooding, one polite (under its share), one busy over its share (its 100 ms burst
    // spent after 10 s) but under its fair share of the ceiling (200‰ / 3 agents over their
    // share = 66‰).
    let got = simulate(&[(&a, 1000), (&b, 1000), (&c, 20), (&d, 60)], t0, 20);
    let (heavy_a, heavy_b) = (got[0].0, got[1].0);
    assert!(
        (50.0..=110.0).contains(&heavy_a) && (50.0..=110.0).contains(&heavy_b),
        "{got:?}"
    );
    assert!((heavy_a - heavy_b).abs() < 20.0, "{got:?}");
    assert!(got[0].1 > 0 && got[1].1 > 0, "{got:?}");
    assert_eq!(got[2], (20.0, 0), "{got:?}");
    assert_eq!(got[3], (60.0, 0), "{got:?}");
    // The heavy ones together about the ceiling less nothing: the light ones' use comes on top
    // (at most their shares), which keeps the heavy at their fair share.
    assert!(heavy_a + heavy_b <= 200.0 * 1.2, "{got:?}");
    assert!(heavy_a + heavy_b >= 200.0 * 0.5, "{got:?}");
}

#[test]
fn what_was_used_uncontended_is_not_owed_when_contention_comes() {
    let t0 = Instant::now();
    let pool = Some(Arc::new(Mutex::new(Pool::new(200, t0))));
    let a = AgentCpu::in_pool(rate(50, 200), pool.clone(), t0);
    let b = AgentCpu::in_pool(rate(50, 200), pool, t0);
    // A alone at 150‰ for 10 s (7 s of CPU beyond its share), then B floods too: A is held
    // back to its fair share, not for the 20 s its debt would take at its share.
    let alone = simulate(&[(&a, 150)], t0, 10);
    assert_eq!(alone[0].1, 0);
    let both = simulate(&[(&a, 150), (&b, 1000)], t0 + Duration::from_secs(10), 5);
    assert!(both[0].0 >= 80.0, "{both:?}");
    assert!(both[1].0 <= 150.0, "{both:?}");
}

#[test]
fn without_a_ceiling_the_share_is_a_hard_cap() {
    let t0 = Instant::now();
    let a = AgentCpu::in_pool(rate(50, 0), None, t0);
    let got = simulate(&[(&a, 150)], t0, 10);
    // 50‰ and the 100 ms burst over 10 s.
    assert!((50.0..=62.0).contains(&got[0].0), "{got:?}");
    let h = a.hold(t0 + Duration::from_millis(9_999)).unwrap();
    assert_eq!(h.contended, None);
    // The ledger: ceiling 0 or no share, no pool.
    assert!(CpuLedger::new(rate(50, 0)).pool.is_none());
    assert!(CpuLedger::new(rate(0, 500)).pool.is_none());
    assert!(CpuLedger::new(rate(50, 500)).pool.is_some());
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

/// Under the ceiling an agent over its share is served, until another agent within its share
/// waits for a CPU over the threshold (its cgroup's cpu.pressure, ipc/stalls.rs): then it is
/// held to its share for a window, with the stall in its hold; nothing is read while no agent
/// is over its share, and the waits of agents over their share or idle do not count.
#[test]
fn another_agents_wait_for_a_cpu_holds_the_agents_over_their_share() {
    let dir = tempfile::tempdir().unwrap();
    let pressure = |agent: &str, some_us: u64| {
        crate::ipc::stalls::write_agent_files(dir.path(), &format!("t/{agent}"), some_us, 0)
    };
    let ledger = CpuLedger::new(rate(50, 500));
    let mut probe = crate::ipc::stalls::StallProbe::new(dir.path().to_path_buf());
    let t0 = Instant::now();
    let (heavy, polite) = (ledger.agent("t/heavy"), ledger.agent("t/polite"));
    let warm = ledger.agent("t/warm");
    ledger.agent("t/idle");
    for a in ["heavy", "polite", "idle", "warm"] {
        pressure(a, 0);
    }
    polite.charge_at(1_000_000, t0);
    // Nobody over its share: nothing is read.
    assert_eq!(ledger.look_for_stalls(&mut probe, 100, t0), None);
    // 80 ms at once: within its burst (100 ms), over its share by its recent rate (80‰, 59‰ at
    // t3, against 50‰): the watcher starts reading (a baseline; next read below), nobody is
    // held yet.
    warm.charge_at(80_000_000, t0);
    assert_eq!(
        ledger.look_for_stalls(&mut probe, 100, t0),
        None,
        "a baseline"
    );
    // 300 ms of CPU at once: over its share (burst 100 ms), under the ceiling (500‰).
    heavy.charge_at(300_000_000, t0);
    assert_eq!(heavy.hold(t0), None, "under the ceiling, no stall");
    let t1 = t0 + Duration::from_millis(100);
    assert_eq!(
        ledger
            .look_for_stalls(&mut probe, 100, t1)
            .map(|s| s.permille),
        Some(0),
        "read since t0: no wait"
    );
    // The heavy agent's own wait (and the idle one's) are not looked at; the polite one waited
    // 8 ms of 100: under the threshold.
    pressure("heavy", 90_000);
    pressure("idle", 90_000);
    pressure("polite", 8_000);
    let t2 = t1 + Duration::from_millis(100);
    let s = ledger.look_for_stalls(&mut probe, 100, t2).unwrap();
    assert_eq!((s.agent.as_str(), s.permille), ("t/polite", 80));
    assert_eq!(heavy.hold(t2), None, "under the threshold");
    // Then 30 ms of 100.
    pressure("polite", 38_000);
    let t3 = t2 + Duration::from_millis(100);
    let s = ledger.look_for_stalls(&mut probe, 100, t3).unwrap();
    assert_eq!(s.permille, 300);
    let h = heavy
        .hold(t3)
        .expect("held while the polite agent waits for a CPU");
    let c = h.contended.unwrap();
    assert_eq!((c.stall_permille, c.stall_threshold_permille), (300, 100));
    assert_eq!(c.fair_permille, 50, "held to its share");
    assert!(h.wait <= crate::ipc::stalls::PERIOD, "{h:?}");
    // Over its share by its recent rate but within its burst: its share allows it, not held.
    assert_eq!(warm.hold(t3), None);
    assert_eq!(polite.hold(t3), None, "the polite agent is never held");
    // Still held a window later; after the stall's hold without another stall, served again.
    assert!(heavy.hold(t3 + WINDOW + Duration::from_millis(1)).is_some());
    let later = t3 + crate::ipc::stalls::HOLD + Duration::from_millis(1);
    assert_eq!(heavy.hold(later), None);
}

/// Spins `ns` of this thread's CPU (one queued item's work).
fn spin(ns: u64) {
    let t0 = thread_cpu_ns();
    while thread_cpu_ns().saturating_sub(t0) < ns {
        std::hint::spin_loop();
    }
}

/// A task handling queued items in one poll (a flood's MCP session with lines waiting) runs
/// them all in that poll while its agent is alone: asking costs it no extra poll.
#[tokio::test(flavor = "current_thread")]
async fn an_agent_alone_handles_its_whole_backlog_in_one_poll() {
    let turns = Arc::new(Turns::new(100_000));
    let flood = Arc::new(AgentCpu::default().in_turns(&turns));
    tokio::spawn(Measured::new(
        async {
            for _ in 0..50 {
                spin(20_000);
                yield_past_turn().await;
            }
        },
        flood,
    ))
    .await
    .unwrap();
    assert_eq!(turns.stats.polls.load(Ordering::Relaxed), 1);
    assert!(!past_turn(), "outside an agent's task");
}

/// Once another agent's task is woken, the looping task ends its poll after the item it is
/// on (it is more than a slice ahead): the other agent's call waits for one item, not for
/// the rest of the backlog (without the check it saw all 50 done), and the loop then
/// finishes.
#[tokio::test(flavor = "current_thread")]
async fn a_looping_task_ends_its_poll_when_another_agent_waits() {
    let turns = Arc::new(Turns::new(100_000));
    let flood = Arc::new(AgentCpu::default().in_turns(&turns));
    let polite = Arc::new(AgentCpu::default().in_turns(&turns));
    let done = Arc::new(AtomicU64::new(0));
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let seen = tokio::spawn(Measured::new(
        {
            let done = done.clone();
            async move {
                rx.await.unwrap();
                done.load(Ordering::SeqCst)
            }
        },
        polite,
    ));
    let looping = tokio::spawn(Measured::new(
        {
            let done = done.clone();
            async move {
                let mut tx = Some(tx);
                for i in 1..=50 {
                    spin(20_000);
                    done.store(i, Ordering::SeqCst);
                    if i == 10 {
                        tx.take().unwrap().send(()).unwrap();
                    }
                    yield_past_turn().await;
                }
            }
        },
        flood,
    ));
    let seen = seen.await.unwrap();
    looping.await.unwrap();
    assert_eq!(seen, 10, "the other agent's task ran after {seen} items");
    assert_eq!(done.load(Ordering::SeqCst), 50);
}

/// A poll of an agent's task that queues ten commands for the ring wakes it once, when the
/// poll ends (ipc/wake.rs); a plain task's commands wake it each time.
#[tokio::test(flavor = "current_thread")]
async fn an_agent_tasks_poll_wakes_the_ring_once() {
    use crate::ipc::wake::{eventfd, writes};
    let fd = eventfd();
    let f = fd.clone();
    let during = tokio::spawn(Measured::new(
        async move {
            for _ in 0..10 {
                crate::ipc::wake::wake(&f);
            }
            writes(&f)
        },
        Arc::new(AgentCpu::default()),
    ))
    .await
    .unwrap();
    assert_eq!(during, 0, "held during the poll");
    assert_eq!(writes(&fd), 1, "one wake-up for ten commands");
    let f = fd.clone();
    tokio::spawn(async move {
        for _ in 0..10 {
            crate::ipc::wake::wake(&f);
        }
    })
    .await
    .unwrap();
    assert_eq!(writes(&fd), 10);
}
