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
        let files = self.agents_dir_files();
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
            let text = std::fs::read_to_string(&f).unwrap_or_default();
            if let Ok(existing) = self.find(&spec.id()) {
                let same_boot = lock(&existing.inner).boot_id == self.boot_id;
                if same_boot || existing.state().is_active() {
                    lock(&existing.inner).enabled = true;
                    // Edited while the daemon was down: the new contract applies at the next
                    // start, as after `daemon-reload` (supervisor/reload.rs).
                    let changed = lock(&existing.inner).contract != text;
                    if changed {
                        let origin = f.display().to_string();
                        match self.reload_contract(&existing, &text, &origin, false).await {
                            Ok(_) => report.push(format!(
                                "{origin}: changed since {} was started; loaded, applies at its next start",
                                existing.id
                            )),
                            Err(e) => report.push(format!("{origin}: not reloaded: {e}")),
                        }
                    }
                    continue;
                }
            }
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
