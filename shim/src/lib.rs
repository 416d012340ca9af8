//! # smore-shim
//!
//! `libsmore_shim.so`, LD_PRELOADed into serverless function processes only. It owns the per-process
//! enforcement of what the arbiter (or the standalone environment contract) grants: the device
//! memory cap and the SM time share (docs/shim.md).
//!
//! ## Layers
//!
//! Modules form an acyclic stack; each uses only modules of its own or a lower layer, and where a
//! lower layer must reach up (the fork-child reset, the watcher's page swap) the upper one passes
//! a callback or a reference down.
//!
//! 1. **Pure tables and rules** (no `unsafe`, no I/O): [`variants`] (the hooked export names),
//!    [`limits`] (the atomic view of caps and shares), [`config`] (the environment contract),
//!    [`ledger`] (memory accounting), [`shared_ledger`]
//!    (the grant-wide check across the processes sharing a grant), [`gate`] (launch pacing and the cost table), [`harvest`]
//!    (contention estimate, contention bucket, calibration, usage counters), [`turns`] (the
//!    functions of a time-sliced GPU taking turns through its board).
//! 2. **Bottom layer** [`sys`]: the real `dlsym` ([`sys::dlsym`]), the real driver's entry points
//!    ([`sys::driver`]), grant-page mapping ([`sys::grant`]), libc wrappers — clocks, sleep,
//!    stderr, fds, fork registration ([`sys::os`]). Uses only [`variants`] from the crate.
//! 3. **Logging** [`log`] (rate-limited stderr over [`sys::os`]) and the opt-in per-sample trace
//!    [`trace`] (`SMORE_TRACE_SAMPLES`, a diagnostic file).
//! 4. **Arbiter client and watcher**: [`client`] (registration with the arbiter, re-registration),
//!    [`watch`] (the watcher thread that re-registers after an arbiter restart and swaps the
//!    runtime's page through the reference it is given).
//! 5. **Runtime** [`runtime`]: the per-process state and every enforcement decision.
//! 6. **Hooks** [`hooks`]: the `#[no_mangle]` entry points, thin, split by API family (memory,
//!    info, context, launch, resolution).
//!
//! How the absence of cycles was checked: every `use crate::…`, `crate::…::` and `super::…` path
//! in each file under `shim/src` is an edge from that file's module to the named module; a
//! topological sort of that graph (`python3 shim/check_layers.py`, which also checks that no
//! module imports from a higher layer than its own) finds no cycle.
//!
//! Must never: crash, hang or corrupt its host process; let a panic cross the FFI boundary; take a
//! lock, allocate or make a syscall on the unthrottled launch path; recurse through `dlsym`; write
//! to stdout.

// Lints (`unsafe_op_in_unsafe_fn`, `clippy::undocumented_unsafe_blocks`, `missing_docs`) come
// from `[workspace.lints]` in the root Cargo.toml.

pub mod client;
pub mod config;
pub mod gate;
pub mod harvest;
pub mod hooks;
pub mod ledger;
pub mod limits;
pub mod log;
pub mod runtime;
pub mod shared_ledger;
pub mod sys;
pub mod trace;
pub mod turns;
pub mod variants;
pub mod watch;
