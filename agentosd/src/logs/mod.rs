//! Per-agent logs, kept like the journal. The agent's standard output and error go to two files
//! of their own (`LOG_DIR/<tenant>/<name>.log` and `<name>.stderr.log`), opened O_APPEND by the
//! daemon and inherited by the agent, so output survives a daemon restart. Only the daemon reads
//! them: it takes in what was appended (ingest.rs), stamps each line with the time and the stream,
//! and appends it to the agent's **journal** (`<name>.journal`, JSON lines, journal.rs), where
//! the daemon's own notes go too, marked as its. An agent therefore cannot write a line that reads
//! as the daemon's, every line has a time, and the journal is size-capped and rotated. Where
//! journald runs, each entry is also sent there with `AGENTOS_AGENT=`/`AGENTOS_TENANT=` fields.

mod ingest;
pub mod journal;
mod rounds;

pub use ingest::{Limits, Logs, Who};
pub use rounds::{Round, Rounds};

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// Where the agent's standard output of `tenant/name` goes (its standard error, journal and
/// ingest offsets are next to it: [`AgentFiles`]).
pub fn log_path(log_dir: &Path, tenant: &str, name: &str) -> PathBuf {
    log_dir.join(tenant).join(format!("{name}.log"))
}

/// The files of one agent's log, derived from its [`log_path`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentFiles {
    /// What the agent writes to its standard output.
    pub stdout: PathBuf,
    /// What it writes to its standard error.
    pub stderr: PathBuf,
    /// The journal the daemon keeps from both, with its notes (`.journal`, rotated to `.journal.1`).
    pub journal: PathBuf,
    /// How far the daemon has read each stream (survives daemon restarts).
    pub offsets: PathBuf,
}

impl AgentFiles {
    pub fn of(log_path: &Path) -> Self {
        AgentFiles {
            stdout: log_path.to_path_buf(),
            stderr: sibling(log_path, ".stderr.log"),
            journal: sibling(log_path, ".journal"),
            offsets: sibling(log_path, ".offsets"),
        }
    }

    /// Only [`AgentFiles::stderr`] (an idle agent's look needs no other).
    pub fn stderr_of(log_path: &Path) -> PathBuf {
        sibling(log_path, ".stderr.log")
    }

    /// The journal's rotated predecessor.
    pub fn journal_old(&self) -> PathBuf {
        let mut s = self.journal.clone().into_os_string();
        s.push(".1");
        PathBuf::from(s)
    }
}

/// The file next to `log_path` (`<name>.log`) named `<name><suffix>`.
fn sibling(log_path: &Path, suffix: &str) -> PathBuf {
    let name = log_path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    let stem = name.strip_suffix(".log").unwrap_or(&name);
    log_path.with_file_name(format!("{stem}{suffix}"))
}

/// The last `n` lines of the file (at most the last 1 MiB is read), and the file's size.
pub fn tail(path: &Path, n: usize) -> io::Result<(Vec<String>, u64)> {
    let mut f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((Vec::new(), 0)),
        Err(e) => return Err(e),
    };
    let len = f.metadata()?.len();
    let start = len.saturating_sub(1 << 20);
    f.seek(SeekFrom::Start(start))?;
    let mut buf = Vec::new();
    f.take(len - start).read_to_end(&mut buf)?;
    let text = String::from_utf8_lossy(&buf);
    let mut lines: Vec<&str> = text.lines().collect();
    if start > 0 && !lines.is_empty() {
        lines.remove(0); // probably a partial line
    }
    let skip = lines.len().saturating_sub(n);
    Ok((
        lines[skip..].iter().map(|s| s.to_string()).collect(),
        start + buf.len() as u64,
    ))
}

/// Up to `max` bytes from `offset`, ending at a line boundary when possible; returns the text
/// and the next offset. A file shorter than `offset` (truncated) restarts at 0.
pub fn read_from(path: &Path, offset: u64, max: usize) -> io::Result<(String, u64)> {
    let mut f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((String::new(), 0)),
        Err(e) => return Err(e),
    };
    let len = f.metadata()?.len();
    let offset = if offset > len { 0 } else { offset };
    f.seek(SeekFrom::Start(offset))?;
    let mut buf = Vec::new();
    f.take(max as u64).read_to_end(&mut buf)?;
    if let Some(last_nl) = buf.iter().rposition(|b| *b == b'\n') {
        buf.truncate(last_nl + 1);
    } else if buf.len() < max {
        buf.clear(); // wait for the rest of the line
    }
    let next = offset + buf.len() as u64;
    Ok((String::from_utf8_lossy(&buf).into_owned(), next))
}

/// The journal's native socket; forwarding is on when it exists.
pub const JOURNAL_SOCKET: &str = "/run/systemd/journal/socket";

/// One journal entry in the native protocol (fields `KEY=value\n`; values with a newline use the
/// binary length-prefixed form).
pub fn journal_entry(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in fields {
        out.extend_from_slice(k.as_bytes());
        if v.contains('\n') {
            out.push(b'\n');
            out.extend_from_slice(&(v.len() as u64).to_le_bytes());
            out.extend_from_slice(v.as_bytes());
            out.push(b'\n');
        } else {
            out.push(b'=');
            out.extend_from_slice(v.as_bytes());
            out.push(b'\n');
        }
    }
    out
}

/// Sends journal entries of agents to journald (when it runs here): each becomes an entry with
/// `SYSLOG_IDENTIFIER=<name>`, `AGENTOS_AGENT=<tenant/name>`, `AGENTOS_TENANT=`, and
/// `AGENTOS_STREAM=stdout|stderr|agentosd`, so `journalctl AGENTOS_TENANT=acme` works.
pub struct JournalForwarder {
    sock: std::os::unix::net::UnixDatagram,
}

impl JournalForwarder {
    /// `None` when no journal runs here.
    pub fn new() -> Option<Self> {
        Self::connect(Path::new(JOURNAL_SOCKET))
    }

    /// Forward to the journal socket at `socket`.
    pub fn connect(socket: &Path) -> Option<Self> {
        if !socket.exists() {
            return None;
        }
        let sock = std::os::unix::net::UnixDatagram::unbound().ok()?;
        sock.connect(socket).ok()?;
        sock.set_nonblocking(true).ok()?;
        Some(Self { sock })
    }

    /// Send one entry of `who`'s journal.
    pub fn send(&self, who: &Who<'_>, e: &agentos_api::LogEntry) {
        let priority = match e.stream.as_str() {
            "stderr" => "4",
            "agentosd" => "5",
            _ => "6",
        };
        let entry = journal_entry(&[
            ("MESSAGE", &e.message),
            ("PRIORITY", priority),
            ("SYSLOG_IDENTIFIER", who.name),
            ("AGENTOS_AGENT", who.id),
            ("AGENTOS_TENANT", who.tenant),
            ("AGENTOS_STREAM", &e.stream),
        ]);
        // Best effort: a full journal socket drops lines rather than blocking the daemon.
        let _ = self.sock.send(&entry);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn tail_and_follow() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.log");
        assert_eq!(tail(&p, 5).unwrap().0.len(), 0);
        std::fs::write(&p, "1\n2\n3\n4\n").unwrap();
        let (lines, end) = tail(&p, 2).unwrap();
        assert_eq!(lines, vec!["3", "4"]);
        assert_eq!(end, 8);
        let (t, next) = read_from(&p, 4, 1000).unwrap();
        assert_eq!(t, "3\n4\n");
        assert_eq!(next, 8);
        let mut f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
        f.write_all(b"x\npartial").unwrap();
        let (t, next2) = read_from(&p, next, 1000).unwrap();
        assert_eq!(t, "x\n");
        assert_eq!(next2, next + 2);
    }

    #[test]
    fn files_of_an_agent() {
        let f = AgentFiles::of(Path::new("/l/acme/bot.log"));
        assert_eq!(f.stderr, Path::new("/l/acme/bot.stderr.log"));
        assert_eq!(f.journal, Path::new("/l/acme/bot.journal"));
        assert_eq!(f.journal_old(), Path::new("/l/acme/bot.journal.1"));
        assert_eq!(f.offsets, Path::new("/l/acme/bot.offsets"));
    }

    #[test]
    fn journal_native_format() {
        let e = journal_entry(&[("MESSAGE", "hi"), ("X", "a\nb")]);
        let mut want = b"MESSAGE=hi\nX\n".to_vec();
        want.extend_from_slice(&3u64.to_le_bytes());
        want.extend_from_slice(b"a\nb\n");
        assert_eq!(e, want);
    }
}
