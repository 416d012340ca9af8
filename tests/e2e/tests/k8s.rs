//! The Kubernetes scheduler extender against a real arbiter on the simulated GPU: the arbiter
//! serves its status at `GET /status`, `smore k8s extender` polls it and filters nodes for a
//! function pod as kube-scheduler asks (ExtenderArgs JSON), a node whose arbiter dies is filtered
//! out as unresolvable, and the device plugin's budgets read the same real snapshot.

use smore_e2e::arbiter::Arbiter;
use smore_e2e::*;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One HTTP/1.0 request to 127.0.0.1:`port`; (status code, body).
fn http(port: u16, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(
        s,
        "{method} {path} HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, body.to_string()))
}

struct Extender(Child);

impl Drop for Extender {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn pod_args(nodes: &[&str]) -> String {
    serde_json::json!({
        "Pod": {
            "metadata": {"name": "resnet-fn-0", "namespace": "inference", "uid": "u-1"},
            "spec": {"containers": [{
                "name": "fn",
                "resources": {"limits": {"smore.dev/gpu-memory": "8"}},
                "env": [{"name": "SMORE_MODEL", "value": "resnet50:8"},
                        {"name": "SMORE_SLO_MS", "value": "200"}]
            }]}
        },
        "Nodes": null,
        "NodeNames": nodes,
    })
    .to_string()
}

#[test]
fn the_extender_places_on_a_live_arbiter_and_keeps_pods_pending_when_it_dies() {
    let sim = SimGpu::exact(2, "24GiB");
    let status_port = free_port();
    let mut arbiter = Arbiter::new(
        &sim,
        &format!("metrics_addr = \"127.0.0.1:{status_port}\"\n\n[policy]\nname = \"smore\"\n"),
    );
    // The real snapshot carries what the extender and the device plugin read.
    let snap = arbiter.status();
    let budgets = smore_k8s::device_plugin::budgets(&snap).expect("budgets from a real snapshot");
    assert_eq!(budgets.len(), 2);
    assert!(budgets
        .iter()
        .all(|b| b.available_units == b.capacity_units && b.capacity_units == 91));

    let ext_port = free_port();
    let log = std::fs::File::create(sim.dir().join("extender.log")).unwrap();
    let _ext = Extender(
        Command::new(bin("smore"))
            .args(["k8s", "extender", "--listen"])
            .arg(format!("127.0.0.1:{ext_port}"))
            .arg("--config")
            .arg(&arbiter.cfg)
            .args([
                "--poll-interval",
                "0.2",
                "--poll-timeout",
                "1",
                "--stale-after",
                "5",
            ])
            .arg(format!("--node=sim-node=127.0.0.1:{status_port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawning smore k8s extender"),
    );
    let logs = || std::fs::read_to_string(sim.dir().join("extender.log")).unwrap_or_default();
    // The extender trains its (synthetic) predictor at start, then polls the arbiter.
    wait_until(
        "the extender sees the node ready",
        Duration::from_secs(120),
        || {
            http(ext_port, "GET", "/nodes", "")
                .is_some_and(|(c, b)| c == 200 && b.contains("\"ready\""))
        },
    );

    let (code, body) = http(
        ext_port,
        "POST",
        "/filter",
        &pod_args(&["sim-node", "ghost"]),
    )
    .unwrap_or_else(|| panic!("filter unanswered; extender log:\n{}", logs()));
    assert_eq!(code, 200, "{body}");
    let r: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(r["NodeNames"], serde_json::json!(["sim-node"]), "{r}");
    assert!(r["FailedAndUnresolvableNodes"]["ghost"]
        .as_str()
        .unwrap()
        .contains("no address"));
    let (_, body) = http(ext_port, "POST", "/prioritize", &pod_args(&["sim-node"])).unwrap();
    let p: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(p, serde_json::json!([{"Host": "sim-node", "Score": 10}]));

    // The arbiter dies: the next polls fail and the node is filtered out, never placed on.
    arbiter.kill();
    wait_until(
        "the extender marks the node down",
        Duration::from_secs(30),
        || {
            http(ext_port, "POST", "/filter", &pod_args(&["sim-node"])).is_some_and(|(_, b)| {
                b.contains("\"FailedAndUnresolvableNodes\":{\"sim-node\"")
                    && b.contains("unreachable")
            })
        },
    );
    let (_, body) = http(ext_port, "POST", "/filter", &pod_args(&["sim-node"])).unwrap();
    let r: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(r["NodeNames"], serde_json::json!([]), "{r}");
}
