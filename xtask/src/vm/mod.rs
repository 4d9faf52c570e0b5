//! `cargo xtask vm`: the guest VM test bed.
//!
//! The guest is Debian trixie with the trixie-backports 7.3 kernel (BPF LSM, sched_ext, cgroup v2
//! with controllers) booted under QEMU software emulation, its root file system an uncompressed
//! initramfs. `setup` builds the image once (cached by a hash of its inputs); `test` appends a
//! second cpio with the freshly built binaries, boots, installs agentosd the way a user would and
//! runs the `vm-tests` suite; `shell` boots the same guest interactively; `bench` runs one of
//! `cargo xtask bench`'s benchmarks there. See docs/vm-tests.md.

mod bench;
mod examples;
pub mod host;
mod image;
mod model;
mod payload;
mod qemu;
mod shards;

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
    /// Run a benchmark of `cargo xtask bench` in the guest (systemd PID 1, cgroup controllers):
    /// `cargo xtask vm bench -- sandbox --runs 200`. Builds release binaries and xtask with its
    /// bench feature, streams the bench's output, copies its JSON results back to --out.
    Bench(bench::BenchArgs),
    /// Boot the guest with agentosd installed and started, and give an interactive root shell
    /// on the serial console (leave with `poweroff`, or Ctrl-A X).
    Shell(ShellArgs),
    /// (internal) QEMU runs this per guest connection to the example model: copies the
    /// connection (stdin/stdout) to ADDR and back.
    #[command(hide = true)]
    Relay { addr: String },
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
    /// Limit for each guest's boot + tests + power-off, in seconds; QEMU is killed after it.
    /// Default: 2400 when the suite is split over several guests, 4200 when one guest runs it
    /// all.
    #[arg(long)]
    timeout: Option<u64>,
    /// Run the suite in N guests at once, each with a share of the test binaries (one guest
    /// uses one host CPU). Default: `AGENTOS_VM_SHARDS`, else one per host CPU up to two
    /// without a FILTER and one with it; fewer when the host's memory does not hold them.
    #[arg(long)]
    shards: Option<usize>,
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

impl VmCmd {
    /// `relay`, which QEMU runs per connection: builds nothing.
    pub fn is_internal(&self) -> bool {
        matches!(self, VmCmd::Relay { .. })
    }
}

pub fn run(cmd: VmCmd) -> Result<()> {
    match cmd {
        VmCmd::Setup(a) => {
            let cache = a.cache.resolve();
            image::setup(&cache, a.force).map(|_| ())
        }
        VmCmd::Test(a) => test(&a),
        VmCmd::Shell(a) => shell(&a),
        VmCmd::Bench(a) => bench::run(&a),
        VmCmd::Relay { addr } => model::relay(&addr),
    }
}

/// `cargo xtask vm test` with default options: what `cargo xtask test` runs.
pub fn test_default() -> Result<()> {
    test(&TestArgs {
        cache: CacheArgs { cache_dir: None },
        filter: None,
        timeout: None,
        shards: None,
        verbose: false,
        mem: qemu::DEFAULT_MEM_MIB,
        release: false,
    })
}

fn test(a: &TestArgs) -> Result<()> {
    let cache = a.cache.resolve();
    let image = image::setup(&cache, false)?;
    let build = payload::build(a.release, true)?;
    let examples = examples::ensure(&cache)?;
    let asked = match a.shards {
        Some(n) => Some(n),
        None => match std::env::var("AGENTOS_VM_SHARDS") {
            Ok(v) if !v.is_empty() => Some(v.parse().map_err(|_| {
                anyhow::anyhow!("AGENTOS_VM_SHARDS={v:?}: expected a number of guests")
            })?),
            _ => None,
        },
    };
    let n = shards::count(asked, a.filter.is_some(), a.mem);
    // One guest: everything, in target/vm/run as always. Several: run-1, run-2, … each with
    // its share.
    let plan: Vec<(PathBuf, Option<Vec<String>>)> = match n {
        1 => vec![(cache.join("run"), None)],
        _ => shards::plan(&build.test_names(), n)
            .into_iter()
            .enumerate()
            .map(|(i, share)| (cache.join(format!("run-{}", i + 1)), Some(share)))
            .collect(),
    };
    let timeout = Duration::from_secs(a.timeout.unwrap_or(match plan.len() {
        1 => 4200,
        _ => 2400,
    }));
    let mut initrds = Vec::new();
    for (dir, share) in &plan {
        if let Some(share) = share {
            eprintln!("vm test: guest {} runs {}", dir.display(), share.join(" "));
        }
        let initrd = payload::stage(
            &build,
            &image,
            std::slice::from_ref(&examples),
            dir,
            payload::Mode::Test {
                filter: a.filter.clone(),
                binaries: share.clone(),
            },
        )?;
        initrds.push(initrd);
    }
    let model = model::HostModel::start()?;
    let nic = model.nic()?;
    let several = plan.len() > 1;
    let outcomes: Vec<Result<qemu::Outcome>> = std::thread::scope(|s| {
        let runs: Vec<_> = plan
            .iter()
            .zip(&initrds)
            .enumerate()
            .map(|(i, ((dir, _), initrd))| {
                let tag = match several {
                    true => format!("[guest {}] ", i + 1),
                    false => String::new(),
                };
                let (image, nic) = (&image, &nic);
                s.spawn(move || {
                    boot_suite(
                        image,
                        initrd,
                        nic,
                        &dir.join("serial.log"),
                        a,
                        timeout,
                        &tag,
                    )
                })
            })
            .collect();
        runs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a guest's thread panicked")))
            })
            .collect()
    });
    let mut tests = 0;
    let mut secs: f64 = 0.0;
    let mut failures = Vec::new();
    for outcome in outcomes {
        match outcome? {
            qemu::Outcome::Passed { secs: s, tests: t } => {
                tests += t;
                secs = secs.max(s);
            }
            qemu::Outcome::Failed { rc, log } => {
                print_log(&log);
                failures.push(format!(
                    "the suite failed in the guest (exit status {rc}); serial log: {}",
                    log.display()
                ));
            }
            qemu::Outcome::NoMarker { why, log } => {
                print_log(&log);
                failures.push(format!(
                    "no result from the guest ({why}); serial log: {}",
                    log.display()
                ));
            }
        }
    }
    if !failures.is_empty() {
        bail!("vm test: {}", failures.join("; "));
    }
    eprintln!(
        "vm test: {tests} tests passed ({secs:.0} s from boot to power-off{})",
        match several {
            true => format!(", the longest of {} guests", plan.len()),
            false => String::new(),
        }
    );
    Ok(())
}

/// Boots one guest of the suite; once more when its kernel died of an emulator fault.
fn boot_suite(
    image: &image::Image,
    initrd: &Path,
    nic: &str,
    log: &Path,
    a: &TestArgs,
    timeout: Duration,
    tag: &str,
) -> Result<qemu::Outcome> {
    let echo = qemu::Echo {
        verbose: a.verbose,
        tag,
    };
    let boot = || qemu::boot_test(image, initrd, nic, log, a.mem, timeout, echo);
    let outcome = boot()?;
    if let qemu::Outcome::NoMarker { log: died, .. } = &outcome
        && let Some(fault) = std::fs::read_to_string(died)
            .ok()
            .and_then(|s| emulator_fault(&s))
    {
        // Kept beside the new log so the first boot can still be read.
        let first = died.with_extension("first.log");
        let _ = std::fs::rename(died, &first);
        eprintln!(
            "{tag}vm test: the guest kernel died of an emulator fault, not of a test ({fault}); \
             this is QEMU's multi-threaded TCG executing kernel text the kernel had already \
             patched back (docs/vm-tests.md, \"Emulator faults\"). Booting the suite once more; \
             the first serial log is {}",
            first.display()
        );
        return boot();
    }
    Ok(outcome)
}

/// A guest kernel death that comes from the emulator rather than from the code under test:
/// an `Oops: int3` is a CPU executing a breakpoint byte that live text patching (static keys,
/// which sched_ext and BPF toggle) had put there and already removed. On hardware the kernel's
/// sync_core IPIs make that impossible; under QEMU's multi-threaded TCG a vCPU can still run a
/// stale translation of the patched code. Returns the oops line.
fn emulator_fault(serial: &str) -> Option<String> {
    let oops = serial
        .lines()
        .map(|l| l.trim_end_matches('\r'))
        .find(|l| l.contains("Oops: int3"))?;
    serial.contains("Kernel panic").then(|| {
        let text = oops.find("Oops:").map_or(oops, |at| &oops[at..]);
        text.trim().to_string()
    })
}

fn shell(a: &ShellArgs) -> Result<()> {
    let cache = a.cache.resolve();
    let image = image::setup(&cache, false)?;
    let build = payload::build(a.release, true)?;
    let run_dir = cache.join("shell");
    let examples = examples::ensure(&cache)?;
    let initrd = payload::stage(&build, &image, &[examples], &run_dir, payload::Mode::Shell)?;
    let model = model::HostModel::start()?;
    qemu::boot_shell(&image, &initrd, &model.nic()?, a.mem)
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

#[cfg(test)]
mod tests {
    use super::emulator_fault;

    #[test]
    fn a_stale_int3_panic_is_an_emulator_fault() {
        let log = "[  182.432005] Oops: int3: 0000 [#1] SMP NOPTI\r\n\
                   [  182.437079] RIP: 0010:pick_task_idle+0xa/0x50\r\n\
                   [  182.450815] Kernel panic - not syncing: Fatal exception in interrupt\r\n";
        assert_eq!(
            emulator_fault(log).as_deref(),
            Some("Oops: int3: 0000 [#1] SMP NOPTI")
        );
    }

    #[test]
    fn other_guest_deaths_are_not() {
        // A test failure, an ordinary oops and an int3 oops the kernel survived all count.
        assert_eq!(emulator_fault("test x ... FAILED\nVMTEST RC=101\n"), None);
        let null_deref = "[ 9.1] BUG: kernel NULL pointer dereference\n[ 9.2] Oops: 0000 [#1]\n\
                          [ 9.3] Kernel panic - not syncing: Fatal exception\n";
        assert_eq!(emulator_fault(null_deref), None);
        assert_eq!(emulator_fault("[ 1.0] Oops: int3: 0000 [#1]\n"), None);
    }
}
