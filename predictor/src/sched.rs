//! SMORE's degradation-aware scheduler (Algorithm 1) and SM-share sizing, as a pure library.
//!
//! Inputs are abstract snapshots ([`GpuSnapshot`], [`PendingItem`]) and a [`DegradationModel`];
//! outputs are decisions with an [`Explanation`] each (for `smore status` and the decision log).
//!
//! Owns: THE implementation of Algorithm 1 — priority order (with optional near-ties by
//! deadline), candidate order ([`Candidates`]: power of d, a preferred GPU, widening), the σ
//! memory rule, the θ_train and SLO admission rules — per co-location (SMORE's) or spent over a
//! window ([`ThetaWindow`], submodule `sched_window.rs`) —, argmin/first-fit choice
//! ([`choose`]), the queue with requeue back-off or deadline-aware re-evaluation ([`Scheduler`],
//! [`Retry`]) — and share sizing with its online correction. The arbiter's policy and the cluster evaluation call
//! this; they must not re-implement any of it (docs/predictor.md gives the grep that checks).
//! Must never: do I/O, read clocks, or touch grants — the arbiter applies what this returns.
//! Randomness comes only from seeded RNGs: the one inside [`Scheduler`] or the caller's, passed
//! to [`Candidates`] (reproducible decisions).

use crate::features::ModelKey;
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};
use std::fmt;

#[path = "sched_window.rs"]
mod window;
pub use window::{evaluate_windowed, Reservation, ThetaLedger, ThetaWindow, WindowGrant};

/// Degradation predictions the scheduler needs. `None` = the model cannot predict this
/// configuration (unknown model/batch); the scheduler then refuses that GPU (`Unpredictable`).
pub trait DegradationModel {
    /// D̂_train of `train` co-located with all of `fns` (multi-way, eq. 3).
    fn train_deg(&self, train: &ModelKey, fns: &[&ModelKey]) -> Option<f64>;
    /// D̂_fn of `fns[j]` with the trainer (if any) and the other functions (eq. 4).
    fn fn_deg(&self, train: Option<&ModelKey>, fns: &[&ModelKey], j: usize) -> Option<f64>;
}

/// Scheduler settings (the arbiter maps its `[policy]` config onto these).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SchedConfig {
    /// GPUs sampled per decision (power of d); ≥ number of GPUs means all of them.
    pub d: usize,
    /// Memory safety factor σ: used + need ≤ σ·capacity (SMORE: 0.95).
    pub sigma: f64,
    /// Largest acceptable predicted training degradation (fraction; 0.1 = 10 %).
    pub theta_train: f64,
    /// Weight of training degradation in the placement score λ·D̂_train + (1−λ)·D̂_fn.
    pub lambda: f64,
    /// ε in the priority P = E[ΔU]/(E[ΔLat] + ε).
    pub epsilon: f64,
    /// First fit (SMORE "fast processing") when more than this many items are eligible.
    pub first_fit_queue: usize,
    /// Requeue back-off: retry after min(base·2^(attempts−1), max) rounds.
    pub backoff_base: u64,
    /// Longest requeue back-off, rounds.
    pub backoff_max: u64,
    /// Drop an item after this many failed attempts (None = keep retrying).
    pub max_attempts: Option<u32>,
    /// When a refused item is looked at again ([`Retry`]).
    pub retry: Retry,
    /// [`Scheduler`] applies the arbiter's share-sizing step ([`refine_with_share`]) to every
    /// candidate, as the arbiter's policy does (beyond SMORE). Not used with
    /// [`SchedConfig::window`], whose rule sizes the share itself.
    pub share_sizing: bool,
    /// Near-ties in priority, ordered by deadline: priorities within a factor (1 + this) of each
    /// other (same logarithmic bucket) are ordered by time left ([`PendingItem::slo_ms`]),
    /// earliest first. 0 = exact ties only.
    pub deadline_tie: f64,
    /// Also refuse a GPU when a resident function would then miss its SLO (beyond SMORE).
    pub protect_residents: bool,
    /// SM-share grid, percent, for [`size_share`].
    pub share_grid: Vec<u32>,
    /// θ_train spent over time (beyond SMORE, [`ThetaWindow`]): [`Scheduler`] admits on the
    /// GPU's predicted slowdown averaged over a window instead of the instantaneous D̂_train ≤ θ
    /// rule and the θ/k share split. None (the default) = SMORE's rule.
    #[serde(default)]
    pub window: Option<ThetaWindow>,
}

impl Default for SchedConfig {
    fn default() -> Self {
        SchedConfig {
            d: 2,
            sigma: 0.95,
            theta_train: 0.10,
            lambda: 0.5,
            epsilon: 1e-3,
            first_fit_queue: 32,
            backoff_base: 1,
            backoff_max: 64,
            max_attempts: None,
            retry: Retry::Backoff,
            share_sizing: false,
            deadline_tie: 0.0,
            protect_residents: true,
            share_grid: (1..=20).map(|i| i * 5).collect(),
            window: None,
        }
    }
}

impl SchedConfig {
    /// Algorithm 1's placement score λ·D̂_train + (1−λ)·D̂_fn (lower is better).
    pub fn score(&self, d_train: f64, d_fn: f64) -> f64 {
        self.lambda * d_train + (1.0 - self.lambda) * d_fn
    }

    /// Rejects settings that would make decisions meaningless, naming the field.
    pub fn validate(&self) -> Result<(), SchedConfigError> {
        let bad = |field: &'static str, value: String, expected: &'static str| {
            Err(SchedConfigError {
                field,
                value,
                expected,
            })
        };
        if self.d == 0 {
            return bad("d (power of d)", "0".into(), "≥ 1");
        }
        if !(self.sigma > 0.0 && self.sigma <= 1.0) {
            return bad("sigma (memory safety)", self.sigma.to_string(), "in (0, 1]");
        }
        if !(self.theta_train.is_finite() && self.theta_train >= 0.0) {
            return bad(
                "theta_train",
                self.theta_train.to_string(),
                "finite and ≥ 0",
            );
        }
        if !(0.0..=1.0).contains(&self.lambda) {
            return bad("lambda", self.lambda.to_string(), "in [0, 1]");
        }
        if !(self.deadline_tie.is_finite() && self.deadline_tie >= 0.0) {
            return bad(
                "deadline_tie",
                self.deadline_tie.to_string(),
                "finite and ≥ 0",
            );
        }
        if self.epsilon.is_nan() || self.epsilon <= 0.0 {
            return bad("epsilon", self.epsilon.to_string(), "> 0");
        }
        if self.share_grid.is_empty() || self.share_grid.iter().any(|&s| s == 0 || s > 100) {
            return bad(
                "share_grid",
                format!("{:?}", self.share_grid),
                "non-empty percents in 1..=100",
            );
        }
        if let Some(w) = &self.window {
            if !(w.window_ms.is_finite() && w.window_ms > 0.0) {
                return bad(
                    "window.window_ms",
                    w.window_ms.to_string(),
                    "finite and > 0",
                );
            }
            if w.peak.is_nan() || w.peak < 1.0 {
                return bad("window.peak", w.peak.to_string(), "≥ 1 (or infinity)");
            }
        }
        Ok(())
    }
}

/// When [`Scheduler`] looks at a refused item again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Retry {
    /// SMORE's requeue: after min(base·2^(attempts−1), max) rounds, whatever happened meanwhile.
    Backoff,
    /// Deadline-aware (beyond SMORE, docs/predictor.md): in the first round where a GPU changed
    /// since the refusal (a placement, a completion, a new correction, with
    /// [`SchedConfig::window`] a refill of its θ budget) — the GPUs that changed
    /// are then evaluated besides the power-of-d sample — or where the item's slack (time left)
    /// has halved since the refusal (a fresh sample before it is too late). Nothing else can turn
    /// a refusal into an admission: memory, D̂_train and D̂_fn depend only on the GPUs, and a
    /// shrinking slack only tightens the SLO check. (With the window, the budget also refills
    /// continuously as the window slides; only a reservation leaving it entirely counts — a
    /// refused item may wait a little longer than strictly needed.)
    OnChange,
}

/// A [`SchedConfig`] field out of range.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("scheduler setting {field} = {value} must be {expected}; fix it in [policy] or the command line")]
pub struct SchedConfigError {
    /// The field (as named in [`SchedConfig`]).
    pub field: &'static str,
    /// Its value.
    pub value: String,
    /// The accepted range.
    pub expected: &'static str,
}

/// A function already on a GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct Resident {
    /// The instance's id.
    pub id: u64,
    /// Its model configuration.
    pub key: ModelKey,
    /// Its latency SLO, ms.
    pub slo_ms: f64,
    /// Its latency alone on the GPU, ms.
    pub solo_latency_ms: f64,
    /// Solo SM utilization (fraction) — used by share sizing.
    pub sm_util: f64,
}

/// One GPU as the scheduler sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuSnapshot {
    /// NVML index of the GPU.
    pub index: u32,
    /// Device memory, bytes.
    pub capacity: u64,
    /// Bytes in use or reserved (training + granted caps).
    pub used: u64,
    /// The protected training job's configuration, if one runs here.
    pub training: Option<ModelKey>,
    /// Functions already placed on it.
    pub functions: Vec<Resident>,
    /// Online correction factor on D̂_train for this GPU ([`Correction::factor`]; 1 = none).
    pub train_correction: f64,
}

/// A function instance (or request) waiting for placement.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingItem {
    /// The caller's id for the item (instance or request).
    pub id: u64,
    /// Its model configuration.
    pub key: ModelKey,
    /// Its latency SLO, ms.
    pub slo_ms: f64,
    /// Its latency alone on the GPU, ms.
    pub solo_latency_ms: f64,
    /// Solo SM utilization (fraction) — used by share sizing.
    pub sm_util: f64,
    /// Memory it needs, bytes.
    pub memory: u64,
    /// E[ΔU]: expected GPU-utilization gain if admitted (fraction).
    pub expected_util_gain: f64,
    /// E[ΔLat]: expected degradation if admitted (e.g. mean D̂_fn over trainers).
    pub expected_degradation: f64,
}

impl PendingItem {
    /// SMORE eq. 5: P = E[ΔU] / (E[ΔLat] + ε).
    pub fn priority(&self, epsilon: f64) -> f64 {
        self.expected_util_gain / (self.expected_degradation.max(0.0) + epsilon)
    }
}

/// Why a candidate GPU was or was not acceptable.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Verdict {
    /// Every bound holds: the GPU may take the item.
    Acceptable,
    /// used + need > σ·capacity.
    Memory {
        /// Bytes in use or reserved on the GPU.
        used: u64,
        /// Bytes the item needs.
        need: u64,
        /// σ·capacity, bytes.
        limit: u64,
    },
    /// D̂_train > θ_train.
    ThetaTrain {
        /// Predicted training slowdown D̂_train (fraction).
        predicted: f64,
        /// The bound θ_train (fraction).
        theta: f64,
    },
    /// The GPU's predicted slowdown averaged over some window would exceed θ_train
    /// ([`ThetaWindow`], at every share meeting the SLO).
    ThetaWindow {
        /// The largest predicted window mean with the item (fraction), at the smallest share tried.
        predicted_mean: f64,
        /// The bound θ_train (fraction).
        theta: f64,
        /// The window, ms.
        window_ms: f64,
    },
    /// lat_solo·(1 + D̂_fn) > SLO.
    Slo {
        /// Predicted latency of the item, ms.
        predicted_ms: f64,
        /// The item's SLO, ms.
        slo_ms: f64,
    },
    /// A resident function would miss its SLO.
    ResidentSlo {
        /// The resident's id.
        id: u64,
        /// Its predicted latency with the item added, ms.
        predicted_ms: f64,
        /// Its SLO, ms.
        slo_ms: f64,
    },
    /// The model has no prediction for this configuration.
    Unpredictable,
}

/// One evaluated candidate.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CandidateEval {
    /// NVML index of the candidate GPU.
    pub gpu: u32,
    /// Whether it was acceptable, and if not, which bound failed.
    #[serde(flatten)]
    pub verdict: Verdict,
    /// Predicted training slowdown D̂_train (fraction), when predicted.
    pub d_train: Option<f64>,
    /// Predicted function degradation D̂_fn (fraction), when predicted.
    pub d_fn: Option<f64>,
    /// Placement score λ·D̂_train + (1−λ)·D̂_fn, when both were predicted.
    pub score: Option<f64>,
}

/// Placement mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Low load: evaluate all sampled GPUs, take argmin λ·D̂_train + (1−λ)·D̂_fn.
    LeastDegradation,
    /// High load (queue > threshold): take the first acceptable sampled GPU.
    FirstFit,
}

/// The rule that decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Rule {
    /// Admitted on the GPU with the least score among acceptable candidates.
    LeastDegradation,
    /// Admitted on the first acceptable candidate.
    FirstFit,
    /// Every sampled candidate was refused (see candidates).
    NothingFits,
    /// There were no GPUs to sample.
    NoGpus,
    /// Request-level: admitted because the predicted degradations are within bounds.
    WithinBounds,
}

/// What was decided and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Explanation {
    /// Id of the item decided on.
    pub item: u64,
    /// Placement mode of the round.
    pub mode: Mode,
    /// The rule that decided.
    pub rule: Rule,
    /// The GPU chosen; None when refused.
    pub gpu: Option<u32>,
    /// Predicted training slowdown D̂_train (fraction) on the chosen GPU.
    pub predicted_train: Option<f64>,
    /// Predicted function degradation D̂_fn (fraction) on the chosen GPU.
    pub predicted_fn: Option<f64>,
    /// Predicted latency of the item on the chosen GPU, ms.
    pub predicted_latency_ms: Option<f64>,
    /// Every sampled candidate and its verdict.
    pub candidates: Vec<CandidateEval>,
}

impl Explanation {
    /// Whether the item was placed on a GPU.
    pub fn admitted(&self) -> bool {
        self.gpu.is_some()
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Acceptable => write!(f, "acceptable"),
            Verdict::Memory { used, need, limit } => {
                write!(f, "memory: used {used} + need {need} > σ·capacity {limit}")
            }
            Verdict::ThetaTrain { predicted, theta } => {
                write!(f, "D̂_train {predicted:.3} > θ_train {theta:.3}")
            }
            Verdict::ThetaWindow {
                predicted_mean,
                theta,
                window_ms,
            } => write!(
                f,
                "predicted mean D̂_train over {window_ms:.0} ms {predicted_mean:.3} > θ_train {theta:.3}"
            ),
            Verdict::Slo {
                predicted_ms,
                slo_ms,
            } => {
                write!(f, "latency {predicted_ms:.1} ms > SLO {slo_ms:.1} ms")
            }
            Verdict::ResidentSlo {
                id,
                predicted_ms,
                slo_ms,
            } => write!(
                f,
                "resident {id} would take {predicted_ms:.1} ms > its SLO {slo_ms:.1} ms"
            ),
            Verdict::Unpredictable => write!(f, "no prediction for this configuration"),
        }
    }
}

impl fmt::Display for Explanation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let opt = |v: Option<f64>| v.map(|x| format!("{x:.3}")).unwrap_or_else(|| "-".into());
        match self.gpu {
            Some(g) => write!(
                f,
                "admit item {} on gpu {g} ({:?}, {} candidates): D̂_train {} D̂_fn {} latency {} ms",
                self.item,
                self.rule,
                self.candidates.len(),
                opt(self.predicted_train),
                opt(self.predicted_fn),
                opt(self.predicted_latency_ms)
            ),
            None => {
                write!(f, "refuse item {} ({:?})", self.item, self.rule)?;
                for c in &self.candidates {
                    write!(f, "; gpu {}: {}", c.gpu, c.verdict)?;
                }
                Ok(())
            }
        }
    }
}

/// Evaluates one candidate GPU for `item` (lines 5–9 of Algorithm 1).
pub fn evaluate_candidate(
    cfg: &SchedConfig,
    gpu: &GpuSnapshot,
    item: &PendingItem,
    model: &dyn DegradationModel,
) -> CandidateEval {
    evaluate_with_theta(cfg, cfg.theta_train, gpu, item, model)
}

/// [`evaluate_candidate`] with the instantaneous bound `theta` in place of `cfg.theta_train`
/// (infinity: the caller applies its own θ rule, as [`evaluate_windowed`] does).
fn evaluate_with_theta(
    cfg: &SchedConfig,
    theta: f64,
    gpu: &GpuSnapshot,
    item: &PendingItem,
    model: &dyn DegradationModel,
) -> CandidateEval {
    let mut c = CandidateEval {
        gpu: gpu.index,
        verdict: Verdict::Acceptable,
        d_train: None,
        d_fn: None,
        score: None,
    };
    let limit = (gpu.capacity as f64 * cfg.sigma) as u64;
    if gpu.used.saturating_add(item.memory) > limit {
        c.verdict = Verdict::Memory {
            used: gpu.used,
            need: item.memory,
            limit,
        };
        return c;
    }
    let mut keys: Vec<&ModelKey> = gpu.functions.iter().map(|r| &r.key).collect();
    keys.push(&item.key);
    let j = keys.len() - 1;
    let d_train = match &gpu.training {
        Some(t) => match model.train_deg(t, &keys) {
            Some(d) => d * gpu.train_correction,
            None => {
                c.verdict = Verdict::Unpredictable;
                return c;
            }
        },
        None => 0.0,
    };
    let Some(d_fn) = model.fn_deg(gpu.training.as_ref(), &keys, j) else {
        c.verdict = Verdict::Unpredictable;
        return c;
    };
    c.d_train = Some(d_train);
    c.d_fn = Some(d_fn);
    if d_train > theta {
        c.verdict = Verdict::ThetaTrain {
            predicted: d_train,
            theta,
        };
        return c;
    }
    let lat = item.solo_latency_ms * (1.0 + d_fn);
    if lat > item.slo_ms {
        c.verdict = Verdict::Slo {
            predicted_ms: lat,
            slo_ms: item.slo_ms,
        };
        return c;
    }
    if cfg.protect_residents {
        for (m, r) in gpu.functions.iter().enumerate() {
            let Some(d) = model.fn_deg(gpu.training.as_ref(), &keys, m) else {
                c.verdict = Verdict::Unpredictable;
                return c;
            };
            let l = r.solo_latency_ms * (1.0 + d);
            if l > r.slo_ms {
                c.verdict = Verdict::ResidentSlo {
                    id: r.id,
                    predicted_ms: l,
                    slo_ms: r.slo_ms,
                };
                return c;
            }
        }
    }
    c.score = Some(cfg.score(d_train, d_fn));
    c
}

/// The GPUs one decision looks at, in the order it looks at them (Algorithm 1 line 3, plus what
/// the arbiter needs: a preferred GPU first and widening to every GPU before refusing).
///
/// Candidates `[0, sampled)` are always evaluated (the first acceptable one in first-fit mode);
/// those after `sampled` only while no earlier candidate was acceptable (widening).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidates {
    order: Vec<usize>,
    sampled: usize,
    /// `order[0]` is the caller's preferred GPU: when acceptable it is taken at once.
    preferred: bool,
}

impl Candidates {
    /// Exactly these GPU indices, in this order (no preference, no widening).
    pub fn fixed(order: Vec<usize>) -> Candidates {
        Candidates {
            sampled: order.len(),
            order,
            preferred: false,
        }
    }

    /// SMORE's power of d: `d` distinct GPUs of `n` drawn from `rng` ([`sample_candidates`]).
    pub fn power_of_d(rng: &mut StdRng, n: usize, d: usize) -> Candidates {
        Candidates::fixed(sample_candidates(rng, n, d))
    }

    /// The arbiter's order: `prefer` (an index into the GPUs) first, then a power-of-d sample,
    /// then — when `widen` — every other GPU, evaluated only if nothing earlier was acceptable
    /// (a registration is answered now, not requeued).
    pub fn preferred_sampled(
        rng: &mut StdRng,
        n: usize,
        d: usize,
        prefer: Option<usize>,
        widen: bool,
    ) -> Candidates {
        let prefer = prefer.filter(|&p| p < n);
        let mut order: Vec<usize> = Vec::with_capacity(n);
        // Membership by index, not `order.contains`: widening over the 1 024 GPUs of a cluster
        // (the scheduler extender) would otherwise cost n² comparisons per decision.
        let mut taken = vec![false; n];
        let mut push = |order: &mut Vec<usize>, i: usize| {
            if !std::mem::replace(&mut taken[i], true) {
                order.push(i);
            }
        };
        if let Some(p) = prefer {
            push(&mut order, p);
        }
        for i in sample_candidates(rng, n, d) {
            push(&mut order, i);
        }
        let sampled = order.len();
        if widen {
            for i in 0..n {
                push(&mut order, i);
            }
        }
        Candidates {
            order,
            sampled,
            preferred: prefer.is_some(),
        }
    }

    /// The GPU indices in evaluation order.
    pub fn order(&self) -> &[usize] {
        &self.order
    }
}

/// Result of [`choose`]: every evaluated candidate and the chosen one.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    /// First fit or least degradation.
    pub mode: Mode,
    /// The chosen GPU (index into the caller's GPUs) and its evaluation (index into `evals`).
    pub chosen: Option<(usize, usize)>,
    /// The candidates evaluated, in evaluation order (skipped ones are absent).
    pub evals: Vec<CandidateEval>,
    /// No candidate was offered at all.
    pub no_candidates: bool,
}

impl Choice {
    /// The chosen GPU's evaluation.
    pub fn chosen_eval(&self) -> Option<&CandidateEval> {
        self.chosen.map(|(_, e)| &self.evals[e])
    }

    /// The rule that decided.
    pub fn rule(&self) -> Rule {
        match (self.chosen, self.mode) {
            _ if self.no_candidates => Rule::NoGpus,
            (None, _) => Rule::NothingFits,
            (Some(_), Mode::FirstFit) => Rule::FirstFit,
            (Some(_), Mode::LeastDegradation) => Rule::LeastDegradation,
        }
    }

    /// The explanation of this decision for `item` (consumes the evaluations).
    pub fn explain(self, item: &PendingItem) -> Explanation {
        let rule = self.rule();
        let (pt, pf) = self
            .chosen_eval()
            .map_or((None, None), |e| (e.d_train, e.d_fn));
        Explanation {
            item: item.id,
            mode: self.mode,
            rule,
            gpu: self.chosen_eval().map(|e| e.gpu),
            predicted_train: pt,
            predicted_fn: pf,
            predicted_latency_ms: pf.map(|d| item.solo_latency_ms * (1.0 + d)),
            candidates: self.evals,
        }
    }
}

/// THE Algorithm 1 choice (lines 4–12), the only implementation: evaluates `cands` in order with
/// `eval` (which returns None for a candidate it cannot evaluate, e.g. a GPU type without a
/// profile of the function) and keeps the acceptable candidate with the least score
/// λ·D̂_train + (1−λ)·D̂_fn (ties: the lower GPU index), or — `fast`, SMORE's first fit on long
/// queues — the first acceptable one. An acceptable preferred GPU is taken at once; candidates
/// after the sampled ones are looked at only while nothing fits. `eval` is where callers plug a
/// per-candidate step in (the arbiter: [`evaluate_candidate`] then [`refine_with_share`]).
pub fn choose(
    cands: &Candidates,
    fast: bool,
    mut eval: impl FnMut(usize) -> Option<CandidateEval>,
) -> Choice {
    let mode = if fast {
        Mode::FirstFit
    } else {
        Mode::LeastDegradation
    };
    let mut evals: Vec<CandidateEval> = Vec::with_capacity(cands.sampled);
    let mut best: Option<(usize, f64, usize)> = None; // (gpu idx, score, eval idx)
    for (pos, &g) in cands.order.iter().enumerate() {
        if best.is_some() && pos >= cands.sampled {
            break; // widen only while nothing fits
        }
        let Some(e) = eval(g) else { continue };
        let score = e.score;
        let gpu = e.gpu;
        evals.push(e);
        let Some(s) = score else { continue };
        let better = match best {
            None => true,
            Some((_, bs, bi)) => s < bs || (s == bs && gpu < evals[bi].gpu),
        };
        if better {
            best = Some((g, s, evals.len() - 1));
        }
        if fast || (cands.preferred && pos == 0) {
            break;
        }
    }
    Choice {
        mode,
        chosen: best.map(|(g, _, e)| (g, e)),
        evals,
        no_candidates: cands.order.is_empty(),
    }
}

/// Algorithm 1 for one item over `gpus` and the candidate indices `candidates` (in sampled
/// order): [`choose`] with [`evaluate_candidate`]. Returns the chosen index into `gpus` and the
/// explanation.
pub fn allocate(
    cfg: &SchedConfig,
    item: &PendingItem,
    gpus: &[GpuSnapshot],
    candidates: &[usize],
    fast: bool,
    model: &dyn DegradationModel,
) -> (Option<usize>, Explanation) {
    let c = choose(&Candidates::fixed(candidates.to_vec()), fast, |g| {
        Some(evaluate_candidate(cfg, &gpus[g], item, model))
    });
    let chosen = c.chosen.map(|(g, _)| g);
    (chosen, c.explain(item))
}

/// Beyond SMORE, the arbiter's per-candidate share-sizing step (docs/predictor.md): an
/// acceptable GPU with a training job must also leave the new function a share (on the
/// [`SchedConfig::share_grid`]) meeting both θ_train (split among the residents) and the SLO —
/// and a GPU refused only because D̂_train at a *full* share exceeds θ_train is acceptable when
/// a smaller share keeps both bounds (the share the arbiter then grants).
pub fn refine_with_share(
    cfg: &SchedConfig,
    snap: &GpuSnapshot,
    item: &PendingItem,
    mut e: CandidateEval,
    model: &dyn DegradationModel,
) -> CandidateEval {
    let theta_only = matches!(e.verdict, Verdict::ThetaTrain { .. });
    if !((e.score.is_some() || theta_only) && snap.training.is_some()) {
        return e;
    }
    let k = snap.functions.len() + 1;
    let Some(d) = size_new_function(cfg, snap, item, model) else {
        return e;
    };
    match d.share {
        Some(_) if theta_only => {
            let d_fn = (d.predicted_latency_ms / item.solo_latency_ms.max(1e-9) - 1.0).max(0.0);
            e.verdict = Verdict::Acceptable;
            e.d_train = Some(d.predicted_train);
            e.d_fn = Some(d_fn);
            e.score = Some(cfg.score(d.predicted_train, d_fn));
        }
        Some(_) => {}
        None => {
            e.verdict = match d.limited_by {
                Some(ShareBound::Slo) => Verdict::Slo {
                    predicted_ms: d.predicted_latency_ms,
                    slo_ms: item.slo_ms,
                },
                _ => Verdict::ThetaTrain {
                    predicted: d.predicted_train,
                    theta: cfg.theta_train / k as f64,
                },
            };
            e.score = None;
        }
    }
    e
}

/// Power-of-d sampling: `d` distinct indices in random order, or all (in order) when d ≥ n.
pub fn sample_candidates(rng: &mut StdRng, n: usize, d: usize) -> Vec<usize> {
    if d >= n {
        (0..n).collect()
    } else {
        rand::seq::index::sample(rng, n, d).into_vec()
    }
}

/// What happened to a pending item in a round.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    /// Placed on this GPU.
    Placed {
        /// GPU index ([`GpuSnapshot::index`]).
        gpu: u32,
    },
    /// Back in the queue; eligible again at `retry_round` ([`Retry::Backoff`]) or when a GPU
    /// changes or its slack halves ([`Retry::OnChange`]: `retry_round` is None).
    Requeued {
        /// Failed attempts so far.
        attempts: u32,
        /// First round it is looked at again, when that is known in advance.
        retry_round: Option<u64>,
    },
    /// Gave up after `max_attempts`.
    Dropped {
        /// Failed attempts.
        attempts: u32,
    },
}

/// One decision of a round.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Decision {
    /// [`PendingItem::id`].
    pub item: u64,
    /// What happened to it.
    pub outcome: Outcome,
    /// Why.
    pub explanation: Explanation,
}

#[derive(Debug, Clone)]
struct Queued<T> {
    item: PendingItem,
    payload: T,
    attempts: u32,
    not_before: u64,
    /// Round of the last refusal and the slack then ([`Retry::OnChange`]).
    refused: Option<(u64, f64)>,
}

/// What identifies a GPU's state for [`Retry::OnChange`]: anything a candidate evaluation reads
/// that placements, completions or corrections change.
/// With [`SchedConfig::window`] the GPU's [`ThetaLedger::generation`] is part of it (a budget
/// that refilled is a change).
fn fingerprint(g: &GpuSnapshot, ledger: u64) -> Fingerprint {
    let ids = g.functions.iter().fold(0u64, |h, r| {
        h.rotate_left(5) ^ r.id.wrapping_mul(0x9e37_79b9_7f4a_7c15)
    });
    (
        g.used,
        g.functions.len(),
        ids,
        g.train_correction.to_bits(),
        ledger,
    )
}

type Fingerprint = (u64, usize, u64, u64, u64);

/// How a placed item runs ([`Scheduler::run_round_at`]'s `place` callback).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Placement {
    /// The SM share (percent) the item runs at: the share sizing of [`size_new_function`] with
    /// [`SchedConfig::share_sizing`], the budget's share with [`SchedConfig::window`]; None =
    /// full speed (no training to protect, or neither option on).
    pub share: Option<u32>,
    /// What it reserved of the GPU's windowed θ budget ([`SchedConfig::window`]).
    pub reservation: Option<Reservation>,
}

/// Sort key of SMORE's priority with near-ties: the logarithmic bucket of P (higher first), so
/// that priorities within a factor (1 + tie) share a bucket.
fn priority_bucket(p: f64, tie: f64) -> f64 {
    if tie <= 0.0 || p <= 0.0 || !p.is_finite() {
        p
    } else {
        (p.ln() / tie.ln_1p()).floor()
    }
}

/// The pending queue plus the seeded RNG: SMORE's scheduling loop (the only one: the cluster
/// evaluation drives it with its requests as payloads `T`).
#[derive(Debug, Clone)]
pub struct Scheduler<T = ()> {
    /// Settings (validated at construction).
    pub cfg: SchedConfig,
    rng: StdRng,
    queue: Vec<Queued<T>>,
    round: u64,
    /// Per GPU (by position): its last fingerprint and the round it last changed.
    seen: Vec<(Fingerprint, u64)>,
    /// Per GPU (by position): the windowed θ budget's reservations ([`SchedConfig::window`]).
    ledgers: Vec<ThetaLedger>,
}

impl<T> Scheduler<T> {
    /// A scheduler whose power-of-d sampler is seeded with `seed`.
    pub fn new(cfg: SchedConfig, seed: u64) -> Result<Scheduler<T>, SchedConfigError> {
        cfg.validate()?;
        Ok(Scheduler {
            cfg,
            rng: StdRng::seed_from_u64(seed),
            queue: Vec::new(),
            round: 0,
            seen: Vec::new(),
            ledgers: Vec::new(),
        })
    }

    /// Queues `item`, carrying `payload` back to the caller when it is placed.
    pub fn submit_with(&mut self, item: PendingItem, payload: T) {
        self.queue.push(Queued {
            item,
            payload,
            attempts: 0,
            not_before: self.round,
            refused: None,
        });
    }

    /// Items waiting (eligible or backing off).
    pub fn queue_len(&self) -> usize {
        self.queue.len()
    }

    /// The next round's number.
    pub fn round(&self) -> u64 {
        self.round
    }

    /// Keeps the queued items for which `keep` returns true; `keep` may update an item (e.g. its
    /// SLO, the time left to its deadline). Returns the number removed.
    pub fn retain(&mut self, mut keep: impl FnMut(&mut PendingItem, &T) -> bool) -> usize {
        let before = self.queue.len();
        self.queue.retain_mut(|q| keep(&mut q.item, &q.payload));
        before - self.queue.len()
    }

    /// Places one item right now (registration path, no queue): sample d GPUs and run Algorithm 1
    /// in least-degradation mode, or first fit when `fast`.
    pub fn place_now(
        &mut self,
        item: &PendingItem,
        gpus: &[GpuSnapshot],
        fast: bool,
        model: &dyn DegradationModel,
    ) -> (Option<usize>, Explanation) {
        let cand = sample_candidates(&mut self.rng, gpus.len(), self.cfg.d);
        allocate(&self.cfg, item, gpus, &cand, fast, model)
    }

    /// One scheduling round: eligible items in priority order (near-ties by deadline, then lower
    /// id first, [`SchedConfig::deadline_tie`]); first fit when more than `first_fit_queue` are
    /// eligible. `place` applies a placement to the chosen GPU (so later decisions in the round
    /// see it); refused items are requeued ([`SchedConfig::retry`]) or dropped after
    /// `max_attempts`.
    ///
    /// The windowed θ budget ([`SchedConfig::window`]) needs a clock: here a round counts as 1 ms;
    /// callers with a clock use [`Scheduler::run_round_at`].
    pub fn run_round_with<G: AsRef<GpuSnapshot>>(
        &mut self,
        gpus: &mut [G],
        model: &dyn DegradationModel,
        mut place: impl FnMut(&mut G, &PendingItem, T),
    ) -> Vec<Decision> {
        let now = self.round as f64;
        self.run_round_at(gpus, model, now, |g, item, payload, _| {
            place(g, item, payload)
        })
    }

    /// The windowed θ budget of GPU `g` (by position), once a round has seen it.
    pub fn ledger(&self, g: usize) -> Option<&ThetaLedger> {
        self.ledgers.get(g)
    }

    /// [`Scheduler::run_round_with`] at time `now_ms` (the caller's clock, non-decreasing): `place`
    /// is also told how the item runs ([`Placement`]: its share and what it reserved of the
    /// GPU's windowed θ budget, which this round has already recorded).
    pub fn run_round_at<G: AsRef<GpuSnapshot>>(
        &mut self,
        gpus: &mut [G],
        model: &dyn DegradationModel,
        now_ms: f64,
        mut place: impl FnMut(&mut G, &PendingItem, T, &Placement),
    ) -> Vec<Decision> {
        let round = self.round;
        self.round += 1;
        self.ledgers.resize_with(gpus.len(), ThetaLedger::default);
        if let Some(w) = self.cfg.window {
            for l in &mut self.ledgers {
                l.prune(now_ms, w.window_ms);
            }
        }
        self.observe_changes(gpus, round);
        let seen = &self.seen;
        let retry = self.cfg.retry;
        let (mut ready, wait): (Vec<Queued<T>>, Vec<Queued<T>>) = std::mem::take(&mut self.queue)
            .into_iter()
            .partition(|q| match (retry, q.refused) {
                (Retry::Backoff, _) | (Retry::OnChange, None) => q.not_before <= round,
                (Retry::OnChange, Some((at, slack))) => {
                    q.item.slo_ms <= slack / 2.0 || seen.iter().any(|&(_, c)| c > at)
                }
            });
        self.queue = wait;
        let eps = self.cfg.epsilon;
        let tie = self.cfg.deadline_tie;
        ready.sort_by(|a, b| {
            let (pa, pb) = (a.item.priority(eps), b.item.priority(eps));
            priority_bucket(pb, tie)
                .total_cmp(&priority_bucket(pa, tie))
                .then(if tie > 0.0 {
                    a.item.slo_ms.total_cmp(&b.item.slo_ms)
                } else {
                    std::cmp::Ordering::Equal
                })
                .then(pb.total_cmp(&pa))
                .then(a.item.id.cmp(&b.item.id))
        });
        let fast = ready.len() > self.cfg.first_fit_queue;
        let mut out = Vec::with_capacity(ready.len());
        for mut q in ready {
            let mut cands = sample_candidates(&mut self.rng, gpus.len(), self.cfg.d);
            if let (Retry::OnChange, Some((at, _))) = (retry, q.refused) {
                // Look where something changed since the refusal, besides the sample.
                for (g, &(_, c)) in self.seen.iter().enumerate() {
                    if c > at && !cands.contains(&g) {
                        cands.push(g);
                    }
                }
            }
            let cfg = &self.cfg;
            let ledgers = &self.ledgers;
            // The windowed budget's grant per evaluated GPU (the chosen one is applied).
            let mut grants: Vec<(usize, WindowGrant)> = Vec::new();
            let choice = choose(&Candidates::fixed(cands), fast, |g| {
                let snap = gpus[g].as_ref();
                if let Some(w) = &cfg.window {
                    let (e, grant) =
                        evaluate_windowed(cfg, w, snap, &q.item, model, &ledgers[g], now_ms);
                    grants.extend(grant.map(|x| (g, x)));
                    return Some(e);
                }
                let e = evaluate_candidate(cfg, snap, &q.item, model);
                Some(if cfg.share_sizing {
                    refine_with_share(cfg, snap, &q.item, e, model)
                } else {
                    e
                })
            });
            let chosen = choice.chosen.map(|(g, _)| g);
            let explanation = choice.explain(&q.item);
            let item = q.item.id;
            let outcome = match chosen {
                Some(g) => {
                    let gpu = gpus[g].as_ref().index;
                    let placement = match cfg.window {
                        Some(_) => {
                            let grant = grants.iter().find(|x| x.0 == g).map(|x| x.1);
                            if let Some(x) = grant {
                                self.ledgers[g].spend(x.reservation);
                            }
                            Placement {
                                share: grant.map(|x| x.share),
                                reservation: grant.map(|x| x.reservation),
                            }
                        }
                        None => Placement {
                            // The share the arbiter would grant (sized before the item joins).
                            share: if cfg.share_sizing {
                                size_new_function(cfg, gpus[g].as_ref(), &q.item, model)
                                    .and_then(|d| d.share)
                            } else {
                                None
                            },
                            reservation: None,
                        },
                    };
                    place(&mut gpus[g], &q.item, q.payload, &placement);
                    Outcome::Placed { gpu }
                }
                None => {
                    q.attempts += 1;
                    if self.cfg.max_attempts.is_some_and(|m| q.attempts >= m) {
                        Outcome::Dropped {
                            attempts: q.attempts,
                        }
                    } else {
                        let retry_round = match retry {
                            Retry::Backoff => {
                                let wait = self
                                    .cfg
                                    .backoff_base
                                    .saturating_mul(
                                        1u64.checked_shl(q.attempts - 1).unwrap_or(u64::MAX),
                                    )
                                    .min(self.cfg.backoff_max)
                                    .max(1);
                                q.not_before = round + wait;
                                Some(q.not_before)
                            }
                            Retry::OnChange => {
                                // Placements later in this round count as changes after it.
                                q.refused = Some((round, q.item.slo_ms));
                                None
                            }
                        };
                        let attempts = q.attempts;
                        self.queue.push(q);
                        Outcome::Requeued {
                            attempts,
                            retry_round,
                        }
                    }
                }
            };
            out.push(Decision {
                item,
                outcome,
                explanation,
            });
        }
        self.observe_changes(gpus, round);
        out
    }

    /// Records which GPUs changed (fingerprint) as of `round`.
    fn observe_changes<G: AsRef<GpuSnapshot>>(&mut self, gpus: &[G], round: u64) {
        self.seen.resize(gpus.len(), ((0, 0, 0, 0, 0), 0));
        self.ledgers.resize_with(gpus.len(), ThetaLedger::default);
        for ((s, g), l) in self.seen.iter_mut().zip(gpus).zip(&self.ledgers) {
            let f = fingerprint(g.as_ref(), l.generation());
            if s.0 != f {
                *s = (f, round);
            }
        }
    }
}

impl Scheduler<()> {
    /// Queues `item`.
    pub fn submit(&mut self, item: PendingItem) {
        self.submit_with(item, ());
    }

    /// [`Scheduler::run_round_with`] over plain snapshots: a placed item becomes a resident of
    /// the chosen snapshot (its memory is added to `used`).
    pub fn run_round(
        &mut self,
        gpus: &mut [GpuSnapshot],
        model: &dyn DegradationModel,
    ) -> Vec<Decision> {
        self.run_round_with(gpus, model, |g, item, ()| g.add_resident(item))
    }
}

impl AsRef<GpuSnapshot> for GpuSnapshot {
    fn as_ref(&self) -> &GpuSnapshot {
        self
    }
}

impl GpuSnapshot {
    /// Records `item` as placed here: its memory is added to `used`, it becomes a resident.
    pub fn add_resident(&mut self, item: &PendingItem) {
        self.used = self.used.saturating_add(item.memory);
        self.functions.push(Resident {
            id: item.id,
            key: item.key.clone(),
            slo_ms: item.slo_ms,
            solo_latency_ms: item.solo_latency_ms,
            sm_util: item.sm_util,
        });
    }
}

/// Request-level admission for resident `fn_id` on `gpu` with `in_flight` requests already
/// running: the new request is modelled as one more co-located copy of the function.
pub fn admit_request(
    cfg: &SchedConfig,
    gpu: &GpuSnapshot,
    fn_id: u64,
    in_flight: u32,
    model: &dyn DegradationModel,
) -> Explanation {
    let mut exp = Explanation {
        item: fn_id,
        mode: Mode::LeastDegradation,
        rule: Rule::NothingFits,
        gpu: None,
        predicted_train: None,
        predicted_fn: None,
        predicted_latency_ms: None,
        candidates: vec![],
    };
    let Some(r) = gpu.functions.iter().find(|r| r.id == fn_id) else {
        exp.candidates.push(CandidateEval {
            gpu: gpu.index,
            verdict: Verdict::Unpredictable,
            d_train: None,
            d_fn: None,
            score: None,
        });
        return exp;
    };
    let item = PendingItem {
        id: fn_id,
        key: r.key.clone(),
        slo_ms: r.slo_ms,
        solo_latency_ms: r.solo_latency_ms,
        sm_util: r.sm_util,
        memory: 0,
        expected_util_gain: 0.0,
        expected_degradation: 0.0,
    };
    // The new request is the candidate; the resident's `in_flight` running requests are extra
    // co-located copies. Memory was checked when the instance was placed: requests need none.
    let mut g = gpu.clone();
    g.used = 0;
    g.functions.retain(|x| x.id != fn_id);
    for _ in 0..in_flight {
        g.functions.push(r.clone());
    }
    let c = evaluate_candidate(cfg, &g, &item, model);
    if c.score.is_some() {
        exp.rule = Rule::WithinBounds;
        exp.gpu = Some(gpu.index);
        exp.predicted_train = c.d_train;
        exp.predicted_fn = c.d_fn;
        exp.predicted_latency_ms = c.d_fn.map(|d| r.solo_latency_ms * (1.0 + d));
    }
    exp.candidates.push(c);
    exp
}

/// Inputs of share sizing for one function on one GPU.
///
/// Share model (documented in docs/predictor.md): a function whose solo SM utilization is u,
/// gated to an SM time share s, does min(1, s/u) of its unthrottled work per unit time, so
/// - its contribution to training degradation scales as D̂_train(s) = D̂_train,full · min(1, s/u);
/// - its latency stretches as L(s) = lat_solo · (1 + D̂_fn) · max(1, u/s).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ShareInput {
    /// This function's (multi-way weighted) contribution to D̂_train at full share.
    pub d_train_full: f64,
    /// Training degradation budget available to this function (θ_train or a slice of it).
    pub theta: f64,
    /// Online correction factor on D̂_train ([`Correction::factor`]).
    pub correction: f64,
    /// D̂_fn of this function at full share.
    pub d_fn: f64,
    /// Solo SM utilization of this function (fraction).
    pub sm_util: f64,
    /// Its latency alone on the GPU, ms.
    pub solo_latency_ms: f64,
    /// Its latency SLO, ms.
    pub slo_ms: f64,
}

/// The bound that no share on the grid could meet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ShareBound {
    /// Even the smallest share predicts D̂_train > the θ budget.
    ThetaTrain,
    /// Shares within the θ budget stretch the latency beyond the SLO.
    Slo,
}

/// Result of share sizing.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ShareDecision {
    /// Largest grid share (percent) meeting both bounds; None if none does.
    pub share: Option<u32>,
    /// Predicted D̂_train (fraction) at `share`, or at the smallest grid share when none fits.
    pub predicted_train: f64,
    /// Predicted latency, ms, at the same share.
    pub predicted_latency_ms: f64,
    /// Which bound failed when `share` is None.
    pub limited_by: Option<ShareBound>,
}

/// Predicted training degradation contributed at `share` percent.
pub fn train_deg_at_share(inp: &ShareInput, share: u32) -> f64 {
    inp.correction * inp.d_train_full * work_rate(share, inp.sm_util)
}

/// Predicted function latency at `share` percent.
pub fn latency_at_share(inp: &ShareInput, share: u32) -> f64 {
    // A 0 % share (never on a valid grid) is taken as 0.1 % rather than an infinite latency.
    let rate = work_rate(share, inp.sm_util)
        .max(1e-3 / inp.sm_util.max(0.01))
        .min(1.0);
    inp.solo_latency_ms * (1.0 + inp.d_fn) / rate
}

/// The share model's one rule: a function with solo SM utilization `sm_util` gated to an SM time
/// share of `share` percent does min(1, share/u) of its unthrottled work per unit time (and
/// presses on the GPU in the same proportion). u is floored at 1 %.
pub fn work_rate(share: u32, sm_util: f64) -> f64 {
    (share as f64 / 100.0 / sm_util.max(0.01)).min(1.0)
}

/// Beyond SMORE: the largest share in `grid` with predicted training degradation ≤ θ and
/// latency ≤ SLO.
pub fn size_share(grid: &[u32], inp: &ShareInput) -> ShareDecision {
    let mut shares: Vec<u32> = grid.to_vec();
    shares.sort_unstable();
    let mut theta_ok_any = false;
    for &s in shares.iter().rev() {
        let dt = train_deg_at_share(inp, s);
        if dt > inp.theta {
            continue;
        }
        theta_ok_any = true;
        let l = latency_at_share(inp, s);
        if l <= inp.slo_ms {
            return ShareDecision {
                share: Some(s),
                predicted_train: dt,
                predicted_latency_ms: l,
                limited_by: None,
            };
        }
        // Smaller shares only lengthen latency: no smaller share can meet the SLO.
        break;
    }
    let smin = shares.first().copied().unwrap_or(1);
    ShareDecision {
        share: None,
        predicted_train: train_deg_at_share(inp, smin),
        predicted_latency_ms: latency_at_share(inp, smin),
        limited_by: Some(if theta_ok_any {
            ShareBound::Slo
        } else {
            ShareBound::ThetaTrain
        }),
    }
}

/// Sizes every resident's share on `gpu`: θ_train is split equally among the k residents, each
/// resident's contribution is its single-function multi-way D̂_train, its D̂_fn is the full
/// multi-way prediction. Returns (resident id, decision) in resident order.
pub fn size_gpu_shares(
    cfg: &SchedConfig,
    gpu: &GpuSnapshot,
    model: &dyn DegradationModel,
) -> Vec<(u64, ShareDecision)> {
    let keys: Vec<&ModelKey> = gpu.functions.iter().map(|r| &r.key).collect();
    gpu.functions
        .iter()
        .enumerate()
        .map(|(j, r)| (r.id, size_resident(cfg, gpu, &keys, j, model)))
        .collect()
}

/// The share of resident `j` of `gpu` (`keys` = every resident's key, in order): θ_train split
/// equally among the residents (the one sizing rule of [`size_gpu_shares`]).
fn size_resident(
    cfg: &SchedConfig,
    gpu: &GpuSnapshot,
    keys: &[&ModelKey],
    j: usize,
    model: &dyn DegradationModel,
) -> ShareDecision {
    let r = &gpu.functions[j];
    let d_train_full = match &gpu.training {
        Some(t) => model.train_deg(t, &[&r.key]).unwrap_or(f64::INFINITY),
        None => 0.0,
    };
    let d_fn = model
        .fn_deg(gpu.training.as_ref(), keys, j)
        .unwrap_or(f64::INFINITY);
    let inp = ShareInput {
        d_train_full,
        theta: cfg.theta_train / keys.len().max(1) as f64,
        correction: gpu.train_correction,
        d_fn,
        sm_util: r.sm_util,
        solo_latency_ms: r.solo_latency_ms,
        slo_ms: r.slo_ms,
    };
    size_share(&cfg.share_grid, &inp)
}

/// The share `item` would get as one more resident of `snap` ([`size_gpu_shares`]' rule), or
/// None when no training job runs there (nothing to protect: a full share).
pub fn size_new_function(
    cfg: &SchedConfig,
    snap: &GpuSnapshot,
    item: &PendingItem,
    model: &dyn DegradationModel,
) -> Option<ShareDecision> {
    snap.training.as_ref()?;
    let mut s2 = snap.clone();
    s2.add_resident(item);
    let keys: Vec<&ModelKey> = s2.functions.iter().map(|r| &r.key).collect();
    Some(size_resident(cfg, &s2, &keys, keys.len() - 1, model))
}

/// Online correction of D̂_train from observed training degradation (e.g. NVML-derived slowdown
/// of the unmodified trainer against its solo profile): an EWMA of observed/predicted, bounded.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Correction {
    /// Current factor applied to D̂_train (1 = no correction).
    pub factor: f64,
    /// EWMA weight of a new observation.
    pub weight: f64,
    /// Lowest factor allowed.
    pub min: f64,
    /// Highest factor allowed.
    pub max: f64,
}

impl Default for Correction {
    fn default() -> Self {
        Correction {
            factor: 1.0,
            weight: 0.2,
            min: 0.25,
            max: 4.0,
        }
    }
}

impl Correction {
    /// Folds in one (predicted, observed) pair; ignores non-finite values and predictions too
    /// small to form a ratio (< 0.005). Returns whether the factor moved.
    pub fn observe(&mut self, predicted: f64, observed: f64) -> bool {
        if !(predicted.is_finite() && observed.is_finite()) || predicted < 0.005 {
            return false;
        }
        let ratio = (observed.max(0.0) / predicted).clamp(self.min, self.max);
        self.factor =
            ((1.0 - self.weight) * self.factor + self.weight * ratio).clamp(self.min, self.max);
        true
    }
}
