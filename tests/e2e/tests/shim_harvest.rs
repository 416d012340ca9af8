//! Harvest mode: a function with raw share 100 and a small contention budget `c` beside a trainer
//! with idle gaps gets much more GPU time than `c` (the trainer's idle time costs it nothing),
//! while the trainer's iterations slow down by about `c / (1 − c)` at most.
//!
//! GPU time is the simulated node's per-process ledger (`Node::gpu_time_of`); the trainer's
//! slowdown is its own mean iteration time (what `sim-trainer` prints) against a solo run on a
//! twin node.

use smore_e2e::*;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// The function's contention budget: 5 % of wall time (50 000 ppm).
const BUDGET_PPM: u32 = 50_000;
/// Trainer: 5 × 2 ms kernels then 10 ms of host work per iteration (busy about half the time).
const TRAINER: [&str; 6] = ["--kernel-us", "2000", "--kernels", "5", "--host-ms", "10"];
/// Trainer run, s (the function runs through all of it).
const TRAINER_SECS: f64 = 5.0;
/// Slack on the slowdown bound: 5 pp. Reasoning: the trainer's mean iteration time varies ±2 %
/// between solo runs on a loaded 2-core machine (wall-clock), and collisions in which the trainer
/// waits for the function's running batch are not seen by the function (≈ 1–2 pp here, see
/// docs/shim.md); measured slowdowns at a 5 % budget were 3.6–9.6 % against a bound of 5.3 %.
const SLOWDOWN_SLACK: f64 = 0.05;

fn sim() -> SimGpu {
    SimGpu::builder()
        .memory("8GiB")
        .context_memory("0")
        .build()
        .expect("simulated node")
}

/// Mean iteration time (ms) from `sim-trainer`'s summary line.
fn mean_ms(out: &str) -> f64 {
    let l = parse_lines(out);
    let t = l
        .iter()
        .find(|f| f.contains_key("mean_ms"))
        .unwrap_or_else(|| panic!("no summary in {out}"));
    num(t, "mean_ms")
}

fn trainer(sim: &SimGpu) -> Child {
    sim.command(bin("sim-trainer"))
        .args(TRAINER)
        .args(["--seconds", &TRAINER_SECS.to_string(), "--quiet"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

/// (trainer mean iteration ms, function's share of the GPU) with a function at raw share 100 and
/// contention budget `budget_ppm` (0 = harvest off: the function is not held at all).
fn colocated(budget_ppm: u32) -> (f64, f64) {
    let sim = sim();
    let node = sim.node();
    let mut function: Child = sim
        .command(bin("pattern-load"))
        .env("LD_PRELOAD", shim_lib())
        .env("SMORE_SM_SHARE", "100")
        .env("SMORE_CONTENTION_PPM", budget_ppm.to_string())
        .args(["--pattern", "batch-sync"])
        .args(["--seconds", &format!("{}", TRAINER_SECS + 1.0)])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let t = trainer(&sim);
    let gpu = || node.gpu_time_of(0, function.id()) as f64;
    std::thread::sleep(Duration::from_millis(300));
    let (t0, f0) = (Instant::now(), gpu());
    std::thread::sleep(Duration::from_secs_f64(TRAINER_SECS - 0.6));
    let share = (gpu() - f0) / t0.elapsed().as_nanos() as f64;
    let out = t.wait_with_output().unwrap();
    assert!(out.status.success(), "trainer: {}", out.status);
    let status = function.wait().unwrap();
    assert!(status.success(), "function exited with {status}");
    (mean_ms(&String::from_utf8_lossy(&out.stdout)), share)
}

/// Trainer mean ms/iter beside a function whose requests — 4 × 1 ms kernels, then a sync —
/// arrive every 10 ms: bursts spaced past the shim's staleness age (4 ms), so each burst starts
/// with no fresh evidence of what the trainer does; contention budget `budget_ppm` (0: unheld).
fn colocated_bursts(budget_ppm: u32) -> f64 {
    let sim = sim();
    let mut function: Child = sim
        .command(bin("sim-function"))
        .env("LD_PRELOAD", shim_lib())
        .env("SMORE_SM_SHARE", "100")
        .env("SMORE_CONTENTION_PPM", budget_ppm.to_string())
        .args([
            "--kernels",
            "4",
            "--kernel-us",
            "1000",
            "--interval-ms",
            "10",
        ])
        .args(["--seconds", &format!("{}", TRAINER_SECS + 1.0), "--quiet"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let out = trainer(&sim).wait_with_output().unwrap();
    assert!(out.status.success(), "trainer: {}", out.status);
    let status = function.wait().unwrap();
    assert!(status.success(), "function exited with {status}");
    mean_ms(&String::from_utf8_lossy(&out.stdout))
}

fn solo() -> f64 {
    let sim = sim();
    let out = trainer(&sim).wait_with_output().unwrap();
    assert!(out.status.success(), "trainer: {}", out.status);
    mean_ms(&String::from_utf8_lossy(&out.stdout))
}

/// The trainer alone (mean ms/iter), beside `run(BUDGET_PPM)` and beside `run(0)` (unheld), each
/// on a simulated node of its own, all three at once.
fn alone_harvesting_unheld<T: Send + 'static>(run: fn(u32) -> T) -> (f64, T, T) {
    let alone = std::thread::spawn(solo);
    let harvest = std::thread::spawn(move || run(BUDGET_PPM));
    let unheld = std::thread::spawn(move || run(0));
    (
        alone.join().unwrap(),
        harvest.join().unwrap(),
        unheld.join().unwrap(),
    )
}

#[test]
fn a_harvesting_function_uses_the_trainers_idle_time_and_slows_it_within_its_budget() {
    let (alone, (with_harvest, share), (with_unheld, unheld_share)) =
        alone_harvesting_unheld(colocated);
    let c = BUDGET_PPM as f64 / 1e6;
    let bound = c / (1.0 - c);
    let slowdown = with_harvest / alone - 1.0;
    let unheld_slowdown = with_unheld / alone - 1.0;
    let report = format!(
        "trainer alone {alone:.2} ms/iter; beside a harvesting function (budget {:.0} %) {with_harvest:.2} ms/iter (slowdown {:.1} %, bound {:.1} %), function {:.1} % of the GPU; beside an unheld function {with_unheld:.2} ms/iter (slowdown {:.1} %), function {:.1} %",
        c * 100.0,
        slowdown * 100.0,
        bound * 100.0,
        share * 100.0,
        unheld_slowdown * 100.0,
        unheld_share * 100.0
    );
    eprintln!("{report}");
    // The setup can tell: an unheld function slows the trainer well past the bound.
    assert!(unheld_slowdown > bound + SLOWDOWN_SLACK, "{report}");
    assert!(slowdown <= bound + SLOWDOWN_SLACK, "{report}");
    // The trainer's idle time is harvested: far more GPU time than the contention budget
    // (measured 22–32 % at a 5 % budget on the simulated GPU, docs/shim.md).
    assert!(share >= 3.0 * c, "{report}");
}

/// Of the unheld function's slowdown, what a function in bursts may still cause: 60 %.
/// Reasoning: without enforcement on stale evidence the harvesting function slowed the trainer
/// 26.4–26.5 % against an unheld 31.4–31.9 % (83 %); with it 11.2–12.6 % against 31.1–31.8 %
/// (35–41 %) (docs/harvest.md, "Enforcement on stale evidence"): 60 % sits between the two with
/// 6–7 pp of slowdown to spare on either side.
const BURSTS_HELD_BELOW: f64 = 0.6;

/// A function whose launches come in bursts spaced past the staleness age found every burst on
/// stale evidence, which the budget charged but never held: it slowed the trainer nearly as much
/// as an unheld function. In debt, such a burst's first launch now probes and the rest are held
/// while the trainer is busy. Not yet to the budget: the probes themselves collide, and the
/// trainer still slows ~12 % against a bound of 5.3 % (docs/harvest.md, same section) — so this
/// asserts the hold, against the unheld function in the same run, not the bound.
#[test]
fn bursts_spaced_past_the_staleness_age_are_held_while_in_debt() {
    let (alone, with_harvest, with_unheld) = alone_harvesting_unheld(colocated_bursts);
    let c = BUDGET_PPM as f64 / 1e6;
    let bound = c / (1.0 - c);
    let slowdown = with_harvest / alone - 1.0;
    let unheld_slowdown = with_unheld / alone - 1.0;
    let report = format!(
        "trainer alone {alone:.2} ms/iter; beside bursts every 10 ms under a {:.0} % budget {with_harvest:.2} ms/iter (slowdown {:.1} %, bound {:.1} %); unheld {with_unheld:.2} ms/iter (slowdown {:.1} %)",
        c * 100.0,
        slowdown * 100.0,
        bound * 100.0,
        unheld_slowdown * 100.0
    );
    eprintln!("{report}");
    // The scenario escapes without enforcement: the unheld function is far past the bound.
    assert!(unheld_slowdown > bound + SLOWDOWN_SLACK, "{report}");
    assert!(slowdown < BURSTS_HELD_BELOW * unheld_slowdown, "{report}");
}

/// Trainer mean ms/iter beside a function that keeps its stream deep: requests of 40 × 500 µs
/// kernels and one sync each (20 ms of GPU work queued at once) every 25 ms — far more than the
/// shim's staleness age (4 ms) ahead of the GPU. Contention budget `budget_ppm` (0: unheld).
fn colocated_deep_stream(budget_ppm: u32) -> f64 {
    colocated_deep(budget_ppm, 1)
}

/// As [`colocated_deep_stream`], the kernels spread over two streams in turn.
fn colocated_deep_streams(budget_ppm: u32) -> f64 {
    colocated_deep(budget_ppm, 2)
}

fn colocated_deep(budget_ppm: u32, streams: u32) -> f64 {
    let sim = sim();
    let mut function: Child = sim
        .command(bin("sim-function"))
        .env("LD_PRELOAD", shim_lib())
        .env("SMORE_SM_SHARE", "100")
        .env("SMORE_CONTENTION_PPM", budget_ppm.to_string())
        .args([
            "--kernels",
            "40",
            "--kernel-us",
            "500",
            "--interval-ms",
            "25",
        ])
        .args(["--streams", &streams.to_string()])
        .args(["--seconds", &format!("{}", TRAINER_SECS + 1.0), "--quiet"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let out = trainer(&sim).wait_with_output().unwrap();
    assert!(out.status.success(), "trainer: {}", out.status);
    let status = function.wait().unwrap();
    assert!(status.success(), "function exited with {status}");
    mean_ms(&String::from_utf8_lossy(&out.stdout))
}

/// Of the unheld function's slowdown, what a function that keeps its stream deep may still
/// cause: 25 %. Reasoning: before "Keeping the backlog short" (docs/harvest.md) it caused 86–93 %
/// of it (50–54 % against 58 %); since, 13–16 % (7.2–9.3 % against 57.5–58.7 %, debug build):
/// 25 % (about 14.5 % of slowdown) sits 5 pp of slowdown above the worst run since, and far
/// below any run before.
const DEEP_HELD_BELOW: f64 = 0.25;

/// An escape found on 2026-11-27 (docs/harvest.md, "Keeping the backlog short"): such a function
/// slowed the trainer 50–54 % under a 5 % budget against 58 % unheld. What it queued ran 20 ms
/// after it was admitted, in whatever phase the trainer was then, and its samples, launched
/// behind its own work, showed almost none of the trainer's slices. Now a harvesting function
/// keeps at most 4 ms queued (next to none while in debt), a sample behind its own work is
/// judged by its stream's progress (the chained wait), and a function in debt probes once per
/// millisecond while the trainer looks idle: 7.2–9.3 %. Held, near the bound (5.3 %) but not at
/// it — a busy phase still meets the kernel that finds it and the probe that ends each 4 ms
/// hold, as with bursts — so this asserts the hold against the unheld function in the same run.
#[test]
fn a_function_that_keeps_its_stream_deep_is_still_held() {
    assert_deep_work_held(colocated_deep_stream, "a deep stream");
}

/// Runs `run` beside the trainer harvesting and unheld, and checks that the scenario escapes
/// unheld and is held below [`DEEP_HELD_BELOW`] of that with the budget.
fn assert_deep_work_held(run: fn(u32) -> f64, what: &str) {
    let (alone, with_harvest, with_unheld) = alone_harvesting_unheld(run);
    let c = BUDGET_PPM as f64 / 1e6;
    let slowdown = with_harvest / alone - 1.0;
    let unheld_slowdown = with_unheld / alone - 1.0;
    let report = format!(
        "trainer alone {alone:.2} ms/iter; beside {what} under a {:.0} % budget {with_harvest:.2} ms/iter (slowdown {:.1} %); unheld {with_unheld:.2} ms/iter (slowdown {:.1} %)",
        c * 100.0,
        slowdown * 100.0,
        unheld_slowdown * 100.0
    );
    eprintln!("{report}");
    let bound = c / (1.0 - c);
    // The scenario escapes without enforcement.
    assert!(unheld_slowdown > bound + SLOWDOWN_SLACK, "{report}");
    assert!(slowdown < DEEP_HELD_BELOW * unheld_slowdown, "{report}");
}

/// `SMORE_TRACE_SAMPLES` writes one line per settled sample — measured time, solo cost, queue
/// wait, collision — for diagnosing the estimate on a real GPU (docs/real-gpu.md, section 9):
/// beside a busy trainer some samples waited and collided, and every line parses.
#[test]
fn the_sample_trace_records_each_settled_sample_with_its_wait_and_collision() {
    let sim = sim();
    let dir = tempfile::tempdir().unwrap();
    let pattern = dir.path().join("samples-{pid}.txt");
    let secs = 3.0;
    let mut function: Child = sim
        .command(bin("sim-function"))
        .env("LD_PRELOAD", shim_lib())
        .env("SMORE_SM_SHARE", "100")
        .env("SMORE_CONTENTION_PPM", BUDGET_PPM.to_string())
        .env("SMORE_TRACE_SAMPLES", &pattern)
        .args([
            "--kernels",
            "4",
            "--kernel-us",
            "1000",
            "--interval-ms",
            "5",
        ])
        .args(["--seconds", &secs.to_string(), "--quiet"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let t = sim
        .command(bin("sim-trainer"))
        .args(TRAINER)
        .args(["--seconds", &secs.to_string(), "--quiet"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let pid = function.id();
    assert!(function.wait().unwrap().success(), "function failed");
    let _ = t.wait_with_output();
    let path = dir.path().join(format!("samples-{pid}.txt"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("no trace at {}: {e}", path.display()));
    assert!(text.starts_with("# t_ns dev ns d0_ns wait_ns collided_ns"));
    let rows: Vec<Vec<i128>> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let f: Vec<i128> = l.split(' ').map(|x| x.parse().unwrap()).collect();
            assert_eq!(f.len(), 8, "{l}");
            f
        })
        .collect();
    // The last second may still be buffered when the process exits; the first two are written.
    assert!(rows.len() >= 50, "{} samples traced", rows.len());
    let waited = rows.iter().filter(|r| r[4] > 0).count();
    let collided = rows.iter().filter(|r| r[5] > 0).count();
    assert!(
        rows.iter().all(|r| (r[3] < 0) == (r[5] < 0)),
        "a first measurement is neither judged nor collided"
    );
    assert!(
        rows.iter().all(|r| r[7] > 0 && r[7] <= r[0]),
        "each sample was submitted before it settled"
    );
    let mut waits: Vec<i128> = rows.iter().map(|r| r[4]).filter(|&w| w >= 0).collect();
    waits.sort_unstable();
    let q = |v: &[i128], f: f64| v.get((v.len() as f64 * f) as usize).copied().unwrap_or(-1);
    eprintln!(
        "{} samples: {waited} with a known wait > 0 (p10/p50/p90 {}/{}/{} ns), {collided} collided",
        rows.len(),
        q(&waits, 0.1),
        q(&waits, 0.5),
        q(&waits, 0.9)
    );
    assert!(
        waited > 0 && collided > 0,
        "beside a trainer busy half the time"
    );
}

/// The same deep work spread over two streams: a sample's chained wait needs its stream alone
/// to have run between two samples (the other stream's work, run beside it, would count as its
/// own), so the chains break at every change of stream; what holds it is what its samples show
/// otherwise (each request's first, on an idle stream; kernels the trainer's slices stretched),
/// its debt and its backlog: 9.3–10.3 % against 58.9 % unheld (three runs).
#[test]
fn a_function_that_keeps_two_streams_deep_is_still_held() {
    assert_deep_work_held(colocated_deep_streams, "two deep streams");
}
