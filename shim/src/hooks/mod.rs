//! The `#[no_mangle]` hooks: strong definitions of every hooked driver and NVML export (what a
//! program linked with `-lcuda` binds to, and what `dlsym` / `cuGetProcAddress` hand out through
//! [`hook_addr`]).
//!
//! The top layer: thin entry points, split by API family — [`memory`] (allocations and frees),
//! [`info`] (memory information), [`context`] (context footprint), [`graph`] (graph memory
//! nodes), [`launch`] (kernel and graph launches), [`resolution`] (`cuGetProcAddress`, `dlsym`). They decide nothing themselves: the
//! runtime does; a hook turns C arguments into Rust values and back.
//!
//! Each hook forwards to the real export of exactly its own name and ABI (`real_call!`, resolved
//! by `sys::driver`), with the same arguments. Allocation hooks reserve before the call and commit or roll back
//! after it; free hooks always call the driver first and credit only what it freed; info hooks
//! rewrite the driver's answer to the cap; launch hooks go straight to the driver unless a device
//! is throttled (the fast path: two relaxed loads, no lock, no allocation, no syscall).
//!
//! Every body runs under `catch_unwind` (`guard::guarded`): on a panic the real function is called
//! if it was not called yet (never twice), except that an allocation under the fail-closed policy
//! is refused. Must never: let a panic unwind into C, call the real function twice, or leave a
//! driver out parameter half-rewritten.
//!
//! Unit tests of this crate are built without `#[no_mangle]` (`cfg_attr(not(test), …)`): a test
//! executable must not interpose `dlsym` or the driver on itself.

// The hooks carry the driver's own names (cuda.h / nvml.h spelling is the ABI).
#![allow(non_snake_case)]

pub mod context;
pub mod graph;
mod guard;
pub mod info;
pub mod launch;
pub mod memory;
pub mod resolution;

pub use resolution::hook_addr;
