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
/// Default MPS interference coefficient β = 0.5 (stored as 500 ‰): with k contexts' kernels
/// running concurrently each progresses at 1/(1 + β·(k−1)) of its solo rate (docs/simgpu.md,
/// "MPS mode"). Reasoning: β = 1 would give MPS no aggregate gain over time slicing and β = 0 perfect
/// isolation; published measurements put MPS between the two — spatial sharing raises aggregate
/// throughput over time-only multiplexing (Jain et al., "Dynamic Space-Time Scheduling for GPU
/// Inference", arXiv:1901.00041) while an unmanaged MPS neighbour still inflates a job's kernel
/// times substantially (Strati et al., Orion, EuroSys'24, the SMORE paper's ref. [50]). For kernels
/// of DL training that fill most SMs, 0.5 (two saturating processes: each 1.5× slower, 1.33× the
/// aggregate throughput of time slicing) is a modelling assumption in that range, not a measured
/// constant: set `SMORE_SIM_MPS_BETA` to study others.
pub const DEFAULT_MPS_BETA_PERMILLE: u32 = 500;
/// Largest accepted β: 10 (each extra concurrent kernel costs ten solo kernels) is already far
/// past any published MPS slowdown; larger values are almost certainly a typo.
pub const MAX_MPS_BETA_PERMILLE: u32 = 10_000;

/// How kernels of different processes share a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SchedMode {
    /// No MPS: contexts are time-sliced round-robin (one context's kernels on the GPU at a time).
    #[default]
    TimeSlice,
    /// MPS: kernels of different processes run concurrently and slow each other down
    /// (see [`DEFAULT_MPS_BETA_PERMILLE`]).
    Mps,
}

impl SchedMode {
    /// Value stored in the node's header.
    pub(crate) fn code(self) -> u32 {
        match self {
            SchedMode::TimeSlice => 0,
            SchedMode::Mps => 1,
        }
    }

    pub(crate) fn from_code(c: u32) -> SchedMode {
        if c == 1 {
            SchedMode::Mps
        } else {
            SchedMode::TimeSlice
        }
    }
}

impl std::str::FromStr for SchedMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "timeslice" | "time-slice" | "time_slice" => Ok(SchedMode::TimeSlice),
            "mps" => Ok(SchedMode::Mps),
            other => Err(format!("{other:?}: expected timeslice or mps")),
        }
    }
}

impl std::fmt::Display for SchedMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SchedMode::TimeSlice => "timeslice",
            SchedMode::Mps => "mps",
        })
    }
}

/// Largest context-switch time accepted, ns: 10 ms (five default timeslices; a switch that long
/// is almost certainly a typo for µs). Default 0: switching is free unless a study sets
/// `SMORE_SIM_SWITCH_US`.
///
/// Why it exists: on an NVIDIA H200 without MPS (docs/real-gpu.md, section 8, point 4) a
/// training loop lost ≈ 0.98 ms per request of a shimmed inference loop (16 kernels and a sync)
/// whose own kernels took ≈ 0.5 ms — the rest is the GPU taking itself from the trainer's context
/// and back, ≈ 0.25 ms per switch if the two switches of a request cost the same. One workload on
/// one device is the whole evidence, so it is a knob to study, not yet the default.
pub const MAX_SWITCH_NS: u64 = 10_000_000;

/// What the simulated NVML's per-process utilization (`nvmlDeviceGetProcessUtilization`'s
/// `smUtil`) counts on a time-sliced device (`SMORE_SIM_NVML_PROCESS_UTIL`). Under MPS it is
/// always the time a process's kernels were running.
///
/// Measured on an NVIDIA H200, driver 580.159.04, without MPS (docs/real-gpu.md, section 8): a
/// shimmed inference loop using ~9 % of the GPU read 9.1 % alone, but 60.8 % (max 99) beside a
/// training loop, and 98–99 % for 14 s in the arbiter run, while the trainer read 92–99 %: the
/// per-process figures summed past the device's utilization. [`NvmlProcessUtil::Held`] models
/// that as run time plus the time the process waited for its timeslice with work pending (both
/// processes read ~100 % when both always have work, as measured); the exact rule of the real
/// driver is not documented, and one device and driver is the whole evidence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NvmlProcessUtil {
    /// A process's own kernel run time (each process's figure is its share of the device; the
    /// figures sum to at most the device's utilization).
    #[default]
    Running,
    /// Run time plus the time spent waiting for a timeslice with work pending, as the real
    /// driver reported on a time-sliced H200.
    Held,
}

impl NvmlProcessUtil {
    /// Value stored in the node's header.
    pub(crate) fn code(self) -> u32 {
        match self {
            NvmlProcessUtil::Running => 0,
            NvmlProcessUtil::Held => 1,
        }
    }

    pub(crate) fn from_code(c: u32) -> NvmlProcessUtil {
        if c == 1 {
            NvmlProcessUtil::Held
        } else {
            NvmlProcessUtil::Running
        }
    }
}

impl std::str::FromStr for NvmlProcessUtil {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "running" => Ok(NvmlProcessUtil::Running),
            "held" => Ok(NvmlProcessUtil::Held),
            other => Err(format!("{other:?}: expected running or held")),
        }
    }
}

impl std::fmt::Display for NvmlProcessUtil {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NvmlProcessUtil::Running => "running",
            NvmlProcessUtil::Held => "held",
        })
    }
}

/// Parses a non-negative decimal (`0.5`, `1`, `0.125`) into thousandths, exactly (no float
/// rounding surprises): at most three decimals.
fn parse_permille(v: &str) -> Option<u32> {
    let v = v.trim();
    let (int, frac) = v.split_once('.').unwrap_or((v, ""));
    if int.is_empty() && frac.is_empty() || frac.len() > 3 {
        return None;
    }
    let digits = |s: &str| s.chars().all(|c| c.is_ascii_digit());
    if !digits(int) || !digits(frac) {
        return None;
    }
    let i: u32 = if int.is_empty() { 0 } else { int.parse().ok()? };
    let f: u32 = if frac.is_empty() {
        0
    } else {
        format!("{frac:0<3}").parse().ok()?
    };
    i.checked_mul(1000)?.checked_add(f)
}

/// Everything that describes a simulated node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimConfig {
    /// Number of simulated devices on the node (`SMORE_SIM_DEVICES`).
    pub devices: u32,
    /// Memory of each device, bytes (`SMORE_SIM_MEMORY`).
    pub memory: u64,
    /// Streaming multiprocessors per device (`SMORE_SIM_SMS`).
    pub sms: u32,
    /// Device memory a context takes when it is created, bytes (`SMORE_SIM_CONTEXT_MEMORY`).
    pub context_memory: u64,
    /// Time-slicing quantum between contexts, ns (`SMORE_SIM_TIMESLICE_US` × 1000).
    pub timeslice_ns: u64,
    /// Duration of a kernel from an unknown module image, ns (`SMORE_SIM_DEFAULT_KERNEL_US` × 1000).
    pub default_kernel_ns: u64,
    /// Device name reported by the driver and NVML (`SMORE_SIM_NAME`).
    pub name: String,
    /// Time slicing (default) or MPS.
    pub mode: SchedMode,
    /// MPS interference coefficient β in thousandths (only used in [`SchedMode::Mps`]).
    pub mps_beta_permille: u32,
    /// What NVML's per-process utilization counts on a time-sliced device
    /// (`SMORE_SIM_NVML_PROCESS_UTIL`).
    pub nvml_process_util: NvmlProcessUtil,
    /// Time a time-sliced device spends switching contexts, ns (`SMORE_SIM_SWITCH_US` × 1000; see
    /// [`MAX_SWITCH_NS`]).
    pub switch_ns: u64,
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
            mode: SchedMode::TimeSlice,
            mps_beta_permille: DEFAULT_MPS_BETA_PERMILLE,
            nvml_process_util: NvmlProcessUtil::Running,
            switch_ns: 0,
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
        if let Some(v) = var("SMORE_SIM_MODE") {
            c.mode = v.parse().map_err(|e| format!("SMORE_SIM_MODE={e}"))?;
        }
        if let Some(v) = var("SMORE_SIM_SWITCH_US") {
            c.switch_ns = num("SMORE_SIM_SWITCH_US", &v)?
                .checked_mul(1000)
                .filter(|ns| *ns <= MAX_SWITCH_NS)
                .ok_or_else(|| {
                    format!(
                        "SMORE_SIM_SWITCH_US={v:?}: expected 0 to {} µs",
                        MAX_SWITCH_NS / 1000
                    )
                })?;
        }
        if let Some(v) = var("SMORE_SIM_NVML_PROCESS_UTIL") {
            c.nvml_process_util = v
                .parse()
                .map_err(|e| format!("SMORE_SIM_NVML_PROCESS_UTIL={e}"))?;
        }
        if let Some(v) = var("SMORE_SIM_MPS_BETA") {
            c.mps_beta_permille = parse_permille(&v)
                .filter(|b| *b <= MAX_MPS_BETA_PERMILLE)
                .ok_or_else(|| {
                    format!(
                        "SMORE_SIM_MPS_BETA={v:?}: expected a decimal from 0 to {} with at most 3 decimals",
                        MAX_MPS_BETA_PERMILLE / 1000
                    )
                })?;
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permille_parses_exact_decimals_and_refuses_the_rest() {
        assert_eq!(parse_permille("0.5"), Some(500));
        assert_eq!(parse_permille("1"), Some(1000));
        assert_eq!(parse_permille(".125"), Some(125));
        assert_eq!(parse_permille("2.05"), Some(2050));
        assert_eq!(parse_permille("0"), Some(0));
        for bad in ["", ".", "-1", "0.1234", "1e3", "abc", "1.x"] {
            assert_eq!(parse_permille(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn mode_names_round_trip() {
        for m in [SchedMode::TimeSlice, SchedMode::Mps] {
            assert_eq!(m.to_string().parse::<SchedMode>(), Ok(m));
            assert_eq!(SchedMode::from_code(m.code()), m);
        }
        assert!("spatial".parse::<SchedMode>().is_err());
        for m in [NvmlProcessUtil::Running, NvmlProcessUtil::Held] {
            assert_eq!(m.to_string().parse::<NvmlProcessUtil>(), Ok(m));
            assert_eq!(NvmlProcessUtil::from_code(m.code()), m);
        }
        assert!("pending".parse::<NvmlProcessUtil>().is_err());
        assert_eq!(
            SimConfig::default().switch_ns,
            0,
            "switching is free by default"
        );
    }
}
