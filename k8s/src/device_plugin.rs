//! The kubelet device plugin (API v1beta1): advertises what functions may use on each GPU as
//! `smore.dev/gpu-memory` devices and hands back the CDI device on Allocate.
//!
//! Owns: the plugin's gRPC service (GetDevicePluginOptions, ListAndWatch, GetPreferredAllocation,
//! Allocate, PreStartContainer), registration with the kubelet (`Registration.Register` over
//! `<plugin dir>/kubelet.sock`, again whenever the kubelet restarts and wipes the directory), and
//! the translation of the arbiter's status into devices:
//!
//! - one device per [`MEMORY_UNIT_BYTES`] of σ·capacity of each GPU, ID `gpu<i>-m<k>` — a stable
//!   set, so the kubelet's capacity does not move;
//! - the first ⌊(σ·capacity − training memory) / unit⌋ of them **Healthy**, the rest Unhealthy:
//!   allocatable follows what training leaves (the arbiter's `policy_view`), re-sent by
//!   ListAndWatch whenever it changes;
//! - every device Unhealthy while the arbiter is unreachable: no new function pod lands on a node
//!   whose arbiter cannot admit it (the extender filters such nodes out too).
//!
//! GetPreferredAllocation keeps a container's units on one GPU (the one with the most free units
//! that can hold them all); Allocate answers the CDI device `smore.dev/gpu=<i>` of that GPU (or
//! `smore.dev/gpu=all` when the units span GPUs, or with `cdi_all`), and the environment the shim
//! reads: `SMORE_MEMORY_LIMIT` (the units' bytes) and `SMORE_ARBITER_SOCKET`.
//!
//! Must never: advertise a device as Healthy without a fresh arbiter status, or block the gRPC
//! runtime on the arbiter's socket (status calls run on the blocking pool).

#[allow(missing_docs, clippy::all, clippy::pedantic)]
/// The generated kubelet device plugin API (proto/deviceplugin/v1beta1/api.proto, vendored).
pub mod api {
    tonic::include_proto!("v1beta1");
}

use crate::resources::{MEMORY_UNIT_BYTES, RESOURCE_MEMORY};
use api::device_plugin_server::{DevicePlugin, DevicePluginServer};
use api::registration_client::RegistrationClient;
use api::{
    AllocateRequest, AllocateResponse, CdiDevice, ContainerAllocateResponse,
    ContainerPreferredAllocationResponse, Device, DevicePluginOptions, Empty, ListAndWatchResponse,
    PreStartContainerRequest, PreStartContainerResponse, PreferredAllocationRequest,
    PreferredAllocationResponse, RegisterRequest,
};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::time::Duration;
use tokio::sync::watch;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

/// The device plugin API version this plugin speaks.
pub const API_VERSION: &str = "v1beta1";
/// The kubelet's registration socket, in the plugin directory.
pub const KUBELET_SOCKET: &str = "kubelet.sock";
/// This plugin's socket, in the plugin directory.
pub const PLUGIN_SOCKET: &str = "smore-gpu-memory.sock";
/// Default plugin directory (the kubelet's `DevicePluginPath`).
pub const DEFAULT_PLUGIN_DIR: &str = "/var/lib/kubelet/device-plugins";
/// CDI device kind of smore's devices (the names `smore cdi generate` writes).
pub const CDI_KIND: &str = "smore.dev/gpu";
/// How often the plugin checks that its socket still exists (the kubelet wipes the directory
/// when it restarts; the plugin must then serve and register again).
const SOCKET_CHECK: Duration = Duration::from_secs(1);
/// Pause before retrying a failed registration (kubelet not up yet).
const REGISTER_RETRY: Duration = Duration::from_secs(5);
/// Longest wait for the arbiter's status reply (it answers between reconciles, every 250 ms by
/// default; seconds of silence mean it is stuck).
const STATUS_TIMEOUT: Duration = Duration::from_secs(5);
/// Health values of the API (upstream constants.go).
pub const HEALTHY: &str = "Healthy";
/// See [`HEALTHY`].
pub const UNHEALTHY: &str = "Unhealthy";

/// What functions may use on one GPU, in units of [`MEMORY_UNIT_BYTES`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuBudget {
    /// NVML index.
    pub index: u32,
    /// ⌊σ·capacity / unit⌋: the devices advertised for this GPU.
    pub capacity_units: u32,
    /// ⌊(σ·capacity − training memory) / unit⌋: how many of them are Healthy.
    pub available_units: u32,
}

/// The budgets of an arbiter status snapshot (`arbiter.memory_safety`, `gpus[].policy_view`).
pub fn budgets(snapshot: &serde_json::Value) -> Result<Vec<GpuBudget>, String> {
    let sigma = snapshot["arbiter"]["memory_safety"]
        .as_f64()
        .ok_or("status snapshot without arbiter.memory_safety")?;
    let views = crate::nodes::views(snapshot)?;
    Ok(views
        .iter()
        .map(|g| {
            let limit = (g.total as f64 * sigma) as u64;
            let units = |b: u64| u32::try_from(b / MEMORY_UNIT_BYTES).unwrap_or(u32::MAX);
            GpuBudget {
                index: g.index,
                capacity_units: units(limit),
                available_units: units(limit.saturating_sub(g.training_used)),
            }
        })
        .collect())
}

/// Device ID of unit `k` of GPU `gpu`.
pub fn device_id(gpu: u32, k: u32) -> String {
    format!("gpu{gpu}-m{k}")
}

/// The GPU of a device ID made by [`device_id`].
pub fn gpu_of(id: &str) -> Option<u32> {
    let rest = id.strip_prefix("gpu")?;
    let (g, k) = rest.split_once("-m")?;
    k.parse::<u32>().ok()?;
    g.parse().ok()
}

/// The devices to advertise: budgets known ⇒ the first `available_units` of each GPU Healthy;
/// unknown (arbiter unreachable) ⇒ the last known devices, all Unhealthy.
pub fn devices(budgets: Option<&[GpuBudget]>, last: &[Device]) -> Vec<Device> {
    match budgets {
        Some(b) => b
            .iter()
            .flat_map(|g| {
                (0..g.capacity_units).map(move |k| Device {
                    id: device_id(g.index, k),
                    health: if k < g.available_units {
                        HEALTHY
                    } else {
                        UNHEALTHY
                    }
                    .to_string(),
                    topology: None,
                })
            })
            .collect(),
        None => last
            .iter()
            .map(|d| Device {
                health: UNHEALTHY.to_string(),
                ..d.clone()
            })
            .collect(),
    }
}

/// GetPreferredAllocation for one container: `size` IDs from `available`, including `must`, all
/// on one GPU when one can hold them (the one with the most available units), else spilling
/// over the GPUs with the most available units first.
pub fn preferred(available: &[String], must: &[String], size: usize) -> Vec<String> {
    let mut by_gpu: BTreeMap<u32, Vec<&String>> = BTreeMap::new();
    for id in available {
        if let Some(g) = gpu_of(id) {
            if !must.contains(id) {
                by_gpu.entry(g).or_default().push(id);
            }
        }
    }
    let mut out: Vec<String> = must.to_vec();
    let need = size.saturating_sub(out.len());
    // GPUs by preference: those the must-include IDs are on, then most free units.
    let pinned: Vec<u32> = must.iter().filter_map(|m| gpu_of(m)).collect();
    let mut order: Vec<u32> = by_gpu.keys().copied().collect();
    order.sort_by_key(|g| (!pinned.contains(g), std::cmp::Reverse(by_gpu[g].len()), *g));
    if let Some(g) = order
        .iter()
        .find(|g| by_gpu[g].len() >= need && (pinned.is_empty() || pinned.contains(g)))
    {
        out.extend(by_gpu[g].iter().take(need).map(|s| s.to_string()));
        return out;
    }
    for g in order {
        let left = size.saturating_sub(out.len());
        out.extend(by_gpu[&g].iter().take(left).map(|s| s.to_string()));
    }
    out
}

/// Allocate for one container: the CDI device and the shim's environment.
pub fn allocate_one(
    ids: &[String],
    cdi_all: bool,
    arbiter_socket: &Path,
) -> Result<ContainerAllocateResponse, Status> {
    let mut gpus: Vec<u32> = Vec::new();
    for id in ids {
        let g = gpu_of(id).ok_or_else(|| {
            Status::invalid_argument(format!("{id:?} is not a {RESOURCE_MEMORY} device ID"))
        })?;
        if !gpus.contains(&g) {
            gpus.push(g);
        }
    }
    if gpus.is_empty() {
        return Err(Status::invalid_argument("no device IDs to allocate"));
    }
    let name = match gpus.as_slice() {
        [g] if !cdi_all => format!("{CDI_KIND}={g}"),
        _ => format!("{CDI_KIND}=all"),
    };
    let bytes = ids.len() as u64 * MEMORY_UNIT_BYTES;
    let envs = HashMap::from([
        ("SMORE_MEMORY_LIMIT".to_string(), bytes.to_string()),
        (
            smore_protocol::wire::ENV_SOCKET.to_string(),
            arbiter_socket.display().to_string(),
        ),
    ]);
    Ok(ContainerAllocateResponse {
        envs,
        mounts: vec![],
        devices: vec![],
        annotations: HashMap::new(),
        cdi_devices: vec![CdiDevice { name }],
    })
}

/// The gRPC service.
#[derive(Debug, Clone)]
pub struct Plugin {
    devices: watch::Receiver<Vec<Device>>,
    cdi_all: bool,
    arbiter_socket: PathBuf,
}

type DeviceStream = Pin<Box<dyn Stream<Item = Result<ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for Plugin {
    async fn get_device_plugin_options(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(options()))
    }

    type ListAndWatchStream = DeviceStream;

    async fn list_and_watch(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let mut rx = self.devices.clone();
        let stream = async_stream(move |tx| async move {
            loop {
                let list = rx.borrow_and_update().clone();
                if tx
                    .send(Ok(ListAndWatchResponse { devices: list }))
                    .await
                    .is_err()
                    || rx.changed().await.is_err()
                {
                    return;
                }
            }
        });
        Ok(Response::new(stream))
    }

    async fn get_preferred_allocation(
        &self,
        req: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        let container_responses = req
            .into_inner()
            .container_requests
            .iter()
            .map(|c| ContainerPreferredAllocationResponse {
                device_i_ds: preferred(
                    &c.available_device_i_ds,
                    &c.must_include_device_i_ds,
                    usize::try_from(c.allocation_size).unwrap_or(0),
                ),
            })
            .collect();
        Ok(Response::new(PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        req: Request<AllocateRequest>,
    ) -> Result<Response<AllocateResponse>, Status> {
        let container_responses = req
            .into_inner()
            .container_requests
            .iter()
            .map(|c| allocate_one(&c.devices_ids, self.cdi_all, &self.arbiter_socket))
            .collect::<Result<_, _>>()?;
        Ok(Response::new(AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        _: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        Ok(Response::new(PreStartContainerResponse {}))
    }
}

/// A stream fed by a task through a bounded channel (the task ends when the kubelet hangs up).
fn async_stream<F, Fut>(f: F) -> DeviceStream
where
    F: FnOnce(tokio::sync::mpsc::Sender<Result<ListAndWatchResponse, Status>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(f(tx));
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}

fn options() -> DevicePluginOptions {
    DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: true,
    }
}

/// Device plugin settings.
#[derive(Debug, Clone)]
pub struct Options {
    /// The kubelet's device plugin directory.
    pub plugin_dir: PathBuf,
    /// Seconds between two reads of the arbiter's status.
    pub poll: Duration,
    /// Always hand out `smore.dev/gpu=all` (the arbiter then picks the GPU by Algorithm 1).
    pub cdi_all: bool,
    /// The arbiter's socket as function containers see it (CDI mounts it at the same path).
    pub arbiter_socket: PathBuf,
}

/// Where budgets come from: the arbiter's status in production, anything in tests.
pub type BudgetSource = Box<dyn FnMut() -> Result<Vec<GpuBudget>, String> + Send>;

/// Budgets from the arbiter at `socket` (`Request::Status`).
pub fn arbiter_source(socket: PathBuf) -> BudgetSource {
    Box::new(move || {
        let c = smore_protocol::conn::Client::connect(&socket)
            .map_err(|e| format!("cannot reach the arbiter at {}: {e}", socket.display()))?;
        // A hung arbiter must not leave the last (Healthy) devices advertised: the call fails
        // after this and every device goes Unhealthy.
        c.stream()
            .set_read_timeout(Some(STATUS_TIMEOUT))
            .and_then(|()| c.stream().set_write_timeout(Some(STATUS_TIMEOUT)))
            .map_err(|e| format!("arbiter socket: {e}"))?;
        match c.call(smore_protocol::wire::Request::Status) {
            Ok(smore_protocol::wire::Reply::Status { snapshot }) => budgets(&snapshot),
            Ok(other) => Err(format!("unexpected arbiter reply {other:?}")),
            Err(e) => Err(format!("arbiter status: {e}")),
        }
    })
}

/// Keeps the device list current: polls `source` every `poll` on the blocking pool.
async fn poll_budgets(mut source: BudgetSource, tx: watch::Sender<Vec<Device>>, poll: Duration) {
    loop {
        let (s, r) = match tokio::task::spawn_blocking(move || {
            let r = source();
            (source, r)
        })
        .await
        {
            Ok(v) => v,
            Err(_) => {
                // The source panicked: no status will come again, so nothing stays Healthy.
                tracing::error!(
                    "device plugin: the status source panicked; every device Unhealthy"
                );
                tx.send_modify(|cur| *cur = devices(None, cur));
                return;
            }
        };
        source = s;
        let next = match &r {
            Ok(b) => devices(Some(b), &[]),
            Err(e) => {
                tracing::warn!("device plugin: {e}; advertising every device Unhealthy");
                devices(None, &tx.borrow())
            }
        };
        tx.send_if_modified(|cur| {
            let changed = *cur != next;
            if changed {
                *cur = next;
            }
            changed
        });
        tokio::time::sleep(poll).await;
    }
}

/// Connects a gRPC channel to a Unix socket (the kubelet's, or a plugin's in tests).
pub async fn unix_channel(
    path: PathBuf,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    tonic::transport::Endpoint::from_static("http://[::]:50051")
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(path).await?,
                ))
            }
        }))
        .await
}

/// Registers this plugin with the kubelet.
pub async fn register(plugin_dir: &Path) -> Result<(), String> {
    let kubelet = plugin_dir.join(KUBELET_SOCKET);
    let ch = unix_channel(kubelet.clone())
        .await
        .map_err(|e| format!("cannot reach the kubelet at {}: {e}", kubelet.display()))?;
    RegistrationClient::new(ch)
        .register(RegisterRequest {
            version: API_VERSION.into(),
            endpoint: PLUGIN_SOCKET.into(),
            resource_name: RESOURCE_MEMORY.into(),
            options: Some(options()),
        })
        .await
        .map_err(|e| format!("the kubelet refused the registration: {}", e.message()))?;
    Ok(())
}

/// Runs the plugin until the runtime stops: serves on `<plugin_dir>/smore-gpu-memory.sock`,
/// registers, and starts over when the kubelet restarts (its directory is wiped, our socket
/// with it).
pub async fn run(opts: Options, source: BudgetSource) -> Result<(), String> {
    let (tx, rx) = watch::channel(Vec::new());
    tokio::spawn(poll_budgets(source, tx, opts.poll));
    let sock = opts.plugin_dir.join(PLUGIN_SOCKET);
    loop {
        let _ = std::fs::remove_file(&sock);
        let listener = tokio::net::UnixListener::bind(&sock)
            .map_err(|e| format!("cannot listen on {}: {e}", sock.display()))?;
        let svc = DevicePluginServer::new(Plugin {
            devices: rx.clone(),
            cdi_all: opts.cdi_all,
            arbiter_socket: opts.arbiter_socket.clone(),
        });
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
        );
        let registered = match register(&opts.plugin_dir).await {
            Ok(()) => {
                tracing::info!(
                    "device plugin: registered {RESOURCE_MEMORY} with the kubelet ({})",
                    sock.display()
                );
                true
            }
            Err(e) => {
                tracing::warn!("device plugin: {e}; retrying in {REGISTER_RETRY:?}");
                false
            }
        };
        // Registered: serve until our socket disappears (the kubelet restarted and wiped its
        // directory) or the server stops. Not registered: start over after a pause.
        loop {
            tokio::time::sleep(if registered {
                SOCKET_CHECK
            } else {
                REGISTER_RETRY
            })
            .await;
            if !registered || !sock.exists() || server.is_finished() {
                break;
            }
        }
        // Not a graceful shutdown: it would wait for the old kubelet's ListAndWatch streams,
        // which a restarted kubelet never closes. Aborting drops them.
        server.abort();
        let _ = server.await;
        if registered {
            tracing::info!("device plugin: socket gone (kubelet restart?); registering again");
        }
    }
}

/// [`run`] on a runtime of its own (the `smore k8s device-plugin` process).
pub fn run_blocking(opts: Options, source: BudgetSource) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(run(opts, source)).map_err(anyhow::Error::msg)
}
