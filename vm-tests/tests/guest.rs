//! The guest itself: the mechanisms agentos needs are really there (so every other VM test runs
//! against them, and the host's lack of them cannot hide here).

use vm_tests::{cmd, require_vm};

#[test]
#[ignore = "needs the guest VM: run `cargo xtask vm test`"]
fn kernel_is_the_backports_kernel() {
    require_vm();
    let release = cmd("uname", &["-r"]).ok().stdout;
    assert!(release.starts_with("7."), "guest kernel is {release}");
}

#[test]
#[ignore = "needs the guest VM: run `cargo xtask vm test`"]
fn pid1_is_systemd_and_system_bus_runs() {
    require_vm();
    let comm = std::fs::read_to_string("/proc/1/comm").expect("reading /proc/1/comm");
    assert_eq!(comm.trim(), "systemd");
    assert!(std::path::Path::new("/run/systemd/system").is_dir());
    let state = cmd("systemctl", &["is-system-running"]).stdout;
    assert!(
        matches!(state.trim(), "running" | "degraded" | "starting"),
        "systemctl is-system-running: {state}"
    );
    let dbus = cmd("systemctl", &["is-active", "dbus.service"]).stdout;
    assert_eq!(dbus.trim(), "active");
    assert!(std::path::Path::new("/run/dbus/system_bus_socket").exists());
}

#[test]
#[ignore = "needs the guest VM: run `cargo xtask vm test`"]
fn cgroup_v2_has_the_budget_controllers() {
    require_vm();
    let fstype = cmd("stat", &["-f", "-c", "%T", "/sys/fs/cgroup"])
        .ok()
        .stdout;
    assert_eq!(fstype.trim(), "cgroup2fs");
    let controllers = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
        .expect("reading cgroup.controllers");
    for c in ["cpu", "memory", "pids", "io", "cpuset"] {
        assert!(
            controllers.split_whitespace().any(|x| x == c),
            "controller {c} missing from {controllers:?}"
        );
    }
}

#[test]
#[ignore = "needs the guest VM: run `cargo xtask vm test`"]
fn sched_ext_and_bpf_lsm_are_there() {
    require_vm();
    let state = std::fs::read_to_string("/sys/kernel/sched_ext/state")
        .expect("reading /sys/kernel/sched_ext/state (CONFIG_SCHED_CLASS_EXT)");
    assert!(
        matches!(
            state.trim(),
            "disabled" | "enabled" | "enabling" | "disabling"
        ),
        "/sys/kernel/sched_ext/state: {state}"
    );
    let lsm = std::fs::read_to_string("/sys/kernel/security/lsm")
        .expect("reading /sys/kernel/security/lsm (securityfs)");
    assert!(
        lsm.trim().split(',').any(|l| l == "bpf"),
        "bpf is not an active LSM: {lsm}"
    );
    assert!(lsm.split(',').any(|l| l.trim() == "landlock"), "lsm: {lsm}");
}
