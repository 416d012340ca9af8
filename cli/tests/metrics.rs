//! `/metrics` of a live arbiter under hostile function names parses under a strict OpenMetrics
//! grammar (below) and follows the Prometheus naming conventions `promtool check metrics`
//! enforces: base units, `_total` counters, histograms for latency, `smore_build_info`, no
//! `instance` label, no per-instance-id labels.

use smore_e2e::{registration, wait_until, Arbiter, SimGpu, MANY_GRANTS_PER_PROCESS};
use smore_protocol::wire::{Reply, Request};
use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::time::Duration;

/// One sample: metric name, labels (unescaped), value.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

fn is_name(s: &str, colon: bool) -> bool {
    let mut c = s.chars();
    c.next()
        .is_some_and(|f| f.is_ascii_alphabetic() || f == '_' || (colon && f == ':'))
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_' || (colon && x == ':'))
}

/// Parses `{a="x",b="y"}` (after the name) into labels, returning the rest of the line.
fn parse_labels(mut s: &str) -> Result<(BTreeMap<String, String>, &str), String> {
    let mut labels = BTreeMap::new();
    let Some(r) = s.strip_prefix('{') else {
        return Ok((labels, s));
    };
    s = r;
    if let Some(r) = s.strip_prefix('}') {
        return Ok((labels, r));
    }
    loop {
        let eq = s.find('=').ok_or("label without =")?;
        let name = &s[..eq];
        if !is_name(name, false) {
            return Err(format!("bad label name {name:?}"));
        }
        s = s[eq + 1..]
            .strip_prefix('"')
            .ok_or("label value not quoted")?;
        let mut value = String::new();
        let mut chars = s.char_indices();
        let end = loop {
            match chars.next().ok_or("unterminated label value")? {
                (i, '"') => break i,
                (_, '\\') => match chars.next().ok_or("dangling escape")?.1 {
                    '\\' => value.push('\\'),
                    '"' => value.push('"'),
                    'n' => value.push('\n'),
                    e => return Err(format!("bad escape \\{e}")),
                },
                (_, '\n') => return Err("raw newline in a label value".into()),
                (_, c) => value.push(c),
            }
        };
        if labels.insert(name.to_owned(), value).is_some() {
            return Err(format!("duplicate label {name}"));
        }
        s = &s[end + 1..];
        if let Some(r) = s.strip_prefix(',') {
            s = r;
        } else if let Some(r) = s.strip_prefix('}') {
            return Ok((labels, r));
        } else {
            return Err(format!("expected , or }} at {s:?}"));
        }
    }
}

fn parse_value(v: &str) -> Result<f64, String> {
    match v {
        "+Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        _ => v.parse().map_err(|_| format!("bad value {v:?}")),
    }
}

/// Strict OpenMetrics text: every sample belongs to the family declared by the `# TYPE` above
/// it (with the suffixes its type allows), descriptors come before samples, `# EOF` ends it.
/// Returns the samples and each family's type.
fn parse(text: &str) -> Result<(Vec<Sample>, HashMap<String, String>), String> {
    let mut samples = Vec::new();
    let mut types: HashMap<String, String> = HashMap::new();
    let mut family: Option<(String, String)> = None;
    let mut eof = false;
    for (n, line) in text.split('\n').enumerate() {
        let ctx = |e: String| format!("line {}: {e}: {line:?}", n + 1);
        if eof {
            if line.is_empty() {
                continue;
            }
            return Err(ctx("content after # EOF".into()));
        }
        if line == "# EOF" {
            eof = true;
            continue;
        }
        if let Some(rest) = line.strip_prefix("# ") {
            let mut parts = rest.splitn(3, ' ');
            let (kind, name) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            let arg = parts.next().unwrap_or("");
            if !is_name(name, true) {
                return Err(ctx(format!("bad metric name {name:?}")));
            }
            match kind {
                "TYPE" => {
                    if !["counter", "gauge", "histogram", "info", "unknown"].contains(&arg) {
                        return Err(ctx(format!("bad type {arg:?}")));
                    }
                    if types.insert(name.into(), arg.into()).is_some() {
                        return Err(ctx("family declared twice".into()));
                    }
                    family = Some((name.into(), arg.into()));
                }
                "HELP" | "UNIT" => {}
                _ => return Err(ctx(format!("unknown descriptor {kind:?}"))),
            }
            continue;
        }
        let end = line
            .find(['{', ' '])
            .ok_or_else(|| ctx("sample without value".into()))?;
        let name = &line[..end];
        let (labels, rest) = parse_labels(&line[end..]).map_err(ctx)?;
        let value = rest
            .strip_prefix(' ')
            .ok_or_else(|| ctx("no space before the value".into()))?;
        let value = parse_value(value).map_err(ctx)?;
        let Some((fam, ty)) = &family else {
            return Err(ctx("sample before any # TYPE".into()));
        };
        let suffixes: &[&str] = match ty.as_str() {
            "counter" => &["_total", "_created"],
            "histogram" => &["_bucket", "_sum", "_count", "_created"],
            "info" => &["_info"],
            _ => &[""],
        };
        if !suffixes.iter().any(|s| name == format!("{fam}{s}")) {
            return Err(ctx(format!(
                "sample {name} outside its family {fam} ({ty})"
            )));
        }
        samples.push(Sample {
            name: name.into(),
            labels,
            value,
        });
    }
    if !eof {
        return Err("no # EOF".into());
    }
    Ok((samples, types))
}

fn scrape(port: u16) -> (String, String) {
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    conn.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut resp = String::new();
    conn.read_to_string(&mut resp).unwrap();
    let (head, body) = resp.split_once("\r\n\r\n").expect("an HTTP response");
    (head.to_owned(), body.to_owned())
}

const HOSTILE: [&str; 4] = [
    "C:\\temp\"x",
    "line\nbreak",
    "brace} ,x=\"y\" 1\n# EOF",
    "ünïcödé 🚀",
];

#[test]
fn metrics_parse_under_hostile_function_names_and_follow_the_conventions() {
    let sim = SimGpu::exact(1, "16GiB");
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let arb = Arbiter::new(
        &sim,
        &format!("metrics_addr = \"127.0.0.1:{port}\"\n{MANY_GRANTS_PER_PROCESS}"),
    );
    let mut conns = Vec::new();
    for (i, name) in HOSTILE.iter().enumerate() {
        let c = arb.client();
        let (reply, page) = c
            .call_with_fd(registration(name, None, 50.0, 256 << 20))
            .unwrap();
        assert!(matches!(reply, Reply::Granted(_)), "{name:?}: {reply:?}");
        // Latencies 5 ms and 30 ms (+ one invalid, skipped), 2 requests counted.
        let r = c
            .call(Request::Report {
                latencies_ms: vec![5.0, 30.0, -1.0],
                used_bytes: None,
                throttled_ns: Some(1_500_000_000 * (i as u64 + 1)),
                refusals: Some(i as u64),
                gpu_ns: None,
                contention_ns: None,
                deferred_ns: None,
                turn_waited_ns: None,
                turn_cut_ins: None,
                measured_contention_ns: None,
                contention_ahead_ns: None,
                contention_shared: None,
                raw_shared: None,
            })
            .unwrap();
        assert!(matches!(r, Reply::Ok), "{r:?}");
        conns.push((c, page));
    }
    wait_until("requests counted", Duration::from_secs(10), || {
        arb.functions().len() == HOSTILE.len()
    });
    let (head, body) = scrape(port);
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/openmetrics-text"),
        "{head}"
    );
    let (samples, types) = parse(&body).unwrap_or_else(|e| panic!("{e}\n{body}"));

    // Conventions.
    for (fam, ty) in &types {
        assert!(fam.starts_with("smore_"), "{fam}");
        for bad in ["_ms", "_percent", "_p99", "_milliseconds"] {
            assert!(!fam.contains(bad), "{fam}: not a base unit");
        }
        if ty != "counter" {
            assert!(
                !fam.ends_with("_total"),
                "{fam} is a {ty} named like a counter"
            );
        }
    }
    for s in &samples {
        assert!(!s.labels.contains_key("instance"), "{s:?}");
        assert!(!s.labels.contains_key("id"), "{s:?}");
        if s.name.ends_with("_ratio") {
            assert!((0.0..=1.0).contains(&s.value), "ratio out of 0..1: {s:?}");
        }
    }
    // Every family the exposition had before, in base units.
    for fam in [
        "smore_gpu_memory_total_bytes",
        "smore_gpu_memory_used_bytes",
        "smore_gpu_training_memory_bytes",
        "smore_gpu_granted_memory_bytes",
        "smore_gpu_utilization_ratio",
        "smore_gpu_training_processes",
        "smore_gpu_training_slowdown_bound_ratio",
        "smore_gpu_collision_budget_ratio",
        "smore_gpu_collision_training_share_ratio",
        "smore_function_memory_cap_bytes",
        "smore_function_memory_used_bytes",
        "smore_function_sm_share_ratio",
        "smore_function_sm_used_ratio",
        "smore_function_collision_budget_ratio",
        "smore_function_collision_used_ratio",
        "smore_gpu_training_peak_memory_bytes",
        "smore_gpu_training_headroom_bytes",
        "smore_gpu_reclaim_line_bytes",
        "smore_gpu_admission_held",
        "smore_build_info",
    ] {
        assert_eq!(
            types.get(fam).map(String::as_str),
            Some("gauge"),
            "{fam}\n{body}"
        );
    }
    for fam in [
        "smore_function_throttled_seconds",
        "smore_function_refusals",
        "smore_function_requests",
        "smore_registrations",
        "smore_refusals",
        "smore_releases",
        "smore_watchdog_actions",
        "smore_admitted_requests",
        "smore_deferred_requests",
        "smore_growth_events",
        "smore_reclaims",
        "smore_caps_lowered",
        "smore_reclaim_lowered_bytes",
        "smore_preemptions",
        "smore_preempt_kills",
        "smore_preempted_requests",
        "smore_held_refusals",
    ] {
        assert_eq!(
            types.get(fam).map(String::as_str),
            Some("counter"),
            "{fam}\n{body}"
        );
    }
    assert_eq!(
        types
            .get("smore_function_request_duration_seconds")
            .map(String::as_str),
        Some("histogram"),
        "{body}"
    );
    let one = |name: &str, function: &str| -> f64 {
        let v: Vec<&Sample> = samples
            .iter()
            .filter(|s| {
                s.name == name && s.labels.get("function").map(String::as_str) == Some(function)
            })
            .collect();
        assert_eq!(v.len(), 1, "{name} {function:?}: {v:?}\n{body}");
        v[0].value
    };
    let build: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.name == "smore_build_info")
        .collect();
    assert_eq!(build.len(), 1, "{body}");
    assert_eq!(build[0].value, 1.0);
    assert_eq!(build[0].labels["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(
        samples
            .iter()
            .find(|s| s.name == "smore_registrations_total")
            .unwrap()
            .value,
        HOSTILE.len() as f64
    );

    // Each hostile name round-trips exactly through the escaping, in every per-function family.
    for (i, name) in HOSTILE.iter().enumerate() {
        assert_eq!(
            one("smore_function_memory_cap_bytes", name),
            (256u64 << 20) as f64
        );
        assert_eq!(one("smore_function_instances", name), 1.0);
        assert_eq!(
            one("smore_function_throttled_seconds_total", name),
            1.5 * (i as f64 + 1.0)
        );
        assert_eq!(one("smore_function_refusals_total", name), i as f64);
        assert_eq!(one("smore_function_requests_total", name), 2.0);
        // The histogram: 2 valid latencies, 35 ms in all; 5 ms falls in le=0.008, 30 ms does not.
        assert_eq!(
            one("smore_function_request_duration_seconds_count", name),
            2.0
        );
        assert!((one("smore_function_request_duration_seconds_sum", name) - 0.035).abs() < 1e-9);
        let buckets: Vec<(f64, f64)> = samples
            .iter()
            .filter(|s| {
                s.name == "smore_function_request_duration_seconds_bucket"
                    && s.labels.get("function").map(String::as_str) == Some(*name)
            })
            .map(|s| (parse_value(&s.labels["le"]).unwrap(), s.value))
            .collect();
        assert!(
            buckets
                .windows(2)
                .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1),
            "{buckets:?}"
        );
        assert_eq!(buckets.last().unwrap(), &(f64::INFINITY, 2.0));
        let at = |le: f64| buckets.iter().find(|b| b.0 == le).unwrap().1;
        assert_eq!(at(0.008), 1.0, "{buckets:?}");
        assert_eq!(at(0.032), 2.0, "{buckets:?}");
    }
    drop(conns);
}

#[test]
fn the_strict_grammar_rejects_what_broke_the_old_exposition() {
    // The hand-written exposition's output for a function named `C:\temp"x` and one with a newline.
    let broken = [
        "# TYPE smore_function_memory_cap_bytes gauge\nsmore_function_memory_cap_bytes{function=\"C:\\temp'x\"} 1\n# EOF\n",
        "# TYPE smore_function_memory_cap_bytes gauge\nsmore_function_memory_cap_bytes{function=\"a\nb\"} 1\n# EOF\n",
        "# TYPE smore_registrations counter\nsmore_registrations 1\n# EOF\n",
        "# TYPE x gauge\nx 1\n",
    ];
    for b in broken {
        assert!(parse(b).is_err(), "{b:?}");
    }
    assert!(parse("# TYPE x gauge\nx{a=\"\\\\ \\\" \\n\"} 1.5\n# EOF\n").is_ok());
}
