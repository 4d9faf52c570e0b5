//! One object per agent, interface `org.agentos1.Agent`.

use std::sync::Arc;

use zbus::message::Header;
use zbus::object_server::ObjectServer;
use zbus::{Connection, interface};

use super::gate::gate_of;
use super::{Result, as_caller};
use crate::authz::{Action, Caller, Scope};
use crate::supervisor::{self, Agent, Supervisor};

/// One agent's object. Properties read live values (cgroup files) on every Get.
pub struct AgentObject {
    pub(super) sup: Arc<Supervisor>,
    pub(super) agent: Arc<Agent>,
}

impl AgentObject {
    async fn authorize(
        &self,
        server: &ObjectServer,
        hdr: &Header<'_>,
        conn: &Connection,
        method: &str,
    ) -> Result<(Caller, Arc<Agent>)> {
        let gate = gate_of(server).await?;
        let caller = gate
            .check(hdr, conn, method, Action::ManageAgents, Scope::AnyTenant)
            .await?;
        gate.on_agent(caller, method, Action::ManageAgents, self.agent.clone())
            .await
    }

    /// Property reads: `read` for this agent's tenant.
    async fn may_read(
        &self,
        server: &ObjectServer,
        hdr: Option<&Header<'_>>,
        conn: &Connection,
    ) -> zbus::fdo::Result<()> {
        if hdr.is_none() {
            return Ok(()); // zbus reading it for a PropertiesChanged signal
        }
        let gate = gate_of(server)
            .await
            .map_err(|e| zbus::fdo::Error::Failed(e.to_string()))?;
        gate.may_read_property(hdr, conn, Scope::Tenant(&self.agent.tenant))
            .await
    }

    fn status(&self) -> supervisor::AgentStatus {
        self.sup.status_of(&self.agent)
    }
}

#[interface(name = "org.agentos1.Agent")]
impl AgentObject {
    async fn stop(
        &self,
        #[zbus(object_server)] server: &ObjectServer,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<()> {
        let (c, a) = self.authorize(server, &hdr, conn, "Stop").await?;
        as_caller(&c, self.sup.stop(&a)).await
    }

    async fn kill(
        &self,
        whom: String,
        signal: i32,
        #[zbus(object_server)] server: &ObjectServer,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<()> {
        let (c, a) = self.authorize(server, &hdr, conn, "Kill").await?;
        as_caller(&c, self.sup.kill(&a, &whom, signal)).await
    }

    async fn freeze(
        &self,
        #[zbus(object_server)] server: &ObjectServer,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<()> {
        let (c, a) = self.authorize(server, &hdr, conn, "Freeze").await?;
        as_caller(&c, self.sup.freeze(&a)).await
    }

    async fn thaw(
        &self,
        #[zbus(object_server)] server: &ObjectServer,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<()> {
        let (c, a) = self.authorize(server, &hdr, conn, "Thaw").await?;
        as_caller(&c, self.sup.thaw(&a)).await
    }

    async fn restart(
        &self,
        #[zbus(object_server)] server: &ObjectServer,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<()> {
        let (c, a) = self.authorize(server, &hdr, conn, "Restart").await?;
        as_caller(&c, self.sup.restart(&a)).await
    }

    async fn remove(
        &self,
        #[zbus(object_server)] server: &ObjectServer,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<()> {
        let (c, a) = self.authorize(server, &hdr, conn, "Remove").await?;
        as_caller(&c, self.sup.remove(&a)).await
    }

    #[zbus(property, name = "Id")]
    async fn id(
        &self,
        #[zbus(object_server)] server: &ObjectServer,
        #[zbus(header)] hdr: Option<Header<'_>>,
        #[zbus(connection)] conn: &Connection,
    ) -> zbus::fdo::Result<String> {
        self.may_read(server, hdr.as_ref(), conn).await?;
        Ok(self.agent.id.clone())
    }

    #[zbus(property, name = "Name")]
    async fn name(
        &self,
        #[zbus(object_server)] server: &ObjectServer,
        #[zbus(header)] hdr: Option<Header<'_>>,
        #[zbus(connection)] conn: &Connection,
    ) -> zbus::fdo::Result<String> {
        self.may_read(server, hdr.as_ref(), conn).await?;
        Ok(self.agent.name.clone())
    }

    #[zbus(property, name = "Tenant")]
    async fn tenant(
        &self,
        #[zbus(object_server)] server: &ObjectServer,
        #[zbus(header)] hdr: Option<Header<'_>>,
        #[zbus(connection)] conn: &Connection,
    ) -> zbus::fdo::Result<String> {
        self.may_read(server, hdr.as_ref(), conn).await?;
        Ok(self.agent.tenant.clone())
    }

    #[zbus(property, name = "State")]
    async fn state(
        &self,
        #[zbus(object_server)] server: &ObjectServer,
        #[zbus(header)] hdr: Option<Header<'_>>,
        #[zbus(connection)] conn: &Connection,
    ) -> zbus::fdo::Result<String> {
        self.may_read(server, hdr.as_ref(), conn).await?;
        Ok(self.agent.state().as_str().to_string())
    }

    #[zbus(property, name = "Result")]
    async fn result(
        &self,
        #[zbus(object_server)] server: &ObjectServer,
        #[zbus(header)] hdr: Option<Header<'_>>,
        #[zbus(connection)] conn: &Connection,
    ) -> zbus::fdo::Result<String> {
        self.may_read(server, hdr.as_ref(), conn).await?;
        Ok(self.status().result)
    }

    #[zbus(property, name = "MainPID")]
    async fn main_pid(
        &self,
        #[zbus(object_server)] server: &ObjectServer,
        #[zbus(header)] hdr: Option<Header<'_>>,
        #[zbus(connection)] conn: &Connection,
    ) -> zbus::fdo::Result<u32> {
        self.may_read(server, hdr.as_ref(), conn).await?;
        Ok(self.agent.main_pid().unwrap_or(0))
    }

    #[zbus(property, name = "ControlGroup")]
    async fn control_group(
        &self,
        #[zbus(object_server)] server: &ObjectServer,
        #[zbus(header)] hdr: Option<Header<'_>>,
        #[zbus(connection)] conn: &Connection,
    ) -> zbus::fdo::Result<String> {
        self.may_read(server, hdr.as_ref(), conn).await?;
        Ok(self.status().control_group)
    }

    #[zbus(property, name = "ControlGroupPath")]
    async fn control_group_path(
        &self,
        #[zbus(object_server)] server: &ObjectServer,
        #[zbus(header)] hdr: Option<Header<'_>>,
        #[zbus(connection)] conn: &Connection,
    ) -> zbus::fdo::Result<String> {
        self.may_read(server, hdr.as_ref(), conn).await?;
        Ok(self.agent.cgroup.path().display().to_string())
    }

    #[zbus(property, name = "LatencyClass")]
    async fn latency_class(
        &self,
        #[zbus(object_server)] server: &ObjectServer,
        #[zbus(header)] hdr: Option<Header<'_>>,
        #[zbus(connection)] conn: &Connection,
    ) -> zbus::fdo::Result<String> {
        self.may_read(server, hdr.as_ref(), conn).await?;
        Ok(self.agent.spec().latency_class)
    }

    /// HRT: deadline overruns seen in the current run (a sampled lower bound); 0 otherwise.
    #[zbus(property(emits_changed_signal = "false"), name = "DeadlineMisses")]
    async fn deadline_misses(
        &self,
        #[zbus(object_server)] server: &ObjectServer,
        #[zbus(header)] hdr: Option<Header<'_>>,
        #[zbus(connection)] conn: &Connection,
    ) -> zbus::fdo::Result<u64> {
        self.may_read(server, hdr.as_ref(), conn).await?;
        Ok(self.status().deadline_misses.unwrap_or(0))
    }

    /// Kernel denials (cgroup BPF, BPF LSM) reported since the daemon started.
    #[zbus(property(emits_changed_signal = "false"), name = "Denials")]
    async fn denials(
        &self,
        #[zbus(object_server)] server: &ObjectServer,
        #[zbus(header)] hdr: Option<Header<'_>>,
        #[zbus(connection)] conn: &Connection,
    ) -> zbus::fdo::Result<u64> {
        self.may_read(server, hdr.as_ref(), conn).await?;
        Ok(self.status().denials)
    }

    /// MCP `tools/call` requests of the agent since the daemon started.
    #[zbus(property(emits_changed_signal = "false"), name = "ToolCalls")]
    async fn tool_calls(
        &self,
        #[zbus(object_server)] server: &ObjectServer,
        #[zbus(header)] hdr: Option<Header<'_>>,
        #[zbus(connection)] conn: &Connection,
    ) -> zbus::fdo::Result<u64> {
        self.may_read(server, hdr.as_ref(), conn).await?;
        Ok(self.status().tool_calls)
    }

    /// Model tokens (prompt + completion) used through the gateway since the daemon first
    /// served the agent (kept across daemon restarts).
    #[zbus(property(emits_changed_signal = "false"), name = "ModelTokens")]
    async fn model_tokens(
        &self,
        #[zbus(object_server)] server: &ObjectServer,
        #[zbus(header)] hdr: Option<Header<'_>>,
        #[zbus(connection)] conn: &Connection,
    ) -> zbus::fdo::Result<u64> {
        self.may_read(server, hdr.as_ref(), conn).await?;
        Ok(self
            .status()
            .models
            .map(|m| m.prompt_tokens + m.completion_tokens)
            .unwrap_or(0))
    }

    /// What `budgets.tokens` leaves; u64::MAX without a total budget or a model socket.
    #[zbus(property(emits_changed_signal = "false"), name = "ModelTokensLeft")]
    async fn model_tokens_left(
        &self,
        #[zbus(object_server)] server: &ObjectServer,
        #[zbus(header)] hdr: Option<Header<'_>>,
        #[zbus(connection)] conn: &Connection,
    ) -> zbus::fdo::Result<u64> {
        self.may_read(server, hdr.as_ref(), conn).await?;
        Ok(self
            .status()
            .models
            .and_then(|m| m.tokens_left)
            .unwrap_or(u64::MAX))
    }

    /// Of the agent's last model answer: µs to its first token (0: none yet).
    #[zbus(property(emits_changed_signal = "false"), name = "ModelFirstTokenUSec")]
    async fn model_first_token_usec(
        &self,
        #[zbus(object_server)] server: &ObjectServer,
        #[zbus(header)] hdr: Option<Header<'_>>,
        #[zbus(connection)] conn: &Connection,
    ) -> zbus::fdo::Result<u64> {
        self.may_read(server, hdr.as_ref(), conn).await?;
        Ok(self
            .status()
            .models
            .map(|m| m.last_first_token_us)
            .unwrap_or(0))
    }

    /// Of the agent's last model answer: tokens per second after the first.
    #[zbus(property(emits_changed_signal = "false"), name = "ModelTokensPerSec")]
    async fn model_tokens_per_sec(
        &self,
        #[zbus(object_server)] server: &ObjectServer,
        #[zbus(header)] hdr: Option<Header<'_>>,
        #[zbus(connection)] conn: &Connection,
    ) -> zbus::fdo::Result<f64> {
        self.may_read(server, hdr.as_ref(), conn).await?;
        Ok(self
            .status()
            .models
            .map(|m| m.last_tokens_per_sec_milli as f64 / 1000.0)
            .unwrap_or(0.0))
    }

    /// Syscalls entered by the agent's processes in its current (or last) run; u64::MAX when
    /// the daemon does not count them (`agentosd --syscall-counts` is off).
    #[zbus(property(emits_changed_signal = "false"), name = "Syscalls")]
    async fn syscalls(
        &self,
        #[zbus(object_server)] server: &ObjectServer,
        #[zbus(header)] hdr: Option<Header<'_>>,
        #[zbus(connection)] conn: &Connection,
    ) -> zbus::fdo::Result<u64> {
        self.may_read(server, hdr.as_ref(), conn).await?;
        Ok(self.status().syscalls.unwrap_or(u64::MAX))
    }

    /// CPU time in ns (`cpu.stat usage_usec`); u64::MAX when unknown, like systemd.
    #[zbus(property(emits_changed_signal = "false"), name = "CPUUsageNSec")]
    async fn cpu_usage_nsec(
        &self,
        #[zbus(object_server)] server: &ObjectServer,
        #[zbus(header)] hdr: Option<Header<'_>>,
        #[zbus(connection)] conn: &Connection,
    ) -> zbus::fdo::Result<u64> {
        self.may_read(server, hdr.as_ref(), conn).await?;
        Ok(self.status().cpu_usage_nsec.unwrap_or(u64::MAX))
    }

    /// `memory.current`; u64::MAX when the memory controller is not available.
    #[zbus(property(emits_changed_signal = "false"), name = "MemoryCurrent")]
    async fn memory_current(
        &self,
        #[zbus(object_server)] server: &ObjectServer,
        #[zbus(header)] hdr: Option<Header<'_>>,
        #[zbus(connection)] conn: &Connection,
    ) -> zbus::fdo::Result<u64> {
        self.may_read(server, hdr.as_ref(), conn).await?;
        Ok(self.status().memory_current.unwrap_or(u64::MAX))
    }

    /// `pids.current`, or the number of threads in `cgroup.threads` without the pids controller.
    #[zbus(property(emits_changed_signal = "false"), name = "TasksCurrent")]
    async fn tasks_current(
        &self,
        #[zbus(object_server)] server: &ObjectServer,
        #[zbus(header)] hdr: Option<Header<'_>>,
        #[zbus(connection)] conn: &Connection,
    ) -> zbus::fdo::Result<u64> {
        self.may_read(server, hdr.as_ref(), conn).await?;
        Ok(self.status().tasks_current)
    }

    #[zbus(property, name = "NRestarts")]
    async fn n_restarts(
        &self,
        #[zbus(object_server)] server: &ObjectServer,
        #[zbus(header)] hdr: Option<Header<'_>>,
        #[zbus(connection)] conn: &Connection,
    ) -> zbus::fdo::Result<u32> {
        self.may_read(server, hdr.as_ref(), conn).await?;
        Ok(self.agent.restarts())
    }

    #[zbus(property, name = "RestartPolicy")]
    async fn restart_policy(
        &self,
        #[zbus(object_server)] server: &ObjectServer,
        #[zbus(header)] hdr: Option<Header<'_>>,
        #[zbus(connection)] conn: &Connection,
    ) -> zbus::fdo::Result<String> {
        self.may_read(server, hdr.as_ref(), conn).await?;
        Ok(self.agent.spec().restart.policy.as_str().to_string())
    }

    /// When the current run started, µs since the epoch (0 if never).
    #[zbus(property, name = "ActiveEnterTimestamp")]
    async fn active_enter_timestamp(
        &self,
        #[zbus(object_server)] server: &ObjectServer,
        #[zbus(header)] hdr: Option<Header<'_>>,
        #[zbus(connection)] conn: &Connection,
    ) -> zbus::fdo::Result<u64> {
        self.may_read(server, hdr.as_ref(), conn).await?;
        Ok(self.status().started_at_us)
    }

    /// `code=exited, status=N`, `code=killed, signal=NAME`, or empty.
    #[zbus(property, name = "ExecMainStatus")]
    async fn exec_main_status(
        &self,
        #[zbus(object_server)] server: &ObjectServer,
        #[zbus(header)] hdr: Option<Header<'_>>,
        #[zbus(connection)] conn: &Connection,
    ) -> zbus::fdo::Result<String> {
        self.may_read(server, hdr.as_ref(), conn).await?;
        Ok(self.status().exit_status)
    }

    /// Budget files of the contract this host could not apply, with the reason.
    #[zbus(property, name = "UnenforcedBudgets")]
    async fn unenforced_budgets(
        &self,
        #[zbus(object_server)] server: &ObjectServer,
        #[zbus(header)] hdr: Option<Header<'_>>,
        #[zbus(connection)] conn: &Connection,
    ) -> zbus::fdo::Result<Vec<String>> {
        self.may_read(server, hdr.as_ref(), conn).await?;
        Ok(self.status().unenforced_budgets)
    }

    #[zbus(property, name = "LogPath")]
    async fn log_path(
        &self,
        #[zbus(object_server)] server: &ObjectServer,
        #[zbus(header)] hdr: Option<Header<'_>>,
        #[zbus(connection)] conn: &Connection,
    ) -> zbus::fdo::Result<String> {
        self.may_read(server, hdr.as_ref(), conn).await?;
        Ok(self.agent.log_path.display().to_string())
    }

    #[zbus(property, name = "Origin")]
    async fn origin(
        &self,
        #[zbus(object_server)] server: &ObjectServer,
        #[zbus(header)] hdr: Option<Header<'_>>,
        #[zbus(connection)] conn: &Connection,
    ) -> zbus::fdo::Result<String> {
        self.may_read(server, hdr.as_ref(), conn).await?;
        Ok(self.status().origin)
    }

    #[zbus(property, name = "Enabled")]
    async fn enabled(
        &self,
        #[zbus(object_server)] server: &ObjectServer,
        #[zbus(header)] hdr: Option<Header<'_>>,
        #[zbus(connection)] conn: &Connection,
    ) -> zbus::fdo::Result<bool> {
        self.may_read(server, hdr.as_ref(), conn).await?;
        Ok(self.status().enabled)
    }
}
