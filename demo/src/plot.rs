//! The demo's PNG: one per scenario, what a user needs to judge smore at a glance.
//!
//! Owns: the figure's layout and encoding. Rows, all on the same time axis (seconds since the
//! training job started):
//! - one row per function: every request's end-to-end latency (log scale) against its SLO (a
//!   horizontal line) — met in green, missed in red, refused as grey crosses along the bottom;
//! - the training job's iteration time against its time alone and the θ_train bound
//!   (alone × (1 + θ));
//! - the SM shares the arbiter granted each function (sum over its instances, polled once per
//!   second), stacked, with NVML's GPU utilization and the trainer-alone mean on the same % axis.
//!
//! Must never: compute a figure (the caller passes what `report` computed), or draw without the
//! device label (simulated or real) in the title.

use anyhow::Result;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;

/// What happened to one request, as drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    /// Served within its SLO.
    Met,
    /// Served after its SLO.
    Missed,
    /// Not served (any refusal cause).
    Refused,
}

/// One function's row.
#[derive(Debug, Clone)]
pub struct FunctionRow {
    /// The function's name (row label).
    pub name: String,
    /// Its latency SLO, ms (drawn as a line).
    pub slo_ms: f64,
    /// (arrival, seconds; end-to-end latency, ms; outcome). A refused request's latency is not
    /// drawn (it sits on the bottom band).
    pub requests: Vec<(f64, f64, Mark)>,
    /// Summed SM share of its instances at each poll: (seconds, %).
    pub share: Vec<(f64, f64)>,
}

/// Everything the figure shows.
#[derive(Debug, Clone)]
pub struct PlotInput {
    /// First title line (scenario, device).
    pub title: String,
    /// Second title line (the headline figures).
    pub subtitle: String,
    /// One row per function, in scenario order.
    pub functions: Vec<FunctionRow>,
    /// The trainer's iterations: (end, seconds; iteration, ms).
    pub iterations: Vec<(f64, f64)>,
    /// The trainer's iteration time alone on the GPU, ms.
    pub iter_alone_ms: f64,
    /// Bound on training slowdown θ_train (fraction); the plot draws iter_alone × (1 + θ).
    pub theta_train: f64,
    /// NVML utilization: (seconds, %).
    pub util: Vec<(f64, f64)>,
    /// NVML utilization with the trainer alone, % (drawn as a reference line).
    pub util_exclusive_pct: f64,
    /// When the functions' trace replay started and ended, seconds.
    pub replay: (f64, f64),
}

/// A function's colour (shares panel), fixed by its position.
const PALETTE: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
];
const MET: RGBColor = RGBColor(44, 160, 44);
const MISSED: RGBColor = RGBColor(214, 39, 40);
const REFUSED: RGBColor = RGBColor(120, 120, 120);
/// Shade of the replay window (functions offered load).
const REPLAY: RGBColor = RGBColor(235, 240, 250);

fn font() {
    static FONT: std::sync::Once = std::sync::Once::new();
    FONT.call_once(|| {
        let _ = plotters::style::register_font(
            "sans-serif",
            FontStyle::Normal,
            dejavu::sans::regular(),
        );
    });
}

/// Draws `p` to `png`.
pub fn draw(png: &Path, p: &PlotInput) -> Result<()> {
    font();
    let err = |e: &dyn std::fmt::Display| anyhow::anyhow!("drawing {}: {e}", png.display());
    let n = p.functions.len();
    let (w, fn_h, panel_h, head_h) = (1400u32, 230u32, 270u32, 70u32);
    let h = head_h + fn_h * n as u32 + 2 * panel_h;
    let root = BitMapBackend::new(png, (w, h)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let (head, body) = root.split_vertically(head_h);
    head.draw(&Text::new(
        p.title.clone(),
        (15, 8),
        ("sans-serif", 24).into_font().color(&BLACK),
    ))
    .map_err(|e| err(&e))?;
    head.draw(&Text::new(
        p.subtitle.clone(),
        (15, 40),
        ("sans-serif", 17).into_font().color(&BLACK),
    ))
    .map_err(|e| err(&e))?;
    let x_end = p
        .replay
        .1
        .max(p.iterations.last().map_or(0.0, |x| x.0))
        .max(1.0)
        * 1.01;
    let mut rest = body;
    for f in &p.functions {
        let (row, r) = rest.split_vertically(fn_h);
        rest = r;
        function_row(&row, f, p.replay, x_end).map_err(|e| err(&e))?;
    }
    let (trainer, shares) = rest.split_vertically(panel_h);
    trainer_panel(&trainer, p, x_end).map_err(|e| err(&e))?;
    shares_panel(&shares, p, x_end).map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

type Area<'a> = DrawingArea<BitMapBackend<'a>, Shift>;
type DrawResult = std::result::Result<(), Box<dyn std::error::Error>>;

/// Width kept right of every chart for its legend, px (so no legend hides data).
const LEGEND_W: u32 = 300;

/// A legend entry's symbol.
#[derive(Clone, Copy)]
enum Key {
    Cross(RGBColor),
    Dot(RGBColor),
    Line(RGBColor, u32),
    Dashed(RGBColor),
    /// A filled square (a stacked band).
    Fill(RGBColor),
    /// Text only (a figure about the panel).
    Text,
}

/// Draws `entries` in the legend column at the right of `area`.
fn legend(area: &Area, entries: &[(Key, String)]) -> DrawResult {
    let (w, _) = area.dim_in_pixel();
    let x = w as i32 - LEGEND_W as i32 + 12;
    for (k, (key, text)) in entries.iter().enumerate() {
        let y = 34 + 19 * k as i32;
        match *key {
            Key::Cross(c) => area.draw(&Cross::new((x + 10, y), 4, c.stroke_width(1)))?,
            Key::Dot(c) => area.draw(&Circle::new((x + 10, y), 4, c.filled()))?,
            Key::Line(c, wd) => area.draw(&PathElement::new(
                vec![(x, y), (x + 22, y)],
                c.stroke_width(wd),
            ))?,
            Key::Text => {}
            Key::Fill(c) => area.draw(&Rectangle::new(
                [(x + 3, y - 6), (x + 19, y + 6)],
                c.mix(0.75).filled(),
            ))?,
            Key::Dashed(c) => {
                for d in [0, 9, 18] {
                    area.draw(&PathElement::new(
                        vec![(x + d, y), (x + d + 5, y)],
                        c.stroke_width(1),
                    ))?
                }
            }
        }
        area.draw(&Text::new(
            text.clone(),
            (x + 30, y - 7),
            ("sans-serif", 13).into_font().color(&BLACK),
        ))?;
    }
    Ok(())
}

fn count(f: &FunctionRow, m: Mark) -> usize {
    f.requests.iter().filter(|r| r.2 == m).count()
}

fn function_row(area: &Area, f: &FunctionRow, replay: (f64, f64), x_end: f64) -> DrawResult {
    let served: Vec<f64> = f
        .requests
        .iter()
        .filter(|r| r.2 != Mark::Refused)
        .map(|r| r.1)
        .filter(|v| v.is_finite() && *v > 0.0)
        .collect();
    let lo = served.iter().copied().fold(f.slo_ms, f64::min).max(1e-3) / 4.0;
    let hi = served.iter().copied().fold(f.slo_ms, f64::max) * 2.0;
    // Refused requests sit on a band at the bottom of the (log) axis.
    let band = lo * 1.4;
    let total = f.requests.len().max(1) as f64;
    let (met, missed, refused) = (
        count(f, Mark::Met),
        count(f, Mark::Missed),
        count(f, Mark::Refused),
    );
    let mut c = ChartBuilder::on(area)
        .caption(
            format!(
                "{}: request latency (end to end) vs SLO {:.1} ms — {} requests: {:.1} % met, {:.1} % missed, {:.1} % refused",
                f.name,
                f.slo_ms,
                f.requests.len(),
                met as f64 / total * 100.0,
                missed as f64 / total * 100.0,
                refused as f64 / total * 100.0
            ),
            ("sans-serif", 17),
        )
        .margin(8)
        .margin_right(LEGEND_W)
        .x_label_area_size(22)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..x_end, (lo..hi).log_scale())?;
    c.configure_mesh()
        .y_desc("ms (log)")
        .y_labels(6)
        .y_label_formatter(&|v| {
            if *v >= 10.0 {
                format!("{v:.0}")
            } else {
                format!("{v:.1}")
            }
        })
        .light_line_style(WHITE)
        .draw()?;
    c.draw_series(std::iter::once(Rectangle::new(
        [(replay.0, lo), (replay.1, hi)],
        REPLAY.filled(),
    )))?;
    let points = |m: Mark| {
        f.requests
            .iter()
            .filter(move |r| r.2 == m)
            .map(|r| (r.0, r.1))
    };
    c.draw_series(
        points(Mark::Refused).map(|(t, _)| Cross::new((t, band), 3, REFUSED.stroke_width(1))),
    )?;
    c.draw_series(points(Mark::Met).map(|p| Circle::new(p, 2, MET.filled())))?;
    c.draw_series(points(Mark::Missed).map(|p| Circle::new(p, 2, MISSED.filled())))?;
    c.draw_series(LineSeries::new(
        [(0.0, f.slo_ms), (x_end, f.slo_ms)],
        BLACK.stroke_width(2),
    ))?;
    legend(
        area,
        &[
            (
                Key::Line(BLACK, 2),
                format!("SLO {:.1} ms (6 × solo P50)", f.slo_ms),
            ),
            (Key::Dot(MET), format!("served within the SLO ({met})")),
            (Key::Dot(MISSED), format!("served late: missed ({missed})")),
            (
                Key::Cross(REFUSED),
                format!("refused ({refused}), along the bottom"),
            ),
        ],
    )
}

fn trainer_panel(area: &Area, p: &PlotInput, x_end: f64) -> DrawResult {
    let bound = p.iter_alone_ms * (1.0 + p.theta_train);
    let hi = p
        .iterations
        .iter()
        .map(|x| x.1)
        .fold(bound, f64::max)
        .max(p.iter_alone_ms * 1.3)
        * 1.05;
    let lo = p
        .iterations
        .iter()
        .map(|x| x.1)
        .fold(p.iter_alone_ms, f64::min)
        * 0.9;
    let mut c = ChartBuilder::on(area)
        .caption(
            "training job: iteration time vs alone and the θ_train bound (shaded: functions offered load)",
            ("sans-serif", 17),
        )
        .margin(8)
        .margin_right(LEGEND_W)
        .x_label_area_size(22)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..x_end, lo..hi)?;
    c.configure_mesh()
        .y_desc("ms / iteration")
        .light_line_style(WHITE)
        .draw()?;
    c.draw_series(std::iter::once(Rectangle::new(
        [(p.replay.0, lo), (p.replay.1, hi)],
        REPLAY.filled(),
    )))?;
    c.draw_series(LineSeries::new(
        p.iterations.iter().copied(),
        RGBColor(31, 119, 180).stroke_width(1),
    ))?;
    c.draw_series(LineSeries::new(
        [(0.0, p.iter_alone_ms), (x_end, p.iter_alone_ms)],
        BLACK.stroke_width(2),
    ))?;
    c.draw_series(LineSeries::new(
        [(0.0, bound), (x_end, bound)],
        MISSED.stroke_width(2),
    ))?;
    let during: Vec<f64> = p
        .iterations
        .iter()
        .filter(|(t, _)| *t >= p.replay.0 && *t <= p.replay.1)
        .map(|x| x.1)
        .collect();
    let over = during.iter().filter(|ms| **ms > bound).count();
    legend(
        area,
        &[
            (
                Key::Line(RGBColor(31, 119, 180), 1),
                "iteration time".into(),
            ),
            (
                Key::Line(BLACK, 2),
                format!("alone (mean {:.1} ms)", p.iter_alone_ms),
            ),
            (
                Key::Line(MISSED, 2),
                format!(
                    "alone × (1 + θ_train {:.0} %) = {:.1} ms",
                    p.theta_train * 100.0,
                    bound
                ),
            ),
            (
                Key::Line(REPLAY, 10),
                "shaded: functions offered load".into(),
            ),
            (
                Key::Text,
                format!("{over} of {} iterations then above the bound", during.len()),
            ),
        ],
    )
}

fn shares_panel(area: &Area, p: &PlotInput, x_end: f64) -> DrawResult {
    let mut c = ChartBuilder::on(area)
        .caption(
            "grants: SM shares, or under harvest collision budgets in % of wall time (stacked, summed over instances) and GPU utilization",
            ("sans-serif", 17),
        )
        .margin(8)
        .margin_right(LEGEND_W)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..x_end, 0f64..105f64)?;
    c.configure_mesh()
        .x_desc("seconds since the training job started (1 s = 1 trace minute)")
        .y_desc("% of the GPU")
        .light_line_style(WHITE)
        .draw()?;
    c.draw_series(std::iter::once(Rectangle::new(
        [(p.replay.0, 0.0), (p.replay.1, 105.0)],
        REPLAY.filled(),
    )))?;
    c.draw_series(DashedLineSeries::new(
        [(0.0, p.util_exclusive_pct), (x_end, p.util_exclusive_pct)],
        6,
        4,
        BLACK.stroke_width(1),
    ))?;
    // Stacked: function i's band lies between the sum of the shares before it and that sum
    // plus its own, so equal shares do not hide each other and the top is the total granted.
    // Each poll's value holds until the next poll.
    let polls = p.functions.first().map_or(0, |f| f.share.len());
    let mut base = vec![0.0f64; polls];
    for (i, f) in p.functions.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        let bands: Vec<_> = f
            .share
            .windows(2)
            .zip(base.iter())
            .filter(|(w, _)| w[0].1 > 0.0)
            .map(|(w, b)| {
                Rectangle::new(
                    [(w[0].0, *b), (w[1].0, (*b + w[0].1).min(105.0))],
                    color.mix(0.75).filled(),
                )
            })
            .collect();
        c.draw_series(bands)?;
        for (b, x) in base.iter_mut().zip(&f.share) {
            *b += x.1;
        }
    }
    c.draw_series(LineSeries::new(
        p.util.iter().copied(),
        RGBColor(90, 90, 90).stroke_width(1),
    ))?;
    let mut keys = vec![
        (
            Key::Line(RGBColor(90, 90, 90), 1),
            "GPU utilization (NVML), co-located".to_string(),
        ),
        (
            Key::Dashed(BLACK),
            format!("trainer alone (mean {:.1} %)", p.util_exclusive_pct),
        ),
    ];
    for (i, f) in p.functions.iter().enumerate() {
        let mean = crate::report::mean(f.share.iter().map(|x| x.1));
        keys.push((
            Key::Fill(PALETTE[i % PALETTE.len()]),
            format!("{} share, stacked (mean {:.1} %)", f.name, mean),
        ));
    }
    legend(area, &keys)
}

/// Sums instance shares per function at each poll: `samples` are (seconds, function, share %);
/// polls are the distinct times. A function with no instance at a poll has share 0 there.
pub fn shares_by_function(names: &[&str], samples: &[(f64, &str, f64)]) -> Vec<Vec<(f64, f64)>> {
    let mut polls: Vec<f64> = samples.iter().map(|s| s.0).collect();
    polls.sort_by(f64::total_cmp);
    polls.dedup();
    names
        .iter()
        .map(|n| {
            polls
                .iter()
                .map(|&t| {
                    let sum = samples
                        .iter()
                        .filter(|s| s.0 == t && s.1 == *n)
                        .map(|s| s.2)
                        .sum();
                    (t, sum)
                })
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_are_summed_per_function_and_poll() {
        let s = [
            (1.0, "a", 10.0),
            (1.0, "a", 5.0),
            (1.0, "b", 7.0),
            (2.0, "b", 8.0),
        ];
        let v = shares_by_function(&["a", "b"], &s);
        assert_eq!(v[0], vec![(1.0, 15.0), (2.0, 0.0)]);
        assert_eq!(v[1], vec![(1.0, 7.0), (2.0, 8.0)]);
    }

    #[test]
    fn draws_a_png_from_series() {
        let dir = tempfile::tempdir().unwrap();
        let png = dir.path().join("x.png");
        let row = |name: &str| FunctionRow {
            name: name.into(),
            slo_ms: 9.0,
            requests: (0..300)
                .map(|i| {
                    let t = 2.0 + i as f64 / 30.0;
                    let m = [Mark::Met, Mark::Missed, Mark::Refused][i % 3];
                    (t, 1.0 + (i % 40) as f64, m)
                })
                .collect(),
            share: (2..12).map(|t| (t as f64, 5.0 + t as f64)).collect(),
        };
        let p = PlotInput {
            title: "scenario test — simulated GPU".into(),
            subtitle: "figures".into(),
            functions: vec![row("a"), row("b")],
            iterations: (0..200)
                .map(|i| (i as f64 * 0.06, 60.0 + (i % 7) as f64))
                .collect(),
            iter_alone_ms: 61.0,
            theta_train: 0.1,
            util: (0..48).map(|i| (i as f64 * 0.25, 60.0)).collect(),
            util_exclusive_pct: 58.0,
            replay: (2.0, 12.0),
        };
        draw(&png, &p).unwrap();
        let bytes = std::fs::read(&png).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        // An empty run draws too (no requests, no polls).
        let empty = PlotInput {
            functions: vec![FunctionRow {
                requests: vec![],
                share: vec![],
                ..row("c")
            }],
            iterations: vec![],
            util: vec![],
            ..p
        };
        draw(&png, &empty).unwrap();
    }
}
