//! The HTTP side of `bench models`: the measured client (raw HTTP/1.1 with keep-alive over a TCP
//! or Unix socket, std sockets, a streaming parse of chunked encoding and server-sent events,
//! every event time-stamped when the read that completed it returned) and the "instant" backend
//! (an OpenAI-compatible server in the bench process that answers at once: a canned stream of N
//! content chunks written back to back, or a whole JSON answer).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use super::harness::mono_ns;

// ---------------------------------------------------------------------------------------------
// The client.

/// A keep-alive connection to a backend (TCP) or to an agent's model socket (Unix).
pub(super) enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Read for Stream {
    fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(b),
            Stream::Unix(s) => s.read(b),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(b),
            Stream::Unix(s) => s.write(b),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// How one request went, in ns from just before its request was written.
#[derive(Default)]
pub(super) struct Timing {
    /// To the first event with content (streams), or to the whole answer.
    pub ttft: u64,
    /// Between successive content events (streams).
    pub gaps: Vec<u64>,
    /// To the end of the response.
    pub total: u64,
    /// Content events (streams) or 1 (whole).
    pub chunks: u64,
}

pub(super) struct Client {
    s: Stream,
    target: String,
    /// Connections the server closed after an answer (llama.cpp's server closes after every
    /// stream), opened again inside the next request's time, as an HTTP client library would.
    pub reconnects: u64,
    host: String,
    buf: Vec<u8>,
    /// The events of the last stream, with their time stamps (checked after the timed part).
    events: Vec<(u64, Vec<u8>)>,
    req: Vec<u8>,
}

/// Where a client connects: `tcp:HOST:PORT`, `unix:PATH`, or `agent` ($AGENTOS_MODELS_SOCKET).
pub(super) fn connect(target: &str) -> Result<Client> {
    let (s, host) = open(target)?;
    Ok(Client {
        s,
        target: target.to_string(),
        reconnects: 0,
        host,
        buf: Vec::with_capacity(64 * 1024),
        events: Vec::new(),
        req: Vec::with_capacity(1024),
    })
}

fn open(target: &str) -> Result<(Stream, String)> {
    let (s, host) = if let Some(addr) = target.strip_prefix("tcp:") {
        let s = TcpStream::connect(addr).with_context(|| format!("connect {addr}"))?;
        s.set_nodelay(true)?;
        (Stream::Tcp(s), addr.to_string())
    } else {
        let path = match target.strip_prefix("unix:") {
            Some(p) => p.to_string(),
            None if target == "agent" => std::env::var("AGENTOS_MODELS_SOCKET")
                .context("target agent: no $AGENTOS_MODELS_SOCKET (is this an agent on a daemon with --models?)")?,
            None => bail!("target {target:?}: tcp:HOST:PORT, unix:PATH or agent"),
        };
        let s = UnixStream::connect(&path).with_context(|| format!("connect {path}"))?;
        (Stream::Unix(s), "agentos".to_string())
    };
    Ok((s, host))
}

impl Stream {
    /// The peer closed the connection (a read would return end of file now).
    fn closed(&self) -> bool {
        use std::os::fd::AsRawFd;
        let fd = match self {
            Stream::Tcp(s) => s.as_raw_fd(),
            Stream::Unix(s) => s.as_raw_fd(),
        };
        let mut b = [0u8; 1];
        // SAFETY: recv into a 1-byte buffer we own, on an fd this stream owns; MSG_PEEK |
        // MSG_DONTWAIT neither consumes data nor blocks.
        let n = unsafe {
            libc::recv(
                fd,
                b.as_mut_ptr().cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        n == 0
    }
}

/// The chat request every client sends (same prompt every time: llama.cpp reuses its cache).
pub(super) fn chat_body(model: &str, stream: bool, max_tokens: u64) -> Vec<u8> {
    json!({"model": model, "stream": stream, "max_tokens": max_tokens, "temperature": 0,
           "ignore_eos": true,
           "messages": [{"role": "system", "content": "You are a helpful assistant."},
                        {"role": "user", "content": "Tell me a long story about a cat who lives in a lighthouse."}]})
    .to_string()
    .into_bytes()
}

/// `"content":"` followed by at least one character: an event that carries text.
fn has_content(ev: &[u8]) -> bool {
    const K: &[u8] = b"\"content\":\"";
    ev.windows(K.len())
        .position(|w| w == K)
        .is_some_and(|i| ev.get(i + K.len()).is_some_and(|&c| c != b'"'))
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

impl Client {
    /// One POST /v1/chat/completions with `body`; timed; the answer checked afterwards
    /// (`expect_chunks`: content events a stream must have, 0: any).
    pub(super) fn chat(&mut self, body: &[u8], stream: bool, expect_chunks: u64) -> Result<Timing> {
        self.req.clear();
        let _ = write!(
            self.req,
            "POST /v1/chat/completions HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
             Accept: {}\r\nContent-Length: {}\r\n\r\n",
            self.host,
            if stream {
                "text/event-stream"
            } else {
                "application/json"
            },
            body.len()
        );
        self.req.extend_from_slice(body);
        self.events.clear();
        self.buf.clear();
        let closed = self.s.closed();
        let t0 = mono_ns();
        if closed {
            self.reconnect()?;
        }
        self.s.write_all(&self.req)?;
        let (status, whole, end) = match self.read_response() {
            Err(e) if self.buf.is_empty() && !closed => {
                // Closed between the check and the request: once more on a new connection.
                let _ = e;
                self.reconnect()?;
                self.s.write_all(&self.req)?;
                self.read_response()?
            }
            r => r?,
        };
        let mut t = Timing {
            total: end - t0,
            ..Default::default()
        };
        // Checks, outside the timed part.
        if status != 200 {
            bail!(
                "status {status}: {}",
                String::from_utf8_lossy(whole.as_deref().unwrap_or_default())
            );
        }
        if !stream {
            let v: Value = serde_json::from_slice(whole.as_deref().unwrap_or_default())
                .context("a whole answer that is not JSON")?;
            if v.pointer("/choices/0/message/content")
                .and_then(Value::as_str)
                .is_none_or(str::is_empty)
            {
                bail!("a whole answer without content: {v}");
            }
            t.ttft = t.total;
            t.chunks = 1;
            return Ok(t);
        }
        let mut last = None;
        let mut done = false;
        for (ts, ev) in &self.events {
            let data = ev
                .strip_prefix(b"data: ")
                .with_context(|| format!("not a data event: {}", String::from_utf8_lossy(ev)))?;
            if data == b"[DONE]" {
                done = true;
                continue;
            }
            let v: Value = serde_json::from_slice(data)
                .with_context(|| format!("event {}", String::from_utf8_lossy(data)))?;
            if v.get("usage").is_some_and(|u| !u.is_null()) {
                bail!("a usage object nobody asked for: {v}");
            }
            let content = v
                .pointer("/choices/0/delta/content")
                .and_then(Value::as_str);
            if content.is_some_and(|c| !c.is_empty()) != has_content(ev) {
                bail!("the content test disagrees with the JSON: {v}");
            }
            if has_content(ev) {
                match last {
                    None => t.ttft = ts - t0,
                    Some(l) => t.gaps.push(ts - l),
                }
                last = Some(*ts);
                t.chunks += 1;
            }
        }
        if !done {
            bail!("the stream ended without [DONE]");
        }
        if expect_chunks > 0 && t.chunks != expect_chunks {
            bail!("{} content events, expected {expect_chunks}", t.chunks);
        }
        Ok(t)
    }

    fn reconnect(&mut self) -> Result<()> {
        self.s = open(&self.target)?.0;
        self.reconnects += 1;
        Ok(())
    }

    /// Reads one response: its status, its body when not a stream (streams go to
    /// `self.events`), and when its end was read.
    fn read_response(&mut self) -> Result<(u16, Option<Vec<u8>>, u64)> {
        let mut tmp = [0u8; 16 * 1024];
        let mut now;
        // Head.
        let (status, chunked, length, sse, mut pos) = loop {
            let n = self.s.read(&mut tmp)?;
            now = mono_ns();
            if n == 0 {
                bail!("the server closed the connection");
            }
            self.buf.extend_from_slice(&tmp[..n]);
            let Some(end) = find(&self.buf, b"\r\n\r\n") else {
                continue;
            };
            let head = std::str::from_utf8(&self.buf[..end]).context("head")?;
            let mut lines = head.split("\r\n");
            let status: u16 = lines
                .next()
                .and_then(|l| l.split(' ').nth(1))
                .and_then(|s| s.parse().ok())
                .context("status line")?;
            let (mut chunked, mut length, mut sse) = (false, None, false);
            for l in lines {
                let Some((k, v)) = l.split_once(':') else {
                    continue;
                };
                let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
                match k.as_str() {
                    "transfer-encoding" => chunked = v.eq_ignore_ascii_case("chunked"),
                    "content-length" => length = v.parse::<usize>().ok(),
                    "content-type" => sse = v.starts_with("text/event-stream"),
                    _ => {}
                }
            }
            break (status, chunked, length, sse, end + 4);
        };
        if !chunked {
            let len = length.context("a response with neither a length nor chunks")?;
            while self.buf.len() < pos + len {
                let n = self.s.read(&mut tmp)?;
                now = mono_ns();
                if n == 0 {
                    bail!("the server closed the connection mid-answer");
                }
                self.buf.extend_from_slice(&tmp[..n]);
            }
            return Ok((status, Some(self.buf[pos..pos + len].to_vec()), now));
        }
        // Chunked: de-chunk into `body`, cut events off its front as they complete.
        let mut body = Vec::new();
        let mut ev_start = 0;
        loop {
            // Every complete chunk in the buffer.
            while let Some(eol) = find(&self.buf[pos..], b"\r\n") {
                let size = std::str::from_utf8(&self.buf[pos..pos + eol])
                    .ok()
                    .and_then(|s| usize::from_str_radix(s.split(';').next()?.trim(), 16).ok())
                    .context("chunk size")?;
                let data = pos + eol + 2;
                if size == 0 {
                    if self.buf.len() < data + 2 {
                        break; // the final CRLF is still to come
                    }
                    if !sse {
                        return Ok((status, Some(body), now));
                    }
                    return Ok((status, None, now));
                }
                if self.buf.len() < data + size + 2 {
                    break;
                }
                body.extend_from_slice(&self.buf[data..data + size]);
                pos = data + size + 2;
                if sse {
                    while let Some(e) = find(&body[ev_start..], b"\n\n") {
                        let ev = body[ev_start..ev_start + e].to_vec();
                        self.events.push((now, ev));
                        ev_start += e + 2;
                    }
                }
            }
            let n = self.s.read(&mut tmp)?;
            now = mono_ns();
            if n == 0 {
                bail!("the server closed the connection mid-stream");
            }
            self.buf.extend_from_slice(&tmp[..n]);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The instant backend.

/// Serves /v1/chat/completions on 127.0.0.1 from `threads` threads (each accepts and serves one
/// connection at a time, keep-alive); returns its address. `max_tokens` of a request is how many
/// content chunks it gets.
pub(super) fn instant_server(threads: usize) -> Result<String> {
    let l = Arc::new(TcpListener::bind("127.0.0.1:0")?);
    let addr = l.local_addr()?.to_string();
    for _ in 0..threads {
        let l = l.clone();
        std::thread::Builder::new()
            .name("instant".into())
            .spawn(move || {
                loop {
                    let Ok((s, _)) = l.accept() else { continue };
                    let _ = s.set_nodelay(true);
                    let _ = serve_conn(s);
                }
            })?;
    }
    Ok(addr)
}

/// `{size}\r\n{data}\r\n`: one HTTP chunk.
fn chunk(data: &str) -> Vec<u8> {
    format!("{:x}\r\n{data}\r\n", data.len()).into_bytes()
}

fn serve_conn(mut s: TcpStream) -> Result<()> {
    let mut buf = Vec::with_capacity(16 * 1024);
    let mut tmp = [0u8; 16 * 1024];
    let event = |json: &str| chunk(&format!("data: {json}\n\n"));
    let role = event(
        r#"{"id":"chatcmpl-instant","object":"chat.completion.chunk","created":0,"model":"instant-upstream","choices":[{"index":0,"delta":{"role":"assistant","content":null},"finish_reason":null}]}"#,
    );
    let tok = event(
        r#"{"id":"chatcmpl-instant","object":"chat.completion.chunk","created":0,"model":"instant-upstream","choices":[{"index":0,"delta":{"content":"tok"},"finish_reason":null}]}"#,
    );
    let fin = event(
        r#"{"id":"chatcmpl-instant","object":"chat.completion.chunk","created":0,"model":"instant-upstream","choices":[{"index":0,"delta":{},"finish_reason":"length"}]}"#,
    );
    let done = event("[DONE]");
    loop {
        // Head.
        let end = loop {
            if let Some(e) = find(&buf, b"\r\n\r\n") {
                break e;
            }
            let n = s.read(&mut tmp)?;
            if n == 0 {
                return Ok(());
            }
            buf.extend_from_slice(&tmp[..n]);
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        let close = head.contains("connection: close");
        while buf.len() < end + 4 + len {
            let n = s.read(&mut tmp)?;
            if n == 0 {
                return Ok(());
            }
            buf.extend_from_slice(&tmp[..n]);
        }
        let req: Value = serde_json::from_slice(&buf[end + 4..end + 4 + len]).unwrap_or_default();
        buf.drain(..end + 4 + len);
        let n = req["max_tokens"].as_u64().unwrap_or(16);
        let usage = json!({"prompt_tokens": 30, "completion_tokens": n, "total_tokens": 30 + n});
        if req["stream"] == json!(true) {
            s.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n\
                  Transfer-Encoding: chunked\r\n\r\n",
            )?;
            s.write_all(&role)?;
            for _ in 0..n {
                s.write_all(&tok)?;
            }
            s.write_all(&fin)?;
            if req.pointer("/stream_options/include_usage") == Some(&json!(true)) {
                s.write_all(&event(
                    &json!({"id": "chatcmpl-instant", "object": "chat.completion.chunk",
                        "created": 0, "model": "instant-upstream", "choices": [], "usage": usage})
                    .to_string(),
                ))?;
            }
            s.write_all(&done)?;
            s.write_all(b"0\r\n\r\n")?;
        } else {
            let body = json!({"id": "chatcmpl-instant", "object": "chat.completion", "created": 0,
                "model": "instant-upstream", "choices": [{"index": 0, "finish_reason": "length",
                "message": {"role": "assistant", "content": "tok".repeat(n as usize)}}],
                "usage": usage})
            .to_string();
            s.write_all(
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                )
                .as_bytes(),
            )?;
        }
        if close {
            return Ok(());
        }
    }
}

/// Starts `n` streams of `max_tokens` chunks of `model` one after the other, each on its own
/// connection, each once the previous one's head has come (or `wait` has passed), and reads none
/// of them; returns the status of each answer's head ("no answer": none within `wait`) and the
/// connections (the streams stay open until they are dropped). A bound on streams in flight
/// shows as a refusal (429) or a held answer once it is reached.
pub(super) fn probe_concurrent(
    target: &str,
    model: &str,
    n: usize,
    max_tokens: u64,
    wait: std::time::Duration,
) -> Result<(Vec<String>, Vec<Client>)> {
    let body = chat_body(model, true, max_tokens);
    let mut conns = Vec::new();
    let mut out = Vec::new();
    for _ in 0..n {
        let mut c = connect(target)?;
        let mut req = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n",
            c.host,
            body.len()
        )
        .into_bytes();
        req.extend_from_slice(&body);
        c.s.write_all(&req)?;
        match &c.s {
            Stream::Tcp(s) => s.set_read_timeout(Some(wait))?,
            Stream::Unix(s) => s.set_read_timeout(Some(wait))?,
        }
        let mut tmp = [0u8; 4096];
        let status = loop {
            match c.s.read(&mut tmp) {
                Ok(0) => break "closed".to_string(),
                Ok(k) => {
                    c.buf.extend_from_slice(&tmp[..k]);
                    if let Some(e) = find(&c.buf, b"\r\n") {
                        let line = String::from_utf8_lossy(&c.buf[..e]).to_string();
                        break line.split(' ').nth(1).unwrap_or("?").to_string();
                    }
                }
                Err(_) => break "no answer".to_string(),
            }
        };
        out.push(status);
        conns.push(c);
    }
    Ok((out, conns))
}
