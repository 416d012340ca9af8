//! What the arbiter knows about the GPUs: discovery and periodic samples, through NVML.
//!
//! NVML is the authority on memory and on which processes use a GPU; what shims report is only
//! a hint. [`GpuSource`] is the seam that lets unit tests drive the arbiter's state without a
//! driver; the daemon always uses [`NvmlSource`] (on the simulated GPU, NVML is the fake
//! `libnvidia-ml.so.1`, reached through the same `nvml-wrapper` calls as a real one).

use anyhow::{Context, Result};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;
use std::collections::HashMap;
use std::ffi::OsStr;

/// A GPU as discovered.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct GpuInfo {
    /// NVML index (what `CUDA_VISIBLE_DEVICES` names, absent remapping).
    pub index: u32,
    /// NVML UUID.
    pub uuid: String,
    /// Product name.
    pub name: String,
    /// Total memory, bytes.
    pub total: u64,
}

/// How a GPU's processes share it, as NVML shows it: defined beside the grant page, which
/// carries it to the shims (docs/harvest.md, "Waits under MPS").
pub use smore_protocol::grant::Sharing;

/// One NVML reading of a GPU.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuSample {
    /// Memory in use on the device (all processes + driver), bytes.
    pub used: u64,
    /// Device utilization, percent of time a kernel ran over NVML's last sample period.
    pub util: Option<u32>,
    /// Running compute processes: pid → used memory in bytes.
    pub procs: HashMap<u32, u64>,
    /// Per-process SM utilization samples: pid → percent.
    pub proc_util: HashMap<u32, u32>,
    /// How the processes share the GPU, when this sample tells (see [`Sharing`]).
    pub sharing: Option<Sharing>,
    /// The processes NVML lists as MPS clients (none when it lists none or cannot tell). A
    /// function's page says MPS only when its processes and the trainers are all among them
    /// (docs/harvest.md, "Waits under MPS").
    pub mps_clients: Vec<u32>,
}

/// Where GPU facts come from.
pub trait GpuSource: Send {
    /// The GPUs present.
    fn discover(&self) -> Result<Vec<GpuInfo>>;
    /// One sample of GPU `index`: memory, utilization, processes.
    fn sample(&mut self, index: u32) -> Result<GpuSample>;
}

/// The NVML-backed source.
pub struct NvmlSource {
    nvml: Nvml,
    /// Last process-utilization timestamp seen per GPU (NVML returns samples newer than it).
    last_ts: HashMap<u32, u64>,
    /// Last per-process SM utilization seen per GPU: NVML refreshes its samples about every
    /// 1/6 s, so a faster poll often finds nothing new; the last value stands until replaced.
    last_util: HashMap<u32, HashMap<u32, u32>>,
}

impl NvmlSource {
    /// Loads NVML from `library` (a path or a soname) and initializes it.
    pub fn open(library: &str) -> Result<NvmlSource> {
        let nvml = Nvml::builder()
            .lib_path(OsStr::new(library))
            .init()
            .with_context(|| {
                format!(
                    "cannot initialise NVML from {library:?}: is the NVIDIA driver installed (or, \
                     for the simulated GPU, LD_LIBRARY_PATH set to its lib dir)? Set \
                     [gpus] nvml_library to the library's path if it lives elsewhere"
                )
            })?;
        Ok(NvmlSource {
            nvml,
            last_ts: HashMap::new(),
            last_util: HashMap::new(),
        })
    }
}

impl GpuSource for NvmlSource {
    fn discover(&self) -> Result<Vec<GpuInfo>> {
        let n = self.nvml.device_count().context("NVML device count")?;
        let mut out = Vec::new();
        for i in 0..n {
            let d = self
                .nvml
                .device_by_index(i)
                .with_context(|| format!("NVML device {i}"))?;
            out.push(GpuInfo {
                index: i,
                uuid: d.uuid().with_context(|| format!("UUID of GPU {i}"))?,
                name: d.name().unwrap_or_else(|_| "unknown".into()),
                total: d
                    .memory_info()
                    .with_context(|| format!("memory of GPU {i}"))?
                    .total,
            });
        }
        Ok(out)
    }

    fn sample(&mut self, index: u32) -> Result<GpuSample> {
        let d = self.nvml.device_by_index(index)?;
        let mem = d.memory_info()?;
        let util = d.utilization_rates().ok().map(|u| u.gpu);
        let procs = d
            .running_compute_processes()?
            .into_iter()
            .map(|p| {
                let used = match p.used_gpu_memory {
                    UsedGpuMemory::Used(b) => b,
                    UsedGpuMemory::Unavailable => 0,
                };
                (p.pid, used)
            })
            .collect();
        let procs: HashMap<u32, u64> = procs;
        // A driver without the MPS list (or a failing call) leaves the mode unknown, not wrong.
        let mps = d.mps_running_compute_processes().ok();
        let sharing = Sharing::from_process_lists(procs.len(), mps.as_ref().map(Vec::len));
        let mut mps_clients: Vec<u32> = mps.into_iter().flatten().map(|p| p.pid).collect();
        mps_clients.sort_unstable();
        let since = self.last_ts.get(&index).copied().unwrap_or(0);
        let proc_util = self.last_util.entry(index).or_default();
        // Processes that are gone take their last sample with them.
        proc_util.retain(|pid, _| procs.contains_key(pid));
        match d.process_utilization_stats(since) {
            Ok(samples) => {
                let mut newest = since;
                for s in samples {
                    newest = newest.max(s.timestamp);
                    proc_util.insert(s.pid, s.sm_util);
                }
                self.last_ts.insert(index, newest);
            }
            // No sample newer than `since` (idle GPU) or not supported: no per-process figure.
            Err(NvmlError::NotFound) | Err(NvmlError::NotSupported) => {}
            Err(e) => return Err(e.into()),
        }
        let proc_util = proc_util.clone();
        Ok(GpuSample {
            used: mem.used,
            util,
            procs,
            proc_util,
            sharing,
            mps_clients,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sharing_mode_is_read_from_the_process_lists_and_unknown_when_they_cannot_tell() {
        assert_eq!(Sharing::from_process_lists(2, Some(2)), Some(Sharing::Mps));
        assert_eq!(Sharing::from_process_lists(3, Some(1)), Some(Sharing::Mps));
        assert_eq!(
            Sharing::from_process_lists(2, Some(0)),
            Some(Sharing::TimeSliced)
        );
        // An idle GPU, or a driver without the MPS list, says nothing.
        assert_eq!(Sharing::from_process_lists(0, Some(0)), None);
        assert_eq!(Sharing::from_process_lists(2, None), None);
        assert_eq!(
            serde_json::to_value(Sharing::TimeSliced).unwrap(),
            "time-sliced"
        );
        assert_eq!(serde_json::to_value(Sharing::Mps).unwrap(), "mps");
    }
}
