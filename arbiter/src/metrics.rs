//! Prometheus metrics over HTTP (`GET /metrics`), per GPU and per function, rendered from the same
//! snapshot `smore status` shows so the two never disagree.
//!
//! Owns: the exposition (encoded by the official `prometheus-client` crate, OpenMetrics text), the
//! metric names and units, and the per-function request-latency histogram fed from the runtime's
//! reports ([`observe_latencies`]).
//!
//! Must never: hand-write exposition text (a function named `C:\temp"x` or one holding a newline
//! must not make the node's whole scrape unparsable — the encoder escapes label values), label a
//! series by an instance id (a new series per restart of a function: unbounded cardinality), or use
//! the label name `instance` (Prometheus renames it to `exported_instance`).
//!
//! Conventions (`promtool check metrics`): base units (seconds, bytes, ratios 0–1), counters end in
//! `_total` (the encoder appends it), latency is a histogram, and `smore_build_info` is a gauge of
//! value 1 carrying the version. Series per function are summed over the function's live instances
//! on a GPU; the counters among them restart from the survivors' sum when an instance goes away,
//! which Prometheus' `rate()` treats as a counter reset.

use crate::server::Shared;
use anyhow::{Context, Result};
use prometheus_client::encoding::{text::encode, EncodeLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::LazyLock;

/// The content type of the exposition (OpenMetrics 1.0 text, what `prometheus-client` encodes;
/// Prometheus negotiates it and parses counters' `_total` samples against their family).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Request-latency histogram buckets, seconds: 1 ms … ~16 s doubling (15 buckets), covering
/// the SLOs of docs/harvest.md's inference functions (tens to hundreds of ms) with room for
/// cold starts.
const LATENCY_BUCKETS_START_S: f64 = 0.001;
const LATENCY_BUCKETS_FACTOR: f64 = 2.0;
const LATENCY_BUCKETS: u16 = 15;

/// Parts per million → ratio.
const PPM: f64 = 1e6;
/// Percent → ratio.
const PERCENT: f64 = 100.0;
/// Nanoseconds → seconds.
const NS_PER_S: f64 = 1e9;
/// Milliseconds → seconds.
const MS_PER_S: f64 = 1e3;

/// The OpenMetrics unit of a 0–1 fraction: `ratio` (`Unit::Ratios` would name families
/// `…_ratios`, against the Prometheus convention and the names dashboards already use).
fn ratio() -> Unit {
    Unit::Other("ratio".into())
}

type F64Gauge = Gauge<f64, AtomicU64>;
type F64Counter = Counter<f64, AtomicU64>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GpuLabels {
    gpu: String,
    uuid: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FunctionLabels {
    gpu: String,
    function: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LatencyLabels {
    function: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: String,
}

fn latency_histogram() -> Histogram {
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        LATENCY_BUCKETS_START_S,
        LATENCY_BUCKETS_FACTOR,
        LATENCY_BUCKETS,
    ))
}

type LatencyFamily = Family<LatencyLabels, Histogram, fn() -> Histogram>;

/// Every request latency the runtimes reported, per function, since the arbiter started. A
/// histogram is cumulative by definition, so it cannot be rebuilt from the snapshot's window of
/// recent latencies; it lives for the process (one per arbiter process — the metrics endpoint is
/// one per process too).
static LATENCY: LazyLock<LatencyFamily> =
    LazyLock::new(|| Family::new_with_constructor(latency_histogram as fn() -> Histogram));

/// Records request latencies (ms, as the runtime reports them) of `function` into its
/// `smore_function_request_duration_seconds` histogram; non-finite or negative ones are skipped,
/// like the state does.
pub fn observe_latencies(function: &str, latencies_ms: &[f64]) {
    let valid = latencies_ms.iter().filter(|l| l.is_finite() && **l >= 0.0);
    let mut valid = valid.peekable();
    if valid.peek().is_none() {
        return;
    }
    let h = LATENCY.get_or_create(&LatencyLabels {
        function: function.to_owned(),
    });
    for l in valid {
        h.observe(l / MS_PER_S);
    }
}

fn num(v: &Value) -> f64 {
    v.as_f64().unwrap_or(0.0)
}

fn gpu_label(v: &Value) -> String {
    match v {
        Value::Number(n) => n.to_string(),
        Value::String(s) => s.clone(),
        _ => String::new(),
    }
}

/// Per-(GPU, function) sums over live instances.
#[derive(Default)]
struct FunctionRow {
    instances: f64,
    cap: f64,
    used: f64,
    share: f64,
    sm_used: f64,
    budget_ppm: f64,
    used_ppm: f64,
    share_cut: f64,
    throttled_ns: f64,
    deferred_ns: f64,
    refusals: u64,
    requests: u64,
}

/// Renders the exposition text of a status snapshot (plus the process's latency histograms).
pub fn render(snap: &Value) -> String {
    // Help texts carry no final period: the encoder appends one.
    let mut reg = Registry::default();
    let gauge = |reg: &mut Registry, name: &str, help: &str, unit: Option<Unit>| {
        let f = Family::<GpuLabels, F64Gauge>::default();
        match unit {
            Some(u) => reg.register_with_unit(name, help, u, f.clone()),
            None => reg.register(name, help, f.clone()),
        }
        f
    };

    let build = Family::<BuildLabels, Gauge>::default();
    reg.register(
        "smore_build_info",
        "The arbiter's version (value 1)",
        build.clone(),
    );
    let version = snap["arbiter"]["version"]
        .as_str()
        .unwrap_or(env!("CARGO_PKG_VERSION"))
        .to_owned();
    build.get_or_create(&BuildLabels { version }).set(1);

    let gpus = snap["gpus"].as_array().cloned().unwrap_or_default();
    let total = gauge(
        &mut reg,
        "smore_gpu_memory_total",
        "GPU memory capacity",
        Some(Unit::Bytes),
    );
    let used = gauge(
        &mut reg,
        "smore_gpu_memory_used",
        "GPU memory in use (NVML)",
        Some(Unit::Bytes),
    );
    let training_mem = gauge(
        &mut reg,
        "smore_gpu_training_memory",
        "Memory of training (unregistered) processes (NVML)",
        Some(Unit::Bytes),
    );
    let granted = gauge(
        &mut reg,
        "smore_gpu_granted_memory",
        "Sum of function memory caps",
        Some(Unit::Bytes),
    );
    // Memory headroom and reclaim (docs/arbiter.md): what training may come back for.
    let training_peak = gauge(
        &mut reg,
        "smore_gpu_training_peak_memory",
        "Sum of the training processes' high-water marks (NVML)",
        Some(Unit::Bytes),
    );
    let training_headroom = gauge(
        &mut reg,
        "smore_gpu_training_headroom",
        "Memory kept free above the training high-water mark",
        Some(Unit::Bytes),
    );
    let reclaim_line = gauge(
        &mut reg,
        "smore_gpu_reclaim_line",
        "Training memory + headroom + function caps above this make the arbiter take memory back",
        Some(Unit::Bytes),
    );
    let held = gauge(
        &mut reg,
        "smore_gpu_admission_held",
        "1 while admission is held after a reclaim (training not yet stable), else 0",
        None,
    );
    let util = gauge(
        &mut reg,
        "smore_gpu_utilization",
        "GPU utilization (NVML), 0-1",
        Some(ratio()),
    );
    let training = gauge(
        &mut reg,
        "smore_gpu_training_processes",
        "Training processes on the GPU",
        None,
    );
    let mps = gauge(
        &mut reg,
        "smore_gpu_mps",
        "1 when MPS clients run on the GPU (NVML), 0 when its processes take turns in time slices; absent until NVML has told",
        None,
    );
    // Harvest (docs/harvest.md): what the promise is about — each GPU's estimated training
    // slowdown beside the bound it is held to, and the functions' collision budget. An absent
    // estimate (no training job, or under 1 s of reports) is not exported rather than shown as 0.
    let slowdown = gauge(
        &mut reg,
        "smore_gpu_training_slowdown_estimate",
        "Training slowdown the functions' reported collision time implies over the last 10 s (c/(1-c))",
        Some(ratio()),
    );
    let bound = gauge(
        &mut reg,
        "smore_gpu_training_slowdown_bound",
        "theta_train: the training slowdown the GPU is held to",
        Some(ratio()),
    );
    let budget = gauge(
        &mut reg,
        "smore_gpu_collision_budget",
        "The functions' total collision budget, fraction of wall time (theta/(1+theta) x calibration)",
        Some(ratio()),
    );

    let training_share = gauge(
        &mut reg,
        "smore_gpu_collision_training_share",
        "The share of the functions' measured collisions attributed to training (docs/harvest.md); the shims' budget is the collision budget over it",
        Some(ratio()),
    );

    let mut rows: BTreeMap<(String, String), FunctionRow> = BTreeMap::new();
    for g in &gpus {
        let l = GpuLabels {
            gpu: gpu_label(&g["index"]),
            uuid: g["uuid"].as_str().unwrap_or("").to_owned(),
        };
        total.get_or_create(&l).set(num(&g["total"]));
        used.get_or_create(&l).set(num(&g["used"]));
        training_mem.get_or_create(&l).set(num(&g["training_used"]));
        granted.get_or_create(&l).set(num(&g["granted"]));
        training_peak
            .get_or_create(&l)
            .set(num(&g["training_peak"]));
        training_headroom
            .get_or_create(&l)
            .set(num(&g["training_headroom"]));
        reclaim_line.get_or_create(&l).set(num(&g["reclaim_line"]));
        held.get_or_create(&l)
            .set(if g["admission_hold_s"].is_number() {
                1.0
            } else {
                0.0
            });
        util.get_or_create(&l).set(num(&g["util"]) / PERCENT);
        training
            .get_or_create(&l)
            .set(g["training"].as_array().map_or(0.0, |a| a.len() as f64));
        // The status names the mode (`gpus::Sharing`, kebab-case); unknown is not exported.
        if let Some(mode) = g["sharing"].as_str() {
            mps.get_or_create(&l)
                .set(if mode == "mps" { 1.0 } else { 0.0 });
        }
        let h = &g["harvest"];
        for (fam, v) in [
            (&slowdown, h["slowdown_estimate"].as_f64()),
            (&bound, h["theta"].as_f64()),
            (&budget, h["budget_ppm"].as_f64().map(|p| p / PPM)),
            (&training_share, h["training_share"].as_f64()),
        ] {
            if let Some(v) = v.filter(|v| v.is_finite()) {
                fam.get_or_create(&l).set(v);
            }
        }
        for f in g["functions"].as_array().into_iter().flatten() {
            let key = (
                gpu_label(&f["gpu"]),
                f["function"].as_str().unwrap_or("").to_owned(),
            );
            let r = rows.entry(key).or_default();
            r.instances += 1.0;
            r.cap += num(&f["cap"]);
            r.used += num(&f["nvml_used"]);
            r.share += num(&f["share"]);
            r.sm_used += num(&f["sm_used"]);
            r.budget_ppm += num(&f["contention_ppm"]);
            r.used_ppm += num(&f["contention_used_ppm"]);
            if f["throttle_pct"].is_number() {
                r.share_cut += 1.0;
            }
            r.throttled_ns += num(&f["throttled_ns"]);
            r.deferred_ns += num(&f["deferred_ns"]);
            r.refusals += f["refusals"].as_u64().unwrap_or(0);
            r.requests += f["requests"].as_u64().unwrap_or(0);
        }
    }

    let fgauge = |reg: &mut Registry, name: &str, help: &str, unit: Option<Unit>| {
        let f = Family::<FunctionLabels, F64Gauge>::default();
        match unit {
            Some(u) => reg.register_with_unit(name, help, u, f.clone()),
            None => reg.register(name, help, f.clone()),
        }
        f
    };
    let instances = fgauge(
        &mut reg,
        "smore_function_instances",
        "Live instances of the function on the GPU",
        None,
    );
    let cap = fgauge(
        &mut reg,
        "smore_function_memory_cap",
        "Memory caps of the function's instances",
        Some(Unit::Bytes),
    );
    let fused = fgauge(
        &mut reg,
        "smore_function_memory_used",
        "Memory NVML attributes to the function's instances",
        Some(Unit::Bytes),
    );
    let share = fgauge(
        &mut reg,
        "smore_function_sm_share",
        "SM time share granted to the function's instances, 0-1",
        Some(ratio()),
    );
    let sm_used = fgauge(
        &mut reg,
        "smore_function_sm_used",
        "SM utilization NVML attributes to the function's instances, 0-1",
        Some(ratio()),
    );
    let cbudget = fgauge(
        &mut reg,
        "smore_function_collision_budget",
        "The function's part of its GPU's collision budget, fraction of wall time",
        Some(ratio()),
    );
    let cused = fgauge(
        &mut reg,
        "smore_function_collision_used",
        "Collision time the function's shims reported over the last interval, fraction of wall time",
        Some(ratio()),
    );
    let share_cut = fgauge(
        &mut reg,
        "smore_function_share_cut_instances",
        "Instances whose raw share is cut because their GPU's collision budget, at its floor, cannot hold the training job within theta",
        None,
    );
    let throttled = Family::<FunctionLabels, F64Counter>::default();
    reg.register_with_unit(
        "smore_function_throttled",
        "Time the shim held launches back",
        Unit::Seconds,
        throttled.clone(),
    );
    let deferred = Family::<FunctionLabels, F64Counter>::default();
    reg.register_with_unit(
        "smore_function_deferred",
        "Time the shims held launches to wait out the training job's busy phase (deferral)",
        Unit::Seconds,
        deferred.clone(),
    );
    let refusals = Family::<FunctionLabels, Counter>::default();
    reg.register(
        "smore_function_refusals",
        "Allocations the shim refused over the cap",
        refusals.clone(),
    );
    let requests = Family::<FunctionLabels, Counter>::default();
    reg.register(
        "smore_function_requests",
        "Requests reported by the runtime",
        requests.clone(),
    );
    for ((gpu, function), r) in rows {
        let l = FunctionLabels { gpu, function };
        instances.get_or_create(&l).set(r.instances);
        cap.get_or_create(&l).set(r.cap);
        fused.get_or_create(&l).set(r.used);
        share.get_or_create(&l).set(r.share / PERCENT);
        sm_used.get_or_create(&l).set(r.sm_used / PERCENT);
        cbudget.get_or_create(&l).set(r.budget_ppm / PPM);
        cused.get_or_create(&l).set(r.used_ppm / PPM);
        share_cut.get_or_create(&l).set(r.share_cut);
        throttled
            .get_or_create(&l)
            .inc_by(r.throttled_ns / NS_PER_S);
        deferred.get_or_create(&l).inc_by(r.deferred_ns / NS_PER_S);
        refusals.get_or_create(&l).inc_by(r.refusals);
        requests.get_or_create(&l).inc_by(r.requests);
    }
    reg.register_with_unit(
        "smore_function_request_duration",
        "Request latency the runtime reported, per function, since the arbiter started",
        Unit::Seconds,
        LATENCY.clone(),
    );

    let c = &snap["counters"];
    for (k, help) in [
        ("registrations", "Registrations granted"),
        ("refusals", "Registrations refused"),
        ("releases", "Grants released"),
        ("watchdog_actions", "Watchdog actions taken"),
        (
            "admitted_requests",
            "Requests admitted (request-level admission)",
        ),
        (
            "deferred_requests",
            "Requests deferred (request-level admission)",
        ),
        (
            "growth_events",
            "Training memory growth events (a new training process or a higher high-water mark)",
        ),
        (
            "reclaims",
            "Times memory was taken back from functions for training",
        ),
        (
            "caps_lowered",
            "Function caps lowered to what the function holds, for training",
        ),
        (
            "preempt_kills",
            "Preempted instances killed after their grace period",
        ),
        (
            "preempted_requests",
            "Requests refused because their instance was preempted",
        ),
        (
            "held_refusals",
            "Registrations refused while admission was held after a reclaim",
        ),
    ] {
        let counter = Counter::<u64>::default();
        counter.inc_by(c[k].as_u64().unwrap_or(0));
        reg.register(format!("smore_{k}"), help, counter);
    }
    let lowered = Counter::<u64>::default();
    lowered.inc_by(c["bytes_lowered"].as_u64().unwrap_or(0));
    reg.register_with_unit(
        "smore_reclaim_lowered",
        "Cap bytes taken back from functions by lowering their caps",
        Unit::Bytes,
        lowered,
    );
    // Churn (instances stopped for training), by why: `unload` (idle) or `training_memory`.
    let preemptions = Family::<ReasonLabels, Counter>::default();
    reg.register(
        "smore_preemptions",
        "Instances stopped so training gets its memory, by reason",
        preemptions.clone(),
    );
    for (reason, key) in [("unload", "unloaded"), ("training_memory", "preempted")] {
        preemptions
            .get_or_create(&ReasonLabels {
                reason: reason.into(),
            })
            .inc_by(c[key].as_u64().unwrap_or(0));
    }

    let mut out = String::new();
    // Writing into a String cannot fail; an error here would be an encoder bug, and an empty
    // scrape (reported as such by Prometheus) is then the honest answer.
    if let Err(e) = encode(&mut out, &reg) {
        tracing::error!("encoding /metrics failed: {e}");
        out.clear();
    }
    out
}

/// Content type of `GET /status` (the status snapshot, docs/cli.md).
pub const STATUS_CONTENT_TYPE: &str = "application/json";

/// Serves `/metrics` and `/status` (the status snapshot as JSON, what the Kubernetes scheduler
/// extender polls: docs/kubernetes.md) on `addr` from a background thread.
pub fn serve(addr: &str, state: Shared) -> Result<()> {
    let server = tiny_http::Server::http(addr)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .with_context(|| format!("binding the metrics address {addr}"))?;
    tracing::info!("metrics on http://{addr}/metrics");
    let header = tiny_http::Header::from_bytes("Content-Type", CONTENT_TYPE)
        .map_err(|()| anyhow::anyhow!("invalid metrics content type {CONTENT_TYPE:?}"))?;
    let json = tiny_http::Header::from_bytes("Content-Type", STATUS_CONTENT_TYPE)
        .map_err(|()| anyhow::anyhow!("invalid status content type {STATUS_CONTENT_TYPE:?}"))?;
    std::thread::Builder::new()
        .name("smore-metrics".into())
        .spawn(move || {
            for req in server.incoming_requests() {
                let snap = || state.lock().unwrap_or_else(|e| e.into_inner()).snapshot();
                let resp = match req.url() {
                    "/metrics" => tiny_http::Response::from_string(render(&snap()))
                        .with_header(header.clone()),
                    "/status" => tiny_http::Response::from_string(snap().to_string())
                        .with_header(json.clone()),
                    _ => tiny_http::Response::from_string(
                        "smore arbiter: metrics are at /metrics, the status snapshot at /status\n",
                    )
                    .with_status_code(404),
                };
                let _ = req.respond(resp);
            }
        })?;
    Ok(())
}
