//! The per-agent rate on the model gateway (issue 15, "Isolation"): the same token bucket as
//! the agent's MCP socket ([`crate::ipc::rate`], `--ipc-agent-rate`), a bucket of its own over
//! all the agent's gateway connections. Every read from a connection is charged its bytes,
//! every request [`crate::ipc::rate::LINE_COST`] more, every accepted (or refused) connection
//! [`crate::ipc::rate::ACCEPT_COST`]; while the bucket is in debt none of the agent's gateway
//! connections is read and none accepted, so what it sends waits in the kernel's socket buffers
//! (bounded, and free for the daemon). An agent flooding the gateway with requests, large or
//! small, or with connections, gets `rate` worth of the daemon's parsing a second. The agent's
//! CPU account (ipc/cpu.rs) holds the same reads and accepts: every poll of its connections'
//! tasks and of its accept loops is charged to it (serve.rs, mod.rs).

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Instant;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::ipc::cpu::AgentCpu;
use crate::ipc::rate::{ACCEPT_COST, Bucket};

/// An agent's bucket on the gateway; `None` inside when there is no rate (`--ipc-agent-rate 0`).
/// With the agent's CPU account (ipc/cpu.rs, shared with its MCP sockets): while either is in
/// debt the gateway neither reads nor accepts for the agent.
#[derive(Debug, Clone, Default)]
pub struct AgentRate {
    bytes: Option<Arc<Mutex<Bucket>>>,
    cpu: Option<Arc<AgentCpu>>,
}

impl AgentRate {
    /// `rate` bytes a second (0: none); the burst holds at least one whole request.
    pub fn new(rate: u64) -> AgentRate {
        AgentRate {
            bytes: (rate > 0).then(|| {
                Arc::new(Mutex::new(Bucket::new(
                    rate,
                    super::http::MAX_REQUEST_BYTES as u64,
                    tokio::time::Instant::now().into_std(),
                )))
            }),
            cpu: None,
        }
    }

    /// Also held to the agent's CPU account.
    pub fn with_cpu(mut self, cpu: Arc<AgentCpu>) -> AgentRate {
        self.cpu = Some(cpu);
        self
    }

    /// The agent's CPU account, if any.
    pub fn cpu(&self) -> Option<&Arc<AgentCpu>> {
        self.cpu.as_ref()
    }

    fn with<T>(&self, f: impl FnOnce(&mut Bucket, Instant) -> T) -> Option<T> {
        let b = self.bytes.as_ref()?;
        let mut b = b.lock().unwrap_or_else(|p| p.into_inner());
        // tokio's clock: the same as std's, except in tests that pause it.
        Some(f(&mut b, tokio::time::Instant::now().into_std()))
    }

    /// How long until both the byte bucket and the CPU account allow serving the agent; a wait
    /// on the CPU is counted in the agent's status.
    fn wait(&self) -> std::time::Duration {
        let bytes = self.with(|b, now| b.wait(now)).unwrap_or_default();
        let cpu = self.cpu.as_ref().map_or(std::time::Duration::ZERO, |c| {
            let w = c.wait(Instant::now());
            if !w.is_zero() && w > bytes {
                c.note_pause(w);
            }
            w
        });
        bytes.max(cpu)
    }

    /// One request was read (its bytes were charged as they came).
    pub fn request(&self) {
        self.with(|b, now| b.charge(0, 1, now));
    }

    /// Wait until the bucket is out of debt, then charge one connection.
    pub async fn accept(&self) {
        loop {
            let wait = self.wait();
            if wait.is_zero() {
                break;
            }
            tokio::time::sleep(wait).await;
        }
        self.with(|b, now| b.charge(ACCEPT_COST, 0, now));
    }

    /// `io` read at the agent's rate.
    pub fn reader<S>(&self, io: S) -> Limited<S> {
        Limited {
            io,
            rate: self.clone(),
            sleep: None,
        }
    }
}

/// A connection whose reads wait while its agent's bucket is in debt and are charged to it.
pub struct Limited<S> {
    io: S,
    rate: AgentRate,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Limited<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        loop {
            if let Some(s) = this.sleep.as_mut() {
                ready!(s.as_mut().poll(cx));
                this.sleep = None;
            }
            let wait = this.rate.wait();
            if wait.is_zero() {
                break;
            }
            this.sleep = Some(Box::pin(tokio::time::sleep(wait)));
        }
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.io).poll_read(cx, buf))?;
        let n = (buf.filled().len() - before) as u64;
        if n > 0 {
            this.rate.with(|b, now| b.charge(n, 0, now));
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Limited<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, data)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A reader flooded faster than its rate reads its burst at once, then waits for the
    /// bucket: 4 MiB past the burst at 8 MiB/s take at least half a second.
    #[tokio::test]
    async fn reads_wait_for_the_bucket() {
        let rate = AgentRate::new(8 << 20);
        let (mut tx, rx) = tokio::io::duplex(64 << 10);
        let mut r = rate.reader(rx);
        tokio::spawn(async move {
            let chunk = vec![b'x'; 64 << 10];
            while tx.write_all(&chunk).await.is_ok() {}
        });
        let t0 = std::time::Instant::now();
        let mut got = 0u64;
        let mut buf = vec![0u8; 64 << 10];
        while got < (8 << 20) {
            got += r.read(&mut buf).await.unwrap() as u64;
        }
        let took = t0.elapsed();
        assert!(
            took >= std::time::Duration::from_millis(450),
            "8 MiB read in {took:?} at 8 MiB/s after a 4 MiB burst"
        );
        // No rate: no bucket to wait for.
        assert!(AgentRate::new(0).bytes.is_none());
    }

    /// Requests and connections cost on top of their bytes: a loop of them is held too
    /// (100 × 65 KiB at 4 MiB/s, past a 4 MiB burst: about 0.6 s).
    #[tokio::test]
    async fn requests_and_connections_are_charged() {
        let rate = AgentRate::new(4 << 20);
        let t0 = std::time::Instant::now();
        for _ in 0..100 {
            rate.request();
            rate.accept().await;
        }
        let took = t0.elapsed();
        assert!(
            took >= std::time::Duration::from_millis(450),
            "100 connections with a request each in {took:?}"
        );
    }
}
