//! # smore-predictor
//!
//! Co-location degradation prediction and degradation-aware scheduling (SMORE, Liu et al., TPDS
//! 2025): the model [`catalog`] and its 12 [`features`], the co-location [`dataset`] and a
//! clearly-labelled [`synth`]etic generator, [`pairwise`] random forests, the precomputed
//! [`table`], [`multiway`] weights with online SGD, the [`predictor`] query facade, the pure
//! scheduling core [`sched`] (Algorithm 1 + SM-share sizing), and the [`cli`].
//!
//! Must never: present synthetic data as measured, let one bad observation blow up a weight, or
//! do I/O inside [`sched`].
#![forbid(unsafe_code)]

pub mod bench;
pub mod catalog;
pub mod cli;
pub mod dataset;
pub mod features;
pub mod multiway;
pub mod pairwise;
pub mod predictor;
pub mod sched;
pub mod synth;
pub mod table;

pub use features::{ModelKey, Role};
pub use predictor::Predictor;
pub use sched::{DegradationModel, Explanation, GpuSnapshot, PendingItem, SchedConfig, Scheduler};
