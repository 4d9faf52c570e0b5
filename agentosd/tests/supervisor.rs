//! The supervisor against the real kernel, without D-Bus or the contract parser: cgroup
//! placement, freeze/thaw, stop, restart policy, exec failures. Root only; skips otherwise.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use agentosd::spec::{AgentSpec, Budgets, ExecSpec, Restart, RestartPolicy};
use agentosd::supervisor::{Config, Error, State, Supervisor};

fn spec(name: &str, script: &str, restart: Restart) -> AgentSpec {
    AgentSpec {
        name: name.into(),
        tenant: "default".into(),
        latency_class: "DT".into(),
        exec: Some(ExecSpec {
            command: "/bin/sh".into(),
            args: vec!["-c".into(), script.into()],
            ..Default::default()
        }),
        restart,
        budgets: Budgets {
            cpu_millis: Some(500),
            memory_bytes: Some(256 << 20),
            memory_high_bytes: None,
            pids: Some(64),
            io: vec![],
            disk_bytes: None,
            disk_inodes: None,
            must: false,
        },
        sched: Default::default(),
    }
}

fn setup(tag: &str) -> (common::TestCgroup, tempfile::TempDir, Arc<Supervisor>) {
    let cg = common::TestCgroup::new(tag);
    let dir = tempfile::tempdir().unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move { while rx.recv().await.is_some() {} });
    let sup = Supervisor::new(
        Config {
            cgroup_root: cg.path.clone(),
            state_dir: dir.path().join("state"),
            log_dir: dir.path().join("logs"),
            agents_dir: dir.path().join("agents.d"),
            stop_timeout: Duration::from_secs(2),
            freeze_timeout: Duration::from_secs(5),
            denial_records: Default::default(),
            disk: Default::default(),
        },
        tx,
    )
    .unwrap();
    (cg, dir, sup)
}

async fn wait_for(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_start_freeze_thaw_stop() {
    skip_unless_capable!();
    let (cg, _dir, sup) = setup("life");
    let a = sup
        .start_spec(
            spec(
                "ticker",
                "while true; do echo tick; sleep 0.1; done",
                Restart::default(),
            ),
            String::new(),
            "test".into(),
            false,
        )
        .await
        .unwrap();
    assert_eq!(a.state(), State::Running);
    let pid = a.main_pid().unwrap();
    let agent_cg = cg.path.join("agents/default/ticker");
    // The agent's own processes live in its `main` leaf (budgets on `agent_cg` above it).
    let procs = std::fs::read_to_string(agent_cg.join("main/cgroup.procs")).unwrap();
    assert!(
        procs.lines().any(|l| l == pid.to_string()),
        "pid {pid} not in {procs}"
    );
    // the main process is in the right cgroup according to the kernel
    assert!(common::proc_cgroup(pid).ends_with("/agents/default/ticker/main"));
    // SCHED_IDLE for DT
    // SAFETY: sched_getscheduler only reads the policy of a PID.
    let policy = unsafe { libc::sched_getscheduler(pid as i32) };
    assert_eq!(policy, libc::SCHED_IDLE);
    // budgets: this host has no controllers on cgroup2 → reported, not enforced
    let st = sup.status_of(&a);
    let has_mem = std::fs::read_to_string(cg.path.join("agents/cgroup.subtree_control"))
        .unwrap()
        .contains("memory");
    if has_mem {
        let max =
            std::fs::read_to_string(cg.path.join("agents/default/ticker/memory.max")).unwrap();
        assert_eq!(max.trim(), (256u64 << 20).to_string(), "memory.max written");
    } else {
        assert!(
            st.unenforced_budgets
                .iter()
                .any(|u| u.contains("memory.max")),
            "{:?}",
            st.unenforced_budgets
        );
    }

    sup.freeze(&a).await.unwrap();
    assert_eq!(a.state(), State::Frozen);
    let ev = std::fs::read_to_string(agent_cg.join("cgroup.events")).unwrap();
    assert!(ev.contains("frozen 1"), "{ev}");
    sup.thaw(&a).await.unwrap();
    assert_eq!(a.state(), State::Running);
    let ev = std::fs::read_to_string(agent_cg.join("cgroup.events")).unwrap();
    assert!(ev.contains("frozen 0"), "{ev}");

    // logs reach the file
    wait_for("tick in log", 5, || {
        std::fs::read_to_string(&a.log_path)
            .unwrap_or_default()
            .contains("tick")
    })
    .await;

    sup.stop(&a).await.unwrap();
    assert_eq!(a.state(), State::Inactive);
    assert!(!common::alive(pid), "main process {pid} survived stop");
    assert!(!agent_cg.exists(), "agent cgroup not removed");
    assert_eq!(a.main_pid(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_kills_processes_that_ignore_sigterm() {
    skip_unless_capable!();
    let (cg, _dir, sup) = setup("stubborn");
    let a = sup
        .start_spec(
            spec(
                "stubborn",
                "trap '' TERM; sleep 1000 & while true; do sleep 0.1; done",
                Restart::default(),
            ),
            String::new(),
            "test".into(),
            false,
        )
        .await
        .unwrap();
    let agent_cg = cg.path.join("agents/default/stubborn");
    wait_for("two processes", 5, || {
        std::fs::read_to_string(agent_cg.join("main/cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .count()
            >= 2
    })
    .await;
    let pids: Vec<u32> = std::fs::read_to_string(agent_cg.join("main/cgroup.procs"))
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    let t = Instant::now();
    sup.stop(&a).await.unwrap();
    assert!(
        t.elapsed() >= Duration::from_secs(2),
        "stop should wait out the timeout"
    );
    for p in pids {
        assert!(!common::alive(p), "process {p} survived stop");
    }
    assert!(!agent_cg.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashing_agent_restarts_then_gives_up() {
    skip_unless_capable!();
    let (_cg, _dir, sup) = setup("crash");
    let a = sup
        .start_spec(
            spec(
                "crasher",
                "echo start; sleep 0.1; exit 3",
                Restart {
                    policy: RestartPolicy::OnFailure,
                    limit: 3,
                    backoff_ms: 50,
                    max_backoff_ms: 200,
                },
            ),
            String::new(),
            "test".into(),
            false,
        )
        .await
        .unwrap();
    wait_for("failed", 10, || a.state() == State::Failed).await;
    assert_eq!(a.restarts(), 3);
    let st = sup.status_of(&a);
    assert!(st.result.contains("start-limit-hit"), "{}", st.result);
    assert_eq!(st.exit_status, "code=exited, status=3");
    let log = std::fs::read_to_string(&a.log_path).unwrap();
    assert_eq!(log.matches("start\n").count(), 4, "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_failure_reaches_the_caller() {
    skip_unless_capable!();
    let (cg, _dir, sup) = setup("noexec");
    let mut s = spec("ghost", "", Restart::default());
    s.exec = Some(ExecSpec {
        command: "/nonexistent/agent".into(),
        ..Default::default()
    });
    let err = sup
        .start_spec(s, String::new(), "test".into(), false)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::ExecFailed(_)), "{err:?}");
    assert!(err.to_string().contains("No such file"), "{err}");
    let a = sup.find("ghost").unwrap();
    assert_eq!(a.state(), State::Failed);
    assert!(!cg.path.join("agents/default/ghost").exists());

    let mut s = spec("nocmd", "", Restart::default());
    s.exec = Some(ExecSpec {
        command: "no-such-command-xyz".into(),
        ..Default::default()
    });
    let err = sup
        .start_spec(s, String::new(), "test".into(), false)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("not found in PATH"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn must_budgets_refused_without_controllers() {
    skip_unless_capable!();
    let (cg, _dir, sup) = setup("must");
    if std::fs::read_to_string(cg.path.join("agents/cgroup.subtree_control"))
        .unwrap()
        .contains("memory")
    {
        common::skip_by_design(
            "must_budgets_refused_without_controllers",
            "this host has the memory controller (the test needs a host without it)",
        );
        return;
    }
    let mut s = spec("strict", "sleep 100", Restart::default());
    s.budgets.must = true;
    let err = sup
        .start_spec(s, String::new(), "test".into(), false)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Unenforceable(_)), "{err:?}");
    assert!(err.to_string().contains("memory controller"), "{err}");
}

/// Regression: a restart after leftovers were killed with cgroup.kill must work (the kernel
/// SIGKILLs children clone3'd into a cgroup that once saw cgroup.kill; we use a fresh cgroup).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_after_leftovers_were_killed() {
    skip_unless_capable!();
    let (_cg, _dir, sup) = setup("leftover");
    // The sandboxed agent may write only its own state directory ($STATE_DIRECTORY).
    let script = "m=$STATE_DIRECTORY/runs; echo run >> $m; sleep 1000 & if [ $(wc -l < $m) -lt 2 ]; then exit 4; fi; while true; do sleep 0.1; done";
    let a = sup
        .start_spec(
            spec(
                "leftover",
                script,
                Restart {
                    policy: RestartPolicy::OnFailure,
                    limit: 3,
                    backoff_ms: 50,
                    max_backoff_ms: 200,
                },
            ),
            String::new(),
            "test".into(),
            false,
        )
        .await
        .unwrap();
    wait_for("second run", 5, || {
        a.restarts() == 1 && a.state() == State::Running
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(a.state(), State::Running, "{:?}", sup.status_of(&a));
    assert_eq!(a.restarts(), 1);
    sup.stop(&a).await.unwrap();
}
