//! # Fake `libnvidia-ml.so.1`
//!
//! NVML for the simulated GPU node: device count, handles, names, UUIDs, memory info, running
//! compute processes with their memory, per-process and device utilization — all read from the
//! same shared node state the fake `libcuda.so.1` writes, so the two always agree. The exported
//! names and struct layouts are the real ones, so `nvml-wrapper` (which the arbiter uses) loads
//! and drives it unchanged.
//!
//! Must never: invent a number the node state does not hold.
#![allow(non_snake_case, non_camel_case_types, clippy::missing_safety_doc)]

use smore_simgpu::{Node, SchedMode, MAX_DEVICES};
use std::ffi::{c_char, c_int, c_uint, c_ulonglong, CStr};
use std::sync::Mutex;

type nvmlReturn_t = c_uint;
const NVML_SUCCESS: nvmlReturn_t = 0;
const NVML_ERROR_UNINITIALIZED: nvmlReturn_t = 1;
const NVML_ERROR_INVALID_ARGUMENT: nvmlReturn_t = 2;
const NVML_ERROR_NOT_SUPPORTED: nvmlReturn_t = 3;
const NVML_ERROR_INSUFFICIENT_SIZE: nvmlReturn_t = 7;
const NVML_ERROR_NOT_FOUND: nvmlReturn_t = 6;
const NVML_ERROR_DRIVER_NOT_LOADED: nvmlReturn_t = 9;
const NVML_ERROR_UNKNOWN: nvmlReturn_t = 999;

/// Opaque device handle: a pointer into this static table.
#[repr(C)]
pub struct DeviceHandle {
    index: u32,
}

static HANDLES: [DeviceHandle; MAX_DEVICES] = {
    let mut h = [const { DeviceHandle { index: 0 } }; MAX_DEVICES];
    let mut i = 0;
    while i < MAX_DEVICES {
        h[i].index = i as u32;
        i += 1;
    }
    h
};

static NODE: Mutex<Option<(u32, &'static Node)>> = Mutex::new(None);

fn node() -> Result<&'static Node, nvmlReturn_t> {
    let g = NODE.lock().unwrap_or_else(|e| e.into_inner());
    match *g {
        // SAFETY: getpid has no preconditions.
        Some((pid, n)) if pid == unsafe { libc::getpid() } as u32 => Ok(n),
        _ => Err(NVML_ERROR_UNINITIALIZED),
    }
}

fn state_path() -> String {
    match std::env::var("SMORE_SIM_STATE") {
        Ok(p) if !p.is_empty() => p,
        // SAFETY: getuid has no preconditions.
        _ => format!("/tmp/smore-sim-{}/node.state", unsafe { libc::getuid() }),
    }
}

fn init() -> Result<(), nvmlReturn_t> {
    let mut g = NODE.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() } as u32;
    if matches!(*g, Some((p, _)) if p == pid) {
        return Ok(());
    }
    let path = state_path();
    // NVML observes the node: it never claims a process slot.
    let node = Node::observe(&path).map_err(|e| {
        eprintln!("smore simulated NVML: cannot open node {path}: {e}");
        NVML_ERROR_DRIVER_NOT_LOADED
    })?;
    *g = Some((pid, Box::leak(Box::new(node))));
    Ok(())
}

fn dev(h: *const DeviceHandle) -> Result<(u32, &'static Node), nvmlReturn_t> {
    let n = node()?;
    let base = HANDLES.as_ptr() as usize;
    let p = h as usize;
    let size = std::mem::size_of::<DeviceHandle>();
    if p < base || p >= base + MAX_DEVICES * size || !(p - base).is_multiple_of(size) {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    let idx = ((p - base) / size) as u32;
    if idx >= n.device_count() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    Ok((idx, n))
}

fn out<T>(p: *mut T, v: T) -> Result<(), nvmlReturn_t> {
    if p.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: non-null output pointer from the caller.
    unsafe { p.write(v) };
    Ok(())
}

fn write_str(dst: *mut c_char, len: c_uint, s: &str) -> Result<(), nvmlReturn_t> {
    if dst.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    if (len as usize) < s.len() + 1 {
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    // SAFETY: dst has `len` ≥ s.len() + 1 bytes per the caller's contract.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), dst as *mut u8, s.len());
        *dst.add(s.len()) = 0;
    }
    Ok(())
}

macro_rules! api {
    ($( fn $name:ident($($a:ident : $t:ty),* $(,)?) $body:block )*) => {
        $(
            #[doc = concat!("The simulated node's `", stringify!($name), "`, with NVML's contract.")]
            ///
            /// # Safety
            /// As for NVML's function of the same name: every pointer argument is null or valid
            /// for the access NVML documents for it.
            // Bodies without a raw-pointer access leave the blanket block below unused.
            #[allow(unused_unsafe)]
            #[no_mangle]
            pub unsafe extern "C" fn $name($($a: $t),*) -> nvmlReturn_t {
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(
                    || -> Result<(), nvmlReturn_t> {
                        // SAFETY: the caller keeps NVML's contract for this entry point (see
                        // `# Safety` above): pointer arguments are null or valid for the access
                        // NVML documents, and device handles are ones this library handed out.
                        unsafe { $body }
                    },
                ));
                match r {
                    Ok(Ok(())) => NVML_SUCCESS,
                    Ok(Err(e)) => e,
                    Err(_) => NVML_ERROR_UNKNOWN,
                }
            }
        )*
    };
}

/// NVML's `nvmlMemory_t` (v1 memory info), bytes.
#[repr(C)]
pub struct nvmlMemory_t {
    total: c_ulonglong,
    free: c_ulonglong,
    used: c_ulonglong,
}

/// NVML's `nvmlMemory_v2_t` (memory info with reserved memory), bytes.
#[repr(C)]
pub struct nvmlMemory_v2_t {
    version: c_uint,
    total: c_ulonglong,
    reserved: c_ulonglong,
    free: c_ulonglong,
    used: c_ulonglong,
}

/// NVML's `nvmlProcessInfo_v1_t`: one process on a device and its memory, bytes.
#[repr(C)]
pub struct nvmlProcessInfo_v1_t {
    pid: c_uint,
    used_gpu_memory: c_ulonglong,
}

/// NVML's `nvmlProcessInfo_t`: one process on a device and its memory, bytes; v2 and v3 share
/// this layout.
#[repr(C)]
pub struct nvmlProcessInfo_t {
    pid: c_uint,
    used_gpu_memory: c_ulonglong,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

/// NVML's `nvmlProcessUtilizationSample_t`: one process's utilization over a window, percent.
#[repr(C)]
pub struct nvmlProcessUtilizationSample_t {
    pid: c_uint,
    time_stamp: c_ulonglong,
    sm_util: c_uint,
    mem_util: c_uint,
    enc_util: c_uint,
    dec_util: c_uint,
}

/// NVML's `nvmlSample_t`: a timestamp (µs since the Unix epoch) and an `nvmlValue_t` (a union
/// of 8 bytes; utilization samples use its `unsigned int` member, the low half on little-endian).
#[repr(C)]
pub struct nvmlSample_t {
    time_stamp: c_ulonglong,
    value: c_ulonglong,
}

/// `nvmlSamplingType_t` `NVML_GPU_UTILIZATION_SAMPLES`.
const NVML_GPU_UTILIZATION_SAMPLES: c_uint = 1;
/// `nvmlValueType_t` `NVML_VALUE_TYPE_UNSIGNED_INT`.
const NVML_VALUE_TYPE_UNSIGNED_INT: c_uint = 1;

/// NVML's `nvmlUtilization_t`: device utilization, percent.
#[repr(C)]
pub struct nvmlUtilization_t {
    gpu: c_uint,
    memory: c_uint,
}

fn mem(h: *const DeviceHandle) -> Result<(u64, u64), nvmlReturn_t> {
    let (i, n) = dev(h)?;
    let total = n.device_info(i).map_err(|_| NVML_ERROR_UNKNOWN)?.total_mem;
    n.reap_dead();
    let used = n.used_mem(i).map_err(|_| NVML_ERROR_UNKNOWN)?;
    Ok((total, used.min(total)))
}

/// Fills a process list the way NVML does: `*count` in = capacity, out = needed/filled.
unsafe fn processes<T>(
    h: *const DeviceHandle,
    count: *mut c_uint,
    infos: *mut T,
    make: impl Fn(u32, u64) -> T,
) -> Result<(), nvmlReturn_t> {
    let (i, n) = dev(h)?;
    if count.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    let procs = n.running_processes(i).map_err(|_| NVML_ERROR_UNKNOWN)?;
    // SAFETY: `count` is non-null (checked above) and valid for reads and writes per the caller's
    // contract (NVML's: in = capacity of `infos`, out = entries needed).
    let cap = unsafe { *count } as usize;
    // SAFETY: as above.
    unsafe { *count = procs.len() as c_uint };
    if procs.len() > cap || (infos.is_null() && !procs.is_empty()) {
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (k, p) in procs.iter().enumerate() {
        // SAFETY: `infos` is non-null here (checked above unless `procs` is empty, in which case
        // the loop does not run) and has room for `cap` ≥ `procs.len()` entries per the caller.
        unsafe { infos.add(k).write(make(p.pid, p.used_mem)) };
    }
    Ok(())
}

api! {
    fn nvmlInit_v2() { init() }
    fn nvmlInit() { init() }
    fn nvmlInitWithFlags(_flags: c_uint) { init() }
    fn nvmlShutdown() { node().map(|_| ()) }

    fn nvmlSystemGetDriverVersion(v: *mut c_char, len: c_uint) {
        node()?;
        write_str(v, len, "570.124.06")
    }
    fn nvmlSystemGetNVMLVersion(v: *mut c_char, len: c_uint) {
        node()?;
        write_str(v, len, "12.570.124.06")
    }
    fn nvmlSystemGetCudaDriverVersion(v: *mut c_int) {
        out(v, node()?.driver_version() as c_int)
    }
    fn nvmlSystemGetCudaDriverVersion_v2(v: *mut c_int) {
        out(v, node()?.driver_version() as c_int)
    }

    fn nvmlDeviceGetCount_v2(n: *mut c_uint) { out(n, node()?.device_count()) }
    fn nvmlDeviceGetCount(n: *mut c_uint) { out(n, node()?.device_count()) }

    fn nvmlDeviceGetHandleByIndex_v2(i: c_uint, h: *mut *const DeviceHandle) {
        if i >= node()?.device_count() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        out(h, &HANDLES[i as usize] as *const DeviceHandle)
    }
    fn nvmlDeviceGetHandleByIndex(i: c_uint, h: *mut *const DeviceHandle) {
        if i >= node()?.device_count() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        out(h, &HANDLES[i as usize] as *const DeviceHandle)
    }

    fn nvmlDeviceGetHandleByUUID(uuid: *const c_char, h: *mut *const DeviceHandle) {
        let n = node()?;
        if uuid.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        let want = CStr::from_ptr(uuid).to_string_lossy().into_owned();
        for i in 0..n.device_count() {
            if n.device_info(i).map(|d| d.uuid_string()).ok().as_deref() == Some(want.as_str()) {
                return out(h, &HANDLES[i as usize] as *const DeviceHandle);
            }
        }
        Err(NVML_ERROR_NOT_FOUND)
    }

    fn nvmlDeviceGetIndex(h: *const DeviceHandle, i: *mut c_uint) { out(i, dev(h)?.0) }
    fn nvmlDeviceGetMinorNumber(h: *const DeviceHandle, i: *mut c_uint) { out(i, dev(h)?.0) }

    fn nvmlDeviceGetName(h: *const DeviceHandle, name: *mut c_char, len: c_uint) {
        let (i, n) = dev(h)?;
        write_str(name, len, &n.device_info(i).map_err(|_| NVML_ERROR_UNKNOWN)?.name)
    }

    fn nvmlDeviceGetUUID(h: *const DeviceHandle, uuid: *mut c_char, len: c_uint) {
        let (i, n) = dev(h)?;
        write_str(uuid, len, &n.device_info(i).map_err(|_| NVML_ERROR_UNKNOWN)?.uuid_string())
    }

    fn nvmlDeviceGetNumGpuCores(h: *const DeviceHandle, cores: *mut c_uint) {
        let (i, n) = dev(h)?;
        // 128 FP32 cores per SM on Hopper.
        out(cores, n.device_info(i).map_err(|_| NVML_ERROR_UNKNOWN)?.sm_count * 128)
    }

    fn nvmlDeviceGetMemoryInfo(h: *const DeviceHandle, m: *mut nvmlMemory_t) {
        let (total, used) = mem(h)?;
        out(m, nvmlMemory_t { total, free: total - used, used })
    }

    fn nvmlDeviceGetMemoryInfo_v2(h: *const DeviceHandle, m: *mut nvmlMemory_v2_t) {
        let (total, used) = mem(h)?;
        if m.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        let version = (*m).version;
        out(m, nvmlMemory_v2_t { version, total, reserved: 0, free: total - used, used })
    }

    fn nvmlDeviceGetComputeRunningProcesses(h: *const DeviceHandle, count: *mut c_uint, infos: *mut nvmlProcessInfo_v1_t) {
        processes(h, count, infos, |pid, used| nvmlProcessInfo_v1_t { pid, used_gpu_memory: used })
    }
    fn nvmlDeviceGetComputeRunningProcesses_v2(h: *const DeviceHandle, count: *mut c_uint, infos: *mut nvmlProcessInfo_t) {
        processes(h, count, infos, |pid, used| nvmlProcessInfo_t { pid, used_gpu_memory: used, gpu_instance_id: u32::MAX, compute_instance_id: u32::MAX })
    }
    fn nvmlDeviceGetComputeRunningProcesses_v3(h: *const DeviceHandle, count: *mut c_uint, infos: *mut nvmlProcessInfo_t) {
        processes(h, count, infos, |pid, used| nvmlProcessInfo_t { pid, used_gpu_memory: used, gpu_instance_id: u32::MAX, compute_instance_id: u32::MAX })
    }
    fn nvmlDeviceGetGraphicsRunningProcesses_v3(h: *const DeviceHandle, count: *mut c_uint, _infos: *mut nvmlProcessInfo_t) {
        dev(h)?;
        out(count, 0)
    }
    fn nvmlDeviceGetGraphicsRunningProcesses_v2(h: *const DeviceHandle, count: *mut c_uint, _infos: *mut nvmlProcessInfo_t) {
        dev(h)?;
        out(count, 0)
    }
    fn nvmlDeviceGetMPSComputeRunningProcesses_v2(h: *const DeviceHandle, count: *mut c_uint, infos: *mut nvmlProcessInfo_t) {
        // The same list in the same 24-byte layout (nvml.h's `_v2`).
        if dev(h)?.1.mode() != SchedMode::Mps {
            return out(count, 0);
        }
        processes(h, count, infos, |pid, used| nvmlProcessInfo_t { pid, used_gpu_memory: used, gpu_instance_id: u32::MAX, compute_instance_id: u32::MAX })
    }
    fn nvmlDeviceGetMPSComputeRunningProcesses_v3(h: *const DeviceHandle, count: *mut c_uint, infos: *mut nvmlProcessInfo_t) {
        // MPS clients are listed here only on a node that runs MPS.
        if dev(h)?.1.mode() != SchedMode::Mps {
            return out(count, 0);
        }
        processes(h, count, infos, |pid, used| nvmlProcessInfo_t { pid, used_gpu_memory: used, gpu_instance_id: u32::MAX, compute_instance_id: u32::MAX })
    }

    fn nvmlDeviceGetUtilizationRates(h: *const DeviceHandle, u: *mut nvmlUtilization_t) {
        let (i, n) = dev(h)?;
        let gpu = n.device_utilization(i).map_err(|_| NVML_ERROR_UNKNOWN)?;
        out(u, nvmlUtilization_t { gpu, memory: 0 })
    }

    // `last_seen` and the samples' `time_stamp` are µs since the Unix epoch, as in the real NVML.
    // Under MPS a process's `sm_util` is the time its kernels were running, however slowed.
    fn nvmlDeviceGetProcessUtilization(h: *const DeviceHandle, samples: *mut nvmlProcessUtilizationSample_t, count: *mut c_uint, last_seen: c_ulonglong) {
        let (i, n) = dev(h)?;
        if count.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        let s = n.process_utilization(i, last_seen).map_err(|_| NVML_ERROR_UNKNOWN)?;
        if s.is_empty() {
            *count = 0;
            return Err(NVML_ERROR_NOT_FOUND);
        }
        let cap = *count as usize;
        *count = s.len() as c_uint;
        if samples.is_null() || s.len() > cap {
            return Err(NVML_ERROR_INSUFFICIENT_SIZE);
        }
        for (k, x) in s.iter().enumerate() {
            samples.add(k).write(nvmlProcessUtilizationSample_t {
                pid: x.pid, time_stamp: x.timestamp_us, sm_util: x.sm_util, mem_util: 0, enc_util: 0, dec_util: 0,
            });
        }
        Ok(())
    }

    // Only `NVML_GPU_UTILIZATION_SAMPLES`: one sample of the device's busy percent over the
    // window the per-process samples since `last_seen` cover (docs/simgpu.md, "Accounting").
    fn nvmlDeviceGetSamples(h: *const DeviceHandle, sample_type: c_uint, last_seen: c_ulonglong, val_type: *mut c_uint, count: *mut c_uint, samples: *mut nvmlSample_t) {
        let (i, n) = dev(h)?;
        if count.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        if sample_type != NVML_GPU_UTILIZATION_SAMPLES {
            return Err(NVML_ERROR_NOT_SUPPORTED);
        }
        let Some((ts, pct)) = n.device_utilization_since(i, last_seen).map_err(|_| NVML_ERROR_UNKNOWN)? else {
            *count = 0;
            return Err(NVML_ERROR_NOT_FOUND);
        };
        if !val_type.is_null() {
            *val_type = NVML_VALUE_TYPE_UNSIGNED_INT;
        }
        if samples.is_null() {
            *count = 1;
            return Ok(());
        }
        if *count < 1 {
            *count = 1;
            return Err(NVML_ERROR_INSUFFICIENT_SIZE);
        }
        *count = 1;
        samples.write(nvmlSample_t { time_stamp: ts, value: u64::from(pct) });
        Ok(())
    }

    fn nvmlDeviceGetPciInfo_v3(h: *const DeviceHandle, _pci: *mut u8) {
        dev(h)?;
        Err(NVML_ERROR_NOT_SUPPORTED)
    }
}

/// NVML's `nvmlErrorString`: a static, NUL-terminated description of `code`.
#[no_mangle]
pub extern "C" fn nvmlErrorString(code: nvmlReturn_t) -> *const c_char {
    let s: &'static CStr = match code {
        NVML_SUCCESS => c"Success",
        NVML_ERROR_UNINITIALIZED => c"Uninitialized",
        NVML_ERROR_INVALID_ARGUMENT => c"Invalid Argument",
        NVML_ERROR_NOT_SUPPORTED => c"Not Supported",
        NVML_ERROR_NOT_FOUND => c"Not Found",
        NVML_ERROR_INSUFFICIENT_SIZE => c"Insufficient Size",
        NVML_ERROR_DRIVER_NOT_LOADED => c"Driver Not Loaded",
        _ => c"Unknown Error",
    };
    s.as_ptr()
}
