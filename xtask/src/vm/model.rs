//! The model the example model agent (examples/agents/ask-and-count) talks to in the guest:
//! llama.cpp's OpenAI-compatible server with SmolLM2-135M from the host's model peers
//! (`target/model-peers`, the same the host tests use), on the host's loopback. Under emulation
//! the same server answers in minutes; on the host, in well under a second.
//!
//! The guest reaches it over QEMU's user network with `restrict=on` (the guest can reach
//! nothing on the host or beyond) and one forwarding rule: TCP to [`GUEST_ADDR`] inside the
//! guest runs `cargo xtask vm relay 127.0.0.1:PORT` on the host per connection, which copies the
//! connection's bytes to the server and back. Nothing but that one port is reachable.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::process::{Child, Command, Stdio};

use anyhow::{Context, Result, bail};

/// Where the model is in the guest: an address of QEMU's user network (10.0.2.0/24) that
/// nothing else uses.
pub const GUEST_ADDR: &str = "10.0.2.100:8080";

/// The running server; stopped (its stdin closed, then killed) when dropped.
pub struct HostModel {
    child: Child,
    pub port: u16,
}

impl Drop for HostModel {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl HostModel {
    /// Installs the model peers if needed and starts the chat model server.
    pub fn start() -> Result<HostModel> {
        let dir = crate::model_peers::ensure()?;
        let mut child = Command::new(dir.join("venv/bin/python3"))
            .arg(dir.join("llama_server.py"))
            .arg("--exit-with-stdin")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}/llama_server.py", dir.display()))?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().context("llama_server stdout")?).read_line(&mut line)?;
        let port = line
            .trim()
            .strip_prefix("listening http://127.0.0.1:")
            .and_then(|p| p.parse().ok());
        let Some(port) = port else {
            let _ = child.kill();
            bail!("the model server for the guest did not start (it said {line:?})");
        };
        eprintln!(
            "vm: the example model (SmolLM2-135M, llama.cpp) on the host's 127.0.0.1:{port}, {GUEST_ADDR} in the guest"
        );
        Ok(HostModel { child, port })
    }

    /// The `-nic` argument of QEMU: user networking restricted to the one forwarding rule.
    pub fn nic(&self) -> Result<String> {
        let exe = std::env::current_exe().context("the path of xtask")?;
        let exe = exe.to_str().context("xtask's path is not UTF-8")?;
        if exe.contains(',') || exe.contains(' ') {
            bail!("xtask's path {exe:?} has a comma or space, which QEMU's -nic cannot carry");
        }
        let (ip, port) = GUEST_ADDR.split_once(':').unwrap_or((GUEST_ADDR, "80"));
        Ok(format!(
            "user,model=virtio-net-pci,restrict=on,guestfwd=tcp:{ip}:{port}-cmd:{exe} vm relay 127.0.0.1:{}",
            self.port
        ))
    }
}

/// `cargo xtask vm relay ADDR`: QEMU runs this per guest connection with the connection on
/// stdin/stdout; copies both ways until either side ends.
pub fn relay(addr: &str) -> Result<()> {
    let up = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
    let mut down = up.try_clone()?;
    let to_server = std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut buf = [0u8; 16384];
        loop {
            match stdin.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if down.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = down.shutdown(Shutdown::Write);
    });
    let mut up = up;
    let mut stdout = std::io::stdout().lock();
    let mut buf = [0u8; 16384];
    loop {
        match up.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if stdout.write_all(&buf[..n]).is_err() || stdout.flush().is_err() {
                    break;
                }
            }
        }
    }
    // The server is done: so is the connection (the guest side may never close its end).
    drop(to_server);
    std::process::exit(0)
}
