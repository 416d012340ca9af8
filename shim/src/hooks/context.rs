//! Context hooks: every context a function creates costs device memory, so each one's footprint
//! is charged against the cap while it lives (`Runtime::create_context`) and credited when the
//! driver destroys it (`cuCtxDestroy`, the primary context's last release or a reset).
//!
//! A context on a GPU the grant does not cover is refused before the driver is asked (issue 12
//! item 9; docs/shim.md, "Devices not granted").
//!
//! Must never: fail a context creation the driver granted (a context whose known footprint does
//! not fit, or on a GPU not granted, is refused *before* the driver is asked, with
//! `CUDA_ERROR_OUT_OF_MEMORY`), or credit a context the driver did not destroy.

use super::guard::{after, guarded, real_call, OnPanic, CUDA_ERROR_NOT_FOUND};
use crate::runtime;
use crate::sys::driver;
use cudarc::driver::sys::{CUcontext, CUdevice};
use std::ffi::{c_int, c_uint, c_void};

/// Creates a context on `dev` through `real`, charging its footprint; `pctx` receives it.
fn create(dev: CUdevice, primary: bool, pctx: *mut CUcontext, real: impl Fn() -> u32) -> u32 {
    guarded(OnPanic::Real, real, |call| {
        match (runtime::enforcing(), usize::try_from(dev)) {
            (Some(rt), Ok(d)) => rt.create_context(d, primary, || {
                let rc = call();
                let ctx = if rc == 0 && !pctx.is_null() {
                    // SAFETY: `pctx` is the caller's out pointer, written by the driver on success.
                    unsafe { pctx.read() as u64 }
                } else {
                    0
                };
                (rc, ctx)
            }),
            _ => call(),
        }
    })
}

/// Credits a context the driver destroyed (`primary`: device `key`'s primary context).
fn destroyed(rc: u32, primary: bool, key: u64) -> u32 {
    if rc == 0 {
        after(|| {
            if let Some(rt) = runtime::enforcing() {
                rt.context_destroyed(primary, key);
            }
        });
    }
    rc
}

/// After a primary-context release: credits it if that was the last reference.
fn primary_released(rc: u32, dev: CUdevice) -> u32 {
    match usize::try_from(dev) {
        Ok(d) if rc == 0 && driver::primary_ctx_active(d) == Some(false) => {
            destroyed(rc, true, d as u64)
        }
        _ => rc,
    }
}

/// # Safety
/// cuda.h contract of `cuDevicePrimaryCtxRetain`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> u32 {
    let real = real_call!(cuDevicePrimaryCtxRetain: fn(*mut CUcontext, CUdevice)(pctx, dev), else CUDA_ERROR_NOT_FOUND);
    create(dev, true, pctx, real)
}

/// # Safety
/// cuda.h contract of `cuCtxCreate`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuCtxCreate(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> u32 {
    let real = real_call!(cuCtxCreate: fn(*mut CUcontext, c_uint, CUdevice)(pctx, flags, dev), else CUDA_ERROR_NOT_FOUND);
    create(dev, false, pctx, real)
}

/// # Safety
/// cuda.h contract of `cuCtxCreate_v2`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v2(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> u32 {
    let real = real_call!(cuCtxCreate_v2: fn(*mut CUcontext, c_uint, CUdevice)(pctx, flags, dev), else CUDA_ERROR_NOT_FOUND);
    create(dev, false, pctx, real)
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
    let real = real_call!(cuCtxCreate_v3: fn(*mut CUcontext, *mut c_void, c_int, c_uint, CUdevice)(pctx, params, n, flags, dev), else CUDA_ERROR_NOT_FOUND);
    create(dev, false, pctx, real)
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
    let real = real_call!(cuCtxCreate_v4: fn(*mut CUcontext, *mut c_void, c_uint, CUdevice)(pctx, params, flags, dev), else CUDA_ERROR_NOT_FOUND);
    create(dev, false, pctx, real)
}

/// # Safety
/// cuda.h contract of `cuCtxDestroy`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuCtxDestroy(ctx: CUcontext) -> u32 {
    let real = real_call!(cuCtxDestroy: fn(CUcontext)(ctx), else CUDA_ERROR_NOT_FOUND);
    destroyed(real(), false, ctx as u64)
}

/// # Safety
/// cuda.h contract of `cuCtxDestroy_v2`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuCtxDestroy_v2(ctx: CUcontext) -> u32 {
    let real = real_call!(cuCtxDestroy_v2: fn(CUcontext)(ctx), else CUDA_ERROR_NOT_FOUND);
    destroyed(real(), false, ctx as u64)
}

/// # Safety
/// cuda.h contract of `cuDevicePrimaryCtxRelease`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease(dev: CUdevice) -> u32 {
    let real = real_call!(cuDevicePrimaryCtxRelease: fn(CUdevice)(dev), else CUDA_ERROR_NOT_FOUND);
    primary_released(real(), dev)
}

/// # Safety
/// cuda.h contract of `cuDevicePrimaryCtxRelease_v2`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> u32 {
    let real =
        real_call!(cuDevicePrimaryCtxRelease_v2: fn(CUdevice)(dev), else CUDA_ERROR_NOT_FOUND);
    primary_released(real(), dev)
}

/// # Safety
/// cuda.h contract of `cuDevicePrimaryCtxReset`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset(dev: CUdevice) -> u32 {
    let real = real_call!(cuDevicePrimaryCtxReset: fn(CUdevice)(dev), else CUDA_ERROR_NOT_FOUND);
    primary_released(real(), dev)
}

/// # Safety
/// cuda.h contract of `cuDevicePrimaryCtxReset_v2`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> u32 {
    let real = real_call!(cuDevicePrimaryCtxReset_v2: fn(CUdevice)(dev), else CUDA_ERROR_NOT_FOUND);
    primary_released(real(), dev)
}
