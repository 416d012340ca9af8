//! A stand-in for a serverless inference function: each request launches `--kernels` kernels of
//! `--kernel-us` and synchronizes; prints `request=<i> latency_ms=<x>`, then a summary with P50/P99.
use anyhow::Result;
use clap::Parser;
use smore_sim_clients::driver::{percentile, ResolveArgs, Session};
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
#[command(about = "Simulated inference function: requests of a few kernels, printing latencies")]
struct Args {
    #[command(flatten)]
    resolve: ResolveArgs,
    /// Duration of each kernel, µs.
    #[arg(long, default_value_t = 300.0)]
    kernel_us: f64,
    /// Kernels per request.
    #[arg(long, default_value_t = 4)]
    kernels: u32,
    /// Time between request starts, ms (0 = back to back).
    #[arg(long, default_value_t = 0.0)]
    interval_ms: f64,
    /// Stop after this many requests...
    #[arg(long)]
    requests: Option<u64>,
    /// ...or after this many seconds (default 5).
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Print only the summary line.
    #[arg(long)]
    quiet: bool,
}

fn main() -> Result<()> {
    let a = Args::parse();
    let drv = a.resolve.load(None)?;
    let s = Session::open(drv, a.resolve.device, &[("infer", a.kernel_us)])?;
    let f = s.function("infer")?;
    let stream = s.new_stream()?;
    let start = Instant::now();
    let mut lat = Vec::new();
    let mut i = 0u64;
    loop {
        if a.requests.is_some_and(|n| i >= n)
            || (a.requests.is_none() && start.elapsed().as_secs_f64() >= a.seconds)
        {
            break;
        }
        let due = start + Duration::from_secs_f64(i as f64 * a.interval_ms / 1e3);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let t = Instant::now();
        for _ in 0..a.kernels {
            s.launch(f, stream)?;
        }
        s.sync(stream)?;
        let ms = t.elapsed().as_secs_f64() * 1e3;
        if !a.quiet {
            println!("request={i} latency_ms={ms:.3}");
        }
        lat.push(ms);
        i += 1;
    }
    let total = start.elapsed().as_secs_f64();
    let mut sorted = lat.clone();
    sorted.sort_by(f64::total_cmp);
    println!(
        "function requests={} p50_ms={:.3} p99_ms={:.3} mean_ms={:.3} requests_per_s={:.3}",
        lat.len(),
        percentile(&sorted, 50.0),
        percentile(&sorted, 99.0),
        lat.iter().sum::<f64>() / lat.len().max(1) as f64,
        lat.len() as f64 / total
    );
    Ok(())
}
