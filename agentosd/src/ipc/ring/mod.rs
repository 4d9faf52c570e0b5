//! The ring thread: one io_uring serving every agent socket.
//!
//! Buffer lifetimes, the one thing that makes this module `unsafe`: an SQE carries raw pointers
//! the kernel dereferences any time until the matching CQE is reaped. So:
//!
//! * a connection's receive buffer is a `Box<[u8]>` allocated once, never replaced; its heap
//!   address is stable even when the `Conn` value moves inside the map;
//! * its send buffer `wbuf` is only touched (cleared, refilled, replaced) while no send for it is
//!   in flight (`send_busy == false`);
//! * a `Conn` (and with it both buffers and the fd) leaves the map only when it is dead *and* has
//!   no recv or send in flight (`maybe_remove`); closing is `shutdown(2)` + `ASYNC_CANCEL`,
//!   which make the in-flight operations complete, never `close(2)` under them;
//! * accepts pass no address buffer; timeouts point at `static` timespecs;
//! * at exit the thread waits for every operation to complete; if that does not happen within a
//!   deadline, the remaining connections are leaked (`mem::forget`) rather than freed.
//!
//! Open files: the ring parks every listener and connection in its table of registered files
//! (io_uring "direct descriptors", [`Sock::Fixed`]) and closes the ordinary fd, so thousands of
//! idle agents do not fill the process's fd table (RLIMIT_NOFILE: each agent has a listener and
//! the daemon's end of its inherited connection). The table has up to [`MAX_FIXED_FILES`]
//! slots (the kernel caps it at RLIMIT_NOFILE); when it is full, a socket stays an ordinary fd
//! ([`Sock::Fd`]). A slot is released where the fd used to be closed, once no operation is in
//! flight on it.
//!
//! Receive buffers: an idle connection holds none. Reading starts with a `POLL_ADD`; when the
//! socket is readable a buffer is taken from a small pool (or allocated) for the `RECV`, and
//! goes back to the pool once a receive drains the socket.
//!
//! Fairness: each completion does bounded work (one receive buffer of 64 KiB parsed, one send
//! batch of 64 KiB assembled), and a connection gets at most one recv and one send in flight, so
//! a flooding agent gets one buffer's worth of service per loop turn like everyone else.

use std::collections::{HashMap, HashSet, VecDeque};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use io_uring::{IoUring, opcode, squeue, types};
use nix::sys::socket::{Shutdown, shutdown};
use tokio::sync::mpsc;
use tracing::{debug, warn};

mod accept;
mod conn;
mod rate;
mod stall;

use super::budget::{self, ConnBytes};
use super::drr::Drr;
use super::lines::LineSplitter;
use super::peer::{self, Identity, Refused};
use super::{
    AgentRef, Connection, Disconnect, Inbound, IpcError, Limits, Outbox, OutboxInner, Peer,
    Refusal, Shared, Throttle,
};

/// Commands from the tokio side.
pub(super) enum Cmd {
    Listen {
        agent: AgentRef,
        fd: OwnedFd,
        path: std::path::PathBuf,
    },
    Pair {
        agent: AgentRef,
        fd: OwnedFd,
    },
    /// Lines were queued on the connection's outbox (or the outbox was dropped).
    Flush(u64),
    /// The connection's inbound queue has room again.
    Resume(u64),
    /// The daemon took lines from a connection whose reading was paused on its byte bounds.
    Read(u64),
    /// Close the connection after the queued lines are sent.
    Close(u64),
    Forget(String),
    Shutdown,
}

const RING_ENTRIES: u32 = 1024;
const RECV_BUF: usize = 64 * 1024;
/// Receive buffers kept for reuse when no connection holds them (at most 1 MiB).
const SPARE_RECV_BUFS: usize = 16;
/// Slots in the ring's table of registered files, at most (the kernel also caps it at
/// RLIMIT_NOFILE): 64 Ki sockets, 512 KiB of kernel memory for the table.
pub const MAX_FIXED_FILES: u32 = 1 << 16;
const SEND_BATCH: usize = 64 * 1024;
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

// user_data: kind in the top byte, listener/connection id below.
const K_EVENTFD: u64 = 1;
const K_ACCEPT: u64 = 2;
const K_ACCEPT_RETRY: u64 = 3;
const K_RECV: u64 = 4;
const K_RECV_RETRY: u64 = 5;
const K_SEND: u64 = 6;
const K_SEND_RETRY: u64 = 7;
const K_CANCEL: u64 = 8;
const K_TIMER: u64 = 9;
const K_STALL: u64 = 10;
const K_RATE: u64 = 11;
/// A connection without a receive buffer waits for the socket to become readable.
const K_RECV_POLL: u64 = 12;
/// The shutdown of a torn-down connection's registered slot (it must complete before the slot
/// is released: a new connection in the same slot would be the one shut down).
const K_SHUTDOWN: u64 = 13;

fn ud(kind: u64, id: u64) -> u64 {
    (kind << 56) | (id & ((1 << 56) - 1))
}

fn split_ud(v: u64) -> (u64, u64) {
    (v >> 56, v & ((1 << 56) - 1))
}

// The kernel copies a timeout's timespec when it prepares the SQE; `static` makes the pointer
// trivially valid for as long as anyone could care.
static BACKOFF_RETRY: types::Timespec = types::Timespec::new().nsec(10_000_000);
static BACKOFF_ACCEPT: types::Timespec = types::Timespec::new().nsec(100_000_000);
static BACKOFF_SLOW: types::Timespec = types::Timespec::new().sec(1);
static SHUTDOWN_TICK: types::Timespec = types::Timespec::new().nsec(200_000_000);
/// How often connections over their outbound bound are looked at (armed only while any is).
static STALL_TICK: types::Timespec = types::Timespec::new().nsec(250_000_000);

/// Where the ring reports what the daemon must record.
pub(super) struct Reports {
    pub refusals: mpsc::Sender<Refusal>,
    pub disconnects: mpsc::Sender<Disconnect>,
    pub throttles: mpsc::Sender<Throttle>,
}

/// A socket the ring serves: in its table of registered files, or an ordinary fd when that
/// table is full (see the module docs).
pub(super) enum Sock {
    Fixed(u32),
    Fd(OwnedFd),
}

/// An SQE on `$sock` (a `&Sock`), whichever table it is in: `$make` is evaluated with `$t` a
/// `types::Fixed` or a `types::Fd`.
macro_rules! on_sock {
    ($sock:expr, |$t:ident| $make:expr) => {
        match $sock {
            Sock::Fixed(slot) => {
                let $t = types::Fixed(*slot);
                $make
            }
            Sock::Fd(fd) => {
                let $t = types::Fd(fd.as_raw_fd());
                $make
            }
        }
    };
}
pub(super) use on_sock;

/// The slots of the ring's table of registered files: `0..next` have been used, `free` are
/// those of them released since.
struct FileTable {
    size: u32,
    next: u32,
    free: Vec<u32>,
}

impl FileTable {
    fn take(&mut self) -> Option<u32> {
        self.free.pop().or_else(|| {
            (self.next < self.size).then(|| {
                self.next += 1;
                self.next - 1
            })
        })
    }
}

/// Slots for the ring's table of registered files: RLIMIT_NOFILE (the kernel's cap on the
/// table), at most [`MAX_FIXED_FILES`].
fn fixed_file_slots() -> u32 {
    let soft = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(u64::MAX);
    soft.min(MAX_FIXED_FILES as u64) as u32
}

struct Listener {
    agent: String,
    fd: Sock,
    path: std::path::PathBuf,
    /// An accept or its back-off timer is in flight.
    busy: bool,
    dead: bool,
}

struct Conn {
    agent: String,
    /// The peer, for the disconnect report.
    pid: Option<u32>,
    uid: u32,
    fd: Sock,
    /// Its place in the open-file budget of all agents' connections when `fd` is an ordinary
    /// fd (ipc/files.rs); given back when the connection is dropped.
    _file: Option<crate::ipc::files::Permit<'static>>,
    /// Byte counts shared with the connection's Inbox and Outbox (budget.rs).
    bytes: Arc<ConnBytes>,
    /// Since when the agent has not kept up with its replies (over the outbound bound).
    over_since: Option<Instant>,
    /// Receive buffer, held only while reading (see the module docs); never replaced or dropped
    /// while a receive is in flight.
    rbuf: Option<Box<[u8]>>,
    /// The socket was seen readable (or a receive filled the buffer): receive without polling.
    ready: bool,
    split: LineSplitter,
    /// Lines received but not yet taken by the inbound channel (at most one buffer's worth).
    pending: VecDeque<Inbound>,
    in_tx: Option<mpsc::Sender<Inbound>>,
    /// Task waiting for room in a full inbound queue.
    waiter: Option<tokio::task::JoinHandle<()>>,
    out_rx: mpsc::Receiver<Vec<u8>>,
    flagged: Arc<AtomicBool>,
    /// Bytes being sent; `wbuf[woff..]` is what the in-flight send points at.
    wbuf: Vec<u8>,
    woff: usize,
    recv_busy: bool,
    send_busy: bool,
    /// A shutdown of its registered slot is in flight (teardown): the slot stays held.
    shutdown_busy: bool,
    /// The peer sent EOF (or we stopped reading).
    eof: bool,
    /// Every Outbox clone is gone.
    out_done: bool,
    /// Outbox::close was called.
    closing: bool,
    dead: bool,
}

struct AgentEntry {
    agent: AgentRef,
    listeners: HashSet<u64>,
    conns: HashSet<u64>,
    /// The agent's bucket of daemon work (ring/rate.rs).
    rate: rate::AgentRate,
    /// The agent's CPU account (ipc/cpu.rs), shared with its sessions and the gateway.
    cpu: Arc<crate::ipc::cpu::AgentCpu>,
}

pub(super) struct Ring {
    ring: IoUring,
    shared: Arc<Shared>,
    limits: Limits,
    rt: tokio::runtime::Handle,
    conns_tx: mpsc::Sender<Connection>,
    reports: Reports,
    agents: HashMap<String, AgentEntry>,
    listeners: HashMap<u64, Listener>,
    conns: HashMap<u64, Conn>,
    next_id: u64,
    /// Completions reaped but not yet handled, queued per agent (keyed by its CPU account) and
    /// handled in deficit round robin (ipc/drr.rs); the daemon's own first.
    backlog: Drr<usize, (u64, i32)>,
    shutdown_deadline: Option<Instant>,
    /// A stall tick is in flight.
    stall_armed: bool,
    /// Connections not read until their agent's bucket allows (ring/rate.rs).
    rate_waiting: HashSet<u64>,
    /// Listeners not accepting until their agent's bucket allows.
    accept_waiting: HashSet<u64>,
    /// A rate tick is in flight.
    rate_armed: bool,
    files: FileTable,
    /// Receive buffers no connection holds (at most [`SPARE_RECV_BUFS`]).
    spare: Vec<Box<[u8]>>,
}

fn bump(a: &AtomicU64, n: u64) {
    a.fetch_add(n, Ordering::Relaxed);
}

fn dec(a: &AtomicU64) {
    a.fetch_sub(1, Ordering::Relaxed);
}

impl Ring {
    pub(super) fn new(
        limits: Limits,
        shared: Arc<Shared>,
        rt: tokio::runtime::Handle,
        conns_tx: mpsc::Sender<Connection>,
        reports: Reports,
    ) -> Result<Ring, IpcError> {
        let ring = IoUring::new(RING_ENTRIES).map_err(|source| IpcError::Ring {
            entries: RING_ENTRIES,
            source,
        })?;
        let mut probe = io_uring::Probe::new();
        ring.submitter()
            .register_probe(&mut probe)
            .map_err(|source| IpcError::Ring {
                entries: RING_ENTRIES,
                source,
            })?;
        for (code, op) in [
            (opcode::Accept::CODE, "IORING_OP_ACCEPT"),
            (opcode::Recv::CODE, "IORING_OP_RECV"),
            (opcode::Send::CODE, "IORING_OP_SEND"),
            (opcode::PollAdd::CODE, "IORING_OP_POLL_ADD"),
            (opcode::AsyncCancel::CODE, "IORING_OP_ASYNC_CANCEL"),
            (opcode::Timeout::CODE, "IORING_OP_TIMEOUT"),
            (opcode::Shutdown::CODE, "IORING_OP_SHUTDOWN"),
        ] {
            if !probe.is_supported(code) {
                return Err(IpcError::Unsupported { op });
            }
        }
        // A sparse table (Linux 5.19, like the accept and recv this ring needs): sockets are
        // parked in it as they come. Without it every socket stays an ordinary fd.
        let size = limits
            .fixed_files
            .unwrap_or_else(fixed_file_slots)
            .min(fixed_file_slots());
        let size = match size {
            0 => 0,
            n => match ring.submitter().register_files_sparse(n) {
                Ok(()) => n,
                Err(e) => {
                    warn!(
                        "ipc: cannot register a table of {n} files with io_uring ({e}); \
                         agents' sockets take ordinary fds (RLIMIT_NOFILE bounds the agents)"
                    );
                    0
                }
            },
        };
        let limits = Limits {
            max_line: limits.max_line.max(1),
            max_conns_per_agent: limits.max_conns_per_agent,
            inbound_queue: limits.inbound_queue.max(1),
            outbound_queue: limits.outbound_queue.max(1),
            // One line of `max_line` always fits: a real message is never refused for its size
            // alone, only held until the daemon takes the ones before it.
            inbound_bytes: limits.inbound_bytes.max(limits.max_line.max(1)),
            outbound_bytes: limits.outbound_bytes.max(1),
            agent_bytes: limits.agent_bytes.max(1),
            stall_timeout: limits.stall_timeout,
            agent_rate: limits.agent_rate,
            agent_cpu: limits.agent_cpu,
            agent_cpu_stall: limits.agent_cpu_stall,
            nice: limits.nice,
            slice_ns: limits.slice_ns,
            fixed_files: Some(size),
        };
        Ok(Ring {
            ring,
            shared,
            limits,
            rt,
            conns_tx,
            reports,
            agents: HashMap::new(),
            listeners: HashMap::new(),
            conns: HashMap::new(),
            next_id: 1,
            backlog: Drr::new(super::drr::QUANTUM),
            shutdown_deadline: None,
            stall_armed: false,
            rate_waiting: HashSet::new(),
            accept_waiting: HashSet::new(),
            rate_armed: false,
            files: FileTable {
                size,
                next: 0,
                free: Vec::new(),
            },
            spare: Vec::new(),
        })
    }

    /// Push one SQE, submitting to make room when the queue is full.
    ///
    /// # Safety
    ///
    /// Every buffer `e` points at must stay valid and unmoved until its CQE is reaped.
    unsafe fn push(&mut self, e: squeue::Entry) {
        loop {
            // SAFETY: the caller guarantees the buffers `e` references outlive its completion.
            if unsafe { self.ring.submission().push(&e) }.is_ok() {
                return;
            }
            match self.ring.submit() {
                Ok(_) => {}
                Err(err) if err.raw_os_error() == Some(libc::EBUSY) => {
                    // Completion queue full: move completions aside to make room.
                    self.reap();
                }
                Err(err) if err.raw_os_error() == Some(libc::EINTR) => {}
                Err(err) => {
                    warn!("io_uring_enter(submit) failed: {err}; retrying");
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
    }

    pub(super) fn run(mut self) {
        if let Some(n) = self.limits.nice {
            crate::agent_work::apply_priority("ipc ring thread", n, self.limits.slice_ns);
        }
        self.arm_eventfd();
        loop {
            if self.shutdown_deadline.is_some() && self.idle() {
                break;
            }
            if let Some(d) = self.shutdown_deadline
                && Instant::now() > d
            {
                warn!(
                    conns = self.conns.len(),
                    "ipc: operations still in flight after {SHUTDOWN_GRACE:?}; leaking their buffers"
                );
                for (_, c) in self.conns.drain() {
                    std::mem::forget(c);
                }
                break;
            }
            if self.backlog.is_empty() {
                match self.ring.submit_and_wait(1) {
                    Ok(_) => {}
                    Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR) | Some(libc::EBUSY)) => {
                    }
                    Err(e) => {
                        tracing::error!("io_uring_enter failed: {e}; the ipc ring thread stops");
                        self.abandon();
                        return;
                    }
                }
            }
            self.reap();
            // Agents take turns (ipc/drr.rs): one agent's burst of completions does not delay
            // another's by more than a quantum.
            while let Some((key, (u, res))) = self.backlog.pop() {
                // The CPU of a completion of an agent's socket is that agent's (ipc/cpu.rs).
                match self.cpu_of(u) {
                    Some(cpu) => {
                        let t0 = crate::ipc::cpu::thread_cpu_ns();
                        self.on_cqe(u, res);
                        let ns = crate::ipc::cpu::thread_cpu_ns().saturating_sub(t0);
                        cpu.charge(ns);
                        if let Some(k) = key {
                            self.backlog.charge(&k, ns);
                        }
                    }
                    None => self.on_cqe(u, res),
                }
            }
        }
        self.stop();
    }

    /// Move the completions the kernel posted into the backlog, each in its agent's queue.
    fn reap(&mut self) {
        let reaped: Vec<(u64, i32)> = self
            .ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        for (u, res) in reaped {
            let key = self.cpu_of(u).map(|c| Arc::as_ptr(&c) as usize);
            self.backlog.push(key, (u, res));
        }
    }

    /// The CPU account of the agent whose socket completion `u` is for.
    fn cpu_of(&self, u: u64) -> Option<Arc<crate::ipc::cpu::AgentCpu>> {
        let (kind, id) = split_ud(u);
        let agent = match kind {
            K_ACCEPT | K_ACCEPT_RETRY => &self.listeners.get(&id)?.agent,
            K_RECV | K_RECV_POLL | K_RECV_RETRY | K_SEND | K_SEND_RETRY | K_SHUTDOWN => {
                &self.conns.get(&id)?.agent
            }
            _ => return None,
        };
        self.agents.get(agent).map(|e| e.cpu.clone())
    }

    fn idle(&self) -> bool {
        self.conns.is_empty() && self.listeners.is_empty()
    }

    /// Fatal ring error: nothing can complete any more; leak what the kernel may still touch.
    fn abandon(mut self) {
        for (_, c) in self.conns.drain() {
            if c.recv_busy || c.send_busy {
                std::mem::forget(c);
            }
        }
        self.stop();
    }

    fn stop(self) {
        // Hold the queue lock while marking stopped so no command slips in unseen.
        let mut q = super::lock(&self.shared.cmds);
        self.shared.stopped.store(true, Ordering::Release);
        let leftover: Vec<Cmd> = q.drain(..).collect();
        drop(q);
        drop(leftover);
        debug!("ipc ring thread stopped");
    }

    fn arm_eventfd(&mut self) {
        let e = opcode::PollAdd::new(
            types::Fd(self.shared.eventfd.as_raw_fd()),
            libc::POLLIN as u32,
        )
        .build()
        .user_data(ud(K_EVENTFD, 0));
        // SAFETY: POLL_ADD references no memory; the eventfd lives in `shared`, which this
        // thread holds until it exits.
        unsafe { self.push(e) };
    }

    fn on_cqe(&mut self, u: u64, res: i32) {
        let (kind, id) = split_ud(u);
        match kind {
            K_EVENTFD => self.on_wake(),
            K_ACCEPT => self.on_accept(id, res),
            K_ACCEPT_RETRY => {
                if let Some(l) = self.listeners.get_mut(&id) {
                    l.busy = false;
                }
                self.submit_accept(id);
                self.maybe_remove_listener(id);
            }
            K_RECV => self.on_recv(id, res),
            K_RECV_POLL => self.on_recv_poll(id),
            K_RECV_RETRY => {
                if let Some(c) = self.conns.get_mut(&id) {
                    c.recv_busy = false;
                }
                self.submit_recv(id);
                self.maybe_remove(id);
            }
            K_SEND => self.on_send(id, res),
            K_SEND_RETRY => {
                if let Some(c) = self.conns.get_mut(&id) {
                    c.send_busy = false;
                    if !c.dead {
                        self.submit_send(id);
                    }
                }
                self.maybe_remove(id);
            }
            K_TIMER => {
                // The shutdown tick: keep waking up until the deadline check in run() ends it.
                if self.shutdown_deadline.is_some() {
                    self.arm_tick();
                }
            }
            K_STALL => self.on_stall_tick(),
            K_RATE => self.on_rate_tick(),
            K_CANCEL => {}
            K_SHUTDOWN => {
                if let Some(c) = self.conns.get_mut(&id) {
                    c.shutdown_busy = false;
                }
                self.maybe_remove(id);
            }
            _ => warn!("ipc: completion with unknown user_data {u:#x}"),
        }
    }

    fn on_wake(&mut self) {
        let mut buf = [0u8; 8];
        let _ = rustix::io::read(&self.shared.eventfd, &mut buf);
        let cmds: Vec<Cmd> = super::lock(&self.shared.cmds).drain(..).collect();
        for cmd in cmds {
            // A command about a connection (its replies to send, its queue's room) is its
            // agent's CPU, like the connection's completions.
            let conn = match &cmd {
                Cmd::Flush(id) | Cmd::Resume(id) | Cmd::Read(id) | Cmd::Close(id) => Some(*id),
                _ => None,
            };
            match conn.and_then(|id| self.cpu_of(ud(K_SEND, id))) {
                Some(cpu) => {
                    let _charge = cpu.measure();
                    self.on_cmd(cmd);
                }
                None => self.on_cmd(cmd),
            }
        }
        if self.shutdown_deadline.is_none() {
            self.arm_eventfd();
        }
    }

    fn on_cmd(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Listen { agent, fd, path } => {
                if self.shutdown_deadline.is_some() {
                    return;
                }
                // Listening again on the same path (e.g. the agent was restarted without a
                // forget) replaces the old listener, whose file `listen` already unlinked.
                let old: Vec<u64> = self
                    .agents
                    .get(&agent.id)
                    .map(|e| {
                        e.listeners
                            .iter()
                            .copied()
                            .filter(|l| self.listeners.get(l).is_some_and(|l| l.path == path))
                            .collect()
                    })
                    .unwrap_or_default();
                for l in old {
                    self.close_listener(l);
                }
                let fd = self.park(fd);
                let id = self.new_id();
                let entry = self.entry(&agent);
                entry.listeners.insert(id);
                self.listeners.insert(
                    id,
                    Listener {
                        agent: agent.id.clone(),
                        fd,
                        path,
                        busy: false,
                        dead: false,
                    },
                );
                bump(&self.shared.stats.listeners, 1);
                self.submit_accept(id);
            }
            Cmd::Pair { agent, fd } => {
                if self.shutdown_deadline.is_some() {
                    return;
                }
                self.entry(&agent);
                let ident = Identity {
                    pid: None,
                    uid: agent.uid,
                    gid: agent.gid,
                    cgroup: agent.cgroup.to_string_lossy().into_owned(),
                };
                self.admit(&agent.id, fd, Ok(ident), true);
            }
            Cmd::Flush(id) => self.flush(id),
            // The taker cleared the pause flag: look at the counts again.
            Cmd::Read(id) => self.submit_recv(id),
            Cmd::Resume(id) => {
                if let Some(c) = self.conns.get_mut(&id) {
                    c.waiter = None;
                }
                self.deliver(id);
            }
            Cmd::Close(id) => {
                if let Some(c) = self.conns.get_mut(&id) {
                    c.closing = true;
                }
                self.flush(id);
            }
            Cmd::Forget(agent) => self.forget(&agent),
            Cmd::Shutdown => {
                if self.shutdown_deadline.is_none() {
                    self.shutdown_deadline = Some(Instant::now() + SHUTDOWN_GRACE);
                    let agents: Vec<String> = self.agents.keys().cloned().collect();
                    for a in agents {
                        self.forget(&a);
                    }
                    // Connections whose agent entry is gone already (none expected).
                    let ids: Vec<u64> = self.conns.keys().copied().collect();
                    for id in ids {
                        self.teardown(id);
                    }
                    let e = opcode::AsyncCancel::new(ud(K_EVENTFD, 0))
                        .build()
                        .user_data(ud(K_CANCEL, 0));
                    // SAFETY: ASYNC_CANCEL references no memory.
                    unsafe { self.push(e) };
                    self.arm_tick();
                }
            }
        }
    }

    /// While shutting down, wake up regularly to check the deadline.
    fn arm_tick(&mut self) {
        let e = opcode::Timeout::new(&SHUTDOWN_TICK)
            .build()
            .user_data(ud(K_TIMER, 0));
        // SAFETY: the timespec is a static.
        unsafe { self.push(e) };
    }

    /// Move `fd` into the table of registered files when a slot is free (closing the ordinary
    /// fd); otherwise keep it as it is.
    fn park(&mut self, fd: OwnedFd) -> Sock {
        let Some(slot) = self.files.take() else {
            return Sock::Fd(fd);
        };
        match self
            .ring
            .submitter()
            .register_files_update(slot, &[fd.as_raw_fd()])
        {
            // The table holds its own reference to the socket now.
            Ok(1) => {
                bump(&self.shared.stats.parked, 1);
                Sock::Fixed(slot)
            }
            r => {
                debug!("ipc: cannot park a socket in slot {slot}: {r:?}");
                self.files.free.push(slot);
                Sock::Fd(fd)
            }
        }
    }

    /// Close a socket no operation is in flight on any more (see the module docs).
    fn release(&mut self, sock: Sock) {
        if let Sock::Fixed(slot) = sock {
            match self.ring.submitter().register_files_update(slot, &[-1]) {
                Ok(_) => {
                    dec(&self.shared.stats.parked);
                    self.files.free.push(slot);
                }
                // The slot stays taken (never reused under a live socket).
                Err(e) => warn!("ipc: cannot release file slot {slot}: {e}"),
            }
        }
    }

    fn new_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    fn entry(&mut self, agent: &AgentRef) -> &mut AgentEntry {
        // One whole line (and the receive that completes it) always fits the burst.
        let min_burst = (self.limits.max_line + RECV_BUF) as u64;
        let rate = self.limits.agent_rate;
        let cpu_ledger = self.shared.cpu.clone();
        let e = self
            .agents
            .entry(agent.id.clone())
            .or_insert_with(|| AgentEntry {
                agent: agent.clone(),
                listeners: HashSet::new(),
                conns: HashSet::new(),
                rate: rate::AgentRate::new(rate, min_burst, Instant::now()),
                cpu: cpu_ledger.agent(&agent.id),
            });
        e.agent = agent.clone();
        e
    }

    fn forget(&mut self, agent: &str) {
        let Some(entry) = self.agents.remove(agent) else {
            return;
        };
        for id in entry.listeners {
            self.close_listener(id);
        }
        for id in entry.conns {
            self.teardown(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_data_round_trips() {
        for (k, id) in [(K_RECV, 0), (K_SEND, 42), (K_TIMER, (1 << 56) - 1)] {
            assert_eq!(split_ud(ud(k, id)), (k, id));
        }
    }
}
