//! What the shipped examples need in the guest, installed where their files point, so
//! vm-tests/tests/examples.rs runs them **as installed** (their contracts and manifests
//! unchanged):
//! - the MCP and OpenAI Python SDKs for the guest's own `/usr/bin/python3` (Debian trixie's 3.13,
//!   not the host's), in `/usr/local/lib/python3.13/dist-packages`, where an operator's
//!   `pip install --break-system-packages mcp openai` would put them (notes-stats, ask-and-count);
//! - the published MCP filesystem server from npm in `/opt/agentos/tools`, as
//!   examples/tools/files.yaml tells the operator to install it (`node` is a guest package);
//!
//! The model ask-and-count talks to is not in the guest: llama.cpp under emulation answers in
//! minutes, so it runs on the host (model.rs) and the guest reaches it over QEMU's user network.
//!
//! Downloaded from the registries with the host's pip (cross-installing for CPython 3.13 with
//! binary wheels only) and npm, packed once into a cpio archive cached under the VM cache (keyed
//! by the pins), and appended to the guest's initramfs between the image and the payload.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};

use super::image::pack_cpio;
use crate::peers::run;

/// The guest's Python (Debian trixie).
const GUEST_PYTHON: &str = "3.13";
/// What the example agents import: the SDKs their comments name (pins shared with the host's
/// peers, so the host tests and the guest run the same versions).
const SDKS: &[&str] = &["mcp==2.3.0", "openai==3.57.0", "httpx==0.28.1"];
/// The filesystem server as examples/tools/files.yaml points to it.
const NPM: &str = "@modelcontextprotocol/server-filesystem@2026.8.31";

fn key() -> String {
    let mut h = Sha256::new();
    for part in [GUEST_PYTHON, &SDKS.join(","), NPM] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    hex::encode(&h.finalize()[..8])
}

/// The cpio archive of the examples' dependencies, built unless it is cached.
pub fn ensure(cache: &Path) -> Result<PathBuf> {
    let dir = cache.join(format!("examples-{}", key()));
    let cpio = dir.join("examples.cpio");
    if dir.join("ready").is_file() && cpio.is_file() {
        eprintln!("vm: example dependencies up to date: {}", cpio.display());
        return Ok(cpio);
    }
    let started = std::time::Instant::now();
    eprintln!(
        "vm: installing the examples' dependencies for the guest (pip: {}; npm: {NPM})",
        SDKS.join(" ")
    );
    let _ = fs::remove_dir_all(&dir);
    let root = dir.join("root");
    fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
    let pip = pip()?;
    pip_target(
        &pip,
        &root.join(format!("usr/local/lib/python{GUEST_PYTHON}/dist-packages")),
        SDKS,
    )?;
    let tools = root.join("opt/agentos/tools");
    fs::create_dir_all(&tools)?;
    run(
        Command::new("npm")
            .arg("install")
            .arg("--prefix")
            .arg(&tools)
            .args(["--no-audit", "--no-fund", "--loglevel=error", NPM]),
        "installing the MCP filesystem server from npm for the guest (needs npm)",
    )?;
    // npm's bookkeeping next to node_modules is not what files.yaml installs.
    for f in ["package.json", "package-lock.json"] {
        let _ = fs::remove_file(tools.join(f));
    }
    // Agents and tools run under their own uids: everything readable, directories searchable.
    run(
        Command::new("chmod").args(["-R", "a+rX"]).arg(&root),
        "making the examples' dependencies readable by all",
    )?;
    pack_cpio(&root, &cpio)?;
    fs::remove_dir_all(&root)?;
    fs::write(dir.join("ready"), format!("{}\n", key()))?;
    prune_old(cache, &dir);
    eprintln!(
        "vm: example dependencies packed in {:.0} s: {}",
        started.elapsed().as_secs_f64(),
        cpio.display()
    );
    Ok(cpio)
}

/// The pip of the host's MCP peers' venv (made with Debian's python3 by `cargo xtask test`
/// anyway), else the host's `pip3`.
fn pip() -> Result<PathBuf> {
    let venv = crate::peers::ensure()?.join("venv/bin/pip");
    if venv.is_file() {
        return Ok(venv);
    }
    bail!(
        "no pip in {} to download the examples' Python packages",
        venv.display()
    )
}

/// `pip install --target DIR` for the guest's CPython, binary wheels only (nothing compiles).
fn pip_target(pip: &Path, target: &Path, what: &[&str]) -> Result<()> {
    let mut c = Command::new(pip);
    c.args([
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "--no-compile",
        "--only-binary=:all:",
        "--implementation",
        "cp",
        "--python-version",
        GUEST_PYTHON,
        "--abi",
        &format!("cp{}", GUEST_PYTHON.replace('.', "")),
        "--abi",
        "abi3",
        "--abi",
        "none",
    ]);
    for p in [
        "manylinux_2_34_x86_64",
        "manylinux_2_28_x86_64",
        "manylinux_2_17_x86_64",
        "manylinux2014_x86_64",
        "linux_x86_64",
        "any",
    ] {
        c.args(["--platform", p]);
    }
    c.arg("--target").arg(target).args(what);
    run(
        &mut c,
        &format!("installing {} for the guest's Python", what.join(" ")),
    )
}

fn prune_old(cache: &Path, keep: &Path) {
    let Ok(entries) = fs::read_dir(cache) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p != keep && e.file_name().to_string_lossy().starts_with("examples-") {
            let _ = fs::remove_dir_all(&p);
        }
    }
}
