//! The two halves of a connection the daemon holds: [`Inbox`] (lines received) and [`Outbox`]
//! (replies), with the byte accounting of budget.rs on both.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::mpsc;

use super::budget::ConnBytes;
use super::ring::Cmd;
use super::{Closed, Inbound, Shared, TrySendError};

/// The receiving half of a connection: lines taken from here leave the connection's inbound
/// byte count (and let the ring read again when it had paused).
pub struct Inbox {
    pub(super) rx: mpsc::Receiver<Inbound>,
    pub(super) bytes: Arc<ConnBytes>,
    pub(super) conn: u64,
    pub(super) shared: Arc<Shared>,
}

impl Inbox {
    /// The next line; None once the peer closed and every line was taken, or at once when the
    /// daemon closed the connection (the lines still queued are dropped).
    pub async fn recv(&mut self) -> Option<Inbound> {
        if self.bytes.is_closed() {
            return None;
        }
        let m = self.rx.recv().await?;
        if self.bytes.is_closed() {
            return None;
        }
        if self.bytes.taken(inbound_len(&m)) {
            let _ = self.shared.command(Cmd::Read(self.conn));
        }
        Some(m)
    }
}

/// The bytes a received message holds.
pub(super) fn inbound_len(m: &Inbound) -> usize {
    match m {
        Inbound::Line(l) => l.len(),
        Inbound::TooLong { .. } => 0,
    }
}

/// The sending half of a connection; cheap to clone.
#[derive(Clone)]
pub struct Outbox {
    pub(super) inner: Arc<OutboxInner>,
}

pub(super) struct OutboxInner {
    pub(super) conn: u64,
    /// Always Some until drop (taken there so the ring sees the channel closed).
    pub(super) tx: Option<mpsc::Sender<Vec<u8>>>,
    /// Set while a `Flush` for this connection is queued to the ring (saves wake-ups).
    pub(super) flagged: Arc<AtomicBool>,
    pub(super) shared: Arc<Shared>,
    pub(super) bytes: Arc<ConnBytes>,
}

/// Outbound bytes reserved for a line not yet queued: given back unless [`Reserved::keep`].
struct Reserved<'a> {
    bytes: &'a ConnBytes,
    n: usize,
}

impl Reserved<'_> {
    fn keep(self) {
        std::mem::forget(self);
    }
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        self.bytes.sent(self.n);
    }
}

/// Counts a sender as waiting while it lives (also when its future is dropped).
struct Waiting<'a>(&'a ConnBytes);

impl<'a> Waiting<'a> {
    fn new(b: &'a ConnBytes) -> Self {
        b.set_waiting(true);
        Waiting(b)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.set_waiting(false);
    }
}

impl Outbox {
    fn sender(&self) -> &mpsc::Sender<Vec<u8>> {
        // Invariant: `tx` is only taken in OutboxInner::drop.
        self.inner
            .tx
            .as_ref()
            .unwrap_or_else(|| unreachable!("outbox sender taken before drop"))
    }

    /// The connection this sends on.
    pub fn conn(&self) -> u64 {
        self.inner.conn
    }

    /// Queue one line (the `\n` is appended; `line` must not contain one). Waits while the
    /// outbound queue is full in lines or bytes, i.e. while the agent does not read
    /// (back-pressure); [`Limits::stall_timeout`] of that closes the connection.
    pub async fn send(&self, mut line: Vec<u8>) -> Result<(), Closed> {
        debug_assert!(
            !line.contains(&b'\n'),
            "MCP messages must not contain newlines"
        );
        line.push(b'\n');
        let reserved = self.reserve(line.len()).await?;
        let queued = match self.sender().try_send(line) {
            Ok(()) => Ok(()),
            Err(mpsc::error::TrySendError::Full(line)) => {
                let _w = Waiting::new(&self.inner.bytes);
                self.notify();
                self.sender().send(line).await.map_err(|_| Closed)
            }
            Err(mpsc::error::TrySendError::Closed(_)) => Err(Closed),
        };
        queued?;
        reserved.keep();
        self.notify();
        Ok(())
    }

    /// Room for `n` bytes in the outbound queue, waiting for the ring to send what is queued.
    async fn reserve(&self, n: usize) -> Result<Reserved<'_>, Closed> {
        let b = &*self.inner.bytes;
        let granted = || {
            if b.is_closed() {
                return Some(Err(Closed));
            }
            b.try_reserve_out(n).then(|| Ok(Reserved { bytes: b, n }))
        };
        if let Some(r) = granted() {
            return r;
        }
        let _w = Waiting::new(b);
        // The ring starts the stall clock when it sees a waiting sender.
        self.notify();
        loop {
            let notified = b.room.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(r) = granted() {
                return r;
            }
            notified.await;
        }
    }

    /// Queue one line without waiting.
    pub fn try_send(&self, mut line: Vec<u8>) -> Result<(), TrySendError> {
        debug_assert!(
            !line.contains(&b'\n'),
            "MCP messages must not contain newlines"
        );
        let b = &*self.inner.bytes;
        if b.is_closed() {
            return Err(TrySendError::Closed(line));
        }
        if !b.try_reserve_out(line.len() + 1) {
            return Err(TrySendError::Full(line));
        }
        let reserved = Reserved {
            bytes: b,
            n: line.len() + 1,
        };
        line.push(b'\n');
        match self.sender().try_send(line) {
            Ok(()) => {
                reserved.keep();
                self.notify();
                Ok(())
            }
            Err(mpsc::error::TrySendError::Full(mut l)) => {
                l.pop();
                Err(TrySendError::Full(l))
            }
            Err(mpsc::error::TrySendError::Closed(mut l)) => {
                l.pop();
                Err(TrySendError::Closed(l))
            }
        }
    }

    /// Close the connection once the lines queued so far are sent.
    pub fn close(&self) {
        let _ = self.inner.shared.command(Cmd::Close(self.inner.conn));
    }

    /// True once the connection is closed (by either side).
    pub fn is_closed(&self) -> bool {
        self.inner.bytes.is_closed() || self.sender().is_closed()
    }

    fn notify(&self) {
        if !self.inner.flagged.swap(true, Ordering::AcqRel) {
            let _ = self.inner.shared.command(Cmd::Flush(self.inner.conn));
        }
    }
}

impl Drop for OutboxInner {
    fn drop(&mut self) {
        // Drop the sender first, so the ring's try_recv reports the channel closed.
        drop(self.tx.take());
        let _ = self.shared.command(Cmd::Flush(self.conn));
    }
}
