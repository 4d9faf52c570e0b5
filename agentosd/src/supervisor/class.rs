//! Budgets and the latency class applied to a fresh agent cgroup: cgroup files, HRT admission,
//! cpuset pinning, and the sched_ext class map.

use super::mechanism::{Mechanism, Prepared, RunCtx};
use super::{Agent, Error, Supervisor};
use crate::cgroup::{self, Cgroup};
use crate::spec::AgentSpec;

impl Supervisor {
    /// Apply the latency class to the fresh cgroup `cg` (`cpu`: what HRT admission reserved,
    /// see [`HrtAdmission`]); returns what the child does before execve, the notes and the
    /// unenforced list extended by the class's.
    pub(super) fn apply_class(
        &self,
        agent: &Agent,
        spec: &AgentSpec,
        cg: &Cgroup,
        available: &[String],
        cpu: Option<u32>,
        mut unenforced: Vec<String>,
    ) -> Result<(crate::sched::ChildSched, Vec<String>, Vec<String>), Error> {
        agent.overruns.reset();
        let plan = crate::sched::plan(
            &spec.latency_class,
            &spec.sched,
            available,
            cpu,
            spec.budgets.memory_bytes,
            crate::sched::scx_agentos_loaded(),
        );
        let mut notes = plan.notes;
        unenforced.extend(plan.unenforced);
        let mut plan_files = plan.cgroup_files;
        // A deadline task may be pinned only inside a valid partition root of its own, and a
        // partition root needs a partition-root parent: without one, do not pin at all.
        let parent_partition = cg
            .path()
            .parent()
            .map(|p| p.join("cpuset.cpus.partition"))
            .filter(|p| p.exists())
            .map(|p| std::fs::read_to_string(p).unwrap_or_default());
        if plan_files
            .iter()
            .any(|(f, _)| *f == "cpuset.cpus.partition")
            && let Some(state) = parent_partition
            && !crate::sched::partition_is_valid_root(&state)
        {
            plan_files.retain(|(f, _)| !f.starts_with("cpuset."));
            notes.retain(|n| !n.starts_with("pinned:"));
            unenforced.push(format!(
                "cpuset pinning: the parent cgroup's cpuset.cpus.partition is {:?}, so this \
                 cgroup cannot be an exclusive partition (needed to pin a deadline task); \
                 running unpinned",
                state.trim()
            ));
        }
        let mut partition_failed = false;
        for (file, value) in &plan_files {
            if partition_failed && file.starts_with("cpuset") {
                continue;
            }
            if let Err(e) = cg.set(file, value) {
                if *file == "cpuset.cpus.partition" || *file == "cpuset.cpus" {
                    // Without an exclusive partition a pinned deadline task is refused
                    // (its affinity must span the root domain): run unpinned instead.
                    unpin(cg);
                    partition_failed = true;
                    notes.retain(|n| !n.starts_with("pinned:"));
                    unenforced.push(format!("cpuset pinning {file}={value} ({e})"));
                } else {
                    unenforced.push(format!("{file}={value} ({e})"));
                }
            }
        }
        if !partition_failed
            && plan_files
                .iter()
                .any(|(f, _)| *f == "cpuset.cpus.partition")
        {
            // The kernel takes the write even when the partition cannot be valid (its parent is
            // no partition root) and then reads back "root invalid (…)": the task would be
            // pinned outside any root domain of its own and sched_setattr(SCHED_DEADLINE) fails
            // with EPERM. Only a valid partition keeps the pin.
            let state = std::fs::read_to_string(cg.path().join("cpuset.cpus.partition"))
                .unwrap_or_default();
            if !crate::sched::partition_is_valid_root(&state) {
                unpin(cg);
                notes.retain(|n| !n.starts_with("pinned:"));
                unenforced.push(format!(
                    "cpuset pinning: cpuset.cpus.partition is {:?}: an exclusive CPU for a \
                     deadline task needs every ancestor cgroup to be a partition root; running \
                     unpinned",
                    state.trim()
                ));
            }
        }
        Ok((plan.child, notes, unenforced))
    }
}

/// Undo a cpuset pin: back to a plain member with every CPU of the parent (written out: an
/// empty write may not reach the kernel).
pub(super) fn unpin(cg: &Cgroup) {
    let _ = cg.set("cpuset.cpus.partition", "member");
    let parent_cpus = cg
        .path()
        .parent()
        .and_then(|p| std::fs::read_to_string(p.join("cpuset.cpus.effective")).ok())
        .unwrap_or_default();
    let _ = cg.set("cpuset.cpus", parent_cpus.trim());
}

/// Split the contract's budgets into cgroup files to write (their controller is `available` in
/// the agent's cgroup) and descriptions of those that cannot be enforced here.
pub fn plan_budgets(
    available: &[String],
    budgets: &crate::spec::Budgets,
) -> (Vec<(&'static str, String)>, Vec<String>) {
    let mut unenforced = Vec::new();
    let mut to_write = Vec::new();
    for (ctl, file, value) in cgroup::budget_files(budgets) {
        if available.iter().any(|a| a == ctl) {
            to_write.push((file, value));
        } else {
            unenforced.push(format!("{file}={value} ({ctl} controller not available)"));
        }
    }
    unenforced.extend(
        cgroup::io_max_lines(budgets)
            .into_iter()
            .filter_map(Result::err),
    );
    (to_write, unenforced)
}

/// The agent's class in scx_agentos's map (SRT/DT under sched_ext), before its first process.
pub(super) struct ScxClass<'s>(pub &'s Supervisor);

impl ScxClass<'_> {
    /// Put the agent's cgroup into the class map (a note for status), if scx_agentos is loaded.
    fn register(&self, run: &RunCtx<'_>) -> Option<String> {
        let scx = self.0.scx()?;
        scx.register(
            &run.agent.id,
            run.agent.cgroup.path(),
            &run.spec.latency_class,
        )
    }
}

impl Mechanism for ScxClass<'_> {
    fn name(&self) -> &'static str {
        "scx"
    }

    fn prepare(&self, run: &RunCtx<'_>, out: &mut Prepared) -> Result<(), Error> {
        out.notes.extend(self.register(run));
        Ok(())
    }

    fn adopt(&self, run: &RunCtx<'_>) -> Vec<String> {
        self.register(run).into_iter().collect()
    }

    fn release(&self, agent_id: &str) {
        if let Some(s) = self.0.scx() {
            s.forget(agent_id);
        }
    }
}

/// An HRT agent's reservation in the admission set (see sched.rs): the CPU its deadline task
/// runs on.
pub(super) struct HrtAdmission<'s>(pub &'s Supervisor);

impl Mechanism for HrtAdmission<'_> {
    fn name(&self) -> &'static str {
        "admission"
    }

    fn prepare(&self, run: &RunCtx<'_>, out: &mut Prepared) -> Result<(), Error> {
        if let Some(d) = run.spec.deadline() {
            let cpu = self
                .0
                .admission
                .admit(&run.agent.id, d, &run.spec.sched.cpuset)
                .map_err(Error::Unschedulable)?;
            out.cpu = Some(cpu);
        }
        Ok(())
    }

    fn adopt(&self, run: &RunCtx<'_>) -> Vec<String> {
        // It runs already: count its reservation, and say when it overloads.
        let Some(d) = run.spec.deadline() else {
            return vec![];
        };
        match self
            .0
            .admission
            .admit(&run.agent.id, d, &run.spec.sched.cpuset)
        {
            Ok(_) => vec![],
            Err(e) => vec![format!("re-adopted over the bound: {e}")],
        }
    }

    fn release(&self, agent_id: &str) {
        self.0.admission.release(agent_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn budgets_split_by_available_controllers() {
        let b = crate::spec::Budgets {
            cpu_millis: Some(250),
            memory_bytes: Some(64 << 20),
            memory_high_bytes: Some(48 << 20),
            pids: Some(16),
            io: vec![crate::spec::IoBudget {
                device: "8:16".into(),
                wbps: Some(4096),
                ..Default::default()
            }],
            disk_bytes: None,
            disk_inodes: None,
            must: false,
        };
        let all: Vec<String> = ["cpu", "memory", "pids", "io"].map(String::from).to_vec();
        let (w, u) = plan_budgets(&all, &b);
        assert!(u.is_empty());
        assert_eq!(
            w,
            vec![
                ("cpu.max", "25000 100000".to_string()),
                ("memory.high", (48u64 << 20).to_string()),
                ("memory.max", (64u64 << 20).to_string()),
                ("pids.max", "16".to_string()),
                ("io.max", "8:16 wbps=4096".to_string()),
            ]
        );
        let (w, u) = plan_budgets(&["pids".to_string()], &b);
        assert_eq!(w, vec![("pids.max", "16".to_string())]);
        assert_eq!(u.len(), 4);
        assert!(u[0].starts_with("cpu.max=25000 100000 (cpu controller"));
        let (w, u) = plan_budgets(&[], &crate::spec::Budgets::default());
        assert!(w.is_empty() && u.is_empty());
    }
}
