//! `cargo xtask fuzz --target tool_args`: the daemon's JSON Schema checks of tool arguments
//! (agentosd/src/tools/schema.rs) and the redaction of arguments for the audit record.
//!
//! The first byte picks the mode:
//! - an example manifest from examples/tools (its input schema, its `secrets`), the rest is the
//!   arguments an agent sends: at most `MAX_ERRORS` errors, each naming a path (`at /…`); a
//!   secret argument's value never appears in an error message; after redaction the value at a
//!   secret pointer is a redaction hash, not the value;
//! - or (first byte 0xff) the rest is `SCHEMA\0VALUE`: an arbitrary schema, as an MCP server's
//!   `inputSchema` can be, compiled and applied to an arbitrary value: never a panic.
#![no_main]

use std::sync::OnceLock;

use agentosd::tools::schema::{MAX_ERRORS, Schema};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

const MANIFESTS: &[(&str, &str)] = &[
    (
        "crypto-hmac.yaml",
        include_str!("../../examples/tools/crypto-hmac.yaml"),
    ),
    (
        "text-wordcount.yaml",
        include_str!("../../examples/tools/text-wordcount.yaml"),
    ),
    (
        "clock-now.yaml",
        include_str!("../../examples/tools/clock-now.yaml"),
    ),
];

struct Example {
    schema: Schema,
    schema_text: String,
    secrets: Vec<String>,
}

fn examples() -> &'static [Example] {
    static E: OnceLock<Vec<Example>> = OnceLock::new();
    E.get_or_init(|| {
        MANIFESTS
            .iter()
            .map(|(name, text)| {
                let m = contracts::tool::parse_tool(text, name).expect("example manifest");
                let s = m.input_schema.expect("example with an input schema");
                Example {
                    schema: Schema::compile(&s).expect("example schema compiles"),
                    schema_text: s.to_string(),
                    secrets: m.secrets,
                }
            })
            .collect()
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode == 0xff {
        let cut = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        let (schema, value) = (&rest[..cut], rest.get(cut + 1..).unwrap_or_default());
        let Ok(schema) = serde_json::from_slice::<Value>(schema) else {
            return;
        };
        let value: Value = serde_json::from_slice(value).unwrap_or(Value::Null);
        if let Ok(s) = Schema::compile(&schema) {
            let errors = s.errors(&value);
            assert!(errors.len() <= MAX_ERRORS);
        }
        return;
    }
    let ex = &examples()[usize::from(mode) % MANIFESTS.len()];
    let Ok(args) = serde_json::from_slice::<Value>(rest) else {
        return;
    };
    let errors = ex.schema.errors(&args);
    assert!(errors.len() <= MAX_ERRORS, "{} errors", errors.len());
    for e in &errors {
        assert!(e.starts_with("at /"), "error without a path: {e}");
    }
    for p in &ex.secrets {
        let Some(secret) = args.pointer(p) else {
            continue;
        };
        if let Some(s) = secret.as_str()
            && s.len() >= 12
            && !ex.schema_text.contains(s)
        {
            assert!(
                errors.iter().all(|e| !e.contains(s)),
                "secret {p} in an error message: {errors:?}"
            );
        }
        let red = contracts::tool::redact(&args, &ex.secrets);
        let kept = red.pointer(p);
        assert!(
            kept.and_then(|v| v.get("redacted")).is_some() && kept != Some(secret),
            "secret {p} not redacted: {kept:?}"
        );
    }
});
