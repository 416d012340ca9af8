//! The arbiter's training-slowdown estimate against the simulated node's ground truth
//! (`Node::truth_of`: the interference the trainer accrued, never visible to the arbiter), beside
//! several functions that also collide with each other. Once per interference model of the
//! simulated GPU: time-sliced contexts and MPS.
//!
//! A shim counts every collision it sees, with other functions too; the arbiter attributes each
//! function's collisions to training by training's part of what the GPU ran
//! (`smore_arbiter::harvest::training_share`; docs/harvest.md, "The estimate beside several
//! functions"). Before that attribution this test read 26–31 % against a true 9–10 % time-sliced
//! and 8.0–8.9 % against 5.5–5.6 % under MPS; the harvest issue's target — within 2 pp of the
//! truth — is checked in both modes.
//!
//! The window: the arbiter's estimate covers the last 10 s ([`WINDOW`]); the truth is taken over
//! the same 10 s, as `c / (1 − c)` with c the trainer's interference over wall time.

use smore_e2e::*;
use smore_simgpu::SchedMode;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// The estimate's window, s (`smore_arbiter::harvest::WINDOW_S`).
const WINDOW: f64 = 10.0;
/// How far the estimate may be from the truth: 2 pp (the harvest issue's accuracy target).
const TOLERANCE: f64 = 0.02;
/// Functions beside the trainer.
const FUNCTIONS: usize = 4;

/// One run: (the arbiter's estimate, the true slowdown), over the same 10 s.
fn estimate_and_truth(mode: SchedMode) -> (f64, f64) {
    let sim = SimGpu::builder()
        .memory("16GiB")
        .mode(mode)
        .build()
        .expect("simulated node");
    let node = sim.node();
    let arb = Arbiter::with_policy(&sim, "name = \"fit\"");
    // Busy about a quarter of the time (4 × 2 ms kernels, 24 ms of host work per iteration).
    let mut trainer: Child = sim
        .command(bin("sim-trainer"))
        .args(["--profile", "low", "--seconds", "20", "--quiet"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    // The arbiter trusts the trainer's solo utilization after 2 s alone.
    std::thread::sleep(Duration::from_millis(2500));
    let fns: Vec<Child> = (0..FUNCTIONS)
        .map(|i| {
            arb.smore()
                .args(["run", "--function", &format!("f{i}"), "--slo", "100"])
                .args(["--memory", "1GiB", "--shim"])
                .arg(shim_lib())
                .arg("--")
                .arg(bin("sim-function"))
                // 4 × 300 µs every 12 ms: 10 % of the GPU each, 40 % together.
                .args([
                    "--kernels",
                    "4",
                    "--kernel-us",
                    "300",
                    "--interval-ms",
                    "12",
                ])
                .args(["--seconds", "15", "--quiet"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    let truth = || {
        let t = node.truth_of(0, trainer.id()).expect("the trainer's slot");
        (Instant::now(), t.interference_ns)
    };
    std::thread::sleep(Duration::from_millis(1500));
    let (t0, i0) = truth();
    std::thread::sleep(Duration::from_secs_f64(WINDOW));
    let (t1, i1) = truth();
    let status = arb.status();
    let h = &status["gpus"][0]["harvest"];
    let estimate = h["slowdown_estimate"]
        .as_f64()
        .unwrap_or_else(|| panic!("no estimate in {h}"));
    let c = (i1 - i0) as f64 / 1e9 / (t1 - t0).as_secs_f64();
    for mut f in fns {
        let _ = f.kill();
        let _ = f.wait();
    }
    let _ = trainer.kill();
    let _ = trainer.wait();
    (estimate, c / (1.0 - c))
}

/// Runs once and checks that the functions slowed the trainer; (estimate, truth).
fn measured(mode: SchedMode) -> (f64, f64) {
    let (est, truth) = estimate_and_truth(mode);
    eprintln!(
        "{mode:?}: estimate {:.1} %, truth {:.1} %",
        est * 100.0,
        truth * 100.0
    );
    assert!(truth > 0.005, "the functions slowed the trainer ({truth})");
    (est, truth)
}

/// The estimate never reads more than [`TOLERANCE`] below the truth: an error there would let
/// the calibration grow the functions' budget past θ.
fn errs_on_trainings_side(mode: SchedMode) {
    let (est, truth) = measured(mode);
    assert!(
        est >= truth - TOLERANCE,
        "{mode:?}: estimate {:.1} % under the true {:.1} %",
        est * 100.0,
        truth * 100.0
    );
}

/// The harvest issue's target.
fn within_tolerance(mode: SchedMode) {
    let (est, truth) = measured(mode);
    assert!(
        (est - truth).abs() <= TOLERANCE,
        "{mode:?}: estimate {:.1} % vs true {:.1} %",
        est * 100.0,
        truth * 100.0
    );
}

#[test]
fn the_estimate_errs_on_the_trainers_side_beside_several_functions_time_sliced() {
    errs_on_trainings_side(SchedMode::TimeSlice);
}

#[test]
fn the_estimate_errs_on_the_trainers_side_beside_several_functions_under_mps() {
    errs_on_trainings_side(SchedMode::Mps);
}

#[test]
fn the_estimate_is_within_2_pp_beside_several_functions_time_sliced() {
    within_tolerance(SchedMode::TimeSlice);
}

#[test]
fn the_estimate_is_within_2_pp_beside_several_functions_under_mps() {
    within_tolerance(SchedMode::Mps);
}
