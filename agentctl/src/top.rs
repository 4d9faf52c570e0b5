//! `agentctl top`: a live view of the agents, like top(1): per agent CPU (share of one CPU
//! over the last interval), memory, tasks, kernel denials, tool calls per second, model tokens
//! and the last model answer's time to first token, refreshed every `--delay`, sorted by `--sort`
//! or, on a terminal, by a key pressed while it runs (top(1)'s `P`, `M`, `T`, and one key per
//! other column; space refreshes, `q` quits); `--batch` prints plain frames for scripts (`-n` of
//! them). The figures come from `DescribeAgents`, the same as `status` and the D-Bus properties.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::{Duration, Instant};

use agentos_api::AgentStatus;
use agentos_api::text::escape_control as esc;

use crate::client::Client;
use crate::exit;

/// The column `top` sorts by (highest first; `name` alphabetically).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Sort {
    Cpu,
    Mem,
    Tasks,
    Denials,
    Tokens,
    Calls,
    Name,
}

impl Sort {
    fn label(self) -> &'static str {
        match self {
            Sort::Cpu => "CPU%",
            Sort::Mem => "MEM",
            Sort::Tasks => "TASKS",
            Sort::Denials => "DENIALS",
            Sort::Tokens => "TOKENS",
            Sort::Calls => "CALLS/s",
            Sort::Name => "AGENT",
        }
    }
}

/// What a key pressed while `top` runs on a terminal does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    Sort(Sort),
    Refresh,
    Quit,
}

/// The keys: top(1)'s `P` (CPU), `M` (memory), `T` (tasks), `N` (name), and `d` denials,
/// `k` tokens, `r` calls per second; either case. Space refreshes now; `q` quits.
pub const KEYS_HELP: &str = "P cpu, M mem, T tasks, d denials, k tokens, r calls/s, N name, q quit";

pub fn key(b: u8) -> Option<Key> {
    Some(match b.to_ascii_lowercase() {
        b'p' | b'c' => Key::Sort(Sort::Cpu),
        b'm' => Key::Sort(Sort::Mem),
        b't' => Key::Sort(Sort::Tasks),
        b'd' => Key::Sort(Sort::Denials),
        b'k' => Key::Sort(Sort::Tokens),
        b'r' => Key::Sort(Sort::Calls),
        b'n' => Key::Sort(Sort::Name),
        b' ' => Key::Refresh,
        b'q' => Key::Quit,
        _ => return None,
    })
}

/// One row, computed from two samples.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub id: String,
    pub state: String,
    /// Percent of one CPU over the interval; `None` without the cpu figures.
    pub cpu: Option<f64>,
    pub mem: Option<u64>,
    pub tasks: u64,
    pub denials: u64,
    pub tokens: u64,
    pub first_token_ms: Option<f64>,
    /// MCP tool calls per second over the interval.
    pub tool_calls_per_sec: Option<f64>,
}

/// The rows of `now`, with CPU shares from `before` taken `dt` earlier.
pub fn rows(before: &[AgentStatus], now: &[AgentStatus], dt: Duration, sort: Sort) -> Vec<Row> {
    let prev: BTreeMap<&str, (Option<u64>, u64)> = before
        .iter()
        .map(|s| (s.id.as_str(), (s.cpu_usage_nsec, s.tool_calls)))
        .collect();
    let mut out: Vec<Row> = now
        .iter()
        .map(|s| {
            let earlier = prev.get(s.id.as_str()).copied();
            let cpu = match (earlier.and_then(|e| e.0), s.cpu_usage_nsec) {
                (Some(a), Some(b)) if b >= a && dt > Duration::ZERO => {
                    Some((b - a) as f64 / dt.as_nanos() as f64 * 100.0)
                }
                _ => None,
            };
            let calls = earlier
                .filter(|e| s.tool_calls >= e.1 && dt > Duration::ZERO)
                .map(|e| (s.tool_calls - e.1) as f64 / dt.as_secs_f64());
            let m = s.models.as_ref();
            Row {
                tool_calls_per_sec: calls,
                id: s.id.clone(),
                state: s.state.clone(),
                cpu,
                mem: s.memory_current,
                tasks: s.tasks_current,
                denials: s.denials,
                tokens: m.map_or(0, |m| m.prompt_tokens + m.completion_tokens),
                first_token_ms: m
                    .filter(|m| m.last_first_token_us > 0)
                    .map(|m| m.last_first_token_us as f64 / 1000.0),
            }
        })
        .collect();
    out.sort_by(|a, b| {
        let key = |r: &Row| -> f64 {
            match sort {
                Sort::Cpu => r.cpu.unwrap_or(-1.0),
                Sort::Mem => r.mem.map_or(-1.0, |m| m as f64),
                Sort::Tasks => r.tasks as f64,
                Sort::Denials => r.denials as f64,
                Sort::Tokens => r.tokens as f64,
                Sort::Calls => r.tool_calls_per_sec.unwrap_or(-1.0),
                Sort::Name => 0.0,
            }
        };
        key(b)
            .partial_cmp(&key(a))
            .unwrap_or(std::cmp::Ordering::Equal)
            .then_with(|| a.id.cmp(&b.id))
    });
    out
}

fn bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "K", "M", "G", "T"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b}B")
    } else {
        format!("{v:.1}{}", UNITS[u])
    }
}

/// One frame: a header line and the table; `keys` adds the key help (on a terminal).
pub fn frame(rows: &[Row], dt: Duration, sort: Sort, keys: bool) -> String {
    let running = rows.iter().filter(|r| r.state == "running").count();
    let mut s = format!(
        "agents: {} total, {running} running; CPU over the last {:.1} s; sorted by {}\n",
        rows.len(),
        dt.as_secs_f64(),
        sort.label()
    );
    if keys {
        s.push_str(&format!("keys: {KEYS_HELP}\n"));
    }
    s.push_str(&format!(
        "{:<32} {:<12} {:>6} {:>9} {:>6} {:>8} {:>8} {:>9} {:>9}\n",
        "AGENT", "STATE", "CPU%", "MEM", "TASKS", "DENIALS", "CALLS/s", "TOKENS", "TTFT(ms)"
    ));
    for r in rows {
        s.push_str(&format!(
            "{:<32} {:<12} {:>6} {:>9} {:>6} {:>8} {:>8} {:>9} {:>9}\n",
            esc(&r.id),
            esc(&r.state),
            r.cpu.map_or("-".into(), |c| format!("{c:.1}")),
            r.mem.map_or("-".into(), bytes),
            r.tasks,
            r.denials,
            r.tool_calls_per_sec
                .map_or("-".into(), |c| format!("{c:.1}")),
            r.tokens,
            r.first_token_ms.map_or("-".into(), |t| format!("{t:.1}")),
        ));
    }
    s
}

/// Runs `top`: `frames` frames (0: until interrupted), `delay` apart; `batch` prints plain
/// frames, otherwise each frame replaces the last on the terminal, and keys pressed on it
/// change the sort (redrawn at once) or quit.
pub async fn top(
    c: &Client,
    batch: bool,
    frames: u32,
    delay: Duration,
    mut sort: Sort,
    out: &mut dyn Write,
) -> i32 {
    let mut keys = if batch { None } else { Keys::start() };
    let (mut before, mut t0) = match sample(c).await {
        Ok(x) => x,
        Err(e) => {
            eprintln!("agentctl: {}", e.message);
            return e.code;
        }
    };
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    // The last two samples, kept to redraw at once in another order.
    let mut last: Option<(Vec<AgentStatus>, Vec<AgentStatus>, Duration)> = None;
    let mut shown = 0;
    loop {
        let mut resort = false;
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            k = Keys::next(&mut keys) => match k {
                Key::Quit => return exit::OK,
                Key::Refresh => {}
                Key::Sort(s) => {
                    sort = s;
                    resort = last.is_some();
                }
            },
            _ = &mut ctrl_c => return exit::OK,
        }
        if resort && let Some((b, n, dt)) = &last {
            if draw(out, &frame(&rows(b, n, *dt, sort), *dt, sort, true), batch).is_err() {
                return exit::OK;
            }
            continue;
        }
        let (now, t1) = match sample(c).await {
            Ok(x) => x,
            Err(e) => {
                eprintln!("agentctl: {}", e.message);
                return e.code;
            }
        };
        let dt = t1.duration_since(t0);
        let text = frame(&rows(&before, &now, dt, sort), dt, sort, keys.is_some());
        if draw(out, &text, batch).is_err() {
            return exit::OK;
        }
        shown += 1;
        if frames > 0 && shown >= frames {
            return exit::OK;
        }
        last = Some((before, now.clone(), dt));
        (before, t0) = (now, t1);
    }
}

fn draw(out: &mut dyn Write, text: &str, batch: bool) -> std::io::Result<()> {
    if batch {
        writeln!(out, "{text}")?;
    } else {
        // Clear the screen and home the cursor, as top does without curses.
        write!(out, "\x1b[H\x1b[2J{text}")?;
    }
    out.flush()
}

/// Keys from the terminal on stdin, read without echo and without waiting for a line; the
/// terminal's modes are restored when this is dropped (also on `q`, Ctrl-C and a closed pipe).
struct Keys {
    rx: tokio::sync::mpsc::UnboundedReceiver<u8>,
    saved: libc::termios,
}

impl Keys {
    /// `None` when stdin is not a terminal (then only `--sort` sorts).
    fn start() -> Option<Keys> {
        // SAFETY: isatty on fd 0 reads no memory of ours.
        if unsafe { libc::isatty(0) } != 1 {
            return None;
        }
        // SAFETY: termios is plain data; tcgetattr fills it for fd 0, a terminal.
        let mut saved: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: a valid pointer to a termios we own.
        if unsafe { libc::tcgetattr(0, &mut saved) } != 0 {
            return None;
        }
        let mut raw = saved;
        // Keys as they are typed, not echoed; Ctrl-C still interrupts (ISIG stays).
        raw.c_lflag &= !(libc::ICANON | libc::ECHO);
        raw.c_cc[libc::VMIN] = 1;
        raw.c_cc[libc::VTIME] = 0;
        // SAFETY: a valid pointer to a termios we own, for fd 0.
        if unsafe { libc::tcsetattr(0, libc::TCSANOW, &raw) } != 0 {
            return None;
        }
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        std::thread::spawn(move || {
            use std::io::Read;
            let mut b = [0u8; 1];
            while let Ok(1) = std::io::stdin().read(&mut b) {
                if tx.send(b[0]).is_err() {
                    break;
                }
            }
        });
        Some(Keys { rx, saved })
    }

    /// The next key that means something; never, without a terminal or once stdin has ended.
    async fn next(keys: &mut Option<Keys>) -> Key {
        loop {
            let Some(k) = keys.as_mut() else {
                return std::future::pending().await;
            };
            match k.rx.recv().await {
                Some(b) => {
                    if let Some(action) = key(b) {
                        return action;
                    }
                }
                None => *keys = None,
            }
        }
    }
}

impl Drop for Keys {
    fn drop(&mut self) {
        // SAFETY: restores the modes read in start() on the same fd.
        unsafe { libc::tcsetattr(0, libc::TCSANOW, &self.saved) };
    }
}

async fn sample(c: &Client) -> Result<(Vec<AgentStatus>, Instant), crate::client::CliError> {
    let text: String = c.call("DescribeAgents", &()).await?;
    let all: Vec<AgentStatus> = serde_json::from_str(&text)
        .map_err(|e| crate::client::CliError::new(exit::FAILED, format!("DescribeAgents: {e}")))?;
    Ok((all, Instant::now()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(id: &str, cpu: Option<u64>, mem: u64, tokens: u64) -> AgentStatus {
        AgentStatus {
            id: id.into(),
            state: "running".into(),
            cpu_usage_nsec: cpu,
            memory_current: Some(mem),
            tasks_current: 1,
            models: Some(agentos_api::ModelUsage {
                prompt_tokens: tokens,
                last_first_token_us: 1500,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn cpu_is_the_share_of_one_cpu_over_the_interval_and_rows_sort() {
        let a = [st("t/a", Some(0), 10, 5), st("t/b", Some(0), 20, 1)];
        let b = [
            st("t/a", Some(500_000_000), 10, 5),
            st("t/b", Some(1_000_000_000), 20, 1),
            st("t/new", Some(7), 1, 0),
        ];
        let r = rows(&a, &b, Duration::from_secs(1), Sort::Cpu);
        assert_eq!(r[0].id, "t/b");
        assert_eq!(r[0].cpu, Some(100.0));
        assert_eq!(r[1].cpu, Some(50.0));
        // No earlier sample: no share yet.
        assert_eq!((r[2].id.as_str(), r[2].cpu), ("t/new", None));
        let mut b2 = b.clone();
        b2[0].tool_calls = 6;
        let r = rows(&a, &b2, Duration::from_secs(2), Sort::Calls);
        assert_eq!(
            (r[0].id.as_str(), r[0].tool_calls_per_sec),
            ("t/a", Some(3.0))
        );
        let r = rows(&a, &b, Duration::from_secs(1), Sort::Tokens);
        assert_eq!(r[0].id, "t/a");
        assert_eq!(r[0].first_token_ms, Some(1.5));
        let text = frame(&r, Duration::from_secs(1), Sort::Tokens, false);
        assert!(text.contains("3 total, 3 running"), "{text}");
        assert!(text.contains("sorted by TOKENS"), "{text}");
        assert!(text.lines().nth(2).unwrap().starts_with("t/a "), "{text}");
        let keyed = frame(&r, Duration::from_secs(1), Sort::Tokens, true);
        assert!(
            keyed.lines().nth(1).unwrap().starts_with("keys: "),
            "{keyed}"
        );
        assert!(keyed.lines().nth(3).unwrap().starts_with("t/a "), "{keyed}");
    }

    #[test]
    fn keys_are_tops_and_one_per_column() {
        assert_eq!(key(b'P'), Some(Key::Sort(Sort::Cpu)));
        assert_eq!(key(b'M'), Some(Key::Sort(Sort::Mem)));
        assert_eq!(key(b'T'), Some(Key::Sort(Sort::Tasks)));
        assert_eq!(key(b'N'), Some(Key::Sort(Sort::Name)));
        assert_eq!(key(b'd'), Some(Key::Sort(Sort::Denials)));
        assert_eq!(key(b'k'), Some(Key::Sort(Sort::Tokens)));
        assert_eq!(key(b'r'), Some(Key::Sort(Sort::Calls)));
        assert_eq!(key(b'q'), Some(Key::Quit));
        assert_eq!(key(b' '), Some(Key::Refresh));
        assert_eq!(key(b'\x1b'), None);
    }

    #[test]
    fn names_an_agent_chose_are_escaped() {
        let b = [st("t/\x1b[2Jevil", Some(0), 1, 0)];
        let text = frame(
            &rows(&[], &b, Duration::from_secs(1), Sort::Name),
            Duration::from_secs(1),
            Sort::Name,
            true,
        );
        assert!(!text.contains('\x1b'), "{text:?}");
    }
}
