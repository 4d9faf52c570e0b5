//! Raw syscalls used by the probe, each in a small safe wrapper.
//!
//! Neither `nix` nor `rustix` wraps `bpf(2)`, `sched_setattr(2)`, `io_uring_setup(2)`,
//! `landlock_create_ruleset(2)`, `seccomp(2)` or `clone3(2)` the way the probe needs them, so the
//! kernel ABI structs are declared here (layouts from `include/uapi/linux/*.h`) and every call
//! returns `Result<_, Errno>`. Every file descriptor comes back as an [`OwnedFd`] so it is closed
//! on drop; nothing here attaches a BPF program or changes anything outside the calling thread
//! (or a child that exits at once).

use std::os::fd::{FromRawFd, OwnedFd, RawFd};

use nix::errno::Errno;

// ---------------------------------------------------------------------------------------------
// bpf(2)

const BPF_MAP_CREATE: libc::c_int = 0;
const BPF_PROG_LOAD: libc::c_int = 5;

/// `enum bpf_prog_type` values we probe.
pub const BPF_PROG_TYPE_CGROUP_SKB: u32 = 8;
pub const BPF_PROG_TYPE_TRACEPOINT: u32 = 5;
pub const BPF_PROG_TYPE_RAW_TRACEPOINT: u32 = 17;
pub const BPF_PROG_TYPE_CGROUP_SOCK_ADDR: u32 = 18;
pub const BPF_PROG_TYPE_TRACING: u32 = 26;
pub const BPF_PROG_TYPE_LSM: u32 = 29;

/// `enum bpf_attach_type` values we probe.
pub const BPF_CGROUP_INET_EGRESS: u32 = 1;
pub const BPF_CGROUP_INET4_CONNECT: u32 = 10;
pub const BPF_TRACE_RAW_TP: u32 = 23;
pub const BPF_TRACE_FENTRY: u32 = 24;
pub const BPF_LSM_MAC: u32 = 27;

/// `enum bpf_map_type`: `BPF_MAP_TYPE_RINGBUF`.
pub const BPF_MAP_TYPE_RINGBUF: u32 = 27;

/// The `BPF_PROG_LOAD` member of `union bpf_attr`, up to `core_relo_cnt` (kernel 5.17+ layout;
/// older kernels accept it as long as the fields they do not know are zero).
#[repr(C)]
#[derive(Default)]
struct BpfProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
    prog_btf_fd: u32,
    func_info_rec_size: u32,
    func_info: u64,
    func_info_cnt: u32,
    line_info_rec_size: u32,
    line_info: u64,
    line_info_cnt: u32,
    attach_btf_id: u32,
    attach_prog_fd: u32,
    core_relo_cnt: u32,
}
const _: () = assert!(std::mem::size_of::<BpfProgLoadAttr>() == 120);

/// The `BPF_MAP_CREATE` member of `union bpf_attr`, up to `map_extra`.
#[repr(C)]
#[derive(Default)]
struct BpfMapCreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    inner_map_fd: u32,
    numa_node: u32,
    map_name: [u8; 16],
    map_ifindex: u32,
    btf_fd: u32,
    btf_key_type_id: u32,
    btf_value_type_id: u32,
    btf_vmlinux_value_type_id: u32,
    map_extra: u64,
}
const _: () = assert!(std::mem::size_of::<BpfMapCreateAttr>() == 72);

/// What to load: a program type, its expected attach type and BTF target.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProgSpec {
    pub prog_type: u32,
    pub expected_attach_type: u32,
    /// BTF type id in vmlinux of the hook (LSM, fentry, tp_btf); 0 when not needed.
    pub attach_btf_id: u32,
    /// Value the program returns (`r0`): must be in the range the verifier allows for the type.
    pub ret: i32,
}

/// A refused `BPF_PROG_LOAD`: the errno and the last line of the verifier log, if any.
#[derive(Debug, Clone)]
pub struct LoadError {
    pub errno: Errno,
    pub log: Option<String>,
}

/// Loads `mov r0, ret; exit` as the given program type and closes it again.
pub fn bpf_prog_load_trivial(spec: ProgSpec) -> Result<(), LoadError> {
    // struct bpf_insn { u8 code; u8 dst:4, src:4; s16 off; s32 imm } as little-endian u64.
    // BPF_ALU64 | BPF_MOV | BPF_K = 0xb7 (dst r0), BPF_JMP | BPF_EXIT = 0x95.
    let insns: [u64; 2] = [0xb7 | (u64::from(spec.ret as u32) << 32), 0x95];
    let license = c"GPL";
    let mut log = vec![0u8; 4096];
    let mut attr = BpfProgLoadAttr {
        prog_type: spec.prog_type,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level: 1,
        log_size: log.len() as u32,
        log_buf: log.as_mut_ptr() as u64,
        expected_attach_type: spec.expected_attach_type,
        attach_btf_id: spec.attach_btf_id,
        ..Default::default()
    };
    attr.prog_name[..13].copy_from_slice(b"agentos_probe");
    let res = bpf(BPF_PROG_LOAD, &mut attr);
    match res {
        Ok(fd) => {
            drop(fd);
            Ok(())
        }
        Err(errno) => {
            let text = String::from_utf8_lossy(
                &log[..log.iter().position(|&b| b == 0).unwrap_or(log.len())],
            )
            .into_owned();
            let last = text
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .map(|l| l.trim().to_string());
            Err(LoadError { errno, log: last })
        }
    }
}

/// Creates a `BPF_MAP_TYPE_RINGBUF` of one page and closes it.
pub fn bpf_ringbuf_create() -> Result<(), Errno> {
    // SAFETY: sysconf has no memory-safety preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    let mut attr = BpfMapCreateAttr {
        map_type: BPF_MAP_TYPE_RINGBUF,
        max_entries: u32::try_from(page).unwrap_or(4096),
        ..Default::default()
    };
    attr.map_name[..13].copy_from_slice(b"agentos_probe");
    bpf(BPF_MAP_CREATE, &mut attr).map(drop)
}

fn bpf<T>(cmd: libc::c_int, attr: &mut T) -> Result<OwnedFd, Errno> {
    // SAFETY: `attr` is a live, initialised `#[repr(C)]` prefix of `union bpf_attr` whose size we
    // pass; every pointer inside it points to buffers that outlive the call (the caller's
    // stack/heap), and the kernel only reads them or writes the log within `log_size`.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T as *mut libc::c_void,
            std::mem::size_of::<T>() as libc::c_uint,
        )
    };
    fd_result(ret)
}

fn fd_result(ret: libc::c_long) -> Result<OwnedFd, Errno> {
    if ret < 0 {
        return Err(Errno::last());
    }
    let fd = RawFd::try_from(ret).map_err(|_| Errno::EOVERFLOW)?;
    // SAFETY: the syscall returned a new file descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

// ---------------------------------------------------------------------------------------------
// landlock_create_ruleset(2)

const LANDLOCK_CREATE_RULESET_VERSION: u32 = 1;

/// Landlock ABI version of the running kernel.
pub fn landlock_abi_version() -> Result<u32, Errno> {
    // SAFETY: with a NULL attr, size 0 and the VERSION flag the kernel reads no memory and
    // returns the ABI version (no file descriptor is created).
    let ret = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if ret < 0 {
        Err(Errno::last())
    } else {
        u32::try_from(ret).map_err(|_| Errno::EOVERFLOW)
    }
}

// ---------------------------------------------------------------------------------------------
// seccomp(2), prctl(PR_GET_SECCOMP)

const SECCOMP_GET_ACTION_AVAIL: libc::c_uint = 2;
const SECCOMP_GET_NOTIF_SIZES: libc::c_uint = 3;

pub const SECCOMP_RET_KILL_PROCESS: u32 = 0x8000_0000;
pub const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
pub const SECCOMP_RET_USER_NOTIF: u32 = 0x7fc0_0000;
pub const SECCOMP_RET_LOG: u32 = 0x7ffc_0000;

/// The calling thread's seccomp mode: 0 none, 1 strict, 2 filter.
pub fn seccomp_mode() -> Result<i32, Errno> {
    // SAFETY: PR_GET_SECCOMP takes no pointer arguments.
    let ret = unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) };
    if ret < 0 { Err(Errno::last()) } else { Ok(ret) }
}

/// Whether the kernel knows the filter return action `action`.
pub fn seccomp_action_avail(action: u32) -> Result<(), Errno> {
    // SAFETY: the kernel reads one u32 from a pointer to a live local.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            SECCOMP_GET_ACTION_AVAIL,
            0u32,
            &action as *const u32,
        )
    };
    if ret < 0 { Err(Errno::last()) } else { Ok(()) }
}

/// `struct seccomp_notif_sizes`: (notif, resp, data) sizes, proves the user-notify API exists.
pub fn seccomp_notif_sizes() -> Result<(u16, u16, u16), Errno> {
    let mut sizes = [0u16; 3];
    // SAFETY: the kernel writes a `struct seccomp_notif_sizes` (three u16) into `sizes`.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            SECCOMP_GET_NOTIF_SIZES,
            0u32,
            sizes.as_mut_ptr(),
        )
    };
    if ret < 0 {
        Err(Errno::last())
    } else {
        Ok((sizes[0], sizes[1], sizes[2]))
    }
}

// ---------------------------------------------------------------------------------------------
// sched_setattr(2)

pub const SCHED_OTHER: u32 = 0;
pub const SCHED_DEADLINE: u32 = 6;

#[repr(C)]
#[derive(Default)]
struct SchedAttr {
    size: u32,
    sched_policy: u32,
    sched_flags: u64,
    sched_nice: i32,
    sched_priority: u32,
    sched_runtime: u64,
    sched_deadline: u64,
    sched_period: u64,
}
const _: () = assert!(std::mem::size_of::<SchedAttr>() == 48);

/// Sets the calling thread's policy (tid 0). Deadline parameters are in nanoseconds.
pub fn sched_setattr_self(
    policy: u32,
    runtime: u64,
    deadline: u64,
    period: u64,
) -> Result<(), Errno> {
    let attr = SchedAttr {
        size: std::mem::size_of::<SchedAttr>() as u32,
        sched_policy: policy,
        sched_runtime: runtime,
        sched_deadline: deadline,
        sched_period: period,
        ..Default::default()
    };
    // SAFETY: the kernel reads `attr.size` bytes from a live local of exactly that size.
    let ret = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0u32) };
    if ret < 0 { Err(Errno::last()) } else { Ok(()) }
}

// ---------------------------------------------------------------------------------------------
// io_uring_setup(2)

/// `struct io_uring_params` (120 bytes); the offsets structs are opaque here.
#[repr(C)]
struct IoUringParams {
    sq_entries: u32,
    cq_entries: u32,
    flags: u32,
    sq_thread_cpu: u32,
    sq_thread_idle: u32,
    features: u32,
    wq_fd: u32,
    resv: [u32; 3],
    sq_off: [u32; 10],
    cq_off: [u32; 10],
}
const _: () = assert!(std::mem::size_of::<IoUringParams>() == 120);

/// Sets up a ring of `entries` and closes it; returns the `features` bitmask.
pub fn io_uring_probe(entries: u32) -> Result<u32, Errno> {
    let mut params = IoUringParams {
        sq_entries: 0,
        cq_entries: 0,
        flags: 0,
        sq_thread_cpu: 0,
        sq_thread_idle: 0,
        features: 0,
        wq_fd: 0,
        resv: [0; 3],
        sq_off: [0; 10],
        cq_off: [0; 10],
    };
    // SAFETY: the kernel reads and writes a `struct io_uring_params` in a live local.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_io_uring_setup,
            entries,
            &mut params as *mut IoUringParams,
        )
    };
    let fd = fd_result(ret)?;
    drop(fd);
    Ok(params.features)
}

// ---------------------------------------------------------------------------------------------
// pidfd_open(2), clone3(2)

/// Opens a pidfd for this process and closes it.
pub fn pidfd_open_self() -> Result<(), Errno> {
    // SAFETY: getpid has no preconditions; pidfd_open takes no pointers.
    let ret = unsafe { libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0u32) };
    fd_result(ret).map(drop)
}

const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}
const _: () = assert!(std::mem::size_of::<CloneArgs>() == 88);

/// `clone3(CLONE_INTO_CGROUP)` with `cgroup_fd`: the child `_exit`s at once and is reaped.
/// With a negative `cgroup_fd` no child can be created: a kernel that knows the flag answers
/// `EBADF`, one that does not answers `EINVAL` (or `ENOSYS` without clone3).
pub fn clone3_into_cgroup(cgroup_fd: RawFd) -> Result<(), Errno> {
    let args = CloneArgs {
        flags: CLONE_INTO_CGROUP,
        // No exit signal: the child is a "clone" child that only `__WALL` waits see, so a
        // daemon-wide `waitpid(-1)` reaper cannot steal it and no SIGCHLD is raised.
        exit_signal: 0,
        cgroup: cgroup_fd as u64,
        ..Default::default()
    };
    // SAFETY: clone3 without CLONE_VM behaves like fork: the child gets a copy of the address
    // space and runs only `_exit`, which is async-signal-safe, so no lock or allocator state
    // inherited from other threads is touched. The parent reaps the child below.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &args as *const CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    if ret == 0 {
        // SAFETY: we are the child; `_exit` never returns and runs no atexit handlers.
        unsafe { libc::_exit(0) };
    }
    if ret < 0 {
        return Err(Errno::last());
    }
    let pid = libc::pid_t::try_from(ret).map_err(|_| Errno::EOVERFLOW)?;
    match nix::sys::wait::waitpid(
        nix::unistd::Pid::from_raw(pid),
        Some(nix::sys::wait::WaitPidFlag::__WALL),
    ) {
        Ok(_) | Err(Errno::ECHILD) => Ok(()),
        Err(e) => Err(e),
    }
}
