//! The sandboxing rows: the Landlock ABI, seccomp (modes, actions, user notification), and
//! whether the kernel's audit subsystem records the denials of both.

use nix::errno::Errno;

use super::report::{Check, Feature, Status};
use crate::sys::{landlock, seccomp};

/// What keeps agents from the host's pathname Unix sockets: Landlock's
/// `LANDLOCK_ACCESS_FS_RESOLVE_UNIX` (ABI 9), the BPF LSM fence (`lsm/unix_stream_connect`,
/// `lsm/unix_may_send`, enforce/fs/unix.rs; `bpf`: whether BPF LSM programs load here, or why
/// not), both, or nothing. Without either an agent can connect to every socket whose file mode
/// lets any uid in (the D-Bus system bus, journald's `/dev/log`).
pub(super) fn landlock_unix_row(abi: Option<u32>, bpf: Result<(), String>) -> Check {
    let m = Feature::LandlockUnix;
    let need = crate::sandbox::landlock::RESOLVE_UNIX_ABI;
    let landlock = crate::sandbox::landlock::resolve_unix(abi);
    let abi_text = abi.map_or("no Landlock".to_string(), |v| format!("Landlock ABI {v}"));
    let fence = "agents connect and send only to their own sockets, the daemon's, and those beneath their write grants";
    let bpf_hooks = "BPF LSM lsm/unix_stream_connect + lsm/unix_may_send (see the BPF LSM filesystem programs line)";
    match (landlock, bpf) {
        (true, Ok(())) => Check::new(
            m,
            Status::Available,
            format!("{abi_text} (LANDLOCK_ACCESS_FS_RESOLVE_UNIX) and {bpf_hooks}: {fence}"),
        ),
        (true, Err(why)) => Check::new(
            m,
            Status::Available,
            format!(
                "{abi_text} has LANDLOCK_ACCESS_FS_RESOLVE_UNIX: {fence} (no BPF LSM behind it: {why})"
            ),
        ),
        (false, Ok(())) => Check::new(
            m,
            Status::Available,
            format!(
                "{bpf_hooks}: {fence}; {abi_text} < {need} has no RESOLVE_UNIX (Linux 7.1 adds it)"
            ),
        ),
        (false, Err(why)) => Check::new(
            m,
            Status::Unavailable,
            format!(
                "{abi_text} < {need} and no BPF LSM ({why}): agents can connect to the host's pathname Unix sockets that any uid may write (the D-Bus system bus, journald's /dev/log); Linux 7.1 (Landlock ABI {need}), or BPF LSM (lsm=...,bpf, no lockdown), closes this"
            ),
        ),
    }
}

pub(super) fn probe_landlock() -> (Check, Option<u32>) {
    let m = Feature::Landlock;
    match landlock::abi_version() {
        Ok(abi) => {
            let features = match abi {
                0 => "",
                1..=3 => "filesystem rules",
                4..=5 => "filesystem and TCP bind/connect rules",
                _ => "filesystem, TCP bind/connect rules, signal and abstract-socket scoping",
            };
            (
                Check::new(
                    m,
                    Status::Available,
                    format!(
                        "landlock_create_ruleset(LANDLOCK_CREATE_RULESET_VERSION): ABI {abi} ({features})"
                    ),
                ),
                Some(abi),
            )
        }
        Err(Errno::ENOSYS) => (
            Check::new(
                m,
                Status::Unavailable,
                "landlock_create_ruleset: ENOSYS — kernel built without CONFIG_SECURITY_LANDLOCK",
            ),
            None,
        ),
        Err(Errno::EOPNOTSUPP) => (
            Check::new(
                m,
                Status::Unavailable,
                "landlock_create_ruleset: EOPNOTSUPP — built in but not enabled: add landlock to lsm= on the kernel command line",
            ),
            None,
        ),
        Err(e) => (
            Check::new(m, Status::Error, format!("landlock_create_ruleset: {e:?}")),
            None,
        ),
    }
}

/// Whether Landlock and seccomp denials of agents reach the audit trail: the audit netlink
/// multicast group is readable, the kernel logs Landlock denials (ABI 7, audit enabled) and
/// seccomp errno actions (`actions_logged`).
pub(super) fn probe_kernel_audit() -> Check {
    use crate::enforce::kaudit;
    let m = Feature::KernelAudit;
    if let Err(e) = kaudit::open_readlog() {
        return Check::new(
            m,
            Status::Unavailable,
            format!("{e}: Landlock and seccomp denials of agents are not recorded"),
        );
    }
    let gaps = kaudit::gaps();
    if gaps.is_empty() {
        Check::new(
            m,
            Status::Available,
            "audit netlink readable (AUDIT_NLGRP_READLOG); Landlock (ABI 7, audit enabled) and seccomp (errno in actions_logged) denials are logged",
        )
    } else {
        Check::new(
            m,
            Status::Unavailable,
            format!("audit netlink readable, but {}", gaps.join("; ")),
        )
    }
}

pub(super) fn probe_seccomp(rows: &mut Vec<Check>) {
    let mode = match seccomp::mode() {
        Ok(0) => "this process is not filtered".to_string(),
        Ok(2) => "this process already runs under a seccomp filter".to_string(),
        Ok(n) => format!("PR_GET_SECCOMP = {n}"),
        Err(e) => format!("PR_GET_SECCOMP: {e:?}"),
    };
    let actions = [
        ("errno", seccomp::SECCOMP_RET_ERRNO),
        ("kill_process", seccomp::SECCOMP_RET_KILL_PROCESS),
        ("log", seccomp::SECCOMP_RET_LOG),
    ];
    let mut ok = Vec::new();
    let mut missing = Vec::new();
    let mut fatal = None;
    for (name, action) in actions {
        match seccomp::action_avail(action) {
            Ok(()) => ok.push(name),
            Err(Errno::EOPNOTSUPP) => missing.push(name),
            Err(e) => {
                fatal = Some(e);
                break;
            }
        }
    }
    rows.push(match fatal {
        Some(Errno::ENOSYS | Errno::EINVAL) => Check::new(
            Feature::Seccomp,
            Status::Unavailable,
            format!(
                "seccomp(SECCOMP_GET_ACTION_AVAIL): {:?} — kernel without CONFIG_SECCOMP_FILTER (or older than 4.14)",
                fatal.unwrap_or(Errno::ENOSYS)
            ),
        ),
        Some(e) => Check::new(
            Feature::Seccomp,
            Status::Error,
            format!("seccomp(SECCOMP_GET_ACTION_AVAIL): {e:?}"),
        ),
        None if missing.contains(&"errno") || missing.contains(&"kill_process") => Check::new(
            Feature::Seccomp,
            Status::Unavailable,
            format!("filter actions missing: {}; {mode}", missing.join(", ")),
        ),
        None => Check::new(
            Feature::Seccomp,
            Status::Available,
            format!(
                "filter mode, actions {} available{}; {mode}",
                ok.join(", "),
                if missing.is_empty() { String::new() } else { format!(" ({} missing)", missing.join(", ")) }
            ),
        ),
    });

    rows.push(
        match (
            seccomp::action_avail(seccomp::SECCOMP_RET_USER_NOTIF),
            seccomp::notif_sizes(),
        ) {
            (Ok(()), Ok((n, r, d))) => Check::new(
                Feature::SeccompUserNotif,
                Status::Available,
                format!("SECCOMP_RET_USER_NOTIF available (notif {n} / resp {r} / data {d} bytes): the socket broker of agents with network grants (with SECCOMP_ADDFD_FLAG_SEND, Linux 5.14, as cgroup.kill)"),
            ),
            (Err(e), _) | (_, Err(e)) => Check::new(
                Feature::SeccompUserNotif,
                if matches!(e, Errno::EOPNOTSUPP | Errno::EINVAL | Errno::ENOSYS) {
                    Status::Unavailable
                } else {
                    Status::Error
                },
                format!("SECCOMP_RET_USER_NOTIF: {e:?} (kernel older than 5.0): agents with network grants get no inet sockets (their socket broker needs it)"),
            ),
        },
    );
}

/// The path watch (sandbox/path_watch.rs): kept host paths checked by `lstat` only after a
/// change. Missing, nothing is weaker; every start does the checks.
pub(super) fn probe_path_watch() -> Check {
    match crate::sandbox::path_watch::kernel_support() {
        Ok(note) => Check::new(
            Feature::PathWatch,
            Status::Available,
            format!(
                "inotify_init1, a watch on /, /proc/self/mountinfo: kept host paths are checked by lstat only after a change ({note})"
            ),
        ),
        Err(why) => Check::new(
            Feature::PathWatch,
            Status::Unavailable,
            format!("{why}: every start checks its kept host paths by lstat (slower, not weaker)"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unix_socket_row_names_the_fence_in_force() {
        let no_bpf = || Err("EPERM — kernel lockdown".to_string());
        let both = landlock_unix_row(Some(10), Ok(()));
        assert_eq!(both.status, Status::Available);
        assert!(
            both.detail
                .starts_with("Landlock ABI 10 (LANDLOCK_ACCESS_FS_RESOLVE_UNIX) and BPF LSM"),
            "{}",
            both.detail
        );
        let landlock = landlock_unix_row(Some(10), no_bpf());
        assert_eq!(landlock.status, Status::Available);
        assert!(
            landlock.detail.contains("RESOLVE_UNIX") && landlock.detail.contains("no BPF LSM"),
            "{}",
            landlock.detail
        );
        let bpf = landlock_unix_row(Some(7), Ok(()));
        assert_eq!(bpf.status, Status::Available);
        assert!(
            bpf.detail.starts_with("BPF LSM lsm/unix_stream_connect")
                && bpf.detail.contains("Landlock ABI 7 < 9"),
            "{}",
            bpf.detail
        );
        for abi in [Some(8), None] {
            let none = landlock_unix_row(abi, no_bpf());
            assert_eq!(none.status, Status::Unavailable);
            assert!(
                none.detail.contains("no BPF LSM (EPERM")
                    && none.detail.contains("Linux 7.1")
                    && none.detail.contains("D-Bus system bus"),
                "{}",
                none.detail
            );
        }
    }
}
