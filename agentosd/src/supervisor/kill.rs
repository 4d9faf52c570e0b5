//! Signals to an agent's main process or to every process of its subtree.

use std::os::fd::AsFd;
use std::sync::Arc;

use super::{Agent, Error, Supervisor, lifecycle, lock};
use crate::sys;

impl Supervisor {
    /// Send `signal` to the main process (`whom` = "main") or every process ("all", default).
    /// The exit that may follow is handled by the restart policy.
    pub async fn kill(&self, agent: &Arc<Agent>, whom: &str, signal: i32) -> Result<(), Error> {
        let (state, pidfd) = {
            let i = lock(&agent.inner);
            (i.state, i.pidfd.clone())
        };
        if !lifecycle::may_signal(state) {
            return Err(Error::InvalidState(format!(
                "agent {} is {}: no processes to signal",
                agent.id,
                state.as_str()
            )));
        }
        match whom {
            "main" => {
                let fd = pidfd.ok_or_else(|| {
                    Error::InvalidState(format!("agent {} has no main process", agent.id))
                })?;
                sys::pidfd_send_signal(fd.as_fd(), signal)?;
            }
            "all" | "" => {
                if signal == libc::SIGKILL {
                    agent.cgroup.kill()?;
                } else {
                    // The agent's processes and its tools' (its whole subtree).
                    for pid in agent.cgroup.subtree_procs() {
                        // Processes come from our own cgroup; a PID that exited since the read
                        // is skipped (ESRCH).
                        if let Ok(fd) = sys::pidfd_open(pid) {
                            let _ = sys::pidfd_send_signal(fd.as_fd(), signal);
                        }
                    }
                }
            }
            other => {
                return Err(Error::InvalidState(format!(
                    "whom must be \"main\" or \"all\", not {other:?}"
                )));
            }
        }
        self.audit_event(
            agent,
            "signal",
            None,
            serde_json::json!({"signal": signal, "whom": if whom.is_empty() { "all" } else { whom }}),
        );
        Ok(())
    }
}
