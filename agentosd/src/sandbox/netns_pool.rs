//! Network and IPC namespaces made ahead of agent starts.
//!
//! Every agent gets a network namespace of its own ([`super::Namespaces::net`]). Making one is
//! the kernel's most expensive part of a start: `CLONE_NEWNET` runs every network subsystem's
//! per-namespace setup, ≈ 0.45 ms measured on the development host, more than the rest of the
//! sandbox together (docs/benchmarks.md). Nothing in a new namespace depends on the agent, so
//! the daemon makes a few beforehand on a thread of its own, and a start joins one with
//! `setns` (the path the model gateway's namespace already takes) instead of making one in
//! `clone3`. The pool is refilled in the background after each start; when it is empty (a burst
//! of starts) a start makes its namespace in `clone3` as before, so the pool only moves work off
//! the start path and never decides anything.
//!
//! **When** it refills matters as much: taking a namespace does not wake the refill, the end
//! of the start does ([`after_start`], called by `spawn` once the child has exec'd), and the
//! thread then waits for a quiet moment ([`QUIET`]). Woken by the take (before 2026-11-26's
//! fifth session), the refill's `unshare(CLONE_NEWNET)` ran during the very start that took
//! the namespace: ≈ 0.5 ms of kernel work that a kernel without preemption (`PREEMPT_NONE`,
//! this host's, common on servers) does not interrupt, not even for a nice-0 task woken on
//! its CPU, whatever the thread's own nice 19. Traced (sched_switch, docs/benchmarks.md), the
//! agent's child waited ≈ 0.5 ms in the run queue behind `agentos-nspool` in 58% of starts on
//! a busy host: the ≈ 0.5 ms after the clone that leaving out every part of the sandbox had
//! not removed.
//!
//! A pooled namespace is exactly what `CLONE_NEWNET` gives: made by root in the initial user
//! namespace, its only interface the loopback, down; nobody but the daemon has held it. The fds
//! are close-on-exec (agents never inherit them; the socket broker closes every fd above its
//! listener).
//!
//! IPC namespaces likewise (every agent has its own, [`super::Namespaces::ipc`]): `CLONE_NEWIPC`
//! sets up SysV IPC limits and mounts an mqueue instance, tens of µs of a start. A pooled one is
//! what `CLONE_NEWIPC` gives: made by root, no object in it (the pool's thread makes none),
//! nobody but the daemon has held it. The same thread keeps both pools, sleeping while they are
//! full.

use std::os::fd::OwnedFd;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// Namespaces kept ready: enough for a few starts in a row, small enough to cost nothing
/// (each is a few tens of KiB of kernel memory).
const READY: usize = 4;

/// How long after a start's exec the refill waits for the daemon to be quiet (no other start
/// ending in between): the agent's program is still in its first instructions after its
/// `execve` (≈ 0.25 ms for the benchmark's static stamp, far longer for an interpreter), and
/// a refill begun then delays them as it would the start.
const QUIET: Duration = Duration::from_millis(2);

/// At most this many ready of a kind, the refill does not wait for [`QUIET`]: a burst of starts
/// is about to find the pool empty and make its namespaces in `clone3`, which costs more.
const LOW: usize = 1;

/// The same for IPC namespaces (`CLONE_NEWIPC` mounts an mqueue instance: ≈ 30 µs of a start,
/// docs/benchmarks.md), joined with `setns` by the child like the network namespace.
#[derive(Default)]
struct Pools {
    net: Vec<OwnedFd>,
    ipc: Vec<OwnedFd>,
    /// The refill thread runs (it waits on [`WAKE`] while both pools are full).
    thread: bool,
    /// Making one failed since the last take (no privilege, a namespace limit): not tried again
    /// until the next take, so a failing host does not spin.
    net_failed: bool,
    ipc_failed: bool,
    /// No refill before this (the last start's exec + [`QUIET`]) unless a pool is [`LOW`].
    quiet_until: Option<Instant>,
}

static POOLS: Mutex<Pools> = Mutex::new(Pools {
    net: Vec::new(),
    ipc: Vec::new(),
    thread: false,
    net_failed: false,
    ipc_failed: false,
    quiet_until: None,
});
static WAKE: Condvar = Condvar::new();

fn pools() -> std::sync::MutexGuard<'static, Pools> {
    POOLS.lock().unwrap_or_else(|p| p.into_inner())
}

/// A fresh network namespace for a start, if one is ready. Does not wake the refill: the
/// start does, once its child has exec'd ([`after_start`]).
pub fn take() -> Option<OwnedFd> {
    let mut p = pools();
    p.net_failed = false;
    p.net.pop()
}

/// A fresh IPC namespace for a start, if one is ready; like [`take`], does not wake the
/// refill.
pub fn take_ipc() -> Option<OwnedFd> {
    let mut p = pools();
    p.ipc_failed = false;
    p.ipc.pop()
}

/// A start that may have taken namespaces is past its child's `execve` (or failed): refill
/// the pools now, off the start's path (the module's doc says why not at the take). `spawn`
/// calls it; a start that fails before its spawn leaves the refill to the next start.
pub fn after_start() {
    let short = {
        let mut p = pools();
        p.quiet_until = Some(Instant::now() + QUIET);
        p.short().is_some()
    };
    if short {
        fill();
    }
}

/// What the refill thread does next.
#[derive(Debug, PartialEq)]
enum Step {
    /// Make one: `true` network, `false` IPC.
    Make(bool),
    /// Sleep until woken, or at most this long.
    Wait(Option<Duration>),
}

impl Pools {
    /// The kind to make next: `Some(true)` network, `Some(false)` IPC.
    fn short(&self) -> Option<bool> {
        if self.net.len() < READY && !self.net_failed {
            Some(true)
        } else if self.ipc.len() < READY && !self.ipc_failed {
            Some(false)
        } else {
            None
        }
    }

    /// The next step at `now`: make what is short, once the last start has been quiet for
    /// [`QUIET`] or at once when a pool is down to [`LOW`].
    fn step(&self, now: Instant) -> Step {
        let Some(net) = self.short() else {
            return Step::Wait(None);
        };
        let low = (self.net.len() <= LOW && !self.net_failed)
            || (self.ipc.len() <= LOW && !self.ipc_failed);
        match self.quiet_until {
            Some(until) if !low && now < until => Step::Wait(Some(until - now)),
            _ => Step::Make(net),
        }
    }
}

/// Makes namespaces until [`READY`] of each kind are waiting, on a thread of its own that
/// stays (an `unshare` changes only the calling thread's namespaces) and sleeps while the pools
/// are full: a start only wakes it (no thread is made on the start path). A failure (no
/// privilege, a namespace limit) leaves that pool as it is until the next take, and starts
/// make their namespaces in `clone3`, which reports the error where it matters.
pub fn fill() {
    {
        let mut p = pools();
        if p.thread {
            drop(p);
            WAKE.notify_one();
            return;
        }
        p.thread = true;
    }
    let spawned = std::thread::Builder::new()
        .name("agentos-nspool".into())
        .spawn(|| {
            // Behind everything else. Not enough on a kernel without preemption: once in its
            // `unshare` it keeps the CPU (see the module's doc), hence `step`'s timing. On a
            // saturated host it may lag; starts then make their namespaces in clone3.
            // SAFETY: setpriority(2) on this thread (tid 0 = the caller) with a constant.
            unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 19) };
            let mut p = pools();
            loop {
                let net = match p.step(Instant::now()) {
                    Step::Make(net) => net,
                    Step::Wait(None) => {
                        p = WAKE.wait(p).unwrap_or_else(|e| e.into_inner());
                        continue;
                    }
                    Step::Wait(Some(d)) => {
                        p = WAKE
                            .wait_timeout(p, d)
                            .map_or_else(|e| e.into_inner().0, |r| r.0);
                        continue;
                    }
                };
                drop(p);
                let made = make(if net {
                    libc::CLONE_NEWNET
                } else {
                    libc::CLONE_NEWIPC
                });
                p = pools();
                match (made, net) {
                    (Ok(ns), true) => p.net.push(ns),
                    (Ok(ns), false) => p.ipc.push(ns),
                    (Err(_), true) => p.net_failed = true,
                    (Err(_), false) => p.ipc_failed = true,
                }
            }
        });
    if spawned.is_err() {
        pools().thread = false;
    }
}

/// One new namespace of `kind` (`CLONE_NEWNET` or `CLONE_NEWIPC`): this thread moves into it
/// and keeps an fd of it.
fn make(kind: libc::c_int) -> std::io::Result<OwnedFd> {
    // SAFETY: unshare(2) with a constant flag; it changes only this thread's namespace of that
    // kind (the pool's own thread, which does nothing else).
    if unsafe { libc::unshare(kind) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let name = if kind == libc::CLONE_NEWNET {
        "net"
    } else {
        "ipc"
    };
    Ok(OwnedFd::from(std::fs::File::open(format!(
        "/proc/thread-self/ns/{name}"
    ))?))
}

/// How many network namespaces are ready (for tests and `status` notes).
pub fn ready() -> usize {
    pools().net.len()
}

/// How many IPC namespaces are ready.
pub fn ready_ipc() -> usize {
    pools().ipc.len()
}

/// Held by the tests that count the global pools' namespaces and by the tests that take from
/// them (`sandbox::prepare`, `spawn`): counts read while another test takes or wakes the refill
/// would be wrong.
#[cfg(test)]
pub(crate) static TEST_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[cfg(test)]
mod tests {
    use super::*;

    fn ns() -> OwnedFd {
        OwnedFd::from(std::fs::File::open("/dev/null").unwrap())
    }

    /// The refill waits for a quiet moment after a start unless a pool is nearly empty, and
    /// sleeps while both are full.
    #[test]
    fn refill_waits_for_quiet_unless_low() {
        let now = Instant::now();
        let mut p = Pools {
            net: (0..READY).map(|_| ns()).collect(),
            ipc: (0..READY).map(|_| ns()).collect(),
            ..Pools::default()
        };
        assert_eq!(p.step(now), Step::Wait(None), "full: sleep");
        p.net.pop();
        assert_eq!(p.step(now), Step::Make(true), "no start yet: make");
        p.quiet_until = Some(now + QUIET);
        assert_eq!(p.step(now), Step::Wait(Some(QUIET)), "a start just ended");
        assert_eq!(p.step(now + QUIET), Step::Make(true), "quiet long enough");
        p.ipc.truncate(LOW);
        assert_eq!(p.step(now), Step::Make(true), "a pool low: at once");
        p.net_failed = true;
        assert_eq!(p.step(now), Step::Make(false), "the other kind");
        p.ipc_failed = true;
        assert_eq!(p.step(now), Step::Wait(None), "both failed: sleep");
    }
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn pooled_namespaces_are_new_distinct_and_refilled() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("SKIPPED: needs root (unshare CLONE_NEWNET)");
            return;
        }
        let _serial = super::TEST_LOCK.lock().unwrap_or_else(|p| p.into_inner());
        fill();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while ready() < READY {
            assert!(
                std::time::Instant::now() < deadline,
                "the pool did not fill"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        // Both pools full: the refill thread sleeps until something wakes it.
        while ready_ipc() < READY {
            assert!(
                std::time::Instant::now() < deadline,
                "the IPC pool did not fill"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let host = std::fs::metadata("/proc/self/ns/net").unwrap().ino();
        let a = take().expect("a namespace is ready");
        let b = take().expect("a second one is ready");
        let ino = |fd: &OwnedFd| {
            std::fs::metadata(format!("/proc/self/fd/{}", fd.as_raw_fd()))
                .unwrap()
                .ino()
        };
        assert_ne!(ino(&a), host, "a pooled namespace is not the host's");
        assert_ne!(ino(&a), ino(&b), "each start gets its own");
        // Not during the start that took them (its child would wait behind the refill's
        // unpreemptible unshare): only once it is past its exec.
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(ready(), READY - 2, "taking a namespace woke the refill");
        after_start();
        // Taken ones are replaced in the background.
        while ready() < READY {
            assert!(
                std::time::Instant::now() < deadline,
                "the pool was not refilled"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        // IPC namespaces the same way: new, distinct, refilled after the start.
        while ready_ipc() < READY {
            assert!(
                std::time::Instant::now() < deadline,
                "the IPC pool was not filled again"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let host_ipc = std::fs::metadata("/proc/self/ns/ipc").unwrap().ino();
        let (i, j) = (take_ipc().expect("ready"), take_ipc().expect("ready"));
        assert_ne!(
            ino(&i),
            host_ipc,
            "a pooled IPC namespace is not the host's"
        );
        assert_ne!(ino(&i), ino(&j), "each start gets its own IPC namespace");
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(
            ready_ipc(),
            READY - 2,
            "taking an IPC namespace woke the refill"
        );
        after_start();
        while ready_ipc() < READY {
            assert!(
                std::time::Instant::now() < deadline,
                "the IPC pool was not refilled"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        // Joined, it has only a loopback, down: what CLONE_NEWNET gives.
        let links = std::thread::spawn(move || {
            // SAFETY: setns(2) on an fd we own; it changes only this thread.
            assert_eq!(unsafe { libc::setns(a.as_raw_fd(), libc::CLONE_NEWNET) }, 0);
            let out = std::process::Command::new("ip")
                .args(["-o", "link", "show"])
                .output();
            out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        })
        .join()
        .unwrap();
        if let Ok(links) = links {
            let lines: Vec<&str> = links.lines().collect();
            assert_eq!(lines.len(), 1, "{links}");
            assert!(
                lines[0].contains(": lo:") && !lines[0].contains(",UP"),
                "{links}"
            );
        }
    }
}
