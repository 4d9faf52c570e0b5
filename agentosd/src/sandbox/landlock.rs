//! Compile an agent's filesystem and network grants into a Landlock ruleset. The ruleset is
//! created and filled in the daemon; the child only calls `landlock_restrict_self` on its fd.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ::landlock::{
    ABI, Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, NetPort, Ruleset,
    RulesetAttr, RulesetCreatedAttr, Scope,
};

use super::path_cache::{Checked, Entry, PathCache, Resolve, RuleFd};
use crate::safe_fs::{self, SafeFsError};

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
    /// Directories beneath which it may connect (or send) to Unix sockets by path: the
    /// daemon's own sockets for it. Sockets it made itself are always reachable; every other
    /// pathname Unix socket of the host (the D-Bus system bus, journald's `/dev/log`) is not,
    /// where the kernel has `LANDLOCK_ACCESS_FS_RESOLVE_UNIX` ([`resolve_unix`]).
    pub unix: Vec<PathBuf>,
    /// Leave out signal and abstract-socket scoping (only the escape suite's mutation check
    /// sets this, to show the suite notices).
    pub unscoped: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum LandlockError {
    #[error("landlock: {0}")]
    Ruleset(#[from] ::landlock::RulesetError),
    /// The kernel refused a path rule (`EINVAL`: a right the ruleset does not handle, or a
    /// directory right on a file).
    #[error("landlock: landlock_add_rule for {path}: {errno}")]
    AddRule {
        path: PathBuf,
        errno: nix::errno::Errno,
    },
    #[error("landlock: invalid network scope {0:?} (want HOST:PORT)")]
    Scope(String),
    /// A filesystem scope that does not resolve safely: the agent is not started.
    #[error("filesystem scope {scope}: {source}")]
    Path {
        scope: PathBuf,
        #[source]
        source: SafeFsError,
    },
}

/// Parse the port of a `HOST:PORT` scope; `Ok(None)` for `*`. `https://NAME` and `http://NAME`
/// have a default port (443, 80).
pub fn scope_port(scope: &str) -> Result<Option<u16>, LandlockError> {
    if let Some(c) = contracts::netscope::checked_scope(scope) {
        return c
            .map(|c| Some(c.port))
            .map_err(|_| LandlockError::Scope(scope.to_string()));
    }
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

/// How the paths of a [`Plan`] are opened for their Landlock rules (and resolved for the BPF LSM
/// prefixes): never by following a link an agent could have planted.
///
/// - under a directory in `beneath` (the agent's home as the daemon opened it, a tool's
///   scratch): `openat2` beneath that directory's fd with no link, magic link, `..` or mount
///   crossing ([`safe_fs::BENEATH`]);
/// - a host path in `system` (the baseline below, a tool's runtime and command):
///   [`safe_fs::resolve_trusted`], which follows a link only where root alone could have made
///   it (`/bin` → `usr/bin`);
/// - anything else (a contract's absolute scope): resolved from `/` following no link at all
///   ([`safe_fs::open_no_links`]); a scope with a link in it is an error naming it.
///
/// A path that does not exist grants nothing and is skipped.
///
/// For a ruleset ([`build_with`]) the host paths (not those `beneath`) go through `cache`: a
/// path only root could make resolve elsewhere is kept open between starts and checked on each
/// use ([`path_cache`], docs/security.md).
#[derive(Default)]
pub struct Opener<'a> {
    pub beneath: Vec<&'a safe_fs::Dir>,
    pub system: Vec<PathBuf>,
    /// `None`: every path resolved afresh.
    pub cache: Option<&'a PathCache>,
}

impl<'a> Opener<'a> {
    /// The agents' opener: the baseline paths may follow root's links; `beneath` are the
    /// directories the daemon opened itself (the agent's home); the daemon's path cache.
    pub fn new(beneath: Vec<&'a safe_fs::Dir>) -> Opener<'a> {
        let system = BASE_READ_EXEC
            .iter()
            .chain(BASE_READ)
            .chain(BASE_READ_WRITE_FILES)
            .map(PathBuf::from)
            .collect();
        Opener {
            beneath,
            system,
            cache: Some(PathCache::global()),
        }
    }

    /// An fd of `path` for a rule and whether it is a directory, `Ok(None)` when it does not
    /// exist: [`Opener::open`]'s resolution, through the cache for host paths.
    pub fn open_rule(
        &self,
        path: &Path,
        checked: &mut Checked,
    ) -> Result<Option<(RuleFd, bool)>, LandlockError> {
        let cache = self.cache.filter(|c| c.enabled());
        let under_beneath = self.beneath.iter().any(|d| path.starts_with(d.path()));
        let Some(cache) = cache.filter(|_| !under_beneath) else {
            return Ok(self.open(path)?.map(|(fd, _)| {
                let dir = is_dir(&fd);
                (RuleFd::Own(fd), dir)
            }));
        };
        let how = if self.system.iter().any(|s| s == path) {
            Resolve::RootLinks
        } else {
            Resolve::NoLinks
        };
        match cache.open(path, how, checked) {
            Ok(x) => Ok(Some(x)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(source) => Err(LandlockError::Path {
                scope: path.to_path_buf(),
                source,
            }),
        }
    }

    /// The `beneath` directory `path` is opened under (the deepest one holding it) and the
    /// rest of the path below it; `None` for a host path.
    pub fn beneath_of<'p>(&self, path: &'p Path) -> Option<(&'a safe_fs::Dir, &'p Path)> {
        self.beneath
            .iter()
            .filter_map(|d| path.strip_prefix(d.path()).ok().map(|r| (*d, r)))
            .max_by_key(|(d, _)| d.path().as_os_str().len())
    }

    /// An `O_PATH` fd of `path` and its real path; `Ok(None)` when it does not exist.
    pub fn open(&self, path: &Path) -> Result<Option<(OwnedFd, PathBuf)>, LandlockError> {
        let r = if let Some((dir, rel)) = self.beneath_of(path) {
            // The real path of what the fd names (the operator's state directory may sit
            // behind a link of the host's own, e.g. /var/lib): what `d_path` reports.
            dir.open_path(rel).map(|fd| {
                use std::os::fd::AsRawFd;
                let real = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
                    .unwrap_or_else(|_| path.to_path_buf());
                (fd, real)
            })
        } else if self.system.iter().any(|s| s == path) {
            safe_fs::resolve_trusted(path)
        } else {
            safe_fs::open_no_links(path).map(|fd| (fd, path.to_path_buf()))
        };
        match r {
            Ok(x) => Ok(Some(x)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(source) => Err(LandlockError::Path {
                scope: path.to_path_buf(),
                source,
            }),
        }
    }

    /// The real path `path` stands for, as the BPF LSM sees it (`d_path`), or `None` when it
    /// does not exist or does not resolve safely (it then grants nothing there either).
    pub fn resolve(&self, path: &Path) -> Option<PathBuf> {
        self.open(path).ok().flatten().map(|(_, p)| p)
    }
}

fn is_dir(fd: &OwnedFd) -> bool {
    rustix::fs::fstat(fd).is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR)
}

/// A path rule: the fd [`Opener`] opened and the rights granted there, already reduced to file
/// rights for a file (the daemon knows each fd's type: kept fds carry it from the cache, fresh
/// ones are `fstat`ed once when opened).
struct FsRule {
    path: PathBuf,
    fd: RuleFd,
    access: BitFlags<AccessFs>,
}

/// Rules for `paths` with `access`, each from an fd [`Opener`] opened (file rights only for a
/// file, as Landlock requires); the paths that do not exist are added to `missing`.
fn rules(
    opener: &Opener<'_>,
    paths: &[PathBuf],
    access: BitFlags<AccessFs>,
    abi: ABI,
    checked: &mut Checked,
    missing: &mut Vec<PathBuf>,
) -> Result<Vec<FsRule>, LandlockError> {
    let mut out = Vec::new();
    for p in paths {
        if let Some((fd, dir)) = opener.open_rule(p, checked)? {
            out.push(FsRule {
                path: p.clone(),
                fd,
                access: rule_access(access, dir, abi),
            });
        } else {
            missing.push(p.clone());
        }
    }
    Ok(out)
}

/// What one path of a plan was bound to when its ruleset was built ([`build_bound`]): what the
/// ruleset pool checks again before a start takes a ruleset built ahead of it
/// ([`super::ruleset_pool`]).
#[derive(Debug)]
pub enum Bound {
    /// A host path kept in the path cache: its walk is checked again.
    Kept { path: PathBuf, entry: Arc<Entry> },
    /// Opened beneath one of the opener's `beneath` directories (the agent's home): the object
    /// it named then.
    Beneath { path: PathBuf, dev: u64, ino: u64 },
    /// Resolved afresh and not kept (a walk through a directory others can write, the path
    /// cache full or off): what a start must resolve again itself.
    Fresh(PathBuf),
    /// Did not exist: no rule.
    Missing(PathBuf),
}

/// The rights of a rule on a directory (`dir`) or on anything else: the file rights of `access`
/// only (Landlock refuses directory-only rights on a file with `EINVAL`). `ResolveUnix`
/// applies to a socket file too (it is only in `access` where the ruleset handles it).
fn rule_access(access: BitFlags<AccessFs>, dir: bool, abi: ABI) -> BitFlags<AccessFs> {
    if dir {
        access
    } else {
        access & (AccessFs::from_file(abi) | AccessFs::ResolveUnix)
    }
}

/// The filesystem rights a ruleset that asked for `requested` handles on a kernel of Landlock
/// ABI `kernel`: what the landlock crate's `Ruleset::create` passed to the kernel (the requested
/// rights the kernel knows, as the crate's own ABI table has them). A rule may grant only these.
fn handled_fs(requested: BitFlags<AccessFs>, kernel: Option<u32>) -> BitFlags<AccessFs> {
    let abi = ABI::from(kernel.map_or(0, |v| i32::try_from(v).unwrap_or(i32::MAX)));
    requested & AccessFs::from_all(abi)
}

/// Add `rules` to the ruleset `fd` handling `handled`: each rule's rights reduced to those
/// handled (the crate's best-effort downgrade on an older kernel; with `required` the ruleset
/// was refused before unless it handles them all), none added whose rights that leaves empty.
fn add_fs_rules(
    fd: &OwnedFd,
    rules: &[FsRule],
    handled: BitFlags<AccessFs>,
) -> Result<(), LandlockError> {
    use std::os::fd::AsFd;
    for r in rules {
        let a = r.access & handled;
        if a.is_empty() {
            continue;
        }
        crate::sys::landlock::add_path_beneath(fd.as_fd(), r.fd.as_fd(), a.bits()).map_err(
            |errno| LandlockError::AddRule {
                path: r.path.clone(),
                errno,
            },
        )?;
    }
    Ok(())
}

/// Build the ruleset in the calling (daemon) process and return its fd. `required`: fail
/// instead of silently dropping rights the kernel does not know.
/// The paths are opened with [`Opener::new`] without a `beneath` directory: every
/// non-baseline path is resolved from `/` without following links.
pub fn build(plan: &Plan, required: bool) -> Result<Option<OwnedFd>, LandlockError> {
    build_with(plan, required, &Opener::new(Vec::new()))
}

/// [`build`] with the paths opened by `opener`.
pub fn build_with(
    plan: &Plan,
    required: bool,
    opener: &Opener<'_>,
) -> Result<Option<OwnedFd>, LandlockError> {
    build_inner(plan, required, opener, None)
}

/// [`build_with`], and what each path was bound to: kept fds, objects beneath the opener's
/// directories (one `fstat` each), paths resolved afresh and paths that did not exist.
pub fn build_bound(
    plan: &Plan,
    required: bool,
    opener: &Opener<'_>,
) -> Result<(Option<OwnedFd>, Vec<Bound>), LandlockError> {
    let mut bound = Vec::new();
    let fd = build_inner(plan, required, opener, Some(&mut bound))?;
    Ok((fd, bound))
}

fn build_inner(
    plan: &Plan,
    required: bool,
    opener: &Opener<'_>,
    record: Option<&mut Vec<Bound>>,
) -> Result<Option<OwnedFd>, LandlockError> {
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
    let mut fs_all = AccessFs::from_all(abi);
    // Not `from_read`: in the crate that includes Execute.
    let read = AccessFs::ReadFile | AccessFs::ReadDir;
    let mut write = AccessFs::from_write(abi);
    // Pathname Unix sockets, where the kernel can confine them (ABI 9), whatever `required`
    // says (older kernels: reported by `agentosd check` and in the agent's notes). A write
    // grant includes them, as in Landlock's own grouping of the rights.
    let unix = landlock_handles_unix(kernel_abi());
    if unix {
        fs_all |= AccessFs::ResolveUnix;
        write |= AccessFs::ResolveUnix;
    }
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
    // Open every path before the ruleset exists: a scope that does not resolve safely fails
    // the start with its name.
    let mut checked = Checked::default();
    let mut missing = Vec::new();
    let (ck, miss) = (&mut checked, &mut missing);
    let mut fs_rules = rules(
        opener,
        &plan.read_exec,
        read | AccessFs::Execute,
        abi,
        ck,
        miss,
    )?;
    fs_rules.extend(rules(opener, &plan.read, read, abi, ck, miss)?);
    fs_rules.extend(rules(
        opener,
        &plan.read_write,
        read | write,
        abi,
        ck,
        miss,
    )?);
    if unix {
        let to_sockets = BitFlags::from(AccessFs::ResolveUnix);
        fs_rules.extend(rules(opener, &plan.unix, to_sockets, abi, ck, miss)?);
    }
    let mut created = rs.create()?;
    for p in plan.connect.iter().flatten() {
        created = created.add_rule(NetPort::new(*p, AccessNet::ConnectTcp))?;
    }
    for p in plan.bind.iter().flatten() {
        created = created.add_rule(NetPort::new(*p, AccessNet::BindTcp))?;
    }
    // No ruleset: no Landlock here and best effort (the crate refused it when required).
    let fd: Option<OwnedFd> = created.into();
    if let Some(fd) = &fd {
        // The path rules directly, not through the crate's `PathBeneath`: it `fstat`s every fd
        // to tell files from directories, which the daemon already knows (≈ 1 µs a rule).
        add_fs_rules(fd, &fs_rules, handled_fs(fs_all, kernel_abi()))?;
    }
    if let Some(out) = record {
        out.extend(fs_rules.into_iter().map(|r| match r.fd {
            RuleFd::Shared(entry) => Bound::Kept {
                path: r.path,
                entry,
            },
            RuleFd::Own(fd) if opener.beneath_of(&r.path).is_some() => {
                match rustix::fs::fstat(&fd) {
                    Ok(st) => Bound::Beneath {
                        path: r.path,
                        dev: st.st_dev,
                        ino: st.st_ino,
                    },
                    Err(_) => Bound::Fresh(r.path),
                }
            }
            RuleFd::Own(_) => Bound::Fresh(r.path),
        }));
        out.extend(missing.into_iter().map(Bound::Missing));
    }
    Ok(fd)
}

/// The first Landlock ABI with `LANDLOCK_ACCESS_FS_RESOLVE_UNIX` (Linux 7.1): connecting and
/// sending to pathname Unix sockets become a filesystem right.
pub const RESOLVE_UNIX_ABI: u32 = 9;

/// Whether a kernel of Landlock ABI `abi` confines connecting to pathname Unix sockets.
pub fn resolve_unix(abi: Option<u32>) -> bool {
    abi.is_some_and(|v| v >= RESOLVE_UNIX_ABI)
}

/// Set by `agentosd --no-landlock-unix`: Landlock does not handle `RESOLVE_UNIX` even where the
/// kernel has it, and the BPF LSM fence (enforce/fs/unix.rs) alone confines pathname Unix
/// sockets. The daemon refuses the option when that fence is not active.
static LANDLOCK_UNIX_OFF: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// `--no-landlock-unix` (once, at daemon start).
pub fn set_landlock_unix_off(off: bool) {
    LANDLOCK_UNIX_OFF.store(off, std::sync::atomic::Ordering::Relaxed);
}

/// Whether `--no-landlock-unix` is in force.
pub fn landlock_unix_off() -> bool {
    LANDLOCK_UNIX_OFF.load(std::sync::atomic::Ordering::Relaxed)
}

/// Whether the agents' rulesets handle `RESOLVE_UNIX` on a kernel of Landlock ABI `abi`: the
/// kernel has it and `--no-landlock-unix` is not given.
pub fn landlock_handles_unix(abi: Option<u32>) -> bool {
    resolve_unix(abi) && !landlock_unix_off()
}

/// The kernel's Landlock ABI version (`landlock_create_ruleset(NULL, 0, VERSION)`), or `None`.
/// Asked once: it does not change while the system runs (and every start asks).
pub fn kernel_abi() -> Option<u32> {
    static ABI_VERSION: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    *ABI_VERSION.get_or_init(|| crate::sys::landlock::abi_version().ok().filter(|v| *v > 0))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    #[test]
    fn ports_of_checked_scopes() {
        assert_eq!(scope_port("https://api.example.test").unwrap(), Some(443));
        assert_eq!(scope_port("http://api.example.test").unwrap(), Some(80));
        assert_eq!(
            scope_port("https://*.example.test:8443").unwrap(),
            Some(8443)
        );
        assert!(scope_port("https://10.0.0.1").is_err());
    }

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
    fn scopes_under_the_home_and_absolute_scopes_follow_no_link() {
        let state = tempfile::tempdir().unwrap();
        let root = crate::safe_fs::Dir::open_root(state.path()).unwrap();
        let home = root.mkdir("home", 0o700).unwrap();
        std::fs::create_dir(home.path().join("sub")).unwrap();
        std::os::unix::fs::symlink("/etc", home.path().join("link")).unwrap();
        let o = Opener::new(vec![&home]);
        let real = |p: &Path| o.open(p).map(|r| r.map(|(_, p)| p));
        assert_eq!(
            real(&home.path().join("sub")).unwrap(),
            Some(home.path().join("sub"))
        );
        assert_eq!(real(&home.path().join("missing")).unwrap(), None);
        let e = real(&home.path().join("link/passwd")).unwrap_err();
        assert!(
            e.to_string().contains("is a symbolic link (to /etc)"),
            "{e}"
        );
        // The same path resolved from `/` (no `beneath`): refused as well.
        let e = Opener::new(Vec::new())
            .open(&home.path().join("link"))
            .unwrap_err();
        assert!(e.to_string().contains("link"), "{e}");
        assert_eq!(o.resolve(&home.path().join("link")), None);
    }

    /// `path` opened for reading and for writing (each `Ok` or the errno) in a thread that first
    /// restricts itself with `ruleset` (Landlock confines the calling thread and its children
    /// only: the test process is untouched).
    pub(in crate::sandbox) fn tries_under(
        ruleset: &OwnedFd,
        paths: &[PathBuf],
    ) -> Vec<(Result<(), i32>, Result<(), i32>)> {
        use std::os::fd::AsRawFd;
        let fd = ruleset.as_raw_fd();
        let paths = paths.to_vec();
        std::thread::scope(|s| {
            s.spawn(move || {
                // SAFETY: no_new_privs and a Landlock domain for this (test) thread alone,
                // which ends right after; `fd` is a ruleset fd open for the whole scope.
                unsafe {
                    assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
                    assert_eq!(crate::sys::landlock::restrict_self(fd, 0), 0);
                }
                let err = |r: std::io::Result<std::fs::File>| {
                    r.map(drop).map_err(|e| e.raw_os_error().unwrap_or(0))
                };
                paths
                    .iter()
                    .map(|p| {
                        let w = std::fs::OpenOptions::new().append(true).open(p);
                        (err(std::fs::File::open(p)), err(w))
                    })
                    .collect()
            })
            .join()
            .unwrap()
        })
    }

    /// A file scope gets file rights only (else the kernel refuses the rule: the start fails),
    /// a directory scope everything granted, whether the fd is fresh or kept in the path cache
    /// (whose recorded type then replaces an `fstat`): both build, and enforce what they say.
    #[test]
    fn file_and_directory_scopes_build_and_enforce() {
        if kernel_abi().is_none() {
            eprintln!("file_and_directory_scopes_build_and_enforce: skipped: no Landlock");
            return;
        }
        // Under /run (root's alone) the host paths are kept in the cache; elsewhere (not root)
        // they are opened afresh on each build.
        let root = rustix::process::geteuid().is_root();
        let t = if root {
            tempfile::Builder::new()
                .prefix("agentos-llrules-")
                .tempdir_in("/run")
        } else {
            tempfile::tempdir()
        }
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let kept =
            root && safe_fs::resolve_trusted_walk(t.path()).is_ok_and(|(_, _, w)| w.root_only());
        let p = |s: &str| t.path().join(s);
        std::fs::create_dir_all(p("files")).unwrap();
        std::fs::create_dir_all(p("tree/sub")).unwrap();
        for f in [
            "files/rw",
            "files/ro",
            "files/x",
            "files/sibling",
            "tree/sub/f",
            "outside",
        ] {
            std::fs::write(p(f), b"x").unwrap();
        }
        let plan = Plan {
            read: vec![p("files/ro"), p("tree")],
            read_exec: vec![p("files/x")],
            read_write: vec![p("files/rw")],
            ..Default::default()
        };
        for cache in [None, Some(PathCache::new(true))] {
            let o = Opener {
                beneath: vec![],
                system: vec![],
                cache: cache.as_ref(),
            };
            // Twice: the second build takes the kept fds (and their type) from the cache.
            build_with(&plan, false, &o).unwrap().expect("a ruleset");
            let rs = build_with(&plan, true, &o).unwrap().expect("a ruleset");
            if let (Some(c), true) = (&cache, kept) {
                let st = c.stats();
                assert_eq!((st.stored, st.hits), (4, 4), "{st:?}");
            }
            let got = tries_under(
                &rs,
                &[
                    p("files/rw"),
                    p("files/ro"),
                    p("files/x"),
                    p("tree/sub/f"),
                    p("files/sibling"),
                    p("outside"),
                ],
            );
            let eacces = Err(libc::EACCES);
            assert_eq!(
                got,
                vec![
                    (Ok(()), Ok(())),
                    (Ok(()), eacces),
                    (Ok(()), eacces),
                    (Ok(()), eacces),
                    (eacces, eacces),
                    (eacces, eacces),
                ],
                "cache: {}",
                cache.is_some()
            );
        }
    }

    #[test]
    fn handled_rights_follow_the_kernel_abi() {
        let all = AccessFs::from_all(TARGET_ABI) | AccessFs::ResolveUnix;
        assert!(handled_fs(all, None).is_empty());
        assert_eq!(handled_fs(all, Some(1)), AccessFs::from_all(ABI::V1));
        assert!(!handled_fs(all, Some(1)).contains(AccessFs::Refer));
        assert_eq!(handled_fs(all, Some(6)), AccessFs::from_all(ABI::V6));
        assert_eq!(handled_fs(all, Some(99)), all);
        let rw = AccessFs::ReadFile | AccessFs::ReadDir | AccessFs::from_write(TARGET_ABI);
        assert_eq!(
            rule_access(rw, false, TARGET_ABI),
            AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::Truncate | AccessFs::IoctlDev
        );
        assert_eq!(rule_access(rw, true, TARGET_ABI), rw);
    }

    #[test]
    fn audit_logging_only_where_the_kernel_knows_the_flag() {
        assert_eq!(restrict_flags_for(None), 0);
        assert_eq!(restrict_flags_for(Some(6)), 0);
        assert_eq!(restrict_flags_for(Some(7)), RESTRICT_SELF_LOG_NEW_EXEC_ON);
    }
}
