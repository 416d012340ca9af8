//! Launch hooks: straight to the driver unless a device is throttled (the fast path: two loads,
//! no lock, no allocation, no syscall); otherwise through the runtime's gate.
//!
//! Must never: lock, allocate or make a syscall before knowing a device is throttled.

use super::guard::{guarded, real_call, OnPanic, CUDA_ERROR_NOT_FOUND};
use crate::limits;
use crate::runtime;
use cudarc::driver::sys::{CUfunction, CUgraphExec, CUlaunchConfig, CUstream, CUDA_LAUNCH_PARAMS};
use std::ffi::{c_uint, c_void};

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
            let real = real_call!($name: fn(CUfunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut *mut c_void, *mut *mut c_void)(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra), else CUDA_ERROR_NOT_FOUND);
            if unthrottled() {
                return real();
            }
            launch_slow(f as u64, stream as usize, $ptsz, real)
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
            let real = real_call!($name: fn(CUfunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut *mut c_void)(f, gx, gy, gz, bx, by, bz, shared, stream, params), else CUDA_ERROR_NOT_FOUND);
            if unthrottled() {
                return real();
            }
            launch_slow(f as u64, stream as usize, $ptsz, real)
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
            let real = real_call!($name: fn(*const CUlaunchConfig, CUfunction, *mut *mut c_void, *mut *mut c_void)(config, f, params, extra), else CUDA_ERROR_NOT_FOUND);
            if unthrottled() {
                return real();
            }
            let stream = if config.is_null() {
                0
            } else {
                // SAFETY: the caller's launch configuration; only the stream handle is read.
                unsafe { std::ptr::addr_of!((*config).hStream).read() as usize }
            };
            launch_slow(f as u64, stream, $ptsz, real)
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
            let real = real_call!($name: fn(CUgraphExec, CUstream)(exec, stream), else CUDA_ERROR_NOT_FOUND);
            if unthrottled() {
                return real();
            }
            launch_slow(exec as u64, stream as usize, $ptsz, real)
        }
    };
}

graph_launch_hook!(cuGraphLaunch, false);
graph_launch_hook!(cuGraphLaunch_ptsz, true);

/// # Safety
/// cuda.h contract of `cuLaunchCooperativeKernelMultiDevice` (deprecated since CUDA 11.3, still
/// exported). Gated as one launch of the first entry's kernel on the current device, measured on
/// its stream: the kernels of one such launch run together, so holding the launch holds them all.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuLaunchCooperativeKernelMultiDevice(
    list: *mut CUDA_LAUNCH_PARAMS,
    n: c_uint,
    flags: c_uint,
) -> u32 {
    let real = real_call!(cuLaunchCooperativeKernelMultiDevice: fn(*mut CUDA_LAUNCH_PARAMS, c_uint, c_uint)(list, n, flags), else CUDA_ERROR_NOT_FOUND);
    if unthrottled() || list.is_null() || n == 0 {
        return real();
    }
    // SAFETY: `list` holds `n` ≥ 1 launch descriptions (the caller's contract); only the first
    // entry's function and stream are read.
    let (f, stream) = unsafe {
        (
            std::ptr::addr_of!((*list).function).read(),
            std::ptr::addr_of!((*list).hStream).read(),
        )
    };
    launch_slow(f as u64, stream as usize, false, real)
}
