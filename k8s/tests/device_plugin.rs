//! The device plugin against a gRPC client built from the same kubelet protos, playing the
//! kubelet: registration, ListAndWatch updates when budgets change, allocation of the CDI device.

use smore_k8s::device_plugin::api::device_plugin_client::DevicePluginClient;
use smore_k8s::device_plugin::api::registration_server::{Registration, RegistrationServer};
use smore_k8s::device_plugin::api::{
    AllocateRequest, ContainerAllocateRequest, ContainerPreferredAllocationRequest, Empty,
    ListAndWatchResponse, PreferredAllocationRequest, RegisterRequest,
};
use smore_k8s::device_plugin::{
    self, budgets, unix_channel, GpuBudget, Options, HEALTHY, KUBELET_SOCKET,
};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tonic::{Request, Response, Status};

const UNIT: u64 = 256 << 20;

/// The kubelet's Registration service: forwards every request to the test.
struct Kubelet(mpsc::UnboundedSender<RegisterRequest>);

#[tonic::async_trait]
impl Registration for Kubelet {
    async fn register(&self, r: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let _ = self.0.send(r.into_inner());
        Ok(Response::new(Empty {}))
    }
}

type Budgets = Arc<Mutex<Result<Vec<GpuBudget>, String>>>;

fn healthy(r: &ListAndWatchResponse) -> Vec<String> {
    r.devices
        .iter()
        .filter(|d| d.health == HEALTHY)
        .map(|d| d.id.clone())
        .collect()
}

async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), f)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

async fn next(s: &mut tonic::Streaming<ListAndWatchResponse>) -> ListAndWatchResponse {
    within("ListAndWatch", s.message()).await.unwrap().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubelet_sees_registration_budget_updates_and_cdi_allocations() {
    let dir = tempfile::tempdir().unwrap();
    let (reg_tx, mut reg_rx) = mpsc::unbounded_channel();
    let kubelet_sock = dir.path().join(KUBELET_SOCKET);
    let listener = tokio::net::UnixListener::bind(&kubelet_sock).unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(Kubelet(reg_tx)))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
    let state: Budgets = Arc::new(Mutex::new(Ok(vec![
        GpuBudget {
            index: 0,
            capacity_units: 4,
            available_units: 2,
        },
        GpuBudget {
            index: 1,
            capacity_units: 4,
            available_units: 4,
        },
    ])));
    let src = state.clone();
    tokio::spawn(device_plugin::run(
        Options {
            plugin_dir: dir.path().to_path_buf(),
            poll: Duration::from_millis(50),
            cdi_all: false,
            arbiter_socket: "/run/smore/arbiter.sock".into(),
        },
        Box::new(move || src.lock().unwrap().clone()),
    ));

    // Registration.
    let r = within("Register", reg_rx.recv()).await.unwrap();
    assert_eq!(r.version, "v1beta1");
    assert_eq!(r.resource_name, "smore.dev/gpu-memory");
    assert_eq!(r.endpoint, "smore-gpu-memory.sock");
    assert!(r.options.unwrap().get_preferred_allocation_available);

    // ListAndWatch: 8 devices, 6 healthy; then updates as the budgets change.
    let ch = unix_channel(dir.path().join(&r.endpoint)).await.unwrap();
    let mut client = DevicePluginClient::new(ch);
    assert!(
        client
            .get_device_plugin_options(Empty {})
            .await
            .unwrap()
            .into_inner()
            .get_preferred_allocation_available
    );
    let mut stream = client.list_and_watch(Empty {}).await.unwrap().into_inner();
    let mut first = next(&mut stream).await;
    // The first list may predate the first poll (empty): wait for the budgets.
    while first.devices.is_empty() {
        first = next(&mut stream).await;
    }
    assert_eq!(first.devices.len(), 8);
    assert_eq!(
        healthy(&first),
        vec!["gpu0-m0", "gpu0-m1", "gpu1-m0", "gpu1-m1", "gpu1-m2", "gpu1-m3"]
    );
    // Training on GPU 1 grows: three of its units go Unhealthy.
    state.lock().unwrap().as_mut().unwrap()[1].available_units = 1;
    let second = next(&mut stream).await;
    assert_eq!(second.devices.len(), 8, "capacity stays stable");
    assert_eq!(healthy(&second), vec!["gpu0-m0", "gpu0-m1", "gpu1-m0"]);
    // The arbiter goes away: every device Unhealthy, none removed.
    *state.lock().unwrap() = Err("cannot reach the arbiter".into());
    let third = next(&mut stream).await;
    assert_eq!(third.devices.len(), 8);
    assert!(healthy(&third).is_empty());

    // GetPreferredAllocation keeps a container's units on one GPU.
    let avail: Vec<String> = ["gpu0-m0", "gpu0-m1", "gpu1-m0", "gpu1-m1", "gpu1-m2"]
        .map(String::from)
        .to_vec();
    let pref = client
        .get_preferred_allocation(PreferredAllocationRequest {
            container_requests: vec![ContainerPreferredAllocationRequest {
                available_device_i_ds: avail,
                must_include_device_i_ds: vec![],
                allocation_size: 3,
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        pref.container_responses[0].device_i_ds,
        vec!["gpu1-m0", "gpu1-m1", "gpu1-m2"]
    );

    // Allocate: the CDI device of that GPU and the shim's memory limit.
    let alloc = |ids: &[&str]| AllocateRequest {
        container_requests: vec![ContainerAllocateRequest {
            devices_ids: ids.iter().map(|s| s.to_string()).collect(),
        }],
    };
    let a = client
        .allocate(alloc(&["gpu1-m0", "gpu1-m1", "gpu1-m2"]))
        .await
        .unwrap()
        .into_inner();
    let c = &a.container_responses[0];
    assert_eq!(c.cdi_devices.len(), 1);
    assert_eq!(c.cdi_devices[0].name, "smore.dev/gpu=1");
    assert_eq!(c.envs["SMORE_MEMORY_LIMIT"], (3 * UNIT).to_string());
    assert_eq!(c.envs["SMORE_ARBITER_SOCKET"], "/run/smore/arbiter.sock");
    let a = client
        .allocate(alloc(&["gpu0-m0", "gpu1-m1"]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        a.container_responses[0].cdi_devices[0].name,
        "smore.dev/gpu=all"
    );
    let e = client.allocate(alloc(&["nvidia0"])).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);

    // The kubelet restarts (wipes its directory): the plugin serves and registers again.
    std::fs::remove_file(dir.path().join(&r.endpoint)).unwrap();
    let again = within("re-registration", reg_rx.recv()).await.unwrap();
    assert_eq!(again.resource_name, "smore.dev/gpu-memory");
}

#[test]
fn budgets_follow_the_arbiters_policy_view_and_sigma() {
    let total = 24u64 << 30;
    let snap = serde_json::json!({
        "arbiter": {"memory_safety": 0.95},
        "gpus": [
            {"policy_view": {"index": 0, "total": total, "training_used": 10u64 << 30,
             "has_training": true, "training_solo_util": 0.5, "budget_boost": 1.0, "grants": []}},
            {"policy_view": {"index": 3, "total": total, "training_used": 0,
             "has_training": false, "training_solo_util": null, "budget_boost": 1.0, "grants": []}}
        ]
    });
    let b = budgets(&snap).unwrap();
    let cap = ((total as f64 * 0.95) as u64 / UNIT) as u32;
    assert_eq!(cap, 91);
    assert_eq!(
        b,
        vec![
            GpuBudget {
                index: 0,
                capacity_units: cap,
                available_units: (((total as f64 * 0.95) as u64 - (10 << 30)) / UNIT) as u32
            },
            GpuBudget {
                index: 3,
                capacity_units: cap,
                available_units: cap
            }
        ]
    );
    assert!(budgets(&serde_json::json!({"gpus": []})).is_err());
}
