//! The SM time share on the simulated GPU: every launch path is gated (kernel, Ex, cooperative,
//! graph; plain and `_ptsz`; through every resolution style), and a shimmed function held to its
//! share beside an unshimmed trainer gets that share while the trainer gets the rest.
//!
//! Shares are measured from the simulated node's per-process GPU time (`Node::gpu_time_of`), the
//! same accounting NVML reports, never from what the shim believes.

use smore_e2e::*;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// Tolerance of a measured share, in fractions of the GPU: ±3 percentage points (the issue's
/// acceptance bound).
const TOLERANCE: f64 = 0.03;

#[test]
fn every_launch_path_is_throttled_through_every_resolution_style() {
    // 25 % of a 10 ms window: the bucket holds 2.5 ms of GPU time, so 100 ms of work takes
    // ≥ 390 ms instead of 100 ms. The graph ops are paid for by the tiny kernel after them (a
    // graph's cost is learnt when it has run, then charged before the next launch).
    let mut script = vec![
        "stream",
        "run:1000:100:kernel",
        "run:1000:100:ex",
        "run:1000:100:coop",
    ];
    script.extend(["run:5000:4:graph"; 5]);
    script.push("run:1:1");
    let handles: Vec<_> = Resolution::ALL
        .into_iter()
        .map(|style| {
            let script = script.clone();
            std::thread::spawn(move || {
                let sim = SimGpu::exact(1, "8GiB");
                let (prog, args) = (style.probe(), style.args());
                let out = run_ok(
                    sim.shimmed(
                        &prog,
                        &[("SMORE_SM_SHARE", "25"), ("SMORE_SM_WINDOW_MS", "10")],
                    )
                    .args(args)
                    .args(&script),
                )
                .unwrap();
                (prog, args, out)
            })
        })
        .collect();
    for h in handles {
        let (prog, args, out) = h.join().unwrap();
        let l = parse_lines(&out);
        let runs = ops(&l, "run");
        assert!(
            runs.iter().all(|r| r["rc"] == "0"),
            "{prog:?} {args:?}: {out}"
        );
        let wall = |r: &Fields| num(r, "wall_ms");
        // (label, GPU ms, wall ms)
        let graph_wall: f64 = runs[3..].iter().map(|r| wall(r)).sum();
        let groups = [
            ("kernel", 100.0, wall(runs[0])),
            ("ex", 100.0, wall(runs[1])),
            ("coop", 100.0, wall(runs[2])),
            ("graph", 100.0, graph_wall),
        ];
        for (via, gpu, wall) in groups {
            let got = gpu / wall;
            assert!(
                (0.25 - 2.0 * TOLERANCE..=0.25 + TOLERANCE).contains(&got),
                "{prog:?} {args:?} {via}: {gpu} ms of GPU work in {wall:.1} ms = {:.1} % (share 25 %)\n{out}",
                got * 100.0
            );
        }
    }
}

/// What one co-location run measured, as fractions of wall time.
struct Measured {
    share: u32,
    function: f64,
    trainer: f64,
    trainer_solo: f64,
}

/// A trainer alone for 1 s (its solo GPU use), then a function at `share` % beside it; both are
/// measured over `secs` of steady state.
///
/// The trainer runs one 250 µs kernel per iteration and synchronises: on a time-sliced GPU a
/// context with queued work keeps the GPU for a 2 ms slice, so a function can get up to
/// 2 / 2.25 = 89 % beside it (a trainer that always has work queued would cap every co-runner at
/// 50 % by round-robin, whatever the shim does). The function runs requests of 8 × 250 µs
/// back to back: it always wants more than its share.
fn measure(share: u32, secs: f64) -> Measured {
    let sim = SimGpu::exact(1, "8GiB");
    let node = sim.node();
    let total = format!("{}", secs + 4.0);
    let mut trainer: Child = sim
        .command(bin("sim-trainer"))
        .args([
            "--kernel-us",
            "250",
            "--kernels",
            "1",
            "--seconds",
            &total,
            "--quiet",
        ])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let gpu = |c: &Child| node.gpu_time_of(0, c.id()) as f64;
    std::thread::sleep(Duration::from_millis(300));
    let (t0, g0) = (Instant::now(), gpu(&trainer));
    std::thread::sleep(Duration::from_millis(1000));
    let trainer_solo = (gpu(&trainer) - g0) / t0.elapsed().as_nanos() as f64;
    let mut function: Child = sim
        .shimmed(
            bin("sim-function"),
            &[("SMORE_SM_SHARE", &share.to_string())],
        )
        .args(["--kernel-us", "250", "--kernels", "8", "--quiet"])
        .args(["--seconds", &format!("{}", secs + 1.5)])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    // Past start-up (first measurements, the initial bucket).
    std::thread::sleep(Duration::from_millis(700));
    let (t0, f0, g0) = (Instant::now(), gpu(&function), gpu(&trainer));
    std::thread::sleep(Duration::from_secs_f64(secs));
    let (f1, g1) = (gpu(&function), gpu(&trainer));
    let wall = t0.elapsed().as_nanos() as f64;
    let status = function.wait().unwrap();
    assert!(status.success(), "function exited with {status}");
    let _ = trainer.kill();
    let _ = trainer.wait();
    Measured {
        share,
        function: (f1 - f0) / wall,
        trainer: (g1 - g0) / wall,
        trainer_solo,
    }
}

#[test]
fn a_function_gets_its_share_beside_an_unshimmed_trainer_and_the_trainer_the_rest() {
    // Four simulated nodes side by side, 5 s each, in parallel (≈ 8 s of wall time in all).
    let handles: Vec<_> = [10u32, 25, 50, 75]
        .into_iter()
        .map(|s| std::thread::spawn(move || measure(s, 5.0)))
        .collect();
    let results: Vec<Measured> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let table: Vec<String> = results
        .iter()
        .map(|m| {
            format!(
                "share {:>2} %: function {:.1} %, trainer {:.1} % (alone {:.1} %)",
                m.share,
                m.function * 100.0,
                m.trainer * 100.0,
                m.trainer_solo * 100.0
            )
        })
        .collect();
    eprintln!("{}", table.join("\n"));
    for m in &results {
        let want = m.share as f64 / 100.0;
        assert!(
            (m.function - want).abs() <= TOLERANCE,
            "function held to {} % got {:.1} %\n{}",
            m.share,
            m.function * 100.0,
            table.join("\n")
        );
        // The trainer gets the rest: what the function leaves, at the trainer's own efficiency
        // (it syncs every iteration, so alone it uses trainer_solo of the GPU), and together they
        // keep the GPU at least as busy as the trainer alone did. A syncing trainer's efficiency
        // is CPU-bound: its solo second is measured before the function (and the three other
        // nodes' functions) start, so on a 2-core CI machine the co-located window runs with
        // less CPU per process. The lower bound therefore allows 2 × the tolerance, as the
        // throttling test above does; the function's own share keeps the ±3 pp bound.
        assert!(
            m.trainer >= (1.0 - want) * m.trainer_solo - 2.0 * TOLERANCE,
            "trainer beside a {} % function got {:.1} %\n{}",
            m.share,
            m.trainer * 100.0,
            table.join("\n")
        );
        assert!(
            m.trainer + m.function >= m.trainer_solo - 2.0 * TOLERANCE,
            "GPU left idle beside a {} % function\n{}",
            m.share,
            table.join("\n")
        );
    }
}
