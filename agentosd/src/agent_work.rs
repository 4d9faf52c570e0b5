//! The daemon's work for agents at a lower CPU priority than its control plane (issue 15,
//! "Isolation measured"): the agents' sockets (the `agentos-ipc` ring thread) and their MCP
//! sessions (a tokio runtime of their own, threads `agentos-agents`) run `--agent-work-nice`
//! (default 10) nice steps below the daemon's own priority, while D-Bus, the supervisor and the
//! operator's `agentctl` keep theirs. Linux keeps a nice value per thread, so this splits one process; under
//! autogroup it orders the daemon's threads among themselves and against processes of the same
//! session. Tool processes are spawned at the daemon's own priority ([`at_daemon_priority`]):
//! an agent's tools are not made slower by this. With `--agent-work-slice-us` (off by default)
//! the same threads also ask the kernel for a short scheduling slice ([`set_thread_priority`]).

use std::io;
use std::sync::atomic::{AtomicI32, Ordering};

/// Default of `--agent-work-nice`.
pub const DEFAULT_NICE: i32 = 10;

/// Default of `--agent-work-slice-us`: 0, the kernel's slice (EEVDF: 0.75 ms × (1 + log2
/// CPUs), up to 3 ms). A short one (Linux 6.12 takes a request of 0.1-100 ms) lets the ring
/// thread woken on the worker's CPU take it at once instead of waiting for the worker's turn
/// (up to 1.3 ms measured under a tool-call flood on the two-CPU host); but the same threads
/// then also yield every 0.1 ms to any other thread of the machine and wait out its whole
/// default slice. Measured there, 100 µs took the polite agent's p99 under the `calls` and
/// `tools` floods from 2.7-3.9 to 1.8-3.6 ms and raised its quiet p99 (mean of the runs 1.31
/// to 1.85 ms; docs/benchmarks.md, "The returning agent's credit"): a trade, not a default.
pub const DEFAULT_SLICE_US: u64 = 0;

/// The slice the `agentosd check` row asks for: the shortest a kernel takes.
pub const PROBE_SLICE_US: u64 = 100;

/// Threads of the agents' runtime.
pub const THREAD_NAME: &str = "agentos-agents";

/// The daemon's own nice value, taken when the agents' runtime is made.
static BASE: AtomicI32 = AtomicI32::new(0);

/// The nice value of the daemon's work for agents: `offset` steps below the calling thread's
/// (the daemon's own, which [`at_daemon_priority`] goes back to).
pub fn agents_nice(offset: i32) -> i32 {
    let base = thread_nice().unwrap_or(0);
    BASE.store(base, Ordering::Relaxed);
    base.saturating_add(offset.max(0)).min(19)
}

fn tid() -> libc::id_t {
    // SAFETY: gettid takes no arguments and cannot fail.
    (unsafe { libc::gettid() }) as libc::id_t
}

/// The calling thread's nice value.
pub fn thread_nice() -> io::Result<i32> {
    // getpriority returns -1 both as a value and as an error: errno tells them apart.
    // SAFETY: errno is thread-local; setting it to 0 before the call is the documented way.
    unsafe { *libc::__errno_location() = 0 };
    // SAFETY: getpriority reads the scheduling priority of the given thread; no pointers.
    let v = unsafe { libc::getpriority(libc::PRIO_PROCESS, tid()) };
    let e = io::Error::last_os_error();
    if v == -1 && e.raw_os_error() != Some(0) {
        return Err(e);
    }
    Ok(v)
}

/// Set the calling thread's nice value (Linux: `PRIO_PROCESS` with a thread id is per thread).
/// Lowering it needs `CAP_SYS_NICE`.
pub fn set_thread_nice(nice: i32) -> io::Result<()> {
    // SAFETY: setpriority changes the given thread's priority; no pointers.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, tid(), nice) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Set the calling thread's nice value and, with `slice_ns` > 0, ask the kernel for that
/// scheduling slice (`sched_setattr(SCHED_OTHER)` with `sched_runtime`, Linux 6.12; the kernel
/// keeps it within 0.1-100 ms). Returns the slice the kernel reports back (`sched_getattr`):
/// `Some(0)` from a kernel that does not take slice requests, `None` when none was asked.
/// Needs `CAP_SYS_NICE` to lower the nice value.
pub fn set_thread_priority(nice: i32, slice_ns: u64) -> io::Result<Option<u64>> {
    use crate::sys::sched::{SCHED_ATTR_SIZE, SCHED_OTHER, SchedAttr, get_attr, set_attr};
    if slice_ns == 0 {
        return set_thread_nice(nice).map(|()| None);
    }
    let attr = SchedAttr {
        size: SCHED_ATTR_SIZE,
        sched_policy: SCHED_OTHER,
        sched_nice: nice,
        sched_runtime: slice_ns,
        ..Default::default()
    };
    set_attr(0, &attr)?;
    Ok(Some(get_attr(0)?.sched_runtime))
}

/// [`set_thread_priority`] for a thread of the daemon's work for agents (`what`), with a
/// warning naming the mechanism when the kernel refuses or ignores a part.
pub fn apply_priority(what: &str, nice: i32, slice_ns: u64) {
    match set_thread_priority(nice, slice_ns) {
        Ok(Some(0)) => tracing::warn!(
            "{what}: this kernel does not take a scheduling slice request (sched_setattr \
             sched_runtime for SCHED_OTHER, Linux 6.12): its default slice applies; \
             `agentosd check` row `sched slice request`"
        ),
        Ok(_) => {}
        Err(e) => {
            tracing::warn!(
                "{what}: sched_setattr(SCHED_OTHER, nice {nice}, slice {slice_ns} ns) failed: {e}; \
                 setting the nice value alone"
            );
            if let Err(e) = set_thread_nice(nice) {
                tracing::warn!("{what}: cannot set nice {nice}: {e}");
            }
        }
    }
}

/// Run `f` (a fork of a tool process) at the daemon's own priority, and go back to the thread's
/// nice after it. Without `CAP_SYS_NICE` the child inherits the thread's nice.
pub fn at_daemon_priority<T>(f: impl FnOnce() -> T) -> T {
    let base = BASE.load(Ordering::Relaxed);
    let was = thread_nice().unwrap_or(base);
    let changed = was != base && set_thread_nice(base).is_ok();
    let out = f();
    if changed {
        let _ = set_thread_nice(was);
    }
    out
}

/// Worker threads of the agents' runtime for `--agent-workers requested`: that many, or with 0
/// one per two CPUs the daemon may use (its affinity and cgroup quota), at least 1, at most 4.
///
/// Not one per CPU: every line the ring thread hands to a session wakes a worker from outside
/// the runtime, and tokio then wakes a second one to keep one searching, which finds nothing:
/// one more thread wake-up in each request's path. The ring thread and the audit writer are
/// busy beside the workers. On the two-CPU development host one worker took a tool call's
/// gate + audit + proxy from +80 to +45 µs p50 and +102 to +57 µs p99 (audit on tmpfs), and
/// served a 100-agent flood faster (45 500 against 37 600 pings/s, 13 900 against 12 800 tool
/// calls/s), with the polite agent's tail under the isolation attacks unchanged
/// (docs/benchmarks.md, "Tool calls", fourteenth session).
pub fn workers(requested: usize) -> usize {
    match requested {
        0 => default_workers(std::thread::available_parallelism().map_or(2, |n| n.get())),
        n => n,
    }
}

/// `--agent-workers 0` on a daemon that may use `cpus` CPUs.
fn default_workers(cpus: usize) -> usize {
    (cpus / 2).clamp(1, 4)
}

/// Default of `--agent-poll-interval`: how many tasks a worker of the agents' runtime polls at
/// most before it polls the I/O driver (tokio's `event_interval`, default 61) and before it
/// looks at the tasks woken from outside the runtime (tokio's `global_queue_interval`, default
/// 31).
///
/// The driver: the replies of the agents' tools arrive on pipes, so a busy worker saw a tool's
/// reply only after up to 61 of a flood's polls (7-14 ms measured, docs/benchmarks.md "Where a
/// polite tool call's tail went"). Each look is one `epoll_wait` that does not block. The
/// global queue: every agent's new line is handed to its session from the ring thread, so it
/// is woken from outside; while a flooding agent keeps a worker's own queue full, another
/// agent's line may wait for up to 31 of the flood's polls by tokio's order. Only the driver's
/// wait was seen in the measurements (the test in tests/turns.rs for the global queue is a
/// guard: on the development host such a task ran within 0-3 polls with tokio's defaults too).
/// The price of looking often is throughput under a many-agent flood (docs/benchmarks.md).
pub const DEFAULT_POLL_INTERVAL: u32 = 4;

/// A multi-thread runtime for the agents' sessions whose threads (workers and blocking pool)
/// run at `nice` with a slice of `slice_ns` (0: the kernel's), looking at tasks woken from
/// outside and at the I/O driver every `poll_interval` polls (at least 1; see
/// [`DEFAULT_POLL_INTERVAL`]).
pub fn runtime(
    nice: i32,
    slice_ns: u64,
    workers: usize,
    poll_interval: u32,
) -> io::Result<tokio::runtime::Runtime> {
    let poll_interval = poll_interval.max(1);
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers.max(1))
        .thread_name(THREAD_NAME)
        .on_thread_start(move || apply_priority(THREAD_NAME, nice, slice_ns))
        .global_queue_interval(poll_interval)
        .event_interval(poll_interval)
        .enable_all()
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runtime_has_the_workers_asked_for() {
        // `--agent-workers 1`: one worker, whatever the host's CPUs.
        assert_eq!(workers(1), 1);
        let rt = runtime(thread_nice().unwrap(), 0, workers(1), DEFAULT_POLL_INTERVAL).unwrap();
        assert_eq!(rt.handle().metrics().num_workers(), 1);
        // 0: one per two CPUs, 1 to 4.
        for (cpus, n) in [(1, 1), (2, 1), (3, 1), (4, 2), (6, 3), (8, 4), (64, 4)] {
            assert_eq!(default_workers(cpus), n, "{cpus} CPUs");
        }
        let cpus = std::thread::available_parallelism().unwrap().get();
        assert_eq!(workers(0), (cpus / 2).clamp(1, 4));
        let rt = runtime(thread_nice().unwrap(), 0, workers(0), DEFAULT_POLL_INTERVAL).unwrap();
        assert_eq!(rt.handle().metrics().num_workers(), (cpus / 2).clamp(1, 4));
    }

    #[test]
    fn threads_of_the_runtime_run_at_its_nice_and_tools_fork_at_the_daemons() {
        let base = thread_nice().unwrap();
        let nice = agents_nice(5);
        assert_eq!(nice, (base + 5).min(19));
        let rt = runtime(nice, 0, 1, DEFAULT_POLL_INTERVAL).unwrap();
        let (inside, during) = rt.block_on(async {
            tokio::spawn(async {
                let inside = thread_nice().unwrap();
                let during = at_daemon_priority(|| thread_nice().unwrap());
                (inside, during, thread_nice().unwrap())
            })
            .await
            .map(|(i, d, after)| {
                assert_eq!(after, i, "back to the thread's nice after the fork");
                (i, d)
            })
            .unwrap()
        });
        assert_eq!(inside, nice);
        // Going back up needs CAP_SYS_NICE.
        let root = rustix::process::geteuid().is_root();
        if root {
            assert_eq!(during, base);
        } else {
            assert_eq!(during, inside);
        }
        // This thread is untouched.
        assert_eq!(thread_nice().unwrap(), base);
    }

    /// Linux 6.12 and later take a slice request for SCHED_OTHER threads.
    fn kernel_takes_slices() -> bool {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
        let mut it = release.split(|c: char| !c.is_ascii_digit());
        let major: u32 = it.next().and_then(|v| v.parse().ok()).unwrap_or(0);
        let minor: u32 = it.next().and_then(|v| v.parse().ok()).unwrap_or(0);
        (major, minor) >= (6, 12)
    }

    #[test]
    fn threads_of_the_runtime_ask_for_their_slice_at_their_nice() {
        let base = thread_nice().unwrap();
        let nice = (base + 3).min(19);
        let rt = runtime(nice, 100_000, 1, DEFAULT_POLL_INTERVAL).unwrap();
        let attr = rt.block_on(async {
            tokio::spawn(async { crate::sys::sched::get_attr(0).unwrap() })
                .await
                .unwrap()
        });
        assert_eq!(attr.sched_policy, crate::sys::sched::SCHED_OTHER);
        assert_eq!(attr.sched_nice, nice);
        if kernel_takes_slices() {
            assert_eq!(attr.sched_runtime, 100_000, "the worker's slice");
        } else {
            assert_eq!(
                attr.sched_runtime, 0,
                "a kernel before 6.12 reports no slice"
            );
        }
        // A thread that asks for none keeps the kernel's (reported as its default, not ours).
        let plain = std::thread::spawn(move || {
            set_thread_priority(nice, 0).unwrap();
            crate::sys::sched::get_attr(0).unwrap()
        })
        .join()
        .unwrap();
        assert_eq!(plain.sched_nice, nice);
        assert_ne!(plain.sched_runtime, 100_000);
        // This thread is untouched.
        assert_eq!(thread_nice().unwrap(), base);
    }
}
