//! The attempts. Each runs inside an agent's sandbox, tries ONE thing and prints one JSON line
//! `{"attempt":…,"ok":…,"errno":…,"detail":…}`. `ok: true` means the call succeeded.

use std::ffi::CString;

pub fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

pub fn errno_name(e: i32) -> String {
    match e {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::EACCES => "EACCES",
        libc::EINVAL => "EINVAL",
        libc::ENOSYS => "ENOSYS",
        libc::EAGAIN => "EAGAIN",
        libc::ENOMEM => "ENOMEM",
        libc::EFAULT => "EFAULT",
        libc::EBADF => "EBADF",
        libc::EROFS => "EROFS",
        libc::ESRCH => "ESRCH",
        libc::EXDEV => "EXDEV",
        libc::ECONNREFUSED => "ECONNREFUSED",
        libc::EAFNOSUPPORT => "EAFNOSUPPORT",
        libc::EPROTONOSUPPORT => "EPROTONOSUPPORT",
        libc::ENETUNREACH => "ENETUNREACH",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::EBUSY => "EBUSY",
        libc::EEXIST => "EEXIST",
        libc::ENOTDIR => "ENOTDIR",
        libc::EISDIR => "EISDIR",
        libc::E2BIG => "E2BIG",
        libc::ETIMEDOUT => "ETIMEDOUT",
        _ => return format!("errno {e}"),
    }
    .to_string()
}

fn report(attempt: &str, r: Result<String, i32>) {
    let line = match r {
        Ok(detail) => {
            serde_json::json!({"attempt": attempt, "ok": true, "errno": null, "detail": detail})
        }
        Err(e) => {
            serde_json::json!({"attempt": attempt, "ok": false, "errno": errno_name(e), "detail": ""})
        }
    };
    println!("{line}");
}

/// The result of a libc call returning -1 on error.
pub fn check(r: i64) -> Result<String, i32> {
    if r < 0 {
        Err(errno())
    } else {
        Ok(format!("returned {r}"))
    }
}

pub fn c(s: &str) -> CString {
    CString::new(s).unwrap_or_default()
}

fn open(path: &str, flags: i32) -> Result<String, i32> {
    let p = c(path);
    // SAFETY: open(2) with a valid NUL-terminated path.
    let fd = unsafe { libc::open(p.as_ptr(), flags | libc::O_CLOEXEC, 0o644) };
    if fd < 0 {
        return Err(errno());
    }
    // SAFETY: closing the fd we just opened.
    unsafe { libc::close(fd) };
    Ok(format!("opened {path}"))
}

fn sockaddr(port: u16) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes([127, 0, 0, 1]),
        },
        sin_zero: [0; 8],
    }
}

fn tcp(port: u16, bind: bool) -> Result<String, i32> {
    // SAFETY: socket/connect/bind on a socket we own with a valid sockaddr_in.
    unsafe {
        let s = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if s < 0 {
            return Err(errno());
        }
        let a = sockaddr(port);
        let p = &a as *const libc::sockaddr_in as *const libc::sockaddr;
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        let r = if bind {
            libc::bind(s, p, len)
        } else {
            libc::connect(s, p, len)
        };
        let e = errno();
        libc::close(s);
        if r < 0 {
            Err(e)
        } else {
            Ok(format!("port {port}"))
        }
    }
}

fn exec_status(path: &str, args: &[&str]) -> Result<String, i32> {
    match std::process::Command::new(path).args(args).output() {
        Ok(o) if o.status.success() => Ok(format!("{path} ran")),
        Ok(o) => Ok(format!("{path} exited {}", o.status)),
        Err(e) => Err(e.raw_os_error().unwrap_or(0)),
    }
}

fn arg(args: &[String], i: usize) -> &str {
    args.get(i).map(String::as_str).unwrap_or("")
}

fn num(args: &[String], i: usize) -> i64 {
    arg(args, i).parse().unwrap_or(0)
}

/// Run attempt `args[0]` with its parameters; print the result line.
pub fn run(args: &[String]) {
    let name = arg(args, 0).to_string();
    let home = std::env::var("HOME").unwrap_or_default();
    let r: Result<String, i32> = match name.as_str() {
        // --- filesystem
        "read-shadow" => open("/etc/shadow", libc::O_RDONLY),
        "read-other-home" => open(arg(args, 1), libc::O_RDONLY),
        "list-other-home" => open(arg(args, 1), libc::O_RDONLY | libc::O_DIRECTORY),
        "read-home-root" => open("/root", libc::O_RDONLY | libc::O_DIRECTORY),
        "write-tmp" => open(arg(args, 1), libc::O_WRONLY | libc::O_CREAT),
        "write-etc" => open("/etc/agentos-escape", libc::O_WRONLY | libc::O_CREAT),
        "write-daemon-state" => open(arg(args, 1), libc::O_WRONLY),
        "write-readonly-grant" => open(
            &format!("{}/new-file", arg(args, 1)),
            libc::O_WRONLY | libc::O_CREAT,
        ),
        "dev-mem" => open(arg(args, 1), libc::O_RDONLY),
        "dev-kmsg-write" => open("/dev/kmsg", libc::O_WRONLY),
        "block-device" => open(arg(args, 1), libc::O_RDONLY),
        "proc-sys-write" => open("/proc/sys/kernel/hostname", libc::O_WRONLY),
        "daemon-environ" => open(&format!("/proc/{}/environ", arg(args, 1)), libc::O_RDONLY),
        "cgroup-escape" => (|| {
            let p = c(arg(args, 1));
            // SAFETY: open/write/close on a path we name and a buffer we own.
            unsafe {
                let fd = libc::open(p.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(errno());
                }
                let pid = format!("{}\n", std::process::id());
                let r = libc::write(fd, pid.as_ptr() as *const libc::c_void, pid.len());
                let e = errno();
                libc::close(fd);
                if r < 0 { Err(e) } else { Ok("moved".into()) }
            }
        })(),
        // --- exec
        "exec-ungranted" => exec_status(arg(args, 1), &["--version"]),
        "exec-from-home" => (|| {
            let dst = format!("{home}/true-copy");
            std::fs::copy("/bin/true", &dst).map_err(|e| e.raw_os_error().unwrap_or(0))?;
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(0o755))
                .map_err(|e| e.raw_os_error().unwrap_or(0))?;
            exec_status(&dst, &[])
        })(),
        // --- network
        "connect-ungranted" | "connect-granted" => tcp(num(args, 1) as u16, false),
        // An abstract Unix socket has no file and no permission bits: only Landlock's scoping
        // (ABI 6) keeps an agent from the host's (D-Bus, X11, container runtimes use them).
        "abstract-socket" => (|| {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(arg(args, 1).as_bytes())
                .map_err(|e| e.raw_os_error().unwrap_or(libc::EINVAL))?;
            std::os::unix::net::UnixStream::connect_addr(&addr)
                .map(|_| format!("connected to @{}", arg(args, 1)))
                .map_err(|e| e.raw_os_error().unwrap_or(0))
        })(),
        "bind-ungranted" | "bind-granted" => tcp(num(args, 1) as u16, true),
        // SAFETY (all below): raw system calls with constant or NULL arguments; the attempt
        // is that the kernel refuses them.
        "raw-socket" => {
            // SAFETY: a raw system call on constants, NULL or buffers owned here; the attempt is that the kernel refuses it.
            check(unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_ICMP) as i64 })
        }
        // SAFETY: a raw system call on constants, NULL or buffers owned here; the attempt is that the kernel refuses it.
        "packet-socket" => check(unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW,
                (libc::ETH_P_ALL as u16).to_be() as i32,
            ) as i64
        }),
        // --- processes
        "ptrace-daemon" => {
            // SAFETY: a raw system call on constants, NULL or buffers owned here; the attempt is that the kernel refuses it.
            check(unsafe { libc::ptrace(libc::PTRACE_ATTACH, num(args, 1) as libc::pid_t, 0, 0) })
        }
        "ptrace-other-agent" => {
            // SAFETY: a raw system call on constants, NULL or buffers owned here; the attempt is that the kernel refuses it.
            check(unsafe { libc::ptrace(libc::PTRACE_SEIZE, num(args, 1) as libc::pid_t, 0, 0) })
        }
        // SAFETY: a raw system call on constants, NULL or buffers owned here; the attempt is that the kernel refuses it.
        "ptrace-traceme" => check(unsafe { libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0) }),
        "process-vm-read" => {
            let mut buf = [0u8; 8];
            let local = libc::iovec {
                iov_base: buf.as_mut_ptr() as *mut libc::c_void,
                iov_len: 8,
            };
            let remote = libc::iovec {
                iov_base: 0x400000 as *mut libc::c_void,
                iov_len: 8,
            };
            // SAFETY: a raw system call on constants, NULL or buffers owned here; the attempt is that the kernel refuses it.
            check(unsafe {
                libc::process_vm_readv(num(args, 1) as libc::pid_t, &local, 1, &remote, 1, 0) as i64
            })
        }
        // SAFETY: a raw system call on constants, NULL or buffers owned here; the attempt is that the kernel refuses it.
        "signal-daemon" => check(unsafe { libc::kill(num(args, 1) as libc::pid_t, 0) as i64 }),
        "signal-other-agent" => {
            // SAFETY: a raw system call on constants, NULL or buffers owned here; the attempt is that the kernel refuses it.
            check(unsafe { libc::kill(num(args, 1) as libc::pid_t, libc::SIGKILL) as i64 })
        }
        // SAFETY: a raw system call on constants, NULL or buffers owned here; the attempt is that the kernel refuses it.
        "setuid-root" => check(unsafe { libc::setuid(0) as i64 }),
        // SAFETY: a raw system call on constants, NULL or buffers owned here; the attempt is that the kernel refuses it.
        "setgid-root" => check(unsafe { libc::setgid(0) as i64 }),
        // SAFETY: a raw system call on constants, NULL or buffers owned here; the attempt is that the kernel refuses it.
        "sched-fifo" => check(unsafe {
            let p = libc::sched_param { sched_priority: 1 };
            libc::sched_setscheduler(0, libc::SCHED_FIFO, &p) as i64
        }),
        // SAFETY: a raw system call on constants, NULL or buffers owned here; the attempt is that the kernel refuses it.
        "nice-raise" => check(unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, -10) as i64 }),
        // --- kernel interfaces
        // SAFETY: a raw system call on constants, NULL or buffers owned here; the attempt is that the kernel refuses it.
        "mount-tmpfs" => check(unsafe {
            let (s, t, f) = (c("none"), c(&home), c("tmpfs"));
            libc::mount(s.as_ptr(), t.as_ptr(), f.as_ptr(), 0, std::ptr::null()) as i64
        }),
        // SAFETY: a raw system call on constants, NULL or buffers owned here; the attempt is that the kernel refuses it.
        "chroot" => check(unsafe { libc::chroot(c(&home).as_ptr()) as i64 }),
        // SAFETY: a raw system call on constants, NULL or buffers owned here; the attempt is that the kernel refuses it.
        "userns-unshare" => check(unsafe { libc::unshare(libc::CLONE_NEWUSER) as i64 }),
        "userns-clone" => {
            // SAFETY: a raw system call on constants, NULL or buffers owned here; the attempt is that the kernel refuses it.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_clone,
                    (libc::CLONE_NEWUSER | libc::SIGCHLD) as libc::c_ulong,
                    0usize,
                    0usize,
                    0usize,
                    0usize,
                )
            };
            if r == 0 {
                // SAFETY: a raw system call on constants, NULL or buffers owned here; the attempt is that the kernel refuses it.
                unsafe { libc::_exit(0) };
            }
            if r > 0 {
                // SAFETY: a raw system call on constants, NULL or buffers owned here; the attempt is that the kernel refuses it.
                unsafe { libc::waitpid(r as i32, std::ptr::null_mut(), 0) };
            }
            check(r)
        }
        // SAFETY: a raw system call on constants, NULL or buffers owned here; the attempt is that the kernel refuses it.
        "clone3" => check(unsafe {
            let mut a = [0u64; 11];
            a[4] = libc::SIGCHLD as u64;
            let r = libc::syscall(libc::SYS_clone3, a.as_mut_ptr(), 88usize);
            if r == 0 {
                libc::_exit(0);
            }
            r
        }),
        // SAFETY: a raw system call on constants, NULL or buffers owned here; the attempt is that the kernel refuses it.
        "bpf-prog-load" => check(unsafe {
            // BPF_PROG_LOAD of "r0 = 0; exit" as a socket filter.
            let insns: [u64; 2] = [0x0000_0000_0000_00b7, 0x0000_0000_0000_0095];
            let license = c("GPL");
            let mut attr = [0u8; 128];
            let w32 = |a: &mut [u8; 128], off: usize, v: u32| {
                a[off..off + 4].copy_from_slice(&v.to_ne_bytes())
            };
            w32(&mut attr, 0, 1); // BPF_PROG_TYPE_SOCKET_FILTER
            w32(&mut attr, 4, 2); // insn_cnt
            attr[8..16].copy_from_slice(&(insns.as_ptr() as u64).to_ne_bytes());
            attr[16..24].copy_from_slice(&(license.as_ptr() as u64).to_ne_bytes());
            libc::syscall(libc::SYS_bpf, 5, attr.as_ptr(), 128usize)
        }),
        // SAFETY: a raw system call on constants, NULL or buffers owned here; the attempt is that the kernel refuses it.
        "perf-event-open" => check(unsafe {
            let mut attr = [0u8; 128];
            attr[4..8].copy_from_slice(&128u32.to_ne_bytes());
            libc::syscall(libc::SYS_perf_event_open, attr.as_ptr(), 0, -1, -1, 0)
        }),
        // SAFETY: a raw system call on constants, NULL or buffers owned here; the attempt is that the kernel refuses it.
        "keyctl" => check(unsafe {
            // KEYCTL_JOIN_SESSION_KEYRING with a NULL name
            libc::syscall(libc::SYS_keyctl, 1, 0usize)
        }),
        // SAFETY: a raw system call on constants, NULL or buffers owned here; the attempt is that the kernel refuses it.
        "kexec-load" => check(unsafe { libc::syscall(libc::SYS_kexec_load, 0, 0, 0, 0) }),
        "init-module" => {
            // SAFETY: a raw system call on constants, NULL or buffers owned here; the attempt is that the kernel refuses it.
            check(unsafe { libc::syscall(libc::SYS_finit_module, -1, c("").as_ptr(), 0) })
        }
        // SAFETY: a raw system call on constants, NULL or buffers owned here; the attempt is that the kernel refuses it.
        "clock-settime" => check(unsafe {
            let mut ts: libc::timespec = std::mem::zeroed();
            libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts);
            libc::clock_settime(libc::CLOCK_REALTIME, &ts) as i64
        }),
        // SAFETY: a raw system call on constants, NULL or buffers owned here; the attempt is that the kernel refuses it.
        "io-uring-setup" => check(unsafe {
            let mut p = [0u8; 120];
            libc::syscall(libc::SYS_io_uring_setup, 4, p.as_mut_ptr())
        }),
        // SAFETY: a raw system call on constants, NULL or buffers owned here; the attempt is that the kernel refuses it.
        "x32-syscall" => check(unsafe { libc::syscall(0x4000_0000 | libc::SYS_getpid) }),
        // --- controls: these must work
        "identity" => (|| {
            let st = std::fs::read_to_string("/proc/self/status").map_err(|_| libc::EIO)?;
            let field = |k: &str| {
                st.lines()
                    .find_map(|l| l.strip_prefix(k))
                    .map(|v| v.trim().to_string())
                    .unwrap_or_default()
            };
            Ok(format!(
                "uid={} gid={} groups={} capeff={} capprm={} capbnd={} capamb={} nnp={} seccomp={}",
                field("Uid:"),
                field("Gid:"),
                field("Groups:"),
                field("CapEff:"),
                field("CapPrm:"),
                field("CapBnd:"),
                field("CapAmb:"),
                field("NoNewPrivs:"),
                field("Seccomp:"),
            ))
        })(),
        // Every descriptor the agent holds, except the one reading the directory: a leaked
        // daemon fd (state directory, cgroup, bus socket) would be a way out.
        "open-fds" => (|| {
            let rd =
                std::fs::read_dir("/proc/self/fd").map_err(|e| e.raw_os_error().unwrap_or(0))?;
            let mut fds: Vec<String> = Vec::new();
            for e in rd.flatten() {
                let n = e.file_name().to_string_lossy().to_string();
                let target = std::fs::read_link(e.path())
                    .map(|t| t.display().to_string())
                    .unwrap_or_default();
                if target != "/proc/self/fd"
                    && !target.starts_with(&format!("/proc/{}/fd", std::process::id()))
                {
                    fds.push(format!("{n}:{target}"));
                }
            }
            fds.sort();
            let sock = std::env::var("AGENTOS_SOCKET_FD").unwrap_or_default();
            Ok(format!("fds={};socket_fd={sock}", fds.join(",")))
        })(),
        "read-granted" => std::fs::read_to_string(arg(args, 1))
            .map(|s| format!("read {} bytes", s.len()))
            .map_err(|e| e.raw_os_error().unwrap_or(0)),
        "read-passwd" => open("/etc/passwd", libc::O_RDONLY),
        "write-home" => std::fs::write(format!("{home}/note"), b"mine")
            .map(|_| "wrote".to_string())
            .map_err(|e| e.raw_os_error().unwrap_or(0)),
        "write-tmpdir" => std::fs::write(
            format!("{}/note", std::env::var("TMPDIR").unwrap_or_default()),
            b"tmp",
        )
        .map(|_| "wrote".to_string())
        .map_err(|e| e.raw_os_error().unwrap_or(0)),
        "write-granted" => std::fs::write(format!("{}/out", arg(args, 1)), b"granted")
            .map(|_| "wrote".to_string())
            .map_err(|e| e.raw_os_error().unwrap_or(0)),
        "exec-granted" => exec_status("/bin/true", &[]),
        "fork-and-signal-own-child" => (|| {
            let mut child = std::process::Command::new("/bin/sleep")
                .arg("30")
                .spawn()
                .map_err(|e| e.raw_os_error().unwrap_or(0))?;
            // SAFETY: a raw system call on constants, NULL or buffers owned here; the attempt is that the kernel refuses it.
            let r = check(unsafe { libc::kill(child.id() as i32, libc::SIGKILL) as i64 });
            let _ = child.wait();
            r
        })(),
        "sleep" => {
            std::thread::sleep(std::time::Duration::from_secs(3600));
            Ok("slept".into())
        }
        // Attempts of the other classes live in their own modules; a name nobody knows is a
        // failure of the suite itself (it once reported success, so a typo passed).
        other => crate::net::probe(other, args)
            .or_else(|| crate::channels::probe(other, args))
            .or_else(|| crate::unix::probe(other, args))
            .or_else(|| crate::deputy::probe(other, args))
            .unwrap_or_else(|| {
                println!("{{\"attempt\":{other:?},\"ok\":false,\"errno\":\"unknown attempt\",\"detail\":\"\"}}");
                std::process::exit(2)
            }),
    };
    report(&name, r);
}
