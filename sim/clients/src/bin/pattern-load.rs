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
//! Runs for `--seconds` and prints one summary line, `pattern=<p> launches=<n> kernels=<n>
//! submitted_gpu_ms=<x> wall_ms=<x>`: the GPU time it asked for, not what it got (the node's
//! per-process GPU time says that).
use anyhow::{bail, Result};
use clap::Parser;
use smore_sim_clients::driver::{Ptr, ResolveArgs, Session};
use std::time::Instant;

#[derive(Parser, Debug)]
#[command(
    about = "Function-like load with a chosen launch pattern (batch-sync, long, tiny, graph)"
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
}

/// (kernel µs, kernels per synchronize) of each pattern.
fn defaults(pattern: &str) -> Result<(f64, u32)> {
    Ok(match pattern {
        "batch-sync" => (50.0, 20),
        "long" => (20_000.0, 1),
        "tiny" => (40.0, 200),
        "graph" => (100.0, 20),
        other => bail!("unknown --pattern {other:?}: expected batch-sync, long, tiny or graph"),
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
