//! The whole loop on the simulated GPU: an unmodified trainer, an arbiter that discovers it
//! through NVML, and greedy functions (back-to-back requests) admitted under `smore run` — the
//! shares the arbiter grants must keep the trainer's slowdown within θ_train while the functions
//! get real GPU time. Run once per policy behind the seam.

use smore_e2e::{bin, num, summary, Arbiter, SimGpu, BUSY_TRAINER};
use smore_protocol::wire;
use std::process::{Child, Stdio};
use std::time::Duration;

/// θ_train given to the arbiter.
const THETA: f64 = 0.10;
/// Measurement slack on the slowdown (iteration times on a 2-core CI machine are noisy).
const SLACK: f64 = 0.04;

fn trainer(sim: &SimGpu, seconds: f64) -> std::process::Command {
    let mut c = sim.command(bin("sim-trainer"));
    c.args(BUSY_TRAINER)
        .args(["--seconds", &seconds.to_string()]);
    c
}

/// The iteration times (ms) `sim-trainer` printed, in order.
fn iter_ms(out: &str) -> Vec<f64> {
    out.lines()
        .filter_map(|l| l.strip_prefix("iter="))
        .filter_map(|l| l.split("ms=").nth(1)?.trim().parse().ok())
        .collect()
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

/// What one loop run measured.
struct Run {
    /// The trainer's slowdown while the functions ran (its iteration times against alone).
    slowdown: f64,
    /// The functions' raw shares, percent.
    shares: Vec<u32>,
    /// Their collision budgets, ppm (0: harvest off), in the shims' units: collisions as a shim
    /// measures them, with the other function too.
    budgets: Vec<u64>,
    /// The GPU's budget in the shims' units (`harvest.measured_budget_ppm`; 0: harvest off).
    measured_budget: u64,
    /// The share of the measured collisions the arbiter attributes to training.
    training_share: f64,
    /// Requests the functions served.
    served: f64,
    /// The arbiter's training-slowdown estimates seen while the functions ran.
    estimates: Vec<f64>,
    /// How long each function's shims held its launches (status `throttled_ns`, the most seen
    /// while the functions ran), ms.
    held_ms: Vec<f64>,
}

/// One loop at a time: each runs a trainer, two functions and an arbiter, and the trainer's
/// iteration times are the measurement — loops running side by side on a 2-core machine would
/// measure each other's CPU load, not GPU interference.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn run_loop(policy_toml: &str) -> Run {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let sim = SimGpu::builder()
        .devices(1)
        .memory("16GiB")
        .build()
        .unwrap();
    let arb = Arbiter::with_policy(&sim, &format!("theta_train = {THETA}\n{policy_toml}"));
    // Baseline: the trainer alone.
    let alone = trainer(&sim, 3.0).output().unwrap();
    let alone = mean(&iter_ms(&String::from_utf8_lossy(&alone.stdout))[5..]);
    // Co-located: the trainer runs; after the arbiter has seen it alone, two greedy functions.
    let tr = trainer(&sim, 9.0).stdout(Stdio::piped()).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(2000));
    let fns: Vec<Child> = ["resnet50:8", "mobilenet_v2:1"]
        .iter()
        .map(|model| {
            arb.smore()
                .args([
                    "run",
                    "--function",
                    model,
                    "--model",
                    model,
                    "--slo",
                    "200",
                    "--memory",
                    "1GiB",
                    "--shim",
                ])
                .arg(smore_e2e::shim_lib())
                .arg("--")
                .arg(bin("sim-function"))
                .args([
                    "--kernels",
                    "4",
                    "--kernel-us",
                    "400",
                    "--interval-ms",
                    "0",
                    "--seconds",
                    "5",
                    "--quiet",
                ])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    let snapshot = arb.status();
    let functions = snapshot["gpus"][0]["functions"].as_array().unwrap().clone();
    let shares: Vec<u32> = functions
        .iter()
        .map(|f| f["share"].as_u64().unwrap() as u32)
        .collect();
    let budgets: Vec<u64> = functions
        .iter()
        .map(|f| f["contention_ppm"].as_u64().unwrap())
        .collect();
    let harvest = &snapshot["gpus"][0]["harvest"];
    let measured_budget = harvest["measured_budget_ppm"].as_u64().unwrap_or(0);
    let training_share = harvest["training_share"].as_f64().unwrap_or(1.0);
    // The estimate over the functions' run (10 s window: it includes ~2 s before they came).
    let mut estimates = Vec::new();
    // What each function's shims reported holding, the most seen (by instance id).
    let mut held: std::collections::BTreeMap<u64, u64> = Default::default();
    for _ in 0..6 {
        std::thread::sleep(Duration::from_millis(500));
        let st = arb.status();
        if let Some(e) = st["gpus"][0]["harvest"]["slowdown_estimate"].as_f64() {
            estimates.push(e);
        }
        for f in st["gpus"][0]["functions"].as_array().into_iter().flatten() {
            let (id, t) = (f["id"].as_u64().unwrap_or(0), f["throttled_ns"].as_u64());
            let most = held.entry(id).or_default();
            *most = (*most).max(t.unwrap_or(0));
        }
    }
    let held_ms: Vec<f64> = held.values().map(|&ns| ns as f64 / 1e6).collect();
    let mut served = 0.0;
    for f in fns {
        let out = f.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let refused_for_training =
            out.status.code() == Some(wire::RefuseCode::TrainingBound.exit_code());
        if refused_for_training {
            // A predicted violation of θ_train is a legitimate refusal (smore policy).
            continue;
        }
        assert!(
            out.status.success(),
            "{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        served += num(&summary(&stdout, "function"), "requests");
    }
    let out = tr.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    // Iterations while the functions ran: from ~2.5 s to ~7.5 s of the 9 s run (≈ 55 ms each).
    let v = iter_ms(&text);
    let during: Vec<f64> = v.iter().copied().skip(50).take(80).collect();
    let colocated = mean(&during);
    Run {
        slowdown: colocated / alone - 1.0,
        shares,
        budgets,
        measured_budget,
        training_share,
        served,
        estimates,
        held_ms,
    }
}

#[test]
fn the_fit_policy_keeps_the_trainer_within_theta_while_functions_run() {
    let Run {
        slowdown,
        shares,
        served,
        held_ms,
        ..
    } = run_loop("name = \"fit\"\nharvest = false");
    eprintln!(
        "fit: trainer slowdown {:.1} %, shares {shares:?}, held {held_ms:?} ms, function requests \
         served {served}",
        slowdown * 100.0
    );
    assert_eq!(shares.len(), 2, "both functions admitted");
    assert!(
        shares.iter().all(|&s| s < 100),
        "a training job is present: shares are bounded {shares:?}"
    );
    // Greedy functions under a share below 100 wait for their gate, and their shims say so.
    assert!(
        held_ms.len() == 2 && held_ms.iter().all(|&h| h > 0.0),
        "both shims report the time their launches were held: {held_ms:?} ms"
    );
    assert!(
        served > 100.0,
        "the functions got GPU time ({served} requests)"
    );
    assert!(
        slowdown <= THETA + SLACK,
        "trainer slowed by {:.1} % > θ_train {:.0} %",
        slowdown * 100.0,
        THETA * 100.0
    );
}

#[test]
fn the_smore_policy_keeps_the_trainer_within_theta_while_functions_run() {
    let Run {
        slowdown,
        shares,
        served,
        ..
    } = run_loop("name = \"smore\"\nharvest = false");
    eprintln!(
        "smore: trainer slowdown {:.1} %, shares {shares:?}, function requests served {served}",
        slowdown * 100.0
    );
    // resnet50:8 alone would exceed θ_train at a full share (D̂_train 0.119 > 0.1); it is
    // admitted at the smaller share that keeps θ_train and its SLO.
    assert_eq!(shares.len(), 2, "both functions admitted: {shares:?}");
    assert!(served > 0.0);
    assert!(
        slowdown <= THETA + SLACK,
        "trainer slowed by {:.1} % > θ_train {:.0} %",
        slowdown * 100.0,
        THETA * 100.0
    );
}

#[test]
fn harvest_keeps_the_trainer_within_theta_and_publishes_an_estimate_of_its_slowdown() {
    let r = run_loop("name = \"fit\"");
    eprintln!(
        "harvest: trainer slowdown {:.1} %, shares {:?}, budgets {:?} ppm, requests served {}, estimates {:?}",
        r.slowdown * 100.0,
        r.shares,
        r.budgets,
        r.served,
        r.estimates
    );
    assert_eq!(
        r.shares,
        vec![100, 100],
        "harvest: no raw share beside training"
    );
    // The split hands out the GPU's budget in the shims' units, and the part of it the arbiter
    // attributes to training stays within θ/(1+θ) = 90 909 ppm (docs/harvest.md).
    assert!(
        r.budgets.iter().all(|&b| b > 0) && r.budgets.iter().sum::<u64>() <= r.measured_budget,
        "the GPU's budget ({} ppm) is split among the functions: {:?}",
        r.measured_budget,
        r.budgets
    );
    assert!(
        r.measured_budget as f64 * r.training_share <= 90_910.0,
        "the training-attributed budget {} ppm × {:.2} is within θ/(1+θ)",
        r.measured_budget,
        r.training_share
    );
    assert!(
        r.served > 100.0,
        "the functions got GPU time ({})",
        r.served
    );
    assert!(
        r.slowdown <= THETA + SLACK,
        "trainer slowed by {:.1} % > θ_train {:.0} %",
        r.slowdown * 100.0,
        THETA * 100.0
    );
    assert!(
        !r.estimates.is_empty(),
        "the arbiter publishes its estimate"
    );
    // The estimate's window (10 s) holds the functions' run only in part — they start ~2 s into
    // the trainer's 9 s and the last poll comes ~4.5 s after — so it reads about half the truth
    // here (2026-11-28, debug build: 5.3–5.8 % against 10.3–10.6 %; the estimate's accuracy
    // over a window the functions fill is `tests/e2e/tests/harvest_estimate.rs`). It must be of
    // the truth's size: not near zero (blind), and not over it by NVML's noise.
    let last = *r.estimates.last().unwrap();
    assert!(
        last >= 0.3 * r.slowdown && last <= r.slowdown + 0.05,
        "estimate {:.1} % vs the trainer's own {:.1} %",
        last * 100.0,
        r.slowdown * 100.0
    );
}
