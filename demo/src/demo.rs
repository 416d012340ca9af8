//! `smore demo`: the whole product on one node, runnable on any machine.
//!
//! Without a GPU it builds a simulated node (the fake `libcuda.so.1` / `libnvidia-ml.so.1` of
//! `sim`) in a directory and runs on it, as real processes:
//! 1. a `smore arbiter` with a config written for the node;
//! 2. baselines: the training job alone (iteration time, GPU utilization) and each function alone
//!    (its solo P99, from which its SLO is set);
//! 3. the co-located run: the training job (unmodified, no shim) plus three functions whose
//!    requests replay a seeded synthetic trace (prewarm's generator: diurnal, bursty and timer
//!    classes; one trace minute per demo second). The demo plays the serverless platform:
//!    instances start under `smore run` (admission, then the shim with the arbiter's grant) on a
//!    request when none is warm (a cold start) or on a prewarm `load` hint, and stop on `unload`
//!    hints (prewarm's online manager, `--prewarm`). Each request asks the arbiter for
//!    admission before it runs.
//!
//! It ends with a summary — GUI (GPU utilization exclusive vs co-located), SFD (training
//! slowdown), SLD (function P99 degradation), DSR (requests within SLO), cold starts — and a PNG
//! of utilization and submitted vs admitted requests over time. Every figure comes from the
//! processes' own output and from NVML, the way an operator would measure them.

use anyhow::{bail, Context, Result};
use rand::{Rng, SeedableRng};
use smore_arbiter::gpus::{GpuSource, NvmlSource};
use smore_prewarm::manager::PrewarmManager;
use smore_prewarm::policy::{Action, PolicySettings, PolicySpec};
use smore_prewarm::synth::{generate_series, TraceClass};
use smore_protocol::install as artifacts;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Seconds the training job runs alone before functions arrive in the co-located run.
const SETTLE_S: f64 = 2.0;

#[derive(clap::Args, Debug, Clone)]
pub struct DemoArgs {
    /// Seconds of trace replayed in the co-located run (one trace minute per second).
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,
    /// Prewarm policy: hhp, lsth, ls-lstm, last-value, fixed-N (minutes), oracle.
    #[arg(long, default_value = "hhp")]
    pub prewarm: String,
    /// Seed of the synthetic trace.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Placement policy of the arbiter: fit, or smore (SMORE's Algorithm 1; it predicts from the
    /// catalog's profiles of the stand-in models — ResNet-50, BERT-base, MobileNetV2 — which do
    /// not match the simulated kernels' durations, so on the simulated GPU it refuses more).
    #[arg(long, default_value = "fit", value_parser = ["smore", "fit"])]
    pub policy: String,
    /// Training slowdown bound θ_train given to the arbiter.
    #[arg(long, default_value_t = 0.10)]
    pub theta_train: f64,
    /// Trainer kernel duration, µs.
    #[arg(long, default_value_t = 5000.0)]
    pub trainer_kernel_us: f64,
    /// Trainer kernels per iteration.
    #[arg(long, default_value_t = 8)]
    pub trainer_kernels: u32,
    /// Host time between trainer iterations (data loading), ms: the idle GPU time smore harvests.
    #[arg(long, default_value_t = 25.0)]
    pub trainer_host_ms: f64,
    /// Scale of every function's request rate.
    #[arg(long, default_value_t = 1.0)]
    pub load: f64,
    /// Run on this machine's real GPU 0 (real libcuda and NVML) with PyTorch workloads
    /// (profiling/smore_profiling/demo_workers.py) instead of the simulated GPU.
    #[arg(long)]
    pub gpu: bool,
    /// Directory holding the `smore_profiling` package (default: `profiling/` of the repository
    /// the binary was built in, or ./profiling).
    #[arg(long)]
    pub profiling: Option<PathBuf>,
    /// Keep the node, logs, summary.json and demo.png here (default: ./smore-demo).
    #[arg(long, default_value = "smore-demo")]
    pub out: PathBuf,
}

/// One demo function: its kernels, model, trace class and mean request rate.
#[derive(Debug, Clone)]
struct FunctionSpec {
    name: &'static str,
    kernel_us: f64,
    kernels: u32,
    model_mib: u64,
    load_ms: f64,
    class: TraceClass,
    /// Mean requests per second over the replay.
    rate: f64,
    /// With `--gpu`: the PyTorch model (profiling/smore_profiling/models.py) and batch.
    torch_model: &'static str,
    torch_batch: u32,
}

fn functions() -> Vec<FunctionSpec> {
    // Kernel times and memory are of the order of the SMORE workloads' inference on an A100-class
    // GPU (ResNet-50 ~1–2 ms, BERT-base ~2–4 ms, MobileNet < 1 ms at small batch); they set the
    // simulated durations, they are not measurements.
    vec![
        FunctionSpec {
            name: "resnet50",
            kernel_us: 400.0,
            kernels: 4,
            model_mib: 1024,
            load_ms: 150.0,
            class: TraceClass::Diurnal,
            rate: 20.0,
            torch_model: "resnet50",
            torch_batch: 8,
        },
        FunctionSpec {
            name: "bert",
            kernel_us: 300.0,
            kernels: 8,
            model_mib: 1536,
            load_ms: 200.0,
            class: TraceClass::Mixed,
            rate: 12.0,
            torch_model: "bert_base",
            torch_batch: 4,
        },
        FunctionSpec {
            name: "mobilenet",
            kernel_us: 200.0,
            kernels: 3,
            model_mib: 512,
            load_ms: 100.0,
            class: TraceClass::Timer,
            rate: 6.0,
            torch_model: "mobilenet_v2",
            torch_batch: 1,
        },
    ]
}

pub(crate) struct Node {
    pub(crate) dir: PathBuf,
    pub(crate) env: Vec<(String, String)>,
    /// Real-GPU mode: the directory holding the `smore_profiling` package.
    pub(crate) gpu: Option<PathBuf>,
}

impl Node {
    pub(crate) fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new(program);
        c.envs(self.env.iter().map(|(k, v)| (k, v)));
        c
    }
}

pub(crate) fn simulated_node(dir: &Path) -> Result<Node> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let dir = dir.canonicalize()?;
    let lib = dir.join("lib");
    std::fs::create_dir_all(&lib)?;
    for (link, name) in [
        ("libcuda.so.1", "libcuda.so"),
        ("libnvidia-ml.so.1", "libnvidia_ml.so"),
    ] {
        let target = artifacts::require(name)?;
        let l = lib.join(link);
        let _ = std::fs::remove_file(&l);
        std::os::unix::fs::symlink(target, &l)?;
    }
    let state = dir.join("node.state");
    let _ = std::fs::remove_file(&state);
    let env = vec![
        ("LD_LIBRARY_PATH".to_string(), lib.display().to_string()),
        ("SMORE_SIM_STATE".to_string(), state.display().to_string()),
        ("SMORE_SIM_DEVICES".to_string(), "1".to_string()),
        ("SMORE_SIM_MEMORY".to_string(), "16GiB".to_string()),
        (
            "SMORE_SIM_NAME".to_string(),
            "smore simulated GPU".to_string(),
        ),
    ];
    Ok(Node {
        dir,
        env,
        gpu: None,
    })
}

/// The arbiter process (killed on drop).
struct ArbiterProc(Child, PathBuf);

impl Drop for ArbiterProc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A node on this machine's real GPU: real libcuda/NVML, PyTorch workloads.
fn real_node(dir: &Path, profiling: Option<&Path>) -> Result<Node> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let dir = dir.canonicalize()?;
    let candidates: Vec<PathBuf> = match profiling {
        Some(p) => vec![p.to_path_buf()],
        None => {
            let mut v = vec![
                PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../profiling"),
                PathBuf::from("profiling"),
            ];
            if let Ok(exe) = std::env::current_exe() {
                if let Some(d) = exe.parent() {
                    v.push(d.join("../../profiling"));
                    v.push(d.join("../share/smore/profiling"));
                }
            }
            v
        }
    };
    let prof = candidates
        .into_iter()
        .find(|d| d.join("smore_profiling/demo_workers.py").exists())
        .context("profiling/smore_profiling not found: pass --profiling DIR")?;
    let prof = prof.canonicalize()?;
    Ok(Node {
        dir,
        env: vec![("PYTHONPATH".into(), prof.display().to_string())],
        gpu: Some(prof),
    })
}

/// The function program and its arguments (solo or `--serve`), for either backend.
fn function_argv(node: &Node, f: &FunctionSpec, serve: bool) -> Result<Vec<String>> {
    let mut v: Vec<String> = Vec::new();
    if node.gpu.is_some() {
        v.extend(["python3", "-m", "smore_profiling.demo_workers", "function"].map(String::from));
        v.extend([
            "--model".into(),
            f.torch_model.into(),
            "--batch".into(),
            f.torch_batch.to_string(),
        ]);
        if serve {
            v.push("--serve".into());
        }
    } else {
        v.push(artifacts::require("sim-function")?.display().to_string());
        v.extend([
            "--kernel-us".into(),
            f.kernel_us.to_string(),
            "--kernels".into(),
            f.kernels.to_string(),
        ]);
        if serve {
            v.extend([
                "--serve".into(),
                "--model-memory-mib".into(),
                f.model_mib.to_string(),
            ]);
            v.extend(["--load-ms".into(), f.load_ms.to_string()]);
        }
    }
    Ok(v)
}

fn start_arbiter(node: &Node, a: &DemoArgs) -> Result<ArbiterProc> {
    let socket = node.dir.join("arbiter.sock");
    let cfg = node.dir.join("node.toml");
    std::fs::write(
        &cfg,
        format!(
            "[arbiter]\nsocket = {:?}\nstate_dir = {:?}\nreconcile_ms = 100\n\n[policy]\nname = {:?}\ntheta_train = {}\n",
            socket,
            node.dir.join("state"),
            a.policy,
            a.theta_train
        ),
    )?;
    let _ = std::fs::remove_dir_all(node.dir.join("state"));
    let log = std::fs::File::create(node.dir.join("arbiter.log"))?;
    let child = node
        .command(std::env::current_exe()?)
        .args(["arbiter", "--config"])
        .arg(&cfg)
        .stderr(log)
        .spawn()
        .context("starting the arbiter")?;
    let arb = ArbiterProc(child, socket);
    let t0 = Instant::now();
    while std::os::unix::net::UnixStream::connect(&arb.1).is_err() {
        if t0.elapsed() > Duration::from_secs(20) {
            bail!(
                "the arbiter did not start; see {}",
                node.dir.join("arbiter.log").display()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(arb)
}

fn summary_field(out: &str, kind: &str, key: &str) -> Result<f64> {
    let line = out
        .lines()
        .find(|l| l.starts_with(kind))
        .with_context(|| format!("no {kind} summary in:\n{out}"))?;
    line.split_whitespace()
        .filter_map(|t| t.split_once('='))
        .find(|(k, _)| *k == key)
        .and_then(|(_, v)| v.parse().ok())
        .with_context(|| format!("no {key} in {line:?}"))
}

fn run_to_end(mut c: Command, what: &str) -> Result<String> {
    let out = c.output().with_context(|| format!("running {what}"))?;
    if !out.status.success() {
        bail!("{what} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Samples NVML utilization of GPU 0 every 250 ms until `stop`.
fn sample_util(
    node: &Node,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> Result<std::thread::JoinHandle<Vec<(f64, f64)>>> {
    // The demo process itself reads NVML: point it at the node (or the real library).
    let lib = if node.gpu.is_some() {
        "libnvidia-ml.so.1".to_string()
    } else {
        for (k, v) in &node.env {
            std::env::set_var(k, v);
        }
        node.dir.join("lib/libnvidia-ml.so.1").display().to_string()
    };
    let mut src = NvmlSource::open(&lib)?;
    Ok(std::thread::spawn(move || {
        let t0 = Instant::now();
        let mut v = Vec::new();
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            if let Ok(s) = src.sample(0) {
                v.push((t0.elapsed().as_secs_f64(), s.util.unwrap_or(0) as f64));
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        v
    }))
}

fn trainer_cmd(node: &Node, a: &DemoArgs, seconds: f64, quiet: bool) -> Result<Command> {
    if node.gpu.is_some() {
        let mut c = node.command("python3");
        c.args([
            "-m",
            "smore_profiling.demo_workers",
            "trainer",
            "--model",
            "resnet50",
            "--batch",
            "32",
        ])
        .args([
            "--host-ms",
            &a.trainer_host_ms.to_string(),
            "--seconds",
            &seconds.to_string(),
        ]);
        if quiet {
            c.arg("--quiet");
        }
        return Ok(c);
    }
    let mut c = node.command(artifacts::require("sim-trainer")?);
    c.args([
        "--kernel-us",
        &a.trainer_kernel_us.to_string(),
        "--kernels",
        &a.trainer_kernels.to_string(),
        "--host-ms",
        &a.trainer_host_ms.to_string(),
        "--seconds",
        &seconds.to_string(),
    ]);
    if quiet {
        c.arg("--quiet");
    }
    Ok(c)
}

/// A warm function instance: `smore run … -- sim-function --serve`.
struct Instance {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Instance {
    fn start(
        node: &Node,
        socket: &Path,
        f: &FunctionSpec,
        slo_ms: f64,
        shim: &Path,
    ) -> Result<Instance> {
        let mut c = node.command(std::env::current_exe()?);
        c.env(smore_protocol::wire::ENV_SOCKET, socket)
            // The model id is the predictor catalog's key (model:batch) of the function's
            // stand-in, which the smore policy predicts from.
            .args([
                "run",
                "--function",
                f.name,
                "--model",
                &format!("{}:{}", f.torch_model, f.torch_batch),
            ])
            // The cap covers the model and the CUDA context (300 MiB on the simulated GPU, the
            // order of a real CUDA 12 context), which the shim counts too. PyTorch on a real GPU
            // adds activations and its caching allocator's slack: 4 GiB is ample for these models.
            .args([
                "--memory",
                &if node.gpu.is_some() {
                    "4GiB".to_string()
                } else {
                    format!("{}MiB", f.model_mib + 384)
                },
            ])
            .args(["--slo", &format!("{slo_ms:.3}"), "--shim"])
            .arg(shim)
            .arg("--")
            .args(function_argv(node, f, true)?)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(node.dir.join(format!("function-{}.log", f.name)))?,
            );
        let mut child = c.spawn().context("starting a function instance")?;
        let stdin = child.stdin.take().context("stdin")?;
        let mut stdout = BufReader::new(child.stdout.take().context("stdout")?);
        let mut line = String::new();
        stdout.read_line(&mut line)?;
        if line.trim() != "ready" {
            let status = child.wait()?;
            bail!(
                "instance of {} did not start ({status}); see {}",
                f.name,
                node.dir.join(format!("function-{}.log", f.name)).display()
            );
        }
        Ok(Instance {
            child,
            stdin,
            stdout,
        })
    }

    /// Serves one request: (admitted, service time in the instance, ms).
    fn serve(&mut self, id: u64) -> Result<(bool, f64)> {
        writeln!(self.stdin, "{id}")?;
        self.stdin.flush()?;
        let mut line = String::new();
        if self.stdout.read_line(&mut line)? == 0 {
            bail!("instance exited");
        }
        let service = line
            .split_whitespace()
            .find_map(|t| t.strip_prefix("service_ms="))
            .and_then(|v| v.parse().ok())
            .unwrap_or(f64::NAN);
        Ok((line.contains("admitted=1"), service))
    }

    fn stop(mut self) {
        drop(self.stdin);
        let _ = self.child.wait();
    }
}

enum Msg {
    Request {
        id: u64,
        arrival: Instant,
        second: usize,
    },
    Load,
    Unload,
}

#[derive(Debug, Clone)]
struct Record {
    function: usize,
    second: usize,
    /// Arrival to completion, as the caller sees it (queueing and cold starts included).
    latency_ms: f64,
    /// Admission + kernels + synchronisation inside the warm instance.
    service_ms: f64,
    admitted: bool,
    cold: bool,
}

struct Shared {
    records: Mutex<Vec<Record>>,
    prewarm: Mutex<PrewarmManager>,
    t0: Instant,
    refusals: std::sync::atomic::AtomicU64,
    node: Arc<Node>,
    socket: PathBuf,
    shim: PathBuf,
}

fn worker(fi: usize, f: FunctionSpec, slo_ms: f64, rx: mpsc::Receiver<Msg>, sh: Arc<Shared>) {
    let (node, socket, shim) = (&sh.node, &sh.socket, &sh.shim);
    let mut inst: Option<Instance> = None;
    for msg in rx {
        match msg {
            Msg::Load => {
                if inst.is_none() {
                    inst = Instance::start(node, socket, &f, slo_ms, shim).ok();
                }
            }
            Msg::Unload => {
                if let Some(i) = inst.take() {
                    i.stop();
                }
            }
            Msg::Request {
                id,
                arrival,
                second,
            } => {
                let cold = inst.is_none();
                if cold {
                    match Instance::start(node, socket, &f, slo_ms, shim) {
                        Ok(i) => inst = Some(i),
                        Err(_) => {
                            sh.refusals
                                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                }
                let (admitted, service_ms) = match inst.as_mut().map(|i| i.serve(id)) {
                    Some(Ok(a)) => a,
                    Some(Err(_)) => {
                        inst = None;
                        (false, f64::NAN)
                    }
                    None => (false, f64::NAN),
                };
                let latency_ms = arrival.elapsed().as_secs_f64() * 1e3;
                let t = sh.t0.elapsed().as_secs_f64() * 60.0;
                let _ = sh
                    .prewarm
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .request_end(f.name, t);
                sh.records
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(Record {
                        function: fi,
                        second,
                        latency_ms,
                        service_ms,
                        admitted,
                        cold,
                    });
            }
        }
    }
    if let Some(i) = inst {
        i.stop();
    }
}

/// The trace: per function, per second, the arrival offsets (seconds) within that second.
fn trace(fs: &[FunctionSpec], seconds: usize, seed: u64, load: f64) -> Vec<Vec<Vec<f64>>> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    fs.iter()
        .map(|f| {
            let (counts, _) = generate_series(f.class, seconds, &mut rng);
            let mean = counts.iter().sum::<u32>() as f64 / seconds.max(1) as f64;
            let scale = if mean > 0.0 {
                f.rate * load / mean
            } else {
                0.0
            };
            counts
                .iter()
                .map(|&c| {
                    let n = (c as f64 * scale).round() as usize;
                    let mut v: Vec<f64> = (0..n).map(|_| rng.gen::<f64>()).collect();
                    v.sort_by(f64::total_cmp);
                    v
                })
                .collect()
        })
        .collect()
}

fn p99(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * 0.99).round() as usize]
}

pub fn run(a: DemoArgs) -> Result<()> {
    let prewarm_spec =
        PolicySpec::parse(&a.prewarm).with_context(|| format!("--prewarm {:?}", a.prewarm))?;
    let node = Arc::new(if a.gpu {
        real_node(&a.out, a.profiling.as_deref())?
    } else {
        simulated_node(&a.out)?
    });
    let label = if a.gpu {
        "real GPU 0 (PyTorch workloads)"
    } else {
        "simulated GPU (interference is the simulator's time-slicing, not a real GPU's)"
    };
    let shim = artifacts::require("libsmore_shim.so")?;
    let fs = functions();
    if a.gpu {
        eprintln!(
            "smore demo: real GPU mode, output in {}",
            node.dir.display()
        );
    } else {
        eprintln!(
            "smore demo: simulated node in {} (1 GPU, 16 GiB)",
            node.dir.display()
        );
    }
    let arb = start_arbiter(&node, &a)?;

    // 1. Baselines.
    eprintln!("smore demo: baseline — training job alone (5 s)");
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = sample_util(&node, stop.clone())?;
    let out = run_to_end(trainer_cmd(&node, &a, 5.0, true)?, "the trainer alone")?;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let excl_util = sampler
        .join()
        .map_err(|_| anyhow::anyhow!("sampler panicked"))?;
    let util_exclusive = mean(excl_util.iter().skip(2).map(|x| x.1));
    let iter_alone = summary_field(&out, "trainer", "mean_ms")?;
    let mut solo_p99 = Vec::new();
    for f in &fs {
        let argv = function_argv(&node, f, false)?;
        let mut c = node.command(&argv[0]);
        c.args(&argv[1..])
            .args(["--interval-ms", "10", "--seconds", "1.5", "--quiet"]);
        let out = run_to_end(c, "a function alone")?;
        solo_p99.push(summary_field(&out, "function", "p99_ms")?);
    }
    // SLO: 5 × solo P99 — SMORE sets SLOs as multiples of solo latency; 5× leaves room for
    // queueing behind a 5 ms training kernel on a time-sliced GPU, but not for a cold start.
    let slo: Vec<f64> = solo_p99.iter().map(|p| p * 5.0).collect();
    eprintln!(
        "smore demo: trainer alone {iter_alone:.2} ms/iteration, GPU {util_exclusive:.0} % busy"
    );

    // 2. Co-located replay.
    let seconds = a.seconds.max(5) as usize;
    let tr = trace(&fs, seconds, a.seed, a.load);
    let mut pm = PrewarmManager::new(prewarm_spec.clone(), PolicySettings::default())?;
    for f in &fs {
        pm.register(f.name, f.model_mib << 20);
    }
    let sh = Arc::new(Shared {
        records: Mutex::new(Vec::new()),
        prewarm: Mutex::new(pm),
        t0: Instant::now(),
        refusals: std::sync::atomic::AtomicU64::new(0),
        node: node.clone(),
        socket: arb.1.clone(),
        shim: shim.clone(),
    });
    let trainer_log = node.dir.join("trainer-colocated.log");
    let trainer = trainer_cmd(&node, &a, seconds as f64 + 2.0 + SETTLE_S, false)?
        .stdout(std::fs::File::create(&trainer_log)?)
        .spawn()?;
    // The training job runs alone first, as on a real node where functions arrive beside a
    // running job: the arbiter learns its solo utilization (it trusts it after 8 samples).
    std::thread::sleep(Duration::from_secs_f64(SETTLE_S));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = sample_util(&node, stop.clone())?;
    let mut txs = Vec::new();
    let mut workers = Vec::new();
    for (i, f) in fs.iter().enumerate() {
        let (tx, rx) = mpsc::channel();
        txs.push(tx);
        let (f, sh, slo) = (f.clone(), sh.clone(), slo[i]);
        workers.push(std::thread::spawn(move || worker(i, f, slo, rx, sh)));
    }
    eprintln!(
        "smore demo: co-located — trainer + {} functions replaying {seconds} trace minutes (1 per second), prewarm {}",
        fs.len(),
        prewarm_spec.name()
    );
    let start = Instant::now();
    let mut submitted = vec![0u64; seconds];
    let mut next_id = 0u64;
    for (sec, slot) in submitted.iter_mut().enumerate() {
        let hints = sh
            .prewarm
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .tick(sec as u64)?;
        for h in hints {
            if let Some(i) = fs.iter().position(|f| f.name == h.function) {
                let _ = txs[i].send(match h.action {
                    Action::Load | Action::Keep => Msg::Load,
                    Action::Unload => Msg::Unload,
                });
            }
        }
        let mut arrivals: Vec<(f64, usize)> = tr
            .iter()
            .enumerate()
            .flat_map(|(fi, s)| s[sec].iter().map(move |&o| (o, fi)))
            .collect();
        arrivals.sort_by(|x, y| x.0.total_cmp(&y.0));
        for (off, fi) in arrivals {
            let due = start + Duration::from_secs_f64(sec as f64 + off);
            if let Some(w) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(w);
            }
            let t = sh.t0.elapsed().as_secs_f64() * 60.0;
            let _ = sh
                .prewarm
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .request_begin(fs[fi].name, t);
            let _ = txs[fi].send(Msg::Request {
                id: next_id,
                arrival: Instant::now(),
                second: sec,
            });
            next_id += 1;
            *slot += 1;
        }
        let end = start + Duration::from_secs(sec as u64 + 1);
        if let Some(w) = end.checked_duration_since(Instant::now()) {
            std::thread::sleep(w);
        }
        if sec % 10 == 9 {
            eprintln!("smore demo: {} / {seconds} s", sec + 1);
        }
    }
    drop(txs);
    for w in workers {
        let _ = w.join();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let colo_util = sampler
        .join()
        .map_err(|_| anyhow::anyhow!("sampler panicked"))?;
    let out = trainer.wait_with_output()?;
    let _ = out;
    drop(arb);
    let trainer_out = std::fs::read_to_string(&trainer_log)?;
    let iters: Vec<f64> = trainer_out
        .lines()
        .filter_map(|l| l.strip_prefix("iter="))
        .filter_map(|l| l.split("ms=").nth(1)?.trim().parse().ok())
        .collect();
    // Iterations of the settle period ran alone: leave them out of the co-located mean.
    let settle_iters = (SETTLE_S * 1e3 / iter_alone) as usize;
    let iter_colo = mean(iters.iter().copied().skip(settle_iters));
    let records = sh.records.lock().unwrap_or_else(|e| e.into_inner()).clone();

    // 3. Figures.
    let util_colo = mean(
        colo_util
            .iter()
            .filter(|x| x.0 > 1.0 && x.0 < seconds as f64)
            .map(|x| x.1),
    );
    let sfd = iter_colo / iter_alone - 1.0;
    let mut per_fn = Vec::new();
    for (i, f) in fs.iter().enumerate() {
        let mine: Vec<&Record> = records.iter().filter(|r| r.function == i).collect();
        // SLD compares the service time of admitted requests with the solo P99 (co-location's
        // effect); DSR judges end-to-end latency (queueing and cold starts included).
        let mut warm: Vec<f64> = mine
            .iter()
            .filter(|r| r.admitted)
            .map(|r| r.service_ms)
            .collect();
        let met = mine
            .iter()
            .filter(|r| r.admitted && r.latency_ms <= slo[i])
            .count();
        let cold = mine.iter().filter(|r| r.cold).count();
        let p = p99(&mut warm);
        per_fn.push(serde_json::json!({
            "function": f.name, "requests": mine.len(), "admitted": mine.iter().filter(|r| r.admitted).count(),
            "cold_starts": cold, "solo_p99_ms": solo_p99[i], "colocated_p99_ms": p, "slo_ms": slo[i],
            "sld": p / solo_p99[i] - 1.0, "dsr": met as f64 / mine.len().max(1) as f64,
        }));
    }
    let total = records.len().max(1) as f64;
    let dsr = records
        .iter()
        .filter(|r| r.admitted && r.latency_ms <= slo[r.function])
        .count() as f64
        / total;
    let cold = records.iter().filter(|r| r.cold).count();
    let sld = mean(
        per_fn
            .iter()
            .filter_map(|f| f["sld"].as_f64())
            .filter(|x| x.is_finite()),
    );
    let mut admitted_per_s = vec![0u64; seconds];
    for r in records.iter().filter(|r| r.admitted) {
        admitted_per_s[r.second] += 1;
    }
    let summary = serde_json::json!({
        "simulated": !a.gpu,
        "seconds": seconds, "prewarm": prewarm_spec.name(), "theta_train": a.theta_train, "seed": a.seed,
        "gui_exclusive_pct": util_exclusive, "gui_colocated_pct": util_colo,
        "trainer_iter_alone_ms": iter_alone, "trainer_iter_colocated_ms": iter_colo, "sfd": sfd,
        "sld": sld, "dsr": dsr, "requests": records.len(), "cold_starts": cold,
        "cold_start_rate": cold as f64 / total, "refused_instances": sh.refusals.load(std::sync::atomic::Ordering::Relaxed),
        "functions": per_fn,
    });
    std::fs::write(
        node.dir.join("summary.json"),
        serde_json::to_string_pretty(&summary)?,
    )?;
    let mut csv = String::from("function,second,latency_ms,service_ms,admitted,cold\n");
    for r in &records {
        csv.push_str(&format!(
            "{},{},{:.3},{:.3},{},{}\n",
            fs[r.function].name,
            r.second,
            r.latency_ms,
            r.service_ms,
            r.admitted as u8,
            r.cold as u8
        ));
    }
    std::fs::write(node.dir.join("requests.csv"), csv)?;
    let png = node.dir.join("demo.png");
    plot(
        &png,
        &colo_util,
        &submitted,
        &admitted_per_s,
        util_exclusive,
        !a.gpu,
    )?;

    println!("smore demo — {label}");
    println!();
    println!("  GPU utilization (GUI)     exclusive {util_exclusive:5.1} %   co-located {util_colo:5.1} %");
    println!("  trainer slowdown (SFD)    {:5.1} %   ({iter_alone:.2} → {iter_colo:.2} ms/iteration, bound θ_train {:.0} %)", sfd * 100.0, a.theta_train * 100.0);
    println!(
        "  function P99 degr. (SLD)  {:5.1} %   (service time co-located vs solo)",
        sld * 100.0
    );
    println!(
        "  deadline satisfaction     {:5.1} %   (DSR: requests within SLO = 5 × solo P99)",
        dsr * 100.0
    );
    println!(
        "  cold starts               {cold} of {} requests ({:.2} %), prewarm {}",
        records.len(),
        cold as f64 / total * 100.0,
        prewarm_spec.name()
    );
    let refused = sh.refusals.load(std::sync::atomic::Ordering::Relaxed);
    println!(
        "  instance starts refused   {refused} (policy {}; see arbiter.log and state/decisions.jsonl)",
        a.policy
    );
    println!();
    println!(
        "  {:<10} {:>8} {:>9} {:>6} {:>10} {:>10} {:>8} {:>7}",
        "function", "requests", "admitted", "cold", "solo p99", "co p99", "SLO", "DSR"
    );
    for f in &per_fn {
        println!(
            "  {:<10} {:>8} {:>9} {:>6} {:>8.2}ms {:>8.2}ms {:>6.1}ms {:>6.1}%",
            f["function"].as_str().unwrap_or(""),
            f["requests"].to_string(),
            f["admitted"].to_string(),
            f["cold_starts"].to_string(),
            f["solo_p99_ms"].as_f64().unwrap_or(f64::NAN),
            f["colocated_p99_ms"].as_f64().unwrap_or(f64::NAN),
            f["slo_ms"].as_f64().unwrap_or(f64::NAN),
            f["dsr"].as_f64().unwrap_or(0.0) * 100.0
        );
    }
    println!();
    println!("  plot: {}", png.display());
    println!("  summary: {}", node.dir.join("summary.json").display());
    Ok(())
}

fn mean(it: impl Iterator<Item = f64>) -> f64 {
    let (s, n) = it.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    if n == 0 {
        f64::NAN
    } else {
        s / n as f64
    }
}

fn plot(
    png: &Path,
    colo: &[(f64, f64)],
    submitted: &[u64],
    admitted: &[u64],
    excl_mean: f64,
    simulated: bool,
) -> Result<()> {
    use plotters::prelude::*;
    static FONT: std::sync::Once = std::sync::Once::new();
    FONT.call_once(|| {
        let _ = plotters::style::register_font(
            "sans-serif",
            FontStyle::Normal,
            dejavu::sans::regular(),
        );
    });
    let root = BitMapBackend::new(png, (1100, 700)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
    let (top, bottom) = root.split_vertically(350);
    let secs = submitted.len() as f64;
    let mut c = ChartBuilder::on(&top)
        .caption(
            format!(
                "GPU utilization (NVML) — {}",
                if simulated {
                    "simulated GPU"
                } else {
                    "real GPU"
                }
            ),
            ("sans-serif", 20),
        )
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(45)
        .build_cartesian_2d(0f64..secs, 0f64..105f64)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    c.configure_mesh()
        .x_desc("seconds")
        .y_desc("%")
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    c.draw_series(LineSeries::new(colo.iter().map(|&(t, u)| (t, u)), &BLUE))
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .label("co-located (trainer + functions)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
    c.draw_series(LineSeries::new([(0.0, excl_mean), (secs, excl_mean)], &RED))
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .label("trainer alone (mean)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
    c.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let ymax = submitted.iter().copied().max().unwrap_or(1).max(1) as f64 * 1.1;
    let mut c = ChartBuilder::on(&bottom)
        .caption(
            "requests per second: submitted vs admitted",
            ("sans-serif", 20),
        )
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(45)
        .build_cartesian_2d(0f64..secs, 0f64..ymax)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    c.configure_mesh()
        .x_desc("seconds (1 s = 1 trace minute)")
        .y_desc("requests")
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    c.draw_series(LineSeries::new(
        submitted
            .iter()
            .enumerate()
            .map(|(i, &v)| (i as f64, v as f64)),
        &BLACK,
    ))
    .map_err(|e| anyhow::anyhow!("{e}"))?
    .label("submitted")
    .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK));
    c.draw_series(LineSeries::new(
        admitted
            .iter()
            .enumerate()
            .map(|(i, &v)| (i as f64, v as f64)),
        &GREEN,
    ))
    .map_err(|e| anyhow::anyhow!("{e}"))?
    .label("admitted and served")
    .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], GREEN));
    c.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    root.present().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}
