//! Accepting an agent's connections to the gateway: on its Unix socket (each peer identified by
//! the kernel: its process must be in the agent's cgroup) and on its loopback port (tcp.rs: the
//! port lives in the agent's own network namespace, so every peer is the agent's). At most
//! [`super::MAX_CONNS_PER_AGENT`] connections at once over both, each served as HTTP/1.1.

use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;

use audit::{Decision, Kind};
use serde_json::json;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::{AgentModels, Gateway, http};
use crate::ipc::AgentRef;

/// One agent being served.
pub(super) struct Serving {
    pub agent: Arc<AgentModels>,
    /// Its connections, over the socket and the port together.
    pub conns: Arc<Semaphore>,
    pub tasks: Vec<tokio::task::AbortHandle>,
}

impl Serving {
    pub fn abort(&self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Serves one accepted connection until it closes.
fn serve_conn<S>(gw: Arc<Gateway>, agent: Arc<AgentModels>, permit: OwnedSemaphorePermit, io: S)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let _permit = permit;
        let svc =
            hyper::service::service_fn(move |req| http::handle(gw.clone(), agent.clone(), req));
        let _ = hyper::server::conn::http1::Builder::new()
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(Duration::from_secs(30))
            .max_buf_size(64 * 1024)
            .serve_connection(hyper_util::rt::TokioIo::new(io), svc)
            .await;
    });
}

/// The agent's Unix socket.
pub(super) async fn accept_unix(
    gw: Arc<Gateway>,
    agent: Arc<AgentModels>,
    conns: Arc<Semaphore>,
    who: AgentRef,
    listener: tokio::net::UnixListener,
) {
    loop {
        let Ok(permit) = conns.clone().acquire_owned().await else {
            return;
        };
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!("{}: model socket accept: {e}", agent.id);
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        if let Err(r) = crate::ipc::identify(stream.as_fd(), &who) {
            tracing::warn!(
                "{}: model socket: refused a connection from pid {:?} uid {} ({})",
                agent.id,
                r.pid,
                r.uid,
                r.reason
            );
            if let Some(t) = &gw.audit {
                t.submit_or_count(
                    t.agent_record(Kind::Gate, &agent.tenant, &agent.name)
                        .decision(Decision::Deny)
                        .detail(json!({
                            "event": "socket-refused",
                            "socket": "models",
                            "reason": r.reason,
                            "peer_pid": r.pid,
                            "peer_uid": r.uid,
                            "peer_cgroup": r.cgroup,
                        })),
                );
            }
            continue;
        }
        serve_conn(gw.clone(), agent.clone(), permit, stream);
    }
}

/// The agent's loopback port, in its own network namespace.
pub(super) async fn accept_tcp(
    gw: Arc<Gateway>,
    agent: Arc<AgentModels>,
    conns: Arc<Semaphore>,
    listener: tokio::net::TcpListener,
) {
    loop {
        let Ok(permit) = conns.clone().acquire_owned().await else {
            return;
        };
        match listener.accept().await {
            Ok((s, _)) => {
                let _ = s.set_nodelay(true);
                serve_conn(gw.clone(), agent.clone(), permit, s);
            }
            Err(e) => {
                tracing::warn!("{}: model port accept: {e}", agent.id);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}
