//! # smore-arbiter
//!
//! The node daemon behind `smore arbiter`, as a library (the `smore` binary in `cli/` parses
//! arguments and calls [`server::Daemon`]). The daemon owns every memory cap and SM share on the
//! node: it discovers GPUs and training processes through NVML, admits and places function
//! instances through a policy seam, writes each grant into a page only it can write, and reports
//! status and metrics.
//!
//! Layout: [`config`] (the TOML file), [`gpus`] (NVML), [`proc`] (`/proc` facts), [`grantpage`]
//! (the sealed memfd — the only `unsafe` here), [`policy`] (the seam and the fit policy),
//! [`state`] (every state transition, pure), [`server`] (sockets, threads, persistence),
//! [`lineage`] (functions' descendants from the kernel's fork events), [`metrics`], [`cdi`] (the Container Device Interface spec `smore cdi generate` writes). The demo, benchmarks and the offline evaluation live in their own crates
//! (`demo/`, `eval/`), so the daemon links neither plotting nor process-spawning code.
//!
//! Must never: touch a training process (they are observed through NVML only), hand out memory
//! beyond σ·capacity − training − other grants, or trust a client's word about who it is.

#![warn(missing_docs)]

pub mod budget;
pub mod cdi;
pub mod config;
pub mod gpus;
pub mod grantpage;
pub mod harvest;
pub mod lifecycle;
pub mod lineage;
pub mod metrics;
pub mod policy;
pub mod proc;
pub mod server;
pub mod smore_policy;
pub mod state;
