//! The path cache keeps only what root alone could change, checks it on every use and resolves
//! everything else as before. Root only (root-owned trees, another uid's directory); each test
//! makes its own tree in a fresh root-only directory under /run and injects its own cache and
//! its own "system" paths into the opener, so the host's /usr is never involved.

use std::os::fd::AsFd;
use std::os::unix::fs::{PermissionsExt, symlink};

use super::*;
use crate::sandbox::landlock::Opener;

/// A fresh root-only directory (0755, root's, every parent root's alone), or `None` with a
/// message when this is not root or /run is not root's alone.
pub(in crate::sandbox) fn root_tree(test: &str) -> Option<tempfile::TempDir> {
    if !rustix::process::geteuid().is_root() {
        eprintln!("{test}: skipped: needs root (root-owned trees, chown to another uid)");
        return None;
    }
    let d = tempfile::Builder::new()
        .prefix("agentos-pathcache-")
        .tempdir_in("/run")
        .ok()?;
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).ok()?;
    let (_, _, walk) = safe_fs::resolve_trusted_walk(d.path()).ok()?;
    if !walk.root_only() {
        eprintln!("{test}: skipped: /run is not root's alone here");
        return None;
    }
    Some(d)
}

pub(in crate::sandbox) fn mkdirs(p: &Path, mode: u32) {
    std::fs::create_dir_all(p).unwrap();
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn ino(fd: &RuleFd) -> u64 {
    rustix::fs::fstat(fd.as_fd()).unwrap().st_ino
}

fn open(c: &PathCache, p: &Path, how: Resolve) -> Result<(RuleFd, bool), SafeFsError> {
    c.open(p, how, &mut Checked::default())
}

#[test]
fn root_only_paths_are_opened_once_and_served_after_a_check() {
    let Some(t) = root_tree("root_only_paths_are_opened_once") else {
        return;
    };
    let dir = t.path().join("usr/lib");
    mkdirs(&dir, 0o755);
    std::fs::write(t.path().join("usr/file"), b"x").unwrap();
    // A root link in a root-only directory, as /lib → usr/lib.
    symlink("usr/lib", t.path().join("lib")).unwrap();
    let c = PathCache::new(true);
    let paths = [
        (dir.clone(), Resolve::NoLinks, true),
        (t.path().join("usr/file"), Resolve::NoLinks, false),
        (t.path().join("lib"), Resolve::RootLinks, true),
    ];
    for (p, how, dir) in &paths {
        let (fd, d) = open(&c, p, *how).unwrap();
        assert_eq!(d, *dir, "{}", p.display());
        assert!(matches!(fd, RuleFd::Shared(_)), "{} not kept", p.display());
    }
    assert_eq!(c.stats().stored, 3);
    let first = ino(&open(&c, &dir, Resolve::NoLinks).unwrap().0);
    for _ in 0..3 {
        for (p, how, _) in &paths {
            open(&c, p, *how).unwrap();
        }
    }
    let s = c.stats();
    assert_eq!((s.stored, s.hits, s.dropped, s.resolved), (3, 10, 0, 0));
    assert_eq!(c.len(), 3);
    // The link resolves to the directory itself.
    let l = open(&c, &t.path().join("lib"), Resolve::RootLinks)
        .unwrap()
        .0;
    assert_eq!(ino(&l), first);
    // Switched off: resolved afresh, nothing served from the cache.
    c.set_enabled(false);
    let o = Opener {
        cache: Some(&c),
        ..Opener::default()
    };
    let (fd, _) = o.open_rule(&dir, &mut Checked::default()).unwrap().unwrap();
    assert!(matches!(fd, RuleFd::Own(_)));
    assert_eq!(c.stats().hits, 11);
}

#[test]
fn a_tree_root_renames_into_place_is_picked_up_on_the_next_use() {
    let Some(t) = root_tree("a_tree_root_renames_into_place") else {
        return;
    };
    mkdirs(&t.path().join("srv/docs/sub"), 0o755);
    let c = PathCache::new(true);
    let p = t.path().join("srv/docs/sub");
    let old = ino(&open(&c, &p, Resolve::NoLinks).unwrap().0);
    // Root replaces the whole tree: a new srv with a new docs/sub, renamed over the old one.
    mkdirs(&t.path().join("new/docs/sub"), 0o755);
    std::fs::rename(t.path().join("srv"), t.path().join("old")).unwrap();
    std::fs::rename(t.path().join("new"), t.path().join("srv")).unwrap();
    let (fd, _) = open(&c, &p, Resolve::NoLinks).unwrap();
    let new = ino(&fd);
    assert_ne!(old, new, "the old tree's fd was served");
    assert_eq!(new, std::fs::metadata(&p).map(|m| m.ino()).unwrap());
    let s = c.stats();
    assert_eq!((s.dropped, s.stored), (1, 2));
    // Root turns the leaf into a link: the entry is dropped and the link refused, as without
    // a cache.
    std::fs::rename(&p, t.path().join("srv/docs/moved")).unwrap();
    symlink(t.path().join("srv/docs/moved"), &p).unwrap();
    let e = open(&c, &p, Resolve::NoLinks).unwrap_err();
    assert!(e.to_string().contains("symbolic link"), "{e}");
    // A directory on the way made writable by others: dropped, and not kept again.
    std::fs::remove_file(&p).unwrap();
    mkdirs(&p, 0o755);
    open(&c, &p, Resolve::NoLinks).unwrap();
    std::fs::set_permissions(t.path().join("srv"), std::fs::Permissions::from_mode(0o777)).unwrap();
    let dropped = c.stats().dropped;
    let (fd, _) = open(&c, &p, Resolve::NoLinks).unwrap();
    assert!(matches!(fd, RuleFd::Own(_)));
    assert_eq!(c.stats().dropped, dropped + 1);
    assert!(matches!(
        open(&c, &p, Resolve::NoLinks).unwrap().0,
        RuleFd::Own(_)
    ));
}

use std::os::unix::fs::MetadataExt;

#[test]
fn paths_through_directories_others_can_write_are_resolved_every_time() {
    let Some(t) = root_tree("paths_through_directories_others_can_write") else {
        return;
    };
    let open777 = t.path().join("shared");
    mkdirs(&open777.join("x"), 0o755);
    std::fs::set_permissions(&open777, std::fs::Permissions::from_mode(0o777)).unwrap();
    let user = t.path().join("user");
    mkdirs(&user.join("x"), 0o755);
    std::os::unix::fs::chown(&user, Some(61999), Some(61999)).unwrap();
    let c = PathCache::new(true);
    for p in [
        open777.join("x"),
        user.join("x"),
        open777.clone(),
        user.clone(),
    ] {
        for how in [Resolve::NoLinks, Resolve::RootLinks] {
            for _ in 0..2 {
                let (fd, _) = open(&c, &p, how).unwrap();
                assert!(matches!(fd, RuleFd::Own(_)), "{} kept", p.display());
            }
        }
    }
    let s = c.stats();
    assert_eq!((s.hits, s.stored, s.resolved), (0, 0, 16));
    assert_eq!(c.len(), 0);
    // A link swapped in between two starts (the agent's move in a directory it can write) is
    // refused on the next, as without a cache; a link there is never followed as root's.
    std::fs::rename(open777.join("x"), open777.join("y")).unwrap();
    symlink("/etc", open777.join("x")).unwrap();
    let e = open(&c, &open777.join("x"), Resolve::NoLinks).unwrap_err();
    assert!(e.to_string().contains("is a symbolic link"), "{e}");
    let e = open(&c, &open777.join("x"), Resolve::RootLinks).unwrap_err();
    assert!(matches!(e, SafeFsError::UntrustedLink { .. }), "{e}");
}

#[test]
fn an_opener_keeps_beneath_paths_out_of_the_cache() {
    let Some(t) = root_tree("an_opener_keeps_beneath_paths_out") else {
        return;
    };
    let state = t.path().join("state");
    mkdirs(&state, 0o755);
    let root = safe_fs::Dir::open_root(&state).unwrap();
    // Root's own directory (0700): root-only, yet the agent's home — never cached.
    let home = root.mkdir("home", 0o700).unwrap();
    std::fs::create_dir(home.path().join("sub")).unwrap();
    mkdirs(&t.path().join("srv"), 0o755);
    let c = PathCache::new(true);
    let o = Opener {
        beneath: vec![&home],
        system: vec![],
        cache: Some(&c),
    };
    for _ in 0..2 {
        let mut ck = Checked::default();
        let (h, _) = o
            .open_rule(&home.path().join("sub"), &mut ck)
            .unwrap()
            .unwrap();
        assert!(matches!(h, RuleFd::Own(_)));
        let (s, _) = o
            .open_rule(&t.path().join("srv"), &mut ck)
            .unwrap()
            .unwrap();
        assert!(matches!(s, RuleFd::Shared(_)));
        assert!(
            o.open_rule(&t.path().join("missing"), &mut ck)
                .unwrap()
                .is_none()
        );
    }
    let s = c.stats();
    assert_eq!((s.stored, s.hits), (1, 1));
    // A link planted beneath the home is refused on every start.
    std::fs::remove_dir(home.path().join("sub")).unwrap();
    symlink("/etc", home.path().join("sub")).unwrap();
    let e = o
        .open_rule(&home.path().join("sub"), &mut Checked::default())
        .unwrap_err();
    assert!(e.to_string().contains("symbolic link"), "{e}");
}

#[test]
fn the_cache_is_bounded() {
    let Some(t) = root_tree("the_cache_is_bounded") else {
        return;
    };
    let c = PathCache::new(true);
    for i in 0..MAX_ENTRIES + 10 {
        let p = t.path().join(format!("d{i}"));
        mkdirs(&p, 0o755);
        open(&c, &p, Resolve::NoLinks).unwrap();
    }
    assert_eq!(c.len(), MAX_ENTRIES);
    let s = c.stats();
    assert_eq!((s.stored, s.resolved), (MAX_ENTRIES as u64, 10));
}

#[test]
fn a_ruleset_build_takes_its_host_paths_from_the_cache() {
    let Some(t) = root_tree("a_ruleset_build_takes_its_host_paths_from_the_cache") else {
        return;
    };
    if crate::sandbox::landlock::kernel_abi().is_none() {
        eprintln!("a_ruleset_build_takes_its_host_paths_from_the_cache: skipped: no Landlock");
        return;
    }
    for d in ["usr/bin", "etc", "srv/docs"] {
        mkdirs(&t.path().join(d), 0o755);
    }
    std::fs::write(t.path().join("etc/passwd"), b"root:x:0:0::/:/bin/sh\n").unwrap();
    let c = PathCache::new(true);
    let o = Opener {
        beneath: vec![],
        system: vec![t.path().join("usr/bin"), t.path().join("etc/passwd")],
        cache: Some(&c),
    };
    let plan = crate::sandbox::landlock::Plan {
        read_exec: vec![t.path().join("usr/bin")],
        read: vec![t.path().join("etc/passwd"), t.path().join("srv/docs")],
        read_write: vec![t.path().join("missing")],
        ..Default::default()
    };
    for _ in 0..3 {
        crate::sandbox::landlock::build_with(&plan, false, &o)
            .unwrap()
            .expect("a ruleset");
    }
    let s = c.stats();
    assert_eq!((s.stored, s.hits, s.resolved), (3, 6, 0));
}
