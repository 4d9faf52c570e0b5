//! `cargo xtask vm`: the guest VM test bed.
//!
//! The guest is Debian trixie with the trixie-backports 7.3 kernel (BPF LSM, sched_ext, cgroup v2
//! with controllers) booted under QEMU software emulation, its root file system an uncompressed
//! initramfs. `setup` builds the image once (cached by a hash of its inputs); `test` appends a
//! second cpio with the freshly built binaries, boots, installs agentosd the way a user would and
//! runs the `vm-tests` suite; `shell` boots the same guest interactively. See docs/vm-tests.md.

pub mod host;
mod image;
mod payload;
mod qemu;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Result, bail};
use clap::{Args, Subcommand};

#[derive(Subcommand)]
pub enum VmCmd {
    /// Build (or reuse) the guest image: kernel + Debian root file system as an initramfs.
    Setup(SetupArgs),
    /// Build agentosd, agentctl and the vm-tests suite, boot the guest and run the suite in it.
    Test(TestArgs),
    /// Boot the guest with agentosd installed and started, and give an interactive root shell
    /// on the serial console (leave with `poweroff`, or Ctrl-A X).
    Shell(ShellArgs),
}

#[derive(Args)]
pub struct CacheArgs {
    /// Where the image is cached [default: $AGENTOS_VM_CACHE, else <target>/vm].
    #[arg(long, value_name = "DIR")]
    cache_dir: Option<PathBuf>,
}

#[derive(Args)]
pub struct SetupArgs {
    #[command(flatten)]
    cache: CacheArgs,
    /// Rebuild the image even if the cached one matches its inputs.
    #[arg(long)]
    force: bool,
}

#[derive(Args)]
pub struct TestArgs {
    #[command(flatten)]
    cache: CacheArgs,
    /// Run only the tests whose name contains FILTER (passed to the test binaries).
    filter: Option<String>,
    /// Overall limit for boot + tests + power-off, in seconds; QEMU is killed after it.
    #[arg(long, default_value_t = 900)]
    timeout: u64,
    /// Show the whole serial console while the guest runs, not only the tests' output.
    #[arg(long, short)]
    verbose: bool,
    /// Guest memory in MiB.
    #[arg(long, default_value_t = qemu::DEFAULT_MEM_MIB)]
    mem: u32,
    /// Use the release profile for agentosd, agentctl and the tests.
    #[arg(long)]
    release: bool,
}

#[derive(Args)]
pub struct ShellArgs {
    #[command(flatten)]
    cache: CacheArgs,
    /// Guest memory in MiB.
    #[arg(long, default_value_t = qemu::DEFAULT_MEM_MIB)]
    mem: u32,
    /// Use the release profile for agentosd and agentctl.
    #[arg(long)]
    release: bool,
}

pub fn run(cmd: VmCmd) -> Result<()> {
    match cmd {
        VmCmd::Setup(a) => {
            let cache = a.cache.resolve();
            image::setup(&cache, a.force).map(|_| ())
        }
        VmCmd::Test(a) => test(&a),
        VmCmd::Shell(a) => shell(&a),
    }
}

/// `cargo xtask vm test` with default options: what `cargo xtask test` runs.
pub fn test_default() -> Result<()> {
    test(&TestArgs {
        cache: CacheArgs { cache_dir: None },
        filter: None,
        timeout: 900,
        verbose: false,
        mem: qemu::DEFAULT_MEM_MIB,
        release: false,
    })
}

fn test(a: &TestArgs) -> Result<()> {
    let cache = a.cache.resolve();
    let image = image::setup(&cache, false)?;
    let build = payload::build(a.release, true)?;
    let run_dir = cache.join("run");
    let initrd = payload::stage(
        &build,
        &image,
        &run_dir,
        payload::Mode::Test {
            filter: a.filter.clone(),
        },
    )?;
    let outcome = qemu::boot_test(
        &image,
        &initrd,
        &run_dir.join("serial.log"),
        a.mem,
        Duration::from_secs(a.timeout),
        a.verbose,
    )?;
    match outcome {
        qemu::Outcome::Passed { secs, tests } => {
            eprintln!("vm test: {tests} tests passed ({secs:.0} s from boot to power-off)");
            Ok(())
        }
        qemu::Outcome::Failed { rc, log } => {
            print_log(&log);
            bail!(
                "vm test: the suite failed in the guest (exit status {rc}); serial log: {}",
                log.display()
            )
        }
        qemu::Outcome::NoMarker { why, log } => {
            print_log(&log);
            bail!(
                "vm test: no result from the guest ({why}); serial log: {}",
                log.display()
            )
        }
    }
}

fn shell(a: &ShellArgs) -> Result<()> {
    let cache = a.cache.resolve();
    let image = image::setup(&cache, false)?;
    let build = payload::build(a.release, true)?;
    let run_dir = cache.join("shell");
    let initrd = payload::stage(&build, &image, &run_dir, payload::Mode::Shell)?;
    qemu::boot_shell(&image, &initrd, a.mem)
}

fn print_log(log: &Path) {
    match std::fs::read_to_string(log) {
        Ok(s) => {
            eprintln!("----- guest serial log ({}) -----", log.display());
            eprintln!("{}", s.replace('\r', ""));
            eprintln!("----- end of guest serial log -----");
            let failed: Vec<&str> = s
                .lines()
                .map(|l| l.trim_end_matches('\r'))
                .filter(|l| l.starts_with("test ") && l.ends_with(" FAILED"))
                .collect();
            if !failed.is_empty() {
                eprintln!("failed in the guest:");
                for l in failed {
                    eprintln!("  {l}");
                }
            }
        }
        Err(e) => eprintln!("cannot read the serial log {}: {e}", log.display()),
    }
}

impl CacheArgs {
    fn resolve(&self) -> PathBuf {
        if let Some(d) = &self.cache_dir {
            return absolute(d);
        }
        if let Some(d) = std::env::var_os("AGENTOS_VM_CACHE").filter(|d| !d.is_empty()) {
            return absolute(Path::new(&d));
        }
        target_dir().join("vm")
    }
}

fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

/// The workspace root (the parent of xtask/).
pub fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

/// Cargo's target directory for this workspace.
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR").filter(|d| !d.is_empty()) {
        Some(d) => absolute(Path::new(&d)),
        None => workspace_root().join("target"),
    }
}
