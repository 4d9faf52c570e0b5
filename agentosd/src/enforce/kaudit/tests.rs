use std::time::Instant;

use super::*;

// Captured on the development host (kernel 6.18, audit enabled, no auditd): a process that
// restricted itself with a ruleset handling fs.read_file read /etc/hostname, and called
// keyctl under a filter returning SECCOMP_RET_ERRNO with SECCOMP_FILTER_FLAG_LOG.
const LL_ACCESS: &str = r#"audit(1795408806.474:4): domain=16e40fc10 blockers=fs.read_file path="/etc/hostname" dev="vda" ino=611"#;
const LL_DOMAIN: &str = r#"audit(1795408806.474:5): domain=16e40fc10 status=allocated mode=enforcing pid=16763 uid=0 exe="/root/.pyenv/versions/3.11.7/bin/python3.11" comm="python3""#;
const SECCOMP: &str = r#"audit(1795408806.474:6): auid=4294967295 uid=0 gid=0 ses=4294967295 pid=16763 comm="python3" exe="/root/.pyenv/versions/3.11.7/bin/python3.11" sig=0 arch=c000003e syscall=250 compat=0 ip=0x7f86e32c2829 code=0x50000"#;
const BPF: &str = "audit(1795408807.438:7): prog-id=5200 op=UNLOAD";

struct Fake;
impl Attribute for Fake {
    fn attribute(&self, pid: Option<u32>, uid: Option<u32>) -> Option<Attribution> {
        (pid == Some(16763) || uid == Some(62000)).then(|| Attribution {
            tenant: "t".into(),
            name: "a".into(),
            by: if pid == Some(16763) { "cgroup" } else { "uid" },
        })
    }
}

#[test]
fn parses_captured_records() {
    let Some(Event::Seccomp(s)) = parse(AUDIT_SECCOMP, SECCOMP) else {
        panic!("seccomp record not parsed");
    };
    assert_eq!(s.stamp.serial, 6);
    assert_eq!(s.stamp.time_ms, 1_795_408_806_474);
    assert_eq!(
        (s.pid, s.uid, s.syscall, s.code),
        (16763, Some(0), 250, 0x50000)
    );
    assert_eq!(s.comm, "python3");
    assert_eq!(s.arch, AUDIT_ARCH_X86_64);
    let d = seccomp_denial(&s);
    assert_eq!(d.syscall, "keyctl");
    assert_eq!(
        (d.errno, d.errno_num, d.action),
        (Some("EPERM"), Some(1), "errno")
    );

    let Some(Event::LandlockAccess(a)) = parse(AUDIT_LANDLOCK_ACCESS, LL_ACCESS) else {
        panic!("landlock access not parsed");
    };
    assert_eq!(a.domain, 0x16e40fc10);
    assert_eq!(a.blockers, vec!["fs.read_file"]);
    let d = landlock_denial(&a, None);
    assert_eq!(d.path.as_deref(), Some("/etc/hostname"));
    assert_eq!((d.syscall.as_str(), d.errno), ("open", Some("EACCES")));

    let Some(Event::LandlockDomain(dm)) = parse(AUDIT_LANDLOCK_DOMAIN, LL_DOMAIN) else {
        panic!("landlock domain not parsed");
    };
    assert_eq!(
        (dm.domain, dm.pid, dm.uid),
        (0x16e40fc10, Some(16763), Some(0))
    );
    assert_eq!(dm.status, "allocated");
    assert_eq!(dm.comm.as_deref(), Some("python3"));

    assert_eq!(parse(1334, BPF), None);
    assert_eq!(parse(AUDIT_SECCOMP, "garbage"), None);
}

#[test]
fn hex_encoded_and_network_fields() {
    // A comm with a space is logged as hex; a TCP connect denial names the destination.
    let rec = "audit(1.5:9): auid=1 uid=62000 gid=62000 ses=1 pid=7 comm=6D7920616770 exe=\"/usr/bin/x\" sig=0 arch=c000003e syscall=1073741825 compat=0 ip=0x1 code=0x50000";
    let Some(Event::Seccomp(s)) = parse(AUDIT_SECCOMP, rec) else {
        panic!()
    };
    assert_eq!(s.comm, "my agp");
    assert_eq!(s.stamp.time_ms, 1005);
    let d = seccomp_denial(&s);
    assert_eq!((d.syscall.as_str(), d.errno), ("x32:#1", Some("ENOSYS")));

    let net = "audit(1.0:10): domain=1a blockers=net.connect_tcp daddr=127.0.0.1 dest=9";
    let Some(Event::LandlockAccess(a)) = parse(AUDIT_LANDLOCK_ACCESS, net) else {
        panic!()
    };
    let d = landlock_denial(&a, None);
    assert_eq!(d.syscall, "connect");
    assert_eq!((d.addr.as_deref(), d.port), (Some("127.0.0.1"), Some(9)));
    let kill = "audit(1.0:11): domain=1a blockers=scope.signal opid=1 ocomm=\"init\"";
    let Some(Event::LandlockAccess(a)) = parse(AUDIT_LANDLOCK_ACCESS, kill) else {
        panic!()
    };
    assert_eq!(landlock_denial(&a, None).errno, Some("EPERM"));
}

#[test]
fn landlock_access_waits_for_its_domain_then_is_attributed() {
    let mut c = Correlator::default();
    let t0 = Instant::now();
    let ev = |ty, s| parse(ty, s).unwrap();
    // The access record comes first, the domain record right after it.
    assert!(
        c.feed(ev(AUDIT_LANDLOCK_ACCESS, LL_ACCESS), t0, &Fake)
            .is_empty()
    );
    let out = c.feed(ev(AUDIT_LANDLOCK_DOMAIN, LL_DOMAIN), t0, &Fake);
    let [Output::Denial(d, Some(who))] = out.as_slice() else {
        panic!("{out:?}")
    };
    assert_eq!((who.name.as_str(), who.by), ("a", "cgroup"));
    assert_eq!(d.domain_pid, Some(16763));
    assert_eq!(d.path.as_deref(), Some("/etc/hostname"));
    // Later denials of the domain need no wait.
    let out = c.feed(ev(AUDIT_LANDLOCK_ACCESS, LL_ACCESS), t0, &Fake);
    assert_eq!(out.len(), 1);
    // Seccomp: attributed at once; a process that is no agent is counted, not written.
    assert_eq!(c.feed(ev(AUDIT_SECCOMP, SECCOMP), t0, &Fake).len(), 1);
    let other = SECCOMP.replace("pid=16763", "pid=1");
    assert!(c.feed(ev(AUDIT_SECCOMP, &other), t0, &Fake).is_empty());
    assert_eq!(c.foreign, 1);
    // A deallocated domain is forgotten; its next access waits, then goes out unattributed.
    let gone = "audit(2.0:12): domain=16e40fc10 status=deallocated denials=2";
    assert!(
        c.feed(ev(AUDIT_LANDLOCK_DOMAIN, gone), t0, &Fake)
            .is_empty()
    );
    assert!(
        c.feed(ev(AUDIT_LANDLOCK_ACCESS, LL_ACCESS), t0, &Fake)
            .is_empty()
    );
    assert!(c.expire(t0).is_empty());
    let out = c.expire(t0 + Correlator::WAIT);
    assert!(
        matches!(out.as_slice(), [Output::Denial(_, None)]),
        "{out:?}"
    );
    // A domain created by a process that is no agent: its denials are not ours.
    let foreign = LL_DOMAIN.replace("pid=16763", "pid=2");
    c.feed(ev(AUDIT_LANDLOCK_DOMAIN, &foreign), t0, &Fake);
    assert!(
        c.feed(ev(AUDIT_LANDLOCK_ACCESS, LL_ACCESS), t0, &Fake)
            .is_empty()
    );
}

#[test]
fn netlink_messages_split() {
    let mut buf = Vec::new();
    for (ty, text) in [(AUDIT_SECCOMP, "abc"), (AUDIT_LANDLOCK_ACCESS, "defgh")] {
        let len = (NLMSG_HDRLEN + text.len()) as u32;
        buf.extend(len.to_ne_bytes());
        buf.extend(ty.to_ne_bytes());
        buf.extend([0u8; 10]);
        buf.extend(text.as_bytes());
        while buf.len() % 4 != 0 {
            buf.push(0);
        }
    }
    let m = messages(&buf);
    assert_eq!(m.len(), 2);
    assert_eq!(m[0], (AUDIT_SECCOMP, &b"abc"[..]));
    assert_eq!(m[1], (AUDIT_LANDLOCK_ACCESS, &b"defgh"[..]));
}

#[test]
fn detail_has_the_fields_the_trail_needs() {
    let Some(Event::Seccomp(s)) = parse(AUDIT_SECCOMP, SECCOMP) else {
        panic!()
    };
    let d = seccomp_denial(&s).detail();
    assert_eq!(d["mechanism"], "seccomp");
    assert_eq!(d["syscall"], "keyctl");
    assert_eq!(d["errno"], "EPERM");
    assert_eq!(d["pid"], 16763);
    assert_eq!(d["comm"], "python3");
    assert!(d.get("path").is_none());
}
