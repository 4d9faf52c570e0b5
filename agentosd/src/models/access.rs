//! What one agent may do with models, from its contract: which models (`modelPolicy.allow` and
//! `deny`; without `allow`, the models of `must.model` and `prefer.model`), where they may run
//! (`modelPolicy.placement`, else `must.placement`), how large a request may be
//! (`max_context_tokens`, `max_output_tokens`), which need an operator's consent
//! (`security.consent_for: ["model:NAME"]` or `"model:*"`), what replaces a model that is denied
//! or unavailable (`allow_fallbacks` with `when: model_denied` / `model_unavailable`), and the
//! agent's token budgets (`budgets.tokens`, `budgets.tokens_per_minute`).

use contracts::{Contract, VersionRange};

use super::config::{ModelEntry, ModelsConfig};

/// The fallback conditions the gateway raises at call time.
pub const WHEN_DENIED: &str = "model_denied";
pub const WHEN_UNAVAILABLE: &str = "model_unavailable";

/// Why a model is refused to an agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No backend serves it.
    Unknown,
    /// The contract does not allow it (or denies it).
    NotAllowed,
    /// Its backend runs at a placement the contract does not allow.
    Placement { placement: String },
    /// An embeddings model asked for chat, or the reverse.
    WrongKind,
}

impl Refusal {
    pub fn message(&self, model: &str) -> String {
        match self {
            Refusal::Unknown => format!("model {model} is not served by this host"),
            Refusal::NotAllowed => {
                format!("model {model} is not allowed by this agent's contract (modelPolicy)")
            }
            Refusal::Placement { placement } => format!(
                "model {model} runs at placement {placement}, which this agent's contract does \
                 not allow (modelPolicy.placement)"
            ),
            Refusal::WrongKind => format!("model {model} is not served on this endpoint"),
        }
    }

    /// The fallback condition this refusal raises.
    pub fn condition(&self) -> &'static str {
        match self {
            Refusal::Unknown => WHEN_UNAVAILABLE,
            _ => WHEN_DENIED,
        }
    }
}

/// One agent's model access, computed once per run from its contract.
#[derive(Debug, Clone, Default)]
pub struct Access {
    allow: Vec<String>,
    deny: Vec<String>,
    placements: Vec<String>,
    pub max_context_tokens: Option<u64>,
    pub max_output_tokens: Option<u64>,
    pub record_content: bool,
    consent: Vec<String>,
    /// `(when, substitute model)` in the contract's order.
    fallbacks: Vec<(String, String)>,
    pub tokens: Option<u64>,
    pub tokens_per_minute: Option<u64>,
}

/// `pattern` matches `model`: exact, `*`, a trailing-`*` prefix, or a version range.
fn matches(pattern: &str, model: &str) -> bool {
    if pattern == "*" || pattern == model {
        return true;
    }
    if let Some(prefix) = pattern.strip_suffix('*') {
        return model.starts_with(prefix);
    }
    pattern.contains("..") && VersionRange::parse(pattern).is_ok_and(|r| r.contains(model))
}

impl Access {
    pub fn from_contract(c: &Contract) -> Access {
        let mp = c.model_policy();
        let allow = if mp.allow.is_empty() {
            c.must()
                .model
                .iter()
                .chain(&c.prefer().model)
                .cloned()
                .collect()
        } else {
            mp.allow.clone()
        };
        let placements = if mp.placement.is_empty() {
            // `must.placement: local-only` means the host's only placement is local; for the
            // gateway it means models run locally.
            c.must()
                .placement
                .iter()
                .map(|p| p.trim_end_matches("-only").to_string())
                .collect()
        } else {
            mp.placement.clone()
        };
        Access {
            allow,
            deny: mp.deny.clone(),
            placements,
            max_context_tokens: mp.max_context_tokens,
            max_output_tokens: mp.max_output_tokens,
            record_content: mp.record_content,
            consent: c
                .security()
                .consent_for
                .iter()
                .filter_map(|s| s.strip_prefix("model:").map(str::to_string))
                .collect(),
            fallbacks: c
                .allow_fallbacks()
                .iter()
                .filter_map(|f| Some((f.when.clone(), f.substitute.model.clone()?)))
                .collect(),
            tokens: c.usage_budgets().tokens,
            tokens_per_minute: c.usage_budgets().tokens_per_minute,
        }
    }

    /// Whether the contract lets the agent call `model` as configured, and where it runs.
    pub fn check<'c>(
        &self,
        cfg: &'c ModelsConfig,
        model: &str,
        kind: super::config::ModelKind,
    ) -> Result<&'c ModelEntry, Refusal> {
        let allowed = self.allow.iter().any(|p| matches(p, model))
            && !self.deny.iter().any(|p| matches(p, model));
        let Some((entry, backend)) = cfg.route(model) else {
            return Err(if allowed {
                Refusal::Unknown
            } else {
                Refusal::NotAllowed
            });
        };
        if !allowed {
            return Err(Refusal::NotAllowed);
        }
        let placement = backend.placement.as_str();
        if !self.placements.is_empty() && !self.placements.iter().any(|p| p == placement) {
            return Err(Refusal::Placement {
                placement: placement.into(),
            });
        }
        if entry.kind != kind {
            return Err(Refusal::WrongKind);
        }
        Ok(entry)
    }

    /// The models the agent may call (for `GET /v1/models`).
    pub fn visible<'c>(&self, cfg: &'c ModelsConfig) -> Vec<&'c ModelEntry> {
        cfg.models
            .values()
            .filter(|m| self.check(cfg, &m.name, m.kind).is_ok())
            .collect()
    }

    /// The substitute the contract declares for `model` under condition `when`.
    pub fn fallback(&self, when: &str) -> Option<&str> {
        self.fallbacks
            .iter()
            .find(|(w, _)| w == when)
            .map(|(_, m)| m.as_str())
    }

    /// Whether each use of `model` is held for an operator's consent.
    pub fn needs_consent(&self, model: &str) -> bool {
        self.consent.iter().any(|p| matches(p, model))
    }
}

#[cfg(test)]
mod tests {
    use super::super::config::ModelKind;
    use super::*;

    fn cfg() -> ModelsConfig {
        ModelsConfig::parse(
            "backends:\n  - {name: l, url: http://127.0.0.1:1, placement: local, models: [{name: small}, {name: llm_v2}, {name: emb, kind: embeddings}]}\n  - {name: c, url: http://127.0.0.1:2, placement: cloud, models: [{name: big}]}\n",
            std::path::Path::new("m.yaml"),
            None,
        )
        .unwrap()
    }

    fn contract(extra: &str) -> Contract {
        let text = format!(
            "apiVersion: agentos/v0.2\nkind: AgentContract\nname: a\nclass: {{ latency: DT }}\n{extra}"
        );
        contracts::parse_contract(&text, "t.yaml").unwrap()
    }

    #[test]
    fn allow_deny_placement_and_kind_decide() {
        let cfg = cfg();
        let a = Access::from_contract(&contract(
            "modelPolicy: {allow: ['*'], deny: [big], placement: [local]}\n",
        ));
        assert!(a.check(&cfg, "small", ModelKind::Chat).is_ok());
        assert_eq!(
            a.check(&cfg, "big", ModelKind::Chat).err(),
            Some(Refusal::NotAllowed)
        );
        assert_eq!(
            a.check(&cfg, "nope", ModelKind::Chat).err(),
            Some(Refusal::Unknown)
        );
        assert_eq!(
            a.check(&cfg, "emb", ModelKind::Chat).err(),
            Some(Refusal::WrongKind)
        );
        let names: Vec<_> = a.visible(&cfg).iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["emb", "llm_v2", "small"]);

        let cloud_ok = Access::from_contract(&contract("modelPolicy: {allow: [big]}\n"));
        assert!(cloud_ok.check(&cfg, "big", ModelKind::Chat).is_ok());
        let local_only = Access::from_contract(&contract(
            "modelPolicy: {allow: [big], placement: [local]}\n",
        ));
        assert!(matches!(
            local_only.check(&cfg, "big", ModelKind::Chat),
            Err(Refusal::Placement { .. })
        ));
    }

    #[test]
    fn without_allow_the_must_and_prefer_models_are_allowed_and_nothing_else() {
        let cfg = cfg();
        let a = Access::from_contract(&contract("must: {model: ['llm_v1..v3']}\n"));
        assert!(a.check(&cfg, "llm_v2", ModelKind::Chat).is_ok());
        assert_eq!(
            a.check(&cfg, "small", ModelKind::Chat).err(),
            Some(Refusal::NotAllowed)
        );
        let none = Access::from_contract(&contract(""));
        assert!(none.visible(&cfg).is_empty());
    }

    #[test]
    fn consent_fallbacks_and_budgets_come_from_the_contract() {
        let a = Access::from_contract(&contract(
            "modelPolicy: {allow: ['*']}\nsecurity: {consent_for: ['model:big']}\nbudgets: {tokens: 100, tokens_per_minute: 10}\nallow_fallbacks:\n  - {when: model_unavailable, substitute: {model: small}}\n",
        ));
        assert!(a.needs_consent("big") && !a.needs_consent("small"));
        assert_eq!(a.fallback(WHEN_UNAVAILABLE), Some("small"));
        assert_eq!(a.fallback(WHEN_DENIED), None);
        assert_eq!((a.tokens, a.tokens_per_minute), (Some(100), Some(10)));
    }
}
