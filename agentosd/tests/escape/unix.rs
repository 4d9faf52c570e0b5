//! Class 5, channels by path: the host's pathname Unix sockets. An agent in its own network
//! namespace, without network grants, still reaches every Unix socket whose file mode lets its
//! uid write: the D-Bus system bus (every service on it, agentosd's own API among them),
//! journald's `/dev/log` and `/run/systemd/journal/socket` (log lines under any identifier),
//! whatever else listens with mode 0666. Landlock's `RESOLVE_UNIX` (ABI 9, Linux 7.1) refuses
//! connect and sendto to a socket outside the agent's domain unless a rule grants its path:
//! the agent gets only the daemon's socket directory. Below ABI 9 the attempts get through:
//! asserted open, so that the day this host's kernel closes them the suite says so.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixDatagram, UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use crate::{Attempt, Caps, Ctx};

/// The host's sockets the test made: a stream listener and a datagram socket, both mode
/// 0777 in a directory every uid may walk.
struct Fixture {
    _stream: UnixListener,
    _dgram: UnixDatagram,
    dir: PathBuf,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Host services' sockets an agent must not reach, where they exist here (the VM has them).
const SYSTEM_SOCKETS: &[(&str, &str)] = &[
    ("unix-connect-system-bus", "/run/dbus/system_bus_socket"),
    ("unix-send-journal", "/run/systemd/journal/socket"),
    ("unix-send-dev-log", "/dev/log"),
];

pub fn attempts(ctx: &Ctx) -> (Vec<Attempt>, Box<dyn std::any::Any>) {
    let dir = ctx.dir.join("host-sockets");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let stream_path = dir.join("stream.sock");
    let dgram_path = dir.join("dgram.sock");
    let stream = UnixListener::bind(&stream_path).unwrap();
    let dgram = UnixDatagram::bind(&dgram_path).unwrap();
    for p in [&stream_path, &dgram_path] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    let confined =
        agentosd::sandbox::landlock::resolve_unix(agentosd::sandbox::landlock::kernel_abi());
    if !confined {
        println!(
            "note: Landlock ABI below {}: unix-connect-host-*, unix-send-host-* and the system sockets are expected to get through (the documented gap; `agentosd check` row `landlock unix sockets`)",
            agentosd::sandbox::landlock::RESOLVE_UNIX_ABI
        );
    }
    let host = |name: &'static str, path: &Path, caps: Caps| {
        let args = vec![path.display().to_string()];
        if confined {
            Attempt::denied(name, args, "EACCES", caps)
        } else {
            Attempt::allowed(name, args, caps)
        }
    };
    let mut v = vec![
        host("unix-connect-host-stream", &stream_path, Caps::Standard),
        host("unix-connect-host-stream-nonet", &stream_path, Caps::NoNet),
        host("unix-send-host-dgram", &dgram_path, Caps::Standard),
        // The same socket through a link the agent makes in its own home: Landlock checks
        // the socket's real path, not the name used.
        host("unix-connect-host-via-link", &stream_path, Caps::Standard),
        // Controls: its own MCP socket (the daemon's directory is granted) and a socket it
        // bound itself (its own Landlock domain), sent to by path.
        Attempt::allowed("unix-connect-own-socket", vec![], Caps::Standard),
        Attempt::allowed("unix-connect-self-made", vec![], Caps::NoNet),
    ];
    for (name, path) in SYSTEM_SOCKETS {
        if Path::new(path).exists() {
            v.push(host(name, Path::new(path), Caps::NoNet));
        }
    }
    let f = Fixture {
        _stream: stream,
        _dgram: dgram,
        dir,
    };
    (v, Box::new(f))
}

fn io_err(e: std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

fn connect(path: &Path) -> Result<String, i32> {
    UnixStream::connect(path)
        .map(|_| format!("connected to {}", path.display()))
        .map_err(io_err)
}

fn send(path: &Path) -> Result<String, i32> {
    let s = UnixDatagram::unbound().map_err(io_err)?;
    s.send_to(b"<13>agentosd: forged by an agent", path)
        .map(|_| format!("sent to {}", path.display()))
        .map_err(io_err)
}

fn home() -> PathBuf {
    PathBuf::from(std::env::var("HOME").unwrap_or_default())
}

pub fn probe(name: &str, args: &[String]) -> Option<Result<String, i32>> {
    let arg = || PathBuf::from(args.get(1).map(String::as_str).unwrap_or(""));
    Some(match name {
        "unix-connect-host-stream" | "unix-connect-host-stream-nonet" => connect(&arg()),
        "unix-connect-system-bus" => connect(&arg()),
        "unix-send-host-dgram" | "unix-send-journal" | "unix-send-dev-log" => {
            // /dev/log and the journal socket are datagram sockets; a stream one (an older
            // syslog) is tried as such.
            match send(&arg()) {
                Err(e) if e == libc::EPROTOTYPE => connect(&arg()),
                r => r,
            }
        }
        "unix-connect-host-via-link" => {
            let link = home().join("tmp/host.sock");
            let _ = std::fs::remove_file(&link);
            if let Err(e) = std::os::unix::fs::symlink(arg(), &link) {
                return Some(Err(io_err(e)));
            }
            connect(&link)
        }
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
