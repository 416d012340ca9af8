//! Protocol fuzzing against a live `smore arbiter` (proptest, a few hundred cases so CI stays
//! quick): arbitrary bytes, truncated and oversized frames, random JSON and wrong versions. Each
//! connection gets an error reply or is closed — never a crash, a hang, or harm to a registered
//! client, whose grant must survive every case.

use proptest::prelude::*;
use smore_e2e::{Arbiter, SimGpu};
use smore_protocol::conn::recv_with_fd;
use smore_protocol::wire::{Register, Reply, Request, WireError, MAX_FRAME};
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

fn arbiter() -> (Arbiter, SimGpu) {
    let sim = SimGpu::builder().devices(1).memory("8GiB").build().unwrap();
    let arb = Arbiter::new(&sim, "");
    (arb, sim)
}

/// Error replies received over all cases (the fuzzing must actually reach the arbiter's parser).
static ERRORS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Sends `bytes`, half-closes, and reads replies until the arbiter closes: every reply must be a
/// well-formed message (an error, or a status/ok for frames that happened to be valid).
fn poke(socket: &Path, bytes: &[u8]) {
    let s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = (&s).write_all(bytes);
    let _ = s.shutdown(std::net::Shutdown::Write);
    loop {
        match recv_with_fd::<Reply>(&s, MAX_FRAME) {
            Ok((Reply::Error { .. }, _)) => {
                ERRORS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            Ok(_) => {}
            Err(WireError::Closed) => break,
            Err(WireError::Io(e)) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("the arbiter answered something that is not a reply, or hung: {e}"),
        }
    }
}

fn frame(body: &[u8]) -> Vec<u8> {
    let mut v = (body.len() as u32).to_le_bytes().to_vec();
    v.extend_from_slice(body);
    v
}

fn json_like() -> impl Strategy<Value = Vec<u8>> {
    let ops = prop_oneof![
        Just("register"),
        Just("report"),
        Just("admit"),
        Just("hints"),
        Just("status"),
        Just("set_share"),
        Just("set_memory"),
        Just("release"),
        Just("attach"),
        Just("nope")
    ];
    (ops, any::<u32>(), any::<i64>(), "[a-z]{0,12}", 0u32..4).prop_map(|(op, v, n, s, ver)| {
        format!(
            r#"{{"v":{},"op":"{op}","function":"{s}","memory":{n},"instance":{v},"share":{n},"latencies_ms":[{n}]}}"#,
            [1, 0, 2, v][ver as usize]
        )
        .into_bytes()
    })
}

#[test]
fn the_arbiter_survives_arbitrary_input() {
    let (arb, _sim) = arbiter();
    // A registered client whose grant must survive everything below.
    let good = arb.client();
    let r = good
        .call(Request::Register(Register {
            function: "survivor".into(),
            model: None,
            slo_ms: None,
            memory: Some(1 << 30),
            resume: None,
            gpu: None,
            exec: true,
            gpus: None,
        }))
        .unwrap();
    assert!(matches!(r, Reply::Granted(_)), "{r:?}");
    let cfg = ProptestConfig {
        cases: 150,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let mut runner = proptest::test_runner::TestRunner::new(cfg);
    let input = prop_oneof![
        // Raw garbage, including partial length prefixes.
        proptest::collection::vec(any::<u8>(), 0..300),
        // Well-framed garbage.
        proptest::collection::vec(any::<u8>(), 0..300).prop_map(|b| frame(&b)),
        // Plausible JSON with wrong types, unknown ops and versions.
        json_like().prop_map(|b| frame(&b)),
        // Truncated frames: a length that promises more than is sent.
        (json_like(), 1usize..50).prop_map(|(b, cut)| {
            let mut f = frame(&b);
            f.truncate(f.len().saturating_sub(cut));
            f
        }),
        // Oversized length prefixes.
        (65_537u32..u32::MAX).prop_map(|n| n.to_le_bytes().to_vec()),
    ];
    runner
        .run(&input, |bytes| {
            poke(&arb.socket, &bytes);
            Ok(())
        })
        .unwrap();
    let errors = ERRORS.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        errors >= 50,
        "only {errors} of 150 cases got an error reply"
    );
    // The arbiter is unharmed: it answers, and the registered client still holds its grant.
    let Reply::Status { snapshot } = good.call(Request::Status).unwrap() else {
        panic!()
    };
    let fns = snapshot["gpus"][0]["functions"].as_array().unwrap().clone();
    assert!(
        fns.iter().any(|f| f["function"] == "survivor"),
        "{snapshot}"
    );
    let log = arb.logs();
    assert!(!log.contains("panicked"), "{log}");
}
