"""What a context switch costs on this GPU, and whether handing an idle GPU over costs anything.

The simulated GPU (docs/simgpu.md, "Context switches") charges a switch only when running kernel
work is preempted or a preempted context is restored: a handover from an idle context is free.
This script measures both halves of that claim on a real GPU, without smore (no shim, no
arbiter): two plain PyTorch processes.

- `probe`: one small kernel and a synchronise, again and again, with a random 0-2 ms pause so it
  lands at every phase of the other process's cycle. Each probe's start and end (CLOCK_MONOTONIC,
  shared by the processes of one host) are kept.
- `trainer`: bursts of large bf16 matmuls (a few ms), a synchronise, then an idle gap; each
  burst's start and end are kept. `--idle` only holds a context and 1 GiB and sleeps.

Conditions, each `--seconds` long: the probe alone; the probe beside an idle context; the trainer
alone; the probe beside the trainer. The probe's latencies beside the trainer are split by where
they fell: inside a burst, within 1 ms after one ended (the handover from a just-idle context),
or clear of every burst by 2 ms. The trainer's bursts are split by whether a probe overlapped.

Prints a table and one `RESULT {json}` line (tests/gpu/run_all.sh convention).

    python3 tests/gpu/switch_cost.py --seconds 5
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import emit, stats_us  # noqa: E402


def role_probe(args):
    import torch

    x = torch.ones(1 << 16, device="cuda")
    for _ in range(200):
        x.mul_(1.0000001)
    torch.cuda.synchronize()
    # The probe kernel's own GPU time, for the trainer's loss beyond it: 1000 back to back
    # between two events (a single kernel's span on an idle stream holds its launch too).
    a = torch.cuda.Event(enable_timing=True)
    b = torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(1000):
        x.mul_(1.0000001)
    b.record()
    b.synchronize()
    kernel_ns = a.elapsed_time(b) * 1e6 / 1000
    print("ready", flush=True)
    sys.stdin.readline()  # go
    out = []
    end = time.monotonic_ns() + int(args.seconds * 1e9)
    rng = random.Random(1)
    while True:
        t0 = time.monotonic_ns()
        if t0 >= end:
            break
        x.mul_(1.0000001)
        torch.cuda.synchronize()
        t1 = time.monotonic_ns()
        out.append((t0, t1))
        pause = rng.uniform(0.0, 0.002)
        time.sleep(pause)
    json.dump({"records": out, "kernel_ns": kernel_ns}, open(args.file, "w"))


def role_trainer(args):
    import torch

    a = torch.randn(args.n, args.n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(args.n, args.n, device="cuda", dtype=torch.bfloat16)
    hold = torch.empty(1 << 28, device="cuda")  # 1 GiB held, as a trainer holds its state
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    print("ready", flush=True)
    sys.stdin.readline()  # go
    out = []
    end = time.monotonic_ns() + int(args.seconds * 1e9)
    if args.idle:
        time.sleep(args.seconds)
    else:
        while time.monotonic_ns() < end:
            t0 = time.monotonic_ns()
            for _ in range(args.kernels):
                c = a @ b
            torch.cuda.synchronize()
            t1 = time.monotonic_ns()
            out.append((t0, t1))
            time.sleep(args.gap_ms / 1000.0)
    del hold
    json.dump({"records": out}, open(args.file, "w"))


def spawn(role, file, extra):
    cmd = [sys.executable, os.path.abspath(__file__), "--role", role, "--file", file] + extra
    return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def run_condition(args, roles, tmp, name):
    """roles: list of (role, extra args). Starts all, waits for ready, says go, returns each
    role's output ({"records": [(start, end) ns], "kernel_ns": probe only})."""
    procs = []
    try:
        for i, (role, extra) in enumerate(roles):
            f = os.path.join(tmp, f"{name}-{i}-{role}.json")
            procs.append((role, f, spawn(role, f, extra + ["--seconds", str(args.seconds)])))
        for _, _, p in procs:
            line = p.stdout.readline().strip()
            if line != "ready":
                raise RuntimeError(f"{name}: a worker did not start ({line!r})")
        for _, _, p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        out = {}
        for role, f, p in procs:
            p.wait(timeout=args.seconds + 60)
            data = json.load(open(f))
            data["records"] = [tuple(r) for r in data["records"]]
            out[role] = data
        return out
    finally:
        for _, _, p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def classify(probes, bursts):
    """Splits probes into inside a burst / within 1 ms after one / clear by 2 ms / other."""
    import bisect

    starts = [b[0] for b in bursts]
    groups = {"inside": [], "after_1ms": [], "clear_2ms": [], "other": []}
    for t0, t1 in probes:
        i = bisect.bisect_right(starts, t0) - 1
        prev = bursts[i] if i >= 0 else None
        nxt = bursts[i + 1] if i + 1 < len(bursts) else None
        d = t1 - t0
        if prev and t0 < prev[1]:
            groups["inside"].append(d)
        elif prev and t0 - prev[1] <= 1_000_000 and (nxt is None or t1 < nxt[0]):
            groups["after_1ms"].append(d)
        elif (prev is None or t0 - prev[1] > 2_000_000) and (nxt is None or nxt[0] - t1 > 2_000_000):
            groups["clear_2ms"].append(d)
        else:
            groups["other"].append(d)
    return groups


def burst_split(bursts, probes):
    import bisect

    pst = [p[0] for p in probes]
    hit, miss, nhit = [], [], []
    for b0, b1 in bursts:
        lo = bisect.bisect_left(pst, b0)
        hi = bisect.bisect_left(pst, b1)
        # a probe that began before the burst and ended inside it also overlaps
        k = hi - lo + (1 if lo > 0 and probes[lo - 1][1] > b0 else 0)
        (hit if k else miss).append(b1 - b0)
        if k:
            nhit.append(k)
    return hit, miss, nhit


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--role", choices=["probe", "trainer"])
    ap.add_argument("--file")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--idle", action="store_true")
    ap.add_argument("--n", type=int, default=8192, help="matmul size (trainer)")
    ap.add_argument("--kernels", type=int, default=2, help="matmuls per burst (trainer)")
    ap.add_argument("--gap-ms", type=float, default=10.0, help="idle gap after each burst (trainer)")
    args = ap.parse_args()
    if args.role == "probe":
        return role_probe(args)
    if args.role == "trainer":
        return role_trainer(args)

    tr = ["--n", str(args.n), "--kernels", str(args.kernels), "--gap-ms", str(args.gap_ms)]
    tmp = tempfile.mkdtemp(prefix="smore-switch-")
    alone_run = run_condition(args, [("probe", [])], tmp, "alone")["probe"]
    alone = alone_run["records"]
    idle = run_condition(args, [("probe", []), ("trainer", tr + ["--idle"])], tmp,
                         "idle")["probe"]["records"]
    solo_tr = run_condition(args, [("trainer", tr)], tmp, "trainer")["trainer"]["records"]
    both = run_condition(args, [("probe", []), ("trainer", tr)], tmp, "both")
    both = {k: v["records"] for k, v in both.items()}
    groups = classify(both["probe"], both["trainer"])
    hit, miss, nhit = burst_split(both["trainer"], both["probe"])
    solo_b = [b1 - b0 for b0, b1 in solo_tr]
    probe_alone = stats_us([b - a for a, b in alone])
    res = {
        "probe_alone": probe_alone,
        "probe_beside_idle_context": stats_us([b - a for a, b in idle]),
        "probe_beside_trainer": {k: stats_us(v) for k, v in groups.items()},
        "trainer_burst_alone": stats_us(solo_b),
        "trainer_burst_with_probe": stats_us(hit),
        "trainer_burst_without_probe": stats_us(miss),
        "probes_per_hit_burst": round(statistics.mean(nhit), 2) if nhit else None,
        "trainer_busy_fraction_alone": round(sum(solo_b) / (args.seconds * 1e9), 3),
        "config": {"n": args.n, "kernels": args.kernels, "gap_ms": args.gap_ms, "seconds": args.seconds},
    }
    if hit and nhit and solo_b:
        # Against the trainer's bursts alone (a run of its own): beside a probe every ~1 ms
        # nearly every burst is overlapped, so the bursts without one are too few to compare.
        extra = statistics.median(hit) - statistics.median(solo_b)
        own = alone_run.get("kernel_ns") or 0.0
        per = extra / statistics.mean(nhit)
        res["trainer_extra_us_per_overlapping_probe"] = round(per / 1e3, 1)
        # Beyond the probe kernel's own GPU time (CUDA events, alone): the switches' cost, two
        # per overlap (docs/simgpu.md). A median of bursts over a mean count of probes, from
        # two runs: a figure to compare configurations by, not a precise one.
        res["probe_kernel_us"] = round(own / 1e3, 1)
        res["of_which_beyond_probe_own_time_us"] = round((per - own) / 1e3, 1)
    print("condition                         n      p50 µs   p90 µs   p99 µs")
    rows = [("probe alone", res["probe_alone"]), ("probe beside idle context", res["probe_beside_idle_context"])]
    rows += [(f"probe beside trainer: {k}", v) for k, v in res["probe_beside_trainer"].items()]
    rows += [("trainer burst alone", res["trainer_burst_alone"]),
             ("trainer burst, a probe inside", res["trainer_burst_with_probe"]),
             ("trainer burst, no probe", res["trainer_burst_without_probe"])]
    for name, s in rows:
        if s.get("n"):
            print(f"{name:32s} {s['n']:6d} {s['p50_us']:9.1f} {s['p90_us']:8.1f} {s['p99_us']:8.1f}")
        else:
            print(f"{name:32s}      0")
    print("probes per overlapped burst:", res["probes_per_hit_burst"],
          " trainer extra per overlapping probe (µs):", res.get("trainer_extra_us_per_overlapping_probe"),
          " beyond the probe's own time:", res.get("of_which_beyond_probe_own_time_us"))
    # A run whose bursts no probe overlapped measured no switch.
    emit({"test": "switch_cost", "pass": bool(hit and solo_b), **res})


if __name__ == "__main__":
    main()
