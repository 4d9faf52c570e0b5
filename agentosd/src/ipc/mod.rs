//! The agents' MCP sockets, served with io_uring (issue 8). See docs/ipc.md.
//!
//! One ring thread (`agentos-ipc`) owns one io_uring and every agent socket: it accepts, checks
//! the peer's identity from the kernel (peer.rs), receives and splits lines (lines.rs) and sends
//! replies (ring.rs). The tokio side talks to it through a command queue plus an eventfd the ring
//! polls, and gets connections, lines and refusals back over tokio mpsc channels:
//!
//! ```text
//! tokio tasks ──Cmd + eventfd──▶ ring thread ──mpsc──▶ Incoming { conns, refusals }
//!   Outbox::send ─mpsc (bounded)─▶ ring ──send──▶ agent       agent ──recv──▶ ring ─mpsc─▶ rx
//! ```

pub mod budget;
pub mod cpu;
pub mod drr;
pub mod files;
mod halves;
mod lines;
mod peer;
pub mod rate;
mod ring;
pub mod stalls;
pub mod turns;
mod wake;

use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use nix::sys::socket::{self as sock, AddressFamily, SockFlag, SockType, UnixAddr};
use tokio::sync::mpsc;

pub use halves::{Inbox, Outbox};
use halves::{OutboxInner, inbound_len};
pub use lines::LineSplitter;
pub use peer::{identify, parse_proc_cgroup, relative_to};
pub use ring::MAX_FIXED_FILES;

use crate::sys::SyscallError;
use ring::Cmd;

/// Limits per connection and per agent; see docs/ipc.md for what happens at each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Longest line (message) accepted, without its newline; longer ones become
    /// [`Inbound::TooLong`]. Default 1 MiB.
    pub max_line: usize,
    /// Open connections per agent (listened and paired together); more are refused. Default 16.
    pub max_conns_per_agent: usize,
    /// Lines buffered per connection towards the daemon before the ring stops reading that
    /// socket (the agent's writes then block in the kernel). Default 64.
    pub inbound_queue: usize,
    /// Lines buffered per connection towards the agent; [`Outbox::send`] waits when full.
    /// Default 256.
    pub outbound_queue: usize,
    /// Bytes of complete lines held per connection towards the daemon before the ring stops
    /// reading that socket (`--ipc-inbound-bytes`). Default 4 MiB.
    pub inbound_bytes: usize,
    /// Bytes of replies queued per connection towards the agent (not yet sent) before
    /// [`Outbox::send`] waits and the ring stops reading that socket (`--ipc-outbound-bytes`).
    /// A reply larger than this still goes when nothing else is queued. Default 4 MiB.
    pub outbound_bytes: usize,
    /// Inbound plus outbound bytes over all of one agent's connections before the ring stops
    /// reading those of them that hold anything (`--ipc-agent-bytes`). Default 16 MiB.
    pub agent_bytes: usize,
    /// A connection over its outbound bound (the agent does not read its replies) this long is
    /// disconnected and what it held is freed (`--ipc-stall-timeout`). Default 5 s.
    pub stall_timeout: Duration,
    /// Bytes a second one agent's connections are read at, over all of them, each line counting
    /// [`rate::LINE_COST`] more (`--ipc-agent-rate`; 0: no rate). The burst is half a second's
    /// worth, at least one line of `max_line`. Default 16 MiB/s.
    pub agent_rate: u64,
    /// The daemon's CPU time one agent may take, over its sockets, sessions and tool calls and
    /// the model gateway (`--ipc-agent-cpu`, `--ipc-agent-cpu-burst`; cpu.rs), guaranteed, and
    /// held to only while all agents together take more than the ceiling
    /// (`--ipc-agent-cpu-ceiling`; 0: a hard cap). Default 5% of one CPU, ceiling 50%.
    pub agent_cpu: cpu::CpuRate,
    /// Per mille of the time an agent within its share may wait for a CPU before the agents
    /// over their share are held to it whatever the ceiling says (`--ipc-agent-cpu-stall`;
    /// stalls.rs; 0: the ceiling alone). Watched by the daemon, which knows the agents'
    /// cgroups ([`cpu::CpuLedger::watch_stalls`]). Default 10%.
    pub agent_cpu_stall: u64,
    /// The ring thread's nice value, set when it starts (None: the spawning thread's). The
    /// daemon puts it with the agents' sessions, below its control plane (agent_work.rs).
    pub nice: Option<i32>,
    /// The scheduling slice the ring thread asks for with its nice value, ns (0: the kernel's;
    /// `--agent-work-slice-us`, agent_work.rs).
    pub slice_ns: u64,
    /// Sockets the ring keeps in its io_uring table of registered files instead of the
    /// process's fd table (see ring/mod.rs); the rest take ordinary fds. None: as many as the
    /// kernel allows (RLIMIT_NOFILE), at most 65 536.
    pub fixed_files: Option<u32>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_line: 1 << 20,
            max_conns_per_agent: 16,
            inbound_queue: 64,
            outbound_queue: 256,
            inbound_bytes: DEFAULT_INBOUND_BYTES,
            outbound_bytes: DEFAULT_OUTBOUND_BYTES,
            agent_bytes: DEFAULT_AGENT_BYTES,
            stall_timeout: DEFAULT_STALL_TIMEOUT,
            agent_rate: rate::DEFAULT_AGENT_RATE,
            agent_cpu: cpu::CpuRate::default(),
            agent_cpu_stall: stalls::DEFAULT_STALL_PERMILLE,
            nice: None,
            slice_ns: 0,
            fixed_files: None,
        }
    }
}

/// Defaults of the byte bounds (docs/ipc.md, "Bounded in bytes", says why these).
pub const DEFAULT_INBOUND_BYTES: usize = 4 << 20;
pub const DEFAULT_OUTBOUND_BYTES: usize = 4 << 20;
pub const DEFAULT_AGENT_BYTES: usize = 16 << 20;
pub const DEFAULT_STALL_TIMEOUT: Duration = Duration::from_secs(5);

impl Limits {
    fn bytes(&self) -> budget::ByteLimits {
        budget::ByteLimits {
            inbound: self.inbound_bytes,
            outbound: self.outbound_bytes,
            agent: self.agent_bytes,
            stall: self.stall_timeout,
        }
    }
}

/// The agent a socket belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentRef {
    /// `tenant/name`.
    pub id: String,
    /// The agent's process leaf as `/proc/PID/cgroup` shows it: `/…/agents/tenant/name/main`.
    pub cgroup: PathBuf,
    /// The same cgroup as an absolute directory under the cgroup2 mount.
    pub cgroup_dir: PathBuf,
    /// Owner of the socket file.
    pub uid: u32,
    pub gid: u32,
}

/// Who is on the other end of a connection, as the kernel says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    /// `tenant/name`.
    pub agent: String,
    /// Unique per [`IpcServer`].
    pub conn: u64,
    /// `SO_PEERCRED` pid; None for [`IpcServer::pair`] connections.
    pub pid: Option<u32>,
    pub uid: u32,
    pub gid: u32,
    /// True for the daemon end of [`IpcServer::pair`] (identity by construction).
    pub inherited: bool,
}

/// One message from an agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inbound {
    /// A line without its `\n` (empty lines are dropped).
    Line(Vec<u8>),
    /// A line over `max_line` bytes was skipped up to its newline; the connection goes on.
    TooLong { len: usize },
}

/// An accepted connection: read lines from `rx` (None: the peer closed, or we closed), answer
/// through `tx`. Dropping both closes the connection (after queued replies are sent).
pub struct Connection {
    pub peer: Peer,
    pub rx: Inbox,
    pub tx: Outbox,
}

/// The connection is closed: nothing more can be sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the agent's connection is closed")]
pub struct Closed;

/// Why [`Outbox::try_send`] did not queue a line; the line comes back.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum TrySendError {
    #[error("the connection's outbound queue is full")]
    Full(Vec<u8>),
    #[error("the agent's connection is closed")]
    Closed(Vec<u8>),
}

/// A refused connection, for the audit trail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The agent whose socket was connected to.
    pub agent: String,
    pub pid: Option<u32>,
    /// `u32::MAX` when even `SO_PEERCRED` failed.
    pub uid: u32,
    pub cgroup: Option<String>,
    pub reason: String,
}

/// A connection the daemon closed because its agent did not read its replies: over its
/// outbound bound for [`Limits::stall_timeout`]. What it held is freed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disconnect {
    pub agent: String,
    pub conn: u64,
    /// `SO_PEERCRED` pid; None for the inherited connection.
    pub pid: Option<u32>,
    pub uid: u32,
    /// Bytes of lines received and of replies queued when it was closed (freed with it).
    pub inbound: usize,
    pub outbound: usize,
    /// How long it had been over the bound.
    pub stalled: Duration,
    /// The bound (bytes) it was over.
    pub limit: usize,
}

/// An agent whose connections the ring stopped reading for a while because it sent more than
/// its rate ([`Limits::agent_rate`]); at most one per agent every 10 s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Throttle {
    pub agent: String,
    /// Which bucket was in debt.
    pub limit: ThrottleLimit,
    /// Bytes a second and the burst in bytes ([`ThrottleLimit::Bytes`]), or per mille of one
    /// CPU and the burst in ns of CPU ([`ThrottleLimit::Cpu`]).
    pub rate: u64,
    pub burst: u64,
    /// Times one of its connections was paused since the last report (this one included).
    pub pauses: u64,
    /// How long it has been throttled without a break.
    pub throttled: Duration,
    /// [`ThrottleLimit::Cpu`] under `--ipc-agent-cpu-ceiling`: the daemon was contended and the
    /// agent over its fair share (None: the share held it as a hard cap, or the byte rate).
    pub contended: Option<cpu::Contention>,
}

/// The rate an agent was throttled on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThrottleLimit {
    /// `--ipc-agent-rate`.
    Bytes,
    /// `--ipc-agent-cpu`.
    Cpu,
}

/// What the ring hands to the daemon.
pub struct Incoming {
    pub conns: mpsc::Receiver<Connection>,
    pub refusals: mpsc::Receiver<Refusal>,
    pub disconnects: mpsc::Receiver<Disconnect>,
    pub throttles: mpsc::Receiver<Throttle>,
}

/// Counters since start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IpcStats {
    pub listeners: u64,
    pub connections_open: u64,
    pub accepted: u64,
    pub refused: u64,
    pub lines_in: u64,
    pub lines_out: u64,
    pub too_long: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// Refusals not delivered because `Incoming::refusals` was full or gone.
    pub refusals_dropped: u64,
    /// Times the ring stopped reading a connection whose agent did not read its replies.
    pub outbound_pauses: u64,
    /// Connections closed because their agent did not read its replies ([`Disconnect`]).
    pub stalled: u64,
    /// Times the ring stopped reading a connection because its agent was over its rate.
    pub rate_pauses: u64,
    /// Of those, times its agent was over its CPU rate.
    pub cpu_pauses: u64,
    /// Listeners and connections held in the ring's table of registered files (no fd each).
    pub parked: u64,
}

/// Errors of the ipc layer.
#[derive(Debug, thiserror::Error)]
pub enum IpcError {
    #[error(
        "io_uring_setup({entries} entries) failed: {source}; agentosd needs io_uring \
         (check /proc/sys/kernel/io_uring_disabled is 0 and no seccomp/container policy blocks it)"
    )]
    Ring { entries: u32, source: io::Error },
    #[error("io_uring on this kernel lacks {op}: agentosd's sockets need Linux 5.19 or newer")]
    Unsupported { op: &'static str },
    #[error("IpcServer::start must be called inside a tokio runtime")]
    NoRuntime,
    #[error(transparent)]
    Syscall(#[from] SyscallError),
    #[error(
        "socket path {path} is {len} bytes; a Unix socket address holds at most 107: use a shorter run directory"
    )]
    PathTooLong { path: PathBuf, len: usize },
    #[error(
        "{path} exists and is not a socket: not replacing it; remove it or choose another path"
    )]
    NotASocket { path: PathBuf },
    #[error("{what} {path} failed: {source}")]
    Fs {
        what: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("the ipc ring thread has stopped (see the daemon's journal); restart agentosd")]
    Stopped,
}

/// State shared by the tokio side and the ring thread.
struct Shared {
    cmds: Mutex<VecDeque<Cmd>>,
    /// Written by [`Shared::command`]; the ring has a POLL_ADD on it. Shared with the wake-ups
    /// held until an agent task's poll ends (wake.rs).
    eventfd: Arc<OwnedFd>,
    stopped: AtomicBool,
    /// Socket files per agent, unlinked by `forget` and at shutdown.
    paths: Mutex<HashMap<String, Vec<PathBuf>>>,
    stats: Counters,
    /// The agents' CPU accounts (cpu.rs), shared with the MCP service and the gateway.
    cpu: Arc<cpu::CpuLedger>,
}

#[derive(Default)]
struct Counters {
    listeners: AtomicU64,
    open: AtomicU64,
    accepted: AtomicU64,
    refused: AtomicU64,
    lines_in: AtomicU64,
    lines_out: AtomicU64,
    too_long: AtomicU64,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
    refusals_dropped: AtomicU64,
    outbound_pauses: AtomicU64,
    stalled: AtomicU64,
    rate_pauses: AtomicU64,
    cpu_pauses: AtomicU64,
    parked: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    /// Queue a command for the ring thread and wake it.
    fn command(&self, cmd: Cmd) -> Result<(), IpcError> {
        {
            let mut q = lock(&self.cmds);
            if self.stopped.load(Ordering::Acquire) {
                return Err(IpcError::Stopped);
            }
            q.push_back(cmd);
        }
        self.wake();
        Ok(())
    }

    /// The ring wakes: at once, or when the agent task being polled on this thread ends its
    /// poll (wake.rs).
    fn wake(&self) {
        wake::wake(&self.eventfd);
    }
}

/// The agents' socket server. Dropping the last `Arc` stops the ring thread.
pub struct IpcServer {
    shared: Arc<Shared>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl IpcServer {
    /// Set up the ring and spawn its thread. Must be called inside a tokio runtime (the ring
    /// uses it to wait for a full inbound queue to drain).
    pub fn start(limits: Limits) -> Result<(Arc<IpcServer>, Incoming), IpcError> {
        let rt = tokio::runtime::Handle::try_current().map_err(|_| IpcError::NoRuntime)?;
        let eventfd = rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        )
        .map_err(|e| SyscallError::new("eventfd", "ipc wake-up", e.into()))?;
        let shared = Arc::new(Shared {
            cmds: Mutex::new(VecDeque::new()),
            eventfd: Arc::new(eventfd),
            stopped: AtomicBool::new(false),
            paths: Mutex::new(HashMap::new()),
            stats: Counters::default(),
            cpu: Arc::new(cpu::CpuLedger::new(limits.agent_cpu)),
        });
        let (conns_tx, conns) = mpsc::channel(256);
        let (refusals_tx, refusals) = mpsc::channel(256);
        let (disconnects_tx, disconnects) = mpsc::channel(256);
        let (throttles_tx, throttles) = mpsc::channel(256);
        let ring = ring::Ring::new(
            limits,
            shared.clone(),
            rt,
            conns_tx,
            ring::Reports {
                refusals: refusals_tx,
                disconnects: disconnects_tx,
                throttles: throttles_tx,
            },
        )?;
        let thread = std::thread::Builder::new()
            .name("agentos-ipc".into())
            .spawn(move || ring.run())
            .map_err(|e| SyscallError::new("clone", "ipc ring thread", e))?;
        Ok((
            Arc::new(IpcServer {
                shared,
                thread: Mutex::new(Some(thread)),
            }),
            Incoming {
                conns,
                refusals,
                disconnects,
                throttles,
            },
        ))
    }

    /// Serve `agent` on a Unix socket at `path`: a stale socket file is removed, the parent
    /// directory is created (0755) if missing, the socket is owned by the agent's uid/gid with
    /// mode 0600 before `listen()`, so no one else can connect in between.
    pub fn listen(&self, agent: &AgentRef, path: &Path) -> Result<(), IpcError> {
        if self.shared.stopped.load(Ordering::Acquire) {
            return Err(IpcError::Stopped);
        }
        let fd = listen_socket(agent, path)?;
        {
            let mut paths = lock(&self.shared.paths);
            let v = paths.entry(agent.id.clone()).or_default();
            if !v.iter().any(|p| p == path) {
                v.push(path.to_path_buf());
            }
        }
        if let Err(e) = self.shared.command(Cmd::Listen {
            agent: agent.clone(),
            fd,
            path: path.to_path_buf(),
        }) {
            let _ = std::fs::remove_file(path);
            return Err(e);
        }
        Ok(())
    }

    /// A connected socket pair for `agent`: the daemon end becomes a [`Connection`] with
    /// `inherited = true`; the returned end is for the agent (the spawner dup2()s it into the
    /// child and names it in `AGENTOS_SOCKET_FD`). Close-on-exec is set on both ends.
    pub fn pair(&self, agent: &AgentRef) -> Result<OwnedFd, IpcError> {
        let (ours, theirs) = sock::socketpair(
            AddressFamily::Unix,
            SockType::Stream,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .map_err(|e| SyscallError::new("socketpair", agent.id.clone(), e.into()))?;
        self.shared.command(Cmd::Pair {
            agent: agent.clone(),
            fd: ours,
        })?;
        Ok(theirs)
    }

    /// Stop serving `agent`: unlink its socket files (done when this returns), close its
    /// listeners and every connection of it (done by the ring right after).
    pub fn forget(&self, agent_id: &str) {
        let paths = lock(&self.shared.paths).remove(agent_id);
        for p in paths.into_iter().flatten() {
            if let Err(e) = std::fs::remove_file(&p)
                && e.kind() != io::ErrorKind::NotFound
            {
                tracing::warn!(
                    agent = agent_id,
                    "cannot unlink socket {}: {e}",
                    p.display()
                );
            }
        }
        let _ = self.shared.command(Cmd::Forget(agent_id.to_string()));
    }

    /// The agents' CPU accounts: the ring charges them, and so must whatever else works for
    /// the same agents (the MCP sessions, the model gateway), so that one share holds all.
    pub fn cpu_ledger(&self) -> Arc<cpu::CpuLedger> {
        self.shared.cpu.clone()
    }

    /// Counters since start.
    pub fn stats(&self) -> IpcStats {
        let c = &self.shared.stats;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        IpcStats {
            listeners: l(&c.listeners),
            connections_open: l(&c.open),
            accepted: l(&c.accepted),
            refused: l(&c.refused),
            lines_in: l(&c.lines_in),
            lines_out: l(&c.lines_out),
            too_long: l(&c.too_long),
            bytes_in: l(&c.bytes_in),
            bytes_out: l(&c.bytes_out),
            refusals_dropped: l(&c.refusals_dropped),
            outbound_pauses: l(&c.outbound_pauses),
            stalled: l(&c.stalled),
            rate_pauses: l(&c.rate_pauses),
            cpu_pauses: l(&c.cpu_pauses),
            parked: l(&c.parked),
        }
    }

    /// Close everything, unlink the socket files and stop the ring thread (waits for it).
    /// Idempotent; also done on drop.
    pub fn shutdown(&self) {
        let paths: Vec<PathBuf> = lock(&self.shared.paths)
            .drain()
            .flat_map(|(_, v)| v)
            .collect();
        for p in paths {
            let _ = std::fs::remove_file(p);
        }
        let _ = self.shared.command(Cmd::Shutdown);
        if let Some(t) = lock(&self.thread).take()
            && t.thread().id() != std::thread::current().id()
        {
            let _ = t.join();
        }
    }
}

// The steps of `IpcServer::listen`: the socket's directory, a stale socket, the bind beneath
// the directory's fd, and the socket given to its agent before it listens.

/// Creates the parent directory of socket `path` (0755) when missing.
fn make_socket_dir(path: &Path) -> Result<(), IpcError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir)
            .map_err(|source| IpcError::Fs {
                what: "mkdir",
                path: dir.to_path_buf(),
                source,
            })?;
    }
    Ok(())
}

/// A `safe_fs` error while doing `what` on `p`, as [`IpcError::Fs`].
fn fs_err(what: &'static str, p: &Path) -> impl FnOnce(crate::safe_fs::SafeFsError) -> IpcError {
    let p = p.to_path_buf();
    move |e| IpcError::Fs {
        what,
        path: p,
        source: io::Error::other(e),
    }
}

/// A failed `call` on the socket at `path`, as [`IpcError::Syscall`].
fn sock_err(call: &'static str, path: &Path, e: io::Error) -> IpcError {
    IpcError::Syscall(SyscallError::new(call, path.display().to_string(), e))
}

/// The directory of socket `path`, opened, and the socket's name in it.
fn open_socket_dir(path: &Path) -> Result<(crate::safe_fs::Dir, String), IpcError> {
    let dir_path = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| IpcError::NotASocket {
            path: path.to_path_buf(),
        })?
        .to_string();
    let dir = crate::safe_fs::Dir::open_root(dir_path)
        .map_err(fs_err("open socket directory", dir_path))?;
    Ok((dir, name))
}

/// Removes a socket an earlier run left at `name`; anything else there is refused.
fn remove_stale_socket(dir: &crate::safe_fs::Dir, name: &str, path: &Path) -> Result<(), IpcError> {
    match rustix::fs::statat(dir.fd(), name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFSOCK => dir
            .unlink(name)
            .map_err(fs_err("unlink stale socket", path))?,
        Ok(_) => {
            return Err(IpcError::NotASocket {
                path: path.to_path_buf(),
            });
        }
        Err(rustix::io::Errno::NOENT) => {}
        Err(e) => {
            return Err(IpcError::Fs {
                what: "stat",
                path: path.to_path_buf(),
                source: e.into(),
            });
        }
    }
    Ok(())
}

/// A socket listening at `path` for `agent` only (its uid, mode 0600), replacing a stale socket
/// there. Everything acts on the directory as opened (root's, writable by root alone) and on the
/// socket inode opened beneath it without following a link: never on a path someone could have
/// swapped in between. Also used for the agents' model sockets (models/).
pub fn listen_socket(agent: &AgentRef, path: &Path) -> Result<OwnedFd, IpcError> {
    let len = path.as_os_str().len();
    if len > 107 {
        return Err(IpcError::PathTooLong {
            path: path.to_path_buf(),
            len,
        });
    }
    make_socket_dir(path)?;
    let (dir, name) = open_socket_dir(path)?;
    remove_stale_socket(&dir, &name, path)?;
    let fd = bind_beneath(&dir, &name, path)?;
    if let Err(e) = own_and_listen(&dir, &name, path, agent, &fd) {
        let _ = dir.unlink(&name);
        return Err(e);
    }
    Ok(fd)
}

/// A new socket bound at `name` in the directory `dir` (not yet listening).
fn bind_beneath(dir: &crate::safe_fs::Dir, name: &str, path: &Path) -> Result<OwnedFd, IpcError> {
    let fd = sock::socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|e| sock_err("socket", path, e.into()))?;
    // Bound in exactly the directory opened above (its fd's /proc entry).
    let via = format!("/proc/self/fd/{}/{name}", dir.fd().as_raw_fd());
    let addr = UnixAddr::new(via.as_str()).map_err(|e| sock_err("sockaddr_un", path, e.into()))?;
    sock::bind(fd.as_raw_fd(), &addr).map_err(|e| sock_err("bind", path, e.into()))?;
    Ok(fd)
}

/// Gives the bound socket `fd` at `name` to `agent` (its uid/gid, mode 0600), then listens:
/// no one else can connect in between.
fn own_and_listen(
    dir: &crate::safe_fs::Dir,
    name: &str,
    path: &Path,
    agent: &AgentRef,
    fd: &OwnedFd,
) -> Result<(), IpcError> {
    let inode = dir
        .open(
            Path::new(name),
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::NOFOLLOW,
            rustix::fs::Mode::empty(),
        )
        .map_err(fs_err("open socket", path))?;
    rustix::fs::chownat(
        &inode,
        "",
        Some(rustix::fs::Uid::from_raw(agent.uid)),
        Some(rustix::fs::Gid::from_raw(agent.gid)),
        rustix::fs::AtFlags::EMPTY_PATH,
    )
    .map_err(|e| sock_err("chown", path, e.into()))?;
    // fchmod does not take an O_PATH fd; its /proc entry names exactly that inode.
    std::fs::set_permissions(
        format!("/proc/self/fd/{}", inode.as_raw_fd()),
        std::fs::Permissions::from_mode(0o600),
    )
    .map_err(|e| sock_err("chmod", path, e))?;
    sock::listen(
        fd,
        sock::Backlog::new(128).unwrap_or(sock::Backlog::MAXCONN),
    )
    .map_err(|e| sock_err("listen", path, e.into()))
}

impl Drop for IpcServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}
