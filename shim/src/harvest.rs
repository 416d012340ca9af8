//! Contention measurement and charging (the harvest mechanism), and the calibration of estimated
//! GPU time against the driver's own per-process accounting.
//!
//! GPU time a function uses while the training job is idle costs the trainer nothing; what slows
//! training is function GPU time that *collides* with training work. From each sampled event pair
//! the shim knows the launch's measured duration `d` and its solo cost `d0` (the smaller of the
//! cost table's floor — on an MPS GPU its solo floor, whose rise is paced in time,
//! `CostTable::solo` — and the calibrated cost, the per-sample floor times the calibration:
//! docs/harvest.md "The calibrated floor under MPS", "A solo floor that rises with time under
//! MPS"), and how long it waited for the GPU before starting when that is known. The
//! collision time of that launch is estimated as `min(c, wait) + min(c, max(0, d − d0))`, `c`
//! being what the launch is charged (its calibrated cost, at least `d0`): under time-slicing a
//! kernel that waited behind or was interleaved with the trainer's slices delayed the trainer by
//! about its own GPU time; under MPS (concurrent kernels slowing each other
//! symmetrically) the trainer lost about the function's inflation `d − d0` (docs/shim.md,
//! "Harvest").
//!
//! Owns, per device and lock-free: [`Collision`] (the current collision probability, an EWMA of
//! `collision / d0` over recent samples), [`Contention`] (the second GCRA bucket, charged
//! `cost × p` at admission and corrected after the fact), [`Calibration`] (a multiplier on
//! estimated GPU time from the driver's per-process accounting), [`UsageCounters`] and the
//! deferral decision ([`defer`]: hold a launch with slack until a busy trainer's phase ends). All pure:
//! the clock and the measurements are parameters, so tests inject them.
//!
//! Must never: allocate, lock or make a syscall; charge contention while the budget is 0 (harvest
//! off: the raw share alone applies).

use crate::gate::{Gate, SharedGate, PPM};
pub use smore_protocol::grant::{Sharing, TimingNoise};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering::*};

/// Horizon of the contention bucket (1 s; the reasoning is with its definition, shared with the
/// arbiter's request admission).
pub use smore_protocol::grant::CONTENTION_HORIZON_NS;
/// Collision probability from which a launch waits for the contention bucket: 1/8. Below it the
/// launch is charged `cost × p` but never held — the trainer is idle, the GPU time is free, and
/// holding it because of debt run up while the trainer was busy would waste exactly the idle time
/// harvesting is for (measured on the simulated GPU: holding every launch left a function 10–12 %
/// of the GPU beside a trainer idle half the time). Reasoning for 1/8: in idle phases p decays to
/// a few percent within a few samples; in busy phases it is above 1/2.
pub const HOLD_FROM_PPM: u32 = PPM / 8;
/// Weight of a new sample in the collision probability: 1/2 (reasoning: at ≤ 1 sample per ms it
/// crosses [`HOLD_FROM_PPM`] within ~3 samples after a phase change, well inside the trainer's
/// phases of tens of ms; a smaller weight held launches through a good part of each idle phase).
const COLLISION_WEIGHT_DIV: u32 = 2;
/// Age after which the collision probability is unknown: 4 ms, counted from when the sampled
/// launch ended ([`ran_until`]), not from when its sample settled (reasoning: an active function
/// is sampled every ~1 ms; older evidence — after a hold, or a request's, say — may describe the
/// other phase of a trainer whose phases last tens of ms). Launches on stale evidence are charged nothing up front
/// and their contention after the fact, from the first fresh sample.
pub const STALE_NS: u64 = 4_000_000;
/// Calibration bounds: estimated GPU time is never scaled by less than 1/4 (reasoning: the
/// estimator's bias under time-slicing is the co-runners' share of a kernel's span, well inside
/// that bound; a wild accounting answer must not unthrottle a function) nor by more than 1000.
/// The upper bound is no cap an attack can hide under: a function that poisons its cost table
/// (a kernel launched short when sampled and long otherwise, issue 12 item 10) under-states its
/// GPU time by the ratio of its long to its short launches, and the ×4 this bound used to be let
/// it hold 83 % of the GPU at a 20 % share. 1000 is the ratio of a 1 ms kernel to a 1 µs one —
/// beyond it the under-statement is below NVML's 1 % resolution at any share — and keeps the
/// factor in a `u32` of ppm.
const CALIBRATION_MIN_PPM: u32 = PPM / 4;
const CALIBRATION_MAX_PPM: u32 = PPM * 1000;
/// Weight of a new calibration observation: 1/2 (reasoning: observations are ~0.5 s apart and
/// already averaged over that window; two of them settle it).
const CALIBRATION_WEIGHT_DIV: u64 = 2;
/// The factor at most doubles per observation (reasoning: with the ×1000 bound, one window whose
/// NVML samples and estimates do not line up — a function starved of CPU, a window at start-up —
/// moved an honest function's factor by ×10 and more and held batch-sync functions to 6–7 % at
/// 10–20 %; doubling still follows a ×20 under-statement within ~5 windows, ~2.5 s).
const CALIBRATION_RISE_MAX: u64 = 2;

/// Shortest wait taken for a preemption however cheap a node says its switches are: 50 µs
/// (reasoning: below it a queue wait is launch-latency and clock-offset jitter of the event
/// pairs, a few to tens of µs; with a configured switch of 1–100 µs half a switch would take
/// that jitter for preemptions and every sample for a whole collision).
const PREEMPTION_WAIT_MIN_NS: u64 = 50_000;

/// What a sample measured beyond the node's timing noise ([`TimingNoise`]): its duration `d_ns`
/// less the stretch allowance of any stretch past its solo cost `d0_ns`, its wait less the wait
/// allowance, and its chained wait's other work less the same (one pair of timestamps, each as
/// noisy as a wait). Every collision the shim counts is judged on these. On an NVIDIA H200 the
/// jitter taken for waits and stretches made every 10–50 µs PyTorch kernel a whole collision
/// (docs/harvest.md, "Timing noise"); on the simulated GPU, whose timestamps are exact, the
/// node's allowance is 0 and this changes nothing.
pub fn beyond_noise(
    d_ns: u64,
    d0_ns: u64,
    wait_ns: Option<u64>,
    chained: Option<Chained>,
    noise: TimingNoise,
) -> (u64, Option<u64>, Option<Chained>) {
    let d = if d_ns > d0_ns {
        d_ns.saturating_sub(noise.stretch_ns()).max(d0_ns)
    } else {
        d_ns
    };
    let wait = wait_ns.map(|w| w.saturating_sub(noise.wait_ns()));
    let chained = chained.map(|c| Chained {
        others_ns: c.others_ns.saturating_sub(noise.wait_ns()),
        ..c
    });
    (d, wait, chained)
}

/// What of a sampled launch's own wait on an idle stream may count as a collision, by how the
/// arbiter says the GPU's processes share it (the grant page's [`Sharing`], never the function's
/// own reading): all of it when contexts take turns or the mode is not known (the side that
/// protects training), none under MPS — a kept wait of 0, so that the sample is still judged
/// on its stretch and its absence of one still lowers the collision probability.
///
/// Why: on a time-sliced GPU a wait is a wait for another context's slice, and the trainer
/// then waits for the launch's run. Under MPS the launch's kernel does not take the GPU from
/// anyone while it waits; what it costs the trainer is the slowing of running beside it, which
/// its stretch measures (docs/simgpu.md, "MPS mode": in the simulated model another client's
/// kernel never delays a start). On an NVIDIA H200 under MPS, beside the demo's trainer busy
/// about 10 % of the time, sampled launches waited 60 / 173 / 285 µs (p10 / p50 / p90), and
/// the shims counted all of their GPU time as collision, 72 % of it waits; the arbiter's
/// estimate sat at the budget's set point (7.5–7.6 %) while the trainer measured −2.3, 0.7 and
/// 4.0 % slower in three runs. The same traces judged on stretch alone read 0.26–0.27 of what
/// was counted (docs/harvest.md, "Waits under MPS").
pub fn wait_that_collides(wait_ns: Option<u64>, sharing: Option<Sharing>) -> Option<u64> {
    match sharing {
        Some(Sharing::Mps) => wait_ns.map(|_| 0),
        Some(Sharing::TimeSliced) | None => wait_ns,
    }
}

/// The mode a process judges its waits by: its grant page's (`page`, the arbiter's word), but MPS
/// only while NVML lists this very process as an MPS client (`client`). The page is its
/// function's, and a worker of it that runs outside the MPS server (started without the
/// server's pipe folder, say, or per request, never sampled by the arbiter) takes turns with
/// the trainer whatever the page says (found by review, 2026-11-28). A worker that is a
/// client of another server (the function's own daemon) is NVML's client too: the arbiter's
/// one-server rule takes that page back to time-sliced within a sampling round.
pub fn honoured(page: Option<Sharing>, client: bool) -> Option<Sharing> {
    match page {
        Some(Sharing::Mps) if !client => Some(Sharing::TimeSliced),
        other => other,
    }
}

/// The stretch of a launch that measured `d_ns` with solo cost `d0_ns`, bounded by `cap_ns` —
/// what the launch is charged, at least `d0_ns` ([`Collision::observe_per`] has why):
/// `min(cap, max(0, d − d0))`.
pub fn collision_ns(d_ns: u64, d0_ns: u64, cap_ns: u64) -> u64 {
    d_ns.saturating_sub(d0_ns).min(cap_ns.max(d0_ns))
}

/// The current collision probability of one device's launches, in parts per million.
#[derive(Debug, Default)]
pub struct Collision {
    p_ppm: AtomicU32,
    /// When the newest sample's launch ended ([`ran_until`]; CLOCK_MONOTONIC ns). Only moves
    /// forward: samples settle out of order.
    at: AtomicU64,
    /// The grant's shared evidence word (`smore_protocol::ledger::pack_evidence`), once attached
    /// ([`Collision::share`]); null: this process's own evidence only.
    shared: AtomicPtr<AtomicU64>,
}

/// How far ahead of the time it is asked at shared evidence may claim to be and still count:
/// 1 ms (the processes read one CLOCK_MONOTONIC; a sample ends at most its launch's span after
/// it is stamped). A word further ahead is no sample's (a process of the grant wrote it) and is
/// passed over: the process's own evidence stands.
const SHARED_AHEAD_NS: u64 = 1_000_000;

/// The words the processes of a grant share for harvesting on one device, in the grant's ledger
/// table (`smore_protocol::ledger::LedgerTable`): the collision bucket, its probe clock and the
/// newest collision evidence. Shared, a function of several processes is held as one process of
/// several threads is (docs/harvest.md, "Several processes of one function").
#[derive(Debug, Clone, Copy)]
pub struct SharedWords {
    /// The bucket's theoretical arrival time (`LedgerTable::contention`).
    pub bucket: &'static AtomicU64,
    /// When a process of the grant last probed in debt (`LedgerTable::probe`).
    pub probe: &'static AtomicU64,
    /// The grant's newest evidence (`LedgerTable::evidence`).
    pub evidence: &'static AtomicU64,
}

impl Collision {
    /// Makes `word` (the grant's evidence word) shared with this device's evidence from now on:
    /// every sample this process settles is published there, and the newest of the two is what
    /// [`Collision::evidence_at`] reads.
    pub fn share(&self, word: &'static AtomicU64) {
        self.shared
            .store(word as *const AtomicU64 as *mut _, Release);
    }

    /// The newest evidence, (when its sample ran, probability): the process's own, or the
    /// grant's shared word when that is newer and at most [`SHARED_AHEAD_NS`] past `bound`.
    #[inline]
    fn newest_by(&self, bound: u64) -> (u64, u32) {
        let own = (self.at.load(Relaxed), self.p_ppm.load(Relaxed));
        let p = self.shared.load(Acquire);
        if p.is_null() {
            return own;
        }
        // SAFETY: a non-null pointer was stored by `share` from a `&'static AtomicU64` (the
        // grant's ledger table, mapped for the process's life and never unmapped).
        let word = unsafe { &*p }.load(Relaxed);
        match smore_protocol::ledger::unpack_evidence(word) {
            Some((at, ppm)) if at > own.0 && at <= bound.saturating_add(SHARED_AHEAD_NS) => {
                (at, ppm.min(PPM))
            }
            _ => own,
        }
    }

    /// The probability as of the last sample (ppm).
    #[inline]
    pub fn ppm(&self) -> u32 {
        self.p_ppm.load(Relaxed)
    }

    /// The probability at `now`: 0 (unknown; charged after the fact) once the newest sample ran
    /// more than [`STALE_NS`] before `now`.
    #[inline]
    pub fn ppm_at(&self, now: u64) -> u32 {
        self.evidence_at(now).unwrap_or(0)
    }

    /// The newest sample as of `now` — this process's or, once shared, any process's of the
    /// grant ([`Collision::evidence_at`]'s): when its launch ended and the probability it left;
    /// `None` before any.
    #[inline]
    pub fn newest(&self, now: u64) -> Option<(u64, u32)> {
        let (at, ppm) = self.newest_by(now);
        (at != 0).then_some((at, ppm))
    }

    /// The probability at `now`; `None` before any sample, or once the newest sample ran more
    /// than [`STALE_NS`] before `now`: what the training job is doing now is not known. The
    /// newest sample is this process's or, once shared, any process's of the grant.
    #[inline]
    pub fn evidence_at(&self, now: u64) -> Option<u32> {
        let (at, ppm) = self.newest_by(now);
        if at == 0 || now.saturating_sub(at) > STALE_NS {
            None
        } else {
            Some(ppm)
        }
    }

    /// Folds a sample whose launch ended at about `ran_ns` ([`ran_until`]; the evidence is that
    /// old): `d_ns` measured, `d0_ns` solo, `wait_ns` how long it waited for the GPU
    /// before starting when known (it was submitted to an idle stream; a time-sliced GPU makes a
    /// context wait for another's slice before even its start event is processed). Its collision
    /// is `min(d0, wait) + min(d0, max(0, d − d0))`: each part at most the launch's own GPU time
    /// (a time-sliced trainer that waited lost about that), the two apart because under MPS a
    /// kernel slowed among several concurrent ones is inflated past `d0` while the trainer among
    /// them loses as much (docs/shim.md, "Harvest"). Without a known wait a
    /// sample that shows no inflation says nothing (it may have waited before its start event)
    /// and is skipped. On a time-sliced GPU whose context switches cost `switch_ns` (> 0), a
    /// wait of at least half a switch is a preemption: the launch took the GPU from another
    /// context's running work, which then waited its whole run, so the wait part is `d0` however
    /// short the wait (a trainer that ran alone past its timeslice is preempted at once, and the
    /// launch waits only the switch — measured on the simulated GPU with 250 µs switches,
    /// docs/harvest.md "Context switches"). Returns the sample's collision time.
    pub fn observe(
        &self,
        ran_ns: u64,
        d_ns: u64,
        d0_ns: u64,
        wait_ns: Option<u64>,
        switch_ns: u64,
    ) -> u64 {
        self.observe_per(ran_ns, d_ns, d0_ns, d0_ns, wait_ns, switch_ns)
    }

    /// [`Collision::observe`] with the probability taken per `charged_ns`, what a launch of solo
    /// cost `d0_ns` is charged in the gate's units (its calibrated cost): `cost × p` at admission
    /// is then the collision time the sample measured. The two differ where the calibration does
    /// — under MPS by the slowing beside the trainer, which the driver counts in the process's
    /// time (docs/harvest.md, "The calibrated floor under MPS"). The wait and the stretch
    /// beyond `d0_ns` are each bounded by the larger of the two: a function that poisons its
    /// cost floor low (a launch kept short when sampled, long otherwise) raises its calibration,
    /// and parts bounded by the poisoned floor but divided by the calibrated cost would read a
    /// whole collision as a fraction of one, below the hold threshold.
    pub fn observe_per(
        &self,
        ran_ns: u64,
        d_ns: u64,
        d0_ns: u64,
        charged_ns: u64,
        wait_ns: Option<u64>,
        switch_ns: u64,
    ) -> u64 {
        if d0_ns == 0 || charged_ns == 0 || (wait_ns.is_none() && d_ns <= d0_ns) {
            return 0;
        }
        let cap = charged_ns.max(d0_ns);
        let waited = match wait_ns {
            Some(w) if switch_ns > 0 && w >= preemption_threshold(switch_ns) => cap,
            Some(w) => w.min(cap),
            None => 0,
        };
        let c = waited + collision_ns(d_ns, d0_ns, cap);
        let f = (c as u128 * PPM as u128 / charged_ns as u128).min(PPM as u128) as u32;
        // The grant's newest evidence when shared: a sample goes on from what any process of
        // the grant saw last.
        let (at, old) = self.newest_by(ran_ns.saturating_add(STALE_NS));
        if at.saturating_sub(ran_ns) > STALE_NS {
            // It ran more than the staleness age before the newest evidence (samples settle out
            // of order): another phase of the trainer. Charged, but it says nothing about now.
            return c;
        }
        // Racy read-modify-write is fine: a lost update only delays convergence.
        let stale = ran_ns.saturating_sub(at) > STALE_NS;
        let new = if stale {
            // Old evidence is no evidence: the sample alone says what is happening now.
            f
        } else if f >= old {
            old + (f - old) / COLLISION_WEIGHT_DIV
        } else {
            old - (old - f) / COLLISION_WEIGHT_DIV
        };
        self.p_ppm.store(new, Relaxed);
        // Samples settle out of order (streams, probes): the evidence is as new as the newest.
        self.at.fetch_max(ran_ns, Relaxed);
        let p = self.shared.load(Acquire);
        if !p.is_null() {
            // SAFETY: as in `newest_by`: stored by `share` from a `&'static AtomicU64`.
            let word = unsafe { &*p };
            word.fetch_max(
                smore_protocol::ledger::pack_evidence(at.max(ran_ns), new),
                Relaxed,
            );
        }
        c
    }
}

/// What is known of when a sampled launch ran, for [`ran_until`] (CLOCK_MONOTONIC ns).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ran {
    /// Just before its start event was recorded.
    pub submitted: u64,
    /// Just after the launch call returned.
    pub launched: u64,
    /// How long its start event waited for the GPU, when known (an idle stream).
    pub wait: Option<u64>,
    /// The event pair's span, the launch call's CPU time not removed.
    pub span_ns: u64,
    /// The last time its end event was seen not yet complete (`launched` before any look).
    pub not_done_at: u64,
}

/// When a sampled launch ended, about — the age of its evidence: a sample settles when the
/// process next looks at its events, often at its next request, tens of ms later, and stamped
/// then it passed one request's collision on to the next request's launches as fresh evidence
/// (docs/harvest.md, "Serializing the functions"). A lower bound, never after `now`: with a
/// known wait the end event completed at `submitted + wait + span`; without one (the stream held
/// this process's own work, which the launch waited behind) at least its span after its start
/// event was recorded, and in any case after the last time the end event was seen pending —
/// which a blocking probe, polled every few tens of µs while later launches wait for it (the
/// runtime's wait for unmeasured launches), brings to within that period of its end, however
/// deep its stream was.
pub fn ran_until(r: Ran, now: u64) -> u64 {
    let lower = match r.wait {
        Some(w) => r.submitted.saturating_add(w).saturating_add(r.span_ns),
        None => r.launched.max(r.submitted.saturating_add(r.span_ns)),
    };
    lower.max(r.not_done_at).min(now)
}

/// The contention bucket of one device: collision time at `budget_ppm` of wall time over
/// [`CONTENTION_HORIZON_NS`].
#[derive(Debug, Default)]
pub struct Contention {
    /// The bucket: this process's own until attached to the one the grant's processes share (its
    /// theoretical arrival time in the grant's ledger table, [`Contention::share`]).
    gate: SharedGate,
    /// When a launch last probed because the bucket was in debt (ns).
    last_probe: AtomicU64,
    /// The grant's probe word, attached with the bucket (null: none): when a process of the
    /// grant last probed. A process that finds another's probe there within the period goes on
    /// that probe's measurement, which every process of the grant reads ([`Collision::share`]),
    /// instead of probing itself: with probes each, three workers in debt sent three times the
    /// unheld probes of one (at θ 2 % they slowed the trainer 2.8–3.1 %, one worker of the same
    /// load 1.3 %); with one probe per period but evidence each, the others' launches went
    /// unheld on stale evidence (4.6–5.4 %; simulated, docs/harvest.md, "Several processes of
    /// one function").
    shared_probe: AtomicPtr<AtomicU64>,
    /// What this process last wrote to the grant's probe word (ns; 0 = never): a later time
    /// there is another process's probe.
    probe_mark: AtomicU64,
}

/// What a launch of a process in debt does about probing ([`Contention::probe_in_debt`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InDebt {
    /// Go on as decided by the evidence (none needed, or fresh).
    Go,
    /// Go as a probe: sampled, and later launches wait for its measurement.
    Probe,
    /// Another process of the grant probes now, and this one has no fresh evidence: look again
    /// at this time (CLOCK_MONOTONIC ns), when the probe's measurement may be in.
    WaitUntil(u64),
}

/// How often a launch waiting for another process's probe ([`InDebt::WaitUntil`]) looks again:
/// 100 µs (a probe settles within its kernel's run and a poll of its events).
pub const PROBE_POLL_NS: u64 = 100_000;

impl Contention {
    /// Makes `word` (the grant's shared bucket, `smore_protocol::ledger::LedgerTable::contention`)
    /// this device's bucket from now on, carrying this process's own debt into it (the later
    /// arrival time of the two). Every process of a grant then charges and holds on one bucket,
    /// as they check one memory cap: with a bucket each, a function's worker processes each
    /// spent the grant's whole budget (docs/harvest.md, "Several processes of one function").
    pub fn share(&self, words: SharedWords) {
        if !self.gate.is_shared() {
            // The probe word first: a bucket that reads shared has its probe word.
            self.shared_probe
                .store(words.probe as *const AtomicU64 as *mut _, Release);
            self.gate.attach(words.bucket);
        }
    }

    /// Whether another process of the grant probed within `period` (ns) before `now`: the
    /// grant's probe word holds a time later than this process's own last mark and within the
    /// period. A time more than [`SHARED_AHEAD_NS`] ahead of `now` is no probe's (a process of
    /// the grant wrote the word) and is passed over. One or two atomic loads; always false
    /// without a shared bucket, so a process of its own probes as it always did.
    #[inline]
    pub fn probed_by_another(&self, now: u64, period: u64) -> bool {
        let p = self.shared_probe.load(Acquire);
        if p.is_null() {
            return false;
        }
        // SAFETY: a non-null pointer was stored by `share` from a `&'static AtomicU64` (the
        // grant's ledger table, mapped for the process's life and never unmapped).
        let last = unsafe { &*p }.load(SeqCst);
        last > self.probe_mark.load(SeqCst)
            && last <= now.saturating_add(SHARED_AHEAD_NS)
            && now.saturating_sub(last) <= period
    }

    /// Notes on the grant's probe word that this process probes at `now` (nothing without a
    /// shared bucket). The process's own mark first, both kept at their largest and in one
    /// order (SeqCst), so that no thread of this process reads its own probe as another's.
    #[inline]
    pub fn mark_probe(&self, now: u64) {
        let p = self.shared_probe.load(Acquire);
        if !p.is_null() {
            self.probe_mark.fetch_max(now, SeqCst);
            // SAFETY: as in `probed_by_another`.
            unsafe { &*p }.fetch_max(now, SeqCst);
        }
    }

    /// Probes at `now` after waiting in vain for another process's probe: this process's
    /// clock and the grant's word both say so.
    #[inline]
    pub fn take_probe(&self, now: u64) {
        self.last_probe.fetch_max(now, Relaxed);
        self.mark_probe(now);
    }

    /// Whether this device's bucket is the grant's shared one.
    #[inline]
    pub fn is_shared(&self) -> bool {
        self.gate.is_shared()
    }

    /// The bucket: the grant's shared one once attached, else this process's own. One atomic
    /// load.
    #[inline]
    fn bucket(&self) -> &Gate {
        self.gate.get()
    }

    /// Whether a launch at `now` with the trainer busy would wait: the bucket holds more than its
    /// horizon of debt. One atomic load.
    #[inline]
    pub fn in_debt(&self, now: u64) -> bool {
        self.bucket().in_debt(now, CONTENTION_HORIZON_NS)
    }

    /// How far the bucket's collision time is paid for ahead of `now`, ns: a launch with the
    /// trainer busy waits while this is more than [`CONTENTION_HORIZON_NS`]. Reported to the
    /// arbiter, whose request admission mirrors this bucket (docs/harvest.md, "Context
    /// switches": a mirror that drifted below it admitted requests into kernel-by-kernel holds).
    pub fn ahead_ns(&self, now: u64) -> u64 {
        self.bucket().ahead(now)
    }

    /// How much of its own work the process may have queued on the device at `now` under
    /// `budget_ppm` ([`Backlog`]) on `evidence` ([`Collision::evidence_at`]):
    /// [`BACKLOG_HORIZON_NS`], or less when the bucket has less collision time than that left
    /// before it is in debt — down to nothing beyond the launch itself when in debt, unless the
    /// evidence says the trainer is idle: then [`DEBT_BACKLOG_NS`] (with nothing queued the GPU
    /// idles for the launching thread's wake-up between kernels). Reasoning: work queued while
    /// the trainer is idle runs into its next busy phase when that starts before the queue is through, and costs it up to the whole
    /// backlog before any sample says the phase changed; such collisions are charged after the
    /// fact but never held, since the launches were admitted in the idle phase. A function
    /// whose backlog keeps colliding so runs into debt, and its backlog then shrinks to what its
    /// budget still pays for (docs/harvest.md, "Keeping the backlog short": with a fixed 4 ms
    /// horizon such a function still slowed the trainer 31 % under a 5 % budget).
    #[inline]
    pub fn backlog_horizon(&self, now: u64, budget_ppm: u32, evidence: Option<u32>) -> u64 {
        let left = CONTENTION_HORIZON_NS.saturating_sub(self.ahead_ns(now));
        let credit = expected_collision(left, budget_ppm).min(BACKLOG_HORIZON_NS);
        match evidence {
            Some(p) if p < HOLD_FROM_PPM => credit.max(DEBT_BACKLOG_NS),
            _ => credit,
        }
    }

    /// Whether a launch at `now` must probe before the process launches more: the bucket is in
    /// debt and nothing says the trainer is busy now — `evidence` is stale, at most once per
    /// [`STALE_NS`], or says the trainer is idle, at most once per [`DEBT_PROBE_NS`] (racing
    /// threads settle it by compare-and-swap). With evidence that the trainer is busy the bucket
    /// itself holds the launch.
    ///
    /// On stale evidence: without it a function whose launches come in bursts more than
    /// [`STALE_NS`] apart (a request every few tens of ms) launches every burst on stale
    /// evidence, which is charged but never held (docs/harvest.md, "Enforcement on stale
    /// evidence"). The probe is the burst's first launch; the rest wait for its measurement and
    /// are then held while the trainer is busy. A probe goes before anything says whether the
    /// trainer is busy, so it may collide for its whole cost: at one per [`STALE_NS`] a function
    /// of long kernels in debt still collides more than its budget (same section).
    ///
    /// On evidence of an idle trainer: that evidence is up to a sample period old, and the
    /// launches admitted on it run into the trainer's next busy phase until a sample that met it
    /// settles. A function in debt overspent that way; its launches then wait for a probe's
    /// measurement every [`DEBT_PROBE_NS`], so at most that much of its work goes unseen into a
    /// busy phase (docs/harvest.md, "Keeping the backlog short").
    ///
    /// When the processes of a grant share a bucket, a probe of another process within the
    /// period stands for this one's ([`Contention::probed_by_another`]): one probe per period
    /// for the function, as for the threads of one process. A launch without fresh evidence
    /// then waits for that probe's measurement ([`InDebt::WaitUntil`]; the caller bounds the
    /// wait), since without evidence nothing would hold it.
    pub fn probe_in_debt(&self, now: u64, evidence: Option<u32>) -> InDebt {
        let period = match evidence {
            None => STALE_NS,
            Some(p) if p < HOLD_FROM_PPM => DEBT_PROBE_NS,
            Some(_) => return InDebt::Go,
        };
        if !self.in_debt(now) {
            return InDebt::Go;
        }
        if self.probed_by_another(now, period) {
            return match evidence {
                Some(_) => InDebt::Go,
                None => InDebt::WaitUntil(now.saturating_add(PROBE_POLL_NS)),
            };
        }
        let last = self.last_probe.load(Relaxed);
        if now.saturating_sub(last) > period
            && self
                .last_probe
                .compare_exchange(last, now, Relaxed, Relaxed)
                .is_ok()
        {
            self.mark_probe(now);
            return InDebt::Probe;
        }
        InDebt::Go
    }

    /// Admits a launch of (calibrated) cost `cost_ns` with collision probability `p_ppm` under
    /// `budget_ppm`: returns the contention charged and when the launch may go (`None` = now).
    /// A budget of 0 (harvest off) charges and delays nothing.
    #[inline]
    pub fn admit(&self, now: u64, cost_ns: u64, p_ppm: u32, budget_ppm: u32) -> (u64, Option<u64>) {
        if budget_ppm == 0 {
            return (0, None);
        }
        let charged = expected_collision(cost_ns, p_ppm);
        if p_ppm < HOLD_FROM_PPM {
            // Most likely no collision (the trainer is idle): charged, never held.
            self.bucket().charge_ppm(now, charged, budget_ppm);
            return (charged, None);
        }
        (
            charged,
            self.bucket()
                .admit_ppm(now, charged, budget_ppm, CONTENTION_HORIZON_NS),
        )
    }

    /// After the fact: a sampled launch admitted at `admitted` was charged `charged_ns` but
    /// collided `measured_ns`; the excess is charged (later launches pay for it). Returns the
    /// excess.
    pub fn correct(
        &self,
        admitted: u64,
        charged_ns: u64,
        measured_ns: u64,
        budget_ppm: u32,
    ) -> u64 {
        let excess = measured_ns.saturating_sub(charged_ns);
        if budget_ppm > 0 && excess > 0 {
            self.bucket().charge_ppm(admitted, excess, budget_ppm);
        }
        excess
    }
}

/// How much of its own GPU work (estimated solo cost, calibrated) a harvesting function may have
/// queued on a device ahead of the GPU: the staleness age, 4 ms. Reasoning: every decision this
/// module makes about a launch — its charge `cost × p`, a hold while the trainer is busy, a
/// deferral — is taken on the evidence of when it is admitted, and holds the work only if the
/// work runs soon after. A function that queued 20 ms of kernels at once (a request's forward
/// pass and one synchronize) had them run 20 ms after their admission, in whatever phase the
/// trainer was then, unheld: it slowed a trainer 50–54 % under a 5 % budget, 58 % unheld
/// (docs/harvest.md, "Keeping the backlog short"). With at most [`STALE_NS`] queued, work runs
/// while the evidence it was admitted on is still fresh. Costs the function nothing while the
/// GPU is free: the launching thread sleeps while the GPU works through what is queued, and the
/// queue never runs dry while the thread wakes within the horizon less one kernel.
pub const BACKLOG_HORIZON_NS: u64 = STALE_NS;

/// The backlog a function in debt keeps while its evidence says the trainer is idle
/// ([`Contention::backlog_horizon`]): 250 µs. Reasoning: with nothing queued beyond the launch
/// itself the GPU idles between kernels for the launching thread's wake-up (tens of µs to a few
/// hundred on a loaded host): a function of 50 µs kernels in debt got 23 % of the GPU beside the
/// tests' trainer with none, 27 % with a floor of 1 ms and 28–29 % with 250 µs. But a floor also
/// lets a function of 500 µs kernels send more into each busy phase unseen: it slowed the trainer
/// 7.7–7.8 % with none, 8.3–9.3 % with 250 µs, 10.1–12.3 % with 1 ms (docs/harvest.md, "Keeping
/// the backlog short"). 250 µs covers a wake-up and keeps kernels of 250 µs and more to one at a
/// time.
pub const DEBT_BACKLOG_NS: u64 = 250_000;

/// How often a function in debt probes while its evidence says the trainer is idle
/// ([`Contention::probe_in_debt`]): 1 ms, the sample period (`gate::SAMPLE_PERIOD_NS`).
/// Reasoning: of such a function at most this much work goes into a trainer's busy phase before
/// a measurement says it started; a function of 500 µs kernels that kept its stream deep and was
/// held on 1 ms-old evidence alone still slowed a trainer 21 % under a 5 % budget
/// (docs/harvest.md, "Keeping the backlog short"). A probe costs the function the wait for its
/// measurement once per period, and a request its latency: in the demo's time-sliced `harvest`
/// the probes took deadline satisfaction from 69.9 to 61.5 % and SFD from 5.5 to 4.5 % (seed 7,
/// simulated; probing so only past twice the bucket's horizon: 66.4 % at 5.2 %). A function in
/// debt has overspent; the bound comes first.
pub const DEBT_PROBE_NS: u64 = crate::gate::SAMPLE_PERIOD_NS;

/// One device's backlog: when the GPU work this process has queued there would be done, at the
/// admitted launches' estimated costs ([`BACKLOG_HORIZON_NS`]). A lower bound on the real
/// backlog: beside a busy trainer the work runs slower than its solo cost. Counts every stream
/// of the process on the device as one queue (streams that run side by side drain faster; the
/// bound errs towards holding, the direction that protects the trainer). Lock-free.
#[derive(Debug, Default)]
pub struct Backlog {
    /// When the queued work would be done (CLOCK_MONOTONIC ns; at or before now: nothing queued).
    end: AtomicU64,
}

impl Backlog {
    /// Reserves the backlog's next slot for a launch of (calibrated) cost `cost_ns` at `now`,
    /// with at most `horizon_ns` of work queued, itself included ([`Contention::backlog_horizon`]):
    /// returns `None` to go now, or when to go — once the queue ahead of it is empty, for a
    /// launch longer than the horizon. One compare-and-swap, first come first served: threads
    /// launching at once each get their own slot, one behind the other, and none waits for
    /// launches reserved after it.
    #[inline]
    pub fn reserve(&self, now: u64, cost_ns: u64, horizon_ns: u64) -> Option<u64> {
        let mut old = self.end.load(Relaxed);
        loop {
            let start = old.max(now);
            let end = start.saturating_add(cost_ns);
            match self.end.compare_exchange_weak(old, end, Relaxed, Relaxed) {
                Ok(_) => {
                    let ready = end.saturating_sub(horizon_ns.max(cost_ns));
                    return (ready > now).then_some(ready);
                }
                Err(cur) => old = cur,
            }
        }
    }

    /// A reserved launch of cost `cost_ns` went only at `at` (it was held after its
    /// reservation): the queue is done no earlier than `at + cost_ns`.
    #[inline]
    pub fn went_at(&self, at: u64, cost_ns: u64) {
        self.end.fetch_max(at.saturating_add(cost_ns), Relaxed);
    }

    /// When the queued work would be done (CLOCK_MONOTONIC ns; at or before now: nothing
    /// queued): the end of the process's turn on the GPU ([`crate::turns`]).
    #[inline]
    pub fn end(&self) -> u64 {
        self.end.load(Relaxed)
    }
}

/// Streams whose last sample is kept for chained waits: 16 (reasoning: an inference function
/// uses one to a few streams per device; beyond, the one kept longest is forgotten and its
/// stream's next sample has no chained wait).
pub const MAX_CHAINS: usize = 16;

/// One settled sample of a stream, as its chain sees it ([`Chains::follow`]). Times are
/// CLOCK_MONOTONIC ns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Link {
    /// Its context.
    pub ctx: usize,
    /// Its stream's queue: the handle and whether launched through a `_ptsz` variant, or for
    /// a per-thread default stream its thread and `true`.
    pub stream: (usize, bool),
    /// When its start event was recorded.
    pub submitted: u64,
    /// When its start event completed on the GPU, when known.
    pub started: Option<u64>,
    /// Its event pair's span.
    pub span_ns: u64,
    /// The process's estimated GPU time admitted on the device before the sample
    /// ([`Usage::gpu_ns`]).
    pub pushed_before: u64,
    /// The same, the sample included.
    pub pushed_after: u64,
    /// The contention charged at admission on the device, the sample included
    /// ([`UsageCounters::admitted_contention_ns`]).
    pub paid_after: u64,
    /// How often the process's launches on the device had moved to another stream when the
    /// sample was launched: the work between two samples is the stream's own only when this did
    /// not change (other streams' work runs beside it, and would be counted as this stream's).
    pub stream_changes: u64,
}

/// How long a stream's queued work waited for the GPU between two of its samples, with the
/// stream never empty in between ([`Chains::follow`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chained {
    /// The time the GPU spent on other work (other contexts', or under MPS the slowdown beside
    /// them) while the process's own work between the samples was queued, ns.
    pub others_ns: u64,
    /// The process's own work launched between the two samples (estimated solo cost), ns.
    pub own_ns: u64,
    /// The contention charged at admission for that work and the later sample, ns.
    pub paid_ns: u64,
}

impl Chained {
    /// The part of the wait that falls to a sample of solo cost `d0_ns`: the wait spread over
    /// the work between the samples and the sample itself in proportion to their cost.
    pub fn share_of(self, d0_ns: u64) -> u64 {
        let total = self.own_ns.saturating_add(d0_ns).max(1);
        (self.others_ns as u128 * d0_ns as u128 / total as u128) as u64
    }

    /// The collision time of the work between the samples and of the later sample (measured
    /// `d_ns`, solo `d0_ns`, charged `cost_ns` — its calibrated cost, ≥ `d0_ns` where the
    /// runtime judges it): the other work the queued work waited for, up to its own cost (on a
    /// time-sliced GPU the other contexts waited for its slices about as long), and the sample's
    /// own stretch beyond `d0_ns`, each bounded by what the work is charged
    /// ([`Collision::observe_per`] has why).
    pub fn collided_with(self, d_ns: u64, d0_ns: u64, cost_ns: u64) -> u64 {
        let cap = cost_ns.max(d0_ns);
        self.others_ns
            .min(self.own_ns.saturating_add(cap))
            .saturating_add(collision_ns(d_ns, d0_ns, cap))
    }
}

/// Per stream, the last settled sample: what a sample launched behind its own queued work can
/// be judged by. Such a sample has no wait of its own to measure — its start event completes
/// when that work is done — and on a time-sliced GPU a kernel that fits in a slice is not
/// stretched: a function that kept 20 ms queued showed the trainer's slices in almost none of
/// its samples, and its shim counted a third of what its kernels cost the trainer
/// (docs/harvest.md, "Keeping the backlog short"). What such a sample does show is its stream's
/// progress. Fixed-size, no allocation.
#[derive(Debug, Default)]
pub struct Chains {
    last: [Option<Link>; MAX_CHAINS],
    /// Where the next new stream goes when every entry is taken (the oldest entry).
    next: usize,
}

impl Chains {
    /// Follows `link`'s stream from its previous sample to `link`, and keeps `link` as the
    /// stream's last. When `link` was submitted before the previous sample ended, its stream
    /// held queued work from that end to `link`'s start, and the GPU spent that interval on the
    /// process's own work launched in between (at its solo cost) and on other work: that other
    /// work is the chained wait. `None` when `link`'s own wait is known (`wait_known`: it went
    /// on an idle stream), its stream has no previous sample, or the stream may have run dry
    /// in between, or the process launched on another stream of the device in between (its
    /// work, run beside this stream's, would count as this stream's and hide the others').
    /// A sample older than its stream's last (it settled late: it was seen pending
    /// just before it ended, and a later one then seen done) is neither chained nor kept.
    pub fn follow(&mut self, link: Link, wait_known: bool) -> Option<Chained> {
        let i = self
            .last
            .iter()
            .position(|l| l.is_some_and(|l| l.ctx == link.ctx && l.stream == link.stream));
        if i.is_some_and(|i| self.last[i].is_some_and(|l| l.submitted >= link.submitted)) {
            return None;
        }
        let chained = match (i.and_then(|i| self.last[i]), link.started) {
            (Some(prev), Some(started)) if !wait_known => {
                let ended = prev.started.map(|t| t.saturating_add(prev.span_ns));
                match ended {
                    Some(ended)
                        if prev.submitted < link.submitted
                            && link.submitted < ended
                            && started >= ended
                            && prev.stream_changes == link.stream_changes =>
                    {
                        let own_ns = link.pushed_before.saturating_sub(prev.pushed_after);
                        Some(Chained {
                            others_ns: (started - ended).saturating_sub(own_ns),
                            own_ns,
                            paid_ns: link.paid_after.saturating_sub(prev.paid_after),
                        })
                    }
                    _ => None,
                }
            }
            _ => None,
        };
        let slot = match i {
            Some(i) => i,
            None => match self.last.iter().position(Option::is_none) {
                Some(free) => free,
                None => {
                    let oldest = self.next;
                    self.next = (self.next + 1) % MAX_CHAINS;
                    oldest
                }
            },
        };
        // A sample whose start is not known ends its stream's chain.
        self.last[slot] = link.started.is_some().then_some(link);
        chained
    }
}

/// The least wait or stretch that shows a context switch on a GPU whose switches cost
/// `switch_ns`: half a switch, and at least [`PREEMPTION_WAIT_MIN_NS`].
#[inline]
pub fn preemption_threshold(switch_ns: u64) -> u64 {
    (switch_ns / 2).max(PREEMPTION_WAIT_MIN_NS)
}

/// Whether a sample measured `d_ns` (solo cost `d0_ns`, waited `wait_ns` when known) shows a
/// handover between contexts on a GPU whose switches cost `switch_ns` (> 0): it waited at least
/// [`preemption_threshold`] before starting (it took the GPU from a context with work) or ran
/// that much past its solo cost (it was preempted mid-run and restored). Only such a sample is
/// charged switches ([`switch_charge`]): a sample that collided by less — a launch a few µs late,
/// a kernel a little longer than its floor — shows no switch, and charging it two would charge
/// a function of short kernels two switches for every sample whatever met it. A guard checked on
/// the simulated GPU only. (Before it, on an NVIDIA H200 a PyTorch function was charged 3.2× its
/// GPU time per request in switches. Whether the guard changes that there depends on which
/// reading of that device's collisions holds — jitter of a few tens of µs taken for waits, which
/// it drops, or waits for the trainer's timeslice of about a millisecond, which it keeps:
/// docs/real-gpu.md, section 9, point 1.)
#[inline]
pub fn shows_handover(d_ns: u64, d0_ns: u64, wait_ns: Option<u64>, switch_ns: u64) -> bool {
    let t = preemption_threshold(switch_ns);
    switch_ns > 0 && (wait_ns.is_some_and(|w| w >= t) || d_ns.saturating_sub(d0_ns) >= t)
}

/// Context switches a collision on a time-sliced GPU costs the training job: 2 — the GPU switches
/// from the trainer to the function and, when the function's work is done or its slice ends, back
/// (docs/harvest.md, "Context switches").
pub const SWITCHES_PER_COLLISION: u64 = 2;

/// What a sampled collision at `rate_ppm` (its collision time over its solo cost) that
/// [`shows_handover`] costs the training job in context switches of `switch_ns` each: one
/// handover's [`SWITCHES_PER_COLLISION`], weighted by the rate (capped at 1: a launch that met
/// the trainer for part of its run may have run in a gap between its kernels, without a
/// handover). One per settled sample that shows a handover: harvesting samples the first launch
/// of each burst (and one per `SAMPLE_PERIOD_NS` of a longer one), and a burst of a request's
/// kernels shorter than a timeslice is one handover — its later kernels run in the slice the
/// first one got. 0 when switches are free (`switch_ns` 0; an MPS GPU, where contexts do not
/// switch).
#[inline]
pub fn switch_charge(switch_ns: u64, rate_ppm: u32) -> u64 {
    expected_collision(SWITCHES_PER_COLLISION.saturating_mul(switch_ns), rate_ppm)
}

/// `cost × p`: the expected collision time of a launch.
#[inline]
pub fn expected_collision(cost_ns: u64, p_ppm: u32) -> u64 {
    (cost_ns as u128 * p_ppm.min(PPM) as u128 / PPM as u128) as u64
}

/// A multiplier on estimated GPU time (ppm; 10⁶ = ×1), from the driver's per-process accounting.
///
/// Event pairs on a time-sliced GPU include the co-runners' slices whenever a kernel's span
/// crosses a slice boundary — always, for kernels or graphs longer than a slice — and no event
/// placement can separate them. The driver's per-process utilization samples (NVML) are each
/// process's own GPU time as long as they do not overlap, so the runtime compares, over ~0.5 s
/// windows, the GPU time it estimated with what the driver measured and scales its estimates by
/// the ratio. On a time-sliced device beside other processes the runtime moves the factor only
/// as far as the window's bounds prove (`runtime::calibration_target`): on a real H200 the
/// figures counted another context's time (docs/real-gpu.md, section 8).
///
/// The first observation that raises the factor is taken in full (still at most doubling it):
/// the ×1 the factor starts from is no measurement, and averaging it in halved the first
/// correction. Under MPS a function's kernels run ~1.5× their sampled cost beside a busy trainer,
/// and the factor took ~3 s (six windows) to get there, over-running a 50 % share by 1.3–1.7 pp
/// over the first 5 s of a run (3.1 pp on a loaded CI machine; tests/e2e/tests/shim_patterns.rs).
/// A first observation that lowers it is still only averaged in: a start-up window that
/// under-measures must not unthrottle a function (the conservative direction is up).
#[derive(Debug)]
pub struct Calibration {
    ppm: AtomicU32,
    /// Whether an observation has been folded in since the factor was last ×1 by default.
    observed: AtomicBool,
}

impl Default for Calibration {
    fn default() -> Self {
        Calibration {
            ppm: AtomicU32::new(PPM),
            observed: AtomicBool::new(false),
        }
    }
}

impl Calibration {
    /// The factor now (ppm).
    #[inline]
    pub fn ppm(&self) -> u32 {
        self.ppm.load(Relaxed)
    }

    /// `estimated_ns` scaled by the factor.
    #[inline]
    pub fn apply(&self, estimated_ns: u64) -> u64 {
        (estimated_ns as u128 * self.ppm() as u128 / PPM as u128) as u64
    }

    /// Folds an observation: over comparable windows the estimates (uncalibrated) came to
    /// `estimated` GPU-ns per wall-ns and the driver measured `measured` GPU-ns per wall-ns (both
    /// as parts per million of the device). Ignored when either is zero (nothing to compare).
    pub fn observe(&self, estimated_ppm: u64, measured_ppm: u64) {
        if estimated_ppm == 0 || measured_ppm == 0 {
            return;
        }
        let seen = (measured_ppm as u128 * PPM as u128 / estimated_ppm as u128)
            .clamp(CALIBRATION_MIN_PPM as u128, CALIBRATION_MAX_PPM as u128)
            as u64;
        let old = self.ppm() as u64;
        let first = !self.observed.swap(true, Relaxed);
        let new = if seen >= old {
            let weight_div = if first { 1 } else { CALIBRATION_WEIGHT_DIV };
            (old + (seen - old) / weight_div).min(old.saturating_mul(CALIBRATION_RISE_MAX))
        } else {
            old - (old - seen) / CALIBRATION_WEIGHT_DIV
        };
        self.ppm.store(new as u32, Relaxed);
    }

    /// Back to ×1, unobserved.
    pub fn reset(&self) {
        self.ppm.store(PPM, Relaxed);
        self.observed.store(false, Relaxed);
    }
}

/// What a function's launches on one device used, as the shim estimates it: cumulative GPU time
/// and the part of it estimated to have collided with other contexts' work.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Estimated GPU time of the admitted launches, ns (calibrated cost estimates).
    pub gpu_ns: u64,
    /// Estimated collision time, ns (charged at admission as `cost × p`, plus corrections): what
    /// the contention bucket paid, never refunded.
    pub contention_ns: u64,
    /// Collision time measured on the samples, ns: for each settled sample, the collision of the
    /// launches it stands for at its measured rate — 0 where it met no training work, however
    /// much they were charged at admission (docs/harvest.md, "The estimate from what was
    /// measured"). The arbiter's slowdown estimate counts this.
    pub measured_contention_ns: u64,
    /// Time launches were held by deferral (waiting out the trainer's busy phase), ns.
    pub deferred_ns: u64,
    /// Time launches waited for their turn on the GPU, ns ([`crate::turns`]).
    pub turn_waited_ns: u64,
    /// Time launches were held for the raw share's gate, the contention bucket or the backlog
    /// bound, ns (deferral and turns are counted apart). Reported as `throttled_ns`.
    pub held_ns: u64,
    /// Launches that gave up waiting for their turn ([`crate::turns::MAX_WAIT_NS`]) and went
    /// without one.
    pub turns_given_up: u64,
    /// Launches that cut in beside another function's turn under MPS
    /// ([`crate::turns::Take::CutIn`]).
    pub turn_cut_ins: u64,
    /// Not cumulative: how far the contention bucket ran ahead of now when this was taken, ns
    /// ([`Contention::ahead_ns`]; 0 from the counters alone).
    pub contention_ahead_ns: u64,
    /// Not cumulative: the contention bucket is the grant's, shared by its processes
    /// ([`Contention::share`]); false from the counters alone.
    pub contention_shared: bool,
    /// Not cumulative: the raw share's gate is the grant's, shared by its processes
    /// ([`crate::gate::SharedGate`]); false from the counters alone.
    pub raw_shared: bool,
}

/// How long a deferred launch is held before the training job's phase is measured again: 4 ms.
/// Reasoning: a probe costs the trainer one of the function's kernels when the trainer is still
/// busy (a few hundred µs on the simulated GPU), so probing much more often than the trainer's
/// busy phases change (tens of ms) spends on probes what deferral saves; 4 ms is two of a
/// time-sliced GPU's 2 ms slices, and a request with a few ms of slack still gets one look.
pub const DEFER_QUANTUM_NS: u64 = 4_000_000;

/// What a launch does about the training job's busy phase (deadline-aware deferral,
/// docs/harvest.md, "Deferral"): a launch whose request may still start later
/// (`DeviceGrant::defer_until_ns`) waits out a busy phase instead of colliding with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Defer {
    /// Launch now (no slack, the trainer looks idle, or a probe just went).
    Run,
    /// The phase is not known: launch now as a probe — sampled, and the process's later launches
    /// wait for its measurement, which says whether it met training work.
    Probe,
    /// The trainer is busy and the request has slack: sleep until this time (CLOCK_MONOTONIC ns),
    /// then launch as a probe.
    Hold(u64),
}

/// Whether the probe after a hold ending at `hold_end` is waited for by the process's later
/// launches: only when another hold could follow it (a quantum of slack left before `until`).
/// Otherwise the request runs whatever the probe says, and waiting for its measurement only
/// delays the request — on a time-sliced GPU by a second wait for the trainer's slice, after the
/// probe's own (measured, simulated: with every such probe waited for, deferral took 3.5 pp of
/// deadline satisfaction beside a trainer busy 60 % of the time on a time-sliced GPU; without,
/// none — docs/harvest.md, "Deferral"). Its sample is still taken: it judges the hold.
pub fn probe_blocks(hold_end: u64, until: u64) -> bool {
    until.saturating_sub(hold_end) >= DEFER_QUANTUM_NS
}

/// Share of holds that must find the trainer idle afterwards for holding to go on: 1/4.
/// Reasoning: a hold that ends in an idle phase saves the request's whole collision (all its
/// kernels, 3–8 in the demo's functions); one that does not costs the request a quantum of latency
/// and its probe one kernel's collision, so holding pays from about one success in four. Beside a
/// trainer whose busy phases are long against the slack (the demo's `busy`: 50 ms phases) holds
/// succeed ~1 time in 10 and only delayed requests (measured: DSR of the admitted 95.7 → 91.8 %,
/// simulated, before this rule).
pub const DEFER_WORTH_PPM: u32 = PPM / 4;
/// While holding is not worth it, one hold per second still goes, to notice when it becomes
/// worth it again (the trainer's phases change with its job): 1 s.
pub const DEFER_EXPLORE_NS: u64 = 1_000_000_000;
/// Weight of one hold's outcome in the success rate: 1/8 (reasoning: a few holds per second per
/// busy function; the rate follows a change of the trainer's phases within a few seconds).
const DEFER_SUCCESS_WEIGHT_DIV: u32 = 8;

/// One device's deferral state: when it last probed and held, and how often a hold found the
/// trainer idle afterwards (its success rate). Lock-free; the clock is a parameter.
#[derive(Debug)]
pub struct Deferral {
    last_probe: AtomicU64,
    last_hold: AtomicU64,
    /// When the hold whose probe went ended (CLOCK_MONOTONIC ns; 0 = none): the first sample
    /// that ran after it judges it.
    judging: AtomicU64,
    success_ppm: AtomicU32,
}

impl Default for Deferral {
    fn default() -> Self {
        Deferral {
            last_probe: AtomicU64::new(0),
            last_hold: AtomicU64::new(0),
            judging: AtomicU64::new(0),
            // Unknown: as likely as not.
            success_ppm: AtomicU32::new(PPM / 2),
        }
    }
}

impl Deferral {
    /// How often a hold found the trainer idle afterwards (ppm, EWMA).
    pub fn success_ppm(&self) -> u32 {
        self.success_ppm.load(Relaxed)
    }

    /// The decision for a launch at `now` ([`defer`]) on `evidence` (the collision probability
    /// now, `None` when stale: [`Collision::evidence_at`]), after judging the previous hold by
    /// `newest` ([`Collision::newest`]: the newest sample, when it ran after the hold), and with
    /// holding allowed while it succeeds often enough ([`DEFER_WORTH_PPM`]) or once per
    /// [`DEFER_EXPLORE_NS`].
    pub fn decide(
        &self,
        now: u64,
        evidence: Option<u32>,
        newest: Option<(u64, u32)>,
        until: u64,
    ) -> Defer {
        // A hold is judged by the first sample that ran after it — its probe, typically, whose
        // measurement may settle after the request's next launches (a probe nothing waits for,
        // [`probe_blocks`]) and is then stale but still says how the hold ended; a sample that
        // ran before the hold ended says nothing about that.
        let end = self.judging.load(Relaxed);
        // Judged once, by one thread: a hold another thread stores meanwhile is not cleared.
        if end != 0
            && newest.is_some_and(|(at, _)| at >= end)
            && self
                .judging
                .compare_exchange(end, 0, Relaxed, Relaxed)
                .is_ok()
        {
            if let Some((_, p)) = newest {
                let target = if p < HOLD_FROM_PPM { PPM } else { 0 };
                let old = self.success_ppm();
                let new = if target >= old {
                    old + (target - old) / DEFER_SUCCESS_WEIGHT_DIV
                } else {
                    old - (old - target) / DEFER_SUCCESS_WEIGHT_DIV
                };
                self.success_ppm.store(new, Relaxed);
            }
        }
        let worth = self.success_ppm() >= DEFER_WORTH_PPM
            || now.saturating_sub(self.last_hold.load(Relaxed)) >= DEFER_EXPLORE_NS;
        let d = defer(now, evidence, until, self.last_probe.load(Relaxed), worth);
        match d {
            Defer::Run => {}
            Defer::Probe => self.last_probe.store(now, Relaxed),
            Defer::Hold(t) => {
                // Its probe goes when the hold ends.
                self.last_probe.store(t, Relaxed);
                self.last_hold.store(now, Relaxed);
                self.judging.store(t.max(1), Relaxed);
            }
        }
        d
    }
}

/// The deferral decision for a launch at `now`: `evidence` the collision probability of recent
/// samples (`None`: stale), `until` the request's latest start (0: no deferral), `last_probe`
/// when this device last probed, `worth` whether holds have been finding the trainer idle often
/// enough (otherwise: run). Holds for [`DEFER_QUANTUM_NS`] only while the evidence says the
/// trainer is busy (at least [`HOLD_FROM_PPM`]) and the hold ends by `until`; probes on stale
/// evidence at most once per [`STALE_NS`] (a probe whose sample says nothing must not turn every
/// launch into one), and only with at least [`DEFER_QUANTUM_NS`] of slack left (less would not
/// let a busy phase pass, and the probe's measurement costs the request latency).
pub fn defer(now: u64, evidence: Option<u32>, until: u64, last_probe: u64, worth: bool) -> Defer {
    if until <= now || !worth {
        return Defer::Run;
    }
    let slack = until - now;
    match evidence {
        None if slack >= DEFER_QUANTUM_NS && now.saturating_sub(last_probe) > STALE_NS => {
            Defer::Probe
        }
        // A hold never ends past the latest start: the request can then still run beside the
        // busy trainer in time (the arbiter's reserve; a hold of the last bit of slack only
        // turned slowed requests into missed ones — measured, docs/harvest.md).
        Some(p) if p >= HOLD_FROM_PPM && slack >= DEFER_QUANTUM_NS => {
            Defer::Hold(now + DEFER_QUANTUM_NS)
        }
        _ => Defer::Run,
    }
}

/// The atomic counters behind [`Usage`].
#[derive(Debug, Default)]
pub struct UsageCounters {
    gpu_ns: AtomicU64,
    contention_ns: AtomicU64,
    measured_contention_ns: AtomicU64,
    deferred_ns: AtomicU64,
    turn_waited_ns: AtomicU64,
    held_ns: AtomicU64,
    turns_given_up: AtomicU64,
    turn_cut_ins: AtomicU64,
    /// The part of `contention_ns` charged at admission (`cost × p`), without corrections.
    admitted_contention_ns: AtomicU64,
}

impl UsageCounters {
    /// Adds to the counters.
    #[inline]
    pub fn add(&self, gpu_ns: u64, contention_ns: u64) {
        if gpu_ns > 0 {
            self.gpu_ns.fetch_add(gpu_ns, Relaxed);
        }
        if contention_ns > 0 {
            self.contention_ns.fetch_add(contention_ns, Relaxed);
        }
    }

    /// Adds an admitted launch: its GPU time and the contention charged for it up front.
    #[inline]
    pub fn add_admitted(&self, gpu_ns: u64, contention_ns: u64) {
        self.add(gpu_ns, contention_ns);
        if contention_ns > 0 {
            self.admitted_contention_ns
                .fetch_add(contention_ns, Relaxed);
        }
    }

    /// Contention charged at admission so far ([`UsageCounters::add_admitted`]), ns.
    #[inline]
    pub fn admitted_contention_ns(&self) -> u64 {
        self.admitted_contention_ns.load(Relaxed)
    }

    /// Adds what a settled sample measured its launches collided ([`Usage::measured_contention_ns`]).
    #[inline]
    pub fn add_measured(&self, ns: u64) {
        if ns > 0 {
            self.measured_contention_ns.fetch_add(ns, Relaxed);
        }
    }

    /// Adds a deferral hold.
    #[inline]
    pub fn add_deferred(&self, ns: u64) {
        self.deferred_ns.fetch_add(ns, Relaxed);
    }

    /// Adds a hold for the raw share's gate, the contention bucket or the backlog bound (the
    /// launch path after it slept: never on the unthrottled fast path).
    #[inline]
    pub fn add_held(&self, ns: u64) {
        if ns > 0 {
            self.held_ns.fetch_add(ns, Relaxed);
        }
    }

    /// Adds a wait for a turn on the GPU ([`crate::turns`]); `gave_up`: the launch went without
    /// one.
    #[inline]
    pub fn add_turn_wait(&self, ns: u64, gave_up: bool) {
        self.turn_waited_ns.fetch_add(ns, Relaxed);
        if gave_up {
            self.turns_given_up.fetch_add(1, Relaxed);
        }
    }

    /// Adds a launch that cut in beside another function's turn ([`crate::turns::Take::CutIn`]).
    #[inline]
    pub fn add_turn_cut_in(&self) {
        self.turn_cut_ins.fetch_add(1, Relaxed);
    }

    /// A snapshot.
    pub fn get(&self) -> Usage {
        Usage {
            gpu_ns: self.gpu_ns.load(Relaxed),
            contention_ns: self.contention_ns.load(Relaxed),
            measured_contention_ns: self.measured_contention_ns.load(Relaxed),
            deferred_ns: self.deferred_ns.load(Relaxed),
            turn_waited_ns: self.turn_waited_ns.load(Relaxed),
            held_ns: self.held_ns.load(Relaxed),
            turns_given_up: self.turns_given_up.load(Relaxed),
            turn_cut_ins: self.turn_cut_ins.load(Relaxed),
            contention_ahead_ns: 0,
            contention_shared: false,
            raw_shared: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const US: u64 = 1_000;
    /// When the samples of these tests are taken.
    const T: u64 = 5_000 * MS;

    #[test]
    fn a_collision_is_charged_two_switches_at_its_rate() {
        assert_eq!(switch_charge(250 * US, PPM), 500 * US);
        assert_eq!(switch_charge(250 * US, PPM / 2), 250 * US);
        // A sample that collided past its solo cost (a wait and an inflation) is one handover.
        assert_eq!(switch_charge(250 * US, 2 * PPM), 500 * US);
        assert_eq!(switch_charge(0, PPM), 0);
        assert_eq!(switch_charge(250 * US, 0), 0);
    }

    #[test]
    fn collision_is_the_inflation_capped_at_the_solo_cost() {
        assert_eq!(collision_ns(100 * US, 100 * US, 100 * US), 0);
        assert_eq!(collision_ns(90 * US, 100 * US, 100 * US), 0);
        assert_eq!(collision_ns(130 * US, 100 * US, 100 * US), 30 * US);
        assert_eq!(collision_ns(2 * MS, 100 * US, 100 * US), 100 * US);
    }

    #[test]
    fn a_launch_while_the_trainer_is_idle_is_charged_about_nothing() {
        let (p, c) = (Collision::default(), Contention::default());
        // A training phase (every sample collided), then an idle gap (samples at the solo cost).
        for _ in 0..20 {
            p.observe(T, 2 * MS, 100 * US, None, 0);
        }
        for _ in 0..20 {
            p.observe(T, 100 * US, 100 * US, Some(0), 0);
        }
        let (charged, wait) = c.admit(T, 100 * US, p.ppm_at(T), 50_000);
        assert!(charged <= US, "{charged}");
        assert_eq!(wait, None);
    }

    #[test]
    fn a_collided_launch_is_charged_its_cost() {
        let (p, c) = (Collision::default(), Contention::default());
        for _ in 0..40 {
            // Waited 2 ms behind a trainer's slice: collided its whole solo cost.
            p.observe(T, 2 * MS + 100 * US, 100 * US, None, 0);
        }
        assert!(p.ppm() > PPM * 99 / 100, "{}", p.ppm());
        let (charged, _) = c.admit(T, 100 * US, p.ppm_at(T), 50_000);
        assert!((99 * US..=100 * US).contains(&charged), "{charged}");
    }

    #[test]
    fn a_launch_that_waited_for_another_contexts_slice_collided() {
        let p = Collision::default();
        // Ran at its solo cost, but only after waiting 1.5 ms for the GPU.
        assert_eq!(
            p.observe(T, 100 * US, 100 * US, Some(1_500 * US), 0),
            100 * US
        );
        assert_eq!(p.ppm(), PPM);
    }

    #[test]
    fn only_a_wait_or_stretch_of_half_a_switch_shows_a_handover() {
        // 150 µs switches: the threshold is 75 µs.
        assert!(shows_handover(30 * US, 30 * US, Some(80 * US), 150 * US));
        assert!(shows_handover(120 * US, 30 * US, Some(0), 150 * US));
        assert!(shows_handover(120 * US, 30 * US, None, 150 * US));
        // A tiny kernel a few tens of µs late or long collided (its whole solo cost, even) but
        // shows no switch.
        assert!(!shows_handover(30 * US, 30 * US, Some(60 * US), 150 * US));
        assert!(!shows_handover(90 * US, 30 * US, Some(10 * US), 150 * US));
        assert!(!shows_handover(90 * US, 30 * US, None, 150 * US));
        // Cheap switches: still at least 50 µs.
        assert!(!shows_handover(30 * US, 30 * US, Some(40 * US), 10 * US));
        assert!(shows_handover(30 * US, 30 * US, Some(50 * US), 10 * US));
        // Free switches (MPS, or none configured): never.
        assert!(!shows_handover(30 * US, 30 * US, Some(5_000 * US), 0));
    }

    #[test]
    fn under_mps_as_the_arbiter_says_a_wait_is_no_collision_and_a_stretch_still_is() {
        let c = Collision::default();
        let (d0, wait) = (100_000, Some(300_000));
        // Time-sliced or not known: the wait is a collision (up to the launch's cost).
        for mode in [Some(Sharing::TimeSliced), None] {
            let w = wait_that_collides(wait, mode);
            assert_eq!(w, wait, "{mode:?}");
            assert_eq!(c.observe(1, d0, d0, w, 0), d0, "{mode:?}");
        }
        // MPS: the wait counts nothing, the stretch all of itself; the sample still says "no
        // collision" when it shows no stretch (a known wait of 0, not an unknown one).
        let w = wait_that_collides(wait, Some(Sharing::Mps));
        assert_eq!(w, Some(0));
        assert_eq!(c.observe(2, d0, d0, w, 0), 0);
        assert_eq!(c.observe(3, d0 + 40_000, d0, w, 0), 40_000);
        // An unknown wait stays unknown.
        assert_eq!(wait_that_collides(None, Some(Sharing::Mps)), None);
        // The page's MPS holds only for an MPS client; a process outside the server takes
        // turns, and its waits count.
        assert_eq!(honoured(Some(Sharing::Mps), true), Some(Sharing::Mps));
        assert_eq!(
            honoured(Some(Sharing::Mps), false),
            Some(Sharing::TimeSliced)
        );
        assert_eq!(
            wait_that_collides(wait, honoured(Some(Sharing::Mps), false)),
            wait
        );
        for client in [true, false] {
            assert_eq!(
                honoured(Some(Sharing::TimeSliced), client),
                Some(Sharing::TimeSliced)
            );
            assert_eq!(honoured(None, client), None);
        }
        // A run of unstretched MPS samples lowers the probability: they are evidence.
        let p = Collision::default();
        p.observe(10, d0, d0, Some(d0), 0);
        let high = p.ppm();
        assert!(high > 0);
        for t in 11..20 {
            p.observe(
                t,
                d0,
                d0,
                wait_that_collides(Some(d0), Some(Sharing::Mps)),
                0,
            );
        }
        assert!(p.ppm() < high / 100, "{} against {high}", p.ppm());
    }

    #[test]
    fn timing_noise_is_no_collision_and_a_slice_wait_still_is() {
        let p = Collision::default();
        // The H200's jitter on a 30 µs kernel with nothing to wait for: a 90 µs wait and 50 µs
        // over its floor counted as a whole collision before; beyond the noise, none.
        let h200 = TimingNoise::H200;
        let (d, w, _) = beyond_noise(80 * US, 30 * US, Some(90 * US), None, h200);
        assert_eq!((d, w), (30 * US, Some(0)));
        assert_eq!(p.observe(T, d, 30 * US, w, 0), 0);
        assert_eq!(p.ppm(), 0);
        // A wait for a trainer's 2 ms slice is still a whole collision.
        let (d, w, _) = beyond_noise(30 * US, 30 * US, Some(2 * MS), None, h200);
        assert_eq!(w, Some(2 * MS - 100 * US));
        assert_eq!(p.observe(T, d, 30 * US, w, 0), 30 * US);
        // A stretch past the noise counts what is beyond it; a short run is left as it is.
        assert_eq!(
            beyond_noise(500 * US, 300 * US, None, None, h200).0,
            440 * US
        );
        assert_eq!(
            beyond_noise(320 * US, 300 * US, None, None, h200).0,
            300 * US
        );
        assert_eq!(
            beyond_noise(200 * US, 300 * US, None, None, h200).0,
            200 * US
        );
        // Exact timestamps (the simulated GPU's): nothing is taken off.
        let none = TimingNoise::NONE;
        assert_eq!(
            beyond_noise(80 * US, 30 * US, Some(90 * US), None, none),
            (80 * US, Some(90 * US), None)
        );
        // A chained wait's other work loses one wait's noise; what it paid is kept.
        let c = Chained {
            others_ns: 150 * US,
            own_ns: 40 * US,
            paid_ns: 7,
        };
        let (_, w, c) = beyond_noise(40 * US, 40 * US, None, Some(c), h200);
        assert_eq!(w, None);
        assert_eq!(
            c,
            Some(Chained {
                others_ns: 50 * US,
                own_ns: 40 * US,
                paid_ns: 7
            })
        );
    }

    #[test]
    fn a_wait_for_a_context_switch_is_a_preemption_and_a_whole_collision() {
        let p = Collision::default();
        // 250 µs switches: a 400 µs launch that waited one switch preempted the trainer, which
        // then waited its whole run.
        assert_eq!(
            p.observe(T, 400 * US, 400 * US, Some(251 * US), 250 * US),
            400 * US
        );
        assert_eq!(p.ppm(), PPM);
        // A wait well under a switch is jitter, taken as measured.
        let q = Collision::default();
        assert_eq!(
            q.observe(T, 400 * US, 400 * US, Some(20 * US), 250 * US),
            20 * US
        );
        // A node with very cheap switches: jitter under 50 µs is still not a preemption.
        let j = Collision::default();
        assert_eq!(
            j.observe(T, 400 * US, 400 * US, Some(30 * US), 20 * US),
            30 * US
        );
        // Without a switch cost a wait counts as measured, up to the solo cost.
        let r = Collision::default();
        assert_eq!(
            r.observe(T, 400 * US, 400 * US, Some(251 * US), 0),
            251 * US
        );
    }

    #[test]
    fn waiting_and_running_slowed_are_each_bounded_by_the_solo_cost() {
        let p = Collision::default();
        // MPS among several concurrent kernels: no wait, run 2.5× as long as alone.
        assert_eq!(p.observe(T, 250 * US, 100 * US, Some(0), 0), 100 * US);
        // Waited a slice, then ran slowed by half: both parts count.
        assert_eq!(
            p.observe(T, 150 * US, 100 * US, Some(400 * US), 0),
            150 * US
        );
        // Never more than twice the solo cost, and the probability is at most 1.
        assert_eq!(
            p.observe(T, 900 * US, 100 * US, Some(900 * US), 0),
            200 * US
        );
        assert_eq!(p.ppm(), PPM);
    }

    #[test]
    fn old_evidence_is_no_evidence() {
        let p = Collision::default();
        for _ in 0..10 {
            p.observe(T, 2 * MS, 100 * US, None, 0);
        }
        assert!(p.ppm_at(T + STALE_NS) > PPM * 99 / 100);
        assert_eq!(p.ppm_at(T + STALE_NS + 1), 0);
        // The next sample replaces it rather than being averaged with it.
        let later = T + STALE_NS + 1;
        p.observe(later, 100 * US, 100 * US, Some(0), 0);
        assert_eq!(p.ppm_at(later), 0);
    }

    #[test]
    fn evidence_is_as_new_as_the_newest_sample_whatever_order_they_settle_in() {
        let p = Collision::default();
        p.observe(T, 2 * MS, 100 * US, None, 0);
        assert_eq!(p.ppm(), PPM);
        // A sample that ran before the last one settles after it: the evidence stays as new as
        // the newer sample (the runtime stamps each with when it ran, not when it settled), and
        // within the staleness age the older one blends in rather than replacing it.
        p.observe(T - STALE_NS, 100 * US, 100 * US, Some(0), 0);
        assert_eq!(p.ppm(), PPM / 2);
        assert!(p.evidence_at(T + STALE_NS).is_some());
        assert_eq!(p.evidence_at(T + STALE_NS + 1), None);
        // One that ran more than the staleness age before the newest says nothing about now:
        // charged (its collision is returned), not folded in.
        let c = p.observe(T - STALE_NS - 1, 100 * US, 100 * US, Some(100 * US), 0);
        assert_eq!(c, 100 * US);
        assert_eq!(p.ppm(), PPM / 2);
    }

    #[test]
    fn a_sample_is_as_old_as_when_its_launch_ended_never_after_now() {
        let r = Ran {
            submitted: 10 * MS,
            launched: 10 * MS + 20 * US,
            wait: Some(2 * MS),
            span_ns: 300 * US,
            not_done_at: 10 * MS + 20 * US,
        };
        // Known wait: submitted + wait + span, however late it settles.
        assert_eq!(ran_until(r, 50 * MS), 12 * MS + 300 * US);
        // Never after now.
        assert_eq!(ran_until(r, 11 * MS), 11 * MS);
        // Seen pending later than that: it ended after.
        let seen = Ran {
            not_done_at: 20 * MS,
            ..r
        };
        assert_eq!(ran_until(seen, 50 * MS), 20 * MS);
        // Unknown wait (its stream held our own work): at least the span after the launch call,
        // and after the last time its end was seen pending — a probe polled until it settles.
        let queued = Ran {
            wait: None,
            not_done_at: 30 * MS,
            ..r
        };
        assert_eq!(ran_until(queued, 50 * MS), 30 * MS);
        let unseen = Ran { wait: None, ..r };
        assert_eq!(ran_until(unseen, 50 * MS), 10 * MS + 300 * US);
        // Saturating, not wrapping.
        let huge = Ran {
            submitted: u64::MAX - 1,
            ..r
        };
        assert_eq!(ran_until(huge, u64::MAX), u64::MAX);
    }

    #[test]
    fn a_clean_sample_of_unknown_wait_is_no_evidence() {
        let p = Collision::default();
        p.observe(T, 2 * MS, 100 * US, None, 0);
        let before = p.ppm();
        assert_eq!(p.observe(T, 100 * US, 100 * US, None, 0), 0);
        assert_eq!(p.ppm(), before);
    }

    #[test]
    fn a_stretch_is_judged_against_the_raw_floor_and_the_probability_is_per_charged_cost() {
        // Under MPS the driver counts a kernel's slowed run time, so the calibration scales a
        // 100 µs floor to 150 µs beside a trainer that keeps it 1.5× slower. Judged against the
        // calibrated floor the 150 µs sample showed no stretch at all; against the raw floor it
        // shows the 50 µs the trainer lost, and a launch charged its calibrated 150 µs × p pays
        // exactly that.
        let hidden = Collision::default();
        assert_eq!(hidden.observe(T, 150 * US, 150 * US, Some(0), 0), 0);
        let p = Collision::default();
        assert_eq!(
            p.observe_per(T, 150 * US, 100 * US, 150 * US, Some(0), 0),
            50 * US
        );
        assert_eq!(p.ppm(), PPM / 3, "the first sample is the whole evidence");
        // What 150 µs of launches charged at that rate pay: the 50 µs, to the nanosecond the
        // integer ppm allows.
        assert!(expected_collision(150 * US, PPM / 3).abs_diff(50 * US) <= 1);
        // A zero charged cost is no evidence rather than a division by zero.
        assert_eq!(p.observe_per(T, 150 * US, 100 * US, 0, Some(0), 0), 0);
    }

    #[test]
    fn a_poisoned_floor_does_not_shrink_a_whole_collision() {
        // A function that keeps its sampled launches short (a 10 µs floor) and the rest long
        // has its calibration raised ×100: its launches are charged 1 ms each. A sample that
        // waited a whole 2 ms timeslice, or one preempted through a 250 µs switch, is a whole
        // collision of what the launch is charged, not 10 µs of it.
        let p = Collision::default();
        assert_eq!(p.observe_per(T, 10 * US, 10 * US, MS, Some(2 * MS), 0), MS);
        assert_eq!(p.ppm(), PPM);
        let q = Collision::default();
        assert_eq!(
            q.observe_per(T, 10 * US, 10 * US, MS, Some(200 * US), 250 * US),
            MS
        );
        assert_eq!(q.ppm(), PPM);
        // Stretched past its floor by 3 ms: the stretch counts up to the charged cost.
        let r = Collision::default();
        assert_eq!(r.observe_per(T, 3 * MS, 10 * US, MS, Some(0), 0), MS);
    }

    #[test]
    fn the_collision_probability_reacts_within_a_few_samples() {
        let p = Collision::default();
        for _ in 0..6 {
            p.observe(T, 200 * US, 100 * US, None, 0);
        }
        assert!(p.ppm() > PPM * 8 / 10, "{}", p.ppm());
        for _ in 0..6 {
            p.observe(T, 100 * US, 100 * US, Some(0), 0);
        }
        assert!(p.ppm() < PPM * 2 / 10, "{}", p.ppm());
    }

    #[test]
    fn the_contention_bucket_paces_once_empty() {
        let c = Contention::default();
        let now = 5_000 * MS;
        // 5 % of 1 s = 50 ms of collision; launches of 1 ms that always collide.
        let mut free = 0;
        while c.admit(now, MS, PPM, 50_000).1.is_none() {
            free += 1;
            assert!(free < 1000);
        }
        assert_eq!(free, 50);
        // The 51st waited 20 ms (1 ms at 5 %); each further one 20 ms more.
        assert_eq!(c.admit(now, MS, PPM, 50_000).1, Some(now + 40 * MS));
    }

    #[test]
    fn a_launch_unlikely_to_collide_is_not_held_by_debt_but_is_charged() {
        let c = Contention::default();
        let now = 5_000 * MS;
        assert_eq!(c.correct(now, 0, 100 * MS, 50_000), 100 * MS);
        assert!(c.admit(now, MS, PPM, 50_000).1.is_some(), "in debt: held");
        assert_eq!(c.admit(now, MS, PPM / 20, 50_000), (MS / 20, None));
    }

    #[test]
    fn processes_sharing_a_grants_bucket_pay_into_one_debt() {
        let word: &'static AtomicU64 = Box::leak(Box::new(AtomicU64::new(0)));
        let words = shared_words(word);
        let (a, b) = (Contention::default(), Contention::default());
        let now = 1_000_000_000;
        // 5 %: 1 ms of collision pays for 20 ms of wall time.
        let budget = 50_000;
        // Process a owes 2 s of its own before it joins: its debt comes along.
        a.admit(now, 100_000_000, PPM, budget);
        assert!(a.in_debt(now));
        a.share(words);
        b.share(words);
        assert!(a.is_shared() && b.is_shared());
        assert!(b.in_debt(now), "b pays the debt a brought");
        assert_eq!(a.ahead_ns(now), b.ahead_ns(now));
        // What either charges, both owe.
        let before = b.ahead_ns(now);
        a.correct(now, 0, 1_000_000, budget);
        assert_eq!(b.ahead_ns(now), before + 20_000_000);
        // One probe per period for both: b, without evidence, waits for a's measurement (and
        // looks again within the poll), then probes itself once the period is over.
        let t = now + STALE_NS + 1;
        assert_eq!(a.probe_in_debt(t, None), InDebt::Probe);
        assert!(b.probed_by_another(t + 2, STALE_NS) && !a.probed_by_another(t + 2, STALE_NS));
        assert_eq!(
            b.probe_in_debt(t + 2, None),
            InDebt::WaitUntil(t + 2 + PROBE_POLL_NS)
        );
        assert_eq!(
            b.probe_in_debt(t + 2, Some(PPM / 50)),
            InDebt::Go,
            "fresh: goes on it"
        );
        assert_eq!(b.probe_in_debt(t + STALE_NS + 1, None), InDebt::Probe);
        // Then a goes on b's probe, and probes again on its own clock once that is over.
        assert!(a.probed_by_another(t + STALE_NS + 2, STALE_NS));
        assert!(matches!(
            a.probe_in_debt(t + STALE_NS + 2, None),
            InDebt::WaitUntil(_)
        ));
        assert_eq!(a.probe_in_debt(t + 2 * STALE_NS + 2, None), InDebt::Probe);
        // A word far in the future is nobody's probe: passed over, not waited on.
        words.probe.store(u64::MAX, SeqCst);
        assert!(!b.probed_by_another(t + 3 * STALE_NS, STALE_NS));
        assert_eq!(b.probe_in_debt(t + 3 * STALE_NS, None), InDebt::Probe);
        // A process of its own bucket is not touched.
        let c = Contention::default();
        assert!(!c.in_debt(now) && !c.is_shared());
    }

    fn shared_words(bucket: &'static AtomicU64) -> SharedWords {
        SharedWords {
            bucket,
            probe: Box::leak(Box::new(AtomicU64::new(0))),
            evidence: Box::leak(Box::new(AtomicU64::new(0))),
        }
    }

    #[test]
    fn the_processes_of_a_grant_read_each_others_newest_evidence() {
        let word: &'static AtomicU64 = Box::leak(Box::new(AtomicU64::new(0)));
        let (a, b) = (Collision::default(), Collision::default());
        let t = 5_000 * MS;
        // Before sharing: b knows nothing of what a measured.
        a.observe(t, 2 * MS, MS, Some(0), 0);
        assert_eq!(a.evidence_at(t), Some(PPM));
        assert_eq!(b.evidence_at(t), None);
        a.share(word);
        b.share(word);
        // a's next sample (the trainer busy: a whole collision) holds b too.
        a.observe(t + MS, 2 * MS, MS, Some(0), 0);
        assert_eq!(b.evidence_at(t + MS), Some(PPM));
        // b's own newer sample (an idle trainer) goes on from it and is what a reads next.
        b.observe(t + 2 * MS, MS, MS, Some(0), 0);
        assert_eq!(b.evidence_at(t + 2 * MS), Some(PPM / 2));
        assert_eq!(a.evidence_at(t + 2 * MS), Some(PPM / 2));
        // Stale for both after the staleness age.
        assert_eq!(a.evidence_at(t + 2 * MS + STALE_NS + 16_000), None);
        // A word claiming a sample in the future is nobody's: a process's own evidence stands.
        word.store(
            smore_protocol::ledger::pack_evidence(t + 1_000 * MS, 0),
            SeqCst,
        );
        assert_eq!(
            a.evidence_at(t + 3 * MS),
            Some(PPM),
            "a's own, from t + 1 ms"
        );
        assert_eq!(Collision::default().evidence_at(t), None);
    }

    #[test]
    fn a_function_in_debt_probes_on_stale_evidence_once_per_staleness_age() {
        let c = Contention::default();
        let now = 5_000 * MS;
        // No debt: nothing to enforce, no probe, whatever the evidence.
        assert!(!c.in_debt(now));
        assert_eq!(c.probe_in_debt(now, None), InDebt::Go);
        assert_eq!(c.probe_in_debt(now, Some(0)), InDebt::Go);
        // 100 ms of collision at 5 %: 2 s of debt, past the 1 s horizon.
        c.correct(now, 0, 100 * MS, 50_000);
        assert!(c.in_debt(now));
        // Evidence of a busy trainer: the bucket itself holds the launch.
        assert_eq!(c.probe_in_debt(now, Some(PPM)), InDebt::Go);
        // Stale: this launch probes, and the next ones within the staleness age do not (the
        // process's other launches wait for its measurement instead).
        assert_eq!(c.probe_in_debt(now, None), InDebt::Probe);
        assert_eq!(c.probe_in_debt(now + MS, None), InDebt::Go);
        assert_eq!(c.probe_in_debt(now + STALE_NS, None), InDebt::Go);
        assert_eq!(c.probe_in_debt(now + STALE_NS + 1, None), InDebt::Probe);
        // Once the debt is paid (past the horizon), stale launches go as before.
        let paid = now + 2_000 * MS;
        assert!(!c.in_debt(paid));
        assert_eq!(c.probe_in_debt(paid, None), InDebt::Go);
    }

    fn link(submitted: u64, started: u64, pushed_before: u64) -> Link {
        Link {
            ctx: 1,
            stream: (7, false),
            submitted,
            started: Some(started),
            span_ns: MS / 2,
            pushed_before,
            pushed_after: pushed_before + MS / 2,
            paid_after: pushed_before / 100,
            stream_changes: 3,
        }
    }

    #[test]
    fn a_chained_wait_is_the_streams_progress_less_its_own_work() {
        let mut c = Chains::default();
        // First sample of the stream: nothing to chain to.
        assert_eq!(c.follow(link(0, 10 * MS, 0), false), None);
        // The next one was submitted at 5 ms, before the first ended (10.5 ms): the stream held
        // work throughout. 2 ms of own work between; it started at 15.5 ms, so the GPU spent
        // 5 ms between the two, 3 of them on others.
        let chained = c.follow(link(5 * MS, 15 * MS + MS / 2, 2 * MS + MS / 2), false);
        assert_eq!(
            chained,
            Some(Chained {
                others_ns: 3 * MS,
                own_ns: 2 * MS,
                paid_ns: 25_000,
            })
        );
        let c3 = chained.unwrap();
        // The wait spread over 2 ms of work and the 0.5 ms sample: a fifth falls to the sample.
        assert_eq!(c3.share_of(MS / 2), 3 * MS / 5);
        // Collided: the others' 3 ms, capped at the 2.5 ms of own work it waited for.
        assert_eq!(c3.collided_with(MS / 2, MS / 2, MS / 2), 2 * MS + MS / 2);
        // A stretched sample adds its stretch.
        assert_eq!(c3.collided_with(MS, MS / 2, MS / 2), 3 * MS);
    }

    #[test]
    fn no_chained_wait_when_the_stream_may_have_run_dry_or_the_wait_is_known() {
        let mut c = Chains::default();
        c.follow(link(0, 10 * MS, 0), false);
        // Submitted after the previous sample ended (10.5 ms): the stream may have been empty.
        assert_eq!(c.follow(link(11 * MS, 20 * MS, 5 * MS), false), None);
        // A known wait (an idle stream) is the sample's own; the chain moves on regardless.
        assert_eq!(c.follow(link(12 * MS, 30 * MS, 6 * MS), true), None);
        assert!(c.follow(link(25 * MS, 40 * MS, 9 * MS), false).is_some());
        // A sample older than the stream's last is ignored, and the chain stays.
        assert_eq!(c.follow(link(20 * MS, 35 * MS, 8 * MS), false), None);
        assert!(c.follow(link(39 * MS, 45 * MS, 10 * MS), false).is_some());
        // Launches on another stream in between: no chain.
        let mut mixed = link(44 * MS, 50 * MS, 11 * MS);
        mixed.stream_changes = 5;
        assert_eq!(c.follow(mixed, false), None);
        // Another stream has a chain of its own.
        let mut other = link(26 * MS, 50 * MS, 10 * MS);
        other.stream = (8, false);
        assert_eq!(c.follow(other, false), None);
        // The chain goes on from the mixed sample.
        let on = |submitted, started, pushed| {
            let mut l = link(submitted, started, pushed);
            l.stream_changes = 5;
            l
        };
        assert!(c.follow(on(45 * MS, 55 * MS, 12 * MS), false).is_some());
        // A sample whose start is unknown ends the chain: the next one, submitted before the
        // last known one ended (55.5 ms) and started after, has nothing to chain to.
        let mut unknown = on(52 * MS, 0, 13 * MS);
        unknown.started = None;
        assert_eq!(c.follow(unknown, false), None);
        assert_eq!(c.follow(on(53 * MS, 60 * MS, 14 * MS), false), None);
    }

    #[test]
    fn chains_are_kept_for_a_bounded_number_of_streams() {
        let mut c = Chains::default();
        for s in 0..MAX_CHAINS + 1 {
            let mut l = link(0, 10 * MS, 0);
            l.stream = (s, false);
            c.follow(l, false);
        }
        // The first stream's entry gave way to the last one; the second's is still there.
        let next = |s: usize| {
            let mut l = link(5 * MS, 15 * MS, MS);
            l.stream = (s, false);
            l
        };
        assert!(c.follow(next(1), false).is_some());
        assert!(c.follow(next(MAX_CHAINS), false).is_some());
        assert!(c.follow(next(0), false).is_none());
    }

    #[test]
    fn a_function_in_debt_probes_every_period_while_the_trainer_looks_idle() {
        let c = Contention::default();
        let now = 5_000 * MS;
        c.correct(now, 0, 100 * MS, 50_000);
        let idle = Some(PPM / 50);
        assert_eq!(c.probe_in_debt(now, idle), InDebt::Probe);
        assert_eq!(c.probe_in_debt(now + DEBT_PROBE_NS, idle), InDebt::Go);
        assert_eq!(
            c.probe_in_debt(now + DEBT_PROBE_NS + 1, idle),
            InDebt::Probe
        );
        // Out of debt an idle trainer's time is free: no probes.
        assert_eq!(c.probe_in_debt(now + 2_000 * MS, idle), InDebt::Go);
    }

    #[test]
    fn the_backlog_horizon_shrinks_with_the_budget_left_and_holds_launches_past_it() {
        let c = Contention::default();
        let now = 5_000 * MS;
        let (busy, idle) = (Some(PPM), Some(PPM / 50));
        assert_eq!(c.backlog_horizon(now, 50_000, busy), BACKLOG_HORIZON_NS);
        // 49 ms of the bucket's 50 ms spent: 1 ms left.
        c.correct(now, 0, 49 * MS, 50_000);
        assert_eq!(c.backlog_horizon(now, 50_000, busy), MS);
        // In debt: nothing beyond the launch itself, unless the trainer looks idle (then what
        // the probes in debt let go unseen).
        c.correct(now, 0, 10 * MS, 50_000);
        assert_eq!(c.backlog_horizon(now, 50_000, busy), 0);
        assert_eq!(c.backlog_horizon(now, 50_000, None), 0);
        assert_eq!(c.backlog_horizon(now, 50_000, idle), DEBT_BACKLOG_NS);
        let b = Backlog::default();
        // 3 ms queued: a 1 ms launch fits a 4 ms horizon, the next 1 ms one waits 1 ms for
        // its turn (its slot ends 5 ms out).
        assert_eq!(b.reserve(now, 3 * MS, 4 * MS), None);
        assert_eq!(b.reserve(now, MS, 4 * MS), None);
        assert_eq!(b.reserve(now, MS, 4 * MS), Some(now + MS));
        // Slots are first come first served: a long launch waits for the queue ahead of it
        // (5 ms), and the next one for the long one too.
        assert_eq!(b.reserve(now, 9 * MS, 4 * MS), Some(now + 5 * MS));
        assert_eq!(b.reserve(now, MS, 0), Some(now + 14 * MS));
        // A launch held after its reservation moves the end out to its own.
        b.went_at(now + 20 * MS, MS);
        assert_eq!(b.reserve(now, MS, 4 * MS), Some(now + 18 * MS));
        // Work reserved after the queue drained starts from then, not from the old end.
        assert_eq!(b.reserve(now + 100 * MS, MS, 0), None);
        assert_eq!(b.reserve(now + 100 * MS, MS, 0), Some(now + 101 * MS));
    }

    #[test]
    fn threads_reserving_at_once_each_get_a_slot_of_their_own() {
        let b = std::sync::Arc::new(Backlog::default());
        let now = 5_000 * MS;
        let readies: Vec<Option<u64>> = (0..8)
            .map(|_| {
                let b = b.clone();
                std::thread::spawn(move || b.reserve(now, MS, 2 * MS))
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect();
        let mut at: Vec<u64> = readies.iter().map(|r| r.unwrap_or(now)).collect();
        at.sort_unstable();
        // Two go at once (2 ms of room), then one per millisecond: never more than the
        // horizon queued.
        let want: Vec<u64> = [0, 0, 1, 2, 3, 4, 5, 6]
            .iter()
            .map(|k| now + k * MS)
            .collect();
        assert_eq!(at, want);
    }

    #[test]
    fn harvest_off_charges_and_delays_nothing() {
        let c = Contention::default();
        for _ in 0..10_000 {
            assert_eq!(c.admit(5_000 * MS, MS, PPM, 0), (0, None));
        }
        assert_eq!(c.correct(5_000 * MS, 0, MS, 0), MS);
        assert_eq!(c.admit(5_000 * MS, MS, 0, 50_000), (0, None));
    }

    #[test]
    fn more_contention_than_charged_is_charged_after_the_fact() {
        let c = Contention::default();
        let now = 5_000 * MS;
        // Charged nothing (p = 0), measured 50 ms of collision: the bucket (50 ms) is spent.
        assert_eq!(c.correct(now, 0, 50 * MS, 50_000), 50 * MS);
        assert!(c.admit(now, MS, PPM, 50_000).1.is_some());
    }

    #[test]
    fn calibration_scales_estimates_to_the_measured_gpu_time() {
        let k = Calibration::default();
        assert_eq!(k.apply(1000), 1000);
        // Estimates read 56 % of the device, the driver measured 50 %.
        for _ in 0..12 {
            k.observe(560_000, 500_000);
        }
        let f = k.ppm() as f64 / PPM as f64;
        assert!((f - 50.0 / 56.0).abs() < 0.001, "{f}");
        // Nothing to compare: unchanged.
        k.observe(0, 500_000);
        k.observe(560_000, 0);
        assert!((k.ppm() as f64 / PPM as f64 - f).abs() < 1e-9);
    }

    #[test]
    fn a_gross_under_statement_is_followed_past_the_old_bound_at_most_doubling_per_window() {
        // A poisoned cost table: the estimates admitted 4 % of the device, the driver measured
        // 80 % (a 1 ms kernel charged as its 50 µs launches): ×20.
        let k = Calibration::default();
        let mut seen = Vec::new();
        for _ in 0..8 {
            k.observe(40_000, 800_000);
            seen.push(k.ppm() / PPM);
        }
        assert_eq!(seen[..4], [2, 4, 8, 14], "at most doubling per window");
        assert!(k.ppm() >= 19 * PPM, "beyond the old ×4 bound: {}", k.ppm());
        // An honest function's noise (×1.2) still moves it half way, once the first
        // observation has replaced the ×1 it started from.
        let h = Calibration::default();
        h.observe(500_000, 500_000);
        h.observe(500_000, 600_000);
        assert_eq!(h.ppm(), PPM + PPM / 10);
    }

    #[test]
    fn the_first_observation_that_raises_the_factor_is_taken_in_full() {
        // Under MPS beside a busy trainer a function's kernels ran ×1.5 their sampled cost.
        let k = Calibration::default();
        k.observe(340_000, 510_000);
        assert_eq!(k.ppm(), PPM * 3 / 2);
        // Later ones are averaged in.
        k.observe(340_000, 340_000);
        assert_eq!(k.ppm(), PPM * 5 / 4);
        // Still at most doubling.
        let d = Calibration::default();
        d.observe(100_000, 800_000);
        assert_eq!(d.ppm(), 2 * PPM);
        // A first observation that lowers it is only averaged in (the unthrottling direction).
        let l = Calibration::default();
        l.observe(500_000, 250_000);
        assert_eq!(l.ppm(), PPM * 3 / 4);
        // After a reset the next observation is a first one again.
        k.reset();
        k.observe(400_000, 600_000);
        assert_eq!(k.ppm(), PPM * 3 / 2);
    }

    #[test]
    fn calibration_is_bounded() {
        let k = Calibration::default();
        for _ in 0..64 {
            k.observe(1, 1_000_000);
        }
        assert!(k.ppm().abs_diff(CALIBRATION_MAX_PPM) <= 1, "{}", k.ppm());
        for _ in 0..64 {
            k.observe(1_000_000, 1);
        }
        assert!(k.ppm().abs_diff(CALIBRATION_MIN_PPM) <= 1, "{}", k.ppm());
    }

    #[test]
    fn a_launch_with_slack_waits_out_a_busy_trainer_in_quanta_up_to_its_latest_start() {
        let until = T + 10 * MS;
        let busy = Some(PPM);
        assert_eq!(
            defer(T, busy, until, 0, true),
            Defer::Hold(T + DEFER_QUANTUM_NS)
        );
        assert_eq!(
            defer(until - DEFER_QUANTUM_NS, busy, until, 0, true),
            Defer::Hold(until)
        );
        // Less slack than a hold: run now, while the request can still make it beside the
        // busy trainer.
        assert_eq!(defer(until - MS, busy, until, 0, true), Defer::Run);
        // At or past it: the request must run, whatever the trainer does (the budget applies).
        assert_eq!(defer(until, busy, until, 0, true), Defer::Run);
        assert_eq!(defer(until + MS, busy, until, 0, true), Defer::Run);
    }

    #[test]
    fn an_idle_trainer_or_no_deadline_means_no_deferral() {
        let until = T + 10 * MS;
        assert_eq!(defer(T, Some(0), until, 0, true), Defer::Run);
        assert_eq!(
            defer(T, Some(HOLD_FROM_PPM - 1), until, 0, true),
            Defer::Run
        );
        // No deadline written (deferral off): never held, never probed.
        assert_eq!(defer(T, Some(PPM), 0, 0, true), Defer::Run);
        // Holding not worth it (holds have not been finding the trainer idle): neither.
        assert_eq!(defer(T, Some(PPM), until, 0, false), Defer::Run);
        assert_eq!(defer(T, None, until, 0, false), Defer::Run);
        assert_eq!(defer(T, None, 0, 0, true), Defer::Run);
    }

    #[test]
    fn an_unknown_phase_is_probed_at_most_once_per_staleness_period() {
        let until = T + 10 * MS;
        assert_eq!(defer(T, None, until, 0, true), Defer::Probe);
        // A probe that just went (its sample may say nothing): the next launches run.
        assert_eq!(defer(T + MS, None, until, T, true), Defer::Run);
        assert_eq!(defer(T + STALE_NS + 1, None, until, T, true), Defer::Probe);
        // Too little slack left for a hold to help: no probe either.
        assert_eq!(defer(until - MS, None, until, 0, true), Defer::Run);
    }

    #[test]
    fn holding_stops_when_holds_rarely_find_the_trainer_idle_and_is_tried_again_each_second() {
        let d = Deferral::default();
        let until = |now: u64| now + 10 * MS;
        let mut now = T;
        // Beside a trainer whose busy phases outlast every hold: each hold's probe finds it busy
        // (judged at the next decision).
        let mut holds = 0;
        for _ in 0..40 {
            match d.decide(now, Some(PPM), Some((now, PPM)), until(now)) {
                Defer::Hold(t) => {
                    holds += 1;
                    now = t;
                }
                _ => now += MS,
            }
        }
        assert!(d.success_ppm() < DEFER_WORTH_PPM, "{}", d.success_ppm());
        assert!((2..=8).contains(&holds), "{holds} holds");
        // No longer worth it: busy evidence, slack, and still it runs.
        assert_eq!(
            d.decide(now, Some(PPM), Some((now, PPM)), until(now)),
            Defer::Run
        );
        // A second after the last hold, one more is tried.
        now += DEFER_EXPLORE_NS;
        let Defer::Hold(t) = d.decide(now, Some(PPM), Some((now, PPM)), until(now)) else {
            panic!("no hold a second after the last");
        };
        now = t;
        // Beside a trainer whose phases do end within a hold, holding comes back: each hold's
        // probe, which runs when the hold ends, finds the trainer idle.
        for _ in 0..40 {
            let _ = d.decide(now, Some(0), Some((now, 0)), until(now));
            now += 5 * MS;
            if let Defer::Hold(t) = d.decide(now, Some(PPM), Some((now, PPM)), until(now)) {
                now = t;
            }
        }
        assert!(d.success_ppm() >= DEFER_WORTH_PPM, "{}", d.success_ppm());
    }

    #[test]
    fn a_holds_last_probe_is_not_waited_for_and_the_hold_is_judged_by_later_evidence() {
        let until = T + 10 * MS;
        // Another hold fits after this one: the later launches wait for the probe to decide.
        assert!(probe_blocks(T + DEFER_QUANTUM_NS, until));
        assert!(probe_blocks(until - DEFER_QUANTUM_NS, until));
        // None fits: the request runs whatever the probe says, so nothing waits for it.
        assert!(!probe_blocks(until - DEFER_QUANTUM_NS + 1, until));
        assert!(!probe_blocks(until, until));
        // The probe's measurement arrives after the request's next launches decided on stale
        // evidence: the hold is judged by it then, not forgotten.
        let d = Deferral::default();
        let before = d.success_ppm();
        assert!(matches!(
            d.decide(T, Some(PPM), Some((T, PPM)), until),
            Defer::Hold(_)
        ));
        let after_hold = T + DEFER_QUANTUM_NS + 1;
        assert_eq!(
            d.decide(after_hold, None, Some((T, PPM)), until),
            Defer::Run
        );
        assert_eq!(
            d.success_ppm(),
            before,
            "a sample that ran before the hold ended judges nothing"
        );
        // The probe, which ran when the hold ended, settles late: stale by now, it still judges.
        let probe_ran = T + DEFER_QUANTUM_NS + 50 * US;
        let late = probe_ran + 3 * STALE_NS;
        let _ = d.decide(late, None, Some((probe_ran, 0)), T + 100 * MS);
        assert!(d.success_ppm() > before, "{}", d.success_ppm());
        // Judged once.
        let judged = d.success_ppm();
        let _ = d.decide(late + MS, Some(0), Some((late + MS, 0)), 0);
        assert_eq!(d.success_ppm(), judged);
    }

    #[test]
    fn evidence_is_none_before_any_sample_and_once_stale() {
        let p = Collision::default();
        assert_eq!(p.evidence_at(T), None);
        p.observe(T, 2 * MS, 100 * US, None, 0);
        assert_eq!(p.evidence_at(T + STALE_NS), Some(p.ppm()));
        assert_eq!(p.evidence_at(T + STALE_NS + 1), None);
    }

    #[test]
    fn usage_counts_gpu_and_contention_time() {
        let u = UsageCounters::default();
        u.add(100, 0);
        u.add(50, 20);
        u.add_deferred(4_000);
        u.add_turn_wait(300, false);
        u.add_turn_wait(700, true);
        u.add_held(2_500);
        u.add_held(0);
        u.add_held(500);
        u.add_turn_cut_in();
        u.add_turn_cut_in();
        u.add_measured(0);
        u.add_measured(7);
        assert_eq!(
            u.get(),
            Usage {
                gpu_ns: 150,
                contention_ns: 20,
                measured_contention_ns: 7,
                deferred_ns: 4_000,
                turn_waited_ns: 1_000,
                held_ns: 3_000,
                turns_given_up: 1,
                turn_cut_ins: 2,
                contention_ahead_ns: 0,
                contention_shared: false,
                raw_shared: false,
            }
        );
    }
}
