//! Live reconfiguration (SIGHUP): which config keys the running node takes over and how.
//!
//! Owns: the list of keys that change live ([`LIVE_KEYS`]), applying them to the state (θ_train
//! into every GPU's harvest ledger and the policy, the watchdog action, the prewarm policy,
//! harvest, deferral and turns on/off, the context-switch charge and the timing-noise allowance into every function's page), and building the prewarm manager from its config string (one
//! implementation for start and reload).
//!
//! Must never: half-apply a config (the caller validates the whole file first: a file that does
//! not parse changes nothing), or silently ignore a changed key that needs a restart (they are
//! returned so the daemon logs them).

use super::{Prewarm, State};
use crate::config::Config;
use crate::policy::Policy;

/// Config keys (as serialized) a running arbiter takes over on SIGHUP. Everything else — the
/// socket, the state directory, the GPUs, the policy kind and its model … — is fixed at start.
pub const LIVE_KEYS: [&str; 8] = [
    "theta_train",
    "watchdog_action",
    "prewarm_policy",
    "harvest",
    "defer",
    "turns",
    "context_switch_ns",
    "timing_noise",
];

/// What a reload did.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ReloadOutcome {
    /// Live keys whose value changed, as `key: old -> new`.
    pub applied: Vec<String>,
    /// Keys whose value changed in the file but take effect only after a restart.
    pub need_restart: Vec<String>,
}

/// The keys whose serialized value differs between `a` and `b` (`source` excluded).
pub fn changed_keys(a: &Config, b: &Config) -> Vec<(String, serde_json::Value, serde_json::Value)> {
    let (serde_json::Value::Object(a), serde_json::Value::Object(b)) = (
        serde_json::to_value(a).unwrap_or_default(),
        serde_json::to_value(b).unwrap_or_default(),
    ) else {
        return Vec::new();
    };
    a.iter()
        .filter(|(k, _)| k.as_str() != "source")
        .filter_map(|(k, va)| {
            let vb = b.get(k).cloned().unwrap_or_default();
            (*va != vb).then(|| (k.clone(), va.clone(), vb))
        })
        .collect()
}

impl Prewarm {
    /// The prewarm manager a config string names (`"off"`, or a policy spec such as `"hhp"`).
    pub(super) fn from_policy(policy: &str) -> Prewarm {
        if policy == "off" {
            return Prewarm::Off;
        }
        match smore_prewarm::policy::PolicySpec::parse(policy).and_then(|spec| {
            smore_prewarm::PrewarmManager::new(
                spec,
                smore_prewarm::policy::PolicySettings::default(),
            )
        }) {
            Ok(m) => Prewarm::On(Box::new(m)),
            Err(e) => Prewarm::Failed(format!(
                "prewarm policy {policy:?} failed to start: {e:#}; no pre-warm hints until the config names a working policy (or \"off\")"
            )),
        }
    }
}

impl State {
    /// Takes over the live keys of `new` (see [`LIVE_KEYS`]). `base` is the config the restart-only
    /// keys are compared against (the file as it was loaded at start, so command-line overrides
    /// of the socket or state directory are not reported as changes). `policy` is the policy
    /// rebuilt from the merged config (needed when θ_train changed: the SMORE policy holds it).
    pub fn reload(
        &mut self,
        base: &Config,
        new: &Config,
        policy: impl FnOnce(&Config) -> anyhow::Result<Box<dyn Policy>>,
    ) -> anyhow::Result<ReloadOutcome> {
        let mut out = ReloadOutcome {
            need_restart: changed_keys(base, new)
                .into_iter()
                .filter(|(k, _, _)| !LIVE_KEYS.contains(&k.as_str()))
                .map(|(k, a, b)| format!("{k}: {a} -> {b}"))
                .collect(),
            ..ReloadOutcome::default()
        };
        let mut merged = self.cfg.clone();
        merged.theta_train = new.theta_train;
        merged.watchdog_action = new.watchdog_action;
        merged.prewarm_policy = new.prewarm_policy.clone();
        merged.harvest = new.harvest;
        // Deferral follows at the next admission (a latest start already written lapses within
        // the request's SLO).
        merged.defer = new.defer;
        // Turns follow at once (the boards' `enabled` words).
        merged.turns = new.turns;
        merged.context_switch_ns = new.context_switch_ns;
        merged.timing_noise = new.timing_noise;
        let changes = changed_keys(&self.cfg, &merged);
        if changes.is_empty() {
            return Ok(out);
        }
        if merged.theta_train != self.cfg.theta_train {
            // Build first: a policy that fails to build leaves the running one (and θ) in place.
            self.policy = policy(&merged)?;
            for g in &mut self.gpus {
                g.harvest.set_theta(merged.theta_train);
            }
        }
        if merged.prewarm_policy != self.cfg.prewarm_policy {
            self.prewarm = Prewarm::from_policy(&merged.prewarm_policy);
        }
        out.applied = changes
            .into_iter()
            .map(|(k, a, b)| format!("{k}: {a} -> {b}"))
            .collect();
        // The switch charge and the timing noise go into every function's page now, not at the
        // next budget split.
        let switch_changed = merged.context_switch_ns != self.cfg.context_switch_ns
            || merged.timing_noise != self.cfg.timing_noise;
        self.cfg = merged;
        self.set_turns();
        if switch_changed {
            let gpus: Vec<u32> = self.gpus.iter().map(|g| g.info.index).collect();
            for gpu in gpus {
                self.reshare(gpu);
            }
        }
        Ok(out)
    }
}
