//! The seccomp deny-list, kept as reviewable data in `seccomp-policy.json` (seccompiler's JSON
//! format) and compiled in the daemon to classic BPF before the agent is cloned. The child only
//! installs the prepared programs.
//!
//! Two programs are installed: `agent` (listed syscalls fail with EPERM) and `agent_enosys`
//! (`clone3` fails with ENOSYS so that libc falls back to `clone`, whose flags a filter can
//! read). In front of both the daemon puts a check that refuses the x32 ABI (syscall numbers
//! with bit 30 set), which would otherwise name the same syscalls under other numbers;
//! seccompiler's own architecture check kills a process that makes i386 (`int 0x80`) calls.

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
    let arch = TargetArch::x86_64;
    let mut map = seccompiler::compile_from_json(POLICY_JSON.as_bytes(), arch)
        .map_err(|e| SeccompError::Compile(e.to_string()))?;
    let mut out = Vec::new();
    for (i, name) in FILTERS.iter().enumerate() {
        let prog = map.remove(*name).ok_or(SeccompError::Missing(name))?;
        let mut v: Vec<libc::sock_filter> = Vec::with_capacity(prog.len() + 3);
        if i == 0 {
            // ld [0] (nr); jge X32 -> errno(ENOSYS) : next
            v.push(bpf_stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0));
            v.push(bpf_jump(
                libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K,
                X32_SYSCALL_BIT,
                0,
                1,
            ));
            v.push(bpf_stmt(
                libc::BPF_RET | libc::BPF_K,
                SECCOMP_RET_ERRNO | libc::ENOSYS as u32,
            ));
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

/// The syscall names the policy denies, for documentation and `agentctl status`.
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
        for s in ["execve", "read", "write", "clone", "exit_group"] {
            // clone is only denied with CLONE_NEWUSER (an argument rule)
            let plain = names.iter().filter(|n| *n == s).count();
            assert!(s == "clone" || plain == 0, "{s} must stay allowed");
        }
    }
}
