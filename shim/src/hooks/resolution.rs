//! Symbol-resolution hooks: `cuGetProcAddress(_v2)` hands out the hook of exactly the variant the
//! driver chose; the exported `dlsym` trampoline hands out a hook for a driver symbol looked up on
//! a specific handle and otherwise tail-jumps to the real `dlsym` (`sys::dlsym`).
//!
//! Our exported `dlsym` is a naked trampoline: it saves the arguments, asks `decide` for a hook,
//! and if there is none *tail-jumps* to the real `dlsym` with the caller's return address still
//! in place — glibc computes `RTLD_NEXT` from that return address, so `RTLD_NEXT` callers get
//! exactly what they would get without the shim ("next" relative to the caller, not to us).
//!
//! Must never: return a hook for `RTLD_NEXT` / `RTLD_DEFAULT` look-ups (see `decide`), block, or
//! panic across the trampoline.

use super::context::*;
use super::graph::*;
use super::guard::{after, real_call, CUDA_ERROR_NOT_FOUND};
use super::info::*;
use super::launch::*;
use super::memory::*;
use crate::sys::dlsym::{real_dlsym, real_dlsym_addr, SMORE_SHIM_REAL_DLSYM};
use crate::sys::driver;
use crate::variants::{self, Hook};
use std::ffi::{c_char, c_int, c_void, CStr};

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
        if let Some(h) = crate::variants::identify(p, &driver::real_addrs()) {
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
    let real = real_call!(cuGetProcAddress: fn(*const c_char, *mut *mut c_void, c_int, u64)(symbol, pfn, version, flags), else CUDA_ERROR_NOT_FOUND);
    let rc = real();
    // SAFETY: `pfn` is the caller's out pointer (cuGetProcAddress contract), written by the
    // driver when `rc` is 0.
    unsafe { substitute(rc, pfn) };
    rc
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
    let real = real_call!(cuGetProcAddress_v2: fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int)(symbol, pfn, version, flags, status), else CUDA_ERROR_NOT_FOUND);
    let rc = real();
    // SAFETY: `pfn` is the caller's out pointer (cuGetProcAddress contract), written by the
    // driver when `rc` is 0.
    unsafe { substitute(rc, pfn) };
    rc
}

/// The trampoline's question: a hook to return for this look-up, or null for "ask the real
/// dlsym with the caller's own context".
///
/// A hook is returned only for a hooked name looked up on a specific handle whose real answer is
/// the real driver's export of exactly that name (the libcuda / libnvidia-ml handle, or a handle
/// whose dependency tree reaches it). `RTLD_DEFAULT` needs no help: the preloaded shim is first in
/// the global scope, so glibc itself answers with our export — or with another interposer's
/// that was preloaded before us, which is the correct answer. `RTLD_NEXT` is never touched.
extern "C" fn decide(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    let r = std::panic::catch_unwind(|| {
        real_dlsym_addr();
        if name.is_null() || handle.is_null() || handle == libc::RTLD_NEXT {
            return std::ptr::null_mut();
        }
        // SAFETY: dlsym's contract: `name` is a NUL-terminated string.
        let bytes = unsafe { CStr::from_ptr(name) }.to_bytes();
        let Some(hook) = variants::hook_by_name(bytes) else {
            return std::ptr::null_mut();
        };
        // Non-blocking: if another thread is mid-way through opening the driver, pass through
        // rather than wait (we may be running inside a library constructor under the loader lock).
        let Some(real) = driver::real_addr_nowait(hook) else {
            return std::ptr::null_mut();
        };
        // SAFETY: `handle` came from the caller's dlsym call (not RTLD_NEXT, checked above).
        let target = unsafe { real_dlsym(handle, name) } as usize;
        if target != 0 && target == real {
            hook_addr(hook) as *mut c_void
        } else {
            std::ptr::null_mut()
        }
    });
    r.unwrap_or(std::ptr::null_mut())
}

/// The exported `dlsym`. x86-64 SysV: rdi = handle, rsi = name; on entry rsp ≡ 8 (mod 16).
///
/// # Safety
/// `dlsym(3)`'s contract: `handle` is a `dlopen` handle or a special handle, `name` a
/// NUL-terminated string.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        "push rdi",
        "push rsi",
        // Two pushes leave rsp ≡ 8 (mod 16); realign for the call.
        "sub rsp, 8",
        "call {decide}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jz 2f",
        "ret",
        "2:",
        // Tail jump: the caller's return address is on top of the stack, as if it had called
        // the real dlsym itself.
        "jmp qword ptr [rip + {real}]",
        decide = sym decide,
        real = sym SMORE_SHIM_REAL_DLSYM,
    )
}

/// The exported `dlsym`. aarch64 AAPCS64: x0 = handle, x1 = name, x30 = return address.
///
/// # Safety
/// `dlsym(3)`'s contract, as above.
#[cfg(target_arch = "aarch64")]
#[unsafe(naked)]
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        "stp x29, x30, [sp, #-32]!",
        "mov x29, sp",
        "stp x0, x1, [sp, #16]",
        "bl {decide}",
        "cbz x0, 2f",
        "ldp x29, x30, [sp], #32",
        "ret",
        "2:",
        "ldp x0, x1, [sp, #16]",
        // Restore the caller's x30 before jumping: glibc's RTLD_NEXT reads it.
        "ldp x29, x30, [sp], #32",
        "adrp x16, {real}",
        "ldr x16, [x16, :lo12:{real}]",
        "br x16",
        decide = sym decide,
        real = sym SMORE_SHIM_REAL_DLSYM,
    )
}

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
    cuMemMap,
    cuMemUnmap,
    cuMemRetainAllocationHandle,
    cuArrayCreate,
    cuArrayCreate_v2,
    cuArray3DCreate,
    cuArray3DCreate_v2,
    cuArrayDestroy,
    cuMipmappedArrayCreate,
    cuMipmappedArrayDestroy,
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
    cuLaunchCooperativeKernelMultiDevice,
    cuGraphAddMemAllocNode,
    cuGraphInstantiate,
    cuGraphInstantiate_v2,
    cuGraphInstantiateWithFlags,
    cuGraphInstantiateWithParams,
    cuGraphExecDestroy,
    cuGraphDestroy,
    cuGetProcAddress,
    cuGetProcAddress_v2,
    cuDevicePrimaryCtxRetain,
    cuCtxCreate,
    cuCtxCreate_v2,
    cuCtxCreate_v3,
    cuCtxCreate_v4,
    cuCtxDestroy,
    cuCtxDestroy_v2,
    cuDevicePrimaryCtxRelease,
    cuDevicePrimaryCtxRelease_v2,
    cuDevicePrimaryCtxReset,
    cuDevicePrimaryCtxReset_v2,
    cuMemPoolCreate,
    cuMemPoolDestroy,
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
