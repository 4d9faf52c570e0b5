//! x86-64 syscall numbers of the names the policy uses, and back (the kernel's seccomp audit
//! records give only the number).

use super::denied_syscalls;

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
pub(super) fn syscall_nr(name: &str) -> Option<libc::c_long> {
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
        "inotify_init" => SYS_inotify_init,
        "inotify_init1" => SYS_inotify_init1,
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
        "fcntl" => SYS_fcntl,
        "memfd_create" => SYS_memfd_create,
        "socket" => SYS_socket,
        "socketpair" => SYS_socketpair,
        "listen" => SYS_listen,
        _ => return None,
    })
}
