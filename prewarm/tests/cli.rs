//! `smore prewarm generate|simulate` end to end through the clap surface the `smore` binary
//! embeds, and the suite runner with a small LS-LSTM (debug-build friendly sizes).

use std::fs;
use std::path::Path;

use clap::Parser;
use smore_prewarm::cli::{run, PrewarmCommand};
use smore_prewarm::lstm::LstmConfig;
use smore_prewarm::policy::{PolicySettings, PolicySpec};
use smore_prewarm::suite::{run_suite, SuiteOptions};
use smore_prewarm::synth::{generate, SynthConfig};
use smore_prewarm::trace::read_trace_dir;

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    cmd: PrewarmCommand,
}

fn cli(args: &[&str]) -> anyhow::Result<()> {
    let mut v = vec!["smore-prewarm"];
    v.extend_from_slice(args);
    run(Cli::try_parse_from(v)?.cmd)
}

fn is_png(p: &Path) -> bool {
    fs::read(p).is_ok_and(|b| b.len() > 1000 && b.starts_with(b"\x89PNG\r\n\x1a\n"))
}

#[test]
fn generate_then_simulate_writes_table_csv_json_and_plots() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace");
    let out = dir.path().join("report");
    let t = trace.to_str().unwrap();
    cli(&[
        "generate",
        "--out",
        t,
        "--seed",
        "5",
        "--days",
        "2",
        "--per-class",
        "1",
    ])
    .unwrap();
    let read = read_trace_dir(&trace).unwrap();
    assert_eq!((read.days.len(), read.functions.len()), (2, 5));
    let first = read.functions[0].key.function[..10].to_string();

    cli(&[
        "simulate",
        "--trace",
        t,
        "--policy",
        "hhp,lsth,fixed-10,fixed-20,last-value,oracle",
        "--out",
        out.to_str().unwrap(),
        "--plot-functions",
        &first,
        "--no-progress",
    ])
    .unwrap();

    let table = fs::read_to_string(out.join("table.txt")).unwrap();
    for class in ["timer", "diurnal", "bursty", "sparse", "mixed", "all"] {
        assert!(
            table.lines().any(|l| l.starts_with(class)),
            "{class} missing:\n{table}"
        );
    }
    let csv = fs::read_to_string(out.join("aggregates.csv")).unwrap();
    // 6 groups × 6 policies + header.
    assert_eq!(csv.lines().count(), 37, "{csv}");
    for line in csv
        .lines()
        .filter(|l| l.split(',').nth(1) == Some("oracle"))
    {
        let f: Vec<&str> = line.split(',').collect();
        assert_eq!(
            f[5].parse::<f64>().unwrap(),
            0.0,
            "oracle cold rate: {line}"
        );
        assert_eq!(
            f[6].parse::<f64>().unwrap(),
            0.0,
            "oracle waste rate: {line}"
        );
    }
    let json: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(json["policies"].as_array().unwrap().len(), 6);
    assert_eq!(json["score_from_minute"], 1440);
    assert!(is_png(&out.join("pareto.png")));
    assert!(is_png(&out.join("forecast.png")));
    assert!(fs::read_to_string(out.join("functions.csv"))
        .unwrap()
        .contains(&first));
}

#[test]
fn bad_arguments_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().to_str().unwrap();
    cli(&["generate", "--out", t, "--days", "1", "--per-class", "1"]).unwrap();
    let e = cli(&["simulate", "--trace", t, "--policy", "hhp,arima"]).unwrap_err();
    assert!(e.to_string().contains("arima"), "{e}");
    // One day, one warm-up day: nothing to score.
    let e = cli(&[
        "simulate",
        "--trace",
        t,
        "--policy",
        "hhp",
        "--warmup-days",
        "1",
        "--no-progress",
    ])
    .unwrap_err();
    assert!(e.to_string().contains("nothing to score"), "{e}");
    let e = cli(&[
        "simulate",
        "--trace",
        "/nonexistent/trace",
        "--policy",
        "hhp",
    ])
    .unwrap_err();
    assert!(e.to_string().contains("/nonexistent/trace"), "{e}");
    let e = cli(&[
        "simulate",
        "--trace",
        t,
        "--plot-functions",
        "zzzz",
        "--warmup-days",
        "0",
    ])
    .unwrap_err();
    assert!(e.to_string().contains("zzzz"), "{e}");
    let e = cli(&["generate", "--out", t, "--days", "0"]).unwrap_err();
    assert!(e.to_string().contains("--days"), "{e}");
}

#[test]
fn suite_with_a_small_ls_lstm_reports_every_class() {
    let trace = generate(&SynthConfig {
        seed: 11,
        days: 2,
        per_class: 1,
    });
    let mut settings = PolicySettings::default();
    let l = &mut settings.lslstm;
    l.long = LstmConfig {
        window: 16,
        chunk: 4,
        hidden: 8,
        lr: 0.02,
        batch: 32,
        seed: 1,
    };
    l.short = LstmConfig {
        window: 6,
        chunk: 2,
        hidden: 6,
        lr: 0.02,
        batch: 32,
        seed: 2,
    };
    l.long_steps_initial = 30;
    l.long_steps_retrain = 5;
    l.short_steps_initial = 5;
    l.short_steps_retrain = 2;
    let opts = SuiteOptions {
        policies: vec![PolicySpec::LsLstm, PolicySpec::Hhp, PolicySpec::Oracle],
        settings,
        warmup_days: 1,
        decide_lead: 60,
        record: vec![0],
        jobs: 2,
        progress: false,
    };
    let s = run_suite(&trace, &opts).unwrap();
    assert_eq!(s.groups().len(), 6);
    for p in &s.policies {
        assert_eq!(p.overall.functions, 5);
        let per_class: usize = p.per_group.values().map(|a| a.functions).sum();
        assert_eq!(per_class, 5);
        let n: u64 = p.per_group.values().map(|a| a.n_total).sum();
        assert_eq!(n, p.overall.n_total);
        assert!((0.0..=1.0).contains(&p.overall.cold_rate));
        assert!((0.0..=1.0).contains(&p.overall.waste_rate));
    }
    // The same requests are replayed under every policy.
    assert_eq!(s.policies[0].overall.n_total, s.policies[1].overall.n_total);
    let oracle = &s.policies[2].overall;
    assert_eq!((oracle.n_cold, oracle.waste_rate), (0, 0.0));
    // Forecasts are recorded for the chosen function only, one per scored minute.
    let lstm = &s.policies[0];
    assert_eq!(lstm.rows[0].result.forecasts.len(), 1440);
    assert!(lstm.rows[1].result.forecasts.is_empty());
}
