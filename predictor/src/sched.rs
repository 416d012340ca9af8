//! SMORE's degradation-aware scheduler (Algorithm 1) and SM-share sizing, as a pure library.
//!
//! Inputs are abstract snapshots ([`GpuSnapshot`], [`PendingItem`]) and a [`DegradationModel`];
//! outputs are decisions with an [`Explanation`] each (for `smore status` and the decision log).
//!
//! Owns: priority order, power-of-d sampling, the σ memory rule, the θ_train and SLO admission
//! rules, argmin/first-fit choice, requeue back-off, share sizing and its online correction.
//! Must never: do I/O, read clocks, or touch grants — the arbiter applies what this returns.
//! Randomness comes only from the seeded RNG inside [`Scheduler`] (reproducible decisions).

use crate::features::ModelKey;
use anyhow::{bail, Result};
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};
use std::fmt;

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
    pub backoff_max: u64,
    /// Drop an item after this many failed attempts (None = keep retrying).
    pub max_attempts: Option<u32>,
    /// Also refuse a GPU when a resident function would then miss its SLO (beyond SMORE).
    pub protect_residents: bool,
    /// SM-share grid, percent, for [`size_share`].
    pub share_grid: Vec<u32>,
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
            protect_residents: true,
            share_grid: (1..=20).map(|i| i * 5).collect(),
        }
    }
}

impl SchedConfig {
    /// Rejects settings that would make decisions meaningless, naming the field.
    pub fn validate(&self) -> Result<()> {
        if self.d == 0 {
            bail!("sched.d must be ≥ 1");
        }
        if !(self.sigma > 0.0 && self.sigma <= 1.0) {
            bail!("sched.sigma = {} must be in (0, 1]", self.sigma);
        }
        if !(self.theta_train.is_finite() && self.theta_train >= 0.0) {
            bail!("sched.theta_train = {} must be ≥ 0", self.theta_train);
        }
        if !(0.0..=1.0).contains(&self.lambda) {
            bail!("sched.lambda = {} must be in [0, 1]", self.lambda);
        }
        if self.epsilon.is_nan() || self.epsilon <= 0.0 {
            bail!("sched.epsilon = {} must be > 0", self.epsilon);
        }
        if self.share_grid.is_empty() || self.share_grid.iter().any(|&s| s == 0 || s > 100) {
            bail!("sched.share_grid must list percents in 1..=100");
        }
        Ok(())
    }
}

/// A function already on a GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct Resident {
    pub id: u64,
    pub key: ModelKey,
    pub slo_ms: f64,
    pub solo_latency_ms: f64,
    /// Solo SM utilization (fraction) — used by share sizing.
    pub sm_util: f64,
}

/// One GPU as the scheduler sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuSnapshot {
    pub index: u32,
    pub capacity: u64,
    /// Bytes in use or reserved (training + granted caps).
    pub used: u64,
    /// The protected training job's configuration, if one runs here.
    pub training: Option<ModelKey>,
    pub functions: Vec<Resident>,
    /// Online correction factor on D̂_train for this GPU ([`Correction::factor`]; 1 = none).
    pub train_correction: f64,
}

/// A function instance (or request) waiting for placement.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingItem {
    pub id: u64,
    pub key: ModelKey,
    pub slo_ms: f64,
    pub solo_latency_ms: f64,
    pub sm_util: f64,
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
    Acceptable,
    /// used + need > σ·capacity.
    Memory {
        used: u64,
        need: u64,
        limit: u64,
    },
    /// D̂_train > θ_train.
    ThetaTrain {
        predicted: f64,
        theta: f64,
    },
    /// lat_solo·(1 + D̂_fn) > SLO.
    Slo {
        predicted_ms: f64,
        slo_ms: f64,
    },
    /// A resident function would miss its SLO.
    ResidentSlo {
        id: u64,
        predicted_ms: f64,
        slo_ms: f64,
    },
    /// The model has no prediction for this configuration.
    Unpredictable,
}

/// One evaluated candidate.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CandidateEval {
    pub gpu: u32,
    #[serde(flatten)]
    pub verdict: Verdict,
    pub d_train: Option<f64>,
    pub d_fn: Option<f64>,
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
    pub item: u64,
    pub mode: Mode,
    pub rule: Rule,
    pub gpu: Option<u32>,
    pub predicted_train: Option<f64>,
    pub predicted_fn: Option<f64>,
    pub predicted_latency_ms: Option<f64>,
    pub candidates: Vec<CandidateEval>,
}

impl Explanation {
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
    if d_train > cfg.theta_train {
        c.verdict = Verdict::ThetaTrain {
            predicted: d_train,
            theta: cfg.theta_train,
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
    c.score = Some(cfg.lambda * d_train + (1.0 - cfg.lambda) * d_fn);
    c
}

/// Algorithm 1 over already-sampled candidates (indices into `gpus`, in sampled order).
/// Returns the chosen index into `gpus` and the explanation.
pub fn allocate(
    cfg: &SchedConfig,
    item: &PendingItem,
    gpus: &[GpuSnapshot],
    candidates: &[usize],
    fast: bool,
    model: &dyn DegradationModel,
) -> (Option<usize>, Explanation) {
    let mode = if fast {
        Mode::FirstFit
    } else {
        Mode::LeastDegradation
    };
    let mut evals = Vec::with_capacity(candidates.len());
    let mut best: Option<(usize, f64, usize)> = None; // (gpu idx, score, eval idx)
    for &g in candidates {
        let e = evaluate_candidate(cfg, &gpus[g], item, model);
        let score = e.score;
        evals.push(e);
        if let Some(s) = score {
            if fast {
                best = Some((g, s, evals.len() - 1));
                break;
            }
            // Ties keep the lower GPU index (deterministic).
            let better = match best {
                None => true,
                Some((bg, bs, _)) => s < bs || (s == bs && gpus[g].index < gpus[bg].index),
            };
            if better {
                best = Some((g, s, evals.len() - 1));
            }
        }
    }
    let rule = match (&best, fast, candidates.is_empty()) {
        (_, _, true) => Rule::NoGpus,
        (None, _, _) => Rule::NothingFits,
        (Some(_), true, _) => Rule::FirstFit,
        (Some(_), false, _) => Rule::LeastDegradation,
    };
    let (chosen, pt, pf) = match best {
        Some((g, _, ei)) => (Some(g), evals[ei].d_train, evals[ei].d_fn),
        None => (None, None, None),
    };
    let exp = Explanation {
        item: item.id,
        mode,
        rule,
        gpu: chosen.map(|g| gpus[g].index),
        predicted_train: pt,
        predicted_fn: pf,
        predicted_latency_ms: pf.map(|d| item.solo_latency_ms * (1.0 + d)),
        candidates: evals,
    };
    (chosen, exp)
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
    Placed {
        gpu: u32,
    },
    /// Back in the queue; eligible again at `retry_round`.
    Requeued {
        attempts: u32,
        retry_round: u64,
    },
    /// Gave up after `max_attempts`.
    Dropped {
        attempts: u32,
    },
}

/// One decision of a round.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Decision {
    pub item: u64,
    pub outcome: Outcome,
    pub explanation: Explanation,
}

#[derive(Debug, Clone)]
struct Queued {
    item: PendingItem,
    attempts: u32,
    not_before: u64,
}

/// The pending queue plus the seeded RNG: SMORE's scheduling loop.
#[derive(Debug, Clone)]
pub struct Scheduler {
    pub cfg: SchedConfig,
    rng: StdRng,
    queue: Vec<Queued>,
    round: u64,
}

impl Scheduler {
    pub fn new(cfg: SchedConfig, seed: u64) -> Result<Scheduler> {
        cfg.validate()?;
        Ok(Scheduler {
            cfg,
            rng: StdRng::seed_from_u64(seed),
            queue: Vec::new(),
            round: 0,
        })
    }

    pub fn submit(&mut self, item: PendingItem) {
        self.queue.push(Queued {
            item,
            attempts: 0,
            not_before: self.round,
        });
    }

    pub fn queue_len(&self) -> usize {
        self.queue.len()
    }

    pub fn round(&self) -> u64 {
        self.round
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

    /// One scheduling round: eligible items in priority order (ties: lower id first); first fit
    /// when more than `first_fit_queue` are eligible. Placed items are added to `gpus` (memory and
    /// resident list) so later decisions in the round see them; refused items are requeued with
    /// exponential back-off.
    pub fn run_round(
        &mut self,
        gpus: &mut [GpuSnapshot],
        model: &dyn DegradationModel,
    ) -> Vec<Decision> {
        let round = self.round;
        self.round += 1;
        let (mut ready, wait): (Vec<Queued>, Vec<Queued>) = std::mem::take(&mut self.queue)
            .into_iter()
            .partition(|q| q.not_before <= round);
        self.queue = wait;
        let eps = self.cfg.epsilon;
        ready.sort_by(|a, b| {
            b.item
                .priority(eps)
                .total_cmp(&a.item.priority(eps))
                .then(a.item.id.cmp(&b.item.id))
        });
        let fast = ready.len() > self.cfg.first_fit_queue;
        let mut out = Vec::with_capacity(ready.len());
        for mut q in ready {
            let cand = sample_candidates(&mut self.rng, gpus.len(), self.cfg.d);
            let (chosen, exp) = allocate(&self.cfg, &q.item, gpus, &cand, fast, model);
            let outcome = match chosen {
                Some(g) => {
                    let gpu = &mut gpus[g];
                    gpu.used = gpu.used.saturating_add(q.item.memory);
                    gpu.functions.push(Resident {
                        id: q.item.id,
                        key: q.item.key.clone(),
                        slo_ms: q.item.slo_ms,
                        solo_latency_ms: q.item.solo_latency_ms,
                        sm_util: q.item.sm_util,
                    });
                    Outcome::Placed { gpu: gpu.index }
                }
                None => {
                    q.attempts += 1;
                    if self.cfg.max_attempts.is_some_and(|m| q.attempts >= m) {
                        Outcome::Dropped {
                            attempts: q.attempts,
                        }
                    } else {
                        let shift = (q.attempts - 1).min(32);
                        let wait = self
                            .cfg
                            .backoff_base
                            .saturating_mul(1u64 << shift)
                            .min(self.cfg.backoff_max)
                            .max(1);
                        q.not_before = round + wait;
                        let o = Outcome::Requeued {
                            attempts: q.attempts,
                            retry_round: q.not_before,
                        };
                        self.queue.push(q.clone());
                        o
                    }
                }
            };
            out.push(Decision {
                item: q.item.id,
                outcome,
                explanation: exp,
            });
        }
        out
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
    pub sm_util: f64,
    pub solo_latency_ms: f64,
    pub slo_ms: f64,
}

/// Result of share sizing.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ShareDecision {
    /// Largest grid share (percent) meeting both bounds; None if none does.
    pub share: Option<u32>,
    pub predicted_train: f64,
    pub predicted_latency_ms: f64,
    /// Which bound failed when `share` is None: ThetaTrain or Slo.
    pub limited_by: Option<&'static str>,
}

/// Predicted training degradation contributed at `share` percent.
pub fn train_deg_at_share(inp: &ShareInput, share: u32) -> f64 {
    let u = inp.sm_util.max(0.01);
    let s = share as f64 / 100.0;
    inp.correction * inp.d_train_full * (s / u).min(1.0)
}

/// Predicted function latency at `share` percent.
pub fn latency_at_share(inp: &ShareInput, share: u32) -> f64 {
    let u = inp.sm_util.max(0.01);
    let s = (share as f64 / 100.0).max(1e-3);
    inp.solo_latency_ms * (1.0 + inp.d_fn) * (u / s).max(1.0)
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
        limited_by: Some(if theta_ok_any { "slo" } else { "theta_train" }),
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
    let k = keys.len().max(1) as f64;
    gpu.functions
        .iter()
        .enumerate()
        .map(|(j, r)| {
            let d_train_full = match &gpu.training {
                Some(t) => model.train_deg(t, &[&r.key]).unwrap_or(f64::INFINITY),
                None => 0.0,
            };
            let d_fn = model
                .fn_deg(gpu.training.as_ref(), &keys, j)
                .unwrap_or(f64::INFINITY);
            let inp = ShareInput {
                d_train_full,
                theta: cfg.theta_train / k,
                correction: gpu.train_correction,
                d_fn,
                sm_util: r.sm_util,
                solo_latency_ms: r.solo_latency_ms,
                slo_ms: r.slo_ms,
            };
            (r.id, size_share(&cfg.share_grid, &inp))
        })
        .collect()
}

/// Online correction of D̂_train from observed training degradation (e.g. NVML-derived slowdown
/// of the unmodified trainer against its solo profile): an EWMA of observed/predicted, bounded.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Correction {
    pub factor: f64,
    /// EWMA weight of a new observation.
    pub weight: f64,
    pub min: f64,
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
