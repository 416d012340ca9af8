//! `smore run`: ask the arbiter for admission, then exec the command under the shim.
//!
//! The registration is made by this process, and `exec` keeps its pid, so the grant belongs to
//! the command itself; the connection and the grant page fd are inherited by the command
//! (`SMORE_ARBITER_FD`, `SMORE_GRANT_FD`): the shim maps the page and keeps the connection, whose
//! close — at exit, crash or SIGKILL — releases the grant. A shared ledger (`SMORE_LEDGER_FD`)
//! goes with them, through which every process holding the grant charges its one memory cap.

use anyhow::{Context, Result};
use smore_protocol::conn::socket_path as client_socket;
use smore_protocol::conn::Client;
use smore_protocol::install as artifacts;
use smore_protocol::size::{format_size, parse_size};
use smore_protocol::wire::{self, Register, Reply, Request};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;

/// Exit code when the arbiter cannot be reached (EX_UNAVAILABLE).
pub const EXIT_UNREACHABLE: i32 = 69;
/// Exit code when the command cannot be found, as a shell reports it.
pub const EXIT_NOT_FOUND: i32 = 127;
/// Exit code when the command was found but cannot be executed, as a shell reports it.
pub const EXIT_NOT_EXECUTABLE: i32 = 126;

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Function name shown in `smore status` (default: the command's file name).
    #[arg(long)]
    pub function: Option<String>,
    /// Model id in the predictor's catalog.
    #[arg(long)]
    pub model: Option<String>,
    /// Latency SLO of one request, milliseconds (more than 0, at most one hour).
    #[arg(long, value_parser = parse_slo)]
    pub slo: Option<f64>,
    /// Device memory the function needs (its cap), e.g. 2GiB, 2Gi or 512MiB; at least 1 MiB.
    #[arg(long, value_parser = parse_memory)]
    pub memory: Option<u64>,
    /// Arbiter socket (default: $SMORE_ARBITER_SOCKET or /run/smore/arbiter.sock).
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Path of libsmore_shim.so (default: next to `smore`, or $SMORE_LIB_DIR).
    #[arg(long)]
    pub shim: Option<PathBuf>,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

/// The smallest `--memory` accepted: 1 MiB. Below it no CUDA context fits (a real one takes
/// hundreds of MiB; see docs/shim.md on the context footprint), so a smaller cap is a unit
/// mistake (`--memory 512` meaning MiB), not a request.
pub const MIN_MEMORY: u64 = 1 << 20;

/// The largest `--slo` accepted: one hour, in milliseconds. An inference request's latency
/// objective beyond that is a unit mistake, and would make every admission trivially succeed.
pub const MAX_SLO_MS: f64 = 3_600_000.0;

fn parse_memory(s: &str) -> Result<u64, String> {
    let bytes = parse_size(s).map_err(|e| format!("{e} (expected e.g. 512MiB or 2GiB)"))?;
    if bytes < MIN_MEMORY {
        return Err(format!(
            "{s:?} is {bytes} B, less than the 1 MiB smallest cap: give a unit, e.g. 512MiB or 2GiB"
        ));
    }
    Ok(bytes)
}

fn parse_slo(s: &str) -> Result<f64, String> {
    let ms: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number of milliseconds (e.g. 50)"))?;
    if !ms.is_finite() || ms <= 0.0 || ms > MAX_SLO_MS {
        return Err(format!(
            "{s:?} is not a latency objective: give milliseconds in (0, {MAX_SLO_MS}] (e.g. 50)"
        ));
    }
    Ok(ms)
}

/// HAMi-core's limits, which some GPU operators set: smore's shim does not read them, so a
/// function started with them set would run under smore's grant, not the limit the operator meant.
const HAMI_VARIABLES: [&str; 2] = ["CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_SM_LIMIT"];

/// Finds `program` as `execvp` would: a path containing `/` as it is, otherwise the first
/// executable file of that name in `$PATH`. `None` when nothing would run.
fn find_program(program: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &std::path::Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        let p = PathBuf::from(program);
        return executable(&p).then_some(p);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| executable(p))
}

/// Registers and execs; returns only on failure, with the exit code to use.
pub fn run(a: RunArgs) -> i32 {
    match try_run(a) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("smore run: {e:#}");
            1
        }
    }
}

fn try_run(a: RunArgs) -> Result<i32> {
    // Checked before registering: a grant for a command that cannot start would be made and
    // released for nothing, and counted in the arbiter's decisions.
    if find_program(&a.command[0]).is_none() {
        eprintln!(
            "smore run: {:?} is not an executable file or a command in $PATH; nothing was registered",
            a.command[0]
        );
        return Ok(EXIT_NOT_FOUND);
    }
    for var in HAMI_VARIABLES {
        if let Ok(v) = std::env::var(var) {
            eprintln!(
                "smore run: warning: {var}={v} is set but ignored: smore's shim enforces the arbiter's grant (--memory, the SM share), not HAMi's limits"
            );
        }
    }
    // Absolute: the command and its workers may change directory (or mount namespace) before
    // they connect (a worker that follows the grant reconnects for its life).
    let socket = client_socket(a.socket.as_deref());
    // A socket path is at most 107 bytes (`sun_path`): one longer is left as given.
    let socket = std::path::absolute(&socket)
        .ok()
        .filter(|p| p.as_os_str().len() <= 107)
        .unwrap_or(socket);
    let shim = match a.shim {
        Some(p) => p,
        None => artifacts::require("libsmore_shim.so")?,
    };
    let function = a.function.clone().unwrap_or_else(|| {
        std::path::Path::new(&a.command[0])
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_else(|| "function".into())
    });
    let client = match Client::connect(&socket) {
        Ok(c) => c,
        Err(e) => {
            eprintln!(
                "smore run: {}",
                smore_protocol::conn::unreachable_reason(&socket, &e)
            );
            return Ok(EXIT_UNREACHABLE);
        }
    };
    let (reply, fds) = client
        .call_with_fds(Request::Register(Register {
            function: function.clone(),
            model: a.model.clone(),
            slo_ms: a.slo,
            memory: a.memory,
            resume: None,
            gpu: None,
            exec: true,
            // In a container given some GPUs through CDI: place among them (slot 0 regardless).
            gpus: std::env::var(wire::ENV_GPUS)
                .ok()
                .and_then(|v| wire::parse_gpu_list(&v)),
        }))
        .with_context(|| format!("registering with the arbiter at {}", socket.display()))?;
    let grant = match reply {
        Reply::Granted(g) => g,
        Reply::Refused { code, reason } => {
            eprintln!("smore run: the arbiter refused {function}: {reason}");
            return Ok(code.exit_code());
        }
        Reply::Error { code, message } => {
            eprintln!("smore run: arbiter error ({code:?}): {message}");
            return Ok(1);
        }
        other => anyhow::bail!("unexpected reply {other:?}"),
    };
    let mut fds = fds.into_iter();
    let page = fds
        .next()
        .context("the arbiter granted without a grant page")?;
    // The GPU's turn board, when the grant says one follows (docs/harvest.md, "Serializing the
    // functions"): without it the function runs without turns.
    let board = if grant.board { fds.next() } else { None };
    eprintln!(
        "smore run: {function} admitted as instance {} on GPU {} ({}), cap {}, SM share {} %",
        grant.instance,
        grant.gpu_index,
        grant.gpu_uuid,
        format_size(grant.memory_cap),
        grant.sm_share
    );
    // Both fds must survive exec: clear close-on-exec.
    let stream = client.into_stream();
    rustix::io::fcntl_setfd(&stream, rustix::io::FdFlags::empty())
        .context("clearing close-on-exec")?;
    rustix::io::fcntl_setfd(&page, rustix::io::FdFlags::empty())
        .context("clearing close-on-exec")?;
    // The grant's shared ledger: every process that inherits the grant — this command, its fork
    // children (even those forked before their first CUDA call) and descendants that exec —
    // charges the grant's one cap through it (issue 12 item 4; docs/shim.md, "The memory cap").
    let ledger = smore_protocol::ledger::create().context("creating the grant's shared ledger")?;
    rustix::io::fcntl_setfd(&ledger, rustix::io::FdFlags::empty())
        .context("clearing close-on-exec")?;
    if let Some(b) = &board {
        rustix::io::fcntl_setfd(b, rustix::io::FdFlags::empty())
            .context("clearing close-on-exec")?;
    }
    let mut preload = shim.display().to_string();
    if let Ok(old) = std::env::var("LD_PRELOAD") {
        if !old.is_empty() {
            preload = format!("{preload}:{old}");
        }
    }
    let mut cmd = std::process::Command::new(&a.command[0]);
    cmd.args(&a.command[1..])
        .env("LD_PRELOAD", preload)
        .env("CUDA_VISIBLE_DEVICES", &grant.gpu_uuid)
        .env("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        .env(wire::ENV_SOCKET, &socket)
        .env(wire::ENV_CONN_FD, stream.as_raw_fd().to_string())
        .env(wire::ENV_GRANT_FD, page.as_raw_fd().to_string())
        .env(
            smore_protocol::ledger::ENV_LEDGER_FD,
            ledger.as_raw_fd().to_string(),
        )
        .env("SMORE_INSTANCE", grant.instance.to_string())
        .env(
            wire::ENV_KNOWN_AS,
            format!(
                "{}:{}",
                std::process::id(),
                grant.pid.unwrap_or(std::process::id())
            ),
        )
        .env("SMORE_FUNCTION", &function);
    // When this process (the one the command becomes) started: an exec keeps it. A worker reads
    // it at `/proc/<the pid in SMORE_KNOWN_AS>`, so it is said only where that is this process
    // (`/proc/self` agrees: not in a pid namespace without a `/proc` of its own).
    let me = smore_arbiter::proc::start_time(std::process::id());
    match me.filter(|_| me == smore_arbiter::proc::own_start_time()) {
        Some(start) => cmd.env(wire::ENV_KNOWN_START, start.to_string()),
        None => cmd.env_remove(wire::ENV_KNOWN_START),
    };
    match &board {
        Some(b) => cmd.env(
            smore_protocol::board::ENV_BOARD_FD,
            b.as_raw_fd().to_string(),
        ),
        // Not an inherited one: it would be another grant's board.
        None => cmd.env_remove(smore_protocol::board::ENV_BOARD_FD),
    };
    if grant.failure_policy == Some(wire::FailurePolicy::FailClosed) {
        // A node that fails closed does so whatever the caller's SMORE_FAILURE says (what the
        // shim does if the arbiter goes away while the command runs; docs/shim.md, "Failure
        // policy"). A fail-open node leaves a stricter caller's choice alone.
        cmd.env("SMORE_FAILURE", wire::FailurePolicy::FailClosed.env_value());
    }
    if let Some(m) = &a.model {
        cmd.env("SMORE_MODEL", m);
    }
    if let Some(s) = a.slo {
        cmd.env("SMORE_SLO_MS", s.to_string());
    }
    let err = cmd.exec();
    eprintln!("smore run: cannot execute {:?}: {err}", a.command[0]);
    Ok(if err.kind() == std::io::ErrorKind::NotFound {
        EXIT_NOT_FOUND
    } else {
        EXIT_NOT_EXECUTABLE
    })
}
