//! An agent cannot fill the audit/state file system through its own home: the daemon sets a
//! user quota on each agent's uid (`compute.disk`, `compute.disk_inodes`, storage/quota.rs).
//!
//! `quota_bounds_what_an_agent_writes_as_itself` (the VM; the host kernel cannot mount ext4
//! with quotas): the daemon's state directory is a 64 MiB loop-mounted ext4 made with
//! `mkfs.ext4 -O quota` and mounted `usrquota`. An agent with `disk: 8MiB, disk_inodes: 200`
//! creates files in its `tmp/` until EDQUOT (about 200), then writes its home until EDQUOT
//! (about 8 MiB); meanwhile another agent's tool calls keep working and the daemon never goes
//! storage low; `agentctl status` shows the usage and the limits. The quota, cleared behind the
//! daemon's back, is set again when a restarted daemon re-adopts the agent. An agent whose
//! quota is larger than the file system fills it: storage low, and its tool calls are refused
//! first because its uid owns the most (the offender rule reads `Q_GETQUOTA`), while the other
//! agent's calls still work.
//!
//! `a_tools_scratch_counts_against_its_callers_quota` (the VM): a tool runs as its caller's uid,
//! so its scratch files count against the caller's quota (EDQUOT near 8 MiB, twice: the
//! scratch removed after a call gives the room back).
//!
//! `an_agents_output_counts_against_its_quota` (the VM): its stdout file is its uid's, so writing
//! it as fast as the disk goes stops with EDQUOT instead of filling the file system.
//!
//! `must_disk_budget_is_refused_without_quotas` (host and VM): on a tmpfs without quotas an agent
//! with `compute.disk` and `compute.must` is refused with what to do; without `must` it starts
//! and its status says the budget is not enforced.
#![allow(clippy::unwrap_used)]

mod common;

use std::os::fd::AsFd as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::caller::{answers, caller_contract, wait_answer};
use common::{Bus, Daemon, TestCgroup, Tmpfs, contract};

const MIB: u64 = 1 << 20;
const EDQUOT: i64 = 122;

/// Creates empty files in $TMPDIR until an error, removes them, then writes $HOME/fill until an
/// error; prints one JSON line with the errnos, the count and the bytes; then sleeps.
const HOG_PY: &str = r#"
import json, os, time
home, tmp = os.environ["HOME"], os.environ["TMPDIR"]
out = {"files": 0, "written": 0}
try:
    while out["files"] < 1000000:
        open(os.path.join(tmp, "f%d" % out["files"]), "wb").close()
        out["files"] += 1
except OSError as e:
    out["create_errno"] = e.errno
for i in range(out["files"]):
    os.unlink(os.path.join(tmp, "f%d" % i))
chunk = b"\xa5" * 65536
try:
    with open(os.path.join(home, "fill"), "wb", buffering=0) as f:
        while out["written"] < (1 << 30):
            out["written"] += f.write(chunk)
        os.fsync(f.fileno())
except OSError as e:
    out["write_errno"] = e.errno
if out.get("write_errno") == 28:
    # The disk is full (no quota): free it, or this line cannot be written either.
    os.unlink(os.path.join(home, "fill"))
print(json.dumps(out), flush=True)
while True:
    time.sleep(1)
"#;

/// Writes $HOME/fill until 4 MiB are left to unprivileged writers (below the daemon's 8 MiB
/// reserve; not to the last byte, which would also stop every agent's output: its log files are
/// written by the agents themselves), prints how much, then becomes the caller (CALLER_PY).
const FILL_THEN_CALL_PY: &str = r#"
import json, os, sys
home = os.environ["HOME"]
n = 0
chunk = b"\x5a" * 65536
def avail():
    s = os.statvfs(home)
    return s.f_bavail * s.f_frsize
with open(os.path.join(home, "fill"), "wb", buffering=0) as f:
    while avail() > (4 << 20):
        n += f.write(chunk)
    os.fsync(f.fileno())
print(json.dumps({"filled": n, "avail": avail()}), flush=True)
os.execv(sys.executable, [sys.executable, sys.argv[1], sys.argv[2], sys.argv[3]])
"#;

fn python_contract(dir: &Path, name: &str, script: &str, args: &str, extra: &str) -> PathBuf {
    let path = dir.join(format!("{name}.py"));
    std::fs::write(&path, script).unwrap();
    contract(
        dir,
        name,
        &format!(
            r#"{{ command: /usr/bin/python3, args: ["{}"{args}], env: {{ PYTHONDONTWRITEBYTECODE: "1" }} }}"#,
            path.display()
        ),
        &format!(
            "capabilities:\n  - clock.now\n  - fs.read: [\"{dir}\"]\n  - fs.exec: [/usr, /bin, /lib]\n{extra}",
            dir = dir.display()
        ),
    )
}

/// `agentctl status --json` without an agent: the daemon's line.
fn daemon_status(d: &Daemon) -> serde_json::Value {
    serde_json::from_str(&d.ctl_ok(&["status", "--json"])).unwrap()
}

/// A bed: a private bus and cgroup, the daemon on `state` (already mounted by the caller) with
/// an 8 MiB reserve checked every 0.2 s and the clock tool; contracts and scripts in `base`.
fn daemon(state: &Path, base: &Path, cg: &TestCgroup, bus: &Bus, more: &[&str]) -> Daemon {
    std::fs::set_permissions(base, std::os::unix::fs::PermissionsExt::from_mode(0o711)).unwrap();
    let tools = base.join("tools.d");
    std::fs::create_dir_all(&tools).unwrap();
    // The examples' clock.now, from the checkout or (in the VM) where `cargo xtask install`
    // put it.
    let manifest = [
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/tools/clock-now.yaml"),
        PathBuf::from("/usr/local/share/agentos/examples/tools/clock-now.yaml"),
    ]
    .into_iter()
    .find(|p| p.is_file())
    .expect("examples/tools/clock-now.yaml");
    std::fs::copy(manifest, tools.join("clock-now.yaml")).unwrap();
    let agents_dir = base.join("agents.d");
    std::fs::create_dir_all(&agents_dir).unwrap();
    let mut d = Daemon {
        child: None,
        state_dir: state.to_path_buf(),
        agents_dir,
        cgroup_root: cg.path.clone(),
        bus: bus.address.clone(),
        log: base.join("agentosd.log"),
        extra: [
            "--storage-reserve",
            "8388608",
            "--storage-reserve-percent",
            "0",
            "--storage-check-interval",
            "0.2",
            "--no-audit-journal",
            "--tools-dir",
            tools.to_str().unwrap(),
        ]
        .iter()
        .chain(more)
        .map(|s| s.to_string())
        .collect(),
    };
    d.spawn();
    d
}

#[test]
fn must_disk_budget_is_refused_without_quotas() {
    skip_unless_capable!();
    let base = tempfile::tempdir().unwrap();
    // A tmpfs mounted without `usrquota`: no user quotas, on any kernel.
    let fs = Tmpfs::mount(&base.path().join("state"), "tmpfs", "64m", "0755").unwrap();
    let (cg, bus) = (TestCgroup::new("quota-must"), Bus::start());
    let d = daemon(&fs.0, base.path(), &cg, &bus, &[]);
    let sleep = r#"[/bin/sleep, "600"]"#;
    let strict = contract(
        base.path(),
        "strict",
        sleep,
        "compute: { disk: 8MiB, must: true }\n",
    );
    let o = d.ctl(&["start", strict.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_ne!(o.status.code(), Some(0), "{err}");
    for want in [
        "compute.must",
        "user quota",
        "no quota support",
        "usrquota",
        "tmpfs",
    ] {
        assert!(err.contains(want), "the refusal names {want:?}: {err}");
    }
    // Without must: started, and the budget is reported as not enforced.
    let loose = contract(base.path(), "loose", sleep, "compute: { disk: 8MiB }\n");
    d.ctl_ok(&["start", loose.to_str().unwrap()]);
    let st = d.wait_state("loose", "running", 20);
    let unenforced = st["unenforced_budgets"].to_string();
    assert!(
        unenforced.contains("disk 8.0 MiB") && unenforced.contains("not enforced"),
        "{st}"
    );
    assert!(
        st["disk"].is_null(),
        "no usage where nothing counts it: {st}"
    );
    // Started agents with no disk budget get the default, reported as a note.
    let plain = contract(base.path(), "plain", sleep, "");
    d.ctl_ok(&["start", plain.to_str().unwrap()]);
    let st = d.wait_state("plain", "running", 20);
    assert!(
        st["notes"].to_string().contains("default disk quota"),
        "{st}"
    );
    d.ctl_ok(&["stop", "loose"]);
    d.ctl_ok(&["stop", "plain"]);
}

/// `mkfs.ext4 -O quota` on a 64 MiB image, mounted `loop,usrquota` on `dir`; `Err` with the
/// kernel's reason when this kernel cannot.
fn quota_ext4(img: &Path, dir: &Path) -> Result<Tmpfs, String> {
    std::fs::create_dir_all(dir).unwrap();
    let f = std::fs::File::create(img).unwrap();
    f.set_len(64 * MIB).unwrap();
    let run = |c: &mut Command| -> Result<(), String> {
        let o = c.output().map_err(|e| format!("{c:?}: {e}"))?;
        if o.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{c:?}: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ))
        }
    };
    run(Command::new("mkfs.ext4")
        .args(["-q", "-F", "-O", "quota", "-E", "quotatype=usrquota"])
        .arg(img))?;
    run(Command::new("mount")
        .args(["-o", "loop,usrquota"])
        .arg(img)
        .arg(dir))
    .map_err(|e| {
        let kmsg = Command::new("dmesg")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        let why = kmsg
            .lines()
            .rev()
            .find(|l| l.contains("QUOTA"))
            .unwrap_or("")
            .trim()
            .to_string();
        format!("{e} {why}")
    })?;
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    Ok(Tmpfs(dir.to_path_buf()))
}

/// Wait for `n` more answers of `agent` than `from` (a count of its answers), all of them ok.
fn more_ok(d: &Daemon, agent: &str, from: usize, n: usize) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while answers(d, agent).len() < from + n {
        assert!(
            std::time::Instant::now() < deadline,
            "agent {agent}: not {n} more answers in 60 s: {:?}",
            answers(d, agent).last()
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let all = answers(d, agent);
    assert!(
        all[from..].iter().all(|a| a["ok"] == true),
        "the other agent's tool calls work: {:?}",
        &all[from..]
    );
}

/// [`quota_ext4`] on `base/state`, or `None` after saying why this host skips (never in the VM,
/// whose kernel has ext4 quotas).
fn quota_ext4_or_skip(base: &Path, test: &str) -> Option<Tmpfs> {
    match quota_ext4(&base.join("state.img"), &base.join("state")) {
        Ok(m) => Some(m),
        Err(why) => {
            assert!(
                std::env::var("AGENTOS_VM_TEST").as_deref() != Ok("1"),
                "the VM's kernel has ext4 quotas: {why}"
            );
            common::skip_by_design(
                test,
                &format!(
                    "this kernel cannot mount ext4 with user quotas (CONFIG_QUOTA and CONFIG_QFMT_V2 are needed): {why}; `cargo xtask vm test quota` runs this"
                ),
            );
            None
        }
    }
}

fn wait_json_line(d: &Daemon, agent: &str, key: &str, secs: u64) -> serde_json::Value {
    wait_answer(d, agent, secs, &format!("with {key}"), |a| {
        a.get(key).is_some()
    })
}

/// The control: the same agent under a daemon whose quota setting is off
/// (`--agent-disk-default off`, `--agent-disk-inodes-default off`, no `compute.disk`) is not
/// stopped by EDQUOT but fills the file system's inodes and blocks (ENOSPC): the bound in
/// `quota_bounds_what_an_agent_writes_as_itself` is the quota's.
#[test]
fn without_the_quota_the_same_agent_fills_the_file_system() {
    skip_unless_capable!();
    let base = tempfile::tempdir().unwrap();
    let state = base.path().join("state");
    let Some(fs) = quota_ext4_or_skip(base.path(), module_path!()) else {
        return;
    };
    let (cg, bus) = (TestCgroup::new("noquota"), Bus::start());
    let off = [
        "--agent-disk-default",
        "off",
        "--agent-disk-inodes-default",
        "off",
    ];
    let d = daemon(&state, base.path(), &cg, &bus, &off);
    let hog = python_contract(base.path(), "hog", HOG_PY, "", "");
    d.ctl_ok(&["start", hog.to_str().unwrap()]);
    let r = wait_json_line(&d, "hog", "files", 300);
    assert_eq!(r["create_errno"], 28, "ENOSPC: {r}");
    assert!(r["files"].as_u64().unwrap() > 1000, "{r}");
    assert_eq!(r["write_errno"], 28, "ENOSPC: {r}");
    assert!(r["written"].as_u64().unwrap() > 30 * MIB, "{r}");
    d.ctl_ok(&["stop", "hog"]);
    drop(d);
    drop(fs);
}

#[test]
fn quota_bounds_what_an_agent_writes_as_itself() {
    skip_unless_capable!();
    let base = tempfile::tempdir().unwrap();
    let state = base.path().join("state");
    let Some(fs) = quota_ext4_or_skip(base.path(), module_path!()) else {
        return;
    };
    let (cg, bus) = (TestCgroup::new("quota"), Bus::start());
    let mut d = daemon(&state, base.path(), &cg, &bus, &[]);
    let check = Command::new(common::agentosd_bin())
        .args(["check", "--state-dir"])
        .arg(&state)
        .output()
        .unwrap();
    let check = String::from_utf8_lossy(&check.stdout).into_owned();
    assert!(
        check.contains("disk quotas: ok") && check.contains("user quotas enforced"),
        "{check}"
    );

    let work = caller_contract(base.path(), "work", "clock.now", "0.2", "clock.now");
    d.ctl_ok(&["start", work.to_str().unwrap()]);
    wait_answer(&d, "work", 60, "with a result", |a| a["ok"] == true);
    let hog = python_contract(
        base.path(),
        "hog",
        HOG_PY,
        "",
        "compute: { disk: 8MiB, disk_inodes: 200, must: true }\n",
    );
    d.ctl_ok(&["start", hog.to_str().unwrap()]);
    let r = wait_json_line(&d, "hog", "files", 120);
    // The inode limit: its home, tmp/ and the files it made, all its uid's.
    assert_eq!(r["create_errno"], EDQUOT, "{r}");
    let files = r["files"].as_u64().unwrap();
    assert!((190..=198).contains(&files), "about 200 inodes: {r}");
    // The block limit: the file's data and its few metadata blocks.
    assert_eq!(r["write_errno"], EDQUOT, "{r}");
    let written = r["written"].as_u64().unwrap();
    assert!(
        (7 * MIB..=8 * MIB).contains(&written),
        "about 8 MiB written: {r}"
    );
    // The daemon and the other agent never noticed.
    assert_eq!(daemon_status(&d)["storage_state"], "normal");
    more_ok(&d, "work", answers(&d, "work").len(), 5);
    let st = d.status_json("hog");
    let disk = &st["disk"];
    assert_eq!(disk["bytes_max"], 8 * MIB, "{st}");
    assert_eq!(disk["inodes_max"], 200, "{st}");
    assert_eq!(disk["enforced"], true, "{st}");
    assert!(disk["bytes"].as_u64().unwrap() >= 7 * MIB, "{st}");
    let text = d.ctl_ok(&["status", "hog"]);
    assert!(
        text.contains("Disk: ") && text.contains("of 8.0M"),
        "{text}"
    );

    // Re-adoption sets the quota again: clear it behind the daemon's back, kill -9 the daemon,
    // start it again.
    let uid = std::fs::metadata(state.join("home/default/hog"))
        .unwrap()
        .uid();
    let dirfd = std::fs::File::open(&state).unwrap();
    agentosd::sys::quota::set_user_limits(dirfd.as_fd(), uid, 0, 0).unwrap();
    assert_eq!(
        agentosd::sys::quota::user_quota(dirfd.as_fd(), uid)
            .unwrap()
            .bytes_limit,
        0
    );
    d.kill9();
    d.spawn();
    d.wait_state("hog", "running", 60);
    let q = agentosd::sys::quota::user_quota(dirfd.as_fd(), uid).unwrap();
    assert_eq!((q.bytes_limit, q.inodes_limit), (8 * MIB, 200), "{q:?}");
    d.ctl_ok(&["stop", "hog"]);
    // The caller lost its connection with the killed daemon: start it again.
    d.ctl_ok(&["stop", "work"]);
    let n = answers(&d, "work").len();
    d.ctl_ok(&["start", work.to_str().unwrap()]);
    more_ok(&d, "work", n, 2);

    // A quota larger than the file system: the agent fills it, the daemon goes storage low and
    // refuses its calls first (its uid owns the most), the other agent's calls go on.
    let caller = base.path().join("caller.py");
    let bulk = python_contract(
        base.path(),
        "bulk",
        FILL_THEN_CALL_PY,
        &format!(r#", "{}", "clock.now", "0.2""#, caller.display()),
        "compute: { disk: 1GiB }\n",
    );
    d.ctl_ok(&["start", bulk.to_str().unwrap()]);
    let f = wait_json_line(&d, "bulk", "filled", 120);
    assert!(f["filled"].as_u64().unwrap() > 20 * MIB, "{f}");
    let refused = wait_answer(&d, "bulk", 30, "refused for storage", |a| {
        a["reason"] == "storage-low"
    });
    let msg = refused["msg"].as_str().unwrap();
    assert!(
        msg.contains("default/bulk owns") && msg.contains("user quota usage"),
        "{msg}"
    );
    assert_eq!(daemon_status(&d)["storage_state"], "low");
    more_ok(&d, "work", answers(&d, "work").len(), 5);
    d.ctl_ok(&["stop", "bulk"]);
    d.ctl_ok(&["stop", "work"]);
    drop(d);
    drop(fs);
}

/// An exec tool that writes its scratch directory ($TMPDIR) until an error and reports it.
const SCRATCH_TOOL: &str = r#"
apiVersion: agentos/v0.2
kind: Tool
name: scratch.fill
description: Writes its scratch directory until the file system says no.
risk: low
timeout_ms: 60000
exec:
  command: /usr/bin/python3
  args:
    - -c
    - |
      import json, os
      out = {"written": 0}
      try:
          with open(os.path.join(os.environ["TMPDIR"], "fill"), "wb", buffering=0) as f:
              while out["written"] < (1 << 30):
                  out["written"] += f.write(b"\x3c" * 65536)
              os.fsync(f.fileno())
      except OSError as e:
          out["errno"] = e.errno
      os.unlink(os.path.join(os.environ["TMPDIR"], "fill"))
      print(json.dumps(out))
input_schema: {type: object}
limits: { must: false, output: 4096 }
"#;

/// A tool runs as its caller's uid, so what it writes in its scratch directory counts against
/// the caller's quota: the tool of an 8 MiB agent stops with EDQUOT near 8 MiB (not ENOSPC at
/// the file system's ~50 MiB), and its scratch removed after the call returns the room (the
/// next call writes as much again).
#[test]
fn a_tools_scratch_counts_against_its_callers_quota() {
    skip_unless_capable!();
    let base = tempfile::tempdir().unwrap();
    let state = base.path().join("state");
    let Some(fs) = quota_ext4_or_skip(base.path(), module_path!()) else {
        return;
    };
    let (cg, bus) = (TestCgroup::new("qscratch"), Bus::start());
    std::fs::create_dir_all(base.path().join("tools.d")).unwrap();
    std::fs::write(base.path().join("tools.d/scratch-fill.yaml"), SCRATCH_TOOL).unwrap();
    let d = daemon(&state, base.path(), &cg, &bus, &[]);
    let filler = python_contract(
        base.path(),
        "filler",
        common::caller::CALLER_PY,
        r#", "scratch.fill", "1""#,
        "  - scratch.fill\ncompute: { disk: 8MiB, must: true }\n",
    );
    d.ctl_ok(&["start", filler.to_str().unwrap()]);
    let first = wait_answer(&d, "filler", 120, "a result", |a| a["ok"] == true);
    let second = wait_answer(&d, "filler", 120, "a second result", |a| {
        a["ok"] == true && a["i"].as_u64() > first["i"].as_u64()
    });
    for a in [&first, &second] {
        assert_eq!(
            a["sc"]["errno"], EDQUOT,
            "the caller's quota, not ENOSPC: {a}"
        );
        let w = a["sc"]["written"].as_u64().unwrap();
        assert!((6 * MIB..=8 * MIB).contains(&w), "about 8 MiB: {a}");
    }
    assert_eq!(daemon_status(&d)["storage_state"], "normal");
    d.ctl_ok(&["stop", "filler"]);
    drop(d);
    drop(fs);
}

/// Writes stdout as fast as it can (64 KiB lines, up to 256 MiB) until an error, waits for the
/// daemon to take in (and punch out) what it wrote, then prints one JSON line with the errno.
const CHATTY_PY: &str = r#"
import json, os, time
line = b"y" * 65535 + b"\n"
out = {"stdout_written": 0}
try:
    while out["stdout_written"] < (256 << 20):
        out["stdout_written"] += os.write(1, line)
except OSError as e:
    out["stdout_errno"] = e.errno
time.sleep(15)
for _ in range(100):
    try:
        os.write(1, (json.dumps(out) + "\n").encode())
        break
    except OSError:
        time.sleep(0.5)
while True:
    time.sleep(1)
"#;

/// The agent writes its stdout file itself: the file is its uid's, so what it writes there is
/// bounded by its quota (EDQUOT near 8 MiB) instead of filling the file system at the speed of
/// the disk while the daemon takes in 2 MiB/s; the daemon stays `normal`.
#[test]
fn an_agents_output_counts_against_its_quota() {
    skip_unless_capable!();
    let base = tempfile::tempdir().unwrap();
    let state = base.path().join("state");
    let Some(fs) = quota_ext4_or_skip(base.path(), module_path!()) else {
        return;
    };
    let (cg, bus) = (TestCgroup::new("qlog"), Bus::start());
    let d = daemon(&state, base.path(), &cg, &bus, &[]);
    let chatty = python_contract(
        base.path(),
        "chatty",
        CHATTY_PY,
        "",
        "compute: { disk: 8MiB, must: true }\n",
    );
    d.ctl_ok(&["start", chatty.to_str().unwrap()]);
    let r = wait_json_line(&d, "chatty", "stdout_written", 180);
    assert_eq!(
        r["stdout_errno"], EDQUOT,
        "its quota, not ENOSPC or nothing: {r}"
    );
    let w = r["stdout_written"].as_u64().unwrap();
    assert!(
        w < 64 * MIB,
        "bounded by the quota and the daemon's intake: {r}"
    );
    let log = d.status_json("chatty")["log_path"]
        .as_str()
        .unwrap()
        .to_string();
    let uid = std::fs::metadata(state.join("home/default/chatty"))
        .unwrap()
        .uid();
    assert_eq!(std::fs::metadata(&log).unwrap().uid(), uid, "{log}");
    assert_eq!(daemon_status(&d)["storage_state"], "normal");
    d.ctl_ok(&["stop", "chatty"]);
    drop(d);
    drop(fs);
}
