//! Turns (docs/harvest.md, "Serializing the functions"; docs/shim.md, "Turns"): two harvesting
//! functions on a time-sliced GPU beside a trainer take turns through the GPU's board, so their
//! kernels wait on the GPU behind each other far less than without turns.
//!
//! What a function waited behind the other is read from the simulated node's ground truth
//! (`Node::truth_of`, never visible to the arbiter or the shims): on a time-sliced GPU the
//! functions' waits sum to what the trainer imposed on them plus what they imposed on each other,
//! so the second is `Σ interference(function) − imposed(trainer)` when the trainer waits only
//! behind functions.
//!
//! The same run checks that the shims post their samples to the board and that the arbiter reads
//! the trainer's phase from them (docs/harvest.md, "Phase prediction").

use smore_e2e::*;
use smore_simgpu::SchedMode;
use std::process::Child;
use std::time::{Duration, Instant};

/// One run at a time (host-time measurements; see tests/e2e/tests/harvest_estimate.rs).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// What one run measured over its window.
#[derive(Debug)]
struct Run {
    /// The functions' waits behind each other, as a fraction of wall time.
    behind_each_other: f64,
    /// The functions' waits behind the trainer, as a fraction of wall time.
    behind_trainer: f64,
    /// The trainer's phase as the arbiter reads it from the samples on the turn board (status
    /// `harvest.trainer_phase`: null when it cannot be read).
    phase: serde_json::Value,
    /// What the functions' shims reported waiting for their turns, ms (status).
    turn_waited_ms: f64,
}

/// Two functions (4 × 300 µs every 6 ms and every 7 ms: 37 % of the GPU together) beside a
/// trainer busy about a quarter of the time, with `[policy] turns = turns`; measured over 6 s.
/// Their periods differ so that their requests drift against each other and meet whatever their
/// start: with one period for both, how often they met was set by how far apart they happened
/// to start (CI once measured 1.7 % of wall time waited behind each other without turns, other
/// runs 6 %).
fn run(turns: &str) -> Run {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let sim = SimGpu::builder()
        .memory("16GiB")
        .mode(SchedMode::TimeSlice)
        .build()
        .expect("simulated node");
    let node = sim.node();
    let arb = Arbiter::new(
        &sim,
        &format!("\n[policy]\nname = \"fit\"\nturns = {turns:?}\n"),
    );
    let mut trainer: Child = sim.low_trainer_alone_first(14);
    let fns: Vec<Child> = (0..2)
        .map(|i| {
            let every = (6 + i).to_string();
            arb.run_sim_function(
                &format!("f{i}"),
                &[
                    "--kernels",
                    "4",
                    "--kernel-us",
                    "300",
                    "--interval-ms",
                    &every,
                    "--seconds",
                    "10",
                    "--quiet",
                ],
            )
        })
        .collect();
    let truth = |pid: u32| node.truth_of(0, pid).expect("a slot on the node");
    let sum = || {
        let t = truth(trainer.id());
        let waited: u64 = fns.iter().map(|f| truth(f.id()).interference_ns).sum();
        (Instant::now(), t.imposed_ns, waited)
    };
    std::thread::sleep(Duration::from_millis(1500));
    let (t0, imposed0, waited0) = sum();
    std::thread::sleep(Duration::from_secs(6));
    let (t1, imposed1, waited1) = sum();
    // The trainer's phase from the functions' samples: looked at a few times (a window of the
    // ring may, at one instant, hold too few whole phases), while the functions still run.
    let mut phase = serde_json::Value::Null;
    for _ in 0..10 {
        phase = arb.status()["gpus"][0]["harvest"]["trainer_phase"].clone();
        if !phase.is_null() {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let status = arb.status();
    let turn_waited_ms: f64 = status["gpus"][0]["functions"]
        .as_array()
        .expect("functions in the status")
        .iter()
        .map(|f| f["turn_waited_ns"].as_u64().unwrap_or(0) as f64 / 1e6)
        .sum();
    for mut f in fns {
        let _ = f.kill();
        let _ = f.wait();
    }
    let _ = trainer.kill();
    let _ = trainer.wait();
    let wall = (t1 - t0).as_secs_f64() * 1e9;
    let behind_trainer = (imposed1 - imposed0) as f64;
    let r = Run {
        behind_each_other: ((waited1 - waited0) as f64 - behind_trainer).max(0.0) / wall,
        behind_trainer: behind_trainer / wall,
        phase,
        turn_waited_ms,
    };
    eprintln!("turns {turns}: {r:?}");
    r
}

#[test]
fn harvesting_functions_on_a_time_sliced_gpu_take_turns() {
    let off = run("off");
    let on = run("auto");
    // Without turns they do wait behind each other (else this test could not fail).
    assert!(
        off.behind_each_other > 0.01,
        "without turns the functions barely met: {off:?}"
    );
    // Turns do not hide the trainer: the functions still wait behind it.
    assert!(
        on.behind_trainer > 0.01 && off.behind_trainer > 0.01,
        "the trainer was busy beside them: on {on:?}, off {off:?}"
    );
    assert_eq!(off.turn_waited_ms, 0.0, "no board, no turns: {off:?}");
    assert!(
        on.turn_waited_ms > 0.0,
        "the shims waited for turns: {on:?}"
    );
    // The shims post their samples to the board and the arbiter reads the trainer's phase from
    // them: the `low` trainer is 4 × 2 ms of kernels (stretched by what collides with them) and
    // 24 ms of host work per iteration. Without turns the arbiter reads no phase.
    assert!(off.phase.is_null(), "no turns, no phase: {off:?}");
    let ms = |k: &str| on.phase[k].as_f64().unwrap_or(f64::NAN);
    assert!(
        (4.0..=30.0).contains(&ms("busy_ms")) && (12.0..=40.0).contains(&ms("idle_ms")),
        "the trainer's phases read from the functions' samples: {on:?}"
    );
    assert!(
        on.behind_each_other < 0.5 * off.behind_each_other,
        "with turns the functions' waits behind each other fall by half at least: on {on:?}, off {off:?}"
    );
}
