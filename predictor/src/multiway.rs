//! Multi-way degradation (SMORE eqs. 3–4) with online SGD on the weights.
//!
//! Deg_train(T) = Σ_j γ(T, s_j)·D̂_Tj;  Deg_fn(j) = α(s_j, T)·D̂_jT + Σ_{m≠j} β(s_j, s_m)·D̂_jm.
//! Weights are per model-name pair, start at 1, and follow SGD on ½(real − pred)²:
//! w ← w + η·(real − pred)·D̂, with the error clipped to ±`max_error`, each step clipped to
//! ±`max_step`, and each weight kept in [`w_min`, `w_max`]; non-finite or absurd observations are
//! rejected and counted.
//!
//! Owns: the weights and their file. Must never: let one observation move a weight by more than
//! `max_step`, or leave a weight outside its bounds.

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Weights file format version.
pub const WEIGHTS_FORMAT_VERSION: u32 = 1;

/// SGD settings and bounds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SgdConfig {
    /// Learning rate η.
    pub eta: f64,
    /// Lowest value a weight may take.
    pub w_min: f64,
    /// Highest value a weight may take.
    pub w_max: f64,
    /// |real − pred| is clipped to this before the step (degradation units).
    pub max_error: f64,
    /// One observation moves one weight by at most this.
    pub max_step: f64,
    /// Observed degradations above this are rejected as bogus (10 = 11× slower).
    pub max_observed: f64,
}

impl Default for SgdConfig {
    fn default() -> Self {
        SgdConfig {
            eta: 0.1,
            w_min: 0.1,
            w_max: 5.0,
            max_error: 1.0,
            max_step: 0.1,
            max_observed: 10.0,
        }
    }
}

/// Outcome of one observation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Update {
    /// Weights moved; `error` is real − pred before the step.
    Applied {
        /// The prediction with the weights before the step (degradation, fraction).
        pred: f64,
        /// real − pred before clipping (degradation, fraction).
        error: f64,
    },
    /// Observation or inputs unusable; nothing changed.
    Rejected,
}

/// γ/α/β weights over model names (dense n×n matrices).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MultiWay {
    /// Layout version of the saved file ([`WEIGHTS_FORMAT_VERSION`] when written by this build).
    pub format_version: u32,
    /// Model names; the matrices below are indexed by position in this list.
    pub models: Vec<String>,
    /// γ[train·n + fn]
    pub gamma: Vec<f64>,
    /// α[fn·n + train]
    pub alpha: Vec<f64>,
    /// β[fn·n + other fn]
    pub beta: Vec<f64>,
    /// SGD settings and weight bounds.
    pub sgd: SgdConfig,
    /// Observations applied so far.
    pub updates: u64,
    /// Observations rejected so far (non-finite, absurd or unusable).
    pub rejected: u64,
}

impl MultiWay {
    /// All weights 1 (SMORE's initialisation: a plain sum of pair-wise degradations).
    pub fn new(models: Vec<String>, sgd: SgdConfig) -> MultiWay {
        let n = models.len();
        MultiWay {
            format_version: WEIGHTS_FORMAT_VERSION,
            models,
            gamma: vec![1.0; n * n],
            alpha: vec![1.0; n * n],
            beta: vec![1.0; n * n],
            sgd,
            updates: 0,
            rejected: 0,
        }
    }

    fn n(&self) -> usize {
        self.models.len()
    }

    /// Index of model `name` in `models`, `None` when unknown.
    pub fn model_idx(&self, name: &str) -> Option<usize> {
        self.models.iter().position(|m| m == name)
    }

    /// γ(t, f): weight of function model `f`'s pair-wise degradation of training model `t` (eq. 3).
    pub fn gamma(&self, t: usize, f: usize) -> f64 {
        self.gamma[t * self.n() + f]
    }
    /// α(f, t): weight of training model `t`'s pair-wise degradation of function model `f` (eq. 4).
    pub fn alpha(&self, f: usize, t: usize) -> f64 {
        self.alpha[f * self.n() + t]
    }
    /// β(f, m): weight of function model `m`'s pair-wise degradation of function model `f` (eq. 4).
    pub fn beta(&self, f: usize, m: usize) -> f64 {
        self.beta[f * self.n() + m]
    }

    /// Eq. 3: `terms` are (function model index, pair-wise D̂_Tj).
    pub fn predict_train(&self, t: usize, terms: &[(usize, f64)]) -> f64 {
        terms.iter().map(|&(f, d)| self.gamma(t, f) * d).sum()
    }

    /// Eq. 4: `train` is (training model index, D̂_jT) if a trainer shares the GPU, `others` are
    /// (other function model index, D̂_jm).
    pub fn predict_fn(
        &self,
        j: usize,
        train: Option<(usize, f64)>,
        others: &[(usize, f64)],
    ) -> f64 {
        let a = train.map(|(t, d)| self.alpha(j, t) * d).unwrap_or(0.0);
        a + others
            .iter()
            .map(|&(m, d)| self.beta(j, m) * d)
            .sum::<f64>()
    }

    fn usable(&self, real: f64, ds: impl Iterator<Item = f64>) -> bool {
        let mut ok = real.is_finite() && real > -1.0 && real <= self.sgd.max_observed;
        for d in ds {
            ok &= d.is_finite() && d >= 0.0;
        }
        ok
    }

    fn step(&self, err: f64, d: f64) -> f64 {
        let e = err.clamp(-self.sgd.max_error, self.sgd.max_error);
        (self.sgd.eta * e * d).clamp(-self.sgd.max_step, self.sgd.max_step)
    }

    fn bound(&self, w: f64) -> f64 {
        w.clamp(self.sgd.w_min, self.sgd.w_max)
    }

    /// One SGD step on the γ weights from an observed training degradation.
    pub fn observe_train(&mut self, t: usize, terms: &[(usize, f64)], real: f64) -> Update {
        if t >= self.n() || terms.iter().any(|&(f, _)| f >= self.n()) || terms.is_empty() {
            self.rejected += 1;
            return Update::Rejected;
        }
        if !self.usable(real, terms.iter().map(|x| x.1)) {
            self.rejected += 1;
            return Update::Rejected;
        }
        let pred = self.predict_train(t, terms);
        let err = real - pred;
        let n = self.n();
        for &(f, d) in terms {
            let w = self.gamma[t * n + f] + self.step(err, d);
            self.gamma[t * n + f] = self.bound(w);
        }
        self.updates += 1;
        Update::Applied { pred, error: err }
    }

    /// One SGD step on the α/β weights from an observed function degradation.
    pub fn observe_fn(
        &mut self,
        j: usize,
        train: Option<(usize, f64)>,
        others: &[(usize, f64)],
        real: f64,
    ) -> Update {
        let n = self.n();
        let bad_idx = j >= n
            || train.is_some_and(|(t, _)| t >= n)
            || others.iter().any(|&(m, _)| m >= n)
            || (train.is_none() && others.is_empty());
        if bad_idx
            || !self.usable(
                real,
                train.iter().map(|x| x.1).chain(others.iter().map(|x| x.1)),
            )
        {
            self.rejected += 1;
            return Update::Rejected;
        }
        let pred = self.predict_fn(j, train, others);
        let err = real - pred;
        if let Some((t, d)) = train {
            let w = self.alpha[j * n + t] + self.step(err, d);
            self.alpha[j * n + t] = self.bound(w);
        }
        for &(m, d) in others {
            let w = self.beta[j * n + m] + self.step(err, d);
            self.beta[j * n + m] = self.bound(w);
        }
        self.updates += 1;
        Update::Applied { pred, error: err }
    }

    /// Writes the weights as JSON to `path` (through a temporary file, then a rename).
    pub fn save(&self, path: &Path) -> Result<()> {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, serde_json::to_string_pretty(self)?)
            .with_context(|| format!("cannot write weights {}", tmp.display()))?;
        std::fs::rename(&tmp, path)
            .with_context(|| format!("cannot replace weights {}", path.display()))
    }

    /// Loads weights; models missing from the file get weight 1, unknown ones are dropped.
    pub fn load(path: &Path, models: &[String]) -> Result<MultiWay> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read weights {}", path.display()))?;
        let v: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("{}: not JSON", path.display()))?;
        match v.get("format_version").and_then(|x| x.as_u64()) {
            Some(n) if n == WEIGHTS_FORMAT_VERSION as u64 => {}
            other => bail!(
                "{}: weights format_version {:?}, this build reads {WEIGHTS_FORMAT_VERSION}; \
                 delete the file to restart from weights = 1",
                path.display(),
                other
            ),
        }
        let old: MultiWay = serde_json::from_value(v)
            .with_context(|| format!("{}: malformed weights", path.display()))?;
        let on = old.models.len();
        if old.gamma.len() != on * on || old.alpha.len() != on * on || old.beta.len() != on * on {
            bail!(
                "{}: weight matrices do not match {} models",
                path.display(),
                on
            );
        }
        let mut w = MultiWay::new(models.to_vec(), old.sgd.clone());
        w.updates = old.updates;
        w.rejected = old.rejected;
        let n = models.len();
        for (i, a) in models.iter().enumerate() {
            let Some(oi) = old.model_idx(a) else { continue };
            for (k, b) in models.iter().enumerate() {
                let Some(ok) = old.model_idx(b) else { continue };
                w.gamma[i * n + k] = w.bound(old.gamma[oi * on + ok]);
                w.alpha[i * n + k] = w.bound(old.alpha[oi * on + ok]);
                w.beta[i * n + k] = w.bound(old.beta[oi * on + ok]);
            }
        }
        Ok(w)
    }
}
