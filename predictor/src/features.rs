//! The 12 per-model features of SMORE's Table III and the 24-dim pair vector.
//!
//! Owns: the feature order (the model files depend on it) and the role distinction (training vs
//! inference). Must never: reorder [`FEATURE_NAMES`] without bumping the model format version.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Number of features per model (SMORE Table III).
pub const N_FEATURES: usize = 12;
/// Pair vector length: serverful (training) features then serverless (function) features.
pub const PAIR_DIM: usize = 2 * N_FEATURES;

/// Feature names in vector order (SMORE Table III order).
pub const FEATURE_NAMES: [&str; N_FEATURES] = [
    "flops",
    "params",
    "memory",
    "activations",
    "num_conv",
    "num_linear",
    "batch_size",
    "num_norm",
    "num_relu",
    "num_embedding",
    "num_pool",
    "num_dropout",
];

/// Whether a model runs as the protected serverful training job or as a serverless function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Serverful training job: features describe one training iteration.
    Training,
    /// Serverless inference function: features describe one forward pass.
    Inference,
}

impl Role {
    /// FLOPs multiplier per sample relative to one forward pass: a training iteration is forward +
    /// backward ≈ 3× forward (backward computes gradients w.r.t. inputs and weights, each ≈ forward;
    /// standard estimate, Kaplan et al. 2020 "Scaling laws", §2.1).
    pub fn flops_factor(self) -> f64 {
        match self {
            Role::Training => 3.0,
            Role::Inference => 1.0,
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Training => "training",
            Role::Inference => "inference",
        })
    }
}

impl FromStr for Role {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        match s {
            "training" | "train" => Ok(Role::Training),
            "inference" | "function" | "fn" => Ok(Role::Inference),
            _ => anyhow::bail!("role `{s}` is neither `training` nor `inference`"),
        }
    }
}

/// One model configuration's 12 features, in [`FEATURE_NAMES`] order.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Features(pub [f64; N_FEATURES]);

impl Features {
    /// The SMORE pair vector: training-side features then function-side features.
    pub fn pair(train: &Features, func: &Features) -> [f64; PAIR_DIM] {
        let mut v = [0.0; PAIR_DIM];
        v[..N_FEATURES].copy_from_slice(&train.0);
        v[N_FEATURES..].copy_from_slice(&func.0);
        v
    }
}

/// A model at a batch size: the unit the dataset, the table and the scheduler talk about.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ModelKey {
    /// Model name as the catalog spells it.
    pub model: String,
    /// Batch size: samples per training iteration or per inference request.
    pub batch: u32,
}

impl ModelKey {
    /// The configuration `model` at batch size `batch`.
    pub fn new(model: impl Into<String>, batch: u32) -> Self {
        ModelKey {
            model: model.into(),
            batch,
        }
    }
}

impl fmt::Display for ModelKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.model, self.batch)
    }
}

impl FromStr for ModelKey {
    type Err = anyhow::Error;
    /// `MODEL:BATCH`, e.g. `resnet50:32`.
    fn from_str(s: &str) -> anyhow::Result<Self> {
        let (m, b) = s
            .rsplit_once(':')
            .ok_or_else(|| anyhow::anyhow!("`{s}` is not MODEL:BATCH (e.g. `resnet50:32`)"))?;
        let batch: u32 = b
            .parse()
            .map_err(|_| anyhow::anyhow!("batch `{b}` in `{s}` is not a positive integer"))?;
        if m.is_empty() || batch == 0 {
            anyhow::bail!("`{s}` needs a model name and a batch ≥ 1 (e.g. `resnet50:32`)");
        }
        Ok(ModelKey::new(m, batch))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_key_parses_and_rejects() {
        assert_eq!(
            "vgg16:32".parse::<ModelKey>().unwrap(),
            ModelKey::new("vgg16", 32)
        );
        assert!("vgg16".parse::<ModelKey>().is_err());
        assert!("vgg16:0".parse::<ModelKey>().is_err());
        assert!("vgg16:x".parse::<ModelKey>().is_err());
    }

    #[test]
    fn pair_vector_is_train_then_fn() {
        let a = Features([1.0; N_FEATURES]);
        let b = Features([2.0; N_FEATURES]);
        let p = Features::pair(&a, &b);
        assert_eq!(p[0], 1.0);
        assert_eq!(p[N_FEATURES], 2.0);
    }
}
