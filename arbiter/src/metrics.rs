//! Prometheus text metrics over HTTP (`GET /metrics`), per GPU and per function, rendered from
//! the same snapshot `smore status` shows so the two never disagree.

use crate::server::Shared;
use anyhow::{Context, Result};
use serde_json::Value;
use std::fmt::Write;

/// Renders the exposition text of a status snapshot.
pub fn render(snap: &Value) -> String {
    let mut o = String::new();
    let mut family = |name: &str, help: &str, kind: &str, rows: Vec<(String, f64)>| {
        let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, v) in rows {
            let _ = writeln!(o, "{name}{{{labels}}} {v}");
        }
    };
    let gpus = snap["gpus"].as_array().cloned().unwrap_or_default();
    let g = |f: &dyn Fn(&Value) -> f64| -> Vec<(String, f64)> {
        gpus.iter()
            .map(|x| {
                (
                    format!(
                        "gpu=\"{}\",uuid=\"{}\"",
                        x["index"],
                        x["uuid"].as_str().unwrap_or("")
                    ),
                    f(x),
                )
            })
            .collect()
    };
    family(
        "smore_gpu_memory_total_bytes",
        "GPU memory capacity.",
        "gauge",
        g(&|x| x["total"].as_f64().unwrap_or(0.0)),
    );
    family(
        "smore_gpu_memory_used_bytes",
        "GPU memory in use (NVML).",
        "gauge",
        g(&|x| x["used"].as_f64().unwrap_or(0.0)),
    );
    family(
        "smore_gpu_training_memory_bytes",
        "Memory of training (unregistered) processes (NVML).",
        "gauge",
        g(&|x| x["training_used"].as_f64().unwrap_or(0.0)),
    );
    family(
        "smore_gpu_granted_memory_bytes",
        "Sum of function memory caps.",
        "gauge",
        g(&|x| x["granted"].as_f64().unwrap_or(0.0)),
    );
    family(
        "smore_gpu_utilization_percent",
        "GPU utilization (NVML).",
        "gauge",
        g(&|x| x["util"].as_f64().unwrap_or(0.0)),
    );
    family(
        "smore_gpu_training_processes",
        "Training processes on the GPU.",
        "gauge",
        g(&|x| x["training"].as_array().map_or(0.0, |a| a.len() as f64)),
    );
    // Harvest (docs/harvest.md): what the promise is about — each GPU's estimated training
    // slowdown beside the bound it is held to, and the functions' collision budget. An absent
    // estimate (no training job, or under 1 s of reports) is not exported rather than shown as 0.
    let h = |key: &'static str, scale: f64| -> Vec<(String, f64)> {
        g(&|x| x["harvest"][key].as_f64().map_or(f64::NAN, |v| v * scale))
            .into_iter()
            .filter(|(_, v)| v.is_finite())
            .collect()
    };
    family(
        "smore_gpu_training_slowdown_estimate_ratio",
        "Training slowdown the functions' reported collision time implies over the last 10 s (c/(1-c)).",
        "gauge",
        h("slowdown_estimate", 1.0),
    );
    family(
        "smore_gpu_training_slowdown_bound_ratio",
        "theta_train: the training slowdown the GPU is held to.",
        "gauge",
        h("theta", 1.0),
    );
    family(
        "smore_gpu_collision_budget_ratio",
        "The functions' total collision budget, fraction of wall time (theta/(1+theta) x calibration).",
        "gauge",
        h("budget_ppm", 1e-6),
    );
    let fns: Vec<Value> = gpus
        .iter()
        .flat_map(|x| x["functions"].as_array().cloned().unwrap_or_default())
        .collect();
    let f = |get: &dyn Fn(&Value) -> f64| -> Vec<(String, f64)> {
        fns.iter()
            .map(|x| {
                (
                    format!(
                        "gpu=\"{}\",instance=\"{}\",function=\"{}\"",
                        x["gpu"],
                        x["id"],
                        x["function"].as_str().unwrap_or("").replace('"', "'")
                    ),
                    get(x),
                )
            })
            .collect()
    };
    family(
        "smore_function_memory_cap_bytes",
        "Memory cap of a function instance.",
        "gauge",
        f(&|x| x["cap"].as_f64().unwrap_or(0.0)),
    );
    family(
        "smore_function_memory_used_bytes",
        "Memory NVML attributes to the instance.",
        "gauge",
        f(&|x| x["nvml_used"].as_f64().unwrap_or(0.0)),
    );
    family(
        "smore_function_sm_share_percent",
        "SM time share granted.",
        "gauge",
        f(&|x| x["share"].as_f64().unwrap_or(0.0)),
    );
    family(
        "smore_function_sm_used_percent",
        "SM utilization NVML attributes to the instance.",
        "gauge",
        f(&|x| x["sm_used"].as_f64().unwrap_or(0.0)),
    );
    family(
        "smore_function_collision_budget_ratio",
        "The instance's part of its GPU's collision budget, fraction of wall time.",
        "gauge",
        f(&|x| x["contention_ppm"].as_f64().unwrap_or(0.0) * 1e-6),
    );
    family(
        "smore_function_collision_used_ratio",
        "Collision time the instance's shims reported over the last interval, fraction of wall time.",
        "gauge",
        f(&|x| x["contention_used_ppm"].as_f64().unwrap_or(0.0) * 1e-6),
    );
    family(
        "smore_function_throttled_seconds_total",
        "Time the shim held launches back.",
        "counter",
        f(&|x| x["throttled_ns"].as_f64().unwrap_or(0.0) / 1e9),
    );
    family(
        "smore_function_refusals_total",
        "Allocations the shim refused over the cap.",
        "counter",
        f(&|x| x["refusals"].as_f64().unwrap_or(0.0)),
    );
    family(
        "smore_function_requests_total",
        "Requests reported by the runtime.",
        "counter",
        f(&|x| x["requests"].as_f64().unwrap_or(0.0)),
    );
    family(
        "smore_function_latency_p99_ms",
        "P99 request latency over the last 1024 requests.",
        "gauge",
        f(&|x| x["p99_ms"].as_f64().unwrap_or(0.0)),
    );
    let c = &snap["counters"];
    for (k, help) in [
        ("registrations", "Registrations granted."),
        ("refusals", "Registrations refused."),
        ("releases", "Grants released."),
        ("watchdog_actions", "Watchdog actions taken."),
        (
            "admitted_requests",
            "Requests admitted (request-level admission).",
        ),
        (
            "deferred_requests",
            "Requests deferred (request-level admission).",
        ),
    ] {
        let _ = writeln!(
            o,
            "# HELP smore_{k}_total {help}\n# TYPE smore_{k}_total counter\nsmore_{k}_total {}",
            c[k].as_f64().unwrap_or(0.0)
        );
    }
    o
}

/// Serves `/metrics` on `addr` from a background thread.
pub fn serve(addr: &str, state: Shared) -> Result<()> {
    let server = tiny_http::Server::http(addr)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .with_context(|| format!("binding the metrics address {addr}"))?;
    tracing::info!("metrics on http://{addr}/metrics");
    std::thread::Builder::new()
        .name("smore-metrics".into())
        .spawn(move || {
            for req in server.incoming_requests() {
                let resp = if req.url() == "/metrics" {
                    let snap = state.lock().unwrap_or_else(|e| e.into_inner()).snapshot();
                    let header =
                        tiny_http::Header::from_bytes("Content-Type", "text/plain; version=0.0.4")
                            .expect("static header");
                    tiny_http::Response::from_string(render(&snap)).with_header(header)
                } else {
                    tiny_http::Response::from_string("smore arbiter: metrics are at /metrics\n")
                        .with_status_code(404)
                };
                let _ = req.respond(resp);
            }
        })?;
    Ok(())
}
