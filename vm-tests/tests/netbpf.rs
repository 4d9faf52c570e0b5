//! eBPF network enforcement under the real daemon in the guest, where BPF LSM is enabled: the
//! cgroup programs refuse an agent's ungranted UDP destinations, `lsm/socket_connect` (loaded
//! here, refused on the development host) refuses an ungranted host on a granted TCP port before
//! the cgroup program sees it, granted destinations work, and every refusal is in the audit trail
//! (and the journal) as a kernel denial. `agentctl audit verify` passes on the daemon's log.

use std::net::{TcpListener, UdpSocket};
use std::time::Duration;

use serde_json::Value;
use vm_tests::{
    Agent, agentctl, attempt_results, cmd, helper, require_vm, result_of, wait_for, write_contract,
};

fn denial<'a>(recs: &'a [Value], syscall: &str, addr: &str, port: u16) -> &'a Value {
    recs.iter()
        .find(|r| {
            r["kind"] == "denial"
                && r["detail"]["syscall"] == syscall
                && r["detail"]["addr"] == addr
                && r["detail"]["port"] == port
        })
        .unwrap_or_else(|| panic!("no {syscall} denial to {addr}:{port} in {recs:#?}"))
}

#[test]
#[ignore = "needs the guest VM: run `cargo xtask vm test`"]
fn lsm_and_cgroup_bpf_refuse_ungranted_destinations() {
    require_vm();
    let check = cmd("agentosd", &["check"]).ok();
    assert!(
        check
            .stdout
            .contains("agentos BPF LSM program (lsm/socket_connect): load OK"),
        "{check}"
    );
    let journal = cmd("journalctl", &["-u", "agentosd", "--no-pager", "-n", "200"]);
    assert!(
        journal
            .stdout
            .contains("BPF LSM: lsm/socket_connect attached"),
        "{journal}"
    );
    // systemd mounts bpffs at /sys/fs/bpf: the daemon pins its links and maps there, so they
    // outlive it (issue 12, class 4; the kill -9 loop is agentosd/tests/netbpf.rs).
    assert!(
        journal
            .stdout
            .contains("links and maps pinned in /sys/fs/bpf/agentos/net-"),
        "{journal}"
    );
    assert!(
        check
            .stdout
            .contains("bpffs pins: /sys/fs/bpf/agentos is a bpffs"),
        "{check}"
    );

    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let up = udp.local_addr().unwrap().port();
    let up2 = UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let tp = tcp.local_addr().unwrap().port();
    let name = "vmt-net";
    let c = write_contract(
        name,
        &format!(
            "apiVersion: agentos/v0.2\nkind: AgentContract\nname: {name}\nclass: {{ latency: DT }}\nexec: {{ command: {}, args: [\"{up}\", \"{up2}\", \"{tp}\"] }}\nrestart: {{ policy: \"no\" }}\ncapabilities:\n  - net.connect: [\"127.0.0.1:{up}\", \"127.0.0.1:{tp}\"]\n",
            helper("vmt-net")
        ),
    );
    let agent = Agent::start(name, &c);
    let st = agent.wait_state("running", Duration::from_secs(30));
    let r = attempt_results(st["log_path"].as_str().unwrap());
    eprintln!("vmt-net: {r:?}");
    assert_eq!(result_of(&r, "udp-granted"), "ok");
    let mut buf = [0u8; 64];
    let (n, _) = udp.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"agent datagram");
    assert_eq!(result_of(&r, "tcp-granted"), "ok");
    assert_eq!(result_of(&r, "udp-other-host"), "err EPERM");
    assert_eq!(result_of(&r, "udp-other-port"), "err EPERM");
    assert_eq!(result_of(&r, "udp-connect-other-host"), "err EPERM");
    assert_eq!(result_of(&r, "tcp-other-host"), "err EPERM");

    let recs: Vec<Value> = wait_for("4 denial records", Duration::from_secs(30), || {
        let out = agentctl(&["audit", "show", "--json", "--agent", name]).ok();
        let recs: Vec<Value> = out
            .stdout
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        (recs.iter().filter(|r| r["kind"] == "denial").count() >= 4).then_some(recs)
    });
    // UDP sendto: only the cgroup program sees it.
    let d = denial(&recs, "sendmsg", "127.0.0.2", up);
    assert_eq!(d["detail"]["hook"], "cgroup/sendmsg4", "{d}");
    assert_eq!(d["detail"]["mechanism"], "cgroup-bpf");
    assert_eq!(d["detail"]["errno"], "EPERM");
    assert_eq!(d["decision"], "deny");
    assert_eq!(d["binding"].as_str().map(str::len), Some(64), "{d}");
    denial(&recs, "sendmsg", "127.0.0.1", up2);
    // connect(): BPF LSM refuses first (Landlock allowed the granted TCP port).
    for (addr, port) in [("127.0.0.2", tp), ("127.0.0.3", up)] {
        let d = denial(&recs, "connect", addr, port);
        assert_eq!(d["detail"]["hook"], "lsm/socket_connect", "{d}");
        assert_eq!(d["detail"]["mechanism"], "bpf-lsm");
        assert_eq!(d["detail"]["errno"], "EPERM");
    }
    // The lifecycle records are there too.
    assert!(
        recs.iter()
            .any(|r| r["kind"] == "lifecycle" && r["detail"]["event"] == "started"),
        "{recs:#?}"
    );
    drop(agent);

    // Forwarded to the journal.
    let j = wait_for("denials in the journal", Duration::from_secs(20), || {
        let out = cmd(
            "journalctl",
            &[
                "SYSLOG_IDENTIFIER=agentosd-audit",
                "AGENTOS_AUDIT_KIND=denial",
                "-o",
                "cat",
                "--no-pager",
            ],
        );
        out.stdout.contains("\"addr\":\"127.0.0.2\"").then_some(out)
    });
    assert!(j.stdout.contains("\"syscall\":\"sendmsg\""), "{j}");

    let v = agentctl(&["audit", "verify"]);
    assert!(v.success(), "{v}");
}
