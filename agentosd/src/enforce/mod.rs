//! Kernel enforcement with BPF: programs in C under `ebpf/`, compiled by `build.rs` and embedded,
//! loaded with aya. `net`: cgroup sock_addr programs (`connect4/6`, `sendmsg4/6`) on the daemon's
//! `agents/` cgroup with a policy map keyed by cgroup id and denials to a ring buffer that the
//! daemon appends to the audit trail. `fs`: BPF LSM `file_open` and `bprm_check_security`
//! enforcing the agents' filesystem scopes (the Landlock plan) where the kernel allows BPF LSM.
//! `sysc`: opt-in per-agent syscall counts on the global syscall-entry hook (`--syscall-counts`).
//! `kaudit`: Landlock and seccomp denials of agents, read
//! from the kernel's audit log. See docs/audit.md ("Kernel denials").

pub mod fs;
pub mod kaudit;
pub mod net;
pub mod sysc;

/// The causes of an error (aya's load errors keep the kernel's verifier text there), each after
/// ": ".
fn source_chain(e: &dyn std::error::Error) -> String {
    let mut s = String::new();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
