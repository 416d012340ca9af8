//! # Fake `libcuda.so.1`
//!
//! A CUDA driver for the simulated GPU node of `smore-simgpu`. It exports the driver entry points
//! PyTorch's runtime and smore's shim use, under the real names and ABI variants (`_v2`, `_v3`,
//! `_ptsz`, `_ptds`), resolves `cuGetProcAddress(_v2)` the way the real driver does (base name +
//! `cudaVersion` + per-thread-stream flag → exact export), charges device memory in the node's
//! shared ledger, and schedules kernels on the node's shared time-sliced timeline.
//!
//! Kernel durations: a module image that is text starting with `smore-sim-module` lists
//! `<kernel> <duration_us>` lines; a function named `smore_sim_spin` takes its duration in ns from
//! `*(u64*)kernelParams[0]`; anything else runs for `SMORE_SIM_DEFAULT_KERNEL_US`.
//!
//! Device memory is not backed by host memory except managed allocations (which host code may
//! touch); copies keep stream order but move no data.
//!
//! Must never: be installed where a real driver is expected, or answer a call the way the real
//! driver would not (unknown names → `CUDA_ERROR_NOT_FOUND`, bad handles → an error, not a crash
//! when the handle is one of ours).
#![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]

mod exports;
mod procaddr;
mod state;
