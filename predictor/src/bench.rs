//! Decision-latency benchmark (`smore bench predictor`, or `cargo run -p smore-predictor
//! --release --example sched_bench`): SMORE Algorithm 1 (power of d = 2, table + multi-way
//! weights) at 8/64/256/1024 GPUs under low load (least degradation) and high load (first fit),
//! the multi-way query latency, and forest training time. Model trained on SYNTHETIC data.
//! Prints figures; asserts nothing.
use crate::catalog::Catalog;
use crate::multiway::SgdConfig;
use crate::pairwise::{ForestParams, PairModel};
use crate::sched::{allocate, sample_candidates, GpuSnapshot, PendingItem, Resident, SchedConfig};
use crate::synth::{generate, SynthParams};
use crate::table::PairTable;
use crate::{DegradationModel, ModelKey, Predictor};
use rand::SeedableRng;
use std::time::Instant;

/// Runs the benchmark and prints its figures.
pub fn run() -> anyhow::Result<()> {
    let cat = Catalog::builtin()?;
    let ds = generate(&cat, &SynthParams::default())?;
    let t0 = Instant::now();
    let (tr, _) = ds.split(
        1024.0f64.min(ds.rows.len() as f64 - 1.0) / ds.rows.len() as f64,
        1,
    )?;
    let m = PairModel::train(&cat, &tr, &ForestParams::default(), 1.0, 1)?;
    println!(
        "training time for {} SYNTHETIC samples (2 forests × 100 trees): {:.2?}",
        tr.rows.len(),
        t0.elapsed()
    );
    let table = PairTable::build(&cat, &m, "rtx3090")?;
    let p = Predictor::new(table, SgdConfig::default());
    let trains = p.table.trains.clone();
    let fns = p.table.fns.clone();
    let item = PendingItem {
        id: 1,
        key: ModelKey::new("mobilenet_v2", 1),
        slo_ms: 50.0,
        solo_latency_ms: 1.0,
        sm_util: 0.1,
        memory: 1 << 30,
        expected_util_gain: 0.1,
        expected_degradation: 0.1,
    };
    for n in [8usize, 64, 256, 1024] {
        let gpus: Vec<GpuSnapshot> = (0..n)
            .map(|i| GpuSnapshot {
                index: i as u32,
                capacity: 24 << 30,
                used: 8 << 30,
                training: Some(trains[i % trains.len()].clone()),
                functions: (0..2)
                    .map(|k| Resident {
                        id: k,
                        key: fns[(i + k as usize) % fns.len()].clone(),
                        slo_ms: 1e9,
                        solo_latency_ms: 1.0,
                        sm_util: 0.1,
                    })
                    .collect(),
                train_correction: 1.0,
            })
            .collect();
        let cfg = SchedConfig {
            theta_train: 10.0,
            ..SchedConfig::default()
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        for fast in [false, true] {
            let iters = 200_000;
            let t = Instant::now();
            let mut placed = 0;
            for _ in 0..iters {
                let c = sample_candidates(&mut rng, n, cfg.d);
                placed += allocate(&cfg, &item, &gpus, &c, fast, &p).0.is_some() as usize;
            }
            println!(
                "{n:>5} GPUs, {:<18} d = {}: {:>7.0} ns/decision (placed {placed}/{iters})",
                if fast {
                    "high load/first fit"
                } else {
                    "low load/argmin"
                },
                cfg.d,
                t.elapsed().as_nanos() as f64 / iters as f64
            );
        }
    }
    let tk = &trains[0];
    let ks: Vec<&ModelKey> = fns.iter().take(4).collect();
    let iters = 1_000_000;
    let t = Instant::now();
    let mut s = 0.0;
    for _ in 0..iters {
        s += p.train_deg(tk, &ks).unwrap() + p.fn_deg(Some(tk), &ks, 0).unwrap();
    }
    println!(
        "multi-way query (trainer + 4 functions, both sides): {:.0} ns (checksum {s:.1})",
        t.elapsed().as_nanos() as f64 / iters as f64
    );
    Ok(())
}
