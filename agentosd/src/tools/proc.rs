//! Start one sandboxed tool process: a private scratch directory, its own cgroup in the
//! caller's subtree (`<root>/agents/<tenant>/<name>/tools/<id>`, under the agent's budgets), the
//! caller's uid/gid, no capabilities, `no_new_privs`, the Landlock plan of
//! [`super::scope`], the agents' seccomp filter, stdio on pipes, every other fd closed.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use contracts::tool::{ToolManifest, expand_args};
use tokio::io::unix::AsyncFd;
use tokio::net::unix::pipe;

use super::{Caller, RunnerConfig, scope};
use crate::cgroup::Cgroup;
use crate::sandbox::{self, PreparedSandbox};
use crate::spawn::{self, Stdio};
use crate::sys::{self, ExitStatus};

const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Default `pids.max` of a tool's cgroup when the manifest names none (a fork bomb in a tool
/// must not take the host down).
pub const DEFAULT_PIDS: u64 = 256;

/// A started tool process.
pub struct Proc {
    pub pid: u32,
    pub pidfd: Arc<OwnedFd>,
    pub stdin: pipe::Sender,
    pub stdout: pipe::Receiver,
    pub stderr: pipe::Receiver,
    pub cgroup: Cgroup,
    pub scratch: PathBuf,
    pub notes: Vec<String>,
    /// Forgets the cgroup's kernel policy when dropped: keep it until the cgroup is gone.
    pub policy: PolicyGuard,
}

/// Where one process lives: `<state>/tools/scratch/<id>` and
/// `<root>/agents/<tenant>/<name>/tools/<id>` (its caller's subtree).
pub struct Place {
    pub id: String,
    pub scratch: PathBuf,
    /// The caller's cgroup (`agents/<tenant>/<name>`), whose budgets cover the tool.
    pub agent_cgroup: Cgroup,
    pub cgroup: Cgroup,
}

impl Place {
    pub fn new(cfg: &RunnerConfig, caller: &Caller, id: String) -> Place {
        let agent_cgroup =
            crate::cgroup::agent_cgroup(&cfg.cgroup_root, &caller.tenant, &caller.name);
        Place {
            scratch: cfg.state_dir.join("tools").join("scratch").join(&id),
            cgroup: agent_cgroup.child(crate::cgroup::AGENT_TOOLS).child(&id),
            agent_cgroup,
            id,
        }
    }
}

/// The kernel policy of one tool cgroup ([`super::CgroupHooks::placed`]); dropping it forgets
/// the policy ([`super::CgroupHooks::removed`]).
#[derive(Debug, Default)]
pub struct PolicyGuard(Option<(Arc<dyn super::CgroupHooks>, Cgroup)>);

impl Drop for PolicyGuard {
    fn drop(&mut self) {
        if let Some((hooks, cg)) = self.0.take() {
            hooks.removed(&cg);
        }
    }
}

/// `<state>/tools/scratch/<id>`, mode 0700, owned by the caller; the directories above it
/// root's, 0711 (traversable, not listable), like the agents' state directories. Made and
/// chowned on fds beneath the daemon's state directory (`safe_fs`): the scratch directory is
/// the caller's uid's, so nothing in it is followed. Returns its fd.
fn make_scratch(
    cfg: &RunnerConfig,
    id: &str,
    uid: u32,
    gid: u32,
) -> Result<crate::safe_fs::Dir, String> {
    let e = |err: crate::safe_fs::SafeFsError| err.to_string();
    let root = crate::safe_fs::Dir::open_root(&cfg.state_dir).map_err(e)?;
    let walkable = |d: &crate::safe_fs::Dir| -> Result<(), String> {
        let mode = d.stat().map_err(e)?.st_mode & 0o7777;
        if mode & 0o001 == 0 {
            d.chmod(mode | 0o711).map_err(e)?;
        }
        Ok(())
    };
    walkable(&root)?;
    let tools = root.mkdir("tools", 0o711).map_err(e)?;
    walkable(&tools)?;
    let parent = tools.mkdir("scratch", 0o711).map_err(e)?;
    walkable(&parent)?;
    let scratch = parent.mkdir(id, 0o700).map_err(e)?;
    let owner = scratch.stat().map_err(e)?.st_uid;
    if owner != 0 && owner != uid {
        return Err(format!(
            "{}: exists and belongs to uid {owner}; remove it",
            scratch.path().display()
        ));
    }
    scratch.chown(uid, gid).map_err(e)?;
    scratch.chmod(0o700).map_err(e)?;
    Ok(scratch)
}

/// Remove a scratch directory and everything the tool left in it, without following its
/// links or crossing a mount (`safe_fs::Dir::remove_tree` beneath `<state>/tools/scratch`).
fn remove_scratch(scratch: &Path) -> Result<(), String> {
    let (Some(parent), Some(name)) = (
        scratch.parent(),
        scratch.file_name().and_then(|n| n.to_str()),
    ) else {
        return Err(format!("{}: not a scratch directory", scratch.display()));
    };
    if !parent.exists() {
        return Ok(());
    }
    let dir = crate::safe_fs::Dir::open_root(parent).map_err(|e| e.to_string())?;
    dir.remove_tree(name).map_err(|e| e.to_string())
}

fn pipe_pair() -> Result<(OwnedFd, OwnedFd), String> {
    rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(|e| format!("pipe2: {e}"))
}

/// Start `m` for `caller` at `place`. `scope` is the caller's scope of the tool's capability
/// (`{scope}`, `$AGENTOS_SCOPE`). On error everything made so far is removed again.
pub async fn launch(
    m: &ToolManifest,
    caller: &Caller,
    cfg: &RunnerConfig,
    place: &Place,
    scope_list: &[String],
) -> Result<Proc, String> {
    match launch_inner(m, caller, cfg, place, scope_list).await {
        Ok(p) => Ok(p),
        Err(e) => {
            cleanup(&place.cgroup, &place.scratch).await;
            Err(e)
        }
    }
}

/// [`launch`] without the clean-up on error, in its order: the scratch directory, the sandbox,
/// the environment, the cgroup, its kernel policy and limits, then the process on pipes.
async fn launch_inner(
    m: &ToolManifest,
    caller: &Caller,
    cfg: &RunnerConfig,
    place: &Place,
    scope_list: &[String],
) -> Result<Proc, String> {
    let program = m.program();
    let scratch_dir = make_scratch(cfg, &place.id, caller.uid, caller.gid)?;
    let eff = scope::effective(&m.needs, caller);
    let cx = scope::arg_context(&eff, caller, &place.scratch, scope_list);
    let args = expand_args(&program.args, &cx);
    let mut notes = Vec::new();
    let prepared = prepare_sandbox(m, caller, place, &eff, &scratch_dir, &mut notes)?;
    let env = tool_env(m, caller, place, scope_list);
    let enabled = make_cgroup(caller, place)?;
    let policy = place_policy(cfg, caller, place, &eff, &mut notes).await?;
    set_limits(m, place, &enabled, &mut notes)?;
    let cmd = spawn::Command {
        program: program.command.clone(),
        args,
        env,
        cwd: place.scratch.clone(),
        log_file: PathBuf::from("/dev/null"),
        err_file: None,
        sandbox: Some(prepared),
        sched: Default::default(),
        inherit_fd: None,
    };
    let (child, stdin, stdout, stderr) = spawn_piped(cmd, &place.cgroup).await?;
    Ok(Proc {
        pid: child.pid,
        pidfd: Arc::new(child.pidfd),
        stdin,
        stdout,
        stderr,
        cgroup: place.cgroup.clone(),
        scratch: place.scratch.clone(),
        notes,
        policy,
    })
}

/// The sandbox the tool process enters: the caller's uid/gid, its Landlock plan (scratch
/// directory, runtime, command, effective scopes; a note instead when the kernel has no
/// Landlock and the caller does not require it) and the agents' seccomp filter. `notes` gets
/// what is not enforced; the sandbox carries the notes made so far.
fn prepare_sandbox(
    m: &ToolManifest,
    caller: &Caller,
    place: &Place,
    eff: &scope::Effective,
    scratch_dir: &crate::safe_fs::Dir,
    notes: &mut Vec<String>,
) -> Result<PreparedSandbox, String> {
    let program = m.program();
    let plan = scope::plan(eff, &m.needs.runtime, &program.command, &place.scratch)
        .map_err(|e| e.to_string())?;
    let landlock = match sandbox::landlock::kernel_abi() {
        None if caller.grants.must_landlock => {
            return Err(format!(
                "agent {} requires landlock (must) but this kernel has none",
                caller.agent
            ));
        }
        None => {
            notes.push(
                "landlock: not available, the tool's filesystem scope is not enforced".into(),
            );
            None
        }
        Some(_) => sandbox::landlock::build_with(
            &plan,
            caller.grants.must_landlock,
            &scope::opener(scratch_dir, &m.needs.runtime, &program.command),
        )
        .map_err(|e| e.to_string())?,
    };
    let seccomp = sandbox::seccomp::compiled().map_err(|e| e.to_string())?;
    Ok(PreparedSandbox {
        uid: caller.uid,
        gid: caller.gid,
        home: place.scratch.clone(),
        landlock,
        landlock_pooled: false,
        seccomp,
        notes: notes.clone(),
        last_cap: sandbox::cap_last_cap(),
        namespaces: Default::default(),
        netns: None,
        ipcns: None,
        notify: Vec::new(),
    })
}

/// The tool's environment: a fixed PATH and locale, its scratch directory as HOME and TMPDIR,
/// who calls it (`AGENTOS_*`), then the manifest's own variables with `{state}`, `{agent}`
/// and `{scratch}` filled in (each replacing a variable of the same name).
fn tool_env(
    m: &ToolManifest,
    caller: &Caller,
    place: &Place,
    scope_list: &[String],
) -> Vec<(String, String)> {
    let scratch = place.scratch.display().to_string();
    let mut env: Vec<(String, String)> = vec![
        ("PATH".into(), PATH.into()),
        ("LANG".into(), "C.UTF-8".into()),
        ("HOME".into(), scratch.clone()),
        ("TMPDIR".into(), scratch.clone()),
        ("AGENTOS_TOOL".into(), m.name.clone()),
        ("AGENTOS_AGENT".into(), caller.agent.clone()),
        ("AGENTOS_TENANT".into(), caller.tenant.clone()),
        (
            "AGENTOS_SCOPE".into(),
            serde_json::to_string(scope_list).unwrap_or_else(|_| "[]".into()),
        ),
    ];
    for (k, v) in &m.program().env {
        let v = v
            .replace("{state}", &caller.home.display().to_string())
            .replace("{agent}", &caller.agent)
            .replace("{scratch}", &scratch);
        env.retain(|(ek, _)| ek != k);
        env.push((k.clone(), v));
    }
    env
}

/// The cgroup: in the caller's subtree, so the agent's budgets (pids.max, memory.max,
/// cpu.max on `agents/<tenant>/<name>`) count the tool too; created fresh, its own limits
/// set before anything runs in it. Never made when the agent's cgroup is gone (the agent
/// stopped): a call racing with the stop must not bring it back. Returns the controllers
/// enabled for the tool cgroups.
fn make_cgroup(caller: &Caller, place: &Place) -> Result<Vec<String>, String> {
    if !place.agent_cgroup.exists() {
        return Err(format!(
            "the cgroup of agent {} ({}) does not exist: tools run only while their agent runs",
            caller.agent,
            place.agent_cgroup.path().display()
        ));
    }
    let tools_cg = place.agent_cgroup.child(crate::cgroup::AGENT_TOOLS);
    tools_cg.create_in_existing().map_err(|e| e.to_string())?;
    place
        .agent_cgroup
        .enable_subtree(crate::cgroup::AGENT_CHILD_CONTROLLERS);
    let enabled = tools_cg.enable_subtree(crate::cgroup::AGENT_CHILD_CONTROLLERS);
    if !place
        .cgroup
        .create_in_existing()
        .map_err(|e| e.to_string())?
    {
        return Err(format!(
            "tool cgroup {} exists already; not reusing it",
            place.cgroup.path().display()
        ));
    }
    Ok(enabled)
}

/// The kernel policy of the tool's cgroup (the caller's connect and bind scopes), placed by
/// the runner's hooks when there are any; its notes go to `notes`.
async fn place_policy(
    cfg: &RunnerConfig,
    caller: &Caller,
    place: &Place,
    eff: &scope::Effective,
    notes: &mut Vec<String>,
) -> Result<PolicyGuard, String> {
    Ok(match &cfg.hooks {
        None => PolicyGuard::default(),
        Some(h) => {
            let (h, caller, cg) = (h.clone(), caller.clone(), place.cgroup.clone());
            let (connect, bind) = (eff.connect.clone(), eff.bind.clone());
            let guard = PolicyGuard(Some((h.clone(), cg.clone())));
            let placed =
                tokio::task::spawn_blocking(move || h.placed(&caller, &cg, &connect, &bind))
                    .await
                    .map_err(|e| format!("tool cgroup policy task: {e}"))??;
            notes.extend(placed);
            guard
        }
    })
}

/// The tool cgroup's own limits: `pids.max` (the manifest's or [`DEFAULT_PIDS`]) and
/// `memory.max` without swap when the manifest names one. A limit the manifest names that the
/// host cannot enforce refuses the call when `limits.must`, else the call runs without it and a
/// note says so (the same policy as an agent's budgets).
fn set_limits(
    m: &ToolManifest,
    place: &Place,
    enabled: &[String],
    notes: &mut Vec<String>,
) -> Result<(), String> {
    let missing = |what: &str, ctl: &str, notes: &mut Vec<String>| -> Result<(), String> {
        let why = format!("{what}: the {ctl} controller is not available for tool cgroups");
        if m.limits.must {
            return Err(format!("{why} (limits.must: true)"));
        }
        let note = format!("{why}: not enforced (limits.must is false)");
        warn_once(&m.name, &note);
        notes.push(note);
        Ok(())
    };
    let pids = m.limits.pids.unwrap_or(DEFAULT_PIDS);
    if enabled.iter().any(|c| c == "pids") {
        place
            .cgroup
            .set("pids.max", &pids.to_string())
            .map_err(|e| e.to_string())?;
    } else if m.limits.pids.is_some() {
        missing("limits.pids", "pids", notes)?;
    } else {
        notes.push("pids controller unavailable: no process limit".into());
    }
    if let Some(mem) = m.limits.mem_bytes {
        if !enabled.iter().any(|c| c == "memory") {
            return missing("limits.mem", "memory", notes);
        }
        place
            .cgroup
            .set("memory.max", &mem.to_string())
            .map_err(|e| e.to_string())?;
        let _ = place.cgroup.set("memory.swap.max", "0");
    }
    Ok(())
}

/// Log `note` about tool `tool` the first time it happens (every call would repeat it).
fn warn_once(tool: &str, note: &str) {
    static SEEN: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let key = format!("{tool}: {note}");
    let mut seen = SEEN.lock().unwrap_or_else(|p| p.into_inner());
    if !seen.contains(&key) && seen.len() < 1024 {
        tracing::warn!("tool {key}");
        seen.push(key);
    }
}

/// Spawns `cmd` into cgroup `cg` with its stdio on fresh pipes; returns the child and the
/// daemon's ends (stdin, stdout, stderr).
async fn spawn_piped(
    cmd: spawn::Command,
    cg: &Cgroup,
) -> Result<(spawn::Child, pipe::Sender, pipe::Receiver, pipe::Receiver), String> {
    let (in_r, in_w) = pipe_pair()?;
    let (out_r, out_w) = pipe_pair()?;
    let (err_r, err_w) = pipe_pair()?;
    let dirfd = cg.open_dir().map_err(|e| e.to_string())?;
    let child = tokio::task::spawn_blocking(move || {
        let stdio = Stdio {
            stdin: in_r.as_fd(),
            stdout: out_w.as_fd(),
            stderr: err_w.as_fd(),
        };
        // The child's ends are closed here when the closure returns. The tool gets the daemon's
        // priority, not that of its work for agents (agent_work.rs).
        crate::agent_work::at_daemon_priority(|| spawn::spawn_with_stdio(&cmd, &dirfd, Some(stdio)))
    })
    .await
    .map_err(|e| format!("spawn task: {e}"))?
    .map_err(|e| e.to_string())?;
    let pipe_err = |e: std::io::Error| format!("pipe: {e}");
    let stdin = pipe::Sender::from_owned_fd(in_w).map_err(pipe_err)?;
    let stdout = pipe::Receiver::from_owned_fd(out_r).map_err(pipe_err)?;
    let stderr = pipe::Receiver::from_owned_fd(err_r).map_err(pipe_err)?;
    Ok((child, stdin, stdout, stderr))
}

/// Wait until the process behind `pidfd` (our child) has exited and reap it.
pub async fn wait_exit(pidfd: &Arc<OwnedFd>) -> ExitStatus {
    // SAFETY: the fd is owned by the Arc<OwnedFd> moved into the AsyncFd, so it stays open and
    // refers to the same pidfd for the AsyncFd's whole lifetime.
    let registered =
        unsafe { AsyncFd::register_with_interest(pidfd.clone(), tokio::io::Interest::READABLE) };
    let Ok(afd) = registered else {
        // Not pollable (should not happen with a pidfd): poll with a timer instead.
        loop {
            match sys::pidfd_try_wait(pidfd.as_fd()) {
                Ok(Some(s)) => return s,
                Ok(None) => tokio::time::sleep(Duration::from_millis(20)).await,
                Err(_) => return ExitStatus::Unknown,
            }
        }
    };
    loop {
        match afd.readable().await {
            Ok(mut guard) => match sys::pidfd_try_wait(pidfd.as_fd()) {
                Ok(Some(s)) => return s,
                Ok(None) => {
                    guard.clear_ready();
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err(_) => return ExitStatus::Unknown,
            },
            Err(_) => return ExitStatus::Unknown,
        }
    }
}

/// Kill everything left in the cgroup (`cgroup.kill`), wait until it is empty, remove it and
/// the scratch directory.
pub async fn cleanup(cg: &Cgroup, scratch: &Path) {
    if cg.exists() {
        if let Err(e) = cg.kill() {
            tracing::warn!("tools: {e}");
        }
        let _ = cg
            .wait_events("tool cgroup to empty", Duration::from_secs(5), |e| {
                !e.populated
            })
            .await;
        if let Err(e) = cg.remove() {
            tracing::warn!("tools: {e}");
        }
    }
    if let Err(e) = remove_scratch(scratch) {
        tracing::warn!("tools: remove {}: {e}", scratch.display());
    }
}

/// Kill the tool's processes now (timeout, cancel, output overflow).
pub fn kill(cg: &Cgroup) {
    if let Err(e) = cg.kill() {
        tracing::warn!("tools: {e}");
    }
}
