//! The capability registry: built-in capability names, their kind and default scope.
//!
//! A contract grants capabilities by name, optionally with a scope (`fs.read: [/srv/docs]`).
//! A bare name means the documented default scope below. Names outside the registry are tool
//! capabilities (tools are registered later as manifests whose name is a capability), except
//! that names in the reserved kernel namespaces `fs.` and `net.` must be built-ins, and a name
//! within typo distance of a built-in is an error with a suggestion.

use serde::Serialize;

/// How a capability is enforced, which decides the syntax of its scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CapabilityKind {
    /// Filesystem access enforced by Landlock; scope: absolute paths (or `{state}/...`).
    Filesystem,
    /// Network access enforced by Landlock TCP rules and cgroup BPF; scope: `host:port`.
    Network,
    /// A tool call mediated by the daemon's gate; scope: free-form patterns the tool interprets.
    Tool,
}

/// One built-in capability.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapabilityInfo {
    pub name: &'static str,
    pub kind: CapabilityKind,
    /// Scope meant by a bare name. `{state}` is the agent's state directory.
    pub default_scope: &'static [&'static str],
    /// High-risk capabilities (paper 4.4/4.5): use should be gated by `security.consent_for`.
    pub high_risk: bool,
    pub description: &'static str,
}

const fn cap(
    name: &'static str,
    kind: CapabilityKind,
    default_scope: &'static [&'static str],
    high_risk: bool,
    description: &'static str,
) -> CapabilityInfo {
    CapabilityInfo {
        name,
        kind,
        default_scope,
        high_risk,
        description,
    }
}

use CapabilityKind::{Filesystem, Network, Tool};

/// The built-in capabilities.
pub const REGISTRY: &[CapabilityInfo] = &[
    cap(
        "fs.read",
        Filesystem,
        &["{state}"],
        false,
        "read files and list directories under the scope",
    ),
    cap(
        "fs.write",
        Filesystem,
        &["{state}"],
        true,
        "create, write and remove files under the scope",
    ),
    cap(
        "fs.exec",
        Filesystem,
        &["/usr", "/bin", "/lib"],
        false,
        "execute programs under the scope",
    ),
    cap(
        "net.connect",
        Network,
        &["*:443"],
        false,
        "open TCP connections to the scope's host:port",
    ),
    cap(
        "net.bind",
        Network,
        &["127.0.0.1:*"],
        false,
        "listen on the scope's host:port",
    ),
    cap(
        "web.fetch",
        Tool,
        &["*"],
        false,
        "fetch web pages through the daemon (scope: host patterns)",
    ),
    cap(
        "web.search",
        Tool,
        &["*"],
        false,
        "web search through the daemon",
    ),
    cap("summarize", Tool, &["*"], false, "the summarization tool"),
    cap(
        "rag.retrieve",
        Tool,
        &["*"],
        false,
        "retrieve from memory namespaces (scope: namespaces)",
    ),
    cap("tools.plan", Tool, &["*"], false, "the planning tool"),
    cap(
        "payment.charge",
        Tool,
        &["*"],
        true,
        "charge a payment (scope: payees or limits)",
    ),
    cap(
        "email.send",
        Tool,
        &["*"],
        true,
        "send email (scope: recipient patterns)",
    ),
    cap(
        "audio.detect_keyword",
        Tool,
        &["*"],
        false,
        "keyword detection on audio input",
    ),
    cap(
        "agent.pause",
        Tool,
        &["*"],
        false,
        "pause other agents of the same tenant (scope: agent names)",
    ),
    cap(
        "agent.message",
        Tool,
        &["*"],
        false,
        "send agent-to-agent messages (scope: agent names)",
    ),
    cap(
        "model.invoke",
        Tool,
        &["*"],
        false,
        "call models through the model gateway (scope: models)",
    ),
];

/// Namespaces whose capabilities are enforced by the kernel: only built-ins are valid there.
pub const RESERVED_NAMESPACES: &[&str] = &["fs", "net"];

/// Look up a built-in capability.
pub fn lookup(name: &str) -> Option<&'static CapabilityInfo> {
    REGISTRY.iter().find(|c| c.name == name)
}

/// Whether `name` has capability-name syntax: lower-case dotted segments
/// `[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*`, at most 64 characters.
pub fn is_valid_name(name: &str) -> bool {
    name.len() <= 64
        && !name.is_empty()
        && name.split('.').all(|seg| {
            let mut cs = seg.chars();
            cs.next().is_some_and(|c| c.is_ascii_lowercase())
                && cs.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        })
}

/// Why a capability name is not acceptable, with a suggestion when it is a near miss.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameProblem {
    pub message: String,
    pub suggestion: Option<String>,
}

/// Check a capability name: built-in, or an acceptable tool capability name.
pub fn check_name(name: &str) -> Result<(), NameProblem> {
    if lookup(name).is_some() {
        return Ok(());
    }
    let near = crate::diag::suggest(name, REGISTRY.iter().map(|c| c.name));
    if let Some(s) = near {
        return Err(NameProblem {
            message: format!("unknown capability \"{name}\" (did you mean \"{s}\"?)"),
            suggestion: Some(s.to_string()),
        });
    }
    if !is_valid_name(name) {
        return Err(NameProblem {
            message: format!(
                "\"{name}\" is not a capability name (lower-case dotted words such as \"fs.read\" or \"tool.translate\")"
            ),
            suggestion: None,
        });
    }
    if let Some((ns, _)) = name.split_once('.')
        && RESERVED_NAMESPACES.contains(&ns)
    {
        let known: Vec<&str> = REGISTRY
            .iter()
            .map(|c| c.name)
            .filter(|n| n.starts_with(&format!("{ns}.")))
            .collect();
        return Err(NameProblem {
            message: format!(
                "unknown capability \"{name}\": the \"{ns}.\" namespace is enforced by the kernel and has only {}",
                known.join(", ")
            ),
            suggestion: None,
        });
    }
    Ok(())
}

/// The kind of a capability: built-ins from the registry, everything else is a tool.
pub fn kind_of(name: &str) -> CapabilityKind {
    lookup(name).map_or(Tool, |c| c.kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(check_name("fs.read").is_ok());
        assert!(check_name("tool.translate").is_ok());
        assert!(check_name("translate").is_ok());
        let p = check_name("fs.reed").unwrap_err();
        assert_eq!(
            p.message,
            "unknown capability \"fs.reed\" (did you mean \"fs.read\"?)"
        );
        assert_eq!(p.suggestion.as_deref(), Some("fs.read"));
        assert!(
            check_name("fs.mount")
                .unwrap_err()
                .message
                .contains("namespace is enforced by the kernel")
        );
        assert!(check_name("Web Fetch").is_err());
        assert!(
            check_name("summarise")
                .unwrap_err()
                .message
                .contains("\"summarize\"")
        );
    }

    #[test]
    fn registry_is_consistent() {
        for c in REGISTRY {
            assert!(is_valid_name(c.name), "{}", c.name);
            assert!(!c.default_scope.is_empty(), "{}", c.name);
            assert_eq!(REGISTRY.iter().filter(|o| o.name == c.name).count(), 1);
        }
    }
}
