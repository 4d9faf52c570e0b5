//! `agentctl`: control agentosd over D-Bus, like systemctl. Exit codes: 0 ok, 1 failed, 2 usage,
//! 3 no such agent, 4 daemon unreachable (docs/cli.md).

use agentctl::cli::{AuditCmd, Cli, Cmd, ConsentCmd};
use agentctl::client::{self, Client};
use agentctl::exit;
use clap::{CommandFactory, Parser};

fn audit(cmd: AuditCmd) -> i32 {
    let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
    match cmd {
        AuditCmd::Verify { files, key } => {
            let key = key.unwrap_or_else(|| files.state_dir.join("audit.key.pub"));
            audit::cli::verify(&files.log(), &key, &mut out, &mut err)
        }
        AuditCmd::Show {
            files,
            agent,
            since,
            follow,
            json,
        } => {
            let opts = audit::cli::ShowOptions {
                agent,
                since,
                follow,
                json,
            };
            audit::cli::show(&files.log(), &opts, &mut out, &mut err)
        }
    }
}

fn main() {
    // Like every Unix filter: a reader that goes away (`agentctl audit show | head`) ends us
    // with SIGPIPE, quietly, instead of a panic on the failed write (Rust ignores SIGPIPE).
    // SAFETY: signal(2) with SIG_DFL, before any thread exists; no handler is installed.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() {
                exit::USAGE
            } else {
                exit::OK
            };
            let _ = e.print();
            std::process::exit(code);
        }
    };
    std::process::exit(run(cli));
}

fn run(cli: Cli) -> i32 {
    let target = match cli.target() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("agentctl: {e}");
            return exit::USAGE;
        }
    };
    // A negative, NaN or absurd value is a usage error, not a panic in Duration.
    let timeout = match cli.timeout {
        0.0 => None,
        t if t.is_finite() && t > 0.0 && t <= 86_400.0 => {
            Some(std::time::Duration::from_secs_f64(t))
        }
        t => {
            eprintln!("agentctl: --timeout {t}: give seconds between 0 (wait forever) and 86400");
            return exit::USAGE;
        }
    };
    match cli.cmd {
        Cmd::Validate { files, json } => {
            return agentctl::validate::run(
                &files,
                json,
                &mut std::io::stdout(),
                &mut std::io::stderr(),
            );
        }
        Cmd::Audit { cmd } => return audit(cmd),
        Cmd::Completions { shell } => {
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "agentctl",
                &mut std::io::stdout(),
            );
            if shell == clap_complete::Shell::Bash {
                print!("{}", agentctl::complete::bash_extra());
            }
            return exit::OK;
        }
        _ => {}
    }
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("agentctl: cannot start the async runtime: {e}");
            return exit::FAILED;
        }
    };
    rt.block_on(async move {
        if let Cmd::Check { json } = cli.cmd {
            return agentctl::check::check(target.as_ref(), timeout, json).await;
        }
        let c = match Client::connect(target.as_ref(), timeout).await {
            Ok(c) => c,
            Err(e) => {
                eprintln!("agentctl: {}", e.message);
                return e.code;
            }
        };
        let mut out = std::io::stdout();
        match cli.cmd {
            Cmd::Start { target } if cli.no_block => {
                agentctl::jobs::queue(&c, "start", std::slice::from_ref(&target), &mut out).await
            }
            Cmd::Stop { agents } if cli.no_block => {
                agentctl::jobs::queue(&c, "stop", &agents, &mut out).await
            }
            Cmd::Freeze { agents } if cli.no_block => {
                agentctl::jobs::queue(&c, "freeze", &agents, &mut out).await
            }
            Cmd::Thaw { agents } if cli.no_block => {
                agentctl::jobs::queue(&c, "thaw", &agents, &mut out).await
            }
            Cmd::Restart { agents } if cli.no_block => {
                agentctl::jobs::queue(&c, "restart", &agents, &mut out).await
            }
            Cmd::ListJobs => agentctl::jobs::list(&c, &mut out).await,
            Cmd::CompleteAgents => agentctl::complete::agents(&c, &mut out).await,
            Cmd::Start { target } => client::start(&c, &target).await,
            Cmd::Stop { agents } => client::simple(&c, "StopAgent", &agents).await,
            Cmd::Kill {
                agents,
                signal,
                kill_whom,
            } => client::kill(&c, &agents, &kill_whom, &signal).await,
            Cmd::Freeze { agents } => client::simple(&c, "FreezeAgent", &agents).await,
            Cmd::Thaw { agents } => client::simple(&c, "ThawAgent", &agents).await,
            Cmd::Restart { agents } => client::simple(&c, "RestartAgent", &agents).await,
            Cmd::Remove { agents } => client::simple(&c, "RemoveAgent", &agents).await,
            Cmd::ResetFailed { agents } => client::reset_failed(&c, &agents).await,
            Cmd::DaemonReload => agentctl::files::daemon_reload(&c, &mut out).await,
            Cmd::Reload {
                agent,
                file,
                no_restart,
            } => agentctl::files::reload(&c, &agent, file.as_deref(), no_restart, &mut out).await,
            Cmd::Enable { agents, now } => {
                agentctl::files::enable(&c, &agents, now, &mut out).await
            }
            Cmd::Disable { agents, now } => {
                agentctl::files::disable(&c, &agents, now, &mut out).await
            }
            Cmd::Tools { json } => agentctl::tools::tools(&c, json, &mut out).await,
            Cmd::Edit { agent, no_restart } => {
                agentctl::files::edit(&c, &agent, no_restart, &mut out).await
            }
            Cmd::Cat { agent } => agentctl::files::cat(&c, &agent, &mut out).await,
            Cmd::Show {
                agent,
                property,
                value,
            } => agentctl::files::show(&c, &agent, &property, value, &mut out).await,
            Cmd::List {
                json,
                mut state,
                failed,
            } => {
                if failed {
                    state.push("failed".into());
                }
                client::list(&c, json, &state, &mut out).await
            }
            Cmd::Status {
                agent: Some(agent),
                json,
                lines,
            } => client::status(&c, &agent, json, lines, &mut out).await,
            Cmd::Status {
                agent: None, json, ..
            } => agentctl::daemon::status(&c, json, &mut out).await,
            Cmd::IsActive { agent, quiet } => client::is_active(&c, &agent, quiet).await,
            Cmd::Logs {
                agent,
                lines,
                follow,
                since,
                until,
                output,
            } => {
                let args = client::LogsArgs {
                    // --since/--until without -n: everything in the window.
                    lines: lines.unwrap_or(if since.is_some() || until.is_some() {
                        0
                    } else {
                        50
                    }),
                    follow,
                    since,
                    until,
                    output,
                };
                client::logs(&c, &agent, &args).await
            }
            Cmd::Consent { cmd } => match cmd {
                ConsentCmd::List { json } => client::consent_list(&c, json, &mut out).await,
                ConsentCmd::Approve { ids } => client::consent_answer(&c, true, &ids).await,
                ConsentCmd::Deny { ids } => client::consent_answer(&c, false, &ids).await,
            },
            Cmd::Top {
                batch,
                iterations,
                delay,
                sort,
            } => {
                let delay = std::time::Duration::from_secs_f64(delay.clamp(0.1, 3600.0));
                agentctl::top::top(&c, batch, iterations, delay, sort, &mut out).await
            }
            Cmd::Monitor { json } => agentctl::monitor::monitor(&c, json, &mut out).await,
            Cmd::Validate { .. }
            | Cmd::Completions { .. }
            | Cmd::Check { .. }
            | Cmd::Audit { .. } => exit::OK,
        }
    })
}
