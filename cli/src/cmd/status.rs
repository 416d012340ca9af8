//! `smore status`, `smore top` and `smore share`: read and steer a running arbiter.
//!
//! Owns: turning the arbiter's status snapshot (schema: docs/cli.md) into what an operator reads
//! — aligned tables, CSV, filtered JSON — and the terminal UI of `smore top`.
//!
//! Must never: decide anything. Every figure shown comes from the snapshot, except the names of
//! training processes, read from `/proc/<pid>/comm` on this node (the arbiter does not send them).

use anyhow::{bail, Result};
use comfy_table::{presets, CellAlignment, ContentArrangement, Table};
use serde_json::Value;
use smore_protocol::conn::socket_path as client_socket;
use smore_protocol::conn::Client;
use smore_protocol::size::format_size;
use smore_protocol::wire::{Reply, Request};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The arbiter could not be reached: the command exits with [`super::run::EXIT_UNREACHABLE`].
#[derive(Debug, thiserror::Error)]
#[error("{}", smore_protocol::conn::unreachable_reason(.path, .source))]
pub struct Unreachable {
    pub path: PathBuf,
    pub source: std::io::Error,
}

/// How `smore status` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Aligned tables for people.
    Table,
    /// The raw snapshot (schema: docs/cli.md), GPUs filtered by --gpu.
    Json,
    /// One row per process (training and function instances), with a header row.
    Csv,
}

#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// The same as `--format json` (kept for scripts).
    #[arg(long)]
    pub json: bool,
    /// Only these GPUs, by index (comma-separated, e.g. `--gpu 0,1`).
    #[arg(long, value_delimiter = ',')]
    pub gpu: Vec<u64>,
    /// Arbiter socket (default: $SMORE_ARBITER_SOCKET or /run/smore/arbiter.sock).
    #[arg(long)]
    pub socket: Option<PathBuf>,
}

/// The shortest `smore top` refresh period accepted, seconds: each refresh is a status request
/// the arbiter answers between reconciles; ten a second is already more than NVML refreshes.
pub const MIN_INTERVAL_S: f64 = 0.1;
/// The longest, seconds (one day): beyond it a live view is not live.
pub const MAX_INTERVAL_S: f64 = 86_400.0;

#[derive(Debug, clap::Args)]
pub struct TopArgs {
    /// Refresh period, seconds (0.1 to 86400).
    #[arg(long, default_value_t = 1.0, value_parser = parse_interval)]
    pub interval: f64,
    /// Stop after this many refreshes (default: until `q`, Esc or Ctrl-C).
    #[arg(long)]
    pub count: Option<u64>,
    /// Only these GPUs, by index (comma-separated, e.g. `--gpu 0,1`).
    #[arg(long, value_delimiter = ',')]
    pub gpu: Vec<u64>,
    /// Arbiter socket (default: $SMORE_ARBITER_SOCKET or /run/smore/arbiter.sock).
    #[arg(long)]
    pub socket: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct ShareArgs {
    /// Instance id (from `smore status`).
    pub instance: u64,
    /// SM share in percent (1–100), or `auto` to return it to the policy.
    pub share: String,
    /// Arbiter socket (default: $SMORE_ARBITER_SOCKET or /run/smore/arbiter.sock).
    #[arg(long)]
    pub socket: Option<PathBuf>,
}

fn parse_interval(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds (e.g. 1 or 0.5)"))?;
    if v.is_finite() && (MIN_INTERVAL_S..=MAX_INTERVAL_S).contains(&v) {
        Ok(v)
    } else {
        Err(format!(
            "{s:?} is not a refresh period: give seconds from {MIN_INTERVAL_S} to {MAX_INTERVAL_S}"
        ))
    }
}

fn call(socket: Option<&Path>, req: Request) -> Result<Reply> {
    let path = client_socket(socket);
    let c = Client::connect(&path).map_err(|source| Unreachable {
        path: path.clone(),
        source,
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

/// Keeps only the GPUs whose index is in `gpus` (all when empty).
fn filter_gpus(mut snap: Value, gpus: &[u64]) -> Value {
    if !gpus.is_empty() {
        if let Some(list) = snap["gpus"].as_array_mut() {
            list.retain(|g| g["index"].as_u64().is_some_and(|i| gpus.contains(&i)));
        }
    }
    snap
}

pub fn status(a: StatusArgs) -> Result<()> {
    let snap = filter_gpus(snapshot(a.socket.as_deref())?, &a.gpu);
    let format = if a.json { Format::Json } else { a.format };
    match format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&snap)?),
        Format::Csv => print!("{}", csv(&snap)),
        Format::Table => {
            let width = std::io::stdout()
                .is_terminal()
                .then(terminal_width)
                .flatten();
            print!("{}", render(&snap, width));
        }
    }
    Ok(())
}

fn terminal_width() -> Option<u16> {
    ratatui::crossterm::terminal::size().ok().map(|(w, _)| w)
}

pub fn top(a: TopArgs) -> Result<()> {
    let period = Duration::from_secs_f64(a.interval);
    if !std::io::stdout().is_terminal() {
        // Plain text, no escape codes: one snapshot after the other.
        let mut n = 0;
        loop {
            let snap = filter_gpus(snapshot(a.socket.as_deref())?, &a.gpu);
            println!("{}", render(&snap, None));
            n += 1;
            if a.count.is_some_and(|c| n >= c) {
                return Ok(());
            }
            std::thread::sleep(period);
        }
    }
    tui::run(&a, period)
}

/// The terminal UI of `smore top`: the alternate screen in raw mode, restored on every exit.
mod tui {
    use super::*;
    use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
    use ratatui::layout::{Constraint, Layout};
    use ratatui::text::Line;
    use ratatui::widgets::Paragraph;

    pub fn run(a: &TopArgs, period: Duration) -> Result<()> {
        let mut terminal = ratatui::init();
        let r = draw_loop(&mut terminal, a, period);
        ratatui::restore();
        r
    }

    fn draw_loop(
        terminal: &mut ratatui::DefaultTerminal,
        a: &TopArgs,
        period: Duration,
    ) -> Result<()> {
        let mut n = 0;
        loop {
            let snap = filter_gpus(snapshot(a.socket.as_deref())?, &a.gpu);
            terminal.draw(|frame| {
                let area = frame.area();
                let [body, footer] =
                    Layout::vertical([Constraint::Min(1), Constraint::Length(1)]).areas(area);
                let text = render(&snap, Some(area.width));
                frame.render_widget(Paragraph::new(text), body);
                frame.render_widget(
                    Paragraph::new(Line::from(format!(
                        "q quit · refresh every {:.1} s · {}",
                        period.as_secs_f64(),
                        snap["arbiter"]["socket"].as_str().unwrap_or("?")
                    ))),
                    footer,
                );
            })?;
            n += 1;
            if a.count.is_some_and(|c| n >= c) {
                return Ok(());
            }
            // Wait out the period, answering keys as they come.
            let until = std::time::Instant::now() + period;
            loop {
                let left = until.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    break;
                }
                if event::poll(left)? {
                    if let Event::Key(k) = event::read()? {
                        let ctrl_c = k.code == KeyCode::Char('c')
                            && k.modifiers.contains(KeyModifiers::CONTROL);
                        if k.kind == KeyEventKind::Press
                            && (matches!(k.code, KeyCode::Char('q') | KeyCode::Esc) || ctrl_c)
                        {
                            return Ok(());
                        }
                    }
                }
            }
        }
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

fn num(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The command name of a process on this node (`/proc/<pid>/comm`), `-` when unreadable.
fn process_name(pid: &Value) -> String {
    pid.as_u64()
        .and_then(|p| std::fs::read_to_string(format!("/proc/{p}/comm")).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "-".into())
}

/// A function's SM share, marked when an operator set it (`smore share`) rather than the policy.
fn share_of(f: &Value) -> String {
    match f["share_override"].as_u64() {
        Some(s) => format!("{s}% (operator)"),
        None => pct(&f["share"]),
    }
}

fn state_of(f: &Value) -> &'static str {
    if let Some(r) = f["preempt"]["reason"].as_str() {
        if r == "unload" {
            "UNLOADING (training needs memory)"
        } else {
            "PREEMPTED (training needs memory)"
        }
    } else if f["attached"].as_bool() == Some(false) {
        "detached (arbiter restarted)"
    } else if f["shim_loaded"].as_bool() == Some(false) {
        "NO SHIM"
    } else {
        "ok"
    }
}

/// `HH:MM:SS` (UTC) of a Unix time in seconds.
fn clock(t: &Value) -> String {
    match t.as_f64() {
        Some(t) if t.is_finite() && t >= 0.0 => {
            let s = t as u64 % 86_400;
            format!("{:02}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
        }
        _ => "-".into(),
    }
}

fn table(header: &[&str], width: Option<u16>) -> Table {
    let mut t = Table::new();
    t.load_style(presets::NOTHING);
    match width {
        Some(w) => {
            t.set_width(w);
            t.set_content_arrangement(ContentArrangement::Dynamic);
        }
        None => {
            t.set_content_arrangement(ContentArrangement::Disabled);
        }
    }
    t.set_header(header.to_vec());
    t
}

/// The columns of the per-GPU process table, in order.
const PROCESS_COLUMNS: [&str; 12] = [
    "kind", "id", "pid", "name", "cap", "used", "share", "sm", "p99 ms", "pred.trn", "pred.fn",
    "state",
];

/// The rows of one GPU's processes: training first, then function instances.
fn process_rows(g: &Value) -> Vec<[String; 12]> {
    let mut rows = Vec::new();
    for t in g["training"].as_array().into_iter().flatten() {
        rows.push([
            "training".into(),
            "-".into(),
            num(&t["pid"]),
            process_name(&t["pid"]),
            "-".into(),
            sz(&t["used"]),
            "-".into(),
            pct(&t["sm_util"]),
            "-".into(),
            "-".into(),
            "-".into(),
            "untouched".into(),
        ]);
    }
    for f in g["functions"].as_array().into_iter().flatten() {
        rows.push([
            "function".into(),
            num(&f["id"]),
            num(&f["pid"]),
            f["function"].as_str().unwrap_or("-").to_string(),
            sz(&f["cap"]),
            sz(&f["nvml_used"]),
            share_of(f),
            pct(&f["sm_used"]),
            f["p99_ms"]
                .as_f64()
                .map(|x| format!("{x:.1}"))
                .unwrap_or_else(|| "-".into()),
            frac(&f["predicted_train"]),
            frac(&f["predicted_fn"]),
            state_of(f).into(),
        ]);
    }
    rows
}

/// The human-readable status; `width` is the terminal's (tables wrap to it), `None` for no limit.
pub fn render(s: &Value, width: Option<u16>) -> String {
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
            "\nGPU {} {} {}  util {}{}  memory used {} / {}  training {}  granted {}  free for functions {}",
            g["index"],
            g["name"].as_str().unwrap_or(""),
            g["uuid"].as_str().unwrap_or(""),
            pct(&g["util"]),
            // How its processes share it, once NVML has told (docs/cli.md, `sharing`).
            g["sharing"]
                .as_str()
                .map_or(String::new(), |m| format!(" ({m})")),
            sz(&g["used"]),
            sz(&g["total"]),
            sz(&g["training_used"]),
            sz(&g["granted"]),
            sz(&g["free_for_functions"]),
        );
        if g["training_peak"].as_u64().is_some_and(|p| p > 0) || g["reclaimed_at"].is_number() {
            let hold = match g["admission_hold_s"].as_f64() {
                Some(h) => format!("  admission held {h:.0} s more (reclaimed, training growing)"),
                None => String::new(),
            };
            let _ = writeln!(
                o,
                "  headroom {} above the training high-water mark {}  reclaim line {}{hold}",
                sz(&g["training_headroom"]),
                sz(&g["training_peak"]),
                sz(&g["reclaim_line"]),
            );
        }
        let rows = process_rows(g);
        if rows.is_empty() {
            let _ = writeln!(o, "  no processes");
            continue;
        }
        let mut t = table(&PROCESS_COLUMNS, width);
        for r in rows {
            t.add_row(r.to_vec());
        }
        for i in [1, 2, 4, 5, 6, 7, 8, 9, 10] {
            if let Some(c) = t.column_mut(i) {
                c.set_cell_alignment(CellAlignment::Right);
            }
        }
        let _ = writeln!(o, "{t}");
    }
    let c = &s["counters"];
    if c["growth_events"].as_u64().is_some_and(|n| n > 0) {
        let n = |k: &str| c[k].as_u64().unwrap_or(0);
        let _ = writeln!(
            o,
            "
reclaim: {} training growth events, {} reclaims: {} caps lowered ({}), {} idle instances unloaded, {} preempted, {} killed after grace, {} requests refused as preempted",
            n("growth_events"),
            n("reclaims"),
            n("caps_lowered"),
            sz(&c["bytes_lowered"]),
            n("unloaded"),
            n("preempted"),
            n("preempt_kills"),
            n("preempted_requests"),
        );
    }
    let ev = s["events"].as_array().cloned().unwrap_or_default();
    if !ev.is_empty() {
        let _ = writeln!(o, "\nrecent events (UTC):");
        let mut t = table(&["time", "kind", "instance", "message"], width);
        for e in ev.iter().rev().take(10).rev() {
            t.add_row(vec![
                clock(&e["time"]),
                e["kind"].as_str().unwrap_or("").to_string(),
                num(&e["instance"]),
                e["message"].as_str().unwrap_or("").to_string(),
            ]);
        }
        let _ = writeln!(o, "{t}");
    }
    o
}

/// One CSV field, quoted when it holds a separator, a quote or a line break (RFC 4180).
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// Every process of every GPU, one CSV row each, sizes in bytes and shares in percent.
pub fn csv(s: &Value) -> String {
    let mut o = String::from(
        "gpu,kind,id,pid,name,cap_bytes,used_bytes,share_pct,share_set_by,sm_pct,p99_ms,predicted_train,predicted_fn,state\n",
    );
    let raw = |v: &Value| match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    for g in s["gpus"].as_array().into_iter().flatten() {
        for t in g["training"].as_array().into_iter().flatten() {
            let row = [
                raw(&g["index"]),
                "training".into(),
                String::new(),
                raw(&t["pid"]),
                process_name(&t["pid"]),
                String::new(),
                raw(&t["used"]),
                String::new(),
                String::new(),
                raw(&t["sm_util"]),
                String::new(),
                String::new(),
                String::new(),
                "untouched".into(),
            ];
            o += &row
                .iter()
                .map(|f| csv_field(f))
                .collect::<Vec<_>>()
                .join(",");
            o.push('\n');
        }
        for f in g["functions"].as_array().into_iter().flatten() {
            let by_operator = f["share_override"].as_u64().is_some();
            let row = [
                raw(&g["index"]),
                "function".into(),
                raw(&f["id"]),
                raw(&f["pid"]),
                raw(&f["function"]),
                raw(&f["cap"]),
                raw(&f["nvml_used"]),
                if by_operator {
                    raw(&f["share_override"])
                } else {
                    raw(&f["share"])
                },
                if by_operator { "operator" } else { "policy" }.into(),
                raw(&f["sm_used"]),
                raw(&f["p99_ms"]),
                raw(&f["predicted_train"]),
                raw(&f["predicted_fn"]),
                state_of(f).into(),
            ];
            o += &row
                .iter()
                .map(|f| csv_field(f))
                .collect::<Vec<_>>()
                .join(",");
            o.push('\n');
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn snap() -> Value {
        json!({
            "arbiter": {"version": "0.1.0", "policy": "fit", "socket": "/s", "memory_safety": 0.95, "theta_train": 0.1},
            "gpus": [
                {"index": 0, "uuid": "GPU-a", "name": "sim", "total": 17179869184u64, "used": 0, "util": 10.0,
                 "training": [{"pid": 4_000_000, "used": 1073741824u64, "sm_util": 70.0}],
                 "functions": [
                    {"id": 7, "pid": 12, "function": "resnet, v2", "cap": 1073741824u64, "share": 30, "share_override": 30, "attached": true, "shim_loaded": true},
                    {"id": 8, "pid": 13, "function": "bert", "cap": 2147483648u64, "share": 20, "share_override": null, "attached": true, "shim_loaded": true}
                 ]},
                {"index": 1, "uuid": "GPU-b", "name": "sim", "training": [], "functions": []}
            ],
            "events": [{"time": 3723.0, "kind": "admitted", "instance": 7, "pid": 12, "message": "resnet admitted"}]
        })
    }

    #[test]
    fn the_table_aligns_columns_whatever_the_value_widths() {
        let text = render(&snap(), None);
        let lines: Vec<&str> = text.lines().filter(|l| l.contains("function ")).collect();
        assert_eq!(lines.len(), 2, "{text}");
        // Right-aligned cap column: both rows end their cap at the same offset.
        let end = |l: &str, s: &str| l.find(s).map(|i| i + s.len());
        assert_eq!(end(lines[0], "1GiB"), end(lines[1], "2GiB"), "{text}");
    }

    #[test]
    fn an_operator_share_is_marked() {
        let text = render(&snap(), None);
        assert!(text.contains("30% (operator)"), "{text}");
        assert!(
            text.contains("20%") && !text.contains("20% (operator)"),
            "{text}"
        );
        let c = csv(&snap());
        assert!(c.contains(",30,operator,"), "{c}");
        assert!(c.contains(",20,policy,"), "{c}");
    }

    #[test]
    fn events_show_their_time_and_instance() {
        let text = render(&snap(), None);
        let line = text
            .lines()
            .find(|l| l.contains("resnet admitted"))
            .unwrap();
        assert!(line.contains("01:02:03") && line.contains(" 7 "), "{line}");
    }

    #[test]
    fn training_rows_carry_a_name_column() {
        let text = render(&snap(), None);
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with("training"))
            .unwrap();
        // pid 4 000 000 is above the kernel's pid limit: no such process, its name is `-`.
        assert!(line.contains("4000000") && line.contains(" - "), "{line}");
    }

    #[test]
    fn csv_quotes_fields_with_separators() {
        let c = csv(&snap());
        assert!(c.contains("\"resnet, v2\""), "{c}");
        assert_eq!(
            c.lines().count(),
            4,
            "a header, a training row and two functions: {c}"
        );
    }

    #[test]
    fn the_gpu_filter_keeps_only_the_named_gpus() {
        let s = filter_gpus(snap(), &[1]);
        let gpus = s["gpus"].as_array().unwrap();
        assert_eq!(gpus.len(), 1);
        assert_eq!(gpus[0]["index"], 1);
        assert_eq!(
            filter_gpus(snap(), &[])["gpus"].as_array().unwrap().len(),
            2
        );
    }

    #[test]
    fn the_table_fits_a_narrow_terminal() {
        let text = render(&snap(), Some(60));
        for l in text
            .lines()
            .filter(|l| !l.starts_with("smore") && !l.starts_with("GPU"))
        {
            assert!(l.chars().count() <= 60, "{} chars: {l}", l.chars().count());
        }
    }

    #[test]
    fn intervals_that_are_not_periods_are_refused() {
        for bad in ["0", "nan", "inf", "-1", "0.01", "1e9", "soon"] {
            assert!(parse_interval(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_interval("0.5"), Ok(0.5));
    }
}
