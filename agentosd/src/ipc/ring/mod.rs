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

mod accept;
mod conn;
mod rate;
mod stall;

use super::budget::{self, ConnBytes};
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
    /// The peer, for the disconnect report.
    pid: Option<u32>,
    uid: u32,
    fd: OwnedFd,
    /// Byte counts shared with the connection's Inbox and Outbox (budget.rs).
    bytes: Arc<ConnBytes>,
    /// Since when the agent has not kept up with its replies (over the outbound bound).
    over_since: Option<Instant>,
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
    /// The agent's bucket of daemon work (ring/rate.rs).
    rate: rate::AgentRate,
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
    /// Completions reaped but not yet handled.
    backlog: VecDeque<(u64, i32)>,
    shutdown_deadline: Option<Instant>,
    /// A stall tick is in flight.
    stall_armed: bool,
    /// Connections not read until their agent's bucket allows (ring/rate.rs).
    rate_waiting: HashSet<u64>,
    /// Listeners not accepting until their agent's bucket allows.
    accept_waiting: HashSet<u64>,
    /// A rate tick is in flight.
    rate_armed: bool,
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
            // One line of `max_line` always fits: a real message is never refused for its size
            // alone, only held until the daemon takes the ones before it.
            inbound_bytes: limits.inbound_bytes.max(limits.max_line.max(1)),
            outbound_bytes: limits.outbound_bytes.max(1),
            agent_bytes: limits.agent_bytes.max(1),
            stall_timeout: limits.stall_timeout,
            agent_rate: limits.agent_rate,
            nice: limits.nice,
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
            backlog: VecDeque::new(),
            shutdown_deadline: None,
            stall_armed: false,
            rate_waiting: HashSet::new(),
            accept_waiting: HashSet::new(),
            rate_armed: false,
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
        if let Some(n) = self.limits.nice
            && let Err(e) = crate::agent_work::set_thread_nice(n)
        {
            warn!("ipc: cannot set the ring thread's nice to {n}: {e}");
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
            K_STALL => self.on_stall_tick(),
            K_RATE => self.on_rate_tick(),
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

    fn new_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    fn entry(&mut self, agent: &AgentRef) -> &mut AgentEntry {
        // One whole line (and the receive that completes it) always fits the burst.
        let min_burst = (self.limits.max_line + RECV_BUF) as u64;
        let rate = self.limits.agent_rate;
        let e = self
            .agents
            .entry(agent.id.clone())
            .or_insert_with(|| AgentEntry {
                agent: agent.clone(),
                listeners: HashSet::new(),
                conns: HashSet::new(),
                rate: rate::AgentRate::new(rate, min_burst, Instant::now()),
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
