//! The lifecycle decisions as pure functions: what an exit means under a restart policy, what
//! re-adoption concludes from a persisted record and what is found on the host, and which
//! transitions freeze and thaw allow. The supervisor's rooms (exit.rs, adopt.rs, freeze.rs) apply
//! them; the tables below test them without root.

use std::time::Duration;

use super::State;
use crate::spec::{Restart, RestartPolicy};
use crate::sys::ExitStatus;

/// What the exit of a run's main process leads to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExitOutcome {
    pub state: State,
    /// The `result` shown by `status` (`exit-code`, `auto-restart after …`…).
    pub result: String,
    /// `Some(backoff)` when the restart policy restarts it after that delay.
    pub restart_after: Option<Duration>,
    /// The restart counter once that restart happens (0 when none is due).
    pub restart_no: u32,
}

/// A clean exit, as systemd counts it: status 0, or killed by SIGHUP, SIGINT, SIGTERM or SIGPIPE
/// (the signals a program is asked to end with; `systemd.service(5)`, "SuccessExitStatus=").
/// Anything else is a failure, and an OOM kill always is.
pub fn clean_exit(status: ExitStatus, oom: bool) -> bool {
    !oom && match status {
        ExitStatus::Exited(code) => code == 0,
        ExitStatus::Signaled(sig) => {
            [libc::SIGHUP, libc::SIGINT, libc::SIGTERM, libc::SIGPIPE].contains(&sig)
        }
        ExitStatus::Unknown => false,
    }
}

/// Apply the restart policy to an exit: `restarts` is the count so far, `oom` whether the run's
/// cgroup saw an OOM kill.
pub fn on_exit(restart: &Restart, restarts: u32, status: ExitStatus, oom: bool) -> ExitOutcome {
    let failed = !clean_exit(status, oom);
    let what = if oom {
        format!("oom-kill, {}", status.describe())
    } else {
        status.describe()
    };
    let wants = match restart.policy {
        RestartPolicy::No => false,
        RestartPolicy::OnFailure => failed,
        RestartPolicy::Always => true,
    };
    if wants && restarts >= restart.limit {
        return ExitOutcome {
            state: State::Failed,
            result: format!("start-limit-hit: gave up after {restarts} restarts ({what})"),
            restart_after: None,
            restart_no: 0,
        };
    }
    if wants {
        return ExitOutcome {
            state: State::Restarting,
            result: format!("auto-restart after {what}"),
            restart_after: Some(Duration::from_millis(restart.delay_ms(restarts))),
            restart_no: restarts + 1,
        };
    }
    let result = if failed && oom {
        "oom-kill".to_string()
    } else if failed {
        match status {
            ExitStatus::Exited(_) => "exit-code".to_string(),
            ExitStatus::Signaled(_) => "signal".to_string(),
            ExitStatus::Unknown => "exited while re-adopted, status unknown".to_string(),
        }
    } else if let ExitStatus::Signaled(_) = status {
        format!("success ({})", status.describe())
    } else {
        "success".to_string()
    };
    ExitOutcome {
        state: if failed { State::Failed } else { State::Exited },
        result,
        restart_after: None,
        restart_no: 0,
    }
}

/// What a restarted daemon found for one persisted agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    /// The recorded main PID is alive, with the recorded start time, in the agent's cgroup, and
    /// this is the same boot.
    pub alive: bool,
    /// The agent's cgroup reports `frozen 1`.
    pub frozen: bool,
    /// The record is from another boot.
    pub rebooted: bool,
}

/// What re-adoption concludes for one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readopt {
    /// Not active when recorded: keep the record as it is.
    Keep,
    /// Take the running main process back in `state`; `then_stop` when it was being stopped.
    Adopt { state: State, then_stop: bool },
    /// Gone (or never got past its backoff): end what is left of the run, enter `state` with
    /// `result`; `restart` when the restart policy starts it again now.
    Lost {
        state: State,
        result: String,
        restart: bool,
    },
}

/// Decide re-adoption from the recorded state, restart policy and restart count, and what was
/// found on the host.
pub fn readopt(prev: State, restart: &Restart, restarts: u32, found: Found) -> Readopt {
    if !prev.is_active() {
        return Readopt::Keep;
    }
    if found.alive && prev != State::Restarting {
        return Readopt::Adopt {
            state: if found.frozen {
                State::Frozen
            } else {
                State::Running
            },
            then_stop: prev == State::Stopping,
        };
    }
    let stopping = prev == State::Stopping;
    let restart = match restart.policy {
        RestartPolicy::No => false,
        _ => restarts < restart.limit && !stopping && !found.rebooted,
    };
    Readopt::Lost {
        state: if stopping || found.rebooted {
            State::Inactive
        } else {
            State::Failed
        },
        // After a reboot only agents from the agents directory come back (they are started by
        // load_agents_dir), like enabled vs. transient units.
        result: if found.rebooted {
            "not running after a reboot".into()
        } else if prev == State::Starting {
            // The spawn may have happened, its record not: what the run left is killed.
            "start interrupted: agentosd stopped before the main process was recorded".into()
        } else {
            "main process exited while agentosd was not running (status unknown)".into()
        },
        restart,
    }
}

/// A freeze (`frozen`) or thaw asked of an agent in `state`: `Ok(None)` when it is there already,
/// `Ok(Some(transitional state))` to go ahead, `Err(the state it must be in)` otherwise.
pub fn freeze_transition(state: State, frozen: bool) -> Result<Option<State>, State> {
    let (from, to, via) = if frozen {
        (State::Running, State::Frozen, State::Freezing)
    } else {
        (State::Frozen, State::Running, State::Thawing)
    };
    if state == to {
        Ok(None)
    } else if state == from {
        Ok(Some(via))
    } else {
        Err(from)
    }
}

/// Where a freeze or thaw ends, from whether `cgroup.events` confirmed it in time: a failed
/// freeze is undone (running), a failed thaw stays frozen.
pub fn freeze_settled(frozen: bool, confirmed: bool) -> State {
    match (confirmed, frozen) {
        (true, true) | (false, false) => State::Frozen,
        (true, false) | (false, true) => State::Running,
    }
}

/// Whether a start (or `start` of a known agent) may begin from `state`.
pub fn may_start(state: State) -> bool {
    !state.is_active()
}

/// Whether an agent in `state` has processes to signal.
pub fn may_signal(state: State) -> bool {
    state.is_active()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(policy: RestartPolicy, limit: u32) -> Restart {
        Restart {
            policy,
            limit,
            backoff_ms: 100,
            max_backoff_ms: 1000,
        }
    }

    #[test]
    #[rustfmt::skip]
    fn exits_under_each_restart_policy() {
        use ExitStatus::{Exited, Signaled, Unknown};
        use RestartPolicy::*;
        use State::{Failed, Restarting};
        const EXITED: State = State::Exited;
        // (policy, limit, restarts so far, status, oom) → (state, result, delay ms, restart no)
        type Row = (RestartPolicy, u32, u32, ExitStatus, bool, State, &'static str, Option<u64>, u32);
        let table: &[Row] = &[
            (No, 5, 0, Exited(0), false, EXITED, "success", None, 0),
            (No, 5, 0, Exited(3), false, Failed, "exit-code", None, 0),
            (No, 5, 0, Signaled(9), false, Failed, "signal", None, 0),
            (No, 5, 0, Signaled(9), true, Failed, "oom-kill", None, 0),
            // SIGTERM, SIGINT, SIGHUP, SIGPIPE end a program cleanly, as systemd counts it.
            (No, 5, 0, Signaled(15), false, EXITED, "success (code=killed, signal=TERM)", None, 0),
            (OnFailure, 5, 0, Signaled(15), false, EXITED, "success (code=killed, signal=TERM)", None, 0),
            (OnFailure, 5, 0, Signaled(2), false, EXITED, "success (code=killed, signal=INT)", None, 0),
            (OnFailure, 5, 0, Signaled(13), false, EXITED, "success (code=killed, signal=PIPE)", None, 0),
            (OnFailure, 5, 0, Signaled(1), false, EXITED, "success (code=killed, signal=HUP)", None, 0),
            (OnFailure, 5, 0, Signaled(9), false, Restarting, "auto-restart after code=killed, signal=KILL", Some(100), 1),
            (OnFailure, 5, 0, Signaled(6), false, Restarting, "auto-restart after code=killed, signal=ABRT", Some(100), 1),
            (OnFailure, 5, 0, Signaled(15), true, Restarting, "auto-restart after oom-kill, code=killed, signal=TERM", Some(100), 1),
            (No, 5, 0, Unknown, false, Failed, "exited while re-adopted, status unknown", None, 0),
            (OnFailure, 5, 0, Exited(0), false, EXITED, "success", None, 0),
            (OnFailure, 5, 0, Exited(1), false, Restarting, "auto-restart after code=exited, status=1", Some(100), 1),
            (OnFailure, 5, 2, Exited(1), false, Restarting, "auto-restart after code=exited, status=1", Some(400), 3),
            (OnFailure, 5, 4, Exited(1), true, Restarting, "auto-restart after oom-kill, code=exited, status=1", Some(1000), 5),
            (OnFailure, 5, 5, Exited(1), false, Failed, "start-limit-hit: gave up after 5 restarts (code=exited, status=1)", None, 0),
            (OnFailure, 0, 0, Exited(1), false, Failed, "start-limit-hit: gave up after 0 restarts (code=exited, status=1)", None, 0),
            (Always, 5, 0, Exited(0), false, Restarting, "auto-restart after code=exited, status=0", Some(100), 1),
            (Always, 5, 1, Signaled(15), false, Restarting, "auto-restart after code=killed, signal=TERM", Some(200), 2),
            (Always, 2, 2, Exited(0), false, Failed, "start-limit-hit: gave up after 2 restarts (code=exited, status=0)", None, 0),
        ];
        for (i, &(p, limit, n, status, oom, state, result, delay, no)) in table.iter().enumerate() {
            let got = on_exit(&policy(p, limit), n, status, oom);
            let want = ExitOutcome {
                state,
                result: result.to_string(),
                restart_after: delay.map(Duration::from_millis),
                restart_no: no,
            };
            assert_eq!(got, want, "row {i}: {p:?} limit {limit} after {n} restarts, {status:?}, oom {oom}");
        }
    }

    #[test]
    #[rustfmt::skip]
    fn readoption_from_record_and_host() {
        use RestartPolicy::*;
        use State::*;
        // Found on the host: (alive, frozen, rebooted).
        const ALIVE: Found = Found { alive: true, frozen: false, rebooted: false };
        const ALIVE_FROZEN: Found = Found { alive: true, frozen: true, rebooted: false };
        const GONE: Found = Found { alive: false, frozen: false, rebooted: false };
        const REBOOTED: Found = Found { alive: false, frozen: false, rebooted: true };
        let adopt = |state, then_stop| Readopt::Adopt { state, then_stop };
        let lost = |state, rebooted: bool, restart| Readopt::Lost {
            state,
            result: if rebooted {
                "not running after a reboot".into()
            } else {
                "main process exited while agentosd was not running (status unknown)".into()
            },
            restart,
        };
        // (recorded state, policy, restarts so far with limit 5, found) → conclusion
        let table: Vec<(State, RestartPolicy, u32, Found, Readopt)> = vec![
            // Inactive records stay as they are, whatever the host shows.
            (Inactive, Always, 0, ALIVE, Readopt::Keep),
            (Exited, Always, 0, GONE, Readopt::Keep),
            (Failed, OnFailure, 0, REBOOTED, Readopt::Keep),
            // Alive: taken back, frozen if its cgroup is; a stop in progress goes on.
            (Running, No, 0, ALIVE, adopt(Running, false)),
            (Running, No, 0, ALIVE_FROZEN, adopt(Frozen, false)),
            (Frozen, No, 0, ALIVE_FROZEN, adopt(Frozen, false)),
            (Starting, No, 0, ALIVE, adopt(Running, false)),
            (Stopping, Always, 0, ALIVE, adopt(Running, true)),
            // Alive but recorded in its backoff: the run is over, restart per policy.
            (Restarting, Always, 1, ALIVE, lost(Failed, false, true)),
            // Gone while the daemon was away.
            (Running, No, 0, GONE, lost(Failed, false, false)),
            (Running, OnFailure, 0, GONE, lost(Failed, false, true)),
            (Running, Always, 4, GONE, lost(Failed, false, true)),
            (Running, Always, 5, GONE, lost(Failed, false, false)),
            (Stopping, Always, 0, GONE, lost(Inactive, false, false)),
            // A start the daemon did not see through: no main process recorded, so none found.
            (Starting, No, 0, GONE, Readopt::Lost {
                state: Failed,
                result: "start interrupted: agentosd stopped before the main process was recorded".into(),
                restart: false,
            }),
            // After a reboot: inactive, never restarted here (the agents directory starts them).
            (Running, Always, 0, REBOOTED, lost(Inactive, true, false)),
            (Restarting, OnFailure, 0, REBOOTED, lost(Inactive, true, false)),
        ];
        for (i, (prev, p, n, f, want)) in table.into_iter().enumerate() {
            assert_eq!(readopt(prev, &policy(p, 5), n, f), want, "row {i}: {prev:?} {p:?} {n} {f:?}");
        }
    }

    #[test]
    fn freeze_and_thaw_transitions() {
        use State::*;
        let all = [
            Starting, Running, Freezing, Frozen, Thawing, Stopping, Restarting, Inactive, Exited,
            Failed,
        ];
        for s in all {
            let want_freeze = match s {
                Running => Ok(Some(Freezing)),
                Frozen => Ok(None),
                _ => Err(Running),
            };
            assert_eq!(freeze_transition(s, true), want_freeze, "freeze from {s:?}");
            let want_thaw = match s {
                Frozen => Ok(Some(Thawing)),
                Running => Ok(None),
                _ => Err(Frozen),
            };
            assert_eq!(freeze_transition(s, false), want_thaw, "thaw from {s:?}");
            assert_eq!(
                may_start(s),
                matches!(s, Inactive | Exited | Failed),
                "start from {s:?}"
            );
            assert_eq!(may_signal(s), !may_start(s), "signal in {s:?}");
        }
        assert_eq!(freeze_settled(true, true), Frozen);
        assert_eq!(freeze_settled(true, false), Running);
        assert_eq!(freeze_settled(false, true), Running);
        assert_eq!(freeze_settled(false, false), Frozen);
    }
}
