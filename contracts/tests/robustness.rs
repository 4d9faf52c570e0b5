//! Malformed and hostile inputs give errors, never panics, and fast.

use std::time::{Duration, Instant};

use contracts::{ContractError, MAX_CONTRACT_BYTES, parse_contract};
use proptest::prelude::*;

fn errors(text: &str) -> ContractError {
    match parse_contract(text, "t.yaml") {
        Ok(c) => panic!("expected an error, got {c:?}"),
        Err(e) => e,
    }
}

fn first(text: &str) -> String {
    let e = errors(text);
    e.diagnostics[0].to_string()
}

#[test]
fn deep_flow_nesting() {
    let t = Instant::now();
    let text = format!(
        "name: x\ncompute: {}{}",
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    let msg = first(&text);
    println!("{msg}");
    assert!(msg.starts_with("t.yaml:2:"), "{msg}");
    assert!(t.elapsed() < Duration::from_secs(5));
}

#[test]
fn deep_block_nesting() {
    let mut text = String::from("name: x\nmemory:\n");
    for i in 0..200 {
        text.push_str(&" ".repeat(i + 1));
        text.push_str("a:\n");
    }
    let msg = first(&text);
    println!("{msg}");
    assert!(msg.contains("depth") || msg.contains("nest"), "{msg}");
}

#[test]
fn nesting_within_the_bound_is_a_schema_error() {
    let text = format!("name: x\nmemory: {}1{}\n", "[".repeat(20), "]".repeat(20));
    assert_eq!(
        first(&text),
        "t.yaml:2:9: memory: expected a mapping, found a list"
    );
}

#[test]
fn ten_megabytes() {
    let t = Instant::now();
    let mut text = String::from("name: big\ndescription: \"");
    text.push_str(&"x".repeat(10 << 20));
    text.push_str("\"\n");
    assert_eq!(
        first(&text),
        format!(
            "t.yaml:1:1: contract is {} bytes; the limit is {MAX_CONTRACT_BYTES} bytes (1 MiB)",
            text.len()
        )
    );
    assert!(t.elapsed() < Duration::from_secs(2));
}

#[test]
fn ten_megabyte_file() {
    let dir = std::env::temp_dir().join(format!("contracts-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("big.yaml");
    std::fs::write(&p, "#".repeat(10 << 20)).unwrap();
    let e = contracts::load_contract(&p).unwrap_err();
    assert!(
        e.to_string()
            .ends_with("contract is larger than the limit of 1048576 bytes (1 MiB)"),
        "{e}"
    );
    std::fs::write(&p, b"name: x\ndescription: \"\xff\"\n").unwrap();
    let e = contracts::load_contract(&p).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!("{}:2:15: contract is not valid UTF-8", p.display())
    );
    let e = contracts::load_contract(&dir.join("missing.yaml")).unwrap_err();
    assert!(e.to_string().contains(":0:0: cannot read: "), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn alias_bomb() {
    let mut text = String::from(
        "name: x\na0: &a0 [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n",
    );
    for i in 1..10 {
        let prev = i - 1;
        text.push_str(&format!("a{i}: &a{i} [*a{prev},*a{prev},*a{prev},*a{prev},*a{prev},*a{prev},*a{prev},*a{prev},*a{prev}]\n"));
    }
    let t = Instant::now();
    let msg = first(&text);
    println!("{msg}");
    assert!(t.elapsed() < Duration::from_secs(5));
}

#[test]
fn many_small_problems_are_all_reported() {
    let text = "name: x\ncompute: { cpu: \"lots\", mem: \"huge\", pids: -1 }\ncapabilities: [fs.reed, net.conect]\n";
    let e = errors(text);
    let lines: Vec<String> = e
        .diagnostics
        .iter()
        .map(|d| format!("{}:{}", d.line, d.column))
        .collect();
    assert_eq!(lines, ["2:17", "2:30", "2:44", "3:16", "3:25"]);
}

#[test]
fn odd_inputs() {
    for text in [
        "",
        "---\n",
        "~",
        "name: a\n---\nname: b\n",
        "name: [unclosed",
        "name: \"unterminated",
        ":",
        "? [a]\n: b\n",
        "name: !custom x",
        "\u{feff}name: 5",
        "name: x\nclass: {latency: HRT, slo: {deadline_ms: .nan}}\n",
        "name: x\nclass: {latency: HRT, slo: {deadline_ms: -1}}\n",
        "name: x\nclass: {latency: HRT, slo: {deadline_ms: 0.0000001}}\n",
        "name: x\ncompute: {cpu: 1e400}\n",
        "name: x\ncapabilities: [{a: 1, b: 2}]\n",
        "name: x\ncapabilities: {fs.read: []}\n",
        "name: x\nexec: []\n",
        "name: x\n\0",
    ] {
        let e = errors(text);
        assert!(!e.diagnostics.is_empty());
        for d in &e.diagnostics {
            assert!(d.line >= 1 && d.column >= 1, "{text:?}: {d}");
        }
    }
}

#[test]
fn merge_keys_and_anchors_work() {
    let c = parse_contract("base: &b {tenant: y}\n", "t.yaml");
    assert!(c.is_err(), "unknown top-level field");
    let c = parse_contract("name: x\n<<: {tenant: y}\n", "t.yaml").unwrap();
    assert_eq!(c.tenant(), "y");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_text_never_panics(s in "\\PC{0,200}") {
        let _ = parse_contract(&s, "p.yaml");
    }

    #[test]
    fn yamlish_text_never_panics(s in "[a-z_:\\-\\[\\]{}, \\n\"'0-9.&*!|>#]{0,300}") {
        if let Err(e) = parse_contract(&s, "p.yaml") {
            prop_assert!(!e.diagnostics.is_empty());
        }
    }

    #[test]
    fn mutated_examples_never_panic(idx in 0usize..4, pos in 0usize..600, byte in proptest::char::any()) {
        let texts = [
            include_str!("../../examples/contracts/doc-rag-planner.yaml"),
            include_str!("../../examples/contracts/safety-kill-switch.yaml"),
            include_str!("../../examples/contracts/speech-copilot.yaml"),
            include_str!("../../examples/contracts/hello-agent.yaml"),
        ];
        let t = texts[idx];
        let mut chars: Vec<char> = t.chars().collect();
        let p = pos % chars.len();
        chars[p] = byte;
        let s: String = chars.into_iter().collect();
        let _ = parse_contract(&s, "m.yaml");
        let cut: String = t.chars().take(p).collect();
        let _ = parse_contract(&cut, "m.yaml");
    }
}
