//! `cargo +nightly fuzz run parse`: parse_contract on arbitrary input never panics, and
//! everything it accepts serializes and re-validates.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    match contracts::parse_contract(&text, "fuzz.yaml") {
        Ok(c) => {
            let _ = c.to_canonical_json();
            let _ = c.summary();
            let _ = contracts::bind(&c, &contracts::HostOffer::default());
        }
        Err(e) => {
            assert!(!e.diagnostics.is_empty());
            let _ = e.to_string();
        }
    }
});
