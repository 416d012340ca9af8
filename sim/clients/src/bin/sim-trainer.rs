//! A stand-in for a training job: each iteration launches `--kernels` kernels of `--kernel-us`
//! between two events, synchronizes, spends `--host-ms` on the host, then prints one line
//! `iter=<i> at_s=<start, s since launch> gpu_us=<event pair around the kernels, µs>
//! ms=<iteration wall time, ms>` (`ms=` stays the last field: existing parsers split on it), and
//! at the end a `trainer …` summary. It never loads the shim: it is the serverful load smore
//! protects. Flag sets for the demo's low / moderate / high utilization trainers are in
//! docs/simgpu.md ("Trainer profiles").
//!
//! Memory (what an unmodified PyTorch job does to the node: its caching allocator's plain
//! `cuMemAlloc`s go straight to the driver): `--memory-mib` is allocated at start; with
//! `--grow-mib M --grow-every-ms T --grow-steps K` the job allocates M MiB more every T ms, K times
//! (a batch size growing, an evaluation pass, a checkpoint), printing
//! `grow step=<i> at_s=<s since launch> total_mib=<held> rc=<ok|oom>`; `--second-after-ms T
//! --second-mib M` starts a second training process (this program, `--memory-mib M`) after T ms,
//! as a job launching another worker on the GPU. The summary ends with `ooms=<n>`: the
//! allocations the driver refused, this process's and the second one's — the figure smore
//! exists to keep at 0.
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
    /// Device memory allocated at start (plain cuMemAlloc), MiB.
    #[arg(long, default_value_t = 0)]
    memory_mib: u64,
    /// Memory allocated at each growth step, MiB (0 = no growth).
    #[arg(long, default_value_t = 0)]
    grow_mib: u64,
    /// Time between growth steps (the first comes one period after start, or after
    /// `--grow-start-file` appears), ms.
    #[arg(long, default_value_t = 1000.0)]
    grow_every_ms: f64,
    /// Growth steps.
    #[arg(long, default_value_t = 1)]
    grow_steps: u32,
    /// Growth (and the second process) wait until this file exists; periods count from then
    /// (tests start it once the functions are in place).
    #[arg(long)]
    grow_start_file: Option<std::path::PathBuf>,
    /// Start a second training process this long after start (or after `--grow-start-file`
    /// appears), ms (with `--second-mib`).
    #[arg(long)]
    second_after_ms: Option<f64>,
    /// Memory the second training process allocates, MiB.
    #[arg(long, default_value_t = 0)]
    second_mib: u64,
}

/// Device memory the trainer holds and the allocations the driver refused it.
struct Memory {
    held: Vec<u64>,
    bytes: u64,
    ooms: u64,
}

impl Memory {
    /// One plain cuMemAlloc of `mib` MiB; true when the driver granted it.
    fn alloc(&mut self, s: &Session, mib: u64) -> bool {
        let mut p: cudarc::driver::sys::CUdeviceptr = 0;
        // SAFETY: cuMemAlloc_v2 resolved for this signature; out-pointer to a local.
        let rc = unsafe { (s.drv.cuMemAlloc)(&mut p, (mib << 20) as usize) };
        if rc == 0 {
            self.held.push(p);
            self.bytes += mib << 20;
            true
        } else {
            self.ooms += 1;
            eprintln!("sim-trainer: cuMemAlloc of {mib} MiB failed (CUresult {rc})");
            false
        }
    }
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
    let mut mem = Memory {
        held: Vec::new(),
        bytes: 0,
        ooms: 0,
    };
    if a.memory_mib > 0 {
        mem.alloc(&s, a.memory_mib);
    }
    let start = Instant::now();
    let mut grown = 0u32;
    let mut grow_from: Option<Instant> = None;
    let mut second: Option<std::process::Child> = None;
    let mut times = Vec::new();
    let mut gpu_ms_total = 0.0;
    let mut i = 0u64;
    loop {
        if a.iters.is_some_and(|n| i >= n)
            || (a.iters.is_none() && start.elapsed().as_secs_f64() >= a.seconds)
        {
            break;
        }
        if grow_from.is_none() && a.grow_start_file.as_ref().is_none_or(|f| f.exists()) {
            grow_from = Some(Instant::now());
        }
        let now_ms = grow_from.map_or(-1.0, |t| t.elapsed().as_secs_f64() * 1e3);
        if a.grow_mib > 0
            && now_ms >= 0.0
            && grown < a.grow_steps
            && now_ms >= (grown + 1) as f64 * a.grow_every_ms
        {
            grown += 1;
            let ok = mem.alloc(&s, a.grow_mib);
            println!(
                "grow step={grown} at_s={:.3} total_mib={} rc={}",
                start.elapsed().as_secs_f64(),
                mem.bytes >> 20,
                if ok { "ok" } else { "oom" }
            );
        }
        if a.second_after_ms
            .is_some_and(|t| second.is_none() && now_ms >= 0.0 && now_ms >= t)
        {
            let left = (a.seconds - start.elapsed().as_secs_f64()).max(0.5);
            let child = std::process::Command::new(std::env::current_exe()?)
                .args(["--memory-mib", &a.second_mib.to_string()])
                .args(["--seconds", &format!("{left:.3}"), "--quiet"])
                .args(["--resolve", &a.resolve.resolve])
                .args(["--device", &a.resolve.device.to_string()])
                .args(["--kernels", "1", "--kernel-us", "1000", "--host-ms", "20"])
                .stdout(std::process::Stdio::piped())
                .spawn()?;
            println!(
                "second pid={} at_s={:.3}",
                child.id(),
                start.elapsed().as_secs_f64()
            );
            second = Some(child);
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
    if let Some(child) = second {
        // The second process's own refusals count as the job's.
        let out = child.wait_with_output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let theirs = text
            .split_whitespace()
            .rev()
            .filter_map(|f| f.strip_prefix("ooms="))
            .find_map(|n| n.parse::<u64>().ok());
        mem.ooms += theirs.unwrap_or(1);
    }
    let total = start.elapsed().as_secs_f64();
    let mut sorted = times.clone();
    sorted.sort_by(f64::total_cmp);
    let mean = times.iter().sum::<f64>() / times.len().max(1) as f64;
    // gpu_frac: the trainer's own view of how busy it kept the GPU (event time / wall time).
    println!(
        "trainer iters={} mean_ms={mean:.3} p50_ms={:.3} p99_ms={:.3} iters_per_s={:.3} gpu_mean_ms={:.3} gpu_frac={:.3} memory_mib={} ooms={}",
        times.len(),
        percentile(&sorted, 50.0),
        percentile(&sorted, 99.0),
        times.len() as f64 / total,
        gpu_ms_total / times.len().max(1) as f64,
        gpu_ms_total / 1e3 / total,
        mem.bytes >> 20,
        mem.ooms
    );
    if a.linger_s > 0.0 {
        std::thread::sleep(Duration::from_secs_f64(a.linger_s));
    }
    Ok(())
}
