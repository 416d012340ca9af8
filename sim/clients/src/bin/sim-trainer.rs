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
    /// Preset kernel count, length and host time for a utilization level (explicit flags win).
    #[arg(long, value_enum)]
    profile: Option<Profile>,
    /// Duration of each kernel, µs (default 5000, or the profile's).
    #[arg(long)]
    kernel_us: Option<f64>,
    /// Kernels per iteration (default 10, or the profile's).
    #[arg(long)]
    kernels: Option<u32>,
    /// Host time between iterations (data loading, optimizer bookkeeping), ms (default 0, or the
    /// profile's).
    #[arg(long)]
    host_ms: Option<f64>,
    /// Stop after this many iterations...
    #[arg(long)]
    iters: Option<u64>,
    /// ...or after this many seconds (default 5).
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Print only the summary line.
    #[arg(long)]
    quiet: bool,
    /// Keep the context open this long after the summary (tests read the node's accounting of a
    /// finished trainer), s.
    #[arg(long, default_value_t = 0.0)]
    linger_s: f64,
}

/// Utilization levels of the SMORE paper's characterization (low / moderate / high SM usage,
/// Section III): GPU busy fractions on an idle simulated GPU are measured by the test
/// `trainer_profiles_keep_the_gpu_as_busy_as_documented` and listed in docs/simgpu.md.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum Profile {
    /// 4 × 2 ms kernels, 24 ms host: about 25 % busy.
    Low,
    /// 6 × 2 ms kernels, 7 ms host: about 60 % busy.
    Moderate,
    /// 20 × 3 ms kernels, 1 ms host: about 95 % busy (long iterations, so per-iteration host
    /// overheads on a loaded CI machine do not pull it under 90 %).
    High,
}

impl Profile {
    /// (kernels, kernel µs, host ms)
    fn shape(self) -> (u32, f64, f64) {
        match self {
            Profile::Low => (4, 2000.0, 24.0),
            Profile::Moderate => (6, 2000.0, 7.0),
            Profile::High => (20, 3000.0, 1.0),
        }
    }
}

fn main() -> Result<()> {
    let a = Args::parse();
    let (kernels, kernel_us, host_ms) = a.profile.map(Profile::shape).unwrap_or((10, 5000.0, 0.0));
    let kernels = a.kernels.unwrap_or(kernels);
    let kernel_us = a.kernel_us.unwrap_or(kernel_us);
    let host_ms = a.host_ms.unwrap_or(host_ms);
    let drv = a.resolve.load(None)?;
    let s = Session::open(drv, a.resolve.device, &[("train_step", kernel_us)])?;
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
        for _ in 0..kernels {
            s.launch(f, stream)?;
        }
        s.record(e1, stream)?;
        s.sync(stream)?;
        let gpu_ms = s.elapsed_ms(e0, e1)?;
        gpu_ms_total += gpu_ms;
        if host_ms > 0.0 {
            std::thread::sleep(Duration::from_secs_f64(host_ms / 1e3));
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
    if a.linger_s > 0.0 {
        std::thread::sleep(Duration::from_secs_f64(a.linger_s));
    }
    Ok(())
}
