//! `smore eval cluster`: the co-location simulation of `smore eval colocation` at cluster scale
//! (default 128 nodes × 8 GPUs), with every function pod placed the way Kubernetes places it
//! with smore — the scheduler extender's filter and prioritize over the nodes' published views,
//! then the chosen node's arbiter policy — beside the node-local figure (one Algorithm 1 with
//! the whole cluster visible, what `eval colocation`'s smore does) on the same trace, trainers
//! and GPUs. SIMULATED: docs/kubernetes.md, "Scale".
//!
//! Owns: the cluster run — nodes and their publish rounds (views refreshed every `--publish-ms`
//! of simulated time, so decisions see state as stale as the extender's poll makes it), down
//! and frozen arbiters, kube-scheduler's part (the nodes it sends the extender, the top score,
//! the back-off of an unschedulable pod), the bursty trace scaled to the cluster, and the report
//! (DSR / GUI / SFD / SLD, pods pending / unschedulable / refused, decision latency p50 / p99).
//!
//! Must never: re-implement a placement rule — the filter and the scores are
//! `smore_k8s::extender::Extender::filter_at` / `prioritize_at`, the node's choice is
//! `SmorePolicy::place_at`, the service model and metrics are the colocation simulator's
//! (`serve`, `result_of` in lib.rs); or let anything but the seed decide (simulated time
//! is what the extender's staleness and the policy's fast-mode window see; wall time is only
//! measured, for the decision latency).
//!
//! The unit of placement is the request, as in `eval colocation` and SMORE (each invocation is
//! placed by Algorithm 1 and is a resident while it runs): here each invocation is a pod. A real
//! platform keeps warm instances that serve many requests; that is not modelled (docs).

use super::*;
use smore_arbiter::policy::{Ask, Decision, GpuView, GrantView};
use smore_arbiter::smore_policy::SmorePolicy;
use smore_k8s::bench::function_pod;
use smore_k8s::extender::{Extender, ExtenderArgs, ExtenderConfig};
use smore_k8s::nodes::{NodeTable, DEFAULT_POLL_INTERVAL_S, DEFAULT_STALE_AFTER_S};
use smore_k8s::resources::MEMORY_UNIT_BYTES;
use smore_predictor::sched;
use smore_prewarm::synth::{superposed_arrivals, TraceClass};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Requests per minute per GPU: `eval colocation`'s 16 000 requests/min over its 16 GPUs, so a
/// GPU of the cluster sees the load a GPU of that table sees.
pub const DEFAULT_RATE_PER_GPU: f64 = 1000.0;
/// Seconds of trace by default (170 666 requests at 1 024 GPUs): the full-scale run (128 × 8
/// GPUs, both paths, one seed) then took 68–101 s wall in a release build on the project's
/// shared 2-core machine (load average 5–8; docs/kubernetes.md, "Scale").
pub const DEFAULT_SECONDS: f64 = 10.0;
/// The classes of the demo's functions (docs/harvest.md: resnet50 diurnal, bert mixed,
/// mobilenet timer), dealt to the cluster's functions in popularity order.
const CLASSES: [TraceClass; 3] = [TraceClass::Diurnal, TraceClass::Mixed, TraceClass::Timer];
/// Independent generated series per function (the demo's `SOURCES_PER_FUNCTION`, same reason:
/// docs/harvest.md).
const SOURCES_PER_FUNCTION: usize = 32;
/// kube-scheduler's back-off of an unschedulable pod: 1 s, doubling, at most 10 s (its
/// `podInitialBackoffSeconds` / `podMaxBackoffSeconds` defaults).
const BACKOFF_MS: (f64, f64) = (1000.0, 10_000.0);
/// kube-scheduler stops looking for feasible nodes after this many (`minFeasibleNodesToFind`),
/// or the adaptive percentage of the cluster if larger (Scheduler Performance Tuning,
/// kubernetes.io: 50 % at 100 nodes, −1 pp per 125 nodes, at least 5 %).
const MIN_FEASIBLE_NODES: usize = 100;

/// `smore eval cluster` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct ClusterArgs {
    /// Nodes, each with one arbiter.
    #[arg(long, default_value_t = 128)]
    pub nodes: usize,
    /// GPUs per node, each running one training job.
    #[arg(long, default_value_t = 8)]
    pub gpus_per_node: usize,
    /// Requests per minute per GPU (the trace's mean; default: eval colocation's per-GPU load).
    #[arg(long, default_value_t = DEFAULT_RATE_PER_GPU)]
    pub rate_per_gpu: f64,
    /// Simulated seconds of arrivals (one generated trace minute per second; the run then drains).
    #[arg(long, default_value_t = DEFAULT_SECONDS)]
    pub seconds: f64,
    /// Simulation step, milliseconds (pods are decided every step).
    #[arg(long, default_value_t = 1.0)]
    pub step_ms: f64,
    /// Every node's view is republished to the extender this often, ms of simulated time: its
    /// state is that old at worst (default: the extender's poll interval).
    #[arg(long, default_value_t = DEFAULT_POLL_INTERVAL_S * 1e3)]
    pub publish_ms: f64,
    /// A view older than this makes the node unavailable, ms (the extender's --stale-after).
    #[arg(long, default_value_t = DEFAULT_STALE_AFTER_S * 1e3)]
    pub stale_after_ms: f64,
    /// The last N nodes' arbiters are down from the start (the extender has no view of them).
    #[arg(long, default_value_t = 0)]
    pub down_nodes: usize,
    /// The N nodes before the down ones publish once at t = 0 and never again (a hung arbiter:
    /// their view goes stale after --stale-after-ms).
    #[arg(long, default_value_t = 0)]
    pub frozen_nodes: usize,
    /// GPU type of the catalog whose profiles are used.
    #[arg(long, default_value = "rtx3090")]
    pub gpu_type: String,
    /// Catalog TOML (default: the built-in one).
    #[arg(long)]
    pub catalog: Option<PathBuf>,
    /// SLO = solo latency × a factor drawn per function uniformly from [lo, hi].
    #[arg(long, value_delimiter = ',', default_value = "1.5,3.0")]
    pub slo_factor: Vec<f64>,
    /// θ_train (every policy: the extender's, the nodes', the node-local one).
    #[arg(long, default_value_t = 0.10)]
    pub theta_train: f64,
    /// Power of d (every policy; the extender samples d GPUs across the candidate nodes).
    #[arg(long, default_value_t = DEFAULT_D)]
    pub power_of_d: usize,
    /// Trainer utilization mix.
    #[arg(long, value_enum, default_value_t = Mix::Philly)]
    pub mix: Mix,
    /// Several seeds: every figure is the median over them.
    #[arg(long, value_delimiter = ',')]
    pub seeds: Vec<u64>,
    /// Seed of the run (trace, mix, noise, samplers).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// σ of the log-normal noise on the ground truth (and on the predictor's training data).
    #[arg(long, default_value_t = 0.15)]
    pub noise: f64,
    /// Trees per forest of the predictor.
    #[arg(long, default_value_t = 100)]
    pub trees: usize,
    /// Skip the node-local comparison run.
    #[arg(long)]
    pub no_node_local: bool,
    /// Print JSON lines instead of the table.
    #[arg(long)]
    pub json: bool,
}

impl Default for ClusterArgs {
    fn default() -> Self {
        ClusterArgs {
            nodes: 128,
            gpus_per_node: 8,
            rate_per_gpu: DEFAULT_RATE_PER_GPU,
            seconds: DEFAULT_SECONDS,
            step_ms: 1.0,
            publish_ms: DEFAULT_POLL_INTERVAL_S * 1e3,
            stale_after_ms: DEFAULT_STALE_AFTER_S * 1e3,
            down_nodes: 0,
            frozen_nodes: 0,
            gpu_type: "rtx3090".into(),
            catalog: None,
            slo_factor: vec![1.5, 3.0],
            theta_train: 0.10,
            power_of_d: DEFAULT_D,
            mix: Mix::Philly,
            seeds: vec![],
            seed: 1,
            noise: 0.15,
            trees: 100,
            no_node_local: false,
            json: false,
        }
    }
}

impl ClusterArgs {
    fn gpus(&self) -> usize {
        self.nodes * self.gpus_per_node
    }

    /// The colocation simulator's arguments for the same cluster (one seed).
    fn eval_args(&self, seed: u64) -> EvalArgs {
        EvalArgs {
            gpus: self.gpus(),
            exclusive_gpus: Some(1),
            rate: self.rate_per_gpu * self.gpus() as f64,
            seconds: self.seconds,
            step_ms: self.step_ms,
            gpu_type: self.gpu_type.clone(),
            catalog: self.catalog.clone(),
            slo_factor: self.slo_factor.clone(),
            theta_train: self.theta_train,
            power_of_d: self.power_of_d,
            mix: self.mix,
            noise: self.noise,
            trees: self.trees,
            seed,
            ..EvalArgs::default()
        }
    }

    fn check(&self) -> Result<()> {
        if self.nodes == 0 || self.gpus_per_node == 0 {
            bail!("--nodes and --gpus-per-node must be ≥ 1");
        }
        if !(self.rate_per_gpu > 0.0 && self.publish_ms > 0.0 && self.stale_after_ms > 0.0) {
            bail!("--rate-per-gpu, --publish-ms and --stale-after-ms must be > 0");
        }
        if self.down_nodes + self.frozen_nodes > self.nodes {
            bail!(
                "--down-nodes {} + --frozen-nodes {} is more than --nodes {}",
                self.down_nodes,
                self.frozen_nodes,
                self.nodes
            );
        }
        Ok(())
    }
}

/// One decision path's figures.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ClusterResult {
    /// `extender` (filter + prioritize, then the node's place) or `node-local`.
    pub path: &'static str,
    /// DSR / GUI / SFD / SLD and request counts, as `eval colocation` reports them.
    pub metrics: PolicyResult,
    /// Pods decided (one per request; retries after a back-off not counted again).
    pub pods: usize,
    /// Pods that no node passed the filter for at least once (kube-scheduler: Unschedulable).
    pub pending: usize,
    /// Pods never placed: pending until their request could no longer meet its deadline.
    pub unschedulable: usize,
    /// Pods whose chosen node's arbiter refused the registration (its fresh state differed from
    /// the view the extender decided on).
    pub refused: usize,
    /// Decision latency per pod decision (filter + prioritize + place), ms: p50.
    pub decision_p50_ms: Option<f64>,
    /// Its p99, ms.
    pub decision_p99_ms: Option<f64>,
    /// Its maximum, ms.
    pub decision_max_ms: Option<f64>,
}

/// kube-scheduler's number of feasible nodes it looks for before scoring (its default
/// `percentageOfNodesToScore`): every node below 100, else the adaptive percentage.
pub fn feasible_nodes_to_find(nodes: usize) -> usize {
    if nodes < MIN_FEASIBLE_NODES {
        return nodes;
    }
    let pct = 50usize.saturating_sub(nodes / 125).max(5);
    (nodes * pct / 100).max(MIN_FEASIBLE_NODES)
}

/// The bursty trace of the harvest work (`superposed_arrivals`, the demo's generator) scaled to
/// the cluster: function `i` of the popularity order gets Zipf(1) weight 1/(i+1) of the total
/// rate and the class `CLASSES[i % 3]`. Returns (arrival ms, function), sorted.
fn bursty_trace(n_funcs: usize, total_per_min: f64, seconds: f64, seed: u64) -> Vec<(f64, usize)> {
    let weights: Vec<f64> = (1..=n_funcs).map(|r| 1.0 / r as f64).collect();
    let wsum: f64 = weights.iter().sum();
    let sources: Vec<(TraceClass, f64)> = weights
        .iter()
        .enumerate()
        .map(|(i, w)| (CLASSES[i % CLASSES.len()], total_per_min / 60.0 * w / wsum))
        .collect();
    let secs = seconds.ceil().max(1.0) as usize;
    let horizon = seconds * 1e3;
    let mut out: Vec<(f64, usize)> =
        superposed_arrivals(&sources, SOURCES_PER_FUNCTION, secs, seed, 1)
            .iter()
            .enumerate()
            .flat_map(|(f, per_s)| {
                per_s
                    .iter()
                    .enumerate()
                    .flat_map(move |(s, v)| v.iter().map(move |&o| ((s as f64 + o) * 1e3, f)))
            })
            .filter(|&(t, _)| t < horizon)
            .collect();
    out.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    out
}

/// The scenario of one seed: `eval colocation`'s cluster, functions and predictor, with the
/// bursty trace instead of Poisson arrivals.
fn cluster_scenario(c: &ClusterArgs, seed: u64) -> Result<(Scenario, EvalArgs)> {
    let a = c.eval_args(seed);
    let mut sc = scenario(&a)?;
    sc.trace = bursty_trace(sc.funcs.len(), a.rate, a.seconds, seed.wrapping_add(0x7ace));
    Ok((sc, a))
}

fn sched_cfg(a: &EvalArgs) -> SchedConfig {
    SchedConfig {
        d: a.power_of_d.max(1),
        sigma: SIGMA,
        theta_train: a.theta_train,
        ..SchedConfig::default()
    }
}

/// Bytes a pod asking for `memory` is granted: whole `smore.dev/gpu-memory` units.
fn granted(memory: u64) -> u64 {
    memory.div_ceil(MEMORY_UNIT_BYTES) * MEMORY_UNIT_BYTES
}

/// What node `node`'s arbiter would publish (`gpus[].policy_view`): its GPUs, their training
/// jobs and the running requests as grants.
fn node_views(gpus: &[SimGpu], node: usize, per: usize, sc: &Scenario) -> Vec<GpuView> {
    (0..per)
        .map(|k| {
            let g = &gpus[node * per + k];
            let t = g.trainer.map(|t| &sc.trainers[t]);
            GpuView {
                index: k as u32,
                total: g.capacity,
                training_used: t.map_or(0, |t| t.memory),
                training_reserved: t.map_or(0, |t| t.memory),
                admission_hold_s: None,
                has_training: t.is_some(),
                training_solo_util: t.map(|t| t.util),
                budget_boost: 1.0,
                grants: g
                    .running
                    .iter()
                    .map(|r| {
                        let f = &sc.funcs[r.req.func];
                        GrantView {
                            instance: r.req.id,
                            model: f.key.to_string(),
                            slo_ms: f.slo_ms,
                            cap: granted(f.memory),
                            share: 100,
                            share_override: None,
                        }
                    })
                    .collect(),
            }
        })
        .collect()
}

/// A pod waiting for kube-scheduler.
struct PodState {
    req: Req,
    /// Not decided again before this (simulated ms): kube-scheduler's back-off.
    retry_at: f64,
    /// Back-off after the next failure, ms.
    backoff: f64,
    /// No node passed the filter at least once.
    was_pending: bool,
}

fn pct(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    Some(sorted[((sorted.len() - 1) as f64 * p).round() as usize])
}

/// The extender path over one scenario; also every placement as (node, simulated ms).
fn simulate_extender(
    sc: &Scenario,
    a: &EvalArgs,
    c: &ClusterArgs,
) -> Result<(ClusterResult, Vec<(usize, f64)>)> {
    let per = c.gpus_per_node;
    let n_nodes = c.nodes;
    let cfg = sched_cfg(a);
    let cat = Catalog::load_or_builtin(a.catalog.as_deref())?;
    let source = "SYNTHETIC predictor (eval's forests)";
    let mk = || {
        SmorePolicy::with_tables(
            cat.clone(),
            vec![sc.predictor.table.clone()],
            cfg.clone(),
            source,
        )
    };
    let table = Arc::new(NodeTable::new(
        Arc::new(mk()?),
        Duration::from_secs_f64(c.stale_after_ms / 1e3),
    ));
    let mut arbiters: Vec<SmorePolicy> = (0..n_nodes).map(|_| mk()).collect::<Result<_>>()?;
    let ext = Extender::new(
        table.clone(),
        ExtenderConfig {
            d: cfg.d,
            default_slo_ms: 100.0,
        },
    );
    let names: Vec<String> = (0..n_nodes).map(|n| format!("node-{n:03}")).collect();
    let down = n_nodes - c.down_nodes..n_nodes;
    let frozen = n_nodes - c.down_nodes - c.frozen_nodes..n_nodes - c.down_nodes;
    // Simulated time t (ms) is the instant base + t for the extender's staleness and the
    // policies' fast-mode window; nothing reads the wall clock but the latency measurement.
    let base = Instant::now();
    let at = |ms: f64| base + Duration::from_secs_f64(ms.max(0.0) / 1e3);
    for n in down.clone() {
        table.set_down(
            &names[n],
            "connect: Connection refused (simulated: arbiter down)".into(),
            at(0.0),
        );
    }
    let seed = a.seed ^ 0x9e37_79b9_7f4a_7c15;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut gpus: Vec<SimGpu> = (0..n_nodes * per)
        .map(|i| new_gpu(i as u32, Some(i), sc))
        .collect();
    let to_find = feasible_nodes_to_find(n_nodes);
    let mut start_node = 0usize;
    let dt = a.step_ms;
    let horizon = a.seconds * 1e3;
    let max_slo = sc.funcs.iter().map(|f| f.slo_ms).fold(0.0, f64::max);
    let end = horizon + 2.0 * max_slo + dt;
    let mut queue: VecDeque<PodState> = VecDeque::new();
    let mut next = 0usize;
    let mut tally = Tally::default();
    let (mut dropped, mut pods, mut pending, mut unschedulable, mut refused) =
        (0usize, 0usize, 0usize, 0usize, 0usize);
    let mut latency_ms: Vec<f64> = Vec::new();
    let mut placements: Vec<(usize, f64)> = Vec::new();
    let mut next_publish = 0.0;
    let mut now = 0.0;
    let mut steps_in_horizon = 0u64;
    while now < end {
        // 1. arrivals: one pod per request
        while next < sc.trace.len() && sc.trace[next].0 < now + dt {
            let (t, f) = sc.trace[next];
            queue.push_back(PodState {
                req: Req {
                    id: next as u64,
                    func: f,
                    arrival: t,
                    deadline: t + sc.funcs[f].slo_ms,
                },
                retry_at: now,
                backoff: BACKOFF_MS.0,
                was_pending: false,
            });
            pods += 1;
            next += 1;
        }
        // 2. the arbiters publish (the extender's poll round)
        if now >= next_publish {
            for (n, name) in names.iter().enumerate() {
                if down.contains(&n) || (frozen.contains(&n) && now > 0.0) {
                    continue;
                }
                table.set_views(name, &node_views(&gpus, n, per, sc), at(now));
            }
            next_publish += c.publish_ms;
        }
        // 3. pods that can no longer start in time are given up (deadline misses)
        queue.retain(|p| {
            let alive = p.req.deadline - now >= sc.funcs[p.req.func].solo_ms;
            if !alive {
                dropped += 1;
                unschedulable += usize::from(p.was_pending);
            }
            alive
        });
        // 4. kube-scheduler: one pod at a time, in arrival order
        let mut waiting = VecDeque::with_capacity(queue.len());
        while let Some(mut p) = queue.pop_front() {
            if p.retry_at > now {
                waiting.push_back(p);
                continue;
            }
            let f = &sc.funcs[p.req.func];
            let slo_left = p.req.deadline - now;
            let units = granted(f.memory) / MEMORY_UNIT_BYTES;
            let pod = function_pod(
                &format!("fn-{}", p.req.id),
                &f.key.to_string(),
                slo_left,
                units,
            );
            // The nodes kube-scheduler sends: its rotating window of feasible nodes (every node
            // passes the in-tree filters here).
            let sent: Vec<String> = (0..to_find)
                .map(|i| names[(start_node + i) % n_nodes].clone())
                .collect();
            start_node = (start_node + to_find) % n_nodes;
            let ask = Ask {
                function: f.key.to_string(),
                model: f.key.to_string(),
                slo_ms: slo_left,
                memory: granted(f.memory),
                prefer_gpu: None,
            };
            let t0 = Instant::now();
            let filtered = ext.filter_at(
                ExtenderArgs {
                    pod: pod.clone(),
                    nodes: None,
                    node_names: Some(sent),
                },
                at(now),
            );
            let passing = filtered.node_names.unwrap_or_default();
            if passing.is_empty() {
                latency_ms.push(t0.elapsed().as_secs_f64() * 1e3);
                pending += usize::from(!p.was_pending);
                p.was_pending = true;
                p.retry_at = now + p.backoff;
                p.backoff = (p.backoff * 2.0).min(BACKOFF_MS.1);
                waiting.push_back(p);
                continue;
            }
            let scores = ext.prioritize_at(
                ExtenderArgs {
                    pod,
                    nodes: None,
                    node_names: Some(passing),
                },
                at(now),
            );
            // kube-scheduler takes the top score (the extender's weight outweighs the default
            // plugins, deploy/kubernetes/scheduler-config.yaml), a random one among ties.
            let top = scores.iter().map(|h| h.score).max().unwrap_or(0);
            let ties: Vec<&str> = scores
                .iter()
                .filter(|h| h.score == top)
                .map(|h| h.host.as_str())
                .collect();
            let host = ties.choose(&mut rng).copied().unwrap_or_default();
            let node = names.iter().position(|n| n == host).unwrap_or(0);
            // The node's arbiter decides on its own, current state.
            let views = node_views(&gpus, node, per, sc);
            let decision = arbiters[node].place_at(&views, &ask, at(now));
            latency_ms.push(t0.elapsed().as_secs_f64() * 1e3);
            match decision {
                Decision::Admit { gpu, .. } => {
                    let g = &mut gpus[node * per + gpu as usize];
                    let item = item_of(&p.req, f, now);
                    let rate = sched::size_new_function(&cfg, &g.snap, &item, &sc.predictor)
                        .and_then(|d| d.share)
                        .map_or(1.0, |s| sched::work_rate(s, item.sm_util));
                    start_at(g, p.req, now, sc, &mut rng, a.noise, rate);
                    placements.push((node, now));
                }
                Decision::Refuse { .. } => {
                    refused += 1;
                    dropped += 1;
                }
            }
        }
        queue = waiting;
        // 5. service with ground-truth interference (the colocation simulator's)
        serve(gpus.iter_mut(), sc, now, dt, horizon, &mut tally);
        if now < horizon {
            steps_in_horizon += 1;
        }
        now += dt;
    }
    unschedulable += queue.iter().filter(|p| p.was_pending).count();
    dropped += queue.len();
    latency_ms.sort_by(f64::total_cmp);
    let r = ClusterResult {
        path: "extender",
        metrics: result_of(
            "smore",
            &gpus,
            steps_in_horizon,
            dt,
            sc.trace.len(),
            &tally,
            dropped,
        ),
        pods,
        pending,
        unschedulable,
        refused,
        decision_p50_ms: pct(&latency_ms, 0.5),
        decision_p99_ms: pct(&latency_ms, 0.99),
        decision_max_ms: pct(&latency_ms, 1.0),
    };
    Ok((r, placements))
}

/// The node-local path: `eval colocation`'s smore (one `sched::Scheduler` over every GPU).
fn simulate_node_local(sc: &Scenario, a: &EvalArgs) -> Result<ClusterResult> {
    let m = simulate(PolicyName::Smore, sc, a, 1)?;
    Ok(ClusterResult {
        path: "node-local",
        pods: m.requests,
        pending: 0,
        unschedulable: 0,
        refused: 0,
        metrics: m,
        decision_p50_ms: None,
        decision_p99_ms: None,
        decision_max_ms: None,
    })
}

/// Both paths for each seed; with several seeds every figure is the median.
pub fn evaluate_cluster(c: &ClusterArgs) -> Result<(Vec<ClusterResult>, String)> {
    c.check()?;
    let seeds = if c.seeds.is_empty() {
        vec![c.seed]
    } else {
        c.seeds.clone()
    };
    let mut runs: Vec<Vec<ClusterResult>> = Vec::new();
    let mut requests = Vec::new();
    let mut n_funcs = 0;
    for &seed in &seeds {
        let (sc, a) = cluster_scenario(c, seed)?;
        requests.push(sc.trace.len().to_string());
        n_funcs = sc.funcs.len();
        let mut rows = vec![simulate_extender(&sc, &a, c)?.0];
        if !c.no_node_local {
            rows.push(simulate_node_local(&sc, &a)?);
        }
        runs.push(rows);
    }
    let med = |f: &dyn Fn(&ClusterResult) -> f64, i: usize| {
        median(runs.iter().map(|r| f(&r[i])).collect())
    };
    let med_opt = |f: &dyn Fn(&ClusterResult) -> Option<f64>, i: usize| {
        let v: Vec<f64> = runs.iter().filter_map(|r| f(&r[i])).collect();
        (!v.is_empty()).then(|| median(v))
    };
    let metrics: Vec<PolicyResult> = median_rows(
        &runs
            .iter()
            .map(|r| r.iter().map(|x| x.metrics.clone()).collect())
            .collect::<Vec<_>>(),
    );
    let rows = (0..runs[0].len())
        .map(|i| ClusterResult {
            path: runs[0][i].path,
            metrics: metrics[i].clone(),
            pods: med(&|r| r.pods as f64, i).round() as usize,
            pending: med(&|r| r.pending as f64, i).round() as usize,
            unschedulable: med(&|r| r.unschedulable as f64, i).round() as usize,
            refused: med(&|r| r.refused as f64, i).round() as usize,
            decision_p50_ms: med_opt(&|r| r.decision_p50_ms, i),
            decision_p99_ms: med_opt(&|r| r.decision_p99_ms, i),
            decision_max_ms: med_opt(&|r| r.decision_max_ms, i),
        })
        .collect();
    let seed_list: Vec<String> = seeds.iter().map(|s| s.to_string()).collect();
    let header = format!(
        "SIMULATED — ground truth = synthetic interference model (predictor::synth), not a GPU \
         measurement; decision latency = wall time of this build on this machine{}.\n\
         {} nodes × {} GPUs ({} profiles, estimated), one training job per GPU, trainer mix `{}`; \
         bursty trace (the demo's generator, 1 generated minute per second) at {} requests/min \
         per GPU for {} s ({} requests) over {} functions, one pod per request; seed{} {}{}.\n\
         extender: kube-scheduler sends {} nodes per pod, the extender filters and scores on \
         views republished every {} ms (stale after {} ms; {} down, {} frozen), the top node's \
         arbiter places on its current state. node-local: one Algorithm 1 over every GPU with \
         current state (eval colocation's smore). θ_train = {}, d = {}.",
        if cfg!(debug_assertions) {
            " (DEBUG build: latency not representative)"
        } else {
            ""
        },
        c.nodes,
        c.gpus_per_node,
        c.gpu_type,
        mix_label(c.mix),
        c.rate_per_gpu,
        c.seconds,
        requests.join("/"),
        n_funcs,
        if seeds.len() > 1 { "s" } else { "" },
        seed_list.join(","),
        if seeds.len() > 1 {
            " (every figure: the median over the seeds)"
        } else {
            ""
        },
        feasible_nodes_to_find(c.nodes),
        c.publish_ms,
        c.stale_after_ms,
        c.down_nodes,
        c.frozen_nodes,
        c.theta_train,
        c.power_of_d,
    );
    Ok((rows, header))
}

/// Formats the cluster table (percent, ms).
pub fn cluster_table(rows: &[ClusterResult], header: &str) -> String {
    let ms = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{x:.3}"));
    let mut s = format!("{header}\n");
    s.push_str(&format!(
        "{:<11} {:>6} {:>6} {:>6} {:>7} {:>9} {:>9} {:>8} {:>8} {:>8} {:>9} {:>8} {:>9} {:>9}\n",
        "path",
        "DSR",
        "GUI",
        "SFD",
        "SLD",
        "requests",
        "served",
        "dropped",
        "pods",
        "pending",
        "unsched.",
        "refused",
        "p50 ms",
        "p99 ms"
    ));
    for r in rows {
        let m = &r.metrics;
        s.push_str(&format!(
            "{:<11} {:>5.1}% {:>5.1}% {:>5.1}% {:>6.1}% {:>9} {:>9} {:>8} {:>8} {:>8} {:>9} {:>8} {:>9} {:>9}\n",
            r.path,
            m.dsr * 100.0,
            m.gui * 100.0,
            m.sfd * 100.0,
            m.sld * 100.0,
            m.requests,
            m.served,
            m.dropped,
            r.pods,
            r.pending,
            r.unschedulable,
            r.refused,
            ms(r.decision_p50_ms),
            ms(r.decision_p99_ms)
        ));
    }
    s
}

/// `smore eval`: `eval colocation`'s flags (the default, also reached as `smore eval` alone), or
/// a subcommand. A subcommand rather than more flags on `eval colocation`: the cluster run has
/// its own knobs (nodes, publish interval, down arbiters) and its own table (two decision paths,
/// pod counts, latency), and none of the colocation table's five policies.
#[derive(Debug, Clone, clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct EvalCommand {
    /// Another evaluation than `colocation`.
    #[command(subcommand)]
    pub sub: Option<EvalSub>,
    /// `smore eval [colocation]`.
    #[command(flatten)]
    pub colocation: EvalArgs,
}

/// `smore eval` subcommands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum EvalSub {
    /// SIMULATED cluster of nodes × GPUs (default 128 × 8) where every function pod is placed
    /// through the scheduler extender (filter + prioritize over the nodes' published, possibly
    /// stale views) and the chosen node's arbiter policy, beside the node-local smore on the
    /// same trace: DSR / GUI / SFD / SLD, pending / refused pods, decision latency.
    Cluster(ClusterArgs),
}

/// Runs `smore eval …`.
pub fn dispatch(c: EvalCommand) -> Result<()> {
    match c.sub {
        Some(EvalSub::Cluster(a)) => run_cluster(a),
        None => run(c.colocation),
    }
}

/// `smore eval cluster`.
pub fn run_cluster(c: ClusterArgs) -> Result<()> {
    let (rows, header) = evaluate_cluster(&c)?;
    if c.json {
        for r in &rows {
            let mut v = serde_json::to_value(r)?;
            v["simulated"] = serde_json::json!(true);
            println!("{v}");
        }
    } else {
        print!("{}", cluster_table(&rows, &header));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 4 nodes × 2 GPUs, 2 s of trace, small forests: fast in a debug build.
    fn small() -> ClusterArgs {
        ClusterArgs {
            nodes: 4,
            gpus_per_node: 2,
            seconds: 2.0,
            trees: 10,
            ..ClusterArgs::default()
        }
    }

    fn extender_run(c: &ClusterArgs) -> (ClusterResult, Vec<(usize, f64)>) {
        let (sc, a) = cluster_scenario(c, c.seed).unwrap();
        simulate_extender(&sc, &a, c).unwrap()
    }

    #[test]
    fn kube_scheduler_sends_its_default_share_of_nodes() {
        assert_eq!(feasible_nodes_to_find(4), 4);
        assert_eq!(feasible_nodes_to_find(99), 99);
        // 128 nodes: 49 % is 62, below the floor of 100.
        assert_eq!(feasible_nodes_to_find(128), 100);
        // kubernetes.io: 10 % at 5 000 nodes; 5 % at least.
        assert_eq!(feasible_nodes_to_find(5000), 500);
        assert_eq!(feasible_nodes_to_find(100_000), 5000);
    }

    #[test]
    fn the_bursty_trace_has_its_rate_and_its_seed() {
        let t = bursty_trace(21, 6000.0, 10.0, 3);
        // 6 000/min for 10 s = 1 000 requests (rounding carried per function: ±1 each).
        assert!((t.len() as i64 - 1000).abs() <= 21, "{}", t.len());
        assert!(t.windows(2).all(|w| w[0].0 <= w[1].0));
        assert!(t
            .iter()
            .all(|&(ms, f)| (0.0..10_000.0).contains(&ms) && f < 21));
        // Zipf: the most popular function has the most requests.
        let count = |f| t.iter().filter(|x| x.1 == f).count();
        assert!(count(0) > count(20), "{} vs {}", count(0), count(20));
        assert_eq!(t, bursty_trace(21, 6000.0, 10.0, 3));
        assert_ne!(t, bursty_trace(21, 6000.0, 10.0, 4));
    }

    #[test]
    fn a_small_cluster_through_the_extender_gives_sane_metrics() {
        let c = small();
        let (rows, header) = evaluate_cluster(&c).unwrap();
        assert!(header.contains("SIMULATED"), "{header}");
        assert_eq!(rows.len(), 2);
        let (ext, local) = (&rows[0], &rows[1]);
        assert_eq!((ext.path, local.path), ("extender", "node-local"));
        for r in &rows {
            let m = &r.metrics;
            assert!(m.requests > 100, "{r:?}");
            assert_eq!(m.served + m.dropped, m.requests, "{r:?}");
            assert!(m.dsr > 0.2 && m.dsr <= 1.0, "{r:?}");
            assert!(m.gui > 0.0, "functions ran beside the trainers: {r:?}");
            // Every policy here keeps the predicted slowdown within θ_train = 0.1.
            assert!(m.sfd < c.theta_train, "{r:?}");
            assert!(m.sld >= 0.0, "{r:?}");
        }
        assert_eq!(ext.metrics.requests, local.metrics.requests, "same trace");
        assert_eq!(ext.pods, ext.metrics.requests, "one pod per request");
        assert!(ext.unschedulable <= ext.pending, "{ext:?}");
        assert!(
            ext.refused + ext.unschedulable <= ext.metrics.dropped,
            "{ext:?}"
        );
        assert!(ext.decision_p50_ms.is_some() && ext.decision_p99_ms >= ext.decision_p50_ms);
        let text = cluster_table(&rows, &header);
        for w in ["extender", "node-local", "DSR", "pending", "p99 ms"] {
            assert!(text.contains(w), "{text}");
        }
    }

    #[test]
    fn the_extender_path_depends_on_the_seed_only() {
        let c = small();
        let (mut r1, p1) = extender_run(&c);
        let (mut r2, p2) = extender_run(&c);
        assert_eq!(p1, p2, "same placements");
        // Wall-clock latency is measured, not decided on.
        for r in [&mut r1, &mut r2] {
            (r.decision_p50_ms, r.decision_p99_ms, r.decision_max_ms) = (None, None, None);
        }
        assert_eq!(r1, r2);
        let (_, p3) = extender_run(&ClusterArgs { seed: 2, ..c });
        assert_ne!(p1, p3, "another seed, another run");
    }

    #[test]
    fn a_node_whose_arbiter_is_down_or_stale_receives_no_pods() {
        let c = ClusterArgs {
            down_nodes: 1,
            frozen_nodes: 1,
            publish_ms: 10.0,
            stale_after_ms: 50.0,
            ..small()
        };
        let (r, placed) = extender_run(&c);
        let on = |n: usize| placed.iter().filter(|p| p.0 == n).count();
        // Nodes 0 and 1 publish; node 2 published once at t = 0 (stale after 50 ms); node 3 is down.
        assert!(
            on(0) + on(1) > 50,
            "the live nodes take the pods: {placed:?}"
        );
        assert_eq!(on(3), 0, "down node");
        assert!(
            placed.iter().all(|&(n, t)| n != 2 || t <= c.stale_after_ms),
            "a stale node got a pod: {:?}",
            placed.iter().filter(|p| p.0 == 2).collect::<Vec<_>>()
        );
        assert!(r.metrics.served > 0, "{r:?}");
        // Every node down: nothing is placed blindly; every pod is pending and counted.
        let c = ClusterArgs {
            down_nodes: 4,
            ..small()
        };
        let (r, placed) = extender_run(&c);
        assert!(placed.is_empty(), "{placed:?}");
        assert_eq!(r.metrics.served, 0, "{r:?}");
        assert_eq!((r.pending, r.unschedulable), (r.pods, r.pods), "{r:?}");
        assert_eq!(r.metrics.dropped, r.metrics.requests, "{r:?}");
    }

    #[test]
    fn a_pod_that_fits_nowhere_stays_pending_and_is_counted() {
        // An SLO of exactly the solo latency: beside any training job the predicted latency
        // exceeds it, so no GPU of any node admits a pod.
        let c = ClusterArgs {
            slo_factor: vec![1.0, 1.0],
            theta_train: 1e-6,
            ..small()
        };
        let (r, placed) = extender_run(&c);
        assert!(placed.is_empty(), "{placed:?}");
        assert!(r.pods > 100, "{r:?}");
        assert_eq!(r.pending, r.pods, "every pod was pending: {r:?}");
        assert_eq!(r.unschedulable, r.pods, "and never placed: {r:?}");
        assert_eq!(r.refused, 0, "no node was chosen: {r:?}");
        assert_eq!(r.metrics.served, 0, "{r:?}");
        assert_eq!(r.metrics.dropped, r.metrics.requests, "{r:?}");
        assert_eq!(r.metrics.dsr, 0.0);
    }

    #[test]
    fn one_node_with_fresh_views_decides_as_node_local_smore() {
        // One node: the extender's only candidate is it; views republished every step are the
        // current state; d ≥ its GPUs: both paths evaluate every GPU and take the argmin of the
        // same score with the same predictor. Light load, loose SLOs and θ: no refusal (which
        // node-local smore would retry and kube-scheduler backs off from), no fast mode.
        let c = ClusterArgs {
            nodes: 1,
            gpus_per_node: 4,
            rate_per_gpu: 120.0,
            seconds: 5.0,
            publish_ms: 1.0,
            slo_factor: vec![4.0, 6.0],
            theta_train: 1.0,
            trees: 10,
            ..ClusterArgs::default()
        };
        let (sc, a) = cluster_scenario(&c, c.seed).unwrap();
        let (ext, placed) = simulate_extender(&sc, &a, &c).unwrap();
        let local = simulate_node_local(&sc, &a).unwrap();
        assert!(placed.len() > 20, "{ext:?}");
        assert_eq!((ext.pending, ext.refused), (0, 0), "{ext:?} vs {local:?}");
        let (e, l) = (&ext.metrics, &local.metrics);
        assert_eq!(
            (e.served, e.dropped),
            (l.served, l.dropped),
            "{e:?} vs {l:?}"
        );
        assert_eq!(e.dsr, l.dsr);
        // Not bit-equal: a few placements differ (measured here: GUI within 0.5 %). Not
        // diagnosed; suspected: the arbiter's view carries the training job only as NVML sees
        // it (utilization, memory) and the policy maps that to a proxy configuration, while the
        // simulator's smore predicts with the true one.
        for (x, y, what) in [
            (e.gui, l.gui, "GUI"),
            (e.sfd, l.sfd, "SFD"),
            (e.sld, l.sld, "SLD"),
        ] {
            assert!(
                (x - y).abs() <= 0.05 * y.abs().max(1e-9),
                "{what}: extender {x} vs node-local {y}"
            );
        }
    }
}
