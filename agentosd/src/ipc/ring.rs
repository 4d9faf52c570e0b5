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

use super::lines::LineSplitter;
use super::peer::{self, Identity, Refused};
use super::{
    AgentRef, Connection, Inbound, IpcError, Limits, Outbox, OutboxInner, Peer, Refusal, Shared,
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
    /// Close the connection after the queued lines are sent.
    Close(u64),
    Forget(String),
    Shutdown,
}

const RING_ENTRIES: u32 = 1024;
const RECV_BUF: usize = 64 * 1024;
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

struct Listener {
    agent: String,
    fd: OwnedFd,
    path: std::path::PathBuf,
    /// An accept or its back-off timer is in flight.
    busy: bool,
    dead: bool,
}

struct Conn {
    agent: String,
    fd: OwnedFd,
    /// Receive buffer: allocated once, never replaced (see the module docs).
    rbuf: Box<[u8]>,
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
}

pub(super) struct Ring {
    ring: IoUring,
    shared: Arc<Shared>,
    limits: Limits,
    rt: tokio::runtime::Handle,
    conns_tx: mpsc::Sender<Connection>,
    refusals_tx: mpsc::Sender<Refusal>,
    agents: HashMap<String, AgentEntry>,
    listeners: HashMap<u64, Listener>,
    conns: HashMap<u64, Conn>,
    next_id: u64,
    /// Completions reaped but not yet handled.
    backlog: VecDeque<(u64, i32)>,
    shutdown_deadline: Option<Instant>,
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
        refusals_tx: mpsc::Sender<Refusal>,
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
        ] {
            if !probe.is_supported(code) {
                return Err(IpcError::Unsupported { op });
            }
        }
        let limits = Limits {
            max_line: limits.max_line.max(1),
            max_conns_per_agent: limits.max_conns_per_agent,
            inbound_queue: limits.inbound_queue.max(1),
            outbound_queue: limits.outbound_queue.max(1),
        };
        Ok(Ring {
            ring,
            shared,
            limits,
            rt,
            conns_tx,
            refusals_tx,
            agents: HashMap::new(),
            listeners: HashMap::new(),
            conns: HashMap::new(),
            next_id: 1,
            backlog: VecDeque::new(),
            shutdown_deadline: None,
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
                    let reaped: Vec<(u64, i32)> = self
                        .ring
                        .completion()
                        .map(|c| (c.user_data(), c.result()))
                        .collect();
                    self.backlog.extend(reaped);
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
            let reaped: Vec<(u64, i32)> = self
                .ring
                .completion()
                .map(|c| (c.user_data(), c.result()))
                .collect();
            self.backlog.extend(reaped);
            while let Some((u, res)) = self.backlog.pop_front() {
                self.on_cqe(u, res);
            }
        }
        self.stop();
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
            K_CANCEL => {}
            _ => warn!("ipc: completion with unknown user_data {u:#x}"),
        }
    }

    fn on_wake(&mut self) {
        let mut buf = [0u8; 8];
        let _ = rustix::io::read(&self.shared.eventfd, &mut buf);
        let cmds: Vec<Cmd> = super::lock(&self.shared.cmds).drain(..).collect();
        for cmd in cmds {
            self.on_cmd(cmd);
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

    fn new_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    fn entry(&mut self, agent: &AgentRef) -> &mut AgentEntry {
        let e = self
            .agents
            .entry(agent.id.clone())
            .or_insert_with(|| AgentEntry {
                agent: agent.clone(),
                listeners: HashSet::new(),
                conns: HashSet::new(),
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

    /// Stop accepting on a listener; its fd closes once its accept has completed.
    fn close_listener(&mut self, id: u64) {
        if let Some(e) = self
            .listeners
            .get(&id)
            .and_then(|l| self.agents.get_mut(&l.agent))
        {
            e.listeners.remove(&id);
        }
        if let Some(l) = self.listeners.get_mut(&id) {
            if l.dead {
                return;
            }
            l.dead = true;
            dec(&self.shared.stats.listeners);
            if l.busy {
                for k in [K_ACCEPT, K_ACCEPT_RETRY] {
                    let e = opcode::AsyncCancel::new(ud(k, id))
                        .build()
                        .user_data(ud(K_CANCEL, id));
                    // SAFETY: ASYNC_CANCEL references no memory.
                    unsafe { self.push(e) };
                }
            }
        }
        self.maybe_remove_listener(id);
    }

    fn maybe_remove_listener(&mut self, id: u64) {
        if self.listeners.get(&id).is_some_and(|l| l.dead && !l.busy) {
            // Closing the fd drops connections still in its backlog: their peers see EOF.
            self.listeners.remove(&id);
        }
    }

    fn submit_accept(&mut self, id: u64) {
        let Some(l) = self.listeners.get_mut(&id) else {
            return;
        };
        if l.dead || l.busy {
            return;
        }
        l.busy = true;
        let e = opcode::Accept::new(
            types::Fd(l.fd.as_raw_fd()),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
        .flags(libc::SOCK_CLOEXEC)
        .build()
        .user_data(ud(K_ACCEPT, id));
        // SAFETY: no address buffer is passed (null addr/addrlen); the listening fd stays open
        // until the listener is removed, which waits for `busy` to clear on this CQE.
        unsafe { self.push(e) };
    }

    fn retry_timer(&mut self, kind: u64, id: u64, ts: &'static types::Timespec) {
        let e = opcode::Timeout::new(ts).build().user_data(ud(kind, id));
        // SAFETY: the timespec is a static; a timeout references nothing else.
        unsafe { self.push(e) };
    }

    fn retry_poll(&mut self, kind: u64, id: u64, fd: i32, events: i16) {
        let e = opcode::PollAdd::new(types::Fd(fd), events as u32)
            .build()
            .user_data(ud(kind, id));
        // SAFETY: POLL_ADD references no memory; the fd belongs to a connection that is only
        // removed once this completion (its busy flag) has been seen.
        unsafe { self.push(e) };
    }

    fn on_accept(&mut self, id: u64, res: i32) {
        // SAFETY: a non-negative accept result is a new fd the kernel just installed for us.
        let fd = (res >= 0).then(|| unsafe { OwnedFd::from_raw_fd(res) });
        let Some(l) = self.listeners.get_mut(&id) else {
            return;
        };
        l.busy = false;
        let agent = l.agent.clone();
        if l.dead {
            drop(fd);
            self.maybe_remove_listener(id);
            return;
        }
        let Some(fd) = fd else {
            let errno = -res;
            match errno {
                libc::EINTR
                | libc::EAGAIN
                | libc::ECONNABORTED
                | libc::EPROTO
                | libc::ECANCELED => self.submit_accept(id),
                libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM => {
                    warn!(
                        agent,
                        "accept on the agent's socket failed: {}; retrying in 100 ms",
                        std::io::Error::from_raw_os_error(errno)
                    );
                    if let Some(l) = self.listeners.get_mut(&id) {
                        l.busy = true;
                    }
                    self.retry_timer(K_ACCEPT_RETRY, id, &BACKOFF_ACCEPT);
                }
                _ => {
                    warn!(
                        agent,
                        "accept on the agent's socket failed: {}; retrying in 1 s",
                        std::io::Error::from_raw_os_error(errno)
                    );
                    if let Some(l) = self.listeners.get_mut(&id) {
                        l.busy = true;
                    }
                    self.retry_timer(K_ACCEPT_RETRY, id, &BACKOFF_SLOW);
                }
            }
            return;
        };
        self.submit_accept(id);
        let ident = match self.agents.get(&agent) {
            Some(e) => peer::identify(fd.as_fd(), &e.agent),
            None => return,
        };
        self.admit(&agent, fd, ident, false);
    }

    fn refuse(&mut self, agent: &str, r: Refused) {
        bump(&self.shared.stats.refused, 1);
        debug!(agent, pid = ?r.pid, "ipc: refused a connection: {}", r.reason);
        let refusal = Refusal {
            agent: agent.to_string(),
            pid: r.pid,
            uid: r.uid,
            cgroup: r.cgroup,
            reason: r.reason,
        };
        if let Err(e) = self.refusals_tx.try_send(refusal) {
            bump(&self.shared.stats.refusals_dropped, 1);
            let r = match e {
                mpsc::error::TrySendError::Full(r) | mpsc::error::TrySendError::Closed(r) => r,
            };
            warn!(agent, pid = ?r.pid, "ipc: refused a connection ({}); refusal queue full", r.reason);
        }
    }

    /// A connection passed (or failed) the identity rule: check the limit, hand it over.
    fn admit(
        &mut self,
        agent: &str,
        fd: OwnedFd,
        ident: Result<Identity, Refused>,
        inherited: bool,
    ) {
        let ident = match ident {
            Ok(i) => i,
            Err(r) => {
                // Dropping `fd` closes the connection without a byte.
                drop(fd);
                return self.refuse(agent, r);
            }
        };
        let max = self.limits.max_conns_per_agent;
        let Some(entry) = self.agents.get(agent) else {
            return;
        };
        if entry.conns.len() >= max {
            drop(fd);
            return self.refuse(
                agent,
                Refused {
                    pid: ident.pid,
                    uid: ident.uid,
                    cgroup: Some(ident.cgroup),
                    reason: format!(
                        "agent already has {max} connections open (max_conns_per_agent); close one first"
                    ),
                },
            );
        }
        let id = self.new_id();
        let (in_tx, rx) = mpsc::channel(self.limits.inbound_queue);
        let (out_tx, out_rx) = mpsc::channel(self.limits.outbound_queue);
        let flagged = Arc::new(AtomicBool::new(false));
        let peer = Peer {
            agent: agent.to_string(),
            conn: id,
            pid: ident.pid,
            uid: ident.uid,
            gid: ident.gid,
            inherited,
        };
        let tx = Outbox {
            inner: Arc::new(OutboxInner {
                conn: id,
                tx: Some(out_tx),
                flagged: flagged.clone(),
                shared: self.shared.clone(),
            }),
        };
        if let Err(e) = self.conns_tx.try_send(Connection { peer, rx, tx }) {
            drop(fd);
            let why = match e {
                mpsc::error::TrySendError::Full(_) => "agentosd's connection queue is full",
                mpsc::error::TrySendError::Closed(_) => "agentosd is not taking connections",
            };
            return self.refuse(
                agent,
                Refused {
                    pid: ident.pid,
                    uid: ident.uid,
                    cgroup: Some(ident.cgroup),
                    reason: why.into(),
                },
            );
        }
        bump(&self.shared.stats.accepted, 1);
        bump(&self.shared.stats.open, 1);
        if let Some(e) = self.agents.get_mut(agent) {
            e.conns.insert(id);
        }
        self.conns.insert(
            id,
            Conn {
                agent: agent.to_string(),
                fd,
                rbuf: vec![0u8; RECV_BUF].into_boxed_slice(),
                split: LineSplitter::new(self.limits.max_line),
                pending: VecDeque::new(),
                in_tx: Some(in_tx),
                waiter: None,
                out_rx,
                flagged,
                wbuf: Vec::new(),
                woff: 0,
                recv_busy: false,
                send_busy: false,
                eof: false,
                out_done: false,
                closing: false,
                dead: false,
            },
        );
        self.submit_recv(id);
    }

    fn submit_recv(&mut self, id: u64) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if c.dead || c.recv_busy || c.eof || !c.pending.is_empty() || c.waiter.is_some() {
            return;
        }
        c.recv_busy = true;
        let e = opcode::Recv::new(
            types::Fd(c.fd.as_raw_fd()),
            c.rbuf.as_mut_ptr(),
            c.rbuf.len() as u32,
        )
        .build()
        .user_data(ud(K_RECV, id));
        // SAFETY: `rbuf` is a boxed slice allocated once per connection and never replaced or
        // resized, so its address is stable while the `Conn` moves in the map; the `Conn` is only
        // removed once `recv_busy` is cleared by this operation's CQE (maybe_remove). The fd is
        // closed only at that removal too.
        unsafe { self.push(e) };
    }

    fn on_recv(&mut self, id: u64, res: i32) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.recv_busy = false;
        if c.dead {
            self.maybe_remove(id);
            return;
        }
        if res > 0 {
            let n = res as usize;
            bump(&self.shared.stats.bytes_in, n as u64);
            c.split.feed(&c.rbuf[..n], &mut c.pending);
            self.deliver(id);
            return;
        }
        if res == 0 {
            c.eof = true;
            c.split.finish(&mut c.pending);
            self.deliver(id);
            return;
        }
        let errno = -res;
        match errno {
            libc::EINTR | libc::ECANCELED => self.submit_recv(id),
            libc::EAGAIN => {
                c.recv_busy = true;
                let fd = c.fd.as_raw_fd();
                self.retry_poll(K_RECV_RETRY, id, fd, libc::POLLIN);
            }
            libc::ENOBUFS | libc::ENOMEM => {
                c.recv_busy = true;
                self.retry_timer(K_RECV_RETRY, id, &BACKOFF_RETRY);
            }
            _ => {
                debug!(
                    agent = c.agent,
                    conn = id,
                    "ipc: recv failed: {}",
                    std::io::Error::from_raw_os_error(errno)
                );
                self.teardown(id);
            }
        }
    }

    /// Move received lines into the connection's inbound queue; when it is full, stop reading
    /// until a task sees room again.
    fn deliver(&mut self, id: u64) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if c.dead || c.waiter.is_some() {
            return;
        }
        let Some(tx) = c.in_tx.as_ref() else {
            c.pending.clear();
            return;
        };
        let stats = &self.shared.stats;
        while let Some(item) = c.pending.pop_front() {
            let too_long = matches!(item, Inbound::TooLong { .. });
            match tx.try_send(item) {
                Ok(()) => bump(
                    if too_long {
                        &stats.too_long
                    } else {
                        &stats.lines_in
                    },
                    1,
                ),
                Err(mpsc::error::TrySendError::Full(item)) => {
                    c.pending.push_front(item);
                    let tx = tx.clone();
                    let shared = self.shared.clone();
                    // Wait for half the queue to drain, not one slot: fewer wake-ups.
                    let want = (self.limits.inbound_queue / 2).max(1);
                    c.waiter = Some(self.rt.spawn(async move {
                        let _ = tx.reserve_many(want).await;
                        let _ = shared.command(Cmd::Resume(id));
                    }));
                    return;
                }
                Err(mpsc::error::TrySendError::Closed(_)) => {
                    // The daemon dropped the receiving side: it wants no more of this peer.
                    self.teardown(id);
                    return;
                }
            }
        }
        if c.eof {
            // Everything was delivered: the consumer's recv() now returns None.
            c.in_tx = None;
            self.maybe_finish(id);
        } else {
            self.submit_recv(id);
        }
    }

    fn flush(&mut self, id: u64) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.flagged.store(false, Ordering::Release);
        if c.dead || c.send_busy {
            return;
        }
        self.fill_and_send(id);
    }

    /// Take queued lines (up to one batch) into `wbuf` and send them; close when nothing is
    /// left and the connection is done.
    fn fill_and_send(&mut self, id: u64) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        debug_assert!(!c.send_busy);
        c.wbuf.clear();
        c.woff = 0;
        let mut lines = 0;
        while c.wbuf.len() < SEND_BATCH {
            match c.out_rx.try_recv() {
                Ok(line) => {
                    lines += 1;
                    if c.wbuf.is_empty() {
                        c.wbuf = line;
                    } else {
                        c.wbuf.extend_from_slice(&line);
                    }
                }
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    c.out_done = true;
                    break;
                }
            }
        }
        bump(&self.shared.stats.lines_out, lines);
        if c.wbuf.is_empty() {
            self.maybe_finish(id);
        } else {
            self.submit_send(id);
        }
    }

    /// Close a connection that has nothing left to do: `close()` was called, or every outbox is
    /// gone and nobody reads (peer EOF delivered, or the receiver was dropped).
    fn maybe_finish(&mut self, id: u64) {
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        if c.dead || c.send_busy || c.woff < c.wbuf.len() {
            return;
        }
        let reader_gone = c.in_tx.as_ref().is_none_or(|t| t.is_closed());
        if c.closing || (c.out_done && reader_gone) {
            self.teardown(id);
        }
    }

    fn submit_send(&mut self, id: u64) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if c.dead || c.send_busy || c.woff >= c.wbuf.len() {
            return;
        }
        c.send_busy = true;
        let rest = &c.wbuf[c.woff..];
        let e = opcode::Send::new(
            types::Fd(c.fd.as_raw_fd()),
            rest.as_ptr(),
            rest.len().min(u32::MAX as usize) as u32,
        )
        .flags(libc::MSG_NOSIGNAL)
        .build()
        .user_data(ud(K_SEND, id));
        // SAFETY: `wbuf` is not touched (cleared, grown or replaced) while `send_busy` is set,
        // so the pointed-to bytes stay valid and unmoved; the `Conn` owning it is only removed
        // after this operation's CQE clears `send_busy` (maybe_remove).
        unsafe { self.push(e) };
    }

    fn on_send(&mut self, id: u64, res: i32) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.send_busy = false;
        if c.dead {
            self.maybe_remove(id);
            return;
        }
        if res > 0 {
            bump(&self.shared.stats.bytes_out, res as u64);
            c.woff += res as usize;
            if c.woff < c.wbuf.len() {
                // Short send: the rest, from where the kernel stopped.
                self.submit_send(id);
            } else {
                self.fill_and_send(id);
            }
            return;
        }
        let errno = if res == 0 { libc::EAGAIN } else { -res };
        match errno {
            libc::EINTR | libc::ECANCELED => self.submit_send(id),
            libc::EAGAIN => {
                c.send_busy = true;
                let fd = c.fd.as_raw_fd();
                self.retry_poll(K_SEND_RETRY, id, fd, libc::POLLOUT);
            }
            libc::ENOBUFS | libc::ENOMEM => {
                c.send_busy = true;
                self.retry_timer(K_SEND_RETRY, id, &BACKOFF_RETRY);
            }
            _ => {
                debug!(
                    agent = c.agent,
                    conn = id,
                    "ipc: send failed: {}",
                    std::io::Error::from_raw_os_error(errno)
                );
                self.teardown(id);
            }
        }
    }

    /// Close a connection now: wake its in-flight operations (shutdown + cancel), end both
    /// channels; the memory goes once the last operation has completed.
    fn teardown(&mut self, id: u64) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if c.dead {
            return;
        }
        c.dead = true;
        let _ = shutdown(c.fd.as_raw_fd(), Shutdown::Both);
        if let Some(w) = c.waiter.take() {
            w.abort();
        }
        c.in_tx = None;
        c.pending.clear();
        c.out_rx.close();
        let (recv_busy, send_busy) = (c.recv_busy, c.send_busy);
        let agent = c.agent.clone();
        if let Some(e) = self.agents.get_mut(&agent) {
            e.conns.remove(&id);
        }
        dec(&self.shared.stats.open);
        let mut kinds = Vec::new();
        if recv_busy {
            kinds.extend([K_RECV, K_RECV_RETRY]);
        }
        if send_busy {
            kinds.extend([K_SEND, K_SEND_RETRY]);
        }
        for k in kinds {
            let e = opcode::AsyncCancel::new(ud(k, id))
                .build()
                .user_data(ud(K_CANCEL, id));
            // SAFETY: ASYNC_CANCEL references no memory.
            unsafe { self.push(e) };
        }
        self.maybe_remove(id);
    }

    fn maybe_remove(&mut self, id: u64) {
        if self
            .conns
            .get(&id)
            .is_some_and(|c| c.dead && !c.recv_busy && !c.send_busy)
        {
            // No operation references the buffers or the fd any more.
            self.conns.remove(&id);
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
