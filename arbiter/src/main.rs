//! The `smore` command: the node daemon, the operator CLI and the demo.
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "smore",
    version,
    about = "Harvest idle GPU time of training jobs for serverless inference, within a bound on training slowdown",
    long_about = None
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a trainer and a shimmed function on the simulated GPU (or a real one) and summarize
    /// what co-location bought and cost.
    Demo(smore_arbiter::demo::DemoArgs),
}

fn main() {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Demo(a) => smore_arbiter::demo::run(a),
    };
    if let Err(e) = r {
        eprintln!("smore: {e:#}");
        std::process::exit(1);
    }
}
