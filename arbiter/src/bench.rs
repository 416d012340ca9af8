//! `smore bench shim`: runs the shim benchmark (`shim-bench`, built with the workspace) on a
//! simulated node, or on the real driver with `--real-gpu`. It prints figures (ns added per
//! launch and per allocation, shim vs bare on the same driver in the same run, and share
//! accuracy); it asserts nothing. See docs/shim.md for what each figure means.

use crate::artifacts;
use anyhow::{Context, Result};

#[derive(clap::Args, Debug)]
pub struct BenchShimArgs {
    /// Fewer, shorter rounds.
    #[arg(long)]
    pub quick: bool,
    /// Use the real CUDA driver and NVML instead of a simulated node.
    #[arg(long)]
    pub real_gpu: bool,
    /// What to measure: all, overhead or share.
    #[arg(default_value = "all", value_parser = ["all", "overhead", "share"])]
    pub what: String,
}

pub fn shim(a: BenchShimArgs) -> Result<()> {
    let bench = artifacts::require("shim-bench")?;
    let mut cmd = std::process::Command::new(&bench);
    if a.quick {
        cmd.arg("--quick");
    }
    cmd.arg(&a.what);
    let _tmp;
    if !a.real_gpu {
        let t = tempfile::Builder::new().prefix("smore-bench-").tempdir()?;
        let node = crate::demo::simulated_node(t.path())?;
        cmd.envs(node.env.iter().map(|(k, v)| (k, v)));
        eprintln!(
            "smore bench shim: simulated GPU in {} (figures are the simulator's, not a GPU's)",
            node.dir.display()
        );
        _tmp = t;
    }
    let status = cmd
        .status()
        .with_context(|| format!("running {}", bench.display()))?;
    if !status.success() {
        anyhow::bail!("shim-bench exited with {status}");
    }
    Ok(())
}
