//! The `smore` command: the node daemon, the operator CLI and the tools.
#![forbid(unsafe_code)]
use clap::{CommandFactory, Parser, Subcommand};
mod cmd;
use cmd::{cdi, k8s, run, status};
use std::path::PathBuf;

/// `smore --version`: the crate version, the git commit and the build date (cli/build.rs).
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("SMORE_GIT_COMMIT"),
    ", built ",
    env!("SMORE_BUILD_DATE"),
    ")"
);

#[derive(Parser)]
#[command(
    name = "smore",
    version = VERSION,
    about = "Harvest idle GPU time of training jobs for serverless inference, within a bound on training slowdown",
    long_about = "smore lets serverless inference functions use the GPU capacity training jobs leave \
idle. `smore arbiter` runs on each GPU node and owns every function's memory cap and SM share; \
functions start under `smore run`, which asks for admission and runs them with the smore shim.\n\n\
Quick start without a GPU: `smore demo`. Documentation: docs/ in the repository."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the node daemon (foreground; logs to stderr, level from RUST_LOG, default info).
    Arbiter {
        /// Node config file (see docs/node.example.toml); built-in defaults when omitted.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Log lines as text (colours only when stderr is a terminal) or as JSON objects.
        #[arg(long, value_enum, default_value_t = LogFormat::Text)]
        log_format: LogFormat,
        /// Override the config's socket path.
        #[arg(long)]
        socket: Option<PathBuf>,
        /// Override the config's state directory.
        #[arg(long)]
        state_dir: Option<PathBuf>,
        /// Validate the configuration (and the policy's model/catalog) and exit, like `nginx -t`.
        #[arg(long)]
        check: bool,
    },
    /// Ask the arbiter for admission, then run COMMAND under the shim with its grant.
    Run(run::RunArgs),
    /// Show GPUs, training processes, functions, caps, shares, usage and recent events.
    Status(status::StatusArgs),
    /// Live view of `smore status`.
    Top(status::TopArgs),
    /// Change a function instance's SM share live (operator).
    Share(status::ShareArgs),
    /// Container Device Interface: `smore cdi generate` writes the spec that lets containers
    /// ask for `--device smore.dev/gpu=<index>` (docs/kubernetes.md).
    #[command(subcommand)]
    Cdi(cdi::CdiCmd),
    /// End-to-end demo: an arbiter, a training job and functions under `smore run` replaying a
    /// request trace on the simulated GPU (or `--gpu`), with a summary and a plot.
    Demo(smore_demo::demo::DemoArgs),
    /// Benchmarks that print figures (shim overhead and share accuracy; arbiter latency).
    #[command(subcommand)]
    Bench(BenchCmd),
    /// SMORE's degradation predictor: train, evaluate, query, precompute the lookup table.
    #[command(subcommand)]
    Predictor(smore_predictor::cli::PredictorCommand),
    /// Request forecasting and prewarm policies: replay traces, generate the synthetic suite.
    #[command(subcommand)]
    Prewarm(smore_prewarm::cli::PrewarmCommand),
    /// Kubernetes: the scheduler extender (`smore k8s extender`; docs/kubernetes.md).
    #[command(subcommand)]
    K8s(k8s::K8sCmd),
    /// SIMULATED evaluations: co-location policies side by side (`smore eval [colocation]`), or
    /// placement through the Kubernetes scheduler extender at cluster scale (`smore eval cluster`).
    Eval(Box<smore_eval::EvalCommand>),
    /// Print a shell completion script (e.g. `smore completions bash > /etc/bash_completion.d/smore`).
    Completions {
        /// The shell to complete in.
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff; e.g. `smore man | man -l -`).
    Man,
}

/// How the daemon writes its log lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    /// Human-readable lines; ANSI colours only when stderr is a terminal.
    Text,
    /// One JSON object per line (for journald / log collectors).
    Json,
}

#[derive(Subcommand)]
enum BenchCmd {
    /// ns added per launch / allocation (shim vs bare, same driver, same run) and share accuracy.
    Shim(smore_demo::bench::BenchShimArgs),
    /// Registration latency and throughput, and grant-change propagation time.
    Arbiter(smore_demo::bench::BenchArbiterArgs),
    /// A growing trainer beside capped functions: trainer OOMs, time to room, reclaim churn, DSR.
    Reclaim(smore_demo::reclaim::BenchReclaimArgs),
    /// Decision latency of SMORE Algorithm 1 at 8–1024 GPUs, multi-way query latency.
    Predictor,
    /// Per-pod decision latency of the Kubernetes scheduler extender (128 nodes × 8 GPUs).
    Extender(k8s::BenchExtenderArgs),
    /// Over-commits under one cap (processes × threads), SIGKILLed function release time, and
    /// re-adoption after an arbiter SIGKILLed mid-storm (simulated GPU).
    Escapes(smore_demo::escapes::BenchEscapesArgs),
}

fn init_logging(format: LogFormat) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => fmt.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => fmt.json().with_ansi(false).init(),
    }
}

fn arbiter(
    config: Option<PathBuf>,
    log_format: LogFormat,
    socket: Option<PathBuf>,
    state_dir: Option<PathBuf>,
    check: bool,
) -> anyhow::Result<()> {
    init_logging(log_format);
    let mut cfg = match &config {
        Some(p) => smore_arbiter::config::Config::load(p)?,
        None => smore_arbiter::config::Config::default(),
    };
    // The file as read: SIGHUP compares the re-read file against it, not against the overrides.
    let base = cfg.clone();
    if let Some(s) = socket {
        cfg.socket = s;
    }
    if let Some(d) = state_dir {
        cfg.state_dir = d;
    }
    if check {
        println!("{}", smore_arbiter::lifecycle::check(&cfg)?);
        return Ok(());
    }
    // Caught before the socket exists: a SIGTERM right after start is a clean shutdown.
    let signals = smore_arbiter::lifecycle::register_signals()?;
    smore_arbiter::server::Daemon::start(cfg)?.run_service(signals, base)
}

fn main() {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Arbiter {
            config,
            log_format,
            socket,
            state_dir,
            check,
        } => arbiter(config, log_format, socket, state_dir, check),
        Cmd::Run(a) => std::process::exit(run::run(a)),
        Cmd::Status(a) => status::status(a),
        Cmd::Top(a) => status::top(a),
        Cmd::Share(a) => status::share(a),
        Cmd::Cdi(c) => cdi::run(c),
        Cmd::Demo(a) => smore_demo::demo::run(a),
        Cmd::Bench(BenchCmd::Shim(a)) => smore_demo::bench::shim(a),
        Cmd::Bench(BenchCmd::Arbiter(a)) => smore_demo::bench::arbiter(a),
        Cmd::Bench(BenchCmd::Reclaim(a)) => smore_demo::reclaim::run(a),
        Cmd::Bench(BenchCmd::Predictor) => smore_predictor::bench::run(),
        Cmd::Bench(BenchCmd::Extender(a)) => k8s::bench(a),
        Cmd::Bench(BenchCmd::Escapes(a)) => smore_demo::escapes::run(a),
        Cmd::K8s(k8s::K8sCmd::Extender(a)) => {
            init_logging(LogFormat::Text);
            k8s::extender(a)
        }
        Cmd::K8s(k8s::K8sCmd::DevicePlugin(a)) => {
            init_logging(LogFormat::Text);
            k8s::device_plugin(a)
        }
        Cmd::Predictor(c) => smore_predictor::cli::run(c),
        Cmd::Prewarm(c) => smore_prewarm::cli::run(c),
        Cmd::Eval(a) => smore_eval::dispatch(*a),
        Cmd::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "smore", &mut std::io::stdout());
            Ok(())
        }
        Cmd::Man => clap_mangen::Man::new(Cli::command())
            .render(&mut std::io::stdout())
            .map_err(Into::into),
    };
    if let Err(e) = r {
        eprintln!("smore: {e:#}");
        let code = if e.downcast_ref::<status::Unreachable>().is_some() {
            run::EXIT_UNREACHABLE
        } else {
            1
        };
        std::process::exit(code);
    }
}
