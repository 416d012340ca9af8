//! `smore prewarm …`: replay traces under prewarm policies and generate the synthetic suite.
//!
//! Owns: the clap [`PrewarmCommand`] enum and [`run`], which the `smore` binary dispatches to as
//! `smore prewarm <simulate|generate>`. Built only with the `cli` feature (the daemon runs the
//! online manager without it).
//!
//! Must never: print anything but the result table on stdout (progress and logs go to stderr).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};

use crate::policy::{PolicySettings, PolicySpec};
use crate::suite::{run_suite, SuiteOptions};
use crate::synth::{generate, SynthConfig};
use crate::trace::{read_trace_dir, write_trace_dir};

/// `smore prewarm` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum PrewarmCommand {
    /// Replay a trace directory (Azure Functions 2019 format) under prewarm policies.
    Simulate(SimulateArgs),
    /// Write the seeded synthetic trace suite in the Azure format.
    Generate(GenerateArgs),
}

/// `smore prewarm simulate`.
#[derive(Debug, clap::Args)]
pub struct SimulateArgs {
    /// Directory holding invocations_per_function_md.anon.dNN.csv (+ durations, classes.csv).
    #[arg(long)]
    pub trace: PathBuf,
    /// Comma-separated policies: ls-lstm, last-value, hhp, lsth, hybrid, fixed-N, oracle.
    #[arg(
        long,
        default_value = "ls-lstm,hhp,lsth,fixed-10,fixed-20,last-value,oracle"
    )]
    pub policy: String,
    /// Report directory (table, CSVs, summary.json, PNG plots).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Days of history before scoring starts (default: all days but the last).
    #[arg(long)]
    pub warmup_days: Option<usize>,
    /// Replay only the first N functions (after sorting by hash).
    #[arg(long)]
    pub max_functions: Option<usize>,
    /// Functions to plot forecast vs actual for (comma-separated hash prefixes; default: the first
    /// function of each class).
    #[arg(long)]
    pub plot_functions: Option<String>,
    /// Forecast policy load threshold θ (requests/min).
    #[arg(long)]
    pub threshold: Option<f64>,
    /// Forecast policy cool-down (minutes).
    #[arg(long)]
    pub cooldown: Option<u64>,
    /// LS-LSTM α₀ (long-term weight).
    #[arg(long)]
    pub alpha: Option<f64>,
    /// Worker threads.
    #[arg(long, default_value_t = 1)]
    pub jobs: usize,
    /// Hide the progress bar.
    #[arg(long)]
    pub no_progress: bool,
}

/// `smore prewarm generate`.
#[derive(Debug, clap::Args)]
pub struct GenerateArgs {
    /// Output directory.
    #[arg(long)]
    pub out: PathBuf,
    /// RNG seed.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Days.
    #[arg(long, default_value_t = 4)]
    pub days: u32,
    /// Functions per class.
    #[arg(long, default_value_t = 8)]
    pub per_class: usize,
}

/// Runs a `smore prewarm` subcommand.
pub fn run(cmd: PrewarmCommand) -> Result<()> {
    match cmd {
        PrewarmCommand::Generate(a) => {
            if a.days == 0 || a.days > 99 || a.per_class == 0 {
                bail!("--days must be 1..=99 and --per-class ≥ 1");
            }
            let t = generate(&SynthConfig {
                seed: a.seed,
                days: a.days,
                per_class: a.per_class,
            });
            write_trace_dir(&t, &a.out)?;
            println!(
                "wrote {} functions × {} days to {}",
                t.functions.len(),
                t.days.len(),
                a.out.display()
            );
            Ok(())
        }
        PrewarmCommand::Simulate(a) => simulate(a),
    }
}

fn simulate(a: SimulateArgs) -> Result<()> {
    let mut trace = read_trace_dir(&a.trace)?;
    if let Some(n) = a.max_functions {
        trace.functions.truncate(n);
    }
    if trace.functions.is_empty() {
        bail!("{}: the trace has no function", a.trace.display());
    }
    let policies = PolicySpec::parse_list(&a.policy)?;
    let warmup_days = a.warmup_days.unwrap_or(trace.days.len().saturating_sub(1));
    let mut settings = PolicySettings::default();
    if let Some(t) = a.threshold {
        if !(t.is_finite() && t > 0.0) {
            bail!("--threshold must be a positive number of requests per minute");
        }
        settings.forecast.threshold = t;
    }
    if let Some(c) = a.cooldown {
        settings.forecast.cooldown = c;
    }
    if let Some(al) = a.alpha {
        if !(0.0..=1.0).contains(&al) {
            bail!("--alpha must be in [0, 1]");
        }
        settings.lslstm.alpha = al;
        settings.lslstm.alpha_min = settings.lslstm.alpha_min.min(al);
        settings.lslstm.alpha_max = settings.lslstm.alpha_max.max(al);
    }
    let record: Vec<usize> = match &a.plot_functions {
        Some(list) => {
            let mut v = Vec::new();
            for p in list.split(',').filter(|s| !s.is_empty()) {
                match trace
                    .functions
                    .iter()
                    .position(|f| f.key.function.starts_with(p))
                {
                    Some(i) => v.push(i),
                    None => bail!("--plot-functions: no function hash starts with `{p}`"),
                }
            }
            v
        }
        None => {
            let mut seen = std::collections::BTreeSet::new();
            trace
                .functions
                .iter()
                .enumerate()
                .filter(|(_, f)| seen.insert(f.group().to_string()))
                .map(|(i, _)| i)
                .collect()
        }
    };
    let opts = SuiteOptions {
        policies,
        settings,
        warmup_days,
        decide_lead: 120,
        record: record.clone(),
        jobs: a.jobs,
        progress: !a.no_progress,
    };
    eprintln!(
        "replaying {} functions × {} policies; {} history day(s), {} scored day(s)",
        trace.functions.len(),
        opts.policies.len(),
        warmup_days,
        trace.days.len().saturating_sub(warmup_days)
    );
    let suite = run_suite(&trace, &opts)?;
    let table = suite.table();
    print!("{table}");
    if let Some(out) = &a.out {
        std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
        std::fs::write(out.join("table.txt"), &table)?;
        std::fs::write(out.join("aggregates.csv"), suite.aggregates_csv())?;
        std::fs::write(out.join("functions.csv"), suite.functions_csv(&trace))?;
        std::fs::write(
            out.join("summary.json"),
            serde_json::to_string_pretty(&suite.summary_json())?,
        )?;
        if let Err(e) = crate::plot::pareto(&suite, &out.join("pareto.png")) {
            tracing::error!(error = %e, "pareto plot failed");
            eprintln!("warning: {e}");
        }
        let fc_policy = suite
            .policies
            .iter()
            .map(|p| p.policy.clone())
            .find(|p| p == "ls-lstm" || p == "last-value");
        if let Some(fp) = fc_policy {
            if let Err(e) =
                crate::plot::forecasts(&suite, &trace, &fp, &record, 360, &out.join("forecast.png"))
            {
                tracing::error!(error = %e, "forecast plot failed");
                eprintln!("warning: {e}");
            }
        }
        eprintln!("report written to {}", out.display());
    }
    Ok(())
}
