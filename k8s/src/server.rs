//! The extender's HTTP endpoint (`smore k8s extender --listen ADDR`).
//!
//! Owns: routing — `POST /filter`, `POST /prioritize` (the verbs the KubeSchedulerConfiguration
//! names, deploy/kubernetes/scheduler-config.yaml), `GET /healthz` (probes) and `GET /nodes`
//! (what the extender knows of each node, for operators) — and request size limits.
//!
//! Must never: answer a malformed request with a guess. A body that is not ExtenderArgs gets
//! HTTP 400 with the parse error; kube-scheduler then reports the extender's error on the pod
//! and retries it (the pod stays pending).

use crate::extender::Extender;
use anyhow::{Context, Result};
use std::io::Read;
use std::sync::Arc;
use std::time::Instant;

/// Largest request body, bytes: `ExtenderArgs` with full Node objects (nodeCacheCapable false)
/// is about 10 KiB per node; 64 MiB covers 5 000 nodes, Kubernetes' supported maximum.
const MAX_BODY_BYTES: u64 = 64 << 20;

/// Serves `ext` on `addr` with `workers` threads; returns when the listener fails.
pub fn serve(ext: Arc<Extender>, addr: &str, workers: usize) -> Result<()> {
    let server = Arc::new(
        tiny_http::Server::http(addr)
            .map_err(|e| anyhow::anyhow!("{e}"))
            .with_context(|| format!("binding the extender address {addr}"))?,
    );
    tracing::info!("smore scheduler extender on http://{addr} (POST /filter, /prioritize)");
    let mut handles = Vec::new();
    for i in 0..workers.max(1) {
        let (server, ext) = (server.clone(), ext.clone());
        handles.push(
            std::thread::Builder::new()
                .name(format!("smore-k8s-http-{i}"))
                .spawn(move || {
                    while let Ok(req) = server.recv() {
                        handle(&ext, req);
                    }
                })?,
        );
    }
    for h in handles {
        let _ = h.join();
    }
    Ok(())
}

fn json(status: u16, body: String) -> tiny_http::Response<std::io::Cursor<Vec<u8>>> {
    let mut r = tiny_http::Response::from_string(body).with_status_code(status);
    if let Ok(h) = tiny_http::Header::from_bytes("Content-Type", "application/json") {
        r.add_header(h);
    }
    r
}

/// Answers one request (also what the tests drive through a real socket).
pub fn respond(ext: &Extender, method: &str, url: &str, body: &[u8]) -> (u16, String) {
    let args = || serde_json::from_slice::<crate::extender::ExtenderArgs>(body);
    match (method, url) {
        ("POST", "/filter") => match args() {
            Ok(a) => (200, to_json(&ext.filter(a))),
            Err(e) => (400, format!("not ExtenderArgs: {e}")),
        },
        ("POST", "/prioritize") => match args() {
            Ok(a) => (200, to_json(&ext.prioritize(a))),
            Err(e) => (400, format!("not ExtenderArgs: {e}")),
        },
        ("GET", "/healthz") => (200, "{\"ok\":true}".into()),
        ("GET", "/nodes") => (200, ext.nodes().summary(Instant::now()).to_string()),
        _ => (
            404,
            "smore extender: POST /filter, POST /prioritize, GET /healthz, GET /nodes".into(),
        ),
    }
}

fn to_json<T: serde::Serialize>(v: &T) -> String {
    // Serializing these plain structs cannot fail; "null" would make kube-scheduler report an
    // extender error (the pod stays pending), never a wrong placement.
    serde_json::to_string(v).unwrap_or_else(|_| "null".into())
}

fn handle(ext: &Extender, mut req: tiny_http::Request) {
    let method = req.method().as_str().to_string();
    let url = req.url().to_string();
    let mut body = Vec::new();
    if let Err(e) = req.as_reader().take(MAX_BODY_BYTES).read_to_end(&mut body) {
        let _ = req.respond(json(400, format!("reading the body: {e}")));
        return;
    }
    let (status, text) = respond(ext, &method, &url, &body);
    let _ = req.respond(json(status, text));
}
