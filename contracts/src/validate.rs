//! Semantic checks that run once a contract decodes: time relations, class rules,
//! capability/consent consistency.

use crate::capability;
use crate::decode::Dec;
use crate::model::{Contract, LatencyClass};
use crate::node::Pos;
use crate::units::format_ms;

/// The kernel's smallest SCHED_DEADLINE runtime (2^DL_SCALE ns).
pub const MIN_RUNTIME_NS: u64 = 1024;

fn pos(dec: &Dec, field: &str, fallback: Pos) -> Pos {
    dec.spans.get(field).copied().unwrap_or(fallback)
}

pub(crate) fn check(c: &mut Contract, dec: &mut Dec, root: Pos) {
    let slo = c.class.slo.clone();
    let class_pos = pos(dec, "class.latency", pos(dec, "class", root));
    let hrt_fields = [
        ("deadline_ms", slo.deadline_ns),
        ("runtime_ms", slo.runtime_ns),
        ("period_ms", slo.period_ns),
        ("jitter_ms", slo.jitter_ns),
    ];
    let srt_fields = [
        ("onset_ms", slo.onset_ns),
        ("turn_ms", slo.turn_ns),
        ("jitter_p95_pct", slo.jitter_p95_pct),
    ];
    match c.class.latency {
        Some(LatencyClass::Hrt) => {
            for (k, v) in srt_fields {
                if v.is_some() {
                    let f = format!("class.slo.{k}");
                    dec.err(pos(dec, &f, class_pos), &f, format!("{f}: applies to SRT and DT contracts; HRT contracts use deadline_ms, runtime_ms, period_ms and jitter_ms"));
                }
            }
            let deadline = match (slo.deadline_ns, c.must.deadline_ns) {
                (Some(a), Some(b)) if a != b => {
                    let f = "must.deadline_ms";
                    dec.err(pos(dec, f, class_pos), f, format!("must.deadline_ms ({}) differs from class.slo.deadline_ms ({}); they are the same deadline: keep one or make them equal", format_ms(b), format_ms(a)));
                    None
                }
                (a, b) => a.or(b),
            };
            let Some(deadline) = deadline else {
                if slo.deadline_ns.is_none() && c.must.deadline_ns.is_none() {
                    dec.err(class_pos, "class.latency", "class.latency: HRT contracts need a deadline: add class.slo.deadline_ms (or must.deadline_ms)");
                }
                return;
            };
            let runtime = slo.runtime_ns.unwrap_or(deadline / 2);
            let period = slo.period_ns.unwrap_or(deadline);
            if let Some(r) = slo.runtime_ns {
                let f = "class.slo.runtime_ms";
                if r > deadline {
                    dec.err(pos(dec, f, class_pos), f, format!("class.slo.runtime_ms ({}) exceeds the deadline ({} ms); SCHED_DEADLINE needs runtime <= deadline <= period", format_ms(r), format_ms(deadline)));
                } else if r < MIN_RUNTIME_NS {
                    dec.err(pos(dec, f, class_pos), f, format!("class.slo.runtime_ms ({}) is below the kernel's minimum runtime of 1024 ns", format_ms(r)));
                }
            } else if runtime < MIN_RUNTIME_NS {
                let f = "class.slo.deadline_ms";
                dec.err(pos(dec, f, class_pos), f, format!("{f}: the default runtime (half the deadline, {} ms) is below the kernel's minimum of 1024 ns; set runtime_ms", format_ms(runtime)));
            }
            if let Some(p) = slo.period_ns
                && p < deadline
            {
                let f = "class.slo.period_ms";
                dec.err(pos(dec, f, class_pos), f, format!("class.slo.period_ms ({}) is shorter than the deadline ({} ms); SCHED_DEADLINE needs runtime <= deadline <= period", format_ms(p), format_ms(deadline)));
            }
            let _ = period;
            if let Some(j) = slo.jitter_ns
                && j > deadline
            {
                let f = "class.slo.jitter_ms";
                dec.err(
                    pos(dec, f, class_pos),
                    f,
                    format!(
                        "class.slo.jitter_ms ({}) exceeds the deadline ({} ms)",
                        format_ms(j),
                        format_ms(deadline)
                    ),
                );
            }
        }
        other => {
            for (k, v) in hrt_fields {
                if v.is_some() {
                    let f = format!("class.slo.{k}");
                    let msg = match other {
                        Some(l) => format!("{f}: applies to HRT contracts, this one is {l}"),
                        None => format!("{f}: applies to HRT contracts; set class.latency: HRT"),
                    };
                    dec.err(pos(dec, &f, class_pos), &f, msg);
                }
            }
            if c.must.deadline_ns.is_some() {
                let f = "must.deadline_ms";
                dec.err(pos(dec, f, root), f, "must.deadline_ms: applies to HRT contracts; set class.latency: HRT (latency_class: HRT)");
            }
            if other.is_none()
                && slo != Default::default()
                && hrt_fields.iter().all(|(_, v)| v.is_none())
            {
                let f = "class.slo";
                dec.err(
                    pos(dec, f, root),
                    f,
                    "class.slo: SLOs need a latency class; add class.latency",
                );
            }
            if let (Some(o), Some(t)) = (slo.onset_ns, slo.turn_ns)
                && o > t
            {
                let f = "class.slo.onset_ms";
                dec.err(pos(dec, f, class_pos), f, format!("class.slo.onset_ms ({}) exceeds class.slo.turn_ms ({}); the first token cannot come after the full turn", format_ms(o), format_ms(t)));
            }
        }
    }

    // compute
    if let (Some(h), Some(m)) = (c.compute.mem_high_bytes, c.compute.mem_bytes)
        && h > m
    {
        let f = "compute.mem_high";
        dec.err(pos(dec, f, root), f, format!("compute.mem_high ({}) exceeds compute.mem ({}); mem_high is the throttling threshold below the hard limit", crate::units::format_memory(h), crate::units::format_memory(m)));
    }

    // capabilities and security
    let granted: Vec<String> = c.capabilities.iter().map(|x| x.name.clone()).collect();
    for (i, name) in c.security.consent_for.clone().iter().enumerate() {
        // `model:NAME` holds calls of a model at the gateway (modelPolicy), not a capability.
        if name.starts_with("model:") {
            continue;
        }
        if !granted.contains(name) {
            let f = format!("security.consent_for[{i}]");
            dec.warn(pos(dec, &f, root), &f, format!("\"{name}\" is in security.consent_for but not granted in capabilities: it stays blocked unless an operator consents to each use (grant it in capabilities to give it a scope)"));
        }
    }
    for (i, name) in c.security.deny.clone().iter().enumerate() {
        if granted.contains(name) {
            let f = format!("security.deny[{i}]");
            dec.err(
                pos(dec, &format!("capability:{name}"), root),
                &f,
                format!(
                    "capability \"{name}\" is granted in capabilities and denied in security.deny"
                ),
            );
        }
    }
    for cap in &c.capabilities {
        if capability::lookup(&cap.name).is_some_and(|i| i.high_risk)
            && !c.security.consent_for.contains(&cap.name)
        {
            let f = format!("capability:{}", cap.name);
            dec.warn(pos(dec, &f, root), "capabilities", format!("\"{}\" is high-risk; list it in security.consent_for to hold each use for operator consent", cap.name));
        }
    }
    // model policy vs must/prefer
    for (field, list) in [
        ("must.model", c.must.model.clone()),
        ("prefer.model", c.prefer.model.clone()),
    ] {
        for m in list {
            if c.model_policy.deny.contains(&m) {
                dec.err(
                    pos(dec, field, root),
                    field,
                    format!("{field}: \"{m}\" is denied by modelPolicy.deny"),
                );
            }
        }
    }
}
