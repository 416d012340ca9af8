//! `smore eval colocation`: SMORE's co-location comparison (Fig. 14 / thesis Fig. 5.10) replayed
//! in a SIMULATION — the same seeded request trace under exclusive serving, Random, EDF with
//! utilization admission, an ElasticFlow-like EDF with degradation-greedy placement, and SMORE.
//!
//! Owns: the time-stepped simulator (GPUs with one training job each drawn from a trainer
//! utilization [`Mix`], request arrivals, service with interference and SM shares), the baseline
//! policies, the metrics table (DSR, GUI, SFD, SLD) and its median over seeds. SMORE itself is
//! `smore_predictor::sched::Scheduler` (the one implementation), driven one round per step.
//! The same simulator at cluster scale with placement through the Kubernetes scheduler extender
//! (`smore eval cluster`) is [`cluster`].
//!
//! Two models are kept strictly apart (docs/eval.md):
//! - **ground truth**: the synthetic interference model of `smore_predictor::synth` (generalised
//!   to several co-located functions, [`truth`]) plus log-normal noise — what "really" happens;
//! - **predictions**: the predictor's random forests trained on a 20 % sample (α = 0.2, SMORE's
//!   setting) of a noisy synthetic dataset, queried through the lookup table and the multi-way
//!   weights — the only thing the degradation-aware policies see.
//!
//! Must never: present its figures as measurements (every output line says SIMULATED), let a
//! policy read the ground truth, or depend on anything but the seed (no clocks, no threads).
#![forbid(unsafe_code)]

use anyhow::{bail, Context, Result};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use smore_predictor::catalog::Catalog;
use smore_predictor::multiway::SgdConfig;
use smore_predictor::pairwise::{ForestParams, PairModel};
use smore_predictor::sched::{
    GpuSnapshot, PendingItem, Reservation, Resident, Retry, SchedConfig, Scheduler, ThetaWindow,
};
use smore_predictor::synth::{generate, pressure, Pressure, SynthParams};
use smore_predictor::table::PairTable;
use smore_predictor::{DegradationModel, ModelKey, Predictor, Role};
use std::collections::VecDeque;
use std::path::PathBuf;

pub mod cluster;
pub use cluster::{dispatch, EvalCommand};

/// SMORE's reported figures at 16 000 requests/min on RTX 3090s (TPDS 2025 Fig. 14; thesis
/// Fig. 5.10): (policy, DSR, GUI, SFD, SLD) in percent. Measured by the SMORE authors on real
/// GPUs — printed for comparison only.
pub const SMORE_REPORTED: [(&str, f64, f64, f64, f64); 4] = [
    ("Random", 45.0, 29.0, 3.7, 33.0),
    ("EDF-util", 50.0, 28.0, 1.1, 34.0),
    ("ElasticFlow", 66.0, 19.0, 2.5, 21.0),
    ("SMORE", 65.0, 20.0, 1.7, 19.0),
];

/// The trainers' utilization mix of the simulated cluster (docs/eval.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mix {
    /// Production-like: solo SM utilizations spread as in published characterizations of
    /// training clusters ([`PHILLY_QUANTILES`]); each GPU gets the catalog training
    /// configuration nearest its stratified quantile.
    Philly,
    /// Every training configuration that fits, dealt round-robin: mostly ~98 % busy trainers.
    Busy,
}

/// Quantile function of the production-like trainer mix: (fraction of jobs, solo SM
/// utilization), linear in between. Median 0.52 — the median GPU utilization of training jobs in
/// Microsoft's Philly cluster (Jeon et al., USENIX ATC'19, "Analysis of Large-Scale Multi-Tenant
/// GPU Clusters for DNN Training Workloads"); the quartiles (0.20, 0.80) and the ends are this
/// project's assumption giving the wide spread ("many jobs far below") both Philly and Alibaba
/// PAI (Weng et al., NSDI'22) report. Derivation: docs/eval.md.
pub const PHILLY_QUANTILES: [(f64, f64); 5] = [
    (0.0, 0.02),
    (0.25, 0.20),
    (0.5, 0.52),
    (0.75, 0.80),
    (1.0, 0.98),
];

/// The production-like mix's solo utilization at quantile `p` ∈ [0, 1].
pub fn philly_quantile(p: f64) -> f64 {
    let p = p.clamp(0.0, 1.0);
    for w in PHILLY_QUANTILES.windows(2) {
        let ((p0, u0), (p1, u1)) = (w[0], w[1]);
        if p <= p1 {
            return u0 + (u1 - u0) * (p - p0) / (p1 - p0);
        }
    }
    PHILLY_QUANTILES[PHILLY_QUANTILES.len() - 1].1
}

/// `smore eval colocation` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct EvalArgs {
    /// What to evaluate: `colocation` (the default). The cluster run through the scheduler
    /// extender is the subcommand `smore eval cluster`.
    #[arg(value_parser = ["colocation"], default_value = "colocation")]
    pub what: String,
    /// GPUs, each running one training job.
    #[arg(long, default_value_t = 16)]
    pub gpus: usize,
    /// Dedicated inference GPUs of the exclusive (no co-location) baseline.
    #[arg(long)]
    pub exclusive_gpus: Option<usize>,
    /// Request arrival rate (Poisson), requests per minute (SMORE's Fig. 14: 16 000).
    #[arg(long, default_value_t = 16_000.0)]
    pub rate: f64,
    /// Simulated seconds of arrivals (the run then drains for the longest SLO).
    #[arg(long, default_value_t = 60.0)]
    pub seconds: f64,
    /// Simulation step, milliseconds (scheduling rounds happen every step).
    #[arg(long, default_value_t = 1.0)]
    pub step_ms: f64,
    /// GPU type of the catalog whose profiles are used.
    #[arg(long, default_value = "rtx3090")]
    pub gpu_type: String,
    /// Catalog TOML (default: the built-in one).
    #[arg(long)]
    pub catalog: Option<PathBuf>,
    /// SLO = solo latency × a factor drawn per function uniformly from [lo, hi].
    #[arg(long, value_delimiter = ',', default_value = "1.5,3.0")]
    pub slo_factor: Vec<f64>,
    /// θ_train for SMORE.
    #[arg(long, default_value_t = 0.10)]
    pub theta_train: f64,
    /// Power of d for SMORE (chosen by the sweep in docs/eval.md).
    #[arg(long, default_value_t = DEFAULT_D)]
    pub power_of_d: usize,
    /// When SMORE looks at a refused request again: `on-change` (a GPU changed or its slack
    /// halved) or SMORE's blind `backoff` (1, 2, 4 … 64 rounds).
    #[arg(long, value_enum, default_value_t = RetryArg::OnChange)]
    pub retry: RetryArg,
    /// SMORE priorities within a factor (1 + this) are ordered by deadline (0 = exact ties).
    #[arg(long, default_value_t = DEFAULT_DEADLINE_TIE)]
    pub deadline_tie: f64,
    /// SMORE admits a GPU refused on θ_train at a full SM share when a smaller share meets θ_train
    /// and the SLO, and runs the request at that share — the arbiter's step (docs/predictor.md).
    #[arg(long, action = clap::ArgAction::Set, default_value_t = true)]
    pub share_sizing: bool,
    /// SMORE spends θ_train over time: a GPU admits while its predicted training slowdown
    /// averaged over every window of this many ms stays ≤ θ_train (`sched::ThetaWindow`,
    /// docs/eval.md); 0 = SMORE's instantaneous D̂_train ≤ θ_train rule with the θ/k share split.
    #[arg(long, default_value_t = DEFAULT_THETA_WINDOW_MS)]
    pub theta_window: f64,
    /// With `--theta-window`: the cap on the predicted instantaneous slowdown, × θ_train (≥ 1;
    /// `inf` = none).
    #[arg(long, default_value_t = DEFAULT_THETA_PEAK)]
    pub theta_peak: f64,
    /// Trainer utilization mix.
    #[arg(long, value_enum, default_value_t = Mix::Philly)]
    pub mix: Mix,
    /// Several seeds: every figure is the median over them (each metric separately).
    #[arg(long, value_delimiter = ',')]
    pub seeds: Vec<u64>,
    /// Print SMORE's figures for each of these d instead of the table (median over the seeds).
    #[arg(long, value_delimiter = ',')]
    pub sweep_d: Vec<usize>,
    /// σ of the log-normal noise on the ground truth (and on the predictor's training data).
    #[arg(long, default_value_t = 0.15)]
    pub noise: f64,
    /// Trees per forest of the predictor.
    #[arg(long, default_value_t = 100)]
    pub trees: usize,
    /// Seed of the first run (trace, mix and noise); the figures depend on nothing else.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print JSON lines instead of the table.
    #[arg(long)]
    pub json: bool,
}

impl Default for EvalArgs {
    fn default() -> Self {
        EvalArgs {
            what: "colocation".into(),
            gpus: 16,
            exclusive_gpus: None,
            rate: 16_000.0,
            seconds: 60.0,
            step_ms: 1.0,
            gpu_type: "rtx3090".into(),
            catalog: None,
            slo_factor: vec![1.5, 3.0],
            theta_train: 0.10,
            power_of_d: DEFAULT_D,
            retry: RetryArg::OnChange,
            deadline_tie: DEFAULT_DEADLINE_TIE,
            share_sizing: true,
            theta_window: DEFAULT_THETA_WINDOW_MS,
            theta_peak: DEFAULT_THETA_PEAK,
            mix: Mix::Philly,
            seeds: vec![],
            sweep_d: vec![],
            noise: 0.15,
            trees: 100,
            seed: 1,
            json: false,
        }
    }
}

/// SMORE's d in the evaluation: the best DSR of the sweep in docs/eval.md (both mixes).
pub const DEFAULT_D: usize = 16;
/// Near-tie factor of SMORE's priority in the evaluation (docs/eval.md, measured).
pub const DEFAULT_DEADLINE_TIE: f64 = 0.5;

/// Window of SMORE's θ budget in the evaluation, ms (0 = off): chosen by the sweep in
/// docs/eval.md ("Spending θ over time"), the value closest to every target on both mixes.
pub const DEFAULT_THETA_WINDOW_MS: f64 = 150.0;
/// Cap on the predicted instantaneous slowdown under the window, × θ_train (same sweep).
pub const DEFAULT_THETA_PEAK: f64 = 3.0;

/// `--retry`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RetryArg {
    /// SMORE's exponential back-off.
    Backoff,
    /// Re-evaluate when a GPU changed or the slack halved.
    OnChange,
}

/// The policies compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyName {
    /// No co-location: requests run one at a time on dedicated inference GPUs.
    Exclusive,
    /// A uniformly random GPU with memory; no admission control.
    Random,
    /// Earliest deadline first; admit on the least-utilized GPU while Σ solo utilization ≤ 1.
    EdfUtil,
    /// EDF; admit where the predicted latency meets the deadline; least predicted
    /// D̂_train + D̂_fn (degradation-greedy), no bound on training slowdown.
    ElasticFlow,
    /// SMORE Algorithm 1 (priority, power of d, σ, θ_train, SLO, argmin λ, first fit when the
    /// queue is long, requeue with back-off).
    Smore,
}

impl PolicyName {
    /// Every policy, in the order the table prints them.
    pub const ALL: [PolicyName; 5] = [
        PolicyName::Exclusive,
        PolicyName::Random,
        PolicyName::EdfUtil,
        PolicyName::ElasticFlow,
        PolicyName::Smore,
    ];
    /// Name of the policy in the table and in JSON output.
    pub fn label(self) -> &'static str {
        match self {
            PolicyName::Exclusive => "exclusive",
            PolicyName::Random => "random",
            PolicyName::EdfUtil => "edf-util",
            PolicyName::ElasticFlow => "elasticflow",
            PolicyName::Smore => "smore",
        }
    }
}

/// One row of the table (fractions, not percent).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PolicyResult {
    /// The policy's [`PolicyName::label`].
    pub policy: &'static str,
    /// Deadline satisfaction rate: requests done within their SLO / all requests.
    pub dsr: f64,
    /// GPU utilization improvement: mean SM utilization of the training GPUs minus training
    /// alone (percentage points as a fraction).
    pub gui: f64,
    /// Serverful (training) degradation: mean over training jobs of wall time / work − 1.
    pub sfd: f64,
    /// Serverless latency degradation: mean over served requests of service time / solo − 1.
    pub sld: f64,
    /// Requests in the trace.
    pub requests: usize,
    /// Requests whose service completed (within their deadline or not).
    pub served: usize,
    /// Requests that never started: dropped once they could no longer meet their deadline, or
    /// still queued when the trace ended.
    pub dropped: usize,
}

/// A function of the trace.
#[derive(Debug, Clone)]
struct Func {
    key: ModelKey,
    solo_ms: f64,
    util: f64,
    memory: u64,
    slo_ms: f64,
    press: Pressure,
    /// E[D̂_fn] over the trainers of the cluster (SMORE's E[ΔLat]).
    mean_pred_fn: f64,
}

#[derive(Debug, Clone)]
struct Trainer {
    key: ModelKey,
    util: f64,
    memory: u64,
    press: Pressure,
    /// Static ground-truth noise on this trainer's degradation.
    noise: f64,
}

#[derive(Debug, Clone, Copy)]
struct Req {
    id: u64,
    func: usize,
    arrival: f64,
    deadline: f64,
}

#[derive(Debug, Clone)]
struct Running {
    req: Req,
    start: f64,
    /// Solo-time of work left, ms.
    work_left: f64,
    noise: f64,
    /// Fraction of its unthrottled speed its SM time share allows, min(1, share/u) (the share
    /// model of docs/predictor.md); it presses on the GPU in the same proportion. 1 = full.
    rate: f64,
}

struct SimGpu {
    trainer: Option<usize>,
    capacity: u64,
    used: u64,
    running: Vec<Running>,
    /// What predictors see (training key, residents = running requests).
    snap: GpuSnapshot,
    train_work: f64,
    util_sum: f64,
    base_util_sum: f64,
    /// Every reservation SMORE's windowed θ budget made on this GPU (the simulator's
    /// bookkeeping of the predicted slowdown over time; empty without `--theta-window`).
    reservations: Vec<Reservation>,
}

/// What the scheduling core sees of a simulated GPU.
impl AsRef<GpuSnapshot> for SimGpu {
    fn as_ref(&self) -> &GpuSnapshot {
        &self.snap
    }
}

impl SimGpu {
    fn sum_util(&self, funcs: &[Func], trainers: &[Trainer]) -> f64 {
        self.trainer.map_or(0.0, |t| trainers[t].util)
            + self
                .running
                .iter()
                .map(|r| funcs[r.req.func].util * r.rate)
                .sum::<f64>()
    }
}

/// Ground truth: the synthetic interference model of `smore_predictor::synth` generalised to a
/// set of different co-located functions. With c copies of one function it is exactly
/// `synth::interference(t, f, c)`. Returns (δ_train, δ_fn of each function), noiseless.
pub fn truth(train: Option<Pressure>, fns: &[Pressure]) -> (f64, Vec<f64>) {
    if fns.is_empty() {
        return (0.0, vec![]);
    }
    let t = train.unwrap_or(Pressure { sm: 0.0, bw: 0.0 });
    let u_s = 1.0 - fns.iter().map(|f| 1.0 - f.sm).product::<f64>();
    let b_s = fns.iter().map(|f| f.bw).sum::<f64>().min(1.0);
    let o = (t.sm + u_s - 1.0).max(0.0);
    let d_train = if train.is_some() {
        0.35 * t.sm * u_s + 1.5 * o * o + 0.8 * t.bw * b_s
    } else {
        0.0
    };
    let sum_u: f64 = fns.iter().map(|f| f.sm).sum();
    let d_fn = fns
        .iter()
        .map(|f| 0.8 * t.sm + 2.0 * o * o + t.bw * b_s + 0.3 * (sum_u - f.sm))
        .collect();
    (d_train, d_fn)
}

fn normal(rng: &mut StdRng) -> f64 {
    // Box–Muller transform.
    let u1: f64 = rng.gen_range(f64::EPSILON..1.0);
    let u2: f64 = rng.gen();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

/// Everything a run shares across policies: cluster, functions, trace, predictor.
struct Scenario {
    trainers: Vec<Trainer>,
    funcs: Vec<Func>,
    /// (arrival ms, function), sorted.
    trace: Vec<(f64, usize)>,
    predictor: Predictor,
    capacity: u64,
    predictor_rows: usize,
}

fn scenario(a: &EvalArgs) -> Result<Scenario> {
    if a.gpus == 0 {
        bail!("--gpus must be ≥ 1");
    }
    if !(a.rate > 0.0 && a.seconds > 0.0 && a.step_ms > 0.0) {
        bail!("--rate, --seconds and --step-ms must be > 0");
    }
    if a.slo_factor.len() != 2 || !(a.slo_factor[0] >= 1.0 && a.slo_factor[1] >= a.slo_factor[0]) {
        bail!(
            "--slo-factor {:?} must be LO,HI with 1 ≤ LO ≤ HI (e.g. 1.5,3.0)",
            a.slo_factor
        );
    }
    let cat = Catalog::load_or_builtin(a.catalog.as_deref())?;
    let gpu = cat
        .gpus
        .iter()
        .find(|g| g.name == a.gpu_type)
        .cloned()
        .with_context(|| format!("--gpu-type `{}` is not in the catalog", a.gpu_type))?;
    let mut rng = StdRng::seed_from_u64(a.seed);
    // Predictor: forests on an α = 0.2 sample of a noisy synthetic dataset (SMORE's α).
    let ds = generate(
        &cat,
        &SynthParams {
            gpu: gpu.name.clone(),
            seed: a.seed.wrapping_add(1000),
            noise: a.noise,
            max_concurrency: 1,
            date: "synthetic".into(),
        },
    )?;
    let (train_rows, _) = ds.split(0.2, a.seed)?;
    let model = PairModel::train(
        &cat,
        &train_rows,
        &ForestParams {
            n_trees: a.trees.max(1),
            ..ForestParams::default()
        },
        0.2,
        a.seed,
    )?;
    let table = PairTable::build(&cat, &model, &gpu.name)?;
    let predictor = Predictor::new(table, SgdConfig::default());
    let prof = |k: &ModelKey, role| {
        let m = cat.model(&k.model).expect("configs() lists catalog models");
        let p = cat.profile(&gpu.name, k, role).expect("profiled");
        (
            p.latency_ms,
            p.sm_util,
            p.memory_bytes,
            pressure(&gpu, m, p),
        )
    };
    // Trainers: training configurations whose memory leaves room (≤ 60 % of the GPU), after a
    // seeded shuffle; `busy` deals them round-robin, `philly` gives each GPU the configuration
    // whose solo utilization is nearest a stratified quantile of the production-like mix.
    let mut tkeys: Vec<ModelKey> = cat
        .configs(&gpu.name, Role::Training)
        .into_iter()
        .filter(|k| (prof(k, Role::Training).2 as f64) <= 0.6 * gpu.memory_bytes as f64)
        .collect();
    if tkeys.is_empty() {
        bail!("no training configuration of `{}` fits", gpu.name);
    }
    tkeys.shuffle(&mut rng);
    let dealt: Vec<ModelKey> = match a.mix {
        Mix::Busy => (0..a.gpus)
            .map(|i| tkeys[i % tkeys.len()].clone())
            .collect(),
        Mix::Philly => {
            let mut targets: Vec<f64> = (0..a.gpus)
                .map(|i| philly_quantile((i as f64 + 0.5) / a.gpus as f64))
                .collect();
            targets.shuffle(&mut rng);
            targets
                .iter()
                .map(|&u| {
                    tkeys
                        .iter()
                        .min_by(|x, y| {
                            let dx = (prof(x, Role::Training).1 - u).abs();
                            let dy = (prof(y, Role::Training).1 - u).abs();
                            dx.total_cmp(&dy)
                        })
                        .expect("tkeys is not empty")
                        .clone()
                })
                .collect()
        }
    };
    let trainers: Vec<Trainer> = dealt
        .into_iter()
        .map(|key| {
            let (_, util, memory, press) = prof(&key, Role::Training);
            Trainer {
                key,
                util,
                memory,
                press,
                noise: (a.noise * normal(&mut rng)).exp(),
            }
        })
        .collect();
    // Functions: every model at inference batches 1, 4 and 8.
    let fkeys: Vec<ModelKey> = cat
        .configs(&gpu.name, Role::Inference)
        .into_iter()
        .filter(|k| k.batch <= 8)
        .collect();
    let mut funcs: Vec<Func> = fkeys
        .into_iter()
        .map(|key| {
            let (solo_ms, util, memory, press) = prof(&key, Role::Inference);
            let f = rng.gen_range(a.slo_factor[0]..=a.slo_factor[1]);
            let preds: Vec<f64> = trainers
                .iter()
                .filter_map(|t| predictor.fn_deg(Some(&t.key), &[&key], 0))
                .collect();
            Func {
                mean_pred_fn: preds.iter().sum::<f64>() / preds.len().max(1) as f64,
                key,
                solo_ms,
                util,
                memory,
                slo_ms: solo_ms * f,
                press,
            }
        })
        .collect();
    funcs.shuffle(&mut rng);
    // Popularity: Zipf(1) over the shuffled functions (serverless traces are heavy-tailed).
    let weights: Vec<f64> = (1..=funcs.len()).map(|r| 1.0 / r as f64).collect();
    let wsum: f64 = weights.iter().sum();
    let rate_per_ms = a.rate / 60_000.0;
    let horizon = a.seconds * 1e3;
    let mut trace = Vec::new();
    let mut t = 0.0;
    loop {
        let u: f64 = rng.gen_range(f64::EPSILON..1.0);
        t += -u.ln() / rate_per_ms;
        if t >= horizon {
            break;
        }
        let mut x = rng.gen::<f64>() * wsum;
        let mut f = 0;
        while f + 1 < weights.len() && x >= weights[f] {
            x -= weights[f];
            f += 1;
        }
        trace.push((t, f));
    }
    Ok(Scenario {
        trainers,
        funcs,
        trace,
        predictor,
        capacity: gpu.memory_bytes,
        predictor_rows: train_rows.rows.len(),
    })
}

fn new_gpu(index: u32, trainer: Option<usize>, sc: &Scenario) -> SimGpu {
    let used = trainer.map_or(0, |t| sc.trainers[t].memory);
    SimGpu {
        trainer,
        capacity: sc.capacity,
        used,
        running: Vec::new(),
        snap: GpuSnapshot {
            index,
            capacity: sc.capacity,
            used,
            training: trainer.map(|t| sc.trainers[t].key.clone()),
            functions: Vec::new(),
            train_correction: 1.0,
        },
        train_work: 0.0,
        util_sum: 0.0,
        base_util_sum: 0.0,
        reservations: Vec::new(),
    }
}

/// σ (SMORE's memory safety factor, 0.95) for every policy: none may overcommit memory.
const SIGMA: f64 = 0.95;

fn fits(g: &SimGpu, mem: u64) -> bool {
    (g.used + mem) as f64 <= SIGMA * g.capacity as f64
}

fn start(g: &mut SimGpu, req: Req, now: f64, sc: &Scenario, rng: &mut StdRng, noise: f64) {
    start_at(g, req, now, sc, rng, noise, 1.0);
}

/// Starts `req` on `g` throttled to `rate` of its speed ([`Running::rate`]).
fn start_at(
    g: &mut SimGpu,
    req: Req,
    now: f64,
    sc: &Scenario,
    rng: &mut StdRng,
    noise: f64,
    rate: f64,
) {
    let f = &sc.funcs[req.func];
    g.used += f.memory;
    g.snap.used = g.used;
    g.snap.functions.push(Resident {
        id: req.id,
        key: f.key.clone(),
        slo_ms: f.slo_ms,
        solo_latency_ms: f.solo_ms,
        sm_util: f.util,
    });
    g.running.push(Running {
        req,
        start: now.max(req.arrival),
        work_left: f.solo_ms,
        noise: (noise * normal(rng)).exp(),
        rate,
    });
}

/// Runs one policy over the scenario's trace.
fn simulate(
    policy: PolicyName,
    sc: &Scenario,
    a: &EvalArgs,
    exclusive_gpus: usize,
) -> Result<PolicyResult> {
    Ok(simulate_gpus(policy, sc, a, exclusive_gpus)?.0)
}

/// SMORE's scheduler settings from the flags.
fn smore_config(a: &EvalArgs) -> SchedConfig {
    SchedConfig {
        d: a.power_of_d.max(1),
        sigma: SIGMA,
        theta_train: a.theta_train,
        retry: match a.retry {
            RetryArg::Backoff => Retry::Backoff,
            RetryArg::OnChange => Retry::OnChange,
        },
        deadline_tie: a.deadline_tie,
        share_sizing: a.share_sizing,
        window: (a.theta_window > 0.0).then_some(ThetaWindow {
            window_ms: a.theta_window,
            peak: a.theta_peak,
        }),
        ..SchedConfig::default()
    }
}

/// [`simulate`], also returning the training GPUs (their bookkeeping, for tests).
fn simulate_gpus(
    policy: PolicyName,
    sc: &Scenario,
    a: &EvalArgs,
    exclusive_gpus: usize,
) -> Result<(PolicyResult, Vec<SimGpu>)> {
    let seed = a.seed ^ 0x9e37_79b9_7f4a_7c15;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut gpus: Vec<SimGpu> = (0..a.gpus)
        .map(|i| new_gpu(i as u32, Some(i), sc))
        .collect();
    // Exclusive serving runs requests on dedicated GPUs, one at a time.
    let mut dedicated: Vec<SimGpu> = (0..exclusive_gpus)
        .map(|i| new_gpu((a.gpus + i) as u32, None, sc))
        .collect();
    let cfg = smore_config(a);
    // SMORE's queue, priority order and requeueing are `sched::Scheduler`'s (the only
    // implementation); the other policies keep their requests in `pending`.
    let mut smore: Option<Scheduler<Req>> = match policy {
        PolicyName::Smore => Some(Scheduler::new(cfg.clone(), seed).context(
            "SMORE's settings (--power-of-d, --theta-train, --deadline-tie, --theta-window, \
             --theta-peak) are out of range",
        )?),
        _ => None,
    };
    let dt = a.step_ms;
    let horizon = a.seconds * 1e3;
    let max_slo = sc.funcs.iter().map(|f| f.slo_ms).fold(0.0, f64::max);
    let end = horizon + 2.0 * max_slo + dt;
    let mut pending: VecDeque<Req> = VecDeque::new();
    let mut next = 0usize;
    let mut dropped = 0usize;
    let mut tally = Tally::default();
    let mut now = 0.0;
    let mut steps_in_horizon = 0u64;
    while now < end {
        // 1. arrivals of this step
        while next < sc.trace.len() && sc.trace[next].0 < now + dt {
            let (t, f) = sc.trace[next];
            let r = Req {
                id: next as u64,
                func: f,
                arrival: t,
                deadline: t + sc.funcs[f].slo_ms,
            };
            match &mut smore {
                Some(s) => s.submit_with(item_of(&r, &sc.funcs[f], now), r),
                None => pending.push_back(r),
            }
            next += 1;
        }
        // 2. requests that can no longer start in time are dropped (missed)
        let alive = |r: &Req| r.deadline - now >= sc.funcs[r.func].solo_ms;
        let before = pending.len();
        pending.retain(alive);
        dropped += before - pending.len();
        // 3. the policy places what it can
        match &mut smore {
            Some(s) => {
                // A queued request's SLO is the time left to its deadline.
                dropped += s.retain(|item, r| {
                    item.slo_ms = r.deadline - now;
                    alive(r)
                });
                s.run_round_at(&mut gpus, &sc.predictor, now, |g, item, r, p| {
                    // The share the scheduler granted (share sizing or the θ budget's).
                    let rate = p
                        .share
                        .map_or(1.0, |s| smore_predictor::sched::work_rate(s, item.sm_util));
                    g.reservations.extend(p.reservation);
                    start_at(g, r, now, sc, &mut rng, a.noise, rate)
                });
            }
            None => place(
                policy,
                &mut pending,
                &mut gpus,
                &mut dedicated,
                sc,
                now,
                &mut rng,
                a.noise,
            ),
        }
        // 4. service with ground-truth interference
        serve(
            gpus.iter_mut().chain(dedicated.iter_mut()),
            sc,
            now,
            dt,
            horizon,
            &mut tally,
        );
        if now < horizon {
            steps_in_horizon += 1;
        }
        now += dt;
    }
    dropped += pending.len() + smore.as_ref().map_or(0, |s| s.queue_len());
    let result = result_of(
        policy.label(),
        &gpus,
        steps_in_horizon,
        dt,
        sc.trace.len(),
        &tally,
        dropped,
    );
    Ok((result, gpus))
}

/// Served requests so far: the numerators of DSR and SLD.
#[derive(Debug, Default)]
struct Tally {
    /// Requests finished within their deadline.
    ok: usize,
    /// Requests finished.
    served: usize,
    /// Σ of served requests' service time / solo − 1.
    sld_sum: f64,
}

/// One step of service with ground-truth interference on `gpus` (every policy's, and the
/// cluster evaluation's): trainers progress, running requests progress and complete.
fn serve<'a>(
    gpus: impl Iterator<Item = &'a mut SimGpu>,
    sc: &Scenario,
    now: f64,
    dt: f64,
    horizon: f64,
    tally: &mut Tally,
) {
    for g in gpus {
        let tp = g.trainer.map(|t| sc.trainers[t].press);
        let ps: Vec<Pressure> = g
            .running
            .iter()
            .map(|r| {
                let p = sc.funcs[r.req.func].press;
                Pressure {
                    sm: p.sm * r.rate,
                    bw: p.bw * r.rate,
                }
            })
            .collect();
        let (d_train, d_fn) = truth(tp, &ps);
        if let Some(t) = g.trainer {
            let tr = &sc.trainers[t];
            if now < horizon {
                g.train_work += dt / (1.0 + d_train * tr.noise);
                g.util_sum += g.sum_util(&sc.funcs, &sc.trainers).min(1.0);
                g.base_util_sum += tr.util;
            }
        }
        // Each request progresses at 1/(1 + δ) of its solo speed from its start (which may
        // lie inside this step); `slow` keeps the factor to interpolate its completion.
        let mut slow = Vec::with_capacity(g.running.len());
        for (i, r) in g.running.iter_mut().enumerate() {
            let x = (1.0 + d_fn[i] * r.noise) / r.rate;
            let from = r.start.max(now);
            r.work_left -= (now + dt - from) / x;
            slow.push(x);
        }
        let mut k = 0;
        while k < g.running.len() {
            if g.running[k].work_left <= 1e-12 {
                let r = g.running.swap_remove(k);
                let x = slow.swap_remove(k);
                let f = &sc.funcs[r.req.func];
                // Completion inside this step, interpolated at this step's speed.
                let done = now + dt + r.work_left.min(0.0) * x;
                tally.served += 1;
                if done <= r.req.deadline + 1e-9 {
                    tally.ok += 1;
                }
                let d = (done - r.start) / f.solo_ms - 1.0;
                // Float rounding of an undisturbed request is not degradation.
                tally.sld_sum += if d > 1e-9 { d } else { 0.0 };
                g.used -= f.memory;
                g.snap.used = g.used;
                if let Some(p) = g.snap.functions.iter().position(|x| x.id == r.req.id) {
                    g.snap.functions.swap_remove(p);
                }
            } else {
                k += 1;
            }
        }
    }
}

/// The row of a finished run: `requests` in the trace, `dropped` of them never started.
fn result_of(
    policy: &'static str,
    gpus: &[SimGpu],
    steps_in_horizon: u64,
    dt: f64,
    requests: usize,
    t: &Tally,
    dropped: usize,
) -> PolicyResult {
    let horizon_ms = steps_in_horizon as f64 * dt;
    let sfd = gpus
        .iter()
        .map(|g| (horizon_ms / g.train_work.max(1e-9) - 1.0).max(0.0))
        .sum::<f64>()
        / gpus.len() as f64;
    let gui = gpus
        .iter()
        .map(|g| (g.util_sum - g.base_util_sum) / steps_in_horizon.max(1) as f64)
        .sum::<f64>()
        / gpus.len() as f64;
    PolicyResult {
        policy,
        dsr: t.ok as f64 / requests.max(1) as f64,
        gui,
        sfd,
        sld: if t.served > 0 {
            t.sld_sum / t.served as f64
        } else {
            0.0
        },
        requests,
        served: t.served,
        dropped,
    }
}

#[allow(clippy::too_many_arguments)]
fn place(
    policy: PolicyName,
    pending: &mut VecDeque<Req>,
    gpus: &mut [SimGpu],
    dedicated: &mut [SimGpu],
    sc: &Scenario,
    now: f64,
    rng: &mut StdRng,
    noise: f64,
) {
    let edf = |p: &mut VecDeque<Req>| {
        p.make_contiguous()
            .sort_by(|a, b| a.deadline.total_cmp(&b.deadline).then(a.id.cmp(&b.id)));
    };
    let mut left = VecDeque::with_capacity(pending.len());
    match policy {
        PolicyName::Exclusive => {
            edf(pending);
            while let Some(r) = pending.pop_front() {
                match dedicated
                    .iter_mut()
                    .find(|g| g.running.is_empty() && fits(g, sc.funcs[r.func].memory))
                {
                    Some(g) => start(g, r, now, sc, rng, noise),
                    None => left.push_back(r),
                }
            }
        }
        PolicyName::Random => {
            while let Some(r) = pending.pop_front() {
                let mem = sc.funcs[r.func].memory;
                let ok: Vec<usize> = (0..gpus.len()).filter(|&i| fits(&gpus[i], mem)).collect();
                match ok.choose(rng) {
                    Some(&i) => start(&mut gpus[i], r, now, sc, rng, noise),
                    None => left.push_back(r),
                }
            }
        }
        PolicyName::EdfUtil => {
            edf(pending);
            while let Some(r) = pending.pop_front() {
                let f = &sc.funcs[r.func];
                let best = (0..gpus.len())
                    .filter(|&i| fits(&gpus[i], f.memory))
                    .map(|i| (i, gpus[i].sum_util(&sc.funcs, &sc.trainers)))
                    .filter(|&(_, u)| u + f.util <= 1.0)
                    .min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
                match best {
                    Some((i, _)) => start(&mut gpus[i], r, now, sc, rng, noise),
                    None => left.push_back(r),
                }
            }
        }
        PolicyName::ElasticFlow => {
            edf(pending);
            while let Some(r) = pending.pop_front() {
                let f = &sc.funcs[r.func];
                let item = item_of(&r, f, now);
                let mut best: Option<(usize, f64)> = None;
                for (i, g) in gpus.iter().enumerate() {
                    if !fits(g, f.memory) {
                        continue;
                    }
                    let mut keys: Vec<&ModelKey> =
                        g.snap.functions.iter().map(|x| &x.key).collect();
                    keys.push(&item.key);
                    let j = keys.len() - 1;
                    let (Some(dt), Some(df)) = (
                        g.snap
                            .training
                            .as_ref()
                            .map_or(Some(0.0), |t| sc.predictor.train_deg(t, &keys)),
                        sc.predictor.fn_deg(g.snap.training.as_ref(), &keys, j),
                    ) else {
                        continue;
                    };
                    if f.solo_ms * (1.0 + df) > item.slo_ms {
                        continue;
                    }
                    let s = dt + df;
                    if best.is_none_or(|(_, b)| s < b) {
                        best = Some((i, s));
                    }
                }
                match best {
                    Some((i, _)) => start(&mut gpus[i], r, now, sc, rng, noise),
                    None => left.push_back(r),
                }
            }
        }
        // SMORE's requests queue in `sched::Scheduler` (see `simulate`): none arrive here.
        PolicyName::Smore => left.extend(pending.drain(..)),
    }
    *pending = left;
}

/// A pending request as Algorithm 1 sees it: its SLO is the time left to its deadline.
fn item_of(r: &Req, f: &Func, now: f64) -> PendingItem {
    PendingItem {
        id: r.id,
        key: f.key.clone(),
        slo_ms: r.deadline - now,
        solo_latency_ms: f.solo_ms,
        sm_util: f.util,
        memory: f.memory,
        expected_util_gain: f.util,
        expected_degradation: f.mean_pred_fn,
    }
}

/// The seeds of a run: `--seeds`, else `--seed`.
fn seeds(a: &EvalArgs) -> Vec<u64> {
    if a.seeds.is_empty() {
        vec![a.seed]
    } else {
        a.seeds.clone()
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => 0.0,
        _ if n % 2 == 1 => v[n / 2],
        _ => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Per policy, the median of each metric over the seeds' rows (`runs[seed][policy]`).
fn median_rows(runs: &[Vec<PolicyResult>]) -> Vec<PolicyResult> {
    let m = |f: &dyn Fn(&PolicyResult) -> f64, i: usize| {
        median(runs.iter().map(|r| f(&r[i])).collect())
    };
    (0..runs[0].len())
        .map(|i| PolicyResult {
            policy: runs[0][i].policy,
            dsr: m(&|r| r.dsr, i),
            gui: m(&|r| r.gui, i),
            sfd: m(&|r| r.sfd, i),
            sld: m(&|r| r.sld, i),
            requests: m(&|r| r.requests as f64, i).round() as usize,
            served: m(&|r| r.served as f64, i).round() as usize,
            dropped: m(&|r| r.dropped as f64, i).round() as usize,
        })
        .collect()
}

/// The whole comparison: one row per policy, same trace per seed; with several seeds each figure
/// is the median over them.
pub fn evaluate(a: &EvalArgs) -> Result<(Vec<PolicyResult>, String)> {
    let excl = a.exclusive_gpus.unwrap_or(a.gpus.div_ceil(4)).max(1);
    let seeds = seeds(a);
    let mut runs = Vec::with_capacity(seeds.len());
    let mut requests = Vec::new();
    let mut info = (0, 0);
    for &seed in &seeds {
        let a = EvalArgs { seed, ..a.clone() };
        let sc = scenario(&a)?;
        requests.push(sc.trace.len().to_string());
        info = (sc.funcs.len(), sc.predictor_rows);
        runs.push(
            PolicyName::ALL
                .iter()
                .map(|&p| simulate(p, &sc, &a, excl))
                .collect::<Result<Vec<_>>>()?,
        );
    }
    let rows = median_rows(&runs);
    let seed_list: Vec<String> = seeds.iter().map(|s| s.to_string()).collect();
    let header = format!(
        "SIMULATED — ground truth = synthetic interference model (predictor::synth), not a GPU \
         measurement.\n{} GPUs ({} profiles, estimated) each running one training job, trainer \
         mix `{}`; {} requests/min for {} s ({} requests) over {} functions; SLO = solo × U[{}, \
         {}]; exclusive serves on {} dedicated GPUs; seed{} {}{}.\nPredictions: random forests \
         ({} trees) on {} SYNTHETIC rows (α = 0.2); θ_train = {}, d = {}, retry {:?}, \
         deadline tie {}, share sizing {}, θ window {}.",
        a.gpus,
        a.gpu_type,
        mix_label(a.mix),
        a.rate,
        a.seconds,
        requests.join("/"),
        info.0,
        a.slo_factor[0],
        a.slo_factor[1],
        excl,
        if seeds.len() > 1 { "s" } else { "" },
        seed_list.join(","),
        if seeds.len() > 1 {
            " (every figure: the median over the seeds)"
        } else {
            ""
        },
        a.trees,
        info.1,
        a.theta_train,
        a.power_of_d,
        a.retry,
        a.deadline_tie,
        a.share_sizing,
        theta_window_label(a)
    );
    Ok((rows, header))
}

fn theta_window_label(a: &EvalArgs) -> String {
    if a.theta_window > 0.0 {
        format!("{} ms (peak {} θ)", a.theta_window, a.theta_peak)
    } else {
        "off".into()
    }
}

fn mix_label(m: Mix) -> &'static str {
    match m {
        Mix::Philly => "philly",
        Mix::Busy => "busy",
    }
}

/// SMORE's figures for each d of `--sweep-d` (median over the seeds): (d, row).
pub fn sweep_d(a: &EvalArgs) -> Result<Vec<(usize, PolicyResult)>> {
    let excl = a.exclusive_gpus.unwrap_or(a.gpus.div_ceil(4)).max(1);
    let mut per_d: Vec<Vec<Vec<PolicyResult>>> = vec![Vec::new(); a.sweep_d.len()];
    for seed in seeds(a) {
        let a = EvalArgs { seed, ..a.clone() };
        let sc = scenario(&a)?;
        for (k, &d) in a.sweep_d.iter().enumerate() {
            let a = EvalArgs {
                power_of_d: d,
                ..a.clone()
            };
            per_d[k].push(vec![simulate(PolicyName::Smore, &sc, &a, excl)?]);
        }
    }
    Ok(a.sweep_d
        .iter()
        .zip(per_d)
        .map(|(&d, runs)| (d, median_rows(&runs).remove(0)))
        .collect())
}

/// Formats the table (percent).
pub fn table(rows: &[PolicyResult], header: &str) -> String {
    let mut s = String::new();
    s.push_str(header);
    s.push('\n');
    s.push_str(&format!(
        "{:<12} {:>7} {:>7} {:>7} {:>7} {:>9} {:>9} {:>9}\n",
        "policy", "DSR", "GUI", "SFD", "SLD", "requests", "served", "dropped"
    ));
    for r in rows {
        s.push_str(&format!(
            "{:<12} {:>6.1}% {:>6.1}% {:>6.1}% {:>6.1}% {:>9} {:>9} {:>9}\n",
            r.policy,
            r.dsr * 100.0,
            r.gui * 100.0,
            r.sfd * 100.0,
            r.sld * 100.0,
            r.requests,
            r.served,
            r.dropped
        ));
    }
    s.push_str("SMORE's reported figures (measured by its authors, RTX 3090, 16 000 req/min; DSR/GUI/SFD/SLD): ");
    let rep: Vec<String> = SMORE_REPORTED
        .iter()
        .map(|(n, d, g, f, l)| format!("{n} {d}/{g}/{f}/{l} %"))
        .collect();
    s.push_str(&rep.join(", "));
    s.push('\n');
    s
}

/// `smore eval colocation`.
pub fn run(a: EvalArgs) -> Result<()> {
    if !a.sweep_d.is_empty() {
        println!(
            "SIMULATED — smore with each d (mix `{}`, {} GPUs, {} req/min, seeds {:?}, median):",
            mix_label(a.mix),
            a.gpus,
            a.rate,
            seeds(&a)
        );
        println!(
            "{:>4} {:>7} {:>7} {:>7} {:>7}",
            "d", "DSR", "GUI", "SFD", "SLD"
        );
        for (d, r) in sweep_d(&a)? {
            println!(
                "{d:>4} {:>6.1}% {:>6.1}% {:>6.1}% {:>6.1}%",
                r.dsr * 100.0,
                r.gui * 100.0,
                r.sfd * 100.0,
                r.sld * 100.0
            );
        }
        return Ok(());
    }
    let (rows, header) = evaluate(&a)?;
    if a.json {
        for r in &rows {
            let mut v = serde_json::to_value(r)?;
            v["simulated"] = serde_json::json!(true);
            println!("{v}");
        }
    } else {
        print!("{}", table(&rows, &header));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use smore_predictor::synth::interference;

    fn small() -> EvalArgs {
        EvalArgs {
            gpus: 4,
            rate: 3000.0,
            seconds: 4.0,
            trees: 10,
            ..EvalArgs::default()
        }
    }

    #[test]
    fn ground_truth_is_the_synthetic_model() {
        let t = Pressure { sm: 0.7, bw: 0.3 };
        let f = Pressure { sm: 0.4, bw: 0.2 };
        for c in 1..=3u32 {
            let (dt, df) = truth(Some(t), &vec![f; c as usize]);
            let (et, ef) = interference(t, f, c);
            assert!(
                (dt - et).abs() < 1e-12 && (df[0] - ef).abs() < 1e-12,
                "c = {c}"
            );
        }
        assert_eq!(truth(None, &[f]).1, vec![0.0]);
        assert_eq!(truth(Some(t), &[]).0, 0.0);
    }

    #[test]
    fn the_table_is_produced_and_exclusive_costs_training_nothing() {
        let a = small();
        let (rows, header) = evaluate(&a).unwrap();
        assert_eq!(rows.len(), 5);
        let ex = &rows[0];
        assert_eq!(ex.policy, "exclusive");
        assert_eq!(ex.sfd, 0.0);
        assert_eq!(ex.gui, 0.0);
        assert_eq!(ex.sld, 0.0);
        for r in &rows {
            assert!(r.requests > 0);
            assert_eq!(r.served + r.dropped, r.requests, "{r:?}");
            assert!((0.0..=1.0).contains(&r.dsr), "{r:?}");
        }
        // Co-location raises utilization of the training GPUs; SMORE keeps training within θ.
        let sm = rows.iter().find(|r| r.policy == "smore").unwrap();
        assert!(sm.gui > 0.0, "{sm:?}");
        let text = table(&rows, &header);
        assert!(text.contains("SIMULATED"));
        for p in [
            "exclusive",
            "random",
            "edf-util",
            "elasticflow",
            "smore",
            "DSR",
            "SLD",
        ] {
            assert!(text.contains(p), "{text}");
        }
    }

    #[test]
    fn the_philly_mix_has_the_documented_distribution_and_busy_stays_busy() {
        assert_eq!(philly_quantile(0.0), 0.02);
        assert_eq!(philly_quantile(0.5), 0.52);
        assert!(
            (philly_quantile(0.375) - 0.36).abs() < 1e-12,
            "linear between knots"
        );
        assert_eq!(philly_quantile(1.0), 0.98);
        let utils = |mix| {
            let a = EvalArgs {
                gpus: 16,
                trees: 1,
                seconds: 0.1,
                mix,
                ..EvalArgs::default()
            };
            let mut u: Vec<f64> = scenario(&a)
                .unwrap()
                .trainers
                .iter()
                .map(|t| t.util)
                .collect();
            u.sort_by(f64::total_cmp);
            u
        };
        let u = utils(Mix::Philly);
        // Each GPU's trainer is the catalog configuration nearest its stratified quantile; the
        // catalog's utilizations are discrete, so allow its gaps.
        let med = (u[7] + u[8]) / 2.0;
        assert!((med - 0.52).abs() <= 0.12, "median {med}: {u:?}");
        assert!(
            u.iter().filter(|&&x| x <= 0.25).count() >= 4,
            "≥ a quarter far below: {u:?}"
        );
        assert!(
            u.iter().filter(|&&x| x >= 0.75).count() >= 4,
            "≥ a quarter busy: {u:?}"
        );
        let b = utils(Mix::Busy);
        assert!((b[7] + b[8]) / 2.0 >= 0.9, "busy: mostly ~98 % busy: {b:?}");
    }

    #[test]
    fn several_seeds_report_the_median() {
        let a = EvalArgs {
            seconds: 1.0,
            ..small()
        };
        let one = |seed| evaluate(&EvalArgs { seed, ..a.clone() }).unwrap().0;
        let (r1, r2, r3) = (one(1), one(2), one(3));
        let (m, header) = evaluate(&EvalArgs {
            seeds: vec![1, 2, 3],
            ..a.clone()
        })
        .unwrap();
        assert!(header.contains("median"), "{header}");
        for i in 0..m.len() {
            let mut v = [r1[i].dsr, r2[i].dsr, r3[i].dsr];
            v.sort_by(f64::total_cmp);
            assert_eq!(m[i].dsr, v[1], "{}", m[i].policy);
        }
    }

    #[test]
    fn runs_are_reproducible() {
        let a = EvalArgs {
            seconds: 2.0,
            ..small()
        };
        assert_eq!(evaluate(&a).unwrap().0, evaluate(&a).unwrap().0);
    }

    /// The windowed θ budget's bookkeeping over a whole simulated run: no window of any GPU
    /// ever holds a predicted mean slowdown above θ, while the predicted instantaneous slowdown
    /// does exceed θ (the budget is spent over time, not per co-location).
    #[test]
    fn the_theta_window_keeps_every_windows_predicted_mean_within_theta() {
        let a = EvalArgs {
            gpus: 2,
            rate: 6000.0,
            seconds: 3.0,
            theta_window: 50.0,
            theta_peak: f64::INFINITY,
            ..small()
        };
        let sc = scenario(&a).unwrap();
        let (r, gpus) = simulate_gpus(PolicyName::Smore, &sc, &a, 1).unwrap();
        assert!(r.served > 0, "{r:?}");
        let w = a.theta_window;
        let (mut n, mut peak) = (0, 0.0f64);
        for g in &gpus {
            let res = &g.reservations;
            n += res.len();
            let mass = |t: f64| res.iter().map(|x| x.mass_in(t, w)).sum::<f64>();
            for x in res {
                // S(t) is piecewise linear: its maxima lie on these breakpoints.
                for t in [x.start_ms, x.end_ms, x.start_ms + w, x.end_ms + w] {
                    assert!(
                        mass(t) / w <= a.theta_train + 1e-9,
                        "gpu {}: mean {} over [{}, {t})",
                        g.snap.index,
                        mass(t) / w,
                        t - w
                    );
                }
                let at = res
                    .iter()
                    .filter(|y| y.start_ms <= x.start_ms && x.start_ms < y.end_ms)
                    .map(|y| y.rate)
                    .sum::<f64>();
                peak = peak.max(at);
            }
        }
        assert!(n > 10, "the budget was used: {n} reservations");
        assert!(peak > a.theta_train, "instantaneous peak {peak}");
    }

    #[test]
    fn bad_arguments_name_the_flag() {
        let a = EvalArgs {
            slo_factor: vec![0.5, 2.0],
            ..small()
        };
        let e = format!("{:#}", evaluate(&a).err().unwrap());
        assert!(e.contains("--slo-factor"), "{e}");
        let a = EvalArgs {
            gpu_type: "tpu".into(),
            ..small()
        };
        assert!(format!("{:#}", evaluate(&a).err().unwrap()).contains("--gpu-type"));
        let a = EvalArgs {
            theta_peak: 0.5,
            ..small()
        };
        let e = format!("{:#}", evaluate(&a).err().unwrap());
        assert!(
            e.contains("--theta-peak") && e.contains("window.peak"),
            "{e}"
        );
    }
}
