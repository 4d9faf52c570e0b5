//! The first program's prefilter, generated here rather than by seccompiler: the architecture
//! and x32 checks, a binary search over the denied syscall numbers (ALLOW or the errno in about
//! eight instructions), and the contract-dependent socket section that decides like
//! [`super::socket_verdict`]. Only syscalls whose rules check arguments fall through to
//! seccompiler's program.

use super::*;

pub(super) const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
pub(super) const LD_W_ABS: u32 = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
const JEQ_K: u32 = libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K;
const JGE_K: u32 = libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K;
const JGT_K: u32 = libc::BPF_JMP | libc::BPF_JGT | libc::BPF_K;
pub(super) const RET_K: u32 = libc::BPF_RET | libc::BPF_K;

/// The first filter's rules, split for the prefilter.
pub(super) struct Split {
    /// Numbers denied whatever the arguments: the prefilter returns the errno itself.
    pub(super) always: Vec<u32>,
    /// Numbers denied only for some arguments: decided by seccompiler's program.
    pub(super) conditional: Vec<u32>,
    /// The filter's `filter_action` errno.
    pub(super) errno: u32,
    /// The policy with only the conditional rules left in the first filter (what seccompiler
    /// compiles).
    pub(super) rest: String,
}

/// Split `filter`'s rules into unconditional and argument-checking ones. A syscall with an
/// unconditional rule is always denied (its other rules cannot allow more). An unknown syscall
/// name or a filter action other than `errno` fails the compile.
pub(super) fn split_rules(json: &str, filter: &str) -> Result<Split, SeccompError> {
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

/// The rules of `filters` (installed after the first, in this order) as one verdict per
/// syscall number: `(nr, errno)`, sorted by number. Each of these filters may only deny whole
/// syscalls (no argument rules) with an `errno` action; for a number several of them deny, the
/// errno of the last wins, as in the kernel, where equal actions take the data of the filter
/// installed last (`compile_single`, tests only, relies on this).
#[cfg(test)]
pub(super) fn quiet_rules(json: &str, filters: &[&str]) -> Result<Vec<(u32, u32)>, SeccompError> {
    let mut out: Vec<(u32, u32)> = Vec::new();
    for filter in filters {
        let split = split_rules(json, filter)?;
        if !split.conditional.is_empty() {
            return Err(SeccompError::Compile(format!(
                "filter {filter:?}: argument rules are only supported in the first filter {:?}",
                FILTERS[0]
            )));
        }
        for nr in split.always {
            out.retain(|(n, _)| *n != nr);
            out.push((nr, split.errno));
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// A jump target while the prefilter is assembled.
#[derive(Clone, Copy, PartialEq)]
enum Label {
    Next,
    Allow,
    Errno,
    /// `SECCOMP_RET_ERRNO` with this errno (a later filter's rule folded in).
    Quiet(u32),
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
/// socket section of `shape`; any other returns ALLOW. Both lists sorted. A number in `quiet`
/// (from [`quiet_rules`]: later filters folded into this one) returns its errno whatever the
/// first filter's rules say: in the kernel a later filter's `ERRNO` outranks `ALLOW` and, equal
/// in action, wins over the first filter's `ERRNO` by being installed last.
pub(super) fn prefilter(
    always: &[u32],
    conditional: &[u32],
    errno: u32,
    quiet: &[(u32, u32)],
    shape: NetShape,
) -> Result<Vec<libc::sock_filter>, SeccompError> {
    let (sys_socket, sys_socketpair, sys_listen) = (
        libc::SYS_socket as u32,
        libc::SYS_socketpair as u32,
        libc::SYS_listen as u32,
    );
    for nr in [sys_socket, sys_socketpair, sys_listen] {
        if always.contains(&nr) || conditional.contains(&nr) || quiet.iter().any(|q| q.0 == nr) {
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
    set.retain(|(n, _)| !quiet.iter().any(|q| q.0 == *n));
    set.extend(quiet.iter().map(|&(n, e)| (n, Label::Quiet(e))));
    set.push((sys_socket, Label::Mark(Mark::Socket)));
    set.push((sys_socketpair, Label::Mark(Mark::Socket)));
    if !shape.listen {
        set.push((sys_listen, Label::Mark(Mark::NoListen)));
    }
    set.sort_unstable_by_key(|e| e.0);
    search(&mut ins, &runs(&set));
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
    let mut quiet_at: Vec<(u32, usize)> = Vec::new();
    for &(_, e) in quiet {
        if !quiet_at.iter().any(|q| q.0 == e) {
            quiet_at.push((e, ins.len()));
            ins.push((RET_K, SECCOMP_RET_ERRNO | e, Label::Next, Label::Next));
        }
    }
    let marks = socket_section(&mut ins, shape);
    let program = ins.len();
    let targets = Targets {
        allow,
        errno: errno_at,
        enosys,
        quiet: quiet_at,
        program,
        marks,
    };
    resolve(&ins, &targets)
}

/// A prefilter instruction before its jump targets are resolved: (code, k, jt, jf).
type Ins = (u32, u32, Label, Label);

/// Where the symbolic jump targets are.
struct Targets {
    allow: usize,
    errno: usize,
    enosys: usize,
    /// The return of each folded-in errno.
    quiet: Vec<(u32, usize)>,
    /// The first instruction of the program that follows (seccompiler's).
    program: usize,
    marks: Vec<(Mark, usize)>,
}

/// `set` (sorted by number) as runs of consecutive numbers with the same label: `(first, last,
/// label)`. The denied numbers cluster (the mount family, `io_uring_*`, the module and clock
/// calls): a run costs the search what one number did, and the program is shorter (the kernel
/// converts, JITs and emulates every instruction when it attaches the filter).
fn runs(set: &[(u32, Label)]) -> Vec<(u32, u32, Label)> {
    let mut out: Vec<(u32, u32, Label)> = Vec::new();
    for &(nr, to) in set {
        match out.last_mut() {
            Some(last) if last.1.checked_add(1) == Some(nr) && last.2 == to => last.1 = nr,
            _ => out.push((nr, nr, to)),
        }
    }
    out
}

/// A binary search over `runs` (sorted, disjoint): each leaf checks up to three runs in
/// ascending order and jumps to their label, anything else to ALLOW. In a leaf the number is
/// above the runs already checked, so one below a run's first number is in none.
fn search(ins: &mut Vec<Ins>, runs: &[(u32, u32, Label)]) {
    if runs.len() <= 3 {
        for &(first, last, to) in runs {
            if first == last {
                ins.push((JEQ_K, first, to, Label::Next));
            } else {
                ins.push((JGE_K, first, Label::Next, Label::Allow));
                ins.push((JGT_K, last, Label::Next, to));
            }
        }
        ins.push((libc::BPF_JMP | libc::BPF_JA, 0, Label::Allow, Label::Allow));
        return;
    }
    let mid = runs.len() / 2;
    let at = ins.len();
    ins.push((JGE_K, runs[mid].0, Label::At(0), Label::Next));
    search(ins, &runs[..mid]);
    let right = ins.len();
    ins[at].2 = Label::At(right);
    search(ins, &runs[mid..]);
}

/// The socket section of `shape` (it decides like `socket_verdict`), appended to `ins`;
/// returns where each of its marks is.
fn socket_section(ins: &mut Vec<Ins>, shape: NetShape) -> Vec<(Mark, usize)> {
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
    marks
}

/// Resolves the symbolic jumps into forward offsets; a jump backwards or a conditional one over
/// more than 255 instructions fails the compile.
fn resolve(ins: &[Ins], t: &Targets) -> Result<Vec<libc::sock_filter>, SeccompError> {
    let far = std::cell::Cell::new(None);
    let target = |l: Label, pc: usize| -> usize {
        match l {
            Label::Next => pc + 1,
            Label::Allow => t.allow,
            Label::Errno => t.errno,
            Label::Enosys => t.enosys,
            Label::Quiet(e) => t.quiet.iter().find(|q| q.0 == e).map_or(t.program, |q| q.1),
            Label::Program => t.program,
            Label::At(at) => at,
            Label::Mark(mk) => t
                .marks
                .iter()
                .find(|(x, _)| *x == mk)
                .map_or(t.program, |(_, at)| *at),
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
            bpf_jump(code, k, off(jt), off(jf))
        })
        .collect();
    if let Some(pc) = far.get() {
        return Err(SeccompError::Compile(format!(
            "prefilter: the jump at {pc} goes backwards or (conditional) over more than 255 instructions"
        )));
    }
    Ok(out)
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
