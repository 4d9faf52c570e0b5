//! The open files all agents' connections may hold together (ipc/files.rs): connections the
//! ring cannot park in its table of registered files are ordinary fds of the daemon, and past
//! the budget shared by all agents (`--agent-conn-files`) a new one is refused (closed at once,
//! counted as refused); the budget comes back when connections close. Its own test binary: the
//! budget is process-wide.
//!
//! Needs io_uring (skips without).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use agentosd::ipc::Limits;
use agentosd::ipc::files::AGENT_CONN_FILES;

/// A line there and back: `Ok` with the echo, `Err` when the daemon closed the connection.
fn echo(fd: &OwnedFd, line: &str) -> Result<String, String> {
    let s = UnixStream::from(fd.try_clone().expect("dup"));
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let _ = (&s).write_all(format!("{line}\n").as_bytes());
    let mut got = String::new();
    match BufReader::new(&s).read_line(&mut got) {
        Ok(0) => Err("EOF".into()),
        Ok(_) => Ok(got),
        Err(e) => Err(e.to_string()),
    }
}

#[test]
fn connections_beyond_the_registered_table_share_a_bounded_number_of_files() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    // No registered table: every connection is an ordinary fd.
    let limits = Limits {
        fixed_files: Some(0),
        ..Limits::default()
    };
    AGENT_CONN_FILES.set_max(3);
    let Some((ipc, incoming)) = common::start_ipc(&rt, limits, module_path!()) else {
        return;
    };
    common::echo_lines(&rt, incoming);
    let wait = |what: &str, ok: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ok() {
            assert!(
                Instant::now() < deadline,
                "{what} within 10 s: {:?}",
                ipc.stats()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    // Five agents, one connection each: three get a file of the budget, two are refused.
    let ends: Vec<OwnedFd> = (0..5)
        .map(|i| {
            ipc.pair(&common::paired_agent(&format!("a{i}")))
                .expect("pair")
        })
        .collect();
    wait("5 connections decided", &|| {
        let s = ipc.stats();
        s.connections_open + s.refused == 5
    });
    assert_eq!((ipc.stats().connections_open, ipc.stats().refused), (3, 2));
    assert_eq!(AGENT_CONN_FILES.used(), 3);
    let answered: Vec<bool> = ends
        .iter()
        .map(|fd| echo(fd, "{\"x\":1}").is_ok())
        .collect();
    assert_eq!(answered, [true, true, true, false, false]);
    // One closes: its file comes back, and the next connection gets it.
    let mut ends = ends;
    drop(ends.remove(0));
    wait("the closed connection's file given back", &|| {
        AGENT_CONN_FILES.used() == 2
    });
    let again = ipc.pair(&common::paired_agent("b")).expect("pair");
    assert_eq!(echo(&again, "{\"y\":2}"), Ok("{\"y\":2}\n".to_string()));
    assert_eq!(AGENT_CONN_FILES.used(), 3);
    ipc.shutdown();
}
