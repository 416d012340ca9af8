//! Training never pays for a function (docs/arbiter.md, "Memory headroom and reclaim"): an
//! unmodified simulated trainer grows its device memory in steps (plain `cuMemAlloc`, no shim)
//! beside shimmed functions under `smore run` that hold their caps; the arbiter lowers caps,
//! unloads the idle instance, preempts a running one — in the documented order — and the
//! trainer's allocations never fail. A second training process appearing is a growth event too.

use smore_e2e::arbiter::Arbiter;
use smore_e2e::{bin, shim_lib, wait_until, SimGpu};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// Headroom of one growth step (the trainers below grow 1 GiB at a time; docs: the headroom
/// must cover training's largest step), fast hold, grace and idleness for a short test.
const POLICY: &str = "training_headroom = \"1GiB\"\ntraining_headroom_fraction = 0.0\nreclaim_hold_s = 5\npreempt_grace_ms = 1000\nidle_after_s = 1\n";

/// A process whose stdout lines are collected by a thread.
struct Proc {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    rx: Receiver<String>,
}

impl Proc {
    fn spawn(mut cmd: Command) -> Proc {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn");
        let out = child.stdout.take().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = channel();
        let l = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                l.lock().unwrap().push(line.clone());
                let _ = tx.send(line);
            }
        });
        Proc { child, lines, rx }
    }

    fn wait_line(&self, prefix: &str, limit: Duration) -> String {
        let t0 = std::time::Instant::now();
        loop {
            if let Some(l) = self
                .lines
                .lock()
                .unwrap()
                .iter()
                .find(|l| l.starts_with(prefix))
            {
                return l.clone();
            }
            assert!(t0.elapsed() < limit, "no `{prefix}` line within {limit:?}");
            let _ = self.rx.recv_timeout(Duration::from_millis(20));
        }
    }

    fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `smore run` of a `sim-function --serve` instance holding `model_mib` under a `cap_mib` cap.
fn function(arb: &Arbiter, name: &str, cap_mib: u64, model_mib: u64) -> Proc {
    let mut c = arb.smore();
    c.args([
        "run",
        "--function",
        name,
        "--memory",
        &format!("{cap_mib}MiB"),
    ])
    .arg("--shim")
    .arg(shim_lib())
    .arg("--")
    .arg(bin("sim-function"))
    .args([
        "--serve",
        "--load-ms",
        "0",
        "--kernels",
        "2",
        "--kernel-us",
        "500",
    ])
    .args(["--model-memory-mib", &model_mib.to_string()]);
    let p = Proc::spawn(c);
    p.wait_line("ready", Duration::from_secs(60));
    p
}

/// Feeds a request line every 100 ms until the instance's stdin closes (it exited).
fn feed(mut stdin: ChildStdin) {
    std::thread::spawn(move || {
        for i in 0.. {
            if writeln!(stdin, "{i}").and_then(|_| stdin.flush()).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
}

/// The instance id `status` lists for function `name` (None once it is gone).
fn instance_of(arb: &Arbiter, name: &str) -> Option<u64> {
    arb.functions()
        .iter()
        .find(|f| f["function"] == name)
        .and_then(|f| f["id"].as_u64())
}

/// Index in the status events of the first event of `kind` about `instance`.
fn event_index(events: &[serde_json::Value], kind: &str, instance: u64) -> usize {
    events
        .iter()
        .position(|e| e["kind"] == kind && e["instance"] == instance)
        .unwrap_or_else(|| panic!("no {kind} event for instance {instance}: {events:#?}"))
}

#[test]
fn a_growing_trainer_never_runs_out_of_memory_beside_functions_holding_caps() {
    let sim = SimGpu::exact(1, "8GiB");
    let arb = Arbiter::with_policy(&sim, POLICY);
    let start = sim.dir().join("grow");
    // 1 GiB, then +1 GiB every 2.5 s four times once `start` exists: 5 GiB in the end.
    let mut t = sim.command(bin("sim-trainer"));
    t.args([
        "--memory-mib",
        "1024",
        "--grow-mib",
        "1024",
        "--grow-steps",
        "4",
    ])
    .args(["--grow-every-ms", "2500", "--seconds", "120"])
    .args([
        "--kernels",
        "2",
        "--kernel-us",
        "2000",
        "--host-ms",
        "10",
        "--quiet",
    ])
    .arg("--grow-start-file")
    .arg(&start);
    let trainer = Proc::spawn(t);
    arb.wait_for_training(0, Duration::from_secs(30));
    wait_until("the trainer's 1 GiB seen", Duration::from_secs(30), || {
        arb.status()["gpus"][0]["training_peak"].as_u64() == Some(GIB)
    });
    // σ·8 GiB = 7.6 GiB − (1 GiB peak + 1 GiB headroom) = 5.6 GiB for functions: 5.5 taken.
    let mut a = function(&arb, "a", 2560, 1024); // holds 1 of 2.5 GiB, serving
    let b = function(&arb, "b", 1024, 1024); // holds all, idle
    let mut c = function(&arb, "c", 2048, 2048); // holds all, serving
    let ids: Vec<u64> = ["a", "b", "c"]
        .iter()
        .map(|n| instance_of(&arb, n).expect("listed"))
        .collect();
    feed(a.child.stdin.take().unwrap());
    feed(c.child.stdin.take().unwrap());
    a.wait_line("done", Duration::from_secs(30));
    c.wait_line("done", Duration::from_secs(30));
    // b has had no request for idle_after_s.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(arb.status()["counters"]["reclaims"], 0, "nothing taken yet");

    std::fs::write(&start, b"").unwrap();
    // Step 1 (2 GiB): a's cap lowered by 0.9 GiB. Step 2 (3 GiB): a lowered to what it holds,
    // idle b unloaded. Step 3 (4 GiB): running c preempted. Step 4 (5 GiB): fits.
    let preempted = c.wait_line("preempted", Duration::from_secs(60));
    assert!(preempted.contains("reason=training_memory"), "{preempted}");
    let failed = c.wait_line("failed", Duration::from_secs(5));
    assert!(
        failed.contains("preempted") && failed.contains("GPU 0"),
        "the in-flight request ends with the arbiter's reason: {failed}"
    );
    let last = trainer.wait_line("grow step=4", Duration::from_secs(30));
    let grows: Vec<String> = trainer
        .lines()
        .into_iter()
        .filter(|l| l.starts_with("grow"))
        .collect();
    assert_eq!(grows.len(), 4, "{grows:?}");
    assert!(
        grows.iter().all(|l| l.ends_with("rc=ok")),
        "every trainer allocation succeeded: {grows:?} (last {last})"
    );
    // b was idle: unloaded, and killed at the end of its grace (it never asked anything).
    let mut b = b;
    wait_until("b killed after its grace", Duration::from_secs(10), || {
        matches!(b.child.try_wait(), Ok(Some(_)))
    });
    wait_until("b and c released", Duration::from_secs(10), || {
        instance_of(&arb, "b").is_none() && instance_of(&arb, "c").is_none()
    });
    wait_until("the trainer's 5 GiB seen", Duration::from_secs(10), || {
        arb.status()["gpus"][0]["training_peak"].as_u64() == Some(5 * GIB)
    });
    let st = arb.status();
    let k = &st["counters"];
    assert!(k["caps_lowered"].as_u64() >= Some(1), "{k}");
    assert_eq!(k["unloaded"], 1, "{k}");
    assert_eq!(k["preempted"], 1, "{k}");
    assert!(k["growth_events"].as_u64() >= Some(4), "{k}");
    // The documented order: lower caps, then the idle instance, then a running one.
    let events: Vec<serde_json::Value> = st["events"].as_array().unwrap().clone();
    let lowered = event_index(&events, "memory", ids[0]);
    let unloaded = event_index(&events, "preempted", ids[1]);
    let stopped = event_index(&events, "preempted", ids[2]);
    assert!(lowered < unloaded && unloaded < stopped, "{events:#?}");
    assert!(events[unloaded]["message"]
        .as_str()
        .unwrap()
        .contains("unloaded"));
    // a lives on with its cap lowered to what it holds.
    let fa = arb
        .functions()
        .into_iter()
        .find(|f| f["function"] == "a")
        .expect("a still runs");
    assert_eq!(fa["cap"], GIB, "{fa}");
    assert!(a.child.try_wait().unwrap().is_none(), "a was not preempted");
    // The trainer holds its 5 GiB beside what is still granted.
    let granted = st["gpus"][0]["granted"].as_u64().unwrap();
    assert!(granted + 5 * GIB <= 8 * GIB, "granted {}", granted / MIB);
    // Re-admission is held while training may still grow.
    assert!(st["gpus"][0]["admission_hold_s"].as_f64().is_some(), "{st}");
}

#[test]
fn a_second_training_process_is_a_growth_event_and_takes_memory_back() {
    let sim = SimGpu::exact(1, "8GiB");
    let arb = Arbiter::with_policy(&sim, POLICY);
    let start = sim.dir().join("second");
    let mut t = sim.command(bin("sim-trainer"));
    t.args([
        "--memory-mib",
        "1024",
        "--second-after-ms",
        "0",
        "--second-mib",
        "2048",
    ])
    .args([
        "--seconds",
        "60",
        "--kernels",
        "2",
        "--kernel-us",
        "2000",
        "--host-ms",
        "10",
    ])
    .args(["--quiet", "--grow-start-file"])
    .arg(&start);
    let trainer = Proc::spawn(t);
    arb.wait_for_training(0, Duration::from_secs(30));
    // 7.6 − 2 = 5.6 GiB for functions: one of 5 GiB holding 4.
    let mut f = function(&arb, "big", 5120, 4096);
    feed(f.child.stdin.take().unwrap());
    f.wait_line("done", Duration::from_secs(30));
    std::fs::write(&start, b"").unwrap();
    let second = trainer.wait_line("second pid=", Duration::from_secs(30));
    // 1 + 2 GiB training + 1 GiB headroom + 5 GiB > 7.76: 1 GiB of unused cap is not enough
    // (need 1.4 GiB), so the function is preempted.
    f.wait_line("preempted", Duration::from_secs(30));
    wait_until("the function released", Duration::from_secs(10), || {
        instance_of(&arb, "big").is_none()
    });
    let st = arb.status();
    assert_eq!(
        st["gpus"][0]["training"].as_array().unwrap().len(),
        2,
        "{second}: {st}"
    );
    assert_eq!(st["gpus"][0]["training_peak"], 3 * GIB);
    assert_eq!(st["counters"]["preempted"], 1);
    // The second process outlives its parent: end it with the test.
    if let Some(pid) = second
        .split_whitespace()
        .find_map(|f| f.strip_prefix("pid="))
        .and_then(|p| p.parse::<i32>().ok())
    {
        // SAFETY: kill(2) on a pid this test's trainer started; no memory is touched.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    // The second process allocated its 2 GiB (it prints its summary only at the end: ask the
    // node instead — it holds them).
    let node = st["gpus"][0]["training"].as_array().unwrap().clone();
    assert!(
        node.iter().any(|p| p["used"] == 2 * GIB),
        "second process holds 2 GiB: {node:?}"
    );
}

#[test]
fn a_cap_lowered_for_training_refuses_the_functions_next_allocation_at_once() {
    let sim = SimGpu::exact(1, "8GiB");
    let arb = Arbiter::with_policy(&sim, POLICY);
    let start = sim.dir().join("grow");
    let mut t = sim.command(bin("sim-trainer"));
    t.args([
        "--memory-mib",
        "1024",
        "--grow-mib",
        "1024",
        "--grow-steps",
        "1",
    ])
    .args(["--grow-every-ms", "100", "--seconds", "60", "--quiet"])
    .args(["--kernels", "2", "--kernel-us", "2000", "--host-ms", "10"])
    .arg("--grow-start-file")
    .arg(&start);
    let trainer = Proc::spawn(t);
    arb.wait_for_training(0, Duration::from_secs(30));
    // A function holding 1 GiB of a 5 GiB cap (shim-client: allocations on command).
    let mut c = arb.smore();
    c.args(["run", "--function", "holder", "--memory", "5GiB", "--shim"])
        .arg(shim_lib())
        .arg("--")
        .arg(bin("shim-client"))
        .arg("hold");
    let f = Proc::spawn(c);
    f.wait_line("op=ready", Duration::from_secs(30));
    let mut stdin = {
        let mut f = f;
        let s = f.child.stdin.take().unwrap();
        (f, s)
    };
    let ask = |p: &mut (Proc, ChildStdin), cmd: &str| -> String {
        let before = p.0.lines().len();
        writeln!(p.1, "{cmd}").unwrap();
        p.1.flush().unwrap();
        let t0 = std::time::Instant::now();
        loop {
            if let Some(l) = p.0.lines().get(before) {
                return l.clone();
            }
            assert!(t0.elapsed() < Duration::from_secs(10), "no answer to {cmd}");
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    assert!(ask(&mut stdin, "alloc 1GiB").contains("rc=0"));
    wait_until("its 1 GiB seen", Duration::from_secs(10), || {
        arb.functions()[0]["nvml_used"].as_u64() == Some(GIB)
    });
    std::fs::write(&start, b"").unwrap();
    // 2 GiB training + 1 GiB headroom + 5 GiB > 7.76 GiB: the cap is lowered, nobody stops.
    wait_until("the cap lowered", Duration::from_secs(20), || {
        arb.functions()[0]["cap"].as_u64() < Some(5 * GIB)
    });
    let cap = arb.functions()[0]["cap"].as_u64().unwrap();
    assert!(cap >= GIB, "never below what it holds: {cap}");
    let over = cap - GIB + MIB;
    let line = ask(&mut stdin, &format!("alloc {over}"));
    assert!(
        line.contains("rc=2"),
        "the next allocation over the lowered cap is refused: {line}"
    );
    let fits = cap - GIB;
    if fits > 0 {
        assert!(ask(&mut stdin, &format!("alloc {fits}")).contains("rc=0"));
    }
    let st = arb.status();
    assert_eq!(st["counters"]["preempted"], 0, "{st}");
    assert_eq!(st["counters"]["caps_lowered"], 1, "{st}");
    drop(trainer);
}

#[test]
fn an_arbiter_restart_in_the_middle_of_a_reclaim_counts_nothing_twice() {
    let sim = SimGpu::exact(1, "8GiB");
    // A long grace: the restart happens while the unloaded instance is still leaving.
    let policy = POLICY.replace("preempt_grace_ms = 1000", "preempt_grace_ms = 8000");
    let mut arb = Arbiter::with_policy(&sim, &policy);
    let start = sim.dir().join("second");
    let mut t = sim.command(bin("sim-trainer"));
    t.args([
        "--memory-mib",
        "1024",
        "--second-after-ms",
        "0",
        "--second-mib",
        "2048",
    ])
    .args([
        "--seconds",
        "60",
        "--kernels",
        "2",
        "--kernel-us",
        "2000",
        "--host-ms",
        "10",
    ])
    .args(["--quiet", "--grow-start-file"])
    .arg(&start);
    let trainer = Proc::spawn(t);
    arb.wait_for_training(0, Duration::from_secs(30));
    // Idle (no requests): unloaded, and it never asks, so only the deadline ends it.
    let mut f = function(&arb, "idle", 5120, 4096);
    std::thread::sleep(Duration::from_millis(1500));
    std::fs::write(&start, b"").unwrap();
    let second = trainer.wait_line("second pid=", Duration::from_secs(30));
    wait_until("unloaded", Duration::from_secs(20), || {
        arb.functions()
            .first()
            .is_some_and(|f| f["preempt"]["reason"] == "unload")
    });
    let before = arb.status();
    let deadline = before["gpus"][0]["functions"][0]["preempt"]["deadline"].clone();
    arb.restart();
    wait_until("re-attached", Duration::from_secs(20), || {
        arb.functions()
            .first()
            .is_some_and(|f| f["attached"] == true)
    });
    let st = arb.status();
    let g = &st["gpus"][0];
    assert_eq!(
        g["functions"].as_array().unwrap().len(),
        1,
        "listed once: {st}"
    );
    let fun = &g["functions"][0];
    assert_eq!(fun["preempt"]["reason"], "unload", "still leaving: {fun}");
    assert_eq!(
        fun["preempt"]["deadline"], deadline,
        "the same deadline: {fun}"
    );
    assert_eq!(g["granted"], before["gpus"][0]["granted"], "counted once");
    assert_eq!(g["training_peak"], 3 * GIB, "the high-water marks survive");
    assert_eq!(
        st["counters"]["reclaims"], 0,
        "no second reclaim after the restart: {st}"
    );
    // The restarted arbiter enforces the deadline the first one set.
    wait_until("killed at the deadline", Duration::from_secs(20), || {
        matches!(f.child.try_wait(), Ok(Some(_)))
    });
    wait_until("released", Duration::from_secs(10), || {
        arb.functions().is_empty()
    });
    if let Some(pid) = second
        .split_whitespace()
        .find_map(|f| f.strip_prefix("pid="))
        .and_then(|p| p.parse::<i32>().ok())
    {
        // SAFETY: kill(2) on a pid this test's trainer started; no memory is touched.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}
