"""What the shim's queue-wait estimator reads on this GPU when nothing makes a launch wait.

The shim takes a sampled launch's wait for the GPU as the offset `(GPU time since a reference
start event) − (CPU time since the reference's submission)` above the smallest offset seen
(shim/src/runtime.rs, `Sampler::queue_wait`; docs/shim.md, "Harvest"). With no other context on
the GPU every wait it reads is jitter: the driver's submission path, the host thread losing its
CPU between the timestamp and the submission, clocks. A wait of at least a kernel's solo cost
counts that whole kernel as a collision, so jitter of tens of µs makes PyTorch's 10–50 µs kernels
read as colliding (docs/real-gpu.md, section 9, point 1: collision time per request was
0.89–0.95 of GPU time beside a trainer busy 8–11 %).

This script applies the same estimator, in Python, to plain PyTorch processes (no smore):

- `alone`: a start event recorded on an idle stream after a random 0–3 ms pause, then one tiny
  kernel; the wait the estimator reads, and the kernel's duration above its floor.
- `cpu_busy`: the same with `--hogs` processes spinning on the CPU (by default all CPUs but two:
  more than the demo's six function processes use, so an upper bound of what their CPU use
  does to a shim's figures or a trainer).
- `beside_trainer`: the same beside a PyTorch ResNet-50 training loop (the demo's `harvest`
  trainer: batch 32, 40 ms of host time per iteration), whose kernels make some waits real.

And the trainer's side: its iteration time alone and beside the CPU hogs, which no GPU
measurement sees.

Prints a table and one `RESULT {json}` line (tests/gpu/run_all.sh convention).

    python3 tests/gpu/wait_jitter.py --seconds 4
"""
import argparse
import os
import random
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import emit, pct, stats_us  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROFILING = os.path.join(ROOT, "profiling")
# The shim's reference is replaced once its CPU span reaches 1 s (CLOCK_REF_PERIOD_NS); the
# smallest offset then carries over. Over a few seconds the running minimum is what matters.
THRESHOLDS_US = (10, 20, 50, 100)


def role_probe(seconds):
    import torch

    x = torch.ones(1 << 16, device="cuda")
    for _ in range(100):
        x.mul_(1.0000001)
    torch.cuda.synchronize()
    rng = random.Random(2)
    # Events made and recorded once before the loop, as the shim takes pooled events: creating
    # one on its first record would put that CPU time inside the span measured.
    ref = torch.cuda.Event(enable_timing=True)
    a = torch.cuda.Event(enable_timing=True)
    b = torch.cuda.Event(enable_timing=True)
    a.record()
    b.record()
    t_ref = time.monotonic_ns()
    ref.record()
    torch.cuda.synchronize()
    samples = []
    end = time.monotonic_ns() + int(seconds * 1e9)
    while time.monotonic_ns() < end:
        time.sleep(rng.uniform(0.0, 0.003))
        t = time.monotonic_ns()
        a.record()
        x.mul_(1.0000001)
        launched = time.monotonic_ns()
        b.record()
        b.synchronize()
        samples.append((ref.elapsed_time(a) * 1e6 - (t - t_ref), a.elapsed_time(b) * 1e6,
                        launched - t))
    # The reference's own offset is 0, the smallest offset seen before any sample (the shim's
    # `min_offset_ns` starts there).
    low = 0.0
    waits, durs = [], []
    for offset, span, cpu in samples:
        low = min(low, offset)
        wait = offset - low
        waits.append(wait)
        # The span also holds the CPU time between the start event and the launch, less what
        # the start event waited (the shim's own correction).
        durs.append(max(0.0, span - max(0.0, cpu - wait)))
    floor = min(durs) if durs else 0.0
    return waits, [d - floor for d in durs], floor


def hog(stop_at):
    while time.monotonic() < stop_at:
        pass


def run_probe(seconds):
    """Runs the probe in a fresh process (its own CUDA context) and returns its figures."""
    code = ("import sys, json; sys.path.insert(0, %r); import wait_jitter as w; "
            "print(json.dumps(w.role_probe(%f)))" % (os.path.dirname(os.path.abspath(__file__)),
                                                      seconds))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=seconds + 120)
    if out.returncode != 0:
        raise RuntimeError(f"probe failed: {out.stderr[-2000:]}")
    import json

    waits, inflation, floor = json.loads(out.stdout.strip().splitlines()[-1])
    return waits, inflation, floor


def summary(waits, inflation, floor):
    s = {"wait": stats_us(waits), "over_floor": stats_us(inflation),
         "kernel_floor_us": round(floor / 1e3, 1)}
    for t in THRESHOLDS_US:
        s[f"wait_ge_{t}us"] = round(sum(1 for w in waits if w >= t * 1e3) / max(1, len(waits)), 3)
    return s


def start_hogs(n, seconds):
    stop_at = time.monotonic() + seconds + 30
    import multiprocessing as mp

    procs = [mp.Process(target=hog, args=(stop_at,), daemon=True) for _ in range(n)]
    for p in procs:
        p.start()
    return procs


def stop(procs):
    for p in procs:
        p.terminate()
    for p in procs:
        p.join(timeout=5)


def trainer(seconds):
    """Starts the demo's `harvest` trainer; returns the process."""
    cmd = [sys.executable, "-m", "smore_profiling.demo_workers", "trainer", "--model", "resnet50",
           "--batch", "32", "--host-ms", "40", "--seconds", str(seconds)]
    return subprocess.Popen(cmd, cwd=PROFILING, stdout=subprocess.PIPE, text=True)


def iterating(p):
    """Waits for the trainer's first iteration, then drains its output in the background (a
    full pipe would stop it)."""
    import threading

    for line in p.stdout:
        if line.startswith("iter="):
            threading.Thread(target=lambda: [None for _ in p.stdout], daemon=True).start()
            return
    raise RuntimeError("the trainer ended before its first iteration")


def trainer_iters(p):
    ms = []
    for line in p.stdout:
        if line.startswith("iter="):
            try:
                ms.append(float(line.split("ms=")[1]))
            except (IndexError, ValueError):
                pass
    p.wait(timeout=60)
    return ms[3:]  # the first iterations build cuDNN plans


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--hogs", type=int, default=max(1, (os.cpu_count() or 2) - 2),
                    help="CPU-spinning processes in the cpu_busy conditions")
    a = ap.parse_args()
    res = {"config": {"seconds": a.seconds, "hogs": a.hogs}}
    res["alone"] = summary(*run_probe(a.seconds))
    hogs = start_hogs(a.hogs, a.seconds)
    try:
        res["cpu_busy"] = summary(*run_probe(a.seconds))
    finally:
        stop(hogs)
    tr = trainer(a.seconds + 30)
    try:
        iterating(tr)
        res["beside_trainer"] = summary(*run_probe(a.seconds))
    finally:
        tr.terminate()
        tr.wait(timeout=30)
    alone = trainer_iters(trainer(a.seconds + 6))
    hogs = start_hogs(a.hogs, a.seconds + 20)
    try:
        busy = trainer_iters(trainer(a.seconds + 6))
    finally:
        stop(hogs)
    m_alone = pct(alone, 0.5) if alone else None
    m_busy = pct(busy, 0.5) if busy else None
    res["trainer_ms_p50_alone"] = m_alone
    res["trainer_ms_p50_cpu_busy"] = m_busy
    if m_alone and m_busy:
        res["trainer_slowdown_cpu_busy"] = round(m_busy / m_alone - 1.0, 4)
    print("condition        wait p50/p90/p99 µs        ≥10  ≥20  ≥50  ≥100   over floor p50/p99 µs")
    for k in ("alone", "cpu_busy", "beside_trainer"):
        s = res[k]
        w, o = s["wait"], s["over_floor"]
        if not w.get("n"):
            print(f"{k:16s} no samples")
            continue
        print(f"{k:16s} {w['p50_us']:7.1f} {w['p90_us']:7.1f} {w['p99_us']:8.1f}   "
              + " ".join(f"{s[f'wait_ge_{t}us']:.2f}" for t in THRESHOLDS_US)
              + f"   {o['p50_us']:7.1f} {o['p99_us']:7.1f}")
    print("trainer p50 ms alone:", m_alone, " beside CPU hogs:", m_busy,
          " slowdown:", res.get("trainer_slowdown_cpu_busy"))
    emit({"test": "wait_jitter", "pass": bool(res["beside_trainer"]["wait"].get("n")), **res})


if __name__ == "__main__":
    main()
