//! Per-agent identity: an unprivileged uid/gid from a reserved range (the range systemd's
//! `DynamicUser=` uses), remembered in the daemon's state directory so an agent keeps its uid
//! across restarts and daemon re-adoption, and a private state directory owned by that uid.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::safe_fs;

/// First and last uid handed to agents (systemd: 61184-65519).
pub const UID_MIN: u32 = 61184;
pub const UID_MAX: u32 = 65519;

static ALLOC: Mutex<()> = Mutex::new(());

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("no free uid left in {UID_MIN}-{UID_MAX}")]
    Exhausted,
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
pub fn choose(id: &str, used: &BTreeMap<String, u32>, taken: impl Fn(u32) -> bool) -> Option<u32> {
    if let Some(u) = used.get(id) {
        return Some(*u);
    }
    let span = UID_MAX - UID_MIN + 1;
    let h = id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    });
    let start = (h % span as u64) as u32;
    (0..span)
        .map(|i| UID_MIN + (start + i) % span)
        .find(|u| !used.values().any(|v| v == u) && !taken(*u))
}

/// The agent's uid (= gid), allocating and recording one on first use.
pub fn uid_for(state_dir: &Path, id: &str) -> Result<u32, IdentityError> {
    let _g = ALLOC.lock().unwrap_or_else(|p| p.into_inner());
    let path = table_path(state_dir);
    let mut used: BTreeMap<String, u32> = match std::fs::read(&path) {
        Ok(d) => serde_json::from_slice(&d).unwrap_or_default(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => BTreeMap::new(),
        Err(e) => return Err(io_err("read", &path)(e)),
    };
    if let Some(u) = used.get(id) {
        return Ok(*u);
    }
    let uid = choose(id, &used, uid_in_passwd).ok_or(IdentityError::Exhausted)?;
    used.insert(id.to_string(), uid);
    std::fs::create_dir_all(state_dir).map_err(io_err("create", state_dir))?;
    let tmp = path.with_extension("json.tmp");
    let data = serde_json::to_vec_pretty(&used).unwrap_or_default();
    std::fs::write(&tmp, data).map_err(io_err("write", &tmp))?;
    std::fs::rename(&tmp, &path).map_err(io_err("rename", &path))?;
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
    root.chmod(0o711)?;
    let mut d = root.mkdir("home", 0o711)?;
    d.chmod(0o711)?;
    d = d.mkdir(tenant, 0o711)?;
    d.chmod(0o711)?;
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

/// Give the directory opened as `d` to `uid` (mode 0700), unless it belongs to someone else.
fn own(d: &safe_fs::Dir, uid: u32) -> Result<(), IdentityError> {
    let st = d.stat()?;
    if st.st_uid != 0 && st.st_uid != uid {
        return Err(IdentityError::Foreign {
            path: d.path().to_path_buf(),
            owner: st.st_uid,
            uid,
        });
    }
    d.chown(uid, uid)?;
    d.chmod(0o700)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uids_are_stable_distinct_and_in_range() {
        let mut used = BTreeMap::new();
        let a = choose("t/a", &used, |_| false).unwrap();
        assert!((UID_MIN..=UID_MAX).contains(&a));
        assert_eq!(choose("t/a", &used, |_| false), Some(a));
        used.insert("t/a".into(), a);
        // a taken uid is skipped
        let b = choose("t/b", &used, |u| u != a && u % 2 == 0).unwrap();
        assert!(b != a && b % 2 == 1);
        used.insert("t/b".into(), b);
        assert_eq!(choose("t/b", &used, |_| true), Some(b));
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
    fn uid_table_persists() {
        let dir = tempfile::tempdir().unwrap();
        let a = uid_for(dir.path(), "t/a").unwrap();
        let b = uid_for(dir.path(), "t/b").unwrap();
        assert_ne!(a, b);
        assert_eq!(uid_for(dir.path(), "t/a").unwrap(), a);
    }
}
