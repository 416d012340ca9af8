//! A light function under a small share beside a busy, unshimmed trainer is held to its *own*
//! GPU use, not to time the trainer used. On a time-sliced GPU the event-to-event time of a
//! function's kernel includes the trainer's timeslices; charging that would throttle a function
//! using 5 % of the GPU under a 15 % share (it did: its throughput fell from 30 to 22 requests/s
//! and its P50 rose from 3.6 to 45 ms before the cost estimator learnt to discount inflated
//! samples — see `shim/src/gate.rs`).

use smore_e2e::*;
use std::process::Stdio;

#[test]
fn a_light_function_under_a_small_share_serves_its_offered_load() {
    let sim = SimGpu::builder()
        .memory("8GiB")
        .build()
        .expect("simulated node");
    // A busy trainer (≈ 72 % of the GPU).
    let trainer = sim
        .command(bin("sim-trainer"))
        .args(BUSY_TRAINER)
        .args(["--seconds", "6", "--quiet"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    // Function: 4 × 400 µs per request every 33 ms ≈ 5 % of the GPU, held to a 15 % share.
    let out = run_ok(
        sim.shimmed(bin("sim-function"), &[("SMORE_SM_SHARE", "15")])
            .args([
                "--kernels",
                "4",
                "--kernel-us",
                "400",
                "--interval-ms",
                "33",
                "--seconds",
                "4",
                "--quiet",
            ]),
    )
    .unwrap();
    let f = summary(&out, "function");
    let offered = 4.0 / 0.033;
    let served = num(&f, "requests");
    assert!(
        served >= 0.9 * offered,
        "served {served} of {offered:.0} offered requests: the share was charged for the trainer's time\n{out}"
    );
    let t = trainer.wait_with_output().unwrap();
    assert!(t.status.success());
}
