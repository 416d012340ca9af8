//! `smore run`: ask the arbiter for admission, then exec the command under the shim.
//!
//! The registration is made by this process, and `exec` keeps its pid, so the grant belongs to
//! the command itself; the connection and the grant page fd are inherited by the command
//! (`SMORE_ARBITER_FD`, `SMORE_GRANT_FD`): the shim maps the page and keeps the connection, whose
//! close — at exit, crash or SIGKILL — releases the grant.

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

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Function name shown in `smore status` (default: the command's file name).
    #[arg(long)]
    pub function: Option<String>,
    /// Model id in the predictor's catalog.
    #[arg(long)]
    pub model: Option<String>,
    /// Latency SLO of one request, milliseconds.
    #[arg(long)]
    pub slo: Option<f64>,
    /// Device memory the function needs (its cap), e.g. 2GiB.
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

fn parse_memory(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| format!("{e} (expected e.g. 512MiB or 2GiB)"))
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
    let socket = client_socket(a.socket.as_deref());
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
                "smore run: cannot reach the arbiter at {}: {e}\n  is `smore arbiter` running? \
                 (set --socket or SMORE_ARBITER_SOCKET if it listens elsewhere)",
                socket.display()
            );
            return Ok(EXIT_UNREACHABLE);
        }
    };
    let (reply, page) = client
        .call_with_fd(Request::Register(Register {
            function: function.clone(),
            model: a.model.clone(),
            slo_ms: a.slo,
            memory: a.memory,
            resume: None,
            gpu: None,
            exec: true,
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
    let page = page.context("the arbiter granted without a grant page")?;
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
        .env("SMORE_INSTANCE", grant.instance.to_string())
        .env("SMORE_FUNCTION", &function);
    if let Some(m) = &a.model {
        cmd.env("SMORE_MODEL", m);
    }
    if let Some(s) = a.slo {
        cmd.env("SMORE_SLO_MS", s.to_string());
    }
    let err = cmd.exec();
    eprintln!("smore run: cannot execute {:?}: {err}", a.command[0]);
    Ok(if err.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    })
}
