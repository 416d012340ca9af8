//! The operator-facing commands that talk to a running arbiter: `run`, `status`, `top`, `share`.
pub mod run;
pub mod status;
