//! The ingest thread's rounds look at the agents whose files the watch saw change, every agent
//! after anything that could lose an event, new agents and backlogs without an event, and each
//! agent through the sweep. Each test has its own log directory under a temporary one, its own
//! keeper and rounds; "looked at" is counted by the keeper (`Logs::stream_looks`: two a look).

use std::io::Write;
use std::path::{Path, PathBuf};

use super::*;
use crate::logs::ingest::tests::append;
use crate::logs::{AgentFiles, Limits, journal};

struct Ag {
    id: String,
    tenant: String,
    name: String,
    log_path: PathBuf,
}

fn who(a: &Ag) -> Who<'_> {
    Who {
        id: &a.id,
        tenant: &a.tenant,
        name: &a.name,
        log_path: &a.log_path,
    }
}

fn agent(dir: &Path, tenant: &str, name: &str) -> Ag {
    Ag {
        id: format!("{tenant}/{name}"),
        tenant: tenant.into(),
        name: name.into(),
        log_path: crate::logs::log_path(dir, tenant, name),
    }
}

/// `per` agents in each of `tenants`, their directories made.
fn agents(dir: &Path, tenants: &[&str], per: usize) -> Vec<Ag> {
    let mut v = Vec::new();
    for t in tenants {
        std::fs::create_dir_all(dir.join(t)).unwrap();
        for k in 0..per {
            v.push(agent(dir, t, &format!("a{k}")));
        }
    }
    v
}

/// What `a`'s journal holds, read without taking anything in (unlike `Logs::query`).
fn journal_of(a: &Ag) -> Vec<String> {
    journal::query(&AgentFiles::of(&a.log_path), journal::Query::default())
        .unwrap()
        .0
        .into_iter()
        .map(|e| e.message)
        .collect()
}

fn round(r: &mut Rounds, logs: &Logs, ags: &[Ag]) -> Round {
    r.round(logs, ags, who)
}

#[test]
fn a_write_is_taken_in_at_the_next_round_and_idle_agents_are_not_looked_at() {
    let dir = tempfile::tempdir().unwrap();
    let ags = agents(dir.path(), &["t1", "t2"], 25);
    let logs = Logs::default();
    let mut r = Rounds::new().with_sweep(0);
    let first = round(&mut r, &logs, &ags);
    assert_eq!(first.full, Some("first round"));
    assert_eq!(first.looked, 50);
    assert!(r.watching(), "no inotify instance");
    let looks = logs.stream_looks();
    for _ in 0..3 {
        let idle = round(&mut r, &logs, &ags);
        assert_eq!((idle.full, idle.looked), (None, 0), "{idle:?}");
    }
    assert_eq!(
        logs.stream_looks(),
        looks,
        "an idle agent's file was looked at"
    );
    append(&ags[7].log_path, b"hello\n");
    append(&AgentFiles::of(&ags[33].log_path).stderr, b"oops\n");
    let busy = round(&mut r, &logs, &ags);
    assert_eq!((busy.full, busy.looked), (None, 2), "{busy:?}");
    assert_eq!(logs.stream_looks(), looks + 4);
    assert_eq!(journal_of(&ags[7]), ["hello"]);
    assert_eq!(journal_of(&ags[33]), ["oops"]);
    // The daemon's own writes (journals, offsets) are no agent's event.
    let after = round(&mut r, &logs, &ags);
    assert_eq!((after.full, after.looked), (None, 0), "{after:?}");
    // A truncation is an event too: the file is read again from its start.
    std::fs::write(&ags[7].log_path, b"hi\n").unwrap();
    assert_eq!(round(&mut r, &logs, &ags).looked, 1);
    assert_eq!(journal_of(&ags[7]), ["hello", "hi"]);
}

#[test]
fn the_sweep_looks_at_every_agent_within_its_rounds_even_without_an_event() {
    let dir = tempfile::tempdir().unwrap();
    let ags = agents(dir.path(), &["t"], 60);
    let logs = Logs::default();
    let mut r = Rounds::new();
    round(&mut r, &logs, &ags);
    // A write the watch does not see: through a hard link in a directory it does not watch.
    let elsewhere = tempfile::tempdir().unwrap();
    let link = elsewhere.path().join("link.log");
    append(&ags[41].log_path, b"");
    std::fs::hard_link(&ags[41].log_path, &link).unwrap();
    round(&mut r, &logs, &ags); // the event of the file's creation
    append(&link, b"unseen\n");
    let looks = logs.stream_looks();
    let mut looked = 0;
    for _ in 0..SWEEP_ROUNDS {
        let x = round(&mut r, &logs, &ags);
        assert_eq!(x.full, None);
        assert_eq!(x.looked, 60 / SWEEP_ROUNDS, "{x:?}");
        looked += x.looked;
    }
    // Each agent once in SWEEP_ROUNDS rounds: 120 streams instead of 2 × 60 × 20.
    assert_eq!(looked, 60);
    assert_eq!(logs.stream_looks() - looks, 120);
    assert_eq!(journal_of(&ags[41]), ["unseen"]);
}

#[test]
fn a_queue_overflow_makes_a_full_round_that_takes_everything() {
    let dir = tempfile::tempdir().unwrap();
    let ags = agents(dir.path(), &["t"], 3);
    let logs = Logs::default();
    let mut r = Rounds::new().with_sweep(0).with_max_events(usize::MAX);
    round(&mut r, &logs, &ags);
    let queued: usize = std::fs::read_to_string("/proc/sys/fs/inotify/max_queued_events")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // Writes to two files in turn (the kernel merges only an event equal to the last one
    // queued): more events than the queue holds, then one whose event is lost.
    let (mut a, mut b) = (
        std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(&ags[0].log_path)
            .unwrap(),
        std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(&ags[1].log_path)
            .unwrap(),
    );
    for _ in 0..queued / 2 + 8 {
        a.write_all(b"a\n").unwrap();
        b.write_all(b"b\n").unwrap();
    }
    append(&ags[2].log_path, b"after the overflow\n");
    let x = round(&mut r, &logs, &ags);
    assert_eq!(x.full, Some("the watch's queue overflowed"), "{x:?}");
    assert_eq!(x.looked, 3);
    assert_eq!(journal_of(&ags[0]).len(), queued / 2 + 8);
    assert_eq!(journal_of(&ags[1]).len(), queued / 2 + 8);
    assert_eq!(journal_of(&ags[2]), ["after the overflow"]);
    let idle = round(&mut r, &logs, &ags);
    assert_eq!((idle.full, idle.looked), (None, 0), "{idle:?}");
}

#[test]
fn more_events_than_a_round_reads_make_a_full_round() {
    let dir = tempfile::tempdir().unwrap();
    let ags = agents(dir.path(), &["t"], 10);
    let logs = Logs::default();
    let mut r = Rounds::new().with_sweep(0).with_max_events(4);
    round(&mut r, &logs, &ags);
    for (k, a) in ags.iter().enumerate() {
        append(&a.log_path, format!("line {k}\n").as_bytes());
    }
    let x = round(&mut r, &logs, &ags);
    assert_eq!(x.full, Some("more events than a round reads"), "{x:?}");
    assert_eq!((x.looked, x.events), (10, 5));
    for (k, a) in ags.iter().enumerate() {
        assert_eq!(journal_of(a), [format!("line {k}")]);
    }
    // The rest of the queue is read by the next rounds (nothing new in the files).
    while round(&mut r, &logs, &ags).events > 0 {}
    let idle = round(&mut r, &logs, &ags);
    assert_eq!((idle.full, idle.looked), (None, 0), "{idle:?}");
}

#[test]
fn a_tenant_directory_made_after_the_watch_started_is_covered() {
    let dir = tempfile::tempdir().unwrap();
    let mut ags = agents(dir.path(), &["early"], 2);
    ags.push(agent(dir.path(), "late", "bot"));
    let logs = Logs::default();
    let mut r = Rounds::new().with_sweep(0);
    round(&mut r, &logs, &ags);
    // Not there yet: its agents are looked at every round until it is watched.
    assert_eq!(round(&mut r, &logs, &ags).looked, 1);
    std::fs::create_dir(dir.path().join("late")).unwrap();
    append(&ags[2].log_path, b"before the watch\n");
    let x = round(&mut r, &logs, &ags);
    assert_eq!((x.full, x.looked), (None, 1), "{x:?}");
    assert_eq!(journal_of(&ags[2]), ["before the watch"]);
    // Watched now: idle costs nothing, a write is an event.
    assert_eq!(round(&mut r, &logs, &ags).looked, 0);
    append(&ags[2].log_path, b"after\n");
    assert_eq!(round(&mut r, &logs, &ags).looked, 1);
    assert_eq!(journal_of(&ags[2]), ["before the watch", "after"]);
    // Deleted and made again: the watch is gone (a full round) and added again.
    std::fs::remove_dir_all(dir.path().join("late")).unwrap();
    let gone = round(&mut r, &logs, &ags);
    assert!(gone.full.is_some(), "{gone:?}");
    std::fs::create_dir(dir.path().join("late")).unwrap();
    append(&ags[2].log_path, b"new dir\n");
    round(&mut r, &logs, &ags);
    assert_eq!(journal_of(&ags[2]), ["new dir"]);
    assert_eq!(round(&mut r, &logs, &ags).looked, 0);
    append(&ags[2].log_path, b"watched again\n");
    assert_eq!(round(&mut r, &logs, &ags).looked, 1);
    assert_eq!(journal_of(&ags[2]), ["new dir", "watched again"]);
}

#[test]
fn a_directory_that_cannot_be_watched_has_its_agents_looked_at_every_round() {
    let dir = tempfile::tempdir().unwrap();
    let ags = agents(dir.path(), &["t1", "t2"], 3);
    let logs = Logs::default();
    // One watch at most: t2's cannot be added, as when `max_user_watches` is reached.
    let mut r = Rounds::new().with_sweep(0).with_max_watches(1);
    round(&mut r, &logs, &ags);
    for k in 0..SWEEP_ROUNDS + 2 {
        append(&ags[4].log_path, format!("line {k}\n").as_bytes());
        let x = round(&mut r, &logs, &ags);
        assert_eq!((x.full, x.looked), (None, 3), "round {k}: {x:?}");
        assert_eq!(journal_of(&ags[4]).len(), k + 1);
    }
    append(&ags[1].log_path, b"watched\n");
    assert_eq!(round(&mut r, &logs, &ags).looked, 4);
    assert_eq!(journal_of(&ags[1]), ["watched"]);
}

#[test]
fn a_new_agent_is_looked_at_in_its_first_round() {
    let dir = tempfile::tempdir().unwrap();
    let mut ags = agents(dir.path(), &["t"], 2);
    // Output of a previous run, written before anything was watched.
    let b = ags.pop().unwrap();
    append(&b.log_path, b"previous run\n");
    let logs = Logs::default();
    let mut r = Rounds::new().with_sweep(0);
    round(&mut r, &logs, &ags);
    assert_eq!(round(&mut r, &logs, &ags).looked, 0);
    ags.push(b);
    let x = round(&mut r, &logs, &ags);
    assert_eq!((x.full, x.looked), (None, 1), "{x:?}");
    assert_eq!(journal_of(&ags[1]), ["previous run"]);
}

#[test]
fn a_stream_replaced_by_a_symlink_is_still_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ags = agents(dir.path(), &["t"], 2);
    let secret = dir.path().join("secret");
    std::fs::write(&secret, b"root's secret\n").unwrap();
    let logs = Logs::default();
    let mut r = Rounds::new().with_sweep(0);
    append(&ags[0].log_path, b"mine\n");
    round(&mut r, &logs, &ags);
    std::fs::remove_file(&ags[0].log_path).unwrap();
    std::os::unix::fs::symlink(&secret, &ags[0].log_path).unwrap();
    let looks = logs.stream_looks();
    let x = round(&mut r, &logs, &ags);
    assert_eq!(x.looked, 1, "the link's event: {x:?}");
    assert_eq!(logs.stream_looks(), looks + 2);
    assert_eq!(x.taken, 0);
    assert_eq!(journal_of(&ags[0]), ["mine"]);
}

#[test]
fn a_backlog_is_taken_in_without_events_and_a_flood_is_one_look_a_round() {
    let dir = tempfile::tempdir().unwrap();
    let ags = agents(dir.path(), &["t"], 40);
    let limits = Limits {
        journal_max: 1 << 20,
        per_round: 1 << 10,
        backlog_max: 64 << 10,
    };
    let logs = Logs::new(limits, None);
    let mut r = Rounds::new().with_sweep(0);
    round(&mut r, &logs, &ags);
    // 3 KiB at once: a look takes 1 KiB; the rest comes in the next rounds with no new write.
    let line = format!("{}\n", "x".repeat(63));
    append(&ags[5].log_path, line.repeat(48).as_bytes());
    for want in [16, 32, 48] {
        let x = round(&mut r, &logs, &ags);
        assert_eq!(x.looked, 1, "{x:?}");
        assert_eq!(journal_of(&ags[5]).len(), want);
    }
    assert_eq!(round(&mut r, &logs, &ags).looked, 0);
    // Many writes between two rounds: one look.
    for _ in 0..100 {
        append(&ags[6].log_path, b"y\n");
    }
    assert_eq!(round(&mut r, &logs, &ags).looked, 1);
    assert_eq!(journal_of(&ags[6]).len(), 100);
    // Every agent writing its 1 KiB: the round stops at its cap (32 looks of 1 KiB), the next
    // one is full and starts with those it did not reach.
    for a in &ags {
        append(&a.log_path, line.repeat(16).as_bytes());
    }
    let x = round(&mut r, &logs, &ags);
    assert_eq!((x.looked, x.taken), (32, logs.round_max()), "{x:?}");
    let y = round(&mut r, &logs, &ags);
    assert_eq!(y.full, Some("the last round reached its byte cap"));
    assert_eq!(y.taken, 8 << 10, "{y:?}");
    for a in &ags {
        assert!(journal_of(a).len() >= 16, "{}", a.id);
    }
    assert_eq!(round(&mut r, &logs, &ags).looked, 0);
}

/// A round over 10 000 idle agents (100 tenants of 100): every stream looked at (as before the
/// watch) against the watch's round. `cargo test -p agentosd --lib --release
/// logs::rounds::tests::idle_round_cost -- --ignored --nocapture`.
#[test]
#[ignore = "a measurement"]
fn idle_round_cost() {
    let dir = tempfile::tempdir().unwrap();
    let tenants: Vec<String> = (0..100).map(|k| format!("t{k}")).collect();
    let names: Vec<&str> = tenants.iter().map(String::as_str).collect();
    let ags = agents(dir.path(), &names, 100);
    for a in &ags {
        append(&a.log_path, b"started\n");
    }
    let logs = Logs::default();
    let mut r = Rounds::new();
    let mut quiet = Rounds::new().with_sweep(0);
    // The first rounds: everything taken in, then the events of the daemon's own writes
    // (journals, offsets: more than the queue holds) read in a full round.
    round(&mut r, &logs, &ags);
    while round(&mut r, &logs, &ags).full.is_some() {}
    while round(&mut quiet, &logs, &ags).full.is_some() {}
    let n = 20u32;
    let t = std::time::Instant::now();
    for _ in 0..n {
        for a in &ags {
            logs.ingest(&who(a), false);
        }
    }
    let every = t.elapsed() / n;
    let timed = |r: &mut Rounds| {
        let looks = logs.stream_looks();
        let t = std::time::Instant::now();
        for _ in 0..n {
            let x = round(r, &logs, &ags);
            assert_eq!(x.full, None);
        }
        (
            t.elapsed() / n,
            (logs.stream_looks() - looks) / u64::from(n),
        )
    };
    let (swept, swept_looks) = timed(&mut r);
    let (events_only, quiet_looks) = timed(&mut quiet);
    println!(
        "10 000 idle agents, one round: every stream looked at {every:?} (20 000 streams); \
         watched {swept:?} ({swept_looks} streams, the sweep); watched without the sweep \
         {events_only:?} ({quiet_looks} streams)"
    );
}
