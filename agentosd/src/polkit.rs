//! Authorization by polkit (`org.freedesktop.PolicyKit1.Authority.CheckAuthorization`), where
//! polkitd runs on the daemon's bus: systemd's habit, so that an administrator grants agentos's
//! actions with the same rules files (`/etc/polkit-1/rules.d/*.rules`) as everything else.
//!
//! The subject is the caller's unique bus name (`system-bus-name`): polkitd asks the bus who it
//! is, as the daemon does. The action ids are [`Action::id`] (declared in
//! `units/org.agentos1.policy`); the details carry `tenant` (the agent's tenant; `*` when the
//! question is whether the caller holds the action for some tenant, before an agent is looked
//! up; absent for daemon-wide acts), which rules read with `action.lookup("tenant")`. Root is never asked about (it holds everything).
//! Answers are cached per caller, action and details for a few seconds (a list of 1 000 agents
//! asks once per tenant). When polkitd does not answer the call is refused (fail closed).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use zbus::Connection;
use zbus::Variant as Value;

use crate::authz::{Action, Scope};

pub const SERVICE: &str = "org.freedesktop.PolicyKit1";
const PATH: &str = "/org/freedesktop/PolicyKit1/Authority";
const IFACE: &str = "org.freedesktop.PolicyKit1.Authority";

/// How long an answer is reused.
const CACHE_FOR: Duration = Duration::from_secs(5);
/// Cached answers at most (the cache is emptied when full).
const CACHE_MAX: usize = 4096;

/// `agentosd --polkit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Mode {
    /// Use polkit when `org.freedesktop.PolicyKit1` has an owner on the daemon's bus at start.
    #[default]
    Auto,
    /// Always (a call is refused when polkitd does not answer).
    Yes,
    /// Never: the built-in `--authz` rules decide.
    No,
}

#[derive(Debug, thiserror::Error)]
pub enum PolkitError {
    #[error("polkit ({SERVICE}) did not answer CheckAuthorization: {0}")]
    Call(#[from] zbus::Error),
}

/// What a check is about, as polkit details: `tenant`, the agent's tenant, or `*` (does the
/// caller hold the action for some tenant), or absent (a daemon-wide act).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Details {
    pub tenant: Option<String>,
}

impl Details {
    /// The details of a check of `scope`.
    pub fn of(scope: Scope<'_>) -> Details {
        Details {
            tenant: match scope {
                Scope::Tenant(t) => Some(t.to_string()),
                Scope::AnyTenant => Some("*".into()),
                Scope::Global => None,
            },
        }
    }

    fn map(&self) -> HashMap<&'static str, &str> {
        let mut m = HashMap::new();
        if let Some(t) = &self.tenant {
            m.insert("tenant", t.as_str());
        }
        m
    }
}

type Key = (String, Action, Details);

/// The polkit authority on one bus, with a short cache of its answers.
pub struct Polkit {
    conn: Connection,
    cache: Mutex<HashMap<Key, (bool, Instant)>>,
}

impl Polkit {
    /// polkit on `conn`, if `mode` says to use it (for `Auto`, whether polkitd is on the bus).
    pub async fn for_mode(mode: Mode, conn: &Connection) -> Option<Polkit> {
        let present = async {
            let dbus = zbus::fdo::DBusProxy::new(conn).await.ok()?;
            let name = zbus::names::BusName::try_from(SERVICE).ok()?;
            // Activatable counts: polkitd is usually started on demand by the bus.
            let owned = dbus.name_has_owner(name.clone()).await.unwrap_or(false);
            let activatable = dbus
                .list_activatable_names()
                .await
                .map(|names| names.iter().any(|n| n.as_str() == SERVICE))
                .unwrap_or(false);
            Some(owned || activatable)
        };
        let use_it = match mode {
            Mode::No => false,
            Mode::Yes => true,
            Mode::Auto => present.await.unwrap_or(false),
        };
        use_it.then(|| Polkit {
            conn: conn.clone(),
            cache: Mutex::new(HashMap::new()),
        })
    }

    /// Whether the caller with unique bus name `sender` holds `action` for `details`.
    pub async fn check(
        &self,
        sender: &str,
        action: Action,
        details: &Details,
    ) -> Result<bool, PolkitError> {
        let key: Key = (sender.to_string(), action, details.clone());
        let now = Instant::now();
        if let Some((ok, at)) = self.lock().get(&key)
            && now.duration_since(*at) < CACHE_FOR
        {
            return Ok(*ok);
        }
        let subject_details: HashMap<&str, Value<'_>> =
            HashMap::from([("name", Value::from(sender))]);
        let subject = ("system-bus-name", subject_details);
        // Flags 0: no interactive authentication (D-Bus callers of agentosd are programs).
        let reply = self
            .conn
            .call_method(
                Some(SERVICE),
                PATH,
                Some(IFACE),
                "CheckAuthorization",
                &(subject, action.id(), details.map(), 0u32, ""),
            )
            .await?;
        let (authorized, _challenge, _details): (bool, bool, HashMap<String, String>) =
            reply.body().deserialize()?;
        let mut cache = self.lock();
        if cache.len() >= CACHE_MAX {
            cache.clear();
        }
        cache.insert(key, (authorized, now));
        Ok(authorized)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, (bool, Instant)>> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn details_name_the_tenant_any_tenant_or_nothing() {
        assert_eq!(Details::of(Scope::Tenant("acme")).map()["tenant"], "acme");
        assert_eq!(Details::of(Scope::AnyTenant).map()["tenant"], "*");
        assert!(Details::of(Scope::Global).map().is_empty());
    }
}
