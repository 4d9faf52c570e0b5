//! `cargo xtask fuzz --target ipc_lines`: the daemon's line framing of an agent's byte stream
//! (`agentosd::ipc::LineSplitter`), fed in arbitrary chunkings with an arbitrary limit. It must
//! deliver exactly what a plain split of the whole stream at `\n` gives: every line within the
//! limit byte for byte, every longer one as `TooLong` with its true length (never delivered,
//! never buffered beyond the limit), empty lines dropped, nothing lost or invented; and the
//! chunking must not matter.
#![no_main]

use std::collections::VecDeque;

use agentosd::ipc::{Inbound, LineSplitter};
use libfuzzer_sys::{arbitrary, fuzz_target};

#[derive(Debug, arbitrary::Arbitrary)]
struct Input {
    max_line: u16,
    /// Sizes of the successive reads (cycled; 0 means 1).
    cuts: Vec<u8>,
    /// Deliver the unterminated last line with `finish` (end of stream).
    finish: bool,
    stream: Vec<u8>,
}

fuzz_target!(|inp: Input| {
    let max = usize::from(inp.max_line % 2048);
    let mut s = LineSplitter::new(max);
    let mut out = VecDeque::new();
    let mut rest = inp.stream.as_slice();
    let mut i = 0;
    while !rest.is_empty() {
        let n = inp
            .cuts
            .get(i % inp.cuts.len().max(1))
            .map_or(rest.len(), |&c| usize::from(c.max(1)));
        let (chunk, tail) = rest.split_at(n.min(rest.len()));
        s.feed(chunk, &mut out);
        assert!(
            s.buffered() <= max,
            "buffered {} > limit {max}",
            s.buffered()
        );
        rest = tail;
        i += 1;
    }
    if inp.finish {
        s.finish(&mut out);
        assert_eq!(s.buffered(), 0, "finish left bytes buffered");
    }
    let got: Vec<Inbound> = out.into_iter().collect();
    let want = reference(&inp.stream, max, inp.finish);
    assert_eq!(got, want, "limit {max}, cuts {:?}", inp.cuts);
});

/// The plain split of the whole stream.
fn reference(stream: &[u8], max: usize, finish: bool) -> Vec<Inbound> {
    let mut parts: Vec<&[u8]> = stream.split(|&b| b == b'\n').collect();
    // The part after the last newline is unterminated: only `finish` delivers it.
    let last = parts.pop().unwrap_or_default();
    if finish && !last.is_empty() {
        parts.push(last);
    }
    parts
        .into_iter()
        .filter(|p| !p.is_empty())
        .map(|p| {
            if p.len() > max {
                Inbound::TooLong { len: p.len() }
            } else {
                Inbound::Line(p.to_vec())
            }
        })
        .collect()
}
