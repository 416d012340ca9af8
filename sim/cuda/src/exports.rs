//! The exported driver entry points. Each one catches panics (returning
//! `CUDA_ERROR_UNKNOWN`) so a bug in the simulator never unwinds into C.

use crate::state::*;
use cudarc::driver::sys::{
    cudaError_enum as E, CUcontext, CUdevice, CUdeviceptr, CUevent, CUfunction, CUgraph,
    CUgraphExec, CUlaunchConfig, CUmemoryPool, CUmodule, CUstream, CUuuid, CUDA_LAUNCH_PARAMS,
};
use smore_simgpu::EventStatus;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::*};
use std::sync::Mutex;

type Res = Result<(), R>;

macro_rules! api {
    ($( $(#[$m:meta])* fn $name:ident($($a:ident : $t:ty),* $(,)?) $body:block )*) => {
        $(
            #[doc = concat!("The simulated driver's `", stringify!($name), "`, with the CUDA driver API's contract.")]
            ///
            $(#[$m])*
            ///
            /// # Safety
            /// As for the CUDA driver's function of the same name: every pointer argument is null
            /// or valid for the access the driver API documents for it.
            // Bodies without a raw-pointer access leave the blanket block below unused.
            #[allow(unused_unsafe)]
            #[no_mangle]
            pub unsafe extern "C" fn $name($($a: $t),*) -> R {
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| -> Res {
                    // SAFETY: the caller keeps the driver API's contract for this entry point
                    // (see `# Safety` above): pointer arguments are null or valid for the access
                    // the API documents, and handles are ones this driver handed out
                    // (`state::obj` also checks their magic number).
                    unsafe { $body }
                }));
                match r {
                    Ok(Ok(())) => E::CUDA_SUCCESS,
                    Ok(Err(e)) => e,
                    Err(_) => E::CUDA_ERROR_UNKNOWN,
                }
            }
        )*
    };
}

fn ok(r: R) -> Res {
    if r == E::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(r)
    }
}

fn out<T>(p: *mut T, v: T) -> Res {
    if p.is_null() {
        return Err(E::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null output pointer supplied by the caller per the driver API contract.
    unsafe { p.write(v) };
    Ok(())
}

/// CUDA ordinal (what `CUdevice` holds, as in the real driver) → node device index.
fn dev_ok(d: &Driver, dev: CUdevice) -> Result<u32, R> {
    usize::try_from(dev)
        .ok()
        .and_then(|i| d.visible.get(i).copied())
        .ok_or(E::CUDA_ERROR_INVALID_DEVICE)
}

/// Node device index → this process's CUDA ordinal.
fn ordinal_of(d: &Driver, node_dev: u32) -> CUdevice {
    d.visible
        .iter()
        .position(|&v| v == node_dev)
        .map_or(-1, |o| o as CUdevice)
}

fn ctx_ok() -> Result<&'static Ctx, R> {
    driver()?;
    current_ctx().ok_or(E::CUDA_ERROR_INVALID_CONTEXT)
}

// ---------------------------------------------------------------------------------------------
// Streams: resolving the legacy, per-thread and explicit stream handles.

const CU_STREAM_LEGACY: usize = 0x1;
const CU_STREAM_PER_THREAD: usize = 0x2;

/// A resolved stream: device, local stream index, and the stream object when it is an explicit one.
pub struct Target {
    pub dev: u32,
    pub local: u32,
    pub obj: Option<&'static StreamObj>,
}

fn per_thread_stream(ctx: &'static Ctx) -> Result<Target, R> {
    let key = ctx as *const Ctx as usize;
    if let Some(p) = PER_THREAD.with(|m| m.borrow().get(&key).copied()) {
        // SAFETY: only leaked StreamObj pointers are stored in PER_THREAD.
        let s = unsafe { &*(p as *const StreamObj) };
        return Ok(Target {
            dev: s.dev,
            local: s.local,
            obj: None,
        });
    }
    let d = driver()?;
    let local = d.node.stream_create(ctx.dev, 0).map_err(sim_err)?;
    let s = Box::leak(Box::new(StreamObj {
        magic: AtomicU64::new(STREAM_MAGIC),
        dev: ctx.dev,
        local,
        flags: 0,
        priority: 0,
        ctx: ctx as *const Ctx as *mut Ctx,
        capturing: AtomicBool::new(false),
        captured: Mutex::new(Vec::new()),
    }));
    PER_THREAD.with(|m| m.borrow_mut().insert(key, s as *const StreamObj as usize));
    Ok(Target {
        dev: s.dev,
        local,
        obj: None,
    })
}

fn stream_target(h: CUstream, ptsz: bool) -> Result<Target, R> {
    match h as usize {
        0 if ptsz => per_thread_stream(ctx_ok()?),
        0 | CU_STREAM_LEGACY => {
            let c = ctx_ok()?;
            Ok(Target {
                dev: c.dev,
                local: c.default_stream,
                obj: None,
            })
        }
        CU_STREAM_PER_THREAD => per_thread_stream(ctx_ok()?),
        _ => {
            // SAFETY: a non-special stream handle must be one we handed out.
            let s = unsafe { obj(h as *const StreamObj, STREAM_MAGIC) }
                .ok_or(E::CUDA_ERROR_INVALID_HANDLE)?;
            Ok(Target {
                dev: s.dev,
                local: s.local,
                obj: Some(s),
            })
        }
    }
}

/// Queues `dur_ns` of kernel time, or records it into the stream's capture graph.
fn submit(t: &Target, dur_ns: u64) -> Res {
    if let Some(s) = t.obj {
        if s.capturing.load(Acquire) {
            s.captured
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(dur_ns);
            return Ok(());
        }
    }
    driver()?
        .node
        .launch(t.dev, t.local, dur_ns)
        .map_err(sim_err)
}

fn kernel_duration(f: CUfunction, params: *mut *mut c_void) -> Result<u64, R> {
    // SAFETY: function handles are ours (checked by magic).
    let func =
        unsafe { obj(f as *const Function, FUNC_MAGIC) }.ok_or(E::CUDA_ERROR_INVALID_HANDLE)?;
    if func.spin {
        if params.is_null() {
            return Err(E::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the smore_sim_spin convention: kernelParams[0] points to a u64 duration in ns.
        let p0 = unsafe { *params };
        if p0.is_null() {
            return Err(E::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: as above.
        return Ok(unsafe { (p0 as *const u64).read_unaligned() });
    }
    Ok(func.dur_ns)
}

fn launch(
    f: CUfunction,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    h: CUstream,
    params: *mut *mut c_void,
    ptsz: bool,
) -> Res {
    if grid.contains(&0)
        || block.contains(&0)
        || block.iter().map(|&b| b as u64).product::<u64>() > 1024
    {
        return Err(E::CUDA_ERROR_INVALID_VALUE);
    }
    let dur = kernel_duration(f, params)?;
    let t = stream_target(h, ptsz)?;
    submit(&t, dur)
}

fn launch_ex(
    config: *const CUlaunchConfig,
    f: CUfunction,
    params: *mut *mut c_void,
    ptsz: bool,
) -> Res {
    if config.is_null() {
        return Err(E::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null config supplied by the caller.
    let c = unsafe { &*config };
    launch(
        f,
        [c.gridDimX, c.gridDimY, c.gridDimZ],
        [c.blockDimX, c.blockDimY, c.blockDimZ],
        c.hStream,
        params,
        ptsz,
    )
}

fn graph_launch(exec: CUgraphExec, h: CUstream, ptsz: bool) -> Res {
    // SAFETY: exec handles are ours (checked by magic).
    let e =
        unsafe { obj(exec as *const GraphExec, EXEC_MAGIC) }.ok_or(E::CUDA_ERROR_INVALID_HANDLE)?;
    let t = stream_target(h, ptsz)?;
    if !e.allocs.is_empty() && !e.backed.swap(true, AcqRel) {
        // The graph's allocations get physical memory when it first runs (and keep it).
        let d = driver()?;
        for (i, &(dev, bytes)) in e.allocs.iter().enumerate() {
            if let Err(err) = d.charge(dev, bytes) {
                for &(dev, bytes) in &e.allocs[..i] {
                    d.node.credit(dev, bytes);
                }
                e.backed.store(false, Release);
                return Err(err);
            }
        }
    }
    if e.kernels == 0 {
        return Ok(());
    }
    submit(&t, e.total_ns)
}

// ---------------------------------------------------------------------------------------------
// Memory helpers.

fn alloc_device(bytes: u64) -> Result<(u32, u64), R> {
    if bytes == 0 {
        return Err(E::CUDA_ERROR_INVALID_VALUE);
    }
    let d = driver()?;
    let ctx = ctx_ok()?;
    d.charge(ctx.dev, bytes)?;
    let va = new_va(bytes);
    d.tables().allocs.insert(
        va,
        Alloc {
            dev: ctx.dev,
            size: bytes,
            kind: AllocKind::Device,
        },
    );
    Ok((ctx.dev, va))
}

fn free_device(ptr: u64) -> Res {
    let d = driver()?;
    if ptr == 0 {
        return Ok(());
    }
    let a = d
        .tables()
        .allocs
        .remove(&ptr)
        .ok_or(E::CUDA_ERROR_INVALID_VALUE)?;
    release_alloc(d, a);
    Ok(())
}

fn release_alloc(d: &Driver, a: Alloc) {
    match a.kind {
        AllocKind::Device => d.node.credit(a.dev, a.size),
        AllocKind::Managed { host } => {
            d.node.credit(a.dev, a.size);
            // SAFETY: `host` is the anonymous mapping made for this managed allocation.
            unsafe { libc::munmap(host as *mut c_void, a.size as usize) };
        }
        AllocKind::Pool { pool } => {
            // SAFETY: pool pointers stored in allocations are leaked `Pool` boxes.
            let p = unsafe { &*(pool as *const Pool) };
            pool_free(d, p, a.size);
        }
    }
}

fn pool_alloc(d: &Driver, pool: &Pool, bytes: u64) -> Result<u64, R> {
    // Reuse reserved-but-unused pool memory first; grow the reservation (charging the device)
    // only for the rest — the real pool retains freed memory up to its release threshold.
    let used = pool.used.load(Acquire);
    let reserved = pool.reserved.load(Acquire);
    let idle = reserved.saturating_sub(used);
    let grow = bytes.saturating_sub(idle);
    if grow > 0 {
        d.charge(pool.dev, grow)?;
        let r = pool.reserved.fetch_add(grow, AcqRel) + grow;
        pool.reserved_high.fetch_max(r, AcqRel);
    }
    let u = pool.used.fetch_add(bytes, AcqRel) + bytes;
    pool.used_high.fetch_max(u, AcqRel);
    let va = new_va(bytes);
    d.tables().allocs.insert(
        va,
        Alloc {
            dev: pool.dev,
            size: bytes,
            kind: AllocKind::Pool {
                pool: pool as *const Pool as usize,
            },
        },
    );
    Ok(va)
}

fn pool_free(d: &Driver, pool: &Pool, bytes: u64) {
    let _ = pool
        .used
        .fetch_update(AcqRel, Acquire, |u| Some(u.saturating_sub(bytes)));
    trim_pool(d, pool, pool.release_threshold.load(Acquire));
}

/// Releases reserved-but-unused pool memory above `keep` back to the device.
fn trim_pool(d: &Driver, pool: &Pool, keep: u64) {
    let used = pool.used.load(Acquire);
    let reserved = pool.reserved.load(Acquire);
    let target = used.max(keep.min(reserved));
    if reserved > target {
        let give = reserved - target;
        pool.reserved.fetch_sub(give, AcqRel);
        d.node.credit(pool.dev, give);
    }
}

fn default_pool(d: &Driver, dev: u32) -> &'static Pool {
    let mut t = d.tables();
    if t.default_pools[dev as usize] == 0 {
        let p = Box::leak(Box::new(new_pool(dev)));
        t.default_pools[dev as usize] = p as *const Pool as usize;
    }
    // SAFETY: default pools are leaked boxes, never freed.
    unsafe { &*(t.default_pools[dev as usize] as *const Pool) }
}

fn new_pool(dev: u32) -> Pool {
    Pool {
        magic: AtomicU64::new(POOL_MAGIC),
        dev,
        release_threshold: AtomicU64::new(0),
        used: AtomicU64::new(0),
        reserved: AtomicU64::new(0),
        used_high: AtomicU64::new(0),
        reserved_high: AtomicU64::new(0),
    }
}

/// Bytes per element of a CUarray_format.
fn format_bytes(format: u32) -> Option<u64> {
    Some(match format {
        0x01 | 0x08 => 1,
        0x02 | 0x09 | 0x10 => 2,
        0x03 | 0x0a | 0x20 => 4,
        _ => return None,
    })
}

#[repr(C)]
pub struct ArrayDescV1 {
    width: c_uint,
    height: c_uint,
    format: c_uint,
    channels: c_uint,
}
#[repr(C)]
pub struct ArrayDesc {
    width: usize,
    height: usize,
    format: c_uint,
    channels: c_uint,
}
#[repr(C)]
pub struct Array3DDesc {
    width: usize,
    height: usize,
    depth: usize,
    format: c_uint,
    channels: c_uint,
    flags: c_uint,
}

fn array_create(
    out_arr: *mut *mut c_void,
    w: u64,
    h: u64,
    depth: u64,
    format: u32,
    channels: u32,
) -> Res {
    let elem = format_bytes(format).ok_or(E::CUDA_ERROR_INVALID_VALUE)?;
    if w == 0 || !matches!(channels, 1 | 2 | 4) {
        return Err(E::CUDA_ERROR_INVALID_VALUE);
    }
    let bytes = w * h.max(1) * depth.max(1) * elem * channels as u64;
    let d = driver()?;
    let ctx = ctx_ok()?;
    d.charge(ctx.dev, bytes)?;
    let handle = new_va(bytes) as usize;
    d.tables().arrays.insert(handle, (ctx.dev, bytes));
    out(out_arr, handle as *mut c_void)
}

/// Bytes of a mipmapped array: every level, each halving the extents of the one before (down to
/// 1; a 0 extent — a 1D or 2D array — stays 0).
fn mipmap_bytes(w: u64, h: u64, depth: u64, elem: u64, channels: u64, levels: u32) -> u64 {
    (0..levels.min(64))
        .map(|l| {
            let e = |x: u64| if x == 0 { 0 } else { (x >> l).max(1) };
            e(w) * e(h).max(1) * e(depth).max(1) * elem * channels
        })
        .sum()
}

fn info(free: &mut u64, total: &mut u64) -> Res {
    let d = driver()?;
    let ctx = ctx_ok()?;
    let info = d.node.device_info(ctx.dev).map_err(sim_err)?;
    d.node.reap_dead();
    let used = d.node.used_mem(ctx.dev).map_err(sim_err)?;
    *total = info.total_mem;
    *free = info.total_mem.saturating_sub(used);
    Ok(())
}

fn sync_copy(ptds: bool) -> Res {
    let d = driver()?;
    let t = stream_target(std::ptr::null_mut(), ptds)?;
    d.node.stream_sync(t.dev, t.local).map_err(sim_err)
}

fn async_copy(h: CUstream, ptsz: bool) -> Res {
    let t = stream_target(h, ptsz)?;
    submit(&t, 0)
}

// ---------------------------------------------------------------------------------------------
// Contexts.

fn make_ctx(d: &Driver, dev: u32, primary: bool, flags: u32) -> Result<&'static Ctx, R> {
    d.charge(dev, d.node.context_bytes())?;
    let default_stream = match d.node.stream_create(dev, 0) {
        Ok(s) => s,
        Err(e) => {
            d.node.credit(dev, d.node.context_bytes());
            return Err(sim_err(e));
        }
    };
    d.node.set_has_context(dev, true);
    Ok(Box::leak(Box::new(Ctx {
        magic: AtomicU64::new(CTX_MAGIC),
        dev,
        default_stream,
        primary,
        flags: AtomicU32::new(flags),
    })))
}

fn destroy_ctx(d: &Driver, c: &Ctx) {
    let _ = d.node.device_sync(c.dev);
    let _ = d.node.stream_destroy(c.dev, c.default_stream);
    d.node.credit(c.dev, d.node.context_bytes());
    // The box is kept (magic cleared) so stale handles are detected, not dereferenced freed.
    c.magic.store(0, Release);
    let any_left = {
        let t = d.tables();
        t.primary_refs[c.dev as usize] > 0
    };
    if !any_left {
        d.node.set_has_context(c.dev, false);
    }
}

fn create_ctx(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> Res {
    let d = driver()?;
    let dev = dev_ok(d, dev)?;
    let c = make_ctx(d, dev, false, flags)?;
    CTX_STACK.with(|s| s.borrow_mut().push(c as *const Ctx as usize));
    out(pctx, c as *const Ctx as CUcontext)
}

fn primary_release(dev: CUdevice) -> Res {
    let d = driver()?;
    let dev = dev_ok(d, dev)?;
    let ctx = {
        let mut t = d.tables();
        let i = dev as usize;
        if t.primary_refs[i] == 0 {
            return Err(E::CUDA_ERROR_INVALID_CONTEXT);
        }
        t.primary_refs[i] -= 1;
        if t.primary_refs[i] > 0 {
            return Ok(());
        }
        std::mem::take(&mut t.primary[i])
    };
    if ctx != 0 {
        // SAFETY: primary contexts are leaked Ctx boxes.
        destroy_ctx(d, unsafe { &*(ctx as *const Ctx) });
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Modules.

const MODULE_HEADER: &str = "smore-sim-module";

fn parse_image(image: *const c_void) -> HashMap<String, u64> {
    let mut kernels = HashMap::new();
    if image.is_null() {
        return kernels;
    }
    // SAFETY: a module image is at least a few bytes; a text image is NUL-terminated (as PTX
    // images are). We only read further when the header matches.
    let head = unsafe { std::slice::from_raw_parts(image as *const u8, MODULE_HEADER.len()) };
    if head != MODULE_HEADER.as_bytes() {
        return kernels;
    }
    // SAFETY: text images are NUL-terminated by contract.
    let text = unsafe { CStr::from_ptr(image as *const c_char) }.to_string_lossy();
    for line in text.lines().skip(1) {
        let mut it = line.split_whitespace();
        if let (Some(name), Some(us)) = (it.next(), it.next()) {
            if let Ok(us) = us.parse::<f64>() {
                kernels.insert(name.to_string(), (us * 1000.0).round() as u64);
            }
        }
    }
    kernels
}

fn load_module(m: *mut CUmodule, image: *const c_void) -> Res {
    ctx_ok()?;
    if image.is_null() {
        return Err(E::CUDA_ERROR_INVALID_VALUE);
    }
    let module = Box::leak(Box::new(Module {
        magic: AtomicU64::new(MODULE_MAGIC),
        kernels: parse_image(image),
        functions: Mutex::new(HashMap::new()),
    }));
    out(m, module as *const Module as CUmodule)
}

// ---------------------------------------------------------------------------------------------
// Events.

fn event_of(e: CUevent) -> Result<&'static EventObj, R> {
    // SAFETY: event handles are ours (checked by magic).
    unsafe { obj(e as *const EventObj, EVENT_MAGIC) }.ok_or(E::CUDA_ERROR_INVALID_HANDLE)
}

fn record(e: CUevent, h: CUstream, ptsz: bool) -> Res {
    let ev = event_of(e)?;
    let t = stream_target(h, ptsz)?;
    if t.dev != ev.dev {
        return Err(E::CUDA_ERROR_INVALID_HANDLE);
    }
    if let Some(s) = t.obj {
        if s.capturing.load(Acquire) {
            // Recorded into the graph: a no-op for timing in the simulator.
            return Ok(());
        }
    }
    driver()?
        .node
        .event_record(ev.dev, ev.idx, t.local)
        .map_err(sim_err)
}

fn elapsed(ms: *mut f32, a: CUevent, b: CUevent) -> Res {
    let d = driver()?;
    let (ea, eb) = (event_of(a)?, event_of(b)?);
    const DISABLE_TIMING: u32 = 0x2;
    if ea.flags & DISABLE_TIMING != 0 || eb.flags & DISABLE_TIMING != 0 {
        return Err(E::CUDA_ERROR_INVALID_HANDLE);
    }
    let sa = d.node.event_status(ea.dev, ea.idx).map_err(sim_err)?;
    let sb = d.node.event_status(eb.dev, eb.idx).map_err(sim_err)?;
    match (sa, sb) {
        (EventStatus::Done(x), EventStatus::Done(y)) => out(ms, (y as f64 - x as f64) as f32 / 1e6),
        (EventStatus::NeverRecorded, _) | (_, EventStatus::NeverRecorded) => {
            Err(E::CUDA_ERROR_INVALID_HANDLE)
        }
        _ => Err(E::CUDA_ERROR_NOT_READY),
    }
}

fn stream_wait(h: CUstream, e: CUevent, ptsz: bool) -> Res {
    let ev = event_of(e)?;
    let t = stream_target(h, ptsz)?;
    let d = driver()?;
    if t.dev != ev.dev {
        // Cross-device dependency: wait for the event on the host, which orders it too.
        d.node.event_sync(ev.dev, ev.idx).map_err(sim_err)?;
        return Ok(());
    }
    d.node
        .stream_wait_event(t.dev, t.local, ev.idx)
        .map_err(sim_err)
}

// ---------------------------------------------------------------------------------------------
// Stream capture.

fn begin_capture(h: CUstream) -> Res {
    let t = stream_target(h, false)?;
    let s = t.obj.ok_or(E::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)?;
    if s.capturing.swap(true, AcqRel) {
        return Err(E::CUDA_ERROR_ILLEGAL_STATE);
    }
    s.captured.lock().unwrap_or_else(|e| e.into_inner()).clear();
    Ok(())
}

fn end_capture(h: CUstream, g: *mut CUgraph) -> Res {
    let t = stream_target(h, false)?;
    let s = t.obj.ok_or(E::CUDA_ERROR_ILLEGAL_STATE)?;
    if !s.capturing.swap(false, AcqRel) {
        return Err(E::CUDA_ERROR_ILLEGAL_STATE);
    }
    let kernels = std::mem::take(&mut *s.captured.lock().unwrap_or_else(|e| e.into_inner()));
    let graph = Box::leak(Box::new(Graph {
        magic: AtomicU64::new(GRAPH_MAGIC),
        kernels,
        allocs: Mutex::new(Vec::new()),
    }));
    out(g, graph as *const Graph as CUgraph)
}

fn is_capturing(h: CUstream, status: *mut c_uint, ptsz: bool) -> Res {
    let t = stream_target(h, ptsz)?;
    let on = t.obj.map(|s| s.capturing.load(Acquire)).unwrap_or(false);
    out(status, on as c_uint)
}

fn instantiate(exec: *mut CUgraphExec, g: CUgraph) -> Res {
    // SAFETY: graph handles are ours (checked by magic).
    let graph =
        unsafe { obj(g as *const Graph, GRAPH_MAGIC) }.ok_or(E::CUDA_ERROR_INVALID_HANDLE)?;
    let e = Box::leak(Box::new(GraphExec {
        magic: AtomicU64::new(EXEC_MAGIC),
        total_ns: graph.kernels.iter().sum(),
        kernels: graph.kernels.len(),
        allocs: graph
            .allocs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone(),
        backed: AtomicBool::new(false),
    }));
    out(exec, e as *const GraphExec as CUgraphExec)
}

// ---------------------------------------------------------------------------------------------
// Device attributes (H100-like values; unknown attributes in range answer 0).

fn attribute(info: &smore_simgpu::DeviceInfo, attr: c_int) -> Option<c_int> {
    Some(match attr {
        1 => 1024,
        2 | 3 => 1024,
        4 => 64,
        5 => 2_147_483_647,
        6 | 7 => 65535,
        8 => 49152,
        9 => 65536,
        10 => 32,
        11 => 2_147_483_647,
        12 => 65536,
        13 => 1_980_000,
        14 => 512,
        15 => 1,
        16 => info.sm_count as c_int,
        19 | 31 | 32 | 41 | 83 | 89 | 95 | 102 | 115 => 1,
        33 => 0x18 + info.index as c_int,
        36 => 2_619_000,
        37 => 5120,
        38 => 52_428_800,
        39 => 2048,
        40 => 3,
        75 => 9,
        76 => 0,
        81 => 233_472,
        82 => 65536,
        97 => 232_448,
        106 => 32,
        a if (1..=150).contains(&a) => 0,
        _ => return None,
    })
}

fn write_str(dst: *mut c_char, len: c_int, s: &str) -> Res {
    if dst.is_null() || len <= 0 {
        return Err(E::CUDA_ERROR_INVALID_VALUE);
    }
    let n = s.len().min(len as usize - 1);
    // SAFETY: dst has room for `len` bytes per the caller's contract; we write n + 1 ≤ len.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), dst as *mut u8, n);
        *dst.add(n) = 0;
    }
    Ok(())
}

api! {
    fn cuInit(flags: c_uint) {
        if flags != 0 {
            return Err(E::CUDA_ERROR_INVALID_VALUE);
        }
        init().map(|_| ())
    }

    fn cuDriverGetVersion(v: *mut c_int) {
        // Works before cuInit, as in the real driver.
        let ver = smore_simgpu::config::DRIVER_VERSION as c_int;
        out(v, ver)
    }

    fn cuGetErrorName(code: c_uint, s: *mut *const c_char) {
        let (name, _) = crate::procaddr::error_text(code).ok_or(E::CUDA_ERROR_INVALID_VALUE)?;
        out(s, name.as_ptr())
    }

    fn cuGetErrorString(code: c_uint, s: *mut *const c_char) {
        let (_, text) = crate::procaddr::error_text(code).ok_or(E::CUDA_ERROR_INVALID_VALUE)?;
        out(s, text.as_ptr())
    }

    fn cuDeviceGetCount(n: *mut c_int) {
        out(n, driver()?.visible.len() as c_int)
    }

    fn cuDeviceGet(dev: *mut CUdevice, ordinal: c_int) {
        let d = driver()?;
        dev_ok(d, ordinal)?;
        out(dev, ordinal as CUdevice)
    }

    fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) {
        let d = driver()?;
        let info = d.node.device_info(dev_ok(d, dev)?).map_err(sim_err)?;
        write_str(name, len, &info.name)
    }

    fn cuDeviceGetUuid(uuid: *mut CUuuid, dev: CUdevice) {
        let d = driver()?;
        let info = d.node.device_info(dev_ok(d, dev)?).map_err(sim_err)?;
        out(uuid, CUuuid { bytes: info.uuid.map(|b| b as c_char) })
    }

    fn cuDeviceGetUuid_v2(uuid: *mut CUuuid, dev: CUdevice) {
        ok(cuDeviceGetUuid(uuid, dev))
    }

    fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) {
        let d = driver()?;
        let info = d.node.device_info(dev_ok(d, dev)?).map_err(sim_err)?;
        out(bytes, info.total_mem as usize)
    }

    fn cuDeviceTotalMem(bytes: *mut c_uint, dev: CUdevice) {
        let d = driver()?;
        let info = d.node.device_info(dev_ok(d, dev)?).map_err(sim_err)?;
        out(bytes, info.total_mem.min(u32::MAX as u64) as c_uint)
    }

    fn cuDeviceGetAttribute(v: *mut c_int, attr: c_int, dev: CUdevice) {
        let d = driver()?;
        let info = d.node.device_info(dev_ok(d, dev)?).map_err(sim_err)?;
        out(v, attribute(&info, attr).ok_or(E::CUDA_ERROR_INVALID_VALUE)?)
    }

    fn cuDeviceComputeCapability(major: *mut c_int, minor: *mut c_int, dev: CUdevice) {
        let d = driver()?;
        dev_ok(d, dev)?;
        out(major, 9)?;
        out(minor, 0)
    }

    fn cuDeviceGetPCIBusId(bus: *mut c_char, len: c_int, dev: CUdevice) {
        let d = driver()?;
        let dev = dev_ok(d, dev)?;
        write_str(bus, len, &format!("0000:{:02X}:00.0", 0x18 + dev))
    }

    fn cuDeviceCanAccessPeer(can: *mut c_int, dev: CUdevice, peer: CUdevice) {
        let d = driver()?;
        dev_ok(d, dev)?;
        dev_ok(d, peer)?;
        out(can, (dev != peer) as c_int)
    }

    fn cuDeviceGetDefaultMemPool(pool: *mut CUmemoryPool, dev: CUdevice) {
        let d = driver()?;
        let dev = dev_ok(d, dev)?;
        out(pool, default_pool(d, dev) as *const Pool as CUmemoryPool)
    }

    fn cuDeviceGetMemPool(pool: *mut CUmemoryPool, dev: CUdevice) {
        ok(cuDeviceGetDefaultMemPool(pool, dev))
    }

    // ----- primary context -----

    fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) {
        let d = driver()?;
        let dev = dev_ok(d, dev)?;
        let existing = {
            let t = d.tables();
            t.primary[dev as usize]
        };
        let ctx = if existing != 0 {
            existing
        } else {
            let flags = d.tables().primary_flags[dev as usize];
            let c = make_ctx(d, dev, true, flags)? as *const Ctx as usize;
            d.tables().primary[dev as usize] = c;
            c
        };
        d.tables().primary_refs[dev as usize] += 1;
        out(pctx, ctx as CUcontext)
    }

    fn cuDevicePrimaryCtxRelease(dev: CUdevice) { primary_release(dev) }
    fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) { primary_release(dev) }

    fn cuDevicePrimaryCtxReset(dev: CUdevice) { ok(cuDevicePrimaryCtxReset_v2(dev)) }
    fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) {
        let d = driver()?;
        let dev = dev_ok(d, dev)?;
        let ctx = {
            let mut t = d.tables();
            t.primary_refs[dev as usize] = 0;
            std::mem::take(&mut t.primary[dev as usize])
        };
        if ctx != 0 {
            // SAFETY: primary contexts are leaked Ctx boxes.
            destroy_ctx(d, &*(ctx as *const Ctx));
        }
        Ok(())
    }

    fn cuDevicePrimaryCtxGetState(dev: CUdevice, flags: *mut c_uint, active: *mut c_int) {
        let d = driver()?;
        let dev = dev_ok(d, dev)?;
        let t = d.tables();
        out(flags, t.primary_flags[dev as usize])?;
        out(active, (t.primary[dev as usize] != 0) as c_int)
    }

    fn cuDevicePrimaryCtxSetFlags(dev: CUdevice, flags: c_uint) { ok(cuDevicePrimaryCtxSetFlags_v2(dev, flags)) }
    fn cuDevicePrimaryCtxSetFlags_v2(dev: CUdevice, flags: c_uint) {
        let d = driver()?;
        let dev = dev_ok(d, dev)?;
        d.tables().primary_flags[dev as usize] = flags;
        Ok(())
    }

    // ----- contexts -----

    fn cuCtxCreate(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) { create_ctx(pctx, flags, dev) }
    fn cuCtxCreate_v2(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) { create_ctx(pctx, flags, dev) }
    fn cuCtxCreate_v3(pctx: *mut CUcontext, _params: *mut c_void, _n: c_int, flags: c_uint, dev: CUdevice) {
        create_ctx(pctx, flags, dev)
    }
    fn cuCtxCreate_v4(pctx: *mut CUcontext, _params: *mut c_void, flags: c_uint, dev: CUdevice) {
        create_ctx(pctx, flags, dev)
    }

    fn cuCtxDestroy(ctx: CUcontext) { ok(cuCtxDestroy_v2(ctx)) }
    fn cuCtxDestroy_v2(ctx: CUcontext) {
        let d = driver()?;
        let c = obj(ctx as *const Ctx, CTX_MAGIC).ok_or(E::CUDA_ERROR_INVALID_CONTEXT)?;
        if c.primary {
            return Err(E::CUDA_ERROR_INVALID_CONTEXT);
        }
        CTX_STACK.with(|s| s.borrow_mut().retain(|&p| p != ctx as usize));
        destroy_ctx(d, c);
        Ok(())
    }

    fn cuCtxGetCurrent(pctx: *mut CUcontext) {
        driver()?;
        out(pctx, current_ctx().map(|c| c as *const Ctx as CUcontext).unwrap_or(std::ptr::null_mut()))
    }

    fn cuCtxSetCurrent(ctx: CUcontext) {
        driver()?;
        if !ctx.is_null() {
            obj(ctx as *const Ctx, CTX_MAGIC).ok_or(E::CUDA_ERROR_INVALID_CONTEXT)?;
        }
        set_current(ctx as usize);
        Ok(())
    }

    fn cuCtxPushCurrent(ctx: CUcontext) { ok(cuCtxPushCurrent_v2(ctx)) }
    fn cuCtxPushCurrent_v2(ctx: CUcontext) {
        driver()?;
        obj(ctx as *const Ctx, CTX_MAGIC).ok_or(E::CUDA_ERROR_INVALID_CONTEXT)?;
        CTX_STACK.with(|s| s.borrow_mut().push(ctx as usize));
        Ok(())
    }

    fn cuCtxPopCurrent(pctx: *mut CUcontext) { ok(cuCtxPopCurrent_v2(pctx)) }
    fn cuCtxPopCurrent_v2(pctx: *mut CUcontext) {
        driver()?;
        let top = CTX_STACK.with(|s| s.borrow_mut().pop()).ok_or(E::CUDA_ERROR_INVALID_CONTEXT)?;
        if !pctx.is_null() {
            *pctx = top as CUcontext;
        }
        Ok(())
    }

    fn cuCtxGetDevice(dev: *mut CUdevice) {
        let d = driver()?;
        out(dev, ordinal_of(d, ctx_ok()?.dev))
    }

    fn cuCtxGetFlags(flags: *mut c_uint) {
        out(flags, ctx_ok()?.flags.load(Relaxed))
    }

    fn cuCtxGetApiVersion(ctx: CUcontext, v: *mut c_uint) {
        driver()?;
        if !ctx.is_null() {
            obj(ctx as *const Ctx, CTX_MAGIC).ok_or(E::CUDA_ERROR_INVALID_CONTEXT)?;
        }
        out(v, 3020)
    }

    fn cuCtxGetStreamPriorityRange(least: *mut c_int, greatest: *mut c_int) {
        ctx_ok()?;
        if !least.is_null() { *least = 0; }
        if !greatest.is_null() { *greatest = -5; }
        Ok(())
    }

    fn cuCtxSynchronize() {
        let c = ctx_ok()?;
        driver()?.node.device_sync(c.dev).map_err(sim_err)
    }

    // ----- modules and functions -----

    fn cuModuleLoadData(m: *mut CUmodule, image: *const c_void) { load_module(m, image) }
    fn cuModuleLoadDataEx(m: *mut CUmodule, image: *const c_void, _n: c_uint, _o: *mut c_void, _v: *mut *mut c_void) {
        load_module(m, image)
    }
    fn cuModuleLoad(m: *mut CUmodule, fname: *const c_char) {
        if fname.is_null() {
            return Err(E::CUDA_ERROR_INVALID_VALUE);
        }
        let path = CStr::from_ptr(fname).to_string_lossy().into_owned();
        let mut bytes = std::fs::read(&path).map_err(|_| E::CUDA_ERROR_FILE_NOT_FOUND)?;
        bytes.push(0);
        load_module(m, bytes.as_ptr() as *const c_void)
    }

    fn cuModuleUnload(m: CUmodule) {
        let module = obj(m as *const Module, MODULE_MAGIC).ok_or(E::CUDA_ERROR_INVALID_HANDLE)?;
        module.magic.store(0, Release);
        Ok(())
    }

    fn cuModuleGetFunction(f: *mut CUfunction, m: CUmodule, name: *const c_char) {
        let d = driver()?;
        let module = obj(m as *const Module, MODULE_MAGIC).ok_or(E::CUDA_ERROR_INVALID_HANDLE)?;
        if name.is_null() {
            return Err(E::CUDA_ERROR_INVALID_VALUE);
        }
        let name = CStr::from_ptr(name).to_string_lossy().into_owned();
        let mut fns = module.functions.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&p) = fns.get(&name) {
            return out(f, p as CUfunction);
        }
        let spin = name == "smore_sim_spin";
        let dur_ns = if module.kernels.is_empty() {
            d.node.default_kernel_ns()
        } else if spin {
            0
        } else {
            *module.kernels.get(&name).ok_or(E::CUDA_ERROR_NOT_FOUND)?
        };
        let func = Box::leak(Box::new(Function { magic: AtomicU64::new(FUNC_MAGIC), dur_ns, spin })) as *const Function as usize;
        fns.insert(name, func);
        out(f, func as CUfunction)
    }

    fn cuFuncGetAttribute(v: *mut c_int, attr: c_int, f: CUfunction) {
        obj(f as *const Function, FUNC_MAGIC).ok_or(E::CUDA_ERROR_INVALID_HANDLE)?;
        // CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 0; everything else reads as 0 here.
        out(v, if attr == 0 { 1024 } else { 0 })
    }

    fn cuFuncSetAttribute(f: CUfunction, _attr: c_int, _value: c_int) {
        obj(f as *const Function, FUNC_MAGIC).ok_or(E::CUDA_ERROR_INVALID_HANDLE)?;
        Ok(())
    }

    // ----- streams -----

    fn cuStreamCreate(ph: *mut CUstream, flags: c_uint) {
        ok(cuStreamCreateWithPriority(ph, flags, 0))
    }

    fn cuStreamCreateWithPriority(ph: *mut CUstream, flags: c_uint, priority: c_int) {
        let c = ctx_ok()?;
        let priority = priority.clamp(-5, 0);
        let local = driver()?.node.stream_create(c.dev, priority).map_err(sim_err)?;
        let s = Box::leak(Box::new(StreamObj {
            magic: AtomicU64::new(STREAM_MAGIC),
            dev: c.dev,
            local,
            flags,
            priority,
            ctx: c as *const Ctx as *mut Ctx,
            capturing: AtomicBool::new(false),
            captured: Mutex::new(Vec::new()),
        }));
        out(ph, s as *const StreamObj as CUstream)
    }

    fn cuStreamDestroy(h: CUstream) { ok(cuStreamDestroy_v2(h)) }
    fn cuStreamDestroy_v2(h: CUstream) {
        let s = obj(h as *const StreamObj, STREAM_MAGIC).ok_or(E::CUDA_ERROR_INVALID_HANDLE)?;
        s.magic.store(0, Release);
        driver()?.node.stream_destroy(s.dev, s.local).map_err(sim_err)
    }

    fn cuStreamSynchronize(h: CUstream) {
        let t = stream_target(h, false)?;
        driver()?.node.stream_sync(t.dev, t.local).map_err(sim_err)
    }
    fn cuStreamSynchronize_ptsz(h: CUstream) {
        let t = stream_target(h, true)?;
        driver()?.node.stream_sync(t.dev, t.local).map_err(sim_err)
    }

    fn cuStreamQuery(h: CUstream) {
        let t = stream_target(h, false)?;
        if driver()?.node.stream_idle(t.dev, t.local).map_err(sim_err)? { Ok(()) } else { Err(E::CUDA_ERROR_NOT_READY) }
    }
    fn cuStreamQuery_ptsz(h: CUstream) {
        let t = stream_target(h, true)?;
        if driver()?.node.stream_idle(t.dev, t.local).map_err(sim_err)? { Ok(()) } else { Err(E::CUDA_ERROR_NOT_READY) }
    }

    fn cuStreamWaitEvent(h: CUstream, e: CUevent, _flags: c_uint) { stream_wait(h, e, false) }
    fn cuStreamWaitEvent_ptsz(h: CUstream, e: CUevent, _flags: c_uint) { stream_wait(h, e, true) }

    fn cuStreamGetPriority(h: CUstream, p: *mut c_int) {
        let t = stream_target(h, false)?;
        out(p, t.obj.map(|s| s.priority).unwrap_or(0))
    }
    fn cuStreamGetPriority_ptsz(h: CUstream, p: *mut c_int) {
        let t = stream_target(h, true)?;
        out(p, t.obj.map(|s| s.priority).unwrap_or(0))
    }

    fn cuStreamGetFlags(h: CUstream, f: *mut c_uint) {
        let t = stream_target(h, false)?;
        out(f, t.obj.map(|s| s.flags).unwrap_or(0))
    }
    fn cuStreamGetFlags_ptsz(h: CUstream, f: *mut c_uint) {
        let t = stream_target(h, true)?;
        out(f, t.obj.map(|s| s.flags).unwrap_or(0))
    }

    fn cuStreamGetCtx(h: CUstream, pctx: *mut CUcontext) {
        let t = stream_target(h, false)?;
        let c = match t.obj { Some(s) => s.ctx, None => ctx_ok()? as *const Ctx as *mut Ctx };
        out(pctx, c as CUcontext)
    }
    fn cuStreamGetCtx_ptsz(h: CUstream, pctx: *mut CUcontext) {
        let t = stream_target(h, true)?;
        let c = match t.obj { Some(s) => s.ctx, None => ctx_ok()? as *const Ctx as *mut Ctx };
        out(pctx, c as CUcontext)
    }

    fn cuStreamBeginCapture(h: CUstream) { begin_capture(h) }
    fn cuStreamBeginCapture_ptsz(h: CUstream) { begin_capture(h) }
    fn cuStreamBeginCapture_v2(h: CUstream, _mode: c_uint) { begin_capture(h) }
    fn cuStreamBeginCapture_v2_ptsz(h: CUstream, _mode: c_uint) { begin_capture(h) }
    fn cuStreamEndCapture(h: CUstream, g: *mut CUgraph) { end_capture(h, g) }
    fn cuStreamEndCapture_ptsz(h: CUstream, g: *mut CUgraph) { end_capture(h, g) }
    fn cuStreamIsCapturing(h: CUstream, st: *mut c_uint) { is_capturing(h, st, false) }
    fn cuStreamIsCapturing_ptsz(h: CUstream, st: *mut c_uint) { is_capturing(h, st, true) }

    // ----- events -----

    fn cuEventCreate(pe: *mut CUevent, flags: c_uint) {
        let c = ctx_ok()?;
        let idx = driver()?.node.event_create(c.dev).map_err(sim_err)?;
        let e = Box::leak(Box::new(EventObj { magic: AtomicU64::new(EVENT_MAGIC), dev: c.dev, idx, flags }));
        out(pe, e as *const EventObj as CUevent)
    }

    fn cuEventDestroy(e: CUevent) { ok(cuEventDestroy_v2(e)) }
    fn cuEventDestroy_v2(e: CUevent) {
        let ev = event_of(e)?;
        ev.magic.store(0, Release);
        driver()?.node.event_destroy(ev.dev, ev.idx).map_err(sim_err)
    }

    fn cuEventRecord(e: CUevent, h: CUstream) { record(e, h, false) }
    fn cuEventRecord_ptsz(e: CUevent, h: CUstream) { record(e, h, true) }
    fn cuEventRecordWithFlags(e: CUevent, h: CUstream, _f: c_uint) { record(e, h, false) }
    fn cuEventRecordWithFlags_ptsz(e: CUevent, h: CUstream, _f: c_uint) { record(e, h, true) }

    fn cuEventQuery(e: CUevent) {
        let ev = event_of(e)?;
        match driver()?.node.event_status(ev.dev, ev.idx).map_err(sim_err)? {
            EventStatus::Pending => Err(E::CUDA_ERROR_NOT_READY),
            _ => Ok(()),
        }
    }

    fn cuEventSynchronize(e: CUevent) {
        let ev = event_of(e)?;
        driver()?.node.event_sync(ev.dev, ev.idx).map_err(sim_err).map(|_| ())
    }

    fn cuEventElapsedTime(ms: *mut f32, a: CUevent, b: CUevent) { elapsed(ms, a, b) }
    fn cuEventElapsedTime_v2(ms: *mut f32, a: CUevent, b: CUevent) { elapsed(ms, a, b) }

    // ----- memory: plain, pitched, managed, host -----

    fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytes: usize) {
        if dptr.is_null() { return Err(E::CUDA_ERROR_INVALID_VALUE); }
        let (_, va) = alloc_device(bytes as u64)?;
        out(dptr, va)
    }

    fn cuMemAlloc(dptr: *mut c_uint, bytes: c_uint) {
        if dptr.is_null() || bytes == 0 { return Err(E::CUDA_ERROR_INVALID_VALUE); }
        let d = driver()?;
        let ctx = ctx_ok()?;
        d.charge(ctx.dev, bytes as u64)?;
        let Some(va) = new_va32(bytes as u64) else {
            d.node.credit(ctx.dev, bytes as u64);
            return Err(E::CUDA_ERROR_OUT_OF_MEMORY);
        };
        d.tables().allocs.insert(va as u64, Alloc { dev: ctx.dev, size: bytes as u64, kind: AllocKind::Device });
        out(dptr, va)
    }

    fn cuMemAllocPitch_v2(dptr: *mut CUdeviceptr, pitch: *mut usize, width: usize, height: usize, elem: c_uint) {
        if dptr.is_null() || pitch.is_null() || !matches!(elem, 4 | 8 | 16) || width == 0 || height == 0 {
            return Err(E::CUDA_ERROR_INVALID_VALUE);
        }
        // Rows are padded to 512 bytes, the texture pitch alignment of recent GPUs.
        let p = width.div_ceil(512) * 512;
        let (_, va) = alloc_device((p * height) as u64)?;
        out(pitch, p)?;
        out(dptr, va)
    }

    fn cuMemAllocPitch(dptr: *mut c_uint, pitch: *mut c_uint, width: c_uint, height: c_uint, elem: c_uint) {
        if dptr.is_null() || pitch.is_null() || !matches!(elem, 4 | 8 | 16) || width == 0 || height == 0 {
            return Err(E::CUDA_ERROR_INVALID_VALUE);
        }
        let p = (width as u64).div_ceil(512) * 512;
        let bytes = p * height as u64;
        let d = driver()?;
        let ctx = ctx_ok()?;
        d.charge(ctx.dev, bytes)?;
        let Some(va) = new_va32(bytes) else {
            d.node.credit(ctx.dev, bytes);
            return Err(E::CUDA_ERROR_OUT_OF_MEMORY);
        };
        d.tables().allocs.insert(va as u64, Alloc { dev: ctx.dev, size: bytes, kind: AllocKind::Device });
        out(pitch, p as c_uint)?;
        out(dptr, va)
    }

    fn cuMemAllocManaged(dptr: *mut CUdeviceptr, bytes: usize, flags: c_uint) {
        // CU_MEM_ATTACH_GLOBAL = 1, CU_MEM_ATTACH_HOST = 2.
        if dptr.is_null() || bytes == 0 || !matches!(flags, 1 | 2) {
            return Err(E::CUDA_ERROR_INVALID_VALUE);
        }
        let d = driver()?;
        let ctx = ctx_ok()?;
        // Charged to the device up front (conservative: the real driver populates on touch).
        d.charge(ctx.dev, bytes as u64)?;
        let host = libc::mmap(std::ptr::null_mut(), bytes, libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE, -1, 0);
        if host == libc::MAP_FAILED {
            d.node.credit(ctx.dev, bytes as u64);
            return Err(E::CUDA_ERROR_OUT_OF_MEMORY);
        }
        let va = host as u64;
        d.tables().allocs.insert(va, Alloc { dev: ctx.dev, size: bytes as u64, kind: AllocKind::Managed { host: host as usize } });
        out(dptr, va)
    }

    fn cuMemFree_v2(ptr: CUdeviceptr) { free_device(ptr) }
    fn cuMemFree(ptr: c_uint) { free_device(ptr as u64) }

    fn cuMemAllocHost_v2(pp: *mut *mut c_void, bytes: usize) {
        driver()?;
        if pp.is_null() || bytes == 0 { return Err(E::CUDA_ERROR_INVALID_VALUE); }
        let p = libc::malloc(bytes);
        if p.is_null() { return Err(E::CUDA_ERROR_OUT_OF_MEMORY); }
        out(pp, p)
    }

    fn cuMemFreeHost(p: *mut c_void) {
        driver()?;
        libc::free(p);
        Ok(())
    }

    fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) {
        if free.is_null() || total.is_null() { return Err(E::CUDA_ERROR_INVALID_VALUE); }
        let (mut f, mut t) = (0, 0);
        info(&mut f, &mut t)?;
        *free = f as usize;
        *total = t as usize;
        Ok(())
    }

    fn cuMemGetInfo(free: *mut c_uint, total: *mut c_uint) {
        if free.is_null() || total.is_null() { return Err(E::CUDA_ERROR_INVALID_VALUE); }
        let (mut f, mut t) = (0, 0);
        info(&mut f, &mut t)?;
        *free = f.min(u32::MAX as u64) as c_uint;
        *total = t.min(u32::MAX as u64) as c_uint;
        Ok(())
    }

    fn cuMemGetAddressRange_v2(base: *mut CUdeviceptr, size: *mut usize, ptr: CUdeviceptr) {
        let d = driver()?;
        let t = d.tables();
        let (b, a) = t.allocs.iter().find(|(b, a)| ptr >= **b && ptr < **b + a.size).ok_or(E::CUDA_ERROR_NOT_FOUND)?;
        if !base.is_null() { *base = *b; }
        if !size.is_null() { *size = a.size as usize; }
        Ok(())
    }

    // ----- stream-ordered allocation and pools -----

    fn cuMemAllocAsync(dptr: *mut CUdeviceptr, bytes: usize, h: CUstream) {
        if dptr.is_null() || bytes == 0 { return Err(E::CUDA_ERROR_INVALID_VALUE); }
        let t = stream_target(h, false)?;
        let d = driver()?;
        let va = pool_alloc(d, default_pool(d, t.dev), bytes as u64)?;
        out(dptr, va)
    }
    fn cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, bytes: usize, h: CUstream) {
        if dptr.is_null() || bytes == 0 { return Err(E::CUDA_ERROR_INVALID_VALUE); }
        let t = stream_target(h, true)?;
        let d = driver()?;
        let va = pool_alloc(d, default_pool(d, t.dev), bytes as u64)?;
        out(dptr, va)
    }

    fn cuMemAllocFromPoolAsync(dptr: *mut CUdeviceptr, bytes: usize, pool: CUmemoryPool, h: CUstream) {
        if dptr.is_null() || bytes == 0 { return Err(E::CUDA_ERROR_INVALID_VALUE); }
        let p = obj(pool as *const Pool, POOL_MAGIC).ok_or(E::CUDA_ERROR_INVALID_HANDLE)?;
        stream_target(h, false)?;
        let va = pool_alloc(driver()?, p, bytes as u64)?;
        out(dptr, va)
    }
    fn cuMemAllocFromPoolAsync_ptsz(dptr: *mut CUdeviceptr, bytes: usize, pool: CUmemoryPool, h: CUstream) {
        if dptr.is_null() || bytes == 0 { return Err(E::CUDA_ERROR_INVALID_VALUE); }
        let p = obj(pool as *const Pool, POOL_MAGIC).ok_or(E::CUDA_ERROR_INVALID_HANDLE)?;
        stream_target(h, true)?;
        let va = pool_alloc(driver()?, p, bytes as u64)?;
        out(dptr, va)
    }

    fn cuMemFreeAsync(ptr: CUdeviceptr, h: CUstream) {
        stream_target(h, false)?;
        free_device(ptr)
    }
    fn cuMemFreeAsync_ptsz(ptr: CUdeviceptr, h: CUstream) {
        stream_target(h, true)?;
        free_device(ptr)
    }

    fn cuMemPoolCreate(pool: *mut CUmemoryPool, props: *const c_void) {
        let d = driver()?;
        if props.is_null() { return Err(E::CUDA_ERROR_INVALID_VALUE); }
        // CUmemPoolProps: allocType u32 @0, handleTypes u32 @4, location {type u32 @8, id i32 @12}.
        let id = *(props as *const u8).add(12).cast::<c_int>();
        let dev = dev_ok(d, id)?;
        let p = Box::leak(Box::new(new_pool(dev)));
        out(pool, p as *const Pool as CUmemoryPool)
    }

    fn cuMemPoolDestroy(pool: CUmemoryPool) {
        let d = driver()?;
        let p = obj(pool as *const Pool, POOL_MAGIC).ok_or(E::CUDA_ERROR_INVALID_HANDLE)?;
        trim_pool(d, p, 0);
        p.magic.store(0, Release);
        Ok(())
    }

    fn cuMemPoolSetAttribute(pool: CUmemoryPool, attr: c_int, value: *mut c_void) {
        let d = driver()?;
        let p = obj(pool as *const Pool, POOL_MAGIC).ok_or(E::CUDA_ERROR_INVALID_HANDLE)?;
        if value.is_null() { return Err(E::CUDA_ERROR_INVALID_VALUE); }
        match attr {
            1..=3 => Ok(()),
            4 => {
                p.release_threshold.store(*(value as *const u64), Release);
                trim_pool(d, p, *(value as *const u64));
                Ok(())
            }
            6 => { p.reserved_high.store(p.reserved.load(Acquire), Release); Ok(()) }
            8 => { p.used_high.store(p.used.load(Acquire), Release); Ok(()) }
            _ => Err(E::CUDA_ERROR_INVALID_VALUE),
        }
    }

    fn cuMemPoolGetAttribute(pool: CUmemoryPool, attr: c_int, value: *mut c_void) {
        driver()?;
        let p = obj(pool as *const Pool, POOL_MAGIC).ok_or(E::CUDA_ERROR_INVALID_HANDLE)?;
        if value.is_null() { return Err(E::CUDA_ERROR_INVALID_VALUE); }
        let v = match attr {
            1..=3 => { *(value as *mut c_int) = 1; return Ok(()); }
            4 => p.release_threshold.load(Acquire),
            5 => p.reserved.load(Acquire),
            6 => p.reserved_high.load(Acquire),
            7 => p.used.load(Acquire),
            8 => p.used_high.load(Acquire),
            _ => return Err(E::CUDA_ERROR_INVALID_VALUE),
        };
        *(value as *mut u64) = v;
        Ok(())
    }

    fn cuMemPoolTrimTo(pool: CUmemoryPool, keep: usize) {
        let d = driver()?;
        let p = obj(pool as *const Pool, POOL_MAGIC).ok_or(E::CUDA_ERROR_INVALID_HANDLE)?;
        trim_pool(d, p, keep as u64);
        Ok(())
    }

    // ----- virtual memory management -----

    fn cuMemGetAllocationGranularity(g: *mut usize, prop: *const c_void, _option: c_int) {
        driver()?;
        if prop.is_null() { return Err(E::CUDA_ERROR_INVALID_VALUE); }
        out(g, 2 << 20)
    }

    fn cuMemCreate(handle: *mut u64, size: usize, prop: *const c_void, flags: u64) {
        let d = driver()?;
        if handle.is_null() || prop.is_null() || flags != 0 || size == 0 || !size.is_multiple_of(2 << 20) {
            return Err(E::CUDA_ERROR_INVALID_VALUE);
        }
        // CUmemAllocationProp: type u32 @0, requestedHandleTypes u32 @4, location {type @8, id @12}.
        let id = *(prop as *const u8).add(12).cast::<c_int>();
        let dev = dev_ok(d, id)?;
        d.charge(dev, size as u64)?;
        let mut t = d.tables();
        t.next_vmm += 1;
        let h = 0x5000_0000_0000 + t.next_vmm;
        t.vmm.insert(h, VmmHandle { dev, size: size as u64, maps: 0, refs: 1 });
        out(handle, h)
    }

    fn cuMemRelease(handle: u64) {
        let d = driver()?;
        let mut t = d.tables();
        let h = t.vmm.get_mut(&handle).ok_or(E::CUDA_ERROR_INVALID_VALUE)?;
        if h.refs == 0 { return Err(E::CUDA_ERROR_INVALID_VALUE); }
        h.refs -= 1;
        // Physical memory goes back once every reference is released and nothing maps it.
        if h.refs == 0 && h.maps == 0 {
            let h = t.vmm.remove(&handle).expect("present");
            drop(t);
            d.node.credit(h.dev, h.size);
        }
        Ok(())
    }

    fn cuMemAddressReserve(ptr: *mut CUdeviceptr, size: usize, _align: usize, _addr: CUdeviceptr, _flags: u64) {
        let d = driver()?;
        if size == 0 || !size.is_multiple_of(2 << 20) { return Err(E::CUDA_ERROR_INVALID_VALUE); }
        let va = new_va(size as u64);
        d.tables().reservations.insert(va, size as u64);
        out(ptr, va)
    }

    fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) {
        let d = driver()?;
        let mut t = d.tables();
        match t.reservations.get(&ptr) {
            Some(&s) if s == size as u64 => { t.reservations.remove(&ptr); Ok(()) }
            _ => Err(E::CUDA_ERROR_INVALID_VALUE),
        }
    }

    fn cuMemMap(ptr: CUdeviceptr, size: usize, offset: usize, handle: u64, flags: u64) {
        let d = driver()?;
        if flags != 0 || offset != 0 { return Err(E::CUDA_ERROR_INVALID_VALUE); }
        let mut t = d.tables();
        let inside = t.reservations.iter().any(|(&b, &s)| ptr >= b && ptr + size as u64 <= b + s);
        if !inside || t.mappings.contains_key(&ptr) { return Err(E::CUDA_ERROR_INVALID_VALUE); }
        let h = t.vmm.get_mut(&handle).ok_or(E::CUDA_ERROR_INVALID_HANDLE)?;
        if h.refs == 0 || size as u64 > h.size { return Err(E::CUDA_ERROR_INVALID_VALUE); }
        h.maps += 1;
        t.mappings.insert(ptr, (handle, size as u64));
        Ok(())
    }

    fn cuMemUnmap(ptr: CUdeviceptr, size: usize) {
        let d = driver()?;
        let mut t = d.tables();
        let (handle, s) = t.mappings.remove(&ptr).ok_or(E::CUDA_ERROR_INVALID_VALUE)?;
        if s != size as u64 {
            t.mappings.insert(ptr, (handle, s));
            return Err(E::CUDA_ERROR_INVALID_VALUE);
        }
        let mut freed = None;
        if let Some(h) = t.vmm.get_mut(&handle) {
            h.maps -= 1;
            if h.maps == 0 && h.refs == 0 {
                freed = t.vmm.remove(&handle).map(|h| (h.dev, h.size));
            }
        }
        drop(t);
        if let Some((dev, size)) = freed { d.node.credit(dev, size); }
        Ok(())
    }

    fn cuMemRetainAllocationHandle(handle: *mut u64, addr: *mut c_void) {
        let d = driver()?;
        if handle.is_null() { return Err(E::CUDA_ERROR_INVALID_VALUE); }
        let mut t = d.tables();
        let va = addr as u64;
        let h = t.mappings.iter()
            .find(|(&b, &(_, s))| va >= b && va < b + s)
            .map(|(_, &(h, _))| h)
            .ok_or(E::CUDA_ERROR_INVALID_VALUE)?;
        let v = t.vmm.get_mut(&h).ok_or(E::CUDA_ERROR_INVALID_VALUE)?;
        v.refs += 1;
        out(handle, h)
    }

    fn cuMemSetAccess(ptr: CUdeviceptr, size: usize, desc: *const c_void, count: usize) {
        let d = driver()?;
        if desc.is_null() || count == 0 { return Err(E::CUDA_ERROR_INVALID_VALUE); }
        let t = d.tables();
        let mapped = t.mappings.iter().any(|(&b, &(_, s))| ptr >= b && ptr + size as u64 <= b + s);
        if mapped { Ok(()) } else { Err(E::CUDA_ERROR_INVALID_VALUE) }
    }

    // ----- arrays -----

    fn cuArrayCreate_v2(arr: *mut *mut c_void, desc: *const ArrayDesc) {
        if desc.is_null() { return Err(E::CUDA_ERROR_INVALID_VALUE); }
        let x = &*desc;
        array_create(arr, x.width as u64, x.height as u64, 1, x.format, x.channels)
    }
    fn cuArrayCreate(arr: *mut *mut c_void, desc: *const ArrayDescV1) {
        if desc.is_null() { return Err(E::CUDA_ERROR_INVALID_VALUE); }
        let x = &*desc;
        array_create(arr, x.width as u64, x.height as u64, 1, x.format, x.channels)
    }
    fn cuArray3DCreate_v2(arr: *mut *mut c_void, desc: *const Array3DDesc) {
        if desc.is_null() { return Err(E::CUDA_ERROR_INVALID_VALUE); }
        let x = &*desc;
        array_create(arr, x.width as u64, x.height as u64, x.depth as u64, x.format, x.channels)
    }
    fn cuArrayDestroy(arr: *mut c_void) {
        let d = driver()?;
        let (dev, bytes) = d.tables().arrays.remove(&(arr as usize)).ok_or(E::CUDA_ERROR_INVALID_HANDLE)?;
        d.node.credit(dev, bytes);
        Ok(())
    }

    fn cuMipmappedArrayCreate(arr: *mut *mut c_void, desc: *const Array3DDesc, levels: c_uint) {
        if desc.is_null() || arr.is_null() || levels == 0 { return Err(E::CUDA_ERROR_INVALID_VALUE); }
        let x = &*desc;
        let elem = format_bytes(x.format).ok_or(E::CUDA_ERROR_INVALID_VALUE)?;
        if x.width == 0 || !matches!(x.channels, 1 | 2 | 4) { return Err(E::CUDA_ERROR_INVALID_VALUE); }
        let bytes = mipmap_bytes(x.width as u64, x.height as u64, x.depth as u64, elem, x.channels as u64, levels);
        let d = driver()?;
        let ctx = ctx_ok()?;
        d.charge(ctx.dev, bytes)?;
        let handle = new_va(bytes) as usize;
        d.tables().mipmaps.insert(handle, (ctx.dev, bytes));
        out(arr, handle as *mut c_void)
    }
    fn cuMipmappedArrayDestroy(arr: *mut c_void) {
        let d = driver()?;
        let (dev, bytes) = d.tables().mipmaps.remove(&(arr as usize)).ok_or(E::CUDA_ERROR_INVALID_HANDLE)?;
        d.node.credit(dev, bytes);
        Ok(())
    }

    // ----- copies and memset: stream order, no data -----

    fn cuMemcpyHtoD_v2(_dst: CUdeviceptr, _src: *const c_void, _n: usize) { sync_copy(false) }
    fn cuMemcpyHtoD_v2_ptds(_dst: CUdeviceptr, _src: *const c_void, _n: usize) { sync_copy(true) }
    fn cuMemcpyDtoH_v2(_dst: *mut c_void, _src: CUdeviceptr, _n: usize) { sync_copy(false) }
    fn cuMemcpyDtoH_v2_ptds(_dst: *mut c_void, _src: CUdeviceptr, _n: usize) { sync_copy(true) }
    fn cuMemcpyDtoD_v2(_dst: CUdeviceptr, _src: CUdeviceptr, _n: usize) { sync_copy(false) }
    fn cuMemcpyDtoD_v2_ptds(_dst: CUdeviceptr, _src: CUdeviceptr, _n: usize) { sync_copy(true) }
    fn cuMemcpyHtoDAsync_v2(_dst: CUdeviceptr, _src: *const c_void, _n: usize, h: CUstream) { async_copy(h, false) }
    fn cuMemcpyHtoDAsync_v2_ptsz(_dst: CUdeviceptr, _src: *const c_void, _n: usize, h: CUstream) { async_copy(h, true) }
    fn cuMemcpyDtoHAsync_v2(_dst: *mut c_void, _src: CUdeviceptr, _n: usize, h: CUstream) { async_copy(h, false) }
    fn cuMemcpyDtoHAsync_v2_ptsz(_dst: *mut c_void, _src: CUdeviceptr, _n: usize, h: CUstream) { async_copy(h, true) }
    fn cuMemsetD8_v2(_dst: CUdeviceptr, _v: u8, _n: usize) { sync_copy(false) }
    fn cuMemsetD8_v2_ptds(_dst: CUdeviceptr, _v: u8, _n: usize) { sync_copy(true) }
    fn cuMemsetD8Async(_dst: CUdeviceptr, _v: u8, _n: usize, h: CUstream) { async_copy(h, false) }
    fn cuMemsetD8Async_ptsz(_dst: CUdeviceptr, _v: u8, _n: usize, h: CUstream) { async_copy(h, true) }

    // ----- launches -----

    fn cuLaunchKernel(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        _shared: c_uint, h: CUstream, params: *mut *mut c_void, _extra: *mut *mut c_void) {
        launch(f, [gx, gy, gz], [bx, by, bz], h, params, false)
    }
    fn cuLaunchKernel_ptsz(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        _shared: c_uint, h: CUstream, params: *mut *mut c_void, _extra: *mut *mut c_void) {
        launch(f, [gx, gy, gz], [bx, by, bz], h, params, true)
    }
    fn cuLaunchKernelEx(config: *const CUlaunchConfig, f: CUfunction, params: *mut *mut c_void, _extra: *mut *mut c_void) {
        launch_ex(config, f, params, false)
    }
    fn cuLaunchKernelEx_ptsz(config: *const CUlaunchConfig, f: CUfunction, params: *mut *mut c_void, _extra: *mut *mut c_void) {
        launch_ex(config, f, params, true)
    }
    fn cuLaunchCooperativeKernel(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        _shared: c_uint, h: CUstream, params: *mut *mut c_void) {
        launch(f, [gx, gy, gz], [bx, by, bz], h, params, false)
    }
    fn cuLaunchCooperativeKernel_ptsz(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        _shared: c_uint, h: CUstream, params: *mut *mut c_void) {
        launch(f, [gx, gy, gz], [bx, by, bz], h, params, true)
    }

    fn cuLaunchCooperativeKernelMultiDevice(list: *mut CUDA_LAUNCH_PARAMS, n: c_uint, _flags: c_uint) {
        if list.is_null() || n == 0 { return Err(E::CUDA_ERROR_INVALID_VALUE); }
        for p in std::slice::from_raw_parts(list, n as usize) {
            launch(p.function, [p.gridDimX, p.gridDimY, p.gridDimZ], [p.blockDimX, p.blockDimY, p.blockDimZ],
                p.hStream, p.kernelParams, false)?;
        }
        Ok(())
    }

    /// Host work in stream order. The simulator runs `f` on the calling thread once the stream has
    /// drained (the real driver runs it on a driver thread without blocking the caller); either
    /// way it runs after the stream's earlier work and before its later work, and uses no GPU
    /// time.
    fn cuLaunchHostFunc(h: CUstream, f: Option<unsafe extern "C" fn(*mut c_void)>, data: *mut c_void) {
        let f = f.ok_or(E::CUDA_ERROR_INVALID_VALUE)?;
        let t = stream_target(h, false)?;
        driver()?.node.stream_sync(t.dev, t.local).map_err(sim_err)?;
        f(data);
        Ok(())
    }
    fn cuLaunchHostFunc_ptsz(h: CUstream, f: Option<unsafe extern "C" fn(*mut c_void)>, data: *mut c_void) {
        let f = f.ok_or(E::CUDA_ERROR_INVALID_VALUE)?;
        let t = stream_target(h, true)?;
        driver()?.node.stream_sync(t.dev, t.local).map_err(sim_err)?;
        f(data);
        Ok(())
    }

    // ----- graphs -----

    fn cuGraphInstantiateWithFlags(exec: *mut CUgraphExec, g: CUgraph, _flags: u64) { instantiate(exec, g) }
    fn cuGraphInstantiate(exec: *mut CUgraphExec, g: CUgraph, _err: *mut c_void, _log: *mut c_char, _n: usize) {
        instantiate(exec, g)
    }
    fn cuGraphInstantiate_v2(exec: *mut CUgraphExec, g: CUgraph, _err: *mut c_void, _log: *mut c_char, _n: usize) {
        instantiate(exec, g)
    }
    fn cuGraphLaunch(exec: CUgraphExec, h: CUstream) { graph_launch(exec, h, false) }
    fn cuGraphLaunch_ptsz(exec: CUgraphExec, h: CUstream) { graph_launch(exec, h, true) }
    fn cuGraphExecDestroy(exec: CUgraphExec) {
        let e = obj(exec as *const GraphExec, EXEC_MAGIC).ok_or(E::CUDA_ERROR_INVALID_HANDLE)?;
        e.magic.store(0, Release);
        if e.backed.swap(false, AcqRel) {
            let d = driver()?;
            for &(dev, bytes) in &e.allocs {
                d.node.credit(dev, bytes);
            }
        }
        Ok(())
    }
    fn cuGraphInstantiateWithParams(exec: *mut CUgraphExec, g: CUgraph, _params: *mut c_void) { instantiate(exec, g) }

    /// A memory-allocation node (CUDA_MEM_ALLOC_NODE_PARAMS: poolProps @0 (88 bytes, location id
    /// @12), accessDescs @88, accessDescCount @96, bytesize @104, dptr @112). The node's address
    /// range is assigned now; its memory when the instantiated graph first runs.
    fn cuGraphAddMemAllocNode(node: *mut *mut c_void, g: CUgraph, _deps: *const *mut c_void, _n: usize, params: *mut c_void) {
        let d = driver()?;
        let graph = obj(g as *const Graph, GRAPH_MAGIC).ok_or(E::CUDA_ERROR_INVALID_HANDLE)?;
        if params.is_null() || node.is_null() { return Err(E::CUDA_ERROR_INVALID_VALUE); }
        let base = params as *mut u8;
        let id = *base.add(12).cast::<c_int>();
        let bytes = *base.add(104).cast::<usize>() as u64;
        if bytes == 0 { return Err(E::CUDA_ERROR_INVALID_VALUE); }
        let dev = dev_ok(d, id)?;
        graph.allocs.lock().unwrap_or_else(|e| e.into_inner()).push((dev, bytes));
        *base.add(112).cast::<u64>() = new_va(bytes);
        // Nodes are opaque to the simulator's users: a unique non-null token.
        out(node, new_va(1) as *mut c_void)
    }
    fn cuGraphDestroy(g: CUgraph) {
        let graph = obj(g as *const Graph, GRAPH_MAGIC).ok_or(E::CUDA_ERROR_INVALID_HANDLE)?;
        graph.magic.store(0, Release);
        Ok(())
    }

    // ----- entry-point resolution -----

    fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64) {
        crate::procaddr::get_proc_address(symbol, pfn, version, flags, std::ptr::null_mut())
    }
    fn cuGetProcAddress_v2(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64, status: *mut c_int) {
        crate::procaddr::get_proc_address(symbol, pfn, version, flags, status)
    }
}

/// Simulator ground truth for a study (`smore demo --phase-oracle`), not a driver entry point:
/// when the kernels process `pid` has queued on device `ordinal` will all have run if it kept the
/// GPU (CLOCK_MONOTONIC ns), 0 when it has nothing queued, holds no context, or the ordinal is not
/// visible (`smore_simgpu::Node::truth_busy_until`; docs/harvest.md, "What perfect phase
/// knowledge buys"). The real driver has no such symbol.
#[no_mangle]
pub extern "C" fn smore_sim_truth_busy_until(ordinal: c_int, pid: c_uint) -> u64 {
    // Like every export: no panic crosses the C boundary.
    std::panic::catch_unwind(|| {
        let Ok(d) = driver() else { return 0 };
        let Ok(dev) = dev_ok(d, ordinal) else {
            return 0;
        };
        d.node.truth_busy_until(dev, pid).unwrap_or(0)
    })
    .unwrap_or(0)
}
