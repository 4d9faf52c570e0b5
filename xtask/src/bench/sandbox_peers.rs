//! `bench sandbox`'s peers that need systemd as PID 1 (the VM: `cargo xtask vm bench -- sandbox`)
//! and agentosd installed on the system bus: what an operator would use instead of agentosd, and
//! agentosd itself started the way an operator starts an agent.
//!
//! | mode | what one start does |
//! |---|---|
//! | `systemd-run (service)` | `systemd-run --wait --pipe --collect` with [`SERVICE_PROPS`]: a transient service, the stamp's output on our pipe |
//! | `systemd-run (bare service)` | the same without any property: systemd's own share of the above |
//! | `systemd-run --scope` | `systemd-run --scope` with [`SCOPE_PROPS`] and `--uid/--gid` 65534: a scope takes only the cgroup's settings (no namespaces, seccomp, no_new_privs, capability bounds: those are a service's exec settings) |
//! | `agentosd (D-Bus)` | `StartAgent(contract text)` to the installed agentosd on the system bus (zbus, as `agentctl start FILE` sends it), the same contract as `agentos`; timed to the stamp in the agent's log, then `RemoveAgent` |

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::sandbox::{mono_ns, parse_stamp};

/// The sandboxing an operator would give a transient service to match what agentosd's contract
/// gives an agent: its own uid (the uid table → `DynamicUser`), no capabilities and
/// no_new_privs, a read-only view of the system with no home and a private /tmp (Landlock →
/// `ProtectSystem=strict`…), a system-call allow list (seccomp → `@system-service`), no network
/// (no `net.*` grant → its own network namespace, no IP, Unix sockets only) and a cgroup with
/// budgets.
pub const SERVICE_PROPS: &[&str] = &[
    "DynamicUser=yes",
    "NoNewPrivileges=yes",
    "CapabilityBoundingSet=",
    "ProtectSystem=strict",
    "ProtectHome=yes",
    "PrivateTmp=yes",
    "PrivateDevices=yes",
    "ProtectKernelTunables=yes",
    "ProtectKernelModules=yes",
    "ProtectControlGroups=yes",
    "RestrictNamespaces=yes",
    "RestrictSUIDSGID=yes",
    "LockPersonality=yes",
    "SystemCallFilter=@system-service",
    "SystemCallArchitectures=native",
    "PrivateNetwork=yes",
    "IPAddressDeny=any",
    "RestrictAddressFamilies=AF_UNIX",
    "CPUQuota=100%",
    "MemoryMax=512M",
    "TasksMax=64",
];

/// What a scope accepts of the above: the cgroup's settings (resource control and the cgroup's
/// BPF IP filter).
pub const SCOPE_PROPS: &[&str] = &[
    "IPAddressDeny=any",
    "CPUQuota=100%",
    "MemoryMax=512M",
    "TasksMax=64",
];

/// The installed daemon's agent logs (docs/daemon.md: `--state-dir /var/lib/agentos`, logs
/// below it by default).
pub const SYSTEM_LOG_DIR: &str = "/var/lib/agentos/logs";
const TENANT: &str = "bench";

/// Whether systemd is PID 1 (sd_booted(3)'s test).
pub fn systemd_pid1() -> bool {
    Path::new("/run/systemd/system").is_dir()
}

/// Why the systemd modes cannot run here, if they cannot.
pub fn systemd_unavailable() -> Option<String> {
    if !systemd_pid1() {
        return Some("systemd is not PID 1 here (no /run/systemd/system)".into());
    }
    if Command::new("systemd-run")
        .arg("--version")
        .output()
        .is_err()
    {
        return Some("no systemd-run".into());
    }
    None
}

fn stamp_of(out: std::process::Output, what: &str) -> Result<u64> {
    if !out.status.success() {
        bail!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    parse_stamp(&String::from_utf8_lossy(&out.stdout))
}

/// One start as a transient service with [`SERVICE_PROPS`] (`sandboxed`), or with none (what
/// systemd's own path costs: the D-Bus request, the unit, the fork from PID 1).
pub fn systemd_service(stamp: &Path, sandboxed: bool) -> Result<u64> {
    let mut c = Command::new("systemd-run");
    c.args(["--quiet", "--wait", "--pipe", "--collect"]);
    if sandboxed {
        for p in SERVICE_PROPS {
            c.arg("-p").arg(p);
        }
    }
    c.arg(stamp).stdin(Stdio::null());
    let t0 = mono_ns();
    let out = c.output().context("running systemd-run")?;
    Ok(stamp_of(out, "systemd-run (service)")?.saturating_sub(t0))
}

/// One start as a transient scope with [`SCOPE_PROPS`], as nobody.
pub fn systemd_scope(stamp: &Path) -> Result<u64> {
    let mut c = Command::new("systemd-run");
    c.args([
        "--quiet",
        "--scope",
        "--collect",
        "--uid=65534",
        "--gid=65534",
    ]);
    for p in SCOPE_PROPS {
        c.arg("-p").arg(p);
    }
    c.arg(stamp).stdin(Stdio::null());
    let t0 = mono_ns();
    let out = c.output().context("running systemd-run --scope")?;
    Ok(stamp_of(out, "systemd-run --scope")?.saturating_sub(t0))
}

/// Agents started through the installed agentosd on the system bus.
pub struct DbusAgents {
    rt: tokio::runtime::Runtime,
    client: agentctl::client::Client,
    /// The contract for a name (the `agentos` mode's, tenant `bench`).
    contract: Box<dyn Fn(&str) -> String>,
    /// The daemon's agent log directory (`STATE_DIR/logs`).
    log_dir: std::path::PathBuf,
    n: usize,
}

impl DbusAgents {
    /// Connects to agentosd on the system bus; the error says why this mode cannot run.
    pub fn connect(log_dir: &Path, contract: Box<dyn Fn(&str) -> String>) -> Result<Self> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let client = rt
            .block_on(agentctl::client::Client::connect(
                None,
                Some(Duration::from_secs(30)),
            ))
            .map_err(|e| anyhow::anyhow!("{}", e.message))?;
        // Only an agentosd that answers counts: the bus may be up without it.
        rt.block_on(agentctl::client::list_rows(&client))
            .map_err(|e| anyhow::anyhow!("no agentosd on the system bus: {}", e.message))?;
        Ok(DbusAgents {
            rt,
            client,
            contract,
            log_dir: log_dir.to_path_buf(),
            n: 0,
        })
    }

    /// One start: `StartAgent` of a fresh name, the stamp from its log, `RemoveAgent`.
    pub fn start(&mut self) -> Result<u64> {
        self.n += 1;
        let name = format!("sb{}-{}", std::process::id(), self.n);
        let text = (self.contract)(&name);
        let log = self.log_dir.join(TENANT).join(format!("{name}.log"));
        let conn = self.client.connection().clone();
        let manager = |method: &'static str| (method, "/org/agentos1", "org.agentos1.Manager");
        let (m, path, iface) = manager("StartAgent");
        let t0 = mono_ns();
        self.rt
            .block_on(conn.call_method(
                Some("org.agentos1"),
                path,
                Some(iface),
                m,
                &(text.as_str(), "bench-sandbox.yaml"),
            ))
            .with_context(|| format!("StartAgent {name}"))?;
        let stamp = wait_stamp(&log, Duration::from_secs(60));
        let (m, path, iface) = manager("RemoveAgent");
        let removed = self.rt.block_on(conn.call_method(
            Some("org.agentos1"),
            path,
            Some(iface),
            m,
            &(name.as_str(),),
        ));
        remove_logs(&log);
        let stamp = stamp.with_context(|| format!("agent {TENANT}/{name}"))?;
        removed.with_context(|| format!("RemoveAgent {name}"))?;
        Ok(stamp.saturating_sub(t0))
    }
}

/// Polls the agent's log until the stamp's line is in it.
fn wait_stamp(log: &Path, limit: Duration) -> Result<u64> {
    let until = Instant::now() + limit;
    loop {
        if let Ok(text) = std::fs::read_to_string(log)
            && text.ends_with('\n')
            && let Ok(t) = parse_stamp(&text)
        {
            return Ok(t);
        }
        if Instant::now() > until {
            bail!(
                "no stamp in {} after {} s (see `agentctl status`, `journalctl -u agentosd`)",
                log.display(),
                limit.as_secs()
            );
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// The agent's log files (`NAME.log`, `.err`, `.journal`, offsets): the log stays after
/// `RemoveAgent`.
fn remove_logs(log: &Path) {
    let (Some(dir), Some(name)) = (log.parent(), log.file_stem()) else {
        return;
    };
    let prefix = format!("{}.", name.to_string_lossy());
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        if e.file_name().to_string_lossy().starts_with(&prefix) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}
