//! Newline framing of the agents' byte streams (MCP stdio framing: one JSON-RPC message per
//! line). Pure: no syscalls, unit-tested.

use std::collections::VecDeque;

use super::Inbound;

/// Splits a byte stream into lines without ever buffering more than `max_line` bytes of one
/// line: a longer line is skipped up to its newline and reported as [`Inbound::TooLong`].
#[derive(Debug)]
pub struct LineSplitter {
    max_line: usize,
    /// The start of a line whose newline has not arrived yet (at most `max_line` bytes).
    partial: Vec<u8>,
    /// `Some(len)`: inside an over-long line, `len` bytes of it seen so far.
    skipping: Option<usize>,
}

impl LineSplitter {
    pub fn new(max_line: usize) -> Self {
        LineSplitter {
            max_line,
            partial: Vec::new(),
            skipping: None,
        }
    }

    /// Bytes held for an unfinished line.
    pub fn buffered(&self) -> usize {
        self.partial.len()
    }

    /// Feed received bytes; complete lines (without their `\n`) are appended to `out`. Empty
    /// lines are dropped (they carry no message).
    pub fn feed(&mut self, mut data: &[u8], out: &mut VecDeque<Inbound>) {
        while !data.is_empty() {
            let nl = data.iter().position(|&b| b == b'\n');
            let (chunk, rest, complete) = match nl {
                Some(i) => (&data[..i], &data[i + 1..], true),
                None => (data, &data[data.len()..], false),
            };
            data = rest;
            if let Some(seen) = self.skipping.as_mut() {
                *seen += chunk.len();
                if complete {
                    out.push_back(Inbound::TooLong { len: *seen });
                    self.skipping = None;
                }
                continue;
            }
            if self.partial.len() + chunk.len() > self.max_line {
                let seen = self.partial.len() + chunk.len();
                self.partial = Vec::new();
                if complete {
                    out.push_back(Inbound::TooLong { len: seen });
                } else {
                    self.skipping = Some(seen);
                }
                continue;
            }
            if complete {
                if self.partial.is_empty() {
                    if !chunk.is_empty() {
                        out.push_back(Inbound::Line(chunk.to_vec()));
                    }
                } else {
                    let mut line = std::mem::take(&mut self.partial);
                    line.extend_from_slice(chunk);
                    out.push_back(Inbound::Line(line));
                }
            } else {
                self.partial.extend_from_slice(chunk);
            }
        }
    }

    /// The stream ended: a last line without its newline is still delivered (lenient, like
    /// most line readers); an over-long one is reported.
    pub fn finish(&mut self, out: &mut VecDeque<Inbound>) {
        if let Some(seen) = self.skipping.take() {
            out.push_back(Inbound::TooLong { len: seen });
        } else if !self.partial.is_empty() {
            out.push_back(Inbound::Line(std::mem::take(&mut self.partial)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(out: &VecDeque<Inbound>) -> Vec<String> {
        out.iter()
            .map(|i| match i {
                Inbound::Line(l) => String::from_utf8_lossy(l).into_owned(),
                Inbound::TooLong { len } => format!("<too long {len}>"),
            })
            .collect()
    }

    #[test]
    fn splits_lines_across_chunks() {
        let mut s = LineSplitter::new(100);
        let mut out = VecDeque::new();
        s.feed(b"{\"a\":1}\n{\"b\"", &mut out);
        assert_eq!(lines(&out), ["{\"a\":1}"]);
        assert_eq!(s.buffered(), 4);
        s.feed(b":2}\n\n{\"c\":3}\n", &mut out);
        assert_eq!(lines(&out), ["{\"a\":1}", "{\"b\":2}", "{\"c\":3}"]);
        assert_eq!(s.buffered(), 0);
    }

    #[test]
    fn line_of_exactly_max_is_kept() {
        let mut s = LineSplitter::new(4);
        let mut out = VecDeque::new();
        s.feed(b"ab", &mut out);
        s.feed(b"cd\n", &mut out);
        assert_eq!(lines(&out), ["abcd"]);
    }

    #[test]
    fn over_long_line_is_skipped_and_reported_then_stream_goes_on() {
        let mut s = LineSplitter::new(4);
        let mut out = VecDeque::new();
        s.feed(b"abc", &mut out);
        s.feed(b"defgh", &mut out);
        assert!(out.is_empty());
        // never buffers beyond the limit
        assert_eq!(s.buffered(), 0);
        s.feed(b"ij\nok\n", &mut out);
        assert_eq!(lines(&out), ["<too long 10>", "ok"]);
    }

    #[test]
    fn over_long_line_in_one_chunk() {
        let mut s = LineSplitter::new(2);
        let mut out = VecDeque::new();
        s.feed(b"abcdef\nxy\n", &mut out);
        assert_eq!(lines(&out), ["<too long 6>", "xy"]);
    }

    #[test]
    fn finish_delivers_unterminated_line() {
        let mut s = LineSplitter::new(10);
        let mut out = VecDeque::new();
        s.feed(b"a\nlast", &mut out);
        s.finish(&mut out);
        assert_eq!(lines(&out), ["a", "last"]);
        let mut s = LineSplitter::new(2);
        let mut out = VecDeque::new();
        s.feed(b"longer", &mut out);
        s.finish(&mut out);
        assert_eq!(lines(&out), ["<too long 6>"]);
    }
}
