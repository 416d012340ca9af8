//! Replays a whole trace under several policies and aggregates the results per class.
//!
//! Owns: the loop over (policy × function), the progress bar, optional worker threads, and the
//! text / CSV / JSON renderings of the results.
//!
//! Must never: share policy state between functions or between policies (each replay builds a
//! fresh policy instance).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Instant;

use anyhow::{bail, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::policy::{PolicySettings, PolicySpec};
use crate::sim::{
    aggregate, model_for, replay, Aggregate, FunctionResult, ReplayConfig, DEFAULT_DURATION_S,
};
use crate::trace::{Trace, MINUTES_PER_DAY};

/// How to run a suite.
#[derive(Debug, Clone)]
pub struct SuiteOptions {
    /// Policies to compare.
    pub policies: Vec<PolicySpec>,
    /// Their parameters.
    pub settings: PolicySettings,
    /// Days of history before scoring starts.
    pub warmup_days: usize,
    /// Minutes before scoring in which policies already decide (forecast error tracking).
    pub decide_lead: usize,
    /// Indices (into `trace.functions`) whose forecasts are recorded for plots.
    pub record: Vec<usize>,
    /// Worker threads.
    pub jobs: usize,
    /// Show a progress bar on stderr.
    pub progress: bool,
}

/// One function's replay under one policy.
#[derive(Debug, Clone)]
pub struct FunctionRow {
    /// Index into the trace.
    pub index: usize,
    /// Class / group.
    pub group: String,
    /// Model memory, MiB.
    pub mem_mib: f64,
    /// Result.
    pub result: FunctionResult,
}

/// One policy's results.
#[derive(Debug, Clone)]
pub struct PolicyResult {
    /// Policy name.
    pub policy: String,
    /// Per function, in trace order.
    pub rows: Vec<FunctionRow>,
    /// All functions.
    pub overall: Aggregate,
    /// Per class.
    pub per_group: BTreeMap<String, Aggregate>,
    /// Wall-clock seconds of the replay.
    pub seconds: f64,
}

/// Results of a suite.
#[derive(Debug, Clone)]
pub struct SuiteResult {
    /// Per policy, in the requested order.
    pub policies: Vec<PolicyResult>,
    /// First scored minute.
    pub score_from: usize,
}

/// Replays every function of `trace` under every policy of `opts`.
pub fn run_suite(trace: &Trace, opts: &SuiteOptions) -> Result<SuiteResult> {
    let minutes = trace.minutes();
    let score_from = opts.warmup_days * MINUTES_PER_DAY;
    if score_from >= minutes {
        bail!(
            "the trace has {} day(s); {} warm-up day(s) leave nothing to score",
            trace.days.len(),
            opts.warmup_days
        );
    }
    if opts.policies.is_empty() {
        bail!("no policy given");
    }
    let cfg = ReplayConfig {
        score_from,
        decide_lead: opts.decide_lead,
        record_forecasts: false,
    };
    let n = trace.functions.len();
    let pb = if opts.progress {
        let pb = ProgressBar::with_draw_target(
            Some((n * opts.policies.len()) as u64),
            ProgressDrawTarget::stderr(),
        );
        pb.set_style(
            ProgressStyle::with_template(
                "{elapsed_precise} [{bar:30}] {pos}/{len} replays  {msg}  eta {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        pb
    } else {
        ProgressBar::hidden()
    };
    let mut out = Vec::new();
    for spec in &opts.policies {
        pb.set_message(spec.name());
        let started = Instant::now();
        let jobs = opts.jobs.max(1).min(n.max(1));
        let one = |i: usize| -> Result<FunctionRow> {
            let f = &trace.functions[i];
            let model = model_for(&f.key.function);
            let mut policy = spec.build(&opts.settings, Some(&f.counts))?;
            let duration = f
                .avg_duration_ms
                .map_or(DEFAULT_DURATION_S, |ms| ms / 1000.0);
            let mut c = cfg.clone();
            c.record_forecasts = opts.record.contains(&i);
            let result = replay(&f.counts, duration, model, policy.as_mut(), &c);
            pb.inc(1);
            Ok(FunctionRow {
                index: i,
                group: f.group().to_string(),
                mem_mib: model.mem_mib,
                result,
            })
        };
        let mut rows: Vec<FunctionRow> = if jobs == 1 {
            (0..n).map(one).collect::<Result<_>>()?
        } else {
            let one = &one;
            std::thread::scope(|s| -> Result<Vec<FunctionRow>> {
                let handles: Vec<_> = (0..jobs)
                    .map(|j| {
                        s.spawn(move || (j..n).step_by(jobs).map(one).collect::<Result<Vec<_>>>())
                    })
                    .collect();
                let mut all = Vec::new();
                for h in handles {
                    match h.join() {
                        Ok(r) => all.extend(r?),
                        Err(_) => bail!("a replay worker panicked"),
                    }
                }
                Ok(all)
            })?
        };
        rows.sort_by_key(|r| r.index);
        let overall = aggregate(rows.iter().map(|r| (&r.result, r.mem_mib)));
        let mut groups: BTreeMap<String, Vec<&FunctionRow>> = BTreeMap::new();
        for r in &rows {
            groups.entry(r.group.clone()).or_default().push(r);
        }
        let per_group = groups
            .into_iter()
            .map(|(g, rs)| (g, aggregate(rs.into_iter().map(|r| (&r.result, r.mem_mib)))))
            .collect();
        out.push(PolicyResult {
            policy: spec.name(),
            rows,
            overall,
            per_group,
            seconds: started.elapsed().as_secs_f64(),
        });
    }
    pb.finish_and_clear();
    Ok(SuiteResult {
        policies: out,
        score_from,
    })
}

fn pct(x: f64) -> String {
    format!("{:.1}", 100.0 * x)
}

impl SuiteResult {
    /// Group names in table order (classes, then "all").
    pub fn groups(&self) -> Vec<String> {
        let mut g: Vec<String> = self
            .policies
            .first()
            .map(|p| p.per_group.keys().cloned().collect())
            .unwrap_or_default();
        g.push("all".into());
        g
    }

    fn agg<'a>(p: &'a PolicyResult, group: &str) -> Option<&'a Aggregate> {
        if group == "all" {
            Some(&p.overall)
        } else {
            p.per_group.get(group)
        }
    }

    /// The plain-text table: one row per class × policy.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{:<9} {:<11} {:>5} {:>8} {:>7} {:>7} {:>8} {:>10} {:>9} {:>8}",
            "class",
            "policy",
            "fns",
            "requests",
            "cold%",
            "waste%",
            "p75cold%",
            "wasteGiBh",
            "loads/f/d",
            "time_s"
        );
        for g in self.groups() {
            for p in &self.policies {
                if let Some(a) = Self::agg(p, &g) {
                    let _ = writeln!(
                        s,
                        "{:<9} {:<11} {:>5} {:>8} {:>7} {:>7} {:>8} {:>10.3} {:>9.1} {:>8}",
                        g,
                        p.policy,
                        a.functions,
                        a.n_total,
                        pct(a.cold_rate),
                        pct(a.waste_rate),
                        pct(a.p75_cold_rate),
                        a.wasted_gib_h,
                        a.loads_per_fn_day,
                        if g == "all" {
                            format!("{:.1}", p.seconds)
                        } else {
                            String::new()
                        }
                    );
                }
            }
        }
        s
    }

    /// CSV of the aggregates.
    pub fn aggregates_csv(&self) -> String {
        let mut s = String::from(
            "class,policy,functions,requests,cold,cold_rate,waste_rate,p75_cold_rate,wasted_gib_h,loaded_gib_h,loads_per_fn_day\n",
        );
        for g in self.groups() {
            for p in &self.policies {
                if let Some(a) = Self::agg(p, &g) {
                    let _ = writeln!(
                        s,
                        "{g},{},{},{},{},{:.6},{:.6},{:.6},{:.6},{:.6},{:.3}",
                        p.policy,
                        a.functions,
                        a.n_total,
                        a.n_cold,
                        a.cold_rate,
                        a.waste_rate,
                        a.p75_cold_rate,
                        a.wasted_gib_h,
                        a.loaded_gib_h,
                        a.loads_per_fn_day
                    );
                }
            }
        }
        s
    }

    /// CSV of every function's result.
    pub fn functions_csv(&self, trace: &Trace) -> String {
        let mut s =
            String::from("policy,function,class,requests,cold,loaded_s,loaded_idle_s,loads\n");
        for p in &self.policies {
            for r in &p.rows {
                let f = &trace.functions[r.index];
                let _ = writeln!(
                    s,
                    "{},{},{},{},{},{:.1},{:.1},{}",
                    p.policy,
                    f.key.function,
                    r.group,
                    r.result.n_total,
                    r.result.n_cold,
                    r.result.loaded_s,
                    r.result.loaded_idle_s,
                    r.result.loads
                );
            }
        }
        s
    }

    /// JSON summary: per policy, overall and per class aggregates.
    pub fn summary_json(&self) -> serde_json::Value {
        serde_json::json!({
            "score_from_minute": self.score_from,
            "policies": self.policies.iter().map(|p| serde_json::json!({
                "policy": p.policy,
                "seconds": p.seconds,
                "overall": p.overall,
                "per_class": p.per_group,
            })).collect::<Vec<_>>(),
        })
    }
}
