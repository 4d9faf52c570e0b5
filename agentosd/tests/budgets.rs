//! Budgets cover everything an agent causes (issue 12, class 6), through the real daemon: its
//! tool processes live in the agent's own cgroup subtree (`agents/<t>/<n>/tools/<id>`, beside
//! the agent's `main` leaf, both under the agent's budgets), the tool calls of one agent are
//! bounded over all its connections, and stop — also after the daemon was killed and re-adopted
//! the agent, even from the old layout — leaves no process of the agent or its tools.
//!
//! The host's cgroup2 has no controllers: here placement and counting are checked through
//! `cgroup.procs` of the subtree; that pids.max/memory.max of the agent refuse its tools is
//! proven in the VM (vm-tests/tests/budgets.rs, `cargo xtask vm test budgets`).

#![allow(clippy::unwrap_used)]

#[macro_use]
mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::flood::{steps, write};
use common::{Bus, Daemon, TestCgroup};
use serde_json::Value;

/// The agent: two MCP connections (the inherited one and one to `$AGENTOS_SOCKET`), a call of
/// the forking tool and two calls held for consent on the first (three in flight: the limit),
/// then one more on the second, which the per-agent bound must refuse. Prints JSON steps.
const AGENT: &str = r#"
import json, os, socket, sys, time
def step(**kw):
    print(json.dumps(kw), flush=True)
def conn(fd=None):
    if fd is not None:
        s = socket.socket(fileno=fd)
    else:
        s = socket.socket(socket.AF_UNIX)
        s.connect(os.environ["AGENTOS_SOCKET"])
    return s, s.makefile("rwb", buffering=0)
def send(f, **kw):
    kw["jsonrpc"] = "2.0"
    f.write((json.dumps(kw) + "\n").encode())
def recv(f):
    return json.loads(f.readline())
a = conn(int(os.environ["AGENTOS_SOCKET_FD"]))
b = conn()
for _, f in (a, b):
    send(f, id=0, method="initialize", params={"protocolVersion": "2025-06-18",
         "capabilities": {}, "clientInfo": {"name": "budgets", "version": "0"}})
    recv(f)
    send(f, method="notifications/initialized")
send(a[1], id="fork", method="tools/call", params={"name": "hold.fork", "arguments": {}})
for i in range(2):
    send(a[1], id="held%d" % i, method="tools/call", params={"name": "hold.consent", "arguments": {}})
time.sleep(2)
send(b[1], id="over", method="tools/call", params={"name": "hold.consent", "arguments": {}})
step(step="over", reply=recv(b[1]))
time.sleep(3600)
"#;

fn procs(cg: &Path) -> Vec<u32> {
    std::fs::read_to_string(cg.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Every process in `cg` and below.
fn subtree_procs(cg: &Path) -> Vec<u32> {
    agentosd::cgroup::Cgroup::new(cg).subtree_procs()
}

/// The tool cgroups under the agent (`tools/*`).
fn tool_cgroups(agent_cg: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(agent_cg.join("tools"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| p.is_dir())
                .collect()
        })
        .unwrap_or_default()
}

fn wait_for<T>(what: &str, secs: u64, mut f: impl FnMut() -> Option<T>, d: &Daemon) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {secs} s waiting for {what}\ndaemon log:\n{}",
            d.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn tools_count_in_the_agent_subtree_and_nothing_outlives_stop() {
    skip_unless_capable!();
    let python = Path::new("/usr/bin/python3");
    if !python.exists() {
        common::skip(module_path!(), "no /usr/bin/python3 for the agent");
        return;
    }
    let bus = Bus::start();
    let cg = TestCgroup::new("budgets");
    let dir = tempfile::tempdir().unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    }
    let files = dir.path().join("t");
    write(&files.join("agent.py"), AGENT, 0o644);
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&files, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let tools = dir.path().join("tools.d");
    // A tool that forks: the shell and two sleeps, all in the tool's cgroup.
    write(
        &tools.join("hold-fork.yaml"),
        r#"apiVersion: agentos/v0.2
kind: Tool
name: hold.fork
description: Fork two children and wait (for the budgets test).
risk: low
timeout_ms: 120000
exec:
  command: /bin/sh
  args: ["-c", "cat >/dev/null; sleep 300 & sleep 300 & wait"]
input_schema: {type: object}
"#,
        0o644,
    );
    write(
        &tools.join("hold-consent.yaml"),
        r#"apiVersion: agentos/v0.2
kind: Tool
name: hold.consent
description: Held for consent (for the per-agent call bound).
risk: high
timeout_ms: 5000
exec:
  command: /bin/sh
  args: ["-c", "cat >/dev/null; echo '{}'"]
input_schema: {type: object}
"#,
        0o644,
    );
    let mut d = Daemon::start_with(
        &bus,
        &cg.path,
        dir.path(),
        &[
            "--tools-dir",
            tools.to_str().unwrap(),
            "--consent-timeout",
            "120",
            "--max-tool-calls-per-agent",
            "3",
        ],
    );
    let t = files.display();
    let contract = common::contract(
        dir.path(),
        "spender",
        &format!("{{ command: /usr/bin/python3, args: [\"{t}/agent.py\"] }}"),
        &format!(
            "capabilities:\n  - hold.fork\n  - hold.consent\n  - fs.read: [\"{t}\"]\n  - fs.exec: [/usr, /bin, /lib]\n\
             security: {{ consent_for: [hold.consent] }}\ncompute: {{ pids: 64 }}\n"
        ),
    );
    d.ctl_ok(&["start", contract.to_str().unwrap()]);
    let st = d.wait_state("spender", "running", 20);
    let main_pid = st["main_pid"].as_u64().unwrap() as u32;
    let agent_cg = cg.path.join("agents/default/spender");
    let main_cg = agent_cg.join("main");
    let log = dir.path().join("logs/default/spender.log");

    // The agent in its leaf, its tool (shell + two sleeps) beside it, nothing in between.
    let tool_cg = wait_for(
        "the forking tool's three processes in agents/default/spender/tools/*",
        30,
        || {
            tool_cgroups(&agent_cg)
                .into_iter()
                .find(|c| procs(c).len() >= 3)
        },
        &d,
    );
    assert!(
        tool_cg
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("call-"),
        "{}",
        tool_cg.display()
    );
    assert_eq!(procs(&main_cg), vec![main_pid], "the agent's leaf");
    assert!(
        procs(&agent_cg).is_empty(),
        "no process in the agent's cgroup itself (no-internal-process rule)"
    );
    assert!(
        !cg.path.join("tools").exists(),
        "no tool cgroup outside the agent: {}",
        cg.path.join("tools").display()
    );
    let tool_pids = procs(&tool_cg);
    let mut all = subtree_procs(&agent_cg);
    all.sort_unstable();
    let mut want: Vec<u32> = tool_pids.iter().copied().chain([main_pid]).collect();
    want.sort_unstable();
    assert_eq!(
        all, want,
        "the agent's subtree (what its pids.max counts) holds the agent and its tool"
    );
    for p in &tool_pids {
        assert!(
            common::proc_cgroup(*p).ends_with("/agents/default/spender/tools/")
                || common::proc_cgroup(*p).contains("/agents/default/spender/tools/call-"),
            "tool pid {p} in {}",
            common::proc_cgroup(*p)
        );
    }
    // agentctl status counts the tool's processes as the agent's.
    let st = d.status_json("spender");
    let listed: Vec<u64> = st["processes"]
        .as_array()
        .map(|a| a.iter().filter_map(|p| p[0].as_u64()).collect())
        .unwrap_or_default();
    for p in &tool_pids {
        assert!(listed.contains(&(*p as u64)), "{p} not in status: {st}");
    }

    // The per-agent bound: three calls in flight on the first connection, the fourth on the
    // second connection is refused (-32003, scope agent).
    let over = wait_for(
        "the agent's over-the-limit call",
        30,
        || steps(&log).into_iter().find(|v| v["step"] == "over"),
        &d,
    );
    assert_eq!(over["reply"]["error"]["code"], -32003, "{over}");
    assert_eq!(over["reply"]["error"]["data"]["scope"], "agent", "{over}");
    assert_eq!(over["reply"]["error"]["data"]["limit"], 3, "{over}");

    // The daemon dies and comes back: it re-adopts the agent. Make it the old layout first
    // (the agent's process directly in its cgroup, no `main`): the new daemon moves it into
    // `main`, and kills the tool processes whose calls died with the old daemon.
    d.kill9();
    for p in procs(&main_cg) {
        std::fs::write(agent_cg.join("cgroup.procs"), p.to_string()).unwrap();
    }
    std::fs::remove_dir(&main_cg).unwrap();
    assert_eq!(procs(&agent_cg), vec![main_pid], "old layout set up");
    d.spawn();
    wait_for(
        "re-adoption into main",
        30,
        || (procs(&main_cg) == vec![main_pid]).then_some(()),
        &d,
    );
    assert_eq!(d.status_json("spender")["state"], "running");
    assert!(
        procs(&agent_cg).is_empty(),
        "moved out of the agent's cgroup"
    );
    wait_for(
        "the orphaned tool processes to be killed",
        10,
        || tool_pids.iter().all(|p| !common::alive(*p)).then_some(()),
        &d,
    );

    // Stop leaves nothing: no process of the agent or its tools, no cgroup.
    let before = subtree_procs(&agent_cg);
    d.ctl_ok(&["stop", "spender"]);
    for p in before.iter().chain(&tool_pids).chain([&main_pid]) {
        assert!(!common::alive(*p), "pid {p} outlived stop");
    }
    assert!(
        !agent_cg.exists(),
        "agent cgroup left behind: {:?}",
        subtree_procs(&agent_cg)
    );
}

#[test]
fn kill_and_failed_start_leave_nothing() {
    skip_unless_capable!();
    let bus = Bus::start();
    let cg = TestCgroup::new("budgets-kill");
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&bus, &cg.path, dir.path());
    // An agent whose children ignore SIGTERM; `kill --signal KILL` ends all of them.
    let c = common::contract(
        dir.path(),
        "brood",
        "{ command: /bin/sh, args: [\"-c\", \"trap '' TERM; sleep 300 & sleep 300 & wait\"] }",
        "restart: { policy: \"no\" }\n",
    );
    d.ctl_ok(&["start", c.to_str().unwrap()]);
    d.wait_state("brood", "running", 20);
    let agent_cg = cg.path.join("agents/default/brood");
    let pids = wait_for(
        "three processes in main",
        10,
        || {
            let p = procs(&agent_cg.join("main"));
            (p.len() >= 3).then_some(p)
        },
        &d,
    );
    d.ctl_ok(&["kill", "brood", "--signal", "KILL"]);
    wait_for(
        "every process of the agent to die",
        10,
        || pids.iter().all(|p| !common::alive(*p)).then_some(()),
        &d,
    );
    wait_for(
        "the agent's cgroup to go",
        10,
        || (!agent_cg.exists()).then_some(()),
        &d,
    );

    // A start that fails (no such program) leaves no cgroup either.
    let bad = common::contract(dir.path(), "nothing", "{ command: /nonexistent/agent }", "");
    let _ = d.ctl(&["start", bad.to_str().unwrap()]);
    assert!(
        !cg.path.join("agents/default/nothing").exists(),
        "a failed start left its cgroup"
    );
}

/// A tool now runs under `agents/`, where the cgroup BPF programs refuse sockets to a cgroup
/// without an entry: each tool cgroup gets one from the tool's effective grants. A UDP send to
/// the granted destination works, one to another port is refused by BPF (EPERM; Landlock does
/// not see UDP).
#[test]
fn a_tool_gets_the_network_its_grants_name() {
    skip_unless_capable!();
    let python = Path::new("/usr/bin/python3");
    if !python.exists() {
        common::skip(module_path!(), "no /usr/bin/python3 for the tool");
        return;
    }
    let bus = Bus::start();
    let cg = TestCgroup::new("budgets-net");
    let dir = tempfile::tempdir().unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    }
    let tools = dir.path().join("tools.d");
    let probe = r#"import json, socket, sys
out = {}
for port in (9, 10):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.sendto(b"x", ("127.0.0.1", port))
        out[str(port)] = "ok"
    except OSError as e:
        out[str(port)] = e.errno
print(json.dumps(out))
"#;
    write(
        &tools.join("udp-probe.yaml"),
        &format!(
            "apiVersion: agentos/v0.2\nkind: Tool\nname: udp.probe\n\
             description: UDP sends (budgets test).\nrisk: low\ntimeout_ms: 20000\n\
             exec:\n  command: /usr/bin/python3\n  args: [\"-c\", {}]\n\
             input_schema: {{type: object}}\nsandbox:\n  net.connect: [\"127.0.0.1:*\"]\n",
            serde_json::to_string(probe).unwrap()
        ),
        0o644,
    );
    let d = Daemon::start_with(
        &bus,
        &cg.path,
        dir.path(),
        &["--tools-dir", tools.to_str().unwrap()],
    );
    let (exec, bin_dir) = common::bridge_call_exec("udp.probe");
    let c = common::contract(
        dir.path(),
        "netuser",
        &exec,
        &format!(
            "restart: {{ policy: \"no\" }}\ncapabilities:\n  - udp.probe\n  - net.connect: [\"127.0.0.1:9\"]\n\
             \x20 - fs.read: [\"{bin_dir}\"]\n  - fs.exec: [/usr, /bin, /lib, \"{bin_dir}\"]\n"
        ),
    );
    d.ctl_ok(&["start", c.to_str().unwrap()]);
    let log = dir.path().join("logs/default/netuser.log");
    let text = wait_for(
        "the tool call",
        60,
        || {
            let t = std::fs::read_to_string(&log).unwrap_or_default();
            t.contains("bridge-exit=").then_some(t)
        },
        &d,
    );
    let reply: Value = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["id"] == 2)
        .unwrap_or_else(|| panic!("no reply in {text}"));
    let out = &reply["result"]["structuredContent"];
    assert_eq!(out["9"], "ok", "granted UDP destination refused: {reply}");
    assert_eq!(
        out["10"],
        libc::EPERM,
        "ungranted UDP destination not refused by BPF: {reply}"
    );
}
