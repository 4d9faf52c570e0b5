//! The kill -9 storm: see the crate's documentation.

use std::collections::{BTreeMap, BTreeSet};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::common::{self, Bus, Daemon, TestCgroup, audit, audit_records, output_text};
use crate::skip_unless_capable;
use crate::{Rng, agent_processes, chmod, env_u64, holders, now_s, populated, tools_dir};

/// The storm's agent: connects to `$AGENTOS_SOCKET` (again whenever the daemon went away),
/// calls `clock.now` in a loop with ids of its own (`NAME:PID:N`), and appends to
/// `OUT/calls` one line per call it got a result for; every fifth call it probes its
/// enforcement (a write outside its scopes, a connect to an ungranted and to its granted port).
const AGENT_PY: &str = include_str!("storm_agent.py");

/// The storm's world: a bus, a cgroup root, pinned BPF programs, the tools directory with
/// `clock.now`, and the agents' contracts.
struct Storm {
    _bus: Bus,
    cg: TestCgroup,
    dir: tempfile::TempDir,
    d: Daemon,
    names: Vec<String>,
    /// Agents with a network grant (their socket broker is involved).
    net: BTreeSet<String>,
    good: TcpListener,
    bad: TcpListener,
}

impl Drop for Storm {
    fn drop(&mut self) {
        self.d.kill9();
        if std::thread::panicking() {
            // The trail, the agents' call logs and the daemon's log, for the post-mortem.
            self.dir.disable_cleanup(true);
            eprintln!("storm files kept in {}", self.dir.path().display());
        }
        destroy_cgroup_quietly(&self.cg.path);
        let pins = self.dir.path().join("bpffs");
        let _ = nix::mount::umount2(&pins, nix::mount::MntFlags::MNT_DETACH);
    }
}

fn destroy_cgroup_quietly(p: &Path) {
    common::destroy_cgroup_tree(p);
}

/// Accept and drop every connection, so the backlog never fills.
fn accept_all(l: &TcpListener) {
    let l = l.try_clone().unwrap();
    std::thread::spawn(move || {
        for c in l.incoming() {
            drop(c);
        }
    });
}

impl Storm {
    fn new(agents: usize) -> Storm {
        let bus = Bus::start();
        let cg = TestCgroup::new("faults");
        let dir = tempfile::tempdir().unwrap();
        chmod(dir.path(), 0o711);
        let base = dir.path();
        let state = base.join("state");
        let tools = tools_dir(base);
        let pins = base.join("bpffs");
        let d = Daemon::start_with(
            &bus,
            &cg.path,
            &state,
            &[
                "--bpf-pin-dir",
                pins.to_str().unwrap(),
                "--tools-dir",
                tools.to_str().unwrap(),
                "--no-audit-journal",
            ],
        );
        let good = TcpListener::bind("127.0.0.1:0").unwrap();
        let bad = TcpListener::bind("127.0.0.1:0").unwrap();
        accept_all(&good);
        accept_all(&bad);
        let script = base.join("agent.py");
        std::fs::write(&script, AGENT_PY).unwrap();
        chmod(&script, 0o644);
        let outside = base.join("outside");
        std::fs::create_dir(&outside).unwrap();
        chmod(&outside, 0o777);
        let mut s = Storm {
            _bus: bus,
            cg,
            dir,
            d,
            names: Vec::new(),
            net: BTreeSet::new(),
            good,
            bad,
        };
        for i in 0..agents {
            let name = format!("storm{i}");
            let out = s.out_dir(&name);
            std::fs::create_dir_all(&out).unwrap();
            chmod(&out, 0o777);
            let with_net = i % 2 == 0;
            let good = if with_net {
                s.good.local_addr().unwrap().port()
            } else {
                0
            };
            let grant = if with_net {
                format!("  - net.connect: [\"127.0.0.1:{good}\"]\n")
            } else {
                String::new()
            };
            let text = format!(
                r#"apiVersion: agentos/v0.2
kind: AgentContract
name: {name}
class: {{ latency: DT }}
exec: {{ command: /usr/bin/python3, args: ["{script}", "{name}", "{out}", "{good}", "{bad}", "{outside}"], env: {{ PYTHONDONTWRITEBYTECODE: "1" }} }}
restart: "no"
capabilities:
  - clock.now
  - fs.read: ["{script}"]
  - fs.exec: [/usr, /bin, /lib]
  - fs.write: ["{out}"]
{grant}"#,
                script = script.display(),
                out = out.display(),
                bad = s.bad.local_addr().unwrap().port(),
                outside = outside.display(),
            );
            std::fs::write(s.contract(&name), text).unwrap();
            if with_net {
                s.net.insert(name.clone());
            }
            s.names.push(name);
        }
        s
    }

    fn out_dir(&self, name: &str) -> PathBuf {
        self.dir.path().join("out").join(name)
    }

    fn contract(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("{name}.yaml"))
    }

    /// What the agent logged: (acknowledged call ids, probe lines with their time).
    fn agent_lines(&self, name: &str) -> Vec<serde_json::Value> {
        std::fs::read_to_string(self.out_dir(name).join("calls"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

/// What the driver asked of one agent and what it was answered.
#[derive(Default, Clone)]
struct Asked {
    /// `Some(true)`: the last request was an answered start; `Some(false)`: an answered stop;
    /// `None`: the last request got no answer (the daemon died, or refused it).
    expect: Option<bool>,
    starts_acked: u64,
    stops_acked: u64,
    unanswered: u64,
}

/// What the driver is doing now (for the kill statistics): 0 idle, 1 start, 2 stop.
static IN_FLIGHT: AtomicU8 = AtomicU8::new(0);

/// Start and stop the agents at random over agentctl until `stop` is set.
fn drive(
    bus: String,
    contracts: Vec<(String, PathBuf)>,
    seed: u64,
    stop: Arc<AtomicBool>,
) -> BTreeMap<String, Asked> {
    let mut rng = Rng(seed ^ 0x5eed);
    let mut asked: BTreeMap<String, Asked> = BTreeMap::new();
    let mut belief: BTreeMap<String, Option<bool>> = BTreeMap::new();
    while !stop.load(Ordering::SeqCst) {
        let (name, file) = &contracts[rng.below(contracts.len() as u64) as usize];
        let start = match belief.get(name).copied().flatten() {
            Some(running) => !running,
            None => rng.below(2) == 0,
        };
        let id = format!("default/{name}");
        let args: Vec<&str> = if start {
            vec!["start", file.to_str().unwrap()]
        } else {
            vec!["stop", &id]
        };
        IN_FLIGHT.store(if start { 1 } else { 2 }, Ordering::SeqCst);
        let out = Command::new(common::agentctl_bin())
            .arg("--bus-address")
            .arg(&bus)
            .args(&args)
            .output()
            .unwrap();
        IN_FLIGHT.store(0, Ordering::SeqCst);
        let a = asked.entry(name.clone()).or_default();
        if out.status.success() {
            a.expect = Some(start);
            if start {
                a.starts_acked += 1;
            } else {
                a.stops_acked += 1;
            }
            belief.insert(name.clone(), Some(start));
        } else {
            a.expect = None;
            a.unanswered += 1;
            belief.insert(name.clone(), None);
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(rng.below(30)));
    }
    asked
}
/// Wait until no agent is in a transitional state; returns the list.
fn settled(d: &Daemon) -> Vec<serde_json::Value> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let list = d.list_json();
        let moving: Vec<_> = list
            .iter()
            .filter(|a| {
                !matches!(
                    a["state"].as_str(),
                    Some("running" | "inactive" | "failed" | "exited")
                )
            })
            .collect();
        if moving.is_empty() {
            return list;
        }
        assert!(
            Instant::now() < deadline,
            "agents still moving 20 s after the storm: {moving:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn kill9_storm_loses_nothing_and_keeps_enforcing() {
    skip_unless_capable!();
    if let Err(e) = agentosd::enforce::net::probe_load() {
        common::skip(
            "faults",
            &format!("the cgroup BPF programs cannot load here: {e}"),
        );
        return;
    }
    if !Path::new("/usr/bin/python3").exists() {
        common::skip("faults", "/usr/bin/python3 is needed for the agents");
        return;
    }
    let rounds = env_u64("AGENTOS_FAULTS_ROUNDS").unwrap_or(50);
    let seed = env_u64("AGENTOS_FAULTS_SEED").unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
    });
    eprintln!(
        "faults storm: {rounds} rounds, seed {seed} (AGENTOS_FAULTS_SEED={seed} repeats its choices, not its timing)"
    );
    let mut storm = Storm::new(6);
    let script = storm.dir.path().join("agent.py");
    let stop = Arc::new(AtomicBool::new(false));
    let driver = {
        let bus = storm.d.bus.clone();
        let contracts: Vec<(String, PathBuf)> = storm
            .names
            .iter()
            .map(|n| (n.clone(), storm.contract(n)))
            .collect();
        let stop = stop.clone();
        std::thread::spawn(move || drive(bus, contracts, seed, stop))
    };
    let mut rng = Rng(seed);
    let mut hit = [0u32; 3];
    let mut restarts = Vec::new();
    let t0 = Instant::now();
    for round in 0..rounds {
        std::thread::sleep(Duration::from_millis(20 + rng.below(700)));
        hit[IN_FLIGHT.load(Ordering::SeqCst) as usize] += 1;
        storm.d.kill9();
        std::thread::sleep(Duration::from_millis(rng.below(100)));
        let t = Instant::now();
        let seen = storm.d.log_text().len();
        storm.d.spawn();
        restarts.push(t.elapsed());
        // Up in seconds: at most the 10 s wait for the audit log's lock on top of loading the
        // programs and re-adopting six agents.
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "round {round}: the restarted daemon took {:?} to answer:\n{}",
            t.elapsed(),
            &storm.d.log_text()[seen..]
        );
        // Each daemon opens the trail it was killed holding (else it refuses every start).
        let log = storm.d.log_text();
        if log[seen..].contains("cannot open the audit trail") {
            let trail = storm.d.state_dir.join("audit/audit.log");
            panic!(
                "round {round}: the restarted daemon cannot open its audit trail; processes holding {}: {:?}\n{}",
                trail.display(),
                holders(&trail),
                &log[seen..]
            );
        }
    }
    let storm_time = t0.elapsed();
    stop.store(true, Ordering::SeqCst);
    let asked = driver.join().unwrap();
    restarts.sort();
    eprintln!(
        "{rounds} kill -9 rounds in {storm_time:?}: killed while idle {}, in a start {}, in a stop {}; \
         restart until answering: p50 {:?}, max {:?}",
        hit[0],
        hit[1],
        hit[2],
        restarts.get(restarts.len() / 2),
        restarts.last()
    );
    let d = &storm.d;
    let list = settled(d);
    let after_storm = now_s();
    check_states(&storm, &asked, &list, &script);
    check_audit(&storm, &asked);
    check_enforced(&storm, &list, after_storm);
    let log = d.log_text();
    assert!(!log.contains("panicked"), "the daemon panicked:\n{log}");
    eprintln!(
        "restarts that waited for the audit log's lock (held by a forked child of the killed daemon): {}",
        log.matches("is locked; waiting up to").count()
    );
    if rounds >= 20 {
        assert!(
            hit[1] > 0 && hit[2] > 0,
            "no kill landed in a start or a stop ({hit:?}): the storm proves little; seed {seed}"
        );
    }
}

/// Every agent is where the driver's last answered request put it, and nothing runs that the
/// daemon does not know.
fn check_states(
    storm: &Storm,
    asked: &BTreeMap<String, Asked>,
    list: &[serde_json::Value],
    script: &Path,
) {
    let by_name: BTreeMap<&str, &serde_json::Value> = list
        .iter()
        .map(|a| (a["name"].as_str().unwrap(), a))
        .collect();
    let mut running_cgroups = BTreeSet::new();
    for name in &storm.names {
        let a = asked.get(name).cloned().unwrap_or_default();
        let row = by_name.get(name.as_str());
        let state = row.map_or("unknown", |r| r["state"].as_str().unwrap());
        let procs = agent_processes(script, name);
        let where_: Vec<String> = procs.iter().map(|p| common::proc_cgroup(*p)).collect();
        let why = format!(
            "agent {name}: state {state}, asked {:?} (starts answered {}, stops answered {}, unanswered {}), its processes {procs:?} in {where_:?}, row {row:?}",
            a.expect, a.starts_acked, a.stops_acked, a.unanswered
        );
        match a.expect {
            Some(true) => assert_eq!(state, "running", "{why}"),
            Some(false) => assert_ne!(state, "running", "{why}"),
            None => {}
        }
        let cg = storm.cg.path.join("agents/default").join(name);
        if state == "running" {
            let pid = row.unwrap()["main_pid"].as_u64().unwrap() as u32;
            assert_eq!(procs, vec![pid], "one run, the recorded one: {why}");
            let main = std::fs::read_to_string(cg.join("main/cgroup.procs")).unwrap_or_default();
            assert!(
                main.lines().any(|l| l == pid.to_string()),
                "{why}: not in its main cgroup ({main})"
            );
            running_cgroups.insert(cg);
        } else {
            assert!(procs.is_empty(), "a stopped agent runs: {why}");
        }
    }
    for (cgroup, pids) in populated(&storm.cg.path) {
        assert!(
            running_cgroups.iter().any(|r| cgroup.starts_with(r)),
            "{} has processes {pids:?} but belongs to no running agent",
            cgroup.display()
        );
    }
}

/// The chain verifies; every call an agent saw answered and every answered start is in it.
fn check_audit(storm: &Storm, asked: &BTreeMap<String, Asked>) {
    let state = &storm.d.state_dir;
    // The agents keep calling: what they saw answered first, then the trail, which must hold
    // at least all of that.
    let acked: BTreeMap<&String, Vec<String>> = storm
        .names
        .iter()
        .map(|name| {
            let ids = storm
                .agent_lines(name)
                .iter()
                .filter_map(|l| l["call"].as_str().map(String::from))
                .collect();
            (name, ids)
        })
        .collect();
    let o = audit(state, &["verify"]);
    assert_eq!(o.status.code(), Some(0), "{}", output_text(&o));
    let records = audit_records(state);
    let allowed: BTreeSet<&str> = records
        .iter()
        .filter(|r| r["kind"] == "gate" && r["decision"] == "allow")
        .filter_map(|r| r["detail"]["request_id"].as_str())
        .collect();
    let mut calls = 0;
    for name in &storm.names {
        let acked = &acked[name];
        let lost: Vec<&String> = acked
            .iter()
            .filter(|c| !allowed.contains(c.as_str()))
            .collect();
        assert!(
            lost.is_empty(),
            "agent {name}: {} of {} answered calls have no allow record: {:?}",
            lost.len(),
            acked.len(),
            &lost[..lost.len().min(10)]
        );
        calls += acked.len();
        let starts = records
            .iter()
            .filter(|r| {
                r["agent"] == name.as_str()
                    && r["kind"] == "lifecycle"
                    && r["detail"]["event"] == "start"
            })
            .count() as u64;
        let a = asked.get(name).cloned().unwrap_or_default();
        assert!(
            starts >= a.starts_acked,
            "agent {name}: {} answered starts but {starts} start records",
            a.starts_acked
        );
    }
    eprintln!(
        "audit: {} records verify; {calls} answered tool calls all recorded",
        records.len()
    );
}

/// Every running agent is still confined and served: fresh probe lines after the storm.
fn check_enforced(storm: &Storm, list: &[serde_json::Value], after: f64) {
    let running: Vec<&str> = list
        .iter()
        .filter(|a| a["state"] == "running")
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut readopted = 0;
    for name in &running {
        let probe = loop {
            let lines = storm.agent_lines(name);
            let fresh = |l: &&serde_json::Value| l["t"].as_f64().is_some_and(|t| t > after);
            let probe = lines
                .iter()
                .filter(fresh)
                .find_map(|l| l.get("probe").cloned());
            let call = lines.iter().filter(fresh).any(|l| l["call"].is_string());
            if let Some(probe) = probe.filter(|_| call) {
                break probe;
            }
            assert!(
                Instant::now() < deadline,
                "agent {name}: no probe and answered call since the storm; its last lines: {:?}",
                &lines[lines.len().saturating_sub(5)..]
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        let st = storm.d.status_json(name);
        if st.to_string().contains("re-adopted") {
            readopted += 1;
        }
        assert_eq!(probe["write"], "EACCES", "agent {name}: {probe} ({st})");
        let bad = probe["bad"].as_str().unwrap();
        if storm.net.contains(*name) {
            // Landlock's TCP rule (EACCES) or the cgroup BPF program (EPERM).
            assert!(
                ["EACCES", "EPERM"].contains(&bad),
                "agent {name}: ungranted connect: {probe}"
            );
            assert_eq!(
                probe["good"], "ok",
                "agent {name}: granted connect: {probe}"
            );
        } else {
            // No network grant: seccomp refuses the inet socket itself.
            assert_eq!(bad, "EAFNOSUPPORT", "agent {name}: {probe}");
        }
    }
    eprintln!(
        "after the storm: {} running ({readopted} re-adopted), all confined and served",
        running.len()
    );
}
