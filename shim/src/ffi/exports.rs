//! The `#[no_mangle]` hooks: strong definitions of every hooked driver and NVML export (what a
//! program linked with `-lcuda` binds to, and what `dlsym` / `cuGetProcAddress` hand out through
//! [`hook_addr`]).
//!
//! Each hook forwards to the real export of exactly its own name and ABI (resolved by `real`),
//! with the same arguments. Allocation hooks reserve before the call and commit or roll back
//! after it; free hooks always call the driver first and credit only what it freed; info hooks
//! rewrite the driver's answer to the cap; launch hooks go straight to the driver unless a device
//! is throttled (the fast path: two relaxed loads, no lock, no allocation, no syscall).
//!
//! Every body runs under `catch_unwind` ([`guarded`]): on a panic the real function is called
//! if it was not called yet (never twice), except that an allocation under the fail-closed policy
//! is refused. Must never: let a panic unwind into C, call the real function twice, or leave a
//! driver out parameter half-rewritten.
//!
//! Unit tests of this crate are built without `#[no_mangle]` (`cfg_attr(not(test), …)`): a test
//! executable must not interpose `dlsym` or the driver on itself.

// The hooks carry the driver's own names (cuda.h / nvml.h spelling is the ABI).
#![allow(non_snake_case)]

use super::real;
use crate::config::FailurePolicy;
use crate::ledger::Kind;
use crate::limits;
use crate::runtime::{self, CUDA_ERROR_OUT_OF_MEMORY};
use crate::variants::Hook;
use cudarc::driver::sys::{
    CUarray, CUcontext, CUdevice, CUdeviceptr, CUfunction, CUgraphExec, CUlaunchConfig,
    CUmemAllocationProp, CUmemoryPool, CUstream, CUDA_ARRAY3D_DESCRIPTOR, CUDA_ARRAY_DESCRIPTOR,
};
use std::cell::Cell;
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// `CUDA_ERROR_NOT_FOUND`: what a hook answers when the real driver lacks its export (only
/// reachable through direct linking against a driver older than the symbol).
const CUDA_ERROR_NOT_FOUND: u32 = 500;
/// `NVML_ERROR_FUNCTION_NOT_FOUND`.
const NVML_ERROR_FUNCTION_NOT_FOUND: u32 = 13;
/// `CU_MEM_LOCATION_TYPE_DEVICE` (cuda.h).
const CU_MEM_LOCATION_TYPE_DEVICE: u32 = 1;
/// Row alignment the shim assumes for a pitched allocation's first reservation: 512 bytes, the
/// texture pitch alignment of every GPU since Fermi (cudaDeviceProp::texturePitchAlignment).
/// A larger real pitch is charged exactly after the call (see `Runtime::alloc_sized`).
const PITCH_ALIGN: u64 = 512;

/// `CUDA_ARRAY_DESCRIPTOR_v1` (cuda.h, CUDA < 3.2 ABI): 32-bit extents.
#[repr(C)]
pub struct ArrayDescV1 {
    pub width: c_uint,
    pub height: c_uint,
    pub format: c_uint,
    pub channels: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR_v1`.
#[repr(C)]
pub struct Array3DDescV1 {
    pub width: c_uint,
    pub height: c_uint,
    pub depth: c_uint,
    pub format: c_uint,
    pub channels: c_uint,
    pub flags: c_uint,
}

/// `nvmlMemory_t`.
#[repr(C)]
pub struct NvmlMemory {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
pub struct NvmlMemoryV2 {
    pub version: c_uint,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

/// The real export of a hook, as a function pointer of its C prototype; returns `$none` from the
/// enclosing hook if the driver lacks it.
macro_rules! real_fn {
    ($h:ident : fn($($t:ty),*), else $none:expr) => {{
        let a = real::real_addr(Hook::$h);
        if a == 0 {
            return $none;
        }
        // SAFETY: `a` is the real export named exactly like the hook, whose C prototype (cuda.h /
        // nvml.h) is the one spelled here; all of them return a 32-bit status code.
        unsafe { std::mem::transmute::<usize, unsafe extern "C" fn($($t),*) -> u32>(a) }
    }};
}

/// What a panic in a hook falls back to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum OnPanic {
    /// Call the real function (if not called yet).
    Real,
    /// An allocation: refused under the fail-closed policy, else the real call.
    Alloc,
}

/// Runs `body` under `catch_unwind`. `body` gets `call`, which calls the real function at most
/// once and remembers its result; after a panic the remembered result is returned, or the real
/// function is called now (or, for allocations under fail-closed, refused).
#[inline(always)]
fn guarded(
    on_panic: OnPanic,
    real: impl Fn() -> u32,
    body: impl FnOnce(&dyn Fn() -> u32) -> u32,
) -> u32 {
    let done: Cell<Option<u32>> = Cell::new(None);
    let call = || match done.get() {
        Some(rc) => rc,
        None => {
            let rc = real();
            done.set(Some(rc));
            rc
        }
    };
    match catch_unwind(AssertUnwindSafe(|| body(&call))) {
        Ok(rc) => rc,
        Err(_) => {
            if let Some(rc) = done.get() {
                return rc;
            }
            let closed = runtime::peek().is_some_and(|r| r.config.policy == FailurePolicy::Closed);
            if on_panic == OnPanic::Alloc && closed {
                CUDA_ERROR_OUT_OF_MEMORY
            } else {
                call()
            }
        }
    }
}

/// Runs `f` after a successful driver call, swallowing a panic (the driver's answer stands).
#[inline(always)]
fn after(f: impl FnOnce()) {
    let _ = catch_unwind(AssertUnwindSafe(f));
}

/// Reads a driver-written out parameter after a successful call (0 otherwise).
///
/// # Safety
/// `p` is null or the caller's valid out pointer.
#[inline(always)]
unsafe fn out<T: Copy + Into<u64>>(rc: u32, p: *const T) -> u64 {
    if rc == 0 && !p.is_null() {
        // SAFETY: caller's contract; the driver wrote it on success.
        unsafe { p.read() }.into()
    } else {
        0
    }
}

/// The launch fast path: true when the runtime exists and no device is throttled (or the shim
/// runs pass-through). Two relaxed/acquire loads; no initialisation.
#[inline(always)]
fn unthrottled() -> bool {
    match runtime::peek() {
        Some(r) => !r.enforcing || limits::none_throttled(r.limits()),
        None => false,
    }
}

/// The launch slow path: initialise if needed, gate if the device is throttled.
#[inline(never)]
fn launch_slow(key: u64, stream: usize, ptsz: bool, real: impl Fn() -> u32) -> u32 {
    guarded(OnPanic::Real, real, |call| match runtime::throttling() {
        None => call(),
        Some(rt) => rt.launch(key, stream, ptsz, call),
    })
}

/// Charges an allocation of `bytes` on `dev` (current device when `None`) around `call`.
#[inline(always)]
fn alloc(
    dev: Option<usize>,
    bytes: u64,
    kind: Kind,
    real: impl Fn() -> u32,
    key: impl Fn(u32) -> u64,
) -> u32 {
    guarded(OnPanic::Alloc, real, |call| match runtime::enforcing() {
        None => call(),
        Some(rt) => rt.alloc(dev, bytes, kind, || {
            let rc = call();
            (rc, key(rc))
        }),
    })
}

/// Credits `key` after the driver freed it (the driver is always called first, by the caller).
#[inline(always)]
fn freed(rc: u32, kind: Kind, key: u64) -> u32 {
    if rc == 0 {
        after(|| {
            if let Some(rt) = runtime::enforcing() {
                rt.freed(kind, key);
            }
        });
    }
    rc
}

// ---------------------------------------------------------------------------------------------
// Allocations
// ---------------------------------------------------------------------------------------------

/// # Safety
/// cuda.h contract of `cuMemAlloc` (CUDA < 3.2 ABI: 32-bit pointer and size).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuMemAlloc(dptr: *mut c_uint, bytes: c_uint) -> u32 {
    let f = real_fn!(cuMemAlloc: fn(*mut c_uint, c_uint), else CUDA_ERROR_NOT_FOUND);
    // SAFETY: (as for every `real` closure below) the caller's arguments, forwarded unchanged to the
    // real export of the same prototype.
    let real = || unsafe { f(dptr, bytes) };
    // SAFETY: `dptr` is the caller's out pointer.
    alloc(None, bytes as u64, Kind::Ptr, real, |rc| unsafe {
        out(rc, dptr)
    })
}

/// # Safety
/// cuda.h contract of `cuMemAlloc_v2`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytes: usize) -> u32 {
    let f = real_fn!(cuMemAlloc_v2: fn(*mut CUdeviceptr, usize), else CUDA_ERROR_NOT_FOUND);
    // SAFETY: `f` is the real driver's entry point of exactly this signature (resolved by
    // name on libcuda.so.1); the caller's arguments are passed through unchanged.
    let real = || unsafe { f(dptr, bytes) };
    // SAFETY: `dptr` is the caller's out pointer.
    alloc(None, bytes as u64, Kind::Ptr, real, |rc| unsafe {
        out(rc, dptr)
    })
}

/// Shared body of the two pitched variants.
fn alloc_pitch(
    width: u64,
    height: u64,
    v1: bool,
    real: impl Fn() -> u32,
    result: impl Fn(u32) -> (u64, u64),
) -> u32 {
    let estimate = width
        .div_ceil(PITCH_ALIGN)
        .saturating_mul(PITCH_ALIGN)
        .saturating_mul(height);
    guarded(OnPanic::Alloc, real, |call| match runtime::enforcing() {
        None => call(),
        Some(rt) => rt.alloc_sized(
            None,
            estimate,
            Kind::Ptr,
            || {
                let rc = call();
                let (key, pitch) = result(rc);
                (rc, key, pitch.saturating_mul(height))
            },
            |key| {
                real::mem_free(key, v1);
            },
        ),
    })
}

/// # Safety
/// cuda.h contract of `cuMemAllocPitch` (32-bit ABI).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuMemAllocPitch(
    dptr: *mut c_uint,
    pitch: *mut c_uint,
    width: c_uint,
    height: c_uint,
    elem: c_uint,
) -> u32 {
    let f = real_fn!(cuMemAllocPitch: fn(*mut c_uint, *mut c_uint, c_uint, c_uint, c_uint), else CUDA_ERROR_NOT_FOUND);
    // SAFETY: `f` is the real driver's entry point of exactly this signature (resolved by
    // name on libcuda.so.1); the caller's arguments are passed through unchanged.
    let real = || unsafe { f(dptr, pitch, width, height, elem) };
    // SAFETY: the caller's out pointers, written by the driver on success.
    let result = |rc| unsafe { (out(rc, dptr), out(rc, pitch)) };
    alloc_pitch(width as u64, height as u64, true, real, result)
}

/// # Safety
/// cuda.h contract of `cuMemAllocPitch_v2`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    elem: c_uint,
) -> u32 {
    let f = real_fn!(cuMemAllocPitch_v2: fn(*mut CUdeviceptr, *mut usize, usize, usize, c_uint), else CUDA_ERROR_NOT_FOUND);
    // SAFETY: `f` is the real driver's entry point of exactly this signature (resolved by
    // name on libcuda.so.1); the caller's arguments are passed through unchanged.
    let real = || unsafe { f(dptr, pitch, width, height, elem) };
    // SAFETY: the caller's out pointers, written by the driver on success.
    let result = |rc| unsafe {
        (
            out(rc, dptr),
            if rc == 0 && !pitch.is_null() {
                pitch.read() as u64
            } else {
                0
            },
        )
    };
    alloc_pitch(width as u64, height as u64, false, real, result)
}

/// # Safety
/// cuda.h contract of `cuMemAllocManaged`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuMemAllocManaged(
    dptr: *mut CUdeviceptr,
    bytes: usize,
    flags: c_uint,
) -> u32 {
    let f =
        real_fn!(cuMemAllocManaged: fn(*mut CUdeviceptr, usize, c_uint), else CUDA_ERROR_NOT_FOUND);
    // SAFETY: `f` is the real driver's entry point of exactly this signature (resolved by
    // name on libcuda.so.1); the caller's arguments are passed through unchanged.
    let real = || unsafe { f(dptr, bytes, flags) };
    // SAFETY: `dptr` is the caller's out pointer.
    alloc(None, bytes as u64, Kind::Ptr, real, |rc| unsafe {
        out(rc, dptr)
    })
}

/// # Safety
/// cuda.h contract of `cuMemAllocAsync`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync(
    dptr: *mut CUdeviceptr,
    bytes: usize,
    stream: CUstream,
) -> u32 {
    let f =
        real_fn!(cuMemAllocAsync: fn(*mut CUdeviceptr, usize, CUstream), else CUDA_ERROR_NOT_FOUND);
    // SAFETY: `f` is the real driver's entry point of exactly this signature (resolved by
    // name on libcuda.so.1); the caller's arguments are passed through unchanged.
    let real = || unsafe { f(dptr, bytes, stream) };
    // SAFETY: `dptr` is the caller's out pointer.
    alloc(None, bytes as u64, Kind::Ptr, real, |rc| unsafe {
        out(rc, dptr)
    })
}

/// # Safety
/// cuda.h contract of `cuMemAllocAsync_ptsz`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(
    dptr: *mut CUdeviceptr,
    bytes: usize,
    stream: CUstream,
) -> u32 {
    let f = real_fn!(cuMemAllocAsync_ptsz: fn(*mut CUdeviceptr, usize, CUstream), else CUDA_ERROR_NOT_FOUND);
    // SAFETY: `f` is the real driver's entry point of exactly this signature (resolved by
    // name on libcuda.so.1); the caller's arguments are passed through unchanged.
    let real = || unsafe { f(dptr, bytes, stream) };
    // SAFETY: `dptr` is the caller's out pointer.
    alloc(None, bytes as u64, Kind::Ptr, real, |rc| unsafe {
        out(rc, dptr)
    })
}

/// # Safety
/// cuda.h contract of `cuMemAllocFromPoolAsync`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut CUdeviceptr,
    bytes: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> u32 {
    let f = real_fn!(cuMemAllocFromPoolAsync: fn(*mut CUdeviceptr, usize, CUmemoryPool, CUstream), else CUDA_ERROR_NOT_FOUND);
    // SAFETY: `f` is the real driver's entry point of exactly this signature (resolved by
    // name on libcuda.so.1); the caller's arguments are passed through unchanged.
    let real = || unsafe { f(dptr, bytes, pool, stream) };
    // SAFETY: `dptr` is the caller's out pointer.
    alloc(None, bytes as u64, Kind::Ptr, real, |rc| unsafe {
        out(rc, dptr)
    })
}

/// # Safety
/// cuda.h contract of `cuMemAllocFromPoolAsync_ptsz`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz(
    dptr: *mut CUdeviceptr,
    bytes: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> u32 {
    let f = real_fn!(cuMemAllocFromPoolAsync_ptsz: fn(*mut CUdeviceptr, usize, CUmemoryPool, CUstream), else CUDA_ERROR_NOT_FOUND);
    // SAFETY: `f` is the real driver's entry point of exactly this signature (resolved by
    // name on libcuda.so.1); the caller's arguments are passed through unchanged.
    let real = || unsafe { f(dptr, bytes, pool, stream) };
    // SAFETY: `dptr` is the caller's out pointer.
    alloc(None, bytes as u64, Kind::Ptr, real, |rc| unsafe {
        out(rc, dptr)
    })
}

/// # Safety
/// cuda.h contract of `cuMemFree` (32-bit ABI).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuMemFree(ptr: c_uint) -> u32 {
    let f = real_fn!(cuMemFree: fn(c_uint), else CUDA_ERROR_NOT_FOUND);
    // SAFETY: forwarded unchanged.
    freed(unsafe { f(ptr) }, Kind::Ptr, ptr as u64)
}

/// # Safety
/// cuda.h contract of `cuMemFree_v2`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuMemFree_v2(ptr: CUdeviceptr) -> u32 {
    let f = real_fn!(cuMemFree_v2: fn(CUdeviceptr), else CUDA_ERROR_NOT_FOUND);
    // SAFETY: forwarded unchanged.
    freed(unsafe { f(ptr) }, Kind::Ptr, ptr)
}

/// # Safety
/// cuda.h contract of `cuMemFreeAsync`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuMemFreeAsync(ptr: CUdeviceptr, stream: CUstream) -> u32 {
    let f = real_fn!(cuMemFreeAsync: fn(CUdeviceptr, CUstream), else CUDA_ERROR_NOT_FOUND);
    // SAFETY: forwarded unchanged.
    freed(unsafe { f(ptr, stream) }, Kind::Ptr, ptr)
}

/// # Safety
/// cuda.h contract of `cuMemFreeAsync_ptsz`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuMemFreeAsync_ptsz(ptr: CUdeviceptr, stream: CUstream) -> u32 {
    let f = real_fn!(cuMemFreeAsync_ptsz: fn(CUdeviceptr, CUstream), else CUDA_ERROR_NOT_FOUND);
    // SAFETY: forwarded unchanged.
    freed(unsafe { f(ptr, stream) }, Kind::Ptr, ptr)
}

/// # Safety
/// cuda.h contract of `cuMemCreate`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut u64,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: u64,
) -> u32 {
    let f = real_fn!(cuMemCreate: fn(*mut u64, usize, *const CUmemAllocationProp, u64), else CUDA_ERROR_NOT_FOUND);
    // SAFETY: `f` is the real driver's entry point of exactly this signature (resolved by
    // name on libcuda.so.1); the caller's arguments are passed through unchanged.
    let real = || unsafe { f(handle, size, prop, flags) };
    let dev = if prop.is_null() {
        None
    } else {
        // SAFETY: `prop` points to the caller's CUmemAllocationProp. The location type is read
        // as its underlying u32 (never materialised as a Rust enum, which a foreign value could
        // make invalid); the id is a plain int.
        let (ty, id) = unsafe {
            (
                std::ptr::addr_of!((*prop).location.type_)
                    .cast::<u32>()
                    .read(),
                std::ptr::addr_of!((*prop).location.id).read(),
            )
        };
        (ty == CU_MEM_LOCATION_TYPE_DEVICE && id >= 0).then_some(id as usize)
    };
    // SAFETY: `handle` is the caller's out pointer.
    alloc(dev, size as u64, Kind::Vmm, real, |rc| unsafe {
        out(rc, handle)
    })
}

/// # Safety
/// cuda.h contract of `cuMemRelease`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuMemRelease(handle: u64) -> u32 {
    let f = real_fn!(cuMemRelease: fn(u64), else CUDA_ERROR_NOT_FOUND);
    // SAFETY: forwarded unchanged.
    freed(unsafe { f(handle) }, Kind::Vmm, handle)
}

/// Charges an array of the given extents around `real`.
fn alloc_array(
    arr: *mut CUarray,
    dims: Option<(u64, u64, u64, u32, u32)>,
    real: impl Fn() -> u32,
) -> u32 {
    let Some((w, h, d, format, channels)) = dims else {
        // No descriptor: the driver refuses it; nothing to charge.
        return guarded(OnPanic::Real, real, |call| call());
    };
    let bytes = runtime::array_bytes(w, h, d, format, channels);
    alloc(None, bytes, Kind::Array, real, |rc| {
        if rc == 0 && !arr.is_null() {
            // SAFETY: the caller's out pointer, written by the driver on success.
            unsafe { arr.read() as u64 }
        } else {
            0
        }
    })
}

/// # Safety
/// cuda.h contract of `cuArrayCreate` (32-bit descriptor).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuArrayCreate(arr: *mut CUarray, desc: *const ArrayDescV1) -> u32 {
    let f =
        real_fn!(cuArrayCreate: fn(*mut CUarray, *const ArrayDescV1), else CUDA_ERROR_NOT_FOUND);
    // SAFETY: `f` is the real driver's entry point of exactly this signature (resolved by
    // name on libcuda.so.1); the caller's arguments are passed through unchanged.
    let real = || unsafe { f(arr, desc) };
    // SAFETY: `desc` is null or the caller's descriptor (plain integers).
    let dims = unsafe { desc.as_ref() }
        .map(|d| (d.width as u64, d.height as u64, 1, d.format, d.channels));
    alloc_array(arr, dims, real)
}

/// # Safety
/// cuda.h contract of `cuArrayCreate_v2`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuArrayCreate_v2(
    arr: *mut CUarray,
    desc: *const CUDA_ARRAY_DESCRIPTOR,
) -> u32 {
    let f = real_fn!(cuArrayCreate_v2: fn(*mut CUarray, *const CUDA_ARRAY_DESCRIPTOR), else CUDA_ERROR_NOT_FOUND);
    // SAFETY: `f` is the real driver's entry point of exactly this signature (resolved by
    // name on libcuda.so.1); the caller's arguments are passed through unchanged.
    let real = || unsafe { f(arr, desc) };
    let dims = (!desc.is_null()).then(|| {
        // SAFETY: the caller's descriptor; fields read one by one, the format as its u32.
        unsafe {
            (
                (*desc).Width as u64,
                (*desc).Height as u64,
                1,
                std::ptr::addr_of!((*desc).Format).cast::<u32>().read(),
                (*desc).NumChannels,
            )
        }
    });
    alloc_array(arr, dims, real)
}

/// # Safety
/// cuda.h contract of `cuArray3DCreate` (32-bit descriptor).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuArray3DCreate(arr: *mut CUarray, desc: *const Array3DDescV1) -> u32 {
    let f = real_fn!(cuArray3DCreate: fn(*mut CUarray, *const Array3DDescV1), else CUDA_ERROR_NOT_FOUND);
    // SAFETY: `f` is the real driver's entry point of exactly this signature (resolved by
    // name on libcuda.so.1); the caller's arguments are passed through unchanged.
    let real = || unsafe { f(arr, desc) };
    // SAFETY: `desc` is null or the caller's descriptor (plain integers).
    let dims = unsafe { desc.as_ref() }.map(|d| {
        (
            d.width as u64,
            d.height as u64,
            d.depth as u64,
            d.format,
            d.channels,
        )
    });
    alloc_array(arr, dims, real)
}

/// # Safety
/// cuda.h contract of `cuArray3DCreate_v2`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuArray3DCreate_v2(
    arr: *mut CUarray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
) -> u32 {
    let f = real_fn!(cuArray3DCreate_v2: fn(*mut CUarray, *const CUDA_ARRAY3D_DESCRIPTOR), else CUDA_ERROR_NOT_FOUND);
    // SAFETY: `f` is the real driver's entry point of exactly this signature (resolved by
    // name on libcuda.so.1); the caller's arguments are passed through unchanged.
    let real = || unsafe { f(arr, desc) };
    let dims = (!desc.is_null()).then(|| {
        // SAFETY: the caller's descriptor; fields read one by one, the format as its u32.
        unsafe {
            (
                (*desc).Width as u64,
                (*desc).Height as u64,
                (*desc).Depth as u64,
                std::ptr::addr_of!((*desc).Format).cast::<u32>().read(),
                (*desc).NumChannels,
            )
        }
    });
    alloc_array(arr, dims, real)
}

/// # Safety
/// cuda.h contract of `cuArrayDestroy`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuArrayDestroy(arr: CUarray) -> u32 {
    let f = real_fn!(cuArrayDestroy: fn(CUarray), else CUDA_ERROR_NOT_FOUND);
    // SAFETY: forwarded unchanged.
    freed(unsafe { f(arr) }, Kind::Array, arr as u64)
}

// ---------------------------------------------------------------------------------------------
// Memory information
// ---------------------------------------------------------------------------------------------

/// The capped view of the current device: `(free, total)` from the physical values, or `None`
/// when nothing is capped there.
fn capped_info(dev: Option<usize>, free: u64, total: u64) -> Option<(u64, u64)> {
    let rt = runtime::enforcing()?;
    let dev = dev.or_else(real::ctx_device)?;
    if rt.limits().cap(dev) == u64::MAX {
        return None;
    }
    rt.ensure_context_charged(dev);
    Some(rt.virtual_info(dev, free, total))
}

/// # Safety
/// cuda.h contract of `cuMemGetInfo` (32-bit ABI).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo(free: *mut c_uint, total: *mut c_uint) -> u32 {
    let f = real_fn!(cuMemGetInfo: fn(*mut c_uint, *mut c_uint), else CUDA_ERROR_NOT_FOUND);
    // SAFETY: forwarded unchanged.
    let rc = unsafe { f(free, total) };
    if rc == 0 && !free.is_null() && !total.is_null() {
        after(|| {
            // SAFETY: the caller's out pointers, written by the driver just now.
            unsafe {
                if let Some((fr, t)) = capped_info(None, free.read() as u64, total.read() as u64) {
                    free.write(fr.min(u32::MAX as u64) as c_uint);
                    total.write(t.min(u32::MAX as u64) as c_uint);
                }
            }
        });
    }
    rc
}

/// # Safety
/// cuda.h contract of `cuMemGetInfo_v2`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> u32 {
    let f = real_fn!(cuMemGetInfo_v2: fn(*mut usize, *mut usize), else CUDA_ERROR_NOT_FOUND);
    // SAFETY: forwarded unchanged.
    let rc = unsafe { f(free, total) };
    if rc == 0 && !free.is_null() && !total.is_null() {
        after(|| {
            // SAFETY: the caller's out pointers, written by the driver just now.
            unsafe {
                if let Some((fr, t)) = capped_info(None, free.read() as u64, total.read() as u64) {
                    free.write(fr as usize);
                    total.write(t as usize);
                }
            }
        });
    }
    rc
}

/// The cap of CUDA ordinal `dev` if capped.
fn cap_of(dev: CUdevice) -> Option<u64> {
    let rt = runtime::enforcing()?;
    let dev = usize::try_from(dev).ok()?;
    Some(rt.limits().cap(dev)).filter(|&c| c != u64::MAX)
}

/// # Safety
/// cuda.h contract of `cuDeviceTotalMem` (32-bit ABI).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem(bytes: *mut c_uint, dev: CUdevice) -> u32 {
    let f = real_fn!(cuDeviceTotalMem: fn(*mut c_uint, CUdevice), else CUDA_ERROR_NOT_FOUND);
    // SAFETY: forwarded unchanged.
    let rc = unsafe { f(bytes, dev) };
    if rc == 0 && !bytes.is_null() {
        after(|| {
            if let Some(cap) = cap_of(dev) {
                // SAFETY: the caller's out pointer, written by the driver just now.
                unsafe { bytes.write((bytes.read() as u64).min(cap) as c_uint) };
            }
        });
    }
    rc
}

/// # Safety
/// cuda.h contract of `cuDeviceTotalMem_v2`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> u32 {
    let f = real_fn!(cuDeviceTotalMem_v2: fn(*mut usize, CUdevice), else CUDA_ERROR_NOT_FOUND);
    // SAFETY: forwarded unchanged.
    let rc = unsafe { f(bytes, dev) };
    if rc == 0 && !bytes.is_null() {
        after(|| {
            if let Some(cap) = cap_of(dev) {
                // SAFETY: the caller's out pointer, written by the driver just now.
                unsafe { bytes.write((bytes.read() as u64).min(cap) as usize) };
            }
        });
    }
    rc
}

/// The capped view of an NVML device: `(free, total)`, or `None` to leave NVML's answer.
fn nvml_capped(device: *mut c_void, free: u64, total: u64) -> Option<(u64, u64)> {
    runtime::enforcing()?;
    let ord = real::cuda_ordinal_of_nvml(device as usize)?;
    capped_info(Some(ord), free, total)
}

/// # Safety
/// nvml.h contract of `nvmlDeviceGetMemoryInfo`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(device: *mut c_void, mem: *mut NvmlMemory) -> u32 {
    let f = real_fn!(nvmlDeviceGetMemoryInfo: fn(*mut c_void, *mut NvmlMemory), else NVML_ERROR_FUNCTION_NOT_FOUND);
    // SAFETY: forwarded unchanged.
    let rc = unsafe { f(device, mem) };
    if rc == 0 && !mem.is_null() {
        after(|| {
            // SAFETY: the caller's struct, filled by NVML just now.
            let m = unsafe { &mut *mem };
            if let Some((free, total)) = nvml_capped(device, m.free, m.total) {
                *m = NvmlMemory {
                    total,
                    free,
                    used: total - free,
                };
            }
        });
    }
    rc
}

/// # Safety
/// nvml.h contract of `nvmlDeviceGetMemoryInfo_v2`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: *mut c_void,
    mem: *mut NvmlMemoryV2,
) -> u32 {
    let f = real_fn!(nvmlDeviceGetMemoryInfo_v2: fn(*mut c_void, *mut NvmlMemoryV2), else NVML_ERROR_FUNCTION_NOT_FOUND);
    // SAFETY: forwarded unchanged.
    let rc = unsafe { f(device, mem) };
    if rc == 0 && !mem.is_null() {
        after(|| {
            // SAFETY: the caller's struct, filled by NVML just now.
            let m = unsafe { &mut *mem };
            if let Some((free, total)) = nvml_capped(device, m.free, m.total) {
                // Driver-reserved memory stays reported as reserved, within the capped total.
                let reserved = m.reserved.min(total - free);
                m.total = total;
                m.free = free;
                m.reserved = reserved;
                m.used = total - free - reserved;
            }
        });
    }
    rc
}

// ---------------------------------------------------------------------------------------------
// Contexts (the context footprint is charged against the cap)
// ---------------------------------------------------------------------------------------------

fn context_created(rc: u32, dev: CUdevice) -> u32 {
    if rc == 0 {
        after(|| {
            if let (Some(rt), Ok(d)) = (runtime::enforcing(), usize::try_from(dev)) {
                rt.ensure_context_charged(d);
            }
        });
    }
    rc
}

/// # Safety
/// cuda.h contract of `cuDevicePrimaryCtxRetain`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> u32 {
    let f =
        real_fn!(cuDevicePrimaryCtxRetain: fn(*mut CUcontext, CUdevice), else CUDA_ERROR_NOT_FOUND);
    // SAFETY: forwarded unchanged.
    context_created(unsafe { f(pctx, dev) }, dev)
}

/// # Safety
/// cuda.h contract of `cuCtxCreate`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuCtxCreate(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> u32 {
    let f = real_fn!(cuCtxCreate: fn(*mut CUcontext, c_uint, CUdevice), else CUDA_ERROR_NOT_FOUND);
    // SAFETY: forwarded unchanged.
    context_created(unsafe { f(pctx, flags, dev) }, dev)
}

/// # Safety
/// cuda.h contract of `cuCtxCreate_v2`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v2(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> u32 {
    let f =
        real_fn!(cuCtxCreate_v2: fn(*mut CUcontext, c_uint, CUdevice), else CUDA_ERROR_NOT_FOUND);
    // SAFETY: forwarded unchanged.
    context_created(unsafe { f(pctx, flags, dev) }, dev)
}

/// # Safety
/// cuda.h contract of `cuCtxCreate_v3`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v3(
    pctx: *mut CUcontext,
    params: *mut c_void,
    n: c_int,
    flags: c_uint,
    dev: CUdevice,
) -> u32 {
    let f = real_fn!(cuCtxCreate_v3: fn(*mut CUcontext, *mut c_void, c_int, c_uint, CUdevice), else CUDA_ERROR_NOT_FOUND);
    // SAFETY: forwarded unchanged.
    context_created(unsafe { f(pctx, params, n, flags, dev) }, dev)
}

/// # Safety
/// cuda.h contract of `cuCtxCreate_v4`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v4(
    pctx: *mut CUcontext,
    params: *mut c_void,
    flags: c_uint,
    dev: CUdevice,
) -> u32 {
    let f = real_fn!(cuCtxCreate_v4: fn(*mut CUcontext, *mut c_void, c_uint, CUdevice), else CUDA_ERROR_NOT_FOUND);
    // SAFETY: forwarded unchanged.
    context_created(unsafe { f(pctx, params, flags, dev) }, dev)
}

// ---------------------------------------------------------------------------------------------
// Launches
// ---------------------------------------------------------------------------------------------

macro_rules! launch_kernel_hook {
    ($name:ident, $ptsz:expr) => {
        /// # Safety
        /// cuda.h contract of the launch entry point of the same name.
        #[cfg_attr(not(test), no_mangle)]
        pub unsafe extern "C" fn $name(
            f: CUfunction,
            gx: c_uint,
            gy: c_uint,
            gz: c_uint,
            bx: c_uint,
            by: c_uint,
            bz: c_uint,
            shared: c_uint,
            stream: CUstream,
            params: *mut *mut c_void,
            extra: *mut *mut c_void,
        ) -> u32 {
            let real = real_fn!($name: fn(CUfunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut *mut c_void, *mut *mut c_void), else CUDA_ERROR_NOT_FOUND);
            if unthrottled() {
                // SAFETY: forwarded unchanged.
                return unsafe { real(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra) };
            }
            // SAFETY: forwarded unchanged.
            let call = || unsafe { real(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra) };
            launch_slow(f as u64, stream as usize, $ptsz, call)
        }
    };
}

launch_kernel_hook!(cuLaunchKernel, false);
launch_kernel_hook!(cuLaunchKernel_ptsz, true);

macro_rules! launch_coop_hook {
    ($name:ident, $ptsz:expr) => {
        /// # Safety
        /// cuda.h contract of the launch entry point of the same name.
        #[cfg_attr(not(test), no_mangle)]
        pub unsafe extern "C" fn $name(
            f: CUfunction,
            gx: c_uint,
            gy: c_uint,
            gz: c_uint,
            bx: c_uint,
            by: c_uint,
            bz: c_uint,
            shared: c_uint,
            stream: CUstream,
            params: *mut *mut c_void,
        ) -> u32 {
            let real = real_fn!($name: fn(CUfunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut *mut c_void), else CUDA_ERROR_NOT_FOUND);
            if unthrottled() {
                // SAFETY: forwarded unchanged.
                return unsafe { real(f, gx, gy, gz, bx, by, bz, shared, stream, params) };
            }
            // SAFETY: forwarded unchanged.
            let call = || unsafe { real(f, gx, gy, gz, bx, by, bz, shared, stream, params) };
            launch_slow(f as u64, stream as usize, $ptsz, call)
        }
    };
}

launch_coop_hook!(cuLaunchCooperativeKernel, false);
launch_coop_hook!(cuLaunchCooperativeKernel_ptsz, true);

macro_rules! launch_ex_hook {
    ($name:ident, $ptsz:expr) => {
        /// # Safety
        /// cuda.h contract of the launch entry point of the same name.
        #[cfg_attr(not(test), no_mangle)]
        pub unsafe extern "C" fn $name(
            config: *const CUlaunchConfig,
            f: CUfunction,
            params: *mut *mut c_void,
            extra: *mut *mut c_void,
        ) -> u32 {
            let real = real_fn!($name: fn(*const CUlaunchConfig, CUfunction, *mut *mut c_void, *mut *mut c_void), else CUDA_ERROR_NOT_FOUND);
            if unthrottled() {
                // SAFETY: forwarded unchanged.
                return unsafe { real(config, f, params, extra) };
            }
            let stream = if config.is_null() {
                0
            } else {
                // SAFETY: the caller's launch configuration; only the stream handle is read.
                unsafe { std::ptr::addr_of!((*config).hStream).read() as usize }
            };
            // SAFETY: forwarded unchanged.
            let call = || unsafe { real(config, f, params, extra) };
            launch_slow(f as u64, stream, $ptsz, call)
        }
    };
}

launch_ex_hook!(cuLaunchKernelEx, false);
launch_ex_hook!(cuLaunchKernelEx_ptsz, true);

macro_rules! graph_launch_hook {
    ($name:ident, $ptsz:expr) => {
        /// # Safety
        /// cuda.h contract of the launch entry point of the same name.
        #[cfg_attr(not(test), no_mangle)]
        pub unsafe extern "C" fn $name(exec: CUgraphExec, stream: CUstream) -> u32 {
            let real = real_fn!($name: fn(CUgraphExec, CUstream), else CUDA_ERROR_NOT_FOUND);
            if unthrottled() {
                // SAFETY: forwarded unchanged.
                return unsafe { real(exec, stream) };
            }
            // SAFETY: forwarded unchanged.
            let call = || unsafe { real(exec, stream) };
            launch_slow(exec as u64, stream as usize, $ptsz, call)
        }
    };
}

graph_launch_hook!(cuGraphLaunch, false);
graph_launch_hook!(cuGraphLaunch_ptsz, true);

// ---------------------------------------------------------------------------------------------
// cuGetProcAddress: hand out the hook of exactly the variant the driver chose
// ---------------------------------------------------------------------------------------------

/// Replaces a real entry point the driver just handed out by our hook of the same export.
///
/// # Safety
/// `pfn` is null or the caller's out pointer, written by the driver.
unsafe fn substitute(rc: u32, pfn: *mut *mut c_void) {
    if rc != 0 || pfn.is_null() {
        return;
    }
    after(|| {
        // SAFETY: caller's contract.
        let p = unsafe { pfn.read() } as usize;
        if let Some(h) = crate::variants::identify(p, &real::real_addrs()) {
            // SAFETY: as above.
            unsafe { pfn.write(hook_addr(h) as *mut c_void) };
        }
    });
}

/// # Safety
/// cuda.h contract of `cuGetProcAddress`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> u32 {
    let f = real_fn!(cuGetProcAddress: fn(*const c_char, *mut *mut c_void, c_int, u64), else CUDA_ERROR_NOT_FOUND);
    // SAFETY: forwarded unchanged; `pfn` is the caller's out pointer.
    unsafe {
        let rc = f(symbol, pfn, version, flags);
        substitute(rc, pfn);
        rc
    }
}

/// # Safety
/// cuda.h contract of `cuGetProcAddress_v2`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> u32 {
    let f = real_fn!(cuGetProcAddress_v2: fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int), else CUDA_ERROR_NOT_FOUND);
    // SAFETY: forwarded unchanged; `pfn` is the caller's out pointer.
    unsafe {
        let rc = f(symbol, pfn, version, flags, status);
        substitute(rc, pfn);
        rc
    }
}

// ---------------------------------------------------------------------------------------------
// The hook table
// ---------------------------------------------------------------------------------------------

macro_rules! hook_table {
    ($($n:ident),* $(,)?) => {
        /// Address of our export for `h` (what `dlsym` and `cuGetProcAddress` hand out).
        pub fn hook_addr(h: Hook) -> usize {
            match h {
                $(Hook::$n => $n as *const () as usize,)*
            }
        }
    };
}

hook_table!(
    cuMemAlloc,
    cuMemAlloc_v2,
    cuMemAllocPitch,
    cuMemAllocPitch_v2,
    cuMemAllocManaged,
    cuMemAllocAsync,
    cuMemAllocAsync_ptsz,
    cuMemAllocFromPoolAsync,
    cuMemAllocFromPoolAsync_ptsz,
    cuMemFree,
    cuMemFree_v2,
    cuMemFreeAsync,
    cuMemFreeAsync_ptsz,
    cuMemCreate,
    cuMemRelease,
    cuArrayCreate,
    cuArrayCreate_v2,
    cuArray3DCreate,
    cuArray3DCreate_v2,
    cuArrayDestroy,
    cuMemGetInfo,
    cuMemGetInfo_v2,
    cuDeviceTotalMem,
    cuDeviceTotalMem_v2,
    cuLaunchKernel,
    cuLaunchKernel_ptsz,
    cuLaunchKernelEx,
    cuLaunchKernelEx_ptsz,
    cuLaunchCooperativeKernel,
    cuLaunchCooperativeKernel_ptsz,
    cuGraphLaunch,
    cuGraphLaunch_ptsz,
    cuGetProcAddress,
    cuGetProcAddress_v2,
    cuDevicePrimaryCtxRetain,
    cuCtxCreate,
    cuCtxCreate_v2,
    cuCtxCreate_v3,
    cuCtxCreate_v4,
    nvmlDeviceGetMemoryInfo,
    nvmlDeviceGetMemoryInfo_v2,
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_hook_has_a_distinct_export() {
        let mut addrs: Vec<usize> = Hook::ALL.iter().map(|h| hook_addr(*h)).collect();
        assert!(addrs.iter().all(|&a| a != 0));
        addrs.sort();
        addrs.dedup();
        assert_eq!(addrs.len(), Hook::COUNT);
    }
}
