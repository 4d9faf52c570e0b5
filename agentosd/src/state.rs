//! Persistence of what the daemon manages: one JSON file per agent under
//! `STATE/agents/<tenant>/<name>.json`, written atomically (temporary file, fsync, rename, fsync
//! of the directory), so a crash leaves either the old or the new record, never half of one.
//! A start's `starting` record skips the syncs ([`Store::save_unsynced`]): it only has to survive
//! a crash of the daemon, and the `running` record after the spawn is synced before the start is
//! acknowledged.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::spec::AgentSpec;
use crate::sys::ExitStatus;

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("state {op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("state file {path} is corrupt: {source}")]
    Corrupt {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

/// The persisted record of one agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentRecord {
    pub spec: AgentSpec,
    /// The contract text it was started from.
    pub contract: String,
    /// Where the contract came from (file path or `dbus`).
    pub origin: String,
    /// Started from the agents directory (like an enabled unit).
    #[serde(default)]
    pub enabled: bool,
    pub state: String,
    #[serde(default)]
    pub result: String,
    pub main_pid: Option<u32>,
    /// Start time of the main PID in clock ticks since boot (guards against PID reuse).
    pub main_start_time: Option<u64>,
    pub cgroup: PathBuf,
    #[serde(default)]
    pub restarts: u32,
    pub exit_status: Option<ExitStatus>,
    /// Wall-clock start of the current run, µs since the epoch.
    #[serde(default)]
    pub started_at_us: u64,
    #[serde(default)]
    pub boot_id: String,
    /// When its contract (`contract`) was loaded, µs since the epoch (0: not recorded by older
    /// daemons). `status` compares the contract file's mtime with it.
    #[serde(default)]
    pub contract_loaded_us: u64,
}

/// Write `data` to `path` atomically and durably.
pub fn write_atomic(path: &Path, data: &[u8]) -> Result<(), StateError> {
    write_replacing(path, data, true)
}

/// Write `data` to `path` by a temporary file and a rename: every reader (the daemon after a
/// crash of its own included: the page cache outlives it) sees the old or the new content.
/// `durable`: the temporary file is synced before the rename and the directory after it, so
/// that a power cut also leaves the old or the new content; without, a power cut in the few
/// milliseconds before the next durable write of the same file may leave the old content, the
/// new one or, on file systems that do not flush a file replaced by rename (ext4's
/// `auto_da_alloc`, btrfs and XFS do), an empty file, which `load_all` reports as corrupt.
pub fn write_replacing(path: &Path, data: &[u8], durable: bool) -> Result<(), StateError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let err = |op, p: &Path, source| StateError::Io {
        op,
        path: p.to_path_buf(),
        source,
    };
    // Root's records, in directories no one else may write (0755 whatever the umask), and
    // the temporary file never opened through a link.
    {
        use std::os::unix::fs::DirBuilderExt;
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir)
            .map_err(|e| err("mkdir", dir, e))?;
    }
    let tmp = dir.join(format!(
        ".{}.tmp",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("state")
    ));
    {
        let mut f = {
            use std::os::unix::fs::OpenOptionsExt;
            fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&tmp)
                .map_err(|e| err("create", &tmp, e))?
        };
        f.write_all(data).map_err(|e| err("write", &tmp, e))?;
        if durable {
            f.sync_all().map_err(|e| err("fsync", &tmp, e))?;
        }
    }
    fs::rename(&tmp, path).map_err(|e| err("rename", path, e))?;
    if !durable {
        return Ok(());
    }
    let d = fs::File::open(dir).map_err(|e| err("open", dir, e))?;
    d.sync_all().map_err(|e| err("fsync", dir, e))?;
    Ok(())
}

/// The state directory.
#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
}

impl Store {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn agents_dir(&self) -> PathBuf {
        self.root.join("agents")
    }

    pub fn record_path(&self, tenant: &str, name: &str) -> PathBuf {
        self.agents_dir().join(tenant).join(format!("{name}.json"))
    }

    pub fn save(&self, rec: &AgentRecord) -> Result<(), StateError> {
        self.save_as(rec, true)
    }

    /// [`Self::save`] without waiting for the disk ([`write_replacing`]): for a record that only
    /// has to survive a crash of the daemon, because a durable one follows before anyone is
    /// told (a start: `starting` before the spawn, `running` synced before the reply).
    pub fn save_unsynced(&self, rec: &AgentRecord) -> Result<(), StateError> {
        self.save_as(rec, false)
    }

    fn save_as(&self, rec: &AgentRecord, durable: bool) -> Result<(), StateError> {
        let path = self.record_path(&rec.spec.tenant, &rec.spec.name);
        let data = serde_json::to_vec_pretty(rec).map_err(|source| StateError::Corrupt {
            path: path.clone(),
            source,
        })?;
        write_replacing(&path, &data, durable)
    }

    pub fn delete(&self, tenant: &str, name: &str) -> Result<(), StateError> {
        let path = self.record_path(tenant, name);
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(StateError::Io {
                op: "remove",
                path,
                source,
            }),
        }
    }

    /// All records; corrupt ones are returned as errors next to the good ones.
    pub fn load_all(&self) -> (Vec<AgentRecord>, Vec<StateError>) {
        let mut recs = Vec::new();
        let mut errs = Vec::new();
        let Ok(tenants) = fs::read_dir(self.agents_dir()) else {
            return (recs, errs);
        };
        for t in tenants.flatten() {
            let Ok(files) = fs::read_dir(t.path()) else {
                continue;
            };
            for f in files.flatten() {
                let p = f.path();
                if p.extension().and_then(|e| e.to_str()) != Some("json") {
                    continue;
                }
                match fs::read(&p) {
                    Ok(data) => match serde_json::from_slice::<AgentRecord>(&data) {
                        Ok(r) => recs.push(r),
                        Err(source) => errs.push(StateError::Corrupt { path: p, source }),
                    },
                    Err(source) => errs.push(StateError::Io {
                        op: "read",
                        path: p,
                        source,
                    }),
                }
            }
        }
        recs.sort_by_key(|r| r.spec.id());
        (recs, errs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{Budgets, Restart};

    fn rec(name: &str) -> AgentRecord {
        AgentRecord {
            spec: AgentSpec {
                name: name.into(),
                tenant: "default".into(),
                latency_class: "DT".into(),
                exec: None,
                restart: Restart::default(),
                budgets: Budgets::default(),
                sched: Default::default(),
            },
            contract: "name: x".into(),
            origin: "test".into(),
            enabled: false,
            state: "running".into(),
            result: String::new(),
            main_pid: Some(42),
            main_start_time: Some(7),
            cgroup: "/sys/fs/cgroup/x".into(),
            restarts: 0,
            exit_status: Some(ExitStatus::Exited(3)),
            contract_loaded_us: 0,
            started_at_us: 1,
            boot_id: "b".into(),
        }
    }

    #[test]
    fn save_load_delete_roundtrip() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path());
        store.save(&rec("a")).unwrap();
        store.save(&rec("b")).unwrap();
        let mut r = rec("a");
        r.restarts = 2;
        store.save(&r).unwrap();
        let (all, errs) = store.load_all();
        assert!(errs.is_empty());
        assert_eq!(all.len(), 2);
        assert_eq!(all[0], r);
        // no temporary files left behind
        let names: Vec<_> = fs::read_dir(dir.path().join("agents/default"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
        store.delete("default", "a").unwrap();
        store.delete("default", "a").unwrap();
        assert_eq!(store.load_all().0.len(), 1);
    }

    #[test]
    fn corrupt_record_reported_not_fatal() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path());
        store.save(&rec("good")).unwrap();
        fs::write(dir.path().join("agents/default/bad.json"), b"{").unwrap();
        let (all, errs) = store.load_all();
        assert_eq!(all.len(), 1);
        assert_eq!(errs.len(), 1);
        assert!(errs[0].to_string().contains("bad.json"));
    }
}
