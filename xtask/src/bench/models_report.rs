//! `bench models`: the run (backends, daemon, the two parts) and its report.

use std::path::Path;

use anyhow::Result;
use serde_json::{Value, json};

use super::harness::*;
use super::models::{self, FloodPhase, ModelsArgs, PATHS, PathSamples, Targets};
use super::models_http;

fn models_yaml(instant: &str, llama: Option<&str>, max_concurrent: usize) -> String {
    let mut y = format!(
        "# bench models: the instant backend in the bench process and llama.cpp's server.\n\
         backends:\n  - name: instant\n    url: http://{instant}\n    placement: local\n    \
         max_concurrent: {max_concurrent}\n    models:\n      - name: instant\n        \
         upstream: instant-upstream\n\
         # The same server with a small max_concurrent (the bounds probe).\n\
         \x20 - name: instant-capped\n    url: http://{instant}\n    placement: local\n    \
         max_concurrent: {}\n    models:\n      - name: instant-capped\n        \
         upstream: instant-upstream\n",
        models::CAPPED_MAX_CONCURRENT
    );
    if let Some(l) = llama {
        y.push_str(&format!(
            "  - name: llama\n    url: http://{l}\n    placement: local\n    max_concurrent: \
             {max_concurrent}\n    models:\n      - name: chat\n        upstream: \
             SmolLM2-135M-Instruct\n"
        ));
    }
    y
}

pub(super) fn bench(
    a: &ModelsArgs,
    dir: &Path,
    bin_dir: &Path,
    cgroup_root: &Path,
    procs: &mut Procs,
) -> Result<()> {
    let l = Layout::new(dir)?;
    let audit_dir = a.audit_dir.clone().unwrap_or_else(|| l.state.join("audit"));
    std::fs::create_dir_all(&audit_dir)?;
    let fs = filesystem_of(&audit_dir);
    let load_before = loadavg();
    // Enough threads for every direct keep-alive connection and the gateway's fresh ones.
    let instant = models_http::instant_server((2 * a.agents + 16).max(64))?;
    let llama = if a.llama_requests > 0 {
        Some(models::start_llama(procs)?)
    } else {
        None
    };
    let max_concurrent = (4 * a.agents).max(64);
    let yaml = dir.join("models.yaml");
    std::fs::write(
        &yaml,
        models_yaml(&instant, llama.as_deref(), max_concurrent),
    )?;
    let env = Env::launch(
        &l,
        bin_dir,
        cgroup_root,
        &audit_dir,
        &["--models".into(), yaml.clone().into_os_string()],
        procs,
    )?;
    eprintln!(
        "bench models: agentosd pid {}, audit log {} ({fs}), instant backend {instant}, llama {}",
        env.daemon_pid,
        audit_dir.display(),
        llama.as_deref().unwrap_or("(left out)")
    );
    let t = Targets { instant, llama };
    let threads_before = env.daemon_threads();
    let t0 = std::time::Instant::now();
    let (samples, syncs) = models::sequential(a, &env, &l.out, &t, &audit_dir)?;
    let seq_secs = t0.elapsed().as_secs_f64();
    let seq_threads = thread_delta(&threads_before, &env.daemon_threads());
    let load_mid = loadavg();
    let probe = models::run_probe(&env)?;
    let flood = if a.agents > 0 {
        Some(models::flood(a, &env, &l.out, &t)?)
    } else {
        None
    };
    let load_after = loadavg();
    let reconnects: Vec<u64> = samples.iter().map(|s| s.reconnects).collect();
    let dists: Vec<[Dist; 3]> = samples
        .into_iter()
        .map(|s: PathSamples| [Dist::new(s.ttft), Dist::new(s.gap), Dist::new(s.total)])
        .collect();
    let syncs = Dist::new(syncs);
    println!(
        "\nModel calls, one request in flight, {} rounds (direct and gateway alternating), \
         instant answers of {} content chunks, llama.cpp answers of {} tokens\n\
         audit log: {} ({fs}); loadavg before {load_before}, after the sequential part \
         {load_mid}, at the end {load_after}; sequential part {seq_secs:.0} s\n",
        a.rounds,
        a.chunks,
        a.llama_tokens,
        audit_dir.display()
    );
    print_sequential(&dists, &syncs);
    println!(
        "requests that opened a new connection (the server closed the last one), by path: {}",
        PATHS
            .iter()
            .zip(&reconnects)
            .map(|((b, p), n)| format!("{b} {p} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "daemon CPU during the sequential part, by thread (s): {}",
        fmt_threads(&seq_threads)
    );
    println!(
        "\nBounds probe: one agent starts streams one after the other (each once the last one's \
         head came) and reads none of them; the status of each answer's head within 3 s \
         (\"no answer\": held):\n\
         - {} streams of `instant` (the gateway allows {} calls in flight per agent): {}\n\
         - {} streams of `instant-capped` (its backend's max_concurrent is {}): {}",
        models::PROBE_UNCAPPED,
        agentosd::models::MAX_INFLIGHT_PER_AGENT,
        probe
            .lines()
            .next()
            .unwrap_or("")
            .split(": ")
            .nth(1)
            .unwrap_or("?"),
        models::PROBE_CAPPED,
        models::CAPPED_MAX_CONCURRENT,
        probe
            .lines()
            .nth(1)
            .unwrap_or("")
            .split(": ")
            .nth(1)
            .unwrap_or("?"),
    );
    let mut flood_json = Value::Null;
    if let Some(ph) = &flood {
        flood_json = print_flood(a, ph, max_concurrent);
    }
    if let Some(p) = &a.json {
        let seq: Vec<Value> = PATHS
            .iter()
            .zip(&dists)
            .zip(&reconnects)
            .map(|(((b, p), d), n)| {
                json!({"backend": b, "path": p, "ttft": d[0].json(), "gap": d[1].json(),
                       "total": d[2].json(), "reconnects": n})
            })
            .collect();
        std::fs::write(
            p,
            serde_json::to_vec_pretty(&json!({
                "rounds": a.rounds, "chunks": a.chunks, "llama_tokens": a.llama_tokens,
                "filesystem": fs, "loadavg_before": load_before, "loadavg_after": load_after,
                "sequential": seq, "fdatasync": syncs.json(),
                "daemon_threads_sequential_ticks": seq_threads, "flood": flood_json, "probe": probe,
            }))?,
        )?;
    }
    Ok(())
}

fn ratio(a: u64, b: u64) -> String {
    if b == 0 {
        "—".into()
    } else {
        format!("{:.2}×", a as f64 / b as f64)
    }
}

fn print_sequential(dists: &[[Dist; 3]], syncs: &Dist) {
    println!(
        "| backend, answer | path | requests | TTFT p50 µs | TTFT p99 µs | per chunk p50 µs | \
         per chunk p99 µs | per chunk mean µs | total p50 µs | total p99 µs |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for ((b, p), d) in PATHS.iter().zip(dists) {
        if d[2].0.is_empty() {
            continue;
        }
        let streamed = b.ends_with("stream");
        let g = |x: u64| if streamed { us(x) } else { "—".into() };
        println!(
            "| {b} | {p} | {} | {} | {} | {} | {} | {} | {} | {} |",
            d[2].0.len(),
            if streamed {
                us(d[0].p(500))
            } else {
                "—".into()
            },
            if streamed {
                us(d[0].p(990))
            } else {
                "—".into()
            },
            g(d[1].p(500)),
            g(d[1].p(990)),
            g(d[1].mean()),
            us(d[2].p(500)),
            us(d[2].p(990)),
        );
    }
    println!(
        "| disk: append 338 B + `fdatasync` (the audit log's file system) | | {} | | | | | | {} | {} |",
        syncs.0.len(),
        us(syncs.p(500)),
        us(syncs.p(990))
    );
    println!(
        "\nAdded by the gateway (gateway − direct, percentile minus percentile; ratio gateway ÷ direct):\n"
    );
    println!(
        "| backend, answer | TTFT +p50 µs | TTFT +p99 µs | TTFT ratio p50 / p99 | per chunk +p50 µs | \
         per chunk +p99 µs | per chunk +mean µs | total +p50 µs | total +p99 µs | total ratio p50 |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for i in (0..PATHS.len()).step_by(2) {
        let (d, g) = (&dists[i], &dists[i + 1]);
        if d[2].0.is_empty() || g[2].0.is_empty() {
            continue;
        }
        let streamed = PATHS[i].0.ends_with("stream");
        let opt = |s: String| if streamed { s } else { "—".into() };
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            PATHS[i].0,
            opt(sdiff(g[0].p(500), d[0].p(500))),
            opt(sdiff(g[0].p(990), d[0].p(990))),
            opt(format!(
                "{} / {}",
                ratio(g[0].p(500), d[0].p(500)),
                ratio(g[0].p(990), d[0].p(990))
            )),
            opt(sdiff(g[1].p(500), d[1].p(500))),
            opt(sdiff(g[1].p(990), d[1].p(990))),
            opt(sdiff(g[1].mean(), d[1].mean())),
            sdiff(g[2].p(500), d[2].p(500)),
            sdiff(g[2].p(990), d[2].p(990)),
            ratio(g[2].p(500), d[2].p(500)),
        );
    }
    let (d, g) = (&dists[0], &dists[1]);
    let add50 = g[0].p(500) as i64 - d[0].p(500) as i64;
    let add99 = g[0].p(990) as i64 - d[0].p(990) as i64;
    println!(
        "\nGoal ≤ 1 ms added to the first token (instant backend): at p50 {} ({:+.1} µs), at p99 {} \
         ({:+.1} µs); one fdatasync here: p50 {} µs, p99 {} µs",
        if add50 <= 1_000_000 { "met" } else { "NOT met" },
        add50 as f64 / 1000.0,
        if add99 <= 1_000_000 { "met" } else { "NOT met" },
        add99 as f64 / 1000.0,
        us(syncs.p(500)),
        us(syncs.p(990)),
    );
    if !dists[4][1].0.is_empty() && !dists[5][1].0.is_empty() {
        let (d, g) = (&dists[4][1], &dists[5][1]);
        println!(
            "Per token with a real model (llama.cpp): direct p50 {} µs, gateway p50 {} µs ({}); \
             p99 {} vs {} µs",
            us(d.p(500)),
            us(g.p(500)),
            sdiff(g.p(500), d.p(500)),
            us(d.p(990)),
            us(g.p(990)),
        );
    }
}

fn print_flood(a: &ModelsArgs, ph: &[FloodPhase; 2], max_concurrent: usize) -> Value {
    println!(
        "\n{} clients at once, each streaming {}-chunk answers from the instant backend in a \
         loop (one request in flight each), {} s per path:\n",
        a.agents, a.chunks, a.flood_secs
    );
    println!(
        "| path | clients | requests | requests/s | chunks/s | TTFT p50 µs | TTFT p99 µs | \
         total p50 µs | total p99 µs | requests per client min / median / max | daemon CPU \
         (of one core) | backend CPU | machine busy (2 CPUs) |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let secs = a.flood_secs as f64;
    let mut out = Vec::new();
    for (p, name) in ph.iter().zip(["direct", "gateway (agents)"]) {
        let (ttft, total, pc) = (
            Dist::new(p.ttft.clone()),
            Dist::new(p.total.clone()),
            Dist::new(p.per_client.clone()),
        );
        let n = ttft.0.len() as f64;
        let daemon: u64 = p.daemon.iter().map(|t| t.1).sum();
        println!(
            "| {name} | {} | {} | **{:.0}** | **{:.0}** | {} | {} | {} | {} | {} / {} / {} | {:.0}% | {:.0}% | {:.0}% |",
            a.agents,
            ttft.0.len(),
            n / secs,
            p.chunks as f64 / secs,
            us(ttft.p(500)),
            us(ttft.p(990)),
            us(total.p(500)),
            us(total.p(990)),
            pc.0.first().copied().unwrap_or(0),
            pc.p(500),
            pc.max(),
            daemon as f64 / clk_tck() / secs * 100.0,
            p.backend_ticks as f64 / clk_tck() / secs * 100.0,
            p.machine_busy * 100.0,
        );
        out.push(
            json!({"path": name, "requests": ttft.0.len(), "requests_per_s": n / secs,
            "chunks_per_s": p.chunks as f64 / secs, "ttft": ttft.json(), "total": total.json(),
            "daemon_threads_ticks": p.daemon, "backend_ticks": p.backend_ticks,
            "machine_busy": p.machine_busy, "loadavg_after": p.load_after}),
        );
    }
    println!(
        "daemon CPU in the gateway phase, by thread (s): {}",
        fmt_threads(&ph[1].daemon)
    );
    println!(
        "Bounds: 1 request in flight per agent (the gateway allows {}), 1 connection each \
         (allows {}), backend max_concurrent {max_concurrent} (≥ {} clients): none of them binds.",
        agentosd::models::MAX_INFLIGHT_PER_AGENT,
        agentosd::models::MAX_CONNS_PER_AGENT,
        a.agents
    );
    json!({"clients": a.agents, "secs": a.flood_secs, "phases": out})
}
