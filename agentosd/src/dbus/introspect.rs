//! `org.freedesktop.DBus.Introspectable` as the D-Bus specification has it and systemd serves
//! it: an object's own interfaces and its child nodes by name only (zbus's own describes the
//! whole subtree, which `busctl tree` cannot read and which would name every agent to anyone
//! who may introspect). The children of `/org/agentos1/agent` are the agents the caller may
//! read; an agent's object describes its interface only to a caller who may read it.

use std::fmt::Write as _;

use zbus::Connection;
use zbus::message::Header;
use zbus::names::InterfaceName;
use zbus::object_server::{Interface, ObjectServer};

use super::agent::AgentObject;
use super::jobs::JobObject;
use super::manager::Manager;
use super::{caller_of, gate};
use crate::authz::{Action, Scope};
use agentos_api::MANAGER_PATH;

/// Where the agents' objects live.
const AGENTS_PATH: &str = "/org/agentos1/agent";
/// Where running jobs' objects live (dbus/jobs.rs).
const JOBS_PATH: &str = "/org/agentos1/job";

/// The interfaces every object has (as zbus serves them).
const STANDARD: &str = r#"  <interface name="org.freedesktop.DBus.Introspectable">
    <method name="Introspect">
      <arg type="s" direction="out"/>
    </method>
  </interface>
  <interface name="org.freedesktop.DBus.Peer">
    <method name="Ping">
    </method>
    <method name="GetMachineId">
      <arg type="s" direction="out"/>
    </method>
  </interface>
  <interface name="org.freedesktop.DBus.Properties">
    <method name="Get">
      <arg name="interface_name" type="s" direction="in"/>
      <arg name="property_name" type="s" direction="in"/>
      <arg type="v" direction="out"/>
    </method>
    <method name="Set">
      <arg name="interface_name" type="s" direction="in"/>
      <arg name="property_name" type="s" direction="in"/>
      <arg name="value" type="v" direction="in"/>
    </method>
    <method name="GetAll">
      <arg name="interface_name" type="s" direction="in"/>
      <arg type="a{sv}" direction="out"/>
    </method>
    <signal name="PropertiesChanged">
      <arg name="interface_name" type="s"/>
      <arg name="changed_properties" type="a{sv}"/>
      <arg name="invalidated_properties" type="as"/>
    </signal>
  </interface>
"#;

/// Our Introspectable, registered on every object the daemon serves in place of zbus's.
pub struct Introspect;

#[zbus::interface(
    name = "org.freedesktop.DBus.Introspectable",
    introspection_docs = false
)]
impl Introspect {
    async fn introspect(
        &self,
        #[zbus(object_server)] server: &ObjectServer,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> zbus::fdo::Result<String> {
        let path = hdr
            .path()
            .map(|p| p.as_str().to_string())
            .unwrap_or_default();
        let denied = |e: agentos_api::ApiError| zbus::fdo::Error::AccessDenied(e.to_string());
        let caller = caller_of(&hdr, conn).await.map_err(denied)?;
        let gate = gate::gate_of(server).await.map_err(denied)?;
        let mut xml = String::from(
            "<!DOCTYPE node PUBLIC \"-//freedesktop//DTD D-BUS Object Introspection 1.0//EN\"\n \"http://www.freedesktop.org/standards/dbus/1.0/introspect.dtd\">\n<node>\n",
        );
        xml.push_str(STANDARD);
        let mut children: Vec<String> = Vec::new();
        match path.as_str() {
            "/" => children.push("org".into()),
            "/org" => children.push("agentos1".into()),
            MANAGER_PATH => {
                if gate.allows(&caller, Action::Read, Scope::AnyTenant).await
                    && let Ok(m) = server.interface::<_, Manager>(MANAGER_PATH).await
                {
                    let m = m.get().await;
                    m.introspect_to_writer(&mut xml, 2);
                    children.push("agent".into());
                    if !m.jobs.list().is_empty() {
                        children.push("job".into());
                    }
                }
            }
            AGENTS_PATH => {
                for a in gate.sup.agents() {
                    if gate.may_read(&caller, &a.tenant).await
                        && let Some(leaf) = a.object_path.rsplit('/').next()
                    {
                        children.push(leaf.to_string());
                    }
                }
                children.sort();
            }
            JOBS_PATH => {
                if let Ok(m) = server.interface::<_, Manager>(MANAGER_PATH).await {
                    for j in m.get().await.jobs.list() {
                        if gate.may_read(&caller, &j.tenant).await {
                            children.push(j.id.to_string());
                        }
                    }
                }
            }
            p if p.starts_with(JOBS_PATH) => {
                let job = match server.interface::<_, Manager>(MANAGER_PATH).await {
                    Ok(m) => m.get().await.jobs.list().into_iter().find(|j| j.path == p),
                    Err(_) => None,
                };
                if let Some(j) = job
                    && gate.may_read(&caller, &j.tenant).await
                    && let Ok(o) = server.interface::<_, JobObject>(p).await
                {
                    o.get().await.introspect_to_writer(&mut xml, 2);
                }
            }
            p => {
                let readable = match gate.sup.agents().into_iter().find(|a| a.object_path == p) {
                    Some(a) => gate.may_read(&caller, &a.tenant).await,
                    None => false,
                };
                if readable && let Ok(o) = server.interface::<_, AgentObject>(p).await {
                    o.get().await.introspect_to_writer(&mut xml, 2);
                }
            }
        }
        for c in children {
            let _ = writeln!(xml, "  <node name=\"{c}\"/>");
        }
        xml.push_str("</node>\n");
        Ok(xml)
    }
}

/// Put [`Introspect`] in place of zbus's at `path` (an object just registered, or one of the
/// nodes above it).
pub async fn install(server: &ObjectServer, path: &str) {
    let Ok(name) = InterfaceName::try_from("org.freedesktop.DBus.Introspectable") else {
        return;
    };
    // Ours may be there already (the node existed): then removing it and adding it again is
    // the same.
    let _ = server.remove_named(path, name).await;
    let _ = server.at(path, Introspect).await;
}

/// [`install`] on the manager and every node above it.
pub async fn install_tree(server: &ObjectServer) {
    for p in ["/", "/org", MANAGER_PATH] {
        install(server, p).await;
    }
}
