//! The kube-scheduler extender: `filter` and `prioritize` by SMORE's Algorithm 1 across nodes.
//!
//! Owns: turning an [`ExtenderArgs`] into decisions over the node table — which nodes can take
//! a function pod (filter) and how much each is preferred (prioritize) — and the messages
//! kube-scheduler puts in the pod's FailedScheduling event.
//!
//! - **filter**: a node passes when one of its GPUs admits the function now, judged by the
//!   node's own per-candidate step (`SmorePolicy::evaluate`: σ memory rule, θ_train, SLO,
//!   residents' SLOs, share sizing) through `smore_predictor::sched::choose` over all its GPUs
//!   in first-fit mode (it stops at the first GPU that admits) — the widening the arbiter
//!   applies before refusing a registration. So a node passes exactly
//!   when its arbiter would admit the registration on the state last polled. A node whose arbiter
//!   is unreachable or stale is *unresolvable* (preemption cannot help) and the pod stays pending.
//! - **prioritize**: Algorithm 1 across the cluster — `sched::Candidates::preferred_sampled`
//!   draws d GPUs over all the candidate nodes' GPUs (power of d, widening while nothing fits)
//!   and `sched::choose` takes the argmin of λ·D̂_train + (1−λ)·D̂_fn. The chosen GPU's node
//!   scores [`MAX_EXTENDER_PRIORITY`]; other nodes with an acceptable evaluated GPU score 1–9 by
//!   their best score; unevaluated nodes 0. Sampling, not argmin over every GPU, because node
//!   state is polled: an argmin sends a burst of pods to the same node before its next status
//!   shows them, while d random choices spread them (SMORE's power of d, and why it works with
//!   old information).
//!
//! Must never: pass a node it has no fresh state for, decide on anything but the node's policy
//! view, or re-implement a rule of Algorithm 1 (every rule is `sched`'s or the policy's).

pub mod wire;

use crate::nodes::NodeTable;
use crate::resources::{function_request, FunctionRequest};
use rand::rngs::StdRng;
use rand::SeedableRng;
use smore_arbiter::policy::Ask;
use smore_arbiter::smore_policy::{refuse_code, PreparedAsk, PreparedGpu};
use smore_predictor::sched::{self, CandidateEval, Candidates};
use smore_protocol::wire::RefuseCode;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;
pub use wire::{ExtenderArgs, ExtenderFilterResult, HostPriority, MAX_EXTENDER_PRIORITY};

/// Seed of the cluster-level power-of-d sampler (fixed: decisions are reproducible for a given
/// request sequence, as the arbiter's).
const SAMPLER_SEED: u64 = 0x6b38_5eed;

/// Extender settings.
#[derive(Debug, Clone)]
pub struct ExtenderConfig {
    /// GPUs sampled across the cluster per prioritize decision (power of d).
    pub d: usize,
    /// SLO of a pod that declares none, ms (the node config's `[functions] default_slo_ms`,
    /// what its arbiter assumes at registration).
    pub default_slo_ms: f64,
}

/// A node's verdict for one pod.
#[derive(Debug, Clone, PartialEq)]
pub enum NodeVerdict {
    /// One of its GPUs admits the pod (the first found, in index order).
    Fits {
        /// That GPU's index.
        gpu: u32,
        /// Its λ·D̂_train + (1−λ)·D̂_fn.
        score: f64,
    },
    /// No GPU admits it (message for the event).
    Refused(String),
    /// No usable state (message for the event).
    Unavailable(String),
}

/// The extender.
pub struct Extender {
    nodes: Arc<NodeTable>,
    cfg: ExtenderConfig,
    rng: Mutex<StdRng>,
}

/// The event message of a node none of whose GPUs admits the function. Constant per class, so
/// kube-scheduler's event groups nodes ("0/128 nodes are available: 120 smore: …").
fn refusal_message(evals: &[CandidateEval], req: &FunctionRequest, theta: f64) -> String {
    match refuse_code(evals) {
        RefuseCode::NoMemory => format!(
            "smore: no GPU has {} MiB free for functions (after training, grants and σ)",
            req.memory >> 20
        ),
        RefuseCode::TrainingBound => format!(
            "smore: every GPU with memory would slow its training job beyond θ_train = {theta}"
        ),
        RefuseCode::Slo => format!(
            "smore: no GPU meets the SLO of {} (or of the functions already there)",
            req.model
        ),
        RefuseCode::NoGpu => "smore: the node's arbiter manages no GPU".to_string(),
        RefuseCode::Invalid => format!(
            "smore: the predictor cannot predict {} on this node's GPUs",
            req.model
        ),
    }
}

impl Extender {
    /// An extender over `nodes` (whose policy decides).
    pub fn new(nodes: Arc<NodeTable>, cfg: ExtenderConfig) -> Extender {
        Extender {
            nodes,
            cfg,
            rng: Mutex::new(StdRng::seed_from_u64(SAMPLER_SEED)),
        }
    }

    /// The node table.
    pub fn nodes(&self) -> &Arc<NodeTable> {
        &self.nodes
    }

    fn prepare(&self, req: &FunctionRequest) -> PreparedAsk {
        self.nodes.policy().prepare_ask(&Ask {
            function: req.function.clone(),
            model: req.model.clone(),
            slo_ms: req.slo_ms.unwrap_or(self.cfg.default_slo_ms),
            memory: req.memory,
            prefer_gpu: None,
        })
    }

    /// Whether one of `gpus` admits `ask` (`sched::choose` in first-fit mode over all of them).
    pub fn node_verdict(
        &self,
        gpus: &[PreparedGpu],
        req: &FunctionRequest,
        ask: &PreparedAsk,
    ) -> NodeVerdict {
        let policy = self.nodes.policy();
        if gpus.is_empty() {
            return NodeVerdict::Refused("smore: the node's arbiter manages no GPU".into());
        }
        let mut fn_error = None;
        // First fit (SMORE's fast mode): whether *some* GPU admits is all the filter needs, and
        // it stops at the first one instead of scoring all of them (scores are prioritize's).
        let cands = Candidates::fixed((0..gpus.len()).collect());
        let choice = sched::choose(&cands, true, |i| match policy.evaluate(&gpus[i], ask) {
            Ok(e) => Some(e),
            Err(e) => {
                fn_error = Some(e);
                None
            }
        });
        match choice.chosen_eval() {
            Some(e) => NodeVerdict::Fits {
                gpu: e.gpu,
                score: e.score.unwrap_or(0.0),
            },
            None if choice.evals.is_empty() => NodeVerdict::Refused(format!(
                "smore: {}",
                fn_error.unwrap_or_else(|| "no GPU could be evaluated".into())
            )),
            None => NodeVerdict::Refused(refusal_message(
                &choice.evals,
                req,
                policy.sched_config().theta_train,
            )),
        }
    }

    /// The candidate node names of a request, learning the addresses of Node objects.
    fn candidates(&self, args: &ExtenderArgs) -> Vec<String> {
        if let Some(list) = &args.nodes {
            list.items
                .iter()
                .filter_map(|raw| {
                    let n: wire::NodeLite = serde_json::from_str(raw.get()).ok()?;
                    self.nodes.learn(&n.metadata.name, n.poll_address());
                    Some(n.metadata.name)
                })
                .collect()
        } else {
            let names = args.node_names.clone().unwrap_or_default();
            for n in &names {
                self.nodes.learn(n, None);
            }
            names
        }
    }

    /// The `filter` verb.
    pub fn filter(&self, args: ExtenderArgs) -> ExtenderFilterResult {
        self.filter_at(args, Instant::now())
    }

    /// [`Extender::filter`] with the clock given (staleness is judged at `now`).
    pub fn filter_at(&self, args: ExtenderArgs, now: Instant) -> ExtenderFilterResult {
        let names = self.candidates(&args);
        let mut out = ExtenderFilterResult::default();
        let req = match function_request(&args.pod) {
            Ok(Some(r)) => Some(r),
            Ok(None) => None,
            Err(e) => {
                out.error = e.to_string();
                return out;
            }
        };
        let mut pass = vec![true; names.len()];
        if let Some(req) = &req {
            let ask = self.prepare(req);
            for (i, name) in names.iter().enumerate() {
                match self.verdict(name, req, &ask, now) {
                    NodeVerdict::Fits { .. } => {}
                    NodeVerdict::Refused(m) => {
                        pass[i] = false;
                        out.failed_nodes.insert(name.clone(), m);
                    }
                    NodeVerdict::Unavailable(m) => {
                        pass[i] = false;
                        out.failed_and_unresolvable.insert(name.clone(), m);
                    }
                }
            }
        }
        match args.nodes {
            Some(list) => {
                let items = list
                    .items
                    .into_iter()
                    .filter(|raw| {
                        serde_json::from_str::<wire::NodeLite>(raw.get())
                            .ok()
                            .and_then(|n| names.iter().position(|x| *x == n.metadata.name))
                            .is_some_and(|i| pass[i])
                    })
                    .collect();
                out.nodes = Some(wire::NodeList { items });
            }
            None => {
                out.node_names = Some(
                    names
                        .iter()
                        .zip(&pass)
                        .filter(|(_, &p)| p)
                        .map(|(n, _)| n.clone())
                        .collect(),
                );
            }
        }
        out
    }

    /// One node's verdict at `now`.
    pub fn verdict(
        &self,
        node: &str,
        req: &FunctionRequest,
        ask: &PreparedAsk,
        now: Instant,
    ) -> NodeVerdict {
        match self.nodes.get(node, now) {
            Ok(gpus) => self.node_verdict(&gpus, req, ask),
            Err(u) => NodeVerdict::Unavailable(u.to_string()),
        }
    }

    /// The `prioritize` verb.
    pub fn prioritize(&self, args: ExtenderArgs) -> Vec<HostPriority> {
        self.prioritize_at(args, Instant::now())
    }

    /// [`Extender::prioritize`] with the clock given.
    pub fn prioritize_at(&self, args: ExtenderArgs, now: Instant) -> Vec<HostPriority> {
        let names = self.candidates(&args);
        let mut scores = vec![0i64; names.len()];
        if let Ok(Some(req)) = function_request(&args.pod) {
            let ask = self.prepare(&req);
            // Every usable GPU of the candidate nodes, flattened: (node position, GPUs, index).
            let usable: Vec<(usize, Arc<Vec<PreparedGpu>>)> = names
                .iter()
                .enumerate()
                .filter_map(|(i, n)| Some((i, self.nodes.get(n, now).ok()?)))
                .collect();
            let flat: Vec<(usize, usize)> = usable
                .iter()
                .enumerate()
                .flat_map(|(u, (_, g))| (0..g.len()).map(move |k| (u, k)))
                .collect();
            let cands = {
                let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
                Candidates::preferred_sampled(&mut rng, flat.len(), self.cfg.d, None, true)
            };
            let policy = self.nodes.policy();
            // Evaluations in order, with the node each belongs to.
            let mut owner: Vec<usize> = Vec::new();
            let choice = sched::choose(&cands, false, |fi| {
                let (u, k) = flat[fi];
                let e = policy.evaluate(&usable[u].1[k], &ask).ok()?;
                owner.push(usable[u].0);
                Some(e)
            });
            let mut best: BTreeMap<usize, f64> = BTreeMap::new();
            for (e, &node) in choice.evals.iter().zip(&owner) {
                if let Some(s) = e.score {
                    let b = best.entry(node).or_insert(f64::INFINITY);
                    *b = b.min(s);
                }
            }
            let chosen = choice.chosen.map(|(_, ei)| owner[ei]);
            let (lo, hi) = best
                .values()
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), &s| {
                    (l.min(s), h.max(s))
                });
            for (&node, &s) in &best {
                scores[node] = if Some(node) == chosen {
                    MAX_EXTENDER_PRIORITY
                } else if hi > lo {
                    // 1 (worst evaluated) … 9 (as good as the best).
                    1 + ((MAX_EXTENDER_PRIORITY - 2) as f64 * (hi - s) / (hi - lo)).round() as i64
                } else {
                    MAX_EXTENDER_PRIORITY - 1
                };
            }
        }
        names
            .into_iter()
            .zip(scores)
            .map(|(host, score)| HostPriority { host, score })
            .collect()
    }
}
