//! What every hook shares: [`real_call!`] (the one place a hook calls the real driver), the
//! panic guard [`guarded`] with its fallback policy, and the out-parameter reader [`out`].
//!
//! Must never: call the real function twice for one hooked call, or let a panic unwind into C.

use crate::config::FailurePolicy;
use crate::runtime::{self, CUDA_ERROR_OUT_OF_MEMORY};
use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// `CUDA_ERROR_NOT_FOUND`: what a hook answers when the real driver lacks its export (only
/// reachable through direct linking against a driver older than the symbol).
pub(crate) const CUDA_ERROR_NOT_FOUND: u32 = 500;
/// `NVML_ERROR_FUNCTION_NOT_FOUND`.
pub(crate) const NVML_ERROR_FUNCTION_NOT_FOUND: u32 = 13;
/// A closure calling the real export of hook `$h` (prototype `fn($t…) -> u32`) with the hook's own
/// arguments `$a…`; returns `$none` from the enclosing hook if the driver lacks the export. The
/// one place a hook calls the real driver, so its safety argument is made once, here.
macro_rules! real_call {
    ($h:ident : fn($($t:ty),*) ($($a:expr),*), else $none:expr) => {{
        let addr = $crate::sys::driver::real_addr($crate::variants::Hook::$h);
        if addr == 0 {
            return $none;
        }
        // SAFETY: `addr` is the real export named exactly like the hook (resolved by that name
        // on the real library's handle, `sys::driver`), whose C prototype (cuda.h / nvml.h) is
        // the one spelled here; all of them return a 32-bit status code.
        let f = unsafe { std::mem::transmute::<usize, unsafe extern "C" fn($($t),*) -> u32>(addr) };
        // SAFETY: the arguments are the hook's own, passed through unchanged to the real export
        // of the same name and prototype: the hook's caller gave them under that export's
        // contract (each hook is `unsafe extern "C"` with exactly that contract).
        move || unsafe { f($($a),*) }
    }};
}
pub(crate) use real_call;

/// What a panic in a hook falls back to.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnPanic {
    /// Call the real function (if not called yet).
    Real,
    /// An allocation: refused under the fail-closed policy, else the real call.
    Alloc,
}

/// Runs `body` under `catch_unwind`. `body` gets `call`, which calls the real function at most
/// once and remembers its result; after a panic the remembered result is returned, or the real
/// function is called now (or, for allocations under fail-closed, refused).
#[inline(always)]
pub(crate) fn guarded(
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
pub(crate) fn after(f: impl FnOnce()) {
    let _ = catch_unwind(AssertUnwindSafe(f));
}

/// Reads a driver-written out parameter after a successful call (0 otherwise).
///
/// # Safety
/// `p` is null or the caller's valid out pointer.
#[inline(always)]
pub(crate) unsafe fn out<T: Copy + Into<u64>>(rc: u32, p: *const T) -> u64 {
    if rc == 0 && !p.is_null() {
        // SAFETY: caller's contract; the driver wrote it on success.
        unsafe { p.read() }.into()
    } else {
        0
    }
}
