//! glibc malloc's arenas. By default glibc gives a thread that meets a locked arena a new one,
//! up to eight per core, and memory freed in one arena serves only later allocations in that
//! arena. The daemon's allocations per agent are made on whichever tokio worker or blocking
//! thread ran the start, so with many arenas every thread's arena grows with the agents while
//! the large buffers freed after start-up (BPF objects, BTF) sit unused in the main one.
//! Measured with 3 000 agents (docs/benchmarks.md, "Many agents under one daemon"): the daemon's
//! memory grew by about 19 KB per agent with glibc's default, 10-12 KB with two arenas and 9 KB
//! with one; the start rate did not drop with one (glibc's per-thread cache serves small
//! allocations without the arena lock). So the daemon asks for one arena, unless the operator
//! chose otherwise with `MALLOC_ARENA_MAX` or `GLIBC_TUNABLES=glibc.malloc.arena_max=N`.

/// Arenas the daemon asks glibc for.
pub const ARENAS: i32 = 1;

/// Limit malloc to [`ARENAS`] arenas; call before the daemon starts its threads. Returns the
/// limit it set, or `None` when the operator's environment sets one (or this is not glibc).
pub fn limit_arenas() -> Option<i32> {
    let chosen = std::env::var_os("MALLOC_ARENA_MAX").is_some()
        || std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains("glibc.malloc.arena_max"));
    if chosen {
        return None;
    }
    set_arena_max(ARENAS).then_some(ARENAS)
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set_arena_max(n: i32) -> bool {
    // SAFETY: mallopt only changes a malloc parameter; M_ARENA_MAX takes any positive count.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, n) == 1 }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_arena_max(_n: i32) -> bool {
    false
}
