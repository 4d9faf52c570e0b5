//! The agents directory: contracts started at boot (like enabled units).

use std::path::PathBuf;
use std::sync::Arc;

use super::{Supervisor, lock};
use crate::spec::AgentSpec;

impl Supervisor {
    /// Start the contracts in the agents directory (like enabled units). Agents already known
    /// from this boot are left as they are (running, or stopped by an operator).
    pub async fn load_agents_dir(self: &Arc<Self>) -> Vec<String> {
        let mut report = Vec::new();
        let dir = &self.cfg.agents_dir;
        let Ok(entries) = std::fs::read_dir(dir) else {
            return report;
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
        for f in files {
            let contract = match contracts::load_contract(&f) {
                Ok(c) => c,
                Err(e) => {
                    report.push(format!("{}: not loaded: {e}", f.display()));
                    continue;
                }
            };
            let spec = AgentSpec::from_contract(&contract);
            if spec.exec.is_none() {
                report.push(format!("{}: no exec, nothing to start", f.display()));
                continue;
            }
            if let Ok(existing) = self.find(&spec.id()) {
                let same_boot = lock(&existing.inner).boot_id == self.boot_id;
                if same_boot || existing.state().is_active() {
                    lock(&existing.inner).enabled = true;
                    continue;
                }
            }
            let text = std::fs::read_to_string(&f).unwrap_or_default();
            match self
                .start_spec(spec, text, f.display().to_string(), true)
                .await
            {
                Ok(a) => report.push(format!("{}: started {}", f.display(), a.id)),
                Err(e) => report.push(format!("{}: start failed: {e}", f.display())),
            }
        }
        report
    }

    /// Find a contract named `name` (file stem or agent name) in the agents directory.
    pub fn find_in_agents_dir(&self, name: &str) -> Option<PathBuf> {
        let dir = &self.cfg.agents_dir;
        for ext in ["yaml", "yml"] {
            let p = dir.join(format!("{name}.{ext}"));
            if p.exists() {
                return Some(p);
            }
        }
        let entries = std::fs::read_dir(dir).ok()?;
        for e in entries.flatten() {
            let p = e.path();
            if let Ok(c) = contracts::load_contract(&p)
                && (c.name() == name || format!("{}/{}", c.tenant(), c.name()) == name)
            {
                return Some(p);
            }
        }
        None
    }
}
