//! Training memory on one GPU: each training process's high-water mark (NVML), the headroom kept
//! above it, growth events and the hold on re-admission after a reclaim (docs/arbiter.md,
//! "Memory headroom and reclaim").
//!
//! Owns: [`TrainingMemory`] (per-process peaks, when training last grew, when memory was last
//! reclaimed), the headroom rule ([`headroom`]) and what of it survives a restart
//! ([`GpuMemoryRecord`]). Must never: lower a live process's high-water mark (a job's peak is
//! what it will need again: the next evaluation pass, the next checkpoint), or forget the peak of
//! a process that may still be alive.

use super::training::TrainingProc;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A rise of a training high-water mark smaller than this is not a growth event, bytes.
/// Reasoning: NVML's per-process figure moves by allocator rounding (2 MiB pages, small context
/// growth); the watchdog's `memory_slack` uses the same 64 MiB for the same reason.
pub const GROWTH_MIN: u64 = 64 << 20;

/// Memory kept free above a training high-water mark `peak`: the larger of `abs` bytes and
/// `frac` × peak.
pub fn headroom(peak: u64, abs: u64, frac: f64) -> u64 {
    abs.max((peak as f64 * frac) as u64)
}

/// One training process's high-water mark.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcPeak {
    /// Its pid.
    pub pid: u32,
    /// Its start time (clock ticks since boot; 0 = unknown): a recycled pid is another process.
    pub start: u64,
    /// The most device memory NVML has attributed to it, bytes.
    pub peak: u64,
}

/// What survives an arbiter restart of one GPU's training memory.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuMemoryRecord {
    /// NVML index of the GPU.
    pub gpu: u32,
    /// Its training processes' high-water marks.
    pub peaks: Vec<ProcPeak>,
    /// When training last grew, seconds since the epoch.
    pub grew_at: Option<f64>,
    /// When memory was last reclaimed from functions, seconds since the epoch.
    pub reclaimed_at: Option<f64>,
}

/// What one NVML sample changed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Growth {
    /// Training processes seen for the first time.
    pub new_procs: Vec<u32>,
    /// Bytes the summed high-water mark rose by (0: no growth beyond [`GROWTH_MIN`]).
    pub grew_by: u64,
}

impl Growth {
    /// Whether this sample is a growth event.
    pub fn is_growth(&self) -> bool {
        !self.new_procs.is_empty() || self.grew_by > 0
    }
}

/// Training memory of one GPU.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TrainingMemory {
    /// pid → high-water mark.
    #[serde(skip)]
    peaks: BTreeMap<u32, ProcPeak>,
    /// When training last grew, seconds since the epoch.
    #[serde(rename = "training_grew_at")]
    grew_at: Option<f64>,
    /// When memory was last reclaimed, seconds since the epoch.
    #[serde(rename = "reclaimed_at")]
    reclaimed_at: Option<f64>,
    /// Peak at the last growth event (what the next one is measured against).
    #[serde(skip)]
    peak_at_growth: u64,
}

impl TrainingMemory {
    /// Folds one sample of the GPU's training processes in. `start_of` reads a process's start
    /// time (for a pid seen for the first time); `alive` tells whether a process absent from
    /// the sample may still live (its peak is then kept: NVML omits a process that holds no
    /// memory for a moment, and the safe side is to keep reserving for it).
    pub fn observe(
        &mut self,
        training: &[TrainingProc],
        start_of: impl Fn(u32) -> Option<u64>,
        alive: impl Fn(u32, u64) -> bool,
        now: f64,
    ) -> Growth {
        let mut g = Growth::default();
        for t in training {
            match self.peaks.get_mut(&t.pid) {
                Some(p) => p.peak = p.peak.max(t.used),
                None => {
                    g.new_procs.push(t.pid);
                    self.peaks.insert(
                        t.pid,
                        ProcPeak {
                            pid: t.pid,
                            start: start_of(t.pid).unwrap_or(0),
                            peak: t.used,
                        },
                    );
                }
            }
        }
        self.peaks.retain(|pid, p| {
            training.iter().any(|t| t.pid == *pid) || (p.start != 0 && alive(p.pid, p.start))
        });
        let peak = self.peak();
        if peak > self.peak_at_growth.saturating_add(GROWTH_MIN) {
            g.grew_by = peak - self.peak_at_growth;
        }
        if g.is_growth() {
            self.grew_at = Some(now);
            self.peak_at_growth = peak;
        } else if peak < self.peak_at_growth {
            // A process left: later growth is measured from what remains.
            self.peak_at_growth = peak;
        }
        g
    }

    /// Σ of the live training processes' high-water marks, bytes.
    pub fn peak(&self) -> u64 {
        self.peaks.values().map(|p| p.peak).sum()
    }

    /// Memory reserved for training: the high-water mark plus headroom (0 without training).
    pub fn reserved(&self, abs: u64, frac: f64) -> u64 {
        if self.peaks.is_empty() {
            return 0;
        }
        let p = self.peak();
        p.saturating_add(headroom(p, abs, frac))
    }

    /// Records a reclaim at `now` (starts the hold on re-admission).
    pub fn reclaimed(&mut self, now: f64) {
        self.reclaimed_at = Some(now);
    }

    /// Why functions may not be admitted onto this GPU at `now`: memory was reclaimed from
    /// functions and training has not been stable for `hold_s` since (None: admission open).
    pub fn hold(&self, now: f64, hold_s: f64) -> Option<f64> {
        let reclaimed = self.reclaimed_at?;
        let since = self.grew_at.map_or(reclaimed, |g| g.max(reclaimed));
        let left = since + hold_s - now;
        (left > 0.0).then_some(left)
    }

    /// When training last grew (seconds since the epoch).
    pub fn grew_at(&self) -> Option<f64> {
        self.grew_at
    }

    /// The durable part, for `gpu`.
    pub fn record(&self, gpu: u32) -> GpuMemoryRecord {
        GpuMemoryRecord {
            gpu,
            peaks: self.peaks.values().cloned().collect(),
            grew_at: self.grew_at,
            reclaimed_at: self.reclaimed_at,
        }
    }

    /// Restores a record of the previous arbiter, keeping the peaks of processes that still live
    /// (`alive(pid, start)`).
    pub fn restore(&mut self, r: GpuMemoryRecord, alive: impl Fn(u32, u64) -> bool) {
        for p in r.peaks {
            if p.start != 0 && alive(p.pid, p.start) {
                let e = self.peaks.entry(p.pid).or_insert_with(|| p.clone());
                e.peak = e.peak.max(p.peak);
            }
        }
        self.peak_at_growth = self.peak();
        let later = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        self.grew_at = later(r.grew_at, self.grew_at);
        self.reclaimed_at = later(r.reclaimed_at, self.reclaimed_at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn t(pid: u32, used: u64) -> TrainingProc {
        TrainingProc {
            pid,
            used,
            sm_util: None,
        }
    }

    #[test]
    fn the_high_water_mark_never_falls_while_the_process_lives() {
        let mut m = TrainingMemory::default();
        let g = m.observe(&[t(7, 1000 * MIB)], |_| Some(1), |_, _| true, 0.0);
        assert_eq!(
            g.new_procs,
            vec![7],
            "a new training process is a growth event"
        );
        assert!(!m
            .observe(&[t(7, 500 * MIB)], |_| Some(1), |_, _| true, 1.0)
            .is_growth());
        assert_eq!(m.peak(), 1000 * MIB, "eval pass over: the peak stays");
        // Below GROWTH_MIN: noise, not growth.
        assert!(!m
            .observe(&[t(7, 1030 * MIB)], |_| Some(1), |_, _| true, 2.0)
            .is_growth());
        let g = m.observe(&[t(7, 2000 * MIB)], |_| Some(1), |_, _| true, 3.0);
        assert_eq!(g.grew_by, 1000 * MIB);
        assert_eq!(m.grew_at(), Some(3.0));
        // Absent from one sample but alive: kept. Gone: dropped.
        m.observe(&[], |_| Some(1), |_, _| true, 4.0);
        assert_eq!(m.peak(), 2000 * MIB);
        m.observe(&[], |_| Some(1), |_, _| false, 5.0);
        assert_eq!(m.peak(), 0);
        assert_eq!(m.reserved(2 << 30, 0.1), 0, "no training, nothing reserved");
    }

    #[test]
    fn headroom_is_the_larger_of_bytes_and_fraction() {
        assert_eq!(headroom(10 << 30, 2 << 30, 0.1), 2 << 30);
        assert_eq!(headroom(40 << 30, 2 << 30, 0.1), 4 << 30);
        let mut m = TrainingMemory::default();
        m.observe(&[t(1, 40 << 30)], |_| Some(1), |_, _| true, 0.0);
        assert_eq!(m.reserved(2 << 30, 0.1), 44 << 30);
    }

    #[test]
    fn admission_is_held_after_a_reclaim_until_training_was_stable() {
        let mut m = TrainingMemory::default();
        assert_eq!(m.hold(0.0, 30.0), None, "no reclaim, no hold");
        m.observe(&[t(1, 1 << 30)], |_| Some(1), |_, _| true, 0.0);
        assert_eq!(
            m.hold(1.0, 30.0),
            None,
            "growth alone does not hold admission"
        );
        m.reclaimed(10.0);
        assert_eq!(m.hold(20.0, 30.0), Some(20.0));
        // Still growing at 25 s: the hold runs from there.
        m.observe(&[t(1, 2 << 30)], |_| Some(1), |_, _| true, 25.0);
        assert_eq!(m.hold(45.0, 30.0), Some(10.0));
        assert_eq!(m.hold(55.0, 30.0), None);
    }

    #[test]
    fn a_restored_record_keeps_only_live_processes() {
        let mut m = TrainingMemory::default();
        m.observe(
            &[t(1, 3 << 30), t(2, 1 << 30)],
            |p| Some(p as u64),
            |_, _| true,
            0.0,
        );
        m.reclaimed(5.0);
        let r = m.record(0);
        let back: GpuMemoryRecord =
            serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        let mut n = TrainingMemory::default();
        n.restore(back, |pid, _| pid == 1);
        assert_eq!(n.peak(), 3 << 30);
        assert_eq!(n.hold(6.0, 30.0), Some(29.0));
        // The restored peak is not growth again when the process shows up in the next sample.
        assert!(!n
            .observe(&[t(1, 2 << 30)], |p| Some(p as u64), |_, _| true, 7.0)
            .is_growth());
    }
}
