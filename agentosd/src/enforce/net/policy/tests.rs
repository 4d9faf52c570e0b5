//! Unit tests of the policy builder (`super`).

#![allow(clippy::unwrap_used)]
use super::*;
use crate::enforce::net::RawEvent;

fn no_dns(h: &str) -> Result<Vec<IpAddr>, String> {
    match h {
        "api.example.com" => Ok(vec![
            "192.0.2.7".parse().unwrap(),
            "2001:db8::7".parse().unwrap(),
        ]),
        _ => Err("no such host".into()),
    }
}

#[test]
fn layouts_match_intf_h() {
    assert_eq!(std::mem::size_of::<RawRule>(), 40);
    assert_eq!(std::mem::size_of::<RawPolicy>(), 8 + 40 * MAX_RULES + 8);
    assert_eq!(std::mem::size_of::<RawEvent>(), 72);
}

#[test]
fn scopes_become_rules() {
    let p = policy_from_scopes(
        &[
            "127.0.0.1:8080".into(),
            "api.example.com:443".into(),
            "10.0.0.0/8:*".into(),
            "[::1]:53".into(),
            "nowhere.invalid:80".into(),
        ],
        &no_dns,
    )
    .unwrap();
    assert!(!p.allow_all);
    assert_eq!(p.rules.len(), 5);
    assert_eq!(p.notes.len(), 1, "{:?}", p.notes);
    assert!(p.notes[0].contains("nowhere.invalid"));
    assert_eq!(
        p.describe(),
        "127.0.0.1:8080, 192.0.2.7:443 (TCP), [2001:db8::7]:443 (TCP), 10.0.0.0/8:*, [::1]:53"
    );
    let raw = p.raw();
    assert_eq!(raw.n_rules, 5);
    // 127.0.0.1 in network byte order as the kernel's user_ip4 holds it.
    assert_eq!(raw.rules[0].addr[0], u32::from_ne_bytes([127, 0, 0, 1]));
    assert_eq!(raw.rules[0].mask, [u32::MAX, 0, 0, 0]);
    assert_eq!(raw.rules[0].port, 8080);
    assert_eq!(raw.rules[3].mask[0], u32::from_ne_bytes([255, 0, 0, 0]));
    assert_eq!(raw.rules[3].port, 0);
    assert_eq!(raw.rules[4].family, AF_INET6);
    assert_eq!(raw.rules[4].mask, [u32::MAX; 4]);
}

#[test]
fn wildcards_and_errors() {
    let p = policy_from_scopes(&["*:*".into()], &no_dns).unwrap();
    assert!(p.allow_all);
    let p = policy_from_scopes(&["*:443".into()], &no_dns).unwrap();
    assert!(!p.allow_all);
    assert_eq!(p.rules.len(), 2);
    assert_eq!(p.raw().rules[0].mask, [0; 4]);
    assert!(policy_from_scopes(&["nohost".into()], &no_dns).is_err());
    assert!(policy_from_scopes(&["1.2.3.4/40:1".into()], &no_dns).is_err());
    assert!(policy_from_scopes(&["h:0".into()], &no_dns).is_err());
    let p = policy_from_scopes(&[], &no_dns).unwrap();
    assert!(p.rules.is_empty() && !p.allow_all);
    let many: Vec<String> = (1..=40).map(|i| format!("10.0.0.{i}:1")).collect();
    assert_eq!(
        policy_from_scopes(&many, &no_dns),
        Err(PolicyError::TooMany(40))
    );
}

#[test]
fn bind_grants_and_v4_mapped_scopes() {
    let p = policy_from_grants(
        &[
            "[::ffff:10.0.0.1]:80".into(),
            "::ffff:10.0.0.0/104:443".into(),
        ],
        &["127.0.0.1:8080".into(), "*:*".into()],
        &no_dns,
    )
    .unwrap();
    assert!(p.inet && p.allow_all_bind && !p.allow_all);
    // A v4-mapped grant is an IPv4 grant (the programs check mapped destinations as IPv4).
    assert_eq!(p.rules[0].family, AF_INET);
    assert_eq!(p.rules[0].net, Some(("10.0.0.1".parse().unwrap(), 32)));
    assert_eq!(p.rules[1].net, Some(("10.0.0.0".parse().unwrap(), 8)));
    assert_eq!(p.rules[2].kind, RuleKind::Bind);
    let raw = p.raw();
    assert_eq!(raw.flags, ALLOW_ALL_BIND | INET);
    assert_eq!(raw.rules[2].kind, RULE_BIND);
    assert_eq!(raw.rules[0].kind, RULE_CONNECT);
    assert_eq!(
        p.describe(),
        "10.0.0.1:80, 10.0.0.0/8:443; bind any address (net.bind *:*)"
    );
    let none = policy_from_grants(&[], &[], &no_dns).unwrap();
    assert_eq!(none.raw().flags, 0);
    assert!(none.describe().starts_with("no network grant"));
}

#[test]
fn wildcards_match_labels_under_the_suffix_at_any_depth() {
    let g = NameGrant::new("*.Example.TEST", 443);
    assert!(g.wildcard && g.name == "example.test");
    for yes in ["a.example.test", "A.B.example.test.", "x-1.EXAMPLE.test"] {
        assert!(g.matches(yes), "{yes}");
    }
    for no in [
        "example.test",
        ".example.test",
        "aexample.test",
        "a.example.test.evil",
        "example.test.",
        "test",
    ] {
        assert!(!g.matches(no), "{no}");
    }
    let n = NameGrant::new("named.example.test.", 80);
    assert!(n.matches("NAMED.example.test") && n.matches("named.example.test."));
    assert!(!n.matches("a.named.example.test"));
}

#[test]
fn names_are_grants_unless_in_hosts_and_set_the_dns_flag() {
    let hosts =
        |h: &str| hosts_lookup("127.0.0.1 localhost # me\n::1 localhost ip6-localhost\n", h);
    let p = policy_with_dns(
        &[
            "*.example.test:443".into(),
            "named.example.test:8080".into(),
            "localhost:9000".into(),
            "198.18.0.9:*".into(),
        ],
        &["localhost:7000".into()],
        &hosts,
    )
    .unwrap();
    assert!(p.dns && p.inet && !p.allow_all);
    assert_eq!(
        p.names,
        vec![
            NameGrant::new("*.example.test", 443),
            NameGrant::new("named.example.test", 8080)
        ]
    );
    // localhost is static (both addresses), the address a rule, the bind name local.
    assert_eq!(p.rules.len(), 5, "{:?}", p.rules);
    let mut pp = p.clone();
    pp.dns_port = 5353;
    let raw = pp.raw();
    assert_eq!(raw.flags, INET | DNS);
    assert_eq!(raw.dns_port, 5353);
    assert!(
        pp.describe().contains("*.example.test:443, named.example.test:8080, DNS through the daemon's stub (127.0.0.1:5353)"),
        "{}",
        pp.describe()
    );
    // *:* needs no stub; no net.connect, no stub.
    let all = policy_with_dns(&["*:*".into(), "a.test:1".into()], &[], &hosts).unwrap();
    assert!(!all.dns);
    let bind_only = policy_with_dns(&[], &["127.0.0.1:1".into()], &hosts).unwrap();
    assert!(!bind_only.dns && bind_only.raw().flags == INET);
    // The resolve-now builder (tool cgroups) grants nothing for a wildcard, and says so.
    let t = policy_from_scopes(&["*.example.test:443".into()], &no_dns).unwrap();
    assert!(t.rules.is_empty() && t.names.is_empty() && !t.dns);
    assert!(t.notes[0].contains("wildcard"), "{:?}", t.notes);
}

#[test]
fn udp_is_declared_per_name_grant() {
    let none = |_: &str| Vec::new();
    let p = policy_with_dns(
        &[
            "udp://*.example.test:443".into(),
            "*.example.test:443".into(),
        ],
        &[],
        &none,
    )
    .unwrap();
    assert_eq!(
        p.names,
        vec![
            NameGrant::new("*.example.test", 443).over_udp(),
            NameGrant::new("*.example.test", 443),
        ]
    );
    assert!(
        p.describe()
            .contains("udp://*.example.test:443, *.example.test:443")
    );
    // net.connect only, not "*".
    for (c, b) in [
        (vec!["udp://*:443".to_string()], vec![]),
        (vec![], vec!["udp://localhost:53".to_string()]),
        (vec![], vec!["udp://127.0.0.1:53".to_string()]),
    ] {
        assert!(
            matches!(policy_with_dns(&c, &b, &none), Err(PolicyError::Scope(_))),
            "{c:?} {b:?}"
        );
    }
}

#[test]
fn udp_address_grants_are_udp_only_and_plain_ones_both() {
    let none = |_: &str| Vec::new();
    let p = policy_with_dns(
        &[
            "udp://198.18.0.1:443".into(),
            "udp://[2001:db8::1]:443".into(),
            "udp://10.0.0.0/8:53".into(),
            "198.18.0.2:443".into(),
        ],
        &[],
        &none,
    )
    .unwrap();
    let protos: Vec<Proto> = p.rules.iter().map(|r| r.proto).collect();
    assert_eq!(protos, [Proto::Udp, Proto::Udp, Proto::Udp, Proto::Any]);
    let raw = p.raw();
    assert_eq!(raw.rules[0].kind, RULE_CONNECT | RULE_UDP);
    assert_eq!(raw.rules[3].kind, RULE_CONNECT);
    assert!(
        p.describe().starts_with(
            "udp://198.18.0.1:443, udp://[2001:db8::1]:443, udp://10.0.0.0/8:53, 198.18.0.2:443"
        ),
        "{}",
        p.describe()
    );
    // A tool's names, resolved now: TCP unless udp://, like the stub's name grants.
    let resolve = |_: &str| Ok(vec!["198.18.0.9".parse().unwrap()]);
    let p = policy_from_grants(
        &[
            "api.test:443".into(),
            "udp://quic.test:443".into(),
            "198.18.0.3:1".into(),
        ],
        &["x.test:80".into()],
        &resolve,
    )
    .unwrap();
    let protos: Vec<Proto> = p.rules.iter().map(|r| r.proto).collect();
    assert_eq!(protos, [Proto::Tcp, Proto::Udp, Proto::Any, Proto::Any]);
    assert_eq!(p.raw().rules[0].kind, RULE_CONNECT | RULE_TCP);
}

#[test]
fn hosts_file_lines() {
    let text = "# c\n10.0.0.1  db.internal db\n10.0.0.2 other\nbad line\n10.0.0.3 DB.internal\n";
    let v = hosts_lookup(text, "db.internal.");
    assert_eq!(
        v,
        vec![
            "10.0.0.1".parse::<IpAddr>().unwrap(),
            "10.0.0.3".parse().unwrap()
        ]
    );
    assert!(hosts_lookup(text, "nowhere").is_empty());
}

#[test]
fn static_rules_cover_addresses_ports_and_protocols() {
    use super::super::PortGrant;
    let none = |_: &str| Vec::new();
    let p = policy_with_dns(
        &[
            "10.50.0.0/16:443".into(),
            "udp://10.60.0.1:53".into(),
            "[fd00::/8]:*".into(),
        ],
        &[],
        &none,
    )
    .unwrap();
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    let covered = |a: &str, g: PortGrant| p.rules.iter().any(|r| r.covers(ip(a), g));
    assert!(covered("10.50.3.4", PortGrant::tcp(443)));
    assert!(covered("::ffff:10.50.3.4", PortGrant::udp(443)));
    assert!(!covered("10.51.3.4", PortGrant::tcp(443)));
    assert!(!covered("10.50.3.4", PortGrant::tcp(80)));
    assert!(
        !covered("10.50.3.4", PortGrant::tcp(0)),
        "any port needs a rule for any port"
    );
    assert!(covered("10.60.0.1", PortGrant::udp(53)));
    assert!(
        !covered("10.60.0.1", PortGrant::tcp(53)),
        "udp:// covers no TCP"
    );
    assert!(covered("fd12::1", PortGrant::tcp(0)));
    assert!(!covered("fc00::1", PortGrant::tcp(22)));
}

#[test]
fn checked_grants_are_name_grants_with_their_check() {
    let hosts = |h: &str| {
        if h == "localhost" {
            vec!["127.0.0.1".parse().unwrap()]
        } else {
            Vec::new()
        }
    };
    let p = policy_with_dns(
        &[
            "https://API.example.test".into(),
            "https://*.example.test:8443".into(),
            "http://plain.example.test".into(),
            "https://localhost".into(),
        ],
        &[],
        &hosts,
    )
    .unwrap();
    assert!(p.dns && p.rules.is_empty(), "{:?}", p.rules);
    assert_eq!(
        p.names,
        vec![
            NameGrant::new("api.example.test", 443).checked(Check::Tls),
            NameGrant::new("*.example.test", 8443).checked(Check::Tls),
            NameGrant::new("plain.example.test", 80).checked(Check::Http),
            // /etc/hosts names no name to check: still a name grant (its loopback answer is
            // stripped like any).
            NameGrant::new("localhost", 443).checked(Check::Tls),
        ]
    );
    assert_eq!(
        p.names[0].port_grant(),
        crate::enforce::net::PortGrant::checked(443)
    );
    assert!(
        p.describe()
            .contains("https://api.example.test:443, https://*.example.test:8443, http://plain.example.test:80"),
        "{}",
        p.describe()
    );
    // Tools (names resolved once) and net.bind cannot have them.
    let no_dns = |_: &str| -> Result<Vec<IpAddr>, String> { Ok(Vec::new()) };
    assert!(matches!(
        policy_from_scopes(&["https://api.example.test".into()], &no_dns),
        Err(PolicyError::Checked(_))
    ));
    assert!(matches!(
        policy_with_dns(&[], &["http://localhost".into()], &hosts),
        Err(PolicyError::Checked(_))
    ));
    assert!(matches!(
        policy_with_dns(&["https://10.0.0.1".into()], &[], &hosts),
        Err(PolicyError::Checked(_))
    ));
}

/// The daemon's resolver for tools' and DNS-less agents' host names is the system's: a name the
/// host knows (`localhost`, in every /etc/hosts) gives its loopback addresses, sorted and
/// without repeats; a name that cannot exist (`.invalid`, RFC 6761) is an error, which grants
/// nothing.
#[test]
fn the_system_resolver_answers_with_the_hosts_addresses() {
    let v = system_resolve("localhost").expect("localhost resolves");
    assert!(!v.is_empty());
    assert!(v.iter().all(IpAddr::is_loopback), "{v:?}");
    let mut sorted = v.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(v, sorted);
    assert!(system_resolve("no-such-host.invalid").is_err());
    // The policy built with it grants localhost's addresses on the port.
    let p = policy_from_scopes(&["localhost:8080".into()], &system_resolve).unwrap();
    assert!(p.describe().contains("8080"), "{}", p.describe());
}
