//! Who is on the other end of an accepted socket, from the kernel only (invariant 3).
//!
//! The rule: the peer's process must sit in the agent's cgroup or below it. "The agent's cgroup"
//! here is its process leaf `agents/<tenant>/<name>/main` (`AgentRef::cgroup`): the agent's tool
//! processes and MCP servers run beside it in `agents/<tenant>/<name>/tools/…`, under the same
//! budgets and uid, and are refused on the agent's socket like any other process. The steps, in
//! an order that a recycled PID cannot fool:
//!
//! 1. `SO_PEERCRED` gives the pid/uid/gid the kernel recorded at `connect()`.
//! 2. `SO_PEERPIDFD` (Linux 6.5) gives a pidfd for that same process, taken by the kernel at
//!    `connect()`: it can never point at a later process that reused the PID.
//! 3. `/proc/<pid>/cgroup` (the `0::` line) names the peer's cgroup; it must be the agent's
//!    cgroup or a descendant of it.
//! 4. Then the pidfd confirms that what we read was about the connecting process: with
//!    `PIDFD_GET_INFO` + `PIDFD_INFO_CGROUPID` (Linux 6.13) the pidfd's live cgroup id must equal
//!    the inode of the directory we read in step 3; without that ioctl, the pidfd must still
//!    refer to a live (unreaped) process — a PID cannot be reused before its process is reaped,
//!    so `/proc/<pid>` read in step 3 was the connecting process.
//!
//! Fallback before 6.5 (no `SO_PEERPIDFD`): `pidfd_open(pid)` after accept. That leaves a window
//! in which the connecting process exits and its PID is recycled before we open the pidfd; it is
//! logged once as a degraded mode. agentosd's kernels (6.18 host, 7.x VM) never take it.

use std::fs;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use nix::sys::socket::{getsockopt, sockopt};

use super::AgentRef;

/// What the kernel says about a peer that passed the identity rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub pid: Option<u32>,
    pub uid: u32,
    pub gid: u32,
    /// The peer's cgroup as `/proc/PID/cgroup` showed it.
    pub cgroup: String,
}

impl Identity {
    /// This identified peer refused for `reason` (a limit, not its identity).
    pub fn refused(self, reason: String) -> Refused {
        Refused {
            pid: self.pid,
            uid: self.uid,
            cgroup: Some(self.cgroup),
            reason,
        }
    }
}

/// Why a peer was refused, with what we learnt about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub pid: Option<u32>,
    pub uid: u32,
    pub cgroup: Option<String>,
    pub reason: String,
}

/// The cgroup v2 path in the text of `/proc/PID/cgroup` (its `0::` line).
pub fn parse_proc_cgroup(text: &str) -> Option<&str> {
    text.lines().find_map(|l| l.strip_prefix("0::"))
}

/// `peer` relative to `agent` when `peer` is `agent` (`Some("")`) or below it (`Some("a/b")`).
/// Paths are compared component-wise: `/x/ag` does not contain `/x/agent2`.
pub fn relative_to<'a>(agent: &str, peer: &'a str) -> Option<&'a str> {
    let agent = agent.trim_end_matches('/');
    if agent.is_empty() {
        // The agent's cgroup is the root: everything is below it. Never the case for agents,
        // but stay exact.
        return Some(peer.trim_start_matches('/'));
    }
    let rest = peer.strip_prefix(agent)?;
    if rest.is_empty() {
        Some("")
    } else {
        rest.strip_prefix('/')
    }
}

static WARNED_NO_PEERPIDFD: AtomicBool = AtomicBool::new(false);

/// Apply the identity rule to an accepted connection of `agent`.
pub fn identify(sock: BorrowedFd<'_>, agent: &AgentRef) -> Result<Identity, Refused> {
    let cred = getsockopt(&sock, sockopt::PeerCredentials).map_err(|e| Refused {
        pid: None,
        uid: u32::MAX,
        cgroup: None,
        reason: format!("getsockopt(SO_PEERCRED) failed: {e}"),
    })?;
    let uid = cred.uid();
    let gid = cred.gid();
    if cred.pid() <= 0 {
        return Err(Refused {
            pid: None,
            uid,
            cgroup: None,
            reason: "the peer's pid is not visible in agentosd's pid namespace".into(),
        });
    }
    let pid = cred.pid() as u32;
    let refuse = |cgroup: Option<String>, reason: String| Refused {
        pid: Some(pid),
        uid,
        cgroup,
        reason,
    };
    let pidfd = peer_pidfd(sock, pid).map_err(|e| refuse(None, e))?;
    let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).map_err(|e| {
        refuse(
            None,
            format!("cannot read /proc/{pid}/cgroup (peer exited?): {e}"),
        )
    })?;
    let Some(cgroup) = parse_proc_cgroup(&text).map(str::to_string) else {
        return Err(refuse(
            None,
            format!("/proc/{pid}/cgroup has no cgroup v2 (0::) line"),
        ));
    };
    let agent_cg = agent.cgroup.to_string_lossy();
    let Some(rel) = relative_to(&agent_cg, &cgroup) else {
        return Err(refuse(
            Some(cgroup.clone()),
            format!("peer is in cgroup {cgroup}, not in the agent's cgroup {agent_cg} or below it"),
        ));
    };
    // Step 4: bind what /proc said to the process that connected.
    match crate::sys::pidfd::pidfd_cgroup_id(pidfd.as_fd()) {
        Ok(id) => {
            let dir = if rel.is_empty() {
                agent.cgroup_dir.clone()
            } else {
                agent.cgroup_dir.join(rel)
            };
            let ino = cgroup_id(&dir).map_err(|e| {
                refuse(
                    Some(cgroup.clone()),
                    format!("cannot stat cgroup directory {}: {e}", dir.display()),
                )
            })?;
            if ino != id {
                return Err(refuse(
                    Some(cgroup.clone()),
                    format!(
                        "the connecting process's cgroup id {id} is not that of {} ({ino}): it moved or its pid was reused",
                        dir.display()
                    ),
                ));
            }
        }
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {
            return Err(refuse(
                Some(cgroup),
                "peer exited before its identity could be confirmed".into(),
            ));
        }
        Err(_) => {
            // No PIDFD_GET_INFO (before 6.13): liveness of the pidfd's process is enough.
            if let Err(e) = crate::sys::pidfd_send_signal(pidfd.as_fd(), 0) {
                return Err(refuse(
                    Some(cgroup),
                    format!("peer exited before its identity could be confirmed: {e}"),
                ));
            }
        }
    }
    Ok(Identity {
        pid: Some(pid),
        uid,
        gid,
        cgroup,
    })
}

/// The connecting process's pidfd: `SO_PEERPIDFD`, else (before 6.5) `pidfd_open(pid)`.
fn peer_pidfd(sock: BorrowedFd<'_>, pid: u32) -> Result<OwnedFd, String> {
    match getsockopt(&sock, sockopt::PeerPidfd) {
        Ok(fd) => Ok(fd),
        Err(nix::errno::Errno::ENOPROTOOPT) | Err(nix::errno::Errno::EINVAL) => {
            if !WARNED_NO_PEERPIDFD.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "SO_PEERPIDFD is not supported by this kernel (needs Linux 6.5): peer identity \
                     falls back to pidfd_open(pid), which a PID recycled during accept could fool"
                );
            }
            crate::sys::pidfd_open(pid).map_err(|e| e.to_string())
        }
        Err(e) => Err(format!("getsockopt(SO_PEERPIDFD) failed: {e}")),
    }
}

/// The cgroup id (directory inode) of a cgroup directory.
pub fn cgroup_id(dir: &Path) -> io::Result<u64> {
    fs::metadata(dir).map(|m| m.ino())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_v2_line_of_proc_cgroup() {
        let hybrid = "9:name=systemd:/\n4:memory:/x\n0::/agentos/agents/acme/bot\n";
        assert_eq!(parse_proc_cgroup(hybrid), Some("/agentos/agents/acme/bot"));
        assert_eq!(parse_proc_cgroup("0::/\n"), Some("/"));
        assert_eq!(parse_proc_cgroup("4:memory:/x\n"), None);
    }

    #[test]
    fn relative_to_is_component_wise() {
        let a = "/agentos/agents/acme/bot";
        assert_eq!(relative_to(a, "/agentos/agents/acme/bot"), Some(""));
        assert_eq!(relative_to("/agentos/agents/acme/bot/", a), Some(""));
        assert_eq!(
            relative_to(a, "/agentos/agents/acme/bot/tools/t1"),
            Some("tools/t1")
        );
        assert_eq!(relative_to(a, "/agentos/agents/acme/bot2"), None);
        assert_eq!(relative_to(a, "/agentos/agents/acme"), None);
        assert_eq!(relative_to(a, "/"), None);
        assert_eq!(relative_to(a, "/other"), None);
    }

    #[test]
    fn own_pidfd_reports_own_cgroup_id_or_is_unsupported() {
        let me = crate::sys::pidfd_open(std::process::id()).expect("pidfd_open(self)");
        let Some(mount) = crate::cgroup::cgroup2_mount() else {
            return;
        };
        let Some(cg) = crate::cgroup::proc_cgroup("self") else {
            return;
        };
        match crate::sys::pidfd::pidfd_cgroup_id(me.as_fd()) {
            Ok(id) => {
                let dir = mount.join(cg.trim_start_matches('/'));
                assert_eq!(id, cgroup_id(&dir).expect("stat own cgroup"));
            }
            Err(e) => eprintln!("PIDFD_GET_INFO unsupported here: {e}"),
        }
    }
}
