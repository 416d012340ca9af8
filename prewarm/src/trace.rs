//! Azure Functions 2019 trace format: reading (real or synthetic files) and writing (the synthetic
//! generator's output).
//!
//! Owns: parsing `invocations_per_function_md.anon.dNN.csv` (one file per day, columns
//! `HashOwner,HashApp,HashFunction,Trigger,1,…,1440`), the optional
//! `function_durations_percentiles.anon.dNN.csv` (per-function average duration in ms) and the
//! optional `classes.csv` side file (`HashOwner,HashApp,HashFunction,Class`) that only the synthetic
//! generator writes. Days are concatenated into one per-minute series per function; a function
//! missing from a day counts zero invocations that day.
//!
//! Must never: panic on user input. Every malformed file yields a [`TraceError`] naming the file,
//! the 1-based line and the 1-based column (CSV field) that is wrong.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

/// Minutes in one trace day: the invocation files have exactly 1440 per-minute count columns
/// (Azure Functions 2019 trace schema).
pub const MINUTES_PER_DAY: usize = 1440;

/// The four leading columns of an invocation file (Azure Functions 2019 trace schema).
pub const INVOCATION_KEY_COLUMNS: [&str; 4] = ["HashOwner", "HashApp", "HashFunction", "Trigger"];

/// Everything that can go wrong reading a trace directory.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The file or directory could not be read.
    #[error("{path}: {source}")]
    Io {
        /// File or directory.
        path: PathBuf,
        /// Underlying error.
        source: std::io::Error,
    },
    /// A value or header is malformed.
    #[error("{path}:{line}:{column}: {message}")]
    Parse {
        /// File.
        path: PathBuf,
        /// 1-based line number.
        line: u64,
        /// 1-based column (CSV field) number.
        column: usize,
        /// What is wrong.
        message: String,
    },
    /// No invocation file in the directory.
    #[error("{dir}: no invocations_per_function_md.anon.dNN.csv file found")]
    NoInvocationFiles {
        /// The directory searched.
        dir: PathBuf,
    },
    /// The day files do not form a consecutive range.
    #[error(
        "{dir}: day files are not consecutive: day {missing:02} is missing (found days {found:?})"
    )]
    MissingDay {
        /// The directory searched.
        dir: PathBuf,
        /// The first missing day number.
        missing: u32,
        /// The day numbers found.
        found: Vec<u32>,
    },
}

/// Identity of one function in the trace.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FunctionKey {
    /// `HashOwner` column.
    pub owner: String,
    /// `HashApp` column.
    pub app: String,
    /// `HashFunction` column.
    pub function: String,
}

impl FunctionKey {
    /// A short printable id: the first 8 characters of the function hash.
    pub fn short(&self) -> String {
        self.function.chars().take(8).collect()
    }
}

/// One function's per-minute invocation series over all days of the trace.
#[derive(Debug, Clone, PartialEq)]
pub struct FunctionTrace {
    /// Identity.
    pub key: FunctionKey,
    /// `Trigger` column (http, timer, event, queue, storage, orchestration, others).
    pub trigger: String,
    /// Trace class from `classes.csv` (synthetic traces only).
    pub class: Option<String>,
    /// Invocations per minute, `days × 1440` entries.
    pub counts: Vec<u32>,
    /// Average execution time in ms, count-weighted over the days of the durations files.
    pub avg_duration_ms: Option<f64>,
}

impl FunctionTrace {
    /// The class used to group results: the `classes.csv` label when present, else the trigger.
    pub fn group(&self) -> &str {
        self.class.as_deref().unwrap_or(&self.trigger)
    }

    /// Total invocations.
    pub fn total(&self) -> u64 {
        self.counts.iter().map(|&c| u64::from(c)).sum()
    }
}

/// A whole trace: consecutive days, every function's series has `days.len() × 1440` minutes.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Trace {
    /// Day numbers (the `NN` of `dNN`), consecutive and ascending.
    pub days: Vec<u32>,
    /// Functions, sorted by key.
    pub functions: Vec<FunctionTrace>,
}

impl Trace {
    /// Number of minutes in every series.
    pub fn minutes(&self) -> usize {
        self.days.len() * MINUTES_PER_DAY
    }
}

/// File name of the invocation counts of day `day`.
pub fn invocations_file_name(day: u32) -> String {
    format!("invocations_per_function_md.anon.d{day:02}.csv")
}

/// File name of the duration percentiles of day `day`.
pub fn durations_file_name(day: u32) -> String {
    format!("function_durations_percentiles.anon.d{day:02}.csv")
}

/// Name of the synthetic generator's class side file.
pub const CLASSES_FILE: &str = "classes.csv";

fn day_of(name: &str, prefix: &str) -> Option<u32> {
    let rest = name.strip_prefix(prefix)?.strip_suffix(".csv")?;
    if rest.is_empty() || !rest.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    rest.parse().ok()
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> TraceError + '_ {
    move |source| TraceError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn parse_err(path: &Path, line: u64, column: usize, message: impl Into<String>) -> TraceError {
    TraceError::Parse {
        path: path.to_path_buf(),
        line,
        column,
        message: message.into(),
    }
}

fn csv_err(path: &Path, e: csv::Error) -> TraceError {
    let (line, column) = match e.position() {
        Some(p) => (p.line(), 1),
        None => (0, 0),
    };
    match e.into_kind() {
        csv::ErrorKind::Io(source) => TraceError::Io {
            path: path.to_path_buf(),
            source,
        },
        csv::ErrorKind::UnequalLengths {
            expected_len, len, ..
        } => parse_err(
            path,
            line,
            (len as usize).min(expected_len as usize) + 1,
            format!("row has {len} fields, the header has {expected_len}"),
        ),
        csv::ErrorKind::Utf8 { err, .. } => {
            parse_err(path, line, err.field() + 1, format!("invalid UTF-8: {err}"))
        }
        other => parse_err(path, line, column, format!("{other:?}")),
    }
}

fn reader(path: &Path) -> Result<csv::Reader<fs::File>, TraceError> {
    let file = fs::File::open(path).map_err(io_err(path))?;
    Ok(csv::ReaderBuilder::new()
        .has_headers(true)
        .flexible(false)
        .from_reader(file))
}

/// One day's invocation rows: key → (trigger, 1440 counts).
type DayRows = BTreeMap<FunctionKey, (String, Vec<u32>)>;

/// Reads one `invocations_per_function_md.anon.dNN.csv` file.
pub fn read_invocations_file(path: &Path) -> Result<DayRows, TraceError> {
    let mut rdr = reader(path)?;
    let headers = rdr.headers().map_err(|e| csv_err(path, e))?.clone();
    if headers.len() != INVOCATION_KEY_COLUMNS.len() + MINUTES_PER_DAY {
        return Err(parse_err(
            path,
            1,
            headers.len().min(INVOCATION_KEY_COLUMNS.len() + MINUTES_PER_DAY) + 1,
            format!(
                "header has {} columns, expected {} (HashOwner,HashApp,HashFunction,Trigger,1..1440)",
                headers.len(),
                INVOCATION_KEY_COLUMNS.len() + MINUTES_PER_DAY
            ),
        ));
    }
    for (i, want) in INVOCATION_KEY_COLUMNS.iter().enumerate() {
        if &headers[i] != *want {
            return Err(parse_err(
                path,
                1,
                i + 1,
                format!("header column is `{}`, expected `{want}`", &headers[i]),
            ));
        }
    }
    for m in 0..MINUTES_PER_DAY {
        let col = INVOCATION_KEY_COLUMNS.len() + m;
        if headers[col] != *(m + 1).to_string() {
            return Err(parse_err(
                path,
                1,
                col + 1,
                format!("header column is `{}`, expected `{}`", &headers[col], m + 1),
            ));
        }
    }
    let mut rows = DayRows::new();
    let mut record = csv::StringRecord::new();
    loop {
        match rdr.read_record(&mut record) {
            Ok(false) => break,
            Ok(true) => {}
            Err(e) => return Err(csv_err(path, e)),
        }
        let line = record.position().map_or(0, |p| p.line());
        for (i, name) in INVOCATION_KEY_COLUMNS.iter().enumerate() {
            if record[i].trim().is_empty() {
                return Err(parse_err(path, line, i + 1, format!("empty {name}")));
            }
        }
        let key = FunctionKey {
            owner: record[0].to_string(),
            app: record[1].to_string(),
            function: record[2].to_string(),
        };
        let trigger = record[3].to_string();
        let mut counts = Vec::with_capacity(MINUTES_PER_DAY);
        for m in 0..MINUTES_PER_DAY {
            let col = INVOCATION_KEY_COLUMNS.len() + m;
            let field = record[col].trim();
            let v: u32 = field.parse().map_err(|_| {
                parse_err(
                    path,
                    line,
                    col + 1,
                    format!(
                        "minute {} count `{field}` is not a non-negative integer",
                        m + 1
                    ),
                )
            })?;
            counts.push(v);
        }
        // A key listed twice in one day is tolerated rather than fatal on files we did not write
        // (a multi-gigabyte real trace should not fail on one odd row): the rows are one
        // function, their counts are summed and the first trigger is kept.
        if let Some((_, prev)) = rows.get_mut(&key) {
            tracing::warn!(
                file = %path.display(),
                line,
                function = %key.function,
                "function listed twice in one day; summing its counts"
            );
            for (p, c) in prev.iter_mut().zip(&counts) {
                *p = p.saturating_add(*c);
            }
            continue;
        }
        rows.insert(key, (trigger, counts));
    }
    Ok(rows)
}

/// Reads one `function_durations_percentiles.anon.dNN.csv` file: key → (average ms, count).
/// Only the `HashOwner`, `HashApp`, `HashFunction`, `Average` and `Count` columns are used; they
/// are found by name, so the percentile columns may be in any order or absent.
pub fn read_durations_file(path: &Path) -> Result<BTreeMap<FunctionKey, (f64, f64)>, TraceError> {
    let mut rdr = reader(path)?;
    let headers = rdr.headers().map_err(|e| csv_err(path, e))?.clone();
    let find = |name: &str| -> Result<usize, TraceError> {
        headers.iter().position(|h| h == name).ok_or_else(|| {
            parse_err(
                path,
                1,
                headers.len() + 1,
                format!("missing column `{name}`"),
            )
        })
    };
    let (io, ia, ifn, iavg, icnt) = (
        find("HashOwner")?,
        find("HashApp")?,
        find("HashFunction")?,
        find("Average")?,
        find("Count")?,
    );
    let mut out = BTreeMap::new();
    let mut record = csv::StringRecord::new();
    loop {
        match rdr.read_record(&mut record) {
            Ok(false) => break,
            Ok(true) => {}
            Err(e) => return Err(csv_err(path, e)),
        }
        let line = record.position().map_or(0, |p| p.line());
        let num = |i: usize, what: &str| -> Result<f64, TraceError> {
            let f = record[i].trim();
            match f.parse::<f64>() {
                Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
                _ => Err(parse_err(
                    path,
                    line,
                    i + 1,
                    format!("{what} `{f}` is not a non-negative number"),
                )),
            }
        };
        let avg = num(iavg, "Average")?;
        let cnt = num(icnt, "Count")?;
        let key = FunctionKey {
            owner: record[io].to_string(),
            app: record[ia].to_string(),
            function: record[ifn].to_string(),
        };
        // A key listed twice: combine into the count-weighted average, like days are combined.
        let e = out.entry(key).or_insert((0.0, 0.0));
        let (s, n) = (e.0 * e.1 + avg * cnt, e.1 + cnt);
        *e = (if n > 0.0 { s / n } else { avg }, n);
    }
    Ok(out)
}

/// Reads `classes.csv` (`HashOwner,HashApp,HashFunction,Class`).
pub fn read_classes_file(path: &Path) -> Result<BTreeMap<FunctionKey, String>, TraceError> {
    let mut rdr = reader(path)?;
    let headers = rdr.headers().map_err(|e| csv_err(path, e))?.clone();
    let want = ["HashOwner", "HashApp", "HashFunction", "Class"];
    for (i, w) in want.iter().enumerate() {
        if headers.get(i) != Some(*w) {
            return Err(parse_err(
                path,
                1,
                i + 1,
                format!("expected header column `{w}`"),
            ));
        }
    }
    let mut out = BTreeMap::new();
    for rec in rdr.records() {
        let rec = rec.map_err(|e| csv_err(path, e))?;
        out.insert(
            FunctionKey {
                owner: rec[0].to_string(),
                app: rec[1].to_string(),
                function: rec[2].to_string(),
            },
            rec[3].to_string(),
        );
    }
    Ok(out)
}

fn list_days(dir: &Path, prefix: &str) -> Result<Vec<(u32, PathBuf)>, TraceError> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_err(dir))? {
        let entry = entry.map_err(io_err(dir))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(day) = day_of(name, prefix) {
            out.push((day, entry.path()));
        }
    }
    out.sort();
    Ok(out)
}

/// Reads a trace directory: every `invocations_per_function_md.anon.dNN.csv` (consecutive days),
/// the matching `function_durations_percentiles.anon.dNN.csv` files when present, and
/// `classes.csv` when present.
pub fn read_trace_dir(dir: &Path) -> Result<Trace, TraceError> {
    let inv = list_days(dir, "invocations_per_function_md.anon.d")?;
    if inv.is_empty() {
        return Err(TraceError::NoInvocationFiles {
            dir: dir.to_path_buf(),
        });
    }
    let found: Vec<u32> = inv.iter().map(|(d, _)| *d).collect();
    for w in found.windows(2) {
        if w[1] != w[0] + 1 {
            return Err(TraceError::MissingDay {
                dir: dir.to_path_buf(),
                missing: w[0] + 1,
                found: found.clone(),
            });
        }
    }
    let n_days = inv.len();
    let mut series: BTreeMap<FunctionKey, (String, Vec<u32>)> = BTreeMap::new();
    for (di, (_, path)) in inv.iter().enumerate() {
        for (key, (trigger, counts)) in read_invocations_file(path)? {
            let entry = series
                .entry(key)
                .or_insert_with(|| (trigger, vec![0; n_days * MINUTES_PER_DAY]));
            entry.1[di * MINUTES_PER_DAY..(di + 1) * MINUTES_PER_DAY].copy_from_slice(&counts);
        }
    }
    // Count-weighted average duration over the days that have a durations file.
    let mut dur: BTreeMap<FunctionKey, (f64, f64)> = BTreeMap::new();
    for (day, path) in list_days(dir, "function_durations_percentiles.anon.d")? {
        if !found.contains(&day) {
            continue;
        }
        for (key, (avg, cnt)) in read_durations_file(&path)? {
            let e = dur.entry(key).or_insert((0.0, 0.0));
            let w = cnt.max(1.0);
            e.0 += avg * w;
            e.1 += w;
        }
    }
    let classes_path = dir.join(CLASSES_FILE);
    let classes = if classes_path.exists() {
        read_classes_file(&classes_path)?
    } else {
        BTreeMap::new()
    };
    let functions = series
        .into_iter()
        .map(|(key, (trigger, counts))| {
            let avg_duration_ms = dur.get(&key).filter(|(_, w)| *w > 0.0).map(|(s, w)| s / w);
            let class = classes.get(&key).cloned();
            FunctionTrace {
                key,
                trigger,
                class,
                counts,
                avg_duration_ms,
            }
        })
        .collect();
    Ok(Trace {
        days: found,
        functions,
    })
}

/// Writes `trace` into `dir` in the Azure format: one invocation file and one durations file per
/// day, plus `classes.csv` when any function carries a class.
pub fn write_trace_dir(trace: &Trace, dir: &Path) -> anyhow::Result<()> {
    use anyhow::Context;
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for (di, &day) in trace.days.iter().enumerate() {
        let path = dir.join(invocations_file_name(day));
        let mut w = csv::Writer::from_path(&path)
            .with_context(|| format!("creating {}", path.display()))?;
        let mut header: Vec<String> = INVOCATION_KEY_COLUMNS
            .iter()
            .map(|s| s.to_string())
            .collect();
        header.extend((1..=MINUTES_PER_DAY).map(|m| m.to_string()));
        w.write_record(&header)?;
        let dpath = dir.join(durations_file_name(day));
        let mut dw = csv::Writer::from_path(&dpath)
            .with_context(|| format!("creating {}", dpath.display()))?;
        dw.write_record([
            "HashOwner",
            "HashApp",
            "HashFunction",
            "Average",
            "Count",
            "Minimum",
            "Maximum",
            "percentile_Average_0",
            "percentile_Average_1",
            "percentile_Average_25",
            "percentile_Average_50",
            "percentile_Average_75",
            "percentile_Average_99",
            "percentile_Average_100",
        ])?;
        for f in &trace.functions {
            let day_counts = &f.counts[di * MINUTES_PER_DAY..(di + 1) * MINUTES_PER_DAY];
            let total: u64 = day_counts.iter().map(|&c| u64::from(c)).sum();
            // The real trace lists only functions invoked that day; keep that property.
            if total == 0 {
                continue;
            }
            let mut row = vec![
                f.key.owner.clone(),
                f.key.app.clone(),
                f.key.function.clone(),
                f.trigger.clone(),
            ];
            row.extend(day_counts.iter().map(|c| c.to_string()));
            w.write_record(&row)?;
            if let Some(avg) = f.avg_duration_ms {
                // Synthetic percentiles: a fixed spread around the average (documented in docs/prewarm.md);
                // only Average and Count are read back.
                let p = |x: f64| format!("{:.0}", (avg * x).max(1.0));
                dw.write_record([
                    f.key.owner.clone(),
                    f.key.app.clone(),
                    f.key.function.clone(),
                    format!("{avg:.0}"),
                    total.to_string(),
                    p(0.5),
                    p(3.0),
                    p(0.5),
                    p(0.55),
                    p(0.8),
                    p(0.95),
                    p(1.15),
                    p(2.5),
                    p(3.0),
                ])?;
            }
        }
        w.flush()?;
        dw.flush()?;
    }
    if trace.functions.iter().any(|f| f.class.is_some()) {
        let path = dir.join(CLASSES_FILE);
        let mut w = csv::Writer::from_path(&path)
            .with_context(|| format!("creating {}", path.display()))?;
        w.write_record(["HashOwner", "HashApp", "HashFunction", "Class"])?;
        for f in &trace.functions {
            if let Some(c) = &f.class {
                w.write_record([&f.key.owner, &f.key.app, &f.key.function, c])?;
            }
        }
        w.flush()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn day_numbers_parse_only_the_real_pattern() {
        let p = "invocations_per_function_md.anon.d";
        assert_eq!(
            day_of("invocations_per_function_md.anon.d07.csv", p),
            Some(7)
        );
        assert_eq!(
            day_of("invocations_per_function_md.anon.d14.csv", p),
            Some(14)
        );
        assert_eq!(day_of("invocations_per_function_md.anon.dxx.csv", p), None);
        assert_eq!(
            day_of("invocations_per_function_md.anon.d07.csv.bak", p),
            None
        );
    }
}
