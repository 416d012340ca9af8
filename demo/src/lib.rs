//! # smore-demo
//!
//! `smore demo` and `smore bench shim|arbiter|reclaim|escapes`: whole-node runs that start an arbiter, an
//! unmodified training job and functions under `smore run` on the simulated GPU (or, with
//! `--gpu`, a real one), and report what a user judges smore by — utilization, training slowdown,
//! function latency against SLOs, deadline satisfaction — or what an operator pays for it.
//!
//! Layout: [`demo`] (orchestration, printed report), [`plot`] (the PNG), [`scenario`] (what
//! each scenario runs: trainer shape, functions, trace), [`report`] (the figures' definitions),
//! [`bench`] (figures printed by benchmarks), [`reclaim`] (the memory growth / reclaim scenario), [`escapes`] (over-commit, kill-release and
//! restart figures of issue 12).
//!
//! Must never: be linked into the daemon (it spawns processes and draws plots), or report a
//! figure from the simulated GPU without saying so.
#![forbid(unsafe_code)]

pub mod bench;
pub mod demo;
pub mod escapes;
pub mod plot;
pub mod reclaim;
pub mod report;
pub mod scenario;
