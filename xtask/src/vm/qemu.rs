//! Booting the guest under QEMU (software emulation: this machine cannot run Debian kernels
//! under KVM) and reading the result off its serial console.

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::image::Image;

pub const DEFAULT_MEM_MIB: u32 = 4096;

/// BPF LSM needs `bpf` in `lsm=`; `mitigations=off` halves boot time under emulation. The guest
/// has no udev, so serial-getty@ttyS0 would wait for a device unit forever: it is masked (the
/// shell has a console unit of its own).
const CMDLINE: &str = "console=ttyS0 panic=-1 quiet mitigations=off lsm=landlock,lockdown,yama,bpf \
     systemd.mask=serial-getty@ttyS0.service";

const BEGIN: &str = "VMTEST BEGIN";
const MARKER: &str = "VMTEST RC=";

/// What of the guest's console the host prints: everything (`verbose`) or the suite's part,
/// each line after `tag` (which guest, when several run at once).
#[derive(Clone, Copy)]
pub struct Echo<'a> {
    pub verbose: bool,
    pub tag: &'a str,
}

pub enum Outcome {
    Passed { secs: f64, tests: u64 },
    Failed { rc: i32, log: PathBuf },
    NoMarker { why: String, log: PathBuf },
}

/// `nic`: the `-nic` option (model.rs: user networking restricted to the example model).
fn qemu(image: &Image, initrd: &Path, nic: &str, mem: u32, cmdline: &str) -> Command {
    let smp = std::thread::available_parallelism()
        .map(|n| n.get().clamp(2, 4))
        .unwrap_or(2);
    // One host thread for all vCPUs: under multi-threaded TCG a vCPU can run a stale
    // translation of kernel text that live patching has changed (static keys, toggled every
    // time sched_ext loads or unloads), and the guest dies of an `Oops: int3` in __schedule
    // (docs/vm-tests.md, "Emulator faults"). AGENTOS_VM_TCG=multi brings the faster mode back.
    let accel = match std::env::var("AGENTOS_VM_TCG").as_deref() {
        Ok("multi") => "tcg,thread=multi",
        _ => "tcg,thread=single",
    };
    let mut c = Command::new("qemu-system-x86_64");
    c.args(["-nodefaults", "-display", "none", "-no-reboot"])
        .args(["-accel", accel, "-cpu", "max,la57=off"])
        .args(["-smp", &smp.to_string(), "-m", &mem.to_string()])
        .args(["-nic", nic])
        .arg("-kernel")
        .arg(&image.kernel)
        .arg("-initrd")
        .arg(initrd)
        .args(["-append", cmdline]);
    c
}

/// Boots the guest with the test payload and waits for the result marker.
pub fn boot_test(
    image: &Image,
    initrd: &Path,
    nic: &str,
    log_path: &Path,
    mem: u32,
    timeout: Duration,
    echo: Echo<'_>,
) -> Result<Outcome> {
    let Echo { verbose, tag } = echo;
    let mut in_tests = false;
    let mut rc: Option<i32> = None;
    // Tests that passed, from libtest's `test result: ok. N passed; …` lines.
    let mut passed: u64 = 0;
    let started = Instant::now();
    let end = boot_console(image, initrd, nic, log_path, mem, timeout, |line| {
        if line.contains(BEGIN) {
            in_tests = true;
            eprintln!(
                "{tag}vm: guest up after {:.0} s; running the suite",
                started.elapsed().as_secs_f64()
            );
        }
        if verbose || in_tests {
            eprintln!("{tag}{line}");
        }
        // The escape suite (its own harness) ends with `escape suite: N attempts, …`.
        if let Some(rest) = line.split("escape suite: ").nth(1) {
            passed += rest
                .split(' ')
                .next()
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0);
        }
        if let Some(rest) = line.split("test result: ").nth(1) {
            passed += rest
                .split(". ")
                .nth(1)
                .and_then(|r| r.split(' ').next())
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0);
        }
        if let Some(v) = marker_rc(line, MARKER) {
            rc = Some(v);
            in_tests = false;
            return true;
        }
        false
    })?;
    let secs = end.secs;
    Ok(match rc {
        Some(0) if passed == 0 => Outcome::NoMarker {
            why: "the suite ran no test (a FILTER that matches nothing?)".into(),
            log: log_path.to_path_buf(),
        },
        Some(0) => Outcome::Passed {
            secs,
            tests: passed,
        },
        Some(rc) => Outcome::Failed {
            rc,
            log: log_path.to_path_buf(),
        },
        None => Outcome::NoMarker {
            why: end.why,
            log: log_path.to_path_buf(),
        },
    })
}

/// The number after `marker` in `line` (`VMTEST RC=3 …` → 3; a garbled number → -1).
pub fn marker_rc(line: &str, marker: &str) -> Option<i32> {
    let pos = line.find(marker)?;
    let v = line[pos + marker.len()..]
        .split_whitespace()
        .next()
        .unwrap_or("");
    Some(v.parse().unwrap_or(-1))
}

/// How a console run ended.
pub struct ConsoleEnd {
    /// Seconds from QEMU's start to its exit.
    pub secs: f64,
    /// Why the loop stopped when `on_line` never said it was done: a time-out or QEMU's exit
    /// (with its status).
    pub why: String,
}

/// Boots the guest with `initrd`, writes every serial console line to `log_path` and hands it
/// to `on_line` (without its `\r`) until that returns true (the guest printed its result; it
/// powers itself off, given 20 s), QEMU exits, or `timeout` passes (QEMU is killed).
pub fn boot_console(
    image: &Image,
    initrd: &Path,
    nic: &str,
    log_path: &Path,
    mem: u32,
    timeout: Duration,
    mut on_line: impl FnMut(&str) -> bool,
) -> Result<ConsoleEnd> {
    let mut cmd = qemu(image, initrd, nic, mem, CMDLINE);
    cmd.args(["-monitor", "none", "-serial", "stdio"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    eprintln!(
        "vm: booting kernel {} under QEMU (TCG); serial log: {}",
        image.kernel_version,
        log_path.display()
    );
    let started = Instant::now();
    let mut child = cmd.spawn().context("starting qemu-system-x86_64")?;
    let guard = KillOnDrop(&mut child);
    let stdout = guard.0.stdout.take().context("qemu stdout")?;
    let stderr = guard.0.stderr.take().context("qemu stderr")?;
    let (tx, rx) = mpsc::channel::<Option<String>>();
    let tx2 = tx.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).split(b'\n') {
            let Ok(line) = line else { break };
            let line = String::from_utf8_lossy(&line)
                .trim_end_matches('\r')
                .to_string();
            if tx.send(Some(line)).is_err() {
                break;
            }
        }
        let _ = tx.send(None);
    });
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx2.send(Some(format!("qemu: {line}"))).is_err() {
                break;
            }
        }
    });

    let mut log =
        fs::File::create(log_path).with_context(|| format!("creating {}", log_path.display()))?;
    let deadline = started + timeout;
    let mut done = false;
    let why = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break format!("timed out after {} s", timeout.as_secs());
        }
        match rx.recv_timeout(left) {
            Ok(Some(line)) => {
                writeln!(log, "{line}")?;
                if on_line(&line) {
                    done = true;
                    break String::new();
                }
            }
            Ok(None) => break "QEMU exited".to_string(),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                break format!("timed out after {} s", timeout.as_secs());
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break "QEMU exited".to_string(),
        }
    };
    // After the marker the guest powers itself off; give it a moment, then make sure. The
    // console is still logged meanwhile (the power-off messages).
    let grace = Duration::from_secs(if done { 20 } else { 0 });
    let until = Instant::now() + grace;
    while let Ok(Some(line)) = rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
        writeln!(log, "{line}")?;
    }
    let waited = wait_or_kill(guard.0, Duration::from_secs(if done { 5 } else { 0 }));
    let status = waited.map(|s| s.to_string()).unwrap_or_default();
    let secs = started.elapsed().as_secs_f64();
    eprintln!("vm: guest finished after {secs:.0} s");
    Ok(ConsoleEnd {
        secs,
        why: if done {
            why
        } else {
            format!("{why}; qemu {status}")
        },
    })
}

/// Boots the guest with the serial console on this terminal.
pub fn boot_shell(image: &Image, initrd: &Path, nic: &str, mem: u32) -> Result<()> {
    eprintln!(
        "vm: booting kernel {}; root logs in on the serial console. \
         Leave with `poweroff` (or Ctrl-A X).",
        image.kernel_version
    );
    let mut cmd = qemu(image, initrd, nic, mem, CMDLINE);
    cmd.args(["-serial", "mon:stdio"]);
    super::host::run(&mut cmd)
}

fn wait_or_kill(child: &mut Child, grace: Duration) -> Option<std::process::ExitStatus> {
    let until = Instant::now() + grace;
    loop {
        if let Ok(Some(s)) = child.try_wait() {
            return Some(s);
        }
        if Instant::now() >= until {
            let _ = child.kill();
            return child.wait().ok();
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Kills the QEMU we started (by its pid, through the `Child`) if we leave early.
struct KillOnDrop<'a>(&'a mut Child);

impl Drop for KillOnDrop<'_> {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}
