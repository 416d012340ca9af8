//! Idle-time histogram policies: the hybrid histogram policy (HHP, Shahrad et al., ATC'20) and
//! the long/short-term histogram (LSTH, INFless, ASPLOS'22).
//!
//! Owns: idle-time bookkeeping at minute resolution and the rules turning a histogram into a
//! pre-warm / keep-alive window.
//!
//! **Idle time.** With per-minute counts, the idle time between two active minutes `a < b` is the
//! number of fully idle minutes between them, `b − a − 1` (consecutive active minutes → 0).
//! **Windows.** A [`Windows`] `{prewarm, keep_until}` means: after the last active minute `a`, the
//! model is resident during minute `m` iff `prewarm ≤ m − a − 1 < keep_until`; `prewarm = 0` is
//! plain keep-alive.
//!
//! **HHP** ([`hhp_windows`]), histogram of 1-minute bins over a 4-hour range (240 bins), idle
//! times ≥ 240 min counted out of bounds (OOB):
//! 1. fewer than [`HhpConfig::min_samples`] idle times, or the bin counts' coefficient of
//!    variation < 2 (not representative): no pre-warm, keep alive the whole range (240 min);
//! 2. OOB share > [`HhpConfig::max_oob_share`]: forecast the next idle time `f` (exponential
//!    smoothing of the idle-time series, weight 0.5; Shahrad use ARIMA, ES is the documented
//!    simplification) and warm during `[⌊0.85·f⌋, ⌈1.15·f⌉)` (pre-warm 0.85·f, keep-alive 0.3·f);
//! 3. otherwise pre-warm = ⌊0.9 × lower edge of the 5th-percentile bin⌋, keep until
//!    ⌈1.1 × upper edge of the 99th-percentile bin⌉.
//!
//! **LSTH**: the same percentile rule (3) on a mixture `β·H_long + (1−β)·H_short` of the
//! normalised histograms of the idle times that ended in the last 24 h (long) and the last hour
//! (short), β = 0.5; the short histogram is used once it holds ≥ 2 idle times. No OOB or CV
//! branches (INFless does not describe them); with no idle time yet, a 10-minute keep-alive.
//!
//! Must never: use an idle time that has not ended yet.

use std::collections::VecDeque;

/// Pre-warm / keep-alive window in idle minutes since the last active minute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Windows {
    /// First idle minute (0-based) at which the model is resident.
    pub prewarm: u32,
    /// First idle minute at which it is no longer resident.
    pub keep_until: u32,
}

impl Windows {
    /// Whether the model should be resident after `idle` fully idle minutes.
    pub fn warm_at(&self, idle: u64) -> bool {
        u64::from(self.prewarm) <= idle && idle < u64::from(self.keep_until)
    }
}

/// Which HHP branch produced the windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HhpBranch {
    /// Too few samples or CV < 2: keep alive the whole range.
    NotRepresentative,
    /// Too many OOB idle times: time-series forecast.
    TimeSeries,
    /// Percentile windows.
    Histogram,
}

/// HHP parameters (Shahrad et al., ATC'20).
#[derive(Debug, Clone, PartialEq)]
pub struct HhpConfig {
    /// Histogram range in 1-minute bins (4 h).
    pub range: u32,
    /// Bin-count CV below which the histogram is not representative (2).
    pub cv_threshold: f64,
    /// Fewest idle times for the histogram to be used (our choice: 5).
    pub min_samples: usize,
    /// OOB share above which the time-series branch is used (our choice: 0.5).
    pub max_oob_share: f64,
    /// Pre-warm percentile (5) and margin (0.9).
    pub head_pct: f64,
    /// Head margin.
    pub head_margin: f64,
    /// Keep-alive percentile (99) and margin (1.1).
    pub tail_pct: f64,
    /// Tail margin.
    pub tail_margin: f64,
}

impl Default for HhpConfig {
    fn default() -> Self {
        Self {
            range: 240,
            cv_threshold: 2.0,
            min_samples: 5,
            max_oob_share: 0.5,
            head_pct: 5.0,
            head_margin: 0.9,
            tail_pct: 99.0,
            tail_margin: 1.1,
        }
    }
}

/// Idle-time histogram with 1-minute bins and an out-of-bounds counter.
#[derive(Debug, Clone, PartialEq)]
pub struct IdleHistogram {
    /// Counts per bin.
    pub bins: Vec<f64>,
    /// Idle times ≥ range.
    pub oob: f64,
}

impl IdleHistogram {
    /// An empty histogram of `range` bins.
    pub fn new(range: u32) -> Self {
        Self {
            bins: vec![0.0; range as usize],
            oob: 0.0,
        }
    }

    /// Builds a histogram from idle times (minutes).
    pub fn from_idle_times(range: u32, idle: impl IntoIterator<Item = u64>) -> Self {
        let mut h = Self::new(range);
        for i in idle {
            h.add(i, 1.0);
        }
        h
    }

    /// Adds `w` observations of idle time `idle`.
    pub fn add(&mut self, idle: u64, w: f64) {
        match self.bins.get_mut(idle as usize) {
            Some(b) => *b += w,
            None => self.oob += w,
        }
    }

    /// In-range mass.
    pub fn in_range(&self) -> f64 {
        self.bins.iter().sum()
    }

    /// Coefficient of variation of the bin counts.
    pub fn bin_cv(&self) -> f64 {
        let n = self.bins.len() as f64;
        let mean = self.in_range() / n;
        if mean == 0.0 {
            return 0.0;
        }
        let var = self.bins.iter().map(|b| (b - mean).powi(2)).sum::<f64>() / n;
        var.sqrt() / mean
    }

    /// Index of the bin holding the `pct`-th percentile of the in-range mass: the smallest bin
    /// whose cumulative mass reaches `pct/100` of the total. `None` when empty.
    pub fn percentile_bin(&self, pct: f64) -> Option<usize> {
        let total = self.in_range();
        if total <= 0.0 {
            return None;
        }
        let target = total * pct / 100.0;
        let mut cum = 0.0;
        for (i, b) in self.bins.iter().enumerate() {
            cum += b;
            if cum >= target - 1e-9 && *b > 0.0 {
                return Some(i);
            }
        }
        Some(self.bins.len() - 1)
    }

    /// The percentile rule: pre-warm = ⌊head_margin × lower edge of the head bin⌋, keep until
    /// ⌈tail_margin × upper edge of the tail bin⌉.
    pub fn percentile_windows(&self, cfg: &HhpConfig) -> Option<Windows> {
        let head = self.percentile_bin(cfg.head_pct)?;
        let tail = self.percentile_bin(cfg.tail_pct)?;
        let prewarm = (head as f64 * cfg.head_margin).floor() as u32;
        let keep_until = ((tail + 1) as f64 * cfg.tail_margin - 1e-9).ceil() as u32;
        Some(Windows {
            prewarm,
            keep_until: keep_until.max(prewarm + 1),
        })
    }
}

/// HHP's decision from a histogram and the idle-time series (for the time-series branch).
pub fn hhp_windows(
    h: &IdleHistogram,
    idle_series: &[u64],
    cfg: &HhpConfig,
) -> (Windows, HhpBranch) {
    let total = h.in_range() + h.oob;
    let whole_range = Windows {
        prewarm: 0,
        keep_until: cfg.range,
    };
    if (total as usize) < cfg.min_samples {
        return (whole_range, HhpBranch::NotRepresentative);
    }
    if h.oob / total > cfg.max_oob_share {
        let f = exp_smooth(idle_series, 0.5);
        let w = Windows {
            prewarm: (0.85 * f).floor() as u32,
            keep_until: ((1.15 * f).ceil() as u32).max((0.85 * f).floor() as u32 + 1),
        };
        return (w, HhpBranch::TimeSeries);
    }
    if h.bin_cv() < cfg.cv_threshold {
        return (whole_range, HhpBranch::NotRepresentative);
    }
    match h.percentile_windows(cfg) {
        Some(w) => (w, HhpBranch::Histogram),
        None => (whole_range, HhpBranch::NotRepresentative),
    }
}

/// Simple exponential smoothing forecast of the next value (weight `w` on the newest value).
pub fn exp_smooth(xs: &[u64], w: f64) -> f64 {
    let mut it = xs.iter();
    let Some(&first) = it.next() else { return 0.0 };
    it.fold(first as f64, |s, &x| w * x as f64 + (1.0 - w) * s)
}

/// Tracks the last active minute and the idle times that have ended (with the minute they ended).
#[derive(Debug, Clone, Default)]
pub struct IdleTracker {
    last_active: Option<u64>,
    /// (minute the idle time ended, idle minutes).
    pub idle: VecDeque<(u64, u64)>,
}

impl IdleTracker {
    /// Feeds the count of `minute`.
    pub fn observe(&mut self, minute: u64, count: u32) {
        if count == 0 {
            return;
        }
        if let Some(a) = self.last_active {
            if minute > a {
                self.idle.push_back((minute, minute - a - 1));
            }
        }
        self.last_active = Some(minute);
    }

    /// Idle minutes elapsed before `minute` since the last active minute, or `None` if never
    /// active.
    pub fn idle_before(&self, minute: u64) -> Option<u64> {
        self.last_active
            .filter(|&a| minute > a)
            .map(|a| minute - a - 1)
    }

    /// Drops idle times that ended before `minute − horizon`.
    pub fn forget_before(&mut self, minute: u64, horizon: u64) {
        while let Some(&(end, _)) = self.idle.front() {
            if end + horizon < minute {
                self.idle.pop_front();
            } else {
                break;
            }
        }
    }
}

/// LSTH parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct LsthConfig {
    /// Long window, minutes (24 h).
    pub long_window: u64,
    /// Short window, minutes (1 h).
    pub short_window: u64,
    /// Weight of the long histogram (0.5).
    pub beta: f64,
    /// Keep-alive before any idle time is known, minutes (10, the AWS default).
    pub default_keep: u32,
    /// Percentile rule parameters (range, percentiles, margins) shared with HHP.
    pub hhp: HhpConfig,
}

impl Default for LsthConfig {
    fn default() -> Self {
        Self {
            long_window: 1440,
            short_window: 60,
            beta: 0.5,
            default_keep: 10,
            hhp: HhpConfig::default(),
        }
    }
}

/// LSTH windows from the tracker's idle times at `minute`.
pub fn lsth_windows(idle: &VecDeque<(u64, u64)>, minute: u64, cfg: &LsthConfig) -> Windows {
    let range = cfg.hhp.range;
    let long = IdleHistogram::from_idle_times(
        range,
        idle.iter()
            .filter(|(end, _)| end + cfg.long_window >= minute)
            .map(|&(_, i)| i),
    );
    let short = IdleHistogram::from_idle_times(
        range,
        idle.iter()
            .filter(|(end, _)| end + cfg.short_window >= minute)
            .map(|&(_, i)| i),
    );
    let nl = long.in_range() + long.oob;
    let ns = short.in_range() + short.oob;
    if nl == 0.0 {
        return Windows {
            prewarm: 0,
            keep_until: cfg.default_keep,
        };
    }
    let beta = if ns >= 2.0 { cfg.beta } else { 1.0 };
    let mut mix = IdleHistogram::new(range);
    for i in 0..range as usize {
        mix.bins[i] = beta * long.bins[i] / nl
            + if ns > 0.0 {
                (1.0 - beta) * short.bins[i] / ns
            } else {
                0.0
            };
    }
    mix.oob = beta * long.oob / nl
        + if ns > 0.0 {
            (1.0 - beta) * short.oob / ns
        } else {
            0.0
        };
    mix.percentile_windows(&cfg.hhp).unwrap_or(Windows {
        // Everything out of range: keep alive the whole range, like HHP's conservative branch.
        prewarm: 0,
        keep_until: range,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concentrated_histogram_gives_tight_window() {
        // Ten idle times of exactly 10 min: bin 10 holds everything; CV = sqrt(239) ≈ 15.5 ≥ 2.
        let idle = vec![10u64; 10];
        let h = IdleHistogram::from_idle_times(240, idle.iter().copied());
        assert!((h.bin_cv() - 239f64.sqrt()).abs() < 1e-9);
        let (w, b) = hhp_windows(&h, &idle, &HhpConfig::default());
        assert_eq!(b, HhpBranch::Histogram);
        // pre-warm ⌊0.9·10⌋ = 9; keep until ⌈1.1·11⌉ = ⌈12.1⌉ = 13.
        assert_eq!(
            w,
            Windows {
                prewarm: 9,
                keep_until: 13
            }
        );
        assert!(!w.warm_at(8) && w.warm_at(9) && w.warm_at(12) && !w.warm_at(13));
    }

    #[test]
    fn two_mode_histogram_percentiles() {
        // 19 idle times of 20 min and one of 3 min: 5th percentile = bin 3 (1/20 = 5 % cumulative),
        // 99th = bin 20. pre-warm ⌊0.9·3⌋ = 2, keep until ⌈1.1·21⌉ = ⌈23.1⌉ = 24.
        let mut idle = vec![20u64; 19];
        idle.push(3);
        let h = IdleHistogram::from_idle_times(240, idle.iter().copied());
        assert_eq!(h.percentile_bin(5.0), Some(3));
        assert_eq!(h.percentile_bin(99.0), Some(20));
        let (w, b) = hhp_windows(&h, &idle, &HhpConfig::default());
        assert_eq!(b, HhpBranch::Histogram);
        assert_eq!(
            w,
            Windows {
                prewarm: 2,
                keep_until: 24
            }
        );
    }

    #[test]
    fn flat_histogram_is_not_representative() {
        // One idle time in each of bins 0..240: CV = 0 < 2 → keep alive the 4 h range.
        let idle: Vec<u64> = (0..240).collect();
        let h = IdleHistogram::from_idle_times(240, idle.iter().copied());
        assert_eq!(h.bin_cv(), 0.0);
        let (w, b) = hhp_windows(&h, &idle, &HhpConfig::default());
        assert_eq!(b, HhpBranch::NotRepresentative);
        assert_eq!(
            w,
            Windows {
                prewarm: 0,
                keep_until: 240
            }
        );
    }

    #[test]
    fn too_few_samples_is_not_representative() {
        let idle = vec![10u64; 4];
        let h = IdleHistogram::from_idle_times(240, idle.iter().copied());
        assert_eq!(
            hhp_windows(&h, &idle, &HhpConfig::default()).1,
            HhpBranch::NotRepresentative
        );
    }

    #[test]
    fn mostly_out_of_bounds_uses_time_series() {
        // Idle times 300, 400, 500, 600, 100: OOB share 4/5 > 0.5.
        // ES(0.5): 300 → 350 → 425 → 512.5 → 306.25. Window [⌊260.3⌋, ⌈352.2⌉) = [260, 353).
        let idle = vec![300u64, 400, 500, 600, 100];
        let h = IdleHistogram::from_idle_times(240, idle.iter().copied());
        assert_eq!(h.oob, 4.0);
        let (w, b) = hhp_windows(&h, &idle, &HhpConfig::default());
        assert_eq!(b, HhpBranch::TimeSeries);
        assert_eq!(
            w,
            Windows {
                prewarm: 260,
                keep_until: 353
            }
        );
    }

    #[test]
    fn idle_tracker_measures_gaps() {
        let mut t = IdleTracker::default();
        for (m, c) in [(0, 1), (1, 2), (2, 0), (3, 0), (4, 1)] {
            t.observe(m, c);
        }
        let v: Vec<u64> = t.idle.iter().map(|x| x.1).collect();
        assert_eq!(v, vec![0, 2]);
        assert_eq!(t.idle_before(5), Some(0));
        assert_eq!(t.idle_before(8), Some(3));
    }

    #[test]
    fn lsth_mixes_long_and_short() {
        // Long history: 40 idle times of 30 min; the last hour: two idle times of 2 min.
        let mut idle = VecDeque::new();
        for k in 0..40u64 {
            idle.push_back((100 + 20 * k, 30));
        }
        idle.push_back((1000, 2));
        idle.push_back((1003, 2));
        let w = lsth_windows(&idle, 1010, &LsthConfig::default());
        // Mixture: bin 2 = 0.5·2/42 + 0.5·2/2 ≈ 0.524, bin 30 = 0.5·40/42 ≈ 0.476.
        // 5th percentile bin 2 → pre-warm ⌊1.8⌋ = 1; 99th bin 30 → keep until ⌈34.1⌉ = 35.
        assert_eq!(
            w,
            Windows {
                prewarm: 1,
                keep_until: 35
            }
        );
        // Once the short window is empty, only the long histogram counts: bin 2 holds
        // 2/42 ≈ 4.8 % < 5 %, so the head is bin 30 → pre-warm ⌊27⌋ = 27.
        let w_long_only = lsth_windows(&idle, 1003 + 61, &LsthConfig::default());
        assert_eq!(
            w_long_only,
            Windows {
                prewarm: 27,
                keep_until: 35
            }
        );
        assert!(
            lsth_windows(&VecDeque::new(), 5, &LsthConfig::default())
                == Windows {
                    prewarm: 0,
                    keep_until: 10
                }
        );
    }
}
