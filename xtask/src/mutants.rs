//! `cargo xtask mutants`: mutation testing (cargo-mutants) of the code that decides access,
//! each target with the tests that can catch its mutants, time-boxed, with a caught/missed
//! table per file. A missed mutant in an access decision is a test to write (docs/testing.md).

use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;

/// The cargo-mutants release the project pins (installed into target/tools on first use).
const CARGO_MUTANTS: &str = "27.1.0";

#[derive(Args)]
pub struct MutantsArgs {
    /// Only the quick targets (pure code in small crates): what `cargo xtask test` could afford.
    #[arg(long)]
    short: bool,
    /// Only targets whose name contains this.
    #[arg(long, value_name = "NAME")]
    only: Option<String>,
    /// Time box per target, in minutes: the run stops there and reports what it covered.
    #[arg(long, default_value_t = 20)]
    minutes: u64,
    /// List the targets and exit.
    #[arg(long)]
    list: bool,
    /// Only the mutants the last run of each target did not catch (cargo-mutants `--iterate`,
    /// reading the previous results in target/mutants/TARGET): after writing the tests for
    /// what it missed.
    #[arg(long)]
    iterate: bool,
}

/// One module that decides access, and the tests that can catch a change of its decisions.
struct Target {
    name: &'static str,
    package: &'static str,
    files: &'static [&'static str],
    /// Only functions whose name matches (cargo-mutants `--re`), when the file holds more.
    re: Option<&'static str>,
    /// Arguments for `cargo test` after the package (which test binaries to build and run).
    tests: &'static [&'static str],
    /// Cheap enough for the short run.
    short: bool,
    /// Mutants that cannot change what the code does (cargo-mutants `--exclude-re`), each
    /// with the reason: a regex over the mutant's name and why every match is equivalent.
    equivalent: &'static [(&'static str, &'static str)],
}

/// `BPF_LD | BPF_W` → `BPF_LD & BPF_W` in the load instruction (prefilter.rs' `LD_W_ABS`,
/// sockets.rs' `notify_filter`): both are 0.
const LD_W_ZERO_FIELDS: (&str, &str) = (
    r"(prefilter\.rs:10:47|sockets\.rs:93:27): replace \| with &",
    "`BPF_LD | BPF_W | BPF_ABS`: the class BPF_LD and the size BPF_W are both 0, so the first \
     `|` and `&` give the same 0 (line-anchored: an edit of the file shows the mutant again)",
);

/// `-1` → `1` as the first value of what the kernel fills (sockets.rs: the fds of
/// `socketpair` in `handover_pair`, the pidfd of `clone3` in `spawn_broker`).
const KERNEL_FILLED: (&str, &str) = (
    r"sockets\.rs:(111:20: delete - in handover_pair|251:34: delete - in spawn_broker)",
    "the value before socketpair(2) or clone3(CLONE_PIDFD) writes the fd: on success it is \
     never read, on failure the function returns the error without reading it",
);

/// `ret < 0` → `ret <= 0` after `clone3` in the parent (sockets.rs `spawn_broker`).
const CLONE_CHILD_DIVERGES: (&str, &str) = (
    r"sockets\.rs:267:12: replace < with <= in spawn_broker",
    "0 is the child's return, and the child has already gone into broker_main, which never \
     returns: the parent sees only a pid or a negative error",
);

/// `|` → `^` where the operands are disjoint bit fields (the same value either way).
const DISJOINT_BITS: (&str, &str) = (
    r"replace \| with \^",
    "every bitwise `|` in these files joins disjoint constant bit fields (a BPF opcode's \
     class, size, mode and operation bits; SECCOMP_RET_ERRNO over an errno of at most 0xffff, \
     which the policy loader checks; SOCK_, MSG_, CLONE_ and POLL flags), where `^` gives the \
     same value",
);

const TARGETS: &[Target] = &[
    Target {
        name: "contract-scopes",
        package: "contracts",
        files: &["contracts/src/decode.rs"],
        re: Some("normalize_path|net_scope_ok|decode_scope|decode_capabilities"),
        tests: &[],
        equivalent: &[],
        short: true,
    },
    Target {
        name: "audit-verifier",
        package: "audit",
        files: &["audit/src/scan.rs", "audit/src/verify.rs"],
        re: None,
        tests: &["--test", "verify", "--test", "recovery", "--test", "cli"],
        equivalent: &[],
        short: true,
    },
    Target {
        name: "gate",
        package: "agentosd",
        files: &["agentosd/src/mcp/mod.rs"],
        re: Some("decide"),
        tests: &["--lib"],
        equivalent: &[],
        short: false,
    },
    Target {
        name: "seccomp-policy",
        package: "agentosd",
        files: &[
            "agentosd/src/sandbox/seccomp/mod.rs",
            "agentosd/src/sandbox/seccomp/prefilter.rs",
        ],
        re: None,
        tests: &["--lib", "--test", "escape"],
        equivalent: &[DISJOINT_BITS, LD_W_ZERO_FIELDS],
        short: false,
    },
    Target {
        name: "socket-broker",
        package: "agentosd",
        files: &["agentosd/src/sandbox/sockets.rs"],
        re: None,
        tests: &["--lib", "--test", "sockets"],
        equivalent: &[
            DISJOINT_BITS,
            LD_W_ZERO_FIELDS,
            KERNEL_FILLED,
            CLONE_CHILD_DIVERGES,
        ],
        short: false,
    },
    Target {
        name: "network-policy",
        package: "agentosd",
        files: &["agentosd/src/enforce/net/policy.rs"],
        re: Some("policy_from_scopes|parse_scope|resolve"),
        tests: &["--lib", "--test", "escape"],
        equivalent: &[],
        short: false,
    },
    Target {
        name: "filesystem-policy",
        package: "agentosd",
        files: &[
            "agentosd/src/enforce/fs/policy.rs",
            "agentosd/src/sandbox/mod.rs",
        ],
        re: Some("from_plan|plan|from_contract|widened"),
        tests: &["--lib", "--test", "escape"],
        equivalent: &[],
        short: false,
    },
];

/// Per file: (caught, missed, timeout, unviable), and the missed mutants' lines.
#[derive(Default, Debug, PartialEq)]
struct Tally {
    caught: usize,
    missed: usize,
    timeout: usize,
    unviable: usize,
    /// Caught or unviable in the runs before an `--iterate` run (not tested again).
    before: usize,
}

/// The short run inside `cargo xtask test`: the quick targets (pure code in small crates,
/// deterministic), each boxed to `minutes`.
pub fn short(minutes: u64) -> Result<()> {
    run(MutantsArgs {
        short: true,
        only: None,
        minutes,
        list: false,
        iterate: false,
    })
}

pub fn run(args: MutantsArgs) -> Result<()> {
    let chosen: Vec<&Target> = TARGETS
        .iter()
        .filter(|t| !args.short || t.short)
        .filter(|t| args.only.as_deref().is_none_or(|o| t.name.contains(o)))
        .collect();
    if args.list {
        for t in &chosen {
            println!("{:<18} {} ({})", t.name, t.files.join(" "), t.package);
        }
        return Ok(());
    }
    if chosen.is_empty() {
        bail!("no mutants target matches (see `cargo xtask mutants --list`)");
    }
    let root = crate::workspace_root();
    let bin = crate::tools::ensure_cargo_subcommand(&root, "mutants", CARGO_MUTANTS)?;
    let build_dir = root.join("target/mutants-build");
    let mut missed_all = Vec::new();
    let mut rows = Vec::new();
    for t in chosen {
        // agentosd's integration tests drive the daemon with agentctl and the MCP bridge,
        // which `cargo test -p agentosd` does not build: build them once from the unmutated
        // tree and name them to the tests (the mutated copy's sources are newer than any
        // binary, which the tests' staleness check would refuse).
        let mut env = Vec::new();
        if t.package == "agentosd" {
            crate::cargo_with(
                &["build", "-p", "agentctl", "-p", "agentos-mcp"],
                &[("CARGO_TARGET_DIR", build_dir.as_os_str())],
            )?;
            env.push(("AGENTOS_TEST_AGENTCTL", build_dir.join("debug/agentctl")));
            env.push(("AGENTOS_TEST_MCP", build_dir.join("debug/agentos-mcp")));
        }
        let out = root.join("target/mutants").join(t.name);
        if !args.iterate {
            let _ = std::fs::remove_dir_all(&out);
        }
        std::fs::create_dir_all(&out)?;
        let mut cmd = Command::new(&bin);
        cmd.current_dir(&root)
            // The baseline (the tests on the unmutated tree) runs first: a test that fails
            // without any mutant would count every mutant as caught.
            .args(["mutants", "--package", t.package])
            .args(["--timeout", "300", "--build-timeout", "600", "--no-shuffle"])
            .arg("--output")
            .arg(&out)
            // A persistent target dir keeps the dependencies built between runs.
            .env("CARGO_TARGET_DIR", &build_dir)
            // Each mutant changes one file of one crate: incremental builds make a mutant's
            // build several times quicker, whatever the caller's setting.
            .env("CARGO_INCREMENTAL", "1")
            .envs(env);
        for f in t.files {
            cmd.args(["--file", f]);
        }
        if let Some(re) = t.re {
            cmd.args(["--re", re]);
        }
        for (re, _) in t.equivalent {
            cmd.args(["--exclude-re", re]);
        }
        if args.iterate {
            cmd.arg("--iterate");
        }
        // As cargo arguments, not test arguments: the build phase (`cargo test --no-run`) then
        // builds only these test binaries instead of every one of the package's (for agentosd
        // that halves a mutant's build).
        for a in t.tests {
            cmd.arg(format!("--cargo-arg={a}"));
        }
        // Its own process group, so the time box can stop cargo and the tests with it.
        cmd.process_group(0);
        println!("xtask mutants: {} ({} min at most)", t.name, args.minutes);
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let deadline = Instant::now() + Duration::from_secs(args.minutes * 60);
        let mut boxed = false;
        loop {
            if child.try_wait()?.is_some() {
                break;
            }
            if Instant::now() >= deadline {
                // SAFETY: kill(2) on the process group of the child this function started.
                unsafe { libc::kill(-(child.id() as i32), libc::SIGTERM) };
                let _ = child.wait();
                boxed = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        let dir = out.join("mutants.out");
        for f in t.files {
            let tally = tally(&dir, f);
            rows.push((t.name, f.to_string(), tally, boxed));
        }
        missed_all.extend(lines(&dir.join("missed.txt")));
    }
    println!(
        "\n| target | file | caught | missed | timeout | unviable | caught or unviable before (--iterate) | complete |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (name, file, t, boxed) in &rows {
        println!(
            "| {name} | {file} | {} | {} | {} | {} | {} | {} |",
            t.caught,
            t.missed,
            t.timeout,
            t.unviable,
            t.before,
            if *boxed { "no (time box)" } else { "yes" }
        );
    }
    for t in TARGETS
        .iter()
        .filter(|t| rows.iter().any(|r| r.0 == t.name))
    {
        for (re, why) in t.equivalent {
            println!("\n{}: left out as equivalent, `{re}`: {why}", t.name);
        }
    }
    if !missed_all.is_empty() {
        println!("\nmissed mutants (each is a decision no test holds):");
        for m in &missed_all {
            println!("  {m}");
        }
        bail!("{} missed mutant(s)", missed_all.len());
    }
    Ok(())
}

/// Lines of one of cargo-mutants' outcome lists (missing file: none).
fn lines(p: &Path) -> Vec<String> {
    std::fs::read_to_string(p)
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect()
}

/// Count the outcomes of `file`'s mutants in a mutants.out directory. Each list has one line
/// per mutant, starting with the file's path relative to the workspace (`FILE:LINE:COL: …`).
fn tally(dir: &Path, file: &str) -> Tally {
    let n = |list: &str| {
        lines(&dir.join(list))
            .iter()
            .filter(|l| l.starts_with(&format!("{file}:")))
            .count()
    };
    Tally {
        caught: n("caught.txt"),
        missed: n("missed.txt"),
        timeout: n("timeout.txt"),
        unviable: n("unviable.txt"),
        before: n("previously_caught.txt"),
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    #[test]
    fn tally_counts_per_file() {
        let d = tempfile_dir();
        std::fs::write(
            d.join("caught.txt"),
            "a/x.rs:1:1: replace f -> bool with true\na/y.rs:2:2: replace g\n",
        )
        .unwrap();
        std::fs::write(d.join("missed.txt"), "a/x.rs:3:3: delete !\n").unwrap();
        assert_eq!(
            tally(&d, "a/x.rs"),
            Tally {
                caught: 1,
                missed: 1,
                timeout: 0,
                unviable: 0,
                before: 0
            }
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    fn tempfile_dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!("xtask-mutants-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn every_target_names_existing_files() {
        let root = crate::workspace_root();
        for t in TARGETS {
            for f in t.files {
                assert!(root.join(f).exists(), "{}: {f} does not exist", t.name);
            }
        }
    }
}
