//! Host side helpers: running commands, installing the Debian packages the VM test bed needs.

use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

/// Runs a command, failing with its name and exit status.
pub fn run(cmd: &mut Command) -> Result<()> {
    let shown = show(cmd);
    let status = cmd
        .status()
        .with_context(|| format!("cannot run {shown}"))?;
    if !status.success() {
        bail!("{shown} failed ({status})");
    }
    Ok(())
}

/// Runs a command and returns its standard output; stderr goes to ours.
pub fn output(cmd: &mut Command) -> Result<String> {
    let shown = show(cmd);
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("cannot run {shown}"))?;
    if !out.status.success() {
        bail!("{shown} failed ({})", out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn show(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// What the VM test bed needs on the host: a program (or file) and the Debian package that
/// provides it.
pub const HOST_NEEDS: &[(&str, &str)] = &[
    ("qemu-system-x86_64", "qemu-system-x86"),
    ("cpio", "cpio"),
    ("xz", "xz-utils"),
    ("wget", "wget"),
    ("gpgv", "gpgv"),
    ("dpkg-deb", "dpkg"),
    ("chroot", "coreutils"),
    ("strip", "binutils"),
    (
        "/usr/share/keyrings/debian-archive-keyring.gpg",
        "debian-archive-keyring",
    ),
];

/// What building the workspace needs on the host (agentosd's build.rs compiles ebpf/ with
/// clang against libbpf's and the kernel's headers; sched-ext/ needs clang >= 15 for scx's
/// headers and builds a vendored libbpf with make, libelf and zlib), and what the host tests
/// use (a private dbus-daemon).
pub const BUILD_NEEDS: &[(&str, &str)] = &[
    ("clang", "clang"),
    ("clang-19", "clang-19"),
    ("llvm-strip", "llvm"),
    ("/usr/include/bpf/bpf_helpers.h", "libbpf-dev"),
    ("/usr/include/linux/bpf.h", "linux-libc-dev"),
    ("/usr/include/libelf.h", "libelf-dev"),
    ("/usr/include/zlib.h", "zlib1g-dev"),
    ("make", "make"),
    ("pkg-config", "pkg-config"),
    ("dbus-daemon", "dbus"),
];

/// Installs the host packages of [`HOST_NEEDS`] that are missing, with the system's own apt
/// configuration (used, never changed).
pub fn ensure_packages() -> Result<()> {
    ensure(HOST_NEEDS, "the VM test bed")
}

/// Installs the packages of [`BUILD_NEEDS`] that are missing (root only; otherwise says which).
pub fn ensure_build_packages() -> Result<()> {
    ensure(BUILD_NEEDS, "building agentos")
}

fn ensure(needs: &[(&str, &str)], purpose: &str) -> Result<()> {
    let missing: Vec<&str> = needs
        .iter()
        .filter(|(what, _)| !present(what))
        .map(|(_, pkg)| *pkg)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    if !Path::new("/usr/bin/apt-get").exists() || !is_root() {
        bail!(
            "{purpose} needs these Debian packages on the host: {} (run as root to have them installed, or `apt-get install` them)",
            missing.join(" ")
        );
    }
    eprintln!(
        "xtask: installing host packages for {purpose}: {}",
        missing.join(" ")
    );
    let install = |cmd: &mut Command| {
        cmd.env("DEBIAN_FRONTEND", "noninteractive")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(&missing)
            .status()
    };
    // Try without refreshing the package lists first (fast when they are recent), then update.
    let ok = install(Command::new("apt-get").stdout(Stdio::null())).is_ok_and(|s| s.success());
    if !ok {
        run(Command::new("apt-get").args(["update", "-q"]))?;
        run(Command::new("apt-get")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(&missing))?;
    }
    let still: Vec<&str> = needs
        .iter()
        .filter(|(what, _)| !present(what))
        .map(|(what, _)| *what)
        .collect();
    if !still.is_empty() {
        bail!("still missing after apt-get install: {}", still.join(" "));
    }
    Ok(())
}

fn present(what: &str) -> bool {
    if what.starts_with('/') {
        return Path::new(what).exists();
    }
    which(what)
}

/// Whether a program is on PATH (or in the sbin directories root has).
pub fn which(prog: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .any(|d| d.join(prog).is_file())
}

/// Whether this process runs as root (effective uid 0).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().nth(1))
            == Some("0")
    })
}
