//! The ruleset pool serves a start only what a fresh build would give it now. Root only
//! (root-owned trees under /run, as path_cache_tests.rs) and Landlock; each test has its own
//! pool and path cache, and builds "after the start" on its own thread ([`RulesetPool::build_pending`]).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use super::*;
use crate::sandbox::landlock::tests::tries_under;
use crate::sandbox::path_cache::tests::{mkdirs, root_tree};

const EACCES: Result<(), i32> = Err(libc::EACCES);

struct T {
    tree: tempfile::TempDir,
    state: safe_fs::Dir,
    pool: RulesetPool,
}

fn setup(test: &str, cap: usize) -> Option<T> {
    if landlock::kernel_abi().is_none() {
        eprintln!("{test}: skipped: no Landlock");
        return None;
    }
    let tree = root_tree(test)?;
    mkdirs(&tree.path().join("state"), 0o755);
    let state = safe_fs::Dir::open_root(&tree.path().join("state")).unwrap();
    let cache: &'static PathCache = Box::leak(Box::new(PathCache::new(true)));
    Some(T {
        tree,
        state,
        pool: RulesetPool::new(true, cap, cache),
    })
}

impl T {
    fn p(&self, rel: &str) -> PathBuf {
        self.tree.path().join(rel)
    }

    fn home(&self, name: &str) -> PathBuf {
        self.state.path().join(name)
    }

    /// A file `rel` with some content, its directories made 0755.
    fn file(&self, rel: &str) -> PathBuf {
        let p = self.p(rel);
        mkdirs(p.parent().unwrap(), 0o755);
        std::fs::write(&p, b"x").unwrap();
        p
    }

    /// One start of agent `t/NAME` with `plan`: its home opened as `make_home` does, then the
    /// pool's ruleset. Returns the ruleset and whether it was built ahead.
    fn start(&self, name: &str, plan: &Plan) -> (OwnedFd, bool) {
        let home = self.state.mkdir(name, 0o700).unwrap();
        let (fd, pooled) = self
            .pool
            .ruleset(&format!("t/{name}"), 61000, plan, false, home, Vec::new())
            .unwrap();
        (fd.expect("a ruleset"), pooled)
    }

    /// What follows a start's exec: the pool builds the next ruleset (here, on this thread).
    fn after_start(&self) {
        self.pool.build_pending();
    }
}

/// `plan`'s read paths and the agent's home (read-write), as `Grants::plan` makes it.
fn plan(read: &[PathBuf], home: &Path) -> Plan {
    Plan {
        read: read.to_vec(),
        read_write: vec![home.to_path_buf()],
        ..Plan::default()
    }
}

#[test]
fn a_second_start_takes_the_ruleset_built_ahead_and_is_confined_alike() {
    let Some(t) = setup("a_second_start_takes_the_ruleset_built_ahead", 8) else {
        return;
    };
    let allowed = t.file("srv/docs/f");
    let denied = t.file("srv/other/f");
    let mine = t.home("a").join("f");
    let pl = plan(&[t.p("srv/docs")], &t.home("a"));
    let (fresh, pooled) = t.start("a", &pl);
    assert!(!pooled, "nothing was built ahead of the first start");
    std::fs::write(&mine, b"x").unwrap();
    assert!(!t.pool.is_ready("t/a"), "built during the start");
    t.after_start();
    assert!(t.pool.is_ready("t/a"), "not built after the start");
    let (ahead, pooled) = t.start("a", &pl);
    assert!(pooled, "the second start built its own ruleset");
    assert_eq!(t.pool.stats().taken, 1);
    assert!(!t.pool.is_ready("t/a"), "a ruleset serves one start only");
    let paths = [allowed, mine, denied];
    let want = vec![(Ok(()), EACCES), (Ok(()), Ok(())), (EACCES, EACCES)];
    assert_eq!(tries_under(&ahead, &paths), want, "built ahead");
    assert_eq!(tries_under(&fresh, &paths), want, "built at the start");
    // The next one is built after this start, for the third.
    t.after_start();
    assert!(t.start("a", &pl).1);
    assert_eq!(t.pool.stats().taken, 2);
}

#[test]
fn a_changed_contract_is_not_served_the_old_ruleset() {
    let Some(t) = setup("a_changed_contract_is_not_served_the_old_ruleset", 8) else {
        return;
    };
    let docs = t.file("srv/docs/f");
    let more = t.file("srv/more/f");
    t.start("a", &plan(&[t.p("srv/docs")], &t.home("a")));
    t.after_start();
    assert!(t.pool.is_ready("t/a"));
    // The contract now grants srv/more as well.
    let new = plan(&[t.p("srv/docs"), t.p("srv/more")], &t.home("a"));
    let (fd, pooled) = t.start("a", &new);
    assert!(!pooled, "the old contract's ruleset was served");
    assert_eq!(t.pool.stats().stale, 1);
    assert_eq!(
        tries_under(&fd, &[docs, more]),
        vec![(Ok(()), EACCES), (Ok(()), EACCES)]
    );
    // A reload forgets what was built ahead.
    t.after_start();
    assert!(t.pool.is_ready("t/a"));
    t.pool.forget("t/a");
    assert!(!t.pool.is_ready("t/a"));
    assert!(!t.start("a", &new).1);
}

#[test]
fn a_root_only_directory_replaced_between_builds_is_detected_at_take() {
    let Some(t) = setup("a_root_only_directory_replaced_between_builds", 8) else {
        return;
    };
    t.file("srv/docs/f");
    let pl = plan(&[t.p("srv/docs")], &t.home("a"));
    t.start("a", &pl);
    t.after_start();
    assert!(t.pool.is_ready("t/a"));
    // Root moves the granted directory away and puts a new one in its place.
    std::fs::rename(t.p("srv/docs"), t.p("srv/old")).unwrap();
    let new = t.file("srv/docs/f");
    let (fd, pooled) = t.start("a", &pl);
    assert!(!pooled, "the ruleset bound to the old directory was served");
    assert_eq!(t.pool.stats().refused, 1);
    assert_eq!(
        tries_under(&fd, &[new, t.p("srv/old/f")]),
        vec![(Ok(()), EACCES), (EACCES, EACCES)],
        "the new directory is granted, the old one is not"
    );
}

#[test]
fn a_path_beneath_the_home_replaced_or_a_missing_path_made_is_detected_at_take() {
    let Some(t) = setup("a_path_beneath_the_home_replaced", 8) else {
        return;
    };
    // `{state}/bin` executable (beneath the home), /srv/later granted but not there yet.
    let mut pl = plan(&[t.p("srv/later")], &t.home("a"));
    pl.read_exec = vec![t.home("a").join("bin")];
    t.state.mkdir("a", 0o700).unwrap();
    std::fs::create_dir(t.home("a").join("bin")).unwrap();
    t.start("a", &pl);
    t.after_start();
    assert!(t.pool.is_ready("t/a"));
    // The agent swaps its bin for another directory.
    std::fs::rename(t.home("a").join("bin"), t.home("a").join("old")).unwrap();
    std::fs::create_dir(t.home("a").join("bin")).unwrap();
    assert!(!t.start("a", &pl).1, "the home's old bin was served");
    assert_eq!(t.pool.stats().refused, 1);
    // Root makes the missing path: the next start gets it, as a fresh build would.
    t.after_start();
    assert!(t.pool.is_ready("t/a"));
    let later = t.file("srv/later/f");
    let (fd, pooled) = t.start("a", &pl);
    assert!(!pooled, "a ruleset built without srv/later was served");
    assert_eq!(t.pool.stats().refused, 2);
    assert_eq!(tries_under(&fd, &[later]), vec![(Ok(()), EACCES)]);
    // Nothing changed since: taken.
    t.after_start();
    assert!(t.start("a", &pl).1);
}

#[test]
fn a_plan_through_a_world_writable_directory_is_never_pooled() {
    let Some(t) = setup("a_plan_through_a_world_writable_directory", 8) else {
        return;
    };
    let f = t.file("shared/x/f");
    std::fs::set_permissions(t.p("shared"), std::fs::Permissions::from_mode(0o777)).unwrap();
    t.file("srv/docs/f");
    let pl = plan(&[t.p("srv/docs"), t.p("shared/x")], &t.home("a"));
    for _ in 0..3 {
        let (fd, pooled) = t.start("a", &pl);
        assert!(!pooled);
        assert_eq!(
            tries_under(&fd, std::slice::from_ref(&f)),
            vec![(Ok(()), EACCES)]
        );
        t.after_start();
        assert!(
            !t.pool.is_ready("t/a"),
            "built ahead through a 0777 directory"
        );
    }
    let s = t.pool.stats();
    assert_eq!((s.built, s.taken, s.unpoolable), (0, 0, 3), "{s:?}");
}

#[test]
fn the_pool_is_bounded_and_off_means_off() {
    let Some(t) = setup("the_pool_is_bounded", 3) else {
        return;
    };
    for name in ["a", "b", "c", "d", "e"] {
        t.start(name, &plan(&[], &t.home(name)));
    }
    t.after_start();
    assert_eq!(t.pool.ready(), 3);
    t.pool.set_enabled(false);
    assert!(!t.start("a", &plan(&[], &t.home("a"))).1);
}

/// The daemon's path: `sandbox::prepare` takes the ruleset the global pool built on its own
/// thread after the previous start (woken by `after_start`, as `spawn` does), and it confines
/// the agent as the first start's did.
#[test]
fn prepare_takes_the_ruleset_the_pool_thread_built_after_the_start() {
    let Some(t) = setup("prepare_takes_the_ruleset_the_pool_thread_built", 8) else {
        return;
    };
    let _serial = crate::sandbox::netns_pool::TEST_LOCK
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if !RulesetPool::global().enabled() {
        eprintln!("prepare_takes_the_ruleset: skipped: {ENV_SWITCH}=off");
        return;
    }
    let allowed = t.file("srv/docs/f");
    let denied = t.file("srv/other/f");
    let text = format!(
        "apiVersion: agentos/v0.2\nkind: AgentContract\nname: pooled\ntenant: t\n\
         exec: {{ command: /bin/true }}\ncapabilities:\n  - fs.read: [{}]\n",
        t.p("srv/docs").display()
    );
    let c = contracts::parse_contract(&text, "pooled.yaml").unwrap();
    let state = t.p("daemon-state");
    mkdirs(&state, 0o755);
    let first = crate::sandbox::prepare(&state, "t", "pooled", Some(&c)).unwrap();
    assert!(!first.landlock_pooled);
    after_start();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !RulesetPool::global().is_ready("t/pooled") {
        assert!(
            std::time::Instant::now() < deadline,
            "the pool's thread built nothing"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let second = crate::sandbox::prepare(&state, "t", "pooled", Some(&c)).unwrap();
    assert!(second.landlock_pooled, "the second start built its own");
    let paths = [allowed, denied, first.home.join("tmp")];
    let got = |sb: &crate::sandbox::PreparedSandbox| {
        tries_under(sb.landlock.as_ref().expect("a ruleset"), &paths)
    };
    assert_eq!(got(&second), got(&first));
    assert_eq!(got(&second)[..2], [(Ok(()), EACCES), (EACCES, EACCES)]);
    RulesetPool::global().forget("t/pooled");
}
