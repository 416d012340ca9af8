//! The shim's memory cap on the simulated GPU: every allocation path through every way a program
//! reaches the driver, racing threads, the virtualised memory information and the context
//! footprint. Real processes with `LD_PRELOAD` of `libsmore_shim.so`; nothing is faked.

use smore_e2e::*;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

const KINDS: [&str; 8] = [
    "v2", "pitch", "managed", "async", "pool", "vmm", "array", "array3d",
];

#[test]
fn every_allocation_path_is_capped_and_freed_exactly_through_every_resolution_style() {
    let sim = SimGpu::exact(1, "8GiB");
    let mut script = vec!["stream".to_string()];
    for k in KINDS {
        for op in [
            format!("alloc:{k}:48MiB"),
            format!("alloc:{k}:32MiB"),
            "meminfo".into(),
            "free".into(),
            "meminfo".into(),
            format!("alloc:{k}:64MiB"),
            "meminfo".into(),
            "free".into(),
            "meminfo".into(),
        ] {
            script.push(op);
        }
    }
    for style in Resolution::ALL {
        let (prog, args) = (style.probe(), style.args());
        let out = run_ok(
            sim.shimmed(&prog, &[("SMORE_MEMORY_LIMIT", "64MiB")])
                .args(args)
                .args(&script),
        )
        .unwrap();
        let l = parse_lines(&out);
        let allocs = ops(&l, "alloc");
        let infos = ops(&l, "meminfo");
        let frees = ops(&l, "free");
        assert_eq!(allocs.len(), 3 * KINDS.len(), "{prog:?} {args:?}: {out}");
        for (i, k) in KINDS.iter().enumerate() {
            let ctx = format!("{prog:?} {args:?} kind {k}");
            let (a, info, f) = (&allocs[3 * i..], &infos[4 * i..], &frees[2 * i..]);
            assert_eq!(a[0]["rc"], "0", "{ctx}: 48 MiB under a 64 MiB cap: {out}");
            assert_eq!(a[1]["rc"], "2", "{ctx}: 48 + 32 MiB passes the cap: {out}");
            assert_eq!(num(info[0], "total") as u64, 64 * MIB, "{ctx}");
            assert_eq!(
                num(info[0], "free") as u64,
                16 * MIB,
                "{ctx}: charged exactly"
            );
            assert_eq!(f[0]["rc"], "0", "{ctx}");
            assert_eq!(
                num(info[1], "free") as u64,
                64 * MIB,
                "{ctx}: credited exactly"
            );
            assert_eq!(a[2]["rc"], "0", "{ctx}: exactly the cap fits: {out}");
            assert_eq!(num(info[2], "free") as u64, 0, "{ctx}");
            assert_eq!(f[1]["rc"], "0", "{ctx}");
            assert_eq!(num(info[3], "free") as u64, 64 * MIB, "{ctx}");
        }
    }
    // Every process gave everything back to the driver.
    assert_eq!(sim.node().used_mem(0).unwrap(), 0);
}

#[test]
fn racing_threads_never_pass_the_cap_and_use_it_up() {
    let sim = SimGpu::exact(1, "8GiB");
    for style in [Resolution::Dlsym, Resolution::ProcAddress13PerThread] {
        let args = style.args();
        for _round in 0..3 {
            let out = run_ok(
                sim.shimmed(bin("shim-client"), &[("SMORE_MEMORY_LIMIT", "100MiB")])
                    .args(args)
                    .args(["race", "--threads", "8", "--size", "1MiB"]),
            )
            .unwrap();
            let l = parse_lines(&out);
            let race = ops(&l, "race")[0];
            assert_eq!(
                race["ok"], "100",
                "exactly cap / 1 MiB allocations succeed: {out}"
            );
            assert_eq!(
                race["stop_rc"], "2",
                "every thread stops on OUT_OF_MEMORY: {out}"
            );
            let info = ops(&l, "meminfo");
            assert_eq!(num(info[0], "free") as u64, 0);
            assert_eq!(
                num(info[1], "free") as u64,
                100 * MIB,
                "every free credited: {out}"
            );
        }
    }
}

#[test]
fn memory_information_reports_the_cap() {
    let sim = SimGpu::exact(2, "8GiB");
    let script = ["alloc:v2:256MiB", "meminfo", "totalmem", "nvml-meminfo"];
    let env = [
        ("SMORE_MEMORY_LIMIT", "1GiB"),
        ("SMORE_MEMORY_LIMIT_1", "512MiB"),
    ];
    for style in [
        Resolution::Dlsym,
        Resolution::ProcAddress12,
        Resolution::ProcAddress13PerThread,
    ] {
        let args = style.args();
        for (device, cap) in [("0", GIB), ("1", 512 * MIB)] {
            let out = run_ok(
                sim.shimmed(bin("sim-probe"), &env)
                    .args(args)
                    .args(["--device", device])
                    .args(script),
            )
            .unwrap();
            let l = parse_lines(&out);
            let ctx = format!("{args:?} device {device}: {out}");
            let info = ops(&l, "meminfo")[0];
            assert_eq!(num(info, "total") as u64, cap, "{ctx}");
            assert_eq!(num(info, "free") as u64, cap - 256 * MIB, "{ctx}");
            assert_eq!(num(ops(&l, "totalmem")[0], "total") as u64, cap, "{ctx}");
            let nvml = ops(&l, "nvml-meminfo")[0];
            assert_eq!(num(nvml, "total") as u64, cap, "{ctx}");
            assert_eq!(num(nvml, "free") as u64, cap - 256 * MIB, "{ctx}");
            assert_eq!(num(nvml, "used") as u64, 256 * MIB, "{ctx}");
        }
    }
    // A cap above the physical memory never reports more than the device has; an uncapped
    // process sees the device as it is.
    for (env, total) in [
        (vec![("SMORE_MEMORY_LIMIT", "64GiB")], 8 * GIB),
        (vec![], 8 * GIB),
    ] {
        let out = run_ok(sim.shimmed(bin("sim-probe"), &env).args([
            "meminfo",
            "totalmem",
            "nvml-meminfo",
        ]))
        .unwrap();
        let l = parse_lines(&out);
        assert_eq!(num(ops(&l, "meminfo")[0], "total") as u64, total, "{out}");
        assert_eq!(num(ops(&l, "totalmem")[0], "total") as u64, total, "{out}");
        assert_eq!(
            num(ops(&l, "nvml-meminfo")[0], "total") as u64,
            total,
            "{out}"
        );
    }
}

#[test]
fn the_context_footprint_counts_against_the_cap() {
    let sim = SimGpu::builder()
        .memory("8GiB")
        .context_memory("300MiB")
        .build()
        .unwrap();
    let out = run_ok(
        sim.shimmed(bin("sim-probe"), &[("SMORE_MEMORY_LIMIT", "1GiB")])
            .args(["meminfo", "alloc:v2:725MiB", "alloc:v2:724MiB", "meminfo"]),
    )
    .unwrap();
    let l = parse_lines(&out);
    let info = ops(&l, "meminfo");
    assert_eq!(
        num(info[0], "free") as u64,
        724 * MIB,
        "1 GiB cap - 300 MiB context: {out}"
    );
    let a = ops(&l, "alloc");
    assert_eq!(a[0]["rc"], "2", "{out}");
    assert_eq!(a[1]["rc"], "0", "{out}");
    assert_eq!(num(info[1], "free") as u64, 0);
}

#[test]
fn over_cap_refusals_log_one_rate_limited_line_and_the_process_goes_on() {
    let sim = SimGpu::exact(1, "8GiB");
    let out = sim
        .shimmed(
            bin("sim-probe"),
            &[("SMORE_MEMORY_LIMIT", "64MiB"), ("SMORE_LOG", "debug")],
        )
        .args([
            "alloc:v2:100MiB",
            "alloc:v2:100MiB",
            "alloc:managed:100MiB",
            "alloc:vmm:100MiB",
            "alloc:v2:64MiB",
            "run:100:3",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    // The shim never writes to stdout: every line there is the probe's own.
    assert!(stdout.lines().all(|l| l.starts_with("op=")), "{stdout}");
    let l = parse_lines(&stdout);
    let rcs: Vec<&str> = ops(&l, "alloc").iter().map(|a| a["rc"].as_str()).collect();
    assert_eq!(rcs, ["2", "2", "2", "2", "0"], "{stdout}");
    assert_eq!(
        ops(&l, "run")[0]["rc"],
        "0",
        "the process goes on: {stdout}"
    );
    let refused: Vec<&str> = stderr.lines().filter(|l| l.contains("refused")).collect();
    assert_eq!(refused.len(), 1, "one line per second at most: {stderr}");
    assert!(
        refused[0].contains("104857600 B") && refused[0].contains("cap 67108864 B"),
        "the line names the request and the cap: {}",
        refused[0]
    );
}

#[test]
fn a_cuda_3_0_program_gets_the_32_bit_hooks_from_cu_get_proc_address() {
    // cuGetProcAddress(name, 3000) returns the v1 exports (32-bit pointers and sizes); a shim
    // mapping by name would hand back the _v2 hooks and write 64-bit values into 32-bit slots.
    let sim = SimGpu::exact(1, "8GiB");
    let out = run_ok(
        sim.shimmed(bin("shim-client"), &[("SMORE_MEMORY_LIMIT", "64MiB")])
            .args([
                "--resolve",
                "dlsym",
                "v1",
                "--size",
                "48MiB",
                "--more",
                "32MiB",
            ]),
    )
    .unwrap();
    let l = parse_lines(&out);
    assert_eq!(ops(&l, "v1-variants")[0]["distinct"], "true", "{out}");
    let a = ops(&l, "alloc");
    let rcs: Vec<&str> = a.iter().map(|f| f["rc"].as_str()).collect();
    assert_eq!(
        rcs,
        ["0", "2", "0", "0"],
        "v1, v1 over the cap, pitch v1, array v1: {out}"
    );
    assert_eq!(a[0]["guard_intact"], "true", "{out}");
    for info in ops(&l, "meminfo") {
        assert_eq!(info["guards_intact"], "true", "{out}");
        assert_eq!(num(info, "total") as u64, 64 * MIB, "{out}");
        let want = match info["tag"].as_str() {
            "after-free" | "end" => 64 * MIB,
            _ => 16 * MIB,
        };
        assert_eq!(num(info, "free") as u64, want, "{info:?}\n{out}");
    }
    let t = ops(&l, "totalmem")[0];
    assert_eq!(num(t, "total") as u64, 64 * MIB, "{out}");
    assert!(ops(&l, "free").iter().all(|f| f["rc"] == "0"), "{out}");
}

#[test]
fn nvml_devices_are_matched_to_cuda_ordinals_by_uuid() {
    // CUDA_VISIBLE_DEVICES=1: CUDA ordinal 0 is the node's device 1 (NVML index 1). The cap of
    // ordinal 0 must show on NVML index 1, and NVML index 0 (not this process's device) is left
    // as the device reports it.
    let sim = SimGpu::exact(2, "8GiB");
    for (index, total, free) in [(0, 8 * GIB, 8 * GIB), (1, 512 * MIB, 256 * MIB)] {
        let out = run_ok(
            sim.shimmed(bin("shim-client"), &[("SMORE_MEMORY_LIMIT_0", "512MiB")])
                .env("CUDA_VISIBLE_DEVICES", "1")
                .args([
                    "--resolve",
                    "dlsym",
                    "nvml-info",
                    "--index",
                    &index.to_string(),
                ]),
        )
        .unwrap();
        let l = parse_lines(&out);
        assert_eq!(ops(&l, "alloc")[0]["rc"], "0", "{out}");
        for v in ops(&l, "nvml") {
            assert_eq!(v["rc"], "0", "{out}");
            assert_eq!(num(v, "total") as u64, total, "index {index}: {out}");
            assert_eq!(num(v, "free") as u64, free, "index {index}: {out}");
        }
    }
}
