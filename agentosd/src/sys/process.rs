//! Facts about a process read from `/proc/PID/*` (start time, state, parent, command line), the
//! boot id, and signal names. No system call beyond reading procfs.

/// Whether a process with this PID exists (kill(pid, 0)).
pub fn pid_alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// The process start time in clock ticks since boot (field 22 of /proc/PID/stat); together with
/// the PID it identifies a process across PID reuse.
pub fn process_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // comm may contain spaces and parentheses: fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    // rest starts at field 3 (state); starttime is field 22.
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// The one-letter scheduler state of a process (field 3 of /proc/PID/stat).
pub fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 2..].chars().next()
}

/// The command line of a process, arguments joined by spaces.
pub fn process_cmdline(pid: u32) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let s: Vec<String> = raw
        .split(|b| *b == 0)
        .filter(|p| !p.is_empty())
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect();
    Some(s.join(" "))
}

/// The parent PID of a process (field 4 of /proc/PID/stat).
pub fn process_ppid(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 2..]
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The kernel's boot id, to tell a daemon restart from a reboot.
pub fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Signal names: one table, in the kernel-free API crate (agentctl parses them too).
pub use agentos_api::signal::{parse_signal, signal_name};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_identity() {
        let me = std::process::id();
        assert!(process_start_time(me).is_some());
        assert!(pid_alive(me));
        assert!(process_state(me).is_some());
    }
}
