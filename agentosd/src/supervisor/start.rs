//! Start: check a contract or spec, create the agent's fresh cgroup, prepare its per-run
//! mechanisms and budgets, spawn its main process into `main` and start watching it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use super::enforce::cgroup_id;
use super::mechanism::{RunCtx, prepare_all};
use super::{
    Agent, ContractText, Error, Event, State, Supervisor, lifecycle, lock, now_us, plan_budgets,
};
use crate::cgroup;
use crate::spawn::{self, SpawnError};
use crate::spec::AgentSpec;
use crate::sys;

impl Supervisor {
    /// Parse a contract and start the agent it describes.
    pub async fn start_contract(
        self: &Arc<Self>,
        text: &str,
        origin: &str,
        enabled: bool,
    ) -> Result<Arc<Agent>, Error> {
        let contract = contracts::parse_contract(text, origin)
            .map_err(Error::from)
            .inspect_err(|e| self.audit_refused("", "", origin, e))?;
        let spec = AgentSpec::from_contract(&contract);
        let text = ContractText {
            text: text.to_string(),
            origin: origin.to_string(),
            parsed: Some(Arc::new(contract)),
        };
        self.start_with(spec, text, enabled).await
    }

    /// Start an agent from its spec. An agent with the same id that is still active is an
    /// `AlreadyExists` error; an inactive one is replaced by the new contract and started.
    pub async fn start_spec(
        self: &Arc<Self>,
        spec: AgentSpec,
        contract: String,
        origin: String,
        enabled: bool,
    ) -> Result<Arc<Agent>, Error> {
        self.start_with(spec, ContractText::new(contract, origin), enabled)
            .await
    }

    /// [`Self::start_spec`] with the contract already parsed.
    async fn start_with(
        self: &Arc<Self>,
        spec: AgentSpec,
        contract: ContractText,
        enabled: bool,
    ) -> Result<Arc<Agent>, Error> {
        let (tenant, name) = (spec.tenant.clone(), spec.name.clone());
        let from = contract.origin.clone();
        let mut launched = false;
        let r = self
            .start_spec_inner(spec, contract, enabled, &mut launched)
            .await;
        if let (Err(e), false) = (&r, launched) {
            // launch() records its own outcome; this is a refusal before anything ran.
            self.audit_refused(&tenant, &name, &from, e);
        }
        r
    }

    pub(super) async fn start_spec_inner(
        self: &Arc<Self>,
        spec: AgentSpec,
        contract: ContractText,
        enabled: bool,
        launched: &mut bool,
    ) -> Result<Arc<Agent>, Error> {
        let origin = contract.origin.clone();
        check_name(&spec.tenant, "tenant")?;
        check_name(&spec.name, "name")?;
        if spec.exec.is_none() {
            return Err(Error::InvalidContract(format!(
                "{origin}: contract {} has no exec: nothing to run",
                spec.id()
            )));
        }
        let id = spec.id();
        // Before anything exists: a start costs disk (state, journal, records).
        self.check_storage(&id)?;
        if spec.budgets.must {
            // Refuse before anything exists (no object, no cgroup) when a required budget
            // cannot be enforced under this root; launch() checks again per agent cgroup.
            let missing = self.missing_controllers();
            let unenforceable: Vec<String> = cgroup::budget_files(&spec.budgets)
                .into_iter()
                .filter(|(ctl, _, _)| missing.iter().any(|m| m == ctl))
                .map(|(ctl, file, value)| {
                    format!("{file}={value} ({ctl} controller not available)")
                })
                .collect();
            if !unenforceable.is_empty() {
                return Err(Error::Unenforceable(format!(
                    "{origin}: agent {id} requires its budgets (must) but this host cannot enforce: {}; \
                     the cgroup2 controllers are missing under {} (run `agentosd check`)",
                    unenforceable.join(", "),
                    self.root.path().display()
                )));
            }
        }
        if let Some(d) = spec.deadline() {
            // Refuse an unschedulable agent before anything exists; launch() admits it.
            self.admission
                .check(&id, d, &spec.sched.cpuset)
                .map_err(Error::Unschedulable)?;
        }
        let (agent, is_new) = {
            let mut agents = lock(&self.agents);
            match agents.get(&id) {
                Some(a) => (a.clone(), false),
                None => {
                    let path = crate::spec::agent_object_path(&spec.tenant, &spec.name);
                    if agents.values().any(|a| a.object_path == path) {
                        return Err(Error::AlreadyExists(format!(
                            "object path {path} of {id} is taken by another agent"
                        )));
                    }
                    let a = Arc::new(self.new_agent(spec.clone(), contract.clone(), enabled));
                    agents.insert(id.clone(), a.clone());
                    (a, true)
                }
            }
        };
        let op = agent.op.lock().await;
        if !is_new {
            let mut i = lock(&agent.inner);
            if !lifecycle::may_start(i.state) {
                return Err(Error::AlreadyExists(format!(
                    "agent {id} is already {} (PID {}); stop it first or use restart",
                    i.state.as_str(),
                    i.main_pid.unwrap_or(0)
                )));
            }
            i.pending = None;
            i.contract_loaded_us = super::now_us();
            super::reload::apply(&mut i, spec, contract);
            i.enabled |= enabled;
            i.restarts = 0;
        } else {
            self.emit(Event::New(agent.clone()));
        }
        *launched = true;
        let r = self.launch(&agent).await;
        drop(op);
        r.map(|()| agent)
    }

    /// Start a known agent again by name (after stop, exit or failure).
    pub async fn start_existing(self: &Arc<Self>, agent: &Arc<Agent>) -> Result<(), Error> {
        self.check_storage(&agent.id).inspect_err(|e| {
            self.audit_refused(&agent.tenant, &agent.name, "start", e);
        })?;
        let _op = agent.op.lock().await;
        {
            let mut i = lock(&agent.inner);
            if !lifecycle::may_start(i.state) {
                return Err(Error::AlreadyExists(format!(
                    "agent {} is already {}",
                    agent.id,
                    i.state.as_str()
                )));
            }
            i.restarts = 0;
        }
        self.launch(agent).await
    }

    /// Create the cgroup, prepare the run's mechanisms, apply budgets, spawn the main process,
    /// start watching it. Caller holds the op lock.
    pub(super) async fn launch(self: &Arc<Self>, agent: &Arc<Agent>) -> Result<(), Error> {
        let (spec, generation) = {
            let mut i = lock(&agent.inner);
            if let Some((spec, contract)) = i.pending.take() {
                super::reload::apply(&mut i, spec, contract);
            }
            i.generation += 1;
            i.state = State::Starting;
            i.result.clear();
            i.exit_status = None;
            i.main_pid = None;
            i.main_start_time = None;
            (i.spec.clone(), i.generation)
        };
        // Persisted before anything runs: a daemon killed between the spawn and the record of
        // the main process finds `starting` and kills what the run left (re-adoption), where an
        // unpersisted start left a process running under an agent recorded as stopped (or not
        // recorded at all), found by tests/faults.rs. Written, not synced: a crash of the daemon
        // finds it in the page cache, a power cut takes the run with it, and the `running`
        // record is synced before the start is acknowledged (the disk's syncs are not on the
        // way to the agent's first instruction; docs/benchmarks.md "The D-Bus start path").
        self.persist_as(agent, false);
        self.emit(Event::Changed(agent.clone()));
        let spawned = match self.audit_start(agent).await {
            Ok(()) => self.prepare_and_spawn(agent, &spec).await,
            Err(e) => Err(e),
        };
        match spawned {
            Ok((child, unenforced, notes)) => {
                self.started(agent, &spec, generation, child, unenforced, notes)
                    .await
            }
            Err(e) => self.start_failed(agent, e).await,
        }
    }

    /// A start that failed leaves nothing: whatever the agent or a tool started is killed with
    /// the whole subtree, then the cgroup tree goes; the agent is `failed` with the reason.
    async fn start_failed(self: &Arc<Self>, agent: &Arc<Agent>, e: Error) -> Result<(), Error> {
        let _ = self.teardown(agent).await;
        {
            let mut i = lock(&agent.inner);
            i.state = State::Failed;
            i.result = e.to_string();
            i.main_pid = None;
            i.pidfd = None;
        }
        self.note(agent, &format!("failed to start: {e}"), false);
        warn!(agent = %agent.id, "start failed: {e}");
        self.audit_event(
            agent,
            "start-failed",
            Some(audit::Decision::Deny),
            serde_json::json!({"reason": e.to_string(), "error": e.dbus_name()}),
        );
        self.changed(agent);
        Err(e)
    }

    /// The main process of a run exists: record it durably (the `start` record before it was
    /// only written), and watch it. A record that cannot be made durable fails the start (fail
    /// closed: no run the trail may not show).
    async fn started(
        self: &Arc<Self>,
        agent: &Arc<Agent>,
        spec: &AgentSpec,
        generation: u64,
        child: spawn::Child,
        unenforced: Vec<String>,
        notes: Vec<String>,
    ) -> Result<(), Error> {
        let pidfd = Arc::new(child.pidfd);
        let broker_pid = child.broker.as_ref().map(|b| b.pid);
        if let Some(b) = child.broker {
            // The socket broker ends with the agent's processes (sandbox/sockets.rs); reap it.
            let fd = Arc::new(b.pidfd);
            tokio::spawn(async move {
                super::exit::wait_exit(&fd).await;
            });
        }
        {
            let mut i = lock(&agent.inner);
            i.state = State::Running;
            i.main_pid = Some(child.pid);
            i.main_start_time = sys::process_start_time(child.pid);
            i.pidfd = Some(pidfd.clone());
            i.started_at_us = now_us();
            i.boot_id = self.boot_id.clone();
            i.unenforced = unenforced;
            i.notes = notes;
        }
        let broker = broker_pid.map_or(String::new(), |p| format!(", socket broker PID {p}"));
        self.note(
            agent,
            &format!(
                "started {}, main process PID {}{broker}",
                agent.id, child.pid
            ),
            false,
        );
        info!(agent = %agent.id, pid = child.pid, "started");
        // The `running` state synced and the `started` record committed at the same time: two
        // syncs of the disk in parallel, both before the start is acknowledged.
        let persisted = {
            let (me, a) = (self.clone(), agent.clone());
            tokio::task::spawn_blocking(move || me.persist(&a))
        };
        let committed = self
            .audit_commit(
                agent,
                "started",
                serde_json::json!({
                    "pid": child.pid,
                    "socket_broker_pid": broker_pid,
                    "cgroup": agent.cgroup.path().display().to_string(),
                    "cgroup_id": cgroup_id(agent.cgroup.path()),
                    "main_cgroup_id": cgroup_id(agent.main_cgroup().path()),
                }),
            )
            .await;
        let _ = persisted.await;
        if let Err(e) = committed {
            return self.start_failed(agent, e).await;
        }
        self.emit(Event::Changed(agent.clone()));
        if spec.deadline().is_some() {
            self.monitor_overruns(agent.clone(), generation, child.pid);
        }
        self.watch(agent.clone(), generation, pidfd);
        Ok(())
    }

    /// A fresh cgroup tree for the run: the tenant's (with the controllers this daemon uses),
    /// the agent's (never two generations in one), and `main` in it.
    async fn fresh_cgroup(&self, agent: &Agent, spec: &AgentSpec) -> Result<(), Error> {
        let tenant_cg = self.agents_cg.child(&spec.tenant);
        if !tenant_cg.exists() {
            tenant_cg.create()?;
        }
        // Every time, not only on creation: a tenant cgroup made by an older daemon gets the
        // controllers this one uses (a no-op when they are on or not available).
        tenant_cg.enable_subtree(cgroup::BUDGET_CONTROLLERS);
        tenant_cg.enable_subtree(&["cpuset"]);
        let cg = &agent.cgroup;
        if cg.exists() {
            if cg.populated() {
                // Leftovers of an earlier run: never put two generations in one cgroup.
                cg.kill()?;
                cg.wait_events("leftover processes to die", Duration::from_secs(5), |e| {
                    !e.populated
                })
                .await?;
            }
            // Always start in a fresh cgroup. Besides clearing a stale freeze, this works around
            // a kernel bug seen on 6.18: after `cgroup.kill` was written to a cgroup, every
            // process later born into it with clone3(CLONE_INTO_CGROUP) gets SIGKILL at once
            // (the fork compares the target cgroup's kill_seq with the parent's).
            cg.remove()?;
        }
        cg.create()?;
        // The agent's own processes in a leaf of their own, its tools beside it in `tools/`:
        // the budgets are set on `cg` and cover both (no-internal-process rule).
        agent.main_cgroup().create_in_existing()?;
        cg.enable_subtree(cgroup::AGENT_CHILD_CONTROLLERS);
        Ok(())
    }

    /// Write the budgets to the agent's cgroup; returns what cannot be enforced here (an error
    /// when the contract requires its budgets).
    fn write_budgets(
        &self,
        agent: &Agent,
        spec: &AgentSpec,
        available: &[String],
    ) -> Result<Vec<String>, Error> {
        let (to_write, unenforced) = plan_budgets(available, &spec.budgets);
        if spec.budgets.must && !unenforced.is_empty() {
            return Err(Error::Unenforceable(format!(
                "agent {} requires its budgets (must) but this cgroup cannot enforce: {}; \
                 the cgroup2 controllers are missing under {} (run `agentosd check`)",
                agent.id,
                unenforced.join(", "),
                self.root.path().display()
            )));
        }
        for (file, value) in to_write {
            agent.cgroup.set(file, &value)?;
        }
        Ok(unenforced)
    }

    /// Everything before the first process, then the spawn into `main`: returns the child, what
    /// is not enforced and the notes for status.
    pub(super) async fn prepare_and_spawn(
        &self,
        agent: &Agent,
        spec: &AgentSpec,
    ) -> Result<(spawn::Child, Vec<String>, Vec<String>), Error> {
        let Some(exec) = spec.exec.clone() else {
            return Err(Error::InvalidContract(format!("{} has no exec", agent.id)));
        };
        // Parsed once for this run; a text that no longer parses is refused (never less
        // enforcement than it declared).
        let contract = agent_contract(agent)?;
        self.fresh_cgroup(agent, spec).await?;
        let main = agent.main_cgroup();
        // Kernel policies (keyed by `main`), the class map, the HRT reservation and the MCP
        // socket, all before the first process exists.
        let run = RunCtx {
            agent,
            spec,
            contract: contract.as_deref(),
            main: &main,
        };
        let mut prepared = prepare_all(&self.mechanisms(), &run).await?;
        let cg = &agent.cgroup;
        let available = cg.controllers().unwrap_or_default();
        let mut unenforced = self.write_budgets(agent, spec, &available)?;
        unenforced.append(&mut prepared.unenforced);
        let (child_sched, mut notes, unenforced) =
            self.apply_class(agent, spec, cg, &available, prepared.cpu, unenforced)?;
        let sandbox = sandbox_for(
            &self.cfg.state_dir,
            agent,
            contract.as_deref(),
            crate::sandbox::Gateway {
                netns: prepared.netns,
                host_port: prepared.model_port,
                unix_dirs: prepared.unix_dirs,
            },
        )?;
        notes.extend(sandbox.notes.iter().map(|n| format!("sandbox: {n}")));
        notes.extend(prepared.notes);
        // Command.
        let mut env: BTreeMap<String, String> = BTreeMap::new();
        env.insert("PATH".into(), DEFAULT_PATH.into());
        env.insert("AGENTOS_AGENT".into(), agent.id.clone());
        env.insert("AGENTOS_AGENT_NAME".into(), agent.name.clone());
        env.insert("AGENTOS_TENANT".into(), agent.tenant.clone());
        env.extend(sandbox.env());
        for (k, v) in &exec.env {
            env.insert(k.clone(), v.clone());
        }
        // After the contract's env: an agent cannot be pointed at another socket.
        env.extend(prepared.env);
        let path = env.get("PATH").cloned().unwrap_or_default();
        let program = spawn::resolve_command(&exec.command, &path)
            .map_err(|e| Error::ExecFailed(format!("agent {}: {e}", agent.id)))?;
        let cmd = spawn::Command {
            program,
            args: exec.args.clone(),
            env: env.into_iter().collect(),
            cwd: exec
                .working_directory
                .clone()
                .unwrap_or_else(|| PathBuf::from("/")),
            log_file: agent.log_path.clone(),
            err_file: Some(crate::logs::AgentFiles::of(&agent.log_path).stderr),
            sched: child_sched,
            sandbox: Some(sandbox),
            inherit_fd: prepared.inherit_fd,
        };
        self.note(
            agent,
            &format!("starting {}: {}", agent.id, cmd.program.display()),
            false,
        );
        let dirfd = main.open_dir()?;
        let id = agent.id.clone();
        let child = tokio::task::spawn_blocking(move || spawn::spawn(&cmd, &dirfd))
            .await
            .map_err(|e| Error::Kernel(format!("spawn task: {e}")))?
            .map_err(|e| match e {
                SpawnError::Child { .. } | SpawnError::NotFound { .. } => {
                    Error::ExecFailed(format!("agent {id}: {e}"))
                }
                source => Error::Spawn { agent: id, source },
            })?;
        Ok((child, unenforced, notes))
    }
}

const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The agent's contract, parsed once when it was set; `None` for an agent started from a bare
/// spec. A text that does not parse is an error (never less enforcement).
pub(super) fn agent_contract(agent: &Agent) -> Result<Option<Arc<contracts::Contract>>, Error> {
    let i = lock(&agent.inner);
    if let Some(c) = &i.parsed {
        return Ok(Some(c.clone()));
    }
    if i.contract.trim().is_empty() {
        return Ok(None);
    }
    // Kept as text because it did not parse: say why.
    Ok(Some(Arc::new(contracts::parse_contract(
        &i.contract,
        &i.origin,
    )?)))
}

/// The agent's sandbox from its contract's capabilities (sandbox.rs). An agent started from a
/// bare spec (no contract text) gets the baseline with no grants; a contract that no longer
/// parses is refused rather than run with less than it declared.
pub(super) fn sandbox_for(
    state_dir: &Path,
    agent: &Agent,
    contract: Option<&contracts::Contract>,
    gateway: crate::sandbox::Gateway,
) -> Result<crate::sandbox::PreparedSandbox, Error> {
    crate::sandbox::prepare_with(state_dir, &agent.tenant, &agent.name, contract, gateway).map_err(
        |source| Error::Sandbox {
            agent: agent.id.clone(),
            source,
        },
    )
}

/// Names become cgroup directories and file names: allow only `[a-z0-9-]`, not starting with
/// `-`, at most 63 bytes (the contracts crate enforces the same).
pub(super) fn check_name(s: &str, what: &str) -> Result<(), Error> {
    let ok = !s.is_empty()
        && s.len() <= 63
        && !s.starts_with('-')
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidContract(format!(
            "{what} {s:?} must be 1-63 characters of [a-z0-9-], not starting with '-'"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn names_are_checked() {
        assert!(check_name("ticker-1", "name").is_ok());
        assert!(check_name("-x", "name").is_err());
        assert!(check_name("A", "name").is_err());
        assert!(check_name("../x", "name").is_err());
        assert!(check_name("", "name").is_err());
    }
}
