//! `cargo xtask fuzz --target sniff`: what the SNI/Host proxy reads from an agent's connection
//! before it lets it through (`agentosd::dns::sniff`): the `server_name` of a TLS ClientHello and
//! the `Host` of an HTTP/1 request head, on arbitrary bytes. Asserted:
//! - nothing panics;
//! - a name read is one a grant could match: not empty, at most 253 bytes, lower case, no
//!   control characters, spaces or path characters;
//! - cutting the bytes anywhere never turns an accepted input into a refusal: every prefix of an
//!   input that yields a name yields `Ok(None)` (more bytes needed) or the same name, so an agent
//!   that splits its first bytes (1-byte writes, many TLS records) gets the same answer, and the
//!   proxy never decides on a prefix what the whole would decide otherwise;
//! - the head's lengths lie within the bytes read.
#![no_main]

use agentosd::dns::sniff::{client_hello_sni, request_head};
use libfuzzer_sys::fuzz_target;

fn name_ok(n: &str) {
    assert!(!n.is_empty() && n.len() <= 253, "name of {} bytes", n.len());
    assert!(
        n.bytes()
            .all(|b| b.is_ascii_graphic() && !b.is_ascii_uppercase() && !b"/\\@".contains(&b)),
        "name {n:?}"
    );
}

/// The cut points tried: all of them for short inputs, else 64 spread over the input.
fn cuts(len: usize) -> Vec<usize> {
    if len <= 300 {
        (0..len).collect()
    } else {
        (0..64).map(|i| i * len / 64).collect()
    }
}

fuzz_target!(|data: &[u8]| {
    if let Ok(Some(name)) = client_hello_sni(data) {
        name_ok(&name);
        for c in cuts(data.len()) {
            match client_hello_sni(&data[..c]) {
                Ok(None) => {}
                Ok(Some(n)) => assert_eq!(n, name, "a prefix of {c} bytes read another name"),
                Err(e) => panic!(
                    "a prefix of {c} bytes was refused ({e:?}) though the whole reads {name:?}"
                ),
            }
        }
    }
    if let Ok(Some(head)) = request_head(data) {
        // An address literal is kept as written (it matches no grant); a name is checked.
        if !head.host.starts_with('[') && head.host.parse::<std::net::Ipv4Addr>().is_err() {
            name_ok(&head.host);
        }
        assert!(head.line_len < head.head_len && head.head_len <= data.len());
        for c in cuts(data.len()) {
            match request_head(&data[..c]) {
                Ok(None) => {}
                Ok(Some(h)) => {
                    assert_eq!(h.host, head.host, "a prefix of {c} bytes read another Host")
                }
                Err(e) => panic!(
                    "a prefix of {c} bytes was refused ({e:?}) though the whole reads {:?}",
                    head.host
                ),
            }
        }
    }
});
