//! Changed contracts, the systemd way: `daemon-reload` re-reads the agents directory, `reload`
//! takes a new contract for one agent, `enable`/`disable` put an agent's contract in the agents
//! directory or take it out. A contract loaded for a running agent waits (`pending`) and applies
//! when the agent next starts (restart, automatic restart, start), as a changed unit file does
//! after `systemctl daemon-reload`; `reload` restarts a running agent at once.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustix::fs::{Mode, OFlags};

use super::{Agent, ContractText, Error, Supervisor, lock};
use crate::spec::AgentSpec;

/// What `daemon-reload` did for one file of the agents directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reloaded {
    pub file: PathBuf,
    pub what: String,
}

impl Supervisor {
    /// Take `text` as `agent`'s contract (it must name the same tenant and agent): applied now
    /// if the agent is not running, else at its next start; `restart`: restart a running agent
    /// so that it applies now. Returns whether the agent was restarted.
    pub async fn reload_contract(
        self: &Arc<Self>,
        agent: &Arc<Agent>,
        text: &str,
        origin: &str,
        restart: bool,
    ) -> Result<bool, Error> {
        let contract = contracts::parse_contract(text, origin).map_err(Error::from)?;
        let spec = AgentSpec::from_contract(&contract);
        if spec.id() != agent.id {
            return Err(Error::InvalidContract(format!(
                "{origin}: the contract is for {}, not {}: start it instead",
                spec.id(),
                agent.id
            )));
        }
        if spec.exec.is_none() {
            return Err(Error::InvalidContract(format!(
                "{origin}: contract {} has no exec: nothing to run",
                agent.id
            )));
        }
        let ct = ContractText {
            text: text.to_string(),
            origin: origin.to_string(),
            parsed: Some(Arc::new(contract)),
        };
        // A ruleset built ahead for the old contract is not served to the new one (its key
        // differs too); dropped now rather than at the next start.
        crate::sandbox::ruleset_pool::forget(&agent.id);
        let running = {
            let _op = agent.op.lock().await;
            let mut i = lock(&agent.inner);
            i.contract_loaded_us = super::now_us();
            if i.state.is_active() {
                i.pending = Some((spec, ct));
                true
            } else {
                i.pending = None;
                apply(&mut i, spec, ct);
                false
            }
        };
        self.persist(agent);
        self.audit_event(
            agent,
            "reloaded",
            None,
            serde_json::json!({"origin": origin, "applies": if running && !restart { "at next start" } else { "now" }}),
        );
        self.changed(agent);
        if running && restart {
            self.restart(agent).await?;
            return Ok(true);
        }
        Ok(false)
    }

    /// `daemon-reload`: read every contract of the agents directory again. A known agent whose
    /// file changed gets it as its contract (pending while it runs); new files are loaded but
    /// not started (as systemd's daemon-reload does not start units); agents whose file is gone
    /// are no longer enabled. Nothing running is stopped or restarted.
    pub async fn reload_agents_dir(self: &Arc<Self>) -> Vec<Reloaded> {
        let mut out = Vec::new();
        let mut seen = Vec::new();
        for f in self.agents_dir_files() {
            // The agents directory is the daemon's configuration (root's), read as the daemon.
            let Ok(text) = std::fs::read_to_string(&f) else {
                continue;
            };
            let origin = f.display().to_string();
            let contract = match contracts::parse_contract(&text, &origin) {
                Ok(c) => c,
                Err(e) => {
                    out.push(Reloaded {
                        file: f.clone(),
                        what: format!("not loaded: {e}"),
                    });
                    continue;
                }
            };
            let id = format!("{}/{}", contract.tenant(), contract.name());
            seen.push(id.clone());
            let Ok(agent) = self.find(&id) else {
                out.push(Reloaded {
                    file: f.clone(),
                    what: format!("{id}: new, not started (agentctl start {id})"),
                });
                continue;
            };
            lock(&agent.inner).enabled = true;
            let (same, running) = {
                let i = lock(&agent.inner);
                let current = i.pending.as_ref().map_or(&i.contract, |(_, c)| &c.text);
                (*current == text, i.state.is_active())
            };
            if same {
                continue;
            }
            match self.reload_contract(&agent, &text, &origin, false).await {
                Ok(_) => out.push(Reloaded {
                    file: f.clone(),
                    what: if running {
                        format!(
                            "{id}: changed; applies when it next starts (agentctl restart {id})"
                        )
                    } else {
                        format!("{id}: changed; loaded")
                    },
                }),
                Err(e) => out.push(Reloaded {
                    file: f.clone(),
                    what: format!("{id}: not loaded: {e}"),
                }),
            }
        }
        for a in self.agents() {
            if !seen.contains(&a.id) && !self.enabled_now(&a) {
                lock(&a.inner).enabled = false;
            }
        }
        out
    }

    /// The contract files of the agents directory (`*.yaml`, `*.yml`), sorted.
    pub(super) fn agents_dir_files(&self) -> Vec<PathBuf> {
        let Ok(entries) = std::fs::read_dir(&self.cfg.agents_dir) else {
            return Vec::new();
        };
        let mut files: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                matches!(
                    p.extension().and_then(|e| e.to_str()),
                    Some("yaml") | Some("yml")
                )
            })
            .collect();
        files.sort();
        files
    }

    /// Whether a file of the agents directory holds `agent`'s contract now: its origin, when
    /// that is in the agents directory and still there, or the file `enable` writes.
    pub fn enabled_now(&self, agent: &Agent) -> bool {
        let origin = lock(&agent.inner).origin.clone();
        let dir = &self.cfg.agents_dir;
        (Path::new(&origin).starts_with(dir) && Path::new(&origin).is_file())
            || dir
                .join(enable_file_name(&agent.tenant, &agent.name))
                .is_file()
    }

    /// `enable`: write the agent's contract into the agents directory (started at boot from
    /// there). Already enabled: the file it is in. The file is created, never overwritten, and
    /// never through a link.
    pub fn enable(&self, agent: &Arc<Agent>) -> Result<(PathBuf, bool), Error> {
        let (origin, text) = {
            let i = lock(&agent.inner);
            let text = i
                .pending
                .as_ref()
                .map_or(&i.contract, |(_, c)| &c.text)
                .clone();
            (i.origin.clone(), text)
        };
        let dir = &self.cfg.agents_dir;
        if Path::new(&origin).starts_with(dir) && Path::new(&origin).is_file() {
            lock(&agent.inner).enabled = true;
            return Ok((PathBuf::from(origin), false));
        }
        if text.trim().is_empty() {
            return Err(Error::InvalidState(format!(
                "agent {} has no contract text to enable (it was started from a bare spec)",
                agent.id
            )));
        }
        let name = enable_file_name(&agent.tenant, &agent.name);
        let d = crate::safe_fs::Dir::open_root(dir).map_err(|e| Error::Io(e.to_string()))?;
        let fd = d
            .open(
                Path::new(&name),
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW,
                // Root's only: the contract may hold what its author kept from others.
                Mode::from_raw_mode(0o600),
            )
            .map_err(|e| {
                Error::Io(format!(
                    "{}: {e} (a file of that name is there already: remove it or disable the agent it holds)",
                    dir.join(&name).display()
                ))
            })?;
        use std::io::Write;
        std::fs::File::from(fd)
            .write_all(text.as_bytes())
            .map_err(|e| Error::Io(format!("{}: {e}", dir.join(&name).display())))?;
        let path = dir.join(&name);
        {
            let mut i = lock(&agent.inner);
            i.enabled = true;
            i.origin = path.display().to_string();
            // The file was written from this contract: not "changed on disk".
            i.contract_loaded_us = super::now_us();
        }
        self.persist(agent);
        self.audit_event(
            agent,
            "enabled",
            None,
            serde_json::json!({"file": path.display().to_string()}),
        );
        self.changed(agent);
        Ok((path, true))
    }

    /// `disable`: remove the agents directory's files that hold `agent`'s contract (its origin
    /// there, and the file `enable` writes). Returns the files removed.
    pub fn disable(&self, agent: &Arc<Agent>) -> Result<Vec<PathBuf>, Error> {
        let dir = &self.cfg.agents_dir;
        let origin = lock(&agent.inner).origin.clone();
        let mut removed = Vec::new();
        let d = match crate::safe_fs::Dir::open_root(dir) {
            Ok(d) => d,
            Err(e) if e.is_not_found() => return Ok(removed),
            Err(e) => return Err(Error::Io(e.to_string())),
        };
        let mut names = vec![enable_file_name(&agent.tenant, &agent.name)];
        if let Ok(rel) = Path::new(&origin).strip_prefix(dir)
            && let Some(n) = rel.to_str()
            && !n.contains('/')
        {
            names.push(n.to_string());
        }
        names.dedup();
        for n in names {
            let p = dir.join(&n);
            // Only a file that holds this agent's contract.
            let holds = std::fs::read_to_string(&p)
                .ok()
                .and_then(|t| contracts::parse_contract(&t, &n).ok())
                .is_some_and(|c| format!("{}/{}", c.tenant(), c.name()) == agent.id);
            if holds {
                d.unlink(&n).map_err(|e| Error::Io(e.to_string()))?;
                removed.push(p);
            }
        }
        lock(&agent.inner).enabled = false;
        self.persist(agent);
        if !removed.is_empty() {
            self.audit_event(
                agent,
                "disabled",
                None,
                serde_json::json!({"files": removed.iter().map(|p| p.display().to_string()).collect::<Vec<_>>()}),
            );
        }
        self.changed(agent);
        Ok(removed)
    }

    /// The contract the agent runs with (or last ran with), its origin, and the one waiting to
    /// apply at its next start, if any.
    pub fn contract_of(&self, agent: &Agent) -> (String, String, Option<(String, String)>) {
        let i = lock(&agent.inner);
        (
            i.contract.clone(),
            i.origin.clone(),
            i.pending
                .as_ref()
                .map(|(_, c)| (c.text.clone(), c.origin.clone())),
        )
    }
}

/// The file `enable` writes for an agent: `NAME.yaml` for tenant `default`, else
/// `TENANT.NAME.yaml`.
pub fn enable_file_name(tenant: &str, name: &str) -> String {
    if tenant == "default" {
        format!("{name}.yaml")
    } else {
        format!("{tenant}.{name}.yaml")
    }
}

/// Make `contract` the agent's (spec, text, origin, parsed).
pub(super) fn apply(i: &mut super::agent::Inner, spec: AgentSpec, c: ContractText) {
    i.spec = spec;
    i.contract = c.text;
    i.origin = c.origin;
    i.parsed = c.parsed;
}
