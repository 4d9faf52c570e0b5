//! Disk budgets per agent: a user quota on the agent's uid. An agent writes its home
//! (`<state>/home/<tenant>/<name>`), its tools' scratch directories (`<state>/tools/scratch`)
//! and whatever `fs.write` grants: all as its own uid, and the first two on the file system of
//! the daemon's state and (by default) audit trail. Without a bound one agent fills that file
//! system and puts the daemon in storage low, or — where root has no reserved blocks (xfs,
//! tmpfs, ext4 `-m 0`) — makes every agent's audit record fail with ENOSPC. The bound is the
//! kernel's: `Q_SETQUOTA` on the uid (blocks and inodes) at every start and re-adoption, set on
//! the state file system and on the audit file system when it is another one the agent can
//! write through a grant. Over it the agent gets EDQUOT; the daemon (root) is not bound by
//! quotas, and its own writes are bounded elsewhere (the storage reserve, journal caps).
//!
//! The limit covers every file the uid owns there, including files an earlier run of the same
//! agent left (a uid stays with its agent, sandbox/identity.rs): that is what a quota is, and
//! what the operator wants bounded. This module is the policy, pure apart from [`probe`] and
//! [`apply`]; the system calls are in `sys::quota`.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use nix::errno::Errno;

pub use crate::sys::quota::UidQuota;
use crate::sys::quota::{UserQuotaState, set_user_limits, user_quota, user_quota_state};

/// What to do to get user quotas enforced on a file system.
pub const REMEDY: &str = "ext4: `tune2fs -O quota -Q usrquota DEVICE` (unmounted; or `mkfs.ext4 -O quota`) and mount with `usrquota`; xfs: mount with `uquota`; see docs/install.md, \"Disk quotas\"";

/// A default budget: off, a fixed amount, or a share of the file system.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Share {
    Off,
    Fixed(u64),
    /// Percent of the file system's size (bytes) or inodes, above 0 and at most 100.
    Percent(f64),
}

impl Share {
    /// `off`, `N%`, or (`size`) a size such as `2GiB` / (otherwise) a count.
    fn parse(s: &str, size: bool) -> Result<Share, String> {
        let t = s.trim();
        if matches!(t, "off" | "none" | "0") {
            return Ok(Share::Off);
        }
        if let Some(p) = t.strip_suffix('%') {
            let v: f64 = p
                .trim()
                .parse()
                .map_err(|_| format!("{s:?}: not a percentage (write \"10%\")"))?;
            if !(v > 0.0 && v <= 100.0) {
                return Err(format!("{s:?}: a percentage above 0 and at most 100"));
            }
            return Ok(Share::Percent(v));
        }
        let v = if size {
            contracts::units::parse_memory(t).map_err(|e| format!("{s:?}: {e}"))?
        } else {
            t.parse::<u64>()
                .map_err(|_| format!("{s:?}: not a count, a percentage (\"10%\") or \"off\""))?
        };
        Ok(if v == 0 { Share::Off } else { Share::Fixed(v) })
    }

    /// For `--agent-disk-default`: `off`, `N%` of the state file system, or a size.
    pub fn parse_size(s: &str) -> Result<Share, String> {
        Share::parse(s, true)
    }

    /// For `--agent-disk-inodes-default`: `off`, `N%` of the file system's inodes, or a count.
    pub fn parse_count(s: &str) -> Result<Share, String> {
        Share::parse(s, false)
    }

    /// The amount on a file system of `total` (bytes or inodes); `None` when off (or the
    /// total is unknown for a percentage). Never 0: a 0 limit would mean none.
    pub fn of(&self, total: u64) -> Option<u64> {
        match *self {
            Share::Off => None,
            Share::Fixed(v) => Some(v.max(1)),
            Share::Percent(_) if total == 0 => None,
            Share::Percent(p) => Some((((total as f64) * p / 100.0) as u64).max(1)),
        }
    }
}

impl std::fmt::Display for Share {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Share::Off => f.write_str("off"),
            Share::Fixed(v) => write!(f, "{v}"),
            Share::Percent(p) => write!(f, "{p}%"),
        }
    }
}

/// The daemon's defaults for agents whose contract sets no `compute.disk` /
/// `compute.disk_inodes` (`--agent-disk-default`, `--agent-disk-inodes-default`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DiskDefaults {
    pub bytes: Share,
    pub inodes: Share,
}

/// Default of `--agent-disk-default`: a tenth of the state file system. One agent alone cannot
/// push it into the storage reserve from an empty start (the reserve is 1 % or 64 MiB and
/// normal use stays far below 90 %), while an agent that works with data still gets room that
/// scales with the host's disk; ten agents writing flat out still can fill it together, which
/// the offender rule (storage/usage.rs) and the operator's per-contract budgets are for.
pub const DEFAULT_DISK_PERCENT: f64 = 10.0;
/// Default of `--agent-disk-inodes-default`: a tenth of the file system's inodes, for the same
/// reason (millions of empty files fill a file system's inode table as surely as bytes fill it).
pub const DEFAULT_INODES_PERCENT: f64 = 10.0;

impl Default for DiskDefaults {
    fn default() -> Self {
        DiskDefaults {
            bytes: Share::Percent(DEFAULT_DISK_PERCENT),
            inodes: Share::Percent(DEFAULT_INODES_PERCENT),
        }
    }
}

/// Size of a file system, for the shares.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FsSize {
    pub bytes: u64,
    pub inodes: u64,
}

/// Hard limits for one uid (0: none).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    pub bytes: u64,
    pub inodes: u64,
}

/// The limits of an agent: the contract's `compute.disk` / `compute.disk_inodes`, else the
/// daemon's defaults on a file system of `fs`. `None`: nothing to bound.
pub fn limits(
    disk: Option<u64>,
    inodes: Option<u64>,
    defaults: &DiskDefaults,
    fs: FsSize,
) -> Option<Limits> {
    let l = Limits {
        bytes: disk.or_else(|| defaults.bytes.of(fs.bytes)).unwrap_or(0),
        inodes: inodes
            .or_else(|| defaults.inodes.of(fs.inodes))
            .unwrap_or(0),
    };
    (l.bytes > 0 || l.inodes > 0).then_some(l)
}

/// Whether a file system enforces user quotas, as the daemon reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Support {
    /// Usage counted and limits enforced.
    Enforced,
    /// Counted but not enforced (ext4 with the quota feature mounted without `usrquota`).
    CountedOnly,
    /// Not available; why.
    Unavailable(String),
}

/// Whether the kernel was built with quota support (`CONFIG_QUOTA` makes `/proc/sys/fs/quota`).
fn kernel_has_quota() -> bool {
    Path::new("/proc/sys/fs/quota").is_dir()
}

impl Support {
    /// From the kernel's answer; `kernel_quota`: whether the kernel has quota support at all
    /// (it tells an ENOSYS of the kernel from one of the file system).
    pub fn classify(
        r: Result<UserQuotaState, Errno>,
        kernel_quota: bool,
        fs_type: &str,
    ) -> Support {
        match r {
            Ok(UserQuotaState {
                accounting: true,
                enforcing: Some(true) | None,
            }) => Support::Enforced,
            Ok(UserQuotaState {
                accounting: true,
                enforcing: Some(false),
            }) => Support::CountedOnly,
            Ok(_) | Err(Errno::ESRCH) => {
                Support::Unavailable(format!("user quotas are off on this {fs_type} file system"))
            }
            Err(Errno::ENOSYS) if !kernel_quota => Support::Unavailable(
                "the kernel has no quota support (CONFIG_QUOTA, CONFIG_QUOTACTL)".into(),
            ),
            Err(Errno::ENOSYS) => Support::Unavailable(format!(
                "this {fs_type} file system has no quota support (tmpfs: mount option usrquota, Linux 6.6+; ext4 also needs CONFIG_QFMT_V2)"
            )),
            Err(Errno::EINVAL) => {
                Support::Unavailable(format!("this {fs_type} file system has no user quotas"))
            }
            Err(e) => Support::Unavailable(format!("quotactl_fd(Q_XGETQSTATV, Q_GETFMT): {e}")),
        }
    }

    pub fn enforced(&self) -> bool {
        *self == Support::Enforced
    }

    /// `enforced`, or why not and what to do.
    pub fn describe(&self) -> String {
        match self {
            Support::Enforced => "user quotas enforced".into(),
            Support::CountedOnly => format!(
                "user quotas counted but not enforced (mount with usrquota or run `quotaon -u`); {REMEDY}"
            ),
            Support::Unavailable(why) => format!("no user quotas: {why}; {REMEDY}"),
        }
    }
}

/// The file system type's name for messages, from `statfs(2)`'s `f_type`.
fn fs_type_name(magic: u64) -> &'static str {
    match magic {
        0xEF53 => "ext4",
        0x5846_5342 => "xfs",
        0x0102_1994 => "tmpfs",
        0x9123_683E => "btrfs",
        _ => "",
    }
}

/// One file system the quota is set on: a directory of it, opened.
#[derive(Debug)]
pub struct QuotaFs {
    pub dir: PathBuf,
    fd: std::os::fd::OwnedFd,
    pub support: Support,
    pub size: FsSize,
}

/// Open `dir` (or its nearest existing ancestor) and ask its file system about user quotas.
pub fn probe(dir: &Path) -> Result<QuotaFs, String> {
    let dir = dir
        .ancestors()
        .find(|a| a.exists())
        .unwrap_or(dir)
        .to_path_buf();
    let fd = rustix::fs::open(
        &dir,
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(|e| format!("open {}: {e}", dir.display()))?;
    let sfs = rustix::fs::fstatfs(&fd).map_err(|e| format!("statfs {}: {e}", dir.display()))?;
    let fs_type = fs_type_name(sfs.f_type as u64);
    let vfs = rustix::fs::fstatvfs(&fd).map_err(|e| format!("statvfs {}: {e}", dir.display()))?;
    let frsize = if vfs.f_frsize > 0 {
        vfs.f_frsize
    } else {
        vfs.f_bsize
    };
    let support = Support::classify(user_quota_state(fd.as_fd()), kernel_has_quota(), fs_type);
    Ok(QuotaFs {
        dir,
        fd,
        support,
        size: FsSize {
            bytes: vfs.f_blocks.saturating_mul(frsize),
            inodes: vfs.f_files,
        },
    })
}

impl QuotaFs {
    /// `Q_SETQUOTA` of `uid` to `l`.
    pub fn apply(&self, uid: u32, l: Limits) -> Result<(), String> {
        set_user_limits(self.fd.as_fd(), uid, l.bytes, l.inodes).map_err(|e| {
            format!(
                "quotactl_fd(Q_SETQUOTA, uid {uid}) on {}: {e}",
                self.dir.display()
            )
        })
    }

    /// `Q_GETQUOTA` of `uid`.
    pub fn usage(&self, uid: u32) -> Result<UidQuota, String> {
        user_quota(self.fd.as_fd(), uid).map_err(|e| {
            format!(
                "quotactl_fd(Q_GETQUOTA, uid {uid}) on {}: {e}",
                self.dir.display()
            )
        })
    }
}

/// The directories whose file systems an agent's quota is set on: the state directory's (its
/// home, its tools' scratch) always; the audit directory's too when it is another file system
/// and one of the agent's `fs.write` scopes lies on it (`dev` gives a path's device; a scope
/// not made yet counts on its nearest existing ancestor).
pub fn quota_dirs(
    state_dir: &Path,
    audit_dir: Option<&Path>,
    write_scopes: &[PathBuf],
    dev: &dyn Fn(&Path) -> Option<u64>,
) -> Vec<PathBuf> {
    let near = |p: &Path| p.ancestors().find_map(dev);
    let mut out = vec![state_dir.to_path_buf()];
    if let Some(audit) = audit_dir {
        let a = near(audit);
        if a.is_some() && a != near(state_dir) && write_scopes.iter().any(|s| near(s) == a) {
            out.push(audit.to_path_buf());
        }
    }
    out
}

/// The line `agentosd check` prints: whether the state file system (and the audit one when
/// apart) enforce user quotas, which the agents' disk budgets need.
pub fn check_line(state_dir: &Path, audit_dir: &Path, defaults: &DiskDefaults) -> String {
    let mut parts = Vec::new();
    let mut all = true;
    let state_dev = device(state_dir);
    for (role, dir) in [("state", state_dir), ("audit", audit_dir)] {
        if role == "audit" && device(dir) == state_dev {
            continue;
        }
        match probe(dir) {
            Ok(q) => {
                all &= q.support.enforced();
                parts.push(format!(
                    "{} ({role}): {} [{}]",
                    q.dir.display(),
                    q.support.describe(),
                    if q.support.enforced() {
                        "ok"
                    } else {
                        "NOT ENFORCED"
                    }
                ));
            }
            Err(e) => {
                all = false;
                parts.push(format!("{} ({role}): {e}", dir.display()));
            }
        }
    }
    let what = if all {
        format!(
            "ok (agents without compute.disk get {} of the state file system, {} of its inodes)",
            defaults.bytes, defaults.inodes
        )
    } else {
        "NOT ENFORCED: agents' compute.disk is reported as not enforced, and an agent with compute.must is refused".to_string()
    };
    format!("disk quotas: {what}; {}", parts.join("; "))
}

fn device(p: &Path) -> Option<u64> {
    p.ancestors()
        .find_map(|a| rustix::fs::stat(a).ok())
        .map(|s| s.st_dev)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_parse_as_sizes_counts_percentages_or_off() {
        assert_eq!(Share::parse_size("10%"), Ok(Share::Percent(10.0)));
        assert_eq!(Share::parse_size("2GiB"), Ok(Share::Fixed(2 << 30)));
        assert_eq!(Share::parse_size("1048576"), Ok(Share::Fixed(1 << 20)));
        assert_eq!(Share::parse_size("off"), Ok(Share::Off));
        assert_eq!(Share::parse_size("0"), Ok(Share::Off));
        assert_eq!(Share::parse_count("100000"), Ok(Share::Fixed(100_000)));
        assert_eq!(Share::parse_count("5%"), Ok(Share::Percent(5.0)));
        for bad in ["0%", "101%", "x%", "lots"] {
            assert!(Share::parse_size(bad).is_err(), "{bad}");
        }
        assert!(Share::parse_count("1GiB").is_err());
    }

    #[test]
    fn limits_come_from_the_contract_else_the_defaults() {
        let fs = FsSize {
            bytes: 100 << 30,
            inodes: 6_000_000,
        };
        let d = DiskDefaults::default();
        // Defaults: a tenth of each.
        assert_eq!(
            limits(None, None, &d, fs),
            Some(Limits {
                bytes: 10 << 30,
                inodes: 600_000
            })
        );
        // The contract's bytes, the default's inodes (an agent setting only `disk` is still
        // bounded in files).
        assert_eq!(
            limits(Some(64 << 20), None, &d, fs),
            Some(Limits {
                bytes: 64 << 20,
                inodes: 600_000
            })
        );
        assert_eq!(
            limits(Some(1 << 20), Some(50), &d, fs),
            Some(Limits {
                bytes: 1 << 20,
                inodes: 50
            })
        );
        // Defaults off: only what the contract says, and nothing when it says nothing.
        let off = DiskDefaults {
            bytes: Share::Off,
            inodes: Share::Off,
        };
        assert_eq!(limits(None, None, &off, fs), None);
        assert_eq!(
            limits(None, Some(10), &off, fs),
            Some(Limits {
                bytes: 0,
                inodes: 10
            })
        );
        // A tiny file system never yields a 0 (= unlimited) limit.
        let tiny = FsSize {
            bytes: 5,
            inodes: 3,
        };
        assert_eq!(
            limits(None, None, &d, tiny),
            Some(Limits {
                bytes: 1,
                inodes: 1
            })
        );
        // A percentage of an unknown size is no limit rather than a wrong one.
        assert_eq!(limits(None, None, &d, FsSize::default()), None);
    }

    #[test]
    fn support_is_classified_with_what_to_do() {
        let on = |e| {
            Ok(UserQuotaState {
                accounting: true,
                enforcing: e,
            })
        };
        assert_eq!(
            Support::classify(on(Some(true)), true, "ext4"),
            Support::Enforced
        );
        assert_eq!(Support::classify(on(None), true, "ext4"), Support::Enforced);
        let counted = Support::classify(on(Some(false)), true, "ext4");
        assert_eq!(counted, Support::CountedOnly);
        assert!(
            counted.describe().contains("usrquota"),
            "{}",
            counted.describe()
        );
        let off = Support::classify(Err(Errno::ESRCH), true, "ext4");
        assert!(!off.enforced());
        let d = off.describe();
        assert!(
            d.contains("user quotas are off") && d.contains("tune2fs -O quota"),
            "{d}"
        );
        let nokernel = Support::classify(Err(Errno::ENOSYS), false, "ext4").describe();
        assert!(nokernel.contains("CONFIG_QUOTA"), "{nokernel}");
        let tmpfs = Support::classify(Err(Errno::ENOSYS), true, "tmpfs").describe();
        assert!(
            tmpfs.contains("tmpfs") && tmpfs.contains("usrquota"),
            "{tmpfs}"
        );
        let xfs = Support::classify(Err(Errno::EINVAL), true, "xfs").describe();
        assert!(xfs.contains("uquota"), "{xfs}");
    }

    #[test]
    fn the_audit_file_system_is_bounded_only_when_the_agent_can_write_it() {
        // /state on device 1, /audit on device 2, /srv on device 1, /audit-side/x on 2.
        let dev = |p: &Path| -> Option<u64> {
            match p.to_str()? {
                "/" | "/state" | "/srv" => Some(1),
                "/audit" | "/audit/side" => Some(2),
                _ => None,
            }
        };
        let st = Path::new("/state");
        let au = Path::new("/audit");
        assert_eq!(quota_dirs(st, Some(au), &[], &dev), [st]);
        assert_eq!(
            quota_dirs(st, Some(au), &[PathBuf::from("/srv/data")], &dev),
            [st]
        );
        assert_eq!(
            quota_dirs(st, Some(au), &[PathBuf::from("/audit/side/not-yet")], &dev),
            [st, au]
        );
        // Audit on the state file system: one quota covers both.
        assert_eq!(
            quota_dirs(st, Some(Path::new("/srv")), &[PathBuf::from("/srv")], &dev),
            [st]
        );
    }

    /// On whatever file system the test runs (the host's without quotas, the VM's loop ext4):
    /// the probe answers without failing and the check line says what to do when not enforced.
    #[test]
    fn the_check_line_names_the_remedy_when_not_enforced() {
        let dir = tempfile::tempdir().unwrap();
        let line = check_line(
            dir.path(),
            &dir.path().join("audit"),
            &DiskDefaults::default(),
        );
        assert!(line.starts_with("disk quotas: "), "{line}");
        let q = probe(dir.path()).unwrap();
        if !q.support.enforced() {
            assert!(
                line.contains("NOT ENFORCED") && line.contains("usrquota"),
                "{line}"
            );
        }
        assert!(q.size.bytes > 0, "{q:?}");
    }
}
