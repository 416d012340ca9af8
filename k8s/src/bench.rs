//! `smore bench extender`: per-pod decision latency of the extender at cluster scale, and the
//! synthetic cluster it (and the tests) decide over.
//!
//! Owns: a seeded synthetic cluster of GPU views (training jobs of varied utilization and memory,
//! functions already placed), and the report of filter + prioritize latency per pod (p50/p99),
//! with and without the JSON the HTTP endpoint parses and writes.
//!
//! Must never: present these figures as anything but timings of this build on this machine
//! over SYNTHETIC node states (the report says so).

use crate::extender::wire::{ExtenderArgs, ObjectMeta, Pod};
use crate::extender::{Extender, ExtenderConfig};
use crate::nodes::NodeTable;
use crate::resources::MEMORY_UNIT_BYTES;
use anyhow::{Context, Result};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use smore_arbiter::policy::{GpuView, GrantView};
use smore_arbiter::smore_policy::SmorePolicy;
use smore_predictor::catalog::Catalog;
use smore_predictor::Role;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Share of GPUs running a training job in the synthetic cluster (the rest are idle): most GPUs
/// of a shared training cluster are busy training (the setting of SMORE and this project).
const TRAINING_FRACTION: f64 = 0.9;
/// Functions already placed per GPU, drawn uniformly in 0..=this.
const MAX_RESIDENTS: usize = 3;

/// One node of the synthetic cluster.
#[derive(Debug, Clone)]
pub struct SynthNode {
    /// Node name (`node-000` …).
    pub name: String,
    /// Its GPUs as its arbiter's policy sees them.
    pub gpus: Vec<GpuView>,
}

/// The inference configurations of the catalog on `gpu`, with (solo latency ms, memory bytes).
pub fn inference_configs(cat: &Catalog, gpu: &str) -> Vec<(String, f64, u64)> {
    cat.configs(gpu, Role::Inference)
        .into_iter()
        .filter_map(|k| {
            let p = cat.profile(gpu, &k, Role::Inference)?;
            Some((k.to_string(), p.latency_ms, p.memory_bytes))
        })
        .collect()
}

/// A seeded cluster of `nodes` × `gpus_per_node` GPUs of catalog type `gpu`.
pub fn synthetic_cluster(
    cat: &Catalog,
    gpu: &str,
    nodes: usize,
    gpus_per_node: usize,
    seed: u64,
) -> Result<Vec<SynthNode>> {
    let ty = cat
        .gpus
        .iter()
        .find(|g| g.name == gpu)
        .with_context(|| format!("GPU type `{gpu}` is not in the catalog"))?;
    let fns = inference_configs(cat, gpu);
    let trains: Vec<(f64, u64)> = cat
        .configs(gpu, Role::Training)
        .into_iter()
        .filter_map(|k| {
            let p = cat.profile(gpu, &k, Role::Training)?;
            Some((p.sm_util, p.memory_bytes))
        })
        .collect();
    anyhow::ensure!(
        !fns.is_empty() && !trains.is_empty(),
        "GPU type `{gpu}` has no inference or no training profile in the catalog"
    );
    let mut rng = StdRng::seed_from_u64(seed);
    let mut id = 0u64;
    Ok((0..nodes)
        .map(|n| SynthNode {
            name: format!("node-{n:03}"),
            gpus: (0..gpus_per_node as u32)
                .map(|index| {
                    let training = rng.gen_bool(TRAINING_FRACTION);
                    let (util, mem) = if training {
                        *trains.choose(&mut rng).unwrap_or(&(0.5, 4 << 30))
                    } else {
                        (0.0, 0)
                    };
                    let grants = (0..rng.gen_range(0..=MAX_RESIDENTS))
                        .filter_map(|_| {
                            let (model, lat, m) = fns.choose(&mut rng)?.clone();
                            id += 1;
                            Some(GrantView {
                                instance: id,
                                model,
                                slo_ms: lat * rng.gen_range(2.0..6.0),
                                cap: m.div_ceil(MEMORY_UNIT_BYTES) * MEMORY_UNIT_BYTES,
                                share: 100,
                                share_override: None,
                            })
                        })
                        .collect();
                    GpuView {
                        index,
                        total: ty.memory_bytes,
                        training_used: mem,
                        training_reserved: mem,
                        admission_hold_s: None,
                        has_training: training,
                        training_solo_util: training.then_some(util),
                        budget_boost: 1.0,
                        grants,
                    }
                })
                .collect(),
        })
        .collect())
}

/// A function pod asking for `model` with `slo_ms` and `units` memory units.
pub fn function_pod(name: &str, model: &str, slo_ms: f64, units: u64) -> Pod {
    let v = serde_json::json!({
        "metadata": {"name": name, "namespace": "bench", "uid": name},
        "spec": {"containers": [{
            "name": "fn",
            "resources": {"limits": {"smore.dev/gpu-memory": units.to_string()}},
            "env": [{"name": "SMORE_MODEL", "value": model},
                    {"name": "SMORE_SLO_MS", "value": slo_ms.to_string()}]
        }]}
    });
    serde_json::from_value(v).unwrap_or_else(|_| Pod {
        metadata: ObjectMeta::default(),
        ..Pod::default()
    })
}

/// Benchmark settings.
#[derive(Debug, Clone)]
pub struct BenchArgs {
    /// Nodes.
    pub nodes: usize,
    /// GPUs per node.
    pub gpus_per_node: usize,
    /// Pods decided (each: filter then prioritize).
    pub pods: usize,
    /// Catalog GPU type.
    pub gpu: String,
    /// Seed of the cluster and the pods.
    pub seed: u64,
    /// Times each pod's decision is repeated; its latency is the fastest (the machine's other
    /// load only ever adds time, so the minimum is the decision's own cost).
    pub repeat: usize,
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Runs the benchmark with `policy` and returns the report (text).
pub fn run(policy: Arc<SmorePolicy>, cat: &Catalog, a: &BenchArgs) -> Result<String> {
    let cluster = synthetic_cluster(cat, &a.gpu, a.nodes, a.gpus_per_node, a.seed)?;
    let table = Arc::new(NodeTable::new(policy.clone(), Duration::from_secs(3600)));
    let now = Instant::now();
    for n in &cluster {
        table.set_views(&n.name, &n.gpus, now);
    }
    let ext = Extender::new(
        table,
        ExtenderConfig {
            d: policy.sched_config().d,
            default_slo_ms: 100.0,
        },
    );
    let names: Vec<String> = cluster.iter().map(|n| n.name.clone()).collect();
    let fns = inference_configs(cat, &a.gpu);
    let mut rng = StdRng::seed_from_u64(a.seed ^ 0x9e37);
    let (mut decide, mut http, mut decide_fit) = (Vec::new(), Vec::new(), Vec::new());
    let (mut passed, mut placed) = (0usize, 0usize);
    for i in 0..a.pods {
        let (model, lat, mem) = fns.choose(&mut rng).context("no functions")?.clone();
        let pod = function_pod(
            &format!("p{i}"),
            &model,
            lat * rng.gen_range(2.0..6.0),
            mem.div_ceil(MEMORY_UNIT_BYTES),
        );
        // As kube-scheduler does: filter over every node, prioritize over the nodes that passed
        // (not called at all when none did).
        let args = |nodes: &[String]| ExtenderArgs {
            pod: pod.clone(),
            nodes: None,
            node_names: Some(nodes.to_vec()),
        };
        let mut best = Duration::MAX;
        let mut passing = Vec::new();
        for _ in 0..a.repeat.max(1) {
            let t0 = Instant::now();
            let f = ext.filter_at(args(&names), now);
            passing = f.node_names.unwrap_or_default();
            if !passing.is_empty() {
                let p = ext.prioritize_at(args(&passing), now);
                std::hint::black_box(p);
            }
            best = best.min(t0.elapsed());
        }
        decide.push(best);
        if !passing.is_empty() {
            decide_fit.push(best);
        }
        passed += passing.len();
        placed += usize::from(!passing.is_empty());
        // The same decision through the JSON the endpoint parses and writes.
        let body = |nodes: &[String]| -> Result<String> {
            Ok(serde_json::json!({
                "Pod": serde_json::to_value(raw_pod(&pod))?,
                "NodeNames": nodes,
            })
            .to_string())
        };
        let (all, some) = (body(&names)?, body(&passing)?);
        let mut best = Duration::MAX;
        for _ in 0..a.repeat.max(1) {
            let t1 = Instant::now();
            let (s1, _) = crate::server::respond(&ext, "POST", "/filter", all.as_bytes());
            let s2 = if passing.is_empty() {
                200
            } else {
                crate::server::respond(&ext, "POST", "/prioritize", some.as_bytes()).0
            };
            best = best.min(t1.elapsed());
            anyhow::ensure!(
                s1 == 200 && s2 == 200,
                "the endpoint refused its own request"
            );
        }
        http.push(best);
    }
    decide.sort();
    decide_fit.sort();
    http.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    Ok(format!(
        "smore bench extender: {} nodes × {} GPUs ({}), {} pods (each the fastest of {}), SYNTHETIC node states, {}\n\
         decision (filter + prioritize)  p50 {:.3} ms  p99 {:.3} ms  max {:.3} ms\n\
         pods some node admits           p50 {:.3} ms  p99 {:.3} ms  max {:.3} ms\n\
         with JSON (NodeNames request)   p50 {:.3} ms  p99 {:.3} ms  max {:.3} ms\n\
         target: < 1 ms per pod; nodes passing filter per pod: {:.1} on average; pods some node admits: {}/{}\n\
         (prioritize runs over the nodes that passed, as kube-scheduler calls it; a pod no node admits\n\
          costs a full evaluation of every GPU and is the tail)\n",
        a.nodes,
        a.gpus_per_node,
        a.gpu,
        a.pods,
        a.repeat.max(1),
        if cfg!(debug_assertions) {
            "DEBUG build (timings not representative; use a release build)"
        } else {
            "release build"
        },
        ms(pct(&decide, 0.5)),
        ms(pct(&decide, 0.99)),
        ms(pct(&decide, 1.0)),
        ms(pct(&decide_fit, 0.5)),
        ms(pct(&decide_fit, 0.99)),
        ms(pct(&decide_fit, 1.0)),
        ms(pct(&http, 0.5)),
        ms(pct(&http, 0.99)),
        ms(pct(&http, 1.0)),
        passed as f64 / a.pods.max(1) as f64,
        placed,
        a.pods
    ))
}

/// The pod's JSON as kube-scheduler would send it (only what [`function_pod`] sets).
fn raw_pod(p: &Pod) -> serde_json::Value {
    let c = &p.spec.containers[0];
    serde_json::json!({
        "metadata": {"name": p.metadata.name, "namespace": p.metadata.namespace, "uid": p.metadata.uid},
        "spec": {"containers": [{
            "name": c.name,
            "resources": {"limits": c.resources.limits},
            "env": c.env.iter().map(|e| serde_json::json!({"name": e.name, "value": e.value})).collect::<Vec<_>>(),
        }]}
    })
}
