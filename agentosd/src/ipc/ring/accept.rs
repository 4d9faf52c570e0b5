//! Listeners: accepting on an agent's socket, the peer check, and admitting a connection into
//! the ring (or refusing it with a reason the tokio side reports).

use super::*;

impl Ring {
    /// Stop accepting on a listener; its fd closes once its accept has completed.
    pub(super) fn close_listener(&mut self, id: u64) {
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

    pub(super) fn maybe_remove_listener(&mut self, id: u64) {
        if self.listeners.get(&id).is_some_and(|l| l.dead && !l.busy)
            && let Some(l) = self.listeners.remove(&id)
        {
            // Closing the socket drops connections still in its backlog: their peers see EOF.
            self.release(l.fd);
        }
    }

    pub(super) fn submit_accept(&mut self, id: u64) {
        let Some(l) = self.listeners.get_mut(&id) else {
            return;
        };
        if l.dead || l.busy {
            return;
        }
        if self.accept_paused_on_rate(id) {
            return;
        }
        let Some(l) = self.listeners.get_mut(&id) else {
            return;
        };
        l.busy = true;
        // The accepted socket is an ordinary fd: the peer check reads its credentials, then
        // `admit` parks it.
        let e = on_sock!(&l.fd, |t| opcode::Accept::new(
            t,
            std::ptr::null_mut(),
            std::ptr::null_mut()
        )
        .flags(libc::SOCK_CLOEXEC)
        .build())
        .user_data(ud(K_ACCEPT, id));
        // SAFETY: no address buffer is passed (null addr/addrlen); the listening fd stays open
        // until the listener is removed, which waits for `busy` to clear on this CQE.
        unsafe { self.push(e) };
    }

    pub(super) fn retry_timer(&mut self, kind: u64, id: u64, ts: &'static types::Timespec) {
        let e = opcode::Timeout::new(ts).build().user_data(ud(kind, id));
        // SAFETY: the timespec is a static; a timeout references nothing else.
        unsafe { self.push(e) };
    }

    /// Poll connection `id` for `events`, completing as `kind`.
    pub(super) fn retry_poll(&mut self, kind: u64, id: u64, events: i16) {
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        let e = on_sock!(&c.fd, |t| opcode::PollAdd::new(t, events as u32).build())
            .user_data(ud(kind, id));
        // SAFETY: POLL_ADD references no memory; the socket belongs to a connection that is only
        // removed (and its socket closed) once this completion (its busy flag) has been seen.
        unsafe { self.push(e) };
    }

    pub(super) fn on_accept(&mut self, id: u64, res: i32) {
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
        self.charge(&agent, crate::ipc::rate::ACCEPT_COST as usize, 0);
        self.submit_accept(id);
        let ident = match self.agents.get(&agent) {
            Some(e) => peer::identify(fd.as_fd(), &e.agent),
            None => return,
        };
        self.admit(&agent, fd, ident, false);
    }

    pub(super) fn refuse(&mut self, agent: &str, r: Refused) {
        bump(&self.shared.stats.refused, 1);
        debug!(agent, pid = ?r.pid, "ipc: refused a connection: {}", r.reason);
        let refusal = Refusal {
            agent: agent.to_string(),
            pid: r.pid,
            uid: r.uid,
            cgroup: r.cgroup,
            reason: r.reason,
        };
        if let Err(e) = self.reports.refusals.try_send(refusal) {
            bump(&self.shared.stats.refusals_dropped, 1);
            let r = match e {
                mpsc::error::TrySendError::Full(r) | mpsc::error::TrySendError::Closed(r) => r,
            };
            warn!(agent, pid = ?r.pid, "ipc: refused a connection ({}); refusal queue full", r.reason);
        }
    }

    /// A connection passed (or failed) the identity rule: check the limit, hand it over.
    pub(super) fn admit(
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
                ident.refused(format!(
                        "agent already has {max} connections open (max_conns_per_agent); close one first"
                    )),
            );
        }
        // A connection without a registered slot is an ordinary fd: from the budget all agents
        // share (ipc/files.rs), or refused.
        let sock = self.park(fd);
        let file = match &sock {
            Sock::Fixed(_) => None,
            Sock::Fd(_) => match crate::ipc::files::AGENT_CONN_FILES.take() {
                Some(p) => Some(p),
                None => {
                    drop(sock);
                    return self.refuse(
                        agent,
                        ident.refused(crate::ipc::files::AGENT_CONN_FILES.refusal()),
                    );
                }
            },
        };
        let id = self.new_id();
        let (in_tx, rx) = mpsc::channel(self.limits.inbound_queue);
        let (out_tx, out_rx) = mpsc::channel(self.limits.outbound_queue);
        let flagged = Arc::new(AtomicBool::new(false));
        let bytes = Arc::new(ConnBytes::new(self.limits.outbound_bytes));
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
                bytes: bytes.clone(),
            }),
        };
        let rx = super::super::Inbox {
            rx,
            bytes: bytes.clone(),
            conn: id,
            shared: self.shared.clone(),
        };
        if let Err(e) = self.conns_tx.try_send(Connection { peer, rx, tx }) {
            self.release(sock);
            let why = match e {
                mpsc::error::TrySendError::Full(_) => "agentosd's connection queue is full",
                mpsc::error::TrySendError::Closed(_) => "agentosd is not taking connections",
            };
            return self.refuse(agent, ident.refused(why.into()));
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
                pid: ident.pid,
                uid: ident.uid,
                fd: sock,
                _file: file,
                bytes,
                over_since: None,
                rbuf: None,
                ready: false,
                split: LineSplitter::new(self.limits.max_line),
                pending: VecDeque::new(),
                in_tx: Some(in_tx),
                waiter: None,
                out_rx,
                flagged,
                wbuf: Vec::new(),
                woff: 0,
                recv_busy: false,
                shutdown_busy: false,
                send_busy: false,
                eof: false,
                out_done: false,
                closing: false,
                dead: false,
            },
        );
        self.submit_recv(id);
    }
}
