//! The kube-scheduler extender protocol's JSON, as `k8s.io/kube-scheduler/extender/v1` encodes it.
//!
//! Owns: the wire types of the `filter` and `prioritize` verbs and the few fields of `v1.Pod` and
//! `v1.Node` smore reads. The upstream Go structs carry no JSON tags, so their fields travel under
//! their Go names (`Pod`, `Nodes`, `NodeNames`, `FailedNodes`, `Host`, `Score`, …); the Pod and
//! Node objects inside use the Kubernetes API's own camelCase names. tests/fixtures holds recorded
//! examples of each document.
//!
//! Must never: re-encode a Node object kube-scheduler sent (it is returned byte for byte, so no
//! field smore does not know is lost), or fail on a field it does not know.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::collections::BTreeMap;

/// Upstream `extenderv1.MaxExtenderPriority`: the top of an extender's score scale (kube-scheduler
/// multiplies by the extender's weight and by MaxNodeScore / 10).
pub const MAX_EXTENDER_PRIORITY: i64 = 10;

/// `ExtenderArgs`: the pod and its candidate nodes, for `filter` and `prioritize`.
#[derive(Debug, Deserialize)]
pub struct ExtenderArgs {
    /// The pod being scheduled.
    #[serde(rename = "Pod")]
    pub pod: Pod,
    /// Candidate nodes as full objects (the extender is not `nodeCacheCapable`).
    #[serde(rename = "Nodes", default)]
    pub nodes: Option<NodeList>,
    /// Candidate node names (the extender is `nodeCacheCapable`).
    #[serde(rename = "NodeNames", default)]
    pub node_names: Option<Vec<String>>,
}

/// `v1.NodeList` with its items kept verbatim.
#[derive(Debug, Deserialize, Serialize)]
pub struct NodeList {
    /// The Node objects, undecoded.
    #[serde(default)]
    pub items: Vec<Box<RawValue>>,
}

/// `ExtenderFilterResult`.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct ExtenderFilterResult {
    /// Nodes that may take the pod (when the request carried `Nodes`).
    #[serde(rename = "Nodes", skip_serializing_if = "Option::is_none", default)]
    pub nodes: Option<NodeList>,
    /// Names of the nodes that may take the pod (when the request carried `NodeNames`).
    #[serde(rename = "NodeNames", skip_serializing_if = "Option::is_none", default)]
    pub node_names: Option<Vec<String>>,
    /// Nodes that cannot take the pod now, with the reason (preemption may help).
    #[serde(rename = "FailedNodes", default)]
    pub failed_nodes: BTreeMap<String, String>,
    /// Nodes that cannot take the pod whatever is preempted (their arbiter is unreachable).
    #[serde(rename = "FailedAndUnresolvableNodes", default)]
    pub failed_and_unresolvable: BTreeMap<String, String>,
    /// A message when the request itself could not be handled ("" = none).
    #[serde(rename = "Error", default)]
    pub error: String,
}

/// One `HostPriority` of a `HostPriorityList` (the `prioritize` answer).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostPriority {
    /// Node name.
    #[serde(rename = "Host")]
    pub host: String,
    /// 0..=[`MAX_EXTENDER_PRIORITY`], higher is better.
    #[serde(rename = "Score")]
    pub score: i64,
}

/// The fields of `v1.Pod` smore reads.
#[derive(Debug, Default, Clone, Deserialize)]
pub struct Pod {
    /// `metadata`.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// `spec`.
    #[serde(default)]
    pub spec: PodSpec,
}

/// The fields of `metav1.ObjectMeta` smore reads.
#[derive(Debug, Default, Clone, Deserialize)]
pub struct ObjectMeta {
    /// Object name.
    #[serde(default)]
    pub name: String,
    /// Namespace (pods).
    #[serde(default)]
    pub namespace: String,
    /// UID.
    #[serde(default)]
    pub uid: String,
    /// Annotations.
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

/// The fields of `v1.PodSpec` smore reads.
#[derive(Debug, Default, Clone, Deserialize)]
pub struct PodSpec {
    /// Containers.
    #[serde(default)]
    pub containers: Vec<Container>,
}

/// The fields of `v1.Container` smore reads.
#[derive(Debug, Default, Clone, Deserialize)]
pub struct Container {
    /// Container name.
    #[serde(default)]
    pub name: String,
    /// Resource requests and limits.
    #[serde(default)]
    pub resources: Resources,
    /// Environment (literal values only; `valueFrom` entries have no `value`).
    #[serde(default)]
    pub env: Vec<EnvVar>,
}

/// `v1.ResourceRequirements` (quantities as strings).
#[derive(Debug, Default, Clone, Deserialize)]
pub struct Resources {
    /// Limits.
    #[serde(default)]
    pub limits: BTreeMap<String, String>,
    /// Requests.
    #[serde(default)]
    pub requests: BTreeMap<String, String>,
}

/// `v1.EnvVar`.
#[derive(Debug, Default, Clone, Deserialize)]
pub struct EnvVar {
    /// Variable name.
    pub name: String,
    /// Literal value (absent for `valueFrom`).
    #[serde(default)]
    pub value: Option<String>,
}

/// The fields of `v1.Node` smore reads (name and addresses).
#[derive(Debug, Default, Clone, Deserialize)]
pub struct NodeLite {
    /// `metadata`.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// `status`.
    #[serde(default)]
    pub status: NodeStatus,
}

/// The fields of `v1.NodeStatus` smore reads.
#[derive(Debug, Default, Clone, Deserialize)]
pub struct NodeStatus {
    /// `addresses`.
    #[serde(default)]
    pub addresses: Vec<NodeAddress>,
}

/// `v1.NodeAddress`.
#[derive(Debug, Default, Clone, Deserialize)]
pub struct NodeAddress {
    /// `InternalIP`, `ExternalIP`, `Hostname`, …
    #[serde(rename = "type")]
    pub kind: String,
    /// The address.
    pub address: String,
}

impl NodeLite {
    /// The address the node's arbiter is polled at: its `InternalIP`, else its `Hostname`.
    pub fn poll_address(&self) -> Option<&str> {
        let find = |k: &str| {
            self.status
                .addresses
                .iter()
                .find(|a| a.kind == k)
                .map(|a| a.address.as_str())
        };
        find("InternalIP").or_else(|| find("Hostname"))
    }
}
