//! `agentos-mcp`: a stdio MCP server that forwards to the calling agent's agentosd socket.
//!
//! Any MCP host can start it as a stdio server; it copies newline-delimited JSON-RPC both ways:
//! stdin → socket, socket → stdout (flushed per line). EOF on stdin half-closes the socket and
//! waits for the daemon to finish answering; EOF on the socket ends the program (exit 0).
//!
//! Which socket: `--socket PATH`, else `$AGENTOS_SOCKET`, else the inherited connected fd named
//! by `$AGENTOS_SOCKET_FD`. See docs/ipc.md.

use std::io::{BufRead, BufReader, Write};
use std::net::Shutdown;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::process::ExitCode;

use agentos_api::{SOCKET_ENV, SOCKET_FD_ENV};
use anyhow::{Context, Result, anyhow, bail};

const USAGE: &str = "usage: agentos-mcp [--socket PATH]

A stdio MCP server that forwards newline-delimited JSON-RPC to agentosd.
Socket: --socket PATH, else $AGENTOS_SOCKET, else the inherited fd in $AGENTOS_SOCKET_FD.
Example MCP client config: {\"command\": \"agentos-mcp\"} inside an agent started by agentosd.";

/// Why agentosd may close a connection before answering anything.
const REFUSED_HINT: &str = ": it refuses processes outside the agent's cgroup and connections \
     over the agent's limit; the daemon's journal names the reason";

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("agentos-mcp: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Where to connect.
enum Target {
    Path(String),
    Fd(i32),
}

fn parse_args() -> Result<Option<String>> {
    let mut args = std::env::args().skip(1);
    let mut socket = None;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--socket" => {
                socket = Some(args.next().context("--socket needs a PATH")?);
            }
            s if s.starts_with("--socket=") => socket = Some(s["--socket=".len()..].to_string()),
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            "-V" | "--version" => {
                println!("agentos-mcp {}", env!("CARGO_PKG_VERSION"));
                std::process::exit(0);
            }
            other => bail!("unknown argument {other:?}\n{USAGE}"),
        }
    }
    Ok(socket)
}

fn target() -> Result<Target> {
    if let Some(p) = parse_args()? {
        return Ok(Target::Path(p));
    }
    if let Some(p) = std::env::var_os(SOCKET_ENV).filter(|p| !p.is_empty()) {
        return Ok(Target::Path(p.to_string_lossy().into_owned()));
    }
    if let Ok(fd) = std::env::var(SOCKET_FD_ENV) {
        let n: i32 = fd
            .trim()
            .parse()
            .map_err(|_| anyhow!("AGENTOS_SOCKET_FD={fd:?} is not a file descriptor number"))?;
        if n < 3 {
            bail!("AGENTOS_SOCKET_FD={n} names a standard stream, not the agent's socket");
        }
        return Ok(Target::Fd(n));
    }
    bail!(
        "AGENTOS_SOCKET is not set: run me inside an agent started by agentosd, or pass --socket PATH"
    )
}

fn connect(t: &Target) -> Result<(UnixStream, String)> {
    match t {
        Target::Path(p) => {
            let s = UnixStream::connect(p).with_context(|| {
                format!(
                    "cannot connect to agentosd socket {p}: is agentosd running, and is this \
                     process inside the agent the socket belongs to?"
                )
            })?;
            Ok((s, p.clone()))
        }
        Target::Fd(n) => {
            // SAFETY: F_GETFD only reads the descriptor flags of `n`; it fails with EBADF when
            // `n` is not open, and touches no memory.
            if unsafe { libc::fcntl(*n, libc::F_GETFD) } < 0 {
                bail!(
                    "AGENTOS_SOCKET_FD={n} is not an open file descriptor: was this process \
                     started by agentosd (or a child that kept the fd)?"
                );
            }
            // SAFETY: `n` is open (checked above) and named to us as ours by the environment;
            // nothing else in this process uses it, so taking ownership is sound.
            let fd = unsafe { OwnedFd::from_raw_fd(*n) };
            let s = UnixStream::from(fd);
            // A connected Unix socket has a peer address; anything else fails here.
            s.peer_addr()
                .with_context(|| format!("AGENTOS_SOCKET_FD={n} is not a connected Unix socket"))?;
            Ok((s, format!("fd {n}")))
        }
    }
}

fn run() -> Result<()> {
    let t = target()?;
    let (sock, name) = connect(&t)?;
    let mut to_sock = sock.try_clone().context("dup of the socket failed")?;
    let name2 = name.clone();
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        let mut input = BufReader::new(stdin.lock());
        let mut line = Vec::new();
        loop {
            line.clear();
            match input.read_until(b'\n', &mut line) {
                Ok(0) => break,
                Ok(_) => {
                    if let Err(e) = to_sock.write_all(&line) {
                        eprintln!("agentos-mcp: writing to agentosd socket {name2} failed: {e}");
                        break;
                    }
                }
                Err(e) => {
                    eprintln!("agentos-mcp: reading stdin failed: {e}");
                    break;
                }
            }
        }
        // No more requests: let the daemon answer what it has, then it closes.
        let _ = to_sock.shutdown(Shutdown::Write);
    });
    let mut from_sock = BufReader::new(sock);
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut line = Vec::new();
    let mut received = false;
    loop {
        line.clear();
        let n = match from_sock.read_until(b'\n', &mut line) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                bail!(
                    "agentosd reset the connection on {name}{}",
                    if received { "" } else { REFUSED_HINT }
                )
            }
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("reading from agentosd socket {name} failed"));
            }
        };
        if n == 0 {
            if !received {
                eprintln!("agentos-mcp: agentosd closed {name} without a reply{REFUSED_HINT}");
            }
            return Ok(());
        }
        received = true;
        out.write_all(&line)
            .and_then(|()| out.flush())
            .context("writing to stdout failed (the MCP host went away?)")?;
    }
}
