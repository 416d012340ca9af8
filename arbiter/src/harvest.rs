//! Harvest: how much GPU time a GPU's functions may take from its training job, and how much they
//! did take.
//!
//! **Why this shape** (docs/arbiter.md, "Harvest"). A function's GPU time costs the training job
//! nothing while the trainer is idle (its host work, data loading, synchronization); what slows
//! training is function GPU time that *collides* with training work. Each function's shim measures
//! that collision time itself, per sampled launch — `min(d0, d − d0)` for a kernel whose solo cost is
//! d0 and whose measured duration was d (docs/shim.md) — and reports the cumulative figure. If the
//! functions on a GPU together collide for a fraction `c` of wall time, the trainer, which keeps its
//! work per iteration, is delayed by `c` per unit of wall time: its slowdown is `s = c / (1 − c)`.
//! Holding `s ≤ θ` is therefore holding `c ≤ θ / (1 + θ)`, a budget of *collision* time, which the
//! arbiter splits among the functions and the shims enforce (a GCRA bucket charged `cost × p`, p the
//! current collision probability). A function whose work all falls in the trainer's idle gaps runs at
//! full speed; one beside a trainer that never idles gets `θ / (1 + θ)` of the GPU, as before.
//!
//! Owns: [`ContentionMeter`] (the measured collision fraction and the slowdown estimate over a
//! sliding window), [`UsageLedger`] (one function's reports turned into use and deadline
//! misses over a short sliding window), [`RequestPacer`] (request admission that predicts
//! the shim's hold and refuses what it would make late), [`meets_trainer`] (how likely a
//! request is to meet the trainer, by its phase at the request's arrival), [`defer_reserve_ms`] (how late a
//! request may start and still meet its SLO, for deferral), [`split`] (dividing the budget among functions by demand and urgency), and
//! [`Harvest`] (the GPU's budget with an additive-increase / multiplicative-decrease calibration
//! against the estimate, so a biased estimate or a burst allowance cannot hold the mean above θ).
//!
//! Must never: read a clock or the system (time is a parameter), give a GPU's functions more
//! collision budget in total than `θ / (1 + θ)` of wall time, or starve a function entirely (each
//! gets a floor, so its shim keeps measuring and its demand stays visible).

use serde::Serialize;
use smore_protocol::phase::Phase;
use std::collections::{BTreeMap, VecDeque};

/// Sliding window of the slowdown estimate: 10 s. Source: the harvest issue asks for the estimate
/// over 10 s windows; it is also long against the trainer's phases (tens of ms) and short against
/// the minutes a function instance lives.
pub const WINDOW_S: f64 = 10.0;
/// Shortest span the estimate is given for: 1 s (less is noise from one burst).
pub const MIN_SPAN_S: f64 = 1.0;
/// Parts per million: the unit of a collision budget on the grant page.
pub const PPM: u32 = 1_000_000;
/// Smallest budget a function on a GPU with a trainer gets, as a fraction of the GPU's budget
/// divided equally: 25 %. Reasoning: enough to serve a request now and then, and to keep the shim's
/// collision estimate fresh, so that its demand can be seen and its budget grown.
pub const FLOOR_OF_EQUAL: f64 = 0.25;
/// A function that used this fraction of its budget over the last interval is constrained (it
/// would use more): 80 %.
pub const CONSTRAINED_AT: f64 = 0.8;
/// Headroom over measured use given to an unconstrained function: 50 %, so a growing load is seen
/// as constrained within one interval rather than throttled for many.
pub const HEADROOM: f64 = 1.5;
/// What a constrained function asks for: twice what it holds. Reasoning: it
/// would use more, but how much more is unknown; doubling per interval finds any demand within a
/// few seconds, while a claim without bound let an urgent function that could use little take
/// budget from busy ones (measured in the demo's `busy` scenario: mobilenet, using 0.8 % of wall
/// time with some misses, was given 3.6 % while resnet50 and bert, using 3 % each, fell to 1.9 %).
pub const GROWTH: f64 = 2.0;

/// Deferral: what a request's SLO must keep back for running after a hold, as a multiple of its
/// GPU time: 2. Reasoning: a request held to its latest start may still meet the training job's
/// busy phase, and on a time-sliced GPU its kernels then alternate with the trainer's slices,
/// which about doubles its GPU time's span (docs/harvest.md, "Deferral").
pub const DEFER_RESERVE_GPU: f64 = 2.0;
/// Deferral: the fixed part of the reserve, ms: 1 ms. Reasoning: a request that starts in a busy
/// phase of a time-sliced GPU waits up to the trainer's slice before its first kernel (2 ms on
/// the simulated GPU), which twice a request's GPU time covers from ~1 ms of GPU time up; the
/// rest is the request's host work and launch calls, the admission round trip and the probe's
/// measurement. Requests with less slack than a hold are not held at all (the shim's rule).
pub const DEFER_RESERVE_MS: f64 = 1.0;

/// Deferral: the part of an SLO a request of `gpu_ms` GPU time keeps back for running after a
/// hold (its latest start is the SLO less what it waited and this), ms.
pub fn defer_reserve_ms(gpu_ms: f64) -> f64 {
    DEFER_RESERVE_GPU * gpu_ms.max(0.0) + DEFER_RESERVE_MS
}

/// Collision time of a GPU's functions, and the slowdown it implies over [`WINDOW_S`].
#[derive(Debug, Default, Clone)]
pub struct ContentionMeter {
    /// Collision ns accumulated across every instance ever on this GPU.
    total_ns: u64,
    /// (time s, total_ns) at each tick, oldest first, spanning at most [`WINDOW_S`].
    ring: VecDeque<(f64, u64)>,
}

impl ContentionMeter {
    /// Adds collision time some function reported.
    pub fn add(&mut self, ns: u64) {
        self.total_ns = self.total_ns.saturating_add(ns);
    }

    /// Closes an observation at time `t` (seconds, any monotonic origin).
    pub fn tick(&mut self, t: f64) {
        self.ring.push_back((t, self.total_ns));
        while self.ring.len() > 2 && self.ring.front().is_some_and(|&(t0, _)| t - t0 > WINDOW_S) {
            self.ring.pop_front();
        }
    }

    /// Empties the window (the training job left: there is nothing to slow down).
    pub fn reset(&mut self) {
        self.ring.clear();
    }

    /// Fraction of wall time the functions collided with training over the window, 0..=1, once the
    /// window spans at least [`MIN_SPAN_S`].
    pub fn fraction(&self) -> Option<f64> {
        let (&(t0, c0), &(t1, c1)) = (self.ring.front()?, self.ring.back()?);
        let span = t1 - t0;
        (span >= MIN_SPAN_S).then(|| ((c1 - c0) as f64 / 1e9 / span).clamp(0.0, 1.0))
    }

    /// The training job's slowdown the collisions imply, `c / (1 − c)` (capped at 10, i.e. 1000 %).
    pub fn slowdown(&self) -> Option<f64> {
        self.fraction().map(slowdown_of_fraction)
    }

    /// The window's first and last ticks (seconds), once it has two.
    pub fn span(&self) -> Option<(f64, f64)> {
        let (&(t0, _), &(t1, _)) = (self.ring.front()?, self.ring.back()?);
        (t1 > t0).then_some((t0, t1))
    }

    /// Collision ns added from tick `t0` to the last tick: what another meter's window
    /// ([`ContentionMeter::span`]) holds of this one's. Everything up to the last tick when this
    /// meter has no tick at or before `t0` (it began after it).
    pub fn added_since(&self, t0: f64) -> u64 {
        let Some(&(_, last)) = self.ring.back() else {
            return 0;
        };
        let base = self
            .ring
            .iter()
            .rev()
            .find(|&&(t, _)| t <= t0)
            .map_or(0, |&(_, c)| c);
        last.saturating_sub(base)
    }
}

/// What a function process's shim reported: cumulative estimated GPU and collision time on its
/// granted device, ns.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ShimUsage {
    /// Estimated GPU time, ns.
    pub gpu_ns: u64,
    /// Estimated collision time with other contexts, ns: what the shim's bucket paid.
    pub contention_ns: u64,
    /// Collision time as the shim's samples measured it, ns (`None`: a shim that does not
    /// report it; its `contention_ns` stands in).
    pub measured_contention_ns: Option<u64>,
    /// Time launches were held by deferral, ns.
    pub deferred_ns: u64,
    /// Time launches waited for their turn on the GPU, ns.
    pub turn_waited_ns: u64,
    /// Launches that cut in beside another function's turn under MPS.
    pub turn_cut_ins: u64,
    /// Time launches were held for the share's gate, the contention bucket or the backlog
    /// bound, ns (the report's `throttled_ns`).
    pub held_ns: u64,
    /// The process charges the collision bucket its grant's processes share (the report's
    /// `contention_shared`), not one of its own.
    pub shared: bool,
    /// The process gates its launches by the raw-share gate its grant's processes share (the
    /// report's `raw_shared`), not one of its own.
    pub raw_shared: bool,
}

/// How far back a function's use and deadline misses are averaged for the split: 3 s.
/// Reasoning: a shim reports about once a second, and only when its counters changed
/// (shim/src/client.rs, `Reporter`), while the split runs every second too; a one-interval figure
/// therefore read 0 in one second and twice the use in the next (measured in the demo's `default`
/// scenario: each function's use swung 0 ↔ 40–85 k ppm from second to second, so a busy function
/// was held to the floor every other second and its requests waited 18 ms for a 1.6 ms service).
/// Three report periods always hold a report of an active function; a load change is still seen
/// within 3 s.
pub const USE_WINDOW_S: f64 = 3.0;

/// How far a process's reported collision time may run ahead of wall time, ns: 2 s. Reasoning:
/// a shim's collision counters grow at most as fast as wall time (a launch collides for at most
/// its own run time), and may run ahead of it by the collision bucket's horizon
/// (`CONTENTION_HORIZON_NS`, 1 s: a charge made at a launch's admission, before the launch ran)
/// and a report's lateness, which the second second covers. What a report adds beyond that is
/// bounded, not trusted: one report of `u64::MAX` ns had stuck the GPU's collision meter at its
/// saturation, so that the estimate read 0 % for the GPU's life (found by review, 2026-11-28).
pub const REPORT_SLACK_NS: u64 = 2_000_000_000;
/// How fast a process's reported GPU time may grow, × wall time: 4. Reasoning: kernels of one
/// process on several streams run at once on a real GPU (and under MPS), so an honest estimate
/// of GPU time can pass wall time; a bound there only keeps a report from being unbounded.
pub const GPU_TIME_RATE: f64 = 4.0;
/// Processes per instance whose last report a ledger keeps: 64. Reasoning: a function's workers
/// are a few processes; past this the one that reported longest ago is forgotten (should it report
/// again, its counters count from its first report after that, within its new allowance and the
/// instance's), so a function forking short-lived children that each report once cannot grow the
/// arbiter's memory.
pub const MAX_REPORTING_PIDS: usize = 64;
/// Reports a ledger keeps for its use window: 1 024. Reasoning: 64 processes reporting about
/// once a second fill 3 s with under 200; past this the oldest is dropped for the newest, so a
/// function flooding the arbiter with reports cannot grow its memory (what it used then reads
/// low, which only lowers its own claim in the split).
const MAX_WINDOW_REPORTS: usize = 1_024;

/// How much time a report may still add: refilled at a rate of wall time up to a cap, taken by
/// what reports add (a token bucket, ns).
#[derive(Debug, Default, Clone, Copy)]
struct Allowance {
    ns: f64,
    at: f64,
}

impl Allowance {
    /// An allowance at `t` of `ns`.
    fn at(t: f64, ns: f64) -> Allowance {
        Allowance { ns, at: t }
    }

    /// Takes up to `want` ns at `t`: refilled first by `rate` × the wall time since the last
    /// take, up to `cap` (an allowance above the cap, a new process's, is not cut to it).
    fn take(&mut self, t: f64, want: u64, rate: f64, cap: f64) -> u64 {
        let refill = (t - self.at).max(0.0) * 1e9 * rate;
        self.ns = (self.ns + refill).min(cap.max(self.ns));
        self.at = self.at.max(t);
        let got = (want as f64).min(self.ns).max(0.0);
        self.ns -= got;
        got as u64
    }
}

/// One process's place in a [`UsageLedger`].
#[derive(Debug, Default, Clone, Copy)]
struct PidReport {
    /// When its last report arrived, s.
    at: f64,
    /// Its last cumulative counters, as reported.
    raw: ShimUsage,
    /// What its GPU, collision (paid) and measured collision time may still add.
    allow: [Allowance; 3],
}

/// What one function instance used and how its requests fared over [`USE_WINDOW_S`].
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct UseRate {
    /// Estimated GPU time, ppm of wall time.
    pub gpu_ppm: u32,
    /// Estimated collision time, ppm of wall time.
    pub contention_ppm: u32,
    /// Share of the window's reported requests that missed the SLO (None without requests).
    pub miss_rate: Option<f64>,
    /// Collision buckets paid from over the window: one per process that reported collision time
    /// with a bucket of its own, and one for all those sharing the grant's bucket. Each bucket
    /// enforces the page's budget, so the page carries the instance's part divided by them.
    pub paying_processes: u32,
    /// Processes whose reports added GPU time over the window.
    pub gpu_processes: u32,
    /// Collision time its shims' samples measured over the window (what the GPU's estimate
    /// counts; a shim that does not report it has its paid figure stand in), ppm of wall time.
    pub measured_ppm: u32,
    /// Collision time per reported request over the window, ns (None without requests).
    pub collision_per_request_ns: Option<f64>,
    /// GPU time per reported request over the window (its shims' calibrated solo cost), ns
    /// (None without requests).
    pub gpu_per_request_ns: Option<f64>,
}

/// One function instance's usage: the last cumulative report of each of its processes (workers
/// report separately, each with its own counters), and what accrued over the last
/// [`USE_WINDOW_S`], stamped with the time each report arrived.
///
/// Reports are the function's word. What a report may add to the figures the budget and the
/// estimate read is bounded by wall time: a process's collision time (paid and measured) grows
/// at most at wall time's rate, [`REPORT_SLACK_NS`] ahead of it, its GPU time at
/// [`GPU_TIME_RATE`] × wall time, and the instance's collision time across its processes at wall
/// time's rate too; a new process's first report may cover the time since its instance began
/// (its counters are cumulative since it started). The display counters (held, deferred, turn
/// waits and cut-ins: summed over a process's threads, so they may pass wall time) are not
/// bounded; they move nothing but the function's own status.
#[derive(Debug, Default, Clone)]
pub struct UsageLedger {
    last: BTreeMap<u32, PidReport>,
    /// When the instance began, s (`None`: at its first report).
    origin: Option<f64>,
    /// Restored after an arbiter restart: a process's first report is its baseline, not what it
    /// added (its counters hold its whole life before the restart).
    restored: bool,
    /// A report that counts arrived (not only baselines): the figures read what was used.
    counted: bool,
    /// The processes NVML lists for the instance ([`UsageLedger::keep_listed`]): the last to be
    /// forgotten when the ledger is full.
    listed: Vec<u32>,
    /// What the instance's collision time (paid, measured) across its processes may still add.
    contention_allow: [Allowance; 2],
    /// (arrival s, reporting pid, what the report added), oldest first.
    added: VecDeque<(f64, u32, ShimUsage)>,
    /// (arrival s, requests reported, of which missed the SLO), oldest first.
    requests: VecDeque<(f64, u64, u64)>,
    /// When the first report or latency of the instance arrived, s.
    first: Option<f64>,
}

impl UsageLedger {
    /// The ledger of an instance that began at `t` (s).
    pub fn starting_at(t: f64) -> UsageLedger {
        UsageLedger {
            origin: Some(t),
            ..UsageLedger::default()
        }
    }

    /// The ledger of an instance restored after an arbiter restart at `t` (s): each process's
    /// first report after it sets a baseline.
    pub fn restored_at(t: f64) -> UsageLedger {
        UsageLedger {
            restored: true,
            ..UsageLedger::starting_at(t)
        }
    }

    /// Records process `pid`'s cumulative counters, arrived at `t` (s); returns what they added.
    /// A counter that went backwards (a new process image under a recycled pid) counts from zero
    /// again. The measured collision time is taken at most the collision time paid (a shim's
    /// samples never measure more than its bucket paid, `paid + max(0, due − paid) ≥ due`; a
    /// report claiming more is bounded, as one claiming less is by its own use), and a report
    /// without it leaves the last one standing (the next that carries it counts from there).
    /// Time counters are bounded by wall time (the type's docs).
    pub fn record(&mut self, pid: u32, mut now: ShimUsage, t: f64) -> ShimUsage {
        now.measured_contention_ns = now.measured_contention_ns.map(|m| m.min(now.contention_ns));
        let origin = *self.origin.get_or_insert(t);
        let slack = REPORT_SLACK_NS as f64;
        let age = (t - origin).max(0.0) * 1e9;
        if self.last.is_empty() && self.contention_allow[0].at == 0.0 {
            self.contention_allow = [Allowance::at(origin, slack); 2];
        }
        let seen = self.last.get(&pid).copied();
        if seen.is_none() {
            self.make_room();
        }
        let baseline = seen.is_none() && self.restored;
        let PidReport {
            raw: prev,
            mut allow,
            ..
        } = seen.unwrap_or(PidReport {
            // A new process: its counters since it started, within the instance's age.
            allow: [
                Allowance::at(t, age * GPU_TIME_RATE + slack),
                Allowance::at(t, age + slack),
                Allowance::at(t, age + slack),
            ],
            ..PidReport::default()
        });
        let mut kept = now;
        if kept.measured_contention_ns.is_none() {
            kept.measured_contention_ns = prev.measured_contention_ns;
        }
        let delta = |cur: u64, old: u64| if cur >= old { cur - old } else { cur };
        let mut d = ShimUsage {
            gpu_ns: delta(now.gpu_ns, prev.gpu_ns),
            contention_ns: delta(now.contention_ns, prev.contention_ns),
            measured_contention_ns: now
                .measured_contention_ns
                .map(|m| delta(m, prev.measured_contention_ns.unwrap_or(0))),
            deferred_ns: delta(now.deferred_ns, prev.deferred_ns),
            turn_waited_ns: delta(now.turn_waited_ns, prev.turn_waited_ns),
            turn_cut_ins: delta(now.turn_cut_ins, prev.turn_cut_ins),
            held_ns: delta(now.held_ns, prev.held_ns),
            shared: now.shared,
            raw_shared: now.raw_shared,
        };
        if baseline {
            d = ShimUsage {
                measured_contention_ns: d.measured_contention_ns.map(|_| 0),
                ..ShimUsage::default()
            };
        }
        // The figures the budget and the estimate read, within what wall time allows: the
        // process's, then (collisions) the instance's.
        d.gpu_ns = allow[0].take(t, d.gpu_ns, GPU_TIME_RATE, GPU_TIME_RATE * slack);
        let paid = allow[1].take(t, d.contention_ns, 1.0, slack);
        d.contention_ns = self.contention_allow[0].take(t, paid, 1.0, slack);
        d.measured_contention_ns = d.measured_contention_ns.map(|m| {
            let m = allow[2].take(t, m, 1.0, slack);
            self.contention_allow[1].take(t, m, 1.0, slack)
        });
        self.last.insert(
            pid,
            PidReport {
                at: t,
                raw: kept,
                allow,
            },
        );
        self.first.get_or_insert(t);
        if self.added.len() >= MAX_WINDOW_REPORTS {
            self.added.pop_front();
        }
        self.added.push_back((t, pid, d));
        self.forget(t);
        self.counted |= !baseline;
        d
    }

    /// Notes the processes NVML lists for the instance now: when the ledger is full the process
    /// that reported longest ago among the others is forgotten first, so a function that starts
    /// a reporting process per request does not push its live idle workers out (which would then
    /// count as gates of their own until their next report).
    pub fn keep_listed(&mut self, pids: &[u32]) {
        self.listed.clear();
        self.listed.extend_from_slice(pids);
    }

    /// Forgets the process that reported longest ago once [`MAX_REPORTING_PIDS`] are kept —
    /// among those NVML does not list for the instance first ([`UsageLedger::keep_listed`]).
    fn make_room(&mut self) {
        while self.last.len() >= MAX_REPORTING_PIDS {
            let oldest = |listed: bool| {
                self.last
                    .iter()
                    .filter(|(pid, _)| self.listed.contains(pid) == listed)
                    .min_by(|a, b| a.1.at.total_cmp(&b.1.at))
                    .map(|(&pid, _)| pid)
            };
            let Some(pid) = oldest(false).or_else(|| oldest(true)) else {
                return;
            };
            self.last.remove(&pid);
        }
    }

    /// Whether a process of the function has reported usage that counts: after an arbiter
    /// restart a process's first report is only its baseline, and the figures read nothing used
    /// until its next one (the watchdog's grace for a function that never reports holds until
    /// then).
    pub fn has_reports(&self) -> bool {
        self.counted
    }

    /// How many raw-share gates the processes `listed` (NVML's processes of the function on its
    /// GPU) and those whose reports added GPU time over the window (as of the last report or
    /// [`UsageLedger::rate`], which drop what left it) gate by: one for all
    /// whose last report says they share the grant's gate (`raw_shared`), one for each other —
    /// a process that never reported, or whose report the ledger no longer keeps, counts as a
    /// gate of its own (the side of less for the rest); at least 1. By pid, whatever a process
    /// last reported using: a process that holds a context but idles reported once when its
    /// shim started, and is known by that report.
    pub fn raw_gates(&self, listed: &[u32]) -> u32 {
        let active = self
            .added
            .iter()
            .filter(|(_, _, d)| d.gpu_ns > 0)
            .map(|&(_, pid, _)| pid);
        let mut gates: Vec<u32> = listed
            .iter()
            .copied()
            .chain(active)
            .map(|pid| match self.last.get(&pid) {
                Some(r) if r.raw.raw_shared => 0,
                _ => pid.max(1),
            })
            .collect();
        gates.sort_unstable();
        gates.dedup();
        (gates.len() as u32).max(1)
    }

    /// Counts reported request latencies (ms) against the SLO, arrived at `t` (s).
    pub fn record_latencies(&mut self, latencies_ms: &[f64], slo_ms: Option<f64>, t: f64) {
        let valid = latencies_ms.iter().filter(|l| l.is_finite() && **l >= 0.0);
        let (n, missed) = valid.fold((0, 0), |(n, m), &l| {
            (n + 1, m + u64::from(slo_ms.is_some_and(|slo| l > slo)))
        });
        if n > 0 {
            self.first.get_or_insert(t);
            self.requests.push_back((t, n, missed));
            self.forget(t);
        }
    }

    /// Drops what is older than the window at `t`.
    fn forget(&mut self, t: f64) {
        while self
            .added
            .front()
            .is_some_and(|&(a, _, _)| t - a > USE_WINDOW_S)
        {
            self.added.pop_front();
        }
        while self
            .requests
            .front()
            .is_some_and(|&(a, _, _)| t - a > USE_WINDOW_S)
        {
            self.requests.pop_front();
        }
    }

    /// Use and misses over the window ending at `t` (s): what the reports of the window added
    /// over the window's length (or, for an instance younger than the window, over its age, at
    /// least a second).
    pub fn rate(&mut self, t: f64) -> UseRate {
        self.forget(t);
        let span = self
            .first
            .map_or(USE_WINDOW_S, |f| (t - f).clamp(1.0, USE_WINDOW_S));
        let (g, c, m) = self
            .added
            .iter()
            .fold((0u64, 0u64, 0u64), |(g, c, m), (_, _, d)| {
                (
                    g.saturating_add(d.gpu_ns),
                    c.saturating_add(d.contention_ns),
                    m.saturating_add(d.measured_contention_ns.unwrap_or(d.contention_ns)),
                )
            });
        let ppm = |ns: u64| {
            ((ns as f64 / 1e9 / span) * PPM as f64)
                .round()
                .min(PPM as f64) as u32
        };
        let (n, missed) = self
            .requests
            .iter()
            .fold((0, 0), |(n, m), &(_, a, b)| (n + a, m + b));
        // Processes with a bucket of their own count one each; those sharing the grant's bucket
        // count once together (as pid 0, which no reporting process has).
        let mut paying: Vec<u32> = self
            .added
            .iter()
            .filter(|(_, _, d)| d.contention_ns > 0)
            .map(|&(_, pid, d)| if d.shared { 0 } else { pid.max(1) })
            .collect();
        paying.sort_unstable();
        paying.dedup();
        let mut gpu: Vec<u32> = self
            .added
            .iter()
            .filter(|(_, _, d)| d.gpu_ns > 0)
            .map(|&(_, pid, _)| pid)
            .collect();
        gpu.sort_unstable();
        gpu.dedup();
        UseRate {
            gpu_ppm: ppm(g),
            contention_ppm: ppm(c),
            miss_rate: (n > 0).then(|| missed as f64 / n as f64),
            paying_processes: paying.len() as u32,
            gpu_processes: gpu.len() as u32,
            measured_ppm: ppm(m),
            collision_per_request_ns: (n > 0).then(|| c as f64 / n as f64),
            gpu_per_request_ns: (n > 0).then(|| g as f64 / n as f64),
        }
    }
}

/// A request's verdict from [`RequestPacer::admit`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pace {
    /// The shim will run it without holding it for the collision budget longer than its slack.
    Admit {
        /// How long the shim is predicted to hold its launches, ms (0: at full speed).
        hold_ms: f64,
    },
    /// The shim would hold it past its deadline: refuse it now, while the platform can still send
    /// it elsewhere, instead of serving it late.
    Refuse {
        /// The predicted hold, ms.
        hold_ms: f64,
        /// The predicted end-to-end latency against the SLO, ms.
        predicted_ms: f64,
    },
}

/// What one request of a function costs on average, from its shims' reports over
/// [`USE_WINDOW_S`] divided by the requests it served.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct PerRequest {
    /// Collision time, ns.
    pub collision_ns: f64,
    /// GPU time (calibrated solo cost), ns.
    pub gpu_ns: f64,
}

impl PerRequest {
    /// The share of its GPU time that collided, 0..=1: how likely a launch of it meets a busy
    /// trainer, which is when its shim holds launches for the budget (a shim never holds a launch
    /// while its collision probability is under 1/8: shim/src/harvest.rs).
    pub fn collision_probability(&self) -> f64 {
        if self.gpu_ns > 0.0 {
            (self.collision_ns / self.gpu_ns).clamp(0.0, 1.0)
        } else {
            1.0
        }
    }
}

/// How likely a request's launches are to meet the training job, by the trainer's predicted
/// phase at its arrival (`smore_protocol::phase`, from the GPU's turn board; docs/harvest.md,
/// "Phase prediction") — what request admission weighs the shim's hold by
/// ([`RequestPacer::admit`]): the shim holds only launches that meet the trainer.
///
/// - an idle phase that lasts the request's reserve ([`defer_reserve_ms`]: twice its GPU time
///   and a millisecond, room for the turns of the functions ahead of it) — 0: it runs in the gap;
/// - a busy phase, or an idle one that ends sooner — 1;
/// - no prediction (no board, too few samples, a GPU without turns) — the function's average,
///   [`PerRequest::collision_probability`], as before the prediction.
///
/// The average charged every request the hold of those that arrive in a busy phase: in the demo's
/// time-sliced `harvest` two thirds of the refused requests had arrived in an idle phase, and of
/// those admitted in an idle phase 96 % met their deadline (seed 7, simulated, 2026-11-28;
/// docs/harvest.md, "Phase prediction").
/// The mirror is still charged every request's average collision: over all requests it is what
/// the shim's bucket pays.
pub fn meets_trainer(per: PerRequest, phase: Option<Phase>, now_ns: u64) -> f64 {
    match phase {
        None => per.collision_probability(),
        Some(Phase::Idle { until })
            if until.saturating_sub(now_ns) as f64 / 1e6 >= defer_reserve_ms(per.gpu_ns / 1e6) =>
        {
            0.0
        }
        Some(_) => 1.0,
    }
}

/// Training's solo utilization from which request admission takes a shim's reported debt for its
/// own ([`RequestPacer::catch_up`]): 1/2. Reasoning: the shim holds only launches that meet the
/// trainer, and cuts every hold at 4 ms to probe whether the trainer went idle, so beside a
/// trainer idle most of the time a function runs through its bucket's debt in the idle phases,
/// and the debt says little about its requests' latency (measured, simulated, seed 7: catching up
/// beside the demo's `harvest` trainer, 22 % busy, refused 41 % of its requests instead of 17 %,
/// for DSR 65.3 → 55.8 % and a gain of +30 → +19 pp). Beside a trainer busy most of the time
/// nearly every launch meets it and is held by the debt. (Gating on the function's own collision
/// probability instead did not separate the two: beside the 22 %-busy trainer the demo's
/// functions read 0.3–1.0, their collisions with each other included.)
pub const CATCH_UP_FROM: f64 = 0.5;
/// The most debt a shim's report moves request admission by: 60 s (reasoning: a report is the
/// function's word; a garbage value must not refuse its requests for hours — a real debt that
/// large drains in under a minute of refusals at any budget the split gives a busy function, or
/// is reported again the next second).
pub const CATCH_UP_MAX_S: f64 = 60.0;

/// Request-level admission under a function's collision budget: a mirror of its shim's contention
/// bucket (the same GCRA — `tat` advances by `cost / rate`, a launch waits while `tat` runs more
/// than [`smore_protocol::grant::CONTENTION_HORIZON_NS`] ahead of now — shim/src/gate.rs), charged
/// with the collision a request costs on average ([`PerRequest`]). The request's expected latency
/// is what it already waited, plus its GPU time, plus the bucket's hold weighted by the chance its
/// launches meet the trainer (the shim holds only those); a request expected past its SLO is
/// refused at admission: beside a busy trainer the budget cannot serve every request, and those
/// it cannot serve in time are better refused (the platform sends them elsewhere) than paced into
/// misses (the harvest issue, scenario `busy`). The shim stays the enforcer: a mirror that drifts
/// only moves which requests are refused, never what the trainer pays.
#[derive(Debug, Default, Clone)]
pub struct RequestPacer {
    /// Theoretical arrival time of the mirror bucket, s on the arbiter's clock.
    tat: f64,
}

impl RequestPacer {
    /// The shim's bucket ran `ahead_s` ahead of `now` when it reported, beside a training job
    /// busy `trainer_busy` of the time alone (0..=1): when the trainer is busy most of the time
    /// ([`CATCH_UP_FROM`]) the mirror catches up (it never runs behind the bucket it predicts). Without it the mirror, charged each request's average collision,
    /// fell behind a shim whose requests were held kernel by kernel — on a time-sliced GPU each
    /// held kernel is one more pair of context switches — and admitted requests into holds of
    /// over a second (docs/harvest.md, "Context switches").
    pub fn catch_up(&mut self, now: f64, ahead_s: f64, trainer_busy: f64) {
        // A busy fraction that is not a number is taken as busy (the side that refuses).
        let busy = trainer_busy.is_nan() || trainer_busy >= CATCH_UP_FROM;
        if ahead_s.is_finite() && ahead_s > 0.0 && busy {
            self.tat = self.tat.max(now + ahead_s.min(CATCH_UP_MAX_S));
        }
    }

    /// Decides a request at `now` (s) that costs `per` on average under a budget of `rate_ppm`,
    /// has already waited `waited_ms` and must finish within `slo_ms` (0: no SLO, never refused),
    /// whose launches meet the trainer — and so are held while the bucket is in debt — with
    /// probability `meets` ([`meets_trainer`]). An admitted request is charged to the mirror.
    pub fn admit(
        &mut self,
        now: f64,
        per: PerRequest,
        rate_ppm: u32,
        waited_ms: f64,
        slo_ms: f64,
        meets: f64,
    ) -> Pace {
        let horizon = smore_protocol::grant::CONTENTION_HORIZON_NS as f64 / 1e9;
        let wall = if rate_ppm == 0 {
            f64::INFINITY
        } else {
            per.collision_ns.max(0.0) / 1e9 / (rate_ppm as f64 / PPM as f64)
        };
        let tat = self.tat.max(now) + wall;
        let hold_ms = ((tat - horizon - now) * 1e3).max(0.0);
        let predicted_ms =
            waited_ms.max(0.0) + per.gpu_ns.max(0.0) / 1e6 + hold_ms * meets.clamp(0.0, 1.0);
        if slo_ms > 0.0 && predicted_ms > slo_ms {
            return Pace::Refuse {
                hold_ms,
                predicted_ms,
            };
        }
        self.tat = tat;
        Pace::Admit { hold_ms }
    }
}

/// Urgency of a function whose requests missed their SLO at `miss_rate` (0..=1): 1 on time, up to
/// 5 when every request misses — the weight its constrained claim gets in [`split`].
pub fn urgency(miss_rate: Option<f64>) -> f64 {
    1.0 + 4.0 * miss_rate.unwrap_or(0.0).clamp(0.0, 1.0)
}

/// `c / (1 − c)`: the slowdown of a job delayed for a fraction `c` of wall time (capped at 10).
pub fn slowdown_of_fraction(c: f64) -> f64 {
    if c >= 10.0 / 11.0 {
        10.0
    } else {
        c / (1.0 - c)
    }
}

/// `θ / (1 + θ)`: the collision fraction that slows a job by exactly θ.
pub fn fraction_for_slowdown(theta: f64) -> f64 {
    let t = theta.max(0.0);
    t / (1.0 + t)
}

/// One function's claim on its GPU's collision budget.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Demand {
    /// Collision budget it holds now, ppm of wall time.
    pub granted_ppm: u32,
    /// Collision time it used over the last interval, ppm of wall time (from its usage reports).
    pub used_ppm: u32,
    /// Urgency weight ≥ 1: how close its requests are to missing their deadlines (1 = on time).
    pub urgency: f64,
}

impl Demand {
    /// Whether it used (nearly) all it was given, so it would use more.
    pub fn constrained(&self) -> bool {
        self.granted_ppm > 0 && self.used_ppm as f64 >= CONSTRAINED_AT * self.granted_ppm as f64
    }
}

/// Splits `total_ppm` among functions: each first gets a floor; an unconstrained function is given
/// its use plus [`HEADROOM`]; the constrained ones claim [`GROWTH`] × what they hold, served in
/// proportion to their urgency (weighted max-min fairness, by water-filling); what no claim takes
/// is spread evenly. The result sums to at most `total_ppm`.
pub fn split(total_ppm: u32, demands: &[Demand]) -> Vec<u32> {
    let n = demands.len();
    if n == 0 {
        return Vec::new();
    }
    let total = total_ppm as f64;
    let floor = total / n as f64 * FLOOR_OF_EQUAL;
    // What each would take if nothing bound: the unconstrained their use plus headroom, the
    // constrained unbounded.
    let want: Vec<f64> = demands
        .iter()
        .map(|d| {
            if d.constrained() {
                // What it holds, not what it reports using: a report is the function's word, and
                // a use reported above the grant would otherwise claim without bound
                // (docs/arbiter.md, threat model).
                (d.granted_ppm as f64 * GROWTH).max(floor)
            } else {
                (d.used_ppm as f64 * HEADROOM).max(floor)
            }
        })
        .collect();
    let weight: Vec<f64> = demands.iter().map(|d| d.urgency.max(1.0)).collect();
    let mut give = vec![0.0; n];
    let mut open: Vec<usize> = (0..n).collect();
    let mut left = total;
    // Water-filling: raise every open function's level in proportion to its weight until its want
    // is met or the budget runs out.
    while !open.is_empty() && left > 1e-9 {
        let wsum: f64 = open.iter().map(|&i| weight[i]).sum();
        let step = left / wsum;
        let mut met = Vec::new();
        for &i in &open {
            if want[i] - give[i] <= step * weight[i] {
                met.push(i);
            }
        }
        if met.is_empty() {
            for &i in &open {
                give[i] += step * weight[i];
            }
            left = 0.0;
        } else {
            for &i in &met {
                left -= want[i] - give[i];
                give[i] = want[i];
            }
            open.retain(|i| !met.contains(i));
        }
    }
    // What no claim took is spread evenly: a sudden burst should not wait an interval for budget
    // the GPU has.
    if left > 1e-9 {
        for g in give.iter_mut() {
            *g += left / n as f64;
        }
    }
    let mut out: Vec<u32> = give.iter().map(|&g| g.floor().max(0.0) as u32).collect();
    // Rounding never adds: trim any excess from the largest.
    let sum: u64 = out.iter().map(|&x| x as u64).sum();
    if sum > total_ppm as u64 {
        if let Some(m) = out.iter_mut().max() {
            *m -= (sum - total_ppm as u64) as u32;
        }
    }
    out
}

/// Fraction of `θ / (1 + θ)` handed out: 80 %. Reasoning: the shims cannot see one kind of
/// collision — a training kernel that arrives while a function's batch already runs waits, but no
/// function event shows it. On the simulated GPU that left trainers 2–3 pp above the bound a
/// budget implies (docs/shim.md, "Harvest"); holding a fifth back keeps the measured mean under θ
/// (cli/tests/colocation_loop.rs measured 10.8 % at θ = 10 % with the whole budget).
pub const UNSEEN_COLLISION_MARGIN: f64 = 0.8;
/// Smallest calibration of the budget: a quarter of `θ / (1 + θ)`.
pub const CALIBRATION_MIN: f64 = 0.25;
/// Multiplicative decrease when the estimated slowdown exceeds θ (TGS decreases by 8 % per 50 ms
/// window; one observation here spans seconds, so a larger step).
pub const DECREASE: f64 = 0.8;
/// Additive increase per observation while the estimate stays under [`INCREASE_BELOW`] × θ.
pub const INCREASE: f64 = 0.05;
/// The calibration recovers while the estimate is below this fraction of θ.
pub const INCREASE_BELOW: f64 = 0.7;

/// Smallest share of a function's measured collisions attributed to training: a half. Two
/// reasons. The attribution ([`training_share`]) is a statistical model — occupancy in proportion
/// to use, functions independent of each other — and read 2–3 pp *under* the true slowdown with
/// four functions beside a trainer busy ~25 % when it could go to a quarter (simulated: 8.5–9.2 %
/// against 11.4–11.6 % time-sliced, 3.8 % against 6.0 % under MPS,
/// `tests/e2e/tests/harvest_estimate.rs`); the estimate must err on training's side. And it rests
/// on the functions' own reports: the floor bounds how far they can widen their budget (×2).
pub const TRAINING_SHARE_MIN: f64 = 0.5;

/// The share of a function's measured collisions that were with the training job rather than with
/// the GPU's other functions.
///
/// A shim sees that its kernel waited or was slowed, not for whom; beside several functions it
/// also charges waits behind them, which cost no training job (docs/harvest.md, "The estimate
/// beside several functions"). While it waits (time-sliced) or overlaps (MPS), the GPU is running
/// the other contexts that have work, in proportion to how much of the GPU each occupies; so the
/// training job's part of its collisions is about training's utilization over training's plus the
/// other functions' — `training_util / (training_util + others_gpu)`, both fractions of wall time
/// (training's from NVML, the others' from their shims' reports). Unknown training utilization, or
/// no other function, attributes everything to training (the safe side); the result is at least
/// [`TRAINING_SHARE_MIN`].
pub fn training_share(training_util: Option<f64>, others_gpu: f64) -> f64 {
    match training_util {
        Some(u) if others_gpu > 0.0 && u.is_finite() => {
            let u = u.clamp(0.0, 1.0);
            if u + others_gpu <= 0.0 {
                1.0
            } else {
                (u / (u + others_gpu)).clamp(TRAINING_SHARE_MIN, 1.0)
            }
        }
        _ => 1.0,
    }
}

/// One GPU's collision budget: `θ / (1 + θ)` times a calibration in
/// [[`CALIBRATION_MIN`], 1], lowered when the measured slowdown exceeds θ (a burst horizon or an
/// estimate that runs low) and recovered additively while it stays well under θ.
#[derive(Debug, Clone)]
pub struct Harvest {
    theta: f64,
    calibration: f64,
    /// The share of the functions' measured collisions that were with training (1 = all).
    training_share: f64,
}

impl Harvest {
    /// A GPU's budget under bound `theta` (a fraction: 0.1 = 10 %).
    pub fn new(theta: f64) -> Harvest {
        Harvest {
            theta: theta.max(0.0),
            calibration: 1.0,
            training_share: 1.0,
        }
    }

    /// The bound this GPU is held to.
    pub fn theta(&self) -> f64 {
        self.theta
    }

    /// Changes the bound (a reloaded configuration).
    pub fn set_theta(&mut self, theta: f64) {
        self.theta = theta.max(0.0);
    }

    /// The calibration now, in [[`CALIBRATION_MIN`], 1].
    pub fn calibration(&self) -> f64 {
        self.calibration
    }

    /// Takes up a calibration a previous arbiter learnt (its saved state), bounded to
    /// [[`CALIBRATION_MIN`], 1]; a figure that is not a number leaves the budget as it is.
    pub fn restore_calibration(&mut self, calibration: f64) {
        if calibration.is_finite() {
            self.calibration = calibration.clamp(CALIBRATION_MIN, 1.0);
        }
    }

    /// The GPU's total collision budget, ppm of wall time:
    /// `θ/(1+θ)` × [`UNSEEN_COLLISION_MARGIN`] × the calibration.
    pub fn total_ppm(&self) -> u32 {
        (fraction_for_slowdown(self.theta)
            * UNSEEN_COLLISION_MARGIN
            * self.calibration
            * PPM as f64)
            .round() as u32
    }

    /// The share of the functions' measured collisions that were with training, as last set.
    pub fn training_share(&self) -> f64 {
        self.training_share
    }

    /// Sets the share of the functions' measured collisions that were with training (the
    /// collision-weighted mean of their [`training_share`]s), bounded to
    /// [[`TRAINING_SHARE_MIN`], 1].
    pub fn set_training_share(&mut self, share: f64) {
        self.training_share = if share.is_finite() {
            share.clamp(TRAINING_SHARE_MIN, 1.0)
        } else {
            1.0
        };
    }

    /// The budget in the shims' units — collisions as they measure them, with the GPU's other
    /// functions too — so that the part that is with training stays within [`Harvest::total_ppm`]:
    /// `total_ppm / training_share`, at most all of wall time.
    pub fn measured_total_ppm(&self) -> u32 {
        (self.total_ppm() as f64 / self.training_share)
            .round()
            .min(PPM as f64) as u32
    }

    /// Feeds the slowdown estimated over the last window; returns whether the budget changed.
    pub fn observe(&mut self, slowdown: f64) -> bool {
        let old = self.calibration;
        if slowdown > self.theta {
            self.calibration = (self.calibration * DECREASE).max(CALIBRATION_MIN);
        } else if slowdown < INCREASE_BELOW * self.theta {
            self.calibration = (self.calibration + INCREASE).min(1.0);
        }
        self.calibration != old
    }

    /// What the GPU's raw-share throttle ([`Throttle`]) does after an observation of
    /// `slowdown`, the calibration having been `calibration_before` before it: the collision
    /// budget was already at its floor and the estimate is still above θ — the budget can do no
    /// more, so the functions that spent over their part have their GPU time cut; well under θ,
    /// throttled functions get GPU time back; in between, nothing moves.
    pub fn throttle_step(&self, calibration_before: f64, slowdown: f64) -> ThrottleStep {
        if slowdown > self.theta && calibration_before <= CALIBRATION_MIN {
            ThrottleStep::Cut
        } else if slowdown < INCREASE_BELOW * self.theta {
            ThrottleStep::Recover
        } else {
            ThrottleStep::Hold
        }
    }
}

/// The least raw share, percent, the throttle leaves a function: 5 %. Reasoning: a function cut
/// to nothing would serve nothing and report nothing, and its demand would vanish from the
/// split; 5 % of a GPU still serves a request of a few ms every 50–100 ms, and a function of one
/// process held there collides at most 5 % of wall time however it launches (one of g gates of
/// their own: g × ⌈5 / g⌉ %, [`raw_allowed`]; docs/harvest.md, "When the budget cannot hold θ").
pub const THROTTLE_MIN_PCT: u32 = 5;
/// Raw share given back to a throttled function per observation (every
/// `state::OBSERVE_EVERY` rounds, 5 s) while the estimate stays under [`INCREASE_BELOW`] × θ:
/// 5 points. Reasoning: additive increase, as the calibration's (TGS, NSDI'23); from the floor
/// back to no throttle in 19 observations (about 95 s) of a quiet trainer, so a function the
/// budget could not hold does not return at once to the use that broke θ.
pub const THROTTLE_STEP_PCT: u32 = 5;

/// What a GPU's estimate says to do about its functions' raw shares ([`Harvest::throttle_step`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThrottleStep {
    /// Cut the GPU time of the functions that spent over their part of the budget
    /// ([`throttle_targets`]).
    Cut,
    /// Give throttled functions GPU time back.
    Recover,
    /// Leave the throttles as they are.
    Hold,
    /// Lift every throttle at once: no training job to protect, or harvest turned off.
    Lift,
}

/// The functions a throttle's cut falls on ([`ThrottleStep::Cut`]): those whose collision time
/// over the estimate's window exceeds their part by at least an equal share of the GPU's whole
/// excess (to a millionth). `contributions`: per function, what it added to the estimate over [`WINDOW_S`] and its
/// part, both as fractions of wall time in the estimate's units (collisions attributed to
/// training; a part in the shims' units times the GPU's training share); `gpu_collided`: what
/// the estimate counted over the window, every function that reported included — also one that
/// has since left. A function is cut when its excess `m − p` is positive and at least
/// `(gpu_collided − Σ p) / k`, `k` being how many functions have a positive excess.
///
/// Reasoning: the estimate that triggers a cut is the sum of what the functions *say* they
/// measured. A function that inflates its figure to drive the GPU's budget to its floor owns
/// nearly all the excess and is cut itself; a neighbour that spends over its small part — an
/// honest function often does, through its bucket's horizon and its probes — owns a sliver and is
/// not; nor is one whose excess is smaller than a function that burst and left (the window counts
/// both); functions that overspend alike are cut alike. Judged on one window for all, so that a
/// function that bursts just after an observation cannot leave its neighbours holding the excess
/// (docs/harvest.md, "When the budget cannot hold θ").
pub fn throttle_targets(contributions: &[(f64, f64)], gpu_collided: f64) -> Vec<bool> {
    let parts: f64 = contributions.iter().map(|&(_, p)| p.max(0.0)).sum();
    let over: Vec<f64> = contributions
        .iter()
        .map(|&(m, p)| if m.is_finite() { m - p.max(0.0) } else { 0.0 })
        .collect();
    let k = over.iter().filter(|&&e| e > 0.0).count();
    let whole = if gpu_collided.is_finite() {
        gpu_collided - parts
    } else {
        0.0
    };
    if k == 0 || whole <= 0.0 {
        return vec![false; contributions.len()];
    }
    // A millionth below the mean excess still counts: functions that overspend alike must not
    // be told apart by rounding.
    let least = whole / k as f64 * (1.0 - 1e-6);
    over.iter().map(|&e| e > 0.0 && e >= least).collect()
}

/// One function's raw-share throttle: the last lever when the collision budget cannot hold θ.
///
/// The collision budget holds the trainer through the shims' holds, which are bounded per launch
/// (a hold ends at the staleness age, a probe goes before anything says whether the trainer is
/// busy), and through the calibration, which stops at [`CALIBRATION_MIN`]. A function whose
/// launches slip through those bounds — several workers in deep debt, a trainer's phase the
/// probes keep meeting — can spend many times its part while the budget sits at its floor and
/// the estimate above θ (docs/harvest.md, "When the budget cannot hold θ"). Its raw share then
/// caps its GPU time, which the shim's launch gate enforces exactly whatever the launch pattern:
/// cut multiplicatively from what it used ([`DECREASE`]), down to [`THROTTLE_MIN_PCT`], and
/// given back additively ([`THROTTLE_STEP_PCT`]) once the trainer is well within θ.
///
/// Cuts are at least [`WINDOW_S`] apart: the estimate spans that window, so an observation
/// sooner after a cut still reads mostly the time before it. The throttle lives in the daemon's
/// memory, as the calibration does: an arbiter restart lifts it, and it comes back as the
/// estimate again exceeds θ with the calibration at its floor.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Throttle {
    /// The ceiling, percent of the GPU for the whole function (None: no throttle).
    ceiling: Option<u32>,
    /// When it was last cut (seconds, the caller's clock).
    cut_at: Option<f64>,
}

/// Status shows the ceiling alone (`throttle_pct`: percent, or null).
impl Serialize for Throttle {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.ceiling.serialize(s)
    }
}

/// The raw share each of a function's `gates` carries for a function whose processes together
/// may have `total` % of the GPU: its part, rounded up to whole percent and at least 1 (100:
/// ungated). Each gate holds the processes that gate by it to the page's share, so the function
/// gets `total` across its gates, not `total` each: one gate for all the processes that share the
/// grant's (its ledger table's, under `smore run`), one for each process with its own
/// (docs/shim.md, "One share per grant").
pub fn per_gate(total: u32, gates: u32) -> u32 {
    if total >= 100 {
        return 100;
    }
    let gates = gates.max(1);
    // Rounded up, but never so far that the gates together pass what the watchdog allows
    // ([`raw_allowed`]): a page the watchdog then corrected would be corrected again and again.
    total
        .div_ceil(gates)
        .min((total + GATE_ROUNDING_MAX_PCT).min(99) / gates)
        .max(1)
}

/// What a function's pages allow its processes together, percent, when they may have `total` %
/// over `gates` gates and NVML lists `listed` processes for it: [`per_gate`] for each gate, but
/// for no more gates than processes NVML lists (a gate no process runs behind uses nothing, so
/// reports of more gates do not raise it), at most [`GATE_ROUNDING_MAX_PCT`] over `total` and
/// never 100. What the watchdog holds the function to: a function that obeys its pages is never
/// acted on while it has at most `total` + 5 gates (each page at least 1 %); one of more gates of
/// their own — processes without the grant's ledger — is, once their pages add up past that.
pub fn raw_allowed(total: u32, gates: u32, listed: u32) -> u32 {
    if total >= 100 {
        return 100;
    }
    gates
        .min(listed)
        .max(1)
        .saturating_mul(per_gate(total, gates))
        .min(total + GATE_ROUNDING_MAX_PCT)
        .min(99)
}

/// Points over a function's raw share that the rounding among its gates ([`raw_allowed`]) may
/// allow it at most: 5. Reasoning: only processes with gates of their own round (a `smore run`
/// grant's processes share one gate), a few at most — an older shim, or a process without the
/// grant's ledger; past this a function that starts many such processes (each page at least 1 %)
/// is held to its share plus this, like any other, and never to 100, which the watchdog reads as
/// no share at all.
pub const GATE_ROUNDING_MAX_PCT: u32 = 5;

impl Throttle {
    /// The raw share ceiling it sets for the function, percent (100: none).
    pub fn ceiling(&self) -> u32 {
        self.ceiling.unwrap_or(100)
    }

    /// A throttle a previous arbiter had set (its saved state): the ceiling, bounded to
    /// [[`THROTTLE_MIN_PCT`], 99] (100 is none), as if just cut — the next cut waits its
    /// [`WINDOW_S`] from the first observation.
    pub fn restored(ceiling_pct: u32, now: f64) -> Throttle {
        Throttle {
            ceiling: Some(ceiling_pct.clamp(THROTTLE_MIN_PCT, 99)),
            cut_at: Some(now),
        }
    }

    /// The ceiling while it lowers the share (percent; None: no throttle).
    pub fn ceiling_pct(&self) -> Option<u32> {
        self.ceiling
    }

    /// Whether it lowers the share now.
    pub fn is_on(&self) -> bool {
        self.ceiling.is_some()
    }

    /// At `now` (seconds), cuts the ceiling to [`DECREASE`] × the lower of itself and what the
    /// function used (`gpu_used_ppm` of wall time; a ceiling above the use would not cut), at
    /// least [`THROTTLE_MIN_PCT`] — unless the last cut was less than [`WINDOW_S`] ago. Returns
    /// whether the ceiling changed.
    pub fn cut(&mut self, now: f64, gpu_used_ppm: u32) -> bool {
        if self.cut_at.is_some_and(|t| now - t < WINDOW_S) {
            return false;
        }
        let used_pct = gpu_used_ppm.div_ceil(PPM / 100);
        let from = self.ceiling().min(used_pct.max(THROTTLE_MIN_PCT));
        let to = ((from as f64 * DECREASE).floor() as u32).max(THROTTLE_MIN_PCT);
        let changed = Some(to) != self.ceiling;
        self.ceiling = Some(to);
        self.cut_at = Some(now);
        changed
    }

    /// Lifts the throttle at once. Returns whether there was one.
    pub fn lift(&mut self) -> bool {
        let on = self.is_on();
        *self = Throttle::default();
        on
    }

    /// Raises the ceiling by [`THROTTLE_STEP_PCT`]; at 100 the throttle is off. Returns whether
    /// it changed.
    pub fn recover(&mut self) -> bool {
        match self.ceiling {
            None => false,
            Some(c) => {
                let to = c.saturating_add(THROTTLE_STEP_PCT);
                self.ceiling = (to < 100).then_some(to);
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_deferral_reserve_grows_with_the_requests_gpu_time() {
        assert_eq!(defer_reserve_ms(0.0), DEFER_RESERVE_MS);
        assert_eq!(defer_reserve_ms(1.6), 2.0 * 1.6 + DEFER_RESERVE_MS);
        // A nonsense figure never shrinks the reserve below its fixed part.
        assert_eq!(defer_reserve_ms(-5.0), DEFER_RESERVE_MS);
    }

    #[test]
    fn the_meter_turns_collision_time_into_a_slowdown_over_its_window() {
        let mut m = ContentionMeter::default();
        m.tick(0.0);
        assert_eq!(m.fraction(), None, "no span yet");
        // Two functions collide for 50 ms and 50 ms of every second: c = 0.1 ⇒ s = 0.111.
        for s in 1..=5 {
            m.add(50_000_000);
            m.add(50_000_000);
            m.tick(s as f64);
        }
        assert!((m.fraction().unwrap() - 0.1).abs() < 1e-9);
        assert!((m.slowdown().unwrap() - 0.1 / 0.9).abs() < 1e-9);
    }

    #[test]
    fn the_window_forgets_collisions_older_than_ten_seconds() {
        let mut m = ContentionMeter::default();
        m.tick(0.0);
        m.add(5_000_000_000); // 5 s of collisions in the first second
        m.tick(1.0);
        for s in 2..=20 {
            m.tick(s as f64);
        }
        assert_eq!(m.fraction(), Some(0.0));
    }

    #[test]
    fn the_measured_collision_time_is_bounded_by_what_was_paid_and_survives_a_report_without_it() {
        let mut l = UsageLedger::default();
        let u = |g: u64, c: u64| ShimUsage {
            gpu_ns: g * 1_000_000,
            contention_ns: c * 1_000_000,
            ..Default::default()
        };
        // A report without it leaves the last one standing (Some → None → Some counts each
        // part once).
        let m = |g: u64, c: u64, m: Option<u64>| ShimUsage {
            measured_contention_ns: m.map(|m| m * 1_000_000),
            ..u(g, c)
        };
        assert_eq!(l.record(12, m(100, 20, Some(8)), 0.0), m(100, 20, Some(8)));
        assert_eq!(l.record(12, m(200, 30, None), 0.0), m(100, 10, None));
        assert_eq!(l.record(12, m(300, 40, Some(12)), 0.0), m(100, 10, Some(4)));
        assert_eq!(
            l.record(12, m(400, 50, Some(90)), 0.0),
            m(100, 10, Some(38)),
            "at most what was paid"
        );
    }

    #[test]
    fn a_counter_that_restarts_counts_from_zero_and_each_worker_counts_apart() {
        let mut l = UsageLedger::default();
        // Milliseconds, in ns.
        let u = |g: u64, c: u64| ShimUsage {
            gpu_ns: g * 1_000_000,
            contention_ns: c * 1_000_000,
            ..Default::default()
        };
        assert_eq!(l.record(10, u(300, 30), 0.0), u(300, 30));
        assert_eq!(
            l.record(11, u(50, 5), 0.0),
            u(50, 5),
            "another worker of the function"
        );
        assert_eq!(
            l.record(10, u(100, 10), 0.0),
            u(100, 10),
            "restarted: from zero"
        );
        assert_eq!(l.record(10, u(150, 10), 0.0), u(50, 0));
        l.record_latencies(&[1.0, 9.0, f64::NAN, 12.0], Some(8.0), 0.0);
        // Young instance: its use over its age (at least 1 s).
        let r = l.rate(1.0);
        assert_eq!(
            (r.gpu_ppm, r.contention_ppm),
            (500_000, 45_000),
            "500 ms and 45 ms over 1 s"
        );
        assert_eq!(l.rate(2.0).gpu_ppm, 250_000, "over its age of 2 s");
        assert_eq!(r.miss_rate, Some(2.0 / 3.0));
        assert_eq!(
            r.collision_per_request_ns,
            Some(15e6),
            "45 ms over 3 requests"
        );
        assert_eq!(
            l.rate(10.0),
            UseRate::default(),
            "all of it older than the window"
        );
        assert_eq!(urgency(None), 1.0);
        assert_eq!(urgency(Some(1.0)), 5.0);
    }

    #[test]
    fn use_is_averaged_over_the_window_so_a_report_missing_from_one_second_does_not_read_idle() {
        // A function colliding 50 ms per second, reporting every 1.1 s (its shim's cadence drifts
        // against the arbiter's split): one-second intervals would read 0 now and then.
        let mut l = UsageLedger::default();
        let mut cum = ShimUsage::default();
        let mut t = 0.0;
        let mut next_report = 0.0;
        let mut seen = Vec::new();
        while t < 20.0 {
            while next_report <= t {
                cum.gpu_ns += 110_000_000;
                cum.contention_ns += 55_000_000;
                l.record(7, cum, next_report);
                next_report += 1.1;
            }
            if t >= 4.0 {
                seen.push(l.rate(t).contention_ppm);
            }
            t += 1.0;
        }
        for c in seen {
            assert!(
                (35_000..=75_000).contains(&c),
                "collision use read {c} ppm, truth 50 000"
            );
        }
    }

    #[test]
    fn a_request_arriving_in_the_trainers_idle_phase_is_not_refused_for_the_budgets_hold() {
        const MS: u64 = 1_000_000;
        let now = 1_000 * MS;
        // A quarter of the function's GPU time collides on average: 2 ms per request.
        let per = PerRequest {
            collision_ns: 0.5e6,
            gpu_ns: 2e6,
        };
        let idle = Some(Phase::Idle {
            until: now + 30 * MS,
        });
        let idle_ending = Some(Phase::Idle {
            until: now + 2 * MS,
        });
        let busy = Some(Phase::Busy {
            until: now + 5 * MS,
        });
        assert_eq!(meets_trainer(per, idle, now), 0.0);
        // An idle phase shorter than the request's reserve (2 × 2 + 1 ms) ends on it.
        assert_eq!(meets_trainer(per, idle_ending, now), 1.0);
        assert_eq!(meets_trainer(per, busy, now), 1.0);
        assert_eq!(
            meets_trainer(per, None, now),
            0.25,
            "no prediction: the average"
        );
        // A mirror in debt: a 1 % budget, 40 requests of 0.5 ms of collision admitted at once
        // run it 2 s of wall time ahead, past the 1 s horizon.
        let mut p = RequestPacer::default();
        for _ in 0..40 {
            p.admit(0.0, per, 10_000, 0.0, 0.0, 0.25);
        }
        let slo = 20.0;
        assert!(matches!(
            p.admit(0.0, per, 10_000, 0.0, slo, meets_trainer(per, busy, now)),
            Pace::Refuse { .. }
        ));
        assert!(matches!(
            p.admit(0.0, per, 10_000, 0.0, slo, meets_trainer(per, None, now)),
            Pace::Refuse { .. }
        ));
        // In an idle phase its launches are never held: admitted, and charged like any other.
        match p.admit(0.0, per, 10_000, 0.0, slo, meets_trainer(per, idle, now)) {
            Pace::Admit { hold_ms } => assert!(hold_ms > 1_000.0, "the debt stands: {hold_ms}"),
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn requests_run_at_full_speed_while_the_budget_allows_and_are_refused_when_it_would_make_them_late(
    ) {
        // Beside a trainer that never idles (every launch collides): 2 ms of GPU and collision per
        // request at a 2 % budget is 100 ms of wall time each; the 1 s horizon lets a burst of 10
        // through unheld, then each further request is held 100 ms more.
        let busy = PerRequest {
            collision_ns: 2e6,
            gpu_ns: 2e6,
        };
        let mut p = RequestPacer::default();
        let slo = 50.0;
        for k in 0..10 {
            assert_eq!(
                p.admit(0.0, busy, 20_000, 0.0, slo, busy.collision_probability()),
                Pace::Admit { hold_ms: 0.0 },
                "request {k} of the burst"
            );
        }
        match p.admit(0.0, busy, 20_000, 0.0, slo, busy.collision_probability()) {
            Pace::Refuse {
                hold_ms,
                predicted_ms,
            } => {
                assert!((hold_ms - 100.0).abs() < 1e-6, "{hold_ms}");
                assert!((predicted_ms - 102.0).abs() < 1e-6);
            }
            v => panic!("the 11th would be held 100 ms past a 50 ms SLO: {v:?}"),
        }
        // A refused request is not charged: 30 ms later the bucket has drained 30 ms of wall time,
        // the next would be held 70 ms (still refused); after 100 ms it runs at once.
        assert!(matches!(
            p.admit(0.03, busy, 20_000, 0.0, slo, busy.collision_probability()),
            Pace::Refuse { .. }
        ));
        assert_eq!(
            p.admit(0.1, busy, 20_000, 0.0, slo, busy.collision_probability()),
            Pace::Admit { hold_ms: 0.0 }
        );
        // A request that already waited most of its SLO is refused even unheld.
        let mut idle = RequestPacer::default();
        assert!(matches!(
            idle.admit(5.0, busy, 20_000, 49.0, slo, busy.collision_probability()),
            Pace::Refuse { .. }
        ));
        // No SLO: never refused (held as the shim holds it).
        let huge = PerRequest {
            collision_ns: 1e9,
            gpu_ns: 1e9,
        };
        assert!(matches!(
            idle.admit(5.0, huge, 20_000, 0.0, 0.0, huge.collision_probability()),
            Pace::Admit { .. }
        ));
        // A short hold within the slack is admitted and says so.
        let mut q = RequestPacer::default();
        for _ in 0..10 {
            q.admit(0.0, busy, 20_000, 0.0, 200.0, busy.collision_probability());
        }
        match q.admit(0.0, busy, 20_000, 0.0, 200.0, busy.collision_probability()) {
            Pace::Admit { hold_ms } => assert!((hold_ms - 100.0).abs() < 1e-6),
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn the_mirror_catches_up_with_the_bucket_its_shim_reports_and_never_falls_back() {
        let busy = PerRequest {
            collision_ns: 2e6,
            gpu_ns: 2e6,
        };
        // The shim says its bucket runs 1.5 s ahead (it held requests kernel by kernel): the
        // mirror, which thought it empty, now predicts a 500 ms hold and refuses.
        let mut p = RequestPacer::default();
        p.catch_up(10.0, 1.5, 1.0);
        match p.admit(10.0, busy, 20_000, 0.0, 50.0, busy.collision_probability()) {
            Pace::Refuse { hold_ms, .. } => assert!((hold_ms - 600.0).abs() < 1e-6, "{hold_ms}"),
            v => panic!("a bucket 1.5 s ahead holds past a 50 ms SLO: {v:?}"),
        }
        // A report of less (or nothing, or garbage) does not pull the mirror back.
        p.catch_up(10.0, 0.2, 1.0);
        p.catch_up(10.0, f64::NAN, 1.0);
        p.catch_up(10.0, -5.0, 1.0);
        // Garbage past any real debt is capped.
        let mut r = RequestPacer::default();
        r.catch_up(0.0, 1e12, 1.0);
        assert!(matches!(
            r.admit(61.2, busy, 20_000, 0.0, 50.0, busy.collision_probability()),
            Pace::Admit { .. }
        ));
        assert!(matches!(
            p.admit(10.0, busy, 20_000, 0.0, 50.0, busy.collision_probability()),
            Pace::Refuse { .. }
        ));
        // Once the bucket has drained past the horizon, requests run again.
        assert_eq!(
            p.admit(10.7, busy, 20_000, 0.0, 50.0, busy.collision_probability()),
            Pace::Admit { hold_ms: 0.0 }
        );
        // Beside a trainer idle most of the time a function runs through its bucket's debt in
        // the idle phases: its mirror is not moved.
        let mut q = RequestPacer::default();
        q.catch_up(10.0, 1.5, 0.3);
        assert_eq!(
            q.admit(10.0, busy, 20_000, 0.0, 50.0, busy.collision_probability()),
            Pace::Admit { hold_ms: 0.0 }
        );
    }

    #[test]
    fn the_hold_counts_as_much_as_the_function_meets_the_trainer() {
        // A function whose launches meet the trainer a quarter of the time (its shim holds only
        // those): a 100 ms debt past the horizon is expected to cost it 25 ms.
        let quarter = PerRequest {
            collision_ns: 0.5e6,
            gpu_ns: 2e6,
        };
        assert_eq!(quarter.collision_probability(), 0.25);
        let mut p = RequestPacer::default();
        // 0.5 ms of collision at 0.5 % is 100 ms of wall time per request: 10 fill the horizon.
        for _ in 0..10 {
            assert!(matches!(
                p.admit(
                    0.0,
                    quarter,
                    5_000,
                    0.0,
                    30.0,
                    quarter.collision_probability()
                ),
                Pace::Admit { .. }
            ));
        }
        match p.admit(
            0.0,
            quarter,
            5_000,
            0.0,
            30.0,
            quarter.collision_probability(),
        ) {
            Pace::Admit { hold_ms } => assert!((hold_ms - 100.0).abs() < 1e-6),
            v => panic!("2 + 25 ms fits a 30 ms SLO: {v:?}"),
        }
        assert!(
            matches!(
                p.admit(
                    0.0,
                    quarter,
                    5_000,
                    0.0,
                    30.0,
                    quarter.collision_probability()
                ),
                Pace::Refuse { .. }
            ),
            "held 200 ms × ¼ = 50 ms: past the SLO"
        );
        assert_eq!(
            PerRequest::default().collision_probability(),
            1.0,
            "no evidence: assume it collides"
        );
    }

    #[test]
    fn collisions_are_attributed_to_training_by_its_part_of_what_the_gpu_ran() {
        // No other function, or training's utilization unknown: all of it is training's.
        assert_eq!(training_share(Some(0.25), 0.0), 1.0);
        assert_eq!(training_share(None, 0.3), 1.0);
        // A trainer busy 60 % beside two other functions of 10 % each.
        assert!((training_share(Some(0.6), 0.2) - 0.75).abs() < 1e-12);
        // Busy 25 % beside three of 10 %: 0.45 by occupancy, held to the floor.
        assert_eq!(training_share(Some(0.25), 0.3), TRAINING_SHARE_MIN);
        // Never below the floor, whatever the reports say.
        assert_eq!(training_share(Some(0.01), 5.0), TRAINING_SHARE_MIN);
        let mut h = Harvest::new(0.1);
        assert_eq!(h.measured_total_ppm(), h.total_ppm());
        h.set_training_share(0.8);
        let widened = h.measured_total_ppm() as i64 - (h.total_ppm() as f64 / 0.8).round() as i64;
        assert!(widened.abs() <= 1, "1.25× the budget in the shims' units");
        h.set_training_share(0.0);
        assert_eq!(h.training_share(), TRAINING_SHARE_MIN, "widened ×2 at most");
        h.set_training_share(f64::NAN);
        assert_eq!(h.training_share(), 1.0);
    }

    #[test]
    fn slowdown_and_budget_fraction_are_inverse() {
        for theta in [0.0, 0.05, 0.1, 0.5, 1.0] {
            let c = fraction_for_slowdown(theta);
            assert!((slowdown_of_fraction(c) - theta).abs() < 1e-12);
        }
        assert_eq!(slowdown_of_fraction(1.0), 10.0);
    }

    fn d(granted: u32, used: u32, urgency: f64) -> Demand {
        Demand {
            granted_ppm: granted,
            used_ppm: used,
            urgency,
        }
    }

    #[test]
    fn the_split_never_exceeds_the_budget_and_gives_every_function_a_floor() {
        let total = 90_909;
        for demands in [
            vec![d(0, 0, 1.0)],
            vec![
                d(30_000, 30_000, 1.0),
                d(30_000, 0, 1.0),
                d(30_000, 29_000, 3.0),
            ],
            vec![d(10, 10, 1.0); 50],
        ] {
            let out = split(total, &demands);
            assert_eq!(out.len(), demands.len());
            assert!(out.iter().map(|&x| x as u64).sum::<u64>() <= total as u64);
            let floor = (total as f64 / demands.len() as f64 * FLOOR_OF_EQUAL) as u32;
            assert!(out.iter().all(|&x| x + 1 >= floor), "{out:?} floor {floor}");
        }
    }

    #[test]
    fn constrained_functions_get_what_the_idle_ones_do_not_use_by_urgency() {
        let total = 100_000;
        // One idle function, two constrained: one on time, one missing deadlines (urgency 3).
        let out = split(
            total,
            &[
                d(20_000, 1_000, 1.0),
                d(40_000, 40_000, 1.0),
                d(40_000, 40_000, 3.0),
            ],
        );
        assert!(out[0] < 10_000, "{out:?}");
        assert!(out[2] > 2 * out[1], "{out:?}");
        assert!(out.iter().sum::<u32>() >= total - 3);
    }

    #[test]
    fn an_urgent_function_that_uses_little_does_not_take_the_budget_of_busy_ones() {
        // The demo's `busy` scenario: a light function missing some deadlines (urgency ~2) beside
        // two that use nearly all they hold.
        let total = 72_727;
        let out = split(
            total,
            &[
                d(6_060, 7_800, 1.9),
                d(33_333, 31_500, 1.0),
                d(33_333, 30_500, 1.0),
            ],
        );
        assert!(out[0] <= 2 * 7_800 + 1, "it claims twice its use: {out:?}");
        assert!(out[1] >= 28_000 && out[2] >= 28_000, "{out:?}");
        assert!(out.iter().map(|&x| x as u64).sum::<u64>() <= total as u64);
    }

    #[test]
    fn a_use_reported_above_the_grant_claims_no_more_than_an_honest_one() {
        // Two constrained functions holding the same: one reports 100 × what it holds.
        let out = split(
            100_000,
            &[d(10_000, 1_000_000, 1.0), d(10_000, 10_000, 1.0)],
        );
        assert_eq!(out[0], out[1], "{out:?}");
    }

    const S: u64 = 1_000_000_000;

    fn huge() -> ShimUsage {
        ShimUsage {
            gpu_ns: u64::MAX,
            contention_ns: u64::MAX,
            measured_contention_ns: Some(u64::MAX),
            deferred_ns: u64::MAX,
            turn_waited_ns: u64::MAX,
            turn_cut_ins: 3,
            held_ns: u64::MAX,
            shared: false,
            raw_shared: false,
        }
    }

    #[test]
    fn a_report_adds_at_most_what_wall_time_allows() {
        let mut l = UsageLedger::starting_at(10.0);
        // A second after the instance began: its GPU time up to 4 × the second and the slack,
        // its collisions up to the instance's allowance (the slack, refilled at wall time's rate
        // and capped at it).
        let d = l.record(7, huge(), 11.0);
        let slack = REPORT_SLACK_NS;
        assert_eq!(d.gpu_ns, 4 * S + slack);
        assert_eq!(
            (d.contention_ns, d.measured_contention_ns),
            (slack, Some(slack))
        );
        // The display counters are the function's own status: not bounded.
        assert_eq!(
            (d.deferred_ns, d.turn_waited_ns, d.held_ns),
            (u64::MAX, u64::MAX, u64::MAX)
        );
        assert_eq!(d.turn_cut_ins, 3);
        // The same counters again a second later: nothing new was reported.
        assert_eq!(l.record(7, huge(), 12.0).gpu_ns, 0);
        // Another process of the instance: its GPU time within the instance's age, its
        // collisions within what the instance's allowance refilled since (a second).
        let d = l.record(8, huge(), 12.0);
        assert_eq!(d.gpu_ns, 2 * 4 * S + slack);
        assert_eq!(
            d.contention_ns, S,
            "the instance's collisions keep to wall time"
        );
        assert_eq!(d.measured_contention_ns, Some(S));
        // An honest report is counted whole.
        let mut l = UsageLedger::starting_at(0.0);
        let u = |ms: u64| ShimUsage {
            gpu_ns: ms * 1_000_000,
            contention_ns: ms * 100_000,
            ..Default::default()
        };
        assert_eq!(l.record(7, u(900), 1.0), u(900));
        assert_eq!(l.record(7, u(1_800), 2.0), u(900));
        // Quiet for an hour, then a report of an hour's collisions: the allowance refilled to
        // its cap, not by the hour.
        let d = l.record(7, u(1_800 + 36_000_000), 3_602.0);
        assert_eq!(d.contention_ns, slack);
    }

    #[test]
    fn a_report_of_the_largest_counters_does_not_stick_the_slowdown_estimate() {
        let mut l = UsageLedger::starting_at(0.0);
        let mut m = ContentionMeter::default();
        m.tick(0.0);
        let d = l.record(7, huge(), 1.0);
        m.add(d.measured_contention_ns.unwrap());
        m.tick(1.0);
        // The window passes; then honest collisions of 50 ms a second are seen again.
        for s in 2..=20 {
            m.tick(s as f64);
        }
        for s in 21..=32 {
            m.add(S / 20);
            m.tick(s as f64);
        }
        let c = m.fraction().unwrap();
        assert!((c - 0.05).abs() < 1e-9, "{c}");
    }

    #[test]
    fn after_a_restart_a_processs_first_report_is_its_baseline() {
        let mut l = UsageLedger::restored_at(100.0);
        let life = ShimUsage {
            gpu_ns: 3_600 * S,
            contention_ns: 60 * S,
            measured_contention_ns: Some(30 * S),
            ..Default::default()
        };
        let d = l.record(7, life, 101.0);
        assert_eq!((d.gpu_ns, d.contention_ns), (0, 0));
        assert_eq!(d.measured_contention_ns, Some(0));
        let later = ShimUsage {
            gpu_ns: life.gpu_ns + S / 2,
            contention_ns: life.contention_ns + S / 20,
            measured_contention_ns: Some(30 * S + S / 40),
            ..Default::default()
        };
        let d = l.record(7, later, 102.0);
        assert_eq!((d.gpu_ns, d.contention_ns), (S / 2, S / 20));
        assert_eq!(d.measured_contention_ns, Some(S / 40));
    }

    #[test]
    fn a_ledger_keeps_a_bounded_number_of_processes_and_counts_those_that_paid() {
        let mut l = UsageLedger::starting_at(0.0);
        let paid = |c: u64| ShimUsage {
            gpu_ns: 10_000_000,
            contention_ns: c,
            ..Default::default()
        };
        for pid in 0..1_000u32 {
            l.record(pid, paid(0), 1.0 + pid as f64 * 1e-4);
        }
        assert_eq!(l.last.len(), MAX_REPORTING_PIDS, "the oldest forgotten");
        assert!(l.last.contains_key(&999) && !l.last.contains_key(&0));
        let t = 2.0;
        l.record(5_000, paid(1_000_000), t);
        l.record(5_001, paid(2_000_000), t);
        l.record(5_002, paid(0), t);
        assert_eq!(l.rate(t).paying_processes, 2);
        // Processes that share the grant's bucket pay into one: counted once together.
        let shared = |c: u64| ShimUsage {
            shared: true,
            ..paid(c)
        };
        l.record(5_003, shared(1_000_000), t);
        l.record(5_004, shared(1_000_000), t);
        assert_eq!(l.rate(t).paying_processes, 3);
        assert_eq!(l.rate(t + USE_WINDOW_S + 1.0).paying_processes, 0);
    }

    #[test]
    fn an_unconstrained_function_keeps_headroom_over_its_use() {
        let out = split(100_000, &[d(50_000, 20_000, 1.0), d(50_000, 50_000, 1.0)]);
        assert!(out[0] >= 30_000, "{out:?}");
        assert!(out[1] >= 60_000, "{out:?}");
    }

    #[test]
    fn the_budget_shrinks_above_theta_and_recovers_well_below_it() {
        let mut h = Harvest::new(0.1);
        assert_eq!(h.total_ppm(), 72_727);
        assert!(h.observe(0.12));
        assert!(h.total_ppm() < 72_727);
        for _ in 0..20 {
            h.observe(0.2);
        }
        assert_eq!(h.calibration(), CALIBRATION_MIN);
        assert!(!h.observe(0.08), "between 0.7 θ and θ the budget holds");
        for _ in 0..20 {
            h.observe(0.01);
        }
        assert_eq!(h.calibration(), 1.0);
    }

    #[test]
    fn the_throttle_cuts_only_when_the_budget_is_at_its_floor_and_the_trainer_above_theta() {
        let mut h = Harvest::new(0.02);
        // Above θ with a calibration to spare: the budget is cut first.
        let c = h.calibration();
        assert_eq!(h.throttle_step(c, 0.03), ThrottleStep::Hold);
        let mut before = c;
        while h.calibration() > CALIBRATION_MIN {
            before = h.calibration();
            h.observe(0.03);
        }
        assert_eq!(
            h.throttle_step(before, 0.03),
            ThrottleStep::Hold,
            "the observation that reaches the floor tries the floor's budget first"
        );
        let c = h.calibration();
        assert_eq!(h.throttle_step(c, 0.03), ThrottleStep::Cut);
        assert_eq!(
            h.throttle_step(c, 0.02),
            ThrottleStep::Hold,
            "at θ nothing moves"
        );
        assert_eq!(h.throttle_step(c, 0.015), ThrottleStep::Hold);
        assert_eq!(h.throttle_step(c, 0.013), ThrottleStep::Recover);
        // A GPU without a bound to exceed never cuts.
        assert_eq!(
            Harvest::new(0.0).throttle_step(CALIBRATION_MIN, 0.0),
            ThrottleStep::Hold
        );
    }

    #[test]
    fn a_throttle_cuts_from_what_the_function_used_down_to_a_floor_and_recovers_to_none() {
        let mut t = Throttle::default();
        assert_eq!(t.ceiling(), 100);
        assert!(!t.recover(), "nothing to give back");
        // 30 % of the GPU used: the first cut already bites (24 %, not 80 % of 100).
        assert!(t.cut(0.0, 300_000));
        assert_eq!(t.ceiling(), 24);
        // Not again within the estimate's window.
        assert!(!t.cut(WINDOW_S - 1.0, 100_000));
        assert_eq!(t.ceiling(), 24);
        // The use has fallen under the ceiling: cut from the use.
        assert!(t.cut(WINDOW_S, 100_000));
        assert_eq!(t.ceiling(), 8);
        // A use reported above the ceiling never raises it.
        assert!(t.cut(2.0 * WINDOW_S, 900_000));
        assert_eq!(t.ceiling(), 6);
        for k in 3..14 {
            t.cut(k as f64 * WINDOW_S, 0);
        }
        assert_eq!(t.ceiling(), THROTTLE_MIN_PCT);
        assert!(
            !t.cut(20.0 * WINDOW_S, 0),
            "at the floor a cut changes nothing"
        );
        assert!(t.is_on());
        let mut steps = 0;
        while t.recover() {
            steps += 1;
        }
        assert!(!t.is_on());
        assert_eq!(t.ceiling(), 100);
        assert_eq!(steps, (100 - THROTTLE_MIN_PCT) / THROTTLE_STEP_PCT);
        assert!(t.cut(100.0 * WINDOW_S, 500_000));
        assert!(t.lift());
        assert!(!t.is_on() && !t.lift());
        assert!(
            t.cut(0.0, 500_000),
            "a lifted throttle may be cut again at once"
        );
    }

    #[test]
    fn a_meter_tells_what_it_added_within_another_meters_window() {
        let mut gpu = ContentionMeter::default();
        let mut young = ContentionMeter::default();
        for t in 0..5 {
            gpu.add(10);
            gpu.tick(f64::from(t));
        }
        // The young one began at 3 s with 30 ns already reported before its first tick.
        young.add(30);
        young.tick(3.0);
        young.add(20);
        young.tick(4.0);
        assert_eq!(gpu.span(), Some((0.0, 4.0)));
        assert_eq!(
            young.added_since(0.0),
            50,
            "all of it: it began after the window did"
        );
        assert_eq!(young.added_since(3.0), 20);
        assert_eq!(ContentionMeter::default().added_since(0.0), 0);
        assert_eq!(ContentionMeter::default().span(), None);
    }

    #[test]
    fn the_throttle_cuts_the_functions_that_own_the_excess_not_their_neighbours() {
        // Alone on the GPU, over its part: cut. At or under its part: never.
        assert_eq!(throttle_targets(&[(0.04, 0.004)], 0.04), [true]);
        assert_eq!(throttle_targets(&[(0.004, 0.004)], 0.03), [false]);
        // One function says it measured 90 % of wall time against a part of 0.2 %; its neighbour
        // 0.6 % against 0.2 %, over its part but a sliver of the excess: only the first is cut.
        assert_eq!(
            throttle_targets(&[(0.9, 0.002), (0.006, 0.002)], 0.906),
            [true, false]
        );
        // A large part three times over beside a small part four times over: the one that owns
        // the excess is cut, not the one with the larger ratio.
        assert_eq!(
            throttle_targets(&[(0.045, 0.015), (0.012, 0.003)], 0.057),
            [true, false]
        );
        // A function that burst and left: the window still counts it, and the neighbour that
        // stayed, over its part, owns too little of the excess to be cut.
        assert_eq!(throttle_targets(&[(0.006, 0.002)], 0.2), [false]);
        // Three that overspend alike are all cut.
        assert_eq!(
            throttle_targets(&[(0.01, 0.002), (0.01, 0.002), (0.01, 0.002)], 0.03),
            [true, true, true]
        );
        // Nonsense figures cut nobody and never panic.
        assert_eq!(throttle_targets(&[(f64::NAN, 0.002)], 0.1), [false]);
        assert_eq!(throttle_targets(&[(0.5, 0.002)], f64::NAN), [false]);
        assert!(throttle_targets(&[], 0.5).is_empty());
    }

    #[test]
    fn a_functions_raw_share_is_divided_among_its_gates() {
        let mut t = Throttle::default();
        assert_eq!(per_gate(t.ceiling(), 3), 100, "no throttle: no gate at all");
        t.cut(0.0, 300_000);
        assert_eq!(t.ceiling(), 24);
        assert_eq!(per_gate(24, 0), 24);
        assert_eq!(
            per_gate(24, 1),
            24,
            "processes sharing the grant's gate: one gate"
        );
        assert_eq!(per_gate(24, 3), 8);
        assert_eq!(per_gate(24, 5), 5, "rounded up");
        assert_eq!(
            per_gate(24, 64),
            1,
            "never 0: a process at 0 % could not run at all"
        );
        assert_eq!(raw_allowed(24, 1, 3), 24, "three processes, one gate");
        assert_eq!(raw_allowed(24, 3, 3), 24);
        assert_eq!(
            raw_allowed(24, 5, 5),
            25,
            "rounding: at most g − 1 points over"
        );
        assert_eq!(
            raw_allowed(24, 64, 64),
            29,
            "pages of 1 % for 64 gates: held to the share + 5 points"
        );
        assert_eq!(
            raw_allowed(99, 2, 2),
            98,
            "two pages of 49 %: never 100, which is no share"
        );
        assert_eq!(
            raw_allowed(24, 64, 2),
            2,
            "reports of more gates than NVML's processes do not raise it"
        );
        assert_eq!(raw_allowed(24, 3, 0), 8, "at least one gate's part");
        assert_eq!(raw_allowed(100, 3, 3), 100);
        // The pages never allow more than the watchdog: every share, every count of gates up to
        // the share + 5 and 99 (each page at least 1 %).
        for total in 1..100 {
            for gates in 1..=(total + GATE_ROUNDING_MAX_PCT).min(99) {
                let pages = gates * per_gate(total, gates);
                assert!(
                    pages <= raw_allowed(total, gates, gates),
                    "{gates} gates at {total} %: pages {pages} %"
                );
                assert!(
                    pages + gates > total,
                    "{gates} gates at {total} %: pages {pages} %, short by the gates at most"
                );
            }
        }
        assert_eq!(per_gate(49, 12), 4, "not ⌈49 / 12⌉ = 5: 12 × 5 passes 54");
    }
}
