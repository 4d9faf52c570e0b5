//! Landlock and seccomp denials of agents, read from the kernel's audit subsystem.
//!
//! Agents are sandboxed so that the kernel itself reports what it refuses them, with mechanisms
//! scoped to the agents (no global syscall tracepoint: see docs/audit.md):
//!
//! - seccomp: the agent's deny-list filter is installed with `SECCOMP_FILTER_FLAG_LOG`, so each
//!   `SECCOMP_RET_ERRNO` it returns produces an `AUDIT_SECCOMP` record when `errno` is in
//!   `/proc/sys/kernel/seccomp/actions_logged` (the kernel's default). This works with audit
//!   disabled.
//! - Landlock (ABI ≥ 7): the agent's domain is created with
//!   `LANDLOCK_RESTRICT_SELF_LOG_NEW_EXEC_ON` (the kernel logs only denials before `execve` by
//!   default), so each denial produces `AUDIT_LANDLOCK_ACCESS` (domain id, blockers, path or
//!   address) and, at a domain's first denial, `AUDIT_LANDLOCK_DOMAIN` (the pid and uid that
//!   created the domain). Landlock logs only while audit is enabled (`audit_enabled=1`).
//!
//! The daemon reads both from the audit netlink socket's read-only multicast group
//! (`AUDIT_NLGRP_READLOG`, needs `CAP_AUDIT_READ`), beside auditd or without it; it never
//! registers itself as the audit daemon and never changes audit settings.
//!
//! Parsing ([`parse`]) and the Landlock domain bookkeeping ([`Correlator`]) are pure and unit
//! tested with records captured on the development host; [`open_readlog`] and [`run`] are the
//! kernel side.

mod correlate;
mod denial;
mod netlink;
mod record;
#[cfg(test)]
mod tests;

pub use correlate::{Attribute, Attribution, Correlator, Output};
pub use denial::{Denial, landlock_denial, seccomp_denial, syscall_name};
pub use netlink::{
    AuditStatus, Loss, gaps, messages, open_readlog, run, seccomp_errno_logged, status,
};
pub use record::{Event, LandlockAccess, LandlockDomain, SeccompRecord, Stamp, parse};

/// `AUDIT_GET`: the audit status (enabled, lost, backlog…).
pub const AUDIT_GET: u16 = 1000;
/// A seccomp action that the kernel was asked to log.
pub const AUDIT_SECCOMP: u16 = 1326;
/// One Landlock denial.
pub const AUDIT_LANDLOCK_ACCESS: u16 = 1423;
/// A Landlock domain's creator (logged at its first denial) or its end.
pub const AUDIT_LANDLOCK_DOMAIN: u16 = 1424;
/// The read-only multicast group of audit records.
pub const AUDIT_NLGRP_READLOG: u32 = 1;

const NLMSG_HDRLEN: usize = 16;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;

/// The x86-64 audit architecture (`AUDIT_ARCH_X86_64`).
const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
const X32_SYSCALL_BIT: i64 = 0x4000_0000;

#[derive(Debug, thiserror::Error)]
pub enum KauditError {
    #[error("audit netlink: {call}: {source}")]
    Sys {
        call: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("audit netlink: {0}")]
    Protocol(String),
}
