//! smore on Kubernetes (docs/kubernetes.md, "Device plugin and scheduler extender").
//!
//! Owns: the cluster side of placement — the kube-scheduler extender ([`extender`]) that filters
//! and scores nodes for function pods with the node policy's own Algorithm 1, the node table it
//! decides on ([`nodes`], polled from each arbiter's `GET /status`), what a function pod asks
//! for ([`resources`]), the extender's HTTP endpoint ([`server`]) and its benchmark ([`bench`]).
//!
//! Must never: place a pod on a node whose state it does not have (unreachable or stale arbiters
//! are filtered out with the reason; pods stay pending), touch a pod that requests no smore
//! resource (training pods are never seen: kube-scheduler's `managedResources` sends only
//! function pods, and any other pod passes untouched), or re-implement a rule of Algorithm 1.

pub mod bench;
pub mod device_plugin;
pub mod extender;
pub mod nodes;
pub mod resources;
pub mod server;
