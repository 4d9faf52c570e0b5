use super::prefilter::*;
use super::*;

/// A classic-BPF interpreter for the instructions seccompiler and the prefilter use,
/// over `struct seccomp_data` (nr, arch, ip, args).
fn run(prog: &[libc::sock_filter], nr: u32, arch: u32, args: [u64; 6]) -> u32 {
    run_counted(prog, nr, arch, args).0
}

/// [`run`], and how many instructions it took.
fn run_counted(prog: &[libc::sock_filter], nr: u32, arch: u32, args: [u64; 6]) -> (u32, usize) {
    let mut data = [0u8; 64];
    data[0..4].copy_from_slice(&nr.to_ne_bytes());
    data[4..8].copy_from_slice(&arch.to_ne_bytes());
    for (i, a) in args.iter().enumerate() {
        data[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_ne_bytes());
    }
    let (mut acc, mut pc, mut steps) = (0u32, 0usize, 0usize);
    loop {
        let f = prog[pc];
        let code = f.code as u32;
        pc += 1;
        steps += 1;
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
            c if c == RET_K => return (f.k, steps),
            c => panic!("unsupported instruction {c:#x} at {}", pc - 1),
        }
    }
}

/// Arguments every comparison runs: none, `CLONE_NEWUSER` alone and with other bits, all ones,
/// `F_SETLEASE` as the second.
const ARG_CASES: [[u64; 6]; 5] = [
    [0; 6],
    [libc::CLONE_NEWUSER as u64, 0, 0, 0, 0, 0],
    [u64::MAX; 6],
    [libc::CLONE_NEWUSER as u64 | 0xff, 1, 2, 3, 4, 5],
    [1, libc::F_SETLEASE as u64, libc::F_WRLCK as u64, 0, 0, 0],
];

#[test]
fn prefilter_decides_like_the_plain_program() {
    // seccompiler's own program for `agent` (FILTERS[0]).
    let plain = plain_programs(POLICY_JSON).swap_remove(0);
    let fast = &compile(NetShape::for_grants(true, true)).unwrap()[0];
    let mut denied = 0;
    for nr in 0..600u32 {
        for args in ARG_CASES {
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
            for (any_family, any_inet_protocol) in [(false, false), (true, false), (false, true)] {
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

/// What the daemon installs comes from the per-shape cache: it must be the compiled program,
/// instruction for instruction, for every shape, and a tool's is the least strict agent's.
#[test]
fn cached_programs_are_the_compiled_ones() {
    let same = |a: &[Vec<libc::sock_filter>], b: &[Vec<libc::sock_filter>]| {
        a.len() == b.len()
            && a.iter().zip(b).all(|(p, q)| {
                p.len() == q.len()
                    && p.iter()
                        .zip(q)
                        .all(|(x, y)| (x.code, x.jt, x.jf, x.k) == (y.code, y.jt, y.jf, y.k))
            })
    };
    for (connect, bind) in [(false, false), (true, false), (false, true), (true, true)] {
        let shape = NetShape::for_grants(connect, bind);
        let fresh = compile(shape).unwrap();
        // Twice: the first fills the cache, the second reads it back.
        assert!(same(&compiled_for(shape).unwrap(), &fresh), "{shape:?}");
        assert!(same(&compiled_for(shape).unwrap(), &fresh), "{shape:?}");
    }
    let tool = compiled().unwrap();
    assert!(same(
        &tool,
        &compile(NetShape::for_grants(true, true)).unwrap()
    ));
    // Not trivially so: the strictest and the least strict shapes differ.
    assert!(!same(
        &compiled_for(NetShape::for_grants(false, false)).unwrap(),
        &tool
    ));
}

/// The prefilter decides a syscall in a handful of instructions (a binary search, not a scan of
/// the denied list): every syscall it decides itself, denied or allowed, within 16.
#[test]
fn the_prefilter_decides_in_a_few_instructions() {
    let split = split_rules(POLICY_JSON, FILTERS[0]).unwrap();
    let prog = &compile(NetShape::for_grants(true, true)).unwrap()[0];
    let socket_rules = [libc::SYS_socket, libc::SYS_socketpair, libc::SYS_listen].map(|n| n as u32);
    let mut worst = (0, 0);
    for nr in (0..600u32).filter(|n| !split.conditional.contains(n) && !socket_rules.contains(n)) {
        let (_, steps) = run_counted(prog, nr, AUDIT_ARCH_X86_64, [0; 6]);
        worst = worst.max((steps, nr));
    }
    assert!(
        worst.0 <= 16,
        "syscall {} takes {} instructions to decide ({} denied outright)",
        worst.1,
        worst.0,
        split.always.len()
    );
}

/// A syscall with a rule without arguments is always denied: its argument rules are dropped
/// (they could not allow more) and it is not sent on to the argument checks.
#[test]
fn an_unconditional_rule_outranks_argument_rules_of_the_same_syscall() {
    let json = r#"{"agent": {"default_action": "allow", "filter_action": {"errno": 1}, "filter": [
        {"syscall": "ptrace"},
        {"syscall": "ptrace", "args": [{"index": 0, "type": "dword", "op": "eq", "val": 0}]},
        {"syscall": "unshare", "args": [{"index": 0, "type": "dword", "op": "eq", "val": 1}]}
    ]}}"#;
    let split = split_rules(json, "agent").unwrap();
    let (ptrace, unshare) = (libc::SYS_ptrace as u32, libc::SYS_unshare as u32);
    assert_eq!(split.always, vec![ptrace]);
    assert_eq!(split.conditional, vec![unshare]);
    let rest: serde_json::Value = serde_json::from_str(&split.rest).unwrap();
    let kept = rest["agent"]["filter"].as_array().unwrap();
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(kept[0]["syscall"], "unshare");
}

/// `socket`, `socketpair` and `listen` belong to the socket rules: a JSON rule for any of them,
/// with or without arguments, fails the compile instead of being silently outranked.
#[test]
fn a_json_rule_for_a_socket_syscall_is_refused() {
    for (name, args) in [
        ("socket", ""),
        (
            "listen",
            r#", "args": [{"index": 1, "type": "dword", "op": "eq", "val": 0}]"#,
        ),
        (
            "socketpair",
            r#", "args": [{"index": 0, "type": "dword", "op": "eq", "val": 1}]"#,
        ),
    ] {
        let json = format!(
            r#"{{"agent": {{"default_action": "allow", "filter_action": {{"errno": 1}}, "filter": [{{"syscall": "{name}"{args}}}]}},
                "agent_enosys": {{"default_action": "allow", "filter_action": {{"errno": 38}}, "filter": [{{"syscall": "clone3"}}]}}}}"#
        );
        let e = compile_policy(&json, NetShape::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("decided by the socket rules"), "{name}: {e}");
    }
}

/// The filters' verdict as the kernel combines them (`seccomp_run_filters`, and
/// Documentation/userspace-api/seccomp_filter.rst, "Return values"): every filter runs, the most
/// recently installed first; the action with the highest precedence wins (the lowest
/// `SECCOMP_RET_ACTION_FULL` bits as a signed number: KILL_PROCESS < … < ERRNO < … < ALLOW), and
/// of equal actions the data of the filter installed last (the one evaluated first: a later
/// filter replaces the result only when strictly more restrictive). `progs` in install order.
fn chain(progs: &[&[libc::sock_filter]], nr: u32, arch: u32, args: [u64; 6]) -> u32 {
    let action = |r: u32| (r & 0xffff_0000) as i32;
    let mut ret = SECCOMP_RET_ALLOW;
    for p in progs.iter().rev() {
        let cur = run(p, nr, arch, args);
        if action(cur) < action(ret) {
            ret = cur;
        }
    }
    ret
}

fn plain_programs(json: &str) -> Vec<Vec<libc::sock_filter>> {
    let mut m = seccompiler::compile_from_json(json.as_bytes(), TargetArch::x86_64).unwrap();
    FILTERS
        .iter()
        .map(|f| {
            m.remove(*f)
                .unwrap()
                .into_iter()
                .map(super::to_libc)
                .collect()
        })
        .collect()
}

/// Syscall numbers, architectures and arguments every comparison below runs.
fn all_cases() -> Vec<(u32, u32, [u64; 6])> {
    let arg_cases = ARG_CASES.into_iter().chain([
        [libc::AF_INET as u64, 1, 6, 0, 0, 0],
        [libc::AF_PACKET as u64, 3, 0, 0x10, 0, 0],
        [0, 8, 0, 0, 0, 0],
    ]);
    let arg_cases: Vec<[u64; 6]> = arg_cases.collect();
    let mut out = Vec::new();
    for nr in (0..600u32).chain((0..600u32).map(|n| n | X32_SYSCALL_BIT)) {
        for arch in [AUDIT_ARCH_X86_64, 0x4000_0003] {
            for &args in &arg_cases {
                out.push((nr, arch, args));
            }
        }
    }
    out
}

/// What the installed programs must decide, from seccompiler's compile of the whole policy
/// (every filter, in order, combined as the kernel does), with the two decisions seccompiler
/// does not make: the socket rules ([`socket_verdict`]) and the refusal of x32 numbers.
fn want(plain: &[Vec<libc::sock_filter>], shape: NetShape, nr: u32, arch: u32, a: [u64; 6]) -> u32 {
    let rest: Vec<&[libc::sock_filter]> = plain[1..].iter().map(|p| p.as_slice()).collect();
    let first = match socket_verdict(shape, nr, [a[0] as u32, a[1] as u32, a[2] as u32]) {
        _ if arch != AUDIT_ARCH_X86_64 => run(&plain[0], nr, arch, a),
        _ if nr & X32_SYSCALL_BIT != 0 => SECCOMP_RET_ERRNO | libc::ENOSYS as u32,
        Some(v) => v,
        None => run(&plain[0], nr, arch, a),
    };
    // The first filter's verdict as a one-instruction program, then the others.
    let ret = [libc::sock_filter {
        code: RET_K as u16,
        jt: 0,
        jf: 0,
        k: first,
    }];
    let mut progs: Vec<&[libc::sock_filter]> = vec![&ret];
    progs.extend(rest);
    chain(&progs, nr, arch, a)
}

/// The programs the daemon installs, combined as the kernel combines them, and the single
/// program of [`compile_single`] decide every syscall number (x32 ones included), architecture
/// and argument case like seccompiler's compile of the whole policy; with the broker's filter
/// installed last, too.
#[test]
fn installed_programs_decide_like_the_whole_policy() {
    let plain = plain_programs(POLICY_JSON);
    let notify = crate::sandbox::sockets::notify_filter();
    let cases = all_cases();
    for (connect, bind) in [(false, false), (true, false), (false, true), (true, true)] {
        let shape = NetShape::for_grants(connect, bind);
        let progs = compile(shape).unwrap();
        assert_eq!(progs.len(), FILTERS.len());
        let installed: Vec<&[libc::sock_filter]> = progs.iter().map(|p| p.as_slice()).collect();
        let single = compile_single(shape).unwrap();
        let mut brokered = installed.clone();
        brokered.push(&notify);
        let mut denied = 0;
        for &(nr, arch, a) in &cases {
            let w = want(&plain, shape, nr, arch, a);
            let got = chain(&installed, nr, arch, a);
            assert_eq!(got, w, "{shape:?} nr {nr:#x} arch {arch:#x} args {a:?}");
            assert_eq!(
                run(&single, nr, arch, a),
                w,
                "single: {shape:?} nr {nr:#x} arch {arch:#x} args {a:?}"
            );
            let mut plain_b: Vec<&[libc::sock_filter]> = vec![&single];
            plain_b.push(&notify);
            assert_eq!(chain(&brokered, nr, arch, a), chain(&plain_b, nr, arch, a));
            denied += (w != SECCOMP_RET_ALLOW) as u32;
        }
        assert!(denied > 60 * 7, "{denied}");
    }
    let enosys = SECCOMP_RET_ERRNO | libc::ENOSYS as u32;
    for n in [
        libc::SYS_clone3,
        libc::SYS_inotify_init,
        libc::SYS_inotify_init1,
    ] {
        let single = compile_single(NetShape::default()).unwrap();
        assert_eq!(run(&single, n as u32, AUDIT_ARCH_X86_64, [0; 6]), enosys);
    }
}

/// Precedence where both filters have rules for the same syscall: the later filter's errno
/// wins over the first's (equal actions: the filter installed last) and over its argument
/// rules; folded into one program, the same.
#[test]
fn a_later_filters_errno_wins_for_a_syscall_both_deny() {
    let json = r#"{"agent": {"default_action": "allow", "filter_action": {"errno": 1}, "filter": [
        {"syscall": "ptrace"}, {"syscall": "mount"},
        {"syscall": "clone", "args": [{"index": 0, "type": "qword", "op": {"masked_eq": 268435456}, "val": 268435456}]}
    ]}, "agent_enosys": {"default_action": "allow", "filter_action": {"errno": 38}, "filter": [
        {"syscall": "ptrace"}, {"syscall": "clone"}, {"syscall": "clone3"}
    ]}}"#;
    let plain = plain_programs(json);
    let split = split_rules(json, FILTERS[0]).unwrap();
    let quiet = quiet_rules(json, &FILTERS[1..]).unwrap();
    let mut map =
        seccompiler::compile_from_json(split.rest.as_bytes(), TargetArch::x86_64).unwrap();
    let mut single = prefilter(
        &split.always,
        &split.conditional,
        split.errno,
        &quiet,
        NetShape::for_grants(true, true),
    )
    .unwrap();
    single.extend(map.remove("agent").unwrap().into_iter().map(super::to_libc));
    let shape = NetShape::for_grants(true, true);
    for (nr, arch, a) in all_cases() {
        assert_eq!(
            run(&single, nr, arch, a),
            want(&plain, shape, nr, arch, a),
            "nr {nr:#x} arch {arch:#x} {a:?}"
        );
    }
    let e = |e: i32| SECCOMP_RET_ERRNO | e as u32;
    let at = |nr: i64, a0: u64| run(&single, nr as u32, AUDIT_ARCH_X86_64, [a0, 0, 0, 0, 0, 0]);
    assert_eq!(at(libc::SYS_ptrace, 0), e(libc::ENOSYS));
    assert_eq!(
        at(libc::SYS_clone, libc::CLONE_NEWUSER as u64),
        e(libc::ENOSYS)
    );
    assert_eq!(at(libc::SYS_clone, 0), e(libc::ENOSYS));
    assert_eq!(at(libc::SYS_mount, 0), e(libc::EPERM));
    // Argument rules in a filter after the first cannot be folded: the compile says so.
    let bad = json.replace(
        r#"{"syscall": "clone3"}"#,
        r#"{"syscall": "clone3", "args": [{"index": 0, "type": "dword", "op": "eq", "val": 1}]}"#,
    );
    let err = quiet_rules(&bad, &FILTERS[1..]).unwrap_err().to_string();
    assert!(err.contains("only supported in the first filter"), "{err}");
}

/// What installing each program costs, in a forked child as the agent's child does it (with
/// `no_new_privs`, the first program with `SECCOMP_FILTER_FLAG_LOG`, the broker's with a
/// listener): the programs of [`compile`], the broker's, and [`compile_single`] instead of the
/// first two. `cargo test -p agentosd --lib install_cost -- --ignored --nocapture`.
#[test]
#[ignore = "a measurement: run it alone"]
fn install_cost() {
    use crate::sys::seccomp::{SECCOMP_FILTER_FLAG_LOG, set_mode_filter};
    let shape = NetShape::for_grants(false, false);
    let progs = compile(shape).unwrap();
    let single = compile_single(shape).unwrap();
    let notify = crate::sandbox::sockets::notify_filter();
    let listener = libc::SECCOMP_FILTER_FLAG_NEW_LISTENER as libc::c_uint;
    /// A layout: its name and the programs installed, in order, with their flags.
    type Layout<'a> = (&'a str, Vec<(&'a [libc::sock_filter], libc::c_uint)>);
    let configs: Vec<Layout> = vec![
        (
            "two (agent, agent_enosys)",
            vec![(&progs[0], SECCOMP_FILTER_FLAG_LOG), (&progs[1], 0)],
        ),
        ("single", vec![(&single, SECCOMP_FILTER_FLAG_LOG)]),
        (
            "two + broker",
            vec![
                (&progs[0], SECCOMP_FILTER_FLAG_LOG),
                (&progs[1], 0),
                (&notify, listener),
            ],
        ),
        (
            "single + broker",
            vec![(&single, SECCOMP_FILTER_FLAG_LOG), (&notify, listener)],
        ),
    ];
    let split = split_rules(POLICY_JSON, FILTERS[0]).unwrap();
    let pre = prefilter(&split.always, &split.conditional, split.errno, &[], shape).unwrap();
    eprintln!(
        "agent: {} instructions, of them the prefilter (search and socket section) {}",
        progs[0].len(),
        pre.len()
    );
    let runs = 300;
    let mut times: Vec<Vec<Vec<u64>>> = configs
        .iter()
        .map(|c| vec![Vec::new(); c.1.len() + 1])
        .collect();
    for _ in 0..runs {
        for (ci, (_, list)) in configs.iter().enumerate() {
            let fprogs: Vec<(libc::sock_fprog, libc::c_uint)> = list
                .iter()
                .map(|(p, f)| {
                    (
                        libc::sock_fprog {
                            len: p.len() as u16,
                            filter: p.as_ptr() as *mut _,
                        },
                        *f,
                    )
                })
                .collect();
            let mut fds = [0; 2];
            // SAFETY: pipe writes two fds into the live array.
            assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
            // SAFETY: the child makes only async-signal-safe calls on memory prepared before the
            // fork (prctl, clock_gettime, seccomp, write, _exit).
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                // SAFETY: as above: the child only makes these calls, then `_exit`s.
                unsafe {
                    let now = || {
                        let mut ts: libc::timespec = std::mem::zeroed();
                        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
                        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
                    };
                    libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
                    let mut out = [0u64; 8];
                    let t0 = now();
                    let mut t = t0;
                    for (i, (fp, flags)) in fprogs.iter().enumerate() {
                        if set_mode_filter(*flags, fp) < 0 {
                            libc::_exit(1);
                        }
                        let t1 = now();
                        out[i] = t1 - t;
                        t = t1;
                    }
                    out[fprogs.len()] = t - t0;
                    libc::write(fds[1], out.as_ptr() as *const libc::c_void, 64);
                    libc::_exit(0);
                }
            }
            let mut out = [0u64; 8];
            // SAFETY: reads into / waits on what this test owns.
            unsafe {
                libc::close(fds[1]);
                assert_eq!(
                    libc::read(fds[0], out.as_mut_ptr() as *mut libc::c_void, 64),
                    64
                );
                libc::close(fds[0]);
                let mut st = 0;
                libc::waitpid(pid, &mut st, 0);
                assert_eq!(st, 0);
            }
            for (i, v) in times[ci].iter_mut().enumerate() {
                v.push(out[i]);
            }
        }
    }
    let pct = |v: &mut Vec<u64>, p: usize| {
        v.sort_unstable();
        v[(v.len() - 1) * p / 100] as f64 / 1000.0
    };
    for ((name, list), t) in configs.iter().zip(times.iter_mut()) {
        let n = list.len();
        let parts: Vec<String> = (0..n)
            .map(|i| format!("{} insns {:.1}", list[i].0.len(), pct(&mut t[i], 50)))
            .collect();
        let total = &mut t[n];
        eprintln!(
            "{name}: total p50 {:.1} µs p90 {:.1} p99 {:.1}; per program p50: {}",
            pct(total, 50),
            pct(total, 90),
            pct(total, 99),
            parts.join(", ")
        );
    }
}
