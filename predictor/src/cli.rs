//! `smore predictor …`: synth, train, eval, table, query.
//!
//! Owns: argument parsing and human-readable output of the predictor tools. Must never: print a
//! figure from synthetic data without saying it is synthetic.

use crate::catalog::Catalog;
use crate::dataset::{Dataset, Source};
use crate::features::{ModelKey, Role};
use crate::multiway::{MultiWay, SgdConfig};
use crate::pairwise::{evaluate, ForestParams, PairModel, Variant};
use crate::predictor::Predictor;
use crate::sched::DegradationModel;
use crate::synth::{generate, SynthParams};
use crate::table::PairTable;
use anyhow::{bail, Result};
use std::path::PathBuf;

/// Predictor subcommands (wired as `smore predictor …`).
#[derive(Debug, clap::Subcommand)]
pub enum PredictorCommand {
    /// Write a SYNTHETIC co-location dataset (documented interference model, seeded).
    Synth {
        /// Output file.
        #[arg(long)]
        out: PathBuf,
        /// Catalog TOML (default: the builtin one).
        #[arg(long)]
        catalog: Option<PathBuf>,
        /// GPU type whose profiles are used.
        #[arg(long, default_value = "rtx3090")]
        gpu: String,
        /// Seed of the generator: the same seed writes the same dataset.
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// σ of the multiplicative log-normal noise.
        #[arg(long, default_value_t = 0.15)]
        noise: f64,
        /// Also emit rows with 2..=N concurrent function requests.
        #[arg(long, default_value_t = 1)]
        max_concurrency: u32,
    },
    /// Train the pair-wise random forests on a dataset and save the model (JSON).
    Train {
        /// Co-location dataset (CSV).
        #[arg(long)]
        data: PathBuf,
        /// Where to write the trained model (JSON).
        #[arg(long)]
        out: PathBuf,
        /// Catalog TOML (default: the builtin one).
        #[arg(long)]
        catalog: Option<PathBuf>,
        /// Sampling ratio α: train on this fraction, report scores on the rest (1 = all rows).
        #[arg(long, default_value_t = 1.0)]
        alpha: f64,
        /// Seed of the forests' bootstrap and of the sampling.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Trees per random forest.
        #[arg(long, default_value_t = 100)]
        trees: usize,
        /// Fit the raw degradation instead of log1p(degradation).
        #[arg(long)]
        raw_target: bool,
    },
    /// RMSLE/MAE per α for random forest vs linear (SMORE Table V style).
    Eval {
        /// Co-location dataset (CSV).
        #[arg(long)]
        data: PathBuf,
        /// Catalog TOML (default: the builtin one).
        #[arg(long)]
        catalog: Option<PathBuf>,
        /// Sampling ratios α to evaluate (comma-separated): train on that fraction, score on the rest.
        #[arg(long, value_delimiter = ',', default_value = "0.1,0.2,0.5,0.8")]
        alphas: Vec<f64>,
        /// Seed of the forests' bootstrap and of the sampling.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Trees per random forest.
        #[arg(long, default_value_t = 100)]
        trees: usize,
        /// Print JSON lines instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Precompute the lookup table of every catalog pair on a GPU type.
    Table {
        /// Trained model from `train`.
        #[arg(long)]
        model: PathBuf,
        /// Where to write the table (JSON).
        #[arg(long)]
        out: PathBuf,
        /// Catalog TOML (default: the builtin one).
        #[arg(long)]
        catalog: Option<PathBuf>,
        /// GPU type whose profiles are used.
        #[arg(long, default_value = "rtx3090")]
        gpu: String,
    },
    /// Predicted degradations of a trainer with one function (pair) or several (multi-way).
    Query {
        /// Lookup table from `table` (fast path).
        #[arg(long, conflicts_with = "model")]
        table: Option<PathBuf>,
        /// Or a model from `train` (the table is built in memory).
        #[arg(long)]
        model: Option<PathBuf>,
        /// Catalog TOML (default: the builtin one).
        #[arg(long)]
        catalog: Option<PathBuf>,
        /// GPU type whose profiles are used.
        #[arg(long, default_value = "rtx3090")]
        gpu: String,
        /// Multi-way weights file (default: all weights 1).
        #[arg(long)]
        weights: Option<PathBuf>,
        /// Training job, MODEL:BATCH (e.g. vgg16:32). Omit for functions only.
        #[arg(long)]
        train: Option<ModelKey>,
        /// Function, MODEL:BATCH; repeat for multi-way.
        #[arg(long = "fn", required = true)]
        fns: Vec<ModelKey>,
    },
}

fn label(sources: &[Source]) -> &'static str {
    if sources.contains(&Source::Synthetic) {
        if sources.contains(&Source::Measured) {
            "MIXED measured + SYNTHETIC data"
        } else {
            "SYNTHETIC data (not a measurement)"
        }
    } else {
        "measured data"
    }
}

/// Runs one predictor subcommand.
pub fn run(cmd: PredictorCommand) -> Result<()> {
    match cmd {
        PredictorCommand::Synth {
            out,
            catalog,
            gpu,
            seed,
            noise,
            max_concurrency,
        } => {
            let cat = Catalog::load_or_builtin(catalog.as_deref())?;
            let ds = generate(
                &cat,
                &SynthParams {
                    gpu,
                    seed,
                    noise,
                    max_concurrency,
                    ..SynthParams::default()
                },
            )?;
            ds.save(&out)?;
            println!(
                "wrote {} SYNTHETIC rows (seed {seed}, noise {noise}) to {}",
                ds.rows.len(),
                out.display()
            );
        }
        PredictorCommand::Train {
            data,
            out,
            catalog,
            alpha,
            seed,
            trees,
            raw_target,
        } => {
            let cat = Catalog::load_or_builtin(catalog.as_deref())?;
            let ds = Dataset::load(&data)?.pairwise();
            let params = ForestParams {
                n_trees: trees,
                log_target: !raw_target,
                ..ForestParams::default()
            };
            let (tr, te) = if alpha >= 1.0 {
                (ds.clone(), Dataset::default())
            } else {
                ds.split(alpha, seed)?
            };
            let m = PairModel::train(&cat, &tr, &params, alpha.min(1.0), seed)?;
            m.save(&out)?;
            println!(
                "trained on {} rows of {} ({}), saved {}",
                tr.rows.len(),
                data.display(),
                label(&ds.sources()),
                out.display()
            );
            if !te.rows.is_empty() {
                let (x, yt, yf) = crate::pairwise::design(&cat, &te.rows)?;
                let (pt, pf) = m.predict_batch(&x)?;
                use crate::dataset::{mae, rmsle};
                println!(
                    "held-out {} rows: training side RMSLE {:.3} MAE {:.3}; function side RMSLE {:.3} MAE {:.3}",
                    te.rows.len(),
                    rmsle(&yt, &pt),
                    mae(&yt, &pt),
                    rmsle(&yf, &pf),
                    mae(&yf, &pf)
                );
            }
        }
        PredictorCommand::Eval {
            data,
            catalog,
            alphas,
            seed,
            trees,
            json,
        } => {
            let cat = Catalog::load_or_builtin(catalog.as_deref())?;
            let ds = Dataset::load(&data)?.pairwise();
            let params = ForestParams {
                n_trees: trees,
                ..ForestParams::default()
            };
            if !json {
                println!(
                    "{} pair-wise rows from {} — {}",
                    ds.rows.len(),
                    data.display(),
                    label(&ds.sources())
                );
                println!(
                    "{:<30} {:>5} {:>6} {:>6} | {:>12} {:>10} | {:>12} {:>10} | {:>11} {:>9}",
                    "model",
                    "alpha",
                    "train",
                    "test",
                    "RMSLE(train)",
                    "MAE(train)",
                    "RMSLE(fn)",
                    "MAE(fn)",
                    "RMSLE(mean)",
                    "MAE(mean)"
                );
            }
            for &a in &alphas {
                for v in [Variant::ForestLog, Variant::ForestRaw, Variant::Linear] {
                    let r = evaluate(&cat, &ds, v, a, seed, &params)?;
                    if json {
                        println!("{}", serde_json::to_string(&r)?);
                    } else {
                        let m = r.mean();
                        println!(
                            "{:<30} {:>5} {:>6} {:>6} | {:>12.3} {:>10.3} | {:>12.3} {:>10.3} | {:>11.3} {:>9.3}",
                            r.variant, a, r.n_train, r.n_test, r.train_side.rmsle, r.train_side.mae,
                            r.fn_side.rmsle, r.fn_side.mae, m.rmsle, m.mae
                        );
                    }
                }
            }
        }
        PredictorCommand::Table {
            model,
            out,
            catalog,
            gpu,
        } => {
            let cat = Catalog::load_or_builtin(catalog.as_deref())?;
            let m = PairModel::load(&model)?;
            let t = PairTable::build(&cat, &m, &gpu)?;
            t.save(&out)?;
            println!(
                "table for {gpu}: {} training × {} function configurations (model trained on {}), saved {}",
                t.trains.len(),
                t.fns.len(),
                label(&m.meta.sources),
                out.display()
            );
        }
        PredictorCommand::Query {
            table,
            model,
            catalog,
            gpu,
            weights,
            train,
            fns,
        } => {
            let cat = Catalog::load_or_builtin(catalog.as_deref())?;
            let t = match (table, model) {
                (Some(t), _) => PairTable::load(&t)?,
                (None, Some(m)) => PairTable::build(&cat, &PairModel::load(&m)?, &gpu)?,
                (None, None) => bail!("query needs --table PATH or --model PATH"),
            };
            let w = match &weights {
                Some(p) => MultiWay::load(p, &t.models)?,
                None => MultiWay::new(t.models.clone(), SgdConfig::default()),
            };
            let p = Predictor {
                table: t,
                weights: w,
            };
            for k in train.iter() {
                cat.features(k, Role::Training)?;
                if p.table.train_id(k).is_none() {
                    bail!("training configuration {k} is not in the table (profiled on {}); add a profile to the catalog and rebuild", p.table.gpu);
                }
            }
            for k in &fns {
                cat.features(k, Role::Inference)?;
                if p.table.fn_id(k).is_none() {
                    bail!("function configuration {k} is not in the table (profiled on {}); add a profile to the catalog and rebuild", p.table.gpu);
                }
            }
            let keys: Vec<&ModelKey> = fns.iter().collect();
            let kind = if fns.len() == 1 {
                "pair-wise"
            } else {
                "multi-way"
            };
            println!(
                "{kind} prediction on {} (weights: {})",
                p.table.gpu,
                weights
                    .as_ref()
                    .map(|w| w.display().to_string())
                    .unwrap_or_else(|| "all 1".into())
            );
            if let Some(tk) = &train {
                let d = p.train_deg(tk, &keys).expect("ids checked");
                println!("  training {tk}: D̂_train = {d:.4} ({:+.1} %)", d * 100.0);
            }
            for (j, k) in fns.iter().enumerate() {
                let d = p.fn_deg(train.as_ref(), &keys, j).expect("ids checked");
                let solo = cat.profile(&p.table.gpu, k, Role::Inference);
                match solo {
                    Some(s) => println!(
                        "  function {k}: D̂_fn = {d:.4} ({:+.1} %), P99 {:.2} ms solo ({:?}) → {:.2} ms",
                        d * 100.0, s.latency_ms, s.source, s.latency_ms * (1.0 + d)
                    ),
                    None => println!("  function {k}: D̂_fn = {d:.4} ({:+.1} %)", d * 100.0),
                }
            }
        }
    }
    Ok(())
}
