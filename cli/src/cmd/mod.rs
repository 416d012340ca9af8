//! The operator-facing commands: `run`, `status`, `top`, `share` talk to a running arbiter; `k8s`
//! runs the Kubernetes scheduler extender.
pub mod k8s;
pub mod run;
pub mod status;
