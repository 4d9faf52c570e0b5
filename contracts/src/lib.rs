//! Agent Contracts — the ABI between an agent and agentos (paper 3.4, 4.4).
//!
//! - [`parse_contract`] / [`load_contract`]: YAML → typed, validated [`Contract`], with every
//!   problem reported as `FILE:LINE:COL: message` ([`ContractError`]).
//! - [`parse_layered`]: request → role → tenant → platform layers merged into one contract.
//! - [`bind`] / [`bind_admitted`]: contract + [`HostOffer`] → sealed [`BindingManifest`] or a
//!   [`BindingRejection`] listing every failed `must`.
//! - [`AdmissionSet`]: HRT deadline reservations per CPU and the admission test.
//!
//! No syscalls: everything here is pure and unit-tested. See `docs/contracts.md`.

pub mod admission;
pub mod binding;
pub mod canonical;
pub mod capability;
mod decode;
mod diag;
pub mod layering;
mod model;
pub mod netscope;
mod node;
pub mod tool;
pub mod units;
mod validate;

use std::io::Read;
use std::path::Path;

pub use admission::{AdmissionConfig, AdmissionError, AdmissionSet, AdmissionTest, Reservation};
pub use binding::{
    BindingManifest, BindingRejection, Decision, Failure, HostOffer, VersionRange, bind,
    bind_admitted, required_mechanisms,
};
pub use capability::{CapabilityInfo, CapabilityKind, REGISTRY as CAPABILITIES};
pub use decode::{LOG_FIELDS, MECHANISMS, TRACING, is_valid_agent_name};
pub use diag::{ContractError, Diagnostic, Severity};
pub use layering::{LayerKind, LayerSource, parse_layered};
pub use model::*;
pub use node::{MAX_CONTRACT_BYTES, MAX_NESTING_DEPTH, MAX_NODES};
pub use validate::MIN_RUNTIME_NS;

use decode::Dec;
use node::{N, V};

/// Decode, validate and package the diagnostics of a normalized tree.
pub(crate) fn finish(root: N, mut dec: Dec<'_>) -> Result<Contract, ContractError> {
    let mut contract = if dec.has_errors() && !matches!(root.v, V::Map(_)) {
        None
    } else {
        decode::decode(&root, &mut dec)
    };
    if let Some(c) = contract.as_mut()
        && !dec.has_errors()
    {
        validate::check(c, &mut dec, root.pos);
    }
    let mut diags = std::mem::take(&mut dec.diags);
    diags.sort_by(|a, b| {
        (&a.file, a.line, a.column, a.severity).cmp(&(&b.file, b.line, b.column, b.severity))
    });
    diags.dedup();
    match contract {
        Some(mut c) if !diags.iter().any(Diagnostic::is_error) => {
            c.warnings = diags;
            Ok(c)
        }
        _ => {
            if diags.is_empty() {
                diags.push(Diagnostic::error(
                    dec.files.first().map_or("", String::as_str),
                    1,
                    1,
                    "the contract could not be read",
                ));
            }
            Err(ContractError { diagnostics: diags })
        }
    }
}

/// Parse and validate contract text; `origin` names the file in error positions.
/// The top-level `kind:` of a YAML document and its line (1-based), read the same way by
/// `agentctl validate`, the daemon's agents directory and its tools directory, so that a file
/// is told apart as a contract or a tool manifest by one rule.
pub fn document_kind(text: &str) -> Option<(String, usize)> {
    text.lines().enumerate().find_map(|(i, l)| {
        l.strip_prefix("kind:").map(|v| {
            let v = v.split(" #").next().unwrap_or(v);
            (v.trim().trim_matches(['"', '\'']).to_string(), i + 1)
        })
    })
}

pub fn parse_contract(text: &str, origin: &str) -> Result<Contract, ContractError> {
    if let Some((kind, line)) = document_kind(text)
        && kind == tool::TOOL_KIND
    {
        return Err(ContractError::single(Diagnostic::error(
            origin,
            line,
            1,
            "kind: Tool: this is a tool manifest, not an agent contract; put it in the tools \
             directory (/etc/agentos/tools.d) and run `agentctl daemon-reload` (`agentctl validate` \
             checks it as a tool)",
        )));
    }
    let files = [origin.to_string()];
    let mut dec = Dec::new(&files);
    let mut root = match node::read_tree(text, origin, 0) {
        Ok(n) => n,
        Err(d) => return Err(ContractError { diagnostics: d }),
    };
    if matches!(root.v, V::Null) {
        return Err(ContractError::single(Diagnostic::error(
            origin,
            1,
            1,
            "the contract is empty; it needs at least \"name\"",
        )));
    }
    decode::normalize(&mut root, &mut dec);
    finish(root, dec)
}

/// Read and parse a contract file (at most [`MAX_CONTRACT_BYTES`], UTF-8).
pub fn load_contract(path: &Path) -> Result<Contract, ContractError> {
    let origin = path.display().to_string();
    let unreadable = |msg: String| ContractError::single(Diagnostic::error(&origin, 0, 0, msg));
    let file = std::fs::File::open(path).map_err(|e| unreadable(format!("cannot read: {e}")))?;
    if let Ok(m) = file.metadata()
        && m.is_dir()
    {
        return Err(unreadable("cannot read: is a directory".to_string()));
    }
    let mut bytes = Vec::new();
    file.take(MAX_CONTRACT_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| unreadable(format!("cannot read: {e}")))?;
    if bytes.len() > MAX_CONTRACT_BYTES {
        return Err(ContractError::single(Diagnostic::error(
            &origin,
            1,
            1,
            format!("contract is larger than the limit of {MAX_CONTRACT_BYTES} bytes (1 MiB)"),
        )));
    }
    match String::from_utf8(bytes) {
        Ok(text) => parse_contract(&text, &origin),
        Err(e) => {
            let valid = e.utf8_error().valid_up_to();
            let prefix = std::str::from_utf8(&e.as_bytes()[..valid]).unwrap_or_default();
            let (line, col) = node::line_col(prefix, prefix.len());
            Err(ContractError::single(Diagnostic::error(
                &origin,
                line,
                col,
                "contract is not valid UTF-8",
            )))
        }
    }
}
