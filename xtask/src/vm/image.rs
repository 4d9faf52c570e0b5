//! `cargo xtask vm setup`: the guest image (kernel + Debian root file system as an initramfs).
//!
//! Everything comes from Debian's mirror through a private apt configuration in the cache
//! directory (the host's apt sources are used by nobody here and never changed):
//! debootstrap from trixie, the kernel from trixie-backports. The image lives in
//! `<cache>/image-<key>/`, where the key hashes every input of this recipe, so it is rebuilt only
//! when one of them changes.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};

use super::host;

/// Bump when the recipe below changes in a way the other inputs do not show.
const RECIPE_VERSION: u32 = 1;
const SUITE: &str = "trixie";
const DEFAULT_MIRROR: &str = "http://deb.debian.org/debian";
const KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";
/// The trixie-backports kernel: sched_ext, BPF LSM, cgroup v2 controllers.
const DEFAULT_KERNEL: &str = "7.3.4+deb13-amd64";
/// Packages debootstrap adds to the minimal base.
const GUEST_PACKAGES: &[&str] = &[
    "systemd",
    "systemd-sysv",
    "dbus",
    "util-linux",
    "kmod",
    "iproute2",
    "procps",
    // agentosd asks polkit where it runs (vm-tests/tests/polkit.rs); polkitd depends on the
    // virtual package default-logind, which debootstrap does not resolve: libpam-systemd
    // provides it.
    "libpam-systemd",
    "polkitd",
    // The example tools run as installed (vm-tests/tests/mcp.rs): text.wordcount and crypto.hmac
    // are Python scripts in /usr/lib/agentos/tools.
    "python3",
    // The files example tool is the published MCP filesystem server, a Node.js program
    // (examples/tools/files.yaml runs /usr/bin/node; vm-tests/tests/examples.rs).
    "nodejs",
    // agentosd's tests/sni.rs (run in the guest too) makes its test server's certificate with
    // `openssl req`.
    "openssl",
    // `cargo xtask vm bench -- sandbox` starts the same program under bwrap, a peer of agentosd's
    // sandbox (xtask/src/bench/sandbox.rs).
    "bubblewrap",
    // `cargo xtask vm bench -- hrt`: the kernel's floor, cyclicdeadline and cyclictest
    // (xtask/src/bench/hrt.rs).
    "rt-tests",
    // The disk quota test (agentosd/tests/quota.rs) makes its state file system with
    // `mkfs.ext4 -O quota`.
    "e2fsprogs",
];
/// Kernel modules copied (decompressed, with their dependencies) into the guest; `loop` gives
/// the io.max test a block device; `virtio_net` the guest's one link to the host, QEMU's user
/// network, over which the example model agent reaches the model server on the host's loopback
/// (vm-tests/tests/examples.rs); `ext4` and `quota_v2` (the format of ext4's quota files) the
/// disk quota test's loop-mounted state file system (agentosd/tests/quota.rs).
const MODULES: &[&str] = &["veth", "dummy", "loop", "virtio_net", "ext4", "quota_v2"];
/// Units that only cost boot time in a throwaway guest.
const MASKED_UNITS: &[&str] = &[
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "dpkg-db-backup.timer",
    "systemd-firstboot.service",
    "e2scrub_all.timer",
    "fstrim.timer",
    "proc-sys-fs-binfmt_misc.automount",
];

/// A built guest image.
pub struct Image {
    pub kernel: PathBuf,
    pub rootfs: PathBuf,
    pub kernel_version: String,
}

struct Inputs {
    mirror: String,
    kernel: String,
}

impl Inputs {
    fn from_env() -> Self {
        let var = |k: &str, d: &str| {
            std::env::var(k)
                .ok()
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| d.to_string())
        };
        Inputs {
            mirror: var("AGENTOS_VM_MIRROR", DEFAULT_MIRROR),
            kernel: var("AGENTOS_VM_KERNEL", DEFAULT_KERNEL),
        }
    }

    fn key(&self) -> String {
        let mut h = Sha256::new();
        let mut put = |s: &str| {
            h.update(s.as_bytes());
            h.update([0]);
        };
        put(&RECIPE_VERSION.to_string());
        put(SUITE);
        put(&self.mirror);
        put(&self.kernel);
        for list in [GUEST_PACKAGES, MODULES, MASKED_UNITS] {
            put(&list.join(","));
        }
        hex::encode(&h.finalize()[..8])
    }
}

/// Returns the cached image, building it first when it is missing, stale or `force` is set.
pub fn setup(cache: &Path, force: bool) -> Result<Image> {
    host::ensure_packages()?;
    let inputs = Inputs::from_env();
    let dir = cache.join(format!("image-{}", inputs.key()));
    let image = Image {
        kernel: dir.join("vmlinuz"),
        rootfs: dir.join("rootfs.cpio"),
        kernel_version: inputs.kernel.clone(),
    };
    if !force && dir.join("ready").is_file() && image.kernel.is_file() && image.rootfs.is_file() {
        eprintln!("vm: image up to date: {}", dir.display());
        return Ok(image);
    }
    if !host::is_root() {
        bail!("building the guest image needs root (debootstrap, chroot); run it as root");
    }
    let started = Instant::now();
    eprintln!(
        "vm: building the guest image (Debian {SUITE}, kernel {}) in {}",
        inputs.kernel,
        dir.display()
    );
    fs::create_dir_all(cache).with_context(|| format!("creating {}", cache.display()))?;
    let work = cache.join(format!("image-{}.tmp", inputs.key()));
    remove_tree(&work)?;
    fs::create_dir_all(&work)?;
    build(&inputs, &work).with_context(|| {
        format!(
            "building the guest image in {} (left there for inspection)",
            work.display()
        )
    })?;
    remove_tree(&dir)?;
    fs::rename(&work, &dir)?;
    fs::write(
        dir.join("ready"),
        format!(
            "suite {SUITE}\nkernel {}\nmirror {}\npackages {}\nbuilt in {:.0} s\n",
            inputs.kernel,
            inputs.mirror,
            GUEST_PACKAGES.join(","),
            started.elapsed().as_secs_f64()
        ),
    )?;
    prune_old(cache, &dir);
    eprintln!(
        "vm: image ready in {:.0} s: {}",
        started.elapsed().as_secs_f64(),
        dir.display()
    );
    Ok(image)
}

fn build(inputs: &Inputs, work: &Path) -> Result<()> {
    // 1. A private apt configuration: sources, lists, cache and status all under `work`.
    let apt = work.join("apt");
    for d in [
        "lists/partial",
        "cache/archives/partial",
        "etc/apt.conf.d",
        "etc/preferences.d",
    ] {
        fs::create_dir_all(apt.join(d))?;
    }
    fs::write(
        apt.join("etc/sources.list"),
        format!(
            "deb [signed-by={KEYRING}] {m} {SUITE} main\n\
             deb [signed-by={KEYRING}] {m} {SUITE}-backports main\n",
            m = inputs.mirror
        ),
    )?;
    let a = apt.display();
    let conf = apt.join("apt.conf");
    fs::write(
        &conf,
        format!(
            "Dir::Etc::SourceList \"{a}/etc/sources.list\";\n\
             Dir::Etc::SourceParts \"/dev/null\";\n\
             Dir::Etc::Parts \"{a}/etc/apt.conf.d\";\n\
             Dir::Etc::Preferences \"/dev/null\";\n\
             Dir::Etc::PreferencesParts \"{a}/etc/preferences.d\";\n\
             Dir::State::Lists \"{a}/lists\";\n\
             Dir::Cache \"{a}/cache\";\n\
             Dir::State::status \"/dev/null\";\n\
             APT::Architecture \"amd64\";\n\
             APT::Sandbox::User \"root\";\n\
             Acquire::Languages \"none\";\n\
             Acquire::Retries \"3\";\n"
        ),
    )?;
    let apt_get = || {
        let mut c = Command::new("apt-get");
        c.env("APT_CONFIG", &conf).arg("-q");
        c
    };
    eprintln!(
        "vm: apt-get update (private configuration {})",
        conf.display()
    );
    host::run(apt_get().arg("update"))?;

    // 2. debootstrap from trixie and the kernel packages from trixie-backports.
    let debs = work.join("debs");
    fs::create_dir_all(&debs)?;
    let k = &inputs.kernel;
    let kernel_pkgs = [
        format!("linux-base-{k}"),
        format!("linux-binary-{k}"),
        format!("linux-modules-{k}"),
    ];
    host::run(
        apt_get()
            .current_dir(&debs)
            .arg("download")
            .arg(format!("debootstrap/{SUITE}"))
            .args(&kernel_pkgs),
    )
    .with_context(|| {
        format!(
            "downloading the kernel {k}: if {SUITE}-backports has moved on, set \
             AGENTOS_VM_KERNEL to a version `apt-cache search linux-binary-` lists there"
        )
    })?;
    let deb = |prefix: &str| -> Result<PathBuf> {
        for e in fs::read_dir(&debs)? {
            let p = e?.path();
            let name = p.file_name().unwrap_or_default().to_string_lossy();
            if name.starts_with(prefix) && name.ends_with(".deb") {
                return Ok(p);
            }
        }
        bail!("{prefix}*.deb was not downloaded")
    };
    let tools = work.join("tools");
    host::run(
        Command::new("dpkg-deb")
            .arg("-x")
            .arg(deb("debootstrap_")?)
            .arg(&tools),
    )?;
    let kroot = work.join("kernel");
    for p in &kernel_pkgs {
        host::run(
            Command::new("dpkg-deb")
                .arg("-x")
                .arg(deb(&format!("{p}_"))?)
                .arg(&kroot),
        )?;
    }

    // 3. The root file system.
    let rootfs = work.join("rootfs");
    eprintln!(
        "vm: debootstrap {SUITE} (minbase + {})",
        GUEST_PACKAGES.join(",")
    );
    let t = Instant::now();
    let dlog = work.join("debootstrap.log");
    let result = host::run(
        Command::new(tools.join("usr/sbin/debootstrap"))
            .stdout(fs::File::create(&dlog)?)
            .env("DEBOOTSTRAP_DIR", tools.join("usr/share/debootstrap"))
            .arg("--variant=minbase")
            .arg(format!("--include={}", GUEST_PACKAGES.join(",")))
            .arg(format!("--keyring={KEYRING}"))
            .arg(SUITE)
            .arg(&rootfs)
            .arg(&inputs.mirror),
    );
    unmount_below(&rootfs);
    if let Err(e) = result {
        for log in [dlog, rootfs.join("debootstrap/debootstrap.log")] {
            let Ok(s) = fs::read_to_string(&log) else {
                continue;
            };
            let tail: Vec<&str> = s.lines().rev().take(30).collect();
            eprintln!("--- tail of {} ---", log.display());
            for l in tail.into_iter().rev() {
                eprintln!("{l}");
            }
        }
        return Err(e);
    }
    eprintln!("vm: debootstrap done in {:.0} s", t.elapsed().as_secs_f64());

    // 4. Kernel image and modules.
    let mods_src = kroot.join("usr/lib/modules").join(k);
    fs::copy(mods_src.join("vmlinuz"), work.join("vmlinuz")).context("copying vmlinuz")?;
    install_modules(&mods_src, &rootfs.join("usr/lib/modules").join(k))?;
    host::run(
        Command::new("chroot")
            .arg(&rootfs)
            .args(["/usr/sbin/depmod", "-a", k]),
    )?;

    // 5. Configure and trim.
    configure(&rootfs)?;

    // 6. Pack it as an uncompressed newc cpio (the kernel unpacks it into its root tmpfs).
    let t = Instant::now();
    pack_cpio(&rootfs, &work.join("rootfs.cpio"))?;
    eprintln!(
        "vm: rootfs.cpio ({} MB) in {:.1} s",
        fs::metadata(work.join("rootfs.cpio"))?.len() / 1_000_000,
        t.elapsed().as_secs_f64()
    );

    // Keep only what boots: vmlinuz, rootfs.cpio (and the apt lists, small, for inspection).
    for d in ["rootfs", "kernel", "debs", "tools"] {
        remove_tree(&work.join(d))?;
    }
    remove_tree(&apt.join("cache"))?;
    Ok(())
}

/// Copies the modules named in [`MODULES`] and those they depend on, decompressed, plus the
/// kernel's module metadata; `depmod` runs afterwards in the guest root.
fn install_modules(src: &Path, dst: &Path) -> Result<()> {
    fs::create_dir_all(dst)?;
    for f in [
        "modules.builtin",
        "modules.builtin.modinfo",
        "modules.order",
    ] {
        if src.join(f).is_file() {
            fs::copy(src.join(f), dst.join(f))?;
        }
    }
    let mut index = std::collections::HashMap::new();
    index_modules(&src.join("kernel"), src, &mut index)?;
    let mut todo: Vec<String> = MODULES.iter().map(|m| m.to_string()).collect();
    let mut done = std::collections::HashSet::new();
    while let Some(name) = todo.pop() {
        let key = name.replace('-', "_");
        if !done.insert(key.clone()) {
            continue;
        }
        let Some(rel) = index.get(&key) else {
            bail!("kernel module {name} is not in the modules package");
        };
        let rel: &PathBuf = rel;
        let from = src.join(rel);
        let rel_ko = rel.with_extension(""); // foo.ko.xz -> foo.ko
        let to = dst.join(&rel_ko);
        fs::create_dir_all(to.parent().unwrap_or(dst))?;
        let data = decompress(&from)?;
        todo.extend(depends(&data));
        fs::write(&to, &data)?;
    }
    Ok(())
}

fn index_modules(
    dir: &Path,
    base: &Path,
    index: &mut std::collections::HashMap<String, PathBuf>,
) -> Result<()> {
    for e in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let e = e?;
        let p = e.path();
        if e.file_type()?.is_dir() {
            index_modules(&p, base, index)?;
            continue;
        }
        let name = p.file_name().unwrap_or_default().to_string_lossy();
        if let Some(stem) = name.split(".ko").next().filter(|_| name.contains(".ko")) {
            let rel = p.strip_prefix(base).unwrap_or(&p).to_path_buf();
            index.insert(stem.replace('-', "_"), rel);
        }
    }
    Ok(())
}

fn decompress(path: &Path) -> Result<Vec<u8>> {
    let name = path.to_string_lossy();
    if name.ends_with(".ko") {
        return Ok(fs::read(path)?);
    }
    let prog = if name.ends_with(".xz") {
        "xz"
    } else if name.ends_with(".zst") {
        "zstd"
    } else {
        bail!("unknown module compression: {name}")
    };
    let out = Command::new(prog)
        .arg("-dc")
        .arg(path)
        .output()
        .with_context(|| format!("running {prog}"))?;
    if !out.status.success() {
        bail!("{prog} -dc {name} failed");
    }
    Ok(out.stdout)
}

/// The `depends=` entry of a module's .modinfo section.
fn depends(ko: &[u8]) -> Vec<String> {
    let needle = b"depends=";
    let mut i = 0;
    while let Some(pos) = ko[i..].windows(needle.len()).position(|w| w == needle) {
        let start = i + pos;
        if start == 0 || ko[start - 1] == 0 {
            let rest = &ko[start + needle.len()..];
            let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
            return String::from_utf8_lossy(&rest[..end])
                .split(',')
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect();
        }
        i = start + 1;
    }
    Vec::new()
}

fn configure(root: &Path) -> Result<()> {
    std::os::unix::fs::symlink("sbin/init", root.join("init")).context("linking /init")?;
    fs::write(root.join("etc/hostname"), "agentos-vm\n")?;
    fs::write(
        root.join("etc/hosts"),
        "127.0.0.1 localhost\n127.0.1.1 agentos-vm\n::1 localhost ip6-localhost ip6-loopback\n",
    )?;
    fs::write(
        root.join("etc/fstab"),
        "# the root file system is the initramfs\n",
    )?;
    // A fixed machine id: the guest is not on its "first boot" (no firstboot prompts).
    fs::write(
        root.join("etc/machine-id"),
        "a9e1f0c3d2b54c7e8f6a1b2c3d4e5f60\n",
    )?;
    host::run(
        Command::new("chroot")
            .arg(root)
            .args(["/usr/bin/passwd", "-d", "root"]),
    )?;
    let sys = root.join("etc/systemd/system");
    fs::create_dir_all(&sys)?;
    for unit in MASKED_UNITS {
        let link = sys.join(unit);
        let _ = fs::remove_file(&link);
        std::os::unix::fs::symlink("/dev/null", &link)?;
    }
    // The journal stays in memory and is forwarded to nothing: the tests print what they need.
    let jd = root.join("etc/systemd/journald.conf.d");
    fs::create_dir_all(&jd)?;
    fs::write(jd.join("agentos-vm.conf"), "[Journal]\nStorage=volatile\n")?;
    for d in [
        "usr/share/doc",
        "usr/share/man",
        "usr/share/info",
        "usr/share/locale",
        "usr/share/lintian",
        "usr/share/bug",
        "var/cache/apt",
        "var/lib/apt/lists",
        "var/cache/debconf",
    ] {
        let p = root.join(d);
        if p.is_dir() {
            for e in fs::read_dir(&p)? {
                let e = e?;
                if e.file_type()?.is_dir() {
                    fs::remove_dir_all(e.path())?;
                } else {
                    fs::remove_file(e.path())?;
                }
            }
        }
    }
    let _ = fs::remove_dir_all(root.join("debootstrap"));
    Ok(())
}

/// Packs a directory tree as an uncompressed newc cpio archive with the host's `cpio`.
pub fn pack_cpio(dir: &Path, out: &Path) -> Result<()> {
    let file = fs::File::create(out).with_context(|| format!("creating {}", out.display()))?;
    let mut find = Command::new("find")
        .arg(".")
        .arg("-print0")
        .current_dir(dir)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("running find")?;
    let list = find.stdout.take().context("find stdout")?;
    let status = Command::new("cpio")
        .args(["--null", "--create", "--format=newc", "--quiet"])
        .current_dir(dir)
        .stdin(list)
        .stdout(file)
        .status()
        .context("running cpio")?;
    let fstatus = find.wait()?;
    if !status.success() || !fstatus.success() {
        bail!("packing {} into {} failed", dir.display(), out.display());
    }
    Ok(())
}

/// Unmounts anything still mounted below `dir` (debootstrap's /proc, /sys, … after a failure).
fn unmount_below(dir: &Path) {
    let Ok(mounts) = fs::read_to_string("/proc/self/mounts") else {
        return;
    };
    let prefix = format!("{}/", dir.display());
    let mut points: Vec<&str> = mounts
        .lines()
        .filter_map(|l| l.split(' ').nth(1))
        .filter(|m| m.starts_with(&prefix))
        .collect();
    points.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for m in points {
        let _ = Command::new("umount").args(["-l", m]).status();
    }
}

/// Removes a directory tree, first unmounting anything below it so removal never walks into a
/// mounted /proc or /sys.
fn remove_tree(dir: &Path) -> Result<()> {
    if !dir.exists() {
        return Ok(());
    }
    unmount_below(dir);
    fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))
}

fn prune_old(cache: &Path, keep: &Path) {
    let Ok(entries) = fs::read_dir(cache) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if p != keep && name.starts_with("image-") && !name.ends_with(".tmp") {
            eprintln!("vm: removing the old image {}", p.display());
            let _ = remove_tree(&p);
        }
    }
}
