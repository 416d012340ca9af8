//! `dlsym` interposition.
//!
//! The real `dlsym` comes from `dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34")`, then the architecture's
//! base version (`GLIBC_2.2.5` on x86-64, `GLIBC_2.17` on aarch64) — public, versioned entry
//! points only; no glibc-private symbol (`_dl_sym`), no global look-up fallback (both broke
//! HAMi-core on new glibc, cuDNN 9, WSL2). `dlvsym` is not hooked, so resolving cannot recurse.
//!
//! Our exported `dlsym` is a naked trampoline: it saves the arguments, asks [`decide`] for a hook,
//! and if there is none *tail-jumps* to the real `dlsym` with the caller's return address still
//! in place — glibc computes `RTLD_NEXT` from that return address, so `RTLD_NEXT` callers get
//! exactly what they would get without the shim ("next" relative to the caller, not to us).
//!
//! Must never: return a hook for `RTLD_NEXT` / `RTLD_DEFAULT` look-ups (see [`decide`]), block, or
//! panic across the trampoline.

use crate::variants;
use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering::*};

/// The real `dlsym` (address), read by the trampoline's tail jump. Always non-zero once
/// [`decide`] has returned (falls back to [`no_dlsym`] if glibc offers none).
/// Not exported: a local symbol keeps the trampoline's RIP-relative load free of GOT indirection.
static SMORE_SHIM_REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// Stand-in when no real `dlsym` could be found (never seen on glibc): every look-up fails.
extern "C" fn no_dlsym(_h: *mut c_void, _n: *const c_char) -> *mut c_void {
    std::ptr::null_mut()
}

#[cfg(target_arch = "x86_64")]
const BASE_VERSION: &CStr = c"GLIBC_2.2.5";
#[cfg(target_arch = "aarch64")]
const BASE_VERSION: &CStr = c"GLIBC_2.17";

/// Resolves the real `dlsym` once; returns its address.
pub fn real_dlsym_addr() -> usize {
    let a = SMORE_SHIM_REAL_DLSYM.load(Acquire);
    if a != 0 {
        return a;
    }
    let mut found = 0usize;
    for ver in [c"GLIBC_2.34", BASE_VERSION] {
        // SAFETY: dlvsym with RTLD_NEXT and NUL-terminated literals; it only reads them.
        let p = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), ver.as_ptr()) };
        if !p.is_null() {
            found = p as usize;
            break;
        }
    }
    if found == 0 {
        found = no_dlsym as DlsymFn as usize;
    }
    // Racing initialisers store the same value.
    SMORE_SHIM_REAL_DLSYM.store(found, Release);
    found
}

/// Calls the real `dlsym` (for look-ups the shim makes itself; never with `RTLD_NEXT`, whose
/// answer would be relative to the shim).
///
/// # Safety
/// `handle` must be a handle from `dlopen` or `RTLD_DEFAULT`; `name` a NUL-terminated string.
pub unsafe fn real_dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    // SAFETY: the address is glibc's dlsym (or `no_dlsym`), both with this signature.
    let f: DlsymFn = unsafe { std::mem::transmute::<usize, DlsymFn>(real_dlsym_addr()) };
    // SAFETY: arguments as required by the caller's contract.
    unsafe { f(handle, name) }
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
        let Some(real) = super::real::real_addr_nowait(hook) else {
            return std::ptr::null_mut();
        };
        // SAFETY: `handle` came from the caller's dlsym call (not RTLD_NEXT, checked above).
        let target = unsafe { real_dlsym(handle, name) } as usize;
        if target != 0 && target == real {
            super::exports::hook_addr(hook) as *mut c_void
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
