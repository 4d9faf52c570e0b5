//! `bpf(2)` as the probe uses it: load a two-instruction program of a given type and close it,
//! create a one-page ring buffer and close it. Nothing is attached. (The daemon's own BPF
//! programs are loaded by aya and libbpf-rs in `enforce/`, not here.) Kernel ABI structs from
//! `include/uapi/linux/bpf.h`.

use std::os::fd::OwnedFd;

use nix::errno::Errno;

use super::fd_result;

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
