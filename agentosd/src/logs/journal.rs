//! An agent's journal file: one JSON [`LogEntry`] per line, written only by the daemon
//! (ingest.rs), capped at [`Limits::journal_max`](super::Limits) and rotated to `.journal.1`
//! (so at most twice that is kept).

use super::AgentFiles;
use agentos_api::LogEntry;
use std::io::{self, Read, Write};

/// The most a query returns in one answer (the newest entries are kept).
pub const MAX_REPLY_BYTES: usize = 4 << 20;

/// Append `entries` with one write(2), rotating first when the file would grow past `max`.
pub(super) fn append(files: &AgentFiles, entries: &[LogEntry], max: u64) -> io::Result<()> {
    if entries.is_empty() {
        return Ok(());
    }
    let mut buf = Vec::new();
    for e in entries {
        serde_json::to_writer(&mut buf, e).map_err(io::Error::other)?;
        buf.push(b'\n');
    }
    let len = std::fs::symlink_metadata(&files.journal)
        .map(|m| m.len())
        .unwrap_or(0);
    if len > 0 && len + buf.len() as u64 > max {
        std::fs::rename(&files.journal, files.journal_old())?;
    }
    // The daemon's own log directory, never through a link (safe_fs).
    let fd = crate::safe_fs::open_append(&files.journal, 0o640).map_err(io::Error::other)?;
    std::fs::File::from(fd).write_all(&buf)
}

/// Which entries a query wants.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Query {
    /// The newest this many (0: all that match).
    pub lines: usize,
    /// Only entries at or after this time (µs since the epoch; 0: no bound).
    pub since_us: u64,
    /// Only entries at or before this time (0: no bound).
    pub until_us: u64,
}

/// The entries `q` asks for, oldest first, and the offset in the current journal to follow from
/// with [`read_from`].
pub fn query(files: &AgentFiles, q: Query) -> io::Result<(Vec<LogEntry>, u64)> {
    let next = std::fs::metadata(&files.journal)
        .map(|m| m.len())
        .unwrap_or(0);
    let mut out: Vec<LogEntry> = Vec::new();
    if q.since_us == 0 && q.until_us == 0 && q.lines > 0 {
        // The common case (`-n N`, status): the tail of the newest file, then of the older one.
        let (lines, _) = super::tail(&files.journal, q.lines)?;
        out = lines.iter().filter_map(|l| parse(l)).collect();
        if out.len() < q.lines {
            let (old, _) = super::tail(&files.journal_old(), q.lines - out.len())?;
            let mut older: Vec<LogEntry> = old.iter().filter_map(|l| parse(l)).collect();
            older.append(&mut out);
            out = older;
        }
    } else {
        for path in [files.journal_old(), files.journal.clone()] {
            for l in read_all(&path)?.lines() {
                if let Some(e) = parse(l) {
                    let after = q.since_us == 0 || e.time_us >= q.since_us;
                    let before = q.until_us == 0 || e.time_us <= q.until_us;
                    if after && before {
                        out.push(e);
                    }
                }
            }
        }
        if q.lines > 0 && out.len() > q.lines {
            out.drain(..out.len() - q.lines);
        }
    }
    Ok((cap(out), next))
}

/// The entries appended from `offset` (at most `max` bytes' worth), and the next offset. An
/// offset past the end (the journal was rotated) starts again at 0.
pub fn read_from(files: &AgentFiles, offset: u64, max: usize) -> io::Result<(Vec<LogEntry>, u64)> {
    let (text, next) = super::read_from(&files.journal, offset, max)?;
    Ok((text.lines().filter_map(parse).collect(), next))
}

/// Entries as the D-Bus answers carry them: JSON lines.
pub fn to_json_lines(entries: &[LogEntry]) -> String {
    let mut s = String::new();
    for e in entries {
        if let Ok(j) = serde_json::to_string(e) {
            s.push_str(&j);
            s.push('\n');
        }
    }
    s
}

fn parse(line: &str) -> Option<LogEntry> {
    serde_json::from_str(line).ok()
}

fn read_all(path: &std::path::Path) -> io::Result<String> {
    let mut f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(String::new()),
        Err(e) => return Err(e),
    };
    let mut buf = Vec::new();
    f.read_to_end(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// The newest entries that fit in [`MAX_REPLY_BYTES`].
fn cap(mut entries: Vec<LogEntry>) -> Vec<LogEntry> {
    let mut total = 0usize;
    let mut keep = entries.len();
    for (i, e) in entries.iter().enumerate().rev() {
        total += e.message.len() + 48;
        if total > MAX_REPLY_BYTES {
            break;
        }
        keep = i;
    }
    entries.drain(..keep);
    entries
}
