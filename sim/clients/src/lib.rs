//! # smore-sim-clients
//!
//! Small programs that drive a CUDA driver — the simulated one in CI, a real one on a GPU node —
//! the three ways real programs reach it (see [`driver`]), used by smore's end-to-end tests,
//! benchmarks and demo:
//!
//! - `sim-trainer`: iterations of long kernels + a sync each, printing per-iteration wall and
//!   event-timed GPU times; `--profile low|moderate|high` presets (the serverful training job
//!   smore protects; it runs without the shim).
//! - `sim-function`: requests of a few short kernels, arriving singly or in bursts, printing each
//!   request's service time and end-to-end latency (a serverless inference function).
//! - `sim-probe` / `sim-probe-linked`: a scriptable client whose operations (allocation paths,
//!   frees, memory info, launches, graphs) print one parseable line each.
//!
//! - [`dispatch`]: the board on which a study's function instances take turns on the GPU
//!   (`smore demo --serialize`).
//!
//! Must never: assume it talks to the simulator — every call goes through the driver ABI.

pub mod dispatch;
#[allow(non_snake_case)]
pub mod driver;
pub mod probe;

/// CLOCK_MONOTONIC now, ns: the simulator's clock, and the clock the study tools (the phase
/// oracle, the dispatch board) compare with it.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec to a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
