//! The sandbox every agent runs in, built from its contract's capabilities: its own uid/gid,
//! no capabilities (bounding set included), `no_new_privs`, a Landlock ruleset, and a seccomp
//! deny-list. Everything that can fail or allocate happens here in the daemon before the clone;
//! [`PreparedSandbox::apply_in_child`] only makes async-signal-safe system calls between clone
//! and exec, and reports the failing stage and errno through spawn's exec-status pipe.
//! The model is described in docs/security.md.

pub mod bounding;
pub mod identity;
pub mod landlock;
pub mod netns_pool;
pub mod path_cache;
pub mod path_watch;
pub mod ruleset_pool;
pub mod seccomp;
pub mod sockets;

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use contracts::{Contract, Mechanism};

use crate::sys::{self, creds};

/// First child stage number used by the sandbox (spawn.rs uses 1-4 and reports these through
/// [`stage_name`]).
pub const STAGE_SETGROUPS: i32 = 10;
pub const STAGE_SETRESGID: i32 = 11;
pub const STAGE_CAPBSET: i32 = 12;
pub const STAGE_SETRESUID: i32 = 13;
pub const STAGE_CAPSET: i32 = 14;
pub const STAGE_NO_NEW_PRIVS: i32 = 15;
pub const STAGE_LANDLOCK: i32 = 16;
pub const STAGE_SECCOMP: i32 = 17;
pub const STAGE_NETNS: i32 = 18;
pub const STAGE_IPCNS: i32 = 20;

/// What a child stage number means, for the error that reaches `agentctl`.
pub fn stage_name(stage: i32) -> Option<&'static str> {
    Some(match stage {
        STAGE_SETGROUPS => "sandbox: setgroups(0) for",
        STAGE_SETRESGID => "sandbox: setresgid for",
        STAGE_CAPBSET => "sandbox: prctl(PR_CAPBSET_DROP) for",
        STAGE_SETRESUID => "sandbox: setresuid for",
        STAGE_CAPSET => "sandbox: capset(0) for",
        STAGE_NO_NEW_PRIVS => "sandbox: prctl(PR_SET_NO_NEW_PRIVS) for",
        STAGE_LANDLOCK => "sandbox: landlock_restrict_self for",
        STAGE_SECCOMP => "sandbox: seccomp(SECCOMP_SET_MODE_FILTER) for",
        STAGE_NETNS => "sandbox: setns(CLONE_NEWNET) into the network namespace made ahead for",
        STAGE_IPCNS => "sandbox: setns(CLONE_NEWIPC) into the IPC namespace made ahead for",
        sockets::STAGE_BROKER => "sandbox: seccomp user notification (the socket broker) for",
        _ => return None,
    })
}

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error(transparent)]
    Identity(#[from] identity::IdentityError),
    #[error(transparent)]
    Landlock(#[from] landlock::LandlockError),
    #[error(transparent)]
    Seccomp(#[from] seccomp::SeccompError),
    /// A `must` needs something this kernel cannot enforce: the agent is refused.
    #[error("{0}")]
    Unenforceable(String),
}

/// What the contract grants, with `{state}` expanded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grants {
    pub fs_read: Vec<PathBuf>,
    pub fs_write: Vec<PathBuf>,
    pub fs_exec: Vec<PathBuf>,
    pub net_connect: Vec<String>,
    pub net_bind: Vec<String>,
    pub must_landlock: bool,
    pub must_seccomp: bool,
}

impl Grants {
    pub fn from_contract(c: &Contract, home: &Path) -> Grants {
        let mut g = Grants::default();
        for cap in c.capabilities() {
            let scope = cap.expand_scope(home);
            match cap.name.as_str() {
                "fs.read" => g.fs_read.extend(scope.into_iter().map(PathBuf::from)),
                "fs.write" => g.fs_write.extend(scope.into_iter().map(PathBuf::from)),
                "fs.exec" => g.fs_exec.extend(scope.into_iter().map(PathBuf::from)),
                "net.connect" => g.net_connect.extend(scope),
                "net.bind" => g.net_bind.extend(scope),
                _ => {}
            }
        }
        let m = &c.must().mechanisms;
        g.must_landlock = m.contains(&Mechanism::Landlock);
        g.must_seccomp = m.contains(&Mechanism::Seccomp);
        g
    }

    /// The Landlock plan: the baseline (docs/security.md) plus the grants, plus `home`.
    pub fn plan(&self, home: &Path) -> Result<landlock::Plan, landlock::LandlockError> {
        let p = |v: &[&str]| v.iter().map(PathBuf::from).collect::<Vec<_>>();
        let mut plan = landlock::Plan {
            read: p(landlock::BASE_READ),
            read_exec: p(landlock::BASE_READ_EXEC),
            read_write: p(landlock::BASE_READ_WRITE_FILES),
            // TCP DNS to any address (port 53) goes to the daemon's stub: Landlock sees 53.
            connect: landlock::ports(&self.net_connect)?.map(|mut v| {
                if !self.net_connect.is_empty() {
                    v.push(crate::dns::PORT);
                    v.sort_unstable();
                    v.dedup();
                }
                v
            }),
            bind: landlock::ports(&self.net_bind)?,
            unix: Vec::new(),
            unscoped: false,
        };
        plan.read.extend(self.fs_read.iter().cloned());
        plan.read_exec.extend(self.fs_exec.iter().cloned());
        plan.read_write.push(home.to_path_buf());
        plan.read_write.extend(self.fs_write.iter().cloned());
        Ok(plan)
    }
}

/// Everything the child applies, prepared in the daemon.
#[derive(Debug)]
pub struct PreparedSandbox {
    pub uid: u32,
    pub gid: u32,
    pub home: PathBuf,
    /// The filled Landlock ruleset (O_CLOEXEC); `None` when the kernel has no Landlock.
    pub landlock: Option<OwnedFd>,
    /// `landlock` was built ahead of this start and checked at its take ([`ruleset_pool`]).
    pub landlock_pooled: bool,
    /// seccomp programs, installed in order.
    pub seccomp: Vec<Vec<libc::sock_filter>>,
    /// Gaps the operator should know about (shown by `agentctl status`).
    pub notes: Vec<String>,
    /// The highest capability number the kernel knows (`/proc/sys/kernel/cap_last_cap`): the
    /// child drops 0..=last_cap from its bounding set.
    pub last_cap: u32,
    /// Kernel namespaces the child gets of its own (clone3 flags, spawn.rs).
    pub namespaces: Namespaces,
    /// The network namespace the child joins (`setns`) instead of making one: the one the
    /// daemon made for it with the model gateway's port on its loopback (models/tcp.rs), or a
    /// fresh one made ahead of the start ([`netns_pool`]).
    pub netns: Option<OwnedFd>,
    /// The IPC namespace made for it ahead of the start ([`netns_pool`]), joined with `setns`
    /// instead of `CLONE_NEWIPC` in `clone3`; `None`: made by `clone3`.
    pub ipcns: Option<OwnedFd>,
    /// The socket broker's notifying filter ([`sockets::notify_filter`]), installed last, when
    /// `namespaces.brokered()`.
    pub notify: Vec<libc::sock_filter>,
}

/// Kernel namespaces an agent gets of its own, created by `clone3` (the daemon is root; the
/// agent itself can make none: `unshare`/`setns` need capabilities it does not have).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Namespaces {
    /// A private IPC namespace (`CLONE_NEWIPC`): SysV shared memory, semaphores and message
    /// queues and POSIX message queues reach no other agent and no host process.
    pub ipc: bool,
    /// A private network namespace (`CLONE_NEWNET`) whose only interface, the loopback, stays
    /// down. Abstract Unix socket names are per network namespace, so the agent neither reaches
    /// the host's (D-Bus, X11, systemd's) nor offers one to host processes (squatting a name a
    /// host service uses), with or without the daemon running.
    pub net: bool,
    /// With `net`: the agent's inet and route-netlink sockets are made in the host's network
    /// namespace by its socket broker ([`sockets`]), for an agent with `net.connect` or
    /// `net.bind` (the host's network is what those grants are for).
    pub broker: bool,
}

impl Namespaces {
    /// What an agent with these grants gets: always its own IPC and network namespaces; the
    /// socket broker when the contract grants `net.connect` or `net.bind`.
    pub fn for_grants(g: &Grants) -> Namespaces {
        Namespaces {
            ipc: true,
            net: true,
            broker: !g.net_connect.is_empty() || !g.net_bind.is_empty(),
        }
    }

    /// Whether the spawned child hands a socket broker its listener.
    pub fn brokered(&self) -> bool {
        self.net && self.broker
    }
}

/// `/proc/sys/kernel/cap_last_cap`, read once; 63 (every possible bit) when unreadable.
pub fn cap_last_cap() -> u32 {
    static LAST: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *LAST.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .filter(|n| *n < 64)
            .unwrap_or(63)
    })
}

/// Build the sandbox for agent `tenant/name` in the daemon's `state_dir`. A `must` the
/// kernel cannot meet is [`SandboxError::Unenforceable`].
pub fn prepare(
    state_dir: &Path,
    tenant: &str,
    name: &str,
    contract: Option<&Contract>,
) -> Result<PreparedSandbox, SandboxError> {
    prepare_with(state_dir, tenant, name, contract, Gateway::default())
}

/// Where the model gateway waits for an agent over TCP (models/tcp.rs, models/peer_tcp.rs).
#[derive(Debug, Default)]
pub struct Gateway {
    /// The network namespace made for an agent without network grants, the gateway listening
    /// on its loopback.
    pub netns: Option<OwnedFd>,
    /// The gateway's port on the host's loopback, for an agent with network grants.
    pub host_port: Option<u16>,
    /// Where the daemon's Unix sockets for the agent are (`RUN_DIR/agents/<tenant>`: its MCP
    /// and model sockets): the only pathname Unix sockets it may connect to besides its own
    /// (Landlock `RESOLVE_UNIX`, ABI 9). The daemon checks every peer there by its cgroup.
    pub unix_dirs: Vec<PathBuf>,
}

/// [`prepare`] for an agent the model gateway serves on a loopback port. `gateway.netns` is the
/// network namespace the daemon made with the gateway listening in it (models/tcp.rs): an agent
/// with its own network namespace (no network grants) joins it, and may make inet stream sockets
/// and connect to that port (seccomp, Landlock); one with grants stays in the host's and the
/// namespace is dropped. `gateway.host_port`: the port on the host's loopback an agent with
/// grants may connect to besides them (Landlock).
pub fn prepare_with(
    state_dir: &Path,
    tenant: &str,
    name: &str,
    contract: Option<&Contract>,
    gateway: Gateway,
) -> Result<PreparedSandbox, SandboxError> {
    let id = format!("{tenant}/{name}");
    let home = identity::home_dir(state_dir, tenant, name);
    let grants = contract
        .map(|c| Grants::from_contract(c, &home))
        .unwrap_or_default();
    let uid = identity::uid_for(state_dir, &id)?;
    // The home as the daemon opened it (no link followed): its rules and its `{state}` scopes
    // are opened beneath this fd.
    let home_dir = identity::make_home(state_dir, tenant, name, uid)?;
    let mut notes = Vec::new();
    let abi = landlock::kernel_abi();
    let namespaces = Namespaces::for_grants(&grants);
    // The gateway's namespace decides what the agent may do (an inet socket to its port); a
    // pooled one (below) is only where its own namespace was made beforehand.
    let gateway_ns = gateway.netns.filter(|_| !namespaces.broker);
    let mut plan = grants.plan(&home)?;
    plan.unix = gateway.unix_dirs;
    if let Some(ports) = plan.connect.as_mut() {
        if gateway_ns.is_some() {
            ports.push(crate::models::tcp::TCP_PORT);
        }
        if namespaces.broker {
            ports.extend(gateway.host_port);
        }
    }
    let mut landlock_pooled = false;
    let lock = match abi {
        None if grants.must_landlock => {
            return Err(SandboxError::Unenforceable(format!(
                "agent {id} requires landlock (must) but this kernel has no Landlock (run `agentosd check`)"
            )));
        }
        None => {
            notes.push("landlock: not available, filesystem and TCP grants not enforced".into());
            None
        }
        Some(v) => {
            if v < 4 && (plan.connect.is_some() || plan.bind.is_some()) {
                if grants.must_landlock {
                    return Err(SandboxError::Unenforceable(format!(
                        "agent {id} requires landlock (must) with TCP rules, but the kernel's Landlock ABI {v} has none (needs 4)"
                    )));
                }
                notes.push(format!("landlock ABI {v}: TCP port rules not enforced"));
            }
            if v < 6 {
                notes.push(format!(
                    "landlock ABI {v}: signal and abstract-socket scoping not enforced"
                ));
            }
            if !landlock::resolve_unix(Some(v)) {
                notes.push(format!(
                    "landlock ABI {v}: the host's pathname Unix sockets (D-Bus system bus, journald) not confined by Landlock (needs ABI {}, Linux 7.1; see the unix sockets (BPF LSM) note)",
                    landlock::RESOLVE_UNIX_ABI
                ));
            } else if !landlock::landlock_handles_unix(Some(v)) {
                notes.push(format!(
                    "landlock ABI {v}: pathname Unix sockets left to BPF LSM (--no-landlock-unix)"
                ));
            }
            let mut system = landlock::Opener::new(Vec::new()).system;
            // The daemon's socket directories are root's (made by it, 0711, no link).
            system.extend(plan.unix.iter().cloned());
            // The ruleset built ahead for this agent when it still holds, else built now; the
            // next one is built after this start (ruleset_pool.rs).
            let pool = ruleset_pool::RulesetPool::global();
            let (fd, pooled) = pool
                .ruleset(&id, uid, &plan, grants.must_landlock, home_dir, system)
                .map_err(|e| {
                    if grants.must_landlock && !matches!(e, landlock::LandlockError::Path { .. }) {
                        SandboxError::Unenforceable(format!(
                            "agent {id} requires landlock (must): {e}"
                        ))
                    } else {
                        e.into()
                    }
                })?;
            landlock_pooled = pooled;
            notes.push(format!("landlock ABI {v}"));
            fd
        }
    };
    if !grants.net_connect.is_empty() || !grants.net_bind.is_empty() {
        notes.push("net: Landlock filters TCP ports only, not hosts or UDP".into());
        notes.push(
            "net: own network namespace; inet and route-netlink sockets made in the host's by its socket broker (abstract Unix socket names stay its own)"
                .into(),
        );
    }
    // Socket rules per contract: inet sockets only with a network grant (or the gateway's
    // port in the agent's own namespace), listen() only with net.bind (seccomp/).
    let seccomp = seccomp::compiled_for(seccomp::NetShape::for_grants(
        !grants.net_connect.is_empty() || gateway_ns.is_some(),
        !grants.net_bind.is_empty(),
    ))?;
    if gateway_ns.is_some() {
        notes.push(format!(
            "net: own network namespace; the model gateway on 127.0.0.1:{} is the only place it can connect to",
            crate::models::tcp::TCP_PORT
        ));
    }
    Ok(PreparedSandbox {
        uid,
        gid: uid,
        home,
        landlock: lock,
        landlock_pooled,
        seccomp,
        notes,
        last_cap: cap_last_cap(),
        namespaces,
        netns: gateway_ns.or_else(|| {
            if namespaces.net {
                netns_pool::take()
            } else {
                None
            }
        }),
        ipcns: if namespaces.ipc {
            netns_pool::take_ipc()
        } else {
            None
        },
        notify: if namespaces.brokered() {
            sockets::notify_filter()
        } else {
            Vec::new()
        },
    })
}

impl PreparedSandbox {
    /// Apply everything in the freshly cloned child. Only async-signal-safe system calls on
    /// memory prepared before the clone: no allocation, no locks. Returns the failing stage;
    /// the errno is left in `errno` for the caller to report.
    ///
    /// The credential calls are raw per-thread system calls (`sys::creds` says why not glibc's).
    ///
    /// Order: groups and gid first (needs CAP_SETGID), then the bounding set (needs
    /// CAP_SETPCAP, gone after setuid), then the uid (which clears permitted/effective), then
    /// an explicit capset(0) and ambient clear, `no_new_privs`, Landlock, and seccomp last so
    /// that the filter never sees the daemon's own setup calls. execve stays allowed.
    ///
    /// # Safety
    /// Call only in a child between clone and execve.
    ///
    /// `bounding_set_empty`: the spawning thread's bounding set is empty already
    /// ([`bounding::this_thread_is_empty`], read before the clone), so the child inherited it
    /// empty and skips its `PR_CAPBSET_DROP` loop.
    pub unsafe fn apply_in_child(&self, bounding_set_empty: bool) -> Result<(), i32> {
        // SAFETY: plain system calls on values and on buffers owned by `self`, which the
        // child's copy of the address space keeps alive until execve.
        unsafe {
            // Into the namespace made for it, while it still has CAP_SYS_ADMIN (`namespaces.net`
            // is the one switch: without it the child stays in the daemon's namespace).
            if self.namespaces.net
                && let Some(ns) = &self.netns
                && libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) != 0
            {
                return Err(STAGE_NETNS);
            }
            if self.namespaces.ipc
                && let Some(ns) = &self.ipcns
                && libc::setns(ns.as_raw_fd(), libc::CLONE_NEWIPC) != 0
            {
                return Err(STAGE_IPCNS);
            }
            if creds::drop_groups() != 0 {
                return Err(STAGE_SETGROUPS);
            }
            if creds::set_gid(self.gid) != 0 {
                return Err(STAGE_SETRESGID);
            }
            libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_CLEAR_ALL,
                0,
                0,
                0,
            );
            if !bounding_set_empty {
                for cap in 0..=self.last_cap {
                    if libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) != 0
                        && *libc::__errno_location() != libc::EINVAL
                    {
                        return Err(STAGE_CAPBSET);
                    }
                }
            }
            if creds::set_uid(self.uid) != 0 {
                return Err(STAGE_SETRESUID);
            }
            if creds::clear_caps() != 0 {
                return Err(STAGE_CAPSET);
            }
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return Err(STAGE_NO_NEW_PRIVS);
            }
            if let Some(fd) = &self.landlock
                && sys::landlock::restrict_self(fd.as_raw_fd(), landlock::restrict_flags()) != 0
            {
                return Err(STAGE_LANDLOCK);
            }
            for (i, prog) in self.seccomp.iter().enumerate() {
                // The first program is the deny-list (`seccomp::FILTERS[0]`): its EPERMs are
                // logged. Not the others: `clone3` → ENOSYS happens at every fork.
                let flags = if i == 0 {
                    sys::seccomp::SECCOMP_FILTER_FLAG_LOG
                } else {
                    0
                };
                let fprog = libc::sock_fprog {
                    len: prog.len() as u16,
                    filter: prog.as_ptr() as *mut libc::sock_filter,
                };
                if sys::seccomp::set_mode_filter(flags, &fprog) != 0 {
                    return Err(STAGE_SECCOMP);
                }
            }
        }
        Ok(())
    }

    /// Environment the agent gets from its sandbox: its state directory and private tmp.
    pub fn env(&self) -> Vec<(String, String)> {
        let h = self.home.display().to_string();
        vec![
            ("HOME".into(), h.clone()),
            ("STATE_DIRECTORY".into(), h.clone()),
            ("TMPDIR".into(), format!("{h}/tmp")),
        ]
    }
}

#[cfg(test)]
mod tests;
