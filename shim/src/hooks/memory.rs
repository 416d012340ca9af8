//! Allocation and free hooks: reserve before the driver call, commit or roll back after it;
//! every free reaches the driver first and credits only what it freed.
//!
//! Owns the per-API-family sizing (pitched rows, arrays, VMM locations, pool locations). Must
//! never: call the real allocator when the reservation was refused, or credit a handle the driver
//! did not free.

use super::guard::{after, guarded, out, real_call, OnPanic, CUDA_ERROR_NOT_FOUND};
use crate::ledger::Kind;
use crate::runtime;
use crate::sys::driver;
use cudarc::driver::sys::{
    CUarray, CUdeviceptr, CUmemAllocationProp, CUmemPoolProps, CUmemoryPool, CUmipmappedArray,
    CUstream, CUDA_ARRAY3D_DESCRIPTOR, CUDA_ARRAY_DESCRIPTOR,
};
use std::ffi::{c_uint, c_void};

/// `CU_MEM_LOCATION_TYPE_DEVICE` (cuda.h).
const CU_MEM_LOCATION_TYPE_DEVICE: u32 = 1;
/// Row alignment the shim assumes for a pitched allocation's first reservation: 512 bytes, the
/// texture pitch alignment of every GPU since Fermi (cudaDeviceProp::texturePitchAlignment).
/// A larger real pitch is charged exactly after the call (see `Runtime::alloc_sized`).
const PITCH_ALIGN: u64 = 512;

/// `CUDA_ARRAY_DESCRIPTOR_v1` (cuda.h, CUDA < 3.2 ABI): 32-bit extents.
#[repr(C)]
pub struct ArrayDescV1 {
    /// Width in elements.
    pub width: c_uint,
    /// Height in elements (0 for 1D).
    pub height: c_uint,
    /// `CUarray_format`.
    pub format: c_uint,
    /// Channels per element.
    pub channels: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR_v1`.
#[repr(C)]
pub struct Array3DDescV1 {
    /// Width in elements.
    pub width: c_uint,
    /// Height in elements (0 for 1D).
    pub height: c_uint,
    /// Depth in elements (0 for 1D/2D).
    pub depth: c_uint,
    /// `CUarray_format`.
    pub format: c_uint,
    /// Channels per element.
    pub channels: c_uint,
    /// `CUDA_ARRAY3D_*` flags.
    pub flags: c_uint,
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

/// # Safety
/// cuda.h contract of `cuMemAlloc` (CUDA < 3.2 ABI: 32-bit pointer and size).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuMemAlloc(dptr: *mut c_uint, bytes: c_uint) -> u32 {
    let real =
        real_call!(cuMemAlloc: fn(*mut c_uint, c_uint)(dptr, bytes), else CUDA_ERROR_NOT_FOUND);
    // SAFETY: `dptr` is the caller's out pointer.
    alloc(None, bytes as u64, Kind::Ptr, real, |rc| unsafe {
        out(rc, dptr)
    })
}

/// # Safety
/// cuda.h contract of `cuMemAlloc_v2`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytes: usize) -> u32 {
    let real = real_call!(cuMemAlloc_v2: fn(*mut CUdeviceptr, usize)(dptr, bytes), else CUDA_ERROR_NOT_FOUND);
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
                driver::mem_free(key, v1);
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
    let real = real_call!(cuMemAllocPitch: fn(*mut c_uint, *mut c_uint, c_uint, c_uint, c_uint)(dptr, pitch, width, height, elem), else CUDA_ERROR_NOT_FOUND);
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
    let real = real_call!(cuMemAllocPitch_v2: fn(*mut CUdeviceptr, *mut usize, usize, usize, c_uint)(dptr, pitch, width, height, elem), else CUDA_ERROR_NOT_FOUND);
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
    let real = real_call!(cuMemAllocManaged: fn(*mut CUdeviceptr, usize, c_uint)(dptr, bytes, flags), else CUDA_ERROR_NOT_FOUND);
    // SAFETY: `dptr` is the caller's out pointer.
    alloc(None, bytes as u64, Kind::Ptr, real, |rc| unsafe {
        out(rc, dptr)
    })
}

/// A stream-ordered allocation from `pool` (`None`: the device's current pool) around `real`:
/// the pool is charged what it reserves (`Runtime::pool_alloc`).
#[inline(always)]
fn alloc_from_pool(
    pool: Option<u64>,
    bytes: usize,
    dptr: *mut CUdeviceptr,
    stream: CUstream,
    ptsz: bool,
    real: impl Fn() -> u32,
) -> u32 {
    guarded(OnPanic::Alloc, real, |call| match runtime::enforcing() {
        None => call(),
        Some(rt) => rt.pool_alloc(
            pool,
            bytes as u64,
            || {
                let rc = call();
                // SAFETY: `dptr` is the caller's out pointer, written by the driver on success.
                (rc, unsafe { out(rc, dptr) })
            },
            |ptr| {
                driver::mem_free_async(ptr, stream as usize, ptsz);
            },
        ),
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
    let real = real_call!(cuMemAllocAsync: fn(*mut CUdeviceptr, usize, CUstream)(dptr, bytes, stream), else CUDA_ERROR_NOT_FOUND);
    alloc_from_pool(None, bytes, dptr, stream, false, real)
}

/// # Safety
/// cuda.h contract of `cuMemAllocAsync_ptsz`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(
    dptr: *mut CUdeviceptr,
    bytes: usize,
    stream: CUstream,
) -> u32 {
    let real = real_call!(cuMemAllocAsync_ptsz: fn(*mut CUdeviceptr, usize, CUstream)(dptr, bytes, stream), else CUDA_ERROR_NOT_FOUND);
    alloc_from_pool(None, bytes, dptr, stream, true, real)
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
    let real = real_call!(cuMemAllocFromPoolAsync: fn(*mut CUdeviceptr, usize, CUmemoryPool, CUstream)(dptr, bytes, pool, stream), else CUDA_ERROR_NOT_FOUND);
    alloc_from_pool(Some(pool as u64), bytes, dptr, stream, false, real)
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
    let real = real_call!(cuMemAllocFromPoolAsync_ptsz: fn(*mut CUdeviceptr, usize, CUmemoryPool, CUstream)(dptr, bytes, pool, stream), else CUDA_ERROR_NOT_FOUND);
    alloc_from_pool(Some(pool as u64), bytes, dptr, stream, true, real)
}

/// # Safety
/// cuda.h contract of `cuMemPoolCreate`. A pool located on a device is charged there.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuMemPoolCreate(
    pool: *mut CUmemoryPool,
    props: *const CUmemPoolProps,
) -> u32 {
    let real = real_call!(cuMemPoolCreate: fn(*mut CUmemoryPool, *const CUmemPoolProps)(pool, props), else CUDA_ERROR_NOT_FOUND);
    let rc = guarded(OnPanic::Real, real, |call| call());
    if rc != 0 || pool.is_null() || props.is_null() {
        return rc;
    }
    // SAFETY: `props` is the caller's CUmemPoolProps; the location type is read as its u32 (never
    // as a Rust enum a foreign value could make invalid), the id as a plain int. `pool` is the
    // caller's out pointer, written by the driver on success.
    let (ty, id, handle) = unsafe {
        (
            std::ptr::addr_of!((*props).location.type_)
                .cast::<u32>()
                .read(),
            std::ptr::addr_of!((*props).location.id).read(),
            pool.read() as u64,
        )
    };
    on_success(rc, |rt| {
        if ty == CU_MEM_LOCATION_TYPE_DEVICE && id >= 0 {
            rt.pool_created(handle, id as usize);
        }
    })
}

/// # Safety
/// cuda.h contract of `cuMemPoolDestroy`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuMemPoolDestroy(pool: CUmemoryPool) -> u32 {
    let real = real_call!(cuMemPoolDestroy: fn(CUmemoryPool)(pool), else CUDA_ERROR_NOT_FOUND);
    let rc = guarded(OnPanic::Real, real, |call| call());
    on_success(rc, |rt| rt.pool_destroyed(pool as u64))
}

/// # Safety
/// cuda.h contract of `cuMemFree` (32-bit ABI).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuMemFree(ptr: c_uint) -> u32 {
    let real = real_call!(cuMemFree: fn(c_uint)(ptr), else CUDA_ERROR_NOT_FOUND);
    freed(real(), Kind::Ptr, ptr as u64)
}

/// # Safety
/// cuda.h contract of `cuMemFree_v2`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuMemFree_v2(ptr: CUdeviceptr) -> u32 {
    let real = real_call!(cuMemFree_v2: fn(CUdeviceptr)(ptr), else CUDA_ERROR_NOT_FOUND);
    freed(real(), Kind::Ptr, ptr)
}

/// # Safety
/// cuda.h contract of `cuMemFreeAsync`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuMemFreeAsync(ptr: CUdeviceptr, stream: CUstream) -> u32 {
    let real = real_call!(cuMemFreeAsync: fn(CUdeviceptr, CUstream)(ptr, stream), else CUDA_ERROR_NOT_FOUND);
    freed(real(), Kind::Ptr, ptr)
}

/// # Safety
/// cuda.h contract of `cuMemFreeAsync_ptsz`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuMemFreeAsync_ptsz(ptr: CUdeviceptr, stream: CUstream) -> u32 {
    let real = real_call!(cuMemFreeAsync_ptsz: fn(CUdeviceptr, CUstream)(ptr, stream), else CUDA_ERROR_NOT_FOUND);
    freed(real(), Kind::Ptr, ptr)
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
    let real = real_call!(cuMemCreate: fn(*mut u64, usize, *const CUmemAllocationProp, u64)(handle, size, prop, flags), else CUDA_ERROR_NOT_FOUND);
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
/// cuda.h contract of `cuMemRelease`. Drops one reference to the handle; the physical memory is
/// credited once no reference and no mapping is left (the driver frees it only then).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuMemRelease(handle: u64) -> u32 {
    let real = real_call!(cuMemRelease: fn(u64)(handle), else CUDA_ERROR_NOT_FOUND);
    freed(real(), Kind::Vmm, handle)
}

/// Runs `f` on the enforcing runtime after a successful driver call.
#[inline(always)]
fn on_success(rc: u32, f: impl FnOnce(&runtime::Runtime)) -> u32 {
    if rc == 0 {
        after(|| {
            if let Some(rt) = runtime::enforcing() {
                f(rt);
            }
        });
    }
    rc
}

/// # Safety
/// cuda.h contract of `cuMemMap`. A mapping keeps the handle's physical memory alive.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuMemMap(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: u64,
    flags: u64,
) -> u32 {
    let real = real_call!(cuMemMap: fn(CUdeviceptr, usize, usize, u64, u64)(ptr, size, offset, handle, flags), else CUDA_ERROR_NOT_FOUND);
    let rc = guarded(OnPanic::Real, real, |call| call());
    on_success(rc, |rt| rt.ledger.vmm_mapped(ptr, size as u64, handle))
}

/// # Safety
/// cuda.h contract of `cuMemUnmap`. Credits a handle whose last mapping this was, if it was
/// released already.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> u32 {
    let real = real_call!(cuMemUnmap: fn(CUdeviceptr, usize)(ptr, size), else CUDA_ERROR_NOT_FOUND);
    let rc = guarded(OnPanic::Real, real, |call| call());
    on_success(rc, |rt| {
        rt.ledger.vmm_unmapped(ptr, size as u64);
    })
}

/// # Safety
/// cuda.h contract of `cuMemRetainAllocationHandle`. Each retained handle needs one more
/// `cuMemRelease` before the driver frees the memory.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuMemRetainAllocationHandle(handle: *mut u64, addr: *mut c_void) -> u32 {
    let real = real_call!(cuMemRetainAllocationHandle: fn(*mut u64, *mut c_void)(handle, addr), else CUDA_ERROR_NOT_FOUND);
    let rc = guarded(OnPanic::Real, real, |call| call());
    // SAFETY: `handle` is the caller's out pointer, written by the driver on success.
    let key = unsafe { out(rc, handle) };
    on_success(rc, |rt| rt.ledger.vmm_retained(key))
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
    let real = real_call!(cuArrayCreate: fn(*mut CUarray, *const ArrayDescV1)(arr, desc), else CUDA_ERROR_NOT_FOUND);
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
    let real = real_call!(cuArrayCreate_v2: fn(*mut CUarray, *const CUDA_ARRAY_DESCRIPTOR)(arr, desc), else CUDA_ERROR_NOT_FOUND);
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
    let real = real_call!(cuArray3DCreate: fn(*mut CUarray, *const Array3DDescV1)(arr, desc), else CUDA_ERROR_NOT_FOUND);
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
    let real = real_call!(cuArray3DCreate_v2: fn(*mut CUarray, *const CUDA_ARRAY3D_DESCRIPTOR)(arr, desc), else CUDA_ERROR_NOT_FOUND);
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
/// cuda.h contract of `cuMipmappedArrayCreate`: charged every level's bytes.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayCreate(
    arr: *mut CUmipmappedArray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
    levels: c_uint,
) -> u32 {
    let real = real_call!(cuMipmappedArrayCreate: fn(*mut CUmipmappedArray, *const CUDA_ARRAY3D_DESCRIPTOR, c_uint)(arr, desc, levels), else CUDA_ERROR_NOT_FOUND);
    if desc.is_null() {
        // The driver refuses it; nothing to charge.
        return guarded(OnPanic::Real, real, |call| call());
    }
    // SAFETY: the caller's descriptor; fields read one by one, the format as its u32.
    let bytes = unsafe {
        runtime::mipmap_bytes(
            (*desc).Width as u64,
            (*desc).Height as u64,
            (*desc).Depth as u64,
            std::ptr::addr_of!((*desc).Format).cast::<u32>().read(),
            (*desc).NumChannels,
            levels,
        )
    };
    alloc(None, bytes, Kind::Mipmap, real, |rc| {
        if rc == 0 && !arr.is_null() {
            // SAFETY: the caller's out pointer, written by the driver on success.
            unsafe { arr.read() as u64 }
        } else {
            0
        }
    })
}

/// # Safety
/// cuda.h contract of `cuMipmappedArrayDestroy`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayDestroy(arr: CUmipmappedArray) -> u32 {
    let real =
        real_call!(cuMipmappedArrayDestroy: fn(CUmipmappedArray)(arr), else CUDA_ERROR_NOT_FOUND);
    freed(real(), Kind::Mipmap, arr as u64)
}

/// # Safety
/// cuda.h contract of `cuArrayDestroy`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuArrayDestroy(arr: CUarray) -> u32 {
    let real = real_call!(cuArrayDestroy: fn(CUarray)(arr), else CUDA_ERROR_NOT_FOUND);
    freed(real(), Kind::Array, arr as u64)
}
