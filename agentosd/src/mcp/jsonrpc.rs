//! JSON-RPC 2.0 as MCP frames it on stdio: one message per line, no batches. Pure: parsing an
//! incoming line and building replies, unit-tested without a socket.

use serde_json::{Map, Value, json};

/// JSON-RPC's own error codes.
pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
pub const METHOD_NOT_FOUND: i64 = -32601;
pub const INVALID_PARAMS: i64 = -32602;
pub const INTERNAL_ERROR: i64 = -32603;
/// Implementation-defined server errors (-32000 to -32099), documented in docs/tools.md.
/// The contract does not grant the tool's capability (or denies it outright).
pub const FORBIDDEN: i64 = -32001;
/// The call needed operator consent, which was refused or not given in time.
pub const CONSENT_REFUSED: i64 = -32002;
/// The connection already has the most calls in flight it may have.
pub const TOO_MANY_CALLS: i64 = -32003;
/// The request was cancelled (`notifications/cancelled`) before it finished.
pub const CANCELLED: i64 = -32004;
/// The daemon cannot serve the call right now (audit trail down, agent gone).
pub const UNAVAILABLE: i64 = -32005;
/// The server was asked for something before `initialize`.
pub const NOT_INITIALIZED: i64 = -32006;

/// A request id: a string or an integer (JSON-RPC allows both; MCP forbids null).
pub type Id = Value;

/// Longest string id accepted, in bytes. Every reply echoes its request's id, so a longer one
/// would let an agent make the daemon build and queue replies as large as its requests; no
/// client needs more than a UUID or a counter.
pub const ID_MAX: usize = 256;

/// Most bytes of an agent's own text (a method or tool name, an id) quoted back in an error
/// message or a log line; the rest is cut and its size said (issue 15: an error must not echo
/// a request of a megabyte).
pub const QUOTE_MAX: usize = 96;

/// `s` cut to at most [`QUOTE_MAX`] bytes (on a character boundary) with `…(N bytes)` after
/// it when it was longer; `s` itself otherwise.
pub fn clip(s: &str) -> std::borrow::Cow<'_, str> {
    if s.len() <= QUOTE_MAX {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut end = QUOTE_MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    std::borrow::Cow::Owned(format!("{}…({} bytes)", &s[..end], s.len()))
}

/// `s` ready to quote in an error message or a log line: [`clip`]ped, then escaped like a Rust
/// string literal's content (quotes, backslashes, control characters).
pub fn quote(s: &str) -> String {
    clip(s).escape_debug().to_string()
}

/// One incoming line, decoded.
#[derive(Debug, Clone, PartialEq)]
pub enum Incoming {
    /// A call that wants an answer.
    Request {
        id: Id,
        method: String,
        params: Value,
    },
    /// A message without an id: no answer.
    Notification { method: String, params: Value },
    /// A response from the client (we send no requests, so these are ignored).
    Response,
    /// Something to answer with an error and otherwise ignore.
    Invalid { id: Id, code: i64, message: String },
}

/// Decode one line (without its newline).
pub fn parse(line: &[u8]) -> Incoming {
    let v: Value = match serde_json::from_slice(line) {
        Ok(v) => v,
        Err(e) => {
            return Incoming::Invalid {
                id: Value::Null,
                code: PARSE_ERROR,
                message: format!("parse error: {e} (each line must be one JSON-RPC 2.0 message)"),
            };
        }
    };
    let Value::Object(mut m) = v else {
        let message = if v.is_array() {
            "batches are not supported (MCP 2025-06-18 removed JSON-RPC batching): send one message per line"
        } else {
            "a JSON-RPC message must be an object"
        };
        return Incoming::Invalid {
            id: Value::Null,
            code: INVALID_REQUEST,
            message: message.into(),
        };
    };
    let id = m.remove("id");
    let invalid = |id: Option<Value>, message: String| Incoming::Invalid {
        id: id.filter(valid_id).unwrap_or(Value::Null),
        code: INVALID_REQUEST,
        message,
    };
    if m.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return invalid(id, "\"jsonrpc\" must be \"2.0\"".into());
    }
    let method = match m.remove("method") {
        None if m.contains_key("result") || m.contains_key("error") => return Incoming::Response,
        None => return invalid(id, "missing \"method\"".into()),
        Some(Value::String(s)) => s,
        Some(_) => return invalid(id, "\"method\" must be a string".into()),
    };
    let params = match m.remove("params") {
        None => Value::Object(Map::new()),
        Some(p @ Value::Object(_)) => p,
        Some(_) => return invalid(id, "\"params\" must be an object".into()),
    };
    if let Some(Value::String(s)) = &id
        && s.len() > ID_MAX
    {
        return invalid(
            None,
            format!(
                "\"id\" is a string of {} bytes; at most {ID_MAX} are accepted (it is echoed in the reply)",
                s.len()
            ),
        );
    }
    match id {
        None => Incoming::Notification { method, params },
        Some(id) if valid_id(&id) => Incoming::Request { id, method, params },
        Some(_) => invalid(None, "\"id\" must be a string or an integer".into()),
    }
}

fn valid_id(id: &Value) -> bool {
    id.is_string() || id.is_i64() || id.is_u64()
}

/// A success reply.
pub fn result(id: &Id, result: Value) -> Vec<u8> {
    line(json!({"jsonrpc": "2.0", "id": id, "result": result}))
}

/// An error reply; `data` is left out when null.
pub fn error(id: &Id, code: i64, message: &str, data: Value) -> Vec<u8> {
    let mut e = json!({"code": code, "message": message});
    if !data.is_null() {
        e["data"] = data;
    }
    line(json!({"jsonrpc": "2.0", "id": id, "error": e}))
}

fn line(v: Value) -> Vec<u8> {
    // Serialising a Value cannot fail.
    serde_json::to_vec(&v).unwrap_or_default()
}

/// The id a request's params refer to in `notifications/cancelled`, as a map key.
pub fn id_key(id: &Id) -> String {
    id.to_string()
}

/// An id for an error message or a log line: bounded like [`quote`] (a cancelled request's id
/// comes from the agent and is not bounded by [`ID_MAX`]).
pub fn id_text(id: &Id) -> String {
    quote(&id_key(id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_notifications_and_responses() {
        assert_eq!(
            parse(br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#),
            Incoming::Request {
                id: json!(1),
                method: "ping".into(),
                params: json!({})
            }
        );
        assert_eq!(
            parse(br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"a"}}"#),
            Incoming::Notification {
                method: "notifications/cancelled".into(),
                params: json!({"requestId": "a"})
            }
        );
        assert_eq!(
            parse(br#"{"jsonrpc":"2.0","id":"x","result":{}}"#),
            Incoming::Response
        );
    }

    #[test]
    fn malformed_lines_get_the_right_code() {
        let code = |l: &[u8]| match parse(l) {
            Incoming::Invalid { code, .. } => code,
            other => panic!("{other:?}"),
        };
        assert_eq!(code(b"{not json"), PARSE_ERROR);
        assert_eq!(code(b"[]"), INVALID_REQUEST);
        assert_eq!(code(b"42"), INVALID_REQUEST);
        assert_eq!(code(br#"{"id":1,"method":"ping"}"#), INVALID_REQUEST);
        assert_eq!(
            code(br#"{"jsonrpc":"2.0","id":1,"method":7}"#),
            INVALID_REQUEST
        );
        assert_eq!(
            code(br#"{"jsonrpc":"2.0","id":1,"method":"x","params":[1]}"#),
            INVALID_REQUEST
        );
        assert_eq!(
            code(br#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#),
            INVALID_REQUEST
        );
        // The id of an invalid request is echoed when it is usable.
        match parse(br#"{"jsonrpc":"1.0","id":"k","method":"ping"}"#) {
            Incoming::Invalid { id, .. } => assert_eq!(id, json!("k")),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn agent_text_in_errors_is_bounded_and_escaped() {
        assert_eq!(quote("tools/list"), "tools/list");
        assert_eq!(quote("a\"b\n"), "a\\\"b\\n");
        let long = "x".repeat(1 << 20);
        let q = quote(&long);
        assert!(q.len() < QUOTE_MAX + 32, "{}", q.len());
        assert!(q.ends_with("…(1048576 bytes)"), "{q}");
        // Cut on a character boundary: 95 ASCII bytes then a 2-byte character.
        let mixed = format!("{}é{}", "a".repeat(QUOTE_MAX - 1), "b".repeat(10));
        assert!(quote(&mixed).starts_with(&"a".repeat(QUOTE_MAX - 1)));
        assert!(quote(&mixed).contains("…(107 bytes)"), "{}", quote(&mixed));
        assert!(id_text(&json!("y".repeat(5000))).len() < QUOTE_MAX + 32);
    }

    #[test]
    fn a_long_string_id_is_refused_without_echoing_it() {
        let ok = format!(
            r#"{{"jsonrpc":"2.0","id":"{}","method":"ping"}}"#,
            "i".repeat(ID_MAX)
        );
        assert!(matches!(parse(ok.as_bytes()), Incoming::Request { .. }));
        let long = format!(
            r#"{{"jsonrpc":"2.0","id":"{}","method":"ping"}}"#,
            "i".repeat(ID_MAX + 1)
        );
        match parse(long.as_bytes()) {
            Incoming::Invalid { id, code, message } => {
                assert_eq!(id, Value::Null);
                assert_eq!(code, INVALID_REQUEST);
                assert!(message.contains("257 bytes"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn replies_are_single_lines() {
        let r = result(&json!(3), json!({"a": "b\nc"}));
        assert!(!r.contains(&b'\n'));
        let v: Value = serde_json::from_slice(&r).unwrap();
        assert_eq!(v["id"], 3);
        let e = error(&json!("q"), FORBIDDEN, "no", Value::Null);
        let v: Value = serde_json::from_slice(&e).unwrap();
        assert_eq!(v["error"]["code"], FORBIDDEN);
        assert!(v["error"].get("data").is_none());
    }
}
