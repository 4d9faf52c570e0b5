//! Per-agent identity: an unprivileged uid/gid from a reserved range (the range systemd's
//! `DynamicUser=` uses), remembered in the daemon's state directory so an agent keeps its uid
//! across restarts and daemon re-adoption, and a private state directory owned by that uid.

use std::collections::BTreeMap;
use std::io;
use std::os::unix::fs::{PermissionsExt, chown};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

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
/// above it are root's, mode 0711 (traversable, not listable).
pub fn make_home(state_dir: &Path, home: &Path, uid: u32) -> Result<(), IdentityError> {
    std::fs::create_dir_all(home.join("tmp")).map_err(io_err("create", home))?;
    let mut p = home.parent();
    while let Some(dir) = p {
        if !dir.starts_with(state_dir) || dir == state_dir.parent().unwrap_or(Path::new("/")) {
            break;
        }
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))
            .map_err(io_err("chmod", dir))?;
        p = dir.parent();
    }
    for d in [home.to_path_buf(), home.join("tmp")] {
        chown(&d, Some(uid), Some(uid)).map_err(io_err("chown", &d))?;
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700))
            .map_err(io_err("chmod", &d))?;
    }
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
    fn uid_table_persists() {
        let dir = tempfile::tempdir().unwrap();
        let a = uid_for(dir.path(), "t/a").unwrap();
        let b = uid_for(dir.path(), "t/b").unwrap();
        assert_ne!(a, b);
        assert_eq!(uid_for(dir.path(), "t/a").unwrap(), a);
    }
}
