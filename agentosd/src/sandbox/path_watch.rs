//! Which objects of the path cache's walks are known unchanged since their last `lstat`, so that
//! a start need not `lstat` them again.
//!
//! The path cache ([`super::path_cache`]) and the ruleset pool ([`super::ruleset_pool`]) check
//! every object of a kept path's walk with an `lstat` before its fd goes into a ruleset: ≈ 40
//! `lstat`s per start for the baseline, most of what was left of `prepare` with a ruleset built
//! ahead (docs/benchmarks.md, "Agent sandbox start"). What those checks look for (another
//! object renamed, linked or mounted in at a path, a directory's owner or mode changed) is each
//! a change the kernel reports to an inotify watch on the directory it happens in, or a change
//! of the mount table, which `poll` on `/proc/self/mountinfo` reports. So:
//!
//! - **Watched.** When an object of a walk is checked by `lstat` and found the same, a watch is
//!   put on it if it is a directory, and its name is noted as one that matters in its parent's
//!   watch. An object is *certified* only when its parent directory is watched (or it is `/`),
//!   its own watch was added before its `lstat` (a directory), and it lies on a file system
//!   whose every change goes through this kernel ([`local_fs`]: not NFS, FUSE, 9p, overlayfs,
//!   whose changes made elsewhere no watch sees; those are checked by `lstat` on every use).
//! - **Any change that could matter uncertifies everything.** Before a ruleset's checks the
//!   daemon reads the watch's events and polls the mount table ([`PathWatch::sync`]): a mount
//!   or unmount anywhere in its mount namespace, a watched directory's own attributes, deletion
//!   or move, an entry created, deleted or moved under a name that matters, an event queue
//!   overflow or a watch gone: the watch is dropped whole and every object is checked by
//!   `lstat` again, as without it. Changes to other names in a watched directory (a file
//!   created in `/etc` or `/run`, the daemon's own sockets) are read and ignored.
//! - **Order.** A watch is added before the `lstat` that certifies its object, and parents
//!   before children, so a change after the `lstat` is an event read by the next sync; a change
//!   before it is what the `lstat` sees. What happens while a ruleset is checked is the same
//!   race as with `lstat`s alone.
//!
//! Bounded: at most [`MAX_WATCHES`] watches (one inotify instance; each watch is kernel memory
//! charged to root's `fs.inotify.max_user_watches`); beyond that objects are checked by `lstat`.
//! [`ENV_SWITCH`]`=off` switches it off (docs/daemon.md).

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::fs::File;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::inotify::{self, ReadFlags, WatchFlags};

use super::path_cache::Switch;
use crate::safe_fs::Seen;

/// Watches kept at most (directories of the kept paths' walks).
pub const MAX_WATCHES: usize = 1024;

/// Events read in one sync at most: more drop the watch (a reset), so a flood costs a start no
/// more than the checks without a watch.
pub const MAX_EVENTS: usize = 256;

/// Set to `off` (or `0`) to check every object by `lstat` on every use (docs/daemon.md).
pub const ENV_SWITCH: &str = "AGENTOSD_PATH_WATCH";

/// What a watch reports on a directory: its own attributes, deletion and move, and entries
/// created, deleted, moved or with changed attributes (filtered by name when read).
fn mask() -> WatchFlags {
    WatchFlags::ATTRIB
        | WatchFlags::CREATE
        | WatchFlags::DELETE
        | WatchFlags::DELETE_SELF
        | WatchFlags::MOVE_SELF
        | WatchFlags::MOVED_FROM
        | WatchFlags::MOVED_TO
        | WatchFlags::DONT_FOLLOW
        | WatchFlags::ONLYDIR
}

/// What happened (for tests and the benchmark's report).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    /// Objects found certified: no `lstat`.
    pub certified: u64,
    /// Objects certified after their `lstat`.
    pub armed: u64,
    /// Times everything was uncertified (a change that could matter, or the watch failed).
    pub resets: u64,
    /// Events read and found not to matter.
    pub ignored: u64,
}

#[derive(Default)]
struct Counters {
    certified: AtomicU64,
    armed: AtomicU64,
    resets: AtomicU64,
    ignored: AtomicU64,
}

/// The watch's state: one inotify instance, the mount table's file, what is certified.
#[derive(Default)]
struct Inner {
    inotify: Option<OwnedFd>,
    mounts: Option<File>,
    /// A fresh one for every inotify instance ([`next_generation`], unique in the process): a
    /// certification made with an older one counts for nothing.
    generation: u64,
    /// Watched directories by path, and their watch descriptors.
    watches: HashMap<PathBuf, i32>,
    /// Per watch: the names of entries beneath it that are on a walk.
    names: HashMap<i32, HashSet<OsString>>,
    /// Setting up failed (no inotify, no procfs): nothing is ever certified.
    broken: bool,
}

pub struct PathWatch {
    inner: Mutex<Inner>,
    enabled: Switch,
    n: Counters,
}

impl PathWatch {
    pub fn new(enabled: bool) -> PathWatch {
        PathWatch {
            inner: Mutex::new(Inner::default()),
            enabled: Switch::new(enabled),
            n: Counters::default(),
        }
    }

    /// The daemon's watch: on unless [`ENV_SWITCH`] is `off` (or `0`) at its first use.
    pub fn global() -> &'static PathWatch {
        static G: std::sync::OnceLock<PathWatch> = std::sync::OnceLock::new();
        G.get_or_init(|| PathWatch::new(Switch::from_env(ENV_SWITCH).on()))
    }

    pub fn enabled(&self) -> bool {
        self.enabled.on()
    }

    /// Switch it on or off (off: every object is checked by `lstat`). The watches stay and
    /// their events queue meanwhile: the first sync after it is switched on again reads them.
    pub fn set_enabled(&self, on: bool) {
        self.enabled.set(on);
    }

    pub fn stats(&self) -> Stats {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Stats {
            certified: g(&self.n.certified),
            armed: g(&self.n.armed),
            resets: g(&self.n.resets),
            ignored: g(&self.n.ignored),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Read what changed since the last sync and uncertify everything if anything could
    /// matter. Returns the generation to certify with, `None` when the watch is off or broken.
    pub fn sync(&self) -> Option<u64> {
        if !self.enabled() {
            return None;
        }
        let mut g = self.lock();
        if g.broken {
            return None;
        }
        if g.inotify.is_none() && !g.start() {
            return None;
        }
        let (matters, ignored) = g.read_changes();
        self.n.ignored.fetch_add(ignored, Ordering::Relaxed);
        if matters {
            self.n.resets.fetch_add(1, Ordering::Relaxed);
            g.reset();
            if !g.start() {
                return None;
            }
        }
        Some(g.generation)
    }

    /// `n` objects of a walk certified in the current generation were served with no `lstat`.
    pub fn served(&self, n: usize) {
        self.n.certified.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Put watches on `walk` (a kept path's objects, root first) before they are checked by
    /// `lstat`. Returns how many of them, from the first, may be vouched for by the watch once
    /// their check passes: each one's parent directory watched (or it is `/`), on a local file
    /// system, a watch added for a directory. The walk is certified only when all are.
    pub fn arm(&self, generation: u64, walk: &[&Seen]) -> usize {
        let mut g = self.lock();
        if g.generation != generation || g.inotify.is_none() {
            return 0;
        }
        let mut n = 0;
        for s in walk {
            let parent_wd = match s.path.parent() {
                None => None,
                Some(p) => match g.watches.get(p) {
                    Some(wd) => Some(*wd),
                    None => break,
                },
            };
            if s.kind == libc::S_IFDIR && !g.watches.contains_key(&s.path) {
                if g.watches.len() >= MAX_WATCHES || !local_fs(&s.path) {
                    break;
                }
                let Some(fd) = g.inotify.as_ref() else {
                    break;
                };
                match inotify::add_watch(fd, &s.path, mask()) {
                    Ok(wd) => {
                        g.watches.insert(s.path.clone(), wd);
                    }
                    Err(_) => break,
                }
            }
            if let (Some(wd), Some(name)) = (parent_wd, s.path.file_name()) {
                g.names.entry(wd).or_default().insert(name.to_os_string());
            }
            n += 1;
        }
        n
    }

    /// A walk of `n` objects armed by [`PathWatch::arm`] with `generation` was then found
    /// unchanged by its `lstat`s: `record` its certification, under the watch's lock, unless
    /// the watch was reset in between.
    pub fn certify(&self, generation: u64, n: usize, record: impl FnOnce()) {
        let g = self.lock();
        if g.generation != generation {
            return;
        }
        record();
        drop(g);
        self.n.armed.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// A generation no watch has used (0 is none: an entry never certified).
fn next_generation() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

impl Inner {
    /// A fresh inotify instance and the mount table's file (its open records the table's
    /// generation; `poll` reports every change after it).
    fn start(&mut self) -> bool {
        // The mount table's file is opened once: a reset keeps it (its `poll` already reported
        // what it had to).
        if self.mounts.is_none() {
            match File::open("/proc/self/mountinfo") {
                Ok(m) => self.mounts = Some(m),
                Err(e) => return self.broke("/proc/self/mountinfo", e.to_string()),
            }
        }
        match inotify::init(inotify::CreateFlags::NONBLOCK | inotify::CreateFlags::CLOEXEC) {
            Ok(fd) => {
                self.inotify = Some(fd);
                self.generation = next_generation();
                true
            }
            Err(e) => self.broke("inotify_init1", e.to_string()),
        }
    }

    /// Setting up failed: said once, and nothing is certified from then on.
    fn broke(&mut self, what: &str, e: String) -> bool {
        tracing::warn!(
            "path watch: {what}: {e}: every kept path is checked by lstat on each start"
        );
        self.broken = true;
        false
    }

    /// Drop every watch and certification (closing the instance drops its watches).
    fn reset(&mut self) {
        self.inotify = None;
        self.watches.clear();
        self.names.clear();
        self.generation = 0;
    }

    /// Whether anything that could matter changed since the last read (the mount table, or an
    /// event on a watched directory itself or on a name that matters), and how many events did
    /// not matter.
    fn read_changes(&mut self) -> (bool, u64) {
        let mut matters = false;
        if let Some(m) = &self.mounts {
            let mut pfd = [rustix::event::PollFd::new(
                m,
                rustix::event::PollFlags::PRI | rustix::event::PollFlags::ERR,
            )];
            // No wait: the table's file is always readable, only a change sets PRI/ERR.
            let now = rustix::event::Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            match rustix::event::poll(&mut pfd, Some(&now)) {
                Ok(_) => {
                    let r = pfd[0].revents();
                    if r.intersects(rustix::event::PollFlags::PRI | rustix::event::PollFlags::ERR) {
                        tracing::debug!("path watch: the mount table changed");
                        matters = true;
                    }
                }
                Err(_) => matters = true,
            }
        }
        let (mut ignored, mut read) = (0, 0);
        let Some(fd) = self.inotify.as_ref() else {
            return (true, ignored);
        };
        let mut buf = [MaybeUninit::<u8>::uninit(); 4096];
        let mut reader = inotify::Reader::new(fd.as_fd(), &mut buf);
        loop {
            match reader.next() {
                Ok(ev) => {
                    if matters {
                        continue;
                    }
                    read += 1;
                    if read > MAX_EVENTS {
                        // A flood (an agent can change the times of a file it may write in a
                        // watched directory, as `/dev/null`): not read to its end, dropped
                        // with the instance.
                        tracing::debug!("path watch: over {MAX_EVENTS} events since the last sync");
                        matters = true;
                        break;
                    }
                    let flags = ev.events();
                    let relevant = flags.intersects(
                        ReadFlags::QUEUE_OVERFLOW | ReadFlags::IGNORED | ReadFlags::UNMOUNT,
                    ) || match ev.file_name() {
                        // The watched directory itself: attributes, deleted, moved.
                        None => true,
                        // An entry's attributes: a directory's on a walk are its own watch's
                        // event too, a file's or a link's do not change what a path resolves to.
                        Some(_) if flags.contains(ReadFlags::ATTRIB) => false,
                        Some(name) => self.names.get(&ev.wd()).is_some_and(|set| {
                            set.contains(std::ffi::OsStr::from_bytes(name.to_bytes()))
                        }),
                    };
                    if relevant {
                        tracing::debug!(
                            wd = ev.wd(),
                            name = ?ev.file_name(),
                            flags = ?flags,
                            "path watch: a change on a kept path's walk"
                        );
                        matters = true;
                    } else {
                        ignored += 1;
                    }
                }
                Err(rustix::io::Errno::AGAIN) => break,
                Err(rustix::io::Errno::INTR) => continue,
                Err(_) => return (true, ignored),
            }
        }
        (matters, ignored)
    }
}

/// What `agentosd check` reports of the watch ([`crate::probe`]): whether this kernel gives it
/// what it needs (an inotify instance with a watch on `/`, and `/proc/self/mountinfo`), as
/// `Ok(note)` (whether `/` is on a file system it trusts) or `Err(why)`. Without it every start checks its kept paths by `lstat`: slower, not weaker.
pub fn kernel_support() -> Result<String, String> {
    let fd = inotify::init(inotify::CreateFlags::NONBLOCK | inotify::CreateFlags::CLOEXEC)
        .map_err(|e| {
            format!(
                "inotify_init1: {e:?} (kernel without CONFIG_INOTIFY_USER, or fs.inotify.max_user_instances reached)"
            )
        })?;
    inotify::add_watch(&fd, "/", mask())
        .map_err(|e| format!("inotify_add_watch(/): {e:?} (fs.inotify.max_user_watches?)"))?;
    File::open("/proc/self/mountinfo")
        .map_err(|e| format!("/proc/self/mountinfo: {e} (procfs not mounted?)"))?;
    Ok(if local_fs(Path::new("/")) {
        "/ is on a local file system".to_string()
    } else {
        "/ is not on a file system the watch trusts (NFS, FUSE, 9p, overlayfs...): paths there are checked at every start".to_string()
    })
}

/// Whether every change to what lies in `dir` goes through this kernel's VFS, where a watch
/// sees it: local disk file systems, tmpfs, read-only images, procfs and sysfs (whose tree the
/// kernel defines). Not NFS, CIFS, FUSE, 9p, virtiofs or overlayfs (whose lower layers may be
/// changed beneath it): their objects are checked by `lstat` on every use.
fn local_fs(dir: &Path) -> bool {
    const LOCAL: &[i64] = &[
        0xEF53,      // ext2/3/4
        0x5846_5342, // xfs
        0x9123_683E, // btrfs
        0x0102_1994, // tmpfs, devtmpfs
        0x8584_58F6, // ramfs
        0xF2F5_2010, // f2fs
        0x7371_7368, // squashfs
        0xE0F5_E1E2, // erofs
        0x9FA0,      // proc
        0x6265_6572, // sysfs
    ];
    // `f_type` is `i64` here and `i32` or `u32` on some other architectures.
    #[allow(clippy::unnecessary_cast)]
    rustix::fs::statfs(dir).is_ok_and(|s| LOCAL.contains(&(s.f_type as i64)))
}

#[cfg(test)]
#[path = "path_watch_tests.rs"]
mod tests;
