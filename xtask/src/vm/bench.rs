//! `cargo xtask vm bench [OPTIONS] -- BENCH ARGS…`: a benchmark of `cargo xtask bench` run in
//! the guest, where systemd is PID 1 and the cgroup controllers, BPF LSM and sched_ext are real.
//!
//! The host builds release agentosd, agentctl, agentos-mcp and xtask with its `bench` feature,
//! and the benchmarks' static `stamp` program (the guest has no compiler); they are staged into
//! the payload (agentosd installed as `vm test` installs it, xtask and stamp in the harness's
//! `bin/`). In the guest `run-bench.sh` runs `xtask bench ARGS…` with
//! `AGENTOS_BENCH_BIN_DIR=/usr/local/bin` and `AGENTOS_BENCH_STAMP`, its output on the serial
//! console (streamed here), then prints every file of [`GUEST_OUT`] between markers
//! (base64, with its SHA-256) and the bench's exit status:
//!
//! ```text
//! VMBENCH BEGIN …
//! … the bench's output …
//! VMBENCH FILE sandbox.json <sha256 hex>
//! VMBENCH DATA <base64, 76 columns>
//! VMBENCH FILE END
//! VMBENCH RC=0 …
//! ```
//!
//! The host writes the files into `--out` and exits with the bench's status; no `RC` marker, a
//! file cut short or a checksum that does not match is an error naming the serial log.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use sha2::{Digest, Sha256};

use super::{CacheArgs, host, image, payload, qemu, target_dir, workspace_root};

/// The guest directory whose files are copied back to the host after the bench.
pub const GUEST_OUT: &str = "/var/lib/agentos-vmbench";

const BEGIN: &str = "VMBENCH BEGIN";
const FILE: &str = "VMBENCH FILE ";
const FILE_END: &str = "VMBENCH FILE END";
const DATA: &str = "VMBENCH DATA ";
const RC: &str = "VMBENCH RC=";

#[derive(Args)]
pub struct BenchArgs {
    #[command(flatten)]
    cache: CacheArgs,
    /// Overall limit for boot + bench + power-off, in seconds; QEMU is killed after it.
    #[arg(long, default_value_t = 3600)]
    timeout: u64,
    /// Show the whole serial console (boot, install), not only the bench's output.
    #[arg(long, short)]
    verbose: bool,
    /// Guest memory in MiB.
    #[arg(long, default_value_t = qemu::DEFAULT_MEM_MIB)]
    mem: u32,
    /// Where the bench's result files go [default: <target>/vm-bench].
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// The arguments of `xtask bench` in the guest (after `--`), e.g. `sandbox --runs 200`.
    /// Without a `--json`, `--json /var/lib/agentos-vmbench/<BENCH>.json` is added; a `--json`
    /// of your own must point into /var/lib/agentos-vmbench to be copied back.
    #[arg(last = true, required = true, value_name = "BENCH ARGS")]
    args: Vec<String>,
}

pub fn run(a: &BenchArgs) -> Result<()> {
    let args = guest_args(&a.args)?;
    let cache = a.cache.resolve();
    let image = image::setup(&cache, false)?;
    let mut build = payload::build(true, false)?;
    build.add_helper("xtask", build_bench_xtask()?);
    let run_dir = cache.join("bench");
    std::fs::create_dir_all(&run_dir).with_context(|| format!("creating {}", run_dir.display()))?;
    build.add_helper("stamp", crate::stamp::compile(&run_dir)?);
    let initrd = payload::stage(
        &build,
        &image,
        &[],
        &run_dir,
        payload::Mode::Bench { args: args.clone() },
    )?;
    let log = run_dir.join("serial.log");
    let out = a
        .out
        .clone()
        .unwrap_or_else(|| target_dir().join("vm-bench"));
    eprintln!("vm bench: xtask bench {} in the guest", args.join(" "));
    let mut c = Collector::default();
    // No network: the benchmarks use loopback and namespaces of their own.
    let end = qemu::boot_console(
        &image,
        &initrd,
        "none",
        &log,
        a.mem,
        Duration::from_secs(a.timeout),
        |line| {
            let (done, show) = c.feed(line);
            if show && (a.verbose || c.begun) {
                println!("{line}");
            }
            done
        },
    )?;
    finish(c, &end, &log, &out)
}

/// Writes what the guest sent into `out` and turns its exit status into ours.
fn finish(c: Collector, end: &qemu::ConsoleEnd, log: &Path, out: &Path) -> Result<()> {
    let Some(rc) = c.rc else {
        bail!(
            "vm bench: no result from the guest ({}); serial log: {}",
            end.why,
            log.display()
        );
    };
    if !c.errors.is_empty() {
        bail!(
            "vm bench: the result files did not arrive intact ({}); serial log: {}",
            c.errors.join("; "),
            log.display()
        );
    }
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    for f in &c.files {
        let p = out.join(&f.name);
        std::fs::write(&p, &f.bytes).with_context(|| format!("writing {}", p.display()))?;
        eprintln!("vm bench: {} ({} bytes)", p.display(), f.bytes.len());
    }
    if rc != 0 {
        bail!(
            "vm bench: the bench failed in the guest (exit status {rc}); serial log: {}",
            log.display()
        );
    }
    eprintln!(
        "vm bench: done in {:.0} s, {} result file(s); serial log: {}",
        end.secs,
        c.files.len(),
        log.display()
    );
    Ok(())
}

/// `cargo build --release -p xtask --features bench` (what `cargo xtask bench` runs itself as).
fn build_bench_xtask() -> Result<PathBuf> {
    eprintln!("vm bench: building xtask with the bench feature (release)");
    let mut c =
        std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(workspace_root()).args([
        "build",
        "--release",
        "-p",
        "xtask",
        "--features",
        "bench",
    ]);
    host::run(&mut c)?;
    Ok(target_dir().join("release/xtask"))
}

/// The bench's arguments as the guest runs them: a `--json` into [`GUEST_OUT`] added when
/// there is none.
fn guest_args(args: &[String]) -> Result<Vec<String>> {
    let Some(bench) = args.first() else {
        bail!("vm bench: name the benchmark after `--`, e.g. `cargo xtask vm bench -- sandbox`");
    };
    let mut v = args.to_vec();
    if !args
        .iter()
        .any(|a| a == "--json" || a.starts_with("--json="))
    {
        v.push("--json".into());
        v.push(format!("{GUEST_OUT}/{bench}.json"));
    }
    Ok(v)
}

/// The `bench-args` file the guest reads with `mapfile`: one argument per line.
pub fn args_file(args: &[String]) -> Result<String> {
    let mut s = String::new();
    for a in args {
        if a.contains('\n') {
            bail!("vm bench: an argument with a newline cannot be passed to the guest: {a:?}");
        }
        s.push_str(a);
        s.push('\n');
    }
    Ok(s)
}

/// A file the guest sent back.
struct Received {
    name: String,
    bytes: Vec<u8>,
}

/// Reads the markers of `run-bench.sh` off the serial console.
#[derive(Default)]
struct Collector {
    /// The guest's runner has started (its output is the bench's from here on).
    begun: bool,
    rc: Option<i32>,
    files: Vec<Received>,
    /// The file being received: name, SHA-256 (hex), base64 so far.
    current: Option<(String, String, String)>,
    errors: Vec<String>,
}

impl Collector {
    /// Takes one console line; returns (the guest is done, the line is for the terminal).
    fn feed(&mut self, line: &str) -> (bool, bool) {
        if line.contains(BEGIN) {
            self.begun = true;
            return (false, true);
        }
        if let Some(at) = line.find(DATA) {
            match &mut self.current {
                Some((_, _, data)) => data.push_str(line[at + DATA.len()..].trim()),
                None => self.errors.push("data outside a file".into()),
            }
            return (false, false);
        }
        if line.contains(FILE_END) {
            match self.current.take() {
                Some((name, sha, data)) => match decode_checked(&data, &sha) {
                    Ok(bytes) => self.files.push(Received { name, bytes }),
                    Err(e) => self.errors.push(format!("{name}: {e}")),
                },
                None => self.errors.push("a file's end without its start".into()),
            }
            return (false, false);
        }
        if let Some(at) = line.find(FILE) {
            if let Some((name, ..)) = self.current.take() {
                self.errors.push(format!("{name}: cut short"));
            }
            let mut f = line[at + FILE.len()..].split_whitespace();
            match (f.next(), f.next()) {
                (Some(name), Some(sha)) if safe_name(name) => {
                    self.current = Some((name.to_string(), sha.to_string(), String::new()));
                }
                _ => self
                    .errors
                    .push(format!("a malformed file marker: {line:?}")),
            }
            return (false, true);
        }
        if let Some(rc) = qemu::marker_rc(line, RC) {
            if let Some((name, ..)) = self.current.take() {
                self.errors.push(format!("{name}: cut short"));
            }
            self.rc = Some(rc);
            return (true, true);
        }
        (false, true)
    }
}

/// A plain file name (written into the host's out directory): no path, not `.`/`..`.
fn safe_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && !name.contains('/')
        && name.chars().all(|c| c.is_ascii_graphic())
}

fn decode_checked(b64: &str, sha_hex: &str) -> Result<Vec<u8>> {
    let bytes = base64_decode(b64)?;
    let got = hex::encode(Sha256::digest(&bytes));
    if !got.eq_ignore_ascii_case(sha_hex) {
        bail!("SHA-256 {got} but the guest sent {sha_hex} (a console line garbled?)");
    }
    Ok(bytes)
}

/// Standard base64 (RFC 4648, `=` padding), as coreutils' `base64` writes it.
fn base64_decode(s: &str) -> Result<Vec<u8>> {
    fn val(c: u8) -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    }
    let s = s.as_bytes();
    if !s.len().is_multiple_of(4) {
        bail!("base64 of {} characters (not a multiple of 4)", s.len());
    }
    let mut out = Vec::with_capacity(s.len() / 4 * 3);
    for (i, q) in s.chunks(4).enumerate() {
        let last = i == s.len() / 4 - 1;
        let pad = q.iter().rev().take_while(|&&c| c == b'=').count();
        if pad > 2 || (pad > 0 && !last) {
            bail!("base64 padding in the middle");
        }
        let mut n: u32 = 0;
        for &c in &q[..4 - pad] {
            let v = val(c).with_context(|| format!("base64: invalid character {:?}", c as char))?;
            n = n << 6 | v;
        }
        n <<= 6 * pad as u32;
        let b = n.to_be_bytes();
        out.extend_from_slice(&b[1..4 - pad]);
    }
    Ok(out)
}

/// The guest side: install agentosd, run the bench, send its files back, power off.
pub const RUN_BENCH_SH: &str = r#"#!/bin/bash
exec > /dev/ttyS0 2>&1
D=/usr/local/lib/agentos-vmtest
OUT=/var/lib/agentos-vmbench
echo "VMBENCH BEGIN uptime=$(cut -d' ' -f1 /proc/uptime) cpus=$(nproc)"
$D/install.sh
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin RUST_BACKTRACE=1
# Prebuilt binaries: the guest has no compiler (xtask/src/bench/harness.rs, xtask/src/stamp.rs).
export AGENTOS_BENCH_BIN_DIR=/usr/local/bin AGENTOS_BENCH_STAMP=$D/bin/stamp
# The benches' agents may execute xtask itself: walkable for their uids.
chmod 0755 $D $D/bin
mkdir -p $OUT
mapfile -t args < $D/bench-args
echo "== xtask bench ${args[*]} (load average $(cut -d' ' -f1-3 /proc/loadavg), $(uname -r))"
$D/bin/xtask bench "${args[@]}"
rc=$?
for f in "$OUT"/*; do
  [ -f "$f" ] || continue
  echo "VMBENCH FILE $(basename "$f") $(sha256sum < "$f" | cut -d' ' -f1)"
  base64 -w 76 "$f" | sed 's/^/VMBENCH DATA /'
  echo "VMBENCH FILE END"
done
echo "VMBENCH RC=$rc uptime=$(cut -d' ' -f1 /proc/uptime)"
sync
echo o > /proc/sysrq-trigger
"#;

pub const BENCH_UNIT: &str = "[Unit]
Description=agentos VM benchmark (cargo xtask vm bench)
After=multi-user.target

[Service]
Type=oneshot
StandardInput=null
ExecStart=/usr/local/lib/agentos-vmtest/run-bench.sh

[Install]
WantedBy=multi-user.target
";

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn base64_round_trips_coreutils_output() {
        // `printf 'hello\n' | base64`, `printf 'ab' | base64`, `printf 'a' | base64`.
        assert_eq!(base64_decode("aGVsbG8K").unwrap(), b"hello\n");
        assert_eq!(base64_decode("YWI=").unwrap(), b"ab");
        assert_eq!(base64_decode("YQ==").unwrap(), b"a");
        assert_eq!(base64_decode("").unwrap(), b"");
        assert_eq!(base64_decode("+/8=").unwrap(), [0xfb, 0xff]);
        assert!(base64_decode("YQ=").is_err());
        assert!(base64_decode("YQ==YQ==").is_err());
        assert!(base64_decode("Y!==").is_err());
    }

    fn sent(name: &str, data: &[u8]) -> Vec<String> {
        let sha = hex::encode(Sha256::digest(data));
        // Encode as coreutils does, with the std-only encoder below.
        let b64 = encode(data);
        let mut v = vec![format!("VMBENCH FILE {name} {sha}")];
        for chunk in b64.as_bytes().chunks(76) {
            v.push(format!(
                "VMBENCH DATA {}",
                std::str::from_utf8(chunk).unwrap()
            ));
        }
        v.push("VMBENCH FILE END".into());
        v
    }

    fn encode(data: &[u8]) -> String {
        const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut s = String::new();
        for c in data.chunks(3) {
            let n = (c[0] as u32) << 16
                | (*c.get(1).unwrap_or(&0) as u32) << 8
                | *c.get(2).unwrap_or(&0) as u32;
            for i in 0..4 {
                if i <= c.len() {
                    s.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
                } else {
                    s.push('=');
                }
            }
        }
        s
    }

    #[test]
    fn files_between_markers_arrive_checked_and_the_rc_ends_the_run() {
        let json = br#"{"runs": 200, "modes": [{"mode": "agentos", "p50_ns": 812345}]}"#.repeat(5);
        let mut c = Collector::default();
        let mut shown = Vec::new();
        let mut lines = s(&[
            "[    1.0] boot noise",
            "VMBENCH BEGIN uptime=3.1 cpus=2",
            "| mode |",
        ]);
        lines.extend(sent("sandbox.json", &json));
        lines.extend(sent("empty", b""));
        lines.push("VMBENCH RC=0 uptime=99.0".into());
        let mut done_at = None;
        for (i, l) in lines.iter().enumerate() {
            let (done, show) = c.feed(l);
            if show {
                shown.push(l.clone());
            }
            if done {
                done_at = Some(i);
                break;
            }
        }
        assert_eq!(done_at, Some(lines.len() - 1));
        assert!(c.begun && c.errors.is_empty(), "{:?}", c.errors);
        assert_eq!(c.rc, Some(0));
        assert_eq!(c.files.len(), 2);
        assert_eq!(
            (c.files[0].name.as_str(), &c.files[0].bytes),
            ("sandbox.json", &json)
        );
        assert!(c.files[1].bytes.is_empty());
        assert!(
            shown.iter().all(|l| !l.contains("VMBENCH DATA")),
            "{shown:?}"
        );
        assert!(shown.iter().any(|l| l == "| mode |"));
    }

    #[test]
    fn a_garbled_or_cut_file_and_a_bad_name_are_errors() {
        let mut c = Collector::default();
        let mut lines = sent("a.json", b"{\"x\": 1}\n");
        // A kernel message landed inside a data line.
        lines[1].insert_str(14, "[ 12.3] oops");
        for l in &lines {
            c.feed(l);
        }
        assert!(c.errors[0].contains("a.json"), "{:?}", c.errors);

        let mut c = Collector::default();
        let lines = sent("b.json", b"0123456789");
        c.feed(&lines[0]);
        c.feed(&lines[1]);
        // The guest died before the file's end: the RC cannot come, but a new file or the RC
        // after a cut file names it.
        assert_eq!(c.feed("VMBENCH RC=0"), (true, true));
        assert!(
            c.errors.iter().any(|e| e.contains("b.json: cut short")),
            "{:?}",
            c.errors
        );

        let mut c = Collector::default();
        c.feed("VMBENCH FILE ../../etc/passwd 00");
        c.feed("VMBENCH FILE .. 00");
        assert_eq!(c.errors.len(), 2, "{:?}", c.errors);
        assert!(c.current.is_none());
    }

    #[test]
    fn a_failed_bench_keeps_its_status_and_no_rc_is_no_result() {
        let mut c = Collector::default();
        assert_eq!(c.feed("VMBENCH RC=3 uptime=1"), (true, true));
        assert_eq!(c.rc, Some(3));
        let dir = std::env::temp_dir().join(format!("vmbench-test-{}", std::process::id()));
        let end = qemu::ConsoleEnd {
            secs: 1.0,
            why: "timed out after 5 s; qemu signal: 9".into(),
        };
        let log = Path::new("/x/serial.log");
        let e = finish(c, &end, log, &dir).unwrap_err().to_string();
        assert!(
            e.contains("exit status 3") && e.contains("/x/serial.log"),
            "{e}"
        );
        let e = finish(Collector::default(), &end, log, &dir)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("no result") && e.contains("timed out") && e.contains("/x/serial.log"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_json_into_the_out_directory_is_added_unless_given() {
        assert_eq!(
            guest_args(&s(&["sandbox", "--runs", "5"])).unwrap(),
            s(&[
                "sandbox",
                "--runs",
                "5",
                "--json",
                "/var/lib/agentos-vmbench/sandbox.json"
            ])
        );
        let own = s(&["hrt", "--json=/var/lib/agentos-vmbench/h.json"]);
        assert_eq!(guest_args(&own).unwrap(), own);
        assert!(guest_args(&[]).is_err());
        assert_eq!(args_file(&s(&["a", "", "b c"])).unwrap(), "a\n\nb c\n");
        assert!(args_file(&s(&["a\nb"])).is_err());
    }
}
