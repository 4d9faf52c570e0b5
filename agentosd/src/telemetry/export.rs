//! The exporter: one task that takes spans from the bounded queue, batches them and posts them
//! to the collector (`POST PATH/v1/traces`, `application/x-protobuf`) over HTTP/1.1 with
//! hyper, and posts the metrics the ticker encodes (`PATH/v1/metrics`). Each export has a
//! timeout; a failed one is dropped and counted, never retried (the queue behind it keeps
//! filling and dropping instead of growing). Failures are logged when they begin, every 30 s
//! while they last, and when the collector answers again.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper::client::conn::http1;
use hyper::{Request, Uri, header};
use hyper_util::rt::TokioIo;
use tokio::sync::{mpsc, oneshot};

use super::otlp::{self, Resource};
use super::{OtlpConfig, SpanData, TelemetryError};

/// What the queue carries.
pub enum Msg {
    Span(SpanData),
    /// Send what is batched, then answer.
    Flush(oneshot::Sender<()>),
}

/// The exporter's counts, read by [`super::Telemetry::stats`].
#[derive(Debug, Default)]
pub struct Counters {
    pub exported_spans: AtomicU64,
    pub failed_spans: AtomicU64,
    pub failed_metrics: AtomicU64,
}

/// Where exports go: the collector's address and the two paths.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// `host:port` to connect to and to send as `Host`.
    pub authority: String,
    pub traces: String,
    pub metrics: String,
}

impl Target {
    /// `http://HOST[:PORT][/PATH]` (port 4318 when absent). https is not spoken: a collector
    /// on the host (or a sidecar) forwards with TLS.
    pub fn parse(endpoint: &str) -> Result<Target, TelemetryError> {
        let bad = |why: &str| TelemetryError::Endpoint {
            endpoint: endpoint.to_string(),
            why: why.to_string(),
        };
        let uri: Uri = endpoint
            .parse()
            .map_err(|e| bad(&format!("not a URL: {e}")))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") => {
                return Err(bad(
                    "https is not supported; export to a collector on this host over http and let it forward with TLS",
                ));
            }
            _ => return Err(bad("the URL must start with http://")),
        }
        let host = uri.host().ok_or_else(|| bad("no host"))?;
        if uri.query().is_some() {
            return Err(bad("a query string is not allowed"));
        }
        let port = uri.port_u16().unwrap_or(4318);
        let base = uri.path().trim_end_matches('/');
        Ok(Target {
            authority: format!("{host}:{port}"),
            traces: format!("{base}/v1/traces"),
            metrics: format!("{base}/v1/metrics"),
        })
    }
}

/// An export that failed: why, for the log.
type Failure = String;

/// The HTTP side: one kept-alive connection, made again when it broke or an export timed out.
struct Http {
    target: Target,
    timeout: Duration,
    conn: Option<http1::SendRequest<Full<Bytes>>>,
}

impl Http {
    async fn connection(&mut self) -> Result<&mut http1::SendRequest<Full<Bytes>>, Failure> {
        if self.conn.as_ref().is_some_and(|c| c.is_closed()) {
            self.conn = None;
        }
        if self.conn.is_none() {
            let stream = tokio::net::TcpStream::connect(&self.target.authority)
                .await
                .map_err(|e| format!("connecting to {}: {e}", self.target.authority))?;
            let _ = stream.set_nodelay(true);
            let (send, conn) = http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|e| format!("HTTP handshake with {}: {e}", self.target.authority))?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            self.conn = Some(send);
        }
        let c = self.conn.as_mut().ok_or("no connection")?;
        c.ready()
            .await
            .map_err(|e| format!("connection to {}: {e}", self.target.authority))?;
        Ok(c)
    }

    /// POST `body` to `path`; Ok when the collector answered 2xx within the timeout.
    async fn post(&mut self, path: &str, body: Vec<u8>) -> Result<(), Failure> {
        let timeout = self.timeout;
        let authority = self.target.authority.clone();
        let r = tokio::time::timeout(timeout, async {
            let req = Request::post(path)
                .header(header::HOST, &authority)
                .header(header::CONTENT_TYPE, "application/x-protobuf")
                .header(
                    header::USER_AGENT,
                    concat!("agentosd/", env!("CARGO_PKG_VERSION")),
                )
                .body(Full::new(Bytes::from(body)))
                .map_err(|e| format!("request: {e}"))?;
            let c = self.connection().await?;
            let resp = c
                .send_request(req)
                .await
                .map_err(|e| format!("POST http://{authority}{path}: {e}"))?;
            let status = resp.status();
            // Read (a bounded amount of) the answer so the connection can be reused.
            let body = Limited::new(resp.into_body(), 64 * 1024).collect().await;
            if !status.is_success() {
                let text: String = body
                    .map(|b| {
                        String::from_utf8_lossy(&b.to_bytes())
                            .chars()
                            .take(200)
                            .collect::<String>()
                    })
                    .unwrap_or_default();
                return Err(format!("POST http://{authority}{path}: {status} {text}"));
            }
            Ok(())
        })
        .await;
        match r {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => {
                self.conn = None;
                Err(e)
            }
            Err(_) => {
                // The request may be stuck on this connection: never reuse it.
                self.conn = None;
                Err(format!(
                    "POST http://{authority}{path}: no answer within {} ms",
                    timeout.as_millis()
                ))
            }
        }
    }
}

/// The export task's state.
pub struct Exporter {
    http: Http,
    resource: Resource,
    counters: Arc<Counters>,
    max_batch: usize,
    flush_interval: Duration,
    endpoint: String,
    /// Since when exports fail, and when that was last said.
    failing: Option<(Instant, Instant)>,
}

impl Exporter {
    pub fn new(
        target: Target,
        cfg: &OtlpConfig,
        counters: Arc<Counters>,
        resource: Resource,
    ) -> Exporter {
        Exporter {
            http: Http {
                target,
                timeout: cfg.export_timeout,
                conn: None,
            },
            resource,
            counters,
            max_batch: cfg.max_batch.max(1),
            flush_interval: cfg.flush_interval.max(Duration::from_millis(10)),
            endpoint: cfg.endpoint.clone(),
            failing: None,
        }
    }

    /// Until the telemetry is dropped (the queue closes): batch, post, count.
    pub async fn run(
        mut self,
        mut spans: mpsc::Receiver<Msg>,
        mut metrics: mpsc::Receiver<Vec<u8>>,
    ) {
        let mut batch: Vec<SpanData> = Vec::with_capacity(self.max_batch);
        let mut tick = tokio::time::interval(self.flush_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                m = spans.recv() => match m {
                    Some(Msg::Span(s)) => {
                        batch.push(s);
                        if batch.len() >= self.max_batch {
                            self.export_spans(&mut batch).await;
                        }
                    }
                    Some(Msg::Flush(done)) => {
                        self.export_spans(&mut batch).await;
                        let _ = done.send(());
                    }
                    None => {
                        self.export_spans(&mut batch).await;
                        return;
                    }
                },
                Some(body) = metrics.recv() => self.export_metrics(body).await,
                _ = tick.tick() => self.export_spans(&mut batch).await,
            }
        }
    }

    async fn export_spans(&mut self, batch: &mut Vec<SpanData>) {
        if batch.is_empty() {
            return;
        }
        let n = batch.len() as u64;
        let body = otlp::traces_request(&self.resource, batch);
        batch.clear();
        let path = self.http.target.traces.clone();
        match self.http.post(&path, body).await {
            Ok(()) => {
                self.counters.exported_spans.fetch_add(n, Ordering::Relaxed);
                self.recovered();
            }
            Err(e) => {
                self.counters.failed_spans.fetch_add(n, Ordering::Relaxed);
                self.failed(&e);
            }
        }
    }

    async fn export_metrics(&mut self, body: Vec<u8>) {
        let path = self.http.target.metrics.clone();
        match self.http.post(&path, body).await {
            Ok(()) => self.recovered(),
            Err(e) => {
                self.counters.failed_metrics.fetch_add(1, Ordering::Relaxed);
                self.failed(&e);
            }
        }
    }

    fn dropped(&self) -> u64 {
        self.counters.failed_spans.load(Ordering::Relaxed)
    }

    fn failed(&mut self, why: &str) {
        let now = Instant::now();
        let say = match &mut self.failing {
            None => {
                self.failing = Some((now, now));
                true
            }
            Some((_, said)) if now.duration_since(*said) >= Duration::from_secs(30) => {
                *said = now;
                true
            }
            Some(_) => false,
        };
        if say {
            tracing::warn!(
                "OpenTelemetry: export to {} failed: {why}; spans and metrics are dropped and counted (spans lost in failed exports so far: {}); calls are not delayed",
                self.endpoint,
                self.dropped()
            );
        }
    }

    fn recovered(&mut self) {
        if let Some((since, _)) = self.failing.take() {
            tracing::info!(
                "OpenTelemetry: {} accepts exports again after {} s (spans lost in failed exports so far: {})",
                self.endpoint,
                since.elapsed().as_secs(),
                self.dropped()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse_with_default_port_and_base_path() {
        let t = Target::parse("http://127.0.0.1:4318").unwrap();
        assert_eq!(t.authority, "127.0.0.1:4318");
        assert_eq!(
            (t.traces.as_str(), t.metrics.as_str()),
            ("/v1/traces", "/v1/metrics")
        );
        let t = Target::parse("http://collector/otlp/").unwrap();
        assert_eq!(t.authority, "collector:4318");
        assert_eq!(t.traces, "/otlp/v1/traces");
        for bad in [
            "https://c:4318",
            "127.0.0.1:4318",
            "http://c:4318/?x=1",
            "not a url",
        ] {
            let e = Target::parse(bad).expect_err(bad).to_string();
            assert!(e.contains(bad) || e.contains("URL"), "{e}");
        }
    }
}
