//! PNG plots of a suite: forecast vs actual for chosen functions, and cold-start vs waste per
//! policy (the Pareto view), per class and overall.
//!
//! Text is rendered with plotters' `ab_glyph` backend from DejaVu Sans bytes compiled into the
//! binary (the `dejavu` crate), so no system font, fontconfig or freetype is needed.
//!
//! Must never: fail the simulation because a plot could not be drawn — callers log the error.

use std::path::Path;
use std::sync::Once;

use anyhow::{anyhow, Result};
use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::suite::SuiteResult;
use crate::trace::Trace;

static FONT: Once = Once::new();

fn register_font() {
    FONT.call_once(|| {
        if plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular())
            .is_err()
        {
            tracing::warn!("could not register the embedded DejaVu font; plot text may be missing");
        }
    });
}

fn e<E: std::fmt::Display>(err: E) -> anyhow::Error {
    anyhow!("plot: {err}")
}

const COLORS: [RGBColor; 8] = [
    RGBColor(214, 39, 40),
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(127, 127, 127),
    RGBColor(23, 190, 207),
];

/// Cold-start rate (y) against waste rate (x), one point per policy, one panel per class plus
/// "all".
pub fn pareto(suite: &SuiteResult, path: &Path) -> Result<()> {
    register_font();
    let groups = suite.groups();
    let cols = 3usize;
    let rows = groups.len().div_ceil(cols);
    let root = BitMapBackend::new(path, (1200, 380 * rows as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(e)?;
    let panels = root.split_evenly((rows, cols));
    for (gi, g) in groups.iter().enumerate() {
        let area = &panels[gi];
        let pts: Vec<(String, f64, f64)> = suite
            .policies
            .iter()
            .filter_map(|p| {
                let a = if g == "all" {
                    Some(&p.overall)
                } else {
                    p.per_group.get(g)
                };
                a.map(|a| (p.policy.clone(), 100.0 * a.waste_rate, 100.0 * a.cold_rate))
            })
            .collect();
        let ymax = pts.iter().map(|p| p.2).fold(1.0f64, f64::max) * 1.15;
        let mut chart = ChartBuilder::on(area)
            .caption(format!("{g}: cold start vs waste"), ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(45)
            .build_cartesian_2d(0.0f64..100.0, 0.0f64..ymax)
            .map_err(e)?;
        chart
            .configure_mesh()
            .x_desc("waste rate %")
            .y_desc("cold-start rate %")
            .label_style(("sans-serif", 12))
            .draw()
            .map_err(e)?;
        for (i, (name, x, y)) in pts.iter().enumerate() {
            let c = COLORS[i % COLORS.len()];
            chart
                .draw_series(std::iter::once(Circle::new((*x, *y), 5, c.filled())))
                .map_err(e)?;
            chart
                .draw_series(std::iter::once(Text::new(
                    name.clone(),
                    (*x + 1.0, *y + ymax * 0.02),
                    ("sans-serif", 12).into_font().color(&c),
                )))
                .map_err(e)?;
        }
    }
    root.present().map_err(e)?;
    Ok(())
}

/// Forecast vs actual for the functions in `indices` over the first `span` scored minutes, one
/// panel each. `policy` names the forecasting policy whose recorded forecasts are drawn.
pub fn forecasts(
    suite: &SuiteResult,
    trace: &Trace,
    policy: &str,
    indices: &[usize],
    span: usize,
    path: &Path,
) -> Result<()> {
    register_font();
    let Some(p) = suite.policies.iter().find(|p| p.policy == policy) else {
        return Err(anyhow!("policy {policy} was not simulated"));
    };
    let panels_n = indices.len().max(1);
    let root = BitMapBackend::new(path, (1200, 260 * panels_n as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(e)?;
    let panels = root.split_evenly((panels_n, 1));
    for (k, &i) in indices.iter().enumerate() {
        let f = &trace.functions[i];
        let Some(row) = p.rows.iter().find(|r| r.index == i) else {
            continue;
        };
        let actual: Vec<f64> = f.counts[suite.score_from..]
            .iter()
            .take(span)
            .map(|&c| f64::from(c))
            .collect();
        let fc: Vec<(usize, f64)> = row
            .result
            .forecasts
            .iter()
            .take(span)
            .enumerate()
            .filter_map(|(t, v)| v.map(|v| (t, v)))
            .collect();
        let ymax = actual
            .iter()
            .copied()
            .chain(fc.iter().map(|x| x.1))
            .fold(1.0f64, f64::max)
            * 1.1;
        let mut chart = ChartBuilder::on(&panels[k])
            .caption(
                format!(
                    "{} ({}): actual (black) vs {policy} forecast (red)",
                    f.key.short(),
                    f.group()
                ),
                ("sans-serif", 16),
            )
            .margin(8)
            .x_label_area_size(30)
            .y_label_area_size(45)
            .build_cartesian_2d(0usize..actual.len().max(1), 0.0f64..ymax)
            .map_err(e)?;
        chart
            .configure_mesh()
            .x_desc("scored minute")
            .y_desc("requests/min")
            .label_style(("sans-serif", 12))
            .draw()
            .map_err(e)?;
        chart
            .draw_series(LineSeries::new(
                actual.iter().enumerate().map(|(t, &v)| (t, v)),
                &BLACK,
            ))
            .map_err(e)?;
        chart
            .draw_series(LineSeries::new(fc.iter().copied(), &COLORS[0]))
            .map_err(e)?;
    }
    root.present().map_err(e)?;
    Ok(())
}
