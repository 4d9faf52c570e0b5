//! The benchmarks' `stamp` program: a tiny static binary whose `main` reads `CLOCK_MONOTONIC`
//! and prints it (xtask/src/bench/sandbox.rs times starts with it). `cargo xtask vm bench`
//! builds it on the host, because the guest has no compiler, and passes it in with
//! `AGENTOS_BENCH_STAMP`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The environment variable that names a prebuilt stamp (the benchmarks compile their own
/// without it).
#[cfg_attr(not(feature = "bench"), allow(dead_code))]
pub const STAMP_ENV: &str = "AGENTOS_BENCH_STAMP";

pub const STAMP_C: &str = r#"#include <stdio.h>
#include <time.h>
#include <unistd.h>
int main(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    char b[32];
    int n = snprintf(b, sizeof b, "%lld\n", (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec);
    return write(1, b, n) == n ? 0 : 1;
}
"#;

/// Compiles the stamp into `dir/stamp` with `cc -static` and returns its path.
pub fn compile(dir: &Path) -> Result<PathBuf> {
    let src = dir.join("stamp.c");
    std::fs::write(&src, STAMP_C).with_context(|| format!("writing {}", src.display()))?;
    let stamp = dir.join("stamp");
    let ok = Command::new("cc")
        .args(["-O2", "-static", "-o"])
        .arg(&stamp)
        .arg(&src)
        .status()
        .context("cc (install gcc)")?;
    if !ok.success() {
        bail!("cc -static failed (libc6-dev provides libc.a)");
    }
    Ok(stamp)
}
