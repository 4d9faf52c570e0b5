//! The daemon's side of a model call: one HTTP/1.1 request to the backend (the key added here,
//! never seen by the agent), and the answer passed back, whole or as a stream of server-sent
//! events read for usage, first-token time and completion size on the way.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Body, Frame, Incoming};
use hyper::{Request, Response, StatusCode, header};
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use super::config::Backend;

/// How long connecting to a backend may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest non-streamed answer passed back.
pub const MAX_ANSWER_BYTES: usize = 8 << 20;
/// The largest single server-sent event.
const MAX_EVENT_BYTES: usize = 1 << 20;
/// How long a stream waits for the agent to take the next chunk before giving up.
const SEND_TIMEOUT: Duration = Duration::from_secs(60);

/// Why the backend could not answer.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("backend {backend} ({authority}): {what}: {detail}")]
    Unreachable {
        backend: String,
        authority: String,
        what: &'static str,
        detail: String,
    },
    #[error("backend {backend} answered {status}")]
    Status { backend: String, status: StatusCode },
}

/// The body the gateway answers with: whole, or a stream fed by a pump task.
pub type AnswerBody = http_body_util::Either<Full<Bytes>, ChannelBody>;

/// A response body fed from a channel (the pump's stream).
pub struct ChannelBody(mpsc::Receiver<Bytes>);

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b))))
    }
}

/// Sends `body` to `path` (below the backend's API base) and returns its response head and body.
pub async fn send(
    backend: &Backend,
    path: &str,
    body: Vec<u8>,
) -> Result<Response<Incoming>, UpstreamError> {
    let unreachable = |what, detail: String| UpstreamError::Unreachable {
        backend: backend.name.clone(),
        authority: backend.authority.clone(),
        what,
        detail,
    };
    let stream = tokio::time::timeout(
        CONNECT_TIMEOUT,
        tokio::net::TcpStream::connect(&backend.authority),
    )
    .await
    .map_err(|_| unreachable("connect", "timed out".into()))?
    .map_err(|e| unreachable("connect", e.to_string()))?;
    let _ = stream.set_nodelay(true);
    let mut sender = match &backend.tls {
        None => handshake(stream).await,
        Some((cfg, name)) => {
            let tls = tokio::time::timeout(CONNECT_TIMEOUT, super::tls::connect(cfg, name, stream))
                .await
                .map_err(|_| unreachable("TLS handshake", "timed out".into()))?
                .map_err(|e| unreachable("TLS handshake", e.to_string()))?;
            handshake(tls).await
        }
    }
    .map_err(|e| unreachable("HTTP handshake", e.to_string()))?;
    let mut req = Request::post(format!("{}{path}", backend.base_path))
        .header(header::HOST, &backend.authority)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "application/json, text/event-stream");
    if let Some(auth) = backend.authorization() {
        req = req.header(header::AUTHORIZATION, auth);
    }
    let req = req
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| unreachable("request", e.to_string()))?;
    let resp = tokio::time::timeout(backend.timeout, sender.send_request(req))
        .await
        .map_err(|_| unreachable("answer", "timed out".into()))?
        .map_err(|e| unreachable("answer", e.to_string()))?;
    if resp.status().is_server_error() {
        return Err(UpstreamError::Status {
            backend: backend.name.clone(),
            status: resp.status(),
        });
    }
    Ok(resp)
}

/// An HTTP/1.1 client connection over `io`, driven by a task of its own.
async fn handshake<I>(
    io: I,
) -> Result<hyper::client::conn::http1::SendRequest<Full<Bytes>>, hyper::Error>
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(io)).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

/// What the answer used and how it went, as far as the gateway could see.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub status: u16,
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    /// Content chunks seen in a stream (a count of tokens when the backend gives no usage).
    pub chunks: u64,
    /// From the request to the first content byte (streams) or to the whole answer.
    pub first_token: Option<Duration>,
    pub duration: Duration,
    pub completion_sha256: String,
    /// The completion's text, kept only when the contract asks for it.
    pub completion: Option<String>,
    /// The stream ended before `[DONE]` (the agent went away, or the backend did).
    pub cut: Option<String>,
}

/// The `usage` object of an answer or a chunk.
fn read_usage(v: &Value, out: &mut Outcome) {
    if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
        out.prompt_tokens = u.get("prompt_tokens").and_then(Value::as_u64);
        out.completion_tokens = u
            .get("completion_tokens")
            .and_then(Value::as_u64)
            .or(Some(0));
    }
}

/// Names the agent-facing model in place of the backend's.
fn rename_model(v: &mut Value, name: &str) {
    if let Some(m) = v.get_mut("model") {
        *m = Value::String(name.to_string());
    }
}

/// The text of a chat answer (or chunk) for hashing.
fn completion_text(v: &Value, streamed: bool) -> String {
    let mut s = String::new();
    if let Some(choices) = v.get("choices").and_then(Value::as_array) {
        for c in choices {
            let m = if streamed {
                c.get("delta")
            } else {
                c.get("message")
            };
            if let Some(m) = m {
                if let Some(t) = m.get("content").and_then(Value::as_str) {
                    s.push_str(t);
                }
                if let Some(t) = m.get("tool_calls") {
                    s.push_str(&t.to_string());
                }
            }
        }
    }
    s
}

/// A whole answer: read (bounded), usage taken, model renamed.
pub async fn whole(
    resp: Response<Incoming>,
    model: &str,
    t0: Instant,
    keep: bool,
) -> (Response<AnswerBody>, Outcome) {
    let (parts, body) = resp.into_parts();
    let mut out = Outcome {
        status: parts.status.as_u16(),
        ..Default::default()
    };
    let bytes = match Limited::new(body, MAX_ANSWER_BYTES).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            out.cut = Some(format!("reading the backend's answer: {e}"));
            let r = super::http::error(
                StatusCode::BAD_GATEWAY,
                "api_error",
                "backend_error",
                &format!("the model backend's answer could not be read: {e}"),
            );
            return (r, out);
        }
    };
    out.duration = t0.elapsed();
    out.first_token = Some(out.duration);
    let body = match serde_json::from_slice::<Value>(&bytes) {
        Ok(mut v) => {
            read_usage(&v, &mut out);
            rename_model(&mut v, model);
            let text = completion_text(&v, false);
            out.completion_sha256 = hex::encode(Sha256::digest(text.as_bytes()));
            if keep {
                out.completion = Some(text);
            }
            Bytes::from(serde_json::to_vec(&v).unwrap_or_default())
        }
        Err(_) => bytes,
    };
    let mut r = Response::new(http_body_util::Either::Left(Full::new(body)));
    *r.status_mut() = parts.status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    (r, out)
}

/// Reads a stream of server-sent events event by event.
struct Events {
    buf: Vec<u8>,
}

impl Events {
    /// The complete events in `buf` after adding `chunk` (each without its blank line).
    fn push(&mut self, chunk: &[u8]) -> Result<Vec<Vec<u8>>, String> {
        self.buf.extend_from_slice(chunk);
        let mut out = Vec::new();
        loop {
            let end = find_blank_line(&self.buf);
            let Some((at, sep)) = end else { break };
            out.push(self.buf[..at].to_vec());
            self.buf.drain(..at + sep);
        }
        if self.buf.len() > MAX_EVENT_BYTES {
            return Err(format!("an event over {MAX_EVENT_BYTES} bytes"));
        }
        Ok(out)
    }
}

fn find_blank_line(b: &[u8]) -> Option<(usize, usize)> {
    let lf = b.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2));
    let crlf = b.windows(4).position(|w| w == b"\r\n\r\n").map(|i| (i, 4));
    match (lf, crlf) {
        (Some(a), Some(c)) => Some(if a.0 <= c.0 { a } else { c }),
        (a, c) => a.or(c),
    }
}

/// What a stream pump needs to know.
pub struct StreamCtx {
    pub model: String,
    /// The agent asked for the usage chunk itself (`stream_options.include_usage`).
    pub client_wants_usage: bool,
    pub keep: bool,
    pub t0: Instant,
}

/// A streamed answer: the events pass through to the agent as they come (the usage chunk only
/// if it asked for it), read on the way; `done` gets the outcome when the stream ends.
pub fn stream(
    resp: Response<Incoming>,
    ctx: StreamCtx,
    done: tokio::sync::oneshot::Sender<Outcome>,
) -> Response<AnswerBody> {
    let (parts, mut body) = resp.into_parts();
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    let status = parts.status;
    tokio::spawn(async move {
        let mut out = Outcome {
            status: status.as_u16(),
            ..Default::default()
        };
        let mut events = Events { buf: Vec::new() };
        let mut hasher = Sha256::new();
        let mut text = String::new();
        let mut finished = false;
        'read: loop {
            let frame = match body.frame().await {
                None => break,
                Some(Err(e)) => {
                    out.cut = Some(format!("backend stream: {e}"));
                    break;
                }
                Some(Ok(f)) => f,
            };
            let Ok(data) = frame.into_data() else {
                continue;
            };
            let evs = match events.push(&data) {
                Ok(e) => e,
                Err(e) => {
                    out.cut = Some(e);
                    break;
                }
            };
            for ev in evs {
                let Some(bytes) =
                    pass_event(&ev, &ctx, &mut out, &mut hasher, &mut text, &mut finished)
                else {
                    continue;
                };
                match tokio::time::timeout(SEND_TIMEOUT, tx.send(bytes)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) => {
                        out.cut = Some("the agent closed the stream".into());
                        break 'read;
                    }
                    Err(_) => {
                        out.cut = Some("the agent did not read the stream for 60 s".into());
                        break 'read;
                    }
                }
            }
        }
        if !finished && out.cut.is_none() {
            out.cut = Some("the backend ended the stream before [DONE]".into());
        }
        out.duration = ctx.t0.elapsed();
        out.completion_sha256 = hex::encode(hasher.finalize());
        if ctx.keep {
            out.completion = Some(text);
        }
        let _ = done.send(out);
    });
    let mut r = Response::new(http_body_util::Either::Right(ChannelBody(rx)));
    *r.status_mut() = status;
    for h in [header::CONTENT_TYPE, header::CACHE_CONTROL] {
        if let Some(v) = parts.headers.get(&h) {
            r.headers_mut().insert(h, v.clone());
        }
    }
    r
}

/// One event of the stream, read and re-emitted (`None`: not passed on).
fn pass_event(
    ev: &[u8],
    ctx: &StreamCtx,
    out: &mut Outcome,
    hasher: &mut Sha256,
    text: &mut String,
    finished: &mut bool,
) -> Option<Bytes> {
    let s = String::from_utf8_lossy(ev);
    let data: Vec<&str> = s
        .lines()
        .filter_map(|l| l.strip_prefix("data:").map(str::trim_start))
        .collect();
    if data.is_empty() {
        return Some(Bytes::from(format!("{s}\n\n")));
    }
    let payload = data.join("\n");
    if payload == "[DONE]" {
        *finished = true;
        return Some(Bytes::from_static(b"data: [DONE]\n\n"));
    }
    let Ok(mut v) = serde_json::from_str::<Value>(&payload) else {
        return Some(Bytes::from(format!("{s}\n\n")));
    };
    let usage_only = v.get("usage").is_some_and(Value::is_object)
        && v.get("choices")
            .and_then(Value::as_array)
            .is_none_or(|c| c.is_empty());
    read_usage(&v, out);
    let piece = completion_text(&v, true);
    if !piece.is_empty() {
        out.chunks += 1;
        out.first_token.get_or_insert_with(|| ctx.t0.elapsed());
        hasher.update(piece.as_bytes());
        if ctx.keep && text.len() < super::http::MAX_KEPT_TEXT {
            text.push_str(&piece);
        }
    }
    if usage_only && !ctx.client_wants_usage {
        return None;
    }
    if !ctx.client_wants_usage
        && let Some(o) = v.as_object_mut()
    {
        o.remove("usage");
    }
    rename_model(&mut v, &ctx.model);
    Some(Bytes::from(format!("data: {v}\n\n")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_split_on_blank_lines_in_any_framing_and_are_bounded() {
        let mut e = Events { buf: Vec::new() };
        assert!(e.push(b"data: {\"a\":1}\n").unwrap().is_empty());
        let got = e.push(b"\ndata: [DONE]\r\n\r\ndata: x").unwrap();
        assert_eq!(
            got,
            vec![b"data: {\"a\":1}".to_vec(), b"data: [DONE]".to_vec()]
        );
        assert!(e.push(&vec![b'x'; MAX_EVENT_BYTES + 1]).is_err());
    }

    #[test]
    fn tool_calls_pass_through_intact_and_count_as_output() {
        let ctx = StreamCtx {
            model: "mine".into(),
            client_wants_usage: false,
            keep: false,
            t0: Instant::now(),
        };
        let call = serde_json::json!({"id": "c1", "type": "function",
            "function": {"name": "text_wordcount", "arguments": "{\"text\":\"a b\"}"}});
        let ev = format!(
            "data: {}",
            serde_json::json!({"model": "up", "choices": [{"index": 0, "delta": {"tool_calls": [call]}}]})
        );
        let (mut out, mut h, mut t, mut f) =
            (Outcome::default(), Sha256::new(), String::new(), false);
        let b = pass_event(ev.as_bytes(), &ctx, &mut out, &mut h, &mut t, &mut f).unwrap();
        let text = String::from_utf8_lossy(&b);
        let v: Value = serde_json::from_str(text.trim().strip_prefix("data: ").unwrap()).unwrap();
        assert_eq!(v["choices"][0]["delta"]["tool_calls"][0], call);
        assert_eq!(v["model"], "mine");
        assert_eq!(out.chunks, 1);
        assert!(out.first_token.is_some());
    }

    #[test]
    fn the_usage_chunk_is_read_and_passed_only_when_asked_for() {
        let ctx = |want| StreamCtx {
            model: "mine".into(),
            client_wants_usage: want,
            keep: true,
            t0: Instant::now(),
        };
        let chunk = br#"data: {"model":"up","choices":[{"delta":{"content":"hi"}}]}"#;
        let usage = br#"data: {"model":"up","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3}}"#;
        for want in [false, true] {
            let (mut out, mut h, mut t, mut f) =
                (Outcome::default(), Sha256::new(), String::new(), false);
            let c = pass_event(chunk, &ctx(want), &mut out, &mut h, &mut t, &mut f).unwrap();
            assert!(String::from_utf8_lossy(&c).contains("\"model\":\"mine\""));
            let u = pass_event(usage, &ctx(want), &mut out, &mut h, &mut t, &mut f);
            assert_eq!(u.is_some(), want);
            assert_eq!(
                (out.prompt_tokens, out.completion_tokens, out.chunks),
                (Some(7), Some(3), 1)
            );
            assert!(out.first_token.is_some());
            assert_eq!(t, "hi");
            assert!(
                pass_event(
                    b"data: [DONE]",
                    &ctx(want),
                    &mut out,
                    &mut h,
                    &mut t,
                    &mut f
                )
                .is_some()
            );
            assert!(f);
        }
    }
}
