//! The SM share holds whatever the launch pattern: a shimmed `pattern-load` held to 10 / 20 / 50 %
//! beside a busy unshimmed trainer gets its share ± 3 pp with batches of short kernels and a
//! synchronize after each batch, single long kernels, many tiny kernels, and graphs.
//!
//! Shares are measured from the simulated node's per-process GPU time (`Node::gpu_time_of`), the
//! same accounting NVML reports, never from what the shim believes.
//!
//! Each pattern runs under both interference models of the simulated GPU: time-sliced contexts
//! (the default) and MPS (kernels of different processes concurrent, slowing each other; a
//! process's GPU time is the time its kernels ran, slowed or not — what NVML reports and what the
//! shim's event pairs measure, docs/simgpu.md "MPS mode").

use smore_e2e::*;
use smore_simgpu::SchedMode;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// Tolerance of a measured share, in fractions of the GPU: ±3 percentage points (the issue's
/// acceptance bound).
const TOLERANCE: f64 = 0.03;
/// Shares every pattern is held to, percent.
const SHARES: [u32; 3] = [10, 20, 50];
/// Steady-state measurement per run, s (three runs of a pattern side by side; long enough that the
/// calibration's settling and a loaded machine's noise stay inside the tolerance).
const SECS: f64 = 4.0;

fn sim(mode: SchedMode) -> SimGpu {
    SimGpu::builder()
        .memory("8GiB")
        .context_memory("0")
        .mode(mode)
        .build()
        .expect("simulated node")
}

/// GPU share `pattern` gets at `share` % beside a trainer of one 250 µs kernel + sync per
/// iteration (always submitting; the function can get up to ~89 % beside it, see shim_share.rs),
/// measured over `secs` of steady state.
fn measure(mode: SchedMode, pattern: &'static str, share: u32, secs: f64) -> f64 {
    measure_with(mode, pattern, share, secs, &[])
}

fn measure_with(mode: SchedMode, pattern: &str, share: u32, secs: f64, extra: &[String]) -> f64 {
    let sim = sim(mode);
    let node = sim.node();
    let mut trainer: Child = sim
        .command(bin("sim-trainer"))
        .args(["--kernel-us", "250", "--kernels", "1", "--quiet"])
        .args(["--seconds", &format!("{}", secs + 3.5)])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let mut function: Child = sim
        .command(bin("pattern-load"))
        .env("LD_PRELOAD", shim_lib())
        .env("SMORE_SM_SHARE", share.to_string())
        .args(["--pattern", pattern])
        .args(extra)
        .args(["--seconds", &format!("{}", secs + 2.0)])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let gpu = |c: &Child| node.gpu_time_of(0, c.id()) as f64;
    // Past start-up (first measurements, the initial bucket, the calibration's first windows).
    std::thread::sleep(Duration::from_millis(1500));
    let (t0, f0) = (Instant::now(), gpu(&function));
    std::thread::sleep(Duration::from_secs_f64(secs));
    let f1 = gpu(&function);
    let wall = t0.elapsed().as_nanos() as f64;
    let status = function.wait().unwrap();
    assert!(status.success(), "{pattern} exited with {status}");
    let _ = trainer.kill();
    let _ = trainer.wait();
    (f1 - f0) / wall
}

/// One pattern at a time (its three shares side by side): the `tiny` pattern is launch-bound,
/// and six simulated runs at once on a 2-core machine leave it too little CPU to even offer 50 %
/// of the GPU (measured: 20.5 % at 50 % with two patterns running together).
static ONE_PATTERN_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs `pattern` at every share side by side and checks each got its share.
fn check(pattern: &'static str) {
    check_in(SchedMode::TimeSlice, pattern)
}

/// [`check`] on a GPU in `mode`.
fn check_in(mode: SchedMode, pattern: &'static str) {
    let _one = ONE_PATTERN_AT_A_TIME
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let handles: Vec<_> = SHARES
        .into_iter()
        .map(|s| std::thread::spawn(move || (s, measure(mode, pattern, s, SECS))))
        .collect();
    let got: Vec<(u32, f64)> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let table = got
        .iter()
        .map(|(s, g)| format!("{mode:?}: {pattern} at {s} %: {:.1} %", g * 100.0))
        .collect::<Vec<_>>()
        .join("\n");
    eprintln!("{table}");
    for (s, g) in &got {
        assert!(
            (g - *s as f64 / 100.0).abs() <= TOLERANCE,
            "{pattern} held to {s} % got {:.1} %\n{table}",
            g * 100.0
        );
    }
}

#[test]
fn batches_of_short_kernels_with_a_sync_each_get_their_share() {
    check("batch-sync");
}

#[test]
fn single_long_kernels_get_their_share() {
    check("long");
}

#[test]
fn many_tiny_kernels_get_their_share() {
    check("tiny");
}

#[test]
fn graphs_get_their_share() {
    check("graph");
}

#[test]
fn batches_of_short_kernels_with_a_sync_each_get_their_share_under_mps() {
    check_in(SchedMode::Mps, "batch-sync");
}

#[test]
fn single_long_kernels_get_their_share_under_mps() {
    check_in(SchedMode::Mps, "long");
}

#[test]
fn many_tiny_kernels_get_their_share_under_mps() {
    check_in(SchedMode::Mps, "tiny");
}

#[test]
fn graphs_get_their_share_under_mps() {
    check_in(SchedMode::Mps, "graph");
}
