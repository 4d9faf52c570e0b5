//! The daemon's main loop: choose the cgroup root, probe the host, re-adopt agents, serve the
//! D-Bus API, load the agents directory, tell systemd we are ready, and stop on SIGTERM leaving
//! the agents running.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tracing::{info, warn};
use zbus::fdo::{RequestNameFlags, RequestNameReply};

use crate::cgroup::{self, Cgroup};
use crate::dbus::{self, MANAGER_PATH, Manager, SERVICE};
use crate::supervisor::{Config, Supervisor};

/// The daemon's own memory bound by default: about seven times its resident size with 200
/// agents (75 MB measured, debug build; docs/daemon.md).
pub const SELF_MEMORY_MAX: &str = "536870912";
/// Its own tasks bound by default: tokio's blocking pools (512 each: the control plane's runtime
/// and the agents' one, agent_work.rs) and the runtimes' threads, with room for tool runners'
/// short-lived helpers.
pub const SELF_TASKS_MAX: &str = "4096";

/// Daemon settings (flags of `agentosd run`).
#[derive(Debug, Clone)]
pub struct Options {
    pub state_dir: PathBuf,
    pub agents_dir: PathBuf,
    pub cgroup_root: Option<PathBuf>,
    pub log_dir: Option<PathBuf>,
    pub bus_address: Option<String>,
    pub stop_timeout: Duration,
    pub stop_agents_on_exit: bool,
    /// Audit log directory [default: STATE_DIR/audit].
    pub audit_dir: Option<PathBuf>,
    /// Audit signing key, created 0600 when missing [default: STATE_DIR/audit.key].
    pub audit_key: Option<PathBuf>,
    /// Forward audit records to the journal when its socket exists.
    pub audit_journal: bool,
    /// Load the sched_ext scheduler scx_agentos (`--sched-ext`); see scx.rs.
    pub sched_ext: bool,
    /// Count each agent's syscalls on the global syscall-entry hook (`--syscall-counts`; every
    /// process on the host pays for it, so off by default). See enforce/sysc.rs.
    pub syscall_counts: bool,
    /// Leave pathname Unix sockets to the BPF LSM fence alone (`--no-landlock-unix`); refused
    /// when that fence is not active.
    pub no_landlock_unix: bool,
    /// Tool manifests (`--tools-dir`).
    pub tools_dir: PathBuf,
    /// Sockets directory [default: /run/agentos with the default state dir, else STATE_DIR/run].
    pub run_dir: Option<PathBuf>,
    /// How long a call held for consent waits.
    pub consent_timeout: Duration,
    /// `tools/call` requests of one agent in flight at once, over all its connections
    /// (`--max-tool-calls-per-agent`; `mcp::SessionLimits::max_calls_per_agent`).
    pub max_tool_calls_per_agent: usize,
    /// Nice steps below the daemon's priority for its work for agents (`--agent-work-nice`;
    /// 0: none, the sessions share the daemon's runtime). See agent_work.rs.
    pub agent_work_nice: i32,
    /// The scheduling slice the threads of that work ask for, µs (`--agent-work-slice-us`; 0:
    /// the kernel's). See agent_work.rs.
    pub agent_work_slice_us: u64,
    /// Worker threads of the agents' runtime (`--agent-workers`; 0: one per CPU, at most 4).
    pub agent_workers: usize,
    /// Polls between the agents' runtime's looks at its I/O driver and at tasks woken from
    /// outside (`--agent-poll-interval`, agent_work.rs).
    pub agent_poll_interval: u32,
    /// The agents' sockets' bounds (`--ipc-inbound-bytes`, `--ipc-outbound-bytes`,
    /// `--ipc-agent-bytes`, `--ipc-stall-timeout`; the rest are built in). See ipc/.
    pub ipc: crate::ipc::Limits,
    /// bpffs directory where the network and filesystem programs' links and maps are pinned so
    /// that they outlive the daemon (`--bpf-pin-dir`; `None`: not pinned). See enforce/pins.rs.
    pub bpf_pin_dir: Option<PathBuf>,
    /// D-Bus authorization rules (`--authz`, `authz::Rule` syntax); empty: `authz::DEFAULT_RULE`.
    pub authz: Vec<String>,
    /// Whether polkit decides instead of `authz` (`--polkit`).
    pub polkit: crate::polkit::Mode,
    /// Per-agent rate limit of denial records (`--denial-records-per-sec`, `-burst`).
    pub denial_records: crate::enforce::limit::Limits,
    /// The agents' DNS stubs (`--dns-upstream`, `--dns-grace`); no upstream given: the
    /// nameservers of /etc/resolv.conf, read at start.
    pub dns: crate::dns::Config,
    /// The daemon's own `memory.max` and `pids.max` (its leaf `ROOT/supervisor`, when it runs
    /// in one): `--self-memory-max`, `--self-tasks-max`.
    pub self_memory_max: String,
    pub self_tasks_max: String,
    /// How much of each agent's output the daemon keeps and takes in (`--log-journal-max`,
    /// `--log-rate`); see logs/.
    pub logs: crate::logs::Limits,
    /// The model gateway's backends (`--models`); `None`: `models::config::DEFAULT_PATH` if it
    /// exists, else no gateway.
    pub models: Option<PathBuf>,
    /// OpenTelemetry export (`--otlp-endpoint` and companions; `None`: off). See telemetry/.
    pub otlp: Option<crate::telemetry::OtlpConfig>,
    /// Free space kept on the audit and state file systems (`--storage-reserve`,
    /// `--storage-reserve-percent`); see storage/.
    pub storage_reserve: crate::storage::Reserve,
    /// How often the reserve is checked (`--storage-check-interval`).
    pub storage_check_interval: Duration,
    /// Uids handed to agents (`--agent-uids`); see sandbox/identity.rs.
    pub agent_uids: crate::sandbox::identity::UidRange,
    /// Agents' disk quotas where the contract sets none (`--agent-disk-default`,
    /// `--agent-disk-inodes-default`); see storage/quota.rs.
    pub agent_disk: crate::storage::quota::DiskDefaults,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            state_dir: PathBuf::from("/var/lib/agentos"),
            agents_dir: PathBuf::from("/etc/agentos/agents.d"),
            cgroup_root: None,
            log_dir: None,
            bus_address: None,
            stop_timeout: Duration::from_secs(10),
            stop_agents_on_exit: false,
            audit_dir: None,
            audit_key: None,
            audit_journal: true,
            sched_ext: false,
            syscall_counts: false,
            no_landlock_unix: false,
            tools_dir: PathBuf::from("/etc/agentos/tools.d"),
            run_dir: None,
            consent_timeout: Duration::from_secs(120),
            max_tool_calls_per_agent: crate::mcp::DEFAULT_MAX_CALLS_PER_AGENT,
            agent_work_nice: crate::agent_work::DEFAULT_NICE,
            agent_work_slice_us: crate::agent_work::DEFAULT_SLICE_US,
            agent_workers: 0,
            agent_poll_interval: crate::agent_work::DEFAULT_POLL_INTERVAL,
            ipc: Default::default(),
            bpf_pin_dir: Some(PathBuf::from(crate::enforce::net::DEFAULT_PIN_ROOT)),
            authz: Vec::new(),
            polkit: crate::polkit::Mode::Auto,
            denial_records: Default::default(),
            dns: Default::default(),
            logs: Default::default(),
            self_memory_max: SELF_MEMORY_MAX.to_string(),
            self_tasks_max: SELF_TASKS_MAX.to_string(),
            models: None,
            otlp: None,
            storage_reserve: Default::default(),
            storage_check_interval: crate::storage::DEFAULT_CHECK_INTERVAL,
            agent_uids: Default::default(),
            agent_disk: Default::default(),
        }
    }
}

/// Whether systemd started us (a service has INVOCATION_ID; Type=notify has NOTIFY_SOCKET).
pub fn under_systemd() -> bool {
    std::env::var_os("INVOCATION_ID").is_some() || std::env::var_os("NOTIFY_SOCKET").is_some()
}

/// The cgroup root to own, and whether it is the cgroup systemd delegated to us (then the daemon
/// moves itself into `ROOT/supervisor`, a leaf, so controllers can be enabled below ROOT).
///
/// Default: under systemd, our own cgroup (`Delegate=yes`); otherwise `MOUNT/agentos` where MOUNT
/// is the cgroup2 mount (`/sys/fs/cgroup` on a unified host, `/sys/fs/cgroup/unified` on a
/// hybrid one).
pub fn resolve_cgroup_root(explicit: Option<&Path>) -> Result<(PathBuf, bool)> {
    if let Some(p) = explicit {
        return Ok((p.to_path_buf(), false));
    }
    let mount = cgroup::cgroup2_mount().context(
        "no cgroup2 file system is mounted (see /proc/self/mountinfo); mount one or pass --cgroup-root",
    )?;
    if under_systemd() {
        let own = cgroup::proc_cgroup("self").context("cannot read /proc/self/cgroup")?;
        let mut root = mount.join(own.trim_start_matches('/'));
        if root.ends_with("supervisor") {
            root.pop();
        }
        return Ok((root, true));
    }
    Ok((mount.join("agentos"), false))
}

/// Move this process into `ROOT/supervisor` when it lives in ROOT itself (no-internal-process
/// rule: ROOT must be empty to hand controllers to its children).
fn leave_root(root: &Path) -> Result<()> {
    let Some(mount) = cgroup::cgroup2_mount() else {
        return Ok(());
    };
    let own = cgroup::proc_cgroup("self").unwrap_or_default();
    let own_path = mount.join(own.trim_start_matches('/'));
    if own_path != root {
        return Ok(());
    }
    let sup = Cgroup::new(root.join("supervisor"));
    sup.create()?;
    sup.add_proc(std::process::id())
        .with_context(|| format!("moving agentosd into {}", sup.path().display()))?;
    info!("moved agentosd into {}", sup.path().display());
    Ok(())
}

/// The daemon's own budget: `memory.max` and `pids.max` of `ROOT/supervisor`, the leaf it runs
/// in (`--self-memory-max`, `--self-tasks-max`), so that the daemon cannot take what its agents'
/// budgets leave (the unit's `MemoryMax=` would bound the agents too). Said when it cannot.
fn bound_self(root: &Path, opts: &Options) {
    let leaf = Cgroup::new(root.join("supervisor"));
    let own = cgroup::cgroup2_mount()
        .zip(cgroup::proc_cgroup("self"))
        .map(|(m, c)| m.join(c.trim_start_matches('/')));
    if own.as_deref() != Some(leaf.path()) {
        return;
    }
    for (file, value, flag) in [
        ("memory.max", &opts.self_memory_max, "--self-memory-max"),
        ("pids.max", &opts.self_tasks_max, "--self-tasks-max"),
    ] {
        match leaf.set(file, value) {
            Ok(()) => info!("{}/{file} = {value} ({flag})", leaf.path().display()),
            Err(e) => warn!(
                "the daemon's own {file} is not bounded ({flag}): {e}; is the controller enabled in {}/cgroup.subtree_control?",
                root.display()
            ),
        }
    }
}

/// The agents' MCP sockets (io_uring), the tools in `--tools-dir`, the gate and consent. Without
/// io_uring the daemon runs on and says why agents get no tool socket (`agentosd check` shows it).
fn setup_mcp(sup: &std::sync::Arc<Supervisor>, opts: &Options, root: &Path) {
    let run_dir = run_dir(opts);
    let slice_ns = opts.agent_work_slice_us.saturating_mul(1000);
    let agents = agents_runtime(
        opts.agent_work_nice,
        slice_ns,
        opts.agent_workers,
        opts.agent_poll_interval,
    );
    let mut limits = opts.ipc.clone();
    limits.nice = agents.as_ref().map(|(_, n)| *n);
    limits.slice_ns = slice_ns;
    let started = {
        // The ring waits for the sessions' queues on the runtime it is started in.
        let _g = agents.as_ref().map(|(h, _)| h.enter());
        crate::ipc::IpcServer::start(limits)
    };
    let (ipc, incoming) = match started {
        Ok(x) => x,
        Err(e) => {
            warn!("agents get no MCP socket, so no tools: {e}");
            return;
        }
    };
    let (tools, errors) = crate::tools::Tools::load(
        &opts.tools_dir,
        crate::tools::RunnerConfig {
            cgroup_root: Cgroup::new(root),
            state_dir: opts.state_dir.clone(),
            hooks: Some(sup.tool_cgroup_hooks()),
        },
    );
    for e in &errors {
        warn!("tool manifest not loaded: {e}");
    }
    info!(
        "MCP: {} tool manifest(s) from {}, sockets under {}, consent timeout {} s",
        tools.manifests().count(),
        opts.tools_dir.display(),
        run_dir.join("agents").display(),
        opts.consent_timeout.as_secs()
    );
    let consents = std::sync::Arc::new(crate::mcp::consent::Consents::new(opts.consent_timeout));
    watch_stalls(&ipc.cpu_ledger(), root, opts.ipc.agent_cpu_stall);
    // The audit log's CPU for an agent's records is charged to its share too (audit_trail.rs).
    if let Some(t) = sup.audit_trail() {
        t.set_cpu_ledger(ipc.cpu_ledger());
    }
    let service = crate::mcp::McpService::new(
        sup.mcp_callers(),
        sup.audit_trail().cloned(),
        tools,
        consents,
        sup.telemetry().clone(),
        crate::mcp::SessionLimits {
            max_calls_per_agent: opts.max_tool_calls_per_agent.max(1),
            max_line: opts.ipc.max_line,
            records: opts.denial_records,
            cpu: ipc.cpu_ledger(),
            ..Default::default()
        },
    );
    info!(
        "MCP sockets bounded per connection at {} B in, {} B out, {} B per agent; a connection over its outbound bound for {} ms is closed; each agent read at most {} B/s and {}‰ of one CPU of the daemon, burst {} ms (0: no rate)",
        opts.ipc.inbound_bytes,
        opts.ipc.outbound_bytes,
        opts.ipc.agent_bytes,
        opts.ipc.stall_timeout.as_millis(),
        opts.ipc.agent_rate,
        opts.ipc.agent_cpu.permille,
        opts.ipc.agent_cpu.burst.as_millis()
    );
    match &agents {
        Some((h, nice)) => {
            let slice = match opts.agent_work_slice_us {
                0 => "the kernel's".to_string(),
                us => format!("{us} µs"),
            };
            info!(
                "agents' sockets and MCP sessions served at nice {nice} (--agent-work-nice {}), \
                 scheduling slice {slice} (--agent-work-slice-us)",
                opts.agent_work_nice
            );
            h.spawn(service.clone().run(incoming));
        }
        None => {
            tokio::spawn(service.clone().run(incoming));
        }
    }
    sup.set_mcp(crate::supervisor::McpHooks {
        ipc,
        service,
        run_dir,
    });
}

/// Whether agents over their CPU share are also held while another agent waits for a CPU
/// (`--ipc-agent-cpu-stall`, ipc/stalls.rs): said either way, and why not.
fn watch_stalls(ledger: &std::sync::Arc<crate::ipc::cpu::CpuLedger>, root: &Path, permille: u64) {
    if permille == 0 {
        info!(
            "agents over their CPU share are held only over the ceiling (--ipc-agent-cpu-stall 0)"
        );
        return;
    }
    let agents = root.join("agents");
    let outcome = crate::ipc::stalls::available(&agents).and_then(|()| {
        ledger
            .watch_stalls(agents, permille)
            .map_err(|e| format!("cannot start the thread that reads it: {e}"))
    });
    match outcome {
        Ok(true) => info!(
            "agents over their CPU share are held while another agent waits for a CPU over {}.{}% of the time (--ipc-agent-cpu-stall; cpu.pressure)",
            permille / 10,
            permille % 10
        ),
        Ok(false) => {}
        Err(why) => warn!(
            "agents' waits for a CPU are not watched (--ipc-agent-cpu-stall): {why}; only the daemon's CPU against --ipc-agent-cpu-ceiling decides when an agent over its share is held"
        ),
    }
}

/// The agents' sessions' runtime (agent_work.rs), made once and kept for the process's life,
/// and its nice value; None with `--agent-work-nice 0` or when it cannot be made.
fn agents_runtime(
    offset: i32,
    slice_ns: u64,
    workers: usize,
    poll_interval: u32,
) -> Option<(tokio::runtime::Handle, i32)> {
    static RT: std::sync::OnceLock<(tokio::runtime::Runtime, i32)> = std::sync::OnceLock::new();
    if offset <= 0 {
        return None;
    }
    if let Some((rt, n)) = RT.get() {
        return Some((rt.handle().clone(), *n));
    }
    let nice = crate::agent_work::agents_nice(offset);
    match crate::agent_work::runtime(
        nice,
        slice_ns,
        crate::agent_work::workers(workers),
        poll_interval,
    ) {
        Ok(rt) => {
            let (rt, n) = RT.get_or_init(|| (rt, nice));
            Some((rt.handle().clone(), *n))
        }
        Err(e) => {
            warn!("agents are served at the daemon's own priority: cannot make their runtime: {e}");
            None
        }
    }
}

/// Sockets directory: `--run-dir`, else /run/agentos with the default state dir, else
/// STATE_DIR/run.
fn run_dir(opts: &Options) -> PathBuf {
    opts.run_dir.clone().unwrap_or_else(|| {
        if opts.state_dir == Options::default().state_dir {
            PathBuf::from("/run/agentos")
        } else {
            opts.state_dir.join("run")
        }
    })
}

/// The model gateway's configuration: `--models FILE` (must exist), else the default path if
/// it exists. A file that does not parse stops the daemon with its path and the problem.
fn load_models(opts: &Options) -> Result<Option<crate::models::ModelsConfig>> {
    let (path, explicit) = match &opts.models {
        Some(p) => (p.clone(), true),
        None => (PathBuf::from(crate::models::config::DEFAULT_PATH), false),
    };
    let cfg = crate::models::ModelsConfig::load(&path, explicit)
        .map_err(|e| anyhow::anyhow!("model gateway configuration: {e}"))?;
    if let Some(c) = &cfg {
        info!(
            "model gateway: {} backend(s), {} model(s) from {}",
            c.backends.len(),
            c.models.len(),
            path.display()
        );
    }
    Ok(cfg)
}

/// Serve the agents' model sockets when backends are configured; consent requests for models
/// go where the tools' go.
fn setup_models(
    sup: &std::sync::Arc<Supervisor>,
    opts: &Options,
    cfg: crate::models::ModelsConfig,
) {
    let gateway = crate::models::Gateway::new(
        cfg,
        sup.audit_trail().cloned(),
        Some(&opts.state_dir),
        sup.telemetry().clone(),
    );
    gateway.set_agent_rate(opts.ipc.agent_rate);
    // One CPU share per agent over its MCP sockets and the gateway (ipc/cpu.rs).
    let ledger = match sup.mcp() {
        Some(m) => m.ipc.cpu_ledger(),
        None => std::sync::Arc::new(crate::ipc::cpu::CpuLedger::new(opts.ipc.agent_cpu)),
    };
    // Without MCP sockets the gateway's ledger is the one the audit log charges (else a no-op).
    if let Some(t) = sup.audit_trail() {
        t.set_cpu_ledger(ledger.clone());
    }
    gateway.set_cpu_ledger(ledger);
    tokio::spawn(gateway.clone().keep_ledger());
    tokio::spawn(gateway.clone().report_refusals());
    if let Some(m) = sup.mcp() {
        gateway.set_consents(m.service.consents().clone());
    }
    sup.set_models(crate::supervisor::ModelHooks {
        gateway,
        run_dir: run_dir(opts),
    });
}

/// Run the daemon until SIGTERM/SIGINT.
pub async fn run(opts: Options) -> Result<()> {
    let t0 = Instant::now();
    if crate::sandbox::identity::set_range(opts.agent_uids).is_err()
        && crate::sandbox::identity::range() != opts.agent_uids
    {
        bail!(
            "--agent-uids {}-{}: this process already hands out {:?}",
            opts.agent_uids.first,
            opts.agent_uids.last,
            crate::sandbox::identity::range()
        );
    }
    info!(
        "agent uids {}-{}: {} agents",
        opts.agent_uids.first,
        opts.agent_uids.last,
        opts.agent_uids.len()
    );
    // Before the ipc ring sizes its table of registered files by it.
    match crate::sys::rlimit::raise_nofile() {
        Ok(n) => info!("{}", crate::sys::rlimit::describe(&n)),
        Err(e) => warn!(
            "{e}: keeping {}",
            crate::sys::rlimit::describe(&crate::sys::rlimit::nofile())
        ),
    }
    let (root, delegated) = resolve_cgroup_root(opts.cgroup_root.as_deref())?;
    if delegated || opts.cgroup_root.is_some() {
        Cgroup::new(&root)
            .create()
            .with_context(|| format!("creating cgroup root {}", root.display()))?;
        leave_root(&root)?;
    }
    let (sup, rx, trail, scx, report) = build_supervisor(&opts, &root)?;
    bound_self(&root, &opts);
    // Agents' network namespaces, made ahead of their starts (sandbox/netns_pool.rs).
    crate::sandbox::netns_pool::fill();
    let missing = sup.missing_controllers();
    report_budgets(&root, &missing);

    for line in sup.readopt().await {
        info!("{line}");
    }
    // Entries a previous daemon left in the pinned maps for agents that ended meanwhile; the
    // filesystem programs it pinned go only now, with every re-adopted agent's scope installed.
    if let Ok(f) = sup.fs() {
        f.adopted();
    }
    // Only now: what the pinned ring buffers hold from while the daemon was down is attributed
    // to the re-adopted agents.
    sup.spawn_denial_reader();
    if let Ok(n) = sup.net() {
        let gone = n.forget_unknown();
        if gone > 0 {
            info!(
                "network policy: forgot {gone} entries of agents that ended while the daemon was down"
            );
        }
    }

    let conn = serve_bus(&opts, &sup, &report, missing, rx).await?;

    for line in sup.load_agents_dir().await {
        info!("{line}");
    }
    if std::env::var_os("NOTIFY_SOCKET").is_some() {
        let status = format!("managing {} agents", sup.count());
        if let Err(e) = sd_notify::notify(&[
            sd_notify::NotifyState::Ready,
            sd_notify::NotifyState::Status(&status),
        ]) {
            warn!("sd_notify READY=1 failed: {e}");
        }
    }
    info!(
        "ready in {:?}: {} agents, bus name {SERVICE}, cgroup root {}",
        t0.elapsed(),
        sup.count(),
        root.display()
    );

    spawn_log_ingest(&sup);

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let bus_lost = watch_bus(conn.clone());
    tokio::select! {
        _ = term.recv() => info!("SIGTERM"),
        _ = int.recv() => info!("SIGINT"),
        e = bus_lost => {
            // Without the bus nobody can reach us: exit non-zero so systemd restarts the daemon
            // (Restart=on-failure); the agents keep running and are re-adopted.
            bail!("lost the D-Bus connection ({e}); exiting, agents keep running");
        }
    }
    shut_down(&opts, &sup, &trail, scx.as_ref()).await;
    drop(conn);
    Ok(())
}

/// Serve the manager and the agents' objects on the bus, forward the supervisor's events, and
/// take the bus name.
async fn serve_bus(
    opts: &Options,
    sup: &std::sync::Arc<Supervisor>,
    report: &crate::probe::HostReport,
    missing: Vec<String>,
    rx: tokio::sync::mpsc::UnboundedReceiver<crate::supervisor::Event>,
) -> Result<zbus::Connection> {
    let (policy, unknown) = crate::authz::Policy::from_rules(&opts.authz)
        .map_err(anyhow::Error::msg)?
        .resolve();
    if !unknown.is_empty() {
        tracing::warn!(
            "authorization rules name {} that do not exist here: those rules match nobody",
            unknown.join(", ")
        );
    }
    let builder = match &opts.bus_address {
        Some(a) => zbus::connection::Builder::address(a.as_str()),
        None => zbus::connection::Builder::system(),
    };
    let conn = builder
        .build()
        .await
        .with_context(|| match &opts.bus_address {
            Some(a) => format!("connecting to the D-Bus at {a}"),
            None => "connecting to the system bus (no system bus? pass --bus-address)".to_string(),
        })?;
    let polkit = crate::polkit::Polkit::for_mode(opts.polkit, &conn)
        .await
        .map(std::sync::Arc::new);
    match (&polkit, opts.authz.is_empty()) {
        (Some(_), true) => info!(
            "authorization: polkit ({}) decides for callers other than root",
            crate::polkit::SERVICE
        ),
        (Some(_), false) => warn!(
            "authorization: polkit ({}) decides for callers other than root; the --authz rules are not used (write polkit rules instead, or pass --polkit no)",
            crate::polkit::SERVICE
        ),
        (None, _) => info!("authorization: built-in rules (--authz), root holds every action"),
    }
    let subscribers = std::sync::Arc::new(dbus::signals::Subscribers::default());
    let manager = Manager {
        authz: std::sync::Arc::new(policy),
        polkit,
        sup: sup.clone(),
        host_report_json: report.to_json(),
        missing_budgets: missing,
        version: env!("CARGO_PKG_VERSION").to_string(),
        subscribers: subscribers.clone(),
        jobs: std::sync::Arc::default(),
    };
    conn.object_server()
        .at(MANAGER_PATH, manager)
        .await
        .context("serving the manager object")?;
    dbus::introspect::install_tree(conn.object_server()).await;
    for a in sup.agents() {
        dbus::register_agent(conn.object_server(), sup, &a).await;
    }
    tokio::spawn(dbus::pump_events(
        conn.clone(),
        sup.clone(),
        subscribers.clone(),
        rx,
    ));
    tokio::spawn(dbus::pump_consents(
        conn.clone(),
        sup.clone(),
        subscribers.clone(),
    ));
    tokio::spawn(dbus::pump_storage(
        conn.clone(),
        sup.clone(),
        subscribers.clone(),
    ));
    tokio::spawn(dbus::signals::reap_departed(conn.clone(), subscribers));
    let reply = conn
        .request_name_with_flags(SERVICE, RequestNameFlags::DO_NOT_QUEUE)
        .await
        .with_context(|| format!("requesting the bus name {SERVICE}"))?;
    if !matches!(
        reply,
        RequestNameReply::PrimaryOwner | RequestNameReply::AlreadyOwner
    ) {
        bail!("the bus name {SERVICE} is owned by another process (is agentosd already running?)");
    }

    Ok(conn)
}

/// After SIGTERM/SIGINT: stop the agents if asked, the tool servers and sockets, record the
/// stop, unload scx_agentos.
async fn shut_down(
    opts: &Options,
    sup: &std::sync::Arc<Supervisor>,
    trail: &crate::audit_trail::AuditTrail,
    scx: Option<&std::sync::Arc<crate::scx::Scx>>,
) {
    if std::env::var_os("NOTIFY_SOCKET").is_some() {
        let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
    }
    if opts.stop_agents_on_exit {
        info!("stopping all agents (--stop-agents-on-exit)");
        sup.stop_all().await;
        // No agent left to guard: the pinned programs go too.
        if let Ok(n) = sup.net() {
            n.unpin();
        }
        if let Ok(f) = sup.fs() {
            f.unpin();
        }
    } else {
        info!("leaving agents running; they are re-adopted at the next start");
    }
    if let Some(m) = sup.mcp() {
        // Tool servers are the daemon's, not the agents': they stop with it (the next daemon
        // starts them again on demand). Agents' sockets close; clients reconnect later.
        m.service.tools().shutdown().await;
        m.ipc.shutdown();
    }
    if let Some(m) = sup.models() {
        m.gateway.save();
    }
    // Open turns end with the daemon; what is queued gets a moment to reach the collector.
    sup.telemetry().shutdown(Duration::from_secs(2)).await;
    let _ = trail
        .commit(trail.lifecycle(
            "",
            "",
            "daemon-stopping",
            None,
            serde_json::json!({"pid": std::process::id(), "stop_agents": opts.stop_agents_on_exit}),
        ))
        .await;
    if let Err(e) = trail.close() {
        warn!("{e}");
    }
    // The kernel returns every task (agents included) to the fair class.
    if let Some(s) = scx {
        s.unload();
    }
}

/// Load the cgroup BPF network programs and attach them to `agents` (the daemon's own
/// `ROOT/agents`, which holds nothing but agents), pinned under `pin_root` when given (taking
/// over the programs a previous daemon pinned there). Says so loudly when it cannot, and reports
/// the BPF LSM state (defence in depth; Landlock covers the same scopes without it).
fn setup_net(
    agents: &Path,
    pin_root: Option<&Path>,
    report: &crate::probe::HostReport,
) -> Result<std::sync::Arc<crate::enforce::net::NetEnforcer>, String> {
    use crate::enforce::net::{NetEnforcer, Pins};
    let pins = match pin_root {
        None => {
            warn!(
                "network enforcement: BPF pinning off (--bpf-pin-dir none): the programs detach while agentosd is down"
            );
            None
        }
        Some(root) => match Pins::prepare(root, agents, crate::enforce::net::PIN_KIND) {
            Ok(p) => Some(p),
            Err(e) => {
                warn!(
                    "network enforcement: {e}; the programs are NOT pinned and detach while agentosd is down or restarting"
                );
                None
            }
        },
    };
    let old_pins = pins.clone();
    let mut r = NetEnforcer::load_pinned(pins).and_then(|n| {
        n.attach(agents)?;
        Ok(n)
    });
    if let (Some(p), Err(e)) = (&old_pins, &r) {
        warn!("network enforcement: loading onto the pinned maps failed ({e}); loading unpinned");
        r = NetEnforcer::load().and_then(|n| {
            n.attach(agents)?;
            Ok(n)
        });
        // Ours are attached: the pinned programs (whose maps we do not fill) go.
        if r.is_ok()
            && let Err(e) = p.remove()
        {
            warn!("removing the pins {}: {e}", p.dir.display());
        }
    }
    match r {
        Ok(n) => {
            info!(
                "network enforcement: cgroup BPF {} attached to {}{}",
                crate::enforce::net::HOOKS,
                agents.display(),
                match n.pins() {
                    Some(p) => format!(", links and maps pinned in {}", p.dir.display()),
                    None => ", not pinned".to_string(),
                }
            );
            match n.lsm_status() {
                Ok(()) => info!(
                    "BPF LSM: lsm/socket_connect attached (the same network policy, defence in depth)"
                ),
                Err(e) => warn!(
                    "BPF LSM: lsm/socket_connect {e}; relying on cgroup BPF and Landlock (probe: {})",
                    report
                        .why_missing(crate::probe::Feature::BpfLsm)
                        .unwrap_or_else(|| "bpf lsm available".into())
                ),
            }
            Ok(n)
        }
        Err(e) => {
            warn!(
                "network enforcement: cgroup BPF unavailable: {e}; agents' destinations are NOT enforced by BPF (Landlock TCP port rules still apply; contracts that require cgroup_bpf are refused)"
            );
            Err(e.to_string())
        }
    }
}

/// What the daemon runs on: the supervisor with its services (the audit trail, the BPF
/// enforcers, the syscall counter, scx_agentos) and the MCP service, the host report.
type Built = (
    std::sync::Arc<Supervisor>,
    tokio::sync::mpsc::UnboundedReceiver<crate::supervisor::Event>,
    std::sync::Arc<crate::audit_trail::AuditTrail>,
    Option<std::sync::Arc<crate::scx::Scx>>,
    crate::probe::HostReport,
);

/// Every half second, take in what the agents wrote (logs/ingest.rs) since the last round, the
/// agents whose files an inotify watch saw change (logs/rounds.rs): on a thread of its own, since
/// it reads files.
fn spawn_log_ingest(sup: &std::sync::Arc<Supervisor>) {
    if sup.logs().forwards_to_journald() {
        info!("forwarding agent output to the journal");
    }
    let sup = std::sync::Arc::downgrade(sup);
    let spawned = std::thread::Builder::new()
        .name("log-ingest".into())
        .spawn(move || {
            // Bounded per round over all agents; the next round starts where this one stopped,
            // so a few flooding agents cannot starve the others' logs.
            let mut rounds = crate::logs::Rounds::new();
            loop {
                std::thread::sleep(Duration::from_millis(500));
                let Some(sup) = sup.upgrade() else { return };
                let agents = sup.agents();
                rounds.round(sup.logs(), &agents, |a| a.log_who());
            }
        });
    if let Err(e) = spawned {
        warn!("log ingest thread: {e}; agents' output reaches their journal only when read");
    }
}

/// Build the services in order, then the supervisor over them, then its readers and the MCP
/// service (which needs the supervisor).
fn build_supervisor(opts: &Options, root: &Path) -> Result<Built> {
    let log_dir = opts
        .log_dir
        .clone()
        .unwrap_or_else(|| opts.state_dir.join("logs"));
    std::fs::create_dir_all(&opts.state_dir)
        .with_context(|| format!("creating state directory {}", opts.state_dir.display()))?;
    let cfg = Config {
        cgroup_root: root.to_path_buf(),
        state_dir: opts.state_dir.clone(),
        log_dir,
        agents_dir: opts.agents_dir.clone(),
        stop_timeout: opts.stop_timeout,
        freeze_timeout: Duration::from_secs(5),
        denial_records: opts.denial_records,
        disk: opts.agent_disk,
    };
    // The cgroup layout first: the network enforcer attaches to `agents/`.
    Supervisor::prepare_root(&cfg).map_err(anyhow::Error::msg)?;
    // Before the probe (so the host report shows it) and before readopt (re-adopted SRT/DT
    // agents go back into the class map).
    let scx = crate::scx::start(opts.sched_ext);
    let report = crate::probe::probe(&crate::probe::ProbeOptions {
        cgroup_root: Some(root.to_path_buf()),
    });
    let storage = open_storage(opts);
    let trail = open_audit(opts, &storage);
    let models = load_models(opts)?;
    let mut offer = crate::audit_trail::host_offer(&report);
    if let Some(m) = &models {
        offer.models.extend(m.models.keys().cloned());
        offer
            .placements
            .extend(m.backends.iter().map(|b| b.placement.as_str().to_string()));
    }
    let net = setup_net(&root.join("agents"), opts.bpf_pin_dir.as_deref(), &report);
    let fs = crate::enforce::fs::setup(&root.join("agents"), opts.bpf_pin_dir.as_deref());
    crate::enforce::fs::unix::landlock_option(opts.no_landlock_unix, &fs)
        .map_err(anyhow::Error::msg)?;
    let services = crate::supervisor::Services {
        audit: Some(trail.clone()),
        offer,
        dns: net.as_ref().ok().map(|n| setup_dns(opts, n)),
        net,
        fs,
        sysc: if opts.syscall_counts {
            crate::enforce::sysc::setup()
        } else {
            crate::supervisor::Services::default().sysc
        },
        scx: scx.clone(),
        telemetry: crate::telemetry::Telemetry::from_config(opts.otlp.clone())?,
        logs: std::sync::Arc::new(
            crate::logs::Logs::new(opts.logs, crate::logs::JournalForwarder::new())
                .with_storage(storage.clone()),
        ),
        storage: Some(storage.clone()),
    };
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let sup = Supervisor::with_services(cfg, services, tx).map_err(anyhow::Error::msg)?;
    watch_storage(&storage, &trail);
    sup.spawn_kernel_audit_reader();
    sup.spawn_telemetry_sampler();
    setup_mcp(&sup, opts, root);
    if let Some(m) = models {
        setup_models(&sup, opts, m);
    }
    Ok((sup, rx, trail, scx, report))
}

/// The agents' DNS stubs over the network enforcer's `net_names` map; upstreams from the options
/// or /etc/resolv.conf.
fn setup_dns(
    opts: &Options,
    net: &std::sync::Arc<crate::enforce::net::NetEnforcer>,
) -> std::sync::Arc<crate::dns::Dns> {
    let mut cfg = opts.dns.clone();
    if cfg.upstreams.is_empty() {
        let text = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
        cfg.upstreams = crate::dns::resolv_conf_upstreams(&text);
    }
    if cfg.upstreams.is_empty() {
        warn!(
            "DNS: no upstream (no nameserver in /etc/resolv.conf, no --dns-upstream): agents' granted names get SERVFAIL"
        );
    } else {
        info!(
            "DNS: agents' stubs forward granted names to {} (grace {:?})",
            cfg.upstreams
                .iter()
                .map(|a| a.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            cfg.grace
        );
    }
    let dns = crate::dns::Dns::new(cfg, net.clone());
    dns.spawn_sweeper();
    match dns.spawn_sni_proxy() {
        Ok(port) => info!(
            "SNI/Host proxy on 127.0.0.1:{port}: agents' https:// and http:// grants are checked there"
        ),
        Err(e) => warn!(
            "SNI/Host proxy: {e}: connects that only an https:// or http:// grant allows are refused (sni-proxy-down)"
        ),
    }
    dns
}

/// Say which budgets this cgroup root cannot enforce (or that all are).
fn report_budgets(root: &Path, missing: &[String]) {
    if missing.is_empty() {
        info!(
            "cgroup root {}: budgets enforced ({})",
            root.display(),
            crate::cgroup::BUDGET_CONTROLLERS.join(", ")
        );
    } else {
        warn!(
            "cgroup root {}: controllers {} are not available here, so these budgets are NOT enforced: {}",
            root.display(),
            missing.join(", "),
            missing
                .iter()
                .map(|c| crate::cgroup::budget_description(c))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
}

/// How long a start-up waits for the audit log's lock (see [`open_audit`]).
const AUDIT_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Open the audit trail under the state directory (creating the host key if missing) and
/// record the daemon's start. A log that cannot be opened (unwritable, locked, tampered) does
/// not stop the daemon, which still re-adopts its agents, but every new start is refused with
/// the reason (fail closed).
fn open_audit(
    opts: &Options,
    storage: &std::sync::Arc<crate::storage::Storage>,
) -> std::sync::Arc<crate::audit_trail::AuditTrail> {
    use crate::audit_trail::{AuditTrail, TrailError};
    let paths = trail_paths(opts);
    // The log's lock (flock) belongs to its open file description, which every process the
    // daemon forks shares until it execs: after a `kill -9`, an agent, tool or socket broker
    // still between its clone3 and its execve (or close_range) holds the lock for a moment
    // longer than the daemon lived. Wait for that (bounded) rather than refuse every start
    // until the next restart; another agentosd really running still holds it after the wait.
    let deadline = std::time::Instant::now() + AUDIT_LOCK_WAIT;
    let mut waited = false;
    let opened = loop {
        match AuditTrail::open(&paths, opts.audit_journal, Some(storage.clone())) {
            Err(TrailError::Open(audit::OpenError::Locked(p)))
                if std::time::Instant::now() < deadline =>
            {
                if !waited {
                    warn!(
                        "audit log {} is locked; waiting up to {:?} for the processes a previous agentosd forked to exec or exit",
                        p.display(),
                        AUDIT_LOCK_WAIT
                    );
                    waited = true;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            r => break r,
        }
    };
    match opened {
        Ok(t) => {
            info!("audit trail {}", t.path().display());
            t.submit(t.lifecycle(
                "",
                "",
                "daemon-started",
                None,
                serde_json::json!({
                    "pid": std::process::id(),
                    "version": env!("CARGO_PKG_VERSION"),
                    "key": audit::key::public_path(&paths.key).display().to_string(),
                }),
            ));
            t
        }
        Err(e) => {
            let why = format!("cannot open the audit trail: {e}");
            tracing::error!(
                "{why}; agents will NOT be started until this is fixed and agentosd restarts"
            );
            AuditTrail::unavailable(&paths, why)
        }
    }
}

fn trail_paths(opts: &Options) -> crate::audit_trail::TrailPaths {
    let mut paths = crate::audit_trail::TrailPaths::under(&opts.state_dir);
    if let Some(d) = &opts.audit_dir {
        paths.dir = d.clone();
    }
    if let Some(k) = &opts.audit_key {
        paths.key = k.clone();
    }
    paths
}

/// The storage watcher over the audit and state directories (made here if missing, so that
/// the first check reads their file systems), checked once now.
fn open_storage(opts: &Options) -> std::sync::Arc<crate::storage::Storage> {
    let audit_dir = trail_paths(opts).dir;
    let _ = std::fs::create_dir_all(&audit_dir);
    let s = crate::storage::Storage::new(
        opts.storage_reserve,
        opts.storage_check_interval,
        &audit_dir,
        &opts.state_dir,
    );
    let st = s.status();
    // Low at start was said by the first check (once per transition).
    if !st.low {
        info!("storage: {}", st.describe());
    }
    s
}

/// After each storage check: reopen the audit log if it stopped for want of space, and write
/// the summaries of refusals counted while storage is low (once the log can be written).
fn watch_storage(
    storage: &std::sync::Arc<crate::storage::Storage>,
    trail: &std::sync::Arc<crate::audit_trail::AuditTrail>,
) {
    let trail = std::sync::Arc::downgrade(trail);
    storage.spawn(move |s, st| {
        let Some(t) = trail.upgrade() else { return };
        if st
            .free_of("audit")
            .is_none_or(|f| f >= crate::storage::RECOVER_FLOOR)
        {
            t.recover();
        }
        // Not while the trail cannot write (the disk filled up): the summaries would be lost
        // with the failed writes; the refusals stay counted and go out once it recovers.
        if t.health().is_err() {
            return;
        }
        let summaries = s.due_summaries(!st.low);
        if !summaries.is_empty() {
            t.write_summaries(summaries, &st.describe());
        }
    });
}

/// Resolves when the bus connection is gone: a call to the bus driver gets no reply twice in a
/// row. `GetNameOwner(org.agentos1)` is allowed by every bus policy (`Peer.Ping` to the driver
/// is not, on Debian's system bus); any reply, an error reply included, proves the link works.
async fn watch_bus(conn: zbus::Connection) -> String {
    let mut failures = 0;
    loop {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let r = conn
            .call_method(
                Some("org.freedesktop.DBus"),
                "/org/freedesktop/DBus",
                Some("org.freedesktop.DBus"),
                "GetNameOwner",
                &(crate::dbus::SERVICE,),
            )
            .await;
        match r {
            Ok(_) => failures = 0,
            Err(zbus::Error::MethodError(name, msg, _)) => {
                failures = 0;
                warn!("bus driver answered GetNameOwner with {name}: {msg:?}");
            }
            Err(e) => {
                failures += 1;
                warn!("D-Bus connection check failed: {e}");
                if failures >= 2 {
                    return e.to_string();
                }
            }
        }
    }
}

/// `agentosd check [--json]`.
pub fn check(cgroup_root: Option<PathBuf>, json: bool) -> i32 {
    // The default root may not exist before the daemon's first start: then probe the mount.
    let root = cgroup_root.or_else(|| {
        resolve_cgroup_root(None)
            .ok()
            .map(|(p, _)| p)
            .filter(|p| p.exists())
    });
    let report = crate::probe::probe(&crate::probe::ProbeOptions { cgroup_root: root });
    if json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.render_table());
        // agentos's own programs, loaded (not attached) to show they pass the verifier here.
        match crate::enforce::net::NetEnforcer::load() {
            Ok(n) => {
                println!(
                    "agentos network programs (ebpf/net.bpf.c: {}): load OK",
                    crate::enforce::net::HOOKS
                );
                match n.lsm_status() {
                    Err(e) if e.starts_with("loaded") => {
                        println!("agentos BPF LSM program (lsm/socket_connect): load OK")
                    }
                    Err(e) => println!("agentos BPF LSM program (lsm/socket_connect): {e}"),
                    Ok(()) => {}
                }
            }
            Err(e) => println!("agentos network programs (ebpf/net.bpf.c): NOT loadable: {e}"),
        }
        let pin_root = std::env::var_os("AGENTOSD_BPF_PIN_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(crate::enforce::net::DEFAULT_PIN_ROOT));
        if pin_root.as_os_str() == "none" {
            println!("bpffs pins: off (AGENTOSD_BPF_PIN_DIR=none)");
        } else {
            println!("{}", crate::enforce::net::pin_check_line(&pin_root));
        }
        println!("{}", crate::enforce::fs::check_line());
        println!("{}", crate::enforce::sysc::check_line());
    }
    0
}
