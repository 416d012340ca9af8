//! The simulated GPU's own end-to-end tests: real processes, real shared state.
//!
//! - kernels of all processes share one time-sliced timeline;
//! - device memory is one ledger across processes, released when a process exits or dies;
//! - `cuGetProcAddress(_v2)` answers the documented export for each (name, version, flags);
//! - the three ways of reaching the driver all work;
//! - NVML (through `nvml-wrapper`, as the arbiter uses it) agrees with the driver.

use smore_e2e::*;
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
    holder.kill().unwrap();
    let _ = holder.wait();
    let _ = trainer.wait();
}
