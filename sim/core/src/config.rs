//! Configuration of a simulated node, read from the environment by the first process that creates
//! the node's state file. Later processes map the existing file and ignore these variables, so
//! every process of a node sees the same devices.

use smore_protocol::size::parse_size;

/// Default device memory: 80 GiB, an H100 SXM.
pub const DEFAULT_MEMORY: u64 = 80 << 30;
/// Default SM count: 132, an H100 SXM.
pub const DEFAULT_SMS: u32 = 132;
/// Default context footprint: 300 MiB. Reasoning: a CUDA 12 context with lazy module loading
/// takes a few hundred MiB on Hopper (nvidia-smi shows ~300–500 MiB for an idle PyTorch process).
pub const DEFAULT_CONTEXT_MEMORY: u64 = 300 << 20;
/// Default timeslice: 2 ms. Reasoning: NVIDIA does not publish the default compute timeslice;
/// measurements reported for Volta–Hopper put it in the 1–2 ms range, and Olympian (EuroSys'19)
/// uses 1–2 ms quanta for the same reason.
pub const DEFAULT_TIMESLICE_NS: u64 = 2_000_000;
/// Default duration of a kernel from an unknown module image: 10 µs (a small framework op).
pub const DEFAULT_KERNEL_NS: u64 = 10_000;
/// NVML utilization sample period: 1/6 s, the period NVML documents for utilization sampling on
/// recent GPUs (HAMi-core's trackers observe the same ~1/6 s cadence).
pub const SAMPLE_PERIOD_NS: u64 = 166_666_667;
/// Driver version the fake reports: 12.8 (`cuDriverGetVersion` → 12080).
pub const DRIVER_VERSION: u32 = 12080;

/// Everything that describes a simulated node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimConfig {
    pub devices: u32,
    pub memory: u64,
    pub sms: u32,
    pub context_memory: u64,
    pub timeslice_ns: u64,
    pub default_kernel_ns: u64,
    pub name: String,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            devices: 1,
            memory: DEFAULT_MEMORY,
            sms: DEFAULT_SMS,
            context_memory: DEFAULT_CONTEXT_MEMORY,
            timeslice_ns: DEFAULT_TIMESLICE_NS,
            default_kernel_ns: DEFAULT_KERNEL_NS,
            name: "NVIDIA H100 80GB HBM3 (smore simulated)".to_string(),
        }
    }
}

impl SimConfig {
    /// Reads `SMORE_SIM_*`; a malformed value is an error naming the variable.
    pub fn from_env() -> Result<Self, String> {
        let mut c = SimConfig::default();
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        if let Some(v) = var("SMORE_SIM_DEVICES") {
            c.devices = v
                .trim()
                .parse()
                .ok()
                .filter(|n| (1..=crate::MAX_DEVICES as u32).contains(n))
                .ok_or_else(|| {
                    format!(
                        "SMORE_SIM_DEVICES={v:?}: expected 1..={}",
                        crate::MAX_DEVICES
                    )
                })?;
        }
        if let Some(v) = var("SMORE_SIM_MEMORY") {
            c.memory = parse_size(&v).map_err(|e| format!("SMORE_SIM_MEMORY: {e}"))?;
        }
        if let Some(v) = var("SMORE_SIM_CONTEXT_MEMORY") {
            c.context_memory =
                parse_size(&v).map_err(|e| format!("SMORE_SIM_CONTEXT_MEMORY: {e}"))?;
        }
        let num = |k: &str, v: &str| -> Result<u64, String> {
            v.trim()
                .parse::<u64>()
                .map_err(|_| format!("{k}={v:?}: expected a whole number"))
        };
        if let Some(v) = var("SMORE_SIM_SMS") {
            c.sms = num("SMORE_SIM_SMS", &v)?.clamp(1, 1024) as u32;
        }
        if let Some(v) = var("SMORE_SIM_TIMESLICE_US") {
            c.timeslice_ns = num("SMORE_SIM_TIMESLICE_US", &v)?.max(1) * 1000;
        }
        if let Some(v) = var("SMORE_SIM_DEFAULT_KERNEL_US") {
            c.default_kernel_ns = num("SMORE_SIM_DEFAULT_KERNEL_US", &v)? * 1000;
        }
        if let Some(v) = var("SMORE_SIM_NAME") {
            c.name = v;
        }
        Ok(c)
    }
}
