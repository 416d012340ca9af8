//! The query facade: pair table + multi-way weights, answering "what if these run together?".
//!
//! Owns: turning model keys into table/weight indices and feeding observations to SGD. Must never:
//! evaluate a forest on the query path (the table is precomputed) or do I/O except load/save.

use crate::features::ModelKey;
use crate::multiway::{MultiWay, SgdConfig, Update};
use crate::sched::DegradationModel;
use crate::table::{FnId, PairTable, TrainId};
use anyhow::Result;
use std::path::Path;

/// Eq. 4 terms: (trainer model, D̂_jT) and (other function model, D̂_jm).
type FnTerms = (Option<(usize, f64)>, Vec<(usize, f64)>);

/// Pair table + multi-way weights.
#[derive(Debug, Clone)]
pub struct Predictor {
    /// Precomputed pair-wise degradations of every profiled configuration.
    pub table: PairTable,
    /// Multi-way weights that combine pair-wise degradations when several functions share a GPU.
    pub weights: MultiWay,
}

impl Predictor {
    /// Fresh weights (all 1) over the table's models.
    pub fn new(table: PairTable, sgd: SgdConfig) -> Predictor {
        let weights = MultiWay::new(table.models.clone(), sgd);
        Predictor { table, weights }
    }

    /// Loads the table, and the weights from `weights` if that file exists (else weights = 1).
    pub fn load(table: &Path, weights: Option<&Path>) -> Result<Predictor> {
        let table = PairTable::load(table)?;
        let w = match weights {
            Some(p) if p.exists() => MultiWay::load(p, &table.models)?,
            _ => MultiWay::new(table.models.clone(), SgdConfig::default()),
        };
        Ok(Predictor { table, weights: w })
    }

    fn ids(&self, fns: &[&ModelKey]) -> Option<Vec<FnId>> {
        fns.iter().map(|k| self.table.fn_id(k)).collect()
    }

    fn train_terms(&self, t: TrainId, fns: &[FnId]) -> Vec<(usize, f64)> {
        fns.iter()
            .map(|&f| (self.table.fn_model_idx(f), self.table.pair(t, f).0))
            .collect()
    }

    fn fn_terms(&self, train: Option<TrainId>, fns: &[FnId], j: usize) -> FnTerms {
        let fj = fns[j];
        let tr = train.map(|t| (self.table.train_model_idx(t), self.table.pair(t, fj).1));
        let others = fns
            .iter()
            .enumerate()
            .filter(|&(m, _)| m != j)
            .map(|(_, &fm)| (self.table.fn_model_idx(fm), self.table.fn_fn(fj, fm)))
            .collect();
        (tr, others)
    }

    /// Feeds an observed training degradation to the γ weights.
    pub fn observe_train(&mut self, train: &ModelKey, fns: &[&ModelKey], real: f64) -> Update {
        let (Some(t), Some(ids)) = (self.table.train_id(train), self.ids(fns)) else {
            self.weights.rejected += 1;
            return Update::Rejected;
        };
        let terms = self.train_terms(t, &ids);
        let ti = self.table.train_model_idx(t);
        self.weights.observe_train(ti, &terms, real)
    }

    /// Feeds an observed degradation of `fns[j]` to the α/β weights.
    pub fn observe_fn(
        &mut self,
        train: Option<&ModelKey>,
        fns: &[&ModelKey],
        j: usize,
        real: f64,
    ) -> Update {
        let t = match train {
            Some(k) => match self.table.train_id(k) {
                Some(t) => Some(t),
                None => {
                    self.weights.rejected += 1;
                    return Update::Rejected;
                }
            },
            None => None,
        };
        let Some(ids) = self.ids(fns).filter(|v| j < v.len()) else {
            self.weights.rejected += 1;
            return Update::Rejected;
        };
        let (tr, others) = self.fn_terms(t, &ids, j);
        let fi = self.table.fn_model_idx(ids[j]);
        self.weights.observe_fn(fi, tr, &others, real)
    }
}

impl DegradationModel for Predictor {
    fn train_deg(&self, train: &ModelKey, fns: &[&ModelKey]) -> Option<f64> {
        let t = self.table.train_id(train)?;
        let mut sum = 0.0;
        let ti = self.table.train_model_idx(t);
        for k in fns {
            let f = self.table.fn_id(k)?;
            sum += self.weights.gamma(ti, self.table.fn_model_idx(f)) * self.table.pair(t, f).0;
        }
        Some(sum)
    }

    fn fn_deg(&self, train: Option<&ModelKey>, fns: &[&ModelKey], j: usize) -> Option<f64> {
        let fj = self.table.fn_id(fns.get(j)?)?;
        let jm = self.table.fn_model_idx(fj);
        let mut d = 0.0;
        if let Some(k) = train {
            let t = self.table.train_id(k)?;
            d += self.weights.alpha(jm, self.table.train_model_idx(t)) * self.table.pair(t, fj).1;
        }
        for (m, k) in fns.iter().enumerate() {
            if m == j {
                continue;
            }
            let fm = self.table.fn_id(k)?;
            d += self.weights.beta(jm, self.table.fn_model_idx(fm)) * self.table.fn_fn(fj, fm);
        }
        Some(d)
    }
}
