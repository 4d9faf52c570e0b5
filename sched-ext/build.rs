//! Compiles `src/bpf/main.bpf.c` with clang and generates its libbpf-rs skeleton
//! (`$OUT_DIR/main.skel.rs`). Headers: `src/bpf/include` holds the sched_ext headers of
//! scx_cargo 1.1.4 (`scx/`) and a `vmlinux.h` dumped from the VM's 7.3.4 kernel; libbpf-cargo
//! adds libbpf's own headers (`bpf/bpf_helpers.h` …). `BPF_CLANG` names the clang to use
//! (default `clang-19` when installed, else `clang`).

use std::path::PathBuf;

use anyhow::{Context, Result};
use libbpf_cargo::SkeletonBuilder;

const SRC: &str = "src/bpf/main.bpf.c";

fn main() -> Result<()> {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").context("OUT_DIR is not set")?);
    // scx's headers need clang >= 15 (BTF for `__ksym __weak` kfuncs): Debian bookworm's
    // `clang` is 14, its `clang-19` package works.
    let clang = std::env::var("BPF_CLANG")
        .ok()
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| {
            let path = std::env::var_os("PATH").unwrap_or_default();
            let has = |name: &str| std::env::split_paths(&path).any(|d| d.join(name).is_file());
            if has("clang-19") { "clang-19" } else { "clang" }.to_string()
        });
    println!("cargo:rerun-if-env-changed=BPF_CLANG");
    println!("cargo:rerun-if-changed=src/bpf");
    SkeletonBuilder::new()
        .source(SRC)
        .clang(&clang)
        .clang_args([
            "-O2",
            "-g",
            // BPF ISA v3 runs on every kernel with sched_ext; Debian bookworm's clang 14 knows v3.
            "-mcpu=v3",
            "-D__TARGET_ARCH_x86",
            // Kernels from 6.19 are built with -fms-extensions and their BTF embeds structs
            // by tag (`struct ns_tree;` members in vmlinux.h).
            "-fms-extensions",
            "-Wno-microsoft-anon-tag",
            "-Wno-missing-declarations",
            "-Wno-compare-distinct-pointer-types",
            "-Isrc/bpf/include",
            "-Isrc/bpf",
        ])
        .build_and_generate(out.join("main.skel.rs"))
        .with_context(|| {
            format!(
                "building the BPF scheduler {SRC} with `{clang}` (needs clang >= 15: on Debian \
                 bookworm install clang-19, llvm, libelf-dev, zlib1g-dev and pkg-config, as \
                 .ci/run does)"
            )
        })?;
    Ok(())
}
