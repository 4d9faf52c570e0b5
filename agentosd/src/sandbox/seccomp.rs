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

/// Compile the policy for x86-64 into BPF programs ready for `seccomp(SECCOMP_SET_MODE_FILTER)`.
pub fn compile() -> Result<Vec<Vec<libc::sock_filter>>, SeccompError> {
    compile_policy(POLICY_JSON)
}

/// [`compile`], done once per process: the policy is a constant, so every agent gets a copy of
/// the same programs instead of parsing and compiling the JSON on each start.
pub fn compiled() -> Result<Vec<Vec<libc::sock_filter>>, SeccompError> {
    static PROGS: std::sync::OnceLock<Result<Vec<Vec<Filter>>, String>> =
        std::sync::OnceLock::new();
    let progs = PROGS.get_or_init(|| {
        compile()
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
/// mutation check installs to show that the matching attempt then succeeds. The daemon never
/// calls this.
pub fn compile_without(remove: &[&str]) -> Result<Vec<Vec<libc::sock_filter>>, SeccompError> {
    let mut v: serde_json::Value =
        serde_json::from_str(POLICY_JSON).map_err(|e| SeccompError::Compile(e.to_string()))?;
    for f in FILTERS {
        if let Some(rules) = v[f]["filter"].as_array_mut() {
            rules.retain(|r| !remove.iter().any(|s| r["syscall"] == *s));
        }
    }
    compile_policy(&v.to_string())
}

fn compile_policy(json: &str) -> Result<Vec<Vec<libc::sock_filter>>, SeccompError> {
    let split = split_rules(json, FILTERS[0])?;
    let arch = TargetArch::x86_64;
    let mut map = seccompiler::compile_from_json(split.rest.as_bytes(), arch)
        .map_err(|e| SeccompError::Compile(e.to_string()))?;
    let mut out = Vec::new();
    for (i, name) in FILTERS.iter().enumerate() {
        let prog = map.remove(*name).ok_or(SeccompError::Missing(name))?;
        let mut v: Vec<libc::sock_filter> = Vec::with_capacity(prog.len() + 160);
        if i == 0 {
            v.extend(prefilter(&split.always, &split.conditional, split.errno));
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
}

/// Architecture check, x32 refusal, then a binary search over the denied numbers: one in
/// `always` returns `errno`, one in `conditional` falls through to the program that follows
/// (seccompiler's, which checks the arguments); any other returns ALLOW. Both lists sorted.
fn prefilter(always: &[u32], conditional: &[u32], errno: u32) -> Vec<libc::sock_filter> {
    // (code, k, jt, jf) with symbolic targets; resolved below.
    let mut ins: Vec<(u32, u32, Label, Label)> = vec![
        (LD_W_ABS, 4, Label::Next, Label::Next),
        // Not x86-64: let seccompiler's program decide (it kills).
        (JEQ_K, AUDIT_ARCH_X86_64, Label::Next, Label::Program),
        (LD_W_ABS, 0, Label::Next, Label::Next),
        (JGE_K, X32_SYSCALL_BIT, Label::Enosys, Label::Next),
    ];
    let mut set: Vec<(u32, Label)> = always.iter().map(|&n| (n, Label::Errno)).collect();
    set.extend(conditional.iter().map(|&n| (n, Label::Program)));
    set.sort_unstable_by_key(|e| e.0);
    fn search(ins: &mut Vec<(u32, u32, Label, Label)>, set: &[(u32, Label)]) {
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
    let program = ins.len();
    let target = |l: Label, pc: usize| -> usize {
        match l {
            Label::Next => pc + 1,
            Label::Allow => allow,
            Label::Errno => errno_at,
            Label::Enosys => enosys,
            Label::Program => program,
            Label::At(t) => t,
        }
    };
    ins.iter()
        .enumerate()
        .map(|(pc, &(code, k, jt, jf))| {
            if code == libc::BPF_JMP | libc::BPF_JA {
                // Unconditional: the offset is in k (32 bits).
                return bpf_stmt(code, (target(jt, pc) - pc - 1) as u32);
            }
            if code & 0x07 != libc::BPF_JMP {
                return bpf_stmt(code, k);
            }
            let off = |l| u8::try_from(target(l, pc) - pc - 1).expect("prefilter jump within 255");
            bpf_jump(code, k, off(jt), off(jf))
        })
        .collect()
}

/// The name of x86-64 syscall `nr` when the policy names it (the kernel's seccomp audit
/// records give only the number; the agents' filter logs only the calls it denies).
pub fn syscall_name(nr: libc::c_long) -> Option<&'static str> {
    static NAMES: std::sync::OnceLock<std::collections::HashMap<libc::c_long, String>> =
        std::sync::OnceLock::new();
    NAMES
        .get_or_init(|| {
            denied_syscalls()
                .into_iter()
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
        let fast = &compile().unwrap()[0];
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
        // Shorter than seccompiler's chain alone: the kernel converts and JITs fewer
        // instructions at install.
        assert!(
            fast.len() < plain.len() / 2,
            "{} vs {}",
            fast.len(),
            plain.len()
        );
    }

    #[test]
    fn policy_compiles_and_lists_the_dangerous_syscalls() {
        let progs = compile().expect("policy compiles");
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
