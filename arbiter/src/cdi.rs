//! Container Device Interface (CDI) specs for smore devices: what `smore cdi generate` writes to
//! `/etc/cdi` or `/var/run/cdi`, where containerd, CRI-O and podman read it
//! (`--device smore.dev/gpu=0`; docs/kubernetes.md).
//!
//! A smore device is "a GPU as a function may use it beside a training job": the container gets
//! the shim (`libsmore_shim.so`, bind-mounted read-only and preloaded), the arbiter's socket
//! directory (so the shim registers and receives its grant page), the node's failure policy, and
//! the GPU's device nodes. Nothing runs at container creation, so the spec has no hooks: the
//! preload names an absolute path and needs no linker cache.
//!
//! The shim is mounted from the very file the arbiter takes for genuine
//! ([`smore_protocol::install::find`]): a bind mount keeps its device and inode, which is how the
//! watchdog recognises it in `/proc/<pid>/maps` of a containerised function.
//!
//! Owns: the spec's types (the subset of the CDI schema smore emits), [`generate`] (one rule for
//! what a smore device contains) and [`validate`] (the CDI schema's naming and shape rules, so a
//! runtime never finds a spec it would reject). Must never: emit a mount whose host path does not
//! exist, a device node that is not there, or a spec that [`validate`] rejects.

use crate::config::FailurePolicy;
use serde::{Deserialize, Serialize};
use smore_protocol::wire::ENV_GPUS;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// CDI version the spec declares. 0.5.0 is the oldest version with everything emitted here
/// (`hostPath` of device nodes, device names starting with a digit: CDI SPEC.md, "Released
/// versions"); runtimes accept any version up to the one they implement, so the oldest keeps
/// older runtimes (podman 4.3 in Debian 12) working.
pub const CDI_VERSION: &str = "0.5.0";
/// Default kind: `<vendor>/<class>` of the devices.
pub const DEFAULT_KIND: &str = "smore.dev/gpu";
/// Name of the device that stands for every GPU of the node.
pub const ALL_DEVICES: &str = "all";
/// Where the shim and the simulated driver appear inside the container.
pub const CONTAINER_LIB_DIR: &str = "/usr/local/lib/smore";
/// Where the arbiter's socket directory appears inside the container (the default socket's
/// directory, so `smore` tools inside the container find it without configuration).
pub const CONTAINER_SOCKET_DIR: &str = "/run/smore";
/// File name of the shim.
pub const SHIM_FILE: &str = "libsmore_shim.so";
/// Mount options of everything smore mounts read-only: a bind mount that cannot be written,
/// carry set-uid programs or expose device files.
pub const RO_BIND: [&str; 4] = ["ro", "nosuid", "nodev", "bind"];
/// Mount options of the simulated GPU's state directory: its state file is mapped shared and
/// written by every process on the node.
pub const RW_BIND: [&str; 4] = ["rw", "nosuid", "nodev", "bind"];

/// A CDI spec (the fields smore emits; field names as the CDI JSON schema spells them).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Spec {
    /// CDI version the document complies with.
    pub cdi_version: String,
    /// `<vendor>/<class>`, e.g. `smore.dev/gpu`.
    pub kind: String,
    /// The devices a container may ask for.
    pub devices: Vec<Device>,
    /// Edits made when any device of the spec is requested.
    pub container_edits: ContainerEdits,
}

/// One device (`<kind>=<name>`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Device {
    /// The device's name: the GPU's NVML index, or [`ALL_DEVICES`].
    pub name: String,
    /// Edits made when this device is requested.
    pub container_edits: ContainerEdits,
}

/// Changes a runtime makes to the container's OCI spec.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ContainerEdits {
    /// `NAME=value` entries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Device nodes to create.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
    /// Mounts to add.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
}

/// A device node in the container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeviceNode {
    /// Path in the container.
    pub path: String,
    /// Path on the host (the runtime reads type, major and minor from it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<String>,
    /// Cgroup access: `rw` (read and write; no `m`: the container creates no device files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<String>,
}

/// A bind mount.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Mount {
    /// Source on the host.
    pub host_path: String,
    /// Destination in the container.
    pub container_path: String,
    /// OCI mount options.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

/// The GPU device nodes present on the host.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceNodes {
    /// `/dev/nvidia<index>` per NVML index.
    pub per_gpu: BTreeMap<u32, PathBuf>,
    /// Nodes every GPU process needs (`/dev/nvidiactl`, `/dev/nvidia-uvm`, …).
    pub shared: Vec<PathBuf>,
}

/// Nodes every CUDA process opens besides its GPU's (names from the NVIDIA driver's `/dev`).
pub const SHARED_NODES: [&str; 4] = [
    "nvidiactl",
    "nvidia-uvm",
    "nvidia-uvm-tools",
    "nvidia-modeset",
];

impl DeviceNodes {
    /// The NVIDIA nodes under `dev` (normally `/dev`) for `gpus`; nodes that do not exist are
    /// left out (a node without `nvidia-modeset` still runs CUDA; the simulated GPU has none).
    pub fn discover(dev: &Path, gpus: &[u32]) -> DeviceNodes {
        let per_gpu = gpus
            .iter()
            .map(|&i| (i, dev.join(format!("nvidia{i}"))))
            .filter(|(_, p)| p.exists())
            .collect();
        let shared = SHARED_NODES
            .iter()
            .map(|n| dev.join(n))
            .filter(|p| p.exists())
            .collect();
        DeviceNodes { per_gpu, shared }
    }
}

/// The simulated GPU's files a container needs (docs/simgpu.md): its fake driver libraries and
/// the directory of the node's shared state file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimFiles {
    /// The fake `libcuda.so.1` (the file, symlinks resolved).
    pub cuda: PathBuf,
    /// The fake `libnvidia-ml.so.1` (the file, symlinks resolved).
    pub nvml: PathBuf,
    /// `SMORE_SIM_STATE`: the node's state file.
    pub state: PathBuf,
}

/// What a spec is generated from.
#[derive(Debug, Clone)]
pub struct Inputs {
    /// `<vendor>/<class>`.
    pub kind: String,
    /// NVML indices of the GPUs the arbiter manages.
    pub gpus: Vec<u32>,
    /// Host path of the shim the arbiter takes for genuine.
    pub shim: PathBuf,
    /// Host path of the arbiter's socket.
    pub socket: PathBuf,
    /// The node's failure policy (`SMORE_FAILURE` in the container).
    pub failure: FailurePolicy,
    /// The GPU device nodes present.
    pub nodes: DeviceNodes,
    /// The simulated GPU's files, when the node's GPUs are simulated.
    pub sim: Option<SimFiles>,
}

/// Why a spec cannot be generated or is invalid. Each message says what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CdiError {
    /// The kind is not `<vendor>/<class>` with CDI's naming rules.
    #[error("kind {0:?} is not `<vendor>/<class>` (vendor: a DNS name such as smore.dev; class: letters, digits, `-`, `_`, `.`, starting with a letter): choose another --kind")]
    Kind(String),
    /// A device name breaks CDI's rules.
    #[error("device name {0:?} is not valid in CDI (letters, digits, `-`, `_`, `.`, `:`; starting and ending with a letter or digit)")]
    DeviceName(String),
    /// Two devices share a name.
    #[error("device {0:?} appears twice in the spec")]
    DuplicateDevice(String),
    /// A device changes nothing in the container (runtimes refuse such a spec whole).
    #[error("device {0:?} has no container edits: its GPU has no /dev/nvidia<index> node — is the NVIDIA driver loaded?")]
    EmptyDevice(String),
    /// The spec has no device.
    #[error("the spec has no device: the arbiter manages no GPU (check `smore status` or [gpus] indices)")]
    NoDevices,
    /// An environment entry is not `NAME=value`.
    #[error("environment entry {0:?} is not NAME=value")]
    Env(String),
    /// A path that must be absolute is not.
    #[error("{what} path {path:?} is not absolute")]
    RelativePath {
        /// Which path.
        what: &'static str,
        /// The path.
        path: String,
    },
    /// A file the spec mounts does not exist.
    #[error("{what} {path:?} does not exist: {hint}")]
    Missing {
        /// What it is.
        what: &'static str,
        /// Where it was looked for.
        path: PathBuf,
        /// What to do.
        hint: &'static str,
    },
    /// A path is not valid UTF-8 (CDI specs are JSON strings).
    #[error("path {0:?} is not valid UTF-8: CDI specs hold UTF-8 strings; move the file")]
    NotUtf8(PathBuf),
    /// The CDI version is not `MAJOR.MINOR.PATCH`.
    #[error("cdiVersion {0:?} is not MAJOR.MINOR.PATCH")]
    Version(String),
}

fn text(p: &Path) -> Result<String, CdiError> {
    p.to_str()
        .map(str::to_owned)
        .ok_or_else(|| CdiError::NotUtf8(p.to_path_buf()))
}

fn exists(what: &'static str, p: &Path, hint: &'static str) -> Result<(), CdiError> {
    if p.exists() {
        Ok(())
    } else {
        Err(CdiError::Missing {
            what,
            path: p.to_path_buf(),
            hint,
        })
    }
}

fn ro_mount(host: &Path, container: &str) -> Result<Mount, CdiError> {
    Ok(Mount {
        host_path: text(host)?,
        container_path: container.to_owned(),
        options: RO_BIND.iter().map(|s| s.to_string()).collect(),
    })
}

fn node(p: &Path) -> Result<DeviceNode, CdiError> {
    let t = text(p)?;
    Ok(DeviceNode {
        path: t.clone(),
        host_path: Some(t),
        permissions: Some("rw".into()),
    })
}

/// The spec for `inp` (validated). Devices: one per GPU (its NVML index) and [`ALL_DEVICES`].
///
/// Spec-wide edits (any smore device): the shim mounted at `CONTAINER_LIB_DIR/libsmore_shim.so`
/// and preloaded, the socket's directory mounted at [`CONTAINER_SOCKET_DIR`] with
/// `SMORE_ARBITER_SOCKET` naming the socket there, `SMORE_FAILURE`, the shared device nodes, and
/// on the simulated GPU its libraries (`LD_LIBRARY_PATH`) and state directory (`SMORE_SIM_STATE`).
/// Per device: the GPUs it gives in `SMORE_GPUS` (the arbiter places the function among them
/// alone), their nodes, and on the simulated GPU (which has no nodes to hide GPUs by)
/// `CUDA_VISIBLE_DEVICES`.
pub fn generate(inp: &Inputs) -> Result<Spec, CdiError> {
    exists(
        "the shim",
        &inp.shim,
        "build it (`cargo build -p smore-shim`) or install smore",
    )?;
    let socket_dir = inp
        .socket
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .ok_or_else(|| CdiError::RelativePath {
            what: "the arbiter socket",
            path: inp.socket.display().to_string(),
        })?;
    if !socket_dir.is_absolute() {
        return Err(CdiError::RelativePath {
            what: "the arbiter socket",
            path: inp.socket.display().to_string(),
        });
    }
    exists(
        "the arbiter socket's directory",
        socket_dir,
        "start the arbiter first (it creates the directory) or fix `socket` in the config",
    )?;
    let socket_name = inp
        .socket
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| CdiError::NotUtf8(inp.socket.clone()))?;
    let shim_in = format!("{CONTAINER_LIB_DIR}/{SHIM_FILE}");
    let failure = match inp.failure {
        FailurePolicy::FailOpen => "open",
        FailurePolicy::FailClosed => "closed",
    };
    let mut edits = ContainerEdits {
        env: vec![
            format!("LD_PRELOAD={shim_in}"),
            format!(
                "{}={CONTAINER_SOCKET_DIR}/{socket_name}",
                smore_protocol::wire::ENV_SOCKET
            ),
            format!("SMORE_FAILURE={failure}"),
            // CUDA's default order is "fastest first"; the grant's page slot is the GPU's
            // position in SMORE_GPUS, which follows NVML (PCI bus) order (docs/protocol.md).
            "CUDA_DEVICE_ORDER=PCI_BUS_ID".into(),
        ],
        device_nodes: inp
            .nodes
            .shared
            .iter()
            .map(|p| node(p))
            .collect::<Result<_, _>>()?,
        mounts: vec![
            ro_mount(&inp.shim, &shim_in)?,
            // The directory, not the socket: a restarted arbiter replaces the socket file, and
            // a mount of the old file would keep pointing at nothing. Read-only is enough to
            // connect (a socket's access is checked on the inode, not on the mount).
            ro_mount(socket_dir, CONTAINER_SOCKET_DIR)?,
        ],
    };
    if let Some(sim) = &inp.sim {
        exists(
            "the simulated libcuda",
            &sim.cuda,
            "build the workspace (`cargo build -p smore-simgpu-cuda`)",
        )?;
        exists(
            "the simulated libnvidia-ml",
            &sim.nvml,
            "build the workspace (`cargo build -p smore-simgpu-nvml`)",
        )?;
        let state_dir = sim
            .state
            .parent()
            .filter(|d| d.is_absolute())
            .ok_or_else(|| CdiError::RelativePath {
                what: "SMORE_SIM_STATE",
                path: sim.state.display().to_string(),
            })?;
        exists(
            "the simulated GPU's state directory",
            state_dir,
            "create the node first (any simulated-GPU program, or the arbiter, creates it)",
        )?;
        let lib = format!("{CONTAINER_LIB_DIR}/sim");
        edits
            .mounts
            .push(ro_mount(&sim.cuda, &format!("{lib}/libcuda.so.1"))?);
        edits
            .mounts
            .push(ro_mount(&sim.nvml, &format!("{lib}/libnvidia-ml.so.1"))?);
        let dir = text(state_dir)?;
        edits.mounts.push(Mount {
            host_path: dir.clone(),
            container_path: dir,
            options: RW_BIND.iter().map(|s| s.to_string()).collect(),
        });
        edits.env.push(format!("LD_LIBRARY_PATH={lib}"));
        edits
            .env
            .push(format!("SMORE_SIM_STATE={}", text(&sim.state)?));
    }
    let nodes_of = |i: u32| -> Result<Vec<DeviceNode>, CdiError> {
        inp.nodes
            .per_gpu
            .get(&i)
            .map(|p| node(p))
            .into_iter()
            .collect()
    };
    // The GPUs a device gives, in the order the container sees them as CUDA ordinals: the
    // shim sends them with its registration, and the arbiter places it among them alone.
    let given = |gpus: &[u32]| -> Result<ContainerEdits, CdiError> {
        let list: Vec<String> = gpus.iter().map(u32::to_string).collect();
        let mut e = ContainerEdits {
            env: vec![format!("{ENV_GPUS}={}", list.join(","))],
            ..Default::default()
        };
        for &i in gpus {
            e.device_nodes.extend(nodes_of(i)?);
        }
        if inp.sim.is_some() {
            // The simulated GPU has no nodes to hide GPUs by: its driver reads this.
            e.env
                .push(format!("CUDA_VISIBLE_DEVICES={}", list.join(",")));
        }
        Ok(e)
    };
    let mut devices = Vec::new();
    for &i in &inp.gpus {
        devices.push(Device {
            name: i.to_string(),
            container_edits: given(&[i])?,
        });
    }
    if !inp.gpus.is_empty() {
        devices.push(Device {
            name: ALL_DEVICES.into(),
            container_edits: given(&inp.gpus)?,
        });
    }
    let spec = Spec {
        cdi_version: CDI_VERSION.into(),
        kind: inp.kind.clone(),
        devices,
        container_edits: edits,
    };
    validate(&spec)?;
    Ok(spec)
}

fn alnum(c: char) -> bool {
    c.is_ascii_alphanumeric()
}

/// Whether `s` is a DNS subdomain (RFC 1123 labels separated by dots, ≤ 253 characters): the
/// vendor part of a CDI kind.
fn dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && l.starts_with(alnum)
                && l.ends_with(alnum)
        })
}

/// Whether `s` is a CDI class name: starts with a letter, ends with a letter or digit, letters,
/// digits, `-`, `_`, `.` between, ≤ 63 characters.
fn class_name(s: &str) -> bool {
    s.len() <= 63
        && s.starts_with(|c: char| c.is_ascii_alphabetic())
        && s.ends_with(alnum)
        && s.chars().all(|c| alnum(c) || matches!(c, '-' | '_' | '.'))
}

/// Whether `s` is a CDI device name: starts and ends with a letter or digit; letters, digits,
/// `-`, `_`, `.`, `:` between.
fn device_name(s: &str) -> bool {
    s.starts_with(alnum)
        && s.ends_with(alnum)
        && s.chars()
            .all(|c| alnum(c) || matches!(c, '-' | '_' | '.' | ':'))
}

/// Checks a kind string (`<vendor>/<class>`).
pub fn validate_kind(kind: &str) -> Result<(), CdiError> {
    match kind.split_once('/') {
        Some((vendor, class)) if dns_subdomain(vendor) && class_name(class) => Ok(()),
        _ => Err(CdiError::Kind(kind.into())),
    }
}

fn validate_edits(e: &ContainerEdits) -> Result<(), CdiError> {
    for v in &e.env {
        match v.split_once('=') {
            Some((k, _)) if !k.is_empty() => {}
            _ => return Err(CdiError::Env(v.clone())),
        }
    }
    let abs = |what: &'static str, p: &str| {
        if p.starts_with('/') {
            Ok(())
        } else {
            Err(CdiError::RelativePath {
                what,
                path: p.into(),
            })
        }
    };
    for n in &e.device_nodes {
        abs("device node", &n.path)?;
        if let Some(h) = &n.host_path {
            abs("device node host", h)?;
        }
    }
    for m in &e.mounts {
        abs("mount host", &m.host_path)?;
        abs("mount container", &m.container_path)?;
    }
    Ok(())
}

/// Checks `spec` against the CDI schema's rules for what smore emits: the version is
/// `MAJOR.MINOR.PATCH`, the kind and device names follow CDI's naming rules, device names are
/// unique and there is at least one, environment entries are `NAME=value`, and every path is
/// absolute.
pub fn validate(spec: &Spec) -> Result<(), CdiError> {
    let parts: Vec<&str> = spec.cdi_version.split('.').collect();
    if parts.len() != 3
        || parts
            .iter()
            .any(|p| p.is_empty() || !p.chars().all(|c| c.is_ascii_digit()))
    {
        return Err(CdiError::Version(spec.cdi_version.clone()));
    }
    validate_kind(&spec.kind)?;
    if spec.devices.is_empty() {
        return Err(CdiError::NoDevices);
    }
    let mut seen = std::collections::BTreeSet::new();
    for d in &spec.devices {
        if !device_name(&d.name) {
            return Err(CdiError::DeviceName(d.name.clone()));
        }
        if !seen.insert(d.name.as_str()) {
            return Err(CdiError::DuplicateDevice(d.name.clone()));
        }
        if d.container_edits == ContainerEdits::default() {
            return Err(CdiError::EmptyDevice(d.name.clone()));
        }
        validate_edits(&d.container_edits)?;
    }
    validate_edits(&spec.container_edits)
}

/// The spec as a runtime reads it (pretty JSON, ending with a newline).
pub fn to_json(spec: &Spec) -> String {
    // Plain strings and vectors: serialising cannot fail.
    let mut s = serde_json::to_string_pretty(spec).unwrap_or_default();
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host layout in a temporary directory: a shim file, a socket directory, fake device
    /// nodes (plain files: only their existence is read here) and the simulated GPU's files.
    struct Host {
        dir: tempfile::TempDir,
    }

    impl Host {
        fn new() -> Host {
            let dir = tempfile::tempdir().unwrap();
            for f in [
                "lib/libsmore_shim.so",
                "sim/libcuda.so",
                "sim/libnvidia_ml.so",
            ] {
                let p = dir.path().join(f);
                std::fs::create_dir_all(p.parent().unwrap()).unwrap();
                std::fs::write(p, b"").unwrap();
            }
            for d in ["run/smore", "dev", "simstate"] {
                std::fs::create_dir_all(dir.path().join(d)).unwrap();
            }
            Host { dir }
        }

        fn p(&self, rel: &str) -> PathBuf {
            self.dir.path().join(rel)
        }

        fn inputs(&self, gpus: &[u32]) -> Inputs {
            Inputs {
                kind: DEFAULT_KIND.into(),
                gpus: gpus.to_vec(),
                shim: self.p("lib/libsmore_shim.so"),
                socket: self.p("run/smore/arbiter.sock"),
                failure: FailurePolicy::FailClosed,
                nodes: DeviceNodes::discover(&self.p("dev"), gpus),
                sim: None,
            }
        }
    }

    fn env_of<'a>(e: &'a ContainerEdits, key: &str) -> Option<&'a str> {
        e.env
            .iter()
            .find_map(|v| v.strip_prefix(key)?.strip_prefix('='))
    }

    #[test]
    fn a_real_node_gets_one_device_per_gpu_plus_all_with_its_nodes_and_the_shim() {
        let h = Host::new();
        for n in ["nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"] {
            std::fs::write(h.p("dev").join(n), b"").unwrap();
        }
        let spec = generate(&h.inputs(&[0, 1])).unwrap();
        assert_eq!(spec.kind, "smore.dev/gpu");
        let names: Vec<&str> = spec.devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["0", "1", "all"]);
        let nodes = |d: &Device| -> Vec<String> {
            d.container_edits
                .device_nodes
                .iter()
                .map(|n| n.path.rsplit('/').next().unwrap().to_owned())
                .collect()
        };
        assert_eq!(nodes(&spec.devices[0]), ["nvidia0"]);
        assert_eq!(nodes(&spec.devices[1]), ["nvidia1"]);
        assert_eq!(nodes(&spec.devices[2]), ["nvidia0", "nvidia1"]);
        // The missing nodes (nvidia-uvm-tools, nvidia-modeset) are left out.
        let shared: Vec<&str> = spec
            .container_edits
            .device_nodes
            .iter()
            .map(|n| n.path.rsplit('/').next().unwrap())
            .collect();
        assert_eq!(shared, ["nvidiactl", "nvidia-uvm"]);
        let e = &spec.container_edits;
        assert_eq!(
            env_of(e, "LD_PRELOAD"),
            Some("/usr/local/lib/smore/libsmore_shim.so")
        );
        assert_eq!(
            env_of(e, "SMORE_ARBITER_SOCKET"),
            Some("/run/smore/arbiter.sock")
        );
        assert_eq!(env_of(e, "SMORE_FAILURE"), Some("closed"));
        assert_eq!(env_of(e, "CUDA_DEVICE_ORDER"), Some("PCI_BUS_ID"));
        let shim = &e.mounts[0];
        assert_eq!(
            shim.host_path,
            h.p("lib/libsmore_shim.so").to_str().unwrap()
        );
        assert_eq!(shim.options, ["ro", "nosuid", "nodev", "bind"]);
        assert_eq!(e.mounts[1].host_path, h.p("run/smore").to_str().unwrap());
        assert_eq!(e.mounts[1].container_path, "/run/smore");
        assert_eq!(
            env_of(&spec.devices[1].container_edits, "SMORE_GPUS"),
            Some("1")
        );
        assert_eq!(
            env_of(&spec.devices[2].container_edits, "SMORE_GPUS"),
            Some("0,1")
        );
        // A real GPU is hidden by its nodes: no CUDA_VISIBLE_DEVICES.
        assert!(spec
            .devices
            .iter()
            .all(|d| env_of(&d.container_edits, "CUDA_VISIBLE_DEVICES").is_none()));
        // What a runtime reads parses back to the same spec.
        let back: Spec = serde_json::from_str(&to_json(&spec)).unwrap();
        assert_eq!(back, spec);
        let v: serde_json::Value = serde_json::from_str(&to_json(&spec)).unwrap();
        assert_eq!(v["cdiVersion"], "0.5.0");
        assert!(v["devices"][0]["containerEdits"]["deviceNodes"][0]["hostPath"].is_string());
        assert!(v["containerEdits"]["mounts"][0]["containerPath"].is_string());
    }

    #[test]
    fn a_simulated_node_mounts_its_driver_and_state_and_picks_gpus_by_environment() {
        let h = Host::new();
        let mut inp = h.inputs(&[0, 1]);
        inp.sim = Some(SimFiles {
            cuda: h.p("sim/libcuda.so"),
            nvml: h.p("sim/libnvidia_ml.so"),
            state: h.p("simstate/node.state"),
        });
        let spec = generate(&inp).unwrap();
        let e = &spec.container_edits;
        assert!(e.device_nodes.is_empty());
        assert_eq!(
            env_of(e, "LD_LIBRARY_PATH"),
            Some("/usr/local/lib/smore/sim")
        );
        let state = h.p("simstate/node.state");
        assert_eq!(env_of(e, "SMORE_SIM_STATE"), state.to_str());
        let targets: Vec<&str> = e.mounts.iter().map(|m| m.container_path.as_str()).collect();
        assert!(targets.contains(&"/usr/local/lib/smore/sim/libcuda.so.1"));
        assert!(targets.contains(&"/usr/local/lib/smore/sim/libnvidia-ml.so.1"));
        let rw = e
            .mounts
            .iter()
            .find(|m| m.options[0] == "rw")
            .expect("the state directory is writable");
        assert_eq!(rw.host_path, h.p("simstate").to_str().unwrap());
        assert_eq!(
            env_of(&spec.devices[1].container_edits, "CUDA_VISIBLE_DEVICES"),
            Some("1")
        );
        assert_eq!(
            env_of(&spec.devices[2].container_edits, "CUDA_VISIBLE_DEVICES"),
            Some("0,1"),
            "all: every GPU"
        );
    }

    #[test]
    fn missing_files_and_bad_names_are_refused_with_what_to_do() {
        let h = Host::new();
        let mut inp = h.inputs(&[0]);
        inp.shim = h.p("lib/nope.so");
        assert!(matches!(
            generate(&inp),
            Err(CdiError::Missing {
                what: "the shim",
                ..
            })
        ));
        let mut inp = h.inputs(&[0]);
        inp.socket = h.p("gone/arbiter.sock");
        assert!(matches!(generate(&inp), Err(CdiError::Missing { .. })));
        let mut inp = h.inputs(&[0]);
        inp.socket = "arbiter.sock".into();
        assert!(matches!(generate(&inp), Err(CdiError::RelativePath { .. })));
        assert_eq!(generate(&h.inputs(&[])), Err(CdiError::NoDevices));
        for bad in [
            "gpu",
            "smore.dev/",
            "/gpu",
            "Smore.dev/gpu",
            "smore.dev/gpu/x",
            "smore..dev/gpu",
            "-smore.dev/gpu",
            "smore.dev/1gpu",
            "smore.dev/gpu-",
        ] {
            let mut inp = h.inputs(&[0]);
            inp.kind = bad.into();
            assert_eq!(generate(&inp), Err(CdiError::Kind(bad.into())), "{bad}");
        }
        for good in ["smore.dev/gpu", "test-42.smore.dev/gpu_share.v1", "x/y"] {
            assert_eq!(validate_kind(good), Ok(()), "{good}");
        }
    }

    #[test]
    fn the_validator_enforces_names_uniqueness_env_and_absolute_paths() {
        let h = Host::new();
        let ok = generate(&h.inputs(&[0, 1])).unwrap();
        let broken = |f: &dyn Fn(&mut Spec)| {
            let mut s = ok.clone();
            f(&mut s);
            validate(&s).unwrap_err()
        };
        assert_eq!(
            broken(&|s| s.devices[1].name = "0".into()),
            CdiError::DuplicateDevice("0".into())
        );
        assert_eq!(
            broken(&|s| s.devices[0].name = "gpu 0".into()),
            CdiError::DeviceName("gpu 0".into())
        );
        assert_eq!(
            broken(&|s| s.devices[0].name = "-0".into()),
            CdiError::DeviceName("-0".into())
        );
        assert_eq!(
            broken(&|s| s.container_edits.env.push("NOVALUE".into())),
            CdiError::Env("NOVALUE".into())
        );
        assert_eq!(
            broken(&|s| s.container_edits.env.push("=x".into())),
            CdiError::Env("=x".into())
        );
        assert!(matches!(
            broken(&|s| s.container_edits.mounts[0].container_path = "lib/x.so".into()),
            CdiError::RelativePath { .. }
        ));
        assert!(matches!(
            broken(&|s| s.cdi_version = "0.5".into()),
            CdiError::Version(_)
        ));
        assert!(matches!(
            broken(&|s| s.devices.clear()),
            CdiError::NoDevices
        ));
        assert_eq!(
            broken(&|s| s.devices[1].container_edits = ContainerEdits::default()),
            CdiError::EmptyDevice("1".into()),
            "runtimes refuse a device without edits"
        );
        // Device names CDI allows since 0.5.0 (a leading digit) and with its other characters.
        let mut s = ok.clone();
        s.devices[0].name = "0:mig-1.a_b".into();
        assert_eq!(validate(&s), Ok(()));
        // Unknown fields are refused when reading a spec back: the types are the schema.
        let j = to_json(&ok).replacen("\"kind\"", "\"kinds\"", 1);
        assert!(serde_json::from_str::<Spec>(&j).is_err());
    }
}
