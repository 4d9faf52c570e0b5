//! Real MCP peers for the tests, from the registries, pinned: the official MCP Python SDK (PyPI
//! `mcp`) in a virtual environment made with Debian's python3 (agents, which run under their own
//! uids, can execute it; a pyenv under /root they could not reach), and published MCP servers
//! from npm. Installed once into `target/mcp-peers/` and found by the tests through
//! `AGENTOS_MCP_PEERS`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// What gets installed; changing a version reinstalls.
pub const PYPI: &[&str] = &["mcp==2.3.0"];
pub const NPM: &[&str] = &[
    "@modelcontextprotocol/server-filesystem@2026.8.31",
    "@modelcontextprotocol/conformance@0.1.16",
];

/// `target/mcp-peers`.
pub fn dir() -> PathBuf {
    crate::vm::target_dir().join("mcp-peers")
}

fn stamp_text() -> String {
    format!("pypi {}\nnpm {}\n", PYPI.join(" "), NPM.join(" "))
}

/// Runs `cmd`; `what` names it in the error (also for model_peers.rs).
pub(crate) fn run(cmd: &mut Command, what: &str) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("{what}: cannot run {:?}", cmd.get_program()))?;
    if !status.success() {
        bail!("{what} failed ({status}): {cmd:?}");
    }
    Ok(())
}

/// Installs the peers unless they are there already; returns their directory.
pub fn ensure() -> Result<PathBuf> {
    let dir = dir();
    let stamp = dir.join("installed");
    if std::fs::read_to_string(&stamp).ok().as_deref() == Some(stamp_text().as_str()) {
        return Ok(dir);
    }
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let python = ["/usr/bin/python3", "python3"]
        .into_iter()
        .find(|p| !p.starts_with('/') || Path::new(p).exists())
        .unwrap_or("python3");
    let venv = dir.join("venv");
    eprintln!("mcp peers: {python} -m venv {}", venv.display());
    run(
        Command::new(python).arg("-m").arg("venv").arg(&venv),
        "creating the Python virtual environment (Debian: apt-get install python3-venv)",
    )?;
    eprintln!("mcp peers: pip install {}", PYPI.join(" "));
    run(
        Command::new(venv.join("bin/pip"))
            .args(["install", "--quiet", "--disable-pip-version-check"])
            .args(PYPI),
        "installing the MCP Python SDK from PyPI",
    )?;
    let node = dir.join("node");
    eprintln!("mcp peers: npm install {}", NPM.join(" "));
    run(
        Command::new("npm")
            .arg("install")
            .arg("--prefix")
            .arg(&node)
            .args(["--no-audit", "--no-fund", "--loglevel=error"])
            .args(NPM),
        "installing MCP servers from npm (needs node and npm)",
    )?;
    std::fs::write(&stamp, stamp_text()).with_context(|| format!("writing {}", stamp.display()))?;
    eprintln!("mcp peers: ready in {}", dir.display());
    Ok(dir)
}
