//! `cargo xtask fuzz --target jsonrpc`: what the daemon does with one line from an agent before
//! a tool runs (agentosd/src/mcp/mod.rs `session` and `request`, call.rs `call`), on arbitrary
//! bytes: `jsonrpc::parse` classifies it; an invalid message gets an error reply, a request a
//! reply echoing its id, `notifications/cancelled` its map key, a `tools/call` its tool name
//! and arguments, which are redacted and bounded for the audit record. Asserted:
//! - nothing panics;
//! - every reply is one line (no `\n`: it must not split into two messages on the agent's
//!   stream), valid JSON-RPC 2.0 that the daemon's own parser reads back as a response, with the
//!   request's id (null for an unreadable one);
//! - a request's id is a string or an integer, never null, a float, an array or an object;
//! - an audit value is at most `AUDIT_VALUE_MAX` bytes or the omitted-summary form.
#![no_main]

use agentosd::mcp::jsonrpc::{self, Incoming};
use agentosd::mcp::{AUDIT_VALUE_MAX, bounded, call_params};
use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};

fuzz_target!(|line: &[u8]| {
    match jsonrpc::parse(line) {
        Incoming::Invalid { id, code, message } => {
            assert!(
                id.is_null() || id.is_string() || id.is_u64() || id.is_i64(),
                "invalid message answered with id {id}"
            );
            assert!((-32768..=-32000).contains(&code), "code {code}");
            let r = jsonrpc::error(&id, code, &message, Value::Null);
            check_reply(&r, &id);
        }
        Incoming::Response => {}
        Incoming::Notification { method, params } => {
            assert!(params.is_object());
            if method == "notifications/cancelled"
                && let Some(k) = params.get("requestId")
            {
                let _ = jsonrpc::id_key(k);
            }
        }
        Incoming::Request { id, method, params } => {
            assert!(
                id.is_string() || id.is_u64() || id.is_i64(),
                "request id {id}"
            );
            assert!(params.is_object());
            check_reply(&jsonrpc::result(&id, json!({})), &id);
            let msg = format!("method \"{method}\" is not served");
            check_reply(
                &jsonrpc::error(&id, jsonrpc::METHOD_NOT_FOUND, &msg, json!({"m": method})),
                &id,
            );
            let _ = jsonrpc::id_key(&id);
            if method == "tools/call" {
                match call_params(&params) {
                    Ok((name, args)) => {
                        assert!(args.is_object());
                        let red = contracts::tool::redact(&args, &["/key".to_string()]);
                        let b = bounded(red, AUDIT_VALUE_MAX);
                        let text = b.to_string();
                        assert!(
                            text.len() <= AUDIT_VALUE_MAX || b.get("omitted").is_some(),
                            "audit value of {} bytes for tool {name}",
                            text.len()
                        );
                        if text.len() > AUDIT_VALUE_MAX {
                            assert!(text.len() < 512, "the summary itself is large: {text}");
                        }
                    }
                    Err(m) => check_reply(
                        &jsonrpc::error(&id, jsonrpc::INVALID_PARAMS, m, Value::Null),
                        &id,
                    ),
                }
            }
        }
    }
});

fn check_reply(r: &[u8], id: &Value) {
    assert!(
        !r.contains(&b'\n'),
        "a reply with a newline splits the stream"
    );
    assert_eq!(
        jsonrpc::parse(r),
        Incoming::Response,
        "the daemon's reply does not read back as a response: {}",
        String::from_utf8_lossy(r)
    );
    let v: Value = serde_json::from_slice(r).expect("a reply is JSON");
    assert_eq!(v["jsonrpc"], "2.0");
    assert_eq!(&v["id"], id, "the reply's id is not the request's");
}
