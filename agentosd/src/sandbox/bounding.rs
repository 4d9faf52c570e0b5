//! The capability bounding set, emptied once per daemon thread instead of once per start.
//!
//! Every agent and tool process must start with an empty bounding set (docs/security.md): it
//! caps what any later `execve` could grant, whatever `no_new_privs` and the uid switch
//! already prevent. Dropping it in the child between `clone3` and `execve` takes one
//! `prctl(PR_CAPBSET_DROP)` per capability (41 on this kernel), each a `commit_creds` of a new
//! credential: ≈ 45 µs of every start (docs/benchmarks.md). The bounding set belongs to a
//! thread's credentials and is copied to the threads and children it creates, so the daemon
//! empties its main thread's at start-up, before it creates a thread ([`empty_this_thread`]):
//! every thread of the daemon, and every process they clone, then has it empty already.
//!
//! The daemon itself never `execve`s (it clones and execs only sandboxed agents and tools),
//! and a bounding set limits nothing else a root process does with the capabilities it holds:
//! only what an exec may grant and what `capset` may add to the inheritable set.
//!
//! The child's loop is skipped only where the kernel says so: [`this_thread_is_empty`] reads
//! the calling thread's set (`PR_CAPBSET_READ`, no credential change) and remembers a `true`
//! per thread (a bounding set can only shrink). A thread with any capability left in it — a
//! test's, a benchmark's, one made before start-up — gets the loop in the child as before.

use std::cell::Cell;

thread_local! {
    /// This thread's bounding set was read empty (it cannot grow back).
    static EMPTY: Cell<bool> = const { Cell::new(false) };
}

/// Drop every capability (`0..=cap_last_cap`) from the calling thread's bounding set; threads
/// and processes it creates from then on inherit the empty set. Needs `CAP_SETPCAP`.
pub fn empty_this_thread() -> std::io::Result<()> {
    for cap in 0..=super::cap_last_cap() {
        // SAFETY: prctl(PR_CAPBSET_DROP) on plain integers; it changes only this thread.
        let r = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
        if r != 0 {
            let e = std::io::Error::last_os_error();
            // EINVAL: a number this kernel does not know (cap_last_cap unreadable).
            if e.raw_os_error() != Some(libc::EINVAL) {
                return Err(e);
            }
        }
    }
    if this_thread_is_empty() {
        Ok(())
    } else {
        Err(std::io::Error::other(
            "prctl(PR_CAPBSET_DROP) returned success but the bounding set is not empty",
        ))
    }
}

/// Whether the calling thread's bounding set is empty, read from the kernel
/// (`PR_CAPBSET_READ` per capability, stopping at the first one held); a `true` is kept.
pub fn this_thread_is_empty() -> bool {
    if EMPTY.get() {
        return true;
    }
    let empty = (0..=super::cap_last_cap()).all(|cap| {
        // SAFETY: prctl(PR_CAPBSET_READ) reads this thread's credentials; no side effect.
        let r = unsafe { libc::prctl(libc::PR_CAPBSET_READ, cap as libc::c_ulong, 0, 0, 0) };
        // 0: not in the set; -1 (EINVAL): a number this kernel does not know.
        r <= 0
    });
    EMPTY.set(empty);
    empty
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Read `CapBnd` of the calling thread from /proc.
    fn cap_bnd() -> u64 {
        let s = std::fs::read_to_string("/proc/thread-self/status").unwrap();
        let line = s.lines().find(|l| l.starts_with("CapBnd:")).unwrap();
        u64::from_str_radix(line.split_whitespace().nth(1).unwrap(), 16).unwrap()
    }

    #[test]
    fn emptied_once_a_thread_and_the_threads_it_makes_read_empty() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skip: PR_CAPBSET_DROP needs CAP_SETPCAP (run as root)");
            return;
        }
        // In a thread of its own: the test harness's threads keep theirs.
        std::thread::spawn(|| {
            assert_ne!(
                cap_bnd(),
                0,
                "a root test thread starts with a bounding set"
            );
            assert!(!this_thread_is_empty());
            empty_this_thread().unwrap();
            assert_eq!(cap_bnd(), 0);
            assert!(this_thread_is_empty());
            // Inherited by a thread made afterwards, which reads it from the kernel.
            std::thread::spawn(|| {
                assert_eq!(cap_bnd(), 0);
                assert!(this_thread_is_empty());
            })
            .join()
            .unwrap();
        })
        .join()
        .unwrap();
        // Untouched here.
        assert_ne!(cap_bnd(), 0);
        assert!(!this_thread_is_empty());
    }
}
