//! Freeze and thaw through `cgroup.freeze`, confirmed by `cgroup.events`.

use std::sync::Arc;

use super::{Agent, Error, Event, State, Supervisor, lifecycle, lock};

impl Supervisor {
    /// Freeze the agent's cgroup and wait for `cgroup.events` to say `frozen 1`.
    pub async fn freeze(self: &Arc<Self>, agent: &Arc<Agent>) -> Result<(), Error> {
        self.set_frozen(agent, true).await
    }

    pub async fn thaw(self: &Arc<Self>, agent: &Arc<Agent>) -> Result<(), Error> {
        self.set_frozen(agent, false).await
    }

    pub(super) async fn set_frozen(
        self: &Arc<Self>,
        agent: &Arc<Agent>,
        frozen: bool,
    ) -> Result<(), Error> {
        let _op = agent.op.lock().await;
        {
            let mut i = lock(&agent.inner);
            match lifecycle::freeze_transition(i.state, frozen) {
                Ok(None) => return Ok(()),
                Ok(Some(via)) => i.state = via,
                Err(ok_from) => {
                    return Err(Error::InvalidState(format!(
                        "agent {} is {}; only a {} agent can be {}",
                        agent.id,
                        i.state.as_str(),
                        ok_from.as_str(),
                        if frozen { "frozen" } else { "thawed" }
                    )));
                }
            }
        }
        self.emit(Event::Changed(agent.clone()));
        let res = async {
            agent.cgroup.set_freeze(frozen)?;
            agent
                .cgroup
                .wait_events(
                    if frozen {
                        "cgroup.events frozen 1"
                    } else {
                        "cgroup.events frozen 0"
                    },
                    self.cfg.freeze_timeout,
                    |e| e.frozen == frozen,
                )
                .await
        }
        .await;
        {
            let mut i = lock(&agent.inner);
            if i.state == State::Freezing || i.state == State::Thawing {
                i.state = lifecycle::freeze_settled(frozen, res.is_ok());
            }
        }
        if res.is_err() && frozen {
            let _ = agent.cgroup.set_freeze(false);
        }
        self.audit_event(
            agent,
            if frozen { "freeze" } else { "thaw" },
            None,
            serde_json::json!({
                "state": agent.state().as_str(),
                "ok": res.is_ok(),
                "error": res.as_ref().err().map(|e| e.to_string()),
            }),
        );
        self.changed(agent);
        res.map_err(Error::from)
    }
}
