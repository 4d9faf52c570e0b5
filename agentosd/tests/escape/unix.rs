//! Class 5, channels by path: the host's pathname Unix sockets. An agent in its own network
//! namespace, without network grants, still reaches every Unix socket whose file mode lets its
//! uid write: the D-Bus system bus (every service on it, agentosd's own API among them),
//! journald's `/dev/log` and `/run/systemd/journal/socket` (log lines under any identifier),
//! whatever else listens with mode 0666. Two fences refuse connect and send to a socket that is
//! not the agent's own, the daemon's, or beneath its write grants: Landlock's `RESOLVE_UNIX`
//! (ABI 9, Linux 7.1) and the BPF LSM programs `lsm/unix_stream_connect` and
//! `lsm/unix_may_send` (where BPF LSM is allowed). Where neither is here the attempts get
//! through: asserted open, so that the day this host's kernel closes them the suite says so.
//!
//! [`bpf_alone`] runs the same attempts again with the daemon restarted with
//! `--no-landlock-unix`: the BPF fence alone (the VM's kernel has both), and checks that its
//! refusals are audit records. Where BPF LSM is refused (this host) the daemon must refuse that
//! option, and the run is skipped with a message.

use std::ffi::CString;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::net::{UnixDatagram, UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use crate::{Attempt, Caps, Ctx, Expect};

/// The host's sockets the test made: stream, datagram and seqpacket sockets, mode 0777 in a
/// directory every uid may walk; a hard link (root's) to the stream socket in the agents' write
/// grant; and a stream socket of the host's bound beneath the write grant.
struct Fixture {
    _stream: UnixListener,
    _dgram: UnixDatagram,
    _seqpacket: std::os::fd::OwnedFd,
    _granted: UnixListener,
    dir: PathBuf,
    in_grant: Vec<PathBuf>,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
        for p in &self.in_grant {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Host services' sockets an agent must not reach, where they exist here (the VM has them).
const SYSTEM_SOCKETS: &[(&str, &str)] = &[
    ("unix-connect-system-bus", "/run/dbus/system_bus_socket"),
    ("unix-send-journal", "/run/systemd/journal/socket"),
    ("unix-send-dev-log", "/dev/log"),
];

/// Which fences are in force for a run of the attempts.
#[derive(Clone, Copy, Debug)]
pub struct Fences {
    /// The agents' Landlock rulesets handle `RESOLVE_UNIX`.
    pub landlock: bool,
    /// The daemon's BPF LSM programs `lsm/unix_stream_connect` and `lsm/unix_may_send`.
    pub bpf: bool,
}

/// Whether the daemon's Unix socket programs can be in force here (loaded, not attached).
pub fn bpf_fence() -> bool {
    agentosd::enforce::fs::FsEnforcer::load().is_ok_and(|f| f.unix_status().is_ok())
}

fn bind_seqpacket(path: &Path) -> std::os::fd::OwnedFd {
    // SAFETY: socket(2) with constant arguments; the fd is owned right after.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    assert!(fd >= 0, "socket(SOCK_SEQPACKET)");
    // SAFETY: a fresh fd of ours.
    let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let (sa, len) = sockaddr(path).unwrap();
    // SAFETY: `sa` is a valid sockaddr_un of `len` bytes.
    let r = unsafe { libc::bind(fd.as_raw_fd(), (&raw const sa).cast(), len) };
    assert_eq!(r, 0, "bind {}", path.display());
    // SAFETY: listen(2) on our fd.
    assert_eq!(unsafe { libc::listen(fd.as_raw_fd(), 8) }, 0);
    fd
}

fn setup(ctx: &Ctx, name: &str) -> (Vec<(&'static str, Vec<String>)>, Fixture) {
    let dir = ctx.dir.join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let stream_path = dir.join("stream.sock");
    let dgram_path = dir.join("dgram.sock");
    let seq_path = dir.join("seqpacket.sock");
    let stream = UnixListener::bind(&stream_path).unwrap();
    let dgram = UnixDatagram::bind(&dgram_path).unwrap();
    let seqpacket = bind_seqpacket(&seq_path);
    let wgrant = PathBuf::from(
        ctx.fs_caps
            .lines()
            .find_map(|l| l.trim().strip_prefix("- fs.write: ["))
            .and_then(|l| l.strip_suffix(']'))
            .unwrap_or_default(),
    );
    let hardlink = wgrant.join(format!("{name}-hardlink.sock"));
    let granted_path = wgrant.join(format!("{name}-granted.sock"));
    let _ = std::fs::remove_file(&hardlink);
    let _ = std::fs::remove_file(&granted_path);
    std::fs::hard_link(&stream_path, &hardlink).unwrap();
    let granted = UnixListener::bind(&granted_path).unwrap();
    for p in [&stream_path, &dgram_path, &seq_path, &granted_path] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    let s = |p: &Path| vec![p.display().to_string()];
    let mut v = vec![
        ("unix-connect-host-stream", s(&stream_path)),
        ("unix-connect-host-stream-nonet", s(&stream_path)),
        ("unix-send-host-dgram", s(&dgram_path)),
        // The same socket through a symbolic link the agent makes in its own home: the fences
        // check the socket's real path, not the name used.
        ("unix-connect-host-via-link", s(&stream_path)),
        // ... through /proc/self/fd/N of an O_PATH fd of the socket file.
        ("unix-connect-host-via-proc-fd", s(&stream_path)),
        ("unix-connect-host-seqpacket", s(&seq_path)),
        // sendmsg() with msg_name, and connect() on a datagram socket then send().
        ("unix-sendmsg-host-dgram", s(&dgram_path)),
        ("unix-connect-host-dgram", s(&dgram_path)),
        // A hard link (root's: protected_hardlinks keeps an agent from linking a file it does
        // not own) in the agent's write grant.
        ("unix-connect-host-via-hardlink", s(&hardlink)),
        // Controls: its own MCP socket (the daemon's directory is granted), a socket it bound
        // itself (its own), sent to by path, and a host socket beneath its write grant.
        ("unix-connect-own-socket", vec![]),
        ("unix-connect-self-made", vec![]),
        ("unix-connect-under-write-grant", s(&granted_path)),
    ];
    for (name, path) in SYSTEM_SOCKETS {
        if Path::new(path).exists() {
            v.push((name, s(Path::new(path))));
        }
    }
    let f = Fixture {
        _stream: stream,
        _dgram: dgram,
        _seqpacket: seqpacket,
        _granted: granted,
        dir,
        in_grant: vec![hardlink, granted_path],
    };
    (v, f)
}

/// The expected outcome of attempt `name` under `fences`.
fn expect(name: &str, fences: Fences) -> Expect {
    match name {
        "unix-connect-own-socket" | "unix-connect-self-made" | "unix-connect-under-write-grant" => {
            Expect::Allowed
        }
        // Landlock checks the name used (the link is beneath the write grant: allowed); the BPF
        // programs the socket's bound path (the host's directory: refused).
        "unix-connect-host-via-hardlink" if fences.bpf => Expect::Denied("EACCES"),
        "unix-connect-host-via-hardlink" => Expect::Allowed,
        _ if fences.landlock || fences.bpf => Expect::Denied("EACCES"),
        _ => Expect::Allowed,
    }
}

fn caps_of(name: &str) -> Caps {
    if name.ends_with("-nonet")
        || name == "unix-connect-self-made"
        || SYSTEM_SOCKETS.iter().any(|(n, _)| *n == name)
    {
        Caps::NoNet
    } else {
        Caps::Standard
    }
}

fn list(v: &[(&'static str, Vec<String>)], fences: Fences) -> Vec<Attempt> {
    v.iter()
        .map(|(name, args)| Attempt {
            name,
            args: args.clone(),
            expect: expect(name, fences),
            caps: caps_of(name),
        })
        .collect()
}

pub fn attempts(ctx: &Ctx) -> (Vec<Attempt>, Box<dyn std::any::Any>) {
    let fences = Fences {
        landlock: agentosd::sandbox::landlock::resolve_unix(
            agentosd::sandbox::landlock::kernel_abi(),
        ),
        bpf: bpf_fence(),
    };
    if !fences.landlock && !fences.bpf {
        println!(
            "note: Landlock ABI below {} and no BPF LSM: unix-connect-host-*, unix-send-host-* and the system sockets are expected to get through (the documented gap; `agentosd check` row `landlock unix sockets`)",
            agentosd::sandbox::landlock::RESOLVE_UNIX_ABI
        );
    }
    let (v, f) = setup(ctx, "host-sockets");
    (list(&v, fences), Box::new(f))
}

/// The attempts again under the BPF LSM fence alone: the daemon restarted with
/// `--no-landlock-unix`, then back without it. Returns (attempts run, failures).
pub fn bpf_alone(
    ctx: &Ctx,
    d: &mut crate::common::Daemon,
    filter: Option<&str>,
) -> (usize, Vec<String>) {
    if filter.is_some_and(|f| !"unix-bpf-alone".contains(f) && !f.starts_with("unix")) {
        return (0, Vec::new());
    }
    if !bpf_fence() {
        // The option must be refused where that fence cannot be in force: the daemon, restarted
        // with it, exits saying why.
        d.terminate();
        let r = refused_start(d);
        d.spawn();
        return match r {
            Ok(()) => {
                println!(
                    "ok   unix-bpf-alone: agentosd refuses --no-landlock-unix without the BPF LSM fence"
                );
                println!(
                    "skip unix-bpf-alone: the BPF LSM Unix socket programs do not load here (no BPF LSM); the VM suite runs them"
                );
                (1, Vec::new())
            }
            Err(e) => (1, vec![format!("unix-bpf-alone: {e}")]),
        };
    }
    let (v, _fixture) = setup(ctx, "host-sockets-bpf");
    let fences = Fences {
        landlock: false,
        bpf: true,
    };
    let attempts: Vec<Attempt> = list(&v, fences)
        .into_iter()
        .filter(|a| filter.is_none_or(|f| a.name.contains(f) || "unix-bpf-alone".contains(f)))
        .collect();
    d.terminate();
    d.extra.push("--no-landlock-unix".into());
    d.spawn();
    let mut failures = Vec::new();
    for a in &attempts {
        let name = format!("bpf-{}", a.name);
        let f = ctx.contract(&name, a.name, &a.args, &a.caps);
        let out = d.ctl(&["start", f.to_str().unwrap()]);
        if !out.status.success() {
            failures.push(format!(
                "{name}: agent did not start: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
            continue;
        }
        let Some(r) = crate::wait_line(&ctx.log(&name), 15) else {
            failures.push(format!("{name}: no result line"));
            continue;
        };
        let ok = r["ok"].as_bool().unwrap_or(false);
        let errno = r["errno"].as_str().unwrap_or("");
        let pass = match a.expect {
            Expect::Denied(e) => !ok && errno == e,
            Expect::Allowed => ok,
        };
        let line = format!(
            "{name:<36} expect {:<8} got {}",
            match a.expect {
                Expect::Denied(e) => e,
                Expect::Allowed => "success",
            },
            if ok { "success" } else { errno }
        );
        println!("{} {line}", if pass { "ok  " } else { "FAIL" });
        if !pass {
            failures.push(line);
        }
    }
    if attempts
        .iter()
        .any(|a| a.name == "unix-connect-host-stream")
    {
        let out = d.ctl(&["status", "escape/bpf-unix-connect-host-stream"]);
        let status = String::from_utf8_lossy(&out.stdout);
        let abi9 =
            agentosd::sandbox::landlock::resolve_unix(agentosd::sandbox::landlock::kernel_abi());
        let mut want = vec!["unix sockets (BPF LSM): connect/send only"];
        if abi9 {
            want.push("left to BPF LSM (--no-landlock-unix)");
        }
        for w in want {
            if !out.status.success() || !status.contains(w) {
                failures.push(format!(
                    "unix-bpf-alone: no note {w:?} in the agent's status:\n{status}"
                ));
            }
        }
    }
    failures.extend(records_check(ctx, &v, &attempts));
    d.terminate();
    d.extra.retain(|a| a != "--no-landlock-unix");
    d.spawn();
    (attempts.len(), failures)
}

/// Start agentosd as `d` would be, with `--no-landlock-unix`, where the BPF LSM fence is not
/// active: it must exit, naming the option and the fence.
fn refused_start(d: &crate::common::Daemon) -> Result<(), String> {
    let mut child = std::process::Command::new(crate::common::agentosd_bin())
        .arg("--state-dir")
        .arg(&d.state_dir)
        .arg("--agents-dir")
        .arg(&d.agents_dir)
        .arg("--cgroup-root")
        .arg(&d.cgroup_root)
        .arg("--bus-address")
        .arg(&d.bus)
        .args(&d.extra)
        .arg("--no-landlock-unix")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("run agentosd: {e}"))?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        if let Ok(Some(st)) = child.try_wait() {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            return if !st.success() && err.contains("--no-landlock-unix: the BPF LSM fence") {
                Ok(())
            } else {
                Err(format!(
                    "agentosd --no-landlock-unix without the BPF LSM fence: {st}; {err}"
                ))
            };
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err("agentosd --no-landlock-unix started without the BPF LSM fence".into());
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// The BPF refusals are audit records: a connect and a send, each naming the host socket.
fn records_check(ctx: &Ctx, v: &[(&'static str, Vec<String>)], ran: &[Attempt]) -> Vec<String> {
    let path_of = |n: &str| {
        v.iter()
            .find(|(a, _)| *a == n)
            .map(|(_, args)| args[0].clone())
    };
    let mut want = Vec::new();
    // (hook, call, the socket's path, its type: 1 stream, 2 datagram, 5 seqpacket)
    if ran.iter().any(|a| a.name == "unix-connect-host-stream") {
        want.push((
            "lsm/unix_stream_connect",
            "connect",
            path_of("unix-connect-host-stream"),
            libc::SOCK_STREAM,
        ));
    }
    if ran.iter().any(|a| a.name == "unix-send-host-dgram") {
        want.push((
            "lsm/unix_may_send",
            "send",
            path_of("unix-send-host-dgram"),
            libc::SOCK_DGRAM,
        ));
    }
    if ran.iter().any(|a| a.name == "unix-connect-host-seqpacket") {
        want.push((
            "lsm/unix_stream_connect",
            "connect",
            path_of("unix-connect-host-seqpacket"),
            libc::SOCK_SEQPACKET,
        ));
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let o = std::process::Command::new(crate::common::agentctl_bin())
            .args(["audit", "show", "--json", "--state-dir"])
            .arg(&ctx.state)
            .output()
            .expect("agentctl audit show");
        let recs: Vec<serde_json::Value> = String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .filter(|r: &serde_json::Value| r["kind"] == "denial")
            .collect();
        let missing: Vec<String> = want
            .iter()
            .filter(|(hook, call, path, ty)| {
                !recs.iter().any(|r| {
                    let d = &r["detail"];
                    d["hook"] == *hook
                        && d["syscall"] == *call
                        && d["errno"] == "EACCES"
                        && d["mechanism"] == "bpf-lsm"
                        && d["open_flags"] == *ty
                        && path.as_deref().is_some_and(|p| d["path"] == p)
                })
            })
            .map(|(hook, call, path, ty)| {
                format!(
                    "records: no {hook} record of a {call} to {path:?} (EACCES, bpf-lsm, socket type {ty}) in the audit trail"
                )
            })
            .collect();
        if missing.is_empty() {
            for (hook, call, _, ty) in &want {
                println!(
                    "ok   records: {hook}: a {call} (socket type {ty}) refused, in the audit trail"
                );
            }
            return missing;
        }
        if std::time::Instant::now() > deadline {
            for m in &missing {
                println!("FAIL {m}");
            }
            return missing;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

fn io_err(e: std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn sockaddr(path: &Path) -> Result<(libc::sockaddr_un, libc::socklen_t), i32> {
    // SAFETY: sockaddr_un is plain old data; all zeroes is a valid value.
    let mut sa: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    sa.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let b = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| libc::EINVAL)?;
    let b = b.as_bytes_with_nul();
    if b.len() > sa.sun_path.len() {
        return Err(libc::ENAMETOOLONG);
    }
    for (d, s) in sa.sun_path.iter_mut().zip(b) {
        *d = *s as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + b.len();
    Ok((sa, len as libc::socklen_t))
}

fn connect(path: &Path) -> Result<String, i32> {
    UnixStream::connect(path)
        .map(|_| format!("connected to {}", path.display()))
        .map_err(io_err)
}

fn connect_seqpacket(path: &Path) -> Result<String, i32> {
    // SAFETY: socket(2) with constant arguments; the fd is owned right after.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(errno());
    }
    // SAFETY: a fresh fd of ours.
    let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let (sa, len) = sockaddr(path)?;
    // SAFETY: `sa` is a valid sockaddr_un of `len` bytes.
    if unsafe { libc::connect(fd.as_raw_fd(), (&raw const sa).cast(), len) } != 0 {
        return Err(errno());
    }
    Ok(format!("connected (seqpacket) to {}", path.display()))
}

fn send(path: &Path) -> Result<String, i32> {
    let s = UnixDatagram::unbound().map_err(io_err)?;
    s.send_to(b"<13>agentosd: forged by an agent", path)
        .map(|_| format!("sent to {}", path.display()))
        .map_err(io_err)
}

fn sendmsg(path: &Path) -> Result<String, i32> {
    let s = UnixDatagram::unbound().map_err(io_err)?;
    let (mut sa, len) = sockaddr(path)?;
    let mut buf = *b"<13>agentosd: forged by an agent (sendmsg)";
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain old data; all zeroes is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_name = (&raw mut sa).cast();
    msg.msg_namelen = len;
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    // SAFETY: `msg` points at `sa`, `iov` and `buf`, all alive for the call.
    if unsafe { libc::sendmsg(s.as_raw_fd(), &raw const msg, 0) } < 0 {
        return Err(errno());
    }
    Ok(format!("sent (sendmsg) to {}", path.display()))
}

fn home() -> PathBuf {
    PathBuf::from(std::env::var("HOME").unwrap_or_default())
}

pub fn probe(name: &str, args: &[String]) -> Option<Result<String, i32>> {
    let arg = || PathBuf::from(args.get(1).map(String::as_str).unwrap_or(""));
    Some(match name {
        "unix-connect-host-stream"
        | "unix-connect-host-stream-nonet"
        | "unix-connect-system-bus"
        | "unix-connect-host-via-hardlink"
        | "unix-connect-under-write-grant" => connect(&arg()),
        "unix-send-host-dgram" | "unix-send-journal" | "unix-send-dev-log" => {
            // /dev/log and the journal socket are datagram sockets; a stream one (an older
            // syslog) is tried as such.
            match send(&arg()) {
                Err(e) if e == libc::EPROTOTYPE => connect(&arg()),
                r => r,
            }
        }
        "unix-connect-host-seqpacket" => connect_seqpacket(&arg()),
        "unix-sendmsg-host-dgram" => sendmsg(&arg()),
        "unix-connect-host-dgram" => (|| {
            let s = UnixDatagram::unbound().map_err(io_err)?;
            s.connect(arg()).map_err(io_err)?;
            s.send(b"<13>agentosd: forged by an agent (connected)")
                .map(|_| format!("connected and sent to {}", arg().display()))
                .map_err(io_err)
        })(),
        "unix-connect-host-via-link" => {
            let link = home().join("tmp/host.sock");
            let _ = std::fs::remove_file(&link);
            if let Err(e) = std::os::unix::fs::symlink(arg(), &link) {
                return Some(Err(io_err(e)));
            }
            connect(&link)
        }
        "unix-connect-host-via-proc-fd" => (|| {
            let f = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_PATH)
                .open(arg())
                .map_err(io_err)?;
            connect(Path::new(&format!("/proc/self/fd/{}", f.as_raw_fd())))
        })(),
        "unix-connect-own-socket" => match std::env::var("AGENTOS_SOCKET") {
            Ok(p) => connect(Path::new(&p)),
            Err(_) => Err(libc::ENOENT),
        },
        // A datagram socket (listen() needs net.bind): bound in its home, sent to by path.
        "unix-connect-self-made" => (|| {
            let p = home().join("tmp/own.sock");
            let _ = std::fs::remove_file(&p);
            let _own = UnixDatagram::bind(&p).map_err(io_err)?;
            send(&p)
        })(),
        _ => return None,
    })
}
