//! One function instance: its durable [`Record`] plus what the arbiter learns while it runs.
//!
//! Owns: writing the instance's grant into its page ([`Instance::write_page`]) and its latency
//! window. Must never: write a device slot other than its own with anything but "no memory".

use super::facts::{ProcFacts, Tracked};
use super::persist::Record;
use super::watchdog::{ShareDebt, SmOveruse};
use crate::grantpage::PageHandle;
use crate::harvest::{self, RequestPacer, UsageLedger};
use serde::Serialize;
use smore_protocol::grant::{Sharing, TimingNoise, MAX_DEVICES};
use std::collections::VecDeque;
use std::sync::Arc;

/// Latency samples kept per instance for percentiles.
pub const MAX_LATENCIES: usize = 1024;

/// One function instance.
#[derive(Serialize)]
pub struct Instance {
    /// What survives a restart (flattened into the status JSON).
    #[serde(flatten)]
    pub rec: Record,
    /// False after an arbiter restart until the process re-registers (its memory stays counted).
    pub attached: bool,
    /// The grant page: None for an instance restored after a restart until a process of it
    /// attaches or resumes it (`State::page_of`).
    #[serde(skip)]
    pub page: Option<Arc<PageHandle>>,
    /// Predicted training slowdown at admission (fraction).
    pub predicted_train: Option<f64>,
    /// Predicted function degradation at admission (fraction).
    pub predicted_fn: Option<f64>,
    /// The rule that admitted it.
    pub rule: String,
    /// When it registered (or was restored), seconds since the epoch.
    pub registered_at: f64,
    /// When it last asked for admission or reported a request, seconds since the epoch (idle
    /// instances are unloaded first when training needs memory).
    pub last_active: f64,
    /// NVML memory of the instance's processes (authority), bytes.
    pub nvml_used: u64,
    /// Memory the shim reports (hint), bytes.
    pub used_hint: Option<u64>,
    /// Time the shim held its launches back, ns (as reported).
    pub throttled_ns: u64,
    /// Allocations the shim refused (as reported).
    pub refusals: u64,
    /// Requests reported.
    pub requests: u64,
    /// Requests the policy deferred.
    pub deferred: u64,
    /// SM utilization NVML attributes to the instance's processes, percent.
    pub sm_used: Option<u32>,
    /// [`Instance::sm_used`] smoothed (EWMA, weight `training::SOLO_UTIL_ALPHA` as training's own
    /// utilization), fraction; what the attribution of collisions counts of this function's GPU
    /// time beside its own report (`harvest::training_share`).
    pub sm_used_mean: Option<f64>,
    /// Whether every process of the instance has the shim mapped (None: not checked yet).
    pub shim_loaded: Option<bool>,
    /// Harvest: its part of the GPU's collision budget, ppm of wall time (0: harvest off).
    pub contention_ppm: u32,
    /// Harvest: its processes that paid collision time over the last few seconds
    /// ([`harvest::UseRate::paying_processes`]). Each process's shim enforces the page's budget
    /// with a bucket of its own, so the page carries `contention_ppm` divided by them: forked
    /// workers share the instance's part rather than each taking all of it (docs/arbiter.md,
    /// threat model).
    pub contention_processes: u32,
    /// Its processes whose shims reported GPU time over the last few seconds
    /// ([`harvest::UseRate::gpu_processes`]).
    pub gpu_processes: u32,
    /// The raw-share gates its processes gate by, as last counted ([`Instance::refresh_gates`]).
    #[serde(skip)]
    gates: u32,
    /// Harvest: what one context switch costs on its GPU, ns, as written to its page (0: free,
    /// harvest off, or an MPS GPU).
    pub switch_ns: u64,
    /// Harvest: the node's timing-noise allowance, as written to its page (`[gpus]
    /// wait_noise_us`, `stretch_noise_us` on a time-sliced GPU; none under MPS or while the GPU's
    /// mode is not known).
    pub timing_noise: TimingNoise,
    /// How its GPU's processes share it, as written to its page (`None`: not known yet): MPS only
    /// when its own GPU processes and the trainers are MPS clients of a GPU that reads MPS
    /// (`page_sharing`). Its shims judge waits by it (docs/harvest.md, "Waits under MPS"); the
    /// status says the GPU's mode.
    #[serde(skip)]
    pub sharing: Option<Sharing>,
    /// Harvest: collision time it used over the last 3 s (`harvest::USE_WINDOW_S`), ppm of wall
    /// time.
    pub contention_used_ppm: u32,
    /// Harvest: collision time its shims' samples measured over the last 3 s (what the GPU's
    /// estimate counts), ppm of wall time.
    pub contention_measured_ppm: u32,
    /// Harvest: GPU time it used over the last 3 s (its shims' estimate), ppm of wall time.
    pub gpu_used_ppm: u32,

    /// Harvest: share of its requests that missed the SLO over the last 3 s.
    pub miss_rate: Option<f64>,
    /// Harvest: collision time per served request over the last 3 s, ns.
    pub collision_per_request_ns: Option<f64>,
    /// Harvest: GPU time per served request over the last 3 s (its shims' solo-cost estimate), ns.
    pub gpu_per_request_ns: Option<f64>,
    /// Harvest: the share of its measured collisions attributed to the training job
    /// (`harvest::training_share`; 1 until there is evidence otherwise).
    pub training_share: f64,
    /// Harvest: requests refused at admission because its shim would have held them past the SLO.
    pub paced_refusals: u64,
    /// Harvest: time its shims held launches to wait out the training job's busy phase
    /// (deferral), ns, cumulative as reported.
    pub deferred_ns: u64,
    /// Harvest: time its shims' launches waited for their turn on the GPU (docs/harvest.md,
    /// "Serializing the functions"), ns, cumulative as reported.
    pub turn_waited_ns: u64,
    /// Harvest: how many of its shims' launches cut in beside another function's turn on an
    /// MPS GPU (docs/harvest.md, "Cut-ins under MPS"), cumulative as reported.
    pub turn_cut_ins: u64,
    /// Harvest: its seat on its GPU's turn board (None: no turns for it), written into its page.
    pub turn_seat: Option<usize>,
    /// Harvest: the ceiling on its raw share while its GPU's collision budget, at its floor,
    /// cannot hold the trainer within θ (percent; null: none; docs/harvest.md, "When the budget
    /// cannot hold θ").
    #[serde(rename = "throttle_pct")]
    pub throttle: harvest::Throttle,
    /// Harvest: its shims' reports.
    #[serde(skip)]
    pub usage: UsageLedger,
    /// Harvest: what its reports added to its GPU's slowdown estimate, over the estimate's
    /// window (the raw-share throttle judges who owns the excess on it).
    #[serde(skip)]
    pub meter: harvest::ContentionMeter,
    /// Harvest: the mirror of its shim's contention bucket that request admission consults.
    #[serde(skip)]
    pub pacer: RequestPacer,
    /// Recent request latencies, ms.
    #[serde(skip)]
    pub latencies: VecDeque<f64>,
    /// How far the watchdog went against its current violation (configured action, then
    /// SIGKILL while it lasts; docs/arbiter.md, "Watchdog").
    #[serde(skip)]
    pub escalation: super::watchdog::Escalation,
    /// How far the watchdog went against its use of GPUs it was not granted (its own
    /// escalation: the checks on its granted GPU clear theirs every clean round).
    #[serde(skip)]
    pub ungranted_escalation: super::watchdog::Escalation,
    /// The SM over-use streak.
    #[serde(skip)]
    pub over_share: SmOveruse,
    /// The over-use debt: its windowed NVML SM use against its share, and how far the share
    /// written to its page is lowered to pay an excess back (docs/arbiter.md, "Watchdog").
    #[serde(skip)]
    pub share_debt: ShareDebt,
    /// Its registered process, tracked across pid reuse (None: not trackable yet).
    #[serde(skip)]
    pub life: Option<Tracked>,
    /// Its processes on its GPU in the last NVML sample (the registered one and descendants).
    pub gpu_pids: Vec<u32>,
}

impl Instance {
    /// An instance from its record; `page` None = detached (restored after a restart, waiting
    /// for the process to re-register). Runtime counters start at zero.
    pub fn new(rec: Record, page: Option<Arc<PageHandle>>, rule: String, now: f64) -> Instance {
        let restored = page.is_none();
        Instance {
            rec,
            attached: page.is_some(),
            page,
            predicted_train: None,
            predicted_fn: None,
            rule,
            registered_at: now,
            last_active: now,
            nvml_used: 0,
            used_hint: None,
            throttled_ns: 0,
            refusals: 0,
            requests: 0,
            deferred: 0,
            sm_used: None,
            sm_used_mean: None,
            shim_loaded: None,
            contention_ppm: 0,
            contention_processes: 1,
            gpu_processes: 0,
            gates: 1,
            switch_ns: 0,
            timing_noise: TimingNoise::NONE,
            sharing: None,
            contention_used_ppm: 0,
            contention_measured_ppm: 0,
            gpu_used_ppm: 0,
            miss_rate: None,
            collision_per_request_ns: None,
            gpu_per_request_ns: None,
            training_share: 1.0,
            paced_refusals: 0,
            deferred_ns: 0,
            turn_waited_ns: 0,
            turn_cut_ins: 0,
            turn_seat: None,
            throttle: harvest::Throttle::default(),
            // A restored instance's processes report counters that span the restart: their first
            // report is a baseline (docs/arbiter.md, threat model).
            usage: if restored {
                UsageLedger::restored_at(now)
            } else {
                UsageLedger::starting_at(now)
            },
            pacer: RequestPacer::default(),
            meter: harvest::ContentionMeter::default(),
            latencies: VecDeque::new(),
            escalation: Default::default(),
            ungranted_escalation: Default::default(),
            over_share: SmOveruse::default(),
            share_debt: ShareDebt::default(),
            life: None,
            gpu_pids: Vec::new(),
        }
    }

    /// Its own GPU time, fraction of wall time: the smaller of what its shim reports and what
    /// NVML shows (0 where NVML shows nothing), so that neither an over-report nor a process NVML
    /// does not list can lower what is attributed to training (docs/arbiter.md, threat model).
    pub fn own_gpu(&self) -> f64 {
        (self.gpu_used_ppm as f64 / 1e6).min(self.sm_used_mean.unwrap_or(0.0))
    }

    /// Starts tracking the registered process (a pidfd where the platform has one).
    pub fn track(&mut self, facts: &dyn ProcFacts) {
        self.life = Some(Tracked::new(self.rec.pid, self.rec.start, facts));
    }

    /// Whether the registered process still lives (pid-reuse safe).
    pub fn alive(&self, facts: &dyn ProcFacts) -> bool {
        match &self.life {
            Some(l) => l.alive(facts),
            None => facts.is_same_process(self.rec.pid, self.rec.start),
        }
    }

    /// Adds reported latencies (finite, non-negative ones), keeping the last [`MAX_LATENCIES`].
    pub fn add_latencies(&mut self, latencies: &[f64]) {
        for &l in latencies.iter().filter(|l| l.is_finite() && **l >= 0.0) {
            if self.latencies.len() >= MAX_LATENCIES {
                self.latencies.pop_front();
            }
            self.latencies.push_back(l);
            self.requests += 1;
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

    /// Device memory it holds as far as the arbiter knows: NVML's figure or the shim's report,
    /// whichever is larger, bytes.
    pub fn held(&self) -> u64 {
        self.nvml_used.max(self.used_hint.unwrap_or(0))
    }

    /// The cap its page carries: the grant's, or 0 once preempted (no new allocation; what it
    /// holds stays counted in `rec.cap` until its processes exit).
    pub fn page_cap(&self) -> u64 {
        if self.rec.preempt.is_some() {
            0
        } else {
            self.rec.cap
        }
    }

    /// The raw share of all its processes together, percent: the grant's, lowered while it pays
    /// back an over-use debt or while its GPU's collision budget cannot hold θ without it
    /// ([`harvest::Throttle`]).
    pub fn raw_total(&self) -> u32 {
        self.share_debt
            .page_share(self.rec.share)
            .min(self.throttle.ceiling())
    }

    /// The share its page carries: [`Instance::raw_total`] divided among its processes' gates
    /// ([`harvest::per_gate`]).
    pub fn page_share(&self) -> u32 {
        harvest::per_gate(self.raw_total(), self.raw_gates())
    }

    /// How many raw-share gates its processes gate by — the processes NVML lists on its GPU and
    /// those that reported GPU time over the last 3 s, by pid: one for all whose last report says
    /// they share the grant's gate, one for each other (a process not heard from yet counts as
    /// a gate of its own, so dividing errs on the side of less); at least 1
    /// ([`harvest::UsageLedger::raw_gates`]).
    pub fn raw_gates(&self) -> u32 {
        self.gates
    }

    /// Counts its gates again ([`Instance::raw_gates`]): after a report, after its use window
    /// moved on, after NVML's list of its processes changed — the only inputs. Counted once
    /// there, not at every read of the page's share (a function flooding reports must not make
    /// its neighbours' reads cost its window).
    pub fn refresh_gates(&mut self) {
        self.gates = self.usage.raw_gates(&self.gpu_pids);
    }

    /// What its pages allow its processes together, percent, for a raw share of `total` % over
    /// its gates and the processes NVML lists for it ([`harvest::raw_allowed`]): what the
    /// watchdog's streak holds it to.
    pub fn raw_allowed(&self, total: u32) -> u32 {
        harvest::raw_allowed(total, self.raw_gates(), self.gpu_pids.len() as u32)
    }

    /// What its pages allow its gates, percent, whichever of its processes NVML lists now: what
    /// its mean use over seconds is judged against (a process that just left still counts
    /// there, as its use does in the mean).
    pub fn raw_allowed_gates(&self, total: u32) -> u32 {
        let gates = self.raw_gates();
        harvest::raw_allowed(total, gates, gates)
    }

    /// Deferral (docs/harvest.md, "Deferral"): at the admission of a request that already waited
    /// `waited_ms`, writes into its slot until when the request can still start and meet its SLO
    /// — what the SLO leaves after the wait and [`harvest::defer_reserve_ms`] — so its shim may
    /// hold launches while the training job is busy. 0 (no deferral) when `on` is false, before
    /// the function's GPU time per request is known, or without slack. A latest start still
    /// ahead (a request of this instance that may not have started yet) is only ever lowered.
    pub fn write_defer_until(&self, on: bool, waited_ms: f64) {
        let Some(p) = &self.page else {
            return;
        };
        let page = p.page();
        let slot = self.rec.slot as usize;
        let now = smore_protocol::grant::monotonic_ns();
        let slack_ms = match (on, self.gpu_per_request_ns) {
            (true, Some(gpu_ns)) if self.contention_ppm > 0 && self.rec.slo_ms > 0.0 => {
                self.rec.slo_ms - waited_ms.max(0.0) - harvest::defer_reserve_ms(gpu_ns / 1e6)
            }
            _ => 0.0,
        };
        let until = if slack_ms > 0.0 {
            now.saturating_add((slack_ms * 1e6) as u64)
        } else {
            0
        };
        let current = page.defer_until(slot);
        let until = if current > now && until > 0 {
            until.min(current)
        } else {
            until
        };
        page.set_defer_until(slot, until);
    }

    /// Writes the deadline of the request just admitted (its SLO less what it already waited,
    /// from now) as the function's place in line for the GPU's turn when `on` (its functions take
    /// turns), else 0 (docs/harvest.md, "Serializing the functions").
    pub fn write_turn_key(&self, on: bool, waited_ms: f64) {
        let Some(p) = &self.page else {
            return;
        };
        let key = if on && self.rec.slo_ms > 0.0 {
            let left_ms = (self.rec.slo_ms - waited_ms.max(0.0)).max(0.0);
            smore_protocol::grant::monotonic_ns().saturating_add((left_ms * 1e6) as u64)
        } else {
            0
        };
        p.page().set_turn_key(self.rec.slot as usize, key);
    }

    /// The collision budget each of its processes' shims enforces, ppm: its part divided among
    /// the processes that pay from it (0 stays 0: harvest off; a part stays at least 1 ppm).
    pub fn page_contention(&self) -> u32 {
        match self.contention_ppm {
            0 => 0,
            ppm => (ppm / self.contention_processes.max(1)).max(1),
        }
    }

    /// Writes the GPU's mode as its page is to carry it ([`Instance::sharing`]) into its slot.
    pub fn write_sharing(&self) {
        if let Some(p) = &self.page {
            p.page().set_sharing(self.rec.slot as usize, self.sharing);
        }
    }

    /// Whether its page carries another raw share than [`Instance::page_share`] says now: what
    /// the share is divided by (its gates, from its reports and NVML's processes) changes between
    /// page writes.
    pub fn page_share_stale(&self) -> bool {
        self.page
            .as_ref()
            .is_some_and(|p| p.page().share(self.rec.slot as usize) != self.page_share())
    }

    /// Writes the grant (cap and share) into its slot; other slots get no memory.
    pub fn write_page(&self) {
        if let Some(p) = &self.page {
            let page = p.page();
            for d in 0..MAX_DEVICES {
                if d as u32 == self.rec.slot {
                    // The budget first: a raw share of 100 with no budget yet would be a moment
                    // of no gating at all.
                    let ppm = self.page_contention();
                    if page.contention(d) != ppm {
                        page.set_contention(d, ppm);
                    }
                    page.set_switch(d, self.switch_ns);
                    page.set_timing_noise(d, self.timing_noise);
                    page.set_sharing(d, self.sharing);
                    page.set(d, self.page_cap(), self.page_share());
                } else if page.cap(d) != 0 {
                    // Devices the instance was not admitted to: no memory at all.
                    page.set(d, 0, 100);
                }
            }
        }
    }
}
