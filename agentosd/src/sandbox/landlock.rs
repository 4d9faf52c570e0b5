//! Compile an agent's filesystem and network grants into a Landlock ruleset. The ruleset is
//! created and filled in the daemon; the child only calls `landlock_restrict_self` on its fd.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use ::landlock::{
    ABI, Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, NetPort, Ruleset,
    RulesetAttr, RulesetCreatedAttr, Scope, path_beneath_rules,
};

/// The newest ABI whose rights this module asks for; older kernels get what they support
/// (best effort) unless the contract requires Landlock (`must.mechanisms: [landlock]`).
pub const TARGET_ABI: ABI = ABI::V6;

/// `LANDLOCK_RESTRICT_SELF_LOG_NEW_EXEC_ON` (ABI 7): keep logging denials to the audit
/// subsystem after `execve`. By default the kernel logs only the denials of the program that
/// called `landlock_restrict_self`, i.e. none of the agent's (we exec it right after).
pub const RESTRICT_SELF_LOG_NEW_EXEC_ON: u32 = 1 << 1;

static RESTRICT_FLAGS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// The `landlock_restrict_self` flags for a kernel of Landlock ABI `abi`: audit logging of the
/// agent's denials where the kernel has it (older kernels refuse unknown flags with EINVAL).
pub fn restrict_flags_for(abi: Option<u32>) -> u32 {
    if abi.is_some_and(|v| v >= 7) {
        RESTRICT_SELF_LOG_NEW_EXEC_ON
    } else {
        0
    }
}

/// The flags the child passes to `landlock_restrict_self`: set by [`build`] in the daemon
/// before any clone, read in the child (an atomic load: async-signal-safe).
pub fn restrict_flags() -> u32 {
    RESTRICT_FLAGS.load(std::sync::atomic::Ordering::Relaxed)
}

/// System paths every agent may read and execute: without them no dynamically linked program
/// starts. (Executing them is harmless: they run with the agent's own uid and sandbox.)
pub const BASE_READ_EXEC: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32",
];

/// Files and trees every agent may read. Not `/etc` as a whole (no `/etc/shadow`, no host
/// configuration), not `/home`, `/root`, `/var`, `/run`, `/srv`.
pub const BASE_READ: &[&str] = &[
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/nsswitch.conf",
    "/etc/passwd",
    "/etc/group",
    "/etc/hosts",
    "/etc/host.conf",
    "/etc/resolv.conf",
    "/etc/gai.conf",
    "/etc/ssl",
    "/etc/ca-certificates",
    "/etc/alternatives",
    "/usr/share/zoneinfo",
    "/proc",
    "/sys/devices/system/cpu",
    "/dev/urandom",
    "/dev/random",
];

/// Device files every agent may read and write.
pub const BASE_READ_WRITE_FILES: &[&str] = &["/dev/null", "/dev/zero", "/dev/full"];

/// What one agent may touch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub read: Vec<PathBuf>,
    pub read_exec: Vec<PathBuf>,
    pub read_write: Vec<PathBuf>,
    /// TCP ports it may connect to; `None` = any port (a `*` port was granted).
    pub connect: Option<Vec<u16>>,
    /// TCP ports it may bind; `None` = any port.
    pub bind: Option<Vec<u16>>,
    /// Leave out signal and abstract-socket scoping (only the escape suite's mutation check
    /// sets this, to show the suite notices).
    pub unscoped: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum LandlockError {
    #[error("landlock: {0}")]
    Ruleset(#[from] ::landlock::RulesetError),
    #[error("landlock: invalid network scope {0:?} (want HOST:PORT)")]
    Scope(String),
}

/// Parse the port of a `HOST:PORT` scope; `Ok(None)` for `*`.
pub fn scope_port(scope: &str) -> Result<Option<u16>, LandlockError> {
    let (_, port) = scope
        .rsplit_once(':')
        .ok_or_else(|| LandlockError::Scope(scope.to_string()))?;
    if port == "*" {
        return Ok(None);
    }
    port.parse::<u16>()
        .ok()
        .filter(|p| *p > 0)
        .map(Some)
        .ok_or_else(|| LandlockError::Scope(scope.to_string()))
}

/// Ports of a list of `HOST:PORT` scopes; `None` when one of them allows every port.
pub fn ports(scopes: &[String]) -> Result<Option<Vec<u16>>, LandlockError> {
    let mut out = Vec::new();
    for s in scopes {
        match scope_port(s)? {
            Some(p) => out.push(p),
            None => return Ok(None),
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(Some(out))
}

fn existing(paths: &[PathBuf]) -> impl Iterator<Item = &Path> {
    paths.iter().map(PathBuf::as_path)
}

/// Build the ruleset in the calling (daemon) process and return its fd. `required`: fail
/// instead of silently dropping rights the kernel does not know.
pub fn build(plan: &Plan, required: bool) -> Result<Option<OwnedFd>, LandlockError> {
    RESTRICT_FLAGS.store(
        restrict_flags_for(kernel_abi()),
        std::sync::atomic::Ordering::Relaxed,
    );
    let abi = TARGET_ABI;
    let level = if required {
        CompatLevel::HardRequirement
    } else {
        CompatLevel::BestEffort
    };
    let fs_all = AccessFs::from_all(abi);
    // Not `from_read`: in the crate that includes Execute.
    let read = AccessFs::ReadFile | AccessFs::ReadDir;
    let write = AccessFs::from_write(abi);
    let mut rs = Ruleset::default()
        .set_compatibility(level)
        .handle_access(fs_all)?;
    let mut net: BitFlags<AccessNet> = BitFlags::empty();
    if plan.connect.is_some() {
        net |= AccessNet::ConnectTcp;
    }
    if plan.bind.is_some() {
        net |= AccessNet::BindTcp;
    }
    if !net.is_empty() {
        rs = rs.handle_access(net)?;
    }
    if !plan.unscoped {
        rs = rs.scope(Scope::from_all(abi))?;
    }
    let mut created = rs.create()?;
    created = created
        .add_rules(path_beneath_rules(
            existing(&plan.read_exec),
            read | AccessFs::Execute,
        ))?
        .add_rules(path_beneath_rules(existing(&plan.read), read))?
        .add_rules(path_beneath_rules(existing(&plan.read_write), read | write))?;
    for p in plan.connect.iter().flatten() {
        created = created.add_rule(NetPort::new(*p, AccessNet::ConnectTcp))?;
    }
    for p in plan.bind.iter().flatten() {
        created = created.add_rule(NetPort::new(*p, AccessNet::BindTcp))?;
    }
    Ok(created.into())
}

/// The kernel's Landlock ABI version (`landlock_create_ruleset(NULL, 0, VERSION)`), or `None`.
pub fn kernel_abi() -> Option<u32> {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: with a NULL attribute pointer, size 0 and the VERSION flag the kernel only
    // returns the ABI number; no memory is read or written.
    let r = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    (r > 0).then_some(r as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_of_scopes() {
        assert_eq!(
            ports(&["api.example.com:443".into(), "[::1]:80".into()]).unwrap(),
            Some(vec![80, 443])
        );
        assert_eq!(ports(&["*:*".into()]).unwrap(), None);
        assert!(ports(&["nohost".into()]).is_err());
        assert!(ports(&["h:0".into()]).is_err());
    }

    #[test]
    fn audit_logging_only_where_the_kernel_knows_the_flag() {
        assert_eq!(restrict_flags_for(None), 0);
        assert_eq!(restrict_flags_for(Some(6)), 0);
        assert_eq!(restrict_flags_for(Some(7)), RESTRICT_SELF_LOG_NEW_EXEC_ON);
    }
}
