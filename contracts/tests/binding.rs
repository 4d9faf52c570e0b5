//! Binding modes, rejections listing every failed `must`, sealed manifests, layering.

use std::collections::BTreeSet;
use std::path::PathBuf;

use contracts::*;

fn load(name: &str) -> Contract {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/contracts")
        .join(name);
    load_contract(&p).unwrap_or_else(|e| panic!("{e}"))
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

fn mechs(items: &[&str]) -> BTreeSet<Mechanism> {
    items
        .iter()
        .map(|s| Mechanism::from_name(s).expect("known mechanism"))
        .collect()
}

fn edge_host() -> HostOffer {
    HostOffer {
        mechanisms: mechs(&[
            "sched_deadline",
            "cgroup.cpu",
            "cgroup.memory",
            "cgroup.pids",
            "landlock",
        ]),
        models: set(&[
            "on_device_kwd_v3",
            "asr_local_v2",
            "asr_local_v3",
            "asr_local_v4",
            "llm_cloud_70B",
        ]),
        placements: set(&["edge"]),
        embed_stores: set(&["vecdb_B"]),
        ..Default::default()
    }
}

#[test]
fn strict_binding_seals_a_manifest() {
    let c = load("safety-kill-switch.yaml");
    let m = bind(&c, &edge_host()).unwrap();
    assert_eq!(m.mode, BindingMode::Strict);
    assert_eq!(m.model.as_deref(), Some("on_device_kwd_v3"));
    assert_eq!(m.placement.as_deref(), Some("edge"));
    assert_eq!(m.deadline.map(|d| d.deadline_ns), Some(10_000_000));
    assert_eq!(m.mechanisms, [Mechanism::SchedDeadline]);
    assert_eq!(m.contract_sha256, c.sha256());
    assert_eq!(m.sha256.len(), 64);
    assert!(m.verify());
    // the hash covers the content
    let mut tampered = m.clone();
    tampered.model = Some("other".into());
    assert!(!tampered.verify());
    // same inputs, same manifest
    assert_eq!(bind(&c, &edge_host()).unwrap().sha256, m.sha256);
    let sealed: serde_json::Value = serde_json::from_str(&m.sealed_json()).unwrap();
    assert_eq!(sealed["sha256"], m.sha256.as_str());
}

#[test]
fn strict_rejection_lists_every_failed_must() {
    let c = load("safety-kill-switch.yaml");
    let host = HostOffer {
        mechanisms: mechs(&["cgroup.cpu"]),
        models: set(&["on_device_kwd_v2"]),
        placements: set(&["edge", "cloud"]),
        ..Default::default()
    };
    let r = bind(&c, &host).unwrap_err();
    let reqs: Vec<&str> = r.failures.iter().map(|f| f.requirement.as_str()).collect();
    assert_eq!(reqs, ["class.latency", "must.model", "must.placement"]);
    assert_eq!(
        r.to_string(),
        "cannot bind default/safety-kill-switch (strict binding): \
         class.latency: latency class HRT needs SCHED_DEADLINE, and this host does not offer \"sched_deadline\"; \
         must.model: none of on_device_kwd_v3 is available (host offers: on_device_kwd_v2); \
         must.placement: requires edge-only, host placement is cloud, edge"
    );
}

#[test]
fn smooth_upgrades_and_flexible_substitutes() {
    let c = load("speech-copilot.yaml");
    assert_eq!(c.binding_mode(), BindingMode::Flexible);
    // no condition in force: the range resolves to the highest available version
    let m = bind(&c, &edge_host()).unwrap();
    assert_eq!(m.model.as_deref(), Some("asr_local_v3"));
    assert_eq!(m.embed_store.as_deref(), Some("vecdb_B"));
    assert_eq!(m.placement.as_deref(), Some("edge"));
    assert!(
        m.decisions
            .iter()
            .any(|d| d.action == "upgraded" && d.value.as_deref() == Some("asr_local_v3"))
    );
    assert!(!m.redact);
    // bandwidth_low: substitute the local v2 model
    let mut host = edge_host();
    host.conditions = set(&["bandwidth_low"]);
    let m = bind(&c, &host).unwrap();
    assert_eq!(m.model.as_deref(), Some("asr_local_v2"));
    let d = m
        .decisions
        .iter()
        .find(|d| d.action == "substituted")
        .unwrap();
    assert_eq!(d.reason, "allow_fallbacks when bandwidth_low");
    // context_exceeds_local: the cloud model, with redaction
    host.conditions = set(&["context_exceeds_local"]);
    let m = bind(&c, &host).unwrap();
    assert_eq!(m.model.as_deref(), Some("llm_cloud_70B"));
    assert!(m.redact);
    // a placement the contract forbids
    host.placements = set(&["cloud"]);
    let r = bind(&c, &host).unwrap_err();
    assert_eq!(r.failures[0].requirement, "must.placement");
}

#[test]
fn preferences_per_mode() {
    let text = "name: p\nprefer: { model: [\"asr_local_v2..v3\"] }\nbinding: {}\n";
    let host = HostOffer {
        models: set(&["asr_local_v3"]),
        ..Default::default()
    };
    let smooth = parse_contract(&text.replace("{}", "smooth"), "s").unwrap();
    assert_eq!(
        bind(&smooth, &host).unwrap().model.as_deref(),
        Some("asr_local_v3")
    );
    // strict pins the lowest version of a range and rejects when it is missing
    let strict = parse_contract(&text.replace("{}", "strict"), "s").unwrap();
    let r = bind(&strict, &host).unwrap_err();
    assert_eq!(r.failures[0].requirement, "prefer.model");
    // smooth records an unsatisfied preference instead
    let none = HostOffer::default();
    let m = bind(&smooth, &none).unwrap();
    assert_eq!(m.model, None);
    assert_eq!(m.decisions[0].action, "unsatisfied");
}

#[test]
fn budgets_marked_must_need_the_controllers() {
    let c = load("batch-sweep.yaml");
    let r = bind(&c, &HostOffer::default()).unwrap_err();
    let reqs: Vec<&str> = r.failures.iter().map(|f| f.requirement.as_str()).collect();
    assert_eq!(reqs, ["compute.must", "compute.must", "compute.must"]);
    let host = HostOffer {
        mechanisms: mechs(&["cgroup.cpu", "cgroup.memory", "cgroup.pids"]),
        ..Default::default()
    };
    let m = bind(&c, &host).unwrap();
    assert_eq!(
        m.mechanisms,
        [
            Mechanism::CgroupCpu,
            Mechanism::CgroupMemory,
            Mechanism::CgroupPids
        ]
    );
    let sealed: serde_json::Value = serde_json::from_str(&m.sealed_json()).unwrap();
    assert_eq!(
        sealed["mechanisms"],
        serde_json::json!(["cgroup.cpu", "cgroup.memory", "cgroup.pids"])
    );
}

#[test]
fn hrt_admission_in_binding() {
    let c = load("control-loop-hrt.yaml");
    let mut host = edge_host();
    host.mechanisms.insert(Mechanism::CgroupCpuset);
    let mut adm = AdmissionSet::new([0, 1], AdmissionConfig::default());
    assert!(bind_admitted(&c, &host, &adm).is_ok());
    let d = c.deadline().unwrap();
    assert_eq!(adm.admit("demo/control-loop", d, c.cpuset()), Ok(1));
    // CPU 1 now holds 0.2; four more fit (1.0 > 0.95 fails at the fifth)
    for i in 0..3 {
        adm.admit(&format!("other{i}"), d, &[1]).unwrap();
    }
    let r = bind_admitted(&c, &host, &adm).unwrap_err();
    assert_eq!(r.failures[0].requirement, "class.slo.deadline_ms");
    assert!(
        r.failures[0].reason.starts_with(
            "does not fit on CPU 1: utilisation 0.800 + 0.200 = 1.000 exceeds the bound 0.950"
        ),
        "{}",
        r.failures[0].reason
    );
}

#[test]
fn layering_merges_with_precedence_and_positions() {
    let platform = "compute: { cpu: \"1\", mem: 1GiB, pids: 100 }\nrestart: on-failure\nsecurity: { deny: [payment.charge] }\n";
    let tenant =
        "tenant: acme\ncompute: { mem: 512MiB }\nsecurity: { consent_for: [email.send] }\n";
    let role = "name: summarizer\nlatency_class: SRT\ncapabilities: [summarize, email.send]\n";
    let request = "agent: summarizer-42\ncompute: { cpu: 500m }\nsecurity: { consent_for: [] }\n";
    let c = parse_layered(&[
        LayerSource {
            kind: LayerKind::Request,
            origin: "request.yaml",
            text: request,
        },
        LayerSource {
            kind: LayerKind::Platform,
            origin: "platform.yaml",
            text: platform,
        },
        LayerSource {
            kind: LayerKind::Role,
            origin: "role.yaml",
            text: role,
        },
        LayerSource {
            kind: LayerKind::Tenant,
            origin: "tenant.yaml",
            text: tenant,
        },
    ])
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.name(), "summarizer-42");
    assert_eq!(c.tenant(), "acme");
    assert_eq!(c.latency_class(), Some(LatencyClass::Srt));
    assert_eq!(c.budgets().cpu_millis, Some(500));
    assert_eq!(c.budgets().memory_bytes, Some(512 << 20));
    assert_eq!(c.budgets().pids, Some(100));
    assert_eq!(c.restart().policy, RestartPolicy::OnFailure);
    // consent and deny lists are unions: the request's empty list does not drop the tenant's
    assert_eq!(c.security().consent_for, ["email.send"]);
    assert_eq!(c.security().deny, ["payment.charge"]);

    // an error in one layer points into that layer's file
    let bad_request = "compute: { cpu: lots }\ncapabilities: [payment.charge]\n";
    let e = parse_layered(&[
        LayerSource {
            kind: LayerKind::Request,
            origin: "request.yaml",
            text: bad_request,
        },
        LayerSource {
            kind: LayerKind::Role,
            origin: "role.yaml",
            text: role,
        },
        LayerSource {
            kind: LayerKind::Platform,
            origin: "platform.yaml",
            text: "nmae: x\n",
        },
    ])
    .unwrap_err();
    let lines: Vec<String> = e.diagnostics.iter().map(|d| d.to_string()).collect();
    assert_eq!(
        lines,
        [
            "platform.yaml:1:1: unknown field \"nmae\" in the contract (did you mean \"name\"?)",
            "request.yaml:1:17: compute.cpu: cpu \"lots\" is not a CPU quantity (write \"1\", \"0.5\" or \"500m\")",
        ]
    );
}

#[test]
fn host_offer_from_json_and_must_mechanisms() {
    let offer: HostOffer = serde_json::from_str(
        r#"{"mechanisms": ["cgroup.cpu", "landlock"], "placements": ["on-prem"], "models": []}"#,
    )
    .unwrap();
    assert_eq!(offer.mechanisms, mechs(&["cgroup.cpu", "landlock"]));
    assert!(serde_json::from_str::<HostOffer>(r#"{"mechanisms": ["landlok"]}"#).is_err());
    assert!(serde_json::from_str::<HostOffer>(r#"{"gpus": 1}"#).is_err());
    for m in Mechanism::ALL {
        assert_eq!(Mechanism::from_name(m.as_str()), Some(m));
        assert_eq!(serde_json::to_value(m).unwrap(), m.as_str());
    }
    let c = parse_contract(
        "name: x\nmust: { mechanisms: [landlock, seccomp] }\n",
        "m.yaml",
    )
    .unwrap();
    assert_eq!(
        c.must().mechanisms,
        [Mechanism::Landlock, Mechanism::Seccomp]
    );
    let r = bind(&c, &offer).unwrap_err();
    assert_eq!(
        r.to_string(),
        "cannot bind default/x (smooth binding): must.mechanisms: listed in must.mechanisms, and this host does not offer \"seccomp\""
    );
    let e = parse_contract("name: x\nmust: { mechanisms: [landlok] }\n", "m.yaml").unwrap_err();
    assert_eq!(
        e.to_string(),
        "m.yaml:2:22: must.mechanisms: unknown mechanism \"landlok\" (did you mean \"landlock\"?)"
    );
}
