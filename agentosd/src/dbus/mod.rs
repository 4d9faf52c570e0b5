//! The D-Bus API: service `org.agentos1`, manager object `/org/agentos1` (interface
//! `org.agentos1.Manager`) and one object per agent at `/org/agentos1/agent/<tenant>_<name>`
//! (interface `org.agentos1.Agent`). Errors are `org.agentos1.Error.*`. See docs/dbus.md.
//!
//! Which file for which change: `gate.rs` who may call what (the authz policy or polkit, and the
//! refused-call records), `manager.rs` the `org.agentos1.Manager` interface, `agent.rs` the
//! `org.agentos1.Agent` interface; this file maps errors, finds the caller and runs the pumps
//! that turn supervisor events into objects and signals.

mod agent;
mod gate;
pub mod introspect;
pub mod jobs;
mod manager;
mod manager_ops;
pub mod signals;

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use signals::Subscribers;
use tokio::sync::mpsc::UnboundedReceiver;
use tracing::warn;
use zbus::Connection;
use zbus::object_server::ObjectServer;
use zbus::{ObjectPath, OwnedObjectPath, Variant as Value};

use crate::authz::Caller;
use crate::supervisor::{self, Agent, Event, Supervisor};
use zbus::message::Header;

pub use agentos_api::{AGENT_IFACE, ApiError, MANAGER_IFACE, MANAGER_PATH, SERVICE};
pub use agentos_api::{AgentRow, ConsentRow};

pub use agent::AgentObject;
pub use gate::Gate;
pub use manager::Manager;

/// The one place a supervisor error becomes text: its kind names the D-Bus error.
impl From<supervisor::Error> for ApiError {
    fn from(e: supervisor::Error) -> Self {
        use supervisor::ErrorKind as K;
        let m = e.to_string();
        match e.kind() {
            K::NoSuchAgent => ApiError::NoSuchAgent(m),
            K::InvalidContract => ApiError::InvalidContract(m),
            K::AlreadyExists => ApiError::AlreadyExists(m),
            K::InvalidState => ApiError::InvalidState(m),
            K::Kernel => ApiError::Kernel(m),
            K::Unenforceable => ApiError::Unenforceable(m),
            K::ExecFailed => ApiError::ExecFailed(m),
            K::Unschedulable => ApiError::Unschedulable(m),
            K::Io => ApiError::Io(m),
            K::StorageLow => ApiError::StorageLow(m),
        }
    }
}

type Result<T> = std::result::Result<T, ApiError>;

fn opath(p: &str) -> Result<OwnedObjectPath> {
    OwnedObjectPath::try_from(p.to_string()).map_err(|e| ApiError::InvalidArgs(e.to_string()))
}

/// Who is calling, as the bus tells it (`GetConnectionCredentials`: uid, gids, pid), with the
/// command line and unit of that pid. Nothing the caller sends is believed.
pub async fn caller_of(hdr: &Header<'_>, conn: &Connection) -> Result<Caller> {
    let denied = |why: String| ApiError::AccessDenied(format!("{why}; the call is refused"));
    let sender = hdr
        .sender()
        .ok_or_else(|| denied("the call has no sender on the bus".into()))?;
    let creds = zbus::fdo::DBusProxy::new(conn)
        .await?
        .get_connection_credentials(zbus::names::BusName::Unique(sender.to_owned()))
        .await
        .map_err(|e| denied(format!("the bus does not say who {sender} is ({e})")))?;
    let uid = creds
        .unix_user_id()
        .ok_or_else(|| denied(format!("the bus gives no UnixUserID for {sender}")))?;
    // A bus that does not report UnixGroupIDs leaves the list empty: group rules then match
    // nobody (fail closed).
    let gids = creds.unix_group_ids().cloned().unwrap_or_default();
    Ok(Caller {
        uid,
        gids,
        bus_name: Some(sender.to_string()),
        ..Caller::default()
    }
    .with_process(creds.process_id()))
}

/// Run `fut` with `caller` as the audit trail's [`crate::audit_trail::CALLER`]: every
/// lifecycle record it makes names who asked.
async fn as_caller<T, F>(caller: &Caller, fut: F) -> Result<T>
where
    F: std::future::Future<Output = std::result::Result<T, supervisor::Error>>,
{
    Ok(crate::audit_trail::CALLER
        .scope(caller.to_json(), fut)
        .await?)
}

/// Send `ConsentRequested` for every new held call to the subscribers who may read its agent.
pub async fn pump_consents(conn: Connection, sup: Arc<Supervisor>, subs: Arc<Subscribers>) {
    let Some(m) = sup.mcp() else {
        return;
    };
    let mut rx = m.service.consents().subscribe();
    let Ok(gate) = gate::gate_of(conn.object_server()).await else {
        return;
    };
    loop {
        match rx.recv().await {
            Ok(r) => {
                let tenant = r.agent.split('/').next().unwrap_or_default();
                for em in subs.readers(&conn, &gate, MANAGER_PATH, tenant).await {
                    let _ = Manager::consent_requested(
                        &em,
                        r.id,
                        &r.agent,
                        &r.tool,
                        &r.capability,
                        &r.arguments.to_string(),
                        r.expires_us,
                    )
                    .await;
                }
            }
            Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                warn!("{n} ConsentRequested signal(s) not sent (ListConsentRequests has them)");
            }
            Err(_) => break,
        }
    }
}

/// Register the object of `agent` (no-op if it is there already).
pub async fn register_agent(server: &ObjectServer, sup: &Arc<Supervisor>, agent: &Arc<Agent>) {
    let obj = AgentObject {
        sup: sup.clone(),
        agent: agent.clone(),
    };
    match server.at(agent.object_path.as_str(), obj).await {
        Ok(None) => {
            introspect::install(server, agent.object_path.as_str()).await;
            introspect::install(server, "/org/agentos1/agent").await;
        }
        Ok(Some(_)) => {}
        Err(e) => warn!(agent = %agent.id, "cannot register D-Bus object: {e}"),
    }
}

/// The agent properties `PropertiesChanged` carries, as last signalled.
#[derive(Debug, Clone, PartialEq)]
struct Shown {
    state: String,
    result: String,
    main_pid: u32,
    restarts: u32,
    exit_status: String,
    started_at_us: u64,
}

impl Shown {
    fn of(st: &supervisor::AgentStatus) -> Shown {
        Shown {
            state: st.state.clone(),
            result: st.result.clone(),
            main_pid: st.main_pid,
            restarts: st.restarts,
            exit_status: st.exit_status.clone(),
            started_at_us: st.started_at_us,
        }
    }

    /// The properties that differ from `before` (all of them when nothing was signalled yet).
    fn changed_since(&self, before: Option<&Shown>) -> HashMap<&'static str, Value<'static>> {
        let mut m: HashMap<&'static str, Value<'static>> = HashMap::new();
        let b = before;
        if b.map(|b| &b.state) != Some(&self.state) {
            m.insert("State", Value::from(self.state.clone()));
        }
        if b.map(|b| &b.result) != Some(&self.result) {
            m.insert("Result", Value::from(self.result.clone()));
        }
        if b.map(|b| b.main_pid) != Some(self.main_pid) {
            m.insert("MainPID", Value::from(self.main_pid));
        }
        if b.map(|b| b.restarts) != Some(self.restarts) {
            m.insert("NRestarts", Value::from(self.restarts));
        }
        if b.map(|b| &b.exit_status) != Some(&self.exit_status) {
            m.insert("ExecMainStatus", Value::from(self.exit_status.clone()));
        }
        if b.map(|b| b.started_at_us) != Some(self.started_at_us) {
            m.insert("ActiveEnterTimestamp", Value::from(self.started_at_us));
        }
        m
    }
}

/// Turn supervisor events into objects and signals (sent to the subscribers who may read the
/// agent: dbus/signals.rs). Runs until the supervisor goes away.
pub async fn pump_events(
    conn: Connection,
    sup: Arc<Supervisor>,
    subs: Arc<Subscribers>,
    mut rx: UnboundedReceiver<Event>,
) {
    let server = conn.object_server();
    let Ok(gate) = gate::gate_of(server).await else {
        return;
    };
    let mut last: HashMap<String, Shown> = HashMap::new();
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::New(agent) => {
                register_agent(server, &sup, &agent).await;
                let Ok(p) = ObjectPath::try_from(agent.object_path.as_str()) else {
                    continue;
                };
                for em in subs
                    .readers(&conn, &gate, MANAGER_PATH, &agent.tenant)
                    .await
                {
                    let _ = Manager::agent_new(&em, &agent.id, p.clone()).await;
                }
                n_agents_changed(&conn, &gate, &subs, &sup, &agent.tenant).await;
            }
            Event::Changed(agent) => {
                let current = sup.find(&agent.id).is_ok_and(|a| Arc::ptr_eq(&a, &agent));
                if !current {
                    continue;
                }
                register_agent(server, &sup, &agent).await;
                let st = sup.status_of(&agent);
                let Ok(p) = ObjectPath::try_from(agent.object_path.as_str()) else {
                    continue;
                };
                // Each change is signalled once: only what differs from the last signal.
                let now = Shown::of(&st);
                let before = last.insert(agent.id.clone(), now.clone());
                if before.as_ref().map(|b| (&b.state, &b.result)) != Some((&now.state, &now.result))
                {
                    for em in subs
                        .readers(&conn, &gate, MANAGER_PATH, &agent.tenant)
                        .await
                    {
                        let _ = Manager::agent_state_changed(
                            &em,
                            &agent.id,
                            p.clone(),
                            &st.state,
                            &st.result,
                        )
                        .await;
                    }
                }
                let changed = now.changed_since(before.as_ref());
                if changed.is_empty() {
                    continue;
                }
                let Ok(iface) = zbus::names::InterfaceName::try_from(AGENT_IFACE) else {
                    continue;
                };
                for em in subs
                    .readers(&conn, &gate, agent.object_path.as_str(), &agent.tenant)
                    .await
                {
                    let _ = zbus::fdo::Properties::properties_changed(
                        &em,
                        iface.clone(),
                        changed.clone(),
                        Cow::Borrowed(&[]),
                    )
                    .await;
                }
            }
            Event::Removed { id, object_path } => {
                last.remove(&id);
                let _ = server.remove::<AgentObject, _>(object_path.as_str()).await;
                let tenant = id.split('/').next().unwrap_or_default();
                if let Ok(p) = ObjectPath::try_from(object_path.as_str()) {
                    for em in subs.readers(&conn, &gate, MANAGER_PATH, tenant).await {
                        let _ = Manager::agent_removed(&em, &id, p.clone()).await;
                    }
                }
                n_agents_changed(&conn, &gate, &subs, &sup, tenant).await;
            }
        }
    }
}

/// `PropertiesChanged` of the manager's `NAgents`, once per agent added or removed.
async fn n_agents_changed(
    conn: &Connection,
    gate: &gate::Gate,
    subs: &Subscribers,
    sup: &Supervisor,
    tenant: &str,
) {
    let (Ok(iface), n) = (
        zbus::names::InterfaceName::try_from(agentos_api::MANAGER_IFACE),
        sup.count() as u32,
    ) else {
        return;
    };
    for em in subs.readers(conn, gate, MANAGER_PATH, tenant).await {
        let mut m: HashMap<&str, Value<'_>> = HashMap::new();
        m.insert("NAgents", Value::from(n));
        let _ =
            zbus::fdo::Properties::properties_changed(&em, iface.clone(), m, Cow::Borrowed(&[]))
                .await;
    }
}

/// `PropertiesChanged` of the manager's `StorageState`, `StorageFree`, `StorageReserve` and
/// `StorageDetail`, once per change of the storage state (low ↔ normal; the free space itself
/// changes all the time and is read, not signalled).
pub async fn pump_storage(conn: Connection, sup: Arc<Supervisor>, subs: Arc<Subscribers>) {
    let Some(mut rx) = sup.storage().map(|s| s.subscribe()) else {
        return;
    };
    let Ok(gate) = gate::gate_of(conn.object_server()).await else {
        return;
    };
    let Ok(iface) = zbus::names::InterfaceName::try_from(agentos_api::MANAGER_IFACE) else {
        return;
    };
    while rx.changed().await.is_ok() {
        let st = rx.borrow_and_update().clone();
        for em in subs.readers(&conn, &gate, MANAGER_PATH, "").await {
            let mut m: HashMap<&str, Value<'_>> = HashMap::new();
            m.insert("StorageState", Value::from(st.state()));
            m.insert("StorageFree", Value::from(st.free()));
            m.insert("StorageReserve", Value::from(st.reserve()));
            m.insert("StorageDetail", Value::from(st.describe()));
            let _ = zbus::fdo::Properties::properties_changed(
                &em,
                iface.clone(),
                m,
                Cow::Borrowed(&[]),
            )
            .await;
        }
    }
}
