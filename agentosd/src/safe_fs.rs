//! File operations of the root daemon on paths an agent can write (its home, `{state}` scopes,
//! tool scratch directories): never follow a link the agent planted. Everything is resolved
//! beneath a directory fd the daemon opened itself, with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV)`, and acted on through the fd
//! (`fstat`, `fchown`, `fchmod`, `unlinkat`, Landlock rules from the fd). docs/security.md,
//! "The daemon never follows an agent's links".
//!
//! Host paths that are not the agent's (the Landlock baseline `/bin`, `/lib64`, a tool's
//! runtime, an operator's `/srv/docs`) may contain links that the host made (`/bin` →
//! `usr/bin`): [`resolve_trusted`] follows a link only when every directory walked to it is
//! root's and writable by root alone, so no agent (never root) can have planted or swapped it.

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags, Stat};

#[derive(Debug, thiserror::Error)]
pub enum SafeFsError {
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "{component} is a symbolic link (to {target}); the daemon does not follow links in paths an agent may write: use the real path, or remove the link"
    )]
    Link {
        path: PathBuf,
        component: PathBuf,
        target: PathBuf,
    },
    #[error(
        "{path}: {component} is a symbolic link in a directory that someone other than root can write; the daemon follows a link only where root alone could have made it: use the real path"
    )]
    UntrustedLink { path: PathBuf, component: PathBuf },
    #[error("{path}: crosses a mount point; the daemon does not leave the file system there")]
    CrossesMount { path: PathBuf },
    #[error("{path}: {what}")]
    Refused { path: PathBuf, what: String },
}

impl SafeFsError {
    /// True when the path (or a component of it) does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, SafeFsError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }
}

fn io_err(op: &'static str, path: &Path, e: rustix::io::Errno) -> SafeFsError {
    SafeFsError::Io {
        op,
        path: path.to_path_buf(),
        source: e.into(),
    }
}

/// The resolution of every path an agent may have touched: no symlink, no magic link
/// (`/proc/self/fd/N`), no `..` out of the directory, no other mount.
pub const BENEATH: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS)
    .union(ResolveFlags::NO_XDEV);

/// An absolute path resolved from `/` without following any link (mounts such as /proc and
/// /dev may be crossed: the agent cannot mount).
pub const NO_LINKS: ResolveFlags = ResolveFlags::NO_SYMLINKS.union(ResolveFlags::NO_MAGICLINKS);

/// Only plain components (`a/b/c`): no root, no `.`, no `..`.
fn check_relative(base: &Path, rel: &Path) -> Result<(), SafeFsError> {
    if rel.as_os_str().is_empty() {
        return Ok(());
    }
    for c in rel.components() {
        match c {
            Component::Normal(_) | Component::CurDir => {}
            _ => {
                return Err(SafeFsError::Refused {
                    path: base.join(rel),
                    what: "only plain components are allowed (no \"..\", no absolute path)".into(),
                });
            }
        }
    }
    Ok(())
}

fn is_dir(st: &Stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFDIR
}

/// A directory the daemon opened safely, with its path for messages.
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
    path: PathBuf,
}

impl AsFd for Dir {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Dir {
    /// The daemon's own root (its state directory, a run or log directory): created if missing
    /// (mode 0755 less the umask), and refused unless it is a real directory (not a link) owned
    /// by the daemon's user and writable by that user alone. Its parents are the operator's.
    pub fn open_root(path: &Path) -> Result<Dir, SafeFsError> {
        use std::os::unix::fs::DirBuilderExt;
        // 0755 whatever the umask lets through: never group- or world-writable.
        let open = || {
            rustix::fs::open(
                path,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
        };
        // Opened first: it exists on every call but the first (made only when missing).
        let fd = match open() {
            Err(rustix::io::Errno::NOENT) => {
                if let Err(e) = std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o755)
                    .create(path)
                {
                    return Err(SafeFsError::Io {
                        op: "create",
                        path: path.to_path_buf(),
                        source: e,
                    });
                }
                open()
            }
            r => r,
        }
        .map_err(|e| io_err("open", path, e))?;
        let st = rustix::fs::fstat(&fd).map_err(|e| io_err("fstat", path, e))?;
        let me = rustix::process::geteuid().as_raw();
        if st.st_uid != me || st.st_mode & 0o022 != 0 {
            return Err(SafeFsError::Refused {
                path: path.to_path_buf(),
                what: format!(
                    "owned by uid {} with mode {:o}; the daemon's directory must be owned by uid {me} and writable by it alone (chown {me} and chmod go-w it)",
                    st.st_uid,
                    st.st_mode & 0o7777
                ),
            });
        }
        Ok(Dir {
            fd,
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// `openat2` of `rel` beneath this directory ([`BENEATH`]). `rel` empty or `.` is the
    /// directory itself.
    pub fn open(&self, rel: &Path, flags: OFlags, mode: Mode) -> Result<OwnedFd, SafeFsError> {
        check_relative(&self.path, rel)?;
        let full = self.path.join(rel);
        let r: &Path = if rel.as_os_str().is_empty() {
            Path::new(".")
        } else {
            rel
        };
        rustix::fs::openat2(&self.fd, r, flags | OFlags::CLOEXEC, mode, BENEATH).map_err(
            |e| match e {
                rustix::io::Errno::LOOP => link_error(&full),
                rustix::io::Errno::XDEV => SafeFsError::CrossesMount { path: full },
                e => io_err("open", &full, e),
            },
        )
    }

    /// An `O_PATH` fd of `rel` (file or directory), for a Landlock rule.
    pub fn open_path(&self, rel: &Path) -> Result<OwnedFd, SafeFsError> {
        self.open(rel, OFlags::PATH, Mode::empty())
    }

    /// The directory `rel` beneath this one.
    pub fn open_dir(&self, rel: &Path) -> Result<Dir, SafeFsError> {
        let fd = self.open(rel, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())?;
        Ok(Dir {
            fd,
            path: self.path.join(rel),
        })
    }

    /// Make directory `name` (one component) here with `mode` if it does not exist, and open
    /// it. An existing `name` that is not a directory (a link, a file) is an error.
    pub fn mkdir(&self, name: &str, mode: u32) -> Result<Dir, SafeFsError> {
        let path = self.path.join(name);
        if name.is_empty() || name == "." || name == ".." || name.contains('/') {
            return Err(SafeFsError::Refused {
                path,
                what: "not a single path component".into(),
            });
        }
        let not_dir = |e: SafeFsError| match e {
            SafeFsError::Io { source, .. } if source.raw_os_error() == Some(libc::ENOTDIR) => {
                SafeFsError::Refused {
                    path: path.clone(),
                    what: "exists and is not a directory; remove it".into(),
                }
            }
            e => e,
        };
        // Open first: on every agent start these exist, and a `mkdirat` that finds the name
        // takes the parent's lock only to fail with EEXIST.
        match self.open_dir(Path::new(name)) {
            Err(e) if e.is_not_found() => {}
            r => return r.map_err(not_dir),
        }
        match rustix::fs::mkdirat(&self.fd, name, Mode::from_raw_mode(mode)) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(io_err("mkdir", &path, e)),
        }
        self.open_dir(Path::new(name)).map_err(not_dir)
    }

    /// [`Dir::mkdir`] for each component of `rel`.
    pub fn mkdir_all(&self, rel: &Path, mode: u32) -> Result<Dir, SafeFsError> {
        check_relative(&self.path, rel)?;
        let mut cur = self.open_dir(Path::new(""))?;
        for c in rel.components() {
            if let Component::Normal(n) = c {
                let name = n.to_str().ok_or_else(|| SafeFsError::Refused {
                    path: self.path.join(rel),
                    what: "not UTF-8".into(),
                })?;
                cur = cur.mkdir(name, mode)?;
            }
        }
        Ok(cur)
    }

    pub fn stat(&self) -> Result<Stat, SafeFsError> {
        rustix::fs::fstat(&self.fd).map_err(|e| io_err("fstat", &self.path, e))
    }

    pub fn chown(&self, uid: u32, gid: u32) -> Result<(), SafeFsError> {
        rustix::fs::fchown(
            &self.fd,
            Some(rustix::fs::Uid::from_raw(uid)),
            Some(rustix::fs::Gid::from_raw(gid)),
        )
        .map_err(|e| io_err("fchown", &self.path, e))
    }

    pub fn chmod(&self, mode: u32) -> Result<(), SafeFsError> {
        rustix::fs::fchmod(&self.fd, Mode::from_raw_mode(mode))
            .map_err(|e| io_err("fchmod", &self.path, e))
    }

    /// Remove the non-directory entry `name` (a link itself, never its target); a missing
    /// entry is fine.
    pub fn unlink(&self, name: &str) -> Result<(), SafeFsError> {
        match rustix::fs::unlinkat(&self.fd, name, AtFlags::empty()) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
            Err(e) => Err(io_err("unlink", &self.path.join(name), e)),
        }
    }

    /// Remove `name` and everything beneath it without following a link or crossing a mount
    /// (each directory opened with [`BENEATH`], entries removed with `unlinkat` on its fd). A
    /// link is removed as a link. Refuses trees deeper than [`MAX_DEPTH`] (left in place).
    pub fn remove_tree(&self, name: &str) -> Result<(), SafeFsError> {
        remove_entry(self, name, 0)
    }
}

/// Open (create, mode `mode`) the file `path` for appending, in a directory of the daemon's own
/// ([`Dir::open_root`]), without following a link at its name: the agents' log files.
pub fn open_append(path: &Path, mode: u32) -> Result<OwnedFd, SafeFsError> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(SafeFsError::Refused {
            path: path.to_path_buf(),
            what: "not a file path".into(),
        });
    };
    let dir = Dir::open_root(parent)?;
    dir.open(
        Path::new(name),
        OFlags::WRONLY | OFlags::APPEND | OFlags::CREATE | OFlags::NOFOLLOW,
        Mode::from_raw_mode(mode),
    )
}

/// How deep [`Dir::remove_tree`] goes (each level holds one fd).
pub const MAX_DEPTH: usize = 256;

fn remove_entry(parent: &Dir, name: &str, depth: usize) -> Result<(), SafeFsError> {
    let path = parent.path.join(name);
    let st = match rustix::fs::statat(&parent.fd, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(rustix::io::Errno::NOENT) => return Ok(()),
        Err(e) => return Err(io_err("stat", &path, e)),
    };
    if !is_dir(&st) {
        return parent.unlink(name);
    }
    if depth >= MAX_DEPTH {
        return Err(SafeFsError::Refused {
            path,
            what: format!("more than {MAX_DEPTH} directories deep; left in place"),
        });
    }
    let dir = parent.open_dir(Path::new(name))?;
    let names: Vec<Vec<u8>> = {
        let mut it =
            rustix::fs::Dir::read_from(&dir.fd).map_err(|e| io_err("readdir", &path, e))?;
        let mut v = Vec::new();
        while let Some(ent) = it.read() {
            let ent = ent.map_err(|e| io_err("readdir", &path, e))?;
            let n = ent.file_name().to_bytes();
            if n != b"." && n != b".." {
                v.push(n.to_vec());
            }
        }
        v
    };
    for n in names {
        let n = OsStr::from_bytes(&n);
        let Some(n) = n.to_str() else {
            // Not UTF-8: remove it by its bytes (a file) or give up (a directory).
            match rustix::fs::unlinkat(&dir.fd, n, AtFlags::empty()) {
                Ok(()) | Err(rustix::io::Errno::NOENT) => continue,
                Err(e) => return Err(io_err("unlink", &path.join(n), e)),
            }
        };
        remove_entry(&dir, n, depth + 1)?;
    }
    match rustix::fs::unlinkat(&parent.fd, name, AtFlags::REMOVEDIR) {
        Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
        Err(e) => Err(io_err("rmdir", &path, e)),
    }
}

/// The first component of `path` that is a symbolic link, and its target (for messages).
fn first_link(path: &Path) -> Option<(PathBuf, PathBuf)> {
    let mut cur = PathBuf::new();
    for c in path.components() {
        cur.push(c);
        if let Ok(m) = std::fs::symlink_metadata(&cur)
            && m.file_type().is_symlink()
        {
            let t = std::fs::read_link(&cur).unwrap_or_default();
            return Some((cur, t));
        }
    }
    None
}

fn link_error(path: &Path) -> SafeFsError {
    match first_link(path) {
        Some((component, target)) => SafeFsError::Link {
            path: path.to_path_buf(),
            component,
            target,
        },
        None => SafeFsError::Io {
            op: "open",
            path: path.to_path_buf(),
            source: io::Error::from_raw_os_error(libc::ELOOP),
        },
    }
}

/// An `O_PATH` fd of the absolute `path`, resolved from `/` without following any link
/// ([`NO_LINKS`]); `..` is refused.
pub fn open_no_links(path: &Path) -> Result<OwnedFd, SafeFsError> {
    if !path.is_absolute() || path.components().any(|c| c == Component::ParentDir) {
        return Err(SafeFsError::Refused {
            path: path.to_path_buf(),
            what: "not an absolute path without \"..\"".into(),
        });
    }
    rustix::fs::openat2(
        rustix::fs::CWD,
        path,
        OFlags::PATH | OFlags::CLOEXEC,
        Mode::empty(),
        NO_LINKS,
    )
    .map_err(|e| match e {
        rustix::io::Errno::LOOP => link_error(path),
        e => io_err("open", path, e),
    })
}

/// Whether a directory is root's and writable by root alone.
fn trusted_dir(st: &Stat) -> bool {
    st.st_uid == 0 && st.st_mode & 0o022 == 0
}

/// What a path's resolution walked through: every directory it looked a name up in, every link
/// it followed and what it ended on, each by its link-free absolute path and inode. The cache
/// of root-only host paths (sandbox/path_cache.rs) keeps it to check, on each use, that the path
/// still resolves to the same inode through the same root-only directories.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Walk {
    pub seen: Vec<Seen>,
    /// A `..` was walked (the walk is not a plain list of prefixes then): never cached.
    pub dotdot: bool,
}

/// One object a resolution walked through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// Its absolute path, no link in it (every prefix is itself a directory in the walk).
    pub path: PathBuf,
    pub dev: u64,
    pub ino: u64,
    /// `S_IFMT` of its mode.
    pub kind: u32,
    /// For a directory: root's and writable by root alone (see [`trusted_dir`]).
    pub root_only: bool,
}

impl Seen {
    pub fn of(path: &Path, st: &Stat) -> Seen {
        Seen {
            path: path.to_path_buf(),
            dev: st.st_dev,
            ino: st.st_ino,
            kind: st.st_mode & libc::S_IFMT,
            root_only: trusted_dir(st),
        }
    }

    /// Whether `st` (a fresh `lstat` of [`Seen::path`]) is still this object, and a directory
    /// still root's alone.
    pub fn still(&self, st: &Stat) -> bool {
        st.st_dev == self.dev
            && st.st_ino == self.ino
            && st.st_mode & libc::S_IFMT == self.kind
            && (self.kind != libc::S_IFDIR || trusted_dir(st))
    }
}

impl Walk {
    /// Whether only root could change what the path resolves to: no `..`, and every directory
    /// walked (the last component too, when it is one) root's and writable by root alone.
    pub fn root_only(&self) -> bool {
        !self.dotdot
            && !self.seen.is_empty()
            && self
                .seen
                .iter()
                .all(|s| s.kind != libc::S_IFDIR || s.root_only)
    }

    fn push(&mut self, path: &Path, st: &Stat) {
        if self.seen.last().is_none_or(|l| l.path != path) {
            self.seen.push(Seen::of(path, st));
        }
    }
}

/// `lstat` of an absolute path (no link followed at its end).
pub fn lstat(path: &Path) -> Result<Stat, SafeFsError> {
    rustix::fs::statat(rustix::fs::CWD, path, AtFlags::SYMLINK_NOFOLLOW)
        .map_err(|e| io_err("stat", path, e))
}

/// The [`Walk`] of an absolute path opened with [`open_no_links`] as `fd`: an `lstat` of each
/// prefix. `None` when it does not end on the inode of `fd` (it changed in between) or a
/// prefix is not a directory.
pub fn walk_of(path: &Path, fd: &OwnedFd) -> Option<Walk> {
    let end = rustix::fs::fstat(fd).ok()?;
    let mut w = Walk::default();
    let mut p = PathBuf::from("/");
    w.push(&p, &lstat(&p).ok()?);
    for c in path.components().skip(1) {
        let Component::Normal(n) = c else {
            return None;
        };
        if w.seen.last().is_some_and(|l| l.kind != libc::S_IFDIR) {
            return None;
        }
        p.push(n);
        w.push(&p, &lstat(&p).ok()?);
    }
    let last = w.seen.last()?;
    (last.dev == end.st_dev && last.ino == end.st_ino).then_some(w)
}

/// Resolve the absolute host `path` the way the kernel would, but follow a symbolic link only
/// when every directory walked to reach it is root's and writable by root alone (so only root
/// could have made or moved it: `/bin` → `usr/bin`). Returns an `O_PATH` fd and the real path.
pub fn resolve_trusted(path: &Path) -> Result<(OwnedFd, PathBuf), SafeFsError> {
    resolve_trusted_walk(path).map(|(fd, real, _)| (fd, real))
}

/// [`resolve_trusted`], and what it walked through.
pub fn resolve_trusted_walk(path: &Path) -> Result<(OwnedFd, PathBuf, Walk), SafeFsError> {
    let mut walk = Walk::default();
    if !path.is_absolute() {
        return Err(SafeFsError::Refused {
            path: path.to_path_buf(),
            what: "not an absolute path".into(),
        });
    }
    let root = || {
        rustix::fs::open(
            "/",
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io_err("open", Path::new("/"), e))
    };
    let mut cur = root()?;
    let mut real = PathBuf::from("/");
    let mut trusted = true;
    let mut todo: std::collections::VecDeque<std::ffi::OsString> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            Component::ParentDir => Some("..".into()),
            _ => None,
        })
        .collect();
    let mut links = 0;
    while let Some(c) = todo.pop_front() {
        let dir_st = rustix::fs::fstat(&cur).map_err(|e| io_err("fstat", &real, e))?;
        trusted &= trusted_dir(&dir_st);
        walk.push(&real, &dir_st);
        if c == ".." {
            walk.dotdot = true;
            real.pop();
            // Re-walk the (link-free) real path: `..` of a link target is the real parent.
            cur = rustix::fs::openat2(
                rustix::fs::CWD,
                &real,
                OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
                NO_LINKS,
            )
            .map_err(|e| io_err("open", &real, e))?;
            trusted = true;
            let mut p = PathBuf::from("/");
            for comp in real.components().skip(1) {
                let st = rustix::fs::statat(rustix::fs::CWD, &p, AtFlags::empty())
                    .map_err(|e| io_err("stat", &p, e))?;
                trusted &= trusted_dir(&st);
                p.push(comp);
            }
            continue;
        }
        let next = rustix::fs::openat(
            &cur,
            c.as_os_str(),
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io_err("open", &real.join(&c), e))?;
        let st = rustix::fs::fstat(&next).map_err(|e| io_err("fstat", &real.join(&c), e))?;
        if st.st_mode & libc::S_IFMT == libc::S_IFLNK {
            let here = real.join(&c);
            if !trusted {
                return Err(SafeFsError::UntrustedLink {
                    path: path.to_path_buf(),
                    component: here,
                });
            }
            walk.push(&here, &st);
            links += 1;
            if links > 40 {
                return Err(io_err("resolve", path, rustix::io::Errno::LOOP));
            }
            let target = rustix::fs::readlinkat(&next, "", Vec::new())
                .map_err(|e| io_err("readlink", &here, e))?;
            let target = PathBuf::from(OsStr::from_bytes(target.to_bytes()));
            let mut rest: Vec<std::ffi::OsString> = target
                .components()
                .filter_map(|c| match c {
                    Component::Normal(n) => Some(n.to_os_string()),
                    Component::ParentDir => Some("..".into()),
                    _ => None,
                })
                .collect();
            rest.extend(todo.drain(..));
            todo = rest.into();
            if target.is_absolute() {
                cur = root()?;
                real = PathBuf::from("/");
                trusted = true;
            }
            continue;
        }
        real.push(&c);
        cur = next;
    }
    let end = rustix::fs::fstat(&cur).map_err(|e| io_err("fstat", &real, e))?;
    walk.push(&real, &end);
    Ok((cur, real, walk))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn root() -> (tempfile::TempDir, Dir) {
        let d = tempfile::tempdir().unwrap();
        let r = Dir::open_root(d.path()).unwrap();
        (d, r)
    }

    #[test]
    fn a_symlink_is_never_followed_beneath() {
        let (d, r) = root();
        let outside = tempfile::tempdir().unwrap();
        symlink(outside.path(), d.path().join("tmp")).unwrap();
        let e = r.mkdir("tmp", 0o700).unwrap_err();
        assert!(matches!(e, SafeFsError::Link { .. }), "{e}");
        assert!(e.to_string().contains("is a symbolic link"), "{e}");
        // An intermediate link too.
        std::fs::create_dir(d.path().join("a")).unwrap();
        symlink(outside.path(), d.path().join("a/l")).unwrap();
        assert!(r.open_dir(Path::new("a/l")).is_err());
        assert!(r.mkdir_all(Path::new("a/l/x"), 0o700).is_err());
        assert!(!outside.path().join("x").exists());
        // A link to a file beneath is refused as well (no link at all).
        std::fs::write(d.path().join("f"), b"x").unwrap();
        symlink("f", d.path().join("lf")).unwrap();
        assert!(r.open_path(Path::new("lf")).is_err());
        assert!(r.open_path(Path::new("f")).is_ok());
    }

    #[test]
    fn magic_links_and_dotdot_do_not_escape() {
        let (d, r) = root();
        let outside = tempfile::tempdir().unwrap();
        let o = std::fs::File::open(outside.path()).unwrap();
        use std::os::fd::AsRawFd;
        // A link to /proc/self/fd/N: a magic link once followed.
        symlink(
            format!("/proc/self/fd/{}", o.as_raw_fd()),
            d.path().join("magic"),
        )
        .unwrap();
        assert!(r.open_dir(Path::new("magic")).is_err());
        assert!(r.open_dir(Path::new("..")).is_err());
        assert!(r.open_dir(Path::new("a/../..")).is_err());
        assert!(open_no_links(Path::new("/proc/self/root/etc")).is_err());
        assert!(open_no_links(Path::new("/usr/../etc")).is_err());
    }

    #[test]
    fn existing_non_directories_are_errors_and_trees_are_removed_without_following() {
        let (d, r) = root();
        std::fs::write(d.path().join("tmp"), b"x").unwrap();
        let e = r.mkdir("tmp", 0o700).unwrap_err();
        assert!(e.to_string().contains("not a directory"), "{e}");
        // A tree with a link to a directory outside: the link goes, the outside stays.
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("keep"), b"k").unwrap();
        let t = r.mkdir_all(Path::new("s/a/b"), 0o700).unwrap();
        std::fs::write(t.path().join("f"), b"x").unwrap();
        symlink(outside.path(), d.path().join("s/a/out")).unwrap();
        r.remove_tree("s").unwrap();
        assert!(!d.path().join("s").exists());
        assert!(outside.path().join("keep").exists());
        // A link as the tree itself: the link is removed.
        symlink(outside.path(), d.path().join("s2")).unwrap();
        r.remove_tree("s2").unwrap();
        assert!(outside.path().join("keep").exists());
        r.remove_tree("missing").unwrap();
    }

    #[test]
    fn a_writable_root_is_refused() {
        let d = tempfile::tempdir().unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = Dir::open_root(d.path()).unwrap_err();
        assert!(e.to_string().contains("writable by it alone"), "{e}");
        let l = tempfile::tempdir().unwrap();
        symlink(l.path(), d.path().join("l")).unwrap();
        assert!(Dir::open_root(&d.path().join("l")).is_err());
    }

    #[test]
    fn trusted_links_only_in_root_only_directories() {
        // The host's own layout resolves like the kernel does.
        let (_, real) = resolve_trusted(Path::new("/proc/self/../self")).unwrap_or_else(|e| {
            panic!("{e}");
        });
        assert!(real.starts_with("/proc"), "{}", real.display());
        if std::fs::symlink_metadata("/bin").is_ok_and(|m| m.file_type().is_symlink())
            && rustix::process::geteuid().is_root()
        {
            let (_, real) = resolve_trusted(Path::new("/bin")).unwrap();
            assert_eq!(real, std::fs::canonicalize("/bin").unwrap());
        }
        // A link in a directory others can write is refused.
        let d = tempfile::tempdir().unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
        symlink("/etc", d.path().join("l")).unwrap();
        let e = resolve_trusted(&d.path().join("l")).unwrap_err();
        assert!(
            matches!(e, SafeFsError::UntrustedLink { .. }),
            "{e} (a link in a world-writable directory)"
        );
    }
}
