//! One connection's traffic: receiving and splitting lines into the inbound queue, batching the
//! outbox into sends, and tearing the connection down without freeing memory an in-flight
//! operation still points at (see the buffer rules in `ring/mod.rs`).

use super::*;

impl Conn {
    /// Count the lines the splitter added to `pending` past its first `before` entries.
    fn count_received(&self, before: usize) {
        let n = self
            .pending
            .iter()
            .skip(before)
            .map(super::super::inbound_len)
            .sum();
        self.bytes.received(n);
    }
}

/// A receive buffer; its pages are touched only by what is received into it.
fn new_recv_buf() -> Box<[u8]> {
    vec![0u8; RECV_BUF].into_boxed_slice()
}

impl Ring {
    pub(super) fn submit_recv(&mut self, id: u64) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if c.dead || c.recv_busy || c.eof || !c.pending.is_empty() || c.waiter.is_some() {
            return;
        }
        if self.paused_on_bytes(id) || self.paused_on_rate(id) {
            return;
        }
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.recv_busy = true;
        if c.rbuf.is_none() && !c.ready {
            // Idle: no buffer until there is something to read.
            let e = on_sock!(&c.fd, |t| opcode::PollAdd::new(t, libc::POLLIN as u32)
                .build())
            .user_data(ud(K_RECV_POLL, id));
            // SAFETY: POLL_ADD references no memory; the socket is closed only once this
            // completion has cleared `recv_busy` (maybe_remove).
            unsafe { self.push(e) };
            return;
        }
        c.ready = false;
        let spare = &mut self.spare;
        let buf = c
            .rbuf
            .get_or_insert_with(|| spare.pop().unwrap_or_else(new_recv_buf));
        let (ptr, len) = (buf.as_mut_ptr(), buf.len() as u32);
        let e =
            on_sock!(&c.fd, |t| opcode::Recv::new(t, ptr, len).build()).user_data(ud(K_RECV, id));
        // SAFETY: `rbuf` is a boxed slice: its heap address is stable while the `Conn` moves in
        // the map, and it is not taken, replaced or dropped while `recv_busy` is set, which only
        // this operation's CQE clears; the `Conn` is removed (and its socket closed) only after
        // that (maybe_remove).
        unsafe { self.push(e) };
    }

    /// An idle connection's poll completed (readable, hung up, or cancelled): receive.
    pub(super) fn on_recv_poll(&mut self, id: u64) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.recv_busy = false;
        c.ready = true;
        if c.dead {
            self.maybe_remove(id);
        } else {
            self.submit_recv(id);
        }
    }

    /// Give connection `id`'s receive buffer back to the pool (no receive is in flight).
    fn return_buf(&mut self, id: u64) {
        if let Some(buf) = self.conns.get_mut(&id).and_then(|c| c.rbuf.take())
            && self.spare.len() < SPARE_RECV_BUFS
        {
            self.spare.push(buf);
        }
    }

    pub(super) fn on_recv(&mut self, id: u64, res: i32) {
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
            let before = c.pending.len();
            let Some(buf) = c.rbuf.as_ref() else {
                // Never: a receive is only submitted with a buffer.
                self.teardown(id);
                return;
            };
            c.split.feed(&buf[..n], &mut c.pending);
            c.count_received(before);
            let full = n == buf.len();
            let (agent, lines) = (c.agent.clone(), c.pending.len() - before);
            if full {
                // More is probably waiting: keep the buffer and receive again.
                c.ready = true;
            } else {
                self.return_buf(id);
            }
            self.charge(&agent, n, lines);
            self.deliver(id);
            return;
        }
        self.return_buf(id);
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if res == 0 {
            c.eof = true;
            let before = c.pending.len();
            c.split.finish(&mut c.pending);
            c.count_received(before);
            self.deliver(id);
            return;
        }
        let errno = -res;
        match errno {
            libc::EINTR | libc::ECANCELED => self.submit_recv(id),
            // Nothing to read after all: wait for it without a buffer.
            libc::EAGAIN => self.submit_recv(id),
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
    pub(super) fn deliver(&mut self, id: u64) {
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

    pub(super) fn flush(&mut self, id: u64) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.flagged.store(false, Ordering::Release);
        let busy = c.dead || c.send_busy;
        // A sender may have started waiting for room: the stall clock starts now. Or one that
        // waited got its room and queued its line: then a read paused on the outbound bound
        // may go on, and nothing else would resume it (the send in flight is stuck on an agent
        // that does not read, and a stall clock no longer runs); `submit_recv` checks the
        // bounds again and does nothing while a receive is in flight.
        self.track(id);
        self.submit_recv(id);
        if busy {
            return;
        }
        self.fill_and_send(id);
    }

    /// Take queued lines (up to one batch) into `wbuf` and send them; close when nothing is
    /// left and the connection is done.
    pub(super) fn fill_and_send(&mut self, id: u64) {
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
    pub(super) fn maybe_finish(&mut self, id: u64) {
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

    pub(super) fn submit_send(&mut self, id: u64) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if c.dead || c.send_busy || c.woff >= c.wbuf.len() {
            return;
        }
        c.send_busy = true;
        let rest = &c.wbuf[c.woff..];
        let (ptr, len) = (rest.as_ptr(), rest.len().min(u32::MAX as usize) as u32);
        let e = on_sock!(&c.fd, |t| opcode::Send::new(t, ptr, len)
            .flags(libc::MSG_NOSIGNAL)
            .build())
        .user_data(ud(K_SEND, id));
        // SAFETY: `wbuf` is not touched (cleared, grown or replaced) while `send_busy` is set,
        // so the pointed-to bytes stay valid and unmoved; the `Conn` owning it is only removed
        // after this operation's CQE clears `send_busy` (maybe_remove).
        unsafe { self.push(e) };
    }

    pub(super) fn on_send(&mut self, id: u64, res: i32) {
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
            c.bytes.sent(res as usize);
            c.woff += res as usize;
            if c.woff < c.wbuf.len() {
                // Short send: the rest, from where the kernel stopped.
                self.submit_send(id);
            } else {
                self.fill_and_send(id);
            }
            // The agent read: it may be back under its bound.
            self.track(id);
            self.submit_recv(id);
            return;
        }
        let errno = if res == 0 { libc::EAGAIN } else { -res };
        match errno {
            libc::EINTR | libc::ECANCELED => self.submit_send(id),
            libc::EAGAIN => {
                c.send_busy = true;
                self.retry_poll(K_SEND_RETRY, id, libc::POLLOUT);
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
    pub(super) fn teardown(&mut self, id: u64) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if c.dead {
            return;
        }
        c.dead = true;
        // Wakes the in-flight operations, as the cancels below do.
        let fixed = match &c.fd {
            Sock::Fd(fd) => {
                let _ = shutdown(fd.as_raw_fd(), Shutdown::Both);
                None
            }
            Sock::Fixed(slot) => Some(*slot),
        };
        if let Some(slot) = fixed {
            let e = opcode::Shutdown::new(types::Fixed(slot), libc::SHUT_RDWR)
                .build()
                .user_data(ud(K_SHUTDOWN, id));
            // SAFETY: SHUTDOWN references no memory; the slot is released only after the
            // connection's operations, this one included, have completed (maybe_remove).
            unsafe { self.push(e) };
            if let Some(c) = self.conns.get_mut(&id) {
                c.shutdown_busy = true;
            }
        }
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if let Some(w) = c.waiter.take() {
            w.abort();
        }
        c.in_tx = None;
        c.pending.clear();
        c.over_since = None;
        // Waiting senders get Closed, the inbox ends, queued replies are freed now.
        c.bytes.close();
        c.out_rx.close();
        while c.out_rx.try_recv().is_ok() {}
        let (recv_busy, send_busy) = (c.recv_busy, c.send_busy);
        let agent = c.agent.clone();
        if let Some(e) = self.agents.get_mut(&agent) {
            e.conns.remove(&id);
        }
        dec(&self.shared.stats.open);
        let mut kinds = Vec::new();
        if recv_busy {
            kinds.extend([K_RECV, K_RECV_RETRY, K_RECV_POLL]);
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

    pub(super) fn maybe_remove(&mut self, id: u64) {
        if self
            .conns
            .get(&id)
            .is_some_and(|c| c.dead && !c.recv_busy && !c.send_busy && !c.shutdown_busy)
        {
            // No operation references the buffers or the socket any more.
            self.return_buf(id);
            if let Some(c) = self.conns.remove(&id) {
                self.release(c.fd);
            }
        }
    }
}
