//! Standalone front end for `smore predictor …` (the `smore` binary embeds the same commands):
//! `cargo run -p smore-predictor --example predictor -- eval --data d.csv`.
use clap::Parser;

#[derive(Parser)]
#[command(name = "predictor", about = "smore co-location degradation predictor")]
struct Cli {
    #[command(subcommand)]
    cmd: smore_predictor::cli::PredictorCommand,
}

fn main() -> anyhow::Result<()> {
    smore_predictor::cli::run(Cli::parse().cmd)
}
