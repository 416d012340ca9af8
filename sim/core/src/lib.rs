//! # smore-simgpu — a simulated GPU node that CI can trust
//!
//! Owns the state that the fake `libcuda.so.1` and `libnvidia-ml.so.1` share across every process
//! of one simulated node: device descriptions, device-memory accounting, the process table, and a
//! per-device timeline on which kernels of *all* processes are scheduled the way a time-sliced GPU
//! schedules contexts (or, in MPS mode, run concurrently and slow each other down).
//!
//! The state lives in one file (`SMORE_SIM_STATE`) that every process maps `MAP_SHARED`. Counters
//! that need no ordering with others are atomics; the scheduler of each device is guarded by a
//! process-shared *robust* mutex, so a process killed while holding it does not wedge the node.
//!
//! ## Scheduling model (what "honest" means here)
//! - Each process is one context per device (two contexts of one process on one device share a
//!   scheduling identity — documented simplification).
//! - Contexts with pending work are served round-robin; the running one keeps the GPU for up to one
//!   timeslice (`SMORE_SIM_TIMESLICE_US`, default 2 ms) while others wait, and is preempted at the
//!   slice end if another context has work (compute preemption, as on Pascal and later). A context
//!   whose queue drains gives the GPU up at once.
//! - Within a context, streams are FIFO queues; the head of the highest-priority stream runs first
//!   (ties: submission order). Kernels of one context never overlap (documented simplification: a
//!   real GPU may run kernels of different streams concurrently).
//! - Event records are queue entries that complete when their context is scheduled and reaches
//!   them, so an event pair around one kernel measures that kernel's run time, not the time other
//!   contexts held the GPU — as on hardware, where the timestamp is written by the GPU front-end.
//! - The simulation advances lazily to "now" (CLOCK_MONOTONIC, shared by all processes) whenever
//!   any process submits, queries or waits; the result does not depend on who advances it.
//! - A process may have at most [`MAX_INFLIGHT_PER_PROC`] queued operations per device; further
//!   launches block, like a full push buffer on a real driver.
//! - MPS mode ([`SchedMode::Mps`], `SMORE_SIM_MODE=mps`): no time slices; the head kernel of every
//!   context with work runs at once, and with k running each progresses at 1/(1 + β·(k−1)) of its
//!   solo rate (β = `SMORE_SIM_MPS_BETA`, default 0.5 — a modelling assumption, justified at
//!   [`config::DEFAULT_MPS_BETA_PERMILLE`] and in docs/simgpu.md). Events, stream order and
//!   synchronization follow the same rules as above.
//! - Accounting, per process and device: time its kernels were running (NVML's per-process SM
//!   utilization), solo-equivalent work done, and *interference* — test-only ground truth
//!   ([`Node::truth_of`]) that NVML never shows.
//!
//! Must never: be linked into the product (it is test infrastructure), or report anything the
//! timeline and the memory ledger did not actually account.

pub mod config;
mod layout;
mod liveness;
mod lock;
pub mod node;
pub mod pidns;
mod timeline;

pub use config::{NvmlProcessUtil, SchedMode, SimConfig};
pub use layout::{MAX_DEVICES, MAX_INFLIGHT_PER_PROC, MAX_PROCS, OPS_PER_DEVICE, STREAMS_PER_PROC};
pub use node::{DeviceInfo, MemError, Node, ProcTruth, ProcUsage, SimError, UtilSample};
pub use timeline::EventStatus;

/// Nanoseconds on CLOCK_MONOTONIC: the one clock every process of a node shares.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Sleeps until the CLOCK_MONOTONIC instant `deadline_ns` (absolute, so no drift accumulates).
pub fn sleep_until(deadline_ns: u64) {
    let ts = libc::timespec {
        tv_sec: (deadline_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (deadline_ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: `ts` is a valid timespec; a null remainder pointer is allowed with TIMER_ABSTIME.
    unsafe {
        libc::clock_nanosleep(
            libc::CLOCK_MONOTONIC,
            libc::TIMER_ABSTIME,
            &ts,
            std::ptr::null_mut(),
        )
    };
}
