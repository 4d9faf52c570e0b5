//! `clone3(CLONE_VM | CLONE_VFORK)` on a stack of the child's own: how agentosd starts a
//! process without copying its own address space.
//!
//! A `clone3` without `CLONE_VM` is a `fork()`: the kernel copies the daemon's page tables
//! (every page of its heap marked copy-on-write, then unmapped again by the child's `execve`,
//! and every page the daemon writes afterwards faulted and copied). Measured on the host,
//! that was the largest share of the daemon's CPU per start, and it grows with the daemon:
//! at 10 000 agents the heap is ten times what it is at one (docs/benchmarks.md "The D-Bus
//! start path"). With `CLONE_VM` the child shares the daemon's memory until its `execve`, as
//! glibc's and musl's `posix_spawn` do; with `CLONE_VFORK` the calling thread waits until the
//! child has exec'd or exited, so the stack and the buffers the child reads stay alive and
//! unchanged. The child runs on a stack mapped for it ([`ChildStack`]) and enters a function
//! through a few lines of assembly (Rust cannot express a function that returns twice on two
//! stacks).
//!
//! What the child may do is stricter than after a fork: besides being async-signal-safe (no
//! allocation, no lock), it must not write to any memory but its own stack (the daemon's other
//! threads keep running in the same memory), it must not let a signal handler of the daemon's
//! run ([`reset_signal_handlers`], with every signal blocked across the clone by the caller),
//! and it must not use glibc calls that act on the daemon's threads (`setuid` and friends:
//! `sys::creds` makes them as raw per-thread system calls).

use std::ffi::c_void;

use super::clone::CloneArgs;

/// `CLONE_VM`: the child runs in the caller's memory.
const CLONE_VM: u64 = 0x100;
/// `CLONE_VFORK`: the caller sleeps until the child has exec'd or exited.
const CLONE_VFORK: u64 = 0x4000;

/// Whether this architecture has the trampoline (x86_64, aarch64); elsewhere spawn forks.
pub const AVAILABLE: bool = cfg!(any(target_arch = "x86_64", target_arch = "aarch64"));

/// The child's stack: 256 KiB (the child's deepest path, Landlock and seccomp set-up, needs a
/// few KiB; glibc's `posix_spawn` gives 32 KiB more than its arguments) above a guard page, so
/// an overflow faults instead of writing into the daemon's memory.
pub struct ChildStack {
    base: *mut c_void,
    len: usize,
}

const STACK_SIZE: usize = 256 * 1024;
const GUARD: usize = 4096;

impl ChildStack {
    pub fn new() -> std::io::Result<Self> {
        let len = STACK_SIZE + GUARD;
        // SAFETY: an anonymous private mapping of `len` bytes; no memory of ours is involved.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let stack = ChildStack { base, len };
        // SAFETY: the first page of the mapping made above; nothing lives there yet.
        if unsafe { libc::mprotect(base, GUARD, libc::PROT_NONE) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(stack)
    }

    /// The lowest usable byte and the usable size (16-byte aligned), as `clone3` wants them.
    fn range(&self) -> (u64, u64) {
        (self.base as u64 + GUARD as u64, STACK_SIZE as u64)
    }
}

impl Drop for ChildStack {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`; with CLONE_VFORK the child has exec'd or exited
        // before the parent can drop it.
        unsafe {
            libc::munmap(self.base, self.len);
        }
    }
}

/// `clone3(args)` with `CLONE_VM | CLONE_VFORK` added, the child on `stack` calling
/// `entry(arg)`, which must not return (it ends in `execve` or `_exit`; if it returned the child
/// would `exit` with its value). Returns in the parent only, after the child has exec'd or
/// exited: the child's PID, or -1 with `errno` set.
///
/// # Safety
/// Every pointer in `args` must be valid for the kernel to write; `arg` must stay valid until
/// the call returns. `entry` runs in the caller's memory while other threads run: see the
/// module's rules. The caller blocks every signal across the call (the child starts with the
/// caller's mask) and `entry` resets the handlers before unblocking any.
pub unsafe fn clone3_vfork(
    args: &mut CloneArgs,
    stack: &ChildStack,
    entry: unsafe extern "C" fn(*mut c_void) -> libc::c_int,
    arg: *mut c_void,
) -> libc::c_long {
    let (lo, size) = stack.range();
    args.flags |= CLONE_VM | CLONE_VFORK;
    args.stack = lo;
    args.stack_size = size;
    let size_of = std::mem::size_of::<CloneArgs>();
    // SAFETY: the caller upholds the contract above; the assembly is below per architecture.
    unsafe { raw_clone3(args as *mut CloneArgs, size_of, entry, arg) }
}

/// The system call and the child's first instructions: in the child (return value 0) the
/// stack pointer is the top of the new stack; clear the frame pointer, call `entry(arg)`, and
/// exit with what it returns should it return.
#[cfg(target_arch = "x86_64")]
unsafe fn raw_clone3(
    args: *mut CloneArgs,
    size: usize,
    entry: unsafe extern "C" fn(*mut c_void) -> libc::c_int,
    arg: *mut c_void,
) -> libc::c_long {
    let ret: libc::c_long;
    // SAFETY: clone3 with CLONE_VM and a stack: the parent continues after `syscall` with only
    // rax (result), rcx and r11 (clobbered by `syscall`) changed; the child continues at the
    // same instruction on the new, 16-byte aligned stack, so `call` leaves the callee the
    // alignment the ABI promises. r12 and r13 survive the system call in both.
    unsafe {
        std::arch::asm!(
            "syscall",
            "test rax, rax",
            "jnz 2f",
            "xor ebp, ebp",
            "mov rdi, r12",
            "call r13",
            "mov edi, eax",
            "mov eax, {exit}",
            "syscall",
            "ud2",
            "2:",
            exit = const libc::SYS_exit,
            inlateout("rax") libc::SYS_clone3 => ret,
            in("rdi") args,
            in("rsi") size,
            in("r12") arg,
            in("r13") entry,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret
}

#[cfg(target_arch = "aarch64")]
unsafe fn raw_clone3(
    args: *mut CloneArgs,
    size: usize,
    entry: unsafe extern "C" fn(*mut c_void) -> libc::c_int,
    arg: *mut c_void,
) -> libc::c_long {
    let ret: libc::c_long;
    // SAFETY: as on x86_64: the parent continues after `svc` with x0 (result) changed; the
    // child continues on the new 16-byte aligned stack; x20 and x21 survive the call.
    unsafe {
        std::arch::asm!(
            "svc #0",
            "cbnz x0, 2f",
            "mov x29, xzr",
            "mov x30, xzr",
            "mov x0, x20",
            "blr x21",
            "mov x8, {exit}",
            "svc #0",
            "brk #0",
            "2:",
            exit = const libc::SYS_exit,
            inlateout("x0") args => ret,
            in("x1") size,
            in("x8") libc::SYS_clone3,
            in("x20") arg,
            in("x21") entry,
            options(nostack),
        );
    }
    ret
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
unsafe fn raw_clone3(
    _args: *mut CloneArgs,
    _size: usize,
    _entry: unsafe extern "C" fn(*mut c_void) -> libc::c_int,
    _arg: *mut c_void,
) -> libc::c_long {
    // SAFETY: sets errno only.
    unsafe { *libc::__errno_location() = libc::ENOSYS };
    -1
}

/// Every signal blocked in the calling thread; the previous mask is restored on drop. Across a
/// [`clone3_vfork`], so that no signal reaches the child before it has reset the handlers it
/// shares with the daemon's memory.
pub struct SignalsBlocked {
    old: libc::sigset_t,
}

impl SignalsBlocked {
    pub fn new() -> Self {
        // SAFETY: sigset_t is plain data, initialised by sigfillset/pthread_sigmask.
        unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
            SignalsBlocked { old }
        }
    }
}

impl Default for SignalsBlocked {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for SignalsBlocked {
    fn drop(&mut self) {
        // SAFETY: restores the mask saved in `new` for this thread.
        unsafe {
            libc::pthread_sigmask(libc::SIG_SETMASK, &self.old, std::ptr::null_mut());
        }
    }
}

/// In the child, before it unblocks any signal: every signal the daemon handles goes back to
/// its default action (a handler would run the daemon's code on the daemon's memory); ignored
/// ones stay ignored, as across `execve`. Async-signal-safe.
///
/// # Safety
/// Call only in the child of [`clone3_vfork`] (or of a fork), signals blocked.
pub unsafe fn reset_signal_handlers() {
    // SAFETY: sigaction on a zeroed, then kernel-filled struct on this (the child's) stack.
    unsafe {
        for sig in 1..65 {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut old) != 0 {
                continue;
            }
            if old.sa_sigaction != libc::SIG_DFL && old.sa_sigaction != libc::SIG_IGN {
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(sig, &dfl, std::ptr::null_mut());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::sync::atomic::{AtomicI32, Ordering};

    /// What the child saw, written into the parent's memory (CLONE_VM) before it exits.
    #[repr(C)]
    struct Shared {
        /// SIGUSR1's handler in the child after [`reset_signal_handlers`]: 1 default.
        usr1_default: AtomicI32,
        /// SIGPIPE's disposition in the child: 1 still ignored.
        pipe_ignored: AtomicI32,
    }

    extern "C" fn on_usr1(_: libc::c_int) {}

    unsafe extern "C" fn child(arg: *mut c_void) -> libc::c_int {
        // SAFETY: `arg` is the parent's `Shared`, alive across the vfork; signals are blocked.
        unsafe {
            reset_signal_handlers();
            let shared = &*(arg as *const Shared);
            let mut sa: libc::sigaction = std::mem::zeroed();
            libc::sigaction(libc::SIGUSR1, std::ptr::null(), &mut sa);
            shared
                .usr1_default
                .store((sa.sa_sigaction == libc::SIG_DFL) as i32, Ordering::SeqCst);
            libc::sigaction(libc::SIGPIPE, std::ptr::null(), &mut sa);
            shared
                .pipe_ignored
                .store((sa.sa_sigaction == libc::SIG_IGN) as i32, Ordering::SeqCst);
            libc::_exit(7)
        }
    }

    /// The child runs in the parent's memory on its own stack, the parent resumes only after it
    /// exited (its writes are there), the daemon's handlers are gone in the child while ignored
    /// signals stay ignored, and the parent's own handler and signal mask are untouched.
    #[test]
    fn the_child_shares_memory_runs_first_and_loses_the_handlers() {
        if !AVAILABLE {
            eprintln!("SKIPPED: no clone3 trampoline for this architecture");
            return;
        }
        // SAFETY: installs a handler that does nothing, for this test process.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_usr1 as *const () as usize;
            assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
            libc::signal(libc::SIGPIPE, libc::SIG_IGN);
        }
        let shared = Shared {
            usr1_default: AtomicI32::new(-1),
            pipe_ignored: AtomicI32::new(-1),
        };
        let stack = ChildStack::new().expect("child stack");
        let mut pidfd: libc::c_int = -1;
        let mut args = CloneArgs {
            flags: super::super::clone::CLONE_PIDFD,
            pidfd: &mut pidfd as *mut libc::c_int as u64,
            exit_signal: libc::SIGCHLD as u64,
            ..Default::default()
        };
        let ret = {
            let _blocked = SignalsBlocked::new();
            // SAFETY: `args`, `pidfd` and `shared` outlive the call; `child` keeps the rules.
            unsafe {
                clone3_vfork(
                    &mut args,
                    &stack,
                    child,
                    &shared as *const Shared as *mut c_void,
                )
            }
        };
        assert!(ret > 0, "clone3: {}", std::io::Error::last_os_error());
        // No wait needed: CLONE_VFORK returned after the child's exit.
        assert_eq!(
            shared.usr1_default.load(Ordering::SeqCst),
            1,
            "handler reset"
        );
        assert_eq!(
            shared.pipe_ignored.load(Ordering::SeqCst),
            1,
            "ignored stays"
        );
        // SAFETY: CLONE_PIDFD stored a new pidfd we now own.
        let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
        // The child released the memory at its exit; it may not be a zombie yet.
        let st = loop {
            match crate::sys::pidfd_try_wait(std::os::fd::AsFd::as_fd(&pidfd)).expect("waitid") {
                Some(st) => break st,
                None => std::thread::sleep(std::time::Duration::from_millis(1)),
            }
        };
        assert_eq!(st, crate::sys::ExitStatus::Exited(7));
        // The parent still has its handler, and nothing blocked.
        // SAFETY: queries only.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            libc::sigaction(libc::SIGUSR1, std::ptr::null(), &mut sa);
            assert_eq!(sa.sa_sigaction, on_usr1 as *const () as usize);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_SETMASK, std::ptr::null(), &mut set);
            assert_eq!(libc::sigismember(&set, libc::SIGUSR1), 0);
        }
    }
}
