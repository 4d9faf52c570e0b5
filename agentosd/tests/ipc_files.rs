//! The agents' sockets and the daemon's open-file limit: the ipc ring keeps listeners and
//! connections in its io_uring table of registered files, not in the process's fd table, so
//! thousands of agents fit under RLIMIT_NOFILE; sockets beyond the table take ordinary fds and
//! work the same; a slot is reused once its socket is closed.
//!
//! Needs io_uring (skips without); the listener part needs root (the socket is chowned to the
//! agent's uid).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentosd::ipc::{AgentRef, IpcServer, IpcStats, Limits};

/// The ipc server on its own runtime, echoing every line back.
struct Echo {
    /// Kept alive for the echo tasks.
    _rt: tokio::runtime::Runtime,
    ipc: Arc<IpcServer>,
}

impl Echo {
    fn start(limits: Limits) -> Option<Echo> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio runtime");
        let (ipc, incoming) = common::start_ipc(&rt, limits, module_path!())?;
        common::echo_lines(&rt, incoming);
        Some(Echo { _rt: rt, ipc })
    }

    /// Wait until the counters satisfy `ok` (the ring applies commands on its own thread).
    fn wait_stats(&self, what: &str, ok: impl Fn(&IpcStats) -> bool) -> IpcStats {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let s = self.ipc.stats();
            if ok(&s) {
                return s;
            }
            assert!(Instant::now() < deadline, "{what} within 10 s: {s:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Echo {
    fn drop(&mut self) {
        self.ipc.shutdown();
    }
}

fn agent(name: &str) -> AgentRef {
    common::paired_agent(name)
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .count()
}

/// One line there and back on the agent's end of an inherited connection.
fn echo_once(fd: &OwnedFd, line: &str) {
    let s = UnixStream::from(fd.try_clone().expect("dup"));
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    (&s).write_all(format!("{line}\n").as_bytes())
        .expect("write");
    let mut got = String::new();
    BufReader::new(&s)
        .read_line(&mut got)
        .expect("a reply within 10 s");
    assert_eq!(got, format!("{line}\n"), "the echo of {line}");
}

#[test]
fn agents_sockets_take_no_fds_while_the_table_has_room() {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let Some(echo) = Echo::start(Limits::default()) else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    const N: usize = 300;
    let before = open_fds();
    let mut ends = Vec::new();
    for i in 0..N {
        let a = agent(&format!("a{i}"));
        if root {
            let path = dir.path().join(format!("a{i}.sock"));
            echo.ipc.listen(&a, &path).expect("listen");
        }
        ends.push(echo.ipc.pair(&a).expect("pair"));
    }
    let sockets = if root { 2 * N } else { N } as u64;
    echo.wait_stats("every socket parked", |s| s.parked == sockets);
    // Our own N ends of the pairs are fds here; the daemon's sides and the listeners are not.
    let grown = open_fds() - before;
    assert!(
        grown <= N + 16,
        "{grown} fds more for {N} agents ({sockets} sockets parked): the ring's sockets must not take fds"
    );
    for (i, fd) in ends.iter().enumerate().step_by(37) {
        echo_once(fd, &format!("{{\"agent\":{i}}}"));
    }
    if !root {
        common::skip(
            module_path!(),
            "not root: listeners not tried (the socket is chowned to the agent)",
        );
    }
}

#[test]
fn sockets_beyond_the_table_take_fds_and_slots_are_reused() {
    let limits = Limits {
        fixed_files: Some(4),
        ..Limits::default()
    };
    let Some(echo) = Echo::start(limits) else {
        return;
    };
    let mut ends: Vec<(String, OwnedFd)> = (0..10)
        .map(|i| {
            let name = format!("b{i}");
            let fd = echo.ipc.pair(&agent(&name)).expect("pair");
            (name, fd)
        })
        .collect();
    echo.wait_stats("4 parked, 10 open", |s| {
        s.parked == 4 && s.connections_open == 10
    });
    // Parked or not, every connection works.
    for (name, fd) in &ends {
        echo_once(fd, &format!("{{\"from\":\"{name}\"}}"));
    }
    // The first four were parked: forgetting them frees their slots…
    for (name, _) in ends.drain(..4) {
        echo.ipc.forget(&format!("t/{name}"));
    }
    echo.wait_stats("slots released", |s| {
        s.parked == 0 && s.connections_open == 6
    });
    // …and new sockets take them.
    for i in 10..14 {
        let name = format!("b{i}");
        let fd = echo.ipc.pair(&agent(&name)).expect("pair");
        ends.push((name, fd));
    }
    echo.wait_stats("the freed slots reused", |s| {
        s.parked == 4 && s.connections_open == 10
    });
    for (name, fd) in &ends {
        echo_once(fd, &format!("{{\"again\":\"{name}\"}}"));
    }
    // A peer that closes frees its slot too.
    let (_, last) = ends.pop().expect("one");
    drop(last);
    echo.wait_stats("the closed one's slot released", |s| {
        s.parked == 3 && s.connections_open == 9
    });
}
