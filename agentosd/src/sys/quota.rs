//! `quotactl_fd(2)` for user quotas: the state of a file system's user quotas
//! (`Q_XGETQSTATV`, `Q_GETFMT`), one uid's limits (`Q_SETQUOTA`) and usage (`Q_GETQUOTA`).
//! The file system is named by an fd of a directory on it (the daemon's state directory), so no
//! block device path is needed and a directory an agent could replace is never resolved again.
//! Layouts from `include/uapi/linux/quota.h` and `include/uapi/linux/dqblk_xfs.h`.

use std::os::fd::{AsRawFd, BorrowedFd};

use nix::errno::Errno;

/// `USRQUOTA`.
const USRQUOTA: u32 = 0;
/// `QCMD(cmd, type)`: the sub-command in the high bits, the quota type in the low byte.
const fn qcmd(cmd: u32, kind: u32) -> u32 {
    (cmd << 8) | (kind & 0xff)
}
const Q_GETFMT: u32 = 0x80_0004;
const Q_GETQUOTA: u32 = 0x80_0007;
const Q_SETQUOTA: u32 = 0x80_0008;
/// `XQM_CMD(8)`: `('X' << 8) + 8`.
const Q_XGETQSTATV: u32 = (b'X' as u32) << 8 | 8;
/// `FS_QSTATV_VERSION1`.
const QSTATV_VERSION1: i8 = 1;
/// `FS_QUOTA_UDQ_ACCT`, `FS_QUOTA_UDQ_ENFD`.
const UDQ_ACCT: u16 = 1;
const UDQ_ENFD: u16 = 2;
/// `QIF_BLIMITS`, `QIF_ILIMITS`: which fields of `struct if_dqblk` Q_SETQUOTA sets.
const QIF_BLIMITS: u32 = 1;
const QIF_ILIMITS: u32 = 4;
/// Block limits are in units of `QIF_DQBLKSIZE` (1 KiB).
pub const QUOTA_BLOCK: u64 = 1024;

/// `struct if_dqblk`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct IfDqblk {
    bhardlimit: u64,
    bsoftlimit: u64,
    curspace: u64,
    ihardlimit: u64,
    isoftlimit: u64,
    curinodes: u64,
    btime: u64,
    itime: u64,
    valid: u32,
}

/// `struct fs_qfilestatv`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct QFileStatV {
    ino: u64,
    nblks: u64,
    nextents: u32,
    pad: u32,
}

/// `struct fs_quota_statv`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct QuotaStatV {
    version: i8,
    pad1: u8,
    flags: u16,
    incoredqs: u32,
    uquota: QFileStatV,
    gquota: QFileStatV,
    pquota: QFileStatV,
    btimelimit: i32,
    itimelimit: i32,
    rtbtimelimit: i32,
    bwarnlimit: u16,
    iwarnlimit: u16,
    rtbwarnlimit: u16,
    pad3: u16,
    pad4: u32,
    pad2: [u64; 7],
}

/// # Safety
/// `addr` is null or points to memory of the layout `cmd` reads or writes, valid for the call.
unsafe fn quotactl_fd(
    fd: BorrowedFd<'_>,
    cmd: u32,
    id: u32,
    addr: *mut libc::c_void,
) -> Result<(), Errno> {
    // SAFETY: the caller's contract on `addr`; `fd` is open for the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_quotactl_fd,
            fd.as_raw_fd() as libc::c_uint,
            cmd as libc::c_uint,
            id as libc::c_uint,
            addr,
        )
    };
    if r < 0 { Err(Errno::last()) } else { Ok(()) }
}

/// What the kernel says of a file system's user quotas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UserQuotaState {
    /// Usage is counted (`FS_QUOTA_UDQ_ACCT`, or `Q_GETFMT` answered).
    pub accounting: bool,
    /// Limits are enforced (`FS_QUOTA_UDQ_ENFD`); `None`: the file system cannot say
    /// (`Q_XGETQSTATV` not implemented), which only `Q_GETFMT` answered.
    pub enforcing: Option<bool>,
}

/// The state of user quotas on the file system of `fd`: `Q_XGETQSTATV` (accounting and
/// enforcement), else `Q_GETFMT` (on or off). The errno of the last attempt when neither says:
/// `ENOSYS` (no quota support in the kernel or the file system), `ESRCH` (user quotas off),
/// `EINVAL` (the file system has no user quota type), `EPERM`.
pub fn user_quota_state(fd: BorrowedFd<'_>) -> Result<UserQuotaState, Errno> {
    let mut st = QuotaStatV {
        version: QSTATV_VERSION1,
        ..Default::default()
    };
    // SAFETY: `st` is a `struct fs_quota_statv` the kernel fills.
    let v = unsafe { quotactl_fd(fd, qcmd(Q_XGETQSTATV, USRQUOTA), 0, (&raw mut st).cast()) };
    match v {
        Ok(()) => {
            return Ok(UserQuotaState {
                accounting: st.flags & UDQ_ACCT != 0,
                enforcing: Some(st.flags & UDQ_ENFD != 0),
            });
        }
        Err(Errno::ENOSYS | Errno::EINVAL | Errno::EOPNOTSUPP) => {}
        Err(e) => return Err(e),
    }
    let mut fmt: u32 = 0;
    // SAFETY: Q_GETFMT writes one `__u32`.
    unsafe { quotactl_fd(fd, qcmd(Q_GETFMT, USRQUOTA), 0, (&raw mut fmt).cast()) }?;
    Ok(UserQuotaState {
        accounting: true,
        enforcing: None,
    })
}

/// One uid's limits and usage on a file system (0 limit: none).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UidQuota {
    /// Hard limit in bytes (a multiple of [`QUOTA_BLOCK`]).
    pub bytes_limit: u64,
    pub inodes_limit: u64,
    /// Bytes and inodes the uid owns there now.
    pub bytes: u64,
    pub inodes: u64,
}

/// `Q_SETQUOTA`: hard limits of `uid` on the file system of `fd` (`bytes` rounded up to
/// [`QUOTA_BLOCK`]; 0: no limit), no soft limits (no grace periods to reason about).
pub fn set_user_limits(fd: BorrowedFd<'_>, uid: u32, bytes: u64, inodes: u64) -> Result<(), Errno> {
    let mut q = IfDqblk {
        bhardlimit: bytes.div_ceil(QUOTA_BLOCK),
        ihardlimit: inodes,
        valid: QIF_BLIMITS | QIF_ILIMITS,
        ..Default::default()
    };
    // SAFETY: `q` is a `struct if_dqblk` the kernel reads.
    unsafe { quotactl_fd(fd, qcmd(Q_SETQUOTA, USRQUOTA), uid, (&raw mut q).cast()) }
}

/// `Q_GETQUOTA`: `uid`'s limits and usage on the file system of `fd`.
pub fn user_quota(fd: BorrowedFd<'_>, uid: u32) -> Result<UidQuota, Errno> {
    let mut q = IfDqblk::default();
    // SAFETY: `q` is a `struct if_dqblk` the kernel fills.
    unsafe { quotactl_fd(fd, qcmd(Q_GETQUOTA, USRQUOTA), uid, (&raw mut q).cast()) }?;
    Ok(UidQuota {
        bytes_limit: q.bhardlimit.saturating_mul(QUOTA_BLOCK),
        inodes_limit: q.ihardlimit,
        bytes: q.curspace,
        inodes: q.curinodes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_match_the_uapi_headers() {
        assert_eq!(std::mem::size_of::<IfDqblk>(), 72);
        assert_eq!(std::mem::size_of::<QFileStatV>(), 24);
        // 8 + 3 * 24 + 3 * 4 + 4 * 2 + 4 + 7 * 8
        assert_eq!(std::mem::size_of::<QuotaStatV>(), 160);
        assert_eq!(qcmd(Q_SETQUOTA, USRQUOTA), 0x8000_0800);
        assert_eq!(qcmd(Q_XGETQSTATV, USRQUOTA), 0x58_0800);
    }
}
