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
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
    {
        let _ = writeln!(f, "agentosd: {line}");
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
}
