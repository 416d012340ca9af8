//! Memory-information hooks: the driver's (or NVML's) answer, rewritten to the cap of a capped
//! device — total = min(cap, physical), free = min(physical free, cap − used).
//!
//! Must never: rewrite an answer the driver failed, or leave an out parameter half-rewritten.

use super::guard::{after, real_call, CUDA_ERROR_NOT_FOUND, NVML_ERROR_FUNCTION_NOT_FOUND};
use crate::runtime;
use crate::sys::driver;
use cudarc::driver::sys::CUdevice;
use std::ffi::{c_uint, c_void};

/// `nvmlMemory_t`.
#[repr(C)]
pub struct NvmlMemory {
    /// Total bytes.
    pub total: u64,
    /// Free bytes.
    pub free: u64,
    /// Used bytes.
    pub used: u64,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
pub struct NvmlMemoryV2 {
    /// Struct version (`nvmlMemory_v2`).
    pub version: c_uint,
    /// Total bytes.
    pub total: u64,
    /// Bytes reserved by the driver.
    pub reserved: u64,
    /// Free bytes.
    pub free: u64,
    /// Used bytes (total − free − reserved).
    pub used: u64,
}

/// The capped view of the current device: `(free, total)` from the physical values, or `None`
/// when nothing is capped there.
fn capped_info(dev: Option<usize>, free: u64, total: u64) -> Option<(u64, u64)> {
    let rt = runtime::enforcing()?;
    let dev = dev.or_else(driver::ctx_device)?;
    if rt.cap(dev) == u64::MAX {
        return None;
    }
    rt.ensure_context_charged(dev);
    Some(rt.virtual_info(dev, free, total))
}

/// # Safety
/// cuda.h contract of `cuMemGetInfo` (32-bit ABI).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo(free: *mut c_uint, total: *mut c_uint) -> u32 {
    let real = real_call!(cuMemGetInfo: fn(*mut c_uint, *mut c_uint)(free, total), else CUDA_ERROR_NOT_FOUND);
    let rc = real();
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
    let real = real_call!(cuMemGetInfo_v2: fn(*mut usize, *mut usize)(free, total), else CUDA_ERROR_NOT_FOUND);
    let rc = real();
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
    Some(rt.cap(dev)).filter(|&c| c != u64::MAX)
}

/// # Safety
/// cuda.h contract of `cuDeviceTotalMem` (32-bit ABI).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem(bytes: *mut c_uint, dev: CUdevice) -> u32 {
    let real = real_call!(cuDeviceTotalMem: fn(*mut c_uint, CUdevice)(bytes, dev), else CUDA_ERROR_NOT_FOUND);
    let rc = real();
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
    let real = real_call!(cuDeviceTotalMem_v2: fn(*mut usize, CUdevice)(bytes, dev), else CUDA_ERROR_NOT_FOUND);
    let rc = real();
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
    let ord = driver::cuda_ordinal_of_nvml(device as usize)?;
    capped_info(Some(ord), free, total)
}

/// # Safety
/// nvml.h contract of `nvmlDeviceGetMemoryInfo`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(device: *mut c_void, mem: *mut NvmlMemory) -> u32 {
    let real = real_call!(nvmlDeviceGetMemoryInfo: fn(*mut c_void, *mut NvmlMemory)(device, mem), else NVML_ERROR_FUNCTION_NOT_FOUND);
    let rc = real();
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
    let real = real_call!(nvmlDeviceGetMemoryInfo_v2: fn(*mut c_void, *mut NvmlMemoryV2)(device, mem), else NVML_ERROR_FUNCTION_NOT_FOUND);
    let rc = real();
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
