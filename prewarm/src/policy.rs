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
//! Must never: look at a minute's requests before deciding for that minute (the oracle alone is
//! built with the future and says so).

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

    /// Parses `ls-lstm`, `last-value`, `hhp`, `lsth`, `fixed-N`, `oracle`.
    pub fn parse(s: &str) -> Result<Self> {
        Ok(match s.trim() {
            "ls-lstm" | "lslstm" => PolicySpec::LsLstm,
            "last-value" => PolicySpec::LastValue,
            "hhp" => PolicySpec::Hhp,
            "lsth" => PolicySpec::Lsth,
            "oracle" => PolicySpec::Oracle,
            other => match other.strip_prefix("fixed-").map(str::parse::<u64>) {
                Some(Ok(n)) if n > 0 => PolicySpec::Fixed(n),
                _ => bail!(
                    "unknown policy `{other}` (expected ls-lstm, last-value, hhp, lsth, fixed-N with N > 0 minutes, oracle)"
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

    #[test]
    fn spec_parsing() {
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
