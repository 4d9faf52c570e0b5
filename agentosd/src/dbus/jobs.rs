//! Jobs, as systemd has them for `--no-block`: `QueueJob(verb, agent)` answers at once with a
//! job object (`/org/agentos1/job/N`, interface `org.agentos1.Job`) while the stop, start,
//! restart, freeze or thaw runs; `JobRemoved` says how it ended. So a `busctl` call never
//! waits out an agent's stop timeout. One job per agent at a time; at most [`MAX_JOBS`] in all.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use zbus::object_server::SignalEmitter;
use zbus::{Connection, OwnedObjectPath, interface};

use super::gate::Gate;
use super::manager::Manager;
use super::signals::Subscribers;
use super::{Result, as_caller, introspect};
use crate::authz::Caller;
use crate::supervisor::{Agent, Supervisor};
use agentos_api::{ApiError, MANAGER_PATH};

/// Jobs running at once, over all agents.
pub const MAX_JOBS: usize = 1024;

/// What a job does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Start,
    Stop,
    Restart,
    Freeze,
    Thaw,
}

impl Verb {
    pub fn parse(s: &str) -> Option<Verb> {
        Some(match s {
            "start" => Verb::Start,
            "stop" => Verb::Stop,
            "restart" => Verb::Restart,
            "freeze" => Verb::Freeze,
            "thaw" => Verb::Thaw,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Start => "start",
            Verb::Stop => "stop",
            Verb::Restart => "restart",
            Verb::Freeze => "freeze",
            Verb::Thaw => "thaw",
        }
    }
}

/// One running job.
#[derive(Debug, Clone)]
pub struct Job {
    pub id: u32,
    pub agent: String,
    pub tenant: String,
    pub verb: Verb,
    pub path: String,
}

/// The jobs running now.
#[derive(Debug, Default)]
pub struct Jobs {
    next: Mutex<u32>,
    running: Mutex<BTreeMap<u32, Job>>,
}

impl Jobs {
    fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
        m.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new job for `agent`, unless it has one running (that one is the error) or too many
    /// run.
    fn add(&self, agent: &Agent, verb: Verb) -> Result<Job> {
        let mut running = Self::lock(&self.running);
        if let Some(j) = running.values().find(|j| j.agent == agent.id) {
            return Err(ApiError::InvalidState(format!(
                "agent {} has job {} ({} {}) running; wait for its JobRemoved",
                agent.id,
                j.id,
                j.verb.as_str(),
                j.path
            )));
        }
        if running.len() >= MAX_JOBS {
            return Err(ApiError::Unavailable(format!(
                "{MAX_JOBS} jobs are running; try again when some have ended"
            )));
        }
        let id = {
            let mut n = Self::lock(&self.next);
            *n += 1;
            *n
        };
        let job = Job {
            id,
            agent: agent.id.clone(),
            tenant: agent.tenant.clone(),
            verb,
            path: format!("/org/agentos1/job/{id}"),
        };
        running.insert(id, job.clone());
        Ok(job)
    }

    fn remove(&self, id: u32) {
        Self::lock(&self.running).remove(&id);
    }

    /// The running jobs (`ListJobs` keeps those the caller may read).
    pub fn list(&self) -> Vec<Job> {
        Self::lock(&self.running).values().cloned().collect()
    }
}

/// The job's object.
pub struct JobObject {
    job: Job,
}

#[interface(name = "org.agentos1.Job")]
impl JobObject {
    #[zbus(property, name = "Id")]
    fn id(&self) -> u32 {
        self.job.id
    }

    #[zbus(property, name = "Agent")]
    fn agent(&self) -> String {
        self.job.agent.clone()
    }

    #[zbus(property, name = "JobType")]
    fn job_type(&self) -> String {
        self.job.verb.as_str().to_string()
    }

    #[zbus(property, name = "State")]
    fn state(&self) -> String {
        "running".to_string()
    }
}

/// Everything a queued job needs once the call that queued it has answered.
#[derive(Clone)]
pub struct Queue {
    pub conn: Connection,
    pub sup: Arc<Supervisor>,
    pub gate: Gate,
    pub subs: Arc<Subscribers>,
    pub jobs: Arc<Jobs>,
}

impl Queue {
    /// Register the job, announce it (`JobNew`), run it in the background and return its
    /// object path; `JobRemoved` (to subscribers who may read the agent) says how it ended.
    pub async fn queue(
        &self,
        caller: Caller,
        agent: Arc<Agent>,
        verb: Verb,
    ) -> Result<OwnedObjectPath> {
        let job = self.jobs.add(&agent, verb)?;
        let server = self.conn.object_server();
        let path = OwnedObjectPath::try_from(job.path.clone())
            .map_err(|e| ApiError::InvalidArgs(e.to_string()))?;
        let _ = server
            .at(job.path.as_str(), JobObject { job: job.clone() })
            .await;
        introspect::install(server, job.path.as_str()).await;
        introspect::install(server, "/org/agentos1/job").await;
        for em in self.readers(&job.tenant).await {
            let _ = Manager::job_new(&em, job.id, path.as_ref(), &job.agent).await;
        }
        let q = self.clone();
        let done_path = path.clone();
        tokio::spawn(async move {
            let sup = &q.sup;
            let r = match verb {
                Verb::Start => as_caller(&caller, sup.start_existing(&agent)).await,
                Verb::Stop => as_caller(&caller, sup.stop(&agent)).await,
                Verb::Restart => as_caller(&caller, sup.restart(&agent)).await,
                Verb::Freeze => as_caller(&caller, sup.freeze(&agent)).await,
                Verb::Thaw => as_caller(&caller, sup.thaw(&agent)).await,
            };
            let result = match r {
                Ok(()) => "done".to_string(),
                Err(e) => format!("failed: {e}"),
            };
            q.jobs.remove(job.id);
            let _ = q
                .conn
                .object_server()
                .remove::<JobObject, _>(job.path.as_str())
                .await;
            for em in q.readers(&job.tenant).await {
                let _ = Manager::job_removed(&em, job.id, done_path.as_ref(), &job.agent, &result)
                    .await;
            }
        });
        Ok(path)
    }

    async fn readers(&self, tenant: &str) -> Vec<SignalEmitter<'static>> {
        self.subs
            .readers(&self.conn, &self.gate, MANAGER_PATH, tenant)
            .await
    }
}
