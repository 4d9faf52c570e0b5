//! Signals by name and number: `KillAgent` takes the number, `ExecMainStatus` names it
//! (`code=killed, signal=TERM`).

const SIGNALS: &[(&str, i32)] = &[
    ("HUP", libc::SIGHUP),
    ("INT", libc::SIGINT),
    ("QUIT", libc::SIGQUIT),
    ("ILL", libc::SIGILL),
    ("TRAP", libc::SIGTRAP),
    ("ABRT", libc::SIGABRT),
    ("BUS", libc::SIGBUS),
    ("FPE", libc::SIGFPE),
    ("KILL", libc::SIGKILL),
    ("USR1", libc::SIGUSR1),
    ("SEGV", libc::SIGSEGV),
    ("USR2", libc::SIGUSR2),
    ("PIPE", libc::SIGPIPE),
    ("ALRM", libc::SIGALRM),
    ("TERM", libc::SIGTERM),
    ("CHLD", libc::SIGCHLD),
    ("CONT", libc::SIGCONT),
    ("STOP", libc::SIGSTOP),
    ("TSTP", libc::SIGTSTP),
    ("TTIN", libc::SIGTTIN),
    ("TTOU", libc::SIGTTOU),
    ("URG", libc::SIGURG),
    ("XCPU", libc::SIGXCPU),
    ("XFSZ", libc::SIGXFSZ),
    ("VTALRM", libc::SIGVTALRM),
    ("PROF", libc::SIGPROF),
    ("WINCH", libc::SIGWINCH),
    ("IO", libc::SIGIO),
    ("PWR", libc::SIGPWR),
    ("SYS", libc::SIGSYS),
];

/// The signal names `KillAgent` and `agentctl kill -s` know (`TERM`, `KILL`, …).
pub fn names() -> Vec<&'static str> {
    SIGNALS.iter().map(|(s, _)| *s).collect()
}

/// `TERM` for 15, or the number.
pub fn signal_name(sig: i32) -> String {
    SIGNALS
        .iter()
        .find(|(_, n)| *n == sig)
        .map(|(s, _)| s.to_string())
        .unwrap_or_else(|| sig.to_string())
}

/// Parse `TERM`, `SIGTERM`, `sigterm` or `15`.
pub fn parse_signal(s: &str) -> Option<i32> {
    if let Ok(n) = s.parse::<i32>() {
        return (1..=64).contains(&n).then_some(n);
    }
    let up = s.to_ascii_uppercase();
    let name = up.strip_prefix("SIG").unwrap_or(&up);
    SIGNALS.iter().find(|(s, _)| *s == name).map(|(_, n)| *n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_parse_both_ways() {
        assert_eq!(parse_signal("TERM"), Some(15));
        assert_eq!(parse_signal("sigkill"), Some(9));
        assert_eq!(parse_signal("10"), Some(10));
        assert_eq!(parse_signal("NOPE"), None);
        assert_eq!(signal_name(15), "TERM");
        assert_eq!(signal_name(40), "40");
    }
}
