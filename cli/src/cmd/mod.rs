//! The operator-facing commands that talk to a running arbiter: `run`, `status`, `top`, `share`;
//! and `cdi`, which describes the node's smore devices to container runtimes.
pub mod cdi;
pub mod run;
pub mod status;
