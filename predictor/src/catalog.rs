//! Model catalog: architectural facts per model, solo profiles per (GPU type, role, batch).
//!
//! Owns: the catalog file format (TOML, documented in docs/predictor.md), its validation, and the
//! derivation of the 12 features from the facts. Must never: invent a profile for a configuration
//! the file does not list, or hide whether a profile was measured or estimated.

use crate::features::{Features, ModelKey, Role};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;

/// Catalog format version this build reads.
pub const CATALOG_FORMAT_VERSION: u32 = 1;

/// The catalog checked in under `predictor/data/catalog.toml` (architectural facts computed by
/// `profiling/make_catalog.py`; solo profiles estimated until measured).
pub const BUILTIN_CATALOG: &str = include_str!("../data/catalog.toml");

/// Bytes per fp32 element.
const FP32_BYTES: f64 = 4.0;
/// Training state per parameter in fp32 with Adam: weight, gradient, two moments = 4 × 4 bytes.
const TRAIN_BYTES_PER_PARAM: f64 = 16.0;

/// Whether a number came from a GPU run or from the documented estimate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Provenance {
    /// Measured by `profiling/` on the named GPU type.
    Measured,
    /// Computed from the roofline estimate in `profiling/make_catalog.py`; not a measurement.
    Estimated,
}

/// A GPU type the catalog has profiles for.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuType {
    /// Short name used in profiles and datasets (`rtx3090`, `h100`).
    pub name: String,
    /// Substrings of the NVML device name that identify this type (case-insensitive).
    #[serde(rename = "match")]
    pub matches: Vec<String>,
    /// Device memory, bytes.
    pub memory_bytes: u64,
    /// Peak dense fp32 throughput, TFLOP/s (vendor datasheet).
    pub fp32_tflops: f64,
    /// Peak memory bandwidth, GB/s (vendor datasheet).
    pub mem_bandwidth_gbs: f64,
}

/// Solo behaviour of one (GPU type, role, batch) configuration.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// GPU type ([`GpuType::name`]) the profile is for.
    pub gpu: String,
    /// Training or inference.
    pub role: Role,
    /// Batch size.
    pub batch: u32,
    /// Training: mean iteration time; inference: P99 latency of one request. Milliseconds.
    pub latency_ms: f64,
    /// Solo SM utilization, fraction 0..=1 (NVML utilization.gpu / 100).
    pub sm_util: f64,
    /// Solo memory need including the CUDA context, bytes.
    pub memory_bytes: u64,
    /// Whether the figures were measured or estimated.
    pub source: Provenance,
}

/// One model: architectural facts (per sample, batch-independent) and its profiles.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelEntry {
    /// Model name, the key datasets and tables use.
    pub name: String,
    /// Free-text description (architecture, source).
    #[serde(default)]
    pub description: String,
    /// Forward FLOPs per sample (1 multiply-add = 2 FLOPs).
    pub flops_per_sample: f64,
    /// Trainable parameters (count).
    pub params: f64,
    /// Sum of output elements of every leaf layer in one forward pass, per sample.
    pub activation_elems_per_sample: f64,
    /// Largest single leaf-layer output, elements per sample.
    pub peak_activation_elems_per_sample: f64,
    /// Activation-function layers applied in one forward pass (ReLU, ReLU6, GELU, Sigmoid, Tanh, Softmax).
    pub activation_fns: u32,
    /// Convolution layers.
    pub num_conv: u32,
    /// Linear (fully connected) layers.
    pub num_linear: u32,
    /// Normalisation layers (batch, layer, group norm).
    pub num_norm: u32,
    /// ReLU layers.
    pub num_relu: u32,
    /// Embedding layers.
    pub num_embedding: u32,
    /// Pooling layers.
    pub num_pool: u32,
    /// Dropout layers.
    pub num_dropout: u32,
    /// Solo profiles of the model, one per (GPU type, role, batch).
    #[serde(default, rename = "profile")]
    pub profiles: Vec<Profile>,
}

impl ModelEntry {
    /// Analytic memory of the configuration (the `memory` feature), bytes, fp32:
    /// training = 16·params + 4·batch·activation_elems (Adam state + stored activations);
    /// inference = 4·params + 8·batch·peak_activation_elems (weights + in/out of the largest layer).
    pub fn memory_estimate(&self, role: Role, batch: u32) -> f64 {
        let b = batch as f64;
        match role {
            Role::Training => {
                TRAIN_BYTES_PER_PARAM * self.params
                    + FP32_BYTES * b * self.activation_elems_per_sample
            }
            Role::Inference => {
                FP32_BYTES * self.params
                    + 2.0 * FP32_BYTES * b * self.peak_activation_elems_per_sample
            }
        }
    }

    /// The 12 SMORE features of this model at `batch` in `role` (GPU-independent).
    pub fn features(&self, role: Role, batch: u32) -> Features {
        let b = batch as f64;
        Features([
            self.flops_per_sample * b * role.flops_factor(),
            self.params,
            self.memory_estimate(role, batch),
            self.activation_fns as f64,
            self.num_conv as f64,
            self.num_linear as f64,
            b,
            self.num_norm as f64,
            self.num_relu as f64,
            self.num_embedding as f64,
            self.num_pool as f64,
            self.num_dropout as f64,
        ])
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCatalog {
    format_version: u32,
    #[serde(default)]
    note: String,
    #[serde(default, rename = "gpu")]
    gpus: Vec<GpuType>,
    #[serde(default, rename = "model")]
    models: Vec<ModelEntry>,
}

/// A validated catalog.
#[derive(Debug, Clone)]
pub struct Catalog {
    /// Free-text note of the catalog file (where its numbers come from).
    pub note: String,
    /// GPU types the profiles refer to.
    pub gpus: Vec<GpuType>,
    /// Models and their profiles.
    pub models: Vec<ModelEntry>,
    index: HashMap<String, usize>,
}

impl Catalog {
    /// The checked-in catalog.
    pub fn builtin() -> Result<Catalog> {
        Catalog::parse(
            BUILTIN_CATALOG,
            "builtin catalog (predictor/data/catalog.toml)",
        )
    }

    /// Reads and validates a catalog file.
    pub fn load(path: &Path) -> Result<Catalog> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read catalog {}", path.display()))?;
        Catalog::parse(&text, &path.display().to_string())
    }

    /// `--catalog PATH` if given, else the builtin one.
    pub fn load_or_builtin(path: Option<&Path>) -> Result<Catalog> {
        match path {
            Some(p) => Catalog::load(p),
            None => Catalog::builtin(),
        }
    }

    /// Parses and validates catalog text; `origin` names the file in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Catalog> {
        let raw: RawCatalog =
            toml::from_str(text).with_context(|| format!("{origin}: not a valid catalog"))?;
        if raw.format_version != CATALOG_FORMAT_VERSION {
            bail!(
                "{origin}: format_version = {} but this build reads {CATALOG_FORMAT_VERSION}; \
                 regenerate it with profiling/make_catalog.py",
                raw.format_version
            );
        }
        let mut index = HashMap::new();
        for (i, m) in raw.models.iter().enumerate() {
            if index.insert(m.name.clone(), i).is_some() {
                bail!("{origin}: model `{}` is listed twice", m.name);
            }
            for (key, v) in [
                ("flops_per_sample", m.flops_per_sample),
                ("params", m.params),
                ("activation_elems_per_sample", m.activation_elems_per_sample),
                (
                    "peak_activation_elems_per_sample",
                    m.peak_activation_elems_per_sample,
                ),
            ] {
                if !(v.is_finite() && v > 0.0) {
                    bail!("{origin}: model `{}`: {key} = {v} must be > 0", m.name);
                }
            }
            for p in &m.profiles {
                let at = format!(
                    "{origin}: model `{}` profile (gpu {}, {}, batch {})",
                    m.name, p.gpu, p.role, p.batch
                );
                if !raw.gpus.iter().any(|g| g.name == p.gpu) {
                    bail!("{at}: gpu `{}` is not a [[gpu]] entry", p.gpu);
                }
                if p.batch == 0 || !(p.latency_ms.is_finite() && p.latency_ms > 0.0) {
                    bail!("{at}: batch and latency_ms must be > 0");
                }
                if !(0.0..=1.0).contains(&p.sm_util) {
                    bail!("{at}: sm_util = {} is outside 0..=1", p.sm_util);
                }
            }
        }
        Ok(Catalog {
            note: raw.note,
            gpus: raw.gpus,
            models: raw.models,
            index,
        })
    }

    /// The model entry named `name`, or an error listing the known names.
    pub fn model(&self, name: &str) -> Result<&ModelEntry> {
        match self.index.get(name) {
            Some(&i) => Ok(&self.models[i]),
            None => bail!(
                "model `{name}` is not in the catalog (known: {})",
                self.models
                    .iter()
                    .map(|m| m.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }

    /// Features of `key` in `role`.
    pub fn features(&self, key: &ModelKey, role: Role) -> Result<Features> {
        Ok(self.model(&key.model)?.features(role, key.batch))
    }

    /// The solo profile of `key` in `role` on GPU type `gpu`, if listed.
    pub fn profile(&self, gpu: &str, key: &ModelKey, role: Role) -> Option<&Profile> {
        let m = self.model(&key.model).ok()?;
        m.profiles
            .iter()
            .find(|p| p.gpu == gpu && p.role == role && p.batch == key.batch)
    }

    /// The GPU type whose `match` substrings occur in an NVML device name.
    pub fn gpu_type_for(&self, device_name: &str) -> Option<&GpuType> {
        let d = device_name.to_ascii_lowercase();
        self.gpus.iter().find(|g| {
            g.name.eq_ignore_ascii_case(device_name)
                || g.matches
                    .iter()
                    .any(|s| d.contains(&s.to_ascii_lowercase()))
        })
    }

    /// Every configuration with a profile on `gpu` in `role`, sorted.
    pub fn configs(&self, gpu: &str, role: Role) -> Vec<ModelKey> {
        let mut v: Vec<ModelKey> = self
            .models
            .iter()
            .flat_map(|m| {
                m.profiles
                    .iter()
                    .filter(|p| p.gpu == gpu && p.role == role)
                    .map(|p| ModelKey::new(m.name.clone(), p.batch))
            })
            .collect();
        v.sort();
        v.dedup();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_catalog_parses_and_covers_smore_workloads() {
        let c = Catalog::builtin().unwrap();
        for m in [
            "vgg16",
            "mobilenet_v2",
            "resnet50",
            "vit_b16",
            "bert_base",
            "deepfm",
            "segnet",
        ] {
            let e = c.model(m).unwrap();
            assert!(!e.profiles.is_empty(), "{m} has profiles");
        }
        assert!(c
            .gpu_type_for("NVIDIA H100 80GB HBM3 (smore simulated)")
            .is_some());
        assert!(!c.configs("rtx3090", Role::Training).is_empty());
    }

    #[test]
    fn version_mismatch_is_a_clear_error() {
        let e = Catalog::parse("format_version = 7\n", "x.toml").unwrap_err();
        assert!(format!("{e:#}").contains("format_version = 7"));
    }

    #[test]
    fn unknown_model_names_the_known_ones() {
        let c = Catalog::builtin().unwrap();
        let e = c.model("alexnet").unwrap_err().to_string();
        assert!(e.contains("alexnet") && e.contains("vgg16"));
    }
}
