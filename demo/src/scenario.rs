//! The demo's scenarios: what the training job does and how much the functions ask for.
//!
//! Owns: the scenario table (`default`, `harvest`, `busy`), the demo functions' specs, and the
//! replayed trace (arrival times per function, from prewarm's synthetic generator).
//! Must never: start processes or measure anything — a scenario is a description; what it
//! produced is measured by `demo` from the processes' output and NVML.
//!
//! Why three: SMORE's claim (paper §I, §VI) is two-sided — harvest the GPU time a training job
//! leaves idle (`harvest`: a trainer busy ~25 % and ≥ 30 pp of bursty function load), and never
//! slow the training job beyond θ_train (`busy`: a trainer busy ≥ 90 %, where functions that
//! cannot be served in time must be refused rather than queued into misses). `default` is the
//! middle ground the demo has always run (a trainer busy ~60 %).

use smore_prewarm::synth::{superposed_arrivals, TraceClass};

/// Which scenario(s) `smore demo` runs.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScenarioChoice {
    /// A trainer busy ~60 % and light bursty function load (the demo's historical run).
    Default,
    /// A trainer busy ~25 % and ≥ 30 pp of bursty function load: SMORE's headline case.
    Harvest,
    /// A trainer busy ≥ 90 %: protection must win; late requests are refused.
    Busy,
    /// The three in sequence, with one summary table.
    All,
}

impl ScenarioChoice {
    /// The scenarios this choice runs, in order.
    pub fn scenarios(self) -> Vec<Scenario> {
        match self {
            ScenarioChoice::Default => vec![DEFAULT],
            ScenarioChoice::Harvest => vec![HARVEST],
            ScenarioChoice::Busy => vec![BUSY],
            ScenarioChoice::All => vec![HARVEST, DEFAULT, BUSY],
        }
    }
}

/// The simulated training job's iteration: `kernels` × `kernel_us` on the GPU, then `host_ms` on
/// the host (data loading), the idle time smore harvests.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrainerShape {
    /// Duration of each training kernel on an idle simulated GPU, µs.
    pub kernel_us: f64,
    /// Kernels per iteration.
    pub kernels: u32,
    /// Host time per iteration with the GPU idle, ms.
    pub host_ms: f64,
}

impl TrainerShape {
    /// The fraction of an iteration the GPU is busy, by construction (the demo prints the NVML
    /// measurement, which the simulator's launch and sync overheads make a little different).
    pub fn nominal_busy(&self) -> f64 {
        let gpu_ms = self.kernel_us * self.kernels as f64 / 1e3;
        gpu_ms / (gpu_ms + self.host_ms)
    }
}

/// One scenario.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scenario {
    /// Name given to `smore demo --scenario`.
    pub name: &'static str,
    /// One line for the report and docs/demo.md.
    pub about: &'static str,
    /// The co-located training job's iteration.
    pub trainer: TrainerShape,
    /// Scale of every function's mean request rate ([`FunctionSpec::rate`]).
    pub load: f64,
    /// Warm instances the platform may run per function (one request at a time each).
    pub instances: usize,
    /// Requests arriving together (a fan-out): each second's arrivals come in groups of this
    /// many at the same instant, the sub-second burstiness a per-minute trace does not have.
    pub burst: usize,
}

/// Today's demo: 8 × 5 ms kernels + 25 ms host per iteration (~61 % busy), light load.
pub const DEFAULT: Scenario = Scenario {
    name: "default",
    about: "trainer ~60 % busy (8 x 5 ms kernels + 25 ms host per iteration), light bursty load",
    trainer: TrainerShape {
        kernel_us: 5000.0,
        kernels: 8,
        host_ms: 25.0,
    },
    load: 1.0,
    instances: 1,
    burst: 1,
};

/// SMORE's headline: a trainer that leaves most of the GPU idle (4 × 3 ms kernels + 40 ms host:
/// ~23 % busy) and functions offering ~39 % of the GPU (6 × the default rates, two instances per
/// function), peaking at 50–70 % in single seconds. [`offered_load`] of its trace is checked
/// ≥ 30 % in the tests, and its [`reference_dsr`] ≥ 97 %.
///
/// Requests arrive one at a time (`burst` 1). Fan-outs of 4 at one instant (the first version of
/// this scenario) cannot be served on one GPU within SLOs of 6 × solo P50: the fourth request of
/// a group needs 4 × its service time before it even counts the trainer, and the reference DSR
/// of such a trace is 86 % (seeds 7, 8, 42) — `--burst 4` still replays it.
pub const HARVEST: Scenario = Scenario {
    name: "harvest",
    about: "trainer ~23 % busy (4 x 3 ms kernels + 40 ms host), functions offering ~39 % of the GPU (peaks 50-70 % per second), 2 instances each",
    trainer: TrainerShape {
        kernel_us: 3000.0,
        kernels: 4,
        host_ms: 40.0,
    },
    load: 6.0,
    instances: 2,
    burst: 1,
};

/// Protection must win: 10 × 5 ms kernels + 4 ms host (~93 % busy), the default load.
pub const BUSY: Scenario = Scenario {
    name: "busy",
    about: "trainer ~93 % busy (10 x 5 ms kernels + 4 ms host), the default load: late requests are refused",
    trainer: TrainerShape {
        kernel_us: 5000.0,
        kernels: 10,
        host_ms: 4.0,
    },
    load: 1.0,
    instances: 1,
    burst: 1,
};

/// One demo function: its kernels, model, trace class and mean request rate.
#[derive(Debug, Clone)]
pub struct FunctionSpec {
    /// The function's name (also its prewarm and arbiter key).
    pub name: &'static str,
    /// Duration of each of its kernels on an idle simulated GPU, µs.
    pub kernel_us: f64,
    /// Kernels per request.
    pub kernels: u32,
    /// Model memory its instance allocates, MiB.
    pub model_mib: u64,
    /// Time to load the model into a cold instance, ms.
    pub load_ms: f64,
    /// Shape of its synthetic request trace.
    pub class: TraceClass,
    /// Mean requests per second over the replay (before the scenario's `load`).
    pub rate: f64,
    /// With `--gpu`: the PyTorch model (profiling/smore_profiling/models.py) and batch.
    pub torch_model: &'static str,
    /// With `--gpu`: the batch size of each request.
    pub torch_batch: u32,
}

impl FunctionSpec {
    /// GPU time one request takes on an idle simulated GPU, ms.
    pub fn gpu_ms(&self) -> f64 {
        self.kernel_us * self.kernels as f64 / 1e3
    }
}

/// The demo's functions, in scenario order.
pub fn functions() -> Vec<FunctionSpec> {
    // Kernel times and memory are of the order of the SMORE workloads' inference on an A100-class
    // GPU (ResNet-50 ~1–2 ms, BERT-base ~2–4 ms, MobileNet < 1 ms at small batch); they set the
    // simulated durations, they are not measurements.
    vec![
        FunctionSpec {
            name: "resnet50",
            kernel_us: 400.0,
            kernels: 4,
            model_mib: 1024,
            load_ms: 150.0,
            class: TraceClass::Diurnal,
            rate: 20.0,
            torch_model: "resnet50",
            torch_batch: 8,
        },
        FunctionSpec {
            name: "bert",
            kernel_us: 300.0,
            kernels: 8,
            model_mib: 1536,
            load_ms: 200.0,
            class: TraceClass::Mixed,
            rate: 12.0,
            torch_model: "bert_base",
            torch_batch: 4,
        },
        FunctionSpec {
            name: "mobilenet",
            kernel_us: 200.0,
            kernels: 3,
            model_mib: 512,
            load_ms: 100.0,
            class: TraceClass::Timer,
            rate: 6.0,
            torch_model: "mobilenet_v2",
            torch_batch: 1,
        },
    ]
}

/// Independent trace functions of its class whose superposition is one demo function's load: 32.
/// Reasoning: prewarm's generator gives one Azure-like function's per-minute counts, small
/// integers (a diurnal function's base rate is 0.3–20 calls per minute). Scaling one such series
/// to a demo function's hundreds of requests per second turned it into a square wave — 0 or 288
/// requests in a second, 2 156 for the timer in one second (measured: seed 7, `harvest`, up to
/// 233 % of the GPU offered in one second; the reference DSR below was 65 %). A popular function is
/// called by many independent clients: the sum of 32 series keeps the class's shape (a diurnal
/// trend, a timer's spikes) with a per-second granularity of a few requests.
pub const SOURCES_PER_FUNCTION: usize = 32;

/// The trace: per function, per second, the arrival offsets (seconds) within that second.
/// One trace minute of prewarm's generator per demo second, each function's counts the sum of
/// [`SOURCES_PER_FUNCTION`] series of its class, scaled so its mean rate is `rate × load`;
/// arrivals within a second are uniform, in groups of `burst`.
pub fn trace(
    fs: &[FunctionSpec],
    seconds: usize,
    seed: u64,
    load: f64,
    burst: usize,
) -> Vec<Vec<Vec<f64>>> {
    let sources: Vec<(TraceClass, f64)> = fs.iter().map(|f| (f.class, f.rate * load)).collect();
    superposed_arrivals(&sources, SOURCES_PER_FUNCTION, seconds, seed, burst)
}

/// The DSR an ideal platform would reach on a trace: one GPU serving the functions alone (no
/// training job), requests in arrival order at their solo service time `service_ms[f]`, one at a
/// time (a time-sliced GPU gives several instances no more throughput), every instance warm, and
/// a request refused at arrival when it could not finish within `slo_ms[f]`. It is the yardstick
/// the demo's DSR is read against: a trace whose reference DSR is 65 % cannot be served at 95 %
/// by any platform on one GPU, and then the refusals are the workload's, not smore's. (Not a
/// strict bound — another order, such as earliest deadline first, can admit a little more.)
pub fn reference_dsr(tr: &[Vec<Vec<f64>>], service_ms: &[f64], slo_ms: &[f64]) -> f64 {
    let mut arrivals: Vec<(f64, usize)> = tr
        .iter()
        .enumerate()
        .flat_map(|(fi, per_s)| {
            per_s
                .iter()
                .enumerate()
                .flat_map(move |(s, v)| v.iter().map(move |&o| ((s as f64 + o) * 1e3, fi)))
        })
        .collect();
    if arrivals.is_empty() {
        return 1.0;
    }
    arrivals.sort_by(|x, y| x.0.total_cmp(&y.0));
    let (mut free_at, mut met) = (f64::NEG_INFINITY, 0usize);
    for &(at, fi) in &arrivals {
        let (Some(&svc), Some(&slo)) = (service_ms.get(fi), slo_ms.get(fi)) else {
            continue;
        };
        let end = free_at.max(at) + svc;
        if end - at <= slo {
            free_at = end;
            met += 1;
        }
    }
    met as f64 / arrivals.len() as f64
}

/// GPU time the trace asks for, as a fraction of the GPU over `seconds` (idle-GPU service time of
/// every request; what the functions would add to utilization if all were served).
pub fn offered_load(fs: &[FunctionSpec], tr: &[Vec<Vec<f64>>], seconds: usize) -> f64 {
    fs.iter()
        .zip(tr)
        .map(|(f, per_s)| per_s.iter().map(Vec::len).sum::<usize>() as f64 * f.gpu_ms() / 1e3)
        .sum::<f64>()
        / seconds.max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trainers_match_their_scenarios() {
        assert!((DEFAULT.trainer.nominal_busy() - 40.0 / 65.0).abs() < 1e-9);
        let h = HARVEST.trainer.nominal_busy();
        assert!((0.15..=0.30).contains(&h), "harvest trainer busy {h}");
        let b = BUSY.trainer.nominal_busy();
        assert!(b >= 0.90, "busy trainer busy {b}");
    }

    /// Solo service and SLO as the demo measures them on an idle simulated GPU: P50 ≈ the
    /// kernels' time + 0.15 ms of launch and sync overhead, SLO = 6 × P50.
    fn idle_solo(fs: &[FunctionSpec]) -> (Vec<f64>, Vec<f64>) {
        let svc: Vec<f64> = fs.iter().map(|f| f.gpu_ms() + 0.15).collect();
        let slo = svc
            .iter()
            .map(|s| crate::demo::SLO_OVER_SOLO_P50 * s)
            .collect();
        (svc, slo)
    }

    #[test]
    fn harvest_offers_at_least_30_pp_that_one_gpu_can_serve_in_time() {
        let fs = functions();
        let (svc, slo) = idle_solo(&fs);
        for seed in [7, 8, 42] {
            let tr = trace(&fs, 60, seed, HARVEST.load, HARVEST.burst);
            let off = offered_load(&fs, &tr, 60);
            assert!(off >= 0.30, "seed {seed}: harvest offers {off}");
            // Bursty: the busiest second asks for well above the mean.
            let peak = (0..60)
                .map(|s| {
                    fs.iter()
                        .zip(&tr)
                        .map(|(f, t)| t[s].len() as f64 * f.gpu_ms() / 1e3)
                        .sum::<f64>()
                })
                .fold(0.0, f64::max);
            assert!(peak >= 1.3 * off, "seed {seed}: peak {peak} mean {off}");
            let r = reference_dsr(&tr, &svc, &slo);
            assert!(r >= 0.97, "seed {seed}: reference DSR {r}");
        }
        let tr = trace(&fs, 60, 7, DEFAULT.load, DEFAULT.burst);
        let off = offered_load(&fs, &tr, 60);
        assert!(off < 0.10, "default offers {off}");
    }

    #[test]
    fn fan_outs_of_four_are_beyond_one_gpu() {
        // The first harvest scenario: the same load in groups of 4 arriving together.
        let fs = functions();
        let (svc, slo) = idle_solo(&fs);
        let tr = trace(&fs, 60, 7, HARVEST.load, 4);
        let same = tr[0]
            .iter()
            .flat_map(|s| s.windows(2))
            .filter(|w| w[0] == w[1])
            .count();
        let total: usize = tr[0].iter().map(Vec::len).sum();
        assert!(
            same * 4 >= total * 2,
            "{same} of {total} arrivals not grouped"
        );
        let r = reference_dsr(&tr, &svc, &slo);
        assert!(r < 0.90, "reference DSR with fan-outs of 4: {r}");
    }

    #[test]
    fn reference_dsr_refuses_what_cannot_finish_in_time() {
        // Two functions: 1 ms service, SLO 2.5 ms. Three arrivals at once: the third would end at
        // 3 ms and is refused; a fourth 10 ms later is served.
        let tr = vec![vec![vec![0.0, 0.0, 0.0, 0.01]]];
        assert!((reference_dsr(&tr, &[1.0], &[2.5]) - 0.75).abs() < 1e-9);
        // A refused request does not occupy the GPU: the one arriving at 1 ms ends at 3 ms (2 ms
        // after arrival), not at 4 ms as it would behind the refused one.
        let tr = vec![vec![vec![0.0, 0.0, 0.0, 0.001]]];
        assert!((reference_dsr(&tr, &[1.0], &[2.5]) - 0.75).abs() < 1e-9);
        assert_eq!(reference_dsr(&[], &[], &[]), 1.0);
    }

    #[test]
    fn trace_is_seeded() {
        let fs = functions();
        assert_eq!(trace(&fs, 20, 3, 1.0, 2), trace(&fs, 20, 3, 1.0, 2));
        assert_ne!(trace(&fs, 20, 3, 1.0, 2), trace(&fs, 20, 4, 1.0, 2));
    }

    #[test]
    fn all_runs_three_distinct_scenarios() {
        let v = ScenarioChoice::All.scenarios();
        let names: Vec<_> = v.iter().map(|s| s.name).collect();
        assert_eq!(names, ["harvest", "default", "busy"]);
    }
}
