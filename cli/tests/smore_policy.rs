//! `[policy] name = "smore"` end to end: a real `smore arbiter` on the simulated GPU, real
//! clients over its socket. The predictor is the synthetic one the arbiter trains at startup when
//! `[policy] model` is unset (logged as SYNTHETIC), so these tests check the decision path and its
//! explanations, not prediction accuracy.

use smore_e2e::{registration, Arbiter, SimGpu, MANY_GRANTS_PER_PROCESS};
use smore_protocol::conn::Client;
use smore_protocol::wire::{RefuseCode, Reply, Request};
use std::time::Duration;

fn register(c: &Client, function: &str, model: &str, slo_ms: f64) -> Reply {
    c.call(registration(function, Some(model), slo_ms, 1 << 30))
        .unwrap()
}

#[test]
fn smore_policy_decisions_carry_the_predictors_predictions_and_reasons() {
    let sim = SimGpu::exact(2, "16GiB");
    let arb = Arbiter::with_policy(
        &sim,
        &format!("name = \"smore\"\n{MANY_GRANTS_PER_PROCESS}"),
    );
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
    match c
        .call(Request::Admit {
            request: Some(1),
            waited_ms: None,
        })
        .unwrap()
    {
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
    let sim = SimGpu::exact(2, "16GiB");
    let arb = Arbiter::with_policy(&sim, "name = \"smore\"\npower_of_d = 2\n");
    // An unregistered process holding memory on GPU 1: training (never touched).
    let mut trainer = sim.spawn_memory_holder(1, "3GiB");
    arb.wait_for_training(1, Duration::from_secs(10));
    let c = arb.client();
    let Reply::Granted(g) = register(&c, "bert", "bert_base:8", 100.0) else {
        panic!("not granted:\n{}", arb.logs())
    };
    assert_eq!(g.gpu_index, 0, "{}", g.rule);
    assert_eq!(g.predicted_train, Some(0.0), "no training on GPU 0");
    let _ = trainer.kill();
    let _ = trainer.wait();
}
