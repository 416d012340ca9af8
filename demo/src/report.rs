//! The demo's figures, computed from what the run recorded.
//!
//! Owns: the per-request record, the refusal causes, and the definitions of every figure the demo
//! prints and writes to `summary.json` (GUI, SFD, SLD, DSR of all requests and of admitted ones,
//! refusals, cold starts; and the same requests split by the training job's phase at their
//! arrival) — one implementation, used by the single-scenario report and the `--scenario all`
//! table alike.
//! Must never: measure (it only computes from records and samples), or drop a request: every
//! request submitted is in exactly one of served / refused.

use serde::Serialize;

/// Why a request was not served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Refusal {
    /// No warm instance and the arbiter refused to start one (memory, θ_train or SLO; `smore run`
    /// exit codes 75–79), or one was refused less than a second ago.
    Instance,
    /// The instance asked the arbiter for request admission and was deferred until the SLO had
    /// passed (`sim-function --give-up-ms` = the SLO).
    Deferred,
    /// The platform's deadline check: the request could no longer meet its SLO even at its solo
    /// speed (queue ahead of it at arrival, or time already waited at dispatch).
    Deadline,
    /// An instance failed to start or died for a reason other than a refusal (see the function's
    /// log); a defect of the run, not a decision.
    Failed,
}

impl Refusal {
    /// Every cause, in the order reports list them.
    pub const ALL: [Refusal; 4] = [
        Refusal::Instance,
        Refusal::Deferred,
        Refusal::Deadline,
        Refusal::Failed,
    ];

    /// Name of the cause in reports and `summary.json`.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::Instance => "instance",
            Refusal::Deferred => "deferred",
            Refusal::Deadline => "deadline",
            Refusal::Failed => "failed",
        }
    }
}

/// One request as the caller saw it.
#[derive(Debug, Clone)]
pub struct Record {
    /// Index into the scenario's functions.
    pub function: usize,
    /// Trace second it arrived in.
    pub second: usize,
    /// Arrival, seconds since the co-located run started (the plot's time axis).
    pub arrival_s: f64,
    /// Arrival to completion or refusal, as the caller sees it (queueing and cold starts
    /// included), ms.
    pub latency_ms: f64,
    /// Admission + kernels + synchronisation inside the warm instance, ms (NaN when not served).
    pub service_ms: f64,
    /// None: served.
    pub refused: Option<Refusal>,
    /// It found no warm instance.
    pub cold: bool,
}

impl Record {
    /// Whether the request was served (not refused for any cause).
    pub fn served(&self) -> bool {
        self.refused.is_none()
    }
}

/// Requests refused, by cause.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Refusals {
    /// Requests refused for [`Refusal::Instance`].
    pub instance: u64,
    /// Requests refused for [`Refusal::Deferred`].
    pub deferred: u64,
    /// Requests refused for [`Refusal::Deadline`].
    pub deadline: u64,
    /// Requests refused for [`Refusal::Failed`].
    pub failed: u64,
}

impl Refusals {
    fn add(&mut self, r: Refusal) {
        match r {
            Refusal::Instance => self.instance += 1,
            Refusal::Deferred => self.deferred += 1,
            Refusal::Deadline => self.deadline += 1,
            Refusal::Failed => self.failed += 1,
        }
    }

    /// Requests refused for any cause.
    pub fn total(&self) -> u64 {
        self.instance + self.deferred + self.deadline + self.failed
    }
}

/// One function's figures.
#[derive(Debug, Clone, Serialize)]
pub struct FunctionFigures {
    /// The function's name in the scenario.
    pub function: String,
    /// Requests submitted to it.
    pub requests: usize,
    /// Requests served (admitted by the platform and the arbiter); the pre-scenario key.
    pub admitted: usize,
    /// Requests refused, all causes.
    pub refused: u64,
    /// Requests refused, by cause.
    pub refused_by: Refusals,
    /// Requests that found no warm instance.
    pub cold_starts: usize,
    /// P99 service time of the function alone on the GPU, ms.
    pub solo_p99_ms: f64,
    /// P99 service time of served requests co-located.
    pub colocated_p99_ms: f64,
    /// P99 end-to-end latency of served requests (queueing and cold starts included).
    pub latency_p99_ms: f64,
    /// The function's latency SLO, ms.
    pub slo_ms: f64,
    /// colocated_p99 / solo_p99 − 1.
    pub sld: f64,
    /// Served within SLO / all requests.
    pub dsr: f64,
    /// Served within SLO / served.
    pub dsr_admitted: f64,
}

/// Per-request figures of one scenario.
#[derive(Debug, Clone, Serialize)]
pub struct RequestFigures {
    /// Requests submitted, all functions.
    pub requests: usize,
    /// Requests served, all functions.
    pub served: usize,
    /// Requests refused, all causes and functions.
    pub refused: u64,
    /// Requests refused, by cause.
    pub refused_by: Refusals,
    /// Requests that found no warm instance.
    pub cold_starts: usize,
    /// Cold starts / all requests.
    pub cold_start_rate: f64,
    /// Mean over functions (with a finite value) of their [`FunctionFigures::sld`].
    pub sld: f64,
    /// Served within SLO / all requests.
    pub dsr: f64,
    /// Served within SLO / served.
    pub dsr_admitted: f64,
    /// The same figures per function, in scenario order.
    pub functions: Vec<FunctionFigures>,
}

fn p99(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * 0.99).round() as usize]
}

/// Arithmetic mean; NaN for an empty iterator.
pub fn mean(it: impl Iterator<Item = f64>) -> f64 {
    let (s, n) = it.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    if n == 0 {
        f64::NAN
    } else {
        s / n as f64
    }
}

/// DSR and the other request figures. A request meets its SLO when it was served and its
/// end-to-end latency is within the SLO; DSR divides by all requests (a refusal is a miss for
/// the caller), DSR of admitted by the served ones (what admission promised).
pub fn request_figures(
    names: &[&str],
    records: &[Record],
    solo_p99_ms: &[f64],
    slo_ms: &[f64],
) -> RequestFigures {
    let met = |r: &Record| r.served() && r.latency_ms <= slo_ms[r.function];
    let mut functions = Vec::new();
    let mut all_refused = Refusals::default();
    for (i, name) in names.iter().enumerate() {
        let mine: Vec<&Record> = records.iter().filter(|r| r.function == i).collect();
        let mut refused_by = Refusals::default();
        for r in mine.iter().filter_map(|r| r.refused) {
            refused_by.add(r);
            all_refused.add(r);
        }
        let served: Vec<&&Record> = mine.iter().filter(|r| r.served()).collect();
        let mut service: Vec<f64> = served.iter().map(|r| r.service_ms).collect();
        let mut latency: Vec<f64> = served.iter().map(|r| r.latency_ms).collect();
        let ok = mine.iter().filter(|r| met(r)).count();
        let p = p99(&mut service);
        functions.push(FunctionFigures {
            function: name.to_string(),
            requests: mine.len(),
            admitted: served.len(),
            refused: refused_by.total(),
            refused_by,
            cold_starts: mine.iter().filter(|r| r.cold).count(),
            solo_p99_ms: solo_p99_ms[i],
            colocated_p99_ms: p,
            latency_p99_ms: p99(&mut latency),
            slo_ms: slo_ms[i],
            sld: p / solo_p99_ms[i] - 1.0,
            dsr: ok as f64 / mine.len().max(1) as f64,
            dsr_admitted: ok as f64 / served.len().max(1) as f64,
        });
    }
    let served = records.iter().filter(|r| r.served()).count();
    let ok = records.iter().filter(|r| met(r)).count();
    let cold = records.iter().filter(|r| r.cold).count();
    RequestFigures {
        requests: records.len(),
        served,
        refused: all_refused.total(),
        refused_by: all_refused,
        cold_starts: cold,
        cold_start_rate: cold as f64 / records.len().max(1) as f64,
        sld: mean(functions.iter().map(|f| f.sld).filter(|x| x.is_finite())),
        dsr: ok as f64 / records.len().max(1) as f64,
        dsr_admitted: ok as f64 / served.max(1) as f64,
        functions,
    }
}

/// The requests that arrived in one of the training job's phases (busy: its kernels queued on the
/// GPU; idle: its host work), and what became of them.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct PhaseBucket {
    /// Share of the classified wall time the trainer spent in this phase (0..=1).
    pub time_share: f64,
    /// Requests that arrived in this phase.
    pub requests: usize,
    /// Of them, served.
    pub served: usize,
    /// Of them, refused (all causes).
    pub refused: usize,
    /// Of them, served past their SLO.
    pub late: usize,
    /// Served within SLO / requests.
    pub dsr: f64,
    /// Served within SLO / served.
    pub dsr_admitted: f64,
}

/// Every request of a scenario by the training job's phase at its arrival: on a time-sliced GPU
/// a request that arrives in a busy phase collides with training unless it waits the phase out,
/// one that arrives in an idle phase costs the trainer nothing — so where requests are refused or
/// late, by phase, says which part of harvesting loses them (docs/harvest.md, "Phase
/// prediction").
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct PhaseFigures {
    /// Requests that arrived while the trainer's kernels were on the GPU.
    pub busy: PhaseBucket,
    /// Requests that arrived during the trainer's host work.
    pub idle: PhaseBucket,
}

/// Splits `records` by the trainer's phase at their arrival. `busy` holds the trainer's busy
/// phases as (start, end), seconds on the records' clock, in time order (from the trainer's own
/// iteration log: its GPU time measured by events from the iteration's start). Only the requests
/// that arrived between the first phase's start and the last one's end are counted; `None`
/// without phases (a trainer that does not report its GPU time: the real-GPU trainer).
pub fn phase_figures(
    records: &[Record],
    slo_ms: &[f64],
    busy: &[(f64, f64)],
) -> Option<PhaseFigures> {
    let (first, last) = (busy.first()?.0, busy.last()?.1);
    if last <= first {
        return None;
    }
    let busy_s: f64 = busy.iter().map(|(a, b)| (b - a).max(0.0)).sum();
    let in_busy = |t: f64| {
        // The last phase that started at or before t.
        let i = busy.partition_point(|(a, _)| *a <= t);
        i > 0 && t < busy[i - 1].1
    };
    let mut f = PhaseFigures::default();
    for r in records
        .iter()
        .filter(|r| r.arrival_s >= first && r.arrival_s <= last)
    {
        let b = if in_busy(r.arrival_s) {
            &mut f.busy
        } else {
            &mut f.idle
        };
        b.requests += 1;
        if r.served() {
            b.served += 1;
            if r.latency_ms > slo_ms[r.function] {
                b.late += 1;
            }
        } else {
            b.refused += 1;
        }
    }
    for (b, share) in [
        (&mut f.busy, busy_s / (last - first)),
        (&mut f.idle, 1.0 - busy_s / (last - first)),
    ] {
        b.time_share = share.clamp(0.0, 1.0);
        let met = b.served - b.late;
        b.dsr = met as f64 / b.requests.max(1) as f64;
        b.dsr_admitted = met as f64 / b.served.max(1) as f64;
    }
    Some(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(function: usize, latency_ms: f64, refused: Option<Refusal>, cold: bool) -> Record {
        Record {
            function,
            second: 0,
            arrival_s: 0.0,
            latency_ms,
            service_ms: if refused.is_none() {
                latency_ms / 2.0
            } else {
                f64::NAN
            },
            refused,
            cold,
        }
    }

    #[test]
    fn dsr_counts_refusals_as_misses_and_dsr_admitted_does_not() {
        let records = vec![
            rec(0, 5.0, None, false),                   // met
            rec(0, 50.0, None, false),                  // served late
            rec(0, 1.0, Some(Refusal::Deadline), true), // refused
            rec(0, 2.0, Some(Refusal::Instance), true), // refused
            rec(1, 1.0, None, false),                   // met
        ];
        let f = request_figures(&["a", "b"], &records, &[1.0, 1.0], &[10.0, 10.0]);
        assert_eq!(f.requests, 5);
        assert_eq!(f.served, 3);
        assert_eq!(f.refused, 2);
        assert_eq!(f.refused_by.deadline, 1);
        assert_eq!(f.refused_by.instance, 1);
        assert_eq!(f.cold_starts, 2);
        assert!((f.dsr - 2.0 / 5.0).abs() < 1e-12);
        assert!((f.dsr_admitted - 2.0 / 3.0).abs() < 1e-12);
        let a = &f.functions[0];
        assert_eq!((a.requests, a.admitted, a.refused), (4, 2, 2));
        assert!((a.dsr - 0.25).abs() < 1e-12);
        assert!((a.dsr_admitted - 0.5).abs() < 1e-12);
        // SLD from served service times only: P99 of {2.5, 25} is 25 → 24× solo.
        assert!((a.sld - 24.0).abs() < 1e-12);
        assert!((f.functions[1].dsr - 1.0).abs() < 1e-12);
    }

    #[test]
    fn requests_are_split_by_the_trainer_phase_they_arrived_in() {
        let at = |t: f64, latency_ms: f64, refused: Option<Refusal>| Record {
            arrival_s: t,
            ..rec(0, latency_ms, refused, false)
        };
        // Busy 1.0–1.2 s and 2.0–2.2 s: 0.4 s of the 1.2 s the phases span.
        let busy = [(1.0, 1.2), (2.0, 2.2)];
        let records = vec![
            at(0.5, 1.0, None),                    // before the first phase: not counted
            at(1.1, 1.0, None),                    // busy, met
            at(1.15, 50.0, None),                  // busy, late
            at(2.1, 1.0, Some(Refusal::Deferred)), // busy, refused
            at(1.5, 1.0, None),                    // idle, met
            at(1.2, 1.0, None),                    // idle: a phase's end is not in it
            at(3.0, 1.0, None),                    // after the last phase: not counted
        ];
        let f = phase_figures(&records, &[10.0], &busy).unwrap();
        assert_eq!(
            (f.busy.requests, f.busy.served, f.busy.refused, f.busy.late),
            (3, 2, 1, 1)
        );
        assert_eq!(
            (f.idle.requests, f.idle.served, f.idle.refused, f.idle.late),
            (2, 2, 0, 0)
        );
        assert!((f.busy.dsr - 1.0 / 3.0).abs() < 1e-12);
        assert!((f.busy.dsr_admitted - 0.5).abs() < 1e-12);
        assert!((f.idle.dsr - 1.0).abs() < 1e-12);
        assert!((f.busy.time_share - 0.4 / 1.2).abs() < 1e-9);
        assert!((f.busy.time_share + f.idle.time_share - 1.0).abs() < 1e-12);
        // No phases known (the real-GPU trainer does not report its GPU time): no figures.
        assert_eq!(phase_figures(&records, &[10.0], &[]), None);
    }

    #[test]
    fn no_requests_gives_zero_dsr_not_nan() {
        let f = request_figures(&["a"], &[], &[1.0], &[5.0]);
        assert_eq!(f.dsr, 0.0);
        assert_eq!(f.dsr_admitted, 0.0);
        assert!(f.functions[0].colocated_p99_ms.is_nan());
    }
}
