//! Landlock and seccomp denials of agents reach the audit trail: an agent under a real agentosd
//! reads a file outside its Landlock scope (EACCES) and calls `keyctl`, which its seccomp filter
//! denies (EPERM); the trail then holds one `denial` record for each, with the mechanism,
//! syscall, errno and path, attributed to the agent, and `agentctl status` counts them. An agent
//! that does only what it may produces none. Root only; the daemon reads the kernel's audit
//! netlink multicast group (enforce/kaudit/).
//!
//! Landlock logs only while kernel audit is enabled. When it is not, the test enables it for its
//! own duration and restores `audit_enabled` afterwards; before enabling it loads the rule
//! `-a task,never` (as Fedora's default audit rules do) so that no process on the host gets a
//! syscall audit context. That rule is left in place: the kernel never forgets that audit was
//! once enabled (`audit_ever_enabled`), and without the rule every process forked later would
//! pay for syscall auditing. seccomp's `actions_logged` is never changed: the test skips the
//! seccomp part when `errno` is not in it.

#![allow(clippy::unwrap_used)]

mod common;

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use agentosd::enforce::kaudit;
use common::{Bus, Daemon, TestCgroup, contract};

const AUDIT_SET: u16 = 1001;
const AUDIT_ADD_RULE: u16 = 1011;
const AUDIT_STATUS_ENABLED: u32 = 1;
const AUDIT_FILTER_TASK: u32 = 1;
const AUDIT_NEVER: u32 = 0;

/// Send one audit control request and return the kernel's answer (0 or -errno).
fn audit_request(ty: u16, payload: &[u8]) -> i32 {
    // SAFETY: socket(2) with constant arguments; checked before use.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_AUDIT,
        )
    };
    assert!(fd >= 0, "socket(NETLINK_AUDIT)");
    // SAFETY: a descriptor we just created and own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut msg = Vec::with_capacity(16 + payload.len());
    msg.extend(((16 + payload.len()) as u32).to_ne_bytes());
    msg.extend(ty.to_ne_bytes());
    msg.extend(((libc::NLM_F_REQUEST | libc::NLM_F_ACK) as u16).to_ne_bytes());
    msg.extend(1u32.to_ne_bytes());
    msg.extend(0u32.to_ne_bytes());
    msg.extend(payload);
    // SAFETY: send(2) from a live buffer of its length.
    let n = unsafe { libc::send(fd.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) };
    assert_eq!(n as usize, msg.len(), "send audit request");
    let mut buf = [0u8; 8192];
    // SAFETY: recv(2) into a live buffer of its length.
    let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    assert!(n >= 20, "no answer to audit request {ty}");
    for (t, p) in kaudit::messages(&buf[..n as usize]) {
        if t == 2 && p.len() >= 4 {
            return i32::from_ne_bytes([p[0], p[1], p[2], p[3]]);
        }
    }
    0
}

fn set_audit_enabled(v: u32) -> i32 {
    let mut st = [0u32; 10];
    st[0] = AUDIT_STATUS_ENABLED;
    st[1] = v;
    let bytes: Vec<u8> = st.iter().flat_map(|w| w.to_ne_bytes()).collect();
    audit_request(AUDIT_SET, &bytes)
}

/// `auditctl -a task,never`: no task gets a syscall audit context (EEXIST when loaded).
fn add_never_task_rule() -> i32 {
    let mut rule = vec![0u8; 4 * 3 + 4 * 64 * 4 + 4];
    rule[0..4].copy_from_slice(&AUDIT_FILTER_TASK.to_ne_bytes());
    rule[4..8].copy_from_slice(&AUDIT_NEVER.to_ne_bytes());
    audit_request(AUDIT_ADD_RULE, &rule)
}

/// Kernel audit enabled for the test's duration; restores `audit_enabled` on drop.
struct AuditEnabled {
    restore: Option<u32>,
}

impl AuditEnabled {
    fn ensure() -> Result<Self, String> {
        let st = kaudit::status().map_err(|e| e.to_string())?;
        if st.enabled != 0 {
            return Ok(AuditEnabled { restore: None });
        }
        let r = add_never_task_rule();
        if r != 0 && r != -libc::EEXIST {
            return Err(format!(
                "cannot add the audit rule task,never: errno {}",
                -r
            ));
        }
        let r = set_audit_enabled(1);
        if r != 0 {
            return Err(format!("cannot enable kernel audit: errno {}", -r));
        }
        eprintln!("kernel audit enabled for this test (audit_enabled was 0; restored at the end)");
        Ok(AuditEnabled {
            restore: Some(st.enabled),
        })
    }
}

impl Drop for AuditEnabled {
    fn drop(&mut self) {
        if let Some(v) = self.restore {
            let r = set_audit_enabled(v);
            eprintln!("kernel audit: audit_enabled restored to {v} (answer {r})");
        }
    }
}

fn denials_of(state_dir: &Path, agent: &str) -> Vec<serde_json::Value> {
    let o = Command::new(common::agentctl_bin())
        .args(["audit", "show", "--json", "--state-dir"])
        .arg(state_dir)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "agentctl audit show failed");
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|r| r["kind"] == "denial" && r["agent"] == agent)
        .collect()
}

/// The tests of this binary change `audit_enabled` for their duration: one at a time.
static AUDIT_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Whether Landlock can log and the daemon can read the log here (else the test is skipped with
/// the reason); kernel audit is then enabled until the returned guard drops.
fn landlock_audit(test: &str) -> Option<AuditEnabled> {
    match agentosd::sandbox::landlock::kernel_abi() {
        Some(v) if v >= 7 => {}
        other => {
            common::skip(
                test,
                &format!("Landlock ABI {other:?} has no audit logging (needs 7)"),
            );
            return None;
        }
    }
    if let Err(e) = kaudit::open_readlog() {
        common::skip(test, &e.to_string());
        return None;
    }
    match AuditEnabled::ensure() {
        Ok(g) => Some(g),
        Err(e) => {
            common::skip(test, &e.to_string());
            None
        }
    }
}

#[test]
fn landlock_and_seccomp_denials_of_an_agent_reach_the_audit_trail() {
    skip_unless_capable!();
    let _one = AUDIT_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    if !Path::new("/usr/bin/perl").exists() {
        common::skip(
            module_path!(),
            "/usr/bin/perl (the agent's way to call keyctl) is missing",
        );
        return;
    }
    let seccomp_logged = kaudit::seccomp_errno_logged().unwrap_or(false);
    if !seccomp_logged {
        common::skip(
            "kaudit seccomp part",
            "errno is not in /proc/sys/kernel/seccomp/actions_logged (not changed by tests)",
        );
    }
    let Some(_audit) = landlock_audit(module_path!()) else {
        return;
    };

    let bus = Bus::start();
    let cg = TestCgroup::new("kaudit");
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&bus, &cg.path, dir.path());
    let state = dir.path();

    // /etc/hostname is world-readable (so DAC lets it through) but outside every agent's
    // Landlock scope; keyctl is on the seccomp deny-list.
    let denier = contract(
        state,
        "denier",
        r#"{ command: /bin/sh, args: ["-c", "cat /etc/passwd >/dev/null && echo passwd-ok; cat /etc/hostname; /usr/bin/perl -e '$r = syscall(250, 0, 0, 0, 0, 0); print \"keyctl $r $!\\n\"; sleep 1'; echo done; cat /etc/hostname 2>/dev/null; echo marker; exec sleep 60"] }"#,
        "",
    );
    let quiet = contract(
        state,
        "quiet",
        r#"{ command: /bin/sh, args: ["-c", "cat /etc/passwd >/dev/null; ls /usr >/dev/null; echo $HOME > $HOME/x; /usr/bin/perl -e 'print getppid(), \"\\n\"'; echo quiet-done; cat /etc/hostname 2>/dev/null; exec sleep 60"] }"#,
        "",
    );
    d.ctl_ok(&["start", quiet.to_str().unwrap()]);
    d.ctl_ok(&["start", denier.to_str().unwrap()]);
    d.wait_state("denier", "running", 10);

    // Wait for the denial records. After its attempts the agent makes one more, known denial
    // (a marker: the second read of /etc/hostname); the kernel reports denials in order, so
    // once the marker's record is there, any record its earlier actions caused is there too
    // (no sleep standing in for "nothing else came").
    let deadline = Instant::now() + Duration::from_secs(15);
    let want = if seccomp_logged { 2 } else { 1 };
    let is_marker = |r: &serde_json::Value| {
        r["detail"]["mechanism"] == "landlock" && r["detail"]["path"] == "/etc/hostname"
    };
    let recs = loop {
        let mut recs = denials_of(state, "denier");
        let log = common::agent_output(Path::new(
            d.status_json("denier")["log_path"].as_str().unwrap(),
        ));
        if log.contains("marker") && recs.iter().filter(|r| is_marker(r)).count() >= 2 {
            let last = recs.pop().unwrap();
            assert!(is_marker(&last), "the marker is the last denial: {last:#}");
            break recs;
        }
        assert!(
            Instant::now() < deadline,
            "denial records missing after 15 s: {recs:#?}\nagent log:\n{log}\ndaemon log:\n{}",
            d.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    for r in &recs {
        eprintln!("{r}");
    }
    let log = common::agent_output(Path::new(
        d.status_json("denier")["log_path"].as_str().unwrap(),
    ));
    assert!(log.contains("passwd-ok"), "agent log:\n{log}");
    assert!(log.contains("Permission denied"), "agent log:\n{log}");
    assert!(
        log.contains("keyctl -1 Operation not permitted"),
        "agent log:\n{log}"
    );

    // Landlock: the read of /etc/hostname, EACCES, attributed to the agent through its domain.
    let ll: Vec<_> = recs
        .iter()
        .filter(|r| r["detail"]["mechanism"] == "landlock")
        .collect();
    assert_eq!(ll.len(), 1, "one Landlock denial expected: {recs:#?}");
    let l = &ll[0]["detail"];
    assert_eq!(l["syscall"], "open", "{l}");
    assert_eq!(l["errno"], "EACCES", "{l}");
    assert_eq!(l["errno_num"], libc::EACCES, "{l}");
    assert_eq!(l["path"], "/etc/hostname", "{l}");
    assert_eq!(l["blockers"], serde_json::json!(["fs.read_file"]), "{l}");
    let uid = l["uid"].as_u64().unwrap();
    assert!((61184..=65519).contains(&uid), "the agent's own uid: {l}");
    assert!(
        l["attribution"] == "cgroup" || l["attribution"] == "uid",
        "{l}"
    );
    assert_eq!(ll[0]["tenant"], "default");
    assert_eq!(ll[0]["decision"], "deny");
    let main_pid = d.status_json("denier")["main_pid"].as_u64().unwrap();
    assert_eq!(
        l["domain_pid"], main_pid,
        "the domain's creator is the agent's main process"
    );

    if seccomp_logged {
        let sc: Vec<_> = recs
            .iter()
            .filter(|r| r["detail"]["mechanism"] == "seccomp")
            .collect();
        assert_eq!(sc.len(), 1, "one seccomp denial expected: {recs:#?}");
        let s = &sc[0]["detail"];
        assert_eq!(s["syscall"], "keyctl", "{s}");
        assert_eq!(s["syscall_nr"], 250, "{s}");
        assert_eq!(s["errno"], "EPERM", "{s}");
        assert_eq!(s["errno_num"], libc::EPERM, "{s}");
        assert_eq!(s["comm"], "perl", "{s}");
        assert!(s["pid"].as_u64().unwrap() > 0, "{s}");
        assert!(
            s["attribution"] == "cgroup" || s["attribution"] == "uid",
            "{s}"
        );
    }
    assert_eq!(
        recs.len(),
        want,
        "only the denied actions are recorded: {recs:#?}"
    );

    // The agent that did only what it may has no denial records.
    let qlog_path = d.status_json("quiet")["log_path"]
        .as_str()
        .unwrap()
        .to_string();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(&qlog_path)
        .unwrap_or_default()
        .contains("quiet-done")
    {
        assert!(Instant::now() < deadline, "quiet agent did not finish");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Its one denial is the marker it makes after its allowed actions: wait for that.
    let q = loop {
        let q = denials_of(state, "quiet");
        if q.iter().any(is_marker) {
            break q;
        }
        assert!(
            Instant::now() < deadline,
            "the quiet agent's marker denial did not arrive: {q:#?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        q.len() == 1 && is_marker(&q[0]),
        "allowed actions produced denial records: {q:#?}"
    );

    // agentctl status counts them (each agent's marker included).
    let st = d.status_json("denier");
    assert_eq!(st["denials"].as_u64(), Some(want as u64 + 1), "{st}");
    assert_eq!(d.status_json("quiet")["denials"].as_u64(), Some(1));

    // The trail still verifies.
    let o = Command::new(common::agentctl_bin())
        .args(["audit", "verify", "--state-dir"])
        .arg(state)
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// CPU time (user + system) of process `pid` so far, from /proc/PID/stat.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let f: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..]
        .split_whitespace()
        .collect();
    // utime and stime are fields 14 and 15, the 12th and 13th after the command name.
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    Duration::from_millis(ticks * 1000 / hz)
}

/// An agent that opens a file outside its Landlock scope in a loop, without end, costs the
/// daemon's audit reader a bounded share of a CPU (the reader's budget; the rest overruns the
/// socket and is counted) and the daemon keeps answering.
#[test]
fn an_endless_landlock_denial_loop_costs_the_daemon_a_bounded_share() {
    skip_unless_capable!();
    let _one = AUDIT_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    if !Path::new("/usr/bin/perl").exists() {
        common::skip(
            module_path!(),
            "/usr/bin/perl (the looping agent) is missing",
        );
        return;
    }
    let Some(_audit) = landlock_audit(module_path!()) else {
        return;
    };
    let bus = Bus::start();
    let cg = TestCgroup::new("kauditflood");
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&bus, &cg.path, dir.path());
    let looper = contract(
        dir.path(),
        "looper",
        r#"{ command: /usr/bin/perl, args: ["-e", "$n = 0; while (1) { open(my $f, '<', '/etc/hostname') and die 'opened'; $n++ }"] }"#,
        "",
    );
    let mem = common::mem::MemWatch::start(d.pid(), "Landlock denial loop (kaudit)");
    d.ctl_ok(&["start", looper.to_str().unwrap()]);
    d.wait_state("looper", "running", 10);
    std::thread::sleep(Duration::from_secs(1));
    let (c0, t0) = (cpu_time(d.pid()), Instant::now());
    let mut calls = 0;
    while t0.elapsed() < Duration::from_secs(8) {
        let out = d.ctl(&["--timeout", "10", "status", "looper", "--json"]);
        assert!(
            out.status.success(),
            "status during the loop: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        calls += 1;
        std::thread::sleep(Duration::from_millis(200));
    }
    let share = (cpu_time(d.pid()) - c0).as_secs_f64() / t0.elapsed().as_secs_f64();
    let recorded = denials_of(dir.path(), "looper").len();
    eprintln!(
        "landlock loop: {calls} status calls answered, {recorded} denial records; daemon CPU {:.0} % of one core",
        share * 100.0
    );
    assert!(recorded > 0, "the loop's denials are recorded");
    assert!(
        share < 0.6,
        "the daemon used {:.0} % of a CPU on one agent's Landlock denials",
        share * 100.0
    );
    d.ctl_ok(&["stop", "looper"]);
    mem.finish(Duration::from_secs(2), 64);
}
