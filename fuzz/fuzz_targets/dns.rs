//! `cargo xtask fuzz --target dns`: the DNS wire code of the agents' stubs
//! (`agentosd::dns::wire`), which reads bytes an agent sends (queries) and bytes an upstream
//! server sends (answers). Never a panic; a query that parses has a name within DNS's limits
//! (labels ≤ 63 bytes, ≤ 253 characters) of the characters the stub forwards; what the stub
//! sends upstream for it parses back as the same question; the stub's own NXDOMAIN answer to it
//! (with an Extended DNS Error when the query had EDNS) reads back as that answer.
#![no_main]

use agentosd::dns::wire::{parse_answer, parse_query, response, upstream_query};
use libfuzzer_sys::{arbitrary, fuzz_target};

#[derive(Debug, arbitrary::Arbitrary)]
struct Input {
    query: Vec<u8>,
    answer: Vec<u8>,
    id: u16,
}

fuzz_target!(|inp: Input| {
    let Ok(q) = parse_query(&inp.query) else {
        return;
    };
    assert!(q.name.len() <= 253, "name of {} characters", q.name.len());
    for label in q.name.split('.') {
        assert!(label.len() <= 63, "label of {} bytes", label.len());
        assert!(
            label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
            "label {label:?}"
        );
    }
    let up = upstream_query(inp.id, &q);
    let again = parse_query(&up).expect("the stub's upstream query parses");
    assert_eq!(
        (again.name.to_ascii_lowercase(), again.qtype, again.qclass),
        (q.name.to_ascii_lowercase(), q.qtype, q.qclass)
    );
    let nx = response(&q, 3, &[], Some((18, "not in the contract")));
    let a = parse_answer(&nx, q.id, &q).expect("the stub's own answer reads back");
    assert_eq!(a.rcode, 3);
    assert!(a.records.is_empty());
    // Whatever an upstream sends: no panic.
    let _ = parse_answer(&inp.answer, inp.id, &q);
});
