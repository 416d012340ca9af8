//! Launch gating: hold a process's GPU time to `share` of every window by pacing the launches it
//! submits, each charged its estimated GPU time.
//!
//! Owns three lock-free pieces, all pure (the clock is a parameter, so tests inject it):
//! - [`Gate`]: a token bucket of GPU time kept as one atomic "theoretical arrival time" (GCRA).
//!   Refill is `share` GPU-ns per wall-ns; capacity is `share × window`. A launch of estimated cost
//!   `c` moves the TAT by `c / share`; if the TAT then lies more than one window ahead of now the
//!   caller sleeps until it does not. Work submitted by time t is therefore at most
//!   `share × (t + window)`: the queued-but-unrun work a burst can build is bounded by the bucket.
//! - [`SharedGate`]: a gate that is the process's own until it is attached to the word its grant's
//!   processes share (in the grant's ledger table), so that a function of several processes is
//!   held as one process of several threads is: the raw share's gate and the collision bucket.
//! - [`CostTable`]: fixed-size open-addressed table CUfunction / CUgraphExec → estimated GPU ns,
//!   learned from sampled event pairs (no allocation, no lock; a key the table has no room for
//!   stays unmeasured and is sampled on each launch, see `Runtime::launch`), and beside it a solo
//!   floor whose rise is paced in time, which an MPS GPU's samples are judged against.
//! - [`SampleClock`]: claims at most one sample per period per process — the first launch after
//!   it, or (under a raw share) a launch drawn at random, so a function cannot choose which of its
//!   launches is measured.
//!
//! Must never: allocate, lock or make a syscall (the caller does the sleep, with an absolute
//! deadline), or sleep a launch of a share-100 device.

use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering::*};

/// At most one sampled (event-pair) launch per 1 ms per process. Source: Olympian's 1–2 ms
/// GPU-time quanta (Hu et al., Middleware 2018); recording an event costs a few µs of CPU
/// (reasoning: a driver call of the same class as a launch), so sampling at ≤ 1 kHz costs
/// ≤ 0.5 % of a core even for 10 µs-kernel workloads.
pub const SAMPLE_PERIOD_NS: u64 = 1_000_000;
/// Slots in the cost table (power of two). 4096 × 16 B = 64 KiB; PyTorch models launch a few
/// hundred distinct kernels (reasoning), so the load factor stays low.
pub const COST_SLOTS: usize = 4096;
/// Linear-probe limit before giving up on a key (it then stays unmeasured).
const MAX_PROBE: usize = 16;

/// Parts per million of one percent.
const PPM_PER_PCT: u32 = 10_000;
/// Parts per million of the whole.
pub const PPM: u32 = 1_000_000;

fn pct_to_ppm(pct: u32) -> u32 {
    pct.clamp(1, 100) * PPM_PER_PCT
}

/// Wall time `cost_ns` pays for at `rate_ppm` of wall time, rounded up.
fn wall_of(cost_ns: u64, rate_ppm: u32) -> u64 {
    let rate = rate_ppm.clamp(1, PPM) as u64;
    (cost_ns as u128 * PPM as u128)
        .div_ceil(rate as u128)
        .min(u64::MAX as u128) as u64
}

/// The GCRA token bucket of one device.
#[derive(Debug, Default)]
#[repr(transparent)]
pub struct Gate {
    /// Theoretical arrival time (ns, CLOCK_MONOTONIC): when the work admitted so far would have
    /// been paid for at the share rate.
    tat: AtomicU64,
}

impl Gate {
    /// The bucket whose theoretical arrival time is `word` (one that lives elsewhere: the
    /// collision bucket a grant's processes share in its ledger table). CLOCK_MONOTONIC is one
    /// clock for every process of the node, so processes may share the word.
    pub fn of(word: &AtomicU64) -> &Gate {
        // SAFETY: `Gate` is `repr(transparent)` over one `AtomicU64`, so a reference to the word
        // is a valid reference to a `Gate` of the same lifetime.
        unsafe { &*(word as *const AtomicU64).cast::<Gate>() }
    }

    /// A full bucket (no debt).
    pub fn new() -> Gate {
        Gate::default()
    }

    /// Admits a launch of `cost_ns` GPU time at wall time `now` under `share_pct` of `window_ns`.
    /// Returns `None` to launch now, or `Some(deadline)`: sleep until that CLOCK_MONOTONIC instant,
    /// then launch. The charge is taken either way (the launch will happen).
    #[inline]
    pub fn admit(&self, now: u64, cost_ns: u64, share_pct: u32, window_ns: u64) -> Option<u64> {
        if share_pct >= 100 {
            return None;
        }
        self.admit_ppm(now, cost_ns, pct_to_ppm(share_pct), window_ns)
    }

    /// As [`Gate::admit`], at a rate of `rate_ppm` parts per million of wall time (1..=10⁶; the
    /// contention bucket's budgets are far below one percent). `window_ns` is the bucket's
    /// horizon: capacity is `rate × window`.
    #[inline]
    pub fn admit_ppm(&self, now: u64, cost_ns: u64, rate_ppm: u32, window_ns: u64) -> Option<u64> {
        // Wall time this much GPU time pays for at the rate (rounded up).
        let wall = wall_of(cost_ns, rate_ppm);
        let mut old = self.tat.load(Acquire);
        loop {
            // An idle bucket refills to full capacity, never beyond: debt never goes negative.
            let base = old.max(now);
            let new = base.saturating_add(wall);
            match self.tat.compare_exchange_weak(old, new, AcqRel, Acquire) {
                Ok(_) => {
                    // Allowed while the TAT is no more than one window ahead of now.
                    let ready = new.saturating_sub(window_ns);
                    return (ready > now).then_some(ready);
                }
                Err(cur) => old = cur,
            }
        }
    }

    /// Whether a launch at `now` would wait: the work admitted so far is paid for more than
    /// `window_ns` ahead of now. One atomic load.
    #[inline]
    pub fn in_debt(&self, now: u64, window_ns: u64) -> bool {
        self.tat.load(Acquire) > now.saturating_add(window_ns)
    }

    /// How far the admitted work is paid for ahead of `now`, ns (0: nothing owed). One atomic
    /// load.
    #[inline]
    pub fn ahead(&self, now: u64) -> u64 {
        self.tat.load(Acquire).saturating_sub(now)
    }

    /// Charges `cost_ns` of GPU time learnt after the fact (a launch that cost more than its
    /// estimate) without admitting anything: later launches wait until it is paid for.
    pub fn charge(&self, now: u64, cost_ns: u64, share_pct: u32) {
        self.charge_ppm(now, cost_ns, pct_to_ppm(share_pct.clamp(1, 100)));
    }

    /// As [`Gate::charge`], at a rate in parts per million.
    pub fn charge_ppm(&self, now: u64, cost_ns: u64, rate_ppm: u32) {
        let wall = wall_of(cost_ns, rate_ppm);
        let _ = self.tat.fetch_update(AcqRel, Acquire, |old| {
            Some(old.max(now).saturating_add(wall))
        });
    }

    /// Forgets all debt (fork child, share change to 100).
    pub fn reset(&self) {
        self.tat.store(0, Release);
    }
}

/// A [`Gate`] that is this process's own until [`SharedGate::attach`]ed to a word every process
/// of its grant charges (the grant's ledger table, `smore_protocol::ledger::LedgerTable::raw` and
/// `contention`). CLOCK_MONOTONIC is one clock for every process of the node (outside a time
/// namespace of its own: docs/shim.md), so their launches pay one bucket: a function's workers
/// get one share, not one each (docs/shim.md, "One share per grant").
#[derive(Debug, Default)]
pub struct SharedGate {
    /// This process's own bucket: the gate until attached.
    own: Gate,
    /// The grant's word once attached (null: `own`). Only ever set from a `&'static AtomicU64`.
    shared: AtomicPtr<AtomicU64>,
}

impl SharedGate {
    /// A full bucket of this process's own.
    pub fn new() -> SharedGate {
        SharedGate::default()
    }

    /// Makes `word` the gate from now on, carrying this process's own debt into it (the later
    /// arrival time of the two: what this process admitted before it attached stays owed).
    /// Attaches once: later calls, and a racing second one, change nothing.
    pub fn attach(&self, word: &'static AtomicU64) {
        if self.is_shared() {
            return;
        }
        word.fetch_max(self.own.tat.load(Acquire), AcqRel);
        let attached = self.shared.compare_exchange(
            std::ptr::null_mut(),
            word as *const AtomicU64 as *mut AtomicU64,
            AcqRel,
            Acquire,
        );
        if attached.is_ok() {
            // What another thread admitted on the own gate between the carry and the switch.
            word.fetch_max(self.own.tat.load(Acquire), AcqRel);
        }
    }

    /// Whether the gate is the grant's shared word. One atomic load.
    #[inline]
    pub fn is_shared(&self) -> bool {
        !self.shared.load(Acquire).is_null()
    }

    /// The gate: the grant's shared word once attached, else this process's own. One atomic
    /// load.
    #[inline]
    pub fn get(&self) -> &Gate {
        let p = self.shared.load(Acquire);
        if p.is_null() {
            &self.own
        } else {
            // SAFETY: a non-null pointer was stored by `attach` from a `&'static AtomicU64` (the
            // grant's ledger table, mapped for the process's life and never unmapped).
            Gate::of(unsafe { &*p })
        }
    }
}

/// CUfunction / CUgraphExec → estimated GPU ns. Keys are handle addresses (never 0).
pub struct CostTable {
    keys: Box<[AtomicU64]>,
    /// What a launch is charged (before calibration): the floor, rising per sample.
    costs: Box<[AtomicU64]>,
    /// The solo floor: the same samples, rising by at most one step per [`SOLO_RISE_INTERVAL_NS`].
    solos: Box<[AtomicU64]>,
    /// When each slot's solo floor last rose (CLOCK_MONOTONIC ns; 0: never).
    solo_rose_at: Box<[AtomicU64]>,
    /// When each slot last had a sample at or below its solo floor (CLOCK_MONOTONIC ns).
    solo_seen_at: Box<[AtomicU64]>,
}

impl Default for CostTable {
    fn default() -> Self {
        Self::new()
    }
}

/// A sample above the estimate raises it by at most 1/32 of itself (≈ 3 %; reasoning: bounds
/// what one inflated sample can add, while a real doubling is followed: × 1.7 in 23 samples,
/// × 1.9 in ≈ 40).
const RISE_DIVISOR: u64 = 32;

/// The solo floor ([`CostTable::solo`]) rises by at most one bounded step (1/32 of itself) per
/// 20 ms, however many samples above it come meanwhile, as long as samples at or below it keep
/// coming ([`SOLO_CATCH_UP_NS`]); it falls at every sample below, as the cost does. Reasoning: beside a
/// trainer that hardly idles on an MPS GPU nearly every sample is slowed, and rising per sample
/// the floor settled well above the solo cost (simulated, trainer busy ~93 %: the slowing the
/// shim measured against it read 2.8 % where the trainer lost 4.9 %, docs/harvest.md "A solo
/// floor that rises with time under MPS"); paced, the few solo samples hold it near the solo
/// cost.
pub const SOLO_RISE_INTERVAL_NS: u64 = 20_000_000;
/// With no sample at or below the solo floor for 100 ms it rises per sample again, as the cost
/// does, until one comes: a kernel whose cost really grew (a larger input under the same handle)
/// has no sample near its old floor, and paced it would take ~0.8 s to double, every sample
/// meanwhile read as a collision (found by review: an honest function held for a trainer that
/// was idle). Beside the simulator's busy trainer (10 × 5 ms kernels and 4 ms of host work per
/// iteration) a kernel sampled each millisecond meets an idle gap every ~54 ms, within it; a
/// trainer whose busy stretches last longer than 100 ms makes the floor catch up in each of them
/// (docs/harvest.md, "A solo floor that rises with time under MPS").
pub const SOLO_CATCH_UP_NS: u64 = 100_000_000;

fn slot_of(key: u64) -> usize {
    // Fibonacci hashing; handles are 8/16-byte aligned.
    (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 52) as usize & (COST_SLOTS - 1)
}

/// Folds a sample into an estimate — the kernel's solo cost, a floor: falls fast, rises slowly and
/// by a bounded step. On a time-sliced GPU the time between two events around a kernel is the
/// kernel's own execution *plus* every timeslice the GPU gave other contexts meanwhile (a
/// training job's kernels), and a kernel launched on an idle stream may wait behind another
/// context's kernel after its start event completed; so samples above the estimate are mostly
/// inflated by co-runners, and samples below it are closer to the truth. Charging inflated samples
/// would throttle a function for time the trainer used (measured on the simulated GPU: at share
/// 15 % beside a trainer busy 72 %, a function using 5 % of the GPU saw its P50 go from 3.6 to
/// 45 ms).
///
/// A sample above moves the estimate 1/16 of the way but by at most 1/32 of the estimate
/// ([`RISE_DIVISOR`]): a 10 µs kernel sampled after waiting 250 µs behind a trainer kernel used to
/// jump to 25 µs and take several clean samples to come back, so batches of short kernels with a
/// sync each were overcharged ~1.5× (held to 10 % they got 6.5–7.8 %, docs/shim.md). A kernel
/// whose real cost grows is still followed: × 1.9 in ≈ 40 samples (tens of ms at 1 kHz sampling).
fn ewma(old: u64, sample: u64) -> u64 {
    if old == 0 {
        sample
    } else if sample <= old {
        (old + sample * 3) / 4
    } else {
        old + ((sample - old) / 16).min(old.div_ceil(RISE_DIVISOR))
    }
}

impl CostTable {
    /// An empty table: every key unmeasured.
    pub fn new() -> CostTable {
        CostTable {
            keys: (0..COST_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            costs: (0..COST_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            solos: (0..COST_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            solo_rose_at: (0..COST_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            solo_seen_at: (0..COST_SLOTS).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// The learned cost of `key`, if it was ever measured: what a launch of it is charged, before
    /// calibration.
    #[inline]
    pub fn lookup(&self, key: u64) -> Option<u64> {
        self.slot(key)
            .map(|i| self.costs[i].load(Relaxed))
            .filter(|&c| c != 0)
    }

    /// The solo floor of `key`, if it was ever measured: the same samples as [`Self::lookup`]'s,
    /// rising at most one step per [`SOLO_RISE_INTERVAL_NS`] while samples at or below it keep
    /// coming ([`SOLO_CATCH_UP_NS`]). What an MPS GPU's samples are judged against for collisions,
    /// never what is charged: the charge keeps [`Self::lookup`]'s cost, which the calibration
    /// against the driver scales (it cannot bring down a floor that slowed samples raised, as
    /// the driver counts slowed time as the process's own, but it does scale a low one up).
    #[inline]
    pub fn solo(&self, key: u64) -> Option<u64> {
        self.slot(key)
            .map(|i| self.solos[i].load(Relaxed))
            .filter(|&c| c != 0)
    }

    #[inline]
    fn slot(&self, key: u64) -> Option<usize> {
        let mut i = slot_of(key);
        for _ in 0..MAX_PROBE {
            let k = self.keys[i].load(Acquire);
            if k == key {
                return Some(i);
            }
            if k == 0 {
                return None;
            }
            i = (i + 1) & (COST_SLOTS - 1);
        }
        None
    }

    /// Folds a GPU time measured at `now_ns` (CLOCK_MONOTONIC) into `key`'s cost and solo floor.
    pub fn record(&self, key: u64, sample_ns: u64, now_ns: u64) {
        let sample = sample_ns.max(1);
        if key == 0 {
            return;
        }
        let mut i = slot_of(key);
        for _ in 0..MAX_PROBE {
            let k = self.keys[i].load(Acquire);
            let mine = k == key
                || (k == 0
                    && match self.keys[i].compare_exchange(0, key, AcqRel, Acquire) {
                        Ok(_) => true,
                        Err(now) => now == key,
                    });
            if mine {
                // Read-modify-writes without a lock: the runtime records under its sampler's
                // lock, so they do not race there; elsewhere a lost update would only delay
                // convergence or let the solo floor rise twice in an interval.
                let old = self.costs[i].load(Relaxed);
                self.costs[i].store(ewma(old, sample), Relaxed);
                let solo = self.solos[i].load(Relaxed);
                // Both times only move forward: a sample that settles late (an earlier
                // `now_ns`) neither starts a catch-up early nor frees a rise.
                if solo == 0 || sample <= solo {
                    self.solo_seen_at[i].fetch_max(now_ns, Relaxed);
                }
                if solo != 0 && sample > solo {
                    let seen = self.solo_seen_at[i].load(Relaxed);
                    let catching_up = now_ns.saturating_sub(seen) >= SOLO_CATCH_UP_NS;
                    let last = self.solo_rose_at[i].load(Relaxed);
                    if !catching_up
                        && last != 0
                        && now_ns.saturating_sub(last) < SOLO_RISE_INTERVAL_NS
                    {
                        return;
                    }
                    self.solo_rose_at[i].fetch_max(now_ns.max(1), Relaxed);
                }
                self.solos[i].store(ewma(solo, sample), Relaxed);
                return;
            }
            i = (i + 1) & (COST_SLOTS - 1);
        }
    }
}

/// Grants the right to take a sample at most once per period.
///
/// [`SampleClock::try_claim`] grants the first launch after each period — predictable: a
/// function that launches a kernel short whenever a period has passed and long otherwise had
/// only its short launches measured (cost poisoning, issue 12 item 10).
/// [`SampleClock::try_claim_unpredictable`], the runtime's, draws the phase: once the period
/// has passed each launch is claimed with probability 1/2 (so which launch of a burst is measured
/// is a coin's doing, not the function's), and the next period is drawn uniformly from ½…1½
/// periods (the mean stays one period, the sampling cost unchanged). The draw is a xorshift of
/// one atomic word: no lock, no syscall. What it cannot do is make the samples an unbiased
/// picture of a function that changes its kernels' durations at will; the calibration against
/// the driver's accounting corrects whatever bias remains (docs/shim.md).
#[derive(Debug, Default)]
pub struct SampleClock {
    next: AtomicU64,
    /// xorshift64 state (0: not seeded; [`SampleClock::seeded`]).
    rng: AtomicU64,
}

impl SampleClock {
    /// A clock whose draws start from `seed` (any value; 0 is replaced).
    pub fn seeded(seed: u64) -> SampleClock {
        SampleClock {
            next: AtomicU64::new(0),
            rng: AtomicU64::new(seed | 1),
        }
    }

    /// True for exactly one caller per `period_ns`.
    #[inline]
    pub fn try_claim(&self, now: u64, period_ns: u64) -> bool {
        let next = self.next.load(Relaxed);
        now >= next
            && self
                .next
                .compare_exchange(next, now + period_ns, AcqRel, Relaxed)
                .is_ok()
    }

    /// True for at most one caller per ½ `period_ns`, one per `period_ns` on average, at a phase
    /// the caller cannot predict (type docs).
    #[inline]
    pub fn try_claim_unpredictable(&self, now: u64, period_ns: u64) -> bool {
        let next = self.next.load(Relaxed);
        if now < next {
            return false;
        }
        let r = self.draw();
        if r & 1 == 0 {
            return false;
        }
        let gap = period_ns / 2 + (r >> 1) % period_ns.max(1);
        self.next
            .compare_exchange(next, now + gap, AcqRel, Relaxed)
            .is_ok()
    }

    /// The next xorshift64 draw. Racy read-modify-write is fine: two callers drawing the same
    /// value only repeat a coin.
    #[inline]
    fn draw(&self) -> u64 {
        let mut x = self.rng.load(Relaxed) | 1;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng.store(x, Relaxed);
        x
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// Simulates a process that always has work: each launch costs `cost`, the caller sleeps
    /// exactly until the returned deadline. Returns GPU time admitted over `dur`.
    fn run(share: u32, cost: u64, window: u64, dur: u64) -> u64 {
        let g = Gate::new();
        let start = 1_000 * MS;
        let mut now = start;
        let mut admitted = 0;
        while now < start + dur {
            if let Some(t) = g.admit(now, cost, share, window) {
                assert!(t > now);
                now = t;
            }
            admitted += cost;
        }
        admitted
    }

    #[test]
    fn share_100_never_waits() {
        let g = Gate::new();
        for i in 0..1000 {
            assert_eq!(g.admit(i, 10 * MS, 100, 100 * MS), None);
        }
    }

    #[test]
    fn the_long_run_rate_is_the_share() {
        for share in [10u32, 25, 50, 75, 90] {
            for cost in [20_000u64, MS, 7 * MS] {
                let dur = 10_000 * MS;
                let got = run(share, cost, 100 * MS, dur) as f64 / dur as f64;
                let want = share as f64 / 100.0;
                // Bounded by one window's burst plus one launch over 10 s.
                let slack = (share as f64 / 100.0 * 100.0 * MS as f64 + cost as f64) / dur as f64;
                assert!(
                    got >= want - 1e-3 && got <= want + slack + 1e-3,
                    "share {share} cost {cost}: got {got}"
                );
            }
        }
    }

    #[test]
    fn a_burst_is_bounded_by_the_bucket() {
        // After a long idle period, a burst of launches at the same instant is admitted only up
        // to share × window of GPU time; the next one must wait.
        let g = Gate::new();
        let now = 5_000 * MS;
        let (share, window, cost) = (25u32, 100 * MS, MS);
        let mut free = 0;
        while g.admit(now, cost, share, window).is_none() {
            free += 1;
            assert!(free < 1000);
        }
        assert_eq!(free, 25, "25 % of 100 ms = 25 launches of 1 ms");
    }

    /// Empties a 50 % × 10 ms bucket (5 ms of GPU time) at `now`.
    fn emptied(now: u64) -> Gate {
        let g = Gate::new();
        for _ in 0..5 {
            assert_eq!(g.admit(now, MS, 50, 10 * MS), None);
        }
        g
    }

    #[test]
    fn the_deadline_is_when_the_launch_is_paid_for() {
        let now = 1_000 * MS;
        let g = emptied(now);
        // The next 1 ms launch is paid for 2 ms later.
        assert_eq!(g.admit(now, MS, 50, 10 * MS), Some(now + 2 * MS));
    }

    #[test]
    fn a_reset_forgets_the_debt() {
        let now = 1_000 * MS;
        let g = emptied(now);
        g.reset();
        assert_eq!(g.admit(now, MS, 50, 10 * MS), None);
    }

    #[test]
    fn processes_attached_to_one_word_share_one_share_and_carry_their_debt_in() {
        let now = 1_000 * MS;
        let word: &'static AtomicU64 = Box::leak(Box::new(AtomicU64::new(0)));
        // A process that used its own bucket before attaching: 8 ms owed at 50 %.
        let a = SharedGate::new();
        a.get().charge(now, 8 * MS, 50);
        assert!(!a.is_shared());
        a.attach(word);
        assert!(a.is_shared());
        // Its sibling attaches with an empty bucket and finds the debt there.
        let b = SharedGate::new();
        b.attach(word);
        assert_eq!(b.get().admit(now, MS, 50, 10 * MS), Some(now + 8 * MS));
        // Two processes at 25 % of a 100 ms window: 25 ms of launches between them, not each.
        let word: &'static AtomicU64 = Box::leak(Box::new(AtomicU64::new(0)));
        let (a, b) = (SharedGate::new(), SharedGate::new());
        a.attach(word);
        b.attach(word);
        let mut free = 0;
        for i in 0.. {
            let g = if i % 2 == 0 { &a } else { &b };
            if g.get().admit(now, MS, 25, 100 * MS).is_some() {
                break;
            }
            free += 1;
        }
        assert_eq!(free, 25, "25 % of 100 ms between two processes");
        // Attached once: a second word changes nothing.
        let other: &'static AtomicU64 = Box::leak(Box::new(AtomicU64::new(0)));
        a.attach(other);
        assert_eq!(other.load(Relaxed), 0);
        assert!(
            a.get().admit(now, MS, 25, 100 * MS).is_some(),
            "still the first word, spent"
        );
    }

    #[test]
    fn a_cost_learnt_afterwards_delays_the_next_admission_by_cost_over_share() {
        let now = 1_000 * MS;
        let g = Gate::new();
        g.charge(now, 8 * MS, 50);
        assert_eq!(g.admit(now, MS, 50, 10 * MS), Some(now + 8 * MS));
    }

    #[test]
    fn an_estimate_does_not_chase_inflated_samples() {
        // A 1 ms kernel sampled while a co-runner inflates some samples to 6 ms.
        let mut e = 0;
        for (i, s) in [MS, 6 * MS, MS, 6 * MS, 6 * MS, MS, MS, 6 * MS]
            .iter()
            .enumerate()
        {
            e = ewma(e, *s);
            assert!(
                e < 2 * MS,
                "sample {i}: estimate {e} chased an inflated sample"
            );
        }
        // A kernel that really became 4 ms is followed within a few dozen samples.
        for _ in 0..48 {
            e = ewma(e, 4 * MS);
        }
        assert!(e > 3 * MS, "{e}");
    }

    #[test]
    fn an_unmeasured_key_has_no_cost() {
        let t = CostTable::new();
        assert_eq!(t.lookup(0x7000), None);
        t.record(0x9000, 5_000, 0);
        assert_eq!(
            t.lookup(0x7000),
            None,
            "no estimate borrowed from other keys"
        );
    }

    #[test]
    fn the_first_sample_is_the_cost_then_it_falls_fast_and_rises_slowly() {
        let t = CostTable::new();
        t.record(0x7000, 400_000, 0);
        assert_eq!(t.lookup(0x7000), Some(400_000));
        // A larger sample moves it 1/16 of the way, at most 1/32 of itself; a smaller one 3/4
        // of the way.
        t.record(0x7000, 420_000, 0);
        assert_eq!(t.lookup(0x7000), Some(401_250));
        t.record(0x7000, 800_000, 0);
        assert_eq!(t.lookup(0x7000), Some(401_250 + 12_540));
        t.record(0x7000, 225_000, 0);
        assert_eq!(t.lookup(0x7000), Some((413_790 + 675_000) / 4));
    }

    #[test]
    fn the_solo_floor_rises_one_step_per_interval_and_falls_at_every_sample() {
        let t = CostTable::new();
        t.record(0x7000, 400_000, MS);
        assert_eq!(t.solo(0x7000), Some(400_000));
        // A slowed sample: the first rise is not paced; the next one waits 20 ms to the ns.
        t.record(0x7000, 600_000, 2 * MS);
        assert_eq!(t.solo(0x7000), Some(412_500));
        for ms in 3..22 {
            t.record(0x7000, 600_000, ms * MS);
        }
        t.record(0x7000, 600_000, 22 * MS - 1);
        assert_eq!(t.solo(0x7000), Some(412_500), "risen before its interval");
        t.record(0x7000, 600_000, 22 * MS);
        assert_eq!(t.solo(0x7000), Some(412_500 + 11_718));
        // A sample that settles out of order (an earlier time) does not rise either.
        t.record(0x7000, 600_000, 10 * MS);
        assert_eq!(t.solo(0x7000), Some(424_218));
        // Meanwhile the cost rose at every sample.
        assert!(
            t.lookup(0x7000).unwrap() > 550_000,
            "{:?}",
            t.lookup(0x7000)
        );
        // A solo sample pulls the solo floor down at once, whenever it comes.
        t.record(0x7000, 400_000, 41 * MS);
        assert_eq!(t.solo(0x7000), Some((424_218 + 1_200_000) / 4));
    }

    #[test]
    fn beside_a_trainer_that_slows_most_samples_the_solo_floor_stays_near_the_solo_cost() {
        // 13 samples in 14 slowed 1.5 × (an MPS co-runner busy ~93 %), one a millisecond.
        let t = CostTable::new();
        let (mut solo_sum, mut cost_sum) = (0, 0);
        for ms in 1..=3_000u64 {
            let sample = if ms % 14 == 0 { 400_000 } else { 600_000 };
            t.record(0x7000, sample, ms * MS);
            if ms > 2_000 {
                solo_sum += t.solo(0x7000).unwrap();
                cost_sum += t.lookup(0x7000).unwrap();
            }
        }
        let (solo, cost) = (solo_sum / 1_000, cost_sum / 1_000);
        assert!(solo < 412_000, "solo floor {solo} on average");
        assert!(cost > 460_000, "cost {cost} on average");
    }

    #[test]
    fn a_kernel_whose_cost_really_grew_is_followed_once_no_sample_is_solo() {
        // Its cost doubles at 100 ms; every sample after is 2 ×, none at the old floor.
        let t = CostTable::new();
        for ms in 1..=100u64 {
            t.record(0x7000, 400_000, ms * MS);
        }
        for ms in 101..=200u64 {
            t.record(0x7000, 800_000, ms * MS);
        }
        // Paced until no sample has been solo for 100 ms: five steps, the first at once
        // (101, 121, 141, 161, 181 ms), then the catch-up's first at 200 ms.
        let mut floor = 400_000u64;
        for _ in 0..6 {
            floor += floor.div_ceil(32);
        }
        assert_eq!(t.solo(0x7000), Some(floor));
        // Then it rises at every sample, as the cost does, until it meets the samples.
        for ms in 201..=400u64 {
            t.record(0x7000, 800_000, ms * MS);
        }
        let solo = t.solo(0x7000).unwrap();
        assert!(
            solo > 790_000,
            "solo floor {solo} 300 ms after the cost doubled"
        );
    }

    #[test]
    fn the_catch_up_starts_100_ms_after_the_last_solo_sample_to_the_ns() {
        let t = CostTable::new();
        t.record(0x7000, 400_000, MS);
        // Slowed samples each millisecond: paced rises at 2, 22, 42, 62 and 82 ms.
        for ms in 2..=100u64 {
            t.record(0x7000, 600_000, ms * MS);
        }
        let paced = t.solo(0x7000);
        // 100 ms less a nanosecond after the solo sample, 19 ms after the last rise: no rise.
        t.record(0x7000, 600_000, 101 * MS - 1);
        assert_eq!(t.solo(0x7000), paced);
        // At 100 ms, within the same interval: the catch-up rises.
        t.record(0x7000, 600_000, 101 * MS);
        assert!(t.solo(0x7000) > paced, "{:?} vs {paced:?}", t.solo(0x7000));
    }

    #[test]
    fn a_solo_sample_that_settles_late_does_not_start_the_catch_up_early() {
        let t = CostTable::new();
        t.record(0x7000, 400_000, MS);
        t.record(0x7000, 400_000, 50 * MS);
        // A solo sample from 10 ms settles after the one from 50 ms.
        t.record(0x7000, 400_000, 10 * MS);
        // Slowed samples: the first rises, the next waits its interval, 90 ms after the newest
        // solo sample — the catch-up counts from 50 ms, not 10.
        t.record(0x7000, 600_000, 130 * MS);
        let risen = t.solo(0x7000);
        t.record(0x7000, 600_000, 140 * MS);
        assert_eq!(t.solo(0x7000), risen);
        // A slowed sample that settles late frees no rise either.
        t.record(0x7000, 600_000, 60 * MS);
        t.record(0x7000, 600_000, 145 * MS);
        assert_eq!(t.solo(0x7000), risen);
    }

    #[test]
    fn jitter_above_the_floor_lifts_it_into_the_jitter_never_past_it() {
        // Every sample above the first: 405–420 µs, a 400 µs kernel's timing jitter.
        let t = CostTable::new();
        t.record(0x7000, 400_000, MS);
        for ms in 2..=2_000u64 {
            t.record(0x7000, 405_000 + (ms % 4) * 5_000, ms * MS);
        }
        let solo = t.solo(0x7000).unwrap();
        assert!((405_000..=420_000).contains(&solo), "solo floor {solo}");
    }

    #[test]
    fn colliding_keys_keep_their_own_costs() {
        let t = CostTable::new();
        for k in 1..2000u64 {
            t.record(k * 16, k * 10, 0);
        }
        for k in (1..2000u64).step_by(97) {
            assert_eq!(t.lookup(k * 16), Some(k * 10));
        }
    }

    #[test]
    fn unpredictable_samples_average_one_per_period_and_skip_the_first_launch_half_the_time() {
        let c = SampleClock::seeded(42);
        // A launch every 10 µs for 10 s.
        let (mut claims, mut last, mut min_gap) = (0u64, 0u64, u64::MAX);
        let mut now = 1_000 * MS;
        while now < 11_000 * MS {
            if c.try_claim_unpredictable(now, MS) {
                if last != 0 {
                    min_gap = min_gap.min(now - last);
                }
                claims += 1;
                last = now;
            }
            now += 10_000;
        }
        assert!(min_gap >= MS / 2, "at most one per half period: {min_gap}");
        // Mean gap: ~1 period + ~1 launch interval of coin flips.
        assert!(
            (9_000..=10_500).contains(&claims),
            "{claims} samples in 10 s"
        );
        // Launches 2 ms apart (every one after a full period): about half are sampled, and
        // which ones is not a fixed pattern.
        let d = SampleClock::seeded(7);
        let picks: Vec<bool> = (0..1000)
            .map(|i| d.try_claim_unpredictable(2_000 * MS + i * 2 * MS, MS))
            .collect();
        let n = picks.iter().filter(|&&p| p).count();
        assert!((400..=600).contains(&n), "{n} of 1000");
        assert!(picks.windows(2).any(|w| w[0] && w[1]) && picks.windows(2).any(|w| !w[0] && !w[1]));
    }

    #[test]
    fn a_sample_is_granted_once_per_period() {
        let c = SampleClock::default();
        assert!(c.try_claim(10 * MS, MS));
        assert!(!c.try_claim(10 * MS + 1, MS));
        assert!(!c.try_claim(11 * MS - 1, MS));
        assert!(c.try_claim(11 * MS, MS));
    }
}
