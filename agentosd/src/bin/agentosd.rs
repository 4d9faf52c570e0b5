//! `agentosd`: the agentos daemon. Thin: flags here, everything else in the library.

use std::path::PathBuf;
use std::time::Duration;

use agentosd::cli::{Cli, Cmd, known_flags};
use clap::{CommandFactory, Parser};
use std::ffi::OsString;

/// The command line with the configuration file's settings in front of it (flags given on the
/// command line replace the file's), parsed. A bad file ends the process with its path and line.
fn parse_args() -> (Cli, Vec<OsString>) {
    let raw: Vec<OsString> = std::env::args_os().collect();
    let Some((path, _explicit)) = agentosd::conf::chosen(&raw) else {
        return (Cli::parse_from(&raw), raw);
    };
    let given: Vec<String> = raw
        .iter()
        .skip(1)
        .filter_map(|a| {
            let a = a.to_str()?.strip_prefix("--")?;
            Some(a.split('=').next().unwrap_or(a).to_string())
        })
        .collect();
    let bin = raw.first().cloned().unwrap_or_else(|| "agentosd".into());
    let file = match agentosd::conf::load(&path, &known_flags(), &given) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("agentosd: {e}");
            std::process::exit(2);
        }
    };
    // The file's values on their own first, so that a bad one is reported as the file's.
    if let Err(e) = Cli::try_parse_from(std::iter::once(bin.clone()).chain(file.iter().cloned())) {
        let msg = e.to_string();
        let first = msg.lines().next().unwrap_or_default();
        eprintln!(
            "agentosd: {}: {}",
            path.display(),
            first.trim_start_matches("error: ")
        );
        std::process::exit(2);
    }
    let mut all = vec![bin];
    all.extend(file);
    all.extend(raw.into_iter().skip(1));
    (Cli::parse_from(&all), all)
}

/// `agentosd config`: every option with the value in effect (default, file or flag), as a
/// configuration file would set it.
fn print_config(argv: &[OsString]) {
    let m = Cli::command().get_matches_from(argv);
    let quote = |v: &str| {
        if v.parse::<f64>().is_ok() {
            v.to_string()
        } else {
            format!("{v:?}")
        }
    };
    for k in known_flags() {
        let id = k.long.replace('-', "_");
        let vals: Vec<String> = m
            .get_raw(&id)
            .map(|v| v.map(|s| s.to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        let src = match m.value_source(&id) {
            Some(clap::parser::ValueSource::DefaultValue) | None => "default",
            _ => "configured",
        };
        let line = if !k.takes_value {
            format!("{} = {}", k.long, m.get_flag(&id))
        } else if k.repeats {
            let items: Vec<String> = vals.iter().map(|v| quote(v)).collect();
            format!("{} = [{}]", k.long, items.join(", "))
        } else if let Some(v) = vals.first() {
            format!("{} = {}", k.long, quote(v))
        } else {
            format!("# {} =", k.long)
        };
        println!("{line:<60} # {src}");
    }
}

fn main() -> anyhow::Result<()> {
    let (cli, argv) = parse_args();
    match cli.cmd {
        Some(Cmd::Config) => {
            print_config(&argv);
            Ok(())
        }
        Some(Cmd::Keygen) => {
            let key = cli
                .run
                .audit_key
                .unwrap_or_else(|| cli.run.state_dir.join("audit.key"));
            let (created, public) = agentosd::audit_trail::ensure_key(&key)?;
            let hex = std::fs::read_to_string(&public)?;
            println!(
                "{} {} (public key {}: {})",
                if created { "created" } else { "kept existing" },
                key.display(),
                public.display(),
                hex.trim()
            );
            Ok(())
        }
        Some(Cmd::Check {
            json,
            report: Some(file),
        }) => print_report(&file, json),
        Some(Cmd::Check { json, report: None }) => {
            let r = &cli.run;
            let code = agentosd::daemon::check(r.cgroup_root.clone(), json);
            if !json {
                let reserve = agentosd::storage::Reserve {
                    min_bytes: r.storage_reserve,
                    min_percent: r.storage_reserve_percent.clamp(0.0, 50.0),
                };
                let audit = r
                    .audit_dir
                    .clone()
                    .unwrap_or_else(|| r.state_dir.join("audit"));
                println!(
                    "{}",
                    agentosd::storage::check_line(reserve, &audit, &r.state_dir)
                );
                let disk = agentosd::storage::quota::DiskDefaults {
                    bytes: r.agent_disk_default,
                    inodes: r.agent_disk_inodes_default,
                };
                println!(
                    "{}",
                    agentosd::storage::quota::check_line(&r.state_dir, &audit, &disk)
                );
                // What the daemon would get: it raises its soft limit to the hard one.
                let nofile = agentosd::sys::rlimit::raise_nofile()
                    .unwrap_or_else(|_| agentosd::sys::rlimit::nofile());
                println!("{}", agentosd::sys::rlimit::describe(&nofile));
            }
            std::process::exit(code)
        }
        Some(Cmd::Run) | None => {
            // Before any thread exists (sys/malloc.rs says why).
            let arenas = agentosd::sys::malloc::limit_arenas();
            tracing_subscriber::fmt()
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_env("AGENTOSD_LOG")
                        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
                )
                .with_writer(std::io::stderr)
                // No colour codes in the journal or a log file.
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                .init();
            match arenas {
                Some(n) => tracing::info!("malloc: {n} arena (MALLOC_ARENA_MAX overrides)"),
                None => tracing::info!("malloc: arenas as the environment or libc sets them"),
            }
            // Before any thread exists: every thread inherits the empty bounding set, so the
            // agents' and tools' children need not drop it one capability at a time
            // (sandbox/bounding.rs). The daemon itself never execs.
            if let Err(e) = agentosd::sandbox::bounding::empty_this_thread() {
                tracing::warn!(
                    "the daemon's capability bounding set was not emptied \
                     (prctl(PR_CAPBSET_DROP): {e}); every start drops it in the child instead"
                );
            }
            let r = cli.run;
            agentosd::ipc::files::AGENT_CONN_FILES.set_max(r.agent_conn_files);
            let opts = agentosd::daemon::Options {
                state_dir: r.state_dir,
                agents_dir: r.agents_dir,
                cgroup_root: r.cgroup_root,
                log_dir: r.log_dir,
                bus_address: r.bus_address,
                stop_timeout: Duration::from_secs_f64(r.stop_timeout.max(0.0)),
                stop_agents_on_exit: r.stop_agents_on_exit,
                audit_dir: r.audit_dir,
                audit_key: r.audit_key,
                audit_journal: !r.no_audit_journal,
                sched_ext: r.sched_ext
                    || std::env::var("AGENTOSD_SCHED_EXT").is_ok_and(|v| v == "1" || v == "yes"),
                syscall_counts: r.syscall_counts
                    || agentosd::enforce::sysc::env_enables(
                        std::env::var(agentosd::enforce::sysc::ENV).ok().as_deref(),
                    ),
                no_landlock_unix: r.no_landlock_unix,
                tools_dir: r.tools_dir,
                run_dir: r.run_dir,
                consent_timeout: Duration::from_secs_f64(r.consent_timeout.max(0.0)),
                max_tool_calls_per_agent: r.max_tool_calls_per_agent,
                agent_work_nice: r.agent_work_nice,
                agent_work_slice_us: r.agent_work_slice_us,
                agent_workers: r.agent_workers,
                agent_poll_interval: r.agent_poll_interval,
                ipc: agentosd::ipc::Limits {
                    inbound_bytes: r.ipc_inbound_bytes,
                    outbound_bytes: r.ipc_outbound_bytes,
                    agent_bytes: r.ipc_agent_bytes,
                    agent_rate: r.ipc_agent_rate,
                    agent_cpu: agentosd::ipc::cpu::CpuRate {
                        permille: (r.ipc_agent_cpu.clamp(0.0, 100_000.0) * 10.0).round() as u64,
                        burst: Duration::from_millis(r.ipc_agent_cpu_burst),
                        ceiling_permille: (r.ipc_agent_cpu_ceiling.clamp(0.0, 100_000.0) * 10.0)
                            .round() as u64,
                    },
                    agent_cpu_stall: (r.ipc_agent_cpu_stall.clamp(0.0, 100.0) * 10.0).round()
                        as u64,
                    stall_timeout: Duration::from_secs_f64(
                        r.ipc_stall_timeout.clamp(0.1, 86_400.0),
                    ),
                    ..Default::default()
                },
                bpf_pin_dir: Some(
                    r.bpf_pin_dir
                        .or_else(|| std::env::var_os("AGENTOSD_BPF_PIN_DIR").map(PathBuf::from))
                        .unwrap_or_else(|| PathBuf::from(agentosd::enforce::net::DEFAULT_PIN_ROOT)),
                )
                .filter(|p| p.as_os_str() != "none"),
                authz: r.authz,
                polkit: r.polkit,
                denial_records: agentosd::enforce::limit::Limits {
                    per_sec: r.denial_records_per_sec,
                    burst: r.denial_records_burst,
                },
                dns: agentosd::dns::Config {
                    upstreams: r.dns_upstream,
                    grace: Duration::from_secs_f64(r.dns_grace.max(0.0)),
                    allow_private: r.dns_allow_private,
                    ..Default::default()
                },
                self_memory_max: r.self_memory_max,
                self_tasks_max: r.self_tasks_max,
                logs: agentosd::logs::Limits {
                    journal_max: r.log_journal_max.max(4096),
                    per_round: (r.log_rate / 2).max(4096),
                    backlog_max: (r.log_rate * 8).max(4096 * 16),
                },
                models: r.models,
                otlp: r.otlp_endpoint.map(|e| agentosd::telemetry::OtlpConfig {
                    queue_size: r.otlp_queue_size.max(1),
                    metrics_interval: Duration::from_secs_f64(r.otlp_metrics_interval.max(0.1)),
                    turn_idle: Duration::from_secs_f64(r.otlp_turn_idle.max(0.1)),
                    ..agentosd::telemetry::OtlpConfig::new(e)
                }),
                storage_reserve: agentosd::storage::Reserve {
                    min_bytes: r.storage_reserve,
                    min_percent: r.storage_reserve_percent.clamp(0.0, 50.0),
                },
                storage_check_interval: Duration::from_secs_f64(
                    r.storage_check_interval.clamp(0.01, 3600.0),
                ),
                agent_uids: r.agent_uids,
                agent_disk: agentosd::storage::quota::DiskDefaults {
                    bytes: r.agent_disk_default,
                    inodes: r.agent_disk_inodes_default,
                },
            };
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(4)
                .enable_all()
                .build()?;
            rt.block_on(agentosd::daemon::run(opts))
        }
    }
}

/// `agentosd check --report FILE`: a report taken elsewhere, printed like `agentosd check`.
fn print_report(file: &std::path::Path, json: bool) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let text = if file.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin()).context("reading the report from stdin")?
    } else {
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?
    };
    let report: agentosd::probe::HostReport = serde_json::from_str(&text).with_context(|| {
        format!(
            "{} is not a host report (agentosd check --json)",
            file.display()
        )
    })?;
    if json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.render_table());
    }
    Ok(())
}
