//! The simulated GPU's own end-to-end tests: real processes, real shared state.
//!
//! - kernels of all processes share one time-sliced timeline;
//! - device memory is one ledger across processes, released when a process exits or dies;
//! - `cuGetProcAddress(_v2)` answers the documented export for each (name, version, flags);
//! - the three ways of reaching the driver all work;
//! - NVML (through `nvml-wrapper`, as the arbiter uses it) agrees with the driver, and stamps its
//!   samples in µs since the Unix epoch;
//! - in MPS mode two busy processes run concurrently, each slowed as the model says, and their
//!   event timings, NVML utilization and the node's ground-truth accounting agree.

use smore_e2e::*;
use smore_simgpu::SchedMode;
use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

/// Spawns a probe and waits until it printed `op=ready` (its earlier ops are done).
fn spawn_ready(sim: &SimGpu, ops: &[&str]) -> (Child, Vec<String>) {
    let mut child = sim
        .command(bin("sim-probe"))
        .args(ops)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn probe");
    let mut lines = Vec::new();
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    loop {
        let mut l = String::new();
        if reader.read_line(&mut l).unwrap() == 0 {
            panic!("probe exited before ready: {lines:?}");
        }
        let done = l.starts_with("op=ready");
        lines.push(l.trim().to_string());
        if done {
            break;
        }
    }
    // Keep draining so the child never blocks on a full pipe.
    std::thread::spawn(move || for _ in reader.lines() {});
    (child, lines)
}

#[test]
fn two_busy_processes_share_the_timeline_evenly() {
    let sim = SimGpu::exact(1, "8GiB");
    let spawn = || {
        sim.command(bin("sim-trainer"))
            .args([
                "--kernel-us",
                "1000",
                "--kernels",
                "20",
                "--seconds",
                "3",
                "--quiet",
            ])
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn trainer")
    };
    let (a, b) = (spawn(), spawn());
    let (pa, pb) = (a.id(), b.id());
    // Sample the node's per-process GPU time while both run.
    std::thread::sleep(std::time::Duration::from_millis(2500));
    let node = sim.node();
    let (ga, gb) = (node.gpu_time_of(0, pa), node.gpu_time_of(0, pb));
    let busy = node.busy_ns(0);
    let out_a = String::from_utf8(a.wait_with_output().unwrap().stdout).unwrap();
    let out_b = String::from_utf8(b.wait_with_output().unwrap().stdout).unwrap();
    let share_a = ga as f64 / (ga + gb) as f64;
    assert!(
        (0.40..=0.60).contains(&share_a),
        "process A got {:.1}% of the GPU time (A {ga} ns, B {gb} ns)",
        share_a * 100.0
    );
    // Serialized: together they never get more GPU time than there was wall time.
    assert!(ga + gb <= busy + 1_000_000, "{ga} + {gb} > busy {busy}");
    // Each trainer alone would do 1000/20 = 50 iterations/s; together ~25 each, and never more
    // than 50 in sum.
    let rate = |o: &str| num(&summary(o, "trainer"), "iters_per_s");
    let (ra, rb) = (rate(&out_a), rate(&out_b));
    assert!(
        ra + rb <= 52.0,
        "combined {ra} + {rb} iterations/s exceed one GPU"
    );
    assert!(ra > 15.0 && rb > 15.0, "one trainer starved: {ra} / {rb}");
}

#[test]
fn a_lone_process_runs_at_full_speed_and_kernel_durations_are_honoured() {
    let sim = SimGpu::exact(1, "8GiB");
    let out = run_ok(sim.command(bin("sim-probe")).args([
        "run:5000:2",
        "run:300:10",
        "run:2000:3:graph",
    ]))
    .unwrap();
    let runs = parse_lines(&out);
    let runs = ops(&runs, "run");
    let expect = [10.0, 3.0, 6.0];
    for (r, want) in runs.iter().zip(expect) {
        let ms = num(r, "wall_ms");
        assert!(
            ms >= want * 0.99 && ms < want + 5.0,
            "{r:?}: expected about {want} ms"
        );
    }
}

#[test]
fn memory_is_one_ledger_across_processes() {
    let sim = SimGpu::exact(1, "8GiB");
    let (mut holder, lines) = spawn_ready(&sim, &["alloc:v2:3GiB", "ready", "sleep:20000"]);
    assert!(lines[1].contains("rc=0"), "{lines:?}");
    let out = run_ok(sim.command(bin("sim-probe")).args([
        "meminfo",
        "alloc:v2:6GiB",
        "alloc:v2:4GiB",
        "meminfo",
    ]))
    .unwrap();
    let l = parse_lines(&out);
    let info = ops(&l, "meminfo");
    assert_eq!(num(info[0], "total") as u64, 8 * GIB);
    assert_eq!(num(info[0], "free") as u64, 5 * GIB);
    let allocs = ops(&l, "alloc");
    assert_eq!(
        allocs[0]["rc"], "2",
        "6 GiB must not fit beside 3 GiB: {out}"
    );
    assert_eq!(allocs[1]["rc"], "0");
    assert_eq!(num(info[1], "free") as u64, GIB);
    // The second process exited: its 4 GiB are back; the holder still has 3.
    assert_eq!(sim.node().used_mem(0).unwrap(), 3 * GIB);
    // SIGKILL the holder: the driver releases its memory (reaped by the next observer).
    holder.kill().unwrap();
    holder.wait().unwrap();
    let node = sim.node();
    node.reap_dead();
    assert_eq!(node.used_mem(0).unwrap(), 0);
}

#[test]
fn get_proc_address_answers_the_documented_variant() {
    let sim = SimGpu::exact(1, "8GiB");
    // (base name, cudaVersion, flags, export the real driver returns)
    let cases = [
        ("cuMemAlloc", 12000, 0, "cuMemAlloc_v2"),
        ("cuMemAlloc", 3000, 0, "cuMemAlloc"),
        ("cuMemGetInfo", 13000, 0, "cuMemGetInfo_v2"),
        ("cuLaunchKernel", 12000, 0, "cuLaunchKernel"),
        ("cuLaunchKernel", 12000, 2, "cuLaunchKernel_ptsz"),
        ("cuLaunchKernelEx", 12080, 2, "cuLaunchKernelEx_ptsz"),
        ("cuGraphLaunch", 13000, 2, "cuGraphLaunch_ptsz"),
        ("cuMemAllocAsync", 12000, 2, "cuMemAllocAsync_ptsz"),
        ("cuMemcpyHtoD", 12000, 2, "cuMemcpyHtoD_v2_ptds"),
        ("cuCtxCreate", 11040, 0, "cuCtxCreate_v3"),
        ("cuCtxCreate", 13000, 0, "cuCtxCreate_v4"),
        (
            "cuGraphInstantiate",
            12000,
            0,
            "cuGraphInstantiateWithFlags",
        ),
        ("cuEventElapsedTime", 12080, 0, "cuEventElapsedTime_v2"),
        (
            "cuStreamBeginCapture",
            12000,
            2,
            "cuStreamBeginCapture_v2_ptsz",
        ),
    ];
    let ops_: Vec<String> = cases
        .iter()
        .map(|(n, v, f, e)| format!("procaddr:{n}:{v}:{f}:{e}"))
        .chain([
            "procaddr:cuNoSuchEntryPoint:12000:0:cuInit".to_string(),
            "procaddr:cuLaunchKernelEx:11000:0:cuLaunchKernelEx".to_string(),
        ])
        .collect();
    let out = run_ok(sim.command(bin("sim-probe")).args(&ops_)).unwrap();
    let l = parse_lines(&out);
    let res = ops(&l, "procaddr");
    for (r, case) in res.iter().zip(cases.iter()) {
        assert_eq!(r["rc"], "0", "{case:?}: {r:?}");
        assert_eq!(
            r["match"], "true",
            "{case:?} did not return {}: {r:?}",
            case.3
        );
    }
    let unknown = res[cases.len()];
    assert_eq!(
        unknown["rc"], "500",
        "unknown names answer CUDA_ERROR_NOT_FOUND: {unknown:?}"
    );
    assert_eq!(unknown["status"], "1");
    let too_old = res[cases.len() + 1];
    assert_eq!(too_old["rc"], "500");
    assert_eq!(
        too_old["status"], "2",
        "version not sufficient: {too_old:?}"
    );
}

#[test]
fn every_resolution_path_reaches_the_driver() {
    let sim = SimGpu::exact(1, "8GiB");
    let script = [
        "alloc:v2:64MiB",
        "alloc:async:1MiB",
        "run:200:5",
        "run:200:5:ex",
        "stream",
        "run:200:5:graph",
        "meminfo",
        "free-all",
    ];
    // What each style's own resolution reports for one entry point.
    let expected = |style: Resolution| match style {
        Resolution::Direct => "cuLaunchKernel=cuLaunchKernel",
        Resolution::DirectPerThread | Resolution::DlsymPerThread => {
            "cuLaunchKernel=cuLaunchKernel_ptsz"
        }
        Resolution::Dlsym => "cuMemAlloc=cuMemAlloc_v2",
        Resolution::ProcAddress12 => "cuMemAlloc=cuMemAlloc@12000",
        Resolution::ProcAddress13PerThread => "cuMemAlloc=cuMemAlloc@13000",
    };
    for style in Resolution::ALL {
        let (prog, args, expect) = (style.probe(), style.args(), expected(style));
        let out = run_ok(sim.command(&prog).args(args).args(script)).unwrap();
        assert!(out.contains(expect), "{prog:?} {args:?}: {out}");
        let l = parse_lines(&out);
        for f in l.iter().filter(|f| f.get("rc").is_some()) {
            assert_eq!(f["rc"], "0", "{prog:?} {args:?}: {f:?}");
        }
        let info = ops(&l, "meminfo")[0];
        assert_eq!(num(info, "free") as u64, 8 * GIB - 65 * MIB);
    }
}

#[test]
fn nvml_under_nvml_wrapper_agrees_with_the_driver() {
    let sim = SimGpu::builder()
        .devices(2)
        .memory("16GiB")
        .context_memory("300MiB")
        .build()
        .unwrap();
    let (mut holder, _) = spawn_ready(&sim, &["alloc:v2:1GiB", "ready", "sleep:20000"]);
    let mut trainer = sim
        .command(bin("sim-trainer"))
        .args([
            "--kernel-us",
            "2000",
            "--kernels",
            "10",
            "--seconds",
            "3",
            "--quiet",
            "--device",
            "1",
        ])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let out = run_ok(&mut sim.command(bin("nvml-query"))).unwrap();
    let l = parse_lines(&out);
    assert_eq!(ops(&l, "count")[0]["devices"], "2", "{out}");
    let devs = ops(&l, "device");
    assert_eq!(num(devs[0], "total") as u64, 16 * GIB);
    assert_eq!(num(devs[0], "used") as u64, GIB + 300 * MIB, "{out}");
    assert!(devs[0]["uuid"].starts_with("GPU-"));
    assert_ne!(devs[0]["uuid"], devs[1]["uuid"]);
    let procs = ops(&l, "process");
    let holder_line = procs
        .iter()
        .find(|p| p["pid"] == holder.id().to_string())
        .unwrap_or_else(|| panic!("holder not listed: {out}"));
    assert_eq!(num(holder_line, "used") as u64, GIB + 300 * MIB);
    assert_eq!(holder_line["index"], "0");
    // The trainer keeps device 1 busy: device and per-process utilization say so.
    assert!(num(devs[1], "util") >= 80.0, "device 1 utilization: {out}");
    let pu = ops(&l, "putil");
    let t = pu
        .iter()
        .find(|p| p["pid"] == trainer.id().to_string())
        .unwrap_or_else(|| panic!("no utilization sample for the trainer: {out}"));
    assert!(num(t, "sm") >= 80.0, "{t:?}");
    assert!(
        ops(&l, "mps").is_empty(),
        "no MPS clients without MPS: {out}"
    );
    holder.kill().unwrap();
    let _ = holder.wait();
    let _ = trainer.wait();
}

fn epoch_us_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Per-iteration lines of a sim-trainer: (gpu_us of the event pair, wall ms).
fn iterations(out: &str) -> Vec<(f64, f64)> {
    parse_lines(out)
        .iter()
        .filter(|f| f.contains_key("iter"))
        .map(|f| (num(f, "gpu_us"), num(f, "ms")))
        .collect()
}

#[test]
fn mps_two_busy_processes_are_each_slowed_as_modelled() {
    // β = 0.5: two saturating processes each run at 1/(1 + 0.5) of solo.
    let sim = SimGpu::builder()
        .memory("8GiB")
        .context_memory("0")
        .mode(SchedMode::Mps)
        .mps_beta_permille(500)
        .build()
        .unwrap();
    assert_eq!(sim.node().mode(), SchedMode::Mps);
    let spawn = || {
        sim.command(bin("sim-trainer"))
            .args(["--kernel-us", "1000", "--kernels", "20", "--seconds", "3"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn trainer")
    };
    let (a, b) = (spawn(), spawn());
    let (pa, pb) = (a.id(), b.id());
    std::thread::sleep(std::time::Duration::from_millis(2000));
    let nvml = run_ok(
        sim.command(bin("nvml-query"))
            .args(["--since-ago-ms", "1000"]),
    )
    .unwrap();
    let node = sim.node();
    let (ta, tb) = (node.truth_of(0, pa).unwrap(), node.truth_of(0, pb).unwrap());
    let busy = node.busy_ns(0);
    let out_a = String::from_utf8(a.wait_with_output().unwrap().stdout).unwrap();
    let out_b = String::from_utf8(b.wait_with_output().unwrap().stdout).unwrap();

    // Ground truth: each ran concurrently nearly all the time, so its work got done at close to
    // 1/1.5 of the time its kernels were running (1 when it ran alone).
    for t in [ta, tb] {
        let rate = t.work_ns as f64 / t.gpu_active_ns as f64;
        assert!((0.64..0.76).contains(&rate), "work/active {rate:.3}: {t:?}");
        assert_eq!(t.gpu_active_ns, t.work_ns + t.interference_ns, "{t:?}");
    }
    // Concurrent: together they did more work than the busy time (time slicing never can), and
    // each was active for most of it.
    let work = (ta.work_ns + tb.work_ns) as f64;
    assert!(work > 1.15 * busy as f64, "work {work} vs busy {busy}");
    assert!(ta.gpu_active_ns + tb.gpu_active_ns > busy + busy / 2);

    // Event timings agree with the model and with the accounting: an iteration's 20 ms of kernels
    // take about 30 ms between its events, and the slowdown the events show is the one the node
    // accounted.
    for (out, t) in [(&out_a, ta), (&out_b, tb)] {
        let it = iterations(out);
        assert!(it.len() > 20, "{out}");
        let slow = median(it.iter().map(|(g, _)| g / 20_000.0).collect());
        assert!(
            (1.35..1.55).contains(&slow),
            "median event slowdown {slow:.3}"
        );
        let accounted = t.gpu_active_ns as f64 / t.work_ns as f64;
        assert!(
            (slow - accounted).abs() < 0.12,
            "events say {slow:.3}, accounting {accounted:.3}"
        );
        for (g, ms) in &it {
            assert!(
                g / 1000.0 <= ms + 0.05,
                "event pair {g} µs longer than the iteration {ms} ms"
            );
        }
        // Throughput: 50 iterations/s alone, about 33 under the model.
        let r = num(&summary(out, "trainer"), "iters_per_s");
        assert!((27.0..38.0).contains(&r), "{r} iterations/s");
    }

    // NVML: samples newer than now − 1 s exist (epoch timestamps) and each process's SM activity
    // is its kernels' running time — both near 100 % at once, as under MPS on hardware.
    let l = parse_lines(&nvml);
    let now = epoch_us_now();
    for pid in [pa, pb] {
        let p = ops(&l, "putil")
            .into_iter()
            .find(|p| p["pid"] == pid.to_string())
            .unwrap_or_else(|| panic!("no sample newer than now - 1 s for {pid}: {nvml}"));
        assert!(num(p, "sm") >= 80.0, "{p:?}");
        let ts = num(p, "ts") as u64;
        assert!(
            ts > num(p, "since") as u64 && ts <= now,
            "{p:?} (now {now})"
        );
    }
    assert!(num(ops(&l, "device")[0], "util") >= 80.0, "{nvml}");
    // Both are listed as MPS clients.
    let mps: Vec<&str> = ops(&l, "mps").iter().map(|p| p["pid"].as_str()).collect();
    for pid in [pa, pb] {
        assert!(mps.contains(&pid.to_string().as_str()), "{nvml}");
    }
}

#[test]
fn nvml_sample_timestamps_are_unix_epoch_microseconds() {
    let sim = SimGpu::exact(1, "8GiB");
    let mut trainer = sim
        .command(bin("sim-trainer"))
        .args([
            "--kernel-us",
            "2000",
            "--kernels",
            "5",
            "--seconds",
            "3",
            "--quiet",
        ])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    // As HAMi-core asks: samples newer than now − 1 s, in wall-clock µs.
    let before = epoch_us_now();
    let out = run_ok(
        sim.command(bin("nvml-query"))
            .args(["--since-ago-ms", "1000"]),
    )
    .unwrap();
    let after = epoch_us_now();
    let l = parse_lines(&out);
    let p = ops(&l, "putil")
        .into_iter()
        .find(|p| p["pid"] == trainer.id().to_string())
        .unwrap_or_else(|| panic!("no sample newer than now - 1 s: {out}"));
    let ts = num(p, "ts") as u64;
    // The newest sample ends at most one sample period (1/6 s) before the query.
    assert!(
        ts <= after && ts + 400_000 >= before,
        "timestamp {ts} not within the last 0.4 s of wall time ({before}..{after})"
    );
    assert!(num(p, "sm") >= 80.0, "{p:?}");
    // Passing back the newest timestamp returns only newer samples (none until the next period).
    let node = sim.node();
    let first = node.process_utilization(0, 0).unwrap();
    let newest = first.iter().map(|s| s.timestamp_us).max().unwrap();
    for s in node.process_utilization(0, newest).unwrap() {
        assert!(s.timestamp_us > newest, "{s:?} not newer than {newest}");
    }
    trainer.kill().unwrap();
    let _ = trainer.wait();
}

/// Reads a child's stdout until its `trainer …` summary line; returns everything read. The
/// trainer lingers after the summary (`--linger-s`) so its slot, and the node's ground truth about
/// it, are still there.
fn read_until_summary(child: &mut Child) -> String {
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    let mut out = String::new();
    loop {
        let mut l = String::new();
        if reader.read_line(&mut l).unwrap() == 0 {
            panic!("trainer exited before its summary: {out}");
        }
        out.push_str(&l);
        if l.starts_with("trainer ") {
            return out;
        }
    }
}

#[test]
fn trainer_profiles_keep_the_gpu_as_busy_as_documented() {
    // (profile, lowest and highest busy fraction docs/simgpu.md promises on an idle GPU)
    let profiles = [
        ("low", 0.15, 0.30),
        ("moderate", 0.50, 0.70),
        ("high", 0.90, 1.0),
    ];
    let runs: Vec<_> = profiles
        .iter()
        .map(|(p, _, _)| {
            let sim = SimGpu::exact(1, "8GiB");
            let child = sim
                .command(bin("sim-trainer"))
                .args(["--profile", p, "--seconds", "3", "--quiet"])
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            (sim, child)
        })
        .collect();
    // Measure from the node's own accounting over a window after start-up.
    std::thread::sleep(std::time::Duration::from_millis(700));
    let start: Vec<_> = runs
        .iter()
        .map(|(sim, _)| (sim.node().busy_ns(0), smore_simgpu::now_ns()))
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(1800));
    for (((sim, child), (busy0, t0)), (name, lo, hi)) in runs.into_iter().zip(start).zip(profiles) {
        let (busy1, t1) = (sim.node().busy_ns(0), smore_simgpu::now_ns());
        let frac = (busy1 - busy0) as f64 / (t1 - t0) as f64;
        let out = String::from_utf8(child.wait_with_output().unwrap().stdout).unwrap();
        let own = num(&summary(&out, "trainer"), "gpu_frac");
        eprintln!("profile {name}: node busy fraction {frac:.3}, trainer's own gpu_frac {own:.3}");
        assert!(
            (lo..=hi).contains(&frac),
            "profile {name}: busy {frac:.3} outside {lo}..{hi}"
        );
        // The trainer's event-timed view agrees with the node's accounting when it runs alone.
        assert!(
            (own - frac).abs() < 0.05,
            "{name}: own {own} vs node {frac}"
        );
    }
}

#[test]
fn ground_truth_interference_is_the_slowdown_the_trainer_suffers_under_time_slicing() {
    let sim = SimGpu::exact(1, "8GiB");
    let trainer = |iters: &str| {
        sim.command(bin("sim-trainer"))
            .args(["--profile", "high", "--iters", iters, "--linger-s", "10"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap()
    };
    // Alone: the solo iteration time, and no interference.
    let mut solo = trainer("15");
    let solo_out = read_until_summary(&mut solo);
    let t = sim.node().truth_of(0, solo.id()).unwrap();
    assert_eq!(t.interference_ns, 0, "alone: {t:?}");
    solo.kill().unwrap();
    let _ = solo.wait();
    let solo_ms = median(iterations(&solo_out).iter().map(|(_, ms)| *ms).collect());

    // Beside a bursty function: bursts of 3 requests (4 × 500 µs each) every 40 ms. The trainer
    // (profile high) runs 20 × 3 ms kernels per iteration.
    let mut function = sim
        .command(bin("sim-function"))
        .args([
            "--kernel-us",
            "500",
            "--kernels",
            "4",
            "--interval-ms",
            "40",
            "--burst",
            "3",
            "--seconds",
            "20",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let mut co = trainer("30");
    let co_out = read_until_summary(&mut co);
    let truth = sim.node().truth_of(0, co.id()).unwrap();
    co.kill().unwrap();
    let _ = co.wait();
    function.kill().unwrap();
    let _ = function.wait();

    let it = iterations(&co_out);
    let n = it.len() as f64;
    let interference_ms = truth.interference_ns as f64 / 1e6;
    let work_ms = truth.work_ns as f64 / 1e6;
    assert!(
        (work_ms - n * 60.0).abs() < 1.0,
        "work {work_ms} ms for {n} iterations"
    );
    // The function took a real share: the trainer waited for a good part of its work.
    assert!(
        interference_ms > 0.05 * work_ms,
        "interference {interference_ms} ms"
    );
    // Event pairs start at the first kernel, so they see at most the truth (waiting before the
    // first kernel of an iteration is invisible to them, as on hardware).
    let event_extra: f64 = it.iter().map(|(g, _)| g / 1000.0 - 60.0).sum();
    assert!(
        event_extra <= interference_ms + 1.0,
        "events {event_extra} ms > truth {interference_ms} ms"
    );
    // The iteration times show the truth: their excess over solo contains all of the
    // interference, plus host-side noise (two processes' CPU work on a small machine), which is
    // not GPU interference and which the bound above it leaves room for.
    let wall_extra: f64 = it.iter().map(|(_, ms)| ms - solo_ms).sum();
    assert!(
        interference_ms <= 1.1 * wall_extra + 10.0 && wall_extra <= 1.4 * interference_ms + 30.0,
        "iterations {wall_extra:.1} ms slower than solo, truth {interference_ms:.1} ms"
    );
}

#[test]
fn a_bursty_function_reports_service_and_end_to_end_latency_per_request() {
    let sim = SimGpu::exact(1, "8GiB");
    // Bursts of 4 requests (2 × 1 ms kernels each) every 50 ms, served in order by one instance.
    let out = run_ok(sim.command(bin("sim-function")).args([
        "--kernel-us",
        "1000",
        "--kernels",
        "2",
        "--interval-ms",
        "50",
        "--burst",
        "4",
        "--requests",
        "12",
    ]))
    .unwrap();
    let reqs: Vec<Fields> = parse_lines(&out)
        .into_iter()
        .filter(|f| f.contains_key("request"))
        .collect();
    assert_eq!(reqs.len(), 12, "{out}");
    for (i, r) in reqs.iter().enumerate() {
        let (burst, pos) = (i / 4, (i % 4) as f64);
        assert_eq!(r["burst"], burst.to_string(), "{r:?}");
        assert!(
            (num(r, "arrival_s") - burst as f64 * 0.05).abs() < 1e-6,
            "{r:?}"
        );
        let (service, e2e) = (num(r, "service_ms"), num(r, "e2e_ms"));
        assert!((2.0..50.0).contains(&service), "{r:?}");
        assert_eq!(num(r, "latency_ms"), service, "{r:?}");
        // A request waits for the ones ahead of it in its burst.
        assert!(e2e >= service + pos * 2.0 - 0.01, "{r:?}");
    }
    let s = summary(&out, "function");
    assert!(num(&s, "e2e_p99_ms") >= num(&s, "p99_ms"), "{s:?}");
    assert!(
        num(&s, "e2e_p99_ms") >= 8.0,
        "the last of a burst waited for three: {s:?}"
    );
}
