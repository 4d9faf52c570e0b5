//! agentctl as a program, without a daemon: exit codes, `validate`, and `check` failing closed
//! when it cannot find `agentosd` for the local probe. (With a daemon: agentosd's e2e tests.)

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Command, Output};

const AGENTCTL: &str = env!("CARGO_BIN_EXE_agentctl");

fn examples() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples")
}

fn run(bin: &Path, args: &[&str]) -> Output {
    Command::new(bin)
        // Nobody listens there: every D-Bus call is "unreachable".
        .env(
            "AGENTOS_BUS_ADDRESS",
            "unix:path=/nonexistent/agentctl-test-bus",
        )
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn usage_errors_exit_2_and_version_exits_0() {
    let out = run(Path::new(AGENTCTL), &["no-such-command"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let out = run(Path::new(AGENTCTL), &["--version"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("agentctl "));
}

#[test]
fn validate_needs_no_daemon() {
    let good = examples().join("contracts/hello-agent.yaml");
    let out = run(Path::new(AGENTCTL), &["validate", good.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(": ok "),
        "{out:?}"
    );
    let out = run(Path::new(AGENTCTL), &["validate", "/nonexistent/x.yaml"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
}

#[test]
fn unreachable_daemon_exits_4() {
    let out = run(Path::new(AGENTCTL), &["list"]);
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("AGENTOS_BUS_ADDRESS"),
        "{out:?}"
    );
}

#[test]
fn check_without_agentosd_fails_closed_naming_the_fix() {
    // A copy of agentctl with no agentosd beside it and none on PATH.
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("agentctl");
    std::fs::copy(AGENTCTL, &bin).unwrap();
    // ETXTBSY: a child another test thread forks while the copy's write fd is open holds it
    // until that child execs; the copy is complete, the exec only has to wait for that moment.
    let mut tries = 0;
    let out = loop {
        match Command::new(&bin)
            .env(
                "AGENTOS_BUS_ADDRESS",
                "unix:path=/nonexistent/agentctl-test-bus",
            )
            .env("PATH", dir.path().join("empty"))
            .arg("check")
            .output()
        {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < 50 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            r => break r.unwrap(),
        }
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("probing this host locally instead"),
        "{stderr}"
    );
    assert!(
        stderr.contains("agentosd not found next to agentctl")
            && stderr.contains(&dir.path().display().to_string())
            && stderr.contains("install agentosd"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty(), "no report was printed: {out:?}");
}

/// `agentctl … | head`: a reader that has gone ends agentctl with SIGPIPE like any filter,
/// without a panic message (Rust ignores SIGPIPE, so a write then fails with EPIPE and
/// `println!` panics unless the default action is restored).
#[test]
fn a_closed_pipe_ends_it_quietly() {
    use std::os::unix::process::ExitStatusExt as _;
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader); // no reader at all: the first write gets EPIPE / SIGPIPE
    let out = Command::new(AGENTCTL)
        .args(["completions", "bash"])
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "{out:?}");
}
