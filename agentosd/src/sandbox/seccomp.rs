//! The seccomp deny-list, kept as reviewable data in `seccomp-policy.json` (seccompiler's JSON
//! format) and compiled in the daemon to classic BPF before the agent is cloned. The child only
//! installs the prepared programs.
//!
//! Two programs are installed: `agent` (listed syscalls fail with EPERM) and `agent_enosys`
//! (`clone3` fails with ENOSYS so that libc falls back to `clone`, whose flags a filter can
//! read). In front of both the daemon puts a check that refuses the x32 ABI (syscall numbers
//! with bit 30 set), which would otherwise name the same syscalls under other numbers;
//! seccompiler's own architecture check kills a process that makes i386 (`int 0x80`) calls.
//!
//! seccompiler emits one linear chain (≈ 290 instructions for this policy), and the kernel runs
//! the filter for every syscall number when it is installed to build its per-filter action cache,
//! which made the install cost ≈ 0.2 ms of each agent start. So the first program starts with a
//! prefilter: after the architecture and x32 checks, a binary search over the denied syscall
//! numbers returns ALLOW for every other number in about eight instructions, and the errno for a
//! syscall denied whatever its arguments; only a syscall whose rules check arguments (`clone`,
//! `unshare`) falls through to seccompiler's program, compiled from those rules alone.
//! A unit test runs both programs for every syscall number and argument case and requires the
//! same action.
//!
//! The socket rules depend on the contract, so the first program is per contract: its shape
//! ([`NetShape`]: whether the contract grants `net.connect`/`net.bind`) picks one of four
//! programs, compiled once per shape and cached. `socket()`/`socketpair()` and `listen()` go
//! from the prefilter's search to a short section generated here (not seccompiler: it needs
//! several errnos and 32-bit argument compares), which decides like [`socket_verdict`]:
//!
//! - `AF_UNIX`: always (the agent's MCP socket, pipes between its own processes).
//! - `AF_INET`/`AF_INET6`: only with a network grant, and then only `SOCK_STREAM` with
//!   protocol 0 or `IPPROTO_TCP` and `SOCK_DGRAM` with 0 or `IPPROTO_UDP` (the type compared
//!   without `SOCK_CLOEXEC`/`SOCK_NONBLOCK`). Raw sockets, MPTCP (262), SCTP (132), ICMP and
//!   ICMPv6 echo sockets, UDP-Lite, DCCP, `SOCK_SEQPACKET`… fail with `EPROTONOSUPPORT`.
//! - `AF_NETLINK`: only with a network grant and only `NETLINK_ROUTE` (glibc's
//!   `getaddrinfo(AI_ADDRCONFIG)` reads the interface addresses; unprivileged processes cannot
//!   change routes); other netlink protocols `EPROTONOSUPPORT`. Without a grant,
//!   `getaddrinfo` works without it (glibc falls back).
//! - every other family (`AF_PACKET`, `AF_VSOCK`, `AF_BLUETOOTH`, `AF_XDP`, `AF_ALG`, `AF_KEY`,
//!   `AF_TIPC`, `AF_RDS`, …): `EAFNOSUPPORT`.
//! - `listen()`: `EPERM` unless the contract grants `net.bind`, for every family, `AF_UNIX`
//!   included (an agent serves nobody; its MCP socket is a client connection).
//!
//! The kernel reads these arguments as `int`, so only their low 32 bits are compared.

use seccompiler::TargetArch;

/// The policy text, as reviewed.
pub const POLICY_JSON: &str = include_str!("seccomp-policy.json");

/// The filters installed, in order.
pub const FILTERS: [&str; 2] = ["agent", "agent_enosys"];

#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("compile seccomp policy: {0}")]
    Compile(String),
    #[error("seccomp policy has no filter {0:?}")]
    Missing(&'static str),
}

const X32_SYSCALL_BIT: u32 = 0x4000_0000;
const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;

/// What the socket rules of an agent's filter depend on (see the module docs). Compiled
/// programs are cached per shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct NetShape {
    /// `AF_INET`/`AF_INET6` (TCP and UDP only) and `AF_NETLINK` (`NETLINK_ROUTE` only): the
    /// contract grants `net.connect` or `net.bind`.
    pub inet: bool,
    /// `listen()`: the contract grants `net.bind`.
    pub listen: bool,
    /// Leave out the family check (only the escape suite's mutation check sets this).
    pub any_family: bool,
    /// Leave out the inet type/protocol check (mutation check only).
    pub any_inet_protocol: bool,
}

impl NetShape {
    /// The shape for a contract's network grants.
    pub fn for_grants(connect: bool, bind: bool) -> NetShape {
        NetShape {
            inet: connect || bind,
            listen: bind,
            ..NetShape::default()
        }
    }
}

/// Errno of a socket family the shape does not allow.
pub const ERRNO_FAMILY: u32 = libc::EAFNOSUPPORT as u32;
/// Errno of a socket type or protocol the shape does not allow.
pub const ERRNO_PROTOCOL: u32 = libc::EPROTONOSUPPORT as u32;
/// Errno of `listen()` without `net.bind`.
pub const ERRNO_LISTEN: u32 = libc::EPERM as u32;

const AF_NETLINK: u32 = 16;
const NETLINK_ROUTE: u32 = 0;
const SOCK_TYPE_MASK: u32 = 0xf;

/// The socket rules as a pure function of the syscall and its (low 32-bit) arguments: the
/// seccomp action (`SECCOMP_RET_ALLOW` or `SECCOMP_RET_ERRNO | errno`). `None` for a syscall
/// the socket rules do not decide. The generated BPF is tested against this.
pub fn socket_verdict(shape: NetShape, nr: u32, args: [u32; 3]) -> Option<u32> {
    let deny = |e: u32| Some(SECCOMP_RET_ERRNO | e);
    let allow = Some(SECCOMP_RET_ALLOW);
    let (family, ty, proto) = (args[0], args[1] & SOCK_TYPE_MASK, args[2]);
    if nr == libc::SYS_listen as u32 {
        return if shape.listen {
            allow
        } else {
            deny(ERRNO_LISTEN)
        };
    }
    if nr != libc::SYS_socket as u32 && nr != libc::SYS_socketpair as u32 {
        return None;
    }
    let inet = family == libc::AF_INET as u32 || family == libc::AF_INET6 as u32;
    if family == libc::AF_UNIX as u32 {
        return allow;
    }
    if !shape.any_family {
        if !shape.inet {
            return deny(ERRNO_FAMILY);
        }
        if family == AF_NETLINK {
            return if proto == NETLINK_ROUTE {
                allow
            } else {
                deny(ERRNO_PROTOCOL)
            };
        }
        if !inet {
            return deny(ERRNO_FAMILY);
        }
    }
    if !inet || shape.any_inet_protocol {
        return allow;
    }
    let ok = match ty {
        t if t == libc::SOCK_STREAM as u32 => proto == 0 || proto == libc::IPPROTO_TCP as u32,
        t if t == libc::SOCK_DGRAM as u32 => proto == 0 || proto == libc::IPPROTO_UDP as u32,
        _ => false,
    };
    if ok { allow } else { deny(ERRNO_PROTOCOL) }
}

/// Compile the policy for x86-64 into BPF programs ready for `seccomp(SECCOMP_SET_MODE_FILTER)`,
/// with the socket rules of `shape`.
pub fn compile(shape: NetShape) -> Result<Vec<Vec<libc::sock_filter>>, SeccompError> {
    compile_policy(POLICY_JSON, shape)
}

/// [`compile`] for a tool process or anything not tied to one contract: inet sockets (TCP and
/// UDP) and `listen()` allowed, the rest of the socket rules kept. Tools' network reach is the
/// tool runner's business (their manifests); agents get [`compiled_for`] their contract.
pub fn compiled() -> Result<Vec<Vec<libc::sock_filter>>, SeccompError> {
    compiled_for(NetShape::for_grants(true, true))
}

/// [`compile`], done once per shape and process: the policy is a constant, so every agent gets
/// a copy of the programs of its contract's shape instead of parsing and compiling the JSON on
/// each start.
pub fn compiled_for(shape: NetShape) -> Result<Vec<Vec<libc::sock_filter>>, SeccompError> {
    type Cache = std::collections::HashMap<NetShape, Result<Vec<Vec<Filter>>, String>>;
    static PROGS: std::sync::Mutex<Option<Cache>> = std::sync::Mutex::new(None);
    let mut cache = PROGS.lock().unwrap_or_else(|p| p.into_inner());
    let progs = cache
        .get_or_insert_with(Default::default)
        .entry(shape)
        .or_insert_with(|| {
            compile(shape)
                .map(|v| {
                    v.into_iter()
                        .map(|p| p.into_iter().map(Filter::from).collect())
                        .collect()
                })
                .map_err(|e| e.to_string())
        });
    match progs {
        Ok(v) => Ok(v
            .iter()
            .map(|p| p.iter().map(|f| f.to_sock_filter()).collect())
            .collect()),
        Err(e) => Err(SeccompError::Compile(e.clone())),
    }
}

/// `sock_filter` is not `Sync` in libc's eyes (it is plain data); this copy is.
#[derive(Clone, Copy)]
struct Filter {
    code: u16,
    jt: u8,
    jf: u8,
    k: u32,
}

impl From<libc::sock_filter> for Filter {
    fn from(f: libc::sock_filter) -> Self {
        Filter {
            code: f.code,
            jt: f.jt,
            jf: f.jf,
            k: f.k,
        }
    }
}

impl Filter {
    fn to_sock_filter(self) -> libc::sock_filter {
        libc::sock_filter {
            code: self.code,
            jt: self.jt,
            jf: self.jf,
            k: self.k,
        }
    }
}

/// The policy with every rule for the syscalls in `remove` taken out: what the escape suite's
/// mutation check installs to show that the matching attempt then succeeds. The socket rules
/// are those of [`compiled`] (the least strict a contract gets). The daemon never calls this.
pub fn compile_without(remove: &[&str]) -> Result<Vec<Vec<libc::sock_filter>>, SeccompError> {
    let mut v: serde_json::Value =
        serde_json::from_str(POLICY_JSON).map_err(|e| SeccompError::Compile(e.to_string()))?;
    for f in FILTERS {
        if let Some(rules) = v[f]["filter"].as_array_mut() {
            rules.retain(|r| !remove.iter().any(|s| r["syscall"] == *s));
        }
    }
    compile_policy(&v.to_string(), NetShape::for_grants(true, true))
}

fn compile_policy(
    json: &str,
    shape: NetShape,
) -> Result<Vec<Vec<libc::sock_filter>>, SeccompError> {
    let split = split_rules(json, FILTERS[0])?;
    let arch = TargetArch::x86_64;
    let mut map = seccompiler::compile_from_json(split.rest.as_bytes(), arch)
        .map_err(|e| SeccompError::Compile(e.to_string()))?;
    let mut out = Vec::new();
    for (i, name) in FILTERS.iter().enumerate() {
        let prog = map.remove(*name).ok_or(SeccompError::Missing(name))?;
        let mut v: Vec<libc::sock_filter> = Vec::with_capacity(prog.len() + 160);
        if i == 0 {
            v.extend(prefilter(
                &split.always,
                &split.conditional,
                split.errno,
                shape,
            )?);
        }
        v.extend(prog.into_iter().map(|f| libc::sock_filter {
            code: f.code,
            jt: f.jt,
            jf: f.jf,
            k: f.k,
        }));
        out.push(v);
    }
    Ok(out)
}

const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
const LD_W_ABS: u32 = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
const JEQ_K: u32 = libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K;
const JGE_K: u32 = libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K;
const RET_K: u32 = libc::BPF_RET | libc::BPF_K;

/// The first filter's rules, split for the prefilter.
struct Split {
    /// Numbers denied whatever the arguments: the prefilter returns the errno itself.
    always: Vec<u32>,
    /// Numbers denied only for some arguments: decided by seccompiler's program.
    conditional: Vec<u32>,
    /// The filter's `filter_action` errno.
    errno: u32,
    /// The policy with only the conditional rules left in the first filter (what seccompiler
    /// compiles).
    rest: String,
}

/// Split `filter`'s rules into unconditional and argument-checking ones. A syscall with an
/// unconditional rule is always denied (its other rules cannot allow more). An unknown syscall
/// name or a filter action other than `errno` fails the compile.
fn split_rules(json: &str, filter: &str) -> Result<Split, SeccompError> {
    let bad = |m: String| SeccompError::Compile(m);
    let mut v: serde_json::Value = serde_json::from_str(json).map_err(|e| bad(e.to_string()))?;
    let errno = v[filter]["filter_action"]["errno"]
        .as_u64()
        .and_then(|e| u32::try_from(e).ok())
        .filter(|e| *e <= 0xffff)
        .ok_or_else(|| {
            bad(format!(
                "filter {filter:?}: filter_action must be {{\"errno\": N}}"
            ))
        })?;
    let rules = v[filter]["filter"].as_array().cloned().unwrap_or_default();
    let nr_of = |r: &serde_json::Value| {
        let name = r["syscall"].as_str().unwrap_or_default();
        syscall_nr(name)
            .map(|n| n as u32)
            .ok_or_else(|| bad(format!("no x86-64 number known for syscall {name:?}")))
    };
    let mut always = Vec::new();
    for r in &rules {
        if r.get("args").is_none() {
            always.push(nr_of(r)?);
        }
    }
    always.sort_unstable();
    always.dedup();
    let mut conditional = Vec::new();
    let mut kept = Vec::new();
    for r in rules {
        let nr = nr_of(&r)?;
        if r.get("args").is_some() && always.binary_search(&nr).is_err() {
            conditional.push(nr);
            kept.push(r);
        }
    }
    conditional.sort_unstable();
    conditional.dedup();
    v[filter]["filter"] = serde_json::Value::Array(kept);
    Ok(Split {
        always,
        conditional,
        errno,
        rest: v.to_string(),
    })
}

/// A jump target while the prefilter is assembled.
#[derive(Clone, Copy, PartialEq)]
enum Label {
    Next,
    Allow,
    Errno,
    Enosys,
    Program,
    At(usize),
    /// A place in the socket section, resolved once it is emitted.
    Mark(Mark),
}

/// The places of the socket section.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mark {
    Socket,
    Netlink,
    Inet,
    Stream,
    Dgram,
    NoFamily,
    NoProtocol,
    NoListen,
    Ok,
}

/// Offset of the low 32 bits of syscall argument `i` in `struct seccomp_data` (little endian).
const fn arg_lo(i: u32) -> u32 {
    16 + 8 * i
}

/// Architecture check, x32 refusal, then a binary search over the denied numbers: one in
/// `always` returns `errno`, one in `conditional` falls through to the program that follows
/// (seccompiler's, which checks the arguments), `socket`/`socketpair`/`listen` go to the
/// socket section of `shape`; any other returns ALLOW. Both lists sorted.
fn prefilter(
    always: &[u32],
    conditional: &[u32],
    errno: u32,
    shape: NetShape,
) -> Result<Vec<libc::sock_filter>, SeccompError> {
    type Ins = (u32, u32, Label, Label);
    let (sys_socket, sys_socketpair, sys_listen) = (
        libc::SYS_socket as u32,
        libc::SYS_socketpair as u32,
        libc::SYS_listen as u32,
    );
    for nr in [sys_socket, sys_socketpair, sys_listen] {
        if always.contains(&nr) || conditional.contains(&nr) {
            return Err(SeccompError::Compile(format!(
                "syscall #{nr}: socket, socketpair and listen are decided by the socket rules (seccomp.rs), not by rules in the JSON policy"
            )));
        }
    }
    // (code, k, jt, jf) with symbolic targets; resolved below.
    let mut ins: Vec<Ins> = vec![
        (LD_W_ABS, 4, Label::Next, Label::Next),
        // Not x86-64: let seccompiler's program decide (it kills).
        (JEQ_K, AUDIT_ARCH_X86_64, Label::Next, Label::Program),
        (LD_W_ABS, 0, Label::Next, Label::Next),
        (JGE_K, X32_SYSCALL_BIT, Label::Enosys, Label::Next),
    ];
    let mut set: Vec<(u32, Label)> = always.iter().map(|&n| (n, Label::Errno)).collect();
    set.extend(conditional.iter().map(|&n| (n, Label::Program)));
    set.push((sys_socket, Label::Mark(Mark::Socket)));
    set.push((sys_socketpair, Label::Mark(Mark::Socket)));
    if !shape.listen {
        set.push((sys_listen, Label::Mark(Mark::NoListen)));
    }
    set.sort_unstable_by_key(|e| e.0);
    fn search(ins: &mut Vec<Ins>, set: &[(u32, Label)]) {
        if set.len() <= 3 {
            for &(nr, to) in set {
                ins.push((JEQ_K, nr, to, Label::Next));
            }
            ins.push((libc::BPF_JMP | libc::BPF_JA, 0, Label::Allow, Label::Allow));
            return;
        }
        let mid = set.len() / 2;
        let at = ins.len();
        ins.push((JGE_K, set[mid].0, Label::At(0), Label::Next));
        search(ins, &set[..mid]);
        let right = ins.len();
        ins[at].2 = Label::At(right);
        search(ins, &set[mid..]);
    }
    search(&mut ins, &set);
    let allow = ins.len();
    ins.push((RET_K, SECCOMP_RET_ALLOW, Label::Next, Label::Next));
    let errno_at = ins.len();
    ins.push((RET_K, SECCOMP_RET_ERRNO | errno, Label::Next, Label::Next));
    let enosys = ins.len();
    ins.push((
        RET_K,
        SECCOMP_RET_ERRNO | libc::ENOSYS as u32,
        Label::Next,
        Label::Next,
    ));
    // The socket section (see `socket_verdict`).
    let mut marks: Vec<(Mark, usize)> = Vec::new();
    let ja = |to: Label| (libc::BPF_JMP | libc::BPF_JA, 0, to, to);
    let m = Label::Mark;
    marks.push((Mark::Socket, ins.len()));
    ins.push((LD_W_ABS, arg_lo(0), Label::Next, Label::Next));
    ins.push((JEQ_K, libc::AF_UNIX as u32, m(Mark::Ok), Label::Next));
    if shape.inet || shape.any_family {
        ins.push((JEQ_K, libc::AF_INET as u32, m(Mark::Inet), Label::Next));
        ins.push((JEQ_K, libc::AF_INET6 as u32, m(Mark::Inet), Label::Next));
    }
    if shape.any_family {
        ins.push(ja(m(Mark::Ok)));
    } else {
        if shape.inet {
            ins.push((JEQ_K, AF_NETLINK, m(Mark::Netlink), Label::Next));
        }
        ins.push(ja(m(Mark::NoFamily)));
        marks.push((Mark::Netlink, ins.len()));
        ins.push((LD_W_ABS, arg_lo(2), Label::Next, Label::Next));
        ins.push((JEQ_K, NETLINK_ROUTE, m(Mark::Ok), m(Mark::NoProtocol)));
    }
    marks.push((Mark::Inet, ins.len()));
    if shape.any_inet_protocol {
        ins.push(ja(m(Mark::Ok)));
    } else {
        ins.push((LD_W_ABS, arg_lo(1), Label::Next, Label::Next));
        ins.push((
            libc::BPF_ALU | libc::BPF_AND | libc::BPF_K,
            SOCK_TYPE_MASK,
            Label::Next,
            Label::Next,
        ));
        ins.push((
            JEQ_K,
            libc::SOCK_STREAM as u32,
            m(Mark::Stream),
            Label::Next,
        ));
        ins.push((JEQ_K, libc::SOCK_DGRAM as u32, m(Mark::Dgram), Label::Next));
        ins.push(ja(m(Mark::NoProtocol)));
        for (mark, proto) in [
            (Mark::Stream, libc::IPPROTO_TCP as u32),
            (Mark::Dgram, libc::IPPROTO_UDP as u32),
        ] {
            marks.push((mark, ins.len()));
            ins.push((LD_W_ABS, arg_lo(2), Label::Next, Label::Next));
            ins.push((JEQ_K, 0, m(Mark::Ok), Label::Next));
            ins.push((JEQ_K, proto, m(Mark::Ok), m(Mark::NoProtocol)));
        }
    }
    // Classic BPF jumps only forward: the section has its own ALLOW.
    marks.push((Mark::Ok, ins.len()));
    ins.push((RET_K, SECCOMP_RET_ALLOW, Label::Next, Label::Next));
    for (mark, e) in [
        (Mark::NoFamily, ERRNO_FAMILY),
        (Mark::NoProtocol, ERRNO_PROTOCOL),
        (Mark::NoListen, ERRNO_LISTEN),
    ] {
        marks.push((mark, ins.len()));
        ins.push((RET_K, SECCOMP_RET_ERRNO | e, Label::Next, Label::Next));
    }
    let program = ins.len();
    let far = std::cell::Cell::new(None);
    let target = |l: Label, pc: usize| -> usize {
        match l {
            Label::Next => pc + 1,
            Label::Allow => allow,
            Label::Errno => errno_at,
            Label::Enosys => enosys,
            Label::Program => program,
            Label::At(t) => t,
            Label::Mark(mk) => marks
                .iter()
                .find(|(x, _)| *x == mk)
                .map_or(program, |(_, at)| *at),
        }
    };
    let out = ins
        .iter()
        .enumerate()
        .map(|(pc, &(code, k, jt, jf))| {
            // Classic BPF jumps only forward.
            let fwd = |l| {
                target(l, pc).checked_sub(pc + 1).unwrap_or_else(|| {
                    far.set(Some(pc));
                    0
                })
            };
            if code == libc::BPF_JMP | libc::BPF_JA {
                // Unconditional: the offset is in k (32 bits).
                return bpf_stmt(code, fwd(jt) as u32);
            }
            if code & 0x07 != libc::BPF_JMP {
                return bpf_stmt(code, k);
            }
            let off = |l| {
                u8::try_from(fwd(l)).unwrap_or_else(|_| {
                    far.set(Some(pc));
                    0
                })
            };
            let (t, f) = (off(jt), off(jf));
            bpf_jump(code, k, t, f)
        })
        .collect();
    if let Some(pc) = far.get() {
        return Err(SeccompError::Compile(format!(
            "prefilter: the jump at {pc} goes backwards or (conditional) over more than 255 instructions"
        )));
    }
    Ok(out)
}

/// The name of x86-64 syscall `nr` when the policy names it or the socket rules decide it (the
/// kernel's seccomp audit records give only the number; the agents' filter logs only the calls
/// it denies).
pub fn syscall_name(nr: libc::c_long) -> Option<&'static str> {
    static NAMES: std::sync::OnceLock<std::collections::HashMap<libc::c_long, String>> =
        std::sync::OnceLock::new();
    NAMES
        .get_or_init(|| {
            denied_syscalls()
                .into_iter()
                .chain(["socket", "socketpair", "listen"].map(String::from))
                .filter_map(|n| syscall_nr(&n).map(|nr| (nr, n)))
                .collect()
        })
        .get(&nr)
        .map(String::as_str)
}

/// x86-64 numbers of the syscalls the policy may name.
fn syscall_nr(name: &str) -> Option<libc::c_long> {
    use libc::*;
    Some(match name {
        "mount" => SYS_mount,
        "umount2" => SYS_umount2,
        "pivot_root" => SYS_pivot_root,
        "chroot" => SYS_chroot,
        "move_mount" => SYS_move_mount,
        "open_tree" => SYS_open_tree,
        "fsopen" => SYS_fsopen,
        "fsconfig" => SYS_fsconfig,
        "fsmount" => SYS_fsmount,
        "fspick" => SYS_fspick,
        "mount_setattr" => SYS_mount_setattr,
        "bpf" => SYS_bpf,
        "perf_event_open" => SYS_perf_event_open,
        "ptrace" => SYS_ptrace,
        "process_vm_readv" => SYS_process_vm_readv,
        "process_vm_writev" => SYS_process_vm_writev,
        "kcmp" => SYS_kcmp,
        "pidfd_getfd" => SYS_pidfd_getfd,
        "kexec_load" => SYS_kexec_load,
        "kexec_file_load" => SYS_kexec_file_load,
        "init_module" => SYS_init_module,
        "finit_module" => SYS_finit_module,
        "delete_module" => SYS_delete_module,
        "keyctl" => SYS_keyctl,
        "add_key" => SYS_add_key,
        "request_key" => SYS_request_key,
        "unshare" => SYS_unshare,
        "clone" => SYS_clone,
        "clone3" => SYS_clone3,
        "setns" => SYS_setns,
        "settimeofday" => SYS_settimeofday,
        "clock_settime" => SYS_clock_settime,
        "clock_adjtime" => SYS_clock_adjtime,
        "adjtimex" => SYS_adjtimex,
        "reboot" => SYS_reboot,
        "swapon" => SYS_swapon,
        "swapoff" => SYS_swapoff,
        "acct" => SYS_acct,
        "quotactl" => SYS_quotactl,
        "quotactl_fd" => SYS_quotactl_fd,
        "syslog" => SYS_syslog,
        "iopl" => SYS_iopl,
        "ioperm" => SYS_ioperm,
        "sethostname" => SYS_sethostname,
        "setdomainname" => SYS_setdomainname,
        "open_by_handle_at" => SYS_open_by_handle_at,
        "name_to_handle_at" => SYS_name_to_handle_at,
        "userfaultfd" => SYS_userfaultfd,
        "uselib" => SYS_uselib,
        "vhangup" => SYS_vhangup,
        "lookup_dcookie" => SYS_lookup_dcookie,
        "fanotify_init" => SYS_fanotify_init,
        "io_uring_setup" => SYS_io_uring_setup,
        "io_uring_enter" => SYS_io_uring_enter,
        "io_uring_register" => SYS_io_uring_register,
        "memfd_create" => SYS_memfd_create,
        "socket" => SYS_socket,
        "socketpair" => SYS_socketpair,
        "listen" => SYS_listen,
        _ => return None,
    })
}

fn bpf_stmt(code: u32, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    }
}

fn bpf_jump(code: u32, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    }
}

/// The syscall names the policy has rules for (the policy test checks the dangerous ones are
/// all there).
pub fn denied_syscalls() -> Vec<String> {
    let v: serde_json::Value = serde_json::from_str(POLICY_JSON).unwrap_or_default();
    let mut out = Vec::new();
    for f in FILTERS {
        if let Some(rules) = v[f]["filter"].as_array() {
            for r in rules {
                if let Some(s) = r["syscall"].as_str() {
                    out.push(s.to_string());
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A classic-BPF interpreter for the instructions seccompiler and the prefilter use,
    /// over `struct seccomp_data` (nr, arch, ip, args).
    fn run(prog: &[libc::sock_filter], nr: u32, arch: u32, args: [u64; 6]) -> u32 {
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&nr.to_ne_bytes());
        data[4..8].copy_from_slice(&arch.to_ne_bytes());
        for (i, a) in args.iter().enumerate() {
            data[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_ne_bytes());
        }
        let (mut acc, mut pc) = (0u32, 0usize);
        loop {
            let f = prog[pc];
            let code = f.code as u32;
            pc += 1;
            match code {
                c if c == LD_W_ABS => {
                    let o = f.k as usize;
                    acc = u32::from_ne_bytes(data[o..o + 4].try_into().unwrap());
                }
                c if c == libc::BPF_ALU | libc::BPF_AND | libc::BPF_K => acc &= f.k,
                c if c == libc::BPF_JMP | libc::BPF_JA => pc += f.k as usize,
                c if c & 0x07 == libc::BPF_JMP => {
                    let hit = match c & 0xf0 {
                        0x10 => acc == f.k,
                        0x20 => acc > f.k,
                        0x30 => acc >= f.k,
                        0x40 => acc & f.k != 0,
                        _ => panic!("unsupported jump {c:#x}"),
                    };
                    pc += if hit { f.jt } else { f.jf } as usize;
                }
                c if c == RET_K => return f.k,
                c => panic!("unsupported instruction {c:#x} at {}", pc - 1),
            }
        }
    }

    #[test]
    fn prefilter_decides_like_the_plain_program() {
        let plain = {
            let mut m =
                seccompiler::compile_from_json(POLICY_JSON.as_bytes(), TargetArch::x86_64).unwrap();
            m.remove("agent")
                .unwrap()
                .into_iter()
                .map(|f| libc::sock_filter {
                    code: f.code,
                    jt: f.jt,
                    jf: f.jf,
                    k: f.k,
                })
                .collect::<Vec<_>>()
        };
        let fast = &compile(NetShape::for_grants(true, true)).unwrap()[0];
        let newuser = libc::CLONE_NEWUSER as u64;
        let arg_cases = [
            [0u64; 6],
            [newuser, 0, 0, 0, 0, 0],
            [u64::MAX; 6],
            [newuser | 0xff, 1, 2, 3, 4, 5],
        ];
        let mut denied = 0;
        for nr in 0..600u32 {
            for args in arg_cases {
                if let Some(v) = socket_verdict(
                    NetShape::for_grants(true, true),
                    nr,
                    [args[0] as u32, args[1] as u32, args[2] as u32],
                ) {
                    // Decided by the socket rules (tested below), not by seccompiler's program.
                    assert_eq!(run(fast, nr, AUDIT_ARCH_X86_64, args), v, "nr {nr}");
                    continue;
                }
                let want = run(&plain, nr, AUDIT_ARCH_X86_64, args);
                assert_eq!(
                    run(fast, nr, AUDIT_ARCH_X86_64, args),
                    want,
                    "nr {nr} args {args:?}"
                );
                denied += (want != SECCOMP_RET_ALLOW) as u32;
                // Another architecture: both leave it to seccompiler's check (kill).
                assert_eq!(
                    run(fast, nr, 0x4000_0003, args),
                    run(&plain, nr, 0x4000_0003, args)
                );
            }
        }
        assert!(denied > 50 * 4, "{denied}");
        // x32 numbers get ENOSYS before anything else.
        assert_eq!(
            run(
                fast,
                X32_SYSCALL_BIT | libc::SYS_mount as u32,
                AUDIT_ARCH_X86_64,
                [0; 6]
            ),
            SECCOMP_RET_ERRNO | libc::ENOSYS as u32
        );
        // Shorter than seccompiler's chain alone, socket section included: the kernel
        // converts and JITs fewer instructions at install.
        assert!(
            fast.len() < plain.len() * 2 / 3,
            "{} vs {}",
            fast.len(),
            plain.len()
        );
    }

    /// Every shape's program decides socket/socketpair/listen like [`socket_verdict`], for
    /// every family number, every type (with and without flags), the protocols that matter and
    /// garbage in the high 32 bits the kernel ignores; every other syscall as before.
    #[test]
    fn socket_rules_decide_like_the_table() {
        let nrs = [libc::SYS_socket, libc::SYS_socketpair, libc::SYS_listen].map(|n| n as u32);
        let types = (0..16u32).flat_map(|t| {
            [
                t,
                t | libc::SOCK_CLOEXEC as u32 | libc::SOCK_NONBLOCK as u32,
            ]
        });
        let types: Vec<u32> = types.collect();
        let protos = [0u32, 1, 4, 6, 17, 41, 58, 132, 136, 255, 262, 0xffff_ffff];
        let base = compile(NetShape::for_grants(true, true)).unwrap();
        for inet in [false, true] {
            for listen in [false, true] {
                for (any_family, any_inet_protocol) in
                    [(false, false), (true, false), (false, true)]
                {
                    let shape = NetShape {
                        inet,
                        listen,
                        any_family,
                        any_inet_protocol,
                    };
                    let prog = &compile(shape).unwrap()[0];
                    for nr in nrs {
                        for family in 0..50u32 {
                            for &ty in &types {
                                for &proto in &protos {
                                    let args =
                                        [family as u64 | 0xdead_0000_0000, ty as u64, proto as u64];
                                    let want = socket_verdict(shape, nr, [family, ty, proto]);
                                    let got = run(
                                        prog,
                                        nr,
                                        AUDIT_ARCH_X86_64,
                                        [args[0], args[1], args[2], 0, 0, 0],
                                    );
                                    assert_eq!(
                                        Some(got),
                                        want,
                                        "{shape:?} nr {nr} family {family} type {ty} proto {proto}"
                                    );
                                }
                            }
                        }
                    }
                    // The rest of the filter does not depend on the shape.
                    for nr in (0..600u32).filter(|n| !nrs.contains(n)) {
                        assert_eq!(
                            run(prog, nr, AUDIT_ARCH_X86_64, [0; 6]),
                            run(&base[0], nr, AUDIT_ARCH_X86_64, [0; 6]),
                            "{shape:?} nr {nr}"
                        );
                    }
                }
            }
        }
        // The table itself, for the cases the docs name.
        let (none, net, bind) = (
            NetShape::for_grants(false, false),
            NetShape::for_grants(true, false),
            NetShape::for_grants(false, true),
        );
        let sock = libc::SYS_socket as u32;
        let e = |e: i32| Some(SECCOMP_RET_ERRNO | e as u32);
        let ok = Some(SECCOMP_RET_ALLOW);
        let (unix, inet, inet6) = (
            libc::AF_UNIX as u32,
            libc::AF_INET as u32,
            libc::AF_INET6 as u32,
        );
        let (stream, dgram, raw) = (1u32, 2u32, 3u32);
        assert_eq!(socket_verdict(none, sock, [unix, stream, 0]), ok);
        assert_eq!(
            socket_verdict(none, sock, [inet, stream, 0]),
            e(libc::EAFNOSUPPORT)
        );
        assert_eq!(
            socket_verdict(none, sock, [inet6, dgram, 0]),
            e(libc::EAFNOSUPPORT)
        );
        assert_eq!(
            socket_verdict(none, sock, [16, raw, 0]),
            e(libc::EAFNOSUPPORT)
        );
        assert_eq!(socket_verdict(net, sock, [16, raw, 0]), ok);
        assert_eq!(
            socket_verdict(net, sock, [16, raw, 4]),
            e(libc::EPROTONOSUPPORT)
        );
        assert_eq!(socket_verdict(net, sock, [inet, stream | 0x80800, 6]), ok);
        assert_eq!(socket_verdict(net, sock, [inet6, dgram, 17]), ok);
        assert_eq!(
            socket_verdict(net, sock, [inet, stream, 262]),
            e(libc::EPROTONOSUPPORT)
        );
        assert_eq!(
            socket_verdict(net, sock, [inet, stream, 132]),
            e(libc::EPROTONOSUPPORT)
        );
        assert_eq!(
            socket_verdict(net, sock, [inet, dgram, 1]),
            e(libc::EPROTONOSUPPORT)
        );
        assert_eq!(
            socket_verdict(net, sock, [inet6, dgram, 58]),
            e(libc::EPROTONOSUPPORT)
        );
        assert_eq!(
            socket_verdict(net, sock, [inet, dgram, 136]),
            e(libc::EPROTONOSUPPORT)
        );
        assert_eq!(
            socket_verdict(net, sock, [inet, raw, 1]),
            e(libc::EPROTONOSUPPORT)
        );
        assert_eq!(
            socket_verdict(net, sock, [inet, 5, 132]),
            e(libc::EPROTONOSUPPORT)
        );
        assert_eq!(
            socket_verdict(net, sock, [17, raw, 0]),
            e(libc::EAFNOSUPPORT)
        );
        assert_eq!(
            socket_verdict(net, sock, [40, stream, 0]),
            e(libc::EAFNOSUPPORT)
        );
        let listen = libc::SYS_listen as u32;
        assert_eq!(socket_verdict(net, listen, [3, 1, 0]), e(libc::EPERM));
        assert_eq!(socket_verdict(bind, listen, [3, 1, 0]), ok);
        assert_eq!(socket_verdict(bind, libc::SYS_read as u32, [0; 3]), None);
        // Cached per shape: the same programs.
        let a = compiled_for(net).unwrap();
        let b = compiled_for(net).unwrap();
        assert_eq!(a[0].len(), b[0].len());
        assert_ne!(compiled_for(none).unwrap()[0].len(), a[0].len());
    }

    #[test]
    fn policy_compiles_and_lists_the_dangerous_syscalls() {
        let progs = compile(NetShape::for_grants(true, true)).expect("policy compiles");
        assert_eq!(progs.len(), 2);
        assert!(progs.iter().all(|p| !p.is_empty() && p.len() < 4096));
        let names = denied_syscalls();
        for s in [
            "mount",
            "bpf",
            "ptrace",
            "kexec_load",
            "init_module",
            "keyctl",
            "perf_event_open",
            "unshare",
            "setns",
            "clock_settime",
            "reboot",
            "swapon",
            "clone3",
        ] {
            assert!(names.iter().any(|n| n == s), "{s} not denied");
        }
        // Taking a rule out shortens the program and drops the name.
        let without = compile_without(&["ptrace"]).expect("compiles");
        assert!(without[0].len() < progs[0].len());
        assert_eq!(without[1].len(), progs[1].len());
        for s in ["execve", "read", "write", "clone", "exit_group"] {
            // clone is only denied with CLONE_NEWUSER (an argument rule)
            let plain = names.iter().filter(|n| *n == s).count();
            assert!(s == "clone" || plain == 0, "{s} must stay allowed");
        }
    }
}
