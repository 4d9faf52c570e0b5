//! `agentctl status` without an agent: the daemon's own line (version, agents, storage), like
//! `systemctl status` without a unit; and the storage warning `agentctl status NAME` adds while
//! the daemon is in the storage low state.

use std::io::Write;

use agentos_api::{MANAGER_IFACE, MANAGER_PATH, SERVICE};
use serde::Serialize;

use crate::client::{CliError, Client, fail};
use crate::exit;

/// What the manager's properties say about the daemon.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DaemonStatus {
    pub version: String,
    pub agents: u32,
    /// `normal` or `low`.
    pub storage_state: String,
    pub storage_free: u64,
    pub storage_reserve: u64,
    pub storage_detail: String,
}

impl DaemonStatus {
    /// Read the manager's properties.
    pub async fn read(c: &Client) -> Result<Self, CliError> {
        let p = zbus::fdo::PropertiesProxy::new(c.connection(), SERVICE, MANAGER_PATH)
            .await
            .map_err(|e| CliError::new(exit::UNREACHABLE, e.to_string()))?;
        let iface = zbus::names::InterfaceName::try_from(MANAGER_IFACE)
            .map_err(|e| CliError::new(exit::FAILED, e.to_string()))?;
        let all = p.get_all(iface).await.map_err(|e| {
            CliError::new(
                exit::FAILED,
                format!("reading the manager's properties: {e}"),
            )
        })?;
        let text = |k: &str| {
            all.get(k)
                .and_then(|v| String::try_from(v.try_clone().ok()?).ok())
                .unwrap_or_default()
        };
        let num = |k: &str| {
            all.get(k)
                .and_then(|v| u64::try_from(v.try_clone().ok()?).ok())
                .unwrap_or(0)
        };
        let agents = all
            .get("NAgents")
            .and_then(|v| u32::try_from(v.try_clone().ok()?).ok())
            .unwrap_or(0);
        Ok(DaemonStatus {
            version: text("Version"),
            agents,
            storage_state: text("StorageState"),
            storage_free: num("StorageFree"),
            storage_reserve: num("StorageReserve"),
            storage_detail: text("StorageDetail"),
        })
    }

    /// The warning line while storage is low (None otherwise).
    pub fn warning(&self) -> Option<String> {
        (self.storage_state == "low").then(|| {
            format!(
                "Warning: agentosd storage {}; new agent starts are refused until space is freed",
                self.storage_detail
            )
        })
    }

    /// The text `agentctl status` prints.
    pub fn render(&self) -> String {
        let mut s = format!(
            "● agentosd {}\n    Agents: {}\n   Storage: {}\n",
            self.version, self.agents, self.storage_detail
        );
        if let Some(w) = self.warning() {
            s.push_str(&w);
            s.push('\n');
        }
        s
    }
}

/// `agentctl status` (no agent).
pub async fn status(c: &Client, json: bool, out: &mut dyn Write) -> i32 {
    let st = match DaemonStatus::read(c).await {
        Ok(s) => s,
        Err(e) => return fail(out, e),
    };
    let text = if json {
        format!(
            "{}\n",
            serde_json::to_string_pretty(&st).unwrap_or_default()
        )
    } else {
        st.render()
    };
    let _ = write!(out, "{text}");
    let _ = out.flush();
    exit::OK
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn low_storage_is_a_warning_line() {
        let mut st = DaemonStatus {
            version: "0.1.0".into(),
            agents: 2,
            storage_state: "normal".into(),
            storage_free: 1 << 30,
            storage_reserve: 64 << 20,
            storage_detail:
                "normal: /var/lib/agentos (audit, state): 1.0 GiB free of 2.0 GiB, reserve 64.0 MiB"
                    .into(),
        };
        assert!(st.warning().is_none());
        assert!(st.render().contains("Storage: normal: /var/lib/agentos"));
        st.storage_state = "low".into();
        st.storage_detail =
            "low: /var/lib/agentos (audit, state): 1.0 MiB free of 2.0 GiB, reserve 64.0 MiB"
                .into();
        let text = st.render();
        assert!(
            text.contains(
                "Warning: agentosd storage low: /var/lib/agentos (audit, state): 1.0 MiB free"
            ),
            "{text}"
        );
    }
}
