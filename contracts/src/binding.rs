//! Binding (paper 4.4): a contract plus what the host offers gives either a rejection that
//! lists every failed `must`, or a sealed [`BindingManifest`].

use std::collections::BTreeSet;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::admission::AdmissionSet;
use crate::canonical::{sha256_hex, to_canonical_json};
use crate::model::{
    BindingMode, Budgets, Capability, Contract, DeadlineParams, LatencyClass, Mechanism, Slo,
};

/// What a host offers, as far as binding is concerned.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HostOffer {
    /// Available enforcement mechanisms (serialized by name: `cgroup.cpu`, `sched_deadline`, ...).
    pub mechanisms: BTreeSet<Mechanism>,
    /// Models the gateway can serve, with versions (`asr_local_v3`).
    pub models: BTreeSet<String>,
    /// Labels describing where this host is (`edge`, `on-prem`, `cloud`).
    pub placements: BTreeSet<String>,
    pub embed_stores: BTreeSet<String>,
    pub providers: BTreeSet<String>,
    /// Conditions in force, matched against `allow_fallbacks[].when` (`bandwidth_low`).
    pub conditions: BTreeSet<String>,
}

/// A model version: dotted numbers after a `v` (`v2`, `v2.1`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Version(Vec<u64>);

impl Version {
    fn parse(s: &str) -> Option<Version> {
        if s.is_empty() || s.len() > 32 {
            return None;
        }
        let parts: Option<Vec<u64>> = s.split('.').map(|p| p.parse().ok()).collect();
        parts.map(Version)
    }
    fn padded(&self, n: usize) -> Vec<u64> {
        let mut v = self.0.clone();
        v.resize(n.max(v.len()), 0);
        v
    }
    fn cmp_padded(&self, other: &Version) -> std::cmp::Ordering {
        let n = self.0.len().max(other.0.len());
        self.padded(n).cmp(&other.padded(n))
    }
}

/// `base_vA..vB`: every `base_vX` with A <= X <= B.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionRange {
    pub base: String,
    from: Version,
    to: Version,
}

/// Split `name_v2.1` into (`name_`, version).
fn split_version(s: &str) -> Option<(&str, Version)> {
    let i = s.rfind('v')?;
    let (base, ver) = s.split_at(i);
    Some((base, Version::parse(ver.get(1..)?)?))
}

impl VersionRange {
    /// Parse `asr_local_v2..v3` (the right side may repeat the base: `asr_local_v2..asr_local_v3`).
    pub fn parse(s: &str) -> Result<VersionRange, String> {
        let bad = || format!("\"{s}\" is not a version range such as \"asr_local_v2..v3\"");
        let (left, right) = s.split_once("..").ok_or_else(bad)?;
        let (base, from) = split_version(left).ok_or_else(bad)?;
        let right = right.strip_prefix(base).unwrap_or(right);
        let to = right
            .strip_prefix('v')
            .and_then(Version::parse)
            .ok_or_else(bad)?;
        if base.is_empty() {
            return Err(bad());
        }
        if from.cmp_padded(&to) == std::cmp::Ordering::Greater {
            return Err(format!(
                "\"{s}\": the range is empty (the lower version is above the upper one)"
            ));
        }
        Ok(VersionRange {
            base: base.to_string(),
            from,
            to,
        })
    }

    pub fn contains(&self, model: &str) -> bool {
        match model
            .strip_prefix(&self.base)
            .and_then(|r| r.strip_prefix('v'))
            .and_then(Version::parse)
        {
            Some(v) => v.cmp_padded(&self.from).is_ge() && v.cmp_padded(&self.to).is_le(),
            None => false,
        }
    }

    /// The lowest version's name (what strict binding pins).
    pub fn lowest(&self) -> String {
        format!(
            "{}v{}",
            self.base,
            self.from
                .0
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(".")
        )
    }
}

/// Resolve one model spec (name or range) against the available models.
fn resolve_model(spec: &str, offered: &BTreeSet<String>, mode: BindingMode) -> Option<String> {
    if !spec.contains("..") {
        return offered.contains(spec).then(|| spec.to_string());
    }
    let r = VersionRange::parse(spec).ok()?;
    if mode == BindingMode::Strict {
        let low = r.lowest();
        return offered.contains(&low).then_some(low);
    }
    offered
        .iter()
        .filter(|m| r.contains(m))
        .max_by(|a, b| {
            let va = split_version(a).map(|x| x.1);
            let vb = split_version(b).map(|x| x.1);
            match (va, vb) {
                (Some(x), Some(y)) => x.cmp_padded(&y),
                _ => a.cmp(b),
            }
        })
        .cloned()
}

fn model_satisfies(model: &str, spec: &str) -> bool {
    if spec.contains("..") {
        VersionRange::parse(spec).is_ok_and(|r| r.contains(model))
    } else {
        model == spec
    }
}

/// `X-only` is met when X is the host's only placement; any other label when the host has it.
fn placement_ok(spec: &str, placements: &BTreeSet<String>) -> bool {
    match spec.strip_suffix("-only") {
        Some(p) => placements.len() == 1 && placements.contains(p),
        None => placements.contains(spec),
    }
}

fn placement_value(spec: &str) -> String {
    spec.strip_suffix("-only").unwrap_or(spec).to_string()
}

/// One decision taken while binding, for the audit trail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Decision {
    /// What was decided: `model`, `placement`, `embed_store`, `provider`.
    pub field: String,
    /// `selected`, `upgraded`, `substituted`, `unsatisfied`, `skipped`.
    pub action: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    pub reason: String,
}

/// A failed hard requirement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Failure {
    /// The requirement, e.g. `must.model`, `class.latency`, `compute.must`.
    pub requirement: String,
    pub reason: String,
}

/// A contract that cannot be bound on this host: every failed `must`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
pub struct BindingRejection {
    pub agent: String,
    pub mode: BindingMode,
    pub failures: Vec<Failure>,
}

impl fmt::Display for BindingRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot bind {} ({} binding): ",
            self.agent,
            self.mode.as_str()
        )?;
        let parts: Vec<String> = self
            .failures
            .iter()
            .map(|x| format!("{}: {}", x.requirement, x.reason))
            .collect();
        f.write_str(&parts.join("; "))
    }
}

/// The sealed result of binding: resolved values and a SHA-256 over their canonical JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BindingManifest {
    pub agent: String,
    pub tenant: String,
    pub mode: BindingMode,
    pub latency_class: Option<LatencyClass>,
    pub deadline: Option<DeadlineParams>,
    pub slo: Slo,
    pub budgets: Budgets,
    pub capabilities: Vec<Capability>,
    pub consent_for: Vec<String>,
    pub model: Option<String>,
    pub embed_store: Option<String>,
    pub placement: Option<String>,
    pub provider: Option<String>,
    /// True when a substitution asked for redaction (e.g. a cloud model for local context).
    pub redact: bool,
    /// Mechanisms the binding relies on (all offered by the host).
    pub mechanisms: Vec<Mechanism>,
    pub decisions: Vec<Decision>,
    /// SHA-256 of the contract's canonical JSON.
    pub contract_sha256: String,
    /// SHA-256 of [`BindingManifest::canonical_json`] (the manifest without this field).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub sha256: String,
}

impl BindingManifest {
    /// Canonical JSON of everything but `sha256`.
    pub fn canonical_json(&self) -> String {
        let mut body = self.clone();
        body.sha256 = String::new();
        to_canonical_json(&body)
    }
    /// Whether `sha256` matches the content.
    pub fn verify(&self) -> bool {
        self.sha256 == sha256_hex(self.canonical_json().as_bytes())
    }
    /// Canonical JSON including the hash, for attaching to audit records and traces.
    pub fn sealed_json(&self) -> String {
        to_canonical_json(self)
    }
}

/// Mechanisms a contract's hard requirements need on this host, each with the requirement
/// that needs it (`class.latency`, `compute.must`, `must.mechanisms`).
pub fn required_mechanisms(c: &Contract) -> Vec<(Mechanism, &'static str)> {
    let mut out: Vec<(Mechanism, &'static str)> = Vec::new();
    let mut add = |m: Mechanism, why: &'static str| {
        if !out.iter().any(|(x, _)| *x == m) {
            out.push((m, why));
        }
    };
    if c.latency_class() == Some(LatencyClass::Hrt) {
        add(Mechanism::SchedDeadline, "class.latency");
    }
    let b = c.budgets();
    if b.must {
        if b.cpu_millis.is_some() {
            add(Mechanism::CgroupCpu, "compute.must");
        }
        if b.memory_bytes.is_some() || b.memory_high_bytes.is_some() {
            add(Mechanism::CgroupMemory, "compute.must");
        }
        if b.pids.is_some() {
            add(Mechanism::CgroupPids, "compute.must");
        }
        if !c.cpuset().is_empty() {
            add(Mechanism::CgroupCpuset, "compute.must");
        }
    }
    for m in &c.must().mechanisms {
        add(*m, "must.mechanisms");
    }
    out
}

/// Bind without an HRT admission test.
pub fn bind(c: &Contract, offer: &HostOffer) -> Result<BindingManifest, BindingRejection> {
    bind_inner(c, offer, None)
}

/// Bind, and for HRT contracts also test the deadline reservation against `admission`
/// (without admitting it: call [`AdmissionSet::admit`] when the agent starts).
pub fn bind_admitted(
    c: &Contract,
    offer: &HostOffer,
    admission: &AdmissionSet,
) -> Result<BindingManifest, BindingRejection> {
    bind_inner(c, offer, Some(admission))
}

fn bind_inner(
    c: &Contract,
    offer: &HostOffer,
    admission: Option<&AdmissionSet>,
) -> Result<BindingManifest, BindingRejection> {
    let mode = c.binding_mode();
    let mut failures = Vec::new();
    let mut decisions = Vec::new();
    let mut fail = |req: &str, reason: String| {
        failures.push(Failure {
            requirement: req.to_string(),
            reason,
        })
    };

    // 1. mechanisms behind hard requirements
    let required = required_mechanisms(c);
    for (m, why) in &required {
        if !offer.mechanisms.contains(m) {
            let what = match *why {
                "class.latency" => "latency class HRT needs SCHED_DEADLINE".to_string(),
                "compute.must" => "budgets are marked must".to_string(),
                _ => "listed in must.mechanisms".to_string(),
            };
            fail(why, format!("{what}, and this host does not offer \"{m}\""));
        }
    }
    // 2. HRT admission
    if let (Some(d), Some(adm)) = (c.deadline(), admission)
        && let Err(e) = adm.find_cpu(&d, c.cpuset())
    {
        fail("class.slo.deadline_ms", e.to_string());
    }
    // 3. must.model
    let mut model: Option<String> = None;
    if !c.must().model.is_empty() {
        model = c
            .must()
            .model
            .iter()
            .find_map(|s| resolve_model(s, &offer.models, mode));
        match &model {
            Some(m) => decisions.push(Decision {
                field: "model".into(),
                action: "selected".into(),
                value: Some(m.clone()),
                reason: "must.model".into(),
            }),
            None => fail(
                "must.model",
                format!(
                    "none of {} is available (host offers: {})",
                    c.must().model.join(", "),
                    list(&offer.models)
                ),
            ),
        }
    }
    // 4. must.placement
    let mut placement: Option<String> = None;
    if !c.must().placement.is_empty() {
        placement = c
            .must()
            .placement
            .iter()
            .find(|p| placement_ok(p, &offer.placements))
            .map(|p| placement_value(p));
        if placement.is_none() {
            fail(
                "must.placement",
                format!(
                    "requires {}, host placement is {}",
                    c.must().placement.join(" or "),
                    list(&offer.placements)
                ),
            );
        }
    }

    // 5. preferences
    let pref = c.prefer();
    let mut embed_store = None;
    let mut provider = None;
    let strict = mode == BindingMode::Strict;
    if model.is_none() && !pref.model.is_empty() {
        model = pref
            .model
            .iter()
            .find_map(|s| resolve_model(s, &offer.models, mode));
        prefer_outcome(
            &mut decisions,
            &mut fail,
            strict,
            "model",
            &pref.model,
            &model,
            &offer.models,
        );
    }
    if placement.is_none() && !pref.placement.is_empty() {
        placement = pref
            .placement
            .iter()
            .find(|p| placement_ok(p, &offer.placements))
            .map(|p| placement_value(p));
        prefer_outcome(
            &mut decisions,
            &mut fail,
            strict,
            "placement",
            &pref.placement,
            &placement,
            &offer.placements,
        );
    }
    if !pref.embed_store.is_empty() {
        embed_store = pref
            .embed_store
            .iter()
            .find(|s| offer.embed_stores.contains(*s))
            .cloned();
        prefer_outcome(
            &mut decisions,
            &mut fail,
            strict,
            "embed_store",
            &pref.embed_store,
            &embed_store,
            &offer.embed_stores,
        );
    }
    if !pref.provider.is_empty() {
        provider = pref
            .provider
            .iter()
            .find(|s| offer.providers.contains(*s))
            .cloned();
        prefer_outcome(
            &mut decisions,
            &mut fail,
            strict,
            "provider",
            &pref.provider,
            &provider,
            &offer.providers,
        );
    }

    // 6. flexible substitutions
    let mut redact = false;
    if mode == BindingMode::Flexible {
        let mut done: BTreeSet<&str> = BTreeSet::new();
        for fb in c.allow_fallbacks() {
            if !offer.conditions.contains(&fb.when) {
                continue;
            }
            let s = &fb.substitute;
            let mut applied = false;
            if let Some(m) = &s.model
                && !done.contains("model")
            {
                if !offer.models.contains(m) {
                    decisions.push(skip("model", m, &fb.when, "not available on this host"));
                } else if !c.must().model.is_empty()
                    && !c.must().model.iter().any(|spec| model_satisfies(m, spec))
                {
                    decisions.push(skip("model", m, &fb.when, "would violate must.model"));
                } else {
                    model = Some(m.clone());
                    decisions.push(Decision {
                        field: "model".into(),
                        action: "substituted".into(),
                        value: Some(m.clone()),
                        reason: format!("allow_fallbacks when {}", fb.when),
                    });
                    done.insert("model");
                    applied = true;
                }
            }
            if let Some(p) = &s.placement
                && !done.contains("placement")
            {
                if !placement_ok(p, &offer.placements) {
                    decisions.push(skip("placement", p, &fb.when, "not this host's placement"));
                } else if !c.must().placement.is_empty()
                    && !c
                        .must()
                        .placement
                        .iter()
                        .any(|x| placement_value(x) == placement_value(p))
                {
                    decisions.push(skip(
                        "placement",
                        p,
                        &fb.when,
                        "would violate must.placement",
                    ));
                } else {
                    placement = Some(placement_value(p));
                    decisions.push(subst("placement", p, &fb.when));
                    done.insert("placement");
                    applied = true;
                }
            }
            for (field, val, offered, slot) in [
                (
                    "embed_store",
                    &s.embed_store,
                    &offer.embed_stores,
                    &mut embed_store,
                ),
                ("provider", &s.provider, &offer.providers, &mut provider),
            ] {
                if let Some(v) = val
                    && !done.contains(field)
                {
                    if offered.contains(v) {
                        *slot = Some(v.clone());
                        decisions.push(subst(field, v, &fb.when));
                        done.insert(field);
                        applied = true;
                    } else {
                        decisions.push(skip(field, v, &fb.when, "not available on this host"));
                    }
                }
            }
            if applied && s.redact {
                redact = true;
            }
        }
    }

    if !failures.is_empty() {
        return Err(BindingRejection {
            agent: c.id(),
            mode,
            failures,
        });
    }
    let mut m = BindingManifest {
        agent: c.name().to_string(),
        tenant: c.tenant().to_string(),
        mode,
        latency_class: c.latency_class(),
        deadline: c.deadline(),
        slo: c.slo().clone(),
        budgets: c.budgets(),
        capabilities: c.capabilities().to_vec(),
        consent_for: c.security().consent_for.clone(),
        model,
        embed_store,
        placement,
        provider,
        redact,
        mechanisms: required.into_iter().map(|(m, _)| m).collect(),
        decisions,
        contract_sha256: c.sha256(),
        sha256: String::new(),
    };
    m.sha256 = sha256_hex(m.canonical_json().as_bytes());
    Ok(m)
}

fn list(s: &BTreeSet<String>) -> String {
    if s.is_empty() {
        "none".to_string()
    } else {
        s.iter().cloned().collect::<Vec<_>>().join(", ")
    }
}

fn skip(field: &str, v: &str, when: &str, why: &str) -> Decision {
    Decision {
        field: field.into(),
        action: "skipped".into(),
        value: Some(v.to_string()),
        reason: format!("allow_fallbacks when {when}: {why}"),
    }
}

fn subst(field: &str, v: &str, when: &str) -> Decision {
    Decision {
        field: field.into(),
        action: "substituted".into(),
        value: Some(v.to_string()),
        reason: format!("allow_fallbacks when {when}"),
    }
}

fn prefer_outcome(
    decisions: &mut Vec<Decision>,
    fail: &mut impl FnMut(&str, String),
    strict: bool,
    field: &str,
    wanted: &[String],
    got: &Option<String>,
    offered: &BTreeSet<String>,
) {
    match got {
        Some(v) => {
            let first = wanted.first().map(String::as_str).unwrap_or_default();
            let upgraded = first.contains("..") && model_satisfies(v, first) && !strict;
            decisions.push(Decision {
                field: field.into(),
                action: if upgraded { "upgraded" } else { "selected" }.into(),
                value: Some(v.clone()),
                reason: if upgraded {
                    format!("highest available version in {first}")
                } else {
                    format!("prefer.{field}")
                },
            });
        }
        None if strict => fail(
            &format!("prefer.{field}"),
            format!(
                "strict binding needs one of {} (host offers: {})",
                wanted.join(", "),
                list(offered)
            ),
        ),
        None => decisions.push(Decision {
            field: field.into(),
            action: "unsatisfied".into(),
            value: None,
            reason: format!(
                "none of {} is available (host offers: {})",
                wanted.join(", "),
                list(offered)
            ),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        let r = VersionRange::parse("asr_local_v2..v3").unwrap();
        assert_eq!(r.base, "asr_local_");
        assert!(r.contains("asr_local_v2"));
        assert!(r.contains("asr_local_v3"));
        assert!(r.contains("asr_local_v2.5"));
        assert!(!r.contains("asr_local_v4"));
        assert!(!r.contains("asr_cloud_v2"));
        assert_eq!(r.lowest(), "asr_local_v2");
        assert!(
            VersionRange::parse("asr_local_v3..v2")
                .unwrap_err()
                .contains("empty")
        );
        assert!(VersionRange::parse("asr..").is_err());
        assert!(VersionRange::parse("x_v1..x_v2").is_ok());
    }

    #[test]
    fn resolve() {
        let offered: BTreeSet<String> = ["asr_local_v2", "asr_local_v3", "asr_local_v4"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(
            resolve_model("asr_local_v2..v3", &offered, BindingMode::Smooth).as_deref(),
            Some("asr_local_v3")
        );
        assert_eq!(
            resolve_model("asr_local_v2..v3", &offered, BindingMode::Strict).as_deref(),
            Some("asr_local_v2")
        );
        assert_eq!(
            resolve_model("asr_cloud_v2", &offered, BindingMode::Smooth),
            None
        );
    }

    #[test]
    fn placements() {
        let edge: BTreeSet<String> = ["edge".to_string()].into();
        let both: BTreeSet<String> = ["edge".to_string(), "cloud".to_string()].into();
        assert!(placement_ok("edge-only", &edge));
        assert!(!placement_ok("edge-only", &both));
        assert!(placement_ok("edge", &both));
    }
}
