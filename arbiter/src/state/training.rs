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

/// How functions share a GPU in one NVML sample: what bounds training's own time there.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Colocation {
    /// Points by which the GPU's per-process figures sum past the device's utilization (0 under
    /// MPS: [`super::watchdog::attribution_overlap`]).
    pub overlap_pct: u32,
    /// The functions' own GPU time, percent of wall time: for each, the smaller of what its
    /// shim reports and NVML's figure (a function NVML does not show counts 0). `None` until
    /// every function's use is known from a report.
    pub functions_pct: Option<u32>,
}

impl Colocation {
    /// Training's own time in a sample where its processes' figures sum to `figure_pct`, at
    /// most that figure. On a time-sliced GPU NVML counts a process's waits for its timeslice
    /// too: on an NVIDIA H200 a trainer whose kernels ran 8–11 % of the time read 63 % beside
    /// functions and raised its solo estimate to 0.67, a trainer busy most of the time
    /// (docs/real-gpu.md, section 9). Two lower bounds, the larger taken: its figure less the
    /// overlap (what the watchdog judges a function by), and the device's busy time less the
    /// functions' own (time-sliced, the device's busy time is the contexts' run times added).
    /// With overlaps of hundreds of points the first is 0; the second rests on the functions'
    /// reports, and a function that over-reports only lowers it — down to the first bound,
    /// which no report moves — so a function can at most stop the estimate from rising, never
    /// lower it (docs/arbiter.md, threat model).
    pub fn training_own_pct(&self, figure_pct: u32, device_util: Option<u32>) -> u32 {
        let by_overlap = figure_pct.saturating_sub(self.overlap_pct);
        let by_device = match (device_util, self.functions_pct) {
            (Some(d), Some(f)) => d.min(100).saturating_sub(f),
            _ => 0,
        };
        by_overlap.max(by_device).min(figure_pct)
    }
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
    /// Training's own time while functions share the GPU, as far as NVML proves it
    /// ([`Colocation::training_own_pct`]; EWMA, fraction): what raises a trusted solo figure.
    #[serde(rename = "training_colocated_own_util")]
    colocated_own: Option<f64>,
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
    /// (percent), and whether and how functions share the GPU ([`Colocation`]; `None`: no
    /// function is placed).
    pub fn observe(
        &mut self,
        training: &[TrainingProc],
        device_util: Option<u32>,
        functions: Option<Colocation>,
    ) {
        if functions.is_none() || training.is_empty() {
            // The next functions start from nothing known about co-location.
            self.colocated = None;
            self.colocated_own = None;
        }
        if training.is_empty() {
            // Training left: what is known about its utilization goes with it.
            self.solo = None;
            self.solo_samples = 0;
        } else if let Some(c) = functions {
            let Some(u) = training.iter().map(|t| t.sm_util).sum::<Option<u32>>() else {
                return;
            };
            // Co-located, training's own time is a lower bound of its solo use: one that
            // exceeds a trusted estimate (a job ramping up after functions arrived) raises it —
            // the safe direction. They never create an estimate. Smoothed as the solo figure
            // is: the device bound compares one sample of the device with the functions' use
            // over seconds, and a raise is kept.
            // From the trusted solo figure, not the first sample: a raise is kept.
            let own = ewma(
                self.colocated_own.or(self.trusted()),
                pct(c.training_own_pct(u, device_util)),
            );
            self.colocated_own = Some(own);
            if self.trusted().is_some_and(|old| own > old) {
                self.solo = Some(own);
            }
            self.colocated = Some(ewma(self.colocated, pct(u)));
        } else {
            // Alone: NVML's per-process samples if present, else the device utilization (which
            // then includes nothing else, since no function is placed).
            let u = if training.iter().any(|t| t.sm_util.is_some()) {
                training.iter().filter_map(|t| t.sm_util).sum::<u32>()
            } else {
                device_util.unwrap_or(100)
            };
            self.solo_samples += 1;
            self.solo = Some(ewma(self.solo, pct(u)));
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
            e.observe(&trainer(Some(60)), Some(60), None);
        }
        assert_eq!(e.trusted(), Some(0.6));
        assert!(e.drifted());
        e.mark_shared();
        assert!(!e.drifted());
        // Training leaves: everything known goes.
        e.observe(&[], None, None);
        assert_eq!(e.trusted(), None);
    }

    #[test]
    fn colocated_samples_never_create_a_solo_estimate_but_may_raise_it() {
        let mut e = TrainingEstimate::default();
        e.observe(&trainer(Some(30)), Some(80), Some(Colocation::default()));
        assert_eq!(e.trusted(), None, "unknown stays unknown (fully busy)");
        assert_eq!(e.colocated(), Some(0.3));
        let mut e = TrainingEstimate::default();
        for _ in 0..SOLO_MIN_SAMPLES {
            e.observe(&trainer(Some(50)), None, None);
        }
        for _ in 0..20 {
            e.observe(&trainer(Some(70)), None, Some(Colocation::default()));
        }
        let t = e.trusted().unwrap();
        assert!(
            (0.69..=0.7).contains(&t),
            "a ramping job raises the estimate: {t}"
        );
        e.observe(&trainer(Some(35)), None, Some(Colocation::default()));
        assert_eq!(
            e.trusted(),
            Some(t),
            "lower co-located samples do not lower it"
        );
    }

    #[test]
    fn time_sliced_only_what_nvml_proves_is_the_jobs_own_raises_the_solo_estimate() {
        let sliced = |overlap_pct, functions_pct| {
            Some(Colocation {
                overlap_pct,
                functions_pct: Some(functions_pct),
            })
        };
        let solo_at = |u| {
            let mut e = TrainingEstimate::default();
            for _ in 0..SOLO_MIN_SAMPLES {
                e.observe(&trainer(Some(u)), Some(u), None);
            }
            e
        };
        // The H200 case (docs/real-gpu.md, section 9): a trainer 10 % busy alone reads 63 %
        // beside functions whose figures overlap by hundreds of points; the device is 65 %
        // busy, 55 points of it the functions' own.
        let mut e = solo_at(10);
        for _ in 0..20 {
            e.observe(&trainer(Some(63)), Some(65), sliced(367, 55));
        }
        assert_eq!(
            e.trusted(),
            Some(0.1),
            "the overlapped figure does not raise it"
        );
        // A trainer that ramps up to 80 % of the device beside functions using 10 %.
        for _ in 0..20 {
            e.observe(&trainer(Some(95)), Some(90), sliced(300, 10));
        }
        let t = e.trusted().unwrap();
        assert!((0.75..=0.8).contains(&t), "the device bound raises it: {t}");
        // One sample of a busy device does not: the raise follows the smoothed bound.
        let mut e = solo_at(10);
        e.observe(&trainer(Some(63)), Some(65), sliced(367, 55));
        e.observe(&trainer(Some(95)), Some(100), sliced(300, 5));
        let t = e.trusted().unwrap();
        assert!(t < 0.3, "one sample moved it to {t}");
    }

    #[test]
    fn training_own_time_is_the_larger_bound_and_never_past_its_figure() {
        let c = Colocation {
            overlap_pct: 367,
            functions_pct: Some(20),
        };
        // The H200 sample of docs/real-gpu.md section 9: trainer 63 %, device 65 %, overlap 367.
        assert_eq!(c.training_own_pct(63, Some(65)), 45);
        assert_eq!(
            c.training_own_pct(63, None),
            0,
            "no device figure: the overlap alone"
        );
        assert_eq!(
            c.training_own_pct(30, Some(100)),
            30,
            "never past its own figure"
        );
        // A function over-reporting its GPU time lowers the device bound to nothing; the
        // overlap bound stays.
        let lying = Colocation {
            overlap_pct: 20,
            functions_pct: Some(100),
        };
        assert_eq!(lying.training_own_pct(63, Some(65)), 43);
        // Under MPS the overlap is 0: the figure is the job's own.
        assert_eq!(Colocation::default().training_own_pct(63, Some(65)), 63);
    }

    #[test]
    fn the_slowdown_compares_colocated_with_solo_utilization() {
        let mut e = TrainingEstimate::default();
        for _ in 0..SOLO_MIN_SAMPLES {
            e.observe(&trainer(None), Some(60), None);
        }
        assert_eq!(e.slowdown(), None);
        e.observe(&trainer(Some(40)), Some(90), Some(Colocation::default()));
        let d = e.slowdown().unwrap();
        assert!((d - 0.5).abs() < 1e-9, "{d}");
    }
}
