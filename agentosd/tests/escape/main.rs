//! The escape suite: hostile attempts, each run as its own agent under a real agentosd, each
//! asserting the specific errno the kernel returns, next to control actions that must still
//! work in the same sandbox (so the suite cannot pass by breaking everything).
//!
//! This binary is both the suite (`cargo test -p agentosd --test escape`) and the probe the
//! agents execute (`escape-… probe ATTEMPT ARGS…`). Root only; skips with a message otherwise.
//! Budget attempts (fork bomb, memory hog) need cgroup controllers: vm-tests/tests/escape.rs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod channels;
#[path = "../common/mod.rs"]
mod common;
mod deputy;
mod net;
mod probe;
mod unix;

use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Expect {
    /// The call must fail with this errno.
    Denied(&'static str),
    /// The call must succeed (a control).
    Allowed,
}
use Expect::*;

pub struct Attempt {
    pub name: &'static str,
    pub args: Vec<String>,
    pub expect: Expect,
    /// The contract's capabilities for this attempt's agent.
    pub caps: Caps,
}

impl Attempt {
    /// An attempt that must fail with errno `e`.
    pub fn denied(name: &'static str, args: Vec<String>, e: &'static str, caps: Caps) -> Self {
        Attempt {
            name,
            args,
            expect: Expect::Denied(e),
            caps,
        }
    }

    /// A control: the call must succeed.
    pub fn allowed(name: &'static str, args: Vec<String>, caps: Caps) -> Self {
        Attempt {
            name,
            args,
            expect: Expect::Allowed,
            caps,
        }
    }
}

/// Which capabilities an attempt's agent gets.
#[derive(Clone, Debug, PartialEq)]
pub enum Caps {
    /// The suite's standard grants (a readable and a writable directory, this binary as
    /// executable, one loopback port to connect to and one to bind).
    Standard,
    /// The standard filesystem grants and no network capability at all.
    NoNet,
    /// Exactly this `capabilities:` block (YAML lines after `capabilities:`; may be empty).
    Custom(String),
}

/// What every attempt module may use to build its attempts.
pub struct Ctx {
    /// This binary: the probe every agent runs.
    pub exe: PathBuf,
    /// A private directory (0711) for contracts and fixtures.
    pub dir: PathBuf,
    /// The daemon's state directory (agent homes under `home/<tenant>/<name>`, logs under
    /// `logs/<tenant>/<name>.log`).
    pub state: PathBuf,
    /// The standard filesystem capability lines (see [`Caps::Standard`]).
    pub fs_caps: String,
    /// The standard network capability lines.
    pub net_caps: String,
    /// The test cgroup the daemon runs agents under (`agents/<tenant>/<name>` below it).
    pub cgroup: PathBuf,
    pub daemon_pid: u32,
}

impl Ctx {
    /// Write the contract of agent `escape/<name>`, which runs `probe <attempt> <args…>` with
    /// `caps`, and return its path.
    pub fn contract(&self, name: &str, attempt: &str, args: &[String], caps: &Caps) -> PathBuf {
        let mut a = vec!["probe".to_string(), attempt.to_string()];
        a.extend(args.iter().cloned());
        let a: Vec<String> = a.iter().map(|s| format!("{s:?}")).collect();
        let block = match caps {
            Caps::Standard => format!("{}{}", self.fs_caps, self.net_caps),
            Caps::NoNet => self.fs_caps.clone(),
            Caps::Custom(c) => c.clone(),
        };
        let caps = if block.trim().is_empty() {
            "capabilities: []\n".to_string()
        } else {
            format!("capabilities:\n{block}")
        };
        let text = format!(
            "apiVersion: agentos/v0.2\nkind: AgentContract\nname: {name}\ntenant: escape\nexec: {{ command: {:?}, args: [{}] }}\n{caps}restart: \"no\"\n",
            self.exe.display().to_string(),
            a.join(", ")
        );
        let p = self.dir.join(format!("{name}.yaml"));
        std::fs::write(&p, text).unwrap();
        p
    }

    /// The agent's log (where the probe's result line appears).
    pub fn log(&self, name: &str) -> PathBuf {
        self.state.join(format!("logs/escape/{name}.log"))
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("probe") {
        probe::run(&args[2..]);
        return;
    }
    // `cargo test` passes harness flags; a bare word filters attempts by name.
    let filter: Option<String> = args[1..].iter().find(|a| !a.starts_with('-')).cloned();
    if args.iter().any(|a| a == "--list") {
        return;
    }
    if let Some(why) = common::skip_reason() {
        common::skip("escape", &why);
        return;
    }
    if agentosd::sandbox::landlock::kernel_abi().is_none() {
        common::skip("escape", "kernel without Landlock");
        return;
    }
    std::process::exit(suite(filter.as_deref()));
}

fn wait_line(log: &Path, secs: u64) -> Option<serde_json::Value> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if let Some(l) = text.lines().find(|l| l.starts_with("{\"attempt\"")) {
            return serde_json::from_str(l).ok();
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

/// One rule taken out of an otherwise complete sandbox, and the attempt that must then get
/// through (so its test fails): proof that the suite tests that rule.
struct Mutation {
    rule: &'static str,
    attempt: &'static str,
    weaken: Weaken,
    /// The errno the intact run gets when it differs from the attempt's through the daemon:
    /// these direct runs are outside the daemon's BPF LSM programs (where they load, the VM).
    intact: Option<&'static str>,
}

enum Weaken {
    /// Compile the seccomp policy without this syscall's rules.
    Seccomp(&'static str),
    /// Change the Landlock plan before the ruleset is built.
    Landlock(fn(&mut agentosd::sandbox::landlock::Plan)),
    /// Change the socket rules' shape the contract gives (seccomp.rs `NetShape`).
    SeccompNet(fn(&mut agentosd::sandbox::seccomp::NetShape)),
    /// Change the agent's own namespaces (sandbox `Namespaces`, clone3 flags in spawn.rs).
    Namespaces(fn(&mut agentosd::sandbox::Namespaces)),
    /// Change the Landlock plan and run the agent in the host's network namespace: for rules
    /// the agent's own namespace also holds (Landlock's abstract-socket scoping).
    LandlockInHostNet(fn(&mut agentosd::sandbox::landlock::Plan)),
}

const MUTATIONS: &[Mutation] = &[
    Mutation {
        rule: "seccomp ptrace",
        attempt: "ptrace-traceme",
        weaken: Weaken::Seccomp("ptrace"),
        intact: None,
    },
    Mutation {
        rule: "seccomp keyctl",
        attempt: "keyctl",
        weaken: Weaken::Seccomp("keyctl"),
        intact: None,
    },
    Mutation {
        rule: "seccomp io_uring_setup",
        attempt: "io-uring-setup",
        weaken: Weaken::Seccomp("io_uring_setup"),
        intact: None,
    },
    Mutation {
        rule: "seccomp unshare(CLONE_NEWUSER)",
        attempt: "userns-unshare",
        weaken: Weaken::Seccomp("unshare"),
        intact: None,
    },
    Mutation {
        rule: "landlock: /tmp not writable",
        attempt: "write-tmp",
        weaken: Weaken::Landlock(|p| p.read_write.push("/tmp".into())),
        intact: None,
    },
    Mutation {
        rule: "landlock: execute only where granted",
        attempt: "exec-ungranted",
        weaken: Weaken::Landlock(|p| p.read_exec.push("/".into())),
        intact: None,
    },
    Mutation {
        rule: "landlock: abstract-socket scoping",
        attempt: "abstract-socket",
        weaken: Weaken::LandlockInHostNet(|p| p.unscoped = true),
        intact: None,
    },
    Mutation {
        rule: "landlock: TCP connect only to granted ports",
        attempt: "connect-ungranted",
        weaken: Weaken::Landlock(|p| p.connect = None),
        intact: None,
    },
    Mutation {
        rule: "seccomp: inet sockets only with a net grant",
        attempt: "nonet-udp4-sendto",
        weaken: Weaken::SeccompNet(|s| s.inet = true),
        intact: None,
    },
    Mutation {
        rule: "seccomp: listen() only with net.bind",
        attempt: "nonet-listen-unix",
        weaken: Weaken::SeccompNet(|s| s.listen = true),
        intact: None,
    },
    Mutation {
        rule: "seccomp: inet sockets TCP and UDP only",
        attempt: "mptcp-socket",
        weaken: Weaken::SeccompNet(|s| s.any_inet_protocol = true),
        intact: None,
    },
    Mutation {
        rule: "seccomp: socket families unix/inet/netlink only",
        attempt: "other-families",
        weaken: Weaken::SeccompNet(|s| s.any_family = true),
        intact: None,
    },
    Mutation {
        rule: "seccomp: memfd_create only with MFD_NOEXEC_SEAL",
        attempt: "memfd-exec-proc-fd",
        weaken: Weaken::Seccomp("memfd_create"),
        intact: None,
    },
    Mutation {
        rule: "seccomp: memfd_create without MFD_EXEC",
        attempt: "memfd-mfd-exec",
        weaken: Weaken::Seccomp("memfd_create"),
        intact: None,
    },
    Mutation {
        rule: "seccomp: inotify_init1 (ENOSYS)",
        attempt: "inotify-etc",
        weaken: Weaken::Seccomp("inotify_init1"),
        intact: None,
    },
    Mutation {
        rule: "own IPC namespace (CLONE_NEWIPC)",
        attempt: "sysv-shm-host",
        weaken: Weaken::Namespaces(|n| n.ipc = false),
        intact: None,
    },
    Mutation {
        rule: "own network namespace without net grants",
        // Not abstract-squat-nonet: where BPF LSM's socket_bind loads (the VM), the daemon's
        // agents get EPERM there, but these direct runs are outside the daemon's programs.
        attempt: "abstract-connect-nonet",
        weaken: Weaken::Namespaces(|n| n.net = false),
        intact: None,
    },
    Mutation {
        rule: "own network namespace with net grants (the socket broker)",
        attempt: "abstract-squat-with-net",
        weaken: Weaken::Namespaces(|n| n.net = false),
        intact: Some("EAGAIN"),
    },
];

/// Run one attempt in the agent sandbox its contract `file` describes, built with the daemon's
/// own `sandbox::prepare` and started with its `spawn` (clone3 into a fresh cgroup), weakened by
/// `m` when given; returns the probe's result line.
fn run_direct(
    cg_root: &Path,
    dir: &Path,
    file: &Path,
    m: Option<&Mutation>,
) -> Option<serde_json::Value> {
    use agentosd::sandbox;
    let text = std::fs::read_to_string(file).unwrap();
    let c = contracts::parse_contract(&text, &file.display().to_string()).unwrap();
    let name = c.name().to_string();
    let state = dir.join("mutation-state");
    let mut sb = sandbox::prepare(&state, "mutation", &name, Some(&c)).unwrap();
    match m.map(|m| &m.weaken) {
        Some(Weaken::Seccomp(sys)) => {
            sb.seccomp = sandbox::seccomp::compile_without(&[sys]).unwrap();
        }
        Some(Weaken::SeccompNet(f)) => {
            let g = sandbox::Grants::from_contract(&c, &sb.home);
            let mut shape = sandbox::seccomp::NetShape::for_grants(
                !g.net_connect.is_empty(),
                !g.net_bind.is_empty(),
            );
            f(&mut shape);
            sb.seccomp = sandbox::seccomp::compile(shape).unwrap();
        }
        Some(Weaken::Landlock(f) | Weaken::LandlockInHostNet(f)) => {
            if matches!(m.map(|m| &m.weaken), Some(Weaken::LandlockInHostNet(_))) {
                sb.namespaces.net = false;
            }
            let mut plan = sandbox::Grants::from_contract(&c, &sb.home)
                .plan(&sb.home)
                .unwrap();
            f(&mut plan);
            sb.landlock = sandbox::landlock::build(&plan, false).unwrap();
        }
        Some(Weaken::Namespaces(f)) => f(&mut sb.namespaces),
        None => {}
    }
    let exec = c.exec().unwrap();
    let tag = if m.is_some() { "weak" } else { "intact" };
    let cg = agentosd::cgroup::Cgroup::new(cg_root.join(format!("{name}-{tag}")));
    cg.create().unwrap();
    let log = dir.join(format!("{name}-{tag}.log"));
    let mut env = sb.env();
    env.push(("PATH".into(), "/usr/bin:/bin".into()));
    let cmd = agentosd::spawn::Command {
        program: exec.command.clone().into(),
        args: exec.args.clone(),
        env,
        cwd: "/".into(),
        log_file: log.clone(),
        err_file: None,
        sandbox: Some(sb),
        sched: Default::default(),
        inherit_fd: None,
    };
    let child = agentosd::spawn::spawn(&cmd, &cg.open_dir().unwrap()).unwrap();
    let mut status = 0;
    // SAFETY: waiting for the child we just started; `status` is writable.
    unsafe { libc::waitpid(child.pid as libc::pid_t, &mut status, 0) };
    if let Some(b) = &child.broker {
        // The broker ends once the agent is reaped (its listener hangs up).
        // SAFETY: as above, our child.
        unsafe { libc::waitpid(b.pid as libc::pid_t, &mut status, 0) };
    }
    let _ = cg.remove();
    wait_line(&log, 5)
}

fn suite(filter: Option<&str>) -> i32 {
    let exe = std::env::current_exe().unwrap();
    let exe_s = exe.display().to_string();
    let cg = common::TestCgroup::new("escape");
    let bus = common::Bus::start();
    let dir = tempfile::tempdir().unwrap();
    // The agents' uids must be able to walk to their state directories.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let state = dir.path().join("state");
    let mut d = common::Daemon::start(&bus, &cg.path, &state);

    // Granted paths: one readable, one writable; a world-writable /tmp is NOT granted.
    let grant = tempfile::Builder::new()
        .prefix("agentos-escape-grant")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(grant.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(grant.path().join("data"), "granted data\n").unwrap();
    std::fs::set_permissions(
        grant.path().join("data"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let wgrant = tempfile::Builder::new()
        .prefix("agentos-escape-wgrant")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(wgrant.path(), std::fs::Permissions::from_mode(0o777)).unwrap();

    // Loopback listeners: one granted, one not; and a free port to bind.
    let granted = TcpListener::bind("127.0.0.1:0").unwrap();
    let ungranted = TcpListener::bind("127.0.0.1:0").unwrap();
    let gport = granted.local_addr().unwrap().port();
    let uport = ungranted.local_addr().unwrap().port();
    let free = |_: ()| {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    // An abstract Unix socket of the host (outside every agent's Landlock domain).
    let abstract_name = format!("agentos-escape-{}", std::process::id());
    let abstract_listener = {
        use std::os::linux::net::SocketAddrExt;
        let a =
            std::os::unix::net::SocketAddr::from_abstract_name(abstract_name.as_bytes()).unwrap();
        std::os::unix::net::UnixListener::bind_addr(&a).unwrap()
    };
    let bind_ok = free(());
    let bind_no = free(());

    let fs_caps = format!(
        "  - fs.read: [{}]\n  - fs.write: [{}]\n  - fs.exec: [{}]\n",
        grant.path().display(),
        wgrant.path().display(),
        exe_s
    );
    let net_caps = format!(
        "  - net.connect: [\"127.0.0.1:{gport}\"]\n  - net.bind: [\"127.0.0.1:{bind_ok}\"]\n"
    );
    let ctx = Ctx {
        exe: exe.clone(),
        dir: dir.path().to_path_buf(),
        state: state.clone(),
        fs_caps,
        net_caps,
        cgroup: cg.path.clone(),
        daemon_pid: d.pid(),
    };
    let contract = |name: &str, attempt: &str, args: &[String], caps: &Caps| {
        ctx.contract(name, attempt, args, caps)
    };

    // A victim agent to attack: another agent with a secret in its state directory.
    let vf = contract("victim", "sleep", &[], &Caps::Standard);
    d.ctl_ok(&["start", vf.to_str().unwrap()]);
    let vst = d.wait_state("escape/victim", "running", 10);
    let victim_pid = vst["main_pid"].as_u64().unwrap().to_string();
    let victim_home = state.join("home/escape/victim");
    let secret = victim_home.join("secret");
    std::fs::write(&secret, "victim's secret\n").unwrap();
    let victim_uid = std::fs::metadata(&victim_home)
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
        .unwrap();
    std::os::unix::fs::chown(&secret, Some(victim_uid), Some(victim_uid)).unwrap();
    let victim_procs = cg.path.join("agents/escape/victim/cgroup.procs");
    let daemon_pid = d.pid().to_string();
    let block = std::fs::read_dir("/sys/block")
        .ok()
        .and_then(|mut r| r.next())
        .and_then(|e| e.ok())
        .map(|e| format!("/dev/{}", e.file_name().to_string_lossy()))
        .filter(|p| Path::new(p).exists());

    let s = |v: &str| vec![v.to_string()];
    // An executable outside every exec grant (agentctl itself is under /usr in the VM, which
    // every agent may execute): a copy of /bin/true in the suite's own directory.
    let ungranted_exe = dir.path().join("ungranted-bin/true");
    std::fs::create_dir_all(ungranted_exe.parent().unwrap()).unwrap();
    std::fs::copy("/bin/true", &ungranted_exe).unwrap();
    std::fs::set_permissions(
        ungranted_exe.parent().unwrap(),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    std::fs::set_permissions(&ungranted_exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    // Where `write-tmp` tries to create a file: it must not exist after the attempts.
    let tmp_target = PathBuf::from(format!(
        "/tmp/agentos-escape-{}-write-tmp",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&tmp_target);
    let mut attempts = vec![
        // filesystem
        Attempt {
            name: "read-shadow",
            args: vec![],
            expect: Denied("EACCES"),
            caps: Caps::Standard,
        },
        Attempt {
            name: "read-other-home",
            args: s(&secret.display().to_string()),
            expect: Denied("EACCES"),
            caps: Caps::Standard,
        },
        Attempt {
            name: "list-other-home",
            args: s(&victim_home.display().to_string()),
            expect: Denied("EACCES"),
            caps: Caps::Standard,
        },
        Attempt {
            name: "read-home-root",
            args: vec![],
            expect: Denied("EACCES"),
            caps: Caps::Standard,
        },
        Attempt {
            name: "write-tmp",
            args: s(&tmp_target.display().to_string()),
            expect: Denied("EACCES"),
            caps: Caps::Standard,
        },
        Attempt {
            name: "write-etc",
            args: vec![],
            expect: Denied("EACCES"),
            caps: Caps::Standard,
        },
        Attempt {
            name: "write-daemon-state",
            args: s(&state.join("uids.json").display().to_string()),
            expect: Denied("EACCES"),
            caps: Caps::Standard,
        },
        Attempt {
            name: "write-readonly-grant",
            args: s(&grant.path().display().to_string()),
            expect: Denied("EACCES"),
            caps: Caps::Standard,
        },
        Attempt {
            name: "dev-kmsg-write",
            args: vec![],
            expect: Denied("EACCES"),
            caps: Caps::Standard,
        },
        Attempt {
            name: "proc-sys-write",
            args: vec![],
            expect: Denied("EACCES"),
            caps: Caps::Standard,
        },
        Attempt {
            name: "daemon-environ",
            args: s(&daemon_pid),
            expect: Denied("EACCES"),
            caps: Caps::Standard,
        },
        Attempt {
            name: "cgroup-escape",
            args: s(&victim_procs.display().to_string()),
            expect: Denied("EACCES"),
            caps: Caps::Standard,
        },
        // exec
        Attempt {
            name: "exec-ungranted",
            args: s(&ungranted_exe.display().to_string()),
            expect: Denied("EACCES"),
            caps: Caps::Standard,
        },
        Attempt {
            name: "exec-from-home",
            args: vec![],
            expect: Denied("EACCES"),
            caps: Caps::Standard,
        },
        // network
        Attempt {
            name: "connect-ungranted",
            args: s(&uport.to_string()),
            expect: Denied("EACCES"),
            caps: Caps::Standard,
        },
        Attempt {
            name: "bind-ungranted",
            args: s(&bind_no.to_string()),
            expect: Denied("EACCES"),
            caps: Caps::Standard,
        },
        Attempt {
            name: "abstract-socket",
            args: s(&abstract_name),
            // Its own network namespace: the host's name is not there. Behind it, Landlock's
            // scoping refuses with EPERM (the mutation check runs it in the host's).
            expect: Denied("ECONNREFUSED"),
            caps: Caps::Standard,
        },
        // seccomp's socket rules (net.rs has the rest of the class)
        Attempt {
            name: "raw-socket",
            args: vec![],
            expect: Denied("EPROTONOSUPPORT"),
            caps: Caps::Standard,
        },
        Attempt {
            name: "packet-socket",
            args: vec![],
            expect: Denied("EAFNOSUPPORT"),
            caps: Caps::Standard,
        },
        // processes
        Attempt {
            name: "ptrace-daemon",
            args: s(&daemon_pid),
            expect: Denied("EPERM"),
            caps: Caps::Standard,
        },
        Attempt {
            name: "ptrace-other-agent",
            args: s(&victim_pid),
            expect: Denied("EPERM"),
            caps: Caps::Standard,
        },
        Attempt {
            name: "ptrace-traceme",
            args: vec![],
            expect: Denied("EPERM"),
            caps: Caps::Standard,
        },
        Attempt {
            name: "process-vm-read",
            args: s(&victim_pid),
            expect: Denied("EPERM"),
            caps: Caps::Standard,
        },
        Attempt {
            name: "signal-daemon",
            args: s(&daemon_pid),
            expect: Denied("EPERM"),
            caps: Caps::Standard,
        },
        Attempt {
            name: "signal-other-agent",
            args: s(&victim_pid),
            expect: Denied("EPERM"),
            caps: Caps::Standard,
        },
        Attempt {
            name: "setuid-root",
            args: vec![],
            expect: Denied("EPERM"),
            caps: Caps::Standard,
        },
        Attempt {
            name: "setgid-root",
            args: vec![],
            expect: Denied("EPERM"),
            caps: Caps::Standard,
        },
        Attempt {
            name: "sched-fifo",
            args: vec![],
            expect: Denied("EPERM"),
            caps: Caps::Standard,
        },
        Attempt {
            name: "nice-raise",
            args: vec![],
            expect: Denied("EACCES"),
            caps: Caps::Standard,
        },
        // kernel interfaces
        Attempt {
            name: "mount-tmpfs",
            args: vec![],
            expect: Denied("EPERM"),
            caps: Caps::Standard,
        },
        Attempt {
            name: "chroot",
            args: vec![],
            expect: Denied("EPERM"),
            caps: Caps::Standard,
        },
        Attempt {
            name: "userns-unshare",
            args: vec![],
            expect: Denied("EPERM"),
            caps: Caps::Standard,
        },
        Attempt {
            name: "userns-clone",
            args: vec![],
            expect: Denied("EPERM"),
            caps: Caps::Standard,
        },
        Attempt {
            name: "clone3",
            args: vec![],
            expect: Denied("ENOSYS"),
            caps: Caps::Standard,
        },
        Attempt {
            name: "bpf-prog-load",
            args: vec![],
            expect: Denied("EPERM"),
            caps: Caps::Standard,
        },
        Attempt {
            name: "perf-event-open",
            args: vec![],
            expect: Denied("EPERM"),
            caps: Caps::Standard,
        },
        Attempt {
            name: "keyctl",
            args: vec![],
            expect: Denied("EPERM"),
            caps: Caps::Standard,
        },
        Attempt {
            name: "kexec-load",
            args: vec![],
            expect: Denied("EPERM"),
            caps: Caps::Standard,
        },
        Attempt {
            name: "init-module",
            args: vec![],
            expect: Denied("EPERM"),
            caps: Caps::Standard,
        },
        Attempt {
            name: "clock-settime",
            args: vec![],
            expect: Denied("EPERM"),
            caps: Caps::Standard,
        },
        Attempt {
            name: "io-uring-setup",
            args: vec![],
            expect: Denied("EPERM"),
            caps: Caps::Standard,
        },
        Attempt {
            name: "x32-syscall",
            args: vec![],
            expect: Denied("ENOSYS"),
            caps: Caps::Standard,
        },
        // controls: the same sandbox still lets the agent do its job
        Attempt {
            name: "identity",
            args: vec![],
            expect: Allowed,
            caps: Caps::Standard,
        },
        Attempt {
            name: "open-fds",
            args: vec![],
            expect: Allowed,
            caps: Caps::Standard,
        },
        Attempt {
            name: "read-granted",
            args: s(&grant.path().join("data").display().to_string()),
            expect: Allowed,
            caps: Caps::Standard,
        },
        Attempt {
            name: "read-passwd",
            args: vec![],
            expect: Allowed,
            caps: Caps::Standard,
        },
        Attempt {
            name: "write-home",
            args: vec![],
            expect: Allowed,
            caps: Caps::Standard,
        },
        Attempt {
            name: "write-tmpdir",
            args: vec![],
            expect: Allowed,
            caps: Caps::Standard,
        },
        Attempt {
            name: "write-granted",
            args: s(&wgrant.path().display().to_string()),
            expect: Allowed,
            caps: Caps::Standard,
        },
        Attempt {
            name: "exec-granted",
            args: vec![],
            expect: Allowed,
            caps: Caps::Standard,
        },
        Attempt {
            name: "connect-granted",
            args: s(&gport.to_string()),
            expect: Allowed,
            caps: Caps::Standard,
        },
        Attempt {
            name: "bind-granted",
            args: s(&bind_ok.to_string()),
            expect: Allowed,
            caps: Caps::Standard,
        },
        Attempt {
            name: "fork-and-signal-own-child",
            args: vec![],
            expect: Allowed,
            caps: Caps::Standard,
        },
    ];
    if let Some(m) = ["/dev/mem", "/dev/kmem", "/dev/port"]
        .into_iter()
        .find(|p| Path::new(p).exists())
    {
        attempts.push(Attempt {
            name: "dev-mem",
            args: s(m),
            expect: Denied("EACCES"),
            caps: Caps::Standard,
        });
    } else {
        println!("skip dev-mem: no /dev/mem, /dev/kmem or /dev/port on this host");
    }
    if let Some(b) = block {
        attempts.push(Attempt {
            name: "block-device",
            args: s(&b),
            expect: Denied("EACCES"),
            caps: Caps::Standard,
        });
    }
    // Attempts of the other classes, each in its own module; `_fixtures` keeps their listeners
    // and files alive until the suite ends.
    let mut _fixtures: Vec<Box<dyn std::any::Any>> = Vec::new();
    for (more, fixture) in [
        net::attempts(&ctx),
        channels::attempts(&ctx),
        unix::attempts(&ctx),
    ] {
        attempts.extend(more);
        _fixtures.push(fixture);
    }
    if let Some(f) = filter {
        attempts.retain(|a| a.name.contains(f));
    }
    let names: std::collections::BTreeSet<&str> = attempts.iter().map(|a| a.name).collect();
    assert_eq!(names.len(), attempts.len(), "two attempts share a name");

    let mut failures = Vec::new();
    let mut denied = 0;
    for a in &attempts {
        let f = contract(&format!("esc-{}", a.name), a.name, &a.args, &a.caps);
        let out = d.ctl(&["start", f.to_str().unwrap()]);
        if !out.status.success() {
            failures.push(format!(
                "{}: agent did not start: {}",
                a.name,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
            continue;
        }
        let log = state.join(format!("logs/escape/esc-{}.log", a.name));
        let Some(v) = wait_line(&log, 15) else {
            failures.push(format!(
                "{}: no result line; agent log:\n{}",
                a.name,
                std::fs::read_to_string(&log).unwrap_or_default()
            ));
            continue;
        };
        let got_ok = v["ok"].as_bool().unwrap_or(false);
        let got_errno = v["errno"].as_str().unwrap_or("").to_string();
        let pass = match a.expect {
            Denied(e) => !got_ok && got_errno == e,
            Allowed => got_ok,
        };
        if a.name == "identity" {
            let detail = v["detail"].as_str().unwrap_or("");
            let checks = [
                "capeff=0000000000000000",
                "capprm=0000000000000000",
                "capbnd=0000000000000000",
                "capamb=0000000000000000",
                "nnp=1",
                "seccomp=2",
            ];
            let uid_ok = detail
                .strip_prefix("uid=")
                .and_then(|r| r.split_whitespace().next())
                .and_then(|u| u.parse::<u32>().ok())
                .is_some_and(|u| agentosd::sandbox::identity::range().contains(u));
            if !uid_ok || checks.iter().any(|c| !detail.contains(c)) {
                failures.push(format!("identity: unexpected {detail}"));
                continue;
            }
        }
        if a.name == "open-fds" {
            // Only stdin (/dev/null), stdout/stderr (its log) and, when the daemon serves
            // tools, its MCP socket at the number AGENTOS_SOCKET_FD names: nothing else of
            // the daemon's.
            let detail = v["detail"].as_str().unwrap_or("");
            let (list, sock) = detail
                .trim_start_matches("fds=")
                .split_once(";socket_fd=")
                .unwrap_or((detail, ""));
            let mut fds: Vec<&str> = list.split(',').collect();
            if !sock.is_empty() {
                let want = format!("{sock}:socket:");
                let before = fds.len();
                fds.retain(|f| !f.starts_with(&want));
                if before != fds.len() + 1 {
                    fds.push("<AGENTOS_SOCKET_FD is not an inherited socket>");
                }
            }
            let ok = fds.len() == 3
                && fds[0] == "0:/dev/null"
                && fds[1].starts_with("1:")
                && fds[1].ends_with(".log")
                && fds[2].starts_with("2:")
                && fds[2].ends_with(".log");
            if !ok {
                failures.push(format!(
                    "open-fds: the agent holds more than stdio: {detail}"
                ));
                continue;
            }
        }
        if matches!(a.expect, Denied(_)) && pass {
            denied += 1;
        }
        let line = format!(
            "{:<28} expect {:<16} got {}",
            a.name,
            match a.expect {
                Denied(e) => e.to_string(),
                Allowed => "success".into(),
            },
            if got_ok {
                format!("success ({})", v["detail"].as_str().unwrap_or(""))
            } else {
                got_errno.clone()
            }
        );
        println!("{} {line}", if pass { "ok  " } else { "FAIL" });
        if !pass {
            failures.push(line);
        }
    }
    // The one file a refused `write-tmp` would have made (the weakened mutation run below
    // makes it on purpose, so look now).
    if tmp_target.exists() {
        failures.push(format!(
            "write-tmp: {} exists after the attempt",
            tmp_target.display()
        ));
    }
    // Refusals no errno shows are on the record (dropped datagrams, BPF LSM socket hooks).
    if filter.is_none() {
        failures.extend(net::records_check(&ctx));
    }
    // The confused-deputy attempts: links planted for the root daemon, then restarts.
    let (n_deputy, deputy_failures) = deputy::run(&ctx, &mut d, filter);
    failures.extend(deputy_failures);
    // The pathname Unix socket attempts under the BPF LSM fence alone (--no-landlock-unix).
    let (n_unix_bpf, unix_bpf_failures) = unix::bpf_alone(&ctx, &mut d, filter);
    failures.extend(unix_bpf_failures);
    // Mutation check: the suite must notice a sandbox with one rule taken out.
    if filter.is_none() {
        let find = |n: &str| attempts.iter().find(|a| a.name == n);
        for m in MUTATIONS {
            let Some(a) = find(m.attempt) else {
                failures.push(format!("mutation {}: no attempt {}", m.rule, m.attempt));
                continue;
            };
            let f = contract(&format!("mut-{}", a.name), a.name, &a.args, &a.caps);
            let intact = run_direct(&cg.path, dir.path(), &f, None);
            let weak = run_direct(&cg.path, dir.path(), &f, Some(m));
            let verdict = |v: &Option<serde_json::Value>| {
                v.as_ref().is_some_and(|v| match (m.intact, a.expect) {
                    (Some(e), _) | (None, Denied(e)) => v["ok"] == false && v["errno"] == e,
                    (None, Allowed) => v["ok"] == true,
                })
            };
            let (i, w) = (verdict(&intact), verdict(&weak));
            let line = format!(
                "mutation: without {:<46} {:<18} intact {} / weakened {}",
                m.rule,
                a.name,
                if i { "pass" } else { "FAIL" },
                if w {
                    "pass (NOT DETECTED)"
                } else {
                    "fails (detected)"
                }
            );
            println!("{} {line}", if i && !w { "ok  " } else { "FAIL" });
            if !i || w {
                failures.push(format!(
                    "{line}\n  intact: {intact:?}\n  weakened: {weak:?}"
                ));
            }
        }
    }
    // The victim is untouched.
    assert!(
        common::alive(victim_pid.parse().unwrap()),
        "victim agent died"
    );
    let _ = std::fs::remove_file(&tmp_target);
    let _ = d.ctl(&["stop", "escape/victim"]);
    drop(granted);
    drop(abstract_listener);
    drop(ungranted);
    let _: PathBuf = exe;
    println!(
        "escape suite: {} attempts, {denied} denied as expected, {} failures",
        attempts.len() + n_deputy + n_unix_bpf,
        failures.len()
    );
    if failures.is_empty() {
        0
    } else {
        eprintln!("FAILURES:\n{}", failures.join("\n"));
        1
    }
}
