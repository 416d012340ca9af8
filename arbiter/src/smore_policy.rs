//! SMORE's degradation-aware policy behind the policy seam (`[policy] name = "smore"`).
//!
//! Owns: mapping the arbiter's NVML-only view of a node onto the predictor's world (model keys,
//! catalog profiles, GPU types), and the four decisions of the seam: placement (SMORE
//! Algorithm 1: power of d, σ memory rule, θ_train, SLO, argmin λ·D̂_train + (1−λ)·D̂_fn),
//! SM-share sizing (largest share keeping D̂_train ≤ θ_train and the SLO met), request-level
//! admission, and online learning from observed degradation (SGD on the multi-way weights plus a
//! per-GPU correction factor). The decision arithmetic itself lives in `smore_predictor::sched`.
//!
//! The arbiter knows a training process only through NVML (pid, memory, solo utilization), never
//! its model. The training side's model key is therefore a **proxy**: the catalog training
//! configuration on the GPU's type whose solo SM utilization is nearest to the measured solo
//! utilization (ties: nearest memory). An unknown utilization is taken as the most demanding
//! profile (the safe side). docs/predictor.md documents this.
//!
//! Must never: hand out memory beyond σ·capacity − training − other grants (checked here before
//! any prediction), present synthetic predictions as measured (a synthetic model is logged as
//! such at startup and named in every decision's rule), or do I/O on the decision path other
//! than the periodic weights save in `observe`.

use crate::config::Config;
use crate::policy::{Admission, Ask, Decision, GpuView, Policy};
use anyhow::{bail, Context, Result};
use rand::rngs::StdRng;
use rand::SeedableRng;
use smore_predictor::catalog::{Catalog, GpuType};
use smore_predictor::multiway::{MultiWay, SgdConfig};
use smore_predictor::pairwise::{ForestParams, PairModel};
use smore_predictor::sched::{
    self, CandidateEval, Correction, GpuSnapshot, PendingItem, Resident, SchedConfig, ShareInput,
    Verdict,
};
use smore_predictor::synth::{generate, SynthParams};
use smore_predictor::table::PairTable;
use smore_predictor::{DegradationModel, ModelKey, Predictor, Role};
use smore_protocol::size::format_size;
use smore_protocol::wire::RefuseCode;
use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Seed of the power-of-d sampler (fixed: decisions are reproducible for a given history).
const SAMPLER_SEED: u64 = 0x5eed;
/// Trees per forest when the model is trained on synthetic data at startup: startup takes 0.52 s
/// in a release build on 2 cores (measured, docs/predictor.md), under the 2 s startup budget.
/// Its accuracy against 100 trees was not measured (synthetic predictions are for tests/demos).
const SYNTH_TREES: usize = 24;
/// Window over which registrations count as "queued together" for SMORE's fast (first-fit)
/// mode: the arbiter places registrations one at a time, so the queue length is approximated by
/// the registrations of the last second. Reasoning, not measured.
const QUEUE_WINDOW: Duration = Duration::from_secs(1);
/// Instances whose admission instants are kept before the map is swept: 256. Reasoning: more
/// than a node's instances with requests in flight at once; a sweep costs one pass over the map.
const ADMISSIONS_KEPT: usize = 256;
/// How long an instance's last admission is remembered by a sweep: 60 s. Reasoning: the
/// in-flight window is twice a request's solo latency (milliseconds); a minute is far past any.
const ADMISSION_MEMORY: Duration = Duration::from_secs(60);
/// Weights are saved after this many applied observations (and never more often).
const SAVE_EVERY: u64 = 32;
/// Multi-way weights are kept under `[arbiter] state_dir` as `smore-weights-<GPU type>.json`.
pub fn weights_file(gpu_type: &str) -> String {
    format!("smore-weights-{gpu_type}.json")
}

/// A GPU prepared for [`SmorePolicy::evaluate`] ([`SmorePolicy::prepare_gpu`]).
#[derive(Debug, Clone)]
pub struct PreparedGpu {
    /// NVML index of the GPU.
    pub index: u32,
    total: u64,
    /// σ·capacity − training − grants, bytes.
    pub free: u64,
    ty: usize,
    snap: GpuSnapshot,
}

/// An ask prepared for [`SmorePolicy::evaluate`] ([`SmorePolicy::prepare_ask`]).
#[derive(Debug, Clone)]
pub struct PreparedAsk {
    memory: u64,
    /// Per GPU type: the pending item, or why the function has no profile there.
    items: Vec<Result<PendingItem, String>>,
}

/// Predictor for one GPU type.
struct TypePredictor {
    gpu: GpuType,
    predictor: Predictor,
}

/// SMORE's policy.
pub struct SmorePolicy {
    catalog: Catalog,
    types: Vec<TypePredictor>,
    sched: SchedConfig,
    rng: StdRng,
    corrections: HashMap<u32, Correction>,
    /// What the predictions come from (named in every decision).
    source: String,
    /// Directory of the weights files (`[arbiter] state_dir`); None = not persisted.
    weights_dir: Option<PathBuf>,
    /// Applied observations not yet saved, per type.
    unsaved: Vec<u64>,
    recent_registrations: VecDeque<Instant>,
    /// Per instance: admission instants (in-flight estimate for request-level admission).
    admissions: HashMap<u64, VecDeque<Instant>>,
}

/// Builds the SMORE policy from `[policy] catalog` and `model` (see docs/predictor.md).
pub fn from_config(cfg: &Config) -> Result<Box<dyn Policy>> {
    Ok(Box::new(SmorePolicy::from_config(cfg)?))
}

fn sched_config(cfg: &Config) -> SchedConfig {
    SchedConfig {
        d: cfg.power_of_d.max(1) as usize,
        sigma: cfg.memory_safety,
        theta_train: cfg.theta_train,
        lambda: cfg.lambda,
        first_fit_queue: cfg.first_fit_queue as usize,
        ..SchedConfig::default()
    }
}

/// Builds a table per GPU type of the catalog that has both training and inference profiles.
fn tables_for_model(cat: &Catalog, model: &PairModel) -> Result<Vec<PairTable>> {
    let mut out = Vec::new();
    for g in &cat.gpus {
        if cat.configs(&g.name, Role::Training).is_empty()
            || cat.configs(&g.name, Role::Inference).is_empty()
        {
            continue;
        }
        out.push(PairTable::build(cat, model, &g.name)?);
    }
    if out.is_empty() {
        bail!("the catalog has no GPU type with both training and inference profiles");
    }
    Ok(out)
}

/// Trains a pair model on the synthetic dataset of every GPU type (startup fallback).
fn synthetic_tables(cat: &Catalog) -> Result<Vec<PairTable>> {
    let mut out = Vec::new();
    for g in &cat.gpus {
        if cat.configs(&g.name, Role::Training).is_empty()
            || cat.configs(&g.name, Role::Inference).is_empty()
        {
            continue;
        }
        let ds = generate(
            cat,
            &SynthParams {
                gpu: g.name.clone(),
                date: "synthetic".into(),
                ..SynthParams::default()
            },
        )?;
        let params = ForestParams {
            n_trees: SYNTH_TREES,
            ..ForestParams::default()
        };
        let m = PairModel::train(cat, &ds, &params, 1.0, 1)?;
        out.push(PairTable::build(cat, &m, &g.name)?);
    }
    if out.is_empty() {
        bail!("the catalog has no GPU type with both training and inference profiles");
    }
    Ok(out)
}

/// A `[policy] model` file: a lookup table (`smore predictor table`) or a trained model
/// (`smore predictor train`, tables are then built for every GPU type of the catalog).
fn load_model_file(cat: &Catalog, path: &Path) -> Result<Vec<PairTable>> {
    let text = std::fs::read_to_string(path).with_context(|| {
        format!(
            "[policy] model = {:?}: cannot read the file (a table from `smore predictor table` \
             or a model from `smore predictor train`)",
            path.display()
        )
    })?;
    let v: serde_json::Value = serde_json::from_str(&text).with_context(|| {
        format!(
            "[policy] model = {:?}: not JSON (expected a predictor table or model file)",
            path.display()
        )
    })?;
    if v.get("d_train").is_some() {
        let t = PairTable::load(path).context("[policy] model")?;
        Ok(vec![t])
    } else {
        let m =
            PairModel::from_json(&text, &path.display().to_string()).context("[policy] model")?;
        tables_for_model(cat, &m)
    }
}

impl SmorePolicy {
    /// Loads catalog, tables and weights as the config says.
    pub fn from_config(cfg: &Config) -> Result<SmorePolicy> {
        let catalog = Catalog::load_or_builtin(cfg.catalog.as_deref())
            .context("[policy] catalog (leave it unset for the built-in catalog)")?;
        let (tables, source) = match &cfg.model {
            Some(p) => (
                load_model_file(&catalog, p)?,
                format!("predictor {}", p.display()),
            ),
            None => {
                let t0 = Instant::now();
                let t = synthetic_tables(&catalog).context(
                    "[policy] model is unset and training on synthetic data failed; set \
                     `model` to a table from `smore predictor table`",
                )?;
                tracing::warn!(
                    "[policy] model is unset: predictions come from a model trained on SYNTHETIC \
                     data at startup ({:.2?}); they are not measurements. Set [policy] model to a \
                     table trained on profiling/ data for a real node.",
                    t0.elapsed()
                );
                (t, "SYNTHETIC predictor (no [policy] model)".to_string())
            }
        };
        let mut types = Vec::new();
        for table in tables {
            let gpu = catalog
                .gpus
                .iter()
                .find(|g| g.name == table.gpu)
                .cloned()
                .with_context(|| {
                    format!(
                        "[policy] model: the table is for GPU type `{}`, which the catalog does not list",
                        table.gpu
                    )
                })?;
            types.push(TypePredictor {
                gpu,
                predictor: Predictor::new(table, SgdConfig::default()),
            });
        }
        let mut p = SmorePolicy {
            unsaved: vec![0; types.len()],
            catalog,
            types,
            sched: sched_config(cfg),
            rng: StdRng::seed_from_u64(SAMPLER_SEED),
            corrections: HashMap::new(),
            source,
            weights_dir: Some(cfg.state_dir.clone()),
            recent_registrations: VecDeque::new(),
            admissions: HashMap::new(),
        };
        p.sched.validate().context("[policy]")?;
        for t in &mut p.types {
            let wp = cfg.state_dir.join(weights_file(&t.gpu.name));
            if !wp.exists() {
                continue;
            }
            match MultiWay::load(&wp, &t.predictor.table.models) {
                Ok(w) => {
                    tracing::info!(
                        "multi-way weights reloaded from {} ({} updates)",
                        wp.display(),
                        w.updates
                    );
                    t.predictor.weights = w;
                }
                Err(e) => tracing::warn!(
                    "ignoring {}: {e:#}; starting from weights = 1",
                    wp.display()
                ),
            }
        }
        tracing::info!(
            "smore policy: {}; GPU types {}; d = {}, θ_train = {}, λ = {}, σ = {}",
            p.source,
            p.types
                .iter()
                .map(|t| t.gpu.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            p.sched.d,
            p.sched.theta_train,
            p.sched.lambda,
            p.sched.sigma
        );
        Ok(p)
    }

    /// A policy over explicit tables (tests, `smore eval`).
    pub fn with_tables(
        catalog: Catalog,
        tables: Vec<PairTable>,
        sched: SchedConfig,
        source: &str,
    ) -> Result<SmorePolicy> {
        sched.validate()?;
        let mut types = Vec::new();
        for table in tables {
            let gpu = catalog
                .gpus
                .iter()
                .find(|g| g.name == table.gpu)
                .cloned()
                .with_context(|| format!("GPU type `{}` is not in the catalog", table.gpu))?;
            types.push(TypePredictor {
                gpu,
                predictor: Predictor::new(table, SgdConfig::default()),
            });
        }
        Ok(SmorePolicy {
            unsaved: vec![0; types.len()],
            catalog,
            types,
            sched,
            rng: StdRng::seed_from_u64(SAMPLER_SEED),
            corrections: HashMap::new(),
            source: source.into(),
            weights_dir: None,
            recent_registrations: VecDeque::new(),
            admissions: HashMap::new(),
        })
    }

    /// The GPU type of a view: the only one, or the catalog type with the nearest memory size
    /// (GpuView carries no device name).
    fn type_of(&self, g: &GpuView) -> usize {
        if self.types.len() == 1 {
            return 0;
        }
        let total = g.total.max(1) as f64;
        (0..self.types.len())
            .min_by(|&a, &b| {
                let da = (self.types[a].gpu.memory_bytes.max(1) as f64 / total)
                    .ln()
                    .abs();
                let db = (self.types[b].gpu.memory_bytes.max(1) as f64 / total)
                    .ln()
                    .abs();
                da.total_cmp(&db)
            })
            .unwrap_or(0)
    }

    /// Proxy model key of a GPU's training job (see the module docs).
    fn training_key(&self, ti: usize, g: &GpuView) -> Option<ModelKey> {
        if !g.has_training {
            return None;
        }
        let t = &self.types[ti];
        let u = g.training_solo_util;
        let mem = g.training_used.max(1) as f64;
        t.predictor
            .table
            .trains
            .iter()
            .filter_map(|k| {
                let p = self.catalog.profile(&t.gpu.name, k, Role::Training)?;
                let du = match u {
                    Some(u) => (p.sm_util - u).abs(),
                    None => 1.0 - p.sm_util,
                };
                let dm = (p.memory_bytes.max(1) as f64 / mem).ln().abs();
                Some((k, du, dm))
            })
            .min_by(|a, b| a.1.total_cmp(&b.1).then(a.2.total_cmp(&b.2)))
            .map(|(k, _, _)| k.clone())
    }

    /// `MODEL:BATCH` or `MODEL` (smallest profiled inference batch) on GPU type `ti`, with its
    /// solo profile (latency ms, SM utilization).
    fn function_key(&self, ti: usize, model: &str) -> Result<(ModelKey, f64, f64), String> {
        let t = &self.types[ti];
        let key = match model.parse::<ModelKey>() {
            Ok(k) => k,
            Err(_) => {
                let mut batches: Vec<&ModelKey> = t
                    .predictor
                    .table
                    .fns
                    .iter()
                    .filter(|k| k.model == model)
                    .collect();
                batches.sort();
                match batches.first() {
                    Some(k) => (*k).clone(),
                    None => {
                        return Err(format!(
                            "model `{model}` has no inference profile on GPU type `{}` in the \
                             catalog (known: {}); register with model = MODEL:BATCH, e.g. \
                             resnet50:8",
                            t.gpu.name,
                            known_models(&t.predictor.table.fns)
                        ))
                    }
                }
            }
        };
        if t.predictor.table.fn_id(&key).is_none() {
            return Err(format!(
                "`{key}` is not an inference configuration of the predictor on GPU type `{}` \
                 (known: {})",
                t.gpu.name,
                known_models(&t.predictor.table.fns)
            ));
        }
        let p = self
            .catalog
            .profile(&t.gpu.name, &key, Role::Inference)
            .ok_or_else(|| format!("`{key}` has no profile on `{}`", t.gpu.name))?;
        Ok((key, p.latency_ms, p.sm_util))
    }

    fn snapshot(&self, ti: usize, g: &GpuView) -> GpuSnapshot {
        let granted: u64 = g.grants.iter().map(|x| x.cap).sum();
        GpuSnapshot {
            index: g.index,
            capacity: g.total,
            used: g.training_used.saturating_add(granted),
            training: self.training_key(ti, g),
            functions: g
                .grants
                .iter()
                .filter_map(|x| {
                    let (key, lat, u) = self.function_key(ti, &x.model).ok()?;
                    Some(Resident {
                        id: x.instance,
                        key,
                        slo_ms: x.slo_ms,
                        solo_latency_ms: lat,
                        sm_util: u,
                    })
                })
                .collect(),
            train_correction: self.corrections.get(&g.index).map_or(1.0, |c| c.factor),
        }
    }

    fn fast_mode(&mut self, now: Instant) -> bool {
        self.recent_registrations.push_back(now);
        while self
            .recent_registrations
            .front()
            .is_some_and(|t| now.duration_since(*t) > QUEUE_WINDOW)
        {
            self.recent_registrations.pop_front();
        }
        self.recent_registrations.len() > self.sched.first_fit_queue
    }

    fn maybe_save(&mut self, ti: usize) {
        if self.unsaved[ti] < SAVE_EVERY {
            return;
        }
        self.unsaved[ti] = 0;
        if let Some(dir) = &self.weights_dir {
            let _ = std::fs::create_dir_all(dir);
            let p = dir.join(weights_file(&self.types[ti].gpu.name));
            if let Err(e) = self.types[ti].predictor.weights.save(&p) {
                tracing::warn!("cannot save multi-way weights to {}: {e:#}", p.display());
            }
        }
    }

    /// Current correction factor of a GPU (1 = none).
    pub fn correction(&self, gpu: u32) -> f64 {
        self.corrections.get(&gpu).map_or(1.0, |c| c.factor)
    }

    /// The scheduler settings decisions use (θ_train, λ, σ, d, …).
    pub fn sched_config(&self) -> &SchedConfig {
        &self.sched
    }

    /// What the predictions come from (named in every decision, e.g. "SYNTHETIC …").
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Maps a GPU onto the predictor's world once: its catalog type, its snapshot (training
    /// proxy key, residents, correction) and the memory a new grant may take. A caller deciding
    /// many asks over the same GPUs (the scheduler extender) prepares each GPU once per status
    /// refresh instead of once per decision.
    pub fn prepare_gpu(&self, g: &GpuView) -> PreparedGpu {
        let ty = self.type_of(g);
        PreparedGpu {
            index: g.index,
            total: g.total,
            free: g.free_for_functions(self.sched.sigma),
            snap: self.snapshot(ty, g),
            ty,
        }
    }

    /// Maps an ask onto every GPU type once (its model key and solo profile per type).
    pub fn prepare_ask(&self, ask: &Ask) -> PreparedAsk {
        PreparedAsk {
            memory: ask.memory,
            items: (0..self.types.len())
                .map(|ti| {
                    let (key, lat, util) = self.function_key(ti, &ask.model)?;
                    Ok(PendingItem {
                        id: 0,
                        key,
                        slo_ms: ask.slo_ms,
                        solo_latency_ms: lat,
                        sm_util: util,
                        memory: ask.memory,
                        expected_util_gain: util,
                        expected_degradation: 0.0,
                    })
                })
                .collect(),
        }
    }

    /// THE per-candidate step of this policy's Algorithm 1 (lines 5–9 plus share sizing): the
    /// σ rule on the arbiter's accounting, then `sched::evaluate_candidate` and
    /// `sched::refine_with_share`. `Err` = the function has no profile on this GPU's type (the
    /// message says what to register with). Used by [`Policy::place`] and by the scheduler
    /// extender, so a node passes the extender's filter exactly when its arbiter would admit.
    pub fn evaluate(&self, g: &PreparedGpu, ask: &PreparedAsk) -> Result<CandidateEval, String> {
        let item = match ask.items.get(g.ty) {
            Some(Ok(item)) => item,
            Some(Err(e)) => return Err(e.clone()),
            None => return Err(format!("GPU {} has no predictor type", g.index)),
        };
        let snap = &g.snap;
        // The σ rule on the arbiter's own accounting (same as GpuView::free_for_functions).
        if ask.memory > g.free {
            return Ok(CandidateEval {
                gpu: g.index,
                verdict: Verdict::Memory {
                    used: snap.used,
                    need: ask.memory,
                    limit: (g.total as f64 * self.sched.sigma) as u64,
                },
                d_train: None,
                d_fn: None,
                score: None,
            });
        }
        let model = &self.types[g.ty].predictor;
        let e = sched::evaluate_candidate(&self.sched, snap, item, model);
        Ok(sched::refine_with_share(&self.sched, snap, item, e, model))
    }

    /// [`Policy::place`] with the clock given: `now` dates this registration for the fast-mode
    /// window (registrations of the last [`QUEUE_WINDOW`] count as queued together). The
    /// arbiter passes the wall clock; the cluster evaluation (eval/src/cluster.rs) passes
    /// simulated time, so its decisions depend on the seed alone.
    pub fn place_at(&mut self, gpus: &[GpuView], ask: &Ask, now: Instant) -> Decision {
        if let Some(refusal) = crate::policy::refuse_impossible(gpus, ask) {
            return refusal;
        }
        let fast = self.fast_mode(now);
        // Candidate order: the preferred GPU first (re-registration), then d sampled GPUs
        // (power of d), then — a registration is answered now, not requeued — every other GPU.
        let prefer = ask
            .prefer_gpu
            .and_then(|p| gpus.iter().position(|g| g.index == p));
        let cands = sched::Candidates::preferred_sampled(
            &mut self.rng,
            gpus.len(),
            self.sched.d,
            prefer,
            true,
        );
        let prepared = self.prepare_ask(ask);
        let mut fn_error = None;
        // Algorithm 1 itself is `sched::choose`; `evaluate` only maps a GPU onto the
        // predictor's world and plugs the share-sizing step in (the scheduler extender calls
        // the same `prepare_gpu` + `evaluate`, docs/kubernetes.md).
        let choice = sched::choose(&cands, fast, |gi| {
            match self.evaluate(&self.prepare_gpu(&gpus[gi]), &prepared) {
                Ok(e) => Some(e),
                Err(e) => {
                    fn_error = Some(e);
                    None
                }
            }
        });
        let rule = choice.rule();
        let evals = choice.evals;
        if evals.is_empty() {
            return Decision::Refuse {
                code: RefuseCode::Invalid,
                reason: fn_error.unwrap_or_else(|| "no GPU could be evaluated".into()),
            };
        }
        match choice.chosen {
            Some((gi, ei)) => {
                let e = &evals[ei];
                let others: Vec<String> = evals
                    .iter()
                    .filter(|c| c.gpu != gpus[gi].index)
                    .map(verdict_line)
                    .collect();
                Decision::Admit {
                    gpu: gpus[gi].index,
                    cap: ask.memory,
                    predicted_train: e.d_train,
                    predicted_fn: e.d_fn,
                    rule: format!(
                        "smore {:?}: GPU {} D̂_train {} ≤ θ_train {}, D̂_fn {} (SLO {} ms), \
                         {} ≤ free {}; {} candidate(s){}{}; {}",
                        rule,
                        gpus[gi].index,
                        opt3(e.d_train),
                        self.sched.theta_train,
                        opt3(e.d_fn),
                        ask.slo_ms,
                        format_size(ask.memory),
                        format_size(gpus[gi].free_for_functions(self.sched.sigma)),
                        evals.len(),
                        if others.is_empty() { "" } else { "; " },
                        others.join("; "),
                        self.source
                    ),
                }
            }
            None => {
                let code = refuse_code(&evals);
                let lines: Vec<String> = evals.iter().map(verdict_line).collect();
                Decision::Refuse {
                    code,
                    reason: format!(
                        "smore: no GPU admits {} ({}, SLO {} ms): {}; {}",
                        ask.function,
                        ask.model,
                        ask.slo_ms,
                        lines.join("; "),
                        self.source
                    ),
                }
            }
        }
    }
}

fn known_models(fns: &[ModelKey]) -> String {
    let mut m: Vec<&str> = fns.iter().map(|k| k.model.as_str()).collect();
    m.dedup();
    m.join(", ")
}

fn opt3(v: Option<f64>) -> String {
    v.map(|x| format!("{x:.3}"))
        .unwrap_or_else(|| "-".to_string())
}

fn verdict_line(c: &CandidateEval) -> String {
    format!(
        "GPU {}: {} (D̂_train {}, D̂_fn {})",
        c.gpu,
        c.verdict,
        opt3(c.d_train),
        opt3(c.d_fn)
    )
}

/// The refusal code of a set of refused candidates: all memory ⇒ NoMemory; any θ_train ⇒
/// TrainingBound; any SLO ⇒ Slo; only unpredictable ⇒ Invalid. The scheduler extender classes a
/// node it filters out with the same rule.
pub fn refuse_code(evals: &[CandidateEval]) -> RefuseCode {
    let any = |f: fn(&Verdict) -> bool| evals.iter().any(|c| f(&c.verdict));
    if evals
        .iter()
        .all(|c| matches!(c.verdict, Verdict::Memory { .. }))
    {
        RefuseCode::NoMemory
    } else if any(|v| matches!(v, Verdict::ThetaTrain { .. })) {
        RefuseCode::TrainingBound
    } else if any(|v| matches!(v, Verdict::Slo { .. } | Verdict::ResidentSlo { .. })) {
        RefuseCode::Slo
    } else {
        RefuseCode::Invalid
    }
}

impl Policy for SmorePolicy {
    fn name(&self) -> &'static str {
        "smore"
    }

    fn place(&mut self, _cfg: &Config, gpus: &[GpuView], ask: &Ask) -> Decision {
        self.place_at(gpus, ask, Instant::now())
    }

    fn shares(&mut self, cfg: &Config, g: &GpuView) -> Vec<(u64, u32)> {
        let ti = self.type_of(g);
        let snap = self.snapshot(ti, g);
        let Some(train) = snap.training.clone() else {
            return g
                .grants
                .iter()
                .map(|x| (x.instance, x.share_override.unwrap_or(100)))
                .collect();
        };
        let model = &self.types[ti].predictor;
        let keys: Vec<&ModelKey> = snap.functions.iter().map(|r| &r.key).collect();
        let input = |r: &Resident, j: usize, theta: f64| ShareInput {
            d_train_full: model.train_deg(&train, &[&r.key]).unwrap_or(f64::INFINITY),
            theta,
            correction: snap.train_correction,
            d_fn: model
                .fn_deg(Some(&train), &keys, j)
                .unwrap_or(f64::INFINITY),
            sm_util: r.sm_util,
            solo_latency_ms: r.solo_latency_ms,
            slo_ms: r.slo_ms,
        };
        // Overrides are fixed; what they take of θ_train is what the others cannot.
        let mut theta = self.sched.theta_train;
        let mut free = 0usize;
        for x in &g.grants {
            match (
                x.share_override,
                snap.functions.iter().position(|r| r.id == x.instance),
            ) {
                (Some(s), Some(j)) => {
                    let inp = input(&snap.functions[j], j, theta);
                    theta -= sched::train_deg_at_share(&inp, s);
                }
                (None, _) => free += 1,
                _ => {}
            }
        }
        let per = theta.max(0.0) / free.max(1) as f64;
        // Belt and braces: the predictor sizes a share from the function's *declared* model, but
        // the shim cannot check what the process really runs. Each share is therefore also capped
        // by the model-free time budget of the fit policy (D ≤ u·S/(1−S) whatever the function
        // does), so a mis-declared or greedy function still cannot push training past θ_train.
        // Measured on the simulated GPU: without the cap, a greedy process declared as
        // mobilenet_v2:1 got 100 % and slowed the trainer by 31 % (test `colocation_loop`).
        let bound: std::collections::HashMap<u64, u32> = crate::policy::FitPolicy
            .shares(cfg, g)
            .into_iter()
            .collect();
        g.grants
            .iter()
            .map(|x| {
                if let Some(s) = x.share_override {
                    return (x.instance, s);
                }
                let share = snap
                    .functions
                    .iter()
                    .position(|r| r.id == x.instance)
                    .and_then(|j| {
                        sched::size_share(
                            &self.sched.share_grid,
                            &input(&snap.functions[j], j, per),
                        )
                        .share
                    })
                    .unwrap_or(cfg.min_share);
                let cap = bound.get(&x.instance).copied().unwrap_or(100);
                (x.instance, share.min(cap).clamp(cfg.min_share, 100))
            })
            .collect()
    }

    fn admit_request(&mut self, _cfg: &Config, g: &GpuView, instance: u64) -> Admission {
        let ti = self.type_of(g);
        let snap = self.snapshot(ti, g);
        let Some(r) = snap.functions.iter().find(|r| r.id == instance).cloned() else {
            return Admission {
                admitted: false,
                predicted_train: None,
                predicted_fn: None,
                reason: format!(
                    "instance {instance} has no model the predictor knows on GPU {}",
                    g.index
                ),
            };
        };
        // In-flight estimate: admissions of this instance within its solo latency × 2 (the
        // protocol does not report request ends to the policy).
        let now = Instant::now();
        let window = Duration::from_secs_f64((r.solo_latency_ms * 2.0 / 1e3).max(1e-3));
        let q = self.admissions.entry(instance).or_default();
        while q.front().is_some_and(|t| now.duration_since(*t) > window) {
            q.pop_front();
        }
        let in_flight = q.len() as u32;
        let exp = sched::admit_request(
            &self.sched,
            &snap,
            instance,
            in_flight,
            &self.types[ti].predictor,
        );
        let admitted = exp.admitted();
        if admitted {
            self.admissions.entry(instance).or_default().push_back(now);
        } else if self
            .admissions
            .get(&instance)
            .is_some_and(VecDeque::is_empty)
        {
            self.admissions.remove(&instance);
        }
        // Released instances are never named again: forget every instance with nothing in
        // flight once the map outgrows the GPUs' grants, so it stays as large as the instances
        // with requests in flight (found by review, 2026-11-28: it only grew).
        if self.admissions.len() > ADMISSIONS_KEPT {
            self.admissions.retain(|_, q| {
                q.back()
                    .is_some_and(|t| now.duration_since(*t) < ADMISSION_MEMORY)
            });
        }
        let c = exp.candidates.first();
        Admission {
            admitted,
            predicted_train: exp.predicted_train.or(c.and_then(|c| c.d_train)),
            predicted_fn: exp.predicted_fn.or(c.and_then(|c| c.d_fn)),
            reason: format!(
                "smore: {} with {in_flight} request(s) in flight: {}; {}",
                if admitted { "admitted" } else { "deferred" },
                c.map(|c| c.verdict.to_string()).unwrap_or_default(),
                self.source
            ),
        }
    }

    fn observe(&mut self, g: &GpuView, train_slowdown: Option<f64>, fn_latency: &[(u64, f64)]) {
        let ti = self.type_of(g);
        let snap = self.snapshot(ti, g);
        let keys: Vec<&ModelKey> = snap.functions.iter().map(|r| &r.key).collect();
        let mut applied = 0;
        if let (Some(obs), Some(t)) = (train_slowdown, snap.training.as_ref()) {
            if !keys.is_empty() {
                let p = &mut self.types[ti].predictor;
                if matches!(
                    p.observe_train(t, &keys, obs),
                    smore_predictor::multiway::Update::Applied { .. }
                ) {
                    applied += 1;
                }
                if let Some(pred) = p.train_deg(t, &keys) {
                    self.corrections
                        .entry(g.index)
                        .or_default()
                        .observe(pred, obs);
                }
            }
        }
        for &(id, lat) in fn_latency {
            let Some(j) = snap.functions.iter().position(|r| r.id == id) else {
                continue;
            };
            let solo = snap.functions[j].solo_latency_ms;
            if !(lat.is_finite() && solo > 0.0) {
                continue;
            }
            let real = lat / solo - 1.0;
            if matches!(
                self.types[ti]
                    .predictor
                    .observe_fn(snap.training.as_ref(), &keys, j, real),
                smore_predictor::multiway::Update::Applied { .. }
            ) {
                applied += 1;
            }
        }
        self.unsaved[ti] += applied;
        self.maybe_save(ti);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::GrantView;
    use std::sync::OnceLock;

    /// One synthetic table for all tests (training forests is the slow part).
    fn tables() -> Vec<PairTable> {
        static T: OnceLock<Vec<PairTable>> = OnceLock::new();
        T.get_or_init(|| synthetic_tables(&Catalog::builtin().unwrap()).unwrap())
            .clone()
    }

    fn policy(cfg: &Config) -> SmorePolicy {
        SmorePolicy::with_tables(
            Catalog::builtin().unwrap(),
            tables(),
            sched_config(cfg),
            "SYNTHETIC test predictor",
        )
        .unwrap()
    }

    const GIB: u64 = 1 << 30;

    fn gpu(index: u32, train_util: Option<f64>, grants: Vec<GrantView>) -> GpuView {
        GpuView {
            index,
            total: 80 * GIB,
            training_used: if train_util.is_some() { 6 * GIB } else { 0 },
            training_reserved: 0,
            admission_hold_s: None,
            has_training: train_util.is_some(),
            training_solo_util: train_util,
            budget_boost: 1.0,
            grants,
        }
    }

    fn grant(id: u64, model: &str, slo: f64) -> GrantView {
        GrantView {
            instance: id,
            model: model.into(),
            slo_ms: slo,
            cap: GIB,
            share: 100,
            share_override: None,
        }
    }

    fn ask(model: &str, slo: f64, mem: u64) -> Ask {
        Ask {
            function: "f".into(),
            model: model.into(),
            slo_ms: slo,
            memory: mem,
            prefer_gpu: None,
        }
    }

    #[test]
    fn admits_with_predicted_degradations_on_the_least_degraded_gpu() {
        let cfg = Config::default();
        let mut p = policy(&cfg);
        // GPU 0: a busy trainer; GPU 1: a nearly idle one (DeepFM-like). λ = 0.5 ⇒ GPU 1.
        let gpus = [gpu(0, Some(0.98), vec![]), gpu(1, Some(0.03), vec![])];
        match p.place(&cfg, &gpus, &ask("mobilenet_v2:1", 100.0, GIB)) {
            Decision::Admit {
                gpu,
                predicted_train,
                predicted_fn,
                rule,
                ..
            } => {
                assert_eq!(gpu, 1, "{rule}");
                assert!(predicted_train.is_some() && predicted_fn.is_some());
                assert!(rule.contains("LeastDegradation") && rule.contains("SYNTHETIC"));
            }
            d => panic!("{d:?}"),
        }
    }

    #[test]
    fn an_slo_below_solo_latency_is_refused_with_slo() {
        let cfg = Config::default();
        let mut p = policy(&cfg);
        let gpus = [gpu(0, None, vec![]), gpu(1, None, vec![])];
        // resnet50:8 takes 2.7 ms solo on h100: a 0.5 ms SLO cannot be met anywhere.
        match p.place(&cfg, &gpus, &ask("resnet50:8", 0.5, GIB)) {
            Decision::Refuse { code, reason } => {
                assert_eq!(code, RefuseCode::Slo, "{reason}");
                assert!(
                    reason.contains("SLO") && reason.contains("D̂_fn"),
                    "{reason}"
                );
            }
            d => panic!("{d:?}"),
        }
    }

    #[test]
    fn theta_train_refuses_when_every_gpu_would_slow_training_too_much() {
        let cfg = Config {
            theta_train: 0.01,
            ..Config::default()
        };
        let mut p = policy(&cfg);
        let gpus = [gpu(0, Some(0.98), vec![]), gpu(1, Some(0.98), vec![])];
        match p.place(&cfg, &gpus, &ask("vgg16:32", 10_000.0, GIB)) {
            Decision::Refuse { code, reason } => {
                assert_eq!(code, RefuseCode::TrainingBound, "{reason}");
                assert!(reason.contains("θ_train"), "{reason}");
            }
            d => panic!("{d:?}"),
        }
    }

    #[test]
    fn the_sigma_rule_refuses_with_no_memory() {
        let cfg = Config::default();
        let mut p = policy(&cfg);
        let mut g = gpu(0, None, vec![]);
        g.total = 10 * GIB;
        // σ·10 GiB = 9.5 GiB: 9 GiB fits, 10 GiB does not.
        assert!(matches!(
            p.place(
                &cfg,
                std::slice::from_ref(&g),
                &ask("resnet50:1", 100.0, 9 * GIB)
            ),
            Decision::Admit { .. }
        ));
        match p.place(&cfg, &[g], &ask("resnet50:1", 100.0, 10 * GIB)) {
            Decision::Refuse { code, .. } => assert_eq!(code, RefuseCode::NoMemory),
            d => panic!("{d:?}"),
        }
    }

    #[test]
    fn unknown_models_are_refused_naming_the_known_ones_and_bare_names_take_the_smallest_batch() {
        let cfg = Config::default();
        let mut p = policy(&cfg);
        let gpus = [gpu(0, None, vec![])];
        match p.place(&cfg, &gpus, &ask("alexnet", 100.0, GIB)) {
            Decision::Refuse { code, reason } => {
                assert_eq!(code, RefuseCode::Invalid);
                assert!(reason.contains("alexnet") && reason.contains("resnet50"));
            }
            d => panic!("{d:?}"),
        }
        let (k, lat, _) = p.function_key(0, "resnet50").unwrap();
        assert_eq!(k, ModelKey::new("resnet50", 1));
        assert!(lat > 0.0);
    }

    #[test]
    fn first_fit_takes_the_first_acceptable_sampled_gpu_and_ties_keep_the_lower_index() {
        // first_fit_queue = 0: every registration is "fast".
        let cfg = Config {
            first_fit_queue: 0,
            power_of_d: 8,
            ..Config::default()
        };
        let mut p = policy(&cfg);
        let gpus = [gpu(0, Some(0.98), vec![]), gpu(1, Some(0.03), vec![])];
        match p.place(&cfg, &gpus, &ask("mobilenet_v2:1", 100.0, GIB)) {
            Decision::Admit { gpu, rule, .. } => {
                assert_eq!(gpu, 0, "first fit takes GPU 0 even though GPU 1 is better");
                assert!(rule.contains("FirstFit"), "{rule}");
            }
            d => panic!("{d:?}"),
        }
        // Identical GPUs (a tie): the lower index wins in least-degradation mode.
        let cfg = Config {
            power_of_d: 8,
            ..Config::default()
        };
        let mut p = policy(&cfg);
        let gpus = [gpu(3, None, vec![]), gpu(2, None, vec![])];
        match p.place(&cfg, &gpus, &ask("mobilenet_v2:1", 100.0, GIB)) {
            Decision::Admit { gpu, .. } => assert_eq!(gpu, 2),
            d => panic!("{d:?}"),
        }
    }

    #[test]
    fn power_of_d_widens_to_all_gpus_before_refusing() {
        let cfg = Config {
            power_of_d: 1,
            ..Config::default()
        };
        let mut p = policy(&cfg);
        // Only the last of 8 GPUs has memory: sampling one GPU would usually miss it.
        let mut gpus: Vec<GpuView> = (0..8).map(|i| gpu(i, None, vec![])).collect();
        for g in gpus.iter_mut().take(7) {
            g.training_used = 79 * GIB;
            g.has_training = true;
            g.training_solo_util = Some(0.5);
        }
        for _ in 0..5 {
            match p.place(&cfg, &gpus, &ask("resnet50:1", 100.0, 4 * GIB)) {
                Decision::Admit { gpu, .. } => assert_eq!(gpu, 7),
                d => panic!("{d:?}"),
            }
        }
    }

    #[test]
    fn shares_are_the_largest_meeting_theta_and_slo_and_keep_overrides() {
        let cfg = Config::default();
        let mut p = policy(&cfg);
        // No training: unthrottled.
        let g = gpu(0, None, vec![grant(1, "resnet50:8", 100.0)]);
        assert_eq!(p.shares(&cfg, &g), vec![(1, 100)]);
        // A half-busy trainer: shares are bounded by θ_train.
        let g = gpu(
            0,
            Some(0.6),
            vec![
                grant(1, "resnet50:8", 1000.0),
                grant(2, "bert_base:8", 1000.0),
            ],
        );
        let s = p.shares(&cfg, &g);
        assert_eq!(s.len(), 2);
        for &(_, share) in &s {
            assert!((cfg.min_share..100).contains(&share), "{s:?}");
        }
        // The predicted training degradation of the sized shares stays within θ_train, and one
        // grid step more would break it for at least one of them (largest share).
        let ti = p.type_of(&g);
        let snap = p.snapshot(ti, &g);
        let t = snap.training.clone().unwrap();
        let model = &p.types[ti].predictor;
        let deg = |r: &Resident, share: u32| {
            let inp = ShareInput {
                d_train_full: model.train_deg(&t, &[&r.key]).unwrap(),
                theta: 1.0,
                correction: 1.0,
                d_fn: 0.0,
                sm_util: r.sm_util,
                solo_latency_ms: 1.0,
                slo_ms: 1.0,
            };
            sched::train_deg_at_share(&inp, share)
        };
        let total: f64 = snap
            .functions
            .iter()
            .zip(&s)
            .map(|(r, &(_, x))| deg(r, x))
            .sum();
        assert!(total <= cfg.theta_train + 1e-9, "total {total} for {s:?}");
        // … or the share sits at the model-free time-budget cap (see `shares`).
        let caps = crate::policy::FitPolicy.shares(&cfg, &g);
        for ((r, &(_, x)), &(_, cap)) in snap.functions.iter().zip(&s).zip(&caps) {
            assert!(
                x <= cap.max(cfg.min_share),
                "{x} above the time-budget cap {cap}"
            );
            assert!(
                deg(r, x + 5) > cfg.theta_train / 2.0
                    || x + 5 > 100
                    || r.sm_util <= x as f64 / 100.0
                    || x >= cap,
                "{} could have had more than {x} %",
                r.key
            );
        }
        // Overrides are kept.
        let mut g2 = g.clone();
        g2.grants[0].share_override = Some(42);
        let s2 = p.shares(&cfg, &g2);
        assert_eq!(s2[0], (1, 42));
        // A trainer that barely uses the GPU leaves functions (almost) everything.
        let g3 = gpu(0, Some(0.02), vec![grant(1, "mobilenet_v2:1", 100.0)]);
        assert!(p.shares(&cfg, &g3)[0].1 >= 50, "{:?}", p.shares(&cfg, &g3));
    }

    #[test]
    fn request_admission_reports_predictions_and_defers_beyond_the_slo() {
        let cfg = Config::default();
        let mut p = policy(&cfg);
        let g = gpu(0, Some(0.5), vec![grant(1, "resnet50:8", 1000.0)]);
        let a = p.admit_request(&cfg, &g, 1);
        assert!(a.admitted, "{}", a.reason);
        assert!(a.predicted_train.is_some() && a.predicted_fn.is_some());
        // An SLO below the solo latency: deferred, with the predicted latency in the reason
        // (a fresh instance id: nothing in flight).
        let g = gpu(0, Some(0.5), vec![grant(2, "resnet50:8", 0.1)]);
        let a = p.admit_request(&cfg, &g, 2);
        assert!(!a.admitted);
        assert!(a.reason.contains("SLO"), "{}", a.reason);
        assert!(a.predicted_fn.is_some());
        let a = p.admit_request(&cfg, &g, 99);
        assert!(!a.admitted);
    }

    #[test]
    fn observations_move_weights_and_the_correction_toward_reality() {
        let cfg = Config::default();
        let mut p = policy(&cfg);
        let g = gpu(0, Some(0.5), vec![grant(1, "resnet50:8", 1000.0)]);
        let ti = p.type_of(&g);
        let snap = p.snapshot(ti, &g);
        let t = snap.training.clone().unwrap();
        let keys: Vec<&ModelKey> = snap.functions.iter().map(|r| &r.key).collect();
        let before = p.types[ti].predictor.train_deg(&t, &keys).unwrap();
        let target = before * 2.0 + 0.05;
        for _ in 0..50 {
            p.observe(&g, Some(target), &[]);
        }
        let after = p.types[ti].predictor.train_deg(&t, &keys).unwrap();
        assert!(
            (after * p.correction(0) - target).abs() < (before - target).abs(),
            "before {before} after {after}·{} target {target}",
            p.correction(0)
        );
        assert!(p.correction(0) > 1.0);
        // Function latency observations move α toward the observed degradation.
        let fb = p.types[ti].predictor.fn_deg(Some(&t), &keys, 0).unwrap();
        let solo = snap.functions[0].solo_latency_ms;
        let lat = solo * (1.0 + fb + 0.3);
        for _ in 0..50 {
            p.observe(&g, None, &[(1, lat)]);
        }
        let fa = p.types[ti].predictor.fn_deg(Some(&t), &keys, 0).unwrap();
        assert!(fa > fb, "{fb} → {fa}");
        // A garbage observation is rejected, not applied.
        let w = p.types[ti].predictor.weights.clone();
        p.observe(&g, Some(f64::NAN), &[(1, f64::INFINITY)]);
        assert_eq!(p.types[ti].predictor.weights.gamma, w.gamma);
    }

    #[test]
    fn the_training_proxy_follows_measured_utilization() {
        let cfg = Config::default();
        let p = policy(&cfg);
        let ti = p.type_of(&gpu(0, None, vec![]));
        let lo = p.training_key(ti, &gpu(0, Some(0.03), vec![])).unwrap();
        let hi = p.training_key(ti, &gpu(0, Some(0.98), vec![])).unwrap();
        let unknown = p.training_key(ti, &gpu(0, None, vec![]));
        assert_eq!(lo.model, "deepfm", "{lo}");
        assert_ne!(hi.model, "deepfm");
        assert!(unknown.is_none(), "no training ⇒ no key");
        let mut g = gpu(0, None, vec![]);
        g.has_training = true;
        let k = p.training_key(ti, &g).unwrap();
        let prof = p
            .catalog
            .profile(&p.types[ti].gpu.name, &k, Role::Training)
            .unwrap();
        assert!(prof.sm_util >= 0.98, "unknown ⇒ most demanding: {k}");
    }

    #[test]
    fn gpu_type_follows_memory_size() {
        let cfg = Config::default();
        let p = policy(&cfg);
        assert!(p.types.len() >= 2);
        let mut g = gpu(0, None, vec![]);
        g.total = 24 * GIB;
        assert_eq!(p.types[p.type_of(&g)].gpu.name, "rtx3090");
        g.total = 80 * GIB;
        assert_eq!(p.types[p.type_of(&g)].gpu.name, "h100");
    }

    #[test]
    fn from_config_reads_a_table_file_and_names_the_key_on_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("table.json");
        tables()[0].save(&path).unwrap();
        let cfg = Config {
            model: Some(path),
            state_dir: dir.path().join("state"),
            ..Config::default()
        };
        let p = SmorePolicy::from_config(&cfg).unwrap();
        assert_eq!(p.types.len(), 1);
        let bad = Config {
            model: Some(dir.path().join("missing.json")),
            ..Config::default()
        };
        let e = format!("{:#}", SmorePolicy::from_config(&bad).err().unwrap());
        assert!(e.contains("[policy] model"), "{e}");
    }
}
