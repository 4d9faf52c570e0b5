//! JSON Schema checks of tool arguments and results (jsonschema, no remote references).

use serde_json::Value;

/// Most schema errors reported for one value.
pub const MAX_ERRORS: usize = 16;

/// A compiled JSON Schema.
pub struct Schema(jsonschema::Validator);

impl std::fmt::Debug for Schema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Schema")
    }
}

impl Schema {
    /// Compile `schema` (draft from its `$schema`, 2020-12 by default). Remote `$ref`s are
    /// not fetched: they fail here, so a manifest or a server cannot make the daemon reach out.
    pub fn compile(schema: &Value) -> Result<Schema, String> {
        jsonschema::validator_for(schema).map(Schema).map_err(|e| {
            format!(
                "invalid JSON Schema at {}: {}",
                pointer(&e.instance_path().to_string()),
                e.masked()
            )
        })
    }

    /// Every problem of `v`, as `at /path: message`; the offending values are masked so that
    /// a secret in a wrong place never reaches an error message or the audit record.
    pub fn errors(&self, v: &Value) -> Vec<String> {
        self.0
            .iter_errors(v)
            .take(MAX_ERRORS)
            .map(|e| {
                // The path and some messages (unexpected property names) are the agent's text.
                let text = format!(
                    "at {}: {}",
                    pointer(&e.instance_path().to_string()),
                    e.masked()
                );
                clip(text, ERROR_MAX)
            })
            .collect()
    }
}

/// Longest schema error message kept, in bytes (the agent's property names can be any size).
pub const ERROR_MAX: usize = 512;

/// `s` cut to `max` bytes on a character boundary, with its full size said when cut.
fn clip(mut s: String, max: usize) -> String {
    if s.len() <= max {
        return s;
    }
    let len = s.len();
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
    s.push_str(&format!("…({len} bytes)"));
    s
}

fn pointer(p: &str) -> String {
    if p.is_empty() {
        "/".to_string()
    } else {
        p.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn errors_name_the_path_and_hide_values() {
        let s = Schema::compile(&json!({
            "type": "object",
            "properties": {"n": {"type": "integer"}, "s": {"type": "string"}},
            "required": ["s"],
            "additionalProperties": false
        }))
        .unwrap();
        assert!(s.errors(&json!({"s": "x", "n": 3})).is_empty());
        let e = s.errors(&json!({"n": "hunter2", "extra": 1}));
        assert!(e.iter().any(|m| m.starts_with("at /n:")), "{e:?}");
        assert!(e.iter().any(|m| m.contains("\"s\"")), "{e:?}");
        assert!(e.iter().all(|m| !m.contains("hunter2")), "{e:?}");
    }

    #[test]
    fn remote_refs_are_refused() {
        assert!(Schema::compile(&json!({"$ref": "https://example.com/s.json"})).is_err());
        assert!(Schema::compile(&json!({"type": 12})).is_err());
    }
}
