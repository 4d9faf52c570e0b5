//! Pathname Unix sockets as BPF LSM (`lsm/unix_stream_connect`, `lsm/unix_may_send` in
//! `ebpf/fs.bpf.c`): Landlock ABI 9's `RESOLVE_UNIX` rule for kernels that have BPF LSM and an
//! older Landlock, and defence in depth where both exist.
//!
//! An agent may connect or send to a pathname socket made in its own cgroup subtree (its
//! processes in `main/`, its tools in `tools/`), or one whose file, as bound, lies beneath a
//! directory granted to it: the daemon's socket directory `RUN_DIR/agents/<tenant>` and its
//! write grants (the directories Landlock gives `RESOLVE_UNIX`). The directories are keyed by
//! inode (the kernel's `dev_t` of the super block and the inode number), as Landlock's rules
//! are: the program walks the socket file's bound path up, across mounts.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

/// `struct agentos_unix_dir_key` (ebpf/intf.h).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UnixDirKey {
    pub cgroup_id: u64,
    pub ino: u64,
    pub dev: u32,
    pub pad: u32,
}

// SAFETY: `#[repr(C)]` of two u64 and two u32: 24 bytes without padding, no pointers, any bit
// pattern is valid.
unsafe impl aya::Pod for UnixDirKey {}

/// One granted directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnixDir {
    pub path: PathBuf,
    /// The kernel's internal `dev_t` of its super block ([`kernel_dev`]).
    pub dev: u32,
    pub ino: u64,
}

/// What one agent may reach by path.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnixScope {
    /// The id of the agent's cgroup (the parent of `main/` and `tools/`): sockets made in it or
    /// below are the agent's own.
    pub subtree: u64,
    pub dirs: Vec<UnixDir>,
    /// Directories that could not be opened (not granted; said in the agent's status).
    pub notes: Vec<String>,
}

/// The kernel's internal `dev_t` (`MKDEV`: major << 20 | minor, what `super_block.s_dev`
/// holds) of a `st_dev` as `stat(2)` gives it (`new_encode_dev`).
pub fn kernel_dev(st_dev: u64) -> u32 {
    (libc::major(st_dev) << 20) | (libc::minor(st_dev) & 0xf_ffff)
}

impl UnixScope {
    /// The scope of an agent whose cgroup has id `subtree`, granted `dirs` (the daemon's socket
    /// directory, the write grants), each opened by `open` (no link followed, as for its
    /// Landlock rules). A path that does not open is left out with a note: nothing beneath it
    /// is granted, as in Landlock, where such a rule is not added either.
    pub fn new(
        subtree: u64,
        dirs: &[PathBuf],
        open: &dyn Fn(&Path) -> Option<OwnedFd>,
    ) -> UnixScope {
        let mut s = UnixScope {
            subtree,
            ..UnixScope::default()
        };
        for p in dirs {
            let st = open(p).and_then(|fd| rustix::fs::fstat(&fd).ok());
            match st {
                Some(st) => {
                    let d = UnixDir {
                        path: p.clone(),
                        dev: kernel_dev(st.st_dev),
                        ino: st.st_ino,
                    };
                    if !s.dirs.iter().any(|x| x.dev == d.dev && x.ino == d.ino) {
                        s.dirs.push(d);
                    }
                }
                None => s.notes.push(format!(
                    "unix sockets (BPF LSM): {} does not open; no socket beneath it is granted",
                    p.display()
                )),
            }
        }
        s
    }

    /// The `fs_unix_dirs` keys of this scope for the agent's `main` cgroup `cgroup_id`.
    pub fn keys(&self, cgroup_id: u64) -> Vec<UnixDirKey> {
        self.dirs
            .iter()
            .map(|d| UnixDirKey {
                cgroup_id,
                ino: d.ino,
                dev: d.dev,
                pad: 0,
            })
            .collect()
    }

    /// One line for `agentctl status`.
    pub fn describe(&self) -> String {
        let dirs = self
            .dirs
            .iter()
            .map(|d| d.path.display().to_string())
            .collect::<Vec<_>>();
        format!(
            "unix sockets (BPF LSM): connect/send only to sockets made in the agent's cgroup or beneath {}",
            if dirs.is_empty() {
                "no directory".to_string()
            } else {
                dirs.join(" ")
            }
        )
    }
}

impl super::FsEnforcer {
    /// Fence a tool cgroup's pathname Unix sockets (the programs check every cgroup with an
    /// `fs_unix_agents` entry): a tool may reach only sockets made in its agent's subtree
    /// (`subtree`, the agent's cgroup), none by a granted directory — what Landlock ABI 9 gives
    /// tools (no `RESOLVE_UNIX` rule), for kernels without it and under `--no-landlock-unix`.
    /// Only the Unix socket entry: a tool's files are its manifest's Landlock scopes, not the
    /// agent's BPF prefixes. `key` (the tool cgroup's, as for the network policy) is what
    /// [`clear`](super::FsEnforcer::clear) takes to remove it. A no-op where the fence's
    /// programs did not load.
    pub fn set_tool_unix(
        &self,
        key: &str,
        tenant: &str,
        name: &str,
        cgroup_id: u64,
        subtree: u64,
    ) -> Result<bool, super::FsError> {
        if self.unix_status().is_err() {
            return Ok(false);
        }
        super::lock(&self.maps)
            .unix_agents
            .insert(cgroup_id, subtree, 0)
            .map_err(|e| super::FsError::Map {
                map: "fs_unix_agents",
                error: e.to_string(),
            })?;
        self.agents.insert(key, cgroup_id, tenant, name);
        Ok(true)
    }
}

/// `--no-landlock-unix` (`off`): accepted only where the BPF LSM fence for pathname Unix sockets
/// is active (else the agents would have no fence at all: refused, with why); then the agents'
/// rulesets leave `RESOLVE_UNIX` unhandled. Either way, logs which mechanisms fence the sockets.
pub fn landlock_option(
    off: bool,
    fs: &Result<std::sync::Arc<super::FsEnforcer>, String>,
) -> Result<(), String> {
    let bpf = match fs {
        Ok(f) => f.unix_status(),
        Err(e) => Err(format!(
            "the BPF LSM filesystem programs are not active: {e}"
        )),
    };
    let abi = crate::sandbox::landlock::kernel_abi();
    if off {
        if let Err(why) = bpf {
            return Err(format!(
                "--no-landlock-unix: the BPF LSM fence for pathname Unix sockets is not active ({why}); without it agents could reach every host socket. Remove the option (or the `no-landlock-unix` key of the configuration file)"
            ));
        }
        crate::sandbox::landlock::set_landlock_unix_off(true);
        tracing::warn!(
            "--no-landlock-unix: Landlock does not handle pathname Unix sockets (kernel ABI {abi:?}); the BPF LSM fence alone confines them"
        );
        return Ok(());
    }
    match (crate::sandbox::landlock::resolve_unix(abi), bpf) {
        (true, Ok(())) => {
            tracing::info!("pathname Unix sockets: fenced by Landlock RESOLVE_UNIX and BPF LSM")
        }
        (true, Err(_)) => tracing::info!("pathname Unix sockets: fenced by Landlock RESOLVE_UNIX"),
        (false, Ok(())) => tracing::info!(
            "pathname Unix sockets: fenced by BPF LSM (Landlock ABI {abi:?} has no RESOLVE_UNIX)"
        ),
        (false, Err(why)) => tracing::warn!(
            "pathname Unix sockets: NOT fenced: Landlock ABI {abi:?} has no RESOLVE_UNIX (Linux 7.1) and the BPF LSM fence is not active ({why}); agents can reach every host socket their uid may write"
        ),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn no_landlock_unix_is_refused_without_the_bpf_fence() {
        // Refused: nothing would fence the sockets. (Where it is accepted, the VM's escape
        // suite runs the attempts under it.)
        let e = landlock_option(true, &Err("EPERM (lockdown)".into())).unwrap_err();
        assert!(
            e.contains("--no-landlock-unix: the BPF LSM fence") && e.contains("EPERM (lockdown)"),
            "{e}"
        );
        assert!(!crate::sandbox::landlock::landlock_unix_off());
        // Without the option nothing is refused, whatever is missing.
        assert!(landlock_option(false, &Err("EPERM".into())).is_ok());
    }

    #[test]
    fn key_layout_matches_intf_h() {
        assert_eq!(std::mem::size_of::<UnixDirKey>(), 24);
    }

    #[test]
    fn dev_is_the_kernels_internal_encoding() {
        // 8:1 (sda1) as stat gives it: new_encode_dev = minor & 0xff | major << 8 | (minor &
        // ~0xff) << 12; the kernel keeps major << 20 | minor.
        assert_eq!(kernel_dev(libc::makedev(8, 1)), (8 << 20) | 1);
        // A minor above 255 (anonymous devices: tmpfs, btrfs subvolumes) and a large major.
        assert_eq!(kernel_dev(libc::makedev(0, 300)), 300);
        assert_eq!(kernel_dev(libc::makedev(259, 70000)), (259 << 20) | 70000);
    }

    #[test]
    fn directories_by_inode_once_and_unopenable_ones_noted() {
        let d = tempfile::tempdir().unwrap();
        let a = d.path().join("a");
        std::fs::create_dir(&a).unwrap();
        let open = |p: &Path| std::fs::File::open(p).ok().map(std::os::fd::OwnedFd::from);
        let s = UnixScope::new(7, &[a.clone(), d.path().join("missing"), a.clone()], &open);
        use std::os::unix::fs::MetadataExt as _;
        let m = std::fs::metadata(&a).unwrap();
        assert_eq!(
            s.dirs,
            vec![UnixDir {
                path: a.clone(),
                dev: kernel_dev(m.dev()),
                ino: m.ino()
            }]
        );
        assert_eq!(s.notes.len(), 1);
        assert!(s.notes[0].contains("missing"), "{:?}", s.notes);
        assert_eq!(
            s.keys(42),
            vec![UnixDirKey {
                cgroup_id: 42,
                ino: m.ino(),
                dev: kernel_dev(m.dev()),
                pad: 0
            }]
        );
        assert!(s.describe().contains(&a.display().to_string()));
        assert_eq!(s.subtree, 7);
    }
}
