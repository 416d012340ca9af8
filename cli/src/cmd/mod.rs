//! The operator-facing commands: `run`, `status`, `top`, `share` talk to a running arbiter;
//! `cdi` describes the node's smore devices to container runtimes; `k8s` runs the Kubernetes
//! scheduler extender and device plugin.
pub mod cdi;
pub mod k8s;
pub mod run;
pub mod status;
