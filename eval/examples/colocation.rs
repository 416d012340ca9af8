//! `smore eval colocation` without building the whole `smore` binary (same code path,
//! `smore_eval::run`): `cargo run -p smore-eval --release --example colocation -- --seeds 1,2,3`.
//! For sweeps on a machine where a release build of the CLI is too costly.
use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: smore_eval::EvalArgs,
}

fn main() -> anyhow::Result<()> {
    smore_eval::run(Cli::parse().args)
}
