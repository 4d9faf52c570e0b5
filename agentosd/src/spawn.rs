//! Start an agent's main process directly inside its cgroup: `clone3(CLONE_INTO_CGROUP |
//! CLONE_PIDFD)`, with its own IPC and (without network grants) network namespace
//! (`sandbox::Namespaces`), then in the child `setsid`, stdio onto the log file, every other fd
//! close-on-exec, the latency class's
//! policy (`SCHED_IDLE` or `SCHED_DEADLINE`, see `sched.rs`),
//! `chdir`, `execve`. An exec failure is reported to the parent over a CLOEXEC pipe, so "command
//! not found" reaches the operator instead of a silent exit 127.

use std::ffi::CString;
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::sys::SyscallError;
use crate::sys::clone::{CLONE_INTO_CGROUP, CLONE_PIDFD, CloneArgs, clone3, close_range_cloexec};

/// The `clone3` namespace flags for an agent's [`crate::sandbox::Namespaces`].
pub fn namespace_flags(ns: crate::sandbox::Namespaces) -> u64 {
    let mut f = 0;
    if ns.ipc {
        f |= libc::CLONE_NEWIPC as u64;
    }
    if ns.net {
        f |= libc::CLONE_NEWNET as u64;
    }
    f
}

#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("command {command:?} not found in PATH {path}")]
    NotFound { command: String, path: String },
    #[error("invalid {what}: contains a NUL byte")]
    Nul { what: &'static str },
    #[error("open log file {path}: {source}")]
    Log {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Syscall(#[from] SyscallError),
    #[error(transparent)]
    Cgroup(#[from] crate::cgroup::CgroupError),
    #[error("{stage} {target}: {source}")]
    Child {
        stage: &'static str,
        target: String,
        #[source]
        source: io::Error,
    },
}

/// Everything the child needs, prepared before clone3 (the child must not allocate).
pub struct Command {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    /// Standard output (and standard error unless `err_file`), opened O_APPEND.
    pub log_file: PathBuf,
    /// Standard error, when it goes to a file of its own.
    pub err_file: Option<PathBuf>,
    /// The agent's sandbox (uid, capabilities, Landlock, seccomp), applied last before execve.
    pub sandbox: Option<crate::sandbox::PreparedSandbox>,
    /// Scheduling policy the child takes before execve (the latency class).
    pub sched: crate::sched::ChildSched,
    /// One descriptor the program keeps across execve at its current number (the agent's
    /// connected MCP socket, announced in `AGENTOS_SOCKET_FD`); every other fd from 3 up is
    /// closed.
    pub inherit_fd: Option<OwnedFd>,
}

/// A started process: its PID and a pidfd that stays valid after it exits.
pub struct Child {
    pub pid: u32,
    pub pidfd: OwnedFd,
    /// Its socket broker (`sandbox::sockets`), a child of the daemon the caller reaps.
    pub broker: Option<Box<Child>>,
}

/// Find `cmd` in `path` (colon-separated) unless it contains a slash.
pub fn resolve_command(cmd: &str, path: &str) -> Result<PathBuf, SpawnError> {
    if cmd.contains('/') {
        return Ok(PathBuf::from(cmd));
    }
    for dir in path.split(':').filter(|d| !d.is_empty()) {
        let cand = Path::new(dir).join(cmd);
        if is_executable(&cand) {
            return Ok(cand);
        }
    }
    Err(SpawnError::NotFound {
        command: cmd.to_string(),
        path: path.to_string(),
    })
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

fn cstr(bytes: &[u8], what: &'static str) -> Result<CString, SpawnError> {
    CString::new(bytes).map_err(|_| SpawnError::Nul { what })
}

/// Open (create) the log file for appending; it survives daemon restarts because the child owns
/// its own descriptor.
pub fn open_log(path: &Path) -> Result<OwnedFd, SpawnError> {
    // In the daemon's own log directory, never through a link (safe_fs).
    crate::safe_fs::open_append(path, 0o640).map_err(|e| SpawnError::Log {
        path: path.to_path_buf(),
        source: std::io::Error::other(e),
    })
}

/// The agent writes its stdout/stderr files itself (it holds them open across daemon restarts):
/// they belong to its uid, so what it writes counts against its disk quota (storage/quota.rs)
/// like its home does, instead of against root's, which no quota bounds. The group stays the
/// daemon's and the mode is set back to 0640 at every start (an owner may chmod its file); the
/// directory above is the daemon's, so the agent reaches the file only through the descriptor
/// it inherits, and the file is outside every exec grant.
fn charge_log_to(fd: &OwnedFd, uid: u32, path: &Path) -> Result<(), SpawnError> {
    let err = |what: String| SpawnError::Log {
        path: path.to_path_buf(),
        source: std::io::Error::other(what),
    };
    rustix::fs::fchown(fd, Some(rustix::fs::Uid::from_raw(uid)), None)
        .map_err(|e| err(format!("fchown to the agent's uid {uid}: {e}")))?;
    rustix::fs::fchmod(fd, rustix::fs::Mode::from_raw_mode(0o640))
        .map_err(|e| err(format!("fchmod 0640: {e}")))
}

/// Start `cmd` inside the cgroup whose directory fd is `cgroup_dir`. Blocks until the child has
/// exec'd (or failed to): call it from a blocking thread.
pub fn spawn(cmd: &Command, cgroup_dir: &OwnedFd) -> Result<Child, SpawnError> {
    spawn_with_stdio(cmd, cgroup_dir, None)
}

/// The child's standard input, output and error (dup2'ed onto 0, 1, 2 in the child), instead of
/// /dev/null and `Command::log_file`: the tool runners talk to their processes over pipes.
#[derive(Clone, Copy)]
pub struct Stdio<'a> {
    pub stdin: BorrowedFd<'a>,
    pub stdout: BorrowedFd<'a>,
    pub stderr: BorrowedFd<'a>,
}

/// [`spawn`] with the child's stdio given by the caller; `None` is exactly [`spawn`]
/// (/dev/null and `cmd.log_file`, which is then not opened).
pub fn spawn_with_stdio(
    cmd: &Command,
    cgroup_dir: &OwnedFd,
    stdio: Option<Stdio<'_>>,
) -> Result<Child, SpawnError> {
    let program = cstr(cmd.program.as_os_str().as_bytes(), "command")?;
    let mut argv_c = vec![program.clone()];
    for a in &cmd.args {
        argv_c.push(cstr(a.as_bytes(), "argument")?);
    }
    let mut env_c = Vec::new();
    for (k, v) in &cmd.env {
        env_c.push(cstr(format!("{k}={v}").as_bytes(), "environment")?);
    }
    let cwd = cstr(cmd.cwd.as_os_str().as_bytes(), "working directory")?;
    let mut argv: Vec<*const libc::c_char> = argv_c.iter().map(|c| c.as_ptr()).collect();
    argv.push(std::ptr::null());
    let mut envp: Vec<*const libc::c_char> = env_c.iter().map(|c| c.as_ptr()).collect();
    envp.push(std::ptr::null());

    let log = match stdio {
        Some(_) => None,
        None => Some(open_log(&cmd.log_file)?),
    };
    let err_log = match (&stdio, &cmd.err_file) {
        (None, Some(p)) => Some(open_log(p)?),
        _ => None,
    };
    if let Some(sb) = cmd.sandbox.as_ref() {
        let err_path = cmd.err_file.as_ref().unwrap_or(&cmd.log_file);
        for (fd, path) in [(&log, &cmd.log_file), (&err_log, err_path)] {
            if let Some(fd) = fd {
                charge_log_to(fd, sb.uid, path)?;
            }
        }
    }
    let devnull = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map_err(|e| SyscallError::new("open", "/dev/null", e))?;
    let (rd, wr) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| SyscallError::new("pipe2", "exec status pipe", e.into()))?;
    // The socket broker's listener comes back on this pair (sandbox/sockets.rs).
    let handover = match cmd.sandbox.as_ref() {
        Some(sb) if sb.namespaces.brokered() => Some(crate::sandbox::sockets::handover_pair()?),
        _ => None,
    };

    // SAFETY: sigset_t is plain data; sigemptyset initialises it.
    let mut empty: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `empty` is a valid sigset_t owned by this frame.
    unsafe { libc::sigemptyset(&mut empty) };

    let sandbox = cmd.sandbox.as_ref();
    let mut pidfd: libc::c_int = -1;
    // The agent's own namespaces (IPC always, network without a network grant) are made by
    // the same clone3: the daemon is root, the child has them before it drops anything.
    // A network or IPC namespace made for it beforehand (the model gateway's, or one of
    // netns_pool's) is joined with setns in the child instead (sandbox.rs).
    let ns_flags = sandbox.map_or(0, |sb| {
        let mut f = namespace_flags(sb.namespaces);
        if sb.netns.is_some() {
            f &= !(libc::CLONE_NEWNET as u64);
        }
        if sb.ipcns.is_some() {
            f &= !(libc::CLONE_NEWIPC as u64);
        }
        f
    });
    let mut args = CloneArgs {
        flags: CLONE_PIDFD | CLONE_INTO_CGROUP | ns_flags,
        pidfd: &mut pidfd as *mut libc::c_int as u64,
        exit_signal: libc::SIGCHLD as u64,
        cgroup: cgroup_dir.as_raw_fd() as u64,
        ..Default::default()
    };
    let keep_fd = cmd.inherit_fd.as_ref().map_or(-1, |f| f.as_raw_fd());
    let (stdin_fd, stdout_fd, stderr_fd) = match (stdio, log.as_ref()) {
        (Some(s), _) => (
            s.stdin.as_raw_fd(),
            s.stdout.as_raw_fd(),
            s.stderr.as_raw_fd(),
        ),
        (None, Some(l)) => (
            devnull.as_raw_fd(),
            l.as_raw_fd(),
            err_log.as_ref().unwrap_or(l).as_raw_fd(),
        ),
        (None, None) => (
            devnull.as_raw_fd(),
            devnull.as_raw_fd(),
            devnull.as_raw_fd(),
        ),
    };
    let setup = ChildSetup {
        stdio: [stdin_fd, stdout_fd, stderr_fd],
        status_fd: wr.as_raw_fd(),
        keep_fd,
        sigmask: empty,
        sched: cmd.sched,
        cwd: cwd.as_ptr(),
        program: program.as_ptr(),
        argv: argv.as_ptr(),
        envp: envp.as_ptr(),
        sandbox,
        handover: handover.as_ref().map_or(-1, |(child, _)| child.as_raw_fd()),
        // Read here, on the thread that clones: the child's credentials are this thread's.
        bounding_set_empty: sandbox.is_some() && crate::sandbox::bounding::this_thread_is_empty(),
    };

    let ret = if vfork() {
        let stack = crate::sys::vfork::ChildStack::new()
            .map_err(|e| SyscallError::new("mmap", "the child's stack", e))?;
        let _blocked = crate::sys::vfork::SignalsBlocked::new();
        // SAFETY: `args` is a valid clone_args whose `pidfd` outlives the call; `setup` and
        // everything it points to live in this frame, which CLONE_VFORK keeps suspended until
        // the child has exec'd or exited. `vfork_child` keeps sys::vfork's rules: it writes
        // only to its own stack (and errno), resets the handlers before unblocking signals
        // (all blocked here), and its credential calls are raw per-thread system calls.
        unsafe {
            crate::sys::vfork::clone3_vfork(
                &mut args,
                &stack,
                vfork_child,
                &setup as *const ChildSetup<'_> as *mut libc::c_void,
            )
        }
    } else {
        // SAFETY: clone3 without CLONE_VM behaves like fork(): the child gets a copy of the
        // address space and continues on a copy of this stack. `args` is a valid clone_args of
        // the size passed; `pidfd` outlives the call. The child branch below only makes
        // async-signal-safe system calls on memory prepared before the call (no allocation, no
        // locks) and always ends in execve or _exit, so the multi-threaded parent's state
        // (allocator locks, tokio) is never touched in the child.
        let ret = unsafe { clone3(&mut args) };
        if ret == 0 {
            // SAFETY: we are the child between clone3 and execve; `setup` points at memory
            // prepared before the clone (see the comment above).
            unsafe { exec_child(&setup) }
        }
        ret
    };
    if ret < 0 {
        let e = io::Error::last_os_error();
        return Err(SyscallError::new("clone3", clone_target(ns_flags, &cmd.program), e).into());
    }
    drop(wr);
    // SAFETY: with CLONE_PIDFD the kernel stored a new pidfd in `pidfd`; we own it now.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    let pid = ret as u32;

    let started = wait_exec(
        rd,
        Child {
            pid,
            pidfd,
            broker: None,
        },
        cmd,
    )
    .and_then(|mut child| {
        if let (Some((child_end, ours)), Some(sb)) = (handover, sandbox) {
            drop(child_end);
            child.broker = Some(Box::new(start_broker(&child, &ours, sb, cgroup_dir)?));
        }
        Ok(child)
    });
    // Only now, the child past its execve: a refill woken earlier ran its ≈ 0.5 ms of
    // unpreemptible kernel work during this start (sandbox/netns_pool.rs).
    if sandbox.is_some() {
        crate::sandbox::netns_pool::after_start();
        crate::sandbox::ruleset_pool::after_start();
    }
    started
}

/// Receive the listener the exec'd child sent and start its broker in the same cgroup. On
/// failure the child is killed: without its broker its inet sockets would not work.
fn start_broker(
    child: &Child,
    ours: &OwnedFd,
    sb: &crate::sandbox::PreparedSandbox,
    cgroup_dir: &OwnedFd,
) -> Result<Child, SpawnError> {
    use crate::sandbox::sockets;
    let started = sockets::receive_listener(ours.as_fd())
        .and_then(|listener| sockets::spawn_broker(&listener, sb.uid, sb.gid, cgroup_dir.as_fd()));
    if started.is_err() {
        let _ = crate::sys::pidfd_send_signal(child.pidfd.as_fd(), libc::SIGKILL);
        let _ = crate::sys::pidfd::pidfd_reap(child.pidfd.as_fd());
    }
    Ok(started?)
}

/// What the child needs between clone3 and execve, prepared before the clone: raw fds and
/// pointers into buffers the parent keeps alive until the child has exec'd or failed.
struct ChildSetup<'a> {
    /// Onto 0, 1, 2.
    stdio: [RawFd; 3],
    /// The CLOEXEC pipe the child reports a failure on: `[stage, errno]`.
    status_fd: RawFd,
    /// The one fd kept across execve, or -1.
    keep_fd: RawFd,
    sigmask: libc::sigset_t,
    sched: crate::sched::ChildSched,
    cwd: *const libc::c_char,
    program: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    sandbox: Option<&'a crate::sandbox::PreparedSandbox>,
    /// The child's end of the socket broker's hand-over pair, or -1.
    handover: RawFd,
    /// The spawning thread's capability bounding set is empty (the child's is then too).
    bounding_set_empty: bool,
}

/// The environment switch: `AGENTOSD_SPAWN=fork` makes every start a fork-like `clone3` (the
/// daemon's page tables copied) instead of `CLONE_VM | CLONE_VFORK`, for comparison
/// (`cargo xtask bench sandbox`) or should a kernel refuse the latter.
pub const SPAWN_ENV: &str = "AGENTOSD_SPAWN";

/// Whether starts use [`crate::sys::vfork`] (read once).
fn vfork() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        crate::sys::vfork::AVAILABLE
            && std::env::var(SPAWN_ENV).map_or(true, |v| v.trim() != "fork")
    })
}

/// The child's entry on its own stack after `clone3(CLONE_VM | CLONE_VFORK)`.
///
/// # Safety
/// Only as [`crate::sys::vfork::clone3_vfork`]'s entry, `arg` a `ChildSetup` of the caller's
/// frame, every signal blocked.
unsafe extern "C" fn vfork_child(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: the caller passes a ChildSetup that outlives the child's run (CLONE_VFORK);
    // the handlers are reset while every signal is still blocked, before exec_child unblocks.
    unsafe {
        crate::sys::vfork::reset_signal_handlers();
        exec_child(&*(arg as *const ChildSetup<'_>))
    }
}

/// The child's side: stdio, fds, scheduling, cwd, sandbox, execve. On failure it writes the
/// stage and errno to the status pipe and exits 127.
///
/// # Safety
/// Call only in the child of clone3 (fork semantics, or `CLONE_VM | CLONE_VFORK` through
/// [`vfork_child`]), with `c` built before the clone. Only async-signal-safe calls on that
/// pre-built data: no allocation, no locks, no writes but to its own stack.
unsafe fn exec_child(c: &ChildSetup<'_>) -> ! {
    let sched_param = libc::sched_param { sched_priority: 0 };
    let [stdin_fd, stdout_fd, stderr_fd] = c.stdio;
    // SAFETY: only async-signal-safe calls on pre-built data; see the function's contract.
    unsafe {
        libc::sigprocmask(libc::SIG_SETMASK, &c.sigmask, std::ptr::null_mut());
        // Rust's runtime ignores SIGPIPE; agents expect the default.
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        libc::setsid();
        let mut stage: i32 = 1;
        let mut ok = libc::dup2(stdin_fd, 0) >= 0
            && libc::dup2(stdout_fd, 1) >= 0
            && libc::dup2(stderr_fd, 2) >= 0;
        if ok {
            // Nothing but stdio crosses the exec, whatever the daemon itself inherited
            // without CLOEXEC: every fd from 3 up is closed by execve (the status pipe
            // and the Landlock ruleset stay usable until then).
            stage = 6;
            ok = close_range_cloexec(3) == 0;
            if ok {
                // The open-file limit the daemon was started with, not the one it raised.
                stage = 7;
                ok = crate::sys::rlimit::restore_nofile_in_child() == 0;
            }
            if ok && c.keep_fd >= 0 {
                ok = libc::fcntl(c.keep_fd, libc::F_SETFD, 0) == 0;
            }
        }
        match c.sched {
            crate::sched::ChildSched::None => {}
            crate::sched::ChildSched::Idle if ok => {
                stage = 2;
                ok = libc::sched_setscheduler(0, libc::SCHED_IDLE, &sched_param) == 0;
            }
            crate::sched::ChildSched::Deadline(ref attr) if ok => {
                // Deadline tasks may exec but not fork; see sched.rs.
                stage = 5;
                ok = crate::sys::sched::raw_sched_setattr(0, attr) == 0;
            }
            crate::sched::ChildSched::Nice(n) if ok => {
                stage = 8;
                ok = libc::setpriority(libc::PRIO_PROCESS, 0, n) == 0;
            }
            _ => {}
        }
        if ok {
            stage = 3;
            ok = libc::chdir(c.cwd) == 0;
        }
        if ok && let Some(sb) = c.sandbox {
            // SAFETY: we are the child between clone3 and execve.
            if let Err(st) = sb.apply_in_child(c.bounding_set_empty) {
                stage = st;
                ok = false;
            }
            // Last: from here on the child's own inet socket() calls would wait for a broker.
            if ok && c.handover >= 0 {
                stage = crate::sandbox::sockets::STAGE_BROKER;
                ok = crate::sandbox::sockets::hand_over_listener(c.handover, &sb.notify) == 0;
            }
        }
        if ok {
            stage = 4;
            libc::execve(c.program, c.argv, c.envp);
        }
        let err = *libc::__errno_location();
        let msg: [i32; 2] = [stage, err];
        libc::write(c.status_fd, msg.as_ptr() as *const libc::c_void, 8);
        libc::_exit(127)
    }
}

/// `CLONE_INTO_CGROUP | CLONE_NEWIPC for /usr/bin/agent`: what a failed clone3 tried.
fn clone_target(ns_flags: u64, program: &Path) -> String {
    format!(
        "CLONE_INTO_CGROUP{}{} for {}",
        if ns_flags & libc::CLONE_NEWIPC as u64 != 0 {
            " | CLONE_NEWIPC"
        } else {
            ""
        },
        if ns_flags & libc::CLONE_NEWNET as u64 != 0 {
            " | CLONE_NEWNET"
        } else {
            ""
        },
        program.display()
    )
}

/// The parent's side after clone3: EOF on the status pipe means the child exec'd; otherwise
/// reap it and name the stage that failed.
fn wait_exec(rd: OwnedFd, child: Child, cmd: &Command) -> Result<Child, SpawnError> {
    let mut buf = [0u8; 8];
    let mut file = std::fs::File::from(rd);
    let mut got = 0;
    while got < 8 {
        match file.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(SyscallError::new("read", "exec status pipe", e).into()),
        }
    }
    if got == 0 {
        return Ok(child);
    }
    let stage = i32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]);
    let errno = i32::from_ne_bytes([buf[4], buf[5], buf[6], buf[7]]);
    // Reap the failed child (it _exit()s right after writing); the stage and errno are the news.
    let _ = crate::sys::pidfd::pidfd_reap(child.pidfd.as_fd());
    let program = cmd.program.display().to_string();
    let (stage, target) = match stage {
        1 => ("redirect stdio to", cmd.log_file.display().to_string()),
        2 => ("sched_setscheduler(SCHED_IDLE) for", program),
        3 => ("chdir to", cmd.cwd.display().to_string()),
        5 => ("sched_setattr(SCHED_DEADLINE) for", program),
        8 => ("setpriority(nice) for", program),
        6 => ("close_range(3, ~0, CLOSE_RANGE_CLOEXEC) for", program),
        7 => (
            "setrlimit(RLIMIT_NOFILE) back to the daemon's inherited limit for",
            program,
        ),
        s => (crate::sandbox::stage_name(s).unwrap_or("execve"), program),
    };
    Err(SpawnError::Child {
        stage,
        target,
        source: io::Error::from_raw_os_error(errno),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::Namespaces;

    /// A child that cannot chdir reports the stage and errno over the status pipe, and the
    /// parent reaps it (`wait_exec`). Needs to clone into its own cgroup2 cgroup; skips if not.
    #[test]
    fn a_failed_exec_names_its_stage() {
        let Some(dir) = crate::cgroup::open_own_cgroup2() else {
            eprintln!("skip: no cgroup2 mount or membership, or its directory cannot be opened");
            return;
        };
        let logs = tempfile::tempdir().expect("tempdir");
        let cmd = Command {
            program: "/bin/true".into(),
            args: Vec::new(),
            env: Vec::new(),
            cwd: "/nonexistent/agentos-spawn-test".into(),
            log_file: logs.path().join("log"),
            err_file: None,
            sandbox: None,
            sched: crate::sched::ChildSched::None,
            inherit_fd: None,
        };
        match spawn(&cmd, &OwnedFd::from(dir)) {
            Err(SpawnError::Child { stage, source, .. }) => {
                assert_eq!(stage, "chdir to");
                assert_eq!(source.raw_os_error(), Some(libc::ENOENT));
            }
            Err(SpawnError::Syscall(e)) => eprintln!("skip: {e}"),
            Err(e) => panic!("expected a chdir failure, got {e}"),
            Ok(c) => panic!("a child without a working directory ran (pid {})", c.pid),
        }
    }

    /// A sandboxed child's capability bounding set is empty whether the thread that spawned
    /// it had a full one (the child drops it, one `prctl` per capability) or an empty one (the
    /// daemon's threads, sandbox/bounding.rs: the child inherits it and skips the loop).
    #[test]
    fn a_sandboxed_child_has_an_empty_bounding_set_from_either_thread() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skip: a sandboxed start needs root");
            return;
        }
        let Some(dir) = crate::cgroup::open_own_cgroup2() else {
            eprintln!("skip: no cgroup2 mount or membership, or its directory cannot be opened");
            return;
        };
        let dir = OwnedFd::from(dir);
        let tmp = tempfile::tempdir().expect("tempdir");
        let state = tmp.path().join("state");
        let contract = contracts::parse_contract(
            "apiVersion: agentos/v0.2\nkind: AgentContract\nname: bset\ntenant: test\n\
             exec: { command: /bin/cat }\n",
            "bset.yaml",
        )
        .expect("contract");
        let _serial = crate::sandbox::netns_pool::TEST_LOCK
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        for emptied in [false, true] {
            let status = std::thread::scope(|s| {
                s.spawn(|| {
                    if emptied {
                        crate::sandbox::bounding::empty_this_thread().expect("empty");
                    }
                    assert_eq!(crate::sandbox::bounding::this_thread_is_empty(), emptied);
                    let sb = crate::sandbox::prepare(&state, "test", "bset", Some(&contract))
                        .expect("prepare");
                    let log = tmp.path().join(format!("status-{emptied}"));
                    let cmd = Command {
                        program: "/bin/cat".into(),
                        args: vec!["/proc/self/status".into()],
                        env: Vec::new(),
                        cwd: "/".into(),
                        log_file: log.clone(),
                        err_file: None,
                        sandbox: Some(sb),
                        sched: crate::sched::ChildSched::None,
                        inherit_fd: None,
                    };
                    let child = spawn(&cmd, &dir).expect("spawn");
                    let mut st = 0;
                    // SAFETY: waiting for our own child; `st` is writable.
                    let r = unsafe { libc::waitpid(child.pid as libc::pid_t, &mut st, 0) };
                    assert_eq!(r, child.pid as libc::pid_t);
                    assert_eq!(st, 0, "cat exited with {st:#x}");
                    std::fs::read_to_string(log).expect("the child's output")
                })
                .join()
                .expect("the spawning thread")
            });
            let field = |k: &str| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix(k))
                    .map(|v| v.trim().to_string())
                    .unwrap_or_else(|| panic!("no {k} in {status}"))
            };
            for k in ["CapBnd:", "CapEff:", "CapPrm:", "CapInh:", "CapAmb:"] {
                assert_eq!(
                    field(k),
                    "0000000000000000",
                    "{k}, thread emptied: {emptied}"
                );
            }
            assert_ne!(field("Uid:").split_whitespace().next(), Some("0"));
        }
    }

    #[test]
    fn namespace_flags_follow_the_sandbox() {
        let f = |ipc, net| {
            namespace_flags(Namespaces {
                ipc,
                net,
                broker: false,
            })
        };
        assert_eq!(f(false, false), 0);
        assert_eq!(f(true, false), libc::CLONE_NEWIPC as u64);
        assert_eq!(
            f(true, true),
            (libc::CLONE_NEWIPC | libc::CLONE_NEWNET) as u64
        );
        assert_eq!(f(false, true), libc::CLONE_NEWNET as u64);
    }

    #[test]
    fn own_network_namespace_always_and_a_broker_with_network_grants() {
        use crate::sandbox::Grants;
        let none = Grants::default();
        assert_eq!(
            Namespaces::for_grants(&none),
            Namespaces {
                ipc: true,
                net: true,
                broker: false,
            }
        );
        let connect = Grants {
            net_connect: vec!["127.0.0.1:443".into()],
            ..Grants::default()
        };
        let bind = Grants {
            net_bind: vec!["127.0.0.1:8080".into()],
            ..Grants::default()
        };
        for g in [connect, bind] {
            let ns = Namespaces::for_grants(&g);
            assert_eq!(
                ns,
                Namespaces {
                    ipc: true,
                    net: true,
                    broker: true,
                }
            );
            assert!(ns.brokered());
        }
    }
}
