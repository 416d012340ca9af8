//! SMORE's Long-Short LSTM forecaster (LS-LSTM, TPDS'25 §VI), on candle (CPU).
//!
//! Owns: [`LstmNet`], a one-layer LSTM + linear head mapping a z-scored window of the last `n`
//! per-minute counts to the next minute's count, trained with candle's autograd and AdamW; and
//! [`LsLstm`], the [`Forecaster`] that combines a long-term net (trained on days of history,
//! retrained on a sliding window) and a short-term net (trained on the last hour) as
//! `r̂ = α·r̂_L + (1−α)·r̂_S`, with the erratic-series rule for α below.
//!
//! **α rule.** Both nets' absolute one-step errors over the last [`LsLstmConfig::alpha_window`]
//! minutes are tracked (`E_L`, `E_S`, means). The recent series is *erratic* when the long-term
//! model — which encodes the function's usual pattern — explains it worse than the short-term model
//! does (`E_L > E_S`): then `α = max(α_min, α₀·E_S/E_L)`, lowered from SMORE's α₀ = 0.5 in
//! proportion to how much worse the long model is, floored at α_min = 0.1. When the long model is
//! the better one (`E_L < E_S`, a *regular* series) α is raised symmetrically,
//! `α = min(α_max, α₀·E_S/E_L)`, α_max = 0.9 (set `alpha_max = alpha` for the strictly
//! lower-only rule). With fewer than [`LsLstmConfig::alpha_min_samples`] tracked minutes, α = α₀.
//! See [`alpha_rule`]. Why raise at all: a timer firing every 30 minutes leaves the 12-minute
//! short window idle before each call, so the short net says 0 and a fixed α = 0.5 halves the
//! long net's correct forecast of 1 down to the load threshold (measured on the suite: cold
//! starts on timers 9 % with the lower-only rule, 0 % with this one; docs/prewarm.md).
//!
//! **Short window idle.** When none of the short window's minutes had a request (or the short net
//! never saw an active hour), `r̂_S = 0`.
//!
//! **Input layout.** The window of `n` minutes is fed as `n/chunk` LSTM steps of `chunk` minutes
//! each (chunk = 1 is the plain one-value-per-step layout). Chunking the 64-minute long-term window
//! into 16 steps of 4 keeps the forward/backward graph 4× shorter, which is what makes a replay of
//! the synthetic suite fit in minutes on 2 CPU cores; every minute of the window is still an input.
//!
//! Must never: write gradients by hand (candle's autograd does it), or train on minutes not yet
//! observed.

use std::collections::VecDeque;

use anyhow::{ensure, Context, Result};
use candle_core::{DType, Device, Tensor, D};
use candle_nn::rnn::{LSTMConfig, LSTM, RNN};
use candle_nn::{AdamW, Linear, Module, Optimizer, ParamsAdamW, VarBuilder, VarMap};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::forecast::Forecaster;

/// Shape and training hyper-parameters of one LSTM.
#[derive(Debug, Clone, PartialEq)]
pub struct LstmConfig {
    /// Input window `n` in minutes.
    pub window: usize,
    /// Minutes per LSTM step (`window` must be a multiple).
    pub chunk: usize,
    /// Hidden units.
    pub hidden: usize,
    /// AdamW learning rate.
    pub lr: f64,
    /// Mini-batch size (all samples when fewer).
    pub batch: usize,
    /// Seed for the initial weights and the mini-batch sampling.
    pub seed: u64,
}

/// A one-layer LSTM regressor on z-scored per-minute counts.
pub struct LstmNet {
    cfg: LstmConfig,
    varmap: VarMap,
    lstm: LSTM,
    head: Linear,
    opt: AdamW,
    rng: StdRng,
    mean: f32,
    std: f32,
    /// Output (in counts) for an all-zero raw window; cached after each training run.
    zero_out: f32,
    trained: bool,
}

impl std::fmt::Debug for LstmNet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LstmNet")
            .field("cfg", &self.cfg)
            .field("mean", &self.mean)
            .field("std", &self.std)
            .field("trained", &self.trained)
            .finish()
    }
}

impl LstmNet {
    /// A fresh, untrained net with seeded initial weights.
    pub fn new(cfg: LstmConfig) -> Result<Self> {
        ensure!(
            cfg.window > 0 && cfg.chunk > 0 && cfg.window.is_multiple_of(cfg.chunk),
            "LSTM window ({}) must be a positive multiple of chunk ({})",
            cfg.window,
            cfg.chunk
        );
        ensure!(
            cfg.hidden > 0 && cfg.batch > 0,
            "LSTM hidden and batch must be > 0"
        );
        let dev = Device::Cpu;
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
        let lstm =
            candle_nn::rnn::lstm(cfg.chunk, cfg.hidden, LSTMConfig::default(), vb.pp("lstm"))?;
        let head = candle_nn::linear(cfg.hidden, 1, vb.pp("head"))?;
        // Re-initialise every variable from our own seeded RNG (candle's CPU RNG cannot be seeded),
        // uniform in ±1/√hidden like PyTorch's LSTM default, in name order for determinism.
        let mut rng = StdRng::seed_from_u64(cfg.seed);
        {
            let data = varmap
                .data()
                .lock()
                .map_err(|_| anyhow::anyhow!("varmap lock poisoned"))?;
            let mut names: Vec<&String> = data.keys().collect();
            names.sort();
            let k = 1.0 / (cfg.hidden as f32).sqrt();
            for name in names {
                let var = &data[name];
                let n = var.elem_count();
                let vals: Vec<f32> = (0..n).map(|_| rng.gen_range(-k..k)).collect();
                var.set(&Tensor::from_vec(vals, var.shape(), &dev)?)?;
            }
        }
        let opt = AdamW::new(
            varmap.all_vars(),
            ParamsAdamW {
                lr: cfg.lr,
                weight_decay: 0.0,
                ..Default::default()
            },
        )?;
        Ok(Self {
            cfg,
            varmap,
            lstm,
            head,
            opt,
            rng,
            mean: 0.0,
            std: 1.0,
            zero_out: 0.0,
            trained: false,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &LstmConfig {
        &self.cfg
    }

    /// Whether [`train`](Self::train) has run at least once.
    pub fn is_trained(&self) -> bool {
        self.trained
    }

    /// Number of trainable parameters.
    pub fn parameters(&self) -> usize {
        self.varmap.all_vars().iter().map(|v| v.elem_count()).sum()
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let states = self.lstm.seq(x)?;
        let last = states.last().context("empty LSTM input")?;
        Ok(self.head.forward(last.h())?.squeeze(D::Minus1)?)
    }

    fn z(&self, v: f32) -> f32 {
        (v - self.mean) / self.std
    }

    fn inputs_tensor(&self, flat: Vec<f32>, batch: usize) -> Result<Tensor> {
        let steps = self.cfg.window / self.cfg.chunk;
        Ok(Tensor::from_vec(
            flat,
            (batch, steps, self.cfg.chunk),
            &Device::Cpu,
        )?)
    }

    /// Sets the z-score statistics from a training series (std floored at 1e-3 so a constant
    /// series does not divide by zero).
    fn set_normalization(&mut self, series: &[f32]) {
        let n = series.len().max(1) as f32;
        let mean = series.iter().sum::<f32>() / n;
        let var = series.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / n;
        self.mean = mean;
        self.std = var.sqrt().max(1e-3);
    }

    /// Mean squared error (z-space) of one-step forecasts over every window of `series`.
    pub fn loss_on(&self, series: &[f32]) -> Result<f32> {
        let n = self.cfg.window;
        ensure!(series.len() > n, "series shorter than the window");
        let samples = series.len() - n;
        let mut xs = Vec::with_capacity(samples * n);
        let mut ys = Vec::with_capacity(samples);
        for i in n..series.len() {
            xs.extend(series[i - n..i].iter().map(|&v| self.z(v)));
            ys.push(self.z(series[i]));
        }
        let x = self.inputs_tensor(xs, samples)?;
        let y = Tensor::from_vec(ys, samples, &Device::Cpu)?;
        let pred = self.forward(&x)?;
        Ok(candle_nn::loss::mse(&pred, &y)?.to_scalar::<f32>()?)
    }

    /// Trains (or, when already trained, fine-tunes from the current weights) on every
    /// `window → next minute` pair of `series` for `steps` AdamW steps on random mini-batches.
    /// The z-score statistics are recomputed from `series` first. Returns the loss of each step.
    pub fn train(&mut self, series: &[f32], steps: usize) -> Result<Vec<f32>> {
        let n = self.cfg.window;
        ensure!(
            series.len() > n,
            "training series of {} minutes is not longer than the {n}-minute window",
            series.len()
        );
        self.set_normalization(series);
        let samples = series.len() - n;
        let batch = self.cfg.batch.min(samples);
        let mut losses = Vec::with_capacity(steps);
        for _ in 0..steps {
            let mut xs = Vec::with_capacity(batch * n);
            let mut ys = Vec::with_capacity(batch);
            for b in 0..batch {
                let i = if batch == samples {
                    n + b
                } else {
                    n + self.rng.gen_range(0..samples)
                };
                xs.extend(series[i - n..i].iter().map(|&v| (v - self.mean) / self.std));
                ys.push((series[i] - self.mean) / self.std);
            }
            let x = self.inputs_tensor(xs, batch)?;
            let y = Tensor::from_vec(ys, batch, &Device::Cpu)?;
            let pred = self.forward(&x)?;
            let loss = candle_nn::loss::mse(&pred, &y)?;
            self.opt.backward_step(&loss)?;
            losses.push(loss.to_scalar::<f32>()?);
        }
        self.trained = true;
        self.zero_out = self.predict_uncached(&vec![0.0; n])?;
        Ok(losses)
    }

    fn predict_uncached(&self, window: &[f32]) -> Result<f32> {
        let xs: Vec<f32> = window.iter().map(|&v| self.z(v)).collect();
        let x = self.inputs_tensor(xs, 1)?;
        let z = self.forward(&x)?.to_vec1::<f32>()?[0];
        Ok((self.mean + self.std * z).max(0.0))
    }

    /// Forecast (in requests) for the minute after `window` (the last `n` raw counts, oldest
    /// first). All-zero windows are answered from a cache filled at training time.
    pub fn predict(&self, window: &[f32]) -> Result<f32> {
        ensure!(
            window.len() == self.cfg.window,
            "window has {} minutes, the net takes {}",
            window.len(),
            self.cfg.window
        );
        if window.iter().all(|&v| v == 0.0) {
            return Ok(self.zero_out);
        }
        self.predict_uncached(window)
    }
}

/// LS-LSTM configuration. Defaults are sized so the synthetic suite replays in minutes on 2 CPU
/// cores (measured, docs/prewarm.md).
#[derive(Debug, Clone, PartialEq)]
pub struct LsLstmConfig {
    /// Long-term net.
    pub long: LstmConfig,
    /// Short-term net.
    pub short: LstmConfig,
    /// Minutes of history the long-term net trains on (sliding window). SMORE: "e.g. 1 d"; we use
    /// up to 2 days so a daily pattern is seen twice.
    pub long_history: usize,
    /// Minutes of history before the long-term net is first trained.
    pub long_min_history: usize,
    /// Retraining period of the long-term net, minutes ("retrain … in a fixed time interval").
    pub long_retrain_every: usize,
    /// AdamW steps of the first long-term training.
    pub long_steps_initial: usize,
    /// AdamW steps of each long-term fine-tuning.
    pub long_steps_retrain: usize,
    /// Minutes the short-term net trains on (SMORE: "the last short (e.g., 1 h)").
    pub short_history: usize,
    /// Retraining period of the short-term net, minutes.
    pub short_retrain_every: usize,
    /// AdamW steps of the first short-term training.
    pub short_steps_initial: usize,
    /// AdamW steps of each short-term fine-tuning.
    pub short_steps_retrain: usize,
    /// α₀, SMORE's default weight of the long-term forecast (0.5).
    pub alpha: f64,
    /// Floor of α under the erratic rule.
    pub alpha_min: f64,
    /// Ceiling of α when the long-term net is the better one (`alpha_max = alpha`: never raised).
    pub alpha_max: f64,
    /// Minutes of one-step errors the α rule looks at.
    pub alpha_window: usize,
    /// Minutes of tracked errors needed before the α rule departs from α₀.
    pub alpha_min_samples: usize,
}

impl Default for LsLstmConfig {
    fn default() -> Self {
        Self {
            long: LstmConfig {
                // 64 min: covers the longest common timer period (60 min) plus margin.
                window: 64,
                chunk: 4,
                hidden: 24,
                lr: 0.01,
                batch: 64,
                seed: 1,
            },
            short: LstmConfig {
                // 12 min window → 48 training pairs inside the last hour.
                window: 12,
                chunk: 2,
                hidden: 12,
                lr: 0.02,
                batch: 48,
                seed: 2,
            },
            long_history: 2 * 1440,
            long_min_history: 720,
            long_retrain_every: 360,
            // 600 / 150 AdamW steps: on the seed-42 suite, against 250 / 60, bursty waste 51 → 47 %
            // and mixed cold starts 48 → 44 % at about the same replay time (docs/prewarm.md).
            long_steps_initial: 600,
            long_steps_retrain: 150,
            short_history: 60,
            short_retrain_every: 30,
            short_steps_initial: 60,
            short_steps_retrain: 20,
            alpha: 0.5,
            alpha_min: 0.1,
            // Symmetric to α_min: the short-term forecast always keeps ≥ 10 % weight.
            alpha_max: 0.9,
            alpha_window: 60,
            alpha_min_samples: 15,
        }
    }
}

/// The α rule (weight of the long-term forecast), from the two nets' mean absolute one-step
/// errors over the recent window, `e_long` and `e_short`:
/// - *erratic* recent series, `e_long > e_short` (it departs from the long-term pattern):
///   α lowered to `max(α_min, α₀·e_short/e_long)`;
/// - *regular* recent series, `e_long < e_short` (the long-term pattern explains it better than
///   the last hour does, e.g. a timer whose period exceeds the short window): α raised to
///   `min(α_max, α₀·e_short/e_long)`; `α_max = α₀` turns this half off;
/// - equal errors, or non-finite ones: α₀.
pub fn alpha_rule(alpha0: f64, alpha_min: f64, alpha_max: f64, e_long: f64, e_short: f64) -> f64 {
    if !(e_long.is_finite() && e_short.is_finite()) || e_long == e_short {
        return alpha0;
    }
    if e_long > e_short {
        (alpha0 * e_short / e_long).clamp(alpha_min, alpha0)
    } else {
        // e_long < e_short here, so e_short > 0; a perfect long net (e_long = 0) gets α_max.
        (alpha0 * e_short / e_long.max(f64::MIN_POSITIVE)).clamp(alpha0, alpha_max)
    }
}

/// SMORE's LS-LSTM forecaster for one function.
#[derive(Debug)]
pub struct LsLstm {
    cfg: LsLstmConfig,
    long: LstmNet,
    short: LstmNet,
    history: Vec<f32>,
    /// Minute (history length) of the last long / short training.
    long_trained_at: Option<usize>,
    short_trained_at: Option<usize>,
    /// Whether the short net has ever been trained on a non-idle hour.
    short_active: bool,
    pending: Option<(f64, f64)>,
    errors: VecDeque<(f64, f64)>,
    last_alpha: f64,
    last_parts: (f64, f64),
    /// Minutes observed so far (never reset by the history trimming).
    observed: usize,
    /// Every training run: (which net, first minute, end minute) in absolute observed minutes.
    trainings: Vec<Training>,
}

/// Training runs kept by [`LsLstm::trainings`] (the log is trimmed to the newest ones beyond
/// twice this; our choice, enough for tests and diagnostics).
const MAX_TRAINING_LOG: usize = 64;

/// One training run of an LS-LSTM net, in absolute minutes of the observed series.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Training {
    /// `true` for the long-term net, `false` for the short-term one.
    pub long: bool,
    /// First minute of the training series.
    pub from: usize,
    /// One past the last minute of the training series.
    pub to: usize,
    /// AdamW steps.
    pub steps: usize,
}

impl LsLstm {
    /// A fresh forecaster.
    pub fn new(cfg: LsLstmConfig) -> Result<Self> {
        ensure!((0.0..=1.0).contains(&cfg.alpha), "alpha must be in [0, 1]");
        ensure!(
            (0.0..=cfg.alpha).contains(&cfg.alpha_min),
            "alpha_min must be in [0, alpha]"
        );
        ensure!(
            (cfg.alpha..=1.0).contains(&cfg.alpha_max),
            "alpha_max must be in [alpha, 1]"
        );
        ensure!(
            cfg.short_history > cfg.short.window,
            "short_history must exceed the short window"
        );
        ensure!(
            cfg.long_min_history > cfg.long.window,
            "long_min_history must exceed the long window"
        );
        Ok(Self {
            long: LstmNet::new(cfg.long.clone())?,
            short: LstmNet::new(cfg.short.clone())?,
            last_alpha: cfg.alpha,
            cfg,
            history: Vec::new(),
            long_trained_at: None,
            short_trained_at: None,
            short_active: false,
            pending: None,
            errors: VecDeque::new(),
            last_parts: (0.0, 0.0),
            observed: 0,
            trainings: Vec::new(),
        })
    }

    /// α used by the last forecast.
    pub fn last_alpha(&self) -> f64 {
        self.last_alpha
    }

    /// (r̂_L, r̂_S) of the last forecast.
    pub fn last_parts(&self) -> (f64, f64) {
        self.last_parts
    }

    /// Every training run so far, oldest first (the sliding-window retraining schedule).
    pub fn trainings(&self) -> &[Training] {
        &self.trainings
    }

    /// Current α from the tracked errors.
    pub fn current_alpha(&self) -> f64 {
        if self.errors.len() < self.cfg.alpha_min_samples {
            return self.cfg.alpha;
        }
        let n = self.errors.len() as f64;
        let el = self.errors.iter().map(|e| e.0).sum::<f64>() / n;
        let es = self.errors.iter().map(|e| e.1).sum::<f64>() / n;
        alpha_rule(
            self.cfg.alpha,
            self.cfg.alpha_min,
            self.cfg.alpha_max,
            el,
            es,
        )
    }

    fn maybe_retrain(&mut self) -> Result<()> {
        let t = self.history.len();
        let c = &self.cfg;
        if t >= c.long_min_history {
            let due = match self.long_trained_at {
                None => true,
                Some(at) => t - at >= c.long_retrain_every,
            };
            if due {
                // Fine-tuning steps once the net has weights worth keeping, else a full training.
                let steps = if self.long.is_trained() {
                    c.long_steps_retrain
                } else {
                    c.long_steps_initial
                };
                let from = t.saturating_sub(c.long_history);
                let series = &self.history[from..];
                if series.iter().any(|&v| v > 0.0) {
                    self.long.train(series, steps)?;
                    let end = self.observed;
                    self.trainings.push(Training {
                        long: true,
                        from: end - series.len(),
                        to: end,
                        steps,
                    });
                }
                self.long_trained_at = Some(t);
            }
        }
        if t > c.short_history {
            let due = match self.short_trained_at {
                None => true,
                Some(at) => t - at >= c.short_retrain_every,
            };
            if due {
                let series = &self.history[t - c.short_history..];
                // An idle hour teaches nothing: skip (the short forecast of an idle window is 0).
                if series.iter().any(|&v| v > 0.0) {
                    let steps = if self.short_active {
                        c.short_steps_retrain
                    } else {
                        c.short_steps_initial
                    };
                    self.short.train(series, steps)?;
                    self.short_active = true;
                    let end = self.observed;
                    self.trainings.push(Training {
                        long: false,
                        from: end - c.short_history,
                        to: end,
                        steps,
                    });
                }
                self.short_trained_at = Some(t);
            }
        }
        // Keep the schedule log bounded for long-running online use.
        if self.trainings.len() > 2 * MAX_TRAINING_LOG {
            self.trainings.drain(..MAX_TRAINING_LOG);
        }
        Ok(())
    }

    fn net_forecast(net: &LstmNet, history: &[f32]) -> Result<Option<f64>> {
        let n = net.config().window;
        if !net.is_trained() || history.len() < n {
            return Ok(None);
        }
        let w = &history[history.len() - n..];
        Ok(Some(f64::from(net.predict(w)?)))
    }
}

impl Forecaster for LsLstm {
    fn name(&self) -> String {
        "ls-lstm".into()
    }

    fn observe(&mut self, count: u32) {
        if let Some((rl, rs)) = self.pending.take() {
            let c = f64::from(count);
            self.errors.push_back(((rl - c).abs(), (rs - c).abs()));
            while self.errors.len() > self.cfg.alpha_window {
                self.errors.pop_front();
            }
        }
        self.history.push(count as f32);
        self.observed += 1;
        // Bound memory: keep what the long window needs plus one retraining period.
        let keep = self.cfg.long_history + self.cfg.long_retrain_every + self.cfg.long.window;
        if self.history.len() > 2 * keep {
            let drop = self.history.len() - keep;
            self.history.drain(..drop);
            self.long_trained_at = self.long_trained_at.map(|a| a.saturating_sub(drop));
            self.short_trained_at = self.short_trained_at.map(|a| a.saturating_sub(drop));
        }
    }

    fn forecast(&mut self) -> Result<f64> {
        self.maybe_retrain()?;
        let idle_short = self
            .history
            .iter()
            .rev()
            .take(self.cfg.short.window)
            .all(|&v| v == 0.0);
        // An idle short window (or a short net that never saw an active hour) forecasts 0: "no
        // request lately" is the short-term evidence. The α rule decides how much it counts: for
        // a periodic call that returns after a gap longer than the short window the long net is
        // the better one and α rises (see `alpha_rule`).
        let rs = if idle_short || !self.short_active {
            Some(0.0)
        } else {
            Self::net_forecast(&self.short, &self.history)?
        };
        let rl = Self::net_forecast(&self.long, &self.history)?;
        let (r, alpha, parts) = match (rl, rs) {
            (Some(l), Some(s)) => {
                let a = self.current_alpha();
                (a * l + (1.0 - a) * s, a, (l, s))
            }
            (None, Some(s)) => (s, 0.0, (s, s)),
            (Some(l), None) => (l, 1.0, (l, l)),
            (None, None) => {
                let last = f64::from(self.history.last().copied().unwrap_or(0.0));
                (last, self.cfg.alpha, (last, last))
            }
        };
        // Only minutes where both nets forecast feed the α rule's error comparison.
        self.pending = matches!((rl, rs), (Some(_), Some(_))).then_some(parts);
        self.last_alpha = alpha;
        self.last_parts = parts;
        Ok(r.max(0.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alpha_rule_cases() {
        // Equal errors: α₀.
        assert_eq!(alpha_rule(0.5, 0.1, 0.9, 1.0, 1.0), 0.5);
        assert_eq!(alpha_rule(0.5, 0.1, 0.9, 0.0, 0.0), 0.5);
        // Erratic: long model twice as wrong → α halves; floor at α_min.
        assert!((alpha_rule(0.5, 0.1, 0.9, 2.0, 1.0) - 0.25).abs() < 1e-12);
        assert_eq!(alpha_rule(0.5, 0.1, 0.9, 100.0, 1.0), 0.1);
        // Regular: short model 1.6× as wrong → α = 0.8; ceiling at α_max; perfect long → α_max.
        assert!((alpha_rule(0.5, 0.1, 0.9, 1.0, 1.6) - 0.8).abs() < 1e-12);
        assert_eq!(alpha_rule(0.5, 0.1, 0.9, 1.0, 5.0), 0.9);
        assert_eq!(alpha_rule(0.5, 0.1, 0.9, 0.0, 0.3), 0.9);
        // α_max = α₀: the strictly one-sided rule.
        assert_eq!(alpha_rule(0.5, 0.1, 0.5, 1.0, 5.0), 0.5);
        // NaN errors never produce a NaN α.
        assert_eq!(alpha_rule(0.5, 0.1, 0.9, f64::NAN, 1.0), 0.5);
        assert_eq!(alpha_rule(0.5, 0.1, 0.9, 1.0, f64::INFINITY), 0.5);
    }

    #[test]
    fn bad_config_is_an_error() {
        let mut c = LstmConfig {
            window: 10,
            chunk: 3,
            hidden: 4,
            lr: 0.01,
            batch: 8,
            seed: 0,
        };
        assert!(LstmNet::new(c.clone()).is_err());
        c.chunk = 5;
        assert!(LstmNet::new(c).is_ok());
        let cfg = LsLstmConfig {
            alpha: 1.5,
            ..Default::default()
        };
        assert!(LsLstm::new(cfg).is_err());
        let cfg = LsLstmConfig {
            alpha_max: 0.4,
            ..Default::default()
        };
        assert!(LsLstm::new(cfg).is_err());
    }
}
