//! `smore demo`: the end-to-end story on one node, runnable anywhere.
//!
//! Without a GPU it builds a simulated node (the fake `libcuda.so.1` / `libnvidia-ml.so.1` of
//! `tests/simgpu`) in a temporary directory and runs, on it, real processes that reach the driver
//! the way the CUDA runtime does: a training job alone, an inference function alone, then both
//! co-located with the function under the shim's SM share. It prints what co-location bought (GPU
//! busy time) and cost (trainer slowdown, function tail latency), measured from the processes'
//! own output: GPU busy time is the kernel time the processes completed, divided by wall time.

use crate::artifacts;
use anyhow::{bail, Context, Result};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

#[derive(clap::Args, Debug, Clone)]
pub struct DemoArgs {
    /// Seconds each phase runs.
    #[arg(long, default_value_t = 4.0)]
    pub seconds: f64,
    /// SM time share granted to the function when co-located, percent.
    #[arg(long, default_value_t = 25)]
    pub share: u32,
    /// Trainer kernel duration, µs.
    #[arg(long, default_value_t = 5000.0)]
    pub trainer_kernel_us: f64,
    /// Trainer kernels per iteration.
    #[arg(long, default_value_t = 8)]
    pub trainer_kernels: u32,
    /// Host time between trainer iterations (data loading), ms — the idle GPU time smore harvests.
    #[arg(long, default_value_t = 15.0)]
    pub trainer_host_ms: f64,
    /// Function kernel duration, µs.
    #[arg(long, default_value_t = 300.0)]
    pub function_kernel_us: f64,
    /// Function kernels per request.
    #[arg(long, default_value_t = 4)]
    pub function_kernels: u32,
    /// Time between function requests, ms.
    #[arg(long, default_value_t = 5.0)]
    pub function_interval_ms: f64,
    /// Keep the node and the processes' logs in this directory instead of a temporary one.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

struct Node {
    _tmp: Option<tempfile::TempDir>,
    dir: PathBuf,
    env: Vec<(String, String)>,
}

fn simulated_node(out: Option<&Path>) -> Result<Node> {
    let (tmp, dir) = match out {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            (None, d.to_path_buf())
        }
        None => {
            let t = tempfile::Builder::new().prefix("smore-demo-").tempdir()?;
            let d = t.path().to_path_buf();
            (Some(t), d)
        }
    };
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
        ("SMORE_SIM_MEMORY".to_string(), "80GiB".to_string()),
    ];
    Ok(Node {
        _tmp: tmp,
        dir,
        env,
    })
}

fn spawn(
    node: &Node,
    prog: &str,
    args: &[String],
    extra_env: &[(String, String)],
    log: &str,
) -> Result<Child> {
    let path = artifacts::require(prog)?;
    let mut c = Command::new(path);
    c.args(args)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(node.dir.join(log))?);
    for (k, v) in node.env.iter().chain(extra_env) {
        c.env(k, v);
    }
    c.spawn().with_context(|| format!("starting {prog}"))
}

fn finish(child: Child, kind: &str) -> Result<HashMap<String, f64>> {
    let out = child.wait_with_output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!("{kind} failed ({}):\n{text}", out.status);
    }
    let line = text
        .lines()
        .find(|l| l.starts_with(kind))
        .with_context(|| format!("no {kind} summary in:\n{text}"))?;
    Ok(line
        .split_whitespace()
        .filter_map(|t| t.split_once('='))
        .filter_map(|(k, v)| v.parse().ok().map(|v| (k.to_string(), v)))
        .collect())
}

/// Runs the demo and prints its summary.
pub fn run(a: DemoArgs) -> Result<()> {
    if !(1..=100).contains(&a.share) {
        bail!("--share must be 1..=100, got {}", a.share);
    }
    let node = simulated_node(a.out.as_deref())?;
    let secs = format!("{}", a.seconds);
    let trainer_args: Vec<String> = vec![
        "--kernel-us".into(),
        a.trainer_kernel_us.to_string(),
        "--kernels".into(),
        a.trainer_kernels.to_string(),
        "--host-ms".into(),
        a.trainer_host_ms.to_string(),
        "--seconds".into(),
        secs.clone(),
        "--quiet".into(),
    ];
    let function_args: Vec<String> = vec![
        "--kernel-us".into(),
        a.function_kernel_us.to_string(),
        "--kernels".into(),
        a.function_kernels.to_string(),
        "--interval-ms".into(),
        a.function_interval_ms.to_string(),
        "--seconds".into(),
        secs,
        "--quiet".into(),
    ];
    let shim = artifacts::find("libsmore_shim.so");
    let mut fn_env = Vec::new();
    if let Some(s) = &shim {
        fn_env.push(("LD_PRELOAD".to_string(), s.display().to_string()));
        fn_env.push(("SMORE_SM_SHARE".to_string(), a.share.to_string()));
    }

    println!(
        "smore demo: simulated GPU node in {} ({} s per phase)",
        node.dir.display(),
        a.seconds
    );
    println!("  trainer : {} × {} µs kernels per iteration, {} ms host time between iterations (no shim)", a.trainer_kernels, a.trainer_kernel_us, a.trainer_host_ms);
    println!(
        "  function: {} × {} µs kernels per request, a request every {} ms",
        a.function_kernels, a.function_kernel_us, a.function_interval_ms
    );
    match &shim {
        Some(_) => println!(
            "  co-located, the function runs under the shim with SM share {}%",
            a.share
        ),
        None => println!("  shim not built: the co-located function runs unthrottled"),
    }

    println!("phase 1/3: trainer alone ...");
    let t_solo = finish(
        spawn(&node, "sim-trainer", &trainer_args, &[], "trainer-solo.log")?,
        "trainer",
    )?;
    println!("phase 2/3: function alone ...");
    let f_solo = finish(
        spawn(
            &node,
            "sim-function",
            &function_args,
            &[],
            "function-solo.log",
        )?,
        "function",
    )?;
    println!("phase 3/3: trainer and function co-located ...");
    let tc = spawn(&node, "sim-trainer", &trainer_args, &[], "trainer-colo.log")?;
    let fc = spawn(
        &node,
        "sim-function",
        &function_args,
        &fn_env,
        "function-colo.log",
    )?;
    let t_colo = finish(tc, "trainer")?;
    let f_colo = finish(fc, "function")?;

    let trainer_busy = |t: &HashMap<String, f64>| {
        t["iters_per_s"] * a.trainer_kernels as f64 * a.trainer_kernel_us / 1e6
    };
    let function_busy = |f: &HashMap<String, f64>| {
        f["requests_per_s"] * a.function_kernels as f64 * a.function_kernel_us / 1e6
    };
    let gui_excl = trainer_busy(&t_solo);
    let gui_colo = trainer_busy(&t_colo) + function_busy(&f_colo);
    let sfd = t_colo["mean_ms"] / t_solo["mean_ms"] - 1.0;
    let sld = f_colo["p99_ms"] / f_solo["p99_ms"] - 1.0;

    println!();
    println!(
        "{:<26}{:>12}{:>14}{:>14}{:>14}{:>12}",
        "phase", "trainer it/s", "trainer it ms", "fn p50 ms", "fn p99 ms", "GPU busy"
    );
    println!(
        "{:<26}{:>12.2}{:>14.2}{:>14}{:>14}{:>11.1}%",
        "trainer alone",
        t_solo["iters_per_s"],
        t_solo["mean_ms"],
        "-",
        "-",
        gui_excl * 100.0
    );
    println!(
        "{:<26}{:>12}{:>14}{:>14.2}{:>14.2}{:>11.1}%",
        "function alone",
        "-",
        "-",
        f_solo["p50_ms"],
        f_solo["p99_ms"],
        function_busy(&f_solo) * 100.0
    );
    println!(
        "{:<26}{:>12.2}{:>14.2}{:>14.2}{:>14.2}{:>11.1}%",
        "co-located",
        t_colo["iters_per_s"],
        t_colo["mean_ms"],
        f_colo["p50_ms"],
        f_colo["p99_ms"],
        gui_colo * 100.0
    );
    println!();
    println!(
        "GPU utilization (GUI): {:.1}% exclusive -> {:.1}% co-located",
        gui_excl * 100.0,
        gui_colo * 100.0
    );
    println!("Trainer slowdown (SFD): {:+.1}%", sfd * 100.0);
    println!("Function P99 degradation (SLD): {:+.1}%", sld * 100.0);
    println!(
        "Function requests served co-located: {:.0}/s",
        f_colo["requests_per_s"]
    );
    println!(
        "(simulated GPU: interference is the simulator's time-slicing model; see docs/simgpu.md)"
    );
    Ok(())
}
