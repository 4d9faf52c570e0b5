//! `io_uring_setup(2)` as the probe uses it (the IPC ring itself goes through the `io-uring`
//! crate in `ipc/ring`).

use nix::errno::Errno;

use super::fd_result;

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
