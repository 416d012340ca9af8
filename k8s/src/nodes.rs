//! What the extender knows of each node: its arbiter's policy view, polled over HTTP.
//!
//! Owns: the node table (name → address and last state), reading a node's `GET /status` snapshot
//! (`gpus[].policy_view`, docs/cli.md) into the policy's prepared GPUs, staleness, and the
//! background poller. Why polling the arbiters rather than node annotations: the snapshot is
//! what the node's policy decides on, verbatim, with no writer to run and no API-server traffic
//! per update (annotations would patch 128 Node objects every few seconds and wake every
//! watcher of Nodes); the price is that the extender must reach each node's `metrics_addr`
//! (docs/kubernetes.md, "Device plugin and scheduler extender").
//!
//! Must never: report a node as usable from a snapshot older than `stale_after`, or from one it
//! could not parse — an unusable node is unavailable, with the reason, and pods stay pending.

use serde_json::Value;
use smore_arbiter::policy::GpuView;
use smore_arbiter::smore_policy::{PreparedGpu, SmorePolicy};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// Largest status document read from an arbiter, bytes: a node of 8 GPUs with 64 functions each
/// and 64 events is about 200 KiB; 8 MiB bounds a misbehaving peer.
const MAX_STATUS_BYTES: u64 = 8 << 20;

/// Seconds between two polls of every node's arbiter (`smore k8s extender --poll-interval`):
/// the age of the state a decision sees is up to this (plus a poll's duration). A choice, not a
/// measurement: 128 nodes polled every 2 s is 64 small requests a second for the extender.
/// `smore eval cluster` models the staleness it implies (its `--publish-ms` default).
pub const DEFAULT_POLL_INTERVAL_S: f64 = 2.0;
/// Seconds after which a node's last status is too old to place on (`--stale-after`): 15 missed
/// polls, long enough to ride out an arbiter restart during an upgrade (docs/kubernetes.md).
pub const DEFAULT_STALE_AFTER_S: f64 = 30.0;

/// A node's last known state.
#[derive(Debug, Clone)]
enum State {
    /// Never polled successfully nor failed yet.
    Unknown,
    /// Last poll succeeded.
    Ready {
        gpus: Arc<Vec<PreparedGpu>>,
        at: Instant,
    },
    /// Last poll failed.
    Down { reason: String, since: Instant },
}

#[derive(Debug, Clone)]
struct Entry {
    /// `host` or `host:port` (the default port is added when polling).
    addr: Option<String>,
    state: State,
}

/// Why a node cannot be used now (message for kube-scheduler's FailedScheduling event).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Unavailable {
    /// Not known to the extender yet.
    #[error("smore: no status yet from this node's arbiter (first poll pending); the pod stays pending until it reports")]
    NotYetPolled,
    /// The extender knows no address for the node.
    #[error("smore: no address to reach this node's arbiter (send Node objects: nodeCacheCapable false, or list it with --node NAME=HOST)")]
    NoAddress,
    /// The last poll failed.
    #[error("smore: the node's arbiter is unreachable ({reason}); not placing blindly, check the smore DaemonSet pod on this node")]
    Down {
        /// The poll's error.
        reason: String,
    },
    /// The last good snapshot is too old.
    #[error("smore: the node's arbiter status is stale (older than {stale_s} s); not placing blindly, check the smore DaemonSet pod on this node")]
    Stale {
        /// The staleness limit, seconds.
        stale_s: u64,
    },
}

/// The node table, shared by the HTTP workers and the poller.
pub struct NodeTable {
    policy: Arc<SmorePolicy>,
    inner: RwLock<HashMap<String, Entry>>,
    /// A snapshot older than this makes the node unavailable.
    pub stale_after: Duration,
}

impl NodeTable {
    /// An empty table whose snapshots are prepared with `policy`.
    pub fn new(policy: Arc<SmorePolicy>, stale_after: Duration) -> NodeTable {
        NodeTable {
            policy,
            inner: RwLock::new(HashMap::new()),
            stale_after,
        }
    }

    /// The policy snapshots are prepared with.
    pub fn policy(&self) -> &Arc<SmorePolicy> {
        &self.policy
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, Entry>> {
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Records where `name`'s arbiter is (from its Node object or the command line); a node seen
    /// for the first time is polled from the next round on.
    pub fn learn(&self, name: &str, addr: Option<&str>) {
        let known = {
            let r = self.inner.read().unwrap_or_else(|e| e.into_inner());
            r.get(name)
                .map(|e| e.addr.as_deref() == addr || addr.is_none())
        };
        if known == Some(true) {
            return;
        }
        let mut w = self.write();
        let e = w.entry(name.to_string()).or_insert(Entry {
            addr: None,
            state: State::Unknown,
        });
        if addr.is_some() {
            e.addr = addr.map(str::to_string);
        }
    }

    /// Stores a node's status snapshot (`GET /status`) taken at `at`.
    pub fn set_status(&self, name: &str, snapshot: &Value, at: Instant) {
        let state = match views(snapshot) {
            Ok(v) => State::Ready {
                gpus: Arc::new(v.iter().map(|g| self.policy.prepare_gpu(g)).collect()),
                at,
            },
            Err(reason) => State::Down { reason, since: at },
        };
        self.set(name, state);
    }

    /// Stores GPU views directly (tests, benchmarks, the cluster evaluation).
    pub fn set_views(&self, name: &str, gpus: &[GpuView], at: Instant) {
        let gpus = Arc::new(gpus.iter().map(|g| self.policy.prepare_gpu(g)).collect());
        self.set(name, State::Ready { gpus, at });
    }

    /// Records a failed poll.
    pub fn set_down(&self, name: &str, reason: String, at: Instant) {
        self.set(name, State::Down { reason, since: at });
    }

    fn set(&self, name: &str, state: State) {
        let mut w = self.write();
        match w.get_mut(name) {
            Some(e) => e.state = state,
            None => {
                w.insert(name.to_string(), Entry { addr: None, state });
            }
        }
    }

    /// The node's prepared GPUs, or why it cannot be used at `now`.
    pub fn get(&self, name: &str, now: Instant) -> Result<Arc<Vec<PreparedGpu>>, Unavailable> {
        let r = self.inner.read().unwrap_or_else(|e| e.into_inner());
        let Some(e) = r.get(name) else {
            return Err(Unavailable::NotYetPolled);
        };
        match &e.state {
            State::Ready { gpus, at } => {
                if now.saturating_duration_since(*at) > self.stale_after {
                    Err(Unavailable::Stale {
                        stale_s: self.stale_after.as_secs(),
                    })
                } else {
                    Ok(gpus.clone())
                }
            }
            State::Down { reason, .. } => Err(Unavailable::Down {
                reason: reason.clone(),
            }),
            State::Unknown if e.addr.is_none() => Err(Unavailable::NoAddress),
            State::Unknown => Err(Unavailable::NotYetPolled),
        }
    }

    /// Every node with an address: what the poller polls.
    pub fn targets(&self) -> Vec<(String, String)> {
        let r = self.inner.read().unwrap_or_else(|e| e.into_inner());
        r.iter()
            .filter_map(|(n, e)| Some((n.clone(), e.addr.clone()?)))
            .collect()
    }

    /// A summary for `GET /nodes` (operators: which nodes are usable and why not).
    pub fn summary(&self, now: Instant) -> Value {
        let r = self.inner.read().unwrap_or_else(|e| e.into_inner());
        let mut names: Vec<&String> = r.keys().collect();
        names.sort();
        let nodes: Vec<Value> = names
            .into_iter()
            .map(|n| {
                let e = &r[n];
                let (state, detail) = match &e.state {
                    State::Unknown => ("unknown", Value::Null),
                    State::Ready { gpus, at } => (
                        "ready",
                        serde_json::json!({
                            "gpus": gpus.len(),
                            "age_s": now.saturating_duration_since(*at).as_secs_f64(),
                        }),
                    ),
                    State::Down { reason, since } => (
                        "down",
                        serde_json::json!({
                            "reason": reason,
                            "for_s": now.saturating_duration_since(*since).as_secs_f64(),
                        }),
                    ),
                };
                serde_json::json!({"node": n, "address": e.addr, "state": state, "detail": detail})
            })
            .collect();
        serde_json::json!({ "nodes": nodes })
    }
}

/// The policy views of a status snapshot (`gpus[].policy_view`).
pub fn views(snapshot: &Value) -> Result<Vec<GpuView>, String> {
    let gpus = snapshot
        .get("gpus")
        .and_then(Value::as_array)
        .ok_or("status snapshot without `gpus`: not a smore arbiter?")?;
    gpus.iter()
        .map(|g| {
            let v = g.get("policy_view").ok_or(
                "status snapshot without `gpus[].policy_view`: the node runs an older smore; \
                 upgrade the DaemonSet",
            )?;
            serde_json::from_value::<GpuView>(v.clone())
                .map_err(|e| format!("unreadable policy_view: {e}"))
        })
        .collect()
}

/// Resolves `addr` (`host`, `host:port`, an IPv4 or IPv6 literal) with `port` as the default.
fn socket_addr(addr: &str, port: u16) -> Result<SocketAddr, String> {
    if let Ok(ip) = addr.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    if let Ok(sa) = addr.parse::<SocketAddr>() {
        return Ok(sa);
    }
    let with_port = if addr.contains(':') {
        addr.to_string()
    } else {
        format!("{addr}:{port}")
    };
    with_port
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {with_port}: {e}"))?
        .next()
        .ok_or_else(|| format!("{with_port} resolves to no address"))
}

/// `GET /status` from the arbiter at `addr` (default port `port`) within `timeout` per step.
///
/// HTTP/1.0 over a plain TCP stream: one request, the server closes after the answer, no
/// keep-alive or chunking to handle — what the arbiter's `tiny_http` endpoint answers.
pub fn fetch_status(addr: &str, port: u16, timeout: Duration) -> Result<Value, String> {
    let sa = socket_addr(addr, port)?;
    let mut s =
        TcpStream::connect_timeout(&sa, timeout).map_err(|e| format!("connect {sa}: {e}"))?;
    s.set_read_timeout(Some(timeout))
        .and_then(|()| s.set_write_timeout(Some(timeout)))
        .map_err(|e| format!("{sa}: {e}"))?;
    write!(s, "GET /status HTTP/1.0\r\nHost: {sa}\r\n\r\n").map_err(|e| format!("{sa}: {e}"))?;
    let mut buf = Vec::new();
    s.take(MAX_STATUS_BYTES)
        .read_to_end(&mut buf)
        .map_err(|e| format!("reading from {sa}: {e}"))?;
    let split = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| format!("{sa}: no HTTP header in the answer"))?;
    let head = String::from_utf8_lossy(&buf[..split]);
    let status = head.lines().next().unwrap_or_default();
    if status.split_whitespace().nth(1) != Some("200") {
        return Err(format!(
            "{sa}/status answered {status:?} (is metrics_addr the arbiter's?)"
        ));
    }
    serde_json::from_slice(&buf[split + 4..]).map_err(|e| format!("{sa}/status: not JSON: {e}"))
}

/// Polls every node of `table` each `interval`, `parallel` at a time, forever (a thread).
pub fn spawn_poller(
    table: Arc<NodeTable>,
    port: u16,
    interval: Duration,
    timeout: Duration,
    parallel: usize,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("smore-k8s-poll".into())
        .spawn(move || loop {
            let t0 = Instant::now();
            poll_once(&table, port, timeout, parallel);
            std::thread::sleep(interval.saturating_sub(t0.elapsed()));
        })?;
    Ok(())
}

/// One round of polls over every known node.
pub fn poll_once(table: &NodeTable, port: u16, timeout: Duration, parallel: usize) {
    let targets = table.targets();
    for chunk in targets.chunks(parallel.max(1)) {
        std::thread::scope(|s| {
            for (name, addr) in chunk {
                s.spawn(move || {
                    let r = fetch_status(addr, port, timeout);
                    let now = Instant::now();
                    match r {
                        Ok(v) => table.set_status(name, &v, now),
                        Err(e) => {
                            tracing::warn!("node {name}: {e}");
                            table.set_down(name, e, now)
                        }
                    }
                });
            }
        });
    }
}
