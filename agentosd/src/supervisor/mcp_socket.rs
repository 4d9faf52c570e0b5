//! The supervisor's side of the agents' MCP sockets (ipc/, mcp/): a socket per agent made before
//! it starts and handed to it, forgotten when it stops, made again when a restarted daemon
//! re-adopts it. A child module of `supervisor`, so it sees the agents' private state.

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;

use super::mechanism::{Mechanism, Prepared, RunCtx};
use super::{Agent, Error, Supervisor};
use crate::ipc::{AgentRef, IpcError, IpcServer};
use crate::mcp::{CallerCtx, Callers, McpService, Policy};
use crate::sandbox::identity;

/// What the daemon set up for tool calls (see [`Supervisor::set_mcp`]).
pub struct McpHooks {
    pub ipc: Arc<IpcServer>,
    pub service: Arc<McpService>,
    /// Sockets live in `RUN_DIR/agents/<tenant>/<name>.sock`.
    pub run_dir: PathBuf,
}

/// What the agent's process gets: `AGENTOS_SOCKET` (a path to connect to) and
/// `AGENTOS_SOCKET_FD` (an inherited connected socket).
pub struct AgentSocket {
    pub path: PathBuf,
    pub inherited: OwnedFd,
}

/// Why an agent's MCP socket could not be made.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    #[error(transparent)]
    Identity(#[from] identity::IdentityError),
    #[error(transparent)]
    Dir(#[from] crate::safe_fs::SafeFsError),
    #[error("cgroup {} is not under the cgroup2 mount {}", cgroup.display(), mount.display())]
    NotUnderMount { cgroup: PathBuf, mount: PathBuf },
    #[error("{}: {source}", path.display())]
    Listen {
        path: PathBuf,
        #[source]
        source: IpcError,
    },
    #[error("pair: {0}")]
    Pair(#[source] IpcError),
}

/// `RUN_DIR/agents/<tenant>`, each 0711 whatever the umask (systemd's UMask=0027 would make
/// them 0750): an agent's uid may walk to its own socket but list nobody's.
pub(super) fn socket_dirs(run_dir: &std::path::Path, tenant: &str) -> Result<(), SocketError> {
    // On fds from RUN_DIR down (safe_fs): no link in `agents/<tenant>` is followed.
    let root = crate::safe_fs::Dir::open_root(run_dir)?;
    // RUN_DIR itself only needs o+x; leave a stricter or wider mode the operator chose.
    let mode = root.stat()?.st_mode & 0o7777;
    if mode | 0o011 != mode {
        root.chmod(mode | 0o011)?;
    }
    let agents = root.mkdir("agents", 0o711)?;
    agents.chmod(0o711)?;
    let tenant_dir = agents.mkdir(tenant, 0o711)?;
    tenant_dir.chmod(0o711)?;
    Ok(())
}

impl Supervisor {
    /// Serve the agents' MCP sockets with `ipc` and `service` (the daemon sets this once).
    pub fn set_mcp(&self, hooks: McpHooks) {
        let _ = self.mcp.set(hooks);
    }

    /// The MCP service, when the daemon set one up.
    pub fn mcp(&self) -> Option<&McpHooks> {
        self.mcp.get()
    }

    /// The path of an agent's socket.
    pub fn socket_path(&self, tenant: &str, name: &str) -> Option<PathBuf> {
        self.mcp.get().map(|m| {
            m.run_dir
                .join("agents")
                .join(tenant)
                .join(format!("{name}.sock"))
        })
    }

    pub(super) fn agent_ref(&self, agent: &Agent) -> Result<AgentRef, SocketError> {
        let uid = identity::uid_for(&self.cfg.state_dir, &agent.id)?;
        // The agent is the processes in its `main` leaf (and below): its tools and MCP servers
        // live beside it in `tools/`, under the same budgets, and must not pass as the agent
        // on its socket.
        let main = agent.main_cgroup();
        let rel = main
            .path()
            .strip_prefix(&self.cgroup_mount)
            .map(|p| PathBuf::from("/").join(p))
            .map_err(|_| SocketError::NotUnderMount {
                cgroup: main.path().to_path_buf(),
                mount: self.cgroup_mount.clone(),
            })?;
        Ok(AgentRef {
            id: agent.id.clone(),
            cgroup: rel,
            cgroup_dir: main.path().to_path_buf(),
            uid,
            gid: uid,
        })
    }

    /// Make the agent's socket (listening at its path) and an inherited connection, before its
    /// first process exists. `None` when the daemon serves no tools.
    pub(super) fn mcp_open(&self, agent: &Agent) -> Result<Option<AgentSocket>, Error> {
        let Some(m) = self.mcp.get() else {
            return Ok(None);
        };
        let Some(path) = self.socket_path(&agent.tenant, &agent.name) else {
            return Ok(None);
        };
        let socket_error = |source| Error::McpSocket {
            agent: agent.id.clone(),
            source,
        };
        let r = self.agent_ref(agent).map_err(socket_error)?;
        socket_dirs(&m.run_dir, &agent.tenant).map_err(socket_error)?;
        m.ipc.listen(&r, &path).map_err(|source| {
            socket_error(SocketError::Listen {
                path: path.clone(),
                source,
            })
        })?;
        let inherited = m
            .ipc
            .pair(&r)
            .map_err(|e| socket_error(SocketError::Pair(e)))?;
        Ok(Some(AgentSocket { path, inherited }))
    }

    /// A re-adopted agent gets its socket path back (its inherited connection died with the
    /// previous daemon; clients reconnect to `AGENTOS_SOCKET`).
    pub(super) fn mcp_relisten(&self, agent: &Agent) -> Option<String> {
        let m = self.mcp.get()?;
        let path = self.socket_path(&agent.tenant, &agent.name)?;
        let r = match self.agent_ref(agent) {
            Ok(r) => r,
            Err(e) => return Some(format!("MCP socket not restored: {e}")),
        };
        if let Err(e) = socket_dirs(&m.run_dir, &agent.tenant) {
            return Some(format!("MCP socket not restored: {e}"));
        }
        m.ipc
            .listen(&r, &path)
            .err()
            .map(|e| format!("MCP socket {} not restored: {e}", path.display()))
    }

    /// The agent stopped: close its socket and connections, withdraw its consent requests and
    /// stop its tool servers.
    pub(super) fn mcp_forget(&self, agent_id: &str) {
        let Some(m) = self.mcp.get() else {
            return;
        };
        m.ipc.forget(agent_id);
        m.service.consents().withdraw_agent(agent_id);
        let tools = m.service.tools().clone();
        let id = agent_id.to_string();
        if let Ok(h) = tokio::runtime::Handle::try_current() {
            h.spawn(async move { tools.forget(&id).await });
        }
    }

    /// What `agent`'s contract says about tool capabilities (None: no parsed contract).
    pub fn tool_policy(&self, agent: &super::Agent) -> Option<crate::mcp::Policy> {
        super::lock(&agent.inner)
            .parsed
            .as_ref()
            .map(|c| crate::mcp::Policy::from_contract(c))
    }

    /// The gate's view of the registry (see [`Callers`]): a weak handle, so the MCP service
    /// the supervisor holds does not hold the supervisor (no `Arc` cycle).
    pub fn mcp_callers(self: &Arc<Self>) -> Arc<dyn Callers> {
        Arc::new(CallersOf(Arc::downgrade(self)))
    }

    /// Who is calling, for the gate: from the agent's contract, read once per connection.
    pub fn mcp_caller(&self, agent_id: &str) -> Result<CallerCtx, String> {
        let agent = self.find(agent_id).map_err(|e| e.to_string())?;
        if !agent.state().is_active() {
            return Err(format!("agent {agent_id} is {}", agent.state().as_str()));
        }
        let contract = super::start::agent_contract(&agent)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| {
                format!("agent {agent_id} was started without a contract, so it has no tools")
            })?;
        let uid = identity::uid_for(&self.cfg.state_dir, &agent.id).map_err(|e| e.to_string())?;
        let home = identity::home_dir(&self.cfg.state_dir, &agent.tenant, &agent.name);
        Ok(CallerCtx {
            id: agent.id.clone(),
            tenant: agent.tenant.clone(),
            name: agent.name.clone(),
            policy: Policy::from_contract(&contract),
            caller: crate::tools::Caller::from_contract(&contract, &home, uid, uid),
        })
    }
}

/// The agent's MCP socket: listening at its path and an inherited connection, made before its
/// first process (`AGENTOS_SOCKET`, `AGENTOS_SOCKET_FD`); closed with its tool servers and consent
/// requests when the run ends.
pub(super) struct McpSocket<'s>(pub &'s Supervisor);

impl Mechanism for McpSocket<'_> {
    fn name(&self) -> &'static str {
        "mcp"
    }

    fn prepare(&self, run: &RunCtx<'_>, out: &mut Prepared) -> Result<(), Error> {
        if let Some(s) = self.0.mcp_open(run.agent)? {
            out.allow_unix_dir_of(&s.path);
            out.env
                .push((agentos_api::SOCKET_ENV.into(), s.path.display().to_string()));
            out.env.push((
                agentos_api::SOCKET_FD_ENV.into(),
                std::os::fd::AsRawFd::as_raw_fd(&s.inherited).to_string(),
            ));
            out.inherit_fd = Some(s.inherited);
        }
        Ok(())
    }

    fn adopt(&self, run: &RunCtx<'_>) -> Vec<String> {
        self.0.mcp_relisten(run.agent).into_iter().collect()
    }

    fn release(&self, agent_id: &str) {
        self.0.mcp_forget(agent_id);
    }
}

/// [`Callers`] answered by the supervisor while it lives.
struct CallersOf(std::sync::Weak<Supervisor>);

impl Callers for CallersOf {
    fn caller(&self, agent_id: &str) -> Result<CallerCtx, String> {
        let sup = self
            .0
            .upgrade()
            .ok_or_else(|| "agentosd is shutting down".to_string())?;
        sup.mcp_caller(agent_id)
    }

    fn note(&self, agent_id: &str, text: &str) {
        if let Some(sup) = self.0.upgrade()
            && let Ok(agent) = sup.find(agent_id)
        {
            sup.note(&agent, text, false);
        }
    }
}
