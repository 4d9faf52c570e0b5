//! Network namespaces made ahead of agent starts.
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
//! A pooled namespace is exactly what `CLONE_NEWNET` gives: made by root in the initial user
//! namespace, its only interface the loopback, down; nobody but the daemon has held it. The fds
//! are close-on-exec (agents never inherit them; the socket broker closes every fd above its
//! listener).

use std::os::fd::OwnedFd;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// Namespaces kept ready: enough for a few starts in a row, small enough to cost nothing
/// (each is a few tens of KiB of kernel memory).
const READY: usize = 4;

static POOL: Mutex<Vec<OwnedFd>> = Mutex::new(Vec::new());
static FILLING: AtomicBool = AtomicBool::new(false);

/// A fresh network namespace for a start, if one is ready; starts refilling either way.
pub fn take() -> Option<OwnedFd> {
    let ns = POOL.lock().unwrap_or_else(|p| p.into_inner()).pop();
    fill();
    ns
}

/// Makes namespaces until [`READY`] are waiting, on a thread of its own (an `unshare` changes
/// only the calling thread's namespace, and this one ends when the pool is full). At most one
/// such thread runs; a failure (no privilege, a namespace limit) leaves the pool as it is, and
/// starts make their namespaces in `clone3`, which reports the error where it matters.
pub fn fill() {
    if FILLING.swap(true, Ordering::AcqRel) {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("agentos-nspool".into())
        .spawn(|| {
            // Behind everything else: the refill runs right after a start took a namespace and
            // must not compete with that start (or the next) for a CPU. On a saturated host it
            // may lag; starts then make their namespaces in clone3.
            // SAFETY: setpriority(2) on this thread (tid 0 = the caller) with a constant.
            unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 19) };
            loop {
                let n = POOL.lock().unwrap_or_else(|p| p.into_inner()).len();
                if n >= READY {
                    break;
                }
                match make() {
                    Ok(ns) => POOL.lock().unwrap_or_else(|p| p.into_inner()).push(ns),
                    Err(_) => break,
                }
            }
            FILLING.store(false, Ordering::Release);
        });
    if spawned.is_err() {
        FILLING.store(false, Ordering::Release);
    }
}

/// One new network namespace: this thread moves into it and keeps an fd of it.
fn make() -> std::io::Result<OwnedFd> {
    // SAFETY: unshare(2) with a constant flag; it changes only this thread's network namespace
    // (the pool's own thread, which does nothing else).
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(OwnedFd::from(std::fs::File::open(
        "/proc/thread-self/ns/net",
    )?))
}

/// How many namespaces are ready (for tests and `status` notes).
pub fn ready() -> usize {
    POOL.lock().unwrap_or_else(|p| p.into_inner()).len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn pooled_namespaces_are_new_distinct_and_refilled() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("SKIPPED: needs root (unshare CLONE_NEWNET)");
            return;
        }
        fill();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while ready() < READY {
            assert!(
                std::time::Instant::now() < deadline,
                "the pool did not fill"
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
        // Taken ones are replaced in the background.
        while ready() < READY {
            assert!(
                std::time::Instant::now() < deadline,
                "the pool was not refilled"
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
