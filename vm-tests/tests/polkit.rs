//! agentosd asks polkit where it runs (`--polkit auto`, the default; polkitd is in the guest
//! image): the shipped rules (`units/50-org.agentos1.rules`) give group `agentos` read access,
//! and an administrator's rule in `/etc/polkit-1/rules.d` scoped by the `tenant` detail gives an
//! operator group the management of one tenant's agents. Each verb is tried by root, a member of
//! `agentos`, a member of the tenant-scoped group, and an unrelated user; the built-in rules
//! would refuse the scoped operator's stop, so its success shows polkit decided.

use std::time::Duration;

use vm_tests::{Agent, Out, agentctl, cmd, require_vm, wait_for, write_contract};

const RULE: &str = r#"polkit.addRule(function(action, subject) {
    var t = action.lookup("tenant");
    if (action.id == "org.agentos1.manage-agents" && subject.isInGroup("vmt-acme-ops") &&
        (t == "acme" || t == "*")) {
        return polkit.Result.YES;
    }
});
"#;

/// `agentctl ARGS` as `user` (runuser: no password, no PAM session needed).
fn agentctl_as(user: &str, args: &[&str]) -> Out {
    let mut a = vec!["-u", user, "--", "agentctl"];
    a.extend_from_slice(args);
    cmd("runuser", &a)
}

fn contract(tenant: &str, name: &str) -> std::path::PathBuf {
    write_contract(
        &format!("{tenant}-{name}"),
        &format!(
            "apiVersion: agentos/v0.2\nkind: AgentContract\nname: {name}\ntenant: {tenant}\nclass: {{ latency: DT }}\nexec: {{ command: /bin/sleep, args: [\"600\"] }}\nrestart: {{ policy: \"no\" }}\n"
        ),
    )
}

fn user(name: &str, groups: &str) {
    let _ = cmd("userdel", &[name]);
    let mut args = vec!["--system", "--no-create-home", "--shell", "/bin/sh"];
    if !groups.is_empty() {
        args.extend_from_slice(&["--groups", groups]);
    }
    args.push(name);
    cmd("useradd", &args).ok();
}

#[test]
#[ignore = "needs the guest VM: run `cargo xtask vm test`"]
fn polkit_decides_each_verb_for_each_kind_of_caller() {
    require_vm();
    // The daemon's whole journal of this boot, not its last lines: the tests before this one
    // (in whichever guest the suite put it) log far more than a fixed tail. Its latest start
    // says how it authorizes.
    let journal = cmd(
        "journalctl",
        &["-u", "agentosd", "--no-pager", "-b", "-o", "cat"],
    );
    let said = journal
        .stdout
        .lines()
        .rev()
        .find(|l| l.contains("authorization: "));
    assert!(
        said.is_some_and(|l| l.contains("authorization: polkit")),
        "agentosd's latest start does not say it asks polkit (it said {said:?}); \
         journalctl exit {:?}, {} bytes",
        journal.code,
        journal.stdout.len()
    );
    let _ = cmd("groupadd", &["--system", "vmt-acme-ops"]);
    user("vmt-reader", "agentos");
    user("vmt-acme", "agentos,vmt-acme-ops");
    user("vmt-stranger", "");
    std::fs::create_dir_all("/etc/polkit-1/rules.d").unwrap();
    std::fs::write("/etc/polkit-1/rules.d/40-agentos-vmtest.rules", RULE).unwrap();

    let acme = Agent::start("acme/x", &contract("acme", "x"));
    let other = Agent::start("other/y", &contract("other", "y"));
    acme.wait_state("running", Duration::from_secs(30));
    other.wait_state("running", Duration::from_secs(30));

    // read: root, agentos members (shipped rule); a stranger is refused (by the bus policy,
    // and by agentosd if a looser bus policy let it through).
    assert!(agentctl(&["list"]).success());
    for u in ["vmt-reader", "vmt-acme"] {
        let l = agentctl_as(u, &["list"]);
        assert!(
            l.success() && l.stdout.contains("acme/x") && l.stdout.contains("other/y"),
            "{u} list: {l}"
        );
        let s = agentctl_as(u, &["status", "other/y"]);
        assert!(s.success(), "{u} status: {s}");
    }
    let s = agentctl_as("vmt-stranger", &["list"]);
    assert!(!s.success() && s.stderr.contains("AccessDenied"), "{s}");

    // manage-agents: the reader may not stop anything; the acme operator may stop acme's agent
    // (only polkit's rule grants that) but not another tenant's.
    let r = agentctl_as("vmt-reader", &["stop", "acme/x"]);
    assert!(
        !r.success() && r.stderr.contains("org.agentos1.manage-agents"),
        "{r}"
    );
    let r = agentctl_as("vmt-acme", &["stop", "other/y"]);
    assert!(!r.success() && r.stderr.contains("AccessDenied"), "{r}");
    assert_eq!(vm_tests::state_of(&other.status()), "running");
    // polkitd reads a new rules file when it sees it change (inotify): allow it a moment.
    wait_for(
        "the acme operator's stop of acme/x (polkit's rule)",
        Duration::from_secs(20),
        || {
            agentctl_as("vmt-acme", &["stop", "acme/x"])
                .success()
                .then_some(())
        },
    );
    acme.wait_states(&["stopped", "exited", "inactive"], Duration::from_secs(30));

    // answer-consent: nobody but root here (no rule grants it); an unknown id is daemon-wide.
    let r = agentctl_as("vmt-acme", &["consent", "deny", "999999"]);
    assert!(!r.success() && r.stderr.contains("AccessDenied"), "{r}");

    // Every refusal is on the record with its caller.
    let audit = agentctl(&["audit", "show", "--json"]).ok();
    let refused: Vec<serde_json::Value> = audit
        .stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .filter(|r: &serde_json::Value| r["detail"]["event"] == "refused-call")
        .collect();
    assert!(
        refused.len() >= 3,
        "refused calls on the record: {refused:#?}"
    );
    let _ = std::fs::remove_file("/etc/polkit-1/rules.d/40-agentos-vmtest.rules");
    drop(other);
}
