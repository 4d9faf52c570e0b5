//! Who hears the daemon's signals. Signals describe agents (their names, states, the tool calls
//! they wait on), so like every read they follow the caller's rights: a connection asks for them
//! with `Subscribe()` (as systemd's `Manager.Subscribe`), and each signal about an agent of tenant
//! T is sent to each subscriber holding `read` for T, addressed to it. Nothing is broadcast, so an
//! operator scoped to one tenant never hears of another's agents, whatever the bus policy lets
//! through. A subscription ends with `Unsubscribe()` or when the connection leaves the bus.
//! Bounded: [`MAX_SUBSCRIBERS`] in all and [`MAX_PER_UID`] per user.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures_util::StreamExt;
use tracing::{debug, warn};
use zbus::Connection;
use zbus::names::{BusName, UniqueName};
use zbus::object_server::SignalEmitter;

use super::gate::Gate;
use crate::authz::{Action, Caller, Scope};
use agentos_api::ApiError;

/// Subscriptions held at once, over all callers.
pub const MAX_SUBSCRIBERS: usize = 256;
/// Subscriptions one uid may hold (each is a connection of its own).
pub const MAX_PER_UID: usize = 16;

/// The connections that asked for signals, by unique name.
#[derive(Debug, Default)]
pub struct Subscribers {
    by_name: Mutex<HashMap<String, Caller>>,
}

impl Subscribers {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Caller>> {
        self.by_name.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Add `caller` (its unique name is the key; subscribing twice is one subscription).
    pub fn add(&self, caller: Caller) -> Result<(), ApiError> {
        let Some(name) = caller.bus_name.clone() else {
            return Err(ApiError::AccessDenied(
                "Subscribe: the call has no sender".into(),
            ));
        };
        let mut m = self.lock();
        if m.contains_key(&name) {
            return Ok(());
        }
        if m.len() >= MAX_SUBSCRIBERS {
            return Err(ApiError::Unavailable(format!(
                "Subscribe: {MAX_SUBSCRIBERS} connections are subscribed already"
            )));
        }
        if m.values().filter(|c| c.uid == caller.uid).count() >= MAX_PER_UID {
            return Err(ApiError::Unavailable(format!(
                "Subscribe: uid {} holds {MAX_PER_UID} subscriptions already",
                caller.uid
            )));
        }
        m.insert(name, caller);
        Ok(())
    }

    /// Drop the subscription of `name`; whether there was one.
    pub fn remove(&self, name: &str) -> bool {
        self.lock().remove(name).is_some()
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn all(&self) -> Vec<(String, Caller)> {
        self.lock()
            .iter()
            .map(|(n, c)| (n.clone(), c.clone()))
            .collect()
    }

    /// An emitter for `path` addressed to each subscriber that may read `tenant`.
    pub async fn readers<'p>(
        &self,
        conn: &Connection,
        gate: &Gate,
        path: &'p str,
        tenant: &str,
    ) -> Vec<SignalEmitter<'p>> {
        let mut out = Vec::new();
        for (name, caller) in self.all() {
            if !gate
                .allows(&caller, Action::Read, Scope::Tenant(tenant))
                .await
            {
                continue;
            }
            let (Ok(em), Ok(dest)) = (
                SignalEmitter::new(conn, path),
                UniqueName::try_from(name.clone()),
            ) else {
                continue;
            };
            out.push(em.set_destination(BusName::Unique(dest)));
        }
        out
    }
}

/// Forget subscribers that leave the bus (`NameOwnerChanged` of their unique name).
pub async fn reap_departed(conn: Connection, subs: Arc<Subscribers>) {
    let proxy = match zbus::fdo::DBusProxy::new(&conn).await {
        Ok(p) => p,
        Err(e) => {
            warn!(
                "signals: cannot watch NameOwnerChanged ({e}); subscriptions end only with Unsubscribe"
            );
            return;
        }
    };
    let mut changes = match proxy.receive_name_owner_changed().await {
        Ok(s) => s,
        Err(e) => {
            warn!(
                "signals: cannot watch NameOwnerChanged ({e}); subscriptions end only with Unsubscribe"
            );
            return;
        }
    };
    while let Some(ch) = changes.next().await {
        let Ok(args) = ch.args() else { continue };
        if args.new_owner().is_none() && subs.remove(args.name().as_str()) {
            debug!("signals: {} left the bus, unsubscribed", args.name());
        }
    }
}
