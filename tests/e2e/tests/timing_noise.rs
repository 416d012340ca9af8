//! The node's timing-noise allowance (`[gpus] wait_noise_us`, `stretch_noise_us`; docs/harvest.md,
//! "Timing noise") reaches the shims through the grant and is taken off every wait and stretch
//! before a sample is judged: with 1 ms off each, no traced sample collided by more than what it
//! measured beyond that; with none (the simulated GPU's exact timestamps), some did.

use smore_e2e::*;
use smore_simgpu::SchedMode;
use std::process::{Child, Stdio};
use std::time::Duration;

/// One run at a time (host-time measurements; see tests/e2e/tests/harvest_estimate.rs).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The traced samples (`SMORE_TRACE_SAMPLES`) of one harvesting function (4 × 300 µs every
/// 6 ms) beside a trainer busy about a quarter of the time, on a node whose allowance is
/// `noise_us` for a wait and for a stretch: each judged sample's (measured ns, solo ns, wait ns
/// or −1, collided ns).
fn judged_samples(noise_us: u32) -> Vec<[i128; 4]> {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let sim = SimGpu::builder()
        .memory("16GiB")
        .mode(SchedMode::TimeSlice)
        .build()
        .expect("simulated node");
    let arb = Arbiter::new(
        &sim,
        &format!(
            "\n[gpus]\nwait_noise_us = {noise_us}\nstretch_noise_us = {noise_us}\n\n[policy]\nname = \"fit\"\nturns = \"off\"\n"
        ),
    );
    let mut trainer: Child = sim.low_trainer_alone_first(10);
    arb.wait_for_training(0, Duration::from_secs(10));
    let dir = tempfile::tempdir().unwrap();
    let pattern = dir.path().join("samples-{pid}.txt");
    let mut function = arb
        .smore()
        .args(["run", "--function", "f", "--slo", "100"])
        .args(["--memory", "1GiB", "--shim"])
        .arg(shim_lib())
        .arg("--")
        .arg(bin("sim-function"))
        .args(["--kernels", "4", "--kernel-us", "300", "--interval-ms", "6"])
        .args(["--seconds", "4", "--quiet"])
        .env("SMORE_TRACE_SAMPLES", &pattern)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("smore run sim-function");
    assert!(function.wait().unwrap().success(), "function failed");
    let _ = trainer.kill();
    let _ = trainer.wait();
    let mut rows = Vec::new();
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        for l in text.lines().filter(|l| !l.starts_with('#')) {
            let f: Vec<i128> = l.split(' ').map(|x| x.parse().unwrap()).collect();
            // Judged samples only (a first measurement has no solo cost).
            if f[3] >= 0 {
                rows.push([f[2], f[3], f[4], f[5]]);
            }
        }
    }
    rows
}

/// The most a sample measured `ns` (solo `d0`, waited `wait`, −1 unknown) can be judged to have
/// collided with `noise` ns off its wait and its stretch: `min(d0, wait − noise) + min(d0,
/// ns − noise − d0)`, or twice its solo cost where its wait is not known (a chained wait's share
/// is at most its own cost, and so is its stretch).
fn most(r: &[i128; 4], noise: i128) -> i128 {
    let [ns, d0, wait, _] = *r;
    let stretch = (ns - noise - d0).clamp(0, d0);
    if wait < 0 {
        return 2 * d0;
    }
    (wait - noise).clamp(0, d0) + stretch
}

#[test]
fn the_nodes_timing_noise_allowance_reaches_the_shims_judgement() {
    const US: i128 = 1_000;
    let noisy = judged_samples(1_000);
    assert!(noisy.len() >= 50, "{} samples traced", noisy.len());
    let over: Vec<_> = noisy
        .iter()
        .filter(|r| r[3] > most(r, 1_000 * US))
        .collect();
    assert!(
        over.is_empty(),
        "{} of {} samples collided by more than they measured beyond 1 ms: {:?}",
        over.len(),
        noisy.len(),
        &over[..over.len().min(5)]
    );
    // Without the allowance the same bound fails: samples that waited for the trainer's 2 ms
    // kernels by less than 1 ms beyond their own cost collided by what they waited.
    let exact = judged_samples(0);
    let over = exact.iter().filter(|r| r[3] > most(r, 1_000 * US)).count();
    eprintln!(
        "allowance 1 ms: {} samples; none: {} samples, {over} over the 1 ms bound",
        noisy.len(),
        exact.len()
    );
    assert!(
        over > 0,
        "with no allowance some sample should have collided by a wait under 1 ms past its cost"
    );
}
