//! The operator's side of `smore`: inputs refused before anything is registered, exit codes when
//! the arbiter is down, the status formats and filters, `smore top` without a terminal, the
//! daemon's log formats, completions, the man page and `--version` (docs/cli.md).

use smore_e2e::{Arbiter, SimGpu};
use std::process::{Command, Output};

const SMORE: &str = env!("CARGO_BIN_EXE_smore");

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `smore run … -- <command>` under `arb`, with the shim; the output.
fn run(arb: &Arbiter, args: &[&str], command: &[&str]) -> Output {
    arb.smore()
        .arg("run")
        .args(args)
        .arg("--shim")
        .arg(smore_e2e::shim_lib())
        .arg("--")
        .args(command)
        .output()
        .unwrap()
}

/// Runs `smore run` with `args`, expects it refused with a message containing `says`, and
/// checks the arbiter registered nothing.
fn assert_refused_before_registering(args: &[&str], command: &[&str], says: &str) {
    let sim = SimGpu::exact(1, "16GiB");
    let arb = Arbiter::new(&sim, "");
    let out = run(&arb, args, command);
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{args:?} was accepted: {err}");
    assert!(err.contains(says), "{args:?}: {err}");
    assert_eq!(
        arb.status()["counters"]["registrations"],
        0,
        "{args:?}: nothing registered"
    );
}

#[test]
fn a_memory_without_a_unit_is_refused() {
    assert_refused_before_registering(&["--memory", "0.5"], &["true"], "fraction of a byte");
}

#[test]
fn a_memory_below_one_mib_is_refused() {
    assert_refused_before_registering(&["--memory", "512"], &["true"], "1 MiB smallest cap");
}

#[test]
fn a_nan_slo_is_refused() {
    assert_refused_before_registering(&["--slo", "nan"], &["true"], "not a latency objective");
}

#[test]
fn an_infinite_slo_is_refused() {
    assert_refused_before_registering(&["--slo", "inf"], &["true"], "not a latency objective");
}

#[test]
fn an_absurd_slo_is_refused() {
    assert_refused_before_registering(&["--slo", "1e12"], &["true"], "not a latency objective");
}

#[test]
fn a_command_that_does_not_exist_is_refused_before_registering() {
    assert_refused_before_registering(
        &["--memory", "64MiB"],
        &["/nonexistent/serve"],
        "nothing was registered",
    );
    let sim = SimGpu::exact(1, "16GiB");
    let arb = Arbiter::new(&sim, "");
    let out = run(&arb, &[], &["no-such-command-smore-test"]);
    assert_eq!(out.status.code(), Some(127), "{}", text(&out.stderr));
    assert_eq!(arb.status()["counters"]["registrations"], 0);
}

#[test]
fn a_kubernetes_quantity_is_a_memory_size() {
    let sim = SimGpu::exact(1, "16GiB");
    let arb = Arbiter::new(&sim, "");
    let out = run(&arb, &["--memory", "512Mi"], &["true"]);
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("cap 512MiB"), "{err}");
}

#[test]
fn a_hami_limit_in_the_environment_is_reported_as_ignored() {
    let sim = SimGpu::exact(1, "16GiB");
    let arb = Arbiter::new(&sim, "");
    let out = arb
        .smore()
        .env("CUDA_DEVICE_MEMORY_LIMIT", "4g")
        .args(["run", "--memory", "64MiB", "--shim"])
        .arg(smore_e2e::shim_lib())
        .args(["--", "true"])
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("CUDA_DEVICE_MEMORY_LIMIT=4g is set but ignored"),
        "{err}"
    );
}

#[test]
fn status_and_share_exit_69_when_the_arbiter_is_down() {
    for args in [
        vec!["status"],
        vec!["status", "--format", "csv"],
        vec!["share", "1", "30"],
    ] {
        let out = Command::new(SMORE)
            .args(&args)
            .args(["--socket", "/nonexistent/smore.sock"])
            .output()
            .unwrap();
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(69), "{args:?}: {err}");
        assert!(err.contains("is `smore arbiter` running?"), "{err}");
    }
}

#[test]
fn top_refuses_an_interval_that_is_not_a_period() {
    for bad in ["inf", "nan", "0", "-1"] {
        let out = Command::new(SMORE)
            .args(["top", "--count", "1", &format!("--interval={bad}")])
            .args(["--socket", "/nonexistent/smore.sock"])
            .output()
            .unwrap();
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {err}");
        assert!(
            err.contains("not a refresh period") || err.contains("not a number"),
            "{bad}: {err}"
        );
        assert!(!err.contains("panicked"), "{bad}: {err}");
    }
}

#[test]
fn top_without_a_terminal_prints_plain_text() {
    let sim = SimGpu::exact(2, "16GiB");
    let arb = Arbiter::new(&sim, "");
    let out = arb
        .smore()
        .args(["top", "--count", "2", "--interval", "0.1"])
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!stdout.contains('\x1b'), "escape codes in: {stdout:?}");
    assert_eq!(stdout.matches("smore arbiter").count(), 2, "{stdout}");
}

#[test]
fn status_formats_and_the_gpu_filter() {
    let sim = SimGpu::exact(2, "16GiB");
    let arb = Arbiter::new(&sim, "");
    let mut holder = sim.spawn_memory_holder(1, "1GiB");
    arb.wait_for_training(1, std::time::Duration::from_secs(10));
    let status = |args: &[&str]| {
        let out = arb.smore().arg("status").args(args).output().unwrap();
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        text(&out.stdout)
    };
    // --json is --format json; --gpu keeps only the named GPUs.
    let all: serde_json::Value = serde_json::from_str(&status(&["--json"])).unwrap();
    assert_eq!(all["gpus"].as_array().unwrap().len(), 2);
    let one: serde_json::Value =
        serde_json::from_str(&status(&["--format", "json", "--gpu", "1"])).unwrap();
    let gpus = one["gpus"].as_array().unwrap();
    assert_eq!((gpus.len(), &gpus[0]["index"]), (1, &serde_json::json!(1)));
    // CSV: a header and the training process, named.
    let csv = status(&["--format", "csv"]);
    let row = csv
        .lines()
        .find(|l| l.starts_with("1,training,"))
        .unwrap_or_else(|| panic!("no training row: {csv}"));
    assert!(
        row.contains(&format!(",{},sim-probe,", holder.id())),
        "{row}"
    );
    assert!(status(&["--format", "csv", "--gpu", "0"]).lines().count() == 1);
    // The table names the training process too.
    let table = status(&["--gpu", "1"]);
    let line = table
        .lines()
        .find(|l| l.trim_start().starts_with("training"))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(
        line.contains(&holder.id().to_string()) && line.contains("sim-probe"),
        "{line}"
    );
    assert!(!table.contains("GPU 0"), "{table}");
    holder.kill().unwrap();
    holder.wait().unwrap();
}

#[test]
fn daemon_logs_carry_no_escape_codes_when_stderr_is_a_file() {
    let sim = SimGpu::exact(1, "8GiB");
    let arb = Arbiter::new(&sim, "");
    let logs = arb.logs();
    assert!(logs.contains("INFO"), "{logs}");
    assert!(!logs.contains('\x1b'), "{logs:?}");
}

#[test]
fn daemon_logs_are_json_lines_with_log_format_json() {
    let sim = SimGpu::exact(1, "8GiB");
    let arb = Arbiter::with_args(&sim, "", &["--log-format", "json"]);
    let logs = arb.logs();
    let lines: Vec<&str> = logs.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(!lines.is_empty());
    for l in lines {
        let v: serde_json::Value =
            serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
        assert!(v["level"].is_string(), "{l}");
    }
}

#[test]
fn completions_man_page_and_version_are_generated() {
    let out = |args: &[&str]| {
        let o = Command::new(SMORE).args(args).output().unwrap();
        assert!(o.status.success(), "{args:?}: {}", text(&o.stderr));
        text(&o.stdout)
    };
    let bash = out(&["completions", "bash"]);
    assert!(
        bash.contains("complete") && bash.contains("smore"),
        "{bash}"
    );
    assert!(out(&["completions", "zsh"]).contains("#compdef smore"));
    let man = out(&["man"]);
    assert!(man.contains(".TH smore"), "{man}");
    let version = out(&["--version"]);
    assert!(
        version.starts_with(&format!("smore {} (commit ", env!("CARGO_PKG_VERSION")))
            && version.contains(", built 2"),
        "{version}"
    );
}

#[test]
fn every_flag_has_help_text() {
    // `smore help <cmd>` for each command: every option line carries a description.
    let top = Command::new(SMORE).arg("--help").output().unwrap();
    let top = text(&top.stdout);
    let commands: Vec<String> = top
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(String::from))
        .filter(|c| c != "help")
        .collect();
    assert!(commands.len() > 5, "{top}");
    let mut paths: Vec<Vec<String>> = commands.iter().map(|c| vec![c.clone()]).collect();
    for sub in ["bench", "k8s", "predictor", "prewarm"] {
        let h = Command::new(SMORE).args([sub, "--help"]).output().unwrap();
        for l in text(&h.stdout)
            .lines()
            .skip_while(|l| !l.starts_with("Commands:"))
            .skip(1)
            .take_while(|l| l.starts_with("  "))
        {
            if let Some(c) = l.split_whitespace().next().filter(|c| *c != "help") {
                paths.push(vec![sub.to_string(), c.to_string()]);
            }
        }
    }
    let mut bare = Vec::new();
    for p in paths {
        let h = Command::new(SMORE).args(&p).arg("--help").output().unwrap();
        let h = text(&h.stdout);
        let mut lines = h
            .lines()
            .skip_while(|l| !l.starts_with("Options:"))
            .skip(1)
            .peekable();
        while let Some(l) = lines.next() {
            let t = l.trim_start();
            // Option lines start `-x, --long` or `--long`; `- value: …` lines list possible values.
            let option = t.starts_with("--")
                || (t.starts_with('-')
                    && t.chars().nth(1).is_some_and(|c| c.is_ascii_alphabetic()));
            if !option || t.starts_with("-h, --help") || t.starts_with("-V") {
                continue;
            }
            // A description is on the same line (after two spaces) or on the next, indented.
            let same_line = t
                .split_once("  ")
                .is_some_and(|(_, d)| !d.trim().is_empty());
            let next_line = lines
                .peek()
                .is_some_and(|n| !n.trim().is_empty() && !n.trim_start().starts_with('-'));
            if !same_line && !next_line {
                bare.push(format!("smore {} {t}", p.join(" ")));
            }
        }
    }
    assert!(
        bare.is_empty(),
        "options without help text:\n{}",
        bare.join("\n")
    );
}

/// Which mode each GPU's processes share it in comes from NVML's MPS client list: a simulated GPU
/// under MPS says `mps` once a process holds a context on it, a time-sliced one `time-sliced`, and
/// `/metrics` carries it as `smore_gpu_mps`.
#[test]
fn status_and_metrics_say_whether_a_gpu_runs_under_mps() {
    for (mode, name, gauge) in [
        (smore_simgpu::SchedMode::Mps, "mps", "1.0"),
        (smore_simgpu::SchedMode::TimeSlice, "time-sliced", "0.0"),
    ] {
        let sim = SimGpu::builder()
            .devices(1)
            .memory("16GiB")
            .mode(mode)
            .build()
            .unwrap();
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let arb = Arbiter::new(&sim, &format!("metrics_addr = \"127.0.0.1:{port}\"\n"));
        assert!(
            arb.status()["gpus"][0]["sharing"].is_null(),
            "no process yet: nothing to tell"
        );
        let mut holder = sim.spawn_memory_holder(0, "1GiB");
        arb.wait_for_training(0, std::time::Duration::from_secs(10));
        smore_e2e::wait_until(
            "the arbiter reads the GPU's sharing mode",
            std::time::Duration::from_secs(10),
            || arb.status()["gpus"][0]["sharing"] == name,
        );
        let human = arb.smore().arg("status").output().unwrap();
        assert!(
            text(&human.stdout).contains(&format!("({name})")),
            "{}",
            text(&human.stdout)
        );
        let metrics = {
            use std::io::{Read, Write};
            let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
            conn.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
            let mut resp = String::new();
            conn.read_to_string(&mut resp).unwrap();
            resp
        };
        assert!(
            metrics
                .lines()
                .any(|l| l.starts_with("smore_gpu_mps{") && l.ends_with(&format!(" {gauge}"))),
            "{name}: smore_gpu_mps {gauge} expected:\n{metrics}"
        );
        let _ = holder.kill();
        let _ = holder.wait();
    }
}
