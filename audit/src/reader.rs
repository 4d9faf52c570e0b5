//! Reading records back: `agentctl audit show [--agent] [--since] [-f]`.
//!
//! The reader checks each line's own hash (so an edited line is reported, not shown as if
//! genuine) but not the chain; `verify` does that.

use std::fs::File;
use std::io::{BufRead as _, BufReader, Seek as _, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::record::{self, Kind, StoredRecord};

/// Which records to return.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// Only this agent's records.
    pub agent: Option<String>,
    /// Only records at or after this time (µs since the epoch).
    pub since_us: Option<u64>,
    /// Only records of this kind.
    pub kind: Option<Kind>,
}

impl Filter {
    fn matches(&self, r: &StoredRecord) -> bool {
        self.agent.as_ref().is_none_or(|a| *a == r.agent)
            && self.since_us.is_none_or(|t| r.time_us >= t)
            && self.kind.is_none_or(|k| k == r.kind)
    }
}

/// One record read back.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// Byte offset of its line.
    pub offset: u64,
    /// The record.
    pub record: StoredRecord,
    /// The line as stored, without its newline.
    pub line: String,
}

/// Errors while reading.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The file could not be read.
    #[error("audit log {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A line is not a genuine record (edited or garbage); reading continues after it.
    #[error("audit log {path}: line at byte {offset}: {reason}")]
    BadLine {
        /// The file.
        path: PathBuf,
        /// Its offset.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
}

/// Iterates over the records of a log, optionally following appends like `tail -f`.
#[derive(Debug)]
pub struct Reader {
    path: PathBuf,
    file: BufReader<File>,
    offset: u64,
    filter: Filter,
    follow: Option<Duration>,
    line: Vec<u8>,
}

impl Reader {
    /// Opens a log for reading from its start.
    pub fn open(path: &Path, filter: Filter) -> Result<Reader, ReadError> {
        let file = File::open(path).map_err(|source| ReadError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Reader {
            path: path.to_path_buf(),
            file: BufReader::with_capacity(1 << 20, file),
            offset: 0,
            filter,
            follow: None,
            line: Vec::with_capacity(1024),
        })
    }

    /// At the end of the file, wait for more records (checking every `poll`) instead of
    /// stopping. The iterator then never ends by itself.
    pub fn follow(mut self, poll: Duration) -> Self {
        self.follow = Some(poll);
        self
    }

    /// Byte offset of the next line to read.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    fn io(&self, source: std::io::Error) -> ReadError {
        ReadError::Io {
            path: self.path.clone(),
            source,
        }
    }
}

impl Iterator for Reader {
    type Item = Result<Entry, ReadError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            // `line` may hold the start of a partial line from an earlier call.
            match self.file.read_until(b'\n', &mut self.line) {
                Err(e) => return Some(Err(self.io(e))),
                Ok(_) if self.line.last() != Some(&b'\n') => {
                    // End of file, possibly inside a line being written.
                    let poll = self.follow?;
                    std::thread::sleep(poll);
                    // The writer may have cut a torn tail after a crash: start over at the end.
                    match self.file.get_ref().metadata() {
                        Ok(m) if m.len() < self.offset + self.line.len() as u64 => {
                            self.line.clear();
                            if let Err(e) = self.file.seek(SeekFrom::Start(m.len())) {
                                return Some(Err(self.io(e)));
                            }
                            self.offset = m.len();
                        }
                        Ok(_) => {}
                        Err(e) => return Some(Err(self.io(e))),
                    }
                    continue;
                }
                Ok(_) => {}
            }
            let offset = self.offset;
            self.offset += self.line.len() as u64;
            let text = &self.line[..self.line.len() - 1];
            let parsed = record::parse_line(text);
            let line = String::from_utf8_lossy(text).into_owned();
            self.line.clear();
            match parsed {
                Ok((rec, _)) => {
                    if self.filter.matches(&rec) {
                        return Some(Ok(Entry {
                            offset,
                            record: rec,
                            line,
                        }));
                    }
                }
                Err(e) => {
                    return Some(Err(ReadError::BadLine {
                        path: self.path.clone(),
                        offset,
                        reason: e.to_string(),
                    }));
                }
            }
        }
    }
}
