//! # smore-arbiter
//!
//! The node daemon and the `smore` CLI. It owns every memory cap and SM share on the node: reads the
//! per-node config, discovers GPUs and training processes through NVML, admits and places function
//! instances, writes grants, watches what really happens, and reports status and metrics.
//!
//! Must never: touch a training process, trust what a client says about itself over what the kernel
//! (SO_PEERCRED) and NVML say, or let a grant over-commit a GPU's memory.

pub mod artifacts;
pub mod demo;
