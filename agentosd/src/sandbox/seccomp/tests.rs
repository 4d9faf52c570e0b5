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
