//! A stand-in for a training job: each iteration launches `--kernels` kernels of `--kernel-us`
//! and synchronizes, then prints `iter=<i> ms=<iteration time>`. It never loads the shim: it is the
//! serverful load smore protects.
use anyhow::Result;
use clap::Parser;
use smore_sim_clients::driver::{percentile, ResolveArgs, Session};
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
#[command(about = "Simulated training job: iterations of kernels + sync, printing iteration times")]
struct Args {
    #[command(flatten)]
    resolve: ResolveArgs,
    /// Duration of each kernel, µs.
    #[arg(long, default_value_t = 5000.0)]
    kernel_us: f64,
    /// Kernels per iteration.
    #[arg(long, default_value_t = 10)]
    kernels: u32,
    /// Host time between iterations (data loading, optimizer bookkeeping), ms.
    #[arg(long, default_value_t = 0.0)]
    host_ms: f64,
    /// Stop after this many iterations...
    #[arg(long)]
    iters: Option<u64>,
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
    let s = Session::open(drv, a.resolve.device, &[("train_step", a.kernel_us)])?;
    let f = s.function("train_step")?;
    let stream = s.new_stream()?;
    let start = Instant::now();
    let mut times = Vec::new();
    let mut i = 0u64;
    loop {
        if a.iters.is_some_and(|n| i >= n)
            || (a.iters.is_none() && start.elapsed().as_secs_f64() >= a.seconds)
        {
            break;
        }
        let t = Instant::now();
        for _ in 0..a.kernels {
            s.launch(f, stream)?;
        }
        s.sync(stream)?;
        if a.host_ms > 0.0 {
            std::thread::sleep(Duration::from_secs_f64(a.host_ms / 1e3));
        }
        let ms = t.elapsed().as_secs_f64() * 1e3;
        if !a.quiet {
            println!("iter={i} ms={ms:.3}");
        }
        times.push(ms);
        i += 1;
    }
    let total = start.elapsed().as_secs_f64();
    let mut sorted = times.clone();
    sorted.sort_by(f64::total_cmp);
    let mean = times.iter().sum::<f64>() / times.len().max(1) as f64;
    println!(
        "trainer iters={} mean_ms={mean:.3} p50_ms={:.3} p99_ms={:.3} iters_per_s={:.3}",
        times.len(),
        percentile(&sorted, 50.0),
        percentile(&sorted, 99.0),
        times.len() as f64 / total
    );
    Ok(())
}
