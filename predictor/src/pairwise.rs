//! Pair-wise degradation model: two random forests (training side, function side) on the SMORE
//! 24-dim pair vector, a linear baseline for comparison, evaluation, and versioned persistence.
//!
//! Owns: fitting, prediction, the model file format. Must never: load a model file whose
//! `format_version` differs from [`MODEL_FORMAT_VERSION`] (features would be misread silently).

use crate::catalog::Catalog;
use crate::dataset::{mae, rmsle, Dataset, Row, Source};
use crate::features::{Features, ModelKey, Role, PAIR_DIM};
use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use smartcore::ensemble::random_forest_regressor::{
    RandomForestRegressor, RandomForestRegressorParameters,
};
use smartcore::linalg::basic::matrix::DenseMatrix;
use smartcore::linear::linear_regression::{
    LinearRegression, LinearRegressionParameters, LinearRegressionSolverName,
};
use std::path::Path;

/// Model file format version; bump when features, targets or the forest encoding change.
pub const MODEL_FORMAT_VERSION: u32 = 1;

type Forest = RandomForestRegressor<f64, f64, DenseMatrix<f64>, Vec<f64>>;

/// Random-forest hyper-parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ForestParams {
    /// Trees per forest.
    pub n_trees: usize,
    /// Depth limit of each tree (None = grow until the leaf size limit).
    pub max_depth: Option<u16>,
    /// Fewest training rows a leaf may hold.
    pub min_samples_leaf: usize,
    /// Features tried per split (None = smartcore's default).
    pub m: Option<usize>,
    /// Seed of the forests' bootstrap samples and feature choices.
    pub seed: u64,
    /// Fit ln(1+δ) and predict expm1 of the forest output (see docs/predictor.md for the measured effect).
    pub log_target: bool,
}

impl Default for ForestParams {
    fn default() -> Self {
        ForestParams {
            n_trees: 100,
            max_depth: None,
            min_samples_leaf: 1,
            // 24 / 3: the usual regression-forest choice (Breiman); measured on the synthetic set.
            m: Some(8),
            seed: 7,
            log_target: true,
        }
    }
}

/// What a model was trained on (printed by `query`/`eval`, kept in the file).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModelMeta {
    /// Pair-wise rows it was trained on.
    pub rows: usize,
    /// Sampling ratio α the caller trained with (fraction of the dataset).
    pub alpha: f64,
    /// Seed of the train/test split.
    pub split_seed: u64,
    /// Provenance of the rows (`synthetic` must stay visible).
    pub sources: Vec<Source>,
    /// Distinct devices the rows were collected on.
    pub devices: Vec<String>,
    /// Date of training (YYYY-MM-DD, UTC).
    pub created: String,
    /// Hyper-parameters of both forests.
    pub params: ForestParams,
}

/// The trained pair-wise model.
#[derive(Debug, Serialize, Deserialize)]
pub struct PairModel {
    /// Layout version of the saved file ([`MODEL_FORMAT_VERSION`] when written by this build).
    pub format_version: u32,
    /// What the model was trained on.
    pub meta: ModelMeta,
    train_side: Forest,
    fn_side: Forest,
}

/// Design matrix: pair vectors, training-side targets, function-side targets.
pub type Design = (Vec<Vec<f64>>, Vec<f64>, Vec<f64>);

/// Pair vectors and both targets of `rows`.
pub fn design(cat: &Catalog, rows: &[Row]) -> Result<Design> {
    let mut x = Vec::with_capacity(rows.len());
    let (mut yt, mut yf) = (Vec::new(), Vec::new());
    for r in rows {
        let t = cat.features(&r.train_key(), Role::Training)?;
        let f = cat.features(&r.fn_key(), Role::Inference)?;
        x.push(Features::pair(&t, &f).to_vec());
        yt.push(r.deg_train);
        yf.push(r.deg_fn);
    }
    Ok((x, yt, yf))
}

fn matrix(x: &[Vec<f64>]) -> Result<DenseMatrix<f64>> {
    DenseMatrix::from_2d_vec(&x.to_vec()).map_err(|e| anyhow!("building feature matrix: {e}"))
}

fn to_target(y: &[f64], log: bool) -> Vec<f64> {
    if log {
        y.iter().map(|v| v.max(-0.99).ln_1p()).collect()
    } else {
        y.to_vec()
    }
}

fn from_target(y: f64, log: bool) -> f64 {
    let v = if log { y.exp_m1() } else { y };
    v.max(0.0)
}

fn fit_forest(x: &DenseMatrix<f64>, y: Vec<f64>, p: &ForestParams) -> Result<Forest> {
    let mut params = RandomForestRegressorParameters::default()
        .with_n_trees(p.n_trees.max(1))
        .with_min_samples_leaf(p.min_samples_leaf.max(1))
        .with_seed(p.seed);
    if let Some(d) = p.max_depth {
        params = params.with_max_depth(d);
    }
    if let Some(m) = p.m {
        params = params.with_m(m.clamp(1, PAIR_DIM));
    }
    RandomForestRegressor::fit(x, &y, params).map_err(|e| anyhow!("random forest fit: {e}"))
}

impl PairModel {
    /// Fits both forests on `ds` (pair-wise rows only).
    pub fn train(
        cat: &Catalog,
        ds: &Dataset,
        p: &ForestParams,
        alpha: f64,
        split_seed: u64,
    ) -> Result<PairModel> {
        let ds = ds.pairwise();
        if ds.rows.len() < 2 {
            bail!(
                "need at least 2 pair-wise rows (concurrency = 1) to train, got {}",
                ds.rows.len()
            );
        }
        let (x, yt, yf) = design(cat, &ds.rows)?;
        let xm = matrix(&x)?;
        let train_side = fit_forest(&xm, to_target(&yt, p.log_target), p)?;
        let fn_side = fit_forest(&xm, to_target(&yf, p.log_target), p)?;
        let mut devices: Vec<String> = ds.rows.iter().map(|r| r.device.clone()).collect();
        devices.sort();
        devices.dedup();
        Ok(PairModel {
            format_version: MODEL_FORMAT_VERSION,
            meta: ModelMeta {
                rows: ds.rows.len(),
                alpha,
                split_seed,
                sources: ds.sources(),
                devices,
                created: crate::synth::today(),
                params: p.clone(),
            },
            train_side,
            fn_side,
        })
    }

    /// Predicts (δ_train, δ_fn) for many pair vectors at once.
    pub fn predict_batch(&self, x: &[Vec<f64>]) -> Result<(Vec<f64>, Vec<f64>)> {
        if x.is_empty() {
            return Ok((vec![], vec![]));
        }
        let xm = matrix(x)?;
        let log = self.meta.params.log_target;
        let t = self
            .train_side
            .predict(&xm)
            .map_err(|e| anyhow!("predict: {e}"))?;
        let f = self
            .fn_side
            .predict(&xm)
            .map_err(|e| anyhow!("predict: {e}"))?;
        Ok((
            t.into_iter().map(|v| from_target(v, log)).collect(),
            f.into_iter().map(|v| from_target(v, log)).collect(),
        ))
    }

    /// Predicts (δ_train, δ_fn) for one pair.
    pub fn predict(&self, cat: &Catalog, train: &ModelKey, func: &ModelKey) -> Result<(f64, f64)> {
        self.predict_features(
            &cat.features(train, Role::Training)?,
            &cat.features(func, Role::Inference)?,
        )
    }

    /// Predicts from explicit features (`train` as the serverful side).
    pub fn predict_features(&self, train: &Features, func: &Features) -> Result<(f64, f64)> {
        let (t, f) = self.predict_batch(&[Features::pair(train, func).to_vec()])?;
        Ok((t[0], f[0]))
    }

    /// Writes the model as JSON.
    pub fn save(&self, path: &Path) -> Result<()> {
        let s = serde_json::to_string(self)?;
        std::fs::write(path, s).with_context(|| format!("cannot write model {}", path.display()))
    }

    /// Reads a model file, refusing other format versions with a clear message.
    pub fn load(path: &Path) -> Result<PairModel> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read model {}", path.display()))?;
        PairModel::from_json(&text, &path.display().to_string())
    }

    /// Parses a model from JSON text; `origin` names the source in error messages.
    pub fn from_json(text: &str, origin: &str) -> Result<PairModel> {
        let v: serde_json::Value =
            serde_json::from_str(text).with_context(|| format!("{origin}: not JSON"))?;
        match v.get("format_version").and_then(|x| x.as_u64()) {
            Some(n) if n == MODEL_FORMAT_VERSION as u64 => {}
            Some(n) => bail!(
                "{origin}: model format_version {n}, this build reads {MODEL_FORMAT_VERSION}; \
                 retrain with `smore predictor train`"
            ),
            None => bail!("{origin}: no format_version field; not a smore predictor model"),
        }
        serde_json::from_value(v).with_context(|| format!("{origin}: malformed model"))
    }
}

/// Least-squares linear baseline on standardized features (SMORE Table V's "Linear").
pub struct LinearBaseline {
    mean: Vec<f64>,
    scale: Vec<f64>,
    model: LinearRegression<f64, f64, DenseMatrix<f64>, Vec<f64>>,
    log_target: bool,
}

impl LinearBaseline {
    /// Fits the baseline on pair vectors `x` and degradations `y` (on ln(1+δ) when `log_target`).
    pub fn fit(x: &[Vec<f64>], y: &[f64], log_target: bool) -> Result<LinearBaseline> {
        let d = x.first().map(|r| r.len()).unwrap_or(0);
        let n = x.len() as f64;
        let mut mean = vec![0.0; d];
        let mut scale = vec![0.0; d];
        for r in x {
            for (m, v) in mean.iter_mut().zip(r) {
                *m += v / n;
            }
        }
        for r in x {
            for ((s, v), m) in scale.iter_mut().zip(r).zip(&mean) {
                *s += (v - m).powi(2) / n;
            }
        }
        for s in &mut scale {
            *s = if *s > 0.0 { s.sqrt() } else { 1.0 };
        }
        let z = standardize(x, &mean, &scale);
        let model = LinearRegression::fit(
            &matrix(&z)?,
            &to_target(y, log_target),
            LinearRegressionParameters::default().with_solver(LinearRegressionSolverName::SVD),
        )
        .map_err(|e| anyhow!("linear regression fit: {e}"))?;
        Ok(LinearBaseline {
            mean,
            scale,
            model,
            log_target,
        })
    }

    /// Predicted degradations δ (fraction, ≥ 0) of pair vectors `x`.
    pub fn predict(&self, x: &[Vec<f64>]) -> Result<Vec<f64>> {
        let z = standardize(x, &self.mean, &self.scale);
        let p = self
            .model
            .predict(&matrix(&z)?)
            .map_err(|e| anyhow!("linear predict: {e}"))?;
        Ok(p.into_iter()
            .map(|v| from_target(v, self.log_target))
            .collect())
    }
}

fn standardize(x: &[Vec<f64>], mean: &[f64], scale: &[f64]) -> Vec<Vec<f64>> {
    x.iter()
        .map(|r| {
            r.iter()
                .zip(mean)
                .zip(scale)
                .map(|((v, m), s)| (v - m) / s)
                .collect()
        })
        .collect()
}

/// RMSLE and MAE of one side.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Scores {
    /// Root mean squared logarithmic error.
    pub rmsle: f64,
    /// Mean absolute error (degradation, fraction).
    pub mae: f64,
}

/// Held-out scores of one model variant at one α.
#[derive(Debug, Clone, Serialize)]
pub struct EvalResult {
    /// The variant's [`Variant::name`].
    pub variant: String,
    /// Sampling ratio α: fraction of the pair-wise rows trained on.
    pub alpha: f64,
    /// Rows trained on.
    pub n_train: usize,
    /// Held-out rows scored.
    pub n_test: usize,
    /// Scores of the training-side prediction δ_train.
    pub train_side: Scores,
    /// Scores of the function-side prediction δ_fn.
    pub fn_side: Scores,
}

impl EvalResult {
    /// Mean of both sides (the single figure compared with SMORE's Table V).
    pub fn mean(&self) -> Scores {
        Scores {
            rmsle: (self.train_side.rmsle + self.fn_side.rmsle) / 2.0,
            mae: (self.train_side.mae + self.fn_side.mae) / 2.0,
        }
    }
}

/// Model variants compared by [`evaluate`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Variant {
    /// Random forests fitted on ln(1+δ).
    ForestLog,
    /// Random forests fitted on δ.
    ForestRaw,
    /// The [`LinearBaseline`] fitted on δ.
    Linear,
}

impl Variant {
    /// Label of the variant in tables and JSON output.
    pub fn name(self) -> &'static str {
        match self {
            Variant::ForestLog => "random-forest (log1p target)",
            Variant::ForestRaw => "random-forest (raw target)",
            Variant::Linear => "linear (raw target)",
        }
    }
}

/// Trains `variant` on an α-sample of the pair-wise rows and scores it on the rest.
pub fn evaluate(
    cat: &Catalog,
    ds: &Dataset,
    variant: Variant,
    alpha: f64,
    seed: u64,
    p: &ForestParams,
) -> Result<EvalResult> {
    let ds = ds.pairwise();
    let (tr, te) = ds.split(alpha, seed)?;
    let (xtr, yttr, yftr) = design(cat, &tr.rows)?;
    let (xte, ytte, yfte) = design(cat, &te.rows)?;
    let (pt, pf) = match variant {
        Variant::ForestLog | Variant::ForestRaw => {
            let p = ForestParams {
                log_target: variant == Variant::ForestLog,
                ..p.clone()
            };
            let m = PairModel::train(cat, &tr, &p, alpha, seed)?;
            m.predict_batch(&xte)?
        }
        Variant::Linear => (
            LinearBaseline::fit(&xtr, &yttr, false)?.predict(&xte)?,
            LinearBaseline::fit(&xtr, &yftr, false)?.predict(&xte)?,
        ),
    };
    Ok(EvalResult {
        variant: variant.name().into(),
        alpha,
        n_train: tr.rows.len(),
        n_test: te.rows.len(),
        train_side: Scores {
            rmsle: rmsle(&ytte, &pt),
            mae: mae(&ytte, &pt),
        },
        fn_side: Scores {
            rmsle: rmsle(&yfte, &pf),
            mae: mae(&yfte, &pf),
        },
    })
}
