//! The arbiter's node state and every transition of it: registration, release, live share and
//! cap changes, NVML reconciliation (training detection, watchdog, reaping), persistence, and the
//! status snapshot. Pure logic over plain data: sockets (`server`) and NVML (`gpus`) feed it, so
//! each rule here is unit-tested without either.
//!
//! Invariants: (1) for every GPU, Σ caps of grants + training memory ≤ σ·capacity at admission
//! time; (2) every grant's page holds exactly the cap and share in this state (writes happen
//! before the reply that announces them); (3) an instance is counted once — a re-registration
//! with `resume` re-attaches the persisted instance instead of adding one.

use crate::config::{Config, WatchdogAction};
use crate::gpus::{GpuInfo, GpuSample};
use crate::grantpage::PageHandle;
use crate::policy::{Admission, Ask, Decision, GpuView, GrantView, Policy};
use crate::proc;
use serde::{Deserialize, Serialize};
use smore_protocol::grant::MAX_DEVICES;
use smore_protocol::size::format_size;
use smore_protocol::wire::{Grant, RefuseCode};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// Events kept for `status` (oldest dropped first).
const MAX_EVENTS: usize = 256;
/// Latency samples kept per instance for percentiles.
const MAX_LATENCIES: usize = 1024;
/// Smoothing of training's solo utilization (EWMA weight of a new sample). Reasoning: samples
/// come every reconcile period (250 ms); 0.2 averages over ~1 s, enough to ride out one sample.
const SOLO_UTIL_ALPHA: f64 = 0.2;
/// SM use (NVML per-process samples, percent) a function may show above its share before a
/// sample counts as over-use: the samples cover 1/6 s and a time-sliced GPU gives a function
/// whole timeslices, so short excursions are normal. Reasoning, checked on the simulated GPU
/// (shimmed functions at 10–75 % stay within a few points over 1 s).
const SM_SLACK_PCT: u32 = 15;
/// Consecutive over-use samples before the watchdog acts (× reconcile period: 2 s at 250 ms).
const SM_OVERUSE_SAMPLES: u32 = 8;
/// Reconcile rounds between two observations fed to the policy's online learning (20 × 250 ms
/// = 5 s: long enough for NVML's 1/6 s samples and the reported latencies to average out).
const OBSERVE_EVERY: u64 = 20;
/// Largest multiplier of the worst-case time budget the feedback loop may reach. Reasoning: at
/// ×6 a 60 %-busy trainer's budget (14 %) reaches the ~85 % a light function set could use;
/// the loop shrinks it again as soon as the measured slowdown passes θ.
const BOOST_MAX: f64 = 6.0;
/// Solo samples before training's solo utilization is trusted (× reconcile period: 2 s at
/// 250 ms). A job's first samples are often idle (loading data, building the model): trusting
/// them gave functions 100 % shares beside a trainer that then ran flat out (test
/// `a_function_using_more_sm_time_than_its_share_gets_the_watchdog` caught it).
const SOLO_MIN_SAMPLES: u32 = 8;
/// Training utilization change (fraction) that makes the arbiter re-split shares.
const RESHARE_DELTA: f64 = 0.05;

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Who is asking, from `SO_PEERCRED` plus `/proc`.
#[derive(Debug, Clone, Copy)]
pub struct Peer {
    pub pid: u32,
    pub uid: u32,
}

/// A registration request with defaults not yet applied.
#[derive(Debug, Clone, Default)]
pub struct RegisterArgs {
    pub function: String,
    pub model: Option<String>,
    pub slo_ms: Option<f64>,
    pub memory: Option<u64>,
    pub resume: Option<u64>,
    pub gpu: Option<u32>,
    /// `smore run` registered and will exec the command with `CUDA_VISIBLE_DEVICES` = the GPU:
    /// the grant goes in page slot 0. Otherwise the slot is the GPU's index.
    pub exec: bool,
}

/// One function instance.
#[derive(Serialize)]
pub struct Instance {
    pub id: u64,
    pub pid: u32,
    #[serde(skip)]
    pub start: u64,
    pub uid: u32,
    pub function: String,
    pub model: String,
    pub slo_ms: f64,
    pub gpu: u32,
    pub slot: u32,
    pub cap: u64,
    pub share: u32,
    pub share_override: Option<u32>,
    /// False after an arbiter restart until the process re-registers (its memory stays counted).
    pub attached: bool,
    #[serde(skip)]
    pub page: Option<Arc<PageHandle>>,
    pub predicted_train: Option<f64>,
    pub predicted_fn: Option<f64>,
    pub rule: String,
    pub registered_at: f64,
    /// NVML memory of the instance's processes (authority), bytes.
    pub nvml_used: u64,
    /// Memory the shim reports (hint), bytes.
    pub used_hint: Option<u64>,
    pub throttled_ns: u64,
    pub refusals: u64,
    pub requests: u64,
    pub deferred: u64,
    /// SM utilization NVML attributes to the instance's processes, percent.
    pub sm_used: Option<u32>,
    pub shim_loaded: Option<bool>,
    #[serde(skip)]
    pub latencies: VecDeque<f64>,
    #[serde(skip)]
    pub acted_on: bool,
    /// Consecutive NVML samples in which the instance used more SM time than its share allows.
    #[serde(skip)]
    pub over_share: u32,
}

impl Instance {
    /// An instance from what persists of it; `page` None = detached (restored after a restart,
    /// waiting for the process to re-register). Runtime counters start at zero.
    fn from_persisted(p: Persisted, page: Option<Arc<PageHandle>>, rule: String) -> Instance {
        Instance {
            id: p.id,
            pid: p.pid,
            start: p.start,
            uid: p.uid,
            function: p.function,
            model: p.model,
            slo_ms: p.slo_ms,
            gpu: p.gpu,
            slot: p.slot,
            cap: p.cap,
            share: p.share,
            share_override: p.share_override,
            attached: page.is_some(),
            page,
            predicted_train: None,
            predicted_fn: None,
            rule,
            registered_at: now(),
            nvml_used: 0,
            used_hint: None,
            throttled_ns: 0,
            refusals: 0,
            requests: 0,
            deferred: 0,
            sm_used: None,
            shim_loaded: None,
            latencies: VecDeque::new(),
            acted_on: false,
            over_share: 0,
        }
    }

    /// Latency percentile `q` (0..=1) over the kept samples, ms.
    pub fn latency_percentile(&self, q: f64) -> Option<f64> {
        if self.latencies.is_empty() {
            return None;
        }
        let mut v: Vec<f64> = self.latencies.iter().copied().collect();
        v.sort_by(f64::total_cmp);
        let i = ((v.len() - 1) as f64 * q).round() as usize;
        Some(v[i])
    }

    fn write_page(&self) {
        if let Some(p) = &self.page {
            let page = p.page();
            for d in 0..MAX_DEVICES {
                if d as u32 == self.slot {
                    page.set(d, self.cap, self.share);
                } else if page.cap(d) != 0 {
                    // Devices the instance was not admitted to: no memory at all.
                    page.set(d, 0, 100);
                }
            }
        }
    }
}

/// A training (unregistered) process on a GPU.
#[derive(Debug, Clone, Serialize)]
pub struct TrainingProc {
    pub pid: u32,
    pub used: u64,
    pub sm_util: Option<u32>,
}

/// A managed GPU.
#[derive(Serialize)]
pub struct Gpu {
    #[serde(flatten)]
    pub info: GpuInfo,
    pub used: u64,
    pub util: Option<u32>,
    pub training: Vec<TrainingProc>,
    pub training_used: u64,
    /// Training's utilization while no function ran on the GPU (EWMA, fraction).
    pub training_solo_util: Option<f64>,
    /// Samples behind `training_solo_util` (it is trusted from SOLO_MIN_SAMPLES on).
    #[serde(skip)]
    solo_samples: u32,
    /// Training's utilization while functions share the GPU (EWMA, fraction).
    pub training_colocated_util: Option<f64>,
    /// Multiplier on the worst-case time budget (feedback loop, `State::observe`).
    pub budget_boost: f64,
    #[serde(skip)]
    solo_util_at_last_share: Option<f64>,
}

impl Gpu {
    /// Training's solo utilization once enough samples back it.
    pub fn trusted_solo_util(&self) -> Option<f64> {
        self.training_solo_util
            .filter(|_| self.solo_samples >= SOLO_MIN_SAMPLES)
    }
}

/// Something worth telling the operator.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    pub time: f64,
    pub kind: String,
    pub instance: Option<u64>,
    pub pid: Option<u32>,
    pub message: String,
}

/// Running totals for metrics.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Counters {
    pub registrations: u64,
    pub refusals: u64,
    pub releases: u64,
    pub watchdog_actions: u64,
    pub admitted_requests: u64,
    pub deferred_requests: u64,
}

/// A watchdog action for the caller to carry out.
#[derive(Debug, Clone, PartialEq)]
pub struct Enforcement {
    pub pid: u32,
    pub action: WatchdogAction,
    pub instance: u64,
    pub reason: String,
}

/// What survives an arbiter restart (written to `state_dir/instances.json`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Persisted {
    pub id: u64,
    pub pid: u32,
    pub start: u64,
    pub uid: u32,
    pub function: String,
    pub model: String,
    pub slo_ms: f64,
    pub gpu: u32,
    pub slot: u32,
    pub cap: u64,
    pub share: u32,
    pub share_override: Option<u32>,
}

/// Version of the persisted state file.
pub const PERSIST_VERSION: u32 = 1;

#[derive(Serialize, Deserialize)]
pub struct PersistFile {
    pub version: u32,
    pub next_id: u64,
    pub instances: Vec<Persisted>,
}

/// The node.
pub struct State {
    pub cfg: Config,
    pub gpus: Vec<Gpu>,
    pub instances: BTreeMap<u64, Instance>,
    next_id: u64,
    pub events: VecDeque<Event>,
    pub counters: Counters,
    policy: Box<dyn Policy>,
    pub started_at: f64,
    /// Set when something persisted changed.
    pub dirty: bool,
    /// The latest pre-warm hints (refreshed every minute by `prewarm_tick`).
    pub hints: Vec<smore_protocol::wire::Hint>,
    /// Online prewarm over request reports (None when `[prewarm] policy = "off"`).
    prewarm: Option<smore_prewarm::PrewarmManager>,
    prewarm_minute: Option<u64>,
    /// Reconcile rounds so far (observations go to the policy every OBSERVE_EVERY rounds).
    rounds: u64,
}

impl State {
    pub fn new(cfg: Config, gpus: Vec<GpuInfo>, policy: Box<dyn Policy>) -> State {
        let prewarm = (cfg.prewarm_policy != "off")
            .then(|| smore_prewarm::policy::PolicySpec::parse(&cfg.prewarm_policy).ok())
            .flatten()
            .and_then(|spec| {
                smore_prewarm::PrewarmManager::new(
                    spec,
                    smore_prewarm::policy::PolicySettings::default(),
                )
                .ok()
            });
        let gpus = gpus
            .into_iter()
            .filter(|g| {
                cfg.gpu_indices
                    .as_ref()
                    .is_none_or(|l| l.contains(&g.index))
            })
            .map(|info| Gpu {
                info,
                used: 0,
                util: None,
                training: Vec::new(),
                training_used: 0,
                training_solo_util: None,
                solo_samples: 0,
                training_colocated_util: None,
                budget_boost: 1.0,
                solo_util_at_last_share: None,
            })
            .collect();
        State {
            cfg,
            gpus,
            instances: BTreeMap::new(),
            next_id: 1,
            events: VecDeque::new(),
            counters: Counters::default(),
            policy,
            started_at: now(),
            dirty: false,
            hints: Vec::new(),
            prewarm,
            prewarm_minute: None,
            rounds: 0,
        }
    }

    /// Seconds since the arbiter started (the prewarm clock; minute = ⌊t/60⌋).
    fn clock(&self) -> f64 {
        (now() - self.started_at).max(0.0)
    }

    /// Start of a new minute: ask the prewarm policy for hints (called by the reconcile loop).
    pub fn prewarm_tick(&mut self) {
        let minute = (self.clock() / 60.0) as u64;
        if self.prewarm_minute == Some(minute) {
            return;
        }
        self.prewarm_minute = Some(minute);
        let Some(pm) = self.prewarm.as_mut() else {
            return;
        };
        // Residency is what the node actually has: a function is loaded iff an instance runs.
        let names: Vec<String> = pm.status().iter().map(|f| f.function.clone()).collect();
        for n in names {
            let loaded = self.instances.values().any(|i| i.function == n);
            let _ = pm.set_loaded(&n, loaded);
        }
        match pm.tick(minute) {
            Ok(h) => {
                self.hints = h
                    .into_iter()
                    .map(|h| smore_protocol::wire::Hint {
                        function: h.function,
                        action: match h.action {
                            smore_prewarm::policy::Action::Load => "load",
                            smore_prewarm::policy::Action::Keep => "keep",
                            smore_prewarm::policy::Action::Unload => "unload",
                        }
                        .into(),
                        forecast_rpm: h.forecast.unwrap_or(-1.0),
                    })
                    .collect();
            }
            Err(e) => tracing::warn!("prewarm tick failed: {e:#}"),
        }
    }

    /// GPU memory held by models the prewarm manager believes resident, bytes.
    pub fn warm_memory(&self) -> u64 {
        self.prewarm.as_ref().map_or(0, |p| p.warm_memory_bytes())
    }

    pub fn policy_name(&self) -> &'static str {
        self.policy.name()
    }

    pub fn event(&mut self, kind: &str, instance: Option<u64>, pid: Option<u32>, message: String) {
        tracing::info!(kind, instance, pid, "{message}");
        if self.events.len() >= MAX_EVENTS {
            self.events.pop_front();
        }
        let ev = Event {
            time: now(),
            kind: kind.into(),
            instance,
            pid,
            message,
        };
        // The decision log: every admission, refusal, release and enforcement, one JSON object
        // per line, kept across restarts (status keeps only the last 256 events). Only a daemon
        // with a state directory keeps one (unit tests' states have none).
        if self.cfg.state_dir.is_dir() {
            let line = serde_json::to_string(&ev).unwrap_or_default();
            let path = self.cfg.state_dir.join("decisions.jsonl");
            let r = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .and_then(|mut f| {
                    std::io::Write::write_all(&mut f, format!("{line}\n").as_bytes())
                });
            if let Err(e) = r {
                tracing::debug!("decision log {}: {e}", path.display());
            }
        }
        self.events.push_back(ev);
    }

    fn view(&self, g: &Gpu) -> GpuView {
        GpuView {
            index: g.info.index,
            total: g.info.total,
            training_used: g.training_used,
            has_training: !g.training.is_empty(),
            // Until enough solo samples are in (a job just starting looks idle), unknown: the
            // policy then assumes a fully busy trainer.
            training_solo_util: g.trusted_solo_util(),
            budget_boost: g.budget_boost,
            grants: self
                .instances
                .values()
                .filter(|i| i.gpu == g.info.index)
                .map(|i| GrantView {
                    instance: i.id,
                    model: i.model.clone(),
                    slo_ms: i.slo_ms,
                    cap: i.cap,
                    share: i.share,
                    share_override: i.share_override,
                })
                .collect(),
        }
    }

    pub fn views(&self) -> Vec<GpuView> {
        self.gpus.iter().map(|g| self.view(g)).collect()
    }

    /// Recomputes the shares of every grant on `gpu` and writes the pages that changed.
    fn reshare(&mut self, gpu: u32) {
        let Some(g) = self.gpus.iter().find(|g| g.info.index == gpu) else {
            return;
        };
        let view = self.view(g);
        let shares = self.policy.shares(&self.cfg, &view);
        for (id, share) in shares {
            if let Some(i) = self.instances.get_mut(&id) {
                if i.share != share {
                    i.share = share;
                    i.write_page();
                    self.dirty = true;
                }
            }
        }
        if let Some(g) = self.gpus.iter_mut().find(|g| g.info.index == gpu) {
            g.solo_util_at_last_share = g.trusted_solo_util();
        }
    }

    /// Registers `peer` as a function instance.
    pub fn register(
        &mut self,
        peer: Peer,
        args: RegisterArgs,
    ) -> Result<(Grant, Arc<PageHandle>), (RefuseCode, String)> {
        if let Some(id) = args.resume {
            if let Some(r) = self.try_resume(peer, id) {
                return Ok(r);
            }
            // An instance that exists but cannot be resumed by this peer (attached elsewhere, or
            // another process's): a fresh registration would count its memory twice.
            if let Some(i) = self.instances.get(&id) {
                let why = if i.attached {
                    "it is attached to a live connection"
                } else {
                    "it belongs to another process"
                };
                return Err((
                    RefuseCode::Invalid,
                    format!("instance {id} cannot be resumed by pid {}: {why}", peer.pid),
                ));
            }
        }
        if args.function.trim().is_empty() {
            return Err((RefuseCode::Invalid, "empty function name".into()));
        }
        let ask = Ask {
            function: args.function.clone(),
            model: args.model.clone().unwrap_or_else(|| "unknown".into()),
            slo_ms: args.slo_ms.unwrap_or(self.cfg.default_slo_ms),
            memory: args.memory.unwrap_or(self.cfg.default_memory),
            prefer_gpu: args.gpu,
        };
        if !(ask.slo_ms.is_finite() && ask.slo_ms > 0.0) {
            return Err((RefuseCode::Invalid, format!("SLO of {} ms", ask.slo_ms)));
        }
        let views = self.views();
        let decision = self.policy.place(&self.cfg, &views, &ask);
        let (gpu, cap, pt, pf, rule) = match decision {
            Decision::Admit {
                gpu,
                cap,
                predicted_train,
                predicted_fn,
                rule,
            } => (gpu, cap, predicted_train, predicted_fn, rule),
            Decision::Refuse { code, reason } => {
                self.counters.refusals += 1;
                self.event(
                    "refused",
                    None,
                    Some(peer.pid),
                    format!(
                        "function {} ({}): {reason}",
                        ask.function,
                        format_size(ask.memory)
                    ),
                );
                return Err((code, reason));
            }
        };
        let page = Arc::new(PageHandle::new("smore-grant").map_err(|e| {
            (
                RefuseCode::Invalid,
                format!("cannot create the grant page: {e}"),
            )
        })?);
        let id = self.next_id;
        self.next_id += 1;
        let slot = if args.exec {
            0
        } else {
            gpu.min(MAX_DEVICES as u32 - 1)
        };
        let mut inst = Instance::from_persisted(
            Persisted {
                id,
                pid: peer.pid,
                start: proc::start_time(peer.pid).unwrap_or(0),
                uid: peer.uid,
                function: ask.function.clone(),
                model: ask.model.clone(),
                slo_ms: ask.slo_ms,
                gpu,
                slot,
                cap,
                share: 100,
                share_override: None,
            },
            Some(page.clone()),
            rule.clone(),
        );
        inst.predicted_train = pt;
        inst.predicted_fn = pf;
        inst.write_page();
        if let Some(pm) = self.prewarm.as_mut() {
            if !pm.status().iter().any(|f| f.function == ask.function) {
                pm.register(&ask.function, cap);
            }
        }
        self.instances.insert(id, inst);
        self.reshare(gpu);
        self.counters.registrations += 1;
        self.dirty = true;
        let share = self.instances[&id].share;
        self.event(
            "admitted",
            Some(id),
            Some(peer.pid),
            format!(
                "function {} → GPU {gpu}, cap {}, share {share} %; {rule}",
                ask.function,
                format_size(cap)
            ),
        );
        Ok((self.grant_of(id), page))
    }

    fn try_resume(&mut self, peer: Peer, id: u64) -> Option<(Grant, Arc<PageHandle>)> {
        let inst = self.instances.get_mut(&id)?;
        let same = inst.pid == peer.pid || proc::is_descendant_of(peer.pid, inst.pid);
        if inst.attached || !same || inst.uid != peer.uid {
            return None;
        }
        let page = Arc::new(PageHandle::new("smore-grant").ok()?);
        inst.page = Some(page.clone());
        inst.attached = true;
        inst.write_page();
        let (gpu, function) = (inst.gpu, inst.function.clone());
        self.event(
            "resumed",
            Some(id),
            Some(peer.pid),
            format!("function {function} re-attached on GPU {gpu}"),
        );
        Some((self.grant_of(id), page))
    }

    /// The grant of an instance as the protocol announces it.
    pub fn grant_of(&self, id: u64) -> Grant {
        let i = &self.instances[&id];
        let g = self.gpus.iter().find(|g| g.info.index == i.gpu);
        Grant {
            instance: id,
            gpu_index: i.gpu,
            gpu_uuid: g.map(|g| g.info.uuid.clone()).unwrap_or_default(),
            memory_cap: i.cap,
            sm_share: i.share,
            generation: i
                .page
                .as_ref()
                .map_or(0, |p| p.page().generation(i.slot as usize)),
            predicted_train: i.predicted_train,
            predicted_fn: i.predicted_fn,
            rule: i.rule.clone(),
        }
    }

    /// Releases an instance (connection closed, process gone, or `Release`).
    pub fn release(&mut self, id: u64, why: &str) {
        if let Some(inst) = self.instances.remove(&id) {
            self.counters.releases += 1;
            self.dirty = true;
            self.reshare(inst.gpu);
            self.event(
                "released",
                Some(id),
                Some(inst.pid),
                format!("function {} on GPU {}: {why}", inst.function, inst.gpu),
            );
        }
    }

    /// The connection of an attached instance closed. Keeps it (detached) if the process still
    /// lives — it may be an arbiter-side hiccup — only when `keep_if_alive`.
    pub fn disconnected(&mut self, id: u64) {
        let alive = self
            .instances
            .get(&id)
            .is_some_and(|i| proc::is_same_process(i.pid, i.start));
        if alive {
            // The process closed its connection but lives on: under the protocol that is a
            // release (the shim keeps the connection for the life of the process).
            self.release(id, "connection closed");
        } else {
            self.release(id, "process exited");
        }
    }

    /// Operator change of an instance's share (None = back to the policy's).
    pub fn set_share(&mut self, id: u64, share: Option<u32>) -> Result<u32, String> {
        if let Some(s) = share {
            if !(1..=100).contains(&s) {
                return Err(format!("share {s} is outside 1..=100 %"));
            }
        }
        let inst = self
            .instances
            .get_mut(&id)
            .ok_or_else(|| format!("no instance {id}"))?;
        inst.share_override = share;
        if let Some(s) = share {
            inst.share = s;
            inst.write_page();
        }
        let gpu = inst.gpu;
        self.dirty = true;
        self.reshare(gpu);
        let s = self.instances[&id].share;
        self.event(
            "share",
            Some(id),
            None,
            format!("share set to {s} % by the operator"),
        );
        Ok(s)
    }

    /// Operator change of an instance's memory cap (must still fit under σ).
    pub fn set_memory(&mut self, id: u64, bytes: u64) -> Result<(), String> {
        let inst = self
            .instances
            .get(&id)
            .ok_or_else(|| format!("no instance {id}"))?;
        let g = self
            .gpus
            .iter()
            .find(|g| g.info.index == inst.gpu)
            .ok_or("GPU gone")?;
        let free = self.view(g).free_for_functions(self.cfg.memory_safety) + inst.cap;
        if bytes > free {
            return Err(format!(
                "{} exceeds the {} available on GPU {}",
                format_size(bytes),
                format_size(free),
                inst.gpu
            ));
        }
        let inst = self.instances.get_mut(&id).expect("checked");
        inst.cap = bytes;
        inst.write_page();
        self.dirty = true;
        self.event(
            "memory",
            Some(id),
            None,
            format!("cap set to {} by the operator", format_size(bytes)),
        );
        Ok(())
    }

    /// A usage/latency report from an instance.
    pub fn report(
        &mut self,
        id: u64,
        latencies: &[f64],
        used: Option<u64>,
        throttled_ns: Option<u64>,
        refusals: Option<u64>,
    ) {
        let t = self.clock();
        if let (Some(pm), Some(i)) = (self.prewarm.as_mut(), self.instances.get(&id)) {
            // Each reported request is one arrival of the function in this minute.
            for _ in latencies.iter().filter(|l| l.is_finite() && **l >= 0.0) {
                if pm.request_begin(&i.function, t).is_ok() {
                    let _ = pm.request_end(&i.function, t);
                }
            }
        }
        if let Some(i) = self.instances.get_mut(&id) {
            for &l in latencies.iter().filter(|l| l.is_finite() && **l >= 0.0) {
                if i.latencies.len() >= MAX_LATENCIES {
                    i.latencies.pop_front();
                }
                i.latencies.push_back(l);
                i.requests += 1;
            }
            if used.is_some() {
                i.used_hint = used;
            }
            if let Some(t) = throttled_ns {
                i.throttled_ns = t;
            }
            if let Some(r) = refusals {
                i.refusals = r;
            }
        }
    }

    /// Request-level admission for an instance.
    pub fn admit_request(&mut self, id: u64) -> Admission {
        let Some(inst) = self.instances.get(&id) else {
            return Admission {
                admitted: false,
                predicted_train: None,
                predicted_fn: None,
                reason: "not registered".into(),
            };
        };
        let gpu = inst.gpu;
        let view = self
            .gpus
            .iter()
            .find(|g| g.info.index == gpu)
            .map(|g| self.view(g));
        let a = match view {
            Some(v) => self.policy.admit_request(&self.cfg, &v, id),
            None => Admission {
                admitted: false,
                predicted_train: None,
                predicted_fn: None,
                reason: "GPU gone".into(),
            },
        };
        if a.admitted {
            self.counters.admitted_requests += 1;
        } else {
            self.counters.deferred_requests += 1;
            if let Some(i) = self.instances.get_mut(&id) {
                i.deferred += 1;
            }
        }
        a
    }

    /// Folds one NVML sample per GPU into the state; returns the watchdog actions to carry out.
    pub fn reconcile(&mut self, samples: &[(u32, GpuSample)]) -> Vec<Enforcement> {
        // Instances whose process is gone are released first (pid-reuse safe).
        let dead: Vec<u64> = self
            .instances
            .values()
            .filter(|i| !proc::is_same_process(i.pid, i.start))
            .map(|i| i.id)
            .collect();
        for id in dead {
            self.release(id, "process exited");
        }
        let mut actions = Vec::new();
        let mut reshare = Vec::new();
        for (index, s) in samples {
            let Some(gi) = self.gpus.iter().position(|g| g.info.index == *index) else {
                continue;
            };
            let mut training = Vec::new();
            let mut per_inst: BTreeMap<u64, (u64, u32, Vec<u32>)> = BTreeMap::new();
            for (&pid, &used) in &s.procs {
                let owner = self
                    .instances
                    .values()
                    .find(|i| i.pid == pid || proc::is_descendant_of(pid, i.pid))
                    .map(|i| i.id);
                let util = s.proc_util.get(&pid).copied();
                match owner {
                    Some(id) => {
                        let e = per_inst.entry(id).or_default();
                        e.0 += used;
                        e.1 += util.unwrap_or(0);
                        e.2.push(pid);
                    }
                    None => training.push(TrainingProc {
                        pid,
                        used,
                        sm_util: util,
                    }),
                }
            }
            training.sort_by_key(|t| t.pid);
            let has_functions = self.instances.values().any(|i| i.gpu == *index);
            let g = &mut self.gpus[gi];
            let appeared = g.training.is_empty() != training.is_empty();
            g.used = s.used;
            g.util = s.util;
            g.training_used = training.iter().map(|t| t.used).sum();
            // Training utilization alone: NVML's per-process samples if present, else the device
            // utilization (which then includes nothing else, since no function is placed).
            if !has_functions || training.is_empty() {
                // The feedback loop starts again from the worst case with the next functions.
                g.training_colocated_util = None;
                g.budget_boost = 1.0;
            }
            if training.is_empty() {
                // Training left: what is known about its utilization goes with it.
                g.training_solo_util = None;
                g.solo_samples = 0;
            } else if !has_functions {
                let u = if training.iter().any(|t| t.sm_util.is_some()) {
                    training.iter().filter_map(|t| t.sm_util).sum::<u32>()
                } else {
                    s.util.unwrap_or(100)
                };
                let u = (u.min(100) as f64) / 100.0;
                g.solo_samples += 1;
                g.training_solo_util = Some(match g.training_solo_util {
                    Some(old) => old + SOLO_UTIL_ALPHA * (u - old),
                    None => u,
                });
            } else if let Some(u) = training.iter().map(|t| t.sm_util).sum::<Option<u32>>() {
                // Co-located, training's own samples are a lower bound of its solo use: one that
                // exceeds a trusted estimate (a job ramping up after functions arrived) raises
                // it — the safe direction. They never create an estimate (unknown stays "fully
                // busy").
                let u = (u.min(100) as f64) / 100.0;
                if g.trusted_solo_util().is_some_and(|old| u > old) {
                    g.training_solo_util = Some(u);
                }
                g.training_colocated_util = Some(match g.training_colocated_util {
                    Some(old) => old + SOLO_UTIL_ALPHA * (u - old),
                    None => u,
                });
            }
            g.training = training;
            let drift = match (g.trusted_solo_util(), g.solo_util_at_last_share) {
                (Some(a), Some(b)) => (a - b).abs() > RESHARE_DELTA,
                (Some(_), None) => true,
                _ => false,
            };
            if appeared || drift {
                reshare.push(*index);
            }
            for inst in self.instances.values_mut().filter(|i| i.gpu == *index) {
                let (used, util, pids) = per_inst.remove(&inst.id).unwrap_or_default();
                inst.nvml_used = used;
                inst.sm_used = (!pids.is_empty()).then_some(util);
                if pids.is_empty() {
                    continue;
                }
                if self.cfg.check_shim {
                    let loaded = pids
                        .iter()
                        .all(|&p| proc::maps_library(p, "libsmore_shim").unwrap_or(true));
                    inst.shim_loaded = Some(loaded);
                    if !loaded && !inst.acted_on {
                        inst.acted_on = true;
                        for &p in &pids {
                            actions.push(Enforcement {
                                pid: p,
                                action: self.cfg.watchdog_action,
                                instance: inst.id,
                                reason: format!(
                                    "process {p} of function {} uses GPU {index} without the smore shim",
                                    inst.function
                                ),
                            });
                        }
                        continue;
                    }
                }
                // A function whose GPU time exceeds its share for long: the shim is bypassed
                // for launches (raw driver pointers, direct ioctls) or not working.
                let over = inst.share < 100 && util > inst.share + SM_SLACK_PCT;
                inst.over_share = if over { inst.over_share + 1 } else { 0 };
                if inst.over_share >= SM_OVERUSE_SAMPLES && !inst.acted_on {
                    inst.acted_on = true;
                    for &p in &pids {
                        actions.push(Enforcement {
                            pid: p,
                            action: self.cfg.watchdog_action,
                            instance: inst.id,
                            reason: format!(
                                "function {} uses {util} % of GPU {index}'s SM time in NVML, over its share {} % + {SM_SLACK_PCT} for {} samples",
                                inst.function, inst.share, SM_OVERUSE_SAMPLES
                            ),
                        });
                    }
                    continue;
                }
                if used > inst.cap.saturating_add(self.cfg.memory_slack) && !inst.acted_on {
                    inst.acted_on = true;
                    for &p in &pids {
                        actions.push(Enforcement {
                            pid: p,
                            action: self.cfg.watchdog_action,
                            instance: inst.id,
                            reason: format!(
                                "function {} uses {} on GPU {index} in NVML, over its cap {} + slack {}",
                                inst.function,
                                format_size(used),
                                format_size(inst.cap),
                                format_size(self.cfg.memory_slack)
                            ),
                        });
                    }
                }
            }
        }
        for gpu in reshare {
            self.reshare(gpu);
        }
        self.rounds += 1;
        if self.rounds.is_multiple_of(OBSERVE_EVERY) {
            self.observe();
        }
        for a in &actions {
            self.counters.watchdog_actions += 1;
            self.event(
                "watchdog",
                Some(a.instance),
                Some(a.pid),
                format!("{:?}: {}", a.action, a.reason),
            );
        }
        actions
    }

    /// The latest pre-warm hints.
    pub fn hints(&self) -> Vec<smore_protocol::wire::Hint> {
        self.hints.clone()
    }

    /// Feeds observed degradations to the policy (online learning): per GPU with functions and a
    /// training job, the training slowdown estimated from NVML — the job's utilization now
    /// against its solo utilization (a time-sliced job that keeps its work per iteration and gets
    /// less of the GPU shows proportionally lower utilization) — and each function's median
    /// reported latency.
    fn observe(&mut self) {
        let views = self.views();
        let mut reshare = Vec::new();
        for (gi, view) in views.into_iter().enumerate() {
            if view.grants.is_empty() {
                continue;
            }
            let g = &self.gpus[gi];
            let slowdown = match (g.trusted_solo_util(), g.training_colocated_util) {
                (Some(solo), Some(u)) if u > 0.0 && !g.training.is_empty() => {
                    Some((solo / u - 1.0).clamp(0.0, 5.0))
                }
                _ => None,
            };
            // Feedback: the time budget θ/(u+θ) assumes every function uses its whole share
            // all the time; real functions mostly do not. While the slowdown measured from
            // NVML stays under θ/2 and some function is held at its share, the budget grows by
            // 25 % per observation (up to BOOST_MAX×); above θ it shrinks by a third, back to
            // the worst case at most.
            if let Some(d) = slowdown {
                let constrained = self.instances.values().any(|i| {
                    i.gpu == g.info.index
                        && i.share < 100
                        && i.sm_used.is_some_and(|u| u as f64 >= 0.7 * i.share as f64)
                });
                let old = g.budget_boost;
                let new = if d > self.cfg.theta_train {
                    (old / 1.5).max(1.0)
                } else if d < self.cfg.theta_train / 2.0 && constrained {
                    (old * 1.25).min(BOOST_MAX)
                } else {
                    old
                };
                if new != old {
                    self.gpus[gi].budget_boost = new;
                    reshare.push(self.gpus[gi].info.index);
                    tracing::info!(
                        "GPU {}: training slowdown {:.1} % (θ {:.0} %) → time budget ×{new:.2}",
                        self.gpus[gi].info.index,
                        d * 100.0,
                        self.cfg.theta_train * 100.0
                    );
                }
            }
            let g = &self.gpus[gi];
            let lat: Vec<(u64, f64)> = self
                .instances
                .values()
                .filter(|i| i.gpu == g.info.index)
                .filter_map(|i| Some((i.id, i.latency_percentile(0.5)?)))
                .collect();
            if slowdown.is_some() || !lat.is_empty() {
                self.policy.observe(&view, slowdown, &lat);
            }
        }
        for gpu in reshare {
            self.reshare(gpu);
        }
    }

    /// What survives a restart.
    pub fn persisted(&self) -> PersistFile {
        PersistFile {
            version: PERSIST_VERSION,
            next_id: self.next_id,
            instances: self
                .instances
                .values()
                .map(|i| Persisted {
                    id: i.id,
                    pid: i.pid,
                    start: i.start,
                    uid: i.uid,
                    function: i.function.clone(),
                    model: i.model.clone(),
                    slo_ms: i.slo_ms,
                    gpu: i.gpu,
                    slot: i.slot,
                    cap: i.cap,
                    share: i.share,
                    share_override: i.share_override,
                })
                .collect(),
        }
    }

    /// Re-adopts the instances of a previous arbiter whose processes still live: their memory
    /// stays counted (no double counting when they re-register with `resume`).
    pub fn restore(&mut self, file: PersistFile) {
        self.next_id = self.next_id.max(file.next_id);
        for p in file.instances {
            if !proc::is_same_process(p.pid, p.start)
                || !self.gpus.iter().any(|g| g.info.index == p.gpu)
            {
                continue;
            }
            self.next_id = self.next_id.max(p.id + 1);
            let msg = format!("function {} (pid {}) kept from the previous arbiter; waiting for it to re-register", p.function, p.pid);
            let id = p.id;
            self.instances.insert(
                id,
                Instance::from_persisted(p, None, "restored after arbiter restart".into()),
            );
            let pid = self.instances[&id].pid;
            self.event("restored", Some(id), Some(pid), msg);
        }
    }

    /// The status snapshot (`smore status --json`; schema in docs/cli.md).
    pub fn snapshot(&self) -> serde_json::Value {
        let gpus: Vec<serde_json::Value> = self
            .gpus
            .iter()
            .map(|g| {
                let view = self.view(g);
                let functions: Vec<serde_json::Value> = self
                    .instances
                    .values()
                    .filter(|i| i.gpu == g.info.index)
                    .map(|i| {
                        let mut v = serde_json::to_value(i).unwrap_or_default();
                        v["p50_ms"] = serde_json::json!(i.latency_percentile(0.5));
                        v["p99_ms"] = serde_json::json!(i.latency_percentile(0.99));
                        v
                    })
                    .collect();
                let mut v = serde_json::to_value(g).unwrap_or_default();
                v["granted"] = serde_json::json!(view.grants.iter().map(|x| x.cap).sum::<u64>());
                v["free_for_functions"] =
                    serde_json::json!(view.free_for_functions(self.cfg.memory_safety));
                v["functions"] = serde_json::Value::Array(functions);
                v
            })
            .collect();
        serde_json::json!({
            "arbiter": {
                "version": env!("CARGO_PKG_VERSION"),
                "policy": self.policy.name(),
                "socket": self.cfg.socket,
                "memory_safety": self.cfg.memory_safety,
                "theta_train": self.cfg.theta_train,
                "failure_policy": self.cfg.failure_policy,
                "started_at": self.started_at,
                "now": now(),
            },
            "gpus": gpus,
            "counters": self.counters,
            "prewarm": {
                "policy": self.cfg.prewarm_policy,
                "warm_memory": self.warm_memory(),
                "hints": self.hints,
            },
            "events": self.events,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::FitPolicy;

    fn state() -> State {
        let gpus = vec![
            GpuInfo {
                index: 0,
                uuid: "GPU-0".into(),
                name: "sim".into(),
                total: 10 << 30,
            },
            GpuInfo {
                index: 1,
                uuid: "GPU-1".into(),
                name: "sim".into(),
                total: 10 << 30,
            },
        ];
        State::new(Config::default(), gpus, Box::new(FitPolicy))
    }

    fn me() -> Peer {
        Peer {
            pid: std::process::id(),
            uid: 0,
        }
    }

    fn args(mem: u64) -> RegisterArgs {
        RegisterArgs {
            function: "f".into(),
            memory: Some(mem),
            exec: true,
            ..Default::default()
        }
    }

    #[test]
    fn grants_are_written_to_the_page_before_they_are_announced() {
        let mut s = state();
        let (g, page) = s.register(me(), args(1 << 30)).unwrap();
        assert_eq!(page.page().cap(0), 1 << 30);
        assert_eq!(page.page().share(0), 100);
        assert_eq!(page.page().cap(1), 0, "other devices get no memory");
        assert_eq!(g.memory_cap, 1 << 30);
        s.set_share(g.instance, Some(30)).unwrap();
        assert_eq!(page.page().share(0), 30);
        assert!(s.set_share(g.instance, Some(0)).is_err());
    }

    #[test]
    fn memory_is_never_overcommitted() {
        let mut s = state();
        // 2 GPUs × 9.5 GiB usable: 4 × 4 GiB fit (2 per GPU), the fifth does not.
        for _ in 0..4 {
            s.register(me(), args(4 << 30)).unwrap();
        }
        let e = s.register(me(), args(4 << 30)).unwrap_err();
        assert_eq!(e.0, RefuseCode::NoMemory);
        assert_eq!(s.counters.refusals, 1);
        for g in s.views() {
            assert!(g.grants.iter().map(|x| x.cap).sum::<u64>() as f64 <= 0.95 * g.total as f64);
        }
    }

    #[test]
    fn training_processes_are_detected_and_shares_follow_them() {
        let mut s = state();
        let (g, page) = s.register(me(), args(1 << 30)).unwrap();
        // A process that did not register (pid 1 is never ours) appears on the instance's GPU.
        let mut sample = GpuSample {
            used: 3 << 30,
            util: Some(60),
            ..Default::default()
        };
        sample.procs.insert(1, 2 << 30);
        sample.proc_util.insert(1, 60);
        // While a function is placed, training util is not its solo util: share stays unknown ⇒
        // the safe assumption (fully busy) applies.
        s.reconcile(&[(g.gpu_index, sample)]);
        let gpu = &s.gpus[g.gpu_index as usize];
        assert_eq!(gpu.training.len(), 1);
        assert_eq!(gpu.training_used, 2 << 30);
        // budget for u = 1, θ = 0.1: 0.1/1.1 = 0.0909 ⇒ 9 %.
        assert_eq!(page.page().share(0), 9);
    }

    #[test]
    fn persisted_instances_are_restored_once_and_resumed() {
        let mut s = state();
        let (g, _) = s.register(me(), args(2 << 30)).unwrap();
        let file = s.persisted();
        let mut s2 = state();
        s2.restore(file);
        assert_eq!(s2.instances.len(), 1);
        assert!(!s2.instances[&g.instance].attached);
        // Its memory still counts.
        assert_eq!(s2.views()[g.gpu_index as usize].grants.len(), 1);
        let mut a = args(2 << 30);
        a.resume = Some(g.instance);
        let (g2, page) = s2.register(me(), a).unwrap();
        assert_eq!(g2.instance, g.instance);
        assert_eq!(s2.instances.len(), 1, "no double counting");
        assert_eq!(page.page().cap(0), 2 << 30);
        // Resuming an attached instance again is refused, not registered twice.
        let mut again = args(2 << 30);
        again.resume = Some(g.instance);
        assert_eq!(s2.register(me(), again).unwrap_err().0, RefuseCode::Invalid);
        assert_eq!(s2.instances.len(), 1);
        // A dead process is not restored.
        let mut file = s2.persisted();
        file.instances[0].start += 1;
        let mut s3 = state();
        s3.restore(file);
        assert!(s3.instances.is_empty());
    }

    #[test]
    fn an_instance_over_its_cap_in_nvml_gets_the_watchdog() {
        let mut s = state();
        let (g, _) = s.register(me(), args(1 << 30)).unwrap();
        s.cfg.check_shim = false;
        let mut sample = GpuSample::default();
        sample
            .procs
            .insert(std::process::id(), (1 << 30) + (65 << 20));
        let acts = s.reconcile(&[(g.gpu_index, sample.clone())]);
        assert_eq!(acts.len(), 1);
        assert_eq!(acts[0].action, WatchdogAction::Sigterm);
        assert_eq!(s.counters.watchdog_actions, 1);
        // Acted on once, not every period.
        assert!(s.reconcile(&[(g.gpu_index, sample)]).is_empty());
    }

    #[test]
    fn the_time_budget_follows_the_measured_training_slowdown() {
        let mut s = state();
        s.cfg.check_shim = false;
        let me_pid = std::process::id();
        let sample = |train: u32, func: u32| {
            let mut x = GpuSample::default();
            x.procs.insert(1, 1 << 30);
            x.proc_util.insert(1, train);
            if func > 0 {
                x.procs.insert(me_pid, 1 << 20);
                x.proc_util.insert(me_pid, func);
            }
            x
        };
        // The trainer alone long enough for its solo utilization (60 %) to be trusted.
        for _ in 0..SOLO_MIN_SAMPLES {
            s.reconcile(&[(0, sample(60, 0))]);
        }
        let (g, page) = s
            .register(
                me(),
                RegisterArgs {
                    gpu: Some(0),
                    ..args(1 << 30)
                },
            )
            .unwrap();
        assert_eq!(g.gpu_index, 0);
        let base = page.page().share(0);
        assert_eq!(base, 14, "worst case θ/(u+θ) = 0.1/0.7");
        // Training barely slowed (60 → 58 %) while the function uses its share: the budget grows.
        for _ in 0..3 * OBSERVE_EVERY {
            s.reconcile(&[(0, sample(58, base))]);
        }
        let grown = page.page().share(0);
        assert!(grown > base, "share {grown} did not grow");
        assert!(s.gpus[0].budget_boost > 1.0);
        // Training slowed by 50 % (60 → 40 %): the budget shrinks back.
        for _ in 0..6 * OBSERVE_EVERY {
            s.reconcile(&[(0, sample(40, grown))]);
        }
        assert_eq!(s.gpus[0].budget_boost, 1.0);
        assert_eq!(page.page().share(0), base);
    }

    #[test]
    fn sustained_sm_overuse_gets_the_watchdog() {
        let mut s = state();
        s.cfg.check_shim = false;
        let (g, page) = s.register(me(), args(1 << 30)).unwrap();
        let mut sample = GpuSample::default();
        sample.procs.insert(1, 1 << 30); // a training process: shares drop below 100
        sample.proc_util.insert(1, 40);
        sample.procs.insert(std::process::id(), 1 << 20);
        sample.proc_util.insert(std::process::id(), 60);
        // The first sample reveals the trainer; the share drops below 100 after it.
        assert!(s.reconcile(&[(g.gpu_index, sample.clone())]).is_empty());
        let mut acts = Vec::new();
        for _ in 0..SM_OVERUSE_SAMPLES {
            assert!(acts.is_empty(), "acted too early");
            acts = s.reconcile(&[(g.gpu_index, sample.clone())]);
        }
        assert!(page.page().share(0) < 100);
        assert_eq!(acts.len(), 1);
        assert!(
            acts[0].reason.contains("over its share"),
            "{}",
            acts[0].reason
        );
        // Within the share (+ slack) nothing happens.
        let mut s = state();
        s.cfg.check_shim = false;
        let (g, _) = s.register(me(), args(1 << 30)).unwrap();
        sample.proc_util.insert(std::process::id(), 10);
        for _ in 0..2 * SM_OVERUSE_SAMPLES {
            assert!(s.reconcile(&[(g.gpu_index, sample.clone())]).is_empty());
        }
    }

    #[test]
    fn a_registered_process_without_the_shim_is_caught() {
        let mut s = state();
        let (g, _) = s.register(me(), args(1 << 30)).unwrap();
        let mut sample = GpuSample::default();
        sample.procs.insert(std::process::id(), 1 << 20);
        let acts = s.reconcile(&[(g.gpu_index, sample)]);
        assert_eq!(acts.len(), 1, "the test process has no shim mapped");
        assert!(acts[0].reason.contains("without the smore shim"));
    }

    #[test]
    fn snapshot_has_the_documented_shape() {
        let mut s = state();
        s.register(me(), args(1 << 30)).unwrap();
        let v = s.snapshot();
        assert_eq!(v["gpus"].as_array().unwrap().len(), 2);
        assert_eq!(v["arbiter"]["policy"], "fit");
        let f = v["gpus"][0]["functions"][0].clone();
        assert_eq!(f["cap"], 1u64 << 30);
        assert_eq!(f["function"], "f");
        assert_eq!(v["counters"]["registrations"], 1);
    }
}

#[cfg(test)]
mod prewarm_tests {
    use super::*;
    use crate::policy::FitPolicy;

    #[test]
    fn reported_requests_drive_prewarm_hints() {
        let gpus = vec![GpuInfo {
            index: 0,
            uuid: "GPU-0".into(),
            name: "sim".into(),
            total: 10 << 30,
        }];
        let cfg = Config {
            prewarm_policy: "fixed-10".into(),
            ..Config::default()
        };
        let mut s = State::new(cfg, gpus, Box::new(FitPolicy));
        let peer = Peer {
            pid: std::process::id(),
            uid: 0,
        };
        let args = RegisterArgs {
            function: "f".into(),
            memory: Some(1 << 30),
            exec: true,
            ..Default::default()
        };
        let (g, _) = s.register(peer, args).unwrap();
        s.report(g.instance, &[3.0, 4.0], None, None, None);
        // A new minute: the function is loaded and had requests ⇒ a fixed keep-alive keeps it.
        s.prewarm_minute = None;
        s.started_at -= 60.0;
        s.prewarm_tick();
        assert_eq!(s.hints.len(), 1, "{:?}", s.hints);
        assert_eq!(s.hints[0].function, "f");
        assert_eq!(s.hints[0].action, "keep");
        assert_eq!(s.warm_memory(), 1 << 30);
        let snap = s.snapshot();
        assert_eq!(snap["prewarm"]["hints"][0]["action"], "keep");
    }
}
