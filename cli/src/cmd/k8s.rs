//! `smore k8s extender` and `smore bench extender`: the Kubernetes scheduler extender's process
//! and its benchmark (the logic is the smore-k8s crate; docs/kubernetes.md).
//!
//! Owns: the command lines and building the node policy from the node config, the same file
//! (ConfigMap) the arbiters read, so the extender's θ_train, λ, σ, d, catalog and model are the
//! nodes'. Must never: decide anything itself.

use anyhow::{bail, Context, Result};
use smore_arbiter::config::Config;
use smore_arbiter::smore_policy::SmorePolicy;
use smore_k8s::extender::{Extender, ExtenderConfig};
use smore_k8s::nodes::{spawn_poller, NodeTable};
use smore_predictor::catalog::Catalog;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Kubernetes integration.
#[derive(Debug, clap::Subcommand)]
pub enum K8sCmd {
    /// Run the kube-scheduler extender (POST /filter, /prioritize; GET /healthz, /nodes).
    Extender(ExtenderArgs),
    /// Run the kubelet device plugin advertising `smore.dev/gpu-memory` from the arbiter.
    DevicePlugin(DevicePluginArgs),
}

/// `smore k8s device-plugin`.
#[derive(Debug, clap::Args)]
pub struct DevicePluginArgs {
    /// The arbiter's socket (default: $SMORE_ARBITER_SOCKET or /run/smore/arbiter.sock); also
    /// what function containers are told (CDI mounts it at the same path).
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// The kubelet's device plugin directory.
    #[arg(long, default_value = smore_k8s::device_plugin::DEFAULT_PLUGIN_DIR)]
    pub plugin_dir: PathBuf,
    /// Seconds between two reads of the arbiter's status.
    #[arg(long, default_value_t = smore_k8s::nodes::DEFAULT_POLL_INTERVAL_S)]
    pub poll_interval: f64,
    /// Always hand out the CDI device smore.dev/gpu=all: the arbiter then picks the GPU by
    /// Algorithm 1 at registration instead of the kubelet's device choice.
    #[arg(long)]
    pub cdi_all: bool,
}

/// Runs the device plugin until killed.
pub fn device_plugin(a: DevicePluginArgs) -> Result<()> {
    let socket = smore_protocol::conn::socket_path(a.socket.as_deref());
    smore_k8s::device_plugin::run_blocking(
        smore_k8s::device_plugin::Options {
            plugin_dir: a.plugin_dir,
            poll: secs("--poll-interval", a.poll_interval)?,
            cdi_all: a.cdi_all,
            arbiter_socket: socket.clone(),
        },
        smore_k8s::device_plugin::arbiter_source(socket),
    )
}

/// `smore k8s extender`.
#[derive(Debug, clap::Args)]
pub struct ExtenderArgs {
    /// Address to serve kube-scheduler on.
    #[arg(long, default_value = "0.0.0.0:8888")]
    pub listen: String,
    /// Node config (the arbiters' ConfigMap): θ_train, λ, σ, power of d, catalog, model.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Port of each node's arbiter status endpoint (`[arbiter] metrics_addr`).
    #[arg(long, default_value_t = 9464)]
    pub arbiter_port: u16,
    /// Seconds between polls of every node's arbiter.
    #[arg(long, default_value_t = smore_k8s::nodes::DEFAULT_POLL_INTERVAL_S)]
    pub poll_interval: f64,
    /// Seconds after which a node's last status is too old to place on.
    #[arg(long, default_value_t = smore_k8s::nodes::DEFAULT_STALE_AFTER_S)]
    pub stale_after: f64,
    /// Seconds allowed for each step of a poll (connect, send, read).
    #[arg(long, default_value_t = 1.0)]
    pub poll_timeout: f64,
    /// Polls in flight at once.
    #[arg(long, default_value_t = 32)]
    pub poll_parallel: usize,
    /// A node to poll from the start, `NAME=HOST[:PORT]` (repeatable); others are learnt from the
    /// Node objects kube-scheduler sends.
    #[arg(long = "node", value_parser = parse_node)]
    pub nodes: Vec<(String, String)>,
    /// GPUs sampled across the cluster per decision (default: the config's `power_of_d`).
    #[arg(long)]
    pub d: Option<usize>,
    /// HTTP worker threads.
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
}

fn parse_node(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((n, a)) if !n.is_empty() && !a.is_empty() => Ok((n.to_string(), a.to_string())),
        _ => Err(format!(
            "{s:?}: expected NAME=HOST[:PORT], e.g. gpu-node-1=10.0.0.7"
        )),
    }
}

fn secs(what: &str, v: f64) -> Result<Duration> {
    if !(v.is_finite() && v > 0.0) {
        bail!("{what} = {v}: must be a positive number of seconds");
    }
    Ok(Duration::from_secs_f64(v))
}

fn load(config: &Option<PathBuf>) -> Result<Config> {
    Ok(match config {
        Some(p) => Config::load(p)?,
        None => Config::default(),
    })
}

/// Runs the extender until its listener fails.
pub fn extender(a: ExtenderArgs) -> Result<()> {
    let cfg = load(&a.config)?;
    let policy = Arc::new(SmorePolicy::from_config(&cfg).context("building the node policy")?);
    let table = Arc::new(NodeTable::new(
        policy.clone(),
        secs("--stale-after", a.stale_after)?,
    ));
    for (n, addr) in &a.nodes {
        table.learn(n, Some(addr));
    }
    spawn_poller(
        table.clone(),
        a.arbiter_port,
        secs("--poll-interval", a.poll_interval)?,
        secs("--poll-timeout", a.poll_timeout)?,
        a.poll_parallel,
    )?;
    let ext = Arc::new(Extender::new(
        table,
        ExtenderConfig {
            d: a.d.unwrap_or(policy.sched_config().d).max(1),
            default_slo_ms: cfg.default_slo_ms,
        },
    ));
    smore_k8s::server::serve(ext, &a.listen, a.workers)
}

/// `smore bench extender`.
#[derive(Debug, clap::Args)]
pub struct BenchExtenderArgs {
    /// Nodes in the synthetic cluster.
    #[arg(long, default_value_t = 128)]
    pub nodes: usize,
    /// GPUs per node.
    #[arg(long, default_value_t = 8)]
    pub gpus_per_node: usize,
    /// Pods decided.
    #[arg(long, default_value_t = 1000)]
    pub pods: usize,
    /// Catalog GPU type of every GPU.
    #[arg(long, default_value = "rtx3090")]
    pub gpu: String,
    /// Seed of the cluster and the pods.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Node config (predictor model, θ_train, λ, σ, d).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Times each pod's decision is repeated, keeping the fastest (others' load on a shared
    /// machine only adds time).
    #[arg(long, default_value_t = 5)]
    pub repeat: usize,
}

/// Prints the extender's per-pod decision latency.
pub fn bench(a: BenchExtenderArgs) -> Result<()> {
    let cfg = load(&a.config)?;
    let policy = Arc::new(SmorePolicy::from_config(&cfg).context("building the node policy")?);
    let cat = Catalog::load_or_builtin(cfg.catalog.as_deref())?;
    let report = smore_k8s::bench::run(
        policy,
        &cat,
        &smore_k8s::bench::BenchArgs {
            nodes: a.nodes,
            gpus_per_node: a.gpus_per_node,
            pods: a.pods,
            gpu: a.gpu,
            seed: a.seed,
            repeat: a.repeat,
        },
    )?;
    print!("{report}");
    Ok(())
}
