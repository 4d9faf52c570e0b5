//! The paper's examples and the runnable examples parse into the expected values.

use std::path::PathBuf;

use contracts::*;

fn load(name: &str) -> Contract {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/contracts")
        .join(name);
    load_contract(&p).unwrap_or_else(|e| panic!("{e}"))
}

const MS: u64 = 1_000_000;

#[test]
fn canonical_paper_example() {
    let c = load("doc-rag-planner.yaml");
    assert_eq!(c.name(), "doc-rag-planner");
    assert_eq!(c.tenant(), "default");
    assert_eq!(c.api_version(), "agentos/v0.2");
    assert_eq!(c.latency_class(), Some(LatencyClass::Srt));
    assert_eq!(c.slo().onset_ns, Some(250 * MS));
    assert_eq!(c.slo().turn_ns, Some(1000 * MS));
    assert_eq!(c.slo().jitter_p95_pct, Some(20));
    let names: Vec<&str> = c.capabilities().iter().map(|x| x.name.as_str()).collect();
    assert_eq!(names, ["web.fetch", "fs.read", "summarize"]);
    let fs = c.capability("fs.read").unwrap();
    assert_eq!(fs.kind, CapabilityKind::Filesystem);
    assert!(fs.default_scope);
    assert_eq!(fs.scope, ["{state}"]);
    assert_eq!(
        fs.expand_scope(std::path::Path::new("/var/lib/agentos/agents/x")),
        ["/var/lib/agentos/agents/x"]
    );
    assert_eq!(
        c.budgets(),
        Budgets {
            cpu_millis: Some(1000),
            memory_bytes: Some(2 << 30),
            memory_high_bytes: None,
            pids: None,
            io: vec![],
            disk_bytes: None,
            disk_inodes: None,
            must: false
        }
    );
    assert_eq!(c.model_policy().allow, ["local/8B", "cloud/70B"]);
    assert_eq!(c.model_policy().max_context_tokens, Some(16000));
    assert_eq!(c.memory().namespace.as_deref(), Some("city-planning"));
    assert_eq!(c.memory().retention_days, Some(30));
    assert_eq!(
        c.memory().rag,
        Some(Rag {
            top_k: Some(8),
            require_grounding: true
        })
    );
    assert_eq!(c.security().consent_for, ["fs.write", "payment.charge"]);
    assert!(c.consent_required("payment.charge"));
    assert_eq!(c.observability().tracing.as_deref(), Some("opentelemetry"));
    assert_eq!(c.observability().log_fields, ["prompt", "sources"]);
    assert_eq!(c.exec(), None);
    assert_eq!(c.deadline(), None);
    assert_eq!(
        c.restart(),
        RestartSpec {
            policy: RestartPolicy::No,
            limit: 5,
            backoff_ms: 100,
            max_backoff_ms: 30_000
        }
    );
    assert_eq!(c.binding_mode(), BindingMode::Smooth);
    // consent_for lists capabilities that are not granted: warnings with positions
    let w: Vec<String> = c
        .warnings()
        .iter()
        .map(|d| format!("{}:{}", d.line, d.column))
        .collect();
    assert_eq!(w, ["10:27", "10:38"]);
    assert!(c.warnings().iter().all(|d| d.severity == Severity::Warning));
    assert_eq!(
        c.summary(),
        "doc-rag-planner (tenant default, SRT, 3 capabilities, cpu 1, mem 2GiB, no exec)"
    );
}

#[test]
fn hrt_variant() {
    let c = load("doc-rag-planner-hrt.yaml");
    assert_eq!(c.latency_class(), Some(LatencyClass::Hrt));
    assert_eq!(c.slo().jitter_ns, Some(5 * MS));
    // runtime defaults to half the deadline, period to the deadline
    assert_eq!(
        c.deadline(),
        Some(DeadlineParams {
            runtime_ns: 5 * MS,
            deadline_ns: 10 * MS,
            period_ns: 10 * MS
        })
    );
    assert_eq!(c.binding_mode(), BindingMode::Strict);
}

#[test]
fn safety_kill_switch() {
    let c = load("safety-kill-switch.yaml");
    assert_eq!(c.name(), "safety-kill-switch");
    assert_eq!(c.latency_class(), Some(LatencyClass::Hrt));
    assert_eq!(c.must().model, ["on_device_kwd_v3"]);
    assert_eq!(c.must().placement, ["edge-only"]);
    assert_eq!(c.must().deadline_ns, Some(10 * MS));
    assert_eq!(c.deadline().map(|d| d.deadline_ns), Some(10 * MS));
    let names: Vec<&str> = c.capabilities().iter().map(|x| x.name.as_str()).collect();
    assert_eq!(names, ["audio.detect_keyword", "agent.pause"]);
    assert_eq!(c.binding_mode(), BindingMode::Strict);
    assert!(c.warnings().is_empty());
}

#[test]
fn speech_copilot() {
    let c = load("speech-copilot.yaml");
    assert_eq!(c.name(), "speech-copilot");
    assert_eq!(c.latency_class(), Some(LatencyClass::Srt));
    assert_eq!(c.must().placement, ["on-prem", "edge"]);
    assert_eq!(c.prefer().model, ["asr_local_v2..v3", "asr_cloud_v2"]);
    assert_eq!(c.prefer().embed_store, ["vecdb_A", "vecdb_B"]);
    assert_eq!(c.allow_fallbacks().len(), 2);
    assert_eq!(c.allow_fallbacks()[0].when, "bandwidth_low");
    assert_eq!(
        c.allow_fallbacks()[0].substitute.model.as_deref(),
        Some("asr_local_v2")
    );
    assert_eq!(
        c.allow_fallbacks()[1].substitute,
        Substitute {
            model: Some("llm_cloud_70B".into()),
            redact: true,
            ..Default::default()
        }
    );
    assert_eq!(c.binding_mode(), BindingMode::Flexible);
}

#[test]
fn runnable_examples() {
    let c = load("hello-agent.yaml");
    assert_eq!(c.tenant(), "demo");
    let e = c.exec().unwrap();
    assert_eq!(e.command, "/bin/sh");
    assert_eq!(e.args, ["-c", "while true; do echo tick; sleep 1; done"]);
    assert_eq!(e.env.get("LANG").map(String::as_str), Some("C.UTF-8"));
    assert_eq!(
        e.working_directory.as_deref(),
        Some(std::path::Path::new("/"))
    );
    assert_eq!(
        c.restart(),
        RestartSpec {
            policy: RestartPolicy::OnFailure,
            limit: 5,
            backoff_ms: 200,
            max_backoff_ms: 10_000
        }
    );
    assert_eq!(c.budgets().cpu_millis, Some(250));
    assert_eq!(c.budgets().memory_high_bytes, Some(48 << 20));
    assert_eq!(c.budgets().pids, Some(16));
    assert_eq!(
        c.capability("fs.read").unwrap().scope,
        ["/usr", "/bin", "/lib", "/etc"]
    );

    let c = load("batch-sweep.yaml");
    assert_eq!(c.latency_class(), Some(LatencyClass::Dt));
    assert!(c.budgets().must);
    assert_eq!(c.usage_budgets().tokens, Some(2_000_000));
    assert_eq!(c.restart().policy, RestartPolicy::OnFailure);
    assert_eq!(c.exec().unwrap().args.len(), 2);

    let c = load("control-loop-hrt.yaml");
    assert_eq!(
        c.deadline(),
        Some(DeadlineParams {
            runtime_ns: 2 * MS,
            deadline_ns: 5 * MS,
            period_ns: 10 * MS
        })
    );
    assert_eq!(c.cpuset(), [1]);
    assert_eq!(c.restart().policy, RestartPolicy::Always);
    assert_eq!(c.restart().limit, 3);
}

#[test]
fn disk_budget_parses_as_a_size_and_a_count() {
    let c = parse_contract(
        "name: x\ncompute: { disk: 64MiB, disk_inodes: 1000, must: true }\n",
        "disk.yaml",
    )
    .unwrap();
    let b = c.budgets();
    assert_eq!(
        (b.disk_bytes, b.disk_inodes, b.must),
        (Some(64 << 20), Some(1000), true)
    );
    assert!(c.summary().contains("disk 64MiB"), "{}", c.summary());
    // A plain number of bytes, and no inode limit (the daemon's default applies).
    let c = parse_contract("name: x\ncompute: { disk: 1048576 }\n", "disk.yaml").unwrap();
    assert_eq!(
        (c.budgets().disk_bytes, c.budgets().disk_inodes),
        (Some(1 << 20), None)
    );
    // Without the field the canonical form (and so every existing contract's hash) is unchanged.
    let c = parse_contract("name: x\ncompute: { mem: 1GiB }\n", "a").unwrap();
    assert!(
        !c.to_canonical_json().contains("disk"),
        "{}",
        c.to_canonical_json()
    );
}

#[test]
fn io_limits_parse() {
    let c = parse_contract(
        "name: x\ncompute:\n  io:\n    - { device: /dev/vda, rbps: \"10MiB\", wiops: 200 }\n    - { device: \"7:0\", wbps: 1048576 }\n",
        "io.yaml",
    )
    .unwrap();
    let io = c.budgets().io;
    assert_eq!(
        io,
        vec![
            IoLimit {
                device: "/dev/vda".into(),
                rbps: Some(10 << 20),
                wbps: None,
                riops: None,
                wiops: Some(200),
            },
            IoLimit {
                device: "7:0".into(),
                wbps: Some(1 << 20),
                ..Default::default()
            },
        ]
    );
}

#[test]
fn both_styles_give_the_same_contract() {
    let a = parse_contract("agent: x\nlatency_class: SRT\n", "a").unwrap();
    let b = parse_contract("name: x\nclass: { latency: SRT }\n", "b").unwrap();
    assert_eq!(a, b);
    assert_eq!(a.to_canonical_json(), b.to_canonical_json());
    // equal values in both spellings are fine
    assert!(
        parse_contract(
            "name: x\nagent: x\nlatency_class: DT\nclass: {latency: DT}\n",
            "c"
        )
        .is_ok()
    );
}

#[test]
fn capability_forms() {
    let c = parse_contract(
        "name: x\ncapabilities:\n  fs.read: [/srv/docs/, /data]\n  net.connect: \"api.example.com:443\"\n  summarize: ~\n  tool.translate: [fr, de]\n",
        "m",
    )
    .unwrap();
    assert_eq!(
        c.capability("fs.read").unwrap().scope,
        ["/srv/docs", "/data"]
    );
    assert_eq!(
        c.capability("net.connect").unwrap().scope,
        ["api.example.com:443"]
    );
    assert!(c.capability("summarize").unwrap().default_scope);
    let t = c.capability("tool.translate").unwrap();
    assert_eq!(
        (t.kind, t.scope.clone()),
        (
            CapabilityKind::Tool,
            vec!["fr".to_string(), "de".to_string()]
        )
    );
    let c = parse_contract(
        "name: x\ncapabilities:\n  - net.bind\n  - net.connect: [\"*:443\", \"10.0.0.1:*\"]\n",
        "l",
    )
    .unwrap();
    assert_eq!(c.capability("net.bind").unwrap().scope, ["127.0.0.1:*"]);
    assert_eq!(
        c.capability("net.connect").unwrap().scope,
        ["*:443", "10.0.0.1:*"]
    );
}

#[test]
fn exec_argv_form_and_units() {
    let c = parse_contract(
        "name: x\nexec: [/bin/sleep, 10]\ncompute: { cpu: 0.5, mem: 1048576, mem_high: 512KiB }\nclass: {latency: HRT, slo: {deadline_ms: 2.5, runtime_ms: 0.5}}\n",
        "x",
    )
    .unwrap();
    assert_eq!(c.exec().unwrap().command, "/bin/sleep");
    assert_eq!(c.exec().unwrap().args, ["10"]);
    assert_eq!(c.budgets().cpu_millis, Some(500));
    assert_eq!(c.budgets().memory_bytes, Some(1 << 20));
    assert_eq!(c.budgets().memory_high_bytes, Some(512 << 10));
    assert_eq!(
        c.deadline(),
        Some(DeadlineParams {
            runtime_ns: 500_000,
            deadline_ns: 2_500_000,
            period_ns: 2_500_000
        })
    );
}

#[test]
fn canonical_json_is_stable() {
    let c = load("hello-agent.yaml");
    let j = c.to_canonical_json();
    assert!(
        j.starts_with("{\"allow_fallbacks\":[],\"apiVersion\":\"agentos/v0.2\""),
        "{j}"
    );
    assert!(
        !j.contains(' ') || j.contains("while true"),
        "no whitespace outside strings"
    );
    let v: serde_json::Value = serde_json::from_str(&j).unwrap();
    assert_eq!(v["exec"]["command"], "/bin/sh");
    assert_eq!(v["class"]["latency"], "SRT");
    assert_eq!(v["restart"]["policy"], "on-failure");
    assert_eq!(c.sha256().len(), 64);
    // reordering the YAML does not change the hash
    let a = parse_contract("name: x\ntenant: t\ncompute: {cpu: '1', mem: 1GiB}\n", "a").unwrap();
    let b = parse_contract("compute: {mem: 1GiB, cpu: 1}\ntenant: t\nname: x\n", "b").unwrap();
    assert_eq!(a.sha256(), b.sha256());
}

#[test]
fn contract_error_is_json_serializable() {
    let e = parse_contract("name: x\ncapabilities: [fs.reed]\n", "f.yaml").unwrap_err();
    let v = serde_json::to_value(&e).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"diagnostics": [{
            "file": "f.yaml", "line": 2, "column": 16, "field": "capabilities[0]",
            "message": "capabilities[0]: unknown capability \"fs.reed\" (did you mean \"fs.read\"?)",
            "suggestion": "fs.read", "severity": "error"
        }]})
    );
}
