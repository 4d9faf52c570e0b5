//! Canonical JSON (sorted keys, no whitespace) and SHA-256, for hashes that do not depend on
//! field order or serde_json features.

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

fn write_canonical(v: &Value, out: &mut String) {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                if let Some(x) = m.get(k) {
                    write_canonical(x, out);
                }
            }
            out.push('}');
        }
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(x, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// Serialize to canonical JSON: object keys sorted, no insignificant whitespace.
pub fn to_canonical_json<T: Serialize + ?Sized>(value: &T) -> String {
    let v = serde_json::to_value(value).unwrap_or(Value::Null);
    let mut out = String::new();
    write_canonical(&v, &mut out);
    out
}

/// SHA-256 of `bytes` in lower-case hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorted_and_compact() {
        let v = serde_json::json!({"b": 1, "a": {"d": [1, "x"], "c": null}});
        assert_eq!(
            to_canonical_json(&v),
            r#"{"a":{"c":null,"d":[1,"x"]},"b":1}"#
        );
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
