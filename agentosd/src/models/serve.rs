//! Accepting an agent's connections to the gateway: on its Unix socket (each peer identified by
//! the kernel: its process must be in the agent's cgroup) and on its loopback port (tcp.rs: the
//! port lives in the agent's own network namespace, so every peer is the agent's). At most
//! [`super::MAX_CONNS_PER_AGENT`] connections at once over both, each served as HTTP/1.1.

use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;

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

/// Serves one accepted connection until it closes: if the open-file budget of all agents'
/// connections has room (ipc/files.rs), else it is closed at once and recorded.
fn serve_conn<S>(gw: Arc<Gateway>, agent: Arc<AgentModels>, permit: OwnedSemaphorePermit, io: S)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let files = &crate::ipc::files::AGENT_CONN_FILES;
    let Some(file) = files.take() else {
        drop(io);
        let why = files.refusal();
        gw.refused_conn(
            &agent,
            &format!("model gateway: refused a connection: {why}"),
            json!({"event": "socket-refused", "socket": "models", "reason": why}),
        );
        return;
    };
    // Every poll of the connection (reading, parsing, the gate, forwarding) is the agent's CPU.
    let cpu = agent.rate.cpu().cloned().unwrap_or_default();
    tokio::spawn(crate::ipc::cpu::Measured::new(
        async move {
            let _permit = permit;
            let _file = file;
            let io = agent.rate.reader(io);
            let svc = hyper::service::service_fn(move |req| {
                agent.rate.request();
                http::handle(gw.clone(), agent.clone(), req)
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(Duration::from_secs(30))
                .max_buf_size(64 * 1024)
                .serve_connection(hyper_util::rt::TokioIo::new(io), svc)
                .await;
        },
        cpu,
    ));
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
        agent.rate.accept().await;
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!("{}: model socket accept: {e}", agent.id);
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        if let Err(r) = crate::ipc::identify(stream.as_fd(), &who) {
            gw.refused_conn(
                &agent,
                &format!(
                    "model socket: refused a connection from pid {:?} uid {} ({})",
                    r.pid, r.uid, r.reason
                ),
                json!({
                    "event": "socket-refused",
                    "socket": "models",
                    "reason": r.reason,
                    "peer_pid": r.pid,
                    "peer_uid": r.uid,
                    "peer_cgroup": r.cgroup,
                }),
            );
            continue;
        }
        serve_conn(gw.clone(), agent.clone(), permit, stream);
    }
}

/// The agent's TCP port. `peers_from: None`: the port is in the agent's own network namespace
/// (tcp.rs), every peer is the agent's. `Some(cgroup_dir)`: the port is on the host's loopback
/// (an agent with network grants), where any local process can connect, so each peer is
/// identified by the kernel (peer_tcp.rs): its socket must have been made in `cgroup_dir` or
/// below, else the connection is closed and recorded.
pub(super) async fn accept_tcp(
    gw: Arc<Gateway>,
    agent: Arc<AgentModels>,
    conns: Arc<Semaphore>,
    listener: tokio::net::TcpListener,
    peers_from: Option<std::path::PathBuf>,
) {
    loop {
        let Ok(permit) = conns.clone().acquire_owned().await else {
            return;
        };
        agent.rate.accept().await;
        let (s, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!("{}: model port accept: {e}", agent.id);
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        if let Some(dir) = &peers_from
            && let Err((reason, uid)) = host_peer(dir, peer, s.local_addr()).await
        {
            refused_port(&gw, &agent, &peer, &reason, uid);
            continue;
        }
        let _ = s.set_nodelay(true);
        serve_conn(gw.clone(), agent.clone(), permit, s);
    }
}

/// Whether the connection `peer` → `local` was made by a socket of the cgroup `dir` or below;
/// why not, with the peer's uid when known.
async fn host_peer(
    dir: &std::path::Path,
    peer: std::net::SocketAddr,
    local: std::io::Result<std::net::SocketAddr>,
) -> Result<(), (String, Option<u32>)> {
    let (std::net::SocketAddr::V4(p), Ok(std::net::SocketAddr::V4(l))) = (peer, local) else {
        return Err(("not an IPv4 loopback peer".into(), None));
    };
    let dir = dir.to_path_buf();
    let found = tokio::task::spawn_blocking(move || {
        let (id, uid) = super::peer_tcp::peer_of(p, l)?;
        Ok::<_, std::io::Error>((
            super::peer_tcp::cgroup_ids(&dir, 1024).contains(&id),
            id,
            uid,
        ))
    })
    .await
    .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())));
    match found {
        Ok((true, _, _)) => Ok(()),
        Ok((false, id, uid)) => Err((
            format!("its socket was made in cgroup id {id}, not the agent's"),
            Some(uid),
        )),
        Err(e) => Err((format!("who it is is unknown: {e}"), None)),
    }
}

fn refused_port(
    gw: &Gateway,
    agent: &AgentModels,
    peer: &std::net::SocketAddr,
    reason: &str,
    uid: Option<u32>,
) {
    gw.refused_conn(
        agent,
        &format!("model port: refused a connection from {peer} ({reason})"),
        json!({
            "event": "socket-refused",
            "socket": "models-port",
            "reason": reason,
            "peer": peer.to_string(),
            "peer_uid": uid,
        }),
    );
}
