//! The supervisor's side of the agents' model sockets (models/): a socket per agent made before
//! it starts, served by the gateway, forgotten when the run ends, made again when a restarted
//! daemon re-adopts the agent. Only when the daemon has model backends configured.

use std::path::PathBuf;
use std::sync::Arc;

use super::mechanism::{Mechanism, Prepared, RunCtx};
use super::{Agent, Error, Supervisor};
use crate::models::{Access, Gateway};

/// What the daemon set up for model calls (see [`Supervisor::set_models`]).
pub struct ModelHooks {
    pub gateway: Arc<Gateway>,
    /// Sockets live in `RUN_DIR/agents/<tenant>/<name>.models.sock`.
    pub run_dir: PathBuf,
}

impl Supervisor {
    /// Serve the agents' model sockets with `gateway` (the daemon sets this once).
    pub fn set_models(&self, hooks: ModelHooks) {
        let _ = self.models.set(hooks);
    }

    /// The model gateway, when the daemon has one.
    pub fn models(&self) -> Option<&ModelHooks> {
        self.models.get()
    }

    /// Listen on the agent's model socket and serve it; the socket's path.
    fn models_open(
        &self,
        agent: &Agent,
        contract: &contracts::Contract,
    ) -> Result<PathBuf, String> {
        let m = self.models.get().ok_or("no model gateway")?;
        let path = crate::models::socket_path(&m.run_dir, &agent.tenant, &agent.name);
        let who = self.agent_ref(agent).map_err(|e| e.to_string())?;
        super::mcp_socket::socket_dirs(&m.run_dir, &agent.tenant).map_err(|e| e.to_string())?;
        let fd = crate::ipc::listen_socket(&who, &path)
            .map_err(|e| format!("model socket {}: {e}", path.display()))?;
        let binding = self.audit_trail().and_then(|t| t.binding(&agent.id));
        m.gateway
            .serve(
                who,
                &agent.tenant,
                &agent.name,
                Access::from_contract(contract),
                binding,
                fd,
            )
            .map_err(|e| format!("model socket {}: {e}", path.display()))?;
        Ok(path)
    }
}

/// The agent's model socket (`AGENTOS_MODELS_SOCKET`), for agents started from a contract on a
/// daemon with model backends.
pub(super) struct ModelSocket<'s>(pub &'s Supervisor);

impl Mechanism for ModelSocket<'_> {
    fn name(&self) -> &'static str {
        "models"
    }

    fn prepare(&self, run: &RunCtx<'_>, out: &mut Prepared) -> Result<(), Error> {
        let (Some(_), Some(contract)) = (self.0.models.get(), run.contract) else {
            return Ok(());
        };
        match self.0.models_open(run.agent, contract) {
            Ok(path) => out
                .env
                .push((crate::models::SOCKET_ENV.into(), path.display().to_string())),
            Err(e) => {
                return Err(Error::Unenforceable(format!(
                    "{}: the model gateway could not serve it: {e}",
                    run.agent.id
                )));
            }
        }
        Ok(())
    }

    fn adopt(&self, run: &RunCtx<'_>) -> Vec<String> {
        let (Some(_), Some(contract)) = (self.0.models.get(), run.contract) else {
            return Vec::new();
        };
        match self.0.models_open(run.agent, contract) {
            Ok(_) => Vec::new(),
            Err(e) => vec![format!("model socket not restored: {e}")],
        }
    }

    fn release(&self, agent_id: &str) {
        if let Some(m) = self.0.models.get() {
            m.gateway.forget(agent_id);
            if let Ok(agent) = self.0.find(agent_id) {
                let path = crate::models::socket_path(&m.run_dir, &agent.tenant, &agent.name);
                // Beneath the root-owned tenant directory: unlinking a name there cannot follow
                // an agent's link.
                let _ = std::fs::remove_file(path);
            }
        }
    }
}
