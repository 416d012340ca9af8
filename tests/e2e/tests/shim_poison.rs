//! Cost poisoning of the launch gate (issue 12 item 10): one kernel function whose run time is
//! its argument (`smore_sim_spin`), launched short when the function expects the shim to sample
//! it and long otherwise, must still be held to its share. Before the fix the shim alone let
//! `pattern-load --pattern poison` hold 83 % of the GPU at a 20 % share (the cost table learnt
//! the short launch's cost, the calibration's ×4 bound hid the rest).
//!
//! Shares are the simulated node's per-process GPU time (`Node::gpu_time_of`, what NVML
//! reports), never what the shim believes; held within ±3 pp over ≥ 5 s, as in
//! `shim_patterns.rs`.

use smore_e2e::*;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// Tolerance of a measured share (the issue's ±3 pp acceptance bound, as in shim_patterns.rs).
const TOLERANCE: f64 = 0.03;
/// The share each poisoning function is held to, percent.
const SHARE: u32 = 20;
/// Steady-state measurement, s (the brief asks for ≥ 5 s).
const SECS: f64 = 5.0;
/// Start-up before measuring, s: first measurements, the initial bucket, the calibration's first
/// windows (NVML per-process samples are ~1/6 s apart; the calibration compares 0.5 s windows).
const SETTLE_S: f64 = 2.5;

fn sim() -> SimGpu {
    SimGpu::builder()
        .memory("8GiB")
        .context_memory("0")
        .build()
        .expect("simulated node")
}

/// A trainer of one 250 µs kernel + sync per iteration, always submitting, for `secs`.
fn trainer(sim: &SimGpu, secs: f64) -> Child {
    sim.command(bin("sim-trainer"))
        .args(["--kernel-us", "250", "--kernels", "1", "--quiet"])
        .args(["--seconds", &format!("{secs}")])
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

/// GPU share of `pid` on device 0 over `secs` from now.
fn share_of(node: &smore_simgpu::Node, pid: u32, secs: f64) -> f64 {
    let (t0, g0) = (Instant::now(), node.gpu_time_of(0, pid) as f64);
    std::thread::sleep(Duration::from_secs_f64(secs));
    let g1 = node.gpu_time_of(0, pid) as f64;
    (g1 - g0) / t0.elapsed().as_nanos() as f64
}

/// Share a poisoning `pattern` gets under the shim alone at [`SHARE`] beside a busy trainer.
fn alone(pattern: &str) -> f64 {
    let sim = sim();
    let node = sim.node();
    let mut t = trainer(&sim, SETTLE_S + SECS + 3.0);
    std::thread::sleep(Duration::from_millis(200));
    let mut f = sim
        .command(bin("pattern-load"))
        .env("LD_PRELOAD", shim_lib())
        .env("SMORE_SM_SHARE", SHARE.to_string())
        .args(["--pattern", pattern])
        .args(["--seconds", &format!("{}", SETTLE_S + SECS + 1.0)])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs_f64(SETTLE_S));
    let got = share_of(&node, f.id(), SECS);
    let status = f.wait().unwrap();
    let _ = t.kill();
    let _ = t.wait();
    assert!(status.success(), "{pattern} exited with {status}");
    got
}

fn assert_held(what: &str, got: f64) {
    eprintln!("{what}: {:.1} % at a {SHARE} % share", got * 100.0);
    assert!(
        (got - SHARE as f64 / 100.0).abs() <= TOLERANCE,
        "{what}: held {:.1} % of the GPU at a {SHARE} % share (± {} pp)",
        got * 100.0,
        TOLERANCE * 100.0
    );
}

#[test]
fn short_when_sampled_long_otherwise_is_held_to_the_share() {
    assert_held("poison (shim alone)", alone("poison"));
}

#[test]
fn a_short_launch_at_a_random_place_is_held_to_the_share() {
    assert_held("poison-mixed (shim alone)", alone("poison-mixed"));
}

#[test]
fn a_function_that_predicts_the_sampler_is_held_to_the_share() {
    assert_held("poison-detect (shim alone)", alone("poison-detect"));
}

/// Under the arbiter: the function runs under `smore run`, the operator sets its share to
/// [`SHARE`]; the node's accounting of its process is what counts. The function pulses (a 500 ms
/// pause every 1.5 s: at the default 250 ms sampling no 8 consecutive samples are over share +
/// 15) — before the fix it held ~60 % with no watchdog event. Held means at most its share
/// (+ tolerance): a correction below the share, or the watchdog's escalation, is what an attacker
/// gets.
#[test]
fn cost_poisoning_under_the_arbiter_is_held_to_the_share() {
    let sim = sim();
    let node = sim.node();
    // The daemon's default sampling period (the test harness's 50 ms would make the streak rule's 8
    // samples 0.4 s, shorter than any pulse worth making).
    let arb = Arbiter::new(&sim, "reconcile_ms = 250");
    let mut t = trainer(&sim, SETTLE_S + SECS + 8.0);
    arb.wait_for_training(0, Duration::from_secs(20));
    let mut f = arb
        .smore()
        .args(["run", "--function", "poison", "--memory", "64MiB", "--"])
        .arg(bin("pattern-load"))
        .args(["--pattern", "poison-detect"])
        .args(["--pulse-on-ms", "1500", "--pulse-off-ms", "500"])
        .args(["--seconds", &format!("{}", SETTLE_S + SECS + 3.0)])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut id = None;
    wait_until("the function registered", Duration::from_secs(20), || {
        id = arb
            .functions()
            .iter()
            .find(|x| x["function"] == "poison")
            .and_then(|x| x["id"].as_u64());
        id.is_some()
    });
    let out = run_ok(
        arb.smore()
            .args(["share", &id.unwrap().to_string(), &SHARE.to_string()]),
    )
    .unwrap();
    eprintln!("{out}");
    std::thread::sleep(Duration::from_secs_f64(SETTLE_S));
    let got = share_of(&node, f.id(), SECS);
    let status = f.wait().unwrap();
    let _ = t.kill();
    let _ = t.wait();
    eprintln!(
        "poison-detect (arbiter, pulsed): {:.1} % at a {SHARE} % share, exit {status}",
        got * 100.0
    );
    assert!(
        got <= SHARE as f64 / 100.0 + TOLERANCE,
        "a pulsed poisoning function held {:.1} % of the GPU at a {SHARE} % share\n{}",
        got * 100.0,
        arb.logs()
    );
}
