//! Per-run mechanisms: what a run of an agent gets before its first process and gives back when
//! the run ends (BPF LSM filesystem scopes, cgroup BPF network policy, syscall counts, the
//! sched_ext class, the HRT reservation, the MCP socket). Each is one [`RunMechanism`]; the
//! list in [`Supervisor::mechanisms`] is the order a run prepares them, and [`end_run`] is the
//! one teardown every path uses (failed launch, exit watcher, stop, re-adoption of a lost
//! agent): kill what is left, remove the cgroup tree, release the mechanisms in reverse order.

use std::future::Future;
use std::os::fd::OwnedFd;
use std::pin::Pin;

use super::{Agent, Error, Supervisor};
use crate::cgroup::{Cgroup, CgroupError};
use crate::spec::AgentSpec;

/// A boxed future, so [`RunMechanism`] stays object safe.
pub(super) type Boxed<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One run of an agent as its mechanisms see it.
pub(super) struct RunCtx<'a> {
    pub agent: &'a Agent,
    pub spec: &'a AgentSpec,
    /// The agent's contract, parsed once for this run; `None` for an agent started from a bare
    /// spec.
    pub contract: Option<&'a contracts::Contract>,
    /// The leaf the agent's own processes run in (`main`): kernel policies are keyed by its id.
    pub main: &'a Cgroup,
}

/// What the prepared mechanisms hand to the launch.
#[derive(Debug, Default)]
pub(super) struct Prepared {
    /// For `agentctl status`.
    pub notes: Vec<String>,
    /// Budgets the contract declared that this host does not enforce (`unenforced_budgets`).
    pub unenforced: Vec<String>,
    /// Environment of the main process, set after the contract's (it cannot override them).
    pub env: Vec<(String, String)>,
    /// An fd the main process inherits.
    pub inherit_fd: Option<OwnedFd>,
    /// The CPU HRT admission reserved for the run.
    pub cpu: Option<u32>,
    /// The network namespace made for the agent, with the model gateway's port in it
    /// (models_socket.rs); the sandbox has the agent join it.
    pub netns: Option<OwnedFd>,
    /// The model gateway's port on the host's loopback for an agent with network grants
    /// (models_socket.rs); the sandbox lets it connect there.
    pub model_port: Option<u16>,
    /// Directories of the daemon's Unix sockets for the agent (mcp_socket.rs,
    /// models_socket.rs): the sandbox lets it connect there and to no other host socket.
    pub unix_dirs: Vec<std::path::PathBuf>,
}

impl Prepared {
    /// Let the agent connect to Unix sockets in the directory of `socket` (one of the
    /// daemon's sockets for it).
    pub fn allow_unix_dir_of(&mut self, socket: &std::path::Path) {
        if let Some(dir) = socket.parent()
            && !self.unix_dirs.iter().any(|d| d == dir)
        {
            self.unix_dirs.push(dir.to_path_buf());
        }
    }
}

/// One per-run mechanism. `prepare` runs before the run's first process exists (an error
/// refuses the start, and the run is torn down); `adopt` takes a running agent back after a
/// daemon restart (what it says goes into the re-adoption report); `release` gives everything
/// back when the run ends, whether or not `prepare` ran or succeeded (so it must be idempotent).
pub(super) trait RunMechanism: Send + Sync {
    /// For tests and logs.
    fn name(&self) -> &'static str;
    fn prepare<'a>(
        &'a self,
        run: &'a RunCtx<'a>,
        out: &'a mut Prepared,
    ) -> Boxed<'a, Result<(), Error>>;
    fn adopt<'a>(&'a self, run: &'a RunCtx<'a>) -> Boxed<'a, Vec<String>>;
    fn release(&self, agent_id: &str);
}

/// A [`RunMechanism`] whose steps do not wait: the usual case (only the network policy, which
/// resolves host names, waits). Every `Mechanism` is a `RunMechanism`.
pub(super) trait Mechanism: Send + Sync {
    fn name(&self) -> &'static str;
    fn prepare(&self, run: &RunCtx<'_>, out: &mut Prepared) -> Result<(), Error>;
    fn adopt(&self, run: &RunCtx<'_>) -> Vec<String>;
    fn release(&self, agent_id: &str);
}

impl<M: Mechanism> RunMechanism for M {
    fn name(&self) -> &'static str {
        Mechanism::name(self)
    }

    fn prepare<'a>(
        &'a self,
        run: &'a RunCtx<'a>,
        out: &'a mut Prepared,
    ) -> Boxed<'a, Result<(), Error>> {
        Box::pin(std::future::ready(Mechanism::prepare(self, run, out)))
    }

    fn adopt<'a>(&'a self, run: &'a RunCtx<'a>) -> Boxed<'a, Vec<String>> {
        Box::pin(std::future::ready(Mechanism::adopt(self, run)))
    }

    fn release(&self, agent_id: &str) {
        Mechanism::release(self, agent_id);
    }
}

/// The cgroup side of a run's end, behind a trait so the teardown order is tested without root.
pub(super) trait RunCgroup: Send + Sync {
    /// `cgroup.kill` on the whole subtree and wait until it is empty (bounded).
    fn kill_all(&self) -> Boxed<'_, ()>;
    /// Remove the cgroup tree bottom-up.
    fn remove(&self) -> Boxed<'_, Result<(), CgroupError>>;
}

/// Prepare `mechanisms` in order; the first error stops (the caller ends the run with
/// [`end_run`], which releases them all).
pub(super) async fn prepare_all(
    mechanisms: &[Box<dyn RunMechanism + '_>],
    run: &RunCtx<'_>,
) -> Result<Prepared, Error> {
    let mut out = Prepared::default();
    for m in mechanisms {
        m.prepare(run, &mut out).await.inspect_err(|e| {
            tracing::debug!(agent = %run.agent.id, mechanism = m.name(), "not prepared: {e}");
        })?;
    }
    Ok(out)
}

/// Take a running agent back: every mechanism in order; returns the report lines.
pub(super) async fn adopt_all(
    mechanisms: &[Box<dyn RunMechanism + '_>],
    run: &RunCtx<'_>,
) -> Vec<String> {
    let mut report = Vec::new();
    for m in mechanisms {
        report.extend(m.adopt(run).await);
    }
    report
}

/// The end of a run, written once: nothing of the run may stay (like systemd's
/// KillMode=control-group), the cgroup tree goes (a restart makes a fresh one), then the
/// mechanisms are released in the reverse order of their preparation.
pub(super) async fn end_run(
    cg: &dyn RunCgroup,
    mechanisms: &[Box<dyn RunMechanism + '_>],
    agent_id: &str,
) -> Result<(), CgroupError> {
    cg.kill_all().await;
    let removed = cg.remove().await;
    for m in mechanisms.iter().rev() {
        m.release(agent_id);
    }
    removed
}

/// The real cgroup of an agent's run.
struct AgentRun<'a> {
    sup: &'a Supervisor,
    agent: &'a Agent,
}

impl RunCgroup for AgentRun<'_> {
    fn kill_all(&self) -> Boxed<'_, ()> {
        Box::pin(self.sup.kill_and_wait(self.agent))
    }

    fn remove(&self) -> Boxed<'_, Result<(), CgroupError>> {
        Box::pin(self.sup.remove_cgroup(self.agent))
    }
}

impl Supervisor {
    /// The per-run mechanisms, in the order a run prepares them. A new mechanism is one impl of
    /// [`RunMechanism`] added here.
    pub(super) fn mechanisms(&self) -> Vec<Box<dyn RunMechanism + '_>> {
        vec![
            Box::new(super::disk::DiskQuota(self)),
            Box::new(super::enforce::FsScopes(self)),
            Box::new(super::enforce::NetPolicy(self)),
            Box::new(super::enforce::SyscCounts(self)),
            Box::new(super::class::ScxClass(self)),
            Box::new(super::class::HrtAdmission(self)),
            Box::new(super::mcp_socket::McpSocket(self)),
            Box::new(super::models_socket::ModelSocket(self)),
            Box::new(super::telemetry::TelemetryTurns(self)),
        ]
    }

    /// End the agent's run (see [`end_run`]).
    pub(super) async fn teardown(&self, agent: &Agent) -> Result<(), CgroupError> {
        let run = AgentRun { sup: self, agent };
        end_run(&run, &self.mechanisms(), &agent.id).await
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// A recording double of the runtime: every step a run goes through is logged.
    #[derive(Clone, Default)]
    pub struct Log(Arc<Mutex<Vec<String>>>);

    impl Log {
        pub fn push(&self, s: String) {
            self.0.lock().unwrap().push(s);
        }
        pub fn take(&self) -> Vec<String> {
            std::mem::take(&mut self.0.lock().unwrap())
        }
    }

    pub struct FakeMechanism {
        pub name: &'static str,
        pub log: Log,
        pub fail: bool,
    }

    impl Mechanism for FakeMechanism {
        fn name(&self) -> &'static str {
            self.name
        }
        fn prepare(&self, _run: &RunCtx<'_>, out: &mut Prepared) -> Result<(), Error> {
            self.log.push(format!("prepare {}", self.name));
            out.notes.push(self.name.to_string());
            if self.fail {
                return Err(Error::Kernel(format!("{} failed", self.name)));
            }
            Ok(())
        }
        fn adopt(&self, _run: &RunCtx<'_>) -> Vec<String> {
            self.log.push(format!("adopt {}", self.name));
            vec![]
        }
        fn release(&self, _agent_id: &str) {
            self.log.push(format!("release {}", self.name));
        }
    }

    pub struct FakeCgroup(pub Log);

    impl RunCgroup for FakeCgroup {
        fn kill_all(&self) -> Boxed<'_, ()> {
            Box::pin(async move { self.0.push("kill".into()) })
        }
        fn remove(&self) -> Boxed<'_, Result<(), CgroupError>> {
            Box::pin(async move {
                self.0.push("remove cgroup".into());
                Ok(())
            })
        }
    }

    fn fakes(log: &Log, fail: Option<&str>) -> Vec<Box<dyn RunMechanism>> {
        [
            "fs",
            "net",
            "sysc",
            "scx",
            "admission",
            "mcp",
            "models",
            "telemetry",
        ]
        .into_iter()
        .map(|name| {
            Box::new(FakeMechanism {
                name,
                log: log.clone(),
                fail: fail == Some(name),
            }) as Box<dyn RunMechanism>
        })
        .collect()
    }

    fn with_run<T>(f: impl FnOnce(&RunCtx<'_>) -> T) -> T {
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let sup = Supervisor::for_test(tx);
        let spec = AgentSpec {
            name: "a".into(),
            tenant: "t".into(),
            latency_class: String::new(),
            exec: None,
            restart: Default::default(),
            budgets: Default::default(),
            sched: Default::default(),
        };
        let text = super::super::ContractText::new(String::new(), "test".into());
        let agent = sup.new_agent(spec.clone(), text, false);
        let main = agent.main_cgroup();
        f(&RunCtx {
            agent: &agent,
            spec: &spec,
            contract: None,
            main: &main,
        })
    }

    fn block_on<F: Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn the_real_list_is_in_preparation_order() {
        // The names tie the real registration to the order the fakes below are tested in.
        let names = [
            "disk",
            "fs",
            "net",
            "sysc",
            "scx",
            "admission",
            "mcp",
            "models",
            "telemetry",
        ];
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let sup = Supervisor::for_test(tx);
        let real: Vec<_> = sup.mechanisms().iter().map(|m| m.name()).collect();
        assert_eq!(real, names);
    }

    #[test]
    fn teardown_kills_removes_then_releases_in_reverse() {
        let log = Log::default();
        let ms = fakes(&log, None);
        let prepared = with_run(|run| block_on(prepare_all(&ms, run))).unwrap();
        assert_eq!(
            prepared.notes,
            [
                "fs",
                "net",
                "sysc",
                "scx",
                "admission",
                "mcp",
                "models",
                "telemetry"
            ]
        );
        block_on(end_run(&FakeCgroup(log.clone()), &ms, "t/a")).unwrap();
        assert_eq!(
            log.take(),
            [
                "prepare fs",
                "prepare net",
                "prepare sysc",
                "prepare scx",
                "prepare admission",
                "prepare mcp",
                "prepare models",
                "prepare telemetry",
                "kill",
                "remove cgroup",
                "release telemetry",
                "release models",
                "release mcp",
                "release admission",
                "release scx",
                "release sysc",
                "release net",
                "release fs",
            ]
        );
    }

    #[test]
    fn a_failed_prepare_stops_and_the_teardown_releases_everything() {
        let log = Log::default();
        let ms = fakes(&log, Some("sysc"));
        let err = with_run(|run| block_on(prepare_all(&ms, run))).unwrap_err();
        assert!(
            matches!(&err, Error::Kernel(m) if m == "sysc failed"),
            "{err:?}"
        );
        block_on(end_run(&FakeCgroup(log.clone()), &ms, "t/a")).unwrap();
        let got = log.take();
        assert_eq!(
            got[..3],
            ["prepare fs", "prepare net", "prepare sysc"],
            "nothing after the failed step is prepared"
        );
        assert_eq!(
            got[3..],
            [
                "kill",
                "remove cgroup",
                "release telemetry",
                "release models",
                "release mcp",
                "release admission",
                "release scx",
                "release sysc",
                "release net",
                "release fs",
            ]
        );
    }

    #[test]
    fn adoption_visits_every_mechanism_in_order() {
        let log = Log::default();
        let ms = fakes(&log, None);
        with_run(|run| block_on(adopt_all(&ms, run)));
        assert_eq!(
            log.take(),
            [
                "adopt fs",
                "adopt net",
                "adopt sysc",
                "adopt scx",
                "adopt admission",
                "adopt mcp",
                "adopt models",
                "adopt telemetry"
            ]
        );
    }
}
