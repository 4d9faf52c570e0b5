//! The control plane's authorization (issue 14): a private bus running the SHIPPED
//! `units/org.agentos1.conf` policy, the daemon with `--authz` rules, and clients (agentctl and
//! dbus-send) run as root, an operator (member of the operator group), operators scoped to one
//! tenant, and an unrelated uid, each verb allowed or refused with the exact D-Bus error name.
//! Also: no byte of a root-only file reaches a caller (replies, audit trail, logs), every
//! lifecycle record names its caller, refusals are recorded, and an agent's escape sequences
//! reach no operator screen raw. Root only. No users or groups are created: clients run with
//! ids set in `pre_exec`. dbus-daemon drops connections of uids without a passwd entry, so the
//! clients use the base system's fixed uids (bin 2, sys 3, news 9, uucp 10: harmless short
//! lived clients) with numeric supplementary gids that need not exist; the operator group is
//! the host's `nogroup` (65534), which the bus policy can name.

#![allow(clippy::unwrap_used)]

mod common;

use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use common::{Bus, Daemon, TestCgroup};

/// The host group standing in for `agentos` (must exist so that dbus-daemon resolves it).
const OPS_GROUP: &str = "nogroup";
const OPS_GID: u32 = 65534;
/// Tenant operator groups (numeric, need not exist).
const ACME_GID: u32 = 61000;
const BETA_GID: u32 = 62000;

#[derive(Clone, Copy, Debug)]
struct Who {
    name: &'static str,
    uid: u32,
    gid: u32,
    groups: &'static [u32],
}

const ROOT: Who = Who {
    name: "root",
    uid: 0,
    gid: 0,
    groups: &[0],
};
const MEMBER: Who = Who {
    name: "member",
    uid: 2,
    gid: 2,
    groups: &[OPS_GID],
};
const ACME_OP: Who = Who {
    name: "acme-operator",
    uid: 3,
    gid: 3,
    groups: &[OPS_GID, ACME_GID],
};
const BETA_OP: Who = Who {
    name: "beta-operator",
    uid: 10,
    gid: 10,
    groups: &[OPS_GID, BETA_GID],
};
const STRANGER: Who = Who {
    name: "unrelated",
    uid: 9,
    gid: 9,
    groups: &[],
};

fn rules() -> Vec<String> {
    vec![
        format!("--authz=gid:{OPS_GID}=read,read-audit"),
        format!("--authz=gid:{ACME_GID}=manage-agents,answer-consent,read@acme"),
        format!("--authz=gid:{BETA_GID}=manage-agents,read@beta"),
    ]
}

/// Run `cmd` as `who` (setgroups, setresgid, setresuid in the child before exec).
fn run_as(who: Who, cmd: Command) -> Output {
    spawn_as(who, cmd).wait_with_output().expect("run client")
}

fn out_text(o: &Output) -> String {
    format!(
        "status {}\nstdout: {}\nstderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn ctl(bus: &str, who: Who, args: &[&str]) -> Output {
    let mut c = Command::new(common::agentctl_bin());
    c.arg("--bus-address").arg(bus).args(args);
    run_as(who, c)
}

/// dbus-send to the manager: `Ok(reply)` or `Err(error name)`.
fn call(bus: &str, who: Who, method: &str, args: &[&str]) -> Result<String, String> {
    let mut c = Command::new("dbus-send");
    c.arg(format!("--bus={bus}"))
        .args([
            "--print-reply",
            "--reply-timeout=20000",
            "--dest=org.agentos1",
            "/org/agentos1",
        ])
        .arg(format!("org.agentos1.Manager.{method}"))
        .args(args);
    let o = run_as(who, c);
    let text = out_text(&o);
    if o.status.success() {
        Ok(text)
    } else {
        // "Error org.agentos1.Error.AccessDenied: message"
        let err = String::from_utf8_lossy(&o.stderr);
        let name = err
            .split_whitespace()
            .skip_while(|w| *w != "Error")
            .nth(1)
            .unwrap_or("")
            .trim_end_matches(':')
            .to_string();
        assert!(
            !name.is_empty(),
            "dbus-send failed without an error name: {text}"
        );
        Err(name)
    }
}

const DENIED: &str = "org.agentos1.Error.AccessDenied";
const BUS_DENIED: &str = "org.freedesktop.DBus.Error.AccessDenied";

fn agent_contract(tenant: &str, name: &str) -> String {
    format!(
        "apiVersion: agentos/v0.2\nkind: AgentContract\nname: {name}\ntenant: {tenant}\nclass: {{ latency: DT }}\nexec: {{ command: /bin/sh, args: [\"-c\", \"printf 'hello \\\\033[31mRED\\\\033]0;pwned\\\\007 \\\\033[2J\\\\n'; while true; do sleep 0.2; done\"] }}\n"
    )
}

fn write_contract(dir: &Path, tenant: &str, name: &str) -> String {
    let p = dir.join(format!("{tenant}-{name}.yaml"));
    std::fs::write(&p, agent_contract(tenant, name)).unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
    p.to_str().unwrap().to_string()
}

fn audit_records(state: &Path) -> Vec<serde_json::Value> {
    let o = Command::new(common::agentctl_bin())
        .args(["audit", "show", "--json", "--state-dir"])
        .arg(state)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", out_text(&o));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Whether `who` may do `verb` on `tenant`'s agent under [`rules`].
fn may_manage(who: Who, tenant: &str) -> bool {
    who.uid == 0
        || (tenant == "acme" && who.groups.contains(&ACME_GID))
        || (tenant == "beta" && who.groups.contains(&BETA_GID))
}

#[test]
fn shipped_bus_policy_and_daemon_rules_per_verb_and_caller() {
    skip_unless_capable!();
    let bus = Bus::start_with_policy(OPS_GROUP);
    let cg = TestCgroup::new("authz");
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path();
    let contracts = tempfile::tempdir().unwrap();
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(contracts.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let r = rules();
    let extra: Vec<&str> = r.iter().map(String::as_str).collect();
    let mut d = Daemon::start_with(&bus, &cg.path, state, &extra);
    let b = d.bus.clone();

    let acme = write_contract(contracts.path(), "acme", "worker");
    let beta = write_contract(contracts.path(), "beta", "job");
    // Starting: root any tenant; a tenant operator its own tenant only; the member and the
    // other tenant's operator are refused by the daemon; the unrelated uid by the bus.
    for who in [MEMBER, BETA_OP] {
        let o = ctl(&b, who, &["start", &acme]);
        assert_eq!(o.status.code(), Some(1), "{}: {}", who.name, out_text(&o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains(DENIED)
                && String::from_utf8_lossy(&o.stderr).contains("org.agentos1.manage-agents"),
            "{}: {}",
            who.name,
            out_text(&o)
        );
    }
    let o = ctl(&b, STRANGER, &["start", &acme]);
    assert!(
        String::from_utf8_lossy(&o.stderr).contains(BUS_DENIED),
        "{}",
        out_text(&o)
    );
    let o = ctl(&b, ACME_OP, &["start", &acme]);
    assert!(o.status.success(), "{}", out_text(&o));
    let o = ctl(&b, ROOT, &["start", &beta]);
    assert!(o.status.success(), "{}", out_text(&o));
    d.wait_state("acme/worker", "running", 10);
    d.wait_state("beta/job", "running", 10);

    // Reading: everyone the bus lets in may list and read status and logs of every tenant
    // (the member's rule is unscoped); tenant operators read their own tenant only... plus
    // the member rule they also hold.
    for who in [ROOT, MEMBER, ACME_OP, BETA_OP] {
        let o = ctl(&b, who, &["list", "--json"]);
        assert!(o.status.success(), "{}: {}", who.name, out_text(&o));
        let rows: Vec<serde_json::Value> = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(rows.len(), 2, "{}: {rows:?}", who.name);
        for agent in ["acme/worker", "beta/job"] {
            assert!(call(&b, who, "DescribeAgent", &[&format!("string:{agent}")]).is_ok());
            assert!(
                call(&b, who, "GetLog", &[&format!("string:{agent}"), "uint32:5"]).is_ok(),
                "{}",
                who.name
            );
        }
    }
    for m in ["ListAgents", "DescribeAgents", "Check"] {
        assert_eq!(call(&b, STRANGER, m, &[]), Err(BUS_DENIED.into()), "{m}");
    }

    // Managing, per verb, tenant and caller.
    for (agent, tenant) in [("acme/worker", "acme"), ("beta/job", "beta")] {
        for who in [MEMBER, ACME_OP, BETA_OP, STRANGER, ROOT] {
            for (verb, args) in [
                ("FreezeAgent", vec![]),
                ("ThawAgent", vec![]),
                ("KillAgent", vec!["string:main", "int32:18"]),
            ] {
                let mut a = vec![format!("string:{agent}")];
                a.extend(args.iter().map(|s| s.to_string()));
                let a: Vec<&str> = a.iter().map(String::as_str).collect();
                let got = call(&b, who, verb, &a).map(|_| ());
                let want = if who.uid == STRANGER.uid {
                    Err(BUS_DENIED.to_string())
                } else if may_manage(who, tenant) {
                    Ok(())
                } else {
                    Err(DENIED.to_string())
                };
                assert_eq!(got, want, "{} {verb} {agent}", who.name);
            }
        }
    }
    // Agent objects: the same rule on the per-agent interface.
    let acme_obj = "/org/agentos1/agent/acme_worker";
    for (who, ok) in [(MEMBER, false), (BETA_OP, false), (ACME_OP, true)] {
        let mut c = Command::new("dbus-send");
        c.arg(format!("--bus={b}")).args([
            "--print-reply",
            "--dest=org.agentos1",
            acme_obj,
            "org.agentos1.Agent.Freeze",
        ]);
        let o = run_as(who, c);
        assert_eq!(o.status.success(), ok, "{}: {}", who.name, out_text(&o));
        if !ok {
            assert!(String::from_utf8_lossy(&o.stderr).contains(DENIED));
        }
    }
    assert!(call(&b, ROOT, "ThawAgent", &["string:acme/worker"]).is_ok());
    // A caller who holds manage-agents for no tenant learns nothing about which agents exist.
    assert_eq!(
        call(&b, MEMBER, "StopAgent", &["string:no/such"]),
        Err(DENIED.into())
    );
    // A contract can carry secrets: reading it needs manage-agents, not read.
    assert_eq!(
        call(&b, MEMBER, "GetContract", &["string:acme/worker"]).unwrap_err(),
        DENIED
    );
    assert!(call(&b, ACME_OP, "GetContract", &["string:acme/worker"]).is_ok());
    assert_eq!(
        call(&b, BETA_OP, "GetContract", &["string:acme/worker"]).unwrap_err(),
        DENIED
    );
    // Consent: only the acme operator (configured) and root may answer.
    // A daemon without a tool service answers Unavailable to those who may ask; an unknown
    // request id needs an unscoped grant (a scoped operator cannot probe other tenants' ids).
    const UNAVAILABLE: &str = "org.agentos1.Error.Unavailable";
    for (who, want) in [
        (MEMBER, &[DENIED][..]),
        (BETA_OP, &[DENIED][..]),
        (ACME_OP, &[DENIED, UNAVAILABLE][..]),
        (ROOT, &["org.agentos1.Error.NoSuchConsent", UNAVAILABLE][..]),
    ] {
        for m in ["ApproveConsent", "DenyConsent"] {
            let got = call(&b, who, m, &["uint64:4242"]);
            assert!(
                got.as_ref().is_err_and(|e| want.contains(&e.as_str())),
                "{} {m}: {got:?} (want one of {want:?})",
                who.name
            );
        }
    }

    // Confused deputy: a root-only file with a secret. agentctl reads contracts itself and
    // cannot; the daemon opens caller-named paths for root only; a broken contract in the
    // daemon's agents directory is reported without its content to anyone but root.
    let secret = "SECRET-c0ffee-4711";
    let secret_file = contracts.path().join("root-only.yaml");
    // Diagnostics quote the offending field: this one would echo the secret.
    let leaky = format!("apiVersion: agentos/v0.2\nkind: AgentContract\nname: leak\n{secret}: 1\n");
    std::fs::write(&secret_file, &leaky).unwrap();
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&secret_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    std::fs::write(d.agents_dir.join("leak.yaml"), &leaky).unwrap();
    let sf = secret_file.to_str().unwrap();
    let mut replies = String::new();
    for who in [MEMBER, ACME_OP, BETA_OP] {
        let got = call(&b, who, "StartAgentFromFile", &[&format!("string:{sf}")]);
        assert_eq!(got, Err(DENIED.into()), "{}", who.name);
        let o = ctl(&b, who, &["start", sf]);
        assert_ne!(o.status.code(), Some(0));
        replies.push_str(&out_text(&o));
        let mut c = Command::new("dbus-send");
        c.arg(format!("--bus={b}")).args([
            "--print-reply",
            "--dest=org.agentos1",
            "/org/agentos1",
            "org.agentos1.Manager.StartAgentByName",
            "string:leak",
        ]);
        let o = run_as(who, c);
        assert!(!o.status.success());
        replies.push_str(&out_text(&o));
        let mut c = Command::new("dbus-send");
        c.arg(format!("--bus={b}")).args([
            "--print-reply",
            "--dest=org.agentos1",
            "/org/agentos1",
            "org.agentos1.Manager.StartAgentFromFile",
        ]);
        c.arg(format!("string:{sf}"));
        replies.push_str(&out_text(&run_as(who, c)));
    }
    assert!(
        replies.contains("only root may have agentosd open a contract file"),
        "{replies}"
    );
    assert!(
        !replies.contains(secret),
        "a reply leaked the secret: {replies}"
    );
    // Root still may, and sees why (its own file).
    let o = ctl(&b, ROOT, &["start", "leak"]);
    assert!(
        String::from_utf8_lossy(&o.stderr).contains(secret),
        "root sees the diagnostic: {}",
        out_text(&o)
    );

    // Escape sequences of the agent reach no operator screen raw. First wait for the agent's
    // line to be in its log (a positive marker, not a fixed sleep).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !out_text(&ctl(&b, ROOT, &["logs", "acme/worker", "-n", "5"])).contains("hello") {
        assert!(
            std::time::Instant::now() < deadline,
            "the agent's line never reached its log"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    for args in [
        &["logs", "acme/worker", "-n", "5"][..],
        &["status", "acme/worker"][..],
    ] {
        let o = ctl(&b, MEMBER, args);
        assert!(o.status.success(), "{}", out_text(&o));
        assert!(
            !o.stdout.iter().any(|&c| c == 0x1b || c == 0x07),
            "raw control characters in `agentctl {args:?}`: {:?}",
            String::from_utf8_lossy(&o.stdout)
        );
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(
            text.contains("hello \\x1b[31mRED\\x1b]0;pwned\\x07 \\x1b[2J"),
            "{text}"
        );
    }

    let o = ctl(&b, ROOT, &["stop", "acme/worker", "beta/job"]);
    assert!(o.status.success(), "{}", out_text(&o));
    d.terminate();

    // The record: lifecycle records carry their caller, refusals are recorded, no secret.
    let audit_bytes = std::fs::read(state.join("audit/audit.log")).unwrap_or_default();
    assert!(
        !String::from_utf8_lossy(&audit_bytes).contains(secret),
        "the audit trail holds the secret"
    );
    let log = d.log_text();
    let refused_by_root: Vec<_> = log.match_indices(secret).collect();
    assert!(
        refused_by_root.is_empty(),
        "the daemon's log holds the secret:\n{log}"
    );
    let recs = audit_records(state);
    let find = |agent: &str, event: &str| {
        recs.iter()
            .find(|r| r["agent"] == agent && r["detail"]["event"] == event)
            .unwrap_or_else(|| panic!("no {event} record of {agent}: {recs:#?}"))
            .clone()
    };
    let start = find("worker", "start");
    assert_eq!(start["tenant"], "acme");
    assert_eq!(start["detail"]["caller"]["uid"], ACME_OP.uid, "{start}");
    assert!(
        start["detail"]["caller"]["pid"].as_u64().is_some(),
        "{start}"
    );
    assert!(
        start["detail"]["caller"]["cmdline"]
            .as_str()
            .is_some_and(|c| c.contains("agentctl") && c.contains("start")),
        "{start}"
    );
    for who in [ACME_OP, ROOT] {
        assert!(
            recs.iter().any(|r| r["agent"] == "worker"
                && r["detail"]["event"] == "freeze"
                && r["detail"]["caller"]["uid"] == who.uid),
            "no freeze of worker by {}: {recs:#?}",
            who.name
        );
    }
    let signal = find("worker", "signal");
    assert!(signal["detail"]["caller"]["uid"].is_u64(), "{signal}");
    let stopped = find("job", "stopped");
    assert_eq!(stopped["detail"]["caller"]["uid"], 0, "{stopped}");
    let refusals: Vec<_> = recs
        .iter()
        .filter(|r| r["detail"]["event"] == "refused-call")
        .collect();
    for who in [MEMBER, BETA_OP] {
        assert!(
            refusals
                .iter()
                .any(|r| r["detail"]["caller"]["uid"] == who.uid
                    && r["detail"]["action"] == "org.agentos1.manage-agents"
                    && r["decision"] == "deny"),
            "no refusal of {} on the record: {refusals:#?}",
            who.name
        );
    }
    assert!(
        refusals
            .iter()
            .any(|r| r["detail"]["method"] == "StartAgentFromFile"),
        "{refusals:#?}"
    );
}

/// The daemon's rules hold without the bus policy: on a bus that lets everyone through, an
/// unrelated uid is refused every verb by the daemon itself, and a member still may only read.
#[test]
fn daemon_refuses_on_a_bus_without_policy() {
    skip_unless_capable!();
    let bus = Bus::start_open();
    let cg = TestCgroup::new("authz-open");
    let dir = tempfile::tempdir().unwrap();
    let contracts = tempfile::tempdir().unwrap();
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(contracts.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let r = rules();
    let extra: Vec<&str> = r.iter().map(String::as_str).collect();
    let d = Daemon::start_with(&bus, &cg.path, dir.path(), &extra);
    let b = d.bus.clone();
    let acme = write_contract(contracts.path(), "acme", "worker");
    let text = agent_contract("acme", "worker");
    for (m, args) in [
        ("ListAgents", vec![]),
        ("DescribeAgents", vec![]),
        ("Check", vec![]),
        ("DescribeAgent", vec!["string:acme/worker".to_string()]),
        ("StopAgent", vec!["string:acme/worker".to_string()]),
        (
            "StartAgent",
            vec![format!("string:{text}"), "string:x".to_string()],
        ),
        ("StartAgentFromFile", vec![format!("string:{acme}")]),
        ("StartAgentByName", vec!["string:worker".to_string()]),
        ("ListConsentRequests", vec![]),
        ("ApproveConsent", vec!["uint64:1".to_string()]),
        ("DenyConsent", vec!["uint64:1".to_string()]),
    ] {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        assert_eq!(call(&b, STRANGER, m, &a), Err(DENIED.into()), "{m}");
    }
    // The member reads, but does not manage, even with the bus wide open.
    assert!(call(&b, MEMBER, "ListAgents", &[]).is_ok());
    assert_eq!(
        call(
            &b,
            MEMBER,
            "StartAgent",
            &[&format!("string:{text}"), "string:x"]
        ),
        Err(DENIED.into())
    );
    let o = ctl(&b, STRANGER, &["list"]);
    assert_eq!(o.status.code(), Some(1), "{}", out_text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("org.agentos1.read"),
        "{}",
        out_text(&o)
    );
    // Properties are read through the same gate: Get and GetAll of an agent's object and of
    // the manager are refused to the stranger and allowed to the member (and root).
    let o = ctl(&b, ROOT, &["start", &acme]);
    assert!(o.status.success(), "{}", out_text(&o));
    d.wait_state("acme/worker", "running", 10);
    // ListAgents keeps the rows of the tenants the caller may read: a tenant's operator without
    // the member rule sees its own tenant's agents only, the member every tenant's.
    let beta = write_contract(contracts.path(), "beta", "job");
    let acme2 = write_contract(contracts.path(), "acme", "zz");
    for c in [&beta, &acme2] {
        let o = ctl(&b, ROOT, &["start", c]);
        assert!(o.status.success(), "{}", out_text(&o));
    }
    d.wait_state("beta/job", "running", 10);
    d.wait_state("acme/zz", "running", 10);
    let ids = |who: Who| {
        let o = ctl(&b, who, &["list", "--json"]);
        assert!(o.status.success(), "{}: {}", who.name, out_text(&o));
        let rows: Vec<serde_json::Value> = serde_json::from_slice(&o.stdout).unwrap();
        for r in &rows {
            assert_eq!(r["state"], "running", "{r}");
            assert!(r["main_pid"].as_u64().unwrap() > 0, "{r}");
            let id = r["id"].as_str().unwrap();
            assert_eq!(
                format!(
                    "{}/{}",
                    r["tenant"].as_str().unwrap(),
                    r["name"].as_str().unwrap()
                ),
                id
            );
            assert_eq!(
                r["object_path"],
                format!("/org/agentos1/agent/{}", id.replace('/', "_")),
                "{r}"
            );
        }
        rows.iter()
            .map(|r| r["id"].as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    let acme_only = Who {
        name: "acme-only",
        uid: 4,
        gid: 4,
        groups: &[ACME_GID],
    };
    let beta_only = Who {
        name: "beta-only",
        uid: 8,
        gid: 8,
        groups: &[BETA_GID],
    };
    assert_eq!(ids(acme_only), ["acme/worker", "acme/zz"]);
    assert_eq!(ids(beta_only), ["beta/job"]);
    assert_eq!(ids(MEMBER), ["acme/worker", "acme/zz", "beta/job"]);
    for (path, iface, prop) in [
        (
            "/org/agentos1/agent/acme_worker",
            "org.agentos1.Agent",
            "State",
        ),
        (
            "/org/agentos1/agent/acme_worker",
            "org.agentos1.Agent",
            "MainPID",
        ),
        ("/org/agentos1", "org.agentos1.Manager", "NAgents"),
    ] {
        for who in [ROOT, MEMBER, STRANGER] {
            for (method, args) in [
                (
                    "Get",
                    vec![format!("string:{iface}"), format!("string:{prop}")],
                ),
                ("GetAll", vec![format!("string:{iface}")]),
            ] {
                let got = property_call(&b, who, path, method, &args);
                match (who.uid == STRANGER.uid, method) {
                    // zbus's GetAll leaves out what a getter refuses: nothing is left.
                    (true, "GetAll") => assert!(
                        got.as_ref().is_ok_and(|r| !r.contains("dict entry")),
                        "{} GetAll {path}: {got:?}",
                        who.name
                    ),
                    (true, _) => assert_eq!(
                        got,
                        Err(BUS_DENIED.into()),
                        "{} {method} {path} {prop}",
                        who.name
                    ),
                    (false, _) => assert!(
                        got.as_ref().is_ok_and(|r| r.contains("variant")),
                        "{} {method} {path} {prop}: {got:?}",
                        who.name
                    ),
                }
            }
        }
    }
}

/// `org.freedesktop.DBus.Properties.METHOD ARGS` on `path` as `who`: `Ok(reply)` or
/// `Err(error name)`.
fn property_call(
    bus: &str,
    who: Who,
    path: &str,
    method: &str,
    args: &[String],
) -> Result<String, String> {
    let mut c = Command::new("dbus-send");
    c.arg(format!("--bus={bus}"))
        .args([
            "--print-reply",
            "--reply-timeout=20000",
            "--dest=org.agentos1",
            path,
        ])
        .arg(format!("org.freedesktop.DBus.Properties.{method}"))
        .args(args);
    let o = run_as(who, c);
    if o.status.success() {
        return Ok(out_text(&o));
    }
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    Err(err
        .split_whitespace()
        .skip_while(|w| *w != "Error")
        .nth(1)
        .unwrap_or("")
        .trim_end_matches(':')
        .to_string())
}

/// `cmd` as `who`, in the background, its output piped.
fn spawn_as(who: Who, mut cmd: Command) -> std::process::Child {
    let groups: Vec<libc::gid_t> = who.groups.to_vec();
    let (uid, gid) = (who.uid, who.gid);
    if uid != 0 {
        cmd.env_remove("HOME").env("HOME", "/");
        // SAFETY: as in `run_as`: async-signal-safe calls only, `groups` owned by the closure.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setgroups(groups.len(), groups.as_ptr()) != 0
                    || libc::setresgid(gid, gid, gid) != 0
                    || libc::setresuid(uid, uid, uid) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    cmd.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn client")
}

fn stop_and_read(mut c: std::process::Child) -> (String, String) {
    let _ = c.kill();
    let o = c.wait_with_output().expect("wait");
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Signals follow read rights: each subscriber (`agentctl monitor`, `Subscribe`) hears of the
/// agents it may read and of no other tenant's; one without `read` anywhere cannot subscribe;
/// and no signal of the daemon is broadcast (a bus monitor sees each addressed to a subscriber).
#[test]
fn signals_reach_only_subscribers_who_may_read_the_agent() {
    skip_unless_capable!();
    let bus = Bus::start_with_policy(OPS_GROUP);
    let cg = TestCgroup::new("authz-signals");
    let dir = tempfile::tempdir().unwrap();
    let contracts = tempfile::tempdir().unwrap();
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(contracts.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    // Tenant operators read their tenant only; the plain member reads nothing.
    let r = [
        format!("--authz=gid:{ACME_GID}=manage-agents,read@acme"),
        format!("--authz=gid:{BETA_GID}=manage-agents,read@beta"),
    ];
    let extra: Vec<&str> = r.iter().map(String::as_str).collect();
    let d = Daemon::start_with(&bus, &cg.path, dir.path(), &extra);
    let b = d.bus.clone();
    let monitor = |who: Who| {
        let mut c = Command::new(common::agentctl_bin());
        c.args(["--bus-address", &b, "monitor", "--json"]);
        spawn_as(who, c)
    };
    // Every message on the bus, as the bus's owner sees it (dbus-monitor becomes a monitor).
    let watched = dir.path().join("monitor.txt");
    let mut watch = Command::new("dbus-monitor")
        .args(["--address", &b, "type='signal'"])
        .stdout(std::fs::File::create(&watched).unwrap())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("dbus-monitor (package dbus-bin)");
    let acme_mon = monitor(ACME_OP);
    let beta_mon = monitor(BETA_OP);
    let root_mon = monitor(ROOT);
    // A member without read anywhere is refused; an unrelated uid is refused by the bus.
    let o = ctl(&b, MEMBER, &["monitor"]);
    assert_eq!(o.status.code(), Some(1), "{}", out_text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("Subscribe"),
        "{}",
        out_text(&o)
    );
    let o = ctl(&b, STRANGER, &["monitor"]);
    assert_ne!(o.status.code(), Some(0), "{}", out_text(&o));
    std::thread::sleep(Duration::from_millis(1500)); // the monitors have subscribed
    let acme = write_contract(contracts.path(), "acme", "worker");
    let beta = write_contract(contracts.path(), "beta", "job");
    for f in [&acme, &beta] {
        let o = ctl(&b, ROOT, &["start", f]);
        assert!(o.status.success(), "{}", out_text(&o));
    }
    d.wait_state("acme/worker", "running", 10);
    d.wait_state("beta/job", "running", 10);
    // Introspection names only the agents the caller may read.
    let introspect = |who: Who, path: &str| {
        let mut c = Command::new("busctl");
        c.args([
            "--address",
            &b,
            "--xml-interface",
            "introspect",
            "org.agentos1",
            path,
        ]);
        String::from_utf8_lossy(&run_as(who, c).stdout).into_owned()
    };
    let acme_view = introspect(ACME_OP, "/org/agentos1/agent");
    assert!(
        acme_view.contains("<node name=\"acme_worker\"/>") && !acme_view.contains("beta_job"),
        "{acme_view}"
    );
    let root_view = introspect(ROOT, "/org/agentos1/agent");
    assert!(
        root_view.contains("acme_worker") && root_view.contains("beta_job"),
        "{root_view}"
    );
    let beta_obj = introspect(ACME_OP, "/org/agentos1/agent/beta_job");
    assert!(!beta_obj.contains("org.agentos1.Agent"), "{beta_obj}");
    let o = ctl(&b, ROOT, &["stop", "acme/worker", "beta/job"]);
    assert!(o.status.success(), "{}", out_text(&o));
    std::thread::sleep(Duration::from_millis(1500));
    let heard = |c: std::process::Child| {
        let (out, err) = stop_and_read(c);
        let events: Vec<serde_json::Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        (events, err)
    };
    let agents = |ev: &[serde_json::Value]| -> std::collections::BTreeSet<String> {
        ev.iter()
            .map(|e| e["agent"].as_str().unwrap().to_string())
            .collect()
    };
    let (acme_ev, err) = heard(acme_mon);
    assert_eq!(
        agents(&acme_ev),
        ["acme/worker".to_string()].into(),
        "{acme_ev:#?} {err}"
    );
    for want in ["new", "state"] {
        assert!(acme_ev.iter().any(|e| e["event"] == want), "{acme_ev:#?}");
    }
    assert!(
        acme_ev
            .iter()
            .any(|e| e["event"] == "state" && e["state"] == "inactive"),
        "{acme_ev:#?}"
    );
    let (beta_ev, err) = heard(beta_mon);
    assert_eq!(
        agents(&beta_ev),
        ["beta/job".to_string()].into(),
        "{beta_ev:#?} {err}"
    );
    let (root_ev, err) = heard(root_mon);
    assert_eq!(
        agents(&root_ev),
        ["acme/worker".to_string(), "beta/job".to_string()].into(),
        "{root_ev:#?} {err}"
    );
    // Nothing broadcast: root listening for every signal without subscribing (dbus-monitor,
    // which this bus does not let eavesdrop) hears the bus's own broadcasts and none of the
    // daemon's.
    let _ = watch.kill();
    let _ = watch.wait();
    let seen = std::fs::read_to_string(&watched).unwrap_or_default();
    assert!(
        seen.contains("member=NameOwnerChanged"),
        "the listener heard nothing at all:\n{seen}"
    );
    assert!(
        !seen.contains("path=/org/agentos1"),
        "a signal of the daemon was broadcast:\n{seen}"
    );
}

/// A caller looping over calls it may not make (a local user, or an agent: below Landlock ABI 9
/// every agent reaches the system bus) is refused every time, but writes a bounded number of
/// records: the first `burst` one by one, then summaries ("refused-calls-suppressed") that
/// count the rest, never silently. (That an agent's uid holds no action whatever a rule says
/// is `authz::tests::an_agents_uid_holds_nothing_whatever_the_rules_say`: a bus refuses a uid
/// without a passwd entry before the daemon sees it.)
#[test]
fn refused_calls_are_recorded_at_a_bounded_rate() {
    skip_unless_capable!();
    let bus = Bus::start_open();
    let cg = TestCgroup::new("authz-flood");
    let dir = tempfile::tempdir().unwrap();
    let r = rules();
    let mut extra: Vec<&str> = r.iter().map(String::as_str).collect();
    extra.extend([
        "--denial-records-per-sec",
        "1",
        "--denial-records-burst",
        "5",
    ]);
    let d = Daemon::start_with(&bus, &cg.path, dir.path(), &extra);
    let b = d.bus.clone();
    const CALLS: u64 = 60;
    for i in 0..CALLS {
        assert_eq!(
            call(&b, STRANGER, "ListAgents", &[]),
            Err(DENIED.into()),
            "call {i}"
        );
    }
    // The allowed still pass.
    assert!(call(&b, MEMBER, "ListAgents", &[]).is_ok());
    // The 2 s report writes the summary.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let recs = audit_records(dir.path());
        let of_stranger = |r: &&serde_json::Value| r["detail"]["caller"]["uid"] == STRANGER.uid;
        let singles = recs
            .iter()
            .filter(|r| r["detail"]["event"] == "refused-call")
            .filter(of_stranger)
            .count() as u64;
        let summaries: Vec<&serde_json::Value> = recs
            .iter()
            .filter(|r| r["detail"]["event"] == "refused-calls-suppressed")
            .filter(of_stranger)
            .collect();
        let counted: u64 = summaries
            .iter()
            .map(|r| r["detail"]["count"].as_u64().unwrap())
            .sum();
        if singles + counted == CALLS {
            // Bounded: the burst plus about one a second of the run, not one per call.
            assert!(singles < CALLS / 2, "{singles} single records of {CALLS}");
            let s = summaries[0];
            assert_eq!(s["decision"], "deny", "{s}");
            assert!(s["detail"]["by"]["ListAgents"].as_u64().unwrap() > 0, "{s}");
            assert_eq!(s["detail"]["limit"]["burst"], 5, "{s}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{singles} refused-call records + {counted} counted in summaries != {CALLS} calls: {summaries:#?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
}
