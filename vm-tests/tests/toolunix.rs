//! Pathname Unix sockets from a tool's cgroup under the BPF LSM fence (`lsm/unix_stream_connect`,
//! `lsm/unix_may_send` in `ebpf/fs.bpf.c`), in the guest where BPF LSM is enabled.
//!
//! Landlock ABI 9 gives a tool no `RESOLVE_UNIX` rule, so its processes reach no pathname socket
//! at all; where Landlock has no `RESOLVE_UNIX` (kernels before 7.1) or the daemon runs with
//! `--no-landlock-unix`, the BPF fence is all there is, and it must cover the tools an agent
//! calls as it covers the agent (else an agent's tool call reaches the system bus, journald,
//! any socket its uid may write). The BPF layer alone is shown the way `fslsm.rs` does it: a
//! root shell (no Landlock, DAC lets it connect anywhere) moved into the cgroup of a running
//! tool call is refused the host's sockets with EACCES, each refusal a `bpf-lsm` record of the
//! agent, while a socket made in that cgroup (the agent's subtree) is reached; outside agents
//! the same commands connect.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use vm_tests::{Agent, Out, agentctl, cmd, require_vm, wait_for, write_contract};

const MANIFEST: &str = "/etc/agentos/tools.d/vmt-waiter.yaml";

/// Connect (stream) and send (datagram) to the given sockets, one `NAME ok` / `NAME err ERRNO`
/// line each; `own` binds a stream socket in the calling process's cgroup and connects to it.
const PROBE: &str = r#"
import os, socket, sys
def t(name, f):
    try:
        f()
        print(name, "ok")
    except OSError as e:
        print(name, "err", e.errno)
def stream(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    s.close()
def dgram(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.sendto(b"<14>agentos vmt toolunix probe", path)
    s.close()
def own():
    p = "/tmp/vmt-toolunix-%d.sock" % os.getpid()
    l = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    l.bind(p)
    l.listen(1)
    try:
        stream(p)
    finally:
        l.close()
        os.unlink(p)
t("system-bus", lambda: stream("/run/dbus/system_bus_socket"))
t("journal-dgram", lambda: dgram("/run/systemd/journal/socket"))
t("own", own)
"#;

fn probe(prefix: &str) -> Out {
    cmd(
        "sh",
        &[
            "-c",
            &format!("{prefix}exec python3 -c {}", shell_quote(PROBE)),
        ],
    )
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r#"'\''"#))
}

fn results(out: &Out) -> Vec<(String, String)> {
    out.stdout
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(n, r)| (n.to_string(), r.to_string()))
        .collect()
}

fn result(r: &[(String, String)], name: &str) -> String {
    r.iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.clone())
        .unwrap_or_else(|| panic!("no result for {name} in {r:?}"))
}

/// The cgroup of the running tool call: the one directory under the agent's `tools/`.
fn tool_cgroup(agent_cg: &Path) -> Option<PathBuf> {
    std::fs::read_dir(agent_cg.join("tools"))
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.join("cgroup.procs").exists())
}

#[test]
#[ignore = "needs the guest VM: run `cargo xtask vm test`"]
fn a_tool_cgroup_reaches_only_sockets_of_its_agent() {
    require_vm();
    let check = cmd("agentosd", &["check"]).ok();
    assert!(
        check
            .stdout
            .lines()
            .any(|l| l.contains("landlock unix sockets") && l.contains("BPF LSM")),
        "the guest's kernel has the BPF LSM fence: {check}"
    );
    // Outside agents the probe reaches the host's sockets (the control: what is refused below
    // is refused because of the cgroup).
    let outside = results(&probe(""));
    assert_eq!(result(&outside, "system-bus"), "ok", "{outside:?}");
    assert_eq!(result(&outside, "journal-dgram"), "ok", "{outside:?}");
    assert_eq!(result(&outside, "own"), "ok", "{outside:?}");

    std::fs::create_dir_all("/etc/agentos/tools.d").unwrap();
    std::fs::write(
        MANIFEST,
        "apiVersion: agentos/v0.2\nkind: Tool\nname: vmt.waiter\n\
         description: Waits, then answers (toolunix VM test).\nrisk: low\ntimeout_ms: 60000\n\
         exec:\n  command: /bin/sh\n  args: [\"-c\", \"sleep 20; echo '{}'\"]\n\
         input_schema: {type: object}\n",
    )
    .unwrap();
    let reload = agentctl(&["daemon-reload"]).ok();
    assert!(!reload.stdout.contains("not loaded"), "{reload}");
    let script = vm_tests::bridge_script(
        "",
        &[vm_tests::tool_call(2, "vmt.waiter")],
        "; exec sleep 600",
    );
    let name = "vmt-toolunix";
    let yaml = format!(
        "apiVersion: agentos/v0.2\nkind: AgentContract\nname: {name}\nclass: {{ latency: DT }}\n\
         exec: {{ command: /bin/sh, args: [\"-c\", {}] }}\nrestart: {{ policy: \"no\" }}\n\
         capabilities: [vmt.waiter]\n",
        serde_json::to_string(&script).unwrap()
    );
    let agent = Agent::start(name, &write_contract(name, &yaml));
    let agent_cg = agent.cgroup();
    let tool_cg = wait_for("the tool call's cgroup", Duration::from_secs(30), || {
        tool_cgroup(&agent_cg)
    });

    // Root, no Landlock, in the tool's cgroup: only the BPF LSM stands between it and the
    // host's sockets.
    let inside = results(&probe(&format!(
        "echo $$ > {}/cgroup.procs && ",
        tool_cg.display()
    )));
    println!(
        "ok probe in the tool cgroup {}: {inside:?}",
        tool_cg.display()
    );
    assert_eq!(result(&inside, "system-bus"), "err 13", "{inside:?}");
    assert_eq!(result(&inside, "journal-dgram"), "err 13", "{inside:?}");
    assert_eq!(
        result(&inside, "own"),
        "ok",
        "a socket made in the agent's subtree is its own: {inside:?}"
    );

    let recs = wait_for("the bpf-lsm unix denials", Duration::from_secs(30), || {
        let out = agentctl(&["audit", "show", "--json", "--agent", name]).ok();
        let recs: Vec<Value> = out
            .stdout
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|r| r["kind"] == "denial" && r["detail"]["mechanism"] == "bpf-lsm")
            .collect();
        (recs.len() >= 2).then_some(recs)
    });
    for (hook, path) in [
        ("lsm/unix_stream_connect", "/run/dbus/system_bus_socket"),
        ("lsm/unix_may_send", "/run/systemd/journal/socket"),
    ] {
        assert!(
            recs.iter()
                .any(|r| r["detail"]["hook"] == hook && r["detail"]["path"] == path),
            "no {hook} denial of {path}: {recs:#?}"
        );
    }

    // The call ends; its cgroup and its entry go with it.
    let log = "/var/lib/agentos/logs/default/vmt-toolunix.log";
    let text = wait_for("the tool call to finish", Duration::from_secs(90), || {
        let t = std::fs::read_to_string(log).unwrap_or_default();
        t.contains("bridge-exit=").then_some(t)
    });
    assert!(text.contains("bridge-exit=0"), "{text}");
    wait_for("the tool cgroup to go", Duration::from_secs(30), || {
        (!tool_cg.exists()).then_some(())
    });
    agentctl(&["stop", name]).ok();
    drop(agent);
    let _ = std::fs::remove_file(MANIFEST);
    agentctl(&["daemon-reload"]).ok();
    agentctl(&["audit", "verify"]).ok();
}
