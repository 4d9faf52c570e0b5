//! The bpffs pins that let enforcement outlive the daemon: where they live, their
//! generations, the sweep of pins whose cgroup is gone, and the `agentosd check` line.

use std::path::{Path, PathBuf};

use aya::programs::links::{FdLink, PinnedLink};

use super::NetError;

/// The default root of the bpffs pins (`agentosd --bpf-pin-dir`).
pub const DEFAULT_PIN_ROOT: &str = "/sys/fs/bpf/agentos";
/// Version of the pinned maps' layout (`ebpf/intf.h`: keys, values and sizes): a daemon with
/// another layout uses its own maps and removes the old ones once its links are pinned. v5: the
/// maps hold 16 384 agents (4 096 before; a daemon taking over the smaller maps would stop there).
const MAPS_LAYOUT: &str = "maps-v5";
/// Maps kept across daemons (the ring buffer too: denials while the daemon was down are read by
/// the next one).
/// `net_names` and `dns_orig` too: addresses learnt from DNS stay allowed, and replies to queries
/// redirected to a stub keep their source rewritten, across a restart.
pub(super) const PINNED_MAPS: [&str; 5] =
    ["net_policy", "stats", "events", "net_names", "dns_orig"];

/// The bpffs directory that holds one daemon's pins: `ROOT/net-CGID` where CGID is the id of the
/// `agents` cgroup the programs are attached to (so daemons on other cgroup roots never share
/// pins), with `maps-v5/` (the maps) and `links/PROGRAM-GENERATION` (the links).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pins {
    pub dir: PathBuf,
}

impl Pins {
    /// The pins of programs attached to `agents_cgroup` under bpffs `root`; mounts a bpffs
    /// instance at `root` when `root` is not on one (a new, empty instance: harmless), creating
    /// the directory when it is missing. Fails when `root` cannot be made a bpffs.
    pub fn prepare(root: &Path, agents_cgroup: &Path) -> Result<Pins, NetError> {
        let err = |error: String| NetError::Pin {
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
        let dir = root.join(format!("net-{cgid}"));
        let mut dirs = vec![dir.join(MAPS_LAYOUT), dir.join("links")];
        // Which cgroup these pins guard, for the sweep of a later daemon (bpffs holds no
        // regular files: the path is the name of an empty directory).
        if let Some(name) = escape_path(agents_cgroup) {
            dirs.push(dir.join("cgroup").join(name));
        }
        for d in dirs {
            std::fs::create_dir_all(&d).map_err(|e| err(format!("create {}: {e}", d.display())))?;
        }
        Ok(Pins { dir })
    }

    /// Remove these pins (their links detach): after programs of another layout were attached
    /// unpinned, so that the old programs, whose maps this daemon does not fill, stop refusing
    /// new agents for want of a policy entry.
    pub fn remove(&self) -> std::io::Result<()> {
        std::fs::remove_dir_all(&self.dir)
    }

    /// Pin `links` (all attached now) under `generation`, keeping them in `pinned`, and only
    /// then remove the `old` links of the previous daemon and the maps of another layout.
    pub(super) fn take_over(
        &self,
        links: Vec<(String, FdLink)>,
        generation: u64,
        old: &[(String, String, u64)],
        pinned: &mut Vec<PinnedLink>,
    ) -> Result<(), NetError> {
        // New links first (all attached now), then the old pins go.
        for (name, link) in links {
            let path = self.dir.join("links").join(format!("{name}-{generation}"));
            let p = link.pin(&path).map_err(|e| NetError::Pin {
                path: path.display().to_string(),
                error: format!("{e}{}", crate::enforce::source_chain(&e)),
            })?;
            pinned.push(p);
        }
        for (file, _, _) in old {
            let path = self.dir.join("links").join(file);
            if let Err(e) = std::fs::remove_file(&path) {
                tracing::warn!(
                    "removing the previous daemon's link {}: {e}",
                    path.display()
                );
            }
        }
        // Maps of another layout (an older agentosd): no link uses them any more.
        if let Ok(rd) = std::fs::read_dir(&self.dir) {
            for e in rd.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if n.starts_with("maps-") && n != MAPS_LAYOUT {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        if !old.is_empty() {
            tracing::info!(
                "took over the network programs pinned in {}: generation {generation} attached and pinned before {} pinned link(s) of the previous daemon were removed",
                self.dir.display(),
                old.len()
            );
        }
        Ok(())
    }

    pub(super) fn map(&self, name: &str) -> PathBuf {
        self.dir.join(MAPS_LAYOUT).join(name)
    }

    /// Pinned links now: (file name, program, generation).
    pub(super) fn links(&self) -> Vec<(String, String, u64)> {
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
            .strip_prefix("net-")
            .and_then(|c| c.parse::<u64>().ok())
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
pub(super) fn next_generation(pinned: &[(String, String, u64)]) -> u64 {
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
            "bpffs pins: {} is a bpffs: the network programs and their maps outlive the daemon (kill -9 opens no window)",
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
            "bpffs pins: NOT available at {} (no bpffs mounted, and the directory cannot be made there); while agentosd restarts the network programs are detached (pass --bpf-pin-dir DIR)",
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
