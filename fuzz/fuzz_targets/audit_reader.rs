//! `cargo xtask fuzz --target audit_reader`: the audit log reader (`audit::Reader`, behind
//! `agentctl audit show`) and verifier (`audit::verify_with_head`, behind `agentctl audit
//! verify`) on arbitrary bytes as a log file, and `Head::read` on arbitrary bytes as a head
//! file. Nothing panics (error messages included); the reader stops at the end; a log the
//! verifier accepts is one the reader reads back record for record, with the last record's hash
//! the verifier reports.
//!
//! Input: the log's bytes; an input starting with `H` is `H` HEAD `\0` LOG, the head file first.
#![no_main]

mod common;

use audit::checkpoint::Head;
use audit::{Filter, Reader};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let dir = common::scratch();
    let log = dir.join("audit.log");
    let head_file = dir.join("audit.head");
    let (head_bytes, log_bytes) = match data.strip_prefix(b"H") {
        Some(rest) => {
            let cut = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
            (Some(&rest[..cut]), rest.get(cut + 1..).unwrap_or_default())
        }
        None => (None, data),
    };
    std::fs::write(&log, log_bytes).expect("write the log");
    let head = match head_bytes {
        Some(h) => {
            std::fs::write(&head_file, h).expect("write the head");
            match Head::read(&head_file) {
                Ok(h) => h,
                Err(e) => {
                    let _ = e.to_string();
                    None
                }
            }
        }
        None => None,
    };

    let mut read = Vec::new();
    let mut lines = 0usize;
    for item in Reader::open(&log, Filter::default()).expect("open the log") {
        lines += 1;
        assert!(lines <= log_bytes.len() + 1, "the reader does not stop");
        match item {
            Ok(e) => {
                assert!(
                    log_bytes[e.offset as usize..].starts_with(e.line.as_bytes()),
                    "an entry's line is not what the file holds at its offset"
                );
                read.push(e.record);
            }
            Err(e) => {
                let _ = e.to_string();
            }
        }
    }

    let vk = common::key().verifying_key();
    match audit::verify_with_head(&log, &vk, head.as_ref()) {
        Ok(report) => {
            let n = report.records as usize;
            assert!(
                read.len() >= n,
                "verified {n} records, the reader read {}",
                read.len()
            );
            assert_eq!(report.last_seq, report.records);
            if n > 0 {
                assert_eq!(read[n - 1].hash, report.last_hash);
                for (i, r) in read[..n].iter().enumerate() {
                    assert_eq!(r.seq, i as u64 + 1, "verified a log whose seqs are not 1..");
                }
            }
        }
        Err(e) => {
            let _ = e.to_string();
            let _ = e.seq();
        }
    }
});
