use super::*;
use serde_json::json;

fn policy(yaml: &str) -> Policy {
    let c = contracts::parse_contract(yaml, "t.yaml").expect("contract parses");
    Policy::from_contract(&c)
}

const CONTRACT: &str = "apiVersion: agentos/v0.2
kind: AgentContract
name: gatekeeper
class: { latency: DT }
capabilities: [\"text.wordcount\", \"payment.charge\", \"files\"]
security: { consent_for: [\"payment.charge\"], deny: [\"web.fetch\"] }
";

#[test]
fn the_gate_allows_granted_holds_consented_and_refuses_the_rest() {
    let p = policy(CONTRACT);
    assert_eq!(decide(&p, Some("text.wordcount")), Ok(false));
    assert_eq!(decide(&p, Some("files")), Ok(false));
    assert_eq!(decide(&p, Some("payment.charge")), Ok(true));
    assert_eq!(decide(&p, Some("clock.now")), Err(Refused::NotGranted));
    assert_eq!(decide(&p, Some("web.fetch")), Err(Refused::Denied));
    assert_eq!(decide(&p, None), Err(Refused::UnknownTool));
}

#[test]
fn consent_without_a_grant_is_still_refused() {
    // consent_for only names a capability: it does not grant it.
    let p = policy(
        "apiVersion: agentos/v0.2
kind: AgentContract
name: asker
class: { latency: DT }
capabilities: []
security: { consent_for: [\"payment.charge\"] }
",
    );
    assert_eq!(decide(&p, Some("payment.charge")), Err(Refused::NotGranted));
}

#[test]
fn an_empty_policy_refuses_everything() {
    let p = Policy::default();
    assert_eq!(decide(&p, Some("text.wordcount")), Err(Refused::NotGranted));
}

#[test]
fn large_values_are_bounded_in_audit_records() {
    let small = json!({"text": "hello"});
    assert_eq!(bounded(small.clone(), 100), small);
    let big = json!({"text": "x".repeat(10_000)});
    let b = bounded(big.clone(), AUDIT_VALUE_MAX);
    assert_eq!(b["bytes"], big.to_string().len());
    assert_eq!(b["sha256"].as_str().unwrap().len(), 64);
    assert!(b.to_string().len() < 300, "{b}");
}
