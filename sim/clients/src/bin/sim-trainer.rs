//! A stand-in for a training job: each iteration launches `--kernels` kernels of `--kernel-us`
//! between two events, synchronizes, spends `--host-ms` on the host, then prints one line
//! `iter=<i> at_s=<start, s since launch> gpu_us=<event pair around the kernels, µs>
//! ms=<iteration wall time, ms>` (`ms=` stays the last field: existing parsers split on it), and
//! at the end a `trainer …` summary. It never loads the shim: it is the serverful load smore
//! protects. Flag sets for the demo's low / moderate / high utilization trainers are in
//! docs/simgpu.md ("Trainer profiles").
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
    let (e0, e1) = (s.new_event()?, s.new_event()?);
    let start = Instant::now();
    let mut times = Vec::new();
    let mut gpu_ms_total = 0.0;
    let mut i = 0u64;
    loop {
        if a.iters.is_some_and(|n| i >= n)
            || (a.iters.is_none() && start.elapsed().as_secs_f64() >= a.seconds)
        {
            break;
        }
        let t = Instant::now();
        s.record(e0, stream)?;
        for _ in 0..a.kernels {
            s.launch(f, stream)?;
        }
        s.record(e1, stream)?;
        s.sync(stream)?;
        let gpu_ms = s.elapsed_ms(e0, e1)?;
        gpu_ms_total += gpu_ms;
        if a.host_ms > 0.0 {
            std::thread::sleep(Duration::from_secs_f64(a.host_ms / 1e3));
        }
        let ms = t.elapsed().as_secs_f64() * 1e3;
        if !a.quiet {
            println!(
                "iter={i} at_s={:.6} gpu_us={:.1} ms={ms:.3}",
                (t - start).as_secs_f64(),
                gpu_ms * 1e3
            );
        }
        times.push(ms);
        i += 1;
    }
    let total = start.elapsed().as_secs_f64();
    let mut sorted = times.clone();
    sorted.sort_by(f64::total_cmp);
    let mean = times.iter().sum::<f64>() / times.len().max(1) as f64;
    // gpu_frac: the trainer's own view of how busy it kept the GPU (event time / wall time).
    println!(
        "trainer iters={} mean_ms={mean:.3} p50_ms={:.3} p99_ms={:.3} iters_per_s={:.3} gpu_mean_ms={:.3} gpu_frac={:.3}",
        times.len(),
        percentile(&sorted, 50.0),
        percentile(&sorted, 99.0),
        times.len() as f64 / total,
        gpu_ms_total / times.len().max(1) as f64,
        gpu_ms_total / 1e3 / total
    );
    Ok(())
}
