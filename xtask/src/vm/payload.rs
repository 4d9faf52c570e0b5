//! What goes into the guest on top of the image: agentosd and agentctl installed the way
//! `cargo xtask install` lays them out, the units, the example contracts, the `vm-tests` binaries
//! and the guest-side runner. It is packed as a second cpio archive appended to the image's
//! (the kernel unpacks both, in order, into its root file system).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use super::image::{Image, pack_cpio};
use super::{host, workspace_root};

/// agentosd's host test suites (agentosd/tests/NAME.rs) that run in the guest too.
const HOST_SUITES: &[&str] = &["escape", "dns", "dns_rest", "sni", "fspin", "quota"];

/// Where the test harness lives in the guest.
pub const GUEST_DIR: &str = "/usr/local/lib/agentos-vmtest";

pub enum Mode {
    Test {
        filter: Option<String>,
        /// This guest's share of the test binaries when the suite runs in several guests at
        /// once (`cargo xtask vm test --shards N`); `None`: all of them.
        binaries: Option<Vec<String>>,
    },
    Shell,
    /// `cargo xtask vm bench`: run `xtask bench ARGS…` (one argument per line of `bench-args`)
    /// with the staged binaries, print the result files between markers, power off.
    Bench {
        args: Vec<String>,
    },
}

/// The host-built binaries to put into the guest.
pub struct Build {
    profile: String,
    agentosd: PathBuf,
    agentctl: PathBuf,
    /// (name, path) of each `vm-tests` integration test binary.
    tests: Vec<(String, PathBuf)>,
    /// (name, path) of the helper programs of `vm-tests` (memory hog, fork loop, …).
    helpers: Vec<(String, PathBuf)>,
}

impl Build {
    /// The names of the `vm-tests` test binaries (tests/NAME.rs) and of the host suites run in
    /// the guest.
    pub fn test_names(&self) -> Vec<String> {
        self.tests.iter().map(|(n, _)| n.clone()).collect()
    }

    /// Adds a program to the guest's harness `bin/` directory (GUEST_DIR/bin/NAME).
    pub fn add_helper(&mut self, name: &str, path: PathBuf) {
        self.helpers.push((name.to_string(), path));
    }
}

fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(workspace_root());
    c
}

/// Builds agentosd, agentctl, agentos-mcp and (with `tests`) the vm-tests suite for the host's x86-64 (the
/// guest's glibc is newer than the host's, so host binaries run there).
pub fn build(release: bool, tests: bool) -> Result<Build> {
    let profile = if release { "release" } else { "debug" };
    let mut c = cargo();
    c.args(crate::install::build_args(&["build"]));
    if release {
        c.arg("--release");
    }
    eprintln!("vm: building agentosd, agentctl, agentos-mcp ({profile})");
    host::run(&mut c)?;
    let bin_dir = super::target_dir().join(profile);
    let mut b = Build {
        profile: if release { "release" } else { "dev" }.to_string(),
        agentosd: bin_dir.join("agentosd"),
        agentctl: bin_dir.join("agentctl"),
        tests: Vec::new(),
        helpers: Vec::new(),
    };
    if !tests {
        return Ok(b);
    }
    eprintln!("vm: building the vm-tests suite ({profile})");
    let mut c = cargo();
    c.args([
        "test",
        "-p",
        "vm-tests",
        "--no-run",
        "--message-format=json-render-diagnostics",
    ]);
    if release {
        c.arg("--release");
    }
    let out = host::output(&mut c)?;
    for line in out.lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if msg["reason"] != "compiler-artifact" || msg["target"]["src_path"].is_null() {
            continue;
        }
        let Some(exe) = msg["executable"].as_str() else {
            continue;
        };
        let name = msg["target"]["name"].as_str().unwrap_or("test").to_string();
        let kinds = &msg["target"]["kind"];
        let is_kind = |k: &str| kinds.as_array().is_some_and(|a| a.iter().any(|v| v == k));
        if msg["profile"]["test"] == true {
            if is_kind("test") {
                b.tests.push((name, PathBuf::from(exe)));
            }
        } else if is_kind("bin") {
            b.helpers.push((name, PathBuf::from(exe)));
        }
    }
    if b.tests.is_empty() {
        bail!("cargo test -p vm-tests --no-run produced no test binary");
    }
    // Host suites that also run in the guest, where BPF LSM, the cgroup controllers and
    // systemd are real (each starts its own agentosd on a private bus; AGENTOS_TEST_AGENTOSD in
    // run-tests.sh points it at the installed binaries): the escape suite, and the egress-by-name
    // suite (whose connects the BPF LSM's socket_connect sees there too).
    for suite in HOST_SUITES {
        eprintln!("vm: building the host suite {suite} ({profile})");
        let mut c = cargo();
        c.args([
            "test",
            "-p",
            "agentosd",
            "--test",
            suite,
            "--no-run",
            "--message-format=json-render-diagnostics",
        ]);
        if release {
            c.arg("--release");
        }
        let out = host::output(&mut c)?;
        let exe = out
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == *suite)
            .find_map(|m| m["executable"].as_str().map(PathBuf::from))
            .with_context(|| {
                format!("cargo test -p agentosd --test {suite} --no-run produced no binary")
            })?;
        b.tests.push((suite.to_string(), exe));
    }
    b.tests.sort();
    b.helpers.sort();
    Ok(b)
}

/// Stages the payload in `run_dir/payload`, packs it, and returns the initramfs to boot:
/// the image's root file system, the `extra` archives (the examples' dependencies), then the
/// payload.
pub fn stage(
    b: &Build,
    image: &Image,
    extra: &[PathBuf],
    run_dir: &Path,
    mode: Mode,
) -> Result<PathBuf> {
    let root = run_dir.join("payload");
    if root.exists() {
        fs::remove_dir_all(&root).with_context(|| format!("removing {}", root.display()))?;
    }
    fs::create_dir_all(&root)?;
    install_agentos(b, &root, run_dir)?;

    let harness = root.join(GUEST_DIR.trim_start_matches('/'));
    fs::create_dir_all(harness.join("tests"))?;
    fs::create_dir_all(harness.join("bin"))?;
    for (name, path) in &b.tests {
        copy_stripped(path, &harness.join("tests").join(name))?;
    }
    for (name, path) in &b.helpers {
        copy_stripped(path, &harness.join("bin").join(name))?;
    }
    write_exec(&harness.join("install.sh"), INSTALL_SH)?;
    write_exec(&harness.join("run-tests.sh"), RUN_TESTS_SH)?;
    write_exec(&harness.join("run-bench.sh"), super::bench::RUN_BENCH_SH)?;

    let units = root.join("etc/systemd/system");
    let wants = units.join("multi-user.target.wants");
    fs::create_dir_all(&wants)?;
    match mode {
        Mode::Test { filter, binaries } => {
            fs::write(harness.join("filter"), filter.unwrap_or_default())?;
            if let Some(share) = binaries {
                fs::write(harness.join("binaries"), share.join("\n") + "\n")?;
            }
            fs::write(units.join("agentos-vmtest.service"), TEST_UNIT)?;
            std::os::unix::fs::symlink(
                "../agentos-vmtest.service",
                wants.join("agentos-vmtest.service"),
            )?;
        }
        Mode::Bench { args } => {
            fs::write(harness.join("bench-args"), super::bench::args_file(&args)?)?;
            fs::write(
                units.join("agentos-vmbench.service"),
                super::bench::BENCH_UNIT,
            )?;
            std::os::unix::fs::symlink(
                "../agentos-vmbench.service",
                wants.join("agentos-vmbench.service"),
            )?;
        }
        Mode::Shell => {
            fs::write(units.join("agentos-vminstall.service"), SHELL_UNIT)?;
            std::os::unix::fs::symlink(
                "../agentos-vminstall.service",
                wants.join("agentos-vminstall.service"),
            )?;
            // The guest has no udev, so serial-getty@ttyS0 would wait for a device unit that
            // never comes: a console unit of our own (serial-getty is masked on the cmdline).
            fs::write(units.join("agentos-console.service"), CONSOLE_UNIT)?;
            std::os::unix::fs::symlink(
                "../agentos-console.service",
                wants.join("agentos-console.service"),
            )?;
            let profile = root.join("etc/profile.d");
            fs::create_dir_all(&profile)?;
            fs::write(
                profile.join("agentos-vmtest.sh"),
                format!("export AGENTOS_VM_TEST=1 AGENTOS_VM_TEST_DIR={GUEST_DIR}\n"),
            )?;
        }
    }

    let payload = run_dir.join("payload.cpio");
    pack_cpio(&root, &payload)?;
    let initrd = run_dir.join("initrd.cpio");
    let mut out = fs::File::create(&initrd)?;
    for part in std::iter::once(&image.rootfs)
        .chain(extra)
        .chain(std::iter::once(&payload))
    {
        let mut f = fs::File::open(part).with_context(|| format!("opening {}", part.display()))?;
        std::io::copy(&mut f, &mut out)?;
    }
    Ok(initrd)
}

/// Installs agentosd, agentctl, the unit, D-Bus and sysusers/tmpfiles files below `root` (a
/// DESTDIR) with `cargo xtask install --prefix /usr/local --no-build` (the binaries stripped of
/// debug info first), then the example contracts.
fn install_agentos(b: &Build, root: &Path, run_dir: &Path) -> Result<()> {
    let bins = run_dir.join("bin");
    if bins.exists() {
        fs::remove_dir_all(&bins)?;
    }
    fs::create_dir_all(&bins)?;
    copy_stripped(&b.agentosd, &bins.join("agentosd"))?;
    copy_stripped(&b.agentctl, &bins.join("agentctl"))?;
    copy_stripped(
        &b.agentctl.with_file_name("agentos-mcp"),
        &bins.join("agentos-mcp"),
    )?;
    crate::install::run(crate::install::InstallArgs {
        prefix: PathBuf::from("/usr/local"),
        destdir: Some(root.to_path_buf()),
        no_build: true,
        profile: b.profile.clone(),
        bin_dir: Some(bins),
        unit_dir: None,
    })
    .context("cargo xtask install into the guest payload")?;
    Ok(())
}

/// Copies a binary without its debug info (the guest's root file system is in RAM).
fn copy_stripped(from: &Path, to: &Path) -> Result<()> {
    if !from.is_file() {
        bail!("{} was not built", from.display());
    }
    let status = Command::new("strip")
        .arg("--strip-debug")
        .arg("-o")
        .arg(to)
        .arg(from)
        .stderr(Stdio::null())
        .status();
    if !status.is_ok_and(|s| s.success()) {
        fs::copy(from, to).with_context(|| format!("copying {}", from.display()))?;
    }
    Ok(())
}

fn write_exec(path: &Path, text: &str) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::write(path, text)?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o755))?;
    Ok(())
}

/// Installs agentosd in the guest as a user would after `cargo xtask install`.
const INSTALL_SH: &str = r#"#!/bin/sh
# Install and start agentosd the way docs/install.md tells an operator to.
echo "== install agentosd: systemd-sysusers, systemd-tmpfiles, daemon-reload, start"
systemd-sysusers
systemd-tmpfiles --create
# QEMU's user network (xtask/src/vm/model.rs): the one device with a bus behind it, the guest's
# only way to the example model on the host (10.0.2.100:8080, forwarded by QEMU).
modprobe virtio_net
for n in /sys/class/net/*; do
  [ -e "$n/device" ] || continue
  ip link set "${n##*/}" up && ip addr add 10.0.2.15/24 dev "${n##*/}" && echo "== network: ${n##*/} 10.0.2.15/24"
  break
done
# The suite exercises the sched_ext scheduler scx_agentos: enable it as an operator would.
mkdir -p /etc/systemd/system/agentosd.service.d
printf '[Service]\nEnvironment=AGENTOSD_SCHED_EXT=1\n' > /etc/systemd/system/agentosd.service.d/sched-ext.conf
systemctl daemon-reload
systemctl reload dbus || true
if systemctl start agentosd; then
  echo "== agentosd: $(systemctl is-active agentosd)"
else
  echo "== systemctl start agentosd failed"
  systemctl --no-pager status agentosd
fi
"#;

/// Runs the suite, prints the result marker the host waits for, powers the guest off.
const RUN_TESTS_SH: &str = r#"#!/bin/sh
exec > /dev/ttyS0 2>&1
D=/usr/local/lib/agentos-vmtest
echo "VMTEST BEGIN uptime=$(cut -d' ' -f1 /proc/uptime)"
$D/install.sh
export AGENTOS_VM_TEST=1 AGENTOS_VM_TEST_DIR=$D RUST_BACKTRACE=0
export AGENTOS_TEST_AGENTOSD=/usr/local/bin/agentosd AGENTOS_TEST_AGENTCTL=/usr/local/bin/agentctl AGENTOS_TEST_MCP=/usr/local/bin/agentos-mcp
# In the guest every test can run: a skip is a failure.
export AGENTOS_TEST_NO_SKIP=1
# The escape suite's probe agents execute the suite's own binary: walkable for their uids.
chmod 0755 $D $D/tests
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
filter=$(cat $D/filter 2>/dev/null)
# `escape:NAME`: the escape suite alone, its attempts whose names contain NAME.
only=
case "$filter" in escape:*) only=escape; filter=${filter#escape:};; esac
# `binaries`: this guest's share when the host runs the suite in several guests at once.
share=$(cat $D/binaries 2>/dev/null)
rc=0
for t in $D/tests/*; do
  name=$(basename "$t")
  if [ -n "$share" ] && ! printf '%s\n' "$share" | grep -qx "$name"; then continue; fi
  if [ -n "$only" ] && [ "$name" != "$only" ]; then continue; fi
  # The escape suite takes attempt names as its filter: run it whole, or when named.
  if [ -z "$only" ] && [ "$name" = escape ] && [ -n "$filter" ] && [ "$filter" != escape ]; then continue; fi
  echo "== test binary $name"
  if [ -z "$filter" ] || [ "$filter" = "$name" ]; then
    # No filter, or the filter names this binary (tests/<name>.rs): all its tests.
    "$t" --include-ignored --test-threads=1
  else
    "$t" --include-ignored --test-threads=1 "$filter"
  fi
  r=$?
  if [ $r -ne 0 ]; then rc=$r; fi
done
if [ $rc -ne 0 ]; then
  echo "== systemctl status agentosd"
  systemctl --no-pager status agentosd
  echo "== journalctl -u agentosd (last 200 lines)"
  journalctl --no-pager -b -u agentosd -n 200
fi
echo "VMTEST RC=$rc uptime=$(cut -d' ' -f1 /proc/uptime)"
sync
echo o > /proc/sysrq-trigger
"#;

const TEST_UNIT: &str = "[Unit]
Description=agentos VM test suite
After=multi-user.target

[Service]
Type=oneshot
StandardInput=null
ExecStart=/usr/local/lib/agentos-vmtest/run-tests.sh

[Install]
WantedBy=multi-user.target
";

const SHELL_UNIT: &str = "[Unit]
Description=Install and start agentosd in the VM shell
After=multi-user.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/local/lib/agentos-vmtest/install.sh

[Install]
WantedBy=multi-user.target
";

const CONSOLE_UNIT: &str = "[Unit]
Description=Root shell on the serial console (cargo xtask vm shell)
After=systemd-user-sessions.service

[Service]
Type=idle
ExecStart=-/sbin/agetty --autologin root --noclear --keep-baud 115200,57600,38400,9600 - vt220
Restart=always
UtmpIdentifier=ttyS0
StandardInput=tty
StandardOutput=tty
TTYPath=/dev/ttyS0
TTYReset=yes
TTYVHangup=yes

[Install]
WantedBy=multi-user.target
";
