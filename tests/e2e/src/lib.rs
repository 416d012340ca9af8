//! # smore-e2e — the harness end-to-end tests use
//!
//! Owns: locating the built artifacts (fake `libcuda.so.1` / `libnvidia-ml.so.1`, the shim, the
//! client programs), creating a simulated GPU node in a temporary directory, and running real
//! processes against it with the right environment. Tests assert on what the processes print and
//! on the node's shared state.
//!
//! Must never: reach into a process's memory or fake a result — everything observed comes from a
//! real process talking to the driver ABI, or from the node state the driver itself maintains.

pub mod arbiter;
pub mod resolve;

use anyhow::{bail, Context, Result};
pub use arbiter::{registration, Arbiter, MANY_GRANTS_PER_PROCESS};
pub use resolve::Resolution;
use smore_simgpu::{Node, SimConfig};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output};
use std::time::{Duration, Instant};

/// `target/<profile>` of the running test executable (tests live in `target/<profile>/deps`).
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let mut dir = exe.parent().expect("exe dir").to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir
}

/// Finds a built artifact. Binaries and the shared objects of crates built as root units are
/// uplifted to `target/<profile>/`; shared objects of crates built only as (dev-)dependencies of
/// the test — which is how `cargo test --workspace` builds the fake driver on a clean checkout —
/// stay in `target/<profile>/deps/` under their plain name (cdylibs carry no hash suffix).
fn artifact(name: &str) -> PathBuf {
    let top = target_dir().join(name);
    let deps = target_dir().join("deps").join(name);
    let newest = [&top, &deps]
        .into_iter()
        .filter_map(|p| Some((std::fs::metadata(p).ok()?.modified().ok()?, p)))
        .max_by_key(|(t, _)| *t);
    match newest {
        Some((_, p)) => p.clone(),
        None => panic!(
            "{} is missing (also not in deps/): build the workspace first (`cargo test --workspace` builds every artifact the tests use)",
            top.display()
        ),
    }
}

/// Path of a client or tool binary built by the workspace (`sim-probe`, `sim-trainer`, `smore`).
pub fn bin(name: &str) -> PathBuf {
    artifact(name)
}

/// Path of the shim (`libsmore_shim.so`).
pub fn shim_lib() -> PathBuf {
    artifact("libsmore_shim.so")
}

/// A simulated GPU node living in a temporary directory.
pub struct SimGpu {
    dir: tempfile::TempDir,
    env: Vec<(String, String)>,
    cfg: SimConfig,
}

/// Configures a [`SimGpu`].
#[derive(Default)]
pub struct SimGpuBuilder {
    cfg: SimConfig,
}

impl SimGpuBuilder {
    /// Number of simulated devices.
    pub fn devices(mut self, n: u32) -> Self {
        self.cfg.devices = n;
        self
    }
    /// Device memory, e.g. `"8GiB"`.
    pub fn memory(mut self, size: &str) -> Self {
        self.cfg.memory = smore_protocol::size::parse_size(size).expect("size");
        self
    }
    /// Context footprint, e.g. `"0"` to make memory arithmetic in tests exact.
    pub fn context_memory(mut self, size: &str) -> Self {
        self.cfg.context_memory = smore_protocol::size::parse_size(size).expect("size");
        self
    }
    /// Time-slicing quantum between contexts, µs.
    pub fn timeslice_us(mut self, us: u64) -> Self {
        self.cfg.timeslice_ns = us * 1000;
        self
    }
    /// Time slicing (default) or MPS.
    pub fn mode(mut self, mode: smore_simgpu::SchedMode) -> Self {
        self.cfg.mode = mode;
        self
    }
    /// MPS interference coefficient β in thousandths (500 = 0.5).
    pub fn mps_beta_permille(mut self, beta: u32) -> Self {
        self.cfg.mps_beta_permille = beta;
        self
    }
    /// What NVML's per-process utilization counts on a time-sliced device (default: running).
    pub fn nvml_process_util(mut self, model: smore_simgpu::NvmlProcessUtil) -> Self {
        self.cfg.nvml_process_util = model;
        self
    }
    /// What each context switch of a time-sliced device costs, µs (default 0: free).
    pub fn switch_us(mut self, us: u64) -> Self {
        self.cfg.switch_ns = us * 1000;
        self
    }
    /// Creates the node: a temporary directory with the fake driver libraries and the state file.
    pub fn build(self) -> Result<SimGpu> {
        let dir = tempfile::Builder::new().prefix("smore-sim-").tempdir()?;
        let lib = dir.path().join("lib");
        std::fs::create_dir(&lib)?;
        let cuda = artifact("libcuda.so");
        let nvml = artifact("libnvidia_ml.so");
        for (link, target) in [
            ("libcuda.so.1", &cuda),
            ("libcuda.so", &cuda),
            ("libnvidia-ml.so.1", &nvml),
            ("libnvidia-ml.so", &nvml),
        ] {
            std::os::unix::fs::symlink(target, lib.join(link))?;
        }
        let state = dir.path().join("node.state");
        // Create the node now, so every process (and the test) sees the configured devices.
        Node::create(&state.display().to_string(), &self.cfg)
            .map_err(|e| anyhow::anyhow!("creating the simulated node: {e}"))?;
        let env = vec![
            ("LD_LIBRARY_PATH".into(), lib.display().to_string()),
            ("SMORE_SIM_STATE".into(), state.display().to_string()),
        ];
        Ok(SimGpu {
            dir,
            env,
            cfg: self.cfg,
        })
    }
}

impl SimGpu {
    /// A builder starting from the simulator's default configuration (`SimConfig::default`).
    pub fn builder() -> SimGpuBuilder {
        SimGpuBuilder::default()
    }

    /// A node of `devices` GPUs with `memory` each (e.g. `"8GiB"`) and no context footprint, so
    /// that memory arithmetic in tests is exact. Panics when the node cannot be created.
    pub fn exact(devices: u32, memory: &str) -> SimGpu {
        SimGpu::builder()
            .devices(devices)
            .memory(memory)
            .context_memory("0")
            .build()
            .expect("simulated node")
    }

    /// Directory holding `libcuda.so.1` and `libnvidia-ml.so.1`.
    pub fn lib_dir(&self) -> PathBuf {
        self.dir.path().join("lib")
    }

    /// The node's shared state file (`SMORE_SIM_STATE`).
    pub fn state_path(&self) -> PathBuf {
        self.dir.path().join("node.state")
    }

    /// The node's temporary directory (removed when the `SimGpu` is dropped).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Environment a process needs to run on this node.
    pub fn env(&self) -> &[(String, String)] {
        &self.env
    }

    /// A command for `program` with the node's environment set.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new(program);
        for (k, v) in &self.env {
            c.env(k, v);
        }
        c
    }

    /// Starts the `low` simulated trainer (4 × 2 ms kernels and 24 ms of host work per
    /// iteration: busy about a quarter of the time) for `seconds`, and waits 2.5 s: an arbiter
    /// trusts a trainer's solo utilization after 2 s alone.
    pub fn low_trainer_alone_first(&self, seconds: u32) -> std::process::Child {
        let t = self
            .command(bin("sim-trainer"))
            .args([
                "--profile",
                "low",
                "--seconds",
                &seconds.to_string(),
                "--quiet",
            ])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("sim-trainer");
        std::thread::sleep(std::time::Duration::from_millis(2500));
        t
    }

    /// A command for `program` on this node with the shim preloaded and `env` set: a function
    /// process as the tests run one.
    pub fn shimmed(&self, program: impl AsRef<std::ffi::OsStr>, env: &[(&str, &str)]) -> Command {
        let mut c = self.command(program);
        c.env("LD_PRELOAD", shim_lib());
        c.envs(env.iter().copied());
        c
    }

    /// Spawns an unregistered `sim-probe` on `device` that allocates `size` (e.g. `"3GiB"`) and
    /// sleeps: to the arbiter, a training process. Its stdout is piped (and never read; the probe
    /// prints three lines). Kill it at the end of the test.
    pub fn spawn_memory_holder(&self, device: u32, size: &str) -> Child {
        self.command(bin("sim-probe"))
            .env("CUDA_VISIBLE_DEVICES", device.to_string())
            .args([&format!("alloc:v2:{size}"), "ready", "sleep:30000"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("spawning sim-probe")
    }

    /// The node's shared state, observed without joining it as a process.
    pub fn node(&self) -> Node {
        Node::create(&self.state_path().display().to_string(), &self.cfg).expect("observe node")
    }

    /// The node's configuration.
    pub fn config(&self) -> &SimConfig {
        &self.cfg
    }
}

/// `sim-trainer` options of a busy training job: 8 × 5 ms kernels and 15 ms of host time per
/// iteration (about 72 % of the GPU, 55 ms per iteration when alone).
pub const BUSY_TRAINER: [&str; 6] = ["--kernels", "8", "--kernel-us", "5000", "--host-ms", "15"];

/// Polls `f` every 5 ms until it holds, failing the test with `what` when it does not within
/// `limit`. Returns how long it took (some tests assert on that latency).
pub fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) -> Duration {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
    t0.elapsed()
}

/// Waits for `child` to exit, failing the test with `what` and `context()` (logs, typically)
/// when it has not within `limit`.
pub fn wait_exit(
    child: &mut Child,
    what: &str,
    limit: Duration,
    context: impl Fn() -> String,
) -> ExitStatus {
    let t0 = Instant::now();
    loop {
        if let Some(s) = child.try_wait().expect("waiting for a child") {
            return s;
        }
        assert!(
            t0.elapsed() < limit,
            "{what}: not within {limit:?}\n{}",
            context()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs a command to completion, failing with its stderr if it exits non-zero.
pub fn run_ok(cmd: &mut Command) -> Result<String> {
    let out: Output = cmd.output().with_context(|| format!("spawning {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} exited with {}\nstdout:\n{}\nstderr:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// One `key=value` line of a probe or client, parsed.
pub type Fields = HashMap<String, String>;

/// Parses every line that has `key=value` fields.
pub fn parse_lines(out: &str) -> Vec<Fields> {
    out.lines()
        .map(|l| {
            l.split_whitespace()
                .filter_map(|t| t.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<Fields>()
        })
        .filter(|f| !f.is_empty())
        .collect()
}

/// The lines whose `op` is `op`.
pub fn ops<'a>(lines: &'a [Fields], op: &str) -> Vec<&'a Fields> {
    lines
        .iter()
        .filter(|f| f.get("op").map(String::as_str) == Some(op))
        .collect()
}

/// A field parsed as a number, with a message naming what was missing.
pub fn num(f: &Fields, key: &str) -> f64 {
    f.get(key)
        .unwrap_or_else(|| panic!("no {key} in {f:?}"))
        .parse()
        .unwrap_or_else(|_| panic!("{key} not a number in {f:?}"))
}

/// The summary line of `sim-trainer` / `sim-function` (the one starting with `trainer` / `function`).
pub fn summary(out: &str, kind: &str) -> Fields {
    let line = out
        .lines()
        .find(|l| l.starts_with(kind))
        .unwrap_or_else(|| panic!("no {kind} summary in output:\n{out}"));
    parse_lines(line).remove(0)
}
