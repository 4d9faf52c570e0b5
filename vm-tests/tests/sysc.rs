//! Opt-in per-agent syscall counts under systemd in the guest: a drop-in sets
//! `AGENTOSD_SYSCALL_COUNTS=1`, and an agent that makes a known number of syscalls shows at
//! least that many in `agentctl status --json` while an idle one shows far fewer; without the
//! drop-in the field is null. (The host test of the same, agentosd/tests/sysc.rs, attaches a
//! global hook and so runs only on request there.)

use std::time::Duration;

use vm_tests::{Agent, agentctl, contract_yaml, require_vm, systemctl, wait_for, write_contract};

const DROP_IN: &str = "/etc/systemd/system/agentosd.service.d/sysc.conf";
const BYTES: u64 = 100_000;

fn restart_agentosd() {
    systemctl(&["daemon-reload"]).ok();
    systemctl(&["restart", "agentosd"]).ok();
    wait_for("agentosd back", Duration::from_secs(60), || {
        agentctl(&["list"]).success().then_some(())
    });
}

#[test]
#[ignore = "needs the guest VM: run `cargo xtask vm test`"]
fn syscall_counts_when_the_operator_enables_them() {
    require_vm();
    std::fs::create_dir_all("/etc/systemd/system/agentosd.service.d").unwrap();
    std::fs::write(
        DROP_IN,
        "[Service]\nEnvironment=AGENTOSD_SYSCALL_COUNTS=1\n",
    )
    .unwrap();
    restart_agentosd();
    let busy_yaml = contract_yaml(
        "vmt-sysc-busy",
        "/bin/sh",
        &[
            "-c",
            &format!("dd if=/dev/zero of=/dev/null bs=1 count={BYTES} 2>/dev/null; exec sleep 600"),
        ],
        "pids: 16",
    );
    let idle_yaml = contract_yaml("vmt-sysc-idle", "/bin/sleep", &["600"], "pids: 16");
    let busy = Agent::start(
        "vmt-sysc-busy",
        &write_contract("vmt-sysc-busy", &busy_yaml),
    );
    let idle = Agent::start(
        "vmt-sysc-idle",
        &write_contract("vmt-sysc-idle", &idle_yaml),
    );
    busy.wait_state("running", Duration::from_secs(30));
    idle.wait_state("running", Duration::from_secs(30));
    let want = 2 * BYTES;
    let n = wait_for(
        "the busy agent's count to pass 2 × BYTES",
        Duration::from_secs(120),
        || {
            let n = busy.status()["syscalls"].as_u64()?;
            (n >= want).then_some(n)
        },
    );
    let idle_n = idle.status()["syscalls"]
        .as_u64()
        .expect("counted while enabled");
    println!("MEASURED syscalls counted: busy agent {n} (dd made >= {want}), idle agent {idle_n}");
    assert!(idle_n < want / 10, "idle agent counted {idle_n}");
    let text = agentctl(&["status", "vmt-sysc-busy"]).ok();
    assert!(text.stdout.contains("Syscalls: "), "{text}");
    agentctl(&["stop", "vmt-sysc-busy"]).ok();
    agentctl(&["stop", "vmt-sysc-idle"]).ok();

    // Off again: no count.
    std::fs::remove_file(DROP_IN).unwrap();
    restart_agentosd();
    agentctl(&["start", "vmt-sysc-idle"]).ok();
    idle.wait_state("running", Duration::from_secs(30));
    assert!(idle.status()["syscalls"].is_null(), "{}", idle.status());
    agentctl(&["stop", "vmt-sysc-idle"]).ok();
}
