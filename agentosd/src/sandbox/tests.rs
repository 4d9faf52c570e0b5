//! What a contract's capabilities become before anything is opened: each grant in its own list
//! (`Grants::from_contract`) and the Landlock plan built from them (`Grants::plan`). The escape
//! suite holds the same through the kernel; these hold it for every capability on its own.

use super::*;

fn contract(caps: &str) -> Contract {
    let text = format!(
        "apiVersion: agentos/v0.2\nkind: AgentContract\nname: g\nexec: {{ command: /bin/true }}\n{caps}"
    );
    contracts::parse_contract(&text, "g.yaml").expect("the test contract parses")
}

const HOME: &str = "/var/lib/agentos/home/t/g";

fn paths(v: &[&str]) -> Vec<PathBuf> {
    v.iter().map(PathBuf::from).collect()
}

#[test]
fn each_capability_goes_to_its_own_grant() {
    let c = contract(
        "capabilities:\n  - fs.read: [/srv/r]\n  - fs.write: [/srv/w, \"{state}/out\"]\n  - fs.exec: [/opt/x]\n  - net.connect: [\"127.0.0.1:8080\"]\n  - net.bind: [\"127.0.0.1:9090\"]\n",
    );
    let g = Grants::from_contract(&c, Path::new(HOME));
    assert_eq!(g.fs_read, paths(&["/srv/r"]));
    assert_eq!(g.fs_write, paths(&["/srv/w", &format!("{HOME}/out")]));
    assert_eq!(g.fs_exec, paths(&["/opt/x"]));
    assert_eq!(g.net_connect, vec!["127.0.0.1:8080".to_string()]);
    assert_eq!(g.net_bind, vec!["127.0.0.1:9090".to_string()]);
    // Nothing else grants anything.
    let none = Grants::from_contract(&contract("capabilities: []\n"), Path::new(HOME));
    assert_eq!(
        (none.fs_read.len(), none.fs_write.len(), none.fs_exec.len()),
        (0, 0, 0)
    );
    assert!(none.net_connect.is_empty() && none.net_bind.is_empty());
}

#[test]
fn the_plan_is_the_baseline_plus_the_grants_and_the_home() {
    let c = contract(
        "capabilities:\n  - fs.read: [/srv/r]\n  - fs.write: [/srv/w]\n  - fs.exec: [/opt/x]\n  - net.connect: [\"127.0.0.1:8080\"]\n  - net.bind: [\"127.0.0.1:9090\"]\n",
    );
    let plan = Grants::from_contract(&c, Path::new(HOME))
        .plan(Path::new(HOME))
        .unwrap();
    let base = |v: &[&str]| paths(v);
    assert!(plan.read.starts_with(&base(landlock::BASE_READ)));
    assert_eq!(plan.read.last(), Some(&PathBuf::from("/srv/r")));
    assert!(plan.read_exec.starts_with(&base(landlock::BASE_READ_EXEC)));
    assert_eq!(plan.read_exec.last(), Some(&PathBuf::from("/opt/x")));
    assert!(plan.read_write.ends_with(&paths(&[HOME, "/srv/w"])));
    // The granted port and the DNS port (TCP DNS goes to the daemon's stub): nothing else.
    assert_eq!(plan.connect, Some(vec![crate::dns::PORT, 8080]));
    assert_eq!(plan.bind, Some(vec![9090]));
    assert!(!plan.unscoped);
}

#[test]
fn without_network_grants_no_port_is_reachable_not_even_dns() {
    let g = Grants::from_contract(&contract("capabilities: []\n"), Path::new(HOME));
    let plan = g.plan(Path::new(HOME)).unwrap();
    assert_eq!(plan.connect, Some(vec![]));
    assert_eq!(plan.bind, Some(vec![]));
    // Only a bind grant: still no connect port, the DNS one included.
    let c = contract("capabilities:\n  - net.bind: [\"127.0.0.1:9090\"]\n");
    let plan = Grants::from_contract(&c, Path::new(HOME))
        .plan(Path::new(HOME))
        .unwrap();
    assert_eq!(plan.connect, Some(vec![]));
    assert_eq!(plan.bind, Some(vec![9090]));
}
