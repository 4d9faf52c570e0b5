//! Best-effort forwarding of committed records to the systemd journal (native protocol).
//!
//! Each record becomes one journal entry: `MESSAGE` is the record's JSON line,
//! `SYSLOG_IDENTIFIER=agentosd-audit`, `PRIORITY` 4 for denials and 6 otherwise, and
//! `AGENTOS_AUDIT_SEQ`, `AGENTOS_AUDIT_KIND` as fields to filter on
//! (`journalctl SYSLOG_IDENTIFIER=agentosd-audit AGENTOS_AUDIT_KIND=denial`). The socket is
//! non-blocking: when journald is slow, entries are dropped and counted, never the audit log's.

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};

use crate::record::Kind;

/// journald's native socket.
pub const JOURNAL_SOCKET: &str = "/run/systemd/journal/socket";

pub(crate) struct Journal {
    sock: UnixDatagram,
    path: PathBuf,
    pub dropped: u64,
    msg: Vec<u8>,
}

impl Journal {
    /// Connects when the socket exists; `None` otherwise (no journal on this host).
    pub fn connect(path: &Path) -> Option<Journal> {
        let sock = UnixDatagram::unbound().ok()?;
        sock.set_nonblocking(true).ok()?;
        if !path.exists() {
            return None;
        }
        Some(Journal {
            sock,
            path: path.to_path_buf(),
            dropped: 0,
            msg: Vec::with_capacity(1024),
        })
    }

    /// Sends one committed line (without its newline).
    pub fn send(&mut self, seq: u64, kind: Kind, line: &[u8]) {
        use std::io::Write as _;
        self.msg.clear();
        let prio = if kind == Kind::Denial { 4 } else { 6 };
        // Writing into a Vec cannot fail.
        let _ = write!(
            self.msg,
            "SYSLOG_IDENTIFIER=agentosd-audit\nPRIORITY={prio}\nAGENTOS_AUDIT_SEQ={seq}\nAGENTOS_AUDIT_KIND={}\nMESSAGE=",
            kind.as_str()
        );
        // A JSON line holds no raw newline, so the simple `KEY=value\n` form is enough.
        self.msg.extend_from_slice(line);
        self.msg.push(b'\n');
        if self.sock.send_to(&self.msg, &self.path).is_err() {
            self.dropped += 1;
        }
    }
}
