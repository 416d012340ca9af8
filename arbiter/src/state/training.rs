//! What the arbiter knows about a GPU's training job: its processes (every GPU process no
//! function owns) and an estimate of its utilization alone and beside functions.
//!
//! Owns: [`TrainingEstimate`] — the solo/co-located EWMAs, when the solo figure is trusted, the
//! slowdown derived from them, and when it drifted enough to re-split shares. Must never: create
//! a solo estimate from co-located samples (unknown stays "fully busy", the safe side), or trust
//! a solo estimate before [`SOLO_MIN_SAMPLES`] samples.

use serde::Serialize;

/// Smoothing of training's utilization (EWMA weight of a new sample). Reasoning: samples come
/// every reconcile period (250 ms); 0.2 averages over ~1 s, enough to ride out one sample.
pub const SOLO_UTIL_ALPHA: f64 = 0.2;
/// Solo samples before training's solo utilization is trusted (× reconcile period: 2 s at
/// 250 ms). A job's first samples are often idle (loading data, building the model): trusting
/// them gave functions 100 % shares beside a trainer that then ran flat out (test
/// `a_function_using_more_sm_time_than_its_share_gets_the_watchdog` caught it).
pub const SOLO_MIN_SAMPLES: u32 = 8;
/// Training utilization change (fraction) that makes the arbiter re-split shares.
pub const RESHARE_DELTA: f64 = 0.05;
/// Largest training slowdown the estimate reports (fraction): beyond it the ratio of two small
/// utilizations is noise.
const MAX_SLOWDOWN: f64 = 5.0;

/// A training (unregistered) process on a GPU.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TrainingProc {
    /// Its pid.
    pub pid: u32,
    /// Device memory NVML attributes to it, bytes.
    pub used: u64,
    /// SM utilization NVML attributes to it, percent (None: NVML gave no sample).
    pub sm_util: Option<u32>,
}

/// Training's utilization on one GPU, alone and beside functions.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct TrainingEstimate {
    /// Training's utilization while no function ran on the GPU (EWMA, fraction).
    #[serde(rename = "training_solo_util")]
    solo: Option<f64>,
    /// Samples behind `solo`.
    #[serde(skip)]
    solo_samples: u32,
    /// Training's utilization while functions share the GPU (EWMA, fraction).
    #[serde(rename = "training_colocated_util")]
    colocated: Option<f64>,
    /// The trusted solo figure the shares were last split for.
    #[serde(skip)]
    at_last_share: Option<f64>,
}

pub(crate) fn ewma(old: Option<f64>, u: f64) -> f64 {
    match old {
        Some(old) => old + SOLO_UTIL_ALPHA * (u - old),
        None => u,
    }
}

impl TrainingEstimate {
    /// Folds one NVML sample in: the GPU's training processes, the device utilization
    /// (percent) and whether functions are placed on the GPU.
    pub fn observe(
        &mut self,
        training: &[TrainingProc],
        device_util: Option<u32>,
        with_functions: bool,
    ) {
        if !with_functions || training.is_empty() {
            // The next functions start from nothing known about co-location.
            self.colocated = None;
        }
        if training.is_empty() {
            // Training left: what is known about its utilization goes with it.
            self.solo = None;
            self.solo_samples = 0;
        } else if !with_functions {
            // Alone: NVML's per-process samples if present, else the device utilization (which
            // then includes nothing else, since no function is placed).
            let u = if training.iter().any(|t| t.sm_util.is_some()) {
                training.iter().filter_map(|t| t.sm_util).sum::<u32>()
            } else {
                device_util.unwrap_or(100)
            };
            self.solo_samples += 1;
            self.solo = Some(ewma(self.solo, pct(u)));
        } else if let Some(u) = training.iter().map(|t| t.sm_util).sum::<Option<u32>>() {
            // Co-located, training's own samples are a lower bound of its solo use: one that
            // exceeds a trusted estimate (a job ramping up after functions arrived) raises it —
            // the safe direction. They never create an estimate.
            let u = pct(u);
            if self.trusted().is_some_and(|old| u > old) {
                self.solo = Some(u);
            }
            self.colocated = Some(ewma(self.colocated, u));
        }
    }

    /// Training's solo utilization once enough samples back it.
    pub fn trusted(&self) -> Option<f64> {
        self.solo.filter(|_| self.solo_samples >= SOLO_MIN_SAMPLES)
    }

    /// Training's co-located utilization (EWMA), if observed.
    pub fn colocated(&self) -> Option<f64> {
        self.colocated
    }

    /// Training's slowdown beside the functions (fraction): a time-sliced job that keeps its
    /// work per iteration and gets less of the GPU shows proportionally lower utilization.
    pub fn slowdown(&self) -> Option<f64> {
        match (self.trusted(), self.colocated) {
            (Some(solo), Some(u)) if u > 0.0 => Some((solo / u - 1.0).clamp(0.0, MAX_SLOWDOWN)),
            _ => None,
        }
    }

    /// Whether the trusted estimate moved by more than [`RESHARE_DELTA`] since shares were last
    /// split (or became trusted since).
    pub fn drifted(&self) -> bool {
        match (self.trusted(), self.at_last_share) {
            (Some(a), Some(b)) => (a - b).abs() > RESHARE_DELTA,
            (Some(_), None) => true,
            _ => false,
        }
    }

    /// Shares were just split for the current estimate.
    pub fn mark_shared(&mut self) {
        self.at_last_share = self.trusted();
    }
}

fn pct(u: u32) -> f64 {
    u.min(100) as f64 / 100.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trainer(util: Option<u32>) -> Vec<TrainingProc> {
        vec![TrainingProc {
            pid: 7,
            used: 1 << 30,
            sm_util: util,
        }]
    }

    #[test]
    fn the_solo_estimate_is_trusted_only_after_enough_samples() {
        let mut e = TrainingEstimate::default();
        for i in 0..SOLO_MIN_SAMPLES {
            assert_eq!(e.trusted(), None, "trusted after {i} samples");
            e.observe(&trainer(Some(60)), Some(60), false);
        }
        assert_eq!(e.trusted(), Some(0.6));
        assert!(e.drifted());
        e.mark_shared();
        assert!(!e.drifted());
        // Training leaves: everything known goes.
        e.observe(&[], None, false);
        assert_eq!(e.trusted(), None);
    }

    #[test]
    fn colocated_samples_never_create_a_solo_estimate_but_may_raise_it() {
        let mut e = TrainingEstimate::default();
        e.observe(&trainer(Some(30)), Some(80), true);
        assert_eq!(e.trusted(), None, "unknown stays unknown (fully busy)");
        assert_eq!(e.colocated(), Some(0.3));
        let mut e = TrainingEstimate::default();
        for _ in 0..SOLO_MIN_SAMPLES {
            e.observe(&trainer(Some(50)), None, false);
        }
        e.observe(&trainer(Some(70)), None, true);
        assert_eq!(e.trusted(), Some(0.7), "a ramping job raises the estimate");
        e.observe(&trainer(Some(35)), None, true);
        assert_eq!(
            e.trusted(),
            Some(0.7),
            "lower co-located samples do not lower it"
        );
    }

    #[test]
    fn the_slowdown_compares_colocated_with_solo_utilization() {
        let mut e = TrainingEstimate::default();
        for _ in 0..SOLO_MIN_SAMPLES {
            e.observe(&trainer(None), Some(60), false);
        }
        assert_eq!(e.slowdown(), None);
        e.observe(&trainer(Some(40)), Some(90), true);
        let d = e.slowdown().unwrap();
        assert!((d - 0.5).abs() < 1e-9, "{d}");
    }
}
