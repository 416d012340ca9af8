//! Load / keep / unload policies, one instance per function.
//!
//! Owns: the [`Policy`] trait the simulator and the online [`crate::manager::PrewarmManager`]
//! drive once per minute, the forecast-driven policy with its anti-thrashing cool-down
//! ([`ForecastPolicy`], used with LS-LSTM), the histogram policies (HHP, LSTH), fixed keep-alive,
//! and the oracle; plus [`PolicySpec`], the parsable name of each.
//!
//! **Forecast policy rule.** At the start of minute `m` the forecaster gives `r̂(m)`. The model is
//! wanted resident iff `r̂(m) ≥ θ` (load threshold, default 0.5 requests), or it is resident and
//! the last minute that had a request or a forecast ≥ θ is at most `cooldown` minutes ago (default
//! 1). The cool-down is what stops a model from being unloaded and reloaded when forecasts
//! flicker around θ.
//!
//! **Hybrid rule** ([`Hybrid`]). Each function runs two *sides* in shadow every minute: the
//! forecast policy above (LS-LSTM) and HHP, each deciding as if it ran alone (the forecast side's
//! cool-down sees its own residency: its own last decision or an on-demand load). The model is
//! resident iff the forecast side wants it **or** HHP does — unless the evidence says one side
//! alone is enough. Evidence = the last [`HybridConfig::evidence`] active minutes (default 16) and
//! the idle minutes between them (completed gaps only, so the mode changes only after an active
//! minute). Per side: *misses* = active minutes it did not want warm (its
//! first request there would have been cold), *waste* = idle minutes it wanted warm. With a full
//! window:
//! - forecast alone if the forecast side missed nothing and wasted no more than HHP;
//! - else HHP alone if HHP missed nothing and wasted strictly less than the forecast side;
//! - else both (the union).
//!
//! So a side is dropped only when the other, alone, was no worse on both cold starts and waste
//! over the recent window; any miss of the trusted side brings the union back at once (at the
//! cost of that one cold minute). The evidence is updated in every observed minute, also in
//! minutes nobody asked about (the sides decide then in shadow), so a replay's history counts too.
//!
//! Must never: look at a minute's requests before deciding for that minute (the oracle alone is
//! built with the future and says so).

use std::collections::VecDeque;

use anyhow::{bail, Result};

use crate::forecast::{Forecaster, LastValue};
use crate::histogram::{
    hhp_windows, lsth_windows, HhpConfig, IdleHistogram, IdleTracker, LsthConfig,
};
use crate::lstm::{LsLstm, LsLstmConfig};

/// What the runtime should do with a function's model at the start of a minute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Not resident and wanted: load it now (pre-warm).
    Load,
    /// Resident and wanted: keep it.
    Keep,
    /// Resident and not wanted: unload it once idle.
    Unload,
}

impl Action {
    /// Hint for a model currently `loaded` that the policy `want`s resident; `None` when it is
    /// neither resident nor wanted.
    pub fn from_state(loaded: bool, want: bool) -> Option<Action> {
        match (loaded, want) {
            (false, true) => Some(Action::Load),
            (true, true) => Some(Action::Keep),
            (true, false) => Some(Action::Unload),
            (false, false) => None,
        }
    }
}

/// A per-function residency policy, driven minute by minute in order.
pub trait Policy: Send {
    /// Name for reports.
    fn name(&self) -> String;
    /// Whether the model should be resident during `minute`; `loaded` tells whether it is now.
    /// Called at the start of `minute`, before any of its requests are observed.
    fn want_warm(&mut self, minute: u64, loaded: bool) -> bool;
    /// The requests of `minute` (every minute in order, 0 for idle ones).
    fn observe(&mut self, minute: u64, count: u32);
    /// The last forecast of requests for the decided minute, when the policy forecasts counts.
    fn last_forecast(&self) -> Option<f64> {
        None
    }
}

/// Keep the model resident for `keep` minutes after its last active minute.
#[derive(Debug, Clone)]
pub struct FixedKeepAlive {
    keep: u64,
    idle: IdleTracker,
}

impl FixedKeepAlive {
    /// A fixed keep-alive of `keep` minutes.
    pub fn new(keep: u64) -> Self {
        Self {
            keep,
            idle: IdleTracker::default(),
        }
    }
}

impl Policy for FixedKeepAlive {
    fn name(&self) -> String {
        format!("fixed-{}", self.keep)
    }
    fn want_warm(&mut self, minute: u64, _loaded: bool) -> bool {
        self.idle.idle_before(minute).is_some_and(|i| i < self.keep)
    }
    fn observe(&mut self, minute: u64, count: u32) {
        self.idle.observe(minute, count);
        // Only the last active minute matters here.
        self.idle.idle.clear();
    }
}

/// The hybrid histogram policy (Shahrad et al., ATC'20), see [`crate::histogram`].
#[derive(Debug, Clone)]
pub struct Hhp {
    cfg: HhpConfig,
    idle: IdleTracker,
    hist: IdleHistogram,
    series: Vec<u64>,
}

impl Hhp {
    /// A fresh HHP with `cfg`.
    pub fn new(cfg: HhpConfig) -> Self {
        Self {
            hist: IdleHistogram::new(cfg.range),
            cfg,
            idle: IdleTracker::default(),
            series: Vec::new(),
        }
    }
}

impl Policy for Hhp {
    fn name(&self) -> String {
        "hhp".into()
    }
    fn want_warm(&mut self, minute: u64, _loaded: bool) -> bool {
        let Some(i) = self.idle.idle_before(minute) else {
            return false;
        };
        let (w, _) = hhp_windows(&self.hist, &self.series, &self.cfg);
        w.warm_at(i)
    }
    fn observe(&mut self, minute: u64, count: u32) {
        self.idle.observe(minute, count);
        while let Some((_, i)) = self.idle.idle.pop_front() {
            self.hist.add(i, 1.0);
            self.series.push(i);
        }
        // The ES forecast only needs the recent idle times.
        if self.series.len() > 512 {
            self.series.drain(..256);
        }
    }
}

/// LSTH (INFless, ASPLOS'22), see [`crate::histogram`].
#[derive(Debug, Clone)]
pub struct Lsth {
    cfg: LsthConfig,
    idle: IdleTracker,
}

impl Lsth {
    /// A fresh LSTH with `cfg`.
    pub fn new(cfg: LsthConfig) -> Self {
        Self {
            cfg,
            idle: IdleTracker::default(),
        }
    }
}

impl Policy for Lsth {
    fn name(&self) -> String {
        "lsth".into()
    }
    fn want_warm(&mut self, minute: u64, _loaded: bool) -> bool {
        let Some(i) = self.idle.idle_before(minute) else {
            return false;
        };
        lsth_windows(&self.idle.idle, minute, &self.cfg).warm_at(i)
    }
    fn observe(&mut self, minute: u64, count: u32) {
        self.idle.observe(minute, count);
        self.idle.forget_before(minute, self.cfg.long_window);
    }
}

/// Knows every future count: resident exactly in the minutes that have requests. The lower bound
/// on both cold starts and waste; built with the whole series, so only for replay.
#[derive(Debug, Clone)]
pub struct Oracle {
    counts: Vec<u32>,
}

impl Oracle {
    /// An oracle over the full series.
    pub fn new(counts: Vec<u32>) -> Self {
        Self { counts }
    }
}

impl Policy for Oracle {
    fn name(&self) -> String {
        "oracle".into()
    }
    fn want_warm(&mut self, minute: u64, _loaded: bool) -> bool {
        self.counts.get(minute as usize).is_some_and(|&c| c > 0)
    }
    fn observe(&mut self, _minute: u64, _count: u32) {}
    fn last_forecast(&self) -> Option<f64> {
        None
    }
}

/// Parameters of the forecast-driven policy.
#[derive(Debug, Clone, PartialEq)]
pub struct ForecastPolicyConfig {
    /// Load threshold θ in forecast requests per minute.
    pub threshold: f64,
    /// Cool-down in minutes.
    pub cooldown: u64,
}

impl Default for ForecastPolicyConfig {
    fn default() -> Self {
        Self {
            // 0.5: load when one request is more likely than none under a rounding reading of r̂.
            threshold: 0.5,
            // 1 min: bridges a one-minute dip of the forecast below θ. Chosen on the seed-42 suite
            // (docs/prewarm.md, "sensitivity"): 2 min cost timers 17 points of waste for no cold
            // start saved; 0 min thrashes on flickering forecasts.
            cooldown: 1,
        }
    }
}

/// Turns a count [`Forecaster`] into a residency policy (rule in the module docs).
pub struct ForecastPolicy {
    forecaster: Box<dyn Forecaster>,
    cfg: ForecastPolicyConfig,
    last_reason: Option<u64>,
    last: Option<f64>,
    failed: bool,
}

impl ForecastPolicy {
    /// Wraps `forecaster`.
    pub fn new(forecaster: Box<dyn Forecaster>, cfg: ForecastPolicyConfig) -> Self {
        Self {
            forecaster,
            cfg,
            last_reason: None,
            last: None,
            failed: false,
        }
    }
}

impl Policy for ForecastPolicy {
    fn name(&self) -> String {
        self.forecaster.name()
    }
    fn want_warm(&mut self, minute: u64, loaded: bool) -> bool {
        let r = match self.forecaster.forecast() {
            Ok(r) => r,
            Err(e) => {
                if !self.failed {
                    tracing::warn!(error = %e, "forecaster failed; treating forecast as 0 from now on until it recovers");
                    self.failed = true;
                }
                0.0
            }
        };
        self.last = Some(r);
        if r >= self.cfg.threshold {
            self.last_reason = Some(minute);
            return true;
        }
        loaded
            && self
                .last_reason
                .is_some_and(|a| minute.saturating_sub(a) <= self.cfg.cooldown)
    }
    fn observe(&mut self, minute: u64, count: u32) {
        if count > 0 {
            self.last_reason = Some(minute);
        }
        self.forecaster.observe(count);
    }
    fn last_forecast(&self) -> Option<f64> {
        self.last
    }
}

/// Parameters of the [`Hybrid`] policy.
#[derive(Debug, Clone, PartialEq)]
pub struct HybridConfig {
    /// Active minutes of evidence before one side may be dropped (and the window's length in
    /// active minutes).
    pub evidence: usize,
}

impl Default for HybridConfig {
    fn default() -> Self {
        Self {
            // 16 active minutes (our choice, not tuned on the suite): longer than one burst of the
            // bursty class (ON 2–10 min), so a window always holds a burst start the forecast
            // cannot see coming; a 60-minute timer reaches it in 16 h of history.
            evidence: 16,
        }
    }
}

/// Which side(s) the hybrid follows in the current minute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum HybridMode {
    /// Resident when either side wants it (not enough evidence, or both sides missed).
    Union,
    /// The forecast side alone (it missed nothing and wasted no more than HHP).
    Forecast,
    /// HHP alone (it missed nothing and wasted less than the forecast side).
    Hhp,
}

/// One active minute of evidence.
#[derive(Debug, Clone, Copy)]
struct Evidence {
    /// The forecast side did not want the model warm in this active minute.
    forecast_miss: bool,
    /// HHP did not want it warm.
    hhp_miss: bool,
    /// Idle minutes the forecast side wanted warm since the previous active minute.
    forecast_waste: u64,
    /// Idle minutes HHP wanted warm since the previous active minute.
    hhp_waste: u64,
}

/// Forecast policy ∪ HHP with the per-function reliability rule of the module docs.
pub struct Hybrid {
    forecast: ForecastPolicy,
    hhp: Hhp,
    cfg: HybridConfig,
    /// The minute last decided and both sides' wants in it.
    decided: Option<(u64, bool, bool)>,
    /// Shadow residency of the forecast side (what it would have resident if it ran alone).
    forecast_loaded: bool,
    /// The last `cfg.evidence` active minutes.
    window: VecDeque<Evidence>,
    /// Idle minutes since the last active minute that each side wanted warm.
    pending_forecast_waste: u64,
    pending_hhp_waste: u64,
    mode: HybridMode,
}

impl Hybrid {
    /// Combines a forecast policy over `forecaster` with HHP.
    pub fn new(
        forecaster: Box<dyn Forecaster>,
        forecast: ForecastPolicyConfig,
        hhp: HhpConfig,
        cfg: HybridConfig,
    ) -> Self {
        Self {
            forecast: ForecastPolicy::new(forecaster, forecast),
            hhp: Hhp::new(hhp),
            cfg,
            decided: None,
            forecast_loaded: false,
            window: VecDeque::new(),
            pending_forecast_waste: 0,
            pending_hhp_waste: 0,
            mode: HybridMode::Union,
        }
    }

    /// The mode of the last decision.
    pub fn mode(&self) -> HybridMode {
        self.mode
    }

    /// Both sides decide `minute` (once per minute).
    fn sides(&mut self, minute: u64) -> (bool, bool) {
        if let Some((m, f, h)) = self.decided {
            if m == minute {
                return (f, h);
            }
        }
        let f = self.forecast.want_warm(minute, self.forecast_loaded);
        let h = self.hhp.want_warm(minute, false);
        self.decided = Some((minute, f, h));
        (f, h)
    }

    /// The reliability rule on the current evidence.
    fn current_mode(&self) -> HybridMode {
        if self.cfg.evidence == 0 || self.window.len() < self.cfg.evidence {
            return HybridMode::Union;
        }
        let (mut fm, mut hm) = (false, false);
        // Completed gaps only: the current gap is not judged half-way (the sides waste at
        // different phases of a cycle), so the mode changes only after an active minute.
        let (mut fw, mut hw) = (0, 0);
        for e in &self.window {
            fm |= e.forecast_miss;
            hm |= e.hhp_miss;
            fw += e.forecast_waste;
            hw += e.hhp_waste;
        }
        if !fm && fw <= hw {
            HybridMode::Forecast
        } else if !hm && hw < fw {
            HybridMode::Hhp
        } else {
            HybridMode::Union
        }
    }
}

impl Policy for Hybrid {
    fn name(&self) -> String {
        "hybrid".into()
    }
    fn want_warm(&mut self, minute: u64, _loaded: bool) -> bool {
        let (f, h) = self.sides(minute);
        self.mode = self.current_mode();
        match self.mode {
            HybridMode::Union => f || h,
            HybridMode::Forecast => f,
            HybridMode::Hhp => h,
        }
    }
    fn observe(&mut self, minute: u64, count: u32) {
        // Minutes nobody asked about (replay history, skipped ticks) are decided in shadow so the
        // evidence covers every observed minute.
        let (f, h) = self.sides(minute);
        if count > 0 {
            self.window.push_back(Evidence {
                forecast_miss: !f,
                hhp_miss: !h,
                forecast_waste: std::mem::take(&mut self.pending_forecast_waste),
                hhp_waste: std::mem::take(&mut self.pending_hhp_waste),
            });
            while self.window.len() > self.cfg.evidence.max(1) {
                self.window.pop_front();
            }
        } else {
            self.pending_forecast_waste += u64::from(f);
            self.pending_hhp_waste += u64::from(h);
        }
        // A request loads the model on demand; it stays until the next decision.
        self.forecast_loaded = f || count > 0;
        self.forecast.observe(minute, count);
        self.hhp.observe(minute, count);
    }
    fn last_forecast(&self) -> Option<f64> {
        self.forecast.last_forecast()
    }
}

/// A policy by name, as given on the command line.
#[derive(Debug, Clone, PartialEq)]
pub enum PolicySpec {
    /// SMORE's LS-LSTM with the forecast policy.
    LsLstm,
    /// Naive last-value forecast with the forecast policy.
    LastValue,
    /// Hybrid histogram policy.
    Hhp,
    /// Long/short-term histogram.
    Lsth,
    /// Fixed keep-alive in minutes.
    Fixed(u64),
    /// LS-LSTM forecast policy ∪ HHP with the reliability rule ([`Hybrid`]).
    Hybrid,
    /// Future-knowing lower bound.
    Oracle,
}

impl PolicySpec {
    /// The policies of the standard comparison.
    pub fn standard() -> Vec<PolicySpec> {
        vec![
            PolicySpec::LsLstm,
            PolicySpec::Hhp,
            PolicySpec::Lsth,
            PolicySpec::Fixed(10),
            PolicySpec::Fixed(20),
            PolicySpec::LastValue,
            PolicySpec::Oracle,
        ]
    }

    /// Parses `ls-lstm`, `last-value`, `hhp`, `lsth`, `hybrid`, `fixed-N`, `oracle`.
    pub fn parse(s: &str) -> Result<Self> {
        Ok(match s.trim() {
            "ls-lstm" | "lslstm" => PolicySpec::LsLstm,
            "last-value" => PolicySpec::LastValue,
            "hhp" => PolicySpec::Hhp,
            "lsth" => PolicySpec::Lsth,
            "hybrid" => PolicySpec::Hybrid,
            "oracle" => PolicySpec::Oracle,
            other => match other.strip_prefix("fixed-").map(str::parse::<u64>) {
                Some(Ok(n)) if n > 0 => PolicySpec::Fixed(n),
                _ => bail!(
                    "unknown policy `{other}` (expected ls-lstm, last-value, hhp, lsth, hybrid, fixed-N with N > 0 minutes, oracle)"
                ),
            },
        })
    }

    /// Parses a comma-separated list.
    pub fn parse_list(s: &str) -> Result<Vec<Self>> {
        s.split(',')
            .filter(|p| !p.trim().is_empty())
            .map(Self::parse)
            .collect()
    }

    /// Report name.
    pub fn name(&self) -> String {
        match self {
            PolicySpec::LsLstm => "ls-lstm".into(),
            PolicySpec::LastValue => "last-value".into(),
            PolicySpec::Hhp => "hhp".into(),
            PolicySpec::Lsth => "lsth".into(),
            PolicySpec::Fixed(n) => format!("fixed-{n}"),
            PolicySpec::Hybrid => "hybrid".into(),
            PolicySpec::Oracle => "oracle".into(),
        }
    }

    /// Builds a fresh instance for one function. `future` is the function's full series, used by
    /// the oracle only; online callers pass `None` and the oracle is refused.
    pub fn build(
        &self,
        settings: &PolicySettings,
        future: Option<&[u32]>,
    ) -> Result<Box<dyn Policy>> {
        Ok(match self {
            PolicySpec::LsLstm => Box::new(ForecastPolicy::new(
                Box::new(LsLstm::new(settings.lslstm.clone())?),
                settings.forecast.clone(),
            )),
            PolicySpec::LastValue => Box::new(ForecastPolicy::new(
                Box::new(LastValue::default()),
                settings.forecast.clone(),
            )),
            PolicySpec::Hhp => Box::new(Hhp::new(settings.hhp.clone())),
            PolicySpec::Lsth => Box::new(Lsth::new(settings.lsth.clone())),
            PolicySpec::Fixed(n) => Box::new(FixedKeepAlive::new(*n)),
            PolicySpec::Hybrid => Box::new(Hybrid::new(
                Box::new(LsLstm::new(settings.lslstm.clone())?),
                settings.forecast.clone(),
                settings.hhp.clone(),
                settings.hybrid.clone(),
            )),
            PolicySpec::Oracle => match future {
                Some(f) => Box::new(Oracle::new(f.to_vec())),
                None => bail!("the oracle needs the future and exists only in trace replay"),
            },
        })
    }
}

/// Parameters of every policy kind.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PolicySettings {
    /// LS-LSTM forecaster.
    pub lslstm: LsLstmConfig,
    /// Forecast → residency rule.
    pub forecast: ForecastPolicyConfig,
    /// HHP.
    pub hhp: HhpConfig,
    /// LSTH.
    pub lsth: LsthConfig,
    /// Hybrid reliability rule.
    pub hybrid: HybridConfig,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drive(p: &mut dyn Policy, counts: &[u32]) -> Vec<bool> {
        let mut loaded = false;
        let mut out = Vec::new();
        for (m, &c) in counts.iter().enumerate() {
            let w = p.want_warm(m as u64, loaded);
            out.push(w);
            // The model is resident after a request (cold start) until the next decision.
            loaded = w || c > 0;
            p.observe(m as u64, c);
        }
        out
    }

    #[test]
    fn fixed_keep_alive_windows() {
        let mut p = FixedKeepAlive::new(2);
        let w = drive(&mut p, &[1, 0, 0, 0, 1, 0]);
        assert_eq!(w, vec![false, true, true, false, false, true]);
    }

    #[test]
    fn oracle_matches_future() {
        let c = [0, 3, 0, 1];
        let mut p = Oracle::new(c.to_vec());
        assert_eq!(drive(&mut p, &c), vec![false, true, false, true]);
        assert!(PolicySpec::Oracle
            .build(&PolicySettings::default(), None)
            .is_err());
    }

    #[test]
    fn forecast_policy_cooldown() {
        // Last-value forecasts with θ = 0.5, cool-down 2: resident while requests continue, then
        // two more minutes.
        let mut p = ForecastPolicy::new(
            Box::new(LastValue::default()),
            ForecastPolicyConfig {
                threshold: 0.5,
                cooldown: 2,
            },
        );
        let w = drive(&mut p, &[1, 1, 0, 0, 0, 0]);
        // m0: r̂=0 → no. m1: r̂=1 → yes. m2: r̂=1 → yes. m3: r̂=0, last reason m2 (forecast) → yes.
        // m4: last reason m2, 2 ago → yes. m5: 3 ago → no.
        assert_eq!(w, vec![false, true, true, true, true, false]);
    }

    /// Replays fixed forecasts, one per minute.
    struct Scripted(std::vec::IntoIter<f64>);

    impl Forecaster for Scripted {
        fn name(&self) -> String {
            "scripted".into()
        }
        fn observe(&mut self, _count: u32) {}
        fn forecast(&mut self) -> anyhow::Result<f64> {
            Ok(self.0.next().unwrap_or(0.0))
        }
    }

    #[test]
    fn cooldown_stops_thrashing_on_a_flickering_forecast() {
        // The forecast flickers around θ = 0.5 while requests arrive every third minute.
        let forecasts: Vec<f64> = (0..30)
            .map(|m| if m % 2 == 0 { 0.6 } else { 0.4 })
            .collect();
        let counts: Vec<u32> = (0..30).map(|m| u32::from(m % 3 == 0)).collect();
        let loads = |cooldown: u64| {
            let mut p = ForecastPolicy::new(
                Box::new(Scripted(forecasts.clone().into_iter())),
                ForecastPolicyConfig {
                    threshold: 0.5,
                    cooldown,
                },
            );
            let w = drive(&mut p, &counts);
            // A load = a minute resident that was not resident the minute before.
            let mut n = usize::from(w[0]);
            n += w.windows(2).filter(|x| !x[0] && x[1]).count();
            (n, w)
        };
        let (thrash, w0) = loads(0);
        let (calm, w1) = loads(1);
        // Without a cool-down the model is unloaded at every 0.4 minute and reloaded at the next.
        assert_eq!(thrash, 15, "{w0:?}");
        // With one minute of cool-down it is loaded once and kept.
        assert_eq!(calm, 1, "{w1:?}");
        assert!(w1.iter().all(|&x| x));
    }

    /// Seasonal naive forecast: the count `period` minutes ago — a stand-in for a forecaster that
    /// has learnt a timer (it only sees the past).
    struct SeasonalNaive {
        period: usize,
        hist: Vec<u32>,
    }

    impl Forecaster for SeasonalNaive {
        fn name(&self) -> String {
            "seasonal-naive".into()
        }
        fn observe(&mut self, count: u32) {
            self.hist.push(count);
        }
        fn forecast(&mut self) -> anyhow::Result<f64> {
            let n = self.hist.len();
            Ok(if n >= self.period {
                f64::from(self.hist[n - self.period])
            } else {
                0.0
            })
        }
    }

    fn seasonal(period: usize) -> Box<dyn Forecaster> {
        Box::new(SeasonalNaive {
            period,
            hist: Vec::new(),
        })
    }

    const MODEL: crate::sim::ModelProfile = crate::sim::ModelProfile {
        name: "t",
        load_s: 2.0,
        mem_mib: 1024.0,
    };

    fn replay_scored(counts: &[u32], p: &mut dyn Policy, score_from: usize) -> FunctionResult {
        crate::sim::replay(
            counts,
            0.05,
            &MODEL,
            p,
            &crate::sim::ReplayConfig {
                score_from,
                decide_lead: score_from,
                record_forecasts: false,
            },
        )
    }

    use crate::sim::FunctionResult;

    #[test]
    fn hybrid_follows_a_reliable_forecast_on_a_timer() {
        // A timer firing 2 calls every 30 minutes. HHP learns idle time 29 → window [26, 33):
        // 3 idle minutes warm before each firing. The forecast side (seasonal naive, exact here)
        // is warm in the firing minute and the 1-minute cool-down after it: 1 idle minute.
        let counts: Vec<u32> = (0..3000).map(|m| if m % 30 == 7 { 2 } else { 0 }).collect();
        let mk = || {
            Hybrid::new(
                seasonal(30),
                ForecastPolicyConfig::default(),
                HhpConfig::default(),
                HybridConfig::default(),
            )
        };
        // Per minute, once 16 firings are known, the hybrid decides exactly like the forecast
        // policy alone.
        let wh = drive(&mut mk(), &counts);
        let wf = drive(
            &mut ForecastPolicy::new(seasonal(30), ForecastPolicyConfig::default()),
            &counts,
        );
        let wu = drive(&mut Hhp::new(HhpConfig::default()), &counts);
        assert_eq!(wh[600..], wf[600..]);
        // …which is not the union: HHP's pre-warm minutes were dropped.
        assert!((600..3000).any(|m| wu[m] && !wh[m]));
        // Replayed: no cold start, the forecast's waste, a third of HHP's.
        let mut hy = mk();
        let h = replay_scored(&counts, &mut hy, 1500);
        assert_eq!(hy.mode(), HybridMode::Forecast);
        let f = replay_scored(
            &counts,
            &mut ForecastPolicy::new(seasonal(30), ForecastPolicyConfig::default()),
            1500,
        );
        let u = replay_scored(&counts, &mut Hhp::new(HhpConfig::default()), 1500);
        assert_eq!((h.n_cold, f.n_cold, u.n_cold), (0, 0, 0));
        assert_eq!(h.loaded_idle_s, f.loaded_idle_s);
        assert!((h.loaded_idle_s - 50.0 * 60.0).abs() < 1e-6, "{h:?}");
        assert!((u.loaded_idle_s - 150.0 * 60.0).abs() < 1e-6, "{u:?}");
    }

    #[test]
    fn hybrid_does_not_mix_sides_within_a_cycle() {
        // A 10-minute timer: HHP learns idle time 9 → window [8, 11), warm the minute before each
        // firing; the forecast side is warm the minute after (cool-down). Both waste 1 idle minute
        // per period: the hybrid must follow one of them (1 per period), not both (2).
        let counts: Vec<u32> = (0..2000).map(|m| u32::from(m % 10 == 4)).collect();
        let mut hy = Hybrid::new(
            seasonal(10),
            ForecastPolicyConfig::default(),
            HhpConfig::default(),
            HybridConfig::default(),
        );
        let h = replay_scored(&counts, &mut hy, 1000);
        let u = replay_scored(&counts, &mut Hhp::new(HhpConfig::default()), 1000);
        assert_eq!((h.n_cold, u.n_cold), (0, 0));
        assert!((u.loaded_idle_s - 100.0 * 60.0).abs() < 1e-6, "{u:?}");
        assert_eq!(h.loaded_idle_s, u.loaded_idle_s, "{h:?}");
        assert_eq!(hy.mode(), HybridMode::Forecast);
    }

    #[test]
    fn hybrid_keeps_hhp_cold_starts_on_an_unforecastable_series() {
        use rand::{Rng, SeedableRng};
        // 3 days, 12 calls a day at uniformly random minutes; last-value (like any forecaster)
        // cannot see them coming.
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let mut counts = vec![0u32; 3 * 1440];
        for d in 0..3 {
            for _ in 0..12 {
                counts[d * 1440 + rng.gen_range(0..1440)] += 1;
            }
        }
        let mk = || {
            Hybrid::new(
                Box::new(LastValue::default()),
                ForecastPolicyConfig::default(),
                HhpConfig::default(),
                HybridConfig::default(),
            )
        };
        // Per minute: never the forecast alone, and warm whenever HHP alone would be.
        let mut hy = mk();
        let mut hhp = Hhp::new(HhpConfig::default());
        let (mut lh, mut lu) = (false, false);
        for (m, &c) in counts.iter().enumerate() {
            let m = m as u64;
            let wh = hy.want_warm(m, lh);
            let wu = hhp.want_warm(m, lu);
            assert_ne!(hy.mode(), HybridMode::Forecast, "minute {m}");
            assert!(wh || !wu, "minute {m}: HHP warm, hybrid not");
            lh = wh || c > 0;
            lu = wu || c > 0;
            hy.observe(m, c);
            hhp.observe(m, c);
        }
        // Replayed over the last day: HHP's cold starts (or fewer), which are fewer than the
        // forecast policy's.
        let h = replay_scored(&counts, &mut mk(), 2880);
        let u = replay_scored(&counts, &mut Hhp::new(HhpConfig::default()), 2880);
        let f = replay_scored(
            &counts,
            &mut ForecastPolicy::new(
                Box::new(LastValue::default()),
                ForecastPolicyConfig::default(),
            ),
            2880,
        );
        assert!(h.n_cold <= u.n_cold, "{h:?} {u:?}");
        assert!(u.n_cold < f.n_cold, "{u:?} {f:?}");
    }

    #[test]
    fn hybrid_drops_the_forecast_where_hhp_is_exact_and_cheaper() {
        // A forecaster that always says 1: never misses, but warm every minute. HHP on a
        // 5-minute timer misses nothing either and wastes less: HHP alone.
        struct Always;
        impl Forecaster for Always {
            fn name(&self) -> String {
                "always".into()
            }
            fn observe(&mut self, _count: u32) {}
            fn forecast(&mut self) -> anyhow::Result<f64> {
                Ok(1.0)
            }
        }
        let counts: Vec<u32> = (0..600).map(|m| u32::from(m % 5 == 0)).collect();
        let mut hy = Hybrid::new(
            Box::new(Always),
            ForecastPolicyConfig::default(),
            HhpConfig::default(),
            HybridConfig::default(),
        );
        let wh = drive(&mut hy, &counts);
        let wu = drive(&mut Hhp::new(HhpConfig::default()), &counts);
        assert_eq!(hy.mode(), HybridMode::Hhp);
        assert_eq!(wh[200..], wu[200..]);
        assert!(wh[200..].iter().any(|&w| !w));
    }

    #[test]
    fn hybrid_runs_online() {
        let mut m =
            crate::manager::PrewarmManager::new(PolicySpec::Hybrid, PolicySettings::default())
                .unwrap();
        m.register("a", 10);
        assert!(m.tick(0).unwrap().is_empty());
        assert!(!m.request_begin("a", 5.0).unwrap());
        m.request_end("a", 5.1).unwrap();
        // HHP has no idle time yet: keep alive the 4-hour range, so the union keeps the model.
        assert_eq!(m.tick(1).unwrap()[0].action, Action::Keep);
        assert_eq!(m.warm_memory_bytes(), 10);
    }

    #[test]
    fn spec_parsing() {
        assert_eq!(PolicySpec::parse("hybrid").unwrap(), PolicySpec::Hybrid);
        assert_eq!(PolicySpec::Hybrid.name(), "hybrid");
        assert_eq!(
            PolicySpec::parse("fixed-10").unwrap(),
            PolicySpec::Fixed(10)
        );
        assert_eq!(
            PolicySpec::parse_list("ls-lstm,hhp,lsth,oracle").unwrap(),
            vec![
                PolicySpec::LsLstm,
                PolicySpec::Hhp,
                PolicySpec::Lsth,
                PolicySpec::Oracle
            ]
        );
        let e = PolicySpec::parse("fixed-x").unwrap_err().to_string();
        assert!(e.contains("fixed-x"), "{e}");
        assert!(PolicySpec::parse("fixed-0").is_err());
        assert!(PolicySpec::parse("arima").is_err());
    }
}
