//! `cargo xtask fuzz --target contract`: the contract parser and the tool-manifest parser on
//! arbitrary text never panic; a rejected document always says why (at least one diagnostic,
//! each with a message); an accepted contract serializes, summarizes and binds, and an accepted
//! manifest's own schema positions can be named.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    match contracts::parse_contract(&text, "fuzz.yaml") {
        Ok(c) => {
            let json = c.to_canonical_json();
            assert!(
                !json.is_empty(),
                "an accepted contract has a canonical form"
            );
            let _ = c.summary();
            let _ = contracts::bind(&c, &contracts::HostOffer::default());
        }
        Err(e) => rejected(&e),
    }
    match contracts::tool::parse_tool(&text, "fuzz-tool.yaml") {
        Ok(m) => {
            assert!(!m.name.is_empty(), "an accepted manifest names its tool");
            let _ = m.program();
            let _ = m.schema_position(false);
            let _ = m.schema_position(true);
        }
        Err(e) => rejected(&e),
    }
});

fn rejected(e: &contracts::ContractError) {
    assert!(
        !e.diagnostics.is_empty(),
        "a rejection without a diagnostic"
    );
    assert!(
        e.diagnostics.iter().all(|d| !d.message.is_empty()),
        "a diagnostic without a message: {e}"
    );
    let _ = e.to_string();
}
