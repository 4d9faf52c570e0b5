//! `agentctl monitor`: what happens to the agents the caller may read, as it happens. It calls
//! the daemon's `Subscribe` (the daemon then addresses its signals to this connection, and only
//! those about agents the caller may read: a tenant operator hears of its tenant only) and prints
//! one line per signal. When agentosd restarts it subscribes again.

use std::io::Write;

use agentos_api::text::escape_control as esc;
use agentos_api::wire::utc_timestamp;
use agentos_api::{MANAGER_IFACE, SERVICE};
use futures_util::StreamExt;
use zbus::message::Type;

use crate::client::{CliError, Client};
use crate::exit;

fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// One signal as a line (`None`: not one of ours).
pub fn render(member: &str, body: &zbus::message::Body, json: bool) -> Option<String> {
    let t = now_us();
    let (kind, fields): (&str, serde_json::Value) = match member {
        "AgentStateChanged" => {
            let (id, _path, state, result): (String, zbus::OwnedObjectPath, String, String) =
                body.deserialize().ok()?;
            (
                "state",
                serde_json::json!({"agent": id, "state": state, "result": result}),
            )
        }
        "AgentNew" => {
            let (id, _path): (String, zbus::OwnedObjectPath) = body.deserialize().ok()?;
            ("new", serde_json::json!({"agent": id}))
        }
        "AgentRemoved" => {
            let (id, _path): (String, zbus::OwnedObjectPath) = body.deserialize().ok()?;
            ("removed", serde_json::json!({"agent": id}))
        }
        "ConsentRequested" => {
            let (id, agent, tool, capability, arguments, expires_us): (
                u64,
                String,
                String,
                String,
                String,
                u64,
            ) = body.deserialize().ok()?;
            (
                "consent",
                serde_json::json!({"agent": agent, "id": id, "tool": tool, "capability": capability,
                                   "arguments": arguments, "expires_us": expires_us}),
            )
        }
        "JobNew" => {
            let (id, job, agent): (u32, zbus::OwnedObjectPath, String) = body.deserialize().ok()?;
            (
                "job",
                serde_json::json!({"agent": agent, "id": id, "job": job.as_str()}),
            )
        }
        "JobRemoved" => {
            let (id, _job, agent, result): (u32, zbus::OwnedObjectPath, String, String) =
                body.deserialize().ok()?;
            (
                "job-done",
                serde_json::json!({"agent": agent, "id": id, "result": result}),
            )
        }
        _ => return None,
    };
    if json {
        let mut v = fields;
        v["time"] = utc_timestamp(t).into();
        v["event"] = kind.into();
        return Some(v.to_string());
    }
    let s = |k: &str| esc(fields[k].as_str().unwrap_or_default());
    let detail = match kind {
        "state" if !fields["result"].as_str().unwrap_or_default().is_empty() => {
            format!("{} ({})", s("state"), s("result"))
        }
        "state" => s("state"),
        "job" => format!("job {} queued ({})", fields["id"], s("job")),
        "job-done" => format!("job {}: {}", fields["id"], s("result")),
        "consent" => format!(
            "#{} {} ({}) waits for consent: agentctl consent approve|deny {}",
            fields["id"],
            s("tool"),
            s("capability"),
            fields["id"]
        ),
        _ => String::new(),
    };
    Some(format!(
        "{} {:<8} {} {}",
        utc_timestamp(t),
        kind,
        s("agent"),
        detail
    ))
}

/// Subscribe and print until interrupted (or stdout closes).
pub async fn monitor(c: &Client, json: bool, out: &mut dyn Write) -> i32 {
    let conn = c.connection().clone();
    let mut messages = zbus::MessageStream::from(&conn);
    let dbus = match zbus::fdo::DBusProxy::new(&conn).await {
        Ok(p) => p,
        Err(e) => return crate::client::fail(out, CliError::new(exit::FAILED, e.to_string())),
    };
    let mut owners = match dbus
        .receive_name_owner_changed_with_args(&[(0, SERVICE)])
        .await
    {
        Ok(s) => s,
        Err(e) => return crate::client::fail(out, CliError::new(exit::FAILED, e.to_string())),
    };
    if let Err(e) = c.call0("Subscribe", &()).await {
        return crate::client::fail(out, e);
    }
    loop {
        tokio::select! {
            m = messages.next() => {
                let Some(Ok(m)) = m else { return exit::OK };
                let h = m.header();
                if h.message_type() != Type::Signal
                    || h.interface().map(|i| i.as_str()) != Some(MANAGER_IFACE)
                {
                    continue;
                }
                let Some(member) = h.member() else { continue };
                if let Some(line) = render(member.as_str(), &m.body(), json)
                    && (writeln!(out, "{line}").is_err() || out.flush().is_err())
                {
                    return exit::OK;
                }
            }
            ch = owners.next() => {
                let Some(ch) = ch else { continue };
                let Ok(args) = ch.args() else { continue };
                if args.new_owner().is_some() {
                    // A new agentosd: the subscription died with the old one.
                    match c.call0("Subscribe", &()).await {
                        Ok(()) => eprintln!("agentctl: agentosd restarted, subscribed again"),
                        Err(e) => return crate::client::fail(out, e),
                    }
                } else {
                    eprintln!("agentctl: agentosd left the bus; waiting for it to come back");
                }
            }
        }
    }
}
