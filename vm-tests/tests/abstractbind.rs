//! BPF LSM `lsm/socket_bind` (`ebpf/fs.bpf.c`), the second layer behind the agent's own network
//! namespace (an agent with network grants has one too, its inet sockets come from its socket
//! broker): the program refuses its abstract binds (squatting a host service's name, were the
//! namespace ever missing), while pathname sockets in its home and root outside any agent are
//! unaffected. BPF LSM is refused on the development host, so this runs in the guest only.
//!
//! The binds are made by `systemd-socket-activate --datagram -l ADDR`, which binds and then waits
//! for a datagram: under `timeout 3` a bind that worked ends with 124, a refused one at once with
//! 1 and the kernel's message.

use std::time::Duration;

use vm_tests::{Agent, cmd, require_vm, wait_for, write_contract};

const AGENT_SCRIPT: &str = r#"b() { n=$1; shift; out=$(timeout 3 systemd-socket-activate --datagram -l "$@" /bin/true 2>&1); echo "$n rc=$? $out"; }
b bind-abstract @agentos-vmt-squat
b bind-path "$HOME/own.sock"
echo done
exec sleep 600
"#;

fn rc_of(log: &str, name: &str) -> Option<String> {
    log.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} rc=")))
        .map(|r| r.to_string())
}

#[test]
#[ignore = "needs the guest VM: run `cargo xtask vm test`"]
fn agents_with_network_grants_bind_no_abstract_unix_names() {
    require_vm();
    let journal = cmd("journalctl", &["-u", "agentosd", "--no-pager", "-n", "300"]);
    assert!(
        journal.stdout.contains("BPF LSM: lsm/socket_bind attached"),
        "{journal}"
    );
    // Root outside any agent: binds the same kind of name.
    let root = cmd(
        "sh",
        &[
            "-c",
            "timeout 2 systemd-socket-activate --datagram -l @agentos-vmt-root /bin/true; echo rc=$?",
        ],
    );
    assert!(root.stdout.contains("rc=124"), "root's bind: {root}");

    let name = "vmt-abind";
    let c = write_contract(
        name,
        &format!(
            "apiVersion: agentos/v0.2\nkind: AgentContract\nname: {name}\nclass: {{ latency: DT }}\nexec: {{ command: /bin/sh, args: [\"-c\", {}] }}\nrestart: {{ policy: \"no\" }}\ncapabilities:\n  - net.bind: [\"127.0.0.1:18080\"]\n",
            serde_json::to_string(AGENT_SCRIPT).unwrap()
        ),
    );
    let agent = Agent::start(name, &c);
    let st = agent.wait_state("running", Duration::from_secs(30));
    let log_path = st["log_path"].as_str().unwrap().to_string();
    let log = wait_for("the agent's binds", Duration::from_secs(60), || {
        let t = std::fs::read_to_string(&log_path).unwrap_or_default();
        t.lines().any(|l| l == "done").then_some(t)
    });
    println!("agent log:\n{log}");
    let abs = rc_of(&log, "bind-abstract").expect("bind-abstract result");
    assert!(
        abs.starts_with("1 ") && abs.contains("Operation not permitted"),
        "abstract bind of an agent with network grants: {abs}"
    );
    let path = rc_of(&log, "bind-path").expect("bind-path result");
    assert!(
        path.starts_with("124"),
        "pathname socket in its home: {path}"
    );
}
