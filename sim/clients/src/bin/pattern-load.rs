//! A function-like load with a chosen launch pattern, for checking that an SM share holds
//! whatever the way a program submits its work:
//!
//! - `batch-sync`: batches of `--batch` short one-block kernels, a stream synchronize after each
//!   batch (an inference request of small ops).
//! - `long`: single long kernels (`--kernel-us`, default 20 ms), a synchronize after each.
//! - `tiny`: many small kernels back to back (`--kernel-us`, default 40 µs), a synchronize every
//!   `--batch` kernels only (bounds the queue; the launch rate is what matters). Shorter kernels
//!   make the client launch-bound in a debug build on a loaded 2-core machine (5 µs: ~14 % of
//!   the GPU at most, unshimmed; 20 µs: 20–27 % at a 50 % share when other builds load the
//!   machine), which would test the CPU, not the share.
//! - `graph`: a CUDA graph of `--batch` kernels captured once, launched and synchronized in a
//!   loop.
//!
//! Cost poisoning (issue 12 item 10): one kernel function (`smore_sim_spin`, whose run time is its
//! argument) launched short (`--short-us`, default 50 µs) and long (`--kernel-us`, default 1 ms),
//! one short to `--batch` long (default 9), so a gate that learns the kernel's cost from a
//! sampled short launch charges the long ones far too little:
//! - `poison`: each group starts with the short launch right after a synchronize — the first
//!   launch after a pause, the one a "first launch per period" sampler takes.
//! - `poison-mixed`: the short launch at a random place in each group.
//! - `poison-detect`: predicts the sampler — a launch is made short when the last one predicted
//!   sampled is at least 1 ms old or the previous launch call took unusually long (an event
//!   recorded around it), long otherwise; a synchronize every `--batch` + 1 launches.
//!
//! Runs for `--seconds` and prints one summary line, `pattern=<p> launches=<n> kernels=<n>
//! submitted_gpu_ms=<x> wall_ms=<x>`: the GPU time it asked for, not what it got (the node's
//! per-process GPU time says that).
use anyhow::{bail, Result};
use clap::Parser;
use smore_sim_clients::driver::{Ptr, ResolveArgs, Session};
use std::time::Instant;

#[derive(Parser, Debug)]
#[command(
    about = "Function-like load with a chosen launch pattern (batch-sync, long, tiny, graph, poison*)"
)]
struct Args {
    #[command(flatten)]
    resolve: ResolveArgs,
    /// batch-sync, long, tiny or graph.
    #[arg(long)]
    pattern: String,
    /// Duration of each kernel, µs (default per pattern: 50, 20000, 40, 100).
    #[arg(long)]
    kernel_us: Option<f64>,
    /// Kernels per batch / per graph / between synchronizes of `tiny` (default per pattern: 20,
    /// 1, 200, 20).
    #[arg(long)]
    batch: Option<u32>,
    /// Run for this many seconds.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Poison patterns: duration of the short launches, µs.
    #[arg(long, default_value_t = 50.0)]
    short_us: f64,
    /// Poison patterns: pulse — after this many ms of launching, pause `--pulse-off-ms` (0: never
    /// pause). A pause now and then breaks a watchdog rule that wants consecutive over-use
    /// samples.
    #[arg(long, default_value_t = 0)]
    pulse_on_ms: u64,
    /// Poison patterns: length of each pause, ms.
    #[arg(long, default_value_t = 0)]
    pulse_off_ms: u64,
}

/// (kernel µs, kernels per synchronize) of each pattern.
fn defaults(pattern: &str) -> Result<(f64, u32)> {
    Ok(match pattern {
        "batch-sync" => (50.0, 20),
        "long" => (20_000.0, 1),
        "tiny" => (40.0, 200),
        "graph" => (100.0, 20),
        "poison" | "poison-mixed" | "poison-detect" => (1_000.0, 9),
        other => bail!(
            "unknown --pattern {other:?}: expected batch-sync, long, tiny, graph, poison, \
             poison-mixed or poison-detect"
        ),
    })
}

/// Captures `n` launches of `f` on `stream` into a graph and instantiates it.
fn graph_of(s: &Session, f: Ptr, stream: Ptr, n: u32) -> Result<Ptr> {
    let d = &s.drv;
    // SAFETY: entry points resolved for these signatures; handles of this driver; out-pointers
    // to locals.
    unsafe {
        d.check((d.cuStreamBeginCapture)(stream, 0), "cuStreamBeginCapture")?;
        for _ in 0..n {
            s.launch(f, stream)?;
        }
        let mut g = std::ptr::null_mut();
        d.check((d.cuStreamEndCapture)(stream, &mut g), "cuStreamEndCapture")?;
        let mut exec = std::ptr::null_mut();
        d.check(
            (d.cuGraphInstantiate)(&mut exec, g, 0),
            "cuGraphInstantiate",
        )?;
        d.check((d.cuGraphDestroy)(g), "cuGraphDestroy")?;
        Ok(exec)
    }
}

fn main() -> Result<()> {
    let a = Args::parse();
    let (us, batch) = defaults(&a.pattern)?;
    let us = a.kernel_us.unwrap_or(us);
    let batch = a.batch.unwrap_or(batch).max(1);
    let drv = a.resolve.load(None)?;
    let s = Session::open(drv, a.resolve.device, &[("op", us)])?;
    if a.pattern.starts_with("poison") {
        return poison(&a, &s, us, batch);
    }
    let f = s.function("op")?;
    let stream = s.new_stream()?;
    let exec = if a.pattern == "graph" {
        Some(graph_of(&s, f, stream, batch)?)
    } else {
        None
    };
    let start = Instant::now();
    let (mut launches, mut kernels) = (0u64, 0u64);
    while start.elapsed().as_secs_f64() < a.seconds {
        match exec {
            Some(exec) => {
                // SAFETY: cuGraphLaunch resolved for this signature; handles of this driver.
                let rc = unsafe { (s.drv.cuGraphLaunch)(exec, stream) };
                s.drv.check(rc, "cuGraphLaunch")?;
                launches += 1;
                kernels += batch as u64;
            }
            None => {
                for _ in 0..batch {
                    s.launch(f, stream)?;
                }
                launches += batch as u64;
                kernels += batch as u64;
            }
        }
        s.sync(stream)?;
    }
    let wall = start.elapsed().as_secs_f64() * 1e3;
    println!(
        "pattern={} launches={launches} kernels={kernels} submitted_gpu_ms={:.3} wall_ms={wall:.3}",
        a.pattern,
        kernels as f64 * us / 1e3
    );
    Ok(())
}

/// The cost-poisoning patterns (module docs): one `smore_sim_spin` function, `long_us` launches
/// with one `a.short_us` launch per `longs`.
fn poison(a: &Args, s: &Session, long_us: f64, longs: u32) -> Result<()> {
    let f = s.function("smore_sim_spin")?;
    let stream = s.new_stream()?;
    let (short, long) = ((a.short_us * 1e3) as u64, (long_us * 1e3) as u64);
    let group = longs as u64 + 1;
    let start = Instant::now();
    let (mut launches, mut gpu_ns, mut shorts) = (0u64, 0u64, 0u64);
    // xorshift64: the place of the short launch in a `poison-mixed` group.
    let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ std::process::id() as u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    // `poison-detect`: when the last launch predicted sampled was made, and the typical cost of a
    // launch call (an EWMA), to spot one that recorded events around the kernel.
    let (mut predicted, mut typical_ns) = (None::<Instant>, 0f64);
    let mut last_call_ns = 0f64;
    let mut pulse = Instant::now();
    while start.elapsed().as_secs_f64() < a.seconds {
        let place = next() % group;
        for i in 0..group {
            let is_short = match a.pattern.as_str() {
                "poison" => i == 0,
                "poison-mixed" => i == place,
                _ => {
                    if typical_ns > 0.0 && last_call_ns > 3.0 * typical_ns {
                        // The previous call was the sampled one (a long): the next sample is
                        // at least a period away.
                        predicted = Some(Instant::now());
                    }
                    predicted.is_none_or(|t| t.elapsed().as_micros() >= 1_000)
                }
            };
            let ns = if is_short { short } else { long };
            let t = Instant::now();
            s.launch_spin(f, stream, ns)?;
            last_call_ns = t.elapsed().as_nanos() as f64;
            typical_ns = if typical_ns == 0.0 {
                last_call_ns
            } else {
                typical_ns * 0.9 + last_call_ns.min(typical_ns * 3.0) * 0.1
            };
            if is_short {
                shorts += 1;
                if a.pattern == "poison-detect" {
                    predicted = Some(Instant::now());
                }
            }
            launches += 1;
            gpu_ns += ns;
        }
        s.sync(stream)?;
        if a.pulse_on_ms > 0 && pulse.elapsed().as_millis() as u64 >= a.pulse_on_ms {
            std::thread::sleep(std::time::Duration::from_millis(a.pulse_off_ms));
            pulse = Instant::now();
        }
    }
    let wall = start.elapsed().as_secs_f64() * 1e3;
    println!(
        "pattern={} launches={launches} kernels={launches} shorts={shorts} submitted_gpu_ms={:.3} wall_ms={wall:.3}",
        a.pattern,
        gpu_ns as f64 / 1e6
    );
    Ok(())
}
