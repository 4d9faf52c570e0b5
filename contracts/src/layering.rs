//! Layering (paper 4.4, "normalize request"): a contract is the merge of up to four layers,
//! highest precedence first: request override → role template → tenant policy → platform
//! defaults.
//!
//! Merge rule: mappings merge key by key (recursively); any other value (scalar, list) from a
//! higher layer replaces the lower one — except `security.consent_for` and `security.deny`,
//! which are unions, so a request can never drop a consent or deny rule a tenant imposes.
//! Each layer is normalized first (`agent` → `name`, `latency_class` → `class.latency`), and
//! every diagnostic names the file of the layer that supplied the offending value.

use serde::Serialize;

use crate::decode::{Dec, join};
use crate::diag::ContractError;
use crate::model::Contract;
use crate::node::{N, V, read_tree};

/// Where a layer comes from, highest precedence first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LayerKind {
    Request,
    Role,
    Tenant,
    Platform,
}

/// One layer's YAML text and the name used in diagnostics.
#[derive(Debug, Clone, Copy)]
pub struct LayerSource<'a> {
    pub kind: LayerKind,
    pub origin: &'a str,
    pub text: &'a str,
}

const UNION_LISTS: &[&str] = &["security.consent_for", "security.deny"];

fn same_scalar(a: &N, b: &N) -> bool {
    match (&a.v, &b.v) {
        (V::Str(x), V::Str(y)) => x == y,
        (V::Int(x), V::Int(y)) => x == y,
        (V::Bool(x), V::Bool(y)) => x == y,
        _ => false,
    }
}

/// Merge `over` (higher precedence) onto `base`.
fn merge(base: N, over: N, path: &str) -> N {
    match (base.v, over.v) {
        (V::Map(mut b), V::Map(o)) => {
            for (k, v) in o {
                let p = join(path, &k.name);
                match b.iter().position(|(bk, _)| bk.name == k.name) {
                    Some(i) => {
                        let (bk, bv) = b.remove(i);
                        let _ = bk;
                        b.insert(i, (k, merge(bv, v, &p)));
                    }
                    None => b.push((k, v)),
                }
            }
            N {
                v: V::Map(b),
                pos: over.pos,
            }
        }
        (V::Seq(mut b), V::Seq(o)) if UNION_LISTS.contains(&path) => {
            for item in o {
                if !b.iter().any(|x| same_scalar(x, &item)) {
                    b.push(item);
                }
            }
            N {
                v: V::Seq(b),
                pos: over.pos,
            }
        }
        (_, ov) => N {
            v: ov,
            pos: over.pos,
        },
    }
}

/// Merge the layers (any order; they are sorted by precedence) and decode and validate the
/// result as one contract.
pub fn parse_layered(layers: &[LayerSource<'_>]) -> Result<Contract, ContractError> {
    let mut sorted: Vec<&LayerSource> = layers.iter().collect();
    // lowest precedence first, so each later layer overrides
    sorted.sort_by_key(|l| std::cmp::Reverse(l.kind));
    let files: Vec<String> = sorted.iter().map(|l| l.origin.to_string()).collect();
    let mut dec = Dec::new(&files);
    let mut merged: Option<N> = None;
    for (i, l) in sorted.iter().enumerate() {
        match read_tree(l.text, l.origin, i) {
            Ok(mut n) => {
                if !matches!(n.v, V::Map(_) | V::Null) {
                    dec.fields(&n, "", &[]);
                    continue;
                }
                if matches!(n.v, V::Null) {
                    n.v = V::Map(Vec::new());
                }
                crate::decode::normalize(&mut n, &mut dec);
                merged = Some(match merged {
                    None => n,
                    Some(b) => merge(b, n, ""),
                });
            }
            Err(d) => dec.diags.extend(d),
        }
    }
    let root = merged.unwrap_or(N {
        v: V::Map(Vec::new()),
        pos: crate::node::Pos {
            src: 0,
            line: 1,
            col: 1,
        },
    });
    crate::finish(root, dec)
}
