//! Per-agent log files: `LOG_DIR/<tenant>/<name>.log`, opened O_APPEND by the daemon and
//! inherited by the agent as stdout and stderr, so output survives a daemon restart.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// Where the log of `tenant/name` lives.
pub fn log_path(log_dir: &Path, tenant: &str, name: &str) -> PathBuf {
    log_dir.join(tenant).join(format!("{name}.log"))
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

/// Append a line from the daemon itself (e.g. `agentosd: started main process 123`).
pub fn append_note(path: &Path, line: &str) {
    // In the daemon's own log directory, never through a link (safe_fs).
    if let Ok(fd) = crate::safe_fs::open_append(path, 0o644) {
        let mut f = File::from(fd);
        // One write(2) on an O_APPEND file: the agent writes to the same file, and `writeln!`
        // would issue a write per piece, letting an agent's line land inside ours.
        let _ = f.write_all(format!("agentosd: {line}\n").as_bytes());
    }
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

/// Copies new lines of agent logs to the journal (when present), once a second: each line
/// becomes an entry with `SYSLOG_IDENTIFIER=<name>` and `AGENTOS_AGENT=<tenant/name>`, so
/// `journalctl AGENTOS_AGENT=default/ticker` works. Offsets start at the end of each file, so a
/// daemon restart does not replay old lines.
pub struct JournalForwarder {
    sock: std::os::unix::net::UnixDatagram,
    offsets: std::collections::HashMap<PathBuf, u64>,
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
        Some(Self {
            sock,
            offsets: Default::default(),
        })
    }

    /// Forward what was appended to `path` since the last call.
    pub fn forward(&mut self, path: &Path, id: &str, name: &str) {
        let Ok(len) = std::fs::metadata(path).map(|m| m.len()) else {
            return;
        };
        let off = *self.offsets.entry(path.to_path_buf()).or_insert(len);
        if len == off {
            return;
        }
        let Ok((text, next)) = read_from(path, off, 256 * 1024) else {
            return;
        };
        self.offsets.insert(path.to_path_buf(), next);
        for line in text.lines() {
            let entry = journal_entry(&[
                ("MESSAGE", line),
                ("PRIORITY", "6"),
                ("SYSLOG_IDENTIFIER", name),
                ("AGENTOS_AGENT", id),
            ]);
            // Best effort: a full journal socket drops lines rather than blocking the daemon.
            let _ = self.sock.send(&entry);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        append_note(&p, "x");
        std::fs::OpenOptions::new()
            .append(true)
            .open(&p)
            .unwrap()
            .write_all(b"partial")
            .unwrap();
        let (t, next2) = read_from(&p, next, 1000).unwrap();
        assert_eq!(t, "agentosd: x\n");
        assert_eq!(next2, next + 12);
    }

    #[test]
    fn journal_native_format() {
        let e = journal_entry(&[("MESSAGE", "hi"), ("X", "a\nb")]);
        let mut want = b"MESSAGE=hi\nX\n".to_vec();
        want.extend_from_slice(&3u64.to_le_bytes());
        want.extend_from_slice(b"a\nb\n");
        assert_eq!(e, want);
    }

    #[test]
    fn forwards_new_lines_only() {
        let dir = tempfile::tempdir().unwrap();
        let sock_path = dir.path().join("journal.sock");
        let journal = std::os::unix::net::UnixDatagram::bind(&sock_path).unwrap();
        journal.set_nonblocking(true).unwrap();
        let log = dir.path().join("a.log");
        std::fs::write(&log, "old\n").unwrap();
        let mut fwd = JournalForwarder::connect(&sock_path).unwrap();
        fwd.forward(&log, "default/a", "a");
        let mut f = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
        f.write_all(b"new line\n").unwrap();
        fwd.forward(&log, "default/a", "a");
        let mut buf = [0u8; 512];
        let n = journal.recv(&mut buf).unwrap();
        let got = String::from_utf8_lossy(&buf[..n]);
        assert!(got.contains("MESSAGE=new line\n"), "{got}");
        assert!(got.contains("AGENTOS_AGENT=default/a\n"), "{got}");
        assert!(
            journal.recv(&mut buf).is_err(),
            "old line must not be replayed"
        );
    }
}
