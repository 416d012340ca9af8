//! The only place with `unsafe`: C ABI, raw pointers, the dynamic linker and a few syscalls.
//!
//! - [`dlsym`]: the real `dlsym` (from `dlvsym(RTLD_NEXT, …)`) and our exported `dlsym`
//!   trampoline that keeps the caller's return address for `RTLD_NEXT` semantics.
//! - [`real`]: opens the real `libcuda.so.1` / `libnvidia-ml.so.1` and resolves each real export by
//!   its exact name on that handle; safe wrappers for the helper calls the shim makes itself.
//! - [`exports`]: the `#[no_mangle]` hooks. Each body runs under `catch_unwind`; on a panic (or
//!   when the shim cannot account something) it falls back per the failure policy, calling the
//!   real function at most once.
//! - [`grant`]: maps the arbiter's grant page read-only.
//! - [`sys`]: monotonic clock, absolute sleep, `pthread_atfork`, and the leaked-pointer slot that
//!   holds the runtime (reset in a fork child without taking any lock).
//!
//! Must never: call anything that could re-enter our own `dlsym` export while resolving the real
//! `dlsym`, fall back to a global symbol look-up, or let a panic unwind into C.

pub mod dlsym;
pub mod exports;
pub mod grant;
pub mod real;
pub mod sys;
