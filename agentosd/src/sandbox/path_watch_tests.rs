//! The path watch certifies a kept path's walk after one `lstat` check and uncertifies it on
//! any change that could make the path resolve elsewhere: a rename on the walk, a directory's
//! mode or owner, a link put in place, a mount. Each test makes its own root-only tree under
//! /run (as the path cache's tests) and uses its own watch and cache.

use std::os::fd::AsFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::Path;

use super::*;
use crate::sandbox::path_cache::tests::{mkdirs, root_tree};
use crate::sandbox::path_cache::{Checked, PathCache, Resolve, RuleFd};

fn open(c: &PathCache, w: &PathWatch, p: &Path) -> Result<RuleFd, crate::safe_fs::SafeFsError> {
    c.open(p, Resolve::NoLinks, &mut Checked::with_watch(Some(w)))
        .map(|(fd, _)| fd)
}

fn ino(fd: &RuleFd) -> u64 {
    rustix::fs::fstat(fd.as_fd()).unwrap().st_ino
}

/// Open `p` until its walk is served certified: stored (if not yet), checked by `lstat` and
/// certified, then served with no `lstat` (at most three opens). Returns how many objects its
/// walk has.
fn certify(c: &PathCache, w: &PathWatch, p: &Path) -> u64 {
    for _ in 0..3 {
        let before = w.stats();
        open(c, w, p).unwrap();
        let after = w.stats();
        if after.armed == before.armed && after.certified > before.certified {
            let n = after.certified - before.certified;
            assert!(n >= 4, "the walk of {p:?} has {n} objects");
            return n;
        }
    }
    panic!("the walk of {p:?} was not certified: {:?}", w.stats());
}

#[test]
fn a_certified_walk_is_served_without_lstat_and_a_rename_on_it_is_seen() {
    let Some(t) = root_tree("a_certified_walk_is_served_without_lstat") else {
        return;
    };
    mkdirs(&t.path().join("srv/docs/sub"), 0o755);
    let p = t.path().join("srv/docs/sub");
    let (c, w) = (PathCache::new(true), PathWatch::new(true));
    let old = ino(&open(&c, &w, &p).unwrap());
    let n = certify(&c, &w, &p);
    // Other names in the walk's directories do not matter: still certified.
    std::fs::write(t.path().join("srv/other"), b"x").unwrap();
    mkdirs(&t.path().join("srv/docs/sub/child"), 0o755);
    let s = w.stats();
    assert_eq!(ino(&open(&c, &w, &p).unwrap()), old);
    assert_eq!(w.stats().certified - s.certified, n, "{:?}", w.stats());
    assert_eq!(w.stats().resets, 0);
    assert!(w.stats().ignored >= 2, "{:?}", w.stats());
    // Root replaces the tree: a new srv with a new docs/sub renamed over the old one. The
    // certified walk is not served: the new tree's object is.
    mkdirs(&t.path().join("new/docs/sub"), 0o755);
    std::fs::rename(t.path().join("srv"), t.path().join("old")).unwrap();
    std::fs::rename(t.path().join("new"), t.path().join("srv")).unwrap();
    let dropped = c.stats().dropped;
    let new = ino(&open(&c, &w, &p).unwrap());
    assert_ne!(old, new, "the old tree's fd was served");
    assert_eq!(new, std::fs::metadata(&p).unwrap().ino());
    assert_eq!(c.stats().dropped, dropped + 1);
    assert_eq!(w.stats().resets, 1);
}

#[test]
fn a_mode_an_owner_or_a_link_on_a_certified_walk_is_seen() {
    let Some(t) = root_tree("a_mode_an_owner_or_a_link_on_a_certified_walk") else {
        return;
    };
    let p = t.path().join("a/b/c");
    mkdirs(&p, 0o755);
    let (c, w) = (PathCache::new(true), PathWatch::new(true));
    certify(&c, &w, &p);
    // A directory on the way made writable by others: dropped and resolved afresh, not kept.
    std::fs::set_permissions(t.path().join("a"), std::fs::Permissions::from_mode(0o777)).unwrap();
    let dropped = c.stats().dropped;
    assert!(matches!(open(&c, &w, &p).unwrap(), RuleFd::Own(_)));
    assert_eq!(c.stats().dropped, dropped + 1);
    std::fs::set_permissions(t.path().join("a"), std::fs::Permissions::from_mode(0o755)).unwrap();

    // Given to another uid (a directory on the walk, the last one).
    let q = t.path().join("x/y");
    mkdirs(&q, 0o755);
    certify(&c, &w, &q);
    std::os::unix::fs::chown(&q, Some(65534), None).unwrap();
    let dropped = c.stats().dropped;
    assert!(matches!(open(&c, &w, &q).unwrap(), RuleFd::Own(_)));
    assert_eq!(c.stats().dropped, dropped + 1);

    // A file on a walk: its mode and times do not change what the path resolves to (an agent
    // may set the times of a file it can write, as /dev/null): still certified.
    let f = t.path().join("x/file");
    std::fs::write(&f, b"x").unwrap();
    let n = certify(&c, &w, &f);
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o666)).unwrap();
    let s = w.stats();
    open(&c, &w, &f).unwrap();
    assert_eq!(w.stats().certified - s.certified, n, "{:?}", w.stats());
    // A flood of such events (two files in turn, which the kernel does not merge): the watch
    // is dropped after MAX_EVENTS, the walk checked by lstat, and certified again.
    let g = t.path().join("x/other");
    std::fs::write(&g, b"x").unwrap();
    for i in 0..MAX_EVENTS + 2 {
        let p = if i % 2 == 0 { &f } else { &g };
        // Both times, as `touch` sets them: IN_ATTRIB (the modification time alone is
        // IN_MODIFY, which no watch asks for).
        let now = std::time::SystemTime::now();
        std::fs::File::options()
            .write(true)
            .open(p)
            .unwrap()
            .set_times(
                std::fs::FileTimes::new()
                    .set_accessed(now)
                    .set_modified(now),
            )
            .unwrap();
    }
    let resets = w.stats().resets;
    open(&c, &w, &f).unwrap();
    assert_eq!(w.stats().resets, resets + 1, "{:?}", w.stats());
    certify(&c, &w, &f);
    // A file replaced by a link: refused as without a cache.
    std::fs::rename(&f, t.path().join("x/moved")).unwrap();
    symlink(t.path().join("x/moved"), &f).unwrap();
    let e = open(&c, &w, &f).unwrap_err();
    assert!(e.to_string().contains("symbolic link"), "{e}");
}

#[test]
fn switched_off_every_object_is_checked_by_lstat() {
    let Some(t) = root_tree("switched_off_every_object_is_checked") else {
        return;
    };
    let p = t.path().join("d/e");
    mkdirs(&p, 0o755);
    let (c, w) = (PathCache::new(true), PathWatch::new(false));
    for _ in 0..3 {
        open(&c, &w, &p).unwrap();
    }
    assert_eq!(w.stats(), Stats::default());
    // On: certified after one check. Off: checked by lstat. On again: still certified, unless
    // something changed while it was off.
    w.set_enabled(true);
    let n = certify(&c, &w, &p);
    w.set_enabled(false);
    let s = w.stats();
    open(&c, &w, &p).unwrap();
    assert_eq!(w.stats(), s);
    w.set_enabled(true);
    open(&c, &w, &p).unwrap();
    assert_eq!(w.stats().certified, s.certified + n);
    w.set_enabled(false);
    std::fs::set_permissions(t.path().join("d"), std::fs::Permissions::from_mode(0o775)).unwrap();
    w.set_enabled(true);
    assert!(matches!(open(&c, &w, &p).unwrap(), RuleFd::Own(_)));
    assert_eq!(w.stats().resets, 1);
}

/// Set in the child of [`a_mount_on_a_certified_walk_is_seen`], which runs in its own mount
/// namespace.
const MOUNT_CHILD: &str = "AGENTOS_PATH_WATCH_MOUNT_CHILD";

#[test]
fn a_mount_on_a_certified_walk_is_seen() {
    let Some(_t) = root_tree("a_mount_on_a_certified_walk_is_seen") else {
        return;
    };
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "sandbox::path_watch::tests::mount_child",
        "--nocapture",
        "--test-threads",
        "1",
    ])
    .env(MOUNT_CHILD, "1");
    // SAFETY: between fork and exec the child calls only unshare and mount (async-signal-safe
    // system calls) with static strings, allocating nothing.
    unsafe {
        cmd.pre_exec(|| {
            if libc::unshare(libc::CLONE_NEWNS) != 0
                || libc::mount(
                    c"none".as_ptr(),
                    c"/".as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("mount child: seen"),
        "the child did not run: {text}"
    );
}

/// In its own mount namespace (the test above): certify a walk, bind-mount another directory
/// over one on it, and see the mounted one served.
#[test]
fn mount_child() {
    if std::env::var_os(MOUNT_CHILD).is_none() {
        return;
    }
    let t = root_tree("mount_child").expect("root, /run root's alone");
    let p = t.path().join("m/n");
    mkdirs(&p, 0o755);
    mkdirs(&t.path().join("other/n"), 0o755);
    let (c, w) = (PathCache::new(true), PathWatch::new(true));
    let old = ino(&open(&c, &w, &p).unwrap());
    certify(&c, &w, &p);
    bind(&t.path().join("other"), &t.path().join("m"));
    let new = ino(&open(&c, &w, &p).unwrap());
    assert_ne!(new, old, "the object beneath the mount was served");
    assert_eq!(
        new,
        std::fs::metadata(t.path().join("other/n")).unwrap().ino()
    );
    assert_eq!(w.stats().resets, 1);
    let m = std::ffi::CString::new(t.path().join("m").as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path; this namespace is the child's own.
    assert_eq!(unsafe { libc::umount2(m.as_ptr(), libc::MNT_DETACH) }, 0);
    println!("mount child: seen");
}

fn bind(from: &Path, to: &Path) {
    let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    let (from, to) = (c(from), c(to));
    // SAFETY: NUL-terminated paths; the mount is in this process's own mount namespace.
    let r = unsafe {
        libc::mount(
            from.as_ptr(),
            to.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        )
    };
    assert_eq!(r, 0, "bind mount: {}", std::io::Error::last_os_error());
}
