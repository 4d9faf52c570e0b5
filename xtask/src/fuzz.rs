//! `cargo xtask fuzz`: a bounded cargo-fuzz run of each target in fuzz/ (nightly toolchain,
//! libFuzzer), seeded from the corpora kept in fuzz/corpus, with a table of runs, time, corpus
//! and crashes. A crash fails the command and names its artifact (docs/testing.md#fuzzing).

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;

/// The cargo-fuzz release the project pins (installed into target/tools on first use).
const CARGO_FUZZ: &str = "0.13.2";

/// The fuzz targets (fuzz/fuzz_targets/NAME.rs), in the order they run.
pub const TARGETS: &[(&str, &str)] = &[
    ("contract", "contract and tool-manifest parsers"),
    ("ipc_lines", "line framing of agent sockets"),
    ("dns", "DNS stub wire code: queries, answers"),
    ("sniff", "SNI/Host proxy: ClientHello, HTTP head"),
    ("jsonrpc", "JSON-RPC/MCP parse and dispatch"),
    ("tool_args", "tool-argument schema checks"),
    ("audit_reader", "audit reader/verifier, any bytes"),
    ("audit_tamper", "audit verifier, edited valid log"),
];

#[derive(Args)]
pub struct FuzzArgs {
    /// Only this target (repeatable); all by default.
    #[arg(long = "target", value_name = "NAME")]
    targets: Vec<String>,
    /// How long each target runs (libFuzzer `-max_total_time`).
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// List the targets and exit.
    #[arg(long)]
    list: bool,
    /// The short mode `cargo xtask test` runs: build the targets with the stable toolchain
    /// (no libFuzzer instrumentation, no cargo-fuzz) and run each once on every input kept in
    /// fuzz/corpus/TARGET and fuzz/artifacts/TARGET, then `--seconds` of uninstrumented random
    /// inputs; any panic fails.
    #[arg(long)]
    replay: bool,
}

/// One target's run.
#[derive(Debug, Default, PartialEq)]
struct Outcome {
    runs: u64,
    seconds: u64,
    corpus_files: usize,
    corpus_bytes: u64,
    crash: Option<String>,
}

pub fn run(args: FuzzArgs) -> Result<()> {
    if args.list {
        for (name, what) in TARGETS {
            println!("{name:<13} {what}");
        }
        return Ok(());
    }
    for t in &args.targets {
        if !TARGETS.iter().any(|(n, _)| n == t) {
            bail!("no fuzz target {t:?} (see `cargo xtask fuzz --list`)");
        }
    }
    let chosen: Vec<&str> = TARGETS
        .iter()
        .map(|(n, _)| *n)
        .filter(|n| args.targets.is_empty() || args.targets.iter().any(|t| t == n))
        .collect();
    if args.replay {
        return crate::fuzz_replay::run(&chosen, args.seconds);
    }
    let root = crate::workspace_root();
    let nightly = Command::new("rustup")
        .args(["run", "nightly", "rustc", "--version"])
        .output();
    if !nightly.as_ref().is_ok_and(|o| o.status.success()) {
        bail!(
            "cargo-fuzz needs the nightly toolchain (libFuzzer's instrumentation): install it \
             with `rustup toolchain install nightly`"
        );
    }
    let bin = crate::tools::ensure_cargo_subcommand(&root, "fuzz", CARGO_FUZZ)?;
    let work = root.join("target/fuzz-runs");
    let build_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| root.join("target"), PathBuf::from)
        .join("fuzz");
    // The audit targets write their logs here; on tmpfs when there is one.
    let shm = Path::new("/dev/shm");
    let scratch = if shm.is_dir() { shm } else { &work }
        .join(format!("agentos-xtask-fuzz-{}", std::process::id()));
    let mut rows = Vec::new();
    for t in &chosen {
        let o = run_target(&root, &bin, &build_dir, &work, &scratch, t, args.seconds);
        let _ = std::fs::remove_dir_all(&scratch);
        rows.push((*t, o?));
    }
    println!("\n| target | runs | seconds | runs/s | corpus (files) | corpus (KiB) | crashes |");
    println!("|---|---|---|---|---|---|---|");
    for (t, o) in &rows {
        println!(
            "| {t} | {} | {} | {} | {} | {} | {} |",
            o.runs,
            o.seconds,
            o.runs / o.seconds.max(1),
            o.corpus_files,
            o.corpus_bytes / 1024,
            usize::from(o.crash.is_some())
        );
    }
    let crashed: Vec<_> = rows
        .iter()
        .filter_map(|(t, o)| o.crash.as_ref().map(|a| (t, a)))
        .collect();
    if crashed.is_empty() {
        return Ok(());
    }
    for (t, a) in &crashed {
        println!(
            "\n{t}: crash, input in {a}\n  reproduce: cd fuzz && cargo +nightly fuzz run -s none -a {t} {a}"
        );
    }
    bail!(
        "{} fuzz target(s) crashed: fix the bug, add a regression test in the crate's tests, \
         and keep the input in fuzz/corpus/TARGET/",
        crashed.len()
    )
}

/// Runs one target for `seconds`: new inputs go to target/fuzz-runs/corpus/TARGET (the repo's
/// fuzz/corpus/TARGET only seeds it), crashes to target/fuzz-runs/artifacts/TARGET, libFuzzer's
/// output to target/fuzz-runs/logs/TARGET.log.
fn run_target(
    root: &Path,
    bin: &Path,
    build_dir: &Path,
    work: &Path,
    scratch: &Path,
    target: &str,
    seconds: u64,
) -> Result<Outcome> {
    let corpus = work.join("corpus").join(target);
    let artifacts = work.join("artifacts").join(target);
    let logs = work.join("logs");
    for d in [&corpus, &artifacts, &logs, &scratch.to_path_buf()] {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let seeds = root.join("fuzz/corpus").join(target);
    let log_path = logs.join(format!("{target}.log"));
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("creating {}", log_path.display()))?;
    let tools_bin = bin.parent().map(Path::to_path_buf).unwrap_or_default();
    let path = std::env::join_paths(std::iter::once(tools_bin).chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))?;
    println!(
        "xtask fuzz: {target} for {seconds} s (log in {})",
        log_path.display()
    );
    let started = Instant::now();
    let mut cmd = Command::new("cargo");
    cmd.current_dir(root.join("fuzz"))
        .args([
            "+nightly",
            "fuzz",
            "run",
            "--sanitizer",
            "none",
            "--debug-assertions",
        ])
        .arg("--target-dir")
        .arg(build_dir)
        .arg(target)
        .arg(&corpus)
        .arg(&seeds)
        .arg("--")
        .arg(format!("-max_total_time={seconds}"))
        // A hang is a finding too: an input that takes over 10 s is reported as a timeout.
        .args(["-timeout=10", "-rss_limit_mb=2048", "-print_final_stats=1"])
        .arg(format!("-artifact_prefix={}/", artifacts.display()))
        .env("PATH", path)
        .env("CARGO_INCREMENTAL", "0")
        .env("AGENTOS_FUZZ_SCRATCH", scratch)
        // The rustup proxy picks the toolchain from `+nightly`, not from the outer cargo.
        .env_remove("CARGO")
        .env_remove("RUSTC")
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("CARGO_TARGET_DIR")
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .stdin(Stdio::null());
    let mut child = cmd.spawn().context("starting cargo +nightly fuzz run")?;
    // libFuzzer stops itself; this bounds the build and a hung exit.
    let limit = Duration::from_secs(seconds + 1800);
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break st;
        }
        if started.elapsed() > limit {
            // SAFETY: kill(2) on the process group of the child this function started.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
            bail!(
                "{target}: cargo fuzz ran over {} s, killed; see {}",
                limit.as_secs(),
                log_path.display()
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let text = std::fs::read_to_string(&log_path).unwrap_or_default();
    let mut o = parse_log(&text);
    let (files, bytes) = dir_size(&corpus);
    o.corpus_files = files;
    o.corpus_bytes = bytes;
    if !status.success() && o.crash.is_none() {
        let tail: Vec<&str> = text.lines().rev().take(30).collect();
        for l in tail.iter().rev() {
            eprintln!("  {l}");
        }
        if o.runs == 0 {
            bail!(
                "{target}: cargo fuzz failed ({status}) before fuzzing; see {}",
                log_path.display()
            );
        }
        o.crash = Some(format!("(no artifact; see {})", log_path.display()));
    }
    Ok(o)
}

/// Runs, seconds and the crash artifact from libFuzzer's output (`-print_final_stats=1`).
fn parse_log(text: &str) -> Outcome {
    let stat = |name: &str| {
        text.lines()
            .filter_map(|l| l.strip_prefix(name))
            .filter_map(|v| v.trim().parse::<u64>().ok())
            .next_back()
    };
    let crash = text
        .lines()
        .filter_map(|l| l.split_once("Test unit written to "))
        .map(|(_, p)| p.trim().to_string())
        .next_back();
    Outcome {
        runs: stat("stat::number_of_executed_units:").unwrap_or(0),
        // `Done 123456 runs in 181 second(s)`
        seconds: text
            .lines()
            .filter_map(|l| l.strip_prefix("Done ")?.split_once(" runs in "))
            .filter_map(|(_, t)| t.split_whitespace().next()?.parse().ok())
            .next_back()
            .unwrap_or(0),
        crash,
        ..Outcome::default()
    }
}

fn dir_size(d: &Path) -> (usize, u64) {
    std::fs::read_dir(d).map_or((0, 0), |rd| {
        rd.flatten()
            .filter_map(|e| e.metadata().ok())
            .filter(|m| m.is_file())
            .fold((0, 0), |(n, b), m| (n + 1, b + m.len()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_final_stats_and_the_artifact() {
        let ok = "#1024\tDONE   cov: 10 ft: 20 corp: 5/100b\nstat::number_of_executed_units: 123456\n\
                  stat::average_exec_per_sec:     2057\nDone 123456 runs in 60 second(s)\n";
        assert_eq!(
            parse_log(ok),
            Outcome {
                runs: 123456,
                seconds: 60,
                ..Outcome::default()
            }
        );
        let crash = "thread '<unnamed>' panicked at src/x.rs:1:1\n==1== ERROR: libFuzzer: deadly signal\n\
                     artifact_prefix='/w/target/fuzz-runs/artifacts/jsonrpc/'; Test unit written to \
                     /w/target/fuzz-runs/artifacts/jsonrpc/crash-abc\nstat::number_of_executed_units: 77\n";
        let o = parse_log(crash);
        assert_eq!(o.runs, 77);
        assert_eq!(
            o.crash.as_deref(),
            Some("/w/target/fuzz-runs/artifacts/jsonrpc/crash-abc")
        );
    }

    #[test]
    fn every_target_has_a_source_and_a_seed_corpus() {
        let root = crate::workspace_root();
        let manifest = std::fs::read_to_string(root.join("fuzz/Cargo.toml")).unwrap();
        for (t, _) in TARGETS {
            assert!(
                root.join(format!("fuzz/fuzz_targets/{t}.rs")).exists(),
                "fuzz/fuzz_targets/{t}.rs"
            );
            assert!(
                manifest.contains(&format!("name = \"{t}\"")),
                "{t} in fuzz/Cargo.toml"
            );
            let (files, _) = dir_size(&root.join("fuzz/corpus").join(t));
            assert!(files > 0, "fuzz/corpus/{t} has no seed");
        }
    }
}
