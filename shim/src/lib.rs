//! # smore-shim
//!
//! `libsmore_shim.so`, LD_PRELOADed into serverless function processes only. It owns the per-process
//! enforcement of what the arbiter (or the standalone environment contract) grants: the device
//! memory cap and the SM time share.
//!
//! Layout: everything that touches raw pointers, C ABI or the dynamic linker lives under [`ffi`]
//! (`ffi::dlsym` — the `dlsym` trampoline and the real `dlsym`; `ffi::real` — the real driver's
//! entry points; `ffi::exports` — the `#[no_mangle]` hooks; `ffi::sys` — clocks, sleep, stderr,
//! fork). Everything else is safe Rust: [`config`] (env contract), [`limits`] (the atomic view of
//! caps and shares), [`ledger`] (memory accounting), [`gate`] (launch pacing and cost table),
//! [`variants`] (the hooked export table), [`log`] (rate-limited stderr), [`runtime`] (glue),
//! [`watch`] (the arbiter watcher thread: re-registration after an arbiter restart).
//!
//! Must never: crash, hang or corrupt its host process; let a panic cross the FFI boundary; take a
//! lock, allocate or make a syscall on the unthrottled launch path; recurse through `dlsym`; write
//! to stdout.

#![deny(unsafe_op_in_unsafe_fn)]

pub mod arbiter;
pub mod config;
pub mod ffi;
pub mod gate;
pub mod ledger;
pub mod limits;
pub mod log;
pub mod runtime;
pub mod variants;
pub mod watch;
