//! `agentctl top` on a terminal, as an operator runs it: a pseudo-terminal of the test's own,
//! keys typed into it change the sort at once (not at the next refresh), `q` quits, and the
//! terminal's modes (echo, line editing) are as they were before. Root only (a daemon).

#![allow(clippy::unwrap_used)]

mod common;

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{Bus, Daemon, TestCgroup, contract};

/// A pseudo-terminal: (controller, the terminal side).
fn openpty() -> (std::fs::File, OwnedFd) {
    let (mut m, mut s) = (-1, -1);
    // SAFETY: openpty writes two fds into the two ints; no name, termios or winsize asked.
    let rc = unsafe {
        libc::openpty(
            &mut m,
            &mut s,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: both fds were just opened by openpty and are owned by nobody else.
    unsafe { (std::fs::File::from_raw_fd(m), OwnedFd::from_raw_fd(s)) }
}

fn lflag(fd: &OwnedFd) -> libc::tcflag_t {
    // SAFETY: termios is plain data, filled by tcgetattr for a terminal fd we own.
    let mut t: libc::termios = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a termios we own.
    assert_eq!(unsafe { libc::tcgetattr(fd.as_raw_fd(), &mut t) }, 0);
    t.c_lflag
}

/// Everything the terminal shows from now on, read by a thread.
fn screen(mut m: std::fs::File) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = m.read(&mut buf) {
            if n == 0
                || tx
                    .send(String::from_utf8_lossy(&buf[..n]).into_owned())
                    .is_err()
            {
                break;
            }
        }
    });
    rx
}

/// Waits until the screen so far contains `what`; returns the text after the last clear.
fn wait_for(rx: &mpsc::Receiver<String>, seen: &mut String, what: &str, secs: u64) -> String {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(at) = seen.rfind("\x1b[2J")
            && seen[at..].contains(what)
        {
            return seen[at..].to_string();
        }
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "no frame with {what:?} in {secs} s:\n{seen}"
        );
        if let Ok(s) = rx.recv_timeout(left.min(Duration::from_millis(200))) {
            seen.push_str(&s);
        }
    }
}

#[test]
fn top_on_a_terminal_sorts_by_key_at_once_and_restores_the_terminal() {
    skip_unless_capable!();
    let bus = Bus::start();
    let cg = TestCgroup::new("top-keys");
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&bus, &cg.path, dir.path());
    for name in ["alpha", "beta"] {
        let f = contract(
            dir.path(),
            name,
            r#"{ command: /bin/sleep, args: ["600"] }"#,
            "",
        );
        d.ctl_ok(&["start", f.to_str().unwrap()]);
        d.wait_state(name, "running", 10);
    }
    let (m, term) = openpty();
    let before = lflag(&term);
    assert_ne!(before & libc::ECHO, 0, "a fresh terminal echoes");
    let mut keys = m.try_clone().unwrap();
    let rx = screen(m);
    // A 30 s refresh: any frame after the first within the test's seconds came from a key.
    let mut top = Command::new(common::agentctl_bin())
        .arg("--bus-address")
        .arg(&bus.address)
        .args(["top", "-d", "30"])
        .stdin(Stdio::from(term.try_clone().unwrap()))
        .stdout(Stdio::from(term.try_clone().unwrap()))
        .stderr(Stdio::from(term.try_clone().unwrap()))
        .spawn()
        .unwrap();
    let mut seen = String::new();
    // The first frame comes after one interval: space asks for it now.
    std::thread::sleep(Duration::from_millis(500));
    keys.write_all(b" ").unwrap();
    let first = wait_for(&rx, &mut seen, "sorted by CPU%", 15);
    assert!(first.contains("keys: P cpu"), "{first}");
    assert!(
        first.contains("default/alpha") && first.contains("default/beta"),
        "{first}"
    );
    // While top runs the terminal neither echoes nor waits for a line.
    let raw = lflag(&term);
    assert_eq!(raw & (libc::ECHO | libc::ICANON), 0, "{raw:o}");

    keys.write_all(b"N").unwrap();
    let by_name = wait_for(&rx, &mut seen, "sorted by AGENT", 5);
    let alpha = by_name.find("default/alpha").unwrap();
    assert!(alpha < by_name.find("default/beta").unwrap(), "{by_name}");
    keys.write_all(b"M").unwrap();
    wait_for(&rx, &mut seen, "sorted by MEM", 5);
    // A key that means nothing changes nothing; q quits at once with success.
    keys.write_all(b"xq").unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let status = loop {
        if let Some(st) = top.try_wait().unwrap() {
            break st;
        }
        assert!(Instant::now() < deadline, "top did not quit on q:\n{seen}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}\n{seen}");
    assert_eq!(lflag(&term), before, "the terminal's modes are restored");
}
