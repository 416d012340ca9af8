//! `[policy] name = "smore"` end to end: a real `smore arbiter` on the simulated GPU, real
//! clients over its socket. The predictor is the synthetic one the arbiter trains at startup when
//! `[policy] model` is unset (logged as SYNTHETIC), so these tests check the decision path and its
//! explanations, not prediction accuracy.

use smore_e2e::{Arbiter, SimGpu};
use smore_protocol::conn::Client;
use smore_protocol::wire::{RefuseCode, Register, Reply, Request};
use std::process::Stdio;
use std::time::{Duration, Instant};

const SMORE: &str = env!("CARGO_BIN_EXE_smore");

/// The arbiter with `policy` as its `[policy]` section.
fn start(sim: &SimGpu, policy: &str) -> Arbiter {
    Arbiter::start(
        sim,
        std::path::Path::new(SMORE),
        &format!("\n[policy]\n{policy}"),
    )
}

fn sim(devices: u32) -> SimGpu {
    SimGpu::builder()
        .devices(devices)
        .memory("16GiB")
        .context_memory("0")
        .build()
        .unwrap()
}

fn register(c: &Client, function: &str, model: &str, slo_ms: f64) -> Reply {
    c.call_with_fd(Request::Register(Register {
        function: function.into(),
        model: Some(model.into()),
        slo_ms: Some(slo_ms),
        memory: Some(1 << 30),
        resume: None,
        gpu: None,
        exec: true,
    }))
    .unwrap()
    .0
}

#[test]
fn smore_policy_grants_with_predictions_and_refuses_an_impossible_slo() {
    let sim = sim(2);
    let arb = start(&sim, "name = \"smore\"\n");
    assert!(
        arb.logs().contains("SYNTHETIC"),
        "a synthetic predictor must be announced as such:\n{}",
        arb.logs()
    );
    assert_eq!(arb.status()["arbiter"]["policy"], "smore");

    let c = arb.client();
    let Reply::Granted(g) = register(&c, "resnet", "resnet50:8", 50.0) else {
        panic!("not granted:\n{}", arb.logs())
    };
    assert!(g.predicted_train.is_some(), "{g:?}");
    assert!(g.predicted_fn.is_some(), "{g:?}");
    assert!(g.rule.starts_with("smore"), "{}", g.rule);
    assert!(g.rule.contains("SYNTHETIC"), "{}", g.rule);
    // Request-level admission on the same connection answers with predictions.
    match c.call(Request::Admit { request: Some(1) }).unwrap() {
        Reply::Admission {
            admitted,
            predicted_fn,
            reason,
            ..
        } => {
            assert!(admitted, "{reason}");
            assert!(predicted_fn.is_some(), "{reason}");
        }
        r => panic!("{r:?}"),
    }

    // resnet50:8 alone takes milliseconds: a 0.05 ms SLO cannot be met on any GPU.
    let c2 = arb.client();
    match register(&c2, "too-fast", "resnet50:8", 0.05) {
        Reply::Refused { code, reason } => {
            assert_eq!(code, RefuseCode::Slo, "{reason}");
            assert!(
                reason.contains("SLO") && reason.contains("D̂_fn"),
                "{reason}"
            );
        }
        r => panic!("{r:?}"),
    }
    // A model the catalog does not know is refused, naming the known ones.
    let c3 = arb.client();
    match register(&c3, "mystery", "alexnet", 50.0) {
        Reply::Refused { code, reason } => {
            assert_eq!(code, RefuseCode::Invalid, "{reason}");
            assert!(reason.contains("resnet50"), "{reason}");
        }
        r => panic!("{r:?}"),
    }
}

#[test]
fn smore_policy_prefers_the_gpu_without_training() {
    let sim = sim(2);
    let arb = start(&sim, "name = \"smore\"\npower_of_d = 2\n");
    // An unregistered process holding memory on GPU 1: training (never touched).
    let mut trainer = sim
        .command(smore_e2e::bin("sim-probe"))
        .env("CUDA_VISIBLE_DEVICES", "1")
        .args(["alloc:v2:3GiB", "ready", "sleep:30000"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while arb.status()["gpus"][1]["training"]
        .as_array()
        .is_none_or(|t| t.is_empty())
    {
        assert!(t0.elapsed() < Duration::from_secs(10), "training not seen");
        std::thread::sleep(Duration::from_millis(20));
    }
    let c = arb.client();
    let Reply::Granted(g) = register(&c, "bert", "bert_base:8", 100.0) else {
        panic!("not granted:\n{}", arb.logs())
    };
    assert_eq!(g.gpu_index, 0, "{}", g.rule);
    assert_eq!(g.predicted_train, Some(0.0), "no training on GPU 0");
    let _ = trainer.kill();
    let _ = trainer.wait();
}
