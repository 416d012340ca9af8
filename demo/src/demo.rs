//! `smore demo`: the whole product on one node, runnable on any machine.
//!
//! Without a GPU it builds a simulated node (the fake `libcuda.so.1` / `libnvidia-ml.so.1` of
//! `sim`) in a directory and runs on it, as real processes, one or more scenarios
//! ([`crate::scenario`]: `default`, `harvest`, `busy`, or `all` in sequence), each:
//! 1. a `smore arbiter` with a config written for the node;
//! 2. baselines: the training job alone (iteration time, GPU utilization) and each function alone
//!    (its solo P99, from which its SLO is set; measured once per demo);
//! 3. the co-located run: the training job (unmodified, no shim) plus three functions whose
//!    requests replay a seeded synthetic trace (prewarm's generator: diurnal, bursty and timer
//!    classes; one trace minute per demo second). The demo plays the serverless platform:
//!    instances start under `smore run` (admission, then the shim with the arbiter's grant) on a
//!    request when none is warm (a cold start) or on a prewarm `load` hint, and stop on `unload`
//!    hints (prewarm's online manager, `--prewarm`). Each request asks the arbiter for
//!    admission before it runs; the platform refuses a request that can no longer meet its SLO
//!    even at solo speed instead of queueing it into a miss (`--no-deadline-refusal` turns that
//!    off).
//!
//! Each scenario ends with a summary — GUI (GPU utilization exclusive vs co-located), SFD
//! (training slowdown), SLD (function P99 degradation), DSR (requests within SLO, of all and of
//! admitted requests), refusals by cause, cold starts — and a PNG; `all` adds one table. Every
//! figure comes from the processes' own output and from NVML, the way an operator would measure
//! them ([`crate::report`] holds the definitions).
//!
//! Owns: the orchestration (processes, platform dispatch, sampling) and the printed report.
//! Must never: print a figure from the simulated GPU without saying so, or lose a request (each
//! is recorded served or refused with its cause).

use crate::report::{self, mean, Record, Refusal, RequestFigures};
use crate::scenario::{
    functions, offered_load, reference_dsr, trace, FunctionSpec, Scenario, ScenarioChoice,
    TrainerShape,
};
use anyhow::{bail, Context, Result};
use serde::Serialize;
use smore_arbiter::gpus::{GpuSource, NvmlSource};
use smore_prewarm::manager::PrewarmManager;
use smore_prewarm::policy::{Action, PolicySettings, PolicySpec};
use smore_protocol::install as artifacts;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Seconds the training job runs alone before functions arrive in the co-located run.
const SETTLE_S: f64 = 2.0;
/// How long the co-located run waits for the training job's first iteration: 120 s (reasoning:
/// a PyTorch trainer on a real GPU takes ~5–15 s to create its context and load its model on a
/// warm machine; a simulated one, milliseconds; ten times the slow case still fails a broken
/// trainer well before the run would have ended).
const TRAINER_START_TIMEOUT: Duration = Duration::from_secs(120);
/// On a real GPU, how long the co-located run waits for every function's instances to start
/// before the replay: 180 s (reasoning: a PyTorch instance takes ~5–15 s to create its context
/// and load its model; six start at once). The replay compresses a trace minute into a second,
/// so an instance that starts with the replay is cold for its first ~10 trace minutes: on an
/// H200 about a quarter of all requests of a 30 s run arrived while the first instances were
/// starting (docs/real-gpu.md, section 9). A node runs for days; the demo measures it warm.
/// The simulated GPU's instances start in milliseconds and are not waited for.
const WARMUP_TIMEOUT: Duration = Duration::from_secs(180);
/// Seconds of the training job alone in the baseline.
const BASELINE_S: f64 = 5.0;
/// After the arbiter refuses an instance start, the platform waits this long before trying
/// again (requests in between are refused with [`Refusal::Instance`]): a refusal reflects the
/// node's state, which the arbiter re-evaluates every reconcile (100 ms here) — retrying per
/// request would spawn a `smore run` per request for nothing.
const RESTART_BACKOFF: Duration = Duration::from_secs(1);
/// Exit codes of `smore run` when the arbiter refused the instance (docs/cli.md,
/// `RefuseCode::exit_code`: 75 no memory … 79 invalid).
const REFUSED_EXIT_CODES: std::ops::RangeInclusive<i32> = 75..=79;

/// A function's SLO over its solo P50 service time: 6 (≈ 5 × solo P99 on an idle machine, where
/// P99 ≈ 1.2 × P50; the P50 because a short solo run's P99 is one CPU hiccup on a loaded machine).
pub const SLO_OVER_SOLO_P50: f64 = 6.0;

/// Options of `smore demo`.
#[derive(clap::Args, Debug, Clone)]
pub struct DemoArgs {
    /// Scenario: default (trainer ~60 % busy), harvest (trainer ~23 % busy, heavy bursty
    /// functions), busy (trainer ~93 % busy), or all three in sequence with a summary table.
    #[arg(long, value_enum, default_value = "default")]
    pub scenario: ScenarioChoice,
    /// Seconds of trace replayed in the co-located run of each scenario (one trace minute per
    /// second).
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
    /// Trainer kernel duration, µs (default: the scenario's).
    #[arg(long)]
    pub trainer_kernel_us: Option<f64>,
    /// Trainer kernels per iteration (default: the scenario's).
    #[arg(long)]
    pub trainer_kernels: Option<u32>,
    /// Host time between trainer iterations (data loading), ms: the idle GPU time smore harvests
    /// (default: the scenario's).
    #[arg(long)]
    pub trainer_host_ms: Option<f64>,
    /// Scale of every function's request rate (default: the scenario's).
    #[arg(long)]
    pub load: Option<f64>,
    /// Requests arriving together at one instant, in groups of this many (default: the
    /// scenario's, 1).
    #[arg(long)]
    pub burst: Option<usize>,
    /// Serve every request, however late, instead of refusing one that can no longer meet its
    /// SLO even at solo speed (and let an instance wait up to 1 s for the arbiter's admission).
    #[arg(long)]
    pub no_deadline_refusal: bool,
    /// The arbiter's deadline-aware deferral (`[policy] defer`, docs/harvest.md "Deferral"):
    /// auto (on where the GPU runs MPS, as on a node by default), on, or off — to compare.
    #[arg(long, value_enum, default_value = "auto")]
    pub defer: PolicyMode,
    /// The arbiter's turns (`[policy] turns`, docs/harvest.md "Serializing the functions"): auto
    /// (the harvesting functions of every GPU take turns, MPS included, as on a node by default),
    /// on, or off — to compare.
    #[arg(long, value_enum, default_value = "auto")]
    pub turns: PolicyMode,
    /// The arbiter's `[watchdog] action` for the demo's node (default: the arbiter's, sigterm).
    /// `log` keeps a function the watchdog would stop running and says why in arbiter.log — to
    /// diagnose a node where the watchdog stops functions (docs/real-gpu.md).
    #[arg(long, value_parser = ["log", "sigterm", "sigkill"])]
    pub watchdog_action: Option<String>,
    /// How the simulated GPU shares itself between processes: timeslice (contexts take turns in
    /// 2 ms slices, as a GPU without MPS; the default) or mps (kernels of different processes run
    /// concurrently and slow each other, as under NVIDIA's Multi-Process Service; docs/simgpu.md).
    /// Only for the simulated GPU: a real GPU runs in the mode its node is set up in.
    #[arg(long, value_enum)]
    pub interference: Option<Interference>,
    /// What the simulated NVML's per-process utilization counts on a time-sliced GPU: running
    /// (a process's own kernel run time; the default) or held (plus the time it waited for a
    /// timeslice with work pending, as a real H200 reported; docs/simgpu.md). Simulated GPU only.
    #[arg(long, value_parser = ["running", "held"])]
    pub nvml_process_util: Option<String>,
    /// Time the simulated time-sliced GPU spends on each context switch, µs (default 0: free;
    /// 250 reproduces the trainer cost of one H200 workload, whose real switches cost 50–170 µs
    /// each by the kernels preempted; docs/simgpu.md). Simulated GPU only.
    #[arg(long)]
    pub switch_us: Option<u64>,
    /// What the demo's arbiter charges per context switch on a GPU without MPS, µs (its `[gpus]
    /// context_switch_us`; docs/harvest.md "Context switches"). Default: the simulated GPU's
    /// --switch-us (the node's operator knows its hardware); 0 with --gpu (on an H200 a charge
    /// made the estimate far too high: docs/real-gpu.md, section 9).
    #[arg(long)]
    pub charge_switch_us: Option<u64>,
    /// A study, simulated GPU only: each function instance waits out the training job's busy
    /// phase — until the simulator's ground truth says the trainer's queued kernels have run —
    /// whenever its request can still meet its SLO afterwards with MARGIN_MS to spare beyond
    /// its solo service time. A reference for what holding buys when the trainer's phase is
    /// known, not smore: no process can see another's queue on a real GPU (docs/harvest.md,
    /// "What perfect phase knowledge buys"). Every report, table and plot is marked as a study.
    #[arg(long, value_name = "MARGIN_MS")]
    pub phase_oracle: Option<f64>,
    /// A study, simulated GPU only: the function instances take turns on the GPU, one request's
    /// kernels at a time, in deadline order (`edf`) or arrival order (`fifo`), through a board
    /// they share — so no function's kernels wait on the GPU behind another function's. What
    /// serializing would buy if smore's shim did it, not smore (docs/harvest.md, "Serializing the
    /// functions"). Every report, table and plot is marked as a study.
    #[arg(long, value_name = "ORDER")]
    pub serialize: Option<String>,
    /// Run on this machine's real GPU 0 (real libcuda and NVML) with PyTorch workloads
    /// (profiling/smore_profiling/demo_workers.py) instead of the simulated GPU.
    #[arg(long)]
    pub gpu: bool,
    /// Directory holding the `smore_profiling` package (default: `profiling/` of the repository
    /// the binary was built in, or ./profiling).
    #[arg(long)]
    pub profiling: Option<PathBuf>,
    /// Keep the node, logs, summary.json and demo.png here (default: ./smore-demo; with
    /// `--scenario all`, each scenario's files in a subdirectory named after it).
    #[arg(long, default_value = "smore-demo")]
    pub out: PathBuf,
}

/// The simulated GPU's interference model (`--interference`; the simulator's `SMORE_SIM_MODE`).
#[derive(clap::ValueEnum, Serialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Interference {
    /// Contexts take turns in time slices (a GPU without MPS).
    #[default]
    Timeslice,
    /// Kernels of different processes run concurrently and slow each other (MPS).
    Mps,
}

impl Interference {
    /// The value of `SMORE_SIM_MODE` that selects this model in the simulated driver.
    pub fn sim_mode(self) -> &'static str {
        match self {
            Interference::Timeslice => "timeslice",
            Interference::Mps => "mps",
        }
    }

    /// How the report names it.
    fn describe(self) -> &'static str {
        match self {
            Interference::Timeslice => {
                "interference is the simulator's time-slicing, not a real GPU's"
            }
            Interference::Mps => "interference is the simulator's MPS model, not a real GPU's",
        }
    }
}

impl DemoArgs {
    /// The simulated GPU's interference model: `None` on a real GPU. Asking for one with `--gpu`
    /// is an error rather than a label the run would not honour.
    pub fn interference(&self) -> Result<Option<Interference>> {
        match (self.gpu, self.interference) {
            (false, i) => Ok(Some(i.unwrap_or_default())),
            (true, None) => Ok(None),
            (true, Some(_)) => anyhow::bail!(
                "--interference chooses the simulated GPU's model; with --gpu the real GPU runs in \
                 the mode its node is set up in (start nvidia-cuda-mps-control for MPS) — drop one of them"
            ),
        }
    }

    /// The simulated NVML's per-process model (`running` unless asked): `None` on a real GPU,
    /// where asking for one is an error.
    pub fn nvml_process_util(&self) -> Result<Option<String>> {
        match (self.gpu, &self.nvml_process_util) {
            (false, m) => Ok(Some(m.clone().unwrap_or_else(|| "running".into()))),
            (true, None) => Ok(None),
            (true, Some(_)) => anyhow::bail!(
                "--nvml-process-util chooses the simulated NVML's model; a real GPU's driver reports \
                 its own way (docs/real-gpu.md) — drop one of them"
            ),
        }
    }

    /// The phase oracle's margin, ms (`--phase-oracle`): `None` unless asked; an error with
    /// `--gpu` (a real driver has no ground truth to give) or for a margin that is not a
    /// non-negative number.
    pub fn phase_oracle(&self) -> Result<Option<f64>> {
        match (self.gpu, self.phase_oracle) {
            (_, None) => Ok(None),
            (true, Some(_)) => anyhow::bail!(
                "--phase-oracle reads the simulated GPU's ground truth, which a real GPU does not \
                 give — drop one of them"
            ),
            (false, Some(m)) if m.is_finite() && m >= 0.0 => Ok(Some(m)),
            (false, Some(m)) => anyhow::bail!(
                "--phase-oracle {m}: the margin is the ms a held request keeps beyond its solo \
                 service time before its SLO — give a number ≥ 0 (e.g. 1)"
            ),
        }
    }

    /// The serialization study's order (`--serialize`): `None` unless asked; an error with
    /// `--gpu` (the real-GPU demo's workers do not take turns) or for an unknown order.
    pub fn serialize(&self) -> Result<Option<&'static str>> {
        match (self.gpu, self.serialize.as_deref()) {
            (_, None) => Ok(None),
            (true, Some(_)) => anyhow::bail!(
                "--serialize is a study of the simulated GPU's function instances; the real-GPU \
                 demo's workers do not take turns — drop one of them"
            ),
            (false, Some("edf")) => Ok(Some("edf")),
            (false, Some("fifo")) => Ok(Some("fifo")),
            (false, Some(o)) => anyhow::bail!(
                "--serialize {o:?}: the order is `edf` (earliest deadline first) or `fifo`"
            ),
        }
    }

    /// The simulated GPU's context-switch time, µs (0 unless asked): `None` on a real GPU,
    /// where asking for one is an error.
    pub fn switch_us(&self) -> Result<Option<u64>> {
        match (self.gpu, self.switch_us) {
            (false, us) => Ok(Some(us.unwrap_or(0))),
            (true, None) => Ok(None),
            (true, Some(_)) => anyhow::bail!(
                "--switch-us sets the simulated GPU's context-switch time; a real GPU switches at \
                 its own cost — drop one of them"
            ),
        }
    }

    /// The arbiter's `[gpus] context_switch_us`: --charge-switch-us, else the simulated GPU's
    /// switch time (0 on a real GPU, whose cost the demo does not know).
    pub fn charge_switch_us(&self) -> Result<u64> {
        Ok(match self.charge_switch_us {
            Some(us) => us,
            None => self.switch_us()?.unwrap_or(0),
        })
    }

    /// The scenario with this run's overrides applied.
    fn resolve(&self, s: Scenario) -> Scenario {
        Scenario {
            trainer: TrainerShape {
                kernel_us: self.trainer_kernel_us.unwrap_or(s.trainer.kernel_us),
                kernels: self.trainer_kernels.unwrap_or(s.trainer.kernels),
                host_ms: self.trainer_host_ms.unwrap_or(s.trainer.host_ms),
            },
            load: self.load.unwrap_or(s.load),
            burst: self.burst.unwrap_or(s.burst),
            ..s
        }
    }
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
        // Only the node's variables and what the caller sets: none of a user's SMORE_* grant or
        // arbiter variables leak into the demo's processes (docs/cli.md).
        smore_protocol::env::scrub_inherited(&mut c);
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

/// The co-located training job: stopped on every way out of the run (on a real GPU it is
/// given the warm-up's longest time on top of the run and would hold the GPU that long).
struct Trainer(Child);

impl Drop for Trainer {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

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
/// `give_up_ms`: how long a served request may wait for the arbiter's admission.
fn function_argv(
    node: &Node,
    f: &FunctionSpec,
    serve: bool,
    give_up_ms: Option<f64>,
) -> Result<Vec<String>> {
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
    if let (true, Some(ms)) = (serve, give_up_ms) {
        v.extend(["--give-up-ms".into(), format!("{ms:.3}")]);
    }
    Ok(v)
}

/// `--defer` and `--turns`: the arbiter's `[policy] defer` and `turns` for the demo's node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PolicyMode {
    /// The arbiter's default (deferral where the GPU runs MPS; turns on every GPU).
    Auto,
    /// On every GPU.
    On,
    /// Nowhere.
    Off,
}

impl PolicyMode {
    /// The config file's value (a TOML string).
    fn as_config(self) -> &'static str {
        match self {
            PolicyMode::Auto => "\"auto\"",
            PolicyMode::On => "\"on\"",
            PolicyMode::Off => "\"off\"",
        }
    }
}

/// Starts an arbiter for `node` whose socket, config, state and log live in `out`.
fn start_arbiter(node: &Node, out: &Path, a: &DemoArgs) -> Result<ArbiterProc> {
    let socket = out.join("arbiter.sock");
    let cfg = out.join("node.toml");
    std::fs::write(
        &cfg,
        format!(
            "[arbiter]\nsocket = {:?}\nstate_dir = {:?}\nreconcile_ms = 100\n\n[gpus]\ncontext_switch_us = {}\n{}\n[policy]\nname = {:?}\ntheta_train = {}\ndefer = {}\nturns = {}\n",
            socket,
            out.join("state"),
            a.charge_switch_us()?,
            // The simulated GPU's event timestamps are exact: no timing-noise allowance. A real
            // GPU gets the node's default (docs/harvest.md, "Timing noise").
            if a.gpu {
                ""
            } else {
                "wait_noise_us = 0\nstretch_noise_us = 0\n"
            },
            a.policy,
            a.theta_train,
            a.defer.as_config(),
            a.turns.as_config()
        ) + &a
            .watchdog_action
            .as_ref()
            .map(|w| format!("\n[watchdog]\naction = {w:?}\n"))
            .unwrap_or_default(),
    )?;
    let _ = std::fs::remove_dir_all(out.join("state"));
    let log = std::fs::File::create(out.join("arbiter.log"))?;
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
                out.join("arbiter.log").display()
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

/// Opens NVML for the demo process itself, pointed at the node (or the real library). The
/// simulated NVML binds a process to the first node it opens, so a demo uses one node for all
/// its scenarios.
fn open_nvml(node: &Node) -> Result<NvmlSource> {
    let lib = if node.gpu.is_some() {
        "libnvidia-ml.so.1".to_string()
    } else {
        for (k, v) in &node.env {
            std::env::set_var(k, v);
        }
        node.dir.join("lib/libnvidia-ml.so.1").display().to_string()
    };
    NvmlSource::open(&lib)
}

/// Samples NVML utilization of GPU 0 every 250 ms until `stop`: (seconds since `origin`, %).
fn sample_util(
    mut src: NvmlSource,
    origin: Instant,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<(NvmlSource, Vec<(f64, f64)>)> {
    std::thread::spawn(move || {
        let mut v = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            if let Ok(s) = src.sample(0) {
                v.push((origin.elapsed().as_secs_f64(), s.util.unwrap_or(0) as f64));
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        (src, v)
    })
}

fn trainer_cmd(node: &Node, t: &TrainerShape, seconds: f64, quiet: bool) -> Result<Command> {
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
            &t.host_ms.to_string(),
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
        &t.kernel_us.to_string(),
        "--kernels",
        &t.kernels.to_string(),
        "--host-ms",
        &t.host_ms.to_string(),
        "--seconds",
        &seconds.to_string(),
    ]);
    if quiet {
        c.arg("--quiet");
    }
    Ok(c)
}

/// Copies the trainer's stdout to `log` and keeps its iterations as (seconds since `origin` at
/// which the iteration ended, iteration ms), and its busy phases where it prints its GPU time.
/// `first` is sent once, at its first iteration (dropped unsent if the output ends without one).
fn follow_trainer(
    stdout: ChildStdout,
    mut log: std::fs::File,
    origin: Instant,
    first: mpsc::Sender<()>,
) -> std::thread::JoinHandle<TrainerLog> {
    std::thread::spawn(move || {
        let mut v = TrainerLog::default();
        let mut first = Some(first);
        for line in BufReader::new(stdout).lines().map_while(|l| l.ok()) {
            let t = origin.elapsed().as_secs_f64();
            let _ = writeln!(log, "{line}");
            let Some(rest) = line.strip_prefix("iter=") else {
                continue;
            };
            let field = |key: &str| {
                rest.split_whitespace()
                    .find_map(|f| f.strip_prefix(key))
                    .and_then(|x| x.parse::<f64>().ok())
            };
            if let Some(ms) = field("ms=") {
                v.iterations.push((t, ms));
                // The simulated trainer prints its GPU time from the iteration's start: its busy
                // phase (the line comes after the iteration's host work).
                if let Some(gpu_us) = field("gpu_us=") {
                    let start = t - ms / 1e3;
                    v.busy.push((start, start + gpu_us / 1e6));
                }
                if let Some(tx) = first.take() {
                    let _ = tx.send(());
                }
            }
        }
        v
    })
}

/// What the trainer's log says, seconds since the demo's origin.
#[derive(Debug, Default)]
struct TrainerLog {
    /// Its iterations: (end, ms).
    iterations: Vec<(f64, f64)>,
    /// Its busy phases, when it prints its GPU time (the simulated trainer): (start, end).
    busy: Vec<(f64, f64)>,
}

/// Why an instance did not start.
#[derive(Debug)]
enum StartError {
    /// The arbiter refused it (`smore run` exited with a refusal code).
    Refused,
    /// Anything else (see the function's log).
    Failed(anyhow::Error),
}

impl From<std::io::Error> for StartError {
    fn from(e: std::io::Error) -> Self {
        StartError::Failed(e.into())
    }
}

impl From<anyhow::Error> for StartError {
    fn from(e: anyhow::Error) -> Self {
        StartError::Failed(e)
    }
}

/// A warm function instance: `smore run … -- sim-function --serve`.
struct Instance {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Instance {
    fn start(sh: &Shared, f: &FunctionSpec, slo_ms: f64) -> Result<Instance, StartError> {
        let node = &sh.node;
        let log = sh.out.join(format!("function-{}.log", f.name));
        let mut c = node.command(std::env::current_exe()?);
        c.env(smore_protocol::wire::ENV_SOCKET, &sh.socket)
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
            .arg(&sh.shim)
            .arg("--")
            // With deadline refusals, a request deferred by the arbiter past its SLO is given up
            // (a refusal) rather than served late.
            .args(function_argv(
                node,
                f,
                true,
                sh.deadline_refusal.then_some(slo_ms),
            )?)
            .args(match (sh.phase_oracle, sh.trainer_pid.get()) {
                (Some(_), None) => {
                    return Err(StartError::Failed(anyhow::anyhow!(
                        "--phase-oracle: an instance started before the co-located trainer"
                    )))
                }
                (Some(margin), Some(pid)) => vec![
                    "--phase-oracle-pid".to_string(),
                    pid.to_string(),
                    "--phase-oracle-slo-ms".to_string(),
                    format!("{slo_ms:.3}"),
                    "--phase-oracle-margin-ms".to_string(),
                    format!("{margin:.3}"),
                ],
                _ => Vec::new(),
            })
            .args(match sh.serialize {
                Some(order) => vec![
                    "--dispatch-board".to_string(),
                    sh.out.join(DISPATCH_BOARD).display().to_string(),
                    "--dispatch-order".to_string(),
                    order.to_string(),
                    "--dispatch-slo-ms".to_string(),
                    format!("{slo_ms:.3}"),
                ],
                None => Vec::new(),
            })
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&log)?,
            );
        let mut child = c
            .spawn()
            .context("starting a function instance")
            .map_err(StartError::Failed)?;
        let stdin = child
            .stdin
            .take()
            .context("stdin")
            .map_err(StartError::Failed)?;
        let mut stdout = BufReader::new(
            child
                .stdout
                .take()
                .context("stdout")
                .map_err(StartError::Failed)?,
        );
        let mut line = String::new();
        stdout.read_line(&mut line)?;
        if line.trim() != "ready" {
            drop(stdin);
            let status = child.wait()?;
            return Err(match status.code() {
                Some(c) if REFUSED_EXIT_CODES.contains(&c) => StartError::Refused,
                _ => StartError::Failed(anyhow::anyhow!(
                    "instance of {} did not start ({status}); see {}",
                    f.name,
                    log.display()
                )),
            });
        }
        Ok(Instance {
            child,
            stdin,
            stdout,
        })
    }

    /// Serves one request that already waited `waited_ms` at the platform: (admitted, service
    /// time in the instance, ms, of which the phase oracle held it, ms, and it waited for its
    /// turn on the serialization study's board, ms).
    fn serve(&mut self, id: u64, waited_ms: f64) -> Result<(bool, f64, f64, f64)> {
        writeln!(self.stdin, "{id} {waited_ms:.3}")?;
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
        let held = line
            .split_whitespace()
            .find_map(|t| t.strip_prefix("held_ms="))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        let turn = line
            .split_whitespace()
            .find_map(|t| t.strip_prefix("turn_ms="))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        Ok((line.contains("admitted=1"), service, held, turn))
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

/// What the dispatcher knows of one instance slot of a function (its worker owns the instance).
#[derive(Default)]
struct SlotState {
    /// Requests sent to the slot and not yet finished (the one in service included).
    pending: AtomicUsize,
    /// An instance is up and ready.
    warm: AtomicBool,
}

/// One function as the platform runs it.
struct FnCtx {
    index: usize,
    spec: FunctionSpec,
    slo_ms: f64,
    /// Solo P50 service time, ms: the least a request takes; a request that cannot meet its SLO
    /// even with this is refused by the deadline check.
    floor_ms: f64,
}

struct Shared {
    records: Mutex<Vec<Record>>,
    prewarm: Mutex<PrewarmManager>,
    /// The co-located run's clock (the trainer's start): every time series is in seconds since.
    origin: Instant,
    /// When the replay started (trace second 0): prewarm's clock. Set once, before the first
    /// request; the trainer's settle period before it is no trace time.
    replay: std::sync::OnceLock<Instant>,
    starts_refused: AtomicU64,
    start_failures: AtomicU64,
    node: Arc<Node>,
    /// The scenario's output directory (logs).
    out: PathBuf,
    socket: PathBuf,
    shim: PathBuf,
    deadline_refusal: bool,
    /// `--phase-oracle`'s margin, ms, and the co-located trainer's pid once it runs.
    phase_oracle: Option<f64>,
    /// `--serialize`'s order.
    serialize: Option<&'static str>,
    trainer_pid: std::sync::OnceLock<u32>,
    /// What the phase oracle held requests, ns in all, and how many it held.
    oracle_held_ns: AtomicU64,
    oracle_held_requests: AtomicU64,
    /// What requests waited for their turn on the serialization study's board, ns in all, and
    /// how many waited 1 ms or more.
    turn_waited_ns: AtomicU64,
    turn_waited_requests: AtomicU64,
}

impl Shared {
    /// Prewarm's clock: trace seconds (one trace minute per demo second) since the replay
    /// started — the clock its `tick(second)` runs on. (Counting from the trainer's start, 2 s
    /// earlier, put every request two trace minutes ahead of the tick: the policy was then asked
    /// about a minute before the function's last active one, answered "never active", and the
    /// demo unloaded every instance every second — 1 462 of 13 680 requests cold in `harvest`.)
    fn trace_time(&self) -> f64 {
        self.replay
            .get()
            .map_or(0.0, |t| t.elapsed().as_secs_f64() * 60.0)
    }

    fn finish(
        &self,
        ctx: &FnCtx,
        second: usize,
        arrival: Instant,
        service_ms: f64,
        refused: Option<Refusal>,
        cold: bool,
    ) {
        let latency_ms = arrival.elapsed().as_secs_f64() * 1e3;
        let _ = self
            .prewarm
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .request_end(ctx.spec.name, self.trace_time());
        self.records
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Record {
                function: ctx.index,
                second,
                arrival_s: arrival.saturating_duration_since(self.origin).as_secs_f64(),
                latency_ms,
                service_ms,
                refused,
                cold,
            });
    }
}

/// Starts an instance in every slot of every pool and waits until each is up, or its start was
/// refused or failed, or [`WARMUP_TIMEOUT`] passed.
fn warm_up(pools: &[Pool], sh: &Shared) {
    let slots: usize = pools.iter().map(|p| p.slots.len()).sum();
    let not_started =
        || sh.starts_refused.load(Ordering::Relaxed) + sh.start_failures.load(Ordering::Relaxed);
    let before = not_started();
    eprintln!(
        "smore demo: starting {slots} instance(s) before the replay (at most {} s)",
        WARMUP_TIMEOUT.as_secs()
    );
    for p in pools {
        p.broadcast(|| Msg::Load);
    }
    let t0 = Instant::now();
    loop {
        let warm = pools
            .iter()
            .flat_map(|p| &p.slots)
            .filter(|s| s.1.warm.load(Ordering::Acquire))
            .count();
        let gave_up = usize::try_from(not_started() - before).unwrap_or(usize::MAX);
        if warm.saturating_add(gave_up) >= slots || t0.elapsed() >= WARMUP_TIMEOUT {
            eprintln!(
                "smore demo: {warm} of {slots} instance(s) up after {:.1} s ({gave_up} refused or failed)",
                t0.elapsed().as_secs_f64()
            );
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Tells the prewarm manager which functions the warm-up left resident, once the replay's first
/// tick has been answered: told before it, every policy — having seen no request yet — answered
/// "unload" to all of them at trace second 0 and undid the warm-up. From the next tick on the
/// policy decides with the first minute's requests seen.
fn mark_warm_loaded(pools: &[Pool], sh: &Shared) {
    let mut pm = sh.prewarm.lock().unwrap_or_else(|e| e.into_inner());
    for p in pools {
        if p.slots.iter().any(|s| s.1.warm.load(Ordering::Acquire)) {
            let _ = pm.set_loaded(p.ctx.spec.name, true);
        }
    }
}

/// One instance slot: starts, serves through and stops its instance.
fn worker(ctx: Arc<FnCtx>, slot: Arc<SlotState>, rx: mpsc::Receiver<Msg>, sh: Arc<Shared>) {
    let mut inst: Option<Instance> = None;
    let mut retry_after: Option<Instant> = None;
    // Starts the instance if none is up; the refusal cause when it cannot.
    let mut ensure = |inst: &mut Option<Instance>| -> Option<Refusal> {
        if inst.is_some() {
            return None;
        }
        if retry_after.is_some_and(|t| Instant::now() < t) {
            return Some(Refusal::Instance);
        }
        match Instance::start(&sh, &ctx.spec, ctx.slo_ms) {
            Ok(i) => {
                *inst = Some(i);
                slot.warm.store(true, Ordering::Release);
                None
            }
            Err(StartError::Refused) => {
                sh.starts_refused.fetch_add(1, Ordering::Relaxed);
                retry_after = Some(Instant::now() + RESTART_BACKOFF);
                Some(Refusal::Instance)
            }
            Err(StartError::Failed(e)) => {
                sh.start_failures.fetch_add(1, Ordering::Relaxed);
                eprintln!("smore demo: {}: {e:#}", ctx.spec.name);
                retry_after = Some(Instant::now() + RESTART_BACKOFF);
                Some(Refusal::Failed)
            }
        }
    };
    for msg in rx {
        match msg {
            Msg::Load => {
                let _ = ensure(&mut inst);
            }
            Msg::Unload => {
                if let Some(i) = inst.take() {
                    slot.warm.store(false, Ordering::Release);
                    i.stop();
                }
            }
            Msg::Request {
                id,
                arrival,
                second,
            } => {
                let cold = inst.is_none();
                let mut refused = ensure(&mut inst);
                let mut service_ms = f64::NAN;
                if refused.is_none() {
                    let waited = arrival.elapsed().as_secs_f64() * 1e3;
                    if sh.deadline_refusal && waited + ctx.floor_ms > ctx.slo_ms {
                        refused = Some(Refusal::Deadline);
                    } else {
                        match inst.as_mut().map(|i| i.serve(id, waited)) {
                            Some(Ok((true, s, held, turn))) => {
                                service_ms = s;
                                if turn > 0.0 {
                                    sh.turn_waited_ns
                                        .fetch_add((turn * 1e6) as u64, Ordering::Relaxed);
                                }
                                if turn >= 1.0 {
                                    sh.turn_waited_requests.fetch_add(1, Ordering::Relaxed);
                                }
                                if held > 0.0 {
                                    sh.oracle_held_ns
                                        .fetch_add((held * 1e6) as u64, Ordering::Relaxed);
                                    sh.oracle_held_requests.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                            Some(Ok((false, ..))) => refused = Some(Refusal::Deferred),
                            Some(Err(_)) | None => {
                                inst = None;
                                slot.warm.store(false, Ordering::Release);
                                refused = Some(Refusal::Failed);
                            }
                        }
                    }
                }
                sh.finish(&ctx, second, arrival, service_ms, refused, cold);
                slot.pending.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }
    if let Some(i) = inst {
        i.stop();
    }
}

/// A function's instance slots and their workers.
struct Pool {
    ctx: Arc<FnCtx>,
    slots: Vec<(mpsc::Sender<Msg>, Arc<SlotState>)>,
}

impl Pool {
    /// The slot a request goes to: the warm one with the shortest queue, else (no instance up)
    /// the one with the shortest queue, which will start one.
    fn pick(&self) -> Option<&(mpsc::Sender<Msg>, Arc<SlotState>)> {
        let pending =
            |s: &&(mpsc::Sender<Msg>, Arc<SlotState>)| s.1.pending.load(Ordering::Acquire);
        self.slots
            .iter()
            .filter(|s| s.1.warm.load(Ordering::Acquire))
            .min_by_key(pending)
            .or_else(|| self.slots.iter().min_by_key(pending))
    }

    fn broadcast(&self, m: fn() -> Msg) {
        for (tx, _) in &self.slots {
            let _ = tx.send(m());
        }
    }

    /// Admits or refuses one arriving request. The platform's deadline check at arrival: a
    /// request behind `ahead` others on a warm instance needs at least (ahead + 1) × its solo
    /// service time; on a cold one, the model's load time plus its service time. When that
    /// exceeds the SLO it is refused at once (and a cold slot is asked to start its instance).
    fn submit(&self, sh: &Shared, id: u64, second: usize) {
        let arrival = Instant::now();
        let f = &self.ctx.spec;
        let _ = sh
            .prewarm
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .request_begin(f.name, sh.trace_time());
        let Some((tx, slot)) = self.pick() else {
            sh.finish(
                &self.ctx,
                second,
                arrival,
                f64::NAN,
                Some(Refusal::Failed),
                true,
            );
            return;
        };
        let warm = slot.warm.load(Ordering::Acquire);
        if sh.deadline_refusal {
            let ahead = slot.pending.load(Ordering::Acquire) as f64;
            let least_ms = if warm {
                (ahead + 1.0) * self.ctx.floor_ms
            } else {
                f.load_ms + self.ctx.floor_ms
            };
            if least_ms > self.ctx.slo_ms {
                if !warm {
                    let _ = tx.send(Msg::Load);
                }
                sh.finish(
                    &self.ctx,
                    second,
                    arrival,
                    f64::NAN,
                    Some(Refusal::Deadline),
                    !warm,
                );
                return;
            }
        }
        slot.pending.fetch_add(1, Ordering::AcqRel);
        if tx
            .send(Msg::Request {
                id,
                arrival,
                second,
            })
            .is_err()
        {
            slot.pending.fetch_sub(1, Ordering::AcqRel);
            sh.finish(
                &self.ctx,
                second,
                arrival,
                f64::NAN,
                Some(Refusal::Failed),
                !warm,
            );
        }
    }
}

/// Polls the arbiter's status (the snapshot `smore status --json` prints) once per second until
/// `stop`: each instance's grant, and the arbiter's estimate of the training slowdown.
fn poll_shares(
    socket: PathBuf,
    origin: Instant,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Polled> {
    use smore_protocol::wire::{Reply, Request};
    std::thread::spawn(move || {
        let mut v = Vec::new();
        let mut estimates = Vec::new();
        let mut client: Option<smore_protocol::conn::Client> = None;
        while !stop.load(Ordering::Relaxed) {
            let next = Instant::now() + Duration::from_secs(1);
            if client.is_none() {
                client = smore_protocol::conn::Client::connect(&socket).ok();
            }
            let t = origin.elapsed().as_secs_f64();
            match client.as_ref().map(|c| c.call(Request::Status)) {
                Some(Ok(Reply::Status { snapshot })) => {
                    for g in snapshot["gpus"].as_array().into_iter().flatten() {
                        if let Some(e) = g["harvest"]["slowdown_estimate"].as_f64() {
                            estimates.push((t, e));
                        }
                        for f in g["functions"].as_array().into_iter().flatten() {
                            if let (Some(name), Some(id), Some(share)) = (
                                f["function"].as_str(),
                                f["id"].as_u64(),
                                f["share"].as_f64(),
                            ) {
                                // Under harvest the raw share is 100 beside training; what
                                // limits the function is its collision budget (ppm of wall
                                // time), shown in percent of wall time.
                                let budget = f["contention_ppm"].as_f64().unwrap_or(0.0);
                                v.push(ShareSample {
                                    t_s: t,
                                    function: name.to_string(),
                                    instance: id,
                                    share_pct: if budget > 0.0 { budget / 1e4 } else { share },
                                    harvest: budget > 0.0,
                                    deferred_ms: f["deferred_ns"].as_f64().unwrap_or(0.0) / 1e6,
                                    turn_waited_ms: f["turn_waited_ns"].as_f64().unwrap_or(0.0)
                                        / 1e6,
                                    turn_cut_ins: f["turn_cut_ins"].as_f64().unwrap_or(0.0),
                                });
                            }
                        }
                    }
                }
                _ => client = None,
            }
            while !stop.load(Ordering::Relaxed) && Instant::now() < next {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        (v, estimates)
    })
}

/// What the status poller collected: each instance's grant at each poll, and (seconds, the
/// arbiter's training-slowdown estimate).
type Polled = (Vec<ShareSample>, Vec<(f64, f64)>);

/// A cumulative figure's total over a run (deferral's holds, the turns' waits): each
/// instance's last figure, summed, ms.
fn total_ms(shares: &[ShareSample], figure: fn(&ShareSample) -> f64) -> f64 {
    let mut last = std::collections::BTreeMap::new();
    for s in shares {
        let e = last.entry(s.instance).or_insert(0.0f64);
        *e = e.max(figure(s));
    }
    last.values().sum()
}

/// One instance's grant at one poll: its SM share, or under harvest its collision budget, both
/// in percent (of GPU time, of wall time).
#[derive(Debug, Clone)]
struct ShareSample {
    t_s: f64,
    function: String,
    instance: u64,
    share_pct: f64,
    /// `share_pct` is a collision budget (harvest), not a raw share.
    harvest: bool,
    /// How long its shims had held launches by deferral so far, ms (cumulative).
    deferred_ms: f64,
    /// How long its shims' launches had waited for their turn on the GPU so far, ms
    /// (cumulative).
    turn_waited_ms: f64,
    /// How many of its shims' launches had cut in beside another function's turn so far
    /// (cumulative; under MPS only).
    turn_cut_ins: f64,
}

/// Each function's solo service times (measured once per demo, alone on the GPU).
struct Solo {
    p50_ms: Vec<f64>,
    p99_ms: Vec<f64>,
}

fn measure_solo(node: &Node, fs: &[FunctionSpec]) -> Result<Solo> {
    let mut s = Solo {
        p50_ms: Vec::new(),
        p99_ms: Vec::new(),
    };
    for f in fs {
        let argv = function_argv(node, f, false, None)?;
        let mut c = node.command(&argv[0]);
        c.args(&argv[1..])
            .args(["--interval-ms", "10", "--seconds", "1.5", "--quiet"]);
        let out = run_to_end(c, "a function alone")?;
        s.p50_ms.push(summary_field(&out, "function", "p50_ms")?);
        s.p99_ms.push(summary_field(&out, "function", "p99_ms")?);
    }
    Ok(s)
}

/// Every figure of one scenario (`summary.json`; the pre-scenario keys are kept).
#[derive(Debug, Clone, Serialize)]
pub struct ScenarioSummary {
    /// The scenario's name.
    pub scenario: &'static str,
    /// The scenario's one-line description.
    pub about: &'static str,
    /// True when every figure comes from the simulated GPU.
    pub simulated: bool,
    /// The simulated GPU's interference model (`timeslice` or `mps`); `None` on a real GPU.
    pub interference: Option<Interference>,
    /// The simulated NVML's per-process model (`running` or `held`); `None` on a real GPU.
    pub nvml_process_util: Option<String>,
    /// The simulated GPU's context-switch time, µs; `None` on a real GPU.
    pub switch_us: Option<u64>,
    /// What the arbiter charged per context switch, µs (`[gpus] context_switch_us`).
    pub charge_switch_us: u64,
    /// Seconds of trace replayed in the co-located run.
    pub seconds: usize,
    /// Name of the prewarm policy.
    pub prewarm: String,
    /// The arbiter's placement policy (fit or smore).
    pub policy: String,
    /// Training slowdown bound θ_train given to the arbiter (fraction).
    pub theta_train: f64,
    /// Seed of the synthetic trace.
    pub seed: u64,
    /// Trainer kernel duration, µs.
    pub trainer_kernel_us: f64,
    /// Trainer kernels per iteration.
    pub trainer_kernels: u32,
    /// Trainer host time per iteration, ms.
    pub trainer_host_ms: f64,
    /// Scale of every function's request rate.
    pub load: f64,
    /// Warm instances the platform may run per function.
    pub instances_per_function: usize,
    /// Requests arriving together in each group of a second's arrivals.
    pub burst: usize,
    /// GPU time the replayed trace asks for, % of the GPU (idle-GPU service times).
    pub offered_load_pct: f64,
    /// The DSR an ideal platform would reach on this trace with the GPU to itself (no trainer,
    /// solo P50 service, in arrival order, refusing what cannot finish within the SLO):
    /// `scenario::reference_dsr`. The demo's DSR is read against it.
    pub dsr_reference: f64,
    /// Mean NVML utilization with the trainer alone, %.
    pub gui_exclusive_pct: f64,
    /// Mean NVML utilization during the co-located replay, %.
    pub gui_colocated_pct: f64,
    /// gui_colocated_pct − gui_exclusive_pct, percentage points.
    pub gui_gain_pp: f64,
    /// Mean trainer iteration time alone, ms.
    pub trainer_iter_alone_ms: f64,
    /// Mean time of the trainer iterations that ran wholly during the replay, ms.
    pub trainer_iter_colocated_ms: f64,
    /// Training slowdown: colocated / alone iteration time − 1.
    pub sfd: f64,
    /// On a real GPU: the trainer alone again after the replay, once the functions are gone,
    /// mean iteration ms (None on the simulated GPU, whose trainer does not drift). A PyTorch
    /// trainer's baseline moved by ±10 % between runs on an H200 (docs/real-gpu.md, sections 9
    /// and 11), more than the slowdowns read against it: the two baselines say how far to trust
    /// one run's SFD.
    pub trainer_iter_alone_after_ms: Option<f64>,
    /// `sfd` against the after-baseline instead (None without one).
    pub sfd_against_after: Option<f64>,
    /// The arbiter's own estimate of the training slowdown (docs/harvest.md), averaged over its
    /// polls during the replay — what an operator sees without the trainer's iteration times.
    pub sfd_estimate: Option<f64>,
    /// How long the functions' shims held launches to wait out the trainer's busy phase
    /// (deferral, docs/harvest.md), ms in total over the run (the arbiter's last poll of each
    /// instance).
    pub deferred_ms: f64,
    /// How long the functions' launches waited for their turn on the GPU (turns, docs/harvest.md
    /// "Serializing the functions"), ms in total over the run (the arbiter's last poll of each
    /// instance).
    pub turn_waited_ms: f64,
    /// How many of the functions' launches cut in beside another function's turn because the
    /// wait would have made their request late (MPS only; docs/harvest.md, "Cut-ins under
    /// MPS"), in total over the run (the arbiter's last poll of each instance).
    pub turn_cut_ins: u64,
    /// `--phase-oracle`'s margin, ms: the functions waited out the trainer's busy phase from the
    /// simulator's ground truth (a study, not smore). `None`: no oracle.
    pub phase_oracle_margin_ms: Option<f64>,
    /// What the phase oracle held requests, ms in all.
    pub phase_oracle_held_ms: f64,
    /// Requests the phase oracle held (it slept at least once before their kernels).
    pub phase_oracle_held_requests: u64,
    /// `--serialize`'s order: the functions took turns on the GPU (a study, not smore). `None`:
    /// they did not.
    pub serialize: Option<&'static str>,
    /// What requests waited for their turn under `--serialize`, ms in all.
    pub serialize_turn_waited_ms: f64,
    /// Requests that waited 1 ms or more for their turn under `--serialize` (another
    /// instance's request held the GPU).
    pub serialize_waited_requests: u64,
    /// Instance starts the arbiter refused (attempts).
    pub refused_instances: u64,
    /// Instance starts that failed for another reason (a defect of the run; see the logs).
    pub instance_start_failures: u64,
    /// The requests by the trainer's phase at their arrival (`report::phase_figures`): where
    /// harvesting loses them. `None` when the trainer does not print its GPU time (on a real
    /// GPU).
    pub by_trainer_phase: Option<report::PhaseFigures>,
    /// The per-request figures (flattened into the same JSON object).
    #[serde(flatten)]
    pub requests: RequestFigures,
}

/// The time series of one scenario's co-located run (seconds since the trainer started).
struct Series {
    /// NVML utilization of the GPU, %.
    util: Vec<(f64, f64)>,
    /// The trainer's iterations: (end, ms).
    iterations: Vec<(f64, f64)>,
    /// The arbiter's grants, polled once per second.
    shares: Vec<ShareSample>,
    /// When the replay started and ended.
    replay: (f64, f64),
}

impl Series {
    /// `shares.csv` (the grants over time) and `trainer.csv` (iteration times over time).
    fn write_csv(&self, out: &Path) -> Result<()> {
        let mut csv =
            String::from("t_s,function,instance,share_pct,kind,deferred_ms,turn_waited_ms\n");
        for s in &self.shares {
            csv.push_str(&format!(
                "{:.3},{},{},{},{},{:.3},{:.3}\n",
                s.t_s,
                s.function,
                s.instance,
                s.share_pct,
                if s.harvest {
                    "collision_budget"
                } else {
                    "sm_share"
                },
                s.deferred_ms,
                s.turn_waited_ms
            ));
        }
        std::fs::write(out.join("shares.csv"), csv)?;
        let mut csv = String::from("t_s,iteration_ms\n");
        for (t, ms) in &self.iterations {
            csv.push_str(&format!("{t:.4},{ms:.3}\n"));
        }
        std::fs::write(out.join("trainer.csv"), csv)?;
        Ok(())
    }
}

/// Runs one scenario on `node`, its files in `out`.
#[allow(clippy::too_many_arguments)]
fn run_scenario(
    a: &DemoArgs,
    sc: &Scenario,
    node: &Arc<Node>,
    nvml: NvmlSource,
    out: &Path,
    shim: &Path,
    fs: &[FunctionSpec],
    solo: &Solo,
    prewarm_spec: &PolicySpec,
) -> Result<(ScenarioSummary, NvmlSource)> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let out = out.canonicalize()?;
    eprintln!("smore demo: scenario {} — {}", sc.name, sc.about);
    let arb = start_arbiter(node, &out, a)?;

    // 1. The training job alone.
    eprintln!("smore demo: baseline — training job alone ({BASELINE_S} s)");
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = sample_util(nvml, Instant::now(), stop.clone());
    let alone = run_to_end(
        trainer_cmd(node, &sc.trainer, BASELINE_S, true)?,
        "the trainer alone",
    );
    stop.store(true, Ordering::Relaxed);
    let (nvml, excl_util) = sampler
        .join()
        .map_err(|_| anyhow::anyhow!("sampler panicked"))?;
    let alone = alone?;
    let util_exclusive = mean(excl_util.iter().skip(2).map(|x| x.1));
    let iter_alone = summary_field(&alone, "trainer", "mean_ms")?;
    // SLO: 6 × solo P50 (≈ 5 × solo P99: P99 ≈ 1.2 × P50 alone on an idle machine) — SMORE sets
    // SLOs as multiples of solo latency. Not 5 × the measured P99: the solo run is 150 requests,
    // its P99 their second-worst, and on a loaded 2-core machine a CPU hiccup made it anything
    // from 1.7 to 12.8 ms for resnet50 between runs (SLOs 8.5–64 ms), which moved DSR by tens of
    // points from run to run. The median is stable to a few percent. 6× leaves room for
    // queueing behind a 5 ms training kernel on a time-sliced GPU, but not for a cold start.
    let slo: Vec<f64> = solo.p50_ms.iter().map(|p| p * SLO_OVER_SOLO_P50).collect();
    eprintln!(
        "smore demo: trainer alone {iter_alone:.2} ms/iteration, GPU {util_exclusive:.0} % busy"
    );

    // 2. Co-located replay.
    let seconds = a.seconds.max(5) as usize;
    let tr = trace(fs, seconds, a.seed, sc.load, sc.burst);
    let offered = offered_load(fs, &tr, seconds);
    let mut pm = PrewarmManager::new(prewarm_spec.clone(), PolicySettings::default())?;
    for f in fs {
        pm.register(f.name, f.model_mib << 20);
    }
    // A board left by an earlier run into the same directory would hold its entries.
    let _ = std::fs::remove_file(out.join(DISPATCH_BOARD));
    let origin = Instant::now();
    let sh = Arc::new(Shared {
        records: Mutex::new(Vec::new()),
        prewarm: Mutex::new(pm),
        origin,
        replay: std::sync::OnceLock::new(),
        starts_refused: AtomicU64::new(0),
        start_failures: AtomicU64::new(0),
        node: node.clone(),
        out: out.clone(),
        socket: arb.1.clone(),
        shim: shim.to_path_buf(),
        deadline_refusal: !a.no_deadline_refusal,
        phase_oracle: a.phase_oracle()?,
        serialize: a.serialize()?,
        trainer_pid: std::sync::OnceLock::new(),
        oracle_held_ns: AtomicU64::new(0),
        oracle_held_requests: AtomicU64::new(0),
        turn_waited_ns: AtomicU64::new(0),
        turn_waited_requests: AtomicU64::new(0),
    });
    // On a real GPU the instances warm before the replay (below), for up to WARMUP_TIMEOUT: the
    // trainer runs on through it and is stopped after the replay.
    let warmup_s = if node.gpu.is_some() {
        WARMUP_TIMEOUT.as_secs_f64()
    } else {
        0.0
    };
    let mut trainer = trainer_cmd(
        node,
        &sc.trainer,
        seconds as f64 + 2.0 + SETTLE_S + warmup_s,
        false,
    )?
    .stdout(Stdio::piped())
    .spawn()
    .map(Trainer)?;
    let _ = sh.trainer_pid.set(trainer.0.id());
    let (first_tx, first_rx) = mpsc::channel();
    let follower = follow_trainer(
        trainer.0.stdout.take().context("trainer stdout")?,
        std::fs::File::create(out.join("trainer-colocated.log"))?,
        origin,
        first_tx,
    );
    // The training job runs alone first, as on a real node where functions arrive beside a
    // running job: the arbiter learns its solo utilization (it trusts it after 8 samples). Alone
    // means iterating: a PyTorch trainer spends seconds creating its context and loading its
    // model before its first step (measured on an H200: the functions' instances were on the
    // GPU 2–3 s before the trainer, so the arbiter never saw it alone; docs/real-gpu.md).
    if first_rx.recv_timeout(TRAINER_START_TIMEOUT).is_err() {
        anyhow::bail!(
            "the co-located training job printed no iteration within {} s (or exited): see {}",
            TRAINER_START_TIMEOUT.as_secs(),
            out.join("trainer-colocated.log").display()
        );
    }
    std::thread::sleep(Duration::from_secs_f64(SETTLE_S));
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = sample_util(nvml, origin, stop.clone());
    let poller = poll_shares(arb.1.clone(), origin, stop.clone());
    let mut pools = Vec::new();
    let mut workers = Vec::new();
    for (i, f) in fs.iter().enumerate() {
        let ctx = Arc::new(FnCtx {
            index: i,
            spec: f.clone(),
            slo_ms: slo[i],
            floor_ms: solo.p50_ms[i],
        });
        let mut slots = Vec::new();
        for _ in 0..sc.instances.max(1) {
            let (tx, rx) = mpsc::channel();
            let state = Arc::new(SlotState::default());
            let (c, s, sh) = (ctx.clone(), state.clone(), sh.clone());
            workers.push(std::thread::spawn(move || worker(c, s, rx, sh)));
            slots.push((tx, state));
        }
        pools.push(Pool { ctx, slots });
    }
    eprintln!(
        "smore demo: co-located — trainer + {} functions replaying {seconds} trace minutes (1 per second), offering {:.0} % of the GPU, prewarm {}",
        fs.len(),
        offered * 100.0,
        prewarm_spec.name()
    );
    if node.gpu.is_some() {
        warm_up(&pools, &sh);
    }
    let start = Instant::now();
    let _ = sh.replay.set(start);
    let replay_start_s = start.duration_since(origin).as_secs_f64();
    let mut next_id = 0u64;
    for sec in 0..seconds {
        let hints = sh
            .prewarm
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .tick(sec as u64)?;
        for h in hints {
            if let Some(p) = pools.iter().find(|p| p.ctx.spec.name == h.function) {
                p.broadcast(match h.action {
                    Action::Load | Action::Keep => || Msg::Load,
                    Action::Unload => || Msg::Unload,
                });
            }
        }
        if sec == 0 && node.gpu.is_some() {
            mark_warm_loaded(&pools, &sh);
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
            pools[fi].submit(&sh, next_id, sec);
            next_id += 1;
        }
        let end = start + Duration::from_secs(sec as u64 + 1);
        if let Some(w) = end.checked_duration_since(Instant::now()) {
            std::thread::sleep(w);
        }
        if sec % 10 == 9 {
            eprintln!("smore demo: {} / {seconds} s", sec + 1);
        }
    }
    drop(pools);
    for w in workers {
        let _ = w.join();
    }
    let replay_end_s = origin.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let (nvml, colo_util) = sampler
        .join()
        .map_err(|_| anyhow::anyhow!("sampler panicked"))?;
    let (shares, estimates) = poller
        .join()
        .map_err(|_| anyhow::anyhow!("status poller panicked"))?;
    if node.gpu.is_some() {
        // It was given the warm-up's longest time on top; what it runs past the replay is not
        // counted (the co-located mean below takes the replay's iterations only).
        let _ = trainer.0.kill();
    }
    let _ = trainer.0.wait()?;
    let TrainerLog { iterations, busy } = follower
        .join()
        .map_err(|_| anyhow::anyhow!("trainer reader panicked"))?;
    drop(arb);
    // The co-located mean: iterations that ran wholly while functions were offered load (the
    // settle period before and the tail after the replay ran alone).
    let iter_colo = mean(
        iterations
            .iter()
            .filter(|(t, ms)| t - ms / 1e3 >= replay_start_s && *t <= replay_end_s)
            .map(|x| x.1),
    );
    let records = sh.records.lock().unwrap_or_else(|e| e.into_inner()).clone();
    // On a real GPU, the trainer alone once more, now that the functions are gone: how far its
    // baseline drifted over the run.
    let iter_after = if node.gpu.is_some() {
        eprintln!("smore demo: baseline again — training job alone ({BASELINE_S} s)");
        let after = run_to_end(
            trainer_cmd(node, &sc.trainer, BASELINE_S, true)?,
            "the trainer alone, after the replay",
        )?;
        let ms = summary_field(&after, "trainer", "mean_ms")?;
        eprintln!(
            "smore demo: trainer alone after the replay {ms:.2} ms/iteration (before: {iter_alone:.2})"
        );
        Some(ms)
    } else {
        None
    };

    // 3. Figures.
    let util_colo = mean(
        colo_util
            .iter()
            .filter(|x| x.0 > replay_start_s + 1.0 && x.0 < replay_start_s + seconds as f64)
            .map(|x| x.1),
    );
    let names: Vec<&str> = fs.iter().map(|f| f.name).collect();
    let requests = report::request_figures(&names, &records, &solo.p99_ms, &slo);
    // The replay's requests only: the phases of the trainer alone before and after hold none.
    let replay_busy: Vec<(f64, f64)> = busy
        .iter()
        .copied()
        .filter(|(a, b)| *a >= replay_start_s && *b <= replay_end_s)
        .collect();
    let by_trainer_phase = report::phase_figures(&records, &slo, &replay_busy);
    let summary = ScenarioSummary {
        scenario: sc.name,
        about: sc.about,
        simulated: !a.gpu,
        interference: a.interference()?,
        nvml_process_util: a.nvml_process_util()?,
        switch_us: a.switch_us()?,
        charge_switch_us: a.charge_switch_us()?,
        seconds,
        prewarm: prewarm_spec.name(),
        policy: a.policy.clone(),
        theta_train: a.theta_train,
        seed: a.seed,
        trainer_kernel_us: sc.trainer.kernel_us,
        trainer_kernels: sc.trainer.kernels,
        trainer_host_ms: sc.trainer.host_ms,
        load: sc.load,
        instances_per_function: sc.instances.max(1),
        burst: sc.burst,
        offered_load_pct: offered * 100.0,
        dsr_reference: reference_dsr(&tr, &solo.p50_ms, &slo),
        gui_exclusive_pct: util_exclusive,
        gui_colocated_pct: util_colo,
        gui_gain_pp: util_colo - util_exclusive,
        trainer_iter_alone_ms: iter_alone,
        trainer_iter_colocated_ms: iter_colo,
        sfd: iter_colo / iter_alone - 1.0,
        trainer_iter_alone_after_ms: iter_after,
        sfd_against_after: iter_after.map(|after| iter_colo / after - 1.0),
        sfd_estimate: {
            // Polls from 10 s into the replay (the estimate's window then holds replay only).
            let during: Vec<f64> = estimates
                .iter()
                .filter(|(t, _)| *t >= replay_start_s + 10.0 && *t <= replay_end_s)
                .map(|(_, e)| *e)
                .collect();
            (!during.is_empty()).then(|| during.iter().sum::<f64>() / during.len() as f64)
        },
        deferred_ms: total_ms(&shares, |s| s.deferred_ms),
        turn_waited_ms: total_ms(&shares, |s| s.turn_waited_ms),
        turn_cut_ins: total_ms(&shares, |s| s.turn_cut_ins).round() as u64,
        phase_oracle_margin_ms: sh.phase_oracle,
        phase_oracle_held_ms: sh.oracle_held_ns.load(Ordering::Relaxed) as f64 / 1e6,
        phase_oracle_held_requests: sh.oracle_held_requests.load(Ordering::Relaxed),
        serialize: sh.serialize,
        serialize_turn_waited_ms: sh.turn_waited_ns.load(Ordering::Relaxed) as f64 / 1e6,
        serialize_waited_requests: sh.turn_waited_requests.load(Ordering::Relaxed),
        refused_instances: sh.starts_refused.load(Ordering::Relaxed),
        instance_start_failures: sh.start_failures.load(Ordering::Relaxed),
        by_trainer_phase,
        requests,
    };
    std::fs::write(
        out.join("summary.json"),
        serde_json::to_string_pretty(&summary)?,
    )?;
    let mut csv =
        String::from("function,second,arrival_s,latency_ms,service_ms,admitted,cold,refused\n");
    for r in &records {
        csv.push_str(&format!(
            "{},{},{:.4},{:.3},{:.3},{},{},{}\n",
            fs[r.function].name,
            r.second,
            r.arrival_s,
            r.latency_ms,
            r.service_ms,
            r.served() as u8,
            r.cold as u8,
            r.refused.map(Refusal::label).unwrap_or("")
        ));
    }
    std::fs::write(out.join("requests.csv"), csv)?;
    let series = Series {
        util: colo_util,
        iterations,
        shares,
        replay: (replay_start_s, replay_end_s),
    };
    series.write_csv(&out)?;
    plot(&out.join("demo.png"), &summary, &series, &records, fs)?;
    Ok((summary, nvml))
}

/// `smore demo`: runs the chosen scenario(s) and prints and writes their reports.
pub fn run(a: DemoArgs) -> Result<()> {
    let prewarm_spec =
        PolicySpec::parse(&a.prewarm).with_context(|| format!("--prewarm {:?}", a.prewarm))?;
    let interference = a.interference()?;
    let nvml_model = a.nvml_process_util()?;
    // Checked before any baseline runs (the run would otherwise fail minutes in).
    a.phase_oracle()?;
    a.serialize()?;
    let node = Arc::new(match interference {
        None => real_node(&a.out, a.profiling.as_deref())?,
        Some(i) => {
            let mut node = simulated_node(&a.out)?;
            // Set, never inherited: the report names the model the node really ran.
            node.env
                .push(("SMORE_SIM_MODE".to_string(), i.sim_mode().to_string()));
            node.env.push((
                "SMORE_SIM_NVML_PROCESS_UTIL".to_string(),
                nvml_model.clone().unwrap_or_else(|| "running".into()),
            ));
            node.env.push((
                "SMORE_SIM_SWITCH_US".to_string(),
                a.switch_us()?.unwrap_or(0).to_string(),
            ));
            node
        }
    });
    let shim = artifacts::require("libsmore_shim.so")?;
    let fs = functions();
    if a.gpu {
        eprintln!(
            "smore demo: real GPU mode, output in {}",
            node.dir.display()
        );
    } else {
        eprintln!(
            "smore demo: simulated node in {} (1 GPU, 16 GiB, interference {}, NVML per-process {}, context switch {} µs, charged {} µs)",
            node.dir.display(),
            interference.map_or("", Interference::sim_mode),
            nvml_model.as_deref().unwrap_or(""),
            a.switch_us()?.unwrap_or(0),
            a.charge_switch_us()?
        );
    }
    let mut nvml = open_nvml(&node)?;
    eprintln!("smore demo: baseline — each function alone");
    let solo = measure_solo(&node, &fs)?;
    let scenarios = a.scenario.scenarios();
    let several = scenarios.len() > 1;
    let mut summaries = Vec::new();
    for sc in scenarios {
        let sc = a.resolve(sc);
        let out = if several {
            node.dir.join(sc.name)
        } else {
            node.dir.clone()
        };
        let (s, n) = run_scenario(&a, &sc, &node, nvml, &out, &shim, &fs, &solo, &prewarm_spec)?;
        nvml = n;
        print_scenario(&s, &out, interference);
        summaries.push(s);
    }
    if several {
        print_table(&summaries, interference);
        std::fs::write(
            node.dir.join("summary.json"),
            serde_json::to_string_pretty(&serde_json::json!({
                "simulated": !a.gpu,
                "interference": interference,
                "nvml_process_util": nvml_model,
                "switch_us": a.switch_us()?,
                "charge_switch_us": a.charge_switch_us()?,
                "phase_oracle_margin_ms": a.phase_oracle()?,
                "serialize": a.serialize()?,
                "scenarios": summaries,
            }))?,
        )?;
        println!("  summary: {}", node.dir.join("summary.json").display());
    }
    Ok(())
}

/// The serialization study's board in a scenario's output directory (`--serialize`; removed
/// before the scenario starts, so no entry of an earlier run is read).
const DISPATCH_BOARD: &str = "dispatch-gpu0.board";

/// The mark of a study (`--phase-oracle`, `--serialize`) on every report, table and plot: its
/// figures are not smore's (docs/harvest.md, "What perfect phase knowledge buys", "Serializing
/// the functions"). `None`: not a study.
fn study_mark(margin_ms: Option<f64>, serialize: Option<&str>) -> Option<String> {
    match (margin_ms, serialize) {
        (None, None) => None,
        (Some(m), None) => Some(format!("PHASE-ORACLE STUDY, not smore (margin {m} ms)")),
        (None, Some(o)) => Some(format!("SERIALIZATION STUDY, not smore ({o})")),
        (Some(m), Some(o)) => Some(format!(
            "PHASE-ORACLE + SERIALIZATION STUDY, not smore (margin {m} ms, {o})"
        )),
    }
}

/// " — <the study's mark>" for a study, "" otherwise.
fn study_label(s: &ScenarioSummary) -> String {
    study_mark(s.phase_oracle_margin_ms, s.serialize).map_or(String::new(), |m| format!(" — {m}"))
}

/// What every printed figure is measured on.
/// `interference`: the simulated GPU's model, `None` on a real GPU.
fn device_label(interference: Option<Interference>) -> String {
    match interference {
        None => "real GPU 0 (PyTorch workloads)".into(),
        Some(i) => format!("SIMULATED GPU ({})", i.describe()),
    }
}

fn print_scenario(s: &ScenarioSummary, out: &Path, interference: Option<Interference>) {
    let gpu = interference.is_none();
    let r = &s.requests;
    println!(
        "smore demo — scenario {} — {} — all figures {}{}",
        s.scenario,
        device_label(interference),
        if gpu { "measured" } else { "simulated" },
        study_label(s)
    );
    println!("  {}", s.about);
    println!();
    println!(
        "  function load offered    {:5.1} % of the GPU (trace: {} s, load ×{}, bursts of {}, {} instance(s) per function)",
        s.offered_load_pct, s.seconds, s.load, s.burst, s.instances_per_function
    );
    println!(
        "  GPU utilization (GUI)     exclusive {:5.1} %   co-located {:5.1} %   gain {:+.1} pp",
        s.gui_exclusive_pct, s.gui_colocated_pct, s.gui_gain_pp
    );
    println!(
        "  trainer slowdown (SFD)    {:5.1} %   ({:.2} → {:.2} ms/iteration, bound θ_train {:.0} %)",
        s.sfd * 100.0,
        s.trainer_iter_alone_ms,
        s.trainer_iter_colocated_ms,
        s.theta_train * 100.0
    );
    if let (Some(after), Some(sfd)) = (s.trainer_iter_alone_after_ms, s.sfd_against_after) {
        println!(
            "  against the trainer alone after  {:5.1} %   ({after:.2} ms/iteration alone after the replay: the baseline moved {:+.1} %)",
            sfd * 100.0,
            (after / s.trainer_iter_alone_ms - 1.0) * 100.0
        );
    }
    if let Some(e) = s.sfd_estimate {
        println!(
            "  arbiter's SFD estimate    {:5.1} %   (from the functions' reported collision time; docs/harvest.md)",
            e * 100.0
        );
    }
    if s.deferred_ms > 0.0 {
        println!(
            "  deferral                  {:5.0} ms  held in all, waiting out the trainer's busy phase (docs/harvest.md)",
            s.deferred_ms
        );
    }
    if s.turn_waited_ms > 0.0 {
        println!(
            "  turns                     {:5.0} ms  waited in all for a turn on the GPU, one function's work at a time (docs/harvest.md)",
            s.turn_waited_ms
        );
    }
    if s.turn_cut_ins > 0 {
        println!(
            "  cut-ins                   {:5}     launches went beside another function's turn, the wait would have made their request late (MPS; docs/harvest.md)",
            s.turn_cut_ins
        );
    }
    if let Some(o) = s.serialize {
        println!(
            "  SERIALIZED ({o})          {:5.0} ms  waited in all for a turn on the GPU ({} requests 1 ms or more), one function's request at a time: a study, not smore (docs/harvest.md)",
            s.serialize_turn_waited_ms, s.serialize_waited_requests
        );
    }
    if let Some(m) = s.phase_oracle_margin_ms {
        println!(
            "  PHASE ORACLE              {:5.0} ms  held in all ({} requests) from the simulator's view of the trainer's queue (margin {m} ms): a study, not smore (docs/harvest.md)",
            s.phase_oracle_held_ms, s.phase_oracle_held_requests
        );
    }
    println!(
        "  function P99 degr. (SLD)  {:5.1} %   (service time co-located vs solo)",
        r.sld * 100.0
    );
    println!(
        "  deadline satisfaction     {:5.1} %   of all requests; {:5.1} % of admitted (DSR: within SLO = 6 × solo P50)",
        r.dsr * 100.0,
        r.dsr_admitted * 100.0
    );
    println!(
        "  reference DSR             {:5.1} %   (this trace on a GPU of its own, ideal platform: what is servable at all)",
        s.dsr_reference * 100.0
    );
    println!(
        "  requests refused          {} of {} ({:.1} %): {} deadline (could not meet the SLO), {} deferred by the arbiter, {} no instance (start refused), {} failed",
        r.refused,
        r.requests,
        r.refused as f64 / r.requests.max(1) as f64 * 100.0,
        r.refused_by.deadline,
        r.refused_by.deferred,
        r.refused_by.instance,
        r.refused_by.failed
    );
    if let Some(p) = &s.by_trainer_phase {
        for (name, b) in [("busy", &p.busy), ("idle", &p.idle)] {
            println!(
                "  arrived trainer {name}      {:>5} requests ({:.0} % of the time): {} refused, {} late, DSR {:.1} %, {:.1} % of admitted",
                b.requests,
                b.time_share * 100.0,
                b.refused,
                b.late,
                b.dsr * 100.0,
                b.dsr_admitted * 100.0
            );
        }
    }
    println!(
        "  cold starts               {} of {} requests ({:.2} %), prewarm {}",
        r.cold_starts,
        r.requests,
        r.cold_start_rate * 100.0,
        s.prewarm
    );
    println!(
        "  instance starts refused   {} (policy {}; see arbiter.log and state/decisions.jsonl){}",
        s.refused_instances,
        s.policy,
        if s.instance_start_failures > 0 {
            format!(
                "; {} failed to start (see function-*.log)",
                s.instance_start_failures
            )
        } else {
            String::new()
        }
    );
    println!();
    println!(
        "  {:<10} {:>8} {:>8} {:>8} {:>5} {:>9} {:>9} {:>9} {:>8} {:>6} {:>8}",
        "function",
        "requests",
        "served",
        "refused",
        "cold",
        "solo p99",
        "svc p99",
        "e2e p99",
        "SLO",
        "DSR",
        "DSR adm"
    );
    for f in &r.functions {
        println!(
            "  {:<10} {:>8} {:>8} {:>8} {:>5} {:>9} {:>9} {:>9} {:>8} {:>5.1}% {:>7.1}%",
            f.function,
            f.requests,
            f.admitted,
            f.refused,
            f.cold_starts,
            ms(f.solo_p99_ms),
            ms(f.colocated_p99_ms),
            ms(f.latency_p99_ms),
            ms(f.slo_ms),
            f.dsr * 100.0,
            f.dsr_admitted * 100.0
        );
    }
    println!();
    println!("  plot: {}", out.join("demo.png").display());
    println!("  summary: {}", out.join("summary.json").display());
    println!();
}

/// A latency for the tables: "-" when there was none (no request served).
fn ms(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.2}ms")
    } else {
        "-".into()
    }
}

fn print_table(v: &[ScenarioSummary], interference: Option<Interference>) {
    let gpu = interference.is_none();
    println!(
        "smore demo — summary of {} scenarios — {} — all figures {}{}",
        v.len(),
        device_label(interference),
        if gpu { "measured" } else { "simulated" },
        v.first().map_or(String::new(), study_label)
    );
    println!();
    println!(
        "  {:<8} {:>7} {:>8} {:>8} {:>7} {:>7} {:>7} {:>8} {:>6} {:>8} {:>7} {:>13} {:>11}",
        "scenario",
        "offered",
        "GUI excl",
        "GUI co",
        "gain",
        "SFD",
        "SFD est",
        "SLD",
        "DSR",
        "DSR adm",
        "DSR ref",
        "refused",
        "cold starts"
    );
    for s in v {
        let r = &s.requests;
        println!(
            "  {:<8} {:>6.1}% {:>7.1}% {:>7.1}% {:>+5.1}pp {:>6.1}% {:>7} {:>7.0}% {:>5.1}% {:>7.1}% {:>6.1}% {:>6}/{:<6} {:>11}",
            s.scenario,
            s.offered_load_pct,
            s.gui_exclusive_pct,
            s.gui_colocated_pct,
            s.gui_gain_pp,
            s.sfd * 100.0,
            s.sfd_estimate
                .map_or("-".to_string(), |e| format!("{:.1}%", e * 100.0)),
            r.sld * 100.0,
            r.dsr * 100.0,
            r.dsr_admitted * 100.0,
            s.dsr_reference * 100.0,
            r.refused,
            r.requests,
            r.cold_starts
        );
    }
    println!();
    if let Some(s) = v.first() {
        println!(
            "  θ_train {:.0} %; SFD must stay under it. DSR counts refused requests as misses; DSR adm only the served ones; DSR ref is the trace's on a GPU of its own (ideal platform).",
            s.theta_train * 100.0
        );
    }
}

/// The scenario's PNG ([`crate::plot`]).
fn plot(
    png: &Path,
    s: &ScenarioSummary,
    series: &Series,
    records: &[Record],
    fs: &[FunctionSpec],
) -> Result<()> {
    use crate::plot::{draw, shares_by_function, FunctionRow, Mark, PlotInput};
    let names: Vec<&str> = fs.iter().map(|f| f.name).collect();
    let samples: Vec<(f64, &str, f64)> = series
        .shares
        .iter()
        .map(|x| (x.t_s, x.function.as_str(), x.share_pct))
        .collect();
    let shares = shares_by_function(&names, &samples);
    let functions = s
        .requests
        .functions
        .iter()
        .zip(shares)
        .enumerate()
        .map(|(i, (f, share))| FunctionRow {
            name: f.function.clone(),
            slo_ms: f.slo_ms,
            requests: records
                .iter()
                .filter(|r| r.function == i)
                .map(|r| {
                    let m = match r.refused {
                        Some(_) => Mark::Refused,
                        None if r.latency_ms <= f.slo_ms => Mark::Met,
                        None => Mark::Missed,
                    };
                    (r.arrival_s, r.latency_ms, m)
                })
                .collect(),
            share,
        })
        .collect();
    let r = &s.requests;
    let input = PlotInput {
        // A study's mark comes first, where the title cannot cut it off.
        title: format!(
            "{}smore demo, scenario {} — {} — policy {}, θ_train {:.0} %",
            study_mark(s.phase_oracle_margin_ms, s.serialize)
                .map_or(String::new(), |m| format!("{m} — ")),
            s.scenario,
            match s.interference {
                Some(Interference::Mps) => "SIMULATED GPU (MPS)",
                Some(Interference::Timeslice) => "SIMULATED GPU (time-sliced)",
                None => "real GPU",
            },
            s.policy,
            s.theta_train * 100.0,
        ),
        subtitle: format!(
            "offered {:.0} % · GPU util {:.1} % alone → {:.1} % co-located ({:+.1} pp) · SFD {:.1} % · DSR {:.1} % of all, {:.1} % of admitted · refused {} of {} · cold {}",
            s.offered_load_pct,
            s.gui_exclusive_pct,
            s.gui_colocated_pct,
            s.gui_gain_pp,
            s.sfd * 100.0,
            r.dsr * 100.0,
            r.dsr_admitted * 100.0,
            r.refused,
            r.requests,
            r.cold_starts
        ),
        functions,
        iterations: series.iterations.clone(),
        iter_alone_ms: s.trainer_iter_alone_ms,
        theta_train: s.theta_train,
        util: series.util.clone(),
        util_exclusive_pct: s.gui_exclusive_pct,
        replay: series.replay,
    };
    draw(png, &input)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn deferral_total_is_each_instances_last_cumulative_figure_summed() {
        let at = |t_s: f64, instance: u64, deferred_ms: f64| ShareSample {
            t_s,
            function: "f".into(),
            instance,
            share_pct: 1.0,
            harvest: true,
            deferred_ms,
            turn_waited_ms: 2.0 * deferred_ms,
            turn_cut_ins: deferred_ms,
        };
        let deferred_total_ms = |s: &[ShareSample]| total_ms(s, |x| x.deferred_ms);
        assert_eq!(deferred_total_ms(&[]), 0.0);
        let polls = [
            at(1.0, 1, 5.0),
            at(1.0, 2, 1.0),
            at(2.0, 1, 12.0),
            at(2.0, 2, 3.0),
        ];
        assert_eq!(deferred_total_ms(&polls), 15.0);
        assert_eq!(total_ms(&polls, |x| x.turn_waited_ms), 30.0);
        assert_eq!(total_ms(&polls, |x| x.turn_cut_ins), 15.0);
    }

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        demo: DemoArgs,
    }

    fn args(extra: &[&str]) -> DemoArgs {
        Cli::try_parse_from(std::iter::once("demo").chain(extra.iter().copied()))
            .unwrap()
            .demo
    }

    #[test]
    fn the_simulated_gpu_is_time_sliced_unless_mps_is_asked_for_and_the_driver_reads_both_values() {
        assert_eq!(
            args(&[]).interference().unwrap(),
            Some(Interference::Timeslice)
        );
        let mps = args(&["--interference", "mps"])
            .interference()
            .unwrap()
            .unwrap();
        assert_eq!(mps, Interference::Mps);
        for (i, mode) in [
            (Interference::Timeslice, smore_simgpu::SchedMode::TimeSlice),
            (Interference::Mps, smore_simgpu::SchedMode::Mps),
        ] {
            assert_eq!(
                i.sim_mode().parse::<smore_simgpu::SchedMode>().unwrap(),
                mode
            );
        }
        assert!(device_label(Some(Interference::Mps)).contains("MPS"));
        assert!(device_label(Some(Interference::Timeslice)).contains("time-slicing"));
    }

    #[test]
    fn summary_json_names_the_model_as_the_flag_does() {
        for i in [Interference::Timeslice, Interference::Mps] {
            assert_eq!(serde_json::to_value(i).unwrap(), i.sim_mode());
        }
    }

    #[test]
    fn the_nvml_model_is_running_unless_asked_and_refused_with_a_real_gpu() {
        assert_eq!(
            args(&[]).nvml_process_util().unwrap().as_deref(),
            Some("running")
        );
        assert_eq!(
            args(&["--nvml-process-util", "held"])
                .nvml_process_util()
                .unwrap()
                .as_deref(),
            Some("held")
        );
        assert_eq!(args(&["--gpu"]).nvml_process_util().unwrap(), None);
        assert_eq!(args(&[]).switch_us().unwrap(), Some(0));
        assert_eq!(
            args(&["--switch-us", "250"]).switch_us().unwrap(),
            Some(250)
        );
        assert!(args(&["--gpu", "--switch-us", "250"]).switch_us().is_err());
        // The arbiter charges what the simulated GPU costs unless told otherwise.
        assert_eq!(args(&[]).charge_switch_us().unwrap(), 0);
        assert_eq!(
            args(&["--switch-us", "250"]).charge_switch_us().unwrap(),
            250
        );
        assert_eq!(
            args(&["--switch-us", "250", "--charge-switch-us", "0"])
                .charge_switch_us()
                .unwrap(),
            0
        );
        assert_eq!(args(&["--gpu"]).charge_switch_us().unwrap(), 0);
        assert_eq!(
            args(&["--gpu", "--charge-switch-us", "250"])
                .charge_switch_us()
                .unwrap(),
            250
        );
        let e = args(&["--gpu", "--nvml-process-util", "held"])
            .nvml_process_util()
            .unwrap_err()
            .to_string();
        assert!(e.contains("drop one of them"), "{e}");
    }

    #[test]
    fn an_interference_model_with_a_real_gpu_is_refused_with_what_to_do() {
        assert_eq!(args(&["--gpu"]).interference().unwrap(), None);
        let e = args(&["--gpu", "--interference", "mps"])
            .interference()
            .unwrap_err()
            .to_string();
        assert!(e.contains("nvidia-cuda-mps-control"), "{e}");
    }
}
