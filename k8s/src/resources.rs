//! What a function pod asks smore for, and how it says so (docs/kubernetes.md, "Resources").
//!
//! Owns: the resource and annotation names, the memory unit, and reading a pod's ask out of its
//! spec. A function pod requests `smore.dev/gpu-memory` (a count of [`MEMORY_UNIT_BYTES`] units,
//! the extended resource the device plugin advertises) in one container, and declares its model
//! and latency SLO the way the shim reads them at registration: the container's `SMORE_MODEL`
//! and `SMORE_SLO_MS` environment variables (literal values), or the pod annotations
//! [`ANNOTATION_MODEL`] / [`ANNOTATION_SLO_MS`] when the variables come from elsewhere. The
//! extender therefore decides on exactly what the arbiter will be asked at registration.
//!
//! Must never: guess a model (a pod without one is refused with a message naming the variable),
//! or accept a fractional or negative memory count (Kubernetes extended resources are integers).

use crate::extender::wire::{Container, Pod};

/// The extended resource a function pod requests: GPU memory for functions, in units.
pub const RESOURCE_MEMORY: &str = "smore.dev/gpu-memory";
/// Bytes per unit of [`RESOURCE_MEMORY`]: 256 MiB. Small enough for the smallest catalog
/// function (mobilenet_v2:1, about 1 GB with its CUDA context, predictor/data/catalog.toml) to
/// waste at most a quarter unit, large enough that an 80 GiB GPU is 320 devices in ListAndWatch
/// (a node of 8 is 2 560, well under gRPC's 4 MiB message limit).
pub const MEMORY_UNIT_BYTES: u64 = 256 << 20;
/// Pod annotation declaring the function's model (`MODEL:BATCH` or `MODEL`), when the container
/// does not set `SMORE_MODEL` literally.
pub const ANNOTATION_MODEL: &str = "smore.dev/model";
/// Pod annotation declaring the function's latency SLO in ms, when the container does not set
/// `SMORE_SLO_MS` literally.
pub const ANNOTATION_SLO_MS: &str = "smore.dev/slo-ms";
/// The shim's registration variables (shim/src/client.rs reads the same names).
pub const ENV_MODEL: &str = "SMORE_MODEL";
/// See [`ENV_MODEL`].
pub const ENV_SLO_MS: &str = "SMORE_SLO_MS";
/// See [`ENV_MODEL`].
pub const ENV_FUNCTION: &str = "SMORE_FUNCTION";

/// A function pod's ask.
#[derive(Debug, Clone, PartialEq)]
pub struct FunctionRequest {
    /// Function name (`SMORE_FUNCTION`, else the container name).
    pub function: String,
    /// Model as the predictor names it (`MODEL:BATCH` or `MODEL`).
    pub model: String,
    /// Latency SLO, ms (None: the node config's `[functions] default_slo_ms`).
    pub slo_ms: Option<f64>,
    /// GPU memory, bytes (units × [`MEMORY_UNIT_BYTES`]).
    pub memory: u64,
}

/// Why a pod's ask cannot be read. Each message says what to change in the pod.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PodError {
    /// More than one container requests smore memory.
    #[error("pod {pod}: containers {first} and {second} both request {RESOURCE_MEMORY}; one function container per pod may (split the pod)")]
    TwoContainers {
        /// namespace/name.
        pod: String,
        /// First container.
        first: String,
        /// Second container.
        second: String,
    },
    /// The quantity is not a positive integer.
    #[error("pod {pod}: {RESOURCE_MEMORY} = {value:?} must be a positive integer count of 256 MiB units (e.g. \"8\" for 2 GiB)")]
    BadQuantity {
        /// namespace/name.
        pod: String,
        /// The quantity as written.
        value: String,
    },
    /// No model declared.
    #[error("pod {pod}: no model declared; set env {ENV_MODEL} (e.g. resnet50:8) on container {container} or the annotation {ANNOTATION_MODEL}")]
    NoModel {
        /// namespace/name.
        pod: String,
        /// The requesting container.
        container: String,
    },
    /// The SLO is not a positive number of milliseconds.
    #[error("pod {pod}: SLO {value:?} (env {ENV_SLO_MS} or annotation {ANNOTATION_SLO_MS}) must be a positive number of milliseconds")]
    BadSlo {
        /// namespace/name.
        pod: String,
        /// The value as written.
        value: String,
    },
}

fn env<'a>(c: &'a Container, name: &str) -> Option<&'a str> {
    c.env
        .iter()
        .find(|e| e.name == name)
        .and_then(|e| e.value.as_deref())
        .filter(|v| !v.is_empty())
}

fn units(c: &Container) -> Option<&str> {
    c.resources
        .limits
        .get(RESOURCE_MEMORY)
        .or_else(|| c.resources.requests.get(RESOURCE_MEMORY))
        .map(String::as_str)
}

/// The pod's smore ask: None when no container requests [`RESOURCE_MEMORY`] (not a smore pod:
/// the extender passes every node and scores none).
pub fn function_request(pod: &Pod) -> Result<Option<FunctionRequest>, PodError> {
    let name = format!("{}/{}", pod.metadata.namespace, pod.metadata.name);
    let mut asking = pod.spec.containers.iter().filter(|c| units(c).is_some());
    let Some(c) = asking.next() else {
        return Ok(None);
    };
    if let Some(other) = asking.next() {
        return Err(PodError::TwoContainers {
            pod: name,
            first: c.name.clone(),
            second: other.name.clone(),
        });
    }
    let raw = units(c).unwrap_or_default();
    let n: u64 = match raw.trim().parse() {
        Ok(n) if n > 0 => n,
        _ => {
            return Err(PodError::BadQuantity {
                pod: name,
                value: raw.to_string(),
            })
        }
    };
    let ann = |k: &str| {
        pod.metadata
            .annotations
            .get(k)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    };
    let Some(model) = env(c, ENV_MODEL).or_else(|| ann(ANNOTATION_MODEL)) else {
        return Err(PodError::NoModel {
            pod: name,
            container: c.name.clone(),
        });
    };
    let slo_ms = match env(c, ENV_SLO_MS).or_else(|| ann(ANNOTATION_SLO_MS)) {
        None => None,
        Some(s) => match s.trim().parse::<f64>() {
            Ok(v) if v.is_finite() && v > 0.0 => Some(v),
            _ => {
                return Err(PodError::BadSlo {
                    pod: name,
                    value: s.to_string(),
                })
            }
        },
    };
    Ok(Some(FunctionRequest {
        function: env(c, ENV_FUNCTION).unwrap_or(&c.name).to_string(),
        model: model.to_string(),
        slo_ms,
        memory: n.saturating_mul(MEMORY_UNIT_BYTES),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn env_declares_the_ask_and_units_are_256_mib() {
        let p = pod(serde_json::json!({
            "metadata": {"name": "f", "namespace": "ns"},
            "spec": {"containers": [
                {"name": "sidecar"},
                {"name": "fn", "resources": {"limits": {"smore.dev/gpu-memory": "8"}},
                 "env": [{"name": "SMORE_MODEL", "value": "resnet50:8"},
                         {"name": "SMORE_SLO_MS", "value": "50"}]}
            ]}
        }));
        let r = function_request(&p).unwrap().unwrap();
        assert_eq!(r.model, "resnet50:8");
        assert_eq!(r.slo_ms, Some(50.0));
        assert_eq!(r.memory, 2 << 30);
        assert_eq!(r.function, "fn");
    }

    #[test]
    fn annotations_stand_in_for_env_and_pods_without_the_resource_are_not_ours() {
        let p = pod(serde_json::json!({
            "metadata": {"name": "f", "annotations": {"smore.dev/model": "bert_base", "smore.dev/slo-ms": "200"}},
            "spec": {"containers": [{"name": "fn", "resources": {"requests": {"smore.dev/gpu-memory": "4"}}}]}
        }));
        let r = function_request(&p).unwrap().unwrap();
        assert_eq!((r.model.as_str(), r.slo_ms), ("bert_base", Some(200.0)));
        let trainer = pod(serde_json::json!({
            "spec": {"containers": [{"name": "t", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
        }));
        assert_eq!(function_request(&trainer).unwrap(), None);
    }

    #[test]
    fn malformed_asks_name_what_to_fix() {
        let no_model = pod(serde_json::json!({
            "spec": {"containers": [{"name": "fn", "resources": {"limits": {"smore.dev/gpu-memory": "1"}}}]}
        }));
        let e = function_request(&no_model).unwrap_err().to_string();
        assert!(
            e.contains("SMORE_MODEL") && e.contains("smore.dev/model"),
            "{e}"
        );
        let frac = pod(serde_json::json!({
            "spec": {"containers": [{"name": "fn", "resources": {"limits": {"smore.dev/gpu-memory": "1.5"}}}]}
        }));
        assert!(matches!(
            function_request(&frac),
            Err(PodError::BadQuantity { .. })
        ));
        let two = pod(serde_json::json!({
            "spec": {"containers": [
                {"name": "a", "resources": {"limits": {"smore.dev/gpu-memory": "1"}}},
                {"name": "b", "resources": {"limits": {"smore.dev/gpu-memory": "1"}}}]}
        }));
        assert!(matches!(
            function_request(&two),
            Err(PodError::TwoContainers { .. })
        ));
        let slo = pod(serde_json::json!({
            "spec": {"containers": [{"name": "fn", "resources": {"limits": {"smore.dev/gpu-memory": "1"}},
                "env": [{"name": "SMORE_MODEL", "value": "x"}, {"name": "SMORE_SLO_MS", "value": "-3"}]}]}
        }));
        assert!(matches!(
            function_request(&slo),
            Err(PodError::BadSlo { .. })
        ));
    }
}
