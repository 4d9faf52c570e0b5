//! Wake-up latency probe for the VM tests: `vmt-lat [WINDOW_S] [INTERVAL_MS]` sleeps
//! INTERVAL_MS (default 10) in a loop and measures how late each wake-up is (time after the
//! intended wake-up until the process runs again). Every WINDOW_S seconds (default 5) it prints
//! one line for that window and starts a new one:
//! `vmt-lat: n=487 p50_us=120 p90_us=800 p99_us=4100 max_us=9000`.

use std::time::{Duration, Instant};

fn percentile(sorted: &[u64], p: usize) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) * p) / 100]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let window: f64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(5.0);
    let interval_ms: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(10);
    let interval = Duration::from_millis(interval_ms);
    let mut late_us: Vec<u64> = Vec::new();
    let mut start = Instant::now();
    loop {
        let target = Instant::now() + interval;
        std::thread::sleep(interval);
        let late = Instant::now().saturating_duration_since(target);
        late_us.push(late.as_micros() as u64);
        if start.elapsed().as_secs_f64() >= window {
            late_us.sort_unstable();
            println!(
                "vmt-lat: n={} p50_us={} p90_us={} p99_us={} max_us={}",
                late_us.len(),
                percentile(&late_us, 50),
                percentile(&late_us, 90),
                percentile(&late_us, 99),
                late_us.last().copied().unwrap_or(0)
            );
            late_us.clear();
            start = Instant::now();
        }
    }
}
