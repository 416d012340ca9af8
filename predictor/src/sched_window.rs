//! θ_train spent over time (beyond SMORE): a per-GPU budget of *predicted training degradation ×
//! time* over a sliding window, spent by admitted requests and refilled as time passes.
//!
//! Why: SMORE's rule (and [`super::refine_with_share`]'s θ/k split) bounds the *predicted
//! instantaneous* D̂_train of every co-location, while θ_train is the bound on the trainer's slowdown
//! averaged over time (the SMORE paper defines training degradation on the mean iteration time;
//! docs/predictor.md). Requests of a few ms that push D̂_train above θ for a few ms cost the mean
//! little. This rule admits such a co-location when the GPU's predicted slowdown *averaged over
//! every window of `window_ms`* stays ≤ θ_train, with an optional cap `peak`·θ_train on the
//! instantaneous prediction — and sizes a new request's share against what its neighbours leave
//! (θ·peak minus their predicted contribution now), not an equal θ/k split (docs/eval.md,
//! "Spending θ over time").
//!
//! Accounting: an admitted request reserves its predicted contribution d = corr·D̂_train(T, f)·
//! min(1, s/u) (the multi-way model is additive over functions, eq. 3) over its predicted run time
//! [now, now + lat_solo·(1 + D̂_fn)·max(1, u/s)). The ledger holds these reservations; the GPU's
//! predicted slowdown at t is the sum of the reservations covering t. A request that runs longer
//! or shorter than predicted is not re-charged: like D̂ itself, the duration is a prediction, and
//! what really happens to training is what the evaluation's SFD measures.
//!
//! Owns: [`ThetaWindow`] (the settings), [`ThetaLedger`] (reservations and the window arithmetic)
//! and [`evaluate_windowed`] (the admission rule, used by [`super::Scheduler`] and callable by
//! the arbiter's policy inside [`super::choose`]).
//! Must never: read clocks (the caller passes `now_ms`), or admit a reservation that would take
//! any window's predicted mean above θ_train (the ledger's invariant, tested on a whole simulated
//! run in `eval`).

use super::{
    evaluate_with_theta, work_rate, CandidateEval, DegradationModel, GpuSnapshot, PendingItem,
    SchedConfig, Verdict,
};
use serde::{Deserialize, Serialize};

/// Settings of the windowed θ budget ([`SchedConfig::window`]; None = SMORE's instantaneous rule).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ThetaWindow {
    /// Length of the sliding window the predicted slowdown is averaged over, ms (> 0).
    pub window_ms: f64,
    /// Highest predicted *instantaneous* slowdown allowed, as a multiple of θ_train (≥ 1;
    /// infinity = no instantaneous cap, only the window mean).
    pub peak: f64,
}

/// One admitted request's predicted contribution to its GPU's training slowdown.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Reservation {
    /// When it starts, ms (the caller's clock).
    pub start_ms: f64,
    /// When it is predicted to end, ms.
    pub end_ms: f64,
    /// Predicted training slowdown it adds while it runs (fraction; 0.05 = 5 %).
    pub rate: f64,
}

impl Reservation {
    /// Predicted degradation × time it contributes to the window [t − w, t), ms.
    pub fn mass_in(&self, t: f64, w: f64) -> f64 {
        let lo = self.start_ms.max(t - w);
        let hi = self.end_ms.min(t);
        self.rate * (hi - lo).max(0.0)
    }
}

/// A GPU's reservations: the budget's bookkeeping.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ThetaLedger {
    res: Vec<Reservation>,
    generation: u64,
}

impl ThetaLedger {
    /// Predicted slowdown at `t`: the sum of the reservations covering it.
    pub fn rate_at(&self, t: f64) -> f64 {
        self.res
            .iter()
            .filter(|r| r.start_ms <= t && t < r.end_ms)
            .map(|r| r.rate)
            .sum()
    }

    /// Predicted degradation × time in the window [t − w, t), ms.
    pub fn window_mass(&self, t: f64, w: f64) -> f64 {
        self.res.iter().map(|r| r.mass_in(t, w)).sum()
    }

    /// The largest predicted degradation × time of any window of length `w` ending in
    /// [now, ∞) once `new` (starting at `now`) is added. Windows ending before `now` are not
    /// touched by `new`. A sweep over the points where the window's slope changes:
    /// O(n log n) for the n reservations kept.
    pub fn max_window_mass_with(&self, new: &Reservation, now: f64, w: f64) -> f64 {
        let all = || self.res.iter().chain(std::iter::once(new));
        let mut s: f64 = all().map(|r| r.mass_in(now, w)).sum();
        // slope of S(t) = D(t) − D(t − w) just after `now`.
        let covers = |r: &Reservation, t: f64| r.start_ms <= t && t < r.end_ms;
        let mut slope: f64 = all()
            .map(|r| {
                let mut x = 0.0;
                if covers(r, now) {
                    x += r.rate;
                }
                if covers(r, now - w) {
                    x -= r.rate;
                }
                x
            })
            .sum();
        let mut ev: Vec<(f64, f64)> = Vec::with_capacity(3 * (self.res.len() + 1));
        for r in all() {
            for (t, d) in [
                (r.end_ms, -r.rate),
                (r.start_ms + w, -r.rate),
                (r.end_ms + w, r.rate),
            ] {
                if t > now {
                    ev.push((t, d));
                }
            }
        }
        ev.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut best = s;
        let mut at = now;
        for (t, d) in ev {
            s += slope * (t - at);
            best = best.max(s);
            at = t;
            slope += d;
        }
        best
    }

    /// Records an admitted reservation.
    pub fn spend(&mut self, r: Reservation) {
        self.res.push(r);
        self.generation += 1;
    }

    /// Forgets reservations that no window ending at or after `now` can see (ended ≤ now − w).
    /// Returns whether any was dropped (the budget then refilled).
    pub fn prune(&mut self, now: f64, w: f64) -> bool {
        let before = self.res.len();
        self.res.retain(|r| r.end_ms > now - w);
        let dropped = self.res.len() != before;
        if dropped {
            self.generation += 1;
        }
        dropped
    }

    /// Changes on every spend and every prune that dropped something: a refused item may fit
    /// after it ([`super::Retry::OnChange`]).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The reservations kept, in admission order.
    pub fn reservations(&self) -> &[Reservation] {
        &self.res
    }
}

/// What [`evaluate_windowed`] would grant on an acceptable GPU with a training job.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct WindowGrant {
    /// SM share, percent (the largest grid share meeting every bound).
    pub share: u32,
    /// What the request reserves of the GPU's budget.
    pub reservation: Reservation,
}

/// Algorithm 1's per-candidate evaluation with θ_train spent over time: memory (σ), SLO and the
/// residents' SLOs as [`super::evaluate_candidate`]; then, on a GPU with a training job, the
/// largest share on [`SchedConfig::share_grid`] for which
/// - the predicted instantaneous slowdown (the ledger's rate now + this request's) ≤ peak·θ,
/// - the latency lat_solo·(1 + D̂_fn)·max(1, u/s) ≤ the item's SLO (time left), and
/// - every window of `window_ms` keeps a predicted mean ≤ θ with this request's reservation.
///
/// Acceptable candidates carry the predicted instantaneous D̂_train after admission and D̂_fn at
/// the share (the placement score uses them). A refused one says which bound failed:
/// [`Verdict::ThetaWindow`] when some share met the SLO but not the budget, else
/// [`Verdict::Slo`]. A GPU without training is evaluated exactly as by
/// [`super::evaluate_candidate`] (no grant: full share, nothing to protect).
pub fn evaluate_windowed(
    cfg: &SchedConfig,
    win: &ThetaWindow,
    snap: &GpuSnapshot,
    item: &PendingItem,
    model: &dyn DegradationModel,
    ledger: &ThetaLedger,
    now_ms: f64,
) -> (CandidateEval, Option<WindowGrant>) {
    // The θ bound is this rule's; the rest of Algorithm 1's checks are the shared ones.
    let mut e = evaluate_with_theta(cfg, f64::INFINITY, snap, item, model);
    let (Some(train), Some(d_fn)) = (&snap.training, e.d_fn) else {
        return (e, None);
    };
    if e.score.is_none() {
        return (e, None);
    }
    let Some(d_full) = model.train_deg(train, &[&item.key]) else {
        e.verdict = Verdict::Unpredictable;
        e.score = None;
        return (e, None);
    };
    let d_full = d_full * snap.train_correction;
    let theta = cfg.theta_train;
    let w = win.window_ms;
    let base = ledger.rate_at(now_ms);
    let mut shares = cfg.share_grid.clone();
    shares.sort_unstable();
    // The budget verdict at the smallest share tried that met the SLO.
    let mut budget_fail: Option<Verdict> = None;
    let mut slo_fail: Option<f64> = None;
    for &s in shares.iter().rev() {
        let rate = work_rate(s, item.sm_util);
        let d = d_full * rate;
        let lat = item.solo_latency_ms * (1.0 + d_fn) / rate.max(1e-9);
        if lat > item.slo_ms {
            // Smaller shares only lengthen the latency.
            slo_fail = Some(lat);
            break;
        }
        if base + d > win.peak * theta {
            budget_fail = Some(Verdict::ThetaTrain {
                predicted: base + d,
                theta: win.peak * theta,
            });
            continue;
        }
        let r = Reservation {
            start_ms: now_ms,
            end_ms: now_ms + lat,
            rate: d,
        };
        let mean = ledger.max_window_mass_with(&r, now_ms, w) / w;
        if mean > theta {
            budget_fail = Some(Verdict::ThetaWindow {
                predicted_mean: mean,
                theta,
                window_ms: w,
            });
            continue;
        }
        let d_train = base + d;
        let d_fn_s = (lat / item.solo_latency_ms.max(1e-9) - 1.0).max(0.0);
        e.d_train = Some(d_train);
        e.d_fn = Some(d_fn_s);
        e.score = Some(cfg.score(d_train, d_fn_s));
        return (
            e,
            Some(WindowGrant {
                share: s,
                reservation: r,
            }),
        );
    }
    e.score = None;
    e.verdict = match (budget_fail, slo_fail) {
        (Some(v), _) => v,
        (None, Some(lat)) => Verdict::Slo {
            predicted_ms: lat,
            slo_ms: item.slo_ms,
        },
        // An empty grid is refused by `SchedConfig::validate`.
        (None, None) => Verdict::Unpredictable,
    };
    (e, None)
}

#[cfg(test)]
mod tests {
    use super::super::{evaluate_candidate, refine_with_share, GpuSnapshot, Resident};
    use super::*;
    use crate::features::ModelKey;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// D̂_train = 0.3 per function (additive, as eq. 3), D̂_fn = 0.
    struct Flat;
    impl DegradationModel for Flat {
        fn train_deg(&self, _: &ModelKey, fns: &[&ModelKey]) -> Option<f64> {
            Some(0.3 * fns.len() as f64)
        }
        fn fn_deg(&self, _: Option<&ModelKey>, _: &[&ModelKey], _: usize) -> Option<f64> {
            Some(0.0)
        }
    }

    fn key(m: &str) -> ModelKey {
        ModelKey {
            model: m.into(),
            batch: 1,
        }
    }

    fn gpu() -> GpuSnapshot {
        GpuSnapshot {
            index: 0,
            capacity: 100,
            used: 10,
            training: Some(key("trainer")),
            functions: vec![Resident {
                id: 99,
                key: key("f"),
                slo_ms: 1e9,
                solo_latency_ms: 10.0,
                sm_util: 0.5,
            }],
            train_correction: 1.0,
        }
    }

    /// 10 ms alone, half the SMs, a 20 ms SLO.
    fn item(id: u64) -> PendingItem {
        PendingItem {
            id,
            key: key("f"),
            slo_ms: 20.0,
            solo_latency_ms: 10.0,
            sm_util: 0.5,
            memory: 1,
            expected_util_gain: 0.5,
            expected_degradation: 0.0,
        }
    }

    const WIN: ThetaWindow = ThetaWindow {
        window_ms: 100.0,
        peak: f64::INFINITY,
    };

    #[test]
    fn the_window_admits_above_theta_over_k_while_it_has_room_and_refuses_when_spent() {
        let cfg = SchedConfig::default(); // θ = 0.1
        let snap = gpu();
        // SMORE's rule refuses a full share (0.6 > θ) and the θ/k split (k = 2) throttles the
        // request to a share whose latency misses the 20 ms SLO.
        let e = evaluate_candidate(&cfg, &snap, &item(1), &Flat);
        assert!(matches!(e.verdict, Verdict::ThetaTrain { .. }), "{e:?}");
        let e = refine_with_share(&cfg, &snap, &item(1), e, &Flat);
        assert!(e.score.is_none(), "θ/k sizing: {e:?}");
        // The window (θ·W = 10 ms of slowdown) takes 3 reservations of 0.3 × 10 ms at full share:
        // an instantaneous 0.3 — three times θ, six times θ/k — while the mean has room.
        let mut l = ThetaLedger::default();
        for i in 0..3 {
            let (e, g) = evaluate_windowed(&cfg, &WIN, &snap, &item(i), &Flat, &l, 0.0);
            let g = g.unwrap_or_else(|| panic!("reservation {i} refused: {e:?}"));
            assert_eq!(g.share, 100);
            assert!((g.reservation.rate - 0.3).abs() < 1e-12);
            assert!((g.reservation.end_ms - 10.0).abs() < 1e-12);
            assert!(e.score.is_some());
            l.spend(g.reservation);
        }
        assert!((l.rate_at(5.0) - 0.9).abs() < 1e-12);
        // A fourth would make the window [0, 100) hold 12 ms > 10 ms at every share meeting the SLO.
        let (e, g) = evaluate_windowed(&cfg, &WIN, &snap, &item(3), &Flat, &l, 0.0);
        assert!(g.is_none());
        assert!(
            matches!(e.verdict, Verdict::ThetaWindow { predicted_mean, theta, .. }
                if predicted_mean > theta && (theta - 0.1).abs() < 1e-12),
            "{e:?}"
        );
        assert!(e.verdict.to_string().contains("θ_train"));
        // Still spent at 50 ms: the windows ending in [60, 100] would hold the first three's 9 ms
        // and the new 3 ms.
        let (_, g) = evaluate_windowed(&cfg, &WIN, &snap, &item(3), &Flat, &l, 50.0);
        assert!(g.is_none());
        // Refilled once the first three left the window.
        assert!(l.prune(110.0, WIN.window_ms));
        assert!(l.reservations().is_empty());
        let (_, g) = evaluate_windowed(&cfg, &WIN, &snap, &item(3), &Flat, &l, 110.0);
        assert_eq!(g.map(|g| g.share), Some(100));
    }

    #[test]
    fn the_peak_cap_sizes_the_share_against_what_the_neighbours_leave() {
        let cfg = SchedConfig::default();
        let win = ThetaWindow {
            window_ms: 100.0,
            peak: 2.0,
        };
        let mut l = ThetaLedger::default();
        // Nothing reserved now: the largest share with 0.3·min(1, s/0.5) ≤ 0.2 is 30 % (0.18),
        // 16.7 ms ≤ the 20 ms SLO.
        let (_, g) = evaluate_windowed(&cfg, &win, &gpu(), &item(1), &Flat, &l, 0.0);
        let g = g.unwrap();
        assert_eq!(g.share, 30);
        assert!((g.reservation.rate - 0.18).abs() < 1e-12);
        l.spend(g.reservation);
        // The neighbour now takes 0.18 of 0.2: no share meeting the SLO fits under the cap.
        let (e, g) = evaluate_windowed(&cfg, &win, &gpu(), &item(2), &Flat, &l, 1.0);
        assert!(g.is_none());
        assert!(
            matches!(e.verdict, Verdict::ThetaTrain { theta, .. } if (theta - 0.2).abs() < 1e-12),
            "{e:?}"
        );
    }

    #[test]
    fn a_gpu_without_training_is_not_budgeted() {
        let cfg = SchedConfig::default();
        let mut snap = gpu();
        snap.training = None;
        let l = ThetaLedger::default();
        let (e, g) = evaluate_windowed(&cfg, &WIN, &snap, &item(1), &Flat, &l, 0.0);
        assert!(e.score.is_some() && g.is_none(), "{e:?}");
    }

    #[test]
    fn the_scheduler_records_reservations_and_looks_again_when_the_budget_refills() {
        let cfg = SchedConfig {
            window: Some(WIN),
            retry: super::super::Retry::OnChange,
            ..SchedConfig::default()
        };
        let mut s: super::super::Scheduler = super::super::Scheduler::new(cfg, 1).unwrap();
        let mut gpus = vec![gpu()];
        for i in 0..4 {
            s.submit(item(i));
        }
        let mut placed = Vec::new();
        let mut round = |s: &mut super::super::Scheduler, gpus: &mut Vec<GpuSnapshot>, now| {
            s.run_round_at(gpus, &Flat, now, |g, it, (), p| {
                placed.push(*p);
                g.add_resident(it);
            })
        };
        let d = round(&mut s, &mut gpus, 0.0);
        assert_eq!(d.len(), 4);
        assert!(
            matches!(
                d[3].explanation.candidates[0].verdict,
                Verdict::ThetaWindow { .. }
            ),
            "{:?}",
            d[3]
        );
        assert_eq!(s.ledger(0).map(|l| l.reservations().len()), Some(3));
        // Nothing changed by 50 ms (the reservations are still in the window): not looked at.
        assert!(round(&mut s, &mut gpus, 50.0).is_empty());
        // At 110 ms they left the window: the refill is a change, the request is placed.
        let d = round(&mut s, &mut gpus, 110.0);
        assert_eq!(d.len(), 1);
        assert!(matches!(
            d[0].outcome,
            super::super::Outcome::Placed { gpu: 0 }
        ));
        assert_eq!(placed.len(), 4);
        assert!(placed
            .iter()
            .all(|p| p.share == Some(100) && p.reservation.is_some()));
        assert_eq!(s.queue_len(), 0);
    }

    /// The sweep agrees with evaluating every window at every breakpoint.
    #[test]
    fn the_sweep_finds_the_fullest_window() {
        let mut rng = StdRng::seed_from_u64(7);
        for case in 0..200 {
            let w = rng.gen_range(5.0..50.0);
            let now = 100.0;
            let mut l = ThetaLedger::default();
            for _ in 0..rng.gen_range(0..12) {
                let start = rng.gen_range(now - 80.0..=now);
                l.spend(Reservation {
                    start_ms: start,
                    end_ms: start + rng.gen_range(0.5..60.0),
                    rate: rng.gen_range(0.0..0.5),
                });
            }
            let new = Reservation {
                start_ms: now,
                end_ms: now + rng.gen_range(0.5..40.0),
                rate: rng.gen_range(0.0..0.5),
            };
            let got = l.max_window_mass_with(&new, now, w);
            let mut all = l.clone();
            all.spend(new);
            let mut ts = vec![now];
            for r in all.reservations() {
                for t in [r.start_ms, r.end_ms, r.start_ms + w, r.end_ms + w] {
                    if t >= now {
                        ts.push(t);
                    }
                }
            }
            let want = ts
                .iter()
                .map(|&t| all.window_mass(t, w))
                .fold(0.0, f64::max);
            assert!((got - want).abs() < 1e-9, "case {case}: {got} vs {want}");
        }
    }
}
