//! # smore-prewarm
//!
//! Per-function request forecasting (SMORE's LS-LSTM and the HHP / LSTH / fixed keep-alive
//! baselines), the load / keep / unload policy built on the forecasts, and a trace-replay simulator
//! that measures cold-start and waste rates.
//!
//! Must never: look at the future outside the oracle baseline, or thrash a model in and out of memory.
#![forbid(unsafe_code)]

#[cfg(feature = "cli")]
pub mod cli;
pub mod forecast;
pub mod histogram;
pub mod lstm;
pub mod manager;
#[cfg(feature = "cli")]
pub mod plot;
pub mod policy;
pub mod sim;
pub mod suite;
pub mod synth;
pub mod trace;

pub use forecast::Forecaster;
pub use manager::PrewarmManager;
pub use policy::{Action, Policy, PolicySpec};
