//! The filesystem programs' bpffs pins (`ROOT/fs-CGID`, next to the network programs'
//! `ROOT/net-CGID`, [`crate::enforce::pins`]): while agentosd is down or restarting the BPF LSM
//! programs stay attached with the agents' scopes, the pathname Unix socket fence, the
//! executable-mapping and abstract-bind checks, and their denials wait in the pinned ring buffer
//! for the next daemon.
//!
//! The next daemon loads its programs onto the pinned maps (same layout), attaches them and pins
//! its links under a new generation. The previous daemon's links stay until the agents are
//! re-adopted ([`FsEnforcer::adopted`]): each re-adopted agent's entries are installed again
//! (the per-agent key lists rebuilt), the entries of agents that are gone or of scopes that
//! changed are removed, and only then do the old links (and maps of another layout) go. With a
//! new layout the old programs thus keep enforcing on their own maps until the new ones are full.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use super::{FsEnforcer, FsError, OPTIONAL, PROGRAMS, lock};
use crate::enforce::pins::{PinKind, Pins};

/// The filesystem programs' pins. Bump the layout when a pinned map's key, value or size
/// changes in `ebpf/intf.h` or `ebpf/fs.bpf.c` (`struct agentos_fs_key`, `agentos_unix_dir_key`,
/// `AGENTOS_MAX_AGENTS`, `AGENTOS_FS_MAX_PREFIXES`, `AGENTOS_FS_MAX_UNIX_DIRS`, the ring size).
pub const PIN_KIND: PinKind = PinKind {
    prefix: "fs",
    layout: "maps-v1",
    what: "filesystem",
};

/// Maps kept across daemons: the policy maps (so the programs keep enforcing the agents' scopes
/// while the daemon is down), the counters and the ring buffer (denials while the daemon was
/// down are read by the next one). Not `fs_scratch` (per-CPU scratch space of each program set).
pub(super) const PINNED_MAPS: [&str; 6] = [
    "fs_agents",
    "fs_prefixes",
    "fs_unix_agents",
    "fs_unix_dirs",
    "fs_stats",
    "fs_events",
];

/// What of the previous daemon's pins goes once the agents are re-adopted.
#[derive(Debug, Default)]
pub(super) enum Retire {
    #[default]
    Nothing,
    /// Its links (this daemon's are pinned under `generation`) and maps of another layout.
    Links {
        generation: u64,
        old: Vec<(String, String, u64)>,
    },
    /// All of its pins: this daemon could not use them and runs unpinned.
    Dir(Pins),
}

impl FsEnforcer {
    /// Where the links and maps are pinned, if they are.
    pub fn pins(&self) -> Option<&Pins> {
        self.pins.as_ref()
    }

    /// Once the running agents are re-adopted (each one's entries installed again): remove the
    /// entries a previous daemon left in the pinned maps for agents that are gone and for scopes
    /// that changed, then the previous daemon's pins. Returns how many entries went.
    pub fn adopted(&self) -> usize {
        let gone = self.forget_stale();
        if gone > 0 {
            tracing::info!(
                "BPF LSM filesystem maps: removed {gone} entries of agents that ended while the daemon was down (or of scopes that changed)"
            );
        }
        match std::mem::take(&mut *lock(&self.retire)) {
            Retire::Nothing => {}
            Retire::Links { generation, old } => {
                if let Some(p) = &self.pins {
                    p.retire(generation, &old);
                }
            }
            Retire::Dir(p) => {
                if let Err(e) = p.remove() {
                    tracing::warn!("removing the BPF pins {}: {e}", p.dir.display());
                }
            }
        }
        gone
    }

    /// Remove every entry of the maps that belongs to no agent this daemon installed, or that
    /// its policy no longer has: the gone agents' entries first, then the keys.
    fn forget_stale(&self) -> usize {
        let mut maps = lock(&self.maps);
        let live = self.agents.live_cgroups();
        let keys: HashSet<_> = lock(&self.keys)
            .values()
            .flatten()
            .map(|k| (k.prefix_len(), k.data().cgroup_id, k.data().path))
            .collect();
        let unix_keys: HashSet<super::UnixDirKey> =
            lock(&self.unix_keys).values().flatten().copied().collect();
        let mut n = 0;
        let agents: Vec<u64> = maps.agents.keys().flatten().collect();
        for cg in agents.iter().filter(|c| !live.contains(c)) {
            n += usize::from(maps.agents.remove(cg).is_ok());
        }
        let unix_agents: Vec<u64> = maps.unix_agents.keys().flatten().collect();
        for cg in unix_agents.iter().filter(|c| !live.contains(c)) {
            n += usize::from(maps.unix_agents.remove(cg).is_ok());
        }
        let prefixes: Vec<_> = maps.prefixes.keys().flatten().collect();
        for k in prefixes {
            if !keys.contains(&(k.prefix_len(), k.data().cgroup_id, k.data().path)) {
                n += usize::from(maps.prefixes.remove(&k).is_ok());
            }
        }
        let dirs: Vec<super::UnixDirKey> = maps.unix_dirs.keys().flatten().collect();
        for k in dirs.iter().filter(|k| !unix_keys.contains(k)) {
            n += usize::from(maps.unix_dirs.remove(k).is_ok());
        }
        n
    }

    /// Remove every pin (the links detach, the maps go with the last program): for a daemon
    /// that stops its agents on exit.
    pub fn unpin(&self) {
        let Some(pins) = &self.pins else { return };
        lock(&self.pinned).clear();
        if let Err(e) = std::fs::remove_dir_all(&pins.dir) {
            tracing::warn!("removing the BPF pins {}: {e}", pins.dir.display());
        }
    }
}

/// The required programs' hooks, for the logs.
pub(super) fn hooks() -> String {
    PROGRAMS
        .iter()
        .map(|(_, h)| format!("lsm/{h}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Load and attach the programs for the daemon, pinned under `pin_root` (taking over those a
/// previous daemon pinned for `agents`) when given, saying what is active: `Ok` with the
/// enforcer, or `Err` with why not (the daemon then relies on Landlock for filesystem scopes).
pub fn setup(agents: &Path, pin_root: Option<&Path>) -> Result<Arc<FsEnforcer>, String> {
    let hooks = hooks();
    match load_attach(agents, pin_root) {
        Ok(f) => {
            tracing::info!(
                "BPF LSM: {hooks} attached (agents' filesystem scopes, defence in depth behind Landlock){}",
                match f.pins() {
                    Some(p) => format!(", links and maps pinned in {}", p.dir.display()),
                    None => ", NOT pinned: detached while agentosd is down or restarting".into(),
                }
            );
            for o in OPTIONAL {
                match f.optional_status(o.hook) {
                    Ok(()) => tracing::info!("BPF LSM: lsm/{} attached ({})", o.hook, o.does),
                    Err(e) => {
                        tracing::warn!("BPF LSM: lsm/{} not active: {e}; {}", o.hook, o.without)
                    }
                }
            }
            Ok(f)
        }
        Err(e) => {
            tracing::warn!(
                "BPF LSM: {hooks} not active: {e}; filesystem scopes are enforced by Landlock alone"
            );
            Err(e.to_string())
        }
    }
}

fn load_attach(agents: &Path, pin_root: Option<&Path>) -> Result<Arc<FsEnforcer>, FsError> {
    let unpinned = || FsEnforcer::load().and_then(|f| f.attach().map(|()| f));
    let pins = match pin_root {
        None => {
            tracing::warn!(
                "BPF LSM filesystem programs: pinning off (--bpf-pin-dir none): they detach while agentosd is down"
            );
            return unpinned();
        }
        Some(root) => match Pins::prepare(root, agents, PIN_KIND) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(
                    "BPF LSM filesystem programs: {e}; NOT pinned: they detach while agentosd is down or restarting"
                );
                return unpinned();
            }
        },
    };
    let r = match FsEnforcer::load_pinned(Some(pins.clone())).and_then(|f| f.attach().map(|()| f)) {
        Ok(f) => return Ok(f),
        // Nothing loads here at all (not built, BPF LSM refused): no second try.
        Err(e @ FsError::NotBuilt) => Err(e),
        Err(e) if e.to_string().contains("refused (EPERM)") => Err(e),
        Err(e) => {
            tracing::warn!(
                "BPF LSM filesystem programs: loading onto the pinned maps in {} failed ({e}); loading unpinned",
                pins.dir.display()
            );
            unpinned().inspect(|f| {
                // The pinned programs, whose maps this daemon does not fill, go once the agents'
                // entries are in this daemon's maps: until then they enforce.
                *lock(&f.retire) = Retire::Dir(pins.clone());
            })
        }
    };
    // Pins with no link (maps made for programs that did not load) guard nothing.
    if r.is_err() && pins.links().is_empty() {
        let _ = pins.remove();
    }
    r
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn pinned_maps_exist_in_the_object_and_scratch_is_not_shared() {
        assert!(!PINNED_MAPS.contains(&"fs_scratch"));
        if !super::super::built() {
            eprintln!("skipped: BPF programs not built");
            return;
        }
        // The names are in the object's symbol table.
        let obj = super::super::FS_OBJ;
        for m in PINNED_MAPS {
            let name = format!("{m}\0");
            assert!(
                obj.windows(name.len()).any(|w| w == name.as_bytes()),
                "{m} not in ebpf/fs.bpf.o"
            );
        }
    }
}
