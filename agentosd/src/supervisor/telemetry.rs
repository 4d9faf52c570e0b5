//! The supervisor's side of OpenTelemetry (telemetry/): the sampler that hands the agents'
//! cgroup CPU, memory and tasks and their kernel denials to the metrics export, and the
//! mechanism that ends an agent's open turn when its run ends.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::mechanism::{Mechanism, Prepared, RunCtx};
use super::{Error, Supervisor};
use crate::telemetry::{AgentLabels, AgentSample, Telemetry};

impl Supervisor {
    /// The daemon's telemetry (off unless the daemon was given `--otlp-endpoint`).
    pub fn telemetry(&self) -> &Arc<Telemetry> {
        &self.services.telemetry
    }

    /// The agents' journals (logs/).
    pub fn logs(&self) -> &Arc<crate::logs::Logs> {
        &self.services.logs
    }

    /// A line from the daemon in `agent`'s journal (after what the agent wrote before it);
    /// `exited`: its run has ended, so its last unterminated line is taken in first.
    pub(super) fn note(&self, agent: &super::Agent, text: &str, exited: bool) {
        self.services.logs.note(&agent.log_who(), text, exited);
    }

    /// What telemetry labels agent `id`'s spans and metrics with: its tenant and name, and its
    /// contract's binding hash from the audit trail.
    pub fn telemetry_labels(&self, id: &str, tenant: &str, name: &str) -> AgentLabels {
        let binding = self.audit_trail().and_then(|t| t.binding(id));
        AgentLabels::new(id, tenant, name, binding)
    }

    /// Every `metrics_interval` of the telemetry (when it is on): sample the agents and
    /// export the metrics. Holds the supervisor weakly; ends with it.
    pub fn spawn_telemetry_sampler(self: &Arc<Self>) {
        let Some(every) = self.telemetry().config().map(|c| c.metrics_interval) else {
            return;
        };
        let sup = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every.max(Duration::from_millis(100)));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                let Some(s) = sup.upgrade() else {
                    return;
                };
                // Sampling reads cgroup files: off the runtime's workers.
                let t = s.clone();
                let samples = tokio::task::spawn_blocking(move || t.telemetry_samples())
                    .await
                    .unwrap_or_default();
                s.telemetry().export_metrics(&samples);
            }
        });
    }

    /// One sample per running agent (cgroup files and counters: no /proc walk).
    fn telemetry_samples(&self) -> Vec<AgentSample> {
        self.agents()
            .into_iter()
            .filter(|a| a.state().is_active() && a.cgroup.exists())
            .map(|a| {
                let s = a.cgroup.stats();
                let started_us = super::lock(&a.inner).started_at_us;
                AgentSample {
                    labels: self.telemetry_labels(&a.id, &a.tenant, &a.name),
                    since: SystemTime::UNIX_EPOCH + Duration::from_micros(started_us),
                    cpu_usage_usec: s.cpu_usage_usec,
                    memory_current: s.memory_current,
                    tasks_current: s.tasks_current,
                    denials: self.kernel_denials(&a.id),
                }
            })
            .collect()
    }
}

/// The agent's open turn ends with its run (its span is exported with `agentos.turn.end =
/// agent-stopped`), and its metric series are forgotten.
pub(super) struct TelemetryTurns<'s>(pub &'s Supervisor);

impl Mechanism for TelemetryTurns<'_> {
    fn name(&self) -> &'static str {
        "telemetry"
    }

    fn prepare(&self, _run: &RunCtx<'_>, _out: &mut Prepared) -> Result<(), Error> {
        Ok(())
    }

    fn adopt(&self, _run: &RunCtx<'_>) -> Vec<String> {
        Vec::new()
    }

    fn release(&self, agent_id: &str) {
        self.0.telemetry().end_agent(agent_id);
    }
}
