//! The functions' time budget on one GPU: how much SM time all functions together may take so
//! that training slows by at most θ_train.
//!
//! Owns: the worst-case budget θ/(u+θ) (see [`function_time_budget`]) and the feedback loop
//! that multiplies it ×1…×[`BOOST_MAX`] while the training slowdown measured from NVML stays
//! well under θ. Inputs: the GPU's trusted training estimate (solo utilization), θ, the
//! measured slowdown and the functions' loads; output: the total budget the policy splits into
//! shares ([`crate::policy::Policy::shares`]).
//!
//! Must never: exceed the whole GPU (1.0), or go below the worst case (the boost is ≥ 1). This
//! is the seam a harvest controller replaces: nothing else computes a budget.

use serde::Serialize;

/// Largest multiplier of the worst-case time budget the feedback loop may reach. Reasoning: at
/// ×6 a 60 %-busy trainer's budget (14 %) reaches the ~85 % a light function set could use;
/// the loop shrinks it again as soon as the measured slowdown passes θ.
pub const BOOST_MAX: f64 = 6.0;
/// Growth of the boost per observation while the slowdown stays under θ/2 (×1.25).
const BOOST_GROW: f64 = 1.25;
/// Shrink of the boost per observation while the slowdown exceeds θ (÷1.5).
const BOOST_SHRINK: f64 = 1.5;
/// A function counts as held at its share when it uses at least this fraction of it.
const HELD_AT_SHARE: f64 = 0.7;

/// Total SM time S (fraction of the GPU) functions on a GPU may take while training is slowed by
/// at most θ. The shim spreads a function's time evenly over its window; it does not know when
/// training idles, so function time lands in training's busy phases as often as anywhere. A busy
/// phase of length B then stretches to B' with B' = B + S·B', i.e. B/(1−S), and an iteration that
/// is busy a fraction u of its time slows by D = u·S/(1−S). D ≤ θ ⇔ S ≤ θ/(u+θ).
///
/// An earlier model, (1 − u) + u·θ/(1+θ), assumed functions fill training's idle gaps first; on
/// the simulated GPU it let a trainer busy 72 % slow by 23 % at θ = 10 % (test
/// `colocation_loop`), because nothing aligns function kernels with those gaps.
pub fn function_time_budget(solo_util: f64, theta: f64) -> f64 {
    let u = solo_util.clamp(0.0, 1.0);
    if u <= 0.0 {
        return 1.0;
    }
    (theta / (u + theta)).min(1.0)
}

/// What the feedback loop needs to know about one function on the GPU.
#[derive(Debug, Clone, Copy)]
pub struct FunctionLoad {
    /// Its current share, percent.
    pub share: u32,
    /// SM time NVML attributes to it, percent (None: not seen in the last sample).
    pub sm_used: Option<u32>,
}

impl FunctionLoad {
    /// Whether the function is held back by its share (uses most of a share below 100 %).
    fn held_at_share(self) -> bool {
        self.share < 100
            && self
                .sm_used
                .is_some_and(|u| u as f64 >= HELD_AT_SHARE * self.share as f64)
    }
}

/// One GPU's time budget: the worst case times a boost the feedback loop adjusts.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TimeBudget {
    /// Multiplier on the worst-case budget (1 ..= [`BOOST_MAX`]).
    #[serde(rename = "budget_boost")]
    boost: f64,
}

impl Default for TimeBudget {
    fn default() -> Self {
        TimeBudget { boost: 1.0 }
    }
}

impl TimeBudget {
    /// The current multiplier (what policies see as `GpuView::budget_boost`).
    pub fn boost(&self) -> f64 {
        self.boost
    }

    /// The functions' total budget (fraction of the GPU) for a training job busy `solo_util`
    /// alone (None: unknown ⇒ assume fully busy, the safe side).
    pub fn total(boost: f64, solo_util: Option<f64>, theta: f64) -> f64 {
        (function_time_budget(solo_util.unwrap_or(1.0), theta) * boost.max(1.0)).min(1.0)
    }

    /// Back to the worst case (functions or training left the GPU).
    pub fn reset(&mut self) {
        self.boost = 1.0;
    }

    /// One feedback step: the worst case assumes every function uses its whole share all the
    /// time; real functions mostly do not. While the measured `slowdown` stays under θ/2 and
    /// some function is held at its share, the budget grows by 25 %; above θ it shrinks by a
    /// third, back to the worst case at most. Returns whether the boost changed.
    pub fn feedback(&mut self, slowdown: f64, theta: f64, functions: &[FunctionLoad]) -> bool {
        let old = self.boost;
        let constrained = functions.iter().any(|f| f.held_at_share());
        self.boost = if slowdown > theta {
            (old / BOOST_SHRINK).max(1.0)
        } else if slowdown < theta / 2.0 && constrained {
            (old * BOOST_GROW).min(BOOST_MAX)
        } else {
            old
        };
        self.boost != old
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HELD: FunctionLoad = FunctionLoad {
        share: 14,
        sm_used: Some(14),
    };

    #[test]
    fn the_worst_case_budget_keeps_training_within_theta() {
        assert!((function_time_budget(0.6, 0.1) - 0.1 / 0.7).abs() < 1e-12);
        assert_eq!(function_time_budget(0.0, 0.1), 1.0);
        assert!((TimeBudget::total(1.0, None, 0.1) - 0.1 / 1.1).abs() < 1e-12);
        assert_eq!(
            TimeBudget::total(100.0, Some(0.6), 0.1),
            1.0,
            "never above the GPU"
        );
    }

    #[test]
    fn the_boost_grows_only_while_functions_are_held_and_shrinks_back_to_the_worst_case() {
        let mut b = TimeBudget::default();
        let idle = FunctionLoad {
            share: 14,
            sm_used: Some(1),
        };
        assert!(
            !b.feedback(0.01, 0.1, &[idle]),
            "no function held: no growth"
        );
        for _ in 0..100 {
            b.feedback(0.01, 0.1, &[HELD]);
        }
        assert_eq!(b.boost(), BOOST_MAX);
        assert!(!b.feedback(0.07, 0.1, &[HELD]), "between θ/2 and θ: hold");
        for _ in 0..100 {
            b.feedback(0.2, 0.1, &[HELD]);
        }
        assert_eq!(b.boost(), 1.0);
    }
}
