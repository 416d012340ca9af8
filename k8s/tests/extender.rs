//! The scheduler extender against the JSON kube-scheduler sends (tests/fixtures) and the node
//! policy it must agree with.

use smore_arbiter::config::Config;
use smore_arbiter::policy::{Ask, Decision, GpuView, GrantView, Policy};
use smore_arbiter::smore_policy::SmorePolicy;
use smore_k8s::extender::wire::{ExtenderArgs, ExtenderFilterResult, HostPriority};
use smore_k8s::extender::{Extender, ExtenderConfig, NodeVerdict};
use smore_k8s::nodes::{fetch_status, poll_once, NodeTable};
use smore_k8s::resources::function_request;
use smore_predictor::catalog::Catalog;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

const GIB: u64 = 1 << 30;
/// rtx3090 (predictor/data/catalog.toml).
const TOTAL: u64 = 25_769_803_776;

/// One policy for every test (training the synthetic forests is the slow part).
fn policy() -> Arc<SmorePolicy> {
    static P: OnceLock<Arc<SmorePolicy>> = OnceLock::new();
    P.get_or_init(|| Arc::new(SmorePolicy::from_config(&Config::default()).unwrap()))
        .clone()
}

fn fixture(name: &str) -> String {
    std::fs::read_to_string(format!(
        "{}/tests/fixtures/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

fn args(name: &str) -> ExtenderArgs {
    serde_json::from_str(&fixture(name)).unwrap()
}

fn idle(index: u32) -> GpuView {
    GpuView {
        index,
        total: TOTAL,
        training_used: 0,
        training_reserved: 0,
        admission_hold_s: None,
        has_training: false,
        training_solo_util: None,
        budget_boost: 1.0,
        grants: vec![],
    }
}

fn training(index: u32, used: u64, util: f64) -> GpuView {
    GpuView {
        training_used: used,
        has_training: true,
        training_solo_util: Some(util),
        ..idle(index)
    }
}

fn extender(d: usize) -> Extender {
    Extender::new(
        Arc::new(NodeTable::new(policy(), Duration::from_secs(30))),
        ExtenderConfig {
            d,
            default_slo_ms: 100.0,
        },
    )
}

#[test]
fn filter_passes_nodes_that_admit_and_keeps_pods_pending_on_unreachable_or_unknown_nodes() {
    let ext = extender(2);
    let now = Instant::now();
    let t = ext.nodes();
    // gpu-a: an idle GPU; gpu-b: every GPU full of training memory; gpu-c: arbiter down;
    // gpu-d: never heard of.
    t.set_views("gpu-a", &[training(0, 23 * GIB, 0.6), idle(1)], now);
    t.set_views("gpu-b", &[training(0, 23 * GIB, 0.6)], now);
    t.set_down(
        "gpu-c",
        "connect 10.0.0.13:9464: Connection refused".into(),
        now,
    );
    let r = ext.filter_at(args("filter-args-names.json"), now);
    assert_eq!(r.error, "");
    assert_eq!(r.node_names.as_deref(), Some(&["gpu-a".to_string()][..]));
    assert!(r.nodes.is_none(), "NodeNames in, NodeNames out");
    let b = &r.failed_nodes["gpu-b"];
    assert!(b.contains("no GPU has 2048 MiB free"), "{b}");
    let c = &r.failed_and_unresolvable["gpu-c"];
    assert!(
        c.contains("unreachable") && c.contains("Connection refused"),
        "{c}"
    );
    // NodeNames only and never listed with --node: no address to poll it at.
    let d = &r.failed_and_unresolvable["gpu-d"];
    assert!(d.contains("no address") && d.contains("--node"), "{d}");
    // The answer is what kube-scheduler decodes.
    let json = serde_json::to_value(&r).unwrap();
    for k in [
        "NodeNames",
        "FailedNodes",
        "FailedAndUnresolvableNodes",
        "Error",
    ] {
        assert!(json.get(k).is_some(), "{k} missing from {json}");
    }
    let recorded: ExtenderFilterResult =
        serde_json::from_str(&fixture("filter-result.json")).unwrap();
    assert_eq!(recorded.node_names, r.node_names);
    assert_eq!(recorded.failed_nodes, r.failed_nodes);
}

#[test]
fn filter_with_node_objects_learns_addresses_and_returns_the_objects_verbatim() {
    let ext = extender(2);
    let now = Instant::now();
    ext.nodes().set_views("gpu-a", &[idle(0)], now);
    ext.nodes().set_views("gpu-c", &[idle(0)], now);
    let r = ext.filter_at(args("filter-args-nodes.json"), now);
    let mut targets = ext.nodes().targets();
    targets.sort();
    assert_eq!(
        targets,
        vec![
            ("gpu-a".to_string(), "10.0.0.11".to_string()),
            ("gpu-b".to_string(), "10.0.0.12".to_string()),
            ("gpu-c".to_string(), "10.0.0.13".to_string())
        ]
    );
    let items = r.nodes.expect("Nodes in, Nodes out").items;
    let input: serde_json::Value =
        serde_json::from_str(&fixture("filter-args-nodes.json")).unwrap();
    let want = [&input["Nodes"]["items"][0], &input["Nodes"]["items"][2]];
    assert_eq!(items.len(), 2);
    for (got, want) in items.iter().zip(want) {
        let got: serde_json::Value = serde_json::from_str(got.get()).unwrap();
        assert_eq!(&got, want);
    }
    assert!(r.failed_and_unresolvable["gpu-b"].contains("no status yet"));
}

#[test]
fn a_stale_status_is_not_placed_on() {
    let ext = extender(2);
    let now = Instant::now();
    ext.nodes()
        .set_views("gpu-a", &[idle(0)], now - Duration::from_secs(31));
    let r = ext.filter_at(args("filter-args-names.json"), now);
    assert!(r.failed_and_unresolvable["gpu-a"].contains("stale"));
    assert_eq!(r.node_names.unwrap(), Vec::<String>::new());
}

#[test]
fn pods_without_smore_resources_pass_untouched_and_malformed_ones_get_an_error() {
    let ext = extender(2);
    let r = ext.filter_at(args("training-pod-args.json"), Instant::now());
    assert_eq!(r.node_names.unwrap(), vec!["gpu-a", "gpu-b"]);
    assert!(r.failed_nodes.is_empty() && r.failed_and_unresolvable.is_empty());
    let p = ext.prioritize_at(args("training-pod-args.json"), Instant::now());
    assert!(p.iter().all(|h| h.score == 0), "{p:?}");
    let mut v: serde_json::Value =
        serde_json::from_str(&fixture("filter-args-names.json")).unwrap();
    v["Pod"]["spec"]["containers"][0]["env"] = serde_json::json!([]);
    let r = ext.filter_at(serde_json::from_value(v).unwrap(), Instant::now());
    assert!(r.error.contains("SMORE_MODEL"), "{}", r.error);
}

#[test]
fn an_slo_below_the_solo_latency_is_refused_on_every_gpu() {
    let ext = extender(2);
    let now = Instant::now();
    ext.nodes().set_views("gpu-a", &[idle(0), idle(1)], now);
    let mut v: serde_json::Value =
        serde_json::from_str(&fixture("filter-args-names.json")).unwrap();
    v["Pod"]["metadata"]["annotations"]["smore.dev/slo-ms"] = "0.01".into();
    let r = ext.filter_at(serde_json::from_value(v).unwrap(), now);
    let m = &r.failed_nodes["gpu-a"];
    assert!(m.contains("SLO"), "{m}");
}

#[test]
fn prioritize_gives_the_top_score_to_algorithm_1s_choice() {
    // d ≥ every GPU: Algorithm 1 evaluates all and takes the argmin; the idle GPU of gpu-c has
    // no training to slow down and nothing to share with, so it wins over busy trainers.
    let ext = extender(64);
    let now = Instant::now();
    ext.nodes()
        .set_views("gpu-a", &[training(0, 4 * GIB, 0.98)], now);
    ext.nodes()
        .set_views("gpu-b", &[training(0, 4 * GIB, 0.9)], now);
    ext.nodes().set_views("gpu-c", &[idle(0)], now);
    let p = ext.prioritize_at(args("filter-args-names.json"), now);
    let score = |n: &str| p.iter().find(|h| h.host == n).unwrap().score;
    assert_eq!(score("gpu-c"), 10, "{p:?}");
    assert!(score("gpu-a") < 10 && score("gpu-b") < 10, "{p:?}");
    assert_eq!(score("gpu-d"), 0, "unknown nodes are never preferred");
    let recorded: Vec<HostPriority> =
        serde_json::from_str(&fixture("prioritize-result.json")).unwrap();
    assert_eq!(
        recorded[0].score,
        smore_k8s::extender::MAX_EXTENDER_PRIORITY
    );
    let json = serde_json::to_value(&p).unwrap();
    assert!(json[0].get("Host").is_some() && json[0].get("Score").is_some());
}

#[test]
fn prioritize_samples_d_gpus_across_the_cluster() {
    // d = 1: one GPU of the 16 evaluated, so at most one node is scored (10) and the rest 0.
    let ext = extender(1);
    let now = Instant::now();
    let names: Vec<String> = (0..16).map(|i| format!("n{i}")).collect();
    for n in &names {
        ext.nodes().set_views(n, &[idle(0)], now);
    }
    let mut chosen = std::collections::BTreeSet::new();
    for _ in 0..20 {
        let mut a = args("filter-args-names.json");
        a.node_names = Some(names.clone());
        let p = ext.prioritize_at(a, now);
        let top: Vec<&HostPriority> = p.iter().filter(|h| h.score > 0).collect();
        assert_eq!(top.len(), 1, "{p:?}");
        assert_eq!(top[0].score, 10);
        chosen.insert(top[0].host.clone());
    }
    assert!(chosen.len() > 1, "a random sample spreads pods: {chosen:?}");
}

#[test]
fn a_node_passes_the_filter_exactly_when_its_arbiter_policy_would_admit() {
    let cat = Catalog::builtin().unwrap();
    let cluster = smore_k8s::bench::synthetic_cluster(&cat, "rtx3090", 12, 4, 7).unwrap();
    let fns = smore_k8s::bench::inference_configs(&cat, "rtx3090");
    let ext = extender(2);
    let now = Instant::now();
    for n in &cluster {
        ext.nodes().set_views(&n.name, &n.gpus, now);
    }
    let cfg = Config::default();
    let mut node_policy = SmorePolicy::from_config(&cfg).unwrap();
    let (mut admitted, mut refused) = (0, 0);
    for (i, (model, lat, mem)) in fns.iter().enumerate().step_by(5) {
        for slo_factor in [0.9, 1.5, 4.0] {
            let units = mem.div_ceil(256 << 20) + (i as u64 % 40);
            let pod = smore_k8s::bench::function_pod("p", model, lat * slo_factor, units);
            let req = function_request(&pod).unwrap().unwrap();
            let ask = Ask {
                function: "p".into(),
                model: model.clone(),
                slo_ms: req.slo_ms.unwrap(),
                memory: req.memory,
                prefer_gpu: None,
            };
            let prepared = policy().prepare_ask(&ask);
            for n in &cluster {
                let gpus = ext.nodes().get(&n.name, now).unwrap();
                let v = ext.node_verdict(&gpus, &req, &prepared);
                let d = node_policy.place(&cfg, &n.gpus, &ask);
                match (&v, &d) {
                    (NodeVerdict::Fits { .. }, Decision::Admit { .. }) => admitted += 1,
                    (NodeVerdict::Refused(_), Decision::Refuse { .. }) => refused += 1,
                    _ => panic!("{}: extender {v:?} vs arbiter {d:?}", n.name),
                }
            }
        }
    }
    assert!(
        admitted > 0 && refused > 0,
        "{admitted} admitted, {refused} refused"
    );
}

#[test]
fn the_poller_reads_an_arbiters_status_and_marks_an_unreachable_one_down() {
    // A stand-in arbiter status endpoint serving a snapshot with policy_view, as
    // `GET /status` on metrics_addr does.
    let server = tiny_http::Server::http("127.0.0.1:0").unwrap();
    let port = server.server_addr().to_ip().unwrap().port();
    let view = GpuView {
        grants: vec![GrantView {
            instance: 4,
            model: "resnet50:8".into(),
            slo_ms: 80.0,
            cap: 2 * GIB,
            share: 30,
            share_override: None,
        }],
        ..training(0, 6 * GIB, 0.5)
    };
    let snapshot = serde_json::json!({"arbiter": {"version": "x"}, "gpus": [{"index": 0, "policy_view": view}]});
    let body = snapshot.to_string();
    std::thread::spawn(move || {
        for req in server.incoming_requests() {
            let ok = req.url() == "/status";
            let _ = req.respond(
                tiny_http::Response::from_string(if ok { body.clone() } else { "no".into() })
                    .with_status_code(if ok { 200 } else { 404 }),
            );
        }
    });
    let got = fetch_status("127.0.0.1", port, Duration::from_secs(2)).unwrap();
    assert_eq!(got, snapshot);
    // A port nothing listens on: bind one, note it, drop it.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let table = NodeTable::new(policy(), Duration::from_secs(30));
    table.learn("up", Some(&format!("127.0.0.1:{port}")));
    table.learn("down", Some(&format!("127.0.0.1:{closed}")));
    poll_once(&table, 1, Duration::from_secs(2), 4);
    let now = Instant::now();
    let up = table.get("up", now).unwrap();
    assert_eq!(up.len(), 1);
    assert_eq!(up[0].free, (TOTAL as f64 * 0.95) as u64 - 6 * GIB - 2 * GIB);
    let e = table.get("down", now).unwrap_err().to_string();
    assert!(
        e.contains("unreachable") && e.contains(&closed.to_string()),
        "{e}"
    );
}

#[test]
fn the_endpoint_answers_the_verbs_and_refuses_what_is_not_extender_args() {
    let ext = extender(2);
    ext.nodes().set_views("gpu-a", &[idle(0)], Instant::now());
    let body = fixture("filter-args-names.json");
    let (s, out) = smore_k8s::server::respond(&ext, "POST", "/filter", body.as_bytes());
    assert_eq!(s, 200, "{out}");
    let r: ExtenderFilterResult = serde_json::from_str(&out).unwrap();
    assert_eq!(r.node_names.unwrap(), vec!["gpu-a"]);
    let (s, out) = smore_k8s::server::respond(&ext, "POST", "/prioritize", body.as_bytes());
    assert_eq!(s, 200);
    let p: Vec<HostPriority> = serde_json::from_str(&out).unwrap();
    assert_eq!(p.len(), 4);
    let (s, out) = smore_k8s::server::respond(&ext, "POST", "/filter", b"{\"Pod\": 3}");
    assert_eq!(s, 400, "{out}");
    let (s, out) = smore_k8s::server::respond(&ext, "GET", "/nodes", b"");
    assert_eq!(s, 200);
    assert!(out.contains("gpu-a") && out.contains("ready"), "{out}");
}
