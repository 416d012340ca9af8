//! The arbiter's node state and every transition of it: registration, release, live share and
//! cap changes, NVML reconciliation, persistence records and the status snapshot.
//!
//! Pure over injected facts: sockets (`server`) and NVML (`gpus`) feed it samples, and the clock
//! and process facts come through [`facts::Clock`] and [`facts::ProcFacts`], so every rule is
//! unit-tested with fakes. The rules live in small modules: [`attribution`] (which process is
//! whose), [`training`] (the training estimate), [`memory`] (training's high-water marks and
//! headroom), [`reclaim`] (taking memory back when training grows), [`watchdog`] (the checks),
//! [`crate::budget`] (the functions' time budget), [`events`], [`persist`], [`instance`].
//!
//! Invariants: (1) for every GPU, Σ caps of grants + training's reservation (high-water mark +
//! headroom) ≤ σ·capacity at admission time, restored by a reclaim when training's growth pushes
//! memory past the reclaim line; (2) every grant's page holds exactly the cap and share in this state (writes happen
//! before the reply that announces them); (3) an instance is counted once — a re-registration
//! with `resume` re-attaches the persisted instance instead of adding one.
//!
//! Must never: block, touch sockets or NVML, or treat a process it cannot read as another's.

pub mod attribution;
pub mod events;
pub mod facts;
pub mod instance;
pub mod memory;
pub mod persist;
pub mod reclaim;
pub mod reload;
pub mod training;
pub mod watchdog;

use crate::budget::{FunctionLoad, TimeBudget};
use crate::config::{Config, DeferMode, TurnsMode, WatchdogAction};
use crate::gpus::{GpuInfo, GpuSample, Sharing};
use crate::grantpage::{BoardHandle, PageHandle};
pub use crate::harvest::ShimUsage;
use crate::harvest::{self, ContentionMeter, Demand, Harvest};
use crate::policy::{Admission, Ask, Decision, GpuView, GrantView, Policy};
use events::{Event, EventKind, EventLog};
use facts::{Clock, LiveProcs, ProcFacts, SystemClock};
pub use instance::Instance;
pub use memory::TrainingMemory;
pub use persist::{
    HarvestRecord, PersistFile, Persisted, Preemption, Record, ThrottleRecord, Trainer,
    PERSIST_VERSION,
};
use serde::Serialize;
use smore_protocol::board::BOARD_MEMBERS;
use smore_protocol::grant::TimingNoise;
use smore_protocol::phase;
use smore_protocol::size::format_size;
use smore_protocol::wire::{Grant, Hint, HintAction, RefuseCode, Register, MAX_NAME};
use std::collections::BTreeMap;
use std::sync::Arc;
pub use training::{TrainingEstimate, TrainingProc};
pub use watchdog::Violation;

/// Reconcile rounds between two observations fed to the policy's online learning (20 × 250 ms
/// = 5 s: long enough for NVML's 1/6 s samples and the reported latencies to average out).
pub const OBSERVE_EVERY: u64 = 20;
/// Reconcile rounds between two harvest steps (4 × 250 ms = 1 s): each GPU's collision budget is
/// split again among its functions by what they used over the interval (docs/harvest.md). Shims
/// report their counters about once a second; a shorter interval would mostly see no report.
pub const HARVEST_EVERY: u64 = 4;
/// Seconds a function under harvest may run before NVML use without any usage report from its
/// shim counts as unaccounted (the shim reports within ~1 s of its first launch).
pub const REPORT_GRACE_S: f64 = 10.0;

/// An instance id (what the protocol's `Grant::instance` carries).
pub type InstanceId = u64;

/// Who is asking, from `SO_PEERCRED`.
#[derive(Debug, Clone, Copy)]
pub struct Peer {
    /// Process id.
    pub pid: u32,
    /// User id.
    pub uid: u32,
}

/// A registration request with defaults not yet applied (the protocol's one definition).
pub type RegisterArgs = Register;

/// A registration the arbiter refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{reason}")]
pub struct Refusal {
    /// The class (and `smore run`'s exit code).
    pub code: RefuseCode,
    /// Why, for a person.
    pub reason: String,
}

/// Why an operator request failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StateError {
    /// No such instance.
    #[error("no instance {0}; `smore status` lists the live ones")]
    NoInstance(InstanceId),
    /// A share outside 1..=100.
    #[error("share {0} is outside 1..=100 %; pass 0 to return to the policy's share")]
    ShareOutOfRange(u32),
    /// The cap does not fit.
    #[error("{} exceeds the {} available on GPU {gpu}; ask for less or release other functions", format_size(*.asked), format_size(*.free))]
    NoRoom {
        /// Asked, bytes.
        asked: u64,
        /// Available to this instance, bytes.
        free: u64,
        /// The GPU.
        gpu: u32,
    },
    /// The instance's GPU is no longer managed.
    #[error("GPU {0} of the instance is no longer managed; release the instance")]
    GpuGone(u32),
}

/// A managed GPU.
#[derive(Serialize)]
pub struct Gpu {
    /// What NVML says about it.
    #[serde(flatten)]
    pub info: GpuInfo,
    /// Memory in use (NVML), bytes.
    pub used: u64,
    /// Device utilization, percent.
    pub util: Option<u32>,
    /// Training processes in the last sample.
    pub training: Vec<TrainingProc>,
    /// Their memory, bytes.
    pub training_used: u64,
    /// Training's utilization, alone and co-located.
    #[serde(flatten)]
    pub estimate: TrainingEstimate,
    /// Training's memory: high-water marks, growth, reclaim hold.
    #[serde(flatten)]
    pub memory: TrainingMemory,
    /// The functions' time budget.
    #[serde(flatten)]
    pub budget: TimeBudget,
    /// Memory functions' processes use on this GPU without a grant for it, bytes (last sample):
    /// counted by admission like training's reservation (issue 12, item 9).
    pub ungranted_used: u64,
    /// How its processes share it (NVML's MPS client list), as last known: `time-sliced`, `mps`,
    /// or null before any sample told.
    pub sharing: Option<Sharing>,
    /// Whether, in the last sample, one MPS server the arbiter recognizes ran every other
    /// compute process of the GPU as its client ([`page_sharing`]).
    #[serde(skip)]
    pub one_mps_server: bool,
    /// Percent points by which NVML's per-process SM figures sum past the device's utilization
    /// in the last sample (0 under MPS): on a time-sliced GPU a process's figure can count time
    /// that was another's, and the watchdog judges functions without it
    /// ([`watchdog::attribution_overlap`]).
    pub sm_overlap: u32,
    /// Harvest: the functions' collision time with training, as their shims report it.
    #[serde(skip)]
    pub meter: ContentionMeter,
    /// Harvest: the GPU's collision budget.
    #[serde(skip)]
    pub harvest: Harvest,
    /// Harvest: the GPU's turn board, handed with each grant on it (None: the memfd could not
    /// be made; the functions then run without turns). docs/harvest.md, "Serializing the
    /// functions".
    #[serde(skip)]
    pub board: Option<Arc<BoardHandle>>,
}

impl Gpu {
    fn new(info: GpuInfo, theta: f64) -> Gpu {
        Gpu {
            used: 0,
            util: None,
            training: Vec::new(),
            training_used: 0,
            ungranted_used: 0,
            sharing: None,
            one_mps_server: false,
            sm_overlap: 0,
            estimate: TrainingEstimate::default(),
            memory: TrainingMemory::default(),
            budget: TimeBudget::default(),
            meter: ContentionMeter::default(),
            harvest: Harvest::new(theta),
            board: match BoardHandle::new() {
                Ok(b) => Some(Arc::new(b)),
                Err(e) => {
                    tracing::warn!(
                        "GPU {}: cannot create its turn board ({e}); its functions run without \
                         turns",
                        info.index
                    );
                    None
                }
            },
            info,
        }
    }

    /// Training's solo utilization once enough samples back it.
    pub fn trusted_solo_util(&self) -> Option<f64> {
        self.estimate.trusted()
    }
}

/// Running totals for metrics.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Counters {
    /// Admitted registrations.
    pub registrations: u64,
    /// Refused registrations.
    pub refusals: u64,
    /// Released instances.
    pub releases: u64,
    /// Watchdog actions.
    pub watchdog_actions: u64,
    /// Requests admitted by request-level admission.
    pub admitted_requests: u64,
    /// Requests deferred.
    pub deferred_requests: u64,
    /// Training growth events (a new training process or a higher high-water mark).
    pub growth_events: u64,
    /// Reclaims: times memory was taken back from functions on a GPU.
    pub reclaims: u64,
    /// Caps lowered to what their function holds.
    pub caps_lowered: u64,
    /// Bytes of caps taken back by lowering.
    pub bytes_lowered: u64,
    /// Idle instances unloaded for training.
    pub unloaded: u64,
    /// Running instances preempted for training.
    pub preempted: u64,
    /// Preempted instances killed after their grace period.
    pub preempt_kills: u64,
    /// Requests refused because their instance was preempted.
    pub preempted_requests: u64,
    /// Registrations refused because admission was held after a reclaim.
    pub held_refusals: u64,
}

/// A watchdog action for the caller to carry out.
#[derive(Debug, Clone, PartialEq)]
pub struct Enforcement {
    /// The process to act on.
    pub pid: u32,
    /// What to do.
    pub action: WatchdogAction,
    /// Its instance.
    pub instance: InstanceId,
    /// What it did wrong.
    pub violation: Violation,
    /// Why, for a person.
    pub reason: String,
}

/// The online prewarm manager, or why there is none.
enum Prewarm {
    Off,
    On(Box<smore_prewarm::PrewarmManager>),
    Failed(String),
}

/// The node.
pub struct State {
    /// The configuration.
    pub cfg: Config,
    /// The managed GPUs.
    pub gpus: Vec<Gpu>,
    /// Live (and restored) instances.
    pub instances: BTreeMap<InstanceId, Instance>,
    next_id: InstanceId,
    /// Recent events and the decision log.
    pub events: EventLog,
    /// Running totals.
    pub counters: Counters,
    policy: Box<dyn Policy>,
    /// When the arbiter started, seconds since the epoch.
    pub started_at: f64,
    /// Set when something persisted changed.
    pub dirty: bool,
    /// Snapshots taken for persistence so far (orders concurrent writes).
    pub persist_generation: u64,
    /// The newest snapshot generation on disk (its own lock: files are written outside the
    /// state lock, one at a time).
    pub persist_written: Arc<std::sync::Mutex<u64>>,
    /// The latest pre-warm hints (refreshed every minute by `prewarm_tick`).
    pub hints: Vec<Hint>,
    prewarm: Prewarm,
    prewarm_minute: Option<u64>,
    /// Reconcile rounds so far (observations go to the policy every OBSERVE_EVERY rounds).
    rounds: u64,
    clock: Box<dyn Clock>,
    procs: Box<dyn ProcFacts>,
    /// Which GPU process is whose, remembered across rounds.
    attributor: attribution::Attributor,
    /// Functions' descendants as the kernel forked them (crate::lineage).
    lineage: Arc<crate::lineage::Lineage>,
    /// Functions that released their grant and live on, by pid: still watched (a release must
    /// not turn a function into an unwatched "training" process).
    released: std::collections::HashMap<u32, Released>,
}

/// A function that gave its grant back while its process lives on.
struct Released {
    life: facts::Tracked,
    instance: InstanceId,
    function: String,
    gpu: u32,
    escalation: watchdog::Escalation,
}

fn hint_action(a: smore_prewarm::policy::Action) -> HintAction {
    match a {
        smore_prewarm::policy::Action::Load => HintAction::Load,
        smore_prewarm::policy::Action::Keep => HintAction::Keep,
        smore_prewarm::policy::Action::Unload => HintAction::Unload,
    }
}

impl State {
    /// A state over this machine's clock and `/proc`.
    pub fn new(cfg: Config, gpus: Vec<GpuInfo>, policy: Box<dyn Policy>) -> State {
        let procs = LiveProcs {
            shim: facts::ShimCheck::installed(),
        };
        State::with_facts(cfg, gpus, policy, Box::new(SystemClock), Box::new(procs))
    }

    /// A state over injected facts (tests).
    pub fn with_facts(
        cfg: Config,
        gpus: Vec<GpuInfo>,
        policy: Box<dyn Policy>,
        clock: Box<dyn Clock>,
        procs: Box<dyn ProcFacts>,
    ) -> State {
        let prewarm = Prewarm::from_policy(&cfg.prewarm_policy);
        let gpus = gpus
            .into_iter()
            .filter(|g| {
                cfg.gpu_indices
                    .as_ref()
                    .is_none_or(|l| l.contains(&g.index))
            })
            .map(|g| Gpu::new(g, cfg.theta_train))
            .collect();
        // The decision log: only a daemon with a state directory keeps one.
        let log = cfg
            .state_dir
            .is_dir()
            .then(|| cfg.state_dir.join("decisions.jsonl"));
        let started_at = clock.now();
        let mut st = State {
            cfg,
            gpus,
            instances: BTreeMap::new(),
            next_id: 1,
            events: EventLog::new(log),
            counters: Counters::default(),
            policy,
            started_at,
            dirty: false,
            persist_generation: 0,
            persist_written: Default::default(),
            hints: Vec::new(),
            prewarm,
            prewarm_minute: None,
            rounds: 0,
            clock,
            procs,
            attributor: attribution::Attributor::default(),
            lineage: Default::default(),
            released: Default::default(),
        };
        if let Prewarm::Failed(why) = &st.prewarm {
            let why = why.clone();
            tracing::warn!("{why}");
            st.event(EventKind::Arbiter, None, None, why);
        }
        st.set_turns();
        st
    }

    /// The functions' registered processes: live instances, and functions that released their
    /// grant and live on. Several instances may share a process (a runtime registering more
    /// than once): its GPU use goes to the oldest, as it always has.
    fn roots(&self) -> attribution::Roots {
        let mut roots = attribution::Roots::new();
        for i in self.instances.values() {
            roots
                .entry(i.rec.pid)
                .or_insert(attribution::Owner::Instance(i.rec.id));
        }
        for (&pid, r) in &self.released {
            roots
                .entry(pid)
                .or_insert(attribution::Owner::Released(r.instance));
        }
        roots
    }

    /// Whether `peer` may change shares and caps: its user or one of its groups is listed in
    /// `[arbiter] operators`, and it is neither a function's process nor a descendant of one,
    /// whatever its user (a function running as root must not raise its own cap). Err: why not,
    /// for the refusal.
    pub fn operator(&self, peer: Peer) -> Result<(), String> {
        if peer.pid == 0 {
            // Outside the arbiter's pid namespace: whether it is a function cannot be told.
            return Err(
                "the arbiter cannot see this process's pid (SO_PEERCRED reports 0 outside its pid namespace), so it cannot tell it is not a function: send operator requests from the arbiter's pid namespace".into(),
            );
        }
        let roots = self.roots();
        if let Some(start) = self.procs.start_time(peer.pid) {
            let owner = self
                .attributor
                .resolve(peer.pid, start, &roots, self.procs.as_ref());
            let id = match owner {
                attribution::Owner::Instance(id) | attribution::Owner::Released(id) => Some(id),
                attribution::Owner::Training | attribution::Owner::MpsServer => None,
            };
            if let Some(id) = id {
                let function = self
                    .instances
                    .get(&id)
                    .map(|i| i.rec.function.clone())
                    .or_else(|| {
                        self.released
                            .values()
                            .find(|r| r.instance == id)
                            .map(|r| r.function.clone())
                    })
                    .unwrap_or_default();
                return Err(format!(
                    "process {} belongs to function {function} (instance {id}): a function or its descendant is never an operator, whatever its user; change shares and caps from outside the function",
                    peer.pid
                ));
            }
        }
        let groups = if self.cfg.operators.has_groups() {
            self.procs.groups(peer.pid).unwrap_or_default()
        } else {
            Vec::new()
        };
        if self.cfg.operators.admits(peer.uid, &groups) {
            Ok(())
        } else {
            Err(format!(
                "uid {} is not an operator on this node: `[arbiter] operators` lists the users and @groups that may change shares and caps",
                peer.uid
            ))
        }
    }

    /// Follows functions' descendants through `lineage` (the daemon's fork-event record):
    /// attribution asks it before walking parents, and every live function is a root of it.
    pub fn set_lineage(&mut self, lineage: Arc<crate::lineage::Lineage>) {
        for i in self.instances.values() {
            lineage.add_root(i.rec.pid, i.rec.start);
        }
        self.attributor = attribution::Attributor::with_lineage(lineage.clone());
        self.lineage = lineage;
    }

    /// Seconds since the arbiter started (the prewarm clock; minute = ⌊t/60⌋).
    fn uptime(&self) -> f64 {
        (self.clock.now() - self.started_at).max(0.0)
    }

    /// Start of a new minute: ask the prewarm policy for hints (called by the reconcile loop).
    pub fn prewarm_tick(&mut self) {
        let minute = (self.uptime() / 60.0) as u64;
        if self.prewarm_minute == Some(minute) {
            return;
        }
        self.prewarm_minute = Some(minute);
        let Prewarm::On(pm) = &mut self.prewarm else {
            return;
        };
        // Residency is what the node actually has: a function is loaded iff an instance runs.
        let names: Vec<String> = pm.status().iter().map(|f| f.function.clone()).collect();
        for n in names {
            let loaded = self.instances.values().any(|i| i.rec.function == n);
            let _ = pm.set_loaded(&n, loaded);
        }
        match pm.tick(minute) {
            Ok(h) => {
                self.hints = h
                    .into_iter()
                    .map(|h| Hint {
                        function: h.function,
                        action: hint_action(h.action),
                        forecast_rpm: h.forecast.unwrap_or(-1.0),
                    })
                    .collect();
            }
            Err(e) => tracing::warn!("prewarm tick failed: {e:#}"),
        }
    }

    /// GPU memory held by models the prewarm manager believes resident, bytes.
    pub fn warm_memory(&self) -> u64 {
        match &self.prewarm {
            Prewarm::On(p) => p.warm_memory_bytes(),
            _ => 0,
        }
    }

    /// Why the prewarm manager is not running although configured.
    pub fn prewarm_error(&self) -> Option<&str> {
        match &self.prewarm {
            Prewarm::Failed(why) => Some(why),
            _ => None,
        }
    }

    /// The placement policy's name.
    pub fn policy_name(&self) -> &'static str {
        self.policy.name()
    }

    /// Records an event.
    pub fn event(
        &mut self,
        kind: EventKind,
        instance: Option<InstanceId>,
        pid: Option<u32>,
        message: String,
    ) {
        let ev = Event {
            time: self.clock.now(),
            kind,
            instance,
            pid,
            message,
        };
        self.events.push(ev);
    }

    fn view(&self, g: &Gpu) -> GpuView {
        GpuView {
            index: g.info.index,
            total: g.info.total,
            training_used: g.training_used,
            // What functions use here without a grant is as unavailable as training's memory.
            training_reserved: self.training_reserved(g) + g.ungranted_used,
            admission_hold_s: g.memory.hold(self.clock.now(), self.cfg.reclaim_hold_s),
            has_training: !g.training.is_empty(),
            // Until enough solo samples are in (a job just starting looks idle), unknown: the
            // policy then assumes a fully busy trainer.
            training_solo_util: g.trusted_solo_util(),
            budget_boost: g.budget.boost(),
            grants: self
                .instances
                .values()
                .filter(|i| i.rec.gpu == g.info.index)
                .map(|i| GrantView {
                    instance: i.rec.id,
                    model: i.rec.model.clone(),
                    slo_ms: i.rec.slo_ms,
                    cap: i.rec.cap,
                    share: i.rec.share,
                    share_override: i.rec.share_override,
                })
                .collect(),
        }
    }

    /// Memory reserved for `g`'s training: high-water mark + headroom, bytes.
    fn training_reserved(&self, g: &Gpu) -> u64 {
        g.memory.reserved(
            self.cfg.training_headroom,
            self.cfg.training_headroom_fraction,
        )
    }

    /// Every GPU as policies see it.
    pub fn views(&self) -> Vec<GpuView> {
        self.gpus.iter().map(|g| self.view(g)).collect()
    }

    /// Recomputes the shares of every grant on `gpu` and writes the pages that changed.
    fn reshare(&mut self, gpu: u32) {
        let Some(g) = self.gpus.iter().find(|g| g.info.index == gpu) else {
            return;
        };
        let view = self.view(g);
        let harvesting = self.cfg.harvest && view.has_training;
        let mut shares = self.policy.shares(&self.cfg, &view);
        if harvesting {
            // Harvest mode: the collision budget protects training; the raw share is the
            // operator's override or the whole GPU (docs/harvest.md).
            for (id, share) in shares.iter_mut() {
                *share = view
                    .grants
                    .iter()
                    .find(|x| x.instance == *id)
                    .and_then(|x| x.share_override)
                    .unwrap_or(100);
            }
        }
        let budgets = if harvesting {
            self.split_budget(gpu)
        } else {
            BTreeMap::new()
        };
        let switch_ns = switch_charge(harvesting, g.sharing, self.cfg.context_switch_ns);
        let noise = timing_noise(g.sharing, self.cfg.timing_noise);
        let (gpu_mode, one_server) = (g.sharing, g.one_mps_server);
        for (id, share) in shares {
            if let Some(i) = self.instances.get_mut(&id) {
                let sharing = page_sharing(gpu_mode, one_server, &i.gpu_pids);
                let ppm = budgets.get(&id).copied().unwrap_or(0);
                if i.rec.share != share
                    || i.contention_ppm != ppm
                    || i.switch_ns != switch_ns
                    || i.timing_noise != noise
                    || i.sharing != sharing
                {
                    i.rec.share = share;
                    i.contention_ppm = ppm;
                    i.switch_ns = switch_ns;
                    i.timing_noise = noise;
                    i.sharing = sharing;
                    i.write_page();
                    self.dirty = true;
                }
            }
        }
        if let Some(g) = self.gpus.iter_mut().find(|g| g.info.index == gpu) {
            g.estimate.mark_shared();
        }
    }

    /// Registers `peer` as a function instance.
    pub fn register(
        &mut self,
        peer: Peer,
        args: RegisterArgs,
    ) -> Result<(Grant, Arc<PageHandle>), Refusal> {
        let refuse = |code, reason: String| Refusal { code, reason };
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
                return Err(refuse(
                    RefuseCode::Invalid,
                    format!("instance {id} cannot be resumed by pid {}: {why}", peer.pid),
                ));
            }
        }
        // At most `grants_per_process` live grants per process (default 1; issue 12, item 13):
        // otherwise one process could collect grants and refuse legitimate functions. A recycled
        // pid (another start time) is not the holder.
        let start = self.procs.start_time(peer.pid);
        let held: Vec<&Instance> = self
            .instances
            .values()
            .filter(|i| i.rec.pid == peer.pid && Some(i.rec.start) == start)
            .collect();
        if held.len() >= self.cfg.grants_per_process as usize {
            let first = held[0];
            return Err(refuse(
                RefuseCode::Invalid,
                format!(
                    "pid {} already holds instance {} ({}): one grant per process \
                     ([functions] grants_per_process = {}) — release it first, or start another \
                     process (one `smore run` per function instance)",
                    peer.pid, first.rec.id, first.rec.function, self.cfg.grants_per_process
                ),
            ));
        }
        if args.function.trim().is_empty() {
            return Err(refuse(RefuseCode::Invalid, "empty function name".into()));
        }
        if peer.uid == 0 && !self.cfg.allow_root {
            return Err(refuse(
                RefuseCode::Invalid,
                format!(
                    "function {} runs as root, which this node refuses ([functions] allow_root = false): run it as an unprivileged user",
                    args.function
                ),
            ));
        }
        for (what, s) in [
            ("function name", Some(&args.function)),
            ("model id", args.model.as_ref()),
        ] {
            if let Some(s) = s.filter(|s| s.len() > MAX_NAME) {
                return Err(refuse(
                    RefuseCode::Invalid,
                    format!(
                        "{what} of {} bytes exceeds the {MAX_NAME}-byte limit; use a shorter one",
                        s.len()
                    ),
                ));
            }
        }
        let ask = Ask {
            function: args.function.clone(),
            model: args.model.clone().unwrap_or_else(|| "unknown".into()),
            slo_ms: args.slo_ms.unwrap_or(self.cfg.default_slo_ms),
            memory: args.memory.unwrap_or(self.cfg.default_memory),
            prefer_gpu: args.gpu,
        };
        if !(ask.slo_ms.is_finite() && ask.slo_ms > 0.0) {
            return Err(refuse(
                RefuseCode::Invalid,
                format!("SLO of {} ms", ask.slo_ms),
            ));
        }
        let mut views = self.views();
        if let Some(only) = &args.gpus {
            // A container given some GPUs (CDI) can use no other: place among them alone.
            views.retain(|v| only.contains(&v.index));
            if views.is_empty() {
                return Err(refuse(
                    RefuseCode::NoGpu,
                    format!(
                        "none of the GPUs this process was given ({only:?}, SMORE_GPUS) is managed by the arbiter: regenerate the CDI spec (`smore cdi generate`) after changing [gpus]"
                    ),
                ));
            }
        }
        let decision = self.policy.place(&self.cfg, &views, &ask);
        let (gpu, cap, pt, pf, rule) = match decision {
            Decision::Admit {
                gpu,
                cap,
                predicted_train,
                predicted_fn,
                rule,
            } => (gpu, cap, predicted_train, predicted_fn, rule),
            Decision::Refuse { code, mut reason } => {
                self.counters.refusals += 1;
                // GPUs that would have had room but for the hold after a reclaim: say so (the
                // function may retry once training is stable).
                let held: Vec<String> = views
                    .iter()
                    .filter(|v| v.room_for_grants(self.cfg.memory_safety) >= ask.memory)
                    .filter_map(|v| {
                        v.admission_hold_s.map(|s| {
                            format!(
                                "GPU {}: admission held {s:.0} s more after memory was reclaimed for its training job (training must be stable for {} s)",
                                v.index, self.cfg.reclaim_hold_s
                            )
                        })
                    })
                    .collect();
                if code == RefuseCode::NoMemory && !held.is_empty() {
                    self.counters.held_refusals += 1;
                    reason = format!("{reason}; {}", held.join("; "));
                }
                self.event(
                    EventKind::Refused,
                    None,
                    Some(peer.pid),
                    format!(
                        "function {} ({}): {reason}",
                        ask.function,
                        format_size(ask.memory)
                    ),
                );
                return Err(refuse(code, reason));
            }
        };
        // The start time tells this process from a later one with its pid; without it the
        // instance could later be taken for dead.
        let Some(start) = self.procs.start_time(peer.pid) else {
            return Err(refuse(
                RefuseCode::Invalid,
                format!(
                    "cannot read /proc/{}/stat of the registering process; try again",
                    peer.pid
                ),
            ));
        };
        let page = Arc::new(PageHandle::new("smore-grant").map_err(|e| {
            refuse(
                RefuseCode::Invalid,
                format!("cannot create the grant page: {e}"),
            )
        })?);
        let id = self.next_id;
        self.next_id += 1;
        let slot = args.slot_for(gpu) as u32;
        let mut inst = Instance::new(
            Record {
                id,
                pid: peer.pid,
                start,
                uid: peer.uid,
                function: ask.function.clone(),
                model: ask.model.clone(),
                slo_ms: ask.slo_ms,
                gpu,
                slot,
                cap,
                share: 100,
                share_override: None,
                preempt: None,
            },
            Some(page.clone()),
            rule.clone(),
            self.clock.now(),
        );
        inst.predicted_train = pt;
        inst.predicted_fn = pf;
        inst.track(self.procs.as_ref());
        self.lineage.add_root(inst.rec.pid, inst.rec.start);
        inst.write_page();
        self.stamp_gpu_uuid(&page, gpu, slot);
        // A process NVML saw before this registration (taken for training) may be this one's.
        self.attributor.forget_training();
        self.released.remove(&peer.pid);
        if let Prewarm::On(pm) = &mut self.prewarm {
            if !pm.status().iter().any(|f| f.function == ask.function) {
                pm.register(&ask.function, cap);
            }
        }
        self.instances.insert(id, inst);
        self.seat(id);
        self.reshare(gpu);
        self.counters.registrations += 1;
        self.dirty = true;
        let share = self.instances[&id].rec.share;
        // A function running as root is warned about in its admission event and the log
        // (refused with `[functions] allow_root = false`, checked above).
        let as_root = if peer.uid == 0 {
            let why = format!(
                "function {} (pid {}) runs as root: it is refused operator requests, but root can reach around any per-process limit; run functions as an unprivileged user ([functions] allow_root = false refuses them)",
                ask.function, peer.pid
            );
            tracing::warn!("{why}");
            format!("; warning: {why}")
        } else {
            String::new()
        };
        self.event(
            EventKind::Admitted,
            Some(id),
            Some(peer.pid),
            format!(
                "function {} → GPU {gpu}, cap {}, share {share} %; {rule}{as_root}",
                ask.function,
                format_size(cap)
            ),
        );
        Ok((self.grant_of(id), page))
    }

    /// Whether `peer` is the instance's process or a descendant of it, with the same uid (who
    /// may resume it, or attach to it).
    pub fn may_bind(&self, peer: Peer, id: InstanceId) -> bool {
        self.instances.get(&id).is_some_and(|i| {
            i.rec.uid == peer.uid
                && (i.rec.pid == peer.pid || self.procs.is_descendant_of(peer.pid, i.rec.pid))
        })
    }

    /// Whether `peer` may attach a report connection to the instance: [`State::may_bind`], or a
    /// GPU process of the same uid that NVML's attribution gives to it (a worker that left the
    /// parent chain: its launcher exited, or it was double-forked — the attribution follows
    /// fork records and the session). A worker the attribution counts as the function's must be
    /// able to report as it, or its gate could never be known (docs/shim.md, "One share per
    /// grant"); it may not resume the instance (the registration is its registered process's).
    pub fn may_attach(&self, peer: Peer, id: InstanceId) -> bool {
        self.may_bind(peer, id)
            || self
                .instances
                .get(&id)
                .is_some_and(|i| i.rec.uid == peer.uid && i.gpu_pids.contains(&peer.pid))
    }

    fn try_resume(&mut self, peer: Peer, id: InstanceId) -> Option<(Grant, Arc<PageHandle>)> {
        if !self.may_bind(peer, id) || self.instances.get(&id)?.attached {
            return None;
        }
        let page = self.page_of(id)?;
        let inst = self.instances.get_mut(&id)?;
        inst.attached = true;
        let (gpu, function) = (inst.rec.gpu, inst.rec.function.clone());
        self.event(
            EventKind::Resumed,
            Some(id),
            Some(peer.pid),
            format!("function {function} re-attached on GPU {gpu}"),
        );
        Some((self.grant_of(id), page))
    }

    /// The grant page of instance `id`, made when it has none: an instance restored after a
    /// restart has none until its process resumes it, or until a process of the function
    /// attaches (a worker that only reports follows the page it is handed, docs/shim.md,
    /// "Workers after an arbiter restart"); the resumption then keeps the same page, which both
    /// read. None when there is no such instance or no memfd could be made.
    pub fn page_of(&mut self, id: InstanceId) -> Option<Arc<PageHandle>> {
        let inst = self.instances.get(&id)?;
        if let Some(p) = &inst.page {
            return Some(p.clone());
        }
        let page = match PageHandle::new("smore-grant") {
            Ok(p) => Arc::new(p),
            Err(e) => {
                tracing::warn!(instance = id, "cannot make a grant page: {e}");
                return None;
            }
        };
        let inst = self.instances.get_mut(&id)?;
        inst.page = Some(page.clone());
        inst.write_page();
        let (gpu, slot) = (inst.rec.gpu, inst.rec.slot);
        self.stamp_gpu_uuid(&page, gpu, slot);
        self.seat(id);
        Some(page)
    }

    /// Writes into `page` which GPU its slot `slot` is for (NVML index `gpu`'s UUID), so the shim
    /// gives devices the grant does not name nothing, whatever `CUDA_VISIBLE_DEVICES` says
    /// (issue 12 item 9; docs/shim.md, "Devices not granted").
    fn stamp_gpu_uuid(&self, page: &PageHandle, gpu: u32, slot: u32) {
        let uuid = self
            .gpus
            .iter()
            .find(|g| g.info.index == gpu)
            .and_then(|g| smore_protocol::grant::parse_gpu_uuid(&g.info.uuid));
        if let Some(u) = uuid {
            page.page().set_slot_uuid(slot as usize, u);
        }
    }

    /// The turn board handed with grants on GPU `gpu`: none where harvest or turns are off
    /// (config), so a function granted there gets none and never looks for one.
    pub fn board_of(&self, gpu: u32) -> Option<&Arc<BoardHandle>> {
        if !self.cfg.harvest || self.cfg.turns == TurnsMode::Off {
            return None;
        }
        self.gpus
            .iter()
            .find(|g| g.info.index == gpu)?
            .board
            .as_ref()
    }

    /// Gives instance `id` a seat on its GPU's turn board — the lowest no other instance of the
    /// GPU holds — and writes it into its page; none where boards are not handed out
    /// ([`State::board_of`]) or all [`BOARD_MEMBERS`] seats are taken (it then runs without
    /// turns, its waits behind the others charged as collisions).
    fn seat(&mut self, id: InstanceId) {
        let Some(gpu) = self.instances.get(&id).map(|i| i.rec.gpu) else {
            return;
        };
        let board = self.board_of(gpu).cloned();
        let taken: Vec<usize> = self
            .instances
            .values()
            .filter(|o| o.rec.gpu == gpu && o.rec.id != id)
            .filter_map(|o| o.turn_seat)
            .collect();
        let seat = board
            .as_ref()
            .and_then(|_| (0..BOARD_MEMBERS).find(|s| !taken.contains(s)));
        let Some(i) = self.instances.get_mut(&id) else {
            return;
        };
        if let (Some(b), Some(old)) = (&board, i.turn_seat) {
            b.vacate(old);
        }
        i.turn_seat = seat;
        if let (Some(b), Some(s)) = (&board, seat) {
            b.claim(s, id);
        }
        if let Some(p) = &i.page {
            p.page().set_turn_seat(i.rec.slot as usize, seat);
        }
    }

    /// Writes into every GPU's board whether its functions take turns now (the config): at
    /// start, on a change of mode and on a reload.
    pub(crate) fn set_turns(&self) {
        for g in &self.gpus {
            if let Some(b) = &g.board {
                b.set_enabled(takes_turns(self.cfg.harvest, self.cfg.turns));
            }
        }
    }

    /// The grant of an instance as the protocol announces it (None: no such instance).
    pub fn grant_of(&self, id: InstanceId) -> Grant {
        let i = &self.instances[&id];
        let g = self.gpus.iter().find(|g| g.info.index == i.rec.gpu);
        Grant {
            instance: id,
            gpu_index: i.rec.gpu,
            gpu_uuid: g.map(|g| g.info.uuid.clone()).unwrap_or_default(),
            // What the page says: 0 once preempted.
            memory_cap: i.page_cap(),
            sm_share: i.rec.share,
            generation: i
                .page
                .as_ref()
                .map_or(0, |p| p.page().generation(i.rec.slot as usize)),
            predicted_train: i.predicted_train,
            predicted_fn: i.predicted_fn,
            rule: i.rule.clone(),
            failure_policy: Some(self.cfg.failure_policy),
            pid: Some(i.rec.pid),
            board: self.board_of(i.rec.gpu).is_some() && i.turn_seat.is_some(),
        }
    }

    /// Releases an instance (connection closed, process gone, or `Release`).
    pub fn release(&mut self, id: InstanceId, why: &str) {
        if let Some(inst) = self.instances.remove(&id) {
            if let (Some(seat), Some(g)) = (
                inst.turn_seat,
                self.gpus.iter().find(|g| g.info.index == inst.rec.gpu),
            ) {
                if let Some(b) = &g.board {
                    b.vacate(seat);
                }
                // Processes of the function that outlive the release keep its page: it must
                // not name a seat the next instance may be given.
                if let Some(p) = &inst.page {
                    p.page().set_turn_seat(inst.rec.slot as usize, None);
                }
            }
            if !inst.alive(self.procs.as_ref()) {
                self.adopt_orphans(&inst);
            }
            self.attributor.forget_instance(id);
            self.counters.releases += 1;
            self.dirty = true;
            self.reshare(inst.rec.gpu);
            self.event(
                EventKind::Released,
                Some(id),
                Some(inst.rec.pid),
                format!(
                    "function {} on GPU {}: {why}",
                    inst.rec.function, inst.rec.gpu
                ),
            );
        }
    }

    /// The registered process of `inst` exited: its descendants that live on (GPU processes
    /// attributed to it, and processes its fork records name) stay watched as a released
    /// function's, so that a function cannot daemonize a child and exit to leave it unwatched
    /// as "training" (issue 12, item 6). Their GPU use is [`Violation::AfterRelease`].
    fn adopt_orphans(&mut self, inst: &Instance) {
        let mut orphans = self.attributor.processes_of(inst.rec.id);
        orphans.extend(self.lineage.descendants_of(inst.rec.pid));
        self.adopt(
            orphans,
            inst.rec.pid,
            inst.rec.id,
            &inst.rec.function,
            inst.rec.gpu,
        );
    }

    /// Watches the live processes among `orphans` as function `instance`'s after its process
    /// `dead` exited (each its own record and fork-record root, so a chain of exiting middle
    /// processes passes its descendants on).
    fn adopt(
        &mut self,
        mut orphans: Vec<(u32, u64)>,
        dead: u32,
        instance: InstanceId,
        function: &str,
        gpu: u32,
    ) {
        orphans.sort_unstable();
        orphans.dedup();
        for (pid, start) in orphans {
            if pid == dead || !self.procs.is_same_process(pid, start) {
                continue;
            }
            self.lineage.add_root(pid, start);
            self.released.entry(pid).or_insert_with(|| Released {
                life: facts::Tracked::new(pid, start, self.procs.as_ref()),
                instance,
                function: function.to_string(),
                gpu,
                escalation: Default::default(),
            });
        }
    }

    /// The client gave its grant back (`op=release`). The memory is free for others at once,
    /// but the process stays watched: if it (or a descendant) still uses a GPU, the watchdog
    /// acts ([`Violation::AfterRelease`]).
    pub fn release_by_client(&mut self, id: InstanceId) {
        if let Some(i) = self.instances.get(&id) {
            if i.alive(self.procs.as_ref()) {
                let r = Released {
                    life: facts::Tracked::new(i.rec.pid, i.rec.start, self.procs.as_ref()),
                    instance: id,
                    function: i.rec.function.clone(),
                    gpu: i.rec.gpu,
                    escalation: Default::default(),
                };
                self.released.insert(i.rec.pid, r);
            }
        }
        self.release(id, "released by the client");
    }

    /// The connection of an attached instance closed: under the protocol that is a release
    /// (the shim keeps the connection for the life of the process); the event says whether the
    /// process lives on.
    pub fn disconnected(&mut self, id: InstanceId) {
        let alive = self
            .instances
            .get(&id)
            .is_some_and(|i| i.alive(self.procs.as_ref()));
        if alive {
            self.release(id, "connection closed");
        } else {
            self.release(id, "process exited");
        }
    }

    /// Operator change of an instance's share (None = back to the policy's).
    pub fn set_share(&mut self, id: InstanceId, share: Option<u32>) -> Result<u32, StateError> {
        if let Some(s) = share {
            if !(1..=100).contains(&s) {
                return Err(StateError::ShareOutOfRange(s));
            }
        }
        let inst = self
            .instances
            .get_mut(&id)
            .ok_or(StateError::NoInstance(id))?;
        inst.rec.share_override = share;
        if let Some(s) = share {
            inst.rec.share = s;
            inst.write_page();
        }
        let gpu = inst.rec.gpu;
        self.dirty = true;
        self.reshare(gpu);
        let s = self.instances[&id].rec.share;
        self.event(
            EventKind::Share,
            Some(id),
            None,
            format!("share set to {s} % by the operator"),
        );
        Ok(s)
    }

    /// Operator change of an instance's memory cap (must still fit under σ).
    pub fn set_memory(&mut self, id: InstanceId, bytes: u64) -> Result<(), StateError> {
        let inst = self.instances.get(&id).ok_or(StateError::NoInstance(id))?;
        let gpu = inst.rec.gpu;
        let g = self
            .gpus
            .iter()
            .find(|g| g.info.index == gpu)
            .ok_or(StateError::GpuGone(gpu))?;
        let free = self.view(g).free_for_functions(self.cfg.memory_safety) + inst.rec.cap;
        if bytes > free {
            return Err(StateError::NoRoom {
                asked: bytes,
                free,
                gpu,
            });
        }
        let inst = self
            .instances
            .get_mut(&id)
            .ok_or(StateError::NoInstance(id))?;
        inst.rec.cap = bytes;
        inst.write_page();
        self.dirty = true;
        self.event(
            EventKind::Memory,
            Some(id),
            None,
            format!("cap set to {} by the operator", format_size(bytes)),
        );
        Ok(())
    }

    /// A usage/latency report from an instance.
    pub fn report(
        &mut self,
        id: InstanceId,
        latencies: &[f64],
        used: Option<u64>,
        throttled_ns: Option<u64>,
        refusals: Option<u64>,
    ) {
        let t = self.uptime();
        if let (Prewarm::On(pm), Some(i)) = (&mut self.prewarm, self.instances.get(&id)) {
            // Each reported request is one arrival of the function in this minute.
            for _ in latencies.iter().filter(|l| l.is_finite() && **l >= 0.0) {
                if pm.request_begin(&i.rec.function, t).is_ok() {
                    let _ = pm.request_end(&i.rec.function, t);
                }
            }
        }
        let now = self.clock.now();
        if let Some(i) = self.instances.get_mut(&id) {
            if !latencies.is_empty() {
                i.last_active = now;
            }
            i.usage
                .record_latencies(latencies, Some(i.rec.slo_ms).filter(|s| *s > 0.0), now);
            i.add_latencies(latencies);
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

    /// Harvest: an instance's shim said its contention bucket ran `ahead_ns` ahead of now; its
    /// request admission's mirror catches up ([`harvest::RequestPacer::catch_up`]). A report can
    /// only make the reporting function's own requests wait or be refused.
    pub fn report_contention_ahead(&mut self, id: InstanceId, ahead_ns: u64) {
        let now = self.clock.now();
        let Some(gpu) = self.instances.get(&id).map(|i| i.rec.gpu) else {
            return;
        };
        // Not known yet: taken as busy (the side that refuses rather than admits into holds).
        let trainer_busy = self
            .gpus
            .iter()
            .find(|g| g.info.index == gpu)
            .and_then(Gpu::trusted_solo_util)
            .unwrap_or(1.0);
        if let Some(i) = self.instances.get_mut(&id) {
            i.pacer.catch_up(now, ahead_ns as f64 / 1e9, trainer_busy);
        }
    }

    /// Folds a shim's usage report (cumulative counters of process `pid` of instance `id`) into
    /// the instance's ledger and its GPU's collision meter. A report is the function's word about
    /// itself: it can lower nobody's budget but the reporting function's own GPU's estimate, and
    /// the watchdog acts on NVML, not on reports (docs/harvest.md).
    pub fn report_usage(&mut self, id: InstanceId, pid: u32, usage: ShimUsage) {
        let Some(i) = self.instances.get_mut(&id) else {
            return;
        };
        let added = i.usage.record(pid, usage, self.clock.now());
        i.refresh_gates();
        i.deferred_ns = i.deferred_ns.saturating_add(added.deferred_ns);
        i.turn_waited_ns = i.turn_waited_ns.saturating_add(added.turn_waited_ns);
        i.turn_cut_ins = i.turn_cut_ins.saturating_add(added.turn_cut_ins);
        i.throttled_ns = i.throttled_ns.saturating_add(added.held_ns);
        let gpu = i.rec.gpu;
        // The estimate counts what the samples measured; a charge at admission that the launch
        // then did not collide for is the bucket's, not the trainer's (docs/harvest.md, "The
        // estimate from what was measured").
        let collided = added.measured_contention_ns.unwrap_or(added.contention_ns);
        let with_training = (collided as f64 * i.training_share).round() as u64;
        // Its own part of the estimate, over the same window (the throttle's judge).
        i.meter.add(with_training);
        if let Some(g) = self.gpus.iter_mut().find(|g| g.info.index == gpu) {
            g.meter.add(with_training);
        }
    }

    /// Splits `gpu`'s collision budget among its instances by what they used over the last
    /// interval and how their requests fare ([`harvest::split`]).
    fn split_budget(&self, gpu: u32) -> BTreeMap<InstanceId, u32> {
        let Some(g) = self.gpus.iter().find(|g| g.info.index == gpu) else {
            return BTreeMap::new();
        };
        let ids: Vec<&Instance> = self
            .instances
            .values()
            .filter(|i| i.rec.gpu == gpu)
            .collect();
        let demands: Vec<Demand> = ids
            .iter()
            .map(|i| Demand {
                granted_ppm: i.contention_ppm,
                used_ppm: i.contention_used_ppm,
                urgency: harvest::urgency(i.miss_rate),
            })
            .collect();
        let out = harvest::split(g.harvest.measured_total_ppm(), &demands);
        // 0 on the page means "harvest off": a function beside a training job always keeps 1 ppm.
        ids.iter()
            .zip(out)
            .map(|(i, ppm)| (i.rec.id, ppm.max(1)))
            .collect()
    }

    /// Attributes each function's measured collisions between training and the GPU's other
    /// functions ([`harvest::training_share`]), and sets each GPU's collision-weighted share,
    /// which widens the budget the shims enforce in their own units.
    fn attribute_collisions(&mut self) {
        let (harvesting, turns) = (self.cfg.harvest, self.cfg.turns);
        for g in &mut self.gpus {
            let util = g.estimate.colocated();
            // Functions that take turns wait on the GPU behind training (or a process outside
            // smore) only: their collisions are all training's (docs/harvest.md, "Serializing
            // the functions").
            let in_turns = g.board.is_some() && takes_turns(harvesting, turns);
            let on: Vec<&mut Instance> = self
                .instances
                .values_mut()
                .filter(|i| i.rec.gpu == g.info.index)
                .collect();
            // A function's GPU time counts as what both its shims reported and NVML saw, the
            // smaller: neither an over-report nor a function NVML does not show can lower the
            // share attributed to training (docs/arbiter.md, threat model).
            let gpu_of = |i: &Instance| i.own_gpu();
            let all_gpu: f64 = on.iter().map(|i| gpu_of(i)).sum();
            let (mut with_training, mut measured) = (0.0, 0.0);
            for i in on {
                let others = all_gpu - gpu_of(i);
                i.training_share = if in_turns && i.turn_seat.is_some() {
                    1.0
                } else {
                    harvest::training_share(util, others)
                };
                with_training += i.contention_used_ppm as f64 * i.training_share;
                measured += i.contention_used_ppm as f64;
            }
            g.harvest.set_training_share(if measured > 0.0 {
                with_training / measured
            } else {
                1.0
            });
        }
    }

    /// One harvest step (every [`HARVEST_EVERY`] rounds): closes each instance's usage interval,
    /// ticks each GPU's collision meter, and splits the budgets again.
    fn harvest_step(&mut self) {
        let now = self.clock.now();
        for i in self.instances.values_mut() {
            i.meter.tick(now);
            let r = i.usage.rate(now);
            i.miss_rate = r.miss_rate;
            i.collision_per_request_ns = r.collision_per_request_ns;
            i.gpu_per_request_ns = r.gpu_per_request_ns;
            i.contention_used_ppm = r.contention_ppm;
            i.contention_measured_ppm = r.measured_ppm;
            i.gpu_used_ppm = r.gpu_ppm;
            let paying = r.paying_processes.max(1);
            i.gpu_processes = r.gpu_processes;
            i.refresh_gates();
            if i.contention_processes != paying || i.page_share_stale() {
                // Each process's bucket enforces the page's budget: the page carries the part
                // divided among the processes paying from it (docs/arbiter.md, threat model);
                // and its raw share among its gates (docs/shim.md, "One share per grant").
                i.contention_processes = paying;
                i.write_page();
            }
        }
        self.attribute_collisions();
        let observe = self.rounds.is_multiple_of(OBSERVE_EVERY);
        let mut resplit = Vec::new();
        let mut throttle_steps = Vec::new();
        let mut gpus_reset = Vec::new();
        for g in &mut self.gpus {
            if g.training.is_empty() || !self.cfg.harvest {
                // No trainer to protect, or harvest off: no throttle holds a function back.
                throttle_steps.push((g.info.index, harvest::ThrottleStep::Lift, None, 0.0));
            }
            if g.training.is_empty() {
                g.meter.reset();
                gpus_reset.push(g.info.index);
                continue;
            }
            g.meter.tick(now);
            if observe {
                if let Some(s) = g.meter.slowdown() {
                    let before = g.harvest.calibration();
                    if g.harvest.observe(s) {
                        // Kept across a restart (docs/harvest.md, "Across an arbiter restart").
                        self.dirty = true;
                        tracing::info!(
                            "GPU {}: estimated training slowdown {:.1} % (θ {:.0} %) → collision budget ×{:.2}",
                            g.info.index,
                            s * 100.0,
                            g.harvest.theta() * 100.0,
                            g.harvest.calibration()
                        );
                    }
                    if self.cfg.harvest {
                        throttle_steps.push((
                            g.info.index,
                            g.harvest.throttle_step(before, s),
                            Some(s),
                            g.harvest.theta(),
                        ));
                    }
                }
            }
            if self.cfg.harvest {
                resplit.push(g.info.index);
            }
        }
        // The functions' own meters start again with their GPU's (the throttle compares them).
        for i in self.instances.values_mut() {
            if gpus_reset.contains(&i.rec.gpu) {
                i.meter.reset();
            }
        }
        if observe {
            self.throttle(&throttle_steps);
        }
        for gpu in resplit {
            self.reshare(gpu);
        }
    }

    /// The raw-share throttle (docs/harvest.md, "When the budget cannot hold θ"): on each GPU
    /// whose collision budget was at its floor while the estimate stays above θ, the functions
    /// that own the GPU's excess over the estimate's window ([`harvest::throttle_targets`]) have
    /// their raw share cut from what they used; where the estimate is well under θ, throttled functions get GPU time
    /// back; without a trainer, or with harvest off, every throttle is lifted. `steps`: per GPU,
    /// what to do, the estimate (None: no training job or harvest off) and θ.
    fn throttle(&mut self, steps: &[(u32, harvest::ThrottleStep, Option<f64>, f64)]) {
        let now = self.clock.now();
        // On each GPU to cut, who owns its excess, judged over the estimate's own window.
        let mut cut: Vec<InstanceId> = Vec::new();
        for &(gpu, step, ..) in steps {
            if step != harvest::ThrottleStep::Cut {
                continue;
            }
            let Some(g) = self.gpus.iter().find(|g| g.info.index == gpu) else {
                continue;
            };
            let on: Vec<&Instance> = self
                .instances
                .values()
                .filter(|i| i.rec.gpu == gpu)
                .collect();
            // Over the GPU meter's own window: what each function added to it, and its part, in
            // the estimate's units (its collisions as attributed to training).
            let Some((t0, t1)) = g.meter.span() else {
                continue;
            };
            let contributions: Vec<(f64, f64)> = on
                .iter()
                .map(|i| {
                    (
                        i.meter.added_since(t0) as f64 / 1e9 / (t1 - t0),
                        f64::from(i.contention_ppm) / 1e6 * i.training_share,
                    )
                })
                .collect();
            let whole = g.meter.fraction().unwrap_or(0.0);
            for (i, target) in on
                .iter()
                .zip(harvest::throttle_targets(&contributions, whole))
            {
                if target {
                    cut.push(i.rec.id);
                }
            }
        }
        let mut events = Vec::new();
        for i in self.instances.values_mut() {
            let Some(&(gpu, step, s, theta)) = steps.iter().find(|(g, ..)| *g == i.rec.gpu) else {
                continue;
            };
            let before = i.throttle.ceiling();
            let changed = match step {
                // From what its shims report it used: an over-report only delays its own cut.
                harvest::ThrottleStep::Cut if cut.contains(&i.rec.id) => {
                    i.throttle.cut(now, i.gpu_used_ppm)
                }
                harvest::ThrottleStep::Recover => i.throttle.recover(),
                harvest::ThrottleStep::Lift => i.throttle.lift(),
                _ => false,
            };
            if !changed {
                continue;
            }
            i.write_page();
            let gates = i.raw_gates();
            let after = i.throttle.ceiling();
            let what = match step {
                harvest::ThrottleStep::Cut => format!(
                    "function {} collided {:.2} % of wall time with training over the estimate's window against its part of {:.2} % while GPU {gpu}'s training slowdown estimate read {:.1} % (θ {:.0} %) with the collision budget at its floor: its raw share is cut from {before} % to {after} % of the GPU ({} % per gate over {gates}; it reported using {:.1} %)",
                    i.rec.function,
                    i.meter.fraction().unwrap_or(0.0) * 100.0,
                    f64::from(i.contention_ppm) / 1e4,
                    s.unwrap_or(0.0) * 100.0,
                    theta * 100.0,
                    harvest::per_gate(after, gates),
                    f64::from(i.gpu_used_ppm) / 1e4
                ),
                harvest::ThrottleStep::Lift => format!(
                    "function {}'s raw share is no longer cut on GPU {gpu} (no training job, or harvest off): {before} % -> {after} %",
                    i.rec.function,
                ),
                _ => format!(
                    "function {} gets GPU time back on GPU {gpu} (training slowdown estimate {:.1} %): its raw share is raised from {before} % to {after} % of the GPU",
                    i.rec.function,
                    s.unwrap_or(0.0) * 100.0,
                ),
            };
            // The event log writes it to the daemon's log too.
            events.push((i.rec.id, what));
        }
        if !events.is_empty() {
            // Kept across a restart (docs/harvest.md, "Across an arbiter restart").
            self.dirty = true;
        }
        for (instance, what) in events {
            self.event(EventKind::Share, Some(instance), None, what);
        }
    }

    /// Request-level admission for an instance, for a request that already waited `waited_ms`
    /// (at the platform, or deferred before): the policy's rule, then, in harvest mode beside a
    /// training job, whether the function's shim would hold the request past its SLO for the
    /// collision budget ([`harvest::RequestPacer`]; docs/harvest.md, "Request admission").
    pub fn admit_request(&mut self, id: InstanceId, waited_ms: f64) -> Admission {
        let refused = |reason: &str| Admission {
            admitted: false,
            predicted_train: None,
            predicted_fn: None,
            reason: reason.into(),
        };
        let now = self.clock.now();
        let Some(inst) = self.instances.get_mut(&id) else {
            return refused("not registered");
        };
        inst.last_active = now;
        if let Some(p) = &inst.rec.preempt {
            let why = p.message.clone();
            self.counters.preempted_requests += 1;
            return refused(&why);
        }
        let gpu = inst.rec.gpu;
        let view = self
            .gpus
            .iter()
            .find(|g| g.info.index == gpu)
            .map(|g| self.view(g));
        let mut a = match view {
            Some(v) => self.policy.admit_request(&self.cfg, &v, id),
            None => refused("GPU gone"),
        };
        let training = self
            .gpus
            .iter()
            .any(|g| g.info.index == gpu && !g.training.is_empty());
        let sharing = self
            .gpus
            .iter()
            .find(|g| g.info.index == gpu)
            .and_then(|g| g.sharing);
        let defer = self.cfg.harvest && training && defers(self.cfg.defer, sharing);
        let in_turns =
            self.board_of(gpu).is_some() && takes_turns(self.cfg.harvest, self.cfg.turns);
        // The trainer's phase as the functions' samples show it, where they take turns
        // (docs/harvest.md, "Phase prediction").
        let mono_now = smore_protocol::grant::monotonic_ns();
        let phase = self
            .board_of(gpu)
            .filter(|_| a.admitted && in_turns && training)
            .and_then(|b| phase::predict(b.board(), mono_now))
            .map(|p| p.phase);
        if let (true, true, Some(i)) = (
            a.admitted,
            self.cfg.harvest && training,
            self.instances.get_mut(&id),
        ) {
            if i.contention_ppm > 0 && i.rec.slo_ms > 0.0 {
                // No requests in the window: nothing to predict from (the first requests, or
                // after refusals emptied it), so admitted and measured.
                let per = harvest::PerRequest {
                    collision_ns: i.collision_per_request_ns.unwrap_or(0.0),
                    gpu_ns: i.gpu_per_request_ns.unwrap_or(0.0),
                };
                let meets = harvest::meets_trainer(per, phase, mono_now);
                if let harvest::Pace::Refuse {
                    hold_ms,
                    predicted_ms,
                } = i
                    .pacer
                    .admit(now, per, i.contention_ppm, waited_ms, i.rec.slo_ms, meets)
                {
                    i.paced_refusals += 1;
                    a = Admission {
                        admitted: false,
                        predicted_train: a.predicted_train,
                        predicted_fn: a.predicted_fn,
                        reason: format!(
                            "harvest: the collision budget ({} ppm) would hold this request {hold_ms:.1} ms: {predicted_ms:.1} ms predicted against an SLO of {:.1} ms",
                            i.contention_ppm, i.rec.slo_ms
                        ),
                    };
                }
            }
        }
        if a.admitted {
            self.counters.admitted_requests += 1;
            if let Some(i) = self.instances.get(&id) {
                i.write_defer_until(defer, waited_ms);
                i.write_turn_key(in_turns, waited_ms);
            }
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
        let now = self.clock.now();
        // Instances whose process is gone are released first (pid-reuse safe: a pidfd poll per
        // instance, or a start-time read where pidfds are unavailable).
        let dead: Vec<InstanceId> = self
            .instances
            .values()
            .filter(|i| !i.alive(self.procs.as_ref()))
            .map(|i| i.rec.id)
            .collect();
        for id in dead {
            self.release(id, "process exited");
        }
        // GPU processes that exited are forgotten; the others keep their attribution.
        self.attributor.prune(self.procs.as_ref());
        let procs = self.procs.as_ref();
        let gone: Vec<(u32, InstanceId, String, u32)> = self
            .released
            .iter()
            .filter(|(_, r)| !r.life.alive(procs))
            .map(|(&pid, r)| (pid, r.instance, r.function.clone(), r.gpu))
            .collect();
        for (pid, instance, function, gpu) in gone {
            self.released.remove(&pid);
            // What it forked lives on as the same function's (a daemonizing middle process).
            let orphans = self.lineage.descendants_of(pid);
            self.adopt(orphans, pid, instance, &function, gpu);
        }
        let roots = self.roots();
        // Fork records of functions that are gone go with them (bounded memory).
        self.lineage.retain_roots(|pid| roots.contains_key(&pid));
        let mut actions = Vec::new();
        let mut reshare = Vec::new();
        let mut growths = Vec::new();
        let mut preempt_kills = 0;
        // Over-use debt corrections and restorations (instance, what), told in events.
        let mut debt_events: Vec<(InstanceId, String)> = Vec::new();
        let mut ungranted = std::collections::BTreeSet::new();
        for (index, s) in samples {
            let Some(gi) = self.gpus.iter().position(|g| g.info.index == *index) else {
                continue;
            };
            let mut split = self.attributor.split(s, &roots, self.procs.as_ref());
            for &(pid, id) in &split.released {
                // Its own record (a released root or an adopted orphan), else its root's.
                let r = match self.released.contains_key(&pid) {
                    true => self.released.get_mut(&pid),
                    false => self.released.values_mut().find(|r| r.instance == id),
                };
                let Some(r) = r else {
                    continue;
                };
                if let Some(action) =
                    r.escalation
                        .step_with(now, self.cfg.watchdog_action, self.cfg.kill_after_s)
                {
                    let violation = Violation::AfterRelease { pid };
                    let reason = watchdog::Described {
                        violation: &violation,
                        function: &r.function,
                        gpu: r.gpu,
                    }
                    .to_string();
                    actions.push(Enforcement {
                        pid,
                        action,
                        instance: id,
                        violation,
                        reason,
                    });
                }
            }
            let has_functions = self.instances.values().any(|i| i.rec.gpu == *index);
            let g = &mut self.gpus[gi];
            let appeared = g.training.is_empty() != split.training.is_empty();
            g.used = s.used;
            g.util = s.util;
            // MPS servers alone on the GPU say nothing of the mode: NVML then lists a server as
            // a compute process and no MPS client, which read time-sliced between the demo's
            // runs on an MPS node (docs/real-gpu.md, section 11). The last mode stays. Beside
            // any other process NVML's reading stands.
            let read = if !split.mps_servers.is_empty() && split.mps_servers.len() == s.procs.len()
            {
                None
            } else {
                s.sharing
            };
            g.one_mps_server = serves_all(&split.mps_servers, s);
            if let Some(sharing) = read.filter(|m| g.sharing != Some(*m)) {
                log_sharing(
                    *index,
                    sharing,
                    self.cfg.harvest,
                    self.cfg.context_switch_ns,
                );
                // The switch charge, the timing noise and the mode itself on the pages follow the
                // mode (a re-split is also a growth step of the budget split: only when a page
                // would change; the mode is on every page, so every change of it re-splits).
                let (csw, noise) = (self.cfg.context_switch_ns, self.cfg.timing_noise);
                let pages = |m: Option<Sharing>| {
                    (
                        switch_charge(self.cfg.harvest, m, csw),
                        timing_noise(m, noise),
                        m,
                    )
                };
                let follows = pages(g.sharing) != pages(Some(sharing));
                g.sharing = Some(sharing);
                if follows && !reshare.contains(index) {
                    reshare.push(*index);
                }
            }
            // Every round, not only on a change: the board is the functions' to write.
            if let Some(b) = &g.board {
                b.set_enabled(takes_turns(self.cfg.harvest, self.cfg.turns));
                let mut owners = [0u64; BOARD_MEMBERS];
                for i in self.instances.values().filter(|i| i.rec.gpu == *index) {
                    if let Some(s) = i.turn_seat {
                        owners[s] = i.rec.id;
                    }
                }
                b.set_owners(&owners);
            }
            g.sm_overlap = watchdog::attribution_overlap(
                s.proc_util
                    .iter()
                    .filter(|(pid, _)| s.procs.contains_key(pid))
                    .map(|(_, &u)| u),
                s.util,
                g.sharing,
            );
            let overlap = g.sm_overlap;
            // An MPS server's memory is held beside training's: it is no trainer, but its memory
            // is in no function's grant either.
            g.training_used = split.training.iter().map(|t| t.used).sum::<u64>()
                + split.mps_servers.iter().map(|&(_, used)| used).sum::<u64>();
            if !has_functions || split.training.is_empty() {
                // The feedback loop starts again from the worst case with the next functions.
                g.budget.reset();
            }
            g.estimate.observe(&split.training, s.util, has_functions);
            let procs = self.procs.as_ref();
            let growth = g.memory.observe(
                &split.training,
                |pid| procs.start_time(pid),
                |pid, start| procs.is_same_process(pid, start),
                now,
            );
            if growth.is_growth() {
                growths.push((*index, growth, g.memory.peak(), has_functions));
            }
            g.training = std::mem::take(&mut split.training);
            let (gpu_mode, one_server) = (g.sharing, g.one_mps_server);
            if (appeared || g.estimate.drifted()) && !reshare.contains(index) {
                reshare.push(*index);
            }
            for inst in self.instances.values_mut().filter(|i| i.rec.gpu == *index) {
                let usage = split.instances.remove(&inst.rec.id).unwrap_or_default();
                inst.nvml_used = usage.used;
                inst.sm_used = (!usage.pids.is_empty()).then_some(usage.sm);
                if let Some(sm) = inst.sm_used {
                    inst.sm_used_mean =
                        Some(training::ewma(inst.sm_used_mean, f64::from(sm) / 100.0));
                }
                inst.gpu_pids.clone_from(&usage.pids);
                inst.usage.keep_listed(&usage.pids);
                inst.refresh_gates();
                if inst.page_share_stale() {
                    // Its raw share is divided among its gates, which count the processes NVML
                    // shows that have not reported.
                    inst.write_page();
                }
                let mode = page_sharing(gpu_mode, one_server, &inst.gpu_pids);
                if inst.sharing != mode {
                    inst.sharing = mode;
                    inst.write_sharing();
                }
                if let Some(p) = inst.rec.preempt.as_mut() {
                    // Preempted: its page cap is 0 and its requests are refused; the only rule
                    // left is the deadline. The watchdog's other checks do not apply (it is
                    // leaving), and it is killed once, every process of it.
                    if !p.enforced && now >= p.deadline && inst.life.is_some() {
                        p.enforced = true;
                        preempt_kills += 1;
                        let violation = Violation::PreemptExpired { used: usage.used };
                        let reason = watchdog::Described {
                            violation: &violation,
                            function: &inst.rec.function,
                            gpu: *index,
                        }
                        .to_string();
                        let mut pids = usage.pids.clone();
                        if !pids.contains(&inst.rec.pid) {
                            pids.push(inst.rec.pid);
                        }
                        for pid in pids {
                            actions.push(Enforcement {
                                pid,
                                action: WatchdogAction::Sigkill,
                                instance: inst.rec.id,
                                violation: violation.clone(),
                                reason: reason.clone(),
                            });
                        }
                    }
                    continue;
                }
                if usage.pids.is_empty() {
                    continue;
                }
                let (procs, attributor) = (self.procs.as_ref(), &mut self.attributor);
                let shim = if self.cfg.check_shim {
                    let r = watchdog::check_shim(&usage.pids, |p| attributor.shim_mapped(p, procs));
                    inst.shim_loaded = Some(r.is_ok());
                    r
                } else {
                    Ok(())
                };
                // A function whose GPU time exceeds its share for long: the shim is bypassed
                // for launches (raw driver pointers, direct ioctls) or not working. The streak
                // counts even while the shim check fails, as it always has.
                //
                // In harvest mode the raw share is 100 and the collision budget is enforced by
                // the shim, out of NVML's sight; what NVML can check is that the function's GPU
                // time matches what its shim accounts for: the shim's own estimate (reported
                // every second) stands in for the share. A function that never reports after
                // [`REPORT_GRACE_S`] is held to 0.
                // A function is held to what its pages allow its processes together, for the
                // processes NVML shows (its reports of more gates do not raise it; each page's
                // share falls as its gates grow, so a function that obeys its pages is within
                // it; docs/shim.md, "One share per grant", and docs/harvest.md, "When the budget
                // cannot hold θ").
                let share = if inst.rec.share >= 100 && inst.contention_ppm > 0 {
                    let reported = (inst.gpu_used_ppm / 10_000)
                        .min(99)
                        .min(inst.raw_allowed(inst.throttle.ceiling()));
                    let quiet =
                        !inst.usage.has_reports() && now - inst.registered_at > REPORT_GRACE_S;
                    if inst.usage.has_reports() || quiet {
                        reported + watchdog::HARVEST_EXTRA_SLACK_PCT
                    } else {
                        100
                    }
                } else {
                    inst.raw_allowed(inst.rec.share.min(inst.throttle.ceiling()))
                };
                // What NVML shows of the function that cannot have been another process's time
                // (a time-sliced GPU's per-process figures overlap: docs/real-gpu.md, section 8).
                let own_sm = usage.sm.saturating_sub(overlap);
                let overuse = inst.over_share.observe(own_sm, share.min(100));
                // The windowed rule and its after-the-fact correction (cost poisoning, issue 12
                // item 10): the mean over seconds, which pauses do not break, against the
                // granted share. Not in harvest mode: there the raw share is 100 and what a
                // function may use depends on training's idle time, which NVML's per-process
                // SM time cannot tell from collisions; the report-vs-NVML streak above bounds a
                // bypass there, and the shim's contention bucket is measured on the device's
                // own events (docs/harvest.md).
                let harvest = inst.rec.share >= 100 && inst.contention_ppm > 0;
                let debt = if harvest {
                    Ok(None)
                } else {
                    // Against what its pages allow its processes at the grant (the rounding among
                    // its gates is not a debt); the correction then lowers the grant.
                    let granted = inst.raw_allowed_gates(inst.rec.share);
                    inst.share_debt.observe(now, own_sm, granted)
                };
                let debt = match debt {
                    Ok(Some(change)) => {
                        inst.write_page();
                        let what = match change {
                            watchdog::DebtChange::Corrected { mean, page } => format!(
                                "function {} used {mean} % of GPU {index}'s SM time in NVML over seconds at a {} % share: its page share is lowered to {page} % until the excess is paid back",
                                inst.rec.function, inst.rec.share
                            ),
                            watchdog::DebtChange::Restored { page } => format!(
                                "function {} is back within its share on GPU {index}: its page share is raised to {page} % (granted {} %)",
                                inst.rec.function, inst.rec.share
                            ),
                        };
                        debt_events.push((inst.rec.id, what));
                        Ok(())
                    }
                    Ok(None) => Ok(()),
                    Err(v) => Err(v),
                };
                let verdict = shim.and(overuse).and(debt).and(watchdog::check_memory(
                    usage.used,
                    inst.rec.cap,
                    self.cfg.memory_slack,
                ));
                let violation = match verdict {
                    Ok(()) => {
                        inst.escalation.clear();
                        continue;
                    }
                    Err(v) => v,
                };
                {
                    let Some(action) = inst.escalation.step_with(
                        now,
                        self.cfg.watchdog_action,
                        self.cfg.kill_after_s,
                    ) else {
                        continue;
                    };
                    let reason = watchdog::Described {
                        violation: &violation,
                        function: &inst.rec.function,
                        gpu: *index,
                    };
                    for &p in &usage.pids {
                        // The shim rule names the process at fault; the others the function.
                        let violation = match violation {
                            Violation::NoShim { .. } => Violation::NoShim { pid: p },
                            ref v => v.clone(),
                        };
                        let reason = watchdog::Described {
                            violation: &violation,
                            ..reason
                        }
                        .to_string();
                        actions.push(Enforcement {
                            pid: p,
                            action,
                            instance: inst.rec.id,
                            violation,
                            reason,
                        });
                    }
                }
            }
            // What is left of the split is functions' use of this GPU without a grant for it
            // (issue 12, item 9): counted by this GPU's admission and acted on like any
            // violation, with an escalation of its own.
            let mut ungranted_used = 0;
            for (id, usage) in std::mem::take(&mut split.instances) {
                let Some(inst) = self.instances.get_mut(&id) else {
                    continue;
                };
                if inst.rec.gpu == *index || usage.pids.is_empty() {
                    continue;
                }
                let pid = inst.rec.pid;
                if self
                    .instances
                    .values()
                    .any(|i| i.rec.pid == pid && i.rec.gpu == *index)
                {
                    // A runtime holding grants on several GPUs (`grants_per_process` > 1).
                    continue;
                }
                let Some(inst) = self.instances.get_mut(&id) else {
                    continue;
                };
                ungranted_used += usage.used;
                ungranted.insert(id);
                let Some(action) = inst.ungranted_escalation.step_with(
                    now,
                    self.cfg.watchdog_action,
                    self.cfg.kill_after_s,
                ) else {
                    continue;
                };
                let violation = Violation::UngrantedGpu {
                    used: usage.used,
                    sm: usage.sm,
                    granted: inst.rec.gpu,
                };
                let reason = watchdog::Described {
                    violation: &violation,
                    function: &inst.rec.function,
                    gpu: *index,
                }
                .to_string();
                for &pid in &usage.pids {
                    actions.push(Enforcement {
                        pid,
                        action,
                        instance: id,
                        violation: violation.clone(),
                        reason: reason.clone(),
                    });
                }
            }
            self.gpus[gi].ungranted_used = ungranted_used;
        }
        for inst in self.instances.values_mut() {
            if !ungranted.contains(&inst.rec.id) {
                inst.ungranted_escalation.clear();
            }
        }
        for (instance, what) in debt_events {
            self.event(EventKind::Watchdog, Some(instance), None, what);
            self.dirty = true;
        }
        if preempt_kills > 0 {
            self.counters.preempt_kills += preempt_kills;
            self.dirty = true;
        }
        for (gpu, growth, peak, has_functions) in growths {
            self.counters.growth_events += 1;
            self.dirty = true;
            if !has_functions {
                // Worth the operator's attention only where functions may have to give memory
                // back; the counter and the hold still see it.
                continue;
            }
            let what = if growth.new_procs.is_empty() {
                format!("high-water mark up {}", format_size(growth.grew_by))
            } else {
                format!("new training process(es) {:?}", growth.new_procs)
            };
            self.event(
                EventKind::Growth,
                None,
                None,
                format!(
                    "GPU {gpu}: training memory grew ({what}); high-water mark {}",
                    format_size(peak)
                ),
            );
            self.dirty = true;
        }
        for (index, _) in samples {
            self.reclaim(*index, now);
        }
        // A GPU with no sample this round (its NVML reading failed) no longer shows one server
        // running every process: a trainer that started outside it since would be unseen, and
        // its functions' pages go back to time-sliced (found by review, 2026-11-28).
        for g in self.gpus.iter_mut() {
            if g.one_mps_server && !samples.iter().any(|(i, _)| *i == g.info.index) {
                g.one_mps_server = false;
                if !reshare.contains(&g.info.index) {
                    reshare.push(g.info.index);
                }
            }
        }
        for gpu in reshare {
            self.reshare(gpu);
        }
        self.rounds += 1;
        if self.rounds.is_multiple_of(HARVEST_EVERY) {
            self.harvest_step();
        }
        if self.rounds.is_multiple_of(OBSERVE_EVERY) {
            self.observe();
        }
        for a in &actions {
            self.counters.watchdog_actions += 1;
            self.event(
                EventKind::Watchdog,
                Some(a.instance),
                Some(a.pid),
                format!("{:?}: {}", a.action, a.reason),
            );
        }
        actions
    }

    /// The latest pre-warm hints.
    pub fn hints(&self) -> Vec<Hint> {
        self.hints.clone()
    }

    /// Feeds observed degradations to the policy (online learning) and to each GPU's time
    /// budget: per GPU with functions and a training job, the training slowdown estimated from
    /// NVML ([`TrainingEstimate::slowdown`]) and each function's median reported latency.
    fn observe(&mut self) {
        let views = self.views();
        let mut reshare = Vec::new();
        for (gi, view) in views.into_iter().enumerate() {
            if view.grants.is_empty() {
                continue;
            }
            let index = self.gpus[gi].info.index;
            let slowdown = self.gpus[gi]
                .estimate
                .slowdown()
                .filter(|_| !self.gpus[gi].training.is_empty());
            if let Some(d) = slowdown {
                let loads: Vec<FunctionLoad> = self
                    .instances
                    .values()
                    .filter(|i| i.rec.gpu == index)
                    .map(|i| FunctionLoad {
                        share: i.rec.share,
                        sm_used: i.sm_used,
                    })
                    .collect();
                let theta = self.cfg.theta_train;
                if self.gpus[gi].budget.feedback(d, theta, &loads) {
                    reshare.push(index);
                    tracing::info!(
                        "GPU {index}: training slowdown {:.1} % (θ {:.0} %) → time budget ×{:.2}",
                        d * 100.0,
                        theta * 100.0,
                        self.gpus[gi].budget.boost()
                    );
                }
            }
            let lat: Vec<(InstanceId, f64)> = self
                .instances
                .values()
                .filter(|i| i.rec.gpu == index)
                .filter_map(|i| Some((i.rec.id, i.latency_percentile(0.5)?)))
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
            instances: self.instances.values().map(|i| i.rec.clone()).collect(),
            gpus: self
                .gpus
                .iter()
                .map(|g| g.memory.record(g.info.index))
                .collect(),
            harvest: self
                .gpus
                .iter()
                .map(|g| HarvestRecord {
                    gpu: g.info.index,
                    calibration: g.harvest.calibration(),
                    trainers: g
                        .training
                        .iter()
                        .filter_map(|t| {
                            let start = self.procs.start_time(t.pid)?;
                            Some(Trainer { pid: t.pid, start })
                        })
                        .collect(),
                    throttles: self
                        .instances
                        .values()
                        .filter(|i| i.rec.gpu == g.info.index)
                        .filter_map(|i| {
                            i.throttle.ceiling_pct().map(|c| ThrottleRecord {
                                instance: i.rec.id,
                                ceiling_pct: c,
                            })
                        })
                        .collect(),
                })
                .collect(),
        }
    }

    /// Re-adopts the instances of a previous arbiter whose processes still live: their memory
    /// stays counted (no double counting when they re-register with `resume`).
    pub fn restore(&mut self, file: PersistFile) {
        self.next_id = self.next_id.max(file.next_id);
        for r in file.gpus {
            let procs = self.procs.as_ref();
            if let Some(g) = self.gpus.iter_mut().find(|g| g.info.index == r.gpu) {
                g.memory
                    .restore(r, |pid, start| procs.is_same_process(pid, start));
            }
        }
        for p in file.instances {
            if !self.procs.is_same_process(p.pid, p.start)
                || !self.gpus.iter().any(|g| g.info.index == p.gpu)
            {
                continue;
            }
            self.next_id = self.next_id.max(p.id + 1);
            let msg = format!("function {} (pid {}) kept from the previous arbiter; waiting for it to re-register", p.function, p.pid);
            let (id, pid) = (p.id, p.pid);
            let now = self.clock.now();
            let mut inst = Instance::new(p, None, "restored after arbiter restart".into(), now);
            inst.track(self.procs.as_ref());
            self.lineage.add_root(inst.rec.pid, inst.rec.start);
            self.instances.insert(id, inst);
            self.event(EventKind::Restored, Some(id), Some(pid), msg);
        }
        // What harvest had learnt: the budget's calibration and the throttles of the instances
        // kept (docs/harvest.md, "Across an arbiter restart"). Both recover by themselves while
        // the trainer is well within θ, and a GPU without a training job lifts its throttles.
        let now = self.clock.now();
        for h in file.harvest {
            let Some(g) = self.gpus.iter_mut().find(|g| g.info.index == h.gpu) else {
                continue;
            };
            // Learnt beside a training job: kept only while one of its processes lives (after a
            // reboot or with another job it says nothing).
            let procs = self.procs.as_ref();
            if h.trainers
                .iter()
                .any(|t| procs.is_same_process(t.pid, t.start))
            {
                g.harvest.restore_calibration(h.calibration);
                let calibration = g.harvest.calibration();
                if calibration < 1.0 {
                    let msg = format!(
                        "GPU {}: collision budget ×{calibration:.2} kept from the previous arbiter",
                        h.gpu
                    );
                    self.event(EventKind::Share, None, None, msg);
                }
            }
            for t in h.throttles {
                let Some(i) = self
                    .instances
                    .get_mut(&t.instance)
                    .filter(|i| i.rec.gpu == h.gpu)
                else {
                    continue;
                };
                i.throttle = harvest::Throttle::restored(t.ceiling_pct, now);
                let msg = format!(
                    "function {}'s raw share stays cut to {} % of GPU {} (kept from the previous arbiter)",
                    i.rec.function,
                    i.throttle.ceiling(),
                    h.gpu
                );
                let (id, pid) = (i.rec.id, i.rec.pid);
                self.event(EventKind::Share, Some(id), Some(pid), msg);
            }
        }
    }

    /// The trainer's phase on `g` as request admission reads it from the turn board's samples:
    /// `{"now": "busy"|"idle", "ms_left", "busy_ms", "idle_ms"}`; null where the GPU's functions
    /// do not take turns, without a training job, or before the samples show whole phases.
    fn phase_status(&self, g: &Gpu) -> serde_json::Value {
        let turns = takes_turns(self.cfg.harvest, self.cfg.turns);
        let now = smore_protocol::grant::monotonic_ns();
        let Some(p) = g
            .board
            .as_ref()
            .filter(|_| turns && !g.training.is_empty())
            .and_then(|b| phase::predict(b.board(), now))
        else {
            return serde_json::Value::Null;
        };
        let (kind, until) = match p.phase {
            phase::Phase::Busy { until } => ("busy", until),
            phase::Phase::Idle { until } => ("idle", until),
        };
        serde_json::json!({
            "now": kind,
            "ms_left": until.saturating_sub(now) as f64 / 1e6,
            "busy_ms": p.busy_ns as f64 / 1e6,
            "idle_ms": p.idle_ns as f64 / 1e6,
        })
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
                    .filter(|i| i.rec.gpu == g.info.index)
                    .map(|i| {
                        let mut v = serde_json::to_value(i).unwrap_or_default();
                        // The gates its raw share is divided among (docs/shim.md, "One share
                        // per grant").
                        v["raw_gates"] = serde_json::json!(i.raw_gates());
                        v["p50_ms"] = serde_json::json!(i.latency_percentile(0.5));
                        v["p99_ms"] = serde_json::json!(i.latency_percentile(0.99));
                        v
                    })
                    .collect();
                let mut v = serde_json::to_value(g).unwrap_or_default();
                v["harvest"] = serde_json::json!({
                    "enabled": self.cfg.harvest,
                    "theta": g.harvest.theta(),
                    "slowdown_estimate": g.meter.slowdown().filter(|_| !g.training.is_empty()),
                    "collision_fraction": g.meter.fraction().filter(|_| !g.training.is_empty()),
                    "slowdown_nvml": g.estimate.slowdown().filter(|_| !g.training.is_empty()),
                    "budget_ppm": g.harvest.total_ppm(),
                    "training_share": g.harvest.training_share(),
                    "measured_budget_ppm": g.harvest.measured_total_ppm(),
                    "calibration": g.harvest.calibration(),
                    // The trainer's phase as the functions' samples on the turn board show it
                    // (docs/harvest.md, "Phase prediction"); null until it can be read.
                    "trainer_phase": self.phase_status(g),
                });
                v["granted"] = serde_json::json!(view.grants.iter().map(|x| x.cap).sum::<u64>());
                let peak = g.memory.peak();
                v["training_peak"] = serde_json::json!(peak);
                v["training_reserved"] = serde_json::json!(view.training_reserved);
                v["training_headroom"] =
                    serde_json::json!(view.training_reserved.saturating_sub(peak));
                v["reclaim_line"] =
                    serde_json::json!((g.info.total as f64 * self.cfg.reclaim_line) as u64);
                v["admission_hold_s"] = serde_json::json!(view.admission_hold_s);
                v["free_for_functions"] =
                    serde_json::json!(view.free_for_functions(self.cfg.memory_safety));
                v["functions"] = serde_json::Value::Array(functions);
                // What this node's policy decides on, verbatim: the scheduler extender rebuilds
                // its GpuView from it (docs/kubernetes.md).
                v["policy_view"] = serde_json::to_value(&view).unwrap_or_default();
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
                "descendants": self.lineage.mode().describe(),
                "started_at": self.started_at,
                "now": self.clock.now(),
            },
            "gpus": gpus,
            "counters": self.counters,
            "prewarm": {
                "policy": self.cfg.prewarm_policy,
                "warm_memory": self.warm_memory(),
                "hints": self.hints,
                "error": self.prewarm_error(),
            },
            "events": self.events.recent(),
        })
    }
}

/// Whether requests on a GPU shared as `sharing` (None: not known yet) get a latest start for
/// deferral under `mode` (docs/harvest.md, "Deferral").
fn defers(mode: DeferMode, sharing: Option<Sharing>) -> bool {
    match mode {
        DeferMode::On => true,
        DeferMode::Off => false,
        DeferMode::Auto => sharing == Some(Sharing::Mps),
    }
}

/// Whether the harvesting functions of a GPU take turns under `mode` (docs/harvest.md,
/// "Serializing the functions"), whatever the GPU's sharing mode: under MPS too, a shim cannot
/// tell a kernel slowed beside another function from one slowed beside the trainer, and without
/// turns the budget paid for the functions' slowing of each other (docs/harvest.md, "The
/// calibrated floor under MPS").
fn takes_turns(harvesting: bool, mode: TurnsMode) -> bool {
    harvesting && mode != TurnsMode::Off
}

/// What the shims on a GPU shared as `sharing` (None: not known yet) charge per context switch,
/// ns: the node's `[gpus] context_switch_us` while harvesting on a GPU without MPS; 0 under MPS
/// (contexts do not switch) and with harvest off (no collision budget to charge). An unknown mode
/// is charged: the side that protects training (docs/harvest.md, "Context switches").
fn switch_charge(harvesting: bool, sharing: Option<Sharing>, configured_ns: u64) -> u64 {
    if harvesting && sharing != Some(Sharing::Mps) {
        configured_ns
    } else {
        0
    }
}

/// The timing-noise allowance a GPU's function pages carry: the node's on a time-sliced GPU
/// (where it was measured: docs/real-gpu.md, section 10), none under MPS — where a kernel's
/// stretch is the whole signal of a collision (the shims count no idle-stream wait there, as the page's
/// mode says: docs/harvest.md, "Waits under MPS"), and a 60 µs stretch allowance took nearly
/// all of it off the H200's MPS traces (docs/real-gpu.md, section 11); on the
/// simulated GPU's MPS model the H200's allowance cut the estimate from 3.4 to 1.8 % against a
/// true 4.6–5.0 % (docs/harvest.md, "Timing noise") — and none before the mode is known (the
/// side that counts every collision; it is known from the first sample that shows a compute
/// process on the GPU, a function's own included).
fn timing_noise(sharing: Option<Sharing>, configured: TimingNoise) -> TimingNoise {
    if sharing == Some(Sharing::TimeSliced) {
        configured
    } else {
        TimingNoise::NONE
    }
}

/// Whether one MPS server the arbiter recognizes (`servers`: root's, [`attribution`]) runs every
/// other compute process of `sample` as its client. NVML's client list is the GPU's, not a
/// server's: a second server (a function's own daemon, whose server the arbiter takes for
/// training) would serve clients that take turns with the first one's, and NVML would list
/// them all (found by review, 2026-11-28).
fn serves_all(servers: &[(u32, u64)], sample: &GpuSample) -> bool {
    let [(server, _)] = servers else {
        return false;
    };
    sample
        .procs
        .keys()
        .all(|pid| pid == server || sample.mps_clients.binary_search(pid).is_ok())
}

/// The mode a function's page carries, by which its shims judge waits (docs/harvest.md, "Waits
/// under MPS"): MPS only when the GPU reads MPS and one MPS server the arbiter recognizes runs
/// every other compute process of it ([`serves_all`]: the trainers and the function's own
/// among them) — a process outside that server takes turns with its clients, and a function
/// that started an MPS daemon of its own would otherwise have the GPU's MPS reading count its
/// waits behind the trainer as nothing (found by review, 2026-11-28). A function with no GPU
/// process yet: time-sliced, the side that counts its waits. Otherwise the GPU's mode. The
/// shim also honours MPS only while NVML lists its own process as a client.
fn page_sharing(gpu: Option<Sharing>, one_server: bool, own: &[u32]) -> Option<Sharing> {
    match gpu {
        Some(Sharing::Mps) if one_server && !own.is_empty() => Some(Sharing::Mps),
        Some(_) => Some(Sharing::TimeSliced),
        None => None,
    }
}

/// Says once per change how a GPU's processes share it, and in harvest mode what that means.
fn log_sharing(index: u32, sharing: Sharing, harvest: bool, switch_ns: u64) {
    match sharing {
        Sharing::Mps => tracing::info!(
            "GPU {index}: MPS clients on it — kernels of different processes run concurrently; a \
             function's kernel costs a training kernel it meets its slowing"
        ),
        Sharing::TimeSliced if harvest => tracing::info!(
            "GPU {index}: no MPS — processes take turns in time slices; a function's kernel that \
             meets training costs it its whole run time{}, so functions with SLOs of a few ms get \
             far less of the collision budget's worth than under MPS (docs/harvest.md)",
            if switch_ns > 0 {
                format!(
                    " and two context switches ([gpus] context_switch_us = {}: charged)",
                    switch_ns / 1_000
                )
            } else {
                String::new()
            }
        ),
        Sharing::TimeSliced => {
            tracing::info!("GPU {index}: no MPS — processes take turns in time slices")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::training::SOLO_MIN_SAMPLES;
    use super::watchdog::SM_OVERUSE_SAMPLES;
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
        // The first version's raw time shares (the rules these tests pin down); harvest mode has
        // tests of its own below.
        let cfg = Config {
            harvest: false,
            ..Config::default()
        };
        State::new(cfg, gpus, Box::new(FitPolicy))
    }

    fn harvest_state() -> State {
        let mut s = state();
        s.cfg.harvest = true;
        // As a daemon started with harvest on: the boards say so.
        s.set_turns();
        s
    }

    #[test]
    fn the_gpus_sharing_mode_is_the_last_one_nvml_told_and_is_in_status() {
        let mut s = harvest_state();
        assert_eq!(s.gpus[0].sharing, None);
        let told = |m: Option<Sharing>| GpuSample {
            sharing: m,
            ..training_sample(50, &[])
        };
        s.reconcile(&[(0, told(Some(Sharing::Mps)))]);
        assert_eq!(s.gpus[0].sharing, Some(Sharing::Mps));
        assert_eq!(s.snapshot()["gpus"][0]["sharing"], "mps");
        // A sample that cannot tell (an idle GPU, no MPS list) keeps what was known.
        s.reconcile(&[(0, told(None))]);
        assert_eq!(s.gpus[0].sharing, Some(Sharing::Mps));
        s.reconcile(&[(0, told(Some(Sharing::TimeSliced)))]);
        assert_eq!(s.snapshot()["gpus"][0]["sharing"], "time-sliced");
        // The other GPU was never sampled.
        assert!(s.snapshot()["gpus"][1]["sharing"].is_null());
    }

    #[test]
    fn a_harvesting_function_is_charged_context_switches_on_a_gpu_without_mps_only() {
        let mut s = harvest_state();
        s.cfg.context_switch_ns = 250_000;
        let (g, page) = s.register(me(), args(1 << 30)).unwrap();
        let slot = s.instances[&g.instance].rec.slot as usize;
        let told = |m: Option<Sharing>| GpuSample {
            sharing: m,
            ..training_sample(50, &[])
        };
        // Not known yet: charged (the side that protects training).
        for _ in 0..HARVEST_EVERY {
            s.reconcile(&[(g.gpu_index, told(None))]);
        }
        assert!(page.page().contention(slot) > 0, "harvest on");
        assert_eq!(page.page().switch(slot), 250_000);
        // MPS: contexts do not switch; the next round's page says so.
        s.reconcile(&[(g.gpu_index, told(Some(Sharing::Mps)))]);
        assert_eq!(page.page().switch(slot), 0);
        s.reconcile(&[(g.gpu_index, told(Some(Sharing::TimeSliced)))]);
        assert_eq!(page.page().switch(slot), 250_000);
        // A reload changes the charge on the page at once.
        let base = s.cfg.clone();
        let new = Config {
            context_switch_ns: 100_000,
            ..base.clone()
        };
        let out = s
            .reload(&base, &new, |_| unreachable!("θ did not change"))
            .unwrap();
        assert_eq!(out.applied, vec!["context_switch_ns: 250000 -> 100000"]);
        assert!(out.need_restart.is_empty(), "{out:?}");
        assert_eq!(page.page().switch(slot), 100_000);
        // The training job left: no budget, nothing to charge.
        for _ in 0..HARVEST_EVERY {
            s.reconcile(&[(g.gpu_index, GpuSample::default())]);
        }
        assert_eq!(page.page().contention(slot), 0);
        assert_eq!(page.page().switch(slot), 0);
    }

    #[test]
    fn the_time_an_instances_shims_held_launches_sums_its_processes() {
        let mut s = harvest_state();
        let (g, _page) = s.register(me(), args(1 << 30)).unwrap();
        let held = |ms: u64| ShimUsage {
            held_ns: ms * 1_000_000,
            ..Default::default()
        };
        s.report_usage(g.instance, 10, held(300));
        // Another worker of the function, with its own counters.
        s.report_usage(g.instance, 11, held(50));
        s.report_usage(g.instance, 10, held(400));
        // A new worker that has held nothing yet takes nothing away.
        s.report_usage(g.instance, 12, held(0));
        assert_eq!(s.instances[&g.instance].throttled_ns, 450_000_000);
        assert_eq!(
            s.snapshot()["gpus"][0]["functions"][0]["throttled_ns"],
            450_000_000u64
        );
    }

    #[test]
    fn a_time_sliced_gpus_function_pages_carry_the_nodes_timing_noise_and_a_reload_changes_it() {
        let mut s = harvest_state();
        assert_eq!(s.cfg.timing_noise, TimingNoise::H200, "the default");
        let (g, page) = s.register(me(), args(1 << 30)).unwrap();
        let slot = s.instances[&g.instance].rec.slot as usize;
        // The trainer (pid 1) and the function are MPS clients whenever the GPU reads MPS (of
        // a server the arbiter does not see here).
        let mut clients = vec![1, me().pid];
        clients.sort_unstable();
        let told = |m: Option<Sharing>| GpuSample {
            sharing: m,
            mps_clients: if m == Some(Sharing::Mps) {
                clients.clone()
            } else {
                Vec::new()
            },
            ..training_sample(50, &[(me().pid, 5)])
        };
        // Before the GPU's mode is known: none (every collision counted), and no mode.
        assert_eq!(page.page().timing_noise(slot), TimingNoise::NONE);
        for _ in 0..HARVEST_EVERY {
            s.reconcile(&[(g.gpu_index, told(None))]);
        }
        assert!(page.page().contention(slot) > 0, "harvest on");
        assert_eq!(page.page().timing_noise(slot), TimingNoise::NONE);
        assert_eq!(page.page().sharing(slot), None);
        // Time-sliced: the node's allowance; MPS: none; time-sliced again: the node's. The
        // page names the mode each time (the shim judges waits by it).
        s.reconcile(&[(g.gpu_index, told(Some(Sharing::TimeSliced)))]);
        assert_eq!(page.page().timing_noise(slot), TimingNoise::H200);
        assert_eq!(page.page().sharing(slot), Some(Sharing::TimeSliced));
        let shown = &s.snapshot()["gpus"][0]["functions"][0]["timing_noise"];
        assert_eq!(
            (shown["wait_us"].as_u64(), shown["stretch_us"].as_u64()),
            (Some(100), Some(60)),
            "the status shows it: {shown}"
        );
        s.reconcile(&[(g.gpu_index, told(Some(Sharing::Mps)))]);
        assert_eq!(page.page().timing_noise(slot), TimingNoise::NONE);
        // No MPS server the arbiter knows runs them all: the page says time-sliced.
        assert_eq!(page.page().sharing(slot), Some(Sharing::TimeSliced));
        s.reconcile(&[(g.gpu_index, told(Some(Sharing::TimeSliced)))]);
        assert_eq!(page.page().timing_noise(slot), TimingNoise::H200);
        assert_eq!(page.page().sharing(slot), Some(Sharing::TimeSliced));
        // A reload changes it on the page at once.
        let base = s.cfg.clone();
        let exact = Config {
            timing_noise: TimingNoise::NONE,
            ..base.clone()
        };
        let out = s
            .reload(&base, &exact, |_| unreachable!("θ did not change"))
            .unwrap();
        assert_eq!(out.applied.len(), 1, "{out:?}");
        assert!(out.applied[0].starts_with("timing_noise: "), "{out:?}");
        assert!(out.need_restart.is_empty(), "{out:?}");
        assert_eq!(page.page().timing_noise(slot), TimingNoise::NONE);
        // Back to the H200's; without training (no harvest) the page still says it: the shim
        // judges nothing by it then, and it is right the moment a trainer arrives.
        let out = s
            .reload(&exact, &base, |_| unreachable!("θ did not change"))
            .unwrap();
        assert_eq!(out.applied.len(), 1, "{out:?}");
        assert_eq!(page.page().timing_noise(slot), TimingNoise::H200);
        for _ in 0..HARVEST_EVERY {
            s.reconcile(&[(g.gpu_index, GpuSample::default())]);
        }
        assert_eq!(page.page().contention(slot), 0);
        assert_eq!(page.page().timing_noise(slot), TimingNoise::H200);
    }

    #[test]
    fn the_status_shows_the_trainer_phase_read_from_the_samples_on_the_turn_board() {
        const MS: u64 = 1_000_000;
        let mut s = harvest_state();
        let (g, _page) = s.register(me(), args(1 << 30)).unwrap();
        let board = s.board_of(g.gpu_index).expect("the GPU's board").clone();
        let phase = |s: &State| s.snapshot()["gpus"][0]["harvest"]["trainer_phase"].clone();
        // Samples of a trainer busy 12 ms of every 52, one every 2 ms over the last 400 ms, `now`
        // 30 ms into an iteration (mid-idle: not a lull, whatever the clock reads).
        let now = smore_protocol::grant::monotonic_ns();
        let post = || {
            for k in 1..=200u64 {
                let into = (30 + 52 * 100 - 2 * k) % 52;
                phase::post(board.board(), now - 2 * k * MS, into < 12);
            }
        };
        post();
        assert!(phase(&s).is_null(), "no training job: no phase");
        s.reconcile(&[(g.gpu_index, training_sample(25, &[]))]);
        let p = phase(&s);
        let ms = |k: &str| p[k].as_f64().unwrap_or(f64::NAN);
        assert!((ms("busy_ms") - 12.0).abs() <= 3.0, "{p}");
        assert!((ms("idle_ms") - 40.0).abs() <= 3.0, "{p}");
        assert!(p["now"] == "busy" || p["now"] == "idle", "{p}");
        // Under MPS the functions take turns too, and their samples are read.
        post();
        s.reconcile(&[(
            g.gpu_index,
            GpuSample {
                sharing: Some(Sharing::Mps),
                ..training_sample(25, &[])
            },
        )]);
        assert!(!phase(&s).is_null(), "MPS: turns, so a phase");
        // Where the functions do not take turns their samples are not read, fresh or not.
        s.cfg.turns = TurnsMode::Off;
        post();
        assert!(phase(&s).is_null(), "no turns, no phase");
    }

    #[test]
    fn a_harvesting_gpu_hands_its_turn_board_and_counts_its_functions_collisions_whole() {
        let mut s = harvest_state();
        let (g, _page) = s.register(me(), args(1 << 30)).unwrap();
        assert!(g.board, "a harvesting grant says its board follows");
        let board = s.board_of(g.gpu_index).expect("the GPU's board").clone();
        let enabled = || {
            board
                .board()
                .enabled
                .load(std::sync::atomic::Ordering::Relaxed)
        };
        assert_eq!(enabled(), 1, "unknown mode: turns");
        let told = |m: Option<Sharing>| GpuSample {
            sharing: m,
            ..training_sample(50, &[])
        };
        // Under MPS too: a shim cannot tell a kernel slowed beside another function from one
        // slowed beside the trainer (docs/harvest.md, "The calibrated floor under MPS").
        s.reconcile(&[(g.gpu_index, told(Some(Sharing::Mps)))]);
        assert_eq!(enabled(), 1, "MPS: turns");
        s.reconcile(&[(g.gpu_index, told(Some(Sharing::TimeSliced)))]);
        assert_eq!(enabled(), 1);
        // With turns, a function's waits are behind training only: its share is 1 whatever
        // the others use. Two functions on the GPU, training busy 30 %, each using 20 % of the
        // GPU by both NVML and its shims: without turns training's part would be 0.3 / 0.5.
        s.cfg.grants_per_process = 100;
        let b = s.register(me(), args(1 << 30)).unwrap().0;
        for _ in 0..20 {
            s.reconcile(&[(g.gpu_index, training_sample(30, &[]))]);
        }
        s.instances.get_mut(&b.instance).unwrap().rec.gpu = g.gpu_index;
        // Seats are the arbiter's: one per instance, in its page; a released one is free again.
        let seat_of = |s: &State, id: u64| {
            let i = &s.instances[&id];
            let p = i
                .page
                .as_ref()
                .unwrap()
                .page()
                .turn_seat(i.rec.slot as usize);
            assert_eq!(p, i.turn_seat, "the page says the instance's seat");
            p
        };
        let a_seat = seat_of(&s, g.instance).expect("a seat");
        s.seat(b.instance);
        let b_seat = seat_of(&s, b.instance).expect("a seat");
        assert_ne!(a_seat, b_seat);
        let owner = |seat: usize| {
            board.board().members[seat]
                .owner
                .load(std::sync::atomic::Ordering::SeqCst)
        };
        assert_eq!(owner(b_seat), b.instance);
        let c = s.register(me(), args(1 << 30)).unwrap().0;
        s.instances.get_mut(&c.instance).unwrap().rec.gpu = g.gpu_index;
        s.seat(c.instance);
        let c_seat = seat_of(&s, c.instance).unwrap();
        s.release(c.instance, "test");
        assert_eq!(owner(c_seat), 0, "released: the seat is free");
        let gi = s
            .gpus
            .iter()
            .position(|x| x.info.index == g.gpu_index)
            .unwrap();
        let share = |s: &mut State| {
            for id in [g.instance, b.instance] {
                let i = s.instances.get_mut(&id).unwrap();
                i.gpu_used_ppm = 200_000;
                i.sm_used_mean = Some(0.2);
                i.contention_used_ppm = 10_000;
            }
            s.attribute_collisions();
            s.gpus[gi].harvest.training_share()
        };
        assert_eq!(share(&mut s), 1.0);
        // An admitted request's deadline is its place in line on the page; none without turns.
        let slot = s.instances[&g.instance].rec.slot as usize;
        let page = s.instances[&g.instance].page.clone().unwrap();
        s.instances.get_mut(&g.instance).unwrap().rec.slo_ms = 10.0;
        let before = smore_protocol::grant::monotonic_ns();
        s.instances[&g.instance].write_turn_key(true, 4.0);
        let key = page.page().turn_key(slot);
        assert!(
            key >= before + 6_000_000 && key < before + 1_000_000_000,
            "{key}"
        );
        s.instances[&g.instance].write_turn_key(false, 4.0);
        assert_eq!(page.page().turn_key(slot), 0);
        s.cfg.turns = TurnsMode::Off;
        assert!(
            share(&mut s) < 0.9,
            "without turns, part of it is the other function's"
        );
        s.cfg.turns = TurnsMode::Auto;
        // A reload that turns them off switches the board off and hands none to new grants.
        let base = s.cfg.clone();
        let new = Config {
            turns: TurnsMode::Off,
            ..base.clone()
        };
        let out = s
            .reload(&base, &new, |_| unreachable!("θ did not change"))
            .unwrap();
        assert_eq!(out.applied, vec!["turns: \"auto\" -> \"off\""]);
        assert_eq!(enabled(), 0);
        assert!(s.board_of(g.gpu_index).is_none());
        assert!(!s.grant_of(g.instance).board);
        // Harvest off: no turns either.
        assert!(!takes_turns(false, TurnsMode::On));
        assert!(takes_turns(true, TurnsMode::Auto));
        assert!(!takes_turns(true, TurnsMode::Off));
    }

    /// A sample with a training process (pid 1, never ours) busy `util` % and `fns` (pid, SM %).
    fn training_sample(util: u32, fns: &[(u32, u32)]) -> GpuSample {
        let mut sample = GpuSample {
            used: 3 << 30,
            util: Some(util),
            ..Default::default()
        };
        sample.procs.insert(1, 2 << 30);
        sample.proc_util.insert(1, util);
        for &(pid, sm) in fns {
            sample.procs.insert(pid, 1 << 20);
            sample.proc_util.insert(pid, sm);
        }
        sample
    }

    #[test]
    fn harvest_grants_the_whole_gpu_and_a_split_collision_budget_beside_training() {
        let mut s = harvest_state();
        let (g, page) = s.register(me(), args(1 << 30)).unwrap();
        assert_eq!(page.page().contention(0), 0, "no training yet: harvest off");
        s.reconcile(&[(g.gpu_index, training_sample(60, &[]))]);
        assert_eq!(page.page().share(0), 100, "raw share: the whole GPU");
        let ppm = page.page().contention(0);
        assert!(ppm > 0 && ppm <= 90_910, "θ/(1+θ) at most: {ppm}");
        // The training job leaves: nothing to protect, harvest off again.
        s.reconcile(&[(g.gpu_index, GpuSample::default())]);
        assert_eq!(page.page().contention(0), 0);
    }

    #[test]
    fn reported_collisions_become_the_published_slowdown_estimate() {
        // 50 ms a second charged for 12 s; measured on the samples: not reported (the charge
        // stands in, c = 0.05), or 20 ms a second (c = 0.02: the estimate counts what was
        // measured, the function's use what its bucket paid).
        for (measured_per_s, c) in [(None, 0.05), (Some(20_000_000u64), 0.02)] {
            let mut s = harvest_state();
            let clock = facts::fake::FakeClock::default();
            s.clock = Box::new(clock.clone());
            let (g, _page) = s.register(me(), args(1 << 30)).unwrap();
            for sec in 0..=12u64 {
                if sec > 0 {
                    s.report_usage(
                        g.instance,
                        me().pid,
                        ShimUsage {
                            gpu_ns: sec * 200_000_000,
                            contention_ns: sec * 50_000_000,
                            measured_contention_ns: measured_per_s.map(|m| sec * m),
                            ..Default::default()
                        },
                    );
                }
                for _ in 0..HARVEST_EVERY {
                    s.reconcile(&[(g.gpu_index, training_sample(60, &[]))]);
                }
                // The harvest step reads the clock: a second per step.
                clock.advance(1.0);
            }
            let est = s.snapshot()["gpus"][0]["harvest"]["slowdown_estimate"]
                .as_f64()
                .unwrap();
            assert!(
                (est - c / (1.0 - c)).abs() < 0.005,
                "{measured_per_s:?}: {est}"
            );
            let f = &s.snapshot()["gpus"][0]["functions"][0];
            assert!(f["contention_used_ppm"].as_u64().unwrap() > 40_000, "{f}");
        }
    }

    #[test]
    fn a_function_the_budget_at_its_floor_cannot_hold_has_its_raw_share_cut_and_given_back() {
        // One function keeps colliding 120 ms a second (c ≥ 0.12: over θ 10 %) however small its
        // part; its neighbour measures 20 ms a second, over its own small part but a sliver of
        // what the GPU's functions measured. The calibration falls to its floor, then the first
        // function's raw share is cut from what it used (30 % of the GPU); the neighbour's is
        // untouched. Once the first collides no more, it gets its GPU time back step by step;
        // cut again, it is lifted at once when harvest is turned off.
        let mut s = harvest_state();
        s.cfg.grants_per_process = 100;
        let clock = facts::fake::FakeClock::default();
        s.clock = Box::new(clock.clone());
        let (g, page) = s.register(me(), args(1 << 30)).unwrap();
        let (other, other_page) = s.register(me(), args(1 << 30)).unwrap();
        s.instances.get_mut(&other.instance).unwrap().rec.gpu = g.gpu_index;
        let (mut gpu_ns, mut collided_ns, mut other_ns) = (0u64, 0u64, 0u64);
        let mut step = |s: &mut State, collide_ns: u64| {
            gpu_ns += 300_000_000;
            collided_ns += collide_ns;
            other_ns += 20_000_000;
            s.report_usage(
                g.instance,
                me().pid,
                ShimUsage {
                    gpu_ns,
                    contention_ns: collided_ns,
                    measured_contention_ns: Some(collided_ns),
                    ..Default::default()
                },
            );
            s.report_usage(
                other.instance,
                me().pid,
                ShimUsage {
                    gpu_ns: gpu_ns / 3,
                    contention_ns: other_ns,
                    measured_contention_ns: Some(other_ns),
                    ..Default::default()
                },
            );
            for _ in 0..HARVEST_EVERY {
                s.reconcile(&[(g.gpu_index, training_sample(40, &[]))]);
            }
            clock.advance(1.0);
        };
        let observation = OBSERVE_EVERY / HARVEST_EVERY;
        let gi = s
            .gpus
            .iter()
            .position(|x| x.info.index == g.gpu_index)
            .unwrap();
        let mut floor_at = None;
        let mut cut_at = None;
        for sec in 0..200 {
            step(&mut s, 120_000_000);
            if floor_at.is_none() && s.gpus[gi].harvest.calibration() == harvest::CALIBRATION_MIN {
                floor_at = Some(sec);
            }
            if page.page().share(0) < 100 {
                cut_at = Some(sec);
                break;
            }
        }
        let (floor_at, cut_at) = (floor_at.expect("no floor"), cut_at.expect("never cut"));
        assert!(
            cut_at >= floor_at + observation,
            "the floor's budget is tried for an observation first: floor {floor_at}, cut {cut_at}"
        );
        let first = page.page().share(0);
        // 80 % of what it used (300 ms a second, as its use window reads it).
        let used = s.instances[&g.instance].gpu_used_ppm;
        assert!((250_000..=450_000).contains(&used), "{used}");
        assert_eq!(first, (used.div_ceil(10_000) as f64 * 0.8) as u32);
        let o = &s.instances[&other.instance];
        let (m, p) = (
            o.meter.fraction().unwrap(),
            f64::from(o.contention_ppm) / 1e6 * o.training_share,
        );
        assert!(m > p, "the neighbour is over its own part: {m} > {p}");
        assert_eq!(other_page.page().share(0), 100, "but it is not cut");
        let snap = s.snapshot();
        let f = snap["gpus"][0]["functions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["id"] == g.instance)
            .unwrap()
            .clone();
        assert_eq!(f["throttle_pct"], first, "{f}");
        assert!(
            s.events.recent().iter().any(|e| e.kind == EventKind::Share
                && e.instance == Some(g.instance)
                && e.message
                    .contains(&format!("raw share is cut from 100 % to {first} %"))),
            "the cut is an event that says why"
        );
        // Still over θ: cut again, but not before the estimate's window has passed.
        for _ in 0..observation {
            step(&mut s, 120_000_000);
        }
        assert_eq!(
            page.page().share(0),
            first,
            "not within the estimate's window"
        );
        for _ in 0..observation {
            step(&mut s, 120_000_000);
        }
        assert!(page.page().share(0) < first, "{}", page.page().share(0));
        // No more collisions: once the estimate's window is well under θ, the share comes back,
        // a step per observation, until there is no throttle at all.
        let mut seen = vec![page.page().share(0)];
        for _ in 0..400 {
            step(&mut s, 0);
            let now = page.page().share(0);
            if seen.last() != Some(&now) {
                seen.push(now);
            }
        }
        assert_eq!(page.page().share(0), 100);
        assert!(
            seen.windows(2)
                .all(|w| w[1] == w[0] + harvest::THROTTLE_STEP_PCT
                    || (w[1] == 100 && w[0] + harvest::THROTTLE_STEP_PCT >= 100)),
            "additive steps: {seen:?}"
        );
        let snap = s.snapshot();
        assert!(snap["gpus"][0]["functions"]
            .as_array()
            .unwrap()
            .iter()
            .all(|f| f["throttle_pct"].is_null()));
        // Cut again, then harvest is turned off: lifted at the next observation.
        for _ in 0..200 {
            step(&mut s, 120_000_000);
            if page.page().share(0) < 100 {
                break;
            }
        }
        assert!(page.page().share(0) < 100, "cut again");
        s.cfg.harvest = false;
        for _ in 0..observation {
            step(&mut s, 120_000_000);
        }
        assert_eq!(page.page().share(0), 100, "harvest off: no throttle");
        assert!(!s.instances[&g.instance].throttle.is_on());
    }

    #[test]
    fn a_function_that_bursts_and_leaves_does_not_get_its_neighbour_throttled() {
        // A neighbour collides 20 ms a second, over its small part. A bursting function adds
        // 400 ms a second and is released just before an observation: the estimate's window
        // still holds its burst, and the neighbour, owning a sliver of that excess, is not cut.
        let mut s = harvest_state();
        s.cfg.grants_per_process = 100;
        let clock = facts::fake::FakeClock::default();
        s.clock = Box::new(clock.clone());
        let (g, page) = s.register(me(), args(1 << 30)).unwrap();
        let (burst, _) = s.register(me(), args(1 << 30)).unwrap();
        s.instances.get_mut(&burst.instance).unwrap().rec.gpu = g.gpu_index;
        let (mut mine, mut theirs, mut gpu_ns) = (0u64, 0u64, 0u64);
        let (mut released, mut above_after) = (false, 0);
        let gi = s
            .gpus
            .iter()
            .position(|x| x.info.index == g.gpu_index)
            .unwrap();
        for sec in 0..300u64 {
            gpu_ns += 300_000_000;
            mine += 20_000_000;
            s.report_usage(
                g.instance,
                me().pid,
                ShimUsage {
                    gpu_ns,
                    contention_ns: mine,
                    measured_contention_ns: Some(mine),
                    ..Default::default()
                },
            );
            if !released {
                theirs += 400_000_000;
                s.report_usage(
                    burst.instance,
                    me().pid,
                    ShimUsage {
                        gpu_ns,
                        contention_ns: theirs,
                        measured_contention_ns: Some(theirs),
                        ..Default::default()
                    },
                );
            }
            for _ in 0..HARVEST_EVERY {
                s.reconcile(&[(g.gpu_index, training_sample(40, &[]))]);
            }
            clock.advance(1.0);
            // Once the budget has been at its floor a while, the burster leaves between two
            // observations, its burst still in the estimate's window.
            let at_floor = s.gpus[gi].harvest.calibration() == harvest::CALIBRATION_MIN;
            if !released && at_floor && sec % (OBSERVE_EVERY / HARVEST_EVERY) == 1 {
                s.release(burst.instance, "test");
                released = true;
            }
            // Steps after the release with the budget at its floor and the estimate above θ: an
            // observation among them is a cut step, with the neighbour alone to cut.
            if released
                && s.gpus[gi].harvest.calibration() == harvest::CALIBRATION_MIN
                && s.gpus[gi].meter.slowdown().is_some_and(|x| x > 0.1)
            {
                above_after += 1;
                let o = &s.instances[&g.instance];
                let (m, p) = (
                    o.meter.fraction().unwrap_or(0.0),
                    f64::from(o.contention_ppm) / 1e6 * o.training_share,
                );
                assert!(m > p, "the neighbour is over its own part: {m} > {p}");
            }
            if released && sec > 200 {
                break;
            }
        }
        assert!(released, "the budget never reached its floor");
        assert!(
            above_after > OBSERVE_EVERY / HARVEST_EVERY,
            "an observation at the floor saw the burst above θ after it left: {above_after} s"
        );
        assert_eq!(page.page().share(0), 100, "the neighbour is not throttled");
        assert!(!s.instances[&g.instance].throttle.is_on());
    }

    #[test]
    fn the_processes_paying_from_a_budget_share_it_on_the_page() {
        // Each process's shim enforces the page's budget with a bucket of its own: two forked
        // workers that both pay collision time get half each, and the whole again once one
        // stops paying.
        let mut s = harvest_state();
        let clock = facts::fake::FakeClock::default();
        s.clock = Box::new(clock.clone());
        let (g, page) = s.register(me(), args(1 << 30)).unwrap();
        let worker = me().pid + 1;
        let paid = |sec: u64| ShimUsage {
            gpu_ns: sec * 100_000_000,
            contention_ns: sec * 10_000_000,
            ..Default::default()
        };
        let step = |s: &mut State| {
            for _ in 0..HARVEST_EVERY {
                s.reconcile(&[(g.gpu_index, training_sample(60, &[]))]);
            }
            clock.advance(1.0);
        };
        step(&mut s);
        for sec in 1..=3 {
            s.report_usage(g.instance, me().pid, paid(sec));
            s.report_usage(g.instance, worker, paid(sec));
            step(&mut s);
        }
        let whole = s.instances[&g.instance].contention_ppm;
        assert_eq!(s.instances[&g.instance].contention_processes, 2);
        assert_eq!(page.page().contention(0), whole / 2, "half each");
        // The worker stops paying (it exited): after the use window the other has it all.
        for sec in 4..=8 {
            s.report_usage(g.instance, me().pid, paid(sec));
            step(&mut s);
        }
        let whole = s.instances[&g.instance].contention_ppm;
        assert_eq!(s.instances[&g.instance].contention_processes, 1);
        assert_eq!(page.page().contention(0), whole);
    }

    #[test]
    fn a_functions_raw_share_is_divided_among_its_gates_not_its_processes() {
        // Under `smore run` a function's processes gate by the grant's one raw-share gate: the
        // page carries the whole share, whatever their number. A process with a gate of its own
        // (no shared ledger) gets a part, and so does each process NVML lists that has not
        // reported (as far as the arbiter knows, a gate of its own).
        let mut s = harvest_state();
        let clock = facts::fake::FakeClock::default();
        s.clock = Box::new(clock.clone());
        let (g, page) = s.register(me(), args(1 << 30)).unwrap();
        s.set_share(g.instance, Some(30)).unwrap();
        let (a, b, c) = (me().pid, me().pid + 1, me().pid + 2);
        let used = |sec: u64, raw_shared: bool| ShimUsage {
            gpu_ns: sec * 100_000_000,
            raw_shared,
            ..Default::default()
        };
        let step = |s: &mut State| {
            for _ in 0..HARVEST_EVERY {
                s.reconcile(&[(g.gpu_index, training_sample(60, &[]))]);
            }
            clock.advance(1.0);
        };
        step(&mut s);
        for sec in 1..=3 {
            for pid in [a, b, c] {
                s.report_usage(g.instance, pid, used(sec, true));
            }
            step(&mut s);
        }
        let i = &s.instances[&g.instance];
        assert_eq!(
            (i.gpu_processes, i.raw_gates()),
            (3, 1),
            "three processes, one gate"
        );
        assert_eq!(page.page().share(0), 30, "the whole share on the page");
        assert_eq!(i.raw_allowed(30), 30);
        // One worker loses the shared ledger: a gate of its own, so two gates of 15 % each.
        for sec in 4..=7 {
            s.report_usage(g.instance, a, used(sec, true));
            s.report_usage(g.instance, c, used(sec, true));
            s.report_usage(g.instance, b, used(sec, false));
            step(&mut s);
        }
        assert_eq!(s.instances[&g.instance].raw_gates(), 2);
        assert_eq!(page.page().share(0), 15);
        assert_eq!(
            s.snapshot()["gpus"][0]["functions"][0]["raw_gates"],
            2,
            "in status"
        );
        // An idle process that holds a context and reported once, when its shim started (no GPU
        // time), sharing the gate: known by that report, not a gate of its own. Two more that NVML
        // lists and that never reported: a gate of its own each.
        let idle = c + 3;
        s.report_usage(g.instance, idle, used(0, true));
        let i = s.instances.get_mut(&g.instance).unwrap();
        i.gpu_pids = vec![a, b, c, idle];
        i.refresh_gates();
        assert_eq!(i.raw_gates(), 2, "the idle process shares the gate");
        i.gpu_pids = vec![a, b, c, idle, c + 4, c + 5];
        i.refresh_gates();
        assert_eq!(i.raw_gates(), 4);
        assert_eq!(i.page_share(), 8, "30 over 4 gates, rounded up");
        assert_eq!(i.raw_allowed(30), 32, "what four pages of 8 % allow");
        // Its over-use debt is judged against all its gates, NVML's list or not (a process that
        // just left counts there, as its use does in the mean); the streak against no more gates
        // than NVML lists.
        i.gpu_pids = vec![a];
        assert_eq!(
            i.raw_allowed(30),
            8,
            "one process listed: one page's 8 % at most… "
        );
        assert_eq!(i.raw_allowed_gates(30), 32, "…the debt, all four gates'");
        assert_eq!(
            i.raw_allowed_gates(3),
            4,
            "1 % pages for 4 gates at 3 %: the rounding, not more than 5 points"
        );
    }

    /// A harvesting state on a fake clock with one function of a 20 ms SLO that served 20
    /// requests a second for 4 s, each 2 ms of GPU time of which `collided_ns` collided, beside a
    /// trainer busy `trainer_util` % of the time: request admission has a cost per request to
    /// predict from.
    fn serving_state(
        collided_ns: u64,
        trainer_util: u32,
    ) -> (State, facts::fake::FakeClock, Grant, Arc<PageHandle>) {
        let mut s = harvest_state();
        let clock = facts::fake::FakeClock::default();
        s.clock = Box::new(clock.clone());
        let (g, page) = s
            .register(
                me(),
                RegisterArgs {
                    slo_ms: Some(20.0),
                    ..args(1 << 30)
                },
            )
            .unwrap();
        for sec in 1..=4u64 {
            s.report_usage(
                g.instance,
                me().pid,
                ShimUsage {
                    gpu_ns: sec * 40_000_000,
                    contention_ns: sec * 20 * collided_ns,
                    ..Default::default()
                },
            );
            s.report(g.instance, &[2.5; 20], None, None, None);
            for _ in 0..HARVEST_EVERY {
                s.reconcile(&[(g.gpu_index, training_sample(trainer_util, &[]))]);
            }
            clock.advance(1.0);
        }
        (s, clock, g, page)
    }

    #[test]
    fn request_admission_admits_in_the_trainers_idle_phase_what_it_refuses_in_its_busy_one() {
        const MS: u64 = 1_000_000;
        // Every request 2 ms of GPU time, a quarter of it colliding.
        let (mut s, _clock, g, _page) = serving_state(500_000, 30);
        let board = s.board_of(g.gpu_index).expect("the GPU's board").clone();
        // Samples of a trainer busy 12 ms of every 52, one a millisecond up to `now`, which falls
        // `at_ms` into its iteration.
        let trace = |at_ms: u64| {
            let now = smore_protocol::grant::monotonic_ns();
            for k in (1..=300u64).rev() {
                let into = (at_ms + 52 * 300 - k) % 52;
                phase::post(board.board(), now - k * MS, into < 12);
            }
        };
        // A burst runs the mirror into debt: without a phase known, requests are refused.
        let refused = (0..400)
            .map(|_| s.admit_request(g.instance, 0.0))
            .filter(|a| !a.admitted)
            .count();
        assert!(refused > 0, "the burst ran the mirror into debt");
        assert!(!s.admit_request(g.instance, 0.0).admitted);
        // 20 ms into the iteration, 8 ms into the idle phase: its launches will not meet the
        // trainer, so the shim will not hold them — admitted. (The phase is read at admission,
        // on the real clock: on a loaded machine the read may come after the phase changed, so
        // each case is tried a few times.)
        assert!(
            (0..5).any(|_| {
                trace(20);
                s.admit_request(g.instance, 0.0).admitted
            }),
            "admitted in the trainer's idle phase"
        );
        // 1 ms into a busy phase: held, and refused.
        assert!(
            (0..5).any(|_| {
                trace(1);
                let a = s.admit_request(g.instance, 0.0);
                !a.admitted && a.reason.starts_with("harvest:")
            }),
            "refused in the trainer's busy phase"
        );
    }

    #[test]
    fn request_admission_refuses_what_the_collision_budget_would_make_late_and_admits_the_rest() {
        // Beside a trainer that never idles: every request is 2 ms of GPU time, all of it
        // colliding, 20 requests a second, for 4 s.
        let (mut s, clock, g, page) = serving_state(2_000_000, 95);
        let ppm = page.page().contention(0);
        assert!(ppm > 0, "harvest on");
        // A burst at one instant: the budget's 1 s horizon serves ppm × 1 s of collision at full
        // speed (ppm/2000 requests of 2 ms); past it the shim would hold each further request
        // 2 ms / rate more, beyond a 20 ms SLO after a few.
        let unheld = (ppm as f64 / 1e6 / 2e-3).floor() as usize;
        let verdicts: Vec<Admission> = (0..unheld + 40)
            .map(|_| s.admit_request(g.instance, 0.0))
            .collect();
        let admitted = verdicts.iter().filter(|a| a.admitted).count();
        assert!(
            admitted >= unheld && admitted < unheld + 40,
            "{admitted} admitted, {unheld} fit the horizon"
        );
        let refused = verdicts.iter().find(|a| !a.admitted).unwrap();
        assert!(refused.reason.starts_with("harvest:"), "{}", refused.reason);
        let f = &s.snapshot()["gpus"][0]["functions"][0];
        assert_eq!(
            f["paced_refusals"].as_u64().unwrap() as usize,
            unheld + 40 - admitted,
            "{f}"
        );
        // A second later the bucket has drained: requests run again.
        clock.advance(1.0);
        assert!(s.admit_request(g.instance, 0.0).admitted);
        // One that already waited past its SLO at the platform is refused.
        assert!(!s.admit_request(g.instance, 25.0).admitted);
    }

    #[test]
    fn an_admitted_request_tells_its_shim_how_long_it_may_wait_out_the_trainer() {
        let mut s = harvest_state();
        s.cfg.defer = DeferMode::On;
        let clock = facts::fake::FakeClock::default();
        s.clock = Box::new(clock.clone());
        let (g, page) = s
            .register(
                me(),
                RegisterArgs {
                    slo_ms: Some(20.0),
                    ..args(1 << 30)
                },
            )
            .unwrap();
        let slot = s.instances[&g.instance].rec.slot as usize;
        // Before anything is known of its requests: admitted, no deferral.
        assert!(s.admit_request(g.instance, 0.0).admitted);
        assert_eq!(page.page().defer_until(slot), 0);
        // 20 requests a second of 2 ms GPU time each, little of it colliding.
        for sec in 1..=4u64 {
            s.report_usage(
                g.instance,
                me().pid,
                ShimUsage {
                    gpu_ns: sec * 40_000_000,
                    contention_ns: sec * 1_000_000,
                    measured_contention_ns: None,
                    deferred_ns: sec * 2_000_000,
                    turn_waited_ns: sec * 500_000,
                    turn_cut_ins: sec * 3,
                    held_ns: sec * 3_000_000,
                    shared: false,
                    raw_shared: false,
                },
            );
            s.report(g.instance, &[2.5; 20], None, None, None);
            for _ in 0..HARVEST_EVERY {
                s.reconcile(&[(g.gpu_index, training_sample(30, &[]))]);
            }
            clock.advance(1.0);
        }
        assert!(page.page().contention(slot) > 0, "harvest on");
        // What its shim reported holding is in the status.
        let f = &s.snapshot()["gpus"][0]["functions"][0];
        assert_eq!(f["deferred_ns"].as_u64(), Some(8_000_000), "{f}");
        assert_eq!(f["turn_waited_ns"].as_u64(), Some(2_000_000), "{f}");
        assert_eq!(f["turn_cut_ins"].as_u64(), Some(12), "{f}");
        assert_eq!(f["throttled_ns"].as_u64(), Some(12_000_000), "{f}");
        // A request that waited 3 ms: the SLO less the wait and the reserve for 2 ms of GPU time.
        let before = smore_protocol::grant::monotonic_ns();
        assert!(s.admit_request(g.instance, 3.0).admitted);
        let after = smore_protocol::grant::monotonic_ns();
        let slack_ns = ((20.0 - 3.0 - harvest::defer_reserve_ms(2.0)) * 1e6) as u64;
        let until = page.page().defer_until(slot);
        assert!(
            (before + slack_ns..=after + slack_ns).contains(&until),
            "{until} not {slack_ns} ns after admission"
        );
        // The next request's latest start is later, but the earlier one may not have started
        // yet: the page keeps the earlier.
        clock.advance(0.001);
        assert!(s.admit_request(g.instance, 0.0).admitted);
        assert_eq!(page.page().defer_until(slot), until);
        // No slack left after its wait: no deferral (the earlier latest start is cleared too).
        assert!(s.admit_request(g.instance, 15.0).admitted);
        assert_eq!(page.page().defer_until(slot), 0);
        // Deferral off: never written.
        s.cfg.defer = DeferMode::Off;
        assert!(s.admit_request(g.instance, 0.0).admitted);
        assert_eq!(page.page().defer_until(slot), 0);
        // Auto: only on a GPU NVML shows running MPS.
        s.cfg.defer = DeferMode::Auto;
        let gi = s
            .gpus
            .iter()
            .position(|x| x.info.index == g.gpu_index)
            .unwrap();
        for sharing in [None, Some(Sharing::TimeSliced)] {
            s.gpus[gi].sharing = sharing;
            assert!(s.admit_request(g.instance, 0.0).admitted);
            assert_eq!(page.page().defer_until(slot), 0, "{sharing:?}");
        }
        s.gpus[gi].sharing = Some(Sharing::Mps);
        assert!(s.admit_request(g.instance, 0.0).admitted);
        assert!(page.page().defer_until(slot) > 0);
    }

    #[test]
    fn collisions_are_attributed_by_what_both_nvml_and_the_shims_show_of_the_other_functions() {
        let mut s = harvest_state();
        s.cfg.grants_per_process = 100;
        // Functions that take turns are attributed whole (below); these do not.
        s.cfg.turns = TurnsMode::Off;
        let a = s.register(me(), args(1 << 30)).unwrap().0;
        let b = s.register(me(), args(1 << 30)).unwrap().0;
        // Training busy 30 % beside the functions.
        for _ in 0..20 {
            s.reconcile(&[(a.gpu_index, training_sample(30, &[]))]);
        }
        // Both on a's GPU (placement may have spread them).
        s.instances.get_mut(&b.instance).unwrap().rec.gpu = a.gpu_index;
        let g = s
            .gpus
            .iter()
            .position(|g| g.info.index == a.gpu_index)
            .unwrap();
        let util = s.gpus[g]
            .estimate
            .colocated()
            .expect("co-located utilization");
        let set = |s: &mut State, reported: u32, nvml: Option<f64>| {
            for id in [a.instance, b.instance] {
                let i = s.instances.get_mut(&id).unwrap();
                i.gpu_used_ppm = reported;
                i.sm_used_mean = nvml;
                i.contention_used_ppm = 10_000;
            }
            s.attribute_collisions();
            s.gpus[g].harvest.training_share()
        };
        // Both agree on 20 %: training's part is u / (u + 0.2), held to the floor below ½.
        let agreed = set(&mut s, 200_000, Some(0.2));
        let expect = (util / (util + 0.2)).max(harvest::TRAINING_SHARE_MIN);
        assert!((agreed - expect).abs() < 1e-9, "{agreed} vs {expect}");
        // A report of 90 % that NVML shows as 5 % counts as 5 %: an over-report cannot lower
        // training's part.
        let over = set(&mut s, 900_000, Some(0.05));
        assert!((over - util / (util + 0.05)).abs() < 1e-9, "{over}");
        assert!(over > agreed);
        // NVML shows nothing of them (no per-process figures): everything is training's.
        assert_eq!(set(&mut s, 900_000, None), 1.0);
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
    fn a_process_given_some_gpus_is_placed_among_them_and_its_slot_is_its_ordinal() {
        let mut s = state();
        // The test process plays several functions.
        s.cfg.grants_per_process = 100;
        let given = |gpus: Vec<u32>| RegisterArgs {
            exec: false,
            gpus: Some(gpus),
            ..args(1 << 30)
        };
        // Least-loaded placement would alternate between the two GPUs; given GPU 1 alone, every
        // instance lands there, in page slot 0 (the container's only CUDA ordinal).
        for _ in 0..3 {
            let (g, _page) = s.register(me(), given(vec![1])).unwrap();
            assert_eq!(g.gpu_index, 1);
            assert_eq!(s.instances[&g.instance].rec.slot, 0);
        }
        // Given GPUs 1 and 0 in that order: GPU 0 (less loaded) is the process's ordinal 1.
        let (g, _page) = s.register(me(), given(vec![1, 0])).unwrap();
        assert_eq!(g.gpu_index, 0);
        assert_eq!(s.instances[&g.instance].rec.slot, 1);
        // None of the GPUs it was given is managed: refused, saying what to do.
        let r = s.register(me(), given(vec![7])).unwrap_err();
        assert_eq!(r.code, RefuseCode::NoGpu);
        assert!(r.reason.contains("smore cdi generate"), "{}", r.reason);
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
        // Five live processes (one grant per process).
        let mut kids: Vec<_> = (0..5)
            .map(|_| {
                std::process::Command::new("sleep")
                    .arg("30")
                    .spawn()
                    .unwrap()
            })
            .collect();
        let peers: Vec<Peer> = kids
            .iter()
            .map(|k| Peer {
                pid: k.id(),
                uid: 0,
            })
            .collect();
        // 2 GPUs × 9.5 GiB usable: 4 × 4 GiB fit (2 per GPU), the fifth does not.
        for p in &peers[..4] {
            s.register(*p, args(4 << 30)).unwrap();
        }
        let e = s.register(peers[4], args(4 << 30)).unwrap_err();
        for k in &mut kids {
            let _ = k.kill();
            let _ = k.wait();
        }
        assert_eq!(e.code, RefuseCode::NoMemory);
        assert_eq!(s.counters.refusals, 1);
        for g in s.views() {
            assert!(g.grants.iter().map(|x| x.cap).sum::<u64>() as f64 <= 0.95 * g.total as f64);
        }
    }

    #[test]
    fn a_harvested_function_whose_nvml_use_its_shim_does_not_account_for_gets_the_watchdog() {
        let mut s = harvest_state();
        let (g, _page) = s.register(me(), args(1 << 30)).unwrap();
        s.cfg.check_shim = false;
        // Its shim reports 10 % of the GPU; NVML shows 80 % for many samples: bypassed launches.
        s.report_usage(
            g.instance,
            me().pid,
            ShimUsage {
                gpu_ns: 0,
                contention_ns: 0,
                ..Default::default()
            },
        );
        let mut acted = false;
        // The device busy all the time (20 + 80): the figures do not overlap, so all 80 % is
        // the function's own.
        let mut sample = training_sample(20, &[(me().pid, 80)]);
        sample.util = Some(100);
        for _ in 0..(SM_OVERUSE_SAMPLES * 2) {
            let a = s.reconcile(&[(g.gpu_index, sample.clone())]);
            acted |= !a.is_empty();
        }
        assert!(
            acted,
            "the watchdog acts on NVML use the shim does not report"
        );
    }

    #[test]
    fn a_harvested_function_is_not_stopped_for_time_a_time_sliced_gpu_attributes_twice() {
        // The H200 arbiter run (docs/real-gpu.md, section 8): beside a busy trainer an honest
        // function's NVML figure read 98–99 % and the trainer's too, the device ~100 %, while
        // its shim reported ~5 %. Before the overlap was taken off, 8 samples stopped it.
        let mut s = harvest_state();
        let (g, _page) = s.register(me(), args(1 << 30)).unwrap();
        s.cfg.check_shim = false;
        s.report_usage(
            g.instance,
            me().pid,
            ShimUsage {
                gpu_ns: 50_000_000,
                contention_ns: 0,
                ..Default::default()
            },
        );
        let mut sample = training_sample(99, &[(me().pid, 98)]);
        sample.util = Some(100);
        sample.sharing = Some(Sharing::TimeSliced);
        for _ in 0..(SM_OVERUSE_SAMPLES * 3) {
            let a = s.reconcile(&[(g.gpu_index, sample.clone())]);
            assert!(
                a.is_empty(),
                "acted on an honest function: {:?}",
                a.first().map(|e| &e.reason)
            );
        }
        assert_eq!(s.gpus[g.gpu_index as usize].sm_overlap, 97);
        assert_eq!(s.snapshot()["gpus"][0]["sm_overlap"], 97);
        // The same figures under MPS are each process's running time: the rule applies whole.
        let mut mps = sample.clone();
        mps.sharing = Some(Sharing::Mps);
        let mut acted = false;
        for _ in 0..(SM_OVERUSE_SAMPLES * 3) {
            acted |= !s.reconcile(&[(g.gpu_index, mps.clone())]).is_empty();
        }
        assert!(acted, "under MPS 98 % against a report of ~5 % is over-use");
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
        assert_eq!(
            s2.register(me(), again).unwrap_err().code,
            RefuseCode::Invalid
        );
        assert_eq!(s2.instances.len(), 1);
        // A dead process is not restored.
        let mut file = s2.persisted();
        file.instances[0].start += 1;
        let mut s3 = state();
        s3.restore(file);
        assert!(s3.instances.is_empty());
    }

    #[test]
    fn a_restored_instance_gets_its_page_at_an_attach_and_keeps_it_when_resumed() {
        let mut s = state();
        let (g, first) = s.register(me(), args(2 << 30)).unwrap();
        // While the grant lives, an attach is handed the page its registration got.
        let same = s.page_of(g.instance).unwrap();
        assert!(Arc::ptr_eq(&first, &same));
        let mut s2 = state();
        s2.restore(s.persisted());
        assert!(
            s2.instances[&g.instance].page.is_none(),
            "restored without one"
        );
        // A worker that only reports attaches first: this arbiter makes the page, with the
        // grant's values, and the operator's changes reach it.
        let page = s2.page_of(g.instance).unwrap();
        assert_eq!(page.page().cap(0), 2 << 30);
        assert!(
            !s2.instances[&g.instance].attached,
            "attached is the registration's"
        );
        s2.set_memory(g.instance, 1 << 30).unwrap();
        assert_eq!(page.page().cap(0), 1 << 30);
        // The registered process resumes it onto the same page, which both then read.
        let mut a = args(1 << 30);
        a.resume = Some(g.instance);
        let (_, resumed) = s2.register(me(), a).unwrap();
        assert!(Arc::ptr_eq(&page, &resumed));
        assert!(s2.page_of(u64::MAX).is_none(), "no such instance");
    }

    #[test]
    fn a_worker_that_left_the_parent_chain_may_attach_reports_but_not_resume() {
        let mut s = state();
        let (g, _) = s.register(me(), args(1 << 30)).unwrap();
        // Not a descendant of the registered process (its parent chain reaches init first), but
        // the attribution gives it to the function on its GPU.
        let stray = Peer {
            pid: 1,
            uid: me().uid,
        };
        assert!(!s.may_attach(stray, g.instance));
        s.instances.get_mut(&g.instance).unwrap().gpu_pids = vec![1];
        assert!(
            s.may_attach(stray, g.instance),
            "its reports are the function's"
        );
        assert!(!s.may_bind(stray, g.instance), "the registration is not");
        s.instances.get_mut(&g.instance).unwrap().attached = false;
        assert!(s.try_resume(stray, g.instance).is_none());
        // Another user's process is refused whatever the attribution says.
        let other = Peer { pid: 1, uid: 4242 };
        assert!(!s.may_attach(other, g.instance));
    }

    #[test]
    fn harvests_calibration_and_throttles_survive_a_restart() {
        let mut s = harvest_state();
        let (g, _) = s.register(me(), args(1 << 30)).unwrap();
        // Beside a training job (pid 1 in the samples: a process that lives through the test).
        s.reconcile(&[(g.gpu_index, training_sample(60, &[]))]);
        // The budget cut to its floor, the function throttled to 24 %.
        for _ in 0..10 {
            s.gpus[0].harvest.observe(1.0);
        }
        assert_eq!(s.gpus[0].harvest.calibration(), harvest::CALIBRATION_MIN);
        s.instances
            .get_mut(&g.instance)
            .unwrap()
            .throttle
            .cut(0.0, 300_000);
        // Through the file's own format, as the daemon writes and reads it.
        let text = serde_json::to_string(&s.persisted()).unwrap();
        let mut s2 = harvest_state();
        s2.restore(serde_json::from_str(&text).unwrap());
        assert_eq!(s2.gpus[0].harvest.calibration(), harvest::CALIBRATION_MIN);
        assert_eq!(
            s2.instances[&g.instance].throttle.ceiling_pct(),
            Some(24),
            "{text}"
        );
        // Its page, once it re-registers, carries the ceiling.
        let mut a = args(1 << 30);
        a.resume = Some(g.instance);
        let (_, page) = s2.register(me(), a).unwrap();
        assert_eq!(page.page().share(0), 24);
        assert!(
            s2.events
                .recent()
                .iter()
                .any(|e| e.message.contains("stays cut to 24 %")),
            "an event says so"
        );
        // A throttle of an instance that did not survive is not applied to another; a file of an
        // arbiter before this (no `harvest`) restores whole budgets; nonsense is bounded.
        let mut file: serde_json::Value = serde_json::from_str(&text).unwrap();
        file["harvest"][0]["throttles"][0]["instance"] = serde_json::json!(g.instance + 7);
        file["harvest"][0]["calibration"] = serde_json::json!(-3.0);
        let mut s3 = harvest_state();
        s3.restore(serde_json::from_value(file.clone()).unwrap());
        assert_eq!(s3.instances[&g.instance].throttle.ceiling_pct(), None);
        assert_eq!(s3.gpus[0].harvest.calibration(), harvest::CALIBRATION_MIN);
        // A throttle saved under another GPU than the instance's is not applied; a calibration
        // learnt beside a training job none of whose processes lives (a reboot, another job) is
        // not taken up.
        let mut other: serde_json::Value = serde_json::from_str(&text).unwrap();
        let moved = other["harvest"][0]["throttles"].take();
        other["harvest"][0]["throttles"] = serde_json::json!([]);
        other["harvest"][1]["throttles"] = moved;
        other["harvest"][0]["trainers"][0]["start"] = serde_json::json!(u64::MAX);
        let mut s5 = harvest_state();
        s5.restore(serde_json::from_value(other).unwrap());
        assert_eq!(s5.instances[&g.instance].throttle.ceiling_pct(), None);
        assert_eq!(s5.gpus[0].harvest.calibration(), 1.0);
        file.as_object_mut().unwrap().remove("harvest");
        let mut s4 = harvest_state();
        s4.restore(serde_json::from_value(file).unwrap());
        assert_eq!(s4.gpus[0].harvest.calibration(), 1.0);
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
        assert!(s.gpus[0].budget.boost() > 1.0);
        // Training slowed by 50 % (60 → 40 %): the budget shrinks back.
        for _ in 0..6 * OBSERVE_EVERY {
            s.reconcile(&[(0, sample(40, grown))]);
        }
        assert_eq!(s.gpus[0].budget.boost(), 1.0);
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
mod injected_facts_tests {
    //! The state over a fake process table and clock: no real process, no sleeping.
    use super::facts::fake::{FakeClock, FakeProcs};
    use super::*;
    use crate::policy::FitPolicy;

    fn state(procs: &FakeProcs, clock: &FakeClock) -> State {
        let gpus = vec![GpuInfo {
            index: 0,
            uuid: "GPU-0".into(),
            name: "sim".into(),
            total: 10 << 30,
        }];
        let cfg = Config {
            prewarm_policy: "off".into(),
            ..Config::default()
        };
        State::with_facts(
            cfg,
            gpus,
            Box::new(FitPolicy),
            Box::new(clock.clone()),
            Box::new(procs.clone()),
        )
    }

    fn register(s: &mut State, pid: u32) -> InstanceId {
        let args = RegisterArgs {
            function: format!("f{pid}"),
            memory: Some(1 << 30),
            exec: true,
            ..Default::default()
        };
        s.register(Peer { pid, uid: 0 }, args).unwrap().0.instance
    }

    #[test]
    fn descendants_left_behind_by_an_exited_function_stay_watched() {
        let (procs, clock) = (FakeProcs::default(), FakeClock::default());
        procs.spawn(100, 1, 10, true); // the function
        procs.spawn(101, 100, 11, true); // a worker on the GPU
        let mut s = state(&procs, &clock);
        let lineage = std::sync::Arc::new(crate::lineage::Lineage::without_connector("test"));
        s.set_lineage(lineage.clone());
        let id = register(&mut s, 100);
        // A daemonized child the fork events recorded, not on the GPU yet.
        lineage.on_fork(100, 102, || Some(12));
        procs.spawn(102, 1, 12, true);
        let mut gpu = GpuSample::default();
        gpu.procs.insert(101, 1 << 20);
        assert!(s.reconcile(&[(0, gpu.clone())]).is_empty());
        // The function exits; its worker and its daemon live on, re-parented.
        procs.exit(100);
        procs.reparent(101, 1, None);
        let mut acts = s.reconcile(&[(0, gpu.clone())]);
        assert!(s.instances.is_empty(), "released: its process exited");
        gpu.procs.insert(102, 2 << 30);
        acts.extend(s.reconcile(&[(0, gpu)]));
        let mut pids: Vec<u32> = acts.iter().map(|a| a.pid).collect();
        pids.sort_unstable();
        assert_eq!(pids, vec![101, 102], "{acts:?}");
        assert!(acts
            .iter()
            .all(|a| a.instance == id && matches!(a.violation, Violation::AfterRelease { .. })));
        assert!(s.gpus[0].training.is_empty(), "never taken for training");
    }

    #[test]
    fn a_function_and_its_descendants_are_never_operators() {
        let (procs, clock) = (FakeProcs::default(), FakeClock::default());
        procs.spawn(100, 1, 10, true); // a function, as root
        procs.spawn(101, 100, 11, true); // its child
        procs.spawn(300, 1, 30, true); // the admin's shell
        let mut s = state(&procs, &clock);
        register(&mut s, 100);
        for pid in [100, 101] {
            let e = s.operator(Peer { pid, uid: 0 }).unwrap_err();
            assert!(e.contains("never an operator") && e.contains("f100"), "{e}");
        }
        assert!(s.operator(Peer { pid: 300, uid: 0 }).is_ok());
        let e = s
            .operator(Peer {
                pid: 300,
                uid: 4242,
            })
            .unwrap_err();
        assert!(e.contains("uid 4242 is not an operator"), "{e}");
        assert!(s.operator(Peer { pid: 0, uid: 0 }).is_err(), "cannot tell");
    }

    #[test]
    fn use_of_a_gpu_not_granted_is_a_violation_and_counted_by_its_admission() {
        let (procs, clock) = (FakeProcs::default(), FakeClock::default());
        procs.spawn(100, 1, 10, true);
        let gpu = |index, total| GpuInfo {
            index,
            uuid: format!("GPU-{index}"),
            name: "sim".into(),
            total,
        };
        let cfg = Config {
            prewarm_policy: "off".into(),
            kill_after_s: 2.0,
            ..Config::default()
        };
        let mut s = State::with_facts(
            cfg,
            vec![gpu(0, 16 << 30), gpu(1, 8 << 30)],
            Box::new(FitPolicy),
            Box::new(clock.clone()),
            Box::new(procs.clone()),
        );
        let id = register(&mut s, 100);
        assert_eq!(s.instances[&id].rec.gpu, 0);
        let free1 = |s: &State| s.views()[1].free_for_functions(s.cfg.memory_safety);
        let before = free1(&s);
        // Its process puts 3 GiB and 80 % SM on GPU 1.
        let mut on1 = GpuSample::default();
        on1.procs.insert(100, 3 << 30);
        on1.proc_util.insert(100, 80);
        let samples = [(0, GpuSample::default()), (1, on1)];
        let acts = s.reconcile(&samples);
        assert_eq!(acts.len(), 1, "{acts:?}");
        assert_eq!(
            acts[0].violation,
            Violation::UngrantedGpu {
                used: 3 << 30,
                sm: 80,
                granted: 0
            }
        );
        assert_eq!(acts[0].action, WatchdogAction::Sigterm);
        assert!(
            acts[0].reason.contains("granted GPU 0 only"),
            "{}",
            acts[0].reason
        );
        // Counted by GPU 1's admission, never as training.
        assert_eq!(before - free1(&s), 3 << 30);
        assert!(s.gpus[1].training.is_empty());
        // Escalated while it lasts, though its granted GPU stays clean.
        clock.advance(1.0);
        assert!(s.reconcile(&samples).is_empty());
        clock.advance(1.0);
        let acts = s.reconcile(&samples);
        assert_eq!(acts[0].action, WatchdogAction::Sigkill);
        // Gone: the memory is free again and the escalation starts over.
        s.reconcile(&[(0, GpuSample::default()), (1, GpuSample::default())]);
        assert_eq!(free1(&s), before);
        assert!(!s.instances[&id].ungranted_escalation.acted());
    }

    #[test]
    fn an_mps_server_is_no_trainer_and_a_page_says_mps_only_for_clients_beside_client_trainers() {
        let (procs, clock) = (FakeProcs::default(), FakeClock::default());
        procs.spawn(100, 1, 10, true);
        procs.spawn(300, 1, 12, false);
        procs.mark_mps_server(300);
        let mut s = state(&procs, &clock);
        let id = register(&mut s, 100);
        let slot = s.instances[&id].rec.slot as usize;
        let page = s.instances[&id].page.clone().unwrap();
        // NVML lists the server and, while no client runs, no MPS client: read alone, that
        // says time-sliced (docs/real-gpu.md, section 11). The server is no trainer, its memory
        // is held beside training's, and the mode stays what it was (not known yet).
        let mut sample = GpuSample {
            sharing: Some(Sharing::TimeSliced),
            ..Default::default()
        };
        sample.procs.insert(300, 69 << 20);
        sample.proc_util.insert(300, 40);
        s.reconcile(&[(0, sample.clone())]);
        assert!(s.gpus[0].training.is_empty(), "the server is not a trainer");
        assert_eq!(s.gpus[0].training_used, 69 << 20);
        assert_eq!(s.gpus[0].sharing, None);
        assert_eq!(page.page().sharing(slot), None);
        // A trainer and the function, both MPS clients: MPS on the page.
        procs.spawn(200, 1, 13, false);
        sample.procs.insert(200, 2 << 30);
        sample.procs.insert(100, 1 << 30);
        sample.sharing = Some(Sharing::Mps);
        sample.mps_clients = vec![100, 200];
        s.reconcile(&[(0, sample.clone())]);
        assert_eq!(s.gpus[0].training.len(), 1);
        assert_eq!(s.gpus[0].training[0].pid, 200);
        assert_eq!(s.gpus[0].training_used, (2 << 30) + (69 << 20));
        assert_eq!(s.gpus[0].sharing, Some(Sharing::Mps));
        assert_eq!(page.page().sharing(slot), Some(Sharing::Mps));
        // The function's process is no client of that server (a daemon of its own, say): it
        // takes turns with the trainer, and its page says so, whatever the GPU reads.
        sample.mps_clients = vec![200, 4242];
        s.reconcile(&[(0, sample.clone())]);
        assert_eq!(s.gpus[0].sharing, Some(Sharing::Mps));
        assert_eq!(page.page().sharing(slot), Some(Sharing::TimeSliced));
        // Nor when the trainer is no client.
        sample.mps_clients = vec![100, 4242];
        s.reconcile(&[(0, sample.clone())]);
        assert_eq!(page.page().sharing(slot), Some(Sharing::TimeSliced));
        sample.mps_clients = vec![100, 200];
        s.reconcile(&[(0, sample.clone())]);
        assert_eq!(page.page().sharing(slot), Some(Sharing::Mps));
        // A second server (a function's own daemon, not root's: training to the arbiter) whose
        // clients NVML lists too: they take turns with the first server's, so no page says MPS.
        procs.spawn(400, 1, 14, false);
        sample.procs.insert(400, 60 << 20);
        s.reconcile(&[(0, sample.clone())]);
        assert_eq!(s.gpus[0].sharing, Some(Sharing::Mps));
        assert_eq!(page.page().sharing(slot), Some(Sharing::TimeSliced));
        sample.procs.remove(&400);
        s.reconcile(&[(0, sample.clone())]);
        assert_eq!(page.page().sharing(slot), Some(Sharing::Mps));
        // A round without a sample of the GPU (NVML failed): no longer known, time-sliced.
        s.reconcile(&[]);
        assert_eq!(page.page().sharing(slot), Some(Sharing::TimeSliced));
        s.reconcile(&[(0, sample.clone())]);
        assert_eq!(page.page().sharing(slot), Some(Sharing::Mps));
        // Only the server left beside a trainer that is no client: NVML's time-sliced reading
        // stands (the last mode is kept only while servers are alone on the GPU).
        sample.procs.remove(&100);
        sample.mps_clients.clear();
        sample.sharing = Some(Sharing::TimeSliced);
        s.reconcile(&[(0, sample)]);
        assert_eq!(s.gpus[0].sharing, Some(Sharing::TimeSliced));
    }

    #[test]
    fn a_pages_mode_is_mps_only_where_one_known_server_runs_every_process() {
        let (mps, ts) = (Some(Sharing::Mps), Some(Sharing::TimeSliced));
        assert_eq!(page_sharing(mps, true, &[2, 3]), mps);
        assert_eq!(
            page_sharing(mps, true, &[]),
            ts,
            "no process yet: its waits count"
        );
        assert_eq!(page_sharing(mps, false, &[2, 3]), ts);
        assert_eq!(page_sharing(ts, true, &[2]), ts);
        assert_eq!(page_sharing(None, true, &[2]), None);
        let sample = |procs: &[u32], clients: Vec<u32>| {
            let mut s = GpuSample {
                mps_clients: clients,
                ..Default::default()
            };
            for &p in procs {
                s.procs.insert(p, 1 << 20);
            }
            s
        };
        let one = [(9, 1 << 20)];
        assert!(serves_all(&one, &sample(&[1, 2, 9], vec![1, 2])));
        assert!(
            !serves_all(&one, &sample(&[1, 2, 9], vec![1])),
            "2 is no client"
        );
        assert!(
            !serves_all(&[], &sample(&[1, 2], vec![1, 2])),
            "no known server"
        );
        assert!(
            !serves_all(&[(9, 0), (8, 0)], &sample(&[1, 8, 9], vec![1])),
            "two servers"
        );
    }

    #[test]
    fn a_worker_is_its_functions_a_recycled_pid_is_released_and_a_stranger_is_training() {
        let (procs, clock) = (FakeProcs::default(), FakeClock::default());
        procs.spawn(100, 1, 10, true);
        procs.spawn(101, 100, 11, true);
        procs.spawn(200, 1, 12, false);
        let mut s = state(&procs, &clock);
        let id = register(&mut s, 100);
        let mut sample = GpuSample::default();
        sample.procs.insert(101, 300 << 20);
        sample.procs.insert(200, 2 << 30);
        assert!(s.reconcile(&[(0, sample.clone())]).is_empty());
        assert_eq!(s.instances[&id].nvml_used, 300 << 20);
        assert_eq!(s.instances[&id].shim_loaded, Some(true));
        assert_eq!(s.gpus[0].training_used, 2 << 30);
        // The function's process exits and its pid is reused by another process: released.
        procs.spawn(100, 1, 99, true);
        let acts = s.reconcile(&[(0, sample)]);
        assert!(s.instances.is_empty());
        let released = s
            .events
            .recent()
            .iter()
            .rev()
            .find(|e| e.kind != EventKind::Watchdog)
            .unwrap();
        assert_eq!(released.kind, EventKind::Released);
        // Its worker, left on the GPU, stays watched (never training).
        assert_eq!(acts.len(), 1);
        assert_eq!(acts[0].violation, Violation::AfterRelease { pid: 101 });
        assert_eq!(s.gpus[0].training.len(), 1, "only the stranger");
    }

    #[test]
    fn a_pulsed_over_user_gets_a_lower_page_share_then_its_grant_back() {
        let (procs, clock) = (FakeProcs::default(), FakeClock::default());
        procs.spawn(100, 1, 10, true);
        procs.spawn(200, 1, 12, false);
        let mut s = state(&procs, &clock);
        let args = RegisterArgs {
            function: "poison".into(),
            memory: Some(1 << 30),
            exec: true,
            ..Default::default()
        };
        let (g, page) = s.register(Peer { pid: 100, uid: 0 }, args).unwrap();
        s.set_share(g.instance, Some(20)).unwrap();
        let slot = s.instances[&g.instance].rec.slot as usize;
        assert_eq!(page.page().share(slot), 20);
        let sample = |util: u32| {
            let mut x = GpuSample::default();
            x.procs.insert(200, 2 << 30);
            x.proc_util.insert(200, 100 - util);
            x.procs.insert(100, 64 << 20);
            x.proc_util.insert(100, util);
            x
        };
        // Cost poisoning, pulsed: 4 × its page share for 1.5 s, nothing for 0.5 s, sampled every
        // 250 ms — no 8 samples in a row over share + 15, yet 3 × the share on average.
        let mut lowest = 20;
        for i in 0..48 {
            let t = i as f64 * 0.25;
            let paged = page.page().share(slot);
            let util = if t % 2.0 < 1.5 {
                (paged * 4).min(100)
            } else {
                0
            };
            let acts = s.reconcile(&[(0, sample(util))]);
            assert!(
                acts.is_empty(),
                "no kill while the correction holds it: {acts:?}"
            );
            lowest = lowest.min(page.page().share(slot));
            clock.advance(0.25);
        }
        assert!(lowest <= 7, "the page share paid the excess back: {lowest}");
        assert!(
            s.events
                .recent()
                .iter()
                .any(|e| e.kind == EventKind::Watchdog && e.message.contains("lowered")),
            "the correction is an event"
        );
        assert_eq!(
            s.instances[&g.instance].rec.share, 20,
            "the grant is unchanged"
        );
        // Honest from now on (it uses what its page allows): the grant comes back.
        for _ in 0..80 {
            let paged = page.page().share(slot);
            assert!(s.reconcile(&[(0, sample(paged))]).is_empty());
            clock.advance(0.25);
        }
        assert_eq!(page.page().share(slot), 20);
        // A pulsed bypass the page share cannot hold (70 % whatever it says, 1.5 s of every 2 s:
        // no streak) is a violation once the corrections failed.
        let mut acts = Vec::new();
        for i in 0..80 {
            let util = if (i as f64 * 0.25) % 2.0 < 1.5 { 70 } else { 0 };
            acts.extend(s.reconcile(&[(0, sample(util))]));
            clock.advance(0.25);
        }
        assert!(
            acts.iter()
                .any(|a| matches!(a.violation, Violation::ShareOverrun { share: 20, .. })),
            "{acts:?}"
        );
    }

    #[test]
    fn a_process_holds_one_grant_and_a_recycled_pid_is_not_its_holder() {
        let (procs, clock) = (FakeProcs::default(), FakeClock::default());
        procs.spawn(100, 1, 10, true);
        let mut s = state(&procs, &clock);
        let id = register(&mut s, 100);
        let again = RegisterArgs {
            function: "second".into(),
            memory: Some(1 << 30),
            exec: true,
            ..Default::default()
        };
        let e = s
            .register(Peer { pid: 100, uid: 0 }, again.clone())
            .unwrap_err();
        assert_eq!(e.code, RefuseCode::Invalid);
        assert!(
            e.reason.contains("one grant per process") && e.reason.contains(&id.to_string()),
            "{}",
            e.reason
        );
        assert_eq!(s.instances.len(), 1, "nothing registered");
        // Released, the process may register again.
        s.release(id, "test");
        assert!(s.register(Peer { pid: 100, uid: 0 }, again.clone()).is_ok());
        // The pid recycled by a new process (another start time) is not the holder.
        procs.spawn(100, 1, 99, true);
        assert!(s.register(Peer { pid: 100, uid: 0 }, again).is_ok());
    }

    #[test]
    fn a_worker_without_the_shim_is_caught_by_name() {
        let (procs, clock) = (FakeProcs::default(), FakeClock::default());
        procs.spawn(100, 1, 10, true);
        procs.spawn(101, 100, 11, false);
        let mut s = state(&procs, &clock);
        let id = register(&mut s, 100);
        let mut sample = GpuSample::default();
        sample.procs.insert(101, 1 << 20);
        let acts = s.reconcile(&[(0, sample)]);
        assert_eq!(acts.len(), 1);
        assert_eq!(acts[0].pid, 101);
        assert_eq!(acts[0].violation, Violation::NoShim { pid: 101 });
        assert_eq!(s.instances[&id].shim_loaded, Some(false));
    }

    #[test]
    fn events_carry_the_injected_clock() {
        let (procs, clock) = (FakeProcs::default(), FakeClock::default());
        procs.spawn(100, 1, 10, true);
        clock.advance(1000.0);
        let mut s = state(&procs, &clock);
        clock.advance(5.0);
        register(&mut s, 100);
        let ev = s.events.recent().back().unwrap();
        assert_eq!((ev.kind, ev.time), (EventKind::Admitted, 1005.0));
        assert_eq!(s.snapshot()["arbiter"]["now"], 1005.0);
    }

    #[test]
    fn a_function_that_releases_its_grant_and_keeps_the_gpu_is_still_watched() {
        let (procs, clock) = (FakeProcs::default(), FakeClock::default());
        procs.spawn(100, 1, 10, true);
        procs.spawn(101, 100, 11, true);
        let mut s = state(&procs, &clock);
        let id = register(&mut s, 100);
        let mut sample = GpuSample::default();
        sample.procs.insert(101, 1 << 30);
        assert!(s.reconcile(&[(0, sample.clone())]).is_empty());
        s.release_by_client(id);
        assert!(s.instances.is_empty(), "the grant is given back");
        let acts = s.reconcile(&[(0, sample.clone())]);
        assert_eq!(acts.len(), 1, "not taken for training");
        assert_eq!(acts[0].violation, Violation::AfterRelease { pid: 101 });
        assert!(s.gpus[0].training.is_empty());
        assert!(
            s.reconcile(&[(0, sample.clone())]).is_empty(),
            "acted on once"
        );
        // Once the process exits it is forgotten; its pid recycled by a trainer is training.
        procs.exit(100);
        procs.exit(101);
        s.reconcile(&[(0, GpuSample::default())]);
        procs.spawn(101, 1, 50, false);
        assert!(s.reconcile(&[(0, sample)]).is_empty());
        assert_eq!(s.gpus[0].training.len(), 1);
    }

    #[test]
    fn unbounded_names_are_refused_before_anything_is_kept() {
        let (procs, clock) = (FakeProcs::default(), FakeClock::default());
        procs.spawn(100, 1, 10, true);
        let mut s = state(&procs, &clock);
        let long = "x".repeat(64 << 10);
        for args in [
            RegisterArgs {
                function: long.clone(),
                ..Default::default()
            },
            RegisterArgs {
                function: "f".into(),
                model: Some(long.clone()),
                ..Default::default()
            },
        ] {
            let e = s.register(Peer { pid: 100, uid: 0 }, args).unwrap_err();
            assert_eq!(e.code, RefuseCode::Invalid);
            assert!(e.reason.len() < 200, "the refusal does not echo the name");
        }
        assert!(s.instances.is_empty());
        let snap = serde_json::to_vec(&s.snapshot()).unwrap();
        assert!(snap.len() < 16 << 10);
    }

    #[test]
    fn a_prewarm_policy_that_fails_to_start_is_reported() {
        let (procs, clock) = (FakeProcs::default(), FakeClock::default());
        let cfg = Config {
            prewarm_policy: "no-such-policy".into(),
            ..Config::default()
        };
        let s = State::with_facts(
            cfg,
            vec![],
            Box::new(FitPolicy),
            Box::new(clock),
            Box::new(procs),
        );
        assert!(s.prewarm_error().is_some());
        let snap = s.snapshot();
        assert!(snap["prewarm"]["error"]
            .as_str()
            .unwrap()
            .contains("no-such-policy"));
        assert_eq!(snap["events"][0]["kind"], "arbiter");
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
        assert_eq!(s.hints[0].action, HintAction::Keep);
        assert_eq!(s.warm_memory(), 1 << 30);
        let snap = s.snapshot();
        assert_eq!(snap["prewarm"]["hints"][0]["action"], "keep");
    }
}

#[cfg(test)]
mod reclaim_tests {
    //! Headroom, reclaim and preemption over a fake process table and clock.
    use super::facts::fake::{FakeClock, FakeProcs};
    use super::*;
    use crate::policy::FitPolicy;
    use smore_protocol::wire::PreemptReason;

    const GIB: u64 = 1 << 30;
    const TRAINER: u32 = 200;

    fn state(procs: &FakeProcs, clock: &FakeClock) -> State {
        let gpus = vec![GpuInfo {
            index: 0,
            uuid: "GPU-0".into(),
            name: "sim".into(),
            total: 10 * GIB,
        }];
        let cfg = Config {
            prewarm_policy: "off".into(),
            check_shim: false,
            ..Config::default()
        };
        State::with_facts(
            cfg,
            gpus,
            Box::new(FitPolicy),
            Box::new(clock.clone()),
            Box::new(procs.clone()),
        )
    }

    fn register(s: &mut State, pid: u32, mem: u64) -> Result<InstanceId, Refusal> {
        let args = RegisterArgs {
            function: format!("f{pid}"),
            memory: Some(mem),
            exec: true,
            ..Default::default()
        };
        s.register(Peer { pid, uid: 0 }, args).map(|g| g.0.instance)
    }

    /// The trainer holding `train` bytes and each function (pid, bytes).
    fn sample(train: u64, fns: &[(u32, u64)]) -> GpuSample {
        let mut s = GpuSample::default();
        s.procs.insert(TRAINER, train);
        for &(pid, b) in fns {
            s.procs.insert(pid, b);
        }
        s.used = s.procs.values().sum();
        s
    }

    fn node() -> (FakeProcs, FakeClock, State) {
        let (procs, clock) = (FakeProcs::default(), FakeClock::default());
        *clock.0.lock().unwrap() = 1000.0;
        procs.spawn(TRAINER, 1, 5, false);
        for pid in [100, 101, 102, 103] {
            procs.spawn(pid, 1, pid as u64, true);
        }
        let s = state(&procs, &clock);
        (procs, clock, s)
    }

    #[test]
    fn admission_counts_the_training_peak_plus_headroom() {
        let (_procs, _clock, mut s) = node();
        s.reconcile(&[(0, sample(4 * GIB, &[]))]);
        // The trainer drops to 2 GiB (an evaluation pass ended): its peak stays 4 GiB.
        s.reconcile(&[(0, sample(2 * GIB, &[]))]);
        assert_eq!(s.gpus[0].memory.peak(), 4 * GIB);
        // σ·10 GiB = 9.5; reserved 4 + max(2 GiB, 0.4 GiB) = 6 ⇒ 3.5 GiB for functions.
        assert_eq!(
            s.views()[0].free_for_functions(0.95),
            (9.5 * GIB as f64) as u64 - 6 * GIB
        );
        assert!(register(&mut s, 100, 3 * GIB).is_ok());
        let e = register(&mut s, 101, GIB).unwrap_err();
        assert_eq!(e.code, RefuseCode::NoMemory, "{e}");
        assert_eq!(s.counters.growth_events, 1, "the trainer's appearance");
        let snap = s.snapshot();
        assert_eq!(snap["gpus"][0]["training_peak"], 4 * GIB);
        assert_eq!(snap["gpus"][0]["training_reserved"], 6 * GIB);
        assert_eq!(snap["gpus"][0]["training_headroom"], 2 * GIB);
    }

    /// Three functions beside a 2 GiB trainer: 100 holds 1 of 3 GiB, 101 (idle) 1 of 1 GiB,
    /// 102 1.5 of 1.5 GiB (σ budget 9.5 − reserved 4 = 5.5 GiB, all taken).
    fn loaded() -> (FakeProcs, FakeClock, State, [InstanceId; 3]) {
        let (procs, clock, mut s) = node();
        s.reconcile(&[(0, sample(2 * GIB, &[]))]);
        let a = register(&mut s, 100, 3 * GIB).unwrap();
        let b = register(&mut s, 101, GIB).unwrap();
        let c = register(&mut s, 102, 3 * GIB / 2).unwrap();
        clock.advance(11.0);
        s.report(a, &[5.0], None, None, None);
        s.report(c, &[5.0], None, None, None);
        let fns = [(100, GIB), (101, GIB), (102, 3 * GIB / 2)];
        s.reconcile(&[(0, sample(2 * GIB, &fns))]);
        assert_eq!(s.counters.reclaims, 0, "under the line: nothing taken");
        (procs, clock, s, [a, b, c])
    }

    #[test]
    fn growth_lowers_caps_then_unloads_idle_instances_then_preempts_in_order() {
        let (procs, clock, mut s, [a, b, c]) = loaded();
        let fns = [(100, GIB), (101, GIB), (102, 3 * GIB / 2)];
        // Training grows to 5 GiB: 5 + 5.5 > 9.7 (the line). Reserved 7 ⇒ need 3 GiB: 2 from
        // 100's unused cap, then the idle 101 (1 GiB). 102 keeps running.
        s.reconcile(&[(0, sample(5 * GIB, &fns))]);
        assert_eq!(s.counters.reclaims, 1);
        assert_eq!(s.counters.caps_lowered, 1);
        assert_eq!(s.counters.bytes_lowered, 2 * GIB);
        assert_eq!((s.counters.unloaded, s.counters.preempted), (1, 0));
        let page = |id| s.instances[&id].page.clone().unwrap();
        assert_eq!(
            page(a).page().cap(0),
            GIB,
            "lowered to what it holds, on the page"
        );
        assert_eq!(page(b).page().cap(0), 0, "preempted: no new allocation");
        assert_eq!(page(c).page().cap(0), 3 * GIB / 2, "untouched");
        assert_eq!(
            s.instances[&b].rec.preempt.as_ref().unwrap().reason,
            PreemptReason::Unload
        );
        // Its requests are refused with the reason.
        let adm = s.admit_request(b, 0.0);
        assert!(
            !adm.admitted && adm.reason.contains("unloaded"),
            "{}",
            adm.reason
        );
        assert_eq!(s.counters.preempted_requests, 1);
        let (_, msg, grace) = s.preemption(b).unwrap();
        assert!(msg.contains("GPU 0") && grace == 2000, "{msg} {grace}");
        // Readmission is held while training may still grow.
        assert!(s.views()[0].admission_hold_s.is_some());
        // The same sample again: 101's memory is leaving, nothing more is taken.
        s.reconcile(&[(0, sample(5 * GIB, &fns))]);
        assert_eq!(
            s.counters.reclaims, 1,
            "no double reclaim for memory already leaving"
        );
        // Training grows again (6.5 + 2.5 + 1 leaving > 9.7): running 102 is preempted (100
        // holds all its cap; 102's is the larger).
        s.reconcile(&[(0, sample(13 * GIB / 2, &fns))]);
        assert_eq!(s.counters.preempted, 1);
        assert_eq!(
            s.instances[&c].rec.preempt.as_ref().unwrap().reason,
            PreemptReason::TrainingMemory
        );
        // After the grace period a preempted process still alive is killed, once.
        clock.advance(2.5);
        let acts = s.reconcile(&[(0, sample(13 * GIB / 2, &fns))]);
        let killed: Vec<u32> = acts.iter().map(|a| a.pid).collect();
        assert!(killed.contains(&101) && killed.contains(&102), "{acts:?}");
        assert!(acts.iter().all(|a| a.action == WatchdogAction::Sigkill));
        assert_eq!(s.counters.preempt_kills, 2);
        assert!(s.reconcile(&[(0, sample(13 * GIB / 2, &fns))]).is_empty());
        // They exit (and 100 too): released; training stable for the hold: admission opens.
        for pid in [100, 101, 102] {
            procs.exit(pid);
        }
        s.reconcile(&[(0, sample(13 * GIB / 2, &[]))]);
        assert!(s.instances.is_empty());
        // Room again (9.5 − 8.5 reserved), but admission is held after the reclaim.
        let e = register(&mut s, 103, GIB / 4).unwrap_err();
        assert!(e.reason.contains("admission held"), "{e}");
        assert_eq!(s.counters.held_refusals, 1);
        clock.advance(31.0);
        s.reconcile(&[(0, sample(13 * GIB / 2, &[]))]);
        assert!(register(&mut s, 103, GIB / 4).is_ok());
    }

    #[test]
    fn a_restart_in_the_middle_of_a_reclaim_counts_nothing_twice() {
        let (procs, clock, mut s, [_a, b, _c]) = loaded();
        let fns = [(100, GIB), (101, GIB), (102, 3 * GIB / 2)];
        s.reconcile(&[(0, sample(5 * GIB, &fns))]);
        assert!(s.instances[&b].rec.preempt.is_some());
        let granted = |s: &State| s.views()[0].grants.iter().map(|g| g.cap).sum::<u64>();
        let before = granted(&s);
        let file: PersistFile =
            serde_json::from_str(&serde_json::to_string(&s.persisted()).unwrap()).unwrap();
        let mut s2 = state(&procs, &clock);
        s2.restore(file);
        assert_eq!(granted(&s2), before, "the same caps, counted once");
        assert_eq!(
            s2.gpus[0].memory.peak(),
            5 * GIB,
            "the high-water mark survives"
        );
        assert!(s2.preemption(b).is_some(), "still preempted, same deadline");
        assert!(s2.views()[0].admission_hold_s.is_some(), "still held");
        // The first sample after the restart: no growth event, no second reclaim.
        s2.reconcile(&[(0, sample(5 * GIB, &fns))]);
        assert_eq!((s2.counters.reclaims, s2.counters.growth_events), (0, 0));
        // The deadline is the one the first arbiter set.
        clock.advance(2.5);
        let acts = s2.reconcile(&[(0, sample(5 * GIB, &fns))]);
        assert_eq!(acts.iter().map(|a| a.pid).collect::<Vec<_>>(), vec![101]);
    }

    #[test]
    fn a_second_training_process_is_a_growth_event_that_reclaims() {
        let (procs, _clock, mut s, _) = loaded();
        procs.spawn(201, 1, 6, false);
        let mut smp = sample(2 * GIB, &[(100, GIB), (101, GIB), (102, 3 * GIB / 2)]);
        smp.procs.insert(201, 3 * GIB);
        s.reconcile(&[(0, smp)]);
        assert_eq!(s.counters.growth_events, 2);
        assert_eq!(s.counters.reclaims, 1);
        assert_eq!(s.gpus[0].memory.peak(), 5 * GIB);
    }
}
