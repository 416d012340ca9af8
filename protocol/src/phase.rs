//! The training job's phase, predicted from the samples every function of a time-sliced GPU posts
//! to the GPU's turn board ([`crate::board`], [`TurnBoard::phase`]; docs/harvest.md, "Phase
//! prediction"). The shims post; the arbiter reads, to admit a request by the phase it arrives in
//! and to show the phase in `smore status`.
//!
//! Why: request admission charged every request the average collision of its function's and
//! predicted its hold from that average, though on a time-sliced GPU a request that arrives in
//! the trainer's idle phase collides with nothing and its shim never holds it: in the demo's
//! `harvest` two thirds of the refused requests had arrived in an idle phase (docs/harvest.md). A training job's iterations are periodic — a busy phase of queued kernels,
//! then host work (data loading, the optimizer's host side) — so the samples of all the GPU's
//! functions together, each with when it ran and whether it met training work, give the
//! trainer's busy and idle lengths, and from the last phase seen, the phase now. With turns the
//! waits a shim measures are behind the trainer; without them they are behind other functions as
//! often (a pooled board without turns read 43 % of its samples busy beside a trainer busy
//! ~26 %: docs/harvest.md), so the ring is written and read only where the functions take turns.
//!
//! Owns the prediction rule and posting to the ring. Pure arithmetic over atomics: no syscall,
//! lock or allocation (the samples are copied to the stack and sorted there).
//!
//! Must never: trust a sample from the future or older than [`WINDOW_NS`]; predict from fewer than
//! [`MIN_RUNS`] whole phases, or a period outside [`PERIOD_MIN_NS`]..[`PERIOD_MAX_NS`].

use crate::board::{phase_word, split_phase, TurnBoard, PHASE_SAMPLES};
use std::sync::atomic::Ordering::Relaxed;

/// Samples older than this say nothing of the phase now: 1 s (a trainer's phases change with its
/// job: a new epoch, evaluation, a checkpoint).
pub const WINDOW_NS: u64 = 1_000_000_000;
/// A sample stamped this far after now is a clock or a writer not to believe: 1 ms (a sample
/// settles after it ran, so an honest one is never from the future; the slack covers the µs
/// rounding and threads reading the clock a little apart).
pub const FUTURE_SLACK_NS: u64 = 1_000_000;
/// Busy phases seen whole (an idle sample before and after) needed before predicting: 3 — a
/// median of fewer is one phase's noise.
pub const MIN_RUNS: usize = 3;
/// An idle gap within a busy run shorter than this is a lull, not the phase's end: 3 ms (on a
/// time-sliced GPU a function's kernel that arrives as the trainer's slice ends runs at once and
/// reads idle in the middle of the trainer's busy phase — 13 % of the samples that ran in a busy
/// phase of the demo's `harvest` read idle, simulated, 2026-11-28 — and a host phase shorter than
/// this leaves no room for a request anyway).
pub const LULL_NS: u64 = 3_000_000;
/// The shortest period believed: 5 ms (two of a time-sliced GPU's 2 ms slices and a gap; shorter
/// "periods" are samples scattered within one phase).
pub const PERIOD_MIN_NS: u64 = 5_000_000;
/// The longest period believed: 500 ms (longer phases than that are seen by a function's own
/// evidence without any prediction; and the ring spans only a few hundred ms).
pub const PERIOD_MAX_NS: u64 = 500_000_000;

/// What the trainer is predicted to be doing now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Busy until this time (CLOCK_MONOTONIC ns): the current busy phase's predicted end.
    Busy {
        /// When the busy phase is predicted to end (ns).
        until: u64,
    },
    /// Idle until this time (ns): the next busy phase's predicted start.
    Idle {
        /// When the next busy phase is predicted to start (ns).
        until: u64,
    },
}

/// Posts a settled sample: its launch ended at about `ran_ns` (CLOCK_MONOTONIC ns) and `busy`
/// says whether it met training work. One `fetch_add` and one store.
#[inline]
pub fn post(board: &TurnBoard, ran_ns: u64, busy: bool) {
    let at_us = ran_ns / 1_000;
    if at_us == 0 {
        return;
    }
    let i = (board.phase_next.fetch_add(1, Relaxed) % PHASE_SAMPLES as u64) as usize;
    board.phase[i].store(phase_word(at_us, busy), Relaxed);
}

/// What the ring says of the trainer: the phase now and the lengths it was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prediction {
    /// The phase at the time asked, and when it ends.
    pub phase: Phase,
    /// The busy length used (the upper quartile of whole busy runs), ns.
    pub busy_ns: u64,
    /// The idle length used (the median gap between busy runs), ns.
    pub idle_ns: u64,
}

/// The phase at `now` from the board's ring ([`predict_from`]); none while the ring does not
/// show [`MIN_RUNS`] whole busy and idle phases within [`WINDOW_NS`].
pub fn predict(board: &TurnBoard, now: u64) -> Option<Prediction> {
    let mut buf = [0u64; PHASE_SAMPLES];
    let mut n = 0;
    for w in &board.phase {
        let w = w.load(Relaxed);
        if split_phase(w).is_some() {
            buf[n] = w;
            n += 1;
        }
    }
    predict_from(&mut buf[..n], now)
}

/// The phase at `now` from phase words ([`phase_word`], in any order; sorted in place).
///
/// The rule: samples within [`WINDOW_NS`] before `now`, in time order, form runs of busy and idle
/// samples; an idle run shorter than [`LULL_NS`] between busy ones is a lull within one busy
/// run. A busy run started at about the midpoint between its first sample and the idle one
/// before it, and ended at about the midpoint between its last and the idle one after. The busy
/// length is the upper quartile of the whole runs' lengths, the idle length the median of the
/// gaps from one run's end to the next one's start (ranks, not means: a busy phase no sample fell
/// in doubles one gap, a stray busy sample splits one). Idle is the steadier of the two — a training iteration's host
/// work does not stretch when functions collide with its kernels, its busy phase does (measured
/// in the demo's `harvest`: busy 12–18 ms, period 52–58 ms) — so the next busy phase is predicted
/// from the last one's end, and the current one's end from its start. Samples settle late (when
/// their process next looks), so the newest may be a phase old: past the predicted next start the
/// iteration (busy + idle) is folded forward.
pub fn predict_from(words: &mut [u64], now: u64) -> Option<Prediction> {
    // Time is in the high bits: sorting the words sorts the samples by when they ran.
    words.sort_unstable();
    // The newest samples only: the runs below fit their arrays whatever the caller passes.
    let words = &words[words.len().saturating_sub(PHASE_SAMPLES)..];
    let now_us = now / 1_000;
    let oldest = now_us.saturating_sub(WINDOW_NS / 1_000);
    let newest = now_us + FUTURE_SLACK_NS / 1_000;
    let mut lens = [0u64; PHASE_SAMPLES];
    let mut n_lens = 0;
    let mut gaps = [0u64; PHASE_SAMPLES];
    let mut n_gaps = 0;
    let mut prev: Option<(u64, bool)> = None;
    // The current busy run's start, when an idle sample came before it.
    let mut open: Option<u64> = None;
    // The last busy run's end, when an idle sample came after it, and its start if seen: a lull
    // shorter than [`LULL_NS`] reopens it.
    let mut closed: Option<(u64, Option<u64>)> = None;
    for &w in words.iter() {
        let Some((at, busy)) = split_phase(w) else {
            continue;
        };
        if at < oldest || at > newest {
            continue;
        }
        match (prev, busy) {
            (Some((p, false)), true) => {
                let s = p + (at - p) / 2;
                match closed.take() {
                    // A lull within one busy phase (a function's kernel that got the GPU
                    // between two of the trainer's slices reads idle): the run goes on.
                    Some((e, start)) if s.saturating_sub(e) < LULL_NS / 1_000 => {
                        if start.is_some() {
                            n_lens -= 1;
                        }
                        open = start;
                    }
                    Some((e, _)) => {
                        gaps[n_gaps] = s.saturating_sub(e);
                        n_gaps += 1;
                        open = Some(s);
                    }
                    None => open = Some(s),
                }
            }
            (Some((p, true)), false) => {
                let e = p + (at - p) / 2;
                let start = open.take();
                if let Some(s) = start {
                    lens[n_lens] = e.saturating_sub(s);
                    n_lens += 1;
                }
                closed = Some((e, start));
            }
            _ => {}
        }
        prev = Some((at, busy));
    }
    if n_lens < MIN_RUNS || n_gaps < MIN_RUNS {
        return None;
    }
    // The upper quartile of the busy lengths: a hold that ends a little late costs the request
    // idle time it can spare, one that ends early meets the trainer's slice (and the trainer's
    // busy phases stretch by what collides with them).
    let busy = quantile(&mut lens[..n_lens], 3, 4);
    let idle = quantile(&mut gaps[..n_gaps], 1, 2);
    let period = busy + idle;
    if busy == 0 || idle == 0 || !(PERIOD_MIN_NS / 1_000..=PERIOD_MAX_NS / 1_000).contains(&period)
    {
        return None;
    }
    // The phase the newest sample is in, and when it ends: a busy run seen from its start lasts
    // the busy length, or past its newest busy sample by a lull when it has overrun that.
    let (mut busy_now, mut end) = match (prev, open, closed) {
        // Samples stop (the functions went quiet): folding a second of iterations forward from
        // the newest would carry a few ms of error per period into a guess.
        (Some((last, _)), _, _) if now_us.saturating_sub(last) > 2 * period => return None,
        (Some((last, true)), Some(s), _) => (true, (s + busy).max(last + LULL_NS / 1_000)),
        // The newest idle samples may be a lull within the busy phase, not its end: unknown.
        (Some((last, false)), _, Some((e, _))) if last.saturating_sub(e) < LULL_NS / 1_000 => {
            return None
        }
        (Some((_, false)), _, Some((e, _))) => (false, e + idle),
        _ => return None,
    };
    // Where `now` falls, counting whole phases on from the newest seen.
    loop {
        if now_us < end {
            let until = now.saturating_add((end - now_us) * 1_000);
            return Some(Prediction {
                phase: if busy_now {
                    Phase::Busy { until }
                } else {
                    Phase::Idle { until }
                },
                busy_ns: busy * 1_000,
                idle_ns: idle * 1_000,
            });
        }
        if now_us - end > 2 * period {
            // Fold whole iterations at once (the window bounds how many).
            end += (now_us - end) / period * period;
        }
        busy_now = !busy_now;
        end += if busy_now { busy } else { idle };
    }
}

/// The `num`/`den` quantile of a non-empty slice (the element at that rank, rounded down);
/// sorts it.
fn quantile(v: &mut [u64], num: usize, den: usize) -> u64 {
    v.sort_unstable();
    v[(v.len() * num / den).min(v.len() - 1)]
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// Samples every `every` ms over `span_ms` ending at `end_ms`, of a trainer with `period`
    /// and `busy` ms starting a busy phase at `phase0` ms: as the functions would post them.
    fn trace(
        end_ms: u64,
        span_ms: u64,
        every: u64,
        period: u64,
        busy: u64,
        phase0: u64,
    ) -> Vec<u64> {
        (end_ms - span_ms..end_ms)
            .step_by(every as usize)
            .map(|t| phase_word(t * 1_000, (t - phase0) % period < busy))
            .collect()
    }

    #[test]
    fn a_periodic_trainer_is_predicted_busy_in_its_busy_phase_with_its_end() {
        // 52 ms iterations, busy for the first 12, from t = 1 000 ms; samples every 3 ms.
        let mut w = trace(1_500, 400, 3, 52, 12, 1_000);
        // 1 000 + 52 × 10 = 1 520: a busy phase starts; at 1 525 it has ~7 ms to go.
        let p = predict_from(&mut w, 1_525 * MS)
            .expect("a prediction")
            .phase;
        let Phase::Busy { until } = p else {
            panic!("busy expected, got {p:?}")
        };
        assert!(until.abs_diff(1_532 * MS) <= 3 * MS, "ends at {until}");
        // At 1 550 the trainer is in its host phase until the next start at 1 572.
        let mut w = trace(1_500, 400, 3, 52, 12, 1_000);
        let p = predict_from(&mut w, 1_550 * MS)
            .expect("a prediction")
            .phase;
        let Phase::Idle { until } = p else {
            panic!("idle expected, got {p:?}")
        };
        assert!(
            until.abs_diff(1_572 * MS) <= 3 * MS,
            "next start at {until}"
        );
    }

    #[test]
    fn too_few_phases_or_an_empty_ring_predict_nothing() {
        assert_eq!(predict_from(&mut [], 10 * MS), None);
        // Two busy phases only.
        let mut w = trace(1_100, 100, 3, 52, 12, 1_000);
        assert_eq!(predict_from(&mut w, 1_100 * MS), None);
        // All idle (no trainer work seen) or all busy: no phases.
        let mut idle: Vec<u64> = (0..64)
            .map(|t| phase_word(1_000 + t * 1_000, false))
            .collect();
        assert_eq!(predict_from(&mut idle, 70 * MS), None);
        let mut busy: Vec<u64> = (0..64)
            .map(|t| phase_word(1_000 + t * 1_000, true))
            .collect();
        assert_eq!(predict_from(&mut busy, 70 * MS), None);
    }

    #[test]
    fn samples_from_the_future_or_too_old_are_not_believed() {
        // A well-formed trace, but all of it more than the window ago.
        let mut w = trace(1_500, 400, 3, 52, 12, 1_000);
        assert_eq!(predict_from(&mut w, 3_000 * MS), None);
        // The same trace, all of it "from the future" of now.
        let mut w = trace(1_500, 400, 3, 52, 12, 1_000);
        assert_eq!(predict_from(&mut w, 1_000 * MS), None);
    }

    #[test]
    fn a_missed_phase_and_a_stray_busy_sample_do_not_move_the_period() {
        let mut w = trace(1_500, 400, 3, 52, 12, 1_000);
        // Drop every sample of the busy phase at 1 208–1 220, add a stray busy one at 1 440.
        w.retain(|&x| !(1_208_000..1_220_000).contains(&split_phase(x).unwrap().0));
        for x in w.iter_mut() {
            if split_phase(*x).unwrap().0 == 1_441_000 {
                *x = phase_word(1_441_000, true);
            }
        }
        let p = predict_from(&mut w, 1_525 * MS)
            .expect("a prediction")
            .phase;
        let Phase::Busy { until } = p else {
            panic!("busy expected, got {p:?}")
        };
        assert!(until.abs_diff(1_532 * MS) <= 3 * MS, "ends at {until}");
    }

    #[test]
    fn a_period_out_of_bounds_predicts_nothing() {
        // One busy sample in four, 1 ms apart: busy runs of 1 ms, gaps of 3 ms (not lulls), a
        // period of 4 ms, below the shortest believed. The newest sample is busy (an idle one
        // so soon after a busy run would be refused as a possible lull instead).
        let mut w: Vec<u64> = (0..65)
            .map(|t| phase_word(1_000_000 + t * 1_000, t % 4 == 0))
            .collect();
        assert_eq!(predict_from(&mut w, 1_065 * MS), None);
        // The same with a period of 8 ms is believed: the bound is what refused the first.
        let mut w: Vec<u64> = (0..64)
            .map(|t| phase_word(1_000_000 + t * 1_000, t % 8 < 2))
            .collect();
        assert!(predict_from(&mut w, 1_064 * MS).is_some());
        // Busy 10, 10 and 300 ms with idle gaps of 50, 210 and 210 ms: the upper quartile of the
        // busy lengths (300) and the median gap (210) make a period over 500 ms.
        let mut spans = vec![(0u64, false)];
        for (busy, idle) in [(10u64, 50u64), (10, 210), (300, 210)] {
            spans.push((busy, true));
            spans.push((idle, false));
        }
        // A busy phase begins: the last gap is whole.
        spans.push((5, true));
        let mut w = Vec::new();
        let mut t = 1_000u64;
        for (len, busy) in spans {
            for _ in 0..len.max(1) / 5 + 1 {
                w.push(phase_word(t * 1_000, busy));
                t += 5;
            }
        }
        assert_eq!(predict_from(&mut w, (t + 1) * MS), None);
    }

    #[test]
    fn a_lull_or_a_silence_as_the_newest_samples_predicts_nothing() {
        let mut w = trace(1_500, 400, 3, 52, 12, 1_000);
        // A busy phase runs from 1 468 to 1 480 (samples at 1 469 and 1 472 in it). An idle
        // sample at 1 474, in the middle of it, as the newest: a lull or the end — not known.
        w.retain(|&x| split_phase(x).unwrap().0 < 1_473_000);
        w.push(phase_word(1_474_000, false));
        assert_eq!(predict_from(&mut w, 1_475 * MS), None);
        // Without it, the same samples say busy until about 1 480.
        w.pop();
        assert!(matches!(
            predict_from(&mut w, 1_475 * MS).map(|p| p.phase),
            Some(Phase::Busy { .. })
        ));
        // No sample for more than two periods: no guess.
        let mut w = trace(1_500, 400, 3, 52, 12, 1_000);
        assert!(predict_from(&mut w, 1_580 * MS).is_some());
        let mut w = trace(1_500, 400, 3, 52, 12, 1_000);
        assert_eq!(predict_from(&mut w, 1_620 * MS), None);
    }

    #[test]
    fn any_words_give_no_panic_and_an_end_within_a_period() {
        // Words as a hostile function could write them: random, zero, all ones, from the future,
        // duplicated — and more of them than the ring holds.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let now = 5_000 * MS;
        let mut predicted = 0;
        for round in 0..2_000 {
            let n = (next() % 700) as usize;
            let mut w: Vec<u64> = (0..n)
                .map(|i| match (round + i) % 5 {
                    0 => next(),
                    1 => 0,
                    2 => u64::MAX,
                    // Near now, either side: what the window keeps.
                    _ => phase_word(
                        (now / 1_000)
                            .wrapping_add(next() % 1_200_000)
                            .wrapping_sub(1_100_000),
                        next() % 3 == 0,
                    ),
                })
                .collect();
            if let Some(p) = predict_from(&mut w, now) {
                predicted += 1;
                let (Phase::Busy { until } | Phase::Idle { until }) = p.phase;
                assert!(until > now && until <= now + PERIOD_MAX_NS, "{p:?}");
                assert!(p.busy_ns > 0 && p.idle_ns > 0, "{p:?}");
            }
            // The same words at the clock's extremes.
            for edge in [0, 1, 999, u64::MAX] {
                if let Some(p) = predict_from(&mut w, edge) {
                    let (Phase::Busy { until } | Phase::Idle { until }) = p.phase;
                    assert!(until >= edge, "{p:?}");
                }
            }
        }
        assert!(
            predicted > 0,
            "some rounds are read as phases: the checks above ran"
        );
    }

    #[test]
    fn posted_samples_wrap_around_the_ring() {
        let b = TurnBoard::empty();
        for t in 0..(PHASE_SAMPLES as u64 + 10) {
            post(&b, (1_000 + t) * MS, t % 2 == 0);
        }
        assert_eq!(b.phase_next.load(Relaxed), PHASE_SAMPLES as u64 + 10);
        // Slot 0 holds the sample after the first PHASE_SAMPLES (t = PHASE_SAMPLES).
        assert_eq!(
            split_phase(b.phase[0].load(Relaxed)),
            Some((
                (1_000 + PHASE_SAMPLES as u64) * 1_000,
                PHASE_SAMPLES.is_multiple_of(2)
            ))
        );
        // A sample at time 0 is not posted.
        post(&b, 10, true);
        assert_eq!(b.phase_next.load(Relaxed), PHASE_SAMPLES as u64 + 10);
        // A trainer's trace posted to the ring predicts as the words do.
        let b = TurnBoard::empty();
        for x in trace(1_500, 190, 3, 52, 12, 1_000) {
            let (at, busy) = split_phase(x).unwrap();
            post(&b, at * 1_000, busy);
        }
        let p = predict(&b, 1_525 * MS).expect("a prediction");
        assert!(matches!(p.phase, Phase::Busy { .. }));
        // Busy 12 ms, idle 40 ms, each within a sample interval.
        assert!(p.busy_ns.abs_diff(12 * MS) <= 3 * MS, "{p:?}");
        assert!(p.idle_ns.abs_diff(40 * MS) <= 3 * MS, "{p:?}");
    }
}
