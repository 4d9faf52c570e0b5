//! The supervisor's side of the agents' model sockets (models/): a socket per agent made before
//! it starts, served by the gateway, forgotten when the run ends, made again when a restarted
//! daemon re-adopts the agent. Only when the daemon has model backends configured.

use std::path::PathBuf;
use std::sync::Arc;

use super::mechanism::{Mechanism, Prepared, RunCtx};
use super::{Agent, Error, Supervisor, lock};
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

    /// Whether the gateway also serves the agent on a loopback port in a network namespace
    /// made for it (models/tcp.rs): a daemon with model backends, an agent started from a
    /// contract that has its own network namespace (no network grants).
    pub(super) fn gateway_port(&self, contract: Option<&contracts::Contract>) -> bool {
        let Some(c) = contract else { return false };
        self.models.get().is_some()
            && !c
                .capabilities()
                .iter()
                .any(|cap| cap.name == "net.connect" || cap.name == "net.bind")
    }

    /// Whether the gateway also serves the agent on a port of the host's loopback: a daemon with
    /// model backends, an agent started from a contract with network grants (it runs in the
    /// host's network namespace; peers are identified with sock_diag, models/peer_tcp.rs).
    pub(super) fn gateway_host_port(&self, contract: Option<&contracts::Contract>) -> bool {
        contract.is_some() && self.models.get().is_some() && !self.gateway_port(contract)
    }

    /// The agent's port on the host's loopback (bound now if needed), when it gets one.
    pub(super) fn model_host_port(
        &self,
        agent_id: &str,
        contract: Option<&contracts::Contract>,
    ) -> Result<Option<u16>, String> {
        if !self.gateway_host_port(contract) {
            return Ok(None);
        }
        let m = self.models.get().ok_or("no gateway")?;
        m.gateway
            .host_port(agent_id)
            .map(Some)
            .map_err(|e| format!("its port on 127.0.0.1: {e}"))
    }

    /// Serve the agent on its TCP port, when it gets one: in the network namespace made for it
    /// now (no network grants; `adopting`: the one it lives in, entered through its pidfd), or
    /// on the host's loopback (grants).
    fn models_port(
        &self,
        run: &RunCtx<'_>,
        contract: &contracts::Contract,
        adopting: bool,
    ) -> Result<Option<ModelPort>, String> {
        let m = self.models.get().ok_or("no model gateway")?;
        let id = &run.agent.id;
        if self.gateway_port(Some(contract)) {
            let (netns, listener) = if adopting {
                let pidfd = lock(&run.agent.inner)
                    .pidfd
                    .clone()
                    .ok_or("no pidfd of the agent's main process")?;
                (None, crate::models::tcp::listen_in(&pidfd))
            } else {
                match crate::models::tcp::new_namespace() {
                    Ok((ns, l)) => (Some(ns), Ok(l)),
                    Err(e) => (None, Err(e)),
                }
            };
            let listener = listener.map_err(|e| format!("its network namespace: {e}"))?;
            m.gateway
                .serve_tcp(id, listener)
                .map_err(|e| e.to_string())?;
            return Ok(Some(ModelPort {
                url: crate::models::tcp::base_url(),
                netns,
                host_port: None,
            }));
        }
        let Some(port) = self.model_host_port(id, Some(contract))? else {
            return Ok(None);
        };
        m.gateway
            .serve_host_port(id, run.main.path().to_path_buf())
            .map_err(|e| e.to_string())?;
        Ok(Some(ModelPort {
            url: format!("http://127.0.0.1:{port}/v1"),
            netns: None,
            host_port: Some(port),
        }))
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

/// The agent's TCP way to the gateway (`OPENAI_BASE_URL`).
struct ModelPort {
    url: String,
    /// The namespace made for it, which its first process joins.
    netns: Option<std::os::fd::OwnedFd>,
    /// Its port on the host's loopback, which its sandbox allows.
    host_port: Option<u16>,
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
        let refuse = |e: String| {
            Error::Unenforceable(format!(
                "{}: the model gateway could not serve it: {e}",
                run.agent.id
            ))
        };
        let path = self.0.models_open(run.agent, contract).map_err(refuse)?;
        out.allow_unix_dir_of(&path);
        out.env
            .push((crate::models::SOCKET_ENV.into(), path.display().to_string()));
        if let Some(port) = self.0.models_port(run, contract, false).map_err(refuse)? {
            out.netns = port.netns;
            out.model_port = port.host_port;
            // The usual SDKs need no change; the key is a placeholder (the daemon holds the
            // backends' keys), set after the contract's env so none of its own leaks in.
            out.env.push(("OPENAI_BASE_URL".into(), port.url));
            out.env.push(("OPENAI_API_KEY".into(), "agentos".into()));
        }
        Ok(())
    }

    fn adopt(&self, run: &RunCtx<'_>) -> Vec<String> {
        let (Some(_), Some(contract)) = (self.0.models.get(), run.contract) else {
            return Vec::new();
        };
        if let Err(e) = self.0.models_open(run.agent, contract) {
            return vec![format!("model socket not restored: {e}")];
        }
        match self.0.models_port(run, contract, true) {
            Ok(_) => Vec::new(),
            Err(e) => vec![format!("model port not restored: {e}")],
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
