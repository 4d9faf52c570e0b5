//! The daemon's open-file limit (sys/rlimit.rs): raised to the hard limit at start, and given
//! back as it was to the processes it starts (an agent sees the soft limit the daemon was
//! started with, not the daemon's raised one). A file of its own: it changes this process's
//! limits.

use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use agentosd::spawn::{Command, SpawnError, spawn};
use agentosd::sys::rlimit;

#[test]
fn the_limit_is_raised_and_children_get_the_old_one() {
    let lim = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    let hard = lim.maximum.unwrap_or(u64::MAX);
    if hard <= 512 {
        eprintln!("SKIPPED: hard RLIMIT_NOFILE {hard} leaves no room to raise from 512");
        return;
    }
    rustix::process::setrlimit(
        rustix::process::Resource::Nofile,
        rustix::process::Rlimit {
            current: Some(512),
            maximum: lim.maximum,
        },
    )
    .expect("lower the soft limit to 512");

    let n = rlimit::raise_nofile().expect("raise the soft limit");
    let nr_open: u64 = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .expect("nr_open")
        .trim()
        .parse()
        .expect("a number");
    assert_eq!(n.soft, hard.min(nr_open), "{n:?}");
    assert_eq!(n.raised_from, Some(512), "{n:?}");
    let now = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    assert_eq!(now.current, Some(n.soft));
    let said = rlimit::describe(&n);
    assert!(
        said.contains("raised from 512") && said.contains(&format!("about {} agents", n.agents())),
        "{said}"
    );

    // A child started like an agent: its soft limit is 512 again, its hard limit untouched.
    let Some(dir) = agentosd::cgroup::open_own_cgroup2() else {
        eprintln!("SKIPPED (child part): no cgroup2 cgroup of its own to clone into");
        return;
    };
    let logs = tempfile::tempdir().expect("tempdir");
    let log = logs.path().join("log");
    let cmd = Command {
        program: "/bin/sh".into(),
        args: vec!["-c".into(), "echo $(ulimit -Sn) $(ulimit -Hn)".into()],
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        cwd: "/".into(),
        log_file: log.clone(),
        err_file: None,
        sandbox: None,
        sched: agentosd::sched::ChildSched::None,
        inherit_fd: None,
    };
    let child = match spawn(&cmd, &OwnedFd::from(dir)) {
        Ok(c) => c,
        Err(SpawnError::Syscall(e)) => {
            eprintln!("SKIPPED (child part): {e}");
            return;
        }
        Err(e) => panic!("spawn: {e}"),
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if agentosd::sys::pidfd_try_wait(child.pidfd.as_fd())
            .expect("waitid")
            .is_some()
        {
            break;
        }
        assert!(Instant::now() < deadline, "the child did not exit in 10 s");
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = std::fs::read_to_string(&log).expect("the child's output");
    let hard_text = if hard == u64::MAX {
        "unlimited".to_string()
    } else {
        hard.to_string()
    };
    assert_eq!(out.trim(), format!("512 {hard_text}"), "the child's limits");
}
