//! `smore eval colocation` without building the whole `smore` binary:
//! `cargo run -p smore-eval --release --example colocation -- [ARGS]` (same arguments).
use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: smore_eval::EvalArgs,
}

fn main() -> anyhow::Result<()> {
    smore_eval::run(Cli::parse().args)
}
