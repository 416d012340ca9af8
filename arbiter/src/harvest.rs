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
//! sliding window), [`UsageLedger`] (one function's reports turned into per-interval use and
//! deadline misses), [`split`] (dividing the budget among functions by demand and urgency), and
//! [`Harvest`] (the GPU's budget with an additive-increase / multiplicative-decrease calibration
//! against the estimate, so a biased estimate or a burst allowance cannot hold the mean above θ).
//!
//! Must never: read a clock or the system (time is a parameter), give a GPU's functions more
//! collision budget in total than `θ / (1 + θ)` of wall time, or starve a function entirely (each
//! gets a floor, so its shim keeps measuring and its demand stays visible).

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

/// Largest ratio of the functions' raw collision time to the part of it attributed to training
/// by which a GPU's budget is widened ([`ContentionMeter::raw_per_training`]): 4. Reasoning: the
/// shims charge every collision, with other functions too, against their budget; the ratio
/// restores the budget those function–function collisions ate (measured: 3 in the demo's
/// `harvest` scenario, six instances beside a trainer busy 22 %). Bounding it bounds what a wrong
/// attribution can cost training before the calibration reacts.
pub const MAX_RAW_PER_TRAINING: f64 = 4.0;

/// Collision time of a GPU's functions — all of it, and the part attributed to training
/// ([`training_collision_ns`]) — and the slowdown the latter implies over [`WINDOW_S`].
#[derive(Debug, Default, Clone)]
pub struct ContentionMeter {
    /// Collision ns the shims reported, across every instance ever on this GPU.
    raw_ns: u64,
    /// The part of it attributed to collisions with training.
    training_ns: u64,
    /// (time s, raw_ns, training_ns) at each tick, oldest first, spanning at most [`WINDOW_S`].
    ring: VecDeque<(f64, u64, u64)>,
}

impl ContentionMeter {
    /// Adds one interval's collision time: `raw_ns` as reported, `training_ns` of it with
    /// training.
    pub fn add(&mut self, raw_ns: u64, training_ns: u64) {
        self.raw_ns = self.raw_ns.saturating_add(raw_ns);
        self.training_ns = self.training_ns.saturating_add(training_ns.min(raw_ns));
    }

    /// Closes an observation at time `t` (seconds, any monotonic origin).
    pub fn tick(&mut self, t: f64) {
        self.ring.push_back((t, self.raw_ns, self.training_ns));
        while self.ring.len() > 2 && self.ring.front().is_some_and(|&(t0, ..)| t - t0 > WINDOW_S) {
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
        let (&(t0, _, c0), &(t1, _, c1)) = (self.ring.front()?, self.ring.back()?);
        let span = t1 - t0;
        (span >= MIN_SPAN_S).then(|| ((c1 - c0) as f64 / 1e9 / span).clamp(0.0, 1.0))
    }

    /// Fraction of wall time the functions collided with anything (training or each other) over
    /// the window — what their shims charged.
    pub fn raw_fraction(&self) -> Option<f64> {
        let (&(t0, r0, _), &(t1, r1, _)) = (self.ring.front()?, self.ring.back()?);
        let span = t1 - t0;
        (span >= MIN_SPAN_S).then(|| ((r1 - r0) as f64 / 1e9 / span).clamp(0.0, 1.0))
    }

    /// How many ns of collision the shims charge per ns attributed to training, over the window,
    /// in [1, [`MAX_RAW_PER_TRAINING`]]: the rate at which a budget of collision with training
    /// converts into the budget the shims enforce. 1 without evidence.
    pub fn raw_per_training(&self) -> f64 {
        let (Some(&(_, r0, c0)), Some(&(_, r1, c1))) = (self.ring.front(), self.ring.back()) else {
            return 1.0;
        };
        let (raw, training) = ((r1 - r0) as f64, (c1 - c0) as f64);
        if raw <= 0.0 {
            1.0
        } else if training <= 0.0 {
            MAX_RAW_PER_TRAINING
        } else {
            (raw / training).clamp(1.0, MAX_RAW_PER_TRAINING)
        }
    }

    /// The training job's slowdown the collisions imply, `c / (1 − c)` (capped at 10, i.e. 1000 %).
    pub fn slowdown(&self) -> Option<f64> {
        self.fraction().map(slowdown_of_fraction)
    }
}

/// Rounds of the fixed point in [`training_collision_ns`] (it converges geometrically; 8 rounds
/// leave less than 1 µs per second at any realistic collision fraction).
const ATTRIBUTION_ROUNDS: usize = 8;

/// The part of one interval's collision time that was with training, from what each function's
/// shim reported over it (`usage`: GPU time and collision time per instance, ns), the interval's
/// length `span_s`, and the training job's NVML utilization over it (`training_busy`, 0..=1;
/// `None`: unknown).
///
/// A shim sees that its kernel waited or was slowed, not for whom: beside several functions a
/// collision is as often with another function — a cost to nobody's training — as with the
/// trainer (docs/harvest.md measured the estimate at 22 % against a true 7 % with six
/// instances). Two corrections, both from the functions' independence (requests arrive on their
/// own schedules, not the trainer's iterations nor each other's):
///
/// 1. **Function–function collisions.** Function i's kernels find function j running for a
///    fraction `g_j / span` of their GPU time, and a kernel that waits behind another is charged
///    about its own time (time-slicing): `g_i × Σ_{j≠i} g_j / span` of `c_i` was with other
///    functions and is taken off. Correlated functions (two instances of one function, bursts)
///    collide more than this, which leaves the estimate on the safe side.
/// 2. **Overlap with training.** Training can lose at most the time the function's kernels
///    overlapped its work, about `g_i × q`, q the fraction of time training has work on the GPU:
///    its NVML utilization plus the time it waited for the functions (the attributed collision
///    itself, hence a fixed point).
///
/// Function i's collision with training is `min(c_i − ff_i, g_i × q)` (at least 0). With
/// training's utilization unknown, all of `c_i` counts (the safe side).
pub fn training_collision_ns(usage: &[ShimUsage], span_s: f64, training_busy: Option<f64>) -> u64 {
    let raw: u64 = usage.iter().map(|u| u.contention_ns).sum();
    let Some(busy) = training_busy.filter(|b| b.is_finite() && span_s > 0.0) else {
        return raw;
    };
    let span_ns = span_s * 1e9;
    let g_total: f64 = usage.iter().map(|u| u.gpu_ns as f64).sum();
    // Each function's collisions less those expected with the other functions.
    let own: Vec<(f64, f64)> = usage
        .iter()
        .map(|u| {
            let g = u.gpu_ns as f64;
            let others = ((g_total - g) / span_ns).clamp(0.0, 1.0);
            (g, (u.contention_ns as f64 - g * others).max(0.0))
        })
        .collect();
    let mut c = 0.0f64;
    for _ in 0..ATTRIBUTION_ROUNDS {
        let q = (busy.max(0.0) + c / span_ns).min(1.0);
        c = own.iter().map(|&(g, ci)| ci.min(g * q)).sum();
    }
    (c.round() as u64).min(raw)
}

/// What a function process's shim reported: cumulative estimated GPU and collision time on its
/// granted device, ns.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ShimUsage {
    /// Estimated GPU time, ns.
    pub gpu_ns: u64,
    /// Estimated collision time with other contexts, ns.
    pub contention_ns: u64,
}

/// One function instance's usage: the last cumulative report of each of its processes (workers
/// report separately, each with its own counters), and what accrued since the last interval.
#[derive(Debug, Default, Clone)]
pub struct UsageLedger {
    last: BTreeMap<u32, ShimUsage>,
    interval: ShimUsage,
    /// Requests reported since the last interval, and how many of them missed the SLO.
    requests: (u64, u64),
}

impl UsageLedger {
    /// Records process `pid`'s cumulative counters; returns what they added. A counter that went
    /// backwards (a new process image under a recycled pid) counts from zero again.
    pub fn record(&mut self, pid: u32, now: ShimUsage) -> ShimUsage {
        let prev = self.last.insert(pid, now).unwrap_or_default();
        let delta = |cur: u64, old: u64| if cur >= old { cur - old } else { cur };
        let d = ShimUsage {
            gpu_ns: delta(now.gpu_ns, prev.gpu_ns),
            contention_ns: delta(now.contention_ns, prev.contention_ns),
        };
        self.interval.gpu_ns = self.interval.gpu_ns.saturating_add(d.gpu_ns);
        self.interval.contention_ns = self.interval.contention_ns.saturating_add(d.contention_ns);
        d
    }

    /// Whether any process of the function has reported usage yet.
    pub fn has_reports(&self) -> bool {
        !self.last.is_empty()
    }

    /// Counts reported request latencies against the SLO (ms).
    pub fn record_latencies(&mut self, latencies_ms: &[f64], slo_ms: Option<f64>) {
        for &l in latencies_ms.iter().filter(|l| l.is_finite() && **l >= 0.0) {
            self.requests.0 += 1;
            if slo_ms.is_some_and(|slo| l > slo) {
                self.requests.1 += 1;
            }
        }
    }

    /// Closes the interval: what accrued, and the share of its requests that missed the SLO
    /// (None without requests).
    pub fn take_interval(&mut self) -> (ShimUsage, Option<f64>) {
        let u = std::mem::take(&mut self.interval);
        let (n, missed) = std::mem::take(&mut self.requests);
        (u, (n > 0).then(|| missed as f64 / n as f64))
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
/// its use plus [`HEADROOM`]; what is left goes to the constrained ones in proportion to their
/// urgency (weighted max-min fairness, by water-filling). The result sums to at most `total_ppm`.
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
                f64::INFINITY
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
    // Whatever the unconstrained left unused stays with them: a sudden burst should not wait an
    // interval for budget the GPU has.
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

/// One GPU's collision budget: `θ / (1 + θ)` times a calibration in
/// [[`CALIBRATION_MIN`], 1], lowered when the measured slowdown exceeds θ (a burst horizon or an
/// estimate that runs low) and recovered additively while it stays well under θ.
#[derive(Debug, Clone)]
pub struct Harvest {
    theta: f64,
    calibration: f64,
}

impl Harvest {
    /// A GPU's budget under bound `theta` (a fraction: 0.1 = 10 %).
    pub fn new(theta: f64) -> Harvest {
        Harvest {
            theta: theta.max(0.0),
            calibration: 1.0,
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

    /// The GPU's total collision budget, ppm of wall time:
    /// `θ/(1+θ)` × [`UNSEEN_COLLISION_MARGIN`] × the calibration.
    pub fn total_ppm(&self) -> u32 {
        (fraction_for_slowdown(self.theta)
            * UNSEEN_COLLISION_MARGIN
            * self.calibration
            * PPM as f64)
            .round() as u32
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_meter_turns_collision_time_into_a_slowdown_over_its_window() {
        let mut m = ContentionMeter::default();
        m.tick(0.0);
        assert_eq!(m.fraction(), None, "no span yet");
        // Two functions collide for 50 ms and 50 ms of every second: c = 0.1 ⇒ s = 0.111.
        for s in 1..=5 {
            m.add(50_000_000, 50_000_000);
            m.add(50_000_000, 50_000_000);
            m.tick(s as f64);
        }
        assert!((m.fraction().unwrap() - 0.1).abs() < 1e-9);
        assert!((m.slowdown().unwrap() - 0.1 / 0.9).abs() < 1e-9);
    }

    #[test]
    fn collisions_beyond_the_overlap_with_training_are_not_trainings() {
        let u = |g: u64, c: u64| ShimUsage {
            gpu_ns: g * 1_000_000,
            contention_ns: c * 1_000_000,
        };
        // Unknown training utilization: every collision counts (the safe side).
        assert_eq!(training_collision_ns(&[u(100, 40)], 1.0, None), 40_000_000);
        // A trainer that never idles: every function microsecond overlaps it; all 40 ms count.
        assert_eq!(
            training_collision_ns(&[u(100, 40)], 1.0, Some(1.0)),
            40_000_000
        );
        // Beside a trainer busy 20 %, three functions of 100 ms each report 60 ms of collisions:
        // 100 ms × 0.2 of each is expected with the two others (20 ms), which leaves 40 ms; the
        // overlap with training bounds it at 100 ms × q, q = 0.2 + the attributed collision per
        // second ⇒ q = 0.2 / (1 − 0.3) ≈ 0.286, 28.6 ms each.
        let c = training_collision_ns(&[u(100, 60), u(100, 60), u(100, 60)], 1.0, Some(0.2));
        let q = 0.2 / (1.0 - 0.3);
        assert!(
            (c as f64 / 1e6 - 300.0 * q).abs() < 1.0,
            "{c} ns vs {}",
            300.0 * q
        );
        // The same with fewer collisions: 30 ms each, 20 of them with the others: 10 ms each.
        let c = training_collision_ns(&[u(100, 30), u(100, 30), u(100, 30)], 1.0, Some(0.2));
        assert!((c as f64 / 1e6 - 30.0).abs() < 0.01, "{c}");
        // One function alone beside training: none of its collisions are another function's.
        assert_eq!(
            training_collision_ns(&[u(100, 15)], 1.0, Some(0.2)),
            15_000_000
        );
        // A function that ran in the trainer's idle phases measured less than the overlap bound:
        // its measurement stands.
        assert_eq!(
            training_collision_ns(&[u(100, 5)], 1.0, Some(0.5)),
            5_000_000
        );
        assert_eq!(training_collision_ns(&[], 1.0, Some(0.5)), 0);
    }

    #[test]
    fn the_raw_budget_is_the_training_budget_at_the_measured_exchange_rate() {
        let mut m = ContentionMeter::default();
        assert_eq!(m.raw_per_training(), 1.0, "no evidence");
        m.tick(0.0);
        for s in 1..=3 {
            m.add(90_000_000, 30_000_000);
            m.tick(s as f64);
        }
        assert!((m.raw_per_training() - 3.0).abs() < 1e-9);
        assert!((m.fraction().unwrap() - 0.03).abs() < 1e-9);
        assert!((m.raw_fraction().unwrap() - 0.09).abs() < 1e-9);
        // No collision with training at all: bounded.
        let mut m = ContentionMeter::default();
        m.tick(0.0);
        m.add(90_000_000, 0);
        m.tick(1.0);
        assert_eq!(m.raw_per_training(), MAX_RAW_PER_TRAINING);
        // The attributed part never exceeds what was reported.
        let mut m = ContentionMeter::default();
        m.tick(0.0);
        m.add(10, 20);
        m.tick(1.0);
        assert_eq!(m.raw_per_training(), 1.0);
    }

    #[test]
    fn the_window_forgets_collisions_older_than_ten_seconds() {
        let mut m = ContentionMeter::default();
        m.tick(0.0);
        m.add(5_000_000_000, 5_000_000_000); // 5 s of collisions in the first second
        m.tick(1.0);
        for s in 2..=20 {
            m.tick(s as f64);
        }
        assert_eq!(m.fraction(), Some(0.0));
    }

    #[test]
    fn a_counter_that_restarts_counts_from_zero_and_each_worker_counts_apart() {
        let mut l = UsageLedger::default();
        let u = |g, c| ShimUsage {
            gpu_ns: g,
            contention_ns: c,
        };
        assert_eq!(l.record(10, u(300, 30)), u(300, 30));
        assert_eq!(
            l.record(11, u(50, 5)),
            u(50, 5),
            "another worker of the function"
        );
        assert_eq!(l.record(10, u(100, 10)), u(100, 10), "restarted: from zero");
        assert_eq!(l.record(10, u(150, 10)), u(50, 0));
        l.record_latencies(&[1.0, 9.0, f64::NAN, 12.0], Some(8.0));
        let (sum, miss) = l.take_interval();
        assert_eq!(sum, u(500, 45));
        assert_eq!(miss, Some(2.0 / 3.0));
        assert_eq!(l.take_interval(), (ShimUsage::default(), None));
        assert_eq!(urgency(None), 1.0);
        assert_eq!(urgency(Some(1.0)), 5.0);
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
                d(33_000, 1_000, 1.0),
                d(33_000, 33_000, 1.0),
                d(33_000, 33_000, 3.0),
            ],
        );
        assert!(out[0] < 10_000, "{out:?}");
        assert!(out[2] > 2 * out[1], "{out:?}");
        assert!(out.iter().sum::<u32>() >= total - 3);
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
}
