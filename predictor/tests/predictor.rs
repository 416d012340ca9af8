//! Behaviour tests of the predictor crate: metrics, α-sampling, persistence, multi-way SGD,
//! Algorithm 1 decisions and share sizing.

use smore_predictor::catalog::Catalog;
use smore_predictor::dataset::{mae, rmsle, Dataset, Row, Source};
use smore_predictor::multiway::{MultiWay, SgdConfig, Update};
use smore_predictor::pairwise::{ForestParams, PairModel};
use smore_predictor::sched::*;
use smore_predictor::synth::{generate, SynthParams};
use smore_predictor::table::PairTable;
use smore_predictor::{ModelKey, Predictor};
use std::collections::HashMap;

fn row(t: &str, tb: u32, f: &str, fb: u32, dt: f64, df: f64) -> Row {
    Row {
        train_model: t.into(),
        train_batch: tb,
        fn_model: f.into(),
        fn_batch: fb,
        concurrency: 1,
        deg_train: dt,
        deg_fn: df,
        device: "rtx3090".into(),
        driver: "test".into(),
        date: "2026-01-01".into(),
        source: Source::Synthetic,
    }
}

// ---------- metrics and α-sampling ----------

#[test]
fn rmsle_and_mae_match_hand_computation() {
    let e1 = std::f64::consts::E - 1.0; // ln(1 + e − 1) = 1
                                        // errors in log space: 0 and 1 → sqrt((0 + 1)/2)
    assert!((rmsle(&[0.0, e1], &[0.0, 0.0]) - 0.5f64.sqrt()).abs() < 1e-12);
    assert!((mae(&[0.0, 1.0, 3.0], &[1.0, 1.0, 1.0]) - 1.0).abs() < 1e-12);
    // negative predictions are floored at 0
    assert_eq!(rmsle(&[0.0], &[-0.5]), 0.0);
    assert_eq!(rmsle(&[0.5, 0.25], &[0.5, 0.25]), 0.0);
}

#[test]
fn alpha_split_is_floor_disjoint_complete_and_seeded() {
    let ds = Dataset {
        rows: (0..10)
            .map(|i| row("vgg16", 32, "resnet50", i + 1, 0.1, 0.2))
            .collect(),
    };
    let (tr, te) = ds.split(0.2, 5).unwrap();
    assert_eq!((tr.rows.len(), te.rows.len()), (2, 8));
    let mut all: Vec<u32> = tr.rows.iter().chain(&te.rows).map(|r| r.fn_batch).collect();
    all.sort();
    assert_eq!(all, (1..=10).collect::<Vec<_>>());
    let (tr2, _) = ds.split(0.2, 5).unwrap();
    assert_eq!(tr.rows, tr2.rows);
    let (tr3, _) = ds.split(0.2, 6).unwrap();
    assert_ne!(tr.rows, tr3.rows, "a different seed samples differently");
    assert_eq!(ds.split(0.35, 1).unwrap().0.rows.len(), 3);
    assert!(ds.split(0.0, 1).is_err() && ds.split(1.0, 1).is_err());
}

#[test]
fn dataset_csv_round_trip_and_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("d.csv");
    let ds = Dataset {
        rows: vec![row("vgg16", 32, "resnet50", 8, 0.1, 0.25)],
    };
    ds.save(&p).unwrap();
    assert_eq!(Dataset::load(&p).unwrap().rows, ds.rows);
    let text = std::fs::read_to_string(&p)
        .unwrap()
        .replace("synthetic\n", "guessed\n");
    std::fs::write(&p, text).unwrap();
    let e = format!("{:#}", Dataset::load(&p).unwrap_err());
    assert!(e.contains(":2:"), "{e}");
}

// ---------- pair-wise model, persistence, table ----------

fn small_model() -> (Catalog, Dataset, PairModel) {
    let cat = Catalog::builtin().unwrap();
    let ds = generate(
        &cat,
        &SynthParams {
            date: "2026-01-01".into(),
            ..SynthParams::default()
        },
    )
    .unwrap();
    let (tr, _) = ds.split(0.2, 1).unwrap();
    let p = ForestParams {
        n_trees: 10,
        ..ForestParams::default()
    };
    let m = PairModel::train(&cat, &tr, &p, 0.2, 1).unwrap();
    (cat, ds, m)
}

#[test]
fn forest_beats_linear_on_synthetic_holdout() {
    use smore_predictor::pairwise::{evaluate, Variant};
    let cat = Catalog::builtin().unwrap();
    let ds = generate(
        &cat,
        &SynthParams {
            date: "2026-01-01".into(),
            ..SynthParams::default()
        },
    )
    .unwrap();
    let p = ForestParams {
        n_trees: 20,
        ..ForestParams::default()
    };
    let rf = evaluate(&cat, &ds, Variant::ForestLog, 0.2, 1, &p).unwrap();
    let lin = evaluate(&cat, &ds, Variant::Linear, 0.2, 1, &p).unwrap();
    assert!(rf.mean().rmsle < lin.mean().rmsle, "{rf:?} vs {lin:?}");
}

#[test]
fn model_persistence_round_trip_and_version_check() {
    let (cat, _, m) = small_model();
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.json");
    m.save(&p).unwrap();
    let m2 = PairModel::load(&p).unwrap();
    let (a, b) = (ModelKey::new("vgg16", 32), ModelKey::new("resnet50", 8));
    assert_eq!(
        m.predict(&cat, &a, &b).unwrap(),
        m2.predict(&cat, &a, &b).unwrap()
    );
    let text = std::fs::read_to_string(&p).unwrap().replacen(
        "\"format_version\":1",
        "\"format_version\":99",
        1,
    );
    std::fs::write(&p, text).unwrap();
    let e = format!("{:#}", PairModel::load(&p).unwrap_err());
    assert!(
        e.contains("format_version 99") && e.contains("retrain"),
        "{e}"
    );
}

#[test]
fn table_matches_model_and_round_trips() {
    let (cat, _, m) = small_model();
    let t = PairTable::build(&cat, &m, "rtx3090").unwrap();
    let (a, b) = (
        ModelKey::new("bert_base", 32),
        ModelKey::new("mobilenet_v2", 4),
    );
    let (dt, df) = m.predict(&cat, &a, &b).unwrap();
    let (tt, tf) = t.pair(t.train_id(&a).unwrap(), t.fn_id(&b).unwrap());
    assert!((dt - tt).abs() < 1e-5 && (df - tf).abs() < 1e-5);
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("t.json");
    t.save(&p).unwrap();
    let t2 = PairTable::load(&p).unwrap();
    assert_eq!(
        t2.pair(t2.train_id(&a).unwrap(), t2.fn_id(&b).unwrap()),
        (tt, tf)
    );
    assert!(t2.fn_id(&ModelKey::new("bert_base", 3)).is_none());
}

// ---------- multi-way SGD ----------

#[test]
fn sgd_weights_converge_to_synthetic_target() {
    let models: Vec<String> = ["t", "a", "b"].iter().map(|s| s.to_string()).collect();
    let mut w = MultiWay::new(models, SgdConfig::default());
    let (ga, gb) = (0.6, 1.8);
    let mut x: u64 = 12345;
    let mut rnd = || {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        0.05 + 0.5 * ((x >> 11) as f64 / (1u64 << 53) as f64)
    };
    for _ in 0..4000 {
        let (da, db) = (rnd(), rnd());
        let real = ga * da + gb * db;
        assert!(matches!(
            w.observe_train(0, &[(1, da), (2, db)], real),
            Update::Applied { .. }
        ));
    }
    assert!(
        (w.gamma(0, 1) - ga).abs() < 0.05,
        "γ(t,a) = {}",
        w.gamma(0, 1)
    );
    assert!(
        (w.gamma(0, 2) - gb).abs() < 0.05,
        "γ(t,b) = {}",
        w.gamma(0, 2)
    );
    // α/β from function-side observations
    for _ in 0..4000 {
        let (dt, dm) = (rnd(), rnd());
        w.observe_fn(1, Some((0, dt)), &[(2, dm)], 0.5 * dt + 1.4 * dm);
    }
    assert!((w.alpha(1, 0) - 0.5).abs() < 0.05 && (w.beta(1, 2) - 1.4).abs() < 0.05);
}

#[test]
fn sgd_weights_stay_bounded_under_outliers() {
    let models: Vec<String> = ["t", "a"].iter().map(|s| s.to_string()).collect();
    let cfg = SgdConfig::default();
    let mut w = MultiWay::new(models, cfg.clone());
    // one absurd but finite sample: moves at most max_step
    w.observe_train(0, &[(1, 0.5)], 9.9);
    assert!(w.gamma(0, 1) <= 1.0 + cfg.max_step + 1e-12);
    // rejected: non-finite, above max_observed, negative pair prediction, bad index
    for real in [f64::NAN, f64::INFINITY, 1e9] {
        assert_eq!(w.observe_train(0, &[(1, 0.5)], real), Update::Rejected);
    }
    assert_eq!(w.observe_train(0, &[(1, -3.0)], 0.2), Update::Rejected);
    assert_eq!(w.observe_train(0, &[(7, 0.3)], 0.2), Update::Rejected);
    assert_eq!(w.rejected, 5);
    // a long run of extreme samples pins weights at the bounds, never beyond
    for _ in 0..1000 {
        w.observe_train(0, &[(1, 1.0)], 10.0); // target γ = 10 > w_max
    }
    assert_eq!(w.gamma(0, 1), cfg.w_max);
    for _ in 0..1000 {
        w.observe_train(0, &[(1, 1.0)], 0.0); // target γ = 0 < w_min
    }
    assert_eq!(w.gamma(0, 1), cfg.w_min);
}

#[test]
fn weights_persist_and_reload_with_new_models() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("w.json");
    let models: Vec<String> = ["t", "a"].iter().map(|s| s.to_string()).collect();
    let mut w = MultiWay::new(models, SgdConfig::default());
    w.observe_train(0, &[(1, 0.5)], 0.2);
    w.save(&p).unwrap();
    let more: Vec<String> = ["t", "a", "z"].iter().map(|s| s.to_string()).collect();
    let w2 = MultiWay::load(&p, &more).unwrap();
    assert_eq!(w2.gamma(0, 1), w.gamma(0, 1));
    assert_eq!(w2.gamma(0, 2), 1.0);
    assert_eq!(w2.updates, 1);
}

#[test]
fn predictor_multiway_is_weighted_sum_of_table_entries() {
    let (cat, _, m) = small_model();
    let t = PairTable::build(&cat, &m, "rtx3090").unwrap();
    let mut p = Predictor::new(t, SgdConfig::default());
    let tr = ModelKey::new("vgg16", 32);
    let (a, b) = (ModelKey::new("resnet50", 8), ModelKey::new("deepfm", 1));
    let both = p.train_deg(&tr, &[&a, &b]).unwrap();
    let sum = p.train_deg(&tr, &[&a]).unwrap() + p.train_deg(&tr, &[&b]).unwrap();
    assert!((both - sum).abs() < 1e-12, "weights start at 1: plain sum");
    assert!(matches!(
        p.observe_train(&tr, &[&a, &b], both * 0.5),
        Update::Applied { .. }
    ));
    assert!(p.train_deg(&tr, &[&a, &b]).unwrap() < both);
    assert_eq!(
        p.observe_train(&ModelKey::new("vgg16", 3), &[&a], 0.1),
        Update::Rejected
    );
}

// ---------- Algorithm 1 ----------

/// Hand-set degradations: train_deg = Σ T[(trainer, fn)], fn_deg = F[(trainer, fn)] + 0.1·others.
struct Fake {
    t: HashMap<(&'static str, &'static str), f64>,
    f: HashMap<(&'static str, &'static str), f64>,
}

impl DegradationModel for Fake {
    fn train_deg(&self, train: &ModelKey, fns: &[&ModelKey]) -> Option<f64> {
        fns.iter()
            .map(|f| {
                self.t
                    .iter()
                    .find(|((a, b), _)| *a == train.model && *b == f.model)
                    .map(|x| *x.1)
            })
            .sum()
    }
    fn fn_deg(&self, train: Option<&ModelKey>, fns: &[&ModelKey], j: usize) -> Option<f64> {
        let base = match train {
            Some(t) => {
                *self
                    .f
                    .iter()
                    .find(|((a, b), _)| *a == t.model && *b == fns[j].model)?
                    .1
            }
            None => 0.0,
        };
        Some(base + 0.1 * (fns.len() - 1) as f64)
    }
}

fn fake() -> Fake {
    let mut t = HashMap::new();
    let mut f = HashMap::new();
    for (tr, func, dt, df) in [
        ("lowtrain", "small", 0.02, 0.05),
        ("lowtrain", "big", 0.06, 0.20),
        ("hightrain", "small", 0.08, 0.30),
        ("hightrain", "big", 0.25, 0.90),
        ("midtrain", "small", 0.04, 0.10),
        ("midtrain", "big", 0.09, 0.40),
    ] {
        t.insert((tr, func), dt);
        f.insert((tr, func), df);
    }
    Fake { t, f }
}

const GIB: u64 = 1 << 30;

fn gpu(index: u32, train: &str, used_gib: u64) -> GpuSnapshot {
    GpuSnapshot {
        index,
        capacity: 10 * GIB,
        used: used_gib * GIB,
        training: Some(ModelKey::new(train, 32)),
        functions: vec![],
        train_correction: 1.0,
    }
}

fn item(id: u64, model: &str, slo_ms: f64, mem_gib: u64) -> PendingItem {
    PendingItem {
        id,
        key: ModelKey::new(model, 1),
        slo_ms,
        solo_latency_ms: 10.0,
        sm_util: 0.3,
        memory: mem_gib * GIB,
        expected_util_gain: 0.3,
        expected_degradation: 0.1,
    }
}

fn all_gpus_cfg() -> SchedConfig {
    SchedConfig {
        d: 64,
        ..SchedConfig::default()
    }
}

#[test]
fn memory_rule_uses_sigma_capacity() {
    let cfg = all_gpus_cfg();
    // σ·10 GiB = 9.5 GiB: 8 + 1 fits, 9 + 1 does not
    let gpus = vec![gpu(0, "lowtrain", 9), gpu(1, "lowtrain", 8)];
    let (c, e) = allocate(
        &cfg,
        &item(1, "small", 100.0, 1),
        &gpus,
        &[0, 1],
        false,
        &fake(),
    );
    assert_eq!(c, Some(1));
    assert!(matches!(e.candidates[0].verdict, Verdict::Memory { .. }));
}

#[test]
fn theta_train_refusal() {
    let cfg = all_gpus_cfg(); // θ = 0.10
    let gpus = vec![gpu(0, "hightrain", 1)];
    let (c, e) = allocate(
        &cfg,
        &item(1, "big", 1000.0, 1),
        &gpus,
        &[0],
        false,
        &fake(),
    );
    assert_eq!(c, None);
    assert_eq!(e.rule, Rule::NothingFits);
    assert!(
        matches!(e.candidates[0].verdict, Verdict::ThetaTrain { predicted, .. } if (predicted - 0.25).abs() < 1e-12)
    );
    assert!(e.to_string().contains("θ_train"));
    // the online correction factor scales D̂_train into refusal as well
    let mut g = gpu(0, "lowtrain", 1);
    g.train_correction = 2.0;
    let (c, _) = allocate(&cfg, &item(1, "big", 1000.0, 1), &[g], &[0], false, &fake());
    assert_eq!(c, None, "0.06 × 2 > 0.10");
}

#[test]
fn slo_refusal() {
    let cfg = all_gpus_cfg();
    let gpus = vec![gpu(0, "midtrain", 1)];
    // 10 ms · (1 + 0.40) = 14 ms > 13 ms
    let (c, e) = allocate(&cfg, &item(1, "big", 13.0, 1), &gpus, &[0], false, &fake());
    assert_eq!(c, None);
    assert!(
        matches!(e.candidates[0].verdict, Verdict::Slo { predicted_ms, .. } if (predicted_ms - 14.0).abs() < 1e-9)
    );
    let (c, _) = allocate(&cfg, &item(1, "big", 14.5, 1), &gpus, &[0], false, &fake());
    assert_eq!(c, Some(0));
}

#[test]
fn argmin_choice_and_ties() {
    let mut cfg = all_gpus_cfg();
    cfg.lambda = 0.5;
    let gpus = vec![
        gpu(0, "midtrain", 1),
        gpu(1, "lowtrain", 1),
        gpu(2, "hightrain", 1),
    ];
    let (c, e) = allocate(
        &cfg,
        &item(1, "small", 100.0, 1),
        &gpus,
        &[2, 0, 1],
        false,
        &fake(),
    );
    assert_eq!(c, Some(1), "lowtrain has the least λ·D̂_train + (1−λ)·D̂_fn");
    assert_eq!(e.rule, Rule::LeastDegradation);
    assert_eq!(e.candidates.len(), 3);
    assert!((e.predicted_train.unwrap() - 0.02).abs() < 1e-12);
    // ties go to the lower GPU index, whatever the sampled order
    let tie = vec![gpu(5, "lowtrain", 1), gpu(3, "lowtrain", 1)];
    let (c, _) = allocate(
        &cfg,
        &item(1, "small", 100.0, 1),
        &tie,
        &[0, 1],
        false,
        &fake(),
    );
    assert_eq!(tie[c.unwrap()].index, 3);
    // λ = 1 looks only at training degradation
    cfg.lambda = 1.0;
    let (c, _) = allocate(
        &cfg,
        &item(1, "small", 100.0, 1),
        &gpus,
        &[0, 1, 2],
        false,
        &fake(),
    );
    assert_eq!(c, Some(1));
}

#[test]
fn first_fit_takes_first_acceptable_sampled_gpu() {
    let cfg = all_gpus_cfg();
    let gpus = vec![
        gpu(0, "hightrain", 1),
        gpu(1, "midtrain", 1),
        gpu(2, "lowtrain", 1),
    ];
    // hightrain+big refused (θ), midtrain acceptable → chosen although lowtrain is better
    let (c, e) = allocate(
        &cfg,
        &item(1, "big", 100.0, 1),
        &gpus,
        &[0, 1, 2],
        true,
        &fake(),
    );
    assert_eq!(c, Some(1));
    assert_eq!(e.rule, Rule::FirstFit);
    assert_eq!(e.candidates.len(), 2, "stops at the first fit");
}

#[test]
fn scheduler_switches_to_first_fit_on_long_queue() {
    let mk = |threshold| {
        let mut s = Scheduler::new(
            SchedConfig {
                d: 64,
                first_fit_queue: threshold,
                ..SchedConfig::default()
            },
            1,
        )
        .unwrap();
        for i in 0..3 {
            s.submit(item(i, "small", 100.0, 1));
        }
        let mut gpus = vec![gpu(0, "midtrain", 1), gpu(1, "lowtrain", 1)];
        s.run_round(&mut gpus, &fake())
    };
    assert!(mk(10)
        .iter()
        .all(|d| d.explanation.mode == Mode::LeastDegradation));
    assert!(mk(2).iter().all(|d| d.explanation.mode == Mode::FirstFit));
}

#[test]
fn scheduler_orders_by_priority_and_requeues_with_backoff() {
    let mut s = Scheduler::new(
        SchedConfig {
            d: 64,
            backoff_base: 1,
            backoff_max: 4,
            ..SchedConfig::default()
        },
        1,
    )
    .unwrap();
    let mut lo = item(1, "small", 100.0, 1);
    lo.expected_util_gain = 0.1;
    let hi = item(2, "small", 100.0, 1);
    let never = item(3, "big", 1.0, 1); // SLO 1 ms < solo 10 ms: never fits
    s.submit(lo);
    s.submit(hi);
    s.submit(never);
    // one GPU with room for a single 1 GiB function: memory 8 + 1 ≤ 9.5, 9 + 1 > 9.5
    let mut gpus = vec![gpu(0, "lowtrain", 8)];
    let d = s.run_round(&mut gpus, &fake());
    assert_eq!(d[0].item, 2, "higher P = E[ΔU]/(E[ΔLat]+ε) first");
    assert_eq!(d[0].outcome, Outcome::Placed { gpu: 0 });
    assert_eq!(gpus[0].functions.len(), 1);
    assert_eq!(gpus[0].used, 9 * GIB);
    assert!(matches!(
        d[1].outcome,
        Outcome::Requeued {
            attempts: 1,
            retry_round: Some(1)
        }
    ));
    assert!(matches!(
        d[1].explanation.candidates[0].verdict,
        Verdict::Memory { .. }
    ));
    assert_eq!(s.queue_len(), 2);
    // back-off doubles: item 3 retried at rounds 1, 3, 7, then every 4 (cap)
    let mut retries = vec![];
    for _ in 0..12 {
        for d in s.run_round(&mut gpus, &fake()) {
            if d.item == 3 {
                if let Outcome::Requeued { retry_round, .. } = d.outcome {
                    retries.push(retry_round);
                }
            }
        }
    }
    assert_eq!(&retries[..4], &[Some(3), Some(7), Some(11), Some(15)]);
}

#[test]
fn on_change_retry_re_evaluates_a_refused_item_when_a_gpu_frees_up_and_not_before() {
    let mut s = Scheduler::new(
        SchedConfig {
            d: 64,
            retry: Retry::OnChange,
            ..SchedConfig::default()
        },
        1,
    )
    .unwrap();
    s.submit(item(1, "small", 100.0, 1));
    // Full: 9 + 1 GiB > σ·10 GiB.
    let mut gpus = vec![gpu(0, "lowtrain", 9)];
    let d = s.run_round(&mut gpus, &fake());
    assert_eq!(
        d[0].outcome,
        Outcome::Requeued {
            attempts: 1,
            retry_round: None
        }
    );
    // Nothing changes: the item is not evaluated again (no decision), whatever the round.
    for _ in 0..20 {
        assert!(s.run_round(&mut gpus, &fake()).is_empty());
    }
    assert_eq!(s.queue_len(), 1);
    // A function on the GPU finishes: memory frees up, the item is placed in the next round.
    gpus[0].used = 8 * GIB;
    let d = s.run_round(&mut gpus, &fake());
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].outcome, Outcome::Placed { gpu: 0 });
    assert_eq!(s.queue_len(), 0);
}

#[test]
fn on_change_retry_tries_again_when_the_slack_halves() {
    let mut s = Scheduler::new(
        SchedConfig {
            d: 64,
            retry: Retry::OnChange,
            ..SchedConfig::default()
        },
        1,
    )
    .unwrap();
    s.submit(item(1, "small", 80.0, 1));
    let mut gpus = vec![gpu(0, "lowtrain", 9)];
    assert_eq!(s.run_round(&mut gpus, &fake()).len(), 1);
    // The caller updates the time left each round; 80 → 41 ms: not yet half.
    s.retain(|it, _| {
        it.slo_ms = 41.0;
        true
    });
    assert!(s.run_round(&mut gpus, &fake()).is_empty());
    s.retain(|it, _| {
        it.slo_ms = 40.0;
        true
    });
    let d = s.run_round(&mut gpus, &fake());
    assert_eq!(d.len(), 1, "slack halved: looked at again");
    assert!(matches!(
        d[0].outcome,
        Outcome::Requeued { attempts: 2, .. }
    ));
    // `retain` drops what the caller no longer wants (e.g. expired).
    assert_eq!(s.retain(|_, _| false), 1);
    assert_eq!(s.queue_len(), 0);
}

#[test]
fn near_ties_in_priority_are_ordered_by_deadline() {
    let run = |tie: f64| {
        let mut s = Scheduler::new(
            SchedConfig {
                d: 64,
                deadline_tie: tie,
                ..SchedConfig::default()
            },
            1,
        )
        .unwrap();
        // Item 1: slightly higher priority, more slack; item 2: 5 % lower priority, less slack;
        // item 3: half the priority, the least slack.
        let mut a = item(1, "small", 100.0, 1);
        a.expected_util_gain = 0.30;
        let mut b = item(2, "small", 50.0, 1);
        b.expected_util_gain = 0.285;
        let mut c = item(3, "small", 20.0, 1);
        c.expected_util_gain = 0.15;
        for x in [a, b, c] {
            s.submit(x);
        }
        let mut gpus = vec![gpu(0, "lowtrain", 1)];
        s.run_round(&mut gpus, &fake())
            .iter()
            .map(|d| d.item)
            .collect::<Vec<_>>()
    };
    assert_eq!(run(0.0), vec![1, 2, 3], "SMORE: priority order");
    assert_eq!(
        run(0.25),
        vec![2, 1, 3],
        "a near-tie goes to the earlier deadline"
    );
    assert!(SchedConfig {
        deadline_tie: -1.0,
        ..SchedConfig::default()
    }
    .validate()
    .unwrap_err()
    .to_string()
    .contains("deadline_tie"));
}

#[test]
fn nothing_fits_and_no_gpus_and_max_attempts() {
    let cfg = SchedConfig {
        max_attempts: Some(1),
        ..all_gpus_cfg()
    };
    let (c, e) = allocate(&cfg, &item(1, "small", 100.0, 1), &[], &[], false, &fake());
    assert_eq!((c, e.rule), (None, Rule::NoGpus));
    let mut s = Scheduler::new(cfg, 1).unwrap();
    s.submit(item(9, "big", 1.0, 1));
    let d = s.run_round(&mut [gpu(0, "lowtrain", 1)], &fake());
    assert_eq!(d[0].outcome, Outcome::Dropped { attempts: 1 });
    assert_eq!(s.queue_len(), 0);
}

#[test]
fn resident_slo_protection_and_unpredictable() {
    let cfg = all_gpus_cfg();
    let mut g = gpu(0, "lowtrain", 1);
    g.functions.push(Resident {
        id: 77,
        key: ModelKey::new("big", 1),
        slo_ms: 12.5, // alone: 10·1.2 = 12 ms; with one more function: 10·1.3 = 13 ms
        solo_latency_ms: 10.0,
        sm_util: 0.3,
    });
    let (c, e) = allocate(
        &cfg,
        &item(1, "small", 100.0, 1),
        &[g.clone()],
        &[0],
        false,
        &fake(),
    );
    assert_eq!(c, None);
    assert!(matches!(
        e.candidates[0].verdict,
        Verdict::ResidentSlo { id: 77, .. }
    ));
    let unk = allocate(
        &cfg,
        &item(1, "mystery", 100.0, 1),
        &[gpu(0, "midtrain", 1)],
        &[0],
        false,
        &fake(),
    );
    assert!(matches!(
        unk.1.candidates[0].verdict,
        Verdict::Unpredictable
    ));
    // request-level admission: 0 in flight ok; 2 in flight → 3 copies: D̂_train 0.18 > θ
    let ok = admit_request(&cfg, &g, 77, 0, &fake());
    assert_eq!(ok.rule, Rule::WithinBounds);
    let busy = admit_request(&cfg, &g, 77, 2, &fake());
    assert!(!busy.admitted());
}

#[test]
fn preferred_candidate_is_taken_at_once_and_widening_only_when_nothing_fits() {
    use rand::SeedableRng;
    let cfg = all_gpus_cfg();
    let model = fake();
    let it = item(1, "small", 100.0, 1);
    // GPU 0 acceptable but worse than GPU 1: preferred ⇒ taken without looking further.
    let gpus = [
        gpu(0, "hightrain", 1),
        gpu(1, "lowtrain", 1),
        gpu(2, "lowtrain", 1),
    ];
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let c = Candidates::preferred_sampled(&mut rng, 3, 1, Some(0), true);
    assert_eq!(c.order()[0], 0);
    let mut seen = vec![];
    let ch = choose(&c, false, |g| {
        seen.push(g);
        Some(evaluate_candidate(&cfg, &gpus[g], &it, &model))
    });
    assert_eq!(ch.chosen.map(|x| x.0), Some(0));
    assert_eq!(seen, vec![0], "an acceptable preferred GPU ends the search");
    // Only the GPU outside the sample fits: widening finds it; without widening, refusal.
    for _ in 0..8 {
        let full = [
            gpu(0, "lowtrain", 10),
            gpu(1, "lowtrain", 10),
            gpu(2, "lowtrain", 1),
        ];
        let eval = |g: usize| Some(evaluate_candidate(&cfg, &full[g], &it, &model));
        let wide = Candidates::preferred_sampled(&mut rng, 3, 1, None, true);
        assert_eq!(choose(&wide, false, eval).chosen.map(|x| x.0), Some(2));
        let narrow = Candidates::preferred_sampled(&mut rng, 3, 1, None, false);
        let got = choose(&narrow, false, eval);
        assert_eq!(
            got.evals.len(),
            1,
            "no widening: only the sample is evaluated"
        );
        assert_eq!(got.chosen.is_some(), narrow.order() == [2]);
    }
    // When a sampled GPU fits, the others are not evaluated.
    let c = Candidates::preferred_sampled(&mut rng, 3, 3, None, true);
    let ch = choose(&c, true, |g| {
        Some(evaluate_candidate(&cfg, &gpus[g], &it, &model))
    });
    assert_eq!(ch.evals.len(), 1, "first fit stops at the first acceptable");
    // A candidate the caller cannot evaluate is skipped, not counted.
    let ch = choose(&Candidates::fixed(vec![0, 1]), false, |g| {
        (g == 1).then(|| evaluate_candidate(&cfg, &gpus[g], &it, &model))
    });
    assert_eq!((ch.evals.len(), ch.chosen.map(|x| x.0)), (1, Some(1)));
}

#[test]
fn share_sizing_step_admits_a_theta_refusal_with_a_smaller_share_and_refuses_slo() {
    let cfg = all_gpus_cfg();
    let model = fake();
    // hightrain + big: D̂_train 0.25 > θ 0.10 at a full share, but sm_util 0.3 ⇒ a 10 % share
    // gives 0.25·(0.10/0.3) ≈ 0.083 ≤ θ and latency 10·1.9·3 = 57 ms ≤ SLO 100 ms.
    let g = gpu(0, "hightrain", 1);
    let it = item(1, "big", 100.0, 1);
    let e = evaluate_candidate(&cfg, &g, &it, &model);
    assert!(matches!(e.verdict, Verdict::ThetaTrain { .. }));
    let r = refine_with_share(&cfg, &g, &it, e, &model);
    assert_eq!(r.verdict, Verdict::Acceptable, "{r:?}");
    assert!(r.d_train.unwrap() <= cfg.theta_train && r.score.is_some());
    // Same GPU, an SLO no throttled share can meet (solo·(1+D̂_fn) = 19 ms fits at full share
    // only, which θ forbids): refused on the SLO.
    let tight = item(1, "big", 20.0, 1);
    let e = evaluate_candidate(&cfg, &g, &tight, &model);
    let r = refine_with_share(&cfg, &g, &tight, e, &model);
    assert!(matches!(r.verdict, Verdict::Slo { .. }), "{r:?}");
    assert!(r.score.is_none());
    // No training job: nothing to size, the evaluation is kept as is.
    let mut free = gpu(1, "lowtrain", 1);
    free.training = None;
    let e = evaluate_candidate(&cfg, &free, &it, &model);
    assert_eq!(refine_with_share(&cfg, &free, &it, e.clone(), &model), e);
}

#[test]
fn a_new_function_is_sized_like_the_last_resident_of_size_gpu_shares() {
    let cfg = all_gpus_cfg();
    let model = fake();
    let mut g = gpu(0, "hightrain", 1);
    g.functions.push(Resident {
        id: 7,
        key: ModelKey::new("small", 1),
        slo_ms: 100.0,
        solo_latency_ms: 10.0,
        sm_util: 0.3,
    });
    let it = item(1, "big", 1000.0, 1);
    let d = size_new_function(&cfg, &g, &it, &model).unwrap();
    let mut all = g.clone();
    all.add_resident(&it);
    let (id, last) = size_gpu_shares(&cfg, &all, &model).pop().unwrap();
    assert_eq!((id, d), (1, last));
    // θ is split between the two residents: a smaller share than alone.
    let alone = size_new_function(&cfg, &gpu(0, "hightrain", 1), &it, &model).unwrap();
    assert!(
        d.share.unwrap() < alone.share.unwrap(),
        "{d:?} vs {alone:?}"
    );
    let mut free = g.clone();
    free.training = None;
    assert_eq!(size_new_function(&cfg, &free, &it, &model), None);
}

#[test]
fn power_of_d_sampling_is_seeded_and_distinct() {
    use rand::SeedableRng;
    let mut a = rand::rngs::StdRng::seed_from_u64(3);
    let mut b = rand::rngs::StdRng::seed_from_u64(3);
    let s1 = sample_candidates(&mut a, 1024, 4);
    assert_eq!(s1, sample_candidates(&mut b, 1024, 4));
    let mut u = s1.clone();
    u.sort();
    u.dedup();
    assert_eq!(u.len(), 4);
    assert_eq!(sample_candidates(&mut a, 3, 8), vec![0, 1, 2]);
}

// ---------- share sizing ----------

fn share_in(theta: f64, d_train_full: f64) -> ShareInput {
    ShareInput {
        d_train_full,
        theta,
        correction: 1.0,
        d_fn: 0.2,
        sm_util: 0.5,
        solo_latency_ms: 10.0,
        slo_ms: 40.0,
    }
}

#[test]
fn share_sizing_is_monotone() {
    let grid: Vec<u32> = (1..=20).map(|i| i * 5).collect();
    let mut last = 0;
    for i in 0..=40 {
        let th = i as f64 * 0.01;
        let s = size_share(&grid, &share_in(th, 0.2)).share.unwrap_or(0);
        assert!(
            s >= last,
            "share non-decreasing in θ: {s} < {last} at θ {th}"
        );
        last = s;
    }
    assert_eq!(last, 100, "a loose θ allows the full share");
    let mut last = 101;
    for i in 0..=20 {
        let s = size_share(&grid, &share_in(0.1, 0.05 + i as f64 * 0.05))
            .share
            .unwrap_or(0);
        assert!(s <= last, "share non-increasing in predicted degradation");
        last = s;
    }
    // hand check: u = 0.5, D̂ full 0.2, θ 0.1 → D̂(s) = 0.2·s/0.5 ≤ 0.1 → s ≤ 25 %;
    // latency at 25 %: 10·1.2·(0.5/0.25) = 24 ms ≤ 40 ms
    let d = size_share(&grid, &share_in(0.1, 0.2));
    assert_eq!(d.share, Some(25));
    assert!((d.predicted_latency_ms - 24.0).abs() < 1e-9);
    // a tight SLO with a tight θ: nothing fits, SLO is the limit
    let mut tight = share_in(0.1, 0.2);
    tight.slo_ms = 20.0;
    let d = size_share(&grid, &tight);
    assert_eq!((d.share, d.limited_by), (None, Some(ShareBound::Slo)));
    assert_eq!(
        size_share(&[5], &share_in(0.001, 0.5)).limited_by,
        Some(ShareBound::ThetaTrain)
    );
}

#[test]
fn correction_tracks_observed_ratio_and_bounds() {
    let mut c = Correction::default();
    for _ in 0..100 {
        c.observe(0.1, 0.2);
    }
    assert!((c.factor - 2.0).abs() < 1e-3);
    for _ in 0..100 {
        c.observe(0.1, 1e6);
    }
    assert!(
        (c.factor - c.max).abs() < 1e-6,
        "bounded by max, got {}",
        c.factor
    );
    assert!(!c.observe(f64::NAN, 0.1) && !c.observe(0.0001, 0.1));
    // a larger correction never increases the sized share
    let grid: Vec<u32> = (1..=20).map(|i| i * 5).collect();
    let mut inp = share_in(0.1, 0.2);
    inp.slo_ms = 1000.0;
    let s1 = size_share(&grid, &inp).share.unwrap();
    inp.correction = 2.0;
    let s2 = size_share(&grid, &inp).share.unwrap();
    assert!(s2 < s1);
}

#[test]
fn gpu_share_sizing_splits_theta_among_residents() {
    let cfg = all_gpus_cfg();
    let mut g = gpu(0, "lowtrain", 1);
    for (id, m) in [(1, "small"), (2, "big")] {
        g.functions.push(Resident {
            id,
            key: ModelKey::new(m, 1),
            slo_ms: 100.0,
            solo_latency_ms: 10.0,
            sm_util: 0.3,
        });
    }
    let s = size_gpu_shares(&cfg, &g, &fake());
    assert_eq!(s.len(), 2);
    // small: 0.02·min(1, s/0.3) ≤ 0.05 always → 100 %; big: 0.06·s/0.3 ≤ 0.05 → s ≤ 25 %
    assert_eq!(s[0].1.share, Some(100));
    assert_eq!(s[1].1.share, Some(25));
}

// ---------- CLI ----------

#[test]
fn cli_synth_train_table_query() {
    use smore_predictor::cli::{run, PredictorCommand};
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d.csv");
    let model = dir.path().join("m.json");
    let table = dir.path().join("t.json");
    run(PredictorCommand::Synth {
        out: data.clone(),
        catalog: None,
        gpu: "rtx3090".into(),
        seed: 1,
        noise: 0.1,
        max_concurrency: 1,
    })
    .unwrap();
    run(PredictorCommand::Train {
        data,
        out: model.clone(),
        catalog: None,
        alpha: 0.2,
        seed: 1,
        trees: 5,
        raw_target: false,
    })
    .unwrap();
    run(PredictorCommand::Table {
        model,
        out: table.clone(),
        catalog: None,
        gpu: "rtx3090".into(),
    })
    .unwrap();
    run(PredictorCommand::Query {
        table: Some(table.clone()),
        model: None,
        catalog: None,
        gpu: "rtx3090".into(),
        weights: None,
        train: Some("vgg16:32".parse().unwrap()),
        fns: vec!["resnet50:8".parse().unwrap(), "deepfm:1".parse().unwrap()],
    })
    .unwrap();
    let e = run(PredictorCommand::Query {
        table: Some(table),
        model: None,
        catalog: None,
        gpu: "rtx3090".into(),
        weights: None,
        train: Some("vgg16:33".parse().unwrap()),
        fns: vec!["resnet50:8".parse().unwrap()],
    })
    .unwrap_err();
    assert!(e.to_string().contains("vgg16:33"));
}
