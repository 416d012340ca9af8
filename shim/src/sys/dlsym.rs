//! The real `dlsym`, for the look-ups the shim makes itself and for the tail jump of the exported
//! trampoline (`hooks::resolution`).
//!
//! The real `dlsym` comes from `dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34")`, then the architecture's
//! base version (`GLIBC_2.2.5` on x86-64, `GLIBC_2.17` on aarch64) — public, versioned entry
//! points only; no glibc-private symbol (`_dl_sym`), no global look-up fallback (both broke
//! HAMi-core on new glibc, cuDNN 9, WSL2). `dlvsym` is not hooked, so resolving cannot recurse.
//!
//! Owns the one resolved address (`SMORE_SHIM_REAL_DLSYM`). Must never: resolve it through
//! anything that could reach our own exported `dlsym` (`dlsym` itself, `libloading`), or fall
//! back to a global look-up.

use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering::*};

/// The real `dlsym` (address), read by the trampoline's tail jump. Always non-zero once
/// [`real_dlsym_addr`] has returned (falls back to [`no_dlsym`] if glibc offers none).
/// Not exported (no `#[no_mangle]`): a local symbol keeps the trampoline's RIP-relative load free
/// of GOT indirection.
pub(crate) static SMORE_SHIM_REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);

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
