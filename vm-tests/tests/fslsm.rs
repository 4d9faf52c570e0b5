//! BPF LSM filesystem scopes (`ebpf/fs.bpf.c`: `lsm/file_open`, `lsm/bprm_check_security`,
//! `lsm/mmap_file`)
//! under the real daemon in the guest, where BPF LSM is enabled (it is refused on the
//! development host).
//!
//! The guest boots with `lsm=landlock,lockdown,yama,bpf` (the order a host gets by appending
//! `bpf`): Landlock's hook runs first and the first refusal wins, so the BPF programs never see
//! an open Landlock already refused. The test therefore proves the two layers separately:
//! 1. an agent (Landlock + BPF LSM) can run at all, read its granted tree, exec `/bin/true` and
//!    its granted `fs.exec` tree, write its home, use /dev/null, pipes and /proc/self, and is
//!    refused the rest; no `bpf-lsm` denial is ever recorded for what it did (the LSM refuses
//!    nothing Landlock allows);
//! 2. the BPF layer on its own: a root shell moved into the agent's cgroup has no Landlock
//!    domain (and DAC lets root do anything), yet is refused by the LSM with EACCES for a read
//!    outside the scopes (a sibling `data2` of the granted `data`: component boundaries), a write
//!    to a read-only scope, and an exec of a readable but not executable scope, each recorded as a
//!    `bpf-lsm` kernel denial with hook, path, pid and comm; granted opens and execs still work;
//! 3. the same root commands outside any agent's cgroup are unaffected.
//!
//! It also prints the cost of open+close with and without the programs (`MEASURED` lines; under
//! software emulation only the differences mean anything).

use std::io::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;
use vm_tests::{
    Agent, Out, agentctl, attempt_results, cmd, require_vm, result_of, systemctl, wait_for,
    write_contract,
};

const BASE: &str = "/srv/vmt-fs";

fn fixtures() {
    let _ = std::fs::remove_dir_all(BASE);
    for d in ["data", "data2", "bin"] {
        std::fs::create_dir_all(format!("{BASE}/{d}"))
            .expect("writing the test fixtures under /srv/vmt-fs");
    }
    std::fs::write(format!("{BASE}/data/granted.txt"), "granted\n")
        .expect("writing the test fixtures under /srv/vmt-fs");
    std::fs::write(format!("{BASE}/data2/secret.txt"), "secret\n")
        .expect("writing the test fixtures under /srv/vmt-fs");
    std::fs::write(format!("{BASE}/data/root.txt"), "orig\n")
        .expect("writing the test fixtures under /srv/vmt-fs");
    for exe in ["data/mytrue", "bin/mytrue"] {
        let p = format!("{BASE}/{exe}");
        std::fs::copy("/usr/bin/true", &p).expect("writing the test fixtures under /srv/vmt-fs");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755))
            .expect("writing the test fixtures under /srv/vmt-fs");
    }
    for d in [
        BASE.to_string(),
        format!("{BASE}/data"),
        format!("{BASE}/data2"),
    ] {
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755))
            .expect("writing the test fixtures under /srv/vmt-fs");
    }
}

/// The agent's own attempts, one `NAME ok` / `NAME err N` line each, then `done`.
const AGENT_SCRIPT: &str = r#"r() { n=$1; shift; if "$@" >/dev/null 2>&1; then echo "$n ok"; else echo "$n err $?"; fi; }
r read-granted cat /srv/vmt-fs/data/granted.txt
r read-sibling cat /srv/vmt-fs/data2/secret.txt
r read-shadow cat /etc/shadow
r exec-true /bin/true
r exec-granted /srv/vmt-fs/bin/mytrue
r exec-readonly /srv/vmt-fs/data/mytrue
r write-home sh -c 'echo x > "$HOME/w.txt"'
r write-readonly sh -c 'echo x > /srv/vmt-fs/data/agent.txt'
r devnull sh -c 'echo x > /dev/null'
r pipe sh -c 'echo x | cat'
r proc-self cat /proc/self/status
echo done
exec sleep 600
"#;

/// `sh -c SCRIPT` as root, moved into cgroup `cg` first (no Landlock, no seccomp: only the BPF
/// LSM stands between it and the files).
fn in_cgroup(cg: &Path, script: &str) -> Out {
    cmd(
        "sh",
        &[
            "-c",
            &format!("echo $$ > {}/cgroup.procs && {script}", cg.display()),
        ],
    )
}

fn bpf_denials(name: &str) -> Vec<Value> {
    let out = agentctl(&["audit", "show", "--json", "--agent", name]).ok();
    out.stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|r| r["kind"] == "denial" && r["detail"]["mechanism"] == "bpf-lsm")
        .collect()
}

/// Print a line to the serial log even when the test passes (`eprintln!` is captured by the
/// test harness; a direct write to stdout is not).
fn report(line: &str) {
    let mut out = std::io::stdout();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// ns per open+close of `path` over `n` calls, in this process.
fn open_cost(path: &str, n: u32) -> f64 {
    let t = Instant::now();
    for _ in 0..n {
        drop(std::fs::File::open(path).expect("opening the measured file"));
    }
    t.elapsed().as_nanos() as f64 / f64::from(n)
}

fn median_cost(path: &str) -> f64 {
    let mut v: Vec<f64> = (0..5).map(|_| open_cost(path, 20_000)).collect();
    v.sort_by(f64::total_cmp);
    v[2]
}

/// This process's cgroup directory.
fn own_cgroup() -> String {
    let text = std::fs::read_to_string("/proc/self/cgroup").expect("reading /proc/self/cgroup");
    let rel = text
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .unwrap_or("/")
        .to_string();
    format!("/sys/fs/cgroup{rel}")
}

#[test]
#[ignore = "needs the guest VM: run `cargo xtask vm test`"]
fn bpf_lsm_enforces_filesystem_scopes_independently_of_landlock() {
    require_vm();
    let check = cmd("agentosd", &["check"]).ok();
    assert!(
        check.stdout.contains(
            "agentos BPF LSM filesystem programs (ebpf/fs.bpf.c: lsm/file_open, lsm/bprm_check_security): load OK"
        ),
        "{check}"
    );
    let journal = cmd("journalctl", &["-u", "agentosd", "--no-pager", "-n", "300"]);
    assert!(
        journal
            .stdout
            .contains("BPF LSM: lsm/file_open, lsm/bprm_check_security attached"),
        "{journal}"
    );
    fixtures();

    let name = "vmt-fs";
    let c = write_contract(
        name,
        &format!(
            "apiVersion: agentos/v0.2\nkind: AgentContract\nname: {name}\nclass: {{ latency: DT }}\nexec: {{ command: /bin/sh, args: [\"-c\", {}] }}\nrestart: {{ policy: \"no\" }}\ncapabilities:\n  - fs.read: [{BASE}/data]\n  - fs.exec: [{BASE}/bin]\n",
            serde_json::to_string(AGENT_SCRIPT).unwrap()
        ),
    );
    let agent = Agent::start(name, &c);
    let st = agent.wait_state("running", Duration::from_secs(30));
    let status = agentctl(&["status", name]).ok();
    assert!(status.stdout.contains("filesystem (BPF LSM):"), "{status}");

    // 1. The agent, under Landlock and the BPF LSM.
    let r = attempt_results(st["log_path"].as_str().unwrap());
    report(&format!("ok agent attempts (Landlock + BPF LSM): {r:?}"));
    for ok in [
        "read-granted",
        "exec-true",
        "exec-granted",
        "write-home",
        "devnull",
        "pipe",
        "proc-self",
    ] {
        assert_eq!(result_of(&r, ok), "ok", "{ok}: {r:?}");
    }
    for refused in [
        "read-sibling",
        "read-shadow",
        "exec-readonly",
        "write-readonly",
    ] {
        assert!(
            result_of(&r, refused).starts_with("err "),
            "{refused}: {r:?}"
        );
    }

    // 2. The BPF layer alone: root, no Landlock, in the agent's cgroup (its process leaf
    // `main`, whose cgroup id the policy is keyed by; the agent's cgroup itself holds no
    // process).
    let cg = agent.cgroup().join("main");
    let granted = in_cgroup(&cg, &format!("cat {BASE}/data/granted.txt")).ok();
    assert_eq!(granted.stdout, "granted\n");
    in_cgroup(&cg, &format!("/bin/true && {BASE}/bin/mytrue")).ok();
    in_cgroup(
        &cg,
        "echo x > /dev/null && echo x | cat >/dev/null && cat /proc/self/status >/dev/null",
    )
    .ok();
    let sibling = in_cgroup(&cg, &format!("cat {BASE}/data2/secret.txt"));
    assert!(
        !sibling.success() && sibling.stderr.contains("Permission denied"),
        "{sibling}"
    );
    // An existing file (O_CREAT of a new one creates it before file_open runs: creating files
    // is Landlock's alone, see docs/security.md).
    let write = in_cgroup(&cg, &format!("echo x >> {BASE}/data/root.txt"));
    assert!(
        !write.success() && write.stderr.contains("Permission denied"),
        "{write}"
    );
    assert_eq!(
        std::fs::read_to_string(format!("{BASE}/data/root.txt")).unwrap(),
        "orig\n"
    );
    let exec = in_cgroup(&cg, &format!("{BASE}/data/mytrue"));
    assert!(
        !exec.success() && exec.stderr.contains("Permission denied"),
        "{exec}"
    );
    // The dynamic loader (granted) run by hand on the same file: lsm/mmap_file refuses the
    // executable mapping (Landlock does not check mmap); on a granted binary it works.
    let ld = ["/lib64/ld-linux-x86-64.so.2", "/lib/ld-linux-x86-64.so.2"]
        .into_iter()
        .find(|l| Path::new(l).exists())
        .expect("the dynamic loader");
    let loader = in_cgroup(&cg, &format!("{ld} {BASE}/data/mytrue"));
    // (ld.so does not print the errno: "failed to map segment from shared object".)
    assert!(
        !loader.success() && loader.stderr.contains("failed to map segment"),
        "{loader}"
    );
    in_cgroup(&cg, &format!("{ld} {BASE}/bin/mytrue")).ok();

    // 3. Outside agents' cgroups, the same root commands are unaffected.
    cmd("cat", &[&format!("{BASE}/data2/secret.txt")]).ok();
    cmd(&format!("{BASE}/data/mytrue"), &[]).ok();
    cmd(ld, &[&format!("{BASE}/data/mytrue")]).ok();
    cmd("sh", &["-c", &format!("echo x >> {BASE}/data/root.txt")]).ok();

    // Each refusal is a bpf-lsm kernel denial in the audit trail.
    let recs = wait_for("4 bpf-lsm denial records", Duration::from_secs(30), || {
        let recs = bpf_denials(name);
        (recs.len() >= 4).then_some(recs)
    });
    let find = |hook: &str, path: &str| -> &Value {
        recs.iter()
            .find(|r| r["detail"]["hook"] == hook && r["detail"]["path"] == path)
            .unwrap_or_else(|| panic!("no {hook} denial of {path} in {recs:#?}"))
    };
    let d = find("lsm/file_open", &format!("{BASE}/data2/secret.txt"));
    assert_eq!(d["detail"]["access"], "read", "{d}");
    assert_eq!(d["detail"]["granted"], "none", "{d}");
    assert_eq!(d["detail"]["comm"], "cat", "{d}");
    assert_eq!(d["detail"]["errno"], "EACCES", "{d}");
    assert_eq!(d["decision"], "deny");
    assert!(d["detail"]["pid"].as_u64().unwrap_or(0) > 0, "{d}");
    let d = find("lsm/file_open", &format!("{BASE}/data/root.txt"));
    assert_eq!(d["detail"]["access"], "write", "{d}");
    assert_eq!(d["detail"]["granted"], "read", "{d}");
    let d = find("lsm/bprm_check_security", &format!("{BASE}/data/mytrue"));
    assert_eq!(d["detail"]["syscall"], "execve", "{d}");
    assert_eq!(d["detail"]["access"], "exec", "{d}");
    assert_eq!(d["detail"]["granted"], "read", "{d}");
    let d = find("lsm/mmap_file", &format!("{BASE}/data/mytrue"));
    assert_eq!(d["detail"]["syscall"], "mmap", "{d}");
    assert_eq!(d["detail"]["access"], "exec", "{d}");
    assert_eq!(d["detail"]["granted"], "read", "{d}");
    // Nothing else: the LSM refused nothing the agent itself did (Landlock allowed it, or
    // refused it first).
    let expected = [
        format!("{BASE}/data2/secret.txt"),
        format!("{BASE}/data/root.txt"),
        format!("{BASE}/data/mytrue"),
    ];
    for r in &recs {
        let p = r["detail"]["path"].as_str().unwrap_or("");
        assert!(
            expected.iter().any(|e| e == p),
            "unexpected bpf-lsm denial: {r}"
        );
    }
    for r in &recs {
        report(&format!("ok bpf-lsm denial record: {}", r["detail"]));
    }

    // Cost of open+close of /etc/passwd (granted to every agent) in this process: outside
    // agents (one hash lookup miss), then moved into the agent's cgroup (d_path + trie lookup).
    let outside = median_cost("/etc/passwd");
    let home = own_cgroup();
    let mut back = std::fs::OpenOptions::new()
        .write(true)
        .open(format!("{home}/cgroup.procs"))
        .unwrap();
    let mut into = std::fs::OpenOptions::new()
        .write(true)
        .open(cg.join("cgroup.procs"))
        .unwrap();
    let pid = std::process::id().to_string();
    into.write_all(pid.as_bytes()).unwrap();
    let inside = median_cost("/etc/passwd");
    back.write_all(pid.as_bytes()).unwrap();
    assert_eq!(own_cgroup(), home);
    drop(agent);

    // Without the programs: the daemon detaches them when it stops.
    systemctl(&["stop", "agentosd"]).ok();
    let none = median_cost("/etc/passwd");
    systemctl(&["start", "agentosd"]).ok();
    wait_for("agentosd to answer", Duration::from_secs(60), || {
        agentctl(&["list"]).success().then_some(())
    });
    report(&format!(
        "MEASURED open+close /etc/passwd, no BPF LSM programs: {none:.0} ns"
    ));
    report(&format!(
        "MEASURED open+close /etc/passwd, programs attached, outside agents: {outside:.0} ns"
    ));
    report(&format!(
        "MEASURED open+close /etc/passwd, inside an agent's cgroup (d_path + trie): {inside:.0} ns"
    ));

    let v = agentctl(&["audit", "verify"]);
    assert!(v.success(), "{v}");
}

/// The `fs-*` link pins under systemd's bpffs: (file name, generation).
fn fs_links() -> Vec<(String, u64)> {
    std::fs::read_dir("/sys/fs/bpf/agentos")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("fs-"))
        .flat_map(|e| {
            std::fs::read_dir(e.path().join("links"))
                .into_iter()
                .flatten()
                .flatten()
        })
        .filter_map(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            let g = n.rsplit_once('-')?.1.parse().ok()?;
            Some((n, g))
        })
        .collect()
}

/// The installed daemon pins the filesystem programs next to the network ones; its main process
/// killed with SIGKILL (systemd restarts it; a running agent keeps the unit's cgroup, hence the
/// pins' `agents` cgroup id), the next one takes them over: its generation pinned, the previous
/// one's removed. (Without an agent systemd removes the emptied cgroup and the next daemon
/// sweeps the pins: nothing to guard. The kill -9 loop with an agent probing is
/// agentosd/tests/fspin.rs.)
#[test]
#[ignore = "needs the guest VM: run `cargo xtask vm test`"]
fn pinned_filesystem_programs_are_taken_over_after_a_daemon_kill() {
    require_vm();
    let journal = cmd("journalctl", &["-u", "agentosd", "--no-pager", "-n", "300"]);
    assert!(
        journal
            .stdout
            .contains("links and maps pinned in /sys/fs/bpf/agentos/fs-"),
        "{journal}"
    );
    let before = fs_links();
    for p in ["agentos_lsm_file_open-", "agentos_lsm_unix_stream_connect-"] {
        assert!(
            before.iter().any(|(n, _)| n.starts_with(p)),
            "{p}: {before:?}"
        );
    }
    let old = before.iter().map(|l| l.1).max().expect("fs link pins");
    let name = "vmt-pinkeep";
    let c = write_contract(
        name,
        &vm_tests::contract_yaml(name, "/bin/sleep", &["600"], "pids: 16"),
    );
    let agent = Agent::start(name, &c);
    agent.wait_state("running", Duration::from_secs(60));
    systemctl(&["kill", "--kill-whom=main", "-s", "KILL", "agentosd"]).ok();
    let after = wait_for(
        "agentosd restarted with new fs pins",
        Duration::from_secs(240),
        || {
            let now = fs_links();
            let active = systemctl(&["is-active", "agentosd"]).stdout.trim() == "active";
            (active && !now.is_empty() && now.iter().all(|l| l.1 > old)).then_some(now)
        },
    );
    assert_eq!(after.len(), before.len(), "{before:?} -> {after:?}");
    agent.wait_state("running", Duration::from_secs(60));
    let journal = cmd("journalctl", &["-u", "agentosd", "--no-pager", "-n", "300"]);
    assert!(
        journal
            .stdout
            .contains("took over the filesystem programs pinned in /sys/fs/bpf/agentos/fs-"),
        "{journal}"
    );
}
