//! The ring thread's wake-ups from the agents' runtime: once per poll of an agent's task, not
//! once per command.
//!
//! Every command to the ring (a reply to send, a connection's inbox drained: mod.rs
//! `Shared::command`) writes its eventfd. A flood's session answers line after line in one
//! poll, and each write woke the ring thread, which took the CPU from the worker (it had
//! slept, so the kernel runs it first), sent one reply and slept again: two context switches
//! per line of the flood, the worker and the ring trading one CPU every 40 µs, and another
//! agent's call, woken meanwhile, queued behind both at each of its hand-offs
//! (docs/benchmarks.md, "One wake-up of the ring per poll"). So inside a poll of an agent's
//! task ([`super::cpu::Measured`]) the write is held until the poll ends: the commands queue
//! up, the ring wakes once and takes them all. A task's poll is bounded (its turn, tokio's
//! budget), so a reply waits at most for the rest of the poll that produced it; outside an
//! agent task's poll (the daemon's own work, the blocking pool) the write is made at once.

use std::cell::RefCell;
use std::os::fd::OwnedFd;
use std::sync::Arc;

thread_local! {
    /// Set while this thread polls an agent's task: the eventfds to write when the poll ends
    /// (one per ring; a daemon has one).
    static HELD: RefCell<Option<Vec<Arc<OwnedFd>>>> = const { RefCell::new(None) };
}

/// Writes `eventfd` (the ring wakes), or, during a poll of an agent's task, once when that
/// poll ends.
pub(crate) fn wake(eventfd: &Arc<OwnedFd>) {
    let held = HELD.with(|h| match h.borrow_mut().as_mut() {
        Some(v) => {
            if !v.iter().any(|f| Arc::ptr_eq(f, eventfd)) {
                v.push(eventfd.clone());
            }
            true
        }
        None => false,
    });
    if !held {
        write(eventfd);
    }
}

fn write(eventfd: &OwnedFd) {
    // EAGAIN (counter at its maximum) still leaves the eventfd readable: the ring wakes.
    let _ = rustix::io::write(eventfd, &1u64.to_ne_bytes());
}

/// While alive, this thread's ring wake-ups are held; they are made when it drops (also on a
/// panic in the poll). Nested: the outermost one makes them.
pub(crate) struct Hold {
    outer: bool,
}

impl Hold {
    pub(crate) fn enter() -> Hold {
        let outer = HELD.with(|h| {
            let mut h = h.borrow_mut();
            let outer = h.is_none();
            if outer {
                *h = Some(Vec::new());
            }
            outer
        });
        Hold { outer }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if !self.outer {
            return;
        }
        let held = HELD.with(|h| h.borrow_mut().take()).unwrap_or_default();
        for fd in &held {
            write(fd);
        }
    }
}

/// A non-blocking eventfd, as a ring's (tests).
#[cfg(test)]
pub(super) fn eventfd() -> Arc<OwnedFd> {
    Arc::new(
        rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        )
        .unwrap(),
    )
}

/// The eventfd's counter: how many writes since the last read (0: none; tests).
#[cfg(test)]
pub(super) fn writes(fd: &OwnedFd) -> u64 {
    let mut b = [0u8; 8];
    match rustix::io::read(fd, &mut b) {
        Ok(8) => u64::from_ne_bytes(b),
        Err(rustix::io::Errno::AGAIN) => 0,
        r => panic!("eventfd read: {r:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outside_a_poll_every_wake_is_written_at_once() {
        let fd = eventfd();
        wake(&fd);
        wake(&fd);
        assert_eq!(writes(&fd), 2);
    }

    #[test]
    fn during_a_poll_the_wakes_are_written_once_when_it_ends() {
        let (a, b) = (eventfd(), eventfd());
        {
            let _hold = Hold::enter();
            for _ in 0..10 {
                wake(&a);
            }
            wake(&b);
            {
                // A nested hold does not write when it ends.
                let _inner = Hold::enter();
                wake(&a);
            }
            assert_eq!(writes(&a), 0, "nothing written during the poll");
            assert_eq!(writes(&b), 0);
        }
        assert_eq!(writes(&a), 1, "one write for eleven wakes");
        assert_eq!(writes(&b), 1, "each ring woken");
        // Written at once again after the poll.
        wake(&a);
        assert_eq!(writes(&a), 1);
    }

    #[test]
    fn a_panic_in_the_poll_still_wakes_the_ring() {
        let fd = eventfd();
        let f = fd.clone();
        let r = std::panic::catch_unwind(move || {
            let _hold = Hold::enter();
            wake(&f);
            panic!("in the poll");
        });
        assert!(r.is_err());
        assert_eq!(writes(&fd), 1);
        // And the thread is not left holding.
        wake(&fd);
        assert_eq!(writes(&fd), 1);
    }
}
