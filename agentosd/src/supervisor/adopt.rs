//! Re-adoption after a daemon restart: load the persisted records, take back the agents still
//! running, conclude for the others what their restart policy says.

use std::sync::Arc;
use std::time::Duration;

use super::lifecycle::{self, Readopt};
use super::mechanism::{RunCtx, adopt_all};
use super::start::agent_contract;
use super::{Agent, ContractText, Event, State, Supervisor, lock, plan_budgets};
use crate::cgroup::{self, Cgroup};
use crate::state::AgentRecord;
use crate::sys::{self, ExitStatus};

impl Supervisor {
    /// Bring a re-adopted agent's cgroup into this layout, after its policies are keyed by
    /// `main`: processes of the old layout (directly in `agents/<tenant>/<name>`) move into
    /// `main`; tool processes the previous daemon left in `tools/` are killed (their calls died
    /// with it); the agent's cgroup then hands its children the tool controllers. Returns notes
    /// for the re-adoption report; an agent that cannot be moved is refused: it is killed.
    pub(super) async fn adopt_layout(&self, agent: &Agent, main: &Cgroup) -> Vec<String> {
        let mut notes = Vec::new();
        match agent.cgroup.move_procs_into(main) {
            Ok(0) => {}
            Ok(n) => notes.push(format!(
                "moved {n} process(es) of the old cgroup layout into {}",
                main.path().display()
            )),
            Err(e) => {
                notes.push(format!(
                    "cannot move its processes into {} ({e}); refused: killing it",
                    main.path().display()
                ));
                let _ = agent.cgroup.kill();
                return notes;
            }
        }
        let tools = agent.cgroup.child(cgroup::AGENT_TOOLS);
        if tools.exists() {
            if tools.populated() {
                notes.push(
                    "killed the tool processes the previous daemon left in its tools/ cgroup"
                        .into(),
                );
            }
            let _ = tools.kill();
            let _ = tools
                .wait_events("left tool processes to die", Duration::from_secs(5), |e| {
                    !e.populated
                })
                .await;
            if let Err(e) = tools.remove() {
                notes.push(e.to_string());
            }
        }
        agent.cgroup.enable_subtree(cgroup::AGENT_CHILD_CONTROLLERS);
        notes
    }

    /// Load persisted agents: re-adopt those still running (PID alive, same start time, in its
    /// cgroup), mark the dead ones and apply their restart policy.
    pub async fn readopt(self: &Arc<Self>) -> Vec<String> {
        let (records, errors) = self.store.load_all();
        let mut report: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
        for rec in records {
            report.extend(self.readopt_one(rec).await);
        }
        report
    }

    /// Register one persisted agent and conclude what its record and the host say.
    async fn readopt_one(self: &Arc<Self>, rec: AgentRecord) -> Vec<String> {
        let mut report = Vec::new();
        let contract = ContractText::new(rec.contract.clone(), rec.origin.clone());
        let agent = Arc::new(self.new_agent(rec.spec.clone(), contract, rec.enabled));
        if agent.cgroup.path() != rec.cgroup {
            report.push(format!(
                "{}: recorded cgroup {} is not under this daemon's root {}; adopting in the new place",
                agent.id,
                rec.cgroup.display(),
                self.root.path().display()
            ));
        }
        let prev = State::parse(&rec.state).unwrap_or_else(|| {
            report.push(format!(
                "{}: recorded state {:?} is not a state this daemon knows; taken as failed",
                agent.id, rec.state
            ));
            State::Failed
        });
        {
            let mut i = lock(&agent.inner);
            i.state = prev;
            i.result = rec.result.clone();
            i.restarts = rec.restarts;
            i.exit_status = rec.exit_status;
            i.started_at_us = rec.started_at_us;
            i.contract_loaded_us = rec.contract_loaded_us;
            i.boot_id = rec.boot_id.clone();
        }
        lock(&self.agents).insert(agent.id.clone(), agent.clone());
        self.emit(Event::New(agent.clone()));
        if !prev.is_active() {
            return report;
        }
        let rebooted = rec.boot_id != self.boot_id;
        let alive = rec.main_pid.and_then(|pid| {
            let same = !rebooted
                && sys::process_start_time(pid) == rec.main_start_time
                && rec.main_start_time.is_some()
                // `main` (this layout) or the agent's cgroup itself (the layout before
                // tools moved under their agent).
                && agent.cgroup.subtree_procs().contains(&pid);
            if !same {
                return None;
            }
            sys::pidfd_open(pid).ok().map(|fd| (pid, fd))
        });
        let found = lifecycle::Found {
            alive: alive.is_some(),
            frozen: alive.is_some() && agent.cgroup.events().map(|e| e.frozen).unwrap_or(false),
            rebooted,
        };
        let (restart, restarts) = (&rec.spec.restart, rec.restarts);
        match (lifecycle::readopt(prev, restart, restarts, found), alive) {
            (Readopt::Keep, _) => {}
            (Readopt::Adopt { state, then_stop }, Some((pid, fd))) => {
                let main_start_time = rec.main_start_time;
                report.extend(
                    self.adopt_running(&agent, state, pid, fd, main_start_time)
                        .await,
                );
                if then_stop {
                    // The stop a previous daemon began (now persisted before its first signal)
                    // goes on in the background: it may wait out the stop timeout, and the
                    // daemon must not wait for it before it serves D-Bus.
                    let (sup, agent) = (self.clone(), agent.clone());
                    tokio::spawn(async move {
                        let _ = sup.stop(&agent).await;
                    });
                }
            }
            (
                Readopt::Lost {
                    state,
                    result,
                    restart,
                },
                _,
            ) => {
                report.extend(self.adopt_lost(&agent, state, result, restart).await);
            }
            (Readopt::Adopt { .. }, None) => unreachable!("adopted only when found alive"),
        }
        report
    }

    /// Take a running main process back: its per-run mechanisms again, the cgroup layout, a
    /// watcher.
    async fn adopt_running(
        self: &Arc<Self>,
        agent: &Arc<Agent>,
        state: State,
        pid: u32,
        fd: std::os::fd::OwnedFd,
        main_start_time: Option<u64>,
    ) -> Vec<String> {
        let pidfd = Arc::new(fd);
        let spec = agent.spec();
        let generation = {
            let mut i = lock(&agent.inner);
            i.generation += 1;
            i.state = state;
            i.main_pid = Some(pid);
            i.main_start_time = main_start_time;
            i.pidfd = Some(pidfd.clone());
            // Not persisted: recompute what this cgroup cannot enforce.
            i.unenforced = plan_budgets(
                &agent.cgroup.controllers().unwrap_or_default(),
                &spec.budgets,
            )
            .1;
            i.notes = vec!["re-adopted after a daemon restart".to_string()];
            i.generation
        };
        let mut report = vec![format!("re-adopted main process PID {pid}")];
        self.audit_readopted(agent, pid).await;
        let main = agent.main_cgroup();
        if let Err(e) = main.create_in_existing() {
            report.push(e.to_string());
        }
        // Its policies keyed by `main` before its processes move there.
        let contract = match agent_contract(agent) {
            Ok(c) => c,
            Err(e) => {
                report.push(format!("contract: {e}"));
                None
            }
        };
        let run = RunCtx {
            agent,
            spec: &spec,
            contract: contract.as_deref(),
            main: &main,
        };
        report.extend(adopt_all(&self.mechanisms(), &run).await);
        report.extend(self.adopt_layout(agent, &main).await);
        if spec.deadline().is_some() {
            self.monitor_overruns(agent.clone(), generation, pid);
        }
        self.note(agent, &format!("re-adopted main process PID {pid}"), false);
        self.changed(agent);
        self.watch(agent.clone(), generation, pidfd);
        report
            .into_iter()
            .map(|n| format!("{}: {n}", agent.id))
            .collect()
    }

    /// The agent died (or never got past its backoff) while the daemon was away: end what is
    /// left of its run, enter `state`, restart it when the policy says so.
    async fn adopt_lost(
        self: &Arc<Self>,
        agent: &Arc<Agent>,
        state: State,
        result: String,
        restart: bool,
    ) -> Vec<String> {
        let _ = self.teardown(agent).await;
        {
            let mut i = lock(&agent.inner);
            i.main_pid = None;
            i.exit_status = Some(ExitStatus::Unknown);
            i.state = state;
            i.result = result.clone();
            if restart {
                i.restarts += 1;
            }
        }
        let mut report = vec![format!("{}: {result}", agent.id)];
        self.audit_event(
            agent,
            "lost",
            None,
            serde_json::json!({
                "result": result,
                "state": state.as_str(),
                "will_restart": restart,
            }),
        );
        self.changed(agent);
        if restart {
            let _op = agent.op.lock().await;
            if let Err(e) = self.launch(agent).await {
                report.push(format!("{}: restart failed: {e}", agent.id));
            }
        }
        report
    }
}
