//! Per-agent identity: an unprivileged uid/gid from a reserved range (the range systemd's
//! `DynamicUser=` uses), remembered in the daemon's state directory so an agent keeps its uid
//! across restarts and daemon re-adoption, and a private state directory owned by that uid.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::safe_fs;

/// First and last uid handed to agents by default (systemd's `DynamicUser=` range,
/// 61184-65519: 4 336 agents).
pub const UID_MIN: u32 = 61184;
pub const UID_MAX: u32 = 65519;

/// Held while a uid is chosen and recorded; holds the table as last read or written, with the
/// file's identity then, so a start reads and parses `uids.json` only when it changed.
static ALLOC: Mutex<Option<Memo>> = Mutex::new(None);

struct Memo {
    path: PathBuf,
    /// dev, ino, size, mtime (s, ns) of the file the map was read from or written to.
    file: (u64, u64, u64, i64, i64),
    map: BTreeMap<String, u32>,
}

fn file_id(path: &Path) -> Option<(u64, u64, u64, i64, i64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(path).ok()?;
    Some((m.dev(), m.ino(), m.size(), m.mtime(), m.mtime_nsec()))
}

/// The range this daemon hands out (`--agent-uids`), set once at start; the default range when
/// never set.
static RANGE: std::sync::OnceLock<UidRange> = std::sync::OnceLock::new();

/// A range of uids (= gids) for agents, first to last inclusive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UidRange {
    pub first: u32,
    pub last: u32,
}

impl Default for UidRange {
    fn default() -> Self {
        UidRange {
            first: UID_MIN,
            last: UID_MAX,
        }
    }
}

impl UidRange {
    /// How many agents it holds.
    pub fn len(&self) -> u32 {
        self.last - self.first + 1
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    pub fn contains(&self, uid: u32) -> bool {
        (self.first..=self.last).contains(&uid)
    }
}

impl std::str::FromStr for UidRange {
    type Err = String;

    /// `FIRST-LAST`: above the uids of people and system users (61184 and up), not reaching
    /// the overflow uid 65534, 65535 (the 16-bit -1) or 2^31 and above (negative as `uid_t` to
    /// some tools).
    fn from_str(s: &str) -> Result<Self, String> {
        let (a, b) = s.split_once('-').ok_or_else(|| {
            format!("agent uid range {s:?}: write FIRST-LAST, e.g. 131072-196607")
        })?;
        let num = |t: &str| {
            t.trim()
                .parse::<u32>()
                .map_err(|e| format!("agent uid range {s:?}: {t:?}: {e}"))
        };
        let r = UidRange {
            first: num(a)?,
            last: num(b)?,
        };
        if r.first > r.last {
            return Err(format!("agent uid range {s:?}: FIRST is above LAST"));
        }
        if r.first < UID_MIN {
            return Err(format!(
                "agent uid range {s:?} starts below {UID_MIN}: uids below that belong to people and system users"
            ));
        }
        if r.contains(65534) || r.contains(65535) {
            return Err(format!(
                "agent uid range {s:?} holds 65534 (nobody) or 65535: use {UID_MIN}-{UID_MAX} or a range above 65535, e.g. 131072-196607"
            ));
        }
        if r.last >= 1 << 31 {
            return Err(format!(
                "agent uid range {s:?} reaches 2^31: some tools read such uids as negative"
            ));
        }
        Ok(r)
    }
}

/// Use `r` for agents' uids from now on (once, at start; later calls are refused).
pub fn set_range(r: UidRange) -> Result<(), UidRange> {
    RANGE.set(r)
}

/// The range in use.
pub fn range() -> UidRange {
    RANGE.get().copied().unwrap_or_default()
}

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "no free uid left in {first}-{last} ({n} agents have one); give agentosd a wider range with --agent-uids (docs/daemon.md, \"Limits\")",
        n = last - first + 1
    )]
    Exhausted { first: u32, last: u32 },
    #[error(transparent)]
    Fs(#[from] safe_fs::SafeFsError),
    #[error(
        "{path} belongs to uid {owner}, not to the agent's uid {uid} or root; move it away before starting the agent"
    )]
    Foreign { path: PathBuf, owner: u32, uid: u32 },
}

fn io_err(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> IdentityError + use<> {
    let path = path.to_path_buf();
    move |source| IdentityError::Io { op, path, source }
}

/// Where uids are recorded: `<state>/uids.json`, a map from `tenant/name` to uid.
pub fn table_path(state_dir: &Path) -> PathBuf {
    state_dir.join("uids.json")
}

fn uid_in_passwd(uid: u32) -> bool {
    std::fs::read_to_string("/etc/passwd")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(':').nth(2).and_then(|u| u.parse::<u32>().ok()) == Some(uid))
}

/// Pick a uid for `id`: the recorded one, else the first free one starting at a hash of the id
/// (stable across hosts for the same agent). Pure apart from `taken`.
pub fn choose(
    id: &str,
    range: UidRange,
    used: &BTreeMap<String, u32>,
    taken: impl Fn(u32) -> bool,
) -> Option<u32> {
    if let Some(u) = used.get(id) {
        return Some(*u);
    }
    let span = range.len();
    let h = id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    });
    let start = (h % span as u64) as u32;
    let in_use: std::collections::HashSet<u32> = used.values().copied().collect();
    (0..span)
        .map(|i| range.first + (start + i) % span)
        .find(|u| !in_use.contains(u) && !taken(*u))
}

/// The agent's uid (= gid), allocating and recording one on first use.
pub fn uid_for(state_dir: &Path, id: &str) -> Result<u32, IdentityError> {
    let mut memo = ALLOC.lock().unwrap_or_else(|p| p.into_inner());
    let path = table_path(state_dir);
    // The daemon's own file in its own directory (no agent writes there): unchanged when its
    // inode, size and mtime are (a write replaces it by rename).
    let id_now = file_id(&path);
    let fresh = memo
        .as_ref()
        .filter(|m| m.path == path && id_now.is_some_and(|f| f == m.file));
    if let Some(u) = fresh.and_then(|m| m.map.get(id)) {
        return Ok(*u);
    }
    let mut used: BTreeMap<String, u32> = match fresh {
        Some(m) => m.map.clone(),
        None => match std::fs::read(&path) {
            Ok(d) => serde_json::from_slice(&d).unwrap_or_default(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(io_err("read", &path)(e)),
        },
    };
    if let Some(u) = used.get(id).copied() {
        *memo = id_now.map(|file| Memo {
            path,
            file,
            map: used,
        });
        return Ok(u);
    }
    let r = range();
    let uid = choose(id, r, &used, uid_in_passwd).ok_or(IdentityError::Exhausted {
        first: r.first,
        last: r.last,
    })?;
    used.insert(id.to_string(), uid);
    std::fs::create_dir_all(state_dir).map_err(io_err("create", state_dir))?;
    let tmp = path.with_extension("json.tmp");
    let data = serde_json::to_vec_pretty(&used).unwrap_or_default();
    std::fs::write(&tmp, data).map_err(io_err("write", &tmp))?;
    std::fs::rename(&tmp, &path).map_err(io_err("rename", &path))?;
    *memo = file_id(&path).map(|file| Memo {
        path,
        file,
        map: used,
    });
    Ok(uid)
}

/// `<state>/home/<tenant>/<name>`: the agent's private state directory.
pub fn home_dir(state_dir: &Path, tenant: &str, name: &str) -> PathBuf {
    state_dir.join("home").join(tenant).join(name)
}

/// Create the state directory (and `tmp/` in it) owned by `uid`, mode 0700; the directories
/// above it are root's, mode 0711 (traversable, not listable). Returns the home's fd.
///
/// The home is the agent's: it may have replaced anything in it with a link (to `/etc`, to a
/// file it may not write) before this restart. So every step is on fds from the daemon's own
/// state directory ([`safe_fs::Dir`]): `home/<tenant>/<name>/tmp` is opened with
/// `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV` and
/// chowned/chmodded with `fchown`/`fchmod` on what was opened. A `tmp` that is not a directory
/// (a link, a file) is removed with `unlinkat` (the link, never its target) and made afresh; a
/// directory owned by someone else than root or the agent is an error.
pub fn make_home(
    state_dir: &Path,
    tenant: &str,
    name: &str,
    uid: u32,
) -> Result<safe_fs::Dir, IdentityError> {
    let root = safe_fs::Dir::open_root(state_dir)?;
    traversable(&root)?;
    let mut d = root.mkdir("home", 0o711)?;
    traversable(&d)?;
    d = d.mkdir(tenant, 0o711)?;
    traversable(&d)?;
    let home = d.mkdir(name, 0o700)?;
    own(&home, uid)?;
    let tmp = match home.mkdir("tmp", 0o700) {
        Ok(t) => t,
        Err(safe_fs::SafeFsError::Link { .. } | safe_fs::SafeFsError::Refused { .. }) => {
            // Not a directory: the agent's own link or file. Remove the entry itself.
            home.unlink("tmp")?;
            home.mkdir("tmp", 0o700)?
        }
        Err(e) => return Err(e.into()),
    };
    own(&tmp, uid)?;
    Ok(home)
}

/// Mode 0711 on the directory opened as `d` (a `fchmod` only when it differs: an unchanged
/// mode is not written again on every start).
fn traversable(d: &safe_fs::Dir) -> Result<(), IdentityError> {
    if d.stat()?.st_mode & 0o7777 != 0o711 {
        d.chmod(0o711)?;
    }
    Ok(())
}

/// Give the directory opened as `d` to `uid` (mode 0700), unless it belongs to someone else.
/// Owner and mode are set on the fd, and only where they differ.
fn own(d: &safe_fs::Dir, uid: u32) -> Result<(), IdentityError> {
    let st = d.stat()?;
    if st.st_uid != 0 && st.st_uid != uid {
        return Err(IdentityError::Foreign {
            path: d.path().to_path_buf(),
            owner: st.st_uid,
            uid,
        });
    }
    if st.st_uid != uid || st.st_gid != uid {
        d.chown(uid, uid)?;
    }
    // After a chown too: it clears set-id bits.
    if st.st_uid != uid || st.st_gid != uid || st.st_mode & 0o7777 != 0o700 {
        d.chmod(0o700)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uids_are_stable_distinct_and_in_range() {
        let mut used = BTreeMap::new();
        let r = UidRange::default();
        let a = choose("t/a", r, &used, |_| false).unwrap();
        assert!((UID_MIN..=UID_MAX).contains(&a));
        assert_eq!(choose("t/a", r, &used, |_| false), Some(a));
        used.insert("t/a".into(), a);
        // a taken uid is skipped
        let b = choose("t/b", r, &used, |u| u != a && u % 2 == 0).unwrap();
        assert!(b != a && b % 2 == 1);
        used.insert("t/b".into(), b);
        assert_eq!(choose("t/b", r, &used, |_| true), Some(b));
    }

    #[test]
    fn a_range_holds_as_many_agents_as_uids_and_no_more() {
        let r: UidRange = "131072-131081".parse().unwrap();
        let mut used = BTreeMap::new();
        for i in 0..10 {
            let id = format!("t/a{i}");
            let u = choose(&id, r, &used, |_| false).expect("a free uid");
            assert!(r.contains(u), "{u} outside {r:?}");
            assert!(!used.values().any(|v| *v == u), "{u} given twice");
            used.insert(id, u);
        }
        assert_eq!(choose("t/eleventh", r, &used, |_| false), None);
        // The agents that have one keep it.
        assert_eq!(
            choose("t/a3", r, &used, |_| false),
            used.get("t/a3").copied()
        );
    }

    #[test]
    fn uid_ranges_are_checked() {
        let ok: UidRange = "131072-196607".parse().unwrap();
        assert_eq!((ok.first, ok.last, ok.len()), (131072, 196607, 65536));
        assert_eq!("61184-65519".parse::<UidRange>(), Ok(UidRange::default()));
        for (bad, says) in [
            ("1000-2000", "below 61184"),
            ("61184-70000", "65534"),
            ("200000-100000", "above LAST"),
            ("131072", "FIRST-LAST"),
            ("131072-x", "\"x\""),
            ("2147483000-2147483648", "2^31"),
        ] {
            let e = bad.parse::<UidRange>().unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn a_planted_tmp_link_is_replaced_and_its_target_untouched() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let state = tempfile::tempdir().unwrap();
        let decoy = tempfile::tempdir().unwrap();
        std::fs::set_permissions(decoy.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let before = std::fs::metadata(decoy.path()).unwrap();
        let me = rustix::process::geteuid().as_raw();
        let home = make_home(state.path(), "t", "a", me).unwrap();
        let tmp = home.path().join("tmp");
        std::fs::remove_dir(&tmp).unwrap();
        std::os::unix::fs::symlink(decoy.path(), &tmp).unwrap();
        make_home(state.path(), "t", "a", me).unwrap();
        let after = std::fs::metadata(decoy.path()).unwrap();
        assert_eq!((after.uid(), after.mode()), (before.uid(), before.mode()));
        let m = std::fs::symlink_metadata(&tmp).unwrap();
        assert!(m.is_dir() && m.mode() & 0o7777 == 0o700, "{m:?}");
        // A link as an intermediate component above the home is refused, not followed.
        std::fs::remove_dir_all(state.path().join("home/t")).unwrap();
        std::os::unix::fs::symlink(decoy.path(), state.path().join("home/t")).unwrap();
        let e = make_home(state.path(), "t", "a", me).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert!(!decoy.path().join("a").exists());
    }

    #[test]
    fn a_planted_tmp_fifo_or_file_is_replaced_without_blocking() {
        // `make_home` opens `tmp` before it makes it: a FIFO there must not block the daemon
        // (the kernel refuses O_DIRECTORY before opening) and, like a file, is replaced.
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let state = tempfile::tempdir().unwrap();
        let me = rustix::process::geteuid().as_raw();
        let home = make_home(state.path(), "t", "a", me).unwrap();
        let tmp = home.path().join("tmp");
        for plant in ["fifo", "file"] {
            std::fs::remove_dir(&tmp).unwrap();
            if plant == "fifo" {
                rustix::fs::mknodat(
                    rustix::fs::CWD,
                    &tmp,
                    rustix::fs::FileType::Fifo,
                    rustix::fs::Mode::from_raw_mode(0o666),
                    0,
                )
                .unwrap();
                assert!(
                    std::fs::symlink_metadata(&tmp)
                        .unwrap()
                        .file_type()
                        .is_fifo()
                );
            } else {
                std::fs::write(&tmp, b"x").unwrap();
            }
            let (tx, rx) = std::sync::mpsc::channel();
            let dir = state.path().to_path_buf();
            std::thread::spawn(move || {
                let _ = tx.send(make_home(&dir, "t", "a", me).map(|_| ()));
            });
            rx.recv_timeout(std::time::Duration::from_secs(10))
                .unwrap_or_else(|_| panic!("make_home blocked on a planted {plant}"))
                .unwrap();
            let m = std::fs::symlink_metadata(&tmp).unwrap();
            assert!(m.is_dir() && m.mode() & 0o7777 == 0o700, "{plant}: {m:?}");
        }
    }

    #[test]
    fn the_remembered_table_is_read_again_when_the_file_changes() {
        let dir = tempfile::tempdir().unwrap();
        let a = uid_for(dir.path(), "t/a").unwrap();
        assert_eq!(uid_for(dir.path(), "t/a").unwrap(), a);
        // The operator moves t/a to another uid (a new file, as an editor writes it).
        let other = if a == UID_MIN { UID_MIN + 1 } else { UID_MIN };
        let tmp = dir.path().join("edited");
        std::fs::write(&tmp, format!("{{\"t/a\": {other}}}")).unwrap();
        std::fs::rename(&tmp, table_path(dir.path())).unwrap();
        assert_eq!(uid_for(dir.path(), "t/a").unwrap(), other);
        // Written in place, same size: the mtime tells.
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(table_path(dir.path()), format!("{{\"t/a\": {a}}}")).unwrap();
        assert_eq!(uid_for(dir.path(), "t/a").unwrap(), a);
    }

    #[test]
    fn make_home_restores_owner_and_mode() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let state = tempfile::tempdir().unwrap();
        let me = rustix::process::geteuid().as_raw();
        let home = make_home(state.path(), "t", "a", me).unwrap();
        for (p, mode) in [
            (home.path().to_path_buf(), 0o755),
            (home.path().join("tmp"), 0o777),
            (state.path().join("home/t"), 0o755),
        ] {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        }
        make_home(state.path(), "t", "a", me).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().mode() & 0o7777;
        assert_eq!(mode(home.path()), 0o700);
        assert_eq!(mode(&home.path().join("tmp")), 0o700);
        assert_eq!(mode(&state.path().join("home/t")), 0o711);
        assert_eq!(mode(&state.path().join("home")), 0o711);
    }

    #[test]
    fn uid_table_persists() {
        let dir = tempfile::tempdir().unwrap();
        let a = uid_for(dir.path(), "t/a").unwrap();
        let b = uid_for(dir.path(), "t/b").unwrap();
        assert_ne!(a, b);
        assert_eq!(uid_for(dir.path(), "t/a").unwrap(), a);
    }
}
