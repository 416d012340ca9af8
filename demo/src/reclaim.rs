//! `smore bench reclaim`: a growth scenario on a simulated node — an unmodified trainer that grows
//! its device memory in 1 GiB steps beside three functions under `smore run` holding their caps
//! (one with unused cap, one idle, one busy) — printing what docs/arbiter.md ("Memory headroom
//! and reclaim") promises: trainer OOMs (must be 0), time from each growth step to the node's
//! accounting having room for training again, instances unloaded / preempted, requests failed
//! by preemption, and the functions' deadline satisfaction rate (DSR) before and after the
//! growth. Every figure is the simulator's; it asserts nothing (the e2e test
//! `tests/e2e/tests/reclaim.rs` does).

use anyhow::{bail, Context, Result};
use smore_protocol::conn::Client;
use smore_protocol::install as artifacts;
use smore_protocol::wire::{Reply, Request};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Options of `smore bench reclaim`.
#[derive(clap::Args, Debug)]
pub struct BenchReclaimArgs {
    /// Memory the trainer adds per growth step, MiB (the headroom is set to match).
    #[arg(long, default_value_t = 1024)]
    pub step_mib: u64,
    /// Time between growth steps, ms.
    #[arg(long, default_value_t = 2500)]
    pub every_ms: u64,
    /// Growth steps.
    #[arg(long, default_value_t = 4)]
    pub steps: u32,
    /// Request deadline (SLO) of the functions, ms.
    #[arg(long, default_value_t = 50.0)]
    pub slo_ms: f64,
}

const MIB: u64 = 1 << 20;
/// Simulated GPU memory, MiB: 8 GiB keeps the scenario small enough that the functions'
/// caps and the trainer's growth collide.
const GPU_MIB: u64 = 8192;

/// A child whose stdout lines are kept with the time they arrived.
struct Watched {
    child: Child,
    lines: Arc<Mutex<Vec<(Instant, String)>>>,
}

impl Watched {
    fn spawn(mut cmd: Command, stderr: std::fs::File) -> Result<Watched> {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()?;
        let out = child.stdout.take().context("stdout")?;
        let lines = Arc::new(Mutex::new(Vec::new()));
        let l = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                l.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((Instant::now(), line));
            }
        });
        Ok(Watched { child, lines })
    }

    fn lines(&self) -> Vec<(Instant, String)> {
        self.lines.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn wait_for(&self, prefix: &str, limit: Duration) -> Result<()> {
        let t = Instant::now();
        while !self.lines().iter().any(|(_, l)| l.starts_with(prefix)) {
            if t.elapsed() > limit {
                bail!("no `{prefix}` line within {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn field(line: &str, key: &str) -> Option<f64> {
    line.split_whitespace()
        .find_map(|f| f.strip_prefix(key)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
}

fn status(socket: &std::path::Path) -> Result<serde_json::Value> {
    match Client::connect(socket)?.call(Request::Status)? {
        Reply::Status { snapshot } => Ok(snapshot),
        other => bail!("status answered {other:?}"),
    }
}

/// `smore bench reclaim`.
pub fn run(a: BenchReclaimArgs) -> Result<()> {
    let t = tempfile::Builder::new()
        .prefix("smore-bench-reclaim-")
        .tempdir()?;
    let mut node = crate::demo::simulated_node(t.path())?;
    node.env
        .push(("SMORE_SIM_MEMORY".into(), format!("{GPU_MIB}MiB")));
    node.env
        .push(("SMORE_SIM_CONTEXT_MEMORY".into(), "0".into()));
    let socket = node.dir.join("arbiter.sock");
    let cfg = node.dir.join("node.toml");
    std::fs::write(
        &cfg,
        format!(
            "[arbiter]\nsocket = {socket:?}\nstate_dir = {:?}\n\n[policy]\ntraining_headroom = \"{}MiB\"\ntraining_headroom_fraction = 0.0\npreempt_grace_ms = 1000\nidle_after_s = 1\n",
            node.dir.join("state"),
            a.step_mib
        ),
    )?;
    let smore = std::env::current_exe()?;
    let mut arbiter = node
        .command(&smore)
        .args(["arbiter", "--config"])
        .arg(&cfg)
        .stderr(std::fs::File::create(node.dir.join("arbiter.log"))?)
        .spawn()?;
    let result = scenario(&a, &node, &smore, &socket);
    let _ = arbiter.kill();
    let _ = arbiter.wait();
    result
}

fn scenario(
    a: &BenchReclaimArgs,
    node: &crate::demo::Node,
    smore: &std::path::Path,
    socket: &std::path::Path,
) -> Result<()> {
    let t0 = Instant::now();
    while Client::connect(socket).is_err() {
        if t0.elapsed() > Duration::from_secs(30) {
            bail!("the arbiter did not start");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let start = node.dir.join("grow");
    let mut tc = node.command(artifacts::require("sim-trainer")?);
    tc.args(["--memory-mib", &a.step_mib.to_string()])
        .args(["--grow-mib", &a.step_mib.to_string()])
        .args(["--grow-steps", &a.steps.to_string()])
        .args(["--grow-every-ms", &a.every_ms.to_string()])
        .args(["--seconds", "600", "--quiet"])
        .args(["--kernels", "2", "--kernel-us", "2000", "--host-ms", "10"])
        .arg("--grow-start-file")
        .arg(&start);
    let trainer_err = node.dir.join("trainer.err");
    let trainer = Watched::spawn(tc, std::fs::File::create(&trainer_err)?)?;
    let t0 = Instant::now();
    while status(socket)?["gpus"][0]["training_peak"].as_u64() != Some(a.step_mib * MIB) {
        if t0.elapsed() > Duration::from_secs(30) {
            bail!("the arbiter did not see the trainer");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // The functions: a holds 1 of 2.5 steps' worth and serves; b holds all and idles; c holds
    // all of 2 steps and serves (the shapes of the e2e test, scaled by the step).
    let s = a.step_mib;
    let shapes = [
        ("a", s * 5 / 2, s, true),
        ("b", s, s, false),
        ("c", 2 * s, 2 * s, true),
    ];
    let mut fns = Vec::new();
    for (name, cap, model, busy) in shapes {
        let mut c = node.command(smore);
        c.env(smore_protocol::wire::ENV_SOCKET, socket)
            .args(["run", "--function", name, "--memory", &format!("{cap}MiB")])
            .args(["--slo", &a.slo_ms.to_string(), "--"])
            .arg(artifacts::require("sim-function")?)
            .args([
                "--serve",
                "--load-ms",
                "0",
                "--kernels",
                "2",
                "--kernel-us",
                "500",
            ])
            .args(["--model-memory-mib", &model.to_string()]);
        let f = Watched::spawn(
            c,
            std::fs::File::create(node.dir.join(format!("{name}.err")))?,
        )?;
        f.wait_for("ready", Duration::from_secs(60))
            .with_context(|| format!("function {name}"))?;
        fns.push((name, busy, f));
    }
    // Requests every 50 ms to the busy ones.
    let sent = Arc::new(Mutex::new(Vec::<(&str, Instant)>::new()));
    for (name, busy, f) in fns.iter_mut() {
        if !*busy {
            continue;
        }
        let (name, sent) = (*name, sent.clone());
        let mut stdin = f.child.stdin.take().context("stdin")?;
        std::thread::spawn(move || {
            for i in 0u64.. {
                if writeln!(stdin, "{i}").and_then(|_| stdin.flush()).is_err() {
                    return;
                }
                sent.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((name, Instant::now()));
                std::thread::sleep(Duration::from_millis(50));
            }
        });
    }
    std::thread::sleep(Duration::from_secs(3));
    let grow_at = Instant::now();
    std::fs::write(&start, b"")?;
    // Poll the node's accounting while the steps happen: when does training's reservation (its
    // new high-water mark + headroom) fit beside every cap again — memory of preempted instances
    // counted until their processes exit — after each step?
    let total = (GPU_MIB * MIB) as f64;
    let mut fits: Vec<(Instant, u64, bool)> = Vec::new();
    let end = grow_at + Duration::from_millis(a.every_ms * (a.steps as u64 + 1) + 2000);
    while Instant::now() < end {
        let st = status(socket)?;
        let g = &st["gpus"][0];
        let sigma = st["arbiter"]["memory_safety"].as_f64().unwrap_or(0.95);
        let need =
            g["granted"].as_f64().unwrap_or(0.0) + g["training_reserved"].as_f64().unwrap_or(0.0);
        let peak = g["training_peak"].as_u64().unwrap_or(0);
        fits.push((Instant::now(), peak, need <= sigma * total));
        std::thread::sleep(Duration::from_millis(10));
    }
    let st = status(socket)?;
    let grows: Vec<(Instant, String)> = trainer
        .lines()
        .into_iter()
        .filter(|(_, l)| l.starts_with("grow"))
        .collect();
    let ooms = std::fs::read_to_string(&trainer_err)?
        .lines()
        .filter(|l| l.contains("failed"))
        .count();
    println!("smore bench reclaim — SIMULATED GPU ({GPU_MIB} MiB, no real device), arbiter defaults (reconcile 250 ms) except headroom {} MiB, grace 1 s, idle after 1 s", a.step_mib);
    println!(
        "  trainer: {} MiB, then +{} MiB every {} ms × {} (plain cuMemAlloc, no shim)",
        a.step_mib, a.step_mib, a.every_ms, a.steps
    );
    println!("  trainer OOMs (allocations the driver refused): {ooms}");
    for (at, line) in &grows {
        let step = field(line, "step").unwrap_or(0.0);
        let held = field(line, "total_mib").unwrap_or(0.0) as u64 * MIB;
        // The first sample after the step that shows it and in which the accounting fits.
        let ok = fits
            .iter()
            .find(|(t, peak, fit)| t > at && *peak >= held && *fit)
            .map(|(t, _, _)| format!("{:.0} ms", (*t - *at).as_secs_f64() * 1e3))
            .unwrap_or_else(|| "not within the run".into());
        println!(
            "  step {step:.0} (training {} MiB): {} — its reservation fits beside the caps after {ok}",
            held / MIB,
            line.split_whitespace().last().unwrap_or("")
        );
    }
    let c = &st["counters"];
    println!(
        "  reclaims {} · caps lowered {} ({} MiB) · idle instances unloaded {} · running instances preempted {} · killed after grace {}",
        c["reclaims"],
        c["caps_lowered"],
        c["bytes_lowered"].as_u64().unwrap_or(0) / MIB,
        c["unloaded"],
        c["preempted"],
        c["preempt_kills"]
    );
    // Requests: met their deadline, missed it, failed by preemption — before and after growth.
    let mut phases = [(0usize, 0usize, 0usize, 0usize); 2];
    for (name, busy, f) in &fns {
        if !*busy {
            continue;
        }
        let sent_here: Vec<Instant> = sent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, t)| *t)
            .collect();
        for t in &sent_here {
            phases[usize::from(*t >= grow_at)].0 += 1;
        }
        for (at, l) in f.lines() {
            let p = &mut phases[usize::from(at >= grow_at)];
            if l.starts_with("done") && field(&l, "admitted") == Some(1.0) {
                if field(&l, "service_ms").is_some_and(|ms| ms <= a.slo_ms) {
                    p.1 += 1;
                } else {
                    p.2 += 1;
                }
            } else if l.starts_with("failed") {
                p.3 += 1;
            }
        }
    }
    for (label, (sent, met, missed, failed)) in
        ["before growth", "from growth on"].iter().zip(phases)
    {
        let dsr = if sent > 0 {
            format!("{:.1} %", met as f64 * 100.0 / sent as f64)
        } else {
            "-".into()
        };
        println!(
            "  requests {label}: sent {sent}, met the {} ms deadline {met}, missed {missed}, failed by preemption {failed}, unanswered {} — DSR {dsr}",
            a.slo_ms,
            sent.saturating_sub(met + missed + failed)
        );
    }
    println!(
        "  (requests sent to a preempted instance after it exited are unanswered: a platform re-routes them; the arbiter refused {} as preempted)",
        c["preempted_requests"]
    );
    Ok(())
}
