//! Shell completion beyond clap's static script: agent names (asked of the daemon when the user
//! presses TAB) and signal names, for bash, appended to clap's script.

use std::io::Write;

/// The commands whose free arguments are agents.
const AGENT_COMMANDS: &str = "start|stop|kill|freeze|thaw|restart|remove|reset-failed|status|is-active|logs|reload|enable|disable|cat|show";

/// What `agentctl completions bash` appends to clap's script: `_agentctl` is wrapped so that an
/// agent argument completes to the agents the daemon lists (`agentctl __complete-agents`, which
/// prints nothing when the daemon cannot be reached) and `-s/--signal` to signal names.
pub fn bash_extra() -> String {
    let signals: Vec<String> = agentos_api::signal::names()
        .iter()
        .map(|s| s.to_string())
        .collect();
    format!(
        r#"
# agentctl: agent names from the daemon, signal names (appended to clap's completion).
_agentctl_more() {{
    _agentctl "$@"
    local cur="${{COMP_WORDS[COMP_CWORD]}}" prev="${{COMP_WORDS[COMP_CWORD-1]}}" cmd="" w
    for w in "${{COMP_WORDS[@]:1:COMP_CWORD-1}}"; do
        case "$w" in -*) ;; *) cmd="$w"; break ;; esac
    done
    if [[ "$prev" == "-s" || "$prev" == "--signal" ]]; then
        COMPREPLY=( $(compgen -W "{signals}" -- "${{cur#SIG}}") )
        return 0
    fi
    case "$cmd" in
        {AGENT_COMMANDS})
            if [[ "$cur" != -* ]]; then
                COMPREPLY+=( $(compgen -W "$(agentctl __complete-agents 2>/dev/null)" -- "$cur") )
            fi
            ;;
    esac
    return 0
}}
complete -F _agentctl_more -o bashdefault -o default agentctl
"#,
        signals = signals.join(" ")
    )
}

/// `agentctl __complete-agents`: each agent's name and `tenant/name`, one per line.
pub async fn agents(c: &crate::client::Client, out: &mut dyn Write) -> i32 {
    if let Ok(rows) = crate::client::list_rows(c).await {
        for r in rows {
            let _ = writeln!(out, "{}\n{}", r.name, r.id);
        }
    }
    crate::exit::OK
}
