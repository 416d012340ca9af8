//! Trace replay: drives a [`Policy`] minute by minute over one function's series and accounts
//! for cold starts and loaded-idle time.
//!
//! **Replay model** (one resident model instance per function; a GPU inference server batches
//! concurrent requests on it):
//! - At the start of minute `m` the policy is asked whether the model should be resident. If yes
//!   and it is not, it is pre-loaded and *ready at the minute start* (the load happened in the
//!   background before). If no and it is, it is unloaded as soon as it is idle (`max(t, busy_until)`).
//! - The `c` requests of minute `m` arrive evenly spread: request `i` at `60·m + 60·(i + ½)/c` s.
//! - A request finding no resident model is a cold start: the model starts loading, becomes ready
//!   `load_s` seconds later, and the request runs then. Requests arriving while it loads are cold
//!   too (they wait for the load). A model loaded on demand stays resident until the next decision.
//! - A request runs for the function's average duration (trace) or the default.
//!
//! **Metrics** (SMORE §VI-A, eq. 6–7; scored minutes only, after `score_from`):
//! - cold-start rate `N_cold / N_total`;
//! - waste rate `T_loaded_idle / T_loaded`, where `T_loaded` is the time the model is resident
//!   (ready) and `T_loaded_idle` the part of it that falls in minutes with no request arrival —
//!   SMORE's definition: "resource waste time when the model is loaded, but no requests arrive";
//! - wasted GPU-memory-time `Σ T_loaded_idle × model memory` (GiB·h);
//! - model loads (pre-warm + on-demand), a thrashing indicator.
//!
//! Must never: let a policy see a minute's requests before it decided for that minute.

use crate::policy::Policy;

/// A DL model a function serves: its cold-start cost and resident GPU memory.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelProfile {
    /// Name.
    pub name: &'static str,
    /// Cold-start (load) time, seconds.
    pub load_s: f64,
    /// Resident GPU memory, MiB.
    pub mem_mib: f64,
}

/// The models of SMORE's Table II. Load times: SMORE Table II cold starts (RTX 3090). Memory:
/// reasoning — fp32 weights (parameter count × 4 B: VGG-16 138 M, MobileNetV2 3.5 M, ResNet-50
/// 25.6 M, BERT-base 110 M, RoBERTa-base 125 M, DeepFM ≈ 10 M) plus ≈ 300 MiB of CUDA context and
/// framework workspace per process.
pub const MODEL_CATALOGUE: [ModelProfile; 6] = [
    ModelProfile {
        name: "vgg16",
        load_s: 1.2,
        mem_mib: 828.0,
    },
    ModelProfile {
        name: "mobilenet",
        load_s: 1.0,
        mem_mib: 314.0,
    },
    ModelProfile {
        name: "resnet50",
        load_s: 1.5,
        mem_mib: 398.0,
    },
    ModelProfile {
        name: "bert",
        load_s: 2.6,
        mem_mib: 720.0,
    },
    ModelProfile {
        name: "roberta",
        load_s: 5.2,
        mem_mib: 780.0,
    },
    ModelProfile {
        name: "deepfm",
        load_s: 0.6,
        mem_mib: 340.0,
    },
];

/// Deterministic model assignment: FNV-1a of the function hash picks a catalogue entry.
pub fn model_for(function_hash: &str) -> &'static ModelProfile {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in function_hash.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    &MODEL_CATALOGUE[(h % MODEL_CATALOGUE.len() as u64) as usize]
}

/// Default request duration when the trace has none, seconds (SMORE Table II warm starts are
/// 3–37 ms; 50 ms is a round middle).
pub const DEFAULT_DURATION_S: f64 = 0.05;

/// Replay of one function under one policy.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FunctionResult {
    /// Requests in scored minutes.
    pub n_total: u64,
    /// Cold requests in scored minutes.
    pub n_cold: u64,
    /// Resident seconds in scored minutes.
    pub loaded_s: f64,
    /// Resident seconds in scored minutes without requests.
    pub loaded_idle_s: f64,
    /// `loaded_idle_s × memory`, MiB·s.
    pub wasted_mib_s: f64,
    /// Model loads (pre-warm + on demand) in scored minutes.
    pub loads: u64,
    /// Scored minutes.
    pub minutes: u64,
    /// Per scored minute: the policy's forecast (if it makes one) — for plots.
    pub forecasts: Vec<Option<f64>>,
}

impl FunctionResult {
    /// Cold-start rate, or `None` without requests.
    pub fn cold_rate(&self) -> Option<f64> {
        (self.n_total > 0).then(|| self.n_cold as f64 / self.n_total as f64)
    }
}

/// Replay settings.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayConfig {
    /// First scored minute; earlier minutes are history the policy learns from.
    pub score_from: usize,
    /// Minutes before `score_from` in which the policy is already asked (so forecasters track
    /// their recent errors); earlier minutes are only observed.
    pub decide_lead: usize,
    /// Record forecasts for plots.
    pub record_forecasts: bool,
}

/// Replays `counts` under `policy`. `duration_s` is the request duration, `model` the model.
pub fn replay(
    counts: &[u32],
    duration_s: f64,
    model: &ModelProfile,
    policy: &mut dyn Policy,
    cfg: &ReplayConfig,
) -> FunctionResult {
    let mut r = FunctionResult::default();
    let decide_from = cfg.score_from.saturating_sub(cfg.decide_lead);
    let mut loaded = false;
    let mut ready_at = 0.0f64; // when the resident model is (was) ready
    let mut busy_until = 0.0f64;
    let mut unload_at: Option<f64> = None;
    for (m, &c) in counts.iter().enumerate() {
        let t0 = 60.0 * m as f64;
        let t1 = t0 + 60.0;
        let scored = m >= cfg.score_from;
        if m >= decide_from {
            // A model still draining from an earlier unload counts as resident for the decision.
            let want = policy.want_warm(m as u64, loaded);
            if scored && cfg.record_forecasts {
                r.forecasts.push(policy.last_forecast());
            }
            if want {
                unload_at = None;
                if !loaded {
                    loaded = true;
                    ready_at = t0;
                    if scored {
                        r.loads += 1;
                    }
                }
            } else if loaded && unload_at.is_none() {
                unload_at = Some(t0.max(busy_until).max(ready_at));
            }
        } else {
            // History only: no model.
            loaded = false;
            unload_at = None;
        }
        // Resident interval within this minute, split at on-demand loads.
        let mut resident = 0.0f64;
        let mut seg_start = if loaded { Some(ready_at.max(t0)) } else { None };
        for i in 0..c {
            let t = t0 + 60.0 * (f64::from(i) + 0.5) / f64::from(c);
            // Did a pending unload already happen before this arrival?
            if let Some(u) = unload_at {
                if u <= t {
                    if let Some(s) = seg_start.take() {
                        resident += (u.min(t1) - s).max(0.0);
                    }
                    loaded = false;
                    unload_at = None;
                }
            }
            let cold;
            if loaded {
                cold = t < ready_at;
                let start = t.max(ready_at);
                busy_until = busy_until.max(start + duration_s);
                if let Some(u) = unload_at.as_mut() {
                    *u = u.max(busy_until);
                }
            } else {
                cold = true;
                loaded = true;
                ready_at = t + model.load_s;
                busy_until = ready_at + duration_s;
                seg_start = Some(ready_at.min(t1));
                if scored {
                    r.loads += 1;
                }
            }
            if scored {
                r.n_total += 1;
                r.n_cold += u64::from(cold);
            }
        }
        // Close the minute.
        if let Some(s) = seg_start {
            let end = match unload_at {
                Some(u) if u <= t1 => {
                    loaded = false;
                    unload_at = None;
                    u
                }
                _ => t1,
            };
            resident += (end - s).max(0.0);
        }
        if scored {
            r.minutes += 1;
            r.loaded_s += resident;
            if c == 0 {
                r.loaded_idle_s += resident;
                r.wasted_mib_s += resident * model.mem_mib;
            }
        }
        policy.observe(m as u64, c);
    }
    r
}

/// Aggregate over a set of functions.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Aggregate {
    /// Functions.
    pub functions: usize,
    /// Requests.
    pub n_total: u64,
    /// Cold requests.
    pub n_cold: u64,
    /// `n_cold / n_total`.
    pub cold_rate: f64,
    /// `Σ loaded_idle / Σ loaded`.
    pub waste_rate: f64,
    /// Wasted GPU memory-time, GiB·h.
    pub wasted_gib_h: f64,
    /// Resident GPU memory-time, GiB·h.
    pub loaded_gib_h: f64,
    /// 75th percentile of the per-function cold-start rates (functions with requests).
    pub p75_cold_rate: f64,
    /// Loads per function per scored day.
    pub loads_per_fn_day: f64,
}

/// Nearest-rank percentile (`pct` in 0–100) of `xs`; 0 for an empty slice.
pub fn percentile(xs: &[f64], pct: f64) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    let mut v = xs.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let rank = ((pct / 100.0) * v.len() as f64).ceil().max(1.0) as usize;
    v[rank.min(v.len()) - 1]
}

/// Aggregates per-function results; `mem_mib` gives each function's model memory.
pub fn aggregate<'a>(results: impl IntoIterator<Item = (&'a FunctionResult, f64)>) -> Aggregate {
    let mut a = Aggregate::default();
    let (mut loaded, mut idle, mut loaded_mib_s, mut wasted_mib_s) = (0.0, 0.0, 0.0, 0.0);
    let mut rates = Vec::new();
    let mut minutes = 0u64;
    let mut loads = 0u64;
    for (r, mem) in results {
        a.functions += 1;
        a.n_total += r.n_total;
        a.n_cold += r.n_cold;
        loaded += r.loaded_s;
        idle += r.loaded_idle_s;
        loaded_mib_s += r.loaded_s * mem;
        wasted_mib_s += r.wasted_mib_s;
        minutes += r.minutes;
        loads += r.loads;
        if let Some(c) = r.cold_rate() {
            rates.push(c);
        }
    }
    a.cold_rate = if a.n_total > 0 {
        a.n_cold as f64 / a.n_total as f64
    } else {
        0.0
    };
    a.waste_rate = if loaded > 0.0 { idle / loaded } else { 0.0 };
    a.wasted_gib_h = wasted_mib_s / 1024.0 / 3600.0;
    a.loaded_gib_h = loaded_mib_s / 1024.0 / 3600.0;
    a.p75_cold_rate = percentile(&rates, 75.0);
    a.loads_per_fn_day = if minutes > 0 {
        loads as f64 / (minutes as f64 / 1440.0)
    } else {
        0.0
    };
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{FixedKeepAlive, Oracle};

    const M: ModelProfile = ModelProfile {
        name: "t",
        load_s: 2.0,
        mem_mib: 1024.0,
    };

    fn cfg() -> ReplayConfig {
        ReplayConfig {
            score_from: 0,
            decide_lead: 0,
            record_forecasts: false,
        }
    }

    #[test]
    fn fixed_keep_alive_accounting_by_hand() {
        // counts: [1, 0, 0, 1], keep-alive 1 min, load 2 s, duration 0.1 s.
        // m0: no model; request at 30 s is cold, ready at 32 s; resident 32..60 = 28 s (active).
        // m1: idle 0 < 1 → keep; resident 60 s, idle minute → waste 60 s.
        // m2: idle 1 → unload at 120 s; resident 0.
        // m3: not resident; request at 210 s cold; ready 212; resident 28 s (active).
        let mut p = FixedKeepAlive::new(1);
        let r = replay(&[1, 0, 0, 1], 0.1, &M, &mut p, &cfg());
        assert_eq!((r.n_total, r.n_cold), (2, 2));
        assert!(
            (r.loaded_s - (28.0 + 60.0 + 28.0)).abs() < 1e-9,
            "{}",
            r.loaded_s
        );
        assert!((r.loaded_idle_s - 60.0).abs() < 1e-9);
        assert!((r.wasted_mib_s - 60.0 * 1024.0).abs() < 1e-6);
        assert_eq!(r.loads, 2);
        assert_eq!(r.minutes, 4);
    }

    #[test]
    fn keep_alive_turns_second_request_warm() {
        // counts [1, 0, 1], keep-alive 2: m1, m2 resident; the request of m2 is warm.
        // Loaded: m0 28 s + m1 60 s + m2 60 s; idle: m1 only.
        let mut p = FixedKeepAlive::new(2);
        let r = replay(&[1, 0, 1], 0.1, &M, &mut p, &cfg());
        assert_eq!((r.n_total, r.n_cold), (2, 1));
        assert!((r.loaded_s - 148.0).abs() < 1e-9);
        assert!((r.loaded_idle_s - 60.0).abs() < 1e-9);
    }

    #[test]
    fn requests_during_a_load_are_cold() {
        // 40 requests in one minute: every 1.5 s from 0.75 s. Load 2 s: ready at 2.75 s; the
        // requests at 0.75 and 2.25 s are cold, the one at 3.75 s is warm.
        let mut p = FixedKeepAlive::new(1);
        let r = replay(&[40], 0.01, &M, &mut p, &cfg());
        assert_eq!((r.n_total, r.n_cold), (40, 2));
        assert!((r.loaded_s - (60.0 - 2.75)).abs() < 1e-9);
        assert_eq!(r.loaded_idle_s, 0.0);
    }

    #[test]
    fn oracle_has_no_cold_starts_and_no_waste() {
        let counts = [0, 2, 0, 0, 5, 1, 0];
        let mut p = Oracle::new(counts.to_vec());
        let r = replay(&counts, 0.05, &M, &mut p, &cfg());
        assert_eq!((r.n_total, r.n_cold), (8, 0));
        assert_eq!(r.loaded_idle_s, 0.0);
        assert!((r.loaded_s - 180.0).abs() < 1e-9);
    }

    #[test]
    fn unload_waits_for_a_running_request() {
        // One request at 59.5 s? Use 1 request: at 30 s, duration 40 s → busy until 72 s (cold:
        // ready 32 s, runs 32–72 s). m1: keep-alive 0 → unload at max(60, 72) = 72: resident 12 s
        // in an idle minute.
        let mut p = FixedKeepAlive::new(0);
        let r = replay(&[1, 0], 40.0, &M, &mut p, &cfg());
        assert!((r.loaded_s - (28.0 + 12.0)).abs() < 1e-9, "{}", r.loaded_s);
        assert!((r.loaded_idle_s - 12.0).abs() < 1e-9);
    }

    #[test]
    fn history_minutes_are_not_scored() {
        let mut p = FixedKeepAlive::new(10);
        let c = ReplayConfig {
            score_from: 2,
            decide_lead: 0,
            record_forecasts: false,
        };
        let r = replay(&[1, 0, 0, 1], 0.1, &M, &mut p, &c);
        // m2, m3 scored: m2 idle 1 < 10 → pre-loaded at 120 s; the m3 request is warm.
        assert_eq!((r.n_total, r.n_cold), (1, 0));
        assert_eq!(r.minutes, 2);
        assert!((r.loaded_s - 120.0).abs() < 1e-9);
        assert!((r.loaded_idle_s - 60.0).abs() < 1e-9);
    }

    #[test]
    fn aggregate_and_percentile() {
        assert_eq!(percentile(&[0.1, 0.4, 0.2, 0.3], 75.0), 0.3);
        assert_eq!(percentile(&[], 75.0), 0.0);
        let a = FunctionResult {
            n_total: 10,
            n_cold: 1,
            loaded_s: 100.0,
            loaded_idle_s: 50.0,
            wasted_mib_s: 50.0 * 1024.0,
            loads: 2,
            minutes: 1440,
            forecasts: vec![],
        };
        let b = FunctionResult {
            n_total: 10,
            n_cold: 5,
            loaded_s: 300.0,
            loaded_idle_s: 50.0,
            wasted_mib_s: 50.0 * 1024.0,
            loads: 4,
            minutes: 1440,
            forecasts: vec![],
        };
        let g = aggregate([(&a, 1024.0), (&b, 1024.0)]);
        assert_eq!(g.functions, 2);
        assert!((g.cold_rate - 0.3).abs() < 1e-12);
        assert!((g.waste_rate - 0.25).abs() < 1e-12);
        assert!((g.wasted_gib_h - 100.0 / 3600.0).abs() < 1e-12);
        assert!((g.p75_cold_rate - 0.5).abs() < 1e-12);
        assert!((g.loads_per_fn_day - 3.0).abs() < 1e-12);
    }
}
