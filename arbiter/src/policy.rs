//! The policy seam: where placement, sizing and request admission are decided.
//!
//! The arbiter's state machine (`state`) owns facts — GPUs, training processes, grants — and asks
//! a [`Policy`] only for decisions over a read-only [`NodeView`]. Policies never touch pages,
//! sockets or NVML, so they are unit-testable and swappable (`[policy] name` in the config):
//! [`FitPolicy`] here; SMORE's degradation-aware policy (predictor crate) behind the same trait.

use crate::config::Config;
use smore_protocol::wire::RefuseCode;

/// A grant as policies see it.
///
/// Serialized into the status snapshot (`gpus[].policy_view`) so that a cluster-side caller (the
/// Kubernetes scheduler extender, docs/kubernetes.md) rebuilds exactly the view this node's
/// policy decides on.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct GrantView {
    /// Instance id.
    pub instance: u64,
    /// Model id.
    pub model: String,
    /// Latency SLO, ms.
    pub slo_ms: f64,
    /// Memory cap, bytes.
    pub cap: u64,
    /// SM share, percent.
    pub share: u32,
    /// A share an operator fixed with `smore share`; policies must keep it.
    pub share_override: Option<u32>,
}

/// A GPU as policies see it (also published as `gpus[].policy_view` of the status snapshot).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct GpuView {
    /// NVML index.
    pub index: u32,
    /// Memory capacity, bytes.
    pub total: u64,
    /// Memory NVML attributes to training (unregistered) processes, bytes.
    pub training_used: u64,
    /// Memory reserved for training: its processes' high-water marks plus the configured
    /// headroom (docs/arbiter.md, "Memory headroom and reclaim"), at least `training_used`,
    /// bytes. Admission counts this, not the current use. (Absent from an older arbiter's
    /// snapshot: 0, and `training_used` alone counts.)
    #[serde(default)]
    pub training_reserved: u64,
    /// Seconds admission onto this GPU stays held: memory was reclaimed from functions and
    /// training has not been stable long enough since (None: open).
    #[serde(default)]
    pub admission_hold_s: Option<f64>,
    /// Whether any training process runs on the GPU.
    pub has_training: bool,
    /// Training's GPU utilization when running alone (fraction 0..=1), if observed.
    pub training_solo_util: Option<f64>,
    /// Multiplier (≥ 1) on the worst-case time budget, raised by the arbiter's feedback loop
    /// while the training slowdown it observes stays well under θ_train (see [`crate::budget::TimeBudget`]).
    pub budget_boost: f64,
    /// The grants placed on it.
    pub grants: Vec<GrantView>,
}

impl GpuView {
    /// The functions' total time budget on this GPU: the worst-case θ/(u+θ), times the boost.
    pub fn time_budget(&self, cfg: &Config) -> f64 {
        crate::budget::TimeBudget::total(
            self.budget_boost,
            self.training_solo_util,
            cfg.theta_train,
        )
    }
}

impl GpuView {
    /// σ·capacity − training's reservation (high-water mark + headroom) − every grant's cap:
    /// what a new grant may take, bytes; 0 while admission is held after a reclaim.
    pub fn free_for_functions(&self, sigma: f64) -> u64 {
        if self.admission_hold_s.is_some() {
            return 0;
        }
        self.room_for_grants(sigma)
    }

    /// σ·capacity − training's reservation − every grant's cap, ignoring any hold, bytes.
    pub fn room_for_grants(&self, sigma: f64) -> u64 {
        let budget = (self.total as f64 * sigma) as u64;
        let granted: u64 = self.grants.iter().map(|g| g.cap).sum();
        budget
            .saturating_sub(self.training_used.max(self.training_reserved))
            .saturating_sub(granted)
    }
}

/// What a registration asks for (defaults already applied).
#[derive(Debug, Clone)]
pub struct Ask {
    /// Function name.
    pub function: String,
    /// Model id (`unknown` when not declared).
    pub model: String,
    /// Latency SLO, ms.
    pub slo_ms: f64,
    /// Memory asked for, bytes.
    pub memory: u64,
    /// The GPU the instance already runs on (re-registration): keep it if it fits.
    pub prefer_gpu: Option<u32>,
}

/// A placement decision.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Place the instance.
    Admit {
        /// On this GPU (NVML index).
        gpu: u32,
        /// With this memory cap, bytes.
        cap: u64,
        /// Predicted training slowdown (fraction), if predicted.
        predicted_train: Option<f64>,
        /// Predicted function degradation (fraction), if predicted.
        predicted_fn: Option<f64>,
        /// The rule that admitted it (shown by `status`).
        rule: String,
    },
    /// Refuse the registration.
    Refuse {
        /// The class of refusal.
        code: RefuseCode,
        /// Why, for a person.
        reason: String,
    },
}

/// Request-level admission (SMORE style).
#[derive(Debug, Clone, PartialEq)]
pub struct Admission {
    /// Whether the request may run now.
    pub admitted: bool,
    /// Predicted training slowdown (fraction), if predicted.
    pub predicted_train: Option<f64>,
    /// Predicted function degradation (fraction), if predicted.
    pub predicted_fn: Option<f64>,
    /// The rule behind the decision.
    pub reason: String,
}

/// A placement/sizing policy.
pub trait Policy: Send {
    /// The policy's name (config and status).
    fn name(&self) -> &'static str;
    /// Where (and with what cap) to place a new instance.
    fn place(&mut self, cfg: &Config, gpus: &[GpuView], ask: &Ask) -> Decision;
    /// SM shares of every grant on `gpu` (instance, share %). Must keep overrides.
    fn shares(&mut self, cfg: &Config, gpu: &GpuView) -> Vec<(u64, u32)>;
    /// May one more request of `instance` run now?
    fn admit_request(&mut self, _cfg: &Config, _gpu: &GpuView, _instance: u64) -> Admission {
        Admission {
            admitted: true,
            predicted_train: None,
            predicted_fn: None,
            reason: format!("policy {} does not gate requests", self.name()),
        }
    }
    /// Observed degradation feedback (training slowdown, function latency) for online learning.
    fn observe(
        &mut self,
        _gpu: &GpuView,
        _train_slowdown: Option<f64>,
        _fn_latency: &[(u64, f64)],
    ) {
    }
}

/// The refusals every policy makes before deciding anything: no GPU, or a request for nothing.
pub fn refuse_impossible(gpus: &[GpuView], ask: &Ask) -> Option<Decision> {
    if gpus.is_empty() {
        return Some(Decision::Refuse {
            code: RefuseCode::NoGpu,
            reason: "the arbiter manages no GPU on this node".into(),
        });
    }
    if ask.memory == 0 {
        return Some(Decision::Refuse {
            code: RefuseCode::Invalid,
            reason: "memory need of 0 bytes".into(),
        });
    }
    None
}

pub use crate::budget::function_time_budget;

/// Predicted training slowdown (fraction) when functions take `shares` (fraction sum) of the time
/// on a GPU whose training is busy `u` alone: D = u·S/(1−S), the same model inverted.
pub fn predicted_training_slowdown(solo_util: f64, shares: f64) -> f64 {
    let u = solo_util.clamp(0.0, 1.0);
    let s = shares.clamp(0.0, 0.99);
    u * s / (1.0 - s)
}

/// The issue-4 policy: memory fit under σ, least-loaded GPU, time share split under θ_train.
#[derive(Debug, Default)]
pub struct FitPolicy;

impl FitPolicy {
    /// Training's busy fraction when solo; unknown ⇒ assume fully busy (the safe side).
    fn solo(g: &GpuView) -> f64 {
        g.training_solo_util.unwrap_or(1.0)
    }
}

impl Policy for FitPolicy {
    fn name(&self) -> &'static str {
        "fit"
    }

    fn place(&mut self, cfg: &Config, gpus: &[GpuView], ask: &Ask) -> Decision {
        if let Some(refusal) = refuse_impossible(gpus, ask) {
            return refusal;
        }
        // Time: one more function at `min_share` must still fit the training budget, else every
        // function's floor together would push training past θ_train.
        let time_ok = |g: &GpuView| {
            !g.has_training
                || (g.grants.len() + 1) as f64 * cfg.min_share as f64 / 100.0
                    // The worst-case budget (no boost): floors must hold even if the boost goes.
                    <= function_time_budget(Self::solo(g), cfg.theta_train) + 1e-9
        };
        let fits =
            |g: &&GpuView| ask.memory <= g.free_for_functions(cfg.memory_safety) && time_ok(g);
        let chosen = ask
            .prefer_gpu
            .and_then(|p| gpus.iter().find(|g| g.index == p).filter(fits))
            .or_else(|| {
                gpus.iter().filter(fits).min_by_key(|g| {
                    (
                        g.grants.len(),
                        u64::MAX - g.free_for_functions(cfg.memory_safety),
                    )
                })
            });
        let Some(g) = chosen else {
            let memory_ok: Vec<&GpuView> = gpus
                .iter()
                .filter(|g| ask.memory <= g.free_for_functions(cfg.memory_safety))
                .collect();
            if !memory_ok.is_empty() {
                return Decision::Refuse {
                    code: RefuseCode::TrainingBound,
                    reason: format!(
                        "every GPU with the memory already holds as many functions as θ_train = {} allows at the {} % minimum share (budget θ/(u+θ) of the training job's time)",
                        cfg.theta_train, cfg.min_share
                    ),
                };
            }
            let best = gpus
                .iter()
                .map(|g| g.free_for_functions(cfg.memory_safety))
                .max()
                .unwrap_or(0);
            return Decision::Refuse {
                code: RefuseCode::NoMemory,
                reason: format!(
                    "no GPU has {} free for functions (largest: {} after σ = {}, training use and other grants)",
                    smore_protocol::size::format_size(ask.memory),
                    smore_protocol::size::format_size(best),
                    cfg.memory_safety
                ),
            };
        };
        let n = g.grants.len() + 1;
        let per = if g.has_training {
            g.time_budget(cfg) / n as f64
        } else {
            1.0
        };
        let predicted = g.has_training.then(|| {
            predicted_training_slowdown(
                Self::solo(g),
                (per * n as f64).max(cfg.min_share as f64 / 100.0 * n as f64),
            )
        });
        Decision::Admit {
            gpu: g.index,
            cap: ask.memory,
            predicted_train: predicted,
            predicted_fn: None,
            rule: format!(
                "fit: {} ≤ free {} on GPU {} (least loaded: {} function(s) before)",
                smore_protocol::size::format_size(ask.memory),
                smore_protocol::size::format_size(g.free_for_functions(cfg.memory_safety)),
                g.index,
                g.grants.len()
            ),
        }
    }

    fn shares(&mut self, cfg: &Config, g: &GpuView) -> Vec<(u64, u32)> {
        if !g.has_training {
            return g
                .grants
                .iter()
                .map(|x| (x.instance, x.share_override.unwrap_or(100)))
                .collect();
        }
        let budget = g.time_budget(cfg);
        let fixed: f64 = g
            .grants
            .iter()
            .filter_map(|x| x.share_override)
            .map(|s| s as f64 / 100.0)
            .sum();
        let free_n = g
            .grants
            .iter()
            .filter(|x| x.share_override.is_none())
            .count();
        let per = if free_n > 0 {
            ((budget - fixed).max(0.0) / free_n as f64 * 100.0).floor() as u32
        } else {
            0
        };
        let per = per.clamp(cfg.min_share, 100);
        g.grants
            .iter()
            .map(|x| (x.instance, x.share_override.unwrap_or(per)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32, total: u64, training_used: u64, grants: usize) -> GpuView {
        GpuView {
            index,
            total,
            training_used,
            training_reserved: training_used,
            admission_hold_s: None,
            has_training: training_used > 0,
            training_solo_util: Some(0.6),
            budget_boost: 1.0,
            grants: (0..grants)
                .map(|i| GrantView {
                    instance: 100 + i as u64,
                    model: "m".into(),
                    slo_ms: 10.0,
                    cap: 1 << 30,
                    share: 10,
                    share_override: None,
                })
                .collect(),
        }
    }

    fn ask(mem: u64) -> Ask {
        Ask {
            function: "f".into(),
            model: "m".into(),
            slo_ms: 50.0,
            memory: mem,
            prefer_gpu: None,
        }
    }

    #[test]
    fn memory_fit_respects_sigma_training_and_grants() {
        let cfg = Config::default();
        // 10 GiB GPU: σ·10 = 9.5 GiB; training 6 GiB; one grant 1 GiB ⇒ 2.5 GiB free.
        let g = gpu(0, 10 << 30, 6 << 30, 1);
        assert_eq!(
            g.free_for_functions(0.95),
            (9.5 * (1u64 << 30) as f64) as u64 - (7 << 30)
        );
        let mut p = FitPolicy;
        assert!(matches!(
            p.place(&cfg, std::slice::from_ref(&g), &ask(2 << 30)),
            Decision::Admit { gpu: 0, .. }
        ));
        match p.place(&cfg, &[g], &ask(3 << 30)) {
            Decision::Refuse { code, reason } => {
                assert_eq!(code, RefuseCode::NoMemory);
                assert!(reason.contains("2.50GiB"), "{reason}");
            }
            d => panic!("{d:?}"),
        }
    }

    #[test]
    fn least_loaded_gpu_wins_and_preference_is_kept() {
        let cfg = Config::default();
        let gpus = [gpu(0, 40 << 30, 1 << 30, 1), gpu(1, 40 << 30, 1 << 30, 0)];
        let mut p = FitPolicy;
        assert!(matches!(
            p.place(&cfg, &gpus, &ask(1 << 30)),
            Decision::Admit { gpu: 1, .. }
        ));
        let mut a = ask(1 << 30);
        a.prefer_gpu = Some(0);
        assert!(matches!(
            p.place(&cfg, &gpus, &a),
            Decision::Admit { gpu: 0, .. }
        ));
    }

    #[test]
    fn shares_split_the_budget_under_theta_and_keep_overrides() {
        let cfg = Config::default();
        let mut g = gpu(0, 40 << 30, 1 << 30, 2);
        // u = 0.6, θ = 0.1: budget = 0.1/0.7 = 0.1428… ⇒ 7 % each.
        let s = FitPolicy.shares(&cfg, &g);
        assert_eq!(s, vec![(100, 7), (101, 7)]);
        // An override of 13 % leaves 1 % for the other, raised to min_share (2 %).
        g.grants[0].share_override = Some(13);
        let s = FitPolicy.shares(&cfg, &g);
        assert_eq!(s, vec![(100, 13), (101, 2)]);
        // No training: functions run unthrottled.
        let g = gpu(0, 40 << 30, 0, 2);
        assert_eq!(FitPolicy.shares(&cfg, &g), vec![(100, 100), (101, 100)]);
    }

    #[test]
    fn functions_beyond_the_time_budget_are_refused_for_training() {
        let cfg = Config::default();
        // u = 0.6: budget 0.1/0.7 = 14.3 % ⇒ seven functions at the 2 % floor fit, an eighth not.
        let mut p = FitPolicy;
        assert!(matches!(
            p.place(&cfg, &[gpu(0, 40 << 30, 1 << 30, 6)], &ask(1 << 20)),
            Decision::Admit { .. }
        ));
        match p.place(&cfg, &[gpu(0, 40 << 30, 1 << 30, 7)], &ask(1 << 20)) {
            Decision::Refuse { code, .. } => assert_eq!(code, RefuseCode::TrainingBound),
            d => panic!("{d:?}"),
        }
        // Without training there is no time bound.
        assert!(matches!(
            p.place(&cfg, &[gpu(0, 40 << 30, 0, 6)], &ask(1 << 20)),
            Decision::Admit { .. }
        ));
    }

    #[test]
    fn the_time_budget_holds_training_to_theta() {
        for u in [0.2, 0.5, 0.9, 1.0] {
            let b = function_time_budget(u, 0.1);
            let d = predicted_training_slowdown(u, b);
            assert!((d - 0.1).abs() < 1e-9, "u={u} d={d}");
        }
        assert_eq!(function_time_budget(0.0, 0.1), 1.0);
        assert_eq!(predicted_training_slowdown(0.0, 0.5), 0.0);
    }
}
