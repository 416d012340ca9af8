//! A stand-in for a serverless inference function: each request launches `--kernels` kernels of
//! `--kernel-us` and synchronizes. Requests arrive every `--interval-ms` in bursts of `--burst`
//! (a batch of requests arriving at once, served one after another by this instance, as a
//! function instance drains its queue), on a fixed clock or, with `--arrivals poisson`, as a
//! Poisson process of the same mean rate. Per request it prints
//! `request=<i> burst=<arrival #> arrival_s=<due, s since start> service_ms=<kernels to sync>
//! e2e_ms=<arrival to completion, queueing included> latency_ms=<same as service_ms, kept for
//! existing parsers>`, then a summary `function …` with service P50/P99 (`p50_ms`, `p99_ms`) and
//! end-to-end P50/P99 (`e2e_p50_ms`, `e2e_p99_ms`).
//!
//! `--serve` makes it a function *instance* as a serverless platform runs it: it loads its model
//! (`--model-memory-mib` of device memory plus `--load-ms` of host work), prints `ready`, then
//! serves one request per stdin line (`<id> [<waited_ms>]`: the time the request already waited at
//! the platform, 0 if absent), printing `done id=<id> service_ms=<x> admitted=<0|1> held_ms=<y>`
//! (`held_ms`: what the phase oracle of a study held it, `--phase-oracle-pid`; `turn_ms`: what
//! it waited for its turn on a study's dispatch board, `--dispatch-board`); EOF on stdin
//! unloads it. Under `smore run` (SMORE_INSTANCE set) each request first asks the arbiter for
//! admission over an attached connection, saying how long it has waited; a deferred request is
//! retried every `--retry-ms` until admitted or, counting what it waited at the platform,
//! `--give-up-ms` has passed. Served latencies are reported to the arbiter every 32 requests or
//! 0.5 s, whichever comes first (the arbiter's split weighs a function's deadline misses over 3 s). With
//! `--request-memory-mib` each request also allocates (and frees) that much device memory.
//!
//! Preemption (docs/arbiter.md, "Memory headroom and reclaim"): when the arbiter answers an
//! admission with `Preempted`, or a request's allocation fails and the arbiter says the instance
//! was preempted, the request ends with `failed id=<id> error="<the arbiter's reason>"`, the
//! instance prints `preempted reason=<unload|training_memory> grace_ms=<n>` and exits 0 without
//! reading more requests (the platform re-routes them; the arbiter refuses any it is asked for).
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
    /// Streams a request's kernels are spread over, in turn (all are synchronized at its end;
    /// not in serve mode, which uses one).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64), conflicts_with = "serve")]
    streams: u32,
    /// Time between request arrivals (between bursts with `--burst`), ms (0 = back to back).
    #[arg(long, default_value_t = 0.0)]
    interval_ms: f64,
    /// How the arrival instants are spaced: `periodic` (every `--interval-ms` exactly) or
    /// `poisson` (exponential gaps of mean `--interval-ms`, from `--seed`). A periodic function
    /// beside a periodic trainer can lock phases with it, which requests from many clients do
    /// not (docs/harvest.md, "The collision no sample sees, measured").
    #[arg(long, value_enum, default_value_t = Arrivals::Periodic, conflicts_with = "serve")]
    arrivals: Arrivals,
    /// Seed of `--arrivals poisson`'s gaps (the same seed, the same arrival instants); unused
    /// with `periodic`.
    #[arg(long, default_value_t = 1, conflicts_with = "serve")]
    seed: u64,
    /// Requests arriving together at each arrival instant (a batch of requests).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    burst: u64,
    /// Stop after this many requests...
    #[arg(long)]
    requests: Option<u64>,
    /// ...or after this many seconds (default 5).
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Print only the summary line.
    #[arg(long)]
    quiet: bool,
    /// Serve requests read from stdin (see the module docs).
    #[arg(long)]
    serve: bool,
    /// Device memory the model holds while loaded, MiB (serve mode).
    #[arg(long, default_value_t = 512)]
    model_memory_mib: u64,
    /// Host time to load the model, ms (serve mode).
    #[arg(long, default_value_t = 200.0)]
    load_ms: f64,
    /// Retry period of a deferred request, ms (serve mode).
    #[arg(long, default_value_t = 5.0)]
    retry_ms: f64,
    /// Give up on a deferred request after this long, ms (serve mode).
    #[arg(long, default_value_t = 1000.0)]
    give_up_ms: f64,
    /// Device memory each request allocates while it runs, MiB (serve mode; 0 = none).
    #[arg(long, default_value_t = 0)]
    request_memory_mib: u64,
    /// A study, simulated GPU only (`smore demo --phase-oracle`): the training job's pid. Before
    /// a request's kernels the instance waits until the simulator's ground truth says the
    /// trainer's queued kernels have run, as long as the request then still has its solo service
    /// time plus `--phase-oracle-margin-ms` before its SLO (serve mode).
    #[arg(long, requires = "phase_oracle_slo_ms")]
    phase_oracle_pid: Option<u32>,
    /// The SLO the phase oracle holds requests against, ms (with `--phase-oracle-pid`).
    #[arg(long, requires = "phase_oracle_pid")]
    phase_oracle_slo_ms: Option<f64>,
    /// What a held request keeps beyond its solo service time before its SLO, ms.
    #[arg(long, default_value_t = 1.0)]
    phase_oracle_margin_ms: f64,
    /// A study, simulated or not (`smore demo --serialize`): the dispatch board this GPU's
    /// instances share. Each request takes its turn on it before its kernels and ends it after
    /// its synchronize, so no two instances' requests are on the GPU at once (serve mode;
    /// `smore_sim_clients::dispatch`).
    #[arg(long, requires = "dispatch_slo_ms")]
    dispatch_board: Option<std::path::PathBuf>,
    /// The order of turns on the dispatch board: `edf` (deadline: arrival + SLO) or `fifo`.
    #[arg(long, default_value = "edf")]
    dispatch_order: smore_sim_clients::dispatch::Order,
    /// The SLO a request's deadline on the dispatch board is taken from, ms.
    #[arg(long, requires = "dispatch_board")]
    dispatch_slo_ms: Option<f64>,
}

use smore_sim_clients::monotonic_ns;

/// `smore_sim_truth_busy_until` of the simulated driver (sim/cuda): when a process's queued
/// kernels will have run, CLOCK_MONOTONIC ns (0: nothing queued).
type TruthBusyUntil = unsafe extern "C" fn(std::ffi::c_int, std::ffi::c_uint) -> u64;

/// The phase oracle of a study (`--phase-oracle-pid`): holds a request while the training job
/// has kernels queued, when the request can afford to wait them out.
struct PhaseOracle {
    busy_until: TruthBusyUntil,
    ordinal: std::ffi::c_int,
    trainer: u32,
    slo: Duration,
    /// Solo service time plus the margin: what a request keeps before its SLO after a hold.
    keep: Duration,
}

impl PhaseOracle {
    fn new(a: &Args) -> Result<Option<PhaseOracle>> {
        let (Some(trainer), Some(slo_ms)) = (a.phase_oracle_pid, a.phase_oracle_slo_ms) else {
            return Ok(None);
        };
        let h = smore_sim_clients::driver::libcuda_handle()?;
        // SAFETY: a live dlopen handle and a NUL-terminated name.
        let p = unsafe { libc::dlsym(h, c"smore_sim_truth_busy_until".as_ptr()) };
        if p.is_null() {
            anyhow::bail!(
                "--phase-oracle-pid needs the simulated GPU (its libcuda.so.1 exports smore_sim_truth_busy_until)"
            );
        }
        let ms = |what: &str, v: f64| {
            Duration::try_from_secs_f64(v / 1e3)
                .map_err(|_| anyhow::anyhow!("{what} {v}: give a number of ms ≥ 0"))
        };
        let slo = ms("--phase-oracle-slo-ms", slo_ms)?;
        let margin = ms("--phase-oracle-margin-ms", a.phase_oracle_margin_ms)?;
        let service = Duration::from_secs_f64(a.kernels as f64 * a.kernel_us.max(0.0) / 1e6);
        let keep = service
            .checked_add(margin)
            .ok_or_else(|| anyhow::anyhow!("--phase-oracle-margin-ms: too large"))?;
        Ok(Some(PhaseOracle {
            // SAFETY: the simulated driver exports this symbol with exactly this signature.
            busy_until: unsafe { std::mem::transmute::<*mut libc::c_void, TruthBusyUntil>(p) },
            ordinal: a.resolve.device,
            trainer,
            slo,
            keep,
        }))
    }

    /// Waits while the trainer has kernels queued and the request, which arrived at the platform
    /// `queued_ms` before `t`, can still meet its SLO after they have run. Returns the time it
    /// slept (zero when it did not hold: the look-ups themselves are not a hold).
    fn hold(&self, t: Instant, queued_ms: f64) -> Duration {
        let Some(deadline) = Duration::try_from_secs_f64(queued_ms / 1e3)
            .ok()
            .and_then(|q| t.checked_add(self.slo)?.checked_sub(q))
        else {
            return Duration::ZERO;
        };
        let mut slept = Duration::ZERO;
        loop {
            // SAFETY: the simulator's export takes plain integers and never fails.
            let until = unsafe { (self.busy_until)(self.ordinal, self.trainer) };
            let now_ns = monotonic_ns();
            if until <= now_ns {
                break;
            }
            let wait = Duration::from_nanos(until - now_ns);
            let after = Instant::now()
                .checked_add(wait)
                .and_then(|t| t.checked_add(self.keep));
            if after.is_none_or(|t| t > deadline) {
                break;
            }
            let before = Instant::now();
            std::thread::sleep(wait);
            slept += before.elapsed();
        }
        slept
    }
}

/// The arbiter preempted this instance.
struct Preempted {
    reason: smore_protocol::wire::PreemptReason,
    message: String,
    grace_ms: u64,
}

/// Request-level admission through the arbiter, when running under `smore run`.
struct Admission(Option<smore_protocol::conn::Client>);

impl Admission {
    fn connect() -> Admission {
        use smore_protocol::wire::{Reply, Request};
        let (Ok(inst), Ok(sock)) = (
            std::env::var("SMORE_INSTANCE"),
            std::env::var(smore_protocol::wire::ENV_SOCKET),
        ) else {
            return Admission(None);
        };
        let Ok(instance) = inst.parse() else {
            return Admission(None);
        };
        let Ok(c) = smore_protocol::conn::Client::connect(std::path::Path::new(&sock)) else {
            eprintln!("sim-function: arbiter unreachable; serving without admission");
            return Admission(None);
        };
        match c.call(Request::Attach { instance }) {
            Ok(Reply::Granted(_)) => Admission(Some(c)),
            r => {
                eprintln!("sim-function: cannot attach to instance {instance}: {r:?}");
                Admission(None)
            }
        }
    }

    fn admitted(&self, waited_ms: f64) -> Result<bool, Preempted> {
        use smore_protocol::wire::{Reply, Request};
        match &self.0 {
            None => Ok(true),
            Some(c) => match c.call(Request::Admit {
                request: None,
                waited_ms: Some(waited_ms),
            }) {
                Ok(Reply::Admission { admitted, .. }) => Ok(admitted),
                Ok(Reply::Preempted {
                    reason,
                    message,
                    grace_ms,
                }) => Err(Preempted {
                    reason,
                    message,
                    grace_ms,
                }),
                // The arbiter went away: fail open.
                _ => Ok(true),
            },
        }
    }

    /// Reports latencies; the answer says whether the instance was preempted.
    fn report(&self, latencies_ms: Vec<f64>) -> Result<(), Preempted> {
        use smore_protocol::wire::Reply;
        if let Some(c) = &self.0 {
            if let Ok(Reply::Preempted {
                reason,
                message,
                grace_ms,
            }) = c.call(smore_protocol::wire::Request::Report {
                latencies_ms,
                used_bytes: None,
                throttled_ns: None,
                refusals: None,
                gpu_ns: None,
                contention_ns: None,
                deferred_ns: None,
                turn_waited_ns: None,
                turn_cut_ins: None,
                measured_contention_ns: None,
                contention_ahead_ns: None,
                contention_shared: None,
                raw_shared: None,
            }) {
                return Err(Preempted {
                    reason,
                    message,
                    grace_ms,
                });
            }
        }
        Ok(())
    }
}

/// Longest a served latency waits before it is reported to the arbiter: 0.5 s (the arbiter
/// weighs deadline misses over 3 s: arbiter/src/harvest.rs, `USE_WINDOW_S`).
const REPORT_EVERY: Duration = Duration::from_millis(500);

fn serve(a: &Args, s: &Session, f: smore_sim_clients::driver::Ptr) -> Result<()> {
    use std::io::{BufRead, Write};
    // Load the model: device memory held while loaded, plus host-side load time.
    let mut ptr: cudarc::driver::sys::CUdeviceptr = 0;
    // SAFETY: cuMemAlloc_v2 resolved for this signature; out-pointer to a local.
    let rc = unsafe { (s.drv.cuMemAlloc)(&mut ptr, (a.model_memory_mib << 20) as usize) };
    s.drv.check(rc, "loading the model (cuMemAlloc)")?;
    std::thread::sleep(Duration::from_secs_f64(a.load_ms / 1e3));
    let stream = s.new_stream()?;
    let adm = Admission::connect();
    let oracle = PhaseOracle::new(a)?;
    let board = match (&a.dispatch_board, a.dispatch_slo_ms) {
        (Some(path), Some(slo_ms)) => {
            let slo = Duration::try_from_secs_f64(slo_ms / 1e3).map_err(|_| {
                anyhow::anyhow!("--dispatch-slo-ms {slo_ms}: give a number of ms ≥ 0")
            })?;
            Some((smore_sim_clients::dispatch::Board::open(path)?, slo))
        }
        _ => None,
    };
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready")?;
    out.flush()?;
    let mut done = Vec::new();
    let mut reported_at = Instant::now();
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let mut words = line.split_whitespace();
        let Some(id) = words.next() else {
            continue;
        };
        let queued_ms = words
            .next()
            .and_then(|w| w.parse::<f64>().ok())
            .filter(|w| w.is_finite() && *w >= 0.0)
            .unwrap_or(0.0);
        let t = Instant::now();
        let mut held = Duration::ZERO;
        let mut turn = Duration::ZERO;
        let waited = || queued_ms + t.elapsed().as_secs_f64() * 1e3;
        let preempted = |out: &mut std::io::StdoutLock, p: Preempted| -> Result<()> {
            writeln!(out, "failed id={id} error={:?}", p.message)?;
            writeln!(
                out,
                "preempted reason={} grace_ms={}",
                p.reason.as_str(),
                p.grace_ms
            )?;
            out.flush()?;
            Ok(())
        };
        let mut admitted = match adm.admitted(waited()) {
            Ok(x) => x,
            Err(p) => return preempted(&mut out, p),
        };
        while !admitted && waited() < a.give_up_ms {
            std::thread::sleep(Duration::from_secs_f64(a.retry_ms / 1e3));
            admitted = match adm.admitted(waited()) {
                Ok(x) => x,
                Err(p) => return preempted(&mut out, p),
            };
        }
        if admitted {
            let mut work: cudarc::driver::sys::CUdeviceptr = 0;
            if a.request_memory_mib > 0 {
                // SAFETY: cuMemAlloc_v2 resolved for this signature; out-pointer to a local.
                let rc =
                    unsafe { (s.drv.cuMemAlloc)(&mut work, (a.request_memory_mib << 20) as usize) };
                if let Err(e) = s.drv.check(rc, "request workspace (cuMemAlloc)") {
                    // Out of memory under the cap: ask the arbiter whether it preempted us.
                    match adm.report(Vec::new()) {
                        Err(p) => return preempted(&mut out, p),
                        Ok(()) => {
                            writeln!(out, "failed id={id} error={:?}", e.to_string())?;
                            out.flush()?;
                            continue;
                        }
                    }
                }
            }
            if let Some(o) = &oracle {
                held += o.hold(t, queued_ms);
            }
            if let Some((b, slo)) = &board {
                use smore_sim_clients::dispatch::Order;
                // The request arrived at the platform `queued_ms` before `t`.
                let arrival = monotonic_ns()
                    .saturating_sub(t.elapsed().as_nanos() as u64)
                    .saturating_sub((queued_ms * 1e6) as u64);
                turn += b.acquire(match a.dispatch_order {
                    Order::Edf => arrival.saturating_add(slo.as_nanos() as u64),
                    Order::Fifo => arrival,
                });
            }
            let ran = (|| -> Result<()> {
                for _ in 0..a.kernels {
                    s.launch(f, stream)?;
                }
                s.sync(stream)
            })();
            if let Some((b, _)) = &board {
                b.release();
            }
            ran?;
            if work != 0 {
                // SAFETY: `work` came from cuMemAlloc above and is freed once.
                let rc = unsafe { (s.drv.cuMemFree)(work) };
                s.drv.check(rc, "freeing the request workspace")?;
            }
        }
        let ms = t.elapsed().as_secs_f64() * 1e3;
        writeln!(
            out,
            "done id={id} service_ms={ms:.3} admitted={} held_ms={:.3} turn_ms={:.3}",
            admitted as u8,
            held.as_secs_f64() * 1e3,
            turn.as_secs_f64() * 1e3
        )?;
        out.flush()?;
        if admitted {
            done.push(ms);
        }
        if done.len() >= 32 || (!done.is_empty() && reported_at.elapsed() >= REPORT_EVERY) {
            reported_at = Instant::now();
            if let Err(p) = adm.report(std::mem::take(&mut done)) {
                writeln!(
                    out,
                    "preempted reason={} grace_ms={}",
                    p.reason.as_str(),
                    p.grace_ms
                )?;
                return Ok(());
            }
        }
    }
    let _ = adm.report(done);
    Ok(())
}

/// How request arrival instants are spaced (`--arrivals`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Arrivals {
    /// Every `--interval-ms`, on a fixed clock.
    Periodic,
    /// A Poisson process: independent exponential gaps of mean `--interval-ms`.
    Poisson,
}

/// The arrival instants of bursts 0, 1, 2, …, s after the start: 0 first, then gaps of
/// `interval_s` (periodic) or exponential gaps of that mean drawn from `seed` (Poisson).
struct ArrivalClock {
    arrivals: Arrivals,
    interval_s: f64,
    rng: rand::rngs::StdRng,
    /// The last burst whose instant was computed, and that instant.
    last: Option<(u64, f64)>,
}

impl ArrivalClock {
    fn new(arrivals: Arrivals, interval_ms: f64, seed: u64) -> Self {
        use rand::SeedableRng;
        ArrivalClock {
            arrivals,
            interval_s: interval_ms / 1e3,
            rng: rand::rngs::StdRng::seed_from_u64(seed),
            last: None,
        }
    }

    /// When burst `burst` arrives, s after the start. Bursts are asked for in order (the same
    /// one again, or the next): a Poisson clock adds one gap per new burst.
    fn at(&mut self, burst: u64) -> f64 {
        use rand::Rng;
        debug_assert!(
            self.last
                .map_or(burst == 0, |(b, _)| burst == b || burst == b + 1),
            "bursts are asked for in order"
        );
        let t = match (self.arrivals, self.last) {
            (Arrivals::Periodic, _) => burst as f64 * self.interval_s,
            (Arrivals::Poisson, Some((b, t))) if b == burst => t,
            (Arrivals::Poisson, None) => 0.0,
            (Arrivals::Poisson, Some((_, t))) => {
                // 1 − U is in (0, 1]: its logarithm is finite.
                let u: f64 = 1.0 - self.rng.gen::<f64>();
                t - u.ln() * self.interval_s
            }
        };
        self.last = Some((burst, t));
        t
    }
}

fn main() -> Result<()> {
    let a = Args::parse();
    if a.arrivals == Arrivals::Poisson && a.interval_ms <= 0.0 {
        anyhow::bail!(
            "--arrivals poisson needs a mean gap: give --interval-ms > 0 (0 is a closed loop, \
             back to back, which has no arrival instants)"
        );
    }
    let drv = a.resolve.load(None)?;
    let s = Session::open(drv, a.resolve.device, &[("infer", a.kernel_us)])?;
    let f = s.function("infer")?;
    if a.serve {
        return serve(&a, &s, f);
    }
    let streams = (0..a.streams)
        .map(|_| s.new_stream())
        .collect::<Result<Vec<_>>>()?;
    let start = Instant::now();
    let mut lat = Vec::new();
    let mut e2e = Vec::new();
    let mut i = 0u64;
    let mut clock = ArrivalClock::new(a.arrivals, a.interval_ms, a.seed);
    loop {
        if a.requests.is_some_and(|n| i >= n)
            || (a.requests.is_none() && start.elapsed().as_secs_f64() >= a.seconds)
        {
            break;
        }
        // Request i belongs to burst i / burst, which arrives at the clock's instant for it
        // ((i / burst) × interval, or the Poisson process's; open loop: a late instance queues
        // it). Back to back (interval 0) is a closed loop: a request
        // arrives when it is issued.
        let burst = i / a.burst;
        let due = if a.interval_ms > 0.0 {
            start + Duration::from_secs_f64(clock.at(burst))
        } else {
            Instant::now()
        };
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let t = Instant::now();
        for k in 0..a.kernels as usize {
            s.launch(f, streams[k % streams.len()])?;
        }
        for &stream in &streams {
            s.sync(stream)?;
        }
        let done = Instant::now();
        let ms = (done - t).as_secs_f64() * 1e3;
        let e2e_ms = (done - due).as_secs_f64() * 1e3;
        if !a.quiet {
            println!(
                "request={i} burst={burst} arrival_s={:.6} service_ms={ms:.3} e2e_ms={e2e_ms:.3} latency_ms={ms:.3}",
                (due - start).as_secs_f64()
            );
        }
        lat.push(ms);
        e2e.push(e2e_ms);
        i += 1;
    }
    let total = start.elapsed().as_secs_f64();
    let mut sorted = lat.clone();
    sorted.sort_by(f64::total_cmp);
    let mut e2e_sorted = e2e.clone();
    e2e_sorted.sort_by(f64::total_cmp);
    println!(
        "function requests={} p50_ms={:.3} p99_ms={:.3} mean_ms={:.3} requests_per_s={:.3} e2e_p50_ms={:.3} e2e_p99_ms={:.3}",
        lat.len(),
        percentile(&sorted, 50.0),
        percentile(&sorted, 99.0),
        lat.iter().sum::<f64>() / lat.len().max(1) as f64,
        lat.len() as f64 / total,
        percentile(&e2e_sorted, 50.0),
        percentile(&e2e_sorted, 99.0),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn periodic_arrivals_are_on_the_clock() {
        let mut c = ArrivalClock::new(Arrivals::Periodic, 3.0, 1);
        assert_eq!(c.at(0), 0.0);
        assert!((c.at(1) - 0.003).abs() < 1e-12);
        assert!((c.at(2) - 0.006).abs() < 1e-12);
    }

    #[test]
    fn poisson_arrivals_have_the_mean_rate_and_repeat_by_seed() {
        let instants = |seed| {
            let mut c = ArrivalClock::new(Arrivals::Poisson, 3.0, seed);
            (0..20_000u64).map(|b| c.at(b)).collect::<Vec<_>>()
        };
        let a = instants(7);
        assert_eq!(a[0], 0.0);
        assert!(a.windows(2).all(|w| w[1] > w[0]), "instants increase");
        // 20 000 gaps of mean 3 ms: the mean is within 2 % (its standard error is 0.7 %).
        let mean = a[a.len() - 1] / (a.len() - 1) as f64;
        assert!((mean / 0.003 - 1.0).abs() < 0.02, "mean gap {mean}");
        // Not a clock: about e⁻¹ of the gaps are longer than the mean.
        let long = a.windows(2).filter(|w| w[1] - w[0] > 0.003).count() as f64;
        let share = long / (a.len() - 1) as f64;
        assert!((share - (-1.0f64).exp()).abs() < 0.02, "{share}");
        assert_eq!(a, instants(7), "the same seed, the same instants");
        assert_ne!(a, instants(8));
        // The requests of one burst share its instant (`--burst`), and the next burst's gap is
        // the same one a clock asked once per burst draws.
        let mut c = ArrivalClock::new(Arrivals::Poisson, 3.0, 7);
        assert_eq!((c.at(0), c.at(0)), (0.0, 0.0));
        let t1 = c.at(1);
        assert_eq!((t1, c.at(1), c.at(1)), (a[1], a[1], a[1]));
        assert_eq!(c.at(2), a[2]);
    }
}
