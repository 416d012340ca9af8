//! `smore status`, `smore top` and `smore share`: read and steer a running arbiter.

use anyhow::{bail, Context, Result};
use serde_json::Value;
use smore_protocol::conn::socket_path as client_socket;
use smore_protocol::conn::Client;
use smore_protocol::size::format_size;
use smore_protocol::wire::{Reply, Request};
use std::path::{Path, PathBuf};

#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// Print the raw JSON snapshot (schema: docs/cli.md).
    #[arg(long)]
    pub json: bool,
    /// Arbiter socket (default: $SMORE_ARBITER_SOCKET or /run/smore/arbiter.sock).
    #[arg(long)]
    pub socket: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct TopArgs {
    /// Refresh period, seconds.
    #[arg(long, default_value_t = 1.0)]
    pub interval: f64,
    /// Stop after this many refreshes (default: until interrupted).
    #[arg(long)]
    pub count: Option<u64>,
    #[arg(long)]
    pub socket: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct ShareArgs {
    /// Instance id (from `smore status`).
    pub instance: u64,
    /// SM share in percent (1–100), or `auto` to return it to the policy.
    pub share: String,
    #[arg(long)]
    pub socket: Option<PathBuf>,
}

fn call(socket: Option<&Path>, req: Request) -> Result<Reply> {
    let path = client_socket(socket);
    let c = Client::connect(&path).with_context(|| {
        format!("cannot reach the arbiter at {} (is `smore arbiter` running? set --socket or SMORE_ARBITER_SOCKET)", path.display())
    })?;
    Ok(c.call(req)?)
}

/// Fetches a snapshot.
pub fn snapshot(socket: Option<&Path>) -> Result<Value> {
    match call(socket, Request::Status)? {
        Reply::Status { snapshot } => Ok(snapshot),
        other => bail!("unexpected reply {other:?}"),
    }
}

pub fn status(a: StatusArgs) -> Result<()> {
    let snap = snapshot(a.socket.as_deref())?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&snap)?);
    } else {
        print!("{}", render(&snap));
    }
    Ok(())
}

pub fn top(a: TopArgs) -> Result<()> {
    let mut n = 0;
    loop {
        let snap = snapshot(a.socket.as_deref())?;
        // Clear the screen and home the cursor, then draw.
        print!("\x1b[2J\x1b[H{}", render(&snap));
        n += 1;
        if a.count.is_some_and(|c| n >= c) {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_secs_f64(a.interval.max(0.1)));
    }
}

pub fn share(a: ShareArgs) -> Result<()> {
    let share = if a.share == "auto" {
        0
    } else {
        match a.share.trim_end_matches('%').parse::<u32>() {
            Ok(s) if (1..=100).contains(&s) => s,
            _ => bail!("share {:?} must be 1–100 or `auto`", a.share),
        }
    };
    match call(
        a.socket.as_deref(),
        Request::SetShare {
            instance: a.instance,
            share,
        },
    )? {
        Reply::Ok => Ok(()),
        Reply::Error { message, .. } => bail!("{message}"),
        other => bail!("unexpected reply {other:?}"),
    }
}

fn sz(v: &Value) -> String {
    v.as_u64().map(format_size).unwrap_or_else(|| "-".into())
}

fn pct(v: &Value) -> String {
    v.as_f64()
        .map(|x| format!("{x:.0}%"))
        .unwrap_or_else(|| "-".into())
}

fn frac(v: &Value) -> String {
    v.as_f64()
        .map(|x| format!("{:.1}%", x * 100.0))
        .unwrap_or_else(|| "-".into())
}

/// The human-readable status.
pub fn render(s: &Value) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let a = &s["arbiter"];
    let _ = writeln!(
        o,
        "smore arbiter {} · policy {} · σ {} · θ_train {} · {}",
        a["version"].as_str().unwrap_or("?"),
        a["policy"].as_str().unwrap_or("?"),
        a["memory_safety"],
        a["theta_train"],
        a["socket"].as_str().unwrap_or("?")
    );
    for g in s["gpus"].as_array().into_iter().flatten() {
        let _ = writeln!(
            o,
            "\nGPU {} {} {}  util {}  memory used {} / {}  training {}  granted {}  free for functions {}",
            g["index"],
            g["name"].as_str().unwrap_or(""),
            g["uuid"].as_str().unwrap_or(""),
            pct(&g["util"]),
            sz(&g["used"]),
            sz(&g["total"]),
            sz(&g["training_used"]),
            sz(&g["granted"]),
            sz(&g["free_for_functions"]),
        );
        for t in g["training"].as_array().into_iter().flatten() {
            let _ = writeln!(
                o,
                "  training pid {:<8} memory {:>10}  sm {}",
                t["pid"],
                sz(&t["used"]),
                pct(&t["sm_util"])
            );
        }
        let fns = g["functions"].as_array().cloned().unwrap_or_default();
        if !fns.is_empty() {
            let _ = writeln!(
                o,
                "  {:>4} {:<8} {:<16} {:>10} {:>10} {:>6} {:>6} {:>8} {:>9} {:>9}  state",
                "id",
                "pid",
                "function",
                "cap",
                "used",
                "share",
                "sm",
                "p99 ms",
                "pred.trn",
                "pred.fn"
            );
        }
        for f in fns {
            let state = if f["attached"].as_bool() == Some(false) {
                "detached (arbiter restarted)"
            } else if f["shim_loaded"].as_bool() == Some(false) {
                "NO SHIM"
            } else {
                "ok"
            };
            let _ = writeln!(
                o,
                "  {:>4} {:<8} {:<16} {:>10} {:>10} {:>6} {:>6} {:>8} {:>9} {:>9}  {state}",
                f["id"],
                f["pid"],
                f["function"].as_str().unwrap_or(""),
                sz(&f["cap"]),
                sz(&f["nvml_used"]),
                pct(&f["share"]),
                pct(&f["sm_used"]),
                f["p99_ms"]
                    .as_f64()
                    .map(|x| format!("{x:.1}"))
                    .unwrap_or_else(|| "-".into()),
                frac(&f["predicted_train"]),
                frac(&f["predicted_fn"]),
            );
        }
    }
    let ev = s["events"].as_array().cloned().unwrap_or_default();
    if !ev.is_empty() {
        let _ = writeln!(o, "\nrecent events:");
        for e in ev.iter().rev().take(10).rev() {
            let _ = writeln!(
                o,
                "  [{}] {}",
                e["kind"].as_str().unwrap_or(""),
                e["message"].as_str().unwrap_or("")
            );
        }
    }
    o
}
