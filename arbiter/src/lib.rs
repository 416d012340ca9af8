//! # smore-arbiter
//!
//! The node daemon (`smore arbiter`) and the operator CLI (`smore run|status|top|share`, plus the
//! `demo`, `predictor` and `prewarm` tools). The daemon owns every memory cap and SM share on the
//! node: it discovers GPUs and training processes through NVML, admits and places function
//! instances through a policy seam, writes each grant into a page only it can write, and reports
//! status and metrics.
//!
//! Layout: [`config`] (the TOML file), [`gpus`] (NVML), [`proc`] (`/proc` facts), [`grantpage`]
//! (the sealed memfd — the only `unsafe` here), [`policy`] (the seam and the fit policy),
//! [`state`] (every state transition, pure), [`server`] (sockets, threads, persistence),
//! [`metrics`], [`cli`] (client commands), [`demo`], [`artifacts`].
//!
//! Must never: touch a training process (they are observed through NVML only), hand out memory
//! beyond σ·capacity − training − other grants, or trust a client's word about who it is.

pub mod artifacts;
pub mod bench;
pub mod cli;
pub mod config;
pub mod demo;
pub mod eval;
pub mod gpus;
pub mod grantpage;
pub mod metrics;
pub mod policy;
pub mod proc;
pub mod server;
pub mod smore_policy;
pub mod state;
