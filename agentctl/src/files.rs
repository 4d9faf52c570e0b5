//! The commands about agents' contracts, as systemctl has them for unit files: `daemon-reload`,
//! `reload`, `enable`, `disable`, `cat`, `show`, and the "changed on disk" warning of `status`.
//! A contract file is always read here, with the operator's rights, and sent as text: the daemon
//! never opens a file for a caller (it reads only its own agents directory).

use std::io::Write;

use agentos_api::text::{escape_control as esc, escape_lines};
use agentos_api::{AGENT_IFACE, AgentStatus, SERVICE};
use zbus::OwnedVariant as OwnedValue;

use crate::client::{CliError, Client, fail};
use crate::exit;

/// `agentctl daemon-reload`.
pub async fn daemon_reload(c: &Client, out: &mut dyn Write) -> i32 {
    match c.call::<_, Vec<String>>("Reload", &()).await {
        Ok(lines) => {
            for l in lines {
                let _ = writeln!(out, "{}", esc(&l));
            }
            exit::OK
        }
        Err(e) => fail(out, e),
    }
}

async fn describe(c: &Client, agent: &str) -> Result<AgentStatus, CliError> {
    let j: String = c.call("DescribeAgent", &(agent,)).await?;
    serde_json::from_str(&j)
        .map_err(|e| CliError::new(exit::FAILED, format!("bad status JSON: {e}")))
}

/// `agentctl reload AGENT [--file FILE] [--no-restart]`: the agent's contract read again from
/// FILE or the file it was started from, sent to the daemon; a running agent is restarted
/// with it unless `--no-restart` (then it applies at its next start).
pub async fn reload(
    c: &Client,
    agent: &str,
    file: Option<&str>,
    no_restart: bool,
    out: &mut dyn Write,
) -> i32 {
    let st = match describe(c, agent).await {
        Ok(s) => s,
        Err(e) => return fail(out, e),
    };
    let path = match file {
        Some(f) => std::fs::canonicalize(f)
            .unwrap_or_else(|_| f.into())
            .display()
            .to_string(),
        None if st.origin.starts_with('/') => st.origin.clone(),
        None => {
            return fail(
                out,
                CliError::new(
                    exit::USAGE,
                    format!(
                        "{} was started from a contract sent over D-Bus ({}), not a file: give --file FILE",
                        esc(&st.id),
                        esc(&st.origin)
                    ),
                ),
            );
        }
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) => {
            return fail(
                out,
                CliError::new(exit::NOT_FOUND, format!("cannot read contract {path}: {e}")),
            );
        }
    };
    match c
        .call::<_, bool>("ReloadAgent", &(agent, text, &path, !no_restart))
        .await
    {
        Ok(true) => {
            let _ = writeln!(out, "reloaded {} from {path} and restarted it", esc(&st.id));
            exit::OK
        }
        Ok(false) if st.state == "running" || st.state == "frozen" => {
            let _ = writeln!(
                out,
                "reloaded {} from {path}; it applies when the agent next starts (agentctl restart {})",
                esc(&st.id),
                esc(&st.id)
            );
            exit::OK
        }
        Ok(false) => {
            let _ = writeln!(out, "reloaded {} from {path}", esc(&st.id));
            exit::OK
        }
        Err(e) => fail(out, e),
    }
}

/// `agentctl enable AGENT… [--now]`.
pub async fn enable(c: &Client, agents: &[String], now: bool, out: &mut dyn Write) -> i32 {
    let mut code = exit::OK;
    for a in agents {
        match c.call::<_, (String, bool)>("EnableAgent", &(a,)).await {
            Ok((file, true)) => {
                let _ = writeln!(out, "Created {} for {}.", esc(&file), esc(a));
            }
            Ok((file, false)) => {
                let _ = writeln!(out, "{} is enabled already ({}).", esc(a), esc(&file));
            }
            Err(e) => {
                code = fail(out, e);
                continue;
            }
        }
        if now
            && let Ok(st) = describe(c, a).await
            && !matches!(st.state.as_str(), "running" | "frozen" | "starting")
            && let Err(e) = c
                .call::<_, zbus::OwnedObjectPath>("StartAgentByName", &(a,))
                .await
        {
            code = fail(out, e);
        }
    }
    code
}

/// `agentctl disable AGENT… [--now]`.
pub async fn disable(c: &Client, agents: &[String], now: bool, out: &mut dyn Write) -> i32 {
    let mut code = exit::OK;
    for a in agents {
        match c.call::<_, Vec<String>>("DisableAgent", &(a,)).await {
            Ok(files) if files.is_empty() => {
                let _ = writeln!(out, "{} was not enabled.", esc(a));
            }
            Ok(files) => {
                for f in files {
                    let _ = writeln!(out, "Removed {}.", esc(&f));
                }
            }
            Err(e) => {
                code = fail(out, e);
                continue;
            }
        }
        if now && let Err(e) = c.call0("StopAgent", &(a,)).await {
            code = fail(out, e);
        }
    }
    code
}

/// `agentctl cat AGENT`: the contract it runs with, and the one waiting for its next start.
pub async fn cat(c: &Client, agent: &str, out: &mut dyn Write) -> i32 {
    let (text, origin, pending, pending_origin): (String, String, String, String) =
        match c.call("GetContract", &(agent,)).await {
            Ok(r) => r,
            Err(e) => return fail(out, e),
        };
    let _ = writeln!(out, "# {}", esc(&origin));
    let _ = write!(out, "{}", escape_lines(&text));
    if !text.ends_with('\n') {
        let _ = writeln!(out);
    }
    if !pending.is_empty() {
        let _ = writeln!(
            out,
            "\n# {} (loaded, applies when the agent next starts)",
            esc(&pending_origin)
        );
        let _ = write!(out, "{}", escape_lines(&pending));
    }
    exit::OK
}

/// One property value as `systemctl show` prints it.
fn show_value(v: &OwnedValue) -> String {
    use zbus::Variant as Value;
    match &**v {
        Value::Bool(b) => if *b { "yes" } else { "no" }.to_string(),
        Value::Str(s) => esc(s.as_str()),
        Value::ObjectPath(p) => p.to_string(),
        Value::U8(n) => n.to_string(),
        Value::U16(n) => n.to_string(),
        Value::U32(n) => n.to_string(),
        Value::U64(n) => n.to_string(),
        Value::I16(n) => n.to_string(),
        Value::I32(n) => n.to_string(),
        Value::I64(n) => n.to_string(),
        Value::F64(n) => n.to_string(),
        Value::Array(a) => a
            .iter()
            .map(|x| match x {
                Value::Str(s) => esc(s.as_str()),
                other => esc(&other.to_string()),
            })
            .collect::<Vec<_>>()
            .join(" "),
        other => esc(&other.to_string()),
    }
}

/// `agentctl show AGENT [-p PROP,…] [--value]`: the agent's D-Bus properties as `Name=value`
/// lines, like `systemctl show`.
pub async fn show(
    c: &Client,
    agent: &str,
    props: &[String],
    value_only: bool,
    out: &mut dyn Write,
) -> i32 {
    let st = match describe(c, agent).await {
        Ok(s) => s,
        Err(e) => return fail(out, e),
    };
    let proxy = match zbus::fdo::PropertiesProxy::builder(c.connection())
        .destination(SERVICE)
        .path(st.object_path.clone())
        .build()
        .await
    {
        Ok(p) => p,
        Err(e) => return fail(out, CliError::new(exit::FAILED, e.to_string())),
    };
    let iface = match zbus::names::InterfaceName::try_from(AGENT_IFACE) {
        Ok(i) => i,
        Err(e) => return fail(out, CliError::new(exit::FAILED, e.to_string())),
    };
    let all = match proxy.get_all(iface).await {
        Ok(m) => m,
        Err(e) => return fail(out, CliError::new(exit::FAILED, format!("GetAll: {e}"))),
    };
    let wanted: Vec<&str> = props
        .iter()
        .flat_map(|p| p.split(','))
        .filter(|p| !p.is_empty())
        .collect();
    let mut names: Vec<&String> = all.keys().collect();
    names.sort();
    for w in &wanted {
        if !all.contains_key(*w) {
            return fail(
                out,
                CliError::new(
                    exit::USAGE,
                    format!(
                        "no property {} (agentctl show {} lists them)",
                        esc(w),
                        esc(agent)
                    ),
                ),
            );
        }
    }
    for n in names {
        if !wanted.is_empty() && !wanted.contains(&n.as_str()) {
            continue;
        }
        let v = show_value(&all[n]);
        let line = if value_only { v } else { format!("{n}={v}") };
        if writeln!(out, "{line}").is_err() {
            return exit::OK;
        }
    }
    exit::OK
}

/// What `status` adds under the agent when its contract changed: the file it came from was
/// modified after the contract was loaded (its mtime, as systemd's NeedDaemonReload; read here
/// with the operator's rights: a file it cannot see says nothing) or is gone, or a newer
/// contract waits for the next start.
pub fn change_warnings(st: &AgentStatus) -> Vec<String> {
    let mut w = Vec::new();
    if st.origin.starts_with('/') {
        match std::fs::metadata(&st.origin) {
            Ok(m) if st.contract_loaded_us > 0 => {
                let mtime_us = m
                    .modified()
                    .ok()
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                    .map_or(0, |d| d.as_micros() as u64);
                if mtime_us > st.contract_loaded_us {
                    w.push(format!(
                        "Warning: {} changed on disk; `agentctl reload {}` applies it (or `agentctl daemon-reload` for the agents directory)",
                        esc(&st.origin),
                        esc(&st.id)
                    ));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => w.push(format!(
                "Warning: {} is gone from disk; the agent keeps the contract it was started with",
                esc(&st.origin)
            )),
            _ => {}
        }
    }
    if st.pending_contract {
        w.push(format!(
            "Note: a newer contract is loaded; it applies when the agent next starts (`agentctl restart {}`)",
            esc(&st.id)
        ));
    }
    w
}

/// `agentctl edit AGENT [--no-restart]`, like `systemctl edit --full`: the contract the agent
/// has (or the one loaded for its next start) in `$VISUAL`/`$EDITOR` (else `vi`), checked when
/// the editor exits, then sent with `ReloadAgent` (a running agent restarts with it unless
/// `--no-restart`). An unchanged file changes nothing; one that does not parse is reported with
/// its positions and not sent. When the agent came from a file, that file is not touched: the
/// edit is the daemon's copy (`agentctl cat` shows it), so `reload` from the file undoes it.
pub async fn edit(c: &Client, agent: &str, no_restart: bool, out: &mut dyn Write) -> i32 {
    let (text, origin, pending, pending_origin): (String, String, String, String) =
        match c.call("GetContract", &(agent,)).await {
            Ok(r) => r,
            Err(e) => return fail(out, e),
        };
    let (text, origin) = if pending.is_empty() {
        (text, origin)
    } else {
        (pending, pending_origin)
    };
    let dir = match tempdir_for_edit() {
        Ok(d) => d,
        Err(e) => return fail(out, CliError::new(exit::FAILED, e)),
    };
    let file = dir.join("contract.yaml");
    if let Err(e) = std::fs::write(&file, &text) {
        return fail(
            out,
            CliError::new(exit::FAILED, format!("{}: {e}", file.display())),
        );
    }
    let editor = std::env::var("VISUAL")
        .or_else(|_| std::env::var("EDITOR"))
        .unwrap_or_else(|_| "vi".into());
    // Like git and systemctl: the editor may carry arguments (`code --wait`).
    let status = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("{editor} \"$1\""))
        .arg("sh")
        .arg(&file)
        .status();
    let result = (|| -> Result<Option<String>, CliError> {
        match status {
            Ok(s) if s.success() => {}
            Ok(s) => {
                return Err(CliError::new(
                    exit::FAILED,
                    format!("the editor ({editor}) failed ({s}); nothing changed"),
                ));
            }
            Err(e) => {
                return Err(CliError::new(
                    exit::FAILED,
                    format!("cannot run the editor {editor}: {e} (set $EDITOR)"),
                ));
            }
        }
        let edited = std::fs::read_to_string(&file)
            .map_err(|e| CliError::new(exit::FAILED, format!("{}: {e}", file.display())))?;
        if edited == text {
            return Ok(None);
        }
        if let Err(e) = contracts::parse_contract(&edited, &origin) {
            return Err(CliError::new(
                exit::FAILED,
                format!("the edited contract does not parse; nothing changed:\n{e}"),
            ));
        }
        Ok(Some(edited))
    })();
    let _ = std::fs::remove_dir_all(&dir);
    let edited = match result {
        Ok(Some(t)) => t,
        Ok(None) => {
            let _ = writeln!(out, "{} unchanged.", esc(agent));
            return exit::OK;
        }
        Err(e) => return fail(out, e),
    };
    // The origin stays the file's (the daemon's copy now differs from it, on purpose: `reload`
    // from the file undoes the edit).
    match c
        .call::<_, bool>("ReloadAgent", &(agent, edited, &origin, !no_restart))
        .await
    {
        Ok(true) => {
            let _ = writeln!(out, "edited {} and restarted it", esc(agent));
            exit::OK
        }
        Ok(false) => {
            let _ = writeln!(out, "edited {}", esc(agent));
            exit::OK
        }
        Err(e) => fail(out, e),
    }
}

/// A private directory for the file being edited (0700, under $TMPDIR).
fn tempdir_for_edit() -> Result<std::path::PathBuf, String> {
    use std::os::unix::fs::DirBuilderExt;
    let base = std::env::temp_dir();
    for i in 0..100u32 {
        let p = base.join(format!("agentctl-edit-{}-{i}", std::process::id()));
        match std::fs::DirBuilder::new().mode(0o700).create(&p) {
            Ok(()) => return Ok(p),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(format!("{}: {e}", p.display())),
        }
    }
    Err(format!("no free directory under {}", base.display()))
}
