//! The bpffs pins that let enforcement outlive the daemon: where they live, their
//! generations, the sweep of pins whose cgroup is gone, and the `agentosd check` line. Shared by
//! the cgroup network programs (`net`, `ROOT/net-CGID`) and the BPF LSM filesystem programs
//! (`fs`, `ROOT/fs-CGID`).

use std::path::{Path, PathBuf};

use aya::programs::links::{FdLink, PinnedLink};

/// The default root of the bpffs pins (`agentosd --bpf-pin-dir`).
pub const DEFAULT_PIN_ROOT: &str = "/sys/fs/bpf/agentos";

/// A pin directory that could not be made or used.
#[derive(Debug, thiserror::Error)]
#[error("bpffs pin directory {path}: {error} (pass --bpf-pin-dir DIR on a bpffs, or \"none\")")]
pub struct PinError {
    pub path: String,
    pub error: String,
}

/// Whose pins: the directory prefix (`net`, `fs`), the version of the pinned maps' layout and
/// what the programs are, for the logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PinKind {
    /// `ROOT/PREFIX-CGID`.
    pub prefix: &'static str,
    /// `maps-vN`: a daemon with another layout uses its own maps and removes the old ones once
    /// its links are pinned (and, for `fs`, once its agents' entries are in them).
    pub layout: &'static str,
    /// "network", "filesystem".
    pub what: &'static str,
}

/// The bpffs directory that holds one daemon's pins of one kind: `ROOT/KIND-CGID` where CGID is
/// the id of the `agents` cgroup the programs guard (so daemons on other cgroup roots never
/// share pins), with `maps-vN/` (the maps) and `links/PROGRAM-GENERATION` (the links).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pins {
    pub dir: PathBuf,
    pub kind: PinKind,
}

impl Pins {
    /// The pins of `kind` for programs guarding `agents_cgroup` under bpffs `root`; mounts a
    /// bpffs instance at `root` when `root` is not on one (a new, empty instance: harmless),
    /// creating the directory when it is missing. Fails when `root` cannot be made a bpffs.
    pub fn prepare(root: &Path, agents_cgroup: &Path, kind: PinKind) -> Result<Pins, PinError> {
        let err = |error: String| PinError {
            path: root.display().to_string(),
            error,
        };
        if !root.exists() {
            std::fs::create_dir_all(root).map_err(|e| err(format!("create: {e}")))?;
        }
        if !is_bpffs(root) {
            nix::mount::mount(
                Some("bpf"),
                root,
                Some("bpf"),
                nix::mount::MsFlags::MS_NOSUID
                    | nix::mount::MsFlags::MS_NODEV
                    | nix::mount::MsFlags::MS_NOEXEC,
                Some("mode=0700"),
            )
            .map_err(|e| err(format!("not a bpffs, and mounting one there failed: {e}")))?;
            tracing::info!(
                "mounted a bpffs instance at {} for the BPF pins",
                root.display()
            );
        }
        let cgid = std::fs::metadata(agents_cgroup)
            .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
            .map_err(|e| err(format!("cgroup {}: {e}", agents_cgroup.display())))?;
        sweep_stale(root);
        let dir = root.join(format!("{}-{cgid}", kind.prefix));
        let mut dirs = vec![dir.join(kind.layout), dir.join("links")];
        // Which cgroup these pins guard, for the sweep of a later daemon (bpffs holds no
        // regular files: the path is the name of an empty directory).
        if let Some(name) = escape_path(agents_cgroup) {
            dirs.push(dir.join("cgroup").join(name));
        }
        for d in dirs {
            std::fs::create_dir_all(&d).map_err(|e| err(format!("create {}: {e}", d.display())))?;
        }
        Ok(Pins { dir, kind })
    }

    /// Remove these pins (their links detach): after programs of another layout were attached
    /// unpinned, so that the old programs, whose maps this daemon does not fill, stop refusing
    /// (or checking) agents by stale entries.
    pub fn remove(&self) -> std::io::Result<()> {
        std::fs::remove_dir_all(&self.dir)
    }

    /// Pin `links` (all attached now) under `generation`, keeping them in `pinned`, and only
    /// then remove the `old` links of the previous daemon and the maps of another layout.
    pub fn take_over(
        &self,
        links: Vec<(String, FdLink)>,
        generation: u64,
        old: &[(String, String, u64)],
        pinned: &mut Vec<PinnedLink>,
    ) -> Result<(), PinError> {
        // New links first (all attached now), then the old pins go.
        self.pin_links(links, generation, pinned)?;
        self.retire(generation, old);
        Ok(())
    }

    /// Pin `links` (all attached now) under `generation`, keeping them in `pinned`.
    pub fn pin_links(
        &self,
        links: Vec<(String, FdLink)>,
        generation: u64,
        pinned: &mut Vec<PinnedLink>,
    ) -> Result<(), PinError> {
        for (name, link) in links {
            let path = self.dir.join("links").join(format!("{name}-{generation}"));
            let p = link.pin(&path).map_err(|e| PinError {
                path: path.display().to_string(),
                error: format!("{e}{}", crate::enforce::source_chain(&e)),
            })?;
            pinned.push(p);
        }
        Ok(())
    }

    /// Remove the `old` link pins of previous daemons (their links detach) and the maps of
    /// another layout (no link uses them any more); `generation` is the one now pinned.
    pub fn retire(&self, generation: u64, old: &[(String, String, u64)]) {
        for (file, _, _) in old {
            let path = self.dir.join("links").join(file);
            if let Err(e) = std::fs::remove_file(&path) {
                tracing::warn!(
                    "removing the previous daemon's link {}: {e}",
                    path.display()
                );
            }
        }
        if let Ok(rd) = std::fs::read_dir(&self.dir) {
            for e in rd.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if n.starts_with("maps-") && n != self.kind.layout {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        if !old.is_empty() {
            tracing::info!(
                "took over the {} programs pinned in {}: generation {generation} attached and pinned before {} pinned link(s) of the previous daemon were removed",
                self.kind.what,
                self.dir.display(),
                old.len()
            );
        }
    }

    /// Where map `name` is pinned.
    pub fn map(&self, name: &str) -> PathBuf {
        self.dir.join(self.kind.layout).join(name)
    }

    /// Pinned links now: (file name, program, generation).
    pub fn links(&self) -> Vec<(String, String, u64)> {
        let mut v: Vec<(String, String, u64)> = std::fs::read_dir(self.dir.join("links"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let n = e.file_name().to_string_lossy().into_owned();
                let (prog, generation) = parse_link_name(&n)?;
                Some((n.clone(), prog.to_string(), generation))
            })
            .collect();
        v.sort_by_key(|l| l.2);
        v
    }
}

/// A cgroup path as one bpffs name: `%`, `/` and `.` (bpffs refuses dots) escaped; `None` when
/// too long for a name.
fn escape_path(p: &Path) -> Option<String> {
    let s = p.to_string_lossy();
    let e = s
        .replace('%', "%25")
        .replace('/', "%2F")
        .replace('.', "%2E");
    (e.len() <= 255).then_some(e)
}

fn unescape_path(name: &str) -> PathBuf {
    PathBuf::from(
        name.replace("%2F", "/")
            .replace("%2E", ".")
            .replace("%25", "%"),
    )
}

/// Remove the pins of `agents` cgroups that are gone (a test's or an old cgroup root's): their
/// links would keep the dead cgroups' memory. A directory whose cgroup still exists with the
/// same id is left alone, whoever owns it.
fn sweep_stale(root: &Path) {
    let Ok(rd) = std::fs::read_dir(root) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(cgid) = name
            .rsplit_once('-')
            .and_then(|(_, c)| c.parse::<u64>().ok())
        else {
            continue;
        };
        let Some(cg) = std::fs::read_dir(e.path().join("cgroup"))
            .ok()
            .and_then(|mut r| r.next())
            .and_then(|x| x.ok())
            .map(|x| unescape_path(&x.file_name().to_string_lossy()))
        else {
            continue;
        };
        let alive =
            std::fs::metadata(&cg).is_ok_and(|m| std::os::unix::fs::MetadataExt::ino(&m) == cgid);
        if !alive {
            match std::fs::remove_dir_all(e.path()) {
                Ok(()) => tracing::info!(
                    "removed the BPF pins {} of cgroup {} (gone)",
                    e.path().display(),
                    cg.display()
                ),
                Err(err) => tracing::warn!("removing stale BPF pins {}: {err}", e.path().display()),
            }
        }
    }
}

/// `PROGRAM-GENERATION` → (program, generation). (bpffs refuses names with a dot: EPERM.)
fn parse_link_name(name: &str) -> Option<(&str, u64)> {
    let (prog, g) = name.rsplit_once('-')?;
    Some((prog, g.parse().ok()?))
}

/// The generation the next daemon pins its links under: one past every pinned one.
pub fn next_generation(pinned: &[(String, String, u64)]) -> u64 {
    pinned.iter().map(|l| l.2 + 1).max().unwrap_or(1)
}

/// Whether `path` is on a bpffs (statfs magic).
pub fn is_bpffs(path: &Path) -> bool {
    nix::sys::statfs::statfs(path)
        .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::BPF_FS_MAGIC)
}

/// For `agentosd check`: whether the pins can outlive the daemon at `root`.
pub fn pin_check_line(root: &Path) -> String {
    if is_bpffs(root) {
        return format!(
            "bpffs pins: {} is a bpffs: the network and filesystem programs and their maps outlive the daemon (kill -9 opens no window)",
            root.display()
        );
    }
    let parent = root.ancestors().skip(1).find(|p| p.exists());
    match parent {
        Some(p)
            if std::fs::metadata(p).is_ok_and(|m| !m.permissions().readonly()) && !is_sysfs(p) =>
        {
            format!(
                "bpffs pins: {} is not a bpffs; agentosd mounts a bpffs instance there at start",
                root.display()
            )
        }
        _ => format!(
            "bpffs pins: NOT available at {} (no bpffs mounted, and the directory cannot be made there); while agentosd restarts the network and filesystem programs are detached (pass --bpf-pin-dir DIR)",
            root.display()
        ),
    }
}

fn is_sysfs(p: &Path) -> bool {
    nix::sys::statfs::statfs(p).is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::SYSFS_MAGIC)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn cgroup_paths_as_bpffs_names() {
        let p = Path::new("/sys/fs/cgroup/system.slice/agentosd.service/agents%x");
        let e = escape_path(p).unwrap();
        assert!(!e.contains('/') && !e.contains('.'), "{e}");
        assert_eq!(unescape_path(&e), p);
        assert!(escape_path(Path::new(&"/a".repeat(200))).is_none());
    }

    const KIND: PinKind = PinKind {
        prefix: "fs",
        layout: "maps-v2",
        what: "filesystem",
    };

    /// The bookkeeping on plain directories (bpffs holds only pins; the pins themselves are
    /// exercised where BPF loads: tests/netbpf.rs, tests/fspin.rs in the VM).
    #[test]
    fn generations_retire_old_links_and_other_layouts_only() {
        let d = tempfile::tempdir().unwrap();
        let pins = Pins {
            dir: d.path().join("fs-42"),
            kind: KIND,
        };
        for sub in ["links", "maps-v1", "maps-v2"] {
            std::fs::create_dir_all(pins.dir.join(sub)).unwrap();
        }
        for l in [
            "agentos_lsm_file_open-2",
            "agentos_lsm_file_open-1",
            "stray",
        ] {
            std::fs::write(pins.dir.join("links").join(l), "").unwrap();
        }
        let old = pins.links();
        assert_eq!(
            old.iter().map(|l| l.2).collect::<Vec<_>>(),
            vec![1, 2],
            "{old:?}"
        );
        let generation = next_generation(&old);
        assert_eq!(generation, 3);
        std::fs::write(
            pins.dir
                .join("links")
                .join(format!("agentos_lsm_file_open-{generation}")),
            "",
        )
        .unwrap();
        pins.retire(generation, &old);
        assert_eq!(
            pins.links().into_iter().map(|l| l.0).collect::<Vec<_>>(),
            vec!["agentos_lsm_file_open-3".to_string()]
        );
        assert!(
            !pins.dir.join("maps-v1").exists(),
            "another layout's maps go"
        );
        assert!(pins.dir.join("maps-v2").exists(), "this layout's maps stay");
        assert_eq!(pins.map("fs_agents"), pins.dir.join("maps-v2/fs_agents"));
    }

    #[test]
    fn pins_of_gone_cgroups_are_swept_whatever_their_kind() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("bpffs");
        let live = d.path().join("cg");
        std::fs::create_dir_all(&live).unwrap();
        let ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&live).unwrap());
        let gone = d.path().join("gone");
        let mk = |name: &str, cg: &Path| {
            let p = root.join(name);
            std::fs::create_dir_all(p.join("cgroup").join(escape_path(cg).unwrap())).unwrap();
            p
        };
        let (net_live, fs_live) = (
            mk(&format!("net-{ino}"), &live),
            mk(&format!("fs-{ino}"), &live),
        );
        let fs_gone = mk("fs-7", &gone);
        // Same path, another id: the cgroup was removed and made again.
        let fs_reused = mk(&format!("fs-{}", ino + 1), &live);
        std::fs::create_dir_all(root.join("other")).unwrap();
        sweep_stale(&root);
        assert!(net_live.exists() && fs_live.exists());
        assert!(!fs_gone.exists() && !fs_reused.exists());
        assert!(
            root.join("other").exists(),
            "not a pin directory: left alone"
        );
    }

    #[test]
    fn link_generations() {
        assert_eq!(
            parse_link_name("agentos_connect4-7"),
            Some(("agentos_connect4", 7))
        );
        assert_eq!(parse_link_name("agentos_connect4.7"), None);
        assert_eq!(parse_link_name("stray"), None);
        let pinned = |v: &[u64]| -> Vec<(String, String, u64)> {
            v.iter()
                .map(|g| (format!("p-{g}"), "p".into(), *g))
                .collect()
        };
        assert_eq!(next_generation(&pinned(&[])), 1);
        assert_eq!(next_generation(&pinned(&[3, 1, 2])), 4);
    }
}
