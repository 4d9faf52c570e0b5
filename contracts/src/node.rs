//! A positioned YAML tree: the YAML is read once by serde-saphyr into this tree (every node and
//! every key keeps its line and column), and the typed contract is decoded from it. This keeps
//! exact positions for semantic errors and lets the decoder report every problem, not just the
//! first one.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::{DefaultMessageFormatter, MessageFormatter, Spanned};

use crate::diag::Diagnostic;

/// Largest contract file accepted, in bytes (1 MiB).
pub const MAX_CONTRACT_BYTES: usize = 1 << 20;
/// Deepest nesting of mappings and sequences accepted.
pub const MAX_NESTING_DEPTH: usize = 32;
/// Most YAML nodes accepted in one contract.
pub const MAX_NODES: usize = 20_000;

/// A position: index of the source file (in the decoder's list), 1-based line and column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Pos {
    pub src: usize,
    pub line: usize,
    pub col: usize,
}

#[derive(Debug, Clone)]
pub(crate) enum V {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    Seq(Vec<N>),
    Map(Vec<(Key, N)>),
}

/// A node with its position.
#[derive(Debug, Clone)]
pub(crate) struct N {
    pub v: V,
    pub pos: Pos,
}

/// A mapping key with its position.
#[derive(Debug, Clone)]
pub(crate) struct Key {
    pub name: String,
    pub pos: Pos,
}

impl V {
    /// What the value is, for "expected X, found Y" messages.
    pub fn kind(&self) -> &'static str {
        match self {
            V::Null => "null",
            V::Bool(_) => "a boolean",
            V::Int(_) => "an integer",
            V::Float(_) => "a number",
            V::Str(_) => "a string",
            V::Seq(_) => "a list",
            V::Map(_) => "a mapping",
        }
    }
}

impl N {
    #[cfg(test)]
    pub fn get(&self, key: &str) -> Option<&N> {
        match &self.v {
            V::Map(m) => m.iter().find(|(k, _)| k.name == key).map(|(_, v)| v),
            _ => None,
        }
    }
}

// ---- reading YAML through serde-saphyr ----

/// What serde-saphyr hands us: any YAML value, with `Spanned` children.
enum Raw {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    Seq(Vec<Spanned<Raw>>),
    Map(Vec<(Spanned<Raw>, Spanned<Raw>)>),
}

impl<'de> Deserialize<'de> for Raw {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct RawVisitor;
        impl<'de> Visitor<'de> for RawVisitor {
            type Value = Raw;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any YAML value")
            }
            fn visit_unit<E: de::Error>(self) -> Result<Raw, E> {
                Ok(Raw::Null)
            }
            fn visit_none<E: de::Error>(self) -> Result<Raw, E> {
                Ok(Raw::Null)
            }
            fn visit_some<D2: Deserializer<'de>>(self, d: D2) -> Result<Raw, D2::Error> {
                Raw::deserialize(d)
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Raw, E> {
                Ok(Raw::Bool(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Raw, E> {
                Ok(Raw::Int(i128::from(v)))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Raw, E> {
                Ok(Raw::Int(i128::from(v)))
            }
            fn visit_i128<E: de::Error>(self, v: i128) -> Result<Raw, E> {
                Ok(Raw::Int(v))
            }
            fn visit_u128<E: de::Error>(self, v: u128) -> Result<Raw, E> {
                Ok(i128::try_from(v).map_or(Raw::Float(v as f64), Raw::Int))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Raw, E> {
                Ok(Raw::Float(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Raw, E> {
                Ok(Raw::Str(v.to_string()))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Raw, E> {
                Ok(Raw::Str(v))
            }
            fn visit_bytes<E: de::Error>(self, _v: &[u8]) -> Result<Raw, E> {
                Err(E::custom("binary values are not supported in contracts"))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Raw, A::Error> {
                let mut v = Vec::new();
                while let Some(x) = s.next_element::<Spanned<Raw>>()? {
                    v.push(x);
                }
                Ok(Raw::Seq(v))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Raw, A::Error> {
                let mut v = Vec::new();
                while let Some(k) = m.next_key::<Spanned<Raw>>()? {
                    let val = m.next_value::<Spanned<Raw>>()?;
                    v.push((k, val));
                }
                Ok(Raw::Map(v))
            }
        }
        d.deserialize_any(RawVisitor)
    }
}

fn pos_of(src: usize, l: &serde_saphyr::Location) -> Pos {
    Pos {
        src,
        line: usize::try_from(l.line()).unwrap_or(usize::MAX).max(1),
        col: usize::try_from(l.column()).unwrap_or(usize::MAX).max(1),
    }
}

fn convert(src: usize, s: Spanned<Raw>, errs: &mut Vec<(Pos, String)>) -> N {
    let pos = pos_of(src, &s.referenced);
    let v = match s.value {
        Raw::Null => V::Null,
        Raw::Bool(b) => V::Bool(b),
        Raw::Int(i) => V::Int(i),
        Raw::Float(f) => V::Float(f),
        Raw::Str(s) => V::Str(s),
        Raw::Seq(items) => V::Seq(items.into_iter().map(|x| convert(src, x, errs)).collect()),
        Raw::Map(entries) => {
            let mut out = Vec::with_capacity(entries.len());
            for (k, v) in entries {
                let kpos = pos_of(src, &k.referenced);
                let name = match k.value {
                    Raw::Str(s) => s,
                    Raw::Int(i) => i.to_string(),
                    Raw::Bool(b) => b.to_string(),
                    Raw::Null => {
                        errs.push((kpos, "a mapping key is empty (null)".to_string()));
                        continue;
                    }
                    other => {
                        let kind = convert(src, Spanned::new(other, k.referenced, k.defined), errs);
                        errs.push((
                            kpos,
                            format!("mapping keys must be names, found {}", kind.v.kind()),
                        ));
                        continue;
                    }
                };
                out.push((Key { name, pos: kpos }, convert(src, v, errs)));
            }
            V::Map(out)
        }
    };
    N { v, pos }
}

/// The parser options: bounded depth, nodes and aliases; YAML 1.2 booleans only (`yes`/`no`
/// stay strings); duplicate keys are errors.
fn options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        budget: serde_saphyr::budget! {
            max_depth: MAX_NESTING_DEPTH,
            max_nodes: MAX_NODES,
            max_events: 4 * MAX_NODES,
            max_aliases: 1_000,
            max_anchors: 1_000,
            max_documents: 1,
            max_total_scalar_bytes: MAX_CONTRACT_BYTES,
        },
        strict_booleans: true,
        reject_unsupported_tags: true,
        with_snippet: false,
        duplicate_keys: serde_saphyr::DuplicateKeyPolicy::Error,
    }
}

fn budget_message(b: &serde_saphyr::budget::BudgetBreach) -> String {
    use serde_saphyr::budget::BudgetBreach as B;
    match b {
        B::Depth { .. } => format!("nesting is deeper than {MAX_NESTING_DEPTH} levels"),
        B::Nodes { .. } | B::Events { .. } => {
            format!("more than {MAX_NODES} YAML nodes (aliases count as copies)")
        }
        B::Aliases { .. } | B::Anchors { .. } => "too many anchors or aliases".to_string(),
        B::Documents { .. } => "a contract file holds exactly one YAML document".to_string(),
        other => format!("input exceeds a parser limit ({other:?})"),
    }
}

fn clean_message(m: &str) -> String {
    m.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// Line and column (1-based, in characters) of a byte offset.
pub(crate) fn line_col(text: &str, byte: usize) -> (usize, usize) {
    let byte = byte.min(text.len());
    let before = text.get(..byte).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, col)
}

/// Read `text` into a positioned tree. `src` is the index of `origin` in the decoder's files.
pub(crate) fn read_tree(text: &str, origin: &str, src: usize) -> Result<N, Vec<Diagnostic>> {
    if text.len() > MAX_CONTRACT_BYTES {
        return Err(vec![Diagnostic::error(
            origin,
            1,
            1,
            format!(
                "contract is {} bytes; the limit is {MAX_CONTRACT_BYTES} bytes (1 MiB)",
                text.len()
            ),
        )]);
    }
    if let Some(b) = text.find('\0') {
        let (l, c) = line_col(text, b);
        return Err(vec![Diagnostic::error(
            origin,
            l,
            c,
            "contract contains a NUL character",
        )]);
    }
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let parsed: Result<Spanned<Raw>, serde_saphyr::Error> =
        serde_saphyr::from_str_with_options(text, options());
    match parsed {
        Ok(root) => {
            let mut errs = Vec::new();
            let n = convert(src, root, &mut errs);
            if errs.is_empty() {
                Ok(n)
            } else {
                Err(errs
                    .into_iter()
                    .map(|(p, m)| Diagnostic::error(origin, p.line, p.col, m))
                    .collect())
            }
        }
        Err(e) => {
            let inner = match e.without_snippet() {
                serde_saphyr::Error::AliasError { error, .. } => error.without_snippet(),
                other => other,
            };
            let (line, col) = e
                .location()
                .or_else(|| inner.location())
                .filter(|l| l.line() > 0)
                .map_or((1, 1), |l| {
                    let p = pos_of(src, &l);
                    (p.line, p.col)
                });
            let msg = match inner {
                serde_saphyr::Error::DuplicateMappingKey { key: Some(k), .. } => {
                    format!(
                        "duplicate key \"{}\": each field may appear once",
                        clean_message(k)
                    )
                }
                serde_saphyr::Error::DuplicateMappingKey { key: None, .. } => {
                    "duplicate key: each field may appear once".to_string()
                }
                serde_saphyr::Error::Budget { breach, .. } => budget_message(breach),
                other => {
                    let m = clean_message(&DefaultMessageFormatter.format_message(other));
                    if m.contains("recursion limit exceeded") {
                        format!("nesting is deeper than {MAX_NESTING_DEPTH} levels")
                    } else {
                        m
                    }
                }
            };
            Err(vec![Diagnostic::error(
                origin,
                line,
                col,
                format!("invalid YAML: {msg}"),
            )])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_of_keys_and_values() {
        let n = read_tree("a: 1\nb:\n  - x\n  - {c: d}\n", "t", 0).unwrap();
        let V::Map(m) = &n.v else { panic!("map") };
        assert_eq!((m[0].0.pos.line, m[0].0.pos.col), (1, 1));
        assert_eq!((m[0].1.pos.line, m[0].1.pos.col), (1, 4));
        let b = n.get("b").unwrap();
        let V::Seq(items) = &b.v else { panic!("seq") };
        assert_eq!((items[1].pos.line, items[1].pos.col), (4, 5));
        assert_eq!(items[1].get("c").map(|n| n.pos.col), Some(9));
    }

    #[test]
    fn yes_is_a_string() {
        let n = read_tree("a: yes\nb: true\n", "t", 0).unwrap();
        assert!(matches!(n.get("a").unwrap().v, V::Str(_)));
        assert!(matches!(n.get("b").unwrap().v, V::Bool(true)));
    }

    #[test]
    fn line_col_counts_chars() {
        assert_eq!(line_col("ab\ncdé f", 8), (2, 5));
        assert_eq!(line_col("", 0), (1, 1));
    }
}
