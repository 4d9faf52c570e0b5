//! The telemetry service against a stub collector on 127.0.0.1 (the real OTLP receiver is in
//! tests/telemetry.rs): what it posts decodes to the spans recorded, a turn is the parent of
//! its calls, a dead or stalled collector costs the caller nothing and the losses are counted.

use std::time::{Duration, Instant, SystemTime};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

fn agent() -> AgentLabels {
    AgentLabels::new("t/a", "t", "a", Some("ab".repeat(32)))
}

fn cfg(endpoint: String) -> OtlpConfig {
    OtlpConfig {
        flush_interval: Duration::from_millis(50),
        export_timeout: Duration::from_millis(300),
        ..OtlpConfig::new(endpoint)
    }
}

/// A collector that answers 200 to every request and hands over (path, body).
async fn stub_collector() -> (String, mpsc::UnboundedReceiver<(String, Vec<u8>)>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 8192];
                loop {
                    // One request at a time: headers, then Content-Length bytes.
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).to_string();
                    let len: usize = head
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse().unwrap())
                        })
                        .unwrap_or(0);
                    while buf.len() < end + 4 + len {
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let path = head.split(' ').nth(1).unwrap_or("").to_string();
                    assert!(head.contains("application/x-protobuf"), "{head}");
                    let body = buf[end + 4..end + 4 + len].to_vec();
                    buf.drain(..end + 4 + len);
                    let _ = tx.send((path, body));
                    let _ = s
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                        .await;
                }
            });
        }
    });
    (format!("http://{addr}"), rx)
}

#[test]
fn off_records_nothing() {
    let t = Telemetry::off();
    assert!(!t.enabled());
    let ctx = t.turn(&agent(), true);
    assert_eq!(ctx.trace_id, [0; 16]);
    assert!(t.enter(&agent(), false).is_none());
    t.record(SpanData::child(&ctx, &agent(), "x", SystemTime::now()));
    t.end_agent("t/a");
    assert_eq!(t.dropped(), 0);
}

#[test]
fn start_needs_a_runtime_and_a_valid_endpoint() {
    assert!(matches!(
        Telemetry::start(OtlpConfig::new("http://127.0.0.1:4318")),
        Err(TelemetryError::NoRuntime)
    ));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _g = rt.enter();
    let e = Telemetry::start(OtlpConfig::new("https://collector:4318"))
        .err()
        .expect("https is refused")
        .to_string();
    assert!(e.contains("https is not supported"), "{e}");
}

#[tokio::test]
async fn the_collector_gets_the_turn_and_its_children() {
    let (endpoint, mut got) = stub_collector().await;
    let t = Telemetry::start(cfg(endpoint)).unwrap();
    let a = agent();
    let turn = {
        let g = t.enter(&a, true).unwrap();
        let ctx = *g.ctx();
        t.record(
            SpanData::child(&ctx, &a, "agentos.gate", SystemTime::now())
                .attr("agentos.gate.decision", "allow"),
        );
        ctx
    };
    assert_eq!(t.turn(&a, false), turn, "the next call joins the open turn");
    t.end_agent("t/a");
    let (path, body) = tokio::time::timeout(Duration::from_secs(5), got.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(path, "/v1/traces");
    let req = ExportTraceServiceRequest::decode(body.as_slice()).unwrap();
    let spans = &req.resource_spans[0].scope_spans[0].spans;
    assert_eq!(spans.len(), 2, "{spans:#?}");
    let root = spans.iter().find(|s| s.name == "agent.turn").unwrap();
    let gate = spans.iter().find(|s| s.name == "agentos.gate").unwrap();
    assert_eq!(root.span_id, turn.span_id.to_vec());
    assert!(root.parent_span_id.is_empty());
    assert_eq!(gate.parent_span_id, turn.span_id.to_vec());
    assert_eq!(gate.trace_id, root.trace_id);
    assert!(
        root.attributes
            .iter()
            .any(|kv| kv.key == "agentos.turn.end")
    );
    t.shutdown(Duration::from_secs(2)).await;
    assert_eq!(t.stats().exported, 2);
    assert_eq!(t.dropped(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_collector_costs_the_caller_nothing_and_losses_are_counted() {
    // A port nobody listens on: take one, then close it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let t = Telemetry::start(OtlpConfig {
        queue_size: 8,
        max_batch: 4,
        ..cfg(format!("http://127.0.0.1:{port}"))
    })
    .unwrap();
    let a = agent();
    let started = Instant::now();
    for _ in 0..10_000 {
        let ctx = t.turn(&a, false);
        t.record(SpanData::child(
            &ctx,
            &a,
            "execute_tool x",
            SystemTime::now(),
        ));
    }
    let took = started.elapsed();
    assert!(took < Duration::from_secs(1), "10000 records took {took:?}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while t.stats().export_failed == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let s = t.stats();
    // Every span is accounted for: dropped at the full queue, lost in a failed export, or
    // still queued (the queue plus one batch in flight).
    assert!(s.queue_full > 0, "{s:?}");
    assert!(s.queue_full + s.export_failed >= 10_000 - 8 - 4, "{s:?}");
    assert!(s.export_failed > 0, "{s:?}");
    assert_eq!(s.exported, 0);
    assert_eq!(t.dropped(), s.queue_full + s.export_failed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_collector_is_abandoned_after_the_export_timeout() {
    // Accepts connections and never answers.
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = l.accept().await {
            held.push(s);
        }
    });
    let t = Telemetry::start(cfg(format!("http://{addr}"))).unwrap();
    let a = agent();
    let ctx = t.turn(&a, false);
    t.record(SpanData::child(&ctx, &a, "x", SystemTime::now()));
    let started = Instant::now();
    while t.stats().export_failed == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the export was never abandoned"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "failed before the timeout"
    );
    assert_eq!(t.stats().export_failed, 1);
}

#[test]
fn a_model_call_span_follows_the_genai_conventions() {
    let turn = TurnCtx {
        trace_id: [1; 16],
        span_id: [2; 8],
    };
    let s = SpanData::model_call(&turn, &agent(), "chat", "smollm2", SystemTime::now());
    assert_eq!(s.name, "chat smollm2");
    assert_eq!(s.kind, SpanKind::Client);
    assert_eq!(s.parent, Some([2; 8]));
    assert_eq!(
        s.get("gen_ai.request.model"),
        Some(&AttrValue::from("smollm2"))
    );
    assert_eq!(
        s.get("gen_ai.operation.name"),
        Some(&AttrValue::from("chat"))
    );
    assert_eq!(s.get(ATTR_AGENT), Some(&AttrValue::from("t/a")));
}
