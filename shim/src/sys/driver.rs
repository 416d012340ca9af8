//! The real driver: `dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL)` (and `libnvidia-ml.so.1` for
//! NVML), every hooked export and helper resolved by its exact name with the real `dlsym` on that
//! handle — so a hook always forwards to the real export of exactly its own name.
//!
//! Owns the resolved address tables and safe wrappers for the helper calls the shim makes itself
//! (current device/context, capture status, events, NVML per-process memory and utilization). Must never: resolve
//! through `RTLD_DEFAULT`/`RTLD_NEXT` (that would find our own exports), or block in
//! [`real_addr_nowait`] (called from inside `dlsym`).

use super::dlsym::real_dlsym;
use crate::variants::{Helper, Hook, Lib};
use std::ffi::{c_char, c_int, c_uint, c_void, CString};
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering::*};

const UNINIT: u8 = 0;
const OPENING: u8 = 1;
const READY: u8 = 2;
const FAILED: u8 = 3;

struct LibState {
    state: AtomicU8,
    handle: AtomicUsize,
}

static CUDA: LibState = LibState {
    state: AtomicU8::new(UNINIT),
    handle: AtomicUsize::new(0),
};
static NVML: LibState = LibState {
    state: AtomicU8::new(UNINIT),
    handle: AtomicUsize::new(0),
};
static HOOK_REAL: [AtomicUsize; Hook::COUNT] = [const { AtomicUsize::new(0) }; Hook::COUNT];
static HELPER_REAL: [AtomicUsize; Helper::COUNT] = [const { AtomicUsize::new(0) }; Helper::COUNT];

fn lib_state(lib: Lib) -> &'static LibState {
    match lib {
        Lib::Cuda => &CUDA,
        Lib::Nvml => &NVML,
    }
}

fn open(lib: Lib) -> bool {
    let soname = match lib {
        Lib::Cuda => c"libcuda.so.1",
        Lib::Nvml => c"libnvidia-ml.so.1",
    };
    // SAFETY: NUL-terminated literal; RTLD_LOCAL so our reference adds nothing to the global scope.
    let h = unsafe { libc::dlopen(soname.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        return false;
    }
    lib_state(lib).handle.store(h as usize, Release);
    let resolve = |name: &str| -> usize {
        let Ok(c) = CString::new(name) else { return 0 };
        // SAFETY: `h` is a live dlopen handle (never closed); `c` is NUL-terminated.
        unsafe { real_dlsym(h, c.as_ptr()) as usize }
    };
    for h in Hook::ALL.iter().filter(|h| h.lib() == lib) {
        HOOK_REAL[*h as usize].store(resolve(h.name()), Release);
    }
    for h in Helper::ALL.iter().filter(|h| h.lib() == lib) {
        HELPER_REAL[*h as usize].store(resolve(h.name()), Release);
    }
    true
}

/// Opens `lib` once. With `wait`, a thread arriving while another opens it yields until done;
/// without, it gets `false` at once.
fn ensure(lib: Lib, wait: bool) -> bool {
    let st = lib_state(lib);
    loop {
        match st.state.load(Acquire) {
            READY => return true,
            FAILED => return false,
            UNINIT => {
                if st
                    .state
                    .compare_exchange(UNINIT, OPENING, AcqRel, Acquire)
                    .is_ok()
                {
                    let ok = open(lib);
                    st.state.store(if ok { READY } else { FAILED }, Release);
                    return ok;
                }
            }
            _ if !wait => return false,
            _ => std::thread::yield_now(),
        }
    }
}

/// The real address of a hooked export (0 if the driver lacks it or cannot be opened).
#[inline]
pub fn real_addr(h: Hook) -> usize {
    if !ensure(h.lib(), true) {
        return 0;
    }
    HOOK_REAL[h as usize].load(Relaxed)
}

/// As [`real_addr`], but never waits for another thread's `dlopen`.
pub fn real_addr_nowait(h: Hook) -> Option<usize> {
    if !ensure(h.lib(), false) {
        return None;
    }
    Some(HOOK_REAL[h as usize].load(Relaxed)).filter(|&a| a != 0)
}

/// Snapshot of every hooked export's real address, indexed by [`Hook`].
pub fn real_addrs() -> [usize; Hook::COUNT] {
    ensure(Lib::Cuda, true);
    std::array::from_fn(|i| HOOK_REAL[i].load(Relaxed))
}

fn helper(h: Helper) -> usize {
    if !ensure(h.lib(), true) {
        return 0;
    }
    HELPER_REAL[h as usize].load(Relaxed)
}

/// Transmutes a helper's address to its C signature, or returns `$none` if it is missing.
macro_rules! helper_fn {
    ($h:ident : fn($($t:ty),*) -> $r:ty, else $none:expr) => {{
        let a = helper(Helper::$h);
        if a == 0 {
            return $none;
        }
        // SAFETY: `a` is the real export named exactly like the helper, whose C prototype is
        // the one spelled here (cuda.h / nvml.h).
        unsafe { std::mem::transmute::<usize, unsafe extern "C" fn($($t),*) -> $r>(a) }
    }};
}

/// Device ordinal of the calling thread's current context.
pub fn ctx_device() -> Option<usize> {
    let f = helper_fn!(cuCtxGetDevice: fn(*mut c_int) -> u32, else None);
    let mut d: c_int = -1;
    // SAFETY: valid out-pointer.
    let rc = unsafe { f(&mut d) };
    (rc == 0 && d >= 0).then_some(d as usize)
}

/// Whether the primary context of CUDA ordinal `dev` exists (`cuDevicePrimaryCtxGetState`);
/// `None` when the driver cannot say.
pub fn primary_ctx_active(dev: usize) -> Option<bool> {
    let f = helper_fn!(cuDevicePrimaryCtxGetState: fn(c_int, *mut c_uint, *mut c_int) -> u32, else None);
    let dev = c_int::try_from(dev).ok()?;
    let (mut flags, mut active): (c_uint, c_int) = (0, 0);
    // SAFETY: valid out-pointers; an invalid ordinal is an error code, not UB.
    let rc = unsafe { f(dev, &mut flags, &mut active) };
    (rc == 0).then_some(active != 0)
}

/// The current memory pool of CUDA ordinal `dev` (`cuDeviceGetMemPool`: what
/// `cuMemAllocAsync` allocates from).
pub fn device_mem_pool(dev: usize) -> Option<u64> {
    let f = helper_fn!(cuDeviceGetMemPool: fn(*mut *mut c_void, c_int) -> u32, else None);
    let dev = c_int::try_from(dev).ok()?;
    let mut pool: *mut c_void = std::ptr::null_mut();
    // SAFETY: valid out-pointer; an invalid ordinal is an error code.
    let rc = unsafe { f(&mut pool, dev) };
    (rc == 0 && !pool.is_null()).then_some(pool as u64)
}

/// `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT` (cuda.h): bytes of device memory a pool holds.
const CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: c_int = 5;
/// `CU_MEMPOOL_ATTR_USED_MEM_CURRENT` (cuda.h): bytes of a pool's allocations not yet freed.
const CU_MEMPOOL_ATTR_USED_MEM_CURRENT: c_int = 7;

fn pool_attr(pool: u64, attr: c_int) -> Option<u64> {
    let f =
        helper_fn!(cuMemPoolGetAttribute: fn(*mut c_void, c_int, *mut c_void) -> u32, else None);
    let mut v: u64 = 0;
    // SAFETY: both attributes are `cuuint64_t`; `pool` is a pool handle the driver handed out
    // (an invalid one is an error code).
    let rc = unsafe { f(pool as *mut c_void, attr, (&mut v as *mut u64).cast()) };
    (rc == 0).then_some(v)
}

/// Bytes of device memory `pool` reserves now.
pub fn pool_reserved(pool: u64) -> Option<u64> {
    pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)
}

/// Bytes `pool` reserves beyond its live allocations (what an allocation may reuse).
pub fn pool_idle(pool: u64) -> Option<u64> {
    let reserved = pool_reserved(pool)?;
    Some(reserved.saturating_sub(pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?))
}

/// Frees a stream-ordered allocation the shim itself must give back (one whose pool grew past
/// the cap), in `stream`'s order.
pub fn mem_free_async(ptr: u64, stream: usize, ptsz: bool) -> u32 {
    let f = if ptsz {
        helper_fn!(cuMemFreeAsync_ptsz: fn(u64, *mut c_void) -> u32, else 999)
    } else {
        helper_fn!(cuMemFreeAsync: fn(u64, *mut c_void) -> u32, else 999)
    };
    // SAFETY: `ptr` is an allocation the driver just returned on `stream`.
    unsafe { f(ptr, stream as *mut c_void) }
}

/// The calling thread's current context (0 if none).
pub fn ctx_current() -> Option<usize> {
    let f = helper_fn!(cuCtxGetCurrent: fn(*mut *mut c_void) -> u32, else None);
    let mut c: *mut c_void = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    let rc = unsafe { f(&mut c) };
    (rc == 0 && !c.is_null()).then_some(c as usize)
}

/// `CU_STREAM_PER_THREAD`: the calling thread's default stream, whatever the API variant
/// (cuda.h).
const CU_STREAM_PER_THREAD: usize = 0x2;

/// Whether `stream` (as passed to a launch, `ptsz` for the `_ptsz` variants) names the calling
/// thread's default stream — a different queue on each thread under one handle.
pub fn per_thread_stream(stream: usize, ptsz: bool) -> bool {
    stream == CU_STREAM_PER_THREAD || (ptsz && stream == 0)
}

/// Whether `stream` is capturing (`Some(false)` = definitely not).
pub fn stream_capturing(stream: usize, ptsz: bool) -> Option<bool> {
    let f = if ptsz {
        helper_fn!(cuStreamIsCapturing_ptsz: fn(*mut c_void, *mut c_uint) -> u32, else None)
    } else {
        helper_fn!(cuStreamIsCapturing: fn(*mut c_void, *mut c_uint) -> u32, else None)
    };
    let mut st: c_uint = 0;
    // SAFETY: `stream` is the caller's stream handle, passed through unchanged; valid out-pointer.
    let rc = unsafe { f(stream as *mut c_void, &mut st) };
    (rc == 0).then_some(st != 0)
}

/// Whether `stream` has no work pending (`cuStreamQuery`: `Some(true)` = idle, `Some(false)` =
/// work queued, `None` = the query failed).
pub fn stream_idle(stream: usize, ptsz: bool) -> Option<bool> {
    let f = if ptsz {
        helper_fn!(cuStreamQuery_ptsz: fn(*mut c_void) -> u32, else None)
    } else {
        helper_fn!(cuStreamQuery: fn(*mut c_void) -> u32, else None)
    };
    // SAFETY: `stream` is the caller's stream handle, passed through unchanged.
    match unsafe { f(stream as *mut c_void) } {
        0 => Some(true),
        600 => Some(false),
        _ => None,
    }
}

/// A new timing event in the current context.
pub fn event_create() -> Option<usize> {
    let f = helper_fn!(cuEventCreate: fn(*mut *mut c_void, c_uint) -> u32, else None);
    let mut e: *mut c_void = std::ptr::null_mut();
    // SAFETY: valid out-pointer; flags 0 = CU_EVENT_DEFAULT (timing enabled).
    let rc = unsafe { f(&mut e, 0) };
    (rc == 0 && !e.is_null()).then_some(e as usize)
}

/// Records `ev` on `stream` (per-thread default stream semantics when `ptsz`).
pub fn event_record(ev: usize, stream: usize, ptsz: bool) -> bool {
    let f = if ptsz {
        helper_fn!(cuEventRecord_ptsz: fn(*mut c_void, *mut c_void) -> u32, else false)
    } else {
        helper_fn!(cuEventRecord: fn(*mut c_void, *mut c_void) -> u32, else false)
    };
    // SAFETY: `ev` is an event we created; `stream` is the caller's stream handle.
    unsafe { f(ev as *mut c_void, stream as *mut c_void) == 0 }
}

/// `cuEventQuery`: 0 = done, 600 = not ready, anything else an error.
pub fn event_query(ev: usize) -> u32 {
    let f = helper_fn!(cuEventQuery: fn(*mut c_void) -> u32, else 999);
    // SAFETY: `ev` is an event we created.
    unsafe { f(ev as *mut c_void) }
}

/// Milliseconds between two completed events.
pub fn event_elapsed_ms(a: usize, b: usize) -> Option<f32> {
    let f =
        helper_fn!(cuEventElapsedTime: fn(*mut f32, *mut c_void, *mut c_void) -> u32, else None);
    let mut ms: f32 = 0.0;
    // SAFETY: events we created; valid out-pointer.
    let rc = unsafe { f(&mut ms, a as *mut c_void, b as *mut c_void) };
    (rc == 0 && ms.is_finite() && ms >= 0.0).then_some(ms)
}

static NVML_INIT: AtomicU8 = AtomicU8::new(UNINIT);

fn nvml_ready() -> bool {
    match NVML_INIT.load(Acquire) {
        READY => true,
        FAILED => false,
        _ => {
            let f = helper_fn!(nvmlInit_v2: fn() -> u32, else {
                NVML_INIT.store(FAILED, Release);
                false
            });
            // SAFETY: no arguments; NVML reference-counts init.
            let ok = unsafe { f() } == 0;
            NVML_INIT.store(if ok { READY } else { FAILED }, Release);
            ok
        }
    }
}

/// NVML `nvmlProcessInfo_t` (v2/v3 layout).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct ProcInfo {
    pid: c_uint,
    used: u64,
    gi: c_uint,
    ci: c_uint,
}

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, NVML's spelling of a 16-byte CUDA UUID.
pub fn uuid_string(b: &[u8; 16]) -> String {
    let h = |r: std::ops::Range<usize>| b[r].iter().map(|x| format!("{x:02x}")).collect::<String>();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        h(0..4),
        h(4..6),
        h(6..8),
        h(8..10),
        h(10..16)
    )
}

/// UUID bytes of CUDA ordinal `ordinal` (`cuDeviceGetUuid`; needs `cuInit` done by the host
/// process).
pub fn cuda_uuid_bytes(ordinal: usize) -> Option<[u8; 16]> {
    let get = helper_fn!(cuDeviceGet: fn(*mut c_int, c_int) -> u32, else None);
    let uuid = helper_fn!(cuDeviceGetUuid: fn(*mut [u8; 16], c_int) -> u32, else None);
    let mut dev: c_int = -1;
    let mut b = [0u8; 16];
    // SAFETY: valid out-pointers; CUuuid is 16 bytes.
    let ok = unsafe { get(&mut dev, ordinal as c_int) == 0 && uuid(&mut b, dev) == 0 };
    ok.then_some(b)
}

/// UUID of CUDA ordinal `ordinal` in NVML's spelling.
fn cuda_uuid(ordinal: usize) -> Option<String> {
    cuda_uuid_bytes(ordinal).map(|b| uuid_string(&b))
}

/// The NVML handle of CUDA ordinal `ordinal`: by UUID (correct under `CUDA_VISIBLE_DEVICES`),
/// else by the same index when no device list is set.
fn nvml_handle_of_ordinal(ordinal: usize) -> Option<*mut c_void> {
    let mut h: *mut c_void = std::ptr::null_mut();
    if let Some(u) = cuda_uuid(ordinal) {
        let by_uuid = helper_fn!(nvmlDeviceGetHandleByUUID: fn(*const c_char, *mut *mut c_void) -> u32, else None);
        let c = CString::new(u).ok()?;
        // SAFETY: NUL-terminated UUID; valid out-pointer.
        if unsafe { by_uuid(c.as_ptr(), &mut h) } == 0 {
            return Some(h);
        }
    }
    if std::env::var_os("CUDA_VISIBLE_DEVICES").is_some() {
        return None;
    }
    let by_index =
        helper_fn!(nvmlDeviceGetHandleByIndex_v2: fn(c_uint, *mut *mut c_void) -> u32, else None);
    // SAFETY: valid out-pointer.
    (unsafe { by_index(ordinal as c_uint, &mut h) } == 0).then_some(h)
}

/// The CUDA ordinal of an NVML device handle (what the caps are indexed by): the ordinal whose
/// UUID matches; without a CUDA device list (process never called cuInit), the NVML index when
/// `CUDA_VISIBLE_DEVICES` is unset. `None`: this NVML device is not one of the process's CUDA
/// devices (or cannot be identified).
pub fn cuda_ordinal_of_nvml(handle: usize) -> Option<usize> {
    let uuid_of =
        helper_fn!(nvmlDeviceGetUUID: fn(*mut c_void, *mut c_char, c_uint) -> u32, else None);
    let mut buf = [0 as c_char; 96];
    // SAFETY: `handle` is the caller's NVML handle; `buf` holds 96 bytes.
    if unsafe { uuid_of(handle as *mut c_void, buf.as_mut_ptr(), buf.len() as c_uint) } == 0 {
        // SAFETY: NVML wrote a NUL-terminated string into `buf`.
        let nv = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        let count = helper_fn!(cuDeviceGetCount: fn(*mut c_int) -> u32, else None);
        let mut n: c_int = 0;
        // SAFETY: valid out-pointer.
        if unsafe { count(&mut n) } == 0 && n > 0 {
            return (0..n as usize).find(|&o| cuda_uuid(o).as_deref() == Some(nv.as_str()));
        }
    }
    if std::env::var_os("CUDA_VISIBLE_DEVICES").is_some() {
        return None;
    }
    nvml_index(handle)
}

/// One of NVML's process-list functions (`(device, *count, infos) -> nvmlReturn_t`): `v2`
/// where the driver exports it, else `v3`. `_v2` always writes the 24-byte `nvmlProcessInfo_t`
/// ([`ProcInfo`]); `_v3` did too, until an R535 driver (CUDA 12.2) wrote a 32-byte entry under
/// the same name, with `usedGpuCcProtectedMemory` added (XuehaiPan/nvitop pull request #79),
/// which overruns a 24-byte buffer (found by review, 2026-11-28). The simulated NVML exports
/// both.
fn process_list(
    v2: Helper,
    v3: Helper,
) -> Option<unsafe extern "C" fn(*mut c_void, *mut c_uint, *mut ProcInfo) -> u32> {
    let a = match helper(v2) {
        0 => helper(v3),
        a => a,
    };
    if a == 0 {
        return None;
    }
    // SAFETY: `a` is the real export of `v2` or `v3`, whose C prototype is this one (nvml.h);
    // the caller's buffer is of the 24-byte layout `_v2` always writes (see above for `_v3`).
    Some(unsafe {
        std::mem::transmute::<
            usize,
            unsafe extern "C" fn(*mut c_void, *mut c_uint, *mut ProcInfo) -> u32,
        >(a)
    })
}

/// The entry of NVML's process list (`v2`, else `v3`: [`process_list`]) on CUDA ordinal `dev`
/// whose pid `is_me` accepts: `Some(None)` when the list holds no such process. `None`: NVML is
/// unavailable, the device cannot be identified, the call failed, or the list holds more than
/// 64 entries (the stack buffer's; more processes on one GPU than any case the shim measures).
fn find_process(
    dev: usize,
    v2: Helper,
    v3: Helper,
    is_me: impl Fn(u32) -> bool,
) -> Option<Option<ProcInfo>> {
    if !nvml_ready() {
        return None;
    }
    let h = nvml_handle_of_ordinal(dev)?;
    let list = process_list(v2, v3)?;
    let mut buf = [ProcInfo::default(); 64];
    let mut n: c_uint = buf.len() as c_uint;
    // SAFETY: `buf` has room for `n` entries of the 24-byte layout `process_list`'s function
    // writes; `h` is a valid NVML handle and `n` a valid out-pointer.
    if unsafe { list(h, &mut n, buf.as_mut_ptr()) } != 0 {
        return None;
    }
    Some(
        buf[..(n as usize).min(buf.len())]
            .iter()
            .copied()
            .find(|p| is_me(p.pid)),
    )
}

/// Device memory NVML attributes on CUDA ordinal `dev` to the process whose NVML pid `is_me`
/// accepts (NVML may report a containerised process by its host pid or by its own: see
/// `os::known_as`).
pub fn nvml_process_mem(dev: usize, is_me: impl Fn(u32) -> bool) -> Option<u64> {
    find_process(
        dev,
        Helper::nvmlDeviceGetComputeRunningProcesses_v2,
        Helper::nvmlDeviceGetComputeRunningProcesses_v3,
        is_me,
    )?
    .map(|p| p.used)
}

/// One NVML per-process utilization sample (`nvmlProcessUtilizationSample_t`, nvml.h).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcessUtilization {
    /// The process.
    pub pid: c_uint,
    /// End of the sample's period, µs (CLOCK_MONOTONIC on Linux drivers).
    pub ts_us: u64,
    /// Percent of the period the process's kernels ran on the SMs.
    pub sm_util: c_uint,
    /// Percent of the period the process read or wrote device memory.
    pub mem_util: c_uint,
    /// Encoder utilization, percent.
    pub enc_util: c_uint,
    /// Decoder utilization, percent.
    pub dec_util: c_uint,
}

/// Samples [`nvml_process_utilization`] reads at most (a few processes × a few sample periods).
pub const MAX_UTIL_SAMPLES: usize = 64;
/// `NVML_ERROR_NOT_FOUND`: no sample newer than the timestamp asked for.
const NVML_ERROR_NOT_FOUND: u32 = 6;

/// NVML's per-process utilization samples of CUDA ordinal `dev` newer than `since_us` (0: every
/// sample the driver keeps), into `out`; returns how many. `None`: NVML is unavailable, the device
/// cannot be identified, or the call failed.
pub fn nvml_process_utilization(
    dev: usize,
    since_us: u64,
    out: &mut [ProcessUtilization; MAX_UTIL_SAMPLES],
) -> Option<usize> {
    if !nvml_ready() {
        return None;
    }
    let h = nvml_handle_of_ordinal(dev)?;
    let f = helper_fn!(nvmlDeviceGetProcessUtilization: fn(*mut c_void, *mut ProcessUtilization, *mut c_uint, u64) -> u32, else None);
    let mut n = MAX_UTIL_SAMPLES as c_uint;
    // SAFETY: `out` has room for `n` samples of the nvml.h layout; `h` is a valid NVML handle.
    match unsafe { f(h, out.as_mut_ptr(), &mut n, since_us) } {
        0 => Some((n as usize).min(MAX_UTIL_SAMPLES)),
        NVML_ERROR_NOT_FOUND => Some(0),
        _ => None,
    }
}

/// One NVML sample (`nvmlSample_t`, nvml.h): a timestamp (µs) and an `nvmlValue_t`, a union of
/// 8 bytes read according to the value type the call returns.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Sample {
    /// When the sample's period ended, µs.
    pub ts_us: u64,
    /// The `nvmlValue_t` bytes.
    pub raw: u64,
}

/// `nvmlSamplingType_t` `NVML_GPU_UTILIZATION_SAMPLES`.
const NVML_GPU_UTILIZATION_SAMPLES: c_uint = 1;

/// The device's utilization samples of CUDA ordinal `dev` newer than `since_us`
/// (`nvmlDeviceGetSamples`, `NVML_GPU_UTILIZATION_SAMPLES`) as (µs, percent busy) into `out`;
/// returns how many. `None`: NVML is unavailable, the device cannot be identified, the call
/// failed, or the values come in a type that is not a whole or real number of percent.
pub fn nvml_device_utilization(
    dev: usize,
    since_us: u64,
    out: &mut [(u64, u32); MAX_UTIL_SAMPLES],
) -> Option<usize> {
    if !nvml_ready() {
        return None;
    }
    let h = nvml_handle_of_ordinal(dev)?;
    let f = helper_fn!(nvmlDeviceGetSamples: fn(*mut c_void, c_uint, u64, *mut c_uint, *mut c_uint, *mut Sample) -> u32, else None);
    let mut raw = [Sample::default(); MAX_UTIL_SAMPLES];
    let (mut ty, mut n): (c_uint, c_uint) = (0, MAX_UTIL_SAMPLES as c_uint);
    // SAFETY: `raw` has room for `n` samples of the nvml.h layout; `h` is a valid NVML handle;
    // `ty` and `n` are valid out-pointers.
    match unsafe {
        f(
            h,
            NVML_GPU_UTILIZATION_SAMPLES,
            since_us,
            &mut ty,
            &mut n,
            raw.as_mut_ptr(),
        )
    } {
        0 => {}
        NVML_ERROR_NOT_FOUND => return Some(0),
        _ => return None,
    }
    let n = (n as usize).min(MAX_UTIL_SAMPLES);
    for (o, s) in out.iter_mut().zip(&raw[..n]) {
        // nvmlValueType_t: 0 double, 1 unsigned int, 2 unsigned long, 3 unsigned long long.
        let pct = match ty {
            0 => f64::from_bits(s.raw).clamp(0.0, 100.0) as u32,
            1 => (s.raw & 0xffff_ffff) as u32,
            2 | 3 => s.raw.min(100) as u32,
            _ => return None,
        };
        *o = (s.ts_us, pct.min(100));
    }
    Some(n)
}

/// Whether NVML lists the process whose NVML pid `is_me` accepts as an MPS client on CUDA
/// ordinal `dev` (`nvmlDeviceGetMPSComputeRunningProcesses`, `_v2` where the driver has it,
/// else `_v3`): `Some(true)` where this process's kernels run through an MPS server. `None`: NVML
/// is unavailable, the device cannot be identified, the driver cannot say, or more clients than
/// the buffer holds (64; MPS serves at most 48 clients per GPU on Volta and later, NVIDIA's MPS
/// documentation).
pub fn nvml_mps_client(dev: usize, is_me: impl Fn(u32) -> bool) -> Option<bool> {
    find_process(
        dev,
        Helper::nvmlDeviceGetMPSComputeRunningProcesses_v2,
        Helper::nvmlDeviceGetMPSComputeRunningProcesses_v3,
        is_me,
    )
    .map(|p| p.is_some())
}

/// Frees a device pointer the shim itself must give back (a pitched allocation whose real size
/// did not fit the cap). `v1` selects the 32-bit `cuMemFree`.
pub fn mem_free(ptr: u64, v1: bool) -> u32 {
    if v1 {
        let f = helper_fn!(cuMemFree: fn(c_uint) -> u32, else 999);
        // SAFETY: `ptr` is an allocation the driver just returned to us.
        unsafe { f(ptr as c_uint) }
    } else {
        let f = helper_fn!(cuMemFree_v2: fn(u64) -> u32, else 999);
        // SAFETY: as above.
        unsafe { f(ptr) }
    }
}

/// NVML index of a device handle.
pub fn nvml_index(handle: usize) -> Option<usize> {
    let f = helper_fn!(nvmlDeviceGetIndex: fn(*mut c_void, *mut c_uint) -> u32, else None);
    let mut i: c_uint = 0;
    // SAFETY: `handle` is the caller's NVML device handle, passed through; valid out-pointer.
    let rc = unsafe { f(handle as *mut c_void, &mut i) };
    (rc == 0).then_some(i as usize)
}
