//! `cargo xtask install`: build agentosd and agentctl and install them with their systemd and
//! D-Bus files, like `make install` would.
//!
//! Layout (DESTDIR is prepended to every path; PREFIX defaults to /usr/local):
//!
//! | what | where |
//! |---|---|
//! | `agentosd`, `agentctl`, `agentos-mcp` (the MCP stdio bridge agents run) | `PREFIX/bin/` |
//! | `agentosd.service` (ExecStart rewritten to PREFIX) | `/etc/systemd/system/`, or `/usr/lib/systemd/system/` when PREFIX is `/usr` |
//! | D-Bus policy `org.agentos1.conf` | `/usr/share/dbus-1/system.d/` |
//! | D-Bus activation `org.agentos1.service` | `/usr/share/dbus-1/system-services/` |
//! | polkit actions `org.agentos1.policy` | `/usr/share/polkit-1/actions/` |
//! | polkit rules `50-org.agentos1.rules` (the built-in defaults) | `/usr/share/polkit-1/rules.d/` |
//! | `agentos.conf` (sysusers, tmpfiles) | `/usr/lib/sysusers.d/`, `/usr/lib/tmpfiles.d/` |
//! | configuration directories | `/etc/agentos/agents.d`, `/etc/agentos/tools.d` |
//! | shell completions (`agentctl completions SHELL`) | `PREFIX/share/{bash-completion,zsh,fish}/…` |
//! | `examples/` (agents, contracts, tool manifests), paths in them rewritten to PREFIX | `PREFIX/share/agentos/examples/` |
//! | the example tools' scripts, where their manifests point | `/usr/lib/agentos/tools/` |
//!
//! It never runs systemctl: with `--destdir` it is packaging; without, it prints the next steps.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The unit's ExecStart as written in `units/agentosd.service`; rewritten to the real prefix.
const UNIT_EXEC_PATH: &str = "/usr/local/bin/agentosd";

/// The packages whose binaries are installed (and shipped to the VM, run by the demo and the
/// benchmarks): the daemon, the CLI, the MCP bridge.
pub const BIN_PACKAGES: [&str; 3] = ["agentosd", "agentctl", "agentos-mcp"];

/// `first` (`build`, a profile…), then `-p PACKAGE` for each of [`BIN_PACKAGES`] and `--bins`.
pub fn build_args<'a>(first: &[&'a str]) -> Vec<&'a str> {
    let mut v = first.to_vec();
    for p in BIN_PACKAGES {
        v.extend(["-p", p]);
    }
    v.push("--bins");
    v
}

#[derive(clap::Args, Debug, Clone)]
pub struct InstallArgs {
    /// Installation prefix for binaries and completions.
    #[arg(long, default_value = "/usr/local")]
    pub prefix: PathBuf,
    /// Stage the installation under this directory (packaging); nothing outside it is touched.
    #[arg(long)]
    pub destdir: Option<PathBuf>,
    /// Do not build; install the binaries already in the profile's target directory.
    #[arg(long)]
    pub no_build: bool,
    /// Cargo profile to build and install (`release`, `dev`, or a custom one).
    #[arg(long, default_value = "release")]
    pub profile: String,
    /// Take agentosd and agentctl from this directory instead of target/PROFILE.
    #[arg(long, value_name = "DIR")]
    pub bin_dir: Option<PathBuf>,
    /// Directory for agentosd.service (default: /etc/systemd/system, /usr/lib/systemd/system
    /// when the prefix is /usr).
    #[arg(long, value_name = "DIR")]
    pub unit_dir: Option<PathBuf>,
}

fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from)
}

/// `dev` builds go to target/debug, every other profile to target/PROFILE.
fn profile_dir(profile: &str) -> &str {
    match profile {
        "dev" | "test" => "debug",
        "bench" => "release",
        other => other,
    }
}

/// Joins an absolute install path under DESTDIR (or returns it as is without one).
fn staged(destdir: Option<&Path>, path: &Path) -> PathBuf {
    match destdir {
        Some(d) => d.join(path.strip_prefix("/").unwrap_or(path)),
        None => path.to_path_buf(),
    }
}

/// What was installed, for the summary.
#[derive(Default)]
struct Log {
    lines: Vec<String>,
}

impl Log {
    fn add(&mut self, what: &str, path: &Path) {
        self.lines
            .push(format!("  {:<24} {}", what, path.display()));
    }
}

/// Writes `data` to `dest` with `mode`, atomically (a running binary can be replaced).
fn write_file(dest: &Path, data: &[u8], mode: u32) -> Result<()> {
    let dir = dest
        .parent()
        .with_context(|| format!("{} has no parent directory", dest.display()))?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let name = dest
        .file_name()
        .with_context(|| format!("{} has no file name", dest.display()))?;
    let tmp = dir.join(format!(".{}.xtask-install", name.to_string_lossy()));
    std::fs::write(&tmp, data).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {}", tmp.display()))?;
    std::fs::rename(&tmp, dest).with_context(|| format!("installing {}", dest.display()))?;
    Ok(())
}

fn make_dir(path: &Path, mode: u32) -> Result<()> {
    std::fs::create_dir_all(path).with_context(|| format!("creating {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {}", path.display()))
}

/// `units/agentosd.service` with ExecStart pointing into `prefix`.
pub fn render_unit(template: &str, prefix: &Path) -> Result<String> {
    let exec = prefix.join("bin/agentosd");
    let exec = exec.to_str().context("the prefix is not valid UTF-8")?;
    if exec.chars().any(|c| c.is_whitespace()) {
        bail!(
            "the prefix {} contains whitespace, which ExecStart cannot hold",
            prefix.display()
        );
    }
    let line = format!("ExecStart={UNIT_EXEC_PATH} ");
    if !template.contains(&line) {
        bail!("units/agentosd.service has no `{line}…` line to rewrite");
    }
    Ok(template.replace(&line, &format!("ExecStart={exec} ")))
}

pub fn run(args: InstallArgs) -> Result<()> {
    let root = crate::workspace_root();
    if !args.prefix.is_absolute() {
        bail!(
            "--prefix must be an absolute path, not {}",
            args.prefix.display()
        );
    }
    let destdir = match &args.destdir {
        Some(d) => {
            Some(std::path::absolute(d).with_context(|| format!("resolving {}", d.display()))?)
        }
        None => None,
    };
    let destdir = destdir.as_deref();

    if !args.no_build {
        super::cargo(&build_args(&["build", "--profile", &args.profile]))?;
    }
    let bin_dir = args
        .bin_dir
        .clone()
        .unwrap_or_else(|| target_dir(&root).join(profile_dir(&args.profile)));
    let units = root.join("units");
    let mut log = Log::default();

    // Binaries.
    let bin = args.prefix.join("bin");
    for name in ["agentosd", "agentctl", "agentos-mcp"] {
        let src = bin_dir.join(name);
        let data = std::fs::read(&src).with_context(|| {
            format!(
                "reading {} (build it first, or drop --no-build / pass --bin-dir)",
                src.display()
            )
        })?;
        let dest = staged(destdir, &bin.join(name));
        write_file(&dest, &data, 0o755)?;
        log.add(name, &dest);
    }

    // systemd unit.
    let unit_dir = args.unit_dir.clone().unwrap_or_else(|| {
        if args.prefix == Path::new("/usr") {
            PathBuf::from("/usr/lib/systemd/system")
        } else {
            PathBuf::from("/etc/systemd/system")
        }
    });
    let template = std::fs::read_to_string(units.join("agentosd.service"))
        .context("reading units/agentosd.service")?;
    let unit = render_unit(&template, &args.prefix)?;
    let dest = staged(destdir, &unit_dir.join("agentosd.service"));
    write_file(&dest, unit.as_bytes(), 0o644)?;
    log.add("systemd unit", &dest);

    // D-Bus, sysusers, tmpfiles.
    for (src, dest, what) in [
        (
            "org.agentos1.conf",
            "/usr/share/dbus-1/system.d/org.agentos1.conf",
            "D-Bus policy",
        ),
        (
            "org.agentos1.service",
            "/usr/share/dbus-1/system-services/org.agentos1.service",
            "D-Bus activation",
        ),
        (
            "org.agentos1.policy",
            "/usr/share/polkit-1/actions/org.agentos1.policy",
            "polkit actions",
        ),
        (
            "50-org.agentos1.rules",
            "/usr/share/polkit-1/rules.d/50-org.agentos1.rules",
            "polkit rules",
        ),
        (
            "agentos.sysusers",
            "/usr/lib/sysusers.d/agentos.conf",
            "sysusers.d",
        ),
        (
            "agentos.tmpfiles",
            "/usr/lib/tmpfiles.d/agentos.conf",
            "tmpfiles.d",
        ),
    ] {
        let data =
            std::fs::read(units.join(src)).with_context(|| format!("reading units/{src}"))?;
        let dest = staged(destdir, Path::new(dest));
        write_file(&dest, &data, 0o644)?;
        log.add(what, &dest);
    }

    // Configuration directories (kept if they exist; contents are never touched).
    for dir in ["/etc/agentos/agents.d", "/etc/agentos/tools.d"] {
        let dest = staged(destdir, Path::new(dir));
        make_dir(&dest, 0o755)?;
        log.add("config directory", &dest);
    }

    // The examples, where their contracts and manifests point.
    install_examples(&root.join("examples"), destdir, &args.prefix, &mut log)?;

    // Shell completions, if agentctl can print them.
    let agentctl = bin_dir.join("agentctl");
    let share = args.prefix.join("share");
    for (shell, path) in [
        ("bash", share.join("bash-completion/completions/agentctl")),
        ("zsh", share.join("zsh/site-functions/_agentctl")),
        (
            "fish",
            share.join("fish/vendor_completions.d/agentctl.fish"),
        ),
    ] {
        match Command::new(&agentctl)
            .args(["completions", shell])
            .output()
        {
            Ok(out) if out.status.success() && !out.stdout.is_empty() => {
                let dest = staged(destdir, &path);
                write_file(&dest, &out.stdout, 0o644)?;
                log.add(&format!("{shell} completion"), &dest);
            }
            Ok(out) => log.lines.push(format!(
                "  (no {shell} completion: `agentctl completions {shell}` failed: {})",
                String::from_utf8_lossy(&out.stderr)
                    .lines()
                    .next()
                    .unwrap_or("no output")
            )),
            Err(e) => log.lines.push(format!(
                "  (no {shell} completion: cannot run {}: {e})",
                agentctl.display()
            )),
        }
    }

    // The host's audit signing key, created here (never into a DESTDIR image, which would give
    // every machine installed from it the same key: there, agentosd creates it at first start).
    if destdir.is_none() {
        let key = Path::new("/var/lib/agentos/audit.key");
        let out = Command::new(bin_dir.join("agentosd"))
            .arg("keygen")
            .arg("--audit-key")
            .arg(key)
            .output()
            .context("running agentosd keygen")?;
        if !out.status.success() {
            bail!(
                "agentosd keygen failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        log.add("audit signing key (0600)", key);
    } else {
        log.lines.push(
            "  (audit signing key: not staged; agentosd creates /var/lib/agentos/audit.key at first start)"
                .to_string(),
        );
    }

    println!("installed:");
    for l in &log.lines {
        println!("{l}");
    }
    if destdir.is_some() {
        println!(
            "staged under {}; nothing was started.",
            destdir.map_or(String::new(), |d| d.display().to_string())
        );
    } else {
        println!(
            "\nnext steps (as root):\n\
             \x20 systemd-sysusers agentos.conf && systemd-tmpfiles --create agentos.conf\n\
             \x20 systemctl reload dbus            # load the org.agentos1 policy\n\
             \x20 systemctl daemon-reload && systemctl enable --now agentosd\n\
             \x20 {} check                    # what this kernel can enforce\n\
             \x20 usermod -aG agentos USER         # let USER run agentctl",
            args.prefix.join("bin/agentosd").display()
        );
    }
    Ok(())
}

/// Where the examples' contracts say they are installed (with the default prefix).
const EXAMPLES_AT: &str = "/usr/local/share/agentos/examples";
/// Where the example tool manifests say their scripts are.
const TOOL_SCRIPTS_AT: &str = "/usr/lib/agentos/tools";

/// `examples/` to `PREFIX/share/agentos/examples/` (text files with [`EXAMPLES_AT`] rewritten
/// to the real prefix, so the contracts run as installed), and each script of
/// `examples/tools/` to [`TOOL_SCRIPTS_AT`], executable, as the manifests expect.
fn install_examples(
    src: &Path,
    destdir: Option<&Path>,
    prefix: &Path,
    log: &mut Log,
) -> Result<()> {
    if !src.is_dir() {
        return Ok(());
    }
    let at = prefix.join("share/agentos/examples");
    let to = staged(destdir, &at);
    copy_examples(src, &to, &at.display().to_string())?;
    log.add("examples", &to);
    let tools = src.join("tools");
    if let Ok(rd) = std::fs::read_dir(&tools) {
        let mut scripts: Vec<PathBuf> = rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "py"))
            .collect();
        scripts.sort();
        for s in scripts {
            let Some(name) = s.file_name() else { continue };
            let data = std::fs::read(&s).with_context(|| format!("reading {}", s.display()))?;
            let dest = staged(destdir, &Path::new(TOOL_SCRIPTS_AT).join(name));
            write_file(&dest, &data, 0o755)?;
            log.add("example tool script", &dest);
        }
        log.lines.push(format!(
            "  (to offer the example tools: cp {}/tools/*.yaml /etc/agentos/tools.d/ && agentctl daemon-reload)",
            at.display()
        ));
    }
    Ok(())
}

fn copy_examples(from: &Path, to: &Path, installed_at: &str) -> Result<()> {
    make_dir(to, 0o755)?;
    let mut entries: Vec<_> = std::fs::read_dir(from)
        .with_context(|| format!("reading {}", from.display()))?
        .flatten()
        .collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let (src, dest) = (e.path(), to.join(e.file_name()));
        let ft = e.file_type()?;
        if ft.is_dir() {
            copy_examples(&src, &dest, installed_at)?;
        } else if ft.is_file() {
            let data = std::fs::read(&src).with_context(|| format!("reading {}", src.display()))?;
            let data = match String::from_utf8(data) {
                Ok(t) => t.replace(EXAMPLES_AT, installed_at).into_bytes(),
                Err(e) => e.into_bytes(),
            };
            let exec = src
                .metadata()
                .map(|m| m.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
                || src.extension().is_some_and(|x| x == "py");
            write_file(&dest, &data, if exec { 0o755 } else { 0o644 })?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    /// A directory under the system temp dir, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(tag: &str) -> TempDir {
            static SEQ: AtomicU32 = AtomicU32::new(0);
            let p = std::env::temp_dir().join(format!(
                "xtask-install-{tag}-{}-{}",
                std::process::id(),
                SEQ.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).expect("create temp dir");
            TempDir(p)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn is_root() -> bool {
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("Uid:"))
                    .and_then(|v| v.split_whitespace().nth(1).map(|u| u == "0"))
            })
            .unwrap_or(false)
    }

    fn have(tool: &str) -> bool {
        Command::new(tool)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    }

    fn fake_bins(dir: &Path, with_completions: bool) {
        std::fs::create_dir_all(dir).expect("bin dir");
        write_file(
            &dir.join("agentosd"),
            b"#!/bin/sh\necho fake agentosd\n",
            0o755,
        )
        .expect("agentosd");
        let agentctl: &[u8] = if with_completions {
            b"#!/bin/sh\n[ \"$1\" = completions ] && echo \"# $2 completion for agentctl\"\n"
        } else {
            b"#!/bin/sh\necho 'error: unrecognized subcommand' >&2\nexit 2\n"
        };
        write_file(&dir.join("agentctl"), agentctl, 0o755).expect("agentctl");
        write_file(
            &dir.join("agentos-mcp"),
            b"#!/bin/sh\necho fake agentos-mcp\n",
            0o755,
        )
        .expect("agentos-mcp");
    }

    fn args(tmp: &Path, prefix: &str) -> InstallArgs {
        InstallArgs {
            prefix: PathBuf::from(prefix),
            destdir: Some(tmp.join("dest")),
            no_build: true,
            profile: "release".into(),
            bin_dir: Some(tmp.join("bin")),
            unit_dir: None,
        }
    }

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p)
            .unwrap_or_else(|e| panic!("{} missing: {e}", p.display()))
            .permissions()
            .mode()
            & 0o7777
    }

    #[test]
    fn installs_the_whole_tree_into_destdir() {
        let tmp = TempDir::new("tree");
        fake_bins(&tmp.0.join("bin"), true);
        run(args(&tmp.0, "/opt/agentos")).expect("install");
        let d = tmp.0.join("dest");
        for (p, m) in [
            ("opt/agentos/bin/agentosd", 0o755),
            ("opt/agentos/bin/agentctl", 0o755),
            ("opt/agentos/bin/agentos-mcp", 0o755),
            ("etc/systemd/system/agentosd.service", 0o644),
            ("usr/share/dbus-1/system.d/org.agentos1.conf", 0o644),
            (
                "usr/share/dbus-1/system-services/org.agentos1.service",
                0o644,
            ),
            ("usr/share/polkit-1/actions/org.agentos1.policy", 0o644),
            ("usr/share/polkit-1/rules.d/50-org.agentos1.rules", 0o644),
            ("usr/lib/sysusers.d/agentos.conf", 0o644),
            ("usr/lib/tmpfiles.d/agentos.conf", 0o644),
            ("etc/agentos/agents.d", 0o755),
            ("etc/agentos/tools.d", 0o755),
            (
                "opt/agentos/share/bash-completion/completions/agentctl",
                0o644,
            ),
            ("opt/agentos/share/zsh/site-functions/_agentctl", 0o644),
            (
                "opt/agentos/share/fish/vendor_completions.d/agentctl.fish",
                0o644,
            ),
        ] {
            assert_eq!(mode(&d.join(p)), m, "{p}");
        }
        let unit =
            std::fs::read_to_string(d.join("etc/systemd/system/agentosd.service")).expect("unit");
        assert!(
            unit.contains(
                "\nExecStart=/opt/agentos/bin/agentosd --state-dir /var/lib/agentos --agents-dir /etc/agentos/agents.d\n"
            ),
            "{unit}"
        );
        assert!(!unit.contains("/usr/local"), "{unit}");
        // The examples where their contracts point, with the real prefix.
        let notes = d.join("opt/agentos/share/agentos/examples/agents/notes-stats/contract.yaml");
        let contract = std::fs::read_to_string(&notes).expect("notes-stats contract");
        assert!(
            contract
                .contains("/opt/agentos/share/agentos/examples/agents/notes-stats/notes_stats.py")
                && !contract.contains("/usr/local/share"),
            "{contract}"
        );
        assert_eq!(
            mode(&d.join("opt/agentos/share/agentos/examples/agents/notes-stats/notes_stats.py")),
            0o755
        );
        assert_eq!(mode(&d.join("usr/lib/agentos/tools/wordcount.py")), 0o755);
        assert_eq!(
            mode(&d.join("opt/agentos/share/agentos/examples/tools/text-wordcount.yaml")),
            0o644
        );
        let bash = std::fs::read_to_string(
            d.join("opt/agentos/share/bash-completion/completions/agentctl"),
        )
        .expect("bash completion");
        assert_eq!(bash, "# bash completion for agentctl\n");
        // No stray temporary files are left behind.
        let leftovers = walk(&d)
            .into_iter()
            .filter(|p| p.to_string_lossy().contains(".xtask-install"))
            .count();
        assert_eq!(leftovers, 0);
        // Installing again over an existing tree works (idempotent).
        run(args(&tmp.0, "/opt/agentos")).expect("second install");
    }

    fn walk(dir: &Path) -> Vec<PathBuf> {
        let mut out = Vec::new();
        if let Ok(rd) = std::fs::read_dir(dir) {
            for e in rd.flatten() {
                let p = e.path();
                if p.is_dir() {
                    out.extend(walk(&p));
                }
                out.push(p);
            }
        }
        out
    }

    #[test]
    fn usr_prefix_puts_the_unit_in_the_vendor_directory_and_skips_missing_completions() {
        let tmp = TempDir::new("usr");
        fake_bins(&tmp.0.join("bin"), false);
        run(args(&tmp.0, "/usr")).expect("install");
        let d = tmp.0.join("dest");
        let unit = std::fs::read_to_string(d.join("usr/lib/systemd/system/agentosd.service"))
            .expect("unit");
        assert!(
            unit.contains("\nExecStart=/usr/bin/agentosd --state-dir"),
            "{unit}"
        );
        assert!(!d.join("etc/systemd/system/agentosd.service").exists());
        assert!(
            !d.join("usr/share/bash-completion/completions/agentctl")
                .exists()
        );
    }

    #[test]
    fn missing_binaries_and_bad_prefixes_are_errors() {
        let tmp = TempDir::new("err");
        let err = run(args(&tmp.0, "/usr/local")).expect_err("no binaries");
        assert!(format!("{err:#}").contains("agentosd"), "{err:#}");
        let err = run(args(&tmp.0, "relative")).expect_err("relative prefix");
        assert!(format!("{err:#}").contains("absolute"), "{err:#}");
        assert!(render_unit("ExecStart=/bin/x\n", Path::new("/usr")).is_err());
        assert!(
            render_unit(
                "ExecStart=/usr/local/bin/agentosd --x\n",
                Path::new("/my prefix")
            )
            .is_err()
        );
    }

    #[test]
    fn systemd_analyze_verify_accepts_the_unit() {
        if !have("systemd-analyze") {
            eprintln!(
                "skipped: no systemd-analyze here (the VM suite verifies the unit under systemd)"
            );
            return;
        }
        let tmp = TempDir::new("verify");
        let template =
            std::fs::read_to_string(crate::workspace_root().join("units/agentosd.service"))
                .expect("unit");
        // verify insists that ExecStart exists; point it at a binary that does.
        let unit = template.replace(UNIT_EXEC_PATH, "/bin/true");
        let path = tmp.0.join("agentosd.service");
        std::fs::write(&path, unit).expect("write unit");
        let out = Command::new("systemd-analyze")
            .args(["verify", "--man=no"])
            .arg(&path)
            .output()
            .expect("run systemd-analyze");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let version = Command::new("systemd-analyze")
            .arg("--version")
            .output()
            .ok()
            .and_then(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse::<u32>().ok())
            })
            .unwrap_or(0);
        let complaints: Vec<&str> = stderr
            .lines()
            .filter(|l| !l.trim().is_empty())
            // DelegateSubgroup= is systemd >= 254; older versions ignore it, as the unit says.
            .filter(|l| !(version < 254 && l.contains("Unknown key 'DelegateSubgroup'")))
            .collect();
        assert!(
            out.status.success() && complaints.is_empty(),
            "systemd-analyze {version}: {stderr}"
        );
    }

    #[test]
    fn sysusers_and_tmpfiles_create_group_and_directories_in_a_fake_root() {
        if !is_root() || !have("systemd-sysusers") || !have("systemd-tmpfiles") {
            eprintln!("skipped: needs root, systemd-sysusers and systemd-tmpfiles");
            return;
        }
        let tmp = TempDir::new("sysroot");
        std::fs::create_dir_all(tmp.0.join("etc")).expect("etc");
        let units = crate::workspace_root().join("units");
        let st = Command::new("systemd-sysusers")
            .arg(format!("--root={}", tmp.0.display()))
            .arg(units.join("agentos.sysusers"))
            .status()
            .expect("systemd-sysusers");
        assert!(st.success());
        let group = std::fs::read_to_string(tmp.0.join("etc/group")).expect("group file");
        let gid: u32 = group
            .lines()
            .find_map(|l| l.strip_prefix("agentos:x:"))
            .and_then(|r| r.trim_end_matches(':').split(':').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no agentos group in {group}"));
        let st = Command::new("systemd-tmpfiles")
            .arg(format!("--root={}", tmp.0.display()))
            .arg("--create")
            .arg(units.join("agentos.tmpfiles"))
            .status()
            .expect("systemd-tmpfiles");
        assert!(st.success());
        use std::os::unix::fs::MetadataExt;
        let meta =
            |p: &str| std::fs::metadata(tmp.0.join(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
        assert_eq!(meta("run/agentos").mode() & 0o7777, 0o751);
        assert_eq!(meta("run/agentos").gid(), gid);
        assert_eq!(meta("var/lib/agentos").mode() & 0o7777, 0o711);
        assert!(meta("etc/agentos/agents.d").is_dir());
        assert!(meta("etc/agentos/tools.d").is_dir());
    }

    /// A private bus whose policy is like Debian's system.conf, plus our file from `policy_dir`.
    struct Bus {
        child: std::process::Child,
        address: String,
    }

    impl Bus {
        fn start(dir: &Path, policy_dir: &Path) -> Bus {
            let services = dir.join("services");
            std::fs::create_dir_all(&services).expect("services dir");
            std::fs::copy(
                crate::workspace_root().join("units/org.agentos1.service"),
                services.join("org.agentos1.service"),
            )
            .expect("copy activation file");
            let socket = dir.join("bus");
            let conf = format!(
                r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-BUS Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>agentos-test</type>
  <listen>unix:path={socket}</listen>
  <auth>EXTERNAL</auth>
  <servicedir>{services}</servicedir>
  <policy context="default">
    <allow user="*"/>
    <deny own="*"/>
    <deny send_type="method_call"/>
    <allow send_type="signal"/>
    <allow send_requested_reply="true" send_type="method_return"/>
    <allow send_requested_reply="true" send_type="error"/>
    <allow receive_type="method_call"/>
    <allow receive_type="method_return"/>
    <allow receive_type="error"/>
    <allow receive_type="signal"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus.Introspectable"/>
  </policy>
  <includedir>{policy}</includedir>
</busconfig>
"#,
                socket = socket.display(),
                services = services.display(),
                policy = policy_dir.display()
            );
            let conf_path = dir.join("bus.conf");
            std::fs::write(&conf_path, conf).expect("bus.conf");
            let mut child = Command::new("dbus-daemon")
                .arg(format!("--config-file={}", conf_path.display()))
                .args(["--nofork", "--nopidfile", "--print-address"])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("start dbus-daemon");
            let mut line = String::new();
            if let Some(out) = child.stdout.take() {
                use std::io::BufRead;
                let _ = std::io::BufReader::new(out).read_line(&mut line);
            }
            let address = line.trim().to_string();
            assert!(
                address.starts_with("unix:"),
                "dbus-daemon did not start with {}",
                conf_path.display()
            );
            Bus { child, address }
        }

        /// Runs busctl as `uid`/`gid`; returns (success, stdout + stderr).
        fn busctl(&self, uid: u32, gid: u32, args: &[&str]) -> (bool, String) {
            let out = Command::new("setpriv")
                .args([
                    &format!("--reuid={uid}"),
                    &format!("--regid={gid}"),
                    "--init-groups",
                    "busctl",
                    &format!("--address={}", self.address),
                    "--timeout=5",
                ])
                .args(args)
                .output()
                .expect("run setpriv busctl");
            (
                out.status.success(),
                format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
            )
        }
    }

    impl Drop for Bus {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    const REQUEST_NAME: [&str; 7] = [
        "call",
        "org.freedesktop.DBus",
        "/org/freedesktop/DBus",
        "org.freedesktop.DBus",
        "RequestName",
        "su",
        "org.agentos1",
    ];
    const INTROSPECT: [&str; 5] = [
        "call",
        "org.agentos1",
        "/org/agentos1",
        "org.freedesktop.DBus.Introspectable",
        "Introspect",
    ];

    #[test]
    fn dbus_policy_lets_root_own_and_operators_call_and_denies_others() {
        if !is_root() || !have("dbus-daemon") || !have("busctl") || !have("setpriv") {
            eprintln!("skipped: needs root, dbus-daemon, busctl and setpriv");
            return;
        }
        let tmp = TempDir::new("dbus");
        std::fs::set_permissions(&tmp.0, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let policy =
            std::fs::read_to_string(crate::workspace_root().join("units/org.agentos1.conf"))
                .expect("policy");

        // 1. The file as shipped loads (the group agentos need not exist yet).
        let shipped = tmp.0.join("shipped.d");
        std::fs::create_dir_all(&shipped).expect("dir");
        std::fs::write(shipped.join("org.agentos1.conf"), &policy).expect("write");
        let bus = Bus::start(&tmp.0.join("b1"), &shipped);
        let mut own = REQUEST_NAME.to_vec();
        own.push("0");
        let (ok, out) = bus.busctl(0, 0, &own);
        assert!(
            ok && out.contains("u 1"),
            "root could not own org.agentos1: {out}"
        );
        drop(bus);

        // 2. Semantics, with the operators' group played by `daemon` (uid 1, gid 1, exists on
        // Debian) and an outsider played by `nobody` (65534, not in group daemon).
        let policy_dir = tmp.0.join("test.d");
        std::fs::create_dir_all(&policy_dir).expect("dir");
        assert!(policy.contains("group=\"agentos\""));
        std::fs::write(
            policy_dir.join("org.agentos1.conf"),
            policy.replace("group=\"agentos\"", "group=\"daemon\""),
        )
        .expect("write");
        let bus = Bus::start(&tmp.0.join("b2"), &policy_dir);
        let (ok, out) = bus.busctl(65534, 65534, &own);
        assert!(
            !ok && out.contains("Access denied"),
            "nobody could own org.agentos1: {out}"
        );
        let (ok, out) = bus.busctl(1, 1, &own);
        assert!(
            !ok && out.contains("Access denied"),
            "an operator could own org.agentos1: {out}"
        );
        // Nobody owns the name; a call that passes the policy triggers activation, whose Exec
        // (/bin/false) fails, while a call the policy refuses is denied before that.
        for (uid, gid, who) in [(0, 0, "root"), (1, 1, "operator")] {
            let (ok, out) = bus.busctl(uid, gid, &INTROSPECT);
            assert!(
                !ok && !out.contains("Access denied"),
                "{who} was refused: {out}"
            );
            assert!(
                out.contains("exited") || out.contains("Spawn"),
                "{who}: {out}"
            );
        }
        let (ok, out) = bus.busctl(65534, 65534, &INTROSPECT);
        assert!(
            !ok && out.contains("Access denied"),
            "an outsider reached org.agentos1: {out}"
        );
    }
}
