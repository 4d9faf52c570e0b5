//! A real OTLP receiver for the tests (tests/otlp_receiver.py, PyPI `opentelemetry-proto` +
//! `protobuf` from the model peers' venv): what arrives is written as JSON lines, one per span or
//! data point.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::Daemon;

/// A Python with `opentelemetry-proto` and `protobuf`: `$AGENTOS_MODEL_PEERS/venv`, else
/// `target/model-peers/venv`.
pub fn receiver_python() -> Result<PathBuf, String> {
    let mut dirs = Vec::new();
    if let Some(d) = std::env::var_os("AGENTOS_MODEL_PEERS") {
        dirs.push(PathBuf::from(d));
    }
    dirs.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/model-peers"));
    for d in &dirs {
        let py = d.join("venv/bin/python3");
        if !py.exists() {
            continue;
        }
        let ok = Command::new(&py)
            .args([
                "-c",
                "import google.protobuf, opentelemetry.proto.collector.trace.v1.trace_service_pb2",
            ])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return Ok(py);
        }
    }
    Err(format!(
        "no Python with opentelemetry-proto and protobuf in {}: run `cargo xtask model-peers` \
         (or point AGENTOS_MODEL_PEERS at a directory whose venv/ has them)",
        dirs.iter()
            .map(|d| d.join("venv").display().to_string())
            .collect::<Vec<_>>()
            .join(" or ")
    ))
}

/// The OTLP receiver, writing what arrives to `out` (one JSON object per span or data point).
pub struct Receiver {
    child: Child,
    out: PathBuf,
    port: u16,
}

impl Receiver {
    pub fn start(python: &Path, dir: &Path, stall: bool) -> Receiver {
        let out = dir.join("otlp.jsonl");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/otlp_receiver.py");
        let mut cmd = Command::new(python);
        cmd.arg(&script).arg(&out);
        if stall {
            cmd.arg("--stall");
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the OTLP receiver");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("the receiver's stdout"))
            .read_line(&mut line)
            .expect("the receiver's first line");
        let port = line
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("the receiver printed {line:?}, not its port"));
        Receiver { child, out, port }
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn rows(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.out)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("the receiver writes JSON lines"))
            .collect()
    }

    /// Wait until what arrived satisfies `done`.
    pub fn wait(
        &self,
        what: &str,
        secs: u64,
        d: &Daemon,
        done: impl Fn(&[Value]) -> bool,
    ) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let rows = self.rows();
            if done(&rows) {
                return rows;
            }
            assert!(
                Instant::now() < deadline,
                "the receiver did not get {what} in {secs} s; got:\n{}\ndaemon log:\n{}",
                rows.iter()
                    .map(Value::to_string)
                    .collect::<Vec<_>>()
                    .join("\n"),
                d.log_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
