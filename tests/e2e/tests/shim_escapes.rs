//! Memory-accounting escapes of issue 12 (docs/arbiter.md, "Escapes closed"): ways a function
//! held more device memory than its cap using only calls the shim intercepts. Each test drives a
//! real shimmed process on the simulated GPU and checks the cap against the driver's own ledger
//! (NVML's per-process memory, `procmem`), not against what the shim believes.

use smore_e2e::*;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// The rc of every `op=alloc` line, in order.
fn alloc_rcs(l: &[Fields]) -> Vec<&str> {
    ops(l, "alloc").iter().map(|a| a["rc"].as_str()).collect()
}

/// The driver's count of this process's memory at every `procmem` line.
fn procmem(l: &[Fields]) -> Vec<u64> {
    ops(l, "procmem")
        .iter()
        .map(|p| {
            assert_eq!(p["rc"], "0", "{p:?}");
            num(p, "used") as u64
        })
        .collect()
}

/// Item 1: `cuMemCreate` → `cuMemMap` → `cuMemRelease` while mapped is the normal CUDA idiom; the
/// driver frees the physical memory only when the last mapping is unmapped and the last reference
/// (including `cuMemRetainAllocationHandle`'s) released. Crediting at release held 4 GiB under a
/// 1 GiB cap.
#[test]
fn a_released_but_mapped_vmm_allocation_stays_charged_until_its_last_unmap_and_release() {
    let sim = SimGpu::exact(1, "8GiB");
    let script = [
        "alloc:vmm-released:512MiB",
        "alloc:vmm-released:512MiB",
        // Both handles are released but still mapped: the driver holds 1 GiB.
        "alloc:vmm-released:512MiB",
        "procmem",
        "meminfo",
        // Unmapping the newest frees it: the cap has room again.
        "free",
        "alloc:vmm-released:512MiB",
        // A retained handle keeps unmapped memory alive until it is released too.
        "vmm-retain",
        "free",
        "alloc:vmm-released:512MiB",
        "procmem",
        "vmm-release-retained",
        "alloc:vmm-released:512MiB",
        "procmem",
        "meminfo",
    ];
    for style in Resolution::ALL {
        let out = run_ok(
            sim.shimmed(style.probe(), &[("SMORE_MEMORY_LIMIT", "1GiB")])
                .args(style.args())
                .args(script),
        )
        .unwrap();
        let l = parse_lines(&out);
        let ctx = format!("{style:?}: {out}");
        assert_eq!(
            alloc_rcs(&l),
            ["0", "0", "2", "0", "2", "0"],
            "mapped memory stays charged after cuMemRelease: {ctx}"
        );
        for used in procmem(&l) {
            assert!(
                used <= GIB,
                "the driver holds {used} B under a 1 GiB cap: {ctx}"
            );
        }
        assert_eq!(procmem(&l), [GIB, GIB, GIB], "{ctx}");
        let info = ops(&l, "meminfo");
        assert_eq!(num(info[0], "free") as u64, 0, "{ctx}");
        assert_eq!(num(info[1], "free") as u64, 0, "{ctx}");
        for v in ["vmm-retain", "vmm-release-retained"] {
            assert_eq!(ops(&l, v)[0]["rc"], "0", "{ctx}");
        }
        assert!(ops(&l, "free").iter().all(|f| f["rc"] == "0"), "{ctx}");
    }
    assert_eq!(sim.node().used_mem(0).unwrap(), 0, "everything given back");
}

/// Item 3: every context costs device memory, not only a device's first. The footprint of each
/// `cuCtxCreate` is charged while it lives (a context that would not fit is refused before the
/// driver is asked) and credited at `cuCtxDestroy`; ten contexts held 4 GiB under a 1 GiB cap.
#[test]
fn every_context_a_function_creates_is_charged_until_destroyed() {
    let sim = SimGpu::builder()
        .memory("8GiB")
        .context_memory("300MiB")
        .build()
        .unwrap();
    let out = run_ok(
        sim.shimmed(bin("sim-probe"), &[("SMORE_MEMORY_LIMIT", "1GiB")])
            .args(["--resolve", "dlsym"])
            .args([
                // The probe's primary context: 300 MiB.
                "ctx-create",
                "ctx-create",
                // 4 × 300 MiB does not fit under 1 GiB.
                "ctx-create",
                "procmem",
                "meminfo",
                "ctx-destroy",
                "meminfo",
                "ctx-create",
                "alloc:v2:124MiB",
                "alloc:v2:1MiB",
                "procmem",
            ]),
    )
    .unwrap();
    let l = parse_lines(&out);
    let creates: Vec<&str> = ops(&l, "ctx-create")
        .iter()
        .map(|c| c["rc"].as_str())
        .collect();
    assert_eq!(creates, ["0", "0", "2", "0"], "{out}");
    assert_eq!(ops(&l, "ctx-destroy")[0]["rc"], "0", "{out}");
    assert_eq!(alloc_rcs(&l), ["0", "2"], "{out}");
    assert_eq!(procmem(&l), [900 * MIB, GIB], "{out}");
    let info = ops(&l, "meminfo");
    assert_eq!(
        num(info[0], "free") as u64,
        124 * MIB,
        "three contexts: {out}"
    );
    assert_eq!(
        num(info[1], "free") as u64,
        424 * MIB,
        "one destroyed: {out}"
    );
}

/// Item 3, primary context: a retain of the existing primary context charges nothing, a release
/// that leaves a reference credits nothing, and the last release (which destroys it) credits its
/// footprint.
#[test]
fn the_primary_context_is_credited_only_when_its_last_release_destroys_it() {
    let sim = SimGpu::builder()
        .memory("8GiB")
        .context_memory("300MiB")
        .build()
        .unwrap();
    let out = run_ok(
        sim.shimmed(bin("sim-probe"), &[("SMORE_MEMORY_LIMIT", "1GiB")])
            .args(["--resolve", "dlsym"])
            .args([
                // Primary (the probe's) + two: 900 MiB.
                "ctx-create",
                "ctx-create",
                "primary-retain",
                "ctx-create",
                "primary-release",
                "ctx-create",
                // The probe's own retain: the last one, the primary context is destroyed.
                "primary-release",
                "ctx-create",
                "procmem",
            ]),
    )
    .unwrap();
    let l = parse_lines(&out);
    let creates: Vec<&str> = ops(&l, "ctx-create")
        .iter()
        .map(|c| c["rc"].as_str())
        .collect();
    assert_eq!(creates, ["0", "0", "2", "2", "0"], "{out}");
    assert_eq!(ops(&l, "primary-retain")[0]["rc"], "0", "{out}");
    assert!(
        ops(&l, "primary-release").iter().all(|r| r["rc"] == "0"),
        "{out}"
    );
    assert_eq!(procmem(&l), [900 * MIB], "{out}");
}

/// Item 2: memory freed into a pool stays reserved up to its release threshold; charging only
/// live allocations held 4 GiB under a 1 GiB cap. The shim charges what each pool reserves
/// (re-read from the driver after each allocation and free, and before refusing), on the pool's
/// own device for pools the function created.
#[test]
fn memory_a_pool_keeps_reserved_is_charged_until_the_pool_releases_it() {
    let sim = SimGpu::exact(1, "8GiB");
    let script = [
        // The default pool, with a threshold that keeps everything freed into it.
        "stream",
        "pool-threshold:max",
        "alloc:async:768MiB",
        "free",
        "pool-info",
        // 768 MiB stay reserved: 768 more do not fit, the pool's own reuse does.
        "alloc:v2:768MiB",
        "alloc:async:512MiB",
        "procmem",
        "free",
        // Trimmed, the memory is back under the cap.
        "pool-trim",
        "alloc:v2:768MiB",
        "free",
        "meminfo",
        // A pool of its own, the same way; destroying it gives its memory back.
        "pool-create",
        "pool-threshold:max",
        "alloc:mypool:768MiB",
        "free",
        "alloc:v2:768MiB",
        "procmem",
        "pool-destroy",
        "alloc:v2:768MiB",
        "procmem",
    ];
    for style in Resolution::UNLINKED {
        let out = run_ok(
            sim.shimmed(bin("sim-probe"), &[("SMORE_MEMORY_LIMIT", "1GiB")])
                .args(style.args())
                .args(script),
        )
        .unwrap();
        let l = parse_lines(&out);
        let ctx = format!("{style:?}: {out}");
        assert_eq!(
            num(ops(&l, "pool-info")[0], "reserved") as u64,
            768 * MIB,
            "{ctx}"
        );
        assert_eq!(
            alloc_rcs(&l),
            ["0", "2", "0", "0", "0", "2", "0"],
            "reserved pool memory is charged: {ctx}"
        );
        for used in procmem(&l) {
            assert!(
                used <= GIB,
                "the driver holds {used} B under a 1 GiB cap: {ctx}"
            );
        }
        assert_eq!(procmem(&l), [768 * MIB, 768 * MIB, 768 * MIB], "{ctx}");
        assert_eq!(num(ops(&l, "meminfo")[0], "free") as u64, GIB, "{ctx}");
        for op in ["pool-threshold", "pool-trim", "pool-create", "pool-destroy"] {
            assert!(ops(&l, op).iter().all(|o| o["rc"] == "0"), "{op}: {ctx}");
        }
    }
}

/// Item 4: mipmapped arrays were not intercepted (uncounted on a real driver). Every level is
/// charged at `cuMipmappedArrayCreate` and credited at `cuMipmappedArrayDestroy`.
#[test]
fn a_mipmapped_array_is_charged_every_level_until_destroyed() {
    let sim = SimGpu::exact(1, "8GiB");
    // Two levels of 1024 × 12288 floats: 48 MiB + 12 MiB.
    let script = [
        "alloc:mipmap:48MiB",
        "meminfo",
        "alloc:mipmap:48MiB",
        "procmem",
        "free",
        "meminfo",
    ];
    for style in Resolution::ALL {
        let out = run_ok(
            sim.shimmed(style.probe(), &[("SMORE_MEMORY_LIMIT", "64MiB")])
                .args(style.args())
                .args(script),
        )
        .unwrap();
        let l = parse_lines(&out);
        let ctx = format!("{style:?}: {out}");
        assert_eq!(alloc_rcs(&l), ["0", "2"], "{ctx}");
        assert_eq!(procmem(&l), [60 * MIB], "{ctx}");
        let info = ops(&l, "meminfo");
        assert_eq!(
            num(info[0], "free") as u64,
            4 * MIB,
            "every level charged: {ctx}"
        );
        assert_eq!(ops(&l, "free")[0]["rc"], "0", "{ctx}");
        assert_eq!(num(info[1], "free") as u64, 64 * MIB, "credited: {ctx}");
    }
}

/// Item 4: `cuLaunchCooperativeKernelMultiDevice` was not intercepted, so its kernels ran
/// unthrottled. It is gated like the other launches: 100 ms of GPU work at a 25 % share of a
/// 10 ms window takes ≥ ~390 ms.
#[test]
fn a_multi_device_cooperative_launch_is_held_to_the_share() {
    for style in Resolution::ALL {
        let sim = SimGpu::exact(1, "8GiB");
        let out = run_ok(
            sim.shimmed(
                style.probe(),
                &[("SMORE_SM_SHARE", "25"), ("SMORE_SM_WINDOW_MS", "10")],
            )
            .args(style.args())
            .args(["stream", "run:1000:100:coop-multi"]),
        )
        .unwrap();
        let l = parse_lines(&out);
        let run = ops(&l, "run")[0];
        assert_eq!(run["rc"], "0", "{style:?}: {out}");
        let got = 100.0 / num(run, "wall_ms");
        assert!(
            (0.25 - 0.06..=0.25 + 0.03).contains(&got),
            "{style:?}: 100 ms of GPU work at {:.1} % of wall time (share 25 %): {out}",
            got * 100.0
        );
    }
}

/// Item 4: CUDA-graph memory nodes were not intercepted: a graph's `cuGraphAddMemAllocNode`
/// memory is backed when it runs, uncounted. The nodes' bytes are charged when the graph is
/// instantiated (an instantiation that does not fit is refused before the driver is asked) and
/// credited when the executable graph is destroyed.
#[test]
fn graph_memory_nodes_are_charged_from_instantiation_to_destruction() {
    let sim = SimGpu::exact(1, "8GiB");
    let script = [
        "alloc:graph:48MiB",
        "meminfo",
        // 48 + 32 MiB does not fit under 64 MiB: refused at instantiation.
        "alloc:graph:32MiB",
        "alloc:v2:32MiB",
        "procmem",
        "free",
        "meminfo",
        "alloc:graph:64MiB",
        "procmem",
    ];
    for style in Resolution::ALL {
        let out = run_ok(
            sim.shimmed(style.probe(), &[("SMORE_MEMORY_LIMIT", "64MiB")])
                .args(style.args())
                .args(script),
        )
        .unwrap();
        let l = parse_lines(&out);
        let ctx = format!("{style:?}: {out}");
        assert_eq!(alloc_rcs(&l), ["0", "2", "2", "0"], "{ctx}");
        assert_eq!(ops(&l, "alloc")[1]["step"], "instantiate", "{ctx}");
        assert_eq!(procmem(&l), [48 * MIB, 64 * MIB], "{ctx}");
        let info = ops(&l, "meminfo");
        assert_eq!(num(info[0], "free") as u64, 16 * MIB, "{ctx}");
        assert_eq!(num(info[1], "free") as u64, 64 * MIB, "credited: {ctx}");
    }
}

/// `smore run --memory <cap> -- <command…>` on `arb`'s node.
fn smore_run(arb: &Arbiter, function: &str, cap: &str, command: &[&str]) -> std::process::Command {
    let mut c = arb.smore();
    c.args(["run", "--function", function, "--memory", cap, "--shim"])
        .arg(shim_lib())
        .arg("--")
        .args(command);
    c
}

/// Item 9: a function granted one GPU unset `CUDA_VISIBLE_DEVICES` (which `smore run` pins to
/// its GPU) and ran unthrottled on the other, or allocated there through a pool. The grant page
/// names its GPU by UUID; the shim maps each CUDA ordinal to it, and a device the grant does not
/// cover gets nothing: no context (so no launch), no allocation by any path.
#[test]
fn a_function_that_drops_cuda_visible_devices_gets_nothing_on_a_gpu_it_was_not_granted() {
    let sim = SimGpu::builder()
        .devices(2)
        .memory("8GiB")
        .context_memory("16MiB")
        .build()
        .unwrap();
    let arb = Arbiter::new(&sim, "");
    let probe = bin("sim-probe").display().to_string();
    let script = format!(
        "unset CUDA_VISIBLE_DEVICES; for d in 0 1; do \
         {probe} --device $d alloc:v2:256MiB alloc:v2:1GiB pool-create:$((1 - d)) \
         alloc:mypool:256MiB run:1000:3 procmem; echo op=exit device=$d rc=$?; done"
    );
    let out = smore_run(&arb, "roamer", "512MiB", &["sh", "-c", &script])
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    let ctx = format!("stdout:\n{stdout}\nstderr:\n{stderr}");
    let granted: u32 = stderr
        .split(" on GPU ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|g| g.parse().ok())
        .unwrap_or_else(|| panic!("no admission line: {ctx}"));
    let l = parse_lines(&stdout);
    let exits = ops(&l, "exit");
    assert_eq!(exits.len(), 2, "{ctx}");
    for e in exits {
        let dev: u32 = e["device"].parse().unwrap();
        if dev == granted {
            // Its own GPU, whatever ordinal it has now: the grant applies there.
            assert_eq!(e["rc"], "0", "{ctx}");
        } else {
            // The other GPU: not even a context.
            assert_ne!(e["rc"], "0", "device {dev} is not granted: {ctx}");
        }
    }
    assert!(
        stderr.contains("cuDevicePrimaryCtxRetain"),
        "the context on the other GPU was refused: {ctx}"
    );
    // On its own GPU: 256 MiB fits the 512 MiB cap, 1 GiB does not, and a pool placed on the
    // other GPU gets nothing.
    assert_eq!(alloc_rcs(&l), ["0", "2", "2"], "{ctx}");
    assert_eq!(ops(&l, "run").len(), 1, "{ctx}");
    assert!(procmem(&l)[0] <= 512 * MIB, "{ctx}");
}
