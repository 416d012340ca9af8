//! The watchdog's checks: is a function doing what its grant allows? Each check looks at one
//! instance's NVML view and returns a [`Violation`] or nothing; `State::reconcile` turns the
//! first violation of an instance into one enforcement per process (once per instance).
//!
//! Owns: the rules — the shim is loaded, SM time stays within the share (sustained: a streak of
//! samples, and a windowed mean with an over-use debt, [`ShareDebt`]), NVML memory stays within
//! the cap (+ slack) — and their thresholds, the [`Violation`]s `State` finds itself (use after
//! release, an expired preemption, a GPU not granted) and the [`Escalation`] every one of them
//! goes through. Must never: act on one noisy sample (SM use must exceed the share for
//! [`SM_OVERUSE_SAMPLES`] samples in a row, or its mean over [`DEBT_MIN_SPAN_S`]…
//! [`DEBT_WINDOW_S`] must exceed it by [`DEBT_TOLERANCE_PCT`]); correct an honest function (one
//! within the ±3 pp the shim holds shares to).

use std::collections::VecDeque;

use crate::config::WatchdogAction;
use crate::gpus::Sharing;
use smore_protocol::size::format_size;
use std::fmt;

/// SM use (NVML per-process samples, percent) a function may show above its share before a
/// sample counts as over-use: the samples cover 1/6 s and a time-sliced GPU gives a function
/// whole timeslices, so short excursions are normal. Reasoning, checked on the simulated GPU
/// (shimmed functions at 10–75 % stay within a few points over 1 s).
pub const SM_SLACK_PCT: u32 = 15;
/// Harvest mode: extra slack on top of [`SM_SLACK_PCT`] over the GPU time the function's shim
/// reported (percent points): the report is an estimate of the last second, NVML samples cover
/// 1/6 s, and a burst can fall between them.
pub const HARVEST_EXTRA_SLACK_PCT: u32 = 10;
/// Consecutive over-use samples before the watchdog acts (× reconcile period: 2 s at 250 ms).
pub const SM_OVERUSE_SAMPLES: u32 = 8;

/// The over-use debt's window: the mean SM use over the last 4 s of NVML samples (reasoning: the
/// streak rule needs [`SM_OVERUSE_SAMPLES`] consecutive samples, which a function pausing now and
/// then breaks — pulsed cost poisoning held 62 % at an 11 % share for 10 s with no event, issue 12
/// item 10; a mean over seconds does not care about the order of the samples, and 4 s holds ~24
/// NVML samples of 1/6 s).
pub const DEBT_WINDOW_S: f64 = 4.0;
/// The least span of samples the mean is judged on, s: 2 s (12 NVML samples; reasoning: a
/// shimmed function's share measured over 2 s is within ±3 pp on the simulated GPU,
/// tests/e2e/tests/shim_patterns.rs, so an honest function's mean never reaches the tolerance).
pub const DEBT_MIN_SPAN_S: f64 = 2.0;
/// How far above its share a function's windowed mean may be before it is corrected, percent
/// points: 5 (reasoning: above the ±3 pp the shim holds honest functions to, with 2 pp for NVML's
/// integer percents and sample timing).
pub const DEBT_TOLERANCE_PCT: f64 = 5.0;
/// Corrections that may fail — the next window still above share + tolerance — before the
/// function is a violation: 2 (reasoning: a first correction takes the measured ratio, a second
/// one catches a function that changed its pattern meanwhile; a third window still over means the
/// share written to its page does not hold it — the shim is bypassed).
pub const DEBT_CORRECTIONS: u32 = 2;

/// Seconds a function may go on breaking its grant after the configured action (SIGTERM) before
/// the watchdog sends SIGKILL. Reasoning: a runtime that honours SIGTERM finishes its request and
/// exits within a second or two; one that ignores it (3 GiB kept under a 1 GiB cap, issue 12
/// item 5) must not keep the memory indefinitely.
pub const KILL_AFTER_S: f64 = 5.0;
/// Seconds between repeated SIGKILLs while the violation lasts (a process the first one did not
/// reach, e.g. a descendant that appeared since).
pub const KILL_REPEAT_S: f64 = 1.0;

/// How far the watchdog went against one violating instance: the configured action when the
/// violation is first seen, SIGKILL [`KILL_AFTER_S`] later if it lasts, again every
/// [`KILL_REPEAT_S`] while it lasts. `log` never escalates (the operator chose to watch only).
/// A violation that ends resets it.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Escalation {
    /// When the violation was first acted on (seconds of the state's clock).
    first: Option<f64>,
    /// When the last SIGKILL was sent.
    last_kill: Option<f64>,
}

impl Escalation {
    /// What to do at `now` about a violation that is still there (None: nothing this round),
    /// with the default grace [`KILL_AFTER_S`].
    pub fn step(&mut self, now: f64, configured: WatchdogAction) -> Option<WatchdogAction> {
        self.step_with(now, configured, KILL_AFTER_S)
    }

    /// [`Escalation::step`] with a grace of `kill_after_s` seconds before SIGKILL
    /// (`[watchdog] kill_after_s`).
    pub fn step_with(
        &mut self,
        now: f64,
        configured: WatchdogAction,
        kill_after_s: f64,
    ) -> Option<WatchdogAction> {
        let Some(first) = self.first else {
            self.first = Some(now);
            if configured == WatchdogAction::Sigkill {
                self.last_kill = Some(now);
            }
            return Some(configured);
        };
        if configured == WatchdogAction::Log {
            return None;
        }
        let due = match self.last_kill {
            Some(k) => k + KILL_REPEAT_S,
            None => first + kill_after_s,
        };
        (now >= due).then(|| {
            self.last_kill = Some(now);
            WatchdogAction::Sigkill
        })
    }

    /// The violation is over.
    pub fn clear(&mut self) {
        *self = Escalation::default();
    }

    /// Whether the watchdog has acted on the current violation.
    pub fn acted(&self) -> bool {
        self.first.is_some()
    }
}

/// A function breaking its grant.
#[derive(Debug, Clone, PartialEq)]
pub enum Violation {
    /// A process of the function uses the GPU without the shim mapped.
    NoShim {
        /// The process without the shim.
        pid: u32,
    },
    /// The function used more SM time than its share (+ slack) for too long.
    SmOveruse {
        /// Its SM use in the last sample, percent.
        used: u32,
        /// Its share, percent.
        share: u32,
    },
    /// The function's mean SM use over seconds stayed above its share (+ tolerance) although the
    /// share written to its page was lowered to pay the excess back ([`ShareDebt`]).
    ShareOverrun {
        /// Its mean SM use over the window, percent.
        mean: u32,
        /// Its granted share, percent.
        share: u32,
        /// The share its page carries after the corrections, percent.
        page: u32,
    },
    /// A function released its grant (`op=release`) and still uses the GPU: its memory is no
    /// longer counted, so it would overcommit the node.
    AfterRelease {
        /// The process.
        pid: u32,
    },
    /// A preempted instance still runs after its grace period (docs/arbiter.md, "Memory
    /// headroom and reclaim"): it is killed so training gets the memory.
    PreemptExpired {
        /// Device memory NVML still shows for it, bytes.
        used: u64,
    },
    /// A function's processes use a GPU it was not granted (issue 12, item 9): memory or SM
    /// time there is outside every cap and share.
    UngrantedGpu {
        /// NVML memory of its processes on that GPU, bytes.
        used: u64,
        /// Their SM utilization there, percent.
        sm: u32,
        /// The GPU it was granted.
        granted: u32,
    },
    /// NVML shows more memory than the cap (+ slack).
    OverCap {
        /// NVML memory of its processes, bytes.
        used: u64,
        /// Its cap, bytes.
        cap: u64,
        /// The configured slack, bytes.
        slack: u64,
    },
}

/// A violation with where it happened, for the log and events.
pub struct Described<'a> {
    /// The violation.
    pub violation: &'a Violation,
    /// The function's name.
    pub function: &'a str,
    /// The GPU's index.
    pub gpu: u32,
}

impl fmt::Display for Described<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (function, gpu) = (self.function, self.gpu);
        match *self.violation {
            Violation::NoShim { pid } => write!(
                f,
                "process {pid} of function {function} uses GPU {gpu} without the smore shim"
            ),
            Violation::SmOveruse { used, share } => write!(
                f,
                "function {function} uses {used} % of GPU {gpu}'s SM time in NVML, over its share {share} % + {SM_SLACK_PCT} for {SM_OVERUSE_SAMPLES} samples"
            ),
            Violation::ShareOverrun { mean, share, page } => write!(
                f,
                "function {function} used {mean} % of GPU {gpu}'s SM time in NVML over {DEBT_MIN_SPAN_S}–{DEBT_WINDOW_S} s, over its share {share} % + {DEBT_TOLERANCE_PCT} although its page was lowered to {page} % ({DEBT_CORRECTIONS} corrections)"
            ),
            Violation::AfterRelease { pid } => write!(
                f,
                "process {pid} of function {function} uses GPU {gpu} after releasing its grant"
            ),
            Violation::PreemptExpired { used } => write!(
                f,
                "function {function} was preempted on GPU {gpu} and still holds {} after its grace period",
                format_size(used)
            ),
            Violation::UngrantedGpu { used, sm, granted } => write!(
                f,
                "function {function} uses GPU {gpu} ({} of memory, {sm} % SM in NVML) but was granted GPU {granted} only",
                format_size(used)
            ),
            Violation::OverCap { used, cap, slack } => write!(
                f,
                "function {function} uses {} on GPU {gpu} in NVML, over its cap {} + slack {}",
                format_size(used),
                format_size(cap),
                format_size(slack)
            ),
        }
    }
}

/// How many percent points of the per-process SM figures NVML gave for one GPU cannot be the
/// processes' own time: their sum past the device's utilization (100 % when NVML gives none).
/// 0 under MPS, whose per-process figure is the time a process's kernels ran, however slowed
/// (the simulated model; not yet measured on a real MPS node).
///
/// Why: on a time-sliced GPU the driver's per-process figure is not a process's own GPU time.
/// Measured on an NVIDIA H200, driver 580.159.04 (docs/real-gpu.md, section 8): a shimmed
/// function using ~9 % of the GPU beside a training loop read 60.8 % (max 99) and 98–99 % in
/// the arbiter's own samples, the trainer 92–99 %, the device 84.6 %. Compared with its share
/// as it was, the figure stopped every honest function within seconds. Each process's own time
/// is at least its figure minus this overlap, which is what the SM rules judge: a function that
/// bypasses its shim is still seen while the rest of the GPU is idle or its figure outgrows the
/// overlap, but not while a co-runner keeps the whole GPU busy (the shim is the enforcement
/// then; docs/arbiter.md, watchdog).
pub fn attribution_overlap(
    process_sm: impl Iterator<Item = u32>,
    device_util: Option<u32>,
    sharing: Option<Sharing>,
) -> u32 {
    if sharing == Some(Sharing::Mps) {
        return 0;
    }
    let sum: u32 = process_sm.map(|u| u.min(100)).sum();
    sum.saturating_sub(device_util.unwrap_or(100).min(100))
}

/// The shim check: every process of the function must have it mapped (a process whose maps
/// cannot be read is given the benefit of the doubt).
pub fn check_shim(
    pids: &[u32],
    mut mapped: impl FnMut(u32) -> Option<bool>,
) -> Result<(), Violation> {
    match pids.iter().find(|&&p| mapped(p) == Some(false)) {
        Some(&pid) => Err(Violation::NoShim { pid }),
        None => Ok(()),
    }
}

/// The memory check.
pub fn check_memory(used: u64, cap: u64, slack: u64) -> Result<(), Violation> {
    if used > cap.saturating_add(slack) {
        Err(Violation::OverCap { used, cap, slack })
    } else {
        Ok(())
    }
}

/// Consecutive samples in which an instance used more SM time than its share allows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SmOveruse {
    streak: u32,
}

impl SmOveruse {
    /// Folds one sample in (`used` and `share` in percent); a violation once the streak is long
    /// enough. A function at 100 % cannot over-use.
    pub fn observe(&mut self, used: u32, share: u32) -> Result<(), Violation> {
        let over = share < 100 && used > share + SM_SLACK_PCT;
        self.streak = if over { self.streak + 1 } else { 0 };
        if self.streak >= SM_OVERUSE_SAMPLES {
            Err(Violation::SmOveruse { used, share })
        } else {
            Ok(())
        }
    }
}

/// What one window of the over-use debt changed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DebtChange {
    /// The function ran above its share: the page share was lowered to `page`.
    Corrected {
        /// Its mean SM use over the window, percent.
        mean: u32,
        /// The share its page carries now, percent.
        page: u32,
    },
    /// The function used no more than its (lowered) page share: the page share was raised
    /// back towards the grant, to `page`.
    Restored {
        /// The share its page carries now, percent.
        page: u32,
    },
}

/// The over-use debt of one instance: the arbiter's after-the-fact correction of a function that
/// runs above its share while its shim believes it does not (cost poisoning, issue 12 item 10 —
/// the function controls its own process memory, so the shim's accounting is a hint; NVML's
/// per-process SM time is the authority).
///
/// Each NVML sample is kept for [`DEBT_WINDOW_S`]; once they span [`DEBT_MIN_SPAN_S`] their mean
/// is judged against the granted share:
/// - above share + [`DEBT_TOLERANCE_PCT`]: the page share is multiplied by share / mean — the
///   measured excess is paid back by running below the grant — and the window starts anew (the
///   next one measures the corrected page); after [`DEBT_CORRECTIONS`] corrections in a row
///   that did not bring it back, every further window over is [`Violation::ShareOverrun`]
///   (escalated as any violation, [`Escalation`]);
/// - no more than the page share + tolerance (the function is back within what its page allows):
///   the factor doubles back towards 1 — the grant is restored within a few windows;
/// - in between (the correction holds it near its share): unchanged.
///
/// A share of 100 has nothing to correct (and harvest mode's raw share is 100: collisions are
/// invisible to NVML, the report-vs-NVML streak rule bounds a bypass there; docs/harvest.md).
#[derive(Debug, Clone, PartialEq)]
pub struct ShareDebt {
    /// (state clock s, SM use %) since the window started.
    samples: VecDeque<(f64, u32)>,
    /// The page share is the grant × this factor, (0, 1].
    factor: f64,
    /// Corrections in a row after which the function was still over.
    failed: u32,
}

impl Default for ShareDebt {
    fn default() -> Self {
        ShareDebt {
            samples: VecDeque::new(),
            factor: 1.0,
            failed: 0,
        }
    }
}

impl ShareDebt {
    /// The share to write to the page for a grant of `share` %: the grant lowered by the debt,
    /// at least 1 % (the gate's least share).
    pub fn page_share(&self, share: u32) -> u32 {
        if share >= 100 || self.factor >= 1.0 {
            share
        } else {
            ((share as f64 * self.factor).round() as u32).clamp(1, share)
        }
    }

    /// Folds one NVML sample in: `used` % of the GPU's SM time at state-clock time `now`, under a
    /// grant of `share` %. Returns what changed (the page must then be rewritten), or the
    /// violation once corrections failed.
    pub fn observe(
        &mut self,
        now: f64,
        used: u32,
        share: u32,
    ) -> Result<Option<DebtChange>, Violation> {
        if share >= 100 {
            let was = self.factor < 1.0;
            *self = ShareDebt::default();
            return Ok(was.then_some(DebtChange::Restored { page: share }));
        }
        self.samples.push_back((now, used.min(100)));
        while self
            .samples
            .front()
            .is_some_and(|&(t, _)| t < now - DEBT_WINDOW_S)
        {
            self.samples.pop_front();
        }
        let Some(&(first, _)) = self.samples.front() else {
            return Ok(None);
        };
        if now - first < DEBT_MIN_SPAN_S || self.samples.len() < 2 {
            return Ok(None);
        }
        // Each sample stands for the interval since the one before it: the first opens the
        // window, the rest are averaged (an odd count would weigh one phase of a periodic
        // function twice).
        let n = self.samples.len() - 1;
        let mean = self
            .samples
            .iter()
            .skip(1)
            .map(|&(_, u)| u as f64)
            .sum::<f64>()
            / n as f64;
        let page = self.page_share(share);
        if mean > share as f64 + DEBT_TOLERANCE_PCT {
            if self.failed >= DEBT_CORRECTIONS {
                // Keep the window: the violation lasts while the mean stays over.
                return Err(Violation::ShareOverrun {
                    mean: mean.round() as u32,
                    share,
                    page,
                });
            }
            self.factor = (self.factor * share as f64 / mean).clamp(0.0, 1.0);
            self.failed += 1;
            self.samples.clear();
            return Ok(Some(DebtChange::Corrected {
                mean: mean.round() as u32,
                page: self.page_share(share),
            }));
        }
        self.failed = 0;
        if self.factor < 1.0 && mean <= page as f64 + DEBT_TOLERANCE_PCT {
            self.factor = (self.factor * 2.0).min(1.0);
            self.samples.clear();
            return Ok(Some(DebtChange::Restored {
                page: self.page_share(share),
            }));
        }
        Ok(None)
    }
}

#[cfg(test)]
mod debt_tests {
    use super::*;

    /// Feeds `secs` of samples every 250 ms from `t`: `use_at(page share, time)` says the
    /// function's SM use. Returns the end time, the changes and the violations seen.
    fn run(
        d: &mut ShareDebt,
        t: f64,
        secs: f64,
        share: u32,
        mut use_at: impl FnMut(u32, f64) -> u32,
    ) -> (f64, Vec<DebtChange>, Vec<Violation>) {
        let (mut now, mut changes, mut violations) = (t, Vec::new(), Vec::new());
        while now < t + secs {
            let used = use_at(d.page_share(share), now);
            match d.observe(now, used, share) {
                Ok(Some(c)) => changes.push(c),
                Ok(None) => {}
                Err(v) => violations.push(v),
            }
            now += 0.25;
        }
        (now, changes, violations)
    }

    #[test]
    fn a_pulsed_over_user_is_corrected_though_no_streak_is_long_enough() {
        // Pulsed poisoning: 4× its page share (capped at 100) for 1.5 s, idle 0.5 s — the
        // streak rule never fires (no 8 samples in a row over share + 15) …
        let pulse = |page: u32, t: f64| {
            if t % 2.0 < 1.5 {
                (page * 4).min(100)
            } else {
                0
            }
        };
        let mut streak = SmOveruse::default();
        let mut t = 0.0;
        while t < 20.0 {
            assert!(streak.observe(pulse(20, t), 20).is_ok(), "streak at {t}");
            t += 0.25;
        }
        // … but the windowed mean corrects it: the page share goes down by the excess.
        let mut d = ShareDebt::default();
        let (t, changes, violations) = run(&mut d, 100.0, 8.0, 20, pulse);
        assert!(violations.is_empty(), "{violations:?}");
        let DebtChange::Corrected { mean, page } = changes[0] else {
            panic!("{changes:?}");
        };
        assert!(mean >= 50, "{mean}");
        assert!(page <= 8, "the excess is paid back: page {page}");
        // Under the corrected page it gets about its share (4 × 5 × 3/4 = 15 %): held.
        let (_, more, violations) = run(&mut d, t, 10.0, 20, pulse);
        assert!(violations.is_empty(), "{violations:?}");
        assert!(
            more.iter()
                .all(|c| matches!(c, DebtChange::Corrected { .. }) || d.page_share(20) < 20),
            "{more:?}"
        );
    }

    #[test]
    fn an_over_user_the_correction_does_not_hold_is_a_violation() {
        // A bypass: 70 % whatever its page says.
        let mut d = ShareDebt::default();
        let (_, changes, violations) = run(&mut d, 0.0, 12.0, 20, |_, _| 70);
        assert_eq!(
            changes
                .iter()
                .filter(|c| matches!(c, DebtChange::Corrected { .. }))
                .count(),
            DEBT_CORRECTIONS as usize
        );
        assert!(
            matches!(
                violations.first(),
                Some(Violation::ShareOverrun {
                    mean: 70,
                    share: 20,
                    ..
                })
            ),
            "{violations:?}"
        );
    }

    #[test]
    fn honest_functions_are_never_corrected() {
        // Within ±3 pp of the share, any pattern of noise; and bursts that average within it.
        for share in [10u32, 20, 50, 75] {
            let mut d = ShareDebt::default();
            let (_, changes, violations) = run(&mut d, 0.0, 30.0, share, |page, t| {
                let wobble = ((t * 7.3).sin() * 3.0).round() as i64;
                (page as i64 + wobble).clamp(0, 100) as u32
            });
            assert!(
                changes.is_empty() && violations.is_empty(),
                "{share}: {changes:?}"
            );
            assert_eq!(d.page_share(share), share);
            // Whole timeslices: 2× the share half the time, nothing the other half.
            let mut d = ShareDebt::default();
            let (_, changes, _) = run(&mut d, 0.0, 30.0, share.min(50), |page, t| {
                if t % 0.5 < 0.25 {
                    page * 2
                } else {
                    0
                }
            });
            assert!(changes.is_empty(), "{share}: {changes:?}");
        }
    }

    #[test]
    fn the_grant_is_restored_once_the_function_is_back_within_its_share() {
        let mut d = ShareDebt::default();
        let (t, changes, _) = run(&mut d, 0.0, 3.0, 20, |_, _| 80);
        assert!(
            matches!(changes[..], [DebtChange::Corrected { page: 5, .. }]),
            "{changes:?}"
        );
        // Honest from now on: it uses what its page allows.
        let (_, changes, violations) = run(&mut d, t, 12.0, 20, |page, _| page);
        assert!(violations.is_empty());
        assert_eq!(d.page_share(20), 20, "{changes:?}");
        // A grant of 100 (or harvest's raw 100) has nothing to correct.
        let mut h = ShareDebt::default();
        let (_, changes, violations) = run(&mut h, 0.0, 10.0, 100, |_, _| 100);
        assert!(changes.is_empty() && violations.is_empty());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sm_overuse_needs_a_sustained_streak() {
        let mut o = SmOveruse::default();
        for _ in 1..SM_OVERUSE_SAMPLES {
            assert!(o.observe(60, 20).is_ok());
        }
        assert!(
            o.observe(30, 20).is_ok(),
            "within the slack resets the streak"
        );
        for _ in 1..SM_OVERUSE_SAMPLES {
            assert!(o.observe(60, 20).is_ok());
        }
        assert_eq!(
            o.observe(60, 20),
            Err(Violation::SmOveruse {
                used: 60,
                share: 20
            })
        );
        let mut full = SmOveruse::default();
        for _ in 0..2 * SM_OVERUSE_SAMPLES {
            assert!(full.observe(100, 100).is_ok());
        }
    }

    #[test]
    fn the_overlap_is_what_time_sliced_figures_sum_past_the_device_and_nothing_under_mps() {
        let ts = Some(Sharing::TimeSliced);
        // The H200 arbiter run: function and trainer both read 98–99 %, the device ~100 %.
        assert_eq!(attribution_overlap([98, 99].into_iter(), Some(100), ts), 97);
        // nvml_view.py beside training: 61 + 92 against a device at 85.
        assert_eq!(attribution_overlap([61, 92].into_iter(), Some(85), ts), 68);
        // A lone process, or figures within the device: nothing to take off.
        assert_eq!(attribution_overlap([9].into_iter(), Some(9), ts), 0);
        assert_eq!(attribution_overlap([20, 40].into_iter(), Some(70), ts), 0);
        // No device figure: 100 % stands in; an unknown mode is treated as time-sliced.
        assert_eq!(attribution_overlap([90, 90].into_iter(), None, None), 80);
        assert_eq!(
            attribution_overlap([150, 90].into_iter(), Some(100), ts),
            90,
            "a figure over 100 counts as 100"
        );
        // Under MPS concurrent kernels each run all the time they run.
        assert_eq!(
            attribution_overlap([98, 99].into_iter(), Some(100), Some(Sharing::Mps)),
            0
        );
        // The function of the arbiter run judged as the watchdog now does: 98 − 97 = 1 %,
        // within any share; before, 98 % against 16 % stopped it.
        let mut o = SmOveruse::default();
        let own = 98u32.saturating_sub(attribution_overlap([98, 99].into_iter(), Some(100), ts));
        for _ in 0..2 * SM_OVERUSE_SAMPLES {
            assert!(o.observe(own, 1).is_ok());
        }
    }

    #[test]
    fn shim_and_memory_checks() {
        assert_eq!(
            check_shim(&[1, 2], |p| Some(p == 1)),
            Err(Violation::NoShim { pid: 2 })
        );
        assert!(
            check_shim(&[1, 2], |_| None).is_ok(),
            "unreadable maps: no action"
        );
        assert!(check_memory(100, 90, 10).is_ok());
        let v = check_memory(101, 90, 10).unwrap_err();
        let text = Described {
            violation: &v,
            function: "f",
            gpu: 0,
        }
        .to_string();
        assert!(text.contains("over its cap"), "{text}");
    }
}

#[cfg(test)]
mod escalation_tests {
    use super::*;

    #[test]
    fn sigterm_then_sigkill_after_the_grace_then_repeated_while_it_lasts() {
        let mut e = Escalation::default();
        assert_eq!(
            e.step(100.0, WatchdogAction::Sigterm),
            Some(WatchdogAction::Sigterm)
        );
        assert_eq!(e.step(101.0, WatchdogAction::Sigterm), None);
        assert_eq!(e.step(104.9, WatchdogAction::Sigterm), None);
        assert_eq!(
            e.step(105.0, WatchdogAction::Sigterm),
            Some(WatchdogAction::Sigkill)
        );
        assert_eq!(e.step(105.5, WatchdogAction::Sigterm), None);
        assert_eq!(
            e.step(106.0, WatchdogAction::Sigterm),
            Some(WatchdogAction::Sigkill)
        );
        e.clear();
        assert!(!e.acted());
        assert_eq!(
            e.step(200.0, WatchdogAction::Sigterm),
            Some(WatchdogAction::Sigterm)
        );
    }

    #[test]
    fn sigkill_repeats_and_log_never_escalates() {
        let mut k = Escalation::default();
        assert_eq!(
            k.step(0.0, WatchdogAction::Sigkill),
            Some(WatchdogAction::Sigkill)
        );
        assert_eq!(k.step(0.5, WatchdogAction::Sigkill), None);
        assert_eq!(
            k.step(1.0, WatchdogAction::Sigkill),
            Some(WatchdogAction::Sigkill)
        );
        let mut l = Escalation::default();
        assert_eq!(l.step(0.0, WatchdogAction::Log), Some(WatchdogAction::Log));
        assert_eq!(l.step(60.0, WatchdogAction::Log), None);
    }
}
