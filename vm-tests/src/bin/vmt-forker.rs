//! Task spawner for the VM budget tests, run as an exec tool: `vmt-forker N` reads its
//! arguments line from stdin, then starts up to N threads (each a task that `pids.max` counts,
//! like a forked process) that sleep, until the kernel refuses one. Prints one JSON object:
//! `{"spawned": K, "errno": E}` (`E` is null when all N started) and exits, which ends the call.

use std::io::Read;
use std::time::Duration;

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(64);
    // The tool's arguments (one JSON line, then EOF): not needed.
    let mut input = String::new();
    let _ = std::io::stdin().read_to_string(&mut input);
    let mut held = Vec::new();
    let mut errno: Option<i32> = None;
    for _ in 0..n {
        match std::thread::Builder::new()
            .stack_size(64 << 10)
            .spawn(|| std::thread::sleep(Duration::from_secs(600)))
        {
            Ok(h) => held.push(h),
            Err(e) => {
                errno = e.raw_os_error().or(Some(-1));
                break;
            }
        }
    }
    let errno = errno.map_or("null".to_string(), |e| e.to_string());
    println!("{{\"spawned\": {}, \"errno\": {errno}}}", held.len());
    // Exit with the threads still running: the daemon kills the tool's cgroup.
    std::process::exit(0);
}
