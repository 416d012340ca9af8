//! The shim inside other people's processes: `dlsym` and `RTLD_NEXT` semantics, another
//! interposer in front of it, `fork`, and what a bad environment value does.

use smore_e2e::*;
use std::path::{Path, PathBuf};
use std::process::Command;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

#[test]
fn rtld_next_lookups_of_the_program_are_answered_relative_to_the_program() {
    let sim = SimGpu::exact(1, "8GiB");
    // From the executable, the next definition of a hooked name is the shim's own export (the
    // first object after the program); a `dlsym` that lost the caller's context would answer
    // relative to the shim and find nothing (the driver is not in the global scope).
    let out = run_ok(sim.shimmed(bin("shim-client"), &[]).args(["rtld-next"])).unwrap();
    let l = parse_lines(&out);
    let r = ops(&l, "rtld-next")[0];
    assert_ne!(r["next"], "0x0", "{out}");
    assert_eq!(r["same"], "true", "{out}");
    // Unhooked names pass through untouched.
    let out =
        run_ok(
            sim.shimmed(bin("shim-client"), &[])
                .args(["rtld-next", "--symbol", "malloc"]),
        )
        .unwrap();
    let r = parse_lines(&out);
    assert_eq!(ops(&r, "rtld-next")[0]["same"], "true", "{out}");
}

/// A second interposer (as a profiler or another vendor's shim would be), written in C: it wraps
/// `cuMemAlloc_v2`, counts calls, and forwards through `dlsym(RTLD_NEXT, …)`.
const OTHER_INTERPOSER: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
typedef int (*alloc_t)(unsigned long long *, size_t);
static int calls;
int cuMemAlloc_v2(unsigned long long *p, size_t n) {
    static alloc_t next;
    if (!next) next = (alloc_t)dlsym(RTLD_NEXT, "cuMemAlloc_v2");
    calls++;
    return next ? next(p, n) : 999;
}
__attribute__((destructor)) static void report(void) {
    fprintf(stderr, "other-interposer calls=%d\n", calls);
}
"#;

fn build_other_interposer(dir: &Path) -> PathBuf {
    let src = dir.join("other.c");
    let lib = dir.join("libother.so");
    std::fs::write(&src, OTHER_INTERPOSER).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .arg("-ldl")
        .status()
        .unwrap_or_else(|e| panic!("running the C compiler {cc:?} (set CC): {e}"));
    assert!(status.success(), "compiling the test interposer failed");
    lib
}

#[test]
fn another_interposer_in_front_of_the_shim_chains_through_it() {
    let sim = SimGpu::exact(1, "8GiB");
    let other = build_other_interposer(sim.dir());
    let preload = format!("{}:{}", other.display(), shim_lib().display());
    let out = sim
        .command(bin("sim-probe-linked"))
        .env("LD_PRELOAD", preload)
        .env("SMORE_MEMORY_LIMIT", "64MiB")
        .args(Resolution::Direct.args())
        .args([
            "alloc:v2:48MiB",
            "alloc:v2:32MiB",
            "meminfo",
            "free",
            "meminfo",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let l = parse_lines(&stdout);
    let a = ops(&l, "alloc");
    assert_eq!(
        (a[0]["rc"].as_str(), a[1]["rc"].as_str()),
        ("0", "2"),
        "{stdout}"
    );
    let info = ops(&l, "meminfo");
    assert_eq!(num(info[0], "free") as u64, 16 * MIB);
    assert_eq!(num(info[1], "free") as u64, 64 * MIB);
    assert!(
        stderr.contains("other-interposer calls=2"),
        "both calls went through the other interposer, then the shim: {stderr}"
    );
}

#[test]
fn a_fork_child_reinitialises_the_shim() {
    let sim = SimGpu::exact(1, "8GiB");
    let out = run_ok(
        sim.shimmed(bin("shim-client"), &[("SMORE_MEMORY_LIMIT", "1GiB")])
            .args(Resolution::Dlsym.args())
            .args(["fork", "--parent-alloc", "600MiB", "--child-cap", "256MiB"]),
    )
    .unwrap();
    let l = parse_lines(&out);
    let infos = ops(&l, "meminfo");
    let parent: Vec<_> = infos.iter().filter(|f| f["who"] == "parent").collect();
    let child = infos.iter().find(|f| f["who"] == "child").expect(&out);
    assert_eq!(num(parent[0], "free") as u64, GIB - 600 * MIB, "{out}");
    // The child's shim read its own environment and holds none of the parent's allocations.
    assert_eq!(num(child, "total") as u64, 256 * MIB, "{out}");
    assert_eq!(num(child, "free") as u64, 256 * MIB, "{out}");
    let ca = ops(&l, "alloc")
        .into_iter()
        .find(|f| f["who"] == "child")
        .expect(&out);
    assert_eq!(ca["over_rc"], "2", "{out}");
    assert_eq!(ca["at_cap_rc"], "0", "{out}");
    assert_eq!(ops(&l, "child-exit")[0]["status"], "0");
    // The parent's accounting is untouched by the child.
    assert_eq!(num(parent[1], "free") as u64, GIB - 600 * MIB, "{out}");
}

/// Runs the probe with `env`; returns (stdout lines, shim stderr lines).
fn probe_with(sim: &SimGpu, env: &[(&str, &str)], script: &[&str]) -> (Vec<Fields>, Vec<String>) {
    let out = sim
        .shimmed(bin("sim-probe"), env)
        .args(script)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let shim_lines = stderr
        .lines()
        .filter(|l| l.starts_with("smore-shim["))
        .map(String::from)
        .collect();
    (parse_lines(&stdout), shim_lines)
}

#[test]
fn a_bad_value_is_reported_once_and_the_shim_passes_through() {
    let sim = SimGpu::exact(1, "8GiB");
    let script = [
        "alloc:v2:100MiB",
        "alloc:v2:100MiB",
        "meminfo",
        "run:1000:50",
        "free-all",
    ];
    for (var, value) in [
        ("SMORE_SM_SHARE", "0"),
        ("SMORE_SM_SHARE", "half"),
        ("SMORE_MEMORY_LIMIT", "lots"),
        ("SMORE_MEMORY_LIMIT_0", "-1GiB"),
        ("SMORE_LOG", "loud"),
        ("SMORE_SM_WINDOW_MS", "0"),
        ("SMORE_FAILURE", "maybe"),
    ] {
        let mut env = vec![("SMORE_MEMORY_LIMIT", "64MiB"), ("SMORE_SM_SHARE", "10")];
        env.retain(|(k, _)| *k != var);
        env.push((var, value));
        let (l, err) = probe_with(&sim, &env, &script);
        assert_eq!(
            err.len(),
            1,
            "{var}={value}: exactly one stderr line: {err:?}"
        );
        assert!(
            err[0].contains(var) && err[0].contains(value) && err[0].contains("pass-through"),
            "{var}={value}: the line names the variable, the value and the consequence: {}",
            err[0]
        );
        // Pass-through: no cap (both 100 MiB allocations succeed, the device's own memory is
        // reported) and no throttling (50 ms of kernels take about 50 ms).
        let a = ops(&l, "alloc");
        assert!(a.iter().all(|f| f["rc"] == "0"), "{var}={value}: {a:?}");
        assert_eq!(num(ops(&l, "meminfo")[0], "total") as u64, 8 * GIB);
        let ms = num(ops(&l, "run")[0], "wall_ms");
        assert!(ms < 150.0, "{var}={value}: unthrottled run took {ms} ms");
    }
}

#[test]
fn fail_closed_refuses_allocations_when_the_configuration_is_bad() {
    let sim = SimGpu::exact(1, "8GiB");
    let (l, err) = probe_with(
        &sim,
        &[("SMORE_MEMORY_LIMIT", "lots"), ("SMORE_FAILURE", "closed")],
        &["alloc:v2:1MiB", "alloc:managed:1MiB", "run:100:2"],
    );
    let bad: Vec<_> = err.iter().filter(|l| l.contains("invalid")).collect();
    assert_eq!(bad.len(), 1, "the bad value is reported once: {err:?}");
    assert!(
        bad[0].contains("SMORE_MEMORY_LIMIT") && bad[0].contains("closed"),
        "{}",
        bad[0]
    );
    assert!(ops(&l, "alloc").iter().all(|f| f["rc"] == "2"), "{l:?}");
    // Launches are never refused.
    assert_eq!(ops(&l, "run")[0]["rc"], "0");
}
