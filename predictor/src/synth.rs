//! SYNTHETIC co-location data: a seeded, documented interference model over catalog profiles.
//!
//! Owns: the synthetic generator used by tests and the simulated-GPU demo. Every row it writes has
//! `source = synthetic` and `driver = synthetic`. Must never: be presented as a measurement, or
//! read anything but the catalog (no GPU, no I/O beyond what the caller does with the rows).
//!
//! ## Interference model (documented; not fitted to any measurement)
//! For training configuration T and function configuration F on GPU type G, with solo SM
//! utilizations u_T, u_F (catalog profiles) and bandwidth pressures
//! b_X = min(1, memory_X / (latency_X · BW_G)) (the working set streamed once per iteration),
//! and c concurrent requests of F:
//! - u_F,c = 1 − (1 − u_F)^c, b_F,c = min(1, c·b_F) (c independent request streams);
//! - oversubscription o = max(0, u_T + u_F,c − 1);
//! - δ_train = (0.35·u_T·u_F,c + 1.5·o² + 0.8·b_T·b_F,c) · ε₁;
//! - δ_fn    = (0.8·u_T + 2.0·o² + 1.0·b_T·b_F,c + 0.3·(c − 1)·u_F) · ε₂;
//!
//! where ε₁, ε₂ = exp(N(0, σ²)) are independent multiplicative noises (σ = `noise`, default 0.15).
//! The shape follows SMORE §II: low-utilization trainers (DeepFM) barely slow down, high ones
//! (BERT/RoBERTa) do, and functions suffer more than training; δ can exceed 1 (100 %).

use crate::catalog::{Catalog, GpuType, ModelEntry, Profile};
use crate::dataset::{Dataset, Row, Source};
use crate::features::{ModelKey, Role};
use anyhow::{bail, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Parameters of a synthetic run.
#[derive(Debug, Clone)]
pub struct SynthParams {
    /// GPU type (catalog `[[gpu]] name`) whose profiles are used.
    pub gpu: String,
    /// Seed of the generator: the same seed gives the same rows.
    pub seed: u64,
    /// σ of the multiplicative log-normal noise.
    pub noise: f64,
    /// Also emit rows with concurrency 2..=max_concurrency for every pair (1 = pair-wise only).
    pub max_concurrency: u32,
    /// Date written into every row (YYYY-MM-DD).
    pub date: String,
}

impl Default for SynthParams {
    fn default() -> Self {
        SynthParams {
            gpu: "rtx3090".into(),
            seed: 42,
            noise: 0.15,
            max_concurrency: 1,
            date: today(),
        }
    }
}

/// One configuration's view for the interference model.
#[derive(Debug, Clone, Copy)]
pub struct Pressure {
    /// Solo SM utilization, 0..=1.
    pub sm: f64,
    /// Memory-bandwidth pressure, 0..=1.
    pub bw: f64,
}

/// Pressure of a profiled configuration on `gpu`.
pub fn pressure(gpu: &GpuType, model: &ModelEntry, p: &Profile) -> Pressure {
    let bytes = model.memory_estimate(p.role, p.batch);
    let bw = bytes / (p.latency_ms / 1e3 * gpu.mem_bandwidth_gbs * 1e9);
    Pressure {
        sm: p.sm_util,
        bw: bw.clamp(0.0, 1.0),
    }
}

/// The noiseless model: (δ_train, δ_fn) for training pressure `t`, function pressure `f`, and `c`
/// concurrent function requests.
pub fn interference(t: Pressure, f: Pressure, c: u32) -> (f64, f64) {
    let c = c.max(1);
    let u_fc = 1.0 - (1.0 - f.sm).powi(c as i32);
    let b_fc = (c as f64 * f.bw).min(1.0);
    let o = (t.sm + u_fc - 1.0).max(0.0);
    let d_train = 0.35 * t.sm * u_fc + 1.5 * o * o + 0.8 * t.bw * b_fc;
    let d_fn = 0.8 * t.sm + 2.0 * o * o + 1.0 * t.bw * b_fc + 0.3 * (c - 1) as f64 * f.sm;
    (d_train, d_fn)
}

fn normal(rng: &mut StdRng) -> f64 {
    // Box–Muller transform.
    let u1: f64 = rng.gen_range(f64::EPSILON..1.0);
    let u2: f64 = rng.gen();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

/// Generates the synthetic dataset: every profiled training × inference configuration on
/// `params.gpu`, for each concurrency 1..=max_concurrency.
pub fn generate(cat: &Catalog, params: &SynthParams) -> Result<Dataset> {
    let Some(gpu) = cat.gpus.iter().find(|g| g.name == params.gpu) else {
        bail!(
            "GPU type `{}` is not in the catalog (known: {})",
            params.gpu,
            cat.gpus
                .iter()
                .map(|g| g.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    };
    if !(params.noise.is_finite() && params.noise >= 0.0) {
        bail!("noise = {} must be ≥ 0", params.noise);
    }
    let trains = cat.configs(&gpu.name, Role::Training);
    let fns = cat.configs(&gpu.name, Role::Inference);
    if trains.is_empty() || fns.is_empty() {
        bail!(
            "the catalog has no training or no inference profiles on `{}`",
            gpu.name
        );
    }
    let press = |k: &ModelKey, role| -> Result<Pressure> {
        let m = cat.model(&k.model)?;
        let p = cat
            .profile(&gpu.name, k, role)
            .expect("configs() lists only profiled keys");
        Ok(pressure(gpu, m, p))
    };
    let mut rng = StdRng::seed_from_u64(params.seed);
    let mut rows = Vec::new();
    for t in &trains {
        let pt = press(t, Role::Training)?;
        for f in &fns {
            let pf = press(f, Role::Inference)?;
            for c in 1..=params.max_concurrency.max(1) {
                let (dt, df) = interference(pt, pf, c);
                let e1 = (params.noise * normal(&mut rng)).exp();
                let e2 = (params.noise * normal(&mut rng)).exp();
                rows.push(Row {
                    train_model: t.model.clone(),
                    train_batch: t.batch,
                    fn_model: f.model.clone(),
                    fn_batch: f.batch,
                    concurrency: c,
                    deg_train: round6(dt * e1),
                    deg_fn: round6(df * e2),
                    device: gpu.name.clone(),
                    driver: "synthetic".into(),
                    date: params.date.clone(),
                    source: Source::Synthetic,
                });
            }
        }
    }
    Ok(Dataset { rows })
}

fn round6(x: f64) -> f64 {
    (x * 1e6).round() / 1e6
}

/// Today's UTC date as YYYY-MM-DD (civil-from-days, H. Hinnant's algorithm).
pub fn today() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let z = (secs / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interference_grows_with_pressure_and_concurrency() {
        let lo = Pressure { sm: 0.2, bw: 0.1 };
        let hi = Pressure { sm: 0.9, bw: 0.5 };
        let (a, b) = interference(lo, lo, 1);
        let (c, d) = interference(hi, hi, 1);
        assert!(c > a && d > b);
        let (e, f) = interference(hi, lo, 3);
        let (g, h) = interference(hi, lo, 1);
        assert!(e > g && f > h);
    }

    #[test]
    fn synthetic_rows_are_labelled_and_seeded() {
        let cat = Catalog::builtin().unwrap();
        let p = SynthParams {
            date: "2026-01-01".into(),
            ..SynthParams::default()
        };
        let a = generate(&cat, &p).unwrap();
        let b = generate(&cat, &p).unwrap();
        assert_eq!(a.rows, b.rows);
        assert!(a.rows.iter().all(|r| r.source == Source::Synthetic));
        assert!(a.rows.len() > 500);
    }

    #[test]
    fn today_is_a_date() {
        let t = today();
        assert_eq!(t.len(), 10);
        assert_eq!(&t[4..5], "-");
    }
}
