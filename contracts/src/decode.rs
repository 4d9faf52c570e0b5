//! Decoding the positioned YAML tree into a typed [`Contract`], collecting every problem.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use crate::capability::{self, CapabilityKind};
use crate::diag::{Diagnostic, Severity, suggest};
use crate::model::*;
use crate::node::{Key, N, Pos, V};
use crate::units;

/// Collects diagnostics and the positions of decoded fields.
pub(crate) struct Dec<'f> {
    pub files: &'f [String],
    pub diags: Vec<Diagnostic>,
    /// Field path → position of its value (for semantic checks after decoding).
    pub spans: HashMap<String, Pos>,
}

pub(crate) fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn quote_list(items: &[&str]) -> String {
    items
        .iter()
        .map(|s| format!("\"{s}\""))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Common other spellings of field names, offered as suggestions.
const SYNONYMS: &[(&str, &str)] = &[
    ("memory", "mem"),
    ("memory_max", "mem"),
    ("mem_max", "mem"),
    ("memory_high", "mem_high"),
    ("cpus", "cpu"),
    ("cores", "cpu"),
    ("latency", "class"),
    ("model_policy", "modelPolicy"),
    ("model", "modelPolicy"),
    ("cmd", "command"),
    ("argv", "args"),
    ("environment", "env"),
    ("cwd", "working_directory"),
    ("workdir", "working_directory"),
    ("deadline", "deadline_ms"),
    ("runtime", "runtime_ms"),
    ("period", "period_ms"),
];

/// The fields of one mapping, checked against the allowed names.
pub(crate) struct Fields<'n> {
    path: String,
    map: BTreeMap<&'n str, (&'n Key, &'n N)>,
}

impl<'n> Fields<'n> {
    pub fn get(&self, key: &str) -> Option<&'n N> {
        self.map.get(key).map(|(_, n)| *n)
    }
    pub fn key(&self, key: &str) -> Option<&'n Key> {
        self.map.get(key).map(|(k, _)| *k)
    }
    pub fn path(&self, key: &str) -> String {
        join(&self.path, key)
    }
}

impl<'f> Dec<'f> {
    pub fn new(files: &'f [String]) -> Self {
        Dec {
            files,
            diags: Vec::new(),
            spans: HashMap::new(),
        }
    }

    fn file(&self, p: Pos) -> String {
        self.files.get(p.src).cloned().unwrap_or_default()
    }

    pub fn push(
        &mut self,
        sev: Severity,
        p: Pos,
        field: &str,
        message: String,
        suggestion: Option<String>,
    ) {
        self.diags.push(Diagnostic {
            file: self.file(p),
            line: p.line,
            column: p.col,
            field: (!field.is_empty()).then(|| field.to_string()),
            message,
            suggestion,
            severity: sev,
        });
    }

    pub fn err(&mut self, p: Pos, field: &str, message: impl Into<String>) {
        self.push(Severity::Error, p, field, message.into(), None);
    }

    pub fn warn(&mut self, p: Pos, field: &str, message: impl Into<String>) {
        self.push(Severity::Warning, p, field, message.into(), None);
    }

    pub fn has_errors(&self) -> bool {
        self.diags.iter().any(Diagnostic::is_error)
    }

    fn mismatch(&mut self, n: &N, field: &str, expected: &str) {
        self.err(
            n.pos,
            field,
            format!("{field}: expected {expected}, found {}", n.v.kind()),
        );
    }

    fn record(&mut self, field: &str, n: &N) {
        self.spans.insert(field.to_string(), n.pos);
    }

    /// A mapping with only `allowed` keys; unknown keys are errors with a suggestion.
    pub fn fields<'n>(&mut self, n: &'n N, path: &str, allowed: &[&str]) -> Option<Fields<'n>> {
        let V::Map(entries) = &n.v else {
            let what = if path.is_empty() {
                "the contract"
            } else {
                path
            };
            self.err(
                n.pos,
                path,
                format!("{what}: expected a mapping, found {}", n.v.kind()),
            );
            return None;
        };
        self.record(path, n);
        let mut map = BTreeMap::new();
        for (k, v) in entries {
            if allowed.contains(&k.name.as_str()) {
                map.insert(k.name.as_str(), (k, v));
                continue;
            }
            let place = if path.is_empty() {
                "the contract".to_string()
            } else {
                path.to_string()
            };
            let field = join(path, &k.name);
            match suggest(&k.name, allowed.iter().copied()) {
                Some(s) => self.push(
                    Severity::Error,
                    k.pos,
                    &field,
                    format!(
                        "unknown field \"{}\" in {place} (did you mean \"{s}\"?)",
                        k.name
                    ),
                    Some(s.to_string()),
                ),
                None => match SYNONYMS
                    .iter()
                    .find(|(from, to)| *from == k.name && allowed.contains(to))
                {
                    Some((_, to)) => self.push(
                        Severity::Error,
                        k.pos,
                        &field,
                        format!(
                            "unknown field \"{}\" in {place} (did you mean \"{to}\"?)",
                            k.name
                        ),
                        Some(to.to_string()),
                    ),
                    None => self.err(
                        k.pos,
                        &field,
                        format!(
                            "unknown field \"{}\" in {place}; known fields: {}",
                            k.name,
                            allowed.join(", ")
                        ),
                    ),
                },
            }
        }
        Some(Fields {
            path: path.to_string(),
            map,
        })
    }

    pub fn string(&mut self, n: &N, field: &str) -> Option<String> {
        match &n.v {
            V::Str(s) => {
                self.record(field, n);
                Some(s.clone())
            }
            _ => {
                self.mismatch(n, field, "a string");
                None
            }
        }
    }

    /// A scalar as text: strings, integers, decimals (for quantities written unquoted).
    fn scalar_text(&mut self, n: &N, field: &str, expected: &str) -> Option<String> {
        let s = match &n.v {
            V::Str(s) => s.clone(),
            V::Int(i) if *i >= 0 => i.to_string(),
            V::Float(f) if f.is_finite() && *f > 1e30 => {
                self.err(n.pos, field, format!("{field}: number is too large"));
                return None;
            }
            V::Float(f) if f.is_finite() && *f >= 0.0 => format!("{f}"),
            V::Int(_) | V::Float(_) => {
                self.err(n.pos, field, format!("{field}: must not be negative"));
                return None;
            }
            _ => {
                self.mismatch(n, field, expected);
                return None;
            }
        };
        self.record(field, n);
        Some(s)
    }

    pub fn boolean(&mut self, n: &N, field: &str) -> Option<bool> {
        match &n.v {
            V::Bool(b) => {
                self.record(field, n);
                Some(*b)
            }
            V::Str(s)
                if ["yes", "no", "on", "off", "y", "n"]
                    .contains(&s.to_ascii_lowercase().as_str()) =>
            {
                self.err(
                    n.pos,
                    field,
                    format!("{field}: expected true or false, found \"{s}\""),
                );
                None
            }
            _ => {
                self.mismatch(n, field, "true or false");
                None
            }
        }
    }

    /// A whole number in `min..=max`.
    pub fn uint(&mut self, n: &N, field: &str, min: u64, max: u64) -> Option<u64> {
        match &n.v {
            V::Int(i) => {
                if *i < i128::from(min) || *i > i128::from(max) {
                    let msg = if *i < i128::from(min) && min == 1 {
                        format!("{field}: must be positive, found {i}")
                    } else {
                        format!("{field}: {i} is out of range ({min} to {max})")
                    };
                    self.err(n.pos, field, msg);
                    return None;
                }
                self.record(field, n);
                u64::try_from(*i).ok()
            }
            V::Float(f) => {
                let msg = if f.fract() == 0.0 && f.abs() > 1e18 {
                    format!("{field}: number is too large (at most {max})")
                } else {
                    format!("{field}: expected a whole number, found {f}")
                };
                self.err(n.pos, field, msg);
                None
            }
            _ => {
                self.mismatch(n, field, "a whole number");
                None
            }
        }
    }

    /// A count such as tokens: `16000` or `"16k"`; positive.
    pub fn count(&mut self, n: &N, field: &str) -> Option<u64> {
        let s = self.scalar_text(n, field, "a count such as 16000 or \"16k\"")?;
        match units::parse_count(&s) {
            Ok(0) => {
                self.err(n.pos, field, format!("{field}: must be positive"));
                None
            }
            Ok(v) => Some(v),
            Err(e) => {
                self.err(n.pos, field, format!("{field}: {e}"));
                None
            }
        }
    }

    /// Milliseconds (integer or decimal number) to nanoseconds; positive.
    pub fn millis(&mut self, n: &N, field: &str) -> Option<u64> {
        let text = match &n.v {
            V::Int(i) if *i > 0 => i.to_string(),
            V::Float(f) if f.is_finite() && *f > 1e12 => {
                self.err(n.pos, field, format!("{field}: number is too large"));
                return None;
            }
            V::Float(f) if f.is_finite() && *f > 0.0 => format!("{f}"),
            V::Int(_) | V::Float(_) => {
                self.err(n.pos, field, format!("{field}: must be positive"));
                return None;
            }
            _ => {
                self.mismatch(n, field, "a number of milliseconds");
                return None;
            }
        };
        match units::parse_ms(&text) {
            Ok(0) => {
                self.err(n.pos, field, format!("{field}: must be positive"));
                None
            }
            Ok(ns) if ns > i64::MAX as u64 => {
                self.err(n.pos, field, format!("{field}: {text} ms is too large"));
                None
            }
            Ok(ns) => {
                self.record(field, n);
                Some(ns)
            }
            Err(e) => {
                self.err(n.pos, field, format!("{field}: {e}"));
                None
            }
        }
    }

    /// A list of strings; with `single`, a lone string is a one-item list.
    pub fn strings(&mut self, n: &N, field: &str, single: bool) -> Option<Vec<(String, Pos)>> {
        match &n.v {
            V::Str(s) if single => {
                self.record(field, n);
                Some(vec![(s.clone(), n.pos)])
            }
            V::Seq(items) => {
                self.record(field, n);
                let mut out = Vec::new();
                for (i, it) in items.iter().enumerate() {
                    let f = format!("{field}[{i}]");
                    if let Some(s) = self.string(it, &f) {
                        out.push((s, it.pos));
                    }
                }
                Some(out)
            }
            _ => {
                self.mismatch(
                    n,
                    field,
                    if single {
                        "a string or a list of strings"
                    } else {
                        "a list of strings"
                    },
                );
                None
            }
        }
    }

    /// One of `choices`, with a suggestion for near misses.
    pub fn choice(&mut self, n: &N, field: &str, choices: &[&str]) -> Option<String> {
        let s = self.string(n, field)?;
        if choices.contains(&s.as_str()) {
            return Some(s);
        }
        match suggest(&s, choices.iter().copied()) {
            Some(c) => self.push(
                Severity::Error,
                n.pos,
                field,
                format!("{field}: unknown value \"{s}\" (did you mean \"{c}\"?)"),
                Some(c.to_string()),
            ),
            None => self.err(
                n.pos,
                field,
                format!(
                    "{field}: unknown value \"{s}\"; expected one of {}",
                    quote_list(choices)
                ),
            ),
        }
        None
    }
}

/// `^[a-z0-9][a-z0-9-]{0,62}$`: names and tenants become cgroup directories and D-Bus paths.
pub fn is_valid_agent_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

const TOP: &[&str] = &[
    "apiVersion",
    "kind",
    "name",
    "tenant",
    "description",
    "class",
    "capabilities",
    "compute",
    "modelPolicy",
    "memory",
    "security",
    "observability",
    "budgets",
    "exec",
    "restart",
    "binding",
    "must",
    "prefer",
    "allow_fallbacks",
    // alternative spellings (paper 4.4), rewritten by `normalize` before decoding
    "agent",
    "latency_class",
];

/// Names of the host mechanisms ([`Mechanism::as_str`]).
pub const MECHANISMS: [&str; 10] = {
    let mut out = [""; 10];
    let mut i = 0;
    while i < 10 {
        out[i] = Mechanism::ALL[i].as_str();
        i += 1;
    }
    out
};

pub const LOG_FIELDS: &[&str] = &[
    "prompt",
    "sources",
    "completion",
    "tool_calls",
    "tool_args",
    "tool_results",
    "tokens",
    "model",
    "latency",
];

pub const TRACING: &[&str] = &["opentelemetry", "journal", "none"];

/// Rewrite the paper's alternative spellings into the canonical ones, in one layer:
/// `agent` → `name`, `latency_class` → `class.latency`. Both spellings with different values
/// are an error.
pub(crate) fn normalize(root: &mut N, dec: &mut Dec) {
    let V::Map(entries) = &mut root.v else { return };
    // agent → name
    if let Some(ai) = entries.iter().position(|(k, _)| k.name == "agent") {
        if let Some(ni) = entries.iter().position(|(k, _)| k.name == "name") {
            let same =
                matches!((&entries[ai].1.v, &entries[ni].1.v), (V::Str(a), V::Str(b)) if a == b);
            if !same {
                let p = entries[ai].0.pos;
                dec.err(p, "agent", "both \"name\" and \"agent\" are given with different values; \"agent\" is another spelling of \"name\": keep one");
            }
            entries.remove(ai);
        } else {
            entries[ai].0.name = "name".to_string();
        }
    }
    // latency_class → class.latency
    if let Some(li) = entries.iter().position(|(k, _)| k.name == "latency_class") {
        let (lk, lv) = entries.remove(li);
        match entries.iter_mut().find(|(k, _)| k.name == "class") {
            Some((_, class)) => match &mut class.v {
                V::Map(cm) => match cm.iter().find(|(k, _)| k.name == "latency") {
                    Some((_, existing)) => {
                        let same = matches!((&existing.v, &lv.v), (V::Str(a), V::Str(b)) if a == b);
                        if !same {
                            dec.err(
                                lk.pos,
                                "latency_class",
                                "both \"latency_class\" and \"class.latency\" are given with different values; \"latency_class\" is shorthand for \"class.latency\": keep one",
                            );
                        }
                    }
                    None => cm.push((
                        Key {
                            name: "latency".into(),
                            pos: lk.pos,
                        },
                        lv,
                    )),
                },
                _ => { /* reported when `class` is decoded */ }
            },
            None => {
                let pos = lk.pos;
                entries.push((
                    Key {
                        name: "class".into(),
                        pos,
                    },
                    N {
                        v: V::Map(vec![(
                            Key {
                                name: "latency".into(),
                                pos,
                            },
                            lv,
                        )]),
                        pos,
                    },
                ));
            }
        }
    }
}

/// A model name, possibly a version range `base_vA..vB` (paper 4.4: `asr_local_v2..v3`).
pub(crate) fn check_model_name(s: &str) -> Result<(), String> {
    if s.is_empty() || s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("\"{s}\" is not a model name"));
    }
    if s.contains("..") {
        crate::binding::VersionRange::parse(s)?;
    }
    Ok(())
}

fn cond_name_ok(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// Decode the whole (normalized) tree.
pub(crate) fn decode(root: &N, dec: &mut Dec) -> Option<Contract> {
    let f = dec.fields(root, "", TOP)?;
    let mut c = Contract {
        api_version: API_VERSION.to_string(),
        kind: KIND.to_string(),
        name: String::new(),
        tenant: DEFAULT_TENANT.to_string(),
        description: None,
        class: Class::default(),
        capabilities: Vec::new(),
        compute: Compute::default(),
        model_policy: ModelPolicy::default(),
        memory: MemoryPolicy::default(),
        security: Security::default(),
        observability: Observability::default(),
        budgets: UsageBudgets::default(),
        exec: None,
        restart: RestartSpec::default(),
        binding: BindingMode::Smooth,
        must: Must::default(),
        prefer: Prefer::default(),
        allow_fallbacks: Vec::new(),
        warnings: Vec::new(),
    };

    if let Some(n) = f.get("apiVersion")
        && let Some(v) = dec.string(n, "apiVersion")
    {
        if v != API_VERSION {
            dec.err(
                n.pos,
                "apiVersion",
                format!("apiVersion: unsupported version \"{v}\"; supported: \"{API_VERSION}\""),
            );
        }
        c.api_version = v;
    }
    if let Some(n) = f.get("kind")
        && let Some(v) = dec.choice(n, "kind", &[KIND])
    {
        c.kind = v;
    }
    match f.get("name") {
        Some(n) => {
            if let Some(v) = dec.string(n, "name") {
                if !is_valid_agent_name(&v) {
                    dec.err(n.pos, "name", format!("name: \"{v}\" is not a valid agent name: use 1-63 lower-case letters, digits and '-', starting with a letter or digit (it becomes a cgroup directory and a D-Bus object path)"));
                }
                c.name = v;
            }
        }
        None => dec.err(
            root.pos,
            "name",
            "missing field \"name\" (or \"agent\"): every contract names its agent",
        ),
    }
    if let Some(n) = f.get("tenant")
        && let Some(v) = dec.string(n, "tenant")
    {
        if !is_valid_agent_name(&v) {
            dec.err(n.pos, "tenant", format!("tenant: \"{v}\" is not a valid tenant name: use 1-63 lower-case letters, digits and '-', starting with a letter or digit"));
        }
        c.tenant = v;
    }
    if let Some(n) = f.get("description") {
        c.description = dec.string(n, "description");
    }
    if let Some(n) = f.get("class") {
        decode_class(n, dec, &mut c.class);
    }
    if let Some(n) = f.get("capabilities") {
        c.capabilities = decode_capabilities(n, dec);
    }
    if let Some(n) = f.get("compute") {
        decode_compute(n, dec, &mut c.compute);
    }
    if let Some(n) = f.get("modelPolicy")
        && let Some(m) = dec.fields(
            n,
            "modelPolicy",
            &[
                "allow",
                "deny",
                "placement",
                "max_context_tokens",
                "max_output_tokens",
                "record_content",
            ],
        )
    {
        for (key, out) in [
            ("allow", &mut c.model_policy.allow),
            ("deny", &mut c.model_policy.deny),
        ] {
            if let Some(x) = m.get(key) {
                *out = model_list(dec, x, &m.path(key));
            }
        }
        if let Some(x) = m.get("max_context_tokens") {
            c.model_policy.max_context_tokens = dec.count(x, "modelPolicy.max_context_tokens");
        }
        if let Some(x) = m.get("max_output_tokens") {
            c.model_policy.max_output_tokens = dec.count(x, "modelPolicy.max_output_tokens");
        }
        if let Some(x) = m.get("placement") {
            c.model_policy.placement = dec
                .strings(x, "modelPolicy.placement", true)
                .unwrap_or_default()
                .into_iter()
                .map(|(s, _)| s)
                .collect();
        }
        if let Some(x) = m.get("record_content") {
            c.model_policy.record_content = dec
                .boolean(x, "modelPolicy.record_content")
                .unwrap_or_default();
        }
    }
    if let Some(n) = f.get("memory")
        && let Some(m) = dec.fields(n, "memory", &["namespace", "retention_days", "rag"])
    {
        if let Some(x) = m.get("namespace")
            && let Some(v) = dec.string(x, "memory.namespace")
        {
            if !is_valid_agent_name(&v) {
                dec.err(x.pos, "memory.namespace", format!("memory.namespace: \"{v}\" is not valid: use 1-63 lower-case letters, digits and '-'"));
            }
            c.memory.namespace = Some(v);
        }
        if let Some(x) = m.get("retention_days") {
            c.memory.retention_days = dec.uint(x, "memory.retention_days", 0, 36_500);
        }
        if let Some(x) = m.get("rag")
            && let Some(r) = dec.fields(x, "memory.rag", &["top_k", "require_grounding"])
        {
            let mut rag = Rag::default();
            if let Some(y) = r.get("top_k") {
                rag.top_k = dec.uint(y, "memory.rag.top_k", 1, 1000);
            }
            if let Some(y) = r.get("require_grounding") {
                rag.require_grounding = dec
                    .boolean(y, "memory.rag.require_grounding")
                    .unwrap_or(false);
            }
            c.memory.rag = Some(rag);
        }
    }
    if let Some(n) = f.get("security")
        && let Some(s) = dec.fields(n, "security", &["consent_for", "deny"])
    {
        for (key, out) in [
            ("consent_for", &mut c.security.consent_for),
            ("deny", &mut c.security.deny),
        ] {
            if let Some(x) = s.get(key) {
                let field = s.path(key);
                for (i, (name, pos)) in dec
                    .strings(x, &field, false)
                    .unwrap_or_default()
                    .into_iter()
                    .enumerate()
                {
                    let f = format!("{field}[{i}]");
                    dec.record(&f, &N { v: V::Null, pos });
                    // `model:NAME` (consent_for only): calls of that model at the gateway.
                    let checked = match name.strip_prefix("model:") {
                        Some(m) if key == "consent_for" => {
                            check_model_name(m).map_err(|e| capability::NameProblem {
                                message: e,
                                suggestion: None,
                            })
                        }
                        _ => capability::check_name(&name),
                    };
                    match checked {
                        Ok(()) => {
                            if out.contains(&name) {
                                dec.err(pos, &f, format!("{field}: \"{name}\" is listed twice"));
                            } else {
                                out.push(name);
                            }
                        }
                        Err(p) => dec.push(
                            Severity::Error,
                            pos,
                            &f,
                            format!("{field}: {}", p.message),
                            p.suggestion,
                        ),
                    }
                }
            }
        }
    }
    if let Some(n) = f.get("observability")
        && let Some(o) = dec.fields(n, "observability", &["tracing", "log_fields"])
    {
        if let Some(x) = o.get("tracing") {
            c.observability.tracing = dec.choice(x, "observability.tracing", TRACING);
        }
        if let Some(x) = o.get("log_fields")
            && let V::Seq(items) = &x.v
        {
            for (i, it) in items.iter().enumerate() {
                if let Some(v) =
                    dec.choice(it, &format!("observability.log_fields[{i}]"), LOG_FIELDS)
                {
                    c.observability.log_fields.push(v);
                }
            }
        } else if let Some(x) = o.get("log_fields") {
            dec.mismatch(x, "observability.log_fields", "a list of strings");
        }
    }
    if let Some(n) = f.get("budgets")
        && let Some(b) = dec.fields(n, "budgets", &["tokens", "tokens_per_minute", "tool_calls"])
    {
        if let Some(x) = b.get("tokens") {
            c.budgets.tokens = dec.count(x, "budgets.tokens");
        }
        if let Some(x) = b.get("tokens_per_minute") {
            c.budgets.tokens_per_minute = dec.count(x, "budgets.tokens_per_minute");
        }
        if let Some(x) = b.get("tool_calls") {
            c.budgets.tool_calls = dec.count(x, "budgets.tool_calls");
        }
    }
    if let Some(n) = f.get("exec") {
        c.exec = decode_exec(n, dec);
    }
    if let Some(n) = f.get("restart") {
        decode_restart(n, dec, &mut c.restart);
    }
    if let Some(n) = f.get("must") {
        decode_must(n, dec, &mut c.must);
    }
    if let Some(n) = f.get("prefer")
        && let Some(p) = dec.fields(
            n,
            "prefer",
            &["model", "embed_store", "placement", "provider"],
        )
    {
        if let Some(x) = p.get("model") {
            c.prefer.model = model_list(dec, x, "prefer.model");
        }
        for (key, out) in [
            ("embed_store", &mut c.prefer.embed_store),
            ("placement", &mut c.prefer.placement),
            ("provider", &mut c.prefer.provider),
        ] {
            if let Some(x) = p.get(key) {
                *out = dec
                    .strings(x, &p.path(key), true)
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(s, _)| s)
                    .collect();
            }
        }
    }
    if let Some(n) = f.get("allow_fallbacks") {
        c.allow_fallbacks = decode_fallbacks(n, dec);
    }
    let explicit_binding = f
        .get("binding")
        .and_then(|n| dec.choice(n, "binding", &["strict", "smooth", "flexible"]));
    c.binding = match explicit_binding.as_deref() {
        Some("strict") => BindingMode::Strict,
        Some("smooth") => BindingMode::Smooth,
        Some("flexible") => BindingMode::Flexible,
        _ if c.class.latency == Some(LatencyClass::Hrt) => BindingMode::Strict,
        _ if !c.allow_fallbacks.is_empty() => BindingMode::Flexible,
        _ => BindingMode::Smooth,
    };
    if explicit_binding.is_some()
        && c.binding != BindingMode::Flexible
        && !c.allow_fallbacks.is_empty()
        && let Some(k) = f.key("binding")
    {
        let p = f.get("binding").map_or(k.pos, |n| n.pos);
        dec.warn(p, "binding", format!("allow_fallbacks has no effect with binding: {}; use binding: flexible to allow them", c.binding.as_str()));
    }
    Some(c)
}

fn model_list(dec: &mut Dec, n: &N, field: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (i, (s, pos)) in dec
        .strings(n, field, true)
        .unwrap_or_default()
        .into_iter()
        .enumerate()
    {
        match check_model_name(&s) {
            Ok(()) => out.push(s),
            Err(e) => dec.err(pos, &format!("{field}[{i}]"), format!("{field}: {e}")),
        }
    }
    out
}

fn decode_class(n: &N, dec: &mut Dec, class: &mut Class) {
    let Some(f) = dec.fields(n, "class", &["latency", "slo"]) else {
        return;
    };
    if let Some(x) = f.get("latency") {
        class.latency = match dec
            .choice(x, "class.latency", &["HRT", "SRT", "DT"])
            .as_deref()
        {
            Some("HRT") => Some(LatencyClass::Hrt),
            Some("SRT") => Some(LatencyClass::Srt),
            Some("DT") => Some(LatencyClass::Dt),
            _ => None,
        };
    }
    let Some(slo) = f.get("slo") else { return };
    let Some(s) = dec.fields(
        slo,
        "class.slo",
        &[
            "onset_ms",
            "turn_ms",
            "jitter_p95_pct",
            "deadline_ms",
            "runtime_ms",
            "period_ms",
            "jitter_ms",
        ],
    ) else {
        return;
    };
    let ms = |dec: &mut Dec, key: &str| {
        s.get(key)
            .and_then(|x| dec.millis(x, &format!("class.slo.{key}")))
    };
    class.slo.onset_ns = ms(dec, "onset_ms");
    class.slo.turn_ns = ms(dec, "turn_ms");
    class.slo.deadline_ns = ms(dec, "deadline_ms");
    class.slo.runtime_ns = ms(dec, "runtime_ms");
    class.slo.period_ns = ms(dec, "period_ms");
    class.slo.jitter_ns = ms(dec, "jitter_ms");
    if let Some(x) = s.get("jitter_p95_pct") {
        class.slo.jitter_p95_pct = dec.uint(x, "class.slo.jitter_p95_pct", 0, 100);
    }
}

/// An absolute path, or one under the agent's state directory (`{state}` as its whole first
/// component: `{state}x` would name a sibling of the agent's home, another agent's), with no
/// `.` or `..` component and no control character; a trailing `/` is dropped.
pub(crate) fn normalize_path(s: &str) -> Option<String> {
    let rest = if s == "{state}" || s.starts_with("{state}/") {
        &s["{state}".len()..]
    } else if s.starts_with('/') {
        s
    } else {
        return None;
    };
    if rest
        .split('/')
        .any(|c| c == ".." || c == "." || c.contains("{state}"))
        || s.chars().any(char::is_control)
    {
        return None;
    }
    let t = s.trim_end_matches('/');
    Some(if t.is_empty() {
        "/".to_string()
    } else {
        t.to_string()
    })
}

/// A network scope: `HOST:PORT` with HOST a name, an address, `[v6]` or `*`, or an address
/// prefix `ADDR/LEN` (`10.0.0.0/8:443`, `[fd00::/8]:443`: LEN up to 32 or 128), and PORT
/// 1-65535 or `*`. The daemon's policy builder (`enforce::net`) reads the same forms.
/// A HOST may also be a wildcard `*.SUFFIX` (one or more labels under SUFFIX, at any depth,
/// never SUFFIX itself), answered by the agent's DNS stub. `udp://HOST:PORT` (a name, a
/// wildcard, an address or a prefix; not `*`) grants UDP only (QUIC/HTTP3): a name grant
/// without it is TCP only, an address or prefix grant without it TCP and UDP.
pub(crate) fn net_scope_ok(s: &str) -> bool {
    if let Some(rest) = s.strip_prefix(UDP_SCHEME) {
        return udp_host_error(rest).is_none() && net_scope_ok(rest);
    }
    let Some((host, port)) = s.rsplit_once(':') else {
        return false;
    };
    let port_ok = port == "*" || port.parse::<u16>().is_ok_and(|p| p > 0);
    let host_ok = !host.is_empty()
        && !host.chars().any(|c| c.is_whitespace() || c.is_control())
        && prefix_ok(host)
        && wildcard_error(host).is_none();
    port_ok && host_ok
}

/// What is wrong with a HOST that has a `*` but is not `*` alone: it must be `*.SUFFIX`, SUFFIX
/// a DNS name of at least two labels (letters, digits, `-`, not at a label's ends; 1-63 bytes
/// each, 253 in all), with no other `*`.
pub(crate) fn wildcard_error(host: &str) -> Option<String> {
    if host == "*" || !host.contains('*') {
        return None;
    }
    let Some(suffix) = host.strip_prefix("*.") else {
        return Some(format!(
            "\"{host}\": a wildcard is \"*.\" followed by a name (\"*.example.com\"); \"*\" stands for whole labels at the start only"
        ));
    };
    let suffix = suffix.strip_suffix('.').unwrap_or(suffix);
    let labels: Vec<&str> = suffix.split('.').collect();
    if suffix.contains('*') {
        return Some(format!("\"{host}\": only one \"*\", as the first label"));
    }
    if labels.len() < 2 {
        return Some(format!(
            "\"{host}\": a wildcard needs a suffix of at least two labels (\"*.example.com\", not \"*.com\")"
        ));
    }
    let label_ok = |l: &&str| {
        (1..=63).contains(&l.len())
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if suffix.len() > 251 || !labels.iter().all(label_ok) {
        return Some(format!(
            "\"{host}\": the suffix after \"*.\" is not a DNS name (labels of 1-63 letters, digits and '-', 253 bytes in all)"
        ));
    }
    None
}

/// The prefix that declares UDP to a name's addresses in `net.connect`.
pub(crate) const UDP_SCHEME: &str = "udp://";

/// What is wrong with the HOST of `udp://HOST:PORT` (`rest` is `HOST:PORT`): a name, a
/// `*.SUFFIX` wildcard, an address or a prefix (UDP only to it); not `*`.
fn udp_host_error(rest: &str) -> Option<String> {
    let host = rest.rsplit_once(':').map_or(rest, |(h, _)| h);
    (host == "*").then(|| format!(
        "\"udp://{rest}\": udp:// declares UDP only to a name, an address or a prefix (\"udp://api.example.com:443\", \"udp://192.0.2.1:443\"); \"*:PORT\" allows TCP and UDP already"
    ))
}

/// What is wrong with network scope `s` of capability `cap` (`net.connect`, `net.bind`), as a
/// message for `field`; `None` when it is valid.
pub(crate) fn net_scope_error(cap: &str, field: &str, s: &str) -> Option<String> {
    // https:// and http:// declare an SNI or Host check (crate::netscope).
    if let Some(r) = crate::netscope::checked_scope(s) {
        if cap != "net.connect" {
            return Some(format!(
                "{field}: \"{s}\": https:// and http:// declare a check of the names connections carry, for net.connect only"
            ));
        }
        return r.err().map(|e| format!("{field}: {e}"));
    }
    if cap != "net.connect" && s.starts_with(UDP_SCHEME) {
        return Some(format!(
            "{field}: \"{s}\": udp:// is for net.connect only ({cap} grants local addresses for TCP and UDP)"
        ));
    }
    (!net_scope_ok(s)).then(|| net_scope_message(field, s))
}

/// The message for a network scope `s` of `field` that [`net_scope_ok`] refuses.
pub(crate) fn net_scope_message(field: &str, s: &str) -> String {
    if let Some(e) = s.strip_prefix(UDP_SCHEME).and_then(udp_host_error) {
        return format!("{field}: {e}");
    }
    let bare = s.strip_prefix(UDP_SCHEME).unwrap_or(s);
    let wildcard = bare.rsplit_once(':').and_then(|(h, _)| wildcard_error(h));
    match wildcard {
        Some(w) => format!("{field}: {w}"),
        None => format!(
            "{field}: \"{s}\" is not HOST:PORT (HOST a name, *.NAME, address, ADDR/LEN prefix or \"*\"; PORT 1-65535 or \"*\")"
        ),
    }
}

/// A HOST with a `/` must be an address prefix: an IP address literal (in brackets or not) and a
/// length within the address's bits. A HOST without one is not checked here.
fn prefix_ok(host: &str) -> bool {
    let inner = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let Some((addr, len)) = inner.split_once('/') else {
        return !host.contains('/');
    };
    let max = match addr.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(_)) => 32,
        Ok(std::net::IpAddr::V6(_)) => 128,
        Err(_) => return false,
    };
    len.bytes().all(|b| b.is_ascii_digit())
        && !len.is_empty()
        && len.parse::<u8>().is_ok_and(|l| l <= max)
}

fn decode_scope(
    dec: &mut Dec,
    name: &str,
    kind: CapabilityKind,
    n: &N,
    field: &str,
) -> Option<Vec<String>> {
    let items = match &n.v {
        V::Null => return None,
        V::Str(_) | V::Seq(_) => dec.strings(n, field, true)?,
        _ => {
            dec.mismatch(n, field, "a scope: a string or a list of strings");
            return None;
        }
    };
    if items.is_empty() {
        dec.err(n.pos, field, format!("{field}: an empty scope grants nothing; remove \"{name}\" or write a bare name for its default scope"));
        return None;
    }
    let mut out = Vec::new();
    for (s, pos) in items {
        match kind {
            CapabilityKind::Filesystem => match normalize_path(&s) {
                Some(p) => out.push(p),
                None => dec.err(pos, field, format!("{field}: \"{s}\" is not an absolute path without \".\" or \"..\" components (or one under \"{{state}}/\")")),
            },
            CapabilityKind::Network => match net_scope_error(name, field, &s) {
                None => out.push(s),
                Some(e) => dec.err(pos, field, e),
            },
            CapabilityKind::Tool => {
                if s.is_empty() || s.chars().any(char::is_control) {
                    dec.err(pos, field, format!("{field}: empty or invalid scope entry"));
                } else {
                    out.push(s);
                }
            }
        }
    }
    Some(out)
}

fn decode_capabilities(n: &N, dec: &mut Dec) -> Vec<Capability> {
    // Collect (name key position, name, optional scope node, field path).
    let mut entries: Vec<(Pos, String, Option<&N>, String)> = Vec::new();
    match &n.v {
        V::Seq(items) => {
            for (i, it) in items.iter().enumerate() {
                let field = format!("capabilities[{i}]");
                match &it.v {
                    V::Str(s) => entries.push((it.pos, s.clone(), None, field)),
                    V::Map(m) if m.len() == 1 => {
                        let (k, v) = &m[0];
                        entries.push((k.pos, k.name.clone(), Some(v), field));
                    }
                    V::Map(_) => dec.err(it.pos, &field, format!("{field}: a capability with a scope is a one-key mapping such as \"fs.read: [/srv/docs]\"")),
                    _ => dec.mismatch(it, &field, "a capability name or NAME: SCOPE"),
                }
            }
        }
        V::Map(m) => {
            for (k, v) in m {
                entries.push((
                    k.pos,
                    k.name.clone(),
                    Some(v),
                    format!("capabilities.{}", k.name),
                ));
            }
        }
        _ => {
            dec.mismatch(
                n,
                "capabilities",
                "a list of capability names, or a mapping NAME: SCOPE",
            );
            return Vec::new();
        }
    }
    let mut out: Vec<Capability> = Vec::new();
    for (pos, name, scope, field) in entries {
        dec.record(&format!("capability:{name}"), &N { v: V::Null, pos });
        if let Err(p) = capability::check_name(&name) {
            dec.push(
                Severity::Error,
                pos,
                &field,
                format!("{field}: {}", p.message),
                p.suggestion,
            );
            continue;
        }
        if out.iter().any(|c| c.name == name) {
            dec.err(pos, &field, format!("{field}: capability \"{name}\" is granted twice; merge the scopes into one entry"));
            continue;
        }
        let kind = capability::kind_of(&name);
        let explicit = match scope {
            Some(s) => match decode_scope(dec, &name, kind, s, &field) {
                Some(v) => Some(v),
                None if matches!(s.v, V::Null) => None,
                None => continue,
            },
            None => None,
        };
        let (scope, default_scope) = match explicit {
            Some(v) => (v, false),
            None => (
                capability::lookup(&name).map_or_else(
                    || vec!["*".to_string()],
                    |c| c.default_scope.iter().map(|s| s.to_string()).collect(),
                ),
                true,
            ),
        };
        out.push(Capability {
            name,
            kind,
            scope,
            default_scope,
        });
    }
    out
}

fn decode_compute(n: &N, dec: &mut Dec, c: &mut Compute) {
    let Some(f) = dec.fields(
        n,
        "compute",
        &[
            "cpu",
            "mem",
            "mem_high",
            "pids",
            "cpuset",
            "io",
            "disk",
            "disk_inodes",
            "must",
        ],
    ) else {
        return;
    };
    if let Some(x) = f.get("cpu")
        && let Some(s) = dec.scalar_text(
            x,
            "compute.cpu",
            "a CPU quantity such as \"1\", \"0.5\" or \"500m\"",
        )
    {
        match units::parse_cpu(&s) {
            Ok(0) => dec.err(x.pos, "compute.cpu", "compute.cpu: must be positive"),
            Ok(v) => c.cpu_millis = Some(v),
            Err(e) => dec.err(x.pos, "compute.cpu", format!("compute.cpu: {e}")),
        }
    }
    for (key, out) in [
        ("mem", &mut c.mem_bytes),
        ("mem_high", &mut c.mem_high_bytes),
        ("disk", &mut c.disk_bytes),
    ] {
        let field = format!("compute.{key}");
        if let Some(x) = f.get(key)
            && let Some(s) =
                dec.scalar_text(x, &field, "a size such as \"2GiB\" or a number of bytes")
        {
            match units::parse_memory(&s) {
                Ok(0) => dec.err(x.pos, &field, format!("{field}: must be positive")),
                Ok(v) => *out = Some(v),
                Err(e) => dec.err(x.pos, &field, format!("{field}: {e}")),
            }
        }
    }
    if let Some(x) = f.get("pids") {
        c.pids = dec.uint(x, "compute.pids", 1, 4_194_304);
    }
    if let Some(x) = f.get("disk_inodes") {
        // A quota's inode limit is a 64-bit count; more than 2^32 files is no limit on any
        // file system agentos runs on.
        c.disk_inodes = dec.uint(x, "compute.disk_inodes", 1, u64::from(u32::MAX));
    }
    if let Some(x) = f.get("cpuset") {
        match &x.v {
            V::Seq(items) => {
                for (i, it) in items.iter().enumerate() {
                    if let Some(v) = dec.uint(it, &format!("compute.cpuset[{i}]"), 0, 8191) {
                        let v = v as u32;
                        if !c.cpuset.contains(&v) {
                            c.cpuset.push(v);
                        }
                    }
                }
                c.cpuset.sort_unstable();
            }
            _ => dec.mismatch(x, "compute.cpuset", "a list of CPU numbers"),
        }
    }
    if let Some(x) = f.get("io") {
        match &x.v {
            V::Seq(items) => {
                for (i, it) in items.iter().enumerate() {
                    if let Some(l) = decode_io_limit(it, dec, &format!("compute.io[{i}]")) {
                        c.io.push(l);
                    }
                }
            }
            _ => dec.mismatch(
                x,
                "compute.io",
                "a list of { device, rbps, wbps, riops, wiops } maps",
            ),
        }
    }
    if let Some(x) = f.get("must") {
        c.must = dec.boolean(x, "compute.must").unwrap_or(false);
    }
}

/// Whether `s` is a `MAJOR:MINOR` device number.
fn is_dev_number(s: &str) -> bool {
    s.split_once(':').is_some_and(|(a, b)| {
        !a.is_empty()
            && !b.is_empty()
            && a.bytes().all(|c| c.is_ascii_digit())
            && b.bytes().all(|c| c.is_ascii_digit())
            && a.len() <= 4
            && b.len() <= 7
    })
}

fn decode_io_limit(n: &N, dec: &mut Dec, path: &str) -> Option<IoLimit> {
    let f = dec.fields(n, path, &["device", "rbps", "wbps", "riops", "wiops"])?;
    let mut l = IoLimit::default();
    let field = format!("{path}.device");
    match f.get("device") {
        None => {
            dec.err(
                n.pos,
                &field,
                format!("{field}: missing (a block device such as /dev/vda, or MAJOR:MINOR)"),
            );
            return None;
        }
        Some(x) => {
            let d = dec.scalar_text(x, &field, "a block device path or MAJOR:MINOR")?;
            if !(d.starts_with("/dev/") && !d.contains("..") || is_dev_number(&d)) {
                dec.err(
                    x.pos,
                    &field,
                    format!("{field}: {d:?} is neither a path under /dev/ nor MAJOR:MINOR"),
                );
                return None;
            }
            l.device = d;
        }
    }
    for (key, out) in [("rbps", &mut l.rbps), ("wbps", &mut l.wbps)] {
        let field = format!("{path}.{key}");
        if let Some(x) = f.get(key)
            && let Some(s) =
                dec.scalar_text(x, &field, "a rate in bytes per second such as \"10MiB\"")
        {
            match units::parse_memory(&s) {
                Ok(0) => dec.err(x.pos, &field, format!("{field}: must be positive")),
                Ok(v) => *out = Some(v),
                Err(e) => dec.err(x.pos, &field, format!("{field}: {e}")),
            }
        }
    }
    for (key, out) in [("riops", &mut l.riops), ("wiops", &mut l.wiops)] {
        if let Some(x) = f.get(key) {
            *out = dec.uint(x, &format!("{path}.{key}"), 1, u64::from(u32::MAX));
        }
    }
    if ["rbps", "wbps", "riops", "wiops"]
        .iter()
        .all(|k| f.get(k).is_none())
    {
        dec.err(
            n.pos,
            path,
            format!("{path}: no limit: give at least one of rbps, wbps, riops, wiops"),
        );
        return None;
    }
    Some(l)
}

fn env_name_ok(s: &str) -> bool {
    let mut cs = s.chars();
    cs.next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && cs.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn arg_text(dec: &mut Dec, n: &N, field: &str) -> Option<String> {
    match &n.v {
        V::Str(s) => Some(s.clone()),
        V::Int(i) => Some(i.to_string()),
        V::Bool(b) => Some(b.to_string()),
        _ => {
            dec.mismatch(n, field, "a string");
            None
        }
    }
}

fn decode_exec(n: &N, dec: &mut Dec) -> Option<Exec> {
    let mut e = Exec::default();
    let command_node;
    match &n.v {
        V::Seq(items) => {
            // argv form: [command, arg, ...]
            let Some((first, rest)) = items.split_first() else {
                dec.err(
                    n.pos,
                    "exec",
                    "exec: the argv list is empty; give at least the command",
                );
                return None;
            };
            command_node = first;
            for (i, a) in rest.iter().enumerate() {
                if let Some(s) = arg_text(dec, a, &format!("exec[{}]", i + 1)) {
                    e.args.push(s);
                }
            }
        }
        V::Map(_) => {
            let f = dec.fields(n, "exec", &["command", "args", "env", "working_directory"])?;
            let Some(c) = f.get("command") else {
                dec.err(
                    n.pos,
                    "exec.command",
                    "exec: missing field \"command\" (the absolute path of the program)",
                );
                return None;
            };
            command_node = c;
            if let Some(a) = f.get("args") {
                match &a.v {
                    V::Seq(items) => {
                        for (i, it) in items.iter().enumerate() {
                            if let Some(s) = arg_text(dec, it, &format!("exec.args[{i}]")) {
                                e.args.push(s);
                            }
                        }
                    }
                    _ => dec.mismatch(a, "exec.args", "a list of strings"),
                }
            }
            if let Some(env) = f.get("env") {
                match &env.v {
                    V::Map(m) => {
                        for (k, v) in m {
                            let field = format!("exec.env.{}", k.name);
                            if !env_name_ok(&k.name) {
                                dec.err(k.pos, &field, format!("exec.env: \"{}\" is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)", k.name));
                                continue;
                            }
                            if let Some(s) = arg_text(dec, v, &field) {
                                e.env.insert(k.name.clone(), s);
                            }
                        }
                    }
                    _ => dec.mismatch(env, "exec.env", "a mapping NAME: value"),
                }
            }
            if let Some(w) = f.get("working_directory")
                && let Some(s) = dec.string(w, "exec.working_directory")
            {
                if s.starts_with('/') {
                    e.working_directory = Some(PathBuf::from(s));
                } else {
                    dec.err(
                        w.pos,
                        "exec.working_directory",
                        format!("exec.working_directory: \"{s}\" is not an absolute path"),
                    );
                }
            }
        }
        _ => {
            dec.mismatch(
                n,
                "exec",
                "a mapping with command, args, env, working_directory (or an argv list)",
            );
            return None;
        }
    }
    let field = if matches!(n.v, V::Seq(_)) {
        "exec[0]"
    } else {
        "exec.command"
    };
    let cmd = dec.string(command_node, field)?;
    if !cmd.starts_with('/') {
        dec.err(command_node.pos, field, format!("{field}: \"{cmd}\" is not an absolute path (write e.g. \"/bin/sh\"; the daemon does not search PATH)"));
        return None;
    }
    e.command = cmd;
    Some(e)
}

const RESTART_POLICIES: &[&str] = &["no", "on-failure", "always"];

fn restart_policy(dec: &mut Dec, n: &N, field: &str) -> Option<RestartPolicy> {
    match dec.choice(n, field, RESTART_POLICIES).as_deref() {
        Some("no") => Some(RestartPolicy::No),
        Some("on-failure") => Some(RestartPolicy::OnFailure),
        Some("always") => Some(RestartPolicy::Always),
        _ => None,
    }
}

fn decode_restart(n: &N, dec: &mut Dec, r: &mut RestartSpec) {
    if let V::Str(_) = &n.v {
        if let Some(p) = restart_policy(dec, n, "restart") {
            r.policy = p;
        }
        return;
    }
    let Some(f) = dec.fields(
        n,
        "restart",
        &["policy", "limit", "backoff_ms", "max_backoff_ms"],
    ) else {
        return;
    };
    if let Some(x) = f.get("policy")
        && let Some(p) = restart_policy(dec, x, "restart.policy")
    {
        r.policy = p;
    }
    if let Some(x) = f.get("limit")
        && let Some(v) = dec.uint(x, "restart.limit", 0, 1_000_000)
    {
        r.limit = v as u32;
    }
    if let Some(x) = f.get("backoff_ms")
        && let Some(v) = dec.uint(x, "restart.backoff_ms", 0, 86_400_000)
    {
        r.backoff_ms = v;
    }
    if let Some(x) = f.get("max_backoff_ms")
        && let Some(v) = dec.uint(x, "restart.max_backoff_ms", 0, 86_400_000)
    {
        r.max_backoff_ms = v;
    }
    if r.backoff_ms > r.max_backoff_ms {
        let p = f
            .get("max_backoff_ms")
            .or(f.get("backoff_ms"))
            .map_or(n.pos, |x| x.pos);
        let field = if f.get("max_backoff_ms").is_some() {
            "restart.max_backoff_ms"
        } else {
            "restart.backoff_ms"
        };
        dec.err(
            p,
            field,
            format!(
                "{field}: restart.backoff_ms ({}) exceeds restart.max_backoff_ms ({})",
                r.backoff_ms, r.max_backoff_ms
            ),
        );
    }
}

fn decode_must(n: &N, dec: &mut Dec, m: &mut Must) {
    let Some(f) = dec.fields(
        n,
        "must",
        &["model", "placement", "deadline_ms", "mechanisms"],
    ) else {
        return;
    };
    if let Some(x) = f.get("model") {
        m.model = model_list(dec, x, "must.model");
    }
    if let Some(x) = f.get("placement") {
        m.placement = dec
            .strings(x, "must.placement", true)
            .unwrap_or_default()
            .into_iter()
            .map(|(s, _)| s)
            .collect();
    }
    if let Some(x) = f.get("deadline_ms") {
        m.deadline_ns = dec.millis(x, "must.deadline_ms");
    }
    if let Some(x) = f.get("mechanisms") {
        for (i, (s, pos)) in dec
            .strings(x, "must.mechanisms", true)
            .unwrap_or_default()
            .into_iter()
            .enumerate()
        {
            let field = format!("must.mechanisms[{i}]");
            if let Some(mech) = Mechanism::from_name(&s) {
                if !m.mechanisms.contains(&mech) {
                    m.mechanisms.push(mech);
                }
            } else {
                let sugg = suggest(&s, MECHANISMS.iter().copied());
                let msg = match sugg {
                    Some(c) => format!(
                        "must.mechanisms: unknown mechanism \"{s}\" (did you mean \"{c}\"?)"
                    ),
                    None => format!(
                        "must.mechanisms: unknown mechanism \"{s}\"; known: {}",
                        MECHANISMS.join(", ")
                    ),
                };
                dec.push(Severity::Error, pos, &field, msg, sugg.map(str::to_string));
            }
        }
    }
}

fn decode_fallbacks(n: &N, dec: &mut Dec) -> Vec<Fallback> {
    let V::Seq(items) = &n.v else {
        dec.mismatch(n, "allow_fallbacks", "a list of {when, substitute} entries");
        return Vec::new();
    };
    let mut out = Vec::new();
    for (i, it) in items.iter().enumerate() {
        let path = format!("allow_fallbacks[{i}]");
        let Some(f) = dec.fields(it, &path, &["when", "substitute"]) else {
            continue;
        };
        let when = match f.get("when") {
            Some(w) => dec.string(w, &f.path("when")).and_then(|s| {
                if cond_name_ok(&s) {
                    Some(s)
                } else {
                    dec.err(
                        w.pos,
                        &f.path("when"),
                        format!(
                            "{}: \"{s}\" is not a condition name (lower-case letters, digits, '_')",
                            f.path("when")
                        ),
                    );
                    None
                }
            }),
            None => {
                dec.err(
                    it.pos,
                    &f.path("when"),
                    format!("{path}: missing field \"when\""),
                );
                None
            }
        };
        let sub = match f.get("substitute") {
            Some(s) => {
                let sp = f.path("substitute");
                dec.fields(s, &sp, &["model", "embed_store", "placement", "provider", "redact"]).map(|sf| {
                    let mut sub = Substitute::default();
                    if let Some(x) = sf.get("model")
                        && let Some(v) = dec.string(x, &sf.path("model"))
                    {
                        match check_model_name(&v) {
                            Ok(()) => sub.model = Some(v),
                            Err(e) => dec.err(x.pos, &sf.path("model"), format!("{}: {e}", sf.path("model"))),
                        }
                    }
                    for (key, out) in [("embed_store", &mut sub.embed_store), ("placement", &mut sub.placement), ("provider", &mut sub.provider)] {
                        if let Some(x) = sf.get(key) {
                            *out = dec.string(x, &sf.path(key));
                        }
                    }
                    if let Some(x) = sf.get("redact") {
                        sub.redact = dec.boolean(x, &sf.path("redact")).unwrap_or(false);
                    }
                    if sub.model.is_none() && sub.embed_store.is_none() && sub.placement.is_none() && sub.provider.is_none() && !dec.has_errors() {
                        dec.err(s.pos, &sp, format!("{sp}: substitutes nothing; give model, embed_store, placement or provider"));
                    }
                    sub
                })
            }
            None => {
                dec.err(
                    it.pos,
                    &f.path("substitute"),
                    format!("{path}: missing field \"substitute\""),
                );
                None
            }
        };
        if let (Some(when), Some(substitute)) = (when, sub) {
            out.push(Fallback { when, substitute });
        }
    }
    out
}
