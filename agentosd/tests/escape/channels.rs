//! Exec by any route (issue 12, class 2) and cross-agent and host channels (class 5).
//!
//! Who refuses what (docs/security.md, "Exec by any route" and "Channels between agents and
//! the host"):
//! - exec of a file: Landlock's execute right, wherever the file is reached from (a path, an
//!   `O_PATH` fd with `execveat(AT_EMPTY_PATH)`, `/proc/self/fd/N`): `EACCES` outside `fs.exec`
//!   and the base read+execute paths, a writable grant included.
//! - exec of a memfd: Landlock does not check files on kernel-internal mounts (a memfd is one),
//!   so seccomp refuses `memfd_create` without `MFD_NOEXEC_SEAL` or with `MFD_EXEC` (`EPERM`;
//!   the semantics of `vm.memfd_noexec=2`, per agent); a sealed memfd has mode 0666 and
//!   `F_SEAL_EXEC`: `fchmod` `EPERM`, exec `EACCES`.
//! - SysV IPC and POSIX message queues: the agent's own IPC namespace (`ENOENT` for the host's).
//! - abstract Unix sockets of an agent without network grants: its own network namespace
//!   (`ECONNREFUSED` connecting out; a name it binds is not the host's, so a host client's
//!   datagrams never reach it: `EAGAIN` after the wait).
//! - `/dev/shm`: not granted by Landlock (`EACCES`); `fanotify_init`: seccomp (`EPERM`);
//!   `inotify_add_watch`: needs read access to the watched path (DAC, then Landlock).
//! - signals: `kill(-1)` and `pidfd_send_signal` reach no process outside the agent (DAC: its
//!   own uid; Landlock signal scoping, ABI 6).

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::probe::{c, check, errno};
use crate::{Attempt, Caps, Ctx};

const MFD_CLOEXEC: u32 = 0x1;
const MFD_NOEXEC_SEAL: u32 = 0x8;
const MFD_EXEC: u32 = 0x10;

/// Host-side objects the attempts aim at, removed when the suite ends.
struct Fixture {
    shm: Option<i32>,
    sem: Option<i32>,
    msg: Option<i32>,
    mq: Option<String>,
    dev_shm: PathBuf,
    sleeper: std::process::Child,
    stop: Arc<AtomicBool>,
    sender: Option<std::thread::JoinHandle<()>>,
    _listener: std::os::unix::net::UnixListener,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        // SAFETY: removing IPC objects this fixture created, by their ids.
        unsafe {
            if let Some(id) = self.shm {
                libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut());
            }
            if let Some(id) = self.sem {
                libc::semctl(id, 0, libc::IPC_RMID);
            }
            if let Some(id) = self.msg {
                libc::msgctl(id, libc::IPC_RMID, std::ptr::null_mut());
            }
            if let Some(n) = &self.mq {
                libc::mq_unlink(c(n).as_ptr());
            }
        }
        let _ = std::fs::remove_file(&self.dev_shm);
        let _ = self.sleeper.kill();
        let _ = self.sleeper.wait();
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.sender.take() {
            let _ = t.join();
        }
    }
}

/// A SysV key of this run (the test's pid in the low bits).
fn ipc_key(kind: i32) -> libc::key_t {
    (0x4a00_0000 | (kind << 20) | (std::process::id() as i32 & 0xf_ffff)) as libc::key_t
}

/// A world-accessible SysV object made by the host: an agent in the host's IPC namespace could
/// open it (mode 0666), an agent in its own cannot even see it.
fn host_ipc() -> (Option<i32>, Option<i32>, Option<i32>) {
    let flags = libc::IPC_CREAT | libc::IPC_EXCL | 0o666;
    let made = |id: i32, what: &str| {
        if id < 0 {
            println!(
                "skip sysv-{what}-host: the host's object could not be made ({})",
                crate::probe::errno_name(errno())
            );
        }
        (id >= 0).then_some(id)
    };
    // SAFETY: creating a segment of constant size; the id is checked.
    let shm = made(unsafe { libc::shmget(ipc_key(1), 4096, flags) }, "shm");
    // SAFETY: creating a set of one semaphore; the id is checked.
    let sem = made(unsafe { libc::semget(ipc_key(2), 1, flags) }, "sem");
    // SAFETY: creating a message queue; the id is checked.
    let msg = made(unsafe { libc::msgget(ipc_key(3), flags) }, "msg");
    (shm, sem, msg)
}

/// A POSIX message queue of the host, mode 0666; `None` when the kernel has no mqueue.
fn host_mq() -> Option<String> {
    let name = format!("/agentos-escape-{}", std::process::id());
    // SAFETY: mq_open with a NUL-terminated name and default attributes (NULL), under a zero
    // umask so that the queue really is 0666 (restored right after).
    let q = unsafe {
        let old = libc::umask(0);
        let q = libc::mq_open(
            c(&name).as_ptr(),
            libc::O_CREAT | libc::O_RDWR,
            0o666 as libc::mode_t,
            std::ptr::null::<libc::mq_attr>(),
        );
        libc::umask(old);
        q
    };
    if q < 0 {
        println!(
            "skip mq-host: mq_open on the host failed ({}): no POSIX message queues",
            crate::probe::errno_name(errno())
        );
        return None;
    }
    // SAFETY: closing the descriptor just opened (the queue stays until mq_unlink).
    unsafe { libc::mq_close(q) };
    Some(name)
}

/// The attempts of this class and a fixture (IPC objects, sockets, a host process) kept alive
/// while they run.
pub fn attempts(ctx: &Ctx) -> (Vec<Attempt>, Box<dyn std::any::Any>) {
    let pid = std::process::id();
    let (shm, sem, msg) = host_ipc();
    let mq = host_mq();
    // A host file in /dev/shm, readable by all.
    let dev_shm = PathBuf::from(format!("/dev/shm/agentos-escape-{pid}"));
    let _ = std::fs::write(&dev_shm, b"host shm\n");
    let _ = std::fs::set_permissions(&dev_shm, std::fs::Permissions::from_mode(0o666));
    // A host process of the test's own: broadcast and pidfd signals must not reach it.
    let sleeper = std::process::Command::new("/bin/sleep")
        .arg("3600")
        .spawn()
        .unwrap();
    // A host abstract listener (connect target) and a host client of an abstract datagram
    // service `squat` that does not run: whoever binds that name gets its messages.
    let listen_name = format!("agentos-escape-ch-{pid}");
    let listener = {
        use std::os::linux::net::SocketAddrExt;
        let a = std::os::unix::net::SocketAddr::from_abstract_name(listen_name.as_bytes()).unwrap();
        std::os::unix::net::UnixListener::bind_addr(&a).unwrap()
    };
    let squat = format!("agentos-escape-squat-{pid}");
    let stop = Arc::new(AtomicBool::new(false));
    let sender = {
        let (stop, squat) = (stop.clone(), squat.clone());
        std::thread::spawn(move || {
            use std::os::linux::net::SocketAddrExt;
            let s = std::os::unix::net::UnixDatagram::unbound().unwrap();
            let a = std::os::unix::net::SocketAddr::from_abstract_name(squat.as_bytes()).unwrap();
            while !stop.load(Ordering::Relaxed) {
                let _ = s.send_to_addr(b"host secret for the squat service", &a);
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        })
    };
    let victim_home = ctx.state.join("home/escape/victim").display().to_string();
    let wgrant = ctx
        .fs_caps
        .lines()
        .find_map(|l| l.trim().strip_prefix("- fs.write: ["))
        .and_then(|l| l.strip_suffix(']'))
        .unwrap_or_default()
        .to_string();
    let daemon = ctx.daemon_pid.to_string();
    // Whether the daemon's lsm/socket_bind program can be in force here (loaded, not attached).
    let bind_lsm = agentosd::enforce::fs::FsEnforcer::load()
        .map(|f| f.bind_status().is_ok())
        .unwrap_or(false);
    if !bind_lsm {
        println!(
            "note: BPF LSM lsm/socket_bind does not load here: abstract binds are refused by the agents' own network namespaces alone"
        );
    }
    // Whether the daemon's lsm/mmap_file and lsm/file_mprotect programs load here: then a file
    // outside the exec grants cannot be mapped executable (the VM); elsewhere that is the
    // documented gap and the attempts below are expected to get through.
    let exec_map_lsm = agentosd::enforce::fs::FsEnforcer::load()
        .map(|f| f.exec_map_status().is_ok())
        .unwrap_or(false);
    if !exec_map_lsm {
        println!(
            "note: BPF LSM lsm/mmap_file does not load here: loader-runs-home-binary, mmap-exec-home-file and mprotect-exec-home-file are expected to get through"
        );
    }
    let exec_map = |name: &'static str| {
        if exec_map_lsm {
            Attempt::denied(name, vec![], "EACCES", Caps::Standard)
        } else {
            Attempt::allowed(name, vec![], Caps::Standard)
        }
    };
    let host = sleeper.id().to_string();

    let s = |v: &str| vec![v.to_string()];
    let (denied, allowed) = (Attempt::denied, Attempt::allowed);
    use Caps::{NoNet, Standard};
    let mut v = vec![
        // --- class 2: exec by any route
        denied("memfd-exec-proc-fd", vec![], "EPERM", Standard),
        denied("memfd-fexecve", vec![], "EPERM", Standard),
        denied("memfd-mfd-exec", vec![], "EPERM", Standard),
        denied("memfd-sealed-chmod", vec![], "EPERM", Standard),
        denied("memfd-sealed-exec", vec![], "EACCES", Standard),
        denied("execveat-opath-home", vec![], "EACCES", Standard),
        // Its stdout file is its own uid's (its disk quota counts it): it may chmod it, but it
        // is outside every exec grant.
        denied("exec-own-log", vec![], "EACCES", Standard),
        // A write lease on it would make the daemon's next open of it wait for the break.
        denied("lease-own-log", vec![], "EPERM", Standard),
        denied("exec-proc-fd-home", vec![], "EACCES", Standard),
        denied("exec-from-wgrant", s(&wgrant), "EACCES", Standard),
        denied("exec-script-home", vec![], "EACCES", Standard),
        // Controls: a memfd that cannot become executable, anonymous executable memory (JITs),
        // an allowed interpreter reading a script from the home, an allowed exec.
        allowed("memfd-sealed-control", vec![], Standard),
        allowed("mprotect-anon-exec", vec![], Standard),
        allowed("interpreter-reads-script", vec![], Standard),
        allowed("exec-granted-control", vec![], Standard),
        // The dynamic loader, an allowed executable, maps a binary from the home PROT_EXEC;
        // Landlock does not check mmap, BPF LSM's lsm/mmap_file does where it loads (else the
        // documented gap, asserted open so the docs change when it closes); so do a direct
        // executable mapping and an mprotect to executable of a file mapping. Control: mapping
        // a granted binary executable works.
        exec_map("loader-runs-home-binary"),
        exec_map("mmap-exec-home-file"),
        exec_map("mprotect-exec-home-file"),
        allowed("mmap-exec-granted-control", vec![], Standard),
        // --- class 5: channels
        denied("dev-shm-create", vec![], "EACCES", Standard),
        denied(
            "dev-shm-read-host",
            s(&dev_shm.display().to_string()),
            "EACCES",
            Standard,
        ),
        // inotify: Landlock does not check watches (measured: /etc and /tmp were watchable,
        // naming files created there); seccomp makes inotify_init fail with ENOSYS, so
        // programs fall back to polling, in the agent's own home too (the price, documented).
        denied("inotify-other-home", s(&victim_home), "ENOSYS", Standard),
        denied("inotify-etc", s("/etc"), "ENOSYS", Standard),
        denied("inotify-tmp", s("/tmp"), "ENOSYS", Standard),
        denied("inotify-own-home", vec![], "ENOSYS", Standard),
        denied("fanotify-init", vec![], "EPERM", Standard),
        denied("kill-broadcast", s(&host), "EPERM", Standard),
        denied("pidfd-signal-daemon", s(&daemon), "EPERM", Standard),
        denied("pidfd-signal-host", s(&host), "EPERM", Standard),
        denied(
            "abstract-connect-nonet",
            s(&listen_name),
            "ECONNREFUSED",
            NoNet,
        ),
        // In its own network namespace the agent's bind succeeds but nothing of the host's
        // reaches it (EAGAIN); where lsm/socket_bind loads, the bind itself is refused first.
        denied(
            "abstract-squat-nonet",
            s(&squat),
            if bind_lsm { "EPERM" } else { "EAGAIN" },
            NoNet,
        ),
        // An agent with network grants has its own network namespace too (its inet sockets
        // come from its socket broker, sandbox/sockets.rs): the same as without grants.
        denied(
            "abstract-squat-with-net",
            s(&squat),
            if bind_lsm { "EPERM" } else { "EAGAIN" },
            Standard,
        ),
        // Its socket broker runs as its uid, in its cgroup, in the host's network namespace:
        // the agent must not be able to signal it (it would lose its own sockets) nor read its
        // memory (a copy of the daemon's). Found by scanning /proc as the agent would.
        denied("broker-signal", vec![], "EPERM", Standard),
        denied("broker-mem", vec![], "EACCES", Standard),
        allowed("sysv-shm-own", vec![], Standard),
    ];
    if shm.is_some() {
        v.push(denied(
            "sysv-shm-host",
            s(&ipc_key(1).to_string()),
            "ENOENT",
            Standard,
        ));
    }
    if sem.is_some() {
        v.push(denied(
            "sysv-sem-host",
            s(&ipc_key(2).to_string()),
            "ENOENT",
            Standard,
        ));
    }
    if msg.is_some() {
        v.push(denied(
            "sysv-msg-host",
            s(&ipc_key(3).to_string()),
            "ENOENT",
            Standard,
        ));
    }
    if let Some(n) = &mq {
        // ENOENT: not in the agent's IPC namespace. Behind it, Landlock refuses to open any
        // POSIX message queue (EACCES: the mqueue mount is not beneath any rule), the agent's
        // own included: agents cannot use POSIX message queues (docs/security.md).
        v.push(denied("mq-host", s(n), "ENOENT", Standard));
        v.push(denied("mq-own", vec![], "EACCES", Standard));
    }
    let f = Fixture {
        shm,
        sem,
        msg,
        mq,
        dev_shm,
        sleeper,
        stop,
        sender: Some(sender),
        _listener: listener,
    };
    (v, Box::new(f))
}

fn io_err(e: std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

fn arg(args: &[String], i: usize) -> &str {
    args.get(i).map(String::as_str).unwrap_or("")
}

/// Run `exec` (an exec system call) in a forked child: `Err(errno)` when it fails, `Ok` when
/// the program ran (the child exited after a successful exec).
fn fork_exec(exec: impl FnOnce() -> i64) -> Result<String, i32> {
    let mut p = [0i32; 2];
    // SAFETY: pipe2 fills the two-element array.
    if unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(errno());
    }
    // SAFETY: fork in the single-threaded probe; the child only calls `exec`, write and _exit.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        exec();
        let e = errno();
        // SAFETY: writing an int to the pipe, then leaving without running destructors.
        unsafe {
            libc::write(p[1], &e as *const i32 as *const libc::c_void, 4);
            libc::_exit(127);
        }
    }
    // SAFETY: closing our copy of the write end; reading at most 4 bytes into `e`.
    let (n, e) = unsafe {
        libc::close(p[1]);
        let mut e = 0i32;
        let n = libc::read(p[0], &mut e as *mut i32 as *mut libc::c_void, 4);
        libc::close(p[0]);
        (n, e)
    };
    let mut status = 0;
    // SAFETY: reaping our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    if n == 4 {
        return Err(e);
    }
    Ok(format!("exec'd; exit status {status:#x}"))
}

fn empty_env() -> [*const libc::c_char; 1] {
    [std::ptr::null()]
}

/// `execve(path)` with argv `[path]`.
fn execve(path: &str) -> i64 {
    let p = c(path);
    let argv = [p.as_ptr(), std::ptr::null()];
    // SAFETY: NUL-terminated path, NULL-terminated argv and envp that outlive the call.
    unsafe { libc::execve(p.as_ptr(), argv.as_ptr(), empty_env().as_ptr()) as i64 }
}

/// `execveat(fd, "", …, AT_EMPTY_PATH)`: fexecve.
fn execveat_fd(fd: i32) -> i64 {
    let name = c("agentos-probe");
    let empty = c("");
    let argv = [name.as_ptr(), std::ptr::null()];
    // SAFETY: valid fd number, NUL-terminated strings, NULL-terminated argv/envp.
    unsafe {
        libc::syscall(
            libc::SYS_execveat,
            fd,
            empty.as_ptr(),
            argv.as_ptr(),
            empty_env().as_ptr(),
            libc::AT_EMPTY_PATH,
        )
    }
}

/// A memfd with `flags` holding a copy of /bin/true.
fn memfd_true(flags: u32) -> Result<i32, i32> {
    let bin = std::fs::read("/bin/true").map_err(io_err)?;
    // SAFETY: memfd_create with a NUL-terminated name.
    let fd = unsafe { libc::memfd_create(c("agentos-probe").as_ptr(), flags) };
    if fd < 0 {
        return Err(errno());
    }
    // SAFETY: writing our buffer to our fd.
    let n = unsafe { libc::write(fd, bin.as_ptr() as *const libc::c_void, bin.len()) };
    if n != bin.len() as isize {
        return Err(errno());
    }
    Ok(fd)
}

/// A copy of /bin/true at `path`, mode 0755.
/// Map the first page of file `path` executable: directly (`mmap` with `PROT_EXEC`), or by
/// mapping it readable and then `mprotect` to executable.
fn map_exec(path: &str, by_mprotect: bool) -> Result<String, i32> {
    let f = std::fs::File::open(path).map_err(io_err)?;
    use std::os::fd::AsRawFd;
    let first = if by_mprotect {
        libc::PROT_READ
    } else {
        libc::PROT_READ | libc::PROT_EXEC
    };
    // SAFETY: a private mapping of one page of an open file, unmapped before returning.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            4096,
            first,
            libc::MAP_PRIVATE,
            f.as_raw_fd(),
            0,
        );
        if p == libc::MAP_FAILED {
            return Err(errno());
        }
        let r = if by_mprotect {
            libc::mprotect(p, 4096, libc::PROT_READ | libc::PROT_EXEC)
        } else {
            0
        };
        let e = errno();
        libc::munmap(p, 4096);
        if r < 0 {
            return Err(e);
        }
    }
    Ok(format!("{path} mapped executable"))
}

fn copy_true(path: &str) -> Result<(), i32> {
    std::fs::copy("/bin/true", path).map_err(io_err)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).map_err(io_err)
}

/// Whether process `pid` still runs (not gone, not a zombie), as /proc shows it.
fn running(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, r)| !r.starts_with('Z')))
        .unwrap_or(false)
}

/// The PID of this agent's socket broker: a process named `agentos-sockets` of its own uid
/// (ESRCH if there is none: the attempt must find it to mean anything).
fn own_broker() -> Result<i32, i32> {
    // The daemon starts the broker right after the agent's exec: look for a while.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    loop {
        if let Some(pid) = find_own_broker()? {
            return Ok(pid);
        }
        if std::time::Instant::now() > deadline {
            return Err(libc::ESRCH);
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

fn find_own_broker() -> Result<Option<i32>, i32> {
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() }.to_string();
    for e in std::fs::read_dir("/proc").map_err(io_err)?.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let status = std::fs::read_to_string(e.path().join("status")).unwrap_or_default();
        let field = |k: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(k))
                .map(|v| v.split_whitespace().next().unwrap_or("").to_string())
        };
        if field("Name:").as_deref() == Some("agentos-sockets")
            && field("Uid:").as_deref() == Some(uid.as_str())
        {
            return Ok(Some(pid));
        }
    }
    Ok(None)
}

fn pidfd_signal(pid: &str) -> Result<String, i32> {
    let pid: i32 = pid.parse().unwrap_or(0);
    // SAFETY: pidfd_open on a pid number; the fd is closed below.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(errno());
    }
    // Signal 0: the permission check without the signal (the daemon must survive a bug here).
    // SAFETY: pidfd_send_signal on our pidfd with no siginfo.
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd as i32,
            0,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    let e = errno();
    // SAFETY: closing our pidfd.
    unsafe { libc::close(fd as i32) };
    if r < 0 {
        Err(e)
    } else {
        Ok("signalled".into())
    }
}

/// Bind the abstract datagram name `name` and wait up to 3 s for a host client's message.
fn squat(name: &str) -> Result<String, i32> {
    use std::os::linux::net::SocketAddrExt;
    let a = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).map_err(io_err)?;
    let s = std::os::unix::net::UnixDatagram::bind_addr(&a).map_err(io_err)?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(3)))
        .map_err(io_err)?;
    let mut buf = [0u8; 64];
    let n = s.recv(&mut buf).map_err(io_err)?;
    Ok(format!(
        "received a host client's message: {:?}",
        String::from_utf8_lossy(&buf[..n])
    ))
}

fn inotify(path: &str) -> Result<String, i32> {
    // SAFETY: inotify_init1 and inotify_add_watch on a NUL-terminated path; the fd is closed.
    unsafe {
        let fd = libc::inotify_init1(libc::IN_CLOEXEC);
        if fd < 0 {
            return Err(errno());
        }
        let w = libc::inotify_add_watch(fd, c(path).as_ptr(), libc::IN_ALL_EVENTS);
        let e = errno();
        libc::close(fd);
        if w < 0 {
            Err(e)
        } else {
            Ok(format!("watching {path}"))
        }
    }
}

/// Run attempt `name` inside the agent; `None` when this module does not know it.
pub fn probe(name: &str, args: &[String]) -> Option<Result<String, i32>> {
    let home = std::env::var("HOME").unwrap_or_default();
    Some(match name {
        // --- exec
        "memfd-exec-proc-fd" => {
            memfd_true(0).and_then(|fd| fork_exec(|| execve(&format!("/proc/self/fd/{fd}"))))
        }
        "memfd-fexecve" => memfd_true(MFD_CLOEXEC).and_then(|fd| fork_exec(|| execveat_fd(fd))),
        "memfd-mfd-exec" => {
            memfd_true(MFD_EXEC | MFD_CLOEXEC).and_then(|fd| fork_exec(|| execveat_fd(fd)))
        }
        "memfd-sealed-chmod" => memfd_true(MFD_NOEXEC_SEAL | MFD_CLOEXEC).and_then(|fd| {
            // SAFETY: fchmod on our fd.
            check(unsafe { libc::fchmod(fd, 0o755) } as i64)
        }),
        "memfd-sealed-exec" => memfd_true(MFD_NOEXEC_SEAL | MFD_CLOEXEC).and_then(|fd| {
            // SAFETY: fchmod on our fd (refused by the seal; the exec is the attempt).
            unsafe { libc::fchmod(fd, 0o755) };
            fork_exec(|| execveat_fd(fd))
        }),
        "memfd-sealed-control" => memfd_true(MFD_NOEXEC_SEAL | MFD_CLOEXEC).and_then(|fd| {
            let mut b = [0u8; 4];
            // SAFETY: reading 4 bytes of our memfd into `b`.
            let n = unsafe { libc::pread(fd, b.as_mut_ptr() as *mut libc::c_void, 4, 0) };
            if n == 4 && &b == b"\x7fELF" {
                Ok("wrote and read back a sealed memfd".into())
            } else {
                Err(errno())
            }
        }),
        "exec-own-log" => {
            // SAFETY: fchmod of our stdout (the log file the daemon opened for us).
            unsafe { libc::fchmod(1, 0o755) };
            fork_exec(|| execveat_fd(1))
        }
        "lease-own-log" => {
            // SAFETY: fcntl on our stdout.
            check(unsafe { libc::fcntl(1, libc::F_SETLEASE, libc::F_WRLCK) } as i64)
        }
        "execveat-opath-home" => (|| {
            let p = format!("{home}/true-opath");
            copy_true(&p)?;
            // SAFETY: open with O_PATH on a NUL-terminated path.
            let fd = unsafe { libc::open(c(&p).as_ptr(), libc::O_PATH) };
            if fd < 0 {
                return Err(errno());
            }
            fork_exec(|| execveat_fd(fd))
        })(),
        "exec-proc-fd-home" => (|| {
            let p = format!("{home}/true-fd");
            copy_true(&p)?;
            // SAFETY: open for reading on a NUL-terminated path.
            let fd = unsafe { libc::open(c(&p).as_ptr(), libc::O_RDONLY) };
            if fd < 0 {
                return Err(errno());
            }
            fork_exec(|| execve(&format!("/proc/self/fd/{fd}")))
        })(),
        "exec-from-wgrant" => (|| {
            let p = format!("{}/true-copy-{}", arg(args, 1), std::process::id());
            copy_true(&p)?;
            let r = fork_exec(|| execve(&p));
            let _ = std::fs::remove_file(&p);
            r
        })(),
        "exec-script-home" => (|| {
            let p = format!("{home}/script.sh");
            std::fs::write(&p, "#!/bin/sh\nexit 0\n").map_err(io_err)?;
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).map_err(io_err)?;
            fork_exec(|| execve(&p))
        })(),
        "interpreter-reads-script" => (|| {
            let p = format!("{home}/script-read.sh");
            std::fs::write(&p, "exit 0\n").map_err(io_err)?;
            match std::process::Command::new("/bin/sh").arg(&p).status() {
                Ok(s) if s.success() => Ok("/bin/sh ran the script".into()),
                Ok(s) => Err(s.code().unwrap_or(-1)),
                Err(e) => Err(io_err(e)),
            }
        })(),
        "exec-granted-control" => fork_exec(|| execve("/bin/true")),
        "mprotect-anon-exec" => {
            // SAFETY: an anonymous mapping of one page, made executable, then unmapped.
            unsafe {
                let p = libc::mmap(
                    std::ptr::null_mut(),
                    4096,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                );
                if p == libc::MAP_FAILED {
                    return Some(Err(errno()));
                }
                *(p as *mut u8) = 0xc3; // ret
                let r = libc::mprotect(p, 4096, libc::PROT_READ | libc::PROT_EXEC);
                let e = errno();
                libc::munmap(p, 4096);
                if r < 0 {
                    Err(e)
                } else {
                    Ok("anonymous memory made executable".into())
                }
            }
        }
        "loader-runs-home-binary" => (|| {
            let p = format!("{home}/true-loader");
            copy_true(&p)?;
            let ld = ["/lib64/ld-linux-x86-64.so.2", "/lib/ld-linux-x86-64.so.2"]
                .into_iter()
                .find(|l| std::path::Path::new(l).exists())
                .ok_or(libc::ENOENT)?;
            match std::process::Command::new(ld).arg(&p).output() {
                Ok(o) if o.status.success() => Ok(format!("{ld} ran {p}")),
                // ld.so does not print the errno of a refused mapping ("failed to map segment
                // from shared object"); an open it could not make says "Permission denied".
                Ok(o)
                    if ["failed to map segment", "Permission denied"]
                        .iter()
                        .any(|m| String::from_utf8_lossy(&o.stderr).contains(m)) =>
                {
                    Err(libc::EACCES)
                }
                Ok(o) => Err(o.status.code().unwrap_or(-1)),
                Err(e) => Err(io_err(e)),
            }
        })(),
        "mmap-exec-home-file" | "mprotect-exec-home-file" => (|| {
            let p = format!("{home}/true-mapped");
            copy_true(&p)?;
            map_exec(&p, name == "mprotect-exec-home-file")
        })(),
        "mmap-exec-granted-control" => map_exec("/bin/true", false),
        // --- channels
        "dev-shm-create" => {
            let p = c(&format!("/dev/shm/agentos-agent-{}", std::process::id()));
            // SAFETY: open with O_CREAT on a NUL-terminated path.
            let fd = unsafe { libc::open(p.as_ptr(), libc::O_CREAT | libc::O_RDWR, 0o600) };
            check(fd as i64)
        }
        "dev-shm-read-host" => std::fs::read(arg(args, 1))
            .map(|b| format!("read {} bytes", b.len()))
            .map_err(io_err),
        "inotify-other-home" | "inotify-etc" | "inotify-tmp" => inotify(arg(args, 1)),
        "inotify-own-home" => inotify(&home),
        // SAFETY: fanotify_init with constant flags.
        "fanotify-init" => check(unsafe { libc::fanotify_init(0, libc::O_RDONLY as u32) } as i64),
        "kill-broadcast" => {
            // kill(-1) reports success even when every target refused: what counts is whether
            // the host's process survived.
            // SAFETY: kill(-1, SIGKILL): every process this one may signal, not itself.
            let r = unsafe { libc::kill(-1, libc::SIGKILL) };
            std::thread::sleep(std::time::Duration::from_millis(200));
            if running(arg(args, 1)) {
                Err(libc::EPERM)
            } else {
                Ok(format!("kill(-1) returned {r}; the host process is gone"))
            }
        }
        "pidfd-signal-daemon" | "pidfd-signal-host" => pidfd_signal(arg(args, 1)),
        "broker-signal" => own_broker().and_then(|pid| {
            // Signal 0 first (the check alone), then SIGKILL for real.
            // SAFETY: kill(2) on integers.
            check(unsafe { libc::kill(pid, 0) } as i64)?;
            // SAFETY: as above.
            check(unsafe { libc::kill(pid, libc::SIGKILL) } as i64)
        }),
        "broker-mem" => own_broker().and_then(|pid| {
            std::fs::File::open(format!("/proc/{pid}/mem"))
                .map(|_| "opened its memory".to_string())
                .map_err(io_err)
        }),
        "abstract-connect-nonet" => (|| {
            use std::os::linux::net::SocketAddrExt;
            let a = std::os::unix::net::SocketAddr::from_abstract_name(arg(args, 1).as_bytes())
                .map_err(io_err)?;
            std::os::unix::net::UnixStream::connect_addr(&a)
                .map(|_| "connected".to_string())
                .map_err(io_err)
        })(),
        "abstract-squat-nonet" | "abstract-squat-with-net" => squat(arg(args, 1)),
        "sysv-shm-host" => {
            // SAFETY: shmget of an existing key (no creation).
            check(unsafe { libc::shmget(arg(args, 1).parse().unwrap_or(0), 0, 0) } as i64)
        }
        "sysv-sem-host" => {
            // SAFETY: semget of an existing key (no creation).
            check(unsafe { libc::semget(arg(args, 1).parse().unwrap_or(0), 0, 0) } as i64)
        }
        "sysv-msg-host" => {
            // SAFETY: msgget of an existing key (no creation).
            check(unsafe { libc::msgget(arg(args, 1).parse().unwrap_or(0), 0) } as i64)
        }
        "sysv-shm-own" => {
            // SAFETY: a private segment of one page, attached, written, detached, removed.
            unsafe {
                let id = libc::shmget(libc::IPC_PRIVATE, 4096, libc::IPC_CREAT | 0o600);
                if id < 0 {
                    return Some(Err(errno()));
                }
                let p = libc::shmat(id, std::ptr::null(), 0);
                let r = if p as isize == -1 {
                    Err(errno())
                } else {
                    *(p as *mut u8) = 1;
                    libc::shmdt(p);
                    Ok("own shm segment".to_string())
                };
                libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut());
                r
            }
        }
        "mq-host" => {
            // SAFETY: mq_open of an existing queue (no creation).
            let q = unsafe { libc::mq_open(c(arg(args, 1)).as_ptr(), libc::O_RDWR) };
            check(q as i64)
        }
        "mq-own" => {
            let n = c(&format!("/agentos-agent-{}", std::process::id()));
            // SAFETY: mq_open creating a queue with default attributes, closed and removed.
            unsafe {
                let q = libc::mq_open(
                    n.as_ptr(),
                    libc::O_CREAT | libc::O_RDWR,
                    0o600 as libc::mode_t,
                    std::ptr::null::<libc::mq_attr>(),
                );
                if q < 0 {
                    return Some(Err(errno()));
                }
                libc::mq_close(q);
                libc::mq_unlink(n.as_ptr());
            }
            Ok("own message queue".into())
        }
        _ => return None,
    })
}
