//! Precomputed pair-wise degradation table over every catalog configuration on one GPU type
//! (SMORE Fig. 4 step ④): O(1) queries on the scheduling path, no forest evaluation there.
//!
//! Owns: the table file format (versioned JSON). Must never: answer for a configuration it was not
//! built for (callers get `None` and decide).

use crate::catalog::Catalog;
use crate::features::{Features, ModelKey, Role};
use crate::pairwise::PairModel;
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;

/// Table file format version.
pub const TABLE_FORMAT_VERSION: u32 = 1;

/// Index of a training configuration in a [`PairTable`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TrainId(pub u32);
/// Index of a function configuration in a [`PairTable`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FnId(pub u32);

/// Dense tables: `d_train[t·F + f]`, `d_fn[t·F + f]` (function f next to training t) and
/// `d_fn_fn[j·F + m]` (function j next to function m, predicted by the function-side forest with
/// m's inference features in the serverful slot: an extrapolation, see docs/predictor.md).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PairTable {
    /// Layout version of the saved file ([`TABLE_FORMAT_VERSION`] when written by this build).
    pub format_version: u32,
    /// GPU type (catalog `[[gpu]] name`) the table was built for.
    pub gpu: String,
    /// Training configurations; [`TrainId`] indexes this list.
    pub trains: Vec<ModelKey>,
    /// Function (inference) configurations; [`FnId`] indexes this list.
    pub fns: Vec<ModelKey>,
    /// Predicted training slowdown D̂_train (fraction) at `t·F + f`.
    pub d_train: Vec<f32>,
    /// Predicted function latency degradation D̂_fn (fraction) at `t·F + f`.
    pub d_fn: Vec<f32>,
    /// Predicted degradation (fraction) of function `j` next to function `m` at `j·F + m`.
    pub d_fn_fn: Vec<f32>,
    /// Model names; `train_model[t]` / `fn_model[f]` index into it (multi-way weights use it).
    pub models: Vec<String>,
    /// Index into `models` of each training configuration's model.
    pub train_model: Vec<u32>,
    /// Index into `models` of each function configuration's model.
    pub fn_model: Vec<u32>,
    #[serde(skip)]
    train_index: HashMap<ModelKey, u32>,
    #[serde(skip)]
    fn_index: HashMap<ModelKey, u32>,
}

impl PairTable {
    /// Evaluates `model` on every training × function configuration profiled on `gpu`.
    pub fn build(cat: &Catalog, model: &PairModel, gpu: &str) -> Result<PairTable> {
        let trains = cat.configs(gpu, Role::Training);
        let fns = cat.configs(gpu, Role::Inference);
        if trains.is_empty() || fns.is_empty() {
            bail!("the catalog has no training or no inference profiles on GPU type `{gpu}`");
        }
        let tf: Vec<Features> = trains
            .iter()
            .map(|k| cat.features(k, Role::Training))
            .collect::<Result<_>>()?;
        let ff: Vec<Features> = fns
            .iter()
            .map(|k| cat.features(k, Role::Inference))
            .collect::<Result<_>>()?;
        let mut x = Vec::with_capacity(tf.len() * ff.len());
        for t in &tf {
            for f in &ff {
                x.push(Features::pair(t, f).to_vec());
            }
        }
        let (dt, df) = model.predict_batch(&x)?;
        let mut xx = Vec::with_capacity(ff.len() * ff.len());
        for j in &ff {
            for m in &ff {
                xx.push(Features::pair(m, j).to_vec());
            }
        }
        let (_, dff) = model.predict_batch(&xx)?;
        let models: Vec<String> = cat.models.iter().map(|m| m.name.clone()).collect();
        let pos = |name: &str| models.iter().position(|m| m == name).unwrap() as u32;
        let mut t = PairTable {
            format_version: TABLE_FORMAT_VERSION,
            gpu: gpu.to_string(),
            train_model: trains.iter().map(|k| pos(&k.model)).collect(),
            fn_model: fns.iter().map(|k| pos(&k.model)).collect(),
            trains,
            fns,
            d_train: dt.into_iter().map(|v| v as f32).collect(),
            d_fn: df.into_iter().map(|v| v as f32).collect(),
            d_fn_fn: dff.into_iter().map(|v| v as f32).collect(),
            models,
            train_index: HashMap::new(),
            fn_index: HashMap::new(),
        };
        t.reindex()?;
        Ok(t)
    }

    fn reindex(&mut self) -> Result<()> {
        let (nt, nf) = (self.trains.len(), self.fns.len());
        if self.d_train.len() != nt * nf
            || self.d_fn.len() != nt * nf
            || self.d_fn_fn.len() != nf * nf
            || self.train_model.len() != nt
            || self.fn_model.len() != nf
            || self
                .train_model
                .iter()
                .chain(&self.fn_model)
                .any(|&m| m as usize >= self.models.len())
        {
            bail!("table dimensions are inconsistent (truncated or edited file?); rebuild it");
        }
        self.train_index = self.trains.iter().cloned().zip(0..).collect();
        self.fn_index = self.fns.iter().cloned().zip(0..).collect();
        Ok(())
    }

    /// Id of a training configuration, `None` when the table was not built with it.
    pub fn train_id(&self, k: &ModelKey) -> Option<TrainId> {
        self.train_index.get(k).map(|&i| TrainId(i))
    }
    /// Id of a function configuration, `None` when the table was not built with it.
    pub fn fn_id(&self, k: &ModelKey) -> Option<FnId> {
        self.fn_index.get(k).map(|&i| FnId(i))
    }
    /// Model index (into `models`) of a training / function configuration.
    pub fn train_model_idx(&self, t: TrainId) -> usize {
        self.train_model[t.0 as usize] as usize
    }
    /// Model index (into `models`) of a function configuration.
    pub fn fn_model_idx(&self, f: FnId) -> usize {
        self.fn_model[f.0 as usize] as usize
    }

    /// (D̂_train, D̂_fn) of the pair: two array reads.
    #[inline]
    pub fn pair(&self, t: TrainId, f: FnId) -> (f64, f64) {
        let i = t.0 as usize * self.fns.len() + f.0 as usize;
        (self.d_train[i] as f64, self.d_fn[i] as f64)
    }

    /// D̂ of function `j` next to function `m`.
    #[inline]
    pub fn fn_fn(&self, j: FnId, m: FnId) -> f64 {
        self.d_fn_fn[j.0 as usize * self.fns.len() + m.0 as usize] as f64
    }

    /// Writes the table as JSON to `path`.
    pub fn save(&self, path: &Path) -> Result<()> {
        std::fs::write(path, serde_json::to_string(self)?)
            .with_context(|| format!("cannot write table {}", path.display()))
    }

    /// Reads a table written by [`PairTable::save`]; refuses another format version or
    /// inconsistent dimensions.
    pub fn load(path: &Path) -> Result<PairTable> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read table {}", path.display()))?;
        let v: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("{}: not JSON", path.display()))?;
        match v.get("format_version").and_then(|x| x.as_u64()) {
            Some(n) if n == TABLE_FORMAT_VERSION as u64 => {}
            other => bail!(
                "{}: table format_version {:?}, this build reads {TABLE_FORMAT_VERSION}; \
                 rebuild with `smore predictor table`",
                path.display(),
                other
            ),
        }
        let mut t: PairTable = serde_json::from_value(v)
            .with_context(|| format!("{}: malformed table", path.display()))?;
        t.reindex().with_context(|| format!("{}", path.display()))?;
        Ok(t)
    }
}
