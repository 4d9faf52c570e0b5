//! `cargo xtask fuzz --replay`, the short fuzz mode inside `cargo xtask test`: the fuzz targets
//! built with the **stable** toolchain (libfuzzer-sys links libFuzzer's driver without
//! coverage instrumentation; no nightly, no cargo-fuzz), each run once on every input kept in
//! `fuzz/corpus/TARGET` (the seeds and what earlier runs found) and `fuzz/artifacts/TARGET`
//! (inputs that once crashed: regressions), then for a few seconds on random inputs. It checks
//! that no kept input panics or breaks a target's assertions today; the long, coverage-guided
//! runs stay `cargo xtask fuzz` (nightly).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

pub fn run(targets: &[&str], seconds: u64) -> Result<()> {
    let root = crate::workspace_root();
    let build_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| root.join("target"), PathBuf::from)
        .join("fuzz-stable");
    eprintln!(
        "xtask fuzz --replay: building the fuzz targets with the stable toolchain in {}",
        build_dir.display()
    );
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(root.join("fuzz"))
        .args(["build", "--bins", "--locked"])
        .arg("--target-dir")
        .arg(&build_dir)
        .env("CARGO_INCREMENTAL", "0")
        .status()
        .context("running cargo build for fuzz/")?;
    if !status.success() {
        bail!("building the fuzz targets (fuzz/Cargo.toml) failed: {status}");
    }
    let scratch = std::env::temp_dir().join(format!("agentos-fuzz-replay-{}", std::process::id()));
    let mut failed = Vec::new();
    println!("\n| target | kept inputs | random runs | result |");
    println!("|---|---|---|---|");
    for t in targets {
        let bin = build_dir.join("debug").join(t);
        let mut inputs = files(&root.join("fuzz/corpus").join(t));
        inputs.extend(files(&root.join("fuzz/artifacts").join(t)));
        let _ = std::fs::remove_dir_all(&scratch);
        let empty = scratch.join("corpus");
        std::fs::create_dir_all(&empty)?;
        if inputs.is_empty() {
            bail!("no kept inputs in fuzz/corpus/{t}: every target keeps its seeds there");
        }
        // Once on each kept input (libFuzzer runs files given as arguments and exits).
        let replay = target(&bin, &scratch).args(&inputs).output();
        let replay = replay.with_context(|| format!("running {}", bin.display()))?;
        // Then random inputs, uninstrumented, from an empty corpus in the scratch directory.
        let random = target(&bin, &scratch)
            .arg(format!("-max_total_time={seconds}"))
            .args(["-max_len=65536", "-timeout=10", "-rss_limit_mb=2048"])
            .arg(format!("-artifact_prefix={}/", scratch.display()))
            .arg(&empty)
            .output()
            .with_context(|| format!("running {}", bin.display()))?;
        let runs = String::from_utf8_lossy(&random.stderr)
            .lines()
            .filter_map(|l| {
                l.strip_prefix("Done ")?
                    .split_whitespace()
                    .next()?
                    .parse()
                    .ok()
            })
            .next_back()
            .unwrap_or(0u64);
        let ok = replay.status.success() && random.status.success();
        println!(
            "| {t} | {} | {runs} | {} |",
            inputs.len(),
            if ok { "ok" } else { "FAILED" }
        );
        for (what, out) in [("kept inputs", &replay), ("random inputs", &random)] {
            if !out.status.success() {
                let text = String::from_utf8_lossy(&out.stderr);
                let last: Vec<&str> = text.lines().rev().take(25).collect();
                eprintln!("{t}, {what}: {}", out.status);
                for l in last.iter().rev() {
                    eprintln!("  {l}");
                }
                failed.push(format!("{t} ({what})"));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
    if failed.is_empty() {
        return Ok(());
    }
    bail!(
        "fuzz targets failed: {} (the input is the last `Running:` line above, or a crash-* file \
         it names; fix the bug, add a regression test, keep the input in fuzz/corpus/TARGET/)",
        failed.join(", ")
    )
}

fn target(bin: &Path, scratch: &Path) -> Command {
    let mut c = Command::new(bin);
    // The audit targets write their logs here.
    c.env("AGENTOS_FUZZ_SCRATCH", scratch)
        .stdin(Stdio::null())
        .current_dir(scratch);
    c
}

/// The regular files in `dir`, sorted; none when it does not exist.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| p.is_file())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}
