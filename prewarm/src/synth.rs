//! Seeded synthetic traces in the Azure Functions 2019 format.
//!
//! Owns: the five invocation classes that the Azure characterization (Shahrad et al., ATC'20)
//! reports, each with a documented generative model and the statistic it is guaranteed to show
//! (checked by tests):
//!
//! | class | model | statistic it claims |
//! |---|---|---|
//! | `timer` | every `P ∈ {5,10,15,30,60}` min at a random phase, `k ∈ {1,2,3}` calls per firing (a cron timer) | all activity on multiples of `P`, every firing present (autocorrelation 1 at lag `P`) |
//! | `diurnal` | Poisson, rate `b·(1 + A·cos(2π(t − peak)/1440))`, `b` log-uniform in [0.3, 20]/min, `A ∈ [0.7, 0.9]` | mean rate in the 4 h around the peak ≥ 4× the 4 h around the trough |
//! | `bursty` | ON/OFF: OFF gaps uniform 20–240 min, ON bursts 2–10 min at Poisson 5–40/min | CV of per-minute counts ≥ 2; 1–25 % of minutes active |
//! | `sparse` | Poisson arrivals, 2–16 calls per day at uniformly random minutes | fewer active minutes than one per hour (< 1/60 of minutes) |
//! | `mixed` | a `timer` (P ∈ {10,15,30}) plus a weak diurnal HTTP background (`b` ∈ [0.02, 0.1]/min) | every firing present and 1–50 % of the other minutes active |
//!
//! Reproducible: the same `seed` and parameters give byte-identical files (rand 0.8 `StdRng`,
//! pinned by Cargo.lock; no other source of randomness is used).
//!
//! Must never: read the clock or the OS RNG.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::trace::{FunctionKey, FunctionTrace, Trace, MINUTES_PER_DAY};

/// The synthetic classes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TraceClass {
    /// Cron-like timer trigger.
    Timer,
    /// HTTP traffic with a daily cycle.
    Diurnal,
    /// Rare bursts of many calls.
    Bursty,
    /// A handful of calls per day.
    Sparse,
    /// A timer plus a weak HTTP background.
    Mixed,
}

impl TraceClass {
    /// All classes, in report order.
    pub const ALL: [TraceClass; 5] = [
        TraceClass::Timer,
        TraceClass::Diurnal,
        TraceClass::Bursty,
        TraceClass::Sparse,
        TraceClass::Mixed,
    ];

    /// The label written to `classes.csv`.
    pub fn label(self) -> &'static str {
        match self {
            TraceClass::Timer => "timer",
            TraceClass::Diurnal => "diurnal",
            TraceClass::Bursty => "bursty",
            TraceClass::Sparse => "sparse",
            TraceClass::Mixed => "mixed",
        }
    }

    /// Parses a label.
    pub fn from_label(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.label() == s)
    }
}

/// Generator parameters.
#[derive(Debug, Clone)]
pub struct SynthConfig {
    /// RNG seed; the whole trace is a function of it.
    pub seed: u64,
    /// Days to generate (written as d01..dNN).
    pub days: u32,
    /// Functions per class.
    pub per_class: usize,
}

impl Default for SynthConfig {
    fn default() -> Self {
        Self {
            seed: 42,
            // 4 days: 3 days of history for the long-term LSTM ("trained on days", SMORE §VI-B) and
            // one day scored.
            days: 4,
            // 8 per class: 40 functions keep a full LS-LSTM replay within minutes on 2 cores.
            per_class: 8,
        }
    }
}

/// Parameters drawn for one function, kept for tests and documentation.
#[derive(Debug, Clone, PartialEq)]
pub struct ClassParams {
    /// Timer / mixed period in minutes.
    pub period: Option<usize>,
    /// Timer / mixed phase in minutes.
    pub phase: Option<usize>,
}

/// Poisson sample: Knuth's product method for small means, a rounded normal approximation above
/// 30 (error negligible at that mean for per-minute counts).
pub fn poisson(rng: &mut StdRng, lambda: f64) -> u32 {
    if lambda <= 0.0 {
        return 0;
    }
    if lambda < 30.0 {
        let l = (-lambda).exp();
        let mut k = 0u32;
        let mut p = 1.0;
        loop {
            p *= rng.gen::<f64>();
            if p <= l {
                return k;
            }
            k += 1;
        }
    }
    // Box–Muller.
    let u1: f64 = rng.gen::<f64>().max(1e-12);
    let u2: f64 = rng.gen();
    let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
    (lambda + lambda.sqrt() * z).round().max(0.0) as u32
}

fn log_uniform(rng: &mut StdRng, lo: f64, hi: f64) -> f64 {
    (lo.ln() + rng.gen::<f64>() * (hi.ln() - lo.ln())).exp()
}

fn hex_id(rng: &mut StdRng) -> String {
    (0..64)
        .map(|_| char::from_digit(rng.gen_range(0..16), 16).unwrap_or('0'))
        .collect()
}

fn diurnal_rate(base: f64, amp: f64, peak: f64, minute: usize) -> f64 {
    let tod = (minute % MINUTES_PER_DAY) as f64;
    base * (1.0 + amp * (2.0 * std::f64::consts::PI * (tod - peak) / MINUTES_PER_DAY as f64).cos())
}

/// A bursty arrival trace at a per-second granularity: per source, per second, the arrival
/// offsets (seconds, in [0, 1)) within that second. Source `i` is the superposition of
/// `per_source` independent series of class `sources[i].0` — one generated minute per trace
/// second — scaled so that its mean rate is `sources[i].1` requests per second; arrivals within
/// a second are uniform, in groups of `burst` at one instant.
///
/// Why a superposition: one generated series is one Azure-like function's per-minute counts,
/// small integers; scaled up alone it turns into a square wave (0 or hundreds of requests in a
/// second). A popular function is called by many independent clients: the sum of many series
/// keeps the class's shape (a diurnal trend, a timer's spikes) with a per-second granularity of
/// a few requests (docs/harvest.md, "Why the demo refused most requests"). The demo's replayed
/// trace (`smore demo`) and the cluster evaluation (`smore eval cluster`) both come from here.
pub fn superposed_arrivals(
    sources: &[(TraceClass, f64)],
    per_source: usize,
    seconds: usize,
    seed: u64,
    burst: usize,
) -> Vec<Vec<Vec<f64>>> {
    let mut rng = StdRng::seed_from_u64(seed);
    let burst = burst.max(1);
    sources
        .iter()
        .map(|&(class, rate)| {
            let mut counts = vec![0u32; seconds];
            for _ in 0..per_source {
                let (c, _) = generate_series(class, seconds, &mut rng);
                for (t, v) in counts.iter_mut().zip(c) {
                    *t += v;
                }
            }
            let mean = counts.iter().sum::<u32>() as f64 / seconds.max(1) as f64;
            let scale = if mean > 0.0 { rate / mean } else { 0.0 };
            // Rounding each second's count on its own would bias a low-rate source's mean;
            // carrying the remainder keeps the total at rate × seconds.
            let mut carry = 0.0;
            counts
                .iter()
                .map(|&c| {
                    let want = c as f64 * scale + carry;
                    let n = want.round().max(0.0) as usize;
                    carry = want - n as f64;
                    let mut v = Vec::with_capacity(n);
                    while v.len() < n {
                        let at = rng.gen::<f64>();
                        let k = burst.min(n - v.len());
                        v.extend(std::iter::repeat_n(at, k));
                    }
                    v.sort_by(f64::total_cmp);
                    v
                })
                .collect()
        })
        .collect()
}

/// Generates one function's series of `minutes` minutes for `class`.
pub fn generate_series(
    class: TraceClass,
    minutes: usize,
    rng: &mut StdRng,
) -> (Vec<u32>, ClassParams) {
    let mut c = vec![0u32; minutes];
    let mut params = ClassParams {
        period: None,
        phase: None,
    };
    match class {
        TraceClass::Timer => {
            let period = [5usize, 10, 15, 30, 60][rng.gen_range(0..5)];
            let phase = rng.gen_range(0..period);
            let k = rng.gen_range(1..=3);
            for (t, v) in c.iter_mut().enumerate() {
                if t % period == phase {
                    *v = k;
                }
            }
            params.period = Some(period);
            params.phase = Some(phase);
        }
        TraceClass::Diurnal => {
            let base = log_uniform(rng, 0.3, 20.0);
            let amp = rng.gen_range(0.7..0.9);
            let peak = rng.gen_range(0.0..MINUTES_PER_DAY as f64);
            for (t, v) in c.iter_mut().enumerate() {
                *v = poisson(rng, diurnal_rate(base, amp, peak, t));
            }
        }
        TraceClass::Bursty => {
            let mut t = rng.gen_range(0..120usize);
            while t < minutes {
                let on = rng.gen_range(2..=10usize);
                let rate = rng.gen_range(5.0..40.0);
                for v in c.iter_mut().skip(t).take(on) {
                    // At least one call per ON minute so a burst is a contiguous active run.
                    *v = poisson(rng, rate).max(1);
                }
                t += on + rng.gen_range(20..=240usize);
            }
        }
        TraceClass::Sparse => {
            let days = minutes.div_ceil(MINUTES_PER_DAY);
            for d in 0..days {
                let n = rng.gen_range(2..=16usize);
                for _ in 0..n {
                    let t = d * MINUTES_PER_DAY + rng.gen_range(0..MINUTES_PER_DAY);
                    if t < minutes {
                        c[t] += 1;
                    }
                }
            }
        }
        TraceClass::Mixed => {
            let period = [10usize, 15, 30][rng.gen_range(0..3)];
            let phase = rng.gen_range(0..period);
            let base = rng.gen_range(0.02..0.1);
            let amp = rng.gen_range(0.5..0.9);
            let peak = rng.gen_range(0.0..MINUTES_PER_DAY as f64);
            for (t, v) in c.iter_mut().enumerate() {
                *v = poisson(rng, diurnal_rate(base, amp, peak, t));
                if t % period == phase {
                    *v += 1;
                }
            }
            params.period = Some(period);
            params.phase = Some(phase);
        }
    }
    (c, params)
}

fn trigger_for(class: TraceClass, rng: &mut StdRng) -> &'static str {
    match class {
        TraceClass::Timer => "timer",
        TraceClass::Diurnal => "http",
        TraceClass::Bursty => ["queue", "event", "http"][rng.gen_range(0..3)],
        TraceClass::Sparse => ["http", "storage", "others"][rng.gen_range(0..3)],
        TraceClass::Mixed => "http",
    }
}

/// Generates the whole synthetic suite: `per_class` functions of every class.
pub fn generate(cfg: &SynthConfig) -> Trace {
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let minutes = cfg.days as usize * MINUTES_PER_DAY;
    let mut functions = Vec::new();
    for class in TraceClass::ALL {
        for _ in 0..cfg.per_class {
            let owner = hex_id(&mut rng);
            let app = hex_id(&mut rng);
            let function = hex_id(&mut rng);
            let trigger = trigger_for(class, &mut rng).to_string();
            let (mut counts, _) = generate_series(class, minutes, &mut rng);
            // The trace format lists only functions invoked on a day: make sure every day of every
            // function has at least one call so the function survives a write/read round trip with
            // the same number of days.
            for d in 0..cfg.days as usize {
                let day = &mut counts[d * MINUTES_PER_DAY..(d + 1) * MINUTES_PER_DAY];
                if day.iter().all(|&v| v == 0) {
                    day[rng.gen_range(0..MINUTES_PER_DAY)] = 1;
                }
            }
            // DL inference execution times (SMORE Table II warm starts: 3–37 ms; allow up to 200 ms
            // for larger batches), log-uniform.
            let avg = log_uniform(&mut rng, 5.0, 200.0).round();
            functions.push(FunctionTrace {
                key: FunctionKey {
                    owner,
                    app,
                    function,
                },
                trigger,
                class: Some(class.label().to_string()),
                counts,
                avg_duration_ms: Some(avg),
            });
        }
    }
    functions.sort_by(|a, b| a.key.cmp(&b.key));
    Trace {
        days: (1..=cfg.days).collect(),
        functions,
    }
}

/// Coefficient of variation (std / mean) of a series; 0 for an all-zero series.
pub fn cv(xs: &[u32]) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    let n = xs.len() as f64;
    let mean = xs.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
    if mean == 0.0 {
        return 0.0;
    }
    let var = xs
        .iter()
        .map(|&x| (f64::from(x) - mean).powi(2))
        .sum::<f64>()
        / n;
    var.sqrt() / mean
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(class: TraceClass, seed: u64) -> (Vec<u32>, ClassParams) {
        let mut rng = StdRng::seed_from_u64(seed);
        generate_series(class, 3 * MINUTES_PER_DAY, &mut rng)
    }

    #[test]
    fn timer_is_exactly_periodic() {
        for seed in 0..20 {
            let (c, p) = series(TraceClass::Timer, seed);
            let (period, phase) = (p.period.unwrap(), p.phase.unwrap());
            for (t, &v) in c.iter().enumerate() {
                assert_eq!(v > 0, t % period == phase, "seed {seed} minute {t}");
            }
            // Autocorrelation of the activity indicator at lag P is 1: x[t] == x[t+P] everywhere.
            assert!(c.windows(period + 1).all(|w| w[0] == w[period]));
        }
    }

    #[test]
    fn diurnal_has_peak_to_trough_ratio() {
        for seed in 0..20 {
            let (c, _) = series(TraceClass::Diurnal, seed);
            // Hourly means over day 1, then the best and worst 4-hour windows (circular).
            let day = &c[..MINUTES_PER_DAY];
            let hourly: Vec<f64> = day
                .chunks(60)
                .map(|h| h.iter().map(|&v| f64::from(v)).sum::<f64>() / 60.0)
                .collect();
            let win = |s: usize| (0..4).map(|i| hourly[(s + i) % 24]).sum::<f64>() / 4.0;
            let hi = (0..24).map(win).fold(f64::MIN, f64::max);
            let lo = (0..24).map(win).fold(f64::MAX, f64::min).max(1e-9);
            assert!(hi / lo >= 4.0, "seed {seed}: ratio {}", hi / lo);
        }
    }

    #[test]
    fn bursty_has_high_cv_and_few_active_minutes() {
        for seed in 0..20 {
            let (c, _) = series(TraceClass::Bursty, seed);
            let active = c.iter().filter(|&&v| v > 0).count() as f64 / c.len() as f64;
            assert!(cv(&c) >= 2.0, "seed {seed}: cv {}", cv(&c));
            assert!(
                (0.01..=0.25).contains(&active),
                "seed {seed}: active {active}"
            );
        }
    }

    #[test]
    fn sparse_is_invoked_less_than_once_per_hour() {
        for seed in 0..20 {
            let (c, _) = series(TraceClass::Sparse, seed);
            let active = c.iter().filter(|&&v| v > 0).count();
            assert!(active >= 1);
            assert!(
                (active as f64) < c.len() as f64 / 60.0,
                "seed {seed}: {active}"
            );
        }
    }

    #[test]
    fn mixed_has_periodic_component_and_background() {
        for seed in 0..20 {
            let (c, p) = series(TraceClass::Mixed, seed);
            let (period, phase) = (p.period.unwrap(), p.phase.unwrap());
            let on: Vec<u32> = c
                .iter()
                .enumerate()
                .filter(|(t, _)| t % period == phase)
                .map(|(_, &v)| v)
                .collect();
            let off: Vec<u32> = c
                .iter()
                .enumerate()
                .filter(|(t, _)| t % period != phase)
                .map(|(_, &v)| v)
                .collect();
            assert!(
                on.iter().all(|&v| v >= 1),
                "seed {seed}: a firing is missing"
            );
            let off_active = off.iter().filter(|&&v| v > 0).count() as f64 / off.len() as f64;
            assert!(
                (0.01..=0.5).contains(&off_active),
                "seed {seed}: background {off_active}"
            );
        }
    }

    #[test]
    fn generation_is_reproducible_and_seed_dependent() {
        let cfg = SynthConfig {
            seed: 7,
            days: 2,
            per_class: 2,
        };
        let a = generate(&cfg);
        let b = generate(&cfg);
        assert_eq!(a, b);
        let c = generate(&SynthConfig { seed: 8, ..cfg });
        assert_ne!(a, c);
        assert_eq!(a.functions.len(), 10);
        for class in TraceClass::ALL {
            assert_eq!(
                a.functions
                    .iter()
                    .filter(|f| f.class.as_deref() == Some(class.label()))
                    .count(),
                2
            );
        }
    }

    #[test]
    fn poisson_mean_is_right() {
        let mut rng = StdRng::seed_from_u64(1);
        for lambda in [0.5, 4.0, 50.0] {
            let n = 20_000;
            let mean = (0..n)
                .map(|_| f64::from(poisson(&mut rng, lambda)))
                .sum::<f64>()
                / n as f64;
            assert!(
                (mean - lambda).abs() < 0.05 * lambda + 0.02,
                "λ {lambda}: mean {mean}"
            );
        }
    }
}
