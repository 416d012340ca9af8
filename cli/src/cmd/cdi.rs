//! `smore cdi generate`: writes the node's Container Device Interface spec (docs/kubernetes.md).
//!
//! Owns: finding what the spec names on this host — the GPUs (NVML, as the arbiter discovers
//! them), the shim (the file the arbiter takes for genuine), the socket (the config), the device
//! nodes, and on the simulated GPU its libraries and state file — and writing the file
//! atomically. What a smore device contains is `smore_arbiter::cdi`'s rule, not this module's.

use anyhow::{Context, Result};
use smore_arbiter::cdi::{self, DeviceNodes, Inputs, SimFiles};
use smore_arbiter::config::Config;
use smore_arbiter::gpus::{GpuSource, NvmlSource};
use std::io::Write;
use std::path::{Path, PathBuf};

/// `smore cdi …`
#[derive(clap::Subcommand)]
pub enum CdiCmd {
    /// Write the CDI spec of this node's smore devices (one per GPU, plus `all`).
    Generate(GenerateArgs),
}

/// `smore cdi generate`
#[derive(clap::Args)]
pub struct GenerateArgs {
    /// Write the spec to this file (atomically; e.g. /etc/cdi/smore.json) instead of stdout.
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// Node config file (the socket, the GPUs, the failure policy); built-in defaults when omitted.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Override the config's socket path.
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// CDI kind of the devices (`<vendor>/<class>`): containers ask for `<kind>=<gpu index>`.
    #[arg(long, default_value = cdi::DEFAULT_KIND)]
    pub kind: String,
}

/// Runs `smore cdi`.
pub fn run(cmd: CdiCmd) -> Result<()> {
    match cmd {
        CdiCmd::Generate(a) => generate(a),
    }
}

/// Where the host's device nodes are.
const DEV: &str = "/dev";
/// The node every host with the NVIDIA driver loaded has; without it NVML answered from the
/// simulated GPU (docs/simgpu.md).
const NVIDIACTL: &str = "/dev/nvidiactl";

fn generate(a: GenerateArgs) -> Result<()> {
    let mut cfg = match &a.config {
        Some(p) => Config::load(p)?,
        None => Config::default(),
    };
    if let Some(s) = a.socket {
        cfg.socket = s;
    }
    cdi::validate_kind(&a.kind)?;
    let source = NvmlSource::open(&cfg.nvml_library)?;
    let mut gpus: Vec<u32> = source.discover()?.iter().map(|g| g.index).collect();
    if let Some(want) = &cfg.gpu_indices {
        gpus.retain(|i| want.contains(i));
    }
    let shim = smore_protocol::install::require(cdi::SHIM_FILE)?;
    // The file itself: the arbiter compares the mapped file's device and inode with it.
    let shim = std::fs::canonicalize(&shim).unwrap_or(shim);
    let sim = if Path::new(NVIDIACTL).exists() {
        None
    } else {
        eprintln!(
            "smore cdi: no {NVIDIACTL} on this host: writing a spec for the simulated GPU (its driver libraries and state are mounted)"
        );
        Some(sim_files(&cfg)?)
    };
    let inputs = Inputs {
        kind: a.kind,
        nodes: DeviceNodes::discover(Path::new(DEV), &gpus),
        gpus,
        shim,
        socket: cfg.socket.clone(),
        failure: cfg.failure_policy,
        sim,
    };
    let spec = cdi::generate(&inputs)?;
    let json = cdi::to_json(&spec);
    match &a.output {
        None => std::io::stdout().write_all(json.as_bytes())?,
        Some(p) => {
            write_atomically(p, &json)?;
            eprintln!(
                "smore cdi: wrote {} ({} device(s): {})",
                p.display(),
                spec.devices.len(),
                spec.devices
                    .iter()
                    .map(|d| format!("{}={}", spec.kind, d.name))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    Ok(())
}

/// Writes `text` to `path` through a temporary file in the same directory and a rename, so a
/// runtime scanning the directory never reads half a spec.
fn write_atomically(path: &Path, text: &str) -> Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let name = path
        .file_name()
        .with_context(|| format!("{} names no file", path.display()))?;
    let tmp = dir.join(format!(
        ".{}.tmp{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| {
        let _ = std::fs::remove_file(&tmp);
        format!("renaming {} to {}", tmp.display(), path.display())
    })
}

/// The simulated GPU's files, found as its programs find them: the libraries through
/// `LD_LIBRARY_PATH` (or the config's `nvml_library` path), the state through `SMORE_SIM_STATE`
/// (default `/tmp/smore-sim-<uid>/node.state`, docs/simgpu.md).
fn sim_files(cfg: &Config) -> Result<SimFiles> {
    let dirs: Vec<PathBuf> = std::env::var_os("LD_LIBRARY_PATH")
        .map(|v| std::env::split_paths(&v).collect())
        .unwrap_or_default();
    let find = |soname: &str, explicit: Option<&Path>| -> Result<PathBuf> {
        let hit = explicit
            .map(Path::to_path_buf)
            .or_else(|| dirs.iter().map(|d| d.join(soname)).find(|p| p.exists()))
            .with_context(|| {
                format!(
                    "{soname} of the simulated GPU not found in LD_LIBRARY_PATH {dirs:?}: set LD_LIBRARY_PATH as for the arbiter"
                )
            })?;
        std::fs::canonicalize(&hit).with_context(|| format!("resolving {}", hit.display()))
    };
    let nvml_path = Path::new(&cfg.nvml_library);
    let nvml = find(
        "libnvidia-ml.so.1",
        nvml_path.is_absolute().then_some(nvml_path),
    )?;
    let cuda = find("libcuda.so.1", None)?;
    let state = match std::env::var("SMORE_SIM_STATE") {
        Ok(p) if !p.is_empty() => PathBuf::from(p),
        _ => PathBuf::from(format!(
            "/tmp/smore-sim-{}/node.state",
            rustix::process::getuid().as_raw()
        )),
    };
    let state = std::path::absolute(&state).unwrap_or(state);
    Ok(SimFiles { cuda, nvml, state })
}
