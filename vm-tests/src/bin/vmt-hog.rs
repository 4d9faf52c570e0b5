//! Memory hog for the VM tests: `vmt-hog MIB [DELAY_S]` waits DELAY_S seconds (so the test can
//! look at the agent's cgroup first), then allocates and touches MIB MiB in 4 MiB steps and holds
//! it. Over its `memory.max` it is OOM-killed, which is what the test wants to see.

use std::time::Duration;

fn main() {
    let mut args = std::env::args().skip(1);
    let mib: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1024);
    let delay: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(0);
    std::thread::sleep(Duration::from_secs(delay));
    let mut held: Vec<Vec<u8>> = Vec::new();
    for step in 0..mib.div_ceil(4) {
        let mut chunk = vec![0u8; 4 << 20];
        // Touch every page: a zeroed allocation is not resident until written.
        for i in (0..chunk.len()).step_by(4096) {
            chunk[i] = 1;
        }
        held.push(std::hint::black_box(chunk));
        if step % 16 == 0 {
            println!("vmt-hog: {} MiB resident", (step + 1) * 4);
        }
    }
    println!("vmt-hog: holding {mib} MiB");
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}
