//! The watchdog's checks: is a function doing what its grant allows? Each check looks at one
//! instance's NVML view and returns a [`Violation`] or nothing; `State::reconcile` turns the
//! first violation of an instance into one enforcement per process (once per instance).
//!
//! Owns: the three rules — the shim is loaded, SM time stays within the share (sustained), NVML
//! memory stays within the cap (+ slack) — and their thresholds, the [`Violation`]s `State`
//! finds itself (use after release, an expired preemption, a GPU not granted) and the
//! [`Escalation`] every one of them goes through. Must never: act on one noisy
//! sample (SM use must exceed the share for [`SM_OVERUSE_SAMPLES`] samples in a row).

use crate::config::WatchdogAction;
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
