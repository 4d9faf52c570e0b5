//! Cargo subcommands the tasks use (cargo-mutants, cargo-fuzz), each at a pinned release,
//! installed from crates.io into target/tools on first use.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Result, bail};

/// `target/tools/bin/cargo-NAME` at `version`, installed (`cargo install --locked --root
/// target/tools`) when missing or at another version.
pub fn ensure_cargo_subcommand(root: &Path, name: &str, version: &str) -> Result<PathBuf> {
    let tools = root.join("target/tools");
    let krate = format!("cargo-{name}");
    let bin = tools.join("bin").join(&krate);
    let version_ok = Command::new(&bin)
        .arg(name)
        .arg("--version")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(version));
    if !version_ok {
        println!(
            "xtask {name}: installing {krate} {version} into {}",
            tools.display()
        );
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let st = Command::new(cargo)
            .args([
                "install",
                "--locked",
                "--version",
                version,
                &krate,
                "--root",
            ])
            .arg(&tools)
            .status()?;
        if !st.success() {
            bail!("cargo install {krate} {version} failed ({st})");
        }
    }
    Ok(bin)
}
