//! Context-creation hooks: the first context of a capped device has its footprint charged
//! against the cap (`Runtime::ensure_context_charged`).
//!
//! Must never: fail a context creation the driver granted.

use super::guard::{after, real_call, CUDA_ERROR_NOT_FOUND};
use crate::runtime;
use cudarc::driver::sys::{CUcontext, CUdevice};
use std::ffi::{c_int, c_uint, c_void};

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
    let real = real_call!(cuDevicePrimaryCtxRetain: fn(*mut CUcontext, CUdevice)(pctx, dev), else CUDA_ERROR_NOT_FOUND);
    context_created(real(), dev)
}

/// # Safety
/// cuda.h contract of `cuCtxCreate`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuCtxCreate(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> u32 {
    let real = real_call!(cuCtxCreate: fn(*mut CUcontext, c_uint, CUdevice)(pctx, flags, dev), else CUDA_ERROR_NOT_FOUND);
    context_created(real(), dev)
}

/// # Safety
/// cuda.h contract of `cuCtxCreate_v2`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v2(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> u32 {
    let real = real_call!(cuCtxCreate_v2: fn(*mut CUcontext, c_uint, CUdevice)(pctx, flags, dev), else CUDA_ERROR_NOT_FOUND);
    context_created(real(), dev)
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
    context_created(real(), dev)
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
    context_created(real(), dev)
}
