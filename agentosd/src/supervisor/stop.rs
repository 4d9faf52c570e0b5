//! Stop (SIGTERM, the stop timeout, then `cgroup.kill`), restart, remove, and the teardown of a
//! run's cgroup.

use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;

use tracing::warn;

use super::{Agent, Error, Event, State, Supervisor, lock};
use crate::cgroup;
use crate::sys;

impl Supervisor {
    /// `cgroup.kill` and wait until the cgroup is empty (bounded).
    pub(super) async fn kill_and_wait(&self, agent: &Agent) {
        if agent.cgroup.populated() {
            if let Err(e) = agent.cgroup.kill() {
                warn!(agent = %agent.id, "{e}");
            }
            if let Err(e) = agent
                .cgroup
                .wait_events(
                    "processes to die after cgroup.kill",
                    Duration::from_secs(10),
                    |e| !e.populated,
                )
                .await
            {
                warn!(agent = %agent.id, "{e}");
            }
        }
    }

    /// Remove the agent's cgroup tree (`main`, `tools/*`, then the agent's), bottom-up. A tool
    /// call that raced with the stop may have made a tool cgroup and a process in it after
    /// `cgroup.kill`: kill the subtree again and retry, a few times.
    pub(super) async fn remove_cgroup(&self, agent: &Agent) -> Result<(), cgroup::CgroupError> {
        let mut last = Ok(());
        for _ in 0..3 {
            last = agent.cgroup.remove();
            if last.is_ok() {
                return Ok(());
            }
            self.kill_and_wait(agent).await;
        }
        last
    }

    /// Stop: thaw if frozen, SIGTERM the main process, wait for the agent's own processes up to
    /// the stop timeout, then `cgroup.kill` on the agent's whole subtree (its tools and MCP
    /// servers too), remove the cgroup tree. Idempotent.
    pub async fn stop(self: &Arc<Self>, agent: &Arc<Agent>) -> Result<(), Error> {
        let _op = agent.op.lock().await;
        self.stop_locked(agent, State::Inactive, "stopped").await
    }

    pub(super) async fn stop_locked(
        &self,
        agent: &Arc<Agent>,
        final_state: State,
        result: &str,
    ) -> Result<(), Error> {
        let (was_frozen, pidfd) = {
            let mut i = lock(&agent.inner);
            i.generation += 1;
            let was = i.state;
            if !was.is_active() && !agent.cgroup.populated() {
                // Nothing runs; still clear a stale cgroup.
                drop(i);
                let _ = agent.cgroup.remove();
                return Ok(());
            }
            i.state = State::Stopping;
            (
                matches!(was, State::Frozen | State::Freezing),
                i.pidfd.clone(),
            )
        };
        agent.wake.notify_waiters();
        // Persisted before the first signal: a daemon killed during the stop finishes it when it
        // comes back (re-adoption of a `stopping` agent), and a main process that exited
        // meanwhile is not taken for a failure to restart.
        self.changed(agent);
        if was_frozen || agent.cgroup.events().map(|e| e.frozen).unwrap_or(false) {
            let _ = agent.cgroup.set_freeze(false);
        }
        if let Some(fd) = &pidfd {
            let _ = sys::pidfd_send_signal(fd.as_fd(), libc::SIGTERM);
        }
        // The agent's own processes (its `main` leaf; the whole cgroup for an agent that is
        // not in the leaf layout) get the stop timeout; its tools and MCP servers, which got no
        // SIGTERM, go with `cgroup.kill` on the whole subtree right after.
        let own = if agent.main_cgroup().exists() {
            agent.main_cgroup()
        } else {
            agent.cgroup.clone()
        };
        let graceful = own
            .wait_events(
                "processes to exit after SIGTERM",
                self.cfg.stop_timeout,
                |e| !e.populated,
            )
            .await;
        if graceful.is_ok() {
            self.kill_and_wait(agent).await;
        } else {
            self.note(
                agent,
                &format!(
                    "stop timeout ({:?}) reached, killing the cgroup",
                    self.cfg.stop_timeout
                ),
                false,
            );
            self.kill_and_wait(agent).await;
        }
        if agent.cgroup.populated() {
            let msg = format!(
                "agent {}: processes remain in {} after cgroup.kill",
                agent.id,
                agent.cgroup.path().display()
            );
            lock(&agent.inner).result = msg.clone();
            self.changed(agent);
            return Err(Error::Kernel(msg));
        }
        // Give the watcher a moment to reap and record the exit status.
        for _ in 0..50 {
            if lock(&agent.inner).pidfd.is_none() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let rm = self.teardown(agent).await;
        {
            let mut i = lock(&agent.inner);
            i.state = final_state;
            i.result = result.to_string();
            i.main_pid = None;
            i.main_start_time = None;
            i.pidfd = None;
        }
        self.note(agent, &format!("{} {}", result, agent.id), true);
        self.audit_event(
            agent,
            "stopped",
            None,
            serde_json::json!({"result": result, "graceful": graceful.is_ok()}),
        );
        self.changed(agent);
        rm.map_err(Error::from)
    }

    /// Stop, then start with the current contract; resets the restart counter.
    pub async fn restart(self: &Arc<Self>, agent: &Arc<Agent>) -> Result<(), Error> {
        let _op = agent.op.lock().await;
        self.stop_locked(agent, State::Inactive, "stopped for restart")
            .await?;
        lock(&agent.inner).restarts = 0;
        self.launch(agent).await
    }

    /// Stop and forget an agent: its object, state record (the log file stays).
    pub async fn remove(self: &Arc<Self>, agent: &Arc<Agent>) -> Result<(), Error> {
        let _op = agent.op.lock().await;
        self.stop_locked(agent, State::Inactive, "removed").await?;
        lock(&self.agents).remove(&agent.id);
        crate::sandbox::ruleset_pool::forget(&agent.id);
        let _g = lock(&agent.persist_lock);
        lock(&agent.inner).removed = true;
        if let Err(e) = self.store.delete(&agent.tenant, &agent.name) {
            warn!(agent = %agent.id, "{e}");
        }
        self.audit_event(agent, "removed", None, serde_json::json!({}));
        self.emit(Event::Removed {
            id: agent.id.clone(),
            object_path: agent.object_path.clone(),
        });
        Ok(())
    }

    /// Like `systemctl reset-failed`: a failed agent becomes inactive with no result, and the
    /// restart count behind `start-limit-hit` starts again, for any agent that is not running.
    /// `Ok(false)`: it was running, nothing to reset.
    pub async fn reset_failed(self: &Arc<Self>, agent: &Arc<Agent>) -> Result<bool, Error> {
        let _op = agent.op.lock().await;
        let was = {
            let mut i = lock(&agent.inner);
            if i.state.is_active() {
                return Ok(false);
            }
            let was = i.state;
            if was == State::Failed {
                i.state = State::Inactive;
                i.result.clear();
            }
            i.restarts = 0;
            was
        };
        self.audit_event(
            agent,
            "reset-failed",
            None,
            serde_json::json!({"was": was.as_str()}),
        );
        self.changed(agent);
        Ok(true)
    }

    /// Stop every agent (daemon shutdown with --stop-agents-on-exit).
    pub async fn stop_all(self: &Arc<Self>) {
        for a in self.agents() {
            if a.state().is_active() {
                let _ = self.stop(&a).await;
            }
        }
    }
}
