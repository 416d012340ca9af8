//! The mapped node: opening or creating the state file, the process table, device memory and the
//! queries NVML answers from.

use crate::config::{SchedMode, SimConfig, DRIVER_VERSION, SAMPLE_PERIOD_NS};
use crate::layout::*;
use crate::lock::SharedMutex;
use std::ffi::CString;
use std::fmt;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};

/// Errors the simulated node reports; the fake libraries map them to CUDA / NVML codes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SimError {
    /// The state file could not be opened, created or mapped.
    Io(String),
    /// The state file exists but was written by another layout version or is corrupt.
    BadState(String),
    /// The process table is full.
    TooManyProcesses,
    /// The device ordinal is not below the node's device count.
    InvalidDevice,
    /// A fixed-size table (streams, events, queued ops) is full.
    OutOfResources,
    /// A stream, event or process handle that this process does not own or that does not exist.
    InvalidHandle,
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SimError::Io(s) | SimError::BadState(s) => f.write_str(s),
            SimError::TooManyProcesses => write!(f, "more than {MAX_PROCS} processes on the node"),
            SimError::InvalidDevice => f.write_str("invalid device ordinal"),
            SimError::OutOfResources => f.write_str("simulated driver table full"),
            SimError::InvalidHandle => f.write_str("invalid handle"),
        }
    }
}

/// Allocation refused: the device does not have `requested` bytes free.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemError {
    /// Size of the refused allocation, bytes.
    pub requested: u64,
    /// Free memory of the device when it was refused, bytes.
    pub free: u64,
}

/// Static description of a device.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    /// Device ordinal on the node (0-based).
    pub index: u32,
    /// Marketing name, as `cuDeviceGetName` and NVML report it.
    pub name: String,
    /// Random version-4 UUID fixed when the node was created; see [`DeviceInfo::uuid_string`].
    pub uuid: [u8; 16],
    /// Device memory, bytes.
    pub total_mem: u64,
    /// Number of streaming multiprocessors.
    pub sm_count: u32,
}

impl DeviceInfo {
    /// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as NVML and nvidia-smi print it.
    pub fn uuid_string(&self) -> String {
        let h: Vec<String> = self.uuid.iter().map(|b| format!("{b:02x}")).collect();
        format!(
            "GPU-{}-{}-{}-{}-{}",
            h[0..4].concat(),
            h[4..6].concat(),
            h[6..8].concat(),
            h[8..10].concat(),
            h[10..16].concat()
        )
    }
}

/// One process's footprint on a device (NVML's running-process list).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcUsage {
    /// Process id of the process holding the memory.
    pub pid: u32,
    /// Device memory it holds (context plus allocations), bytes.
    pub used_mem: u64,
}

/// Per-process SM utilization over a window (NVML's process utilization samples).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UtilSample {
    /// Process id the sample is about.
    pub pid: u32,
    /// End of the window, µs since the Unix epoch, as the real NVML reports it (clients such as
    /// HAMi-core ask for samples newer than "now − 1 s" in wall-clock µs).
    pub timestamp_us: u64,
    /// Percent of the window during which this process's kernels were running on the SMs,
    /// 0..=100. Under MPS several processes can each be near 100 at once (their kernels run
    /// concurrently), as on real hardware; the device figure counts time any kernel ran.
    pub sm_util: u32,
}

/// Test-only ground truth about one process on one device. Never exposed through NVML or the
/// driver: the arbiter must estimate interference from what it can observe; tests compare its
/// estimate against this.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcTruth {
    /// Time the process's kernels were running (what NVML's per-process utilization integrates).
    pub gpu_active_ns: u64,
    /// Solo-equivalent kernel time completed: how long that work would have taken alone.
    pub work_ns: u64,
    /// Wall time the process had runnable work minus the solo-equivalent work it completed then:
    /// waiting while other contexts held the GPU (time slicing) plus the extra time its kernels
    /// took because others ran concurrently (MPS). Zero for a process that always ran alone.
    pub interference_ns: u64,
    /// The interference this process's kernels imposed on the others (time slicing: each
    /// instant it held the GPU times the contexts that waited with work; MPS: the others' extra
    /// time, split among the kernels they ran beside). What a function cost a trainer is this,
    /// when the trainer was the only other context with work.
    pub imposed_ns: u64,
}

/// A process's view of the mapped node.
pub struct Node {
    pub(crate) state: &'static NodeState,
    pub(crate) slot: u32,
    pub(crate) pid: u32,
    /// Pidfds of the slot holders this handle has looked at (`reap_dead`).
    pub(crate) liveness: crate::liveness::Liveness,
    /// This process's pid namespace (crate::pidns): slots of other namespaces are translated.
    pub(crate) ns: u64,
    pub(crate) xlate: crate::pidns::Translator,
}

fn proc_start_time(pid: u32) -> Option<(u64, char)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may contain spaces: parse after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    // Field 22 overall is starttime; after the comm we are at field 3, so skip 18 more.
    let start = fields.nth(18)?.parse().ok()?;
    Some((start, state))
}

/// Whether the process that claimed a slot is still alive (not exited, not a zombie, not a
/// different process that reused the pid).
pub(crate) fn slot_alive(pid: u32, start_time: u64) -> bool {
    match proc_start_time(pid) {
        Some((start, state)) => start == start_time && state != 'Z' && state != 'X',
        None => false,
    }
}

impl Node {
    /// Opens the node named by `SMORE_SIM_STATE` (default `/tmp/smore-sim-<uid>/node.state`),
    /// creating it from `SMORE_SIM_*` if it does not exist, and claims a process slot.
    pub fn open_from_env() -> Result<Node, SimError> {
        let path = match std::env::var("SMORE_SIM_STATE") {
            Ok(p) if !p.is_empty() => p,
            _ => {
                // SAFETY: getuid has no preconditions.
                let uid = unsafe { libc::getuid() };
                let dir = format!("/tmp/smore-sim-{uid}");
                let _ = std::fs::create_dir_all(&dir);
                format!("{dir}/node.state")
            }
        };
        let cfg = SimConfig::from_env().map_err(SimError::BadState)?;
        Node::open(&path, &cfg)
    }

    /// Opens or creates the node state at `path` and claims a process slot for this process.
    pub fn open(path: &str, cfg: &SimConfig) -> Result<Node, SimError> {
        let state = map_state(path, cfg)?;
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() } as u32;
        let slot = claim_slot(state, pid)?;
        Ok(Node::with(state, slot, pid))
    }

    /// Opens the node without claiming a process slot (NVML readers, test assertions), creating
    /// it from `SMORE_SIM_*` if it does not exist yet.
    pub fn observe(path: &str) -> Result<Node, SimError> {
        let cfg = SimConfig::from_env().map_err(SimError::BadState)?;
        let state = map_state(path, &cfg)?;
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() } as u32;
        Ok(Node::with(state, NONE, pid))
    }

    /// Maps the node at `path`, creating it from `cfg` if it does not exist, without claiming a
    /// process slot (test harnesses).
    pub fn create(path: &str, cfg: &SimConfig) -> Result<Node, SimError> {
        let state = map_state(path, cfg)?;
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() } as u32;
        Ok(Node::with(state, NONE, pid))
    }

    pub(crate) fn with(state: &'static NodeState, slot: u32, pid: u32) -> Node {
        Node {
            state,
            slot,
            pid,
            liveness: Default::default(),
            ns: crate::pidns::own_ns(),
            xlate: Default::default(),
        }
    }

    /// The pid of slot `p`'s process as this process sees it (its own namespace's pid), or
    /// None when it lives in a pid namespace this process cannot see into (crate::pidns).
    pub(crate) fn local_pid(&self, p: &ProcSlot) -> Option<u32> {
        let c = crate::pidns::Claimed {
            ns: p.pidns.load(Acquire),
            pid: p.pid.load(Acquire),
            start: p.start_time.load(Acquire),
        };
        self.xlate.local_pid(self.ns, c)
    }

    /// Process id of the process this handle was opened in.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Number of simulated devices on the node (fixed when it was created).
    pub fn device_count(&self) -> u32 {
        self.state.header.device_count
    }

    /// Driver version the fake reports, CUDA-encoded (12080 is 12.8).
    pub fn driver_version(&self) -> u32 {
        self.state.header.driver_version
    }

    /// Device memory a context takes when it is created, bytes.
    pub fn context_bytes(&self) -> u64 {
        self.state.header.context_bytes
    }

    /// Duration of a kernel from an unknown module image, ns.
    pub fn default_kernel_ns(&self) -> u64 {
        self.state.header.default_kernel_ns
    }

    /// How the node's devices share kernels of different processes (fixed when it was created).
    pub fn mode(&self) -> SchedMode {
        SchedMode::from_code(self.state.header.mode)
    }

    /// What NVML's per-process utilization counts on the node's time-sliced devices.
    pub fn nvml_process_util(&self) -> crate::config::NvmlProcessUtil {
        crate::config::NvmlProcessUtil::from_code(self.state.header.nvml_process_util)
    }

    /// MPS interference coefficient β of the node, thousandths.
    pub fn mps_beta_permille(&self) -> u32 {
        self.state.header.mps_beta_permille
    }

    /// A timeline instant (CLOCK_MONOTONIC ns) as µs since the Unix epoch, using the offset fixed
    /// when the node was created so every process converts the same instant the same way.
    pub fn epoch_us(&self, monotonic_ns: u64) -> u64 {
        monotonic_ns.saturating_add(self.state.header.realtime_offset_ns) / 1000
    }

    pub(crate) fn dev(&self, d: u32) -> Result<&'static Device, SimError> {
        if d < self.device_count() {
            Ok(&self.state.devices[d as usize])
        } else {
            Err(SimError::InvalidDevice)
        }
    }

    /// Static description of device `d` (name, UUID, memory, SMs).
    pub fn device_info(&self, d: u32) -> Result<DeviceInfo, SimError> {
        let dev = self.dev(d)?;
        let end = dev
            .name
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(dev.name.len());
        Ok(DeviceInfo {
            index: d,
            name: String::from_utf8_lossy(&dev.name[..end]).into_owned(),
            uuid: dev.uuid,
            total_mem: dev.total_mem,
            sm_count: dev.sm_count,
        })
    }

    /// Bytes in use on device `d` by all processes (after reaping dead ones).
    pub fn used_mem(&self, d: u32) -> Result<u64, SimError> {
        Ok(self.dev(d)?.used_mem.load(Acquire))
    }

    /// Bytes this process holds on device `d`.
    pub fn my_mem(&self, d: u32) -> u64 {
        if self.slot == NONE || d as usize >= MAX_DEVICES {
            return 0;
        }
        self.state.procs[self.slot as usize].mem_used[d as usize].load(Acquire)
    }

    /// Charges `bytes` to device `d` and this process, atomically against capacity: concurrent
    /// allocations from any processes can never together pass the device's memory.
    pub fn charge(&self, d: u32, bytes: u64) -> Result<(), MemError> {
        let dev = self.dev(d).map_err(|_| MemError {
            requested: bytes,
            free: 0,
        })?;
        for attempt in 0..2 {
            let mut cur = dev.used_mem.load(Acquire);
            loop {
                let next = cur.saturating_add(bytes);
                if next > dev.total_mem {
                    break;
                }
                match dev
                    .used_mem
                    .compare_exchange_weak(cur, next, AcqRel, Acquire)
                {
                    Ok(_) => {
                        if self.slot != NONE {
                            self.state.procs[self.slot as usize].mem_used[d as usize]
                                .fetch_add(bytes, AcqRel);
                        }
                        return Ok(());
                    }
                    Err(now) => cur = now,
                }
            }
            if attempt == 0 {
                // Out of memory: memory of processes that died may still be counted; the real
                // driver frees it when the process exits, so reap before refusing.
                self.reap_dead();
            }
        }
        Err(MemError {
            requested: bytes,
            free: dev.total_mem.saturating_sub(dev.used_mem.load(Acquire)),
        })
    }

    /// Returns `bytes` to device `d` and this process.
    pub fn credit(&self, d: u32, bytes: u64) {
        let Ok(dev) = self.dev(d) else { return };
        if self.slot != NONE {
            let slot = &self.state.procs[self.slot as usize].mem_used[d as usize];
            let _ = slot.fetch_update(AcqRel, Acquire, |v| Some(v.saturating_sub(bytes)));
        }
        let _ = dev
            .used_mem
            .fetch_update(AcqRel, Acquire, |v| Some(v.saturating_sub(bytes)));
    }

    /// Marks whether this process has a context on device `d` (NVML lists such processes).
    pub fn set_has_context(&self, d: u32, has: bool) {
        if self.slot == NONE || d as usize >= MAX_DEVICES {
            return;
        }
        let mask = &self.state.procs[self.slot as usize].ctx_mask;
        if has {
            mask.fetch_or(1 << d, AcqRel);
        } else {
            mask.fetch_and(!(1 << d), AcqRel);
        }
    }

    /// Processes with a context on device `d` and the memory each holds (NVML's
    /// `nvmlDeviceGetComputeRunningProcesses`).
    pub fn running_processes(&self, d: u32) -> Result<Vec<ProcUsage>, SimError> {
        self.dev(d)?;
        self.reap_dead();
        let mut out = Vec::new();
        for p in self.state.procs.iter() {
            let pid = p.pid.load(Acquire);
            if pid != 0 && pid != u32::MAX && p.ctx_mask.load(Acquire) & (1 << d) != 0 {
                // As the caller's pid namespace sees it; processes it cannot see are left out.
                let Some(pid) = self.local_pid(p) else {
                    continue;
                };
                out.push(ProcUsage {
                    pid,
                    used_mem: p.mem_used[d as usize].load(Acquire),
                });
            }
        }
        Ok(out)
    }

    /// Releases everything held by processes that died: memory, queued work, streams, events.
    /// The real driver does this when a process's file descriptors close; here any process of the
    /// node does it on its behalf when it next needs an accurate picture.
    pub fn reap_dead(&self) {
        for (i, p) in self.state.procs.iter().enumerate() {
            let pid = p.pid.load(Acquire);
            // u32::MAX: being reaped by someone else; start time 0: being claimed right now.
            if pid == 0 || pid == u32::MAX || (pid == self.pid && p.pidns.load(Acquire) == self.ns)
            {
                continue;
            }
            let start = p.start_time.load(Acquire);
            if start == 0 {
                continue;
            }
            let alive = match self.local_pid(p) {
                Some(local) => self.liveness.alive(i, local, start),
                // In a namespace this process cannot see: dead only if it sees every process.
                None => !crate::pidns::Translator::sees_everything(self.ns),
            };
            if alive {
                continue;
            }
            // Claim the right to clean this slot exactly once.
            if p.pid
                .compare_exchange(pid, u32::MAX, AcqRel, Acquire)
                .is_err()
            {
                continue;
            }
            for d in 0..self.device_count() {
                let bytes = p.mem_used[d as usize].swap(0, AcqRel);
                let dev = &self.state.devices[d as usize];
                let _ = dev
                    .used_mem
                    .fetch_update(AcqRel, Acquire, |v| Some(v.saturating_sub(bytes)));
                self.with_device_raw(d, |s| crate::timeline::drop_process(s, i as u32));
                p.gpu_time_ns[d as usize].store(0, Relaxed);
                p.work_ns[d as usize].store(0, Relaxed);
                p.interference_ns[d as usize].store(0, Relaxed);
                p.imposed_ns[d as usize].store(0, Relaxed);
            }
            p.ctx_mask.store(0, Release);
            p.start_time.store(0, Release);
            p.pid.store(0, Release);
        }
    }

    /// Gives back everything this process holds (its memory, queued work, streams, events) and
    /// frees its slot: what the real driver does when a process exits. Called at exit.
    pub fn release_self(&self) {
        if self.slot == NONE {
            return;
        }
        let p = &self.state.procs[self.slot as usize];
        if p.pid.load(Acquire) != self.pid {
            return;
        }
        for d in 0..self.device_count() {
            let bytes = p.mem_used[d as usize].swap(0, AcqRel);
            let dev = &self.state.devices[d as usize];
            let _ = dev
                .used_mem
                .fetch_update(AcqRel, Acquire, |v| Some(v.saturating_sub(bytes)));
            self.with_device_raw(d, |s| crate::timeline::drop_process(s, self.slot));
        }
        p.ctx_mask.store(0, Release);
        p.start_time.store(0, Release);
        p.pid.store(0, Release);
    }

    /// Runs `f` on device `d`'s scheduler with its lock held, without advancing time.
    pub(crate) fn with_device_raw<R>(&self, d: u32, f: impl FnOnce(&mut Sched) -> R) -> R {
        let dev = &self.state.devices[d as usize];
        let _g = dev.lock.lock();
        // SAFETY: the device mutex is held for the lifetime of this borrow, and every access to
        // `sched` goes through this function, so the mutable borrow is unique node-wide.
        let s = unsafe { &mut *dev.sched.get() };
        if s.initialized == 0 {
            crate::timeline::init_sched(s);
        }
        f(s)
    }

    /// SM utilization of device `d` over the last sample period, percent (NVML
    /// `nvmlDeviceGetUtilizationRates().gpu`).
    pub fn device_utilization(&self, d: u32) -> Result<u32, SimError> {
        self.dev(d)?;
        let now = crate::now_ns();
        Ok(self.with_device(d, now, |s, _| {
            let latest = crate::timeline::latest_snapshots(s, 2);
            match latest.as_slice() {
                [a, b] if b.time_ns > a.time_ns => {
                    ((b.busy_ns - a.busy_ns) * 100 / (b.time_ns - a.time_ns)).min(100) as u32
                }
                _ => 0,
            }
        }))
    }

    /// Device utilization on `d` since `since_us` (NVML `nvmlDeviceGetSamples` with
    /// `NVML_GPU_UTILIZATION_SAMPLES`): one sample — (µs since the Unix epoch, percent busy) —
    /// over the same window as [`Node::process_utilization`]'s samples, so the two line up as
    /// the shim's calibration compares them; `None` when no snapshot is newer than `since_us`.
    pub fn device_utilization_since(
        &self,
        d: u32,
        since_us: u64,
    ) -> Result<Option<(u64, u32)>, SimError> {
        self.dev(d)?;
        let now = crate::now_ns();
        Ok(self.with_device(d, now, |s, _| {
            let snaps = crate::timeline::latest_snapshots(s, SNAPSHOTS);
            let last = *snaps.last()?;
            let first = snaps
                .iter()
                .rev()
                .find(|sn| self.epoch_us(sn.time_ns) <= since_us)
                .or_else(|| snaps.first())
                .copied()?;
            if last.time_ns <= first.time_ns {
                return None;
            }
            let window = last.time_ns - first.time_ns;
            let busy = last.busy_ns.saturating_sub(first.busy_ns);
            Some((
                self.epoch_us(last.time_ns),
                ((busy * 100 + window / 2) / window).min(100) as u32,
            ))
        }))
    }

    /// Per-process SM utilization on device `d` since `since_us`, µs since the Unix epoch (NVML
    /// `nvmlDeviceGetProcessUtilization`'s lastSeenTimeStamp; 0 = everything kept): one sample per
    /// process that ran in the window.
    pub fn process_utilization(&self, d: u32, since_us: u64) -> Result<Vec<UtilSample>, SimError> {
        self.dev(d)?;
        let now = crate::now_ns();
        Ok(self.with_device(d, now, |s, _| {
            let snaps = crate::timeline::latest_snapshots(s, SNAPSHOTS);
            let Some(last) = snaps.last() else {
                return Vec::new();
            };
            // The newest snapshot at or before `since` (Unix-epoch µs, as NVML's
            // lastSeenTimeStamp) bounds the window, so only samples newer than it come back.
            // Compared in the epoch-µs domain, so passing back a returned timestamp is exact.
            let first = snaps
                .iter()
                .rev()
                .find(|sn| self.epoch_us(sn.time_ns) <= since_us)
                .or_else(|| snaps.first())
                .copied();
            let Some(first) = first else {
                return Vec::new();
            };
            if last.time_ns <= first.time_ns {
                return Vec::new();
            }
            let window = last.time_ns - first.time_ns;
            let mut out = Vec::new();
            for i in 0..MAX_PROCS {
                let pid = last.pids[i];
                if pid == 0 || pid == u32::MAX {
                    continue;
                }
                // The slot's process as the caller sees it (left out if it cannot, or if the
                // slot changed hands since the snapshot).
                let slot = &self.state.procs[i];
                let Some(seen) = (slot.pid.load(Acquire) == pid)
                    .then(|| self.local_pid(slot))
                    .flatten()
                else {
                    continue;
                };
                let before = if first.pids[i] == pid {
                    first.proc_gpu_ns[i]
                } else {
                    0
                };
                let ran = last.proc_gpu_ns[i].saturating_sub(before);
                if ran == 0 {
                    continue;
                }
                out.push(UtilSample {
                    pid: seen,
                    timestamp_us: self.epoch_us(last.time_ns),
                    sm_util: ((ran * 100 + window / 2) / window).min(100) as u32,
                });
            }
            out
        }))
    }

    /// Cumulative GPU time of the process in slot of `pid` on device `d`, ns (test assertions).
    pub fn gpu_time_of(&self, d: u32, pid: u32) -> u64 {
        let now = crate::now_ns();
        self.with_device(d, now, |_, _| ());
        self.state
            .procs
            .iter()
            .find(|p| p.pid.load(Acquire) != 0 && self.local_pid(p) == Some(pid))
            .map(|p| p.gpu_time_ns[d as usize].load(Acquire))
            .unwrap_or(0)
    }

    /// Ground truth about the process `pid` on device `d` (tests only; see [`ProcTruth`]), with
    /// the timeline advanced to now. `None` if `pid` holds no slot on the node.
    pub fn truth_of(&self, d: u32, pid: u32) -> Option<ProcTruth> {
        self.dev(d).ok()?;
        let now = crate::now_ns();
        self.with_device(d, now, |_, _| ());
        let p = self
            .state
            .procs
            .iter()
            .find(|p| p.pid.load(Acquire) != 0 && self.local_pid(p) == Some(pid))?;
        Some(ProcTruth {
            gpu_active_ns: p.gpu_time_ns[d as usize].load(Acquire),
            work_ns: p.work_ns[d as usize].load(Acquire),
            interference_ns: p.interference_ns[d as usize].load(Acquire),
            imposed_ns: p.imposed_ns[d as usize].load(Acquire),
        })
    }

    /// Total time device `d` has been busy, ns (test assertions).
    pub fn busy_ns(&self, d: u32) -> u64 {
        let now = crate::now_ns();
        self.with_device(d, now, |s, _| s.busy_ns)
    }
}

/// Nanoseconds since the Unix epoch (CLOCK_REALTIME).
fn realtime_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

fn map_state(path: &str, cfg: &SimConfig) -> Result<&'static NodeState, SimError> {
    let size = std::mem::size_of::<NodeState>();
    let cpath = CString::new(path).map_err(|_| SimError::Io(format!("bad path {path:?}")))?;
    // SAFETY: cpath is a valid NUL-terminated string.
    let fd = unsafe {
        libc::open(
            cpath.as_ptr(),
            libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC,
            0o600,
        )
    };
    if fd < 0 {
        return Err(SimError::Io(format!(
            "cannot open simulated node state {path}: {}",
            std::io::Error::last_os_error()
        )));
    }
    // SAFETY: fd is open; flock blocks until the creator (if any) finishes initialising.
    unsafe { libc::flock(fd, libc::LOCK_EX) };
    let result = (|| {
        // SAFETY: fstat on an open fd into a zeroed stat buffer.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::fstat(fd, &mut st) } != 0 {
            return Err(SimError::Io(format!("fstat {path} failed")));
        }
        let fresh = st.st_size == 0;
        if fresh {
            // SAFETY: fd is open for writing.
            if unsafe { libc::ftruncate(fd, size as libc::off_t) } != 0 {
                return Err(SimError::Io(format!("cannot size {path}")));
            }
        } else if st.st_size as usize != size {
            return Err(SimError::BadState(format!(
                "{path} is not a smore simulated-node state of this version ({} bytes, expected {size}); remove it",
                st.st_size
            )));
        }
        // SAFETY: mapping `size` bytes of a file we just sized; MAP_SHARED so all processes see
        // the same memory. The mapping is never unmapped, which makes the 'static borrow sound.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(SimError::Io(format!("cannot map {path}")));
        }
        let state = p as *mut NodeState;
        if fresh {
            // SAFETY: we hold the exclusive file lock, so nobody else reads the state yet.
            unsafe { init_state(state, cfg) };
        }
        // SAFETY: the mapping is valid for the process lifetime and NodeState is Sync.
        let state: &'static NodeState = unsafe { &*state };
        if state.header.magic.load(Acquire) != MAGIC || state.header.version != LAYOUT_VERSION {
            return Err(SimError::BadState(format!(
                "{path} holds no valid smore simulated-node state (layout {}); remove it",
                LAYOUT_VERSION
            )));
        }
        Ok(state)
    })();
    // SAFETY: fd is open; closing does not affect the mapping.
    unsafe {
        libc::flock(fd, libc::LOCK_UN);
        libc::close(fd);
    }
    result
}

/// # Safety
/// `state` points to a zero-filled mapping of `size_of::<NodeState>()` bytes that no other process
/// uses yet.
unsafe fn init_state(state: *mut NodeState, cfg: &SimConfig) {
    // SAFETY: the caller guarantees `state` points to a mapping of a whole `NodeState` that no
    // other process uses yet, so this is the only reference to it; zero bytes are a valid
    // `NodeState` (plain integers, atomics and byte arrays).
    let state = unsafe { &mut *state };
    let h = &mut state.header;
    h.version = LAYOUT_VERSION;
    h.device_count = cfg.devices.clamp(1, MAX_DEVICES as u32);
    h.timeslice_ns = cfg.timeslice_ns;
    h.default_kernel_ns = cfg.default_kernel_ns;
    h.context_bytes = cfg.context_memory;
    h.sample_period_ns = SAMPLE_PERIOD_NS;
    h.driver_version = DRIVER_VERSION;
    h.mode = cfg.mode.code();
    h.mps_beta_permille = cfg.mps_beta_permille;
    h.nvml_process_util = cfg.nvml_process_util.code();
    h.switch_ns = cfg.switch_ns;
    h.realtime_offset_ns = realtime_ns().saturating_sub(crate::now_ns());
    let seed = crate::now_ns() ^ (u64::from(std::process::id())) << 32;
    for d in 0..MAX_DEVICES {
        let dev = &mut state.devices[d];
        dev.total_mem = cfg.memory;
        dev.sm_count = cfg.sms;
        let name = cfg.name.as_bytes();
        let n = name.len().min(dev.name.len() - 1);
        dev.name[..n].copy_from_slice(&name[..n]);
        let mut x = seed
            .wrapping_add(d as u64)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15);
        for b in dev.uuid.iter_mut() {
            x ^= x >> 31;
            x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
            *b = (x >> 56) as u8;
        }
        dev.uuid[6] = (dev.uuid[6] & 0x0f) | 0x40; // version 4
                                                   // SAFETY: `dev.lock` lies in the mapped state, and no other process uses it before the
                                                   // magic number below is published.
        unsafe { SharedMutex::init(&dev.lock) };
    }
    state.header.magic.store(MAGIC, Release);
}

/// Claims a slot for another live process `pid` (unit tests drive two contexts from one process).
#[cfg(test)]
pub(crate) fn claim_slot_for_test(state: &'static NodeState, pid: u32) -> u32 {
    claim_slot(state, pid).expect("free slot")
}

fn claim_slot(state: &'static NodeState, pid: u32) -> Result<u32, SimError> {
    let start = proc_start_time(pid).map(|(s, _)| s).unwrap_or(0);
    let ns = crate::pidns::own_ns();
    for round in 0..2 {
        for (i, p) in state.procs.iter().enumerate() {
            if p.pid.load(Acquire) == pid
                && p.start_time.load(Acquire) == start
                && p.pidns.load(Acquire) == ns
            {
                return Ok(i as u32);
            }
        }
        for (i, p) in state.procs.iter().enumerate() {
            if p.pid.compare_exchange(0, pid, AcqRel, Acquire).is_ok() {
                // The namespace before the start time: a non-zero start publishes the claim.
                p.pidns.store(ns, Release);
                p.start_time.store(start, Release);
                p.ctx_mask.store(0, Release);
                for d in 0..MAX_DEVICES {
                    p.mem_used[d].store(0, Release);
                    p.gpu_time_ns[d].store(0, Release);
                    p.work_ns[d].store(0, Release);
                    p.interference_ns[d].store(0, Release);
                    p.imposed_ns[d].store(0, Release);
                }
                return Ok(i as u32);
            }
        }
        if round == 0 {
            let observer = Node::with(state, NONE, pid);
            observer.reap_dead();
        }
    }
    Err(SimError::TooManyProcesses)
}
