//! Stand-alone entry point for `smore prewarm …` until the lead wires [`smore_prewarm::cli`] into
//! the `smore` binary: `cargo run -p smore-prewarm --release --example prewarm -- simulate …`.
//!
//! Must never: contain logic of its own; it only parses and calls `cli::run`.

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "smore-prewarm",
    about = "smore prewarm: trace replay and synthetic traces"
)]
struct Args {
    #[command(subcommand)]
    cmd: smore_prewarm::cli::PrewarmCommand,
}

fn main() -> anyhow::Result<()> {
    smore_prewarm::cli::run(Args::parse().cmd)
}
