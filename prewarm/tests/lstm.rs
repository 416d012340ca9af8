//! LS-LSTM training behaviour on small series (kept small: these run in the debug profile).

use smore_prewarm::forecast::{Forecaster, LastValue};
use smore_prewarm::lstm::{LsLstm, LsLstmConfig, LstmConfig, LstmNet};

/// A periodic per-minute series: 3 requests every 6 minutes, 1 request 3 minutes later.
fn periodic(n: usize) -> Vec<f32> {
    (0..n)
        .map(|t| match t % 6 {
            0 => 3.0,
            3 => 1.0,
            _ => 0.0,
        })
        .collect()
}

fn small_net(seed: u64) -> LstmNet {
    LstmNet::new(LstmConfig { window: 12, chunk: 2, hidden: 12, lr: 0.02, batch: 32, seed }).unwrap()
}

#[test]
fn training_reduces_loss_and_beats_last_value_on_a_periodic_series() {
    let train = periodic(240);
    let test = periodic(120 + 12);
    let mut net = small_net(3);
    // Normalisation is set by train(); measure the untrained loss after a zero-step call.
    net.train(&train, 0).unwrap();
    let before = net.loss_on(&train).unwrap();
    let losses = net.train(&train, 150).unwrap();
    let after = net.loss_on(&train).unwrap();
    assert_eq!(losses.len(), 150);
    assert!(after < 0.5 * before, "loss {before} → {after}");

    // Held-out MAE in requests against the naive last-value forecast.
    let (mut mae_lstm, mut mae_naive) = (0.0f64, 0.0f64);
    for i in 12..test.len() {
        let p = net.predict(&test[i - 12..i]).unwrap();
        mae_lstm += f64::from((p - test[i]).abs());
        mae_naive += f64::from((test[i - 1] - test[i]).abs());
    }
    assert!(mae_lstm < 0.5 * mae_naive, "LSTM MAE {mae_lstm} vs last-value {mae_naive}");
}

#[test]
fn training_is_reproducible_for_a_seed() {
    let s = periodic(120);
    let mut a = small_net(5);
    let mut b = small_net(5);
    assert_eq!(a.train(&s, 10).unwrap(), b.train(&s, 10).unwrap());
}

fn tiny_lslstm() -> LsLstmConfig {
    let mut c = LsLstmConfig::default();
    c.long = LstmConfig { window: 12, chunk: 2, hidden: 12, lr: 0.02, batch: 32, seed: 1 };
    c.short = LstmConfig { window: 6, chunk: 1, hidden: 6, lr: 0.02, batch: 32, seed: 2 };
    c.long_history = 240;
    c.long_min_history = 120;
    c.long_retrain_every = 10_000;
    c.long_steps_initial = 150;
    c.short_history = 30;
    c.short_retrain_every = 10_000;
    c.short_steps_initial = 20;
    c.alpha_window = 30;
    c.alpha_min_samples = 10;
    c
}

#[test]
fn ls_lstm_online_beats_last_value_and_lowers_alpha_when_erratic() {
    let mut f = LsLstm::new(tiny_lslstm()).unwrap();
    let mut naive = LastValue::default();
    let series: Vec<u32> = periodic(200).into_iter().map(|v| v as u32).collect();
    let (mut e_ls, mut e_nv) = (0.0, 0.0);
    for (t, &c) in series.iter().enumerate() {
        if t >= 150 {
            e_ls += (f.forecast().unwrap() - f64::from(c)).abs();
            e_nv += (naive.forecast().unwrap() - f64::from(c)).abs();
        }
        f.observe(c);
        naive.observe(c);
    }
    assert!(e_ls < e_nv, "LS-LSTM {e_ls} vs last-value {e_nv}");
    // Regular series: the long model explains it, α stays at α₀.
    assert_eq!(f.current_alpha(), 0.5);
    // Erratic stretch: a burst the long-term pattern never showed. Retrain the short model on it
    // (the long one is frozen by the 10 000-minute retrain period) and track errors for 30 minutes.
    let mut cfg_burst = 0u32;
    for t in 0..30u32 {
        let c = if t % 2 == 0 { 9 + (t % 5) } else { 7 };
        cfg_burst += c;
        f.forecast().unwrap();
        f.observe(c);
    }
    assert!(cfg_burst > 0);
    let a = f.current_alpha();
    assert!(a < 0.5, "α after an erratic burst: {a}");
    assert!(a >= 0.1);
}
