//! Compiles the BPF programs in `../ebpf/*.bpf.c` with clang into OUT_DIR; agentosd embeds them
//! (`enforce::net`, `enforce::fs`). Without clang the objects are left empty and the daemon reports "not built"
//! instead of loading them (the rest of the workspace still builds); CI installs clang.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest =
        PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let src_dir = manifest.join("../ebpf");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    println!("cargo:rerun-if-changed={}", src_dir.display());
    println!("cargo:rerun-if-env-changed=CLANG");
    let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang".to_string());
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let (target_arch, multiarch) = match arch.as_str() {
        "aarch64" => ("arm64", "aarch64-linux-gnu"),
        _ => ("x86", "x86_64-linux-gnu"),
    };
    // libbpf-dev's helper headers are needed besides clang.
    let headers = Path::new("/usr/include/bpf/bpf_helpers.h").exists();
    if !headers {
        println!(
            "cargo:warning=/usr/include/bpf/bpf_helpers.h is missing (apt-get install libbpf-dev): BPF programs not built; agentosd will report network enforcement as unavailable"
        );
    }
    // net: the cgroup programs and lsm/socket_connect share the policy map. fs: the
    // filesystem-scope LSM programs (enforce::fs). sysc: the opt-in syscall counter (enforce::sysc).
    for name in ["net", "fs", "sysc"] {
        let src = src_dir.join(format!("{name}.bpf.c"));
        let obj = out.join(format!("{name}.bpf.o"));
        println!("cargo:rerun-if-changed={}", src.display());
        if !headers || !compile(&clang, &src, &obj, &src_dir, target_arch, multiarch) {
            std::fs::write(&obj, b"").expect("write empty BPF object");
        }
    }
    println!(
        "cargo:rerun-if-changed={}",
        src_dir.join("intf.h").display()
    );
}

fn compile(
    clang: &str,
    src: &Path,
    obj: &Path,
    inc: &Path,
    target_arch: &str,
    multiarch: &str,
) -> bool {
    let status = Command::new(clang)
        .args([
            "-O2", "-g", "-target", "bpf", "-mcpu=v3", "-Wall", "-Werror",
        ])
        .arg(format!("-D__TARGET_ARCH_{target_arch}"))
        .arg("-I")
        .arg(inc)
        .arg("-I")
        .arg(format!("/usr/include/{multiarch}"))
        .arg("-c")
        .arg(src)
        .arg("-o")
        .arg(obj)
        .status();
    match status {
        Ok(s) if s.success() => true,
        Ok(s) => panic!(
            "clang failed ({s}) compiling {}; fix the program (or unset CLANG to use the default)",
            src.display()
        ),
        Err(e) => {
            println!(
                "cargo:warning=cannot run {clang} ({e}): BPF programs not built; agentosd will report network enforcement as unavailable. Install clang and libbpf-dev."
            );
            false
        }
    }
}
