//! What agentctl prints: the `list`, `status` and `consent list` tables and log text. Every
//! string an agent (or its contract) chose is escaped for the terminal here.

use agentos_api::text::escape_control as esc;
use agentos_api::text::escape_control_cow as esc_cow;
use agentos_api::{AgentStatus, ConsentRequest, ListRowOf};
use std::borrow::Cow;

/// A copy with every string an agent (or its contract) chose escaped for a terminal:
/// process command lines and titles, exit status, notes, names.
pub fn escaped(st: &AgentStatus) -> AgentStatus {
    let mut s = st.clone();
    for f in [
        &mut s.id,
        &mut s.name,
        &mut s.tenant,
        &mut s.state,
        &mut s.result,
        &mut s.control_group,
        &mut s.latency_class,
        &mut s.restart_policy,
        &mut s.exit_status,
        &mut s.log_path,
        &mut s.origin,
        &mut s.command,
    ] {
        *f = esc(f);
    }
    for v in s.unenforced_budgets.iter_mut().chain(s.notes.iter_mut()) {
        *v = esc(v);
    }
    for p in &mut s.processes {
        p.2 = esc(&p.2);
    }
    s
}

pub fn render_list<S: AsRef<str>>(rows: &[ListRowOf<S>]) -> String {
    use std::fmt::Write as _;
    // Escaped without a copy unless a string needs it; one buffer for the whole table (10 000
    // agents: the copies and per-line strings were a third of `agentctl list`).
    let id: Vec<Cow<'_, str>> = rows.iter().map(|r| esc_cow(r.id.as_ref())).collect();
    let w = id.iter().map(|i| i.len()).max().unwrap_or(0).max(5);
    let mut s = String::with_capacity(64 + rows.len() * (w + 40));
    let _ = writeln!(
        s,
        "{:<w$}  {:<11}  {:>8}  {:<5}  RESULT",
        "AGENT", "STATE", "PID", "CLASS"
    );
    let mut pid = String::new();
    for (r, id) in rows.iter().zip(&id) {
        pid.clear();
        if r.main_pid == 0 {
            pid.push('-');
        } else {
            let _ = write!(pid, "{}", r.main_pid);
        }
        let class = esc_cow(r.latency_class.as_ref());
        let class = if class.is_empty() { "-" } else { &class };
        let _ = write!(
            s,
            "{:<w$}  {:<11}  {:>8}  {:<5}  {}",
            id,
            esc_cow(r.state.as_ref()),
            pid,
            class,
            esc_cow(r.result.as_ref())
        );
        s.truncate(s.trim_end().len());
        s.push('\n');
    }
    let _ = write!(s, "\n{} agents listed.\n", rows.len());
    s
}

fn fmt_bytes(b: u64) -> String {
    const U: [&str; 5] = ["B", "K", "M", "G", "T"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i < U.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b}B")
    } else {
        format!("{v:.1}{}", U[i])
    }
}

fn fmt_cpu(ns: u64) -> String {
    let ms = ns / 1_000_000;
    if ms < 1000 {
        format!("{ms}ms")
    } else {
        format!("{:.3}s", ns as f64 / 1e9)
    }
}

/// `YYYY-MM-DD HH:MM:SS UTC` from µs since the epoch.
pub fn fmt_time_us(us: u64) -> String {
    let secs = (us / 1_000_000) as i64;
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    // civil_from_days (Howard Hinnant)
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        sod / 3600,
        (sod / 60) % 60,
        sod % 60
    )
}

fn fmt_ago(us: u64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0);
    let s = now.saturating_sub(us) / 1_000_000;
    match s {
        0..=119 => format!("{s}s ago"),
        120..=7199 => format!("{}min ago", s / 60),
        _ => format!("{}h ago", s / 3600),
    }
}

/// `agentctl status` text: agent-controlled strings and log lines are escaped
/// ([`escaped`], [`agentos_api::text::escape_control`]).
pub fn render_status(st: &AgentStatus, log: &[agentos_api::LogEntry]) -> String {
    let name = st.name.clone();
    let st = &escaped(st);
    let dot = match st.state.as_str() {
        "running" => "●",
        "failed" => "×",
        _ => "○",
    };
    let mut s = format!("{dot} {} - {}\n", st.id, st.command);
    s.push_str(&format!(
        "     Loaded: {}{}\n",
        st.origin,
        if st.enabled { " (enabled)" } else { "" }
    ));
    let mut active = st.state.clone();
    if !st.result.is_empty() {
        active.push_str(&format!(" ({})", st.result));
    }
    if st.started_at_us > 0 && st.state != "inactive" {
        active.push_str(&format!(
            " since {}; {}",
            fmt_time_us(st.started_at_us),
            fmt_ago(st.started_at_us)
        ));
    }
    s.push_str(&format!("     Active: {active}\n"));
    if st.main_pid != 0 {
        let comm = st
            .processes
            .iter()
            .find(|p| p.0 == st.main_pid)
            .map(|p| p.2.split_whitespace().next().unwrap_or("").to_string())
            .unwrap_or_default();
        s.push_str(&format!("   Main PID: {} ({})\n", st.main_pid, comm));
    } else if !st.exit_status.is_empty() {
        s.push_str(&format!("   Main PID: - ({})\n", st.exit_status));
    }
    let class = if st.latency_class.is_empty() {
        "-".to_string()
    } else {
        st.latency_class.clone()
    };
    s.push_str(&format!("      Class: {class}\n"));
    for n in &st.notes {
        s.push_str(&format!("             {n}\n"));
    }
    if let Some(m) = st.deadline_misses {
        s.push_str(&format!(
            "     Misses: {m} deadline overruns seen (sampled every {} ms)\n",
            agentos_api::DEADLINE_SAMPLE_INTERVAL.as_millis()
        ));
    }
    if let Some(m) = &st.models {
        s.push_str(&model_line(m));
    }
    if let Some(c) = &st.daemon_cpu {
        s.push_str(&daemon_cpu_line(c));
    }
    if st.denials > 0 {
        s.push_str(&format!(
            "    Denials: {} by the kernel since agentosd started (agentctl audit show --agent {})\n",
            st.denials, st.name
        ));
    }
    if let Some(n) = st.syscalls {
        s.push_str(&format!(
            "   Syscalls: {n} entered by its processes in this run (agentosd --syscall-counts)\n"
        ));
    }
    s.push_str(&format!("      Tasks: {}\n", st.tasks_current));
    s.push_str(&format!(
        "     Memory: {}\n",
        st.memory_current
            .map(fmt_bytes)
            .unwrap_or_else(|| "n/a (no memory controller)".to_string())
    ));
    if let Some(d) = &st.disk {
        s.push_str(&disk_line(d));
    }
    s.push_str(&format!(
        "        CPU: {}\n",
        st.cpu_usage_nsec
            .map(fmt_cpu)
            .unwrap_or_else(|| "n/a".into())
    ));
    s.push_str(&format!(
        "   Restarts: {} (policy {})\n",
        st.restarts, st.restart_policy
    ));
    if !st.unenforced_budgets.is_empty() {
        s.push_str(" Unenforced: ");
        s.push_str(&st.unenforced_budgets.join("\n             "));
        s.push('\n');
    }
    s.push_str(&format!("     CGroup: {}\n", st.control_group));
    s.push_str(&render_tree(&st.processes));
    if !log.is_empty() {
        s.push('\n');
        // `short` escapes the message and marks who wrote it.
        for e in log {
            s.push_str(&e.short(&name));
            s.push('\n');
        }
    }
    s
}

/// `       Disk: 3.0 MiB of 8.0 MiB, 12 of 100 inodes (user quota)`.
fn disk_line(d: &agentos_api::DiskUsage) -> String {
    let of = |max: u64, f: &dyn Fn(u64) -> String| {
        if max == 0 {
            " (no limit)".to_string()
        } else {
            format!(" of {}", f(max))
        }
    };
    format!(
        "       Disk: {}{}, {} inodes{} (user quota on the state file system{})\n",
        fmt_bytes(d.bytes),
        of(d.bytes_max, &fmt_bytes),
        d.inodes,
        of(d.inodes_max, &|n| n.to_string()),
        if d.enforced {
            ""
        } else {
            ", counted, NOT enforced"
        }
    )
}

/// `├─PID cmdline` lines, children under their parents.
fn render_tree(procs: &[(u32, u32, String)]) -> String {
    let pids: std::collections::HashSet<u32> = procs.iter().map(|p| p.0).collect();
    let roots: Vec<&(u32, u32, String)> = procs.iter().filter(|p| !pids.contains(&p.1)).collect();
    let mut out = String::new();
    fn walk(
        p: &(u32, u32, String),
        procs: &[(u32, u32, String)],
        prefix: &str,
        last: bool,
        out: &mut String,
    ) {
        out.push_str(&format!(
            "             {prefix}{}{} {}\n",
            if last { "└─" } else { "├─" },
            p.0,
            p.2
        ));
        let kids: Vec<&(u32, u32, String)> = procs.iter().filter(|k| k.1 == p.0).collect();
        let np = format!("{prefix}{}", if last { "  " } else { "│ " });
        for (i, k) in kids.iter().enumerate() {
            walk(k, procs, &np, i + 1 == kids.len(), out);
        }
    }
    for (i, r) in roots.iter().enumerate() {
        walk(r, procs, "", i + 1 == roots.len(), &mut out);
    }
    out
}

/// The table `agentctl consent list` prints.
pub fn render_consents(rows: &[ConsentRequest]) -> String {
    if rows.is_empty() {
        return "no calls are waiting for consent\n".to_string();
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0);
    let mut s = format!(
        "{:<6} {:<28} {:<24} {:>8}  {}\n",
        "ID", "AGENT", "TOOL", "EXPIRES", "ARGUMENTS"
    );
    for r in rows {
        let left = r.expires_us.saturating_sub(now) / 1_000_000;
        let mut args = esc(&r.arguments.to_string());
        if args.len() > 120 {
            let cut = (0..=117)
                .rev()
                .find(|i| args.is_char_boundary(*i))
                .unwrap_or(0);
            args.truncate(cut);
            args.push_str("...");
        }
        s.push_str(&format!(
            "{:<6} {:<28} {:<24} {:>7}s  {}\n",
            r.id,
            esc(&r.agent),
            esc(&r.tool),
            left,
            args
        ));
    }
    s.push_str(&format!(
        "\n{} call(s) waiting; answer with `agentctl consent approve ID` or `agentctl consent deny ID`\n",
        rows.len()
    ));
    s
}

/// The `Models:` line of `status`: tokens used and left, calls, and the last answer's speed.
fn model_line(m: &agentos_api::ModelUsage) -> String {
    let used = m.prompt_tokens + m.completion_tokens;
    let mut line = format!(
        "     Models: {used} tokens ({} prompt, {} completion)",
        m.prompt_tokens, m.completion_tokens
    );
    if let Some(left) = m.tokens_left {
        line.push_str(&format!(", {left} left"));
    }
    if let Some(pm) = m.tokens_per_minute {
        line.push_str(&format!(", at most {pm}/min"));
    }
    line.push_str(&format!(
        "; {} calls, {} failed, {} refused",
        m.calls, m.errors, m.refused
    ));
    if m.last_first_token_us > 0 {
        line.push_str(&format!(
            "; last: first token {:.1} ms, {:.1} tokens/s",
            m.last_first_token_us as f64 / 1000.0,
            m.last_tokens_per_sec_milli as f64 / 1000.0
        ));
    }
    line.push('\n');
    line
}

/// The daemon's CPU spent for the agent, and its share (`--ipc-agent-cpu`).
fn daemon_cpu_line(c: &agentos_api::DaemonCpu) -> String {
    let share = if c.permille == 0 {
        "no share set".to_string()
    } else if c.ceiling_permille > 0 {
        format!(
            "share {}.{}% of one CPU, more while all agents take under {}.{}%",
            c.permille / 10,
            c.permille % 10,
            c.ceiling_permille / 10,
            c.ceiling_permille % 10
        )
    } else {
        format!("share {}.{}% of one CPU", c.permille / 10, c.permille % 10)
    };
    let held = if c.throttles > 0 {
        format!(
            "; held {} time(s), {} ms (--ipc-agent-cpu)",
            c.throttles, c.throttled_ms
        )
    } else {
        String::new()
    };
    format!(
        " Daemon CPU: {:.1} ms spent for it by agentosd ({share}{held})\n",
        c.used_nsec as f64 / 1e6
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_disk_line_shows_usage_against_the_quota() {
        let mut d = agentos_api::DiskUsage {
            bytes: 3 << 20,
            inodes: 12,
            bytes_max: 8 << 20,
            inodes_max: 200,
            enforced: true,
        };
        assert_eq!(
            disk_line(&d),
            "       Disk: 3.0M of 8.0M, 12 inodes of 200 (user quota on the state file system)\n"
        );
        (d.inodes_max, d.enforced) = (0, false);
        assert!(disk_line(&d).contains("12 inodes (no limit)"));
        assert!(disk_line(&d).contains("counted, NOT enforced"));
    }

    #[test]
    fn the_daemon_cpu_line_names_the_share_and_the_ceiling() {
        let mut c = agentos_api::DaemonCpu {
            used_nsec: 412_300_000,
            throttles: 0,
            throttled_ms: 0,
            permille: 50,
            ceiling_permille: 500,
            audit_nsec: 0,
        };
        assert_eq!(
            daemon_cpu_line(&c),
            " Daemon CPU: 412.3 ms spent for it by agentosd (share 5.0% of one CPU, more while \
             all agents take under 50.0%)\n"
        );
        c.ceiling_permille = 0;
        c.throttles = 44;
        c.throttled_ms = 3120;
        assert_eq!(
            daemon_cpu_line(&c),
            " Daemon CPU: 412.3 ms spent for it by agentosd (share 5.0% of one CPU; held 44 \
             time(s), 3120 ms (--ipc-agent-cpu))\n"
        );
        // An older daemon's status has no ceiling: read as a hard cap.
        let old: agentos_api::DaemonCpu =
            serde_json::from_str(r#"{"used_nsec":1,"throttles":0,"throttled_ms":0,"permille":50}"#)
                .unwrap();
        assert_eq!(old.ceiling_permille, 0);
    }

    #[test]
    fn time_formats() {
        assert_eq!(fmt_time_us(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(
            fmt_time_us(1_700_000_000_000_000),
            "2023-11-14 22:13:20 UTC"
        );
        assert_eq!(fmt_bytes(512), "512B");
        assert_eq!(fmt_bytes(1536), "1.5K");
    }

    #[test]
    fn list_table_has_header_and_count() {
        use agentos_api::{ListRow, ListRowRef};
        let rows = vec![
            ListRow {
                id: "default/ticker".into(),
                name: "ticker".into(),
                tenant: "default".into(),
                state: "running".into(),
                result: String::new(),
                latency_class: "DT".into(),
                main_pid: 42,
                object_path: "/org/agentos1/agent/default_ticker".into(),
            },
            ListRow {
                id: "default/e\x1b[2J".into(),
                name: "e\x1b[2J".into(),
                tenant: "default".into(),
                state: "failed".into(),
                result: "exit-code\n".into(),
                latency_class: String::new(),
                main_pid: 0,
                object_path: "/org/agentos1/agent/x".into(),
            },
        ];
        let t = render_list(&rows);
        assert_eq!(
            t,
            "AGENT             STATE             PID  CLASS  RESULT\n\
             default/ticker    running            42  DT\n\
             default/e\\x1b[2J  failed              -  -      exit-code\\n\n\
             \n2 agents listed.\n"
        );
        // Borrowed from a reply, the same table.
        let refs: Vec<ListRowRef<'_>> = rows
            .iter()
            .map(|r| ListRowRef {
                id: &r.id,
                name: &r.name,
                tenant: &r.tenant,
                state: &r.state,
                result: &r.result,
                latency_class: &r.latency_class,
                main_pid: r.main_pid,
                object_path: &r.object_path,
            })
            .collect();
        assert_eq!(render_list(&refs), t);
        assert_eq!(
            serde_json::to_string(&refs).unwrap(),
            serde_json::to_string(&rows).unwrap()
        );
    }

    #[test]
    fn tree_nests_children() {
        let t = render_tree(&[(10, 1, "sh".into()), (11, 10, "sleep 1".into())]);
        assert!(t.contains("└─10 sh"));
        assert!(t.contains("  └─11 sleep 1"), "{t}");
    }

    #[test]
    fn status_shows_syscalls_only_when_counted() {
        // An older daemon's JSON has no `syscalls`: absent, like counting off.
        let old = serde_json::json!({
            "id": "default/a", "name": "a", "tenant": "default", "state": "running",
            "result": "", "main_pid": 0, "control_group": "", "latency_class": "DT",
            "cpu_usage_nsec": null, "memory_current": null, "tasks_current": 1, "restarts": 0,
            "restart_policy": "no", "started_at_us": 0, "exit_status": "",
            "unenforced_budgets": [], "notes": [], "log_path": "", "origin": "", "enabled": false,
            "object_path": "", "command": "sleep", "processes": []
        });
        let mut st: AgentStatus = serde_json::from_value(old).expect("status without syscalls");
        assert_eq!(st.syscalls, None);
        assert_eq!(
            (st.deadline_misses, st.denials),
            (None, 0),
            "absent: defaults"
        );
        assert!(!render_status(&st, &[]).contains("Syscalls"));
        st.syscalls = Some(200_212);
        let t = render_status(&st, &[]);
        assert!(t.contains("\n   Syscalls: 200212 entered"), "{t}");
    }

    #[test]
    fn agent_strings_reach_the_terminal_escaped() {
        let st = serde_json::json!({
            "id": "default/a", "name": "a", "tenant": "default", "state": "running",
            "result": "", "main_pid": 7, "control_group": "", "latency_class": "DT",
            "cpu_usage_nsec": null, "memory_current": null, "tasks_current": 1, "restarts": 0,
            "restart_policy": "no", "started_at_us": 0, "exit_status": "",
            "unenforced_budgets": [], "notes": [], "log_path": "", "origin": "",
            "enabled": false, "object_path": "", "command": "sh",
            "processes": [[7, 1, "sh \u{1b}]0;title\u{7}"]]
        });
        let st: AgentStatus = serde_json::from_value(st).unwrap();
        let forged = agentos_api::LogEntry {
            time_us: 0,
            stream: "stdout".into(),
            message: "\x1b[2Jagentosd: fake\rline".into(),
        };
        let t = render_status(&st, &[forged]);
        assert!(
            !t.contains('\x1b') && !t.contains('\x07') && !t.contains('\r'),
            "{t:?}"
        );
        assert!(t.contains(" a: \\x1b[2Jagentosd: fake\\rline"), "{t}");
        assert!(t.contains("sh \\x1b]0;title\\x07"), "{t}");
        let rows = vec![ConsentRequest {
            id: 1,
            agent: "default/a".into(),
            tool: "pay\u{9b}31m".into(),
            capability: "c".into(),
            arguments: serde_json::json!({"to": "\u{202e}evil"}),
            requested_us: 0,
            expires_us: 0,
        }];
        let t = render_consents(&rows);
        assert!(
            t.contains("pay\\u{009b}31m") && t.contains("\\u{202e}evil"),
            "{t}"
        );
        assert!(!t.contains('\u{9b}') && !t.contains('\u{202e}'), "{t}");
    }
}
