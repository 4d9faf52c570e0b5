//! Re-adoption after a daemon restart: load the persisted records, take back the agents still
//! running, conclude for the others what their restart policy says.

use std::sync::Arc;
use std::time::Duration;

use super::{Agent, Event, State, Supervisor, lock, plan_budgets};
use crate::cgroup::{self, Cgroup};
use crate::logs;
use crate::spec::RestartPolicy;
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
            let agent = Arc::new(self.new_agent(
                rec.spec.clone(),
                rec.contract.clone(),
                rec.origin.clone(),
                rec.enabled,
            ));
            if agent.cgroup.path() != rec.cgroup {
                report.push(format!(
                    "{}: recorded cgroup {} is not under this daemon's root {}; adopting in the new place",
                    agent.id,
                    rec.cgroup.display(),
                    self.root.path().display()
                ));
            }
            let prev = State::parse(&rec.state).unwrap_or(State::Failed);
            {
                let mut i = lock(&agent.inner);
                i.state = prev;
                i.result = rec.result.clone();
                i.restarts = rec.restarts;
                i.exit_status = rec.exit_status;
                i.started_at_us = rec.started_at_us;
                i.boot_id = rec.boot_id.clone();
            }
            lock(&self.agents).insert(agent.id.clone(), agent.clone());
            self.emit(Event::New(agent.clone()));
            if !prev.is_active() {
                continue;
            }
            let alive = rec.main_pid.and_then(|pid| {
                let same = rec.boot_id == self.boot_id
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
            match alive {
                Some((pid, fd)) if prev != State::Restarting => {
                    let pidfd = Arc::new(fd);
                    let frozen = agent.cgroup.events().map(|e| e.frozen).unwrap_or(false);
                    let generation = {
                        let mut i = lock(&agent.inner);
                        i.generation += 1;
                        i.state = if frozen {
                            State::Frozen
                        } else {
                            State::Running
                        };
                        i.main_pid = Some(pid);
                        i.main_start_time = rec.main_start_time;
                        i.pidfd = Some(pidfd.clone());
                        // Not persisted: recompute what this cgroup cannot enforce.
                        i.unenforced = plan_budgets(
                            &agent.cgroup.controllers().unwrap_or_default(),
                            &rec.spec.budgets,
                        )
                        .1;
                        i.notes = vec!["re-adopted after a daemon restart".to_string()];
                        i.generation
                    };
                    report.push(format!("{}: re-adopted main process PID {pid}", agent.id));
                    self.audit_readopted(&agent, pid).await;
                    let main = agent.main_cgroup();
                    if let Err(e) = main.create_in_existing() {
                        report.push(format!("{}: {e}", agent.id));
                    }
                    if let Err(e) = self.net_prepare(&agent, &main).await {
                        report.push(format!("{}: network policy: {e}", agent.id));
                    }
                    let layout = self.adopt_layout(&agent, &main).await;
                    report.extend(layout.iter().map(|n| format!("{}: {n}", agent.id)));
                    if let Some(note) =
                        self.scx_register(&agent, &agent.cgroup, &rec.spec.latency_class)
                    {
                        report.push(format!("{}: {note}", agent.id));
                    }
                    if let Some(note) = self.mcp_relisten(&agent) {
                        report.push(format!("{}: {note}", agent.id));
                    }
                    if let (Some(d), "HRT") =
                        (&rec.spec.sched.deadline, rec.spec.latency_class.as_str())
                    {
                        // It runs already: count its reservation, and say when it overloads.
                        if let Err(e) = self.admission.admit(&agent.id, d, &rec.spec.sched.cpuset) {
                            report.push(format!("{}: re-adopted over the bound: {e}", agent.id));
                        }
                        self.monitor_overruns(agent.clone(), generation, pid);
                    }
                    logs::append_note(
                        &agent.log_path,
                        &format!("re-adopted main process PID {pid}"),
                    );
                    self.changed(&agent);
                    self.watch(agent.clone(), generation, pidfd);
                    if prev == State::Stopping {
                        let _ = self.stop(&agent).await;
                    }
                }
                _ => {
                    // Dead (or never got past its backoff) while the daemon was away.
                    self.kill_and_wait(&agent).await;
                    let _ = self.remove_cgroup(&agent).await;
                    self.net_clear(&agent);
                    self.scx_forget(&agent);
                    self.mcp_forget(&agent);
                    let (restart, state_msg) = {
                        let mut i = lock(&agent.inner);
                        i.main_pid = None;
                        i.exit_status = Some(ExitStatus::Unknown);
                        let rebooted = rec.boot_id != self.boot_id;
                        let restart = match i.spec.restart.policy {
                            RestartPolicy::No => false,
                            _ => {
                                i.restarts < i.spec.restart.limit
                                    && prev != State::Stopping
                                    && !rebooted
                            }
                        };
                        i.state = if prev == State::Stopping || rebooted {
                            State::Inactive
                        } else {
                            State::Failed
                        };
                        // After a reboot only agents from the agents directory come back (they
                        // are started by load_agents_dir), like enabled vs. transient units.
                        i.result = if rebooted {
                            "not running after a reboot".into()
                        } else {
                            "main process exited while agentosd was not running (status unknown)"
                                .into()
                        };
                        if restart {
                            i.restarts += 1;
                        }
                        (restart, i.result.clone())
                    };
                    report.push(format!("{}: {state_msg}", agent.id));
                    self.audit_event(
                        &agent,
                        "lost",
                        None,
                        serde_json::json!({
                            "result": state_msg,
                            "state": agent.state().as_str(),
                            "will_restart": restart,
                        }),
                    );
                    self.changed(&agent);
                    if restart {
                        let _op = agent.op.lock().await;
                        if let Err(e) = self.launch(&agent).await {
                            report.push(format!("{}: restart failed: {e}", agent.id));
                        }
                    }
                }
            }
        }
        report
    }
}
