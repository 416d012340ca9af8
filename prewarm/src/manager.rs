//! The online prewarm API the arbiter drives: request reports in, per-minute load / keep / unload
//! hints out, plus the GPU memory warm models hold.
//!
//! Owns: one [`Policy`] per registered function, the per-minute request counts it feeds them, the
//! believed residency of every model (from the hints it gave and from what runtimes report) and
//! the warm-memory sum.
//!
//! Usage (times are seconds on any monotonic clock shared by all calls; minute = ⌊t/60⌋):
//! ```
//! use smore_prewarm::manager::PrewarmManager;
//! use smore_prewarm::policy::{PolicySpec, PolicySettings};
//! let mut m = PrewarmManager::new(PolicySpec::Fixed(10), PolicySettings::default()).unwrap();
//! m.register("resnet", 400 << 20);
//! let warm = m.request_begin("resnet", 30.0).unwrap(); // cold: nothing resident yet
//! assert!(!warm);
//! m.request_end("resnet", 30.1).unwrap();
//! let hints = m.tick(1).unwrap(); // start of minute 1
//! assert_eq!(hints[0].action, smore_prewarm::policy::Action::Keep);
//! assert_eq!(m.warm_memory_bytes(), 400 << 20);
//! ```
//!
//! Must never: unload a model that is serving a request (an Unload hint is deferred while requests
//! are in flight), or block: every call is O(functions) at most plus the policy's own work.

use std::collections::BTreeMap;

use anyhow::{bail, Result};

use crate::policy::{Action, Policy, PolicySettings, PolicySpec};

/// One hint for the start of a minute (serialises as
/// `{"function":"resnet","action":"load","forecast":1.7}` for `status`).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Hint {
    /// Function name as registered.
    pub function: String,
    /// What to do.
    pub action: Action,
    /// The policy's forecast for the minute, when it makes one.
    pub forecast: Option<f64>,
}

struct Managed {
    policy: Box<dyn Policy>,
    mem_bytes: u64,
    loaded: bool,
    inflight: u32,
    /// Requests begun in `minute`.
    count: u32,
    minute: u64,
    cold: u64,
    total: u64,
    /// The hint of the last tick (`None`: neither resident nor wanted).
    hint: Option<Hint>,
}

/// Online prewarm manager.
pub struct PrewarmManager {
    spec: PolicySpec,
    settings: PolicySettings,
    fns: BTreeMap<String, Managed>,
    /// Minute of the last tick (hints are for this minute).
    minute: Option<u64>,
}

impl std::fmt::Debug for PrewarmManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrewarmManager")
            .field("spec", &self.spec)
            .field("functions", &self.fns.len())
            .field("minute", &self.minute)
            .finish()
    }
}

/// Per-function counters for `status`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct FunctionStatus {
    /// Name.
    pub function: String,
    /// Believed resident.
    pub loaded: bool,
    /// Requests in flight.
    pub inflight: u32,
    /// Cold requests so far.
    pub cold: u64,
    /// Requests so far.
    pub total: u64,
}

impl PrewarmManager {
    /// A manager running `spec` for every function. The oracle is refused (it needs the future).
    pub fn new(spec: PolicySpec, settings: PolicySettings) -> Result<Self> {
        if spec == PolicySpec::Oracle {
            bail!("the oracle policy cannot run online");
        }
        Ok(Self {
            spec,
            settings,
            fns: BTreeMap::new(),
            minute: None,
        })
    }

    /// Registers `function` whose model holds `mem_bytes` of GPU memory when resident.
    /// Registering again updates the memory and keeps the history.
    pub fn register(&mut self, function: &str, mem_bytes: u64) {
        if let Some(f) = self.fns.get_mut(function) {
            f.mem_bytes = mem_bytes;
            return;
        }
        // `build` only fails for the oracle, refused in `new`, or an invalid LS-LSTM config,
        // which `new` callers control; fall back to a fixed keep-alive rather than panic.
        let policy = self.spec.build(&self.settings, None).unwrap_or_else(|e| {
            tracing::warn!(error = %e, function, "policy build failed; using fixed-10 keep-alive");
            Box::new(crate::policy::FixedKeepAlive::new(10))
        });
        let minute = self.minute.unwrap_or(0);
        self.fns.insert(
            function.to_string(),
            Managed {
                policy,
                mem_bytes,
                loaded: false,
                inflight: 0,
                count: 0,
                minute,
                cold: 0,
                total: 0,
                hint: None,
            },
        );
    }

    /// Forgets `function`.
    pub fn unregister(&mut self, function: &str) -> bool {
        self.fns.remove(function).is_some()
    }

    fn get(&mut self, function: &str) -> Result<&mut Managed> {
        match self.fns.get_mut(function) {
            Some(f) => Ok(f),
            None => bail!("function `{function}` is not registered with the prewarmer"),
        }
    }

    /// Feeds every minute before `minute` to `f`'s policy.
    fn roll(f: &mut Managed, minute: u64) {
        while f.minute < minute {
            let c = std::mem::take(&mut f.count);
            f.policy.observe(f.minute, c);
            f.minute += 1;
        }
    }

    /// A request of `function` begins at `t` seconds. Returns whether the model was resident
    /// (warm); a cold request marks the model resident (the runtime loads it on demand).
    pub fn request_begin(&mut self, function: &str, t: f64) -> Result<bool> {
        if !t.is_finite() || t < 0.0 {
            bail!("request time {t} is not a non-negative number of seconds");
        }
        let minute = (t / 60.0) as u64;
        let f = self.get(function)?;
        if minute < f.minute {
            bail!(
                "request of `{function}` at minute {minute} is older than the current minute {}",
                f.minute
            );
        }
        Self::roll(f, minute);
        f.count += 1;
        f.total += 1;
        f.inflight += 1;
        let warm = f.loaded;
        if !warm {
            f.cold += 1;
            f.loaded = true;
        }
        Ok(warm)
    }

    /// A request of `function` ended at `t` seconds.
    pub fn request_end(&mut self, function: &str, _t: f64) -> Result<()> {
        let f = self.get(function)?;
        if f.inflight == 0 {
            bail!("request_end for `{function}` without a matching request_begin");
        }
        f.inflight -= 1;
        Ok(())
    }

    /// A runtime reports that `function`'s model is (not) resident, e.g. after acting on a hint
    /// or after an eviction.
    pub fn set_loaded(&mut self, function: &str, loaded: bool) -> Result<()> {
        self.get(function)?.loaded = loaded;
        Ok(())
    }

    /// Start of `minute`: closes every earlier minute, asks each policy, updates the believed
    /// residency and returns the hints (functions neither resident nor wanted get none).
    /// Minutes must not go backwards.
    pub fn tick(&mut self, minute: u64) -> Result<Vec<Hint>> {
        if let Some(prev) = self.minute {
            if minute < prev {
                bail!("tick for minute {minute} after minute {prev}");
            }
        }
        self.minute = Some(minute);
        let mut hints = Vec::new();
        for (name, f) in &mut self.fns {
            Self::roll(f, minute);
            let want = f.policy.want_warm(minute, f.loaded);
            // Never unload under a running request.
            let want = want || f.inflight > 0 && f.loaded;
            f.hint = Action::from_state(f.loaded, want).map(|action| Hint {
                function: name.clone(),
                action,
                forecast: f.policy.last_forecast(),
            });
            hints.extend(f.hint.clone());
            f.loaded = want;
        }
        Ok(hints)
    }

    /// The hint the last [`tick`](Self::tick) gave `function` (what a runtime polls between
    /// ticks); `None` when it is neither resident nor wanted, or not registered.
    pub fn hint(&self, function: &str) -> Option<&Hint> {
        self.fns.get(function).and_then(|f| f.hint.as_ref())
    }

    /// GPU memory held by models believed resident, bytes.
    pub fn warm_memory_bytes(&self) -> u64 {
        self.fns
            .values()
            .filter(|f| f.loaded)
            .map(|f| f.mem_bytes)
            .sum()
    }

    /// Per-function status.
    pub fn status(&self) -> Vec<FunctionStatus> {
        self.fns
            .iter()
            .map(|(n, f)| FunctionStatus {
                function: n.clone(),
                loaded: f.loaded,
                inflight: f.inflight,
                cold: f.cold,
                total: f.total,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_keep_alive_online() {
        let mut m = PrewarmManager::new(PolicySpec::Fixed(2), PolicySettings::default()).unwrap();
        m.register("a", 100);
        m.register("b", 50);
        assert!(m.tick(0).unwrap().is_empty());
        assert!(!m.request_begin("a", 10.0).unwrap());
        assert!(m.request_begin("a", 20.0).unwrap());
        m.request_end("a", 10.5).unwrap();
        m.request_end("a", 20.5).unwrap();
        assert_eq!(m.warm_memory_bytes(), 100);
        // Minutes 1, 2: kept (idle 0, 1 < 2); minute 3: unload.
        let h = m.tick(1).unwrap();
        assert_eq!(
            h,
            vec![Hint {
                function: "a".into(),
                action: Action::Keep,
                forecast: None
            }]
        );
        assert_eq!(m.tick(2).unwrap()[0].action, Action::Keep);
        assert_eq!(m.tick(3).unwrap()[0].action, Action::Unload);
        assert_eq!(m.hint("a").map(|h| h.action), Some(Action::Unload));
        assert_eq!(m.hint("b"), None);
        assert_eq!(m.warm_memory_bytes(), 0);
        assert!(m.tick(4).unwrap().is_empty());
        let s = m.status();
        assert_eq!((s[0].cold, s[0].total), (1, 2));
    }

    #[test]
    fn no_unload_under_running_request() {
        let mut m = PrewarmManager::new(PolicySpec::Fixed(1), PolicySettings::default()).unwrap();
        m.register("a", 1);
        m.request_begin("a", 5.0).unwrap();
        m.tick(1).unwrap();
        // Still running at minute 3: policy would unload, the manager keeps it.
        assert_eq!(m.tick(3).unwrap()[0].action, Action::Keep);
        m.request_end("a", 190.0).unwrap();
        assert_eq!(m.tick(4).unwrap()[0].action, Action::Unload);
    }

    #[test]
    fn bad_calls_are_errors() {
        let mut m = PrewarmManager::new(PolicySpec::Hhp, PolicySettings::default()).unwrap();
        assert!(m
            .request_begin("nope", 1.0)
            .unwrap_err()
            .to_string()
            .contains("nope"));
        m.register("a", 1);
        assert!(m.request_end("a", 1.0).is_err());
        assert!(m.request_begin("a", f64::NAN).is_err());
        m.tick(5).unwrap();
        assert!(m.tick(4).is_err());
        assert!(m.request_begin("a", 10.0).is_err());
        assert!(PrewarmManager::new(PolicySpec::Oracle, PolicySettings::default()).is_err());
    }
}
