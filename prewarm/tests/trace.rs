//! The Azure Functions 2019 trace reader on a small checked-in sample in the real format
//! (`tests/data/azure2019/`: two days, four functions, real column layout, 64-hex hashes), its
//! error messages on malformed files, and the synthetic generator's write/read round trip.
//!
//! Sample contents (hand-written, see the file names' day numbers):
//! - fn-1 (http): day 1 minute 1 → 2, minute 3 → 1, minute 1440 → 5; day 2 minute 2 → 4.
//!   Durations: day 1 average 120 ms over 8 calls, day 2 60 ms over 4 → 100 ms.
//! - fn-2 (timer): one call every 60 minutes (minutes 60, 120, …, 1440) on both days; 35 ms.
//! - fn-3 (queue): day 1 only, 7 calls in minute 720; 2000 ms (its Minimum/Maximum are empty,
//!   as the dataset's notes allow).
//! - fn-4 (event): day 2 only, 3 calls in minute 10; no durations row.

use std::fs;
use std::path::{Path, PathBuf};

use smore_prewarm::synth::{generate, SynthConfig};
use smore_prewarm::trace::{read_trace_dir, write_trace_dir, TraceError, MINUTES_PER_DAY};

fn sample_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/azure2019")
}

/// Copies the sample into a fresh temporary directory so a test can corrupt it.
fn sample_copy() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for e in fs::read_dir(sample_dir()).unwrap() {
        let e = e.unwrap();
        fs::copy(e.path(), dir.path().join(e.file_name())).unwrap();
    }
    dir
}

fn by_prefix<'a>(
    t: &'a smore_prewarm::trace::Trace,
    prefix: &str,
) -> &'a smore_prewarm::trace::FunctionTrace {
    t.functions
        .iter()
        .find(|f| f.key.function.starts_with(prefix))
        .unwrap_or_else(|| panic!("no function {prefix}"))
}

#[test]
fn reads_the_checked_in_sample() {
    let t = read_trace_dir(&sample_dir()).unwrap();
    assert_eq!(t.days, vec![1, 2]);
    assert_eq!(t.minutes(), 2 * MINUTES_PER_DAY);
    assert_eq!(t.functions.len(), 4);
    // Sorted by (owner, app, function).
    assert!(t.functions.windows(2).all(|w| w[0].key < w[1].key));

    let f1 = by_prefix(&t, "66e16dd5");
    assert_eq!(f1.trigger, "http");
    assert_eq!(f1.group(), "http");
    assert_eq!(f1.class, None);
    assert_eq!(f1.counts.len(), 2 * MINUTES_PER_DAY);
    assert_eq!(
        (f1.counts[0], f1.counts[2], f1.counts[1439]),
        (2, 1, 5),
        "day 1 minutes 1, 3, 1440"
    );
    assert_eq!(f1.counts[MINUTES_PER_DAY + 1], 4, "day 2 minute 2");
    assert_eq!(f1.total(), 12);
    // (120·8 + 60·4) / 12 = 100 ms.
    assert_eq!(f1.avg_duration_ms, Some(100.0));

    let f2 = by_prefix(&t, "bd97b255");
    assert_eq!(f2.trigger, "timer");
    assert_eq!(f2.total(), 48);
    assert!(f2
        .counts
        .iter()
        .enumerate()
        .all(|(m, &c)| (c == 1) == ((m + 1) % 60 == 0)));
    assert_eq!(f2.avg_duration_ms, Some(35.0));

    // Missing from day 2: zeros there.
    let f3 = by_prefix(&t, "73f7b5dd");
    assert_eq!((f3.counts[719], f3.total()), (7, 7));
    assert!(f3.counts[MINUTES_PER_DAY..].iter().all(|&c| c == 0));
    assert_eq!(f3.avg_duration_ms, Some(2000.0));

    // Missing from day 1, and from every durations file.
    let f4 = by_prefix(&t, "c0701ba9");
    assert_eq!(f4.trigger, "event");
    assert_eq!((f4.counts[MINUTES_PER_DAY + 9], f4.total()), (3, 3));
    assert_eq!(f4.avg_duration_ms, None);
}

fn parse_error(dir: &Path) -> (String, u64, usize, String) {
    match read_trace_dir(dir).unwrap_err() {
        TraceError::Parse {
            path,
            line,
            column,
            message,
        } => (
            path.file_name().unwrap().to_string_lossy().into_owned(),
            line,
            column,
            message,
        ),
        other => panic!("expected a parse error, got {other}"),
    }
}

#[test]
fn a_bad_count_names_file_line_column_and_value() {
    let dir = sample_copy();
    let p = dir.path().join("invocations_per_function_md.anon.d02.csv");
    let text = fs::read_to_string(&p).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    // Line 3 (second data row), minute 5 → column 4 + 5 = 9.
    let mut fields: Vec<&str> = lines[2].split(',').collect();
    fields[8] = "-1";
    lines[2] = fields.join(",");
    fs::write(&p, lines.join("\n") + "\n").unwrap();
    let (file, line, column, message) = parse_error(dir.path());
    assert_eq!(file, "invocations_per_function_md.anon.d02.csv");
    assert_eq!((line, column), (3, 9));
    assert!(
        message.contains("minute 5") && message.contains("`-1`"),
        "{message}"
    );
    // The Display form carries all of it.
    let shown = read_trace_dir(dir.path()).unwrap_err().to_string();
    assert!(shown.contains("d02.csv:3:9:"), "{shown}");
}

#[test]
fn a_bad_header_names_the_column() {
    let dir = sample_copy();
    let p = dir.path().join("invocations_per_function_md.anon.d01.csv");
    let text =
        fs::read_to_string(&p)
            .unwrap()
            .replacen("HashFunction,Trigger", "HashFunction,Trig", 1);
    fs::write(&p, text).unwrap();
    let (_, line, column, message) = parse_error(dir.path());
    assert_eq!((line, column), (1, 4));
    assert!(message.contains("`Trigger`"), "{message}");
}

#[test]
fn a_short_row_is_reported() {
    let dir = sample_copy();
    let p = dir.path().join("invocations_per_function_md.anon.d01.csv");
    let mut text = fs::read_to_string(&p).unwrap();
    text.push_str("a,b,c,http,1,2,3\n");
    fs::write(&p, text).unwrap();
    let (_, line, _, message) = parse_error(dir.path());
    assert_eq!(line, 5);
    assert!(message.contains("7 fields"), "{message}");
}

#[test]
fn a_bad_duration_is_reported() {
    let dir = sample_copy();
    let p = dir
        .path()
        .join("function_durations_percentiles.anon.d02.csv");
    let text = fs::read_to_string(&p)
        .unwrap()
        .replacen(",60,4,", ",sixty,4,", 1);
    fs::write(&p, text).unwrap();
    let (file, line, column, message) = parse_error(dir.path());
    assert_eq!(file, "function_durations_percentiles.anon.d02.csv");
    assert_eq!((line, column), (2, 4));
    assert!(
        message.contains("Average") && message.contains("sixty"),
        "{message}"
    );
}

#[test]
fn missing_days_and_empty_dirs_are_errors() {
    let dir = sample_copy();
    fs::rename(
        dir.path().join("invocations_per_function_md.anon.d02.csv"),
        dir.path().join("invocations_per_function_md.anon.d03.csv"),
    )
    .unwrap();
    match read_trace_dir(dir.path()).unwrap_err() {
        TraceError::MissingDay { missing, found, .. } => {
            assert_eq!((missing, found), (2, vec![1, 3]));
        }
        other => panic!("{other}"),
    }
    let empty = tempfile::tempdir().unwrap();
    assert!(matches!(
        read_trace_dir(empty.path()).unwrap_err(),
        TraceError::NoInvocationFiles { .. }
    ));
}

#[test]
fn a_function_listed_twice_in_a_day_is_summed() {
    let dir = sample_copy();
    let p = dir.path().join("invocations_per_function_md.anon.d02.csv");
    let text = fs::read_to_string(&p).unwrap();
    // Repeat the fn-4 row (3 calls in minute 10).
    let row = text
        .lines()
        .find(|l| {
            l.split(',')
                .nth(2)
                .is_some_and(|f| f.starts_with("c0701ba9"))
        })
        .unwrap()
        .to_string();
    fs::write(&p, format!("{text}{row}\n")).unwrap();
    let t = read_trace_dir(dir.path()).unwrap();
    assert_eq!(by_prefix(&t, "c0701ba9").counts[MINUTES_PER_DAY + 9], 6);
}

#[test]
fn synthetic_suite_round_trips_through_the_azure_format() {
    let t = generate(&SynthConfig {
        seed: 3,
        days: 2,
        per_class: 2,
    });
    let dir = tempfile::tempdir().unwrap();
    write_trace_dir(&t, dir.path()).unwrap();
    let back = read_trace_dir(dir.path()).unwrap();
    assert_eq!(back, t);
    // Same seed → byte-identical files.
    let dir2 = tempfile::tempdir().unwrap();
    write_trace_dir(
        &generate(&SynthConfig {
            seed: 3,
            days: 2,
            per_class: 2,
        }),
        dir2.path(),
    )
    .unwrap();
    for name in ["invocations_per_function_md.anon.d02.csv", "classes.csv"] {
        assert_eq!(
            fs::read(dir.path().join(name)).unwrap(),
            fs::read(dir2.path().join(name)).unwrap(),
            "{name}"
        );
    }
}
