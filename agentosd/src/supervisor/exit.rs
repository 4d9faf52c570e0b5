//! The exit watcher: one task per run waits on the main process's pidfd, then applies the
//! restart policy (with backoff); and the HRT overrun sampler of a run.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tracing::{info, warn};

use super::{Agent, State, Supervisor, lifecycle, lock};
use crate::sys::{self, ExitStatus};

impl Supervisor {
    /// Sample the HRT agent's threads for deadline overruns while this run lasts.
    pub(super) fn monitor_overruns(&self, agent: Arc<Agent>, generation: u64, pid: u32) {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(crate::sched::MONITOR_INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                tick.tick().await;
                if lock(&agent.inner).generation != generation || !agent.overruns.sample(pid) {
                    return;
                }
            }
        });
    }

    /// Wait for the main process (`pidfd`) to exit, then apply the restart policy.
    pub(super) fn watch(self: &Arc<Self>, agent: Arc<Agent>, generation: u64, pidfd: Arc<OwnedFd>) {
        let sup = self.clone();
        tokio::spawn(async move {
            let status = wait_exit(&pidfd).await;
            // What follows the exit (teardown, a restart: a whole launch) is boxed, so the task
            // every running agent keeps while it waits is only the wait's size.
            Box::pin(sup.on_main_exit(agent, generation, pidfd, status)).await;
        });
    }

    async fn on_main_exit(
        self: Arc<Self>,
        agent: Arc<Agent>,
        generation: u64,
        pidfd: Arc<OwnedFd>,
        status: ExitStatus,
    ) {
        let pid = {
            let mut i = lock(&agent.inner);
            let pid = i.main_pid;
            if i.pidfd.as_ref().is_some_and(|p| Arc::ptr_eq(p, &pidfd)) {
                i.exit_status = Some(status);
                i.main_pid = None;
                i.main_start_time = None;
                i.pidfd = None;
            }
            pid
        };
        drop(pidfd);
        self.note(
            &agent,
            &format!(
                "main process PID {} exited, {}",
                pid.unwrap_or(0),
                status.describe()
            ),
            true,
        );
        let op = agent.op.lock().await;
        let outcome = {
            // Each run has a fresh cgroup, so any OOM kill counted there is this run's.
            let oom = agent.cgroup.oom_kills() > 0;
            let mut i = lock(&agent.inner);
            if i.generation != generation {
                // An operator action (stop, restart, kill…) owns what happens next.
                drop(i);
                self.persist(&agent);
                return;
            }
            let outcome = lifecycle::on_exit(&i.spec.restart, i.restarts, status, oom);
            i.state = outcome.state;
            i.result = outcome.result.clone();
            outcome
        };
        // The main process is gone: nothing else of this run may stay.
        let _ = self.teardown(&agent).await;
        self.audit_exit(&agent, pid, &status);
        let Some(delay) = outcome.restart_after else {
            info!(agent = %agent.id, state = agent.state().as_str(), "main process exited");
            self.changed(&agent);
            return;
        };
        self.changed(&agent);
        drop(op);
        self.restart_after(agent, generation, delay, outcome.restart_no)
            .await;
    }

    /// The restart policy's restart: after the backoff (or a wake-up by `start`), unless an
    /// operator action came first.
    async fn restart_after(
        self: Arc<Self>,
        agent: Arc<Agent>,
        generation: u64,
        delay: Duration,
        restart_no: u32,
    ) {
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = agent.wake.notified() => {}
        }
        let _op = agent.op.lock().await;
        {
            let mut i = lock(&agent.inner);
            if i.generation != generation || i.state != State::Restarting {
                return;
            }
            i.restarts = restart_no;
        }
        self.note(
            &agent,
            &format!("restart {restart_no} of {}", agent.id),
            false,
        );
        self.audit_event(
            &agent,
            "restarted",
            None,
            serde_json::json!({"restart": restart_no, "by": "restart policy"}),
        );
        // launch() starts a new watcher; this one ends.
        let _ = self.launch(&agent).await;
    }
}

/// Wait until the pidfd is readable (the process exited), then reap it when it is our child.
pub(super) async fn wait_exit(pidfd: &Arc<OwnedFd>) -> ExitStatus {
    // SAFETY: the fd is owned by the Arc<OwnedFd> moved into the AsyncFd, so it stays open and
    // refers to the same pidfd for the AsyncFd's whole lifetime.
    let registered =
        unsafe { AsyncFd::register_with_interest(pidfd.clone(), tokio::io::Interest::READABLE) };
    match registered {
        Ok(afd) => loop {
            match afd.readable().await {
                Ok(mut guard) => match sys::pidfd_try_wait(pidfd.as_fd()) {
                    Ok(Some(s)) => return s,
                    Ok(None) => {
                        // Readable but not yet reapable: poll again shortly.
                        guard.clear_ready();
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    Err(e) => {
                        warn!("{e}");
                        return ExitStatus::Unknown;
                    }
                },
                Err(e) => {
                    warn!("pidfd poll: {e}");
                    return ExitStatus::Unknown;
                }
            }
        },
        Err(e) => {
            warn!("pidfd registration failed ({e}); polling");
            loop {
                // Not our child: waitid says ECHILD at once; probe liveness with signal 0.
                if sys::pidfd_send_signal(pidfd.as_fd(), 0).is_err() {
                    return sys::pidfd_try_wait(pidfd.as_fd())
                        .ok()
                        .flatten()
                        .unwrap_or(ExitStatus::Unknown);
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}
