//! Opt-in per-agent syscall counts (`agentosd --syscall-counts`, `ebpf/sysc.bpf.c`) on the host:
//! an agent that makes a known number of syscalls shows at least that many in `agentctl status
//! --json`, an idle agent far fewer, `agentctl status` prints the line, and without the flag the
//! field is null. Root only; skips when the counter cannot load. The daemon attaches the program
//! to the global syscall-entry hook (it only counts, but every process on the host pays for the
//! hook while it is attached), so on a development host this runs only with
//! `AGENTOS_TEST_GLOBAL_BPF=1`; the VM suite runs the same check (vm-tests/tests/sysc.rs).

#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use agentosd::enforce::sysc::{Hook, SyscCounter};
use common::{Bus, Daemon, TestCgroup};

/// `dd` with bs=1 makes one read and one write per byte.
const BYTES: u64 = 100_000;

fn skip_without_counter() -> bool {
    if std::env::var("AGENTOS_TEST_GLOBAL_BPF").as_deref() != Ok("1") {
        common::skip_by_design(
            "sysc",
            "attaches a program to every host process's syscall entry; runs in \
             `cargo xtask vm test sysc`, or here with AGENTOS_TEST_GLOBAL_BPF=1",
        );
        return true;
    }
    let btf = SyscCounter::load(Hook::TpBtf).err();
    let tp = SyscCounter::load(Hook::Tracepoint).err();
    if let (Some(a), Some(b)) = (btf, tp) {
        common::skip(
            "sysc",
            &format!("the syscall counter cannot load here: {a}; {b}"),
        );
        return true;
    }
    false
}

fn count_of(d: &Daemon, agent: &str) -> serde_json::Value {
    d.status_json(agent)["syscalls"].clone()
}

#[test]
fn agents_syscalls_are_counted_when_enabled() {
    skip_unless_capable!();
    if skip_without_counter() {
        return;
    }
    let bus = Bus::start();
    let cg = TestCgroup::new("sysc");
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut d = Daemon::start_with(&bus, &cg.path, &state, &["--syscall-counts"]);
    let log = d.log_text();
    assert!(log.contains("syscall counts ON"), "{log}");

    let busy = common::contract(
        dir.path(),
        "busy",
        &format!(
            "[/bin/sh, -c, \"dd if=/dev/zero of=/dev/null bs=1 count={BYTES} 2>/dev/null; echo done; exec sleep 600\"]"
        ),
        "",
    );
    let idle = common::contract(dir.path(), "idle", "[/bin/sleep, \"600\"]", "");
    d.ctl_ok(&["start", busy.to_str().unwrap()]);
    d.ctl_ok(&["start", idle.to_str().unwrap()]);
    d.wait_state("default/busy", "running", 20);
    d.wait_state("default/idle", "running", 20);

    // dd's 2 × BYTES syscalls, then `echo done` to the log.
    let want = 2 * BYTES;
    let deadline = Instant::now() + Duration::from_secs(60);
    let busy_n = loop {
        let n = count_of(&d, "default/busy").as_u64().unwrap_or_else(|| {
            panic!(
                "syscalls missing with --syscall-counts: {}",
                d.status_json("default/busy")
            )
        });
        if n >= want {
            break n;
        }
        assert!(
            Instant::now() < deadline,
            "busy agent counted {n} syscalls, want >= {want}; daemon log:\n{}",
            d.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let idle_n = count_of(&d, "default/idle").as_u64().unwrap();
    eprintln!("busy agent: {busy_n} syscalls, idle agent: {idle_n}");
    assert!(
        idle_n < want / 10,
        "idle agent counted {idle_n} syscalls (busy: {busy_n})"
    );
    let text = d.ctl_ok(&["status", "default/busy"]);
    assert!(text.contains("   Syscalls: "), "{text}");

    // Stopped: the last run's count stays.
    d.ctl_ok(&["stop", "default/busy"]);
    d.wait_state("default/busy", "inactive", 20);
    let after = count_of(&d, "default/busy").as_u64().unwrap();
    assert!(after >= busy_n, "after stop: {after} < {busy_n}");

    // `agentosd check` sees the counter on while this daemon runs.
    let out = std::process::Command::new(common::agentosd_bin())
        .arg("check")
        .output()
        .unwrap();
    let check = String::from_utf8_lossy(&out.stdout);
    assert!(
        check.contains("agentos syscall counts") && check.contains("ON now"),
        "{check}"
    );

    d.ctl_ok(&["stop", "default/idle"]);
    d.terminate();

    // Without the flag: no count.
    let state2 = dir.path().join("state2");
    let cg2 = TestCgroup::new("sysc-off");
    let d2 = Daemon::start(&bus, &cg2.path, &state2);
    assert!(!d2.log_text().contains("syscall counts ON"));
    d2.ctl_ok(&["start", idle.to_str().unwrap()]);
    d2.wait_state("default/idle", "running", 20);
    let st = d2.status_json("default/idle");
    assert!(st["syscalls"].is_null(), "{st}");
    let text = d2.ctl_ok(&["status", "default/idle"]);
    assert!(!text.contains("Syscalls:"), "{text}");
    d2.ctl_ok(&["stop", "default/idle"]);
}
